// lib/config: good configs parse to the right values; each kind of bad config
// is rejected with a message that names the key and the value.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "config/config.h"

using droce::config::Config;
using droce::config::ConfigError;
using droce::config::parse_config;

namespace {

const std::string kPort = R"(
[[port]]
name = "p0"
device = "net_af_packet0,iface=veth0"
ipv4 = ["10.0.0.1/24"]
)";

// Returns the ConfigError message parsing `text` throws (fails the test if none).
std::string error_of(const std::string& text) {
  try {
    parse_config(text, "t.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError for:\n" << text);
  return {};
}

}  // namespace

TEST_CASE("minimal config gets the documented defaults", "[config]") {
  Config c = parse_config(kPort);
  REQUIRE(c.ports.size() == 1);
  const auto& p = c.ports[0];
  CHECK(p.name == "p0");
  CHECK(p.device == "net_af_packet0,iface=veth0");
  CHECK(p.rx_queues == 1);
  CHECK(p.tx_queues == 1);
  CHECK(p.mtu == 1500);
  CHECK_FALSE(p.mac.has_value());
  REQUIRE(p.ipv4.size() == 1);
  CHECK(droce::config::format_ipv4(p.ipv4[0]) == "10.0.0.1/24");
  CHECK_FALSE(p.vlan.has_value());
  CHECK(p.dscp == 0);
  CHECK(p.ecn);
  CHECK(p.cnp);
  CHECK_FALSE(p.fault.rx.any());
  CHECK_FALSE(p.fault.tx.any());
  CHECK(c.roce.path_mtu == 1024);
  CHECK(c.roce.max_qps == 1024);
  CHECK_FALSE(c.roce.selective_repeat);  // off unless asked for
  CHECK(c.roce.window == 64);
  CHECK(c.roce.initial_window == 0);
  CHECK(c.roce.tail_timeout_us == 0);
  CHECK(c.roce.selective_repeat_peers.empty());
  CHECK(c.control.socket == "/run/droce/droced.sock");
  CHECK(c.control.mode == 0660);
  CHECK(c.control.max_request == 65536);
  CHECK(c.log.level == "info");
  CHECK(c.log.file.empty());
  // Derived cores: core 0 on lcore 0 owning queue 0.
  CHECK(c.cores_derived);
  REQUIRE(c.cores.size() == 1);
  CHECK(c.cores[0].lcore == 0);
  REQUIRE(c.cores[0].queues.size() == 1);
  CHECK(c.cores[0].queues[0].port == 0);
  CHECK(c.cores[0].queues[0].rx == 0);
}

TEST_CASE("full config: every section read", "[config]") {
  Config c = parse_config(R"(
[eal]
args = ["--in-memory", "--no-pci"]
lcores = "0,1"
main_lcore = 0

[[port]]
name = "p0"
device = "0000:3b:00.0"
rx_queues = 2
tx_queues = 2
mtu = 9000
mac = "02:AA:bb:00:00:01"
ipv4 = ["10.0.0.1/24", "10.0.1.1"]
ipv6 = ["fd00::1/64"]
vlan = 100
vlan_pcp = 5
dscp = 26
ecn = false
[port.fault]
seed = 42
[port.fault.rx]
drop = 0.01
duplicate = 0.02
reorder = 0.03
corrupt = 0.04
[port.fault.tx]
drop = 1

[[port]]
name = "p1"
device = "net_memif0,role=server"
mtu = 9000
ipv6 = ["fd00:1::1/64"]

[[core]]
lcore = 0
queues = [{ port = "p0", rx = 0 }, { port = "p1", rx = 0 }]
[[core]]
lcore = 1
queues = [{ port = "p0", rx = 1, tx = 1 }]
idle_yield_polls = 0

[roce]
path_mtu = 4096
max_qps = 4096
max_mrs = 512
mr_memory_mb = 1024
window = 128
initial_window = 8
tail_timeout_us = 500
selective_repeat = true
selective_repeat_peers = ["10.0.0.2", "fd00::2"]

[control]
socket = "/tmp/x/droced.sock"
mode = "0600"
group = "root"
max_request = 4096
max_clients = 4
idle_timeout_ms = 1000

[log]
level = "debug"
file = "/tmp/droced.log"
)");
  CHECK(c.eal.args == std::vector<std::string>{"--in-memory", "--no-pci"});
  CHECK(c.eal.lcores == "0,1");
  CHECK(c.eal.main_lcore == 0u);
  REQUIRE(c.ports.size() == 2);
  const auto& p = c.ports[0];
  CHECK(p.mtu == 9000);
  REQUIRE(p.mac.has_value());
  CHECK(droce::config::format_mac(*p.mac) == "02:aa:bb:00:00:01");
  REQUIRE(p.ipv4.size() == 2);
  CHECK(droce::config::format_ipv4(p.ipv4[1]) == "10.0.1.1/32");
  REQUIRE(p.ipv6.size() == 1);
  CHECK(droce::config::format_ipv6(p.ipv6[0]) == "fd00::1/64");
  CHECK(p.vlan == uint16_t{100});
  CHECK(p.vlan_pcp == 5);
  CHECK(p.dscp == 26);
  CHECK_FALSE(p.ecn);
  CHECK(p.fault.seed == 42);
  CHECK(p.fault.rx.drop == Approx(0.01));
  CHECK(p.fault.rx.duplicate == Approx(0.02));
  CHECK(p.fault.rx.reorder == Approx(0.03));
  CHECK(p.fault.rx.corrupt == Approx(0.04));
  CHECK(p.fault.tx.drop == 1.0);
  CHECK(p.fault.tx.corrupt == 0.0);
  CHECK(c.find_port("p1") == &c.ports[1]);
  CHECK(c.find_port("p2") == nullptr);
  CHECK_FALSE(c.cores_derived);
  REQUIRE(c.cores.size() == 2);
  CHECK(c.cores[0].queues.size() == 2);
  CHECK(c.cores[0].queues[1].port == 1);
  CHECK(c.cores[1].lcore == 1);
  CHECK(c.cores[1].queues[0].tx == 1);
  CHECK(c.cores[0].idle_yield_polls == 256);  // the default
  CHECK(c.cores[1].idle_yield_polls == 0);
  CHECK(c.roce.path_mtu == 4096);
  CHECK(c.roce.mr_memory_mb == 1024);
  CHECK(c.roce.window == 128);
  CHECK(c.roce.initial_window == 8);
  CHECK(c.roce.tail_timeout_us == 500);
  CHECK(c.roce.selective_repeat);
  REQUIRE(c.roce.selective_repeat_peers.size() == 2);
  CHECK(c.roce.selective_repeat_peers[0] ==
        std::array<uint8_t, 16>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2});  // IPv4-mapped
  CHECK(c.roce.selective_repeat_peers[1] ==
        std::array<uint8_t, 16>{0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2});
  CHECK(c.control.mode == 0600);
  CHECK(c.control.gid == 0u);
  CHECK(c.control.max_clients == 4);
  CHECK(c.log.level == "debug");
  CHECK(c.log.file == "/tmp/droced.log");
}

TEST_CASE("the shipped example configs are valid", "[config]") {
  for (const char* name : {"droced.toml", "node-a.toml", "node-b.toml"}) {
    INFO(name);
    Config c = droce::config::load_config_file(std::string(DROCE_CONFIG_DIR) + "/" + name);
    CHECK_FALSE(c.ports.empty());
    CHECK_FALSE(c.cores.empty());
  }
  Config a = droce::config::load_config_file(std::string(DROCE_CONFIG_DIR) + "/node-a.toml");
  Config b = droce::config::load_config_file(std::string(DROCE_CONFIG_DIR) + "/node-b.toml");
  CHECK(a.control.socket != b.control.socket);
  CHECK(a.shim.socket != b.shim.socket);
  CHECK(droce::config::format_ipv4(a.ports[0].ipv4[0]) != droce::config::format_ipv4(b.ports[0].ipv4[0]));
}

TEST_CASE("[shim]: defaults, keys, errors", "[config]") {
  Config d = parse_config(kPort);
  CHECK(d.shim.enabled);
  CHECK(d.shim.socket == "/run/droce/verbs.sock");
  CHECK(d.shim.mode == 0660);
  Config c = parse_config(kPort + "[shim]\nenabled = false\nsocket = \"/tmp/v.sock\"\nmode = \"0600\"\nmax_clients = 8\n");
  CHECK_FALSE(c.shim.enabled);
  CHECK(c.shim.socket == "/tmp/v.sock");
  CHECK(c.shim.mode == 0600);
  CHECK(c.shim.max_clients == 8);
  CHECK(d.shim.max_qps_per_client == 256);
  CHECK(d.shim.max_mr_mb_per_client == 65536);
  CHECK(d.shim.resolve_timeout_ms == 3000);
  Config q = parse_config(kPort + "[shim]\nmax_qps_per_client = 3\nmax_cqs_per_client = 4\nmax_srqs_per_client = 0\n"
                                  "max_mrs_per_client = 5\nmax_ahs_per_client = 6\nmax_mr_mb_per_client = 7\n"
                                  "resolve_timeout_ms = 50\n");
  CHECK(q.shim.max_qps_per_client == 3);
  CHECK(q.shim.max_cqs_per_client == 4);
  CHECK(q.shim.max_srqs_per_client == 0);
  CHECK(q.shim.max_mrs_per_client == 5);
  CHECK(q.shim.max_ahs_per_client == 6);
  CHECK(q.shim.max_mr_mb_per_client == 7);
  CHECK(q.shim.resolve_timeout_ms == 50);
  CHECK_THAT(error_of(kPort + "[shim]\nmax_qps_per_client = 0\n"), Catch::Contains("shim.max_qps_per_client"));
  CHECK_THAT(error_of(kPort + "[shim]\nresolve_timeout_ms = 1\n"), Catch::Contains("shim.resolve_timeout_ms"));
  CHECK_THAT(error_of(kPort + "[shim]\nsocket = \"rel.sock\"\n"), Catch::Contains("shim.socket"));
  CHECK_THAT(error_of(kPort + "[shim]\nmode = \"0999\"\n"), Catch::Contains("shim.mode"));
  CHECK_THAT(error_of(kPort + "[shim]\nsocket = \"/run/droce/droced.sock\"\n"), Catch::Contains("also control.socket"));
  CHECK_THAT(error_of(kPort + "[shim]\nsock = \"/x\"\n"), Catch::Contains("shim.sock: unknown key"));
}

TEST_CASE("mode as an octal integer", "[config]") {
  Config c = parse_config(kPort + "[control]\nmode = 0o640\n");
  CHECK(c.control.mode == 0640);
}

TEST_CASE("derived cores: one per queue index", "[config]") {
  Config c = parse_config(R"(
[[port]]
name = "a"
device = "net_null0"
ipv4 = ["10.0.0.1/24"]
rx_queues = 3
tx_queues = 3
[[port]]
name = "b"
device = "net_null1"
ipv4 = ["10.0.1.1/24"]
)");
  REQUIRE(c.cores.size() == 3);
  CHECK(c.cores[0].queues.size() == 2);
  CHECK(c.cores[1].queues.size() == 1);
  CHECK(c.cores[2].lcore == 2);
  CHECK(c.cores[2].queues[0].rx == 2);
}

TEST_CASE("IB MTU derived from the IP MTU like Linux", "[config]") {
  using droce::config::ib_mtu_for_ip_mtu;
  CHECK(ib_mtu_for_ip_mtu(1500) == 1024);
  CHECK(ib_mtu_for_ip_mtu(9000) == 4096);
  CHECK(ib_mtu_for_ip_mtu(4200) == 4096);
  CHECK(ib_mtu_for_ip_mtu(4191) == 2048);
  CHECK(ib_mtu_for_ip_mtu(352) == 256);
  CHECK(ib_mtu_for_ip_mtu(351) == 0);
}

TEST_CASE("bad TOML syntax names file, line and column", "[config][bad]") {
  std::string e = error_of("[[port]]\nname = \"p0\n");
  CHECK_THAT(e, Catch::StartsWith("config: t.toml:2:"));
}

TEST_CASE("unknown keys are rejected wherever they are", "[config][bad]") {
  CHECK_THAT(error_of(kPort + "[bogus]\nx = 1\n"), Catch::Contains("config: bogus: unknown key"));
  CHECK_THAT(error_of(kPort + "mtuu = 1500\n"), Catch::Contains("config: port[0].mtuu: unknown key"));
  CHECK_THAT(error_of(kPort + "[port.fault]\nsed = 1\n"), Catch::Contains("port[0].fault.sed: unknown key"));
  CHECK_THAT(error_of(kPort + "[port.fault.rx]\ndrp = 0.1\n"), Catch::Contains("port[0].fault.rx.drp: unknown key"));
  CHECK_THAT(error_of(kPort + "[roce]\npathmtu = 1024\n"), Catch::Contains("roce.pathmtu: unknown key"));
  CHECK_THAT(error_of(kPort + "[control]\nsock = \"/x\"\n"), Catch::Contains("control.sock: unknown key"));
  CHECK_THAT(error_of(kPort + "[log]\nlvl = \"info\"\n"), Catch::Contains("log.lvl: unknown key"));
  CHECK_THAT(error_of(kPort + "[eal]\narg = []\n"), Catch::Contains("eal.arg: unknown key"));
  CHECK_THAT(error_of(kPort + "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 0, q = 1 }]\n"),
             Catch::Contains("core[0].queues[0].q: unknown key"));
  // The message lists the keys that are valid there and the line.
  CHECK_THAT(error_of(kPort + "mtuu = 1500\n"), Catch::Contains("mtu") && Catch::Contains("t.toml line 6"));
}

TEST_CASE("out-of-range values name key, value and range", "[config][bad]") {
  CHECK(error_of(kPort + "[[port]]\nname = \"p1\"\ndevice = \"d\"\nipv4 = [\"10.0.1.1\"]\nmtu = 70000\n")
            .rfind("config: port[1].mtu: 70000 is out of range 256..9000", 0) == 0);
  CHECK_THAT(error_of(kPort + "rx_queues = 0\n"), Catch::Contains("port[0].rx_queues: 0 is out of range 1..64"));
  CHECK_THAT(error_of(kPort + "dscp = 64\n"), Catch::Contains("port[0].dscp: 64 is out of range 0..63"));
  CHECK_THAT(error_of(kPort + "vlan = 4095\n"), Catch::Contains("port[0].vlan: 4095 is out of range 1..4094"));
  CHECK_THAT(error_of(kPort + "vlan_pcp = 3\n"), Catch::Contains("port[0].vlan_pcp: is set but vlan is not"));
  CHECK_THAT(error_of(kPort + "[port.fault.tx]\ncorrupt = 1.5\n"),
             Catch::Contains("port[0].fault.tx.corrupt: 1.5 is out of range 0..1"));
  CHECK_THAT(error_of(kPort + "[port.fault.rx]\ndrop = nan\n"), Catch::Contains("port[0].fault.rx.drop: nan"));
  CHECK_THAT(error_of(kPort + "[roce]\nmax_qps = 0\n"), Catch::Contains("roce.max_qps: 0 is out of range"));
  CHECK_THAT(error_of(kPort + "[roce]\npath_mtu = 1500\n"),
             Catch::Contains("roce.path_mtu: 1500 is not an IB MTU"));
  CHECK_THAT(error_of(kPort + "[roce]\nwindow = 0\n"), Catch::Contains("roce.window: 0 is out of range 1..65536"));
  CHECK_THAT(error_of(kPort + "[roce]\nwindow = 16\ninitial_window = 32\n"),
             Catch::Contains("roce.initial_window: 32 is larger than window (16)"));
  CHECK_THAT(error_of(kPort + "[roce]\ntail_timeout_us = -1\n"),
             Catch::Contains("roce.tail_timeout_us: -1 is out of range 0..10000000"));
  CHECK_THAT(error_of(kPort + "[control]\nmax_clients = 0\n"), Catch::Contains("control.max_clients: 0 is out of range"));
  CHECK_THAT(error_of(kPort + "[control]\nmode = \"1777\"\n"), Catch::Contains("control.mode: 01777 is out of range"));
  CHECK_THAT(error_of(kPort + "[eal]\nmain_lcore = 128\n"), Catch::Contains("eal.main_lcore: 128 is out of range 0..127"));
}

TEST_CASE("wrong types name the expected and the actual type", "[config][bad]") {
  CHECK_THAT(error_of(kPort + "mtu = \"1500\"\n"),
             Catch::Contains("port[0].mtu: expected an integer, got a string"));
  CHECK_THAT(error_of(kPort + "ecn = 1\n"), Catch::Contains("port[0].ecn: expected a boolean, got an integer"));
  CHECK_THAT(error_of(kPort + "[port.fault.rx]\ndrop = \"x\"\n"),
             Catch::Contains("port[0].fault.rx.drop: expected a number, got a string"));
  CHECK_THAT(error_of(kPort + "[eal]\nargs = [\"a\", 1]\n"), Catch::Contains("eal.args[1]: expected a string, got an integer"));
  CHECK_THAT(error_of("roce = 5\n" + kPort), Catch::Contains("roce: expected a table, got an integer"));
  CHECK_THAT(error_of("[port]\nname = \"p0\"\n"), Catch::Contains("port: expected an array of tables ([[port]])"));
  CHECK_THAT(error_of(kPort + "[control]\nmode = true\n"), Catch::Contains("control.mode: expected an octal string"));
  CHECK_THAT(error_of(kPort + "[control]\nmode = \"rw\"\n"), Catch::Contains("control.mode: \"rw\" is not an octal mode"));
}

TEST_CASE("bad values in strings: addresses, names, levels, paths", "[config][bad]") {
  const std::string head = "[[port]]\nname = \"p0\"\ndevice = \"d\"\n";
  CHECK_THAT(error_of(head + "ipv4 = [\"10.0.0.300/24\"]\n"),
             Catch::Contains("port[0].ipv4[0]: \"10.0.0.300/24\" is not an IPv4 address"));
  CHECK_THAT(error_of(head + "ipv4 = [\"10.0.0.1/33\"]\n"),
             Catch::Contains("port[0].ipv4[0]: prefix length 33 is out of range 1..32"));
  CHECK_THAT(error_of(head + "ipv4 = [\"10.0.0.1/x\"]\n"), Catch::Contains("bad prefix length"));
  CHECK_THAT(error_of(head + "ipv6 = [\"fd00::1/129\"]\n"), Catch::Contains("port[0].ipv6[0]: prefix length 129"));
  CHECK_THAT(error_of(head + "ipv6 = [\"10.0.0.1\"]\n"), Catch::Contains("is not an IPv6 address"));
  CHECK_THAT(error_of(head), Catch::Contains("config: port[0]: a port needs at least one address"));
  CHECK_THAT(error_of(head + "ipv4 = [\"10.0.0.1/24\"]\n[roce]\nselective_repeat_peers = [\"10.0.0.2/24\"]\n"),
             Catch::Contains("roce.selective_repeat_peers[0]: \"10.0.0.2/24\" is not an IPv4 or IPv6 address"));
  CHECK_THAT(error_of(kPort + "mac = \"02:00:00:00:00\"\n"), Catch::Contains("port[0].mac: \"02:00:00:00:00\" is not a MAC address"));
  CHECK_THAT(error_of(kPort + "mac = \"01:00:5e:00:00:01\"\n"), Catch::Contains("is a multicast address"));
  CHECK_THAT(error_of(kPort + "mac = \"00:00:00:00:00:00\"\n"), Catch::Contains("is the zero address"));
  CHECK_THAT(error_of("[[port]]\ndevice = \"d\"\nipv4 = [\"10.0.0.1\"]\n"), Catch::Contains("config: port[0].name: is required"));
  CHECK_THAT(error_of("[[port]]\nname = \"p0\"\nipv4 = [\"10.0.0.1\"]\n"), Catch::Contains("config: port[0].device: is required"));
  CHECK_THAT(error_of("[[port]]\nname = \"a b\"\ndevice = \"d\"\nipv4 = [\"10.0.0.1\"]\n"),
             Catch::Contains("port[0].name: \"a b\" is not a valid port name"));
  CHECK_THAT(error_of(kPort + "[log]\nlevel = \"loud\"\n"), Catch::Contains("log.level: \"loud\" is not a log level"));
  CHECK_THAT(error_of(kPort + "[control]\nsocket = \"rel.sock\"\n"),
             Catch::Contains("control.socket: \"rel.sock\" is not an absolute path"));
  CHECK_THAT(error_of(kPort + "[control]\nsocket = \"/" + std::string(120, 'x') + "\"\n"),
             Catch::Contains("control.socket: path is 121 bytes, longer than the 107"));
  CHECK_THAT(error_of(kPort + "[control]\ngroup = \"no-such-group-droce\"\n"),
             Catch::Contains("control.group: \"no-such-group-droce\" is not a group on this host"));
  CHECK_THAT(error_of(kPort + "[eal]\nlcores = \"0,1\"\nargs = [\"-l\", \"0\"]\n"),
             Catch::Contains("eal.args: \"-l\" conflicts with eal.lcores"));
}

TEST_CASE("cross-section rules: names, addresses, MTU, queue ownership", "[config][bad]") {
  CHECK_THAT(error_of(""), Catch::Contains("config: port: at least one [[port]] section is required"));
  CHECK_THAT(error_of(kPort + kPort), Catch::Contains("port[1].name: \"p0\" is already the name of port[0]"));
  CHECK_THAT(error_of(kPort + "[[port]]\nname = \"p1\"\ndevice = \"d\"\nipv4 = [\"10.0.0.1/16\"]\n"),
             Catch::Contains("port[1].ipv4: 10.0.0.1/16 is already an address of port[0] (\"p0\")"));
  CHECK_THAT(error_of(kPort + "[roce]\npath_mtu = 2048\n"),
             Catch::Contains("roce.path_mtu: 2048 does not fit port[0] (\"p0\") with mtu 1500 (largest IB MTU that fits: 1024)"));
  const std::string two = "[[port]]\nname = \"p0\"\ndevice = \"d\"\nipv4 = [\"10.0.0.1\"]\nrx_queues = 2\ntx_queues = 2\n";
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 0 }]\n"),
             Catch::Contains("port[0].rx_queues: rx queue 1 of \"p0\" is not owned by any [[core]]"));
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 0 }, { port = \"p0\", rx = 1 }]\n"
                            "[[core]]\nlcore = 1\nqueues = [{ port = \"p0\", rx = 1 }]\n"),
             Catch::Contains("core[1].queues: rx queue 1 of port[0] (\"p0\") is already owned by core[0]"));
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 0 }]\n"
                            "[[core]]\nlcore = 1\nqueues = [{ port = \"p0\", rx = 1, tx = 0 }]\n"),
             Catch::Contains("core[1].queues: tx queue 0 of port[0] (\"p0\") is already used by core[0]"));
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 0 }]\n"
                            "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 1 }]\n"),
             Catch::Contains("core[1].lcore: 0 is already used by another [[core]]"));
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = [{ port = \"px\", rx = 0 }]\n"),
             Catch::Contains("core[0].queues[0].port: \"px\" is not a configured [[port]] name"));
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = [{ port = \"p0\", rx = 2 }]\n"),
             Catch::Contains("core[0].queues[0].rx: 2 is out of range 0..1"));
  CHECK_THAT(error_of(two + "[[core]]\nlcore = 0\nqueues = []\n"),
             Catch::Contains("core[0].queues: a core needs at least one queue"));
  CHECK_THAT(error_of(two + "[[core]]\nqueues = [{ port = \"p0\", rx = 0 }]\n"), Catch::Contains("core[0].lcore: is required"));
  CHECK_THAT(error_of("[[port]]\nname = \"p0\"\ndevice = \"d\"\nipv4 = [\"10.0.0.1\"]\nrx_queues = 2\n"),
             Catch::Contains("port[0] (\"p0\").tx_queues: 1 is less than rx_queues (2)"));
}

TEST_CASE("unreadable file", "[config][bad]") {
  try {
    droce::config::load_config_file("/nonexistent/droced.toml");
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("cannot read /nonexistent/droced.toml"));
  }
}

TEST_CASE("cores must run on lcores EAL starts", "[config][bad]") {
  CHECK_THAT(error_of("[eal]\nlcores = \"1\"\n" + kPort),
             Catch::Contains("config: core[0].lcore: 0 is not in eal.lcores \"1\" (cores derived"));
  CHECK_THAT(error_of("[eal]\nlcores = \"0-1,3\"\n" + kPort + "[[core]]\nlcore = 2\nqueues = [{ port = \"p0\", rx = 0 }]\n"),
             Catch::Contains("config: core[0].lcore: 2 is not in eal.lcores \"0-1,3\""));
  CHECK_THAT(error_of("[eal]\nlcores = \"0\"\nmain_lcore = 1\n" + kPort),
             Catch::Contains("config: eal.main_lcore: 1 is not in eal.lcores \"0\""));
  // Fine: in the list, or a --lcores mapping this check leaves to EAL.
  CHECK_NOTHROW(parse_config("[eal]\nlcores = \"0-1,3\"\n" + kPort + "[[core]]\nlcore = 3\nqueues = [{ port = \"p0\", rx = 0 }]\n"));
  CHECK_NOTHROW(parse_config("[eal]\nlcores = \"(0-3)@(0-1)\"\n" + kPort + "[[core]]\nlcore = 3\nqueues = [{ port = \"p0\", rx = 0 }]\n"));
}

TEST_CASE("mutated configs: a ConfigError or a valid config, never anything else", "[config][bad]") {
  std::string base;
  {
    std::ifstream in(std::string(DROCE_CONFIG_DIR) + "/droced.toml");
    std::stringstream ss;
    ss << in.rdbuf();
    base = ss.str();
  }
  REQUIRE(base.size() > 1000);
  std::mt19937 rng(12345);
  const char alphabet[] = "[]{}=\",.#\n 0123456789-abcdefxyz_\\'\x00\xff";
  size_t ok = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t = base;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[pos] = alphabet[rng() % (sizeof alphabet - 1)]; break;
        case 1: t.erase(pos, 1 + rng() % 8); break;
        default: t.insert(pos, 1, alphabet[rng() % (sizeof alphabet - 1)]); break;
      }
      if (t.empty()) t.push_back('x');
    }
    try {
      parse_config(t, "mut.toml");
      ++ok;
    } catch (const ConfigError& e) {
      CHECK(std::string(e.what()).rfind("config: ", 0) == 0);
      ++rejected;
    }
  }
  CHECK(rejected > 1000);
  CHECK(ok + rejected == 3000);
}

TEST_CASE("[port] dcqcn and [port.dcqcn_params]: NVIDIA's defaults, every key read", "[config][dcqcn]") {
  const auto d = parse_config(kPort).ports[0].dcqcn;  // a copy: the Config is a temporary
  CHECK_FALSE(d.enabled);
  CHECK(d.alpha_g == 1019);
  CHECK(d.initial_alpha == 1023);
  CHECK(d.rate_reduce_monitor_period_us == 4);
  CHECK(d.time_reset_us == 300);
  CHECK(d.byte_reset == 32767);
  CHECK(d.threshold == 1);
  CHECK(d.ai_rate_mbps == 5);
  CHECK(d.hai_rate_mbps == 50);
  CHECK(d.min_rate_mbps == 1);
  CHECK(d.min_dec_fac_pct == 50);
  CHECK(d.clamp_tgt_rate == 0);
  CHECK(d.stall_hold_us == 0);
  CHECK(d.validate_rate == 0);
  CHECK(d.window_us == 0);
  CHECK(d.min_time_between_cnps_us == 4);
  CHECK(d.cnp_dscp == 48);
  CHECK(d.cnp_prio == 6);

  // Every key of the table, each set to a value other than its default.
  std::string text = kPort + "dcqcn = true\n[port.dcqcn_params]\n";
  droce::config::DcqcnConfig want;
  want.enabled = true;
  uint32_t v = 2;
  for (const auto& k : droce::config::dcqcn_keys()) {
    uint32_t x = std::min(std::max(k.lo, v++), k.hi);
    if (std::string(k.name) == "line_rate_mbps") x = 10'000;
    if (std::string(k.name) == "hai_rate_mbps") x = 100;
    if (x == want.*k.field) x = x == k.lo ? x + 1 : x - 1;
    want.*k.field = x;
    text += std::string(k.name) + " = " + std::to_string(x) + "\n";
  }
  CHECK_FALSE(parse_config(kPort + "cnp = false\n").ports[0].cnp);
  const auto got = parse_config(text).ports[0].dcqcn;
  CHECK(got == want);
  CHECK(got.enabled);
}

TEST_CASE("bad DCQCN settings name the key and the rule", "[config][dcqcn][bad]") {
  const std::string t = kPort + "[port.dcqcn_params]\n";
  CHECK_THAT(error_of(kPort + "dcqcn = 1\n"), Catch::Contains("port[0].dcqcn: expected a boolean, got an integer"));
  CHECK_THAT(error_of(t + "alpha_g = 1025\n"), Catch::Contains("port[0].dcqcn_params.alpha_g: 1025 is out of range 0..1024"));
  CHECK_THAT(error_of(t + "min_dec_fac_pct = 0\n"),
             Catch::Contains("port[0].dcqcn_params.min_dec_fac_pct: 0 is out of range 1..100"));
  CHECK_THAT(error_of(t + "cnp_dscp = 64\n"), Catch::Contains("port[0].dcqcn_params.cnp_dscp: 64 is out of range 0..63"));
  CHECK_THAT(error_of(t + "cnp_prio = 8\n"), Catch::Contains("port[0].dcqcn_params.cnp_prio: 8 is out of range 0..7"));
  CHECK_THAT(error_of(t + "time_reset_us = 0\n"), Catch::Contains("time_reset_us: 0 is out of range 1.."));
  CHECK_THAT(error_of(t + "ai_rate_mbps = -5\n"), Catch::Contains("ai_rate_mbps: -5 is out of range 1.."));
  CHECK_THAT(error_of(t + "ai_rate_mbps = 5.5\n"),
             Catch::Contains("port[0].dcqcn_params.ai_rate_mbps: expected an integer, got a float"));
  CHECK_THAT(error_of(t + "ai_rate = 5\n"),
             Catch::Contains("port[0].dcqcn_params.ai_rate: unknown key") && Catch::Contains("ai_rate_mbps"));
  CHECK_THAT(error_of(t + "line_rate_mbps = 1000\nmin_rate_mbps = 2000\n"),
             Catch::Contains("port[0].dcqcn_params: min_rate_mbps (2000) is above line_rate_mbps (1000)"));
  CHECK_THAT(error_of(t + "ai_rate_mbps = 60\n"), Catch::Contains("ai_rate_mbps (60) is above hai_rate_mbps (50)"));
  CHECK_THAT(error_of(kPort + "dcqcn_params = 3\n"), Catch::Contains("port[0].dcqcn_params: expected a table"));
}

TEST_CASE("set_dcqcn_key / check_dcqcn: the checks `droce-ctl dcqcn set` goes through", "[config][dcqcn]") {
  droce::config::DcqcnConfig d;
  CHECK(droce::config::set_dcqcn_key(d, "ai_rate_mbps", 10).empty());
  CHECK(d.ai_rate_mbps == 10);
  CHECK(droce::config::set_dcqcn_key(d, "ai_rate_mbps", 0) == "ai_rate_mbps: 0 is out of range 1..1600000");
  CHECK(d.ai_rate_mbps == 10);  // unchanged by a refused value
  CHECK_THAT(droce::config::set_dcqcn_key(d, "nope", 1), Catch::StartsWith("nope: unknown key (known keys: line_rate_mbps"));
  CHECK(droce::config::check_dcqcn(d).empty());
  CHECK(droce::config::set_dcqcn_key(d, "min_rate_mbps", 200'000).empty());
  CHECK(droce::config::check_dcqcn(d) == "min_rate_mbps (200000) is above line_rate_mbps (100000)");
}

TEST_CASE("[port.fault.tx.bottleneck]: the fault injector's bottleneck mode", "[config][bottleneck]") {
  const auto none = parse_config(kPort).ports[0].fault;
  CHECK_FALSE(none.tx.bottleneck.active());
  CHECK_FALSE(none.tx.any());
  const auto f = parse_config(kPort + "[port.fault.tx.bottleneck]\nrate_gbps = 2.5\nkmin_bytes = 1000\nkmax_bytes = 9000\n"
                                       "pmax = 0.2\nlimit_bytes = 50000\necn = false\n")
                      .ports[0]
                      .fault;
  CHECK(f.tx.bottleneck.rate_bps == 2'500'000'000ull);
  CHECK(f.tx.bottleneck.kmin_bytes == 1000);
  CHECK(f.tx.bottleneck.kmax_bytes == 9000);
  CHECK(f.tx.bottleneck.pmax == 0.2);
  CHECK(f.tx.bottleneck.limit_bytes == 50000);
  CHECK_FALSE(f.tx.bottleneck.ecn);
  CHECK_FALSE(f.tx.bottleneck.mark_dequeue);
  CHECK(f.tx.any());
  CHECK(parse_config(kPort + "[port.fault.tx.bottleneck]\nrate_gbps = 1\nmark_dequeue = true\n")
            .ports[0]
            .fault.tx.bottleneck.mark_dequeue);
  CHECK(parse_config(kPort + "[port.fault.rx.bottleneck]\nrate_pps = 100000\n").ports[0].fault.rx.bottleneck.rate_pps ==
        100000);
  const std::string t = kPort + "[port.fault.tx.bottleneck]\n";
  CHECK_THAT(error_of(t + "kmin_bytes = 5\n"), Catch::Contains("port[0].fault.tx.bottleneck: a bottleneck needs a drain rate"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\nrate_pps = 5\n"), Catch::Contains("rate_pps: is set with rate_gbps"));
  CHECK_THAT(error_of(t + "rate_gbps = 0\n"), Catch::Contains("rate_gbps: 0 is out of range 0.001..1600"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\nkmin_bytes = 9000\nkmax_bytes = 9000\n"),
             Catch::Contains("kmin_bytes: 9000 is not below kmax_bytes (9000)"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\nkmax_bytes = 2000000\n"),
             Catch::Contains("kmax_bytes: 2000000 is above limit_bytes (1000000)"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\npmax = 2\n"), Catch::Contains("pmax: 2 is out of range 0..1"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\nkmn = 2\n"), Catch::Contains("bottleneck.kmn: unknown key"));
  // PFC: Xon defaults to Xoff / 2; xon < xoff <= limit; TX only.
  const auto p = parse_config(t + "rate_gbps = 1\npfc_xoff_bytes = 300000\n").ports[0].fault.tx.bottleneck;
  CHECK(p.pfc());
  CHECK(p.pfc_xoff_bytes == 300000);
  CHECK(p.pfc_xon_bytes == 150000);
  CHECK(parse_config(t + "rate_gbps = 1\npfc_xoff_bytes = 300000\npfc_xon_bytes = 0\n").ports[0].fault.tx.bottleneck.pfc_xon_bytes == 0);
  CHECK_FALSE(parse_config(t + "rate_gbps = 1\n").ports[0].fault.tx.bottleneck.pfc());
  CHECK_THAT(error_of(t + "rate_gbps = 1\npfc_xoff_bytes = 300000\npfc_xon_bytes = 300000\n"),
             Catch::Contains("pfc_xon_bytes: 300000 is not below pfc_xoff_bytes (300000)"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\npfc_xoff_bytes = 2000000\n"),
             Catch::Contains("pfc_xoff_bytes: 2000000 is above limit_bytes (1000000)"));
  CHECK_THAT(error_of(t + "rate_gbps = 1\npfc_xon_bytes = 1000\n"), Catch::Contains("pfc_xon_bytes: is set without pfc_xoff_bytes"));
  CHECK_THAT(error_of(kPort + "[port.fault.rx.bottleneck]\nrate_gbps = 1\npfc_xoff_bytes = 300000\n"),
             Catch::Contains("pfc_xoff_bytes: PFC pauses this port's own sender"));
}

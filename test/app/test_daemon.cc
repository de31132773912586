// droced's components in-process: start order, rollback when one fails,
// shutdown by request and by signal, the control commands, the fault table.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "config/fault_table.h"
#include "control/client.h"
#include "daemon.h"

using namespace droce;
using control::json;

namespace {

struct Recorder : daemon::Component {
  std::string n;
  std::vector<std::string>* log;
  bool fail = false;
  Recorder(std::string name, std::vector<std::string>* l, bool f = false) : n(std::move(name)), log(l), fail(f) {}
  std::string_view name() const override { return n; }
  void start() override {
    if (fail) throw std::runtime_error(n + " cannot start");
    log->push_back("start " + n);
  }
  void stop() noexcept override { log->push_back("stop " + n); }
};

config::Config test_config(const std::string& sock) {
  return config::parse_config(R"(
[[port]]
name = "p0"
device = "net_null0"
ipv4 = ["10.0.0.1/24"]
rx_queues = 2
tx_queues = 2
[port.fault.rx]
drop = 0.25
[[port]]
name = "p1"
device = "net_null1"
ipv4 = ["10.0.1.1/24"]
[[core]]
lcore = 3
queues = [{ port = "p0", rx = 0 }, { port = "p1", rx = 0 }]
[[core]]
lcore = 5
queues = [{ port = "p0", rx = 1 }]
[control]
socket = ")" + sock + R"("
)");
}

}  // namespace

TEST_CASE("components start in order, stop in reverse, roll back on failure", "[daemon]") {
  daemon::DaemonContext ctx;
  std::vector<std::string> log;
  {
    daemon::Daemon d(ctx);
    d.add(std::make_unique<Recorder>("a", &log));
    d.add(std::make_unique<Recorder>("b", &log));
    d.start();
    CHECK(ctx.running == std::vector<std::string>{"a", "b"});
    d.stop();
    d.stop();  // idempotent
  }
  CHECK(log == std::vector<std::string>{"start a", "start b", "stop b", "stop a"});
  log.clear();
  {
    daemon::Daemon d(ctx);
    d.add(std::make_unique<Recorder>("a", &log));
    d.add(std::make_unique<Recorder>("b", &log));
    d.add(std::make_unique<Recorder>("c", &log, true));
    CHECK_THROWS_WITH(d.start(), "c cannot start");
  }
  CHECK(log == std::vector<std::string>{"start a", "start b", "stop b", "stop a"});
}

TEST_CASE("EAL arguments: config, lcores, main lcore, command line", "[daemon]") {
  auto cfg = config::parse_config(R"toml(
[eal]
args = ["--in-memory"]
lcores = "(0-3)@(0-1)"
main_lcore = 1
[[port]]
name = "p"
device = "d"
ipv4 = ["10.0.0.1"]
)toml");
  CHECK(daemon::eal_arguments(cfg, {"--no-huge", "-m", "256"}) ==
        std::vector<std::string>{"--in-memory", "--lcores", "(0-3)@(0-1)", "--main-lcore=1", "--no-huge", "-m", "256"});
}

TEST_CASE("fault table: thresholds, publish, rates", "[daemon][fault]") {
  CHECK(config::fault_threshold(0) == 0);
  CHECK(config::fault_threshold(-1) == 0);
  CHECK(config::fault_threshold(1) == UINT32_MAX);
  CHECK(config::fault_threshold(0.5) == 0x80000000u);
  CHECK(config::fault_probability(config::fault_threshold(0.01)) == Approx(0.01).epsilon(1e-6));
  auto cfg = test_config("/tmp/unused.sock");
  config::FaultTable t(cfg.ports);
  REQUIRE(t.size() == 2);
  CHECK(t[0].active(config::FaultDir::rx));
  CHECK_FALSE(t[0].active(config::FaultDir::tx));
  CHECK_FALSE(t[1].active(config::FaultDir::rx));
  CHECK(t[0].rates(config::FaultDir::rx).drop == Approx(0.25));
  uint64_t gen = t[1].generation.load();
  t[1].set(config::FaultDir::tx, config::FaultKind::corrupt, 1.0);
  t[1].publish();
  CHECK(t[1].generation.load() == gen + 1);
  CHECK(t[1].get(config::FaultDir::tx, config::FaultKind::corrupt) == UINT32_MAX);
}

TEST_CASE("stats + control components serve status, counters, fault, shutdown", "[daemon]") {
  char dir[] = "/tmp/droced-unit-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string sock = std::string(dir) + "/d.sock";
  daemon::DaemonContext ctx;
  ctx.cfg = test_config(sock);
  ctx.config_path = "test.toml";
  ctx.faults = std::make_unique<config::FaultTable>(ctx.cfg.ports);
  daemon::Daemon d(ctx);
  d.add(std::make_unique<daemon::StatsComponent>(ctx));
  auto control = std::make_unique<daemon::ControlComponent>(ctx);
  daemon::ControlComponent* ctl = control.get();
  // What a dataplane component does before the socket opens.
  ctl->server().add("qps", "list QPs", [](const json&) { return json{{"qps", json::array({{{"qpn", 17}}})}}; });
  ctl->add_status("links", [] { return json{{"p0", "up"}}; });
  d.add(std::move(control));
  d.start();
  CHECK_THROWS(ctl->add_status("late", [] { return json(); }));

  // A core writes its blocks; the control socket sees the sums.
  REQUIRE(ctx.port_counters.size() == 2);
  (*ctx.port_counters[0])[0].add(stats::PortCounter::rx_packets, 3);
  (*ctx.port_counters[0])[1].add(stats::PortCounter::rx_packets, 4);
  (*ctx.core_counters)[1].set(stats::CoreCounter::ring_occupancy, 9);

  control::Client c(sock);
  json st = c.call("status");
  CHECK(st["pid"] == getpid());
  CHECK(st["components"] == json{"stats", "control"});
  CHECK(st["ports"].size() == 2);
  CHECK(st["cores"][1]["lcore"] == 5);
  CHECK(st["cores"][0]["queues"] == json{"p0:rx0/tx0", "p1:rx0/tx0"});
  CHECK(st["links"]["p0"] == "up");
  CHECK(c.call("qps")["qps"][0]["qpn"] == 17);

  json cn = c.call("counters", {{"group", "port"}});
  REQUIRE(cn["groups"].size() == 1);
  CHECK(cn["groups"][0]["instances"][0]["name"] == "p0");
  CHECK(cn["groups"][0]["instances"][0]["values"][0] == 7);
  json nz = c.call("counters", {{"group", "core"}, {"nonzero", true}});
  CHECK(nz["groups"][0]["names"] == json{"ring_occupancy"});
  CHECK(nz["groups"][0]["instances"][1]["name"] == "5");
  CHECK(nz["groups"][0]["instances"][1]["values"][0] == 9);
  json pc = c.call("counters", {{"group", "port"}, {"per_core", true}});
  const json& p0 = pc["groups"][0]["instances"][0];
  REQUIRE(p0["per_core"].size() == 2);
  CHECK(p0["per_core"][0]["core"] == "3");
  CHECK(p0["per_core"][0]["values"][0] == 3);
  CHECK(p0["per_core"][1]["core"] == "5");
  CHECK(p0["per_core"][1]["values"][0] == 4);
  CHECK_THROWS_WITH(c.call("counters", {{"bogus", 1}}), "counters: unknown argument 'bogus'");
  CHECK_THROWS_WITH(c.call("counters", {{"nonzero", "yes"}}), "counters: nonzero must be true or false");

  json f = c.call("fault set", {{"port", "p1"}, {"dir", "rx"}, {"reorder", 0.5}});
  CHECK(f["rx"]["reorder"] == 0.5);
  CHECK(ctx.faults->operator[](1).get(config::FaultDir::rx, config::FaultKind::reorder) == 0x80000000u);
  CHECK_THROWS_WITH(c.call("fault set", {{"port", "p1"}, {"drop", 0.1}}),
                    "fault set: dir (\"rx\" or \"tx\") is required with probabilities");
  CHECK_THROWS_WITH(c.call("fault set", {{"port", "p1"}, {"dir", "up"}, {"drop", 0.1}}),
                    "fault set: dir must be \"rx\" or \"tx\", not \"up\"");
  CHECK_THROWS_WITH(c.call("fault set", {{"port", "p1"}, {"dir", "rx"}, {"drop", "lots"}}),
                    "fault set: drop must be a number, not \"lots\"");
  CHECK_THROWS_WITH(c.call("fault set", {{"port", "p1"}, {"dir", "rx"}, {"drop", 0.1}, {"lose", 1}}),
                    "fault set: unknown argument 'lose'");
  CHECK_THROWS_WITH(c.call("fault set", {{"port", "p1"}}), "fault set: nothing to change");
  // A refused change changed nothing.
  CHECK(ctx.faults->operator[](1).get(config::FaultDir::rx, config::FaultKind::drop) == 0);
  json g = c.call("fault get", {{"port", "p0"}});
  CHECK(g["ports"].size() == 1);
  CHECK(g["ports"][0]["rx"]["drop"] == 0.25);

  // `shutdown` wakes run() with its reason.
  std::thread waiter([&] { CHECK(c.call("shutdown") == json{{"stopping", true}}); });
  CHECK(d.run() == "shutdown requested over the control socket");
  waiter.join();
  d.stop();
  CHECK(access(sock.c_str(), F_OK) != 0);
  CHECK(ctx.registry.groups().size() == 3);  // descriptors stay known
  for (const auto& g : ctx.registry.snapshot()) CHECK(g.instances.empty());  // instances are gone
  rmdir(dir);
}

TEST_CASE("SIGTERM wakes run() when the signals are blocked", "[daemon]") {
  daemon::block_signals();
  daemon::DaemonContext ctx;
  daemon::Daemon d(ctx);
  d.start();
  std::thread t([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kill(getpid(), SIGTERM);
  });
  std::string why = d.run();
  t.join();
  CHECK(why == "received SIGTERM from pid " + std::to_string(getpid()));
}

// The [nvmf] config section (lib/nvmf/config.cc): the README's example parses
// into the target it describes; every bad key is refused with its name.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "nvmf/config.h"

using namespace droce::nvmf;

namespace {
const char* kExample = R"(
[nvmf]
listen = ["10.0.0.1"]
port = 4420
cores = 2
max_queue_depth = 128
max_io_queues = 8
in_capsule_data = 8192
mdts = 5
keep_alive_granularity_ms = 100

[[nvmf.subsystem]]
nqn = "nqn.2026-12.org.droce:ram0"
serial = "DROCE0001"
model = "droce-nvmf"
allow_any_host = false
hosts = ["nqn.2014-08.org.nvmexpress:uuid:0c5e2e4e-1111-2222-3333-444455556666"]

[[nvmf.subsystem.namespace]]
nsid = 1
backend = "ram"
size = "64MiB"
block_size = 512

[[nvmf.subsystem.namespace]]
nsid = 2
size = 1048576
block_size = 4096
uuid = "5F8C0A1B-2C3D-4E5F-8A9B-0C1D2E3F4A5B"

[[nvmf.subsystem]]
nqn = "nqn.2026-12.org.droce:open"
allow_any_host = true

[node]
device = "net_memif0"   # another parser's section: left alone
)";

std::string with(const std::string& base, const std::string& from, const std::string& to) {
  std::string s = base;
  size_t p = s.find(from);
  REQUIRE(p != std::string::npos);
  return s.replace(p, from.size(), to);
}
}  // namespace

TEST_CASE("nvmf config: the README's example", "[nvmf][config]") {
  NvmfConfig c = parse_nvmf_config(kExample, "example.toml");
  CHECK(c.listen == std::vector<std::string>{"10.0.0.1"});
  CHECK(c.cores == 2);
  CHECK(c.target.traddr == "10.0.0.1");
  CHECK(!c.target.ipv6);
  CHECK(c.target.port == 4420);
  CHECK(c.target.max_queue_depth == 128);
  CHECK(c.target.in_capsule_data == 8192);
  CHECK(c.target.mdts == 5);
  CHECK(c.target.kas_100ms == 1);
  REQUIRE(c.subsystems.size() == 2);
  const SubsystemSpec& s = c.subsystems[0];
  CHECK(s.nqn == "nqn.2026-12.org.droce:ram0");
  CHECK(s.serial == "DROCE0001");
  CHECK(s.hosts.size() == 1);
  REQUIRE(s.namespaces.size() == 2);
  CHECK(s.namespaces[0].ns.size_bytes == 64ull << 20);
  CHECK(s.namespaces[1].ns.block_size == 4096);
  CHECK(s.namespaces[1].ns.uuid[0] == 0x5f);
  CHECK(s.namespaces[1].ns.uuid[15] == 0x5b);
  CHECK(c.subsystems[1].allow_any_host);

  Target t(c.target);
  build_target(c, t);
  Subsystem* sub = t.subsystem("nqn.2026-12.org.droce:ram0");
  REQUIRE(sub);
  CHECK(sub->ns(1)->blocks() == (64u << 20) / 512);
  CHECK(sub->ns(2)->uuid()[0] == 0x5f);
  CHECK(sub->host_allowed("nqn.2014-08.org.nvmexpress:uuid:0c5e2e4e-1111-2222-3333-444455556666"));
  CHECK(!sub->host_allowed("nqn.2014-08.org.nvmexpress:uuid:other"));
  CHECK(t.subsystem("nqn.2026-12.org.droce:open")->host_allowed("nqn.2014-08.org.nvmexpress:uuid:other"));
}

TEST_CASE("nvmf config: the shipped config/nvmf.toml builds a target", "[nvmf][config]") {
  std::ifstream f(DROCE_CONFIG_DIR "/nvmf.toml");
  REQUIRE(f.good());
  std::stringstream text;
  text << f.rdbuf();
  // Its `listen` is commented out: droce-nvmf gives its --ip addresses.
  NvmfConfig c = parse_nvmf_config(text.str(), "nvmf.toml", {"10.0.0.1"});
  CHECK(c.listen == std::vector<std::string>{"10.0.0.1"});
  CHECK(c.target.port == 4420);
  REQUIRE(!c.subsystems.empty());
  Target t(c.target);
  build_target(c, t);
  Subsystem* sub = t.subsystem(c.subsystems[0].nqn);
  REQUIRE(sub);
  CHECK(sub->ns(1));
}

TEST_CASE("nvmf config: each bad key is refused by name", "[nvmf][config]") {
  auto err = [](const std::string& text) {
    try {
      parse_nvmf_config(text, "t.toml");
    } catch (const NvmfConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string ex = kExample;
  CHECK_THAT(err("[other]\n"), Catch::Contains("missing section [nvmf]"));
  CHECK_THAT(err("[nvmf\n"), Catch::Contains("t.toml line 1"));
  CHECK_THAT(err(with(ex, "listen = [\"10.0.0.1\"]", "listen = [\"10.0.0.300\"]")), Catch::Contains("nvmf.listen: \"10.0.0.300\""));
  CHECK_THAT(err(with(ex, "listen = [\"10.0.0.1\"]", "listen = []")), Catch::Contains("nvmf.listen: missing"));
  CHECK_THAT(err(with(ex, "port = 4420", "port = 0")), Catch::Contains("nvmf.port: 0 is out of range"));
  CHECK_THAT(err(with(ex, "max_queue_depth = 128", "max_queue_depth = 129")), Catch::Contains("nvmf.max_queue_depth"));
  CHECK_THAT(err(with(ex, "in_capsule_data = 8192", "in_capsule_data = 8190")), Catch::Contains("not a multiple of 16"));
  CHECK_THAT(err(with(ex, "mdts = 5", "mdts = \"5\"")), Catch::Contains("nvmf.mdts: expected an integer"));
  CHECK_THAT(err(with(ex, "keep_alive_granularity_ms = 100", "keep_alive_granularity_ms = 150")), Catch::Contains("multiple of 100"));
  CHECK_THAT(err(with(ex, "cores = 2", "cores = 2\ncolour = 1")), Catch::Contains("nvmf.colour: unknown key"));
  CHECK_THAT(err(with(ex, "nqn = \"nqn.2026-12.org.droce:ram0\"", "nqn = \"ram0\"")),
             Catch::Contains("nvmf.subsystem[0].nqn: \"ram0\" is not an NQN"));
  CHECK_THAT(err(with(ex, "nqn = \"nqn.2026-12.org.droce:open\"", "nqn = \"nqn.2026-12.org.droce:ram0\"")),
             Catch::Contains("nvmf.subsystem[1].nqn: \"nqn.2026-12.org.droce:ram0\" is a duplicate"));
  CHECK_THAT(err(with(ex, "nqn = \"nqn.2026-12.org.droce:open\"", "nqn = \"nqn.2014-08.org.nvmexpress.discovery\"")),
             Catch::Contains("is not an NQN"));
  CHECK_THAT(err(with(ex, "serial = \"DROCE0001\"", "serial = \"DROCE0001DROCE0001DROCE0001\"")),
             Catch::Contains("nvmf.subsystem[0].serial: at most 20"));
  CHECK_THAT(err(with(ex, "hosts = [\"nqn.2014-08", "hosts = [\"host1\", \"nqn.2014-08")),
             Catch::Contains("nvmf.subsystem[0].hosts: \"host1\" is not an NQN"));
  CHECK_THAT(err(with(ex, "allow_any_host = true", "allow_any_host = false")),
             Catch::Contains("nvmf.subsystem[1].hosts: empty and allow_any_host is false"));
  CHECK_THAT(err(with(ex, "nsid = 2", "nsid = 1")), Catch::Contains("nvmf.subsystem[0].namespace[1].nsid: 1 is a duplicate"));
  CHECK_THAT(err(with(ex, "nsid = 2", "nsid = 0")), Catch::Contains("namespace[1].nsid: 0 is out of range"));
  CHECK_THAT(err(with(ex, "size = \"64MiB\"", "size = 1000")),
             Catch::Contains("namespace[0].size: 1000 is not a multiple of block_size 512"));
  CHECK_THAT(err(with(ex, "size = \"64MiB\"", "size = \"64MB\"")), Catch::Contains("namespace[0].size: expected a positive size"));
  CHECK_THAT(err(with(ex, "size = \"64MiB\"\n", "")), Catch::Contains("namespace[0].size: missing"));
  CHECK_THAT(err(with(ex, "block_size = 512", "block_size = 1024")), Catch::Contains("1024 is not 512 or 4096"));
  CHECK_THAT(err(with(ex, "backend = \"ram\"", "backend = \"nbd\"")), Catch::Contains("namespace[0].backend: \"nbd\""));
  CHECK_THAT(err(with(ex, "backend = \"ram\"", "backend = \"file\"")), Catch::Contains("namespace[0].path: missing"));
  CHECK_THAT(err(with(ex, "backend = \"ram\"", "backend = \"ram\"\npath = \"/x\"")), Catch::Contains("only for backend \"file\""));
  CHECK_THAT(err(with(ex, "uuid = \"5F8C0A1B", "uuid = \"ZF8C0A1B")), Catch::Contains("namespace[1].uuid"));
  CHECK_THAT(err(with(ex, "block_size = 4096\n", "block_size = 4096\nsize_gb = 1\n")),
             Catch::Contains("namespace[1].size_gb: unknown key"));
  CHECK_THAT(err(with(ex, "[[nvmf.subsystem]]\nnqn = \"nqn.2026-12.org.droce:open\"", "[nvmf.subsystem]\nnqn = \"nqn.2026-12.org.droce:open\"")),
             Catch::Contains("t.toml line"));
}

TEST_CASE("nvmf config: file namespaces are opened, created when absent, refused with their key", "[nvmf][config]") {
  char dir[] = "/tmp/droce-nvmf-config-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string img = std::string(dir) + "/d.img";
  // Absent with a size: created (sparse) with that size.
  NvmfConfig c = parse_nvmf_config(with(kExample, "backend = \"ram\"", "backend = \"file\"\npath = \"" + img + "\""));
  CHECK(c.subsystems[0].namespaces[0].path == img);
  {
    Target t(c.target);
    build_target(c, t);
    Namespace* ns = t.subsystem("nqn.2026-12.org.droce:ram0")->ns(1);
    REQUIRE(ns);
    CHECK(ns->is_file());
    CHECK(!ns->read_only());
    CHECK(ns->blocks() == (64u << 20) / 512);
    CHECK(t.has_file_namespace());
    struct stat st {};
    REQUIRE(stat(img.c_str(), &st) == 0);
    CHECK(st.st_size == 64 << 20);
  }
  // Present with the same size: opened again (a restart).
  {
    Target t(c.target);
    build_target(c, t);
    CHECK(t.subsystem("nqn.2026-12.org.droce:ram0")->ns(1)->blocks() == (64u << 20) / 512);
  }
  // Present with another size, absent without a size, not a file: refused, naming the key.
  auto refused = [&](const std::string& from, const std::string& to) {
    NvmfConfig b = parse_nvmf_config(with(kExample, from, to));
    Target t(b.target);
    try {
      build_target(b, t);
    } catch (const NvmfConfigError& e) {
      return std::string(e.what());
    }
    return std::string("built");
  };
  std::string ram = "backend = \"ram\"\nsize = \"64MiB\"";
  CHECK_THAT(refused(ram, "backend = \"file\"\npath = \"" + img + "\"\nsize = \"32MiB\""),
             Catch::Contains("nvmf.subsystem[0].namespace[0].path:") && Catch::Contains("differs from the configured size"));
  CHECK_THAT(refused(ram, "backend = \"file\"\npath = \"" + std::string(dir) + "/absent.img\""),
             Catch::Contains("namespace[0].path:") && Catch::Contains("does not exist and no size"));
  CHECK_THAT(refused(ram, "backend = \"file\"\npath = \"/dev/null\""),
             Catch::Contains("namespace[0].path:") && Catch::Contains("neither a regular file nor a block device"));
  CHECK_THAT(refused(ram, "backend = \"file\"\npath = \"" + std::string(dir) + "/no/such/dir.img\"\nsize = 4096"),
             Catch::Contains("namespace[0].path:") && Catch::Contains("create"));
  unlink(img.c_str());
  rmdir(dir);
}

TEST_CASE("sizes and UUIDs", "[nvmf][config]") {
  uint64_t b = 0;
  CHECK(parse_size("4096", b));
  CHECK(b == 4096);
  CHECK(parse_size("3GiB", b));
  CHECK(b == 3ull << 30);
  CHECK(parse_size("1TiB", b));
  CHECK(b == 1ull << 40);
  CHECK(!parse_size("", b));
  CHECK(!parse_size("GiB", b));
  CHECK(!parse_size("1 GiB", b));
  CHECK(!parse_size("1gib", b));
  CHECK(!parse_size("99999999999999999999", b));
  CHECK(!parse_size("20000000TiB", b));
  std::array<uint8_t, 16> u{};
  CHECK(parse_uuid("00112233-4455-6677-8899-aabbccddeeff", u));
  CHECK(u[0] == 0x00);
  CHECK(u[9] == 0x99);
  CHECK(u[15] == 0xff);
  CHECK(!parse_uuid("00112233-4455-6677-8899-aabbccddeef", u));
  CHECK(!parse_uuid("00112233+4455-6677-8899-aabbccddeeff", u));
  CHECK(!parse_uuid("0011223344556677-8899-aabbccddeeff00", u));
}

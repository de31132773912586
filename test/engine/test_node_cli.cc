// lib/engine/node_cli.h: the command line of the one-node programs
// (droce-perf, droce-interop): the node's options, the EAL split at "--",
// and the exit status on --help and on usage errors. No EAL is started.
#include "engine/node_cli.h"

#include <catch2/catch.hpp>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

using namespace droce;

namespace {

struct Cmd {
  std::vector<std::string> words;
  std::vector<char*> argv;
  explicit Cmd(std::initializer_list<const char*> w) {
    for (const char* s : w) words.emplace_back(s);
    for (auto& s : words) argv.push_back(s.data());
    argv.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(words.size()); }
};

struct Prog {
  std::string device, mac, test;
  std::vector<std::string> ip, eal;
  CLI::App app{"prog"};
  Prog() {
    app.add_option("test", test)->required();
    engine::add_node_options(app, device, ip, mac);
  }
  std::optional<int> parse(Cmd& c) { return engine::parse_node_command_line(app, c.argc(), c.argv.data(), eal); }
};

}  // namespace

TEST_CASE("node_cli: the node's options, repeated --ip, EAL arguments after --") {
  Prog p;
  Cmd c{"prog", "write_bw", "--device", "net_ring0", "--ip", "10.1.0.1", "--ip", "10.1.0.2",
        "--mac", "02:00:00:00:00:01", "--", "--lcores=0@1", "--ip", "--no-pci"};
  CHECK_FALSE(p.parse(c).has_value());
  CHECK(p.test == "write_bw");
  CHECK(p.device == "net_ring0");
  CHECK(p.ip == std::vector<std::string>{"10.1.0.1", "10.1.0.2"});
  CHECK(p.mac == "02:00:00:00:00:01");
  // Everything after the first "--" is the EAL's, even words that look like ours.
  CHECK(p.eal == std::vector<std::string>{"--lcores=0@1", "--ip", "--no-pci"});
}

TEST_CASE("node_cli: --mac may be left out; no -- means no EAL arguments") {
  Prog p;
  Cmd c{"prog", "send_lat", "--device", "net_ring0", "--ip", "10.1.0.1"};
  CHECK_FALSE(p.parse(c).has_value());
  CHECK(p.mac.empty());
  CHECK(p.eal.empty());
}

TEST_CASE("node_cli: --device and --ip are required; unknown options and --help stop the program") {
  SECTION("no --device") {
    Prog p;
    Cmd c{"prog", "write_bw", "--ip", "10.1.0.1"};
    const auto rc = p.parse(c);
    REQUIRE(rc.has_value());
    CHECK(*rc != 0);
  }
  SECTION("no --ip") {
    Prog p;
    Cmd c{"prog", "write_bw", "--device", "net_ring0"};
    const auto rc = p.parse(c);
    REQUIRE(rc.has_value());
    CHECK(*rc != 0);
  }
  SECTION("an option before -- that the program does not know") {
    Prog p;
    Cmd c{"prog", "write_bw", "--device", "net_ring0", "--ip", "10.1.0.1", "--lcores=0@1", "--"};
    const auto rc = p.parse(c);
    REQUIRE(rc.has_value());
    CHECK(*rc != 0);
  }
  SECTION("--help: exit status 0") {
    Prog p;
    Cmd c{"prog", "--help"};
    const auto rc = p.parse(c);
    REQUIRE(rc.has_value());
    CHECK(*rc == 0);
  }
}

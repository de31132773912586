#define CATCH_CONFIG_RUNNER
#include "engine_env.h"

#include <rte_lcore.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "dpdk/eal.h"
#include "dpdk/port.h"

namespace droce::shim::test {

namespace {
struct Env {
  dpdk::RingPair rings{"shimt", 1};
  dpdk::Port pa{dpdk::PortConfig{.port_id = rings.port_a(), .mbufs = 4095}};
  dpdk::Port pb{dpdk::PortConfig{.port_id = rings.port_b(), .mbufs = 4095}};
  config::Config cfg;
  std::unique_ptr<engine::Dataplane> dp;
  Env() {
    engine::DataplaneConfig c;
    dpdk::Port* ports[2] = {&pa, &pb};
    for (uint32_t i = 0; i < 2; ++i) {
      engine::PortSpec ps;
      ps.name = i == 0 ? "a" : "b";
      ps.port = ports[i];
      ps.host.ipv4 = {kDevIp[i]};
      c.ports.push_back(ps);
      config::PortConfig pc;
      pc.name = ps.name;
      pc.mtu = 1500;
      cfg.ports.push_back(pc);
    }
    // One core loop on a worker lcore serves both ports.
    c.cores.push_back({rte_get_next_lcore(-1, 1, 0), {{0, 0}, {1, 0}}});
    c.engine.max_qps = 256;
    c.engine.max_mrs = 256;
    cfg.roce.max_qps = 256;
    cfg.roce.max_mrs = 256;
    dp = std::make_unique<engine::Dataplane>(c);
    dp->start();
  }
};
std::unique_ptr<dpdk::Eal> g_eal;
std::unique_ptr<Env> g_env;
Env& env() {
  if (!g_env) g_env = std::make_unique<Env>();
  return *g_env;
}
}  // namespace

engine::Dataplane& dataplane() { return *env().dp; }
const config::Config& backend_config() { return env().cfg; }

ibv_gid dev_gid(uint32_t dev) {
  ibv_gid g{};
  std::memcpy(g.raw, dataplane().gids(dev).at(kRoceGidIndex).data(), 16);
  return g;
}

ibv_gid unreachable_gid() {
  ibv_gid g = dev_gid(0);
  g.raw[15] = 99;  // 10.77.0.99
  return g;
}

std::string temp_socket() {
  static int n = 0;
  char tmpl[] = "/tmp/droce-shim-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  REQUIRE(d != nullptr);
  return std::string(d) + "/s" + std::to_string(n++) + ".sock";
}

namespace {
ShimServerConfig with_socket(ShimServerConfig c, const std::string& path) {
  c.socket_path = path;
  return c;
}
}  // namespace

EngineFixture::TempDir::~TempDir() { std::filesystem::remove_all(std::filesystem::path(path).parent_path()); }

EngineFixture::EngineFixture(ShimServerConfig cfg, CmBackend* cm)
    : dir{temp_socket()},
      backend(dataplane(), backend_config()),
      server(backend, with_socket(std::move(cfg), dir.path), cm) {
  backend.start();
  REQUIRE(server.start() == 0);
}

}  // namespace droce::shim::test

int main(int argc, char** argv) {
  using namespace droce;
  try {
    shim::test::g_eal = std::make_unique<dpdk::Eal>(dpdk::EalOptions{
        .args = {"--lcores=(0-1)@(0-1)", "--log-level=lib.eal:error"}, .program = "test_shim_server"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  const int rc = Catch::Session().run(argc, argv);
  shim::test::g_env.reset();
  return rc;
}

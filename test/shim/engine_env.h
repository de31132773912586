// The real shim backend for the shim's tests: EngineShimBackend over an
// engine::Dataplane on a DPDK net_ring pair in this process (EAL in main, see
// engine_env.cc). Two ports, two devices: droce0 (10.77.0.1, port a) and
// droce1 (10.77.0.2, port b), wired to each other, served by one running core
// loop on an EAL worker lcore. A ShimServer per test (EngineFixture) over a
// fresh EngineShimBackend; the dataplane lives as long as the process.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "engine/dataplane.h"
#include "shim/engine/engine_backend.h"
#include "shim/server.h"

namespace droce::shim::test {

inline constexpr uint32_t kDevIp[2] = {0x0A4D0001, 0x0A4D0002};  // 10.77.0.1, 10.77.0.2
inline constexpr uint32_t kRoceGidIndex = 1;                     // the IPv4-mapped GID of each port

// The process's dataplane (created on first use) and the config the backend reads.
engine::Dataplane& dataplane();
const config::Config& backend_config();
// The RoCEv2 GID of device dev (port dev of the dataplane).
ibv_gid dev_gid(uint32_t dev);
// A GID on the ports' subnet nobody answers ARP for.
ibv_gid unreachable_gid();

std::string temp_socket();

// Members go in reverse: the server first (it destroys what its clients
// left, on the running core), then the backend's pollers, then the socket's
// directory.
struct EngineFixture {
  // cm: the RDMA CM backend of the server's Cm* ops (none: they answer ENOSYS).
  explicit EngineFixture(ShimServerConfig cfg = {}, CmBackend* cm = nullptr);
  struct TempDir {
    std::string path;
    ~TempDir();
  } dir;
  EngineShimBackend backend;
  ShimServer server;
};

}  // namespace droce::shim::test

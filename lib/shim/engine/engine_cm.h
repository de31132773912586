// droced's CmBackend: the RDMA CM of each port on the real dataplane
// (lib/cm/README.md). Per port, on its home core (Dataplane::home_core): a
// cm::Gsi (QP1 of that core's engine, MAD buffers from Dataplane::alloc_dma
// registered on the port) and a cm::Agent. A poller on the home core reaps
// the GSI and ticks the Agent about every millisecond; every CmBackend call
// runs there through Dataplane::run_on; the Agent's events go to the sink on
// the core's thread. MACs come from the port's NetStack on the same core
// (Dataplane::resolve_step_st: one ARP request / NS, never a wait).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cm/agent.h"
#include "cm/gsi.h"
#include "config/config.h"
#include "engine/dataplane.h"
#include "shim/cm_backend.h"

namespace droce::shim {

struct EngineCmConfig {
  uint32_t recv_bufs = 256;  // MADs waiting in QP1's receive queue, per port
  uint32_t send_bufs = 256;  // MADs in flight, per port
  cm::AgentConfig agent;     // ca_guid and max_path_mtu are set per port
  uint64_t tick_ns = 1'000'000;
};

// The node GUID of a port (host value): the EUI-64 of its MAC, as the kernel
// derives RoCE node GUIDs (ibv_query_device shows it big-endian).
uint64_t node_guid_of(const wire::MacAddr& mac) noexcept;

class EngineCmBackend final : public CmBackend {
 public:
  // Builds each port's Gsi and Agent on its home core (the loops may be
  // running) and installs the pollers. Throws std::runtime_error.
  EngineCmBackend(engine::Dataplane& dp, const config::Config& cfg, EngineCmConfig cm = {});
  // Removes the pollers, then destroys the Agents (pending connections get
  // REJ, established ones DREQ) and QP1s on their cores.
  ~EngineCmBackend() override;
  EngineCmBackend(const EngineCmBackend&) = delete;
  EngineCmBackend& operator=(const EngineCmBackend&) = delete;

  void cm_set_sink(Sink sink) override;
  int cm_local_dev(const wire::Gid& ip, uint32_t* dev) override;
  int cm_route(const wire::Gid& dst, uint32_t* dev, wire::Gid* src) override;
  int cm_resolve(uint32_t dev, const wire::Gid& dst) override;
  int cm_gid_index(uint32_t dev, const wire::Gid& ip) override;

  int cm_listen(uint32_t dev, cm::PortSpace ps, const cm::Endpoint& bound, cm::QpKind kind, uint64_t user,
                cm::ConnId* out) override;
  int cm_connect(uint32_t dev, const cm::ConnectArgs& a, uint64_t user, cm::ConnId* out) override;
  int cm_accept(uint32_t dev, cm::ConnId id, const cm::ConnParam& p) override;
  int cm_reject(uint32_t dev, cm::ConnId id, std::span<const uint8_t> private_data) override;
  int cm_establish(uint32_t dev, cm::ConnId id) override;
  int cm_disconnect(uint32_t dev, cm::ConnId id) override;
  void cm_destroy(uint32_t dev, cm::ConnId id) override;
  int cm_qp_params(uint32_t dev, cm::ConnId id, cm::QpParams* out) override;
  int cm_set_user(uint32_t dev, cm::ConnId id, uint64_t user) override;

  // droce-ctl's view of dev (through run_on): the Agent's connections and
  // the Agent's and the Gsi's counters (name, value). -ENODEV, -ETIMEDOUT.
  int connections(uint32_t dev, std::vector<cm::ConnInfo>& out);
  int counters(uint32_t dev, std::vector<std::pair<std::string, uint64_t>>& out);
  // The key of dev's MAD buffers (droce-ctl mrs lists it beside QPN 1); 0: none.
  uint32_t mr_key(uint32_t dev) const noexcept { return dev < ports_.size() && ports_[dev] ? port_lkey(dev) : 0; }

 private:
  struct Port;
  void open_ports(const config::Config& cfg, const EngineCmConfig& cm);
  void close_ports() noexcept;
  uint32_t port_lkey(uint32_t dev) const noexcept;
  // Runs fn(agent) on dev's home core and returns its result; -ENODEV, -ETIMEDOUT.
  template <typename F>
  int on_agent(uint32_t dev, F fn);

  engine::Dataplane& dp_;
  std::vector<std::unique_ptr<Port>> ports_;
};

}  // namespace droce::shim

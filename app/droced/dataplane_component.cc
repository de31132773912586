#include "dataplane_component.h"

#include <rte_malloc.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

#include "netstack/gid_table.h"

namespace droce::daemon {

using control::CommandError;
using control::json;

DataplaneComponent::DataplaneComponent(DaemonContext& ctx, ControlComponent& control) : ctx_(ctx) {
  control.server().add("qps", "queue pairs: port, core, state, PSNs, counters", [this](const json&) { return qps(); });
  control.server().add("mrs", "memory regions: key, address, length, access, IOVA", [this](const json&) { return mrs(); });
  control.server().add("arp", "ARP / neighbour cache of every port", [this](const json&) { return arp(); });
}

DataplaneComponent::~DataplaneComponent() { stop(); }

engine::Dataplane& DataplaneComponent::dp() const {
  if (!dp_) throw CommandError("the dataplane is not running");
  return *dp_;
}

void DataplaneComponent::start() {
  const config::Config& cfg = ctx_.cfg;
  try {
    eal_ = std::make_unique<dpdk::Eal>(dpdk::EalOptions{.args = ctx_.eal_args, .program = "droced"});
  } catch (const dpdk::EalError& e) {
    throw std::runtime_error(std::string("dataplane: EAL: ") + e.what());
  }
  engine::DataplaneConfig dc;
  for (size_t p = 0; p < cfg.ports.size(); ++p) {
    const config::PortConfig& pcfg = cfg.ports[p];
    dpdk::PortConfig pc;
    pc.device = pcfg.device;
    pc.rx_queues = pcfg.rx_queues;
    pc.tx_queues = pcfg.tx_queues;
    pc.mbufs = 8191u * std::max<uint16_t>(pcfg.rx_queues, pcfg.tx_queues);
    if (pcfg.mac) pc.mac = *pcfg.mac;
    try {
      ports_.push_back(std::make_unique<dpdk::Port>(pc));
    } catch (const dpdk::PortError& e) {
      throw std::runtime_error("dataplane: port " + pcfg.name + ": " + e.what());
    }
    dpdk::Port& port = *ports_.back();
    if (pcfg.mtu != 1500 && pcfg.mtu != port.mtu()) {
      try {
        port.set_mtu(static_cast<uint16_t>(pcfg.mtu));
      } catch (const dpdk::PortError& e) {
        spdlog::warn("dataplane: port {}: MTU {} not set ({}); set it on the device instead", pcfg.name, pcfg.mtu,
                     e.what());
      }
    }
    engine::PortSpec ps;
    ps.name = pcfg.name;
    ps.port = &port;
    ps.host.mac = port.mac();
    for (const auto& a : pcfg.ipv4)
      ps.host.ipv4.push_back(uint32_t{a.addr[0]} << 24 | uint32_t{a.addr[1]} << 16 | uint32_t{a.addr[2]} << 8 |
                             a.addr[3]);
    for (const auto& a : pcfg.ipv6) {
      wire::Gid g;
      std::copy(a.addr.begin(), a.addr.end(), g.begin());
      ps.host.ipv6.push_back(g);
    }
    ps.host.vlan = pcfg.vlan.value_or(0);
    ps.host.vlan_pcp = pcfg.vlan_pcp;
    ps.faults = &(*ctx_.faults)[p];
    ps.counters = p < ctx_.port_counters.size() ? ctx_.port_counters[p].get() : nullptr;
    ps.dscp = pcfg.dscp;
    ps.ecn = pcfg.ecn;
    dc.ports.push_back(std::move(ps));
    spdlog::info("dataplane: port {} = {} ({}), mac {}, {} rx / {} tx queue(s)", pcfg.name, pcfg.device,
                 port.driver(), dpdk::mac_to_string(port.mac()), port.rx_queues(), port.tx_queues());
  }
  for (const config::CoreConfig& c : cfg.cores) {
    engine::CoreSpec cs;
    cs.lcore = c.lcore;
    cs.idle_yield_polls = c.idle_yield_polls;
    for (const auto& q : c.queues) {
      if (q.rx != q.tx)
        throw std::runtime_error("dataplane: lcore " + std::to_string(c.lcore) +
                                 ": rx and tx queue must be the same index (queue pairs)");
      cs.queues.push_back({q.port, q.rx});
    }
    dc.cores.push_back(std::move(cs));
  }
  dc.engine.max_qps = cfg.roce.max_qps;
  dc.engine.max_mrs = cfg.roce.max_mrs;
  dc.engine.max_inflight_pkts = 64;
  dc.engine.selective_repeat = cfg.roce.selective_repeat;
  for (const auto& g : cfg.roce.selective_repeat_peers) dc.engine.sr_peers.push_back(g);
  dc.registry = &ctx_.registry;
  dc.core_counters = ctx_.core_counters.get();
  try {
    dp_ = std::make_unique<engine::Dataplane>(std::move(dc));
    dp_->start();
  } catch (const std::exception& e) {
    dp_.reset();
    ports_.clear();
    eal_.reset();
    throw std::runtime_error(std::string(e.what()));
  }
  for (size_t p = 0; p < cfg.ports.size(); ++p)
    for (size_t i = 0; i < dp_->gids(static_cast<uint32_t>(p)).size(); ++i)
      spdlog::info("dataplane: port {} gid[{}] {}", cfg.ports[p].name, i,
                   netstack::gid_to_string(dp_->gids(static_cast<uint32_t>(p)).at(i)));
  spdlog::info("dataplane: {} core(s) polling", dp_->core_count());
}

void DataplaneComponent::stop() noexcept {
  if (dp_) {
    dp_->stop();  // QPs flushed with errors, loops joined
    dp_.reset();
  }
  ports_.clear();
  eal_.reset();
}

json DataplaneComponent::qps() const {
  json rows = json::array();
  for (const auto& q : dp().qps()) {
    rows.push_back({{"port", ctx_.cfg.ports.at(q.port).name},
                    {"qpn", q.qpn},
                    {"lcore", q.lcore},
                    {"type", q.type == verbs::QpType::RC ? "RC" : q.type == verbs::QpType::UC ? "UC" : "UD"},
                    {"state", verbs::qp_state_str(q.state)},
                    {"dest_qpn", q.dest_qpn},
                    {"sq_psn", q.sq_psn},
                    {"rq_psn", q.rq_psn},
                    {"mtu", q.mtu},
                    {"sq_outstanding", q.sq_outstanding},
                    {"rq_posted", q.rq_posted},
                    {"tx_packets", q.ctr.tx_packets},
                    {"tx_bytes", q.ctr.tx_bytes},
                    {"rx_packets", q.ctr.rx_packets},
                    {"rx_bytes", q.ctr.rx_bytes},
                    {"retransmits", q.ctr.retransmits},
                    {"timeouts", q.ctr.timeouts},
                    {"seq_naks_received", q.ctr.seq_naks_received},
                    {"rnr_naks_received", q.ctr.rnr_naks_received},
                    {"seq_naks_sent", q.ctr.seq_naks_sent},
                    {"rnr_naks_sent", q.ctr.rnr_naks_sent},
                    {"err_naks_sent", q.ctr.err_naks_sent},
                    {"err_naks_received", q.ctr.err_naks_received},
                    {"cnp_sent", q.ctr.cnp_sent},
                    {"cnp_received", q.ctr.cnp_received}});
  }
  return json{{"qps", rows}};
}

json DataplaneComponent::mrs() const {
  json rows = json::array();
  for (const auto& m : dp().mrs()) {
    char addr[32], iova[32];
    std::snprintf(addr, sizeof addr, "0x%lx", static_cast<unsigned long>(m.addr));
    std::snprintf(iova, sizeof iova, "0x%lx", static_cast<unsigned long>(m.dma_iova));
    rows.push_back({{"port", ctx_.cfg.ports.at(m.port).name},
                    {"key", m.key},
                    {"pd", m.pd},
                    {"addr", addr},
                    {"length", m.length},
                    {"access", m.access},
                    {"hugepage", m.hugepage},
                    {"zero_copy", m.zero_copy},
                    {"iova", iova}});
  }
  return json{{"mrs", rows}};
}

json DataplaneComponent::arp() const {
  json rows = json::array();
  for (const auto& n : dp().neighbours())
    rows.push_back({{"port", ctx_.cfg.ports.at(n.port).name},
                    {"address", netstack::gid_to_string(n.e.ip)},
                    {"mac", dpdk::mac_to_string(n.e.mac)},
                    {"state", netstack::neigh_state_name(n.e.state)},
                    {"probes", n.e.probes}});
  return json{{"arp", rows}};
}

}  // namespace droce::daemon

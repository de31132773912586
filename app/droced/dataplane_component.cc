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
  control.server().add("dcqcn get", "congestion control per port: ecn, dcqcn, its parameters, CNPs (args: port)",
                       [this](const json& a) { return dcqcn_get(a); });
  control.server().add("dcqcn set",
                       "change congestion control of a port at run time (args: port, dcqcn, ecn, cnp, and any "
                       "[port.dcqcn_params] key)",
                       [this](const json& a) { return dcqcn_set(a); });
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
    ps.cnp = pcfg.cnp;
    ps.dcqcn = pcfg.dcqcn;
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
  dc.engine.max_inflight_pkts = cfg.roce.window;
  dc.engine.initial_inflight_pkts = cfg.roce.initial_window;
  dc.engine.tail_timeout_ns = uint64_t{cfg.roce.tail_timeout_us} * 1000;
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
                    {"cnp_received", q.ctr.cnp_received},
                    {"ce_received", q.ctr.ce_received},
                    {"rp_limited", q.rp_limited},
                    {"rate_mbps", q.rate_kbps / 1000.0},
                    {"target_mbps", q.target_kbps / 1000.0},
                    {"alpha", q.alpha},
                    {"rp_cnps", q.rp.cnps},
                    {"rate_decreases", q.rp.decreases},
                    {"rate_increases", q.rp.increases},
                    {"hyper_increases", q.rp.hyper},
                    {"paced", q.ctr.paced},
                    {"sr", !q.sr_enabled ? "off" : q.sr_tx ? "negotiated" : "enabled"},
                    {"sr_resent", q.ctr.sr_resent},
                    {"sr_sacks_received", q.ctr.sr_sacks_received},
                    {"sr_ooo_placed", q.ctr.sr_ooo_placed},
                    {"sr_sacks_sent", q.ctr.sr_sacks_sent}});
  }
  return json{{"qps", rows}};
}

uint32_t DataplaneComponent::port_arg(const json& args, const char* cmd, bool required) const {
  auto it = args.find("port");
  if (it == args.end()) {
    if (required) throw CommandError(std::string(cmd) + ": port (a port name) is required");
    return UINT32_MAX;
  }
  if (!it->is_string()) throw CommandError(std::string(cmd) + ": port must be a port name");
  const auto& ports = ctx_.cfg.ports;
  for (uint32_t p = 0; p < ports.size(); ++p)
    if (ports[p].name == it->get<std::string>()) return p;
  throw CommandError(std::string(cmd) + ": no port '" + it->get<std::string>() + "'");
}

json DataplaneComponent::cc_json(uint32_t p) const {
  const engine::PortCc cc = dp().cc(p);
  json o = json::object();
  o["ecn"] = cc.ecn;
  o["cnp"] = cc.cnp;
  o["dcqcn"] = cc.dcqcn.enabled;
  for (const config::DcqcnKey& k : config::dcqcn_keys()) o[k.name] = cc.dcqcn.*k.field;
  o["cnp_sent"] = dp().engine_counter(p, transport::Ctr::CnpSent);
  o["cnp_suppressed"] = dp().engine_counter(p, transport::Ctr::CnpSuppressed);
  o["cnp_received"] = dp().engine_counter(p, transport::Ctr::CnpReceived);
  o["ce_received"] = dp().engine_counter(p, transport::Ctr::CeReceived);
  return o;
}

json DataplaneComponent::dcqcn_get(const json& args) const {
  for (const auto& [k, v] : args.items())
    if (k != "port") throw CommandError("dcqcn get: unknown argument '" + k + "'");
  const uint32_t only = port_arg(args, "dcqcn get", false);
  json out = json::object();
  for (uint32_t p = 0; p < ctx_.cfg.ports.size(); ++p)
    if (only == UINT32_MAX || only == p) out[ctx_.cfg.ports[p].name] = cc_json(p);
  return out;
}

json DataplaneComponent::dcqcn_set(const json& args) {
  const uint32_t p = port_arg(args, "dcqcn set", true);
  engine::PortCc cc = dp().cc(p);
  bool any = false;
  for (const auto& [k, v] : args.items()) {
    if (k == "port") continue;
    any = true;
    if (k == "dcqcn" || k == "ecn" || k == "cnp") {
      if (!v.is_boolean()) throw CommandError("dcqcn set: " + k + " must be true or false, not " + v.dump());
      (k == "dcqcn" ? cc.dcqcn.enabled : k == "ecn" ? cc.ecn : cc.cnp) = v.get<bool>();
      continue;
    }
    if (!v.is_number_integer())
      throw CommandError("dcqcn set: " + k + " must be an integer, not " + v.dump());
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX ? INT64_MAX : v.get<int64_t>();
    const std::string err = config::set_dcqcn_key(cc.dcqcn, k, x);
    if (!err.empty()) throw CommandError("dcqcn set: " + err);
  }
  if (!any) throw CommandError("dcqcn set: nothing to change");
  const std::string err = config::check_dcqcn(cc.dcqcn);
  if (!err.empty()) throw CommandError("dcqcn set: " + err);
  try {
    dp().set_cc(p, cc);
  } catch (const engine::DataplaneError& e) {
    throw CommandError(std::string("dcqcn set: ") + e.what());
  }
  spdlog::info("dcqcn set: port {}: {}", ctx_.cfg.ports[p].name, args.dump());
  json out = json::object();
  out[ctx_.cfg.ports[p].name] = cc_json(p);
  return out;
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

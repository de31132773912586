#include "shim/engine/engine_backend.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "netstack/gid_table.h"
#include "shim/engine/backend_objects.h"
#include "verbs/queues.h"

namespace droce::shim {

using backend_detail::take_event;

namespace {
verbs::Mtu mtu_enum(uint32_t bytes) {
  switch (bytes) {
    case 256: return verbs::Mtu::M256;
    case 512: return verbs::Mtu::M512;
    case 2048: return verbs::Mtu::M2048;
    case 4096: return verbs::Mtu::M4096;
    default: return verbs::Mtu::M1024;
  }
}
}  // namespace

EngineShimBackend::EngineShimBackend(engine::Dataplane& dp, const config::Config& cfg)
    : dp_(dp), cfg_(cfg), ahs_(new AhSlot[kMaxAhs]) {
  for (size_t i = 0; i < dp_.core_count(); ++i) cores_.push_back(std::make_unique<Core>());
  for (uint32_t i = kMaxAhs - 1; i >= 1; --i) free_ahs_.push_back(i);  // AH number 0 is never handed out
}

EngineShimBackend::~EngineShimBackend() { stop(); }

void EngineShimBackend::start() {
  if (started_) return;
  for (size_t i = 0; i < cores_.size(); ++i) {
    Core* k = cores_[i].get();
    pollers_.push_back(dp_.add_poller(i, [this, k]() { return poll_core(*k); }));
  }
  started_ = true;
}

void EngineShimBackend::stop() noexcept {
  if (!started_) return;
  for (size_t i = 0; i < pollers_.size(); ++i) dp_.remove_poller(i, pollers_[i]);
  pollers_.clear();
  started_ = false;
}

ShimBackendStats EngineShimBackend::stats() const {
  ShimBackendStats s;
  for (const auto& k : cores_) {
    s.sq_wqes += k->sq_wqes.get();
    s.rq_wqes += k->rq_wqes.get();
    s.cqes += k->cqes.get();
    s.bad_wqes += k->bad_wqes.get();
    s.corrupt_rings += k->corrupt.get();
    s.events += k->events.get();
    s.async_events += k->async_events.get();
    s.ring_visits += k->visits.get();
    s.doorbells += k->doorbells.get();
    s.parks += k->parks.get();
  }
  return s;
}

int EngineShimBackend::on_core(size_t core, std::function<int(engine::CoreLoop&)> fn) {
  auto rc = std::make_shared<int>(-ETIMEDOUT);
  if (!dp_.run_on(core, [fn = std::move(fn), rc](engine::CoreLoop& c) { *rc = fn(c); })) return -ETIMEDOUT;
  return *rc;
}

int EngineShimBackend::core_of(const ClientInfo& c) {
  auto it = client_core_.find(c.id);
  if (it != client_core_.end()) return it->second;
  if (c.dev >= dp_.port_count()) return -ENODEV;
  const int core = static_cast<int>(dp_.pick_core(c.dev));
  client_core_[c.id] = core;
  return core;
}

// ---- device ----

uint32_t EngineShimBackend::device_count() { return static_cast<uint32_t>(dp_.port_count()); }

int EngineShimBackend::device_info(uint32_t dev, proto::DeviceInfo& out) {
  if (dev >= dp_.port_count()) return -ENODEV;
  std::snprintf(out.name, sizeof(out.name), "droce%u", dev);
  const wire::MacAddr m = dp_.port(dev).host.mac;
  // EUI-64 from the MAC, as the kernel derives RoCE node GUIDs.
  uint64_t g = 0;
  const uint8_t b[8] = {static_cast<uint8_t>(m[0] ^ 2), m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]};
  for (uint8_t x : b) g = g << 8 | x;
  out.node_guid = htobe64(g);
  out.phys_port_cnt = 1;
  return 0;
}

int EngineShimBackend::query_device(uint32_t dev, ibv_device_attr& a) {
  proto::DeviceInfo di{};
  if (int rc = device_info(dev, di)) return rc;
  a = ibv_device_attr{};
  std::snprintf(a.fw_ver, sizeof(a.fw_ver), "droce 0.1.0");
  a.node_guid = di.node_guid;
  a.sys_image_guid = di.node_guid;
  a.max_mr_size = 1ull << 40;
  a.page_size_cap = 0xfffff000;
  a.vendor_id = 0xffffff;
  a.max_qp = static_cast<int>(cfg_.roce.max_qps);
  a.max_qp_wr = 4096;
  a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_WINDOW |
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  const transport::EngineConfig ec{};  // droced's dataplane keeps these defaults
  a.max_mw = static_cast<int>(ec.max_mws);
  // UD multicast (attach_mcast): groups and QPs per group of the core's engine.
  a.max_mcast_grp = static_cast<int>(ec.max_mcast_groups);
  a.max_mcast_qp_attach = static_cast<int>(ec.max_mcast_qps_per_group);
  a.max_total_mcast_qp_attach = a.max_mcast_grp * a.max_mcast_qp_attach;
  a.max_sge = verbs::kMaxSge;
  a.max_sge_rd = verbs::kMaxSge;
  a.max_cq = static_cast<int>(cfg_.roce.max_qps) * 2;
  a.max_cqe = 32768;
  a.max_mr = static_cast<int>(cfg_.roce.max_mrs);
  a.max_pd = 1 << 20;
  a.max_qp_rd_atom = verbs::kMaxRdAtomic;
  a.max_res_rd_atom = verbs::kMaxRdAtomic * static_cast<int>(cfg_.roce.max_qps);
  a.max_qp_init_rd_atom = verbs::kMaxRdAtomic;
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_ah = kMaxAhs - 1;
  a.max_srq = static_cast<int>(cfg_.roce.max_qps);
  a.max_srq_wr = 4096;
  a.max_srq_sge = verbs::kMaxSge;
  a.max_pkeys = 1;
  a.local_ca_ack_delay = 15;
  a.phys_port_cnt = 1;
  return 0;
}

IbLinkRate ib_rate_for_eth(uint32_t mbps) {
  // IBV_WIDTH_1X = 1, 4X = 2; IBV_SPEED_SDR = 1, DDR = 2, FDR10 = 8, EDR = 32, HDR = 64, NDR = 128.
  if (mbps <= 1000) return {1, 1};
  if (mbps <= 10000) return {1, 8};
  if (mbps <= 20000) return {2, 2};
  if (mbps <= 25000) return {1, 32};
  if (mbps <= 40000) return {2, 8};
  if (mbps <= 100000) return {2, 32};
  if (mbps <= 200000) return {2, 64};
  return {2, 128};
}

// Ethernet MTU 1500 carries IB MTU 1024; larger only with a jumbo port.
ibv_mtu EngineShimBackend::port_max_mtu(uint32_t dev) const {
  const uint32_t eth_mtu = cfg_.ports.at(dev).mtu;
  return eth_mtu >= 4200 ? IBV_MTU_4096 : eth_mtu >= 2100 ? IBV_MTU_2048 : IBV_MTU_1024;
}

int EngineShimBackend::query_port(uint32_t dev, uint32_t port, ibv_port_attr& p) {
  if (dev >= dp_.port_count() || port != 1) return -EINVAL;
  p = ibv_port_attr{};
  p.state = IBV_PORT_ACTIVE;
  const ibv_mtu max = port_max_mtu(dev);
  p.max_mtu = max;
  p.active_mtu = std::min<ibv_mtu>(max, static_cast<ibv_mtu>(mtu_enum(cfg_.roce.path_mtu)));
  p.gid_tbl_len = static_cast<int>(dp_.gids(dev).size());
  p.max_msg_sz = verbs::kMaxMsgSize;
  p.port_cap_flags = IBV_PORT_CM_SUP;  // the RDMA CM (lib/cm) answers on QP1
  p.pkey_tbl_len = 1;
  p.max_vl_num = 1;
  // The DPDK port's link speed (net_af_packet reports 10G).
  uint32_t mbps = 0;
  if (const dpdk::Port* port = dp_.port(dev).port) {
    try {
      mbps = port->link().speed_mbps;
    } catch (const std::exception&) {
      mbps = 0;  // no link status from the driver: the lowest rate
    }
  }
  const IbLinkRate rate = ib_rate_for_eth(mbps);
  p.active_width = rate.width;
  p.active_speed = rate.speed;
  p.phys_state = 5;
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int EngineShimBackend::query_gid_table(uint32_t dev, uint32_t port, ibv_gid_entry* out, uint32_t max) {
  if (dev >= dp_.port_count() || port != 1) return -EINVAL;
  const auto& g = dp_.gids(dev);
  const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(g.size()), max);
  for (uint32_t i = 0; i < n; ++i) {
    out[i] = ibv_gid_entry{};
    std::memcpy(out[i].gid.raw, g.at(i).data(), 16);
    out[i].gid_index = i;
    out[i].port_num = 1;
    out[i].gid_type = IBV_GID_TYPE_ROCE_V2;
  }
  return static_cast<int>(n);
}

// ---- PD, MR ----

int EngineShimBackend::alloc_pd(const ClientInfo&, ObjId& out) {
  out = dp_.alloc_pd();
  return 0;
}

int EngineShimBackend::dealloc_pd(const ClientInfo&, ObjId) { return 0; }

int EngineShimBackend::reg_mr(const ClientInfo& c, const MrSetup& s, MrResult& out) {
  if (c.dev >= dp_.port_count()) return -ENODEV;
  if (s.access & ~verbs::kAccessAll &
      ~static_cast<uint32_t>(IBV_ACCESS_ZERO_BASED | IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_MW_BIND))
    return -EINVAL;  // on-demand paging, ... are not offered
  // IBTA: remote write/atomic need local write.
  if ((s.access & (verbs::kAccessRemoteWrite | verbs::kAccessRemoteAtomic)) && !(s.access & verbs::kAccessLocalWrite))
    return -EINVAL;
  uint32_t key = 0;
  const int rc = dp_.reg_mr_iova(c.dev, static_cast<uint32_t>(s.pd), s.addr, s.iova, s.length,
                                 s.access & (verbs::kAccessAll | verbs::kAccessMwBind), &key);
  if (rc) return -rc;
  out.id = (uint64_t{c.dev} << 32) | key;
  out.lkey = out.rkey = key;
  return 0;
}

int EngineShimBackend::dereg_mr(const ClientInfo&, ObjId mr) {
  const int rc = dp_.dereg_mr(static_cast<uint32_t>(mr >> 32), static_cast<uint32_t>(mr));
  return -rc;
}

int EngineShimBackend::alloc_mw(const ClientInfo& c, ObjId pd, uint32_t type, MwResult& out) {
  if (c.dev >= dp_.port_count()) return -ENODEV;
  uint32_t key = 0;
  if (const int rc = dp_.alloc_mw(c.dev, static_cast<uint32_t>(pd), type, &key)) return -rc;
  out.id = (uint64_t{c.dev} << 32) | key;
  out.rkey = key;
  return 0;
}

int EngineShimBackend::dealloc_mw(const ClientInfo&, ObjId mw) {
  return -dp_.dealloc_mw(static_cast<uint32_t>(mw >> 32), static_cast<uint32_t>(mw));
}

// ---- CQ ----

int EngineShimBackend::create_cq(const ClientInfo& c, const CqSetup& s, CqResult& out) {
  const int core = core_of(c);
  if (core < 0) return core;
  auto cq = std::make_unique<Cq>();
  cq->core = static_cast<size_t>(core);
  cq->port = c.dev;
  cq->efd = s.eventfd;
  cq->async_fd = s.async_eventfd;
  if (!cq->ring.attach(s.ring, s.ring_entries)) return -EINVAL;
  Cq* p = cq.get();
  Core* k = cores_[cq->core].get();
  const uint32_t depth = s.ring_entries;
  const int rc = on_core(cq->core, [p, k, depth](engine::CoreLoop& l) {
    p->eng = l.engine(p->port);
    if (!p->eng) return -ENODEV;
    p->ecq = p->eng->create_cq(depth);
    if (!p->ecq) return -ENOMEM;
    k->cqs.push_back(p);
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) cq.release();  // the core may still run it later: never free
    return rc;
  }
  out.id = next_id_++;
  out.cqn = static_cast<uint32_t>(out.id);
  cqs_[out.id] = std::move(cq);
  return 0;
}

// On the owning core, between two polls: the unread completions (in the ring
// and those still waiting in the engine CQ) must fit the new ring. The
// engine CQ keeps its depth: it only holds what the ring has no room for.
int EngineShimBackend::resize_cq(const ClientInfo&, ObjId id, droce_shm_ring_hdr* ring, uint32_t entries) {
  auto it = cqs_.find(id);
  if (it == cqs_.end()) return -ENOENT;
  Cq* p = it->second.get();
  return on_core(p->core, [p, ring, entries](engine::CoreLoop&) {
    if (p->dead) return -EIO;
    return ring_move_unread(p->ring, ring, entries, p->ecq->pending());
  });
}

int EngineShimBackend::destroy_cq(const ClientInfo&, ObjId id) {
  auto it = cqs_.find(id);
  if (it == cqs_.end()) return -ENOENT;
  Cq* p = it->second.get();
  Core* k = cores_[p->core].get();
  const int rc = on_core(p->core, [p, k](engine::CoreLoop&) {
    std::erase(k->cqs, p);
    return -p->eng->destroy_cq(p->ecq);
  });
  if (rc == -ETIMEDOUT) {
    it->second.release();
  }
  if (rc == -EBUSY) return rc;
  cqs_.erase(it);
  return rc == -ETIMEDOUT ? rc : 0;
}

// ---- SRQ ----

int EngineShimBackend::create_srq(const ClientInfo& c, const SrqSetup& s, SrqResult& out) {
  const int core = core_of(c);
  if (core < 0) return core;
  if (s.attr.max_sge > verbs::kMaxSge) return -EINVAL;
  auto q = std::make_unique<Srq>();
  q->core = static_cast<size_t>(core);
  q->port = c.dev;
  q->attr = s.attr;
  q->max_sge = s.attr.max_sge;
  q->async_fd = s.async_eventfd;
  q->limit.store(s.attr.srq_limit, std::memory_order_relaxed);
  if (!q->ring.attach(s.ring, s.ring_entries)) return -EINVAL;
  Srq* p = q.get();
  Core* k = cores_[q->core].get();
  p->db_bit = take_db_bit(c, &p->dbc);
  p->ring.set_doorbell_bit(p->db_bit);
  const uint32_t pd = static_cast<uint32_t>(s.pd);
  const uint32_t depth = s.ring_entries;
  const int rc = on_core(q->core, [this, p, k, pd, depth](engine::CoreLoop& l) {
    p->eng = l.engine(p->port);
    if (!p->eng) return -ENODEV;
    p->esrq = p->eng->create_srq(verbs::Pd{pd}, depth);
    if (!p->esrq) return -ENOMEM;
    k->srqs.push_back(p);
    k->active_srqs.reserve(k->srqs.size());
    if (p->dbc) p->dbc->slots[p->db_bit].srq = p;
    activate(*k, *p);  // polled from the start (idle = 0)
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) q.release();
    else give_db_bit(p->dbc, p->db_bit);
    return rc;
  }
  out.id = next_id_++;
  out.srqn = static_cast<uint32_t>(out.id);
  srqs_[out.id] = std::move(q);
  return 0;
}

int EngineShimBackend::modify_srq(const ClientInfo&, ObjId id, const ibv_srq_attr& a, uint32_t mask) {
  auto it = srqs_.find(id);
  if (it == srqs_.end()) return -ENOENT;
  if (mask & IBV_SRQ_MAX_WR) return -EOPNOTSUPP;  // no resize
  if (mask & IBV_SRQ_LIMIT) {
    if (a.srq_limit > it->second->attr.max_wr) return -EINVAL;
    // Armed (0 disarms): the SRQ's core raises IBV_EVENT_SRQ_LIMIT_REACHED.
    it->second->limit.store(a.srq_limit, std::memory_order_release);
  }
  return 0;
}

int EngineShimBackend::query_srq(const ClientInfo&, ObjId id, ibv_srq_attr& out) {
  auto it = srqs_.find(id);
  if (it == srqs_.end()) return -ENOENT;
  out = it->second->attr;
  out.srq_limit = it->second->limit.load(std::memory_order_acquire);  // 0 once the event fired
  return 0;
}

int EngineShimBackend::destroy_srq(const ClientInfo&, ObjId id) {
  auto it = srqs_.find(id);
  if (it == srqs_.end()) return -ENOENT;
  Srq* p = it->second.get();
  Core* k = cores_[p->core].get();
  const int rc = on_core(p->core, [p, k](engine::CoreLoop&) {
    const int e = p->eng->destroy_srq(p->esrq);
    if (e == EBUSY) return -e;
    std::erase(k->srqs, p);
    std::erase(k->active_srqs, p);
    if (p->dbc) p->dbc->slots[p->db_bit].srq = nullptr;
    return -e;
  });
  if (rc == -EBUSY) return rc;
  if (rc == -ETIMEDOUT) it->second.release();
  else give_db_bit(p->dbc, p->db_bit);
  srqs_.erase(it);
  return rc == -ETIMEDOUT ? rc : 0;
}

// ---- QP ----

int EngineShimBackend::create_qp(const ClientInfo& c, const QpSetup& s, QpResult& out) {
  const int core = core_of(c);
  if (core < 0) return core;
  verbs::QpType type;
  switch (s.type) {
    case IBV_QPT_RC: type = verbs::QpType::RC; break;
    case IBV_QPT_UC: type = verbs::QpType::UC; break;
    case IBV_QPT_UD: type = verbs::QpType::UD; break;
    default: return -EOPNOTSUPP;
  }
  auto scq = cqs_.find(s.send_cq), rcq = cqs_.find(s.recv_cq);
  if (scq == cqs_.end() || rcq == cqs_.end()) return -EINVAL;
  Srq* srq = nullptr;
  if (s.srq != 0) {
    auto it = srqs_.find(s.srq);
    if (it == srqs_.end()) return -EINVAL;
    srq = it->second.get();
  }
  if (s.cap.max_send_sge > verbs::kMaxSge || s.cap.max_recv_sge > verbs::kMaxSge) return -EINVAL;
  auto q = std::make_unique<Qp>();
  q->core = static_cast<size_t>(core);
  q->port = c.dev;
  q->pd = static_cast<uint32_t>(s.pd);
  q->type = type;
  q->scq = scq->second.get();
  q->rcq = rcq->second.get();
  q->srq = srq;
  if (q->scq->core != q->core || q->rcq->core != q->core || (srq && srq->core != q->core)) return -EINVAL;
  q->async_fd = s.async_eventfd;
  q->max_send_sge = std::max<uint32_t>(s.cap.max_send_sge, 1);
  q->max_recv_sge = std::max<uint32_t>(s.cap.max_recv_sge, 1);
  if (!q->sq.attach(s.sq, s.sq_entries)) return -EINVAL;
  if (s.rq) {
    if (!q->rq.attach(s.rq, s.rq_entries)) return -EINVAL;
    q->has_rq = true;
  }
  verbs::QpInitAttr init;
  init.qp_type = type;
  init.pd = q->pd;
  init.send_cq = q->scq->ecq;
  init.recv_cq = q->rcq->ecq;
  init.srq = srq ? srq->esrq : nullptr;
  init.sq_sig_all = s.sq_sig_all;
  init.cap.max_send_wr = s.sq_entries;
  init.cap.max_recv_wr = s.rq ? s.rq_entries : 0;
  init.cap.max_send_sge = q->max_send_sge;
  init.cap.max_recv_sge = q->max_recv_sge;
  init.cap.max_inline_data = std::min<uint32_t>(s.cap.max_inline_data, DROCE_SHM_MAX_INLINE);
  Qp* p = q.get();
  Core* k = cores_[q->core].get();
  p->db_bit = take_db_bit(c, &p->dbc);
  p->sq.set_doorbell_bit(p->db_bit);
  if (p->has_rq) p->rq.set_doorbell_bit(p->db_bit);
  const int rc = on_core(q->core, [this, p, k, init](engine::CoreLoop& l) {
    if (l.engine(p->port) != p->scq->eng) return -EINVAL;
    p->eng = p->scq->eng;
    if (int e = p->eng->create_qp(init, &p->qpn)) return -e;
    p->eqp = p->eng->qp(p->qpn);
    k->qps.push_back(p);
    k->active_qps.reserve(k->qps.size());
    if (k->by_qpn.size() <= p->port) k->by_qpn.resize(p->port + 1);
    auto& v = k->by_qpn[p->port];
    if (v.size() <= p->qpn) v.resize(p->qpn + 1, nullptr);
    v[p->qpn] = p;
    if (p->dbc) p->dbc->slots[p->db_bit].qp = p;
    activate(*k, *p);  // polled from the start (idle = 0)
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) q.release();
    else give_db_bit(p->dbc, p->db_bit);
    return rc;
  }
  out.id = next_id_++;
  out.qpn = p->qpn;
  qps_[out.id] = std::move(q);
  return 0;
}

int ah_from_verbs(const ibv_ah_attr& a, size_t gid_count, uint8_t port_tclass, verbs::Ah& out) {
  if (!a.is_global) return -EINVAL;  // RoCE: every address is a GID
  if (a.port_num != 1) return -EINVAL;
  if (a.grh.sgid_index >= gid_count) return -EINVAL;
  std::memcpy(out.dgid.data(), a.grh.dgid.raw, 16);
  out.traffic_class = a.grh.traffic_class ? a.grh.traffic_class : port_tclass;
  // As Linux for every RoCE device, rxe included (ib_resolve_unicast_gid_dmac on
  // modify_qp and create_ah): a unicast destination is sent with its route's hop
  // limit (kRoceRouteHopLimit), whatever the application asked (ibv_rc_pingpong
  // asks for 1); only multicast keeps the caller's.
  const bool multicast = a.grh.dgid.raw[0] == 0xff ||
                         (wire::gid_is_ipv4_mapped(out.dgid) && (a.grh.dgid.raw[12] & 0xf0) == 0xe0);
  out.hop_limit = multicast && a.grh.hop_limit ? a.grh.hop_limit : kRoceRouteHopLimit;
  out.flow_label = a.grh.flow_label & 0xfffff;
  return 0;
}

int EngineShimBackend::to_ah(uint32_t port, const ibv_ah_attr& a, verbs::Ah& out) {
  if (int rc = ah_from_verbs(a, dp_.gids(port).size(), dp_.tclass(port), out)) return rc;
  // Never waits for the answer: the ShimServer parks the client's request on
  // -EINPROGRESS and serves the other clients until it calls again.
  switch (dp_.resolve_step(port, out.dgid, out.dmac)) {
    case engine::Dataplane::ResolveStep::Ready: return 0;
    case engine::Dataplane::ResolveStep::Pending: return -EINPROGRESS;
    case engine::Dataplane::ResolveStep::Failed: break;
  }
  return -EHOSTUNREACH;
}

int EngineShimBackend::modify_qp(const ClientInfo&, ObjId id, const ibv_qp_attr& a, uint32_t mask) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  Qp* p = it->second.get();
  constexpr uint32_t kSupported = verbs::kQpState | verbs::kQpCurState | verbs::kQpAccessFlags | verbs::kQpPkeyIndex |
                                  verbs::kQpPort | verbs::kQpQkey | verbs::kQpAv | verbs::kQpPathMtu |
                                  verbs::kQpTimeout | verbs::kQpRetryCnt | verbs::kQpRnrRetry | verbs::kQpRqPsn |
                                  verbs::kQpMaxQpRdAtomic | verbs::kQpMinRnrTimer | verbs::kQpSqPsn |
                                  verbs::kQpMaxDestRdAtomic | verbs::kQpDestQpn;
  if (mask & ~kSupported) return -EOPNOTSUPP;
  verbs::QpAttr v;
  v.qp_state = static_cast<verbs::QpState>(a.qp_state);
  v.cur_qp_state = static_cast<verbs::QpState>(a.cur_qp_state);
  if ((mask & verbs::kQpState) && a.qp_state > IBV_QPS_ERR) return -EINVAL;
  // A path MTU the port's link cannot carry (above ibv_query_port's max_mtu): refused,
  // never a QP whose packets never arrive.
  if ((mask & verbs::kQpPathMtu) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > port_max_mtu(p->port))) return -EINVAL;
  v.path_mtu = static_cast<verbs::Mtu>(a.path_mtu);
  v.qkey = a.qkey;
  v.rq_psn = a.rq_psn & 0xffffff;
  v.sq_psn = a.sq_psn & 0xffffff;
  v.dest_qp_num = a.dest_qp_num & 0xffffff;
  v.qp_access_flags = static_cast<uint32_t>(a.qp_access_flags) & verbs::kAccessAll;
  v.pkey_index = a.pkey_index;
  v.max_rd_atomic = std::min<uint8_t>(a.max_rd_atomic, verbs::kMaxRdAtomic);
  v.max_dest_rd_atomic = std::min<uint8_t>(a.max_dest_rd_atomic, verbs::kMaxRdAtomic);
  v.min_rnr_timer = a.min_rnr_timer;
  v.port_num = a.port_num;
  v.timeout = a.timeout;
  v.retry_cnt = a.retry_cnt;
  v.rnr_retry = a.rnr_retry;
  if ((mask & verbs::kQpPort) && a.port_num != 1) return -EINVAL;
  if (mask & verbs::kQpAv) {
    if (int rc = to_ah(p->port, a.ah_attr, v.ah_attr)) return rc;
  }
  const uint32_t mtu_bytes = cfg_.roce.path_mtu;
  return on_core(p->core, [p, v, mask, mtu_bytes](engine::CoreLoop&) {
    const int rc = p->eng->modify_qp(p->qpn, v, mask);
    if (rc == 0 && (mask & verbs::kQpState) && v.qp_state == verbs::QpState::Err) p->app_err = true;
    // UD has no path MTU attribute: the port's.
    if (rc == 0 && p->type == verbs::QpType::UD && (mask & verbs::kQpState) && v.qp_state == verbs::QpState::Rtr)
      p->eqp->mtu = mtu_bytes;
    return -rc;
  });
}

int EngineShimBackend::query_qp(const ClientInfo&, ObjId id, uint32_t, ibv_qp_attr& out) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  Qp* p = it->second.get();
  auto v = std::make_shared<verbs::QpAttr>();
  if (int rc = on_core(p->core, [p, v](engine::CoreLoop&) { return -p->eng->query_qp(p->qpn, v.get()); })) return rc;
  out = ibv_qp_attr{};
  out.qp_state = static_cast<ibv_qp_state>(v->qp_state);
  out.cur_qp_state = static_cast<ibv_qp_state>(v->qp_state);
  out.path_mtu = static_cast<ibv_mtu>(v->path_mtu);
  out.qkey = v->qkey;
  out.rq_psn = v->rq_psn;
  out.sq_psn = v->sq_psn;
  out.dest_qp_num = v->dest_qp_num;
  out.qp_access_flags = static_cast<int>(v->qp_access_flags);
  out.cap.max_send_wr = v->cap.max_send_wr;
  out.cap.max_recv_wr = v->cap.max_recv_wr;
  out.cap.max_send_sge = v->cap.max_send_sge;
  out.cap.max_recv_sge = v->cap.max_recv_sge;
  out.cap.max_inline_data = v->cap.max_inline_data;
  out.ah_attr.is_global = 1;
  out.ah_attr.port_num = 1;
  std::memcpy(out.ah_attr.grh.dgid.raw, v->ah_attr.dgid.data(), 16);
  out.ah_attr.grh.traffic_class = v->ah_attr.traffic_class;
  out.ah_attr.grh.hop_limit = v->ah_attr.hop_limit;
  out.ah_attr.grh.flow_label = v->ah_attr.flow_label;
  out.pkey_index = v->pkey_index;
  out.max_rd_atomic = v->max_rd_atomic;
  out.max_dest_rd_atomic = v->max_dest_rd_atomic;
  out.min_rnr_timer = v->min_rnr_timer;
  out.port_num = 1;
  out.timeout = v->timeout;
  out.retry_cnt = v->retry_cnt;
  out.rnr_retry = v->rnr_retry;
  return 0;
}

int EngineShimBackend::destroy_qp(const ClientInfo&, ObjId id) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  Qp* p = it->second.get();
  Core* k = cores_[p->core].get();
  const int rc = on_core(p->core, [p, k](engine::CoreLoop&) {
    std::erase(k->qps, p);
    std::erase(k->active_qps, p);
    if (p->port < k->by_qpn.size() && p->qpn < k->by_qpn[p->port].size()) k->by_qpn[p->port][p->qpn] = nullptr;
    if (p->dbc) p->dbc->slots[p->db_bit].qp = nullptr;
    return -p->eng->destroy_qp(p->qpn);
  });
  if (rc == -ETIMEDOUT) it->second.release();
  else give_db_bit(p->dbc, p->db_bit);
  const bool groups = p->mcast_groups != 0;
  const uint32_t port = p->port;
  qps_.erase(it);
  if (groups) dp_.mcast_sync(port);  // the engine left the QP's groups: the device filter follows
  return rc == -ETIMEDOUT ? rc : 0;
}

// ---- multicast ----

// The UD QP behind `id` and the group as a wire GID: 0, or a negative errno.
int EngineShimBackend::mcast_member(ObjId id, const ibv_gid& gid, Qp** qp, wire::Gid* g) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  *qp = it->second.get();
  if ((*qp)->type != verbs::QpType::UD) return -EINVAL;
  std::memcpy(g->data(), gid.raw, 16);
  return 0;
}

int EngineShimBackend::attach_mcast(const ClientInfo&, ObjId id, const ibv_gid& gid) {
  Qp* p = nullptr;
  wire::Gid g;
  if (const int rc = mcast_member(id, gid, &p, &g)) return rc;
  if (!wire::gid_is_multicast(g)) return -EINVAL;
  const int rc = dp_.attach_mcast(p->port, p->qpn, g);
  if (rc == 0) ++p->mcast_groups;  // attaching twice is one membership: counted per call, bounded below
  return -rc;
}

int EngineShimBackend::detach_mcast(const ClientInfo&, ObjId id, const ibv_gid& gid) {
  Qp* p = nullptr;
  wire::Gid g;
  if (const int rc = mcast_member(id, gid, &p, &g)) return rc;
  const int rc = dp_.detach_mcast(p->port, p->qpn, g);
  if (rc == 0 && p->mcast_groups) --p->mcast_groups;
  return -rc;
}

// ---- AH ----

int EngineShimBackend::create_ah(const ClientInfo& c, ObjId pd, const ibv_ah_attr& a, AhResult& out) {
  if (c.dev >= dp_.port_count()) return -ENODEV;
  if (free_ahs_.empty()) return -ENOMEM;
  verbs::Ah ah;
  if (int rc = to_ah(c.dev, a, ah)) return rc;
  const uint32_t n = free_ahs_.back();
  free_ahs_.pop_back();
  AhSlot& s = ahs_[n];
  s.ah = ah;
  s.pd = static_cast<uint32_t>(pd);
  s.port = c.dev;
  // RELEASE: a core that sees live reads the fields written above.
  s.live.store(1, std::memory_order_release);
  out.id = n;
  out.ah_num = n;
  return 0;
}

int EngineShimBackend::destroy_ah(const ClientInfo&, ObjId id) {
  if (id == 0 || id >= kMaxAhs || ahs_[id].live.load() == 0) return -ENOENT;
  ahs_[id].live.store(0, std::memory_order_release);
  // Every core passes one loop iteration: none still reads the slot (the
  // engine copies the AH into its WQE at post time).
  for (size_t i = 0; i < cores_.size(); ++i) on_core(i, [](engine::CoreLoop&) { return 0; });
  free_ahs_.push_back(static_cast<uint32_t>(id));
  return 0;
}

// ---- doorbells (control thread) ----

int EngineShimBackend::open_doorbell(const ClientInfo& c, droce_shm_doorbell* db) {
  if (db == nullptr) return -EINVAL;
  if (dbs_.count(c.id)) return -EALREADY;
  const int core = core_of(c);
  if (core < 0) return core;
  auto d = std::make_unique<DbClient>();
  d->db = db;
  d->core = static_cast<size_t>(core);
  d->slots.resize(DROCE_SHM_DB_BITS);
  d->free_bits.reserve(DROCE_SHM_DB_BITS);
  for (uint32_t b = DROCE_SHM_DB_BITS; b-- > 0;) d->free_bits.push_back(b);  // bit 0 first
  DbClient* p = d.get();
  Core* k = cores_[d->core].get();
  const int rc = on_core(d->core, [p, k](engine::CoreLoop&) {
    k->dbs.push_back(p);
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) d.release();  // the core may still run it
    return rc;
  }
  dbs_[c.id] = std::move(d);
  return 0;
}

// A free bit of the client's doorbell (and the DbClient), or DROCE_SHM_DB_NONE
// without a doorbell or with every bit taken: the object is always polled.
uint32_t EngineShimBackend::take_db_bit(const ClientInfo& c, DbClient** dbc) {
  *dbc = nullptr;
  auto it = dbs_.find(c.id);
  if (it == dbs_.end() || it->second->free_bits.empty()) return DROCE_SHM_DB_NONE;
  *dbc = it->second.get();
  const uint32_t b = (*dbc)->free_bits.back();
  (*dbc)->free_bits.pop_back();
  return b;
}

void EngineShimBackend::give_db_bit(DbClient* dbc, uint32_t bit) {
  if (dbc != nullptr && bit < DROCE_SHM_DB_BITS) dbc->free_bits.push_back(bit);
}

void EngineShimBackend::client_gone(const ClientInfo& c) {
  client_core_.erase(c.id);
  auto it = dbs_.find(c.id);
  if (it == dbs_.end()) return;
  DbClient* p = it->second.get();
  Core* k = cores_[p->core].get();
  // The core stops reading the region before the server unmaps it.
  if (on_core(p->core, [p, k](engine::CoreLoop&) {
        std::erase(k->dbs, p);
        return 0;
      }) == -ETIMEDOUT)
    it->second.release();
  dbs_.erase(it);
}

bool EngineShimBackend::take_qp_event(const ClientInfo&, ObjId id, uint32_t& type) {
  auto it = qps_.find(id);
  return it != qps_.end() && take_event(it->second->events, type);
}

bool EngineShimBackend::take_cq_event(const ClientInfo&, ObjId id, uint32_t& type) {
  auto it = cqs_.find(id);
  return it != cqs_.end() && take_event(it->second->events, type);
}

bool EngineShimBackend::take_srq_event(const ClientInfo&, ObjId id, uint32_t& type) {
  auto it = srqs_.find(id);
  return it != srqs_.end() && take_event(it->second->events, type);
}

}  // namespace droce::shim

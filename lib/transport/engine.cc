// The engine's object layer: QPs (create, modify, destroy, query, the
// error transitions and flushes), CQs, SRQs, AHs, multicast groups, the
// counters' names and post_send/post_recv. The data path is in poll.cc (the
// loop), rx.cc, tx.cc, timers.cc and sge.cc; the roles in requester.cc,
// responder.cc and completer.cc.
#include "transport/engine.h"

#include <cerrno>
#include <new>

namespace droce::transport {

using verbs::QpState;
using verbs::WcStatus;

namespace {
constexpr const char* kCtrNames[] = {
    "rx_frames",         "rx_parse_err",       "rx_icrc_err",       "rx_no_qp",
    "rx_bad_state",      "rx_bad_transport",   "rx_bad_pkey",       "tx_frames",         "tx_no_buf",
    "req_packets",       "req_retransmits",    "req_gather_err",    "ack_timeouts",      "retry_exceeded",
    "rnr_retry_exceeded", "acks_sent",         "acks_received",     "seq_nak_sent",
    "seq_nak_received",  "rnr_nak_sent",       "rnr_nak_received",  "err_nak_sent",
    "err_nak_received",  "read_resp_sent",     "read_resp_received", "atomic_executed",
    "atomic_replayed",   "read_replayed",      "dup_request",       "out_of_seq_request",
    "ghost_response",    "uc_msg_dropped",     "ud_qkey_drop",      "ud_no_recv_drop",
    "ud_len_drop",       "ce_received",        "cnp_sent",          "cnp_suppressed",
    "cnp_received",      "cq_overrun",        "tx_zero_copy",      "tx_copied",         "ack_lost_on_destroy",
    "window_cuts",       "rx_bad_rkey",        "rx_bad_va",         "rx_bad_length",
    "resp_mr_gone",      "rx_bad_src_addr",    "rx_mcast",          "rx_mcast_no_group", "mcast_delivered",
    "sr_ooo_placed",     "sr_dup",             "sr_sack_sent",      "sr_gbn_nak_sent",   "sr_sack_received",
    "sr_resent",         "sr_fallbacks",       "sr_learned",        "tail_retransmits",
};
static_assert(std::size(kCtrNames) == static_cast<size_t>(Ctr::kCount));
}  // namespace

const char* ctr_name(Ctr c) noexcept {
  const auto i = static_cast<size_t>(c);
  return i < std::size(kCtrNames) ? kCtrNames[i] : "unknown";
}

verbs::WcOpcode wc_opcode_of(verbs::WrOpcode op) noexcept {
  using verbs::WcOpcode;
  using verbs::WrOpcode;
  switch (op) {
    case WrOpcode::RdmaWrite:
    case WrOpcode::RdmaWriteImm: return WcOpcode::RdmaWrite;
    case WrOpcode::RdmaRead: return WcOpcode::RdmaRead;
    case WrOpcode::AtomicCmpSwp: return WcOpcode::CompSwap;
    case WrOpcode::AtomicFetchAdd: return WcOpcode::FetchAdd;
    case WrOpcode::LocalInv: return WcOpcode::LocalInv;
    case WrOpcode::BindMw: return WcOpcode::BindMw;
    default: return WcOpcode::Send;
  }
}

Engine::Engine(const EngineConfig& cfg, io::PacketIo& io, const io::Clock& clock)
    : cfg_(cfg), io_(io), clock_(clock) {
  if (cfg_.max_qps < 4) cfg_.max_qps = 4;
  if (cfg_.max_inflight_pkts == 0) cfg_.max_inflight_pkts = 1;
  if (cfg_.timer_scan_batch == 0) cfg_.timer_scan_batch = 1;
  if (cfg_.max_inflight_pkts > (1u << 22)) cfg_.max_inflight_pkts = 1u << 22;
  if (cfg_.min_inflight_pkts == 0) cfg_.min_inflight_pkts = 1;
  if (cfg_.min_inflight_pkts > cfg_.max_inflight_pkts) cfg_.min_inflight_pkts = cfg_.max_inflight_pkts;
  if (cfg_.initial_inflight_pkts == 0 || cfg_.initial_inflight_pkts > cfg_.max_inflight_pkts ||
      cfg_.min_inflight_pkts >= cfg_.max_inflight_pkts)
    cfg_.initial_inflight_pkts = cfg_.max_inflight_pkts;
  if (cfg_.mr_mem == nullptr) {
    const size_t bytes = verbs::MrTable::bytes_for(cfg_.max_mrs) + 64;
    mr_mem_owned_.reset(new uint8_t[bytes]);
    auto p = reinterpret_cast<uintptr_t>(mr_mem_owned_.get());
    p = (p + 63) & ~uintptr_t{63};
    mrs_ = std::make_unique<verbs::MrTable>(reinterpret_cast<void*>(p), verbs::MrTable::bytes_for(cfg_.max_mrs),
                                            cfg_.key_seed);
  } else {
    mrs_ = std::make_unique<verbs::MrTable>(cfg_.mr_mem, cfg_.mr_mem_bytes, cfg_.key_seed);
  }
  // Replicas of a port's tables (one engine per core) hand out the same window
  // keys for the same calls only with a shared seed, as for MRs.
  mws_ = std::make_unique<verbs::MwTable>(*mrs_, cfg_.max_mws, cfg_.key_seed);
  qpn_rng_ = cfg_.qpn_seed ? cfg_.qpn_seed : verbs::random_seed();
  qps_.resize(cfg_.max_qps);
  if (cfg_.max_mcast_qps_per_group == 0) cfg_.max_mcast_qps_per_group = 1;
  mcast_.resize(cfg_.max_mcast_groups);
  mcast_qpns_.resize(size_t{cfg_.max_mcast_groups} * cfg_.max_mcast_qps_per_group);
  const uint32_t qcap = verbs::round_pow2(cfg_.max_qps);
  q_mask_ = qcap - 1;
  req_q_.reset(new Qp*[qcap]);
  resp_q_.reset(new Qp*[qcap]);
  now_ = clock_.now_ns();
  last_timer_sweep_ = now_;
  wheel_.reset(new Qp*[kWheelSlots]());
  tick_shift_ = 6;  // ticks of 64 ns at least
  while (tick_shift_ < 40 && (uint64_t{2} << tick_shift_) <= cfg_.timer_scan_ns) ++tick_shift_;
  wheel_tick_ = (now_ >> tick_shift_) + 1;
  zero_copy_ = cfg_.zero_copy_min != 0 && io_.zero_copy_tx();
}

Engine::~Engine() {
  if (spare_len_) io_.free_burst(spare_, spare_len_);
  if (tx_len_) io_.free_burst(tx_, tx_len_);
  if (cur_) io_.free_burst(&cur_, 1);
}

verbs::Cq* Engine::create_cq(uint32_t cqe) {
  if (cqe == 0 || cqe > (1u << 22)) return nullptr;
  cqs_.push_back(std::make_unique<verbs::Cq>(cqe));
  return cqs_.back().get();
}

verbs::Srq* Engine::create_srq(verbs::Pd pd, uint32_t max_wr) {
  if (pd.handle == 0 || max_wr == 0 || max_wr > (1u << 20)) return nullptr;
  srqs_.push_back(std::make_unique<verbs::Srq>(pd.handle, max_wr));
  return srqs_.back().get();
}

const verbs::Ah* Engine::create_ah(verbs::Pd pd, const verbs::Ah& attr) {
  if (pd.handle == 0 || pd.handle > pd_seq_) return nullptr;
  if (attr.traffic_class & wire::kEcnMask) return nullptr;  // ECN bits belong to the engine
  ahs_.push_back(std::make_unique<verbs::Ah>(attr));
  return ahs_.back().get();
}

int Engine::destroy_cq(verbs::Cq* cq) {
  for (const Qp* q : live_qps_)
    if (q->send_cq == cq || q->recv_cq == cq) return EBUSY;
  for (auto& c : cqs_)
    if (c.get() == cq) {
      c = std::move(cqs_.back());
      cqs_.pop_back();
      return 0;
    }
  return EINVAL;
}

int Engine::destroy_srq(verbs::Srq* srq) {
  for (const Qp* q : live_qps_)
    if (q->srq == srq) return EBUSY;
  for (auto& s : srqs_)
    if (s.get() == srq) {
      s = std::move(srqs_.back());
      srqs_.pop_back();
      return 0;
    }
  return EINVAL;
}

namespace {
int check_init(const verbs::QpInitAttr& init, const uint32_t* qpn) noexcept {
  if (!qpn || init.pd == 0 || !init.send_cq || !init.recv_cq) return EINVAL;
  if (init.qp_type != verbs::QpType::RC && init.qp_type != verbs::QpType::UC && init.qp_type != verbs::QpType::UD)
    return EINVAL;
  const verbs::QpCap& c = init.cap;
  if (c.max_send_wr == 0 || c.max_send_wr > (1u << 16) || c.max_recv_wr > (1u << 16) ||
      c.max_send_sge > verbs::kMaxSge || c.max_recv_sge > verbs::kMaxSge || c.max_inline_data > verbs::kMaxInline)
    return EINVAL;
  if (init.srq && init.srq->pd() != init.pd) return EINVAL;
  return 0;
}
}  // namespace

Qp& Engine::install_qp(uint32_t n, const verbs::QpInitAttr& init) {
  qps_[n] = std::make_unique<Qp>(n, init);
  qps_[n]->mtu = verbs::mtu_bytes(cfg_.port_mtu);
  wire::Headers h;  // the source addresses, until RTR builds the path (UD QPs keep them)
  h.l2.src = io_.mac();
  h.l3.src = cfg_.gid;
  wire::make_template(qps_[n]->tx, h);
  live_qps_.push_back(qps_[n].get());
  return *qps_[n];
}

int Engine::create_gsi_qp(const verbs::QpInitAttr& init, uint32_t* qpn) {
  if (int rc = check_init(init, qpn)) return rc;
  if (init.qp_type != verbs::QpType::UD) return EINVAL;
  if (qps_[kGsiQpn]) return EEXIST;
  install_qp(kGsiQpn, init).attr.qkey = kGsiQkey;
  *qpn = kGsiQpn;
  return 0;
}

int Engine::create_qp(const verbs::QpInitAttr& init, uint32_t* qpn) {
  if (int rc = check_init(init, qpn)) return rc;
  const uint32_t stride = cfg_.qpn_stride ? cfg_.qpn_stride : 1;
  uint32_t first = cfg_.qpn_offset % stride;
  while (first < 2) first += stride;  // QP0/QP1 are reserved
  if (first >= qps_.size()) return ENOMEM;
  // QPNs first, first+stride, ... : the search starts at a random one of them and
  // wraps, so QPNs do not come in a predictable sequence (a peer that knows one
  // connection's QPN cannot aim at the next).
  const uint32_t slots = static_cast<uint32_t>((qps_.size() - first + stride - 1) / stride);
  qpn_rng_ ^= qpn_rng_ << 13;
  qpn_rng_ ^= qpn_rng_ >> 7;
  qpn_rng_ ^= qpn_rng_ << 17;
  const uint32_t start = static_cast<uint32_t>(qpn_rng_ % slots);
  for (uint32_t k = 0; k < slots; ++k) {
    const uint32_t n = first + ((start + k) % slots) * stride;
    if (!qps_[n]) {
      install_qp(n, init);
      *qpn = n;
      return 0;
    }
  }
  return ENOMEM;
}

int Engine::destroy_qp(uint32_t qpn) {
  Qp* q = qp(qpn);
  if (!q) return EINVAL;
  // The consumer may destroy the QP as soon as it has polled the completion of
  // a received message whose ACK is still queued (the TX queue was full): send
  // it first, or the peer retries into a QPN that no longer exists and fails
  // with RETRY_EXC although the message was delivered (ibv_srq_pingpong's
  // teardown does exactly this). Bounded: a TX queue that stays full loses it.
  for (int i = 0; i < 1000 && q->resp.ack_pending; ++i) {
    tx_blocked_ = false;
    responder_tx(*this, *q, cfg_.pkts_per_turn);
    flush_tx();
  }
  if (q->resp.ack_pending) count(Ctr::AckLostOnDestroy);
  // Drop it from the ready lists.
  auto purge = [&](std::unique_ptr<Qp*[]>& ring, uint32_t& head, uint32_t& tail) {
    uint32_t w = tail;
    for (uint32_t r = tail; r != head; ++r)
      if (ring[r & q_mask_] != q) ring[w++ & q_mask_] = ring[r & q_mask_];
    head = w;
  };
  purge(req_q_, req_head_, req_tail_);
  purge(resp_q_, resp_head_, resp_tail_);
  timer_unlink(*q);
  for (size_t i = 0; i < live_qps_.size(); ++i)
    if (live_qps_[i] == q) {
      live_qps_[i] = live_qps_.back();
      live_qps_.pop_back();
      break;
    }
  for (size_t g = 0; g < mcast_.size(); ++g)
    if (mcast_[g].n) detach_mcast(qpn, mcast_[g].mgid);
  qps_[qpn].reset();
  return 0;
}

const wire::Gid& Engine::source_gid(const wire::Gid& dst) const noexcept {
  if (wire::gid_is_ipv4_mapped(dst)) return cfg_.gid;
  static constexpr wire::Gid kZero{};
  const bool link_local = dst[0] == 0xFE && (dst[1] & 0xC0) == 0x80;
  if (!link_local && cfg_.gid6_global != kZero) return cfg_.gid6_global;
  if (cfg_.gid6_link_local != kZero) return cfg_.gid6_link_local;
  return cfg_.gid6_global != kZero ? cfg_.gid6_global : cfg_.gid;
}

void Engine::build_template(Qp& q) noexcept {
  wire::Headers h;
  const verbs::Ah& ah = q.attr.ah_attr;
  h.l2.src = io_.mac();
  h.l2.dst = ah.dmac;
  h.l2.vlan = ah.vlan;
  h.l2.vlan_tci = ah.vlan_tci;
  h.l3.ipv6 = !wire::gid_is_ipv4_mapped(ah.dgid);
  h.l3.src = source_gid(ah.dgid);
  h.l3.dst = ah.dgid;
  h.l3.tos = static_cast<uint8_t>((ah.traffic_class & ~wire::kEcnMask) | (cfg_.ecn ? wire::kEcnEct0 : 0));
  h.l3.ttl = ah.hop_limit;
  h.l3.flow_label = ah.flow_label;
  // Source port: entropy from the QP pair, in the range rxe uses (0xC000 + 14 bits).
  h.l4.sport = static_cast<uint16_t>(0xC000 | ((q.qpn * 0x9E37u ^ q.attr.dest_qp_num) & 0x3FFF));
  h.bth.dqpn = q.attr.dest_qp_num;
  h.bth.pkey = wire::kDefaultPkey;
  wire::make_template(q.tx, h);
}

bool Engine::reserve_resp_resources(Qp& q, const verbs::QpAttr& attr, uint32_t mask) noexcept {
  if (q.type != verbs::QpType::RC) return true;
  const QpState target = (mask & verbs::kQpState) ? attr.qp_state : q.state;
  if (target == QpState::Reset || target == QpState::Init || target == QpState::Err) return true;
  // As apply_attrs will set it: a requested 0 becomes 1.
  uint32_t n = q.attr.max_dest_rd_atomic;
  if (mask & verbs::kQpMaxDestRdAtomic) n = attr.max_dest_rd_atomic ? attr.max_dest_rd_atomic : 1;
  if (n <= q.resp.res_cap) return true;
  std::unique_ptr<RespResource[]> grown(new (std::nothrow) RespResource[n]);
  if (!grown) return false;
  if (!q.resp.emit_q) {
    q.resp.emit_q.reset(new (std::nothrow) uint8_t[verbs::kMaxRdAtomic]);
    if (!q.resp.emit_q) return false;
  }
  for (uint32_t i = 0; i < q.resp.res_cap; ++i) grown[i] = q.resp.res[i];
  q.resp.res = std::move(grown);
  q.resp.res_cap = n;
  return true;
}

void Engine::clear_resp(RespState& r) noexcept {
  std::unique_ptr<RespResource[]> res = std::move(r.res);
  std::unique_ptr<uint8_t[]> emit_q = std::move(r.emit_q);
  const uint32_t cap = r.res_cap;
  r = RespState{};
  for (uint32_t i = 0; i < cap; ++i) res[i] = RespResource{};
  r.res = std::move(res);
  r.emit_q = std::move(emit_q);
  r.res_cap = cap;
}

void Engine::reset_transport(Qp& q) noexcept {
  q.req = ReqState{};
  q.comp = CompState{};
  q.resp = RespState{};
  q.sr.reset();
  q.sq.head = q.sq.tail = 0;
  q.rq.head = q.rq.tail = 0;
}

int Engine::modify_qp(uint32_t qpn, const verbs::QpAttr& attr, uint32_t mask) noexcept {
  Qp* q = qp(qpn);
  if (!q) return EINVAL;
  if (int rc = q->check_modify(attr, mask)) return rc;
  if (qpn == kGsiQpn && (mask & verbs::kQpQkey) && attr.qkey != kGsiQkey) return EINVAL;  // QP1's Q_Key is fixed
  if ((mask & verbs::kQpPathMtu) && static_cast<uint8_t>(attr.path_mtu) > static_cast<uint8_t>(cfg_.max_mtu))
    return EINVAL;  // larger than the link carries
  if (!reserve_resp_resources(*q, attr, mask)) return ENOMEM;  // before any attribute changes
  const QpState old = q->state;
  q->apply_attrs(attr, mask);
  const QpState next = q->state;
  if (next == QpState::Reset) {
    reset_transport(*q);
    return 0;
  }
  if (next == QpState::Err) {
    if (old != QpState::Err) qp_to_error(*q);
    return 0;
  }
  if (next == QpState::Rtr && old == QpState::Init) {
    clear_resp(q->resp);
    q->resp.psn = q->attr.rq_psn;
    if (q->type != verbs::QpType::UD) build_template(*q);
    // Selective repeat (README): its state, and marks toward a peer listed as running it.
    q->req.sr_tx = false;
    if (q->sr) *q->sr = Qp::Sr{};
    if (cfg_.selective_repeat && q->type == verbs::QpType::RC) {
      if (!q->sr) q->sr.reset(new (std::nothrow) Qp::Sr{});
      if (q->sr)
        for (const wire::Gid& g : cfg_.sr_peers)
          if (g == q->attr.ah_attr.dgid) q->req.sr_tx = true;
    }
  }
  if (mask & verbs::kQpAv) build_template(*q);
  if (next == QpState::Rts && old == QpState::Rtr) {
    const bool sr_tx = q->req.sr_tx;
    q->req = ReqState{};
    q->req.sr_tx = sr_tx;
    if (q->sr) q->sr->req = SrState{};
    q->req.idx = q->sq.tail;
    q->req.psn = q->req.next_new_psn = q->attr.sq_psn;
    q->comp = CompState{};
    q->comp.psn = q->attr.sq_psn;
    q->comp.retry_left = q->attr.retry_cnt;
    q->comp.rnr_left = q->attr.rnr_retry;
    q->req.cwnd = cfg_.initial_inflight_pkts;
    q->comp.ssthresh = cfg_.max_inflight_pkts;
    q->rp.reset(cfg_.dcqcn_params);
  }
  if (next == QpState::Rts && old == QpState::Sqe) q->req.idx = q->sq.tail;
  if (next == QpState::Rts && !q->sq.empty()) req_ready(*q);
  return 0;
}

int Engine::query_qp(uint32_t qpn, verbs::QpAttr* attr) const noexcept {
  if (qpn >= qps_.size() || !qps_[qpn] || !attr) return EINVAL;
  *attr = qps_[qpn]->attr;
  attr->qp_state = attr->cur_qp_state = qps_[qpn]->state;
  attr->sq_draining = qps_[qpn]->state == QpState::Sqd && qps_[qpn]->req.idx != qps_[qpn]->sq.tail;
  return 0;
}

int Engine::post_send(uint32_t qpn, const verbs::SendWr& wr) noexcept {
  Qp* q = qp(qpn);
  return q ? post_send(*q, wr) : EINVAL;
}

int Engine::post_send(Qp& q, const verbs::SendWr& wr) noexcept {
  if (int rc = q.post_send(wr)) return rc;
  if (q.state == QpState::Err || q.state == QpState::Sqe) {
    flush_queues(q, q.state == QpState::Sqe);
  } else if (q.state == QpState::Rts) {
    if (!send_inline(q)) req_ready(q);
  }
  return 0;
}

int Engine::post_recv(uint32_t qpn, const verbs::RecvWr& wr) noexcept {
  Qp* q = qp(qpn);
  return q ? post_recv(*q, wr) : EINVAL;
}

int Engine::post_recv(Qp& q, const verbs::RecvWr& wr) noexcept {
  if (int rc = q.post_recv(wr)) return rc;
  if (q.state == QpState::Err) flush_queues(q);
  return 0;
}

void Engine::complete(verbs::Cq* cq, const verbs::Wc& wc) noexcept {
  if (!cq->push(wc)) count(Ctr::CqOverrun);
}

void Engine::flush_queues(Qp& q, bool send_only) noexcept {
  // Every WQE not yet retired completes with WR_FLUSH_ERR (always reported).
  while (!q.sq.empty()) {
    verbs::SendWqe& w = q.sq.at(q.sq.tail);
    verbs::Wc wc;
    wc.wr_id = w.wr.wr_id;
    wc.status = (w.state == verbs::WqeState::Done && w.status != WcStatus::Success) ? w.status : WcStatus::WrFlushErr;
    wc.opcode = wc_opcode_of(w.wr.opcode);
    wc.qp_num = q.qpn;
    complete(q.send_cq, wc);
    ++q.sq.tail;
  }
  q.req.idx = q.sq.tail;
  q.req.rd_atomic_out = 0;
  if (send_only) return;
  if (q.resp.have_recv) {
    verbs::Wc wc;
    wc.wr_id = q.resp.recv.wr_id;
    wc.status = WcStatus::WrFlushErr;
    wc.opcode = verbs::WcOpcode::Recv;
    wc.qp_num = q.qpn;
    complete(q.recv_cq, wc);
    q.resp.have_recv = false;
  }
  while (!q.rq.empty()) {
    verbs::Wc wc;
    wc.wr_id = q.rq.at(q.rq.tail).wr_id;
    wc.status = WcStatus::WrFlushErr;
    wc.opcode = verbs::WcOpcode::Recv;
    wc.qp_num = q.qpn;
    complete(q.recv_cq, wc);
    ++q.rq.tail;
  }
  q.resp.in_msg = false;
}

void Engine::qp_to_error(Qp& q, bool keep_responses) noexcept {
  q.state = QpState::Err;
  q.attr.qp_state = QpState::Err;
  q.comp.deadline = 0;
  q.comp.rnr_wait = false;
  if (!keep_responses) {
    for (uint32_t i = 0; i < q.resp.res_cap; ++i) q.resp.res[i].active = false;
    q.resp.emit_head = q.resp.emit_tail = 0;
  }
  flush_queues(q);
}

void Engine::sq_to_error(Qp& q) noexcept {
  // UC/UD send errors (IBTA ch. 10): the send queue stops and is flushed, receives go on.
  q.state = QpState::Sqe;
  q.attr.qp_state = QpState::Sqe;
  flush_queues(q, /*send_only=*/true);
}

void Engine::set_cc(const EngineConfig& c) noexcept {
  cfg_.ecn = c.ecn;
  cfg_.cnp = c.cnp;
  cfg_.cnp_interval_ns = c.cnp_interval_ns;
  cfg_.cnp_dscp = c.cnp_dscp;
  cfg_.cnp_prio = c.cnp_prio;
  cfg_.dcqcn = c.dcqcn;
  cfg_.dcqcn_params = c.dcqcn_params;
  for (Qp* q : live_qps_) {
    if (q->type != verbs::QpType::UD) build_template(*q);  // the ECT marking of its data packets
    q->rp.reset(cfg_.dcqcn_params);
    if (!q->sq.empty()) req_ready(*q);  // a QP the pacer held goes again
  }
}

Engine::McastGroup* Engine::find_group(const wire::Gid& mgid) noexcept {
  for (auto& g : mcast_)
    if (g.n && g.mgid == mgid) return &g;
  return nullptr;
}

uint32_t Engine::mcast_members(const wire::Gid& mgid) const noexcept {
  for (const auto& g : mcast_)
    if (g.n && g.mgid == mgid) return g.n;
  return 0;
}

int Engine::attach_mcast(uint32_t qpn, const wire::Gid& mgid) noexcept {
  Qp* q = qp(qpn);
  if (!q || q->type != verbs::QpType::UD || qpn == kGsiQpn || !wire::gid_is_multicast(mgid)) return EINVAL;
  McastGroup* g = find_group(mgid);
  if (!g) {
    for (auto& s : mcast_)
      if (s.n == 0) {
        g = &s;
        break;
      }
    if (!g) return ENOMEM;
    g->mgid = mgid;
  }
  uint32_t* m = group_qpns(static_cast<size_t>(g - mcast_.data()));
  for (uint32_t i = 0; i < g->n; ++i)
    if (m[i] == qpn) return 0;  // attached already (as rxe)
  if (g->n == cfg_.max_mcast_qps_per_group) return ENOMEM;
  m[g->n++] = qpn;
  mcast_memberships_.store(mcast_memberships_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return 0;
}

int Engine::detach_mcast(uint32_t qpn, const wire::Gid& mgid) noexcept {
  McastGroup* g = find_group(mgid);
  if (!g) return EINVAL;
  uint32_t* m = group_qpns(static_cast<size_t>(g - mcast_.data()));
  for (uint32_t i = 0; i < g->n; ++i)
    if (m[i] == qpn) {
      m[i] = m[--g->n];  // the group slot is free again when n reaches 0
      mcast_memberships_.store(mcast_memberships_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
      return 0;
    }
  return EINVAL;
}

std::vector<wire::Gid> Engine::mcast_groups() const {
  std::vector<wire::Gid> v;
  for (const auto& g : mcast_)
    if (g.n) v.push_back(g.mgid);
  return v;
}

}  // namespace droce::transport

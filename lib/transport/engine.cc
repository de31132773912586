#include "transport/engine.h"

#include <cerrno>
#include <cstring>
#include <new>

#include "wire/icrc.h"

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

bool gather(const verbs::MrTable& mrs, uint32_t pd, const verbs::SendWqe& w, uint32_t off, uint8_t* dst,
            uint32_t len) noexcept {
  if (len == 0) return true;
  if (w.is_inline) {
    if (off + len > w.length) return false;
    std::memcpy(dst, w.inline_data + off, len);
    return true;
  }
  for (uint32_t i = 0; i < w.wr.num_sge && len > 0; ++i) {
    const verbs::Sge& s = w.wr.sg_list[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const uint32_t n = s.length - off < len ? s.length - off : len;
    const uint8_t* src = mrs.lookup(s.lkey, pd, s.addr + off, n, 0, nullptr);
    if (!src) return false;
    std::memcpy(dst, src, n);
    dst += n;
    len -= n;
    off = 0;
  }
  return len == 0;
}

const uint8_t* gather_ref(const verbs::MrTable& mrs, uint32_t pd, const verbs::SendWqe& w, uint32_t off,
                          uint32_t len, void** dma) noexcept {
  if (w.is_inline || len == 0) return nullptr;
  for (uint32_t i = 0; i < w.wr.num_sge; ++i) {
    const verbs::Sge& s = w.wr.sg_list[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    if (s.length - off < len) return nullptr;  // spans two SGEs: copy
    return mrs.lookup(s.lkey, pd, s.addr + off, len, 0, nullptr, dma);
  }
  return nullptr;
}

bool scatter(const verbs::MrTable& mrs, uint32_t pd, const verbs::Sge* sge, uint32_t num_sge, uint32_t off,
             const uint8_t* src, uint32_t len) noexcept {
  if (len == 0) return true;
  for (uint32_t i = 0; i < num_sge && len > 0; ++i) {
    const verbs::Sge& s = sge[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const uint32_t n = s.length - off < len ? s.length - off : len;
    uint8_t* dst = mrs.lookup(s.lkey, pd, s.addr + off, n, verbs::kAccessLocalWrite, nullptr);
    if (!dst) return false;
    std::memcpy(dst, src, n);
    src += n;
    len -= n;
    off = 0;
  }
  return len == 0;
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
  for (uint32_t i = 0; i < q.resp.res_cap; ++i) grown[i] = q.resp.res[i];
  q.resp.res = std::move(grown);
  q.resp.res_cap = n;
  return true;
}

void Engine::clear_resp(RespState& r) noexcept {
  std::unique_ptr<RespResource[]> res = std::move(r.res);
  const uint32_t cap = r.res_cap;
  r = RespState{};
  for (uint32_t i = 0; i < cap; ++i) res[i] = RespResource{};
  r.res = std::move(res);
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
  if (!q) return EINVAL;
  if (int rc = q->post_send(wr)) return rc;
  if (q->state == QpState::Err || q->state == QpState::Sqe) {
    flush_queues(*q, q->state == QpState::Sqe);
  } else if (q->state == QpState::Rts) {
    if (!send_inline(*q)) req_ready(*q);
  }
  return 0;
}

bool Engine::send_inline(Qp& q) noexcept {
  // Only when the engine is quiet (README: The fast path, sixth session): on
  // the thread that polls it, outside poll(), nothing queued to send, the last
  // poll's requester sent nothing and nothing went inline since (so a burst of
  // posts leaves as one TX burst at the next poll, as before), and the QP not
  // paced by DCQCN. The requester then does what poll()'s step 4 would do a
  // loop turn later, with the same checks (SQ order from its cursor, window,
  // fence, RNR wait, selective repeat's resends first); due timers run first,
  // as in poll().
  if (!cfg_.send_inline || !req_quiet_ || in_poll_ || tx_blocked_ || !idle() || q.rp.limited() ||
      !pthread_equal(pthread_self(), owner_))
    return false;
  req_quiet_ = false;
  const uint64_t t = clock_.now_ns();
  if (t > now_) now_ = t;
  if ((now_ >> tick_shift_) >= wheel_tick_) {
    run_timers();
    if (!idle()) return false;  // a timer queued work: poll() takes it in its order
  }
  if (requester_run(*this, q, cfg_.pkts_per_turn)) req_ready(q);
  flush_tx();
  return true;
}

int Engine::post_recv(uint32_t qpn, const verbs::RecvWr& wr) noexcept {
  Qp* q = qp(qpn);
  if (!q) return EINVAL;
  if (int rc = q->post_recv(wr)) return rc;
  if (q->state == QpState::Err) flush_queues(*q);
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

void Engine::req_ready(Qp& q) noexcept {
  if (q.in_req_ready) return;
  q.in_req_ready = true;
  req_q_[req_head_++ & q_mask_] = &q;
}

void Engine::resp_ready(Qp& q) noexcept {
  if (q.in_resp_ready) return;
  q.in_resp_ready = true;
  resp_q_[resp_head_++ & q_mask_] = &q;
}

io::PktBuf* Engine::take_tx_buf(size_t frame_len) noexcept {
  if (tx_len_ >= kBurst) flush_tx();
  if (tx_len_ >= kBurst) {
    tx_blocked_ = true;
    return nullptr;
  }
  if (spare_len_ == 0) spare_len_ = io_.alloc_burst(spare_, kBurst);
  if (spare_len_ == 0) {
    count(Ctr::TxNoBuf);
    tx_blocked_ = true;
    return nullptr;
  }
  io::PktBuf* b = spare_[--spare_len_];
  if (frame_len > b->cap) {  // the whole frame must fit: the backend's copy fallback
    spare_[spare_len_++] = b;
    count(Ctr::TxNoBuf);
    return nullptr;
  }
  return b;
}

uint8_t* Engine::begin_frame(const wire::Headers& h, uint32_t payload_len) noexcept {
  const wire::FrameShape s = wire::frame_shape(h);
  io::PktBuf* b = take_tx_buf(wire::frame_len(s, payload_len));
  if (!b) return nullptr;
  const size_t hl = wire::build_headers({b->data, b->cap}, h, payload_len);
  cur_ = b;
  cur_shape_ = s;
  cur_plen_ = payload_len;
  return b->data + hl;
}

uint8_t* Engine::begin_frame(const wire::TxTemplate& t, const wire::PacketFields& f, uint32_t payload_len) noexcept {
  const wire::FrameShape s = wire::frame_shape(t, f.opcode);
  io::PktBuf* b = take_tx_buf(wire::frame_len(s, payload_len));
  if (!b) return nullptr;
  const size_t hl = wire::build_headers({b->data, b->cap}, t, f, payload_len);
  cur_ = b;
  cur_shape_ = s;
  cur_plen_ = payload_len;
  return b->data + hl;
}

bool Engine::emit_copy(const wire::TxTemplate& t, const wire::PacketFields& f, const uint8_t* src,
                       uint32_t len) noexcept {
  const wire::OpcodeInfo& op = wire::opcode_info(f.opcode);
  const size_t hdr = t.bth_off() + op.hdr_len;
  const uint8_t pad = (op.flags & wire::kOpPayload) ? wire::pad_for(len) : 0;
  const size_t body_end = hdr + len + pad;
  io::PktBuf* b = take_tx_buf(body_end + wire::kIcrcSize);
  if (!b) return false;
  uint8_t* p = b->data;
  if (wire::build_headers({p, b->cap}, t, f, len) != hdr) {  // an invalid opcode: nothing queued
    spare_[spare_len_++] = b;
    return false;
  }
  std::memcpy(p + hdr, src, len);
  std::memset(p + hdr + len, 0, pad);
  // The ICRC is left for flush_tx, with the batch's others (finish_icrcs).
  icrc_pend_[icrc_pend_len_++] = {p + t.l2_len, static_cast<uint32_t>(body_end - t.l2_len), t.l3_len, t.ipv6};
  b->len = static_cast<uint32_t>(body_end + wire::kIcrcSize);
  tx_[tx_len_++] = b;
  count(Ctr::TxFrames);
  if (len) count(Ctr::TxCopied);
  return true;
}

void Engine::end_frame() noexcept {
  io::PktBuf* b = cur_;
  cur_ = nullptr;
  b->len = static_cast<uint32_t>(wire::finish_frame({b->data, b->cap}, cur_shape_, cur_plen_));
  tx_[tx_len_++] = b;
  count(Ctr::TxFrames);
}

void Engine::end_frame_with(uint8_t* dst, const uint8_t* src, void* dma) noexcept {
  const uint32_t len = cur_plen_;
  if (dma && zero_copy_ && len >= cfg_.zero_copy_min) {
    io::PktBuf* b = cur_;
    cur_ = nullptr;
    b->len = static_cast<uint32_t>(dst - b->data);
    b->ext = src;
    b->ext_ref = dma;
    b->ext_len = len;
    b->tail_len = static_cast<uint8_t>(wire::finish_frame_ext({b->data, b->len}, cur_shape_, src, len, b->tail));
    tx_[tx_len_++] = b;
    count(Ctr::TxFrames);
    count(Ctr::TxZeroCopy);
    return;
  }
  if (len) {
    std::memcpy(dst, src, len);
    count(Ctr::TxCopied);
  }
  end_frame();
}

void Engine::finish_icrcs() noexcept {
  uint32_t icrc[kBurst];
  wire::icrc_compute_burst(icrc_pend_, icrc_pend_len_, icrc);
  for (uint16_t k = 0; k < icrc_pend_len_; ++k)
    wire::icrc_store(const_cast<uint8_t*>(icrc_pend_[k].l3) + icrc_pend_[k].len, icrc[k]);  // our TX buffer
  icrc_pend_len_ = 0;
}

void Engine::flush_tx() noexcept {
  if (tx_len_ == 0) return;
  if (icrc_pend_len_) finish_icrcs();
  const uint16_t sent = io_.tx_burst(tx_, tx_len_);
  if (sent < tx_len_) {
    std::memmove(tx_, tx_ + sent, (tx_len_ - sent) * sizeof(tx_[0]));
    tx_blocked_ = true;
  }
  tx_len_ = static_cast<uint16_t>(tx_len_ - sent);
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

void Engine::send_cnp(Qp& q, const wire::PacketView& pkt) noexcept {
  // Notification point (annex A17.9.2): one CNP to the sending QP, rate-limited per QP.
  if (q.cnp_ever && now_ - q.last_cnp_ns < cfg_.cnp_interval_ns) {
    count(Ctr::CnpSuppressed);
    return;
  }
  wire::Headers h;
  h.l2.src = io_.mac();
  h.l2.dst = pkt.h.l2.src;
  h.l2.vlan = pkt.h.l2.vlan;
  h.l2.vlan_tci = pkt.h.l2.vlan_tci;
  h.l3.ipv6 = pkt.h.l3.ipv6;
  h.l3.src = pkt.h.l3.dst;
  h.l3.dst = pkt.h.l3.src;
  h.l3.tos = static_cast<uint8_t>((cfg_.cnp_dscp & 0x3F) << 2);  // CNPs are not ECN-capable
  if (h.l2.vlan) h.l2.vlan_tci = static_cast<uint16_t>((h.l2.vlan_tci & 0x1FFF) | (cfg_.cnp_prio & 7) << 13);
  h.l4.sport = pkt.h.l4.sport;
  h.bth.opcode = wire::op::CNP;
  h.bth.resv8a = wire::kBthBecn;
  h.bth.dqpn = q.type == verbs::QpType::UD ? pkt.h.ext.deth.sqpn : q.attr.dest_qp_num;
  h.bth.psn = 0;
  if (!begin_frame(h, 0)) return;
  end_frame();
  q.cnp_ever = true;
  q.last_cnp_ns = now_;
  ++q.ctr.cnp_sent;
  q.count_tx(0);
  count(Ctr::CnpSent);
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

// A frame to QPN 0xFFFFFF: a copy for every QP attached to its destination
// address (the checks of rx() for each; Q_Key in ud_rx). Bounded by the group
// size, no allocation. A QP does not receive its own packets looped back
// (same source GID and source QPN).
void Engine::rx_mcast(const wire::PacketView& pkt) noexcept {
  count(Ctr::RxMcast);
  McastGroup* g = wire::gid_is_multicast(pkt.h.l3.dst) ? find_group(pkt.h.l3.dst) : nullptr;
  if (!g) {
    count(Ctr::RxMcastNoGroup);
    return;
  }
  const wire::OpcodeInfo& op = *pkt.op;
  if (op.transport != wire::Transport::UD || !(op.flags & wire::kOpRequest)) {
    count(Ctr::RxBadTransport);
    return;
  }
  if ((pkt.h.bth.pkey & 0x7FFF) != (wire::kDefaultPkey & 0x7FFF)) {
    count(Ctr::RxBadPkey);
    return;
  }
  const uint32_t* m = group_qpns(static_cast<size_t>(g - mcast_.data()));
  const bool from_us = pkt.h.l3.src == source_gid(pkt.h.l3.dst);
  for (uint32_t i = 0; i < g->n; ++i) {
    Qp* q = qp(m[i]);
    if (!q) continue;
    if (from_us && pkt.h.ext.deth.sqpn == q->qpn) continue;
    if (!q->can_receive()) {
      count(Ctr::RxBadState);
      continue;
    }
    ++q->ctr.rx_packets;
    q->ctr.rx_bytes += pkt.payload_len;
    count(Ctr::McastDelivered);
    responder_rx(*this, *q, pkt);
  }
}

void Engine::rx(io::PktBuf* b) noexcept {
  count(Ctr::RxFrames);
  wire::PacketView pkt;
  const wire::ParseError err = wire::parse_frame({b->data, b->len}, pkt);
  if (err != wire::ParseError::Ok) {
    count(err == wire::ParseError::IcrcMismatch ? Ctr::RxIcrcErr : Ctr::RxParseErr);
    return;
  }
  if (pkt.h.bth.dqpn == wire::kMcastQpn) {
    rx_mcast(pkt);
    return;
  }
  Qp* q = qp(pkt.h.bth.dqpn);
  if (!q) {
    count(Ctr::RxNoQp);
    return;
  }
  const wire::OpcodeInfo& op = *pkt.op;
  if (op.flags & wire::kOpCnp) {
    count(Ctr::CnpReceived);
    ++q->ctr.cnp_received;
    if (cfg_.dcqcn && q->type != verbs::QpType::UD) {
      q->rp.on_cnp(now_);
      // Congestion ends slow start (RFC 3168's ECE response without the cut:
      // the rate limiter cuts): the window grows one PSN per window from here.
      if (q->req.cwnd < q->comp.ssthresh) q->comp.ssthresh = q->req.cwnd;
      if (!q->sq.empty()) req_ready(*q);  // paced from now on
    }
    return;
  }
  const auto want = q->type == verbs::QpType::RC ? wire::Transport::RC
                    : q->type == verbs::QpType::UC ? wire::Transport::UC
                                                   : wire::Transport::UD;
  if (op.transport != want) {
    count(Ctr::RxBadTransport);
    return;
  }
  if ((pkt.h.bth.pkey & 0x7FFF) != (wire::kDefaultPkey & 0x7FFF)) {  // one P_Key: the default partition
    count(Ctr::RxBadPkey);
    return;
  }
  if (!q->can_receive()) {
    count(Ctr::RxBadState);
    return;
  }
  // A connection takes packets only from its peer, to the address it uses
  // (rxe check_addr): a stranger's frames never reach its state machine.
  if (q->type != verbs::QpType::UD && (pkt.h.l3.src != q->tx.dst || pkt.h.l3.dst != q->tx.src)) {
    count(Ctr::RxBadSrcAddr);
    return;
  }
  ++q->ctr.rx_packets;
  q->ctr.rx_bytes += pkt.payload_len;
  if (pkt.h.l3.ecn() == wire::kEcnCe) {
    count(Ctr::CeReceived);
    ++q->ctr.ce_received;
    if (cfg_.cnp) send_cnp(*q, pkt);
  }
  if (op.flags & wire::kOpRequest) {
    responder_rx(*this, *q, pkt);
  } else {
    completer_rx(*this, *q, pkt);
  }
}

void Engine::timer_link(Qp& q, uint64_t at) noexcept {
  uint64_t t = at >> tick_shift_;
  if (t < wheel_tick_) t = wheel_tick_;  // already due: the next slot processed
  const auto slot = static_cast<uint32_t>(t & (kWheelSlots - 1));
  q.tw_on = true;
  q.tw_at = at;
  q.tw_slot = slot;
  q.tw_prev = nullptr;
  q.tw_next = wheel_[slot];
  if (q.tw_next) q.tw_next->tw_prev = &q;
  wheel_[slot] = &q;
}

void Engine::timer_unlink(Qp& q) noexcept {
  if (!q.tw_on) return;
  if (q.tw_prev) {
    q.tw_prev->tw_next = q.tw_next;
  } else {
    wheel_[q.tw_slot] = q.tw_next;
  }
  if (q.tw_next) q.tw_next->tw_prev = q.tw_prev;
  q.tw_on = false;
  q.tw_prev = q.tw_next = nullptr;
}

void Engine::timer_arm(Qp& q) noexcept {
  uint64_t at = UINT64_MAX;
  if (q.comp.rnr_wait) at = q.comp.rnr_until;
  if (q.comp.deadline && q.comp.deadline < at) at = q.comp.deadline;
  if (const uint64_t t = tail_deadline(cfg_, q); t && t < at) at = t;
  if (at == UINT64_MAX) return;  // nothing armed: a stale entry leaves when its slot comes
  if (q.tw_on) {
    if (q.tw_at <= at) return;  // due earlier: it finds the later time then
    timer_unlink(q);
  }
  timer_link(q, at);
}

void Engine::fire_slot(uint32_t slot) noexcept {
  Qp* q = wheel_[slot];
  wheel_[slot] = nullptr;
  for (uint32_t guard = 0; q && guard < cfg_.max_qps + 1; ++guard) {
    Qp* next = q->tw_next;
    q->tw_on = false;
    q->tw_prev = q->tw_next = nullptr;
    if (q->tw_at > now_) {
      timer_link(*q, q->tw_at);  // due on a later turn of the wheel
    } else {
      if (q->type == verbs::QpType::RC && q->rts_like()) completer_timer(*this, *q, now_);
      timer_arm(*q);  // its next time, if a timer is still armed
    }
    q = next;
  }
}

void Engine::run_timers() noexcept {
  // The wheel: every slot whose tick has come, each at most once per call.
  const uint64_t now_tick = now_ >> tick_shift_;
  if (now_tick >= wheel_tick_ + kWheelSlots) wheel_tick_ = now_tick + 1 - kWheelSlots;
  while (wheel_tick_ <= now_tick) {
    const auto slot = static_cast<uint32_t>(wheel_tick_ & (kWheelSlots - 1));
    ++wheel_tick_;
    fire_slot(slot);
  }
  // The backstop sweep: a bounded slice of the QPs, round robin (a timer armed
  // where nothing called timer_arm, a requester left with work and no event).
  if (now_ - last_timer_sweep_ < cfg_.timer_sweep_ns) return;
  last_timer_sweep_ = now_;
  const size_t n = live_qps_.size();
  const size_t batch = cfg_.timer_scan_batch < n ? cfg_.timer_scan_batch : n;
  for (size_t k = 0; k < batch; ++k) {
    if (timer_cursor_ >= n) timer_cursor_ = 0;
    Qp* q = live_qps_[timer_cursor_++];
    if (q->type != verbs::QpType::RC || !q->rts_like()) continue;
    completer_timer(*this, *q, now_);
    timer_arm(*q);
  }
}

uint64_t Engine::next_timer_ns() const noexcept {
  uint64_t t = UINT64_MAX;
  for (const Qp* q : live_qps_) {
    if (q->type != verbs::QpType::RC || !q->rts_like()) continue;
    if (q->comp.rnr_wait && q->comp.rnr_until < t) t = q->comp.rnr_until;
    if (q->comp.deadline && q->comp.deadline < t) t = q->comp.deadline;
    if (const uint64_t e = tail_deadline(cfg_, *q); e && e < t) t = e;
  }
  for (const Qp* q : live_qps_)  // a paced QP waiting for its next send time
    if (q->in_req_ready && q->rp.limited() && q->rp.next_send_ns() > now_ && q->rp.next_send_ns() < t)
      t = q->rp.next_send_ns();
  return t;
}

bool Engine::idle() const noexcept { return req_head_ == req_tail_ && resp_head_ == resp_tail_ && tx_len_ == 0; }

uint32_t Engine::poll(uint64_t now_ns) noexcept {
  now_ = now_ns > now_ ? now_ns : now_;  // time never goes back
  tx_blocked_ = false;
  in_poll_ = true;
  owner_ = pthread_self();
  uint32_t work = 0;
  const uint32_t tx_before = static_cast<uint32_t>(counter(Ctr::TxFrames));
  // 1. Receive.
  io::PktBuf* rx_bufs[kBurst];
  const uint16_t n = io_.rx_burst(rx_bufs, kBurst);
  for (uint16_t i = 0; i < n; ++i) {
    if (i + 1 < n) __builtin_prefetch(rx_bufs[i + 1]->data);
    rx(rx_bufs[i]);
  }
  if (n) io_.free_burst(rx_bufs, n);
  work += n;
  // 2. Timers, by elapsed time.
  if ((now_ >> tick_shift_) >= wheel_tick_) run_timers();
  // 3. Responder output (read responses, ACK/NAK) before new requests.
  for (uint32_t k = resp_head_ - resp_tail_; k > 0 && !tx_blocked_; --k) {
    Qp* q = resp_q_[resp_tail_++ & q_mask_];
    q->in_resp_ready = false;
    if (responder_tx(*this, *q, cfg_.pkts_per_turn)) resp_ready(*q);
  }
  // 4. Requester.
  const uint64_t req_before = counter(Ctr::ReqPackets);
  for (uint32_t k = req_head_ - req_tail_; k > 0 && !tx_blocked_; --k) {
    Qp* q = req_q_[req_tail_++ & q_mask_];
    q->in_req_ready = false;
    if (requester_run(*this, *q, cfg_.pkts_per_turn)) req_ready(*q);
  }
  req_quiet_ = counter(Ctr::ReqPackets) == req_before;
  flush_tx();
  in_poll_ = false;
  work += static_cast<uint32_t>(counter(Ctr::TxFrames)) - tx_before;
  return work;
}

}  // namespace droce::transport

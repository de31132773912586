#include "verbs/queues.h"

#include <cerrno>

namespace droce::verbs {

const char* wc_status_str(WcStatus s) noexcept {
  static constexpr const char* kNames[] = {
      "success",          "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error", "remote access error",
      "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
      "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout error", "general error"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

const char* qp_state_str(QpState s) noexcept {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

uint64_t rnr_timer_ns(uint8_t code) noexcept {
  // IBTA vol 1 table 45, in units of 10 us.
  static constexpr uint32_t k10us[32] = {65536, 1,   2,   3,   4,    6,    8,    12,   16,   24,   32,
                                         48,    64,  96,  128, 192,  256,  384,  512,  768,  1024, 1536,
                                         2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
  return uint64_t{k10us[code & 31]} * 10000u;
}

int Srq::post(const RecvWr& wr) noexcept {
  if (wr.num_sge > kMaxSge) return EINVAL;
  if (ring_.count() >= max_wr_) return ENOMEM;
  RecvWqe& w = ring_.at(ring_.head);
  w.wr_id = wr.wr_id;
  w.num_sge = wr.num_sge;
  w.length = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    w.sge[i] = wr.sg_list[i];
    w.length += wr.sg_list[i].length;
  }
  ++ring_.head;
  return 0;
}

QpBase::QpBase(uint32_t qpn_, const QpInitAttr& init)
    : qpn(qpn_),
      type(init.qp_type),
      sq_sig_all(init.sq_sig_all),
      pd(init.pd),
      send_cq(init.send_cq),
      recv_cq(init.recv_cq),
      srq(init.srq),
      sq(init.cap.max_send_wr),
      rq(init.srq ? 1 : init.cap.max_recv_wr) {
  attr.cap = init.cap;
}

namespace {

struct Rule {
  bool valid;
  uint32_t req[3];  // required attributes, by type RC, UC, UD
  uint32_t opt[3];  // optional attributes
};

constexpr int ti(QpType t) noexcept { return t == QpType::RC ? 0 : t == QpType::UC ? 1 : 2; }

// The transition table (IBTA vol 1 table 91 / Linux ib_modify_qp_is_ok). STATE,
// and for the any->RESET/ERR transitions nothing else, are always allowed.
Rule rule(QpState cur, QpState next) noexcept {
  using S = QpState;
  constexpr uint32_t kPathRc = kQpAltPath | kQpAccessFlags | kQpPkeyIndex;
  if (next == S::Reset || next == S::Err) return {true, {0, 0, 0}, {0, 0, 0}};
  switch (cur) {
    case S::Reset:
      if (next == S::Init)
        return {true,
                {kQpPkeyIndex | kQpPort | kQpAccessFlags, kQpPkeyIndex | kQpPort | kQpAccessFlags,
                 kQpPkeyIndex | kQpPort | kQpQkey},
                {0, 0, 0}};
      break;
    case S::Init:
      if (next == S::Init)
        return {true, {0, 0, 0},
                {kQpPkeyIndex | kQpPort | kQpAccessFlags, kQpPkeyIndex | kQpPort | kQpAccessFlags,
                 kQpPkeyIndex | kQpPort | kQpQkey}};
      if (next == S::Rtr)
        return {true,
                {kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer,
                 kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn, 0},
                {kPathRc, kPathRc, kQpPkeyIndex | kQpQkey}};
      break;
    case S::Rtr:
      if (next == S::Rts)
        return {true,
                {kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic, kQpSqPsn, kQpSqPsn},
                {kQpCurState | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer | kQpPathMigState,
                 kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState, kQpCurState | kQpQkey}};
      break;
    case S::Rts:
      if (next == S::Rts)
        return {true, {0, 0, 0},
                {kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState | kQpMinRnrTimer,
                 kQpCurState | kQpAccessFlags | kQpAltPath | kQpPathMigState, kQpCurState | kQpQkey}};
      if (next == S::Sqd)
        return {true, {0, 0, 0}, {kQpEnSqdAsyncNotify, kQpEnSqdAsyncNotify, kQpEnSqdAsyncNotify}};
      break;
    case S::Sqd:
      if (next == S::Rts)
        return {true, {0, 0, 0},
                {kQpCurState | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer | kQpPathMigState,
                 kQpCurState | kQpAltPath | kQpAccessFlags | kQpPathMigState, kQpCurState | kQpQkey}};
      if (next == S::Sqd)
        return {true, {0, 0, 0},
                {kQpPkeyIndex | kQpAv | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic |
                     kQpMaxDestRdAtomic | kQpAltPath | kQpAccessFlags | kQpMinRnrTimer | kQpPathMigState,
                 kQpAv | kQpAltPath | kQpAccessFlags | kQpPkeyIndex | kQpPathMigState, kQpPkeyIndex | kQpQkey}};
      break;
    case S::Sqe:
      if (next == S::Rts)
        return {true, {0, 0, 0}, {kQpCurState | kQpAccessFlags, kQpCurState | kQpAccessFlags, kQpCurState | kQpQkey}};
      break;
    default: break;
  }
  return {false, {0, 0, 0}, {0, 0, 0}};
}

}  // namespace

int QpBase::check_modify(const QpAttr& a, uint32_t mask) const noexcept {
  if (mask & kQpCurState) {
    if (a.cur_qp_state != state) return EINVAL;
  }
  const QpState next = (mask & kQpState) ? a.qp_state : state;
  if (static_cast<uint8_t>(next) > static_cast<uint8_t>(QpState::Err)) return EINVAL;
  const Rule r = rule(state, next);
  if (!r.valid) return EINVAL;
  if (type == QpType::RC && next == QpState::Sqe) return EINVAL;
  const int t = ti(type);
  const uint32_t attrs = mask & ~kQpState;
  if ((attrs & r.req[t]) != r.req[t]) return EINVAL;
  if (attrs & ~(r.req[t] | r.opt[t] | kQpCurState)) return EINVAL;
  // Values.
  if (mask & kQpPathMtu) {
    const auto m = static_cast<uint8_t>(a.path_mtu);
    if (m < 1 || m > 5) return EINVAL;
  }
  if ((mask & kQpPort) && a.port_num != 1) return EINVAL;
  if ((mask & kQpPkeyIndex) && a.pkey_index != 0) return EINVAL;
  if ((mask & kQpAccessFlags) && (a.qp_access_flags & ~kAccessAll)) return EINVAL;
  if ((mask & kQpMaxQpRdAtomic) && a.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & kQpMaxDestRdAtomic) && a.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & kQpTimeout) && a.timeout > 31) return EINVAL;
  if ((mask & kQpRetryCnt) && a.retry_cnt > 7) return EINVAL;
  if ((mask & kQpRnrRetry) && a.rnr_retry > 7) return EINVAL;
  if ((mask & kQpMinRnrTimer) && a.min_rnr_timer > 31) return EINVAL;
  if ((mask & kQpDestQpn) && a.dest_qp_num > wire::kMask24) return EINVAL;
  if ((mask & kQpRqPsn) && a.rq_psn > wire::kMask24) return EINVAL;
  if ((mask & kQpSqPsn) && a.sq_psn > wire::kMask24) return EINVAL;
  return 0;
}

void QpBase::apply_attrs(const QpAttr& a, uint32_t mask) noexcept {
  if (mask & kQpAccessFlags) attr.qp_access_flags = a.qp_access_flags;
  if (mask & kQpPkeyIndex) attr.pkey_index = a.pkey_index;
  if (mask & kQpPort) attr.port_num = a.port_num;
  if (mask & kQpQkey) attr.qkey = a.qkey;
  if (mask & kQpAv) attr.ah_attr = a.ah_attr;
  if (mask & kQpPathMtu) {
    attr.path_mtu = a.path_mtu;
    mtu = mtu_bytes(a.path_mtu);
  }
  if (mask & kQpTimeout) attr.timeout = a.timeout;
  if (mask & kQpRetryCnt) attr.retry_cnt = a.retry_cnt;
  if (mask & kQpRnrRetry) attr.rnr_retry = a.rnr_retry;
  if (mask & kQpRqPsn) attr.rq_psn = a.rq_psn & wire::kMask24;
  if (mask & kQpSqPsn) attr.sq_psn = a.sq_psn & wire::kMask24;
  if (mask & kQpMaxQpRdAtomic) attr.max_rd_atomic = a.max_rd_atomic ? a.max_rd_atomic : 1;
  if (mask & kQpMaxDestRdAtomic) attr.max_dest_rd_atomic = a.max_dest_rd_atomic ? a.max_dest_rd_atomic : 1;
  if (mask & kQpMinRnrTimer) attr.min_rnr_timer = a.min_rnr_timer;
  if (mask & kQpDestQpn) attr.dest_qp_num = a.dest_qp_num;
  if (mask & kQpState) state = a.qp_state;
  attr.qp_state = state;
}

namespace {
// What a data WQE keeps of its WR: the common fields, the SGEs in use and the
// operation's parts: the RDMA part always (it lies on the WR's first line), the
// atomic part for an atomic, the UD part on a UD QP (the bind part belongs to
// memory-window WRs, copied whole above). The requester reads nothing else. A
// plain struct copy moves all of SendWr, eight SGEs included (a `rep movs` of
// 264 bytes, most of a post's cost); a 64 B WRITE reads and writes the first
// two lines of the WR and of the entry only, which with thousands of QPs are
// cache misses each.
inline void copy_posted(SendWr& d, const SendWr& s, bool ud) noexcept {
  d.wr_id = s.wr_id;
  d.opcode = s.opcode;
  d.send_flags = s.send_flags;
  d.num_sge = s.num_sge;
  for (uint32_t i = 0; i < s.num_sge; ++i) d.sg_list[i] = s.sg_list[i];
  d.imm_data = s.imm_data;
  d.invalidate_rkey = s.invalidate_rkey;
  d.rdma = s.rdma;
  if (s.opcode == WrOpcode::AtomicCmpSwp || s.opcode == WrOpcode::AtomicFetchAdd) d.atomic = s.atomic;
  if (ud) d.ud = s.ud;
}
}  // namespace

int QpBase::post_send(const SendWr& wr) noexcept {
  // ibv_post_send: the send queue must be in RTS (or SQD/SQE/ERR where WRs are
  // flushed or held); RESET/INIT/RTR reject.
  if (state == QpState::Reset || state == QpState::Init || state == QpState::Rtr) return EINVAL;
  if (!wire::wr_allowed(type, wr.opcode)) return EINVAL;
  if (wr.opcode == WrOpcode::BindMw || wr.opcode == WrOpcode::LocalInv) {
    // Local operations (memory windows): no data, no packet; the requester
    // executes them in order and they complete in SQ order.
    if (sq.count() >= attr.cap.max_send_wr) return ENOMEM;
    SendWqe& w = sq.at(sq.head);
    w.wr = wr;
    w.wr.num_sge = 0;
    w.wr.send_flags &= ~kSendInline;
    w.length = 0;
    w.is_inline = false;
    w.mark_posted();
    ++sq.head;
    return 0;
  }
  if (wr.num_sge > attr.cap.max_send_sge || wr.num_sge > kMaxSge) return EINVAL;
  if (sq.count() >= attr.cap.max_send_wr) return ENOMEM;
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) len += wr.sg_list[i].length;
  if (len > kMaxMsgSize) return EINVAL;
  const bool atomic = wr.opcode == WrOpcode::AtomicCmpSwp || wr.opcode == WrOpcode::AtomicFetchAdd;
  if (atomic && len != 8) return EINVAL;
  const bool inl = (wr.send_flags & kSendInline) && !atomic && wr.opcode != WrOpcode::RdmaRead;
  if (inl && len > attr.cap.max_inline_data) return EINVAL;
  if (type == QpType::UD && wr.ud.ah == nullptr) return EINVAL;
  SendWqe& w = sq.at(sq.head);
  copy_posted(w.wr, wr, type == QpType::UD);
  w.length = static_cast<uint32_t>(len);
  w.is_inline = inl;
  if (inl) {
    uint32_t off = 0;
    for (uint32_t i = 0; i < wr.num_sge; ++i) {
      std::memcpy(w.inline_data + off, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      off += wr.sg_list[i].length;
    }
  }
  if (type == QpType::UD) w.ah = *wr.ud.ah;
  w.mark_posted();
  ++sq.head;
  return 0;
}

int QpBase::post_recv(const RecvWr& wr) noexcept {
  if (srq) return EINVAL;
  if (state == QpState::Reset) return EINVAL;
  if (wr.num_sge > attr.cap.max_recv_sge || wr.num_sge > kMaxSge) return EINVAL;
  if (rq.count() >= attr.cap.max_recv_wr) return ENOMEM;
  RecvWqe& w = rq.at(rq.head);
  w.wr_id = wr.wr_id;
  w.num_sge = wr.num_sge;
  w.length = 0;
  for (uint32_t i = 0; i < wr.num_sge; ++i) {
    w.sge[i] = wr.sg_list[i];
    w.length += wr.sg_list[i].length;
  }
  ++rq.head;
  return 0;
}

}  // namespace droce::verbs

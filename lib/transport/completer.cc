// Completer: responses and timers -> completions (IBTA 9.7, 9.9; cf. rxe_comp.c).
//
// Per response packet:
//   CheckPsn -> (Ack | ReadResp | AtomicAck | Nak | RnrNak) -> Retire
// and on timers: AckTimeout -> (Retry | RetryExceeded), RnrWaitOver.
// WQEs complete strictly in SQ order: a response acknowledges every earlier
// SEND/WRITE implicitly; an acknowledgement that covers a READ or atomic which
// got no response means the response was lost, and the requester rewinds to it.
#include <cstring>

#include "transport/engine.h"
#include "transport/states.h"

namespace droce::transport {

using verbs::SendWqe;
using verbs::WcStatus;
using verbs::WqeState;
using verbs::WrOpcode;
using wire::psn_add;

namespace {

inline bool is_rd_atomic(WrOpcode o) noexcept {
  return o == WrOpcode::RdmaRead || o == WrOpcode::AtomicCmpSwp || o == WrOpcode::AtomicFetchAdd;
}

// Congestion window (EngineConfig::min/max_inflight_pkts): grows by the PSNs
// acknowledged while below ssthresh (slow start), then by one PSN per window
// acknowledged, up to the configured maximum. O(1), no state per packet.
void window_grow(Engine& e, Qp& q, uint32_t acked) noexcept {
  const uint32_t max = e.config().max_inflight_pkts;
  uint32_t w = q.req.cwnd;
  if (w >= max || acked == 0) return;
  if (w < q.comp.ssthresh) {
    w = acked >= max - w ? max : w + acked;
  } else {
    q.comp.cwnd_acc += acked;
    if (q.comp.cwnd_acc >= w) {
      const uint32_t add = q.comp.cwnd_acc / w;
      q.comp.cwnd_acc -= add * w;
      w = add >= max - w ? max : w + add;
    }
  }
  q.req.cwnd = w;
}

// A loss: halve the window (NAK sequence error, lost response) or, after a
// local ACK timeout, drop it to the minimum; slow start then runs up to half
// the window the loss happened at.
void window_cut(Engine& e, Qp& q, bool timeout) noexcept {
  const uint32_t min = e.config().min_inflight_pkts;
  if (min >= e.config().max_inflight_pkts) return;  // fixed window
  const uint32_t half = q.req.cwnd / 2 > min ? q.req.cwnd / 2 : min;
  q.comp.ssthresh = half;
  q.req.cwnd = timeout ? min : half;
  q.comp.cwnd_acc = 0;
  e.count(Ctr::WindowCuts);
}

// comp.psn moved forward from `from`.
void progress(Engine& e, Qp& q, uint32_t from) noexcept {
  const int32_t acked = wire::psn_diff(q.comp.psn, from);
  if (acked > 0) window_grow(e, q, static_cast<uint32_t>(acked));
  q.comp.retry_left = q.attr.retry_cnt;
  q.comp.rnr_left = q.attr.rnr_retry;
  q.comp.last_retry_psn = 0xFFFFFFFF;
  q.comp.tails = 0;
  const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
  q.comp.deadline = (to && wire::psn_lt(q.comp.psn, q.req.next_new_psn)) ? e.now() + to : 0;
  e.timer_arm(q);
  if (q.req.idx != q.sq.head) e.req_ready(q);
}

void wqe_done(Qp& q, SendWqe& w, WcStatus s) noexcept {
  if (w.state == WqeState::Done) return;
  w.status = s;
  w.state = WqeState::Done;
  if (is_rd_atomic(w.wr.opcode) && q.req.rd_atomic_out > 0) --q.req.rd_atomic_out;
}

// Rewinds to psn once per PSN (duplicate NAKs or coalesced ACKs do not rewind twice).
void retry_from(Engine& e, Qp& q, uint32_t psn) noexcept {
  if (q.comp.last_retry_psn == psn) return;
  q.comp.last_retry_psn = psn;
  window_cut(e, q, false);
  requester_rewind(e, q, psn);
}

constexpr uint32_t kNoRewind = 0xFFFFFFFF;
// A READ response this many PSNs past the expected one or fewer means lost packets.
constexpr int32_t kReadGapNear = 8;

// Everything up to and including `last` is acknowledged. Returns the PSN the
// requester was rewound to if a READ/atomic turned out unanswered, else kNoRewind.
uint32_t ack_through(Engine& e, Qp& q, uint32_t last) noexcept {
  if (wire::psn_lt(last, q.comp.psn)) return kNoRewind;  // nothing new
  uint32_t rewound = kNoRewind;
  bool moved = false;
  const uint32_t from = q.comp.psn;
  for (uint32_t i = q.sq.tail; i != q.sq.head; ++i) {
    SendWqe& w = q.sq.at(i);
    if (w.state == WqeState::Posted) break;
    if (w.state == WqeState::Done) continue;
    if (wire::psn_lt(last, w.first_psn)) break;
    if (is_rd_atomic(w.wr.opcode)) {
      // IBTA 9.7 (implied NAK): the responder answered a later request, so this READ's or
      // atomic's response was lost: ask again.
      const uint32_t resume = psn_add(w.first_psn, w.read_pkts_done);
      if (wire::psn_gt(resume, q.comp.psn)) {
        q.comp.psn = resume;
        moved = true;
      }
      retry_from(e, q, resume);
      rewound = resume;
      break;
    }
    if (wire::psn_lt(last, w.last_psn)) {  // part of a multi-packet message
      q.comp.psn = psn_add(last, 1);
      moved = true;
      break;
    }
    wqe_done(q, w, WcStatus::Success);
    q.comp.psn = psn_add(w.last_psn, 1);
    moved = true;
  }
  if (moved) progress(e, q, from);
  return rewound;
}

}  // namespace

uint64_t tail_deadline(const EngineConfig& c, const Qp& q) noexcept {
  if (c.tail_timeout_ns == 0 || q.comp.tails >= kMaxTailResends || q.comp.deadline == 0 || q.comp.rnr_wait)
    return 0;
  if (!wire::psn_lt(q.comp.psn, q.req.next_new_psn)) return 0;  // nothing unacknowledged
  const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
  const uint64_t after = c.tail_timeout_ns * ((uint64_t{2} << q.comp.tails) - 1);
  return after < to ? q.comp.deadline - to + after : 0;
}

namespace {

// The first WQE not yet done whose PSN range reaches psn (the one a NAK is about).
SendWqe* wqe_at(Qp& q, uint32_t psn) noexcept {
  for (uint32_t i = q.sq.tail; i != q.sq.head; ++i) {
    SendWqe& w = q.sq.at(i);
    if (w.state == WqeState::Posted) return nullptr;
    if (w.state == WqeState::Done) continue;
    if (wire::psn_le(psn, w.last_psn)) return &w;
  }
  return nullptr;
}

CompSt on_read_resp(Engine& e, Qp& q, const wire::PacketView& pkt) noexcept {
  const uint32_t psn = pkt.h.bth.psn;
  const uint32_t from = q.comp.psn;
  for (uint32_t i = q.sq.tail; i != q.sq.head; ++i) {
    SendWqe& w = q.sq.at(i);
    if (w.state == WqeState::Posted) break;
    if (w.state == WqeState::Done) continue;
    if (w.wr.opcode != WrOpcode::RdmaRead) {
      if (wire::psn_gt(psn, w.last_psn) && !is_rd_atomic(w.wr.opcode)) {
        wqe_done(q, w, WcStatus::Success);  // implicitly acknowledged
        q.comp.psn = psn_add(w.last_psn, 1);
        continue;
      }
      if (wire::psn_gt(psn, w.last_psn)) retry_from(e, q, w.first_psn);  // atomic ACK lost
      return CompSt::Drop;
    }
    const uint32_t expected = psn_add(w.first_psn, w.read_pkts_done);
    if (wire::psn_gt(psn, w.last_psn)) {  // a later READ answered: this one's responses were lost
      retry_from(e, q, expected);
      return CompSt::Drop;
    }
    if (psn != expected) {
      // A response of this READ out of order: the responder is alive, possibly still
      // streaming the answer to an earlier copy of the request (rxe answers every copy
      // in full): restart the ACK timer without restoring the retry count, so retries
      // are spent only on silence. Re-request on a gap just ahead of `expected` (a
      // lost packet); a packet far ahead is taken as part of such an earlier stream
      // (re-requesting on each would add one more stream per packet); the timer
      // covers a long burst of losses.
      const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
      if (to) q.comp.deadline = e.now() + to;
      e.timer_arm(q);
      if (wire::psn_gt(psn, expected) && wire::psn_diff(psn, expected) <= kReadGapNear) retry_from(e, q, expected);
      return CompSt::Drop;
    }
    const uint32_t off = w.read_pkts_done * q.mtu;
    const uint32_t want = w.length - off < q.mtu ? w.length - off : q.mtu;
    if (pkt.payload_len != want) return CompSt::Drop;
    if (!scatter(e.mrs(), q.pd, w.wr.sg_list, w.wr.num_sge, off, pkt.payload(), pkt.payload_len)) {
      wqe_done(q, w, WcStatus::LocProtErr);
      return CompSt::Retire;
    }
    e.count(Ctr::ReadRespReceived);
    ++w.read_pkts_done;
    q.comp.psn = psn_add(psn, 1);
    if (w.read_pkts_done == w.npkts) wqe_done(q, w, WcStatus::Success);
    progress(e, q, from);
    return CompSt::Retire;
  }
  return CompSt::Drop;
}

CompSt on_atomic_ack(Engine& e, Qp& q, const wire::PacketView& pkt) noexcept {
  const uint32_t psn = pkt.h.bth.psn;
  const uint32_t from = q.comp.psn;
  for (uint32_t i = q.sq.tail; i != q.sq.head; ++i) {
    SendWqe& w = q.sq.at(i);
    if (w.state == WqeState::Posted) break;
    if (w.state == WqeState::Done) continue;
    if (!is_rd_atomic(w.wr.opcode)) {
      if (wire::psn_gt(psn, w.last_psn)) {
        wqe_done(q, w, WcStatus::Success);
        q.comp.psn = psn_add(w.last_psn, 1);
        continue;
      }
      return CompSt::Drop;
    }
    if (w.first_psn != psn || w.wr.opcode == WrOpcode::RdmaRead) {
      if (wire::psn_gt(psn, w.last_psn)) retry_from(e, q, psn_add(w.first_psn, w.read_pkts_done));
      return CompSt::Drop;
    }
    const uint64_t orig = pkt.h.ext.atomic_orig;  // stored in host order, like a CPU atomic would
    uint8_t bytes[8];
    std::memcpy(bytes, &orig, 8);
    if (!scatter(e.mrs(), q.pd, w.wr.sg_list, w.wr.num_sge, 0, bytes, 8)) {
      wqe_done(q, w, WcStatus::LocProtErr);
      return CompSt::Retire;
    }
    w.atomic_orig = orig;
    wqe_done(q, w, WcStatus::Success);
    q.comp.psn = psn_add(psn, 1);
    progress(e, q, from);
    return CompSt::Retire;
  }
  return CompSt::Drop;
}

// Selective repeat: a SACK (README). BTH PSN = the responder's expected PSN
// (everything below received), AETH MSN = base PSN of a 64-PSN chunk, the
// AtomicAckETH = which PSNs of [base, base + 64) it holds.
void on_sack(Engine& e, Qp& q, const wire::PacketView& pkt) noexcept {
  const uint32_t epsn = pkt.h.bth.psn;
  if (!q.sr || !q.rts_like() || wire::psn_lt(epsn, q.comp.psn) || wire::psn_ge(epsn, q.req.next_new_psn)) {
    e.count(Ctr::GhostResponse);  // stale (overtaken by later acknowledgements) or for nothing sent
    return;
  }
  e.count(Ctr::SrSackReceived);
  ++q.ctr.sr_sacks_received;
  if (wire::psn_gt(epsn, q.comp.psn) && ack_through(e, q, psn_add(epsn, 0xFFFFFF)) != kNoRewind)
    return;  // a READ/atomic went unanswered: go-back-N from it (scoreboard cleared)
  SrState& s = q.sr->req;
  if (s.episode && !wire::psn_lt(q.comp.psn, s.high) && wire::psn_gt(q.comp.psn, s.missing))
    s.episode = false;  // the last loss is repaired: this SACK starts a new one
  if (!s.episode) {
    s.episode = true;
    s.held.reset();
    s.resent.reset();
    s.lo = s.high = q.comp.psn;
    window_cut(e, q, false);  // once per loss episode, as a NAK does for go-back-N
  } else {
    // Forget PSNs acknowledged since (the ring bitmaps cover kSrWindow PSNs from lo).
    const int32_t d = wire::psn_diff(q.comp.psn, s.lo);
    if (d >= static_cast<int32_t>(kSrWindow)) {
      s.held.reset();
      s.resent.reset();
    } else {
      for (int32_t k = 0; k < d; ++k) {
        s.held.clear(psn_add(s.lo, static_cast<uint32_t>(k)));
        s.resent.clear(psn_add(s.lo, static_cast<uint32_t>(k)));
      }
    }
    if (d > 0) s.lo = q.comp.psn;
    if (wire::psn_lt(s.high, s.lo)) s.high = s.lo;
  }
  s.missing = epsn;
  const uint32_t base = pkt.h.ext.aeth.msn & wire::kMask24;
  const uint64_t bits = pkt.h.ext.atomic_orig;
  bool after_mark = false;
  for (uint32_t j = 0; j < 64; ++j) {
    if (!((bits >> j) & 1)) continue;
    const uint32_t p = psn_add(base, j);
    const int32_t off = wire::psn_diff(p, s.lo);
    if (off <= 0 || off >= static_cast<int32_t>(kSrWindow) || !wire::psn_lt(p, q.req.next_new_psn)) continue;
    s.held.set(p);
    if (!wire::psn_lt(p, s.high)) s.high = psn_add(p, 1);
    after_mark |= s.marked && wire::psn_ge(p, s.mark);
  }
  if (after_mark) {
    // The responder holds a packet first sent after our last resends, yet
    // still misses some of them: on a link that keeps order they were lost
    // again, so they may go once more (without waiting for the ACK timeout).
    s.marked = false;
    for (uint32_t p = s.lo, n = 0; wire::psn_lt(p, s.mark) && n < kSrWindow; p = psn_add(p, 1), ++n)
      if (s.resent.test(p) && !s.held.test(p)) s.resent.clear(p);
  }
  s.pending = true;
  // The responder is alive and taking packets: the ACK timer restarts (the
  // retry count is not restored: a lost resend ends in a timeout and go-back-N).
  const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
  if (to) q.comp.deadline = e.now() + to;
  e.timer_arm(q);
  e.req_ready(q);
}

}  // namespace

void completer_retire(Engine& e, Qp& q) noexcept {
  while (!q.sq.empty()) {
    SendWqe& w = q.sq.at(q.sq.tail);
    if (w.state != WqeState::Done) break;
    const bool sig = q.sq_sig_all || (w.wr.send_flags & verbs::kSendSignaled) || w.status != WcStatus::Success;
    if (sig) {
      verbs::Wc wc;
      wc.wr_id = w.wr.wr_id;
      wc.status = w.status;
      wc.opcode = wc_opcode_of(w.wr.opcode);
      wc.byte_len = w.length;
      wc.qp_num = q.qpn;
      e.complete(q.send_cq, wc);
    }
    if (q.req.idx == q.sq.tail) {  // the requester was about to resend it: move past
      ++q.req.idx;
      const uint32_t after = psn_add(w.last_psn, 1);
      if (w.npkts && wire::psn_lt(q.req.psn, after)) q.req.psn = after;
    }
    ++q.sq.tail;
    if (w.status != WcStatus::Success) {
      q.req.halted = false;  // a failed local operation (requester.cc) is reported now
      // IBTA ch. 10: a completion error moves an RC QP to ERR; UC/UD send errors to SQE.
      if (q.type == verbs::QpType::RC) {
        e.qp_to_error(q);
      } else {
        e.sq_to_error(q);
      }
      return;
    }
  }
}

void completer_rx(Engine& e, Qp& q, const wire::PacketView& pkt) noexcept {
  const uint32_t psn = pkt.h.bth.psn;
  const wire::OpcodeInfo& op = *pkt.op;
  const uint8_t syn = pkt.h.ext.aeth.syndrome;
  if ((pkt.h.bth.resv7 & kSrMark) && pkt.h.bth.opcode == wire::op::RC_ATOMIC_ACKNOWLEDGE &&
      q.type == verbs::QpType::RC) {
    on_sack(e, q, pkt);  // only a droce peer we marked requests to sends these
    completer_retire(e, q);
    return;
  }
  CompSt st = CompSt::CheckPsn;
  while (st != CompSt::Done) {
    switch (st) {
      case CompSt::CheckPsn:
        // Only RC has responses; a response must be for a PSN that was sent and not yet acknowledged.
        if (q.type != verbs::QpType::RC || !q.rts_like() || wire::psn_ge(psn, q.req.next_new_psn) ||
            (wire::psn_lt(psn, q.comp.psn) &&
             !((op.flags & wire::kOpAck) && (syn & wire::kAethKindMask) == wire::kAethAck))) {
          st = CompSt::Drop;
          break;
        }
        if (op.flags & wire::kOpAck) {
          const uint8_t kind = syn & wire::kAethKindMask;
          st = kind == wire::kAethAck ? CompSt::Ack : kind == wire::kAethRnrNak ? CompSt::RnrNak
               : kind == wire::kAethNak ? CompSt::Nak : CompSt::Drop;
        } else if (op.flags & wire::kOpRead) {
          st = CompSt::ReadResp;
        } else {
          st = CompSt::AtomicAck;
        }
        break;

      case CompSt::Ack:
        e.count(Ctr::AcksReceived);
        ack_through(e, q, psn);
        st = CompSt::Retire;
        break;

      case CompSt::ReadResp:
        st = on_read_resp(e, q, pkt);
        break;

      case CompSt::AtomicAck:
        st = on_atomic_ack(e, q, pkt);
        break;

      case CompSt::RnrNak: {
        e.count(Ctr::RnrNakReceived);
        ++q.ctr.rnr_naks_received;
        const uint32_t rewound = ack_through(e, q, psn_add(psn, 0xFFFFFF));  // everything before psn
        SendWqe* w = wqe_at(q, psn);
        if (!w) {
          st = CompSt::Drop;
          break;
        }
        if (q.comp.rnr_left == 0) {
          e.count(Ctr::RnrRetryExceeded);
          wqe_done(q, *w, WcStatus::RnrRetryExcErr);
          st = CompSt::Retire;
          break;
        }
        if (q.comp.rnr_left != 7) --q.comp.rnr_left;  // 7 = retry forever
        // Wait at least the responder's timer (IBTA 9.7), then resend from psn.
        q.comp.last_retry_psn = 0xFFFFFFFF;
        // Resend from psn, or from an earlier unanswered READ/atomic.
        requester_rewind(e, q, rewound != kNoRewind ? rewound : psn);
        q.comp.rnr_wait = true;
        q.comp.rnr_until = e.now() + verbs::rnr_timer_ns(syn & 0x1F);
        q.comp.deadline = 0;
        e.timer_arm(q);
        st = CompSt::Retire;
        break;
      }

      case CompSt::Nak: {
        const uint8_t code = syn & 0x1F;
        const uint32_t rewound = ack_through(e, q, psn_add(psn, 0xFFFFFF));
        if (code == wire::kNakPsnSeqError) {
          e.count(Ctr::SeqNakReceived);
          ++q.ctr.seq_naks_received;
          if (q.req.sr_tx && !(pkt.h.bth.resv7 & kSrMark)) {
            // A plain NAK to a marked request: the peer does not run selective
            // repeat (it ignored the mark): stop marking, go-back-N from here on.
            const SendWqe* m = wqe_at(q, psn);
            if (m && m->sr) {
              q.req.sr_tx = false;
              e.count(Ctr::SrFallbacks);
            }
          }
          // Already going back to psn, or to an earlier unanswered READ/atomic (which covers psn).
          if (q.comp.last_retry_psn == psn || rewound != kNoRewind) {
            st = CompSt::Retire;
            break;
          }
          SendWqe* w = wqe_at(q, psn);
          if (w && q.comp.retry_left == 0) {
            e.count(Ctr::RetryExceeded);
            wqe_done(q, *w, WcStatus::RetryExcErr);
          } else if (w) {
            --q.comp.retry_left;
            retry_from(e, q, psn);
          }
          st = CompSt::Retire;
          break;
        }
        e.count(Ctr::ErrNakReceived);
        ++q.ctr.err_naks_received;
        SendWqe* w = wqe_at(q, psn);
        if (w) {
          wqe_done(q, *w,
                   code == wire::kNakRemoteAccessError        ? WcStatus::RemAccessErr
                   : code == wire::kNakRemoteOperationalError ? WcStatus::RemOpErr
                                                              : WcStatus::RemInvReqErr);
        }
        st = CompSt::Retire;
        break;
      }

      case CompSt::Retire:
        completer_retire(e, q);
        st = CompSt::Done;
        break;

      case CompSt::Drop:
        e.count(Ctr::GhostResponse);
        st = CompSt::Done;
        break;

      case CompSt::Done:
      case CompSt::kCount:
        break;
    }
  }
}

void completer_timer(Engine& e, Qp& q, uint64_t now) noexcept {
  if (q.comp.rnr_wait) {
    if (now < q.comp.rnr_until) return;
    q.comp.rnr_wait = false;
    const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
    q.comp.deadline = to ? now + to : 0;
    e.req_ready(q);
    return;
  }
  const bool outstanding = wire::psn_lt(q.comp.psn, q.req.next_new_psn);
  if (!outstanding) {
    q.comp.deadline = 0;
    if (q.req.idx != q.sq.head) e.req_ready(q);
    return;
  }
  const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
  if (to == 0) return;  // timeout 0: wait forever
  if (q.comp.deadline == 0) {
    q.comp.deadline = now + to;
    return;
  }
  if (now < q.comp.deadline) {
    // The tail-loss probe (EngineConfig::tail_timeout_ns): the last packet
    // sent goes again, without spending a retry, cutting the window or
    // moving the ACK deadline (a silent peer fails when it did before). The
    // responder ACKs it as a duplicate when it had everything (the ACK was
    // lost), takes it when it was the one lost, or NAKs it when earlier ones
    // were: each ends in the usual ACK or go-back-N.
    const uint64_t t = tail_deadline(e.config(), q);
    if (t == 0 || now < t || !wqe_at(q, q.comp.psn)) return;
    ++q.comp.tails;
    e.count(Ctr::TailRetransmits);
    q.comp.last_retry_psn = 0xFFFFFFFF;
    const uint64_t deadline = q.comp.deadline;
    requester_rewind(e, q, psn_add(q.req.next_new_psn, wire::kMask24));  // the last PSN sent
    q.comp.deadline = deadline;
    e.timer_arm(q);
    return;
  }
  e.count(Ctr::AckTimeouts);
  ++q.ctr.timeouts;
  SendWqe* w = wqe_at(q, q.comp.psn);
  if (!w) {
    q.comp.deadline = now + to;
    return;
  }
  if (q.comp.retry_left == 0) {
    e.count(Ctr::RetryExceeded);
    wqe_done(q, *w, WcStatus::RetryExcErr);
    completer_retire(e, q);
    return;
  }
  --q.comp.retry_left;
  q.comp.last_retry_psn = 0xFFFFFFFF;
  window_cut(e, q, true);
  requester_rewind(e, q, q.comp.psn);
}

}  // namespace droce::transport

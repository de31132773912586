// Responder: incoming requests -> placement, read responses, atomics, ACK/NAK
// (IBTA 9.7, 9.8; cf. rxe_resp.c).
//
// RC/UC packets run through an explicit state machine:
//   CheckPsn -> CheckOpSeq -> CheckLength -> CheckResource -> CheckRkey
//     -> Execute -> Complete -> Acknowledge -> Done
// with side exits Duplicate (re-ACK SEND/WRITE, re-execute READ, replay atomic),
// ErrNakSeq, ErrRnr, ErrInvReq, ErrRemAccess, ErrRemOp, ErrLength, DropMsg.
// Class C errors (RC) send a NAK and move the QP to ERR; UC drops the message.
// UD packets take a short path (Q_Key, receive WQE, GRH + payload).
//
// Output (responder_tx) is ordered: responses of READ/atomic resources in
// PSN order, then the one coalesced ACK/NAK.
#include <endian.h>

#include <atomic>
#include <cstring>

#include "transport/engine.h"
#include "transport/states.h"

namespace droce::transport {

using verbs::QpType;
using verbs::WcStatus;
using wire::psn_add;
using wire::psn_diff;

namespace {

struct Ctx {
  Engine& e;
  Qp& q;
  const wire::PacketView& pkt;
  const wire::OpcodeInfo& op;
  uint32_t psn;
  bool rc;
  uint8_t* host = nullptr;  // rkey-checked target (WRITE FIRST/ONLY, READ, atomic)
  void* dma = nullptr;      // READ: the MR's zero-copy handle
};

constexpr uint8_t kAckSyndrome = wire::kAethAck | wire::kAethCreditInvalid;

void queue_ack(Engine& e, Qp& q, uint8_t syndrome, uint32_t psn) noexcept {
  const bool pending_nak = q.resp.ack_pending && (q.resp.ack_syndrome & wire::kAethKindMask) != wire::kAethAck;
  if (pending_nak && (syndrome & wire::kAethKindMask) == wire::kAethAck && psn_diff(psn, q.resp.ack_psn) < 0)
    return;  // keep the NAK: a re-ACK of old PSNs must not hide it
  q.resp.ack_pending = true;
  q.resp.ack_syndrome = syndrome;
  q.resp.ack_psn = psn;
  q.resp.ack_sr = false;
  e.resp_ready(q);
}

bool take_recv(Qp& q) noexcept {
  if (q.resp.have_recv) return true;
  if (q.srq) {
    verbs::RecvWqe* w = q.srq->front();
    if (!w) return false;
    q.resp.recv = *w;
    q.srq->pop();
  } else {
    if (q.rq.empty()) return false;
    q.resp.recv = q.rq.at(q.rq.tail);
    ++q.rq.tail;
  }
  q.resp.have_recv = true;
  q.resp.recv_off = 0;
  return true;
}

void recv_complete(Engine& e, Qp& q, WcStatus s, uint32_t byte_len, uint8_t flags, uint32_t imm, uint32_t src_qp) noexcept {
  verbs::Wc wc;
  wc.wr_id = q.resp.recv.wr_id;
  wc.status = s;
  wc.opcode = verbs::WcOpcode::Recv;
  wc.byte_len = byte_len;
  wc.wc_flags = flags;
  wc.imm_data = imm;
  wc.qp_num = q.qpn;
  wc.src_qp = src_qp;
  e.complete(q.recv_cq, wc);
  q.resp.have_recv = false;
}

inline bool needs_recv(const wire::OpcodeInfo& op) noexcept {
  // SEND FIRST/ONLY take the receive WQE; WRITE with immediate consumes one at its LAST/ONLY.
  return ((op.flags & wire::kOpSend) && op.is_first()) || ((op.flags & wire::kOpWrite) && (op.flags & wire::kOpImm));
}

RespSt check_psn(Ctx& c) noexcept {
  RespState& r = c.q.resp;
  const int32_t d = psn_diff(c.psn, r.psn);
  if (!c.rc) {
    // UC (IBTA 9.7, as rxe): a PSN gap loses the message in progress. Only the
    // FIRST or ONLY packet of a message resynchronises the expected PSN; a
    // MIDDLE/LAST with an unexpected PSN is dropped and moves nothing, so the
    // rest of a lost message cannot pose as the start of one.
    if (d != 0) {
      if (r.in_msg) {
        r.in_msg = false;
        c.e.count(Ctr::UcMsgDropped);
      }
      if (!c.op.is_first()) return RespSt::Done;
      r.psn = c.psn;
    }
    return RespSt::CheckOpSeq;
  }
  if (d > 0) return RespSt::ErrNakSeq;
  if (d < 0) return RespSt::Duplicate;
  r.nak_sent = false;
  r.sr_nak_sent = false;
  return RespSt::CheckOpSeq;
}

RespSt check_op_seq(Ctx& c) noexcept {
  RespState& r = c.q.resp;
  const bool first = c.op.is_first();
  if (r.in_msg) {
    const bool same = r.in_write ? (c.op.flags & wire::kOpWrite) : (c.op.flags & wire::kOpSend);
    if (!first && same) return RespSt::CheckLength;
    if (c.rc) return RespSt::ErrInvReq;  // opcode sequence error: NAK invalid request (class C)
    r.in_msg = false;                    // UC: the old message is lost
    c.e.count(Ctr::UcMsgDropped);
    return first ? RespSt::CheckLength : RespSt::DropMsg;
  }
  if (first) return RespSt::CheckLength;
  return c.rc ? RespSt::ErrInvReq : RespSt::DropMsg;
}

RespSt check_length_of(Ctx& c) noexcept {
  const uint32_t mtu = c.q.mtu;
  const uint32_t plen = c.pkt.payload_len;
  const uint32_t f = c.op.flags;
  if (f & wire::kOpPayload) {
    const bool first = c.op.is_first(), last = c.op.is_last();
    if (!last && plen != mtu) return RespSt::ErrInvReq;  // FIRST/MIDDLE carry exactly one MTU
    if (plen > mtu) return RespSt::ErrInvReq;
    if (last && !first && plen == 0) return RespSt::ErrInvReq;
    if ((f & wire::kOpWrite) && first) {
      const uint32_t len = c.pkt.h.ext.reth.len;
      if (last ? plen != len : len <= mtu) return RespSt::ErrInvReq;
    }
  }
  if ((f & wire::kOpRead) && c.pkt.h.ext.reth.len > verbs::kMaxMsgSize) return RespSt::ErrInvReq;
  return RespSt::CheckResource;
}

// Counted where the length is found wrong (RC: NAK, UC: message dropped).
RespSt check_length(Ctx& c) noexcept {
  const RespSt st = check_length_of(c);
  if (st == RespSt::ErrInvReq) c.e.count(Ctr::RxBadLength);
  return st;
}

RespSt check_resource(Ctx& c) noexcept {
  Qp& q = c.q;
  if (needs_recv(c.op)) {
    if (!take_recv(q)) return c.rc ? RespSt::ErrRnr : RespSt::DropMsg;
    if (c.op.flags & wire::kOpSend) q.resp.recv_off = 0;  // a new message starts at byte 0
  }
  if (c.op.flags & (wire::kOpRead | wire::kOpAtomic)) {
    // The slot of the request max_dest_rd_atomic before this one. Still owing its
    // original response: the requester has more outstanding than max_dest_rd_atomic.
    // Only replaying it for a duplicate: the requester completed that request before
    // it could send this one (max_rd_atomic <= max_dest_rd_atomic), so execute()
    // retires it: the responder keeps the max_dest_rd_atomic newest READ/atomic
    // resources (IBTA 9.7.5; rxe frees the oldest resource for each new one).
    if (q.attr.max_dest_rd_atomic == 0 || q.resp.res_cap < q.attr.max_dest_rd_atomic)
      return RespSt::ErrInvReq;  // no responder resources at all (a CM may negotiate 0)
    const RespResource& slot = q.resp.res[q.resp.res_next % q.attr.max_dest_rd_atomic];
    if (slot.active && !slot.replay) return RespSt::ErrInvReq;  // more outstanding than max_dest_rd_atomic
  }
  return RespSt::CheckRkey;
}

RespSt check_rkey_of(Ctx& c, verbs::MrError& err) noexcept {
  Qp& q = c.q;
  const uint32_t f = c.op.flags;
  const auto& x = c.pkt.h.ext;
  if ((f & wire::kOpWrite) && c.op.is_first()) {
    if (!(q.attr.qp_access_flags & verbs::kAccessRemoteWrite)) return RespSt::ErrRemAccess;
    if (x.reth.len == 0) return RespSt::Execute;  // zero-length: no key check (IBTA 9.4)
    c.host = c.e.rkey_lookup(x.reth.rkey, q, x.reth.va, x.reth.len, verbs::kAccessRemoteWrite, &err);
    return c.host ? RespSt::Execute : RespSt::ErrRemAccess;
  }
  if (f & wire::kOpRead) {
    if (!(q.attr.qp_access_flags & verbs::kAccessRemoteRead)) return RespSt::ErrRemAccess;
    if (x.reth.len == 0) return RespSt::Execute;
    c.host = c.e.rkey_lookup(x.reth.rkey, q, x.reth.va, x.reth.len, verbs::kAccessRemoteRead, &err, &c.dma);
    return c.host ? RespSt::Execute : RespSt::ErrRemAccess;
  }
  if (f & wire::kOpAtomic) {
    if (x.atomic.va & 7) {  // misaligned atomic (IBTA 9.4)
      err = verbs::MrError::OutOfBounds;
      return RespSt::ErrInvReq;
    }
    if (!(q.attr.qp_access_flags & verbs::kAccessRemoteAtomic)) return RespSt::ErrRemAccess;
    c.host = c.e.rkey_lookup(x.atomic.rkey, q, x.atomic.va, 8, verbs::kAccessRemoteAtomic, &err);
    if (!c.host) return RespSt::ErrRemAccess;
    // An MR registered with an iova of another alignment than its host address:
    // no atomic instruction can serve it (IBTA 9.4: invalid request).
    if (reinterpret_cast<uintptr_t>(c.host) & 7) {
      err = verbs::MrError::OutOfBounds;
      return RespSt::ErrInvReq;
    }
    return RespSt::Execute;
  }
  return RespSt::Execute;
}

// Counted by reason where the key check fails: a wrong key (or access) vs a
// VA outside the MR.
RespSt check_rkey(Ctx& c) noexcept {
  verbs::MrError err = verbs::MrError::NoAccess;  // the QP's access flags refuse it
  const RespSt st = check_rkey_of(c, err);
  if (st == RespSt::ErrRemAccess || st == RespSt::ErrInvReq)
    c.e.count(err == verbs::MrError::OutOfBounds ? Ctr::RxBadVa : Ctr::RxBadRkey);
  return st;
}

void queue_resource(Qp& q, uint32_t idx) noexcept {
  q.resp.emit_q[q.resp.emit_head++ % verbs::kMaxRdAtomic] = static_cast<uint8_t>(idx);
}

// Drop a resource's place in the send FIFO (it is being reused): its stale entry
// must not send the new response ahead of older ones. At most kMaxRdAtomic entries.
void unqueue_resource(Qp& q, uint32_t idx) noexcept {
  RespState& r = q.resp;
  uint32_t w = r.emit_tail;
  for (uint32_t i = r.emit_tail; i != r.emit_head; ++i) {
    const uint8_t v = r.emit_q[i % verbs::kMaxRdAtomic];
    if (v != idx) r.emit_q[w++ % verbs::kMaxRdAtomic] = v;
  }
  r.emit_head = w;
}

RespSt execute(Ctx& c) noexcept {
  Qp& q = c.q;
  RespState& r = q.resp;
  const uint32_t f = c.op.flags;
  const auto& x = c.pkt.h.ext;
  const uint32_t plen = c.pkt.payload_len;
  if (f & wire::kOpSend) {
    if (r.recv_off + uint64_t{plen} > r.recv.length) {
      c.e.count(Ctr::RxBadLength);
      return RespSt::ErrLength;
    }
    if (!scatter(c.e.mrs(), q.pd, r.recv.sge, r.recv.num_sge, r.recv_off, c.pkt.payload(), plen))
      return RespSt::ErrRemOp;  // malformed receive WQE
    r.recv_off += plen;
    r.in_msg = !c.op.is_last();
    r.in_write = false;
    return RespSt::Complete;
  }
  if (f & wire::kOpWrite) {
    if (c.op.is_first()) {
      r.write_rkey = x.reth.rkey;
      r.write_va = x.reth.va;
      r.write_len = x.reth.len;
      r.write_off = 0;
    }
    if (r.write_off + uint64_t{plen} > r.write_len) {
      c.e.count(Ctr::RxBadLength);
      return RespSt::ErrInvReq;
    }
    if (plen) {
      // FIRST/ONLY: checked in check_rkey; later packets: the key again (one O(1)
      // lookup), since the MR may have been deregistered since the FIRST.
      uint8_t* dst = c.op.is_first() ? c.host
                                     : c.e.rkey_lookup(r.write_rkey, q, r.write_va + r.write_off, plen,
                                                       verbs::kAccessRemoteWrite, nullptr);
      if (!dst) {
        c.e.count(Ctr::RespMrGone);
        return RespSt::ErrRemAccess;
      }
      std::memcpy(dst, c.pkt.payload(), plen);
    }
    r.write_off += plen;
    r.in_msg = !c.op.is_last();
    r.in_write = r.in_msg;
    if (c.op.is_last() && r.write_off != r.write_len) {
      c.e.count(Ctr::RxBadLength);
      return RespSt::ErrInvReq;
    }
    return RespSt::Complete;
  }
  const uint32_t n = q.attr.max_dest_rd_atomic;
  const uint32_t idx = r.res_next++ % n;
  RespResource& res = r.res[idx];
  if (res.active) unqueue_resource(q, idx);  // a replay the requester no longer needs (check_resource)
  res = RespResource{};
  res.first_psn = c.psn;
  res.cur_psn = c.psn;
  res.active = true;
  if (f & wire::kOpRead) {
    const uint32_t npkts = x.reth.len ? static_cast<uint32_t>((uint64_t{x.reth.len} + q.mtu - 1) / q.mtu) : 1;
    res.kind = 1;
    res.last_psn = psn_add(c.psn, npkts - 1);
    res.va = x.reth.va;
    res.rkey = x.reth.rkey;
    res.resid = x.reth.len;
    res.cur_psn = c.psn;
    r.psn = psn_add(res.last_psn, 1);
  } else {
    // A real atomic instruction on the 8 bytes: the memory may be shared with the
    // owning process (shim clients map it too) and with QPs of other cores.
    auto* word = reinterpret_cast<uint64_t*>(c.host);
    std::atomic_ref<uint64_t> a(*word);
    uint64_t orig;
    if (c.pkt.h.bth.opcode == wire::op::RC_COMPARE_SWAP) {
      orig = x.atomic.compare;
      a.compare_exchange_strong(orig, x.atomic.swap_add, std::memory_order_acq_rel);  // orig: the old value
    } else {
      orig = a.fetch_add(x.atomic.swap_add, std::memory_order_acq_rel);
    }
    res.kind = 2;
    res.last_psn = c.psn;
    res.orig = orig;
    c.e.count(Ctr::AtomicExecuted);
    r.psn = psn_add(c.psn, 1);
  }
  r.msn = (r.msn + 1) & wire::kMask24;
  res.msn = r.msn;  // its responses carry the MSN of this request, whatever completes after it
  queue_resource(q, idx);
  // Responses acknowledge everything before them: an older pending ACK is moot.
  if (r.ack_pending && (r.ack_syndrome & wire::kAethKindMask) == wire::kAethAck) r.ack_pending = false;
  c.e.resp_ready(q);
  return RespSt::Done;
}

RespSt complete(Ctx& c) noexcept {
  Qp& q = c.q;
  RespState& r = q.resp;
  // SEND with Invalidate: only a fast-registered MR or a bound type 2 window of
  // this PD may be invalidated (IBTA 10.6.7); otherwise the request is rejected
  // before PSN and MSN move (rxe: class J, receive WQE in error, QP to error).
  if (c.op.off_ieth && c.op.is_last() && !c.e.can_invalidate(c.pkt.h.ext.ieth_rkey, q.pd))
    return RespSt::ErrInvalidate;
  r.psn = psn_add(c.psn, 1);
  if (!c.op.is_last()) return c.rc ? RespSt::Acknowledge : RespSt::Done;
  r.msn = (r.msn + 1) & wire::kMask24;
  const auto& x = c.pkt.h.ext;
  if (c.op.flags & wire::kOpSend) {
    uint8_t flags = 0;
    uint32_t imm = 0;
    if (c.op.off_imm) {
      flags |= verbs::kWcWithImm;
      imm = htobe32(x.imm);  // ibv_wc.imm_data: network order
    }
    if (c.op.off_ieth) {
      c.e.invalidate(x.ieth_rkey, q.pd);  // checked above
      flags |= verbs::kWcWithInv;
      imm = x.ieth_rkey;
    }
    recv_complete(c.e, q, WcStatus::Success, r.recv_off, flags, imm, q.attr.dest_qp_num);
  } else if (c.op.off_imm) {  // WRITE with immediate
    verbs::Wc wc;
    wc.wr_id = r.recv.wr_id;
    wc.opcode = verbs::WcOpcode::RecvRdmaWithImm;
    wc.byte_len = r.write_len;
    wc.wc_flags = verbs::kWcWithImm;
    wc.imm_data = htobe32(x.imm);
    wc.qp_num = q.qpn;
    wc.src_qp = q.attr.dest_qp_num;
    c.e.complete(q.recv_cq, wc);
    r.have_recv = false;
  }
  return c.rc ? RespSt::Acknowledge : RespSt::Done;
}

RespSt duplicate(Ctx& c) noexcept {
  Qp& q = c.q;
  RespState& r = q.resp;
  c.e.count(Ctr::DupRequest);
  const uint32_t f = c.op.flags;
  if (f & (wire::kOpSend | wire::kOpWrite)) {
    // C9-105: acknowledge again, do not place twice.
    queue_ack(c.e, q, kAckSyndrome, psn_add(r.psn, 0xFFFFFF));
    return RespSt::Done;
  }
  const uint32_t n = q.attr.max_dest_rd_atomic;
  for (uint32_t i = 0; i < n; ++i) {
    RespResource& res = r.res[i];
    if (f & wire::kOpRead) {
      if (res.kind != 1 || psn_diff(c.psn, res.first_psn) < 0 || psn_diff(c.psn, res.last_psn) > 0) continue;
      // Re-execute from the PSN and RETH of the repeated request (IBTA 9.7).
      const auto& reth = c.pkt.h.ext.reth;
      if (reth.len && !c.e.rkey_lookup(reth.rkey, q, reth.va, reth.len, verbs::kAccessRemoteRead, nullptr))
        return RespSt::Done;
      const uint32_t npkts = reth.len ? static_cast<uint32_t>((uint64_t{reth.len} + q.mtu - 1) / q.mtu) : 1;
      if (psn_diff(psn_add(c.psn, npkts - 1), res.last_psn) != 0) return RespSt::Done;  // inconsistent retry
      const bool queued = res.active;
      res.va = reth.va;
      res.rkey = reth.rkey;
      res.resid = reth.len;
      res.cur_psn = c.psn;
      res.msn = r.msn;  // a re-executed READ answers with the current MSN (as rxe; C9-148)
      res.active = true;
      if (!queued) {
        res.replay = true;
        queue_resource(q, i);
      }
      c.e.count(Ctr::ReadReplayed);
      c.e.resp_ready(q);
      return RespSt::Done;
    }
    if (res.kind == 2 && res.first_psn == c.psn) {
      // Answer from the replay cache; never execute twice.
      if (!res.active) {
        res.active = true;
        res.replay = true;
        queue_resource(q, i);
      }
      c.e.count(Ctr::AtomicReplayed);
      c.e.resp_ready(q);
      return RespSt::Done;
    }
  }
  return RespSt::Done;  // too old to replay: drop
}

// Class C/D error for RC: NAK, then the QP goes to ERR (rxe do_class_ac_error).
void fatal_nak(Ctx& c, uint8_t code, WcStatus recv_status) noexcept {
  Qp& q = c.q;
  c.e.count(Ctr::ErrNakSent);
  ++q.ctr.err_naks_sent;
  queue_ack(c.e, q, static_cast<uint8_t>(wire::kAethNak | code), c.psn);
  if (q.resp.have_recv && recv_status != WcStatus::Success) recv_complete(c.e, q, recv_status, q.resp.recv_off, 0, 0, q.attr.dest_qp_num);
  c.e.qp_to_error(q, /*keep_responses=*/true);  // responses owed for earlier requests precede the NAK
}

RespSt drop_msg(Ctx& c) noexcept {
  // UC: lose the rest of this message; keep any receive WQE for the next one.
  c.q.resp.in_msg = false;
  c.q.resp.recv_off = 0;
  c.q.resp.psn = psn_add(c.psn, 1);
  c.e.count(Ctr::UcMsgDropped);
  return RespSt::Done;
}

// Selective repeat (README): a marked request ahead of the expected PSN. A
// WRITE ONLY without immediate inside the window is checked as in order and
// placed now, its PSN held; anything else is dropped with one marked go-back
// NAK per expected PSN. Either way the requester hears what is held (SACK).
void sr_ahead(Ctx& c, int32_t d) noexcept {
  Qp& q = c.q;
  RespState& r = q.resp;
  SrResp& x = q.sr->resp;
  const bool in_window = d <= static_cast<int32_t>(kSrWindow);
  if (in_window && r.sr_count && x.bits.test(c.psn)) {  // held already: never placed twice
    c.e.count(Ctr::SrDup);
    c.e.count(Ctr::DupRequest);
    r.sr_sack = true;
    c.e.resp_ready(q);
    return;
  }
  bool placed = false;
  if (in_window && c.pkt.h.bth.opcode == wire::op::RC_WRITE_ONLY && check_length_of(c) == RespSt::CheckResource) {
    verbs::MrError err = verbs::MrError::NoAccess;
    if (check_rkey_of(c, err) == RespSt::Execute) {
      if (c.pkt.payload_len) std::memcpy(c.host, c.pkt.payload(), c.pkt.payload_len);
      if (r.sr_count == 0) x.lo = r.psn;
      x.bits.set(c.psn);
      ++r.sr_count;
      x.dirty = static_cast<uint8_t>(x.dirty | (1u << ((d - 1) / 64)));
      c.e.count(Ctr::SrOooPlaced);
      ++c.q.ctr.sr_ooo_placed;
      placed = true;
    }
  }
  if (!placed) {  // refused here (a failed check is found again, and answered, in order)
    c.e.count(Ctr::OutOfSeqRequest);
    if (!r.sr_nak_sent) {
      r.sr_nak_sent = true;
      c.e.count(Ctr::SrGbnNakSent);
      queue_ack(c.e, q, wire::kAethNak | wire::kNakPsnSeqError, r.psn);
      r.ack_sr = true;
    }
    return;
  }
  r.sr_sack = true;
  c.e.resp_ready(q);
}

// After the in-order path moved the expected PSN: forget held PSNs it passed
// (a READ's range), then move over held PSNs that now follow in order (each a
// WRITE ONLY: one message), acknowledging the new expected PSN - 1.
void sr_advance(Engine& e, Qp& q) noexcept {
  RespState& r = q.resp;
  SrResp& x = q.sr->resp;
  const int32_t d = psn_diff(r.psn, x.lo);
  if (d >= static_cast<int32_t>(kSrWindow)) {
    x.bits.reset();
    r.sr_count = 0;
  } else {
    for (int32_t k = 0; k < d && r.sr_count; ++k) {
      const uint32_t p = psn_add(x.lo, static_cast<uint32_t>(k));
      if (x.bits.test(p)) {
        x.bits.clear(p);
        --r.sr_count;
      }
    }
  }
  bool moved = false;
  while (r.sr_count && x.bits.test(r.psn)) {
    x.bits.clear(r.psn);
    --r.sr_count;
    r.psn = psn_add(r.psn, 1);
    r.msn = (r.msn + 1) & wire::kMask24;
    moved = true;
  }
  x.lo = r.psn;
  if (!moved) return;
  r.nak_sent = r.sr_nak_sent = false;
  queue_ack(e, q, kAckSyndrome, psn_add(r.psn, 0xFFFFFF));
  if (r.sr_count) {  // more holes: tell the requester what is still held
    r.sr_sack = true;
    x.dirty = (1u << kSrWords) - 1;
  } else {
    r.sr_sack = false;
    x.dirty = 0;
  }
}

void ud_rx(Engine& e, Qp& q, const wire::PacketView& pkt) noexcept {
  if (pkt.h.ext.deth.qkey != q.attr.qkey) {  // Q_Key violation: silently drop (IBTA ch. 10)
    e.count(Ctr::UdQkeyDrop);
    return;
  }
  if (!take_recv(q)) {
    e.count(Ctr::UdNoRecvDrop);
    return;
  }
  const uint32_t plen = pkt.payload_len;
  const uint32_t src_qp = pkt.h.ext.deth.sqpn;
  if (uint64_t{plen} + verbs::kGrhBytes > q.resp.recv.length) {
    e.count(Ctr::UdLenDrop);
    recv_complete(e, q, WcStatus::LocLenErr, 0, 0, 0, src_qp);
    return;
  }
  // The GRH: an IPv6 header as is; for IPv4 the IPv4 header in its last 20 bytes (as rxe/mlx5).
  uint8_t grh[verbs::kGrhBytes] = {};
  const uint8_t* l3 = pkt.frame + pkt.l3_off;
  if (pkt.h.l3.ipv6) {
    std::memcpy(grh, l3, 40);
  } else {
    std::memcpy(grh + 20, l3, 20);
  }
  const verbs::RecvWqe& w = q.resp.recv;
  if (!scatter(e.mrs(), q.pd, w.sge, w.num_sge, 0, grh, verbs::kGrhBytes) ||
      !scatter(e.mrs(), q.pd, w.sge, w.num_sge, verbs::kGrhBytes, pkt.payload(), plen)) {
    recv_complete(e, q, WcStatus::LocProtErr, 0, 0, 0, src_qp);
    return;
  }
  uint8_t flags = verbs::kWcGrh;
  uint32_t imm = 0;
  if (pkt.op->off_imm) {
    flags |= verbs::kWcWithImm;
    imm = htobe32(pkt.h.ext.imm);
  }
  recv_complete(e, q, WcStatus::Success, plen + verbs::kGrhBytes, flags, imm, src_qp);
}

}  // namespace

void responder_rx(Engine& e, Qp& q, const wire::PacketView& pkt) noexcept {
  if (q.type == QpType::UD) {
    ud_rx(e, q, pkt);
    return;
  }
  Ctx c{e, q, pkt, *pkt.op, pkt.h.bth.psn, q.type == QpType::RC};
  if (c.rc && (pkt.h.bth.resv7 & kSrMark) && q.sr) {  // q.sr: EngineConfig::selective_repeat
    // A marked request: the peer runs selective repeat and knows us; our
    // requests to it may be marked too (from the next work request on).
    if (!q.req.sr_tx) {
      q.req.sr_tx = true;
      e.count(Ctr::SrLearned);
    }
    const int32_t d = psn_diff(c.psn, q.resp.psn);
    if (d > 0) {
      sr_ahead(c, d);
      return;
    }
  }
  RespSt st = RespSt::CheckPsn;
  while (st != RespSt::Done) {
    switch (st) {
      case RespSt::CheckPsn: st = check_psn(c); break;
      case RespSt::CheckOpSeq: st = check_op_seq(c); break;
      case RespSt::CheckLength: st = check_length(c); break;
      case RespSt::CheckResource: st = check_resource(c); break;
      case RespSt::CheckRkey: st = check_rkey(c); break;
      case RespSt::Execute: st = execute(c); break;
      case RespSt::Complete: st = complete(c); break;
      case RespSt::Acknowledge:
        // Coalesced: only requests asking for it (AckReq) are acknowledged (IBTA 9.7).
        if (pkt.h.bth.ackreq) queue_ack(e, q, kAckSyndrome, c.psn);
        st = RespSt::Done;
        break;
      case RespSt::Duplicate: st = duplicate(c); break;
      case RespSt::ErrNakSeq:
        // IBTA 9.7: one NAK per sequence error; later packets are dropped silently.
        e.count(Ctr::OutOfSeqRequest);
        if (!q.resp.nak_sent) {
          q.resp.nak_sent = true;
          e.count(Ctr::SeqNakSent);
          ++q.ctr.seq_naks_sent;
          queue_ack(e, q, wire::kAethNak | wire::kNakPsnSeqError, q.resp.psn);
        }
        st = RespSt::Done;
        break;
      case RespSt::ErrRnr:
        if (!q.resp.nak_sent) {
          q.resp.nak_sent = true;
          e.count(Ctr::RnrNakSent);
          ++q.ctr.rnr_naks_sent;
          queue_ack(e, q, static_cast<uint8_t>(wire::kAethRnrNak | (q.attr.min_rnr_timer & 0x1F)), c.psn);
        }
        st = RespSt::Done;
        break;
      case RespSt::ErrInvReq:
        if (!c.rc) { st = RespSt::DropMsg; break; }
        fatal_nak(c, wire::kNakInvalidRequest, WcStatus::LocLenErr);
        st = RespSt::Done;
        break;
      case RespSt::ErrInvalidate:
        // RC only (IETH exists only in RC SENDs): the receive WQE completes with
        // REM_INV_REQ_ERR, the requester gets NAK invalid request, the QP goes to error.
        fatal_nak(c, wire::kNakInvalidRequest, WcStatus::RemInvReqErr);
        st = RespSt::Done;
        break;
      case RespSt::ErrLength:
        if (!c.rc) { st = RespSt::DropMsg; break; }
        fatal_nak(c, wire::kNakInvalidRequest, WcStatus::LocLenErr);
        st = RespSt::Done;
        break;
      case RespSt::ErrRemAccess:
        if (!c.rc) { st = RespSt::DropMsg; break; }
        fatal_nak(c, wire::kNakRemoteAccessError, WcStatus::LocProtErr);
        st = RespSt::Done;
        break;
      case RespSt::ErrRemOp:
        if (!c.rc) { st = RespSt::DropMsg; break; }
        fatal_nak(c, wire::kNakRemoteOperationalError, WcStatus::LocProtErr);
        st = RespSt::Done;
        break;
      case RespSt::DropMsg: st = drop_msg(c); break;
      case RespSt::Done:
      case RespSt::kCount:
        st = RespSt::Done;
        break;
    }
  }
  if (q.resp.sr_count && q.sr) sr_advance(e, q);
}

namespace {
// A READ whose MR went away while its responses were being sent: no more
// responses, a remote access NAK for the PSN that could not be answered (the
// requester completes the READ with REM_ACCESS_ERR), and the QP to error.
void read_mr_gone(Engine& e, Qp& q, uint32_t psn) noexcept {
  RespState& r = q.resp;
  e.count(Ctr::RespMrGone);
  e.count(Ctr::ErrNakSent);
  ++q.ctr.err_naks_sent;
  for (uint32_t i = 0; i < r.res_cap; ++i) r.res[i].active = false;
  r.emit_head = r.emit_tail = 0;
  r.ack_pending = true;
  r.ack_syndrome = static_cast<uint8_t>(wire::kAethNak | wire::kNakRemoteAccessError);
  r.ack_psn = psn;
  e.qp_to_error(q, /*keep_responses=*/true);
}
}  // namespace

bool responder_tx(Engine& e, Qp& q, uint32_t budget) noexcept {
  RespState& r = q.resp;
  uint32_t sent = 0;
  while (r.emit_tail != r.emit_head) {
    RespResource& res = r.res[r.emit_q[r.emit_tail % verbs::kMaxRdAtomic]];
    if (!res.active) {
      ++r.emit_tail;
      continue;
    }
    if (sent >= budget || !e.tx_room()) return true;
    wire::PacketFields f;
    f.psn = res.cur_psn;
    f.ext.aeth = {kAckSyndrome, res.msn};
    if (res.kind == 2) {
      f.opcode = wire::op::RC_ATOMIC_ACKNOWLEDGE;
      f.ext.atomic_orig = res.orig;
      if (!e.begin_frame(q.tx, f, 0)) return true;
      e.end_frame();
      q.count_tx(0);
      res.active = false;
      ++r.emit_tail;
    } else {
      // Position within the original response (rxe does the same, and rxe's requester
      // rejects a FIRST that restarts in the middle of a READ): a re-executed partial
      // READ continues with MIDDLE/LAST.
      const bool first = res.cur_psn == res.first_psn, last = res.resid <= q.mtu;
      const uint32_t plen = last ? res.resid : q.mtu;
      f.opcode = first && last ? wire::op::RC_READ_RESPONSE_ONLY
                     : first       ? wire::op::RC_READ_RESPONSE_FIRST
                     : last        ? wire::op::RC_READ_RESPONSE_LAST
                                   : wire::op::RC_READ_RESPONSE_MIDDLE;
      // The rkey again for every packet: the MR may have been deregistered since
      // the request (or the last packet); then the READ ends with a remote access
      // NAK at this PSN and the QP goes to error, and the memory is never read.
      const uint8_t* src = nullptr;
      void* dma = nullptr;
      if (plen) {
        src = e.rkey_lookup(res.rkey, q, res.va, plen, verbs::kAccessRemoteRead, nullptr, &dma);
        if (!src) {
          read_mr_gone(e, q, res.cur_psn);
          break;
        }
      }
      uint8_t* dst = e.begin_frame(q.tx, f, plen);
      if (!dst) return true;
      e.end_frame_with(dst, src, dma);
      q.count_tx(plen);
      e.count(Ctr::ReadRespSent);
      res.va += plen;
      res.resid -= plen;
      res.cur_psn = psn_add(res.cur_psn, 1);
      if (last) {
        res.active = false;
        ++r.emit_tail;
      }
    }
    ++sent;
  }
  if (r.ack_pending) {
    if (!e.tx_room()) return true;
    wire::PacketFields f;
    f.opcode = wire::op::RC_ACKNOWLEDGE;
    f.psn = r.ack_psn;
    f.ext.aeth = {r.ack_syndrome, r.msn};
    if (r.ack_sr) f.resv7 = kSrMark;  // go-back NAK to a marked request
    if (!e.begin_frame(q.tx, f, 0)) return true;
    e.end_frame();
    q.count_tx(0);
    if ((r.ack_syndrome & wire::kAethKindMask) == wire::kAethAck) e.count(Ctr::AcksSent);
    r.ack_pending = false;
  }
  if (r.sr_sack && q.sr) {
    SrResp& x = q.sr->resp;
    // SACKs (README): chunk 0 (from ePSN + 1) always, chunks 1-3 when they have
    // news; built from the live bitmap, so one covers every arrival before it.
    for (uint32_t k = 0; k < kSrWords; ++k) {
      if (k && !((x.dirty >> k) & 1)) continue;
      const uint32_t base = psn_add(r.psn, 1 + 64 * k);
      uint64_t bits = 0;
      for (uint32_t j = 0; j < 64 && r.sr_count; ++j)
        if (x.bits.test(psn_add(base, j))) bits |= uint64_t{1} << j;
      if (k && !bits) continue;
      if (!e.tx_room()) return true;
      wire::PacketFields f;
      f.opcode = wire::op::RC_ATOMIC_ACKNOWLEDGE;
      f.psn = r.psn;
      f.resv7 = kSrMark;
      f.ext.aeth = {static_cast<uint8_t>(wire::kAethNak | wire::kNakPsnSeqError), base};
      f.ext.atomic_orig = bits;
      if (!e.begin_frame(q.tx, f, 0)) return true;
      e.end_frame();
      q.count_tx(0);
      e.count(Ctr::SrSackSent);
      ++q.ctr.sr_sacks_sent;
      x.dirty = static_cast<uint8_t>(x.dirty & ~(1u << k));
    }
    r.sr_sack = false;
    x.dirty = 0;
  }
  return false;
}

}  // namespace droce::transport

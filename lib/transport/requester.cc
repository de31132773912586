// Requester: SQ WQEs -> request packets (IBTA 9.4, 9.7; cf. rxe_req.c).
//
// A fast pass first (fast_pass: posted single-packet SEND/WRITE WQEs of one
// SGE, one step each), then the state machine per call, one packet per pass:
//   GetWqe -> CheckLimits -> [StartWqe] -> BuildPacket -> Advance -> GetWqe ...
// leaving through Stop (nothing to do now: empty, window/fence/rd_atomic
// limits, RNR wait, SQD) or Yield (budget or TX full: call again).
// Go-back-N (requester_rewind) only moves the cursor (idx, psn); the packets
// are rebuilt from the WQE, so nothing is kept per packet.
#include <endian.h>

#include <cstring>

#include "transport/engine.h"
#include "transport/states.h"

namespace droce::transport {

using verbs::QpType;
using verbs::SendWqe;
using verbs::WqeState;
using verbs::WrOpcode;
using wire::psn_add;
using wire::psn_diff;

namespace {

// What a packet adds to its payload on the wire (Ethernet, IPv4, UDP, BTH,
// ICRC, FCS): the DCQCN byte counter and pacer count these too.
constexpr uint64_t kWireOverhead = 14 + 20 + 8 + 12 + 4 + 4;

// The window in packets: the congestion window, and for a QP DCQCN limits at
// most its rate x dcqcn::Params::window_ns (one packet at least).
inline uint32_t send_window(const Qp& q) noexcept {
  const uint64_t b = q.rp.window_bytes();
  if (b == 0) return q.req.cwnd;
  const uint64_t pkts = b / (q.mtu + kWireOverhead);
  return pkts >= q.req.cwnd ? q.req.cwnd : (pkts != 0 ? static_cast<uint32_t>(pkts) : 1);
}

inline bool is_rd_atomic(WrOpcode o) noexcept {
  return o == WrOpcode::RdmaRead || o == WrOpcode::AtomicCmpSwp || o == WrOpcode::AtomicFetchAdd;
}
inline bool is_atomic(WrOpcode o) noexcept { return o == WrOpcode::AtomicCmpSwp || o == WrOpcode::AtomicFetchAdd; }

uint32_t packets_for(const Qp& q, const SendWqe& w) noexcept {
  if (is_atomic(w.wr.opcode) || q.type == QpType::UD) return 1;
  const uint32_t n = static_cast<uint32_t>((uint64_t{w.length} + q.mtu - 1) / q.mtu);
  return n ? n : 1;
}

// Checks the local SGEs of a WQE before its first packet (IBTA ch. 10: local
// protection errors complete the WQE in error). Returns the failing status.
verbs::WcStatus validate_local(Engine& e, const Qp& q, const SendWqe& w) noexcept {
  if (q.type == QpType::UD && w.length > q.mtu) return verbs::WcStatus::LocLenErr;
  if (w.is_inline) return verbs::WcStatus::Success;
  const uint32_t access =
      (w.wr.opcode == WrOpcode::RdmaRead || is_atomic(w.wr.opcode)) ? uint32_t{verbs::kAccessLocalWrite} : 0u;
  for (uint32_t i = 0; i < w.wr.num_sge; ++i) {
    const verbs::Sge& s = w.wr.sg_list[i];
    if (s.length == 0) continue;
    if (!e.mrs().lookup(s.lkey, q.pd, s.addr, s.length, access, nullptr)) return verbs::WcStatus::LocProtErr;
  }
  return verbs::WcStatus::Success;
}

inline bool is_local_op(WrOpcode o) noexcept { return o == WrOpcode::BindMw || o == WrOpcode::LocalInv; }

// BIND_MW / LOCAL_INV (IBTA 10.6.7, 9.4.x): executed when the requester
// reaches them, so in SQ order after every earlier WQE has been started; no
// packet, no PSN. Failures complete the WQE in error (rxe's statuses:
// MW_BIND_ERR for a refused bind, LOC_QP_OP_ERR for an invalidation of
// something that cannot be invalidated).
verbs::WcStatus run_local_op(Engine& e, const Qp& q, const SendWqe& w) noexcept {
  if (w.wr.opcode == WrOpcode::BindMw) return e.mws().bind(q.pd, q.qpn, w.wr);
  return e.invalidate(w.wr.invalidate_rkey, q.pd) ? verbs::WcStatus::Success : verbs::WcStatus::LocQpOpErr;
}

wire::Position position(uint32_t k, uint32_t n) noexcept {
  if (n == 1) return wire::Position::Only;
  if (k == 0) return wire::Position::First;
  return k + 1 == n ? wire::Position::Last : wire::Position::Middle;
}

// A UD request: its headers from the work request's address handle.
uint8_t* begin_ud(Engine& e, const Qp& q, const SendWqe& w, wire::PacketFields& f, uint32_t payload) noexcept {
  wire::Headers h;
  h.l2.src = q.tx.src_mac();
  h.l2.dst = w.ah.dmac;
  h.l2.vlan = w.ah.vlan;
  h.l2.vlan_tci = w.ah.vlan_tci;
  h.l3.ipv6 = !wire::gid_is_ipv4_mapped(w.ah.dgid);
  h.l3.src = e.source_gid(w.ah.dgid);
  h.l3.dst = w.ah.dgid;
  h.l3.tos = static_cast<uint8_t>((w.ah.traffic_class & ~wire::kEcnMask) | (e.config().ecn ? wire::kEcnEct0 : 0));
  h.l3.ttl = w.ah.hop_limit;
  h.l3.flow_label = w.ah.flow_label;
  h.l4.sport = static_cast<uint16_t>(0xC000 | ((q.qpn * 0x9E37u ^ w.wr.ud.remote_qpn) & 0x3FFF));
  h.bth.dqpn = w.wr.ud.remote_qpn;
  // C10-15: a Q_Key with the high bit set means "use the QP's Q_Key".
  f.ext.deth.qkey = (w.wr.ud.remote_qkey & 0x80000000u) ? q.attr.qkey : w.wr.ud.remote_qkey;
  f.ext.deth.sqpn = q.qpn;
  wire::apply_fields(h, f);
  return e.begin_frame(h, payload);
}

// Builds and queues packet for the WQE at the requester cursor. Returns false
// if no TX buffer was available (nothing changed).
bool build_packet(Engine& e, Qp& q, SendWqe& w, bool* last_of_wqe) noexcept {
  const uint32_t k = static_cast<uint32_t>(psn_diff(q.req.psn, w.first_psn));
  const WrOpcode o = w.wr.opcode;
  // This packet's BTH and extension headers: connected QPs put them on their
  // prebuilt template, UD requests on headers built from the work request's AH.
  wire::PacketFields f;
  f.psn = q.req.psn;
  uint32_t payload = 0, offset = 0;
  bool last = true;
  if (o == WrOpcode::RdmaRead) {
    f.opcode = wire::op::RC_READ_REQUEST;
    offset = k * q.mtu;  // a retried READ asks for the rest only (IBTA 9.4)
    f.ext.reth = {w.wr.rdma.remote_addr + offset, w.wr.rdma.rkey, w.length - offset};
    f.ackreq = true;
  } else if (is_atomic(o)) {
    f.opcode = o == WrOpcode::AtomicCmpSwp ? wire::op::RC_COMPARE_SWAP : wire::op::RC_FETCH_ADD;
    f.ext.atomic.va = w.wr.atomic.remote_addr;
    f.ext.atomic.rkey = w.wr.atomic.rkey;
    f.ext.atomic.swap_add = o == WrOpcode::AtomicCmpSwp ? w.wr.atomic.swap : w.wr.atomic.compare_add;
    f.ext.atomic.compare = o == WrOpcode::AtomicCmpSwp ? w.wr.atomic.compare_add : 0;
    f.ackreq = true;
  } else {
    const wire::Position pos = position(k, w.npkts);
    f.opcode = static_cast<uint8_t>(wire::wire_opcode(q.type, o, pos));
    offset = k * q.mtu;
    payload = w.length - offset < q.mtu ? w.length - offset : q.mtu;
    last = pos == wire::Position::Last || pos == wire::Position::Only;
    // Selective repeat: a WRITE of several packets goes as one WRITE ONLY per
    // packet, each with its own RETH, so the responder can place any of them
    // out of order (README: Selective repeat between droce peers).
    const bool split = w.sr && o == WrOpcode::RdmaWrite && w.npkts > 1;
    if (split) f.opcode = wire::op::RC_WRITE_ONLY;
    const wire::OpcodeInfo& info = wire::opcode_info(f.opcode);
    if (info.off_reth)
      f.ext.reth = split ? wire::RethFields{w.wr.rdma.remote_addr + offset, w.wr.rdma.rkey, payload}
                         : wire::RethFields{w.wr.rdma.remote_addr, w.wr.rdma.rkey, w.length};
    if (info.off_imm) f.ext.imm = be32toh(w.wr.imm_data);  // ibverbs' imm_data is in network order; ext.imm is the value
    if (info.off_ieth) f.ext.ieth_rkey = w.wr.invalidate_rkey;
    f.se = last && (w.wr.send_flags & verbs::kSendSolicited) && (info.flags & (wire::kOpSend | wire::kOpImm));
    if (q.type == QpType::RC) {
      // AckReq on the last packet, every ack_req_every packets (at most every half
      // window, so ACKs come back before a small window runs dry) and on the packet
      // that fills the window (a responder such as rxe ACKs only on AckReq).
      const uint32_t w = send_window(q);
      const uint32_t every = e.config().ack_req_every < w / 2 ? e.config().ack_req_every : (w / 2 ? w / 2 : 1);
      f.ackreq = last || q.req.pkts_since_ackreq + 1 >= every ||
                     psn_diff(psn_add(q.req.psn, 1), q.comp.psn) >= static_cast<int32_t>(w);
    }
  }
  if (w.sr && q.req.sr_tx) f.resv7 = static_cast<uint8_t>(f.resv7 | kSrMark);  // "answer with SACKs"
  void* dma = nullptr;
  const uint8_t* src = gather_ref(e.mrs(), q.pd, w, offset, payload, &dma);
  if (src && q.type != QpType::UD && !e.by_reference(dma, payload)) {
    // The fast path: a connected QP's packet whose payload is one SGE, copied.
    if (!e.emit_copy(q.tx, f, src, payload)) return false;
    q.req.pkts_since_ackreq = f.ackreq ? 0 : q.req.pkts_since_ackreq + 1;
    q.count_tx(payload);
    if (q.rp.limited()) q.rp.on_sent(e.now(), payload + kWireOverhead);
    *last_of_wqe = last;
    return true;
  }
  uint8_t* dst = q.type == QpType::UD ? begin_ud(e, q, w, f, payload) : e.begin_frame(q.tx, f, payload);
  if (!dst) return false;
  if (src) {
    // One SGE holds the whole payload: by reference when it can go so, else one copy.
    e.end_frame_with(dst, src, dma);
  } else {
    if (!gather(e.mrs(), q.pd, w, offset, dst, payload)) {
      // A source MR was deregistered while the WQE was in flight: nothing of it
      // is sent; the WQE completes with LOC_PROT_ERR and the QP goes to error (RC)
      // or SQE (UC/UD), as rxe's requester does when its lkey lookup fails.
      e.abort_frame();
      e.count(Ctr::ReqGatherErr);
      w.status = verbs::WcStatus::LocProtErr;
      w.state = WqeState::Done;
      if (q.type == QpType::RC) {
        e.qp_to_error(q);
      } else {
        e.sq_to_error(q);
      }
      return false;
    }
    if (payload) e.count(Ctr::TxCopied);
    e.end_frame();
  }
  q.req.pkts_since_ackreq = f.ackreq ? 0 : q.req.pkts_since_ackreq + 1;
  q.count_tx(payload);
  if (q.rp.limited()) q.rp.on_sent(e.now(), payload + kWireOverhead);
  *last_of_wqe = last;
  return true;
}

// Selective repeat: resends each PSN the responder reported missing (its
// ePSN, and every PSN below the highest it holds that it does not hold) once,
// rebuilt from its WQE, at the QP's DCQCN rate. Returns the packets sent;
// q.sr->req.pending stays set when the budget, the TX room or the pacer
// stopped it first.
uint32_t sr_resend(Engine& e, Qp& q, uint32_t budget) noexcept {
  SrState& s = q.sr->req;
  uint32_t end = wire::psn_gt(s.high, s.missing) ? s.high : psn_add(s.missing, 1);
  if (wire::psn_gt(end, q.req.next_new_psn)) end = q.req.next_new_psn;
  uint32_t sent = 0;
  uint32_t i = q.sq.tail;
  for (uint32_t p = q.comp.psn, n = 0; wire::psn_lt(p, end) && n < kSrWindow; p = psn_add(p, 1), ++n) {
    if (s.held.test(p) || s.resent.test(p)) continue;
    while (i != q.sq.head) {  // the WQE whose PSN range holds p (WQEs are in PSN order)
      const SendWqe& w = q.sq.at(i);
      if (w.state == WqeState::Posted) {
        i = q.sq.head;
        break;
      }
      if (w.npkts && wire::psn_le(p, w.last_psn)) break;
      ++i;
    }
    if (i == q.sq.head) break;
    SendWqe& w = q.sq.at(i);
    if (wire::psn_lt(p, w.first_psn) || w.state == WqeState::Done ||
        (is_rd_atomic(w.wr.opcode) && p != psn_add(w.first_psn, w.read_pkts_done))) {
      s.resent.set(p);  // not a packet of its own (a READ's response PSNs) or already acknowledged
      continue;
    }
    if (sent >= budget || !e.tx_room()) return sent;
    // DCQCN: a resend waits for the QP's next send time as any other packet
    // of the QP does (CheckLimits below); it stays pending meanwhile.
    if (q.rp.limited()) {
      q.rp.advance(e.now());
      if (e.now() < q.rp.next_send_ns()) {
        ++q.ctr.paced;
        q.rp.on_paced();
        return sent;
      }
    }
    const uint32_t save_psn = q.req.psn, save_ack = q.req.pkts_since_ackreq;
    q.req.psn = p;
    bool last = false;
    const bool ok = build_packet(e, q, w, &last);
    q.req.psn = save_psn;
    q.req.pkts_since_ackreq = save_ack;
    if (!ok) return sent;  // no TX buffer (or the QP went to error: rts_like() fails next time)
    s.resent.set(p);
    s.mark = q.req.next_new_psn;  // packets from here on leave after this resend
    s.marked = true;
    e.count(Ctr::ReqPackets);
    e.count(Ctr::ReqRetransmits);
    e.count(Ctr::SrResent);
    ++q.ctr.sr_resent;
    ++q.ctr.retransmits;
    ++sent;
  }
  s.pending = false;
  return sent;
}

// An RC packet went out: the ACK timer runs from now unless it already runs.
inline void arm_ack_timer(Engine& e, Qp& q) noexcept {
  if (q.comp.deadline != 0) return;
  const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
  if (to) q.comp.deadline = e.now() + to;
  e.timer_arm(q);
}

// The fast pass (issue 12): the common case of a message rate benchmark and
// of most small messages, one step per WQE instead of the state machine's
// four. It takes the QP's next posted WQEs, in SQ order, while each is a SEND
// or WRITE (with or without immediate) of at most one MTU whose payload is
// inline, empty or one SGE copied into the frame, on an RC or UC QP in RTS
// that no CNP has slowed, with no selective repeat, no halt and no fence
// waiting for a READ; each is checked (its SGE looked up once, for the check
// and the copy), started, built and queued in that step. It stops at the first
// WQE that is not such, at the window, the budget or a full TX batch, and
// leaves the rest (errors included: a failed lookup is the state machine's to
// report) to the state machine, which then finds the same WQE and the same
// limits. The packets are the state machine's bytes for the bytes.
bool fast_eligible(const Qp& q) noexcept {
  return q.state == verbs::QpState::Rts && q.type != QpType::UD && !q.rp.limited() && !q.req.sr_tx && !q.req.halted;
}

uint32_t fast_pass(Engine& e, Qp& q, uint32_t budget) noexcept {
  const bool rc = q.type == QpType::RC;
  const auto cwnd = static_cast<int32_t>(q.req.cwnd);  // send_window(q) with no DCQCN limit
  uint32_t sent = 0;
  bool retire = false;
  while (sent < budget && q.req.idx != q.sq.head && e.tx_room()) {
    if (rc && psn_diff(q.req.psn, q.comp.psn) >= cwnd) break;
    SendWqe& w = q.sq.at(q.req.idx);
    const WrOpcode o = w.wr.opcode;
    if (w.state != WqeState::Posted || w.length > q.mtu ||
        (o != WrOpcode::RdmaWrite && o != WrOpcode::Send && o != WrOpcode::RdmaWriteImm && o != WrOpcode::SendImm) ||
        ((w.wr.send_flags & verbs::kSendFence) && q.req.rd_atomic_out > 0))
      break;
    const uint8_t* src = w.inline_data;  // inline or empty
    if (!w.is_inline && w.length != 0) {
      if (w.wr.num_sge != 1) break;
      const verbs::Sge& sg = w.wr.sg_list[0];
      void* dma = nullptr;
      src = e.mrs().lookup(sg.lkey, q.pd, sg.addr, sg.length, 0, nullptr, &dma);
      if (!src || e.by_reference(dma, w.length)) break;
    }
    wire::PacketFields f;
    f.opcode = static_cast<uint8_t>(wire::wire_opcode(q.type, o, wire::Position::Only));
    f.psn = q.req.psn;
    f.ackreq = rc;  // the last packet of its message
    const wire::OpcodeInfo& info = wire::opcode_info(f.opcode);
    if (info.off_reth) f.ext.reth = {w.wr.rdma.remote_addr, w.wr.rdma.rkey, w.length};
    if (info.off_imm) f.ext.imm = be32toh(w.wr.imm_data);
    f.se = (w.wr.send_flags & verbs::kSendSolicited) && (info.flags & (wire::kOpSend | wire::kOpImm));
    if (!e.emit_copy(q.tx, f, src, w.length)) break;
    w.npkts = 1;
    w.first_psn = w.last_psn = q.req.psn;
    w.read_pkts_done = 0;
    w.sr = false;
    q.req.pkts_since_ackreq = rc ? 0 : q.req.pkts_since_ackreq + 1;
    q.count_tx(w.length);
    e.count(Ctr::ReqPackets);
    ++sent;
    q.req.psn = psn_add(q.req.psn, 1);
    if (wire::psn_gt(q.req.psn, q.req.next_new_psn)) q.req.next_new_psn = q.req.psn;
    ++q.req.idx;
    if (rc) {
      w.state = WqeState::Sent;
      arm_ack_timer(e, q);
    } else {
      w.state = WqeState::Done;  // UC: complete when on the wire
      retire = true;
    }
  }
  if (retire) completer_retire(e, q);
  return sent;
}

}  // namespace

bool requester_run(Engine& e, Qp& q, uint32_t budget) noexcept {
  if (!q.rts_like() || q.comp.rnr_wait) return false;
  uint32_t sent = 0;
  if (q.sr && q.sr->req.pending) {  // lost packets go before new ones
    sent = sr_resend(e, q, budget);
    if (q.sr->req.pending || !q.rts_like()) return q.rts_like();
  }
  if (fast_eligible(q)) sent += fast_pass(e, q, budget - sent);
  SendWqe* w = nullptr;
  ReqSt st = ReqSt::GetWqe;
  for (;;) {
    switch (st) {
      case ReqSt::GetWqe:
        if (q.req.idx == q.sq.head || (q.req.halted && q.req.idx == q.req.halt_idx)) {
          st = ReqSt::Stop;
          break;
        }
        w = &q.sq.at(q.req.idx);
        if (w->state == WqeState::Done) {  // acknowledged while we were going back: skip it
          const uint32_t after = psn_add(w->last_psn, 1);
          if (wire::psn_lt(q.req.psn, after)) q.req.psn = after;
          ++q.req.idx;
          break;
        }
        st = ReqSt::CheckLimits;
        break;

      case ReqSt::CheckLimits:
        if (sent >= budget || !e.tx_room()) {
          st = ReqSt::Yield;
          break;
        }
        // Go-back-N window on outstanding PSNs: the congestion window, at most
        // max_inflight_pkts (also keeps within 2^23, IBTA 9.7).
        // Selective repeat keeps everything in flight inside the responder's window.
        // A QP DCQCN limits: at most its rate x window_ns (send_window). When
        // that bound fell below what is out since the last packet that asked
        // for an ACK (its rate was cut), one more packet goes, with AckReq (it
        // fills the window): else no ACK would come before the ACK timeout.
        if (q.type == QpType::RC) {
          const uint32_t win = send_window(q);
          const int32_t out = psn_diff(q.req.psn, q.comp.psn);
          const bool ask = win < q.req.cwnd && q.req.pkts_since_ackreq != 0 && out < static_cast<int32_t>(q.req.cwnd);
          if (out >= static_cast<int32_t>(q.req.sr_tx && win > kSrWindow ? kSrWindow : win) && !ask) {
            st = ReqSt::Stop;
            break;
          }
        }
        // DCQCN: a QP slowed by CNPs waits for its next send time (it stays
        // on the ready list; Engine::next_timer_ns reports the time).
        if (q.rp.limited()) {
          q.rp.advance(e.now());
          if (e.now() < q.rp.next_send_ns()) {
            ++q.ctr.paced;
            q.rp.on_paced();
            st = ReqSt::Yield;
            break;
          }
        }
        if (w->state == WqeState::Posted) {
          if (q.state == verbs::QpState::Sqd) {  // drain: finish started WQEs only
            st = ReqSt::Stop;
            break;
          }
          if ((w->wr.send_flags & verbs::kSendFence) && q.req.rd_atomic_out > 0) {
            st = ReqSt::Stop;
            break;
          }
          if (is_rd_atomic(w->wr.opcode) && q.req.rd_atomic_out >= q.attr.max_rd_atomic) {
            st = ReqSt::Stop;
            break;
          }
          st = ReqSt::StartWqe;
          break;
        }
        st = ReqSt::BuildPacket;
        break;

      case ReqSt::StartWqe: {
        if (is_local_op(w->wr.opcode)) {
          // Occupies no PSN: [first, last] is empty (last = first - 1), so the
          // completer's and go-back-N's PSN scans pass over it.
          w->status = run_local_op(e, q, *w);
          w->npkts = 0;
          w->first_psn = q.req.psn;
          w->last_psn = psn_add(q.req.psn, wire::kMask24);
          w->state = WqeState::Done;
          if (w->status != verbs::WcStatus::Success) {
            // Nothing at or after it starts; earlier WQEs still complete (as
            // rxe: its requester stops, its completer reports in order).
            q.req.halted = true;
            q.req.halt_idx = q.req.idx;
            completer_retire(e, q);  // at the tail: reported now, QP to error
            return false;
          }
          ++q.req.idx;
          completer_retire(e, q);  // completes now unless earlier WQEs still wait for their ACKs
          st = ReqSt::GetWqe;
          break;
        }
        const verbs::WcStatus s = validate_local(e, q, *w);
        if (s != verbs::WcStatus::Success) {
          w->status = s;
          w->state = WqeState::Done;
          ++q.req.idx;
          completer_retire(e, q);  // reports it in order and moves the QP to ERR
          return false;
        }
        w->npkts = packets_for(q, *w);
        if (w->npkts > (1u << 22)) {  // more PSNs than half the window allows (2 GiB at MTU 256)
          w->status = verbs::WcStatus::LocLenErr;
          w->state = WqeState::Done;
          ++q.req.idx;
          completer_retire(e, q);
          return false;
        }
        w->first_psn = q.req.psn;
        w->last_psn = psn_add(q.req.psn, w->npkts - 1);
        w->read_pkts_done = 0;
        w->sr = q.req.sr_tx;  // one mode per message, from its first packet to its last
        w->state = WqeState::Sending;
        if (is_rd_atomic(w->wr.opcode)) ++q.req.rd_atomic_out;
        st = ReqSt::BuildPacket;
        break;
      }

      case ReqSt::BuildPacket: {
        bool last = false;
        if (!build_packet(e, q, *w, &last)) {
          st = ReqSt::Yield;
          break;
        }
        const bool retransmit = wire::psn_lt(q.req.psn, q.req.next_new_psn);
        e.count(Ctr::ReqPackets);
        if (retransmit) {
          e.count(Ctr::ReqRetransmits);
          ++q.ctr.retransmits;
        }
        ++sent;
        // Advance: a READ request covers all the PSNs of its response.
        if (w->wr.opcode == WrOpcode::RdmaRead) {
          q.req.psn = psn_add(w->last_psn, 1);
          last = true;
        } else {
          q.req.psn = psn_add(q.req.psn, 1);
        }
        if (wire::psn_gt(q.req.psn, q.req.next_new_psn)) q.req.next_new_psn = q.req.psn;
        if (q.type == QpType::RC) arm_ack_timer(e, q);
        if (last) {
          ++q.req.idx;
          if (q.type == QpType::RC) {
            if (w->state == WqeState::Sending) w->state = WqeState::Sent;
          } else {
            // UC and UD complete when the last packet is on the wire.
            w->state = WqeState::Done;
            completer_retire(e, q);
          }
        }
        st = ReqSt::GetWqe;
        break;
      }

      case ReqSt::Stop:
      case ReqSt::kCount:
        return false;
      case ReqSt::Yield:
        return true;
    }
  }
}

void requester_rewind(Engine& e, Qp& q, uint32_t psn) noexcept {
  // Find the first started WQE that still needs packets at or after psn.
  uint32_t i = q.sq.tail;
  for (; i != q.sq.head; ++i) {
    const SendWqe& w = q.sq.at(i);
    if (w.state == WqeState::Posted) {
      psn = q.req.next_new_psn;  // nothing started from here on
      break;
    }
    if (wire::psn_gt(psn, w.last_psn)) continue;
    if (w.state == WqeState::Done) {  // already acknowledged: resume after it
      psn = psn_add(w.last_psn, 1);
      continue;
    }
    if (wire::psn_lt(psn, w.first_psn)) psn = w.first_psn;
    if (w.wr.opcode == WrOpcode::RdmaRead) {
      const uint32_t resume = psn_add(w.first_psn, w.read_pkts_done);
      if (wire::psn_gt(resume, psn)) psn = resume;
    } else if (is_rd_atomic(w.wr.opcode)) {
      psn = w.first_psn;  // an atomic is one packet
    }
    break;
  }
  if (i == q.sq.head) psn = q.req.next_new_psn;
  q.req.idx = i;
  q.req.psn = psn;
  q.req.pkts_since_ackreq = 0;
  if (q.sr) q.sr->req.episode = q.sr->req.pending = false;  // go-back-N resends everything from psn
  const uint64_t to = verbs::ack_timeout_ns(q.attr.timeout);
  q.comp.deadline = to ? e.now() + to : 0;
  e.timer_arm(q);
  e.req_ready(q);
}

}  // namespace droce::transport

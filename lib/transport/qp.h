// A transport QP: the verbs part (attributes, state, SQ/RQ rings) plus the
// state of its requester, responder and completer. Owned by one Engine and
// touched only by the Engine's thread.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/dcqcn.h"
#include "verbs/queues.h"
#include "wire/packet.h"

namespace droce::transport {

// Selective repeat (README: Selective repeat between droce peers). The mark:
// bit 0x40 of the BTH's resv7 (ICRC-covered), set only toward peers known to run it.
inline constexpr uint8_t kSrMark = 0x40;
// PSNs beyond the expected one a responder may hold out of order; also the
// most an SR requester keeps outstanding.
inline constexpr uint32_t kSrWindow = 256;
inline constexpr uint32_t kSrWords = kSrWindow / 64;

// A ring bitmap of kSrWindow PSNs indexed by PSN mod kSrWindow.
struct SrBits {
  uint64_t w[kSrWords]{};
  bool test(uint32_t psn) const noexcept { return (w[(psn % kSrWindow) >> 6] >> (psn & 63)) & 1; }
  void set(uint32_t psn) noexcept { w[(psn % kSrWindow) >> 6] |= uint64_t{1} << (psn & 63); }
  void clear(uint32_t psn) noexcept { w[(psn % kSrWindow) >> 6] &= ~(uint64_t{1} << (psn & 63)); }
  void reset() noexcept {
    for (auto& x : w) x = 0;
  }
};

// Responder side of selective repeat: marked WRITE ONLY packets placed ahead of
// the expected PSN (ring bitmap, PSNs in (psn, psn + kSrWindow)).
struct SrResp {
  SrBits bits;
  uint32_t lo = 0;    // PSN the bitmap was last reconciled at
  uint8_t dirty = 0;  // 64-PSN chunks after psn with news for the requester (bit k: chunk k)
};

// Requester side of selective repeat: what the responder said it holds.
struct SrState {
  SrBits held;     // PSNs the responder holds (from SACKs), for [lo, lo + kSrWindow)
  SrBits resent;   // PSNs resent in this loss episode
  uint32_t lo = 0;    // PSN the bitmaps are valid from (follows comp.psn)
  uint32_t high = 0;  // one past the highest PSN held (== lo: none)
  uint32_t missing = 0;  // the responder's ePSN from the last SACK (lost for sure)
  uint32_t mark = 0;      // next_new_psn when the last resends went out (valid if marked)
  bool marked = false;
  bool episode = false;  // a loss is being repaired
  bool pending = false;  // lost PSNs wait to be resent
};

// Requester (requester.cc): where it is in the SQ.
struct ReqState {
  uint32_t idx = 0;          // SQ index of the WQE being sent (tail <= idx <= head)
  uint32_t psn = 0;          // next PSN to send (rewound by go-back-N)
  uint32_t next_new_psn = 0; // one past the highest PSN ever sent
  uint32_t rd_atomic_out = 0;  // READ/atomic WQEs sent and not completed
  uint32_t pkts_since_ackreq = 0;
  // RC congestion window in PSNs (EngineConfig::min/max_inflight_pkts; set at RTS).
  uint32_t cwnd = 1u << 22;
  // A local operation (BIND_MW / LOCAL_INV) at SQ index halt_idx failed: the
  // requester starts nothing at or after it (earlier WQEs still finish, and
  // retransmit); the completer reports it in order and moves the QP to error.
  uint32_t halt_idx = 0;
  bool halted = false;
  // Selective repeat toward this QP's peer (EngineConfig::selective_repeat and
  // the peer known to run it: sr_peers, or a marked request from it).
  bool sr_tx = false;
};

// Completer (completer.cc): acknowledgement state and timers.
struct CompState {
  uint32_t psn = 0;           // oldest unacknowledged PSN
  uint8_t retry_left = 7;     // retry_cnt left for the current PSN
  uint8_t rnr_left = 7;       // rnr_retry left (7 = infinite)
  bool rnr_wait = false;      // requester paused until rnr_until
  uint8_t tails = 0;          // tail-loss resends since the last progress (EngineConfig::tail_timeout_ns)
  uint64_t rnr_until = 0;
  uint64_t deadline = 0;      // ACK timeout deadline (0 = not armed)
  uint32_t last_retry_psn = 0xFFFFFFFF;  // PSN of the last retransmission triggered by a response
  uint32_t ssthresh = 1u << 22;  // the window grows by one PSN per PSN acknowledged below this
  uint32_t cwnd_acc = 0;         // PSNs acknowledged towards the next +1 above ssthresh
};

// A READ or atomic the responder executed: kept for replay (the spec's
// "responder resources", max_dest_rd_atomic of them).
struct RespResource {
  uint8_t kind = 0;  // 0 none, 1 READ, 2 atomic
  bool active = false;  // still has response packets to send
  bool replay = false;  // active only to answer a duplicate (the requester already had the original)
  uint32_t first_psn = 0, last_psn = 0;
  uint32_t rkey = 0;
  uint64_t va = 0;     // READ: address of the next byte to send
  uint32_t resid = 0;  // READ: bytes left to send
  uint32_t cur_psn = 0;
  uint64_t orig = 0;     // atomic: value returned (replayed for duplicates)
  uint32_t msn = 0;      // the MSN after this request, carried by its responses (a re-executed
                         // duplicate READ: the MSN at re-execution, as rxe; an atomic replay: the original)
  // No host pointer is kept across packets: each response packet looks the
  // rkey up again (its tag is the registration's generation), so an MR
  // deregistered between two packets is never read (remote access NAK instead).
};

// Responder (responder.cc). A SEND's or WRITE's packet reads and writes the
// fields before `recv` only (one cache line with Qp::in_resp_ready); the
// receive WQE taken, the READ/atomic resources and selective repeat follow.
struct RespState {
  uint32_t psn = 0;  // expected PSN
  uint32_t msn = 0;
  bool in_msg = false;  // between FIRST and LAST of a SEND or WRITE
  bool in_write = false;
  bool nak_sent = false;  // a NAK (sequence/RNR) is outstanding for `psn`
  bool have_recv = false;  // `recv` holds the current SEND's receive WQE
  uint32_t recv_off = 0;
  // Current WRITE: the rkey and address of its next byte, looked up again for
  // every packet (never a host pointer kept across packets: the MR may be
  // deregistered between two packets of a message).
  uint32_t write_rkey = 0;
  uint32_t write_len = 0;
  uint32_t write_off = 0;
  // Coalesced ACK/NAK waiting to be sent (after any pending read responses).
  uint32_t ack_psn = 0;
  uint64_t write_va = 0;
  bool ack_pending = false;
  uint8_t ack_syndrome = 0;
  // Selective repeat (the bitmap itself is in Qp::sr): whether a SACK is owed,
  // a marked go-back NAK sent for psn, the pending NAK marked.
  bool sr_sack = false;
  bool sr_nak_sent = false;
  bool ack_sr = false;
  // Resource indexes waiting to send, FIFO (kMaxRdAtomic entries, allocated with res).
  uint32_t emit_head = 0, emit_tail = 0;
  // Current SEND: the receive WQE taken at FIRST/ONLY.
  verbs::RecvWqe recv;
  // Resources and their send order. The array exists from RTR on for an RC QP
  // (Engine::modify_qp sizes it to max_dest_rd_atomic, growing only): a QP
  // before RTR, UC and UD have none, so an idle QP does not carry 16 of them.
  std::unique_ptr<RespResource[]> res;
  uint32_t res_cap = 0;                   // entries in res (>= max_dest_rd_atomic from RTR on)
  uint32_t res_next = 0;                  // slot the next READ/atomic takes
  std::unique_ptr<uint8_t[]> emit_q;
  uint32_t sr_count = 0;  // selective repeat: PSNs held ahead of psn
};

// Per-QP counters (the engine thread writes them; the control path reads a
// copy through Dataplane::qps / droce-ctl qps). Bytes are payload bytes.
struct QpCounters {
  uint64_t tx_packets = 0;   // every frame of this QP: requests, responses, ACK/NAKs, CNPs
  uint64_t tx_bytes = 0;
  uint64_t rx_packets = 0;   // frames accepted for this QP (right transport, P_Key, state)
  uint64_t rx_bytes = 0;
  uint64_t seq_naks_sent = 0;
  uint64_t rnr_naks_sent = 0;
  uint64_t err_naks_sent = 0;
  uint64_t err_naks_received = 0;
  uint64_t cnp_sent = 0;
  uint64_t cnp_received = 0;
  uint64_t ce_received = 0;
  uint64_t retransmits = 0;
  uint64_t timeouts = 0;
  uint64_t rnr_naks_received = 0;
  uint64_t seq_naks_received = 0;
  uint64_t paced = 0;  // requester turns a DCQCN send time held back
  // Selective repeat (README): PSNs resent selectively and SACKs taken
  // (requester); packets placed out of order and SACKs sent (responder).
  uint64_t sr_resent = 0;
  uint64_t sr_sacks_received = 0;
  uint64_t sr_ooo_placed = 0;
  uint64_t sr_sacks_sent = 0;
};

// The lines a message touches (README: The fast path, thirteenth session).
// QpBase fills the first three: what every packet reads and the send queue,
// the attributes a packet reads, the receive queue. Then: a sender's line
// (requester state, timer wheel entry), the completer's line (with the DCQCN
// flag the requester reads per packet), the four counters every packet
// bumps, the responder's line, the header template; the rest is read on
// events only. test/transport/test_layout.cc checks which fields share a line.
struct Qp : verbs::QpBase {
  Qp(uint32_t qpn_, const verbs::QpInitAttr& init) : QpBase(qpn_, init) {}

  alignas(64) ReqState req;
  // The engine's timer wheel (Engine::timer_arm): the time the QP's entry is
  // due (never later than comp.deadline / rnr_until while those are armed),
  // its slot list, its slot, whether it is on one. Kept apart from CompState,
  // which is reset whole.
  uint64_t tw_at = 0;
  Qp* tw_prev = nullptr;
  Qp* tw_next = nullptr;
  uint32_t tw_slot = 0;
  bool tw_on = false;
  bool in_req_ready = false;
  alignas(64) CompState comp;
  // DCQCN reaction point (EngineConfig::dcqcn; RC and UC): limited only after
  // a CNP, so an unmarked fabric never consults more than its flag, which
  // follows `comp` on its line.
  dcqcn::ReactionPoint rp;
  QpCounters ctr;  // its first four (packets and bytes each way) on one line
  alignas(64) bool in_resp_ready = false;
  RespState resp;
  // RC/UC: the prebuilt header of every packet to the peer, built at RTR (and
  // when ECN marking changes); UD: only the source MAC.
  alignas(64) wire::TxTemplate tx;
  // Selective repeat (EngineConfig::selective_repeat, RC): allocated at RTR, so
  // a node with it off carries one pointer per QP. Touched only after a loss.
  struct Sr {
    SrState req;
    SrResp resp;
  };
  std::unique_ptr<Sr> sr;
  uint64_t last_cnp_ns = 0;
  bool cnp_ever = false;

  void count_tx(uint32_t payload) noexcept {
    ++ctr.tx_packets;
    ctr.tx_bytes += payload;
  }
  bool rts_like() const noexcept {
    return state == verbs::QpState::Rts || state == verbs::QpState::Sqd;
  }
  // Prefetches (README: The fast path, twelfth and thirteenth sessions): the
  // lines of this QP a received packet touches (a request: the responder's
  // line, and the receive queue's for a SEND; a response: the requester's and
  // completer's), and those the requester touches to send. Issued for a
  // burst's QPs before any of them is processed, so that with many QPs their
  // cache misses overlap instead of coming one after another. The header
  // template's first line only: an IPv6 or VLAN path's second line comes on demand.
  void prefetch_rx(uint32_t op_flags) const noexcept {
    const char* b = reinterpret_cast<const char*>(this);
    __builtin_prefetch(b);
    __builtin_prefetch(b + 64);
    if (op_flags & wire::kOpRequest) {
      __builtin_prefetch(&in_resp_ready);
      if (op_flags & (wire::kOpSend | wire::kOpConsumesRecv)) __builtin_prefetch(&rq);
    } else {
      __builtin_prefetch(&req);
      __builtin_prefetch(&comp);
    }
    __builtin_prefetch(&tx);
    __builtin_prefetch(&ctr);
  }
  void prefetch_rx_wqe(uint32_t op_flags) const noexcept {
    const char* w = nullptr;
    if (!(op_flags & wire::kOpRequest)) {
      // A coalesced ACK retires several: the next one's state too (its first line).
      if (sq.count() > 1) __builtin_prefetch(&sq.at(sq.tail + 1));
      if (!sq.empty()) w = reinterpret_cast<const char*>(&sq.at(sq.tail));
    } else if ((op_flags & (wire::kOpSend | wire::kOpConsumesRecv)) && !srq && !rq.empty()) {
      w = reinterpret_cast<const char*>(&rq.at(rq.tail));
    }
    if (!w) return;
    __builtin_prefetch(w);
    __builtin_prefetch(w + 64);
  }
  void prefetch_tx() const noexcept {
    const char* b = reinterpret_cast<const char*>(this);
    __builtin_prefetch(b);
    __builtin_prefetch(b + 64);
    __builtin_prefetch(&req);
    __builtin_prefetch(&comp);  // and rp's flag
    __builtin_prefetch(&tx);
    __builtin_prefetch(&ctr);
  }
  // A post (Engine::prefetch_post): line 0 (state, the send queue's ring),
  // line 1 (the caps it checks), the requester's line (in_req_ready); then the
  // entry it will write, for writing.
  void prefetch_post() const noexcept {
    const char* b = reinterpret_cast<const char*>(this);
    __builtin_prefetch(b, 1);
    __builtin_prefetch(b + 64);
    __builtin_prefetch(&req, 1);
  }
  void prefetch_post_wqe() const noexcept {
    if (sq.full()) return;
    const char* w = reinterpret_cast<const char*>(&sq.at(sq.head));
    __builtin_prefetch(w, 1);
    __builtin_prefetch(w + 64, 1);
  }
  // The send queue entry the requester sends next (after prefetch_tx's lines
  // arrived): its first two lines hold a one-SGE SEND/WRITE (verbs/queues.h).
  void prefetch_next_wqe() const noexcept {
    if (req.idx == sq.head) return;
    const char* w = reinterpret_cast<const char*>(&sq.at(req.idx));
    __builtin_prefetch(w);
    __builtin_prefetch(w + 64);
  }
  // Then (the entry's lines arrived) the first bytes of its payload, at the
  // SGE's address: where an MR registered at its own address (ibv_reg_mr's
  // case) holds them. A hint only: the copy still goes through the MR lookup.
  void prefetch_payload() const noexcept {
    if (req.idx == sq.head) return;
    const verbs::SendWqe& w = sq.at(req.idx);
    if (w.is_inline || w.wr.num_sge == 0) return;
    __builtin_prefetch(reinterpret_cast<const void*>(static_cast<uintptr_t>(w.wr.sg_list[0].addr)));
  }
  bool can_receive() const noexcept {
    return state == verbs::QpState::Rtr || state == verbs::QpState::Rts || state == verbs::QpState::Sqd ||
           state == verbs::QpState::Sqe;
  }
};

}  // namespace droce::transport

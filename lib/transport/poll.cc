// The run-to-completion loop (Engine::poll), the ready lists it serves and
// post_send's way out on a quiet engine (send_inline).
#include <pthread.h>

#include "transport/engine.h"

namespace droce::transport {

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

bool Engine::idle() const noexcept { return req_head_ == req_tail_ && resp_head_ == resp_tail_ && tx_len_ == 0; }

void Engine::prefetch_rx(io::PktBuf* const* b, uint16_t n) noexcept {
  // Two passes, so the misses of each overlap: the QP table's slots of the
  // burst's destination QPNs, then the lines each QP's packet will touch.
  uint32_t qpn[kBurst];
  uint32_t flags[kBurst];  // the opcode's (wire::OpcodeInfo::flags)
  for (uint16_t i = 0; i < n; ++i) {
    uint8_t opc;
    if (!wire::peek_bth(b[i]->data, b[i]->len, opc, qpn[i]) || qpn[i] >= qps_.size()) {
      qpn[i] = UINT32_MAX;
      continue;
    }
    flags[i] = wire::opcode_info(opc).flags;
    __builtin_prefetch(&qps_[qpn[i]]);
  }
  const Qp* qs[kBurst];
  for (uint16_t i = 0; i < n; ++i) {
    qs[i] = qpn[i] == UINT32_MAX ? nullptr : qps_[qpn[i]].get();
    if (qs[i]) qs[i]->prefetch_rx(flags[i]);
  }
  // Then the queue entries they will read (their rings' indexes are on the
  // lines just asked for: the first wait covers the rest): a response retires
  // the oldest send queue entry, a SEND takes the oldest receive queue entry.
  for (uint16_t i = 0; i < n; ++i)
    if (qs[i]) qs[i]->prefetch_rx_wqe(flags[i]);
}

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
  const bool many = live_qps_.size() >= kPrefetchMinQps;
  if (n > 1 && many) prefetch_rx(rx_bufs, n);
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
    if (many) {  // a pipeline: the QP three turns ahead, the send queue entry of the one two
                 // ahead (its QP lines are in), the payload of the next one (its entry is in)
      if (k > 3) req_q_[(req_tail_ + 2) & q_mask_]->prefetch_tx();
      if (k > 2) req_q_[(req_tail_ + 1) & q_mask_]->prefetch_next_wqe();
      if (k > 1) req_q_[req_tail_ & q_mask_]->prefetch_payload();
    }
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

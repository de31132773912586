// The timer wheel (ACK timeout, RNR wait, tail-loss probe) and its backstop sweep.
#include "transport/engine.h"

namespace droce::transport {

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

}  // namespace droce::transport

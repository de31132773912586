#include "transport/dcqcn.h"

#include <algorithm>

namespace droce::transport::dcqcn {
namespace {
constexpr uint32_t kOne = 1024;  // alpha's unit as reported (alpha()) and configured
// alpha is kept in 1/2^20: in whole 1/1024 steps the update's rounding down
// took at least 1/1024 from any alpha of 1-256 (g = 1020) every period while a
// period with a CNP adds 4, so alpha held only while more than a quarter of
// the periods carried a CNP, and fell to 0 at a lower CNP rate however
// congested the queue (seen with 20 QPs through one bottleneck).
constexpr uint32_t kFine = kOne * kOne;
// Events one advance() runs at most before it skips ahead (a QP idle for a
// long time): alpha reaches 0 and the rate line rate well within this.
constexpr uint32_t kMaxSteps = 1u << 16;
}  // namespace

void ReactionPoint::reset(const Params& p) noexcept {
  p_ = p;
  if (p_.min_rate_kbps == 0) p_.min_rate_kbps = 1;
  if (p_.line_rate_kbps < p_.min_rate_kbps) p_.line_rate_kbps = p_.min_rate_kbps;
  if (p_.alpha_g > kOne) p_.alpha_g = kOne;
  if (p_.initial_alpha > kOne) p_.initial_alpha = kOne;
  if (p_.min_dec_fac_pct > 100) p_.min_dec_fac_pct = 100;
  if (p_.alpha_update_period_ns == 0) p_.alpha_update_period_ns = 1;
  if (p_.time_reset_ns == 0) p_.time_reset_ns = 1;
  if (p_.byte_reset == 0) p_.byte_reset = 1;
  ctr_ = {};
  rc_ = rt_ = p_.line_rate_kbps;
  alpha_ = p_.initial_alpha * kOne;
  t_ = bc_ = 0;
  bytes_ = 0;
  next_alpha_ns_ = next_timer_ns_ = last_dec_ns_ = next_send_ns_ = last_ns_ = 0;
  active_ = cnp_alpha_ = cnp_pending_ = time_inc_ = paced_ = false;
}

void ReactionPoint::on_cnp(uint64_t now) noexcept {
  advance(now);
  ++ctr_.cnps;
  if (!active_) {  // the first CNP (or the first since the rate recovered)
    active_ = true;
    alpha_ = p_.initial_alpha * kOne;
    cnp_alpha_ = false;
    if (p_.rate_to_set_on_first_cnp_kbps != 0)
      rc_ = std::clamp(p_.rate_to_set_on_first_cnp_kbps, p_.min_rate_kbps, p_.line_rate_kbps);
    rt_ = rc_;
    next_alpha_ns_ = now + p_.alpha_update_period_ns;
    next_send_ns_ = now;
    decrease(now);
    return;
  }
  cnp_alpha_ = true;
  if (now >= last_dec_ns_ + p_.rate_reduce_monitor_period_ns) decrease(now);
  else cnp_pending_ = true;
}

void ReactionPoint::decrease(uint64_t at) noexcept {
  if (p_.clamp_tgt_rate || (p_.clamp_tgt_rate_after_time_inc && time_inc_)) rt_ = rc_;
  const uint32_t cut = std::min<uint32_t>(alpha_ / kOne / 2, p_.min_dec_fac_pct * kOne / 100);  // of kOne
  const uint64_t dec = static_cast<uint64_t>(rc_) * cut / kOne;
  set_rate(std::max<uint32_t>(p_.min_rate_kbps, static_cast<uint32_t>(rc_ - dec)), at);
  t_ = bc_ = 0;
  bytes_ = 0;
  time_inc_ = false;
  paced_ = false;
  cnp_pending_ = false;
  last_dec_ns_ = at;
  next_timer_ns_ = at + p_.time_reset_ns;
  ++ctr_.decreases;
}

// Fast recovery while either stage is below the threshold, hyper increase
// once both are past it, additive between; the stages count the events
// before this one.
void ReactionPoint::increase_event(uint64_t at) noexcept {
  const uint32_t hi = std::max(t_, bc_), lo = std::min(t_, bc_);
  if (hi >= p_.threshold) {
    uint32_t step = p_.ai_rate_kbps;
    if (lo > p_.threshold) {
      step = p_.hai_rate_kbps;
      ++ctr_.hyper;
    }
    rt_ = static_cast<uint32_t>(std::min<uint64_t>(static_cast<uint64_t>(rt_) + step, p_.line_rate_kbps));
  }
  set_rate(std::min(rt_, rc_ + (rt_ - std::min(rc_, rt_) + 1) / 2), at);  // halfway to the target, rounded up
  ++ctr_.increases;
  if (rc_ >= p_.line_rate_kbps) active_ = false;  // back at line rate: unlimited
}

// The pacer owes the wire the bytes it let go ahead of time (next_send_ns_ in
// the future at the old rate): at a new rate they take proportionally less
// or more time, so a QP slowed to the minimum rate is not held for
// milliseconds after its rate came back.
void ReactionPoint::set_rate(uint32_t kbps, uint64_t at) noexcept {
  if (active_ && next_send_ns_ > at && kbps != rc_)
    next_send_ns_ = at + (next_send_ns_ - at) * rc_ / kbps;
  rc_ = kbps;
}

// The time-reset timer fired (next_timer_ns_): an increase event of stage T,
// unless validate_rate and the QP was not held at its rate since the last one.
void ReactionPoint::timer_event() noexcept {
  if (p_.validate_rate && !paced_) {
    ++ctr_.unused;
  } else {
    increase_event(next_timer_ns_);
    ++t_;
    time_inc_ = true;
  }
  paced_ = false;
  next_timer_ns_ += p_.time_reset_ns;
}

void ReactionPoint::update_alpha() noexcept {
  const uint64_t a = static_cast<uint64_t>(p_.alpha_g) * alpha_ + (cnp_alpha_ ? uint64_t{kOne - p_.alpha_g} * kFine : 0);
  alpha_ = static_cast<uint32_t>(a / kOne);
  cnp_alpha_ = false;
}

// A gap past stall_hold_ns since the last call: every clock of the reaction
// point moves by the gap, as if the gap had not happened.
void ReactionPoint::hold_stall(uint64_t now) noexcept {
  if (active_ && p_.stall_hold_ns != 0 && now > last_ns_ + p_.stall_hold_ns) {
    const uint64_t gap = now - last_ns_;
    next_alpha_ns_ += gap;
    next_timer_ns_ += gap;
    last_dec_ns_ += gap;
    if (next_send_ns_ > last_ns_) next_send_ns_ += gap;
    ++ctr_.stalls;
  }
  last_ns_ = now;
}

void ReactionPoint::advance(uint64_t now) noexcept {
  hold_stall(now);
  for (uint32_t steps = 0; active_ && steps < kMaxSteps; ++steps) {
    const uint64_t dec_at = cnp_pending_ ? last_dec_ns_ + p_.rate_reduce_monitor_period_ns : UINT64_MAX;
    const uint64_t at = std::min({next_alpha_ns_, dec_at, next_timer_ns_});
    if (at > now) return;
    if (at == next_alpha_ns_) {
      if (alpha_ == 0 && !cnp_alpha_) {  // nothing left to decay: skip to now
        const uint64_t n = (now - next_alpha_ns_) / p_.alpha_update_period_ns + 1;
        next_alpha_ns_ += n * p_.alpha_update_period_ns;
      } else {
        update_alpha();
        next_alpha_ns_ += p_.alpha_update_period_ns;
      }
    } else if (at == dec_at) {
      decrease(dec_at);
    } else {
      timer_event();
    }
  }
  if (active_) {  // a long idle time: the timer's recovery, bounded, then skip to now
    next_alpha_ns_ = std::max(next_alpha_ns_, now);
    for (uint32_t steps = 0; active_ && next_timer_ns_ <= now && steps < kMaxSteps; ++steps) {
      timer_event();
    }
    if (next_timer_ns_ <= now) next_timer_ns_ = now + p_.time_reset_ns;
    if (cnp_pending_ && last_dec_ns_ + p_.rate_reduce_monitor_period_ns <= now) decrease(now);
  }
}

void ReactionPoint::on_sent(uint64_t now, uint64_t bytes) noexcept {
  if (!active_) return;
  hold_stall(now);
  const uint64_t tx_ns = bytes * 8'000'000 / rc_;
  const uint64_t burst_ns = p_.burst_bytes * 8'000'000 / rc_;
  const uint64_t base = std::max(next_send_ns_, now > burst_ns ? now - burst_ns : 0);
  next_send_ns_ = base + tx_ns;
  bytes_ += bytes;
  while (active_ && bytes_ >= p_.byte_reset) {
    bytes_ -= p_.byte_reset;
    increase_event(now);
    ++bc_;
  }
}

}  // namespace droce::transport::dcqcn

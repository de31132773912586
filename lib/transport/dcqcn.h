// DCQCN reaction point: the per-QP rate a sender keeps when the fabric marks
// ECN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments",
// SIGCOMM 2015), with the parameters and fixed-point conventions of NVIDIA's
// firmware (alpha configured and reported in 1/1024 units, kept in 1/2^20;
// rates in kb/s). Pure arithmetic on a
// caller-supplied clock: no timers of its own, no allocation; the engine
// calls it from the QP's owning core.
//
//   CNP ──► on_cnp(now) ──► (at most once per rate-reduce monitor period)
//            target = current (when clamped); current *= 1 - alpha/2;
//            alpha counters and the increase stages restart
//   every alpha period: alpha = (g * alpha + (1024 - g) * 2^20 * cnp) / 1024 (in 1/2^20)
//   every time-reset period (T++) and every byte-reset bytes sent (BC++):
//            an increase event: fast recovery while max(T, BC) < threshold,
//            hyper increase when min(T, BC) > threshold, else additive;
//            each moves current halfway to target.
//   on_sent(now, bytes) / next_send_ns(): the pacer, a token bucket of
//            burst_bytes at the current rate.
#pragma once

#include <cstdint>

namespace droce::transport::dcqcn {

struct Params {
  uint32_t line_rate_kbps = 100'000'000;   // the port's rate: where a QP starts
  uint32_t min_rate_kbps = 1'000;          // 1 Mb/s
  uint32_t ai_rate_kbps = 5'000;           // additive increase, 5 Mb/s
  uint32_t hai_rate_kbps = 50'000;         // hyper increase, 50 Mb/s
  uint32_t rate_to_set_on_first_cnp_kbps = 0;  // 0: keep the current rate, then decrease
  uint32_t alpha_g = 1019;                 // alpha keeps g/1024 of itself per update
  uint32_t initial_alpha = 1023;           // of 1024
  uint64_t alpha_update_period_ns = 1'000;
  uint64_t rate_reduce_monitor_period_ns = 4'000;
  uint64_t time_reset_ns = 300'000;
  uint64_t byte_reset = 32767ull * 64;
  uint32_t threshold = 1;                  // F: stages of fast recovery
  uint32_t min_dec_fac_pct = 50;           // one decrease cuts at most this share
  bool clamp_tgt_rate = false;             // every decrease sets target = current
  bool clamp_tgt_rate_after_time_inc = true;  // ... when the timer raised the rate since
  uint64_t burst_bytes = 4096;             // the pacer lets this much leave back to back
  // A gap longer than this between two calls (the poll loop descheduled, as
  // on a shared CPU) does not count as time: the alpha, timer and pacer
  // clocks resume where they stopped instead of running the gap's timer
  // increases and alpha decay at once. 0: off (every gap counts).
  uint64_t stall_hold_ns = 0;
  // The timer raises the rate only when the pacer held the QP back since the
  // last increase or decrease (on_paced): a QP sending below its rate (short
  // of CPU or of work) does not gain rate it is not using, as TCP's window
  // validation does not grow an unused window. false: NVIDIA's (always).
  bool validate_rate = false;
  // A limited QP keeps at most its current rate x window_ns of bytes in
  // flight (window_bytes(); the requester's window in packets then is the
  // smaller of its congestion window and this): what a QP has in flight can
  // reach the queue at once when the acknowledgments come back together (a
  // receiver whose poll loop stalled), so the queue DCQCN's rates can build
  // is bounded by the sum of the rates x window_ns, as HPCC and Swift bound a
  // flow's window by its rate x RTT. A QP held by it is not held by the pacer,
  // so with validate_rate the timer does not raise its rate meanwhile. 0: off.
  uint64_t window_ns = 0;
};

// The DCQCN paper's timescales (Zhu et al. 2015): alpha updated every 55 us
// with g = 1/256 (keeps 1020/1024), the increase timer 55 us, the byte counter
// 10 MB, F = 5 fast-recovery stages, additive increase 40 Mb/s, the target
// clamped to the current rate on every decrease; hyper increase 400 Mb/s
// (10 x AI, our choice). The paper pairs them with a CNP every 50 us at most
// (the notification point's interval, set apart). NVIDIA's defaults (Params{})
// forget congestion far sooner: alpha loses 5/1024 of itself every 1 us (half
// in ~140 us) while a CNP every 4 us at most adds 5/1024, so alpha stays
// under ~1/4 and decays to nothing in one 300 us timer period
// (lib/transport/README.md, through a bottleneck).
inline Params paper_params(uint32_t line_rate_kbps) noexcept {
  Params p;
  p.line_rate_kbps = line_rate_kbps;
  p.alpha_g = 1020;
  p.alpha_update_period_ns = 55'000;
  p.time_reset_ns = 55'000;
  p.byte_reset = 10'000'000;
  p.threshold = 5;
  p.ai_rate_kbps = 40'000;
  p.hai_rate_kbps = 400'000;
  p.clamp_tgt_rate = true;
  return p;
}

// Counters the operator sees per QP.
struct Counters {
  uint64_t cnps = 0;        // CNPs handled
  uint64_t decreases = 0;   // rate decreases (at most one per monitor period)
  uint64_t increases = 0;   // increase events (any stage)
  uint64_t hyper = 0;       // of which hyper increases
  uint64_t stalls = 0;      // gaps past stall_hold_ns held (not counted as time)
  uint64_t unused = 0;      // timer increases skipped: the QP was not held at its rate (validate_rate)
};

class ReactionPoint {
 public:
  explicit ReactionPoint(const Params& p = Params{}) noexcept { reset(p); }
  void reset(const Params& p) noexcept;

  // A CNP for this QP arrived at `now`.
  void on_cnp(uint64_t now) noexcept;
  // A packet of `bytes` (headers included) left the QP at `now`: moves the
  // pacer and the byte counter.
  void on_sent(uint64_t now, uint64_t bytes) noexcept;
  // Runs the periodic alpha update, the pending decrease and the timer's
  // increase events due by `now`. Cheap when nothing is due.
  void advance(uint64_t now) noexcept;
  // The pacer held the QP back (its next send time had not come).
  void on_paced() noexcept { paced_ = true; }

  // Earliest time the next packet may leave at the current rate (0: now); a
  // QP that is not limited is never held.
  uint64_t next_send_ns() const noexcept { return active_ ? next_send_ns_ : 0; }

  bool limited() const noexcept { return active_; }  // a CNP has been seen and the rate is not back at line rate
  uint32_t current_kbps() const noexcept { return rc_; }
  uint32_t target_kbps() const noexcept { return rt_; }
  uint32_t alpha() const noexcept { return alpha_ / 1024; }  // of 1024 (rounded down)
  // Bytes the QP may have in flight at its current rate (Params::window_ns);
  // 0: no such bound (not limited, or window_ns 0).
  uint64_t window_bytes() const noexcept {
    return active_ && p_.window_ns != 0 ? uint64_t{rc_} * p_.window_ns / 8'000'000 : 0;
  }
  uint32_t time_stage() const noexcept { return t_; }
  uint32_t byte_stage() const noexcept { return bc_; }
  const Counters& counters() const noexcept { return ctr_; }
  const Params& params() const noexcept { return p_; }

 private:
  void decrease(uint64_t at) noexcept;
  void increase_event(uint64_t at) noexcept;
  void set_rate(uint32_t kbps, uint64_t at) noexcept;
  void update_alpha() noexcept;
  void hold_stall(uint64_t now) noexcept;
  void timer_event() noexcept;

  bool active_ = false;        // rate limiting in force (first: the requester reads it per send)
  Params p_{};
  Counters ctr_{};
  uint32_t rc_ = 0, rt_ = 0;   // current and target rate, kb/s
  uint32_t alpha_ = 0;         // of 1024 * 1024 (dcqcn.cc: why finer than it is reported)
  uint32_t t_ = 0, bc_ = 0;    // timer and byte stages since the last decrease
  uint64_t bytes_ = 0;         // toward the next byte stage
  uint64_t next_alpha_ns_ = 0, next_timer_ns_ = 0, last_dec_ns_ = 0;
  uint64_t next_send_ns_ = 0;
  uint64_t last_ns_ = 0;       // the last call's time (stall_hold_ns)
  bool cnp_alpha_ = false;     // a CNP since the last alpha update
  bool cnp_pending_ = false;   // a CNP inside the monitor period, not yet acted on
  bool time_inc_ = false;
  bool paced_ = false;         // the pacer held the QP since the last rate change (validate_rate)      // the timer raised the rate since the last decrease
};

}  // namespace droce::transport::dcqcn

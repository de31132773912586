// droce/fault: the queue model of a bottleneck, a switch egress queue drained
// at a fixed rate, shared by the in-memory link (drivers/memlink, virtual
// clock) and the fault injector of a real port (fault_injector.h, the TSC).
//
// A frame arriving at `at` finds q bytes queued (what has not drained since):
//   q + len > limit_bytes          tail drop
//   ecn and q > kmin_bytes         marked CE with probability pmax * (q - kmin) / (kmax - kmin),
//                                  always when q >= kmax_bytes (RED as DCQCN's switches run it)
// With mark_dequeue the same RED decision is taken when the frame leaves, on
// the bytes queued behind it then (bottleneck_mark_dequeue): switches that mark
// on departure. Marking on arrival, a CE frame first waits behind the queue it
// reports (200 us behind 1 MB at 40 Gb/s) while the senders go on at their rate.
// otherwise it joins the queue and leaves when the frames before it and its
// own bytes have drained: depart = max(at, drained) + len / rate.
// Rate in bits/s, or in frames/s (rate_pps, when rate_bps is 0: each frame
// takes 1/rate_pps whatever its size; the queue's bytes are then counted as
// frames waiting x the arriving frame's size). Pure arithmetic, no clock of
// its own, no allocation: the caller keeps the state (drained_ns, max_queue).
//
// PFC (802.1Qbb, pfc_xoff_bytes > 0): a lossless class. A frame that would
// take the queue past pfc_xoff_bytes is not sent: the switch pauses the link
// toward it, and the sender keeps its frames (a NIC whose paused priority
// stops its TX: tx_burst takes nothing more) until the queue has drained to
// pfc_xon_bytes (bottleneck_pfc_admit). The pause acts at once here (a real
// switch keeps headroom above Xoff for what is on the wire meanwhile); with
// pfc_xoff_bytes <= limit_bytes nothing is tail-dropped.
#pragma once

#include <algorithm>
#include <cstdint>

namespace droce::fault {

struct Bottleneck {
  uint64_t rate_bps = 0;  // drain rate; 0: rate_pps, or no bottleneck when both are 0
  uint64_t rate_pps = 0;
  uint64_t kmin_bytes = 5'000;
  uint64_t kmax_bytes = 200'000;
  double pmax = 0.01;
  uint64_t limit_bytes = 1'000'000;
  bool ecn = true;  // false: tail drop only
  bool mark_dequeue = false;  // RED on the queue a frame leaves behind, not the one it finds
  uint64_t pfc_xoff_bytes = 0;  // PFC: pause the sender past this queue; 0: no PFC
  uint64_t pfc_xon_bytes = 0;   // PFC: resume once the queue has drained to this
  bool pfc() const noexcept { return pfc_xoff_bytes != 0; }
  bool active() const noexcept { return rate_bps != 0 || rate_pps != 0; }
};

// The thresholds' order, checked in one place for the config reader and
// droce-perf's flags: kmin < kmax <= limit, and with PFC xon < xoff <= limit
// (a lossless class tail-drops nothing). The first rule b breaks, with the
// config key it is about, its value and the bound it crosses; key is null
// when b keeps them all.
struct BnRuleBroken {
  const char* key = nullptr;
  const char* what = nullptr;  // "is not below kmax_bytes"
  uint64_t value = 0;
  uint64_t bound = 0;
};

inline BnRuleBroken bottleneck_check(const Bottleneck& b) noexcept {
  if (b.kmin_bytes >= b.kmax_bytes) return {"kmin_bytes", "is not below kmax_bytes", b.kmin_bytes, b.kmax_bytes};
  if (b.kmax_bytes > b.limit_bytes) return {"kmax_bytes", "is above limit_bytes", b.kmax_bytes, b.limit_bytes};
  if (b.pfc() && b.pfc_xon_bytes >= b.pfc_xoff_bytes)
    return {"pfc_xon_bytes", "is not below pfc_xoff_bytes", b.pfc_xon_bytes, b.pfc_xoff_bytes};
  if (b.pfc() && b.pfc_xoff_bytes > b.limit_bytes)
    return {"pfc_xoff_bytes", "is above limit_bytes", b.pfc_xoff_bytes, b.limit_bytes};
  return {};
}

enum class BnVerdict : uint8_t { Pass, Mark, Drop };

// Bytes still queued at `now` when the queue drains at drained_ns; frame_bytes
// stands for each waiting frame in frames/s mode.
inline uint64_t bottleneck_queue_bytes(const Bottleneck& b, uint64_t drained_ns, uint64_t now,
                                       uint32_t frame_bytes = 1024) noexcept {
  if (!b.active() || drained_ns <= now) return 0;
  const uint64_t left = drained_ns - now;
  if (b.rate_bps != 0) return left * (b.rate_bps / 1000) / 8'000'000ull;  // kb/s: no overflow for minutes
  return (left * b.rate_pps + 999'999'999ull) / 1'000'000'000ull * frame_bytes;
}

// RED's marking probability for a frame finding q bytes queued.
inline double bottleneck_mark_probability(const Bottleneck& b, uint64_t q) noexcept {
  if (!b.ecn || q <= b.kmin_bytes) return 0.0;
  if (q >= b.kmax_bytes) return 1.0;
  return b.pmax * static_cast<double>(q - b.kmin_bytes) / static_cast<double>(b.kmax_bytes - b.kmin_bytes);
}

// Time one frame of len bytes takes to drain.
inline uint64_t bottleneck_service_ns(const Bottleneck& b, uint32_t len) noexcept {
  if (b.rate_bps != 0) return uint64_t{len} * 8'000'000'000ull / b.rate_bps;
  return b.rate_pps != 0 ? 1'000'000'000ull / b.rate_pps : 0;
}

// A frame of len bytes arrives at `at`. Drop: the queue would pass its limit
// (state unchanged). Otherwise the frame is queued: drained_ns and max_queue
// move, *depart is when it has left; Mark when RED picked it (the caller
// marks it CE if it is ECN-capable). uniform() returns a draw in [0, 1) and
// is called only when the queue is past kmin with ECN on (so a seeded caller's
// sequence of draws does not depend on idle queues). *found (when not null)
// is the queue the frame found, bytes, whatever the verdict.
template <class Uniform>
BnVerdict bottleneck_offer(const Bottleneck& b, uint64_t& drained_ns, uint64_t& max_queue, uint64_t at, uint32_t len,
                           Uniform&& uniform, uint64_t* depart, uint64_t* found = nullptr) noexcept {
  const uint64_t q = bottleneck_queue_bytes(b, drained_ns, at, len);
  if (found != nullptr) *found = q;
  if (q + len > b.limit_bytes) return BnVerdict::Drop;
  BnVerdict v = BnVerdict::Pass;
  if (b.ecn && !b.mark_dequeue && q > b.kmin_bytes) {
    const double p = bottleneck_mark_probability(b, q);
    if (uniform() < p) v = BnVerdict::Mark;
  }
  max_queue = std::max(max_queue, q + len);
  drained_ns = std::max(at, drained_ns) + bottleneck_service_ns(b, len);
  *depart = drained_ns;
  return v;
}

// Marking on departure (mark_dequeue): the frame that leaves at `depart` when
// the queue drains at drained_ns leaves q bytes behind it and is marked with
// RED's probability for q. uniform() is called only past kmin, as above.
template <class Uniform>
bool bottleneck_mark_dequeue(const Bottleneck& b, uint64_t drained_ns, uint64_t depart, uint32_t len,
                             Uniform&& uniform) noexcept {
  if (!b.ecn || !b.mark_dequeue) return false;
  const uint64_t q = bottleneck_queue_bytes(b, drained_ns, depart, len);
  return q > b.kmin_bytes && uniform() < bottleneck_mark_probability(b, q);
}

// When the queue that drains at drained_ns holds `bytes` (frame_bytes per
// waiting frame in frames/s mode).
inline uint64_t bottleneck_drained_to_ns(const Bottleneck& b, uint64_t drained_ns, uint64_t bytes,
                                         uint32_t frame_bytes = 1024) noexcept {
  uint64_t left = 0;
  if (b.rate_bps != 0) left = bytes * 8'000'000ull / (b.rate_bps / 1000);
  else if (b.rate_pps != 0) left = bytes / (frame_bytes ? frame_bytes : 1) * 1'000'000'000ull / b.rate_pps;
  return drained_ns > left ? drained_ns - left : 0;
}

// PFC: may a frame of len bytes reach the queue at `at`? Not while the sender
// is paused (at < paused_until), nor when it would take the queue past
// pfc_xoff_bytes: then paused_until becomes the time the queue has drained to
// pfc_xon_bytes, and the return is false with *paused set when this is a new
// pause (a PAUSE frame on the wire). Always true without PFC.
inline bool bottleneck_pfc_admit(const Bottleneck& b, uint64_t drained_ns, uint64_t& paused_until, uint64_t at,
                                 uint32_t len, bool* paused) noexcept {
  *paused = false;
  if (!b.pfc() || !b.active()) return true;
  if (at < paused_until) return false;
  const uint64_t q = bottleneck_queue_bytes(b, drained_ns, at, len);
  if (q == 0 || q + len <= b.pfc_xoff_bytes) return true;  // an empty queue takes any frame
  paused_until = std::max(at + 1, bottleneck_drained_to_ns(b, drained_ns, b.pfc_xon_bytes, len));
  *paused = true;
  return false;
}

// Marks an Ethernet frame's IPv4/IPv6 packet CE (the IPv4 header checksum
// redone); false, frame untouched, when it is not IP or not ECN-capable.
bool mark_ce(uint8_t* frame, uint32_t len) noexcept;

}  // namespace droce::fault

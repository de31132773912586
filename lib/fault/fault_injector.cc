#include "fault/fault_injector.h"

#include <cstring>

namespace droce::fault {

using config::FaultKind;
using stats::PortCounter;

FaultInjector::FaultInjector(const config::PortFaults& faults, config::FaultDir dir, uint64_t stream,
                             stats::CounterBlock<PortCounter>* counters) noexcept
    : faults_(faults), dir_(dir), stream_(stream), counters_(counters), bn_q_(new BnFrame[kBnFrames]) {
  reload();
}

void FaultInjector::reload() noexcept {
  generation_ = faults_.generation.load(std::memory_order_acquire);
  active_ = false;
  for (size_t k = 0; k < config::kFaultKinds; ++k) {
    t_[k] = faults_.get(dir_, static_cast<FaultKind>(k));
    active_ = active_ || t_[k] != 0;
  }
  bn_ = faults_.bottleneck(dir_);
  bn_on_ = bn_.active() && clock_ != nullptr;
  active_ = active_ || bn_on_;
  uint64_t seed = faults_.seed.load(std::memory_order_relaxed);
  if (seed != seed_ || state_ == 0) {
    seed_ = seed;
    // splitmix64 of (seed, stream): a non-zero start for xorshift.
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream_ + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    state_ = z != 0 ? z : 0x853C49E6748FEA9BULL;
  }
}

void FaultInjector::count(size_t kind) noexcept {
  if (counters_ == nullptr) return;
  // fault_rx_drop .. fault_rx_corrupt, then the same four for tx.
  size_t base = static_cast<size_t>(dir_ == config::FaultDir::rx ? PortCounter::fault_rx_drop
                                                                 : PortCounter::fault_tx_drop);
  counters_->add(static_cast<PortCounter>(base + kind));
}

void FaultInjector::count_bn(size_t which, uint64_t v, bool set) noexcept {
  if (counters_ == nullptr) return;
  const size_t base = static_cast<size_t>(dir_ == config::FaultDir::rx ? PortCounter::fault_rx_bn_drop
                                                                       : PortCounter::fault_tx_bn_drop);
  if (set) counters_->set(static_cast<PortCounter>(base + which), v);
  else counters_->add(static_cast<PortCounter>(base + which), v);
}

// Frames out[0..nout) join the bottleneck queue (or are dropped or marked);
// then the frames whose time has come go back into out. Returns their count.
uint16_t FaultInjector::bn_pass(io::PacketIo* io, io::PktBuf** out, uint16_t nout, uint16_t cap) noexcept {
  const uint64_t now = clock_ != nullptr ? clock_->now_ns() : 0;
  if (bn_on_) {
    io::PktBuf* dropped[kMaxBurst];
    uint16_t ndrop = 0;
    const uint64_t max_before = bn_max_q_;
    uint64_t queued = 0, over_kmax = 0, found_sum = 0;  // counted once per burst
    for (uint16_t i = 0; i < nout; ++i) {
      io::PktBuf* b = out[i];
      uint64_t depart = 0, found = 0;
      const BnVerdict v = bn_head_ - bn_tail_ >= kBnFrames
                              ? BnVerdict::Drop
                              : bottleneck_offer(bn_, bn_drained_, bn_max_q_, now, b->len,
                                                 [this] { return next() * (1.0 / 4294967296.0); }, &depart, &found);
      if (v == BnVerdict::Drop) {
        dropped[ndrop++] = b;
        count_bn(0);
        continue;
      }
      if (v == BnVerdict::Mark && mark_ce(b->data, b->len)) count_bn(1);
      bn_q_[bn_head_++ & (kBnFrames - 1)] = BnFrame{b, depart, false};
      ++queued;
      over_kmax += found >= bn_.kmax_bytes;
      found_sum += found;
    }
    if (ndrop) io->free_burst(dropped, ndrop);
    if (bn_max_q_ != max_before) count_bn(2, bn_max_q_, true);
    if (queued != 0) {
      count_bn(4, queued);
      if (over_kmax != 0) count_bn(5, over_kmax);
      count_bn(6, found_sum);
    }
    nout = 0;
  }
  // Departures (all at once when the mode was switched off meanwhile). Marking
  // on departure judges the queue behind the frame when it left.
  while (bn_tail_ != bn_head_ && nout < cap) {
    const BnFrame& f = bn_q_[bn_tail_ & (kBnFrames - 1)];
    if (bn_on_ && f.depart > now) break;
    if (bn_on_ && bn_.mark_dequeue && !f.back &&
        bottleneck_mark_dequeue(bn_, bn_drained_, f.depart, f.b->len,
                                [this] { return next() * (1.0 / 4294967296.0); }) &&
        mark_ce(f.b->data, f.b->len))
      count_bn(1);
    out[nout++] = f.b;
    ++bn_tail_;
  }
  return nout;
}

uint16_t FaultInjector::requeue_front(io::PktBuf* const* bufs, uint16_t n) noexcept {
  if (!bn_on_ || n == 0) return 0;
  const uint64_t now = clock_ != nullptr ? clock_->now_ns() : 0;
  // They left the tail just now, so their slots are free (no frame joined
  // since); the room check only guards against a caller that breaks that.
  const uint32_t room = kBnFrames - (bn_head_ - bn_tail_);
  const uint16_t k = static_cast<uint16_t>(std::min<uint32_t>(n, room));
  uint64_t stuck_ns = 0;  // what the frames at the head take to drain
  bn_tail_ -= k;
  for (uint16_t i = 0; i < k; ++i) {
    bn_q_[(bn_tail_ + i) & (kBnFrames - 1)] = BnFrame{bufs[i], now, true};
    stuck_ns += bottleneck_service_ns(bn_, bufs[i]->len);
  }
  // The queue holds at least the frames stuck at its head (a max, not a sum:
  // the model already counts the frames behind them, and a frame refused on
  // every poll of a stalled receiver must not add up).
  bn_drained_ = std::max(bn_drained_, now + stuck_ns);
  const uint64_t q = fault::bottleneck_queue_bytes(bn_, bn_drained_, now);
  if (q > bn_max_q_) {
    bn_max_q_ = q;
    count_bn(2, bn_max_q_, true);
  }
  return k;
}

uint16_t FaultInjector::pfc_admit(io::PktBuf* const* bufs, uint16_t n) noexcept {
  if (faults_.generation.load(std::memory_order_relaxed) != generation_) reload();
  if (!bn_on_ || !bn_.pfc() || dir_ != config::FaultDir::tx) return n;
  const uint64_t now = clock_->now_ns();
  // The queue as it would be after each admitted frame (the faults in apply()
  // may still drop some: then it is shorter, never longer, except duplicates).
  uint64_t drained = bn_drained_;
  for (uint16_t i = 0; i < n; ++i) {
    bool paused = false;
    if (!bottleneck_pfc_admit(bn_, drained, bn_pfc_until_, now, bufs[i]->len, &paused)) {
      if (paused) count_bn(3);
      return i;
    }
    drained = std::max(now, drained) + bottleneck_service_ns(bn_, bufs[i]->len);
  }
  return n;
}

uint16_t FaultInjector::release(io::PktBuf** bufs, uint16_t cap) noexcept {
  if (bn_tail_ == bn_head_) return 0;
  if (faults_.generation.load(std::memory_order_relaxed) != generation_) reload();
  if (cap > kMaxBurst) cap = kMaxBurst;
  return bn_pass(nullptr, bufs, 0, cap);
}

uint16_t FaultInjector::apply(io::PacketIo& io, io::PktBuf** bufs, uint16_t n, uint16_t cap) noexcept {
  if (faults_.generation.load(std::memory_order_relaxed) != generation_) reload();
  if (!active_ && held_ == nullptr && bn_tail_ == bn_head_) return n;
  if (cap > kMaxBurst) cap = kMaxBurst;
  if (n > cap) n = cap;

  io::PktBuf* out[kMaxBurst];
  io::PktBuf* dropped[kMaxBurst];
  uint16_t nout = 0, ndrop = 0;
  const uint32_t t_drop = t_[static_cast<size_t>(FaultKind::drop)];
  const uint32_t t_dup = t_[static_cast<size_t>(FaultKind::duplicate)];
  const uint32_t t_reorder = t_[static_cast<size_t>(FaultKind::reorder)];
  const uint32_t t_corrupt = t_[static_cast<size_t>(FaultKind::corrupt)];
  // Threshold t = p * 2^32; UINT32_MAX stands for p = 1 and always fires.
  auto hit = [this](uint32_t t) { return t != 0 && (t == UINT32_MAX || next() < t); };

  for (uint16_t i = 0; i < n; ++i) {
    io::PktBuf* b = bufs[i];
    if (hit(t_drop)) {
      dropped[ndrop++] = b;
      count(static_cast<size_t>(FaultKind::drop));
      continue;
    }
    if (hit(t_corrupt) && b->len > 14) {
      uint32_t r = next();
      uint32_t off = 14 + r % (b->len - 14);
      b->data[off] ^= static_cast<uint8_t>(1u << ((r >> 24) & 7));
      count(static_cast<size_t>(FaultKind::corrupt));
    }
    if (held_ == nullptr && hit(t_reorder)) {
      held_ = b;
      held_calls_ = 0;
      count(static_cast<size_t>(FaultKind::reorder));
      continue;
    }
    if (nout < cap) {
      out[nout++] = b;
    } else {
      dropped[ndrop++] = b;  // cannot happen unless duplicates filled the burst
      continue;
    }
    if (held_ != nullptr) {  // the held frame goes out after the one that followed it
      if (nout < cap) {
        out[nout++] = held_;
      } else {
        dropped[ndrop++] = held_;
      }
      held_ = nullptr;
    }
    // Room is kept for the remaining input frames before adding copies.
    if (hit(t_dup) && nout + (n - i - 1) < cap) {
      io::PktBuf* copy = nullptr;
      if (io.alloc_burst(&copy, 1) == 1) {
        if (copy->cap >= b->len) {
          std::memcpy(copy->data, b->data, b->len);
          copy->len = b->len;
          // Zero-copy frame: the copy refers to the same registered memory
          // (the backend takes a reference for each when it sends them).
          copy->ext = b->ext;
          copy->ext_ref = b->ext_ref;
          copy->ext_len = b->ext_len;
          copy->tail_len = b->tail_len;
          std::memcpy(copy->tail, b->tail, sizeof copy->tail);
          copy->port = b->port;
          copy->queue = b->queue;
          out[nout++] = copy;
          count(static_cast<size_t>(FaultKind::duplicate));
        } else {
          io.free_burst(&copy, 1);
        }
      }
    }
  }
  // A held frame with nothing after it for a while goes out late, on its own.
  if (held_ != nullptr && n == 0 && ++held_calls_ >= kHoldCalls && nout < cap) {
    out[nout++] = held_;
    held_ = nullptr;
  }
  if (ndrop != 0) io.free_burst(dropped, ndrop);
  if (bn_on_ || bn_tail_ != bn_head_) nout = bn_pass(&io, out, nout, cap);
  std::memcpy(bufs, out, nout * sizeof(io::PktBuf*));
  return nout;
}

uint16_t FaultInjector::flush(io::PktBuf** bufs, uint16_t cap) noexcept {
  uint16_t k = 0;
  if (held_ != nullptr && cap != 0) {
    bufs[k++] = held_;
    held_ = nullptr;
  }
  while (bn_tail_ != bn_head_ && k < cap) bufs[k++] = bn_q_[bn_tail_++ & (kBnFrames - 1)].b;
  return k;
}

}  // namespace droce::fault

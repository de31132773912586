// droce/fault: per-port fault injection applied to packet bursts, without DPDK.
//
// One FaultInjector per (port, queue, direction), owned by the core that owns
// the queue: on RX it runs on what rx_burst returned, on TX on what is about
// to go to tx_burst. Its settings come from the port's config::PortFaults
// (config file, changed at run time by `droce-ctl fault set`), re-read only
// when their generation changes. With every probability zero it costs one
// relaxed load per burst (passthrough(), inline, lets the owner skip apply()).
//
// Per frame, in this order, each with its own probability:
//   drop       the frame is handed back to io.free_burst
//   corrupt    one random bit after the Ethernet header is flipped
//   reorder    the frame is held back and sent after the next frame (or,
//              if none comes for kHoldCalls calls, late on its own)
//   duplicate  a copy (a buffer from io.alloc_burst) follows the frame; when
//              no buffer is free the copy is skipped
// Each injected fault is counted in the port's fault_{rx,tx}_* counter.
//
// Bottleneck mode (PortFaults::set_bottleneck, [port.fault.tx.bottleneck]):
// after the faults above, every frame goes through a queue drained at a fixed
// rate with RED/ECN marking and tail drop (the model of bottleneck.h, the same
// as the in-memory link's), timed by the clock given to set_clock. A frame
// leaves the injector when its departure time has come: from a later apply()
// or from release(), which the owner calls on polls without traffic (the
// dataplane's DemuxIo does, every rx_burst). Counted in fault_{rx,tx}_bn_drop,
// _bn_mark and _bn_max_queue (the largest queue seen, bytes); of the frames
// that joined the queue, _bn_frames, _bn_over_kmax (those that found kmax_bytes
// queued or more, where RED marks every frame) and _bn_queue_sum (the bytes each found queued,
// summed: the differences of two reads give the mean queue the frames found
// between them). Summed per burst, one add each: the queue is watched from
// outside (droce-ctl counters) at no cost per frame beyond an add and a compare.
#pragma once

#include <cstdint>
#include <memory>

#include "fault/bottleneck.h"
#include "io/packet_io.h"

#include "config/fault_table.h"
#include "stats/groups.h"

namespace droce::fault {

class FaultInjector {
 public:
  static constexpr uint16_t kMaxBurst = 512;
  static constexpr uint32_t kHoldCalls = 16;
  static constexpr uint32_t kBnFrames = 4096;  // frames the bottleneck queue holds at most (power of two)

  // stream tells apart the injectors of one port (e.g. queue * 2 + dir) so they
  // draw different numbers from the same seed.
  FaultInjector(const config::PortFaults& faults, config::FaultDir dir, uint64_t stream,
                stats::CounterBlock<stats::PortCounter>* counters) noexcept;

  // Applies the faults to bufs[0..n) in place and returns the new count
  // (at most cap, cap <= kMaxBurst). Frames not returned were freed or held.
  uint16_t apply(io::PacketIo& io, io::PktBuf** bufs, uint16_t n, uint16_t cap) noexcept;

  // Puts a held frame (if any) into bufs[0]; returns 0 or 1. For shutdown.
  uint16_t flush(io::PktBuf** bufs, uint16_t cap) noexcept;

  bool holding() const noexcept { return held_ != nullptr || bn_head_ != bn_tail_; }
  // True when apply() would hand its input back as it is (no fault set,
  // nothing held or queued, settings unchanged since the last call): the
  // owner skips the call (inline: one relaxed load, no call per burst).
  bool passthrough() const noexcept {
    return !active_ && held_ == nullptr && bn_head_ == bn_tail_ &&
           faults_.generation.load(std::memory_order_relaxed) == generation_;
  }

  // The bottleneck's time source (without one it is never active).
  void set_clock(const io::Clock* c) noexcept {
    clock_ = c;
    generation_ = ~0ULL;  // re-read the settings at the next call
  }
  // Frames of the bottleneck queue whose departure time has come, into bufs
  // (at most cap); for polls that send nothing. Returns how many.
  uint16_t release(io::PktBuf** bufs, uint16_t cap) noexcept;
  // The departures that release() or apply() just handed out and the device
  // did not take (its TX ring full: the receiver stalled), bufs[0..n) in the
  // order they were handed out: back to the head of the bottleneck queue, due
  // at once, as a switch keeps what its egress cannot send yet (the loss of a
  // lossless class was the emulator's, not the network's). The queue then
  // holds at least their bytes (it does not drain before they could go).
  // Returns how many it took, from bufs[0] on: 0 when the bottleneck is off;
  // the rest are the caller's (a counted drop).
  uint16_t requeue_front(io::PktBuf* const* bufs, uint16_t n) noexcept;
  // PFC: how many of bufs[0..n) the TX bottleneck takes now (n without PFC).
  uint16_t pfc_admit(io::PktBuf* const* bufs, uint16_t n) noexcept;
  uint32_t bottleneck_frames() const noexcept { return bn_head_ - bn_tail_; }
  uint64_t bottleneck_queue_bytes(uint64_t now) const noexcept {
    return fault::bottleneck_queue_bytes(bn_, bn_drained_, now);
  }

 private:
  void reload() noexcept;
  uint32_t next() noexcept {  // xorshift64*: fast, good enough to pick faults
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1DULL) >> 32);
  }
  void count(size_t kind) noexcept;
  // 0 drop, 1 mark, 2 max queue, 3 pause, 4 frames, 5 over kmax, 6 queue sum
  void count_bn(size_t which, uint64_t v = 1, bool set = false) noexcept;
  uint16_t bn_pass(io::PacketIo* io, io::PktBuf** out, uint16_t nout, uint16_t cap) noexcept;

  const config::PortFaults& faults_;
  const config::FaultDir dir_;
  const uint64_t stream_;
  stats::CounterBlock<stats::PortCounter>* counters_;
  uint64_t generation_ = ~0ULL;
  uint64_t seed_ = 0;
  uint64_t state_ = 1;
  uint32_t t_[config::kFaultKinds] = {};
  bool active_ = false;
  io::PktBuf* held_ = nullptr;
  uint32_t held_calls_ = 0;
  // Bottleneck mode.
  const io::Clock* clock_ = nullptr;
  fault::Bottleneck bn_{};
  bool bn_on_ = false;
  uint64_t bn_drained_ = 0, bn_max_q_ = 0;
  uint64_t bn_pfc_until_ = 0;  // PFC: paused until the queue has drained to Xon
  struct BnFrame {
    io::PktBuf* b;
    uint64_t depart;
    bool back;  // requeued by requeue_front: judged by RED already
  };
  std::unique_ptr<BnFrame[]> bn_q_;  // FIFO, departures in order
  uint32_t bn_head_ = 0, bn_tail_ = 0;
};

}  // namespace droce::fault

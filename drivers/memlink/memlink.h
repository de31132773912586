// memlink: an in-memory Ethernet segment joining two or more PacketIo
// endpoints, for tests and benchmarks of the engine without a NIC.
//
// - Time is a VirtualClock the test advances; a frame sent at t is delivered
//   at t + delay (+ extra delay when it is picked for reordering).
// - Buffers come from one pool preallocated at construction; alloc/free/tx/rx
//   never allocate. Each port has a fixed-size min-heap of frames in flight,
//   ordered by (delivery time, sequence number).
// - Faults are drawn per frame from a seeded RNG, per sending port: loss,
//   reordering, duplication, corruption (one bit flipped in the ICRC-covered
//   bytes, so the receiver's ICRC check fails) and CE marking (ECN). Each is
//   counted.
// - A port can be a slow receiver (set_rx_limit): frames sent to it are taken
//   in one per ns_per_frame, and a frame finding `backlog` frames already
//   waiting is dropped (counted as rx_overrun), like a host whose receive ring
//   overflows.
// - Optional recording of every frame sent (test inspection; allocates, so it
//   is off by default).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "fault/bottleneck.h"
#include "io/packet_io.h"

namespace droce::memlink {

class VirtualClock : public io::Clock {
 public:
  uint64_t now_ns() const noexcept override { return now_; }
  void advance(uint64_t ns) noexcept { now_ += ns; }
  void set(uint64_t ns) noexcept { now_ = ns > now_ ? ns : now_; }

 private:
  uint64_t now_ = 1'000'000;
};

struct Faults {
  double loss = 0;       // probability a frame is dropped
  double reorder = 0;    // probability a frame is held back by reorder_delay_ns
  double duplicate = 0;  // probability a frame is delivered twice
  double corrupt = 0;    // probability one bit of the frame is flipped
  double ce_mark = 0;    // probability an ECN-capable IPv4/IPv6 frame is marked CE
  uint64_t delay_ns = 0;
  uint64_t reorder_delay_ns = 2000;
};

// A switch egress queue in front of a port (set_bottleneck): frames toward the
// port leave it at rate_bps (or rate_pps); RED/ECN marking between kmin_bytes
// and kmax_bytes up to pmax, tail drop past limit_bytes. The model is
// lib/fault/bottleneck.h, shared with the fault injector of a real port.
// With PFC (Bottleneck::pfc_xoff_bytes) a sender's tx_burst stops at the
// first frame that would arrive while the queue is past Xoff (until it has
// drained to Xon; tx_ready_ns says when), counted in PfcPause per pause.
using Bottleneck = fault::Bottleneck;

enum class Counter : uint8_t {
  TxFrames, Delivered, Lost, Reordered, Duplicated, Corrupted, CeMarked, NoRoute, PoolEmpty, QueueFull, RxOverrun,
  BottleneckDrop, BottleneckMarked, PfcPause,
  kCount
};
const char* counter_name(Counter c) noexcept;

struct Recorded {
  uint64_t time_ns;
  uint16_t from_port;
  std::vector<uint8_t> bytes;
};

class Link;

class Port final : public io::PacketIo {
 public:
  uint16_t rx_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint16_t alloc_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint16_t tx_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  void free_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint32_t buf_capacity() const noexcept override;
  wire::MacAddr mac() const noexcept override { return mac_; }

  void set_faults(const Faults& f) noexcept { faults_ = f; }
  const Faults& faults() const noexcept { return faults_; }
  // The next `bursts` tx_burst calls accept nothing (a TX queue that is full).
  void refuse_tx(uint32_t bursts) noexcept { refuse_tx_ = bursts; }
  // Frames sent to this port are delivered at most one per ns_per_frame; one that
  // finds `backlog` frames waiting for this port is dropped (RxOverrun). 0: no limit.
  void set_rx_limit(uint64_t ns_per_frame, uint32_t backlog) noexcept {
    rx_ns_per_frame_ = ns_per_frame;
    rx_backlog_ = backlog;
  }
  // Frames this port sends leave it at most at rate_bps (its line rate); 0: at once.
  // backlog_bytes > 0 bounds what waits for the line, as a NIC's TX ring does:
  // tx_burst takes a frame only while the bytes not yet on the wire plus the
  // frame fit, and stops there (a partial burst: the sender keeps the rest).
  void set_tx_rate(uint64_t rate_bps, uint64_t backlog_bytes = 0) noexcept {
    tx_rate_bps_ = rate_bps;
    tx_backlog_bytes_ = backlog_bytes;
  }
  // After a burst this port cut short: when the frame it refused would fit (0: none refused).
  uint64_t tx_ready_ns() const noexcept { return tx_ready_ns_; }
  // The queue of frames toward this port (Bottleneck above).
  void set_bottleneck(const Bottleneck& b) noexcept { bn_ = b; }
  // Bytes queued in front of this port at time `now`, and the most ever seen.
  uint64_t bottleneck_queue_bytes(uint64_t now) const noexcept;
  uint64_t bottleneck_max_queue_bytes() const noexcept { return bn_max_q_; }
  // Starts the maximum over again (a test's measurement window after warm-up).
  void reset_bottleneck_max_queue() noexcept { bn_max_q_ = 0; }
  uint16_t index() const noexcept { return index_; }
  size_t in_flight() const noexcept { return heap_len_ + (fifo_head_ - fifo_tail_); }

 private:
  friend class Link;
  struct Pending {
    uint64_t at;
    uint64_t seq;
    io::PktBuf* buf;
    uint64_t bn_depart = 0;  // marking on departure (mark_dequeue): when it leaves the bottleneck, 0: none
  };
  Port(Link* link, uint16_t index, wire::MacAddr mac, uint32_t depth);
  void enqueue(io::PktBuf* b, uint64_t at, uint64_t bn_depart = 0) noexcept;

  Link* link_;
  uint16_t index_;
  wire::MacAddr mac_;
  Faults faults_;
  uint32_t refuse_tx_ = 0;
  uint64_t rx_ns_per_frame_ = 0;  // set_rx_limit
  uint32_t rx_backlog_ = 0;
  uint64_t rx_next_ = 0;  // earliest delivery time of the next frame under the limit
  uint64_t tx_rate_bps_ = 0;
  uint64_t tx_next_ = 0;  // when this port's line is free again
  uint64_t tx_backlog_bytes_ = 0;
  uint64_t tx_ready_ns_ = 0;
  Bottleneck bn_;
  uint64_t bn_next_ = 0;  // when the bottleneck queue toward this port has drained
  uint64_t bn_max_q_ = 0;
  uint64_t bn_pfc_until_ = 0;  // PFC: senders toward this port are paused until then (arrival time)
  // Frames in flight: those sent in delivery-time order sit in a FIFO ring (the
  // common case, O(1)); frames held back (reordering) go to a min-heap. rx
  // merges the two by (time, sequence), which is the order one heap would give.
  std::unique_ptr<Pending[]> heap_;
  uint32_t heap_cap_;
  uint32_t heap_len_ = 0;
  std::unique_ptr<Pending[]> fifo_;
  uint32_t fifo_mask_;
  uint32_t fifo_head_ = 0, fifo_tail_ = 0;
  const Pending* earliest() const noexcept;
};

class Link {
 public:
  // pool_bufs buffers of buf_size bytes each, shared by every port.
  Link(const io::Clock& clock, uint64_t seed, uint32_t pool_bufs = 8192, uint32_t buf_size = 4096 + 128);
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  Port& add_port(wire::MacAddr mac);
  Port& port(uint16_t i) noexcept { return *ports_[i]; }
  size_t num_ports() const noexcept { return ports_.size(); }
  void set_faults(const Faults& f) noexcept {
    for (auto& p : ports_) p->set_faults(f);
  }

  uint64_t counter(Counter c) const noexcept { return counters_[static_cast<size_t>(c)]; }
  // Earliest delivery time of a frame in flight, or UINT64_MAX.
  uint64_t next_delivery_ns() const noexcept;
  size_t in_flight() const noexcept;
  uint32_t free_bufs() const noexcept { return free_len_; }
  uint32_t pool_size() const noexcept { return pool_bufs_; }

  void record(bool on) noexcept { recording_ = on; }
  std::vector<Recorded>& recorded() noexcept { return recorded_; }

 private:
  friend class Port;
  io::PktBuf* get_buf() noexcept;
  void put_buf(io::PktBuf* b) noexcept;
  void count(Counter c, uint64_t n = 1) noexcept { counters_[static_cast<size_t>(c)] += n; }
  double uniform() noexcept { return dist_(rng_); }
  void corrupt(io::PktBuf* b) noexcept;
  bool mark_ce(io::PktBuf* b) noexcept;

  const io::Clock& clock_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> dist_{0.0, 1.0};
  uint32_t pool_bufs_;
  uint32_t buf_size_;
  std::unique_ptr<uint8_t[]> storage_;
  std::unique_ptr<io::PktBuf[]> bufs_;
  std::unique_ptr<io::PktBuf*[]> free_;
  uint32_t free_len_ = 0;
  std::vector<std::unique_ptr<Port>> ports_;
  uint64_t seq_ = 0;
  uint64_t counters_[static_cast<size_t>(Counter::kCount)]{};
  bool recording_ = false;
  std::vector<Recorded> recorded_;
};

}  // namespace droce::memlink

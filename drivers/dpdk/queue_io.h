// io::PacketIo over one (port, queue) pair of a DPDK ethdev, and io::Clock
// from the TSC.
//
// A DpdkQueueIo belongs to one lcore (the poll loop that owns the queue): no
// locks, no allocation, no per-packet virtual call. Each frame's io::PktBuf
// lives in its mbuf's private area (see port.h, make_pool), so moving frames
// between the ethdev and the engine touches only the mbuf and that line.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "dpdk/port.h"
#include "io/packet_io.h"

struct rte_mbuf;
struct rte_mempool;
struct rte_mbuf_ext_shared_info;

namespace droce::dpdk {

// A counter written by one lcore, read by any thread (relaxed, never torn).
class Counter {
 public:
  void add(uint64_t v) noexcept { v_.store(v_.load(std::memory_order_relaxed) + v, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

// Registered memory a device may read in place (zero-copy TX, PktBuf::ext_ref):
// hugepage memory with a known, contiguous IOVA, and the rte_mbuf_ext_shared_info
// whose refcnt is 1 (the registration) + the segments attached and not yet freed.
// One per (MR, lcore): only that lcore attaches segments of it (DPDK's refcnt
// update is not atomic at 1, so one attaching thread per shinfo); the device or
// any thread may free them. Opaque outside queue_io.cc.
struct ExtMem;

struct alignas(64) QueueCounters {
  Counter rx_packets, rx_bytes, tx_packets, tx_bytes;
  Counter rx_multiseg_drops;  // frames spread over several mbufs that could not be linearized: dropped
  Counter rx_linearized;      // frames spread over several mbufs (e.g. zero-copy from a ring peer): copied into one
  Counter tx_zero_copy;       // frames sent with their payload attached by reference (PktBuf::ext)
  Counter tx_zero_copy_fallback;  // PktBuf::ext frames copied after all (no mbuf left for the segments)
  Counter tx_full;            // frames the device did not take (returned to the caller)
  Counter alloc_failures;     // buffers asked for but not available
};

class DpdkQueueIo final : public io::PacketIo {
 public:
  static constexpr size_t kMbufHeaderSize = 128;  // sizeof(rte_mbuf), asserted in queue_io.cc
  static constexpr uint16_t kMaxBurst = 64;  // frames moved per ethdev call

  // The port must outlive this object; queue < min(rx_queues, tx_queues).
  DpdkQueueIo(const Port& port, uint16_t queue);

  uint16_t rx_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint16_t alloc_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint16_t tx_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  void free_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint32_t buf_capacity() const noexcept override { return capacity_; }
  wire::MacAddr mac() const noexcept override { return mac_; }
  // PktBuf::ext honoured: the port chains segments (Port::multi_seg_tx).
  bool zero_copy_tx() const noexcept override { return zero_copy_; }
  // net_af_packet leaves frames the kernel refused (ENOBUFS/EAGAIN) in its TX
  // ring, counted as sent, until its next sendto(): an empty TX burst kicks
  // them out. Other PMDs (memif, ring, hardware) send at once and need none.
  bool tx_needs_kick() const noexcept { return tx_kick_; }

  // ---- Registered memory for PktBuf::ext (control path) -------------------
  // An ExtMem for [base, base+len): nullptr when the memory is not DPDK
  // (hugepage) memory or its IOVA is not contiguous (then copy).
  static ExtMem* ext_create(void* base, size_t len) noexcept;
  // Drops the registration's reference and waits up to timeout_ms until the
  // device freed every segment of m (its free_cb ran), then frees m. False on
  // timeout: m is left allocated (segments still point into the memory).
  static bool ext_release(ExtMem* m, uint32_t timeout_ms) noexcept;
  // Segments of m attached and not yet freed.
  static uint32_t ext_inflight(const ExtMem* m) noexcept;

  // ---- Zero-copy TX (rte_pktmbuf_attach_extbuf) --------------------------
  // Appends len bytes at addr (IOVA iova, e.g. from a HugeRegion) to frame b
  // as an external-buffer segment: the device reads them in place, nothing is
  // copied. b's own len bytes (the headers) come first; call again for more
  // segments, append_buf for a trailer (pad + ICRC). shinfo belongs to the
  // caller: each appended segment adds one to its refcnt, and its free_cb
  // runs when the last such segment is freed (after transmission, or by
  // free_burst), i.e. when the memory may be reused. Start refcnt at 0.
  // False (nothing appended) when no mbuf is left for the segment.
  bool append_external(io::PktBuf* b, void* addr, uint64_t iova, uint16_t len,
                       rte_mbuf_ext_shared_info* shinfo) noexcept;
  // Appends a buffer of this backend (its len bytes) after b's segments; tail
  // then belongs to b.
  void append_buf(io::PktBuf* b, io::PktBuf* tail) noexcept;

  // Turns every frame with PktBuf::ext into a chain [headers][ext by reference]
  // [tail] (or copies ext behind the headers when no mbuf is left) and clears
  // ext. tx_burst does this itself; frames it does not take stay chained.
  void attach_ext(io::PktBuf** bufs, uint16_t n) noexcept;

  uint16_t port_id() const noexcept { return port_; }
  uint16_t queue_id() const noexcept { return queue_; }
  const QueueCounters& counters() const noexcept { return ctr_; }

  // The mbuf behind a PktBuf of this backend and back (for zero-copy users).
  // The PktBuf sits right after its rte_mbuf (the private area), so this is
  // address arithmetic; PktBuf::backend holds the same pointer (set once
  // when the pool is made, see make_pool).
  static rte_mbuf* mbuf_of(const io::PktBuf* b) noexcept {
    return reinterpret_cast<rte_mbuf*>(reinterpret_cast<uintptr_t>(b) - kMbufHeaderSize);
  }
  static io::PktBuf* pktbuf_of(rte_mbuf* m) noexcept;

 private:
  uint16_t port_, queue_;
  uint32_t capacity_;
  rte_mempool* pool_;
  wire::MacAddr mac_;
  bool zero_copy_ = false;
  bool tx_kick_ = false;
  QueueCounters ctr_;
};

// Nanoseconds from the TSC (rte_rdtsc), scaled with a 32.32 fixed-point
// factor taken from rte_get_tsc_hz at construction. Monotonic on machines with
// an invariant TSC; the origin is the construction time.
class TscClock final : public io::Clock {
 public:
  TscClock();
  uint64_t now_ns() const noexcept override;
  uint64_t tsc_hz() const noexcept { return hz_; }
  // now_ns() for a TSC value the caller already read (a poll loop reads it once per turn).
  uint64_t ns_of(uint64_t tsc) const noexcept {
    __extension__ using u128 = unsigned __int128;
    return static_cast<uint64_t>((static_cast<u128>(tsc - base_) * mult_) >> 32);
  }

 private:
  uint64_t base_;
  uint64_t hz_;
  uint64_t mult_;  // ns per tick << 32
};

}  // namespace droce::dpdk

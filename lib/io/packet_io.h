// The packet I/O interface between a backend (drivers/: the DPDK ethdev port,
// the in-memory test link) and the engine/transport above it.
//
// Burst-oriented: one virtual call moves up to a burst of frames, never one
// call per packet. Buffers belong to the backend (mbufs for DPDK, slots of a
// preallocated pool for the memory link); the layer above borrows them:
//   rx_burst    hands over received frames; give each back with free_burst
//               (or reuse it for TX).
//   alloc_burst lends empty TX buffers of at least buf_capacity() bytes.
//   tx_burst    takes the first k frames it returns (k <= n); the caller
//               still owns the rest (retry or free them).
// No allocation, lock or exception on these paths.
#pragma once

#include <cstdint>

#include "wire/headers.h"

namespace droce::io {

struct PktBuf {
  uint8_t* data = nullptr;  // first byte of the Ethernet frame
  uint32_t len = 0;         // frame length (TX with ext: the bytes at data, before ext)
  uint32_t cap = 0;         // bytes available from data
  void* backend = nullptr;  // the backend's own handle (e.g. the rte_mbuf)
  uint16_t port = 0;        // port the frame came in on / goes out of
  uint16_t queue = 0;
  // Zero-copy TX (only on a backend whose zero_copy_tx() is true): the frame
  // goes on after the len bytes at data with ext_len bytes at ext (registered
  // memory the device reads in place; ext_ref is the backend's handle for
  // that memory, see the backend) and then tail_len bytes of tail (pad +
  // ICRC). The backend's tx_burst consumes these and clears ext. Buffers
  // from alloc_burst / rx_burst come with ext == nullptr.
  const uint8_t* ext = nullptr;
  void* ext_ref = nullptr;
  uint32_t ext_len = 0;
  uint8_t tail_len = 0;
  uint8_t tail[7]{};
  uint32_t frame_len() const noexcept { return ext ? len + ext_len + tail_len : len; }
};
static_assert(sizeof(PktBuf) <= 64, "PktBuf lives in one cache line (the mbuf private area)");

class PacketIo {
 public:
  virtual ~PacketIo() = default;
  virtual uint16_t rx_burst(PktBuf** bufs, uint16_t n) noexcept = 0;
  virtual uint16_t alloc_burst(PktBuf** bufs, uint16_t n) noexcept = 0;
  virtual uint16_t tx_burst(PktBuf** bufs, uint16_t n) noexcept = 0;
  virtual void free_burst(PktBuf** bufs, uint16_t n) noexcept = 0;
  virtual uint32_t buf_capacity() const noexcept = 0;
  virtual wire::MacAddr mac() const noexcept = 0;
  // True when tx_burst honours PktBuf::ext (payload by reference). Control
  // path: asked once, not per packet.
  virtual bool zero_copy_tx() const noexcept { return false; }
};

// Time for timers: nanoseconds from an arbitrary origin, monotonic. The
// in-memory link provides a virtual clock; the daemon reads the TSC.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() const noexcept = 0;
};

}  // namespace droce::io

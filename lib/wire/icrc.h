// Invariant CRC (IBTA annex A17.3.3 / vol 1 7.8.1): CRC-32 (the Ethernet
// polynomial, reflected, init and final XOR all ones) over
//   8 bytes of 0xFF (in place of the IB LRH)
//   the IP header with its variant fields set to ones
//       IPv4: TOS (DSCP+ECN), TTL, header checksum
//       IPv6: traffic class, flow label, hop limit
//   the UDP header with its checksum set to ones
//   the BTH with its resv8a byte (FECN, BECN, reserved) set to ones
//   the extension headers, payload and pad, as they are.
// The result is stored little-endian in the last four bytes of the frame.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace droce::wire {

// Plain CRC-32 in zlib's convention: chainable, crc32_update(0, ...) starts a
// new CRC, and crc32_update(crc32_update(0, a), b) == CRC of a then b.
uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len) noexcept;

// Which CRC-32 implementation is in use ("vpclmulqdq", "vpclmulqdq-256", "pclmul" or "table"), for reports.
const char* crc32_impl_name() noexcept;

// The implementations: byte tables (zlib's), 128-bit carry-less folding, and
// 512-bit (AVX-512) or 256-bit (AVX2) VPCLMULQDQ folding of long runs on top.
// The best the CPU has is chosen at start; crc32_select picks another (tests
// check each path the CPU can run; not for use while other threads compute
// CRCs). False if the CPU lacks it.
enum class Crc32Impl : uint8_t { Table, Pclmul, Vpclmul, Vpclmul256 };
Crc32Impl crc32_impl() noexcept;
bool crc32_select(Crc32Impl impl) noexcept;

// A CRC-32 in progress over pieces of any length: whole 16-byte blocks are
// folded into an accumulator as they come (carried across pieces, the odd
// bytes of a piece wait for the next one), and the reduction to the 32-bit
// register happens once, in finish(). Registers are raw: no pre/post
// inversion (crc32_update's crc is ~register).
class Crc32Fold {
 public:
  explicit Crc32Fold(uint32_t reg = 0) noexcept : reg_(reg) {}
  void update(const uint8_t* p, size_t n) noexcept;
  // The register after everything given to update().
  uint32_t finish() const noexcept;

 private:
  void update_pclmul(const uint8_t* p, size_t n) noexcept;
  uint32_t reduce_acc() const noexcept;
  alignas(16) uint8_t acc_[16];  // the folded blocks (valid once started_)
  alignas(16) uint8_t pend_[16];  // bytes short of a whole block
  uint32_t reg_;                 // the initial register (the running one without PCLMUL)
  uint8_t npend_ = 0;
  bool started_ = false;
};

// Starts an ICRC over the masked IP + UDP + BTH headers at `l3` (ip_hdr_len is
// 20..60 for IPv4, 40 for IPv6). Continue with icrc_update over the extension
// headers, payload and pad, and end with icrc_finish.
using IcrcState = Crc32Fold;
IcrcState icrc_begin(const uint8_t* l3, size_t ip_hdr_len, bool ipv6) noexcept;
inline void icrc_update(IcrcState& state, const uint8_t* p, size_t n) noexcept { state.update(p, n); }
inline uint32_t icrc_finish(const IcrcState& state) noexcept { return ~state.finish(); }

// ICRC of a contiguous packet from the IP header up to (not including) the
// ICRC field: `pkt` spans IP header .. pad.
uint32_t icrc_compute(std::span<const uint8_t> pkt, size_t ip_hdr_len, bool ipv6) noexcept;

// One packet of a burst: `l3` .. l3 + len spans the IP header up to (not
// including) the ICRC field, as icrc_compute's `pkt`.
struct IcrcPkt {
  const uint8_t* l3;
  uint32_t len;
  uint8_t ip_hdr_len;
  bool ipv6;
};

// The ICRCs of n packets (a TX batch, an RX burst): out[k] == icrc_compute of
// pkts[k], which stays the reference. One packet's ICRC (a 64 B WRITE: seven
// folds and a reduction, 18 carry-less multiplies) is bound by the
// multiplier's throughput; with 512-bit VPCLMULQDQ one instruction multiplies
// four 128-bit lanes, so here IPv4 packets without options and with less than
// 256 bytes after the BTH (every 64 B message) go sixteen at a time, one
// packet per lane of four registers folded side by side; the others, and every
// packet on CPUs without it, one by one.
void icrc_compute_burst(const IcrcPkt* pkts, size_t n, uint32_t* out) noexcept;

inline void icrc_store(uint8_t* dst, uint32_t icrc) noexcept {
  dst[0] = static_cast<uint8_t>(icrc);
  dst[1] = static_cast<uint8_t>(icrc >> 8);
  dst[2] = static_cast<uint8_t>(icrc >> 16);
  dst[3] = static_cast<uint8_t>(icrc >> 24);
}
inline uint32_t icrc_load(const uint8_t* src) noexcept {
  return uint32_t{src[0]} | (uint32_t{src[1]} << 8) | (uint32_t{src[2]} << 16) | (uint32_t{src[3]} << 24);
}

}  // namespace droce::wire

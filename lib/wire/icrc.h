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

// Which CRC-32 implementation is in use ("pclmul" or "table"), for reports.
const char* crc32_impl_name() noexcept;

// Starts an ICRC over the masked IP + UDP + BTH headers at `l3` (ip_hdr_len is
// 20..60 for IPv4, 40 for IPv6). Continue with icrc_update over the extension
// headers, payload and pad.
uint32_t icrc_begin(const uint8_t* l3, size_t ip_hdr_len, bool ipv6) noexcept;
inline uint32_t icrc_update(uint32_t state, const uint8_t* p, size_t n) noexcept {
  return crc32_update(state, p, n);
}

// ICRC of a contiguous packet from the IP header up to (not including) the
// ICRC field: `pkt` spans IP header .. pad.
uint32_t icrc_compute(std::span<const uint8_t> pkt, size_t ip_hdr_len, bool ipv6) noexcept;

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

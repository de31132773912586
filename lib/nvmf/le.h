// Little-endian loads and stores on byte buffers (NVMe is little-endian).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace droce::nvmf::le {

inline uint16_t get16(const uint8_t* p) noexcept { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t get24(const uint8_t* p) noexcept { return p[0] | (p[1] << 8) | (uint32_t{p[2]} << 16); }
inline uint32_t get32(const uint8_t* p) noexcept {
  return p[0] | (p[1] << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
inline uint64_t get64(const uint8_t* p) noexcept { return get32(p) | (uint64_t{get32(p + 4)} << 32); }
inline void put16(uint8_t* p, uint16_t v) noexcept { p[0] = v & 0xff; p[1] = v >> 8; }
inline void put24(uint8_t* p, uint32_t v) noexcept { p[0] = v & 0xff; p[1] = (v >> 8) & 0xff; p[2] = (v >> 16) & 0xff; }
inline void put32(uint8_t* p, uint32_t v) noexcept { for (int i = 0; i < 4; ++i) p[i] = (v >> (8 * i)) & 0xff; }
inline void put64(uint8_t* p, uint64_t v) noexcept { put32(p, static_cast<uint32_t>(v)); put32(p + 4, v >> 32); }

// A NUL-terminated string field of n bytes (NQNs, traddr): the text up to the
// first NUL or n bytes.
inline std::string_view get_str(const uint8_t* p, size_t n) noexcept {
  const void* z = std::memchr(p, 0, n);
  return {reinterpret_cast<const char*>(p), z ? static_cast<size_t>(static_cast<const uint8_t*>(z) - p) : n};
}
// Copies s (truncated to n) and pads with `pad` (NUL for NQNs, space for the
// ASCII fields of Identify: SN, MN, FR).
inline void put_str(uint8_t* p, size_t n, std::string_view s, uint8_t pad = 0) noexcept {
  size_t k = s.size() < n ? s.size() : n;
  std::memcpy(p, s.data(), k);
  std::memset(p + k, pad, n - k);
}

}  // namespace droce::nvmf::le

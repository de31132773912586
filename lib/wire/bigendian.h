// Big-endian wire field types. Every multi-byte field of a wire header is one
// of these, so host-order values never leak into a packet by accident.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace droce::wire {

template <typename T>
constexpr T byteswap_if_le(T v) noexcept {
  static_assert(std::is_unsigned_v<T>);
  if constexpr (std::endian::native == std::endian::big || sizeof(T) == 1) {
    return v;
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<T>(__builtin_bswap16(v));
  } else if constexpr (sizeof(T) == 4) {
    return static_cast<T>(__builtin_bswap32(v));
  } else {
    return static_cast<T>(__builtin_bswap64(v));
  }
}

// A big-endian unsigned integer stored as raw bytes: alignment 1, so a header
// struct made of these has no padding and may sit at any offset in a frame.
template <typename T>
class BigEndian {
 public:
  constexpr BigEndian() noexcept = default;
  constexpr T get() const noexcept {
    T raw{};
    std::memcpy(&raw, bytes_, sizeof(T));
    return byteswap_if_le(raw);
  }
  constexpr void set(T v) noexcept {
    const T raw = byteswap_if_le(v);
    std::memcpy(bytes_, &raw, sizeof(T));
  }

 private:
  unsigned char bytes_[sizeof(T)]{};
};

using be16 = BigEndian<uint16_t>;
using be32 = BigEndian<uint32_t>;
using be64 = BigEndian<uint64_t>;
static_assert(sizeof(be16) == 2 && alignof(be16) == 1);
static_assert(sizeof(be32) == 4 && alignof(be32) == 1);
static_assert(sizeof(be64) == 8 && alignof(be64) == 1);
static_assert(std::is_trivially_copyable_v<be64>);

// 24-bit quantities (PSN, QPN) live in the low bits of a 32-bit word.
inline constexpr uint32_t kMask24 = 0x00FFFFFFu;

// PSN arithmetic modulo 2^24 (IBTA 9.7.1: the PSN space wraps).
constexpr uint32_t psn_add(uint32_t psn, uint32_t n) noexcept { return (psn + n) & kMask24; }
// Signed distance a - b in the 24-bit ring, in [-2^23, 2^23).
constexpr int32_t psn_diff(uint32_t a, uint32_t b) noexcept {
  return static_cast<int32_t>(((a - b) & kMask24) << 8) >> 8;
}
constexpr bool psn_lt(uint32_t a, uint32_t b) noexcept { return psn_diff(a, b) < 0; }
constexpr bool psn_le(uint32_t a, uint32_t b) noexcept { return psn_diff(a, b) <= 0; }
constexpr bool psn_gt(uint32_t a, uint32_t b) noexcept { return psn_diff(a, b) > 0; }
constexpr bool psn_ge(uint32_t a, uint32_t b) noexcept { return psn_diff(a, b) >= 0; }

static_assert(psn_diff(0, kMask24) == 1);
static_assert(psn_diff(kMask24, 0) == -1);
static_assert(psn_lt(0xFFFFF0, 0x000010));
static_assert(psn_add(kMask24, 2) == 1);

}  // namespace droce::wire

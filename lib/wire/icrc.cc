#include "wire/icrc.h"

#include <zlib.h>

#include <array>
#include <cstring>

#include "wire/headers.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace droce::wire {
namespace {

// Raw CRC register update, no pre/post inversion, via zlib (slice/braid tables).
inline uint32_t raw_zlib(uint32_t reg, const uint8_t* p, size_t n) noexcept {
  return ~static_cast<uint32_t>(crc32_z(~reg, p, n));
}

// Byte-at-a-time table for the < 16-byte tails the folding leaves; zlib's
// per-call cost dominates at those lengths.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kTable = make_table();
inline uint32_t raw_bytes(uint32_t reg, const uint8_t* p, size_t n) noexcept {
  while (n--) reg = kTable[(reg ^ *p++) & 0xFF] ^ (reg >> 8);
  return reg;
}

#if defined(__x86_64__)
#define DROCE_CLMUL __attribute__((target("pclmul,sse4.1")))
DROCE_CLMUL inline __m128i load(const uint8_t* q) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}
// x * k folded forward by 128 bits (each half times its constant), plus next.
DROCE_CLMUL inline __m128i fold(__m128i x, __m128i k, __m128i next) noexcept {
  const __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

// Folding with carry-less multiplication (Intel, "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ", 2009): four 128-bit lanes folded 64
// bytes at a time, then one lane, then a Barrett reduction to 32 bits. The
// constants are x^k mod P(x) for the bit-reflected Ethernet polynomial.
DROCE_CLMUL uint32_t raw_pclmul(uint32_t reg, const uint8_t* p, size_t n) noexcept {
  // Caller guarantees n >= 16 and n % 16 == 0.
  const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
  const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
  const __m128i poly = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i x1 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  if (n >= 64) {
    __m128i x2 = load(p + 16), x3 = load(p + 32), x4 = load(p + 48);
    p += 64;
    n -= 64;
    while (n >= 64) {
      x1 = fold(x1, k1k2, load(p));
      x2 = fold(x2, k1k2, load(p + 16));
      x3 = fold(x3, k1k2, load(p + 32));
      x4 = fold(x4, k1k2, load(p + 48));
      p += 64;
      n -= 64;
    }
    x1 = fold(x1, k3k4, x2);
    x1 = fold(x1, k3k4, x3);
    x1 = fold(x1, k3k4, x4);
  } else {
    p += 16;
    n -= 16;
  }
  while (n >= 16) {
    x1 = fold(x1, k3k4, load(p));
    p += 16;
    n -= 16;
  }
  // 128 -> 64 bits.
  __m128i t = _mm_srli_si128(x1, 8);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x10), t);
  // 64 -> 32 bits.
  t = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00), t);
  // Barrett reduction.
  t = x1;
  x1 = _mm_and_si128(x1, mask32);
  x1 = _mm_clmulepi64_si128(x1, poly, 0x10);
  x1 = _mm_and_si128(x1, mask32);
  x1 = _mm_clmulepi64_si128(x1, poly, 0x00);
  x1 = _mm_xor_si128(x1, t);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

const bool kHavePclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
constexpr bool kHavePclmul = false;
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len) noexcept {
  uint32_t reg = ~crc;
#if defined(__x86_64__)
  if (kHavePclmul) {
    if (len >= 16) {
      const size_t bulk = len & ~size_t{15};
      reg = raw_pclmul(reg, data, bulk);
      data += bulk;
      len -= bulk;
    }
    return ~raw_bytes(reg, data, len);
  }
#endif
  return ~raw_zlib(reg, data, len);
}

const char* crc32_impl_name() noexcept { return kHavePclmul ? "pclmul" : "table"; }

uint32_t icrc_begin(const uint8_t* l3, size_t ip_hdr_len, bool ipv6) noexcept {
  // 8 x 0xFF, IP header (<= 60), UDP (8), BTH (12), all masked as A17 says.
  // With the standard all-ones initial value, the CRC register is zero after
  // the first four 0xFF bytes, and leading zero bytes leave a zero register
  // unchanged: so the buffer starts with zeros up to a multiple of 16 bytes,
  // then the last four 0xFF, and runs from a zero register in whole blocks.
  if (ip_hdr_len > 60) ip_hdr_len = 60;
  const size_t n = ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth);
  const size_t lead = (16 - ((4 + n) & 15)) & 15;
  alignas(16) uint8_t buf[16 + 4 + 60 + sizeof(UdpHdr) + sizeof(Bth)];
  std::memset(buf, 0, lead);
  std::memset(buf + lead, 0xFF, 4);
  std::memcpy(buf + lead + 4, l3, n);
  uint8_t* ip = buf + lead + 4;
  if (ipv6) {
    ip[0] |= 0x0F;  // traffic class (high nibble) and flow label
    ip[1] = ip[2] = ip[3] = 0xFF;
    ip[7] = 0xFF;  // hop limit
  } else {
    ip[1] = 0xFF;               // TOS
    ip[8] = 0xFF;               // TTL
    ip[10] = ip[11] = 0xFF;     // header checksum
  }
  uint8_t* udp = ip + ip_hdr_len;
  udp[6] = udp[7] = 0xFF;  // UDP checksum
  uint8_t* bth = udp + sizeof(UdpHdr);
  bth[4] = 0xFF;  // resv8a: FECN, BECN, reserved
  // crc32_update(~0u, ...) starts from a zero register (state = ~register).
  return crc32_update(~0u, buf, lead + 4 + n);
}

uint32_t icrc_compute(std::span<const uint8_t> pkt, size_t ip_hdr_len, bool ipv6) noexcept {
  const size_t fixed = ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth);
  uint32_t c = icrc_begin(pkt.data(), ip_hdr_len, ipv6);
  return icrc_update(c, pkt.data() + fixed, pkt.size() - fixed);
}

}  // namespace droce::wire

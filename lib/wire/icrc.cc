#include "wire/icrc.h"

#include <zlib.h>

#include <algorithm>
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
// Generic Polynomials Using PCLMULQDQ", 2009): 16-byte blocks are folded into a
// 128-bit accumulator (four lanes, 64 bytes at a time, over long runs), and the
// accumulator is reduced to the 32-bit register once, by finish(). The
// constants are x^k mod P(x) for the bit-reflected Ethernet polynomial.
struct Consts {
  __m128i k1k2, k3k4, k5, poly, mask32;
};
DROCE_CLMUL inline Consts consts() noexcept {
  return {_mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL), _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL),
          _mm_set_epi64x(0, 0x163cd6124LL), _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL),
          _mm_set_epi32(0, 0, 0, -1)};
}

// The register the data folded into x leaves (128 -> 64 -> 32 bits, Barrett).
DROCE_CLMUL uint32_t reduce(__m128i x1) noexcept {
  const Consts c = consts();
  __m128i t = _mm_srli_si128(x1, 8);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, c.k3k4, 0x10), t);
  t = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, c.mask32), c.k5, 0x00), t);
  t = x1;
  x1 = _mm_and_si128(x1, c.mask32);
  x1 = _mm_clmulepi64_si128(x1, c.poly, 0x10);
  x1 = _mm_and_si128(x1, c.mask32);
  x1 = _mm_clmulepi64_si128(x1, c.poly, 0x00);
  x1 = _mm_xor_si128(x1, t);
  return static_cast<uint32_t>(_mm_extract_epi32(x1, 1));
}

// Long runs on CPUs with VPCLMULQDQ: four 512-bit accumulators fold 256 bytes
// at a time (each 128-bit lane as above, by 2048 bits), then fold into one
// (by 512 bits), whose four lanes fold into 128 bits (by 384, 256, 128 bits).
// `carry` is xored onto the first block (the earlier data, already folded
// forward to it). Consumes n - n % 256 bytes; returns the 128-bit accumulator.
#define DROCE_VCLMUL __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1")))
DROCE_VCLMUL inline __m512i fold512(__m512i x, __m512i k, __m512i next) noexcept {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                   0x96);
}
// GCC 12's AVX-512 intrinsic headers start some results from
// _mm_undefined_si128(), which -Wuninitialized reports when they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
DROCE_VCLMUL __m128i fold_256(__m128i carry, const uint8_t*& p, size_t& n) noexcept {
  const __m512i k2048 = _mm512_set_epi64(0x1322d1430LL, 0x11542778aLL, 0x1322d1430LL, 0x11542778aLL, 0x1322d1430LL,
                                         0x11542778aLL, 0x1322d1430LL, 0x11542778aLL);
  const __m512i k512 = _mm512_set_epi64(0x1c6e41596LL, 0x154442bd4LL, 0x1c6e41596LL, 0x154442bd4LL, 0x1c6e41596LL,
                                        0x154442bd4LL, 0x1c6e41596LL, 0x154442bd4LL);
  __m512i z0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_inserti32x4(_mm512_setzero_si512(), carry, 0));
  __m512i z1 = _mm512_loadu_si512(p + 64), z2 = _mm512_loadu_si512(p + 128), z3 = _mm512_loadu_si512(p + 192);
  p += 256;
  n -= 256;
  while (n >= 256) {
    z0 = fold512(z0, k2048, _mm512_loadu_si512(p));
    z1 = fold512(z1, k2048, _mm512_loadu_si512(p + 64));
    z2 = fold512(z2, k2048, _mm512_loadu_si512(p + 128));
    z3 = fold512(z3, k2048, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  z0 = fold512(z0, k512, z1);
  z0 = fold512(z0, k512, z2);
  z0 = fold512(z0, k512, z3);
  const __m128i k384 = _mm_set_epi64x(0x174359406LL, 0x3db1ecdcLL);
  const __m128i k256 = _mm_set_epi64x(0x15a546366LL, 0xf1da05aaLL);
  const __m128i k128 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  __m128i x = fold(_mm512_extracti32x4_epi32(z0, 0), k384, _mm512_extracti32x4_epi32(z0, 3));
  x = fold(_mm512_extracti32x4_epi32(z0, 1), k256, x);
  return fold(_mm512_extracti32x4_epi32(z0, 2), k128, x);
}
#pragma GCC diagnostic pop

// The same on CPUs with VPCLMULQDQ but 256-bit vectors only (AMD Zen 3, or a
// VM that hides AVX-512): four 256-bit accumulators fold 128 bytes at a time
// (each lane by 1024 bits), then into one (by 256 bits), whose two lanes fold
// into 128 bits. Same contract as fold_256.
#define DROCE_VCLMUL256 __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))
DROCE_VCLMUL256 inline __m256i fold256(__m256i x, __m256i k, __m256i next) noexcept {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11)),
                          next);
}
DROCE_VCLMUL256 inline __m256i load256(const uint8_t* p) noexcept {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
DROCE_VCLMUL256 __m128i fold_128y(__m128i carry, const uint8_t*& p, size_t& n) noexcept {
  // x^(1024+32) and x^(1024-32) mod P, bit-reflected and shifted as k1k2 (512) above.
  const __m256i k1024 = _mm256_set_epi64x(0x14a7fe880LL, 0x1e88ef372LL, 0x14a7fe880LL, 0x1e88ef372LL);
  const __m256i k256 = _mm256_set_epi64x(0x15a546366LL, 0xf1da05aaLL, 0x15a546366LL, 0xf1da05aaLL);
  __m256i y0 = _mm256_xor_si256(load256(p), _mm256_zextsi128_si256(carry));
  __m256i y1 = load256(p + 32), y2 = load256(p + 64), y3 = load256(p + 96);
  p += 128;
  n -= 128;
  while (n >= 128) {
    y0 = fold256(y0, k1024, load256(p));
    y1 = fold256(y1, k1024, load256(p + 32));
    y2 = fold256(y2, k1024, load256(p + 64));
    y3 = fold256(y3, k1024, load256(p + 96));
    p += 128;
    n -= 128;
  }
  y0 = fold256(y0, k256, y1);
  y0 = fold256(y0, k256, y2);
  y0 = fold256(y0, k256, y3);
  const __m128i k128 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
  return fold(_mm256_castsi256_si128(y0), k128, _mm256_extracti128_si256(y0, 1));
}

const bool kCpuVpclmul = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
                         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
const bool kCpuVpclmul256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") &&
                            __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
const bool kCpuPclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
// The implementation in use: the best the CPU has (tests select lesser ones).
Crc32Impl g_impl = kCpuVpclmul      ? Crc32Impl::Vpclmul
                   : kCpuVpclmul256 ? Crc32Impl::Vpclmul256
                   : kCpuPclmul     ? Crc32Impl::Pclmul
                                    : Crc32Impl::Table;
inline bool use_vpclmul() noexcept { return g_impl == Crc32Impl::Vpclmul; }
inline bool use_vpclmul256() noexcept { return g_impl == Crc32Impl::Vpclmul256; }
inline bool use_pclmul() noexcept { return g_impl != Crc32Impl::Table; }

// Four lanes holding four consecutive blocks take the next 64 bytes at a time
// (each folded forward by 512 bits), then fold into one accumulator. Leaves
// p and n past the bytes consumed (n < 64 on return).
DROCE_CLMUL inline __m128i fold_lanes(__m128i x1, __m128i x2, __m128i x3, __m128i x4, const uint8_t*& p,
                                      size_t& n) noexcept {
  const Consts c = consts();
  while (n >= 64) {
    x1 = fold(x1, c.k1k2, load(p));
    x2 = fold(x2, c.k1k2, load(p + 16));
    x3 = fold(x3, c.k1k2, load(p + 32));
    x4 = fold(x4, c.k1k2, load(p + 48));
    p += 64;
    n -= 64;
  }
  return fold(fold(fold(x1, c.k3k4, x2), c.k3k4, x3), c.k3k4, x4);
}

// Folds whole 16-byte blocks (n % 16 == 0) into x; `started` is false while x
// holds no block yet (then the first block takes the initial register `reg`).
DROCE_CLMUL __m128i fold_blocks(__m128i x, bool started, uint32_t reg, const uint8_t* p, size_t n) noexcept {
  const Consts c = consts();
  if (n == 0) return x;
  if (n >= 256 && (use_vpclmul() || use_vpclmul256())) {
    const __m128i carry = started ? fold(x, c.k3k4, _mm_setzero_si128()) : _mm_cvtsi32_si128(static_cast<int>(reg));
    __m128i x1 = use_vpclmul() ? fold_256(carry, p, n) : fold_128y(carry, p, n);
    while (n >= 16) {
      x1 = fold(x1, c.k3k4, load(p));
      p += 16;
      n -= 16;
    }
    return x1;
  }
  __m128i x1 = started ? fold(x, c.k3k4, load(p)) : _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  p += 16;
  n -= 16;
  if (n >= 48) {
    const __m128i x2 = load(p), x3 = load(p + 16), x4 = load(p + 32);
    p += 48;
    n -= 48;
    x1 = fold_lanes(x1, x2, x3, x4, p, n);
  }
  while (n >= 16) {
    x1 = fold(x1, c.k3k4, load(p));
    p += 16;
    n -= 16;
  }
  return x1;
}

#else
constexpr bool kCpuPclmul = false;
constexpr bool kCpuVpclmul = false;
constexpr bool kCpuVpclmul256 = false;
Crc32Impl g_impl = Crc32Impl::Table;
inline bool use_pclmul() noexcept { return false; }
#endif

}  // namespace

#if defined(__x86_64__)
DROCE_CLMUL void Crc32Fold::update_pclmul(const uint8_t* p, size_t n) noexcept {
  __m128i x = started_ ? load(acc_) : _mm_setzero_si128();
  if (npend_) {
    const size_t k = std::min<size_t>(16 - npend_, n);
    std::memcpy(pend_ + npend_, p, k);
    npend_ = static_cast<uint8_t>(npend_ + k);
    p += k;
    n -= k;
    if (npend_ < 16) return;
    x = fold_blocks(x, started_, reg_, pend_, 16);
    started_ = true;
    npend_ = 0;
  }
  const size_t bulk = n & ~size_t{15};
  if (bulk) {
    x = fold_blocks(x, started_, reg_, p, bulk);
    started_ = true;
  }
  if (n > bulk) {
    std::memcpy(pend_, p + bulk, n - bulk);
    npend_ = static_cast<uint8_t>(n - bulk);
  }
  if (started_) _mm_store_si128(reinterpret_cast<__m128i*>(acc_), x);
}

DROCE_CLMUL uint32_t Crc32Fold::reduce_acc() const noexcept {
  return reduce(_mm_load_si128(reinterpret_cast<const __m128i*>(acc_)));
}
#endif

void Crc32Fold::update(const uint8_t* p, size_t n) noexcept {
#if defined(__x86_64__)
  if (use_pclmul()) {
    update_pclmul(p, n);
    return;
  }
#endif
  reg_ = raw_zlib(reg_, p, n);
}

uint32_t Crc32Fold::finish() const noexcept {
  uint32_t r = reg_;
#if defined(__x86_64__)
  if (started_) r = reduce_acc();
#endif
  return raw_bytes(r, pend_, npend_);
}

uint32_t crc32_update(uint32_t crc, const uint8_t* data, size_t len) noexcept {
  Crc32Fold f(~crc);
  f.update(data, len);
  return ~f.finish();
}

const char* crc32_impl_name() noexcept {
  switch (g_impl) {
    case Crc32Impl::Vpclmul: return "vpclmulqdq";
    case Crc32Impl::Vpclmul256: return "vpclmulqdq-256";
    case Crc32Impl::Pclmul: return "pclmul";
    case Crc32Impl::Table: break;
  }
  return "table";
}

Crc32Impl crc32_impl() noexcept { return g_impl; }

bool crc32_select(Crc32Impl impl) noexcept {
  if ((impl == Crc32Impl::Vpclmul && !kCpuVpclmul) || (impl == Crc32Impl::Vpclmul256 && !kCpuVpclmul256) ||
      (impl == Crc32Impl::Pclmul && !kCpuPclmul))
    return false;
  g_impl = impl;
  return true;
}

#if defined(__x86_64__)
namespace {
// The common case, IPv4 without options: the 48 bytes (4 zero, 4 x 0xFF, IP 20,
// UDP 8, BTH 12) are three 16-byte blocks, each a load of the header ORed with
// the mask of its variant fields: no byte-wise copy. From a zero register, so
// the first block is the accumulator as it stands.
struct Ipv4Blocks {
  __m128i b0, b1, b2;
};
__attribute__((target("sse2"))) inline Ipv4Blocks ipv4_blocks(const uint8_t* l3) noexcept {
  const __m128i lead = _mm_set_epi8(0, 0, 0, 0, 0, 0, static_cast<char>(0xFF), 0,  // ip[1] TOS
                                    -1, -1, -1, -1, 0, 0, 0, 0);
  __m128i b0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(l3));  // ip[0..7] in bytes 0..7
  b0 = _mm_or_si128(_mm_slli_si128(b0, 8), lead);
  // ip[8] TTL, ip[10..11] checksum.
  const __m128i m1 = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, 0, -1);
  // udp[6..7] checksum (bytes 2, 3), bth[4] resv8a (byte 8).
  const __m128i m2 = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, -1, -1, 0, 0);
  return {b0, _mm_or_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l3 + 8)), m1),
          _mm_or_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l3 + 24)), m2)};
}

__attribute__((target("sse2"))) void icrc_begin_ipv4(IcrcState& st, const uint8_t* l3) noexcept {
  alignas(16) uint8_t buf[48];
  const Ipv4Blocks b = ipv4_blocks(l3);
  _mm_store_si128(reinterpret_cast<__m128i*>(buf), b.b0);
  _mm_store_si128(reinterpret_cast<__m128i*>(buf + 16), b.b1);
  _mm_store_si128(reinterpret_cast<__m128i*>(buf + 32), b.b2);
  st.update(buf, sizeof buf);
}

// A whole IPv4 packet in one buffer (received frames, frames built by copy),
// short of the bulk path: the three masked blocks and the rest of the packet
// fold as one run of blocks, four lanes wide from the first block (so a 64 B
// WRITE, eight blocks, takes four dependent folds rather than seven), the
// register is reduced once and the < 16-byte tail goes through the table; no
// state is stored between the parts. n counts the bytes from l3 to the ICRC
// (n >= 40, n - 40 < 256).
DROCE_CLMUL uint32_t icrc_ipv4_whole(const uint8_t* l3, size_t n) noexcept {
  const Consts c = consts();
  const Ipv4Blocks b = ipv4_blocks(l3);
  const uint8_t* p = l3 + 40;  // the blocks hold 8 leading bytes and l3[0..39]
  size_t rem = n - 40;
  __m128i x;
  if (rem >= 16) {
    const __m128i x4 = load(p);
    p += 16;
    rem -= 16;
    x = fold_lanes(b.b0, b.b1, b.b2, x4, p, rem);
  } else {
    x = fold(fold(b.b0, c.k3k4, b.b1), c.k3k4, b.b2);
  }
  while (rem >= 16) {
    x = fold(x, c.k3k4, load(p));
    p += 16;
    rem -= 16;
  }
  return ~raw_bytes(reduce(x), p, rem);
}

// The packets icrc_ipv4_whole takes.
inline bool whole_ok(const IcrcPkt& k) noexcept {
  return !k.ipv6 && k.ip_hdr_len == 20 && k.len >= 40 && k.len - 40 < 256;
}

// 4 x C packets of that kind (pkts[idx[0..4C-1]]) at once, four per 512-bit
// register, one per 128-bit lane: the same folds as icrc_ipv4_whole's one
// lane, with the packets side by side, so one VPCLMULQDQ multiplies four
// packets (as many instructions as one packet alone), and the C registers are
// C independent chains (a fold waits ~10 cycles on the one before it in its
// chain). The reduction is done for all lanes together. A lane whose packet is
// out of blocks keeps its value (masked move) while the others go on; the
// < 16-byte tails go through the table per packet.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#define DROCE_VCLMUL_BW __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul,sse4.1")))
DROCE_VCLMUL_BW inline __m512i zip4(__m128i a0, __m128i a1, __m128i a2, __m128i a3) noexcept {
  __m512i z = _mm512_castsi128_si512(a0);
  z = _mm512_inserti32x4(z, a1, 1);
  z = _mm512_inserti32x4(z, a2, 2);
  return _mm512_inserti32x4(z, a3, 3);
}
template <int C>
DROCE_VCLMUL_BW void icrc_ipv4_x4(const IcrcPkt* pkts, const size_t* idx, uint32_t* out) noexcept {
  constexpr int N = 4 * C;
  const __m512i k128 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL));
  const uint8_t* p[N];
  uint32_t nb[N];
  uint32_t most = 0, least = ~0u;
  __m512i x[C];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    Ipv4Blocks h[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const IcrcPkt& q = pkts[idx[4 * c + j]];
      h[j] = ipv4_blocks(q.l3);
      p[4 * c + j] = q.l3 + 40;  // the blocks hold 8 leading bytes and l3[0..39]
      nb[4 * c + j] = (q.len - 40) >> 4;
      most = std::max(most, nb[4 * c + j]);
      least = std::min(least, nb[4 * c + j]);
    }
    x[c] = zip4(h[0].b0, h[1].b0, h[2].b0, h[3].b0);
    x[c] = fold512(x[c], k128, zip4(h[0].b1, h[1].b1, h[2].b1, h[3].b1));
    x[c] = fold512(x[c], k128, zip4(h[0].b2, h[1].b2, h[2].b2, h[3].b2));
  }
  uint32_t i = 0;
  for (; i < least; ++i) {  // every lane has a block
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* const* pc = p + 4 * c;
      x[c] = fold512(x[c], k128,
                     zip4(load(pc[0] + 16 * i), load(pc[1] + 16 * i), load(pc[2] + 16 * i), load(pc[3] + 16 * i)));
    }
  }
  for (; i < most; ++i) {  // lengths differ: lanes out of blocks keep their value
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __mmask8 live = 0;
      const uint8_t* at[4];
      for (int j = 0; j < 4; ++j) {
        const bool in = i < nb[4 * c + j];
        live = static_cast<__mmask8>(live | (in ? 3u << (2 * j) : 0u));
        at[j] = in ? p[4 * c + j] + 16 * i : p[4 * c + j] - 16;  // else its last header block, unused
      }
      const __m512i next = zip4(load(at[0]), load(at[1]), load(at[2]), load(at[3]));
      x[c] = _mm512_mask_mov_epi64(x[c], live, fold512(x[c], k128, next));
    }
  }
  // reduce() on each lane: 128 -> 64 -> 32 bits, Barrett.
  const __m512i k5 = _mm512_broadcast_i32x4(_mm_set_epi64x(0, 0x163cd6124LL));
  const __m512i poly = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1f7011641LL, 0x1db710641LL));
  const __m512i mask32 = _mm512_broadcast_i32x4(_mm_set_epi32(0, 0, 0, -1));
  alignas(64) uint32_t reg[16 * C];
#pragma GCC unroll 4
  for (int c = 0; c < C; ++c) {
    __m512i y = x[c];
    __m512i t = _mm512_bsrli_epi128(y, 8);
    y = _mm512_xor_si512(_mm512_clmulepi64_epi128(y, k128, 0x10), t);
    t = _mm512_bsrli_epi128(y, 4);
    y = _mm512_xor_si512(_mm512_clmulepi64_epi128(_mm512_and_si512(y, mask32), k5, 0x00), t);
    t = y;
    y = _mm512_and_si512(y, mask32);
    y = _mm512_clmulepi64_epi128(y, poly, 0x10);
    y = _mm512_and_si512(y, mask32);
    y = _mm512_clmulepi64_epi128(y, poly, 0x00);
    _mm512_store_si512(reg + 16 * c, _mm512_xor_si512(y, t));
  }
  for (int j = 0; j < N; ++j)
    out[idx[j]] = ~raw_bytes(reg[4 * j + 1], p[j] + 16 * nb[j], (pkts[idx[j]].len - 40) & 15);
}
#pragma GCC diagnostic pop

const bool kCpuVpclmulBw = kCpuVpclmul && __builtin_cpu_supports("avx512bw");
}  // namespace
#endif

IcrcState icrc_begin(const uint8_t* l3, size_t ip_hdr_len, bool ipv6) noexcept {
#if defined(__x86_64__)
  if (!ipv6 && ip_hdr_len == 20) {
    IcrcState st;
    icrc_begin_ipv4(st, l3);
    return st;
  }
#endif
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
  IcrcState st;  // from a zero register
  st.update(buf, lead + 4 + n);
  return st;
}

uint32_t icrc_compute(std::span<const uint8_t> pkt, size_t ip_hdr_len, bool ipv6) noexcept {
  const size_t fixed = ip_hdr_len + sizeof(UdpHdr) + sizeof(Bth);
#if defined(__x86_64__)
  if (!ipv6 && ip_hdr_len == 20 && use_pclmul() && pkt.size() >= fixed && pkt.size() - fixed < 256)
    return icrc_ipv4_whole(pkt.data(), pkt.size());
#endif
  IcrcState st = icrc_begin(pkt.data(), ip_hdr_len, ipv6);
  st.update(pkt.data() + fixed, pkt.size() - fixed);
  return icrc_finish(st);
}

void icrc_compute_burst(const IcrcPkt* pkts, size_t n, uint32_t* out) noexcept {
  size_t k = 0;
#if defined(__x86_64__)
  // Sixteen (then eight, four) at a time where the CPU has 512-bit carry-less
  // multiplication; with 128-bit PCLMULQDQ alone, one packet's folds already
  // keep the multiplier busy (its throughput, not its latency, bounds a run of
  // packets), so they go one by one.
  if (use_vpclmul() && kCpuVpclmulBw) {
    size_t idx[16];
    size_t m = 0;
    for (; k < n; ++k) {
      if (!whole_ok(pkts[k])) {
        out[k] = icrc_compute({pkts[k].l3, pkts[k].len}, pkts[k].ip_hdr_len, pkts[k].ipv6);
        continue;
      }
      idx[m++] = k;
      if (m == 16) {
        icrc_ipv4_x4<4>(pkts, idx, out);
        m = 0;
      }
    }
    size_t j = 0;
    if (m - j >= 8) {
      icrc_ipv4_x4<2>(pkts, idx + j, out);
      j += 8;
    }
    if (m - j == 1) {
      out[idx[j]] = icrc_ipv4_whole(pkts[idx[j]].l3, pkts[idx[j]].len);
    } else if (m > j) {  // the last packet again in the spare lanes (it gets its ICRC twice)
      for (size_t r = m; r < j + 4; ++r) idx[r] = idx[m - 1];
      if (m - j > 4) {
        for (size_t r = m; r < j + 8; ++r) idx[r] = idx[m - 1];
        icrc_ipv4_x4<2>(pkts, idx + j, out);
      } else {
        icrc_ipv4_x4<1>(pkts, idx + j, out);
      }
    }
    return;
  }
#endif
  for (; k < n; ++k) out[k] = icrc_compute({pkts[k].l3, pkts[k].len}, pkts[k].ip_hdr_len, pkts[k].ipv6);
}

}  // namespace droce::wire

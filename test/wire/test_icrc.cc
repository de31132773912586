#include <catch2/catch.hpp>
#include <zlib.h>

#include <random>
#include <vector>

#include "wire/icrc.h"

using namespace droce::wire;

// One CRC-32 implementation selected for a test (each in turn, by GENERATE),
// the CPU's best restored after; a CPU without it skips with a warning.
struct ImplScope {
  explicit ImplScope(Crc32Impl impl) : selected(crc32_select(impl)) {
    if (!selected) WARN("this CPU cannot run CRC-32 implementation " << static_cast<int>(impl));
  }
  ~ImplScope() { crc32_select(best); }
  ImplScope(const ImplScope&) = delete;
  ImplScope& operator=(const ImplScope&) = delete;
  Crc32Impl best = crc32_impl();
  bool selected;
};

TEST_CASE("crc32: standard check value", "[wire][icrc]") {
  const char* s = "123456789";
  CHECK(crc32_update(0, reinterpret_cast<const uint8_t*>(s), 9) == 0xCBF43926u);
}

TEST_CASE("crc32: folded implementation equals zlib at every length and alignment", "[wire][icrc]") {
  std::mt19937 rng(12345);
  std::vector<uint8_t> buf(9000 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t len : {0u, 1u, 15u, 16u, 63u, 64u, 65u, 79u, 80u, 127u, 128u, 1000u, 1024u, 4096u, 4100u, 9000u}) {
    for (size_t align = 0; align < 16; align += 5) {
      INFO("len " << len << " align " << align);
      const uint8_t* p = buf.data() + align;
      const uint32_t ref = static_cast<uint32_t>(crc32_z(0, p, len));
      CHECK(crc32_update(0, p, len) == ref);
      // Chaining in two pieces gives the same result.
      const size_t cut = len / 3;
      CHECK(crc32_update(crc32_update(0, p, cut), p + cut, len - cut) == ref);
    }
  }
}

TEST_CASE("crc32: a fold over pieces equals one pass, whatever the cuts", "[wire][icrc]") {
  const ImplScope impl(GENERATE(Crc32Impl::Table, Crc32Impl::Pclmul, Crc32Impl::Vpclmul, Crc32Impl::Vpclmul256));
  if (!impl.selected) return;
  INFO("implementation " << crc32_impl_name());
  std::mt19937 rng(777);
  std::vector<uint8_t> buf(5000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (int trial = 0; trial < 400; ++trial) {
    const size_t len = rng() % buf.size();
    const uint32_t ref = static_cast<uint32_t>(crc32_z(0, buf.data(), len));
    // Up to 6 pieces of random lengths (empty ones included), from register ~0.
    Crc32Fold f(~0u);
    size_t at = 0;
    for (int k = 0; k < 6 && at < len; ++k) {
      const size_t n = k == 5 ? len - at : std::min<size_t>(len - at, rng() % 3 == 0 ? rng() % 17 : rng() % 600);
      f.update(buf.data() + at, n);
      at += n;
    }
    f.update(buf.data() + at, len - at);
    INFO("trial " << trial << " len " << len);
    CHECK(~f.finish() == ref);
    CHECK(crc32_update(0, buf.data(), len) == ref);
  }
}

// The ICRC by its definition (annex A17.3.3), byte by byte with zlib: 8 x 0xFF,
// the IP header with its variant fields set to ones, UDP with its checksum set
// to ones, the BTH with resv8a set to ones, then the rest as it is.
static uint32_t icrc_reference(const std::vector<uint8_t>& pkt, size_t ihl, bool ipv6) {
  std::vector<uint8_t> m(8, 0xFF);
  m.insert(m.end(), pkt.begin(), pkt.end());
  uint8_t* ip = m.data() + 8;
  if (ipv6) {
    ip[0] |= 0x0F;
    ip[1] = ip[2] = ip[3] = 0xFF;
    ip[7] = 0xFF;
  } else {
    ip[1] = ip[8] = ip[10] = ip[11] = 0xFF;
  }
  ip[ihl + 6] = ip[ihl + 7] = 0xFF;
  ip[ihl + 8 + 4] = 0xFF;
  return static_cast<uint32_t>(crc32_z(0, m.data(), m.size()));
}

TEST_CASE("icrc: masked headers by the definition, IPv4 (with and without options) and IPv6", "[wire][icrc]") {
  const ImplScope impl(GENERATE(Crc32Impl::Table, Crc32Impl::Pclmul, Crc32Impl::Vpclmul, Crc32Impl::Vpclmul256));
  if (!impl.selected) return;
  INFO("implementation " << crc32_impl_name());
  // IPv4 without options at every length from the bare headers to past the
  // whole-packet path's limit (256 bytes after the BTH), and at every alignment
  // of the packet in memory: each tail length, each lane count, both paths.
  {
    std::mt19937 rng(99);
    std::vector<uint8_t> buf(16 + 20 + 8 + 12 + 300);
    for (size_t len = 40; len <= 40 + 300; ++len) {
      for (auto& b : buf) b = static_cast<uint8_t>(rng());
      const size_t align = len % 16;
      const std::vector<uint8_t> pkt(buf.begin() + static_cast<std::ptrdiff_t>(align),
                                     buf.begin() + static_cast<std::ptrdiff_t>(align + len));
      INFO("len " << len);
      CHECK(icrc_compute({buf.data() + align, len}, 20, false) == icrc_reference(pkt, 20, false));
    }
  }
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 600; ++trial) {
    const bool ipv6 = trial % 3 == 2;
    const size_t ihl = ipv6 ? 40 : (trial % 3 == 1 ? 20 + 4 * (rng() % 11) : 20);
    std::vector<uint8_t> pkt(ihl + 8 + 12 + rng() % 300);
    for (auto& b : pkt) b = static_cast<uint8_t>(rng());  // every variant field random too
    INFO("trial " << trial << " ihl " << ihl << " ipv6 " << ipv6 << " len " << pkt.size());
    CHECK(icrc_compute({pkt.data(), pkt.size()}, ihl, ipv6) == icrc_reference(pkt, ihl, ipv6));
  }
}

TEST_CASE("icrc: a burst gives each packet the ICRC icrc_compute gives it, mixed lengths and kinds", "[wire][icrc]") {
  const ImplScope impl(GENERATE(Crc32Impl::Table, Crc32Impl::Pclmul, Crc32Impl::Vpclmul, Crc32Impl::Vpclmul256));
  if (!impl.selected) return;
  INFO("implementation " << crc32_impl_name());
  std::mt19937 rng(31337);
  for (int trial = 0; trial < 300; ++trial) {
    // Bursts of 0..40 packets: mostly IPv4 without options (the interleaved
    // path) of random lengths, from the bare headers to past its 256-byte
    // limit, some of one length (a QP's 64 B WRITEs), some IPv6 or with options.
    const size_t n = rng() % 41;
    const size_t same = 40 + rng() % 260;
    std::vector<std::vector<uint8_t>> bufs(n);
    std::vector<IcrcPkt> pkts(n);
    std::vector<size_t> ihls(n);
    for (size_t k = 0; k < n; ++k) {
      const unsigned kind = rng() % 8;
      const bool ipv6 = kind == 6;
      const size_t ihl = ipv6 ? 40 : (kind == 7 ? 24 + 4 * (rng() % 10) : 20);
      const size_t len = kind < 3 ? same : ihl + 8 + 12 + rng() % 300;
      const size_t align = rng() % 16;
      bufs[k].resize(align + len);
      for (auto& b : bufs[k]) b = static_cast<uint8_t>(rng());
      pkts[k] = {bufs[k].data() + align, static_cast<uint32_t>(len), static_cast<uint8_t>(ihl), ipv6};
      ihls[k] = ihl;
    }
    std::vector<uint32_t> out(n + 1, 0xDEADBEEF);
    icrc_compute_burst(pkts.data(), n, out.data());
    CHECK(out[n] == 0xDEADBEEF);  // nothing written past the burst
    for (size_t k = 0; k < n; ++k) {
      INFO("trial " << trial << " packet " << k << " of " << n << " len " << pkts[k].len << " ihl " << ihls[k]
                    << " ipv6 " << pkts[k].ipv6);
      CHECK(out[k] == icrc_compute({pkts[k].l3, pkts[k].len}, pkts[k].ip_hdr_len, pkts[k].ipv6));
      if (k % 7 == 0) {
        const std::vector<uint8_t> pkt(pkts[k].l3, pkts[k].l3 + pkts[k].len);
        CHECK(out[k] == icrc_reference(pkt, ihls[k], pkts[k].ipv6));
      }
    }
  }
}

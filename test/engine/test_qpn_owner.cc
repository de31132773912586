// lib/engine/qpn_owner.h: the classifier's QPN -> core remainder equals % for
// every core count a port can have and QPNs across the 24-bit range and beyond.
#include <catch2/catch.hpp>

#include <cstdint>

#include "engine/qpn_owner.h"

using droce::engine::QpnOwner;

TEST_CASE("QpnOwner::mod is q % n", "[engine]") {
  uint64_t checked = 0;
  for (uint32_t n = 1; n <= 130; ++n) {
    const QpnOwner o(n);
    REQUIRE(o.cores() == n);
    // Every QPN near 0, near each multiple of n up to 2^24 (the QPN space),
    // and the 32-bit edges.
    for (uint32_t q = 0; q < 4096; ++q) REQUIRE(o.mod(q) == q % n);
    for (uint64_t k = n; k < (1u << 24); k = k * 3 + 7) {
      for (int64_t d = -2; d <= 2; ++d) {
        const auto q = static_cast<uint32_t>(static_cast<int64_t>(k) + d);
        REQUIRE(o.mod(q) == q % n);
      }
    }
    for (uint32_t q : {0xFFFFFFu, 0x1000000u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFEu, 0xFFFFFFFFu}) {
      REQUIRE(o.mod(q) == q % n);
    }
    checked += n;
  }
  REQUIRE(checked > 0);
  // Large divisors too (a 32-bit n is what the type allows).
  for (uint32_t n : {255u, 256u, 1000u, 65535u, 65536u, 0x7FFFFFFFu, 0xFFFFFFFFu}) {
    const QpnOwner o(n);
    for (uint32_t q : {0u, 1u, n - 1, n, n + 1, 0xFFFFFFu, 0xFFFFFFFFu}) REQUIRE(o.mod(q) == q % n);
  }
}

TEST_CASE("QpnOwner::of keeps the GSI QP on the home core", "[engine]") {
  const QpnOwner one(1);
  for (uint32_t q : {0u, 1u, 2u, 17u, 0xFFFFFFu}) REQUIRE(one.of(q) == 0);
  const QpnOwner three(3);
  REQUIRE(three.of(1) == 0);  // 1 % 3 would be 1
  REQUIRE(three.of(4) == 1);
  REQUIRE(three.of(5) == 2);
  REQUIRE(three.of(6) == 0);
  // A default-constructed one (before the port's cores are known) is one core.
  const QpnOwner none;
  REQUIRE(none.of(12345) == 0);
}

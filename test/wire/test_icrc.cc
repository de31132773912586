#include <catch2/catch.hpp>
#include <zlib.h>

#include <random>
#include <vector>

#include "wire/icrc.h"

using namespace droce::wire;

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
  const Crc32Impl best = crc32_impl();
  const auto impl = GENERATE(Crc32Impl::Table, Crc32Impl::Pclmul, Crc32Impl::Vpclmul);
  if (!crc32_select(impl)) {
    WARN("this CPU cannot run CRC-32 implementation " << static_cast<int>(impl));
    return;
  }
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
  crc32_select(best);
}

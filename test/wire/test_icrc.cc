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

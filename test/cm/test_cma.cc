// RDMA CM conventions (lib/cm/cma.cc): service IDs and the 36-byte CMA header
// of Linux cma.c, IPv4 (12 zero bytes + the address on the wire, ::ffff:a.b.c.d
// in CmaHdr) and IPv6.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <random>
#include <vector>

#include "cm/cma.h"
#include "cm/mad.h"

using namespace droce::cm;
using droce::wire::Gid;
using droce::wire::gid_from_ipv4;

TEST_CASE("service IDs: (port space << 16) | port, the top 32 bits zero", "[cm][cma]") {
  STATIC_REQUIRE(service_id(PortSpace::Tcp, 4420) == 0x0000000001061144ull);
  STATIC_REQUIRE(service_id(PortSpace::Udp, 0xFFFF) == 0x000000000111FFFFull);
  STATIC_REQUIRE(service_id(PortSpace::Ib, 0) == 0x00000000013F0000ull);
  PortSpace ps{};
  uint16_t port = 0;
  REQUIRE(parse_service_id(0x0000000001061144ull, ps, port));
  CHECK(ps == PortSpace::Tcp);
  CHECK(port == 4420);
  for (PortSpace s : {PortSpace::Ipoib, PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib}) {
    for (uint16_t p : {uint16_t{0}, uint16_t{1}, uint16_t{7471}, uint16_t{0xFFFF}}) {
      REQUIRE(parse_service_id(service_id(s, p), ps, port));
      CHECK(ps == s);
      CHECK(port == p);
    }
  }
  ps = PortSpace::Ib;
  port = 77;
  CHECK_FALSE(parse_service_id(0x0000000001071144ull, ps, port));  // unknown space
  CHECK_FALSE(parse_service_id(0x0000000100061144ull, ps, port));  // bit 32 set
  CHECK_FALSE(parse_service_id(0x1000000001061144ull, ps, port));  // an IB service ID
  CHECK_FALSE(parse_service_id(0, ps, port));
  CHECK(ps == PortSpace::Ib);  // untouched when refused
  CHECK(port == 77);
}

TEST_CASE("CMA header, IPv4: known bytes and round trip", "[cm][cma]") {
  CmaHdr h;
  h.ip_version = 4;
  h.src_port = 0xC123;
  h.src = gid_from_ipv4(0xC0A80701);
  h.dst = gid_from_ipv4(0x0A000002);
  std::array<uint8_t, kCmaHdrSize> b;
  b.fill(0xEE);
  encode_cma_hdr(b, h);
  const std::array<uint8_t, kCmaHdrSize> want{
      0x00, 0x40, 0xC1, 0x23,                                             // version, IP version 4 << 4, port
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 168, 7, 1,                 // source
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2};                   // destination
  CHECK(b == want);
  CmaHdr back;
  REQUIRE(decode_cma_hdr(b, back));
  CHECK(back == h);
  CHECK(back.src[10] == 0xFF);  // stored IPv4-mapped
  CHECK(back.src[11] == 0xFF);
}

TEST_CASE("CMA header, IPv6: the 16 address bytes as they are", "[cm][cma]") {
  CmaHdr h;
  h.ip_version = 6;
  h.src_port = 0x0102;
  for (int i = 0; i < 16; ++i) {
    h.src[i] = static_cast<uint8_t>(0xF0 + i);
    h.dst[i] = static_cast<uint8_t>(0x20 + i);
  }
  std::array<uint8_t, kCmaHdrSize> b{};
  encode_cma_hdr(b, h);
  CHECK(b[0] == 0);
  CHECK(b[1] == 0x60);
  CHECK(b[2] == 0x01);
  CHECK(b[3] == 0x02);
  CHECK(std::memcmp(b.data() + 4, h.src.data(), 16) == 0);
  CHECK(std::memcmp(b.data() + 20, h.dst.data(), 16) == 0);
  CmaHdr back;
  REQUIRE(decode_cma_hdr(b, back));
  CHECK(back == h);
}

TEST_CASE("CMA header: malformed ones are refused", "[cm][cma]") {
  CmaHdr h;
  h.src = gid_from_ipv4(0x01020304);
  h.dst = gid_from_ipv4(0x05060708);
  std::array<uint8_t, kCmaHdrSize> good{};
  encode_cma_hdr(good, h);
  CmaHdr out;
  for (size_t n = 0; n < kCmaHdrSize; ++n) {
    std::vector<uint8_t> v(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    CHECK_FALSE(decode_cma_hdr(v, out));
  }
  auto b = good;
  b[0] = 1;  // version
  CHECK_FALSE(decode_cma_hdr(b, out));
  for (uint8_t ipv : {0x00, 0x50, 0x70, 0xF0}) {
    b = good;
    b[1] = ipv;
    CHECK_FALSE(decode_cma_hdr(b, out));
  }
  b = good;
  b[1] = 0x4F;  // the low nibble is not part of the IP version
  CHECK(decode_cma_hdr(b, out));
  CHECK(out.ip_version == 4);
  // Inside a REQ's private data, the program's bytes follow at 36.
  STATIC_REQUIRE(kReqUserPrivate == 56);
  STATIC_REQUIRE(kSidrReqUserPrivate == 180);
}

TEST_CASE("CMA header: random input never crashes, what decodes re-encodes the same", "[cm][cma]") {
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> v(rng() % 40);
    for (auto& x : v) x = static_cast<uint8_t>(rng());
    if (v.size() >= 2 && i % 2) {
      v[0] = 0;
      v[1] = (i % 4 == 1) ? 0x40 : 0x60;
    }
    CmaHdr h;
    if (!decode_cma_hdr(v, h)) continue;
    std::array<uint8_t, kCmaHdrSize> b{};
    encode_cma_hdr(b, h);
    CmaHdr again;
    REQUIRE(decode_cma_hdr(b, again));
    CHECK(again == h);
  }
}

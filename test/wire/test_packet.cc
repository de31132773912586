#include <catch2/catch.hpp>

#include <cstring>
#include <utility>
#include <vector>

#include "wire/icrc.h"
#include "wire/packet.h"

using namespace droce::wire;

namespace {

Headers make_headers(uint8_t opcode, bool ipv6, bool vlan) {
  Headers h;
  h.l2.dst = {0x02, 0, 0, 0, 0, 0x02};
  h.l2.src = {0x02, 0, 0, 0, 0, 0x01};
  h.l2.vlan = vlan;
  h.l2.vlan_tci = 0x2064;
  h.l3.ipv6 = ipv6;
  h.l3.tos = 0x6A;  // DSCP 26, ECT(0)
  h.l3.ttl = 63;
  h.l3.ip_id = 0x1234;
  h.l3.ip_frag = ipv6 ? 0 : kIpv4FlagDF;
  h.l3.flow_label = ipv6 ? 0xABCDE : 0;
  if (ipv6) {
    h.l3.src = {0xfd, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    h.l3.dst = {0xfd, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  } else {
    h.l3.src = gid_from_ipv4(0x0A4D0001);
    h.l3.dst = gid_from_ipv4(0x0A4D0002);
  }
  h.l4.sport = 0xC123;
  h.bth.opcode = opcode;
  h.bth.se = true;
  h.bth.pkey = 0xFFFF;
  h.bth.resv8a = kBthBecn;
  h.bth.dqpn = 0xABCDEF;
  h.bth.ackreq = true;
  h.bth.psn = 0xFFFFFE;
  h.ext.reth = {0x1122334455667788ull, 0xA1B2C3D4, 4097};
  h.ext.aeth = {0x1F, 0x123456};
  h.ext.atomic = {0x1000, 0x55, 0xDEADBEEFCAFEF00Dull, 0x0102030405060708ull};
  h.ext.atomic_orig = 0x8877665544332211ull;
  h.ext.deth = {0x11111111, 0, 0x000011};
  h.ext.imm = 0x11110000;
  h.ext.ieth_rkey = 0x0800070F;
  return h;
}

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

// A valid RC SEND ONLY frame over IPv4 to mutate in the error tests.
std::vector<uint8_t> good_frame(uint32_t payload = 13, bool ipv6 = false) {
  const Headers h = make_headers(op::RC_SEND_ONLY, ipv6, false);
  std::vector<uint8_t> f(frame_len(h, payload));
  REQUIRE(build_frame(f, h, pattern(payload)) == f.size());
  return f;
}

void fix_icrc(std::vector<uint8_t>& f, bool ipv6 = false) {
  const size_t l3 = 14, ihl = ipv6 ? 40 : 20;
  icrc_store(&f[f.size() - 4], icrc_compute({f.data() + l3, f.size() - 4 - l3}, ihl, ipv6));
}
void fix_ip_checksum(std::vector<uint8_t>& f) {
  f[24] = f[25] = 0;
  const uint16_t cs = ipv4_checksum(&f[14], 20);
  f[24] = static_cast<uint8_t>(cs >> 8);
  f[25] = static_cast<uint8_t>(cs);
}
ParseError parse(const std::vector<uint8_t>& f) {
  PacketView v;
  return parse_frame(f, v);
}

}  // namespace

TEST_CASE("every opcode round-trips through build and parse, IPv4 and IPv6, with and without VLAN",
          "[wire][packet]") {
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    const auto& info = opcode_info(static_cast<uint8_t>(code));
    if (!info.valid()) continue;
    for (bool ipv6 : {false, true})
      for (bool vlan : {false, true})
        for (uint32_t plen : {0u, 1u, 2u, 3u, 4u, 256u, 1021u}) {
          if (!(info.flags & kOpPayload) && plen != 0) continue;
          // FIRST and MIDDLE packets carry a full MTU, a multiple of 4.
          if (!(info.flags & kOpLast) && (plen & 3)) continue;
          INFO(info.name << " ipv6=" << ipv6 << " vlan=" << vlan << " payload=" << plen);
          const Headers h = make_headers(static_cast<uint8_t>(code), ipv6, vlan);
          const auto payload = pattern(plen);
          std::vector<uint8_t> f(frame_len(h, plen));
          REQUIRE(build_frame(f, h, payload) == f.size());
          PacketView v;
          REQUIRE(parse_error_name(parse_frame(f, v)) == std::string("ok"));
          CHECK(v.op == &info);
          CHECK(v.payload_len == plen);
          CHECK((plen == 0 || std::memcmp(v.payload(), payload.data(), plen) == 0));  // no null pointers to memcmp
          CHECK(v.h.bth.pad == ((info.flags & kOpPayload) ? pad_for(plen) : 0));
          CHECK(v.h.bth.psn == 0xFFFFFE);
          CHECK(v.h.bth.dqpn == 0xABCDEF);
          CHECK(v.h.bth.becn());
          CHECK(v.h.l3.src == h.l3.src);
          CHECK(v.h.l3.dst == h.l3.dst);
          CHECK(v.h.l3.ecn() == kEcnEct0);
          CHECK(v.h.l2.vlan == vlan);
          // The prefetch hint reads the same opcode and QPN at its fixed offsets.
          uint8_t popc = 0;
          uint32_t pqpn = 0;
          REQUIRE(peek_bth(f.data(), static_cast<uint32_t>(f.size()), popc, pqpn));
          CHECK(popc == code);
          CHECK(pqpn == 0xABCDEF);
          if (info.off_reth) CHECK(v.h.ext.reth.va == h.ext.reth.va);
          if (info.off_reth) CHECK(v.h.ext.reth.len == 4097);
          if (info.off_atomic) CHECK(v.h.ext.atomic.compare == h.ext.atomic.compare);
          if (info.off_atomic) CHECK(v.h.ext.atomic.swap_add == h.ext.atomic.swap_add);
          if (info.off_aeth) CHECK(v.h.ext.aeth.msn == 0x123456);
          if (info.off_atomic_ack) CHECK(v.h.ext.atomic_orig == h.ext.atomic_orig);
          if (info.off_deth) CHECK(v.h.ext.deth.sqpn == 0x11);
          if (info.off_deth) CHECK(v.h.ext.deth.qkey == 0x11111111);
          if (info.off_imm) CHECK(v.h.ext.imm == 0x11110000);
          if (info.off_ieth) CHECK(v.h.ext.ieth_rkey == 0x0800070F);
          // Rebuild from what was decoded: same bytes.
          std::vector<uint8_t> again(f.size());
          REQUIRE(build_frame(again, v.h, v.payload_span()) == f.size());
          CHECK(again == f);
          ++checked;
        }
  }
  CHECK(checked > 38 * 4);
}

TEST_CASE("ICRC ignores the variant fields and covers everything else", "[wire][packet][icrc]") {
  for (bool ipv6 : {false, true}) {
    auto f = good_frame(64, ipv6);
    PacketView v;
    REQUIRE(parse_frame(f, v) == ParseError::Ok);
    const uint32_t icrc = v.icrc;
    // Changing TOS/ECN, TTL, UDP checksum or FECN/BECN does not change the ICRC
    // (a switch may rewrite them).
    auto g = f;
    if (ipv6) {
      g[14] = 0x6F; g[15] = 0xFF; g[16] = 0x12; g[17] = 0x34;  // traffic class + flow label
      g[21] = 1;                                               // hop limit
    } else {
      g[15] = 0x03;  // ECN CE
      g[22] = 1;     // TTL
      fix_ip_checksum(g);
    }
    const size_t udp = 14 + (ipv6 ? 40 : 20);
    g[udp + 6] = 0x12; g[udp + 7] = 0x34;
    g[udp + 8 + 4] = 0x80;  // FECN
    REQUIRE(parse_frame(g, v) == ParseError::Ok);
    CHECK(v.icrc == icrc);
    if (!ipv6) CHECK(v.h.l3.ecn() == kEcnCe);
    // Changing the PSN, the P_Key or a payload byte does.
    for (size_t off : {udp + 8 + 11, udp + 8 + 2, f.size() - 10}) {
      auto b = f;
      b[off] ^= 1;
      CHECK(parse(b) == ParseError::IcrcMismatch);
    }
  }
}

TEST_CASE("parser errors are precise", "[wire][packet][errors]") {
  const auto f = good_frame();
  REQUIRE(parse(f) == ParseError::Ok);

  SECTION("truncated at every length") {
    for (size_t n = 0; n < f.size(); ++n) {
      std::vector<uint8_t> t(f.begin(), f.begin() + static_cast<long>(n));
      INFO("length " << n);
      const auto e = parse(t);
      CHECK(e != ParseError::Ok);
    }
    CHECK(parse(std::vector<uint8_t>(f.begin(), f.begin() + 13)) == ParseError::Truncated);
    CHECK(parse(std::vector<uint8_t>(f.begin(), f.begin() + 30)) == ParseError::Truncated);
  }
  SECTION("not IP") {
    auto g = f;
    g[12] = 0x08; g[13] = 0x06;  // ARP
    CHECK(parse(g) == ParseError::NotIp);
  }
  SECTION("bad IP version") {
    auto g = f;
    g[14] = 0x65;
    CHECK(parse(g) == ParseError::BadIpVersion);
  }
  SECTION("bad IP header length") {
    auto g = f;
    g[14] = 0x44;
    fix_ip_checksum(g);
    CHECK(parse(g) == ParseError::BadIpHeaderLength);
  }
  SECTION("bad IP checksum") {
    auto g = f;
    g[24] ^= 0xFF;
    CHECK(parse(g) == ParseError::BadIpChecksum);
  }
  SECTION("bad IP total length") {
    auto g = f;
    g[16] = 0; g[17] = 20;
    fix_ip_checksum(g);
    CHECK(parse(g) == ParseError::BadIpLength);
    g[16] = 0xFF;
    fix_ip_checksum(g);
    CHECK(parse(g) == ParseError::Truncated);
  }
  SECTION("fragments") {
    auto g = f;
    g[20] = 0x20;  // MF
    fix_ip_checksum(g);
    CHECK(parse(g) == ParseError::Fragmented);
  }
  SECTION("not UDP") {
    auto g = f;
    g[23] = 6;  // TCP
    fix_ip_checksum(g);
    CHECK(parse(g) == ParseError::NotUdp);
  }
  SECTION("not port 4791") {
    auto g = f;
    g[36] = 0x12; g[37] = 0xB6;  // 4790
    CHECK(parse(g) == ParseError::NotRocePort);
  }
  SECTION("UDP length does not match IP") {
    auto g = f;
    g[39] += 4;
    CHECK(parse(g) == ParseError::BadUdpLength);
  }
  SECTION("BTH TVer") {
    auto g = f;
    g[43] |= 0x01;
    fix_icrc(g);
    CHECK(parse(g) == ParseError::BadBthVersion);
  }
  SECTION("unknown opcode") {
    for (uint8_t code : {0x15, 0x18, 0x2C, 0x40, 0x60, 0x66, 0x80, 0xFF}) {
      auto g = f;
      g[42] = code;
      fix_icrc(g);
      CHECK(parse(g) == ParseError::UnknownOpcode);
    }
  }
  SECTION("length does not match the opcode") {
    // An ACK with payload bytes after the AETH.
    auto g = f;
    g[42] = op::RC_ACKNOWLEDGE;
    g[43] &= 0xCF;  // pad 0
    fix_icrc(g);
    CHECK(parse(g) == ParseError::BadLength);
    // A READ request too short for its RETH.
    auto h = good_frame(0);
    h[42] = op::RC_READ_REQUEST;
    fix_icrc(h);
    CHECK(parse(h) == ParseError::Truncated);
  }
  SECTION("pad count") {
    auto g = good_frame(0);  // SEND ONLY, zero payload: pad 0
    g[43] |= 0x30;           // pad 3 > 0 bytes of payload+pad
    fix_icrc(g);
    CHECK(parse(g) == ParseError::BadPadCount);
    auto m = good_frame(16);
    m[42] = op::RC_SEND_MIDDLE;  // a MIDDLE packet with a pad count
    m[43] |= 0x10;
    fix_icrc(m);
    CHECK(parse(m) == ParseError::BadPadCount);
    auto a = f;
    a[42] = op::RC_ACKNOWLEDGE;  // an ACK that claims pad bytes
    fix_icrc(a);
    CHECK(parse(a) != ParseError::Ok);
  }
  SECTION("ICRC mismatch") {
    auto g = f;
    g[g.size() - 1] ^= 0x80;
    CHECK(parse(g) == ParseError::IcrcMismatch);
  }
  SECTION("error names") {
    for (int i = 0; i < static_cast<int>(ParseError::kCount); ++i)
      CHECK(std::string(parse_error_name(static_cast<ParseError>(i))) != "unknown");
  }
}

TEST_CASE("trailing Ethernet padding is ignored", "[wire][packet]") {
  auto f = good_frame(0);
  const size_t n = f.size();
  f.resize(n + 10, 0);
  PacketView v;
  REQUIRE(parse_frame(f, v) == ParseError::Ok);
  CHECK(v.frame_len == n);
}

TEST_CASE("non-zero pad bytes are accepted and not counted as payload", "[wire][packet]") {
  // The sender zeroes the pad; a receiver ignores its contents (IBTA 9.3.1,
  // as rxe does). The fuzzer found such a frame with a valid ICRC.
  auto f = good_frame(13);  // 13 bytes of payload: 3 pad bytes
  const size_t pad_off = f.size() - 4 - 3;
  for (size_t i = 0; i < 3; ++i) f[pad_off + i] = 0xA5;
  fix_icrc(f);
  PacketView v;
  REQUIRE(parse_frame(f, v) == ParseError::Ok);
  CHECK(v.h.bth.pad == 3);
  CHECK(v.payload_len == 13);
  CHECK(std::memcmp(v.payload(), pattern(13).data(), 13) == 0);
}

TEST_CASE("builder refuses a buffer that is too small or an invalid opcode", "[wire][packet]") {
  Headers h = make_headers(op::RC_WRITE_ONLY, false, false);
  std::vector<uint8_t> small(frame_len(h, 100) - 1);
  CHECK(build_frame(small, h, pattern(100)) == 0);
  h.bth.opcode = 0x15;
  std::vector<uint8_t> big(2048);
  CHECK(build_frame(big, h, pattern(100)) == 0);
}

TEST_CASE("CNP has 16 reserved bytes and no payload", "[wire][packet]") {
  Headers h = make_headers(op::CNP, false, false);
  std::vector<uint8_t> f(frame_len(h, 0));
  REQUIRE(build_frame(f, h, {}) == f.size());
  CHECK(f.size() == 14 + 20 + 8 + 12 + 16 + 4);
  PacketView v;
  REQUIRE(parse_frame(f, v) == ParseError::Ok);
  CHECK((v.op->flags & kOpCnp));
}

TEST_CASE("finish_frame_ext: headers, payload elsewhere and tail make the frame finish_frame makes",
          "[wire][packet][icrc]") {
  for (bool ipv6 : {false, true})
    for (bool vlan : {false, true})
      for (uint8_t opc : {uint8_t{op::RC_WRITE_FIRST}, uint8_t{op::RC_WRITE_MIDDLE},
                          uint8_t{op::RC_READ_RESPONSE_ONLY}, uint8_t{op::UD_SEND_ONLY_IMM}})
        for (uint32_t plen : {1u, 2u, 3u, 4u, 1023u, 1024u, 4096u}) {
          const Headers h = make_headers(opc, ipv6, vlan);
          const auto payload = pattern(plen);
          std::vector<uint8_t> whole(frame_len(h, plen));
          REQUIRE(build_frame(whole, h, payload) == whole.size());
          std::vector<uint8_t> hdr(whole.size());
          const size_t hl = build_headers(hdr, h, plen);
          REQUIRE(hl > 0);
          uint8_t tail[7];
          const size_t tl = finish_frame_ext({hdr.data(), hl}, h, payload.data(), plen, tail);
          REQUIRE(hl + plen + tl == whole.size());
          std::vector<uint8_t> chained(hdr.begin(), hdr.begin() + static_cast<long>(hl));
          chained.insert(chained.end(), payload.begin(), payload.end());
          chained.insert(chained.end(), tail, tail + tl);
          CHECK(chained == whole);
          if (plen % 4 == 0) {  // FIRST/MIDDLE packets carry no pad: only those lengths parse for every opcode
            PacketView v;
            CHECK(parse_frame(chained, v) == ParseError::Ok);
          }
        }
}

TEST_CASE("build_headers from a QP's template makes the bytes build_headers makes from the whole Headers",
          "[wire][packet][template]") {
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto next = [&rng] {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  };
  size_t checked = 0;
  for (bool ipv6 : {false, true})
    for (bool vlan : {false, true})
      for (bool mig : {false, true}) {
        Headers path = make_headers(op::RC_SEND_ONLY, ipv6, vlan);
        path.bth.mig = mig;
        path.l3.ip_id = 0;  // as a connected QP sends
        TxTemplate t;
        make_template(t, path);
        L3Fields back = path.l3;  // the template carries the path's addresses (reversed: its peer's packet)
        std::swap(back.src, back.dst);
        CHECK(t.from_peer(back));
        CHECK(t.src_mac() == path.l2.src);
        CHECK(t.tos() == path.l3.tos);
        for (unsigned opc = 0; opc < 256; ++opc) {
          if (!opcode_info(static_cast<uint8_t>(opc)).valid()) continue;
          for (uint32_t plen : {0u, 1u, 3u, 4u, 61u, 1024u, 4093u}) {
            if (!(opcode_info(static_cast<uint8_t>(opc)).flags & kOpPayload) && plen) continue;
            PacketFields f;
            f.opcode = static_cast<uint8_t>(opc);
            f.se = next() & 1;
            f.ackreq = next() & 1;
            f.resv7 = static_cast<uint8_t>(next() & 0x7F);
            f.psn = static_cast<uint32_t>(next() & 0xFFFFFF);
            f.ext.reth = {next(), static_cast<uint32_t>(next()), static_cast<uint32_t>(next())};
            f.ext.aeth = {static_cast<uint8_t>(next()), static_cast<uint32_t>(next() & 0xFFFFFF)};
            f.ext.atomic = {next(), static_cast<uint32_t>(next()), next(), next()};
            f.ext.atomic_orig = next();
            f.ext.deth = {static_cast<uint32_t>(next()), 0, static_cast<uint32_t>(next() & 0xFFFFFF)};
            f.ext.imm = static_cast<uint32_t>(next());
            f.ext.ieth_rkey = static_cast<uint32_t>(next());
            Headers h = path;
            apply_fields(h, f);
            const auto payload = pattern(plen);
            std::vector<uint8_t> want(frame_len(h, plen));
            REQUIRE(build_frame(want, h, payload) == want.size());
            const FrameShape s = frame_shape(t, f.opcode);
            REQUIRE(frame_len(s, plen) == want.size());
            // A buffer with room to spare (the fixed-size copy) and one of the exact size.
            for (size_t room : {want.size() + 128, want.size()}) {
              std::vector<uint8_t> got(room, 0xEE);
              const size_t hl = build_headers(got, t, f, plen);
              REQUIRE(hl == header_len(h));
              if (plen) std::memcpy(got.data() + hl, payload.data(), plen);  // no null source
              REQUIRE(finish_frame(got, s, plen) == want.size());
              got.resize(want.size());
              CHECK(got == want);
              ++checked;
            }
          }
        }
      }
  CHECK(checked > 500);
  // An opcode that does not exist builds nothing.
  TxTemplate t;
  make_template(t, make_headers(op::RC_SEND_ONLY, false, false));
  PacketFields bad;
  bad.opcode = 0x15;
  std::vector<uint8_t> out(256);
  CHECK(build_headers(out, t, bad, 0) == 0);
  // A buffer shorter than the headers gets nothing, whichever fixed-size copy
  // its size would allow (exact-size buffers: a write past one shows under the sanitizers).
  for (bool ipv6 : {false, true})
    for (bool vlan : {false, true})
      for (uint8_t opc : {op::RC_SEND_ONLY, op::RC_WRITE_ONLY_IMM, op::RC_COMPARE_SWAP, op::RC_READ_RESPONSE_ONLY}) {
        const Headers path = make_headers(op::RC_SEND_ONLY, ipv6, vlan);
        TxTemplate tt;
        make_template(tt, path);
        PacketFields f;
        f.opcode = opc;
        Headers h = path;
        apply_fields(h, f);
        const size_t hl = header_len(h);
        for (size_t len = 1; len < hl; ++len) {
          std::vector<uint8_t> small(len);
          CHECK(build_headers(small, tt, f, 0) == 0);
        }
        std::vector<uint8_t> exact(hl);
        CHECK(build_headers(exact, tt, f, 0) == hl);
      }
}

TEST_CASE("TxTemplate::from_peer: the path's addresses reversed, of the path's IP version", "[wire][packet][template]") {
  for (bool ipv6 : {false, true})
    for (bool vlan : {false, true}) {
      INFO("ipv6=" << ipv6 << " vlan=" << vlan);
      const Headers path = make_headers(op::RC_SEND_ONLY, ipv6, vlan);
      REQUIRE(path.l3.src != path.l3.dst);
      TxTemplate t;
      make_template(t, path);
      L3Fields back = path.l3;
      std::swap(back.src, back.dst);
      CHECK(t.from_peer(back));
      CHECK_FALSE(t.from_peer(path.l3));  // our own packet, not reversed
      for (size_t i : {size_t{0}, size_t{12}, size_t{15}}) {
        if (!ipv6 && i < 12) continue;  // an IPv4 packet's GIDs are IPv4-mapped: only the address counts
        L3Fields x = back;
        x.src[i] ^= 1;
        CHECK_FALSE(t.from_peer(x));
        x = back;
        x.dst[i] ^= 1;
        CHECK_FALSE(t.from_peer(x));
      }
      L3Fields other = back;
      other.ipv6 = !ipv6;
      CHECK_FALSE(t.from_peer(other));
    }
}

TEST_CASE("peek_bth refuses what is not laid out as RoCEv2 and never reads past the frame", "[wire][packet]") {
  for (bool ipv6 : {false, true})
    for (bool vlan : {false, true}) {
      INFO("ipv6=" << ipv6 << " vlan=" << vlan);
      const Headers h = make_headers(op::RC_ACKNOWLEDGE, ipv6, vlan);
      std::vector<uint8_t> f(frame_len(h, 0));
      REQUIRE(build_frame(f, h, {}) == f.size());
      const size_t bth = size_t{vlan ? 18u : 14u} + (ipv6 ? 40u : 20u) + 8u;
      uint8_t opc = 0;
      uint32_t qpn = 0;
      // Every length short of the BTH's first 12 bytes is refused (a copy of
      // exactly that length, so a read past it is caught by the sanitizers).
      for (size_t len = 0; len < bth + 12; ++len) {
        std::vector<uint8_t> cut(f.begin(), f.begin() + static_cast<long>(len));
        CHECK_FALSE(peek_bth(cut.data(), static_cast<uint32_t>(len), opc, qpn));
      }
      std::vector<uint8_t> just(f.begin(), f.begin() + static_cast<long>(bth + 12));
      CHECK(peek_bth(just.data(), static_cast<uint32_t>(just.size()), opc, qpn));
      CHECK(opc == op::RC_ACKNOWLEDGE);
      CHECK(qpn == 0xABCDEF);
      auto other = f;  // another UDP port
      other[bth - 5] ^= 1;
      CHECK_FALSE(peek_bth(other.data(), static_cast<uint32_t>(other.size()), opc, qpn));
      auto arp = f;  // another EtherType
      arp[vlan ? 16 : 12] = 0x08;
      arp[vlan ? 17 : 13] = 0x06;
      CHECK_FALSE(peek_bth(arp.data(), static_cast<uint32_t>(arp.size()), opc, qpn));
    }
}

// droce-dump's decoder on frames built with lib/wire: every opcode over IPv4,
// IPv6 and VLAN, a bad ICRC, each malformed kind, non-RoCE frames, AETH
// decoding, the cooked/raw link types, and the JSON output.
#include <pcap/dlt.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "dump.h"
#include "wire/icrc.h"
#include "wire/packet.h"

using namespace droce::wire;
using droce::dump::Dumper;
using droce::dump::Options;

namespace {

Headers make_headers(uint8_t opcode, bool ipv6, bool vlan) {
  Headers h;
  h.l2.vlan = vlan;
  h.l2.vlan_tci = 0x2064;
  h.l3.ipv6 = ipv6;
  if (ipv6) {
    h.l3.src = {0xfd, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    h.l3.dst = {0xfd, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  } else {
    h.l3.src = gid_from_ipv4(0x0A4D0001);
    h.l3.dst = gid_from_ipv4(0x0A4D0002);
    h.l3.ip_frag = kIpv4FlagDF;
  }
  h.bth.opcode = opcode;
  h.bth.dqpn = 0xABCDEF;
  h.bth.ackreq = true;
  h.bth.psn = 0xFFFFFE;
  h.ext.reth = {0x1122334455667788ull, 0xA1B2C3D4, 4097};
  h.ext.aeth = {0x2C, 0x123456};
  h.ext.atomic = {0x1000, 0x55, 0xDEADBEEFCAFEF00Dull, 0x0102030405060708ull};
  h.ext.atomic_orig = 0x8877665544332211ull;
  h.ext.deth = {0x11111111, 0, 0x000011};
  h.ext.imm = 0x11110000;
  h.ext.ieth_rkey = 0x0800070F;
  return h;
}

std::vector<uint8_t> build(const Headers& h, uint32_t payload) {
  const uint32_t n = opcode_info(h.bth.opcode).has(kOpPayload) ? payload : 0;
  std::vector<uint8_t> pl(n, 0x5A), f(frame_len(h, n));
  REQUIRE(build_frame(f, h, pl) == f.size());
  return f;
}

// Captures what a Dumper prints.
struct Out {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ~Out() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string str() {
    std::fflush(f);
    return std::string(buf, len);
  }
};

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("every opcode over IPv4, IPv6 and VLAN prints one line with its fields and icrc ok") {
  for (const bool ipv6 : {false, true}) {
    for (const bool vlan : {false, true}) {
      Out o;
      Dumper d(o.f, Options{});
      d.begin_file("synthetic", false);
      uint64_t n = 0;
      for (int opc = 0; opc < 256; ++opc) {
        if (!opcode_info(static_cast<uint8_t>(opc)).valid()) continue;
        const Headers h = make_headers(static_cast<uint8_t>(opc), ipv6, vlan);
        const auto f = build(h, opcode_info(static_cast<uint8_t>(opc)).is_last() ? 37 : 36);  // pad only on last
        d.frame(f, static_cast<uint32_t>(f.size()), static_cast<int64_t>(n) * 1500);
        ++n;
      }
      const std::string text = o.str();
      INFO(text);
      const auto out = lines(text);
      REQUIRE(out.size() == n);
      REQUIRE(d.counts().roce == n);
      REQUIRE(d.counts().icrc_ok == n);
      REQUIRE(d.status() == 0);
      size_t i = 0;
      for (int opc = 0; opc < 256; ++opc) {
        const OpcodeInfo& op = opcode_info(static_cast<uint8_t>(opc));
        if (!op.valid()) continue;
        const std::string& l = out[i];
        INFO(l);
        CHECK(d.counts().by_opcode[static_cast<size_t>(opc)] == 1);
        CHECK(has(l, std::string(" ") + op.name + " "));
        CHECK(has(l, ipv6 ? "fd00::1 " : "10.77.0.1 "));
        CHECK(has(l, ipv6 ? "-> fd00::2 " : "-> 10.77.0.2 "));
        CHECK(has(l, "qpn 0xabcdef psn 16777214 ackreq 1"));
        char t[32];
        std::snprintf(t, sizeof t, " %zu.%06zu ", i * 1500 / 1000000, i * 1500 % 1000000);
        CHECK(has(l, t));
        CHECK(has(l, " vlan 100") == vlan);
        CHECK(has(l, "reth va 0x1122334455667788 rkey 0xa1b2c3d4 len 4097") == (op.off_reth != 0));
        CHECK(has(l, "aeth 0x2c RNR_NAK timer 12 (0.64 ms) msn 1193046") == (op.off_aeth != 0));
        CHECK(has(l, "atomic va 0x0000000000001000 rkey 0x00000055 swap_add 0xdeadbeefcafef00d compare "
                     "0x102030405060708") == (op.off_atomic != 0));
        CHECK(has(l, "orig 0x8877665544332211") == (op.off_atomic_ack != 0));
        CHECK(has(l, "deth qkey 0x11111111 srcqp 0x000011") == (op.off_deth != 0));
        CHECK(has(l, "imm 0x11110000") == (op.off_imm != 0));
        CHECK(has(l, "ieth rkey 0x0800070f") == (op.off_ieth != 0));
        CHECK(has(l, !op.has(kOpPayload) ? "payload 0 icrc ok" : op.is_last() ? "payload 37 icrc ok" : "payload 36 icrc ok"));
        ++i;
      }
    }
  }
}

TEST_CASE("a frame with a bad ICRC still prints its decoded fields, marked icrc BAD") {
  const Headers h = make_headers(op::RC_WRITE_FIRST, false, false);
  auto f = build(h, 64);
  f[f.size() - 10] ^= 0x01;  // a payload byte
  Out o;
  Dumper d(o.f, Options{});
  d.begin_file("x", false);
  d.frame(f, static_cast<uint32_t>(f.size()), 0);
  const std::string s = o.str();
  INFO(s);
  CHECK(has(s, "RC_WRITE_FIRST"));
  CHECK(has(s, "reth va 0x1122334455667788 rkey 0xa1b2c3d4 len 4097 payload 64 icrc BAD (wire 0x"));
  CHECK(d.counts().icrc_bad == 1);
  CHECK(d.counts().roce == 1);
  CHECK(d.status() == 1);
}

TEST_CASE("frames to port 4791 that do not parse print the parser's error; others are only counted") {
  const Headers h = make_headers(op::RC_SEND_ONLY, false, false);
  const auto good = build(h, 13);

  struct Case {
    const char* name;
    std::vector<uint8_t> f;
    uint32_t wire_len;
    std::string expect;  // empty: a non-RoCE frame
  };
  std::vector<Case> cases;
  {  // cut by the snap length
    auto f = good;
    f.resize(50);
    cases.push_back({"snaplen", f, static_cast<uint32_t>(good.size()),
                     "MALFORMED truncated: the frame ends before its headers say it does (50 bytes captured of " +
                         std::to_string(good.size()) + " on the wire: the capture's snap length cut it)"});
  }
  {
    auto f = good;
    f[14 + 10] ^= 0xFF;  // IPv4 checksum
    cases.push_back({"ipcsum", f, static_cast<uint32_t>(f.size()), "MALFORMED bad_ip_checksum"});
  }
  {
    auto f = good;
    f[14 + 20 + 8] = 0x15;  // opcode 0x15 is reserved
    cases.push_back({"opcode", f, static_cast<uint32_t>(f.size()),
                     "MALFORMED unknown_opcode: BTH opcode 0x15 is not a RoCEv2 opcode"});
  }
  {
    auto f = good;
    f[14 + 20 + 8 + 1] = static_cast<uint8_t>((f[14 + 20 + 8 + 1] & 0xF0) | 0x01);  // TVer 1
    cases.push_back({"tver", f, static_cast<uint32_t>(f.size()), "MALFORMED bad_bth_version: BTH transport header version 1"});
  }
  {
    const Headers a = make_headers(op::RC_ACKNOWLEDGE, false, false);
    auto f = build(a, 0);
    f[14 + 20 + 8 + 1] |= 0x30;  // pad 3 on a packet without payload
    cases.push_back({"pad", f, static_cast<uint32_t>(f.size()),
                     "MALFORMED bad_pad_count: BTH pad count 3 is not allowed for RC_ACKNOWLEDGE"});
  }
  {
    auto f = good;
    f[14 + 6] = 0x20;  // MF: the first fragment of a UDP 4791 datagram
    f[14 + 10] = f[14 + 11] = 0;
    const uint16_t cs = ipv4_checksum(&f[14], 20);
    f[14 + 10] = static_cast<uint8_t>(cs >> 8);
    f[14 + 11] = static_cast<uint8_t>(cs);
    cases.push_back({"frag", f, static_cast<uint32_t>(f.size()), "MALFORMED fragmented"});
  }
  {
    auto f = good;
    f[14 + 20 + 2] = 0;  // UDP destination port 53
    f[14 + 20 + 3] = 53;
    cases.push_back({"dns", f, static_cast<uint32_t>(f.size()), ""});
  }
  {
    auto f = good;
    f[14 + 9] = 6;  // TCP
    cases.push_back({"tcp", f, static_cast<uint32_t>(f.size()), ""});
  }
  {
    auto f = good;
    f[12] = 0x08;  // ARP
    f[13] = 0x06;
    cases.push_back({"arp", f, static_cast<uint32_t>(f.size()), ""});
  }
  {
    auto f = good;
    f.resize(30);  // a TCP/IP header cut before the ports are visible is not RoCE either
    f[14 + 9] = 6;
    cases.push_back({"short-tcp", f, 200, ""});
  }
  cases.push_back({"tiny", std::vector<uint8_t>(5, 0xFF), 5, ""});

  for (auto& c : cases) {
    INFO(c.name);
    Out o;
    Dumper d(o.f, Options{});
    d.begin_file("x", false);
    d.frame(c.f, c.wire_len, 0);
    const std::string s = o.str();
    INFO(s);
    if (!c.expect.empty()) {
      CHECK(has(s, c.expect));
      CHECK(d.counts().malformed == 1);
      CHECK(d.status() == 1);
    } else {
      CHECK(s.empty());
      CHECK(d.counts().non_roce == 1);
      CHECK(d.status() == 0);
    }
  }
}

TEST_CASE("AETH syndromes decode into ACK credits, RNR timer and NAK codes") {
  using droce::dump::decode_aeth;
  CHECK(decode_aeth(0x1F).kind == std::string("ACK"));
  CHECK(decode_aeth(0x1F).credits == -1);
  CHECK(decode_aeth(0x00).credits == 0);
  CHECK(decode_aeth(0x05).credits == 6);
  CHECK(decode_aeth(0x1E).credits == 32768);
  CHECK(decode_aeth(0x2C).kind == std::string("RNR_NAK"));
  CHECK(decode_aeth(0x2C).rnr_ms == Approx(0.64));
  CHECK(decode_aeth(0x20).rnr_ms == Approx(655.36));
  CHECK(decode_aeth(0x3F).rnr_ms == Approx(491.52));
  CHECK(decode_aeth(0x60).nak == std::string("psn_sequence_error"));
  CHECK(decode_aeth(0x61).nak == std::string("invalid_request"));
  CHECK(decode_aeth(0x62).nak == std::string("remote_access_error"));
  CHECK(decode_aeth(0x63).nak == std::string("remote_operational_error"));
  CHECK(decode_aeth(0x64).nak == std::string("invalid_rd_request"));
  CHECK(decode_aeth(0x65).nak == std::string("reserved"));
  CHECK(decode_aeth(0x40).kind == std::string("reserved"));
  CHECK(decode_aeth(0x80).kind == std::string("reserved"));
}

TEST_CASE("Linux cooked and raw IP frames decode like the Ethernet frame they carry") {
  const Headers h = make_headers(op::RC_READ_REQUEST, false, false);
  const auto eth = build(h, 0);
  const std::vector<uint8_t> ip(eth.begin() + 14, eth.end());
  std::vector<uint8_t> sll(16, 0), sll2(20, 0), scratch;
  sll[14] = 0x08;
  sll2[0] = 0x08;
  sll.insert(sll.end(), ip.begin(), ip.end());
  sll2.insert(sll2.end(), ip.begin(), ip.end());
  const std::pair<int, std::vector<uint8_t>> in[] = {{DLT_EN10MB, eth}, {DLT_LINUX_SLL, sll},
                                                     {DLT_LINUX_SLL2, sll2}, {DLT_RAW, ip}};
  for (const auto& [dlt, bytes] : in) {
    INFO(dlt);
    REQUIRE(droce::dump::link_supported(dlt));
    const auto f = droce::dump::to_ethernet(dlt, bytes, scratch);
    std::vector<uint8_t> want(eth);
    if (dlt != DLT_EN10MB) std::fill(want.begin(), want.begin() + 12, 0);  // no MACs in a cooked capture
    CHECK(std::vector<uint8_t>(f.begin(), f.end()) == want);
  }
  CHECK(droce::dump::to_ethernet(DLT_LINUX_SLL, std::span<const uint8_t>(sll.data(), 10), scratch).empty());
  CHECK(droce::dump::to_ethernet(DLT_RAW, std::span<const uint8_t>(), scratch).empty());
  CHECK(!droce::dump::link_supported(DLT_IEEE802_11));
}

TEST_CASE("--json prints one object per packet and a summary object with the same fields") {
  Out o;
  Dumper d(o.f, Options{true, false});
  d.begin_file("syn\xff.pcap", false);  // not UTF-8: replaced, not thrown
  const auto w = build(make_headers(op::RC_WRITE_ONLY_IMM, true, false), 8);
  auto a = build(make_headers(op::RC_ATOMIC_ACKNOWLEDGE, false, false), 0);
  a[a.size() - 1] ^= 0xFF;  // the ICRC itself
  const auto u = build(make_headers(op::UD_SEND_ONLY, false, true), 3);
  auto bad = u;
  bad.resize(50);  // VLAN + IPv4 + UDP + 4 bytes of the BTH
  d.frame(w, static_cast<uint32_t>(w.size()), 1000000);
  d.frame(a, static_cast<uint32_t>(a.size()), 1000001);
  d.frame(u, static_cast<uint32_t>(u.size()), 2500000);
  d.frame(bad, static_cast<uint32_t>(u.size()), 2500000);
  d.summary();
  const auto out = lines(o.str());
  REQUIRE(out.size() == 5);
  std::vector<nlohmann::json> j;
  for (const auto& l : out) j.push_back(nlohmann::json::parse(l));
  CHECK(j[0]["type"] == "packet");
  CHECK(j[0]["frame"] == 1);
  CHECK(j[0]["time"] == 0.0);
  CHECK(j[0]["src"] == "fd00::1");
  CHECK(j[0]["ipv6"] == true);
  CHECK(j[0]["op"] == "RC_WRITE_ONLY_IMM");
  CHECK(j[0]["opcode"] == 0x0B);
  CHECK(j[0]["dqpn"] == 0xABCDEF);
  CHECK(j[0]["psn"] == 0xFFFFFE);
  CHECK(j[0]["ackreq"] == true);
  CHECK(j[0]["reth"]["va"] == "0x1122334455667788");
  CHECK(j[0]["reth"]["rkey"] == 0xA1B2C3D4u);
  CHECK(j[0]["reth"]["len"] == 4097);
  CHECK(j[0]["imm"] == "0x11110000");
  CHECK(j[0]["payload_len"] == 8);
  CHECK(j[0]["icrc"] == "ok");
  CHECK(j[1]["time"] == Approx(0.000001));
  CHECK(j[1]["aeth"]["kind"] == "RNR_NAK");
  CHECK(j[1]["aeth"]["rnr_ms"] == Approx(0.64));
  CHECK(j[1]["aeth"]["msn"] == 0x123456);
  CHECK(j[1]["atomic_ack"]["orig"] == "0x8877665544332211");
  CHECK(j[1]["icrc"] == "bad");
  CHECK(j[1]["icrc_wire"] != j[1]["icrc_computed"]);
  CHECK(j[2]["time"] == Approx(1.5));
  CHECK(j[2]["vlan"] == 100);
  CHECK(j[2]["deth"]["qkey"] == 0x11111111);
  CHECK(j[2]["deth"]["src_qp"] == 0x11);
  CHECK(j[3]["type"] == "malformed");
  CHECK(j[3]["error"] == "truncated");
  CHECK(j[3]["caplen"] == 50);
  CHECK(j[4]["type"] == "summary");
  CHECK(j[4]["frames"] == 4);
  CHECK(j[4]["roce"] == 3);
  CHECK(j[4]["icrc_bad"] == 1);
  CHECK(j[4]["malformed"] == 1);
  CHECK(j[4]["by_opcode"]["UD_SEND_ONLY"] == 1);
  CHECK(j[4]["errors"]["truncated"] == 1);
  CHECK(d.status() == 1);
}

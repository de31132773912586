// Golden traffic from a real implementation: captures of Linux Soft-RoCE
// (test/data/rxe-*.pcap, made with ../shared/rxe-peer). Every RoCEv2 packet
// must parse, verify its ICRC with our code, decode to the same fields that
// Wireshark's dissector reads (test/data/*.fields.tsv, from
// scripts/gen-golden-fields.sh), and rebuild to the same bytes.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "pcapio/pcap_file.h"
#include "wire/icrc.h"
#include "wire/packet.h"

using namespace droce::wire;

namespace {

const std::string kData = DROCE_TEST_DATA;

// One row of tshark fields: name -> text ("" when the packet lacks the field).
using Row = std::map<std::string, std::string>;

std::vector<Row> read_fields(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::string line;
  std::getline(in, line);
  REQUIRE(line.size() > 1);
  std::vector<std::string> names;
  {
    std::stringstream ss(line.substr(1));
    std::string n;
    while (std::getline(ss, n, '\t'))
      if (!n.empty()) names.push_back(n);
  }
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    Row r;
    size_t start = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      const size_t tab = line.find('\t', start);
      r[names[i]] = line.substr(start, tab == std::string::npos ? std::string::npos : tab - start);
      start = tab == std::string::npos ? line.size() : tab + 1;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

bool has(const Row& r, const char* k) { return !r.at(k).empty(); }
uint64_t num(const Row& r, const char* k) { return std::strtoull(r.at(k).c_str(), nullptr, 0); }
// tshark prints ImmDt and IETH as bare hex, twice, comma separated.
uint64_t hexnum(const Row& r, const char* k) { return std::strtoull(r.at(k).c_str(), nullptr, 16); }

struct Totals {
  size_t packets = 0;
  std::map<std::string, size_t> by_opcode;
};

Totals check_capture(const std::string& name) {
  std::vector<droce::pcapio::Frame> frames;
  std::string err;
  INFO(name);
  REQUIRE(droce::pcapio::read_pcap(kData + "/" + name + ".pcap", frames, err));
  const auto rows = read_fields(kData + "/" + name + ".fields.tsv");
  REQUIRE(rows.size() == frames.size());
  Totals t;
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto& f = frames[i].bytes;
    const Row& r = rows[i];
    INFO("frame " << i + 1);
    PacketView v;
    const ParseError e = parse_frame(f, v);
    REQUIRE(parse_error_name(e) == std::string("ok"));
    ++t.packets;
    ++t.by_opcode[v.op->name];

    // The prefetch hint (peek_bth) reads the same opcode and QPN as the parse.
    uint8_t popc = 0;
    uint32_t pqpn = 0;
    CHECK(peek_bth(f.data(), static_cast<uint32_t>(f.size()), popc, pqpn));
    CHECK(popc == v.h.bth.opcode);
    CHECK(pqpn == v.h.bth.dqpn);

    // Fields, against Wireshark's dissector.
    CHECK(v.h.bth.opcode == num(r, "infiniband.bth.opcode"));
    CHECK(v.h.bth.se == (num(r, "infiniband.bth.se") != 0));
    CHECK(v.h.bth.mig == (num(r, "infiniband.bth.m") != 0));
    CHECK(v.h.bth.pad == num(r, "infiniband.bth.padcnt"));
    CHECK(v.h.bth.tver == num(r, "infiniband.bth.tver"));
    CHECK(v.h.bth.pkey == num(r, "infiniband.bth.p_key"));
    CHECK(v.h.bth.dqpn == num(r, "infiniband.bth.destqp"));
    CHECK(v.h.bth.ackreq == (num(r, "infiniband.bth.a") != 0));
    CHECK(v.h.bth.psn == num(r, "infiniband.bth.psn"));
    CHECK(v.h.l4.sport == num(r, "udp.srcport"));
    CHECK((v.op->off_deth != 0) == has(r, "infiniband.deth.q_key"));
    if (v.op->off_deth) {
      CHECK(v.h.ext.deth.qkey == num(r, "infiniband.deth.q_key"));
      CHECK(v.h.ext.deth.sqpn == num(r, "infiniband.deth.srcqp"));
    }
    // Wireshark shows the AtomicETH's VA and R_Key under the RETH field names.
    CHECK((v.op->off_reth != 0 || v.op->off_atomic != 0) == has(r, "infiniband.reth.va"));
    if (v.op->off_reth) {
      CHECK(v.h.ext.reth.va == num(r, "infiniband.reth.va"));
      CHECK(v.h.ext.reth.rkey == num(r, "infiniband.reth.r_key"));
      CHECK(v.h.ext.reth.len == num(r, "infiniband.reth.dmalen"));
    }
    CHECK((v.op->off_atomic != 0) == has(r, "infiniband.atomiceth.swapdt"));
    if (v.op->off_atomic) {
      CHECK(v.h.ext.atomic.swap_add == num(r, "infiniband.atomiceth.swapdt"));
      CHECK(v.h.ext.atomic.compare == num(r, "infiniband.atomiceth.cmpdt"));
      CHECK(v.h.ext.atomic.va == num(r, "infiniband.reth.va"));
      CHECK(v.h.ext.atomic.rkey == num(r, "infiniband.reth.r_key"));
    }
    CHECK((v.op->off_aeth != 0) == has(r, "infiniband.aeth.syndrome"));
    if (v.op->off_aeth) {
      CHECK(v.h.ext.aeth.syndrome == num(r, "infiniband.aeth.syndrome"));
      CHECK(v.h.ext.aeth.msn == num(r, "infiniband.aeth.msn"));
    }
    CHECK((v.op->off_atomic_ack != 0) == has(r, "infiniband.atomicacketh.origremdt"));
    if (v.op->off_atomic_ack) CHECK(v.h.ext.atomic_orig == num(r, "infiniband.atomicacketh.origremdt"));
    CHECK((v.op->off_imm != 0) == has(r, "infiniband.immdt"));
    if (v.op->off_imm) CHECK(v.h.ext.imm == hexnum(r, "infiniband.immdt"));
    CHECK((v.op->off_ieth != 0) == has(r, "infiniband.ieth"));
    if (v.op->off_ieth) CHECK(v.h.ext.ieth_rkey == hexnum(r, "infiniband.ieth"));

    // The ICRC our code computes is the one rxe put on the wire.
    CHECK(icrc_compute({f.data() + v.l3_off, v.frame_len - kIcrcSize - v.l3_off}, v.ip_hdr_len,
                       v.h.l3.ipv6) == v.icrc);

    // Rebuilding from the decoded fields gives the same bytes.
    std::vector<uint8_t> out(v.frame_len + 64);
    const size_t n = build_frame(out, v.h, v.payload_span());
    REQUIRE(n == v.frame_len);
    CHECK(std::equal(out.begin(), out.begin() + static_cast<long>(n), f.begin()));

    // A flipped bit anywhere in the ICRC-covered bytes from the BTH on is caught
    // (BTH byte 4, FECN/BECN/reserved, is masked out of the ICRC by design).
    auto bad = f;
    size_t at = i % (v.frame_len - v.bth_off);
    if (at == 4) at = 5;
    bad[v.bth_off + at] ^= 0x10;
    PacketView v2;
    CHECK(parse_frame(bad, v2) != ParseError::Ok);
  }
  return t;
}

}  // namespace

TEST_CASE("golden: rxe RC reference session (SEND, WRITE, READ, ATOMIC)", "[wire][golden]") {
  const auto t = check_capture("rxe-rc-reference");
  CHECK(t.packets == 237);
  CHECK(t.by_opcode.count("RC_COMPARE_SWAP") == 1);
  CHECK(t.by_opcode.count("RC_FETCH_ADD") == 1);
  CHECK(t.by_opcode.count("RC_ATOMIC_ACKNOWLEDGE") == 1);
  CHECK(t.by_opcode.count("RC_READ_REQUEST") == 1);
}

TEST_CASE("golden: rxe UD and UC", "[wire][golden]") {
  const auto t = check_capture("rxe-ud-uc");
  CHECK(t.by_opcode.count("UD_SEND_ONLY") == 1);
  CHECK(t.by_opcode.count("UC_SEND_ONLY") + t.by_opcode.count("UC_WRITE_ONLY") >= 1);
}

TEST_CASE("golden: rxe MTU 4096 multi-packet messages", "[wire][golden]") {
  const auto t = check_capture("rxe-mtu4096");
  CHECK(t.packets == 87);
}

TEST_CASE("golden: rxe immediate data, invalidate, remote access NAK", "[wire][golden]") {
  const auto t = check_capture("rxe-imm-inv");
  CHECK(t.packets == 40);
  CHECK(t.by_opcode.at("RC_SEND_ONLY_INV") == 1);
  CHECK(t.by_opcode.at("RC_WRITE_ONLY_IMM") == 4);
}

TEST_CASE("golden: rxe under loss (NAK, RNR NAK, retransmissions)", "[wire][golden]") {
  const auto t = check_capture("rxe-loss");
  CHECK(t.packets == 468);
}

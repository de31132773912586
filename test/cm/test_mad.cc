// CM MAD codec (lib/cm/mad.cc): round trips with every field at its maximum
// and at distinct values, known-answer bytes written by hand from the IBTA
// tables (vol. 1 ch. 12.6: byte offsets from the CM payload, which starts at
// byte 24 of the MAD), every decoding error, and random input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "cm/mad.h"
#include "cm_samples.h"

using namespace droce::cm;
using droce::wire::Gid;

namespace {

using Mad = std::array<uint8_t, kMadSize>;

template <typename M>
Mad enc(const M& m, uint64_t tid = 0x0102030405060708ull) {
  Mad out;
  out.fill(0xEE);  // the encoder writes every byte
  encode(out, tid, m);
  return out;
}

template <typename M>
M round_trip(const M& m) {
  const Mad b = enc(m);
  M back;
  REQUIRE(decode(b, back) == MadError::None);
  return back;
}

size_t popcount(std::span<const uint8_t> b) {
  size_t n = 0;
  for (uint8_t x : b) n += std::popcount(x);
  return n;
}

// All-ones in every field: the set bits of the encoded body must be exactly
// the sum of the field widths, so two fields sharing a bit, a field one bit
// too narrow or too wide, all show.
template <typename M>
void check_bit_budget(const M& m, size_t field_bits) {
  const Mad b = enc(m, 0);
  // Header: base version 1, class 0x07, class version 2, method 0x03, attribute ID.
  const size_t hdr_bits = 1 + 3 + 1 + 2 + popcount(std::span(b).subspan(16, 2));
  CHECK(popcount(std::span(b).first(kMadHdrSize)) == hdr_bits);
  CHECK(popcount(std::span(b).subspan(kMadHdrSize)) == field_bits);
}

uint8_t body(const Mad& b, size_t off) { return b[kMadHdrSize + off]; }

}  // namespace

TEST_CASE("every message round-trips with distinct non-trivial field values", "[cm][mad]") {
  CHECK(round_trip(samples::req()) == samples::req());
  CHECK(round_trip(samples::mra()) == samples::mra());
  CHECK(round_trip(samples::rej()) == samples::rej());
  CHECK(round_trip(samples::rep()) == samples::rep());
  CHECK(round_trip(samples::rtu()) == samples::rtu());
  CHECK(round_trip(samples::dreq()) == samples::dreq());
  CHECK(round_trip(samples::drep()) == samples::drep());
  CHECK(round_trip(samples::sidr_req()) == samples::sidr_req());
  CHECK(round_trip(samples::sidr_rep()) == samples::sidr_rep());
}

TEST_CASE("the header round-trips: attribute from the type, transaction ID as given", "[cm][mad]") {
  const Mad b = enc(samples::rep(), 0xFEDCBA9876543210ull);
  MadHdr h;
  REQUIRE(decode_hdr(b, h) == MadError::None);
  CHECK(h.base_version == 1);
  CHECK(h.mgmt_class == 0x07);
  CHECK(h.class_version == 2);
  CHECK(h.method == 0x03);
  CHECK(h.status == 0);
  CHECK(h.class_specific == 0);
  CHECK(h.tid == 0xFEDCBA9876543210ull);
  CHECK(h.attr_id == Attr::Rep);
  CHECK(h.attr_mod == 0);
  const std::array<uint8_t, 24> want{1, 0x07, 2, 0x03, 0, 0, 0, 0, 0xFE, 0xDC, 0xBA, 0x98,
                                     0x76, 0x54, 0x32, 0x10, 0x00, 0x13, 0, 0, 0, 0, 0, 0};
  CHECK(std::equal(want.begin(), want.end(), b.begin()));
}

TEST_CASE("every field at its maximum: round trip, and exactly its width of bits on the wire", "[cm][mad]") {
  SECTION("REQ") {
    Req m;
    m.local_comm_id = 0xFFFFFFFF;
    m.service_id = ~0ull;
    m.local_ca_guid = ~0ull;
    m.local_qkey = 0xFFFFFFFF;
    m.local_qpn = 0xFFFFFF;
    m.responder_resources = 0xFF;
    m.initiator_depth = 0xFF;
    m.remote_cm_response_timeout = 31;
    m.transport = CmTransport::Ext;
    m.end_to_end_flow_control = true;
    m.starting_psn = 0xFFFFFF;
    m.local_cm_response_timeout = 31;
    m.retry_count = 7;
    m.pkey = 0xFFFF;
    m.path_mtu = 15;
    m.rdc_exists = true;
    m.rnr_retry_count = 7;
    m.max_cm_retries = 15;
    m.srq = true;
    m.extended_transport = 7;
    for (Path* p : {&m.primary, &m.alternate}) {
      p->local_lid = p->remote_lid = 0xFFFF;
      p->local_gid.fill(0xFF);
      p->remote_gid.fill(0xFF);
      p->flow_label = 0xFFFFF;
      p->packet_rate = 63;
      p->traffic_class = 0xFF;
      p->hop_limit = 0xFF;
      p->sl = 15;
      p->subnet_local = true;
      p->local_ack_timeout = 31;
    }
    m.has_alternate = true;
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    const size_t path_bits = 16 + 16 + 128 + 128 + 20 + 6 + 8 + 8 + 4 + 1 + 5;
    check_bit_budget(m, 32 + 64 + 64 + 32 + 24 + 8 + 8 + 5 + 2 + 1 + 24 + 5 + 3 + 16 + 4 + 1 + 3 + 4 + 1 + 3 +
                            2 * path_bits + 92 * 8);
  }
  SECTION("MRA") {
    Mra m;
    m.local_comm_id = m.remote_comm_id = 0xFFFFFFFF;
    m.message_mraed = 3;
    m.service_timeout = 31;
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    check_bit_budget(m, 64 + 2 + 5 + kMraPrivate * 8);
  }
  SECTION("REJ") {
    Rej m;
    m.local_comm_id = m.remote_comm_id = 0xFFFFFFFF;
    m.message_rejected = 3;
    m.ari_length = 72;  // the largest valid; 127 fits the field but is refused
    m.reason = 0xFFFF;
    std::fill(std::begin(m.ari), std::end(m.ari), 0xFF);
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    check_bit_budget(m, 64 + 2 + std::popcount(72u) + 16 + 72 * 8 + kRejPrivate * 8);
  }
  SECTION("REP") {
    Rep m;
    m.local_comm_id = m.remote_comm_id = 0xFFFFFFFF;
    m.local_qkey = 0xFFFFFFFF;
    m.local_qpn = m.local_eecn = m.starting_psn = 0xFFFFFF;
    m.responder_resources = m.initiator_depth = 0xFF;
    m.target_ack_delay = 31;
    m.failover_accepted = 3;
    m.end_to_end_flow_control = true;
    m.rnr_retry_count = 7;
    m.srq = true;
    m.local_ca_guid = ~0ull;
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    check_bit_budget(m, 64 + 32 + 3 * 24 + 16 + 5 + 2 + 1 + 3 + 1 + 64 + kRepPrivate * 8);
  }
  SECTION("RTU, DREP") {
    Rtu r;
    r.local_comm_id = r.remote_comm_id = 0xFFFFFFFF;
    std::fill(std::begin(r.private_data), std::end(r.private_data), 0xFF);
    CHECK(round_trip(r) == r);
    check_bit_budget(r, 64 + kRtuPrivate * 8);
    Drep d;
    d.local_comm_id = d.remote_comm_id = 0xFFFFFFFF;
    std::fill(std::begin(d.private_data), std::end(d.private_data), 0xFF);
    CHECK(round_trip(d) == d);
    check_bit_budget(d, 64 + kDrepPrivate * 8);
  }
  SECTION("DREQ") {
    Dreq m;
    m.local_comm_id = m.remote_comm_id = 0xFFFFFFFF;
    m.remote_qpn = 0xFFFFFF;
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    check_bit_budget(m, 64 + 24 + kDreqPrivate * 8);
  }
  SECTION("SIDR_REQ") {
    SidrReq m;
    m.request_id = 0xFFFFFFFF;
    m.pkey = 0xFFFF;
    m.service_id = ~0ull;
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    check_bit_budget(m, 32 + 16 + 64 + kSidrReqPrivate * 8);
  }
  SECTION("SIDR_REP") {
    SidrRep m;
    m.request_id = 0xFFFFFFFF;
    m.status = 0xFF;
    m.add_info_length = 72;
    m.qpn = 0xFFFFFF;
    m.service_id = ~0ull;
    m.qkey = 0xFFFFFFFF;
    std::fill(std::begin(m.add_info), std::end(m.add_info), 0xFF);
    std::fill(std::begin(m.private_data), std::end(m.private_data), 0xFF);
    CHECK(round_trip(m) == m);
    check_bit_budget(m, 32 + 8 + std::popcount(72u) + 24 + 64 + 32 + 72 * 8 + kSidrRepPrivate * 8);
  }
}

TEST_CASE("values wider than a field are masked to it and do not spill into neighbours", "[cm][mad]") {
  Req m;
  m.local_qpn = 0xFF123456;        // 24 bits; byte 35 (responder resources) follows
  m.remote_cm_response_timeout = 0xFF;  // 5 bits; transport and flow control share the byte
  m.path_mtu = 0xF3;               // 4 bits
  m.primary.flow_label = 0xFFFABCDE;  // 20 bits
  Req back = round_trip(m);
  CHECK(back.local_qpn == 0x123456);
  CHECK(back.responder_resources == 0);
  CHECK(back.remote_cm_response_timeout == 31);
  CHECK(back.transport == CmTransport::Rc);
  CHECK_FALSE(back.end_to_end_flow_control);
  CHECK(back.path_mtu == 3);
  CHECK_FALSE(back.rdc_exists);
  CHECK(back.primary.flow_label == 0xABCDE);
  CHECK(back.primary.packet_rate == 0);
}

TEST_CASE("REQ known answer: the bytes of the IBTA table 106 layout", "[cm][mad]") {
  const Req m = samples::req();
  const Mad b = enc(m, 0x1122334455667788ull);
  // Header (IBTA 13.4.2): 1, class 0x07, class version 2, SEND; TID at 8; attribute ID 0x0010 at 16.
  CHECK(b[0] == 1);
  CHECK(b[1] == 0x07);
  CHECK(b[2] == 2);
  CHECK(b[3] == 0x03);
  CHECK(b[8] == 0x11);
  CHECK(b[15] == 0x88);
  CHECK(b[16] == 0x00);
  CHECK(b[17] == 0x10);
  // The whole expected MAD, written from the table (byte: field).
  Mad want{};
  std::memcpy(want.data(), b.data(), kMadHdrSize);
  auto put = [&](size_t off, std::initializer_list<uint8_t> v) {
    std::copy(v.begin(), v.end(), want.begin() + kMadHdrSize + off);
  };
  put(0, {0xA1, 0xB2, 0xC3, 0xD4});                          // local communication ID
  put(8, {0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x48, 0x53});  // service ID (TCP port 18515)
  put(16, {0x02, 0x11, 0x22, 0xFF, 0xFE, 0x33, 0x44, 0x55}); // local CA GUID
  put(28, {0x12, 0x34, 0x56, 0x78});                         // local Q_Key
  put(32, {0xAB, 0xCD, 0xEF});                               // local QPN (24)
  put(35, {0x10});                                           // responder resources
  put(39, {0x20});                                           // initiator depth
  put(43, {0xAB});  // remote CM response timeout 0x15 (5) | transport UC 01 (2) | end-to-end flow control 1
  put(44, {0x65, 0x43, 0x21});  // starting PSN (24)
  put(47, {0x55});  // local CM response timeout 0x0A (5) | retry count 5 (3)
  put(48, {0x80, 0x01});  // P_Key
  put(50, {0x5E});  // path MTU 5 (4) | RDC exists 1 | RNR retry count 6 (3)
  put(51, {0x97});  // max CM retries 9 (4) | SRQ 0 | extended transport type 7 (3)
  put(52, {0xFF, 0xFF, 0xFF, 0xFE});  // primary local / remote port LID
  put(56, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 7, 1});  // primary local GID
  put(72, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 7, 2});  // primary remote GID
  put(88, {0xAB, 0xCD, 0xE0, 0x2A});  // flow label 0xABCDE (20) | reserved (6) | packet rate 0x2A (6)
  put(92, {0xB8, 0x40});  // traffic class, hop limit
  put(94, {0xC8});  // SL 12 (4) | subnet local 1 | reserved (3)
  put(95, {0x98});  // local ACK timeout 0x13 (5) | reserved (3)
  // 96..139: alternate path: absent, zero
  for (size_t i = 0; i < kReqPrivate; ++i) want[kMadHdrSize + 140 + i] = m.private_data[i];
  for (size_t i = 0; i < kMadSize; ++i) {
    INFO("MAD byte " << i << " (CM payload byte " << static_cast<int>(i) - 24 << ")");
    CHECK(static_cast<int>(b[i]) == static_cast<int>(want[i]));
  }
}

TEST_CASE("REQ alternate path: at bytes 96..139 when present, zero and absent otherwise", "[cm][mad]") {
  Req m = samples::req();
  m.has_alternate = true;
  m.alternate = m.primary;
  m.alternate.local_lid = 0x1234;
  m.alternate.sl = 3;
  m.alternate.local_ack_timeout = 1;
  const Mad b = enc(m);
  CHECK(body(b, 96) == 0x12);
  CHECK(body(b, 97) == 0x34);
  CHECK(body(b, 100 + 10) == 0xFF);  // alternate local GID ::ffff:192.168.7.1
  CHECK(body(b, 100 + 12) == 192);
  CHECK(body(b, 116 + 15) == 2);     // alternate remote GID ends in .2
  CHECK(body(b, 132) == 0xAB);       // flow label
  CHECK(body(b, 135) == 0x2A);       // packet rate
  CHECK(body(b, 138) == 0x38);       // SL 3 | subnet local
  CHECK(body(b, 139) == 0x08);       // ACK timeout 1, SAP supported 0
  CHECK(round_trip(m) == m);

  m.has_alternate = false;
  const Mad z = enc(m);
  CHECK(std::all_of(z.begin() + kMadHdrSize + 96, z.begin() + kMadHdrSize + 140, [](uint8_t x) { return x == 0; }));
  Req back;
  REQUIRE(decode(z, back) == MadError::None);
  CHECK_FALSE(back.has_alternate);
  CHECK(back.alternate == Path{});
}

TEST_CASE("known answers of the other messages (IBTA tables 107..120)", "[cm][mad]") {
  SECTION("MRA") {
    const Mad b = enc(samples::mra());
    CHECK(b[17] == 0x11);
    CHECK(body(b, 0) == 0x0A);
    CHECK(body(b, 3) == 0x0D);
    CHECK(body(b, 4) == 0xB0);
    CHECK(body(b, 8) == 0x80);  // message MRAed 2 (LAP) in bits 7..6
    CHECK(body(b, 9) == 0xA8);  // service timeout 0x15 in bits 7..3
    CHECK(body(b, 10) == samples::mra().private_data[0]);
  }
  SECTION("REJ") {
    const Mad b = enc(samples::rej());
    CHECK(b[17] == 0x12);
    CHECK(body(b, 8) == 0x40);  // message rejected 1 (REP)
    CHECK(body(b, 9) == 0x0E);  // ARI length 7 in bits 7..1
    CHECK(body(b, 10) == 0x00);
    CHECK(body(b, 11) == 28);   // reason: consumer defined
    CHECK(body(b, 12) == samples::rej().ari[0]);
    CHECK(body(b, 84) == samples::rej().private_data[0]);
    CHECK(body(b, 231) == samples::rej().private_data[kRejPrivate - 1]);
  }
  SECTION("REP") {
    const Mad b = enc(samples::rep());
    CHECK(b[17] == 0x13);
    CHECK(body(b, 8) == 0x01);   // Q_Key 0x01234567
    CHECK(body(b, 12) == 0x00);  // QPN 0x000123 (24)
    CHECK(body(b, 14) == 0x23);
    CHECK(body(b, 15) == 0x00);  // reserved
    CHECK(body(b, 16) == 0xEE);  // EECN 0xEEEEEE
    CHECK(body(b, 20) == 0x0F);  // starting PSN 0x0FFFFE
    CHECK(body(b, 22) == 0xFE);
    CHECK(body(b, 24) == 0x04);  // responder resources
    CHECK(body(b, 25) == 0x08);  // initiator depth
    CHECK(body(b, 26) == 0x8D);  // target ACK delay 0x11 (5) | failover 2 (2) | flow control 1
    CHECK(body(b, 27) == 0xD0);  // RNR retry count 6 (3) | SRQ 1 | reserved (4)
    CHECK(body(b, 28) == 0x02);  // local CA GUID
    CHECK(body(b, 35) == 0x66);
    CHECK(body(b, 36) == samples::rep().private_data[0]);
  }
  SECTION("DREQ") {
    const Mad b = enc(samples::dreq());
    CHECK(b[17] == 0x15);
    CHECK(body(b, 8) == 0x00);  // remote QPN 0x00ABCD
    CHECK(body(b, 9) == 0xAB);
    CHECK(body(b, 10) == 0xCD);
    CHECK(body(b, 11) == 0x00);
    CHECK(body(b, 12) == samples::dreq().private_data[0]);
  }
  SECTION("RTU, DREP") {
    const Mad r = enc(samples::rtu());
    CHECK(r[17] == 0x14);
    CHECK(body(r, 8) == samples::rtu().private_data[0]);
    const Mad d = enc(samples::drep());
    CHECK(d[17] == 0x16);
    CHECK(body(d, 4) == 0x55);
    CHECK(body(d, 8) == samples::drep().private_data[0]);
  }
  SECTION("SIDR_REQ") {
    const Mad b = enc(samples::sidr_req());
    CHECK(b[17] == 0x17);
    CHECK(body(b, 4) == 0x7F);  // P_Key 0x7FFF
    CHECK(body(b, 5) == 0xFF);
    CHECK(body(b, 8 + 4) == 0x01);  // service ID 0x0000000001110000 | 7471
    CHECK(body(b, 8 + 5) == 0x11);
    CHECK(body(b, 16) == samples::sidr_req().private_data[0]);
  }
  SECTION("SIDR_REP") {
    const Mad b = enc(samples::sidr_rep());
    CHECK(b[17] == 0x18);
    CHECK(body(b, 4) == 0x02);  // status: reject
    CHECK(body(b, 5) == 0x05);  // additional information length
    CHECK(body(b, 8) == 0x00);  // QPN 0x0000C0 (24)
    CHECK(body(b, 10) == 0xC0);
    CHECK(body(b, 11) == 0x00);
    CHECK(body(b, 12 + 6) == 0x1D);  // service ID low bytes: port 7471 = 0x1D2F
    CHECK(body(b, 20) == 0x01);      // Q_Key 0x01234567
    CHECK(body(b, 23) == 0x67);
    CHECK(body(b, 24) == samples::sidr_rep().add_info[0]);
    CHECK(body(b, 96) == samples::sidr_rep().private_data[0]);
  }
}

TEST_CASE("decoding errors", "[cm][mad]") {
  const Mad good = enc(samples::req());
  Req r;
  MadHdr h;
  SECTION("short: every size below 256, no read past the end") {
    for (size_t n = 0; n < kMadSize; ++n) {
      std::vector<uint8_t> v(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
      CHECK(decode_hdr(v, h) == MadError::Short);
      CHECK(decode(v, r) == MadError::Short);
    }
  }
  SECTION("header fields") {
    auto with = [&](size_t off, uint8_t v) {
      Mad b = good;
      b[off] = v;
      return b;
    };
    CHECK(decode(with(0, 2), r) == MadError::BaseVersion);
    CHECK(decode(with(1, 0x01), r) == MadError::NotCm);  // subnet management
    CHECK(decode(with(2, 1), r) == MadError::ClassVersion);
    CHECK(decode(with(3, 0x01), r) == MadError::Method);  // GET
    CHECK(decode(with(3, 0x83), r) == MadError::Method);  // response bit
    CHECK(decode(with(17, 0x19), r) == MadError::UnknownAttr);  // LAP
    CHECK(decode(with(17, 0x01), r) == MadError::UnknownAttr);  // ClassPortInfo
    CHECK(decode(with(16, 0x80), r) == MadError::UnknownAttr);
    // decode_hdr still reports what it saw.
    REQUIRE(decode_hdr(with(17, 0x1A), h) == MadError::UnknownAttr);
    CHECK(h.attr_id == Attr::Apr);
    CHECK(decode_hdr(with(0, 0), h) == MadError::BaseVersion);
    CHECK(h.base_version == 0);
  }
  SECTION("a body decoder refuses another message's attribute") {
    Rep rep;
    Mra mra;
    SidrRep sr;
    CHECK(decode(good, rep) == MadError::UnknownAttr);
    CHECK(decode(good, mra) == MadError::UnknownAttr);
    CHECK(decode(good, sr) == MadError::UnknownAttr);
    CHECK(decode(enc(samples::rep()), r) == MadError::UnknownAttr);
  }
  SECTION("impossible lengths") {
    Mad b = enc(samples::rej());
    b[kMadHdrSize + 9] = 73 << 1;  // ARI length 73 > 72
    Rej rej;
    CHECK(decode(b, rej) == MadError::BadField);
    b[kMadHdrSize + 9] = 72 << 1;
    CHECK(decode(b, rej) == MadError::None);
    CHECK(rej.ari_length == 72);

    Mad s = enc(samples::sidr_rep());
    s[kMadHdrSize + 5] = 73;
    SidrRep sr;
    CHECK(decode(s, sr) == MadError::BadField);
  }
  SECTION("the encoder never writes an impossible length") {
    Rej rej = samples::rej();
    rej.ari_length = 127;
    Rej back;
    REQUIRE(decode(enc(rej), back) == MadError::None);
    CHECK(back.ari_length == 72);
    SidrRep sr = samples::sidr_rep();
    sr.add_info_length = 200;
    SidrRep sback;
    REQUIRE(decode(enc(sr), sback) == MadError::None);
    CHECK(sback.add_info_length == 72);
  }
  SECTION("longer input: the first 256 bytes are the MAD") {
    std::vector<uint8_t> v(good.begin(), good.end());
    v.resize(300, 0xAA);
    REQUIRE(decode(v, r) == MadError::None);
    CHECK(r == samples::req());
  }
}

TEST_CASE("names", "[cm][mad]") {
  CHECK(std::string(attr_name(Attr::Req)) == "REQ");
  CHECK(std::string(attr_name(Attr::SidrRep)) == "SIDR_REP");
  CHECK(std::string(attr_name(static_cast<Attr>(0x99))) == "unknown");
  for (int e = 0; e <= static_cast<int>(MadError::BadField); ++e)
    CHECK(std::string(mad_error_name(static_cast<MadError>(e))) != "unknown");
  CHECK(std::string(mad_error_name(MadError::Short)) == "short");
}

TEST_CASE("random input never crashes; what decodes re-encodes to the same message", "[cm][mad]") {
  std::mt19937_64 rng(0xC0FFEE);
  size_t decoded = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    // Heap buffers of the exact size: ASan sees any read past the end.
    const size_t n = iter % 10 == 0 ? rng() % 300 : kMadSize + rng() % 4;
    std::vector<uint8_t> v(n);
    for (auto& x : v) x = static_cast<uint8_t>(rng());
    if (n >= 18 && iter % 2 == 0) {  // half: a valid header, so the body decoders run
      v[0] = 1;
      v[1] = kMgmtClassCm;
      v[2] = kCmClassVersion;
      v[3] = kMethodSend;
      v[16] = 0;
      v[17] = static_cast<uint8_t>(0x10 + rng() % 9);
    }
    MadHdr h;
    (void)decode_hdr(v, h);
    auto check = [&](auto m) {
      if (decode(v, m) != MadError::None) return;
      ++decoded;
      decltype(m) back;
      Mad out;
      encode(out, 1, m);
      REQUIRE(decode(out, back) == MadError::None);
      CHECK(back == m);
    };
    check(Req{});
    check(Mra{});
    check(Rej{});
    check(Rep{});
    check(Rtu{});
    check(Dreq{});
    check(Drep{});
    check(SidrReq{});
    check(SidrRep{});
  }
  CHECK(decoded > 5000);
}

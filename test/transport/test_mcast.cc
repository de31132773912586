// UD multicast (Engine::attach_mcast/detach_mcast): frames to QPN 0xFFFFFF
// fan out to the QPs attached to their destination address, Q_Key checked;
// UD sends to a group address go to the group's MAC. Steps read "Receive ...
// Expect ...".
#include <catch2/catch.hpp>

#include "harness.h"
#include "raw_peer.h"

using namespace droce;
using namespace droce::test;

namespace {

const wire::Gid kGroup = wire::gid_from_ipv4(0xEF010101u);  // 239.1.1.1

// A second UD QP on the DUT, at RTS with Q_Key qkey.
uint32_t ud_qp(Proto& p, uint32_t qkey) {
  QpInitAttr init;
  init.qp_type = QpType::UD;
  init.pd = p.dut.pd.handle;
  init.send_cq = p.dut.scq;
  init.recv_cq = p.dut.rcq;
  uint32_t qpn = 0;
  REQUIRE(p.dut.eng->create_qp(init, &qpn) == 0);
  QpAttr a;
  a.qp_state = QpState::Init;
  a.qkey = qkey;
  REQUIRE(p.dut.eng->modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpQkey) == 0);
  a.qp_state = QpState::Rtr;
  REQUIRE(p.dut.eng->modify_qp(qpn, a, kQpState) == 0);
  a.qp_state = QpState::Rts;
  REQUIRE(p.dut.eng->modify_qp(qpn, a, kQpState | kQpSqPsn) == 0);
  return qpn;
}

wire::Headers to_group(const Proto& p, uint32_t qkey, uint32_t sqpn = 0x99) {
  auto h = p.hdr(wire::op::UD_SEND_ONLY, 7, false);
  // l2.dst stays the DUT's MAC: memlink delivers by MAC, and the engine does
  // not look at it (the dataplane's classifier does, lib/engine).
  h.l3.dst = kGroup;
  h.bth.dqpn = wire::kMcastQpn;
  h.ext.deth = {qkey, 0, sqpn};
  return h;
}

}  // namespace

TEST_CASE("mcast: group addresses and their MACs", "[mcast]") {
  CHECK(wire::gid_is_multicast(kGroup));
  CHECK(wire::gid_is_multicast(wire::gid_from_ipv4(0xE0000001u)));
  CHECK_FALSE(wire::gid_is_multicast(wire::gid_from_ipv4(0xF0000001u)));  // 240/4: not multicast
  CHECK_FALSE(wire::gid_is_multicast(gid_of(0)));
  wire::Gid v6{};
  v6[0] = 0xFF;
  v6[1] = 0x0E;
  v6[12] = 0x12;
  v6[13] = 0x34;
  v6[14] = 0x56;
  v6[15] = 0x78;
  CHECK(wire::gid_is_multicast(v6));
  CHECK(wire::multicast_mac(v6) == wire::MacAddr{0x33, 0x33, 0x12, 0x34, 0x56, 0x78});
  // 239.129.1.1: only the low 23 bits (RFC 1112).
  CHECK(wire::multicast_mac(wire::gid_from_ipv4(0xEF810101u)) == wire::MacAddr{0x01, 0x00, 0x5E, 0x01, 0x01, 0x01});
  CHECK(wire::multicast_mac(kGroup) == wire::MacAddr{0x01, 0x00, 0x5E, 0x01, 0x01, 0x01});
}

TEST_CASE("mcast: fan-out to attached QPs with Q_Key mismatch dropped and detach", "[mcast]") {
  const uint32_t qkey = QpOpts{}.qkey;
  Proto p(QpType::UD);
  const uint32_t q2 = ud_qp(p, qkey);
  const uint32_t q3 = ud_qp(p, 0x01234567);  // attached too, another Q_Key
  auto& rb = p.dut.buffer(3 * 4096);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(1, rb, 0, 4096)) == 0);
  REQUIRE(p.dut.eng->post_recv(q2, make_recv(2, rb, 4096, 4096)) == 0);
  REQUIRE(p.dut.eng->post_recv(q3, make_recv(3, rb, 8192, 4096)) == 0);
  // Bad attaches: not multicast, QP1-less unknown QPN, not a UD QP.
  CHECK(p.dut.eng->attach_mcast(p.qpn, gid_of(3)) == EINVAL);
  CHECK(p.dut.eng->attach_mcast(4095, kGroup) == EINVAL);
  REQUIRE(p.dut.eng->attach_mcast(p.qpn, kGroup) == 0);
  REQUIRE(p.dut.eng->attach_mcast(p.qpn, kGroup) == 0);  // twice: still one member
  REQUIRE(p.dut.eng->attach_mcast(q2, kGroup) == 0);
  REQUIRE(p.dut.eng->attach_mcast(q3, kGroup) == 0);
  CHECK(p.dut.eng->mcast_members(kGroup) == 3);

  // Receive one datagram to 239.1.1.1 with the first two QPs' Q_Key. Expect one copy each, the
  // third QP's Q_Key mismatch dropped and counted.
  std::vector<uint8_t> data(100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i + 3);
  p.send(to_group(p, qkey), data);
  p.run();
  auto wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 2);
  for (const auto& wc : wcs) {
    CHECK(wc.status == WcStatus::Success);
    CHECK(wc.byte_len == 140);
    CHECK(wc.src_qp == 0x99);
    CHECK((wc.wr_id == 1 || wc.wr_id == 2));
  }
  CHECK(wcs[0].wr_id != wcs[1].wr_id);
  CHECK(std::memcmp(rb.mem.data() + 40, data.data(), data.size()) == 0);
  CHECK(std::memcmp(rb.mem.data() + 4096 + 40, data.data(), data.size()) == 0);
  CHECK(rb.mem[8192 + 40] == 0);  // nothing placed for the third QP
  CHECK(rb.mem[36] == 0xEF);      // the GRH (IPv4 header in its last 20 bytes): destination 239.1.1.1
  CHECK(p.dut.eng->counter(Ctr::RxMcast) == 1);
  CHECK(p.dut.eng->counter(Ctr::McastDelivered) == 3);
  CHECK(p.dut.eng->counter(Ctr::UdQkeyDrop) == 1);

  // Another group nobody joined, and a unicast address with QPN 0xFFFFFF: counted drops.
  auto other = to_group(p, qkey);
  other.l3.dst = wire::gid_from_ipv4(0xEF020202u);
  p.send(other, data);
  auto uni = to_group(p, qkey);
  uni.l3.dst = gid_of(0);
  p.send(uni, data);
  p.run();
  CHECK(p.dut.drain(p.dut.rcq).empty());
  CHECK(p.dut.eng->counter(Ctr::RxMcastNoGroup) == 2);
  CHECK(p.dut.eng->counter(Ctr::RxNoQp) == 0);

  // Detach the first QP: the next datagram reaches the second one only.
  REQUIRE(p.dut.eng->detach_mcast(p.qpn, kGroup) == 0);
  CHECK(p.dut.eng->detach_mcast(p.qpn, kGroup) == EINVAL);
  CHECK(p.dut.eng->mcast_members(kGroup) == 2);
  REQUIRE(p.dut.eng->post_recv(q2, make_recv(4, rb, 4096, 4096)) == 0);
  p.send(to_group(p, qkey), data);
  p.run();
  wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].wr_id == 4);
  CHECK(wcs[0].qp_num == q2);
  // Destroying a QP leaves its groups; the last member's leave frees the group.
  REQUIRE(p.dut.eng->destroy_qp(q3) == 0);
  CHECK(p.dut.eng->mcast_members(kGroup) == 1);
  REQUIRE(p.dut.eng->detach_mcast(q2, kGroup) == 0);
  CHECK(p.dut.eng->mcast_members(kGroup) == 0);
  p.send(to_group(p, qkey), data);
  p.run();
  CHECK(p.dut.drain(p.dut.rcq).empty());
  CHECK(p.dut.eng->counter(Ctr::RxMcastNoGroup) == 3);
}

TEST_CASE("mcast: bounded group table", "[mcast]") {
  EngineConfig cfg;
  cfg.max_mcast_groups = 2;
  cfg.max_mcast_qps_per_group = 1;
  Proto p(QpType::UD, {}, cfg);
  const uint32_t q2 = ud_qp(p, 1);
  REQUIRE(p.dut.eng->attach_mcast(p.qpn, kGroup) == 0);
  CHECK(p.dut.eng->attach_mcast(q2, kGroup) == ENOMEM);  // group full
  REQUIRE(p.dut.eng->attach_mcast(p.qpn, wire::gid_from_ipv4(0xEF000002u)) == 0);
  CHECK(p.dut.eng->attach_mcast(p.qpn, wire::gid_from_ipv4(0xEF000003u)) == ENOMEM);  // no group slot
  REQUIRE(p.dut.eng->detach_mcast(p.qpn, kGroup) == 0);
  CHECK(p.dut.eng->attach_mcast(q2, wire::gid_from_ipv4(0xEF000003u)) == 0);  // the slot is free again
}

TEST_CASE("mcast: a UD send to a group goes to its MAC with QPN 0xFFFFFF", "[mcast]") {
  Proto p(QpType::UD);
  Ah ah;
  ah.dgid = kGroup;
  ah.dmac = wire::multicast_mac(kGroup);
  const Ah* a = p.dut.eng->create_ah(p.dut.pd, ah);
  REQUIRE(a);
  // The peer port hears the group's MAC only when it is its own: a second port with that MAC.
  memlink::Port& member = p.link.add_port(wire::multicast_mac(kGroup));
  SendWr wr = make_wr(1, WrOpcode::Send, *p.mem, 0, 64);
  wr.ud = {a, wire::kMcastQpn, 0x01234567};
  REQUIRE(p.dut.eng->post_send(p.qpn, wr) == 0);
  p.run();
  io::PktBuf* b[4];
  const uint16_t n = member.rx_burst(b, 4);
  REQUIRE(n == 1);
  wire::PacketView v;
  std::vector<uint8_t> bytes(b[0]->data, b[0]->data + b[0]->len);
  member.free_burst(b, n);
  REQUIRE(wire::parse_frame(bytes, v) == wire::ParseError::Ok);
  CHECK(v.h.l2.dst == wire::multicast_mac(kGroup));
  CHECK(v.h.l3.dst == kGroup);
  CHECK(v.h.bth.dqpn == wire::kMcastQpn);
  CHECK(v.h.ext.deth.qkey == 0x01234567u);
  CHECK(v.h.ext.deth.sqpn == p.qpn);
}

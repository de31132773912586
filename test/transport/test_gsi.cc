// The GSI QP (QPN 1, Engine::create_gsi_qp): what the CM's MADs travel on.
#include <catch2/catch.hpp>

#include "harness.h"
#include "raw_peer.h"

namespace droce::test {
namespace {

constexpr uint32_t kMad = 256;

// QP1 of node n: created, INIT (Q_Key 0x80010000) -> RTR -> RTS.
uint32_t gsi_up(Node& n) {
  QpInitAttr init;
  init.qp_type = QpType::UD;
  init.pd = n.pd.handle;
  init.send_cq = n.scq;
  init.recv_cq = n.rcq;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 16;
  uint32_t qpn = 0;
  REQUIRE(n.eng->create_gsi_qp(init, &qpn) == 0);
  REQUIRE(qpn == kGsiQpn);
  QpAttr a;
  a.qp_state = QpState::Init;
  a.qkey = kGsiQkey;
  REQUIRE(n.eng->modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpQkey) == 0);
  a.qp_state = QpState::Rtr;
  REQUIRE(n.eng->modify_qp(qpn, a, kQpState) == 0);
  a.qp_state = QpState::Rts;
  a.sq_psn = 0;
  REQUIRE(n.eng->modify_qp(qpn, a, kQpState | kQpSqPsn) == 0);
  return qpn;
}

}  // namespace

TEST_CASE("gsi: a MAD-sized UD SEND between two QP1s arrives with its GRH and source QPN 1", "[gsi][ud]") {
  for (bool v6 : {false, true}) {
    INFO("ipv6 " << v6);
    World w(11, 2, {}, 4096, v6);
    Node& A = *w.node[0];
    Node& B = *w.node[1];
    gsi_up(A);
    gsi_up(B);
    auto& src = A.buffer(kMad);
    auto& dst = B.buffer(kGrhBytes + kMad);
    for (uint32_t i = 0; i < kMad; ++i) src.mem[i] = static_cast<uint8_t>(i * 3 + 1);
    REQUIRE(B.eng->post_recv(kGsiQpn, make_recv(9, dst, 0, kGrhBytes + kMad)) == 0);
    const Ah* ah = A.eng->create_ah(A.pd, B.ah());
    REQUIRE(ah);
    SendWr wr = make_wr(1, WrOpcode::Send, src, 0, kMad);
    wr.ud = {ah, kGsiQpn, kGsiQkey};
    w.link.record(true);
    REQUIRE(A.eng->post_send(kGsiQpn, wr) == 0);
    const std::vector<Wc> rwc = w.wait_wcs(B, B.rcq, 1);
    REQUIRE(!rwc.empty());
    REQUIRE(rwc.size() == 1);
    CHECK(rwc[0].status == WcStatus::Success);
    CHECK(rwc[0].wr_id == 9);
    CHECK(rwc[0].qp_num == kGsiQpn);
    CHECK(rwc[0].src_qp == kGsiQpn);
    CHECK(rwc[0].byte_len == kGrhBytes + kMad);
    CHECK((rwc[0].wc_flags & kWcGrh));
    CHECK(std::memcmp(dst.mem.data() + kGrhBytes, src.mem.data(), kMad) == 0);
    // The GRH: the sender's address where the Gsi reads it.
    const wire::Gid sa = A.ah().dgid;
    if (v6) {
      CHECK((dst.mem[0] >> 4) == 6);
      CHECK(std::memcmp(dst.mem.data() + 8, sa.data(), 16) == 0);
    } else {
      CHECK(dst.mem[20] == 0x45);
      CHECK(std::memcmp(dst.mem.data() + 20 + 12, sa.data() + 12, 4) == 0);
    }
    auto swc = A.drain(A.scq);
    REQUIRE(swc.size() == 1);
    CHECK(swc[0].status == WcStatus::Success);
    // On the wire: BTH dest QP 1, DETH Q_Key 0x80010000 and source QP 1.
    auto seen = parsed(w.link);
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].v.h.bth.opcode == wire::op::UD_SEND_ONLY);
    CHECK(seen[0].v.h.bth.dqpn == kGsiQpn);
    CHECK(seen[0].v.h.ext.deth.qkey == kGsiQkey);
    CHECK(seen[0].v.h.ext.deth.sqpn == kGsiQpn);
    CHECK(seen[0].v.payload_len == kMad);
  }
}

TEST_CASE("gsi: QP1 drops a wrong Q_Key and takes any source and exists once with a fixed Q_Key", "[gsi][ud]") {
  Proto p(QpType::UD);  // the DUT's ordinary UD QP is there too
  Node& d = p.dut;
  gsi_up(d);
  auto& rb = d.buffer(4096);
  std::vector<uint8_t> mad(kMad, 0x5A);
  auto h = p.hdr(wire::op::UD_SEND_ONLY, 3, false);
  h.bth.dqpn = kGsiQpn;
  // A stranger's MAD with the Q_Key of an ordinary UD QP: dropped and counted.
  h.ext.deth = {0x11111111, 0, 0x42};
  REQUIRE(d.eng->post_recv(kGsiQpn, make_recv(1, rb, 0, kGrhBytes + kMad)) == 0);
  p.send(h, mad);
  p.run();
  CHECK(d.drain(d.rcq).empty());
  CHECK(d.eng->counter(Ctr::UdQkeyDrop) == 1);
  // The right Q_Key from another address and QPN: delivered (no connection to check).
  h.ext.deth.qkey = kGsiQkey;
  h.l3.src = gid_of(7);
  p.send(h, mad);
  p.run();
  auto wcs = d.drain(d.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::Success);
  CHECK(wcs[0].src_qp == 0x42);
  CHECK(wcs[0].byte_len == kGrhBytes + kMad);
  CHECK(rb.mem[kGrhBytes] == 0x5A);
  CHECK(rb.mem[20 + 12 + 3] == gid_of(7)[15]);
  CHECK(d.eng->counter(Ctr::UdQkeyDrop) == 1);
  CHECK(d.eng->counter(Ctr::RxBadSrcAddr) == 0);
  // QP0 does not exist: a frame for it is counted as an unknown QP.
  const uint64_t noqp = d.eng->counter(Ctr::RxNoQp);
  h.bth.dqpn = 0;
  p.send(h, mad);
  p.run();
  CHECK(d.eng->counter(Ctr::RxNoQp) == noqp + 1);
  CHECK(d.drain(d.rcq).empty());

  // Only one QP1; only UD.
  QpInitAttr init;
  init.qp_type = QpType::UD;
  init.pd = d.pd.handle;
  init.send_cq = d.scq;
  init.recv_cq = d.rcq;
  init.cap.max_send_wr = 4;
  uint32_t qpn = 0;
  CHECK(d.eng->create_gsi_qp(init, &qpn) == EEXIST);
  // Its Q_Key is fixed.
  QpAttr a;
  a.qkey = 0x11111111;
  CHECK(d.eng->modify_qp(kGsiQpn, a, kQpQkey) == EINVAL);
  a.qkey = kGsiQkey;
  CHECK(d.eng->modify_qp(kGsiQpn, a, kQpQkey) == 0);
  CHECK(d.eng->qp(kGsiQpn)->attr.qkey == kGsiQkey);
  // Destroyed, it can be created again; never as RC.
  REQUIRE(d.eng->destroy_qp(kGsiQpn) == 0);
  init.qp_type = QpType::RC;
  CHECK(d.eng->create_gsi_qp(init, &qpn) == EINVAL);
  init.qp_type = QpType::UD;
  CHECK(d.eng->create_gsi_qp(init, &qpn) == 0);
  CHECK(qpn == kGsiQpn);
}

TEST_CASE("gsi: QP1 whatever the QPN partition and ordinary QPs never get 0 or 1", "[gsi]") {
  for (uint32_t offset : {0u, 1u}) {
    EngineConfig cfg;
    cfg.max_qps = 16;
    cfg.qpn_stride = 2;
    cfg.qpn_offset = offset;
    World w(3, 1, cfg);
    Node& n = *w.node[0];
    QpInitAttr init;
    init.qp_type = QpType::UD;
    init.pd = n.pd.handle;
    init.send_cq = n.scq;
    init.recv_cq = n.rcq;
    init.cap.max_send_wr = 4;
    uint32_t qpn = 0;
    REQUIRE(n.eng->create_gsi_qp(init, &qpn) == 0);
    CHECK(qpn == 1);
    std::vector<uint32_t> got;
    while (n.eng->create_qp(init, &qpn) == 0) got.push_back(qpn);
    CHECK(got.size() == 7);  // 16 QPNs, half of them ours, minus QP0/QP1
    for (uint32_t q : got) {
      CHECK(q >= 2);
      CHECK(q % 2 == offset);
    }
  }
}

}  // namespace droce::test

// Interop regressions found against Linux Soft-RoCE (scripts/interop.sh): each
// case reproduces on one engine + a raw memlink port what the wire showed.
#include <catch2/catch.hpp>

#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

wire::Gid gid6(std::initializer_list<uint8_t> head, uint8_t last) {
  wire::Gid g{};
  size_t i = 0;
  for (uint8_t b : head) g[i++] = b;
  g[15] = last;
  return g;
}
const wire::Gid kLl = gid6({0xFE, 0x80}, 1);             // fe80::1
const wire::Gid kGlobal = gid6({0x20, 0x01, 0x0D, 0xB8}, 1);  // 2001:db8::1

struct Rig {
  explicit Rig(EngineConfig cfg) : link(clock, 1, 256, 4096 + 256), dut(0, link, clock, cfg), peer(link.add_port(mac_of(1))) {
    mem = &dut.buffer(4096);
  }
  // An RC (or UD) QP at RTS towards dgid; returns its QPN.
  uint32_t qp_to(QpType t, const wire::Gid& dgid) {
    QpInitAttr init;
    init.qp_type = t;
    init.pd = dut.pd.handle;
    init.send_cq = dut.scq;
    init.recv_cq = dut.rcq;
    uint32_t qpn = 0;
    REQUIRE(dut.eng->create_qp(init, &qpn) == 0);
    QpAttr a;
    a.qp_state = QpState::Init;
    a.qkey = 0x11111111;
    a.qp_access_flags = kAccessLocalWrite;
    REQUIRE(dut.eng->modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | (t == QpType::UD ? kQpQkey : kQpAccessFlags)) == 0);
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::M1024;
    a.dest_qp_num = 0x77;
    a.rq_psn = 1;
    a.max_dest_rd_atomic = 1;
    a.ah_attr.dmac = mac_of(1);
    a.ah_attr.dgid = dgid;
    uint32_t m = kQpState;
    if (t == QpType::RC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
    REQUIRE(dut.eng->modify_qp(qpn, a, m) == 0);
    a.qp_state = QpState::Rts;
    a.sq_psn = 10;
    m = kQpState | kQpSqPsn;
    if (t == QpType::RC) m |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
    REQUIRE(dut.eng->modify_qp(qpn, a, m) == 0);
    return qpn;
  }
  // Post one 64-byte SEND and return the frame the engine put on the wire.
  wire::Headers send_one(uint32_t qpn, const wire::Gid& dgid, bool ud) {
    SendWr w;
    w.opcode = WrOpcode::Send;
    w.num_sge = 1;
    w.sg_list[0] = {mem->addr(), 64, mem->key};
    Ah ah;
    ah.dmac = mac_of(1);
    ah.dgid = dgid;
    if (ud) {
      w.ud.ah = &ah;
      w.ud.remote_qpn = 0x77;
      w.ud.remote_qkey = 0x11111111;
    }
    REQUIRE(dut.eng->post_send(qpn, w) == 0);
    for (int i = 0; i < 20; ++i) {
      dut.eng->poll();
      clock.advance(1000);
      io::PktBuf* b = nullptr;
      if (peer.rx_burst(&b, 1) == 1) {
        bytes.assign(b->data, b->data + b->len);
        peer.free_burst(&b, 1);
        wire::PacketView v;
        REQUIRE(wire::parse_frame(bytes, v) == wire::ParseError::Ok);
        return v.h;
      }
    }
    FAIL("the engine sent nothing");
    return {};
  }

  memlink::VirtualClock clock;
  memlink::Link link;
  Node dut;
  memlink::Port& peer;
  Node::Buf* mem = nullptr;
  std::vector<uint8_t> bytes;
};

}  // namespace

// Found against rxe: `ibv_rc_pingpong -g 0` (GID 0 = fe80:: link-local) to droce -g 0 got no
// answer: droce sent IPv6 packets with the IPv4-mapped source ::ffff:10.77.0.100; rxe checks the
// source against the QP's address vector and drops them (and ::ffff:0:0/96 must not appear as an
// IPv6 source on the wire, RFC 4291 2.5.5.2).
TEST_CASE("interop: the IPv6 source address follows the destination's family and scope", "[interop]") {
  EngineConfig cfg;
  cfg.gid6_link_local = kLl;
  cfg.gid6_global = kGlobal;
  Rig r(cfg);
  const wire::Gid v4 = gid_of(1), ll_peer = gid6({0xFE, 0x80}, 9), gl_peer = gid6({0x20, 0x01, 0x0D, 0xB8}, 9);

  auto h = r.send_one(r.qp_to(QpType::RC, ll_peer), ll_peer, false);
  CHECK(h.l3.ipv6);
  CHECK(h.l3.src == kLl);
  CHECK(h.l3.dst == ll_peer);

  h = r.send_one(r.qp_to(QpType::RC, gl_peer), gl_peer, false);
  CHECK(h.l3.ipv6);
  CHECK(h.l3.src == kGlobal);

  h = r.send_one(r.qp_to(QpType::RC, v4), v4, false);
  CHECK_FALSE(h.l3.ipv6);
  CHECK(h.l3.src == gid_of(0));

  // UD picks per work request.
  const uint32_t ud = r.qp_to(QpType::UD, v4);
  h = r.send_one(ud, ll_peer, true);
  CHECK(h.l3.ipv6);
  CHECK(h.l3.src == kLl);
  h = r.send_one(ud, v4, true);
  CHECK_FALSE(h.l3.ipv6);
  CHECK(h.l3.src == gid_of(0));
}

TEST_CASE("interop: without IPv6 addresses the configured GID stays the source", "[interop]") {
  Rig r(EngineConfig{});
  const wire::Gid ll_peer = gid6({0xFE, 0x80}, 9);
  auto h = r.send_one(r.qp_to(QpType::RC, ll_peer), ll_peer, false);
  CHECK(h.l3.src == gid_of(0));  // nothing better to use: unchanged behaviour
}

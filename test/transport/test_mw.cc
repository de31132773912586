// Memory windows through the transport (IBTA 10.6.7, 9.4.x): BIND_MW and
// LOCAL_INV work requests executed in SQ order, remote WRITE/READ through a
// window between two engines on a memlink, remote access errors (NAK, no
// memory access) after unbind / invalidation / dealloc and from a QP a type 2
// window is not bound to, SEND with Invalidate naming a window, and a window
// deallocated between the packets of a WRITE.
#include <catch2/catch.hpp>

#include <algorithm>

#include "harness.h"
#include "raw_peer.h"

using namespace droce;
using namespace droce::test;

namespace {

constexpr uint32_t kMrAccess = kAccessLocalWrite | kAccessMwBind;  // no remote rights of its own

SendWr bind_wr(uint64_t id, uint32_t mw_key, uint8_t key_byte, const Node::Buf& mr, uint64_t off, uint64_t len,
               uint32_t access, bool type1) {
  SendWr w;
  w.wr_id = id;
  w.opcode = WrOpcode::BindMw;
  w.send_flags = kSendSignaled;
  w.bind.mw_rkey = mw_key;
  w.bind.new_rkey = (mw_key & ~0xFFu) | key_byte;
  w.bind.mr_lkey = len ? mr.key : 0;
  w.bind.addr = len ? mr.addr() + off : 0;
  w.bind.length = len;
  w.bind.access = access;
  w.bind.type1 = type1;
  return w;
}

SendWr inv_wr(uint64_t id, uint32_t key) {
  SendWr w;
  w.wr_id = id;
  w.opcode = WrOpcode::LocalInv;
  w.send_flags = kSendSignaled;
  w.invalidate_rkey = key;
  return w;
}

SendWr remote_wr(uint64_t id, WrOpcode op, const Node::Buf& local, uint32_t len, uint64_t raddr, uint32_t rkey) {
  SendWr w = make_wr(id, op, local, 0, len);
  w.rdma.remote_addr = raddr;
  w.rdma.rkey = rkey;
  return w;
}

// Posts on node n's QP and runs until its send CQ has one completion; returns it.
Wc post_and_wait(World& w, Node& n, uint32_t qpn, const SendWr& wr) {
  REQUIRE(n.eng->post_send(qpn, wr) == 0);
  std::vector<Wc> got;
  REQUIRE(w.run([&] {
    auto v = n.drain(n.scq);
    got.insert(got.end(), v.begin(), v.end());
    return !got.empty();
  }));
  REQUIRE(got.size() == 1);
  return got[0];
}

bool all_eq(const std::vector<uint8_t>& v, size_t from, size_t to, uint8_t b) {
  return std::all_of(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to),
                     [b](uint8_t x) { return x == b; });
}

}  // namespace

TEST_CASE("mw: type 1 window WRITE and READ through it from any QP then unbind gives remote access error",
          "[mw]") {
  World w(11);
  Node& a = *w.node[0];
  Node& b = *w.node[1];
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  auto [qa2, qb2] = w.connect(0, 1, QpType::RC);
  auto [qa3, qb3] = w.connect(0, 1, QpType::RC);  // binds on qb3, traffic on qa2 -> qb2
  (void)qb;
  (void)qb2;
  (void)qa3;
  auto& target = b.buffer(1 << 16, kMrAccess);
  std::fill(target.mem.begin(), target.mem.end(), 0xEE);
  auto& src = a.buffer(8192);
  auto& back = a.buffer(8192);
  fill_random(src.mem, 5);
  uint32_t mw = 0;
  REQUIRE(b.eng->alloc_mw(b.pd, MwType::Type1, &mw) == 0);
  REQUIRE(is_mw_key(mw));
  // The MR gives no remote access by its own key (that connection goes to error).
  Wc wc = post_and_wait(w, a, qa, remote_wr(1, WrOpcode::RdmaWrite, src, 8, target.addr(), target.key));
  CHECK(wc.status == WcStatus::RemAccessErr);
  CHECK(all_eq(target.mem, 0, target.mem.size(), 0xEE));
  // Bind [4096, 4096 + 8192) with remote write + read (posted on qb3, like ibv_bind_mw).
  const uint8_t kb = static_cast<uint8_t>(mw + 1);
  wc = post_and_wait(w, b, qb3, bind_wr(2, mw, kb, target, 4096, 8192, kAccessRemoteWrite | kAccessRemoteRead, true));
  CHECK(wc.status == WcStatus::Success);
  CHECK(wc.opcode == WcOpcode::BindMw);
  const uint32_t rkey = (mw & ~0xFFu) | kb;
  // WRITE through the window on another connection (type 1: any QP of the PD), READ it back.
  wc = post_and_wait(w, a, qa2, remote_wr(3, WrOpcode::RdmaWrite, src, 8192, target.addr() + 4096, rkey));
  CHECK(wc.status == WcStatus::Success);
  CHECK(std::equal(src.mem.begin(), src.mem.end(), target.mem.begin() + 4096));
  CHECK(all_eq(target.mem, 0, 4096, 0xEE));
  CHECK(all_eq(target.mem, 4096 + 8192, target.mem.size(), 0xEE));
  wc = post_and_wait(w, a, qa2, remote_wr(4, WrOpcode::RdmaRead, back, 8192, target.addr() + 4096, rkey));
  CHECK(wc.status == WcStatus::Success);
  CHECK(back.mem == src.mem);
  // The old key (before the bind) is dead; the MR is busy while the window is bound.
  CHECK(b.eng->dereg_mr(target.key) == EBUSY);
  // Unbind by a zero-length bind: the next WRITE is NAKed, nothing is written.
  wc = post_and_wait(w, b, qb3, bind_wr(5, rkey, static_cast<uint8_t>(kb + 1), target, 0, 0, 0, true));
  CHECK(wc.status == WcStatus::Success);
  const uint64_t naks = b.eng->counter(Ctr::ErrNakSent);
  std::vector<uint8_t> before = target.mem;
  wc = post_and_wait(w, a, qa2, remote_wr(6, WrOpcode::RdmaWrite, back, 64, target.addr() + 4096, rkey));
  CHECK(wc.status == WcStatus::RemAccessErr);
  CHECK(b.eng->counter(Ctr::ErrNakSent) == naks + 1);
  CHECK(b.eng->counter(Ctr::RxBadRkey) >= 1);
  CHECK(target.mem == before);
  CHECK(b.eng->dereg_mr(target.key) == 0);  // no window bound any more
  CHECK(b.eng->dealloc_mw((mw & ~0xFFu) | static_cast<uint8_t>(kb + 1)) == 0);
}

TEST_CASE("mw: type 2 window bound to one QP and refused to others then LOCAL_INV and SEND with Invalidate and dealloc",
          "[mw]") {
  World w(12);
  Node& a = *w.node[0];
  Node& b = *w.node[1];
  auto& target = b.buffer(1 << 16, kMrAccess);
  std::fill(target.mem.begin(), target.mem.end(), 0xEE);
  auto& rbuf = b.buffer(256);
  auto& src = a.buffer(4096);
  auto& back = a.buffer(4096);
  fill_random(src.mem, 9);
  uint32_t mw = 0;
  REQUIRE(b.eng->alloc_mw(b.pd, MwType::Type2, &mw) == 0);
  const uint32_t rw = kAccessRemoteWrite | kAccessRemoteRead;
  auto bind_on = [&](uint32_t qpn, uint32_t cur, uint8_t kb) {
    Wc wc = post_and_wait(w, b, qpn, bind_wr(100 + kb, cur, kb, target, 0, 4096, rw, false));
    REQUIRE(wc.status == WcStatus::Success);
    REQUIRE(wc.opcode == WcOpcode::BindMw);
    return (cur & ~0xFFu) | kb;
  };
  // A refused WRITE: remote access error at the requester, one NAK counted by
  // the responder, memory untouched.
  auto refused = [&](uint32_t qa, uint32_t rkey, uint64_t off = 0, uint32_t len = 64) {
    const std::vector<uint8_t> before = target.mem;
    const uint64_t naks = b.eng->counter(Ctr::ErrNakSent);
    Wc wc = post_and_wait(w, a, qa, remote_wr(7, WrOpcode::RdmaWrite, src, len, target.addr() + off, rkey));
    CHECK(wc.status == WcStatus::RemAccessErr);
    CHECK(b.eng->counter(Ctr::ErrNakSent) == naks + 1);
    CHECK(target.mem == before);
  };
  // Bound to qb1: WRITE and READ through it on that connection.
  auto [qa1, qb1] = w.connect(0, 1, QpType::RC);
  auto [qa2, qb2] = w.connect(0, 1, QpType::RC);
  (void)qb2;
  uint32_t rkey = bind_on(qb1, mw, 0x31);
  Wc wc = post_and_wait(w, a, qa1, remote_wr(1, WrOpcode::RdmaWrite, src, 4096, target.addr(), rkey));
  CHECK(wc.status == WcStatus::Success);
  CHECK(std::equal(src.mem.begin(), src.mem.end(), target.mem.begin()));
  wc = post_and_wait(w, a, qa1, remote_wr(2, WrOpcode::RdmaRead, back, 4096, target.addr(), rkey));
  CHECK(wc.status == WcStatus::Success);
  CHECK(back.mem == src.mem);
  // A second bind while bound is refused (o10-37.2.30): MW_BIND_ERR, QP to error.
  {
    auto [qa3, qb3] = w.connect(0, 1, QpType::RC);
    (void)qa3;
    wc = post_and_wait(w, b, qb3, bind_wr(3, rkey, 0x32, target, 0, 64, rw, false));
    CHECK(wc.status == WcStatus::MwBindErr);
    CHECK(b.eng->qp(qb3)->state == QpState::Err);
  }
  // The same PD's other QP: remote access error, memory untouched.
  refused(qa2, rkey);
  // LOCAL_INV on qb1, then the key gives remote access errors.
  wc = post_and_wait(w, b, qb1, inv_wr(4, rkey));
  CHECK(wc.status == WcStatus::Success);
  CHECK(wc.opcode == WcOpcode::LocalInv);
  refused(qa1, rkey);
  // Rebound on a new connection, invalidated by the peer's SEND with Invalidate.
  auto [qa4, qb4] = w.connect(0, 1, QpType::RC);
  rkey = bind_on(qb4, rkey, 0x33);
  REQUIRE(b.eng->post_recv(qb4, make_recv(50, rbuf, 0, 256)) == 0);
  SendWr s = make_wr(5, WrOpcode::SendInv, src, 0, 16);
  s.invalidate_rkey = rkey;
  wc = post_and_wait(w, a, qa4, s);
  CHECK(wc.status == WcStatus::Success);
  auto rwc = b.drain(b.rcq);
  REQUIRE(rwc.size() == 1);
  CHECK(rwc[0].status == WcStatus::Success);
  CHECK((rwc[0].wc_flags & kWcWithInv) != 0);
  CHECK(rwc[0].imm_data == rkey);
  CHECK(b.eng->mws().find(rkey)->state == MwState::Unbound);
  refused(qa4, rkey);
  // A SEND with Invalidate naming an invalid window: NAK invalid request (REM_INV_REQ_ERR).
  {
    auto [qa5, qb5] = w.connect(0, 1, QpType::RC);
    REQUIRE(b.eng->post_recv(qb5, make_recv(51, rbuf, 0, 256)) == 0);
    SendWr s2 = make_wr(6, WrOpcode::SendInv, src, 0, 16);
    s2.invalidate_rkey = rkey;
    wc = post_and_wait(w, a, qa5, s2);
    CHECK(wc.status == WcStatus::RemInvReqErr);
  }
  // Outside the range: a second window over [4096, 8192) of the MR, bound on
  // a connection of its own; a WRITE inside it lands, then one below it (k 0)
  // or one running 32 bytes past its end (k 1) is refused although the MR
  // covers it. Each refusal ends its connection, so each k has its own.
  for (int k = 0; k < 2; k++) {
    CAPTURE(k);
    uint32_t mw2 = 0;
    REQUIRE(b.eng->alloc_mw(b.pd, MwType::Type2, &mw2) == 0);
    auto [qa7, qb7] = w.connect(0, 1, QpType::RC);
    wc = post_and_wait(w, b, qb7, bind_wr(60, mw2, 0x40, target, 4096, 4096, rw, false));
    REQUIRE(wc.status == WcStatus::Success);
    mw2 = (mw2 & ~0xFFu) | 0x40;
    wc = post_and_wait(w, a, qa7, remote_wr(61, WrOpcode::RdmaWrite, src, 64, target.addr() + 8192 - 64, mw2));
    CHECK(wc.status == WcStatus::Success);
    CHECK(std::equal(src.mem.begin(), src.mem.begin() + 64, target.mem.begin() + 8192 - 64));
    refused(qa7, mw2, k == 0 ? 4096 - 64 : 8192 - 32);
    CHECK(b.eng->dealloc_mw(mw2) == 0);
  }
  // Bound again; dereg of its MR is refused; dealloc kills the key; then dereg works.
  auto [qa6, qb6] = w.connect(0, 1, QpType::RC);
  rkey = bind_on(qb6, rkey, 0x34);
  CHECK(b.eng->dereg_mr(target.key) == EBUSY);
  CHECK(b.eng->dealloc_mw(rkey) == 0);
  refused(qa6, rkey);
  CHECK(b.eng->dereg_mr(target.key) == 0);
}

TEST_CASE("mw: bind and LOCAL_INV complete in SQ order behind unacknowledged WRITEs and a failure flushes the rest",
          "[mw]") {
  World w(13);
  Node& a = *w.node[0];
  Node& b = *w.node[1];
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  (void)qb;
  auto& remote = b.buffer(1 << 16);
  auto& src = a.buffer(1 << 16);
  auto& own = a.buffer(4096, kMrAccess);
  fill_random(src.mem, 3);
  uint32_t mw = 0;
  REQUIRE(a.eng->alloc_mw(a.pd, MwType::Type2, &mw) == 0);
  const uint32_t k1 = (mw & ~0xFFu) | 0x51;
  REQUIRE(a.eng->post_send(qa, remote_wr(1, WrOpcode::RdmaWrite, src, 1 << 16, remote.addr(), remote.key)) == 0);
  REQUIRE(a.eng->post_send(qa, bind_wr(2, mw, 0x51, own, 0, 4096, kAccessRemoteRead, false)) == 0);
  REQUIRE(a.eng->post_send(qa, inv_wr(3, k1)) == 0);
  REQUIRE(a.eng->post_send(qa, remote_wr(4, WrOpcode::RdmaWrite, src, 64, remote.addr(), remote.key)) == 0);
  REQUIRE(a.eng->post_send(qa, inv_wr(5, k1)) == 0);  // already invalid: LOC_QP_OP_ERR
  REQUIRE(a.eng->post_send(qa, remote_wr(6, WrOpcode::RdmaWrite, src, 64, remote.addr() + 64, remote.key)) == 0);
  // One poll of the sender: the bind and LOCAL_INV ran, but the WRITE before them is
  // not acknowledged, so nothing has completed yet.
  a.eng->poll();
  CHECK(a.scq->pending() == 0);
  std::vector<Wc> got;
  REQUIRE(w.run([&] {
    auto v = a.drain(a.scq);
    got.insert(got.end(), v.begin(), v.end());
    return got.size() >= 6;
  }));
  REQUIRE(got.size() == 6);
  const uint64_t ids[] = {1, 2, 3, 4, 5, 6};
  const WcOpcode ops[] = {WcOpcode::RdmaWrite, WcOpcode::BindMw, WcOpcode::LocalInv,
                          WcOpcode::RdmaWrite, WcOpcode::LocalInv, WcOpcode::RdmaWrite};
  const WcStatus st[] = {WcStatus::Success, WcStatus::Success, WcStatus::Success,
                         WcStatus::Success, WcStatus::LocQpOpErr, WcStatus::WrFlushErr};
  for (int i = 0; i < 6; ++i) {
    INFO(i);
    CHECK(got[i].wr_id == ids[i]);
    CHECK(got[i].opcode == ops[i]);
    CHECK(got[i].status == st[i]);
  }
  CHECK(std::equal(src.mem.begin(), src.mem.end(), remote.mem.begin()));
  CHECK(all_eq(remote.mem, 64 + 0, 64, 0));  // the flushed WRITE (offset 64) was never sent
  CHECK(a.eng->qp(qa)->state == QpState::Err);
  // A BIND_MW on UD is refused at post time; a type 1 window by a BIND_MW WR fails the WR.
  uint32_t t1 = 0;
  REQUIRE(a.eng->alloc_mw(a.pd, MwType::Type1, &t1) == 0);
  auto [qa2, qb2] = w.connect(0, 1, QpType::RC);
  (void)qb2;
  Wc wc = post_and_wait(w, a, qa2, bind_wr(7, t1, 1, own, 0, 64, kAccessRemoteRead, false));
  CHECK(wc.status == WcStatus::MwBindErr);
  const uint32_t ud = w.create_qp(a, QpType::UD, {}, nullptr);
  QpOpts o;
  REQUIRE(w.to_rts(a, ud, QpType::UD, o, b, 0, 0, 0) == 0);
  CHECK(a.eng->post_send(ud, bind_wr(8, t1, 1, own, 0, 64, kAccessRemoteRead, true)) == EINVAL);
}

TEST_CASE("mw: a window deallocated between the packets of a WRITE is never written", "[mw][hardening]") {
  Proto d;
  const uint32_t mtu = 1024;
  auto& target = d.dut.buffer(4 * mtu, kMrAccess);
  std::fill(target.mem.begin(), target.mem.end(), 0xEE);
  uint32_t mw = 0;
  REQUIRE(d.dut.eng->alloc_mw(d.dut.pd, MwType::Type2, &mw) == 0);
  REQUIRE(d.dut.eng->post_send(d.qpn, bind_wr(1, mw, 0x77, target, 0, 4 * mtu, kAccessRemoteWrite, false)) == 0);
  d.run();
  auto wcs = d.dut.drain(d.dut.scq);
  REQUIRE(wcs.size() == 1);
  REQUIRE(wcs[0].status == WcStatus::Success);
  const uint32_t rkey = (mw & ~0xFFu) | 0x77;
  std::vector<uint8_t> data(mtu, 0x5A);
  auto f = d.hdr(wire::op::RC_WRITE_FIRST, kRqPsn, false);
  f.ext.reth = {target.addr(), rkey, 3 * mtu};
  d.send(f, data);
  d.run();
  REQUIRE(target.mem[0] == 0x5A);
  REQUIRE(d.dut.eng->dealloc_mw(rkey) == 0);
  REQUIRE(d.dut.eng->dereg_mr(target.key) == 0);  // the window no longer holds it
  std::fill(target.mem.begin(), target.mem.end(), 0xEE);
  d.send(d.hdr(wire::op::RC_WRITE_MIDDLE, kRqPsn + 1, false), data);
  d.send(d.hdr(wire::op::RC_WRITE_LAST, kRqPsn + 2), data);
  auto out = d.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakRemoteAccessError));
  CHECK(out[0].v.h.bth.psn == kRqPsn + 1);
  CHECK(d.q().state == QpState::Err);
  CHECK(d.dut.eng->counter(Ctr::RespMrGone) == 1);
  CHECK(all_eq(target.mem, 0, target.mem.size(), 0xEE));
}

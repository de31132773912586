// Hardening tests (issue 9): a peer, a stranger on the network or the local
// owner of an MR cannot make the engine touch memory that is not (or no longer)
// registered, inject into a connection, or invalidate what the spec protects.
// The DUT is one engine on a memlink; a raw port plays the peer (as in
// test_protocol.cc), or two engines talk through the harness.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "harness.h"
#include "raw_peer.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DROCE_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DROCE_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DROCE_POISON(p, n) ((void)(p), (void)(n))
#define DROCE_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

using namespace droce;
using namespace droce::test;

namespace {
uint8_t syn(const Frame& f) { return f.v.h.ext.aeth.syndrome; }
using Dut = Proto;  // the DUT engine with a raw peer port (raw_peer.h)
}  // namespace

TEST_CASE("hardening: a stranger's packets never reach a connection", "[hardening]") {
  Dut d;
  auto& target = d.dut.buffer(4096);
  std::vector<uint8_t> data(64, 0xAB);
  // Receive a WRITE at the expected PSN and one far ahead (which the QP would NAK as a
  // sequence error) from an address the QP never talked to, and one from its peer's
  // address sent to another of the node's addresses. Expect nothing sent, nothing
  // written, each counted, the QP untouched.
  for (uint32_t psn : {kRqPsn, kRqPsn + 5}) {
    auto w = d.hdr(wire::op::RC_WRITE_ONLY, psn);
    w.l3.src = gid_of(7);
    w.ext.reth = {target.addr(), target.key, 64};
    d.send(w, data);
  }
  auto w = d.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
  w.l3.dst = gid_of(9);
  w.ext.reth = {target.addr(), target.key, 64};
  d.send(w, data);
  // The peer's addresses, IPv4-mapped, in an IPv6 packet: another IP version
  // than the path's is not the peer either (rxe check_addr compares per family).
  w = d.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
  w.l3.ipv6 = true;
  w.ext.reth = {target.addr(), target.key, 64};
  d.send(w, data);
  auto out = d.run();
  CHECK(out.empty());
  CHECK(d.dut.eng->counter(Ctr::RxBadSrcAddr) == 4);
  CHECK(d.q().state == QpState::Rts);
  CHECK(d.q().resp.psn == kRqPsn);
  CHECK(d.q().ctr.rx_packets == 0);
  CHECK(std::all_of(target.mem.begin(), target.mem.end(), [](uint8_t b) { return b == 0; }));
  // The peer's own WRITE at the same PSN is placed and acknowledged.
  w = d.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
  w.ext.reth = {target.addr(), target.key, 64};
  d.send(w, data);
  out = d.run();
  REQUIRE(out.size() == 1);
  CHECK(syn(out[0]) == (wire::kAethAck | wire::kAethCreditInvalid));
  CHECK(target.mem[0] == 0xAB);
}

TEST_CASE("hardening: a UC connection ignores strangers too", "[hardening]") {
  Dut d(QpType::UC);
  auto& target = d.dut.buffer(4096);
  std::vector<uint8_t> data(64, 0xCD);
  auto w = d.hdr(static_cast<uint8_t>(wire::op::UC_BASE + wire::op::RC_WRITE_ONLY), kRqPsn + 77, false);
  w.l3.src = gid_of(7);
  w.ext.reth = {target.addr(), target.key, 64};
  d.send(w, data);
  d.run();
  CHECK(d.dut.eng->counter(Ctr::RxBadSrcAddr) == 1);
  CHECK(d.q().resp.psn == kRqPsn);  // no resync on a stranger's PSN
  CHECK(target.mem[0] == 0);
}

TEST_CASE("hardening: an MR deregistered between the packets of a WRITE is never written", "[hardening]") {
  Dut d;
  const uint32_t mtu = 1024;
  auto& target = d.dut.buffer(4 * mtu);
  std::vector<uint8_t> data(mtu, 0x5A);
  // Receive WRITE FIRST (3 packets announced). Expect it placed.
  auto f = d.hdr(wire::op::RC_WRITE_FIRST, kRqPsn, false);
  f.ext.reth = {target.addr(), target.key, 3 * mtu};
  d.send(f, data);
  d.run();
  REQUIRE(target.mem[0] == 0x5A);
  // The owner deregisters the MR (and may unmap it at once).
  REQUIRE(d.dut.eng->dereg_mr(target.key) == 0);
  std::fill(target.mem.begin(), target.mem.end(), 0xEE);
  DROCE_POISON(target.mem.data(), target.mem.size());
  // Receive MIDDLE and LAST. Expect NAK remote access error at the MIDDLE's PSN,
  // the QP in error, the memory untouched.
  d.send(d.hdr(wire::op::RC_WRITE_MIDDLE, kRqPsn + 1, false), data);
  d.send(d.hdr(wire::op::RC_WRITE_LAST, kRqPsn + 2), data);
  auto out = d.run();
  DROCE_UNPOISON(target.mem.data(), target.mem.size());
  REQUIRE(out.size() == 1);
  CHECK(syn(out[0]) == (wire::kAethNak | wire::kNakRemoteAccessError));
  CHECK(out[0].v.h.bth.psn == kRqPsn + 1);
  CHECK(d.q().state == QpState::Err);
  CHECK(d.dut.eng->counter(Ctr::RespMrGone) == 1);
  CHECK(std::all_of(target.mem.begin(), target.mem.end(), [](uint8_t b) { return b == 0xEE; }));
}

TEST_CASE("hardening: an MR deregistered while a READ is answered is never read", "[hardening]") {
  EngineConfig cfg;
  cfg.pkts_per_turn = 4;  // responses go out four per poll
  Dut d(QpType::RC, {}, cfg);
  const uint32_t mtu = 1024, npkts = 32;
  auto& source = d.dut.buffer(npkts * mtu);
  fill_random(source.mem, 3);
  auto r = d.hdr(wire::op::RC_READ_REQUEST, kRqPsn);
  r.ext.reth = {source.addr(), source.key, npkts * mtu};
  d.send(r);
  // Poll until some responses are out, not all.
  std::vector<Frame> first;
  for (int i = 0; i < 100 && first.size() < 4; ++i) {
    auto o = d.run(0, 1);
    first.insert(first.end(), std::make_move_iterator(o.begin()), std::make_move_iterator(o.end()));
    d.clock.advance(500);
  }
  REQUIRE(first.size() >= 4);
  REQUIRE(first.size() < npkts);
  const uint32_t sent = static_cast<uint32_t>(first.size());
  REQUIRE(d.dut.eng->dereg_mr(source.key) == 0);
  DROCE_POISON(source.mem.data(), source.mem.size());
  auto out = d.run(20000);
  DROCE_UNPOISON(source.mem.data(), source.mem.size());
  // Expect no response packet after the dereg, then NAK remote access error for the
  // first PSN not answered, and the QP in error.
  REQUIRE(!out.empty());
  for (size_t i = 0; i + 1 < out.size(); ++i) CHECK(out[i].v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
  CHECK(out.back().v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
  CHECK(syn(out.back()) == (wire::kAethNak | wire::kNakRemoteAccessError));
  CHECK(out.back().v.h.bth.psn == kRqPsn + sent);
  CHECK(d.q().state == QpState::Err);
  CHECK(d.dut.eng->counter(Ctr::RespMrGone) == 1);
  CHECK(d.dut.eng->counter(Ctr::ReadRespSent) == sent);
}

TEST_CASE("hardening: READ responses carry the MSN of their request", "[hardening]") {
  Dut d;
  auto& mem = d.dut.buffer(8192);
  auto& rb = d.dut.buffer(4096);
  REQUIRE(d.dut.eng->post_recv(d.qpn, make_recv(1, rb, 0, 4096)) == 0);
  // Receive in one burst a 4-packet READ (message 1) and a SEND (message 2): the
  // SEND completes before the READ's responses go out.
  auto r = d.hdr(wire::op::RC_READ_REQUEST, kRqPsn);
  r.ext.reth = {mem.addr(), mem.key, 4096};
  d.send(r);
  std::vector<uint8_t> data(16, 1);
  d.send(d.hdr(wire::op::RC_SEND_ONLY, kRqPsn + 4), data);
  auto out = d.run();
  int responses = 0;
  for (auto& f : out) {
    if (f.v.h.bth.opcode == wire::op::RC_READ_RESPONSE_FIRST || f.v.h.bth.opcode == wire::op::RC_READ_RESPONSE_LAST) {
      CHECK(f.v.h.ext.aeth.msn == 1);
      ++responses;
    }
    if (f.v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE) CHECK(f.v.h.ext.aeth.msn == 2);
  }
  CHECK(responses == 2);
}

TEST_CASE("hardening: SEND with Invalidate only invalidates a fast-registered MR", "[hardening]") {
  std::vector<uint8_t> data(16, 1);
  {
    INFO("an ordinary MR");
    Dut d;
    auto& rb = d.dut.buffer(4096);
    auto& plain = d.dut.buffer(4096);
    REQUIRE(d.dut.eng->post_recv(d.qpn, make_recv(1, rb, 0, 4096)) == 0);
    auto s = d.hdr(wire::op::RC_SEND_ONLY_INV, kRqPsn);
    s.ext.ieth_rkey = plain.key;
    d.send(s, data);
    auto out = d.run();
    REQUIRE(out.size() == 1);
    CHECK(syn(out[0]) == (wire::kAethNak | wire::kNakInvalidRequest));
    CHECK(out[0].v.h.bth.psn == kRqPsn);
    CHECK(out[0].v.h.ext.aeth.msn == 0);  // the rejected request did not count
    CHECK(d.q().resp.psn == kRqPsn);
    CHECK(mr_valid(d.dut, plain));
    auto wcs = d.dut.drain(d.dut.rcq);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == WcStatus::RemInvReqErr);
    CHECK(d.q().state == QpState::Err);
  }
  {
    INFO("a fast-registered MR");
    Dut d;
    auto& rb = d.dut.buffer(4096);
    auto& frmr = d.dut.buffer(4096, kAccessAll | kMrRemoteInvalidate);
    REQUIRE(d.dut.eng->post_recv(d.qpn, make_recv(1, rb, 0, 4096)) == 0);
    auto s = d.hdr(wire::op::RC_SEND_ONLY_INV, kRqPsn);
    s.ext.ieth_rkey = frmr.key;
    d.send(s, data);
    auto out = d.run();
    REQUIRE(out.size() == 1);
    CHECK(syn(out[0]) == (wire::kAethAck | wire::kAethCreditInvalid));
    CHECK(out[0].v.h.ext.aeth.msn == 1);
    CHECK(mr_invalidated(d.dut, frmr));
    auto wcs = d.dut.drain(d.dut.rcq);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].status == WcStatus::Success);
    CHECK((wcs[0].wc_flags & kWcWithInv) != 0);
    CHECK(wcs[0].imm_data == frmr.key);
  }
}

TEST_CASE("hardening: modify_qp refuses a path MTU larger than the link carries", "[hardening]") {
  CHECK(max_mtu_for_link(1500) == Mtu::M1024);
  CHECK(max_mtu_for_link(2200) == Mtu::M2048);
  CHECK(max_mtu_for_link(9000) == Mtu::M4096);
  CHECK(max_mtu_for_link(576) == Mtu::M256);
  EngineConfig cfg;
  cfg.max_mtu = max_mtu_for_link(1500);
  World w(1, 2, cfg);
  QpOpts o;
  Node& a = *w.node[0];
  const uint32_t q = w.create_qp(a, QpType::RC, o, nullptr);
  o.mtu = Mtu::M4096;
  CHECK(w.to_rts(a, q, QpType::RC, o, *w.node[1], 0x99, 1, 1) == EINVAL);
  CHECK(a.eng->qp(q)->state == QpState::Init);
  o.mtu = Mtu::M1024;
  CHECK(w.to_rts(a, q, QpType::RC, o, *w.node[1], 0x99, 1, 1) == 0);
}

TEST_CASE("hardening: QPNs do not come in a predictable sequence", "[hardening]") {
  EngineConfig cfg;
  cfg.max_qps = 4096;
  World w(1, 1, cfg);
  Node& n = *w.node[0];
  std::vector<uint32_t> qpns;
  for (int i = 0; i < 32; ++i) qpns.push_back(w.create_qp(n, QpType::RC, {}, nullptr));
  int sequential = 0;
  for (size_t i = 1; i < qpns.size(); ++i) sequential += qpns[i] == qpns[i - 1] + 1;
  CHECK(sequential < 4);
  for (uint32_t q : qpns) CHECK((q >= 2 && q < 4096));
  std::sort(qpns.begin(), qpns.end());
  CHECK(std::adjacent_find(qpns.begin(), qpns.end()) == qpns.end());
  // The whole space is still usable: fill it, then it is full.
  uint32_t q = 0;
  int made = 32;
  QpInitAttr init;
  init.qp_type = QpType::UD;
  init.pd = n.pd.handle;
  init.send_cq = n.scq;
  init.recv_cq = n.rcq;
  init.cap.max_send_wr = 1;
  while (n.eng->create_qp(init, &q) == 0) ++made;
  CHECK(made == 4096 - 2);
}

TEST_CASE("hardening: a source MR deregistered during a send ends the WR with LOC_PROT_ERR", "[hardening]") {
  EngineConfig cfg;
  cfg.pkts_per_turn = 4;
  World w(5, 2, cfg);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  auto& src = A.buffer(256 * 1024);
  auto& dst = B.buffer(256 * 1024);
  fill_random(src.mem, 9);
  SendWr wr = make_wr(1, WrOpcode::RdmaWrite, src, 0, 256 * 1024);
  wr.rdma = {dst.addr(), dst.key};
  REQUIRE(A.eng->post_send(qa, wr) == 0);
  REQUIRE(w.run([&] { return A.eng->qp(qa)->ctr.tx_packets >= 16; }));
  const uint64_t sent_before = A.eng->qp(qa)->ctr.tx_packets;
  REQUIRE(sent_before < 256);
  REQUIRE(A.eng->dereg_mr(src.key) == 0);
  DROCE_POISON(src.mem.data(), src.mem.size());
  const std::vector<Wc> wcs = w.wait_wcs(A, A.scq, 1);
  REQUIRE(!wcs.empty());
  w.settle();
  DROCE_UNPOISON(src.mem.data(), src.mem.size());
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::LocProtErr);
  CHECK(A.eng->qp(qa)->state == QpState::Err);
  CHECK(A.eng->counter(Ctr::ReqGatherErr) == 1);
  // Nothing but the packets before the dereg carried its data (no zeros sent in its place).
  CHECK(A.eng->counter(Ctr::TxCopied) + A.eng->counter(Ctr::TxZeroCopy) == sent_before);
  (void)qb;
}

TEST_CASE("hardening: atomics stay atomic when two engines serve one MR", "[hardening]") {
  // The target word is shared: two engines (two cores' QPs) answer FETCH_ADD(+1)
  // on it on two threads, while a third thread (the owning process) increments it
  // with CPU atomics in a tight loop. Every add is counted: a read-modify-write
  // that is not one atomic instruction loses some of them.
  alignas(64) static uint64_t word;
  word = 0;
  constexpr uint32_t kOps = 20000;
  std::atomic<int> ready{0};
  std::atomic<int> engines_done{0};
  auto engine = [&](std::atomic<uint32_t>* acked) {
    Dut d;
    d.assertions = false;
    uint32_t key = 0;
    const bool ok = d.dut.eng->reg_mr(d.dut.pd, &word, 8, kAccessAll, &key) == 0;
    ready.fetch_add(1);
    while (ready.load() < 3) std::this_thread::yield();
    for (uint32_t i = 0; ok && i < kOps; i += 4) {
      for (uint32_t k = 0; k < 4; ++k) {  // four at a time: max_dest_rd_atomic
        auto h = d.hdr(wire::op::RC_FETCH_ADD, wire::psn_add(kRqPsn, i + k));
        h.ext.atomic = {reinterpret_cast<uint64_t>(&word), key, 1, 0};
        d.send(h);
      }
      for (const auto& f : d.run(0, 2))
        if (f.v.h.bth.opcode == wire::op::RC_ATOMIC_ACKNOWLEDGE) acked->fetch_add(1);
    }
    if (d.unparsed) acked->fetch_add(1u << 30);  // fails the count below
    engines_done.fetch_add(1);
  };
  uint64_t cpu_adds = 0;
  auto owner = [&] {
    ready.fetch_add(1);
    while (ready.load() < 3) std::this_thread::yield();
    std::atomic_ref<uint64_t> a(word);
    while (engines_done.load(std::memory_order_relaxed) < 2) {
      a.fetch_add(1);
      ++cpu_adds;
    }
  };
  std::atomic<uint32_t> acked{0};
  std::thread t1(engine, &acked), t2(engine, &acked), t3(owner);
  t1.join();
  t2.join();
  t3.join();
  INFO("CPU adds by the owner meanwhile: " << cpu_adds);
  CHECK(cpu_adds > 0);
  CHECK(acked.load() == 2 * kOps);
  CHECK(std::atomic_ref<uint64_t>(word).load() == 2 * kOps + cpu_adds);
}

TEST_CASE("hardening: UC resynchronises only on the first packet of a message", "[hardening]") {
  Dut d(QpType::UC);
  auto& target = d.dut.buffer(8192);
  std::vector<uint8_t> data(1024, 0x11);
  // Receive a MIDDLE and a LAST with PSNs far from the expected one. Expect them
  // dropped, the expected PSN unmoved, nothing written.
  d.send(d.hdr(static_cast<uint8_t>(wire::op::UC_BASE + wire::op::RC_WRITE_MIDDLE), kRqPsn + 300, false), data);
  d.send(d.hdr(static_cast<uint8_t>(wire::op::UC_BASE + wire::op::RC_WRITE_LAST), kRqPsn + 301, false), data);
  d.run();
  CHECK(d.q().resp.psn == kRqPsn);
  CHECK(target.mem[0] == 0);
  // A FIRST with a gap starts a message (the PSN resynchronises) and its LAST completes it.
  auto f = d.hdr(static_cast<uint8_t>(wire::op::UC_BASE + wire::op::RC_WRITE_FIRST), kRqPsn + 500, false);
  f.ext.reth = {target.addr(), target.key, 2048};
  d.send(f, data);
  d.send(d.hdr(static_cast<uint8_t>(wire::op::UC_BASE + wire::op::RC_WRITE_LAST), kRqPsn + 501, false), data);
  d.run();
  CHECK(d.q().resp.psn == kRqPsn + 502);
  CHECK(target.mem[0] == 0x11);
  CHECK(target.mem[2047] == 0x11);
}

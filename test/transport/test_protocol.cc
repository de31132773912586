// Protocol tests: one engine (the DUT) on a memlink, a raw port as its peer.
// Each test feeds hand-built packets (wire::build_frame) and asserts on what
// the engine sends back. Steps read "Receive ... Expect ...".
#include <catch2/catch.hpp>

#include <cstdlib>

#include "harness.h"
#include "raw_peer.h"

using namespace droce;
using namespace droce::test;


TEST_CASE("protocol: duplicate READ is re-executed", "[protocol]") {
  Proto p;
  // Receive READ (3 MTU) at PSN 1000. Expect FIRST, MIDDLE, LAST at 1000..1002 with the bytes.
  auto h = p.hdr(wire::op::RC_READ_REQUEST, kRqPsn);
  h.ext.reth = {p.mem->addr() + 10, p.mem->key, 3 * p.mtu};
  p.send(h);
  auto out = p.run();
  REQUIRE(out.size() == 3);
  const uint8_t ops[] = {wire::op::RC_READ_RESPONSE_FIRST, wire::op::RC_READ_RESPONSE_MIDDLE,
                         wire::op::RC_READ_RESPONSE_LAST};
  for (int i = 0; i < 3; ++i) {
    CHECK(out[i].v.h.bth.opcode == ops[i]);
    CHECK(out[i].v.h.bth.psn == kRqPsn + i);
    CHECK(out[i].v.h.bth.dqpn == kPeerQpn);
    CHECK(std::memcmp(out[i].v.payload(), p.mem->mem.data() + 10 + i * p.mtu, p.mtu) == 0);
  }
  // Receive the same READ again. Expect the same three responses (re-executed, C9-...).
  p.mem->mem[10] = 0xAB;  // a READ re-executes: it returns the memory as it is now
  p.send(h);
  out = p.run();
  REQUIRE(out.size() == 3);
  CHECK(out[0].v.h.bth.psn == kRqPsn);
  CHECK(out[0].v.payload()[0] == 0xAB);
  CHECK(p.dut.eng->counter(Ctr::ReadReplayed) == 1);
  // Receive a retried READ for the last two packets only (PSN 1001). Expect MIDDLE, LAST at 1001,
  // 1002: positions of the original response, as rxe sends them (and as rxe's requester checks).
  auto h2 = p.hdr(wire::op::RC_READ_REQUEST, kRqPsn + 1);
  h2.ext.reth = {p.mem->addr() + 10 + p.mtu, p.mem->key, 2 * p.mtu};
  p.send(h2);
  out = p.run();
  REQUIRE(out.size() == 2);
  CHECK(out[0].v.h.bth.opcode == wire::op::RC_READ_RESPONSE_MIDDLE);
  CHECK(out[0].v.h.bth.psn == kRqPsn + 1);
  CHECK(out[1].v.h.bth.opcode == wire::op::RC_READ_RESPONSE_LAST);
  CHECK(out[1].v.h.bth.psn == kRqPsn + 2);
  // The responder's PSN moved past the READ: the next new request is 1003.
  CHECK(p.q().resp.psn == kRqPsn + 3);
}

TEST_CASE("protocol: duplicate atomic is answered from the replay cache", "[protocol]") {
  Proto p;
  uint64_t v = 1000;
  std::memcpy(p.mem->mem.data() + 64, &v, 8);
  auto h = p.hdr(wire::op::RC_FETCH_ADD, kRqPsn);
  h.ext.atomic = {p.mem->addr() + 64, p.mem->key, 5, 0};
  // Receive FETCH_ADD(+5). Expect ATOMIC_ACK with the original 1000; memory 1005.
  p.send(h);
  auto out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.bth.opcode == wire::op::RC_ATOMIC_ACKNOWLEDGE);
  CHECK(out[0].v.h.bth.psn == kRqPsn);
  CHECK(out[0].v.h.ext.atomic_orig == 1000);
  // Receive it again. Expect the same answer; memory still 1005 (executed once).
  p.send(h);
  out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.atomic_orig == 1000);
  std::memcpy(&v, p.mem->mem.data() + 64, 8);
  CHECK(v == 1005);
  CHECK(p.dut.eng->counter(Ctr::AtomicExecuted) == 1);
  CHECK(p.dut.eng->counter(Ctr::AtomicReplayed) == 1);
  // A CMP_SWP next, then its duplicate.
  auto c = p.hdr(wire::op::RC_COMPARE_SWAP, kRqPsn + 1);
  c.ext.atomic = {p.mem->addr() + 64, p.mem->key, 77, 1005};
  p.send(c);
  out = p.run();
  p.send(c);
  auto out2 = p.run();
  REQUIRE(out.size() == 1);
  REQUIRE(out2.size() == 1);
  CHECK(out[0].v.h.ext.atomic_orig == 1005);
  CHECK(out2[0].v.h.ext.atomic_orig == 1005);
  std::memcpy(&v, p.mem->mem.data() + 64, 8);
  CHECK(v == 77);
}

TEST_CASE("protocol: PSN out of window and NAK sequence error", "[protocol]") {
  Proto p;
  std::vector<uint8_t> data(100, 0x5A);
  // Receive WRITE_ONLY at PSN 1000 + 2^22 (far ahead). Expect NAK PSN sequence error with PSN 1000.
  auto w = p.hdr(wire::op::RC_WRITE_ONLY, wire::psn_add(kRqPsn, 1u << 22));
  w.ext.reth = {p.mem->addr(), p.mem->key, 100};
  p.send(w, data);
  auto out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakPsnSeqError));
  CHECK(out[0].v.h.bth.psn == kRqPsn);
  CHECK(p.mem->mem[0] != 0x5A);  // nothing placed
  // Receive PSN 1001 (still ahead). Expect nothing: one NAK per sequence error.
  w.bth.psn = kRqPsn + 1;
  p.send(w, data);
  CHECK(p.run().empty());
  // Receive the expected PSN 1000. Expect ACK 1000 and the bytes placed.
  w.bth.psn = kRqPsn;
  p.send(w, data);
  out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethAck | wire::kAethCreditInvalid));
  CHECK(out[0].v.h.bth.psn == kRqPsn);
  CHECK(p.mem->mem[0] == 0x5A);
  // Receive a request 2^22 behind (an old duplicate). Expect a re-ACK of 1000, nothing placed.
  std::vector<uint8_t> other(100, 0x11);
  w.bth.psn = wire::psn_add(kRqPsn, (1u << 24) - (1u << 22));
  p.send(w, other);
  out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.bth.psn == kRqPsn);
  CHECK((out[0].v.h.ext.aeth.syndrome & wire::kAethKindMask) == wire::kAethAck);
  CHECK(p.mem->mem[0] == 0x5A);
}

TEST_CASE("protocol: duplicate SEND is re-ACKed not placed twice", "[protocol]") {
  Proto p;
  auto& rb = p.dut.buffer(4096);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(1, rb, 0, 2048)) == 0);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(2, rb, 2048, 2048)) == 0);
  std::vector<uint8_t> data(300, 0x42);
  auto s = p.hdr(wire::op::RC_SEND_ONLY, kRqPsn);
  p.send(s, data);
  p.send(s, data);  // duplicate
  auto out = p.run();
  REQUIRE(out.size() >= 1);
  for (auto& f : out) {
    CHECK(f.v.h.bth.psn == kRqPsn);
    CHECK(syn_kind(f) == wire::kAethAck);
  }
  auto wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].byte_len == 300);
  CHECK(rb.mem[2048] == 0);  // the second receive is untouched
  CHECK(p.dut.eng->counter(Ctr::DupRequest) == 1);
}

TEST_CASE("protocol: destroying a QP sends the ACK its TX queue still held", "[protocol]") {
  // The consumer polled the receive completion, so it may destroy the QP at
  // once (ibv_srq_pingpong does): the peer must still get the ACK, or it
  // retries into a QPN that no longer exists and ends with RETRY_EXC.
  for (const uint32_t refused : {3u, 100000u}) {
    Proto p;
    auto& rb = p.dut.buffer(4096);
    REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(1, rb, 0, 2048)) == 0);
    // A full TX queue: the DUT's own 64 KiB WRITE fills its burst, nothing leaves.
    p.dut.port.refuse_tx(1u << 30);
    auto wr = make_wr(7, WrOpcode::RdmaWrite, *p.mem, 0, 1 << 16);
    wr.rdma.remote_addr = 0x1000;
    wr.rdma.rkey = 0x55;
    REQUIRE(p.dut.eng->post_send(p.qpn, wr) == 0);
    p.dut.eng->poll();
    std::vector<uint8_t> data(300, 0x42);
    p.send(p.hdr(wire::op::RC_SEND_ONLY, kRqPsn), data);
    p.dut.eng->poll();
    REQUIRE(p.dut.drain(p.dut.rcq).size() == 1);  // the consumer sees the message...
    REQUIRE(p.q().resp.ack_pending);                // ...whose ACK could not be sent
    p.dut.port.refuse_tx(refused);
    REQUIRE(p.dut.eng->destroy_qp(p.qpn) == 0);
    p.dut.port.refuse_tx(0);
    auto out = p.run();
    int acks = 0;
    for (auto& f : out) acks += f.v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE && f.v.h.bth.psn == kRqPsn;
    if (refused == 3) {
      CHECK(acks == 1);
      CHECK(p.dut.eng->counter(Ctr::AckLostOnDestroy) == 0);
    } else {  // bounded: a queue that stays full loses it, counted
      CHECK(acks == 0);
      CHECK(p.dut.eng->counter(Ctr::AckLostOnDestroy) == 1);
    }
  }
}

TEST_CASE("protocol: ACK coalescing follows AckReq", "[protocol]") {
  Proto p;
  std::vector<uint8_t> data(p.mtu, 1);
  auto f = p.hdr(wire::op::RC_WRITE_FIRST, kRqPsn, false);
  f.ext.reth = {p.mem->addr(), p.mem->key, 4 * p.mtu};
  p.send(f, data);
  p.send(p.hdr(wire::op::RC_WRITE_MIDDLE, kRqPsn + 1, false), data);
  p.send(p.hdr(wire::op::RC_WRITE_MIDDLE, kRqPsn + 2, false), data);
  p.send(p.hdr(wire::op::RC_WRITE_LAST, kRqPsn + 3, true), data);
  auto out = p.run();
  REQUIRE(out.size() == 1);  // one ACK for four packets
  CHECK(out[0].v.h.bth.psn == kRqPsn + 3);
}

TEST_CASE("protocol: RNR NAK when no receive WQE", "[protocol]") {
  QpOpts o;
  o.min_rnr_timer = 14;  // 1.28 ms
  Proto p(QpType::RC, o);
  std::vector<uint8_t> data(64, 3);
  auto s = p.hdr(wire::op::RC_SEND_ONLY, kRqPsn);
  p.send(s, data);
  auto out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethRnrNak | 14));
  CHECK(out[0].v.h.bth.psn == kRqPsn);
  CHECK(p.q().resp.psn == kRqPsn);  // not consumed
  // Post a receive; resend. Expect ACK and the completion.
  auto& rb = p.dut.buffer(128);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(9, rb, 0, 128)) == 0);
  p.send(s, data);
  out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(syn_kind(out[0]) == wire::kAethAck);
  auto wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].byte_len == 64);
}

TEST_CASE("protocol: bad rkey gives NAK remote access error and QP error", "[protocol]") {
  struct Case {
    const char* what;
    int kind;
  };
  for (const Case c : {Case{"wrong key", 0}, Case{"out of bounds", 1}, Case{"no remote write right", 2},
                       Case{"length overflow", 3}, Case{"READ wrong key", 4}}) {
    INFO(c.what);
    Proto p;
    auto& ro = p.dut.buffer(4096, kAccessLocalWrite | kAccessRemoteRead);
    std::vector<uint8_t> data(64, 9);
    auto w = p.hdr(c.kind == 4 ? wire::op::RC_READ_REQUEST : wire::op::RC_WRITE_ONLY, kRqPsn);
    w.ext.reth = {p.mem->addr(), p.mem->key, 64};
    if (c.kind == 0 || c.kind == 4) w.ext.reth.rkey = p.mem->key ^ 0x100;
    if (c.kind == 1) w.ext.reth.va = p.mem->addr() + p.mem->mem.size() - 32;
    if (c.kind == 2) w.ext.reth = {ro.addr(), ro.key, 64};
    if (c.kind == 3) w.ext.reth.va = ~uint64_t{0} - 16;
    p.send(w, c.kind == 4 ? std::span<const uint8_t>{} : std::span<const uint8_t>(data));
    auto out = p.run();
    REQUIRE(out.size() == 1);
    CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakRemoteAccessError));
    CHECK(out[0].v.h.bth.psn == kRqPsn);
    CHECK(p.q().state == QpState::Err);
    // Counted by reason: a VA outside the MR apart from a wrong key or right.
    const bool va = c.kind == 1 || c.kind == 3;
    CHECK(p.dut.eng->counter(Ctr::RxBadVa) == (va ? 1u : 0u));
    CHECK(p.dut.eng->counter(Ctr::RxBadRkey) == (va ? 0u : 1u));
    CHECK(p.dut.eng->counter(Ctr::RxBadLength) == 0);
  }
}

TEST_CASE("protocol: unaligned atomic gives NAK invalid request", "[protocol]") {
  Proto p;
  auto a = p.hdr(wire::op::RC_COMPARE_SWAP, kRqPsn);
  a.ext.atomic = {p.mem->addr() + 4, p.mem->key, 1, 2};
  p.send(a);
  auto out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakInvalidRequest));
  CHECK(p.q().state == QpState::Err);
  CHECK(p.dut.eng->counter(Ctr::AtomicExecuted) == 0);
  CHECK(p.dut.eng->counter(Ctr::RxBadVa) == 1);
}

TEST_CASE("protocol: SEND too long for the posted receive", "[protocol]") {
  Proto p;
  auto& rb = p.dut.buffer(4096);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(5, rb, 0, 100)) == 0);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(6, rb, 100, 100)) == 0);
  std::vector<uint8_t> data(101, 1);
  p.send(p.hdr(wire::op::RC_SEND_ONLY, kRqPsn), data);
  auto out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakInvalidRequest));
  auto wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 5);
  CHECK(wcs[0].status == WcStatus::LocLenErr);
  CHECK(wcs[1].wr_id == 6);
  CHECK(wcs[1].status == WcStatus::WrFlushErr);
  CHECK(p.q().state == QpState::Err);
  CHECK(p.dut.eng->counter(Ctr::RxBadLength) == 1);
}

TEST_CASE("protocol: WRITE whose payload does not match its RETH length is counted", "[protocol]") {
  for (const uint32_t reth_len : {63u, 65u}) {
    INFO("RETH length " << reth_len << ", payload 64");
    Proto p;
    std::vector<uint8_t> data(64, 9);
    auto w = p.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
    w.ext.reth = {p.mem->addr(), p.mem->key, reth_len};
    p.send(w, data);
    auto out = p.run();
    REQUIRE(out.size() == 1);
    CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakInvalidRequest));
    CHECK(p.q().state == QpState::Err);
    CHECK(p.dut.eng->counter(Ctr::RxBadLength) == 1);
    CHECK(p.dut.eng->counter(Ctr::RxBadRkey) == 0);
  }
}

TEST_CASE("protocol: opcode sequence error gives NAK invalid request", "[protocol]") {
  Proto p;
  std::vector<uint8_t> data(p.mtu, 1);
  p.send(p.hdr(wire::op::RC_WRITE_MIDDLE, kRqPsn), data);  // MIDDLE without FIRST
  auto out = p.run();
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakInvalidRequest));
}

TEST_CASE("protocol: requester completes REM_ACCESS_ERR on NAK and flushes", "[protocol]") {
  Proto p;
  SendWr w1 = make_wr(1, WrOpcode::RdmaWrite, *p.mem, 0, 100);
  w1.rdma = {0x1000, 0x4242};
  SendWr w2 = make_wr(2, WrOpcode::Send, *p.mem, 0, 10);
  REQUIRE(p.dut.eng->post_send(p.qpn, w1) == 0);
  REQUIRE(p.dut.eng->post_send(p.qpn, w2) == 0);
  auto out = p.run();
  REQUIRE(out.size() == 2);
  CHECK(out[0].v.h.bth.opcode == wire::op::RC_WRITE_ONLY);
  CHECK(out[0].v.h.bth.psn == kSqPsn);
  CHECK(out[0].v.h.bth.dqpn == kPeerQpn);
  CHECK(out[1].v.h.bth.psn == kSqPsn + 1);
  // Receive NAK remote access error for PSN 500. Expect REM_ACCESS_ERR, then WR_FLUSH_ERR.
  auto nak = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn, false);
  nak.ext.aeth = {wire::kAethNak | wire::kNakRemoteAccessError, 0};
  p.send(nak);
  p.run();
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].status == WcStatus::RemAccessErr);
  CHECK(wcs[1].wr_id == 2);
  CHECK(wcs[1].status == WcStatus::WrFlushErr);
  CHECK(p.q().state == QpState::Err);
}

TEST_CASE("protocol: requester completes REM_INV_REQ_ERR and REM_OP_ERR on NAK and flushes", "[protocol]") {
  struct Case {
    uint8_t nak;
    WcStatus want;
  };
  for (const Case c : {Case{wire::kNakInvalidRequest, WcStatus::RemInvReqErr},
                       Case{wire::kNakRemoteOperationalError, WcStatus::RemOpErr}}) {
    INFO("NAK code " << int(c.nak));
    Proto p;
    // Three SENDs (PSN 500..502) and a WRITE (503).
    for (int i = 0; i < 3; ++i) REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(10 + i, WrOpcode::Send, *p.mem, 0, 10)) == 0);
    SendWr wr = make_wr(13, WrOpcode::RdmaWrite, *p.mem, 0, 100);
    wr.rdma = {0x1000, 0x4242};
    REQUIRE(p.dut.eng->post_send(p.qpn, wr) == 0);
    auto out = p.run();
    REQUIRE(out.size() == 4);
    // Receive the NAK for PSN 501. Expect: 500 SUCCESS (implicitly acknowledged by the NAK),
    // 501 with the error status, 502 and 503 WR_FLUSH_ERR, in order; the QP in ERR.
    auto nak = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn + 1, false);
    nak.ext.aeth = {static_cast<uint8_t>(wire::kAethNak | c.nak), 1};
    p.send(nak);
    out = p.run();
    CHECK(out.empty());  // nothing retransmitted
    auto wcs = p.dut.drain(p.dut.scq);
    REQUIRE(wcs.size() == 4);
    CHECK(wcs[0].wr_id == 10);
    CHECK(wcs[0].status == WcStatus::Success);
    CHECK(wcs[1].wr_id == 11);
    CHECK(wcs[1].status == c.want);
    CHECK(wcs[1].opcode == WcOpcode::Send);
    CHECK(wcs[2].wr_id == 12);
    CHECK(wcs[2].status == WcStatus::WrFlushErr);
    CHECK(wcs[3].wr_id == 13);
    CHECK(wcs[3].status == WcStatus::WrFlushErr);
    CHECK(p.q().state == QpState::Err);
    CHECK(p.dut.eng->counter(Ctr::ErrNakReceived) == 1);
    // A WR posted now completes at once with WR_FLUSH_ERR; nothing goes on the wire.
    REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(14, WrOpcode::Send, *p.mem, 0, 10)) == 0);
    CHECK(p.run().empty());
    wcs = p.dut.drain(p.dut.scq);
    REQUIRE(wcs.size() == 1);
    CHECK(wcs[0].wr_id == 14);
    CHECK(wcs[0].status == WcStatus::WrFlushErr);
  }
}

TEST_CASE("protocol: local ACK timeout retry_cnt and RETRY_EXC_ERR", "[protocol]") {
  QpOpts o;
  o.timeout = 4;  // 4.096 us * 16 = 65.536 us
  o.retry_cnt = 2;
  Proto p(QpType::RC, o);
  REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(1, WrOpcode::Send, *p.mem, 0, 10)) == 0);
  std::vector<uint64_t> times;
  for (int i = 0; i < 60; ++i) {
    auto out = p.run(5000);
    for (auto& f : out) {
      CHECK(f.v.h.bth.psn == kSqPsn);
      times.push_back(p.clock.now_ns());
    }
  }
  REQUIRE(times.size() == 3);  // first send + retry_cnt retransmissions
  const uint64_t to = 65536;
  for (size_t i = 1; i < times.size(); ++i) {
    CHECK(times[i] - times[i - 1] + 5000 >= to);  // observed at 5 us granularity
    CHECK(times[i] - times[i - 1] <= to + 10000);
  }
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::RetryExcErr);
}

TEST_CASE("protocol: RNR NAK retry with rnr_retry 1 then RNR_RETRY_EXC_ERR", "[protocol]") {
  QpOpts o;
  o.rnr_retry = 1;
  Proto p(QpType::RC, o);
  REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(1, WrOpcode::Send, *p.mem, 0, 10)) == 0);
  auto out = p.run(1000);
  REQUIRE(out.size() == 1);
  auto rnr = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn, false);
  rnr.ext.aeth = {static_cast<uint8_t>(wire::kAethRnrNak | 3), 0};  // timer code 3 = 30 us
  p.send(rnr);
  out = p.run(20000);
  CHECK(out.empty());  // waits the RNR timer
  out = p.run(20000);
  REQUIRE(out.size() == 1);  // then resends
  CHECK(out[0].v.h.bth.psn == kSqPsn);
  p.send(rnr);
  p.run(5000);
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::RnrRetryExcErr);
}

TEST_CASE("protocol: rnr_retry 7 retries RNR NAKs forever", "[protocol]") {
  QpOpts o;
  o.rnr_retry = 7;  // IBTA 9.7.5.2.8: 7 means infinite
  o.retry_cnt = 1;  // RNR NAKs must not use up retry_cnt either
  Proto p(QpType::RC, o);
  REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(1, WrOpcode::Send, *p.mem, 0, 10)) == 0);
  REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(2, WrOpcode::Send, *p.mem, 16, 20)) == 0);
  auto out = p.run(1000);
  REQUIRE(out.size() == 2);
  auto rnr = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn, false);
  rnr.ext.aeth = {static_cast<uint8_t>(wire::kAethRnrNak | 3), 0};  // timer code 3 = 30 us
  // Receive 20 RNR NAKs for PSN 500 in a row. Expect each time: nothing during the RNR wait, then
  // 500 and 501 again; no completion.
  for (int i = 0; i < 20; ++i) {
    INFO("RNR NAK " << i);
    p.send(rnr);
    out = p.run(20000);
    CHECK(out.empty());
    out = p.run(20000);
    REQUIRE(out.size() == 2);
    CHECK(out[0].v.h.bth.psn == kSqPsn);
    CHECK(out[1].v.h.bth.psn == kSqPsn + 1);
    CHECK(p.dut.drain(p.dut.scq).empty());
    CHECK(p.q().state == QpState::Rts);
  }
  CHECK(p.dut.eng->counter(Ctr::RnrNakReceived) == 20);
  CHECK(p.dut.eng->counter(Ctr::RnrRetryExceeded) == 0);
  // Receive ACK 501. Expect both SUCCESS, in order.
  auto ack = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn + 1, false);
  ack.ext.aeth = {wire::kAethAck | wire::kAethCreditInvalid, 2};
  p.send(ack);
  p.run(5000);
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].status == WcStatus::Success);
  CHECK(wcs[1].wr_id == 2);
  CHECK(wcs[1].status == WcStatus::Success);
  CHECK(p.q().state == QpState::Rts);
}

TEST_CASE("protocol: ECN CE mark makes a CNP rate-limited per QP", "[protocol][ecn]") {
  Proto p;
  std::vector<uint8_t> data(64, 1);
  auto w = p.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
  w.ext.reth = {p.mem->addr(), p.mem->key, 64};
  w.l3.tos = wire::kEcnCe;
  p.send(w, data);
  auto out = p.run(1000);
  REQUIRE(out.size() == 2);
  const Frame* cnp = nullptr;
  for (auto& f : out)
    if (f.v.h.bth.opcode == wire::op::CNP) cnp = &f;
  REQUIRE(cnp);
  CHECK(cnp->v.h.bth.dqpn == kPeerQpn);
  CHECK(cnp->v.h.bth.becn());
  // A second CE packet within the interval: no second CNP.
  w.bth.psn = kRqPsn + 1;
  p.send(w, data);
  out = p.run(1000);
  REQUIRE(out.size() == 1);
  CHECK(out[0].v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
  CHECK(p.dut.eng->counter(Ctr::CnpSent) == 1);
  CHECK(p.dut.eng->counter(Ctr::CnpSuppressed) == 1);
  CHECK(p.dut.eng->counter(Ctr::CeReceived) == 2);
  // After the interval, another.
  p.run(60000);
  w.bth.psn = kRqPsn + 2;
  p.send(w, data);
  out = p.run(1000);
  CHECK(out.size() == 2);
  CHECK(p.dut.eng->counter(Ctr::CnpSent) == 2);
  // The sender side counts CNPs it receives.
  auto c = p.hdr(wire::op::CNP, 0, false);
  c.bth.resv8a = wire::kBthBecn;
  p.send(c);
  p.run(1000);
  CHECK(p.dut.eng->counter(Ctr::CnpReceived) == 1);
  CHECK(p.q().ctr.cnp_received == 1);
}

// The notification point as NVIDIA's roce_np defaults it: at most one CNP per
// QP per min_time_between_cnps (4 us), DSCP 48, priority 6 on a VLAN, Not-ECT.
TEST_CASE("protocol: notification point one CNP per QP per min_time_between_cnps with its DSCP and priority",
          "[protocol][ecn]") {
  EngineConfig defaults;
  CHECK(defaults.cnp_interval_ns == 4'000);
  CHECK(defaults.cnp_dscp == 48);
  CHECK(defaults.cnp_prio == 6);
  CHECK(defaults.ecn);
  CHECK(defaults.cnp);
  Proto p;
  std::vector<uint8_t> data(64, 1);
  auto w = p.hdr(wire::op::RC_WRITE_ONLY, kRqPsn, false);
  w.ext.reth = {p.mem->addr(), p.mem->key, 64};
  w.l3.tos = wire::kEcnCe;
  w.l2.vlan = true;
  w.l2.vlan_tci = 5;  // VID 5, PCP 0
  // A CE-marked packet every 500 ns for 20 us: CNPs at 0, 4, 8, 12, 16 us.
  const uint64_t t0 = p.clock.now_ns();
  std::vector<uint64_t> at;
  for (uint32_t i = 0; i < 40; ++i) {
    w.bth.psn = kRqPsn + i;
    p.send(w, data);
    for (const Frame& f : p.run(0, 1)) {
      if (f.v.h.bth.opcode != wire::op::CNP) continue;
      at.push_back(p.clock.now_ns() - t0);
      CHECK(f.v.h.l3.tos == (48 << 2));  // DSCP 48, Not-ECT
      CHECK(f.v.h.l2.vlan);
      CHECK(f.v.h.l2.vlan_tci == ((6 << 13) | 5));
      CHECK(f.v.h.bth.dqpn == kPeerQpn);
    }
    p.clock.advance(500);
  }
  CHECK(at == std::vector<uint64_t>{0, 4'000, 8'000, 12'000, 16'000});
  CHECK(p.dut.eng->counter(Ctr::CeReceived) == 40);
  CHECK(p.dut.eng->counter(Ctr::CnpSent) == 5);
  CHECK(p.dut.eng->counter(Ctr::CnpSuppressed) == 35);
  CHECK(p.q().ctr.cnp_sent == 5);
}

TEST_CASE("protocol: ECT marking and CNPs are each configurable", "[protocol][ecn]") {
  for (const bool ecn : {true, false}) {
    for (const bool cnp : {true, false}) {
      EngineConfig cfg;
      cfg.ecn = ecn;
      cfg.cnp = cnp;
      cfg.cnp_dscp = 26;
      Proto p(QpType::RC, {}, cfg);
      std::vector<uint8_t> data(64, 1);
      auto w = p.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
      w.ext.reth = {p.mem->addr(), p.mem->key, 64};
      w.l3.tos = wire::kEcnCe | (10 << 2);
      p.send(w, data);
      const auto out = p.run(1000);
      const Frame* ack = nullptr;
      const Frame* cn = nullptr;
      for (auto& f : out) (f.v.h.bth.opcode == wire::op::CNP ? cn : ack) = &f;
      REQUIRE(ack);
      CHECK(ack->v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
      CHECK(ack->v.h.l3.ecn() == (ecn ? wire::kEcnEct0 : wire::kEcnNotEct));
      CHECK(p.dut.eng->counter(Ctr::CeReceived) == 1);
      CHECK((cn != nullptr) == cnp);
      if (cn) CHECK(cn->v.h.l3.tos == (26 << 2));
      // The DUT's own requests: ECT(0) or Not-ECT likewise.
      auto& src = p.dut.buffer(64);
      SendWr wr = make_wr(1, WrOpcode::RdmaWrite, src, 0, 64);
      wr.rdma = {0x1000, 0x1234};
      REQUIRE(p.dut.eng->post_send(p.qpn, wr) == 0);
      const auto req = p.run(1000);
      REQUIRE(req.size() == 1);
      CHECK(req[0].v.h.bth.opcode == wire::op::RC_WRITE_ONLY);
      CHECK(req[0].v.h.l3.ecn() == (ecn ? wire::kEcnEct0 : wire::kEcnNotEct));
    }
  }
}

TEST_CASE("protocol: UC drops a message with a PSN gap and resyncs", "[protocol][uc]") {
  Proto p(QpType::UC);
  auto& rb = p.dut.buffer(8192);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(1, rb, 0, 4096)) == 0);
  std::vector<uint8_t> a(p.mtu, 0xAA), b(10, 0xBB);
  p.send(p.hdr(wire::op::UC_BASE + 0x00, kRqPsn, false), a);      // SEND_FIRST
  p.send(p.hdr(wire::op::UC_BASE + 0x02, kRqPsn + 2, false), a);  // SEND_LAST after a gap: dropped
  p.send(p.hdr(wire::op::UC_BASE + 0x02, kRqPsn + 3, false), a);  // still no FIRST: dropped
  p.send(p.hdr(wire::op::UC_BASE + 0x04, kRqPsn + 9, false), b);  // SEND_ONLY: resync
  auto out = p.run();
  CHECK(out.empty());  // UC never answers
  auto wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].byte_len == 10);
  CHECK(rb.mem[0] == 0xBB);
  CHECK(p.dut.eng->counter(Ctr::UcMsgDropped) >= 1);
  CHECK(p.q().resp.psn == kRqPsn + 10);
}

TEST_CASE("protocol: UD drops a bad Q_Key and places the GRH", "[protocol][ud]") {
  Proto p(QpType::UD);
  auto& rb = p.dut.buffer(4096);
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(1, rb, 0, 4096)) == 0);
  std::vector<uint8_t> data(20, 0x31);
  auto u = p.hdr(wire::op::UD_SEND_ONLY, 7, false);
  u.ext.deth = {0x1234, 0, 0x99};  // wrong Q_Key
  p.send(u, data);
  p.run();
  CHECK(p.dut.drain(p.dut.rcq).empty());
  CHECK(p.dut.eng->counter(Ctr::UdQkeyDrop) == 1);
  u.ext.deth.qkey = QpOpts{}.qkey;
  p.send(u, data);
  p.run();
  auto wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].src_qp == 0x99);
  CHECK(wcs[0].byte_len == 60);
  CHECK((wcs[0].wc_flags & kWcGrh));
  CHECK(rb.mem[20] == 0x45);
  CHECK(rb.mem[40] == 0x31);
  // A receive too small for GRH + payload: LOC_LEN_ERR on that receive, the QP keeps working.
  REQUIRE(p.dut.eng->post_recv(p.qpn, make_recv(2, rb, 0, 50)) == 0);
  p.send(u, data);
  p.run();
  wcs = p.dut.drain(p.dut.rcq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].wr_id == 2);
  CHECK(wcs[0].status == WcStatus::LocLenErr);
  CHECK(p.dut.eng->counter(Ctr::UdLenDrop) == 1);
  CHECK(p.q().state == QpState::Rts);
}

TEST_CASE("protocol: corrupted and unknown-QP frames are counted and dropped", "[protocol]") {
  Proto p;
  std::vector<uint8_t> data(64, 0x77);
  auto w = p.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
  w.ext.reth = {p.mem->addr(), p.mem->key, 64};
  memlink::Faults f;
  f.corrupt = 1.0;
  p.peer.set_faults(f);
  p.send(w, data);
  CHECK(p.run().empty());
  CHECK(p.dut.eng->counter(Ctr::RxIcrcErr) == 1);
  CHECK(p.mem->mem[0] != 0x77);
  p.peer.set_faults({});
  w.bth.dqpn = 999;
  p.send(w, data);
  CHECK(p.run().empty());
  CHECK(p.dut.eng->counter(Ctr::RxNoQp) == 1);
  w.bth.dqpn = p.qpn;
  w.bth.pkey = 0x1234;  // another partition
  p.send(w, data);
  CHECK(p.run().empty());
  CHECK(p.dut.eng->counter(Ctr::RxBadPkey) == 1);
  CHECK(p.mem->mem[0] != 0x77);
}

TEST_CASE("protocol: READs beyond max_dest_rd_atomic are NAKed", "[protocol]") {
  Proto p;  // max_dest_rd_atomic 4
  // Receive five READs in one burst (their responses have not gone out yet).
  for (uint32_t i = 0; i < 5; ++i) {
    auto h = p.hdr(wire::op::RC_READ_REQUEST, kRqPsn + i);
    h.ext.reth = {p.mem->addr(), p.mem->key, 16};
    p.send(h);
  }
  auto out = p.run();
  // Expect four READ responses, then NAK invalid request for the fifth (PSN 1004).
  int resp = 0;
  const Frame* nak = nullptr;
  for (auto& f : out) {
    if (f.v.h.bth.opcode == wire::op::RC_READ_RESPONSE_ONLY) ++resp;
    if (f.v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE) nak = &f;
  }
  CHECK(resp == 4);  // owed for the first four, sent before the NAK
  REQUIRE(nak);
  CHECK(nak == &out.back());
  CHECK(nak->v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakInvalidRequest));
  CHECK(nak->v.h.bth.psn == kRqPsn + 4);
  CHECK(p.q().state == QpState::Err);
}

TEST_CASE("protocol: UC WRITE with a gap is dropped and SEND without a receive is dropped", "[protocol][uc]") {
  Proto p(QpType::UC);
  std::vector<uint8_t> a(p.mtu, 0xAA), b(p.mtu, 0xBB);
  // WRITE_FIRST, (MIDDLE lost), WRITE_LAST: the LAST is dropped, FIRST's bytes stay (UC places as it goes).
  auto f = p.hdr(wire::op::UC_BASE + 0x06, kRqPsn, false);
  f.ext.reth = {p.mem->addr(), p.mem->key, 3 * p.mtu};
  p.send(f, a);
  p.send(p.hdr(wire::op::UC_BASE + 0x08, kRqPsn + 2, false), b);
  // A new WRITE_ONLY resynchronises.
  auto o = p.hdr(wire::op::UC_BASE + 0x0A, kRqPsn + 3, false);
  o.ext.reth = {p.mem->addr() + 4 * p.mtu, p.mem->key, p.mtu};
  p.send(o, b);
  // A SEND with no receive posted: dropped silently (no RNR on UC).
  p.send(p.hdr(wire::op::UC_BASE + 0x04, kRqPsn + 4, false), b);
  CHECK(p.run().empty());
  CHECK(p.mem->mem[0] == 0xAA);
  CHECK(p.mem->mem[2 * p.mtu] != 0xBB);
  CHECK(p.mem->mem[4 * p.mtu] == 0xBB);
  CHECK(p.dut.eng->counter(Ctr::UcMsgDropped) >= 2);
  CHECK(p.dut.drain(p.dut.rcq).empty());
  CHECK(p.q().state == QpState::Rts);
}

TEST_CASE("protocol: random well-formed packets never crash the engine", "[protocol][robust]") {
  // Every valid opcode with random PSNs, keys, addresses, lengths and payloads
  // (valid ICRC, so they reach the transport), against RC, UC and UD QPs whose
  // requesters have work outstanding. Run under ASan/UBSan in the sanitizer build.
  std::vector<uint8_t> ops;
  for (int o = 0; o < 256; ++o)
    if (wire::opcode_info(static_cast<uint8_t>(o)).valid()) ops.push_back(static_cast<uint8_t>(o));
  for (QpType t : {QpType::RC, QpType::UC, QpType::UD}) {
    const char* env_seed = std::getenv("DROCE_SEED");
    const uint64_t seed = (env_seed ? std::strtoull(env_seed, nullptr, 0) : 4242) + static_cast<int>(t);
    const char* env_iters = std::getenv("DROCE_ITERS");
    const int iters = env_iters ? std::atoi(env_iters) : 4000;
    INFO("seed " << seed << " type " << int(t));
    std::mt19937_64 r(seed);
    Proto p(t);
    auto& rb = p.dut.buffer(1 << 16);
    for (int i = 0; i < 8; ++i) p.dut.eng->post_recv(p.qpn, make_recv(i, rb, i * 4096, 4096));
    if (t != QpType::UD) {
      for (int i = 0; i < 4; ++i) {
        SendWr wr = make_wr(i, i % 2 ? WrOpcode::RdmaWrite : WrOpcode::Send, *p.mem, 0, 3000);
        wr.rdma = {0x1000, 0x100};
        p.dut.eng->post_send(p.qpn, wr);
      }
      if (t == QpType::RC) {
        SendWr rd = make_wr(9, WrOpcode::RdmaRead, *p.mem, 0, 5000);
        p.dut.eng->post_send(p.qpn, rd);
      }
    }
    std::vector<uint8_t> payload(p.mtu + 64);
    for (int i = 0; i < iters; ++i) {
      auto h = p.hdr(ops[r() % ops.size()], 0, r() & 1);
      const uint32_t near = r() % 2 ? kRqPsn : kSqPsn;
      h.bth.psn = r() % 4 ? wire::psn_add(near, static_cast<uint32_t>(r() % 16)) : static_cast<uint32_t>(r()) & wire::kMask24;
      const bool good_key = r() % 2;
      const uint64_t va = good_key ? p.mem->addr() + r() % (1 << 16) : r();
      const uint32_t key = good_key ? p.mem->key : static_cast<uint32_t>(r());
      h.ext.reth = {va, key, static_cast<uint32_t>(r() % 3 ? r() % 8192 : r())};
      h.ext.atomic = {va & (r() % 2 ? ~uint64_t{7} : ~uint64_t{0}), key, r(), r()};
      h.ext.aeth = {static_cast<uint8_t>(r()), static_cast<uint32_t>(r())};
      h.ext.deth = {r() % 2 ? QpOpts{}.qkey : static_cast<uint32_t>(r()), 0, static_cast<uint32_t>(r()) & wire::kMask24};
      h.ext.ieth_rkey = r() % 2 ? p.mem->key : static_cast<uint32_t>(r());
      h.l3.tos = static_cast<uint8_t>(r() & 3);
      if (r() % 8 == 0) h.bth.dqpn = static_cast<uint32_t>(r()) & wire::kMask24;
      const uint32_t plen = (wire::opcode_info(h.bth.opcode).flags & wire::kOpPayload) ? static_cast<uint32_t>(r() % payload.size()) : 0;
      for (uint32_t k = 0; k < plen; ++k) payload[k] = static_cast<uint8_t>(r());
      p.send(h, {payload.data(), plen});
      if (i % 16 == 0) p.run(2000);
    }
    p.run(200000);
    uint64_t rx = p.dut.eng->counter(Ctr::RxFrames);
    CHECK(rx >= static_cast<uint64_t>(iters));
  }
}

TEST_CASE("protocol: requester goes back N on NAK sequence error", "[protocol]") {
  Proto p;
  for (int i = 0; i < 4; ++i) REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(i, WrOpcode::Send, *p.mem, i, 10)) == 0);
  auto out = p.run(1000);
  REQUIRE(out.size() == 4);  // PSN 500..503
  // Receive NAK sequence error for 502. Expect 502 and 503 again, and completions for 500 and 501.
  auto nak = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn + 2, false);
  nak.ext.aeth = {wire::kAethNak | wire::kNakPsnSeqError, 0};
  p.send(nak);
  out = p.run(1000);
  REQUIRE(out.size() == 2);
  CHECK(out[0].v.h.bth.psn == kSqPsn + 2);
  CHECK(out[1].v.h.bth.psn == kSqPsn + 3);
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 0);
  CHECK(wcs[1].wr_id == 1);
  // The same NAK again (duplicated on the wire): no second go-back.
  p.send(nak);
  CHECK(p.run(1000).empty());
  // Receive ACK 503. Expect the last two completions.
  auto ack = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn + 3, false);
  ack.ext.aeth = {wire::kAethAck | wire::kAethCreditInvalid, 0};
  p.send(ack);
  p.run(1000);
  wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[1].wr_id == 3);
  CHECK(wcs[1].status == WcStatus::Success);
  CHECK(p.dut.eng->counter(Ctr::ReqRetransmits) == 2);
}

TEST_CASE("protocol: ACK past an unanswered READ re-requests it", "[protocol]") {
  Proto p;
  SendWr rd = make_wr(1, WrOpcode::RdmaRead, *p.mem, 0, 2 * 1024);
  rd.rdma = {0x10000, 0x4242};
  REQUIRE(p.dut.eng->post_send(p.qpn, rd) == 0);                                       // PSN 500-501
  REQUIRE(p.dut.eng->post_send(p.qpn, make_wr(2, WrOpcode::Send, *p.mem, 0, 10)) == 0);  // PSN 502
  auto out = p.run(1000);
  REQUIRE(out.size() == 2);
  // Receive READ_RESPONSE_FIRST for 500 only, then an ACK for 502: the READ's LAST was lost.
  std::vector<uint8_t> data(1024, 0x3C);
  auto first = p.hdr(wire::op::RC_READ_RESPONSE_FIRST, kSqPsn, false);
  first.ext.aeth = {wire::kAethAck | wire::kAethCreditInvalid, 0};
  p.send(first, data);
  auto ack = p.hdr(wire::op::RC_ACKNOWLEDGE, kSqPsn + 2, false);
  ack.ext.aeth = {wire::kAethAck | wire::kAethCreditInvalid, 0};
  p.send(ack);
  out = p.run(1000);
  // Expect a READ request for the missing part only (PSN 501, second KiB), then the SEND again.
  REQUIRE(out.size() >= 1);
  CHECK(out[0].v.h.bth.opcode == wire::op::RC_READ_REQUEST);
  CHECK(out[0].v.h.bth.psn == kSqPsn + 1);
  CHECK(out[0].v.h.ext.reth.va == 0x10000 + 1024);
  CHECK(out[0].v.h.ext.reth.len == 1024);
  CHECK(p.dut.drain(p.dut.scq).empty());
  // Receive READ_RESPONSE_FIRST/ONLY for 501 and ACK 502. Expect both completions, in order.
  auto only = p.hdr(wire::op::RC_READ_RESPONSE_ONLY, kSqPsn + 1, false);
  only.ext.aeth = {wire::kAethAck | wire::kAethCreditInvalid, 0};
  p.send(only, data);
  p.send(ack);
  p.run(1000);
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 2);
  CHECK(wcs[0].wr_id == 1);
  CHECK(wcs[0].status == WcStatus::Success);
  CHECK(wcs[0].opcode == WcOpcode::RdmaRead);
  CHECK(wcs[1].wr_id == 2);
  CHECK(p.mem->mem[1500] == 0x3C);
}

TEST_CASE("protocol: new atomic reuses a resource busy only replaying a duplicate", "[protocol]") {
  Proto p;  // max_dest_rd_atomic 4; the peer plays a requester with max_rd_atomic 4
  const auto fa = [&](uint32_t psn) {
    auto h = p.hdr(wire::op::RC_FETCH_ADD, psn);
    h.ext.atomic = {p.mem->addr() + 64, p.mem->key, 1, 0};
    return h;
  };
  uint64_t v = 0;
  std::memcpy(p.mem->mem.data() + 64, &v, 8);
  // Receive FETCH_ADD(+1) at PSNs 1000..1003. Expect four ATOMIC_ACKs (0, 1, 2, 3).
  for (uint32_t i = 0; i < 4; ++i) p.send(fa(kRqPsn + i));
  auto out = p.run();
  REQUIRE(out.size() == 4);
  // The peer's ACK timer fires before those ACKs arrive: it resends 1000..1003 (go back N).
  // Then the ACK of 1000 arrives, completing it, so it may send 1004 (4 outstanding again).
  // All five reach the DUT before it sends anything: 1004 takes 1000's resource, whose
  // replay the peer no longer needs. Expect no NAK; replays of 1001..1003 then 1004, in PSN order.
  for (uint32_t i = 0; i < 5; ++i) p.send(fa(kRqPsn + i));
  out = p.run();
  std::vector<uint32_t> psns;
  std::vector<uint64_t> origs;
  for (auto& f : out) {
    REQUIRE(f.v.h.bth.opcode == wire::op::RC_ATOMIC_ACKNOWLEDGE);  // no NAK invalid request
    psns.push_back(f.v.h.bth.psn);
    origs.push_back(f.v.h.ext.atomic_orig);
  }
  CHECK(psns == std::vector<uint32_t>{kRqPsn + 1, kRqPsn + 2, kRqPsn + 3, kRqPsn + 4});
  CHECK(origs == std::vector<uint64_t>{1, 2, 3, 4});
  CHECK(p.q().state == QpState::Rts);
  std::memcpy(&v, p.mem->mem.data() + 64, 8);
  CHECK(v == 5);  // each executed once
  CHECK(p.dut.eng->counter(Ctr::AtomicExecuted) == 5);
  CHECK(p.dut.eng->counter(Ctr::AtomicReplayed) == 4);
  // Duplicates of 1001..1004 are still answered from the cache (1000's result is gone).
  for (uint32_t i = 1; i < 5; ++i) p.send(fa(kRqPsn + i));
  out = p.run();
  REQUIRE(out.size() == 4);
  for (uint32_t i = 0; i < 4; ++i) CHECK(out[i].v.h.ext.atomic_orig == i + 1);
  // Five new requests in one burst: the fifth finds the first's original response
  // still unsent, a requester breaking max_dest_rd_atomic: NAK invalid request.
  for (uint32_t i = 5; i < 10; ++i) p.send(fa(kRqPsn + i));
  out = p.run();
  REQUIRE(!out.empty());
  CHECK(out.back().v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
  CHECK(out.back().v.h.ext.aeth.syndrome == (wire::kAethNak | wire::kNakInvalidRequest));
  CHECK(out.back().v.h.bth.psn == kRqPsn + 9);
  CHECK(p.q().state == QpState::Err);
}

TEST_CASE("protocol: CNP DSCP, CNP interval, ECT and DCQCN changed at run time by set_cc", "[protocol][ecn]") {
  Proto p;
  std::vector<uint8_t> data(64, 1);
  auto w = p.hdr(wire::op::RC_WRITE_ONLY, kRqPsn);
  w.ext.reth = {p.mem->addr(), p.mem->key, 64};
  w.l3.tos = wire::kEcnCe;
  auto cnp_of = [&](const std::vector<Frame>& out) -> const Frame* {
    for (auto& f : out)
      if (f.v.h.bth.opcode == wire::op::CNP) return &f;
    return nullptr;
  };
  p.send(w, data);
  auto out = p.run(1000);
  const Frame* cnp = cnp_of(out);
  REQUIRE(cnp);
  CHECK(cnp->v.h.l3.tos == 48 << 2);  // NVIDIA's CNP DSCP, not ECN-capable
  CHECK((p.q().tx.tos() & wire::kEcnMask) == wire::kEcnEct0);

  // A CNP to the DUT with DCQCN on limits its QP's rate.
  transport::EngineConfig c = p.dut.eng->config();
  c.dcqcn = true;
  p.dut.eng->set_cc(c);
  auto n = p.hdr(wire::op::CNP, 0, false);
  n.bth.resv8a = wire::kBthBecn;
  p.send(n);
  p.run(1000);
  CHECK(p.q().rp.limited());
  CHECK(p.q().rp.counters().cnps == 1);

  c.ecn = false;  // data packets Not-ECT
  c.cnp_dscp = 10;
  c.cnp_interval_ns = 1'000;
  c.dcqcn_params.ai_rate_kbps = 7'000;
  p.dut.eng->set_cc(c);
  CHECK(p.dut.eng->config().cnp_dscp == 10);
  CHECK((p.q().tx.tos() & wire::kEcnMask) == wire::kEcnNotEct);  // the connected QP's template follows
  CHECK_FALSE(p.q().rp.limited());                                  // its reaction point restarted
  CHECK(p.q().rp.params().ai_rate_kbps == 7'000);
  // cnp off: CE is still counted but answered with no CNP.
  c.cnp = false;
  p.dut.eng->set_cc(c);
  w.bth.psn = kRqPsn + 1;
  p.send(w, data);
  out = p.run(2000);
  CHECK_FALSE(cnp_of(out));
  CHECK(p.dut.eng->counter(Ctr::CeReceived) == 2);
  // cnp on again: the new DSCP, and the 1 us interval instead of 4 us.
  c.cnp = true;
  p.dut.eng->set_cc(c);
  w.bth.psn = kRqPsn + 2;
  p.send(w, data);
  out = p.run(2000);
  cnp = cnp_of(out);
  REQUIRE(cnp);
  CHECK(cnp->v.h.l3.tos == 10 << 2);
  CHECK(p.dut.eng->counter(Ctr::CnpSent) == 2);
}

// The requester's fast pass (requester.cc) takes posted single-packet SEND and
// WRITE WQEs with one SGE (or inline, or empty); a WQE of two SGEs goes through
// the state machine. The same message posted both ways must give the same
// frame but for the PSN (and the ICRC over it), on RC and UC, with and without
// immediate data, solicited or not, inline or not, up to one MTU.
TEST_CASE("protocol: the requester's fast pass sends the state machine's frames", "[protocol][requester]") {
  for (QpType t : {QpType::RC, QpType::UC}) {
    for (WrOpcode op : {WrOpcode::Send, WrOpcode::SendImm, WrOpcode::RdmaWrite, WrOpcode::RdmaWriteImm}) {
      for (uint32_t len : {1u, 64u, 1021u, 1024u}) {
        for (int variant = 0; variant < 3; ++variant) {  // 0 plain, 1 solicited, 2 inline (up to kMaxInline)
          if (variant == 2 && len > kMaxInline) continue;
          CAPTURE(static_cast<int>(t), static_cast<int>(op), len, variant);
          Proto p(t);
          SendWr one = make_wr(1, op, *p.mem, 16, len);
          one.rdma = {0xABC000, 0x1234};
          one.imm_data = htobe32(0xC0FFEE);
          if (variant == 1) one.send_flags |= kSendSolicited;
          if (variant == 2) one.send_flags |= kSendInline;
          SendWr two = one;  // the same bytes in two SGEs: the state machine's path
          two.wr_id = 2;
          two.send_flags &= ~kSendInline;
          two.num_sge = 2;
          two.sg_list[0].length = len / 2;
          two.sg_list[1] = {one.sg_list[0].addr + len / 2, len - len / 2, p.mem->key};
          REQUIRE(p.dut.eng->post_send(p.qpn, one) == 0);
          REQUIRE(p.dut.eng->post_send(p.qpn, two) == 0);
          auto out = p.run();
          REQUIRE(out.size() == 2);
          CHECK(out[0].v.h.bth.psn == kSqPsn);
          CHECK(out[1].v.h.bth.psn == kSqPsn + 1);
          CHECK(out[0].v.h.bth.ackreq == (t == QpType::RC));
          CHECK(out[0].v.h.bth.se == (variant == 1 && op != WrOpcode::RdmaWrite));
          REQUIRE(out[0].bytes.size() == out[1].bytes.size());
          REQUIRE(out[0].v.payload_len == len);
          CHECK(std::equal(out[0].v.payload(), out[0].v.payload() + len, p.mem->mem.begin() + 16));
          // Byte for byte, the BTH's PSN and the ICRC aside.
          std::vector<uint8_t> a = out[0].bytes, b = out[1].bytes;
          const size_t psn_at = out[0].v.bth_off + 9u;  // the PSN's 3 bytes (after AckReq/resv7)
          for (size_t k = 0; k < 3; ++k) a[psn_at + k] = b[psn_at + k] = 0;
          a.resize(a.size() - 4);
          b.resize(b.size() - 4);
          CHECK(a == b);
        }
      }
    }
  }
}

// The tail-loss probe (EngineConfig::tail_timeout_ns; TCP's TLP, IRN's
// RTO_low): after tail_timeout_ns without progress the last packet sent goes
// again (and after 3x, 7x, 15x), without spending retry_cnt or moving the ACK
// deadline: a lost tail or a lost ACK, which no later packet reveals by a
// NAK, costs that instead of the local ACK timeout.
#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

constexpr uint64_t kTail = 100'000;  // 100 us
constexpr uint8_t kTimeout = 14;     // 67 ms

struct Pair {
  World w;
  Node& A;
  Node& B;
  uint32_t qa = 0, qb = 0;
  explicit Pair(uint64_t tail_ns, uint8_t retry_cnt = 7)
      : w(7, 2, config(tail_ns)), A(*w.node[0]), B(*w.node[1]) {
    QpOpts o;
    o.timeout = kTimeout;
    o.retry_cnt = retry_cnt;
    std::tie(qa, qb) = w.connect(0, 1, QpType::RC, o);
  }
  static EngineConfig config(uint64_t tail_ns) {
    EngineConfig c;
    c.tail_timeout_ns = tail_ns;
    return c;
  }
  void lose(Node& n, bool on) {
    memlink::Faults f;
    f.loss = on ? 1.0 : 0.0;
    n.port.set_faults(f);
  }
  // Posts a WRITE of len bytes from A whose frames all get lost (A's TX loses
  // everything while it leaves), then runs until its completion.
  struct Lost {
    uint64_t took = 0;  // virtual time from the post to the completion
    WcStatus status = WcStatus::GeneralErr;
    bool data_ok = false;
  };
  Lost write_with_lost_frames(uint32_t len) {
    lose(A, true);
    const uint64_t t0 = w.clock.now_ns();
    PostedWrite pw = post_write(A, B, qa, len, len);
    for (int i = 0; i < 8; ++i) A.eng->poll();  // every frame of it leaves (and is lost) at t0
    lose(A, false);
    auto got = w.wait_wcs(A, A.scq, 1);
    REQUIRE(got.size() == 1);
    return {w.clock.now_ns() - t0, got[0].status, pw.data_ok()};
  }
};

}  // namespace

TEST_CASE("tail: a lost single-packet WRITE is resent after tail_timeout_ns, not the ACK timeout") {
  for (uint64_t tail : {uint64_t{0}, kTail}) {
    CAPTURE(tail);
    Pair p(tail);
    const auto [took, status, data_ok] = p.write_with_lost_frames(64);
    CHECK(status == WcStatus::Success);
    CHECK(data_ok);
    if (tail) {
      CHECK(took >= kTail);
      CHECK(took < 2 * kTail);
      CHECK(p.A.eng->counter(Ctr::TailRetransmits) == 1);
      CHECK(p.A.eng->counter(Ctr::AckTimeouts) == 0);
      CHECK(p.A.eng->qp(p.qa)->comp.retry_left == 7);  // no retry spent
    } else {
      CHECK(took >= ack_timeout_ns(kTimeout));  // 67 ms
      CHECK(p.A.eng->counter(Ctr::TailRetransmits) == 0);
      CHECK(p.A.eng->counter(Ctr::AckTimeouts) == 1);
    }
  }
}

TEST_CASE("tail: a lost ACK makes a resend the responder answers as a duplicate") {
  Pair p(kTail);
  p.lose(p.B, true);  // B's ACK is lost
  const uint64_t t0 = p.w.clock.now_ns();
  PostedWrite pw = post_write(p.A, p.B, p.qa, 64, 3);
  REQUIRE(p.w.run([&] { return pw.data_ok() && p.B.eng->counter(Ctr::AcksSent) >= 1; }, 100000));
  p.lose(p.B, false);
  auto got = p.w.wait_wcs(p.A, p.A.scq, 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].status == WcStatus::Success);
  CHECK(p.w.clock.now_ns() - t0 < 2 * kTail);
  CHECK(p.A.eng->counter(Ctr::TailRetransmits) == 1);
  CHECK(p.B.eng->counter(Ctr::DupRequest) == 1);  // placed once, answered twice
  CHECK(pw.data_ok());
}

TEST_CASE("tail: a whole lost WRITE of 8 packets: the probe (its last) draws a NAK, go-back-N does the rest") {
  Pair p(kTail);
  const auto [took, status, data_ok] = p.write_with_lost_frames(8 * 1024);  // 8 packets at MTU 1024
  CHECK(status == WcStatus::Success);
  CHECK(data_ok);
  CHECK(took >= kTail);
  CHECK(took < 2 * kTail);
  CHECK(p.A.eng->counter(Ctr::TailRetransmits) == 1);
  CHECK(p.A.eng->counter(Ctr::SeqNakReceived) == 1);
  CHECK(p.A.eng->counter(Ctr::AckTimeouts) == 0);
}

TEST_CASE("tail: a lost READ request (8 response PSNs): the probe asks for the last, the NAK for the rest") {
  for (uint64_t tail : {uint64_t{0}, kTail}) {
    CAPTURE(tail);
    Pair p(tail);
    auto& local = p.A.buffer(8 * 1024);
    auto& remote = p.B.buffer(8 * 1024);
    fill_random(remote.mem, 11);
    p.lose(p.A, true);
    const uint64_t t0 = p.w.clock.now_ns();
    SendWr wr = make_wr(1, WrOpcode::RdmaRead, local, 0, 8 * 1024);  // 8 response PSNs at MTU 1024
    wr.rdma = {remote.addr(), remote.key};
    REQUIRE(p.A.eng->post_send(p.qa, wr) == 0);
    for (int i = 0; i < 8; ++i) p.A.eng->poll();  // the request leaves and is lost
    p.lose(p.A, false);
    auto got = p.w.wait_wcs(p.A, p.A.scq, 1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].status == WcStatus::Success);
    CHECK(local.mem == remote.mem);
    const uint64_t took = p.w.clock.now_ns() - t0;
    if (tail) {
      CHECK(took < 2 * kTail);
      CHECK(p.A.eng->counter(Ctr::TailRetransmits) == 1);
      CHECK(p.A.eng->counter(Ctr::AckTimeouts) == 0);
    } else {
      CHECK(took >= ack_timeout_ns(kTimeout));
    }
  }
}

TEST_CASE("tail: a silent peer ends in RETRY_EXC_ERR exactly when it did without the resends") {
  uint64_t took[2];
  for (int mode = 0; mode < 2; ++mode) {
    Pair p(mode == 0 ? kTail : 0, 2);
    p.lose(p.A, true);  // nothing A sends ever arrives
    const uint64_t t0 = p.w.clock.now_ns();
    post_write(p.A, p.B, p.qa, 64, 5);
    auto got = p.w.wait_wcs(p.A, p.A.scq, 1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].status == WcStatus::RetryExcErr);
    took[mode] = p.w.clock.now_ns() - t0;
    CHECK(took[mode] >= 3 * ack_timeout_ns(kTimeout));  // the first send and 2 retries, each a full timeout
    CHECK(p.A.eng->counter(Ctr::AckTimeouts) == 3);
    // T, 3T, 7T, 15T after the first send; none after the timeouts (no progress since).
    CHECK(p.A.eng->counter(Ctr::TailRetransmits) == (mode == 0 ? kMaxTailResends : 0));
  }
  CHECK(took[0] == took[1]);
}

TEST_CASE("tail: a lost resend is resent again after 3x the tail timeout") {
  Pair p(kTail);
  p.lose(p.A, true);
  const uint64_t t0 = p.w.clock.now_ns();
  PostedWrite pw = post_write(p.A, p.B, p.qa, 64, 9);
  // The first send and the resend at T are lost; the one at 3T arrives.
  REQUIRE(p.w.run([&] { return p.A.eng->counter(Ctr::TailRetransmits) == 1; }, 100000));
  for (int i = 0; i < 8; ++i) p.A.eng->poll();
  p.lose(p.A, false);
  auto got = p.w.wait_wcs(p.A, p.A.scq, 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].status == WcStatus::Success);
  CHECK(pw.data_ok());
  const uint64_t took = p.w.clock.now_ns() - t0;
  CHECK(took >= 3 * kTail);
  CHECK(took < 4 * kTail);
  CHECK(p.A.eng->counter(Ctr::TailRetransmits) == 2);
  CHECK(p.A.eng->counter(Ctr::AckTimeouts) == 0);
  CHECK(p.A.eng->qp(p.qa)->comp.retry_left == 7);
}

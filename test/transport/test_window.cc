// The RC congestion window (EngineConfig::min_inflight_pkts .. max_inflight_pkts)
// against a slow receiver: README finding 13 of app/droce-interop (ibv_srq_pingpong
// -s 1048576 against a TCG rxe) rebuilt on memlink. 16 RC QPs into one SRQ, each
// sending 1 MiB at once, into a port that takes one frame per 100 us (10,000
// frames/s) and drops what finds 256 frames already waiting (a full receive ring),
// 1 ms away. No random faults: the runs are deterministic.
#include <cstring>
#include <map>

#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

constexpr int kQps = 16;
constexpr uint32_t kMsg = 1u << 20;
constexpr uint64_t kNsPerFrame = 100'000;
constexpr uint32_t kBacklog = 256;
constexpr uint64_t kDelay = 1'000'000;  // 1 ms each way (the TCG guest answers in milliseconds)

struct Outcome {
  int sent_ok = 0, sent_retry_exc = 0, sent_other = 0;
  int recv_ok = 0;
  bool data_ok = true;
  uint64_t window_cuts = 0, timeouts = 0, retransmits = 0, overruns = 0, seq_naks = 0;
  uint64_t virtual_ms = 0;
};

// min_window == max_window: the fixed go-back-N window of before.
Outcome slow_receiver(uint32_t min_window, uint32_t max_window, uint64_t seed) {
  EngineConfig cfg;
  cfg.max_inflight_pkts = max_window;
  cfg.min_inflight_pkts = min_window;
  World w(seed, 2, cfg, 8192);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  B.port.set_rx_limit(kNsPerFrame, kBacklog);
  memlink::Faults f;
  f.delay_ns = kDelay;
  w.link.set_faults(f);
  Srq* srq = B.eng->create_srq(B.pd, 64);
  REQUIRE(srq);
  QpOpts o;
  o.timeout = 14;  // 67 ms, as ibv_srq_pingpong
  o.retry_cnt = 7;
  o.srq_b = srq;
  Node::Buf& src = A.buffer(size_t{kQps} * kMsg);
  Node::Buf& dst = B.buffer(size_t{kQps} * kMsg);
  fill_random(src.mem, seed);
  std::map<uint32_t, int> index_of_b;  // receiver QPN -> sender's message index
  std::vector<uint32_t> qa(kQps);
  for (int i = 0; i < kQps; ++i) {
    auto [a, b] = w.connect(0, 1, QpType::RC, o);
    qa[i] = a;
    index_of_b[b] = i;
  }
  for (int i = 0; i < kQps; ++i)
    REQUIRE(B.eng->post_srq_recv(srq, make_recv(1000 + i, dst, uint64_t(i) * kMsg, kMsg)) == 0);
  for (int i = 0; i < kQps; ++i)
    REQUIRE(A.eng->post_send(qa[i], make_wr(i, WrOpcode::Send, src, uint64_t(i) * kMsg, kMsg)) == 0);

  Outcome r;
  std::vector<Wc> sends, recvs;
  const uint64_t t0 = w.clock.now_ns();
  w.run(
      [&] {
        for (const Wc& c : A.drain(A.scq)) sends.push_back(c);
        for (const Wc& c : B.drain(B.rcq)) recvs.push_back(c);
        return sends.size() == kQps;
      },
      4'000'000, 30'000'000'000ull);
  w.settle();
  for (const Wc& c : B.drain(B.rcq)) recvs.push_back(c);
  r.virtual_ms = (w.clock.now_ns() - t0) / 1'000'000;
  for (const Wc& c : sends) {
    if (c.status == WcStatus::Success) {
      ++r.sent_ok;
    } else if (c.status == WcStatus::RetryExcErr) {
      ++r.sent_retry_exc;
    } else {
      ++r.sent_other;
    }
  }
  for (const Wc& c : recvs) {
    if (c.status != WcStatus::Success || c.byte_len != kMsg || !index_of_b.count(c.qp_num)) {
      r.data_ok = false;
      continue;
    }
    ++r.recv_ok;
    const uint64_t slot = c.wr_id - 1000;
    const int from = index_of_b[c.qp_num];
    if (std::memcmp(dst.mem.data() + slot * kMsg, src.mem.data() + size_t(from) * kMsg, kMsg) != 0)
      r.data_ok = false;
  }
  r.window_cuts = A.eng->counter(Ctr::WindowCuts);
  r.timeouts = A.eng->counter(Ctr::AckTimeouts);
  r.retransmits = A.eng->counter(Ctr::ReqRetransmits);
  r.seq_naks = A.eng->counter(Ctr::SeqNakReceived);
  r.overruns = w.link.counter(memlink::Counter::RxOverrun);
  return r;
}

void print(const char* what, const Outcome& r) {
  WARN(what << ": " << r.sent_ok << " sent ok, " << r.sent_retry_exc << " RETRY_EXC, " << r.recv_ok
            << " received; " << r.overruns << " frames overran the receiver, " << r.retransmits
            << " retransmitted, " << r.seq_naks << " NAK seq, " << r.timeouts << " ACK timeouts, "
            << r.window_cuts << " window cuts, " << r.virtual_ms << " ms virtual");
}

}  // namespace

TEST_CASE("window: 16 QPs x 1 MiB into a slow receiver complete with the congestion window") {
  const Outcome r = slow_receiver(8, 64, 13);  // droced's window (64) and the default floor
  print("congestion window 8..64", r);
  CHECK(r.overruns > 0);  // the receiver did overflow: the window had something to react to
  CHECK(r.window_cuts > 0);
  CHECK(r.sent_ok == kQps);
  CHECK(r.recv_ok == kQps);
  CHECK(r.data_ok);
  CHECK(r.sent_retry_exc == 0);
}

TEST_CASE("window: the same with a fixed window ends in RETRY_EXC_ERR") {
  const Outcome r = slow_receiver(64, 64, 13);  // min == max: no congestion window
  print("fixed window 64", r);
  CHECK(r.window_cuts == 0);
  CHECK(r.sent_retry_exc > 0);
  CHECK(r.sent_ok < kQps);
  const Outcome c = slow_receiver(8, 64, 13);
  CHECK(c.overruns * 10 < r.overruns);  // the window keeps the receiver from overflowing
  CHECK(c.retransmits * 4 < r.retransmits);
}

TEST_CASE("window: a clean network never cuts the window and sends nothing twice") {
  EngineConfig cfg;
  cfg.max_inflight_pkts = 64;
  World w(5, 2, cfg);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  std::vector<uint32_t> qa;
  Node::Buf& src = A.buffer(size_t{4} * kMsg);
  Node::Buf& dst = B.buffer(size_t{4} * kMsg);
  fill_random(src.mem, 5);
  for (int i = 0; i < 4; ++i) {
    auto [a, b] = w.connect(0, 1, QpType::RC);
    qa.push_back(a);
    REQUIRE(B.eng->post_recv(b, make_recv(i, dst, uint64_t(i) * kMsg, kMsg)) == 0);
  }
  for (int i = 0; i < 4; ++i)
    REQUIRE(A.eng->post_send(qa[i], make_wr(i, WrOpcode::Send, src, uint64_t(i) * kMsg, kMsg)) == 0);
  int done = 0;
  REQUIRE(w.run([&] {
    for (const Wc& c : A.drain(A.scq)) done += c.status == WcStatus::Success;
    return done == 4;
  }));
  CHECK(src.mem == dst.mem);
  CHECK(A.eng->counter(Ctr::WindowCuts) == 0);
  CHECK(A.eng->counter(Ctr::ReqRetransmits) == 0);
  for (uint32_t q : qa) CHECK(A.eng->qp(q)->req.cwnd == 64);
}

// The RC congestion window (EngineConfig::min_inflight_pkts .. max_inflight_pkts)
// against a slow receiver: README finding 13 of app/droce-interop (ibv_srq_pingpong
// -s 1048576 against a TCG rxe) rebuilt on memlink. 16 RC QPs into one SRQ, each
// sending 1 MiB at once, into a port that takes one frame per 100 us (10,000
// frames/s) and drops what finds 256 frames already waiting (a full receive ring),
// 1 ms away. No random faults: the runs are deterministic.
#include <algorithm>
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

// ---- READ re-requests against a responder that answers every copy of a READ (finding 15) ----
namespace {

constexpr uint32_t kPeerQpn = 0x77;
constexpr uint32_t kSqPsn = 500;

// The engine under test on a memlink, with a raw port as its peer (the responder).
struct ReadPeer {
  explicit ReadPeer(uint8_t timeout, uint8_t retry_cnt)
      : link(clock, 1, 1024, 4096 + 256), dut(0, link, clock, EngineConfig{}), peer(link.add_port(mac_of(1))) {
    QpInitAttr init;
    init.qp_type = QpType::RC;
    init.pd = dut.pd.handle;
    init.send_cq = dut.scq;
    init.recv_cq = dut.rcq;
    REQUIRE(dut.eng->create_qp(init, &qpn) == 0);
    QpAttr a;
    a.qp_state = QpState::Init;
    a.qp_access_flags = kAccessRemoteRead | kAccessLocalWrite;
    REQUIRE(dut.eng->modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags) == 0);
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::M1024;
    a.dest_qp_num = kPeerQpn;
    a.rq_psn = 1000;
    a.max_dest_rd_atomic = 4;
    a.ah_attr.dmac = mac_of(1);
    a.ah_attr.dgid = gid_of(1);
    REQUIRE(dut.eng->modify_qp(qpn, a,
                               kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic |
                                   kQpMinRnrTimer) == 0);
    a.qp_state = QpState::Rts;
    a.sq_psn = kSqPsn;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    REQUIRE(dut.eng->modify_qp(qpn, a,
                               kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic) == 0);
  }

  // Response packet k (PSN kSqPsn + k) of a READ of n packets, 1 KiB each: the
  // responder's bytes are (offset * 13 + 7).
  void respond(uint32_t k, uint32_t n, uint32_t from = 0) {
    wire::Headers h;
    h.l2.src = mac_of(1);
    h.l2.dst = mac_of(0);
    h.l3.src = gid_of(1);
    h.l3.dst = gid_of(0);
    h.bth.dqpn = qpn;
    h.bth.psn = kSqPsn + k;
    // Positions count from `from`, the PSN the (re-)request asked from.
    h.bth.opcode = k == from && k + 1 == n ? wire::op::RC_READ_RESPONSE_ONLY
                   : k == from             ? wire::op::RC_READ_RESPONSE_FIRST
                   : k + 1 == n            ? wire::op::RC_READ_RESPONSE_LAST
                                           : wire::op::RC_READ_RESPONSE_MIDDLE;
    h.ext.aeth = {wire::kAethAck | wire::kAethCreditInvalid, 0};
    std::vector<uint8_t> data(1024);
    for (uint32_t i = 0; i < 1024; ++i) data[i] = static_cast<uint8_t>((k * 1024 + i) * 13 + 7);
    io::PktBuf* b = nullptr;
    REQUIRE(peer.alloc_burst(&b, 1) == 1);
    b->len = static_cast<uint32_t>(wire::build_frame({b->data, b->cap}, h, data));
    REQUIRE(peer.tx_burst(&b, 1) == 1);
  }

  // Runs the engine for ns of virtual time; returns the READ requests it sent (their PSNs).
  std::vector<uint32_t> run(uint64_t ns) {
    std::vector<uint32_t> reqs;
    const uint64_t until = clock.now_ns() + ns;
    for (;;) {
      dut.eng->poll();
      io::PktBuf* bufs[32];
      uint16_t n;
      while ((n = peer.rx_burst(bufs, 32)) > 0) {
        for (uint16_t i = 0; i < n; ++i) {
          wire::PacketView v;
          REQUIRE(wire::parse_frame({bufs[i]->data, bufs[i]->len}, v) == wire::ParseError::Ok);
          if (v.h.bth.opcode == wire::op::RC_READ_REQUEST) reqs.push_back(v.h.bth.psn);
        }
        peer.free_burst(bufs, n);
      }
      if (clock.now_ns() >= until) break;
      clock.advance(std::min<uint64_t>(100'000, until - clock.now_ns()));
    }
    return reqs;
  }

  memlink::VirtualClock clock;
  memlink::Link link;
  Node dut;
  memlink::Port& peer;
  uint32_t qpn = 0;
};

}  // namespace

TEST_CASE("read retry: stale response streams neither add re-requests nor use up retries") {
  constexpr uint32_t kN = 64;  // a 64 KiB READ: PSNs 500..563
  ReadPeer p(/*timeout 67 ms*/ 14, /*retry_cnt*/ 2);
  Node::Buf& dst = p.dut.buffer(kN * 1024);
  SendWr rd = make_wr(1, WrOpcode::RdmaRead, dst, 0, kN * 1024);
  rd.rdma = {0x10000, 0x4242};
  REQUIRE(p.dut.eng->post_send(p.qpn, rd) == 0);
  auto reqs = p.run(1'000'000);
  REQUIRE(reqs == std::vector<uint32_t>{kSqPsn});
  // Stream A (the answer to the request): packets 0..9, 10 is lost, then 11..39.
  for (uint32_t k = 0; k < 10; ++k) p.respond(k, kN);
  for (uint32_t k = 11; k < 40; ++k) p.respond(k, kN);
  reqs = p.run(1'000'000);
  // Expect one re-request, from the lost packet on (not one per packet after the gap).
  CHECK(reqs == std::vector<uint32_t>{kSqPsn + 10});
  // The responder still streams A (40..63), slowly: 10 ms a packet, 240 ms in all, more
  // than the 3 x 67 ms that timeout and retry_cnt 2 allow a silent responder.
  for (uint32_t k = 40; k < kN; ++k) {
    p.respond(k, kN);
    reqs = p.run(10'000'000);
    CHECK(reqs.empty());
  }
  CHECK(p.dut.eng->counter(Ctr::AckTimeouts) == 0);
  // Then stream B (the answer to the re-request, 10..63), with a second copy of A's
  // tail (30..63) interleaved, as rxe serves two copies of a READ at once.
  for (uint32_t k = 10, s = 30; k < kN; ++k, ++s) {
    p.respond(k, kN, 10);
    if (s < kN) p.respond(s, kN);
    reqs = p.run(1'000'000);
    CHECK(reqs.empty());
  }
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::Success);
  bool same = true;
  for (uint32_t i = 0; i < kN * 1024; ++i) same &= dst.mem[i] == static_cast<uint8_t>(i * 13 + 7);
  CHECK(same);
  CHECK(p.dut.eng->counter(Ctr::AckTimeouts) == 0);
}

TEST_CASE("read retry: a silent responder still ends in RETRY_EXC_ERR") {
  ReadPeer p(/*timeout 4 ms*/ 10, /*retry_cnt*/ 2);
  Node::Buf& dst = p.dut.buffer(8 * 1024);
  SendWr rd = make_wr(1, WrOpcode::RdmaRead, dst, 0, 8 * 1024);
  rd.rdma = {0x10000, 0x4242};
  REQUIRE(p.dut.eng->post_send(p.qpn, rd) == 0);
  p.run(1'000'000);
  for (uint32_t k = 0; k < 3; ++k) p.respond(k, 8);  // progress, then nothing
  auto reqs = p.run(100'000'000);
  CHECK(reqs == std::vector<uint32_t>{kSqPsn + 3, kSqPsn + 3});  // retry_cnt 2: two re-requests
  auto wcs = p.dut.drain(p.dut.scq);
  REQUIRE(wcs.size() == 1);
  CHECK(wcs[0].status == WcStatus::RetryExcErr);
  CHECK(p.dut.eng->counter(Ctr::AckTimeouts) == 3);
}

// ---- The first window (EngineConfig::initial_inflight_pkts) and slow start ----
namespace {

struct FirstWindow {
  uint64_t first_rtt_pkts = 0;   // request packets sent before the first ACK could return
  uint32_t ssthresh_after = 0;   // the QP's ssthresh when the WRITE completed
  uint32_t cwnd_after = 0;
  uint64_t retransmits = 0, cnps = 0;
  bool data_ok = false;
};

// One 1 MiB RC WRITE (1024 packets of 1 KiB) over a link 100 us each way; the
// QP starts with a window of 4 (of at most 64). ce: every frame A sends is
// CE-marked and B answers with CNPs (DCQCN on at A).
FirstWindow first_window(bool ce) {
  EngineConfig cfg;
  cfg.max_inflight_pkts = 64;
  cfg.min_inflight_pkts = 2;
  cfg.initial_inflight_pkts = 4;
  cfg.dcqcn = ce;
  cfg.dcqcn_params.line_rate_kbps = 10'000'000;
  // Every frame marked would take the rate to the 1 Mb/s floor, 8 ms per
  // packet (past the 4.2 ms ACK timeout): keep the floor at 1 Gb/s.
  cfg.dcqcn_params.min_rate_kbps = 1'000'000;
  World w(21, 2, cfg);
  memlink::Faults f;
  f.delay_ns = 100'000;
  w.link.set_faults(f);
  if (ce) {
    f.ce_mark = 1.0;
    w.node[0]->port.set_faults(f);
  }
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  Node& A = *w.node[0];
  const uint64_t t0 = w.clock.now_ns();
  const PostedWrite pw = post_write(A, *w.node[1], qa, 1 << 20, 21);
  FirstWindow r;
  w.run([&] { return w.clock.now_ns() - t0 >= 150'000; });  // the first ACK is due at ~200 us
  r.first_rtt_pkts = A.eng->counter(Ctr::ReqPackets);
  std::vector<Wc> wcs;
  REQUIRE(w.run([&] {
    for (const Wc& c : A.drain(A.scq)) wcs.push_back(c);
    return !wcs.empty();
  }));
  CHECK(wcs[0].status == WcStatus::Success);
  r.data_ok = pw.data_ok();
  const transport::Qp* q = A.eng->qp(qa);
  r.ssthresh_after = q->comp.ssthresh;
  r.cwnd_after = q->req.cwnd;
  r.retransmits = A.eng->counter(Ctr::ReqRetransmits);
  r.cnps = q->ctr.cnp_received;
  (void)qb;
  return r;
}

}  // namespace

TEST_CASE("window: a QP starts with initial_inflight_pkts and slow start takes it to the maximum") {
  const FirstWindow r = first_window(false);
  CHECK(r.first_rtt_pkts == 4);  // the first flight: the first window, nothing more
  CHECK(r.data_ok);
  CHECK(r.retransmits == 0);
  CHECK(r.cwnd_after == 64);     // grown by slow start (ssthresh stays at the maximum)
  CHECK(r.ssthresh_after == 64);
}

TEST_CASE("window: a CNP ends slow start (the window grows one PSN per window after it)") {
  const FirstWindow r = first_window(true);
  CHECK(r.first_rtt_pkts == 4);
  CHECK(r.data_ok);
  CHECK(r.cnps > 0);
  // The first CNPs come back with the first ACKs (~200 us), when the window is
  // 4 to 8: ssthresh is set there and does not move (no loss).
  CHECK(r.ssthresh_after >= 4);
  CHECK(r.ssthresh_after <= 8);
  CHECK(r.cwnd_after < 64);  // additive from there: far below the maximum after 1024 packets
  CHECK(r.retransmits == 0);
}

// dcqcn::Params::window_ns: a QP DCQCN holds at rate r keeps at most r x
// window_ns in flight. One 1 MiB WRITE (1 KiB packets) over a link 100 us each
// way, every frame CE-marked, the rate floor 1 Gb/s (as first_window): 1 Gb/s
// x 100 us is 12500 bytes, 11 packets of 1024 + 62; the 200 us round trip would
// take 23 at that rate, so the bound, not the pacer, holds the QP.
namespace {
struct Flight {
  int32_t max_inflight_limited = 0;  // the most PSNs out at the floor, from 1 ms after reaching it
  uint64_t retransmits = 0, timeouts = 0;
  bool data_ok = false;
};
Flight rate_window(uint64_t window_ns) {
  EngineConfig cfg;
  cfg.max_inflight_pkts = 64;
  cfg.dcqcn = true;
  cfg.dcqcn_params.line_rate_kbps = 10'000'000;
  cfg.dcqcn_params.min_rate_kbps = 1'000'000;
  cfg.dcqcn_params.window_ns = window_ns;
  World w(22, 2, cfg);
  memlink::Faults f;
  f.delay_ns = 100'000;
  w.link.set_faults(f);
  f.ce_mark = 1.0;
  w.node[0]->port.set_faults(f);
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  Node& A = *w.node[0];
  const PostedWrite pw = post_write(A, *w.node[1], qa, 1 << 20, 22);
  Flight r;
  std::vector<Wc> wcs;
  const transport::Qp* q = A.eng->qp(qa);
  uint64_t floor_at = 0;  // when the rate reached the floor (what was out before drains within a round trip)
  REQUIRE(w.run([&] {
    const bool at_floor = q->rp.limited() && q->rp.current_kbps() == 1'000'000;
    if (!at_floor) floor_at = 0;
    else if (floor_at == 0) floor_at = w.clock.now_ns();
    else if (w.clock.now_ns() - floor_at >= 1'000'000)
      r.max_inflight_limited = std::max(r.max_inflight_limited, wire::psn_diff(q->req.psn, q->comp.psn));
    for (const Wc& c : A.drain(A.scq)) wcs.push_back(c);
    return !wcs.empty();
  }));
  CHECK(wcs[0].status == WcStatus::Success);
  r.data_ok = pw.data_ok();
  r.retransmits = A.eng->counter(Ctr::ReqRetransmits);
  r.timeouts = A.eng->counter(Ctr::AckTimeouts);
  (void)qb;
  return r;
}
}  // namespace

TEST_CASE("window: DCQCN's window_ns bounds a limited QP's packets in flight by its rate") {
  const Flight on = rate_window(100'000);
  const Flight off = rate_window(0);
  INFO("in flight at the floor: " << on.max_inflight_limited << " with window_ns, " << off.max_inflight_limited
                                   << " without");
  CHECK(on.data_ok);
  CHECK(on.retransmits == 0);
  CHECK(on.timeouts == 0);  // the packet that fills the bounded window asks for the ACK
  CHECK(on.max_inflight_limited > 0);
  CHECK(on.max_inflight_limited <= 12);  // 11, and one more with AckReq after a cut (requester.cc)
  CHECK(off.data_ok);
  CHECK(off.max_inflight_limited >= 20);  // the pacer alone: 55 (23 in the round trip, and AckReq every 32)
}

TEST_CASE("window: initial_inflight_pkts is ignored with a fixed window and capped at the maximum") {
  EngineConfig cfg;
  cfg.max_inflight_pkts = 32;
  cfg.min_inflight_pkts = 32;
  cfg.initial_inflight_pkts = 4;
  {
    World w(3, 2, cfg);
    auto [qa, qb] = w.connect(0, 1, QpType::RC);
    CHECK(w.node[0]->eng->qp(qa)->req.cwnd == 32);
    (void)qb;
  }
  cfg.min_inflight_pkts = 8;
  cfg.initial_inflight_pkts = 1000;
  World w(3, 2, cfg);
  auto [qa, qb] = w.connect(0, 1, QpType::RC);
  CHECK(w.node[0]->eng->qp(qa)->req.cwnd == 32);
  (void)qb;
}

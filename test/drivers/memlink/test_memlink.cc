// drivers/memlink: delivery by MAC, virtual-time delay, reordering, loss,
// duplication, corruption (fails ICRC), CE marking, pool accounting, line
// rate, the bottleneck queue (rate, RED/ECN marking, tail drop).
#include <catch2/catch.hpp>

#include <vector>

#include "memlink/memlink.h"
#include "wire/packet.h"

using namespace droce;

namespace {
wire::MacAddr mac(int i) { return {2, 0, 0, 0, 0, static_cast<uint8_t>(i)}; }

// A 158-byte RC SEND frame (100 bytes of payload, ECT(0)) from p to port `to`, built in a buffer of p's pool.
io::PktBuf* frame(memlink::Port& p, int to, uint32_t psn) {
  wire::Headers h;
  h.l2.src = p.mac();
  h.l2.dst = mac(to);
  h.l3.src = wire::gid_from_ipv4(0x0A000001);
  h.l3.dst = wire::gid_from_ipv4(0x0A000002);
  h.l3.tos = wire::kEcnEct0;
  h.bth.opcode = wire::op::RC_SEND_ONLY;
  h.bth.psn = psn;
  std::vector<uint8_t> payload(100, static_cast<uint8_t>(psn));
  io::PktBuf* b;
  REQUIRE(p.alloc_burst(&b, 1) == 1);
  b->len = static_cast<uint32_t>(wire::build_frame({b->data, b->cap}, h, payload));
  return b;
}

void send(memlink::Port& p, int to, uint32_t psn) {
  io::PktBuf* b = frame(p, to, psn);
  REQUIRE(p.tx_burst(&b, 1) == 1);
}

std::vector<uint32_t> receive(memlink::Port& p, int* icrc_bad = nullptr, int* ce = nullptr) {
  std::vector<uint32_t> psns;
  io::PktBuf* bufs[32];
  uint16_t n;
  while ((n = p.rx_burst(bufs, 32)) > 0) {
    for (uint16_t i = 0; i < n; ++i) {
      wire::PacketView v;
      const auto e = wire::parse_frame({bufs[i]->data, bufs[i]->len}, v);
      if (e == wire::ParseError::IcrcMismatch) {
        if (icrc_bad) ++*icrc_bad;
        continue;
      }
      REQUIRE(e == wire::ParseError::Ok);
      if (ce && v.h.l3.ecn() == wire::kEcnCe) ++*ce;
      psns.push_back(v.h.bth.psn);
    }
    p.free_burst(bufs, n);
  }
  return psns;
}
}  // namespace

TEST_CASE("memlink: delivery, delay, routing, pool", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 1, 64, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  memlink::Faults f;
  f.delay_ns = 1000;
  a.set_faults(f);
  for (uint32_t i = 0; i < 10; ++i) send(a, 2, i);
  send(a, 9, 99);  // no such MAC
  CHECK(receive(b).empty());  // not before the delay
  clock.advance(1000);
  const auto got = receive(b);
  REQUIRE(got.size() == 10);
  for (uint32_t i = 0; i < 10; ++i) CHECK(got[i] == i);
  CHECK(link.counter(memlink::Counter::NoRoute) == 1);
  CHECK(link.free_bufs() == 64);  // every buffer came back
  // Pool exhaustion is counted, not fatal.
  io::PktBuf* bufs[80];
  CHECK(a.alloc_burst(bufs, 80) == 64);
  CHECK(link.counter(memlink::Counter::PoolEmpty) == 1);
  a.free_burst(bufs, 64);
}

TEST_CASE("memlink: seeded faults are counted and corruption fails ICRC", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 12345, 4096, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  memlink::Faults f;
  f.loss = 0.1;
  f.reorder = 0.1;
  f.duplicate = 0.1;
  f.corrupt = 0.1;
  f.ce_mark = 0.1;
  a.set_faults(f);
  const int n = 2000;
  for (int i = 0; i < n; ++i) send(a, 2, static_cast<uint32_t>(i));
  clock.advance(1'000'000);
  int bad = 0, ce = 0;
  const auto got = receive(b, &bad, &ce);
  const auto C = [&](memlink::Counter c) { return static_cast<int>(link.counter(c)); };
  CHECK(C(memlink::Counter::Lost) > 100);
  CHECK(C(memlink::Counter::Lost) < 300);
  CHECK(C(memlink::Counter::Duplicated) > 100);
  CHECK(C(memlink::Counter::Reordered) > 100);
  CHECK(C(memlink::Counter::CeMarked) > 100);
  CHECK(bad == C(memlink::Counter::Corrupted));  // every damaged frame fails ICRC
  CHECK(ce >= C(memlink::Counter::CeMarked) - bad);  // marked frames arrive marked (unless damaged)
  CHECK(ce <= C(memlink::Counter::CeMarked) + C(memlink::Counter::Duplicated));
  CHECK(static_cast<int>(got.size()) + bad == n - C(memlink::Counter::Lost) + C(memlink::Counter::Duplicated));
  bool out_of_order = false;
  for (size_t i = 1; i < got.size(); ++i) out_of_order |= got[i] < got[i - 1];
  CHECK(out_of_order);
  CHECK(link.free_bufs() == 4096);
  // Same seed, same faults.
  memlink::VirtualClock clock2;
  memlink::Link link2(clock2, 12345, 4096, 2048);
  auto& a2 = link2.add_port(mac(1));
  auto& b2 = link2.add_port(mac(2));
  a2.set_faults(f);
  for (int i = 0; i < n; ++i) send(a2, 2, static_cast<uint32_t>(i));
  clock2.advance(1'000'000);
  CHECK(receive(b2) == got);
}

// The bottleneck of the queue tests: 100-byte payloads make 158-byte frames,
// and 1.264 Gb/s drains one per microsecond; Kmin 300 and Kmax 600 bytes with
// Pmax 0, so only a queue past Kmax marks (deterministic); a 100 KB limit.
static memlink::Bottleneck small_bottleneck() {
  memlink::Bottleneck bn;
  bn.rate_bps = 158ull * 8 * 1'000'000;
  bn.kmin_bytes = 300;
  bn.kmax_bytes = 600;
  bn.pmax = 0;
  bn.limit_bytes = 100'000;
  return bn;
}

TEST_CASE("memlink: a bottleneck queue drains at its rate, marks above Kmax and drops past its limit", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 1, 64, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  memlink::Bottleneck bn = small_bottleneck();
  b.set_bottleneck(bn);
  const uint64_t t0 = clock.now_ns();
  for (uint32_t i = 0; i < 10; ++i) send(a, 2, i);
  CHECK(b.bottleneck_queue_bytes(t0 + 0) == 1580);
  CHECK(b.bottleneck_max_queue_bytes() == 1580);
  clock.set(t0 + 999);
  CHECK(receive(b).empty());
  clock.set(t0 + 1000);
  CHECK(receive(b) == std::vector<uint32_t>{0});
  clock.set(t0 + 5000);
  CHECK(receive(b).size() == 4);
  CHECK(b.bottleneck_queue_bytes(t0 + 5000) == 790);
  int ce = 0;
  clock.set(t0 + 10'000);
  CHECK(receive(b, nullptr, &ce).size() == 5);
  // Frames found 0, 158, ..., 1422 bytes queued: the six at 632 and above were marked.
  CHECK(link.counter(memlink::Counter::BottleneckMarked) == 6);
  CHECK(ce == 5);  // the sixth (frame 4, 632 bytes ahead of it) arrived by 5000
  CHECK(b.bottleneck_queue_bytes(t0 + 10'000) == 0);

  // Tail drop: a 790-byte limit takes five frames of a burst of ten.
  bn.limit_bytes = 790;
  bn.ecn = false;
  b.set_bottleneck(bn);
  for (uint32_t i = 0; i < 10; ++i) send(a, 2, 100 + i);
  clock.set(t0 + 20'000);
  CHECK(receive(b).size() == 5);
  CHECK(link.counter(memlink::Counter::BottleneckDrop) == 5);
  CHECK(link.counter(memlink::Counter::BottleneckMarked) == 6);  // ecn off: none more
  CHECK(link.free_bufs() == 64);
}

TEST_CASE("memlink: a bottleneck that marks on departure judges the queue a frame leaves behind", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 1, 64, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  memlink::Bottleneck bn = small_bottleneck();
  bn.mark_dequeue = true;
  b.set_bottleneck(bn);
  const uint64_t t0 = clock.now_ns();
  for (uint32_t i = 0; i < 10; ++i) send(a, 2, i);
  CHECK(link.counter(memlink::Counter::BottleneckMarked) == 0);  // nothing judged on arrival
  // Frame i leaves at (i + 1) us with 9 - i frames (158 bytes each) behind it:
  // frames 0..5 leave 632 bytes or more (>= Kmax) and are marked, 6..9 not
  // (on arrival it would be the other way round: 4..9 found 632+ ahead).
  int ce = 0;
  clock.set(t0 + 1000);
  CHECK(receive(b, nullptr, &ce) == std::vector<uint32_t>{0});
  CHECK(ce == 1);
  CHECK(link.counter(memlink::Counter::BottleneckMarked) == 1);
  ce = 0;
  clock.set(t0 + 6000);
  CHECK(receive(b, nullptr, &ce).size() == 5);
  CHECK(ce == 5);
  ce = 0;
  clock.set(t0 + 10'000);
  CHECK(receive(b, nullptr, &ce).size() == 4);
  CHECK(ce == 0);
  CHECK(link.counter(memlink::Counter::BottleneckMarked) == 6);
  // ecn off: nothing marked on departure either.
  bn.ecn = false;
  b.set_bottleneck(bn);
  for (uint32_t i = 0; i < 10; ++i) send(a, 2, 100 + i);
  clock.set(t0 + 30'000);
  CHECK(receive(b).size() == 10);
  CHECK(link.counter(memlink::Counter::BottleneckMarked) == 6);
  CHECK(link.free_bufs() == 64);
}

// PFC on the bottleneck (Xoff 5 frames, Xon 2): a burst of ten is taken up to
// Xoff, the sender keeps the rest until the queue has drained to Xon (the time
// tx_ready_ns gives), nothing is dropped and every frame arrives in order.
TEST_CASE("memlink: PFC pauses the sender past Xoff until Xon, nothing is dropped", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 1, 64, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  memlink::Bottleneck bn = small_bottleneck();
  bn.pfc_xoff_bytes = 5 * 158;
  bn.pfc_xon_bytes = 2 * 158;
  b.set_bottleneck(bn);
  io::PktBuf* bufs[10];
  for (uint32_t i = 0; i < 10; ++i) bufs[i] = frame(a, 2, i);
  const uint64_t t0 = clock.now_ns();
  CHECK(a.tx_burst(bufs, 10) == 5);  // 790 bytes queued: Xoff
  CHECK(link.counter(memlink::Counter::PfcPause) == 1);
  CHECK(a.tx_ready_ns() == t0 + 3000);  // the queue is at Xon (2 frames) then
  clock.set(t0 + 2999);
  CHECK(a.tx_burst(bufs + 5, 5) == 0);
  CHECK(link.counter(memlink::Counter::PfcPause) == 1);  // still the same pause
  std::vector<uint32_t> got = receive(b);
  CHECK(got.size() == 2);
  clock.set(t0 + 3000);
  CHECK(a.tx_burst(bufs + 5, 5) == 3);  // 316 + 3 x 158 = Xoff again
  CHECK(link.counter(memlink::Counter::PfcPause) == 2);
  clock.set(a.tx_ready_ns());
  CHECK(a.tx_burst(bufs + 8, 2) == 2);
  clock.set(t0 + 100'000);
  for (uint32_t p : receive(b)) got.push_back(p);
  CHECK(got == std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(link.counter(memlink::Counter::BottleneckDrop) == 0);
  CHECK(link.free_bufs() == 64);
}

TEST_CASE("memlink: a port's line rate spaces the frames it sends", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 1, 64, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  a.set_tx_rate(158ull * 8 * 1'000'000 / 2);  // 2 us a frame
  const uint64_t t0 = clock.now_ns();
  for (uint32_t i = 0; i < 3; ++i) send(a, 2, i);
  clock.set(t0 + 1999);
  CHECK(receive(b).empty());
  clock.set(t0 + 2000);
  CHECK(receive(b).size() == 1);
  clock.set(t0 + 6000);
  CHECK(receive(b).size() == 2);
}

TEST_CASE("memlink: a port's TX backlog bound takes a burst only while it fits", "[memlink]") {
  memlink::VirtualClock clock;
  memlink::Link link(clock, 1, 64, 2048);
  auto& a = link.add_port(mac(1));
  auto& b = link.add_port(mac(2));
  a.set_tx_rate(158ull * 8 * 1'000'000 / 2, 3 * 158);  // 2 us a 158-byte frame, three frames of ring
  const uint64_t t0 = clock.now_ns();
  for (uint32_t i = 0; i < 3; ++i) send(a, 2, i);  // the line is busy until t0 + 6000
  CHECK(a.tx_ready_ns() == 0);
  // Two more frames, built in place.
  io::PktBuf* bufs[2];
  for (uint32_t i = 0; i < 2; ++i) {
    bufs[i] = frame(a, 2, 3 + i);
    REQUIRE(bufs[i]->len == 158);
  }
  CHECK(a.tx_burst(bufs, 2) == 0);
  // A frame fits once at most 2 * 158 bytes (4000 ns) wait for the line: t0 + 2000.
  CHECK(a.tx_ready_ns() == t0 + 2000);
  clock.set(t0 + 1999);
  CHECK(a.tx_burst(bufs, 2) == 0);
  clock.set(t0 + 2000);
  CHECK(a.tx_burst(bufs, 2) == 1);  // one fits, the second waits again
  CHECK(a.tx_ready_ns() == t0 + 4000);
  clock.set(t0 + 4000);
  CHECK(a.tx_burst(&bufs[1], 1) == 1);
  CHECK(a.tx_ready_ns() == 0);
  clock.set(t0 + 7999);
  CHECK(receive(b) == std::vector<uint32_t>{0, 1, 2});
  clock.set(t0 + 10'000);  // on the wire from 6000 and 8000, each 2000 ns long
  CHECK(receive(b) == std::vector<uint32_t>{3, 4});
  CHECK(link.free_bufs() == 64);
}

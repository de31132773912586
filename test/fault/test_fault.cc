// lib/fault: drop, duplicate, reorder, corrupt on bursts through a small
// in-memory PacketIo; rates, determinism, run-time changes, counters.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fault/fault_injector.h"
#include "wire/packet.h"

using namespace droce;
using config::FaultDir;
using config::FaultKind;
using fault::FaultInjector;
using stats::PortCounter;

namespace {

// A pool of fixed buffers; tracks what is free to catch leaks and double frees.
class PoolIo : public io::PacketIo {
 public:
  explicit PoolIo(size_t n) : store_(n * 256), bufs_(n) {
    for (size_t i = 0; i < n; ++i) {
      bufs_[i].data = &store_[i * 256];
      bufs_[i].cap = 256;
      free_.push_back(&bufs_[i]);
    }
  }
  uint16_t rx_burst(io::PktBuf**, uint16_t) noexcept override { return 0; }
  uint16_t alloc_burst(io::PktBuf** b, uint16_t n) noexcept override {
    uint16_t k = 0;
    while (k < n && !free_.empty()) {
      b[k++] = free_.back();
      free_.pop_back();
    }
    return k;
  }
  uint16_t tx_burst(io::PktBuf**, uint16_t) noexcept override { return 0; }
  void free_burst(io::PktBuf** b, uint16_t n) noexcept override {
    for (uint16_t i = 0; i < n; ++i) {
      if (std::find(free_.begin(), free_.end(), b[i]) != free_.end()) double_free = true;
      free_.push_back(b[i]);
    }
  }
  uint32_t buf_capacity() const noexcept override { return 256; }
  wire::MacAddr mac() const noexcept override { return {}; }

  // A frame of 64 bytes whose bytes 14..17 hold `seq`.
  io::PktBuf* frame(uint32_t seq) {
    io::PktBuf* b = nullptr;
    if (alloc_burst(&b, 1) != 1) FAIL("pool empty");
    b->len = 64;
    std::memset(b->data, 0xab, 64);
    std::memcpy(b->data + 14, &seq, 4);
    return b;
  }
  static uint32_t seq(const io::PktBuf* b) {
    uint32_t s;
    std::memcpy(&s, b->data + 14, 4);
    return s;
  }
  size_t free_count() const { return free_.size(); }
  bool double_free = false;

 private:
  std::vector<uint8_t> store_;
  std::vector<io::PktBuf> bufs_;
  std::vector<io::PktBuf*> free_;
};

std::vector<config::PortConfig> one_port() {
  config::PortConfig p;
  p.name = "p0";
  return {p};
}

// Sends `total` frames through in bursts of `burst`; returns the output order.
std::vector<uint32_t> run(FaultInjector& fi, PoolIo& io, uint32_t total, uint16_t burst = 32) {
  std::vector<uint32_t> out;
  io::PktBuf* b[FaultInjector::kMaxBurst];
  for (uint32_t s = 0; s < total;) {
    uint16_t n = 0;
    while (n < burst && s < total) b[n++] = io.frame(s++);
    uint16_t k = fi.apply(io, b, n, FaultInjector::kMaxBurst);
    for (uint16_t i = 0; i < k; ++i) out.push_back(PoolIo::seq(b[i]));
    io.free_burst(b, k);
  }
  uint16_t k = fi.flush(b, 1);
  for (uint16_t i = 0; i < k; ++i) out.push_back(PoolIo::seq(b[i]));
  io.free_burst(b, k);
  return out;
}

}  // namespace

TEST_CASE("no faults: the burst passes untouched", "[fault]") {
  config::FaultTable t(one_port());
  stats::CounterBlock<PortCounter> c;
  FaultInjector fi(t[0], FaultDir::rx, 0, &c);
  PoolIo io(64);
  auto out = run(fi, io, 100);
  REQUIRE(out.size() == 100);
  for (uint32_t i = 0; i < 100; ++i) CHECK(out[i] == i);
  CHECK(io.free_count() == 64);
  CHECK(c.get(PortCounter::fault_rx_drop) == 0);
}

TEST_CASE("drop: every frame at p=1, about p of them otherwise", "[fault]") {
  config::FaultTable t(one_port());
  stats::CounterBlock<PortCounter> c;
  PoolIo io(600);
  t[0].set(FaultDir::tx, FaultKind::drop, 1.0);
  t[0].publish();
  FaultInjector all(t[0], FaultDir::tx, 0, &c);
  CHECK(run(all, io, 100).empty());
  CHECK(c.get(PortCounter::fault_tx_drop) == 100);
  CHECK(io.free_count() == 600);  // dropped frames were freed
  CHECK_FALSE(io.double_free);

  for (double p : {0.01, 0.05}) {
    config::FaultTable t2(one_port());
    t2[0].set(FaultDir::rx, FaultKind::drop, p);
    t2[0].publish();
    stats::CounterBlock<PortCounter> c2;
    FaultInjector fi(t2[0], FaultDir::rx, 1, &c2);
    const uint32_t n = 200000;
    auto out = run(fi, io, n, 256);
    double rate = 1.0 - static_cast<double>(out.size()) / n;
    INFO("p " << p << " measured " << rate);
    CHECK(std::abs(rate - p) < 0.004);  // binomial sigma is 0.0005 at p = 0.05
    CHECK(c2.get(PortCounter::fault_rx_drop) == n - out.size());
    CHECK(std::is_sorted(out.begin(), out.end()));
  }
  CHECK(io.free_count() == 600);
}

TEST_CASE("duplicate: an identical copy follows; no buffers means no copy", "[fault]") {
  config::FaultTable t(one_port());
  t[0].set(FaultDir::rx, FaultKind::duplicate, 1.0);
  t[0].publish();
  stats::CounterBlock<PortCounter> c;
  FaultInjector fi(t[0], FaultDir::rx, 0, &c);
  PoolIo io(64);
  auto out = run(fi, io, 20, 8);
  REQUIRE(out.size() == 40);
  for (uint32_t i = 0; i < 20; ++i) {
    CHECK(out[2 * i] == i);
    CHECK(out[2 * i + 1] == i);
  }
  CHECK(c.get(PortCounter::fault_rx_duplicate) == 20);
  CHECK(io.free_count() == 64);

  // The burst cap leaves room for the input frames first.
  io::PktBuf* b[8];
  for (uint32_t i = 0; i < 4; ++i) b[i] = io.frame(i);
  uint16_t k = fi.apply(io, b, 4, 6);
  CHECK(k == 6);
  io.free_burst(b, k);

  // Pool exhausted: frames still pass, without copies.
  PoolIo tiny(4);
  io::PktBuf* f[4];
  for (uint32_t i = 0; i < 4; ++i) f[i] = tiny.frame(i);
  CHECK(fi.apply(tiny, f, 4, 8) == 4);
  tiny.free_burst(f, 4);
  CHECK(tiny.free_count() == 4);
}

TEST_CASE("corrupt: exactly one bit flipped after the Ethernet header", "[fault]") {
  config::FaultTable t(one_port());
  t[0].set(FaultDir::tx, FaultKind::corrupt, 1.0);
  t[0].publish();
  stats::CounterBlock<PortCounter> c;
  FaultInjector fi(t[0], FaultDir::tx, 0, &c);
  PoolIo io(8);
  for (int round = 0; round < 200; ++round) {
    io::PktBuf* b = io.frame(0x01020304);
    std::vector<uint8_t> before(b->data, b->data + b->len);
    REQUIRE(fi.apply(io, &b, 1, 1) == 1);
    int bits = 0;
    for (uint32_t i = 0; i < b->len; ++i) {
      uint8_t d = before[i] ^ b->data[i];
      if (d) CHECK(i >= 14);
      bits += __builtin_popcount(d);
    }
    CHECK(bits == 1);
    io.free_burst(&b, 1);
  }
  CHECK(c.get(PortCounter::fault_tx_corrupt) == 200);
}

TEST_CASE("reorder: a held frame goes out after the next one, nothing lost", "[fault]") {
  config::FaultTable t(one_port());
  t[0].set(FaultDir::rx, FaultKind::reorder, 0.3);
  t[0].publish();
  stats::CounterBlock<PortCounter> c;
  FaultInjector fi(t[0], FaultDir::rx, 0, &c);
  PoolIo io(128);
  auto out = run(fi, io, 5000, 16);
  REQUIRE(out.size() == 5000);
  CHECK(std::set<uint32_t>(out.begin(), out.end()).size() == 5000);
  size_t swapped = 0;
  for (size_t i = 1; i < out.size(); ++i) swapped += out[i] < out[i - 1] ? 1 : 0;
  CHECK(swapped == c.get(PortCounter::fault_rx_reorder));
  CHECK(swapped > 500);
  CHECK(io.free_count() == 128);

  // A held frame with nothing behind it is released late, on its own.
  t[0].set(FaultDir::rx, FaultKind::reorder, 1.0);
  t[0].publish();
  io::PktBuf* b[4];
  b[0] = io.frame(7);
  CHECK(fi.apply(io, b, 1, 4) == 0);
  CHECK(fi.holding());
  uint16_t k = 0;
  for (uint32_t i = 0; i < FaultInjector::kHoldCalls && k == 0; ++i) k = fi.apply(io, b, 0, 4);
  REQUIRE(k == 1);
  CHECK(PoolIo::seq(b[0]) == 7);
  io.free_burst(b, 1);
}

TEST_CASE("same seed, same faults; other stream or seed, other faults; run-time change", "[fault]") {
  auto pattern = [](uint64_t seed, uint64_t stream) {
    config::FaultTable t(one_port());
    t[0].set(FaultDir::rx, FaultKind::drop, 0.5);
    t[0].seed = seed;
    t[0].publish();
    FaultInjector fi(t[0], FaultDir::rx, stream, nullptr);
    PoolIo io(64);
    return run(fi, io, 300);
  };
  CHECK(pattern(1, 0) == pattern(1, 0));
  CHECK(pattern(1, 0) != pattern(1, 1));
  CHECK(pattern(1, 0) != pattern(2, 0));

  config::FaultTable t(one_port());
  stats::CounterBlock<PortCounter> c;
  FaultInjector fi(t[0], FaultDir::tx, 0, &c);
  PoolIo io(64);
  CHECK(run(fi, io, 50).size() == 50);
  t[0].set(FaultDir::tx, FaultKind::drop, 1.0);  // as `fault set` does
  t[0].publish();
  CHECK(run(fi, io, 50).empty());
  t[0].set(FaultDir::tx, FaultKind::drop, 0.0);
  t[0].publish();
  CHECK(run(fi, io, 50).size() == 50);
  CHECK(c.get(PortCounter::fault_tx_drop) == 50);
}

namespace {
struct ManualClock : io::Clock {
  uint64_t t = 1'000'000;
  uint64_t now_ns() const noexcept override { return t; }
};
// An IPv4 frame of `len` bytes (ECT(0) when ect), its sequence number at the end.
io::PktBuf* ip_frame(PoolIo& io, uint32_t seq, uint32_t len, bool ect) {
  io::PktBuf* b = nullptr;
  if (io.alloc_burst(&b, 1) != 1) FAIL("pool empty");
  std::memset(b->data, 0, len);
  b->len = len;
  b->data[12] = 0x08;
  b->data[14] = 0x45;
  b->data[15] = ect ? wire::kEcnEct0 : 0;
  b->data[23] = 17;
  std::memcpy(b->data + len - 4, &seq, 4);
  return b;
}
// The bottleneck of the bottleneck-mode tests: 1 Gb/s (a 200-byte frame every
// 1.6 us), RED between 2000 and 8000 bytes up to pmax, tail drop at 16000.
fault::Bottleneck tx_bottleneck(double pmax) {
  fault::Bottleneck bn;
  bn.rate_bps = 1'000'000'000;
  bn.kmin_bytes = 2'000;
  bn.kmax_bytes = 8'000;
  bn.pmax = pmax;
  bn.limit_bytes = 16'000;
  return bn;
}

uint32_t tail_seq(const io::PktBuf* b) {
  uint32_t s;
  std::memcpy(&s, b->data + b->len - 4, 4);
  return s;
}

// The PFC tests' TX injector: tx_bottleneck(0) with Xoff 4000 and Xon 1000
// bytes, on a pool of 256 buffers and a manual clock.
struct PfcTx {
  static config::PortFaults& publish(config::PortFaults& pf) {
    fault::Bottleneck bn = tx_bottleneck(0);
    bn.pfc_xoff_bytes = 4'000;
    bn.pfc_xon_bytes = 1'000;
    pf.set_bottleneck(FaultDir::tx, bn);
    pf.publish();
    return pf;
  }
  PfcTx() : f(publish(pf), FaultDir::tx, 1, &ctr) { f.set_clock(&clk); }
  PoolIo io{256};
  ManualClock clk;
  config::PortFaults pf;
  stats::CounterBlock<PortCounter> ctr;
  FaultInjector f;
};
}  // namespace

TEST_CASE("bottleneck mode: drained at its rate, RED marks between kmin and kmax, tail drop at the limit", "[fault][bottleneck]") {
  PoolIo io(256);
  ManualClock clk;
  config::PortFaults pf;
  const fault::Bottleneck bn = tx_bottleneck(0.5);
  pf.set_bottleneck(FaultDir::tx, bn);
  pf.publish();
  stats::CounterBlock<PortCounter> ctr;
  FaultInjector f(pf, FaultDir::tx, 1, &ctr);
  f.set_clock(&clk);

  // 100 frames at once: frame i finds i x 200 bytes queued.
  std::vector<io::PktBuf*> burst;
  for (uint32_t i = 0; i < 100; ++i) burst.push_back(ip_frame(io, i, 200, true));
  CHECK(f.apply(io, burst.data(), 100, 128) == 0);  // nothing has left yet
  CHECK(ctr.get(PortCounter::fault_tx_bn_drop) == 20);  // 80 x 200 = the 16000-byte limit
  CHECK(ctr.get(PortCounter::fault_tx_bn_max_queue) == 16'000);
  CHECK(f.bottleneck_frames() == 80);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 16'000);
  const uint64_t marks = ctr.get(PortCounter::fault_tx_bn_mark);
  CHECK(marks >= 40);  // frames 40..79 found >= kmax queued: always marked
  CHECK(marks <= 69);  // frames 0..10 found <= kmin: never
  // The queue as seen from outside: the 80 frames queued, 40..79 found >= kmax,
  // frame i found i x 200 bytes (the 20 dropped count in none of them).
  CHECK(ctr.get(PortCounter::fault_tx_bn_frames) == 80);
  CHECK(ctr.get(PortCounter::fault_tx_bn_over_kmax) == 40);
  CHECK(ctr.get(PortCounter::fault_tx_bn_queue_sum) == 200 * (79 * 80 / 2));
  CHECK(ctr.get(PortCounter::fault_rx_bn_frames) == 0);

  // 16 us later: the first 10 have left, in order.
  io::PktBuf* out[128];
  clk.t += 16'000;
  uint16_t k = f.release(out, 128);
  REQUIRE(k == 10);
  for (uint16_t i = 0; i < k; ++i) {
    CHECK(tail_seq(out[i]) == i);
    CHECK((out[i]->data[15] & 3) == wire::kEcnEct0);  // below kmin: unmarked
  }
  io.free_burst(out, k);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 14'000);
  clk.t += 1'000'000;
  k = f.release(out, 128);
  REQUIRE(k == 70);
  uint64_t ce = 0;
  for (uint16_t i = 0; i < k; ++i) {
    CHECK(tail_seq(out[i]) == 10u + i);
    if ((out[i]->data[15] & 3) == 3) {
      ++ce;
      CHECK(wire::ipv4_checksum(out[i]->data + 14, 20) == 0);  // header checksum redone (sums to zero)
    }
    if (i + 10 >= 40) CHECK((out[i]->data[15] & 3) == 3);
  }
  CHECK(ce == marks);
  io.free_burst(out, k);
  CHECK(f.bottleneck_frames() == 0);
  // A frame on the drained queue finds it empty: counted, not over kmax.
  io::PktBuf* one = ip_frame(io, 100, 200, true);
  CHECK(f.apply(io, &one, 1, 128) == 0);
  CHECK(ctr.get(PortCounter::fault_tx_bn_frames) == 81);
  CHECK(ctr.get(PortCounter::fault_tx_bn_over_kmax) == 40);
  CHECK(ctr.get(PortCounter::fault_tx_bn_queue_sum) == 200 * (79 * 80 / 2));
  clk.t += 1'000'000;
  REQUIRE(f.release(out, 128) == 1);
  io.free_burst(out, 1);
  CHECK(io.free_count() == 256);
}

TEST_CASE("bottleneck mode marking on departure: RED on the queue a frame leaves behind", "[fault][bottleneck]") {
  PoolIo io(256);
  ManualClock clk;
  config::PortFaults pf;
  fault::Bottleneck bn = tx_bottleneck(0);  // only past kmax: deterministic
  bn.mark_dequeue = true;
  pf.set_bottleneck(FaultDir::tx, bn);
  pf.publish();
  stats::CounterBlock<PortCounter> ctr;
  FaultInjector f(pf, FaultDir::tx, 1, &ctr);
  f.set_clock(&clk);
  // 50 frames at once: none judged on arrival; frame i leaves at 1.6 (i + 1) us
  // with (49 - i) x 200 bytes behind it: frames 0..9 leave >= 8000 (kmax) behind.
  std::vector<io::PktBuf*> burst;
  for (uint32_t i = 0; i < 50; ++i) burst.push_back(ip_frame(io, i, 200, true));
  CHECK(f.apply(io, burst.data(), 50, 128) == 0);
  CHECK(ctr.get(PortCounter::fault_tx_bn_mark) == 0);
  io::PktBuf* out[128];
  clk.t += 1'000'000;
  const uint16_t k = f.release(out, 128);
  REQUIRE(k == 50);
  for (uint16_t i = 0; i < k; ++i) {
    CHECK(tail_seq(out[i]) == i);
    CHECK((out[i]->data[15] & 3) == (i < 10 ? 3 : wire::kEcnEct0));
  }
  CHECK(ctr.get(PortCounter::fault_tx_bn_mark) == 10);
  io.free_burst(out, k);
  CHECK(io.free_count() == 256);
}

// PFC: 1 Gb/s, Xoff 4000 bytes, Xon 1000: of a burst of 30 200-byte frames the
// queue takes 20 (4000 bytes) and pauses the sender; it takes nothing more until
// it has drained to 1000 bytes (15 frames gone, 24 us), then up to Xoff again.
// Nothing is dropped, the frames leave in order, one pause is counted per Xoff.
TEST_CASE("bottleneck mode with PFC: the sender is paused past Xoff until Xon, nothing is dropped", "[fault][bottleneck]") {
  PfcTx t;
  PoolIo& io = t.io;
  ManualClock& clk = t.clk;
  FaultInjector& f = t.f;
  auto& ctr = t.ctr;
  std::vector<io::PktBuf*> frames;
  for (uint32_t i = 0; i < 30; ++i) frames.push_back(ip_frame(io, i, 200, true));
  uint16_t n = f.pfc_admit(frames.data(), 30);
  CHECK(n == 20);
  CHECK(ctr.get(PortCounter::fault_tx_bn_pause) == 1);
  CHECK(f.apply(io, frames.data(), n, 128) == 0);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 4'000);
  io::PktBuf** rest = frames.data() + 20;
  io::PktBuf* out[128];
  uint32_t next_seq = 0;
  auto drain = [&] {
    const uint16_t k = f.release(out, 128);
    for (uint16_t i = 0; i < k; ++i) CHECK(tail_seq(out[i]) == next_seq++);
    io.free_burst(out, k);
  };
  // 20 us: 12 frames gone, 1500 bytes left (above Xon): still paused.
  clk.t += 20'000;
  drain();
  CHECK(f.pfc_admit(rest, 10) == 0);
  CHECK(ctr.get(PortCounter::fault_tx_bn_pause) == 1);  // the same pause
  // 24 us: 15 gone, 1000 bytes left: resumed; 15 frames fit under Xoff, 10 offered.
  clk.t += 4'000;
  drain();
  n = f.pfc_admit(rest, 10);
  CHECK(n == 10);
  CHECK(f.apply(io, rest, n, 128) == 0);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 3'000);
  clk.t += 1'000'000;
  drain();
  CHECK(next_seq == 30);
  CHECK(ctr.get(PortCounter::fault_tx_bn_drop) == 0);
  CHECK(ctr.get(PortCounter::fault_tx_bn_pause) == 1);
  CHECK(io.free_count() == 256);
}

TEST_CASE("bottleneck mode: frames the device refused go back to the head, in order, not counted twice", "[fault][bottleneck]") {
  // A switch queue whose egress is busy keeps its frames (DemuxIo hands the
  // frames a full TX ring refused back with requeue_front instead of dropping
  // them: with PFC the class is lossless).
  PfcTx t;  // 1 Gb/s: a 200-byte frame drains in 1600 ns
  PoolIo& io = t.io;
  ManualClock& clk = t.clk;
  FaultInjector& f = t.f;
  auto& ctr = t.ctr;
  std::vector<io::PktBuf*> frames;
  for (uint32_t i = 0; i < 10; ++i) frames.push_back(ip_frame(io, i, 200, true));
  REQUIRE(f.pfc_admit(frames.data(), 10) == 10);
  REQUIRE(f.apply(io, frames.data(), 10, 128) == 0);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 2'000);
  io::PktBuf* out[128];
  clk.t += 10'000;  // six frames due, 750 bytes left
  uint16_t k = f.release(out, 128);
  REQUIRE(k == 6);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 750);
  // The device takes two; the other four go back, due at once: the queue
  // holds at least their 800 bytes.
  io.free_burst(out, 2);
  CHECK(f.requeue_front(out + 2, 4) == 4);
  CHECK(f.bottleneck_frames() == 8);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 800);
  k = f.release(out, 128);
  REQUIRE(k == 4);
  for (uint16_t i = 0; i < k; ++i) CHECK(tail_seq(out[i]) == 2u + i);
  // Refused again: the same frames, not counted twice.
  CHECK(f.requeue_front(out, 4) == 4);
  CHECK(f.bottleneck_queue_bytes(clk.t) == 800);
  k = f.release(out, 128);
  REQUIRE(k == 4);
  for (uint16_t i = 0; i < k; ++i) CHECK(tail_seq(out[i]) == 2u + i);
  io.free_burst(out, k);
  clk.t += 1'000'000;
  k = f.release(out, 128);
  REQUIRE(k == 4);
  for (uint16_t i = 0; i < k; ++i) CHECK(tail_seq(out[i]) == 6u + i);
  io.free_burst(out, k);
  CHECK(f.bottleneck_frames() == 0);
  CHECK(ctr.get(PortCounter::fault_tx_bn_drop) == 0);
  CHECK(io.free_count() == 256);
  CHECK_FALSE(io.double_free);
  // Without a bottleneck nothing goes back: the caller drops (tx_drop_full).
  config::PortFaults none;
  none.publish();
  FaultInjector g(none, FaultDir::tx, 1, &ctr);
  g.set_clock(&clk);
  io::PktBuf* one = ip_frame(io, 99, 200, true);
  CHECK(g.requeue_front(&one, 1) == 0);
  io.free_burst(&one, 1);
}

TEST_CASE("bottleneck mode: Not-ECT frames are never marked, frames/s rate, switched off mid-queue", "[fault][bottleneck]") {
  PoolIo io(256);
  ManualClock clk;
  config::PortFaults pf;
  fault::Bottleneck bn;
  bn.rate_pps = 1'000'000;  // 1 us per frame, whatever its size
  bn.kmin_bytes = 0;
  bn.kmax_bytes = 1'000;
  bn.limit_bytes = 100'000;
  pf.set_bottleneck(FaultDir::rx, bn);
  pf.publish();
  stats::CounterBlock<PortCounter> ctr;
  FaultInjector f(pf, FaultDir::rx, 0, &ctr);
  f.set_clock(&clk);
  std::vector<io::PktBuf*> burst;
  for (uint32_t i = 0; i < 50; ++i) burst.push_back(ip_frame(io, i, 100 + i, false));
  CHECK(f.apply(io, burst.data(), 50, 128) == 0);
  CHECK(ctr.get(PortCounter::fault_rx_bn_mark) == 0);
  CHECK(ctr.get(PortCounter::fault_rx_bn_drop) == 0);
  clk.t += 5'000;  // 5 frames at 1 Mpps
  io::PktBuf* out[128];
  uint16_t k = f.apply(io, out, 0, 128);
  CHECK(k == 5);
  io.free_burst(out, k);
  // Switched off: the rest leave at the next call.
  pf.set_bottleneck(FaultDir::rx, fault::Bottleneck{});
  pf.publish();
  k = f.apply(io, out, 0, 128);
  CHECK(k == 45);
  for (uint16_t i = 0; i < k; ++i) CHECK((out[i]->data[15] & 3) == 0);
  io.free_burst(out, k);
  CHECK(io.free_count() == 256);
}

TEST_CASE("bottleneck thresholds: the first broken order rule, with its key, value and bound", "[fault][bottleneck]") {
  fault::Bottleneck b;  // defaults: kmin 5000 < kmax 200000 <= limit 1000000, no PFC
  CHECK(fault::bottleneck_check(b).key == nullptr);
  b.kmin_bytes = b.kmax_bytes;
  auto e = fault::bottleneck_check(b);
  REQUIRE(e.key != nullptr);
  CHECK(std::string(e.key) == "kmin_bytes");
  CHECK((e.value == 200'000 && e.bound == 200'000));
  b.kmin_bytes = 5'000;
  b.kmax_bytes = 2'000'000;
  CHECK(std::string(fault::bottleneck_check(b).key) == "kmax_bytes");
  b.kmax_bytes = 200'000;
  b.pfc_xoff_bytes = 300'000;
  b.pfc_xon_bytes = 300'000;  // xon must be below xoff
  e = fault::bottleneck_check(b);
  CHECK(std::string(e.key) == "pfc_xon_bytes");
  CHECK(e.bound == 300'000);
  b.pfc_xon_bytes = 0;  // resume at an empty queue: allowed
  CHECK(fault::bottleneck_check(b).key == nullptr);
  b.pfc_xoff_bytes = 1'000'001;  // past the limit: the lossless class would tail-drop
  e = fault::bottleneck_check(b);
  CHECK(std::string(e.key) == "pfc_xoff_bytes");
  CHECK(e.bound == 1'000'000);
  b.pfc_xoff_bytes = 0;
  b.pfc_xon_bytes = 900'000;  // without PFC the xon threshold is not looked at
  CHECK(fault::bottleneck_check(b).key == nullptr);
}

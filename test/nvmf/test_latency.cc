// lib/nvmf/latency.h: the log2 latency histogram of a queue (bucket edges,
// percentiles against exact ones on random data), and a Queue's histogram
// fed from capsule arrival to the response SEND's completion (AERs, which
// wait for an event, left out).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "nvmf/latency.h"
#include "nvmf/queue.h"

using namespace droce::nvmf;

TEST_CASE("latency histogram: log2 buckets and their edges", "[nvmf][latency]") {
  using H = QueueLatency;
  CHECK(H::bucket_of(0) == 0);
  CHECK(H::bucket_of(1) == 1);
  CHECK(H::bucket_of(2) == 2);
  CHECK(H::bucket_of(3) == 2);
  CHECK(H::bucket_of(4) == 3);
  CHECK(H::bucket_of(1023) == 10);
  CHECK(H::bucket_of(1024) == 11);
  CHECK(H::bucket_of(uint64_t{1} << 37) == 38);
  CHECK(H::bucket_of(uint64_t{1} << 38) == 39);
  CHECK(H::bucket_of(UINT64_MAX) == H::kBuckets - 1);
  CHECK(H::upper_edge(0) == 0);
  CHECK(H::upper_edge(1) == 1);
  CHECK(H::upper_edge(10) == 1023);
  CHECK(H::upper_edge(H::kBuckets - 1) == UINT64_MAX);
  for (size_t b = 1; b + 1 < H::kBuckets; ++b) {  // each edge value lands in its bucket, the next one above
    CHECK(H::bucket_of(H::upper_edge(b)) == b);
    CHECK(H::bucket_of(H::upper_edge(b) + 1) == b + 1);
  }
}

TEST_CASE("latency histogram: percentiles", "[nvmf][latency]") {
  QueueLatency h;
  CHECK(h.percentile(0.5) == 0);  // empty
  CHECK(h.mean() == 0);
  for (int i = 0; i < 99; ++i) h.add(1000);  // bucket [512, 1023]
  h.add(1'000'000);                            // bucket [524288, 1048575]
  CHECK(h.count == 100);
  CHECK(h.max_ns == 1'000'000);
  CHECK(h.mean() == (99 * 1000 + 1'000'000) / 100);
  CHECK(h.percentile(0.5) == 1023);
  CHECK(h.percentile(0.99) == 1023);        // the 99th of 100 is still 1000
  CHECK(h.percentile(0.999) == 1'000'000);  // the 100th: the bucket's edge capped by the largest seen
  CHECK(h.percentile(1.0) == 1'000'000);
  CHECK(h.percentile(0.0) == 1023);         // rank 1
  QueueLatency one;
  one.add(5);
  CHECK(one.percentile(0.5) == 5);  // capped by max

  // Random latencies over 7 decades: each percentile is at least the exact one and under twice it.
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> d(9.0, 2.0);
  QueueLatency r;
  std::vector<uint64_t> v;
  for (int i = 0; i < 20000; ++i) {
    uint64_t x = static_cast<uint64_t>(d(rng));
    r.add(x);
    v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  for (double p : {0.01, 0.5, 0.9, 0.99, 0.999, 1.0}) {
    const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
    const uint64_t exact = v[rank - 1];
    INFO("p " << p << " exact " << exact << " histogram " << r.percentile(p));
    CHECK(r.percentile(p) >= exact);
    CHECK(r.percentile(p) <= std::max<uint64_t>(2 * exact, 1));
  }
}

TEST_CASE("latency histogram: a queue measures capsule arrival to the response SEND's completion", "[nvmf][latency]") {
  constexpr const char* kSub = "nqn.2026-12.org.droce:lat0";
  constexpr const char* kHost = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";
  TargetConfig tc;
  tc.in_capsule_data = 8192;
  Target t(tc);
  Subsystem& s = t.add_subsystem(kSub, "LAT0", false);
  s.allow_host(kHost);
  std::vector<uint8_t> mem(4 * 4096);
  Queue q(t, QueueConfig{0, 4, 4096}, mem);
  // Answers every SEND the queue asks for with a completion at `now`.
  auto complete = [&](uint64_t now) {
    std::array<Action, 8> a;
    size_t n = q.take_actions(a);
    for (size_t i = 0; i < n; ++i)
      if (a[i].kind == Action::Send) q.on_complete(a[i].slot, Action::Send, true, now);
    return n;
  };
  auto capsule = [&](Sqe sq, std::span<const uint8_t> icd = {}) {
    sq.flags = 0x40;
    std::vector<uint8_t> b(64 + icd.size());
    encode_sqe(std::span<uint8_t, 64>(b.data(), 64), sq);
    std::copy(icd.begin(), icd.end(), b.begin() + 64);
    return b;
  };
  Sqe c;
  c.opcode = 0x7f;
  c.cid = 1;
  encode_connect(c, ConnectCmd{0, 0, 3, 0, 0});
  encode_sgl(c.dptr, Sgl{SglKind::InCapsule, 0, 1024});
  ConnectData cd;
  cd.cntlid = 0xffff;
  cd.subnqn = kSub;
  cd.hostnqn = kHost;
  std::array<uint8_t, 1024> cdb;
  encode_connect_data(cdb, cd);
  q.on_capsule(capsule(c, cdb), 1'000);
  REQUIRE(complete(6'000) == 1);  // 5000 ns
  Sqe ka;
  ka.opcode = 0x18;  // Keep Alive
  ka.cid = 2;
  encode_sgl(ka.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
  q.on_capsule(capsule(ka), 10'000);
  REQUIRE(complete(10'300) == 1);  // 300 ns
  // CC.EN and the namespace-changed notice enabled (answered in the same pass: 0 ns each).
  Sqe ps;
  ps.opcode = 0x7f;
  ps.cid = 4;
  encode_sgl(ps.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  q.on_capsule(capsule(ps), 15'000);
  REQUIRE(complete(15'000) == 1);
  Sqe aec;
  aec.opcode = 0x09;
  aec.cid = 5;
  aec.cdw10 = 0x0b;
  aec.cdw11 = 1u << 8;
  encode_sgl(aec.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
  q.on_capsule(capsule(aec), 16'000);
  REQUIRE(complete(16'000) == 1);
  // An AER waits for an event: not a latency (it would swamp the admin queue's tail).
  Sqe aer;
  aer.opcode = 0x0c;
  aer.cid = 3;
  encode_sgl(aer.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
  q.on_capsule(capsule(aer), 20'000);
  CHECK(complete(20'000) == 0);
  q.controller()->notify_ns_changed(1);
  q.poll();
  REQUIRE(complete(90'000'000'000) == 1);
  const QueueLatency& h = q.counters().latency;
  CHECK(q.counters().commands == 5);
  CHECK(h.count == 4);
  CHECK(h.bucket[0] == 2);
  CHECK(h.bucket[QueueLatency::bucket_of(5000)] == 1);
  CHECK(h.bucket[QueueLatency::bucket_of(300)] == 1);
  CHECK(h.max_ns == 5000);
  CHECK(h.percentile(0.5) == 0);
  CHECK(h.percentile(0.75) == 511);
  CHECK(h.percentile(0.99) == 5000);
}

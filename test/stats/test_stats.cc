// lib/stats: single-writer per-core blocks, registry snapshots, concurrency.
#include <catch2/catch.hpp>

#include <thread>

#include "stats/fairness.h"
#include "stats/groups.h"
#include "stats/stats.h"

using namespace droce::stats;

namespace {
#define TEST_COUNTERS(X) X(packets) X(bytes) X(naks)
DROCE_COUNTERS(TestCounter, "test", TEST_COUNTERS);
// Same group name, different counters: must be refused.
#define OTHER_COUNTERS(X) X(a) X(b)
DROCE_COUNTERS(OtherCounter, "test", OTHER_COUNTERS);
}  // namespace

TEST_CASE("enum and name table declared once stay in step", "[stats]") {
  STATIC_REQUIRE(static_cast<size_t>(TestCounter::kCount) == 3);
  CHECK(TestCounter_names[1] == "bytes");
  CHECK(TestCounter_group.name == "test");
  CHECK(TestCounter_group.names.size() == 3);
  CHECK(PortCounter_group.names.size() == static_cast<size_t>(PortCounter::kCount));
  CHECK(PortCounter_names[static_cast<size_t>(PortCounter::rx_drop_bad_icrc)] == "rx_drop_bad_icrc");
  CHECK(CoreCounter_group.name == "core");
}

TEST_CASE("blocks are cache-line aligned and do not share lines", "[stats]") {
  STATIC_REQUIRE(alignof(CounterBlock<TestCounter>) == kCacheLine);
  STATIC_REQUIRE(sizeof(CounterBlock<TestCounter>) % kCacheLine == 0);
  PerCore<PortCounter> pc(3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(reinterpret_cast<uintptr_t>(&pc[i]) % kCacheLine == 0);
  }
  CHECK(reinterpret_cast<uintptr_t>(&pc[1]) - reinterpret_cast<uintptr_t>(&pc[0]) >= sizeof(CounterBlock<PortCounter>));
}

TEST_CASE("registry sums shards per instance and filters", "[stats]") {
  Registry reg;
  PerCore<TestCounter> p0(2), p1(2);
  p0[0].add(TestCounter::packets, 3);
  p0[1].add(TestCounter::packets, 4);
  p0[1].add(TestCounter::bytes, 100);
  p1[0].add(TestCounter::naks);
  CounterBlock<CoreCounter> core0;
  core0.set(CoreCounter::ring_occupancy, 17);
  core0.set(CoreCounter::ring_occupancy, 5);  // gauge: last value wins
  auto id0 = reg.add(TestCounter_group, "p0", p0);
  reg.add(TestCounter_group, "p1", p1);
  reg.add(CoreCounter_group, "0", core0);

  Snapshot s = reg.snapshot();
  REQUIRE(s.size() == 2);
  CHECK(s[0].group == "test");
  CHECK(s[0].names == std::vector<std::string>{"packets", "bytes", "naks"});
  REQUIRE(s[0].instances.size() == 2);
  CHECK(s[0].instances[0].name == "p0");
  CHECK(s[0].instances[0].values == std::vector<uint64_t>{7, 100, 0});
  CHECK(s[0].instances[1].values == std::vector<uint64_t>{0, 0, 1});
  CHECK(s[1].group == "core");
  CHECK(s[1].instances[0].values[static_cast<size_t>(CoreCounter::ring_occupancy)] == 5);

  Snapshot only = reg.snapshot("core");
  REQUIRE(only.size() == 1);
  CHECK(only[0].group == "core");
  CHECK(reg.snapshot("nothing").empty());

  Snapshot nz = reg.snapshot("", true);
  REQUIRE(nz.size() == 2);
  CHECK(nz[0].names == std::vector<std::string>{"packets", "bytes", "naks"});
  CHECK(nz[1].names == std::vector<std::string>{"ring_occupancy"});
  CHECK(nz[1].instances[0].values == std::vector<uint64_t>{5});

  Snapshot per = reg.snapshot("test", true, true);
  REQUIRE(per[0].instances[0].shards.size() == 2);
  CHECK(per[0].instances[0].shards[0] == std::vector<uint64_t>{3, 0, 0});
  CHECK(per[0].instances[0].shards[1] == std::vector<uint64_t>{4, 100, 0});
  CHECK(per[0].instances[0].shard_labels == std::vector<std::string>{"0", "1"});
  CHECK(s[0].instances[0].shards.empty());  // only when asked for
  CHECK(reg.label_shards(id0, {"lcore3", "lcore5"}));
  CHECK_FALSE(reg.label_shards(id0, {"one"}));
  CHECK(reg.snapshot("test", false, true)[0].instances[0].shard_labels == std::vector<std::string>{"lcore3", "lcore5"});

  CHECK(reg.remove(id0));
  CHECK_FALSE(reg.remove(id0));
  CHECK(reg.snapshot("test")[0].instances.size() == 1);
  CHECK(reg.groups() == std::vector<std::string>{"test", "core"});
}

TEST_CASE("registry refuses conflicting groups and duplicate instances", "[stats]") {
  Registry reg;
  CounterBlock<TestCounter> a, b;
  CounterBlock<OtherCounter> o;
  reg.add(TestCounter_group, "x", a);
  CHECK_THROWS_WITH(reg.add(TestCounter_group, "x", b), Catch::Contains("test x is already registered"));
  CHECK_THROWS_WITH(reg.add(OtherCounter_group, "y", o), Catch::Contains("already registered with other counters"));
  CHECK_THROWS_WITH(reg.add(OtherCounter_group, "y", a), Catch::Contains("has 2 names but its blocks hold 3"));
}

TEST_CASE("concurrent single writers, reader sees monotonic exact totals", "[stats]") {
  constexpr size_t kCores = 3;
  constexpr uint64_t kIters = 200000;
  Registry reg;
  PerCore<TestCounter> blocks(kCores);
  reg.add(TestCounter_group, "p0", blocks);
  std::atomic<bool> go{false};
  std::vector<std::thread> writers;
  for (size_t c = 0; c < kCores; ++c) {
    writers.emplace_back([&, c] {
      while (!go.load()) std::this_thread::yield();
      for (uint64_t i = 0; i < kIters; ++i) {
        blocks[c].add(TestCounter::packets);
        blocks[c].add(TestCounter::bytes, 64);
      }
    });
  }
  go = true;
  uint64_t last = 0;
  bool monotonic = true;
  for (int i = 0; i < 2000; ++i) {
    uint64_t v = reg.snapshot("test")[0].instances[0].values[0];
    monotonic = monotonic && v >= last;
    last = v;
  }
  for (auto& t : writers) t.join();
  CHECK(monotonic);
  auto s = reg.snapshot("test")[0].instances[0].values;
  CHECK(s[0] == kCores * kIters);
  CHECK(s[1] == kCores * kIters * 64);
  CHECK(blocks.sum(TestCounter::packets) == kCores * kIters);
}

TEST_CASE("plain uint64_t counters of another module register too", "[stats]") {
  // Like an engine's own block and a per-QP struct of uint64_t fields.
  struct alignas(64) EngineCounters {
    uint64_t v[3] = {};
  } eng;
  struct QpCtr {
    uint64_t retransmits = 0, timeouts = 0;
  } qp;
  static_assert(sizeof(QpCtr) == 2 * sizeof(uint64_t));
  static const std::string_view qp_names[] = {"retransmits", "timeouts"};
  static const GroupDesc qp_group{"qp", qp_names};
  Registry reg;
  reg.add_plain(TestCounter_group, "engine0", {eng.v});
  auto id = reg.add_plain(qp_group, "17", {&qp.retransmits});
  CHECK(reg.label_shards(id, {"lcore1"}));
  eng.v[1] = 1500;
  qp.timeouts = 2;
  std::thread writer([&] {
    for (int i = 0; i < 100000; ++i) __atomic_store_n(&qp.retransmits, qp.retransmits + 1, __ATOMIC_RELAXED);
  });
  writer.join();
  auto s = reg.snapshot("", false, true);
  REQUIRE(s.size() == 2);
  CHECK(s[0].instances[0].values == std::vector<uint64_t>{0, 1500, 0});
  CHECK(s[1].group == "qp");
  CHECK(s[1].instances[0].values == std::vector<uint64_t>{100000, 2});
  CHECK(s[1].instances[0].shard_labels == std::vector<std::string>{"lcore1"});
  CHECK(reg.remove(id));
}

TEST_CASE("stats: Jain's fairness index") {
  const double eq[] = {3, 3, 3, 3};
  CHECK(jain_index(eq) == Approx(1.0));
  const double one[] = {10, 0, 0, 0};
  CHECK(jain_index(one) == Approx(0.25));  // 1/n
  const double two[] = {1, 0.6};           // 2.56 / (2 * 1.36)
  CHECK(jain_index(two) == Approx(2.56 / 2.72));
  CHECK(jain_index(std::span<const double>{}) == 1.0);
  const double zero[] = {0, 0};
  CHECK(jain_index(zero) == 1.0);
}

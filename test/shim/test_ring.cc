// The SPSC ring of droce_shm_abi.h: semantics in one thread, wraparound of
// the free-running indexes, full/empty, corrupt peers, then stress between
// two threads and between two processes (fork + memfd) with a checksum.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "shim/ring.h"
#include "shim/shm.h"

using namespace droce::shim;

extern "C" {
struct droce_abi_sizes {
  unsigned long region_hdr, ring_hdr, send_wqe, recv_wqe, cqe, sge, off_cons, off_armed, off_sge;
};
void droce_abi_sizes_c(struct droce_abi_sizes* s);
}

TEST_CASE("ABI header has the same layout in C and C++", "[shim][abi]") {
  droce_abi_sizes s{};
  droce_abi_sizes_c(&s);
  CHECK(s.region_hdr == sizeof(droce_shm_region_hdr));
  CHECK(s.ring_hdr == sizeof(droce_shm_ring_hdr));
  CHECK(s.send_wqe == sizeof(droce_shm_send_wqe));
  CHECK(s.recv_wqe == sizeof(droce_shm_recv_wqe));
  CHECK(s.cqe == sizeof(droce_shm_cqe));
  CHECK(s.sge == sizeof(droce_shm_sge));
  CHECK(s.off_cons == offsetof(droce_shm_ring_hdr, cons));
  CHECK(s.off_armed == offsetof(droce_shm_ring_hdr, armed));
  CHECK(s.off_sge == offsetof(droce_shm_send_wqe, u));
  CHECK(sizeof(droce_shm_send_wqe) % DROCE_SHM_CACHELINE == 0);
  CHECK(alignof(droce_shm_cqe) == DROCE_SHM_CACHELINE);
}

namespace {
struct TestRing {
  explicit TestRing(uint32_t entries, uint32_t start = 0) {
    RingSpec spec{DROCE_SHM_RING_CQ, entries, sizeof(droce_shm_cqe), 0, 0};
    REQUIRE(create_object_region(region, DROCE_SHM_REGION_CQ, 7, &spec, 1) == 0);
    REQUIRE(check_object_region(region, DROCE_SHM_REGION_CQ, &spec, 1));
    hdr = region_ring(region, 0);
    hdr->prod = hdr->cons = start;
    REQUIRE(p.attach(hdr, entries));
    REQUIRE(c.attach(hdr, entries));
  }
  ShmRegion region;
  droce_shm_ring_hdr* hdr;
  RingProducer<droce_shm_cqe> p;
  RingConsumer<droce_shm_cqe> c;
};
droce_shm_cqe cqe(uint64_t id) {
  droce_shm_cqe e{};
  e.wr_id = id;
  e.byte_len = static_cast<uint32_t>(id * 3);
  return e;
}
}  // namespace

TEST_CASE("ring: empty, fill to full, drain in FIFO order", "[shim][ring]") {
  TestRing r(8);
  droce_shm_cqe out{};
  CHECK(r.c.available() == 0);
  CHECK_FALSE(r.c.try_pop(&out));
  CHECK(r.p.free_slots() == 8);
  for (uint64_t i = 0; i < 8; i++) REQUIRE(r.p.try_push(cqe(i)));
  CHECK(r.p.free_slots() == 0);
  CHECK_FALSE(r.p.try_push(cqe(99)));
  CHECK(r.c.available() == 8);
  for (uint64_t i = 0; i < 8; i++) {
    REQUIRE(r.c.try_pop(&out));
    CHECK(out.wr_id == i);
    CHECK(out.byte_len == i * 3);
  }
  CHECK(r.c.available() == 0);
  CHECK(r.p.free_slots() == 8);
}

TEST_CASE("ring: nothing is visible before publish; batches publish at once", "[shim][ring]") {
  TestRing r(16);
  for (uint32_t i = 0; i < 5; i++) *r.p.slot(i) = cqe(100 + i);
  CHECK(r.c.available() == 0);  // filled, not published
  r.p.publish(5);
  CHECK(r.hdr->prod == 5);
  REQUIRE(r.c.available() == 5);
  for (uint32_t i = 0; i < 5; i++) CHECK(r.c.slot(i)->wr_id == 100 + i);
  CHECK(r.hdr->cons == 0);  // not released yet
  r.c.release(5);
  CHECK(r.hdr->cons == 5);
}

TEST_CASE("ring: free-running indexes wrap at 2^32", "[shim][ring]") {
  TestRing r(4, 0xFFFFFFFAu);
  droce_shm_cqe out{};
  uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 10; round++) {
    while (r.p.try_push(cqe(next_in))) next_in++;
    CHECK(r.hdr->prod - r.hdr->cons == 4);
    while (r.c.try_pop(&out)) CHECK(out.wr_id == next_out++);
  }
  CHECK(next_in == 40);
  CHECK(next_out == 40);
  CHECK(r.hdr->prod == 0xFFFFFFFAu + 40);  // wrapped past zero
}

TEST_CASE("ring: an index moved past the ring size marks the peer corrupt", "[shim][ring]") {
  TestRing r(8);
  r.hdr->prod = 9;  // a hostile producer claims 9 entries in an 8-entry ring
  CHECK(r.c.available() == 0);
  CHECK(r.c.corrupt());
  TestRing r2(8);
  r2.hdr->cons = 0x80000000u;  // a consumer index nowhere near the producer's
  for (int i = 0; i < 9; i++) r2.p.try_push(cqe(1));
  CHECK(r2.p.free_slots() == 0);
  CHECK(r2.p.corrupt());
  CHECK_FALSE(RingProducer<droce_shm_cqe>().attach(r.hdr, 6));  // not a power of two
}

TEST_CASE("ring: CQ arm is consumed by exactly one completion", "[shim][ring]") {
  TestRing r(8);
  CHECK_FALSE(cq_consume_arm(r.hdr, false));
  cq_arm(r.hdr, false);
  CHECK(cq_consume_arm(r.hdr, false));
  CHECK_FALSE(cq_consume_arm(r.hdr, false));
  CHECK(cq_events(r.hdr) == 1);
  cq_arm(r.hdr, true);  // solicited only
  CHECK_FALSE(cq_consume_arm(r.hdr, false));
  CHECK(cq_consume_arm(r.hdr, true));
  CHECK(cq_events(r.hdr) == 2);
}

namespace {
// Producer and consumer loops for the stress tests. Batches of up to 32.
uint64_t produce(droce_shm_ring_hdr* h, uint32_t entries, uint64_t n) {
  RingProducer<droce_shm_cqe> p;
  if (!p.attach(h, entries)) return 0;
  uint64_t sum = 0, i = 0;
  uint32_t spins = 0;
  while (i < n) {
    uint32_t f = p.free_slots(32);
    if (f == 0) {
      if (++spins % 64 == 0) std::this_thread::yield();
      continue;
    }
    uint32_t b = static_cast<uint32_t>(std::min<uint64_t>({f, 32, n - i}));
    for (uint32_t k = 0; k < b; k++) {
      droce_shm_cqe* e = p.slot(k);
      uint64_t v = (i + k) * 0x9E3779B97F4A7C15ull;
      e->wr_id = v;
      e->byte_len = static_cast<uint32_t>(i + k);
      sum += v;
    }
    p.publish(b);
    i += b;
  }
  return sum;
}
// Returns the checksum, or 0 on an out-of-order entry; stops at the deadline.
uint64_t consume(droce_shm_ring_hdr* h, uint32_t entries, uint64_t n,
                 std::chrono::steady_clock::time_point deadline) {
  RingConsumer<droce_shm_cqe> c;
  if (!c.attach(h, entries)) return 0;
  uint64_t sum = 0, i = 0;
  uint32_t spins = 0;
  while (i < n) {
    uint32_t a = c.available();
    if (a == 0) {
      if (++spins % 64 == 0) {
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() > deadline) return 0;
      }
      continue;
    }
    for (uint32_t k = 0; k < a; k++) {
      const droce_shm_cqe* e = c.slot(k);
      if (e->byte_len != static_cast<uint32_t>(i + k) || e->wr_id != (i + k) * 0x9E3779B97F4A7C15ull)
        return 0;
      sum += e->wr_id;
    }
    c.release(a);
    i += a;
  }
  return sum;
}
uint64_t expected_sum(uint64_t n) {
  uint64_t s = 0;
  for (uint64_t i = 0; i < n; i++) s += i * 0x9E3779B97F4A7C15ull;
  return s;
}
}  // namespace

TEST_CASE("ring: two threads move millions of entries in order", "[shim][ring][stress]") {
  constexpr uint64_t kN = 4'000'000;
  TestRing r(256, 0xFFFF0000u);  // wraps the indexes during the run
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  uint64_t got = 0;
  auto t0 = std::chrono::steady_clock::now();
  std::thread cons([&] { got = consume(r.hdr, 256, kN, deadline); });
  uint64_t sent = produce(r.hdr, 256, kN);
  cons.join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("ring two-thread: " << kN / s / 1e6 << " M entries/s (64 B entries)");
  CHECK(sent == expected_sum(kN));
  CHECK(got == sent);
}

TEST_CASE("ring: two processes over a memfd move millions of entries", "[shim][ring][stress]") {
  constexpr uint64_t kN = 2'000'000;
  TestRing r(512);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child: map the same memfd anew (as a client would after SCM_RIGHTS)
    // and produce.
    ShmRegion mine;
    if (mine.map(dup(r.region.fd()), r.region.size()) != 0) _exit(2);
    uint64_t s = produce(region_ring(mine, 0), 512, kN);
    _exit(s == expected_sum(kN) ? 0 : 3);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  uint64_t got = consume(r.hdr, 512, kN, deadline);
  if (got == 0) kill(pid, SIGKILL);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(got == expected_sum(kN));
}

namespace {
// The daemon's side of the doorbell protocol (droce_shm_abi.h, "doorbells";
// EngineShimBackend's poller) without the sweep: a ring is polled only while
// active; after `park_after` empty polls it parks, and only its doorbell bit
// makes it active again. A posted entry the doorbell fails to announce is
// never seen (the caller's deadline ends the wait).
struct ParkingConsumer {
  droce_shm_doorbell* db;
  uint32_t bit;
  RingConsumer<droce_shm_send_wqe> ring;
  bool active = true;
  uint32_t quiet = 0, park_after;
  uint64_t parks = 0, wakeups = 0;
  ParkingConsumer(droce_shm_doorbell* d, uint32_t b, droce_shm_ring_hdr* h, uint32_t entries, uint32_t pa)
      : db(d), bit(b), park_after(pa) {
    REQUIRE(ring.attach(h, entries));
  }
  // One turn; returns the entries consumed (their wr_id must run 0, 1, ...).
  uint32_t turn(uint64_t& next, bool& order_ok) {
    std::atomic_ref<uint64_t> summary(db->summary);
    if (summary.load(std::memory_order_relaxed) != 0) {
      uint64_t words = summary.exchange(0, std::memory_order_acquire);
      if (words & (uint64_t{1} << (bit / 64))) {
        uint64_t bits = std::atomic_ref<uint64_t>(db->word[bit / 64]).exchange(0, std::memory_order_acquire);
        if ((bits & (uint64_t{1} << (bit % 64))) && !active) {
          ring.unpark();
          active = true;
          quiet = 0;
          wakeups++;
        }
      }
    }
    if (!active) return 0;
    const uint32_t n = ring.available();
    for (uint32_t i = 0; i < n; i++) order_ok &= ring.slot(i)->wr_id == next++;
    if (n) {
      ring.release(n);
      quiet = 0;
    } else if (++quiet >= park_after) {
      if (ring.park() == 0) {
        active = false;
        parks++;
      } else {
        ring.unpark();
        quiet = 0;
      }
    }
    return n;
  }
};

struct DoorbellRing {
  explicit DoorbellRing(uint32_t entries, uint32_t bit) {
    RingSpec spec{DROCE_SHM_RING_SEND, entries, sizeof(droce_shm_send_wqe), 1, 0};
    REQUIRE(create_object_region(region, DROCE_SHM_REGION_QP, 9, &spec, 1) == 0);
    hdr = region_ring(region, 0);
    CHECK(hdr->db_bit == DROCE_SHM_DB_NONE);  // ring_init: no bit until the daemon gives one
    RingConsumer<droce_shm_send_wqe> daemon;
    REQUIRE(daemon.attach(hdr, entries));
    daemon.set_doorbell_bit(bit);
    db = static_cast<droce_shm_doorbell*>(aligned_alloc(64, sizeof(droce_shm_doorbell)));
    std::memset(static_cast<void*>(db), 0, sizeof(*db));
  }
  ~DoorbellRing() { free(db); }
  ShmRegion region;
  droce_shm_ring_hdr* hdr;
  droce_shm_doorbell* db;
};
}  // namespace

TEST_CASE("doorbell: a parked ring is woken by its bit; without the doorbell the post is missed",
          "[shim][ring][doorbell]") {
  DoorbellRing r(64, 70);  // bit 70: word 1, bit 6
  RingProducer<droce_shm_send_wqe> client;
  REQUIRE(client.attach(r.hdr, 64, false, r.db));
  CHECK(client.has_doorbell());
  ParkingConsumer d(r.db, 70, r.hdr, 64, 4);
  uint64_t next = 0;
  bool ok = true;
  for (int i = 0; i < 4; i++) d.turn(next, ok);
  CHECK_FALSE(d.active);  // parked after 4 empty turns
  CHECK(r.hdr->idle == 1);
  droce_shm_send_wqe w{};
  w.wr_id = 0;
  REQUIRE(client.try_push(w));  // finds idle = 1: rings bit 70
  CHECK(r.db->summary == (uint64_t{1} << 1));
  CHECK(r.db->word[1] == (uint64_t{1} << 6));
  CHECK(d.turn(next, ok) == 1);
  CHECK(d.active);
  CHECK(r.hdr->idle == 0);
  CHECK(r.db->summary == 0);
  // While the ring is polled, posting rings nothing (no atomic OR).
  w.wr_id = 1;
  REQUIRE(client.try_push(w));
  CHECK(r.db->summary == 0);
  CHECK(d.turn(next, ok) == 1);
  CHECK(ok);

  SECTION("a producer without the doorbell is not seen by a parked consumer") {
    for (int i = 0; i < 4; i++) d.turn(next, ok);
    REQUIRE_FALSE(d.active);
    RingProducer<droce_shm_send_wqe> plain;  // attached without the region: publish is a bare store
    REQUIRE(plain.attach(r.hdr, 64));
    CHECK_FALSE(plain.has_doorbell());
    w.wr_id = 2;
    REQUIRE(plain.try_push(w));
    for (int i = 0; i < 1000; i++) CHECK(d.turn(next, ok) == 0);
    CHECK(next == 2);  // missed: this is what the doorbell is for
  }
  SECTION("a bit beyond the region means no doorbell") {
    r.hdr->db_bit = DROCE_SHM_DB_BITS;
    RingProducer<droce_shm_send_wqe> p;
    REQUIRE(p.attach(r.hdr, 64, false, r.db));
    CHECK_FALSE(p.has_doorbell());
  }
}

TEST_CASE("doorbell: a posting thread against a parking poller never loses a WQE", "[shim][ring][doorbell][stress]") {
  constexpr uint64_t kN = 200'000;
  constexpr uint32_t kEntries = 64;
  DoorbellRing r(kEntries, 4095);  // the last bit
  RingProducer<droce_shm_send_wqe> client;
  REQUIRE(client.attach(r.hdr, kEntries, false, r.db));
  // park_after 1: the consumer parks at every empty poll, so the producer
  // meets every phase of the park / unpark race.
  ParkingConsumer d(r.db, 4095, r.hdr, kEntries, 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    uint64_t id = 0;
    uint32_t rnd = 12345;
    while (id < kN && !stop.load(std::memory_order_relaxed)) {
      rnd = rnd * 1103515245u + 12345u;
      const uint32_t want = static_cast<uint32_t>(std::min<uint64_t>(1 + (rnd >> 16) % 8, kN - id));
      const uint32_t n = std::min<uint32_t>(client.free_slots(want), want);
      for (uint32_t i = 0; i < n; i++) client.slot(i)->wr_id = id + i;
      if (n) client.publish(n);
      id += n;
      // Now and then a pause, so the consumer parks between batches.
      if ((rnd >> 8) % 4 == 0)
        for (uint32_t spin = 0; spin < (rnd >> 20) % 2000; spin++) asm volatile("" ::: "memory");
    }
  });
  uint64_t next = 0;
  bool ok = true;
  uint32_t empty = 0;
  while (next < kN && std::chrono::steady_clock::now() < deadline) {
    // On a loaded machine the two threads may share a CPU: give it up now
    // and then while nothing comes.
    if (d.turn(next, ok) == 0 && ++empty % 256 == 0) std::this_thread::yield();
  }
  stop = true;
  producer.join();
  WARN("doorbell race: " << d.parks << " parks, " << d.wakeups << " doorbell wake-ups for " << kN << " WQEs");
  CHECK(next == kN);  // a lost doorbell leaves the consumer parked with entries: next < kN at the deadline
  CHECK(ok);
  CHECK(d.parks > 100);  // the race was exercised
  CHECK(d.wakeups > 100);
}

TEST_CASE("ring regions go to hugepages when asked and free, else 4 KiB pages", "[shim][ring][huge]") {
  RingSpec spec{DROCE_SHM_RING_CQ, 64, sizeof(droce_shm_cqe), 0, 0};
  ShmRegion small, huge;
  REQUIRE(create_object_region(small, DROCE_SHM_REGION_CQ, 1, &spec, 1, false) == 0);
  CHECK_FALSE(small.huge());
  CHECK(small.size() % 4096 == 0);
  REQUIRE(create_object_region(huge, DROCE_SHM_REGION_CQ, 1, &spec, 1, true) == 0);
  REQUIRE(check_object_region(huge, DROCE_SHM_REGION_CQ, &spec, 1));
  if (huge.huge()) {
    CHECK(huge.size() == kHugePage);
    // Usable through a second mapping of the fd, as the client maps it.
    ShmRegion client;
    REQUIRE(client.map(dup(huge.fd()), huge.size()) == 0);
    RingProducer<droce_shm_cqe> p;
    RingConsumer<droce_shm_cqe> c;
    REQUIRE(p.attach(region_ring(huge, 0), 64));
    REQUIRE(c.attach(region_ring(client, 0), 64));
    droce_shm_cqe e{}, out{};
    e.wr_id = 77;
    REQUIRE(p.try_push(e));
    REQUIRE(c.try_pop(&out));
    CHECK(out.wr_id == 77);
  } else {
    WARN("no free 2 MiB hugepage: fell back to 4 KiB pages");
  }
  // The client cannot resize a region under the daemon: it is sealed.
  CHECK(ftruncate(small.fd(), 0) != 0);
  CHECK(ftruncate(huge.fd(), 0) != 0);
}

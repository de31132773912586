// The per-packet path does not allocate: global operator new is counted while
// Engine::poll() runs, over traffic with loss, reordering and duplication
// (so retransmission, NAK, duplicate and read-replay paths run too).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

#include "harness.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocs{0};
}  // namespace

void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  const size_t al = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

using namespace droce;
using namespace droce::test;

TEST_CASE("no heap allocation in Engine::poll", "[noalloc]") {
  {  // the counter works
    g_counting = true;
    auto* probe = new std::vector<int>(3);
    g_counting = false;
    delete probe;
    REQUIRE(g_allocs.load() >= 1);
    g_allocs = 0;
  }
  World w(77);
  memlink::Faults f;
  f.loss = 0.03;
  f.reorder = 0.03;
  f.duplicate = 0.03;
  f.corrupt = 0.01;
  f.ce_mark = 0.05;
  w.link.set_faults(f);
  QpOpts o;
  o.timeout = 6;
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  std::vector<std::pair<uint32_t, uint32_t>> qps;
  for (int i = 0; i < 4; ++i) qps.push_back(w.connect(0, 1, QpType::RC, o));
  auto& src = A.buffer(1 << 20);
  auto& dst = B.buffer(1 << 20);
  auto& rb = B.buffer(1 << 20);
  uint64_t polls = 0;
  for (int round = 0; round < 20; ++round) {
    for (auto [qa, qb] : qps) {
      SendWr wr = make_wr(round, WrOpcode::RdmaWrite, src, 0, 5000);
      wr.rdma = {dst.addr(), dst.key};
      REQUIRE(A.eng->post_send(qa, wr) == 0);
      SendWr rd = make_wr(round, WrOpcode::RdmaRead, src, 8192, 3000);
      rd.rdma = {dst.addr() + 8192, dst.key};
      REQUIRE(A.eng->post_send(qa, rd) == 0);
      REQUIRE(B.eng->post_recv(qb, make_recv(round, rb, 0, 4096)) == 0);
      SendWr s = make_wr(round, WrOpcode::Send, src, 0, 2000);
      REQUIRE(A.eng->post_send(qa, s) == 0);
      SendWr fa = make_wr(round, WrOpcode::AtomicFetchAdd, src, 16384, 8);
      fa.atomic = {dst.addr() + 16384, 1, 0, dst.key};
      REQUIRE(A.eng->post_send(qa, fa) == 0);
    }
    Wc wc[64];
    int done = 0;
    for (int it = 0; it < 200000 && done < 16; ++it) {
      g_counting = true;
      const uint32_t work = A.eng->poll() + B.eng->poll();
      g_counting = false;
      ++polls;
      int n;
      while ((n = A.scq->poll(wc, 64)) > 0) {
        for (int k = 0; k < n; ++k) REQUIRE(wc[k].status == WcStatus::Success);
        done += n;
      }
      while (B.rcq->poll(wc, 64) > 0) {
      }
      if (!work) w.clock.advance(1000);
    }
    REQUIRE(done == 16);
  }
  CHECK(polls > 1000);
  CHECK(A.eng->counter(Ctr::ReqRetransmits) > 0);
  CHECK(g_allocs.load() == 0);
}

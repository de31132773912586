// DpdkQueueIo end to end over a net_ring pair in one process: frames sent on
// one port arrive intact on the other, buffers go back to their pools, queue
// and port counters agree, and shortage of buffers or ring space is reported
// to the caller instead of crashing.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <rte_ethdev.h>
#include <rte_mempool.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "dpdk/eal.h"
#include "dpdk/hugemem.h"
#include "dpdk/port.h"
#include "dpdk/queue_io.h"

using namespace droce;
using droce::dpdk::DpdkQueueIo;
using droce::dpdk::Port;
using droce::dpdk::PortConfig;
using droce::dpdk::RingPair;

namespace {

// Writes a recognisable frame of len bytes: Ethernet header, then seq-derived bytes.
void fill_frame(io::PktBuf* b, const wire::MacAddr& src, uint32_t seq, uint32_t len) {
  REQUIRE(len <= b->cap);
  static constexpr wire::MacAddr dst{0x02, 0, 0, 0, 0, 0xBB};
  std::memcpy(b->data, dst.data(), 6);
  std::memcpy(b->data + 6, src.data(), 6);
  b->data[12] = 0x88;
  b->data[13] = 0xB5;  // local experimental ethertype
  std::memcpy(b->data + 14, &seq, 4);
  for (uint32_t i = 18; i < len; ++i) b->data[i] = static_cast<uint8_t>(seq * 7 + i);
  b->len = len;
}

bool check_frame(const io::PktBuf* b, uint32_t seq, uint32_t len) {
  if (b->len != len) return false;
  uint32_t s = 0;
  std::memcpy(&s, b->data + 14, 4);
  if (s != seq) return false;
  for (uint32_t i = 18; i < len; ++i)
    if (b->data[i] != static_cast<uint8_t>(seq * 7 + i)) return false;
  return true;
}

uint32_t len_for(uint32_t seq) { return 60 + (seq * 37) % 1400; }

struct Pair {
  RingPair rings;
  Port a, b;
  Pair(const std::string& name, uint16_t queues, uint32_t ring_size = 1024, uint32_t mbufs = 0)
      : rings(name, queues, ring_size),
        a(PortConfig{.port_id = rings.port_a(), .rx_queues = queues, .tx_queues = queues, .mbufs = mbufs}),
        b(PortConfig{.port_id = rings.port_b(), .rx_queues = queues, .tx_queues = queues, .mbufs = mbufs}) {}
};

}  // namespace

TEST_CASE("EAL arguments get the machine's defaults unless given") {
  auto args = dpdk::Eal::build_args({.args = {"-l", "0,1"}});
  CHECK(args == std::vector<std::string>{"droce", "-l", "0,1", "--in-memory", "--no-pci"});
  args = dpdk::Eal::build_args({.args = {"--file-prefix=x", "-a", "0000:01:00.0"}, .allow_pci = true});
  CHECK(args == std::vector<std::string>{"droce", "--file-prefix=x", "-a", "0000:01:00.0", "-l0"});
  args = dpdk::Eal::build_args({.args = {"--lcores=0@0,1@0", "--no-pci", "--in-memory"}});
  CHECK(args == std::vector<std::string>{"droce", "--lcores=0@0,1@0", "--no-pci", "--in-memory"});
  // No free hugepages: ordinary memory, unless the caller chose the memory.
  args = dpdk::Eal::build_args({.args = {"-l", "0"}}, 0);
  CHECK(args == std::vector<std::string>{"droce", "-l", "0", "--no-shconf", "--no-pci", "--no-huge", "-m", "256"});
  args = dpdk::Eal::build_args({.args = {"-l", "0", "--socket-mem=64"}}, 0);
  CHECK(args.back() == "--no-pci");
  args = dpdk::Eal::build_args({.args = {"-l", "0"}, .hugepage_fallback = false}, 0);
  CHECK(args.back() == "--no-pci");
}

TEST_CASE("af_packet jumbo devargs size the mbufs") {
  CHECK(dpdk::devargs_data_room("net_af_packet0,iface=v,framesz=9216,blocksz=36864") == 9216 - 32 + 128);
  CHECK(dpdk::devargs_data_room("net_af_packet0,iface=v") == 0);
  CHECK(dpdk::devargs_data_room("net_memif0,framesz=9216") == 0);
}

TEST_CASE("frames cross a ring pair intact, in order, and every buffer comes back") {
  Pair p("rp1", 1);
  DpdkQueueIo qa(p.a, 0), qb(p.b, 0);
  REQUIRE(qa.buf_capacity() >= 2048);
  CHECK(qa.mac() == p.a.mac());
  const unsigned avail_a = rte_mempool_avail_count(p.a.pool());

  constexpr uint32_t kFrames = 5000;
  uint32_t sent = 0, recvd = 0, bad = 0;
  io::PktBuf* tx[32];
  io::PktBuf* rx[64];
  for (int iter = 0; iter < 100000 && recvd < kFrames; ++iter) {
    if (sent < kFrames) {
      const uint16_t want = static_cast<uint16_t>(std::min<uint32_t>(32, kFrames - sent));
      const uint16_t n = qa.alloc_burst(tx, want);
      for (uint16_t i = 0; i < n; ++i) fill_frame(tx[i], qa.mac(), sent + i, len_for(sent + i));
      const uint16_t k = qa.tx_burst(tx, n);
      qa.free_burst(tx + k, static_cast<uint16_t>(n - k));
      sent += k;
    }
    const uint16_t got = qb.rx_burst(rx, 64);
    for (uint16_t i = 0; i < got; ++i) {
      if (!check_frame(rx[i], recvd, len_for(recvd))) ++bad;
      CHECK(rx[i]->port == p.b.id());
      CHECK(rx[i]->queue == 0);
      CHECK(rx[i]->backend == DpdkQueueIo::mbuf_of(rx[i]));
      CHECK(DpdkQueueIo::pktbuf_of(DpdkQueueIo::mbuf_of(rx[i])) == rx[i]);
      ++recvd;
    }
    qb.free_burst(rx, got);
  }
  CHECK(sent == kFrames);
  CHECK(recvd == kFrames);
  CHECK(bad == 0);
  CHECK(qa.counters().tx_packets.get() == kFrames);
  CHECK(qb.counters().rx_packets.get() == kFrames);
  CHECK(qb.counters().rx_bytes.get() == qa.counters().tx_bytes.get());
  // Frames from A's pool were freed on B's side: they return to A's pool.
  CHECK(rte_mempool_avail_count(p.a.pool()) == avail_a);

  const auto st = p.b.stats();
  CHECK(st.ipackets == kFrames);
  bool found = false;
  for (const auto& [name, v] : p.b.xstats())
    if (name == "rx_good_packets") {
      found = true;
      CHECK(v == kFrames);
    }
  CHECK(found);
  CHECK(p.a.link().up);
}

TEST_CASE("a ring pair can be made again under the same name") {
  for (int i = 0; i < 3; ++i) {
    Pair p("rp_again", 1);
    CHECK(p.a.link().up);
  }
  RingPair unopened("rp_unopened", 1);
  CHECK(rte_eth_dev_is_valid_port(unopened.port_a()));
}

TEST_CASE("a received buffer is reused to answer, with the frame start moved") {
  Pair p("rp2", 1);
  DpdkQueueIo qa(p.a, 0), qb(p.b, 0);
  io::PktBuf* b[4];
  REQUIRE(qa.alloc_burst(b, 1) == 1);
  fill_frame(b[0], qa.mac(), 42, 100);
  REQUIRE(qa.tx_burst(b, 1) == 1);
  io::PktBuf* r[4];
  REQUIRE(qb.rx_burst(r, 4) == 1);
  REQUIRE(check_frame(r[0], 42, 100));
  // Answer in place: drop the first 4 bytes after the MAC pair (a fake tag).
  std::memmove(r[0]->data + 4, r[0]->data, 12);
  r[0]->data += 4;
  r[0]->len -= 4;
  r[0]->cap -= 4;
  REQUIRE(qb.tx_burst(r, 1) == 1);
  io::PktBuf* back[4];
  REQUIRE(qa.rx_burst(back, 4) == 1);
  CHECK(back[0]->len == 96);
  CHECK(back[0]->data[0] == 0x02);
  CHECK(back[0]->data[5] == 0xBB);
  uint8_t want[82];
  for (uint32_t i = 18; i < 100; ++i) want[i - 18] = static_cast<uint8_t>(42 * 7 + i);
  CHECK(std::memcmp(back[0]->data + 14, want, 82) == 0);
  qa.free_burst(back, 1);
}

TEST_CASE("queues are separate: traffic on queue 1 never shows on queue 0") {
  Pair p("rp3", 2);
  DpdkQueueIo a0(p.a, 0), a1(p.a, 1), b0(p.b, 0), b1(p.b, 1);
  io::PktBuf* t[8];
  REQUIRE(a1.alloc_burst(t, 8) == 8);
  for (uint32_t i = 0; i < 8; ++i) fill_frame(t[i], a1.mac(), i, 64);
  REQUIRE(a1.tx_burst(t, 8) == 8);
  io::PktBuf* r[16];
  CHECK(b0.rx_burst(r, 16) == 0);
  const uint16_t got = b1.rx_burst(r, 16);
  CHECK(got == 8);
  for (uint16_t i = 0; i < got; ++i) CHECK(r[i]->queue == 1);
  b1.free_burst(r, got);
  CHECK_THROWS_AS(DpdkQueueIo(p.a, 2), dpdk::PortError);
}

TEST_CASE("a full ring hands unsent frames back; an empty pool gives fewer buffers") {
  Pair p("rp4", 1, 64, 512);  // 64-slot rings, 512-mbuf pools
  DpdkQueueIo qa(p.a, 0), qb(p.b, 0);
  std::vector<io::PktBuf*> held;
  io::PktBuf* t[64];
  uint16_t n = qa.alloc_burst(t, 64);
  REQUIRE(n == 64);
  for (uint16_t i = 0; i < n; ++i) fill_frame(t[i], qa.mac(), i, 64);
  const uint16_t k = qa.tx_burst(t, n);
  CHECK(k == 63);  // an rte_ring of size 64 holds 63
  CHECK(qa.counters().tx_full.get() == 1);
  qa.free_burst(t + k, static_cast<uint16_t>(n - k));

  // Drain the pool: alloc until it stops giving.
  for (int i = 0; i < 100; ++i) {
    n = qa.alloc_burst(t, 64);
    if (n == 0) break;
    held.insert(held.end(), t, t + n);
  }
  CHECK(qa.alloc_burst(t, 1) == 0);
  CHECK(qa.counters().alloc_failures.get() > 0);
  CHECK(held.size() + 63 <= 512);
  qa.free_burst(held.data(), static_cast<uint16_t>(held.size()));
  CHECK(qa.alloc_burst(t, 8) == 8);
  qa.free_burst(t, 8);
  io::PktBuf* r[64];
  CHECK(qb.rx_burst(r, 64) == 63);
  qb.free_burst(r, 63);
}

TEST_CASE("bad devices and queue counts give clear errors") {
  try {
    Port bad(PortConfig{.device = "net_nosuchdriver0"});
    FAIL("opened a nonexistent device");
  } catch (const dpdk::PortError& e) {
    CHECK(std::string(e.what()).find("net_nosuchdriver0") != std::string::npos);
  }
  CHECK_THROWS_AS(Port(PortConfig{.port_id = 200}), dpdk::PortError);
  RingPair rings("rp5", 1);
  try {
    Port tooMany(PortConfig{.port_id = rings.port_a(), .rx_queues = 4, .tx_queues = 4});
    FAIL("configured 4 queues on a 1-queue ring port");
  } catch (const dpdk::PortError& e) {
    CHECK(std::string(e.what()).find("at most 1") != std::string::npos);
  }
}

TEST_CASE("a net_ring vdev opened by device string loops back to itself") {
  Port p(PortConfig{.device = "net_ring_t0"});
  CHECK(p.driver() == "net_ring");
  DpdkQueueIo q(p, 0);
  io::PktBuf* t[4];
  REQUIRE(q.alloc_burst(t, 4) == 4);
  for (uint32_t i = 0; i < 4; ++i) fill_frame(t[i], q.mac(), i, 128);
  REQUIRE(q.tx_burst(t, 4) == 4);
  io::PktBuf* r[8];
  const uint16_t got = q.rx_burst(r, 8);
  CHECK(got == 4);
  for (uint16_t i = 0; i < got; ++i) CHECK(check_frame(r[i], i, 128));
  q.free_burst(r, got);
  const wire::MacAddr m{0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
  p.set_promiscuous(true);
  CHECK(p.promiscuous());
  p.set_promiscuous(false);
  CHECK_FALSE(p.promiscuous());
  CHECK(p.mtu() == 1500);
  // net_ring has no MTU to set (net_tap's is set in test/drivers/dpdk/netns_ping.sh).
  CHECK_THROWS_WITH(p.set_mtu(9000), Catch::Contains("set MTU 9000"));
  // net_ring cannot change its MAC: the error names the operation.
  CHECK_THROWS_WITH(p.set_mac(m), Catch::Contains("set MAC 02:11:22:33:44:55"));
  CHECK(dpdk::mac_to_string(m) == "02:11:22:33:44:55");
  CHECK(dpdk::parse_mac("02:11:22:33:44:55") == m);
  CHECK_FALSE(dpdk::parse_mac("02:11:22:33:44"));
}

TEST_CASE("hugepage regions know the IOVA of every byte") {
  dpdk::HugeRegion r("t_region", 3 << 20);
  REQUIRE(r.data() != nullptr);
  CHECK(r.size() == (3u << 20));
  CHECK(reinterpret_cast<uintptr_t>(r.data()) % 4096 == 0);
  std::memset(r.data(), 0x5A, r.size());
  CHECK(r.iova(0) != RTE_BAD_IOVA);
  CHECK(r.iova(r.size() - 1) != RTE_BAD_IOVA);
  if (r.iova_contiguous()) CHECK(r.iova(12345) == r.iova(0) + 12345);
  CHECK(r.iova(4096 + 7) - r.iova(4096) == 7);  // within a page
  CHECK_THROWS_AS(dpdk::HugeRegion("t_region", 4096), dpdk::PortError);  // name taken
}

namespace {
int g_ext_freed = 0;
void ext_free_cb(void*, void* opaque) { *static_cast<int*>(opaque) += 1; }
}  // namespace

TEST_CASE("zero-copy TX: payload from registered memory goes out without a copy") {
  Pair p("rp_zc", 1);
  DpdkQueueIo qa(p.a, 0);
  dpdk::HugeRegion mr("t_mr", 1 << 20);
  for (size_t i = 0; i < 4096; ++i) mr.data()[i] = static_cast<uint8_t>(i * 13);
  rte_mbuf_ext_shared_info shinfo{};
  shinfo.free_cb = ext_free_cb;
  shinfo.fcb_opaque = &g_ext_freed;
  rte_mbuf_ext_refcnt_set(&shinfo, 0);
  const unsigned avail = rte_mempool_avail_count(p.a.pool());

  // Headers in the PktBuf, 1000 payload bytes from the MR, an 8-byte trailer.
  io::PktBuf* b[2];
  REQUIRE(qa.alloc_burst(b, 2) == 2);
  fill_frame(b[0], qa.mac(), 9, 42);
  REQUIRE(qa.append_external(b[0], mr.data() + 100, mr.iova(100), 1000, &shinfo));
  std::memset(b[1]->data, 0xEE, 8);
  b[1]->len = 8;
  qa.append_buf(b[0], b[1]);
  REQUIRE(qa.tx_burst(b, 1) == 1);
  CHECK(qa.counters().tx_bytes.get() == 1050);

  // Receive with the plain ethdev API to see the segments as sent.
  rte_mbuf* m[4];
  REQUIRE(rte_eth_rx_burst(p.b.id(), 0, m, 4) == 1);
  CHECK(m[0]->nb_segs == 3);
  CHECK(m[0]->pkt_len == 1050);
  CHECK(m[0]->data_len == 42);
  const rte_mbuf* ext = m[0]->next;
  CHECK(RTE_MBUF_HAS_EXTBUF(ext));
  CHECK(rte_pktmbuf_mtod(ext, const uint8_t*) == mr.data() + 100);  // the MR itself: no copy
  CHECK(rte_pktmbuf_iova(ext) == mr.iova(100));
  CHECK(ext->data_len == 1000);
  CHECK(ext->next->data_len == 8);
  CHECK(rte_pktmbuf_mtod(ext->next, const uint8_t*)[7] == 0xEE);
  uint8_t flat[1050];
  REQUIRE(rte_pktmbuf_read(m[0], 0, sizeof flat, flat) != nullptr);
  for (size_t i = 0; i < 1000; ++i) REQUIRE(flat[42 + i] == static_cast<uint8_t>((100 + i) * 13));
  CHECK(g_ext_freed == 0);  // still in flight: the MR bytes must stay
  rte_pktmbuf_free(m[0]);
  CHECK(g_ext_freed == 1);  // released: the memory may be reused
  CHECK(rte_mempool_avail_count(p.a.pool()) == avail);

  // A frame freed before sending releases its external segment too.
  REQUIRE(qa.alloc_burst(b, 1) == 1);
  b[0]->len = 60;
  REQUIRE(qa.append_external(b[0], mr.data(), mr.iova(0), 64, &shinfo));
  qa.free_burst(b, 1);
  CHECK(g_ext_freed == 2);
  CHECK(rte_mempool_avail_count(p.a.pool()) == avail);
}

TEST_CASE("the TSC clock is monotonic and keeps time with steady_clock") {
  dpdk::TscClock c;
  const uint64_t t0 = c.now_ns();
  const auto s0 = std::chrono::steady_clock::now();
  uint64_t prev = t0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t t = c.now_ns();
    REQUIRE(t >= prev);
    prev = t;
  }
  // Read both clocks together until steady_clock says 50 ms have passed (5 s at
  // most); each pair is taken back to back, so being descheduled between the
  // reads shows as a pair read again, not as a clock error.
  double tsc_ms = 0, ref_ms = 0;
  const auto give_up = s0 + std::chrono::seconds(5);
  for (;;) {
    const auto before = std::chrono::steady_clock::now();
    const uint64_t t = c.now_ns();
    const auto after = std::chrono::steady_clock::now();
    if (after - before > std::chrono::microseconds(100) && after < give_up) continue;  // preempted mid-pair
    tsc_ms = static_cast<double>(t - t0) / 1e6;
    ref_ms = std::chrono::duration<double, std::milli>(before - s0).count();
    if (ref_ms >= 50 || after >= give_up) break;
    std::this_thread::yield();
  }
  REQUIRE(ref_ms >= 50);
  CHECK(tsc_ms == Approx(ref_ms).epsilon(0.05));
}

int main(int argc, char** argv) {
  std::unique_ptr<dpdk::Eal> eal;
  try {
    eal = std::make_unique<dpdk::Eal>(dpdk::EalOptions{.args = {"--log-level=lib.eal:error"}, .program = "test_dpdk_ring"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return Catch::Session().run(argc, argv);
}

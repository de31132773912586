// lib/engine in one process over a net_ring pair (2 queues per port):
// dataplane A runs its two core loops on EAL worker lcores (threads), B is
// embedded (polled by the test thread). Shows: QPN partition, replicated MR
// keys, run_on onto running cores, ARP across the ports, WRITE/SEND/READ with
// data checked, frames reaching the owning core through the SPSC rings,
// pollers, counters in the registry, and stop() flushing QPs with errors.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <rte_lcore.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "engine/dataplane.h"
#include "engine/embed.h"
#include "embedded_pair.h"

using namespace droce;
using engine::CoreLoop;
using engine::Dataplane;

namespace {

struct Side {
  std::unique_ptr<Dataplane> dp;
  uint32_t pd = 0;
};

engine::DataplaneConfig make_cfg(dpdk::Port& port, uint32_t ip, std::vector<unsigned> lcores, stats::Registry* reg) {
  engine::DataplaneConfig c;
  engine::PortSpec ps;
  ps.name = port.name();
  ps.port = &port;
  ps.host.ipv4 = {ip};
  c.ports.push_back(ps);
  for (uint16_t q = 0; q < lcores.size(); ++q) c.cores.push_back({lcores[q], {{0, q}}});
  c.engine.max_qps = 64;
  c.engine.max_mrs = 64;
  c.registry = reg;
  return c;
}

struct QpRef {
  size_t core;
  uint32_t qpn;
  verbs::Cq* scq;
  verbs::Cq* rcq;
};

// Creates an RC QP in INIT on `core` (through run_on: the core may be running).
QpRef make_qp(Dataplane& dp, size_t core, uint32_t pd) {
  auto r = std::make_shared<QpRef>();
  r->core = core;
  REQUIRE(dp.run_on(core, [r, pd](CoreLoop& c) {
    transport::Engine* e = c.engine(0);
    r->scq = e->create_cq(256);
    r->rcq = e->create_cq(256);
    verbs::QpInitAttr init;
    init.pd = pd;
    init.send_cq = r->scq;
    init.recv_cq = r->rcq;
    if (e->create_qp(init, &r->qpn) != 0) return;
    verbs::QpAttr a;
    a.qp_state = verbs::QpState::Init;
    a.qp_access_flags = verbs::kAccessAll;
    e->modify_qp(r->qpn, a, verbs::kQpState | verbs::kQpPkeyIndex | verbs::kQpPort | verbs::kQpAccessFlags);
  }));
  REQUIRE(r->qpn != 0);
  return *r;
}

int to_rts(Dataplane& dp, const QpRef& q, uint32_t dqpn, const wire::Gid& dgid, const wire::MacAddr& dmac) {
  auto rc = std::make_shared<int>(-1);
  dp.run_on(q.core, [=](CoreLoop& c) {
    transport::Engine* e = c.engine(0);
    verbs::QpAttr a;
    a.qp_state = verbs::QpState::Rtr;
    a.path_mtu = verbs::Mtu::M1024;
    a.dest_qp_num = dqpn;
    a.rq_psn = 1000 + dqpn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    a.ah_attr.dgid = dgid;
    a.ah_attr.dmac = dmac;
    using namespace verbs;
    *rc = e->modify_qp(q.qpn, a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic |
                                     kQpMinRnrTimer);
    if (*rc) return;
    a.qp_state = QpState::Rts;
    a.sq_psn = 1000 + q.qpn;
    a.timeout = 12;
    a.max_rd_atomic = 16;
    *rc = e->modify_qp(q.qpn, a, kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic);
  });
  return *rc;
}

}  // namespace

TEST_CASE("dataplane: two running cores, an embedded peer, verbs across a net_ring pair") {
  REQUIRE(rte_lcore_count() >= 3);
  dpdk::RingPair rings("dpt", 2);
  dpdk::Port pa(dpdk::PortConfig{.port_id = rings.port_a(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  dpdk::Port pb(dpdk::PortConfig{.port_id = rings.port_b(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  stats::Registry reg;
  unsigned w1 = rte_get_next_lcore(-1, 1, 0), w2 = rte_get_next_lcore(w1, 1, 0);
  Dataplane a(make_cfg(pa, 0x0A3C0001, {w1, w2}, &reg));
  Dataplane b(make_cfg(pb, 0x0A3C0002, {rte_lcore_id(), rte_lcore_id()}, nullptr));
  REQUIRE(a.port_cores(0).size() == 2);
  a.start();
  REQUIRE(a.running());

  // A poller on a running core.
  auto ticks = std::make_shared<std::atomic<uint64_t>>(0);
  const uint64_t pid = a.add_poller(1, [ticks] {
    ticks->fetch_add(1, std::memory_order_relaxed);
    return 0u;
  });
  for (int i = 0; i < 1000 && ticks->load() < 100; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(ticks->load() >= 100);
  CHECK(a.remove_poller(1, pid));

  // Registered memory in hugepages, same key on both cores of A.
  const uint32_t pda = a.alloc_pd(), pdb = b.alloc_pd();
  constexpr size_t kLen = 1 << 20;
  uint64_t iova = 0;
  auto* amem = static_cast<uint8_t*>(a.alloc_dma(kLen, &iova));
  auto* bmem = static_cast<uint8_t*>(b.alloc_dma(kLen));
  REQUIRE(amem);
  REQUIRE(bmem);
  std::memset(amem, 0, kLen);
  uint32_t akey = 0, bkey = 0;
  REQUIRE(a.reg_mr(0, pda, amem, kLen, verbs::kAccessAll, &akey) == 0);
  REQUIRE(b.reg_mr(0, pdb, bmem, kLen, verbs::kAccessAll, &bkey) == 0);
  auto mrs = a.mrs();
  REQUIRE(mrs.size() == 1);
  CHECK(mrs[0].hugepage);
  CHECK(mrs[0].dma_iova == iova);

  // ARP: B resolves A (A's netstack runs on its home core's thread).
  wire::MacAddr amac{};
  REQUIRE(b.resolve(0, wire::gid_from_ipv4(0x0A3C0001), amac));
  CHECK(amac == pa.mac());

  // Four QP pairs; A's QPNs alternate between its cores (QPN % 2 = core index).
  std::vector<QpRef> qa, qb;
  for (int i = 0; i < 4; ++i) {
    qa.push_back(make_qp(a, a.pick_core(0), pda));
    qb.push_back(make_qp(b, static_cast<size_t>(i + 1) % 2, pdb));  // the other parity: frames must cross cores
    CHECK(a.owner_core(0, qa.back().qpn) == qa.back().core);
    CHECK(qb.back().qpn % 2 == qb.back().core);
  }
  for (int i = 0; i < 4; ++i) {
    REQUIRE(to_rts(a, qa[i], qb[i].qpn, wire::gid_from_ipv4(0x0A3C0002), pb.mac()) == 0);
    REQUIRE(to_rts(b, qb[i], qa[i].qpn, wire::gid_from_ipv4(0x0A3C0001), amac) == 0);
  }

  // B writes 64 KiB per QP into A's memory; A's cores answer from their threads.
  for (int i = 0; i < 4; ++i) {
    for (size_t k = 0; k < 65536; ++k) bmem[i * 65536 + k] = static_cast<uint8_t>(k * 13 + i);
    verbs::SendWr w;
    w.wr_id = static_cast<uint64_t>(i);
    w.opcode = verbs::WrOpcode::RdmaWrite;
    w.num_sge = 1;
    w.sg_list[0] = {reinterpret_cast<uint64_t>(bmem + i * 65536), 65536, bkey};
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(amem + i * 65536);
    w.rdma.rkey = akey;
    REQUIRE(b.core(qb[i].core).engine(0)->post_send(qb[i].qpn, w) == 0);
  }
  int done = 0;
  for (int it = 0; it < 5'000'000 && done < 4; ++it) {
    b.poll_all();
    verbs::Wc wc;
    for (auto& q : qb)
      while (q.scq->poll(&wc, 1) == 1) {
        CHECK(wc.status == verbs::WcStatus::Success);
        ++done;
      }
  }
  REQUIRE(done == 4);
  CHECK(std::memcmp(amem, bmem, 4 * 65536) == 0);

  // A sends to B (posted through run_on onto A's running cores); B receives.
  for (int i = 0; i < 4; ++i) {
    verbs::RecvWr r;
    r.wr_id = static_cast<uint64_t>(i);
    r.num_sge = 1;
    r.sg_list[0] = {reinterpret_cast<uint64_t>(bmem + 512 * 1024 + i * 4096), 4096, bkey};
    REQUIRE(b.core(qb[i].core).engine(0)->post_recv(qb[i].qpn, r) == 0);
    auto rc = std::make_shared<int>(-1);
    const QpRef q = qa[i];
    REQUIRE(a.run_on(q.core, [=](CoreLoop& c) {
      verbs::SendWr w;
      w.opcode = verbs::WrOpcode::Send;
      w.num_sge = 1;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(amem + i * 65536), 3000, akey};
      *rc = c.engine(0)->post_send(q.qpn, w);
    }));
    REQUIRE(*rc == 0);
  }
  done = 0;
  for (int it = 0; it < 5'000'000 && done < 4; ++it) {
    b.poll_all();
    verbs::Wc wc;
    for (auto& q : qb)
      while (q.rcq->poll(&wc, 1) == 1) {
        CHECK(wc.status == verbs::WcStatus::Success);
        CHECK(wc.byte_len == 3000);
        CHECK(std::memcmp(bmem + 512 * 1024 + wc.wr_id * 4096, bmem + wc.wr_id * 65536, 3000) == 0);
        ++done;
      }
  }
  REQUIRE(done == 4);

  for (int i = 0; i < 100; ++i) b.poll_all();  // drain B's own rings
  // Some frames landed on a queue whose core does not own the QP: forwarded.
  const uint64_t fwd = a.core_counters().sum(stats::CoreCounter::ring_enqueued) +
                       b.core_counters().sum(stats::CoreCounter::ring_enqueued);
  CHECK(fwd > 0);
  // A's loops are still running: a few frames may sit in a ring right now.
  CHECK(a.core_counters().sum(stats::CoreCounter::ring_dequeued) > 0);
  CHECK(a.core_counters().sum(stats::CoreCounter::ring_dequeued) <=
        a.core_counters().sum(stats::CoreCounter::ring_enqueued));
  CHECK(b.core_counters().sum(stats::CoreCounter::ring_dequeued) ==
        b.core_counters().sum(stats::CoreCounter::ring_enqueued));  // embedded: drained by poll_all
  // Counters and QP listing.
  // The transport counters reach the registry in each core's housekeeping pass
  // (~1 ms): wait until every running core of A has started two more passes
  // (so one full pass ran after this point), 5 s at most.
  {
    auto& cc = a.core_counters();
    std::vector<uint64_t> mark(cc.size());
    for (size_t i = 0; i < cc.size(); ++i) mark[i] = cc[i].get(stats::CoreCounter::timer_runs);
    auto passed = [&] {
      for (size_t i = 0; i < cc.size(); ++i)
        if (mark[i] != 0 && cc[i].get(stats::CoreCounter::timer_runs) < mark[i] + 2) return false;
      return true;
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!passed() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    REQUIRE(passed());
  }
  auto snap = reg.snapshot("transport");
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].instances.size() == 2);
  {
    uint64_t total = 0;  // the transfers above are in A's transport counters
    for (const auto& inst : snap[0].instances)
      for (uint64_t v : inst.values) total += v;
    CHECK(total > 0);
  }
  CHECK(a.qps().size() == 4);
  CHECK(a.neighbours().size() >= 1);

  // A receive posted on A, then stop(): flushed with WR_FLUSH_ERR.
  {
    const QpRef q = qa[0];
    REQUIRE(a.run_on(q.core, [=](CoreLoop& c) {
      verbs::RecvWr r;
      r.wr_id = 77;
      r.num_sge = 1;
      r.sg_list[0] = {reinterpret_cast<uint64_t>(amem), 64, akey};
      c.engine(0)->post_recv(q.qpn, r);
    }));
  }
  a.stop();
  CHECK_FALSE(a.running());
  verbs::Wc wc;
  REQUIRE(qa[0].rcq->poll(&wc, 1) == 1);
  CHECK(wc.wr_id == 77);
  CHECK(wc.status == verbs::WcStatus::WrFlushErr);
  for (auto& q : a.qps()) CHECK(q.state == verbs::QpState::Err);
}

namespace {
uint64_t tctr(Dataplane& dp, transport::Ctr c) {
  uint64_t v = 0;
  for (size_t i = 0; i < dp.core_count(); ++i) v += dp.core(i).engine(0)->counter(c);
  return v;
}

// Polls both (embedded) sides until n send completions on cq, each checked.
int wait_send(Dataplane& a, Dataplane& b, verbs::Cq* cq, int n) {
  int done = 0;
  for (int it = 0; it < 5'000'000 && done < n; ++it) {
    a.poll_all();
    b.poll_all();
    verbs::Wc wc;
    while (cq->poll(&wc, 1) == 1) {
      CHECK(wc.status == verbs::WcStatus::Success);
      ++done;
    }
  }
  return done;
}
}  // namespace

TEST_CASE("dataplane: zero-copy TX from hugepage MRs, copy fallback, retransmission, READ responses") {
  dpdk::RingPair rings("dpzc", 1);
  dpdk::Port pa(dpdk::PortConfig{.port_id = rings.port_a(), .mbufs = 4095});
  dpdk::Port pb(dpdk::PortConfig{.port_id = rings.port_b(), .mbufs = 4095});
  REQUIRE(pb.multi_seg_tx());
  config::PortFaults fb;  // B's TX: loss and duplicates once the first part passed
  engine::DataplaneConfig ca = make_cfg(pa, 0x0A3E0001, {rte_lcore_id()}, nullptr);
  engine::DataplaneConfig cb = make_cfg(pb, 0x0A3E0002, {rte_lcore_id()}, nullptr);
  cb.ports[0].faults = &fb;
  ca.engine.zero_copy_min = cb.engine.zero_copy_min = 512;
  Dataplane a(ca), b(cb);
  const uint32_t pda = a.alloc_pd(), pdb = b.alloc_pd();
  constexpr size_t kLen = 1 << 20;
  auto* amem = static_cast<uint8_t*>(a.alloc_dma(kLen));
  auto* bmem = static_cast<uint8_t*>(b.alloc_dma(kLen));
  REQUIRE(amem);
  REQUIRE(bmem);
  std::vector<uint8_t> heap(kLen);  // ordinary memory: always copied
  uint32_t akey = 0, bkey = 0, hkey = 0;
  REQUIRE(a.reg_mr(0, pda, amem, kLen, verbs::kAccessAll, &akey) == 0);
  REQUIRE(b.reg_mr(0, pdb, bmem, kLen, verbs::kAccessAll, &bkey) == 0);
  REQUIRE(b.reg_mr(0, pdb, heap.data(), kLen, verbs::kAccessAll, &hkey) == 0);
  for (auto& m : b.mrs()) CHECK(m.zero_copy == (m.key == bkey));

  QpRef qa = make_qp(a, 0, pda), qb = make_qp(b, 0, pdb);
  REQUIRE(to_rts(a, qa, qb.qpn, wire::gid_from_ipv4(0x0A3E0002), pb.mac()) == 0);
  REQUIRE(to_rts(b, qb, qa.qpn, wire::gid_from_ipv4(0x0A3E0001), pa.mac()) == 0);

  auto write = [&](uint64_t id, const uint8_t* src, uint32_t key, uint32_t len, size_t dst_off) {
    verbs::SendWr w;
    w.wr_id = id;
    w.opcode = verbs::WrOpcode::RdmaWrite;
    w.num_sge = 1;
    w.sg_list[0] = {reinterpret_cast<uint64_t>(src), len, key};
    w.rdma.remote_addr = reinterpret_cast<uint64_t>(amem + dst_off);
    w.rdma.rkey = akey;
    return b.core(0).engine(0)->post_send(qb.qpn, w);
  };
  for (size_t k = 0; k < kLen; ++k) {
    bmem[k] = static_cast<uint8_t>(k * 7 + 1);
    heap[k] = static_cast<uint8_t>(k * 11 + 3);
  }
  // 1. 64 KiB from hugepages (by reference: 64 packets of 1024 B), 300 B from
  //    hugepages (under the threshold: copied), 64 KiB from the heap (copied).
  REQUIRE(write(1, bmem, bkey, 65536, 0) == 0);
  REQUIRE(write(2, bmem + 65536, bkey, 300, 65536) == 0);
  REQUIRE(write(3, heap.data(), hkey, 65536, 131072) == 0);
  REQUIRE(wait_send(a, b, qb.scq, 3) == 3);
  CHECK(std::memcmp(amem, bmem, 65536) == 0);
  CHECK(std::memcmp(amem + 65536, bmem + 65536, 300) == 0);
  CHECK(std::memcmp(amem + 131072, heap.data(), 65536) == 0);
  CHECK(tctr(b, transport::Ctr::TxZeroCopy) == 64);
  CHECK(tctr(b, transport::Ctr::TxCopied) == 65);
  CHECK(b.core(0).slots()[0].qio->counters().tx_zero_copy.get() == 64);
  CHECK(a.core(0).slots()[0].qio->counters().rx_linearized.get() == 64);  // net_ring hands over the chain
  CHECK(tctr(a, transport::Ctr::RxIcrcErr) == 0);

  // 2. Under 5% loss and 5% duplicates on B's TX: go-back-N resends from the
  //    MR, by reference again; every byte still right.
  fb.set(config::FaultDir::tx, config::FaultKind::drop, 0.05);
  fb.set(config::FaultDir::tx, config::FaultKind::duplicate, 0.05);
  fb.publish();
  std::memset(amem, 0, 8 * 65536);
  for (int i = 0; i < 8; ++i) REQUIRE(write(10 + i, bmem + i * 65536, bkey, 65536, i * 65536) == 0);
  REQUIRE(wait_send(a, b, qb.scq, 8) == 8);
  CHECK(std::memcmp(amem, bmem, 8 * 65536) == 0);
  CHECK(tctr(b, transport::Ctr::ReqRetransmits) > 0);
  CHECK(tctr(b, transport::Ctr::TxZeroCopy) > 64 + 8 * 64);  // retransmissions by reference too
  CHECK(tctr(a, transport::Ctr::RxIcrcErr) == 0);
  // Per-QP counters (what droce-ctl qps shows): B's QP sent every payload
  // byte at least once, A's QP took each at least once, retransmissions and
  // A's sequence NAKs counted on the QPs themselves.
  {
    auto qb_info = b.qps(), qa_info = a.qps();
    REQUIRE(qb_info.size() == 1);
    REQUIRE(qa_info.size() == 1);
    const transport::QpCounters& sb = qb_info[0].ctr;
    const transport::QpCounters& ra = qa_info[0].ctr;
    const uint64_t payload = 65536 + 300 + 65536 + 8 * 65536;
    CHECK(sb.tx_bytes >= payload);
    CHECK(sb.tx_packets >= 64 + 1 + 64 + 8 * 64);
    CHECK(sb.retransmits > 0);
    CHECK(sb.retransmits == tctr(b, transport::Ctr::ReqRetransmits));
    CHECK(sb.rx_packets > 0);  // ACKs / NAKs
    CHECK(sb.rx_bytes == 0);
    CHECK(ra.rx_bytes >= payload);
    CHECK(sb.rx_packets <= ra.tx_packets);  // A's frames are not dropped; a few may still be on the ring
    CHECK(ra.seq_naks_sent == tctr(a, transport::Ctr::SeqNakSent));
    CHECK(sb.seq_naks_received == tctr(b, transport::Ctr::SeqNakReceived));
  }
  fb.set(config::FaultDir::tx, config::FaultKind::drop, 0);
  fb.set(config::FaultDir::tx, config::FaultKind::duplicate, 0);
  fb.publish();

  // 3. READ: A's responder answers from its hugepage MR by reference.
  for (size_t k = 0; k < 65536; ++k) amem[300000 + k] = static_cast<uint8_t>(k * 5 + 9);
  verbs::SendWr r;
  r.wr_id = 50;
  r.opcode = verbs::WrOpcode::RdmaRead;
  r.num_sge = 1;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(bmem + 600000), 65536, bkey};
  r.rdma.remote_addr = reinterpret_cast<uint64_t>(amem + 300000);
  r.rdma.rkey = akey;
  REQUIRE(b.core(0).engine(0)->post_send(qb.qpn, r) == 0);
  REQUIRE(wait_send(a, b, qb.scq, 1) == 1);
  CHECK(std::memcmp(bmem + 600000, amem + 300000, 65536) == 0);
  CHECK(tctr(a, transport::Ctr::TxZeroCopy) == 64);

  // 3b. An MR deregistered while a zero-copy WRITE streams from it: segments of
  //     it are still in the ring (A has not taken them). dereg_mr waits until the
  //     device gave them all back (A polls meanwhile, on another thread), then
  //     nothing reads the memory again: the WR ends in LOC_PROT_ERR, and bytes
  //     written to the memory after the dereg never reach A.
  {
    uint32_t zkey = 0;
    REQUIRE(b.reg_mr(0, pdb, bmem, kLen, verbs::kAccessAll, &zkey) == 0);
    std::memset(amem, 0, kLen);
    for (size_t k = 0; k < kLen; ++k) bmem[k] = 0x42;
    const uint64_t zc0 = tctr(b, transport::Ctr::TxZeroCopy);
    REQUIRE(write(70, bmem, zkey, kLen, 0) == 0);  // 1024 packets by reference
    for (int i = 0; i < 3; ++i) b.poll_all();       // some of them are in the ring now
    REQUIRE(tctr(b, transport::Ctr::TxZeroCopy) > zc0);
    REQUIRE(tctr(b, transport::Ctr::TxZeroCopy) < zc0 + 1024);
    std::atomic<bool> stop{false};
    std::thread drain([&] {
      while (!stop.load()) a.poll_all();
    });
    const int rc = b.dereg_mr(0, zkey);
    stop = true;
    drain.join();
    CHECK(rc == 0);  // every segment came back within the wait
    std::memset(bmem, 0x99, kLen);  // the owner reuses its memory at once
    verbs::Wc wc;
    int got = 0;
    for (int it = 0; it < 5'000'000 && got == 0; ++it) {
      a.poll_all();
      b.poll_all();
      got = qb.scq->poll(&wc, 1);
    }
    REQUIRE(got == 1);
    CHECK(wc.wr_id == 70);
    CHECK(wc.status == verbs::WcStatus::LocProtErr);
    for (int i = 0; i < 1000; ++i) a.poll_all();
    // What reached A is a prefix of the old contents, never the reused bytes.
    size_t n = 0;
    while (n < kLen && amem[n] == 0x42) ++n;
    CHECK(n < kLen);
    for (size_t k = n; k < kLen; ++k)
      if (amem[k] != 0) {
        FAIL_CHECK("byte " << k << " of A is " << int(amem[k]) << " after the prefix of " << n);
        break;
      }
  }

  // 4. Deregistration waits for the device: nothing in flight now, so it returns at once.
  for (int i = 0; i < 100; ++i) {
    a.poll_all();
    b.poll_all();
  }
  CHECK(b.dereg_mr(0, bkey) == 0);
  CHECK(a.dereg_mr(0, akey) == 0);
  CHECK(b.dereg_mr(0, hkey) == 0);
}

TEST_CASE("dataplane: QPN 1 (GSI) lives on the port's home core; frames for it reach it from any queue") {
  // Two embedded dataplanes, two cores each. A's QP1 on its home core; B sends
  // to it from a UD QP of B's core 1, whose frames land on A's queue 1
  // (core 1): the classifier must hand them to core 0 (1 % 2 would keep them).
  dpdk::RingPair rings("dpgsi", 2);
  dpdk::Port pa(dpdk::PortConfig{.port_id = rings.port_a(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  dpdk::Port pb(dpdk::PortConfig{.port_id = rings.port_b(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  Dataplane a(make_cfg(pa, 0x0A3E0001, {rte_lcore_id(), rte_lcore_id()}, nullptr));
  Dataplane b(make_cfg(pb, 0x0A3E0002, {rte_lcore_id(), rte_lcore_id()}, nullptr));
  REQUIRE(a.port_cores(0).size() == 2);
  CHECK(a.home_core(0) == a.port_cores(0)[0]);
  CHECK(a.owner_core(0, transport::kGsiQpn) == a.home_core(0));
  CHECK(a.owner_core(0, 3) == a.port_cores(0)[1]);
  const uint32_t pda = a.alloc_pd(), pdb = b.alloc_pd();
  auto* amem = static_cast<uint8_t*>(a.alloc_dma(4096));
  auto* bmem = static_cast<uint8_t*>(b.alloc_dma(4096));
  REQUIRE(amem);
  REQUIRE(bmem);
  uint32_t akey = 0, bkey = 0;
  REQUIRE(a.reg_mr(0, pda, amem, 4096, verbs::kAccessAll, &akey) == 0);
  REQUIRE(b.reg_mr(0, pdb, bmem, 4096, verbs::kAccessAll, &bkey) == 0);
  wire::MacAddr amac{}, bmac{};
  REQUIRE(b.resolve(0, wire::gid_from_ipv4(0x0A3E0001), amac));
  REQUIRE(a.resolve(0, wire::gid_from_ipv4(0x0A3E0002), bmac));

  // A UD QP in RTS on core `core` of dp: QP1 when gsi, else an ordinary one with QP1's Q_Key.
  auto ud_up = [](Dataplane& dp, size_t core, uint32_t pd, bool gsi, QpRef& out) {
    out.core = core;
    QpRef* r = &out;
    return dp.run_on(core, [=](CoreLoop& c) {
      transport::Engine* e = c.engine(0);
      r->scq = e->create_cq(64);
      r->rcq = e->create_cq(64);
      verbs::QpInitAttr init;
      init.qp_type = verbs::QpType::UD;
      init.pd = pd;
      init.send_cq = r->scq;
      init.recv_cq = r->rcq;
      init.cap.max_send_wr = 8;
      init.cap.max_recv_wr = 8;
      if ((gsi ? e->create_gsi_qp(init, &r->qpn) : e->create_qp(init, &r->qpn)) != 0) return;
      using namespace verbs;
      QpAttr at;
      at.qp_state = QpState::Init;
      at.qkey = transport::kGsiQkey;
      e->modify_qp(r->qpn, at, kQpState | kQpPkeyIndex | kQpPort | kQpQkey);
      at.qp_state = QpState::Rtr;
      e->modify_qp(r->qpn, at, kQpState);
      at.qp_state = QpState::Rts;
      e->modify_qp(r->qpn, at, kQpState | kQpSqPsn);
    });
  };
  QpRef ga{}, ub{};
  REQUIRE(ud_up(a, a.home_core(0), pda, true, ga));
  REQUIRE(ga.qpn == transport::kGsiQpn);
  // B's sender: an odd QPN, i.e. B's core 1, which transmits on queue 1.
  REQUIRE(ud_up(b, b.port_cores(0)[1], pdb, false, ub));
  REQUIRE(ub.qpn % 2 == 1);
  CHECK(a.core(a.port_cores(0)[1]).engine(0)->qp(transport::kGsiQpn) == nullptr);

  transport::Engine* ea = a.core(ga.core).engine(0);
  transport::Engine* eb = b.core(ub.core).engine(0);
  verbs::RecvWr r;
  r.wr_id = 5;
  r.num_sge = 1;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(amem), 40 + 256, akey};
  REQUIRE(ea->post_recv(ga.qpn, r) == 0);
  r.wr_id = 6;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(bmem + 1024), 40 + 256, bkey};
  REQUIRE(eb->post_recv(ub.qpn, r) == 0);
  for (int i = 0; i < 256; ++i) bmem[i] = static_cast<uint8_t>(i ^ 0xA5);
  verbs::Ah ah;
  ah.dgid = wire::gid_from_ipv4(0x0A3E0001);
  ah.dmac = amac;
  ah.hop_limit = 64;
  const verbs::Ah bah = ah;  // the engine copies the AH at post time (as the shim's AH slots)
  verbs::SendWr w;
  w.wr_id = 1;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(bmem), 256, bkey};
  w.ud = {&bah, transport::kGsiQpn, transport::kGsiQkey};
  const uint64_t fwd0 = a.core_counters().sum(stats::CoreCounter::ring_enqueued);
  REQUIRE(eb->post_send(ub.qpn, w) == 0);
  verbs::Wc wc{};
  int got = 0;
  for (int it = 0; it < 100000 && !got; ++it) {
    b.poll_all();
    a.poll_all();
    got = ga.rcq->poll(&wc, 1);
  }
  REQUIRE(got == 1);
  CHECK(wc.status == verbs::WcStatus::Success);
  CHECK(wc.wr_id == 5);
  CHECK(wc.src_qp == ub.qpn);
  CHECK(wc.byte_len == 40 + 256);
  CHECK(std::memcmp(amem + 40, bmem, 256) == 0);
  CHECK(a.core_counters().sum(stats::CoreCounter::ring_enqueued) > fwd0);  // crossed from core 1 to core 0
  CHECK(tctr(a, transport::Ctr::RxNoQp) == 0);

  // QP1 answers from the home core; the frame carries source QPN 1.
  ah.dgid = wire::gid_from_ipv4(0x0A3E0002);
  ah.dmac = bmac;
  const verbs::Ah aah = ah;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(amem + 40), 256, akey};
  w.ud = {&aah, ub.qpn, transport::kGsiQkey};
  REQUIRE(ea->post_send(ga.qpn, w) == 0);
  got = 0;
  for (int it = 0; it < 100000 && !got; ++it) {
    a.poll_all();
    b.poll_all();
    got = ub.rcq->poll(&wc, 1);
  }
  REQUIRE(got == 1);
  CHECK(wc.status == verbs::WcStatus::Success);
  CHECK(wc.src_qp == transport::kGsiQpn);
  CHECK(std::memcmp(bmem + 1024 + 40, bmem, 256) == 0);
  for (int i = 0; i < 100; ++i) {
    a.poll_all();
    b.poll_all();
  }
}

TEST_CASE("embedded: the port's RDMA CM (Embedded::cm) connects two nodes and the negotiated QPs carry data") {
  testing::EmbeddedPair nodes("dpcm", "10.63.0.1", "10.63.0.2");
  engine::Embedded &a = nodes.a, &b = nodes.b;
  std::vector<cm::Event> ea, eb;
  a.set_cm_sink([&](const cm::Event& e) { ea.push_back(e); });
  b.set_cm_sink([&](const cm::Event& e) { eb.push_back(e); });
  // Polls both nodes until the event arrives (bounded in polls and in time).
  auto wait = [&](std::vector<cm::Event>& v, cm::EventType t, cm::Event* out) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int it = 0; it < 20'000'000 && std::chrono::steady_clock::now() < give_up; ++it) {
      if (testing::take_event(v, t, out)) return true;
      a.poll();
      b.poll();
    }
    return false;
  };
  const wire::Gid ga = wire::gid_from_ipv4(0x0A3F0001), gb = wire::gid_from_ipv4(0x0A3F0002);
  cm::ConnId l = 0, act = 0;
  REQUIRE(b.cm().listen(cm::PortSpace::Tcp, {{}, 4420}, cm::QpKind::Rc, 1, &l) == 0);
  REQUIRE(b.gsi() != nullptr);
  CHECK(b.dataplane().core(b.dataplane().home_core(0)).engine(0)->qp(1) != nullptr);
  const uint32_t pda = a.alloc_pd(), pdb = b.alloc_pd();
  engine::QpOptions qo;
  qo.cap.max_send_wr = 16;
  qo.cap.max_recv_wr = 16;
  engine::QpHandle qa = a.create_qp(pda, qo), qb = b.create_qp(pdb, qo);
  cm::ConnectArgs args;
  args.local = {ga, 50000};
  args.remote = {gb, 4420};
  args.param.qpn = qa.qpn;
  REQUIRE(a.cm().connect(args, 2, &act) == 0);  // the MAC of B is not known yet: ARP first, the REQ on a retry
  cm::Event req;
  REQUIRE(wait(eb, cm::EventType::ConnectRequest, &req));
  CHECK(req.param.qpn == qa.qpn);
  CHECK(req.remote.ip == ga);
  cm::ConnParam acc;
  acc.qpn = qb.qpn;
  REQUIRE(b.cm().accept(req.id, acc) == 0);
  cm::Event rep;
  REQUIRE(wait(ea, cm::EventType::ConnectResponse, &rep));
  CHECK(rep.param.qpn == qb.qpn);
  // Both QPs to RTS with what the CM negotiated (rdma_init_qp_attr's part).
  auto up = [](engine::Embedded& n, engine::QpHandle& q, const cm::QpParams& p) {
    q.opt.psn = p.sq_psn;
    return n.connect(q, engine::QpPeer{p.dest_qpn, p.rq_psn, p.dgid, {}});
  };
  cm::QpParams pa_{}, pb_{};
  REQUIRE(a.cm().qp_params(act, pa_) == 0);
  REQUIRE(b.cm().qp_params(req.id, pb_) == 0);
  REQUIRE(up(b, qb, pb_) == 0);
  REQUIRE(up(a, qa, pa_) == 0);
  REQUIRE(a.cm().establish(act) == 0);
  REQUIRE(wait(eb, cm::EventType::Established, nullptr));
  // A SEND over the connection the CM set up.
  auto* amem = static_cast<uint8_t*>(a.alloc_dma(4096));
  auto* bmem = static_cast<uint8_t*>(b.alloc_dma(4096));
  REQUIRE(amem);
  REQUIRE(bmem);
  uint32_t ak = 0, bk = 0;
  REQUIRE(a.reg_mr(pda, amem, 4096, verbs::kAccessAll, &ak) == 0);
  REQUIRE(b.reg_mr(pdb, bmem, 4096, verbs::kAccessAll, &bk) == 0);
  for (int i = 0; i < 1000; ++i) amem[i] = static_cast<uint8_t>(i * 11);
  verbs::RecvWr r;
  r.num_sge = 1;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(bmem), 4096, bk};
  REQUIRE(b.post_recv(qb, r) == 0);
  verbs::SendWr w;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(amem), 1000, ak};
  REQUIRE(a.post_send(qa, w) == 0);
  verbs::Wc wc{};
  int got = 0;
  for (int it = 0; it < 1'000'000 && !got; ++it) {
    a.poll();
    b.poll();
    got = qb.rcq->poll(&wc, 1);
  }
  REQUIRE(got == 1);
  CHECK(wc.status == verbs::WcStatus::Success);
  CHECK(wc.byte_len == 1000);
  CHECK(std::memcmp(amem, bmem, 1000) == 0);
  // Disconnect: both sides hear of it.
  REQUIRE(b.cm().disconnect(req.id) == 0);
  REQUIRE(wait(ea, cm::EventType::Disconnected, nullptr));
  REQUIRE(wait(eb, cm::EventType::Disconnected, nullptr));
  CHECK(a.gsi()->counter(cm::GsiCtr::RxShort) == 0);
  CHECK(a.cm().counter(cm::CmCtr::RxBad) == 0);
  // A handle posts to its engine's QP without a lookup (QpHandle::qp); once
  // the QP is destroyed it posts nothing (EINVAL, as an unknown QPN did).
  REQUIRE(a.destroy_qp(qa) == 0);
  CHECK(qa.qp == nullptr);
  CHECK(a.post_send(qa, w) == EINVAL);
  CHECK(a.post_recv(qa, r) == EINVAL);
  engine::Embedded::prefetch_post(qa);  // hints: nothing to ask for
  engine::Embedded::prefetch_post_wqe(qa);
}

TEST_CASE("dataplane: loopback: QPs of one port talk through the dataplane, not the wire (RC all opcodes, UD, QP on another core)") {
  dpdk::RingPair rings("dplb", 2);
  dpdk::Port pa(dpdk::PortConfig{.port_id = rings.port_a(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  dpdk::Port pb(dpdk::PortConfig{.port_id = rings.port_b(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  constexpr uint32_t kIp = 0x0A3F0001;
  engine::DataplaneConfig c = make_cfg(pa, kIp, {rte_lcore_id(), rte_lcore_id()}, nullptr);
  c.engine.zero_copy_min = 512;  // the 64 KiB transfers leave by reference: the loopback must copy them
  Dataplane d(c);
  REQUIRE(d.port_cores(0).size() == 2);
  const wire::Gid me = wire::gid_from_ipv4(kIp);
  auto pc = [&](stats::PortCounter k) { return d.port_counters(0).sum(k); };

  // Our own address resolves to our own MAC at once, without an ARP request.
  wire::MacAddr mac{};
  REQUIRE(d.resolve_step(0, me, mac) == Dataplane::ResolveStep::Ready);
  CHECK(mac == pa.mac());
  CHECK(pc(stats::PortCounter::tx_arp) == 0);
  CHECK(d.neighbours().empty());

  const uint32_t pd = d.alloc_pd();
  constexpr size_t kLen = 5 << 20;
  auto* mem = static_cast<uint8_t*>(d.alloc_dma(kLen));
  REQUIRE(mem);
  std::memset(mem, 0, kLen);
  uint32_t key = 0;
  REQUIRE(d.reg_mr(0, pd, mem, kLen, verbs::kAccessAll, &key) == 0);
  const uint64_t base = reinterpret_cast<uint64_t>(mem);

  // q0 <-> q1: QPs on the two cores (frames cross through the SPSC rings);
  // q2 <-> q3: both on core 0 (the loopback FIFO straight into the same engine).
  QpRef q0 = make_qp(d, 0, pd), q1 = make_qp(d, 1, pd), q2 = make_qp(d, 0, pd), q3 = make_qp(d, 0, pd);
  REQUIRE(q0.qpn % 2 == 0);
  REQUIRE(q1.qpn % 2 == 1);
  REQUIRE(to_rts(d, q0, q1.qpn, me, mac) == 0);
  REQUIRE(to_rts(d, q1, q0.qpn, me, mac) == 0);
  REQUIRE(to_rts(d, q2, q3.qpn, me, mac) == 0);
  REQUIRE(to_rts(d, q3, q2.qpn, me, mac) == 0);

  // Polls until n completions on cq; each must succeed. Returns them.
  auto wait = [&](verbs::Cq* cq, int n) {
    std::vector<verbs::Wc> out;
    for (int it = 0; it < 2'000'000 && static_cast<int>(out.size()) < n; ++it) {
      d.poll_all();
      verbs::Wc wc;
      while (cq->poll(&wc, 1) == 1) out.push_back(wc);
    }
    for (const auto& wc : out) CHECK(wc.status == verbs::WcStatus::Success);
    return out;
  };
  auto post = [&](const QpRef& q, verbs::SendWr w) { return d.core(q.core).engine(0)->post_send(q.qpn, w); };
  auto recv = [&](const QpRef& q, uint64_t id, uint64_t addr, uint32_t len) {
    verbs::RecvWr r;
    r.wr_id = id;
    r.num_sge = 1;
    r.sg_list[0] = {addr, len, key};
    return d.core(q.core).engine(0)->post_recv(q.qpn, r);
  };
  for (size_t k = 0; k < (1u << 20); ++k) mem[k] = static_cast<uint8_t>(k * 7 + 3);

  for (auto [a, b, off] : {std::tuple{q0, q1, size_t{1} << 20}, std::tuple{q2, q3, size_t{2} << 20}}) {
    INFO("QPN " << a.qpn << " (core " << a.core << ") -> QPN " << b.qpn << " (core " << b.core << ")");
    // WRITE 64 KiB (zero-copy source), WRITE with immediate, SEND with immediate.
    verbs::SendWr w;
    w.opcode = verbs::WrOpcode::RdmaWrite;
    w.num_sge = 1;
    w.sg_list[0] = {base, 65536, key};
    w.rdma = {base + off, key};
    REQUIRE(post(a, w) == 0);
    REQUIRE(recv(b, 11, base + off + 0x80000, 4096) == 0);
    REQUIRE(recv(b, 12, base + off + 0x90000, 4096) == 0);
    w.opcode = verbs::WrOpcode::RdmaWriteImm;
    w.sg_list[0] = {base + 100, 1000, key};
    w.rdma = {base + off + 0x10000, key};
    w.imm_data = 0x11223344;
    REQUIRE(post(a, w) == 0);
    w.opcode = verbs::WrOpcode::SendImm;
    w.sg_list[0] = {base + 200, 3000, key};
    w.imm_data = 0x55667788;
    REQUIRE(post(a, w) == 0);
    REQUIRE(wait(a.scq, 3).size() == 3);
    auto rw = wait(b.rcq, 2);
    REQUIRE(rw.size() == 2);
    CHECK(rw[0].opcode == verbs::WcOpcode::RecvRdmaWithImm);
    CHECK(rw[0].imm_data == 0x11223344);
    CHECK(rw[1].opcode == verbs::WcOpcode::Recv);
    CHECK(rw[1].imm_data == 0x55667788);
    CHECK(rw[1].byte_len == 3000);
    CHECK(std::memcmp(mem + off, mem, 65536) == 0);
    CHECK(std::memcmp(mem + off + 0x10000, mem + 100, 1000) == 0);
    CHECK(std::memcmp(mem + off + 0x90000, mem + 200, 3000) == 0);
    // READ 64 KiB back into another place; fetch-and-add and compare-and-swap.
    verbs::SendWr r;
    r.opcode = verbs::WrOpcode::RdmaRead;
    r.num_sge = 1;
    r.sg_list[0] = {base + off + 0x20000, 65536, key};
    r.rdma = {base + 4096, key};
    REQUIRE(post(a, r) == 0);
    uint64_t word = 1000;
    std::memcpy(mem + off + 0x40000, &word, 8);
    verbs::SendWr at;
    at.opcode = verbs::WrOpcode::AtomicFetchAdd;
    at.num_sge = 1;
    at.sg_list[0] = {base + off + 0x40008, 8, key};
    at.atomic = {base + off + 0x40000, 5, 0, key};
    REQUIRE(post(a, at) == 0);
    at.opcode = verbs::WrOpcode::AtomicCmpSwp;
    at.sg_list[0] = {base + off + 0x40010, 8, key};
    at.atomic = {base + off + 0x40000, 1005, 77, key};
    REQUIRE(post(a, at) == 0);
    REQUIRE(wait(a.scq, 3).size() == 3);
    CHECK(std::memcmp(mem + off + 0x20000, mem + 4096, 65536) == 0);
    uint64_t v = 0;
    std::memcpy(&v, mem + off + 0x40008, 8);
    CHECK(v == 1000);  // fetch-add returned the old value
    std::memcpy(&v, mem + off + 0x40010, 8);
    CHECK(v == 1005);  // compare-and-swap saw the sum
    std::memcpy(&v, mem + off + 0x40000, 8);
    CHECK(v == 77);
  }

  // 1 MiB WRITEs both ways between q2 and q3 (one core): 64 request packets
  // per poll against a receive burst of 32 outrun the loopback FIFO (256): it
  // pushes back like a full device queue; nothing is lost or resent.
  const uint64_t retrans0 = tctr(d, transport::Ctr::ReqRetransmits);
  {
    verbs::SendWr w;
    w.opcode = verbs::WrOpcode::RdmaWrite;
    w.num_sge = 1;
    w.sg_list[0] = {base, 1u << 20, key};
    w.rdma = {base + (3u << 20), key};
    REQUIRE(post(q2, w) == 0);
    w.sg_list[0] = {base + 8, (1u << 20) - 8, key};
    w.rdma = {base + (4u << 20), key};
    REQUIRE(post(q3, w) == 0);
    REQUIRE(wait(q2.scq, 1).size() == 1);
    REQUIRE(wait(q3.scq, 1).size() == 1);
    CHECK(std::memcmp(mem + (3u << 20), mem, 1u << 20) == 0);
    CHECK(std::memcmp(mem + (4u << 20), mem + 8, (1u << 20) - 8) == 0);
  }
  CHECK(pc(stats::PortCounter::loopback_full) > 0);
  CHECK(pc(stats::PortCounter::loopback_drops) == 0);
  CHECK(tctr(d, transport::Ctr::ReqRetransmits) == retrans0);

  // UD to ourselves: core 1's UD QP sends to core 0's, and core 0's to itself.
  auto make_ud = [&](size_t core) {
    auto r = std::make_shared<QpRef>();
    r->core = core;
    REQUIRE(d.run_on(core, [r, pd](CoreLoop& cl) {
      transport::Engine* e = cl.engine(0);
      r->scq = e->create_cq(64);
      r->rcq = e->create_cq(64);
      verbs::QpInitAttr init;
      init.qp_type = verbs::QpType::UD;
      init.pd = pd;
      init.send_cq = r->scq;
      init.recv_cq = r->rcq;
      if (e->create_qp(init, &r->qpn) != 0) return;
      using namespace verbs;
      QpAttr a;
      a.qp_state = QpState::Init;
      a.qkey = 0x1234;
      if (e->modify_qp(r->qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpQkey)) r->qpn = 0;
      a.qp_state = QpState::Rtr;
      if (e->modify_qp(r->qpn, a, kQpState)) r->qpn = 0;
      a.qp_state = QpState::Rts;
      a.sq_psn = 5;
      if (e->modify_qp(r->qpn, a, kQpState | kQpSqPsn)) r->qpn = 0;
    }));
    REQUIRE(r->qpn != 0);
    return *r;
  };
  QpRef u0 = make_ud(0), u1 = make_ud(1);
  verbs::Ah ah;
  ah.dgid = me;
  ah.dmac = mac;
  const verbs::Ah* ah1 = d.core(1).engine(0)->create_ah(d.core(1).engine(0)->alloc_pd(), ah);
  const verbs::Ah* ah0 = d.core(0).engine(0)->create_ah(d.core(0).engine(0)->alloc_pd(), ah);
  REQUIRE(ah0);
  REQUIRE(ah1);
  REQUIRE(recv(u0, 21, base + 0x300000, 2048) == 0);
  REQUIRE(recv(u0, 22, base + 0x301000, 2048) == 0);
  for (auto [q, a, from] : {std::tuple{u1, ah1, 0}, std::tuple{u0, ah0, 500}}) {
    verbs::SendWr w;
    w.opcode = verbs::WrOpcode::Send;
    w.num_sge = 1;
    w.sg_list[0] = {base + static_cast<uint64_t>(from), 1000, key};
    w.ud = {a, u0.qpn, 0x1234};
    REQUIRE(post(q, w) == 0);
    REQUIRE(wait(q.scq, 1).size() == 1);
  }
  auto ru = wait(u0.rcq, 2);
  REQUIRE(ru.size() == 2);
  CHECK(ru[0].byte_len == 1040);  // GRH + payload
  CHECK(ru[1].byte_len == 1040);
  // Two senders: the arrival order is free (a UD send completes when sent).
  const bool in_order = std::memcmp(mem + 0x300000 + 40, mem, 1000) == 0 &&
                        std::memcmp(mem + 0x301000 + 40, mem + 500, 1000) == 0;
  const bool swapped = std::memcmp(mem + 0x300000 + 40, mem + 500, 1000) == 0 &&
                       std::memcmp(mem + 0x301000 + 40, mem, 1000) == 0;
  CHECK((in_order || swapped));

  // Nothing of it went on the wire; every frame came back through the loopback.
  CHECK(pc(stats::PortCounter::tx_packets) == 0);
  CHECK(pc(stats::PortCounter::tx_loopback) > 2000);
  CHECK(d.core_counters().sum(stats::CoreCounter::ring_enqueued) > 0);  // q0/q1, u1 -> u0 crossed cores
  CHECK(tctr(d, transport::Ctr::RxIcrcErr) == 0);
  d.stop();
}

TEST_CASE("dataplane: UD multicast: group MACs accepted, fan-out to every core with members, loopback to local members, counted drops") {
  dpdk::RingPair rings("dpmc", 2);
  dpdk::Port pa(dpdk::PortConfig{.port_id = rings.port_a(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  dpdk::Port pb(dpdk::PortConfig{.port_id = rings.port_b(), .rx_queues = 2, .tx_queues = 2, .mbufs = 4095});
  Dataplane a(make_cfg(pa, 0x0A400001, {rte_lcore_id(), rte_lcore_id()}, nullptr));
  Dataplane b(make_cfg(pb, 0x0A400002, {rte_lcore_id(), rte_lcore_id()}, nullptr));
  const wire::Gid group = wire::gid_from_ipv4(0xEF010203);   // 239.1.2.3
  const wire::Gid nobody = wire::gid_from_ipv4(0xEF090909);  // 239.9.9.9: no member anywhere
  constexpr uint32_t kQkey = 0x01234567;

  struct Mem {
    Dataplane* dp;
    uint8_t* p;
    uint32_t key;
  };
  auto mem_of = [](Dataplane& d, uint32_t pd) {
    Mem m{&d, static_cast<uint8_t*>(d.alloc_dma(1 << 20)), 0};
    REQUIRE(m.p);
    std::memset(m.p, 0, 1 << 20);
    REQUIRE(d.reg_mr(0, pd, m.p, 1 << 20, verbs::kAccessAll, &m.key) == 0);
    return m;
  };
  const uint32_t pda = a.alloc_pd(), pdb = b.alloc_pd();
  Mem ma = mem_of(a, pda), mb = mem_of(b, pdb);
  auto make_ud = [](Dataplane& d, size_t core, uint32_t pd) {
    auto r = std::make_shared<QpRef>();
    r->core = core;
    REQUIRE(d.run_on(core, [r, pd](CoreLoop& cl) {
      transport::Engine* e = cl.engine(0);
      r->scq = e->create_cq(64);
      r->rcq = e->create_cq(64);
      verbs::QpInitAttr init;
      init.qp_type = verbs::QpType::UD;
      init.pd = pd;
      init.send_cq = r->scq;
      init.recv_cq = r->rcq;
      if (e->create_qp(init, &r->qpn) != 0) return;
      using namespace verbs;
      QpAttr at;
      at.qp_state = QpState::Init;
      at.qkey = kQkey;
      if (e->modify_qp(r->qpn, at, kQpState | kQpPkeyIndex | kQpPort | kQpQkey)) r->qpn = 0;
      at.qp_state = QpState::Rtr;
      if (e->modify_qp(r->qpn, at, kQpState)) r->qpn = 0;
      at.qp_state = QpState::Rts;
      if (e->modify_qp(r->qpn, at, kQpState | kQpSqPsn)) r->qpn = 0;
    }));
    REQUIRE(r->qpn != 0);
    return *r;
  };
  // Node b: members on both cores, and a UD QP that joins nothing. Node a: the
  // sender (core 1) and a member on core 0 (gets the sender's frames through
  // the loopback, as a second rxe QP of the same device would).
  QpRef r0 = make_ud(b, 0, pdb), r1 = make_ud(b, 1, pdb), idle = make_ud(b, 0, pdb);
  QpRef s = make_ud(a, 1, pda), m = make_ud(a, 0, pda);
  REQUIRE(r0.qpn % 2 == 0);
  REQUIRE(r1.qpn % 2 == 1);
  REQUIRE(s.qpn % 2 == 1);
  REQUIRE(m.qpn % 2 == 0);
  CHECK(b.attach_mcast(0, r0.qpn, group) == 0);
  CHECK(b.attach_mcast(0, r1.qpn, group) == 0);
  CHECK(b.attach_mcast(0, r1.qpn, group) == 0);  // twice: one membership
  CHECK(a.attach_mcast(0, m.qpn, group) == 0);
  CHECK(a.attach_mcast(0, s.qpn, group) == 0);   // the sender is a member too: it never hears itself
  // Bad attaches: not multicast, not UD, no such QP.
  CHECK(b.attach_mcast(0, r0.qpn, wire::gid_from_ipv4(0x0A400001)) == EINVAL);
  QpRef rc = make_qp(b, 0, pdb);
  CHECK(b.attach_mcast(0, rc.qpn, group) == EINVAL);
  // QPNs are random: pick an even (core 0) number that no QP of node b has.
  uint32_t nobody_qpn = 60;
  while (nobody_qpn == r0.qpn || nobody_qpn == idle.qpn || nobody_qpn == rc.qpn) nobody_qpn += 2;
  CHECK(b.attach_mcast(0, nobody_qpn, group) == EINVAL);
  CHECK(b.detach_mcast(0, idle.qpn, group) == EINVAL);
  CHECK(b.mcast_groups(0) == std::vector<wire::Gid>{group});
  CHECK(b.core(0).engine(0)->mcast_memberships() == 1);
  CHECK(b.core(1).engine(0)->mcast_memberships() == 1);

  // The sender's AH: the group's MAC comes from the address (no ARP).
  wire::MacAddr gmac{};
  REQUIRE(a.resolve_step(0, group, gmac) == Dataplane::ResolveStep::Ready);
  CHECK(gmac == wire::MacAddr{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03});
  transport::Engine* es = a.core(1).engine(0);
  verbs::Ah ah;
  ah.dgid = group;
  ah.dmac = gmac;
  ah.hop_limit = 64;
  const verbs::Ah* gah = es->create_ah(es->alloc_pd(), ah);
  verbs::Ah ah2 = ah;
  ah2.dgid = nobody;
  REQUIRE(a.resolve_step(0, nobody, ah2.dmac) == Dataplane::ResolveStep::Ready);
  const verbs::Ah* nah = es->create_ah(es->alloc_pd(), ah2);
  REQUIRE(gah);
  REQUIRE(nah);

  auto recv = [](Dataplane& d, const QpRef& q, const Mem& mm, uint64_t off) {
    verbs::RecvWr r;
    r.wr_id = off;
    r.num_sge = 1;
    r.sg_list[0] = {reinterpret_cast<uint64_t>(mm.p) + off, 2048, mm.key};
    return d.core(q.core).engine(0)->post_recv(q.qpn, r);
  };
  auto send = [&](const verbs::Ah* to, uint32_t qkey, uint8_t tag) {
    std::memset(ma.p + 0x80000, tag, 1000);
    verbs::SendWr w;
    w.opcode = verbs::WrOpcode::Send;
    w.num_sge = 1;
    w.sg_list[0] = {reinterpret_cast<uint64_t>(ma.p) + 0x80000, 1000, ma.key};
    w.ud = {to, wire::kMcastQpn, qkey};
    REQUIRE(es->post_send(s.qpn, w) == 0);
    REQUIRE(wait_send(a, b, s.scq, 1) == 1);
  };
  // Polls both nodes until each cq has its count of receives (bounded), then
  // a while longer so that an extra one would show; returns the counts.
  auto settle = [&](std::vector<std::pair<verbs::Cq*, int>> want) {
    std::vector<int> got(want.size(), 0);
    auto drain = [&] {
      for (size_t i = 0; i < want.size(); ++i) {
        verbs::Wc wc;
        while (want[i].first->poll(&wc, 1) == 1) {
          CHECK(wc.status == verbs::WcStatus::Success);
          CHECK(wc.byte_len == 1040);
          ++got[i];
        }
      }
    };
    for (int it = 0; it < 2'000'000; ++it) {
      a.poll_all();
      b.poll_all();
      drain();
      bool all = true;
      for (size_t i = 0; i < want.size(); ++i) all = all && got[i] >= want[i].second;
      if (all) break;
    }
    for (int it = 0; it < 2000; ++it) {
      a.poll_all();
      b.poll_all();
    }
    drain();
    return got;
  };
  for (uint64_t k = 0; k < 4; ++k) {
    REQUIRE(recv(b, r0, mb, 0x1000 * k) == 0);
    REQUIRE(recv(b, r1, mb, 0x10000 + 0x1000 * k) == 0);
    REQUIRE(recv(b, idle, mb, 0x20000 + 0x1000 * k) == 0);
    REQUIRE(recv(a, m, ma, 0x1000 * k) == 0);
    REQUIRE(recv(a, s, ma, 0x10000 + 0x1000 * k) == 0);
  }

  // 1. To the group: both members of node b (one frame, two cores), the
  // local member of node a; not the QP that joined nothing, not the sender.
  const uint64_t fan0 = b.core_counters().sum(stats::CoreCounter::mcast_fanout);
  send(gah, kQkey, 0xA1);
  auto got = settle({{r0.rcq, 1}, {r1.rcq, 1}, {idle.rcq, 0}, {m.rcq, 1}, {s.rcq, 0}});
  CHECK(got == std::vector<int>{1, 1, 0, 1, 0});
  CHECK(mb.p[40] == 0xA1);                // r0's buffer (after the 40-byte GRH)
  CHECK(mb.p[0x10000 + 40] == 0xA1);      // r1's
  CHECK(ma.p[40] == 0xA1);                // m's, through node a's loopback
  CHECK(b.core_counters().sum(stats::CoreCounter::mcast_fanout) - fan0 == 2);
  CHECK(tctr(b, transport::Ctr::McastDelivered) == 2);
  CHECK(tctr(a, transport::Ctr::McastDelivered) == 1);
  CHECK(b.port_counters(0).sum(stats::PortCounter::rx_drop_not_ours) == 0);
  CHECK(a.port_counters(0).sum(stats::PortCounter::tx_loopback) == 1);

  // 2. A wrong Q_Key: counted by each member's engine, nothing delivered.
  const uint64_t qk0 = tctr(b, transport::Ctr::UdQkeyDrop);
  send(gah, 0x999, 0xA2);
  got = settle({{r0.rcq, 0}, {r1.rcq, 0}, {m.rcq, 0}});
  CHECK(got == std::vector<int>{0, 0, 0});
  CHECK(tctr(b, transport::Ctr::UdQkeyDrop) - qk0 == 2);

  // 3. A group nobody joined: one counted drop on each node (node b's home
  // core: its members are in another group).
  const uint64_t ng0 = tctr(b, transport::Ctr::RxMcastNoGroup);
  send(nah, kQkey, 0xA3);
  got = settle({{r0.rcq, 0}, {r1.rcq, 0}, {m.rcq, 0}});
  CHECK(got == std::vector<int>{0, 0, 0});
  CHECK(tctr(b, transport::Ctr::RxMcastNoGroup) - ng0 == 2);  // both cores have members (of the other group)

  // 4. r1 leaves: only r0 hears; core 1 of node b has no member left, so the
  // frame is not sent there.
  CHECK(b.detach_mcast(0, r1.qpn, group) == 0);
  CHECK(b.detach_mcast(0, r1.qpn, group) == EINVAL);
  CHECK(b.core(1).engine(0)->mcast_memberships() == 0);
  const uint64_t fan1 = b.core_counters().sum(stats::CoreCounter::mcast_fanout);
  send(gah, kQkey, 0xA4);
  got = settle({{r0.rcq, 1}, {r1.rcq, 0}, {m.rcq, 1}});
  CHECK(got == std::vector<int>{1, 0, 1});
  CHECK(b.core_counters().sum(stats::CoreCounter::mcast_fanout) - fan1 == 1);

  // 5. Destroying the last member leaves the group: node b then takes the
  // group's frames on its home core only, where they are counted.
  REQUIRE(b.run_on(0, [q = r0.qpn](CoreLoop& cl) { cl.engine(0)->destroy_qp(q); }));
  CHECK(b.mcast_sync(0) == 0);
  CHECK(b.mcast_groups(0).empty());
  const uint64_t ng1 = tctr(b, transport::Ctr::RxMcastNoGroup);
  send(gah, kQkey, 0xA5);
  got = settle({{r1.rcq, 0}, {idle.rcq, 0}, {m.rcq, 1}});
  CHECK(got == std::vector<int>{0, 0, 1});
  CHECK(tctr(b, transport::Ctr::RxMcastNoGroup) - ng1 == 1);
  CHECK(tctr(a, transport::Ctr::RxIcrcErr) == 0);
  CHECK(tctr(b, transport::Ctr::RxIcrcErr) == 0);
  a.stop();
  b.stop();
}

TEST_CASE("dataplane: bad configurations are refused with a clear error") {
  dpdk::RingPair rings("dpbad", 1);
  dpdk::Port pa(dpdk::PortConfig{.port_id = rings.port_a(), .mbufs = 1023});
  engine::DataplaneConfig c = make_cfg(pa, 0x0A3D0001, {0}, nullptr);
  c.cores[0].queues.push_back({0, 0});
  CHECK_THROWS_WITH(Dataplane(c), Catch::Contains("two queues of port"));
  c = make_cfg(pa, 0x0A3D0001, {0}, nullptr);
  c.cores[0].queues[0].queue = 3;
  CHECK_THROWS_WITH(Dataplane(c), Catch::Contains("has no queue 3"));
  c = make_cfg(pa, 0x0A3D0001, {0}, nullptr);
  c.cores[0].queues.clear();
  CHECK_THROWS_WITH(Dataplane(c), Catch::Contains("served by no core"));
}

int main(int argc, char** argv) {
  std::unique_ptr<dpdk::Eal> eal;
  try {
    eal = std::make_unique<dpdk::Eal>(dpdk::EalOptions{
        .args = {"--lcores=(0-2)@(0-1)", "--log-level=lib.eal:error"}, .program = "test_dataplane"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return Catch::Session().run(argc, argv);
}

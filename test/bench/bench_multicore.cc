// How the dataplane scales with cores, on real threads, in one run.
//
// One process, one Dataplane with two ports joined back to back by a net_ring
// pair (4 queues each). Every core runs its own poll loop (rte_eal_remote_launch
// on its own lcore, pinned to its own CPU) over its own queue of each port and
// owns its QPs; the workload is a poller on each core that keeps its QPs' send
// queues full of RC WRITEs and counts completions. Five runs, same flows:
//   1 core         all QPs on lcore 1
//   2 cores local  each sender QP and its peer on the same core
//   2 cores cross  each sender QP's peer on the other core: every request and
//                  ACK arrives on the queue of the core that does not own its
//                  QP and reaches the owner over the SPSC forwarding ring
//                  (counted "cross-core forwarded")
//   4 cores        the same two cases with four loops, two per CPU on this
//                  2-CPU host: they must work (data verified, frames
//                  forwarded); they cannot scale past the CPUs
// and prints the message rates, the 2-core / 1-core ratios, and the messages
// per CPU-second the core threads actually got (on a shared machine the
// wall-clock ratio is bounded by the CPU time the scheduler grants). The written
// bytes are verified after each run; exit status 1 on a mismatch, on a run
// without completions, or on a cross run that forwarded nothing.
//   bench_multicore [seconds-per-run] [message-size]
#include <rte_lcore.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "engine/dataplane.h"

using namespace droce;
using engine::CoreLoop;
using engine::Dataplane;

namespace {

constexpr uint32_t kIpA = 0x0A460001, kIpB = 0x0A460002;
constexpr int kFlows = 4;       // sender QPs (port 0) and their peers (port 1)
constexpr uint32_t kDepth = 64; // outstanding WRITEs per QP

struct Flow {
  size_t idx = 0;
  size_t score = 0, rcore = 0;  // cores owning the sender QP and its peer
  uint32_t sqpn = 0, rqpn = 0;
  verbs::Cq* scq = nullptr;
  transport::Engine* seng = nullptr;
  uint32_t outstanding = 0;
  uint64_t posted = 0;
};

struct alignas(64) CoreCount {
  std::atomic<uint64_t> done{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> cpu_start_ns{0}, cpu_end_ns{0};  // the core thread's CPU time over the measured interval
  std::atomic<uint64_t> done_at_end{0};
};

uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

uint32_t make_qp(Dataplane& dp, size_t core, uint32_t port, uint32_t pd, verbs::Cq** scq, transport::Engine** eng) {
  auto r = std::make_shared<std::tuple<uint32_t, verbs::Cq*, transport::Engine*>>(0, nullptr, nullptr);
  dp.run_on(core, [r, pd, port](CoreLoop& c) {
    transport::Engine* e = c.engine(port);
    verbs::Cq* cq = e->create_cq(1024);
    verbs::QpInitAttr init;
    init.pd = pd;
    init.send_cq = init.recv_cq = cq;
    init.cap.max_send_wr = 256;
    uint32_t qpn = 0;
    if (e->create_qp(init, &qpn) != 0) return;
    verbs::QpAttr a;
    a.qp_state = verbs::QpState::Init;
    a.qp_access_flags = verbs::kAccessAll;
    e->modify_qp(qpn, a, verbs::kQpState | verbs::kQpPkeyIndex | verbs::kQpPort | verbs::kQpAccessFlags);
    *r = {qpn, cq, e};
  });
  if (std::get<0>(*r) == 0) throw std::runtime_error("create_qp failed");
  if (scq) *scq = std::get<1>(*r);
  if (eng) *eng = std::get<2>(*r);
  return std::get<0>(*r);
}

void connect(Dataplane& dp, size_t core, uint32_t port, uint32_t qpn, uint32_t dqpn, uint32_t dip,
             const wire::MacAddr& dmac) {
  auto rc = std::make_shared<int>(-1);
  dp.run_on(core, [=](CoreLoop& c) {
    using namespace verbs;
    transport::Engine* e = c.engine(port);
    QpAttr a;
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::M4096;
    a.dest_qp_num = dqpn;
    a.rq_psn = 7;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    a.ah_attr.dgid = wire::gid_from_ipv4(dip);
    a.ah_attr.dmac = dmac;
    *rc = e->modify_qp(qpn, a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic |
                                    kQpMinRnrTimer);
    if (*rc) return;
    a.qp_state = QpState::Rts;
    a.sq_psn = 7;
    a.timeout = 14;
    a.max_rd_atomic = 16;
    *rc = e->modify_qp(qpn, a, kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic);
  });
  if (*rc != 0) throw std::runtime_error("modify_qp failed: " + std::to_string(*rc));
}

struct RunResult {
  double mpps = 0;
  double per_cpu = 0;  // messages per CPU-second of the core threads (millions)
  uint64_t forwarded = 0;
  bool verified = false;
};

RunResult run(dpdk::Port& pa, dpdk::Port& pb, const std::vector<unsigned>& lcores, bool cross, uint32_t size,
              double secs) {
  engine::DataplaneConfig cfg;
  for (auto* p : {&pa, &pb}) {
    engine::PortSpec ps;
    ps.name = p->name();
    ps.port = p;
    ps.host.ipv4 = {p == &pa ? kIpA : kIpB};
    cfg.ports.push_back(ps);
  }
  for (uint16_t i = 0; i < lcores.size(); ++i) cfg.cores.push_back({lcores[i], {{0, i}, {1, i}}});
  cfg.engine.max_qps = 64;
  cfg.engine.max_mrs = 16;
  Dataplane dp(std::move(cfg));
  const size_t ncores = lcores.size();
  const uint32_t pd = dp.alloc_pd();
  const size_t len = size_t{kFlows} * size * 2;
  auto* src = static_cast<uint8_t*>(dp.alloc_dma(len));
  auto* dst = static_cast<uint8_t*>(dp.alloc_dma(len));
  if (!src || !dst) throw std::runtime_error("no hugepage memory");
  for (size_t i = 0; i < len; ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  std::memset(dst, 0, len);
  uint32_t skey = 0, dkey = 0;
  if (dp.reg_mr(0, pd, src, len, verbs::kAccessAll, &skey) || dp.reg_mr(1, pd, dst, len, verbs::kAccessAll, &dkey))
    throw std::runtime_error("reg_mr failed");

  std::vector<Flow> flows(kFlows);
  for (int f = 0; f < kFlows; ++f) {
    Flow& fl = flows[f];
    fl.idx = static_cast<size_t>(f);
    fl.score = static_cast<size_t>(f) % ncores;
    fl.rcore = cross ? (fl.score + 1) % ncores : fl.score;
    fl.sqpn = make_qp(dp, fl.score, 0, pd, &fl.scq, &fl.seng);
    fl.rqpn = make_qp(dp, fl.rcore, 1, pd, nullptr, nullptr);
    connect(dp, fl.score, 0, fl.sqpn, fl.rqpn, kIpB, pb.mac());
    connect(dp, fl.rcore, 1, fl.rqpn, fl.sqpn, kIpA, pa.mac());
  }
  std::vector<CoreCount> counts(ncores);
  std::atomic<bool> go{false}, halt{false};
  dp.start();
  std::vector<uint64_t> pollers;
  for (size_t c = 0; c < ncores; ++c) {
    std::vector<Flow*> mine;
    for (auto& fl : flows)
      if (fl.score == c) mine.push_back(&fl);
    CoreCount* cc = &counts[c];
    pollers.push_back(dp.add_poller(c, [mine, cc, &go, &halt, src, dst, skey, dkey, size]() mutable -> uint32_t {
      if (!go.load(std::memory_order_relaxed)) return 0;
      if (cc->cpu_start_ns.load(std::memory_order_relaxed) == 0) cc->cpu_start_ns.store(thread_cpu_ns());
      uint32_t work = 0;
      const bool stopping = halt.load(std::memory_order_relaxed);
      if (stopping && cc->cpu_end_ns.load(std::memory_order_relaxed) == 0) {
        cc->cpu_end_ns.store(thread_cpu_ns());
        cc->done_at_end.store(cc->done.load(std::memory_order_relaxed));
      }
      for (Flow* fl : mine) {
        verbs::Wc wc[32];
        const int n = fl->scq->poll(wc, 32);
        for (int i = 0; i < n; ++i)
          if (wc[i].status != verbs::WcStatus::Success) cc->errors.fetch_add(1, std::memory_order_relaxed);
        fl->outstanding -= static_cast<uint32_t>(n);
        if (n) cc->done.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
        while (!stopping && fl->outstanding < kDepth) {
          const size_t off = fl->idx * size * 2 + (fl->posted & 1) * size;
          verbs::SendWr w;
          w.opcode = verbs::WrOpcode::RdmaWrite;
          w.num_sge = 1;
          w.sg_list[0] = {reinterpret_cast<uint64_t>(src + off), size, skey};
          w.rdma.remote_addr = reinterpret_cast<uint64_t>(dst + off);
          w.rdma.rkey = dkey;
          w.send_flags = verbs::kSendSignaled;
          if (fl->seng->post_send(fl->sqpn, w) != 0) break;
          ++fl->outstanding;
          ++fl->posted;
        }
        work += static_cast<uint32_t>(n);
      }
      return work;
    }));
  }
  go.store(true);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  uint64_t done = 0;
  for (auto& c : counts) done += c.done.load();
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  halt.store(true);
  // Let outstanding WRITEs complete (bounded), then stop.
  for (int i = 0; i < 2000; ++i) {
    bool idle = true;
    for (auto& fl : flows) {
      auto out = std::make_shared<uint32_t>(1);
      Flow* p = &fl;
      dp.run_on(fl.score, [out, p](CoreLoop&) { *out = p->outstanding; });
      if (*out) idle = false;
    }
    if (idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (size_t c = 0; c < ncores; ++c) dp.remove_poller(c, pollers[c]);
  RunResult r;
  r.forwarded = dp.core_counters().sum(stats::CoreCounter::ring_enqueued);
  dp.stop();
  uint64_t errors = 0;
  for (auto& c : counts) errors += c.errors.load();
  r.mpps = static_cast<double>(done) / el / 1e6;
  uint64_t cpu_ns = 0, done_end = 0;
  for (auto& c : counts) {
    if (c.cpu_end_ns.load() > c.cpu_start_ns.load()) cpu_ns += c.cpu_end_ns.load() - c.cpu_start_ns.load();
    done_end += c.done_at_end.load();
  }
  r.per_cpu = cpu_ns ? static_cast<double>(done_end) / (static_cast<double>(cpu_ns) / 1e9) / 1e6 : 0;
  r.verified = errors == 0 && done > 0 && std::memcmp(src, dst, len) == 0;
  for (auto& fl : flows)
    if (fl.posted == 0) r.verified = false;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, 2, "[seconds per case, default 2] [message bytes, default 64]");
  const double secs = bench::arg_or(argc, argv, 1, 2.0);
  const auto size = static_cast<uint32_t>(bench::arg_or(argc, argv, 2, 64));
  try {
    // lcore 0 (this thread, mostly asleep) and lcore 1 on CPU 0; lcore 2 on CPU 1;
    // lcores 3 and 4 (the 4-core runs: two loops per CPU on this 2-CPU host) on CPU 0 and 1.
    dpdk::Eal eal({.args = {"--lcores=0@0,1@0,2@1,3@0,4@1", "--log-level=lib.eal:error"}, .program = "bench_multicore"});
    dpdk::RingPair rings("bmc", 4);
    // Frames up to IB MTU 4096 (the QPs' path MTU) in one mbuf.
    constexpr uint16_t kRoom = 4096 + 256 + 128;
    dpdk::Port pa(dpdk::PortConfig{
        .port_id = rings.port_a(), .rx_queues = 4, .tx_queues = 4, .mbufs = 16383, .data_room = kRoom});
    dpdk::Port pb(dpdk::PortConfig{
        .port_id = rings.port_b(), .rx_queues = 4, .tx_queues = 4, .mbufs = 16383, .data_room = kRoom});
    const RunResult one = run(pa, pb, {1}, false, size, secs);
    const RunResult two = run(pa, pb, {1, 2}, false, size, secs);
    const RunResult cross = run(pa, pb, {1, 2}, true, size, secs);
    const RunResult four = run(pa, pb, {1, 2, 3, 4}, false, size, secs);
    const RunResult four_cross = run(pa, pb, {1, 2, 3, 4}, true, size, secs);
    std::printf("== dataplane cores on their own threads (net_ring pair, %d RC WRITE flows of %u B, %.1f s runs)\n",
                kFlows, size, secs);
    std::printf("%-40s %10s %10s %14s %12s %6s\n", "case", "Mmsg/s", "vs 1 core", "Mmsg/CPU-s", "forwarded",
                "data");
    auto row = [&](const char* name, const RunResult& r) {
      std::printf("%-40s %10.4f %10.3f %14.4f %12lu %6s\n", name, r.mpps, one.mpps > 0 ? r.mpps / one.mpps : 0.0,
                  r.per_cpu, static_cast<unsigned long>(r.forwarded), r.verified ? "ok" : "BAD");
    };
    row("1 core", one);
    row("2 cores, QP pairs core-local", two);
    row("2 cores, every frame crosses cores", cross);
    row("4 cores (2 per CPU), QP pairs core-local", four);
    row("4 cores (2 per CPU), frames cross cores", four_cross);
    std::printf("2-core / 1-core: %.3f\n", one.mpps > 0 ? two.mpps / one.mpps : 0.0);
    // Both CPUs are shared with whatever else runs: the ratio means little without this.
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      char buf[64] = {};
      if (std::fgets(buf, sizeof buf, f)) std::printf("load average (1 5 15 min) during the run: %s", buf);
      std::fclose(f);
    }
    if (!one.verified || !two.verified || !cross.verified || !four.verified || !four_cross.verified) return 1;
    if (cross.forwarded == 0 || four_cross.forwarded == 0 || one.forwarded != 0) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_multicore: %s\n", e.what());
    return 1;
  }
  return 0;
}

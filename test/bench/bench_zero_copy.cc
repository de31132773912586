// The sender's CPU cost of a 64 KiB RC WRITE: zero-copy TX (payload attached
// from a hugepage MR as an external mbuf segment) against the copy path,
// against memcpy of the same bytes, all in one run.
//
// One transport::Engine over a DpdkQueueIo on one end of a net_ring pair; the
// other end is drained and its mbufs freed at once (a NIC that DMAs the frame
// and returns the mbufs, as a driver's TX completion does on the CPU), so what
// is measured is droce's own work: headers, ICRC over the payload, mbufs,
// copy or attach, and freeing them.
// No ACKs come back: the QP's window is larger than a round and its ACK timer
// is off; the QP is reset after each round. Thread CPU time is measured, so a
// loaded machine slows the run but not the figures much.
//   bench_zero_copy [seconds-per-case] [mtu]
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.h"
#include "dpdk/eal.h"
#include "dpdk/hugemem.h"
#include "dpdk/port.h"
#include "dpdk/queue_io.h"
#include "transport/engine.h"

using namespace droce;

namespace {

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

constexpr uint32_t kMsg = 65536;
constexpr uint32_t kRound = 64;  // messages per QP lifetime

struct Result {
  double gbit_per_cpu_s = 0;
  uint64_t zc = 0, copied = 0;
};

Result run(dpdk::Port& port, dpdk::Port& sink, uint8_t* buf, size_t len, uint32_t zero_copy_min, verbs::Mtu mtu, double secs) {
  dpdk::DpdkQueueIo q(port, 0);
  dpdk::TscClock clock;
  transport::EngineConfig ec;
  ec.mac = port.mac();
  ec.gid = wire::gid_from_ipv4(0x0A000001);
  ec.max_qps = 8;
  ec.max_mrs = 8;
  ec.max_inflight_pkts = 1u << 20;
  ec.zero_copy_min = zero_copy_min;
  transport::Engine e(ec, q, clock);
  const verbs::Pd pd = e.alloc_pd();
  uint32_t key = 0;
  if (e.reg_mr(pd, buf, len, verbs::kAccessAll, &key) != 0) throw std::runtime_error("reg_mr");
  dpdk::ExtMem* x = dpdk::DpdkQueueIo::ext_create(buf, len);
  if (zero_copy_min && !x) throw std::runtime_error("buffer not usable for zero-copy (not IOVA-contiguous)");
  e.mrs().set_dma(key, x);
  verbs::Cq* cq = e.create_cq(4096);
  verbs::QpInitAttr init;
  init.pd = pd.handle;
  init.send_cq = init.recv_cq = cq;
  init.cap.max_send_wr = 1024;
  uint32_t qpn = 0;
  if (e.create_qp(init, &qpn) != 0) throw std::runtime_error("create_qp");
  auto to_rts = [&] {
    using namespace verbs;
    QpAttr a;
    a.qp_state = QpState::Reset;
    e.modify_qp(qpn, a, kQpState);
    a.qp_state = QpState::Init;
    a.qp_access_flags = kAccessAll;
    e.modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags);
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = 0x11;
    a.ah_attr.dgid = wire::gid_from_ipv4(0x0A000002);
    a.ah_attr.dmac = {2, 0, 0, 0, 0, 2};
    a.max_dest_rd_atomic = 1;
    e.modify_qp(qpn, a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer);
    a.qp_state = QpState::Rts;
    a.timeout = 0;  // no ACK timer: nothing answers
    a.max_rd_atomic = 1;
    e.modify_qp(qpn, a, kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic);
  };
  const size_t nmsg = len / kMsg;
  uint64_t bytes = 0, k = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
    to_rts();
    for (uint32_t i = 0; i < kRound; ++i, ++k) {
      verbs::SendWr w;
      w.opcode = verbs::WrOpcode::RdmaWrite;
      w.num_sge = 1;
      w.sg_list[0] = {reinterpret_cast<uint64_t>(buf + (k % nmsg) * kMsg), kMsg, key};
      w.rdma.remote_addr = 0x1000;
      w.rdma.rkey = 0x99;
      if (e.post_send(qpn, w) != 0) throw std::runtime_error("post_send");
    }
    const uint64_t want = e.counter(transport::Ctr::TxFrames) + uint64_t{kRound} * (kMsg / verbs::mtu_bytes(mtu));
    for (int it = 0; it < 10'000'000 && e.counter(transport::Ctr::TxFrames) < want; ++it) {
      e.poll();
      rte_mbuf* m[64];
      const uint16_t got = rte_eth_rx_burst(sink.id(), 0, m, 64);
      if (got) rte_pktmbuf_free_bulk(m, got);
    }
    for (uint16_t got = 1; got;) {  // the rest of the round
      rte_mbuf* m[64];
      got = rte_eth_rx_burst(sink.id(), 0, m, 64);
      if (got) rte_pktmbuf_free_bulk(m, got);
    }
    bytes += uint64_t{kRound} * kMsg;
  }
  const double cpu = cpu_now() - c0;
  Result r;
  r.gbit_per_cpu_s = static_cast<double>(bytes) * 8 / cpu / 1e9;
  r.zc = e.counter(transport::Ctr::TxZeroCopy);
  r.copied = e.counter(transport::Ctr::TxCopied);
  e.destroy_qp(qpn);
  e.mrs().set_dma(key, nullptr);
  if (!dpdk::DpdkQueueIo::ext_release(x, 1000)) throw std::runtime_error("zero-copy segments never released");
  return r;
}

double memcpy_rate(const uint8_t* src, size_t len, double secs) {
  std::vector<uint8_t> dst(kMsg);
  uint64_t bytes = 0, k = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
    for (int i = 0; i < 64; ++i, ++k) {
      std::memcpy(dst.data(), src + (k % (len / kMsg)) * kMsg, kMsg);
      bytes += kMsg;
    }
  }
  volatile uint8_t sink = dst[100];
  (void)sink;
  return static_cast<double>(bytes) * 8 / (cpu_now() - c0) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, 2, "[seconds, default 1] [path MTU: 1024, 2048 or 4096, default 1024]");
  const double secs = bench::arg_or(argc, argv, 1, 1.0);
  const auto mtu_b = static_cast<int>(bench::arg_or(argc, argv, 2, 1024));
  if (mtu_b != 1024 && mtu_b != 2048 && mtu_b != 4096) {
    std::fprintf(stderr, "bench_zero_copy: path MTU %s: 1024, 2048 or 4096\n", argv[2]);
    return 2;
  }
  const verbs::Mtu mtu = mtu_b == 4096 ? verbs::Mtu::M4096 : mtu_b == 2048 ? verbs::Mtu::M2048 : verbs::Mtu::M1024;
  try {
    dpdk::Eal eal({.args = {"-l", "0", "--iova-mode=va", "--log-level=lib.eal:error"}, .program = "bench_zero_copy"});
    dpdk::RingPair rings("bzc", 1);
    dpdk::Port port(dpdk::PortConfig{.port_id = rings.port_a(), .mbufs = 16383, .data_room = 4096 + 256 + 128});
    dpdk::Port sink(dpdk::PortConfig{.port_id = rings.port_b(), .mbufs = 1023});
    if (!port.multi_seg_tx()) throw std::runtime_error("net_ring: no multi-segment TX");
    constexpr size_t kLen = 16u << 20;  // 16 MiB of messages: more than the last-level cache
    dpdk::HugeRegion mem("bench_zc", kLen);
    for (size_t i = 0; i < kLen; ++i) mem.data()[i] = static_cast<uint8_t>(i * 31);
    Result zc, cp;
    double mc = 0;
    for (int rep = 0; rep < 3; ++rep) {  // interleaved: drift on a shared machine hits all three
      Result a = run(port, sink, mem.data(), kLen, 1024, mtu, secs / 3);
      Result b = run(port, sink, mem.data(), kLen, 0, mtu, secs / 3);
      const double m = memcpy_rate(mem.data(), kLen, secs / 3);
      zc.gbit_per_cpu_s = std::max(zc.gbit_per_cpu_s, a.gbit_per_cpu_s);
      cp.gbit_per_cpu_s = std::max(cp.gbit_per_cpu_s, b.gbit_per_cpu_s);
      zc.zc += a.zc;
      zc.copied += a.copied;
      cp.zc += b.zc;
      cp.copied += b.copied;
      mc = std::max(mc, m);
    }
    std::printf("== 64 KiB RC WRITE, sender CPU cost (net_ring pair drained, MTU %d, best of 3, Gb/s per CPU-second)\n", mtu_b);
    std::printf("%-36s %10s %12s %12s\n", "case", "Gb/s/cpu", "vs memcpy", "packets");
    std::printf("%-36s %10.2f %12.3f %6lu zc %lu copied\n", "zero-copy TX (extbuf)", zc.gbit_per_cpu_s,
                zc.gbit_per_cpu_s / mc, static_cast<unsigned long>(zc.zc), static_cast<unsigned long>(zc.copied));
    std::printf("%-36s %10.2f %12.3f %6lu zc %lu copied\n", "copy path (zero_copy_min 0)", cp.gbit_per_cpu_s,
                cp.gbit_per_cpu_s / mc, static_cast<unsigned long>(cp.zc), static_cast<unsigned long>(cp.copied));
    std::printf("%-36s %10.2f\n", "memcpy 64 KiB", mc);
    std::printf("zero-copy / copy: %.3f\n", zc.gbit_per_cpu_s / cp.gbit_per_cpu_s);
    if (zc.zc == 0 || cp.copied == 0 || cp.zc != 0) return 1;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_zero_copy: %s\n", ex.what());
    return 1;
  }
  return 0;
}

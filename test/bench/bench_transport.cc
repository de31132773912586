// Transport benchmark over memlink, both engines on one core (one thread):
// 64-byte RC WRITE and SEND messages/s, 64 KiB RC WRITE GB/s, next to the
// link's raw forwarding rate (alloc + 64-byte frame copy + tx + rx + free, no
// transport) measured in the same run.
// Release build: build/test/bench/bench_transport [seconds-per-case] [idle-QPs, default 1000000]
//   [largest QP count of the scaling cases, default 65536]
// BENCH_PROFILE=write64|send64|write64k|scaleN runs only that case, for a profile.
#include <malloc.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.h"
#include "memlink/memlink.h"
#include "transport/engine.h"
#include "wire/packet.h"

using namespace droce;
using namespace droce::transport;
using namespace droce::verbs;
using SteadyClock = std::chrono::steady_clock;

namespace {

class RealClock : public io::Clock {
 public:
  uint64_t now_ns() const noexcept override {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count());
  }
};

wire::MacAddr mac_of(int i) { return {2, 0, 0, 0, 0, static_cast<uint8_t>(i + 1)}; }
wire::Gid gid_of(int i) { return wire::gid_from_ipv4(0x0A000001u + static_cast<uint32_t>(i)); }

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// Raw link: what one core moves through memlink with no transport.
double raw_forward_pps(double secs, uint32_t plen) {
  RealClock clock;
  memlink::Link link(clock, 1, 1024, 4352);
  auto& a = link.add_port(mac_of(0));
  auto& b = link.add_port(mac_of(1));
  wire::Headers h;
  h.l2.src = mac_of(0);
  h.l2.dst = mac_of(1);
  h.bth.opcode = wire::op::RC_WRITE_ONLY;
  std::vector<uint8_t> payload(plen, 1), frame(plen + 256);
  frame.resize(wire::build_frame(frame, h, payload));
  io::PktBuf* bufs[32];
  uint64_t pkts = 0;
  const auto t0 = SteadyClock::now();
  do {
    for (int r = 0; r < 64; ++r) {
      const uint16_t n = a.alloc_burst(bufs, 32);
      for (uint16_t i = 0; i < n; ++i) {
        std::memcpy(bufs[i]->data, frame.data(), frame.size());
        bufs[i]->len = static_cast<uint32_t>(frame.size());
      }
      a.tx_burst(bufs, n);
      const uint16_t m = b.rx_burst(bufs, 32);
      b.free_burst(bufs, m);
      pkts += m;
    }
  } while (seconds_since(t0) < secs);
  return static_cast<double>(pkts) / seconds_since(t0);
}

// The wire floor of one 64-byte message: build the request (ICRC) and parse it (ICRC check).
double wire_floor_pps(double secs) {
  wire::Headers h;
  h.l2.src = mac_of(0);
  h.l2.dst = mac_of(1);
  h.l3.src = gid_of(0);
  h.l3.dst = gid_of(1);
  h.bth.opcode = wire::op::RC_WRITE_ONLY;
  h.ext.reth = {0x1000, 0x100, 64};
  std::vector<uint8_t> payload(64, 1), frame(512);
  uint64_t n = 0, sink = 0;
  const auto t0 = SteadyClock::now();
  do {
    for (int r = 0; r < 256; ++r) {
      h.bth.psn = static_cast<uint32_t>(n) & wire::kMask24;
      const size_t len = wire::build_frame(frame, h, payload);
      wire::PacketView v;
      sink += static_cast<uint64_t>(wire::parse_frame({frame.data(), len}, v)) + v.payload_len;
      ++n;
    }
  } while (seconds_since(t0) < secs);
  if (sink == 1) std::printf(" ");
  return static_cast<double>(n) / seconds_since(t0);
}

struct Pair {
  RealClock clock;
  memlink::Link link{clock, 1, 8192, 4352};
  memlink::Port& pa = link.add_port(mac_of(0));
  memlink::Port& pb = link.add_port(mac_of(1));
  std::unique_ptr<Engine> a, b;
  Pd pda, pdb;
  Cq *sa, *ra, *sb, *rb;
  uint32_t qa = 0, qb = 0;

  explicit Pair(Mtu mtu, uint32_t max_qps = 1024) {
    EngineConfig ca, cb;
    ca.max_qps = cb.max_qps = max_qps;
    ca.mac = mac_of(0);
    ca.gid = gid_of(0);
    cb.mac = mac_of(1);
    cb.gid = gid_of(1);
    a = std::make_unique<Engine>(ca, pa, clock);
    b = std::make_unique<Engine>(cb, pb, clock);
    pda = a->alloc_pd();
    pdb = b->alloc_pd();
    sa = a->create_cq(4096);
    ra = a->create_cq(4096);
    sb = b->create_cq(4096);
    rb = b->create_cq(4096);
    qa = make_qp(*a, pda, sa, ra);
    qb = make_qp(*b, pdb, sb, rb);
    up(*a, qa, qb, 1, mtu);
    up(*b, qb, qa, 0, mtu);
  }
  static uint32_t make_qp(Engine& e, Pd pd, Cq* s, Cq* r, uint32_t wrs = 1024) {
    QpInitAttr init;
    init.pd = pd.handle;
    init.send_cq = s;
    init.recv_cq = r;
    init.cap.max_send_wr = wrs;
    init.cap.max_recv_wr = wrs;
    uint32_t qpn = 0;
    if (e.create_qp(init, &qpn)) std::abort();
    return qpn;
  }
  static void up(Engine& e, uint32_t qpn, uint32_t peer, int peer_idx, Mtu mtu) {
    QpAttr a;
    a.qp_state = QpState::Init;
    a.qp_access_flags = kAccessRemoteWrite | kAccessRemoteRead;
    if (e.modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags)) std::abort();
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = peer;
    a.ah_attr.dmac = mac_of(peer_idx);
    a.ah_attr.dgid = gid_of(peer_idx);
    if (e.modify_qp(qpn, a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer))
      std::abort();
    a.qp_state = QpState::Rts;
    if (e.modify_qp(qpn, a, kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic))
      std::abort();
  }
};

// Messages per second for `op` with `len`-byte messages, `depth` outstanding,
// one signaled completion every `sig` WRs.
double g_frames_per_msg = 0;
uint64_t g_msgs = 0;  // messages completed in the last run_msgs (warm-up included)

double run_msgs(WrOpcode op, uint32_t len, Mtu mtu, double secs, uint32_t depth, uint32_t sig) {
  Pair p(mtu);
  std::vector<uint8_t> src(len), dst(size_t{len} * 2);
  uint32_t ks = 0, kd = 0;
  p.a->reg_mr(p.pda, src.data(), src.size(), kAccessLocalWrite, &ks);
  p.b->reg_mr(p.pdb, dst.data(), dst.size(), kAccessLocalWrite | kAccessRemoteWrite, &kd);
  const bool send = op == WrOpcode::Send;
  RecvWr rwr;
  rwr.num_sge = 1;
  rwr.sg_list[0] = {reinterpret_cast<uint64_t>(dst.data()), len, kd};
  if (send)
    for (uint32_t i = 0; i < 1000; ++i) p.b->post_recv(p.qb, rwr);
  SendWr wr;
  wr.opcode = op;
  wr.num_sge = 1;
  wr.sg_list[0] = {reinterpret_cast<uint64_t>(src.data()), len, ks};
  wr.rdma = {reinterpret_cast<uint64_t>(dst.data()), kd};
  uint64_t posted = 0, done = 0;
  Wc wc[64];
  auto t0 = SteadyClock::now();
  bool warm = false;
  uint64_t done0 = 0;
  for (;;) {
    while (posted - done < depth) {
      wr.send_flags = (posted % sig == sig - 1) ? uint32_t{kSendSignaled} : 0u;
      if (p.a->post_send(p.qa, wr)) break;
      ++posted;
    }
    p.a->poll();
    p.b->poll();
    int n;
    while ((n = p.sa->poll(wc, 64)) > 0)
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != WcStatus::Success) {
          std::fprintf(stderr, "completion error %s\n", wc_status_str(wc[i].status));
          std::abort();
        }
        done += sig;
      }
    if (send)
      while ((n = p.rb->poll(wc, 64)) > 0)
        for (int i = 0; i < n; ++i) p.b->post_recv(p.qb, rwr);
    const double el = seconds_since(t0);
    if (!warm && el > secs * 0.1) {  // short warm-up
      warm = true;
      t0 = SteadyClock::now();
      done0 = done;
    } else if (warm && el >= secs) {
      g_frames_per_msg = static_cast<double>(p.a->counter(Ctr::TxFrames) + p.b->counter(Ctr::TxFrames)) /
                         static_cast<double>(done ? done : 1);
      g_msgs = done;
      return static_cast<double>(done - done0) / el;
    }
  }
}

// 64-byte RC WRITEs spread over nqp QP pairs, round robin, at most 256 in
// flight in all (so the link never overflows, whatever nqp is) and 256/nqp
// (at least 1) per QP, every WR signaled: messages/s. Compared with nqp = 1 in the same run, it shows what
// many QPs cost: timers, cache misses on QP state, the ready queues.
double run_scaling(uint32_t nqp, double secs) {
  Pair p(Mtu::M1024, nqp + 8);
  const uint32_t window = 256, per_qp = (window + nqp - 1) / nqp;  // in flight: in all, per QP
  std::vector<uint32_t> qa{p.qa}, slot_of(nqp + 8, 0);
  qa.reserve(nqp);
  for (uint32_t i = 1; i < nqp; ++i) {
    const uint32_t x = Pair::make_qp(*p.a, p.pda, p.sa, p.ra, std::max<uint32_t>(per_qp, 2));
    const uint32_t y = Pair::make_qp(*p.b, p.pdb, p.sb, p.rb, std::max<uint32_t>(per_qp, 2));
    Pair::up(*p.a, x, y, 1, Mtu::M1024);
    Pair::up(*p.b, y, x, 0, Mtu::M1024);
    slot_of[x] = static_cast<uint32_t>(qa.size());
    qa.push_back(x);
  }
  std::vector<uint8_t> src(64, 1), dst(64);
  uint32_t ks = 0, kd = 0;
  p.a->reg_mr(p.pda, src.data(), src.size(), kAccessLocalWrite, &ks);
  p.b->reg_mr(p.pdb, dst.data(), dst.size(), kAccessLocalWrite | kAccessRemoteWrite, &kd);
  SendWr wr;
  wr.opcode = WrOpcode::RdmaWrite;
  wr.num_sge = 1;
  wr.sg_list[0] = {reinterpret_cast<uint64_t>(src.data()), 64, ks};
  wr.rdma = {reinterpret_cast<uint64_t>(dst.data()), kd};
  wr.send_flags = kSendSignaled;
  std::vector<uint32_t> busy(nqp, 0);  // WRs in flight per QP
  uint64_t posted = 0, done = 0, done0 = 0;
  uint32_t next = 0;
  Wc wc[64];
  auto t0 = SteadyClock::now();
  bool warm = false;
  for (;;) {
    // Fill the window: up to per_qp WRs on each QP in turn (a full pass over the QPs at most).
    for (uint32_t tries = 0; posted - done < window && tries < nqp * per_qp; ++tries) {
      const uint32_t i = next;
      next = next + 1 == nqp ? 0 : next + 1;
      if (busy[i] >= per_qp) continue;
      if (p.a->post_send(qa[i], wr)) break;
      ++busy[i];
      if (busy[i] < per_qp) next = i;  // this QP again until its share is posted
      ++posted;
    }
    p.a->poll();
    p.b->poll();
    int n;
    while ((n = p.sa->poll(wc, 64)) > 0)
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != WcStatus::Success) {
          std::fprintf(stderr, "completion error %s\n", wc_status_str(wc[i].status));
          std::abort();
        }
        --busy[slot_of[wc[i].qp_num]];
        ++done;
      }
    const double el = seconds_since(t0);
    if (!warm && el > secs * 0.2) {
      warm = true;
      t0 = SteadyClock::now();
      done0 = done;
    } else if (warm && el >= secs) {
      g_frames_per_msg = static_cast<double>(p.a->counter(Ctr::TxFrames) + p.b->counter(Ctr::TxFrames)) /
                         static_cast<double>(done ? done : 1);
      g_msgs = done;
      return static_cast<double>(done - done0) / el;
    }
  }
}

}  // namespace

// Heap bytes in use (malloc'd, mmapped chunks included).
size_t heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Memory per idle QP: an engine sized for n QPs, n RC QPs created with one
// send and one receive WR each and moved to INIT (nothing posted), the heap
// growth from before the engine over n. Counts the engine's per-QP tables.
double idle_qp_bytes(uint32_t n) {
  RealClock clock;
  memlink::Link link{clock, 1, 64, 2048};
  memlink::Port& port = link.add_port(mac_of(0));
  const size_t before = heap_bytes();
  EngineConfig c;
  c.mac = mac_of(0);
  c.gid = gid_of(0);
  c.max_qps = n + 2;
  auto e = std::make_unique<Engine>(c, port, clock);
  const Pd pd = e->alloc_pd();
  Cq* cq = e->create_cq(16);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t qpn = Pair::make_qp(*e, pd, cq, cq, 1);
    QpAttr a;
    a.qp_state = QpState::Init;
    a.qp_access_flags = kAccessRemoteWrite;
    if (e->modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags)) std::abort();
  }
  return static_cast<double>(heap_bytes() - before) / n;
}

int main(int argc, char** argv) {
  bench::check_args(argc, argv, 3,
                    "[seconds per case, default 0.5] [idle QPs, default 1000000] [largest QP count of the scaling "
                    "cases, default 65536]\n  BENCH_PROFILE=write64|send64|write64k|scaleN runs only that case (for "
                    "perf record)");
  const double secs = bench::arg_or(argc, argv, 1, 0.5);
  // BENCH_PROFILE=write64|send64|write64k|scaleN runs that one case for the whole time (for perf record).
  if (const char* only = std::getenv("BENCH_PROFILE")) {
    const std::string c = only;
    if (c.rfind("scale", 0) == 0 && c.size() > 5) {  // scaleN: the QP-scaling case over N QP pairs
      const uint32_t nqp = static_cast<uint32_t>(std::atol(c.c_str() + 5));
      if (nqp == 0) return 2;
      const double r = run_scaling(nqp, secs);
      std::printf("%s: %.3f M msgs/s, %llu messages\n", only, r / 1e6, static_cast<unsigned long long>(g_msgs));
      return 0;
    }
    const bool w64k = c == "write64k";
    if (c != "write64" && c != "send64" && !w64k) {
      std::fprintf(stderr, "BENCH_PROFILE: write64, send64, write64k or scaleN, not '%s'\n", only);
      return 2;
    }
    const double r = run_msgs(c == "send64" ? WrOpcode::Send : WrOpcode::RdmaWrite, w64k ? 65536 : 64,
                              w64k ? Mtu::M4096 : Mtu::M1024, secs, w64k ? 32 : 256, w64k ? 4 : 16);
    // The message count (warm-up included) lets instruction counts be taken per
    // message: callgrind's totals of two durations, their difference over the
    // difference of the counts (the setup cancels out).
    std::printf("%s: %.3f M msgs/s, %.2f frames per message, %llu messages\n", only, r / 1e6, g_frames_per_msg,
                static_cast<unsigned long long>(g_msgs));
    return 0;
  }
  std::printf("droce transport benchmark (both engines and the link on one core; best of 3 interleaved rounds)\n");
  // Rounds interleave the cases so a noisy neighbour hurts them alike; each figure is its best round.
  double floor64 = 0, raw = 0, raw4k = 0, w64 = 0, s64 = 0, w64k = 0, w64_fpm = 0, s64_fpm = 0;
  const double slice = secs / 3;
  for (int round = 0; round < 3; ++round) {
    floor64 = std::max(floor64, wire_floor_pps(slice));
    raw = std::max(raw, raw_forward_pps(slice, 64));
    raw4k = std::max(raw4k, raw_forward_pps(slice, 4096));
    w64 = std::max(w64, run_msgs(WrOpcode::RdmaWrite, 64, Mtu::M1024, slice, 256, 16));
    w64_fpm = g_frames_per_msg;
    s64 = std::max(s64, run_msgs(WrOpcode::Send, 64, Mtu::M1024, slice, 256, 16));
    s64_fpm = g_frames_per_msg;
    w64k = std::max(w64k, run_msgs(WrOpcode::RdmaWrite, 65536, Mtu::M4096, slice, 32, 4));
  }
  // Packets each message costs on the link: a request (+ coalesced ACKs, counted separately).
  const double raw_gbps = raw4k * 4096 / 1e9;  // raw link moving 4 KiB-payload frames
  std::printf("%-38s %14s %14s %10s\n", "case", "droce", "raw memlink", "ratio");
  std::printf("%-38s %14.2f %14s %10s\n", "memlink raw forwarding 64 B (Mpps)", raw / 1e6, "-", "-");
  std::printf("%-38s %14.2f %14s %10s\n", "memlink raw forwarding 4 KiB (GB/s)", raw_gbps, "-", "-");
  std::printf("%-38s %14.2f %14.2f %10.3f\n", "RC WRITE 64 B (M msgs/s)", w64 / 1e6, raw / 1e6, w64 / raw);
  std::printf("%-38s %14.2f %14.2f %10.3f\n", "RC SEND 64 B (M msgs/s)", s64 / 1e6, raw / 1e6, s64 / raw);
  const double gbps = w64k * 65536 / 1e9;
  std::printf("%-38s %14.2f %14.2f %10.3f\n", "RC WRITE 64 KiB (GB/s, MTU 4096)", gbps, raw_gbps, gbps / raw_gbps);
  std::printf("(ratio = transport rate / raw memlink rate with frames of the same payload size, same run)\n");
  std::printf("%-38s %14.2f %14s %10.3f\n", "wire build+parse with ICRC, 64 B (Mpps)", floor64 / 1e6, "vs WRITE",
              w64 / floor64);
  std::printf("(the last ratio: 64 B RC WRITE messages/s over the rate of building and parsing one 64 B request\n"
              " with its ICRC, the floor every message pays whatever the transport does)\n");
  std::printf("frames on the link per 64 B message (request + coalesced ACKs): WRITE %.2f, SEND %.2f\n", w64_fpm,
              s64_fpm);
  // QP-count scaling: 64 B WRITEs over N QP pairs against one QP, same run.
  const uint32_t counts[] = {1, 16, 256, 4096, 65536};
  const uint32_t max_scale = argc > 3 ? static_cast<uint32_t>(std::atol(argv[3])) : 65536;
  double one = 0, one_fps = 0;
  for (uint32_t c : counts) {
    if (c > max_scale) break;
    double best = 0, fpm = 0;
    for (int round = 0; round < 2; ++round) {
      const double r = run_scaling(c, secs / 2);
      if (r > best) {
        best = r;
        fpm = g_frames_per_msg;
      }
    }
    if (c == 1) {
      one = best;
      one_fps = best * fpm;
    }
    std::printf("%-38s %14.2f %14.2f %10.3f   %.2f frames/msg, frames/s ratio %.3f\n",
                ("RC WRITE 64 B over " + std::to_string(c) + " QPs (M/s)").c_str(), best / 1e6, one / 1e6, best / one,
                fpm, best * fpm / one_fps);
  }
  std::printf("(QP scaling: signaled 64 B WRITEs round robin over N QP pairs, at most 256 in flight\n"
              " in all and 256/N per QP; ratio against N = 1 in the same run, best of 2 rounds; with one WR\n"
              " in flight per QP every message needs an ACK of its own, hence the frames/s ratio)\n");
  const uint32_t nqp = argc > 2 ? static_cast<uint32_t>(std::atol(argv[2])) : 1'000'000;
  const double idle = idle_qp_bytes(nqp);
  std::printf("%-38s %14.0f %14d %10.2f\n", ("memory per idle RC QP (bytes, " + std::to_string(nqp) + " QPs)").c_str(), idle, 2048, idle / 2048);
  std::printf("(baseline: issue 12's goal of 2 KiB per idle QP; heap growth of an engine with that many QPs in INIT,\n"
              " one send and one receive WR each, over the QP count)\n");
  return 0;
}

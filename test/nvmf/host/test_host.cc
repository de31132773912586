// lib/nvmf/host: the initiator against droce's own target protocol code
// (lib/nvmf Target + Queue) in one process over a net_ring pair. Node A runs
// the Host (the test thread); node B runs a small RDMA glue around
// nvmf::Queue in a thread of its own (listener on 4420, NVMe-RDMA CM private
// data checked and answered, capsules in, RDMA READ / WRITE / SEND out).
// Shows: connect (admin + 2 I/O queues), Identify, verify with in-capsule
// writes (4 KiB) and keyed ones (16 KiB) and reads by RDMA WRITE, a timed
// mix without errors, submit's refusals, a refused Connect (unknown NQN), the
// discovery log, clean shutdown (CC.SHN seen by the controller), and the pure
// parts: the verify pattern and the latency histogram.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "embedded_pair.h"
#include "engine/embed.h"
#include "nvmf/cm_private.h"
#include "nvmf/controller.h"
#include "nvmf/host/host.h"
#include "nvmf/host/perf.h"
#include "nvmf/namespace.h"
#include "nvmf/queue.h"

using namespace droce;
using namespace droce::nvmf;
using namespace droce::nvmf::host;

namespace {
constexpr const char* kSub = "nqn.2026-12.org.droce:hosttest";

// The target side: node B, polled by its own thread.
class MiniTarget {
 public:
  static constexpr uint32_t kRecv = 64 + 8192;  // SQE + in-capsule data
  static constexpr uint32_t kSlot = 32768;       // MDTS 3: 32 KiB

  MiniTarget(engine::Embedded& n, Target& t) : n_(n), t_(t) {
    n_.set_cm_sink([this](const cm::Event& e) { ev_.push_back(e); });
    pd_ = n_.alloc_pd();
    cm::ConnId l = 0;
    if (n_.cm().listen(cm::PortSpace::Tcp, {{}, kRdmaPort}, cm::QpKind::Rc, 0, &l) != 0)
      throw std::runtime_error("listen failed");
  }
  ~MiniTarget() {
    for (auto& c : conns_) drop(*c);
    n_.set_cm_sink(nullptr);
  }
  void run(std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) step();
  }
  std::atomic<uint32_t> accepted{0}, shutdowns{0};

 private:
  struct Conn {
    cm::ConnId id = 0;
    engine::QpHandle qp;
    std::unique_ptr<Queue> q;
    uint8_t* mem = nullptr;
    uint32_t key = 0;
    uint16_t depth = 0;
    bool dead = false;
  };
  void drop(Conn& c) {
    c.q.reset();
    if (c.qp.eng) n_.destroy_qp(c.qp);
    if (c.key) n_.dereg_mr(c.key);
    if (c.mem) n_.free_dma(c.mem);
    c.key = 0;
    c.mem = nullptr;
  }
  uint64_t now() { return n_.dataplane().clock().now_ns(); }
  void on_request(const cm::Event& e) {
    CmRequest r;
    CmLimits lim{8, 32, 128};
    const CmStatus st = decode_cm_request(std::span<const uint8_t>(e.param.private_data, e.param.private_data_len), lim, r);
    if (st != CmStatus::Ok) {
      uint8_t rej[kCmRejectSize];
      encode_cm_reject(rej, st);
      n_.cm().reject(e.id, rej);
      return;
    }
    auto c = std::make_unique<Conn>();
    c->id = e.id;
    c->depth = static_cast<uint16_t>(r.hsqsize + 1);
    const uint16_t slots = static_cast<uint16_t>(2 * c->depth);  // as droce-nvmf and nvmet-rdma (queue.h)
    const size_t len = size_t{c->depth} * kRecv + size_t{slots} * kSlot;
    c->mem = static_cast<uint8_t*>(n_.alloc_dma(len));
    n_.reg_mr(pd_, c->mem, len, verbs::kAccessAll, &c->key);
    engine::QpOptions qo;
    qo.cap.max_send_wr = 6u * c->depth + 4;
    qo.cap.max_recv_wr = c->depth;
    qo.cqe = 8u * c->depth + 16;
    c->qp = n_.create_qp(pd_, qo);
    for (uint32_t i = 0; i < c->depth; ++i) repost(*c, i);
    QueueConfig qc;
    qc.qid = r.qid;
    qc.depth = c->depth;
    qc.slot_buffer = kSlot;
    qc.slots = slots;
    c->q = std::make_unique<Queue>(t_, qc, std::span<uint8_t>(c->mem + size_t{c->depth} * kRecv, size_t{slots} * kSlot));
    cm::ConnParam p;
    encode_cm_accept(std::span<uint8_t, kCmAcceptSize>(p.private_data, kCmAcceptSize), c->depth);
    p.private_data_len = kCmAcceptSize;
    p.qpn = c->qp.qpn;
    p.responder_resources = 16;
    p.initiator_depth = 16;
    n_.cm().accept(e.id, p);
    cm::QpParams qp{};
    n_.cm().qp_params(e.id, qp);
    c->qp.opt.psn = qp.sq_psn;
    c->qp.opt.mtu = static_cast<verbs::Mtu>(qp.path_mtu);
    n_.connect(c->qp, engine::QpPeer{qp.dest_qpn, qp.rq_psn, qp.dgid, {}});
    conns_.push_back(std::move(c));
    ++accepted;
  }
  void repost(Conn& c, uint32_t i) {
    verbs::RecvWr r;
    r.wr_id = i;
    r.num_sge = 1;
    r.sg_list[0] = {reinterpret_cast<uint64_t>(c.mem + size_t{i} * kRecv), kRecv, c.key};
    n_.post_recv(c.qp, r);
  }
  void step() {
    n_.poll();
    for (const cm::Event& e : ev_) {
      if (e.type == cm::EventType::ConnectRequest) on_request(e);
      if (e.type == cm::EventType::Disconnected)
        for (auto& c : conns_)
          if (c->id == e.id) c->dead = true;
    }
    ev_.clear();
    for (auto& cp : conns_) {
      Conn& c = *cp;
      if (c.dead || !c.q) continue;
      verbs::Wc wc[16];
      int k = c.qp.rcq->poll(wc, 16);
      for (int i = 0; i < k; ++i) {
        if (wc[i].status != verbs::WcStatus::Success) continue;
        const uint32_t idx = static_cast<uint32_t>(wc[i].wr_id);
        c.q->on_capsule(std::span<const uint8_t>(c.mem + size_t{idx} * kRecv, wc[i].byte_len), now());
        repost(c, idx);
      }
      k = c.qp.scq->poll(wc, 16);
      for (int i = 0; i < k; ++i)
      for (int i = 0; i < k; ++i)
        c.q->on_complete(static_cast<uint16_t>(wc[i].wr_id >> 2), static_cast<Action::Kind>(wc[i].wr_id & 3),
                         wc[i].status == verbs::WcStatus::Success, now());
      c.q->poll();
      if (Controller* ctl = c.q->controller(); ctl && cc::shn(ctl->cc()) != 0 && !seen_shn_) {
        seen_shn_ = true;
        ++shutdowns;
      }
      Action a[16];
      const size_t na = c.q->take_actions(a);
      for (size_t i = 0; i < na; ++i) {
        verbs::SendWr w;
        w.wr_id = (uint64_t{a[i].slot} << 2) | a[i].kind;
        w.num_sge = 1;
        w.sg_list[0] = {reinterpret_cast<uint64_t>(a[i].local), a[i].len, c.key};
        w.send_flags = verbs::kSendSignaled;
        switch (a[i].kind) {
          case Action::RdmaRead: w.opcode = verbs::WrOpcode::RdmaRead; break;
          case Action::RdmaWrite:
            w.opcode = verbs::WrOpcode::RdmaWrite;
            w.send_flags = 0;  // RC ordering puts it before the response SEND
            break;
          case Action::Send:
            w.opcode = a[i].invalidate ? verbs::WrOpcode::SendInv : verbs::WrOpcode::Send;
            w.invalidate_rkey = a[i].rkey;
            w.send_flags |= verbs::kSendInline;  // the CQE lives in the Queue's slot, not in registered memory
            break;
        }
        w.rdma.remote_addr = a[i].remote_addr;
        w.rdma.rkey = a[i].rkey;
        n_.post_send(c.qp, w);
      }
    }
  }
  engine::Embedded& n_;
  Target& t_;
  uint32_t pd_ = 0;
  bool seen_shn_ = false;
  std::vector<cm::Event> ev_;
  std::vector<std::unique_ptr<Conn>> conns_;
};

struct Rig : testing::EmbeddedPair {
  Target target;
  std::unique_ptr<MiniTarget> mt;
  std::atomic<bool> stop{false};
  std::thread th;
  explicit Rig(const char* name)
      : EmbeddedPair(name, "10.64.0.1", "10.64.0.2", 8191),
        target([] {
          TargetConfig c;
          c.in_capsule_data = 8192;
          c.mdts = 3;
          c.traddr = "10.64.0.2";
          return c;
        }()) {
    Subsystem& s = target.add_subsystem(kSub, "HT1", true);
    s.add_namespace(Namespace::ram({1, 512, 8u << 20}, kSub));
    mt = std::make_unique<MiniTarget>(b, target);
    th = std::thread([this] { mt->run(stop); });
  }
  ~Rig() {
    stop = true;
    th.join();
    mt.reset();
  }
};

HostOptions host_opts(const char* nqn = kSub) {
  HostOptions o;
  o.target_ip = "10.64.0.2";
  o.subnqn = nqn;
  o.io_queues = 2;
  o.queue_size = 17;
  o.data_bytes = 16 * 16384;
  o.timeout_ms = 5000;
  return o;
}
}  // namespace

TEST_CASE("host: connects to droce's target code, verifies data both ways, runs a mix, shuts down", "[nvmf][host]") {
  Rig r("nvh1");
  Host h(r.a, host_opts());
  h.connect();
  const ControllerInfo& in = h.info();
  CHECK(in.cntlid >= kCntlidMin);
  CHECK(in.block_size == 512);
  CHECK(in.blocks == (8u << 20) / 512);
  CHECK(in.mdts_bytes == 32768);
  CHECK(in.inline_bytes == 8192);
  CHECK(in.io_queues == 2);
  CHECK(in.queue_size == 17);
  CHECK(in.subnqn == kSub);
  CHECK(in.mn == "droce-nvmf");
  CHECK(r.mt->accepted.load() == 3);  // admin + 2 I/O queues

  PerfConfig pc;
  pc.queue_depth = 16;
  pc.io_size = 4096;  // in the capsule
  PerfResult v = run_verify(h, pc, 300);
  CHECK(v.error == "");
  CHECK(v.errors == 0);
  CHECK(v.mismatches == 0);
  CHECK(v.verified_blocks == 300 * 8);
  CHECK(v.writes == 300);
  CHECK(v.reads == 300);

  pc.io_size = 16384;  // keyed SGL: the target RDMA READs it
  pc.queue_depth = 8;
  v = run_verify(h, pc, 100);
  CHECK(v.error == "");
  CHECK(v.mismatches == 0);
  CHECK(v.verified_blocks == 100 * 32);

  pc.pattern = Pattern::RandRw;
  pc.io_size = 4096;
  pc.queue_depth = 32;
  pc.seconds = 30;
  pc.max_ios = 3000;
  PerfResult p = run_perf(h, pc);
  CHECK(p.error == "");
  CHECK(p.errors == 0);
  CHECK(p.ios == 3000);
  CHECK(p.reads + p.writes == 3000);
  CHECK(p.reads > 0);
  CHECK(p.writes > 0);
  CHECK(p.lat.count() == 3000);
  CHECK(p.lat.percentile(0.5) <= p.lat.percentile(0.99));

  // submit's refusals.
  uint8_t outside[512];
  CHECK(h.submit(1, IoDir::Read, 0, 1, outside, 0) == EINVAL);               // not in the data area
  CHECK(h.submit(0, IoDir::Read, 0, 1, h.data(), 0) == EINVAL);              // the admin queue
  CHECK(h.submit(3, IoDir::Read, 0, 1, h.data(), 0) == EINVAL);              // no such queue
  CHECK(h.submit(1, IoDir::Read, 0, 128, h.data(), 0) == EINVAL);            // 64 KiB > MDTS
  CHECK(h.submit(1, IoDir::Read, 0, 0, h.data(), 0) == EINVAL);              // nothing
  // An LBA beyond the namespace: the target's error status reaches the caller.
  REQUIRE(h.submit(1, IoDir::Read, in.blocks, 1, h.data(), 77) == 0);
  Completion c[4];
  int got = 0;
  for (int i = 0; i < 5'000'000 && got == 0; ++i) got = h.poll(c, 4);
  REQUIRE(got == 1);
  CHECK(c[0].user == 77);
  CHECK(c[0].status == sc::kLbaRange);
  // The queue fills at queue size - 1.
  int ok = 0;
  for (int i = 0; i < 20; ++i) ok += h.submit(1, IoDir::Read, static_cast<uint64_t>(i), 1, h.data() + 512 * i, i) == 0;
  CHECK(ok == 16);
  CHECK(h.in_flight(1) == 16);
  for (int i = 0, left = 16; i < 5'000'000 && left > 0; ++i) {
    const int n = h.poll(c, 4);
    REQUIRE(n >= 0);
    left -= n;
  }
  CHECK(h.in_flight(1) == 0);

  h.shutdown();
  CHECK(r.mt->shutdowns.load() == 1);
  CHECK_FALSE(h.failed());
}

TEST_CASE("host: an unknown subsystem NQN is refused at Connect with the target's status", "[nvmf][host]") {
  Rig r("nvh2");
  Host h(r.a, host_opts("nqn.2026-12.org.droce:nobody"));
  CHECK_THROWS_WITH(h.connect(), Catch::Contains("Fabrics Connect refused"));
}

TEST_CASE("host: the discovery log lists the subsystem", "[nvmf][host]") {
  Rig r("nvh3");
  Host h(r.a, host_opts());
  const auto entries = h.discover();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].subnqn == kSub);
  CHECK(entries[0].traddr == "10.64.0.2");
  CHECK(entries[0].trsvcid == "4420");
  CHECK(entries[0].trtype == disc::kTrtypeRdma);
}

TEST_CASE("host perf: the verify pattern catches a flipped byte, a wrong LBA and a stale run", "[nvmf][host]") {
  std::vector<uint8_t> b(4096);
  fill_block(b.data(), 4096, 1234, 99);
  CHECK(check_block(b.data(), 4096, 1234, 99));
  CHECK_FALSE(check_block(b.data(), 4096, 1235, 99));  // another block's data
  CHECK_FALSE(check_block(b.data(), 4096, 1234, 98));  // an earlier run's data
  b[2000] ^= 1;
  CHECK_FALSE(check_block(b.data(), 4096, 1234, 99));
  std::vector<uint8_t> z(512, 0);
  CHECK_FALSE(check_block(z.data(), 512, 0, 99));  // never written (zeroes)
  Pattern p{};
  CHECK(parse_pattern("randwrite", p));
  CHECK(p == Pattern::RandWrite);
  CHECK_FALSE(parse_pattern("random", p));
}

TEST_CASE("host perf: latency percentiles within the histogram's resolution", "[nvmf][host]") {
  LatencyHistogram h;
  CHECK(h.percentile(0.5) == 0);
  for (uint64_t v = 1; v <= 100000; ++v) h.add(v * 100);  // 100 ns .. 10 ms, uniform
  CHECK(h.count() == 100000);
  CHECK(h.min() == 100);
  CHECK(h.max() == 10'000'000);
  auto near = [](uint64_t got, double want) { return got >= want * 0.999 && got <= want * 1.02; };
  CHECK(near(h.percentile(0.5), 5'000'000));
  CHECK(near(h.percentile(0.99), 9'900'000));
  CHECK(near(h.percentile(0.999), 9'990'000));
  CHECK(h.percentile(1.0) == 10'000'000);
  LatencyHistogram small;
  for (uint64_t v : {5, 7, 9}) small.add(v);  // exact below 64 ns
  CHECK(small.percentile(0.5) == 7);
}

int main(int argc, char** argv) {
  std::unique_ptr<dpdk::Eal> eal;
  try {
    eal = std::make_unique<dpdk::Eal>(
        dpdk::EalOptions{.args = {"--lcores=(0-2)@(0-1)", "--log-level=lib.eal:error"}, .program = "test_nvmf_host"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return Catch::Session().run(argc, argv);
}

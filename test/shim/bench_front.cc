// 64-byte RDMA WRITE message rate and latency through the whole shim: a
// separate process uses the libibverbs API of the drop-in front
// (ibv_post_send / ibv_poll_cq, inline in verbs.h, through the rings) against
// a ShimServer whose backend engine thread executes the WRITEs; the baseline
// calls the same engine function in-process for the same work requests (what
// an embedding application would pay with no shim). Same run, same machine.
//   bench_front [messages]
#include <infiniband/verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "shim/ring.h"
#include "shim/server.h"

using namespace droce::shim;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

// The engine's per-WQE work: resolve the local SGE and the remote address
// through one MR, copy, build the completion.
struct Mr {
  uint8_t* addr = nullptr;
  uint64_t iova = 0, len = 0;
  uint32_t key = 0;
};
inline void execute(const droce_shm_send_wqe& w, const Mr& mr, uint32_t qpn, droce_shm_cqe* c) {
  bool ok = w.opcode == DROCE_WR_RDMA_WRITE && w.num_sge == 1 && w.rkey == mr.key && w.u.sge[0].lkey == mr.key;
  uint64_t n = w.u.sge[0].length;
  ok = ok && n <= mr.len && w.remote_addr >= mr.iova && w.remote_addr - mr.iova <= mr.len - n &&
       w.u.sge[0].addr >= mr.iova && w.u.sge[0].addr - mr.iova <= mr.len - n;
  if (ok) std::memmove(mr.addr + (w.remote_addr - mr.iova), mr.addr + (w.u.sge[0].addr - mr.iova), n);
  c->wr_id = w.wr_id;
  c->status = ok ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR;
  c->opcode = IBV_WC_RDMA_WRITE;
  c->byte_len = ok ? static_cast<uint32_t>(n) : 0;
  c->qp_num = qpn;
}

// A minimal backend: one PD, one MR, one CQ, one QP is all the bench uses.
class BenchBackend : public ShimBackend {
 public:
  ~BenchBackend() override { stop(); }
  void stop() {
    run_ = false;
    if (t_.joinable()) t_.join();
  }
  uint32_t device_count() override { return 1; }
  int device_info(uint32_t, proto::DeviceInfo& o) override {
    std::snprintf(o.name, sizeof(o.name), "droce0");
    o.phys_port_cnt = 1;
    return 0;
  }
  int query_device(uint32_t, ibv_device_attr& a) override {
    a = ibv_device_attr{};
    a.max_qp_wr = 4096;
    a.max_sge = 8;
    a.max_cqe = 32768;
    a.max_mr_size = 1ull << 40;
    a.max_srq_wr = 4096;
    a.max_srq_sge = 8;
    a.phys_port_cnt = 1;
    a.vendor_id = 0xffffff;
    return 0;
  }
  int query_port(uint32_t, uint32_t, ibv_port_attr& p) override {
    p = ibv_port_attr{};
    p.state = IBV_PORT_ACTIVE;
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    return 0;
  }
  int query_gid_table(uint32_t, uint32_t, ibv_gid_entry*, uint32_t) override { return 0; }
  int alloc_pd(const ClientInfo&, ObjId& o) override { return o = 1, 0; }
  int dealloc_pd(const ClientInfo&, ObjId) override { return 0; }
  int reg_mr(const ClientInfo&, const MrSetup& s, MrResult& o) override {
    std::lock_guard<std::mutex> g(mu_);
    mr_ = Mr{static_cast<uint8_t*>(s.addr), s.iova, s.length, 0x77};
    o = {2, 0x77, 0x77};
    return 0;
  }
  int dereg_mr(const ClientInfo&, ObjId) override { return 0; }
  int create_cq(const ClientInfo&, const CqSetup& s, CqResult& o) override {
    cq_.attach(s.ring, s.ring_entries);
    o = {3, 3};
    return 0;
  }
  int destroy_cq(const ClientInfo&, ObjId) override { return 0; }
  int create_srq(const ClientInfo&, const SrqSetup&, SrqResult&) override { return -EOPNOTSUPP; }
  int modify_srq(const ClientInfo&, ObjId, const ibv_srq_attr&, uint32_t) override { return -EOPNOTSUPP; }
  int query_srq(const ClientInfo&, ObjId, ibv_srq_attr&) override { return -EOPNOTSUPP; }
  int destroy_srq(const ClientInfo&, ObjId) override { return 0; }
  int create_qp(const ClientInfo&, const QpSetup& s, QpResult& o) override {
    sq_.attach(s.sq, s.sq_entries);
    o = {4, 0x104};
    run_ = true;
    t_ = std::thread([this] { loop(); });
    return 0;
  }
  int modify_qp(const ClientInfo&, ObjId, const ibv_qp_attr&, uint32_t) override { return 0; }
  int query_qp(const ClientInfo&, ObjId, uint32_t, ibv_qp_attr& a) override { return a = ibv_qp_attr{}, 0; }
  int destroy_qp(const ClientInfo&, ObjId) override {
    stop();
    return 0;
  }
  int create_ah(const ClientInfo&, ObjId, const ibv_ah_attr&, AhResult&) override { return -EOPNOTSUPP; }
  int destroy_ah(const ClientInfo&, ObjId) override { return 0; }

 private:
  void loop() {
    droce_shm_send_wqe w;
    uint32_t idle = 0;
    while (run_.load(std::memory_order_relaxed)) {
      uint32_t n = sq_.available();
      if (n == 0) {
        if (++idle % 1024 == 0) std::this_thread::yield();
        continue;
      }
      n = std::min(n, cq_.free_slots(n));
      uint32_t signaled = 0;
      for (uint32_t i = 0; i < n; i++) {
        sq_.copy(i, &w);
        droce_shm_cqe* c = cq_.slot(signaled);
        execute(w, mr_, 0x104, c);
        if (w.send_flags & DROCE_SEND_SIGNALED) signaled++;
      }
      sq_.release(n);  // slots back before their completions are visible
      if (signaled) cq_.publish(signaled);
    }
  }
  std::mutex mu_;
  Mr mr_;
  RingConsumer<droce_shm_send_wqe> sq_;
  RingProducer<droce_shm_cqe> cq_;
  std::thread t_;
  std::atomic<bool> run_{false};
};

struct Result {
  double mops, lat_ns;
};

constexpr int kSignalEvery = 32;

Result baseline(uint64_t n, uint64_t pings) {
  std::vector<uint8_t> buf(1 << 16);
  Mr mr{buf.data(), reinterpret_cast<uint64_t>(buf.data()), buf.size(), 0x77};
  droce_shm_send_wqe w{};
  droce_shm_cqe c{};
  uint64_t sum = 0;
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < n; i++) {
    w.wr_id = i;
    w.opcode = DROCE_WR_RDMA_WRITE;
    w.num_sge = 1;
    w.rkey = 0x77;
    w.remote_addr = mr.iova + 4096 + (i % 64) * 64;
    w.u.sge[0] = {mr.iova + (i % 64) * 64, 64, 0x77};
    execute(w, mr, 1, &c);
    sum += c.byte_len;
  }
  double rate = static_cast<double>(n) / secs(t0) / 1e6;
  t0 = Clock::now();
  for (uint64_t i = 0; i < pings; i++) {
    w.wr_id = i;
    execute(w, mr, 1, &c);
    sum += c.status;
  }
  double lat = secs(t0) / static_cast<double>(pings) * 1e9;
  if (sum == 1) std::puts("");
  return {rate, lat};
}

int client(uint64_t n, uint64_t pings, int out) {
  int num = 0;
  ibv_device** l = ibv_get_device_list(&num);
  if (l == nullptr || num < 1) return 10;
  ibv_context* ctx = ibv_open_device(l[0]);
  ibv_free_device_list(l);
  if (ctx == nullptr) return 11;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  std::vector<uint8_t>* buf = new std::vector<uint8_t>(1 << 16);
  ibv_mr* mr = ibv_reg_mr(pd, buf->data(), buf->size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_cq* cq = ibv_create_cq(ctx, 1024, nullptr, nullptr, 0);
  if (pd == nullptr || mr == nullptr || cq == nullptr) return 12;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {512, 16, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (qp == nullptr) return 13;
  // Posts need the QP out of RESET (this backend takes any transition).
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  if (ibv_modify_qp(qp, &rts, IBV_QP_STATE) != 0) return 13;
  ibv_sge sge{reinterpret_cast<uint64_t>(buf->data()), 64, mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.rkey = mr->rkey;
  ibv_send_wr* bad = nullptr;
  ibv_wc wc[32];
  uint64_t posted = 0, completed = 0, errors = 0;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  auto t0 = Clock::now();
  // Selective signaling: one completion per kSignalEvery WRITEs; at most
  // 256 outstanding.
  while (completed < n) {
    while (posted < n && posted - completed < 256) {
      wr.wr_id = posted;
      wr.send_flags = (posted % kSignalEvery == kSignalEvery - 1 || posted == n - 1) ? IBV_SEND_SIGNALED : 0;
      sge.addr = reinterpret_cast<uint64_t>(buf->data()) + (posted % 64) * 64;
      wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf->data()) + 4096 + (posted % 64) * 64;
      if (ibv_post_send(qp, &wr, &bad) != 0) break;
      posted++;
    }
    int k = ibv_poll_cq(cq, 32, wc);
    for (int i = 0; i < k; i++) {
      errors += wc[i].status != IBV_WC_SUCCESS;
      completed = wc[i].wr_id + 1;
    }
    if (k == 0) {
      std::this_thread::yield();
      if (Clock::now() > deadline) return 14;
    }
  }
  double rate = static_cast<double>(n) / secs(t0) / 1e6;
  wr.send_flags = IBV_SEND_SIGNALED;
  t0 = Clock::now();
  for (uint64_t i = 0; i < pings; i++) {
    wr.wr_id = i;
    if (ibv_post_send(qp, &wr, &bad) != 0) return 15;
    int k;
    for (uint32_t spin = 0; (k = ibv_poll_cq(cq, 1, wc)) == 0;)
      if (++spin % 1024 == 0) std::this_thread::yield();
    errors += k != 1 || wc[0].status != IBV_WC_SUCCESS;
  }
  double lat = secs(t0) / static_cast<double>(pings) * 1e9;
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  Result r{rate, lat};
  if (write(out, &r, sizeof(r)) != sizeof(r)) return 16;
  return errors == 0 ? 0 : 17;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 5'000'000;
  uint64_t pings = n / 50;
  char dir[] = "/tmp/droce-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  std::string sock = std::string(dir) + "/s.sock";
  Result base = baseline(n, pings);
  BenchBackend backend;
  ShimServer server(backend, ShimServerConfig{sock});
  if (server.start() != 0) return 1;
  int p[2];
  if (pipe(p) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    setenv("DROCE_SOCKET", sock.c_str(), 1);
    _exit(client(n, pings, p[1]));
  }
  int st = 0;
  waitpid(pid, &st, 0);
  server.stop();
  backend.stop();
  unlink(sock.c_str());
  rmdir(dir);
  Result shim{};
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || read(p[0], &shim, sizeof(shim)) != sizeof(shim)) {
    std::fprintf(stderr, "client failed (status %d)\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 1;
  }
  std::printf("64 B RDMA WRITE through libibverbs (front) -> rings -> engine thread, %lu messages\n",
              static_cast<unsigned long>(n));
  std::printf("  in-process engine call (baseline): %8.2f Mmsg/s  %8.1f ns/op\n", base.mops, base.lat_ns);
  std::printf("  shim, separate process            : %8.2f Mmsg/s  %8.1f ns post->poll round trip\n", shim.mops,
              shim.lat_ns);
  std::printf("  ratio shim/in-process: rate %.2f, latency +%.0f ns\n", shim.mops / base.mops,
              shim.lat_ns - base.lat_ns);
  return 0;
}

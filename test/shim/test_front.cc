// The libibverbs front through its public API (linked against the front, not
// the system libibverbs), against an in-process ShimServer with the loopback
// test double: the error paths Debian's tools never take.
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "loopback_backend.h"
#include "shim/server.h"

using namespace droce::shim;
using droce::shim::test::LoopbackBackend;

namespace {
struct Env {
  Env() {
    char tmpl[] = "/tmp/droce-front-test-XXXXXX";
    dir = mkdtemp(tmpl);
    server = std::make_unique<ShimServer>(backend, ShimServerConfig{dir + "/s.sock"});
    REQUIRE(server->start() == 0);
    backend.start_engine();
    setenv("DROCE_SOCKET", (dir + "/s.sock").c_str(), 1);
    int n = 0;
    ibv_device** l = ibv_get_device_list(&n);
    REQUIRE(l != nullptr);
    REQUIRE(n == 1);
    ctx = ibv_open_device(l[0]);
    ibv_free_device_list(l);
    REQUIRE(ctx != nullptr);
    pd = ibv_alloc_pd(ctx);
    REQUIRE(pd != nullptr);
  }
  ~Env() {
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    server->stop();
    backend.stop_engine();
    std::filesystem::remove_all(dir);
  }
  ibv_qp* qp(ibv_cq* cq, ibv_qp_type t, uint32_t wr = 4, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.srq = srq;
    a.qp_type = t;
    a.cap = {wr, wr, 2, 2, 0};
    return ibv_create_qp(pd, &a);
  }
  std::string dir;
  LoopbackBackend backend;
  std::unique_ptr<ShimServer> server;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
};
}  // namespace

TEST_CASE("front: post_send rejects bad work requests and reports the first unposted", "[shim][front]") {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  ibv_qp* uc = e.qp(cq, IBV_QPT_UC);
  ibv_qp* ud = e.qp(cq, IBV_QPT_UD);
  REQUIRE(uc != nullptr);
  REQUIRE(ud != nullptr);
  ibv_qp_init_attr got{};
  ibv_qp_attr qa{};
  REQUIRE(ibv_query_qp(uc, &qa, IBV_QP_CAP, &got) == 0);
  CHECK(got.cap.max_send_wr == 4);
  CHECK(got.cap.max_inline_data == DROCE_SHM_MAX_INLINE);
  CHECK(got.qp_type == IBV_QPT_UC);
  char buf[64] = {};
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), 8, 0};
  // Posts need the QPs out of RESET (the RESET refusals: their own test case).
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  REQUIRE(ibv_modify_qp(uc, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  init.qkey = 0x11111111;
  REQUIRE(ibv_modify_qp(ud, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
  ibv_send_wr w[6] = {};
  for (int i = 0; i < 6; i++) {
    w[i].wr_id = static_cast<uint64_t>(i);
    w[i].sg_list = &sge;
    w[i].num_sge = 1;
    w[i].opcode = IBV_WR_SEND;
    w[i].send_flags = IBV_SEND_INLINE;
    w[i].next = i < 5 ? &w[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  // A READ on UC is not a UC operation: the first two are posted, the third is bad.
  w[2].opcode = IBV_WR_RDMA_READ;
  CHECK(ibv_post_send(uc, &w[0], &bad) == EINVAL);
  CHECK(bad == &w[2]);
  w[2].opcode = IBV_WR_SEND;
  // Too many SGEs.
  w[2].num_sge = 3;
  CHECK(ibv_post_send(uc, &w[2], &bad) == EINVAL);
  CHECK(bad == &w[2]);
  w[2].num_sge = 1;
  // Inline data beyond the limit.
  ibv_sge big{reinterpret_cast<uint64_t>(buf), DROCE_SHM_MAX_INLINE + 1, 0};
  w[2].sg_list = &big;
  CHECK(ibv_post_send(uc, &w[2], &bad) == EINVAL);
  w[2].sg_list = &sge;
  // The ring holds 4; 2 are in it (the QP is in INIT, nothing consumes).
  CHECK(ibv_post_send(uc, &w[2], &bad) == ENOMEM);
  CHECK(bad == &w[4]);
  // UD needs an address handle.
  w[5].next = nullptr;
  CHECK(ibv_post_send(ud, &w[5], &bad) == EINVAL);
  CHECK(ibv_destroy_qp(uc) == 0);
  CHECK(ibv_destroy_qp(ud) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("front: a QP in RESET takes no work request: post_send, post_recv, ibv_wr_complete", "[shim][front]") {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  ibv_qp_init_attr_ex qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.cap = {4, 4, 2, 2, 0};
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.pd = e.pd;
  qa.qp_type = IBV_QPT_RC;
  qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
  ibv_qp* qp = ibv_create_qp_ex(e.ctx, &qa);
  REQUIRE(qp != nullptr);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(qp);
  REQUIRE(x != nullptr);
  char buf[16] = {};
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), 8, 0};
  ibv_send_wr sw{};
  sw.sg_list = &sge;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_INLINE;
  ibv_recv_wr rw{};
  rw.sg_list = &sge;
  rw.num_sge = 1;
  auto batch = [&] {
    ibv_wr_start(x);
    x->wr_flags = 0;
    ibv_wr_send(x);
    ibv_wr_set_inline_data(x, buf, 8);
    return ibv_wr_complete(x);
  };
  auto refused = [&] {
    ibv_send_wr* bs = nullptr;
    ibv_recv_wr* br = nullptr;
    CHECK(ibv_post_send(qp, &sw, &bs) == EINVAL);
    CHECK(bs == &sw);
    CHECK(ibv_post_recv(qp, &rw, &br) == EINVAL);
    CHECK(br == &rw);
    CHECK(batch() == EINVAL);
    ibv_wr_start(x);
    CHECK(ibv_wr_complete(x) == 0);  // an empty batch posts nothing
  };
  refused();  // created in RESET
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  ibv_send_wr* bs = nullptr;
  ibv_recv_wr* br = nullptr;
  CHECK(ibv_post_send(qp, &sw, &bs) == 0);  // INIT: taken (the loopback backend runs them at RTS)
  CHECK(ibv_post_recv(qp, &rw, &br) == 0);
  CHECK(batch() == 0);
  a.qp_state = IBV_QPS_RESET;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
  refused();  // back in RESET
  CHECK(ibv_destroy_qp(qp) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("front: dependencies, SRQ receives, bad attributes", "[shim][front]") {
  Env e;
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  CHECK(ibv_create_cq(e.ctx, 0, nullptr, nullptr, 0) == nullptr);
  CHECK(errno == EINVAL);
  ibv_srq_init_attr si{};
  si.attr = {8, 1, 0};
  ibv_srq* srq = ibv_create_srq(e.pd, &si);
  REQUIRE(srq != nullptr);
  CHECK(si.attr.max_wr == 8);
  ibv_qp* qp = e.qp(cq, IBV_QPT_RC, 4, srq);
  REQUIRE(qp != nullptr);
  ibv_recv_wr r{};
  ibv_recv_wr* bad = nullptr;
  CHECK(ibv_post_recv(qp, &r, &bad) == EINVAL);  // receives go to the SRQ
  CHECK(ibv_post_srq_recv(srq, &r, &bad) == 0);
  ibv_srq_attr sa{};
  CHECK(ibv_query_srq(srq, &sa) == 0);
  CHECK(sa.max_wr == 8);
  // Busy objects cannot go.
  CHECK(ibv_dealloc_pd(e.pd) == EBUSY);
  CHECK(ibv_destroy_cq(cq) == EBUSY);
  CHECK(ibv_destroy_srq(srq) == EBUSY);
  // An illegal transition (RESET -> RTS) is refused by the backend.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
  CHECK(qp->state == IBV_QPS_RESET);
  a.qp_state = IBV_QPS_INIT;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
  CHECK(qp->state == IBV_QPS_INIT);
  // Too large a QP.
  ibv_qp_init_attr big{};
  big.send_cq = big.recv_cq = cq;
  big.qp_type = IBV_QPT_RC;
  big.cap = {100000, 1, 1, 1, 0};
  CHECK(ibv_create_qp(e.pd, &big) == nullptr);
  CHECK(errno == EINVAL);
  CHECK(ibv_destroy_qp(qp) == 0);
  CHECK(ibv_destroy_srq(srq) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
}

TEST_CASE("front: completion channel events through ibv_get_cq_event", "[shim][front]") {
  Env e;
  ibv_comp_channel* ch = ibv_create_comp_channel(e.ctx);
  REQUIRE(ch != nullptr);
  int tag = 0;
  ibv_cq* cq = ibv_create_cq(e.ctx, 16, &tag, ch, 0);
  ibv_cq* quiet = ibv_create_cq(e.ctx, 16, nullptr, ch, 0);
  REQUIRE(cq != nullptr);
  REQUIRE(quiet != nullptr);
  ibv_qp* qp = e.qp(cq, IBV_QPT_RC);
  REQUIRE(qp != nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
  a.qp_state = IBV_QPS_RTR;
  a.dest_qp_num = qp->qp_num;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN) == 0);
  a.qp_state = IBV_QPS_RTS;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
  static char buf[8192];
  ibv_mr* mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr != nullptr);
  CHECK(ibv_req_notify_cq(cq, 0) == 0);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), 16, mr->lkey};
  ibv_send_wr w{};
  w.wr_id = 99;
  w.sg_list = &sge;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf) + 4096;
  w.wr.rdma.rkey = mr->rkey;
  std::memcpy(buf, "0123456789abcdef", 16);
  ibv_send_wr* bad = nullptr;
  REQUIRE(ibv_post_send(qp, &w, &bad) == 0);
  pollfd p{ch->fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 5000) == 1);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  REQUIRE(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0);
  CHECK(ev_cq == cq);
  CHECK(ev_ctx == &tag);
  ibv_ack_cq_events(cq, 1);
  CHECK(cq->comp_events_completed == 1);
  ibv_wc wc{};
  REQUIRE(ibv_poll_cq(cq, 1, &wc) == 1);
  CHECK(wc.wr_id == 99);
  CHECK(wc.status == IBV_WC_SUCCESS);
  CHECK(std::memcmp(buf + 4096, "0123456789abcdef", 16) == 0);
  CHECK(poll(&p, 1, 20) == 0);  // one event, one token
  {
    // A signal ends a blocking wait with EINTR, as libibverbs' read() does:
    // qperf's latency loop waits in ibv_get_cq_event and leaves it when its
    // test alarm fires (a wait that swallowed EINTR kept it there for good).
    // SIGUSR1 (handler without SA_RESTART) is sent to this thread until the
    // call returns; after 5 s a completion ends the wait instead.
    struct sigaction sa{}, old{};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
    CHECK(ibv_req_notify_cq(cq, 0) == 0);
    std::atomic<bool> back{false};
    const pthread_t me = pthread_self();
    std::thread kicker([&] {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!back.load() && std::chrono::steady_clock::now() < end) {
        pthread_kill(me, SIGUSR1);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // pacing the signals, not a sync
      }
      if (!back.load()) {
        ibv_send_wr* b = nullptr;
        ibv_post_send(qp, &w, &b);  // the fallback: an event ends the wait
      }
    });
    const int rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
    const int e = errno;
    back = true;
    kicker.join();
    sigaction(SIGUSR1, &old, nullptr);
    CHECK(rc == -1);
    CHECK(e == EINTR);
    if (rc == 0) {
      ibv_ack_cq_events(cq, 1);
      ibv_poll_cq(cq, 1, &wc);
    }
  }
  CHECK(ibv_destroy_comp_channel(ch) == -1);  // CQs still use it
  CHECK(errno == EBUSY);
  CHECK(ibv_destroy_qp(qp) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_destroy_cq(quiet) == 0);
  CHECK(ibv_destroy_comp_channel(ch) == 0);
}

namespace {
// Polls `cq` through the extended API until `want` completions arrived or 5 s
// passed; each is recorded by wr_id with every field the ibv_wc_read_* calls give.
struct ExWc {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t vendor_err, byte_len, qp_num, src_qp, slid;
  __be32 imm;
  unsigned int flags;
  uint8_t sl, dlid_path_bits;
};
std::vector<ExWc> poll_ex(ibv_cq_ex* cq, size_t want) {
  std::vector<ExWc> got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got.size() < want && std::chrono::steady_clock::now() < end) {
    ibv_poll_cq_attr pa{};
    int rc = ibv_start_poll(cq, &pa);
    if (rc == ENOENT) continue;
    REQUIRE(rc == 0);
    do {
      got.push_back({cq->wr_id, cq->status, ibv_wc_read_opcode(cq), ibv_wc_read_vendor_err(cq),
                     ibv_wc_read_byte_len(cq), ibv_wc_read_qp_num(cq), ibv_wc_read_src_qp(cq), ibv_wc_read_slid(cq),
                     ibv_wc_read_imm_data(cq), ibv_wc_read_wc_flags(cq), ibv_wc_read_sl(cq),
                     ibv_wc_read_dlid_path_bits(cq)});
    } while (got.size() < want && (rc = ibv_next_poll(cq)) == 0);
    CHECK((rc == 0 || rc == ENOENT));
    ibv_end_poll(cq);
  }
  return got;
}
const ExWc* find_wc(const std::vector<ExWc>& v, uint64_t wr_id) {
  for (const auto& w : v)
    if (w.wr_id == wr_id) return &w;
  return nullptr;
}
void to_rts(ibv_qp* qp, uint32_t dest) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.qkey = 0x11111111;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | (qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : 0)) == 0);
  a.qp_state = IBV_QPS_RTR;
  a.dest_qp_num = dest;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN) == 0);
  a.qp_state = IBV_QPS_RTS;
  REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
}
}  // namespace

TEST_CASE("front: extended CQ and QP creation refuses what droce lacks", "[shim][front][ex]") {
  Env e;
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cq = ibv_create_cq_ex(e.ctx, &ca);
  REQUIRE(cq != nullptr);
  CHECK(ibv_cq_ex_to_cq(cq)->cqe >= 16);
  CHECK(ibv_cq_ex_to_cq(cq)->context == e.ctx);
  // No completion timestamps (the engine does not stamp), nor the vendor flags.
  for (uint64_t f : {uint64_t(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP), uint64_t(IBV_WC_EX_WITH_CVLAN),
                     uint64_t(IBV_WC_EX_WITH_FLOW_TAG), uint64_t(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)}) {
    ibv_cq_init_attr_ex b = ca;
    b.wc_flags = f;
    errno = 0;
    CHECK(ibv_create_cq_ex(e.ctx, &b) == nullptr);
    CHECK(errno == EOPNOTSUPP);
  }
  {
    ibv_cq_init_attr_ex b = ca;
    b.comp_vector = static_cast<uint32_t>(e.ctx->num_comp_vectors);
    CHECK(ibv_create_cq_ex(e.ctx, &b) == nullptr);
    CHECK(errno == EINVAL);
    b = ca;
    b.cqe = 1u << 30;
    CHECK(ibv_create_cq_ex(e.ctx, &b) == nullptr);
    CHECK(errno == EINVAL);
    b = ca;
    b.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    b.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
    CHECK(ibv_create_cq_ex(e.ctx, &b) == nullptr);
    CHECK(errno == EOPNOTSUPP);
    b.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;  // a hint
    ibv_cq_ex* st = ibv_create_cq_ex(e.ctx, &b);
    REQUIRE(st != nullptr);
    CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(st)) == 0);
  }
  ibv_qp_init_attr_ex qa{};
  qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cq);
  qa.cap = {4, 4, 2, 2, 0};
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.pd = e.pd;
  struct Case {
    ibv_qp_type type;
    uint64_t ops;
    bool ok;
  };
  const Case cases[] = {
      {IBV_QPT_RC,
       IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
           IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
           IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV,
       true},
      {IBV_QPT_RC, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW, true},
      {IBV_QPT_RC, IBV_QP_EX_WITH_LOCAL_INV, true},
      {IBV_QPT_UC, IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV, true},
      {IBV_QPT_UD, IBV_QP_EX_WITH_BIND_MW, false},
      {IBV_QPT_UD, IBV_QP_EX_WITH_LOCAL_INV, false},
      {IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_WRITE, false},
      {IBV_QPT_RC, 1u << 11, false},  // FLUSH (rdma-core 45's IBV_QP_EX_WITH_FLUSH)
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM, true},
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ, false},
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, true},
      {IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE, false},
      {IBV_QPT_UD, IBV_QP_EX_WITH_TSO, false},
  };
  for (const Case& c : cases) {
    CAPTURE(c.type, c.ops);
    ibv_qp_init_attr_ex a = qa;
    a.qp_type = c.type;
    a.send_ops_flags = c.ops;
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(e.ctx, &a);
    if (!c.ok) {
      CHECK(qp == nullptr);
      CHECK(errno == EOPNOTSUPP);
      continue;
    }
    REQUIRE(qp != nullptr);
    ibv_qp_ex* x = ibv_qp_to_qp_ex(qp);
    REQUIRE(x != nullptr);
    CHECK(&x->qp_base == qp);
    // Builders only for the operations asked for.
    CHECK((x->wr_send != nullptr) == ((c.ops & IBV_QP_EX_WITH_SEND) != 0));
    CHECK((x->wr_rdma_read != nullptr) == ((c.ops & IBV_QP_EX_WITH_RDMA_READ) != 0));
    CHECK((x->wr_bind_mw != nullptr) == ((c.ops & IBV_QP_EX_WITH_BIND_MW) != 0));
    CHECK((x->wr_local_inv != nullptr) == ((c.ops & IBV_QP_EX_WITH_LOCAL_INV) != 0));
    CHECK(ibv_destroy_qp(qp) == 0);
  }
  // Create flags and unknown attributes are refused; a PD is required.
  ibv_qp_init_attr_ex a = qa;
  a.qp_type = IBV_QPT_RC;
  a.send_ops_flags = IBV_QP_EX_WITH_SEND;
  a.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
  a.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  CHECK(ibv_create_qp_ex(e.ctx, &a) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  a = qa;
  a.qp_type = IBV_QPT_RC;
  a.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  CHECK(ibv_create_qp_ex(e.ctx, &a) == nullptr);
  CHECK(errno == EINVAL);
  // A QP created without send_ops_flags has no ibv_qp_ex.
  ibv_qp* plain = e.qp(ibv_cq_ex_to_cq(cq), IBV_QPT_RC);
  REQUIRE(plain != nullptr);
  CHECK(ibv_qp_to_qp_ex(plain) == nullptr);
  CHECK(ibv_destroy_qp(plain) == 0);
  CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("front: every RC operation through ibv_wr_*, completions through ibv_cq_ex", "[shim][front][ex]") {
  Env e;
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 64;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cq = ibv_create_cq_ex(e.ctx, &ca);
  REQUIRE(cq != nullptr);
  ibv_qp_init_attr_ex qa{};
  qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cq);
  qa.cap = {8, 8, 2, 2, 0};
  qa.qp_type = IBV_QPT_RC;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.pd = e.pd;
  qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                      IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                      IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  ibv_qp* a = ibv_create_qp_ex(e.ctx, &qa);
  ibv_qp* b = ibv_create_qp_ex(e.ctx, &qa);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(qa.cap.max_send_wr == 8);
  to_rts(a, b->qp_num);
  to_rts(b, a->qp_num);
  static char buf[4 * 4096] __attribute__((aligned(64)));
  ibv_mr* mr = ibv_reg_mr(e.pd, buf, sizeof(buf),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC);
  REQUIRE(mr != nullptr);
  const auto at = [](size_t off) { return reinterpret_cast<uint64_t>(buf) + off; };
  // b's receives: the SEND, the SEND with immediate, the WRITE with immediate.
  ibv_sge rs[3] = {{at(8192), 64, mr->lkey}, {at(8192 + 64), 64, mr->lkey}, {at(8192 + 128), 64, mr->lkey}};
  for (int i = 0; i < 3; i++) {
    ibv_recv_wr r{};
    r.wr_id = 100 + static_cast<uint64_t>(i);
    r.sg_list = &rs[i];
    r.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    REQUIRE(ibv_post_recv(b, &r, &bad) == 0);
  }
  std::memcpy(buf, "send-by-sge-0123", 16);
  std::memcpy(buf + 16, "AAAAbbbb", 8);
  std::memcpy(buf + 32, "CCCCdddd", 8);
  std::memcpy(buf + 12288, "read-me!", 8);
  uint64_t cmp_target = 40, add_target = 1000;
  std::memcpy(buf + 12288 + 64, &cmp_target, 8);
  std::memcpy(buf + 12288 + 128, &add_target, 8);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  REQUIRE(x != nullptr);
  const char inl[] = "inline-data";
  const ibv_data_buf parts[2] = {{const_cast<char*>("two-"), 4}, {const_cast<char*>("parts"), 5}};
  ibv_sge two[2] = {{at(16), 8, mr->lkey}, {at(32), 8, mr->lkey}};
  ibv_wr_start(x);
  x->wr_flags = IBV_SEND_SIGNALED;
  x->wr_id = 1;
  ibv_wr_send(x);
  ibv_wr_set_sge(x, mr->lkey, at(0), 16);
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(0xabcd1234));
  ibv_wr_set_inline_data(x, const_cast<char*>(inl), sizeof(inl));
  x->wr_id = 3;
  ibv_wr_rdma_write(x, mr->rkey, at(4096));
  ibv_wr_set_sge_list(x, 2, two);
  x->wr_id = 4;
  ibv_wr_rdma_write_imm(x, mr->rkey, at(4096 + 64), htonl(77));
  ibv_wr_set_inline_data_list(x, 2, parts);
  x->wr_id = 5;
  ibv_wr_rdma_read(x, mr->rkey, at(12288));
  ibv_wr_set_sge(x, mr->lkey, at(4096 + 256), 8);
  x->wr_id = 6;
  ibv_wr_atomic_cmp_swp(x, mr->rkey, at(12288 + 64), 40, 41);
  ibv_wr_set_sge(x, mr->lkey, at(4096 + 512), 8);
  x->wr_id = 7;
  ibv_wr_atomic_fetch_add(x, mr->rkey, at(12288 + 128), 5);
  ibv_wr_set_sge(x, mr->lkey, at(4096 + 576), 8);
  REQUIRE(ibv_wr_complete(x) == 0);
  const std::vector<ExWc> got = poll_ex(cq, 10);
  REQUIRE(got.size() == 10);
  struct Want {
    uint64_t wr_id;
    ibv_wc_opcode op;
    uint32_t len;
  };
  for (const Want& w : {Want{1, IBV_WC_SEND, 16}, Want{2, IBV_WC_SEND, sizeof(inl)}, Want{3, IBV_WC_RDMA_WRITE, 16},
                        Want{4, IBV_WC_RDMA_WRITE, 9}, Want{5, IBV_WC_RDMA_READ, 8}, Want{6, IBV_WC_COMP_SWAP, 8},
                        Want{7, IBV_WC_FETCH_ADD, 8}}) {
    CAPTURE(w.wr_id);
    const ExWc* c = find_wc(got, w.wr_id);
    REQUIRE(c != nullptr);
    CHECK(c->status == IBV_WC_SUCCESS);
    CHECK(c->opcode == w.op);
    CHECK(c->byte_len == w.len);
    CHECK(c->qp_num == a->qp_num);
  }
  const ExWc* r0 = find_wc(got, 100);
  const ExWc* r1 = find_wc(got, 101);
  const ExWc* r2 = find_wc(got, 102);
  REQUIRE(r0 != nullptr);
  REQUIRE(r1 != nullptr);
  REQUIRE(r2 != nullptr);
  CHECK(r0->opcode == IBV_WC_RECV);
  CHECK(r0->byte_len == 16);
  CHECK(r0->qp_num == b->qp_num);
  CHECK(r0->src_qp == a->qp_num);
  CHECK(!(r0->flags & IBV_WC_WITH_IMM));
  CHECK(r1->opcode == IBV_WC_RECV);
  CHECK(r1->byte_len == sizeof(inl));
  CHECK((r1->flags & IBV_WC_WITH_IMM));
  CHECK(ntohl(r1->imm) == 0xabcd1234);
  CHECK(r2->opcode == IBV_WC_RECV_RDMA_WITH_IMM);
  CHECK(ntohl(r2->imm) == 77);
  CHECK(std::memcmp(buf + 8192, "send-by-sge-0123", 16) == 0);
  CHECK(std::memcmp(buf + 8192 + 64, inl, sizeof(inl)) == 0);
  CHECK(std::memcmp(buf + 4096, "AAAAbbbbCCCCdddd", 16) == 0);
  CHECK(std::memcmp(buf + 4096 + 64, "two-parts", 9) == 0);
  CHECK(std::memcmp(buf + 4096 + 256, "read-me!", 8) == 0);
  uint64_t v = 0;
  std::memcpy(&v, buf + 4096 + 512, 8);
  CHECK(v == 40);  // the old value
  std::memcpy(&v, buf + 12288 + 64, 8);
  CHECK(v == 41);  // swapped
  std::memcpy(&v, buf + 4096 + 576, 8);
  CHECK(v == 1000);
  std::memcpy(&v, buf + 12288 + 128, 8);
  CHECK(v == 1005);

  // Unsignaled WRs complete silently; an aborted batch never runs; a batch
  // with an error is dropped whole and wr_complete returns the error.
  ibv_wr_start(x);
  x->wr_id = 20;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1024));
  ibv_wr_set_sge(x, mr->lkey, at(0), 4);
  ibv_wr_abort(x);
  ibv_wr_start(x);
  x->wr_id = 21;
  ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1024));
  ibv_wr_set_sge_list(x, 3, rs);  // max_send_sge is 2
  x->wr_id = 22;
  ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1024));
  ibv_wr_set_sge(x, mr->lkey, at(0), 4);
  CHECK(ibv_wr_complete(x) == EINVAL);
  ibv_wr_start(x);
  x->wr_id = 23;
  ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1024));
  ibv_wr_set_inline_data(x, buf, DROCE_SHM_MAX_INLINE + 1);
  CHECK(ibv_wr_complete(x) == EINVAL);
  ibv_wr_start(x);
  for (uint64_t i = 0; i < 9; i++) {  // one more than the send queue holds
    x->wr_id = 30 + i;
    x->wr_flags = i == 7 ? IBV_SEND_SIGNALED : 0;
    ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1024));
    ibv_wr_set_sge(x, mr->lkey, at(0), 4);
  }
  CHECK(ibv_wr_complete(x) == ENOMEM);
  ibv_wr_start(x);
  x->wr_id = 40;
  x->wr_flags = 0;
  ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1024));
  ibv_wr_set_sge(x, mr->lkey, at(0), 4);
  x->wr_id = 41;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, mr->rkey, at(4096 + 1028));
  ibv_wr_set_sge(x, mr->lkey, at(4), 4);
  REQUIRE(ibv_wr_complete(x) == 0);
  const std::vector<ExWc> more = poll_ex(cq, 1);
  REQUIRE(more.size() == 1);
  CHECK(more[0].wr_id == 41);  // 20-23 and 30-38 never ran, 40 was unsignaled
  CHECK(std::memcmp(buf + 4096 + 1024, "send-by-", 8) == 0);
  CHECK(e.backend.wqes_executed() == 9);
  // The plain API works on the same objects.
  ibv_sge s{at(0), 4, mr->lkey};
  ibv_send_wr w{};
  w.wr_id = 50;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma = {at(4096 + 2048), mr->rkey};
  ibv_send_wr* bad = nullptr;
  REQUIRE(ibv_post_send(a, &w, &bad) == 0);
  ibv_wc wc{};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int n = 0;
  while (n == 0 && std::chrono::steady_clock::now() < end) n = ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc);
  REQUIRE(n == 1);
  CHECK(wc.wr_id == 50);
  CHECK(ibv_destroy_qp(a) == 0);
  CHECK(ibv_destroy_qp(b) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("front: UD and UC sends through ibv_wr_*", "[shim][front][ex]") {
  Env e;
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_IMM;
  ibv_cq_ex* cq = ibv_create_cq_ex(e.ctx, &ca);
  REQUIRE(cq != nullptr);
  ibv_qp_init_attr_ex qa{};
  qa.send_cq = qa.recv_cq = ibv_cq_ex_to_cq(cq);
  qa.cap = {4, 4, 2, 2, 0};
  qa.qp_type = IBV_QPT_UD;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  qa.pd = e.pd;
  qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ibv_qp* a = ibv_create_qp_ex(e.ctx, &qa);
  ibv_qp* b = ibv_create_qp_ex(e.ctx, &qa);
  qa.qp_type = IBV_QPT_UC;
  qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
  ibv_qp* uc = ibv_create_qp_ex(e.ctx, &qa);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  REQUIRE(uc != nullptr);
  to_rts(a, 0);
  to_rts(b, 0);
  to_rts(uc, uc->qp_num);
  static char buf[8192];
  ibv_mr* mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr != nullptr);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(e.pd, &aa);
  REQUIRE(ah != nullptr);
  ibv_sge rs{reinterpret_cast<uint64_t>(buf) + 4096, 40 + 64, mr->lkey};
  ibv_recv_wr r{};
  r.wr_id = 7;
  r.sg_list = &rs;
  r.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  REQUIRE(ibv_post_recv(b, &r, &bad) == 0);
  std::memcpy(buf, "datagram", 8);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  REQUIRE(x != nullptr);
  CHECK(x->wr_rdma_write == nullptr);
  // A send without an address handle fails the batch.
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_set_ud_addr(x, nullptr, b->qp_num, 0x11111111);
  CHECK(ibv_wr_complete(x) == EINVAL);
  ibv_wr_start(x);
  x->wr_id = 3;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htonl(5));
  ibv_wr_set_ud_addr(x, ah, b->qp_num, 0x11111111);
  ibv_wr_set_sge(x, mr->lkey, reinterpret_cast<uint64_t>(buf), 8);
  REQUIRE(ibv_wr_complete(x) == 0);
  std::vector<ExWc> got = poll_ex(cq, 2);
  REQUIRE(got.size() == 2);
  const ExWc* s = find_wc(got, 3);
  const ExWc* rc = find_wc(got, 7);
  REQUIRE(s != nullptr);
  REQUIRE(rc != nullptr);
  CHECK(s->status == IBV_WC_SUCCESS);
  CHECK(s->opcode == IBV_WC_SEND);
  CHECK(rc->status == IBV_WC_SUCCESS);
  CHECK(rc->opcode == IBV_WC_RECV);
  CHECK(rc->byte_len == 40 + 8);
  CHECK((rc->flags & IBV_WC_GRH));
  CHECK((rc->flags & IBV_WC_WITH_IMM));
  CHECK(ntohl(rc->imm) == 5);
  CHECK(rc->src_qp == a->qp_num);
  CHECK(rc->qp_num == b->qp_num);
  CHECK(std::memcmp(buf + 4096 + 40, "datagram", 8) == 0);
  // UC: a WRITE to itself.
  ibv_qp_ex* u = ibv_qp_to_qp_ex(uc);
  REQUIRE(u != nullptr);
  CHECK(u->wr_send == nullptr);
  ibv_wr_start(u);
  u->wr_id = 9;
  u->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(u, mr->rkey, reinterpret_cast<uint64_t>(buf) + 6000);
  ibv_wr_set_sge(u, mr->lkey, reinterpret_cast<uint64_t>(buf), 8);
  REQUIRE(ibv_wr_complete(u) == 0);
  got = poll_ex(cq, 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].wr_id == 9);
  CHECK(got[0].status == IBV_WC_SUCCESS);
  CHECK(got[0].opcode == IBV_WC_RDMA_WRITE);
  CHECK(std::memcmp(buf + 6000, "datagram", 8) == 0);
  // Nothing left: start_poll says ENOENT and holds no lock (a second call works).
  ibv_poll_cq_attr pa{};
  CHECK(ibv_start_poll(cq, &pa) == ENOENT);
  CHECK(ibv_start_poll(cq, &pa) == ENOENT);
  CHECK(ibv_destroy_ah(ah) == 0);
  CHECK(ibv_destroy_qp(a) == 0);
  CHECK(ibv_destroy_qp(b) == 0);
  CHECK(ibv_destroy_qp(uc) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)) == 0);
}

TEST_CASE("front: ibv_resize_cq keeps the unread completions and refuses fewer entries than unread",
          "[shim][front][ex]") {
  Env e;
  ibv_comp_channel* ch = ibv_create_comp_channel(e.ctx);
  REQUIRE(ch != nullptr);
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 3;
  ca.channel = ch;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ibv_cq_ex* cqx = ibv_create_cq_ex(e.ctx, &ca);
  REQUIRE(cqx != nullptr);
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  CHECK(cq->cqe == 4);
  ibv_qp* qp = e.qp(cq, IBV_QPT_RC, 32);
  REQUIRE(qp != nullptr);
  to_rts(qp, qp->qp_num);
  static char buf[8192];
  ibv_mr* mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  REQUIRE(mr != nullptr);
  ibv_sge s{reinterpret_cast<uint64_t>(buf), 4, mr->lkey};
  const auto post = [&](uint64_t id) {
    ibv_send_wr w{};
    w.wr_id = id;
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma = {reinterpret_cast<uint64_t>(buf) + 4096, mr->rkey};
    ibv_send_wr* bad = nullptr;
    REQUIRE(ibv_post_send(qp, &w, &bad) == 0);
  };
  const auto executed = [&](uint64_t n) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (e.backend.wqes_executed() < n && std::chrono::steady_clock::now() < end) std::this_thread::yield();
    return e.backend.wqes_executed() >= n;
  };
  for (uint64_t i = 1; i <= 3; i++) post(i);
  REQUIRE(executed(3));  // three completions unread in the ring
  CHECK(ibv_resize_cq(cq, 2) == EINVAL);
  CHECK(cq->cqe == 4);
  CHECK(ibv_resize_cq(cq, 0) == EINVAL);
  CHECK(ibv_resize_cq(cq, 1 << 30) == EINVAL);
  // Shrink to exactly what is unread, then grow; the arm goes along.
  CHECK(ibv_resize_cq(cq, 3) == 0);
  CHECK(cq->cqe == 4);
  CHECK(ibv_resize_cq(cq, 100) == 0);
  CHECK(cq->cqe == 128);
  CHECK(ibv_req_notify_cq(cq, 0) == 0);
  CHECK(ibv_resize_cq(cq, 20) == 0);
  CHECK(cq->cqe == 32);
  for (uint64_t i = 4; i <= 20; i++) post(i);  // more than the old ring held
  pollfd p{ch->fd, POLLIN, 0};
  REQUIRE(poll(&p, 1, 5000) == 1);
  ibv_cq* ev = nullptr;
  void* ctx = nullptr;
  REQUIRE(ibv_get_cq_event(ch, &ev, &ctx) == 0);
  CHECK(ev == cq);
  ibv_ack_cq_events(cq, 1);
  const std::vector<ExWc> got = poll_ex(cqx, 20);
  REQUIRE(got.size() == 20);
  for (uint64_t i = 0; i < 20; i++) {
    CHECK(got[i].wr_id == i + 1);  // in order across the resizes
    CHECK(got[i].status == IBV_WC_SUCCESS);
  }
  CHECK(ibv_destroy_qp(qp) == 0);
  CHECK(ibv_dereg_mr(mr) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  CHECK(ibv_destroy_comp_channel(ch) == 0);
}

// What rdma-core's pyverbs suite (tests/test_cq.py, test_device.py, test_fork.py,
// test_relaxed_ordering.py) checks of a device's attributes and argument checks.
TEST_CASE("front: device attributes and argument checks as rdma-core's suite expects them", "[shim][front]") {
  Env e;
  ibv_device_attr a{};
  REQUIRE(ibv_query_device(e.ctx, &a) == 0);
  // CQs: more CQEs than max_cqe, or a completion vector the context does not have.
  REQUIRE(e.ctx->num_comp_vectors == 1);
  errno = 0;
  CHECK(ibv_create_cq(e.ctx, a.max_cqe + 1, nullptr, nullptr, 0) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(ibv_create_cq(e.ctx, 16, nullptr, nullptr, e.ctx->num_comp_vectors) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(ibv_create_cq(e.ctx, 16, nullptr, nullptr, -1) == nullptr);
  CHECK(errno == EINVAL);
  ibv_cq* cq = ibv_create_cq(e.ctx, a.max_cqe, nullptr, nullptr, e.ctx->num_comp_vectors - 1);
  REQUIRE(cq != nullptr);
  CHECK(ibv_destroy_cq(cq) == 0);
  // ibv_query_device_ex: the same base attributes, phys_port_cnt_ex = phys_port_cnt.
  ibv_device_attr_ex x{};
  REQUIRE(ibv_query_device_ex(e.ctx, nullptr, &x) == 0);
  CHECK(x.orig_attr.phys_port_cnt == 1);
  CHECK(x.phys_port_cnt_ex == x.orig_attr.phys_port_cnt);
  CHECK(x.orig_attr.max_cqe == a.max_cqe);
  CHECK(x.orig_attr.device_cap_flags == a.device_cap_flags);
  CHECK(x.device_cap_flags_ex == a.device_cap_flags);
  CHECK(x.odp_caps.general_caps == 0);
  CHECK(x.completion_timestamp_mask == 0);
  ibv_query_device_ex_input in{1};
  CHECK(ibv_query_device_ex(e.ctx, &in, &x) == EINVAL);
  // The GID table: gid_tbl_len slots, the unpopulated ones empty (ENODATA
  // from ibv_query_gid_ex, a zero GID from ibv_query_gid), none past its end.
  ibv_port_attr p{};
  REQUIRE(ibv_query_port(e.ctx, 1, &p) == 0);
  CHECK(p.gid_tbl_len == 16);
  ibv_gid_entry tbl[16]{};
  ssize_t n = ibv_query_gid_table(e.ctx, tbl, 16, 0);
  REQUIRE(n == 2);  // the loopback double's two GIDs
  REQUIRE(n < p.gid_tbl_len);
  ibv_gid_entry ge{};
  CHECK(ibv_query_gid_ex(e.ctx, 1, 1, &ge, 0) == 0);
  CHECK(ge.gid_index == 1);
  CHECK(ibv_query_gid_ex(e.ctx, 1, static_cast<uint32_t>(n), &ge, 0) == ENODATA);
  CHECK(ibv_query_gid_ex(e.ctx, 1, static_cast<uint32_t>(p.gid_tbl_len - 1), &ge, 0) == ENODATA);
  ibv_gid g{};
  std::memset(&g, 0xab, sizeof(g));
  CHECK(ibv_query_gid(e.ctx, 1, p.gid_tbl_len - 1, &g) == 0);
  CHECK(g.global.subnet_prefix == 0);
  CHECK(g.global.interface_id == 0);
  CHECK(ibv_query_gid(e.ctx, 1, p.gid_tbl_len, &g) == -1);
  // No fork protection is needed: the daemon, not the kernel, owns the pinned pages.
  CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
  // IBV_ACCESS_RELAXED_ORDERING is accepted (an ordering hint).
  std::vector<char> buf(4096);
  ibv_mr* mr = ibv_reg_mr(e.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  REQUIRE(mr != nullptr);
  CHECK(ibv_dereg_mr(mr) == 0);
  // cmd_fd is a real descriptor (the context's connection to the daemon), so a
  // program may dup it to share the context (rdma-core's shared-PD test does);
  // importing it is not supported (EOPNOTSUPP, as on rxe), and the context
  // goes on working after the dup is closed.
  REQUIRE(e.ctx->cmd_fd >= 0);
  const int dup_fd = dup(e.ctx->cmd_fd);
  REQUIRE(dup_fd >= 0);
  errno = 0;
  CHECK(ibv_import_device(dup_fd) == nullptr);
  CHECK(errno == EOPNOTSUPP);
  CHECK(close(dup_fd) == 0);
  ibv_pd* pd2 = ibv_alloc_pd(e.ctx);
  REQUIRE(pd2 != nullptr);
  CHECK(ibv_dealloc_pd(pd2) == 0);
}

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
  // The ring holds 4; 2 are in it (the QP is in RESET, nothing consumes).
  CHECK(ibv_post_send(uc, &w[2], &bad) == ENOMEM);
  CHECK(bad == &w[4]);
  // UD needs an address handle.
  w[5].next = nullptr;
  CHECK(ibv_post_send(ud, &w[5], &bad) == EINVAL);
  CHECK(ibv_destroy_qp(uc) == 0);
  CHECK(ibv_destroy_qp(ud) == 0);
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
  // RDMA READ / atomic depths past max_qp_rd_atom / max_qp_init_rd_atom are refused.
  cq = ibv_create_cq(e.ctx, 16, nullptr, nullptr, 0);
  REQUIRE(cq != nullptr);
  ibv_qp* qp = e.qp(cq, IBV_QPT_RC);
  REQUIRE(qp != nullptr);
  ibv_qp_attr qa{};
  qa.max_dest_rd_atomic = static_cast<uint8_t>(a.max_qp_rd_atom + 1);
  CHECK(ibv_modify_qp(qp, &qa, IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL);
  qa.max_rd_atomic = static_cast<uint8_t>(a.max_qp_init_rd_atom + 1);
  CHECK(ibv_modify_qp(qp, &qa, IBV_QP_MAX_QP_RD_ATOMIC) == EINVAL);
  CHECK(ibv_destroy_qp(qp) == 0);
  CHECK(ibv_destroy_cq(cq) == 0);
  // IBV_ACCESS_RELAXED_ORDERING is accepted (an ordering hint).
  std::vector<char> buf(4096);
  ibv_mr* mr = ibv_reg_mr(e.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
  REQUIRE(mr != nullptr);
  CHECK(ibv_dereg_mr(mr) == 0);
}

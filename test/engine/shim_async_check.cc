// Asynchronous events through the verbs front on a real droced node
// (shim_pair.sh runs it against node B, DROCE_SOCKET):
//   1. an RC QP whose peer QPN does not exist, ACK timeout 8 us, retry_cnt 0:
//      a SEND completes with RETRY_EXC_ERR, the QP goes to ERR by itself and
//      async_fd becomes readable: ibv_get_async_event = IBV_EVENT_QP_FATAL
//      naming that QP;
//   2. a QP the program moves to ERR itself raises no event (async_fd stays
//      quiet, nonblocking ibv_get_async_event fails with EAGAIN);
//   3. a QP on an SRQ that enters ERR: IBV_EVENT_QP_LAST_WQE_REACHED naming it;
//   4. a CQ overrun (receives flushed into a CQ too small for them):
//      IBV_EVENT_CQ_ERR naming that CQ; prints "events: N" (all it got so far);
//   5. prints "waiting for DEVICE_FATAL", then the script stops the daemon:
//      async_fd becomes readable and the event is IBV_EVENT_DEVICE_FATAL.
//   shim_async_check PEER_IPV4 SGID_INDEX
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

ibv_qp* make_qp(ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.sq_sig_all = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (qp == nullptr) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) return nullptr;
  return qp;
}

// RTR towards QPN dest_qpn at the peer's IPv4-mapped GID, path MTU 1024.
ibv_qp_attr rtr_attr(const in_addr& peer, uint8_t sgid_index, uint32_t dest_qpn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = sgid_index;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = 0xff;
  a.ah_attr.grh.dgid.raw[11] = 0xff;
  std::memcpy(a.ah_attr.grh.dgid.raw + 12, &peer, 4);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PEER_IPV4 SGID_INDEX\n", argv[0]);
    return 2;
  }
  in_addr peer{};
  if (inet_pton(AF_INET, argv[1], &peer) != 1) return 2;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) {
    std::printf("FAIL no device\n");
    return 1;
  }
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  ibv_qp* qp = cq ? make_qp(pd, cq) : nullptr;
  if (qp == nullptr) {
    std::printf("FAIL setup: %s\n", std::strerror(errno));
    return 1;
  }
  check(!readable(ctx->async_fd, 0), "async_fd quiet after open");

  // 1. QP_FATAL: nobody answers, one ACK timeout of 8 us, no retry.
  const auto sgid = static_cast<uint8_t>(std::atoi(argv[2]));
  ibv_qp_attr a = rtr_attr(peer, sgid, 0xFFFF00);  // no such QP on the peer: it drops the request
  int rc = ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 1;
  a.retry_cnt = 0;
  a.rnr_retry = 0;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  if (rc == 0)
    rc = ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
  check(rc == 0, "RC QP to RTS towards a QPN the peer does not have");
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 7;
  wr.opcode = IBV_WR_SEND;  // zero-length: no memory region needed
  check(ibv_post_send(qp, &wr, &bad) == 0, "post a SEND");
  ibv_wc wc{};
  int got = 0;
  for (int i = 0; i < 10000 && got == 0; ++i) {
    got = ibv_poll_cq(cq, 1, &wc);
    if (got == 0) poll(nullptr, 0, 1);
  }
  check(got == 1 && wc.wr_id == 7 && wc.status == IBV_WC_RETRY_EXC_ERR, "the SEND completes with RETRY_EXC_ERR");
  check(readable(ctx->async_fd, 5000), "async_fd readable");
  ibv_async_event ev{};
  rc = ibv_get_async_event(ctx, &ev);
  check(rc == 0 && ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qp,
        "ibv_get_async_event: IBV_EVENT_QP_FATAL for that QP");
  if (rc == 0) ibv_ack_async_event(&ev);

  // 2. Moved to ERR by the program: no event.
  ibv_qp* qp2 = make_qp(pd, cq);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_ERR;
  check(qp2 != nullptr && ibv_modify_qp(qp2, &a, IBV_QP_STATE) == 0, "second QP moved to ERR by the program");
  const int fl = fcntl(ctx->async_fd, F_GETFL);
  fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  check(!readable(ctx->async_fd, 500), "no event for it (async_fd quiet for 500 ms)");
  errno = 0;
  check(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "nonblocking ibv_get_async_event: EAGAIN");

  int events = 1;  // QP_FATAL above; the daemon's async_events counter must agree (shim_pair.sh)

  // A path MTU above what the port carries (the node's port MTU is 1500: max_mtu 1024) is refused.
  {
    ibv_port_attr pa{};
    ibv_qp* qm = make_qp(pd, cq);
    ibv_qp_attr m = rtr_attr(peer, sgid, 0x12);
    m.path_mtu = IBV_MTU_4096;
    const uint32_t mm = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    check(ibv_query_port(ctx, 1, &pa) == 0 && pa.max_mtu == IBV_MTU_1024, "port max_mtu 1024 (Ethernet MTU 1500)");
    check(qm != nullptr && ibv_modify_qp(qm, &m, mm) == EINVAL, "modify_qp to RTR with path MTU 4096: EINVAL");
    m.path_mtu = IBV_MTU_1024;
    check(qm != nullptr && ibv_modify_qp(qm, &m, mm) == 0, "the same with path MTU 1024: accepted");
  }

  // 3. LAST_WQE_REACHED: a QP on an SRQ that enters ERR (here by the program).
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ibv_qp* qp3 = nullptr;
  if (srq != nullptr) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.srq = srq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_send_sge = 1;
    qp3 = ibv_create_qp(pd, &ia);
  }
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_ERR;
  check(qp3 != nullptr && ibv_modify_qp(qp3, &a, IBV_QP_STATE) == 0, "a QP on an SRQ moved to ERR");
  check(readable(ctx->async_fd, 5000), "async_fd readable");
  rc = ibv_get_async_event(ctx, &ev);
  check(rc == 0 && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp3,
        "ibv_get_async_event: IBV_EVENT_QP_LAST_WQE_REACHED for that QP");
  if (rc == 0) {
    ibv_ack_async_event(&ev);
    ++events;
  }

  // 4. CQ_ERR: more completions than the CQ holds (receives flushed into a small CQ).
  ibv_cq* small = ibv_create_cq(ctx, 1, nullptr, nullptr, 0);
  ibv_qp* qp4 = nullptr;
  const int nrecv = small ? small->cqe + 8 : 0;
  if (small != nullptr) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = small;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = static_cast<uint32_t>(nrecv);
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    qp4 = ibv_create_qp(pd, &ia);
    ibv_qp_attr ini{};
    ini.qp_state = IBV_QPS_INIT;
    ini.port_num = 1;
    if (qp4 != nullptr &&
        ibv_modify_qp(qp4, &ini, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      ibv_destroy_qp(qp4);
      qp4 = nullptr;
    }
  }
  int posted = 0;
  for (int i = 0; qp4 != nullptr && i < nrecv; ++i) {
    ibv_recv_wr rw{}, *rbad = nullptr;
    rw.wr_id = 100 + static_cast<uint64_t>(i);
    posted += ibv_post_recv(qp4, &rw, &rbad) == 0;
  }
  check(posted == nrecv && nrecv > 1, "a CQ of " + std::to_string(small ? small->cqe : 0) + " entries, " +
                                          std::to_string(nrecv) + " receives posted on a QP using it");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_ERR;
  check(qp4 != nullptr && ibv_modify_qp(qp4, &a, IBV_QP_STATE) == 0, "that QP moved to ERR: its receives flush");
  bool cq_err = false;
  for (int i = 0; i < 4 && !cq_err && readable(ctx->async_fd, 5000); ++i) {
    if (ibv_get_async_event(ctx, &ev) != 0) break;
    ++events;
    cq_err = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small;
    ibv_ack_async_event(&ev);
  }
  check(cq_err, "ibv_get_async_event: IBV_EVENT_CQ_ERR for the overrun CQ");
  std::printf("events: %d\n", events);

  // 5. The daemon goes away.
  std::printf("waiting for DEVICE_FATAL\n");
  std::fflush(stdout);
  const bool r = readable(ctx->async_fd, 30000);
  check(r, "async_fd readable when the daemon stopped");
  rc = r ? ibv_get_async_event(ctx, &ev) : -1;
  check(rc == 0 && ev.event_type == IBV_EVENT_DEVICE_FATAL, "ibv_get_async_event: IBV_EVENT_DEVICE_FATAL");
  if (rc == 0) ibv_ack_async_event(&ev);
  check(!readable(ctx->async_fd, 200), "reported once: async_fd quiet afterwards");
  std::printf("%d failed\n", failures);
  return failures == 0 ? 0 : 1;
}

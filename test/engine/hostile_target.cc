// The target of hostile_net.py on a real droced node (hostile_net.sh runs it
// against node A through the verbs front): RC QPs in RTS whose peer is the
// attacker's own address, so that the attacker can aim requests with a wrong
// key, a wrong length or a wild VA, and responses nobody asked for, at a QP
// of ours without touching the data-checked transfer beside it.
//
//   hostile_target PEER_IPV4 SGID_INDEX NQPS
//
// Registers one 4 KiB MR (remote read/write/atomic) filled with a pattern,
// creates NQPS RC QPs towards PEER_IPV4 (remote QPN 0x100 + i, rq_psn 0x1000,
// sq_psn 0x2000, MTU 1024) with receives posted, prints
//   mr rkey=0x... va=0x... len=4096
//   qp I qpn=0x...
//   ready
// and waits for a line on stdin. Then it checks that the MR still holds its
// pattern (no hostile byte landed in it) and prints each QP's state
// ("qp I state=RTS|ERR|..."); exit 0 if the pattern is intact.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kLen = 4096;
constexpr uint8_t kPattern = 0x5A;

const char* state_name(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "?";
  }
}

bool connect(ibv_qp* qp, in_addr peer, int sgid, uint32_t dest_qpn) {
  constexpr int kAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = kAccess;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) return false;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0x1000;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(sgid);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = 0xff;
  a.ah_attr.grh.dgid.raw[11] = 0xff;
  std::memcpy(a.ah_attr.grh.dgid.raw + 12, &peer, 4);
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
    return false;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0x2000;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s PEER_IPV4 SGID_INDEX NQPS\n", argv[0]);
    return 2;
  }
  in_addr peer{};
  if (inet_pton(AF_INET, argv[1], &peer) != 1) return 2;
  const int sgid = std::atoi(argv[2]);
  const int nqps = std::atoi(argv[3]);
  if (nqps < 1 || nqps > 64) return 2;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) {
    std::printf("FAIL no device\n");
    return 1;
  }
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 256, nullptr, nullptr, 0) : nullptr;
  static uint8_t buf[kLen] __attribute__((aligned(4096)));
  std::memset(buf, kPattern, kLen);
  ibv_mr* mr = cq ? ibv_reg_mr(pd, buf, kLen,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                   IBV_ACCESS_REMOTE_ATOMIC)
                  : nullptr;
  // Receives land in a buffer of their own: the MR's pattern must stay intact.
  static uint8_t rbuf[kLen];
  ibv_mr* rmr = mr ? ibv_reg_mr(pd, rbuf, kLen, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (rmr == nullptr) {
    std::printf("FAIL setup: %s\n", std::strerror(errno));
    return 1;
  }
  std::vector<ibv_qp*> qps;
  for (int i = 0; i < nqps; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (qp == nullptr || !connect(qp, peer, sgid, 0x100 + i)) {
      std::printf("FAIL QP %d: %s\n", i, std::strerror(errno));
      return 1;
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(rbuf), static_cast<uint32_t>(kLen), rmr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(qp, &wr, &bad) != 0) {
      std::printf("FAIL post_recv %d\n", i);
      return 1;
    }
    qps.push_back(qp);
  }
  std::printf("mr rkey=0x%x va=0x%llx len=%zu\n", mr->rkey, static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buf)),
              kLen);
  for (int i = 0; i < nqps; ++i) std::printf("qp %d qpn=0x%x\n", i, qps[i]->qp_num);
  std::printf("ready\n");
  std::fflush(stdout);

  char line[64];
  if (std::fgets(line, sizeof line, stdin) == nullptr) {
    // stdin closed without a word: still report.
  }
  int rc = 0;
  size_t bad_bytes = 0;
  for (size_t i = 0; i < kLen; ++i) bad_bytes += buf[i] != kPattern;
  if (bad_bytes) {
    std::printf("FAIL %zu bytes of the MR changed\n", bad_bytes);
    rc = 1;
  } else {
    std::printf("mr pattern intact\n");
  }
  for (int i = 0; i < nqps; ++i) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(qps[i], &a, IBV_QP_STATE, &ia) != 0) {
      std::printf("qp %d state=?\n", i);
      continue;
    }
    std::printf("qp %d state=%s\n", i, state_name(a.qp_state));
  }
  for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
  ibv_dereg_mr(rmr);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  std::fflush(stdout);
  return rc;
}

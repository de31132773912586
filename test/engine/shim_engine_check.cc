// The shim's bad cases over the real engine, between two droced nodes:
//   shim_engine_check SOCKET_A SOCKET_B
// 1. a second client of node A naming the first client's handles gets EBADF;
// 2. an RC QP on node A writes to node B through the wire: a WRITE with the
//    right rkey lands (data verified), a WRITE with a bad rkey completes with
//    IBV_WC_REM_ACCESS_ERR and writes nothing (the target keeps its bytes),
//    and the QP is in ERR afterwards.
// Prints "ok: ..." / "FAIL: ..." per check; exits 0 when all pass.
#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "shim/client/client.h"

using namespace droce::shim;
using namespace droce::shim::proto;

namespace {
int fails = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++fails;
}

struct Node {
  ShimConnection conn;
  ibv_gid gid{};
  uint32_t gid_index = 0;
  bool open(const char* path) {
    if (conn.connect(path) != 0) return false;
    OpenDeviceResp r{};
    if (conn.call<Op::OpenDevice>({0, DROCE_SHM_ABI_VERSION}, r) != 0) return false;
    GidTableResp g{};
    if (conn.call<Op::QueryGidTable>({1}, g) != 0) return false;
    for (uint32_t i = 0; i < g.count; ++i) {
      const uint8_t* b = g.entry[i].gid.raw;
      static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      if (std::memcmp(b, v4, 12) == 0) {  // the IPv4-mapped GID: reachable by ARP
        gid = g.entry[i].gid;
        gid_index = i;
        return true;
      }
    }
    return false;
  }
  uint32_t pd() {
    HandleResp r{};
    return conn.call<Op::AllocPd>({}, r) == 0 ? r.handle : 0;
  }
  uint32_t cq(ClientCq& cq) {
    CreateCqResp r{};
    int fd = -1, nfd = 0;
    if (conn.call<Op::CreateCq>({64, 0, 0, 0}, r, nullptr, 0, &fd, 1, &nfd) != 0 || nfd != 1) return 0;
    return cq.attach(fd, r) == 0 ? r.handle : 0;
  }
  uint32_t qp(ClientQp& qp, uint32_t pd, uint32_t cq, uint32_t* qpn) {
    CreateQpReq q{pd, cq, cq, 0, IBV_QPT_RC, 0, {64, 64, 1, 1, 0}};
    CreateQpResp r{};
    int fd = -1, nfd = 0;
    if (conn.call<Op::CreateQp>(q, r, nullptr, 0, &fd, 1, &nfd) != 0 || nfd != 1) return 0;
    if (qp.attach(fd, r, false) != 0) return 0;
    *qpn = r.qpn;
    return r.handle;
  }
  int mr(uint32_t pd, void* addr, size_t len, uint32_t access, RegMrResp& r) {
    MrMemory m;
    if (int rc = prepare_mr_memory(addr, len, m)) return rc;
    RegMrReq q{pd, access, reinterpret_cast<uint64_t>(addr), len, reinterpret_cast<uint64_t>(addr),
               m.map_addr, m.map_len, m.fd_offset};
    int e = conn.call<Op::RegMr>(q, r, &m.fd, 1);
    ::close(m.fd);
    return e;
  }
  int connect(uint32_t qp, uint32_t dest_qpn, const ibv_gid& dgid) {
    Empty e;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int rc = conn.call<Op::ModifyQp>(
            {qp, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, a}, e))
      return rc;
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = dgid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
    a.ah_attr.grh.hop_limit = 64;
    if (int rc = conn.call<Op::ModifyQp>({qp,
                                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                                          a},
                                         e))
      return rc;
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    return conn.call<Op::ModifyQp>({qp,
                                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                                    a},
                                   e);
  }
};

bool wait_cqe(ClientCq& cq, droce_shm_cqe& out, int ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (cq.poll(1, &out) == 1) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: shim_engine_check SOCKET_A SOCKET_B\n");
    return 2;
  }
  Node a, a2, b;
  if (!a.open(argv[1]) || !a2.open(argv[1]) || !b.open(argv[2])) {
    std::fprintf(stderr, "cannot open the devices of %s / %s\n", argv[1], argv[2]);
    return 1;
  }
  // 1. Handle isolation on the real engine.
  const uint32_t pda = a.pd();
  ClientCq cqa;
  const uint32_t ca = a.cq(cqa);
  check(pda != 0 && ca != 0, "client 1 on node A: PD and CQ");
  {
    Empty e;
    check(a2.conn.call<Op::DeallocPd>({pda}, e) == -EBADF, "client 2 naming client 1's PD handle: EBADF");
    check(a2.conn.call<Op::DestroyCq>({ca}, e) == -EBADF, "client 2 naming client 1's CQ handle: EBADF");
    const uint32_t pd2 = a2.pd();
    CreateQpResp qr{};
    check(a2.conn.call<Op::CreateQp>({pd2, ca, ca, 0, IBV_QPT_RC, 0, {8, 8, 1, 1, 0}}, qr) == -EBADF,
          "client 2 creating a QP on client 1's CQ: EBADF");
  }
  // 2. WRITE over the wire, good and bad rkey.
  const uint32_t pdb = b.pd();
  ClientCq cqb;
  const uint32_t cb = b.cq(cqb);
  ClientQp qpa, qpb;
  uint32_t qpna = 0, qpnb = 0;
  const uint32_t qa = a.qp(qpa, pda, ca, &qpna), qb = b.qp(qpb, pdb, cb, &qpnb);
  check(qa != 0 && qb != 0, "RC QPs on both nodes");
  check(a.connect(qa, qpnb, b.gid) == 0 && b.connect(qb, qpna, a.gid) == 0, "QPs connected (INIT, RTR, RTS)");
  constexpr size_t kLen = 16384;
  auto* abuf = static_cast<uint8_t*>(aligned_alloc(4096, kLen));
  auto* bbuf = static_cast<uint8_t*>(aligned_alloc(4096, kLen));
  for (size_t i = 0; i < kLen; i++) abuf[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memset(bbuf, 0xEE, kLen);
  RegMrResp ma{}, mb{};
  check(a.mr(pda, abuf, kLen, IBV_ACCESS_LOCAL_WRITE, ma) == 0, "MR on node A");
  check(b.mr(pdb, bbuf, kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, mb) == 0, "MR on node B");
  droce_shm_send_wqe w{};
  w.wr_id = 1;
  w.opcode = DROCE_WR_RDMA_WRITE;
  w.send_flags = DROCE_SEND_SIGNALED;
  w.remote_addr = reinterpret_cast<uint64_t>(bbuf);
  w.rkey = mb.rkey;
  w.num_sge = 1;
  w.u.sge[0] = {reinterpret_cast<uint64_t>(abuf), 4096, ma.lkey};
  droce_shm_cqe e{};
  check(qpa.sq.try_push(w) && wait_cqe(cqa, e) && e.status == IBV_WC_SUCCESS && e.wr_id == 1,
        "WRITE with the right rkey completes");
  check(std::memcmp(abuf, bbuf, 4096) == 0 && bbuf[4096] == 0xEE, "WRITE data verified at node B, nothing beyond");
  w.wr_id = 2;
  w.rkey = mb.rkey ^ 0x5500;  // another key
  w.remote_addr = reinterpret_cast<uint64_t>(bbuf) + 8192;
  w.u.sge[0].addr = reinterpret_cast<uint64_t>(abuf) + 8192;
  const bool got = qpa.sq.try_push(w) && wait_cqe(cqa, e);
  check(got && e.wr_id == 2 && e.status == IBV_WC_REM_ACCESS_ERR,
        "WRITE with a bad rkey: IBV_WC_REM_ACCESS_ERR (status " + std::to_string(e.status) + ")");
  bool untouched = true;
  for (size_t i = 4096; i < kLen; ++i) untouched &= bbuf[i] == 0xEE;
  check(untouched, "bad rkey: nothing written at node B");
  QueryQpResp qr{};
  check(a.conn.call<Op::QueryQp>({qa, IBV_QP_STATE}, qr) == 0 && qr.attr.qp_state == IBV_QPS_ERR,
        "requester QP in ERR after the access error");
  std::printf("%d failed\n", fails);
  std::free(abuf);
  std::free(bbuf);
  return fails == 0 ? 0 : 1;
}

// The shim's bad cases over the real engine, between two droced nodes:
//   shim_engine_check SOCKET_A SOCKET_B
// 1. a second client of node A naming the first client's handles gets EBADF;
// 2. an RC QP on node A writes to node B through the wire: a WRITE with the
//    right rkey lands (data verified), a WRITE with a bad rkey completes with
//    IBV_WC_REM_ACCESS_ERR and writes nothing (the target keeps its bytes),
//    and the QP is in ERR afterwards;
// 3. node B deregisters and unmaps an MR while node A streams 1 MiB WRITEs into it
//    (then READs out of it): node B's daemon survives, never touching the memory
//    again, and the stream ends in REM_ACCESS_ERR.
// Prints "ok: ..." / "FAIL: ..." per check; exits 0 when all pass.
#include <arpa/inet.h>
#include <sys/mman.h>
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
  // 3. An MR deregistered and unmapped by its owner while a peer streams into
  //    (WRITE) or out of (READ) it: node B's daemon never touches the memory again
  //    (before the fix it died with SIGSEGV in memmove, taking every tenant down);
  //    the peer's WRs end in REM_ACCESS_ERR (or are flushed after it), and node B
  //    keeps serving its clients.
  for (const uint8_t op : {uint8_t{DROCE_WR_RDMA_WRITE}, uint8_t{DROCE_WR_RDMA_READ}}) {
    const char* name = op == DROCE_WR_RDMA_WRITE ? "WRITE" : "READ";
    constexpr size_t kBig = 32u << 20, kChunk = 1u << 20;
    ClientCq cq2a, cq2b;
    const uint32_t c2a = a.cq(cq2a), c2b = b.cq(cq2b);
    ClientQp q2a, q2b;
    uint32_t n2a = 0, n2b = 0;
    const uint32_t h2a = a.qp(q2a, pda, c2a, &n2a), h2b = b.qp(q2b, pdb, c2b, &n2b);
    check(c2a && c2b && h2a && h2b && a.connect(h2a, n2b, b.gid) == 0 && b.connect(h2b, n2a, a.gid) == 0,
          std::string(name) + ": a second QP pair");
    void* amem = mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* bmem = mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    RegMrResp ra{}, rb{};
    check(amem != MAP_FAILED && bmem != MAP_FAILED &&
              a.mr(pda, amem, kBig, IBV_ACCESS_LOCAL_WRITE, ra) == 0 &&
              b.mr(pdb, bmem, kBig, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, rb) == 0,
          std::string(name) + ": 32 MiB MRs on both nodes");
    // 32 WRs of 1 MiB: seconds of traffic on af_packet.
    int posted = 0;
    for (size_t off = 0; off < kBig; off += kChunk) {
      droce_shm_send_wqe s{};
      s.wr_id = 100 + off / kChunk;
      s.opcode = op;
      s.send_flags = DROCE_SEND_SIGNALED;
      s.remote_addr = reinterpret_cast<uint64_t>(bmem) + off;
      s.rkey = rb.rkey;
      s.num_sge = 1;
      s.u.sge[0] = {reinterpret_cast<uint64_t>(amem) + off, static_cast<uint32_t>(kChunk), ra.lkey};
      posted += q2a.sq.try_push(s) ? 1 : 0;
    }
    // Once the first WR completed (the stream is running), node B's owner
    // deregisters the MR and unmaps the memory, keeping its QP.
    droce_shm_cqe c{};
    const bool first = wait_cqe(cq2a, c, 20000);
    check(first && c.status == IBV_WC_SUCCESS, std::string(name) + ": the stream runs (first 1 MiB done)");
    Empty e2;
    check(b.conn.call<Op::DeregMr>({rb.handle}, e2) == 0, std::string(name) + ": node B deregisters the MR mid-stream");
    munmap(bmem, kBig);
    int ok = 1, errs = 0, others = 0;
    for (int i = 1; i < posted; ++i) {
      if (!wait_cqe(cq2a, c, 30000)) break;
      ++ok;
      if (c.status == IBV_WC_REM_ACCESS_ERR) ++errs;
      else if (c.status != IBV_WC_SUCCESS && c.status != IBV_WC_WR_FLUSH_ERR) ++others;
    }
    check(ok == posted, std::string(name) + ": every WR completed (" + std::to_string(ok) + "/" + std::to_string(posted) + ")");
    check(errs == 1 && others == 0,
          std::string(name) + ": the stream ends in one REM_ACCESS_ERR, the rest flushed (" + std::to_string(errs) +
              " access errors, " + std::to_string(others) + " other errors)");
    // Node B is alive and serves its client: a query and a new PD work.
    QueryQpResp qb2{};
    check(b.conn.call<Op::QueryQp>({h2b, IBV_QP_STATE}, qb2) == 0 && b.pd() != 0,
          std::string(name) + ": node B's daemon still serves its clients");
    munmap(amem, kBig);
  }
  std::printf("%d failed\n", fails);
  std::free(abuf);
  std::free(bbuf);
  return fails == 0 ? 0 : 1;
}

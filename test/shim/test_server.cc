// ShimServer + ShimConnection + rings end to end against the loopback test
// double: control calls, handle isolation between clients, bad requests,
// cleanup after kill -9, the data path through shared memory, the memory
// scheme (remap at the same address) and completion-channel wakeups.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "loopback_backend.h"
#include "shim/client/client.h"
#include "shim/server.h"

using namespace droce::shim;
using namespace droce::shim::proto;
using droce::shim::test::LoopbackBackend;

namespace {

std::string temp_socket() {
  static int n = 0;
  char tmpl[] = "/tmp/droce-shim-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  REQUIRE(d != nullptr);
  return std::string(d) + "/s" + std::to_string(n++) + ".sock";
}

struct Fixture {
  Fixture() : server(backend, ShimServerConfig{temp_socket()}) {
    REQUIRE(server.start() == 0);
  }
  ~Fixture() {
    server.stop();
    backend.stop_engine();
    std::filesystem::remove_all(std::filesystem::path(server.socket_path()).parent_path());
  }
  LoopbackBackend backend;
  ShimServer server;
};

// A client with an open device.
struct Cl {
  explicit Cl(Fixture& f) {
    REQUIRE(conn.connect(f.server.socket_path()) == 0);
    OpenDeviceResp r{};
    REQUIRE(conn.call<Op::OpenDevice>({0, DROCE_SHM_ABI_VERSION}, r) == 0);
    CHECK(std::string(r.info.name) == "droce0");
  }
  uint32_t pd() {
    HandleResp r{};
    REQUIRE(conn.call<Op::AllocPd>({}, r) == 0);
    return r.handle;
  }
  uint32_t cq(ClientCq& cq, uint32_t n = 64, uint32_t channel = 0) {
    CreateCqResp r{};
    int fd = -1, nfd = 0;
    REQUIRE(conn.call<Op::CreateCq>({n, channel, 0, 0}, r, nullptr, 0, &fd, 1, &nfd) == 0);
    REQUIRE(nfd == 1);
    REQUIRE(cq.attach(fd, r) == 0);
    return r.handle;
  }
  uint32_t qp(ClientQp& qp, uint32_t pd, uint32_t cq, ibv_qp_type t = IBV_QPT_RC, uint32_t* qpn = nullptr) {
    CreateQpReq q{pd, cq, cq, 0, static_cast<uint32_t>(t), 0, {64, 64, 2, 2, 0}};
    CreateQpResp r{};
    int fd = -1, nfd = 0;
    REQUIRE(conn.call<Op::CreateQp>(q, r, nullptr, 0, &fd, 1, &nfd) == 0);
    REQUIRE(qp.attach(fd, r, false) == 0);
    if (qpn) *qpn = r.qpn;
    return r.handle;
  }
  RegMrResp mr(uint32_t pd, void* addr, size_t len, uint32_t access, int* rc = nullptr) {
    MrMemory m;
    REQUIRE(prepare_mr_memory(addr, len, m) == 0);
    RegMrReq q{pd, access, reinterpret_cast<uint64_t>(addr), len, reinterpret_cast<uint64_t>(addr),
               m.map_addr, m.map_len, m.fd_offset};
    RegMrResp r{};
    int e = conn.call<Op::RegMr>(q, r, &m.fd, 1);
    close(m.fd);
    mem_entries.push_back(m.entry);  // released with the client, as ibv_dereg_mr would
    if (rc) *rc = e; else REQUIRE(e == 0);
    return r;
  }
  ~Cl() {
    for (uint32_t e : mem_entries) release_mr_memory(e);
  }
  std::vector<uint32_t> mem_entries;
  void to_rts(uint32_t qp, uint32_t dest) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    REQUIRE(conn.call<Op::ModifyQp>({qp, IBV_QP_STATE, a}, *std::make_unique<Empty>()) == 0);
    a.qp_state = IBV_QPS_RTR;
    a.dest_qp_num = dest;
    Empty e;
    REQUIRE(conn.call<Op::ModifyQp>({qp, IBV_QP_STATE | IBV_QP_DEST_QPN, a}, e) == 0);
    a.qp_state = IBV_QPS_RTS;
    REQUIRE(conn.call<Op::ModifyQp>({qp, IBV_QP_STATE, a}, e) == 0);
  }
  ShimConnection conn;
};

bool wait_cqe(ClientCq& cq, droce_shm_cqe& out, int ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (cq.poll(1, &out) == 1) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return false;
}

template <typename F>
bool eventually(F f, int ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return f();
}

}  // namespace

TEST_CASE("server: list, open and query the device", "[shim][server]") {
  Fixture f;
  ShimConnection c;
  REQUIRE(c.connect(f.server.socket_path()) == 0);
  ListDevicesResp l{};
  REQUIRE(c.call<Op::ListDevices>({}, l) == 0);
  REQUIRE(l.count == 1);
  CHECK(std::string(l.dev[0].name) == "droce0");
  ibv_device_attr da{};
  CHECK(c.call<Op::QueryDevice>({}, da) == -ENODEV);  // not opened yet
  OpenDeviceResp o{};
  CHECK(c.call<Op::OpenDevice>({3, DROCE_SHM_ABI_VERSION}, o) == -ENODEV);
  CHECK(c.call<Op::OpenDevice>({0, 999}, o) == -EPROTO);
  REQUIRE(c.call<Op::OpenDevice>({0, DROCE_SHM_ABI_VERSION}, o) == 0);
  REQUIRE(c.call<Op::QueryDevice>({}, da) == 0);
  CHECK(da.vendor_id == 0xffffff);
  ibv_port_attr pa{};
  REQUIRE(c.call<Op::QueryPort>({1}, pa) == 0);
  CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET);
  CHECK(c.call<Op::QueryPort>({2}, pa) == -EINVAL);
  GidTableResp g{};
  REQUIRE(c.call<Op::QueryGidTable>({1}, g) == 0);
  REQUIRE(g.count == 2);
  CHECK(g.entry[0].gid.raw[0] == 0xfe);
  CHECK(g.entry[1].gid_type == IBV_GID_TYPE_ROCE_V2);
}

TEST_CASE("server: a socket a live server answers on is never taken over", "[shim][server]") {
  Fixture f;
  test::LoopbackBackend other;
  ShimServer second(other, ShimServerConfig{f.server.socket_path()});
  CHECK(second.listen() == -EADDRINUSE);
  ShimConnection c;
  CHECK(c.connect(f.server.socket_path()) == 0);  // the first still serves
}

TEST_CASE("server: a client names only its own handles", "[shim][server][isolation]") {
  Fixture f;
  Cl a(f), b(f);
  uint32_t pa = a.pd();
  ClientCq cqa;
  uint32_t ca = a.cq(cqa);
  Empty e;
  // b's table is empty: a's handle numbers mean nothing there.
  CHECK(b.conn.call<Op::DeallocPd>({pa}, e) == -EBADF);
  CHECK(b.conn.call<Op::DestroyCq>({ca}, e) == -EBADF);
  uint32_t pb = b.pd();
  CreateQpResp qr{};
  CHECK(b.conn.call<Op::CreateQp>({pb, ca, ca, 0, IBV_QPT_RC, 0, {8, 8, 1, 1, 0}}, qr) == -EBADF);
  // Wrong kind of object under a valid handle.
  CHECK(a.conn.call<Op::DestroyCq>({pa}, e) == -EBADF);
  CHECK(a.conn.call<Op::DeallocPd>({12345}, e) == -EBADF);
  // Dependencies: a PD with a QP on it is busy.
  ClientQp qpa;
  uint32_t qa = a.qp(qpa, pa, ca);
  CHECK(a.conn.call<Op::DeallocPd>({pa}, e) == -EBUSY);
  CHECK(a.conn.call<Op::DestroyCq>({ca}, e) == -EBUSY);
  CHECK(a.conn.call<Op::DestroyQp>({qa}, e) == 0);
  CHECK(a.conn.call<Op::DestroyQp>({qa}, e) == -EBADF);  // gone, never reused
  CHECK(a.conn.call<Op::DestroyCq>({ca}, e) == 0);
  CHECK(a.conn.call<Op::DeallocPd>({pa}, e) == 0);
  // Bad attributes.
  CHECK(a.conn.call<Op::CreateCq>({0, 0, 0, 0}, *std::make_unique<CreateCqResp>()) == -EINVAL);
  CHECK(a.conn.call<Op::CreateCq>({1u << 30, 0, 0, 0}, *std::make_unique<CreateCqResp>()) == -EINVAL);
  CHECK(f.server.stats().errors >= 8);
}

TEST_CASE("server: malformed messages get errors or a cut connection, never a crash", "[shim][server]") {
  Fixture f;
  Cl good(f);
  int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strcpy(sa.sun_path, f.server.socket_path().c_str());
  REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  // A request with the wrong body length gets -EINVAL.
  struct {
    ReqHdr h;
    uint8_t junk[3];
  } bad{{kMagic, kVersion, static_cast<uint16_t>(Op::OpenDevice), 1, 0}, {1, 2, 3}};
  REQUIRE(send(s, &bad, sizeof(bad), 0) == sizeof(bad));
  RespHdr rh{};
  REQUIRE(recv(s, &rh, sizeof(rh), 0) == sizeof(rh));
  CHECK(rh.status == -EINVAL);
  // An unknown op gets -EOPNOTSUPP (after opening).
  ReqHdr open{kMagic, kVersion, static_cast<uint16_t>(Op::OpenDevice), 2, 0};
  struct {
    ReqHdr h;
    OpenDeviceReq b;
  } o{open, {0, DROCE_SHM_ABI_VERSION}};
  REQUIRE(send(s, &o, sizeof(o), 0) == sizeof(o));
  uint8_t buf[kMaxMessage];
  REQUIRE(recv(s, buf, sizeof(buf), 0) > 0);
  ReqHdr unk{kMagic, kVersion, 999, 3, 0};
  REQUIRE(send(s, &unk, sizeof(unk), 0) == sizeof(unk));
  REQUIRE(recv(s, &rh, sizeof(rh), 0) == sizeof(rh));
  CHECK(rh.status == -EOPNOTSUPP);
  // RegMr without its fd: -EBADF.
  struct {
    ReqHdr h;
    RegMrReq b;
  } mr{{kMagic, kVersion, static_cast<uint16_t>(Op::RegMr), 4, 0}, {}};
  REQUIRE(send(s, &mr, sizeof(mr), 0) == sizeof(mr));
  REQUIRE(recv(s, &rh, sizeof(rh), 0) == sizeof(rh));
  CHECK(rh.status == -EBADF);
  // Garbage magic: the server cuts the connection.
  uint64_t garbage[4] = {1, 2, 3, 4};
  REQUIRE(send(s, garbage, sizeof(garbage), 0) == sizeof(garbage));
  CHECK(recv(s, buf, sizeof(buf), 0) == 0);
  close(s);
  // The other client is still served.
  CHECK(good.pd() != 0);
  CHECK(eventually([&] { return f.server.stats().clients == 1; }));
}

TEST_CASE("server: MR memory must be a shrink-sealed memfd within bounds", "[shim][server][mr]") {
  Fixture f;
  Cl a(f);
  uint32_t pd = a.pd();
  // An unsealed memfd could be truncated under the daemon's mapping.
  int fd = memfd_create("unsealed", MFD_CLOEXEC);
  REQUIRE(ftruncate(fd, 4096) == 0);
  RegMrReq q{pd, IBV_ACCESS_LOCAL_WRITE, 0x10000, 100, 0x10000, 0x10000, 4096, 0};
  RegMrResp r{};
  CHECK(a.conn.call<Op::RegMr>(q, r, &fd, 1) == -EPERM);
  close(fd);
  void* buf = alloc_shared(8192);
  REQUIRE(buf != nullptr);
  int rc = 0;
  a.mr(pd, buf, 8192, IBV_ACCESS_REMOTE_WRITE, &rc);  // remote write without local write
  CHECK(rc == -EINVAL);
  MrMemory m;
  REQUIRE(prepare_mr_memory(buf, 8192, m) == 0);
  RegMrReq big{pd, 0, reinterpret_cast<uint64_t>(buf), 8192 + 1, 0, m.map_addr, m.map_len, m.fd_offset};
  CHECK(a.conn.call<Op::RegMr>(big, r, &m.fd, 1) == -EINVAL);  // beyond the mapping
  RegMrReq past{pd, 0, reinterpret_cast<uint64_t>(buf), 8192, 0, m.map_addr, m.map_len, m.fd_offset + 4096};
  CHECK(a.conn.call<Op::RegMr>(past, r, &m.fd, 1) == -EINVAL);  // beyond the file
  close(m.fd);
  release_mr_memory(m.entry);
  free_shared(buf);
}

TEST_CASE("data path: SEND, WRITE, READ, atomics through the rings; bad rkey writes nothing",
          "[shim][server][data]") {
  Fixture f;
  f.backend.start_engine();
  Cl a(f), b(f);
  uint32_t pda = a.pd(), pdb = b.pd();
  ClientCq cqa, cqb;
  uint32_t ca = a.cq(cqa), cb = b.cq(cqb);
  ClientQp qpa, qpb;
  uint32_t qpna = 0, qpnb = 0;
  uint32_t qa = a.qp(qpa, pda, ca, IBV_QPT_RC, &qpna), qb = b.qp(qpb, pdb, cb, IBV_QPT_RC, &qpnb);
  a.to_rts(qa, qpnb);
  b.to_rts(qb, qpna);
  // Plain malloc'd buffers: registration remaps them at the same address.
  auto* abuf = static_cast<uint8_t*>(aligned_alloc(4096, 16384));
  auto* bbuf = static_cast<uint8_t*>(aligned_alloc(4096, 16384));
  for (int i = 0; i < 16384; i++) abuf[i] = static_cast<uint8_t>(i * 7);
  std::memset(bbuf, 0xEE, 16384);
  const uint32_t all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                       IBV_ACCESS_REMOTE_ATOMIC;
  RegMrResp ma = a.mr(pda, abuf, 16384, all);
  RegMrResp mb = b.mr(pdb, bbuf, 16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  CHECK(abuf[100] == static_cast<uint8_t>(700));  // contents survived the remap
  droce_shm_cqe e{};

  SECTION("SEND into a posted receive, with immediate") {
    droce_shm_recv_wqe r{};
    r.wr_id = 77;
    r.num_sge = 1;
    r.sge[0] = {reinterpret_cast<uint64_t>(bbuf), 4096, mb.lkey};
    REQUIRE(qpb.rq.try_push(r));
    droce_shm_send_wqe w{};
    w.wr_id = 11;
    w.opcode = DROCE_WR_SEND_WITH_IMM;
    w.imm_data = htonl(0xabcd);
    w.send_flags = DROCE_SEND_SIGNALED;
    w.num_sge = 1;
    w.u.sge[0] = {reinterpret_cast<uint64_t>(abuf), 1000, ma.lkey};
    REQUIRE(qpa.sq.try_push(w));
    REQUIRE(wait_cqe(cqa, e));
    CHECK(e.wr_id == 11);
    CHECK(e.status == IBV_WC_SUCCESS);
    REQUIRE(wait_cqe(cqb, e));
    CHECK(e.wr_id == 77);
    CHECK(e.opcode == IBV_WC_RECV);
    CHECK(e.byte_len == 1000);
    CHECK(ntohl(e.imm_data) == 0xabcd);
    CHECK(std::memcmp(abuf, bbuf, 1000) == 0);
    CHECK(bbuf[1000] == 0xEE);
  }
  SECTION("batched RDMA WRITEs with one doorbell, then READ back") {
    uint32_t n = qpa.sq.free_slots(16);
    REQUIRE(n >= 16);
    for (uint32_t i = 0; i < 16; i++) {
      droce_shm_send_wqe* w = qpa.sq.slot(i);
      *w = droce_shm_send_wqe{};
      w->wr_id = 100 + i;
      w->opcode = DROCE_WR_RDMA_WRITE;
      w->send_flags = DROCE_SEND_SIGNALED;
      w->remote_addr = reinterpret_cast<uint64_t>(bbuf) + i * 512;
      w->rkey = mb.rkey;
      w->num_sge = 1;
      w->u.sge[0] = {reinterpret_cast<uint64_t>(abuf) + i * 512, 512, ma.lkey};
    }
    qpa.sq.publish(16);
    for (uint32_t i = 0; i < 16; i++) {
      REQUIRE(wait_cqe(cqa, e));
      CHECK(e.wr_id == 100 + i);
      CHECK(e.status == IBV_WC_SUCCESS);
    }
    CHECK(std::memcmp(abuf, bbuf, 8192) == 0);
    // READ needs REMOTE_READ on b's MR, which b did not grant.
    droce_shm_send_wqe rd{};
    rd.wr_id = 5;
    rd.opcode = DROCE_WR_RDMA_READ;
    rd.remote_addr = reinterpret_cast<uint64_t>(bbuf);
    rd.rkey = mb.rkey;
    rd.num_sge = 1;
    rd.u.sge[0] = {reinterpret_cast<uint64_t>(abuf) + 8192, 64, ma.lkey};
    REQUIRE(qpa.sq.try_push(rd));
    REQUIRE(wait_cqe(cqa, e));
    CHECK(e.status == IBV_WC_REM_ACCESS_ERR);
  }
  SECTION("inline WRITE and fetch-and-add") {
    droce_shm_send_wqe w{};
    w.wr_id = 1;
    w.opcode = DROCE_WR_RDMA_WRITE;
    w.send_flags = DROCE_SEND_SIGNALED | DROCE_SEND_INLINE;
    w.remote_addr = reinterpret_cast<uint64_t>(bbuf) + 64;
    w.rkey = mb.rkey;
    w.inline_len = 5;
    std::memcpy(w.u.inline_data, "hello", 5);
    REQUIRE(qpa.sq.try_push(w));
    REQUIRE(wait_cqe(cqa, e));
    CHECK(std::memcmp(bbuf + 64, "hello", 5) == 0);
    uint64_t init = 40;
    std::memcpy(bbuf + 128, &init, 8);
    droce_shm_send_wqe fa{};
    fa.wr_id = 2;
    fa.opcode = DROCE_WR_ATOMIC_FETCH_AND_ADD;
    fa.send_flags = DROCE_SEND_SIGNALED;
    fa.remote_addr = reinterpret_cast<uint64_t>(bbuf) + 128;
    fa.rkey = mb.rkey;
    fa.compare_add = 2;
    fa.num_sge = 1;
    fa.u.sge[0] = {reinterpret_cast<uint64_t>(abuf) + 256, 8, ma.lkey};
    REQUIRE(qpa.sq.try_push(fa));
    REQUIRE(wait_cqe(cqa, e));
    CHECK(e.opcode == IBV_WC_FETCH_ADD);
    uint64_t old = 0, now = 0;
    std::memcpy(&old, abuf + 256, 8);
    std::memcpy(&now, bbuf + 128, 8);
    CHECK(old == 40);
    CHECK(now == 42);
  }
  SECTION("a bad rkey gets REM_ACCESS_ERR and nothing is written") {
    droce_shm_send_wqe w{};
    w.wr_id = 9;
    w.opcode = DROCE_WR_RDMA_WRITE;
    w.remote_addr = reinterpret_cast<uint64_t>(bbuf);
    w.rkey = mb.rkey ^ 0x1000;
    w.num_sge = 1;
    w.u.sge[0] = {reinterpret_cast<uint64_t>(abuf), 4096, ma.lkey};
    REQUIRE(qpa.sq.try_push(w));
    REQUIRE(wait_cqe(cqa, e));
    CHECK(e.wr_id == 9);
    CHECK(e.status == IBV_WC_REM_ACCESS_ERR);
    // a's own lkey used as an rkey on b: a different PD, refused too.
    w.rkey = ma.rkey;
    REQUIRE(qpa.sq.try_push(w));
    REQUIRE(wait_cqe(cqa, e));
    CHECK(e.status == IBV_WC_REM_ACCESS_ERR);
    for (int i = 0; i < 16384; i++)
      if (bbuf[i] != 0xEE) FAIL("byte " << i << " written");
  }
  Empty em;
  CHECK(a.conn.call<Op::DeregMr>({ma.handle}, em) == 0);
  CHECK(b.conn.call<Op::DeregMr>({mb.handle}, em) == 0);
  free(abuf);
  free(bbuf);
}

TEST_CASE("completion channel: an armed CQ wakes the eventfd, once", "[shim][server][notify]") {
  Fixture f;
  f.backend.start_engine();
  Cl a(f);
  HandleResp ch{};
  int efd = -1, nfd = 0;
  REQUIRE(a.conn.call<Op::CreateChannel>({}, ch, nullptr, 0, &efd, 1, &nfd) == 0);
  REQUIRE(nfd == 1);
  uint32_t pd = a.pd();
  ClientCq cq;
  uint32_t c = a.cq(cq, 16, ch.handle);
  Empty e;
  CHECK(a.conn.call<Op::DestroyChannel>({ch.handle}, e) == -EBUSY);  // the CQ uses it
  ClientQp qp;
  uint32_t qpn = 0;
  uint32_t q = a.qp(qp, pd, c, IBV_QPT_RC, &qpn);
  a.to_rts(q, qpn);  // loopback to itself
  auto* buf = static_cast<uint8_t*>(alloc_shared(4096));
  RegMrResp m = a.mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  droce_shm_send_wqe w{};
  w.opcode = DROCE_WR_RDMA_WRITE;
  w.send_flags = DROCE_SEND_SIGNALED;
  w.remote_addr = reinterpret_cast<uint64_t>(buf) + 2048;
  w.rkey = m.rkey;
  w.num_sge = 1;
  w.u.sge[0] = {reinterpret_cast<uint64_t>(buf), 16, m.lkey};
  pollfd p{efd, POLLIN, 0};
  // Not armed: a completion does not wake.
  REQUIRE(qp.sq.try_push(w));
  droce_shm_cqe out{};
  REQUIRE(wait_cqe(cq, out));
  CHECK(poll(&p, 1, 50) == 0);
  // Armed: the next completion wakes, and bumps the CQ's event count.
  uint32_t ev0 = cq.events();
  cq.arm(false);
  REQUIRE(qp.sq.try_push(w));
  REQUIRE(poll(&p, 1, 5000) == 1);
  uint64_t v = 0;
  REQUIRE(read(efd, &v, 8) == 8);
  CHECK(v == 1);
  CHECK(cq.events() == ev0 + 1);
  REQUIRE(wait_cqe(cq, out));
  // The arm was consumed.
  REQUIRE(qp.sq.try_push(w));
  REQUIRE(wait_cqe(cq, out));
  CHECK(poll(&p, 1, 50) == 0);
  close(efd);
  free_shared(buf);
}

TEST_CASE("a client killed with SIGKILL leaves nothing behind", "[shim][server][cleanup]") {
  Fixture f;
  f.backend.start_engine();
  Cl survivor(f);
  uint32_t spd = survivor.pd();
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child: a client with one of everything and a QP busy writing.
    ShimConnection c;
    if (c.connect(f.server.socket_path()) != 0) _exit(2);
    OpenDeviceResp o{};
    if (c.call<Op::OpenDevice>({0, DROCE_SHM_ABI_VERSION}, o) != 0) _exit(3);
    HandleResp pd{}, ch{};
    c.call<Op::AllocPd>({}, pd);
    int efd = -1, nfd = 0, fd = -1;
    c.call<Op::CreateChannel>({}, ch, nullptr, 0, &efd, 1, &nfd);
    CreateCqResp cr{};
    if (c.call<Op::CreateCq>({64, ch.handle, 0, 0}, cr, nullptr, 0, &fd, 1, &nfd) != 0) _exit(4);
    ClientCq cq;
    cq.attach(fd, cr);
    CreateQpResp qr{};
    if (c.call<Op::CreateQp>({pd.handle, cr.handle, cr.handle, 0, IBV_QPT_RC, 0, {64, 64, 1, 1, 0}}, qr, nullptr, 0,
                             &fd, 1, &nfd) != 0)
      _exit(5);
    ClientQp qp;
    qp.attach(fd, qr, false);
    void* buf = alloc_shared(1 << 20);
    MrMemory m;
    prepare_mr_memory(buf, 1 << 20, m);
    RegMrReq mq{pd.handle, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, reinterpret_cast<uint64_t>(buf), 1 << 20,
                reinterpret_cast<uint64_t>(buf), m.map_addr, m.map_len, m.fd_offset};
    RegMrResp mr{};
    if (c.call<Op::RegMr>(mq, mr, &m.fd, 1) != 0) _exit(6);
    ibv_ah_attr ah{};
    ah.is_global = 1;
    ah.port_num = 1;
    CreateAhResp ahr{};
    c.call<Op::CreateAh>({pd.handle, 0, ah}, ahr);
    CreateSrqResp sr{};
    c.call<Op::CreateSrq>({pd.handle, 0, {64, 1, 0}}, sr, nullptr, 0, &fd, 1, &nfd);
    ibv_qp_attr a{};
    Empty e;
    a.qp_state = IBV_QPS_INIT;
    c.call<Op::ModifyQp>({qr.handle, IBV_QP_STATE, a}, e);
    a.qp_state = IBV_QPS_RTR;
    a.dest_qp_num = qr.qpn;
    c.call<Op::ModifyQp>({qr.handle, IBV_QP_STATE | IBV_QP_DEST_QPN, a}, e);
    a.qp_state = IBV_QPS_RTS;
    c.call<Op::ModifyQp>({qr.handle, IBV_QP_STATE, a}, e);
    char one = 1;
    if (write(ready[1], &one, 1) != 1) _exit(7);
    // Keep writing until killed (mid-transfer).
    droce_shm_cqe out[16];
    for (uint64_t i = 0;; i++) {
      droce_shm_send_wqe w{};
      w.wr_id = i;
      w.opcode = DROCE_WR_RDMA_WRITE;
      w.send_flags = DROCE_SEND_SIGNALED;
      w.remote_addr = reinterpret_cast<uint64_t>(buf) + (1 << 19);
      w.rkey = mr.rkey;
      w.num_sge = 1;
      w.u.sge[0] = {reinterpret_cast<uint64_t>(buf), 1 << 19, mr.lkey};
      qp.sq.try_push(w);
      cq.poll(16, out);
    }
  }
  char x = 0;
  REQUIRE(read(ready[0], &x, 1) == 1);
  close(ready[0]);
  close(ready[1]);
  auto mid = f.server.stats();
  CHECK(mid.objects[static_cast<int>(ObjKind::Qp)] == 1);
  CHECK(mid.objects[static_cast<int>(ObjKind::Mr)] == 1);
  CHECK(mid.objects[static_cast<int>(ObjKind::Srq)] == 1);
  CHECK(mid.objects[static_cast<int>(ObjKind::Ah)] == 1);
  CHECK(mid.mapped_bytes > (1u << 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  uint64_t before = f.backend.wqes_executed();
  CHECK(before > 0);
  kill(pid, SIGKILL);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  CHECK(eventually([&] { return f.server.stats().clients == 1; }));
  auto s = f.server.stats();
  for (int k = 0; k < static_cast<int>(ObjKind::Count_); k++) {
    INFO(obj_kind_name(static_cast<ObjKind>(k)));
    CHECK(s.objects[k] == (k == static_cast<int>(ObjKind::Pd) ? 1u : 0u));  // the survivor's PD
  }
  CHECK(s.mapped_bytes == 0);
  CHECK(f.backend.live_objects() == 1);
  // The survivor keeps working.
  Empty e;
  CHECK(survivor.conn.call<Op::DeallocPd>({spd}, e) == 0);
  CHECK(f.backend.live_objects() == 0);
}

TEST_CASE("server: random requests from a hostile client never crash it", "[shim][server][fuzz]") {
  Fixture f;
  Cl good(f);
  uint32_t pd = good.pd();
  std::mt19937 rng(12345);
  int answered = 0, cut = 0;
  for (int round = 0; round < 20; round++) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strcpy(sa.sun_path, f.server.socket_path().c_str());
    REQUIRE(connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
    timeval tv{5, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (int i = 0; i < 200; i++) {
      uint8_t msg[kMaxMessage];
      for (auto& b : msg) b = static_cast<uint8_t>(rng());
      // Mostly well-formed headers with random ops, bodies and handles.
      size_t len = sizeof(ReqHdr) + rng() % 300;
      ReqHdr h{kMagic, kVersion, static_cast<uint16_t>(rng() % (static_cast<unsigned>(Op::Count_) + 2)),
               static_cast<uint32_t>(i), 0};
      if (i == 0) {
        h.op = static_cast<uint16_t>(Op::OpenDevice);
        OpenDeviceReq o{0, DROCE_SHM_ABI_VERSION};
        std::memcpy(msg + sizeof(h), &o, sizeof(o));
        len = sizeof(h) + sizeof(o);
      } else if (rng() % 3 == 0) {
        // the right body size for the op, random contents
        static const size_t sizes[] = {0, 0, sizeof(OpenDeviceReq), 0, sizeof(PortReq), sizeof(PortReq), 0,
                                       sizeof(HandleReq), sizeof(RegMrReq), sizeof(HandleReq), 0, sizeof(HandleReq),
                                       sizeof(CreateCqReq), sizeof(HandleReq), sizeof(CreateSrqReq),
                                       sizeof(ModifySrqReq), sizeof(HandleReq), sizeof(HandleReq), sizeof(CreateQpReq),
                                       sizeof(ModifyQpReq), sizeof(QueryQpReq), sizeof(HandleReq), sizeof(CreateAhReq),
                                       sizeof(HandleReq)};
        if (h.op < std::size(sizes)) len = sizeof(h) + sizes[h.op];
        // small handle numbers so some name real objects
        for (size_t k = sizeof(h); k + 4 <= len; k += 4) {
          uint32_t v = rng() % 4 == 0 ? rng() % 8 : static_cast<uint32_t>(rng());
          std::memcpy(msg + k, &v, 4);
        }
      }
      if (rng() % 50 == 0) h.magic = static_cast<uint32_t>(rng());
      std::memcpy(msg, &h, sizeof(h));
      if (send(s, msg, len, MSG_NOSIGNAL) < 0) break;
      uint8_t resp[kMaxMessage];
      int fds[4], nfds = 0;
      ssize_t n = recv_with_fds(s, resp, sizeof(resp), fds, 4, &nfds);
      for (int k = 0; k < nfds; k++) close(fds[k]);
      if (n <= 0) {
        cut++;
        break;
      }
      answered++;
    }
    close(s);
  }
  INFO("answered " << answered << ", connections cut " << cut);
  CHECK(answered > 1000);
  // The server still serves, and the hostile clients left nothing behind.
  CHECK(good.pd() != pd);
  CHECK(eventually([&] { return f.server.stats().clients == 1; }));
  auto st = f.server.stats();
  CHECK(st.objects[static_cast<int>(ObjKind::Qp)] == 0);
  CHECK(st.objects[static_cast<int>(ObjKind::Cq)] == 0);
  CHECK(st.objects[static_cast<int>(ObjKind::Pd)] == 2);  // the good client's
  CHECK(st.mapped_bytes == 0);
}

TEST_CASE("memory scheme: remap at the same address, reuse, overlap rules", "[shim][mr]") {
  const size_t pg = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // Fresh pages no earlier registration has touched.
  auto* buf = static_cast<uint8_t*>(mmap(nullptr, 8 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(buf != MAP_FAILED);
  for (size_t i = 0; i < 8 * pg; i++) buf[i] = static_cast<uint8_t>(i * 13);
  // An unaligned range is rounded out to whole pages; the contents survive.
  MrMemory a;
  REQUIRE(prepare_mr_memory(buf + pg + 100, 2 * pg, a) == 0);
  CHECK(a.map_addr == reinterpret_cast<uint64_t>(buf + pg));
  CHECK(a.map_len == 3 * pg);
  CHECK(a.fd_offset == 0);
  for (size_t i = 0; i < 8 * pg; i++)
    if (buf[i] != static_cast<uint8_t>(i * 13)) FAIL("byte " << i << " changed by the remap");
  // The program's pages and the memfd are the same memory now.
  auto* other = static_cast<uint8_t*>(mmap(nullptr, 3 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0));
  REQUIRE(other != MAP_FAILED);
  buf[pg + 200] = 0xAB;
  CHECK(other[200] == 0xAB);
  other[300] = 0xCD;
  CHECK(buf[pg + 300] == 0xCD);
  // A range inside it reuses the memfd at the right offset, no copy.
  MrMemory b;
  REQUIRE(prepare_mr_memory(buf + 2 * pg + 8, 16, b) == 0);
  CHECK(b.entry == a.entry);
  CHECK(b.fd_offset == pg);
  // A range that straddles its edge cannot join it.
  MrMemory c;
  CHECK(prepare_mr_memory(buf + 3 * pg, 2 * pg, c) == -EINVAL);
  // Once both registrations are gone the pages can be registered afresh.
  close(a.fd);
  close(b.fd);
  release_mr_memory(a.entry);
  release_mr_memory(b.entry);
  REQUIRE(prepare_mr_memory(buf + 3 * pg, 2 * pg, c) == 0);
  CHECK(buf[pg + 300] == 0xCD);
  close(c.fd);
  release_mr_memory(c.entry);
  munmap(other, 3 * pg);
  // alloc_shared memory registers without a remap.
  auto* s = static_cast<uint8_t*>(alloc_shared(4 * pg));
  REQUIRE(s != nullptr);
  s[5] = 7;
  MrMemory d;
  REQUIRE(prepare_mr_memory(s, 4 * pg, d) == 0);
  CHECK(d.map_addr == reinterpret_cast<uint64_t>(s));
  CHECK(s[5] == 7);
  close(d.fd);
  release_mr_memory(d.entry);
  free_shared(s);
  CHECK(prepare_mr_memory(nullptr, 10, d) == -EINVAL);
  munmap(buf, 8 * pg);
}

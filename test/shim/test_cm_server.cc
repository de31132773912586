// The ShimServer's RDMA CM ops (cm_sessions.h) through the protocol, as the
// drop-in librdmacm calls them: channels and their eventfds, ids, bindings,
// address resolution, and whole connections (REQ/REP/RTU/DREQ, REJ, SIDR)
// between two clients over two real cm::Agents (cm_agent_pair.h) and, for the
// connection cases, over droced's EngineCmBackend too (QP1 on the test
// dataplane, the agents on its home core: RealCm); bad input
// (foreign handles, unbound ids, EADDRINUSE, unknown addresses), quotas, and
// a client killed mid-connection leaving nothing in the server or the agents.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <tuple>
#include <type_traits>

#include "cm_agent_pair.h"
#include "engine_env.h"
#include "shim/client/client.h"
#include "shim/engine/engine_cm.h"
#include "shim/server.h"

using namespace droce;
using namespace droce::shim;
using namespace droce::shim::proto;
using droce::shim::test::AgentPairCm;
using droce::shim::test::kDevIp;
using Fixture = droce::shim::test::EngineFixture;

namespace {

constexpr uint32_t kDevA = 0x0A4D0001, kDevB = 0x0A4D0002;  // 10.77.0.1 (dev 0), 10.77.0.2 (dev 1)

CmAddr addr4(uint32_t ip, uint16_t port) {
  CmAddr a{};
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(port);
  sin.sin_addr.s_addr = htonl(ip);
  std::memcpy(a.bytes, &sin, sizeof(sin));
  return a;
}
sockaddr_in sin_of(const CmAddr& a) {
  sockaddr_in s;
  std::memcpy(&s, a.bytes, sizeof(s));
  return s;
}
uint16_t port_of(const CmAddr& a) { return ntohs(sin_of(a).sin_port); }
uint32_t ip_of(const CmAddr& a) { return ntohl(sin_of(a).sin_addr.s_addr); }

// A librdmacm program's connection to the server (no device opened: CM ops need none).
struct CmCl {
  explicit CmCl(Fixture& f) { REQUIRE(conn.connect(f.server.socket_path()) == 0); }
  ~CmCl() {
    for (int fd : fds) close(fd);
  }
  // A channel: its handle; its eventfd in *fd.
  uint32_t channel(int* fd = nullptr) {
    HandleResp r{};
    int efd = -1, n = 0;
    REQUIRE(conn.call<Op::CmCreateChannel>({}, r, nullptr, 0, &efd, 1, &n) == 0);
    REQUIRE(n == 1);
    fds.push_back(efd);
    chan_fd[r.handle] = efd;
    if (fd) *fd = efd;
    return r.handle;
  }
  uint32_t id(uint32_t ch, uint32_t ps = RDMA_PS_TCP, uint32_t qpt = IBV_QPT_RC) {
    HandleResp r{};
    REQUIRE(conn.call<Op::CmCreateId>({ch, ps, qpt, 0}, r) == 0);
    return r.handle;
  }
  int bind(uint32_t id, CmAddr a, CmIdInfo* info = nullptr) {
    CmIdInfo i{};
    int rc = conn.call<Op::CmBindAddr>({id, 0, a}, i);
    if (info) *info = i;
    return rc;
  }
  int resolve(uint32_t id, CmAddr dst, uint32_t timeout_ms = 2000) {
    Empty e;
    return conn.call<Op::CmResolveAddr>({id, timeout_ms, CmAddr{}, dst}, e);
  }
  int route(uint32_t id) {
    Empty e;
    return conn.call<Op::CmResolveRoute>({id, 2000}, e);
  }
  int listen(uint32_t id, uint32_t backlog = 0) {
    Empty e;
    return conn.call<Op::CmListen>({id, backlog}, e);
  }
  int connect(uint32_t id, uint32_t qpn, const char* pdata = "") {
    CmConnParamReq q{};
    q.id = id;
    q.param.private_data_len = static_cast<uint8_t>(std::strlen(pdata));
    std::memcpy(q.param.private_data, pdata, q.param.private_data_len);
    q.param.responder_resources = 4;
    q.param.initiator_depth = 2;
    q.param.retry_count = 7;
    q.param.rnr_retry_count = 7;
    q.param.qp_num = qpn;
    Empty e;
    return conn.call<Op::CmConnect>(q, e);
  }
  int accept(uint32_t id, uint32_t qpn, const char* pdata = "") {
    CmConnParamReq q{};
    q.id = id;
    q.param.private_data_len = static_cast<uint8_t>(std::strlen(pdata));
    std::memcpy(q.param.private_data, pdata, q.param.private_data_len);
    q.param.responder_resources = 8;
    q.param.initiator_depth = 8;
    q.param.qp_num = qpn;
    Empty e;
    return conn.call<Op::CmAccept>(q, e);
  }
  int simple(Op op, uint32_t h) {
    Empty e;
    switch (op) {
      case Op::CmEstablish: return conn.call<Op::CmEstablish>({h}, e);
      case Op::CmDisconnect: return conn.call<Op::CmDisconnect>({h}, e);
      case Op::CmDestroyId: return conn.call<Op::CmDestroyId>({h}, e);
      case Op::CmDestroyChannel: return conn.call<Op::CmDestroyChannel>({h}, e);
      default: return -EINVAL;
    }
  }
  int qp_attr(uint32_t id, ibv_qp_state s, CmInitQpAttrResp& r) {
    r = CmInitQpAttrResp{};
    return conn.call<Op::CmInitQpAttr>({id, s}, r);
  }
  // Waits (bounded) for the channel's eventfd, takes one count and the event.
  bool event(uint32_t ch, CmEventResp& ev, int ms = 5000) {
    pollfd p{chan_fd.at(ch), POLLIN, 0};
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() < 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
      uint64_t v;
      REQUIRE(read(p.fd, &v, sizeof(v)) == sizeof(v));
      REQUIRE(v == 1);  // a semaphore: one count per read
      ev = CmEventResp{};
      const int rc = conn.call<Op::CmGetEvent>({ch}, ev);
      if (rc == 0) return true;
      REQUIRE(rc == -EAGAIN);  // a count left by an event that went (migrated, destroyed)
    }
  }
  CmEventResp expect(uint32_t ch, uint32_t type, int ms = 5000) {
    CmEventResp ev{};
    INFO("waiting for event " << type);
    REQUIRE(event(ch, ev, ms));
    INFO("got event " << ev.event << " status " << ev.status);
    REQUIRE(ev.event == type);
    return ev;
  }
  // Nothing readable on the channel within ms.
  bool quiet(uint32_t ch, int ms = 50) {
    pollfd p{chan_fd.at(ch), POLLIN, 0};
    return ::poll(&p, 1, ms) == 0;
  }
  ShimConnection conn;
  std::vector<int> fds;
  std::map<uint32_t, int> chan_fd;
};

template <typename F>
bool eventually(F f, int ms = 5000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return f();
}

// Two programs: a listener on 10.77.0.2:port (dev 1) and an active side
// whose id resolved its route to it (dev 0).
struct Conn {
  CmCl srv, cli;
  uint32_t sch, lid, cch, cid;
  Conn(Fixture& f, uint16_t port, uint32_t ps = RDMA_PS_TCP, uint32_t qpt = IBV_QPT_RC) : srv(f), cli(f) {
    sch = srv.channel();
    lid = srv.id(sch, ps, qpt);
    REQUIRE(srv.bind(lid, addr4(kDevB, port)) == 0);
    REQUIRE(srv.listen(lid) == 0);
    cch = cli.channel();
    cid = cli.id(cch, ps, qpt);
    // From droce0's address: unbound, a route to droce1's own address would
    // stay on droce1 (loopback).
    REQUIRE(cli.bind(cid, addr4(kDevA, 0)) == 0);
    REQUIRE(cli.resolve(cid, addr4(kDevB, port)) == 0);
    cli.expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
    REQUIRE(cli.route(cid) == 0);
    cli.expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  }
};

// The real backend: EngineCmBackend on the test dataplane (QP1 of each port,
// the Agents on the home core, MADs over the net_ring wire), with the same
// test timers as AgentPairCm and the same views.
struct RealCm {
  EngineCmBackend be{droce::shim::test::dataplane(), droce::shim::test::backend_config(), config()};
  static EngineCmConfig config() {
    EngineCmConfig c;
    c.agent = AgentPairCm::test_config();
    return c;
  }
  CmBackend* get() { return &be; }
  std::vector<cm::ConnInfo> connections(uint32_t dev) {
    std::vector<cm::ConnInfo> v;
    REQUIRE(be.connections(dev, v) == 0);
    return v;
  }
  uint64_t counter(uint32_t dev, cm::CmCtr c) {
    std::vector<std::pair<std::string, uint64_t>> v;
    REQUIRE(be.counters(dev, v) == 0);
    for (auto& [k, val] : v)
      if (k == cm::ctr_name(c)) return val;
    FAIL("no counter " << cm::ctr_name(c));
    return 0;
  }
};

}  // namespace

TEST_CASE("cm: without a CmBackend every CM op answers ENOSYS", "[shim][cm]") {
  Fixture f;
  ShimConnection c;
  REQUIRE(c.connect(f.server.socket_path()) == 0);
  HandleResp r{};
  CHECK(c.call<Op::CmCreateChannel>({}, r) == -ENOSYS);
  CHECK(c.call<Op::CmCreateId>({1, RDMA_PS_TCP, IBV_QPT_RC, 0}, r) == -ENOSYS);
  CmEventResp ev{};
  CHECK(c.call<Op::CmGetEvent>({1}, ev) == -ENOSYS);
  // Verbs ops still need an open device.
  CHECK(c.call<Op::AllocPd>({}, r) == -ENODEV);
}

TEST_CASE("cm: channels and ids, foreign handles, quotas", "[shim][cm]") {
  AgentPairCm cm;
  ShimServerConfig cfg;
  cfg.max_cm_ids_per_client = 3;
  cfg.max_cm_channels_per_client = 2;
  Fixture f(cfg, &cm);
  CmCl a(f), b(f);
  int efd = -1;
  const uint32_t ch = a.channel(&efd);
  CHECK(efd >= 0);
  const uint32_t id = a.id(ch);
  HandleResp r{};
  Empty e;
  // b names a's handles: nothing there.
  CHECK(b.conn.call<Op::CmCreateId>({ch, RDMA_PS_TCP, IBV_QPT_RC, 0}, r) == -EBADF);
  CHECK(b.simple(Op::CmDestroyId, id) == -EBADF);
  CHECK(b.bind(id, addr4(kDevA, 7000)) == -EBADF);
  CmEventResp ev{};
  CHECK(b.conn.call<Op::CmGetEvent>({ch}, ev) == -EBADF);
  CHECK(b.simple(Op::CmDestroyChannel, ch) == -EBADF);
  // a names an id as a channel and the other way round.
  CHECK(a.conn.call<Op::CmGetEvent>({id}, ev) == -EBADF);
  CHECK(a.conn.call<Op::CmCreateId>({id, RDMA_PS_TCP, IBV_QPT_RC, 0}, r) == -EBADF);
  CHECK(a.simple(Op::CmDestroyId, ch) == -EBADF);
  // Port space / QP type pairs the kernel refuses.
  CHECK(a.conn.call<Op::CmCreateId>({ch, RDMA_PS_TCP, IBV_QPT_UD, 0}, r) == -EINVAL);
  CHECK(a.conn.call<Op::CmCreateId>({ch, RDMA_PS_UDP, IBV_QPT_RC, 0}, r) == -EINVAL);
  CHECK(a.conn.call<Op::CmCreateId>({ch, 0x4242, IBV_QPT_RC, 0}, r) == -EINVAL);
  CHECK(a.conn.call<Op::CmCreateId>({ch, RDMA_PS_TCP, IBV_QPT_RAW_PACKET, 0}, r) == -EINVAL);
  // Nothing queued: -EAGAIN, and the eventfd is not readable.
  CHECK(a.conn.call<Op::CmGetEvent>({ch}, ev) == -EAGAIN);
  CHECK(a.quiet(ch));
  // Quotas.
  const uint64_t refused = f.server.stats().quota_refused;
  a.id(ch);
  a.id(ch);
  CHECK(a.conn.call<Op::CmCreateId>({ch, RDMA_PS_TCP, IBV_QPT_RC, 0}, r) == -ENOMEM);
  const uint32_t ch2 = a.channel();
  CHECK(a.conn.call<Op::CmCreateChannel>({}, r) == -ENOMEM);
  CHECK(f.server.stats().quota_refused == refused + 2);
  // b has its own quota.
  b.channel();
  auto s = f.server.stats();
  CHECK(s.cm_ids == 3);
  CHECK(s.cm_channels == 3);
  // A channel with ids is busy; an empty one goes; handles are not reused.
  CHECK(a.simple(Op::CmDestroyChannel, ch) == -EBUSY);
  CHECK(a.simple(Op::CmDestroyChannel, ch2) == 0);
  CHECK(a.simple(Op::CmDestroyChannel, ch2) == -EBADF);
  CHECK(a.simple(Op::CmDestroyId, id) == 0);
  CHECK(a.simple(Op::CmDestroyId, id) == -EBADF);
  // Body length checks apply as for every op.
  CHECK(a.conn.call<Op::CmQueryId>({id}, *std::make_unique<CmIdInfo>()) == -EBADF);
  // Client gone: its ids and channels go.
  { CmCl gone(f); gone.id(gone.channel()); }
  CHECK(eventually([&] { return f.server.stats().cm_ids == 2 && f.server.stats().cm_channels == 2; }));
  (void)e;
}

TEST_CASE("cm: bind: device addresses, wildcard, ephemeral ports, EADDRINUSE across clients", "[shim][cm]") {
  AgentPairCm cm;
  Fixture f({}, &cm);
  CmCl a(f), b(f);
  const uint32_t cha = a.channel(), chb = b.channel();
  CmIdInfo info{};
  const uint32_t a1 = a.id(cha);
  REQUIRE(a.bind(a1, addr4(kDevB, 7100), &info) == 0);
  CHECK(info.dev == 1);
  CHECK(info.port_num == 1);
  CHECK(port_of(info.src) == 7100);
  CHECK(ip_of(info.src) == kDevB);
  CHECK(info.pkey == 0xffff);
  CHECK(a.bind(a1, addr4(kDevB, 7101)) == -EINVAL);  // bound already
  // Same (port space, port, address) from another client.
  const uint32_t b1 = b.id(chb);
  CHECK(b.bind(b1, addr4(kDevB, 7100)) == -EADDRINUSE);
  CHECK(b.bind(b1, addr4(0, 7100)) == -EADDRINUSE);  // the wildcard covers it
  // Another address, or another port space, is free.
  CHECK(b.bind(b1, addr4(kDevA, 7100), &info) == 0);
  CHECK(info.dev == 0);
  const uint32_t b2 = b.id(chb, RDMA_PS_UDP, IBV_QPT_UD);
  CHECK(b.bind(b2, addr4(kDevB, 7100)) == 0);
  // A wildcard bind excludes later specific ones.
  const uint32_t a2 = a.id(cha);
  REQUIRE(a.bind(a2, addr4(0, 7200), &info) == 0);
  CHECK(info.dev == UINT32_MAX);  // no device until it resolves or listens
  const uint32_t b3 = b.id(chb);
  CHECK(b.bind(b3, addr4(kDevA, 7200)) == -EADDRINUSE);
  // Not a droced address; not an IP family.
  CHECK(b.bind(b3, addr4(0x0A4D0032, 7300)) == -EADDRNOTAVAIL);
  CmAddr bad{};
  bad.bytes[0] = AF_UNIX;
  CHECK(b.bind(b3, bad) == -EAFNOSUPPORT);
  // Port 0: an ephemeral port, different each time.
  CmIdInfo e1{}, e2{};
  REQUIRE(b.bind(b3, addr4(kDevA, 0), &e1) == 0);
  const uint32_t b4 = b.id(chb);
  REQUIRE(b.bind(b4, addr4(kDevA, 0), &e2) == 0);
  CHECK(port_of(e1.src) >= 32768);
  CHECK(port_of(e2.src) >= 32768);
  CHECK(port_of(e1.src) != port_of(e2.src));
  CmIdInfo q{};
  REQUIRE(b.conn.call<Op::CmQueryId>({b4}, q) == 0);
  CHECK(port_of(q.src) == port_of(e2.src));
  CHECK(f.server.stats().cm_bindings == 6);
  // Destroying an id frees its port; so does a client going away.
  CHECK(a.simple(Op::CmDestroyId, a1) == 0);
  const uint32_t b5 = b.id(chb);
  CHECK(b.bind(b5, addr4(kDevB, 7100)) == 0);
  {
    CmCl c(f);
    const uint32_t cid = c.id(c.channel());
    REQUIRE(c.bind(cid, addr4(kDevA, 7400)) == 0);
  }
  CHECK(eventually([&] { return b.bind(b.id(chb), addr4(kDevA, 7400)) == 0; }));
}

TEST_CASE("cm: address and route resolution, without blocking other clients", "[shim][cm]") {
  AgentPairCm cm;
  Fixture f({}, &cm);
  CmCl a(f), b(f);
  const uint32_t ch = a.channel();
  const uint32_t id = a.id(ch);
  CHECK(a.route(id) == -EINVAL);  // no address yet
  CmInitQpAttrResp qa{};
  CHECK(a.qp_attr(id, IBV_QPS_INIT, qa) == -EINVAL);  // no device yet
  // An unbound id: bound to the route's source and an ephemeral port.
  REQUIRE(a.resolve(id, addr4(kDevB, 7500)) == 0);
  CmEventResp ev = a.expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  CHECK(ev.id == id);
  CHECK(ev.status == 0);
  CHECK(ev.info.dev == 0);
  CHECK(ip_of(ev.info.src) == kDevA);
  CHECK(port_of(ev.info.src) >= 32768);
  CHECK(ip_of(ev.info.dst) == kDevB);
  CHECK(port_of(ev.info.dst) == 7500);
  CHECK(std::memcmp(ev.info.dgid.raw, wire::gid_from_ipv4(kDevB).data(), 16) == 0);
  CHECK(a.resolve(id, addr4(kDevB, 7500)) == -EINVAL);  // once, as Linux
  REQUIRE(a.route(id) == 0);
  a.expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  // Before a connection the QP gets no remote access (Linux cma_ib_init_qp_attr).
  REQUIRE(a.qp_attr(id, IBV_QPS_INIT, qa) == 0);
  CHECK(qa.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  CHECK(qa.attr.qp_access_flags == 0);
  CHECK(qa.attr.port_num == 1);
  CHECK(a.qp_attr(id, IBV_QPS_RTR, qa) == -EINVAL);  // nothing negotiated
  // No route: at once.
  const uint32_t id2 = a.id(ch);
  CHECK(a.resolve(id2, addr4(0xC0000201, 7500)) == -ENETUNREACH);
  CHECK(a.resolve(id2, addr4(0, 7500)) == -EINVAL);
  // Resolution that takes steps: answered from the server loop.
  REQUIRE(a.resolve(id2, addr4(0x0A4D0062, 7500)) == 0);  // 10.77.0.98
  a.expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  // Nobody answers: ADDR_ERROR -ETIMEDOUT after the request's timeout, while
  // the other client is served at once.
  const uint32_t id3 = a.id(ch);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(a.resolve(id3, addr4(0x0A4D0063, 7500), 1000) == 0);  // 10.77.0.99
  CHECK(f.server.stats().cm_resolving == 1);
  const uint32_t bch = b.channel();
  const uint32_t bid = b.id(bch);
  CHECK(b.bind(bid, addr4(kDevA, 0)) == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
  ev = a.expect(ch, RDMA_CM_EVENT_ADDR_ERROR);
  CHECK(ev.id == id3);
  CHECK(ev.status == -ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(1000));
  CHECK(f.server.stats().cm_resolving == 0);
  CHECK(a.route(id3) == -EINVAL);
  // After ADDR_ERROR the id may try again.
  REQUIRE(a.resolve(id3, addr4(kDevB, 7500)) == 0);
  a.expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
  // Destroying an id that is resolving stops it: no event.
  const uint32_t id4 = a.id(ch);
  REQUIRE(a.resolve(id4, addr4(0x0A4D0063, 7500), 200) == 0);
  CHECK(a.simple(Op::CmDestroyId, id4) == 0);
  CHECK(f.server.stats().cm_resolving == 0);
  CHECK(a.quiet(ch, 300));
}

TEMPLATE_TEST_CASE("cm: an RC connection through the real agents: REQ/REP/RTU/DREQ, QP attributes", "[shim][cm]", AgentPairCm, RealCm) {
  TestType cm;
  Fixture f({}, cm.get());
  Conn c(f, 7471);
  // The active side's REQ.
  REQUIRE(c.cli.connect(c.cid, 0x123, "hello") == 0);
  CHECK(c.cli.connect(c.cid, 0x123) == -EINVAL);  // once
  CmInitQpAttrResp qa{};
  REQUIRE(c.cli.qp_attr(c.cid, IBV_QPS_INIT, qa) == 0);
  CHECK(qa.attr.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
  CHECK(c.cli.qp_attr(c.cid, IBV_QPS_RTR, qa) == -EINVAL);  // before the REP
  // The listener gets a new id on its channel.
  CmEventResp req = c.srv.expect(c.sch, RDMA_CM_EVENT_CONNECT_REQUEST);
  const uint32_t pid = req.id;
  CHECK(pid != c.lid);
  CHECK(req.listen_id == c.lid);
  CHECK(req.param.private_data_len >= 5);
  CHECK(std::memcmp(req.param.private_data, "hello", 5) == 0);
  CHECK(req.param.responder_resources == 2);  // the peer's initiator depth (swapped, as Linux)
  CHECK(req.param.initiator_depth == 4);
  CHECK(req.info.dev == 1);
  CHECK(ip_of(req.info.src) == kDevB);
  CHECK(port_of(req.info.src) == 7471);
  CHECK(ip_of(req.info.dst) == kDevA);
  CmIdInfo cinfo{};
  REQUIRE(c.cli.conn.call<Op::CmQueryId>({c.cid}, cinfo) == 0);
  CHECK(port_of(req.info.dst) == port_of(cinfo.src));
  CHECK(f.server.stats().cm_ids == 3);
  // The passive side's attributes come from the REQ.
  REQUIRE(c.srv.qp_attr(pid, IBV_QPS_RTR, qa) == 0);
  CHECK(qa.mask == (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  CHECK(qa.attr.dest_qp_num == 0x123);
  CHECK(qa.attr.ah_attr.is_global == 1);
  CHECK(qa.attr.ah_attr.port_num == 1);
  CHECK(qa.attr.ah_attr.grh.sgid_index == droce::shim::test::kRoceGidIndex);
  CHECK(std::memcmp(qa.attr.ah_attr.grh.dgid.raw, wire::gid_from_ipv4(kDevA).data(), 16) == 0);
  ibv_port_attr pa{};
  REQUIRE(f.backend.query_port(0, 1, pa) == 0);
  CHECK(qa.attr.path_mtu == pa.active_mtu);  // the active side offered its device's MTU
  const uint32_t srv_rq_psn = qa.attr.rq_psn;
  // Accept: the active side gets CONNECT_RESPONSE with the REP's data.
  REQUIRE(c.srv.accept(pid, 0x456, "world") == 0);
  CHECK(c.srv.accept(pid, 0x456) == -EINVAL);  // once
  CmEventResp rep = c.cli.expect(c.cch, RDMA_CM_EVENT_CONNECT_RESPONSE);
  CHECK(rep.id == c.cid);
  CHECK(std::memcmp(rep.param.private_data, "world", 5) == 0);
  REQUIRE(c.cli.qp_attr(c.cid, IBV_QPS_RTR, qa) == 0);
  CHECK(qa.attr.dest_qp_num == 0x456);
  const uint32_t cli_rq_psn = qa.attr.rq_psn;
  REQUIRE(c.cli.qp_attr(c.cid, IBV_QPS_RTS, qa) == 0);
  CHECK(qa.mask == (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_MAX_QP_RD_ATOMIC));
  CHECK(qa.attr.sq_psn == srv_rq_psn);  // what the passive side expects
  CHECK(qa.attr.retry_cnt == 7);
  REQUIRE(c.srv.qp_attr(pid, IBV_QPS_RTS, qa) == 0);
  CHECK(qa.attr.sq_psn == cli_rq_psn);
  // Only the active side sends RTU; the passive side gets ESTABLISHED.
  CHECK(c.srv.simple(Op::CmEstablish, pid) == -EINVAL);
  REQUIRE(c.cli.simple(Op::CmEstablish, c.cid) == 0);
  CmEventResp est = c.srv.expect(c.sch, RDMA_CM_EVENT_ESTABLISHED);
  CHECK(est.id == pid);
  CHECK(c.cli.quiet(c.cch));  // the front reports its own ESTABLISHED
  auto conns = cm.connections(0);
  bool found = false;
  for (auto& ci : conns)
    if (ci.state == cm::ConnState::Established && ci.local_qpn == 0x123 && ci.remote_qpn == 0x456) found = true;
  CHECK(found);
  // Disconnect: DREQ / DREP, both sides get DISCONNECTED.
  REQUIRE(c.cli.simple(Op::CmDisconnect, c.cid) == 0);
  c.srv.expect(c.sch, RDMA_CM_EVENT_DISCONNECTED);
  c.cli.expect(c.cch, RDMA_CM_EVENT_DISCONNECTED);
  REQUIRE(c.cli.simple(Op::CmDestroyId, c.cid) == 0);
  REQUIRE(c.srv.simple(Op::CmDestroyId, pid) == 0);
  // After TimeWait only the listener is left in the agents.
  CHECK(eventually([&] { return cm.connections(0).empty() && cm.connections(1).size() == 1; }));
  CHECK(cm.counter(1, cm::CmCtr::RxRtu) == 1);
  const auto s = f.server.stats();
  CHECK(s.cm_ids == 1);
  CHECK(s.cm_listeners == 1);
  CHECK(s.cm_events >= 7);
}

TEMPLATE_TEST_CASE("cm: reject, and a REQ nobody listens for", "[shim][cm]", AgentPairCm, RealCm) {
  TestType cm;
  Fixture f({}, cm.get());
  Conn c(f, 7600);
  REQUIRE(c.cli.connect(c.cid, 0x222) == 0);
  CmEventResp req = c.srv.expect(c.sch, RDMA_CM_EVENT_CONNECT_REQUEST);
  CmRejectReq rj{};
  rj.id = req.id;
  rj.private_data_len = 3;
  std::memcpy(rj.private_data, "no!", 3);
  Empty e;
  CHECK(c.srv.conn.call<Op::CmReject>({c.lid, 0, {}}, e) == -EINVAL);  // a listener is not a request
  REQUIRE(c.srv.conn.call<Op::CmReject>(rj, e) == 0);
  CHECK(c.srv.accept(req.id, 1) == -EINVAL);  // answered already
  CmEventResp ev = c.cli.expect(c.cch, RDMA_CM_EVENT_REJECTED);
  CHECK(ev.status == 28);  // IB_CM_REJ_CONSUMER_DEFINED
  CHECK(std::memcmp(ev.param.private_data, "no!", 3) == 0);
  // A port nobody listens on: REJ invalid service ID.
  CmCl x(f);
  const uint32_t xch = x.channel();
  const uint32_t xid = x.id(xch);
  REQUIRE(x.resolve(xid, addr4(kDevB, 7601)) == 0);
  x.expect(xch, RDMA_CM_EVENT_ADDR_RESOLVED);
  CHECK(x.connect(xid, 0x333) == -EINVAL);  // the route first
  REQUIRE(x.route(xid) == 0);
  x.expect(xch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  REQUIRE(x.connect(xid, 0x333) == 0);
  ev = x.expect(xch, RDMA_CM_EVENT_REJECTED);
  CHECK(ev.status == 8);  // IB_CM_REJ_INVALID_SERVICE_ID
  // Private data beyond a REQ's 56 bytes.
  const uint32_t yid = x.id(xch);
  REQUIRE(x.resolve(yid, addr4(kDevB, 7600)) == 0);
  x.expect(xch, RDMA_CM_EVENT_ADDR_RESOLVED);
  REQUIRE(x.route(yid) == 0);
  x.expect(xch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  std::string big(57, 'x');
  CHECK(x.connect(yid, 0x444, big.c_str()) == -EINVAL);
}

TEST_CASE("cm: a silent peer: UNREACHABLE -ETIMEDOUT after the CM retries", "[shim][cm]") {
  AgentPairCm cm;
  Fixture f({}, &cm);
  Conn c(f, 7700);
  cm.blackhole(1, true);
  REQUIRE(c.cli.connect(c.cid, 0x555) == 0);
  CmEventResp ev = c.cli.expect(c.cch, RDMA_CM_EVENT_UNREACHABLE, 10000);
  CHECK(ev.status == -ETIMEDOUT);
  CHECK(cm.counter(0, cm::CmCtr::Timeouts) == 1);
}

TEMPLATE_TEST_CASE("cm: UD: SIDR_REQ / SIDR_REP through the agents", "[shim][cm]", AgentPairCm, RealCm) {
  TestType cm;
  Fixture f({}, cm.get());
  Conn c(f, 7800, RDMA_PS_UDP, IBV_QPT_UD);
  CmInitQpAttrResp qa{};
  REQUIRE(c.cli.qp_attr(c.cid, IBV_QPS_INIT, qa) == 0);
  CHECK(qa.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
  CHECK(qa.attr.qkey == cm::kUdpQkey);
  REQUIRE(c.cli.connect(c.cid, 0x777, "ud") == 0);
  CmEventResp req = c.srv.expect(c.sch, RDMA_CM_EVENT_CONNECT_REQUEST);
  CHECK(req.ah_attr.is_global == 1);
  CHECK(std::memcmp(req.ah_attr.grh.dgid.raw, wire::gid_from_ipv4(kDevA).data(), 16) == 0);
  REQUIRE(c.srv.accept(req.id, 0x888) == 0);
  CmEventResp est = c.cli.expect(c.cch, RDMA_CM_EVENT_ESTABLISHED);
  CHECK(est.ud_qp_num == 0x888);
  CHECK(est.ud_qkey == cm::kUdpQkey);
  CHECK(est.ah_attr.is_global == 1);
  CHECK(est.ah_attr.grh.sgid_index == droce::shim::test::kRoceGidIndex);
  CHECK(std::memcmp(est.ah_attr.grh.dgid.raw, wire::gid_from_ipv4(kDevB).data(), 16) == 0);
}

TEMPLATE_TEST_CASE("cm: multicast join: MULTICAST_JOIN with the group's address vector, bad joins refused", "[shim][cm][mcast]", AgentPairCm, RealCm) {
  TestType cm;
  Fixture f({}, cm.get());
  CmCl cl(f);
  const uint32_t ch = cl.channel();
  auto join = [&](uint32_t id, CmAddr a, uint32_t flags = RDMA_MC_JOIN_FLAG_FULLMEMBER) {
    Empty e;
    return cl.conn.call<Op::CmJoinMulticast>({id, flags, a}, e);
  };
  const CmAddr group = addr4(0xEF010203, 0);  // 239.1.2.3
  const uint32_t ud = cl.id(ch, RDMA_PS_UDP, IBV_QPT_UD);
  // Not bound to a device yet (rdma_join_multicast needs a bound or resolved id).
  CHECK(join(ud, group) == -EINVAL);
  REQUIRE(cl.bind(ud, addr4(kDevA, 0)) == 0);
  REQUIRE(join(ud, group) == 0);
  CmEventResp ev = cl.expect(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
  CHECK(ev.id == ud);
  CHECK(ev.status == 0);
  CHECK(ev.ud_qp_num == 0xFFFFFF);
  CHECK(ev.ud_qkey == cm::kUdpQkey);
  CHECK(ev.ah_attr.is_global == 1);
  CHECK(ev.ah_attr.port_num == 1);
  CHECK(ev.ah_attr.grh.hop_limit == 64);
  CHECK(ev.ah_attr.grh.sgid_index == droce::shim::test::kRoceGidIndex);
  // The MGID: the IPv4-mapped group address, as Linux's cma on RoCEv2.
  CHECK(std::memcmp(ev.ah_attr.grh.dgid.raw, wire::gid_from_ipv4(0xEF010203).data(), 16) == 0);
  CHECK(ip_of(ev.info.src) == kDevA);
  // Bad joins: a unicast address, the wildcard, another family, reserved flags,
  // an RC id, someone else's (unknown) handle.
  CHECK(join(ud, addr4(kDevB, 0)) == -EINVAL);
  CHECK(join(ud, addr4(0, 0)) == -EINVAL);
  CmAddr g6{};
  sockaddr_in6 s6{};
  s6.sin6_family = AF_INET6;
  s6.sin6_addr.s6_addr[0] = 0xff;
  s6.sin6_addr.s6_addr[1] = 0x0e;
  s6.sin6_addr.s6_addr[15] = 1;
  std::memcpy(g6.bytes, &s6, sizeof(s6));
  CHECK(join(ud, g6) == -EINVAL);
  CHECK(join(ud, group, RDMA_MC_JOIN_FLAG_RESERVED) == -EINVAL);
  CHECK(join(ud, group, RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) == 0);
  cl.expect(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
  const uint32_t rc = cl.id(ch, RDMA_PS_TCP, IBV_QPT_RC);
  REQUIRE(cl.bind(rc, addr4(kDevA, 0)) == 0);
  CHECK(join(rc, group) == -EINVAL);
  CHECK(join(9999, group) == -EBADF);
  CHECK(cl.quiet(ch));
  if constexpr (std::is_same_v<TestType, RealCm>) {
    // mckey's way: rdma_resolve_addr from a bound address to the group: the
    // group's MAC needs no ARP, ADDR_RESOLVED at once; then the join.
    const uint32_t u2 = cl.id(ch, RDMA_PS_UDP, IBV_QPT_UD);
    Empty e;
    REQUIRE(cl.conn.call<Op::CmResolveAddr>({u2, 2000, addr4(kDevA, 0), group}, e) == 0);
    cl.expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    REQUIRE(join(u2, group) == 0);
    ev = cl.expect(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
    CHECK(ev.id == u2);
    CHECK(std::memcmp(ev.ah_attr.grh.dgid.raw, wire::gid_from_ipv4(0xEF010203).data(), 16) == 0);
  }
}

TEMPLATE_TEST_CASE("cm: migrate an id with its events; destroy drops unread events; backlog", "[shim][cm]", AgentPairCm, RealCm) {
  TestType cm;
  Fixture f({}, cm.get());
  Conn c(f, 7900);
  const uint32_t ch2 = c.srv.channel();
  REQUIRE(c.cli.connect(c.cid, 0x100) == 0);
  // Wait for the request to be queued, then move the listener: it goes along.
  REQUIRE(eventually([&] { return f.server.stats().cm_ids == 3; }));
  Empty e;
  REQUIRE(c.srv.conn.call<Op::CmMigrateId>({c.lid, ch2}, e) == 0);
  CHECK(c.srv.conn.call<Op::CmMigrateId>({c.lid, 999}, e) == -EBADF);
  CmEventResp req = c.srv.expect(ch2, RDMA_CM_EVENT_CONNECT_REQUEST);
  CmEventResp none{};
  CHECK(c.srv.conn.call<Op::CmGetEvent>({c.sch}, none) == -EAGAIN);  // old channel: spurious count only
  // The new id lives on the new channel too: the old one can go.
  CHECK(c.srv.simple(Op::CmDestroyChannel, c.sch) == 0);
  // Unread events die with their id (and count as dropped).
  REQUIRE(c.srv.accept(req.id, 0x200) == 0);
  REQUIRE(eventually([&] { return f.server.stats().cm_events >= 4; }));
  c.cli.expect(c.cch, RDMA_CM_EVENT_CONNECT_RESPONSE);
  REQUIRE(c.cli.simple(Op::CmEstablish, c.cid) == 0);
  const uint64_t dropped = f.server.stats().cm_events_dropped;
  // ESTABLISHED arrives on ch2 for req.id; destroy the id before reading it.
  REQUIRE(eventually([&] {
    CmIdInfo i{};
    return c.srv.conn.call<Op::CmQueryId>({req.id}, i) == 0 && !c.srv.quiet(ch2, 1);
  }));
  REQUIRE(c.srv.simple(Op::CmDestroyId, req.id) == 0);
  CHECK(f.server.stats().cm_events_dropped == dropped + 1);
  CHECK(c.srv.conn.call<Op::CmGetEvent>({ch2}, none) == -EAGAIN);
  // The destroyed passive side sent DREQ: the active side is disconnected.
  c.cli.expect(c.cch, RDMA_CM_EVENT_DISCONNECTED);
  // Backlog 1: a second unread request is refused (REJ to its sender).
  Empty e2;
  REQUIRE(c.srv.conn.call<Op::CmListen>({c.lid, 1}, e2) == 0);
  CmCl p(f), q(f);
  uint32_t pch = p.channel(), qch = q.channel();
  uint32_t pid = p.id(pch), qid = q.id(qch);
  for (auto [cl, ch, id] : {std::tuple{&p, pch, pid}, std::tuple{&q, qch, qid}}) {
    REQUIRE(cl->resolve(id, addr4(kDevB, 7900)) == 0);
    cl->expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    REQUIRE(cl->route(id) == 0);
    cl->expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
  }
  REQUIRE(p.connect(pid, 0x300) == 0);
  REQUIRE(eventually([&] { return f.server.stats().cm_ids == 5; }));  // listener, cli, p, q, p's request
  REQUIRE(q.connect(qid, 0x301) == 0);
  CmEventResp rej = q.expect(qch, RDMA_CM_EVENT_REJECTED);
  CHECK(rej.status == 28);
  c.srv.expect(ch2, RDMA_CM_EVENT_CONNECT_REQUEST);
}

TEMPLATE_TEST_CASE("cm: a client killed mid-connection leaves nothing behind", "[shim][cm][cleanup]", AgentPairCm, RealCm) {
  TestType cm;
  Fixture f({}, cm.get());
  {
    // Killed after its REQ was answered by a request on the listener: the
    // agent rejects; the listener's client sees REJECTED on the new id.
    Conn c(f, 8000);
    REQUIRE(c.cli.connect(c.cid, 0x10) == 0);
    CmEventResp req = c.srv.expect(c.sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    c.cli.conn.close();
    CmEventResp ev = c.srv.expect(c.sch, RDMA_CM_EVENT_REJECTED);
    CHECK(ev.id == req.id);
    // Killed while established: the peer gets DISCONNECTED (DREQ).
    const uint32_t ch = c.srv.channel();
    CmCl k(f);
    const uint32_t kch = k.channel();
    const uint32_t kid = k.id(kch);
    REQUIRE(k.resolve(kid, addr4(kDevB, 8000)) == 0);
    k.expect(kch, RDMA_CM_EVENT_ADDR_RESOLVED);
    REQUIRE(k.route(kid) == 0);
    k.expect(kch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    REQUIRE(k.connect(kid, 0x11) == 0);
    req = c.srv.expect(c.sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    Empty e;
    REQUIRE(c.srv.conn.call<Op::CmMigrateId>({req.id, ch}, e) == 0);
    REQUIRE(c.srv.accept(req.id, 0x12) == 0);
    k.expect(kch, RDMA_CM_EVENT_CONNECT_RESPONSE);
    REQUIRE(k.simple(Op::CmEstablish, kid) == 0);
    c.srv.expect(ch, RDMA_CM_EVENT_ESTABLISHED);
    k.conn.close();
    c.srv.expect(ch, RDMA_CM_EVENT_DISCONNECTED);
    // The listener's client dies with an established id, a listener and an
    // unread request.
    REQUIRE(k.conn.connect(f.server.socket_path()) == 0);
    const uint32_t k2ch = k.channel();
    const uint32_t k2 = k.id(k2ch);
    REQUIRE(k.resolve(k2, addr4(kDevB, 8000)) == 0);
    k.expect(k2ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    REQUIRE(k.route(k2) == 0);
    k.expect(k2ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    REQUIRE(k.connect(k2, 0x13) == 0);
    REQUIRE(eventually([&] { return !c.srv.quiet(c.sch, 1); }));  // its request is queued
    c.srv.conn.close();
    CmEventResp r = k.expect(k2ch, RDMA_CM_EVENT_REJECTED);
    CHECK(r.status == 28);
  }
  // Everything goes: ids, channels, bindings in the server; connections and
  // listeners in both agents once TimeWait passed.
  CHECK(eventually([&] {
    const auto s = f.server.stats();
    return s.cm_ids == 0 && s.cm_channels == 0 && s.cm_bindings == 0 && s.cm_listeners == 0 && s.clients == 0;
  }));
  CHECK(eventually([&] { return cm.connections(0).empty() && cm.connections(1).empty(); }));
  // The port is free again.
  CmCl n(f);
  CHECK(n.bind(n.id(n.channel()), addr4(kDevB, 8000)) == 0);
}

TEST_CASE("cm: events of a request that come before the server took it reach the new id", "[shim][cm]") {
  AgentPairCm cm;
  Fixture f({}, &cm);
  Conn c(f, 8100);
  // The server has not routed the CONNECT_REQUEST yet when the active side
  // goes away: the REJ's event carries the listener's cookie (cm_set_user
  // has not run) and must still find the new id.
  cm.hold_events(true);
  REQUIRE(c.cli.connect(c.cid, 0x20) == 0);
  REQUIRE(eventually([&] {
    for (auto& ci : cm.connections(1))
      if (ci.passive) return true;
    return false;
  }));
  c.cli.conn.close();
  REQUIRE(eventually([&] { return cm.counter(1, cm::CmCtr::RxRej) == 1; }));
  cm.hold_events(false);
  CmEventResp req = c.srv.expect(c.sch, RDMA_CM_EVENT_CONNECT_REQUEST);
  CmEventResp rej = c.srv.expect(c.sch, RDMA_CM_EVENT_REJECTED);
  CHECK(rej.id == req.id);
  CHECK(f.server.stats().cm_events_dropped == 0);
}

TEMPLATE_TEST_CASE("cm: random CM requests from hostile clients: no crash, nothing left behind", "[shim][cm][fuzz]", AgentPairCm, RealCm) {
  TestType cm;
  ShimServerConfig sc;
  sc.resolve_timeout_ms = 50;
  Fixture f(sc, cm.get());
  std::mt19937 rng(4242);
  // Handles: mostly ones the server gave out (to either client), some small numbers.
  std::vector<uint32_t> given{1};
  auto small = [&] { return rng() % 4 == 0 ? static_cast<uint32_t>(rng() % 6) : given[rng() % given.size()]; };
  auto addr = [&] {
    static const uint32_t ips[] = {0, kDevA, kDevB, 0x0A4D0063, 0x0A4D0062, 0xC0000201};
    CmAddr a = addr4(ips[rng() % 4 == 0 ? rng() % 6 : 2], static_cast<uint16_t>(9000 + rng() % 2));
    if (rng() % 10 == 0)
      for (auto& b : a.bytes) b = static_cast<uint8_t>(rng());
    return a;
  };
  auto param = [&](CmConnParamReq& q) {
    auto* p = reinterpret_cast<uint8_t*>(&q.param);
    for (size_t k = 0; k < sizeof(q.param); k++) p[k] = static_cast<uint8_t>(rng());
    if (rng() % 2) q.param.private_data_len %= 40;
    q.id = small();
  };
  int answered = 0, ok = 0;
  for (int round = 0; round < 6; round++) {
    // Two clients at once, so that one's connects can meet the other's listeners.
    ShimConnection cl[2];
    std::vector<int> fds;
    for (auto& c : cl) REQUIRE(c.connect(f.server.socket_path()) == 0);
    for (int i = 0; i < 800; i++) {
      ShimConnection& c = cl[rng() % 2];
      int rc = 0;
      Empty e;
      // Weighted toward a connection's life: create, resolve, listen, connect, accept, read events.
      static const int pick[] = {0, 0, 2, 2, 2, 5, 5, 6, 6, 6, 7, 7, 7, 8, 8, 9, 9, 9, 10, 10, 10, 12, 12,
                                 15, 15, 15, 15, 15, 1, 3, 4, 11, 13, 14, 16};
      switch (pick[rng() % std::size(pick)]) {
        case 0: {
          HandleResp r{};
          int fd = -1, n = 0;
          rc = c.call<Op::CmCreateChannel>({}, r, nullptr, 0, &fd, 1, &n);
          if (n == 1) fds.push_back(fd);
          if (rc == 0) given.push_back(r.handle);
          break;
        }
        case 1: rc = c.call<Op::CmDestroyChannel>({small()}, e); break;
        case 2: {
          static const uint32_t ps[] = {RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB, 7};
          static const uint32_t qpt[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, 99};
          HandleResp r{};
          rc = c.call<Op::CmCreateId>({small(), ps[rng() % 5], qpt[rng() % 4], 0}, r);
          if (rc == 0) given.push_back(r.handle);
          break;
        }
        case 3: rc = c.call<Op::CmDestroyId>({small()}, e); break;
        case 4: rc = c.call<Op::CmMigrateId>({small(), small()}, e); break;
        case 5: {
          CmIdInfo r{};
          rc = c.call<Op::CmBindAddr>({small(), 0, addr()}, r);
          break;
        }
        case 6: rc = c.call<Op::CmResolveAddr>({small(), static_cast<uint32_t>(rng() % 100),
                                               rng() % 2 ? CmAddr{} : addr(), addr()}, e); break;
        case 7: rc = c.call<Op::CmResolveRoute>({small(), 0}, e); break;
        case 8: rc = c.call<Op::CmListen>({small(), static_cast<uint32_t>(rng() % 4)}, e); break;
        case 9: {
          CmConnParamReq q{};
          param(q);
          rc = c.call<Op::CmConnect>(q, e);
          break;
        }
        case 10: {
          CmConnParamReq q{};
          param(q);
          rc = c.call<Op::CmAccept>(q, e);
          break;
        }
        case 11: {
          CmRejectReq q{};
          q.id = small();
          q.private_data_len = static_cast<uint32_t>(rng() % 200);
          rc = c.call<Op::CmReject>(q, e);
          break;
        }
        case 12: rc = c.call<Op::CmEstablish>({small()}, e); break;
        case 13: rc = c.call<Op::CmDisconnect>({small()}, e); break;
        case 14: {
          CmInitQpAttrResp r{};
          rc = c.call<Op::CmInitQpAttr>({small(), static_cast<uint32_t>(rng() % 6)}, r);
          break;
        }
        case 15: {
          CmEventResp r{};
          rc = c.call<Op::CmGetEvent>({small()}, r);
          if (rc == 0 && r.event == RDMA_CM_EVENT_CONNECT_REQUEST) given.push_back(r.id);
          break;
        }
        default: {
          CmIdInfo r{};
          rc = c.call<Op::CmQueryId>({small()}, r);
          break;
        }
      }
      REQUIRE(rc <= 0);
      REQUIRE(rc > -4096);
      answered++;
      if (rc == 0) ok++;
    }
    for (int fd : fds) close(fd);
    given.assign(1, 1);
  }
  INFO("answered " << answered << ", succeeded " << ok << ", events " << f.server.stats().cm_events);
  CHECK(ok > 100);
  CHECK(f.server.stats().cm_events > 0);  // how many depends on timing (ARP, the agents)
  CHECK(eventually([&] {
    const auto s = f.server.stats();
    return s.clients == 0 && s.cm_ids == 0 && s.cm_channels == 0 && s.cm_bindings == 0 && s.cm_listeners == 0 &&
           s.cm_resolving == 0;
  }));
  CHECK(eventually([&] { return cm.connections(0).empty() && cm.connections(1).empty(); }));
}

// cm::Agent: two real agents wired through an in-memory link that can lose
// chosen MADs; a virtual clock drives their timers.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <vector>

#include "cm/agent.h"

using namespace droce;
using namespace droce::cm;

namespace {

wire::Gid ip4(uint8_t last) { return wire::gid_from_ipv4(0x0a000000u | last); }

struct Node;
struct Mad {
  wire::Gid src, dst;
  uint8_t bytes[kMadSize];
  Attr attr;
};

struct Link {
  std::deque<std::pair<Node*, Mad>> q;  // (destination node, MAD)
  // Return true to drop the MAD (called for each one sent).
  std::function<bool(const Mad&)> drop = [](const Mad&) { return false; };
  std::vector<Attr> sent;
  bool mac_known = true;
};

struct Node final : Agent::Io {
  Node(Link& l, wire::Gid ip, uint64_t guid, AgentConfig cfg = {})
      : link(l), addr(ip), agent(with(cfg, guid), *this, [this](const Event& e) { events.push_back(e); }) {}
  static AgentConfig with(AgentConfig c, uint64_t guid) {
    c.ca_guid = guid;
    c.seed = guid * 7919;
    return c;
  }
  bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t, std::span<const uint8_t> mad) override {
    if (!link.mac_known) return false;
    Mad m;
    m.src = local;
    m.dst = remote;
    std::memcpy(m.bytes, mad.data(), kMadSize);
    MadHdr h;
    REQUIRE(decode_hdr(mad, h) == MadError::None);
    m.attr = h.attr_id;
    link.sent.push_back(m.attr);
    if (local != addr) FAIL("MAD sent from an address that is not the node's");
    if (!link.drop(m)) link.q.emplace_back(peer, m);
    return true;
  }
  bool is_local(const wire::Gid& ip) const override { return ip == addr; }
  Event take(EventType t) {
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].type == t) {
        Event e = events[i];
        events.erase(events.begin() + static_cast<long>(i));
        return e;
      }
    FAIL("no event " << event_name(t));
    return {};
  }
  bool has(EventType t) const {
    for (auto& e : events)
      if (e.type == t) return true;
    return false;
  }
  Link& link;
  wire::Gid addr;
  Node* peer = nullptr;
  Agent agent;
  std::vector<Event> events;
};

struct Pair {
  Link link;
  Node a, b;
  uint64_t now = 1'000'000;
  explicit Pair(AgentConfig cfg = {}) : a(link, ip4(1), 0x1111, cfg), b(link, ip4(2), 0x2222, cfg) {
    a.peer = &b;
    b.peer = &a;
    a.agent.tick(now);
    b.agent.tick(now);
  }
  void pump() {
    for (int i = 0; i < 1000 && !link.q.empty(); ++i) {
      auto [to, m] = link.q.front();
      link.q.pop_front();
      to->agent.on_mad(m.src, m.dst, kGsiQpn, std::span<const uint8_t>(m.bytes, kMadSize));
    }
    REQUIRE(link.q.empty());
  }
  void advance(uint64_t ns, uint64_t step = 1'000'000) {
    for (uint64_t t = 0; t < ns; t += step) {
      now += step;
      a.agent.tick(now);
      b.agent.tick(now);
      pump();
    }
  }
  ConnectArgs args(uint16_t port = 7471, QpKind kind = QpKind::Rc) {
    ConnectArgs c;
    c.local = {a.addr, 40000};
    c.remote = {b.addr, port};
    c.kind = kind;
    c.ps = kind == QpKind::Ud ? PortSpace::Udp : PortSpace::Tcp;
    c.param.qpn = 0x123;
    c.param.responder_resources = 4;
    c.param.initiator_depth = 2;
    c.param.private_data_len = 5;
    std::memcpy(c.param.private_data, "hello", 5);
    return c;
  }
};

// Connects a (active) to b (listener on 7471) and returns both ids.
void connect_rc(Pair& p, ConnId& act, ConnId& pas) {
  ConnId l = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 99, &l) == 0);
  REQUIRE(p.a.agent.connect(p.args(), 5, &act) == 0);
  p.pump();
  Event req = p.b.take(EventType::ConnectRequest);
  pas = req.id;
  ConnParam acc;
  acc.qpn = 0x456;
  acc.responder_resources = 8;
  acc.initiator_depth = 8;
  REQUIRE(p.b.agent.accept(pas, acc) == 0);
  p.pump();
  p.a.take(EventType::ConnectResponse);
  REQUIRE(p.a.agent.establish(act) == 0);
  p.pump();
  p.b.take(EventType::Established);
}

}  // namespace

TEST_CASE("cm agent: RC connect, accept, establish and disconnect with negotiated attributes", "[cm]") {
  Pair p;
  ConnId l = 0, act = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 99, &l) == 0);
  Req sent_req;  // the REQ and REP on the wire, for their starting PSNs
  Rep sent_rep;
  p.link.drop = [&](const Mad& m) {
    if (m.attr == Attr::Req) REQUIRE(decode(std::span<const uint8_t>(m.bytes, kMadSize), sent_req) == MadError::None);
    if (m.attr == Attr::Rep) REQUIRE(decode(std::span<const uint8_t>(m.bytes, kMadSize), sent_rep) == MadError::None);
    return false;
  };
  REQUIRE(p.a.agent.connect(p.args(), 5, &act) == 0);
  QpParams q;
  CHECK(p.a.agent.qp_params(act, q) == EINVAL);  // no REP yet
  p.pump();
  Event req = p.b.take(EventType::ConnectRequest);
  CHECK(req.listen_id == l);
  CHECK(req.user == 99);
  CHECK(req.param.qpn == 0x123);
  // The passive side sees the active side's offer swapped (what it may read
  // is what the active side answers, and vice versa), as Linux's cm.c.
  CHECK(req.param.responder_resources == 2);
  CHECK(req.param.initiator_depth == 4);
  CHECK(req.param.private_data_len == kReqUserPrivate);
  CHECK(std::memcmp(req.param.private_data, "hello", 5) == 0);
  CHECK(req.remote.ip == p.a.addr);
  CHECK(req.remote.port == 40000);
  CHECK(req.local.ip == p.b.addr);
  CHECK(req.local.port == 7471);
  REQUIRE(p.b.agent.set_user(req.id, 77) == 0);

  ConnParam acc;
  acc.qpn = 0x456;
  acc.responder_resources = 8;  // capped to the REQ's initiator depth (2)
  acc.initiator_depth = 8;      // capped to the REQ's responder resources (4)
  acc.private_data_len = 3;
  std::memcpy(acc.private_data, "rep", 3);
  REQUIRE(p.b.agent.accept(req.id, acc) == 0);
  CHECK(p.b.agent.accept(req.id, acc) == EINVAL);
  p.pump();
  Event rep = p.a.take(EventType::ConnectResponse);
  CHECK(rep.user == 5);
  CHECK(rep.param.qpn == 0x456);
  CHECK(std::memcmp(rep.param.private_data, "rep", 3) == 0);

  QpParams qa, qb;
  REQUIRE(p.a.agent.qp_params(act, qa) == 0);
  REQUIRE(p.b.agent.qp_params(req.id, qb) == 0);
  CHECK(qa.dest_qpn == 0x456);
  CHECK(qb.dest_qpn == 0x123);
  CHECK(qa.rq_psn == qb.sq_psn);
  CHECK(qb.rq_psn == qa.sq_psn);
  CHECK(qa.sq_psn < (1u << 24));
  // As Linux (test/data/rxe-cm.txt): a REQ's/REP's starting PSN is what its
  // sender receives from; the other side sends from it.
  CHECK(qa.rq_psn == sent_req.starting_psn);
  CHECK(qb.sq_psn == sent_req.starting_psn);
  CHECK(qb.rq_psn == sent_rep.starting_psn);
  CHECK(qa.sq_psn == sent_rep.starting_psn);
  CHECK(sent_req.starting_psn != sent_rep.starting_psn);
  CHECK(qa.max_rd_atomic == 2);       // the REP's responder resources
  CHECK(qb.max_dest_rd_atomic == 2);
  CHECK(qa.max_dest_rd_atomic == 4);  // the REP's initiator depth
  CHECK(qb.max_rd_atomic == 4);
  CHECK(qa.dgid == p.b.addr);
  CHECK(qb.dgid == p.a.addr);
  CHECK(qa.path_mtu == qb.path_mtu);

  REQUIRE(p.a.agent.establish(act) == 0);
  p.pump();
  Event est = p.b.take(EventType::Established);
  CHECK(est.user == 77);
  CHECK(p.a.events.empty());

  REQUIRE(p.a.agent.disconnect(act) == 0);
  p.pump();
  p.b.take(EventType::Disconnected);
  p.a.take(EventType::Disconnected);
  CHECK(p.a.agent.counter(CmCtr::RxDrep) == 1);
  CHECK(p.b.agent.counter(CmCtr::TxDrep) == 1);
  // TimeWait ends; both sides destroy their ids; nothing is left but the listener.
  p.advance(2'000'000'000, 10'000'000);
  p.a.agent.destroy(act);
  p.b.agent.destroy(req.id);
  CHECK(p.a.agent.connections().empty());
  CHECK(p.b.agent.connections().size() == 1);
  CHECK(p.b.agent.counter(CmCtr::RxBad) == 0);
  CHECK(p.a.agent.counter(CmCtr::RxBad) == 0);
  const std::vector<Attr> want = {Attr::Req, Attr::Rep, Attr::Rtu, Attr::Dreq, Attr::Drep};
  CHECK(p.link.sent == want);
}

TEST_CASE("cm agent: a REQ to a port nobody listens on gets REJ invalid service ID", "[cm]") {
  Pair p;
  ConnId act = 0;
  REQUIRE(p.a.agent.connect(p.args(9999), 1, &act) == 0);
  p.pump();
  Event rej = p.a.take(EventType::Rejected);
  CHECK(rej.status == static_cast<int>(RejReason::InvalidServiceId));
  CHECK(p.b.agent.counter(CmCtr::RejNoListener) == 1);
  CHECK(p.b.agent.connections().empty());
  // Nothing is resent after the REJ.
  p.advance(30'000'000'000, 100'000'000);
  CHECK(p.a.agent.counter(CmCtr::Retries) == 0);
  CHECK(p.a.events.empty());
}

TEST_CASE("cm agent: reject carries the program's private data; UC to an RC listener is refused", "[cm]") {
  Pair p;
  ConnId l = 0, act = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 0, &l) == 0);
  CHECK(p.b.agent.listen(PortSpace::Tcp, {p.b.addr, 7471}, QpKind::Rc, 0, &l) == EADDRINUSE);
  REQUIRE(p.a.agent.connect(p.args(), 1, &act) == 0);
  p.pump();
  Event req = p.b.take(EventType::ConnectRequest);
  const uint8_t why[] = {1, 2, 3};
  REQUIRE(p.b.agent.reject(req.id, why) == 0);
  p.pump();
  Event rej = p.a.take(EventType::Rejected);
  CHECK(rej.status == static_cast<int>(RejReason::ConsumerDefined));
  CHECK(std::memcmp(rej.param.private_data, why, 3) == 0);

  ConnId uc = 0;
  REQUIRE(p.a.agent.connect(p.args(7471, QpKind::Uc), 1, &uc) == 0);
  p.pump();
  CHECK(p.a.take(EventType::Rejected).status == static_cast<int>(RejReason::InvalidTransportType));
  // Private data beyond what a REQ holds after the CMA header is refused.
  ConnectArgs big = p.args();
  big.param.private_data_len = kReqUserPrivate + 1;
  CHECK(p.a.agent.connect(big, 1, &uc) == EINVAL);
}

TEST_CASE("cm agent: every lost MAD of the handshake is recovered by a retry or a duplicate answer", "[cm]") {
  for (Attr lose : {Attr::Req, Attr::Rep, Attr::Rtu, Attr::Dreq, Attr::Drep}) {
    DYNAMIC_SECTION("lose the first " << attr_name(lose)) {
      Pair p;
      bool lost = false;
      p.link.drop = [&](const Mad& m) {
        if (m.attr == lose && !lost) return lost = true;
        return false;
      };
      ConnId l = 0, act = 0;
      REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 0, &l) == 0);
      REQUIRE(p.a.agent.connect(p.args(), 1, &act) == 0);
      p.pump();
      if (lose == Attr::Req) p.advance(5'000'000'000, 10'000'000);
      Event req = p.b.take(EventType::ConnectRequest);
      ConnParam acc;
      acc.qpn = 9;
      REQUIRE(p.b.agent.accept(req.id, acc) == 0);
      p.pump();
      if (lose == Attr::Rep) p.advance(5'000'000'000, 10'000'000);  // the REQ is resent, the REP repeated
      p.a.take(EventType::ConnectResponse);
      REQUIRE(p.a.agent.establish(act) == 0);
      p.pump();
      if (lose == Attr::Rtu) p.advance(5'000'000'000, 10'000'000);  // the REP is resent, the RTU repeated
      p.b.take(EventType::Established);
      REQUIRE(p.b.agent.disconnect(req.id) == 0);
      p.pump();
      if (lose == Attr::Dreq || lose == Attr::Drep) p.advance(5'000'000'000, 10'000'000);
      p.a.take(EventType::Disconnected);
      p.b.take(EventType::Disconnected);
      CHECK(lost);
      CHECK(p.a.events.empty());
      CHECK(p.b.events.empty());
      CHECK(p.a.agent.counter(CmCtr::Retries) + p.b.agent.counter(CmCtr::Retries) >= 1);
    }
  }
}

TEST_CASE("cm agent: an unanswered REQ retries max_cm_retries times, then Unreachable and REJ timeout", "[cm]") {
  AgentConfig cfg;
  cfg.cm_response_timeout = 16;  // ~268 ms
  cfg.max_cm_retries = 3;
  Pair p(cfg);
  p.link.drop = [](const Mad& m) { return m.attr == Attr::Req; };
  ConnId l = 0, act = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 0, &l) == 0);
  REQUIRE(p.a.agent.connect(p.args(), 1, &act) == 0);
  p.advance(2'000'000'000, 5'000'000);
  Event e = p.a.take(EventType::Unreachable);
  CHECK(e.status == -ETIMEDOUT);
  CHECK(p.a.agent.counter(CmCtr::Retries) == 3);
  CHECK(p.a.agent.counter(CmCtr::TxReq) == 1);
  CHECK(p.link.sent.back() == Attr::Rej);
  CHECK(p.b.events.empty());
}

TEST_CASE("cm agent: a slow passive program makes the agent send MRA and the active side waits", "[cm]") {
  AgentConfig cfg;
  cfg.cm_response_timeout = 18;  // ~1.07 s: MRA after ~0.54 s
  cfg.max_cm_retries = 2;
  Pair p(cfg);
  ConnId l = 0, act = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 0, &l) == 0);
  REQUIRE(p.a.agent.connect(p.args(), 1, &act) == 0);
  p.pump();
  Event req = p.b.take(EventType::ConnectRequest);
  // The program takes 3 s: longer than the active side's three REQ waits.
  p.advance(3'000'000'000, 10'000'000);
  CHECK(p.b.agent.counter(CmCtr::TxMra) == 1);
  CHECK(p.a.agent.counter(CmCtr::RxMra) >= 1);
  CHECK(p.a.events.empty());  // not given up
  ConnParam acc;
  acc.qpn = 9;
  REQUIRE(p.b.agent.accept(req.id, acc) == 0);
  p.pump();
  p.a.take(EventType::ConnectResponse);
}

TEST_CASE("cm agent: destroying an established id sends DREQ; destroying a pending one sends REJ", "[cm]") {
  Pair p;
  ConnId act = 0, pas = 0;
  connect_rc(p, act, pas);
  p.a.agent.destroy(act);
  p.pump();
  p.b.take(EventType::Disconnected);
  CHECK(p.a.events.empty());  // no events for a destroyed id
  p.advance(2'000'000'000, 10'000'000);
  CHECK(p.a.agent.connections().empty());

  ConnId act2 = 0;
  REQUIRE(p.a.agent.connect(p.args(), 1, &act2) == 0);
  p.pump();
  Event req = p.b.take(EventType::ConnectRequest);
  p.a.agent.destroy(act2);  // the program dies before the REP
  p.pump();
  p.b.take(EventType::Rejected);
  CHECK(p.a.agent.connections().empty());
  p.b.agent.destroy(req.id);
}

TEST_CASE("cm agent: UD service ID resolution (SIDR)", "[cm]") {
  Pair p;
  ConnId l = 0, act = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Udp, {{}, 7174}, QpKind::Ud, 3, &l) == 0);
  REQUIRE(p.a.agent.connect(p.args(7174, QpKind::Ud), 1, &act) == 0);
  p.pump();
  Event req = p.b.take(EventType::ConnectRequest);
  CHECK(req.kind == QpKind::Ud);
  CHECK(std::memcmp(req.param.private_data, "hello", 5) == 0);
  ConnParam acc;
  acc.qpn = 0x777;
  acc.qkey = kUdpQkey;
  REQUIRE(p.b.agent.accept(req.id, acc) == 0);
  p.pump();
  Event est = p.a.take(EventType::Established);
  CHECK(est.ud_qpn == 0x777);
  CHECK(est.ud_qkey == kUdpQkey);
  QpParams q;
  REQUIRE(p.a.agent.qp_params(act, q) == 0);
  CHECK(q.dest_qpn == 0x777);

  ConnId none = 0;
  REQUIRE(p.a.agent.connect(p.args(7175, QpKind::Ud), 1, &none) == 0);
  p.pump();
  CHECK(p.a.take(EventType::Rejected).status == static_cast<int>(SidrStatus::Unsupported));
}

TEST_CASE("cm agent: MADs that fit no connection are counted and answered where the spec says so", "[cm]") {
  Pair p;
  ConnId act = 0, pas = 0;
  connect_rc(p, act, pas);
  // A DREQ for a connection b does not have: DREP anyway (the peer stops asking).
  Dreq d;
  d.local_comm_id = 1234;
  d.remote_comm_id = 5678;
  uint8_t mad[kMadSize];
  encode(std::span<uint8_t>(mad, kMadSize), 1, d);
  const size_t before = p.link.sent.size();
  p.b.agent.on_mad(p.a.addr, p.b.addr, kGsiQpn, mad);
  CHECK(p.b.agent.counter(CmCtr::RxUnknownConn) == 1);
  REQUIRE(p.link.sent.size() == before + 1);
  CHECK(p.link.sent.back() == Attr::Drep);
  p.pump();
  // A REP and an RTU for nothing.
  Rep r;
  r.remote_comm_id = 42;
  encode(std::span<uint8_t>(mad, kMadSize), 1, r);
  p.a.agent.on_mad(p.b.addr, p.a.addr, kGsiQpn, mad);
  CHECK(p.a.agent.counter(CmCtr::RxUnknownConn) >= 1);
  // A MAD not from QP1 and random bytes: counted, nothing else.
  p.a.agent.on_mad(p.b.addr, p.a.addr, 7, mad);
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    for (auto& x : mad) x = static_cast<uint8_t>(rng());
    if (i % 2) {  // a plausible CM header with random contents
      mad[0] = 1;
      mad[1] = kMgmtClassCm;
      mad[2] = kCmClassVersion;
      mad[3] = kMethodSend;
      mad[16] = 0;
      mad[17] = static_cast<uint8_t>(0x10 + rng() % 9);
    }
    p.a.agent.on_mad(p.b.addr, p.a.addr, kGsiQpn, mad);
    p.pump();
  }
  CHECK(p.a.agent.counter(CmCtr::RxBad) >= 9990);
  // The established connection is still there on both sides.
  bool up = false;
  for (auto& c : p.b.agent.connections())
    if (c.id == pas) up = c.state == ConnState::Established;
  CHECK(up);
}

TEST_CASE("cm agent: a MAD that cannot go out yet (MAC unknown) is sent as soon as it can", "[cm]") {
  Pair p;
  ConnId l = 0, act = 0;
  REQUIRE(p.b.agent.listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 0, &l) == 0);
  p.link.mac_known = false;
  REQUIRE(p.a.agent.connect(p.args(), 1, &act) == 0);
  CHECK(p.a.agent.counter(CmCtr::TxFail) == 1);
  p.advance(5'000'000);
  p.link.mac_known = true;
  p.advance(2'000'000);
  p.b.take(EventType::ConnectRequest);
  CHECK(p.a.agent.counter(CmCtr::TxFail) == 1);
  CHECK(p.a.agent.counter(CmCtr::Retries) == 0);
}

TEST_CASE("cm agent: the REQ carries what Linux's RDMA CM puts in one (test/data/rxe-cm.txt)", "[cm]") {
  Pair p;
  std::vector<Mad> seen;
  p.link.drop = [&](const Mad& m) {
    seen.push_back(m);
    return false;
  };
  ConnId act = 0;
  ConnectArgs c = p.args(7174);
  c.local.port = 0xe202;
  REQUIRE(p.a.agent.connect(c, 1, &act) == 0);
  REQUIRE(seen.size() == 1);
  Req r;
  REQUIRE(decode(std::span<const uint8_t>(seen[0].bytes, kMadSize), r) == MadError::None);
  CHECK(r.service_id == 0x0000000001061c06ull);
  CHECK(r.local_ca_guid == 0x1111);
  CHECK(r.local_qpn == 0x123);
  CHECK(r.remote_cm_response_timeout == 20);
  CHECK(r.local_cm_response_timeout == 20);
  CHECK(r.max_cm_retries == 15);
  CHECK(r.transport == CmTransport::Rc);
  CHECK(r.pkey == 0xffff);
  CHECK(r.path_mtu == 3);
  CHECK(r.starting_psn < (1u << 24));
  CHECK(r.primary.local_lid == 0xffff);
  CHECK(r.primary.remote_lid == 0xffff);
  CHECK(r.primary.local_gid == p.a.addr);
  CHECK(r.primary.remote_gid == p.b.addr);
  CHECK(r.primary.hop_limit == 64);
  CHECK(r.primary.flow_label == 0xb7a44);  // (0xe202 * 31 + 7174) & 0xfffff, as frame 1 of rxe-cm.pcap
  CHECK(r.primary.packet_rate == 0);
  CHECK_FALSE(r.has_alternate);
  CmaHdr h;
  REQUIRE(decode_cma_hdr(std::span<const uint8_t>(r.private_data, kReqPrivate), h));
  CHECK(h.ip_version == 4);
  CHECK(h.src_port == 0xe202);
  CHECK(h.src == p.a.addr);
  CHECK(h.dst == p.b.addr);
  CHECK(std::memcmp(r.private_data + kCmaHdrSize, "hello", 5) == 0);
  // TIDs: the REQ's is echoed by the REP, RTU and REJ of the exchange.
  MadHdr hr;
  REQUIRE(decode_hdr(std::span<const uint8_t>(seen[0].bytes, kMadSize), hr) == MadError::None);
  p.pump();
  REQUIRE(seen.size() == 2);  // the REJ (nobody listens on b)
  MadHdr hj;
  REQUIRE(decode_hdr(std::span<const uint8_t>(seen[1].bytes, kMadSize), hj) == MadError::None);
  CHECK(hj.attr_id == Attr::Rej);
  CHECK(hj.tid == hr.tid);
}

// cm::Gsi: QP1 on two transport engines joined by a memlink. Raw MADs first
// (a recording handler), then two real cm::Agents connecting through it, with
// MADs lost on the link.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "cm/agent.h"
#include "cm/gsi.h"
#include "memlink/memlink.h"

using namespace droce;
using namespace droce::cm;

namespace {

wire::MacAddr mac_of(int i) { return {0x02, 0, 0, 0, 0, static_cast<uint8_t>(i + 1)}; }
wire::Gid ip_of(int i, bool v6) {
  if (!v6) return wire::gid_from_ipv4(0x0A000001u + static_cast<uint32_t>(i));
  wire::Gid g{};
  g[0] = 0xFD;
  g[15] = static_cast<uint8_t>(i + 1);
  return g;
}

struct Rx {
  wire::Gid src, dst;
  uint32_t src_qp;
  std::vector<uint8_t> mad;
};

struct Node {
  Node(int i, memlink::Link& link, const io::Clock& clock, bool v6, GsiConfig gc = {})
      : port(link.add_port(mac_of(i))), ip(ip_of(i, v6)) {
    transport::EngineConfig ec;
    ec.mac = mac_of(i);
    ec.gid = ip;
    eng = std::make_unique<transport::Engine>(ec, port, clock);
    gc.pd = eng->alloc_pd();
    gsi = std::make_unique<Gsi>(
        *eng, gc,
        [this](const wire::Gid& dst, wire::MacAddr& mac) {
          ++resolves;
          auto it = neigh.find(dst);
          if (it == neigh.end()) return false;
          mac = it->second;
          return true;
        },
        [this](const wire::Gid& a) { return a == ip; });
    gsi->set_handler([this](const wire::Gid& s, const wire::Gid& d, uint32_t qp, std::span<const uint8_t> m) {
      rx.push_back({s, d, qp, {m.begin(), m.end()}});
    });
  }
  memlink::Port& port;
  wire::Gid ip;
  std::unique_ptr<transport::Engine> eng;
  std::unique_ptr<Gsi> gsi;
  std::map<wire::Gid, wire::MacAddr> neigh;
  std::vector<Rx> rx;
  int resolves = 0;
};

struct World {
  explicit World(bool v6 = false, GsiConfig gc = {}, uint64_t seed = 7)
      : link(clock, seed, 1024, 4096 + 256), a(0, link, clock, v6, gc), b(1, link, clock, v6, gc) {
    REQUIRE(a.gsi->open() == 0);
    REQUIRE(b.gsi->open() == 0);
    a.neigh[b.ip] = mac_of(1);
    b.neigh[a.ip] = mac_of(0);
  }
  // Polls engines and GSIs, advancing the virtual clock, `rounds` times.
  void run(int rounds = 50) {
    for (int i = 0; i < rounds; ++i) {
      a.eng->poll();
      b.eng->poll();
      a.gsi->poll();
      b.gsi->poll();
      clock.advance(1000);
    }
  }
  memlink::VirtualClock clock;
  memlink::Link link;
  Node a, b;
};

std::vector<uint8_t> mad_with(uint8_t seed) {
  std::vector<uint8_t> m(kMadSize);
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i * 7 + seed);
  return m;
}

}  // namespace

TEST_CASE("gsi: MADs between two engines reach the handler with the sender's address and QPN 1", "[cm][gsi]") {
  for (bool v6 : {false, true}) {
    INFO("ipv6 " << v6);
    World w(v6);
    CHECK(w.a.eng->qp(kGsiQpn) != nullptr);
    CHECK(w.a.eng->qp(kGsiQpn)->state == verbs::QpState::Rts);
    CHECK(w.a.gsi->is_local(w.a.ip));
    CHECK_FALSE(w.a.gsi->is_local(w.b.ip));
    for (uint8_t k = 0; k < 5; ++k) REQUIRE(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(k)));
    REQUIRE(w.b.gsi->send_mad(w.b.ip, w.a.ip, 0x20, mad_with(9)));
    w.run();
    REQUIRE(w.b.rx.size() == 5);
    for (uint8_t k = 0; k < 5; ++k) {
      CHECK(w.b.rx[k].src == w.a.ip);
      CHECK(w.b.rx[k].dst == w.b.ip);
      CHECK(w.b.rx[k].src_qp == kGsiQpn);
      CHECK(w.b.rx[k].mad == mad_with(k));
    }
    REQUIRE(w.a.rx.size() == 1);
    CHECK(w.a.rx[0].src == w.b.ip);
    CHECK(w.a.rx[0].mad == mad_with(9));
    CHECK(w.a.gsi->counter(GsiCtr::TxMads) == 5);
    CHECK(w.a.gsi->counter(GsiCtr::TxDone) == 5);
    CHECK(w.a.gsi->sends_in_flight() == 0);
    CHECK(w.b.gsi->counter(GsiCtr::RxMads) == 5);
    // A second Gsi on the same engine: QP1 exists once.
    GsiConfig gc;
    gc.pd = w.a.eng->alloc_pd();
    Gsi again(*w.a.eng, gc, nullptr, nullptr);
    CHECK(again.open() == EEXIST);
  }
}

TEST_CASE("gsi: more MADs than receive buffers arrive as the buffers are reposted", "[cm][gsi]") {
  GsiConfig gc;
  gc.recv_bufs = 2;
  gc.send_bufs = 2;
  World w(false, gc);
  for (uint8_t k = 0; k < 40; ++k) {
    REQUIRE(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(k)));
    w.run(4);
  }
  REQUIRE(w.b.rx.size() == 40);
  for (uint8_t k = 0; k < 40; ++k) CHECK(w.b.rx[k].mad == mad_with(k));
  CHECK(w.b.eng->counter(transport::Ctr::UdNoRecvDrop) == 0);
}

TEST_CASE("gsi: send_mad refuses while the MAC is unknown or the send buffers are in flight", "[cm][gsi]") {
  GsiConfig gc;
  gc.send_bufs = 2;
  World w(false, gc);
  // Unknown MAC: refused, asked once per call, nothing sent; the caller's retry succeeds.
  w.a.neigh.clear();
  CHECK_FALSE(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(1)));
  CHECK(w.a.resolves == 1);
  CHECK(w.a.gsi->counter(GsiCtr::TxNoMac) == 1);
  w.run();
  CHECK(w.b.rx.empty());
  w.a.neigh[w.b.ip] = mac_of(1);
  CHECK(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(1)));
  // Two buffers: the third MAD before any completion is refused.
  CHECK(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(2)));
  CHECK_FALSE(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(3)));
  CHECK(w.a.gsi->counter(GsiCtr::TxNoBuf) == 1);
  CHECK(w.a.gsi->sends_in_flight() == 2);
  w.run();
  CHECK(w.a.gsi->sends_in_flight() == 0);
  CHECK(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(3)));
  // Not 256 bytes: refused.
  std::vector<uint8_t> small(100);
  CHECK_FALSE(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, small));
  CHECK(w.a.gsi->counter(GsiCtr::TxBadArg) == 1);
  w.run();
  REQUIRE(w.b.rx.size() == 3);
  CHECK(w.b.rx[2].mad == mad_with(3));
}

TEST_CASE("gsi: datagrams to QP1 that are not MADs are counted and their buffers reused", "[cm][gsi]") {
  GsiConfig gc;
  gc.recv_bufs = 1;
  World w(false, gc);
  // An ordinary UD QP on A with QP1's Q_Key sends B's QP1 a short datagram and
  // one larger than a MAD.
  transport::Engine& e = *w.a.eng;
  const verbs::Pd pd = e.alloc_pd();
  verbs::Cq* cq = e.create_cq(16);
  verbs::QpInitAttr init;
  init.qp_type = verbs::QpType::UD;
  init.pd = pd.handle;
  init.send_cq = init.recv_cq = cq;
  init.cap.max_send_wr = 8;
  uint32_t qpn = 0;
  REQUIRE(e.create_qp(init, &qpn) == 0);
  verbs::QpAttr at;
  at.qp_state = verbs::QpState::Init;
  at.qkey = kGsiQkey;
  REQUIRE(e.modify_qp(qpn, at, verbs::kQpState | verbs::kQpPkeyIndex | verbs::kQpPort | verbs::kQpQkey) == 0);
  at.qp_state = verbs::QpState::Rtr;
  REQUIRE(e.modify_qp(qpn, at, verbs::kQpState) == 0);
  at.qp_state = verbs::QpState::Rts;
  REQUIRE(e.modify_qp(qpn, at, verbs::kQpState | verbs::kQpSqPsn) == 0);
  std::vector<uint8_t> buf(600, 0x33);
  uint32_t key = 0;
  REQUIRE(e.reg_mr(pd, buf.data(), buf.size(), verbs::kAccessLocalWrite, &key) == 0);
  verbs::Ah ah;
  ah.dmac = mac_of(1);
  ah.dgid = w.b.ip;
  auto send = [&](uint32_t len) {
    verbs::SendWr s;
    s.num_sge = 1;
    s.sg_list[0] = {reinterpret_cast<uint64_t>(buf.data()), len, key};
    s.ud = {&ah, kGsiQpn, kGsiQkey};
    REQUIRE(e.post_send(qpn, s) == 0);
    w.run(10);
  };
  send(100);
  CHECK(w.b.gsi->counter(GsiCtr::RxShort) == 1);
  send(400);
  CHECK(w.b.gsi->counter(GsiCtr::RxErr) == 1);  // larger than GRH + MAD: LOC_LEN_ERR
  CHECK(w.b.rx.empty());
  // The one receive buffer is back: a MAD still arrives.
  REQUIRE(w.a.gsi->send_mad(w.a.ip, w.b.ip, 0, mad_with(4)));
  w.run(10);
  REQUIRE(w.b.rx.size() == 1);
  CHECK(w.b.rx[0].mad == mad_with(4));
  CHECK(w.b.gsi->counter(GsiCtr::RxMads) == 1);
}

namespace {

// A Node's Gsi driving a real Agent; events recorded.
struct AgentNode {
  AgentNode(Node& n, uint64_t guid) : node(n) {
    AgentConfig c;
    c.ca_guid = guid;
    c.seed = guid;
    c.cm_response_timeout = 12;  // ~16 ms per retry: short in virtual time
    agent = std::make_unique<Agent>(c, *n.gsi, [this](const Event& e) { events.push_back(e); });
    n.gsi->attach(*agent);
  }
  bool take(EventType t, Event* out = nullptr) {
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].type == t) {
        if (out) *out = events[i];
        events.erase(events.begin() + static_cast<long>(i));
        return true;
      }
    return false;
  }
  Node& node;
  std::unique_ptr<Agent> agent;
  std::vector<Event> events;
};

}  // namespace

TEST_CASE("gsi: two Agents connect and disconnect through QP1 while the link loses MADs", "[cm][gsi]") {
  for (bool v6 : {false, true}) {
    INFO("ipv6 " << v6);
    World w(v6, {}, v6 ? 21 : 12);
    AgentNode a(w.a, 0x1111), b(w.b, 0x2222);
    ConnId l = 0, act = 0, pas = 0;
    REQUIRE(b.agent->listen(PortSpace::Tcp, {{}, 7471}, QpKind::Rc, 99, &l) == 0);
    a.agent->tick(w.clock.now_ns());
    b.agent->tick(w.clock.now_ns());
    // The first REQ is lost for sure.
    w.a.port.set_faults({.loss = 1.0});
    ConnectArgs c;
    c.local = {w.a.ip, 40000};
    c.remote = {w.b.ip, 7471};
    c.param.qpn = 0x123;
    REQUIRE(a.agent->connect(c, 5, &act) == 0);
    w.a.eng->poll();
    CHECK(w.link.counter(memlink::Counter::Lost) == 1);
    // Then every frame either way is lost with probability 0.3.
    memlink::Faults f;
    f.loss = 0.3;
    w.link.set_faults(f);
    bool accepted = false, established_a = false, established_b = false;
    auto step = [&] {
      w.a.eng->poll();
      w.b.eng->poll();
      w.a.gsi->poll();
      w.b.gsi->poll();
      a.agent->tick(w.clock.now_ns());
      b.agent->tick(w.clock.now_ns());
      w.clock.advance(100'000);
    };
    for (int i = 0; i < 200'000 && !(established_a && established_b); ++i) {
      step();
      Event e;
      if (!accepted && b.take(EventType::ConnectRequest, &e)) {
        pas = e.id;
        CHECK(e.remote.ip == w.a.ip);
        CHECK(e.local.ip == w.b.ip);
        ConnParam acc;
        acc.qpn = 0x456;
        REQUIRE(b.agent->accept(pas, acc) == 0);
        accepted = true;
      }
      if (!established_a && a.take(EventType::ConnectResponse, &e)) {
        CHECK(e.param.qpn == 0x456);
        REQUIRE(a.agent->establish(act) == 0);
        established_a = true;
      }
      if (b.take(EventType::Established)) established_b = true;
      REQUIRE_FALSE(a.take(EventType::Unreachable));
      REQUIRE_FALSE(b.take(EventType::Unreachable));
    }
    REQUIRE(established_a);
    REQUIRE(established_b);
    CHECK(w.link.counter(memlink::Counter::Lost) > 0);
    CHECK(a.agent->counter(CmCtr::Retries) > 0);
    QpParams qa;
    REQUIRE(a.agent->qp_params(act, qa) == 0);
    CHECK(qa.dest_qpn == 0x456);
    CHECK(qa.dgid == w.b.ip);

    // Disconnect through the same lossy link: both sides see Disconnected.
    REQUIRE(a.agent->disconnect(act) == 0);
    bool da = false, db = false;
    for (int i = 0; i < 200'000 && !(da && db); ++i) {
      step();
      if (a.take(EventType::Disconnected)) da = true;
      if (b.take(EventType::Disconnected)) db = true;
    }
    CHECK(da);
    CHECK(db);
    CHECK(w.a.gsi->counter(GsiCtr::RxShort) + w.a.gsi->counter(GsiCtr::RxErr) == 0);
    CHECK(a.agent->counter(CmCtr::RxBad) == 0);
    CHECK(b.agent->counter(CmCtr::RxBad) == 0);
  }
}

#include "cm_frames.h"

#include <cstring>
#include <deque>

#include "cm/agent.h"
#include "cm_samples.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace droce::cm::frames {

std::vector<uint8_t> cm_frame(std::span<const uint8_t> mad, const Addr& a) {
  if (mad.size() < kMadSize) return {};
  wire::Headers h;
  h.l2.src = a.src_mac;
  h.l2.dst = a.dst_mac;
  h.l3.src = wire::gid_from_ipv4(a.src_ip);
  h.l3.dst = wire::gid_from_ipv4(a.dst_ip);
  h.l4.sport = a.sport;
  h.bth.opcode = wire::op::UD_SEND_ONLY;
  h.bth.pkey = kDefaultPkey;
  h.bth.dqpn = kGsiQpn;
  h.bth.psn = a.psn;
  h.ext.deth.qkey = kGsiQkey;
  h.ext.deth.sqpn = kGsiQpn;
  std::vector<uint8_t> f(wire::frame_len(h, kMadSize));
  const size_t n = wire::build_frame(f, h, mad.first(kMadSize));
  f.resize(n);
  return f;
}

namespace {

template <typename M>
Sample make(const std::string& name, const M& m, uint64_t tid, bool from_a, uint32_t psn) {
  std::array<uint8_t, kMadSize> mad{};
  encode(mad, tid, m);
  Addr a;
  a.src_ip = from_a ? samples::kIpA : samples::kIpB;
  a.dst_ip = from_a ? samples::kIpB : samples::kIpA;
  a.src_mac = from_a ? std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0A} : std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0B};
  a.dst_mac = from_a ? std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0B} : std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0A};
  a.psn = psn;
  MadHdr h;
  (void)decode_hdr(mad, h);
  return Sample{h.attr_id, name, tid, mad, cm_frame(mad, a)};
}

}  // namespace

std::vector<Sample> sample_frames() {
  std::vector<Sample> v;
  v.push_back(make("REQ", samples::req(), 0x1000000000000001ull, true, 1));
  v.push_back(make("REQ+alt", samples::req_alt(), 0x1000000000000002ull, true, 2));
  v.push_back(make("MRA", samples::mra(), 0x1000000000000001ull, false, 1));
  v.push_back(make("REP", samples::rep(), 0x2000000000000003ull, false, 2));
  v.push_back(make("RTU", samples::rtu(), 0x1000000000000004ull, true, 3));
  v.push_back(make("REJ", samples::rej(), 0x2000000000000005ull, false, 3));
  v.push_back(make("DREQ", samples::dreq(), 0x1000000000000006ull, true, 4));
  v.push_back(make("DREP", samples::drep(), 0x2000000000000007ull, false, 4));
  v.push_back(make("SIDR_REQ", samples::sidr_req(), 0x1000000000000008ull, true, 5));
  v.push_back(make("SIDR_REP", samples::sidr_rep(), 0x2000000000000009ull, false, 5));
  return v;
}

namespace {

bool write_frames(const std::string& path, std::vector<Sample> v, std::string& err) {
  std::vector<pcapio::Frame> out;
  double ts = 1.0e9;
  for (auto& s : v) {
    if (s.frame.empty()) {
      err = "could not build the " + s.name + " frame";
      return false;
    }
    out.push_back(pcapio::Frame{ts, std::move(s.frame)});
    ts += 0.001;
  }
  return pcapio::write_pcap(path, out, err);
}

// Two Agents on an in-memory link; every MAD sent is kept as a frame.
struct Node;
struct Link {
  std::deque<std::pair<Node*, std::array<uint8_t, kMadSize>>> q;
  std::vector<Sample> sent;
};

struct Node final : Agent::Io {
  Node(Link& l, uint32_t ip, uint8_t mac_last, AgentConfig cfg)
      : link(l), ip4(ip), addr(wire::gid_from_ipv4(ip)), mac{0x02, 0, 0, 0, 0, mac_last},
        agent(cfg, *this, [this](const Event& e) { events.push_back(e); }) {}
  bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t, std::span<const uint8_t> mad) override {
    if (mad.size() < kMadSize || local != addr || remote != peer->addr) return false;
    std::array<uint8_t, kMadSize> m;
    std::memcpy(m.data(), mad.data(), kMadSize);
    MadHdr h;
    (void)decode_hdr(m, h);
    Addr a;
    a.src_ip = ip4;
    a.dst_ip = peer->ip4;
    a.src_mac = mac;
    a.dst_mac = peer->mac;
    a.psn = static_cast<uint32_t>(link.sent.size());
    link.sent.push_back(Sample{h.attr_id, attr_name(h.attr_id), h.tid, m, cm_frame(m, a)});
    link.q.emplace_back(peer, m);
    return true;
  }
  bool is_local(const wire::Gid& ip) const override { return ip == addr; }
  // The last event of type t (and forgets the events).
  bool take(EventType t, Event& out) {
    bool found = false;
    for (const auto& e : events)
      if (e.type == t) out = e, found = true;
    events.clear();
    return found;
  }
  Link& link;
  uint32_t ip4;
  wire::Gid addr;
  std::array<uint8_t, 6> mac;
  Node* peer = nullptr;
  Agent agent;
  std::vector<Event> events;
};

}  // namespace

bool write_samples(const std::string& path, std::string& err) { return write_frames(path, sample_frames(), err); }

std::vector<Sample> agent_frames(std::string& err) {
  Link link;
  AgentConfig cfg;
  cfg.mra_after_ns = 2'000'000;  // MRA when the passive program takes more than 2 ms
  cfg.ca_guid = 0x02000000000000A1ull;
  cfg.seed = 11;
  Node a(link, samples::kIpA, 0x0A, cfg);
  cfg.ca_guid = 0x02000000000000B2ull;
  cfg.seed = 22;
  Node b(link, samples::kIpB, 0x0B, cfg);
  a.peer = &b;
  b.peer = &a;
  uint64_t now = 1'000'000'000;
  a.agent.tick(now);
  b.agent.tick(now);
  auto pump = [&] {
    for (int i = 0; i < 100 && !link.q.empty(); ++i) {
      auto [to, m] = link.q.front();
      link.q.pop_front();
      to->agent.on_mad(to->peer->addr, to->addr, kGsiQpn, m);
    }
  };
  auto fail = [&](const char* what) {
    err = std::string("agent exchange: ") + what;
    return std::vector<Sample>{};
  };
  ConnectArgs rc;
  rc.local = {a.addr, 40000};
  rc.remote = {b.addr, samples::kTcpPort};
  rc.param.qpn = 0x000123;
  rc.param.responder_resources = 4;
  rc.param.initiator_depth = 2;
  rc.param.private_data_len = 5;
  std::memcpy(rc.param.private_data, "hello", 5);
  rc.path_mtu = 5;
  rc.traffic_class = 0x60;

  // RC: REQ, MRA (b slow), REP, RTU, DREQ, DREP.
  ConnId listener = 0, act = 0;
  Event e;
  if (b.agent.listen(PortSpace::Tcp, {{}, samples::kTcpPort}, QpKind::Rc, 1, &listener) != 0) return fail("listen");
  if (a.agent.connect(rc, 2, &act) != 0) return fail("connect");
  pump();
  if (!b.take(EventType::ConnectRequest, e)) return fail("no ConnectRequest");
  const ConnId pas = e.id;
  now += 5'000'000;
  a.agent.tick(now);
  b.agent.tick(now);
  pump();
  ConnParam acc;
  acc.qpn = 0x000456;
  acc.responder_resources = 2;
  acc.initiator_depth = 4;
  acc.private_data_len = 3;
  std::memcpy(acc.private_data, "yes", 3);
  if (b.agent.accept(pas, acc) != 0) return fail("accept");
  pump();
  if (!a.take(EventType::ConnectResponse, e)) return fail("no ConnectResponse");
  if (a.agent.establish(act) != 0) return fail("establish");
  pump();
  if (a.agent.disconnect(act) != 0) return fail("disconnect");
  pump();
  // RC rejected: REQ, REJ.
  ConnId act2 = 0;
  rc.local.port = 40001;
  if (a.agent.connect(rc, 3, &act2) != 0) return fail("second connect");
  pump();
  if (!b.take(EventType::ConnectRequest, e)) return fail("no second ConnectRequest");
  const uint8_t no[] = {'n', 'o'};
  if (b.agent.reject(e.id, no) != 0) return fail("reject");
  pump();
  // UD: SIDR_REQ, SIDR_REP OK; SIDR_REQ, SIDR_REP reject.
  ConnId ulisten = 0, uact = 0;
  if (b.agent.listen(PortSpace::Udp, {{}, samples::kUdpPort}, QpKind::Ud, 4, &ulisten) != 0) return fail("UD listen");
  ConnectArgs ud = rc;
  ud.kind = QpKind::Ud;
  ud.ps = PortSpace::Udp;
  ud.remote.port = samples::kUdpPort;
  ud.local.port = 40002;
  for (int round = 0; round < 2; ++round) {
    if (a.agent.connect(ud, 5, &uact) != 0) return fail("UD connect");
    pump();
    if (!b.take(EventType::ConnectRequest, e)) return fail("no UD ConnectRequest");
    if (round == 0) {
      ConnParam up;
      up.qpn = 0x000789;
      up.qkey = kUdpQkey;
      if (b.agent.accept(e.id, up) != 0) return fail("UD accept");
    } else if (b.agent.reject(e.id, no) != 0) {
      return fail("UD reject");
    }
    pump();
    ud.local.port = 40003;
  }
  if (!link.q.empty()) return fail("MADs left in flight");
  return std::move(link.sent);
}

bool write_agent_frames(const std::string& path, std::string& err) {
  auto v = agent_frames(err);
  if (v.empty()) return false;
  return write_frames(path, std::move(v), err);
}

}  // namespace droce::cm::frames

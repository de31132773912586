// Test harness: engines joined by a memlink, QPs brought up to RTS, and a
// bounded run loop on the virtual clock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include <catch2/catch.hpp>

#include "memlink/memlink.h"
#include "transport/engine.h"
#include "wire/packet.h"

namespace droce::test {

using namespace droce::transport;
using namespace droce::verbs;

inline wire::MacAddr mac_of(int i) { return {0x02, 0, 0, 0, 0, static_cast<uint8_t>(i + 1)}; }
inline wire::Gid gid_of(int i) { return wire::gid_from_ipv4(0x0A000001u + static_cast<uint32_t>(i)); }

inline wire::Gid gid6_of(int i) {
  wire::Gid g{};
  g[0] = 0xFD;  // a unique-local IPv6 address
  g[15] = static_cast<uint8_t>(i + 1);
  return g;
}

struct Node {
  Node(int index, memlink::Link& link, const io::Clock& clock, EngineConfig cfg, bool ipv6 = false)
      : port(link.add_port(mac_of(index))), idx(index), v6(ipv6) {
    cfg.mac = mac_of(index);
    cfg.gid = ipv6 ? gid6_of(index) : gid_of(index);
    eng = std::make_unique<Engine>(cfg, port, clock);
    pd = eng->alloc_pd();
    scq = eng->create_cq(1 << 16);
    rcq = eng->create_cq(1 << 16);
  }
  // A registered buffer.
  struct Buf {
    std::vector<uint8_t> mem;
    uint32_t key = 0;
    uint64_t addr() const { return reinterpret_cast<uint64_t>(mem.data()); }
  };
  Buf& buffer(size_t len, uint32_t access = kAccessAll) {
    bufs.push_back(std::make_unique<Buf>());
    Buf& b = *bufs.back();
    b.mem.assign(len ? len : 1, 0);
    if (eng->reg_mr(pd, b.mem.data(), b.mem.size(), access, &b.key) != 0) throw std::runtime_error("reg_mr");
    return b;
  }
  Ah ah() const {
    Ah a;
    a.dmac = mac_of(idx);
    a.dgid = v6 ? gid6_of(idx) : gid_of(idx);
    a.vlan = vlan;
    a.vlan_tci = vlan_tci;
    return a;
  }
  std::vector<Wc> drain(Cq* cq) {
    std::vector<Wc> out;
    Wc wc[64];
    int n;
    while ((n = cq->poll(wc, 64)) > 0) out.insert(out.end(), wc, wc + n);
    return out;
  }

  memlink::Port& port;
  int idx;
  bool v6 = false;
  bool vlan = false;  // peers reach this node through a VLAN tag
  uint16_t vlan_tci = 0;
  std::unique_ptr<Engine> eng;
  Pd pd;
  Cq* scq;
  Cq* rcq;
  std::vector<std::unique_ptr<Buf>> bufs;
};

struct QpOpts {
  Mtu mtu = Mtu::M1024;
  uint8_t timeout = 10;  // 4.2 ms
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;  // 10 us
  uint8_t max_rd_atomic = 16;
  uint32_t sq_psn = 100;
  uint32_t rq_psn = 5000;
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  uint32_t qkey = 0x11111111;
  Srq* srq_a = nullptr;
  Srq* srq_b = nullptr;
};

class World {
 public:
  explicit World(uint64_t seed, int nodes = 2, EngineConfig cfg = {}, uint32_t pool = 4096, bool ipv6 = false)
      : link(clock, seed, pool, 4096 + 256) {
    for (int i = 0; i < nodes; ++i) node.push_back(std::make_unique<Node>(i, link, clock, cfg, ipv6));
  }

  uint32_t create_qp(Node& n, QpType t, const QpOpts& o, Srq* srq) {
    QpInitAttr init;
    init.qp_type = t;
    init.pd = n.pd.handle;
    init.send_cq = n.scq;
    init.recv_cq = n.rcq;
    init.srq = srq;
    init.cap.max_send_wr = o.max_send_wr;
    init.cap.max_recv_wr = o.max_recv_wr;
    uint32_t qpn = 0;
    if (n.eng->create_qp(init, &qpn) != 0) throw std::runtime_error("create_qp");
    return qpn;
  }

  int to_rts(Node& n, uint32_t qpn, QpType t, const QpOpts& o, const Node& peer, uint32_t peer_qpn, uint32_t sq_psn,
             uint32_t rq_psn) {
    QpAttr a;
    a.qp_state = QpState::Init;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic | kAccessLocalWrite;
    a.qkey = o.qkey;
    uint32_t m = kQpState | kQpPkeyIndex | kQpPort | (t == QpType::UD ? kQpQkey : kQpAccessFlags);
    if (int rc = n.eng->modify_qp(qpn, a, m)) return rc;
    a.qp_state = QpState::Rtr;
    a.path_mtu = o.mtu;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah_attr = peer.ah();
    m = kQpState;
    if (t == QpType::RC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
    if (t == QpType::UC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
    if (t == QpType::UD) m |= 0;
    if (int rc = n.eng->modify_qp(qpn, a, m)) return rc;
    if (t == QpType::UD) REQUIRE(n.eng->qp(qpn)->mtu == mtu_bytes(n.eng->config().port_mtu));
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = o.max_rd_atomic;
    m = kQpState | kQpSqPsn;
    if (t == QpType::RC) m |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
    return n.eng->modify_qp(qpn, a, m);
  }

  // A connected pair of QPs between node ia and ib. Returns {qpn on a, qpn on b}.
  std::pair<uint32_t, uint32_t> connect(int ia, int ib, QpType t, const QpOpts& o = {}) {
    Node& a = *node[ia];
    Node& b = *node[ib];
    const uint32_t qa = create_qp(a, t, o, o.srq_a), qb = create_qp(b, t, o, o.srq_b);
    if (to_rts(a, qa, t, o, b, qb, o.sq_psn, o.rq_psn) || to_rts(b, qb, t, o, a, qa, o.rq_psn, o.sq_psn))
      throw std::runtime_error("to_rts");
    return {qa, qb};
  }

  // Polls every engine; when nothing moves, jumps the clock to the next event.
  // Stops when done() holds or after max_iters / max_virtual_ns. Returns done().
  template <typename Pred>
  bool run(Pred done, uint64_t max_iters = 2'000'000, uint64_t max_virtual_ns = 60'000'000'000ull) {
    const uint64_t t0 = clock.now_ns();
    for (uint64_t it = 0; it < max_iters; ++it) {
      if (done()) return true;
      uint32_t work = 0;
      for (auto& n : node) work += n->eng->poll();
      if (work == 0) {
        uint64_t next = link.next_delivery_ns();
        for (auto& n : node) next = std::min(next, n->eng->next_timer_ns());
        bool busy = false;
        for (auto& n : node) busy |= !n->eng->idle();
        if (next == UINT64_MAX && !busy) return done();
        // Timers are checked every timer_scan_ns: step at least that far.
        clock.set(next == UINT64_MAX ? clock.now_ns() + 1000 : std::max(next, clock.now_ns() + 1000));
      }
      if (clock.now_ns() - t0 > max_virtual_ns) return done();
    }
    return done();
  }
  void settle() {
    run([] { return false; }, 200000, 2'000'000'000ull);
  }
  // Runs until cq of node n has given at least count completions (or run()
  // gives up, max_iters as run's); returns all it gave, in order.
  std::vector<Wc> wait_wcs(Node& n, Cq* cq, size_t count, uint64_t max_iters = 2'000'000) {
    std::vector<Wc> got;
    run(
        [&] {
          auto x = n.drain(cq);
          got.insert(got.end(), x.begin(), x.end());
          return got.size() >= count;
        },
        max_iters);
    return got;
  }

  memlink::VirtualClock clock;
  memlink::Link link;
  std::vector<std::unique_ptr<Node>> node;
};

// Frames recorded on the link, parsed.
struct Seen {
  uint16_t from;
  wire::PacketView v;
  std::vector<uint8_t> bytes;
};
inline std::vector<Seen> parsed(memlink::Link& link) {
  std::vector<Seen> out;
  for (auto& r : link.recorded()) {
    Seen s{r.from_port, {}, r.bytes};
    if (wire::parse_frame(s.bytes, s.v) == wire::ParseError::Ok) out.push_back(std::move(s));
  }
  for (auto& s : out) {  // re-point views into the stored bytes
    wire::parse_frame(s.bytes, s.v);
  }
  return out;
}

// The MR is still registered but was invalidated (SEND_WITH_INV): a lookup of its own range
// fails with Invalidated. (A lookup outside its range would fail anyway and prove nothing.)
inline bool mr_invalidated(Node& n, const Node::Buf& b) {
  MrError err = MrError::Ok;
  return n.eng->mrs().lookup(b.key, n.pd.handle, b.addr(), b.mem.size(), 0, &err) == nullptr &&
         err == MrError::Invalidated;
}
inline bool mr_valid(Node& n, const Node::Buf& b) {
  return n.eng->mrs().lookup(b.key, n.pd.handle, b.addr(), b.mem.size(), kAccessAll, nullptr) != nullptr;
}

// Runs the world until `count` completions arrived on cq (World::wait_wcs).
inline std::vector<Wc> wait_wcs(World& w, Node& n, Cq* cq, size_t count) { return w.wait_wcs(n, cq, count); }

inline void fill_random(std::vector<uint8_t>& v, uint64_t seed) {
  std::mt19937_64 r(seed);
  for (auto& b : v) b = static_cast<uint8_t>(r());
}

inline SendWr make_wr(uint64_t id, WrOpcode op, const Node::Buf& local, uint64_t off, uint32_t len) {
  SendWr wr;
  wr.wr_id = id;
  wr.opcode = op;
  wr.send_flags = kSendSignaled;
  wr.num_sge = 1;
  wr.sg_list[0] = {local.addr() + off, len, local.key};
  return wr;
}

// One signaled RC WRITE of len bytes from a fresh buffer of node a (random
// bytes of seed) into a fresh buffer of node b, posted on a's QP qpn (wr_id 1).
struct PostedWrite {
  Node::Buf& src;
  Node::Buf& dst;
  bool data_ok() const { return std::equal(src.mem.begin(), src.mem.end(), dst.mem.begin()); }
};
inline PostedWrite post_write(Node& a, Node& b, uint32_t qpn, uint32_t len, uint64_t seed) {
  auto& src = a.buffer(len);
  auto& dst = b.buffer(len);
  fill_random(src.mem, seed);
  SendWr wr = make_wr(1, WrOpcode::RdmaWrite, src, 0, len);
  wr.rdma = {dst.addr(), dst.key};
  if (a.eng->post_send(qpn, wr) != 0) throw std::runtime_error("post_write: post_send");
  return {src, dst};
}

inline RecvWr make_recv(uint64_t id, const Node::Buf& b, uint64_t off, uint32_t len) {
  RecvWr wr;
  wr.wr_id = id;
  wr.num_sge = 1;
  wr.sg_list[0] = {b.addr() + off, len, b.key};
  return wr;
}

}  // namespace droce::test

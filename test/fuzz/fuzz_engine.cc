// libFuzzer target for the transport engine as a whole (responder, completer,
// requester, timers), not only the parser. Each input is a program run against
// a fresh transport::Engine on a memlink port, with a raw peer port next to it:
//
//   setup  RC QP A (own RQ, MTU 256, all remote rights, 4 responder resources),
//          RC QP B (SRQ, MTU 512, remote write only, 1 resource), UC QP (RQ,
//          MTU 256), UD QP (RQ), RC QP in RTR (SRQ) and RC QP in INIT; eight
//          MRs with different rights in one arena with guard bytes between
//          them; receive WRs posted. One setup byte picks start PSNs (some
//          just below the 24-bit wrap).
//   ops    frames from the peer (any opcode of the table, PSN relative to what
//          the QP expects, RETH/AETH/AtomicETH/DETH/ImmDt/IETH fields aimed at
//          the MRs, payload length around the MTU, valid ICRC computed here,
//          some with a bad ICRC, a spoofed source, a wrong P_Key, CE marked),
//          time advances on the virtual clock (ACK timeouts, RNR waits),
//          local post_send / post_recv, MR dereg and re-reg, QP state changes.
//
// After every op the engine is polled until idle and these must hold (else
// abort, so libFuzzer keeps the input):
//   - memory: guard bytes, MRs with no rights and deregistered MRs are
//     poisoned for ASan (any read or write of them is reported); registered
//     MRs change only as the op allows: a WRITE only the MR its rkey names
//     (with remote write), an atomic only the MR with remote atomic, a SEND only
//     receive buffers, a READ response / atomic ACK only local buffers of the
//     DUT's own READ/atomic WRs, anything else nothing;
//   - completions: each WR completes exactly once (SQ and RQ in order), with
//     a valid status and opcode, byte_len within the posted buffer; no CQ
//     overrun; at the end every QP is moved to ERR and every WR must have
//     completed;
//   - the link: every frame the engine sends parses with a valid ICRC, from
//     its MAC/GID to the peer's MAC, payload <= port MTU;
//   - counters: rx_frames = frames sent to it, rx_icrc_err = bad ICRCs sent,
//     rx_parse_err = 0, tx_frames = frames the peer received, PSNs 24-bit;
//   - no memlink buffer is leaked once the engine is destroyed.
#include <sanitizer/asan_interface.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "memlink/memlink.h"
#include "transport/engine.h"
#include "wire/packet.h"

using namespace droce;
using namespace droce::transport;
using namespace droce::verbs;

namespace {

[[noreturn]] void fail(const char* what, uint64_t a = 0, uint64_t b = 0) {
  std::fprintf(stderr, "fuzz_engine: invariant violated: %s (%llu, %llu)\n", what, static_cast<unsigned long long>(a),
               static_cast<unsigned long long>(b));
  std::abort();
}
#define CHECK_OR(cond, what, a, b) \
  do {                             \
    if (!(cond)) fail(what, a, b); \
  } while (0)

class Clock final : public io::Clock {
 public:
  uint64_t now_ns() const noexcept override { return now_; }
  uint64_t now_ = 0;
};

// ---- input reader: zeros once the input is used up ----
struct In {
  const uint8_t* p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return u16() | (uint32_t{u16()} << 16); }
  uint64_t u64() { return u32() | (uint64_t{u32()} << 32); }
};

// ---- addresses ----
constexpr wire::MacAddr kDutMac{0x02, 0, 0, 0, 0, 1};
constexpr wire::MacAddr kPeerMac{0x02, 0, 0, 0, 0, 2};
constexpr wire::Gid kDutGid = wire::gid_from_ipv4(0x0A000001);
constexpr wire::Gid kPeerGid = wire::gid_from_ipv4(0x0A000002);
constexpr wire::Gid kSpoofGid = wire::gid_from_ipv4(0x0A000063);
constexpr uint32_t kPeerQpn = 0x77;
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kPortMtu = 1024;

// ---- memory: one arena, regions separated by guards ----
enum Region : int { kAll, kRonly, kWonly, kAtom, kNone, kRecv, kLocal, kOdd, kNumRegions };
struct RegionDef {
  uint32_t len;
  uint32_t access;
};
constexpr RegionDef kRegionDefs[kNumRegions] = {
    {2048, kAccessAll},
    {1000, kAccessRemoteRead},
    {1024, kAccessLocalWrite | kAccessRemoteWrite},
    {64, kAccessLocalWrite | kAccessRemoteAtomic},
    {256, 0},
    {4096, kAccessLocalWrite},
    {4096, kAccessLocalWrite},
    {333, kAccessAll},
};
constexpr uint32_t kGuard = 64;
constexpr uint32_t round64(uint32_t v) { return (v + 63) & ~63u; }
constexpr uint32_t region_off(int r) {
  uint32_t off = kGuard;
  for (int i = 0; i < r; ++i) off += round64(kRegionDefs[i].len) + kGuard;
  return off;
}
constexpr uint32_t kArena = region_off(kNumRegions);
alignas(64) uint8_t g_arena[kArena];
uint8_t g_snap[kArena];

// ---- QPs ----
enum QpIdx : int { kA, kB, kUc, kUd, kRtr, kInit, kNumQps };

struct Track {  // outstanding WRs of one queue, in post order
  static constexpr uint32_t kCap = 64;
  uint64_t id[kCap];
  uint32_t len[kCap];
  uint8_t opc[kCap];
  uint32_t head = 0, tail = 0;
  uint32_t count() const { return head - tail; }
  void push(uint64_t i, uint32_t l, uint8_t o) {
    if (count() >= kCap) fail("track overflow");
    id[head % kCap] = i;
    len[head % kCap] = l;
    opc[head % kCap] = o;
    ++head;
  }
};

struct World {
  // Built once: the link and its two ports (drained between inputs).
  Clock clock;
  memlink::Link link{clock, 1, 1024, 4096 + 256};
  memlink::Port& dut_port = link.add_port(kDutMac);
  memlink::Port& peer = link.add_port(kPeerMac);

  // Per input.
  std::unique_ptr<Engine> eng;
  Pd pd;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  Srq* srq = nullptr;
  const Ah* ah = nullptr;
  uint32_t qpn[kNumQps]{};
  uint32_t key[kNumRegions]{};
  uint32_t access[kNumRegions]{};
  bool reg[kNumRegions]{};
  uint32_t write_mask[kNumQps]{};  // regions a multi-packet WRITE on this QP may be writing
  uint32_t recv_mask = 0;          // regions receive WRs point at
  uint32_t local_mask = 0;         // regions the DUT's READ/atomic WRs write their results to
  Track sq[kNumQps], rq[kNumQps], srq_t;
  uint64_t seq = 0;
  uint64_t sent = 0, bad_icrc = 0, received = 0;
  uint8_t payload[4096];
};

World* g_w = nullptr;

uint8_t* region_ptr(int r) { return g_arena + region_off(r); }
uint64_t region_addr(int r) { return reinterpret_cast<uint64_t>(region_ptr(r)); }

// A region whose bytes no one may touch: poisoned, so ASan reports any access.
bool region_poisoned(const World& w, int r) { return !w.reg[r] || w.access[r] == 0; }
void update_poison(const World& w, int r) {
  if (region_poisoned(w, r))
    ASAN_POISON_MEMORY_REGION(region_ptr(r), kRegionDefs[r].len);
  else
    ASAN_UNPOISON_MEMORY_REGION(region_ptr(r), kRegionDefs[r].len);
}

void reset_arena() {
  static uint8_t pattern[kArena];
  static bool init = false;
  if (!init) {
    for (uint32_t i = 0; i < kArena; ++i) pattern[i] = static_cast<uint8_t>(i * 131u ^ 0x5A);
    init = true;
  }
  ASAN_UNPOISON_MEMORY_REGION(g_arena, kArena);
  std::memcpy(g_arena, pattern, kArena);
  // Guards (and the padding up to the next 64 bytes) are always poisoned.
  ASAN_POISON_MEMORY_REGION(g_arena, kGuard);
  for (int r = 0; r < kNumRegions; ++r) {
    const uint32_t end = region_off(r) + kRegionDefs[r].len;
    ASAN_POISON_MEMORY_REGION(g_arena + end, region_off(r + 1) - end);
  }
}

void snapshot(const World& w) {
  for (int r = 0; r < kNumRegions; ++r)
    if (!region_poisoned(w, r)) std::memcpy(g_snap + region_off(r), region_ptr(r), kRegionDefs[r].len);
}

// Regions that changed since snapshot() must all be in `allowed`.
void check_writes(const World& w, uint32_t allowed, const char* what) {
  for (int r = 0; r < kNumRegions; ++r) {
    if (region_poisoned(w, r) || (allowed & (1u << r))) continue;
    if (std::memcmp(g_snap + region_off(r), region_ptr(r), kRegionDefs[r].len) != 0) {
      std::fprintf(stderr, "fuzz_engine: region %d (access %u) written by %s\n", r, w.access[r], what);
      fail("write to memory the op may not write", static_cast<uint64_t>(r), allowed);
    }
  }
}

// The region an rkey names, if registered with all of `need`: its bit, else 0.
uint32_t region_of_key(const World& w, uint32_t rkey, uint32_t need) {
  for (int r = 0; r < kNumRegions; ++r)
    if (w.reg[r] && w.key[r] == rkey && (w.access[r] & need) == need) return 1u << r;
  return 0;
}

// ---- completions ----
// FUZZ_ENGINE_TRACE=1: print every op, completion and the engine's counters (to read what an input does).
bool g_trace = false;

void check_wc(World& w, const Wc& wc, bool send) {
  if (g_trace)
    std::fprintf(stderr, "  wc %s wr_id %016llx qp %u status %s opcode %u len %u\n", send ? "send" : "recv",
                 static_cast<unsigned long long>(wc.wr_id), wc.qp_num, wc_status_str(wc.status),
                 static_cast<unsigned>(wc.opcode), wc.byte_len);
  CHECK_OR(static_cast<uint8_t>(wc.status) <= static_cast<uint8_t>(WcStatus::GeneralErr), "wc status",
           static_cast<uint8_t>(wc.status), 0);
  CHECK_OR((wc.wc_flags & ~(kWcGrh | kWcWithImm | kWcIpCsumOk | kWcWithInv)) == 0, "wc flags", wc.wc_flags, 0);
  const uint32_t q = static_cast<uint32_t>(wc.wr_id >> 56);
  if (send) {
    CHECK_OR(q < kNumQps && wc.qp_num == w.qpn[q], "send wc queue/qp", q, wc.qp_num);
    Track& t = w.sq[q];
    CHECK_OR(t.count() > 0 && t.id[t.tail % Track::kCap] == wc.wr_id, "send wc not the oldest outstanding WR",
             wc.wr_id, t.count());
    CHECK_OR(static_cast<uint8_t>(wc.opcode) == t.opc[t.tail % Track::kCap], "send wc opcode",
             static_cast<uint8_t>(wc.opcode), t.opc[t.tail % Track::kCap]);
    ++t.tail;
    return;
  }
  CHECK_OR(wc.opcode == WcOpcode::Recv || wc.opcode == WcOpcode::RecvRdmaWithImm, "recv wc opcode",
           static_cast<uint8_t>(wc.opcode), 0);
  uint32_t posted = 0;
  if (q == 16) {
    CHECK_OR(wc.qp_num == w.qpn[kB] || wc.qp_num == w.qpn[kRtr], "srq wc qp", wc.qp_num, 0);
    Track& t = w.srq_t;
    uint32_t i = t.tail;
    while (i != t.head && t.id[i % Track::kCap] != wc.wr_id) ++i;
    CHECK_OR(i != t.head, "srq wc for no outstanding WR", wc.wr_id, 0);
    posted = t.len[i % Track::kCap];
    // Remove entry i, keeping the order of the others.
    for (uint32_t j = i; j != t.tail; --j) {
      t.id[j % Track::kCap] = t.id[(j - 1) % Track::kCap];
      t.len[j % Track::kCap] = t.len[(j - 1) % Track::kCap];
      t.opc[j % Track::kCap] = t.opc[(j - 1) % Track::kCap];
    }
    ++t.tail;
  } else {
    CHECK_OR(q >= 8 && q < 8 + kNumQps && wc.qp_num == w.qpn[q - 8], "recv wc queue/qp", q, wc.qp_num);
    Track& t = w.rq[q - 8];
    CHECK_OR(t.count() > 0 && t.id[t.tail % Track::kCap] == wc.wr_id, "recv wc not the oldest outstanding WR",
             wc.wr_id, t.count());
    posted = t.len[t.tail % Track::kCap];
    ++t.tail;
  }
  if (wc.status == WcStatus::Success) {
    if (wc.opcode == WcOpcode::Recv)
      CHECK_OR(wc.byte_len <= posted, "recv byte_len beyond the posted buffer", wc.byte_len, posted);
    else
      CHECK_OR(wc.byte_len <= 4096, "RDMA WRITE with imm byte_len beyond any MR", wc.byte_len, 0);
  }
}

void drain_cqs(World& w) {
  Wc wc[32];
  int n;
  while ((n = w.scq->poll(wc, 32)) > 0)
    for (int i = 0; i < n; ++i) check_wc(w, wc[i], true);
  while ((n = w.rcq->poll(wc, 32)) > 0)
    for (int i = 0; i < n; ++i) check_wc(w, wc[i], false);
}

// ---- the link ----
uint32_t drain_peer(World& w) {
  io::PktBuf* b[32];
  uint32_t total = 0;
  uint16_t n;
  while ((n = w.peer.rx_burst(b, 32)) > 0) {
    for (uint16_t i = 0; i < n; ++i) {
      wire::PacketView v;
      const wire::ParseError e = wire::parse_frame({b[i]->data, b[i]->len}, v);
      CHECK_OR(e == wire::ParseError::Ok, "engine sent a frame that does not parse", static_cast<uint64_t>(e), 0);
      CHECK_OR(v.h.l2.src == kDutMac && v.h.l2.dst == kPeerMac, "engine frame MAC", 0, 0);
      CHECK_OR(v.h.l3.src == kDutGid, "engine frame source GID", 0, 0);
      CHECK_OR(v.payload_len <= kPortMtu, "engine frame payload > MTU", v.payload_len, 0);
    }
    w.peer.free_burst(b, n);
    total += n;
  }
  w.received += total;
  return total;
}

void check_state(World& w) {
  Engine& e = *w.eng;
  CHECK_OR(e.counter(Ctr::RxFrames) == w.sent, "rx_frames", e.counter(Ctr::RxFrames), w.sent);
  CHECK_OR(e.counter(Ctr::RxIcrcErr) == w.bad_icrc, "rx_icrc_err", e.counter(Ctr::RxIcrcErr), w.bad_icrc);
  CHECK_OR(e.counter(Ctr::RxParseErr) == 0, "rx_parse_err", e.counter(Ctr::RxParseErr), 0);
  CHECK_OR(e.counter(Ctr::TxFrames) == w.received, "tx_frames", e.counter(Ctr::TxFrames), w.received);
  CHECK_OR(e.counter(Ctr::CqOverrun) == 0, "cq overrun", 0, 0);
  // Per-QP counters (droce-ctl qps) agree with the engine's: every frame sent is some QP's, and
  // frames accepted by QPs plus frames dropped before reaching one are at most the frames received.
  uint64_t qp_tx = 0, qp_rx = 0;
  for (int i = 0; i < kNumQps; ++i) {
    qp_tx += e.qp(w.qpn[i])->ctr.tx_packets;
    qp_rx += e.qp(w.qpn[i])->ctr.rx_packets;
  }
  CHECK_OR(qp_tx == e.counter(Ctr::TxFrames), "sum of per-QP tx_packets != tx_frames", qp_tx,
           e.counter(Ctr::TxFrames));
  const uint64_t dropped = e.counter(Ctr::RxParseErr) + e.counter(Ctr::RxIcrcErr) + e.counter(Ctr::RxNoQp) +
                           e.counter(Ctr::CnpReceived) + e.counter(Ctr::RxBadTransport) +
                           e.counter(Ctr::RxBadPkey) + e.counter(Ctr::RxBadState);
  CHECK_OR(qp_rx + dropped <= e.counter(Ctr::RxFrames), "per-QP rx_packets + drops > rx_frames", qp_rx + dropped,
           e.counter(Ctr::RxFrames));
  for (int i = 0; i < kNumQps; ++i) {
    Qp* q = e.qp(w.qpn[i]);
    CHECK_OR(q != nullptr, "qp vanished", i, 0);
    CHECK_OR(q->resp.psn <= wire::kMask24 && q->req.psn <= wire::kMask24 && q->comp.psn <= wire::kMask24 &&
                 q->req.next_new_psn <= wire::kMask24,
             "PSN beyond 24 bits", q->resp.psn, q->req.psn);
    CHECK_OR(q->sq.count() <= q->sq.capacity() && q->rq.count() <= q->rq.capacity(), "ring count", i, 0);
    CHECK_OR(q->sq.count() == w.sq[i].count(), "SQ WQEs != WRs not completed", q->sq.count(), w.sq[i].count());
  }
}

// Poll until nothing moves (bounded), then drain the CQs.
void settle(World& w) {
  for (int i = 0; i < 64; ++i) {
    uint32_t work = w.eng->poll(w.clock.now_);
    work += drain_peer(w);
    if (work == 0 && w.eng->idle()) break;
  }
  drain_cqs(w);
}

// ---- setup ----
int modify(World& w, int i, QpState s, uint32_t psn_r, uint32_t psn_s) {
  QpAttr a;
  const QpType t = w.eng->qp(w.qpn[i])->type;
  uint32_t m = kQpState;
  a.qp_state = s;
  switch (s) {
    case QpState::Init:
      a.pkey_index = 0;
      a.port_num = 1;
      a.qkey = kQkey;
      a.qp_access_flags = i == kB ? kAccessRemoteWrite
                          : i == kUc ? kAccessRemoteWrite
                                     : kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
      m |= kQpPkeyIndex | kQpPort | (t == QpType::UD ? kQpQkey : kQpAccessFlags);
      break;
    case QpState::Rtr:
      a.path_mtu = i == kB ? Mtu::M512 : i == kRtr ? Mtu::M1024 : Mtu::M256;
      a.dest_qp_num = kPeerQpn + static_cast<uint32_t>(i);
      a.rq_psn = psn_r;
      a.max_dest_rd_atomic = i == kB ? 1 : 4;
      a.min_rnr_timer = 1;
      a.ah_attr.dmac = kPeerMac;
      a.ah_attr.dgid = kPeerGid;
      if (t == QpType::RC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
      if (t == QpType::UC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
      break;
    case QpState::Rts:
      a.sq_psn = psn_s;
      a.timeout = 8;  // ~1 ms
      a.retry_cnt = 2;
      a.rnr_retry = 2;
      a.max_rd_atomic = 4;
      m |= kQpSqPsn;
      if (t == QpType::RC) m |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
      break;
    default: break;
  }
  return w.eng->modify_qp(w.qpn[i], a, m);
}

bool post_recv(World& w, int target, const Sge* sge, uint32_t nsge) {
  RecvWr wr;
  wr.num_sge = nsge;
  uint32_t len = 0;
  for (uint32_t i = 0; i < nsge && i < kMaxSge; ++i) {
    wr.sg_list[i] = sge[i];
    len += sge[i].length;
  }
  Track& t = target == kNumQps ? w.srq_t : w.rq[target];
  const uint64_t qid = target == kNumQps ? 16 : 8 + static_cast<uint64_t>(target);
  wr.wr_id = (qid << 56) | (++w.seq & 0xFFFFFFFFFFFFull);
  const int rc = target == kNumQps ? w.eng->post_srq_recv(w.srq, wr) : w.eng->post_recv(w.qpn[target], wr);
  if (rc != 0) return false;
  t.push(wr.wr_id, len, static_cast<uint8_t>(WcOpcode::Recv));
  return true;
}

void setup(World& w, uint8_t s) {
  w.clock.now_ = 1'000'000;
  EngineConfig cfg;
  cfg.mac = kDutMac;
  cfg.gid = kDutGid;
  cfg.max_qps = 16;
  cfg.max_mrs = 16;
  cfg.port_mtu = Mtu::M1024;
  cfg.max_inflight_pkts = 64;
  cfg.min_inflight_pkts = 4;
  cfg.ack_req_every = 4;
  // Fixed seeds: an input hands out the same keys and QPNs every run (reproducible crashes).
  cfg.key_seed = 0x5eed;
  cfg.qpn_seed = 0x5eed;
  w.eng = std::make_unique<Engine>(cfg, w.dut_port, w.clock);
  Engine& e = *w.eng;
  w.pd = e.alloc_pd();
  w.scq = e.create_cq(128);  // more than every WR of every queue: no overrun when drained after each op
  w.rcq = e.create_cq(128);
  w.srq = e.create_srq(w.pd, 32);
  Ah ah;
  ah.dmac = kPeerMac;
  ah.dgid = kPeerGid;
  w.ah = e.create_ah(w.pd, ah);
  if (!w.scq || !w.rcq || !w.srq || !w.ah) fail("setup: cq/srq/ah");
  reset_arena();
  for (int r = 0; r < kNumRegions; ++r) {
    w.access[r] = kRegionDefs[r].access;
    if (e.reg_mr(w.pd, region_ptr(r), kRegionDefs[r].len, w.access[r], &w.key[r]) != 0) fail("setup: reg_mr", r);
    w.reg[r] = true;
    update_poison(w, r);
  }
  for (int i = 0; i < kNumQps; ++i) {
    QpInitAttr init;
    init.qp_type = i == kUc ? QpType::UC : i == kUd ? QpType::UD : QpType::RC;
    init.pd = w.pd.handle;
    init.send_cq = w.scq;
    init.recv_cq = w.rcq;
    init.srq = (i == kB || i == kRtr) ? w.srq : nullptr;
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = 16;
    if (e.create_qp(init, &w.qpn[i]) != 0) fail("setup: create_qp", i);
    w.write_mask[i] = 0;
    w.sq[i] = Track{};
    w.rq[i] = Track{};
  }
  w.srq_t = Track{};
  // Start PSNs: ordinary, or just below the 24-bit wrap.
  const uint32_t rq_psn = (s & 1) ? 0xFFFFFA : 1000, sq_psn = (s & 2) ? 0xFFFFFD : 500;
  for (int i = 0; i < kNumQps; ++i) {
    if (modify(w, i, QpState::Init, 0, 0)) fail("setup: INIT", i);
    if (i == kInit) continue;
    if (modify(w, i, QpState::Rtr, rq_psn, 0)) fail("setup: RTR", i);
    if (i == kRtr) continue;
    if (modify(w, i, QpState::Rts, 0, sq_psn)) fail("setup: RTS", i);
  }
  w.recv_mask = 1u << kRecv;
  w.local_mask = 0;
  w.seq = 0;
  w.sent = w.bad_icrc = w.received = 0;
  // Receive WRs: sizes 0, 100, 2 x 300, 1500 over the RECV region.
  const uint64_t rb = region_addr(kRecv);
  const uint32_t rk = w.key[kRecv];
  const Sge s0{rb, 0, rk}, s1{rb + 64, 100, rk}, s2[2] = {{rb + 256, 300, rk}, {rb + 700, 300, rk}},
            s3{rb + 1024, 1500, rk}, sud{rb + 2600, 40 + 1024, rk};
  for (int i : {kA, kUc, kInit}) {
    post_recv(w, i, &s1, 1);
    post_recv(w, i, s2, 2);
    post_recv(w, i, &s0, 1);
    post_recv(w, i, &s3, 1);
  }
  post_recv(w, kUd, &sud, 1);
  post_recv(w, kUd, &s1, 1);
  post_recv(w, kNumQps, &s3, 1);
  post_recv(w, kNumQps, s2, 2);
  post_recv(w, kNumQps, &s1, 1);
  post_recv(w, kNumQps, &s0, 1);
}

void teardown(World& w) {
  // Every QP to ERR: every WR not completed yet is flushed now.
  for (int i = 0; i < kNumQps; ++i) {
    QpAttr a;
    a.qp_state = QpState::Err;
    if (w.eng->modify_qp(w.qpn[i], a, kQpState) != 0) fail("teardown: modify to ERR", i);
  }
  settle(w);
  check_state(w);
  for (int i = 0; i < kNumQps; ++i) {
    CHECK_OR(w.sq[i].count() == 0, "send WR never completed", i, w.sq[i].count());
    CHECK_OR(w.rq[i].count() == 0, "receive WR never completed", i, w.rq[i].count());
  }
  CHECK_OR(w.srq_t.count() == w.srq->count(), "SRQ WQEs lost", w.srq_t.count(), w.srq->count());
  if (g_trace)
    w.eng->for_each_counter([](const char* name, uint64_t v) {
      if (v) std::fprintf(stderr, "  %s %llu\n", name, static_cast<unsigned long long>(v));
    });
  w.eng.reset();
  // Frames still on the link go back to the pool; then no buffer may be missing.
  io::PktBuf* b[32];
  uint16_t n;
  while ((n = w.dut_port.rx_burst(b, 32)) > 0) w.dut_port.free_burst(b, n);
  while ((n = w.peer.rx_burst(b, 32)) > 0) w.peer.free_burst(b, n);
  CHECK_OR(w.link.free_bufs() == w.link.pool_size(), "memlink buffers leaked", w.link.free_bufs(),
           w.link.pool_size());
  ASAN_UNPOISON_MEMORY_REGION(g_arena, kArena);
}

// ---- ops ----
constexpr uint8_t kRcOps[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B,
                              0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x16, 0x17, 0x81};
constexpr uint8_t kUcOps[] = {0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B, 0x81};
constexpr uint8_t kUdOps[] = {0x64, 0x65, 0x81};

int32_t sext6(uint8_t v) { return static_cast<int32_t>(v & 63) - 32; }

// An rkey aimed at a region, sometimes damaged or stale. Returns the key; *bits the region.
uint32_t pick_key(World& w, In& in, uint32_t* bits) {
  const uint8_t sel = in.u8();
  const int r = sel % kNumRegions;
  *bits = 1u << r;
  uint32_t k = w.key[r];  // stale once deregistered
  if (sel & 0x80) k ^= in.u8();            // wrong tag byte
  if ((sel & 0x60) == 0x60) k = in.u32();  // anything
  return k;
}
uint64_t pick_va(In& in, uint32_t region_bits, uint8_t mode) {
  int r = 0;
  while (r < kNumRegions - 1 && !(region_bits & (1u << r))) ++r;
  if (mode & 0x10) return in.u64();  // wild
  return region_addr(r) + static_cast<uint64_t>(static_cast<int64_t>(static_cast<int16_t>(in.u16())) % 4200);
}

void op_frame(World& w, In& in) {
  const uint8_t qsel = in.u8();
  uint32_t dqpn;
  int qi = qsel & 7;
  if (qi < kNumQps) {
    dqpn = w.qpn[qi];
  } else if (qi == 6) {
    dqpn = in.u32() & wire::kMask24;
    qi = -1;
  } else {
    dqpn = 15;  // a QPN no QP has
    qi = -1;
  }
  Qp* q = qi >= 0 ? w.eng->qp(dqpn) : nullptr;
  const uint8_t osel = in.u8();
  uint8_t opcode;
  if (osel >= 0xF8) {
    opcode = in.u8();  // any byte
  } else if (osel >= 0xC0 || !q) {
    const uint8_t all = osel % (sizeof(kRcOps) + sizeof(kUcOps) + sizeof(kUdOps));
    opcode = all < sizeof(kRcOps)                    ? kRcOps[all]
             : all < sizeof(kRcOps) + sizeof(kUcOps) ? kUcOps[all - sizeof(kRcOps)]
                                                     : kUdOps[all - sizeof(kRcOps) - sizeof(kUcOps)];
  } else if (q->type == QpType::RC) {
    opcode = kRcOps[osel % sizeof(kRcOps)];
  } else if (q->type == QpType::UC) {
    opcode = kUcOps[osel % sizeof(kUcOps)];
  } else {
    opcode = kUdOps[osel % sizeof(kUdOps)];
  }
  const wire::OpcodeInfo& op = wire::opcode_info(opcode);
  const uint8_t flags = in.u8();
  const uint8_t pm = in.u8();

  wire::Headers h;
  h.l2.src = kPeerMac;
  h.l2.dst = kDutMac;
  h.l3.src = (flags & 0x08) ? kSpoofGid : kPeerGid;
  h.l3.dst = kDutGid;
  h.l3.tos = (flags & 0x20) ? wire::kEcnCe : wire::kEcnEct0;
  if (flags & 0x40) {
    h.l2.vlan = true;
    h.l2.vlan_tci = 5;
  }
  h.bth.opcode = opcode;
  h.bth.dqpn = dqpn;
  h.bth.ackreq = flags & 0x01;
  h.bth.se = flags & 0x02;
  if (flags & 0x10) h.bth.pkey = 0x1234;
  // PSN: relative to what the QP expects (requests: responder PSN; responses: oldest unacknowledged).
  uint32_t base = 0;
  if (q) base = (op.flags & wire::kOpResponse) ? q->comp.psn : q->resp.psn;
  uint32_t psn;
  switch (pm >> 6) {
    case 0: psn = base + static_cast<uint32_t>(sext6(pm)); break;
    case 1: psn = (q ? q->req.psn : 0) - 1 - (pm & 63); break;
    case 2: psn = base + 0x800000 + static_cast<uint32_t>(sext6(pm)); break;
    default: psn = in.u32(); break;
  }
  h.bth.psn = psn & wire::kMask24;

  // Which memory this frame may write (checked after it ran).
  uint32_t allowed = 0;
  const uint32_t mtu = q ? q->mtu : kPortMtu;
  if (op.flags & wire::kOpReth) {
    uint32_t bits;
    const uint8_t mode = in.u8();
    h.ext.reth.rkey = pick_key(w, in, &bits);
    h.ext.reth.va = pick_va(in, bits, mode);
    switch (mode & 3) {
      case 0: h.ext.reth.len = in.u8(); break;
      case 1: h.ext.reth.len = static_cast<uint32_t>(in.u8()) * 16; break;
      case 2: h.ext.reth.len = in.u16(); break;
      default: h.ext.reth.len = in.u32(); break;
    }
    if (op.flags & wire::kOpWrite) {
      const uint32_t target = region_of_key(w, h.ext.reth.rkey, kAccessRemoteWrite);
      if (qi >= 0) w.write_mask[qi] |= target;
      allowed |= target;
    }
  }
  if ((op.flags & wire::kOpWrite) && qi >= 0) allowed |= w.write_mask[qi];
  if (op.flags & wire::kOpSend) allowed |= w.recv_mask;
  if (op.flags & wire::kOpAtomicEth) {
    uint32_t bits;
    const uint8_t mode = in.u8();
    h.ext.atomic.rkey = pick_key(w, in, &bits);
    h.ext.atomic.va = pick_va(in, bits, mode);
    if (mode & 0x20) h.ext.atomic.va &= ~uint64_t{7};
    h.ext.atomic.swap_add = (mode & 0x40) ? in.u64() : in.u8();
    h.ext.atomic.compare = (mode & 0x80) ? in.u64() : in.u8();
    allowed |= region_of_key(w, h.ext.atomic.rkey, kAccessRemoteAtomic);
  }
  if (op.flags & wire::kOpAeth) {
    h.ext.aeth.syndrome = in.u8();
    h.ext.aeth.msn = in.u8();
  }
  if (op.flags & wire::kOpAtomicAckEth) h.ext.atomic_orig = in.u8();
  if (op.flags & wire::kOpResponse) allowed |= w.local_mask;
  if (op.flags & wire::kOpDeth) {
    const uint8_t d = in.u8();
    h.ext.deth.qkey = (d & 0x80) ? in.u32() : kQkey;
    h.ext.deth.sqpn = 0x79 + (d & 3);
  }
  if (op.flags & wire::kOpImm) h.ext.imm = in.u8();
  if (op.flags & wire::kOpIeth) {
    uint32_t bits;
    h.ext.ieth_rkey = pick_key(w, in, &bits);
  }
  uint32_t plen = 0;
  if (op.flags & wire::kOpPayload) {
    const uint8_t pl = in.u8();
    switch (pl >> 6) {
      case 0: plen = mtu; break;
      case 1: plen = pl & 63; break;
      case 2: plen = mtu - 8 + (pl & 15); break;
      default: plen = in.u16() % 1100; break;
    }
    if (!op.is_last()) plen &= ~3u;  // FIRST/MIDDLE carry no pad (else the parser drops them)
    std::memset(w.payload, in.u8(), plen);
  }

  io::PktBuf* b = nullptr;
  if (w.peer.alloc_burst(&b, 1) != 1) fail("peer: no buffer");
  const size_t len = wire::build_frame({b->data, b->cap}, h, {w.payload, plen});
  if (g_trace)
    std::fprintf(stderr, "  frame %s to qpn %u psn %u payload %u flags %02x\n", op.name, dqpn, h.bth.psn, plen, flags);
  if (len == 0) {  // an opcode the builder does not know
    w.peer.free_burst(&b, 1);
    return;
  }
  b->len = static_cast<uint32_t>(len);
  {
    // What the builder wrote must parse (else the parser and the builder disagree).
    wire::PacketView v;
    const wire::ParseError pe = wire::parse_frame({b->data, b->len}, v);
    if (pe != wire::ParseError::Ok) {
      std::fprintf(stderr, "fuzz_engine: built %s (payload %u) does not parse: %s\n", op.name, plen,
                   wire::parse_error_name(pe));
      fail("built frame does not parse");
    }
  }
  if (flags & 0x04) {
    b->data[len - 1] ^= 0x01;  // bad ICRC
    ++w.bad_icrc;
  }
  snapshot(w);
  if (w.peer.tx_burst(&b, 1) != 1) fail("peer: tx refused");
  ++w.sent;
  settle(w);
  check_writes(w, allowed, wire::opcode_info(opcode).name);
}

void op_time(World& w, In& in) {
  const uint8_t t = in.u8();
  switch (t >> 6) {
    case 0: w.clock.now_ += (t & 63) * 100ull; break;
    case 1: w.clock.now_ += (t & 63) * 50'000ull; break;
    case 2: {
      const uint64_t next = w.eng->next_timer_ns();
      w.clock.now_ = next == UINT64_MAX ? w.clock.now_ + 2000 : std::max(next, w.clock.now_ + 2000);
      break;
    }
    default: w.clock.now_ += (t & 63) * 10'000'000ull; break;
  }
  snapshot(w);
  settle(w);
  check_writes(w, 0, "time");
}

void op_post_send(World& w, In& in) {
  const int qi = in.u8() % kNumQps;
  const uint8_t o = in.u8();
  const auto opc = static_cast<WrOpcode>(o % wire::kNumWrOpcodes);
  const uint8_t lensel = in.u8();
  const uint8_t lsel = in.u8();
  const uint8_t fl = in.u8();
  SendWr wr;
  wr.opcode = opc;
  wr.send_flags = kSendSignaled | ((fl & 2) ? kSendFence : 0) | ((fl & 4) ? kSendSolicited : 0);
  uint32_t len = (lensel & 0x80) ? (lensel & 0x7F) * 16u : (lensel & 0x7F);
  int r = lsel % kNumRegions;
  const bool result = opc == WrOpcode::RdmaRead || opc == WrOpcode::AtomicCmpSwp || opc == WrOpcode::AtomicFetchAdd;
  if (opc == WrOpcode::AtomicCmpSwp || opc == WrOpcode::AtomicFetchAdd) len = 8;
  if (r == kNone) r = kLocal;  // never a legitimate local read of the poisoned no-rights MR
  const bool inl = (fl & 1) && !result && len <= kMaxInline;
  if (inl) r = kLocal;  // inline data is read at post time by host address
  uint32_t off = (static_cast<uint32_t>(lsel >> 3) * 37u) % kRegionDefs[r].len;
  if (!(fl & 0x10) && off + len > kRegionDefs[r].len) off = len > kRegionDefs[r].len ? 0 : kRegionDefs[r].len - len;
  if (!(fl & 0x10) && len > kRegionDefs[r].len) len = kRegionDefs[r].len;
  if (inl) wr.send_flags |= kSendInline;
  if (len > 0 || (fl & 8)) {
    wr.num_sge = 1;
    wr.sg_list[0] = {region_addr(r) + off, len, w.key[r]};
    if ((fl & 0x20) && len > 1) {  // split over two SGEs
      wr.num_sge = 2;
      wr.sg_list[0].length = len / 2;
      wr.sg_list[1] = {region_addr(r) + off + len / 2, len - len / 2, w.key[r]};
    }
  }
  if (inl && region_poisoned(w, r)) return;  // would read freed memory on the caller's side
  wr.rdma.remote_addr = 0x10000 + in.u8() * 8ull;
  wr.rdma.rkey = 0x1234;
  wr.atomic.remote_addr = 0x20000 + in.u8() * 8ull;
  wr.atomic.rkey = 0x4321;
  wr.atomic.compare_add = 1;
  wr.atomic.swap = 2;
  wr.imm_data = 0xABCD;
  wr.invalidate_rkey = 0x5555;
  wr.ud.ah = w.ah;
  wr.ud.remote_qpn = 0x79;
  wr.ud.remote_qkey = kQkey;
  wr.wr_id = (static_cast<uint64_t>(qi) << 56) | (++w.seq & 0xFFFFFFFFFFFFull);
  if (w.eng->post_send(w.qpn[qi], wr) == 0) {
    if (result && w.reg[r] && (w.access[r] & kAccessLocalWrite)) w.local_mask |= 1u << r;
    w.sq[qi].push(wr.wr_id, len, static_cast<uint8_t>(wc_opcode_of(opc)));
  }
  snapshot(w);
  settle(w);
  check_writes(w, 0, "post_send");
}

void op_post_recv(World& w, In& in) {
  const int target = in.u8() % (kNumQps + 1);
  const uint32_t nsge = in.u8() % 5;  // 4 = too many
  Sge sge[kMaxSge];
  for (uint32_t i = 0; i < nsge && i < kMaxSge; ++i) {
    const uint8_t rs = in.u8();
    const int r = rs < 200 ? kRecv : rs % kNumRegions;
    const uint32_t off = in.u16() % kRegionDefs[r].len;
    uint32_t len = in.u16() % 1200;
    if (!(rs & 1) && off + len > kRegionDefs[r].len) len = kRegionDefs[r].len - off;
    sge[i] = {region_addr(r) + off, len, w.key[r]};
    if (w.reg[r] && (w.access[r] & kAccessLocalWrite)) w.recv_mask |= 1u << r;
  }
  post_recv(w, target, sge, nsge);
  snapshot(w);
  settle(w);
  check_writes(w, 0, "post_recv");
}

void op_mr(World& w, In& in) {
  const uint8_t sel = in.u8();
  const int r = sel % kNumRegions;
  if (w.reg[r]) {
    if (w.eng->dereg_mr(w.key[r]) != 0) fail("dereg_mr of a registered MR", r);
    w.reg[r] = false;
    // A WRITE in progress into this MR may not go on into it (nor into a new registration of it).
    for (auto& m : w.write_mask) m &= ~(1u << r);
    update_poison(w, r);
  } else {
    uint32_t acc = r == kNone ? 0 : (sel >> 3) & kAccessAll;
    if (acc == 0 && r != kNone) acc = kAccessLocalWrite;
    if (acc & (kAccessRemoteWrite | kAccessRemoteAtomic)) acc |= kAccessLocalWrite;
    uint32_t k = 0;
    if (w.eng->reg_mr(w.pd, region_ptr(r), kRegionDefs[r].len, acc, &k) != 0) fail("re-reg_mr", r);
    w.reg[r] = true;
    w.access[r] = acc;
    w.key[r] = k;
    update_poison(w, r);
  }
  snapshot(w);
  settle(w);
  check_writes(w, 0, "mr");
}

void op_qp(World& w, In& in) {
  const int qi = in.u8() % kNumQps;
  const uint8_t act = in.u8();
  QpAttr a;
  switch (act % 4) {
    case 0:
      a.qp_state = QpState::Err;
      w.eng->modify_qp(w.qpn[qi], a, kQpState);
      break;
    case 1:
      a.qp_state = QpState::Sqd;
      w.eng->modify_qp(w.qpn[qi], a, kQpState);
      break;
    case 2:
      a.qp_state = QpState::Rts;
      w.eng->modify_qp(w.qpn[qi], a, kQpState);
      break;
    default: {
      // Recycle: ERR (every WR flushed), RESET, and up again with new PSNs.
      a.qp_state = QpState::Err;
      if (w.eng->modify_qp(w.qpn[qi], a, kQpState) != 0) fail("recycle: ERR", qi);
      settle(w);
      CHECK_OR(w.sq[qi].count() == 0 && w.rq[qi].count() == 0, "recycle: WRs not flushed at ERR", w.sq[qi].count(),
               w.rq[qi].count());
      a.qp_state = QpState::Reset;
      if (w.eng->modify_qp(w.qpn[qi], a, kQpState) != 0) fail("recycle: RESET", qi);
      w.write_mask[qi] = 0;
      const uint32_t pr = in.u32() & wire::kMask24, ps = in.u32() & wire::kMask24;
      if (modify(w, qi, QpState::Init, 0, 0) || modify(w, qi, QpState::Rtr, pr, 0) ||
          (qi != kRtr && modify(w, qi, QpState::Rts, 0, ps)))
        fail("recycle: back to RTS", qi);
      break;
    }
  }
  snapshot(w);
  settle(w);
  check_writes(w, 0, "modify_qp");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (!g_w) {
    g_w = new World();
    g_trace = std::getenv("FUZZ_ENGINE_TRACE") != nullptr;
  }
  World& w = *g_w;
  In in{data, size};
  setup(w, in.u8());
  settle(w);
  check_state(w);
  for (int steps = 0; steps < 256 && !in.empty(); ++steps) {
    const uint8_t k = in.u8();
    if (g_trace) std::fprintf(stderr, "op %d at %llu ns\n", k % 16, static_cast<unsigned long long>(w.clock.now_));
    switch (k % 16) {
      case 9:
      case 10: op_time(w, in); break;
      case 11: op_post_send(w, in); break;
      case 12: op_post_recv(w, in); break;
      case 13: op_mr(w, in); break;
      case 14: op_qp(w, in); break;
      default: op_frame(w, in); break;
    }
    check_state(w);
  }
  teardown(w);
  return 0;
}

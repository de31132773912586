// Scenario tests over memlink: every operation of every service type, for
// path MTUs 256/1024/4096 and message sizes 0, 1, MTU-1, MTU, MTU+1, 64 KiB and
// 16 MiB (UD: up to one MTU, the spec's limit; atomics: 8 bytes). Each case
// posts kWrs work requests back to back and checks:
// - the bytes that land (and the guard bytes around them that must not change);
// - the sender's completions: in posting order, wr_id, status, opcode, byte_len;
// - the receiver's completions: in order, wr_id, opcode, byte_len, imm_data,
//   flags (IMM, INV, GRH), src_qp; an invalidated rkey is gone;
// - the packets on the link: request opcodes by position, PSNs, payload
//   lengths, RETH/ImmDt/IETH/AtomicETH/DETH contents, AckReq; responses: ACK
//   syndromes and MSN, READ responses with AETH on FIRST/LAST/ONLY only,
//   atomic ACKs with the original value; UC and UD: no responses at all.
//
// Every size runs at every MTU in both the release and the sanitizer build.
// 16 MiB at MTU 256 is 65536 packets per WR: the release build posts kWrs of
// them like every other size (about 1 s per operation); the sanitizer build
// (ASan+UBSan, unoptimized, about 5x slower) posts one 16 MiB WR per case
// (kSanitizer), so the suite stays short there. The completion-order checks
// run on every other size in both builds.
#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitizer = true;
#else
constexpr bool kSanitizer = false;
#endif
#else
constexpr bool kSanitizer = false;
#endif

constexpr int kWrs = 3;  // WRs posted back to back per (MTU, size) case
constexpr uint32_t kBig = 16u << 20;
constexpr uint32_t kGuard = 64;  // guard bytes after each WR's region

uint32_t npkts_for(uint32_t len, uint32_t mtu) { return len == 0 ? 1 : (len + mtu - 1) / mtu; }

wire::Position pos_of(uint32_t k, uint32_t n) {
  if (n == 1) return wire::Position::Only;
  if (k == 0) return wire::Position::First;
  return k + 1 == n ? wire::Position::Last : wire::Position::Middle;
}

bool is_atomic(WrOpcode op) { return op == WrOpcode::AtomicCmpSwp || op == WrOpcode::AtomicFetchAdd; }
bool is_send(WrOpcode op) { return op == WrOpcode::Send || op == WrOpcode::SendImm || op == WrOpcode::SendInv; }
bool wants_recv(WrOpcode op) { return is_send(op) || op == WrOpcode::RdmaWriteImm; }

// What the sender's completion must say (ibv_wc_opcode for each ibv_wr_opcode), written out here
// rather than taken from the engine.
WcOpcode sender_wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::Send:
    case WrOpcode::SendImm:
    case WrOpcode::SendInv: return WcOpcode::Send;
    case WrOpcode::RdmaWrite:
    case WrOpcode::RdmaWriteImm: return WcOpcode::RdmaWrite;
    case WrOpcode::RdmaRead: return WcOpcode::RdmaRead;
    case WrOpcode::AtomicCmpSwp: return WcOpcode::CompSwap;
    case WrOpcode::AtomicFetchAdd: return WcOpcode::FetchAdd;
    default: return WcOpcode::BindMw;  // never expected
  }
}

// 8 bytes per RNG call: the 16 MiB regions are refilled for every case.
void fill_fast(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = r();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(r());
}

std::vector<uint32_t> sizes_for(QpType t, Mtu m, WrOpcode op) {
  const uint32_t mtu = mtu_bytes(m);
  if (is_atomic(op)) return {8};
  if (t == QpType::UD) return {0, 1, mtu - 1, mtu};  // a UD message is one packet
  return {0, 1, mtu - 1, mtu, mtu + 1, 65536, kBig};
}

// What one case posted, for the checks.
struct Posted {
  uint64_t wr_id;
  uint32_t len;      // message length (8 for atomics)
  uint32_t psn;      // first PSN
  uint32_t imm;      // ImmDt (IMM ops)
  uint32_t inv_key;  // SEND_INV: the rkey it invalidates
  Node::Buf* inv_mr;
  uint64_t remote;   // RETH / AtomicETH va
  uint32_t rkey;
  uint64_t swap_add, compare, orig;  // atomics: operands and the value they must return
};

// A parsed view of one recorded frame (views point into the link's record).
struct Pkt {
  uint16_t from;
  wire::PacketView v;
};

// Per-packet checks (up to ~200000 packets a case): Catch2 sees only the ones that fail, so a
// passing run does not spend its time (mostly in the sanitizer build) recording assertions.
#define PCHECK(...)                          \
  do {                                       \
    if (!(__VA_ARGS__)) CHECK(__VA_ARGS__);  \
  } while (0)

// Checks every frame recorded on the link during one case.
void check_wire(memlink::Link& link, QpType t, WrOpcode op, uint32_t mtu, uint32_t qa, uint32_t qb, uint32_t qkey,
                const std::vector<Posted>& wrs, uint32_t msn_after) {
  std::vector<Pkt> req, resp;
  for (auto& r : link.recorded()) {
    Pkt p{r.from_port, {}};
    if (wire::parse_frame(r.bytes, p.v) != wire::ParseError::Ok) FAIL("a frame on the link does not parse");
    if (p.v.op->flags & wire::kOpRequest) {
      PCHECK(p.from == 0);
      PCHECK(p.v.h.bth.dqpn == qb);
      req.push_back(p);
    } else if (p.v.op->flags & wire::kOpResponse) {
      PCHECK(p.from == 1);
      PCHECK(p.v.h.bth.dqpn == qa);
      resp.push_back(p);
    } else {
      FAIL_CHECK("unexpected opcode " << int(p.v.h.bth.opcode));
    }
  }
  if (t != QpType::RC) CHECK(resp.empty());  // UC and UD never answer

  if (op == WrOpcode::RdmaRead) {
    REQUIRE(req.size() == wrs.size());
    size_t ri = 0;
    for (size_t w = 0; w < wrs.size(); ++w) {
      const Posted& p = wrs[w];
      INFO("READ wr " << w);
      const auto& h = req[w].v.h;
      PCHECK(h.bth.opcode == wire::op::RC_READ_REQUEST);
      PCHECK(h.bth.psn == p.psn);
      PCHECK(h.bth.ackreq);
      PCHECK(h.ext.reth.len == p.len);
      PCHECK(h.ext.reth.va == p.remote);
      PCHECK(h.ext.reth.rkey == p.rkey);
      const uint32_t n = npkts_for(p.len, mtu);
      REQUIRE(resp.size() >= ri + n);
      for (uint32_t k = 0; k < n; ++k, ++ri) {
        const auto& v = resp[ri].v;
        const wire::Position pos = pos_of(k, n);
        const uint8_t want = pos == wire::Position::Only    ? wire::op::RC_READ_RESPONSE_ONLY
                             : pos == wire::Position::First ? wire::op::RC_READ_RESPONSE_FIRST
                             : pos == wire::Position::Last  ? wire::op::RC_READ_RESPONSE_LAST
                                                            : wire::op::RC_READ_RESPONSE_MIDDLE;
        PCHECK(v.h.bth.opcode == want);
        PCHECK(v.h.bth.psn == wire::psn_add(p.psn, k));
        PCHECK(v.payload_len == std::min(mtu, p.len - k * mtu));
        // AETH on FIRST, LAST and ONLY (IBTA 9.4.3), carrying an ACK; MIDDLE has none.
        const bool aeth = pos != wire::Position::Middle;
        PCHECK(bool(v.op->flags & wire::kOpAeth) == aeth);
        if (aeth) CHECK((v.h.ext.aeth.syndrome & wire::kAethKindMask) == wire::kAethAck);
      }
    }
    PCHECK(ri == resp.size());  // nothing else answered
    PCHECK((resp.back().v.h.ext.aeth.msn) == msn_after);
    return;
  }
  if (is_atomic(op)) {
    REQUIRE(req.size() == wrs.size());
    REQUIRE(resp.size() == wrs.size());
    for (size_t w = 0; w < wrs.size(); ++w) {
      const Posted& p = wrs[w];
      INFO("atomic wr " << w);
      const auto& h = req[w].v.h;
      PCHECK(h.bth.opcode == (op == WrOpcode::AtomicCmpSwp ? wire::op::RC_COMPARE_SWAP : wire::op::RC_FETCH_ADD));
      PCHECK(h.bth.psn == p.psn);
      PCHECK(h.bth.ackreq);
      PCHECK(req[w].v.payload_len == 0);
      PCHECK(h.ext.atomic.va == p.remote);
      PCHECK(h.ext.atomic.rkey == p.rkey);
      PCHECK(h.ext.atomic.swap_add == p.swap_add);
      if (op == WrOpcode::AtomicCmpSwp) CHECK(h.ext.atomic.compare == p.compare);
      const auto& r = resp[w].v.h;
      PCHECK(r.bth.opcode == wire::op::RC_ATOMIC_ACKNOWLEDGE);
      PCHECK(r.bth.psn == p.psn);
      PCHECK((r.ext.aeth.syndrome & wire::kAethKindMask) == wire::kAethAck);
      PCHECK(r.ext.atomic_orig == p.orig);
    }
    PCHECK(resp.back().v.h.ext.aeth.msn == msn_after);
    return;
  }
  // SEND / WRITE (RC, UC) and UD SEND.
  size_t qi = 0;
  for (size_t w = 0; w < wrs.size(); ++w) {
    const Posted& p = wrs[w];
    const uint32_t n = npkts_for(p.len, mtu);
    INFO("wr " << w << " packets " << n);
    REQUIRE(req.size() >= qi + n);
    for (uint32_t k = 0; k < n; ++k, ++qi) {
      const auto& v = req[qi].v;
      const wire::Position pos = pos_of(k, n);
      PCHECK(int{v.h.bth.opcode} == wire::wire_opcode(t, op, pos));
      PCHECK(v.h.bth.psn == wire::psn_add(p.psn, k));
      PCHECK(v.payload_len == std::min(mtu, p.len - k * mtu));
      const bool last = pos == wire::Position::Last || pos == wire::Position::Only;
      const bool first = pos == wire::Position::First || pos == wire::Position::Only;
      if (last && t == QpType::RC) CHECK(v.h.bth.ackreq);
      if (first && (op == WrOpcode::RdmaWrite || op == WrOpcode::RdmaWriteImm)) {
        PCHECK(v.h.ext.reth.va == p.remote);
        PCHECK(v.h.ext.reth.rkey == p.rkey);
        PCHECK(v.h.ext.reth.len == p.len);
      }
      if (last && (op == WrOpcode::SendImm || op == WrOpcode::RdmaWriteImm)) CHECK(v.h.ext.imm == be32toh(p.imm));  // imm_data is posted in network order
      if (last && op == WrOpcode::SendInv) CHECK(v.h.ext.ieth_rkey == p.inv_key);
      if (t == QpType::UD) {
        PCHECK(v.h.ext.deth.qkey == qkey);
        PCHECK(v.h.ext.deth.sqpn == qa);
      }
    }
  }
  PCHECK(qi == req.size());  // no retransmissions, nothing extra
  if (t == QpType::RC) {
    REQUIRE(!resp.empty());
    uint32_t prev = wrs.front().psn;
    for (auto& r : resp) {
      PCHECK(r.v.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
      PCHECK((r.v.h.ext.aeth.syndrome & wire::kAethKindMask) == wire::kAethAck);
      PCHECK(!wire::psn_lt(r.v.h.bth.psn, prev));  // ACKs move forward
      prev = r.v.h.bth.psn;
    }
    const Posted& lastwr = wrs.back();
    PCHECK(resp.back().v.h.bth.psn == wire::psn_add(lastwr.psn, npkts_for(lastwr.len, mtu) - 1));
    PCHECK(resp.back().v.h.ext.aeth.msn == msn_after);
  }
}

void run_type_mtu(QpType t, Mtu m, WrOpcode op) {
  const uint32_t mtu = mtu_bytes(m);
  EngineConfig cfg;
  cfg.port_mtu = m;  // UD takes the port's MTU
  World w(42, 2, cfg);
  QpOpts o;
  o.mtu = m;
  auto [qa, qb] = w.connect(0, 1, t, o);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  const std::vector<uint32_t> sizes = sizes_for(t, m, op);
  const auto wrs_for = [](uint32_t len) { return kSanitizer && len == kBig ? 1 : kWrs; };
  uint64_t cap = 0;  // each WR has a region of len + GRH + guard bytes, on both sides
  for (uint32_t len : sizes) cap = std::max(cap, wrs_for(len) * (uint64_t{len} + kGrhBytes + kGuard));
  auto& src = A.buffer(cap);
  auto& dst = B.buffer(cap);
  Ah ah = B.ah();
  uint32_t psn = o.sq_psn;
  uint32_t msn = 0;  // the responder's MSN: one per completed message (RC)
  uint64_t id = 1;
  for (uint32_t len : sizes) {
    INFO("type " << int(t) << " mtu " << mtu << " op " << int(op) << " len " << len);
    const uint64_t stride = uint64_t{len} + kGrhBytes + kGuard;
    const int nwr = wrs_for(len);
    const uint64_t used = nwr * stride;
    // READ moves bytes from B to A: B holds the data, A the 0xEE background.
    uint8_t* data = op == WrOpcode::RdmaRead ? dst.mem.data() : src.mem.data();
    uint8_t* land = op == WrOpcode::RdmaRead ? src.mem.data() : dst.mem.data();
    fill_fast(data, used, id * 77 + len);
    std::memset(land, 0xEE, used);
    w.link.recorded().clear();
    w.link.record(true);
    std::vector<Posted> wrs;
    uint64_t atom = 0x1122334455667788ull;  // the remote 8 bytes at dst + 16
    if (is_atomic(op)) std::memcpy(dst.mem.data() + 16, &atom, 8);
    for (int k = 0; k < nwr; ++k) {
      Posted p{};
      p.wr_id = id * 10 + k;
      p.len = len;
      p.psn = psn;
      p.imm = 0xA0000000u + (len << 4) + k;
      const uint64_t off = k * stride;
      if (wants_recv(op)) {
        const uint32_t rlen = t == QpType::UD ? len + kGrhBytes : len;
        REQUIRE(B.eng->post_recv(qb, make_recv(900 + p.wr_id, dst, off, rlen)) == 0);
      }
      SendWr wr = make_wr(p.wr_id, op, src, off, len);
      wr.imm_data = p.imm;
      switch (op) {
        case WrOpcode::SendInv:
          p.inv_mr = &B.buffer(64, kAccessAll | kMrRemoteInvalidate);  // fast-registered: remotely invalidatable
          p.inv_key = p.inv_mr->key;
          REQUIRE(mr_valid(B, *p.inv_mr));
          wr.invalidate_rkey = p.inv_key;
          break;
        case WrOpcode::RdmaWrite:
        case WrOpcode::RdmaWriteImm:
        case WrOpcode::RdmaRead:
          p.remote = dst.addr() + off + 8;
          p.rkey = dst.key;
          wr.rdma = {p.remote, p.rkey};
          break;
        case WrOpcode::AtomicCmpSwp:
        case WrOpcode::AtomicFetchAdd:
          // Chained on one address, so the order of execution shows: CMP_SWP swaps twice,
          // then compares against a stale value (no swap); FETCH_ADD adds 5, 6, 7.
          p.len = 8;
          wr = make_wr(p.wr_id, op, src, 8 * k, 8);
          p.remote = dst.addr() + 16;
          p.rkey = dst.key;
          p.orig = atom;
          if (op == WrOpcode::AtomicCmpSwp) {
            p.compare = k < 2 ? atom : 0x1122334455667788ull;
            p.swap_add = 0xCAFEBABE00000000ull + k;
            if (p.compare == atom) atom = p.swap_add;
          } else {
            p.swap_add = 5 + k;
            atom += p.swap_add;
          }
          wr.atomic = {p.remote, op == WrOpcode::AtomicCmpSwp ? p.compare : p.swap_add, p.swap_add, p.rkey};
          break;
        default: break;
      }
      if (t == QpType::UD) wr.ud = {&ah, qb, o.qkey};
      REQUIRE(A.eng->post_send(qa, wr) == 0);
      const uint32_t n = t == QpType::UD || is_atomic(op) ? 1 : npkts_for(len, mtu);
      psn = wire::psn_add(psn, n);
      wrs.push_back(p);
    }
    msn += nwr;
    std::vector<Wc> swc, rwc;
    REQUIRE(w.run([&] {
      auto a = A.drain(A.scq), b = B.drain(B.rcq);
      swc.insert(swc.end(), a.begin(), a.end());
      rwc.insert(rwc.end(), b.begin(), b.end());
      return swc.size() >= size_t(nwr) && (!wants_recv(op) || rwc.size() >= size_t(nwr));
    }));
    w.settle();  // let trailing ACKs arrive, nothing more may complete
    {
      auto a = A.drain(A.scq), b = B.drain(B.rcq);
      CHECK(a.empty());
      CHECK(b.empty());
    }
    w.link.record(false);
    // Sender completions: one per WR, in posting order.
    REQUIRE(swc.size() == size_t(nwr));
    for (int k = 0; k < nwr; ++k) {
      INFO("send completion " << k);
      CHECK(swc[k].wr_id == wrs[k].wr_id);
      CHECK(swc[k].status == WcStatus::Success);
      CHECK(swc[k].opcode == sender_wc_opcode(op));
      CHECK(swc[k].byte_len == wrs[k].len);
      CHECK(swc[k].qp_num == qa);
    }
    // Receiver completions: one per SEND / WRITE_IMM, in order.
    if (wants_recv(op)) {
      REQUIRE(rwc.size() == size_t(nwr));
    } else {
      CHECK(rwc.empty());
    }
    for (int k = 0; k < nwr; ++k) {
      INFO("wr " << k);
      const Posted& p = wrs[k];
      const uint64_t off = k * stride;
      switch (op) {
        case WrOpcode::Send:
        case WrOpcode::SendImm:
        case WrOpcode::SendInv: {
          const uint32_t grh = t == QpType::UD ? kGrhBytes : 0;
          CHECK(std::memcmp(dst.mem.data() + off + grh, src.mem.data() + off, len) == 0);
          CHECK(dst.mem[off + grh + len] == 0xEE);
          const Wc& c = rwc[k];
          CHECK(c.wr_id == 900 + p.wr_id);
          CHECK(c.status == WcStatus::Success);
          CHECK(c.opcode == WcOpcode::Recv);
          CHECK(c.byte_len == len + grh);
          CHECK(c.qp_num == qb);
          CHECK(c.src_qp == qa);
          CHECK(bool(c.wc_flags & kWcWithImm) == (op == WrOpcode::SendImm));
          CHECK(bool(c.wc_flags & kWcWithInv) == (op == WrOpcode::SendInv));
          CHECK(bool(c.wc_flags & kWcGrh) == (t == QpType::UD));
          if (op == WrOpcode::SendImm) CHECK(c.imm_data == p.imm);
          if (op == WrOpcode::SendInv) {
            CHECK(c.imm_data == p.inv_key);
            CHECK(mr_invalidated(B, *p.inv_mr));
          }
          if (t == QpType::UD) {
            // IPv4 header in the last 20 bytes of the GRH: version 4, source 10.0.0.1.
            CHECK(dst.mem[off + 20] == 0x45);
            CHECK(dst.mem[off + 20 + 12] == 10);
            CHECK(dst.mem[off + 20 + 15] == 1);
          }
          break;
        }
        case WrOpcode::RdmaWrite:
        case WrOpcode::RdmaWriteImm:
          CHECK(std::memcmp(dst.mem.data() + off + 8, src.mem.data() + off, len) == 0);
          CHECK(dst.mem[off + 7] == 0xEE);
          CHECK(dst.mem[off + 8 + len] == 0xEE);
          if (op == WrOpcode::RdmaWriteImm) {
            const Wc& c = rwc[k];
            CHECK(c.wr_id == 900 + p.wr_id);
            CHECK(c.status == WcStatus::Success);
            CHECK(c.opcode == WcOpcode::RecvRdmaWithImm);
            CHECK((c.wc_flags & kWcWithImm));
            CHECK(c.imm_data == p.imm);
            CHECK(c.byte_len == len);
            CHECK(c.src_qp == qa);
          }
          break;
        case WrOpcode::RdmaRead:
          CHECK(std::memcmp(src.mem.data() + off, dst.mem.data() + off + 8, len) == 0);
          CHECK(src.mem[off + len] == 0xEE);
          if (off) CHECK(src.mem[off - 1] == 0xEE);
          break;
        case WrOpcode::AtomicCmpSwp:
        case WrOpcode::AtomicFetchAdd: {
          uint64_t got;
          std::memcpy(&got, src.mem.data() + 8 * k, 8);
          CHECK(got == p.orig);
          break;
        }
        default: break;
      }
    }
    if (is_atomic(op)) {
      uint64_t now_val;
      std::memcpy(&now_val, dst.mem.data() + 16, 8);
      CHECK(now_val == atom);
      CHECK(now_val == (op == WrOpcode::AtomicCmpSwp ? 0xCAFEBABE00000001ull : 0x1122334455667788ull + 18));
    }
    check_wire(w.link, t, op, mtu, qa, qb, o.qkey, wrs, msn);
    w.link.recorded().clear();
    ++id;
  }
  CHECK(A.eng->counter(Ctr::ReqRetransmits) == 0);
  CHECK(B.eng->counter(Ctr::RxIcrcErr) == 0);
}

const Mtu kMtus[] = {Mtu::M256, Mtu::M1024, Mtu::M4096};

}  // namespace

TEST_CASE("RC SEND", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::Send); }
TEST_CASE("RC SEND_IMM", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::SendImm); }
TEST_CASE("RC SEND_INV", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::SendInv); }
TEST_CASE("RC WRITE", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::RdmaWrite); }
TEST_CASE("RC WRITE_IMM", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::RdmaWriteImm); }
TEST_CASE("RC READ", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::RdmaRead); }
TEST_CASE("RC CMP_SWP", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::AtomicCmpSwp); }
TEST_CASE("RC FETCH_ADD", "[scenario][rc]") { for (Mtu m : kMtus) run_type_mtu(QpType::RC, m, WrOpcode::AtomicFetchAdd); }
TEST_CASE("UC SEND", "[scenario][uc]") { for (Mtu m : kMtus) run_type_mtu(QpType::UC, m, WrOpcode::Send); }
TEST_CASE("UC SEND_IMM", "[scenario][uc]") { for (Mtu m : kMtus) run_type_mtu(QpType::UC, m, WrOpcode::SendImm); }
TEST_CASE("UC WRITE", "[scenario][uc]") { for (Mtu m : kMtus) run_type_mtu(QpType::UC, m, WrOpcode::RdmaWrite); }
TEST_CASE("UC WRITE_IMM", "[scenario][uc]") { for (Mtu m : kMtus) run_type_mtu(QpType::UC, m, WrOpcode::RdmaWriteImm); }
TEST_CASE("UD SEND", "[scenario][ud]") { for (Mtu m : kMtus) run_type_mtu(QpType::UD, m, WrOpcode::Send); }
TEST_CASE("UD SEND_IMM", "[scenario][ud]") { for (Mtu m : kMtus) run_type_mtu(QpType::UD, m, WrOpcode::SendImm); }

TEST_CASE("RC mixed operations complete in posting order", "[scenario][rc]") {
  // Every RC operation back to back on one QP, twice around: a READ or atomic ahead of
  // SENDs/WRITEs completes only when its response arrives, and the SENDs/WRITEs behind it,
  // though ACKed first, complete after it. Both completion queues in posting order.
  World w(5);
  QpOpts o;
  o.mtu = Mtu::M256;
  auto [qa, qb] = w.connect(0, 1, QpType::RC, o);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  auto& src = A.buffer(1 << 16);
  auto& dst = B.buffer(1 << 16);
  auto& rbuf = B.buffer(1 << 16);
  fill_fast(src.mem.data(), src.mem.size(), 1);
  fill_fast(dst.mem.data(), dst.mem.size(), 2);
  const std::vector<uint8_t> dst0 = dst.mem;
  const WrOpcode kSeq[] = {WrOpcode::RdmaRead,     WrOpcode::Send,         WrOpcode::RdmaWriteImm,
                           WrOpcode::AtomicFetchAdd, WrOpcode::SendInv,    WrOpcode::RdmaWrite,
                           WrOpcode::AtomicCmpSwp,  WrOpcode::SendImm};
  const uint32_t kLens[] = {700, 1, 513, 8, 0, 256, 8, 257};
  struct P {
    WrOpcode op;
    uint32_t len;
    uint64_t off;
    Node::Buf* inv = nullptr;
  };
  std::vector<P> plan;
  std::vector<size_t> recv_of;  // plan index per receive WQE, in posting order
  uint64_t off = 0;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < std::size(kSeq); ++i) {
      P p{kSeq[i], kLens[i], off};
      off += 1024;
      const uint64_t id = plan.size();
      SendWr wr = make_wr(id, p.op, src, p.off, p.len);
      wr.imm_data = 0x5000 + static_cast<uint32_t>(id);
      wr.rdma = {dst.addr() + p.off, dst.key};
      if (is_atomic(p.op)) wr.atomic = {dst.addr() + 16 * 1024, 0, 0, dst.key};  // CMP_SWP(0, 0) / FETCH_ADD(0): no change
      if (p.op == WrOpcode::AtomicFetchAdd) wr.atomic.compare_add = 3;
      if (p.op == WrOpcode::SendInv) {
        p.inv = &B.buffer(64, kAccessAll | kMrRemoteInvalidate);  // fast-registered: remotely invalidatable
        wr.invalidate_rkey = p.inv->key;
      }
      if (wants_recv(p.op)) {
        REQUIRE(B.eng->post_recv(qb, make_recv(id, rbuf, p.off, 1024)) == 0);
        recv_of.push_back(plan.size());
      }
      REQUIRE(A.eng->post_send(qa, wr) == 0);
      plan.push_back(p);
    }
  }
  std::vector<Wc> swc, rwc;
  REQUIRE(w.run([&] {
    auto a = A.drain(A.scq), b = B.drain(B.rcq);
    swc.insert(swc.end(), a.begin(), a.end());
    rwc.insert(rwc.end(), b.begin(), b.end());
    return swc.size() >= plan.size() && rwc.size() >= recv_of.size();
  }));
  w.settle();
  CHECK(A.drain(A.scq).empty());
  CHECK(B.drain(B.rcq).empty());
  REQUIRE(swc.size() == plan.size());
  uint64_t fetch_expect = 0;
  std::memcpy(&fetch_expect, dst0.data() + 16 * 1024, 8);
  for (size_t k = 0; k < plan.size(); ++k) {
    const P& p = plan[k];
    INFO("wr " << k << " op " << int(p.op));
    CHECK(swc[k].wr_id == k);
    CHECK(swc[k].status == WcStatus::Success);
    CHECK(swc[k].opcode == sender_wc_opcode(p.op));
    CHECK(swc[k].byte_len == p.len);
    if (p.op == WrOpcode::RdmaRead) CHECK(std::memcmp(src.mem.data() + p.off, dst0.data() + p.off, p.len) == 0);
    if (p.op == WrOpcode::RdmaWrite || p.op == WrOpcode::RdmaWriteImm)
      CHECK(std::memcmp(dst.mem.data() + p.off, src.mem.data() + p.off, p.len) == 0);
    if (is_atomic(p.op)) {
      uint64_t got;
      std::memcpy(&got, src.mem.data() + p.off, 8);
      CHECK(got == fetch_expect);  // the atomics ran in posting order
      if (p.op == WrOpcode::AtomicFetchAdd) fetch_expect += 3;
    }
    if (p.inv) CHECK(mr_invalidated(B, *p.inv));
  }
  REQUIRE(rwc.size() == recv_of.size());
  for (size_t r = 0; r < rwc.size(); ++r) {
    const P& p = plan[recv_of[r]];
    INFO("receive " << r << " for wr " << recv_of[r]);
    CHECK(rwc[r].wr_id == recv_of[r]);
    CHECK(rwc[r].status == WcStatus::Success);
    CHECK(rwc[r].byte_len == p.len);
    CHECK(rwc[r].opcode == (p.op == WrOpcode::RdmaWriteImm ? WcOpcode::RecvRdmaWithImm : WcOpcode::Recv));
    if (p.op == WrOpcode::SendImm || p.op == WrOpcode::RdmaWriteImm) CHECK(rwc[r].imm_data == 0x5000 + recv_of[r]);
    if (p.op == WrOpcode::SendInv) CHECK(rwc[r].imm_data == p.inv->key);
    if (is_send(p.op)) CHECK(std::memcmp(rbuf.mem.data() + p.off, src.mem.data() + p.off, p.len) == 0);
  }
  CHECK(A.eng->counter(Ctr::ReqRetransmits) == 0);
}

TEST_CASE("RC WRITE 16 MiB", "[scenario][rc][big]") {
  World w(7);
  QpOpts o;
  o.mtu = Mtu::M4096;
  auto [qa, qb] = w.connect(0, 1, QpType::RC, o);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  const uint32_t len = 16u << 20;
  auto& src = A.buffer(len);
  auto& dst = B.buffer(len);
  fill_random(src.mem, 1);
  SendWr wr = make_wr(1, WrOpcode::RdmaWrite, src, 0, len);
  wr.rdma = {dst.addr(), dst.key};
  REQUIRE(A.eng->post_send(qa, wr) == 0);
  const std::vector<Wc> wc = w.wait_wcs(A, A.scq, 1);
  REQUIRE(!wc.empty());
  REQUIRE(wc.size() == 1);
  CHECK(wc[0].status == WcStatus::Success);
  CHECK(wc[0].byte_len == len);
  CHECK(std::memcmp(src.mem.data(), dst.mem.data(), len) == 0);
  CHECK(A.eng->counter(Ctr::ReqPackets) == len / 4096);
  (void)qb;
}

TEST_CASE("RC READ 16 MiB with scatter list", "[scenario][rc][big]") {
  World w(8);
  QpOpts o;
  o.mtu = Mtu::M1024;
  auto [qa, qb] = w.connect(0, 1, QpType::RC, o);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  const uint32_t len = 16u << 20;
  auto& remote = B.buffer(len);
  fill_random(remote.mem, 3);
  // Four local pieces of uneven sizes.
  auto& l1 = A.buffer(1000);
  auto& l2 = A.buffer(len / 2);
  auto& l3 = A.buffer(len / 2 - 1000 - 7);
  auto& l4 = A.buffer(7);
  SendWr wr;
  wr.wr_id = 5;
  wr.opcode = WrOpcode::RdmaRead;
  wr.num_sge = 4;
  wr.sg_list[0] = {l1.addr(), 1000, l1.key};
  wr.sg_list[1] = {l2.addr(), len / 2, l2.key};
  wr.sg_list[2] = {l3.addr(), len / 2 - 1000 - 7, l3.key};
  wr.sg_list[3] = {l4.addr(), 7, l4.key};
  wr.rdma = {remote.addr(), remote.key};
  REQUIRE(A.eng->post_send(qa, wr) == 0);
  const std::vector<Wc> wc = w.wait_wcs(A, A.scq, 1);
  REQUIRE(!wc.empty());
  REQUIRE(wc[0].status == WcStatus::Success);
  std::vector<uint8_t> got;
  for (auto* b : {&l1, &l2, &l3, &l4}) got.insert(got.end(), b->mem.begin(), b->mem.end());
  CHECK(std::memcmp(got.data(), remote.mem.data(), len) == 0);
  (void)qb;
}

namespace {
// 1 GiB of address space backed by one 64 MiB memfd mapped 16 times in a row,
// so a 1 GiB message runs through the engines without 1 GiB of RAM. Data with a
// 64 MiB period reads and lands consistently.
struct Aliased {
  static constexpr size_t kChunk = 64u << 20, kCopies = 16, kLen = kChunk * kCopies;
  int fd = -1;
  uint8_t* base = nullptr;
  Aliased() {
    fd = memfd_create("droce-alias", 0);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, kChunk) == 0);
    void* r = mmap(nullptr, kLen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    REQUIRE(r != MAP_FAILED);
    base = static_cast<uint8_t*>(r);
    for (size_t i = 0; i < kCopies; ++i)
      REQUIRE(mmap(base + i * kChunk, kChunk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED);
  }
  ~Aliased() {
    munmap(base, kLen);
    close(fd);
  }
};
}  // namespace

TEST_CASE("RC WRITE and READ 1 GiB", "[scenario][rc][huge]") {
  World w(11);
  QpOpts o;
  o.mtu = Mtu::M4096;
  auto [qa, qb] = w.connect(0, 1, QpType::RC, o);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  Aliased src, dst;
  std::mt19937_64 r(5);
  for (size_t i = 0; i < Aliased::kChunk; i += 8) {
    const uint64_t v = r();
    std::memcpy(src.base + i, &v, 8);
  }
  uint32_t ks = 0, kd = 0;
  REQUIRE(A.eng->reg_mr(A.pd, src.base, Aliased::kLen, kAccessAll, &ks) == 0);
  REQUIRE(B.eng->reg_mr(B.pd, dst.base, Aliased::kLen, kAccessAll, &kd) == 0);
  SendWr wr;
  wr.wr_id = 1;
  wr.opcode = WrOpcode::RdmaWrite;
  wr.num_sge = 1;
  wr.sg_list[0] = {reinterpret_cast<uint64_t>(src.base), static_cast<uint32_t>(Aliased::kLen), ks};
  wr.rdma = {reinterpret_cast<uint64_t>(dst.base), kd};
  REQUIRE(A.eng->post_send(qa, wr) == 0);
  std::vector<Wc> wc = w.wait_wcs(A, A.scq, 1, 50'000'000);
  REQUIRE(!wc.empty());
  REQUIRE(wc[0].status == WcStatus::Success);
  CHECK(wc[0].byte_len == Aliased::kLen);
  CHECK(std::memcmp(src.base, dst.base, Aliased::kChunk) == 0);
  CHECK(A.eng->counter(Ctr::ReqPackets) == Aliased::kLen / 4096);
  // READ it back into A's region after scrambling A's bytes.
  std::memset(src.base, 0, Aliased::kChunk);
  wr.wr_id = 2;
  wr.opcode = WrOpcode::RdmaRead;
  REQUIRE(A.eng->post_send(qa, wr) == 0);
  wc = w.wait_wcs(A, A.scq, 1, 50'000'000);
  REQUIRE(!wc.empty());
  REQUIRE(wc[0].status == WcStatus::Success);
  CHECK(std::memcmp(src.base, dst.base, Aliased::kChunk) == 0);
  CHECK(B.eng->counter(Ctr::ReadRespSent) == Aliased::kLen / 4096);
  (void)qb;
}

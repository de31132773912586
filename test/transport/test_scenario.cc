// Scenario tests over memlink: every operation of every service type, for
// path MTUs 256/1024/4096 and message sizes 0, 1, MTU-1, MTU, MTU+1, 64 KiB
// (16 MiB for every multi-packet RC and UC operation at MTU 4096). Each case checks the bytes that land, the
// completions (order, status, opcode, byte_len, imm) and the packets on the
// link (opcodes, PSNs, payload lengths, ACK syndromes).
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

struct Expect {
  uint32_t psn0;
  uint32_t npkts;
};

uint32_t npkts_for(uint32_t len, uint32_t mtu) { return len == 0 ? 1 : (len + mtu - 1) / mtu; }

wire::Position pos_of(uint32_t k, uint32_t n) {
  if (n == 1) return wire::Position::Only;
  if (k == 0) return wire::Position::First;
  return k + 1 == n ? wire::Position::Last : wire::Position::Middle;
}

// Checks the request packets from port 0 (and the responses from port 1) recorded on the link.
void check_wire(memlink::Link& link, QpType t, WrOpcode op, uint32_t len, uint32_t mtu, uint32_t psn0) {
  const auto seen = parsed(link);
  std::vector<const Seen*> req, resp;
  for (auto& s : seen) {
    if (s.v.op->flags & wire::kOpRequest) {
      CHECK(s.from == 0);
      req.push_back(&s);
    } else if (s.v.op->flags & wire::kOpResponse) {
      CHECK(s.from == 1);
      resp.push_back(&s);
    }
  }
  const uint32_t n = npkts_for(len, mtu);
  if (op == WrOpcode::RdmaRead) {
    REQUIRE(req.size() == 1);
    CHECK(req[0]->v.h.bth.opcode == wire::op::RC_READ_REQUEST);
    CHECK(req[0]->v.h.bth.psn == psn0);
    CHECK(req[0]->v.h.ext.reth.len == len);
    REQUIRE(resp.size() == n);
    for (uint32_t k = 0; k < n; ++k) {
      const auto& v = resp[k]->v;
      const wire::Position p = pos_of(k, n);
      const uint8_t want = p == wire::Position::Only    ? wire::op::RC_READ_RESPONSE_ONLY
                           : p == wire::Position::First ? wire::op::RC_READ_RESPONSE_FIRST
                           : p == wire::Position::Last  ? wire::op::RC_READ_RESPONSE_LAST
                                                        : wire::op::RC_READ_RESPONSE_MIDDLE;
      CHECK(v.h.bth.opcode == want);
      CHECK(v.h.bth.psn == wire::psn_add(psn0, k));
      CHECK(v.payload_len == std::min(mtu, len - k * mtu));
    }
    return;
  }
  if (op == WrOpcode::AtomicCmpSwp || op == WrOpcode::AtomicFetchAdd) {
    REQUIRE(req.size() == 1);
    CHECK(req[0]->v.h.bth.psn == psn0);
    REQUIRE(resp.size() == 1);
    CHECK(resp[0]->v.h.bth.opcode == wire::op::RC_ATOMIC_ACKNOWLEDGE);
    CHECK(resp[0]->v.h.bth.psn == psn0);
    CHECK((resp[0]->v.h.ext.aeth.syndrome & wire::kAethKindMask) == wire::kAethAck);
    return;
  }
  REQUIRE(req.size() == n);
  for (uint32_t k = 0; k < n; ++k) {
    const auto& v = req[k]->v;
    CHECK(int{v.h.bth.opcode} == wire::wire_opcode(t, op, pos_of(k, n)));
    CHECK(v.h.bth.psn == wire::psn_add(psn0, k));
    CHECK(v.payload_len == std::min(mtu, len - k * mtu));
    if (k + 1 == n && t == QpType::RC) CHECK(v.h.bth.ackreq);
  }
  if (t == QpType::RC) {
    REQUIRE(!resp.empty());
    const auto& last = resp.back()->v;
    CHECK(last.h.bth.opcode == wire::op::RC_ACKNOWLEDGE);
    CHECK((last.h.ext.aeth.syndrome & wire::kAethKindMask) == wire::kAethAck);
    CHECK(last.h.bth.psn == wire::psn_add(psn0, n - 1));
  } else {
    CHECK(resp.empty());
  }
}

// 16 MiB (4096 packets) at MTU 4096 only, so every multi-packet operation of
// RC and UC moves a 16 MiB message once without making the suite slow.
constexpr uint32_t kBig = 16u << 20;
std::vector<uint32_t> sizes_for(uint32_t mtu) {
  std::vector<uint32_t> v{0, 1, mtu - 1, mtu, mtu + 1, 65536};
  if (mtu == 4096) v.push_back(kBig);
  return v;
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
  const uint32_t cap = mtu == 4096 ? kBig + 4464 : 70000;
  auto& src = A.buffer(cap);
  auto& dst = B.buffer(cap + 64);
  uint32_t psn = o.sq_psn;
  uint64_t id = 1;
  for (uint32_t len : sizes_for(mtu)) {
    if (t == QpType::UD && len + kGrhBytes > cap) continue;
    if (t == QpType::UD && len > mtu) continue;  // UD messages are one packet
    if ((op == WrOpcode::AtomicCmpSwp || op == WrOpcode::AtomicFetchAdd) && len != 1) continue;
    INFO("type " << int(t) << " mtu " << mtu << " op " << int(op) << " len " << len);
    fill_random(src.mem, id * 77 + len);
    std::fill(dst.mem.begin(), dst.mem.end(), 0xEE);
    w.link.recorded().clear();
    w.link.record(true);
    const uint32_t imm = 0xA0B0C000u + len;
    const bool want_recv = op == WrOpcode::Send || op == WrOpcode::SendImm || op == WrOpcode::SendInv ||
                           op == WrOpcode::RdmaWriteImm;
    if (want_recv) REQUIRE(B.eng->post_recv(qb, make_recv(900 + id, dst, 0, t == QpType::UD ? len + 40 : len)) == 0);
    SendWr wr;
    uint64_t expect_len = len;
    uint32_t inv_key = 0;
    uint64_t target_before = 0;
    switch (op) {
      case WrOpcode::Send:
      case WrOpcode::SendImm:
      case WrOpcode::SendInv:
        wr = make_wr(id, op, src, 0, len);
        wr.imm_data = imm;
        if (op == WrOpcode::SendInv) {
          inv_key = B.buffer(64).key;
          wr.invalidate_rkey = inv_key;
        }
        if (t == QpType::UD) {
          static Ah ah;
          ah = B.ah();
          wr.ud = {&ah, qb, o.qkey};
        }
        break;
      case WrOpcode::RdmaWrite:
      case WrOpcode::RdmaWriteImm:
        wr = make_wr(id, op, src, 0, len);
        wr.imm_data = imm;
        wr.rdma = {dst.addr() + 8, dst.key};
        break;
      case WrOpcode::RdmaRead:
        fill_random(dst.mem, id * 13 + len);
        std::fill(src.mem.begin(), src.mem.end(), 0xEE);
        wr = make_wr(id, op, src, 0, len);
        wr.rdma = {dst.addr() + 8, dst.key};
        break;
      case WrOpcode::AtomicCmpSwp:
      case WrOpcode::AtomicFetchAdd: {
        target_before = 0x1122334455667788ull;
        std::memcpy(dst.mem.data() + 16, &target_before, 8);
        wr = make_wr(id, op, src, 0, 8);
        wr.atomic = {dst.addr() + 16, target_before, 0xCAFEBABEDEADBEEFull, dst.key};
        if (op == WrOpcode::AtomicFetchAdd) wr.atomic.compare_add = 5;
        expect_len = 8;
        break;
      }
      default: FAIL("op");
    }
    REQUIRE(A.eng->post_send(qa, wr) == 0);
    std::vector<Wc> swc, rwc;
    REQUIRE(w.run([&] {
      auto a = A.drain(A.scq), b = B.drain(B.rcq);
      swc.insert(swc.end(), a.begin(), a.end());
      rwc.insert(rwc.end(), b.begin(), b.end());
      return swc.size() == 1 && (!want_recv || rwc.size() == 1);
    }));
    w.settle();  // let trailing ACKs arrive, nothing more may complete
    {
      auto a = A.drain(A.scq), b = B.drain(B.rcq);
      CHECK(a.empty());
      CHECK(b.empty());
    }
    w.link.record(false);
    REQUIRE(swc.size() == 1);
    CHECK(swc[0].wr_id == id);
    CHECK(swc[0].status == WcStatus::Success);
    CHECK(swc[0].byte_len == expect_len);
    CHECK(swc[0].qp_num == qa);
    // Bytes.
    switch (op) {
      case WrOpcode::Send:
      case WrOpcode::SendImm:
      case WrOpcode::SendInv: {
        const uint32_t off = t == QpType::UD ? 40 : 0;
        CHECK(std::memcmp(dst.mem.data() + off, src.mem.data(), len) == 0);
        CHECK(dst.mem[off + len] == 0xEE);
        REQUIRE(rwc.size() == 1);
        CHECK(rwc[0].wr_id == 900 + id);
        CHECK(rwc[0].status == WcStatus::Success);
        CHECK(rwc[0].opcode == WcOpcode::Recv);
        CHECK(rwc[0].byte_len == len + off);
        if (op == WrOpcode::SendImm) {
          CHECK((rwc[0].wc_flags & kWcWithImm));
          CHECK(rwc[0].imm_data == imm);
        }
        if (op == WrOpcode::SendInv) {
          CHECK((rwc[0].wc_flags & kWcWithInv));
          CHECK(rwc[0].imm_data == inv_key);
          CHECK(B.eng->mrs().lookup(inv_key, B.pd.handle, 0, 0, 0, nullptr) == nullptr);
        }
        if (t == QpType::UD) {
          CHECK((rwc[0].wc_flags & kWcGrh));
          CHECK(rwc[0].src_qp == qa);
          // IPv4 header in the last 20 bytes of the GRH: version 4, source 10.0.0.1.
          CHECK(dst.mem[20] == 0x45);
          CHECK(dst.mem[20 + 12] == 10);
          CHECK(dst.mem[20 + 15] == 1);
        } else {
          CHECK(rwc[0].src_qp == qa);
        }
        break;
      }
      case WrOpcode::RdmaWrite:
      case WrOpcode::RdmaWriteImm:
        CHECK(std::memcmp(dst.mem.data() + 8, src.mem.data(), len) == 0);
        CHECK(dst.mem[7] == 0xEE);
        CHECK(dst.mem[8 + len] == 0xEE);
        if (op == WrOpcode::RdmaWriteImm) {
          REQUIRE(rwc.size() == 1);
          CHECK(rwc[0].opcode == WcOpcode::RecvRdmaWithImm);
          CHECK(rwc[0].imm_data == imm);
          CHECK(rwc[0].byte_len == len);
        } else {
          CHECK(rwc.empty());
        }
        break;
      case WrOpcode::RdmaRead:
        CHECK(std::memcmp(src.mem.data(), dst.mem.data() + 8, len) == 0);
        CHECK(src.mem[len] == 0xEE);
        break;
      case WrOpcode::AtomicCmpSwp:
      case WrOpcode::AtomicFetchAdd: {
        uint64_t now_val, got;
        std::memcpy(&now_val, dst.mem.data() + 16, 8);
        std::memcpy(&got, src.mem.data(), 8);
        CHECK(got == target_before);
        CHECK(now_val == (op == WrOpcode::AtomicCmpSwp ? 0xCAFEBABEDEADBEEFull : target_before + 5));
        break;
      }
      default: break;
    }
    if (t != QpType::UD) check_wire(w.link, t, op, static_cast<uint32_t>(expect_len == 8 && len == 1 ? 8 : len), mtu, psn);
    psn = wire::psn_add(psn, npkts_for(len, mtu));
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
  std::vector<Wc> wc;
  REQUIRE(w.run([&] {
    auto a = A.drain(A.scq);
    wc.insert(wc.end(), a.begin(), a.end());
    return !wc.empty();
  }));
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
  std::vector<Wc> wc;
  REQUIRE(w.run([&] {
    auto a = A.drain(A.scq);
    wc.insert(wc.end(), a.begin(), a.end());
    return !wc.empty();
  }));
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
  std::vector<Wc> wc;
  REQUIRE(w.run([&] {
    auto a = A.drain(A.scq);
    wc.insert(wc.end(), a.begin(), a.end());
    return !wc.empty();
  }, 50'000'000));
  REQUIRE(wc[0].status == WcStatus::Success);
  CHECK(wc[0].byte_len == Aliased::kLen);
  CHECK(std::memcmp(src.base, dst.base, Aliased::kChunk) == 0);
  CHECK(A.eng->counter(Ctr::ReqPackets) == Aliased::kLen / 4096);
  // READ it back into A's region after scrambling A's bytes.
  std::memset(src.base, 0, Aliased::kChunk);
  wr.wr_id = 2;
  wr.opcode = WrOpcode::RdmaRead;
  REQUIRE(A.eng->post_send(qa, wr) == 0);
  wc.clear();
  REQUIRE(w.run([&] {
    auto a = A.drain(A.scq);
    wc.insert(wc.end(), a.begin(), a.end());
    return !wc.empty();
  }, 50'000'000));
  REQUIRE(wc[0].status == WcStatus::Success);
  CHECK(std::memcmp(src.base, dst.base, Aliased::kChunk) == 0);
  CHECK(B.eng->counter(Ctr::ReadRespSent) == Aliased::kLen / 4096);
  (void)qb;
}

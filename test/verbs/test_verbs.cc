// lib/verbs: enum values equal <infiniband/verbs.h>, the MR table, CQ ring,
// QP state machine (modify_qp attribute checks), post_send/post_recv checks.
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <vector>

#include "verbs/mr.h"
#include "verbs/mw.h"
#include "verbs/queues.h"

using namespace droce::verbs;

// The shim passes these through unchanged.
static_assert(int(WcStatus::Success) == IBV_WC_SUCCESS && int(WcStatus::LocLenErr) == IBV_WC_LOC_LEN_ERR &&
              int(WcStatus::LocProtErr) == IBV_WC_LOC_PROT_ERR && int(WcStatus::WrFlushErr) == IBV_WC_WR_FLUSH_ERR &&
              int(WcStatus::RemInvReqErr) == IBV_WC_REM_INV_REQ_ERR &&
              int(WcStatus::RemAccessErr) == IBV_WC_REM_ACCESS_ERR && int(WcStatus::RemOpErr) == IBV_WC_REM_OP_ERR &&
              int(WcStatus::RetryExcErr) == IBV_WC_RETRY_EXC_ERR &&
              int(WcStatus::RnrRetryExcErr) == IBV_WC_RNR_RETRY_EXC_ERR && int(WcStatus::GeneralErr) == IBV_WC_GENERAL_ERR);
static_assert(int(WcOpcode::Send) == IBV_WC_SEND && int(WcOpcode::RdmaWrite) == IBV_WC_RDMA_WRITE &&
              int(WcOpcode::RdmaRead) == IBV_WC_RDMA_READ && int(WcOpcode::CompSwap) == IBV_WC_COMP_SWAP &&
              int(WcOpcode::FetchAdd) == IBV_WC_FETCH_ADD && int(WcOpcode::Recv) == IBV_WC_RECV &&
              int(WcOpcode::RecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(int(kWcGrh) == int(IBV_WC_GRH) && int(kWcWithImm) == int(IBV_WC_WITH_IMM) && int(kWcWithInv) == int(IBV_WC_WITH_INV));
static_assert(int(kAccessLocalWrite) == int(IBV_ACCESS_LOCAL_WRITE) && int(kAccessRemoteWrite) == int(IBV_ACCESS_REMOTE_WRITE) &&
              int(kAccessRemoteRead) == int(IBV_ACCESS_REMOTE_READ) && int(kAccessRemoteAtomic) == int(IBV_ACCESS_REMOTE_ATOMIC));
static_assert(int(kSendFence) == int(IBV_SEND_FENCE) && int(kSendSignaled) == int(IBV_SEND_SIGNALED) &&
              int(kSendSolicited) == int(IBV_SEND_SOLICITED) && int(kSendInline) == int(IBV_SEND_INLINE));
static_assert(int(QpState::Reset) == IBV_QPS_RESET && int(QpState::Init) == IBV_QPS_INIT &&
              int(QpState::Rtr) == IBV_QPS_RTR && int(QpState::Rts) == IBV_QPS_RTS && int(QpState::Sqd) == IBV_QPS_SQD &&
              int(QpState::Sqe) == IBV_QPS_SQE && int(QpState::Err) == IBV_QPS_ERR);
static_assert(int(Mtu::M256) == IBV_MTU_256 && int(Mtu::M4096) == IBV_MTU_4096);
static_assert(int(kQpState) == int(IBV_QP_STATE) && int(kQpAccessFlags) == int(IBV_QP_ACCESS_FLAGS) && int(kQpQkey) == int(IBV_QP_QKEY) &&
              int(kQpAv) == int(IBV_QP_AV) && int(kQpPathMtu) == int(IBV_QP_PATH_MTU) && int(kQpTimeout) == int(IBV_QP_TIMEOUT) &&
              int(kQpRetryCnt) == int(IBV_QP_RETRY_CNT) && int(kQpRnrRetry) == int(IBV_QP_RNR_RETRY) && int(kQpRqPsn) == int(IBV_QP_RQ_PSN) &&
              int(kQpMaxQpRdAtomic) == int(IBV_QP_MAX_QP_RD_ATOMIC) && int(kQpMinRnrTimer) == int(IBV_QP_MIN_RNR_TIMER) &&
              int(kQpSqPsn) == int(IBV_QP_SQ_PSN) && int(kQpMaxDestRdAtomic) == int(IBV_QP_MAX_DEST_RD_ATOMIC) &&
              int(kQpDestQpn) == int(IBV_QP_DEST_QPN) && int(kQpCap) == int(IBV_QP_CAP));
static_assert(int(WrOpcode::RdmaWrite) == IBV_WR_RDMA_WRITE && int(WrOpcode::RdmaWriteImm) == IBV_WR_RDMA_WRITE_WITH_IMM &&
              int(WrOpcode::Send) == IBV_WR_SEND && int(WrOpcode::SendImm) == IBV_WR_SEND_WITH_IMM &&
              int(WrOpcode::RdmaRead) == IBV_WR_RDMA_READ && int(WrOpcode::AtomicCmpSwp) == IBV_WR_ATOMIC_CMP_AND_SWP &&
              int(WrOpcode::AtomicFetchAdd) == IBV_WR_ATOMIC_FETCH_AND_ADD && int(WrOpcode::SendInv) == IBV_WR_SEND_WITH_INV);
static_assert(int(WrOpcode::LocalInv) == IBV_WR_LOCAL_INV && int(WrOpcode::BindMw) == IBV_WR_BIND_MW &&
              int(WcOpcode::BindMw) == IBV_WC_BIND_MW && int(WcOpcode::LocalInv) == IBV_WC_LOCAL_INV &&
              int(WcStatus::MwBindErr) == IBV_WC_MW_BIND_ERR && int(kAccessMwBind) == int(IBV_ACCESS_MW_BIND) &&
              int(MwType::Type1) == IBV_MW_TYPE_1 && int(MwType::Type2) == IBV_MW_TYPE_2);
static_assert(int(QpType::RC) == IBV_QPT_RC && int(QpType::UC) == IBV_QPT_UC && int(QpType::UD) == IBV_QPT_UD);

namespace {
struct Table {
  explicit Table(uint32_t n) : mem(MrTable::bytes_for(n) / 64 + 1), t(mem.data(), MrTable::bytes_for(n)) {}
  struct alignas(64) Line {
    uint8_t b[64];
  };
  std::vector<Line> mem;
  MrTable t;
};
}  // namespace

TEST_CASE("MR table: keys, tags, PD, bounds, access", "[verbs][mr]") {
  Table tb(8);
  MrTable& t = tb.t;
  std::vector<uint8_t> buf(4096);
  const Pd pd{1}, other{2};
  uint32_t key = 0;
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessLocalWrite | kAccessRemoteWrite, &key) == 0);
  CHECK((key >> 8) != 0);
  const uint64_t va = reinterpret_cast<uint64_t>(buf.data());
  MrError e = MrError::Ok;
  CHECK(t.lookup(key, 1, va, 4096, kAccessRemoteWrite, &e) == buf.data());
  CHECK(t.lookup(key, 1, va + 100, 10, 0, &e) == buf.data() + 100);
  CHECK(t.lookup(key, 2, va, 1, 0, &e) == nullptr);
  CHECK(e == MrError::BadPd);
  CHECK(t.lookup(key, 1, va + 4000, 97, 0, &e) == nullptr);
  CHECK(e == MrError::OutOfBounds);
  CHECK(t.lookup(key, 1, va - 1, 1, 0, &e) == nullptr);
  CHECK(t.lookup(key, 1, va + 1, ~uint64_t{0}, 0, &e) == nullptr);  // length overflow
  CHECK(e == MrError::OutOfBounds);
  CHECK(t.lookup(key, 1, va, 8, kAccessRemoteRead, &e) == nullptr);
  CHECK(e == MrError::NoAccess);
  CHECK(t.lookup(key ^ 1, 1, va, 8, 0, &e) == nullptr);
  CHECK(e == MrError::BadKey);
  CHECK(t.lookup(0xFFFFFF00, 1, va, 8, 0, &e) == nullptr);
  // Reuse bumps the tag: the old key stays dead.
  REQUIRE(t.dereg(key) == 0);
  CHECK(t.dereg(key) == EINVAL);
  uint32_t key2 = 0;
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessLocalWrite, &key2) == 0);
  CHECK((key2 >> 8) == (key >> 8));
  CHECK(key2 != key);
  CHECK(t.lookup(key, 1, va, 8, 0, &e) == nullptr);
  // Invalidation: an ordinary MR cannot be invalidated remotely (IBTA 10.6.7: only
  // type 2 windows and fast-registered regions), a fast-registered one can, once,
  // and only by its own PD.
  CHECK_FALSE(t.can_invalidate(key2, pd.handle));
  CHECK(t.invalidate(key2, pd.handle) == false);
  CHECK(t.lookup(key2, 1, va, 8, 0, &e) != nullptr);
  REQUIRE(t.dereg(key2) == 0);
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessLocalWrite | kMrRemoteInvalidate, &key2) == 0);
  CHECK(t.invalidate(key2, other.handle) == false);
  CHECK(t.invalidate(key2, pd.handle));
  CHECK(t.invalidate(key2, pd.handle) == false);
  CHECK(t.lookup(key2, 1, va, 8, 0, &e) == nullptr);
  CHECK(e == MrError::Invalidated);
  // Bad arguments, capacity.
  CHECK(t.reg(Pd{0}, buf.data(), 1, 0, &key) == EINVAL);
  CHECK(t.reg(pd, buf.data(), 1, kAccessRemoteWrite, &key) == EINVAL);  // needs LOCAL_WRITE
  CHECK(t.reg(pd, buf.data(), 1, 0x100, &key) == EINVAL);
  int ok = 0;
  while (t.reg(pd, buf.data(), 1, 0, &key) == 0) ++ok;
  CHECK(ok == 8 - 2);  // index 0 is reserved, one slot in use
  CHECK(t.reg(pd, buf.data(), 1, 0, &key) == ENOMEM);
}

TEST_CASE("CQ ring: order, capacity, overrun", "[verbs][cq]") {
  Cq cq(4);
  for (uint64_t i = 0; i < 4; ++i) {
    Wc wc;
    wc.wr_id = i;
    CHECK(cq.push(wc));
  }
  CHECK_FALSE(cq.push(Wc{}));
  CHECK(cq.overruns() == 1);
  Wc out[8];
  REQUIRE(cq.poll(out, 8) == 4);
  for (int i = 0; i < 4; ++i) CHECK(out[i].wr_id == uint64_t(i));
  CHECK(cq.poll(out, 8) == 0);
}

TEST_CASE("QP state machine: modify_qp checks per transition and type", "[verbs][qp]") {
  Cq cq(16);
  QpInitAttr init;
  init.pd = 1;
  init.send_cq = init.recv_cq = &cq;
  QpBase qp(5, init);
  QpAttr a;
  // RESET -> RTR is not a transition.
  a.qp_state = QpState::Rtr;
  CHECK(qp.check_modify(a, kQpState) == EINVAL);
  // RESET -> INIT needs PKEY_INDEX, PORT, ACCESS_FLAGS for RC.
  a.qp_state = QpState::Init;
  CHECK(qp.check_modify(a, kQpState | kQpPkeyIndex | kQpPort) == EINVAL);
  CHECK(qp.check_modify(a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags | kQpQkey) == EINVAL);  // QKEY not for RC
  REQUIRE(qp.check_modify(a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags) == 0);
  qp.apply_attrs(a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags);
  CHECK(qp.state == QpState::Init);
  // INIT -> RTR needs AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER.
  a.qp_state = QpState::Rtr;
  const uint32_t rtr = kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
  CHECK(qp.check_modify(a, rtr & ~kQpMinRnrTimer) == EINVAL);
  a.path_mtu = static_cast<Mtu>(6);
  CHECK(qp.check_modify(a, rtr) == EINVAL);  // MTU out of range
  a.path_mtu = Mtu::M256;
  a.max_dest_rd_atomic = kMaxRdAtomic + 1;
  CHECK(qp.check_modify(a, rtr) == EINVAL);
  a.max_dest_rd_atomic = 4;
  a.dest_qp_num = 1u << 24;
  CHECK(qp.check_modify(a, rtr) == EINVAL);
  a.dest_qp_num = 9;
  CHECK(qp.check_modify(a, rtr | kQpSqPsn) == EINVAL);  // SQ_PSN not allowed here
  REQUIRE(qp.check_modify(a, rtr) == 0);
  qp.apply_attrs(a, rtr);
  CHECK(qp.mtu == 256);
  // post_send is refused before RTS.
  SendWr wr;
  wr.opcode = WrOpcode::Send;
  CHECK(qp.post_send(wr) == EINVAL);
  // RTR -> RTS needs SQ_PSN, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC.
  a.qp_state = QpState::Rts;
  const uint32_t rts = kQpState | kQpSqPsn | kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
  a.retry_cnt = 8;
  CHECK(qp.check_modify(a, rts) == EINVAL);
  a.retry_cnt = 7;
  a.timeout = 32;
  CHECK(qp.check_modify(a, rts) == EINVAL);
  a.timeout = 14;
  a.cur_qp_state = QpState::Init;
  CHECK(qp.check_modify(a, rts | kQpCurState) == EINVAL);  // wrong current state
  a.cur_qp_state = QpState::Rtr;
  REQUIRE(qp.check_modify(a, rts | kQpCurState) == 0);
  qp.apply_attrs(a, rts);
  CHECK(qp.state == QpState::Rts);
  // RC never goes to SQE; RTS -> SQD -> RTS is fine; anything -> ERR / RESET is fine.
  a.qp_state = QpState::Sqe;
  CHECK(qp.check_modify(a, kQpState) == EINVAL);
  a.qp_state = QpState::Sqd;
  CHECK(qp.check_modify(a, kQpState) == 0);
  a.qp_state = QpState::Err;
  CHECK(qp.check_modify(a, kQpState) == 0);
  a.qp_state = QpState::Reset;
  CHECK(qp.check_modify(a, kQpState) == 0);
  // post_send limits.
  wr.num_sge = kMaxSge + 1;
  CHECK(qp.post_send(wr) == EINVAL);
  wr.num_sge = 0;
  wr.opcode = WrOpcode::AtomicFetchAdd;
  CHECK(qp.post_send(wr) == EINVAL);  // atomics need exactly 8 bytes
  // Memory-window work requests are taken on RC (their SGEs ignored: no data).
  wr.opcode = WrOpcode::LocalInv;
  wr.num_sge = 3;
  CHECK(qp.post_send(wr) == 0);
  CHECK(qp.sq.at(qp.sq.head - 1).wr.num_sge == 0);
  wr.num_sge = 0;
  wr.opcode = WrOpcode::Send;
  for (int i = 0; i < 63; ++i) REQUIRE(qp.post_send(wr) == 0);
  CHECK(qp.post_send(wr) == ENOMEM);
}

TEST_CASE("QP state machine: UD and UC attribute sets", "[verbs][qp]") {
  Cq cq(16);
  QpInitAttr init;
  init.pd = 1;
  init.send_cq = init.recv_cq = &cq;
  init.qp_type = QpType::UD;
  QpBase ud(6, init);
  QpAttr a;
  a.qp_state = QpState::Init;
  CHECK(ud.check_modify(a, kQpState | kQpPkeyIndex | kQpPort | kQpAccessFlags) == EINVAL);
  REQUIRE(ud.check_modify(a, kQpState | kQpPkeyIndex | kQpPort | kQpQkey) == 0);
  ud.apply_attrs(a, kQpState | kQpPkeyIndex | kQpPort | kQpQkey);
  a.qp_state = QpState::Rtr;
  CHECK(ud.check_modify(a, kQpState | kQpAv) == EINVAL);
  REQUIRE(ud.check_modify(a, kQpState) == 0);
  ud.apply_attrs(a, kQpState);
  a.qp_state = QpState::Rts;
  CHECK(ud.check_modify(a, kQpState) == EINVAL);  // SQ_PSN required
  REQUIRE(ud.check_modify(a, kQpState | kQpSqPsn) == 0);
  ud.apply_attrs(a, kQpState | kQpSqPsn);
  // UD cannot do RDMA.
  SendWr wr;
  wr.opcode = WrOpcode::RdmaWrite;
  CHECK(ud.post_send(wr) == EINVAL);
  wr.opcode = WrOpcode::Send;
  CHECK(ud.post_send(wr) == EINVAL);  // needs an address handle
  Ah ah;
  wr.ud.ah = &ah;
  CHECK(ud.post_send(wr) == 0);

  init.qp_type = QpType::UC;
  QpBase uc(7, init);
  a.qp_state = QpState::Init;
  uc.apply_attrs(a, kQpState);
  a.qp_state = QpState::Rtr;
  CHECK(uc.check_modify(a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic) == EINVAL);
  CHECK(uc.check_modify(a, kQpState | kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn) == 0);
}

TEST_CASE("RNR timer and ACK timeout encodings", "[verbs]") {
  CHECK(rnr_timer_ns(0) == 655'360'000);
  CHECK(rnr_timer_ns(1) == 10'000);
  CHECK(rnr_timer_ns(14) == 1'280'000);
  CHECK(rnr_timer_ns(31) == 491'520'000);
  CHECK(ack_timeout_ns(0) == 0);
  CHECK(ack_timeout_ns(1) == 8192);
  CHECK(ack_timeout_ns(14) == 4096ull << 14);
}

TEST_CASE("MR table: key tags are unpredictable, replicas with one seed agree", "[verbs][mr]") {
  // Re-registering one slot 64 times: every tag is non-zero and differs from the
  // slot's previous one; the tags are not the old +1 sequence (a stranger who saw
  // one key cannot name the next); two tables with the same seed and the same
  // calls hand out the same keys (the dataplane's per-core replicas), tables with
  // other seeds do not.
  auto run = [](uint64_t seed) {
    std::vector<uint8_t> mem(MrTable::bytes_for(8) + 64);
    auto p = (reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63};
    MrTable t(reinterpret_cast<void*>(p), MrTable::bytes_for(8), seed);
    std::vector<uint8_t> buf(64);
    std::vector<uint32_t> keys;
    for (int i = 0; i < 64; ++i) {
      uint32_t k = 0;
      REQUIRE(t.reg(Pd{1}, buf.data(), buf.size(), 0, &k) == 0);
      keys.push_back(k);
      REQUIRE(t.dereg(k) == 0);
    }
    return keys;
  };
  const auto a = run(12345), b = run(12345), c = run(999), d = run(0), e = run(0);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(d != e);  // seed 0: a random seed per table
  int sequential = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK((a[i] & 0xFF) != 0);
    CHECK((a[i] >> 8) == (a[0] >> 8));  // the same slot each time
    if (i > 0) {
      CHECK(a[i] != a[i - 1]);
      if (((a[i - 1] + 1) & 0xFF) == (a[i] & 0xFF)) ++sequential;
    }
  }
  CHECK(sequential < 8);  // a counter would give 63
}

namespace {
SendWr bind_wr(uint32_t mw, uint8_t key_byte, uint32_t mr, uint64_t addr, uint64_t len, uint32_t access, bool type1) {
  SendWr w;
  w.opcode = WrOpcode::BindMw;
  w.bind.mw_rkey = mw;
  w.bind.new_rkey = (mw & ~0xFFu) | key_byte;
  w.bind.mr_lkey = mr;
  w.bind.addr = addr;
  w.bind.length = len;
  w.bind.access = access;
  w.bind.type1 = type1;
  return w;
}
}  // namespace

TEST_CASE("MW table: bind rules, access through a window, invalidate, dealloc, MR busy", "[verbs][mw]") {
  Table tb(8);
  MrTable& t = tb.t;
  MwTable mw(t, 4, 7);
  std::vector<uint8_t> buf(4096);
  const uint64_t va = reinterpret_cast<uint64_t>(buf.data());
  const Pd pd{1}, other{2};
  uint32_t mr = 0, plain = 0, ro = 0;
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessLocalWrite | kAccessMwBind, &mr) == 0);
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessLocalWrite | kAccessRemoteWrite, &plain) == 0);
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessMwBind, &ro) == 0);  // no local write
  uint32_t w1 = 0, w2 = 0;
  CHECK(mw.alloc(pd, static_cast<MwType>(3), &w1) == EINVAL);
  CHECK(mw.alloc(Pd{0}, MwType::Type1, &w1) == EINVAL);
  REQUIRE(mw.alloc(pd, MwType::Type1, &w1) == 0);
  REQUIRE(mw.alloc(pd, MwType::Type2, &w2) == 0);
  CHECK(is_mw_key(w1));
  CHECK(is_mw_key(w2));
  CHECK_FALSE(is_mw_key(mr));
  MrError e = MrError::Ok;
  // Allocated, not bound: no access.
  CHECK(mw.lookup_remote(w1, 1, 5, va, 8, kAccessRemoteWrite, &e) == nullptr);
  CHECK(e == MrError::Invalidated);
  // Refused binds (MW_BIND_ERR), nothing changes.
  const uint32_t rw = kAccessRemoteWrite | kAccessRemoteRead;
  CHECK(mw.bind(1, 5, bind_wr(w1, 1, plain, va, 64, rw, true)) == WcStatus::MwBindErr);   // MR without MW_BIND
  CHECK(mw.bind(1, 5, bind_wr(w1, 1, ro, va, 64, kAccessRemoteWrite, true)) == WcStatus::MwBindErr);  // C10-74
  CHECK(mw.bind(1, 5, bind_wr(w1, 1, mr, va + 4000, 97, rw, true)) == WcStatus::MwBindErr);  // outside the MR
  CHECK(mw.bind(1, 5, bind_wr(w1, 1, mr, va - 1, 2, rw, true)) == WcStatus::MwBindErr);
  CHECK(mw.bind(2, 5, bind_wr(w1, 1, mr, va, 64, rw, true)) == WcStatus::MwBindErr);        // QP of another PD
  CHECK(mw.bind(1, 5, bind_wr(w1, 1, mr, va, 64, rw, false)) == WcStatus::MwBindErr);       // type 1 by a BIND_MW WR
  CHECK(mw.bind(1, 5, bind_wr(w2, 1, mr, va, 64, rw, true)) == WcStatus::MwBindErr);        // type 2 by ibv_bind_mw
  CHECK(mw.bind(1, 5, bind_wr(w2, 1, mr, va, 0, rw, false)) == WcStatus::MwBindErr);        // type 2, zero length
  CHECK(mw.bind(1, 5, bind_wr(w1, 1, mr, va, 64, rw | 0x20, true)) == WcStatus::MwBindErr); // zero based
  SendWr other_index = bind_wr(w1, 1, mr, va, 64, rw, true);
  other_index.bind.new_rkey ^= 0x100;
  CHECK(mw.bind(1, 5, other_index) == WcStatus::MwBindErr);
  CHECK(mw.bind(1, 5, bind_wr(w1 + (3u << 8), 1, mr, va, 64, rw, true)) == WcStatus::MwBindErr);  // no such window
  CHECK(mw.current_key(w1 + (3u << 8)) == 0);
  CHECK(mw.current_key(w1) == w1);
  CHECK(t.dereg(mr) == 0);  // nothing bound yet
  REQUIRE(t.reg(pd, buf.data(), buf.size(), kAccessLocalWrite | kAccessMwBind, &mr) == 0);

  // Type 1: bound on [va+64, va+192) with remote write only; the new key carries the byte.
  REQUIRE(mw.bind(1, 5, bind_wr(w1, 0x42, mr, va + 64, 128, kAccessRemoteWrite | kAccessLocalWrite, true)) ==
          WcStatus::Success);
  const uint32_t k1 = (w1 & ~0xFFu) | 0x42;
  CHECK(mw.current_key(w1) == k1);
  CHECK(mw.lookup_remote(w1, 1, 5, va + 64, 8, kAccessRemoteWrite, &e) == nullptr);  // the old key is dead
  CHECK(e == MrError::BadKey);
  CHECK(mw.lookup_remote(k1, 1, 5, va + 64, 128, kAccessRemoteWrite, &e) == buf.data() + 64);
  CHECK(mw.lookup_remote(k1, 1, 9, va + 100, 8, kAccessRemoteWrite, &e) == buf.data() + 100);  // any QP of the PD
  CHECK(mw.lookup_remote(k1, 2, 5, va + 64, 8, kAccessRemoteWrite, &e) == nullptr);
  CHECK(e == MrError::BadPd);
  CHECK(mw.lookup_remote(k1, 1, 5, va + 63, 8, kAccessRemoteWrite, &e) == nullptr);  // outside the window, inside the MR
  CHECK(e == MrError::OutOfBounds);
  CHECK(mw.lookup_remote(k1, 1, 5, va + 64, 129, kAccessRemoteWrite, &e) == nullptr);
  CHECK(mw.lookup_remote(k1, 1, 5, va + 65, ~uint64_t{0}, kAccessRemoteWrite, &e) == nullptr);
  CHECK(e == MrError::OutOfBounds);
  CHECK(mw.lookup_remote(k1, 1, 5, va + 64, 8, kAccessRemoteRead, &e) == nullptr);
  CHECK(e == MrError::NoAccess);
  // The MR's own key gives no remote access (it has none); the MR is busy.
  CHECK(mw.lookup_remote(mr, 1, 5, va + 64, 8, kAccessRemoteWrite, &e) == nullptr);
  CHECK(t.dereg(mr) == EBUSY);
  CHECK_FALSE(mw.can_invalidate(k1, 1));  // type 1 windows are not invalidated
  // Rebinding type 1 moves it; a zero-length bind unbinds it and frees the MR.
  REQUIRE(mw.bind(1, 5, bind_wr(k1, 0x43, mr, va, 4096, kAccessRemoteRead, true)) == WcStatus::Success);
  const uint32_t k1b = (w1 & ~0xFFu) | 0x43;
  CHECK(mw.lookup_remote(k1b, 1, 5, va + 4088, 8, kAccessRemoteRead, &e) == buf.data() + 4088);
  REQUIRE(mw.bind(1, 5, bind_wr(k1b, 0x44, 0, 0, 0, 0, true)) == WcStatus::Success);
  const uint32_t k1c = (w1 & ~0xFFu) | 0x44;
  CHECK(mw.lookup_remote(k1c, 1, 5, va, 1, 0, &e) == nullptr);
  CHECK(e == MrError::Invalidated);

  // Type 2: bound to QP 5; QP 6 gets nothing; invalidated once; then free to bind again.
  REQUIRE(mw.bind(1, 5, bind_wr(w2, 0x10, mr, va, 256, rw, false)) == WcStatus::Success);
  const uint32_t k2 = (w2 & ~0xFFu) | 0x10;
  CHECK(mw.lookup_remote(k2, 1, 5, va, 256, kAccessRemoteRead, &e) == buf.data());
  CHECK(mw.lookup_remote(k2, 1, 6, va, 8, kAccessRemoteRead, &e) == nullptr);
  CHECK(mw.bind(1, 5, bind_wr(k2, 0x11, mr, va, 256, rw, false)) == WcStatus::MwBindErr);  // still bound
  CHECK(t.dereg(mr) == EBUSY);
  CHECK_FALSE(mw.invalidate(k2, 2));       // another PD
  CHECK_FALSE(mw.invalidate(w2, 1));       // the key before the bind
  CHECK(mw.invalidate(k2, 1));
  CHECK_FALSE(mw.invalidate(k2, 1));
  CHECK(mw.lookup_remote(k2, 1, 5, va, 8, kAccessRemoteRead, &e) == nullptr);
  CHECK(e == MrError::Invalidated);
  REQUIRE(mw.bind(1, 5, bind_wr(k2, 0x11, mr, va, 256, rw, false)) == WcStatus::Success);
  const uint32_t k2b = (w2 & ~0xFFu) | 0x11;
  // Dealloc of a bound window: the key dies, the MR is free again.
  CHECK(t.dereg(mr) == EBUSY);
  CHECK(mw.dealloc(k2b) == 0);
  CHECK(mw.dealloc(k2b) == EINVAL);
  CHECK(mw.lookup_remote(k2b, 1, 5, va, 8, kAccessRemoteRead, &e) == nullptr);
  CHECK(e == MrError::BadKey);
  // Forced: unbind_mr ends every binding on the MR.
  uint32_t w3 = 0;
  REQUIRE(mw.alloc(pd, MwType::Type2, &w3) == 0);
  REQUIRE(mw.bind(1, 7, bind_wr(w3, 0x20, mr, va, 8, rw, false)) == WcStatus::Success);
  CHECK(t.dereg(mr) == EBUSY);
  CHECK(mw.unbind_mr(mr) == 1);
  CHECK(t.dereg(mr) == 0);
  CHECK(mw.lookup_remote((w3 & ~0xFFu) | 0x20, 1, 7, va, 8, kAccessRemoteRead, &e) == nullptr);
  // Capacity.
  uint32_t k = 0;
  int n = 0;
  while (mw.alloc(other, MwType::Type1, &k) == 0) ++n;
  CHECK(n == 4 - 2);  // w1 and w3 still allocated
  CHECK(mw.in_use() == 4);
}

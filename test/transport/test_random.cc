// Randomized tests with a fixed seed (printed on failure; override with
// DROCE_SEED): thousands of mixed work requests (SEND, SEND_IMM, SEND_INV,
// WRITE, WRITE_IMM, READ, CMP_SWP, FETCH_ADD) over many RC QPs under loss,
// reordering and duplication. Checks every byte, that each WR completes
// exactly once with the right status and in order, and that atomics execute
// exactly once. Then 30% loss with a small retry_cnt: RETRY_EXC_ERR, a clean
// flush and no hang (the run loop is bounded in iterations and virtual time).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

uint64_t seed_from_env(uint64_t dflt) {
  const char* s = std::getenv("DROCE_SEED");
  return s ? std::strtoull(s, nullptr, 0) : dflt;
}

constexpr uint32_t kSlot = 8192;  // bytes reserved per WR in the data regions

struct PlannedWr {
  WrOpcode op;
  uint32_t len;
  uint32_t slot;
  uint64_t atomic_expect;  // FETCH_ADD/CMP_SWP: value the WR must return
  uint32_t inv_key = 0;    // SEND_INV: a responder rkey registered for this WR alone
  Node::Buf* inv_mr = nullptr;
};

struct QpRun {
  uint32_t qa = 0, qb = 0;
  Node::Buf* a_data = nullptr;   // requester side: sources / READ targets
  Node::Buf* b_data = nullptr;   // responder side: WRITE targets / READ sources
  Node::Buf* b_recv = nullptr;   // responder receive buffers
  Node::Buf* a_atom = nullptr;   // atomic results (8 bytes per WR)
  Node::Buf* b_counter = nullptr;
  std::vector<PlannedWr> plan;
  size_t posted = 0, completed = 0, recv_posted = 0, recvs_done = 0;
  std::vector<size_t> recv_order;  // plan index per receive WQE
  uint64_t counter = 0;            // model of the remote 8-byte counter
};

struct Result {
  uint64_t ok = 0, errors = 0, flushed = 0, retry_exc = 0;
};

// sr: selective repeat on both nodes, each listing the other (lib/transport README).
Result run_random(uint64_t seed, int nqps, int wrs_per_qp, memlink::Faults faults, uint8_t retry_cnt,
                  bool expect_all_success, bool sr = false, uint64_t* sr_resent = nullptr) {
  INFO("seed " << seed << " (rerun with DROCE_SEED=" << seed << ")");
  EngineConfig cfg;
  cfg.max_inflight_pkts = 256;
  if (sr) {
    cfg.selective_repeat = true;
    cfg.sr_peers = {gid_of(0), gid_of(1)};
  }
  World w(seed, 2, cfg, 8192);
  w.link.set_faults(faults);
  if (std::getenv("DROCE_TRACE")) w.link.record(true);
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  std::mt19937_64 rng(seed ^ 0x5EED);
  QpOpts o;
  o.mtu = Mtu::M1024;
  o.timeout = 8;  // ~1 ms
  o.retry_cnt = retry_cnt;
  o.max_send_wr = 64;
  o.max_recv_wr = 64;
  std::vector<QpRun> qps(nqps);
  const WrOpcode kOps[] = {WrOpcode::Send,     WrOpcode::SendImm,      WrOpcode::SendInv,
                           WrOpcode::RdmaWrite, WrOpcode::RdmaWriteImm, WrOpcode::RdmaRead,
                           WrOpcode::AtomicCmpSwp, WrOpcode::AtomicFetchAdd};
  const uint32_t kSizes[] = {0, 1, 100, 1023, 1024, 1025, 3079, 8192};
  for (auto& q : qps) {
    o.sq_psn = static_cast<uint32_t>(rng()) & wire::kMask24;  // exercises PSN wraparound sometimes
    o.rq_psn = static_cast<uint32_t>(rng()) & wire::kMask24;
    if (rng() % 4 == 0) o.sq_psn = wire::kMask24 - 20;  // wraps during the run
    std::tie(q.qa, q.qb) = w.connect(0, 1, QpType::RC, o);
    q.a_data = &A.buffer(size_t{kSlot} * wrs_per_qp);
    q.b_data = &B.buffer(size_t{kSlot} * wrs_per_qp);
    q.b_recv = &B.buffer(size_t{kSlot} * wrs_per_qp);
    q.a_atom = &A.buffer(8 * size_t(wrs_per_qp));
    q.b_counter = &B.buffer(64);
    fill_random(q.a_data->mem, rng());
    fill_random(q.b_data->mem, rng());
    for (int i = 0; i < wrs_per_qp; ++i) {
      PlannedWr p{kOps[rng() % std::size(kOps)], kSizes[rng() % std::size(kSizes)], static_cast<uint32_t>(i), 0};
      if (p.op == WrOpcode::AtomicCmpSwp || p.op == WrOpcode::AtomicFetchAdd) {
        p.len = 8;
        p.atomic_expect = q.counter;
        q.counter = p.op == WrOpcode::AtomicCmpSwp ? q.counter * 3 + 1 : q.counter + 7;
      }
      if (p.op == WrOpcode::SendInv) {  // invalidated exactly once
        p.inv_mr = &B.buffer(64, kAccessAll | kMrRemoteInvalidate);  // fast-registered: remotely invalidatable
        p.inv_key = p.inv_mr->key;
      }
      q.plan.push_back(p);
    }
  }
  // Copies of what the sources hold, to check against after the run.
  std::vector<std::vector<uint8_t>> a_src(nqps), b_src(nqps);
  for (int i = 0; i < nqps; ++i) {
    a_src[i] = qps[i].a_data->mem;
    b_src[i] = qps[i].b_data->mem;
  }

  std::vector<WcStatus> first_error(nqps, WcStatus::Success);
  auto post_more = [&](QpRun& q) {
    // Once the requester failed, its later WRs are flushed and never reach the responder: a
    // receive posted for them would never be consumed and would fill the peer's RQ.
    const bool failed = first_error[&q - qps.data()] != WcStatus::Success;
    while (q.posted < q.plan.size() && q.posted - q.completed < 48) {
      const PlannedWr& p = q.plan[q.posted];
      const uint64_t id = (uint64_t{q.qa} << 32) | q.posted;
      const bool recv = p.op == WrOpcode::Send || p.op == WrOpcode::SendImm || p.op == WrOpcode::SendInv ||
                        p.op == WrOpcode::RdmaWriteImm;
      if (recv && !failed) {
        if (B.eng->post_recv(q.qb, make_recv(id, *q.b_recv, uint64_t{p.slot} * kSlot, kSlot)) != 0) break;
        q.recv_order.push_back(q.posted);
      }
      SendWr wr;
      const uint64_t off = uint64_t{p.slot} * kSlot;
      switch (p.op) {
        case WrOpcode::AtomicCmpSwp:
        case WrOpcode::AtomicFetchAdd:
          wr = make_wr(id, p.op, *q.a_atom, 8 * p.slot, 8);
          wr.atomic.remote_addr = q.b_counter->addr();
          wr.atomic.rkey = q.b_counter->key;
          wr.atomic.compare_add = p.op == WrOpcode::AtomicCmpSwp ? p.atomic_expect : 7;
          wr.atomic.swap = p.atomic_expect * 3 + 1;
          break;
        default:
          wr = make_wr(id, p.op, *q.a_data, off, p.len);
          wr.rdma = {q.b_data->addr() + off, q.b_data->key};
          wr.imm_data = static_cast<uint32_t>(id);
          wr.invalidate_rkey = p.inv_key;
          if (rng() % 3 == 0) wr.send_flags = 0;  // unsignaled (still completes in order)
          if (rng() % 10 == 0) wr.send_flags |= kSendFence;
          if (p.len <= kMaxInline && p.op != WrOpcode::RdmaRead && rng() % 4 == 0) wr.send_flags |= kSendInline;
          if (q.posted + 1 == q.plan.size()) wr.send_flags |= kSendSignaled;  // the last one shows the end
      }
      const int rc = A.eng->post_send(q.qa, wr);
      if (rc != 0) {
        FAIL("post_send " << rc);
      }
      ++q.posted;
    }
  };

  Result res;
  std::map<uint64_t, int> seen;  // wr_id -> completions
  auto qidx = [&](uint32_t qa) {
    for (int i = 0; i < nqps; ++i)
      if (qps[i].qa == qa) return i;
    return -1;
  };
  std::vector<size_t> last_done(nqps, 0);
  auto all_done_once = [&] {
    Wc wc[64];
    int n;
    while ((n = A.scq->poll(wc, 64)) > 0) {
      for (int k = 0; k < n; ++k) {
        const int i = qidx(wc[k].qp_num);
        REQUIRE(i >= 0);
        QpRun& q = qps[i];
        const size_t idx = wc[k].wr_id & 0xFFFFFFFF;
        ++seen[wc[k].wr_id];
        REQUIRE(seen[wc[k].wr_id] == 1);  // exactly once
        REQUIRE(idx >= last_done[i]);     // in order
        last_done[i] = idx + 1;
        q.completed = idx + 1;
        if (wc[k].status == WcStatus::Success) {
          ++res.ok;
          INFO("success after error on qp " << i << " wr " << idx);
          REQUIRE(first_error[i] == WcStatus::Success);
        } else if (wc[k].status == WcStatus::WrFlushErr) {
          ++res.flushed;
          REQUIRE(first_error[i] != WcStatus::Success);  // a flush follows the error
        } else {
          if (std::getenv("DROCE_DEBUG"))
            std::printf("qp %d wr %zu op %d status %s t=%lu\n", i, idx, int(q.plan[idx].op), wc_status_str(wc[k].status),
                        (unsigned long)w.clock.now_ns());
          if (std::getenv("DROCE_DEBUG")) {
            auto& c = A.eng->qp(q.qa)->ctr;
            std::printf("  seqnak %lu timeouts %lu rnr %lu retrans %lu\n", (unsigned long)c.seq_naks_received,
                        (unsigned long)c.timeouts, (unsigned long)c.rnr_naks_received, (unsigned long)c.retransmits);
          }
          ++res.errors;
          if (wc[k].status == WcStatus::RetryExcErr) ++res.retry_exc;
          REQUIRE(first_error[i] == WcStatus::Success);
          first_error[i] = wc[k].status;
        }
      }
    }
    while ((n = B.rcq->poll(wc, 64)) > 0) {
      for (int k = 0; k < n; ++k) {
        const int i = qidx(static_cast<uint32_t>(wc[k].wr_id >> 32));
        REQUIRE(i >= 0);
        QpRun& q = qps[i];
        REQUIRE(wc[k].status == WcStatus::Success);
        REQUIRE(q.recvs_done < q.recv_order.size());
        const PlannedWr& p = q.plan[q.recv_order[q.recvs_done]];
        REQUIRE((wc[k].wr_id & 0xFFFFFFFF) == q.recv_order[q.recvs_done]);  // receives in order
        ++q.recvs_done;
        if (std::getenv("DROCE_DEBUG") && wc[k].byte_len != p.len) {
          std::printf("qp %d recv wqe %lu: byte_len %u imm %u\n", i, (unsigned long)(wc[k].wr_id & 0xFFFFFFFF), wc[k].byte_len, wc[k].imm_data);
          for (size_t j = q.recv_order[q.recvs_done - 1] - 3; j < q.recv_order[q.recvs_done - 1] + 9 && j < q.plan.size(); ++j)
            std::printf("  plan %zu op %d len %u\n", j, int(q.plan[j].op), q.plan[j].len);
          if (std::getenv("DROCE_TRACE")) {
            for (auto& r : w.link.recorded()) {
              wire::PacketView v;
              const auto pe = wire::parse_frame(r.bytes, v);
              if (pe != wire::ParseError::Ok) { std::printf("t=%lu from %u corrupt\n", (unsigned long)r.time_ns, r.from_port); continue; }
              if (v.h.bth.dqpn != q.qb && v.h.bth.dqpn != q.qa) continue;
              std::printf("t=%lu %s psn %u len %u ackreq %d syn %02x imm %u\n", (unsigned long)r.time_ns, v.op->name,
                          v.h.bth.psn, v.payload_len, v.h.bth.ackreq, v.h.ext.aeth.syndrome, v.h.ext.imm);
            }
          }
        }
        CHECK(wc[k].byte_len == p.len);
        CHECK(bool(wc[k].wc_flags & kWcWithInv) == (p.op == WrOpcode::SendInv));
        if (p.op == WrOpcode::SendInv) {
          CHECK(wc[k].imm_data == p.inv_key);
        } else if (p.op != WrOpcode::Send) {
          CHECK(bool(wc[k].wc_flags & kWcWithImm));
          CHECK(wc[k].imm_data == static_cast<uint32_t>(wc[k].wr_id));
        }
      }
    }
    bool done = true;
    for (auto& q : qps) {
      // Completions for unsignaled WRs are implied by later ones: count the flow by posted/last.
      post_more(q);
      const int i = static_cast<int>(&q - qps.data());
      if (last_done[i] < q.plan.size()) done = false;
    }
    return done;
  };
  // Posting to a QP in ERR completes at once: repeat while that makes progress.
  auto all_done = [&] {
    for (int round = 0; round < 1000; ++round) {
      const size_t before = seen.size();
      if (all_done_once()) return true;
      if (seen.size() == before) break;
    }
    return false;
  };
  // Unsignaled WRs produce no completion: make the last WR of each QP signaled by
  // checking completion through the highest index seen.
  const bool finished = w.run(all_done, 20'000'000, 600'000'000'000ull);
  if (!finished) {
    for (int i = 0; i < nqps; ++i) {
      Qp* a = A.eng->qp(qps[i].qa);
      std::printf("qp %d posted %zu last_done %zu state %s comp.psn %u req.psn %u next_new %u deadline %lu rnr %d idx %u tail %u head %u now %lu\n", i,
                  qps[i].posted, last_done[i], qp_state_str(a->state), a->comp.psn, a->req.psn, a->req.next_new_psn,
                  (unsigned long)a->comp.deadline, a->comp.rnr_wait, a->req.idx, a->sq.tail, a->sq.head, (unsigned long)w.clock.now_ns());
    }
  }
  REQUIRE(finished);
  // Bytes: every successful WR's data is exactly where it belongs.
  for (int i = 0; i < nqps; ++i) {
    QpRun& q = qps[i];
    if (first_error[i] != WcStatus::Success) continue;
    size_t recv_i = 0;
    for (size_t k = 0; k < q.plan.size(); ++k) {
      const PlannedWr& p = q.plan[k];
      const size_t off = size_t{p.slot} * kSlot;
      INFO("qp " << i << " wr " << k << " op " << int(p.op) << " len " << p.len);
      switch (p.op) {
        case WrOpcode::SendInv:
          REQUIRE(mr_invalidated(B, *p.inv_mr));
          [[fallthrough]];
        case WrOpcode::Send:
        case WrOpcode::SendImm:
          REQUIRE(std::memcmp(q.b_recv->mem.data() + off, a_src[i].data() + off, p.len) == 0);
          ++recv_i;
          break;
        case WrOpcode::RdmaWrite:
        case WrOpcode::RdmaWriteImm:
          REQUIRE(std::memcmp(q.b_data->mem.data() + off, a_src[i].data() + off, p.len) == 0);
          break;
        case WrOpcode::RdmaRead:
          REQUIRE(std::memcmp(q.a_data->mem.data() + off, b_src[i].data() + off, p.len) == 0);
          break;
        case WrOpcode::AtomicCmpSwp:
        case WrOpcode::AtomicFetchAdd: {
          uint64_t got;
          std::memcpy(&got, q.a_atom->mem.data() + 8 * p.slot, 8);
          REQUIRE(got == p.atomic_expect);  // executed once, in order
          break;
        }
        default: break;
      }
    }
    uint64_t final_counter;
    std::memcpy(&final_counter, q.b_counter->mem.data(), 8);
    REQUIRE(final_counter == q.counter);
    (void)recv_i;
  }
  // Corrupted frames never delivered: every one the link damaged failed ICRC.
  CHECK(A.eng->counter(Ctr::RxIcrcErr) + B.eng->counter(Ctr::RxIcrcErr) == w.link.counter(memlink::Counter::Corrupted));
  if (expect_all_success) CHECK(res.errors == 0);
  UNSCOPED_INFO("ok " << res.ok << " errors " << res.errors << " flushed " << res.flushed << " retransmits "
                      << A.eng->counter(Ctr::ReqRetransmits) << " timeouts " << A.eng->counter(Ctr::AckTimeouts)
                      << " lost " << w.link.counter(memlink::Counter::Lost));
  if (sr_resent) *sr_resent = A.eng->counter(Ctr::SrResent) + B.eng->counter(Ctr::SrResent);
  return res;
}

// The link of the mixed runs: 5% loss, 5% reordering, 2% duplicates, 1%
// corrupted frames, 1 us away.
memlink::Faults mixed_faults() {
  memlink::Faults f;
  f.loss = 0.05;
  f.reorder = 0.05;
  f.duplicate = 0.02;
  f.corrupt = 0.01;
  f.delay_ns = 1000;
  return f;
}

}  // namespace

TEST_CASE("random mixed WRs under 5% loss reordering duplication", "[random]") {
  const memlink::Faults f = mixed_faults();
  const uint64_t seed = seed_from_env(20261129);
  const Result r = run_random(seed, 12, 250, f, 7, true);
  CHECK(r.ok > 0);
}

// The same mix (SEND, SEND with immediate/invalidate, WRITE, WRITE with
// immediate, READ, atomics) with selective repeat on: out-of-order placement,
// SACKs and every fallback under reordering and duplication; everything
// completes in order with the data checked as in go-back-N.
TEST_CASE("random mixed WRs under 5% loss reordering duplication with selective repeat", "[random][sr]") {
  const memlink::Faults f = mixed_faults();
  const uint64_t seed = seed_from_env(20261202);
  uint64_t resent = 0;
  const Result r = run_random(seed, 12, 250, f, 7, true, /*sr=*/true, &resent);
  CHECK(r.ok > 0);
  CHECK(resent > 0);
}

// With many QPs (at least Engine::kPrefetchMinQps, 64, on each node) the poll
// loop prefetches each RX burst's QPs and the requester's next QPs and send
// queue entries: the same checks over 96 QPs, with fewer WRs each.
TEST_CASE("random mixed WRs over 96 QPs under loss reordering duplication", "[random]") {
  const memlink::Faults f = mixed_faults();
  const uint64_t seed = seed_from_env(20261206);
  const Result r = run_random(seed, 96, 40, f, 7, true);
  CHECK(r.ok > 0);
}

TEST_CASE("random mixed WRs no faults wraparound", "[random]") {
  const Result r = run_random(seed_from_env(99), 4, 300, memlink::Faults{}, 7, true);
  CHECK(r.errors == 0);
}

TEST_CASE("30% loss with retry_cnt 1 gives RETRY_EXC_ERR and clean flush", "[random]") {
  memlink::Faults f;
  f.loss = 0.30;
  f.reorder = 0.05;
  f.delay_ns = 1000;
  const uint64_t seed = seed_from_env(31337);
  const Result r = run_random(seed, 8, 100, f, 1, false);
  INFO("seed " << seed);
  CHECK(r.retry_exc > 0);
  CHECK(r.flushed > 0);
}

// ---------------------------------------------------------------------------
// UC and UD under loss, reordering and corruption. These services do not
// retransmit, so the property is all-or-nothing per message: a message is
// delivered whole and exact or not at all, a receive completes only for a whole
// message, and the sender completes every WR (UC/UD complete on transmission).
// The link's duplication fault stays off here: neither UC nor UD detects
// duplicates (IBTA 9.7.7/9.8; rxe does not either), so a duplicated ONLY packet
// is, correctly, a second copy of the message.
namespace {

memlink::Faults lossy() {
  memlink::Faults f;
  f.loss = 0.05;
  f.reorder = 0.05;
  f.corrupt = 0.01;
  f.delay_ns = 1000;
  return f;
}

// Sender side: WR i of a QP is signaled and must complete exactly once, in order, with SUCCESS.
struct SendTrack {
  uint32_t qpn = 0;
  size_t posted = 0, completed = 0;
};

void check_send_completions(Node& A, std::vector<SendTrack>& qs, const std::vector<WrOpcode>* ops_of, size_t nops) {
  Wc wc[64];
  int n;
  while ((n = A.scq->poll(wc, 64)) > 0) {
    for (int k = 0; k < n; ++k) {
      const uint32_t qi = static_cast<uint32_t>(wc[k].wr_id >> 32), idx = static_cast<uint32_t>(wc[k].wr_id);
      REQUIRE(qi < qs.size());
      SendTrack& t = qs[qi];
      INFO("qp " << qi << " wr " << idx);
      REQUIRE(wc[k].qp_num == t.qpn);
      REQUIRE(wc[k].status == WcStatus::Success);
      REQUIRE(idx == t.completed);  // exactly once, in posting order
      REQUIRE(idx < nops);
      const WrOpcode op = ops_of[qi][idx];
      const bool write = op == WrOpcode::RdmaWrite || op == WrOpcode::RdmaWriteImm;
      CHECK(wc[k].opcode == (write ? WcOpcode::RdmaWrite : WcOpcode::Send));
      ++t.completed;
    }
  }
}

// Runs the world, topping up each sender's WRs with post_more, until every
// QP's nops WRs completed; then lets the last packets land (the link empty)
// and checks the completions that came with them.
template <typename PostMore>
void run_senders_to_completion(World& w, Node& A, std::vector<SendTrack>& qs, const std::vector<WrOpcode>* ops_of,
                               size_t nops, PostMore post_more) {
  REQUIRE(w.run([&] {
    check_send_completions(A, qs, ops_of, nops);
    post_more();
    for (auto& t : qs)
      if (t.completed < nops) return false;
    return true;
  }, 5'000'000));
  w.settle();  // the last packets land
  REQUIRE(w.link.in_flight() == 0);
  check_send_completions(A, qs, ops_of, nops);
}

struct UcMsg {
  WrOpcode op;
  uint32_t len;
  bool delivered = false;
};

}  // namespace

TEST_CASE("random UC messages under loss are delivered whole or not at all", "[random][uc]") {
  const uint64_t seed = seed_from_env(4711);
  INFO("seed " << seed << " (rerun with DROCE_SEED=" << seed << ")");
  constexpr int kQps = 6, kMsgs = 200;
  World w(seed, 2, EngineConfig{}, 8192);
  w.link.set_faults(lossy());
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  std::mt19937_64 rng(seed ^ 0xC0FFEE);
  QpOpts o;
  o.mtu = Mtu::M1024;
  o.max_send_wr = 64;
  o.max_recv_wr = kMsgs;
  const uint32_t mtu = 1024;
  const WrOpcode kOps[] = {WrOpcode::Send, WrOpcode::SendImm, WrOpcode::RdmaWrite, WrOpcode::RdmaWriteImm};
  const uint32_t kSizes[] = {0, 1, 100, 1023, 1024, 1025, 3079, 8192};
  struct Q {
    uint32_t qa, qb;
    Node::Buf *src, *dst, *recv;
    std::vector<UcMsg> msgs;
    std::vector<uint8_t> src_copy;
  };
  std::vector<Q> qs(kQps);
  std::vector<SendTrack> tracks(kQps);
  std::vector<std::vector<WrOpcode>> ops(kQps);
  for (int i = 0; i < kQps; ++i) {
    Q& q = qs[i];
    o.sq_psn = static_cast<uint32_t>(rng()) & wire::kMask24;
    if (i % 2) o.sq_psn = wire::kMask24 - 100;  // half the QPs wrap their PSN during the run
    o.rq_psn = o.sq_psn;
    std::tie(q.qa, q.qb) = w.connect(0, 1, QpType::UC, o);
    tracks[i].qpn = q.qa;
    q.src = &A.buffer(size_t{kSlot} * kMsgs);
    q.dst = &B.buffer(size_t{kSlot} * kMsgs);
    q.recv = &B.buffer(size_t{kSlot} * kMsgs);
    fill_random(q.src->mem, rng());
    q.src_copy = q.src->mem;
    // WRITE targets start as the complement of their source: every byte is either untouched or
    // the one sent, anything else is corruption.
    for (size_t b = 0; b < q.dst->mem.size(); ++b) q.dst->mem[b] = static_cast<uint8_t>(~q.src->mem[b]);
    for (int m = 0; m < kMsgs; ++m) {
      q.msgs.push_back({kOps[rng() % std::size(kOps)], kSizes[rng() % std::size(kSizes)]});
      ops[i].push_back(q.msgs.back().op);
      // One receive per message that could consume one; receive r lands in slot r.
      REQUIRE(B.eng->post_recv(q.qb, make_recv((uint64_t(i) << 32) | m, *q.recv, uint64_t{kSlot} * m, kSlot)) == 0);
    }
  }
  auto post_more = [&] {
    for (int i = 0; i < kQps; ++i) {
      Q& q = qs[i];
      SendTrack& t = tracks[i];
      while (t.posted < q.msgs.size() && t.posted - t.completed < 48) {
        const UcMsg& m = q.msgs[t.posted];
        const uint64_t off = uint64_t{kSlot} * t.posted;
        SendWr wr = make_wr((uint64_t(i) << 32) | t.posted, m.op, *q.src, off, m.len);
        wr.imm_data = static_cast<uint32_t>((i << 16) | t.posted);
        wr.rdma = {q.dst->addr() + off, q.dst->key};
        if (m.len <= kMaxInline && rng() % 4 == 0) wr.send_flags |= kSendInline;
        REQUIRE(A.eng->post_send(q.qa, wr) == 0);
        ++t.posted;
      }
    }
  };
  run_senders_to_completion(w, A, tracks, ops.data(), kMsgs, post_more);
  // Receive completions: in posting order per QP, each for one whole message, at most once.
  std::vector<size_t> recvs_done(kQps, 0);
  size_t delivered = 0, delivered_multi = 0;
  Wc wc[64];
  int n;
  while ((n = B.rcq->poll(wc, 64)) > 0) {
    for (int k = 0; k < n; ++k) {
      const Wc& c = wc[k];
      const uint32_t qi = static_cast<uint32_t>(c.wr_id >> 32), r = static_cast<uint32_t>(c.wr_id);
      REQUIRE(qi < qs.size());
      Q& q = qs[qi];
      INFO("qp " << qi << " receive " << r << " byte_len " << c.byte_len << " imm " << c.imm_data);
      REQUIRE(c.status == WcStatus::Success);
      REQUIRE(c.qp_num == q.qb);
      REQUIRE(r == recvs_done[qi]);  // receives complete in the order they were posted
      ++recvs_done[qi];
      const uint8_t* got = q.recv->mem.data() + uint64_t{kSlot} * r;
      int mi = -1;
      if (c.wc_flags & kWcWithImm) {
        REQUIRE((c.imm_data >> 16) == qi);
        mi = static_cast<int>(c.imm_data & 0xFFFF);
        REQUIRE(mi < kMsgs);
        const UcMsg& m = q.msgs[mi];
        REQUIRE(c.byte_len == m.len);
        if (m.op == WrOpcode::SendImm) {
          REQUIRE(c.opcode == WcOpcode::Recv);
          REQUIRE(std::memcmp(got, q.src_copy.data() + uint64_t{kSlot} * mi, m.len) == 0);
        } else {
          REQUIRE(m.op == WrOpcode::RdmaWriteImm);
          REQUIRE(c.opcode == WcOpcode::RecvRdmaWithImm);
          const uint64_t off = uint64_t{kSlot} * mi;
          REQUIRE(std::memcmp(q.dst->mem.data() + off, q.src_copy.data() + off, m.len) == 0);
        }
      } else {
        // A plain SEND: the message with this length and these bytes that was not delivered yet.
        REQUIRE(c.opcode == WcOpcode::Recv);
        for (int j = 0; j < kMsgs && mi < 0; ++j) {
          const UcMsg& m = q.msgs[j];
          if (m.op == WrOpcode::Send && !m.delivered && m.len == c.byte_len &&
              std::memcmp(got, q.src_copy.data() + uint64_t{kSlot} * j, m.len) == 0)
            mi = j;
        }
        REQUIRE(mi >= 0);  // else: bytes that no message carried (partial or corrupted)
      }
      REQUIRE(!q.msgs[mi].delivered);  // at most once
      q.msgs[mi].delivered = true;
      ++delivered;
      if (q.msgs[mi].len > mtu) ++delivered_multi;
    }
  }
  // WRITE targets: the bytes that landed are the sent ones, a prefix of whole packets (UC places
  // packets in sequence and drops the rest of a message at a gap); a WRITE_IMM that completed is whole.
  size_t writes_whole = 0, writes_partial = 0, writes_none = 0;
  for (int i = 0; i < kQps; ++i) {
    Q& q = qs[i];
    for (int j = 0; j < kMsgs; ++j) {
      const UcMsg& m = q.msgs[j];
      if (m.op != WrOpcode::RdmaWrite && m.op != WrOpcode::RdmaWriteImm) continue;
      INFO("qp " << i << " write " << j << " len " << m.len);
      const uint64_t off = uint64_t{kSlot} * j;
      const uint8_t* d = q.dst->mem.data() + off;
      const uint8_t* s = q.src_copy.data() + off;
      uint32_t prefix = 0;
      while (prefix < m.len && d[prefix] == s[prefix]) ++prefix;
      uint32_t untouched = prefix;
      while (untouched < kSlot && d[untouched] == static_cast<uint8_t>(~s[untouched])) ++untouched;
      REQUIRE(untouched == kSlot);  // after the prefix nothing changed: no corrupted or stray bytes
      if (m.delivered) REQUIRE(prefix == m.len);
      if (prefix == m.len) {
        ++writes_whole;
      } else {
        REQUIRE(prefix % mtu == 0);
        prefix ? ++writes_partial : ++writes_none;
      }
    }
  }
  // Not all delivered (the link lost some), not none; UC counted the messages it dropped.
  size_t consuming = 0;
  for (auto& q : qs)
    for (auto& m : q.msgs) consuming += m.op != WrOpcode::RdmaWrite;
  UNSCOPED_INFO("delivered " << delivered << " of " << consuming << " (multi-packet " << delivered_multi
                             << "), writes whole " << writes_whole << " partial " << writes_partial << " none "
                             << writes_none << ", lost " << w.link.counter(memlink::Counter::Lost));
  CHECK(delivered < consuming);
  CHECK(delivered > consuming / 2);
  CHECK(delivered_multi > 0);
  CHECK(B.eng->counter(Ctr::UcMsgDropped) > 0);
  CHECK(A.eng->counter(Ctr::RxIcrcErr) + B.eng->counter(Ctr::RxIcrcErr) == w.link.counter(memlink::Counter::Corrupted));
  for (auto& q : qs) CHECK(B.eng->qp(q.qb)->state == QpState::Rts);
}

TEST_CASE("random UD datagrams under loss are delivered intact or not at all", "[random][ud]") {
  const uint64_t seed = seed_from_env(8086);
  INFO("seed " << seed << " (rerun with DROCE_SEED=" << seed << ")");
  constexpr int kQps = 4, kMsgs = 250;  // kQps senders on A, kQps receivers on B
  constexpr uint32_t kRecvLen = 1024 + kGrhBytes;
  World w(seed, 2, EngineConfig{}, 8192);  // port MTU 1024
  w.link.set_faults(lossy());
  Node& A = *w.node[0];
  Node& B = *w.node[1];
  std::mt19937_64 rng(seed ^ 0xD06);
  QpOpts o;
  o.max_send_wr = 64;
  o.max_recv_wr = kQps * kMsgs;
  const uint32_t kSizes[] = {0, 1, 8, 100, 1000, 1023, 1024};
  struct Dgram {
    WrOpcode op;
    uint32_t len;
    uint32_t dst;  // receiver index
    bool bad_qkey;
    bool delivered = false;
  };
  std::vector<uint32_t> sq(kQps), rq(kQps);
  std::vector<Node::Buf*> src(kQps), recv(kQps);
  std::vector<std::vector<Dgram>> plan(kQps);
  std::vector<std::vector<WrOpcode>> ops(kQps);
  std::vector<SendTrack> tracks(kQps);
  for (int i = 0; i < kQps; ++i) {
    sq[i] = w.create_qp(A, QpType::UD, o, nullptr);
    rq[i] = w.create_qp(B, QpType::UD, o, nullptr);
    REQUIRE(w.to_rts(A, sq[i], QpType::UD, o, B, 0, static_cast<uint32_t>(rng()) & wire::kMask24, 0) == 0);
    REQUIRE(w.to_rts(B, rq[i], QpType::UD, o, A, 0, 0, 0) == 0);
    tracks[i].qpn = sq[i];
    src[i] = &A.buffer(size_t{kSlot} * kMsgs);
    fill_random(src[i]->mem, rng());
    recv[i] = &B.buffer(size_t{kSlot} * kQps * kMsgs);
    for (int r = 0; r < kQps * kMsgs; ++r)
      REQUIRE(B.eng->post_recv(rq[i], make_recv((uint64_t(i) << 32) | r, *recv[i], uint64_t{kSlot} * r, kRecvLen)) == 0);
  }
  size_t good = 0, bad = 0;
  for (int i = 0; i < kQps; ++i) {
    for (int m = 0; m < kMsgs; ++m) {
      Dgram d{rng() % 2 ? WrOpcode::SendImm : WrOpcode::Send, kSizes[rng() % std::size(kSizes)],
              static_cast<uint32_t>(rng() % kQps), rng() % 10 == 0};
      (d.bad_qkey ? bad : good) += 1;
      plan[i].push_back(d);
      ops[i].push_back(d.op);
    }
  }
  const Ah ah = B.ah();
  auto post_more = [&] {
    for (int i = 0; i < kQps; ++i) {
      SendTrack& t = tracks[i];
      while (t.posted < plan[i].size() && t.posted - t.completed < 48) {
        const Dgram& d = plan[i][t.posted];
        SendWr wr = make_wr((uint64_t(i) << 32) | t.posted, d.op, *src[i], uint64_t{kSlot} * t.posted, d.len);
        wr.imm_data = static_cast<uint32_t>((i << 16) | t.posted);
        wr.ud = {&ah, rq[d.dst], d.bad_qkey ? o.qkey ^ 0x5A5A : o.qkey};
        if (d.len <= kMaxInline && rng() % 4 == 0) wr.send_flags |= kSendInline;
        REQUIRE(A.eng->post_send(sq[i], wr) == 0);
        ++t.posted;
      }
    }
  };
  run_senders_to_completion(w, A, tracks, ops.data(), kMsgs, post_more);
  std::vector<uint32_t> recvs_done(kQps, 0);
  size_t delivered = 0;
  Wc wc[64];
  int n;
  while ((n = B.rcq->poll(wc, 64)) > 0) {
    for (int k = 0; k < n; ++k) {
      const Wc& c = wc[k];
      const uint32_t ri = static_cast<uint32_t>(c.wr_id >> 32), r = static_cast<uint32_t>(c.wr_id);
      REQUIRE(ri < kQps);
      INFO("receiver " << ri << " receive " << r << " byte_len " << c.byte_len << " src_qp " << c.src_qp);
      REQUIRE(c.status == WcStatus::Success);
      REQUIRE(c.qp_num == rq[ri]);
      REQUIRE(c.opcode == WcOpcode::Recv);
      REQUIRE(r == recvs_done[ri]);  // receives complete in posting order
      ++recvs_done[ri];
      REQUIRE((c.wc_flags & kWcGrh));
      REQUIRE(c.byte_len >= kGrhBytes);
      const uint32_t len = c.byte_len - kGrhBytes;
      const uint8_t* got = recv[ri]->mem.data() + uint64_t{kSlot} * r;
      CHECK(got[20] == 0x45);  // the GRH slot holds the IPv4 header
      int si = -1;
      for (int i = 0; i < kQps; ++i)
        if (sq[i] == c.src_qp) si = i;
      REQUIRE(si >= 0);
      int mi = -1;
      if (c.wc_flags & kWcWithImm) {
        REQUIRE(int(c.imm_data >> 16) == si);
        mi = static_cast<int>(c.imm_data & 0xFFFF);
        REQUIRE(mi < kMsgs);
        REQUIRE(plan[si][mi].op == WrOpcode::SendImm);
      } else {
        for (int j = 0; j < kMsgs && mi < 0; ++j) {
          const Dgram& d = plan[si][j];
          // Datagrams equal in length, bytes and destination are interchangeable; bad Q_Keys never match.
          if (d.op == WrOpcode::Send && !d.delivered && !d.bad_qkey && d.dst == ri && d.len == len &&
              std::memcmp(got + kGrhBytes, src[si]->mem.data() + uint64_t{kSlot} * j, len) == 0)
            mi = j;
        }
        REQUIRE(mi >= 0);
      }
      Dgram& d = plan[si][mi];
      INFO("datagram " << si << "/" << mi);
      REQUIRE(d.dst == ri);
      REQUIRE(!d.bad_qkey);  // a wrong Q_Key is never delivered
      REQUIRE(d.len == len);
      REQUIRE(std::memcmp(got + kGrhBytes, src[si]->mem.data() + uint64_t{kSlot} * mi, len) == 0);
      REQUIRE(!d.delivered);  // at most once
      d.delivered = true;
      ++delivered;
    }
  }
  UNSCOPED_INFO("delivered " << delivered << " of " << good << " good datagrams; bad Q_Key " << bad << ", dropped "
                             << B.eng->counter(Ctr::UdQkeyDrop) << "; lost " << w.link.counter(memlink::Counter::Lost));
  CHECK(delivered < good);
  CHECK(delivered > good * 3 / 4);
  CHECK(B.eng->counter(Ctr::UdQkeyDrop) > 0);
  CHECK(B.eng->counter(Ctr::UdQkeyDrop) <= bad);
  CHECK(B.eng->counter(Ctr::UdNoRecvDrop) == 0);
  CHECK(A.eng->counter(Ctr::RxIcrcErr) + B.eng->counter(Ctr::RxIcrcErr) == w.link.counter(memlink::Counter::Corrupted));
}

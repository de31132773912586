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

Result run_random(uint64_t seed, int nqps, int wrs_per_qp, memlink::Faults faults, uint8_t retry_cnt,
                  bool expect_all_success) {
  INFO("seed " << seed << " (rerun with DROCE_SEED=" << seed << ")");
  EngineConfig cfg;
  cfg.max_inflight_pkts = 256;
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
      if (p.op == WrOpcode::SendInv) p.inv_key = B.buffer(64).key;  // invalidated exactly once
      q.plan.push_back(p);
    }
  }
  // Copies of what the sources hold, to check against after the run.
  std::vector<std::vector<uint8_t>> a_src(nqps), b_src(nqps);
  for (int i = 0; i < nqps; ++i) {
    a_src[i] = qps[i].a_data->mem;
    b_src[i] = qps[i].b_data->mem;
  }

  auto post_more = [&](QpRun& q) {
    while (q.posted < q.plan.size() && q.posted - q.completed < 48) {
      const PlannedWr& p = q.plan[q.posted];
      const uint64_t id = (uint64_t{q.qa} << 32) | q.posted;
      const bool recv = p.op == WrOpcode::Send || p.op == WrOpcode::SendImm || p.op == WrOpcode::SendInv ||
                        p.op == WrOpcode::RdmaWriteImm;
      if (recv) {
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
  std::vector<WcStatus> first_error(nqps, WcStatus::Success);
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
          REQUIRE(B.eng->mrs().lookup(p.inv_key, B.pd.handle, 0, 0, 0, nullptr) == nullptr);  // invalidated
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
  return res;
}

}  // namespace

TEST_CASE("random mixed WRs under 5% loss reordering duplication", "[random]") {
  memlink::Faults f;
  f.loss = 0.05;
  f.reorder = 0.05;
  f.duplicate = 0.02;
  f.corrupt = 0.01;
  f.delay_ns = 1000;
  const uint64_t seed = seed_from_env(20261129);
  const Result r = run_random(seed, 12, 250, f, 7, true);
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

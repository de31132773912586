// The ring poller: EngineShimBackend's data path, run by each core thread
// every turn of its loop (poll_core). Takes the clients' work requests from
// their shared-memory rings to the engine, the engine's completions to the
// clients' CQ rings, raises asynchronous events, and parks and wakes rings
// through the doorbells (README.md). The objects it walks are created and
// destroyed by the control calls in engine_backend.cc.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "shim/engine/backend_objects.h"
#include "verbs/queues.h"

namespace droce::shim {

using backend_detail::Ctr;
using backend_detail::kBatch;
using backend_detail::raise_event;

void EngineShimBackend::qp_error(Core& k, Qp& q, verbs::Cq* cq, uint64_t wr_id, verbs::WcStatus st,
                                 bool send) noexcept {
  k.bad_wqes.add(1);
  verbs::Wc wc;
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = send ? verbs::WcOpcode::Send : verbs::WcOpcode::Recv;
  wc.qp_num = q.qpn;
  q.eng->complete(cq, wc);
  verbs::QpAttr a;
  a.qp_state = verbs::QpState::Err;
  q.eng->modify_qp(q.qpn, a, verbs::kQpState);
}

namespace {
// A ring whose index moved by more than its size: the object is dead for good.
template <typename Ring>
bool ring_corrupt(Ring& ring, bool& dead, Ctr& corrupt) noexcept {
  if (!ring.corrupt()) return false;
  dead = true;
  corrupt.add(1);
  return true;
}
// Gives the first n slots back to the client and counts them.
template <typename Ring>
uint32_t release(Ring& ring, uint32_t n, Ctr& ctr) noexcept {
  if (n) {
    ring.release(n);
    ctr.add(n);
  }
  return n;
}
// Publishes a receive ring's `done` (droce_shm_abi.h, "receive depth"): the
// WQEs copied out (cons) minus those the engine still holds. One store, and
// only when it moved.
void publish_done(RingConsumer<droce_shm_recv_wqe>& ring, uint32_t& last, uint32_t held) noexcept {
  const uint32_t done = ring.cons() - held;
  if (done == last) return;
  last = done;
  recv_ring_set_done(ring.hdr(), done);
}
// Copies the used part of the next send WQE out of the shared slot: its
// 64 bytes of fields, then only the SGEs (or inline bytes) its own copied
// count names (bounded by the entry), not the whole 192-byte entry. What is
// validated and posted is this copy only.
void copy_send_wqe(const droce_shm_send_wqe* src, droce_shm_send_wqe& w) noexcept {
  std::memcpy(static_cast<void*>(&w), static_cast<const void*>(src), offsetof(droce_shm_send_wqe, u));
  const size_t body = (w.send_flags & DROCE_SEND_INLINE)
                          ? std::min<size_t>(w.inline_len, DROCE_SHM_MAX_INLINE)
                          : std::min<size_t>(w.num_sge, DROCE_SHM_MAX_SGE) * sizeof(droce_shm_sge);
  std::memcpy(static_cast<void*>(&w.u), static_cast<const void*>(&src->u), body);
}
// The same for a receive WQE: its 16 bytes of fields, then the SGEs it names.
void copy_recv_wqe(const droce_shm_recv_wqe* src, droce_shm_recv_wqe& w) noexcept {
  std::memcpy(static_cast<void*>(&w), static_cast<const void*>(src), offsetof(droce_shm_recv_wqe, sge));
  const size_t n = std::min<size_t>(w.num_sge, DROCE_SHM_MAX_SGE);
  std::memcpy(static_cast<void*>(w.sge), static_cast<const void*>(src->sge), n * sizeof(droce_shm_sge));
}
void to_recv_wr(const droce_shm_recv_wqe& w, verbs::RecvWr& r) noexcept {
  r.wr_id = w.wr_id;
  r.num_sge = w.num_sge;
  for (uint32_t j = 0; j < w.num_sge; ++j) r.sg_list[j] = {w.sge[j].addr, w.sge[j].length, w.sge[j].lkey};
}
}  // namespace

void EngineShimBackend::check_async(Core& k, Qp& q, verbs::QpState st) noexcept {
  if (st != verbs::QpState::Err) {
    q.err_seen = q.app_err = false;
    return;
  }
  if (q.err_seen) return;
  q.err_seen = true;
  // The QP went to ERR by itself (retries exceeded, remote error, bad WQE, CQ
  // overrun, ...); modify_qp(ERR) is no QP_FATAL.
  if (!q.app_err) raise_event(q.events, IBV_EVENT_QP_FATAL, q.async_fd, k.async_events);
  // On an SRQ, any way into ERR: the QP takes no more WQEs from the SRQ (the
  // event programs wait for before destroying such a QP).
  if (q.srq) raise_event(q.events, IBV_EVENT_QP_LAST_WQE_REACHED, q.async_fd, k.async_events);
}

// Receive ring: into the engine's RQ while it has room.
uint32_t EngineShimBackend::drain_rq(Core& k, Qp& q, verbs::QpState st) noexcept {
  const uint32_t n = std::min(q.rq.available(), kBatch);
  uint32_t i = 0;
  verbs::RecvWr r;  // one per batch: to_recv_wr sets every field post_recv reads
  for (; i < n; ++i) {
    droce_shm_recv_wqe w;
    copy_recv_wqe(q.rq.slot(i), w);  // copy out first: the client can still write the slot
    if (st == verbs::QpState::Reset) continue;  // RESET drops what is posted
    if (w.num_sge > q.max_recv_sge) {
      qp_error(k, q, q.rcq->ecq, w.wr_id, verbs::WcStatus::LocLenErr, false);
      continue;
    }
    to_recv_wr(w, r);
    const int rc = q.eng->post_recv(q.qpn, r);
    if (rc == ENOMEM) break;  // engine RQ full: the rest waits in the ring
    if (rc != 0) qp_error(k, q, q.rcq->ecq, w.wr_id, verbs::WcStatus::LocQpOpErr, false);
  }
  return release(q.rq, i, k.rq_wqes);
}

// Send ring: every entry copied out, validated, posted to the engine.
uint32_t EngineShimBackend::drain_sq(Core& k, Qp& q) noexcept {
  const uint32_t n = std::min(q.sq.available(), kBatch);
  uint32_t i = 0;
  // One per batch, not one value-initialised per WQE: every field the engine
  // reads for the WQE's opcode and QP type is set below (the SGEs in use,
  // the bind part for BIND_MW, the UD part on a UD QP).
  verbs::SendWr s;
  for (; i < n; ++i) {
    droce_shm_send_wqe w;
    copy_send_wqe(q.sq.slot(i), w);  // copy out first, then validate our copy
    if (q.eqp->state == verbs::QpState::Reset) continue;
    s.wr_id = w.wr_id;
    s.send_flags = w.send_flags & (verbs::kSendFence | verbs::kSendSignaled | verbs::kSendSolicited |
                                   verbs::kSendInline);
    bool ok = w.opcode < wire::kNumWrOpcodes;
    s.opcode = static_cast<verbs::WrOpcode>(w.opcode);
    if (ok && (w.send_flags & DROCE_SEND_INLINE)) {
      ok = w.inline_len <= DROCE_SHM_MAX_INLINE;
      // The engine copies inline bytes at post time, from our copy.
      s.num_sge = w.inline_len ? 1 : 0;
      s.sg_list[0] = {reinterpret_cast<uint64_t>(w.u.inline_data), w.inline_len, 0};
    } else if (ok) {
      ok = w.num_sge <= q.max_send_sge;
      s.num_sge = w.num_sge;
      for (uint32_t j = 0; ok && j < w.num_sge; ++j)
        s.sg_list[j] = {w.u.sge[j].addr, w.u.sge[j].length, w.u.sge[j].lkey};
    }
    s.imm_data = w.imm_data;
    s.invalidate_rkey = w.imm_data;
    s.rdma.remote_addr = w.remote_addr;
    s.rdma.rkey = w.rkey;
    s.atomic.remote_addr = w.remote_addr;
    s.atomic.rkey = w.rkey;
    s.atomic.compare_add = w.compare_add;
    s.atomic.swap = w.swap;
    if (s.opcode == verbs::WrOpcode::BindMw) {
      // droce_shm_abi.h: the engine checks all of it (window and MR of the QP's PD).
      s.bind.mw_rkey = w.imm_data;
      s.bind.new_rkey = w.rkey;
      s.bind.addr = w.remote_addr;
      s.bind.length = w.compare_add;
      s.bind.mr_lkey = static_cast<uint32_t>(w.swap);
      s.bind.access = static_cast<uint32_t>(w.swap >> 32);
      s.bind.type1 = (w.send_flags & DROCE_SEND_BIND_TYPE1) != 0;
    }
    if (ok && q.type == verbs::QpType::UD) {
      // The AH must exist and belong to the QP's PD (one client cannot use
      // another's AH by guessing its number).
      const uint32_t a = w.ah;
      ok = a != 0 && a < kMaxAhs && ahs_[a].live.load(std::memory_order_acquire) && ahs_[a].pd == q.pd &&
           ahs_[a].port == q.port;
      if (ok) s.ud.ah = &ahs_[a].ah;
      s.ud.remote_qpn = w.remote_qpn & 0xffffff;
      s.ud.remote_qkey = w.remote_qkey;
    }
    const int rc = ok ? q.eng->post_send(q.qpn, s) : EINVAL;
    if (rc == ENOMEM) break;  // engine SQ full: the rest waits in the ring
    if (rc != 0) qp_error(k, q, q.scq->ecq, w.wr_id, verbs::WcStatus::LocQpOpErr, true);
  }
  // The slots go back before any completion of these WRs can be published
  // (the CQs are drained after every QP, and the engine completes later).
  return release(q.sq, i, k.sq_wqes);
}

// The receives the engine holds for q: queued, and the one a message is
// landing in (rxe frees an RQ slot only when its receive completes). A QP on
// an SRQ holds none of its ring's (the SRQ counts them).
void EngineShimBackend::publish_rq_done(Qp& q) noexcept {
  if (!q.has_rq || q.dead) return;
  publish_done(q.rq, q.rq_done, q.eqp->rq.count() + (q.eqp->resp.have_recv ? 1u : 0u));
}

uint32_t EngineShimBackend::drain_qp(Core& k, Qp& q) noexcept {
  const uint32_t work = drain_qp_rings(k, q);
  // After everything here that may complete receives (a bad WQE's QP_ERR
  // flush included) and before the CQs are drained: a program that reaped a
  // receive's completion finds its slot free.
  publish_rq_done(q);
  return work;
}

uint32_t EngineShimBackend::drain_qp_rings(Core& k, Qp& q) noexcept {
  if (q.dead) return 0;
  const verbs::QpState st = q.eqp->state;
  check_async(k, q, st);
  auto to_error = [](Qp& x) {
    verbs::QpAttr a;
    a.qp_state = verbs::QpState::Err;
    x.eng->modify_qp(x.qpn, a, verbs::kQpState);
  };
  uint32_t work = 0;
  if (q.has_rq) {
    work += drain_rq(k, q, st);
    if (ring_corrupt(q.rq, q.dead, k.corrupt)) {
      to_error(q);
      return work;
    }
  }
  // The send ring is held while the QP cannot send yet (INIT, RTR).
  if (st == verbs::QpState::Init || st == verbs::QpState::Rtr) return work;
  work += drain_sq(k, q);
  if (ring_corrupt(q.sq, q.dead, k.corrupt)) to_error(q);
  return work;
}

uint32_t EngineShimBackend::drain_srq(Core& k, Srq& s) noexcept {
  if (s.dead) return 0;
  const uint32_t n = std::min(s.ring.available(), kBatch);
  uint32_t i = 0;
  verbs::RecvWr r;  // one per batch, as in drain_rq
  for (; i < n; ++i) {
    droce_shm_recv_wqe w;
    copy_recv_wqe(s.ring.slot(i), w);
    if (w.num_sge > s.max_sge) {  // no QP to fail: dropped and counted
      k.bad_wqes.add(1);
      continue;
    }
    to_recv_wr(w, r);
    if (s.eng->post_srq_recv(s.esrq, r) == ENOMEM) break;
  }
  release(s.ring, i, k.rq_wqes);
  if (ring_corrupt(s.ring, s.dead, k.corrupt)) return i;
  srq_maint(k, s);
  return i;
}

// What moves when a QP takes a WQE from the SRQ (on a turn that drains it,
// and before a completion of one of its QPs is published).
void EngineShimBackend::srq_maint(Core& k, Srq& s) noexcept {
  if (s.dead) return;
  // A WQE leaves the SRQ when a QP takes it (as rxe frees the SRQ slot).
  publish_done(s.ring, s.done, s.esrq->count());
  // Armed limit: fewer WQEs left (in the engine's SRQ and still in the ring) than it.
  const uint32_t lim = s.limit.load(std::memory_order_acquire);
  if (lim != 0 && s.esrq->count() + s.ring.available() < lim) {
    uint32_t expect = lim;
    if (s.limit.compare_exchange_strong(expect, 0, std::memory_order_acq_rel))  // one event per arm
      raise_event(s.events, IBV_EVENT_SRQ_LIMIT_REACHED, s.async_fd, k.async_events);
  }
}

void EngineShimBackend::cq_overrun(Core& k, Cq& c) noexcept {
  c.overruns_seen = c.ecq->overruns();
  if (c.err) return;
  c.err = true;
  // Completions were lost: the CQ is in error and so is every QP that uses it
  // (each QP then raises its own QP_FATAL), as on a kernel device.
  raise_event(c.events, IBV_EVENT_CQ_ERR, c.async_fd, k.async_events);
  for (Qp* q : k.qps) {
    if (q->scq != &c && q->rcq != &c) continue;
    verbs::QpAttr a;
    a.qp_state = verbs::QpState::Err;
    q->eng->modify_qp(q->qpn, a, verbs::kQpState);
    publish_rq_done(*q);  // flushed: before their completions are published
  }
}

uint32_t EngineShimBackend::drain_cq(Core& k, Cq& c) noexcept {
  if (c.ecq->overruns() != c.overruns_seen) cq_overrun(k, c);
  if (c.dead || c.ecq->pending() == 0) return 0;
  uint32_t room = c.ring.free_slots(kBatch);
  if (c.ring.corrupt()) {
    c.dead = true;
    k.corrupt.add(1);
    return 0;
  }
  room = std::min(room, kBatch);
  if (room == 0) return 0;  // the client has not reaped: completions wait in the engine CQ
  verbs::Wc wc[kBatch];
  const int n = c.ecq->poll(wc, static_cast<int>(room));
  bool error = false;
  uint32_t last_qpn = UINT32_MAX;
  for (int i = 0; i < n; ++i) {
    droce_shm_cqe* e = c.ring.slot(static_cast<uint32_t>(i));
    const verbs::Wc& w = wc[i];
    // A parked QP is not visited on every turn: its `done` (and its SRQ's)
    // moves here, before the completion is visible (one lookup per run of
    // completions of one QP).
    if (w.qp_num != last_qpn) {
      last_qpn = w.qp_num;
      before_cqe(k, c.port, w.qp_num);
    }
    e->wr_id = w.wr_id;
    e->status = static_cast<uint32_t>(w.status);
    e->opcode = static_cast<uint32_t>(w.opcode);
    e->vendor_err = w.vendor_err;
    e->byte_len = w.byte_len;
    e->imm_data = w.imm_data;
    e->qp_num = w.qp_num;
    e->src_qp = w.src_qp;
    e->wc_flags = w.wc_flags;
    e->pkey_index = w.pkey_index;
    e->slid = w.slid;
    e->sl = w.sl;
    e->dlid_path_bits = w.dlid_path_bits;
    error |= w.status != verbs::WcStatus::Success;
  }
  if (n <= 0) return 0;
  c.ring.publish(static_cast<uint32_t>(n));
  // The engine does not record the solicited bit: a solicited-only arm is
  // woken by the next completion (a spurious wake-up, never a lost one).
  (void)error;
  if (cq_consume_arm(c.ring.hdr(), true) && c.efd >= 0) {
    k.events.add(1);
    uint64_t one = 1;
    if (write(c.efd, &one, sizeof(one)) < 0) {
      // eventfd saturated: the client is not reading; nothing to do
    }
  }
  return static_cast<uint32_t>(n);
}

void EngineShimBackend::before_cqe(Core& k, uint32_t port, uint32_t qpn) noexcept {
  if (port >= k.by_qpn.size() || qpn >= k.by_qpn[port].size()) return;
  Qp* q = k.by_qpn[port][qpn];
  if (q == nullptr || q->dead) return;  // QP1 (the CM's), or one of the embedding's
  check_async(k, *q, q->eqp->state);
  publish_rq_done(*q);
  if (q->srq) srq_maint(k, *q->srq);
}

// ---- doorbells (core thread) ----

void EngineShimBackend::activate(Core& k, Qp& q) noexcept {
  if (q.parked) {
    q.parked = false;
    q.sq.unpark();
    if (q.has_rq) q.rq.unpark();
  }
  q.quiet = 0;
  if (q.active) return;
  q.active = true;
  k.active_qps.push_back(&q);  // capacity reserved at create: no allocation
}

void EngineShimBackend::activate(Core& k, Srq& s) noexcept {
  if (s.parked) {
    s.parked = false;
    s.ring.unpark();
  }
  s.quiet = 0;
  if (s.active) return;
  s.active = true;
  k.active_srqs.push_back(&s);
}

// Stops polling q's rings (droce_shm_abi.h, "doorbells"): idle = 1 on each,
// then their prod reloaded; false (still polled) when entries are there, held
// (INIT / RTR, a full engine queue) or published meanwhile.
bool EngineShimBackend::park(Qp& q) noexcept {
  if (q.dead) return true;  // never polled again
  uint32_t left = q.sq.park();
  if (q.has_rq) left += q.rq.park();
  if (left != 0) {
    q.sq.unpark();
    if (q.has_rq) q.rq.unpark();
    q.quiet = 0;
    return false;
  }
  q.parked = true;
  return true;
}

bool EngineShimBackend::park(Srq& s) noexcept {
  if (s.dead) return true;
  if (s.ring.park() != 0) {
    s.ring.unpark();
    s.quiet = 0;
    return false;
  }
  s.parked = true;
  return true;
}

void EngineShimBackend::take_doorbells(Core& k, DbClient& d) noexcept {
  std::atomic_ref<uint64_t> summary(d.db->summary);
  if (summary.load(std::memory_order_relaxed) == 0) return;  // a line the client rarely writes
  // ACQUIRE exchanges: pair with the client's release ORs.
  uint64_t words = summary.exchange(0, std::memory_order_acquire);
  uint64_t taken = 0;
  while (words != 0) {
    const uint32_t w = static_cast<uint32_t>(__builtin_ctzll(words));
    words &= words - 1;
    if (w >= DROCE_SHM_DB_WORDS) break;
    uint64_t bits = std::atomic_ref<uint64_t>(d.db->word[w]).exchange(0, std::memory_order_acquire);
    while (bits != 0) {
      const uint32_t b = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
      bits &= bits - 1;
      ++taken;
      // A bit that names nothing (rung by a confused client, or for an object
      // destroyed since) is dropped.
      const DbClient::Target& t = d.slots[b];
      if (t.qp) activate(k, *t.qp);
      else if (t.srq) activate(k, *t.srq);
    }
  }
  k.doorbells.add(taken);
}

// One turn: the rung doorbells, the active QPs and SRQs (parked after
// kParkAfter empty turns when they have a bit), one more QP and SRQ of the
// core (the sweep: asynchronous events, SRQ limits and rings without a
// doorbell of a client that does not ring it), then the CQs.
uint32_t EngineShimBackend::poll_core(Core& k) noexcept {
  for (DbClient* d : k.dbs) take_doorbells(k, *d);
  uint32_t work = 0, visits = 0, parks = 0;
  for (size_t i = 0; i < k.active_qps.size();) {
    Qp* q = k.active_qps[i];
    const uint32_t w = drain_qp(k, *q);
    ++visits;
    work += w;
    if (w != 0) {
      q->quiet = 0;
    } else if ((q->db_bit != DROCE_SHM_DB_NONE || q->dead) && ++q->quiet >= kParkAfter && park(*q)) {
      q->active = false;
      k.active_qps[i] = k.active_qps.back();
      k.active_qps.pop_back();
      ++parks;
      continue;
    }
    ++i;
  }
  for (size_t i = 0; i < k.active_srqs.size();) {
    Srq* s = k.active_srqs[i];
    const uint32_t w = drain_srq(k, *s);
    ++visits;
    work += w;
    if (w != 0) {
      s->quiet = 0;
    } else if ((s->db_bit != DROCE_SHM_DB_NONE || s->dead) && ++s->quiet >= kParkAfter && park(*s)) {
      s->active = false;
      k.active_srqs[i] = k.active_srqs.back();
      k.active_srqs.pop_back();
      ++parks;
      continue;
    }
    ++i;
  }
  // The sweep: one parked QP and SRQ a turn, in turn.
  if (!k.qps.empty()) {
    if (k.sweep_qp >= k.qps.size()) k.sweep_qp = 0;
    Qp* q = k.qps[k.sweep_qp++];
    if (!q->active && !q->dead) {
      ++visits;
      const uint32_t w = drain_qp(k, *q);
      work += w;
      if (w != 0 || q->sq.available() != 0 || (q->has_rq && q->rq.available() != 0)) activate(k, *q);
    }
  }
  if (!k.srqs.empty()) {
    if (k.sweep_srq >= k.srqs.size()) k.sweep_srq = 0;
    Srq* s = k.srqs[k.sweep_srq++];
    if (!s->active && !s->dead) {
      ++visits;
      const uint32_t w = drain_srq(k, *s);
      work += w;
      if (w != 0 || s->ring.available() != 0) activate(k, *s);
    }
  }
  k.visits.add(visits);
  if (parks) k.parks.add(parks);
  uint32_t cqes = 0;
  for (Cq* c : k.cqs) cqes += drain_cq(k, *c);
  if (cqes) k.cqes.add(cqes);
  return work + cqes;
}

}  // namespace droce::shim

// EngineShimBackend's state per verbs object, internal to lib/shim/engine:
// what the control calls (engine_backend.cc, the control thread) create and
// destroy and what the ring poller (ring_poller.cc, the core threads) reads
// and writes every turn (README.md: who owns what).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "shim/engine/engine_backend.h"

namespace droce::shim {

namespace backend_detail {
inline constexpr uint32_t kBatch = 32;

// Core-written counter read by any thread (relaxed, no RMW needed: one writer).
struct Ctr {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

// An asynchronous event for one object: recorded as a bit (taken by the
// control thread), counted, and one count on the client's async eventfd.
inline void raise_event(std::atomic<uint32_t>& events, uint32_t type, int fd, Ctr& ctr) noexcept {
  events.fetch_or(1u << type, std::memory_order_release);
  ctr.add(1);
  if (fd >= 0) {
    uint64_t one = 1;
    if (write(fd, &one, sizeof(one)) < 0) {
      // counter saturated: the client does not read its events
    }
  }
}

// Takes the lowest pending event: true and its type, or false.
inline bool take_event(std::atomic<uint32_t>& events, uint32_t& type) noexcept {
  uint32_t v = events.load(std::memory_order_acquire);
  while (v != 0) {
    const uint32_t bit = v & (~v + 1);
    if (events.compare_exchange_weak(v, v & ~bit, std::memory_order_acq_rel)) {
      type = static_cast<uint32_t>(__builtin_ctz(bit));
      return true;
    }
  }
  return false;
}
}  // namespace backend_detail

struct EngineShimBackend::Cq {
  size_t core = 0;
  uint32_t port = 0;
  transport::Engine* eng = nullptr;
  verbs::Cq* ecq = nullptr;
  RingProducer<droce_shm_cqe> ring;
  int efd = -1;
  bool dead = false;  // ring corrupt: nothing more is written
  // Asynchronous events (core thread, except `events`).
  int async_fd = -1;              // the client's, owned by the ShimServer
  uint64_t overruns_seen = 0;     // engine CQ overruns already reported
  bool err = false;               // overran: in error for good (IBV_EVENT_CQ_ERR raised)
  std::atomic<uint32_t> events{0};  // pending ibv_event_type bits, taken by the control thread
};

struct EngineShimBackend::Srq {
  size_t core = 0;
  uint32_t port = 0;
  transport::Engine* eng = nullptr;
  verbs::Srq* esrq = nullptr;
  RingConsumer<droce_shm_recv_wqe> ring;
  uint32_t done = 0;  // the ring's `done` as last published
  uint32_t max_sge = 1;
  ibv_srq_attr attr{};
  bool dead = false;
  // ibv_modify_srq(IBV_SRQ_LIMIT) arms it (control thread); the core raises
  // IBV_EVENT_SRQ_LIMIT_REACHED once when fewer WQEs than that remain, and disarms.
  std::atomic<uint32_t> limit{0};
  int async_fd = -1;
  std::atomic<uint32_t> events{0};
  // Doorbell (core thread, but db_bit / dbc set before the core sees it).
  uint32_t db_bit = DROCE_SHM_DB_NONE;
  DbClient* dbc = nullptr;
  bool active = false;  // in the core's active list: polled every turn
  bool parked = false;  // ring idle = 1: polled again when its bit is rung
  uint32_t quiet = 0;   // turns in a row without work while active
};

struct EngineShimBackend::Qp {
  size_t core = 0;
  uint32_t port = 0;
  uint32_t qpn = 0;
  uint32_t pd = 0;
  verbs::QpType type = verbs::QpType::RC;
  transport::Engine* eng = nullptr;
  transport::Qp* eqp = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  Srq* srq = nullptr;
  RingConsumer<droce_shm_send_wqe> sq;
  RingConsumer<droce_shm_recv_wqe> rq;
  uint32_t rq_done = 0;  // the receive ring's `done` as last published
  bool has_rq = false;
  uint32_t max_send_sge = 1, max_recv_sge = 1;
  bool dead = false;
  uint32_t mcast_groups = 0;  // successful attach_mcast calls minus detaches (control thread)
  // Asynchronous events (core thread, except `event`).
  int async_fd = -1;             // the client's, owned by the ShimServer
  bool err_seen = false;         // the current stay in ERR was looked at
  bool app_err = false;          // the client moved the QP to ERR itself
  std::atomic<uint32_t> events{0};  // pending ibv_event_type bits, taken by the control thread
  // Doorbell, as Srq's.
  uint32_t db_bit = DROCE_SHM_DB_NONE;
  DbClient* dbc = nullptr;
  bool active = false;
  bool parked = false;
  uint32_t quiet = 0;
};

// A client's doorbell region and what its bits name.
struct EngineShimBackend::DbClient {
  droce_shm_doorbell* db = nullptr;
  size_t core = 0;
  struct Target {
    Qp* qp = nullptr;
    Srq* srq = nullptr;
  };
  std::vector<Target> slots;        // by bit; changed on the core thread only
  std::vector<uint32_t> free_bits;  // control thread
};

struct EngineShimBackend::Core {
  std::vector<Qp*> qps;  // core thread only (changed through run_on)
  std::vector<Srq*> srqs;
  std::vector<Cq*> cqs;
  // Doorbells (README, "The doorbell"): the clients' regions on this core,
  // the QPs / SRQs polled every turn (capacity reserved at create: no
  // allocation on a turn), the sweep's next index, QPs by port and QPN.
  std::vector<DbClient*> dbs;
  std::vector<Qp*> active_qps;
  std::vector<Srq*> active_srqs;
  size_t sweep_qp = 0, sweep_srq = 0;
  std::vector<std::vector<Qp*>> by_qpn;  // [port][qpn], grown at create (control path)
  backend_detail::Ctr sq_wqes, rq_wqes, cqes, bad_wqes, corrupt, events, async_events, visits, doorbells, parks;
};

}  // namespace droce::shim

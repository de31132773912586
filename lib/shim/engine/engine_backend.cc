#include "shim/engine/engine_backend.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "netstack/gid_table.h"
#include "verbs/queues.h"

namespace droce::shim {


namespace {
constexpr uint32_t kBatch = 32;

// Core-written counter read by any thread (relaxed, no RMW needed: one writer).
struct Ctr {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n) noexcept { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

// An asynchronous event for one object: recorded as a bit (taken by the
// control thread), counted, and one count on the client's async eventfd.
void raise_event(std::atomic<uint32_t>& events, uint32_t type, int fd, Ctr& ctr) noexcept {
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
bool take_event(std::atomic<uint32_t>& events, uint32_t& type) noexcept {
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

verbs::Mtu mtu_enum(uint32_t bytes) {
  switch (bytes) {
    case 256: return verbs::Mtu::M256;
    case 512: return verbs::Mtu::M512;
    case 2048: return verbs::Mtu::M2048;
    case 4096: return verbs::Mtu::M4096;
    default: return verbs::Mtu::M1024;
  }
}
}  // namespace

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
  Ctr sq_wqes, rq_wqes, cqes, bad_wqes, corrupt, events, async_events, visits, doorbells, parks;
};

EngineShimBackend::EngineShimBackend(engine::Dataplane& dp, const config::Config& cfg)
    : dp_(dp), cfg_(cfg), ahs_(new AhSlot[kMaxAhs]) {
  for (size_t i = 0; i < dp_.core_count(); ++i) cores_.push_back(std::make_unique<Core>());
  for (uint32_t i = kMaxAhs - 1; i >= 1; --i) free_ahs_.push_back(i);  // AH number 0 is never handed out
}

EngineShimBackend::~EngineShimBackend() { stop(); }

void EngineShimBackend::start() {
  if (started_) return;
  for (size_t i = 0; i < cores_.size(); ++i) {
    Core* k = cores_[i].get();
    pollers_.push_back(dp_.add_poller(i, [this, k]() { return poll_core(*k); }));
  }
  started_ = true;
}

void EngineShimBackend::stop() noexcept {
  if (!started_) return;
  for (size_t i = 0; i < pollers_.size(); ++i) dp_.remove_poller(i, pollers_[i]);
  pollers_.clear();
  started_ = false;
}

ShimBackendStats EngineShimBackend::stats() const {
  ShimBackendStats s;
  for (const auto& k : cores_) {
    s.sq_wqes += k->sq_wqes.get();
    s.rq_wqes += k->rq_wqes.get();
    s.cqes += k->cqes.get();
    s.bad_wqes += k->bad_wqes.get();
    s.corrupt_rings += k->corrupt.get();
    s.events += k->events.get();
    s.async_events += k->async_events.get();
    s.ring_visits += k->visits.get();
    s.doorbells += k->doorbells.get();
    s.parks += k->parks.get();
  }
  return s;
}

int EngineShimBackend::on_core(size_t core, std::function<int(engine::CoreLoop&)> fn) {
  auto rc = std::make_shared<int>(-ETIMEDOUT);
  if (!dp_.run_on(core, [fn = std::move(fn), rc](engine::CoreLoop& c) { *rc = fn(c); })) return -ETIMEDOUT;
  return *rc;
}

int EngineShimBackend::core_of(const ClientInfo& c) {
  auto it = client_core_.find(c.id);
  if (it != client_core_.end()) return it->second;
  if (c.dev >= dp_.port_count()) return -ENODEV;
  const int core = static_cast<int>(dp_.pick_core(c.dev));
  client_core_[c.id] = core;
  return core;
}

// ---- device ----

uint32_t EngineShimBackend::device_count() { return static_cast<uint32_t>(dp_.port_count()); }

int EngineShimBackend::device_info(uint32_t dev, proto::DeviceInfo& out) {
  if (dev >= dp_.port_count()) return -ENODEV;
  std::snprintf(out.name, sizeof(out.name), "droce%u", dev);
  const wire::MacAddr m = dp_.port(dev).host.mac;
  // EUI-64 from the MAC, as the kernel derives RoCE node GUIDs.
  uint64_t g = 0;
  const uint8_t b[8] = {static_cast<uint8_t>(m[0] ^ 2), m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]};
  for (uint8_t x : b) g = g << 8 | x;
  out.node_guid = htobe64(g);
  out.phys_port_cnt = 1;
  return 0;
}

int EngineShimBackend::query_device(uint32_t dev, ibv_device_attr& a) {
  proto::DeviceInfo di{};
  if (int rc = device_info(dev, di)) return rc;
  a = ibv_device_attr{};
  std::snprintf(a.fw_ver, sizeof(a.fw_ver), "droce 0.1.0");
  a.node_guid = di.node_guid;
  a.sys_image_guid = di.node_guid;
  a.max_mr_size = 1ull << 40;
  a.page_size_cap = 0xfffff000;
  a.vendor_id = 0xffffff;
  a.max_qp = static_cast<int>(cfg_.roce.max_qps);
  a.max_qp_wr = 4096;
  a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_WINDOW |
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  const transport::EngineConfig ec{};  // droced's dataplane keeps these defaults
  a.max_mw = static_cast<int>(ec.max_mws);
  // UD multicast (attach_mcast): groups and QPs per group of the core's engine.
  a.max_mcast_grp = static_cast<int>(ec.max_mcast_groups);
  a.max_mcast_qp_attach = static_cast<int>(ec.max_mcast_qps_per_group);
  a.max_total_mcast_qp_attach = a.max_mcast_grp * a.max_mcast_qp_attach;
  a.max_sge = verbs::kMaxSge;
  a.max_sge_rd = verbs::kMaxSge;
  a.max_cq = static_cast<int>(cfg_.roce.max_qps) * 2;
  a.max_cqe = 32768;
  a.max_mr = static_cast<int>(cfg_.roce.max_mrs);
  a.max_pd = 1 << 20;
  a.max_qp_rd_atom = verbs::kMaxRdAtomic;
  a.max_res_rd_atom = verbs::kMaxRdAtomic * static_cast<int>(cfg_.roce.max_qps);
  a.max_qp_init_rd_atom = verbs::kMaxRdAtomic;
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_ah = kMaxAhs - 1;
  a.max_srq = static_cast<int>(cfg_.roce.max_qps);
  a.max_srq_wr = 4096;
  a.max_srq_sge = verbs::kMaxSge;
  a.max_pkeys = 1;
  a.local_ca_ack_delay = 15;
  a.phys_port_cnt = 1;
  return 0;
}

IbLinkRate ib_rate_for_eth(uint32_t mbps) {
  // IBV_WIDTH_1X = 1, 4X = 2; IBV_SPEED_SDR = 1, DDR = 2, FDR10 = 8, EDR = 32, HDR = 64, NDR = 128.
  if (mbps <= 1000) return {1, 1};
  if (mbps <= 10000) return {1, 8};
  if (mbps <= 20000) return {2, 2};
  if (mbps <= 25000) return {1, 32};
  if (mbps <= 40000) return {2, 8};
  if (mbps <= 100000) return {2, 32};
  if (mbps <= 200000) return {2, 64};
  return {2, 128};
}

// Ethernet MTU 1500 carries IB MTU 1024; larger only with a jumbo port.
ibv_mtu EngineShimBackend::port_max_mtu(uint32_t dev) const {
  const uint32_t eth_mtu = cfg_.ports.at(dev).mtu;
  return eth_mtu >= 4200 ? IBV_MTU_4096 : eth_mtu >= 2100 ? IBV_MTU_2048 : IBV_MTU_1024;
}

int EngineShimBackend::query_port(uint32_t dev, uint32_t port, ibv_port_attr& p) {
  if (dev >= dp_.port_count() || port != 1) return -EINVAL;
  p = ibv_port_attr{};
  p.state = IBV_PORT_ACTIVE;
  const ibv_mtu max = port_max_mtu(dev);
  p.max_mtu = max;
  p.active_mtu = std::min<ibv_mtu>(max, static_cast<ibv_mtu>(mtu_enum(cfg_.roce.path_mtu)));
  p.gid_tbl_len = static_cast<int>(dp_.gids(dev).size());
  p.max_msg_sz = verbs::kMaxMsgSize;
  p.port_cap_flags = IBV_PORT_CM_SUP;  // the RDMA CM (lib/cm) answers on QP1
  p.pkey_tbl_len = 1;
  p.max_vl_num = 1;
  // The DPDK port's link speed (net_af_packet reports 10G).
  uint32_t mbps = 0;
  if (const dpdk::Port* port = dp_.port(dev).port) {
    try {
      mbps = port->link().speed_mbps;
    } catch (const std::exception&) {
      mbps = 0;  // no link status from the driver: the lowest rate
    }
  }
  const IbLinkRate rate = ib_rate_for_eth(mbps);
  p.active_width = rate.width;
  p.active_speed = rate.speed;
  p.phys_state = 5;
  p.link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int EngineShimBackend::query_gid_table(uint32_t dev, uint32_t port, ibv_gid_entry* out, uint32_t max) {
  if (dev >= dp_.port_count() || port != 1) return -EINVAL;
  const auto& g = dp_.gids(dev);
  const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(g.size()), max);
  for (uint32_t i = 0; i < n; ++i) {
    out[i] = ibv_gid_entry{};
    std::memcpy(out[i].gid.raw, g.at(i).data(), 16);
    out[i].gid_index = i;
    out[i].port_num = 1;
    out[i].gid_type = IBV_GID_TYPE_ROCE_V2;
  }
  return static_cast<int>(n);
}

// ---- PD, MR ----

int EngineShimBackend::alloc_pd(const ClientInfo&, ObjId& out) {
  out = dp_.alloc_pd();
  return 0;
}

int EngineShimBackend::dealloc_pd(const ClientInfo&, ObjId) { return 0; }

int EngineShimBackend::reg_mr(const ClientInfo& c, const MrSetup& s, MrResult& out) {
  if (c.dev >= dp_.port_count()) return -ENODEV;
  if (s.access & ~verbs::kAccessAll &
      ~static_cast<uint32_t>(IBV_ACCESS_ZERO_BASED | IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_MW_BIND))
    return -EINVAL;  // on-demand paging, ... are not offered
  // IBTA: remote write/atomic need local write.
  if ((s.access & (verbs::kAccessRemoteWrite | verbs::kAccessRemoteAtomic)) && !(s.access & verbs::kAccessLocalWrite))
    return -EINVAL;
  uint32_t key = 0;
  const int rc = dp_.reg_mr_iova(c.dev, static_cast<uint32_t>(s.pd), s.addr, s.iova, s.length,
                                 s.access & (verbs::kAccessAll | verbs::kAccessMwBind), &key);
  if (rc) return -rc;
  out.id = (uint64_t{c.dev} << 32) | key;
  out.lkey = out.rkey = key;
  return 0;
}

int EngineShimBackend::dereg_mr(const ClientInfo&, ObjId mr) {
  const int rc = dp_.dereg_mr(static_cast<uint32_t>(mr >> 32), static_cast<uint32_t>(mr));
  return -rc;
}

int EngineShimBackend::alloc_mw(const ClientInfo& c, ObjId pd, uint32_t type, MwResult& out) {
  if (c.dev >= dp_.port_count()) return -ENODEV;
  uint32_t key = 0;
  if (const int rc = dp_.alloc_mw(c.dev, static_cast<uint32_t>(pd), type, &key)) return -rc;
  out.id = (uint64_t{c.dev} << 32) | key;
  out.rkey = key;
  return 0;
}

int EngineShimBackend::dealloc_mw(const ClientInfo&, ObjId mw) {
  return -dp_.dealloc_mw(static_cast<uint32_t>(mw >> 32), static_cast<uint32_t>(mw));
}

// ---- CQ ----

int EngineShimBackend::create_cq(const ClientInfo& c, const CqSetup& s, CqResult& out) {
  const int core = core_of(c);
  if (core < 0) return core;
  auto cq = std::make_unique<Cq>();
  cq->core = static_cast<size_t>(core);
  cq->port = c.dev;
  cq->efd = s.eventfd;
  cq->async_fd = s.async_eventfd;
  if (!cq->ring.attach(s.ring, s.ring_entries)) return -EINVAL;
  Cq* p = cq.get();
  Core* k = cores_[cq->core].get();
  const uint32_t depth = s.ring_entries;
  const int rc = on_core(cq->core, [p, k, depth](engine::CoreLoop& l) {
    p->eng = l.engine(p->port);
    if (!p->eng) return -ENODEV;
    p->ecq = p->eng->create_cq(depth);
    if (!p->ecq) return -ENOMEM;
    k->cqs.push_back(p);
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) cq.release();  // the core may still run it later: never free
    return rc;
  }
  out.id = next_id_++;
  out.cqn = static_cast<uint32_t>(out.id);
  cqs_[out.id] = std::move(cq);
  return 0;
}

// On the owning core, between two polls: the unread completions (in the ring
// and those still waiting in the engine CQ) must fit the new ring. The
// engine CQ keeps its depth: it only holds what the ring has no room for.
int EngineShimBackend::resize_cq(const ClientInfo&, ObjId id, droce_shm_ring_hdr* ring, uint32_t entries) {
  auto it = cqs_.find(id);
  if (it == cqs_.end()) return -ENOENT;
  Cq* p = it->second.get();
  return on_core(p->core, [p, ring, entries](engine::CoreLoop&) {
    if (p->dead) return -EIO;
    return ring_move_unread(p->ring, ring, entries, p->ecq->pending());
  });
}

int EngineShimBackend::destroy_cq(const ClientInfo&, ObjId id) {
  auto it = cqs_.find(id);
  if (it == cqs_.end()) return -ENOENT;
  Cq* p = it->second.get();
  Core* k = cores_[p->core].get();
  const int rc = on_core(p->core, [p, k](engine::CoreLoop&) {
    std::erase(k->cqs, p);
    return -p->eng->destroy_cq(p->ecq);
  });
  if (rc == -ETIMEDOUT) {
    it->second.release();
  }
  if (rc == -EBUSY) return rc;
  cqs_.erase(it);
  return rc == -ETIMEDOUT ? rc : 0;
}

// ---- SRQ ----

int EngineShimBackend::create_srq(const ClientInfo& c, const SrqSetup& s, SrqResult& out) {
  const int core = core_of(c);
  if (core < 0) return core;
  if (s.attr.max_sge > verbs::kMaxSge) return -EINVAL;
  auto q = std::make_unique<Srq>();
  q->core = static_cast<size_t>(core);
  q->port = c.dev;
  q->attr = s.attr;
  q->max_sge = s.attr.max_sge;
  q->async_fd = s.async_eventfd;
  q->limit.store(s.attr.srq_limit, std::memory_order_relaxed);
  if (!q->ring.attach(s.ring, s.ring_entries)) return -EINVAL;
  Srq* p = q.get();
  Core* k = cores_[q->core].get();
  p->db_bit = take_db_bit(c, &p->dbc);
  p->ring.set_doorbell_bit(p->db_bit);
  const uint32_t pd = static_cast<uint32_t>(s.pd);
  const uint32_t depth = s.ring_entries;
  const int rc = on_core(q->core, [this, p, k, pd, depth](engine::CoreLoop& l) {
    p->eng = l.engine(p->port);
    if (!p->eng) return -ENODEV;
    p->esrq = p->eng->create_srq(verbs::Pd{pd}, depth);
    if (!p->esrq) return -ENOMEM;
    k->srqs.push_back(p);
    k->active_srqs.reserve(k->srqs.size());
    if (p->dbc) p->dbc->slots[p->db_bit].srq = p;
    activate(*k, *p);  // polled from the start (idle = 0)
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) q.release();
    else give_db_bit(p->dbc, p->db_bit);
    return rc;
  }
  out.id = next_id_++;
  out.srqn = static_cast<uint32_t>(out.id);
  srqs_[out.id] = std::move(q);
  return 0;
}

int EngineShimBackend::modify_srq(const ClientInfo&, ObjId id, const ibv_srq_attr& a, uint32_t mask) {
  auto it = srqs_.find(id);
  if (it == srqs_.end()) return -ENOENT;
  if (mask & IBV_SRQ_MAX_WR) return -EOPNOTSUPP;  // no resize
  if (mask & IBV_SRQ_LIMIT) {
    if (a.srq_limit > it->second->attr.max_wr) return -EINVAL;
    // Armed (0 disarms): the SRQ's core raises IBV_EVENT_SRQ_LIMIT_REACHED.
    it->second->limit.store(a.srq_limit, std::memory_order_release);
  }
  return 0;
}

int EngineShimBackend::query_srq(const ClientInfo&, ObjId id, ibv_srq_attr& out) {
  auto it = srqs_.find(id);
  if (it == srqs_.end()) return -ENOENT;
  out = it->second->attr;
  out.srq_limit = it->second->limit.load(std::memory_order_acquire);  // 0 once the event fired
  return 0;
}

int EngineShimBackend::destroy_srq(const ClientInfo&, ObjId id) {
  auto it = srqs_.find(id);
  if (it == srqs_.end()) return -ENOENT;
  Srq* p = it->second.get();
  Core* k = cores_[p->core].get();
  const int rc = on_core(p->core, [p, k](engine::CoreLoop&) {
    const int e = p->eng->destroy_srq(p->esrq);
    if (e == EBUSY) return -e;
    std::erase(k->srqs, p);
    std::erase(k->active_srqs, p);
    if (p->dbc) p->dbc->slots[p->db_bit].srq = nullptr;
    return -e;
  });
  if (rc == -EBUSY) return rc;
  if (rc == -ETIMEDOUT) it->second.release();
  else give_db_bit(p->dbc, p->db_bit);
  srqs_.erase(it);
  return rc == -ETIMEDOUT ? rc : 0;
}

// ---- QP ----

int EngineShimBackend::create_qp(const ClientInfo& c, const QpSetup& s, QpResult& out) {
  const int core = core_of(c);
  if (core < 0) return core;
  verbs::QpType type;
  switch (s.type) {
    case IBV_QPT_RC: type = verbs::QpType::RC; break;
    case IBV_QPT_UC: type = verbs::QpType::UC; break;
    case IBV_QPT_UD: type = verbs::QpType::UD; break;
    default: return -EOPNOTSUPP;
  }
  auto scq = cqs_.find(s.send_cq), rcq = cqs_.find(s.recv_cq);
  if (scq == cqs_.end() || rcq == cqs_.end()) return -EINVAL;
  Srq* srq = nullptr;
  if (s.srq != 0) {
    auto it = srqs_.find(s.srq);
    if (it == srqs_.end()) return -EINVAL;
    srq = it->second.get();
  }
  if (s.cap.max_send_sge > verbs::kMaxSge || s.cap.max_recv_sge > verbs::kMaxSge) return -EINVAL;
  auto q = std::make_unique<Qp>();
  q->core = static_cast<size_t>(core);
  q->port = c.dev;
  q->pd = static_cast<uint32_t>(s.pd);
  q->type = type;
  q->scq = scq->second.get();
  q->rcq = rcq->second.get();
  q->srq = srq;
  if (q->scq->core != q->core || q->rcq->core != q->core || (srq && srq->core != q->core)) return -EINVAL;
  q->async_fd = s.async_eventfd;
  q->max_send_sge = std::max<uint32_t>(s.cap.max_send_sge, 1);
  q->max_recv_sge = std::max<uint32_t>(s.cap.max_recv_sge, 1);
  if (!q->sq.attach(s.sq, s.sq_entries)) return -EINVAL;
  if (s.rq) {
    if (!q->rq.attach(s.rq, s.rq_entries)) return -EINVAL;
    q->has_rq = true;
  }
  verbs::QpInitAttr init;
  init.qp_type = type;
  init.pd = q->pd;
  init.send_cq = q->scq->ecq;
  init.recv_cq = q->rcq->ecq;
  init.srq = srq ? srq->esrq : nullptr;
  init.sq_sig_all = s.sq_sig_all;
  init.cap.max_send_wr = s.sq_entries;
  init.cap.max_recv_wr = s.rq ? s.rq_entries : 0;
  init.cap.max_send_sge = q->max_send_sge;
  init.cap.max_recv_sge = q->max_recv_sge;
  init.cap.max_inline_data = std::min<uint32_t>(s.cap.max_inline_data, DROCE_SHM_MAX_INLINE);
  Qp* p = q.get();
  Core* k = cores_[q->core].get();
  p->db_bit = take_db_bit(c, &p->dbc);
  p->sq.set_doorbell_bit(p->db_bit);
  if (p->has_rq) p->rq.set_doorbell_bit(p->db_bit);
  const int rc = on_core(q->core, [this, p, k, init](engine::CoreLoop& l) {
    if (l.engine(p->port) != p->scq->eng) return -EINVAL;
    p->eng = p->scq->eng;
    if (int e = p->eng->create_qp(init, &p->qpn)) return -e;
    p->eqp = p->eng->qp(p->qpn);
    k->qps.push_back(p);
    k->active_qps.reserve(k->qps.size());
    if (k->by_qpn.size() <= p->port) k->by_qpn.resize(p->port + 1);
    auto& v = k->by_qpn[p->port];
    if (v.size() <= p->qpn) v.resize(p->qpn + 1, nullptr);
    v[p->qpn] = p;
    if (p->dbc) p->dbc->slots[p->db_bit].qp = p;
    activate(*k, *p);  // polled from the start (idle = 0)
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) q.release();
    else give_db_bit(p->dbc, p->db_bit);
    return rc;
  }
  out.id = next_id_++;
  out.qpn = p->qpn;
  qps_[out.id] = std::move(q);
  return 0;
}

int ah_from_verbs(const ibv_ah_attr& a, size_t gid_count, uint8_t port_tclass, verbs::Ah& out) {
  if (!a.is_global) return -EINVAL;  // RoCE: every address is a GID
  if (a.port_num != 1) return -EINVAL;
  if (a.grh.sgid_index >= gid_count) return -EINVAL;
  std::memcpy(out.dgid.data(), a.grh.dgid.raw, 16);
  out.traffic_class = a.grh.traffic_class ? a.grh.traffic_class : port_tclass;
  // As Linux for every RoCE device, rxe included (ib_resolve_unicast_gid_dmac on
  // modify_qp and create_ah): a unicast destination is sent with its route's hop
  // limit (kRoceRouteHopLimit), whatever the application asked (ibv_rc_pingpong
  // asks for 1); only multicast keeps the caller's.
  const bool multicast = a.grh.dgid.raw[0] == 0xff ||
                         (wire::gid_is_ipv4_mapped(out.dgid) && (a.grh.dgid.raw[12] & 0xf0) == 0xe0);
  out.hop_limit = multicast && a.grh.hop_limit ? a.grh.hop_limit : kRoceRouteHopLimit;
  out.flow_label = a.grh.flow_label & 0xfffff;
  return 0;
}

int EngineShimBackend::to_ah(uint32_t port, const ibv_ah_attr& a, verbs::Ah& out) {
  if (int rc = ah_from_verbs(a, dp_.gids(port).size(), dp_.tclass(port), out)) return rc;
  // Never waits for the answer: the ShimServer parks the client's request on
  // -EINPROGRESS and serves the other clients until it calls again.
  switch (dp_.resolve_step(port, out.dgid, out.dmac)) {
    case engine::Dataplane::ResolveStep::Ready: return 0;
    case engine::Dataplane::ResolveStep::Pending: return -EINPROGRESS;
    case engine::Dataplane::ResolveStep::Failed: break;
  }
  return -EHOSTUNREACH;
}

int EngineShimBackend::modify_qp(const ClientInfo&, ObjId id, const ibv_qp_attr& a, uint32_t mask) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  Qp* p = it->second.get();
  constexpr uint32_t kSupported = verbs::kQpState | verbs::kQpCurState | verbs::kQpAccessFlags | verbs::kQpPkeyIndex |
                                  verbs::kQpPort | verbs::kQpQkey | verbs::kQpAv | verbs::kQpPathMtu |
                                  verbs::kQpTimeout | verbs::kQpRetryCnt | verbs::kQpRnrRetry | verbs::kQpRqPsn |
                                  verbs::kQpMaxQpRdAtomic | verbs::kQpMinRnrTimer | verbs::kQpSqPsn |
                                  verbs::kQpMaxDestRdAtomic | verbs::kQpDestQpn;
  if (mask & ~kSupported) return -EOPNOTSUPP;
  verbs::QpAttr v;
  v.qp_state = static_cast<verbs::QpState>(a.qp_state);
  v.cur_qp_state = static_cast<verbs::QpState>(a.cur_qp_state);
  if ((mask & verbs::kQpState) && a.qp_state > IBV_QPS_ERR) return -EINVAL;
  // A path MTU the port's link cannot carry (above ibv_query_port's max_mtu): refused,
  // never a QP whose packets never arrive.
  if ((mask & verbs::kQpPathMtu) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > port_max_mtu(p->port))) return -EINVAL;
  v.path_mtu = static_cast<verbs::Mtu>(a.path_mtu);
  v.qkey = a.qkey;
  v.rq_psn = a.rq_psn & 0xffffff;
  v.sq_psn = a.sq_psn & 0xffffff;
  v.dest_qp_num = a.dest_qp_num & 0xffffff;
  v.qp_access_flags = static_cast<uint32_t>(a.qp_access_flags) & verbs::kAccessAll;
  v.pkey_index = a.pkey_index;
  v.max_rd_atomic = std::min<uint8_t>(a.max_rd_atomic, verbs::kMaxRdAtomic);
  v.max_dest_rd_atomic = std::min<uint8_t>(a.max_dest_rd_atomic, verbs::kMaxRdAtomic);
  v.min_rnr_timer = a.min_rnr_timer;
  v.port_num = a.port_num;
  v.timeout = a.timeout;
  v.retry_cnt = a.retry_cnt;
  v.rnr_retry = a.rnr_retry;
  if ((mask & verbs::kQpPort) && a.port_num != 1) return -EINVAL;
  if (mask & verbs::kQpAv) {
    if (int rc = to_ah(p->port, a.ah_attr, v.ah_attr)) return rc;
  }
  const uint32_t mtu_bytes = cfg_.roce.path_mtu;
  return on_core(p->core, [p, v, mask, mtu_bytes](engine::CoreLoop&) {
    const int rc = p->eng->modify_qp(p->qpn, v, mask);
    if (rc == 0 && (mask & verbs::kQpState) && v.qp_state == verbs::QpState::Err) p->app_err = true;
    // UD has no path MTU attribute: the port's.
    if (rc == 0 && p->type == verbs::QpType::UD && (mask & verbs::kQpState) && v.qp_state == verbs::QpState::Rtr)
      p->eqp->mtu = mtu_bytes;
    return -rc;
  });
}

int EngineShimBackend::query_qp(const ClientInfo&, ObjId id, uint32_t, ibv_qp_attr& out) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  Qp* p = it->second.get();
  auto v = std::make_shared<verbs::QpAttr>();
  if (int rc = on_core(p->core, [p, v](engine::CoreLoop&) { return -p->eng->query_qp(p->qpn, v.get()); })) return rc;
  out = ibv_qp_attr{};
  out.qp_state = static_cast<ibv_qp_state>(v->qp_state);
  out.cur_qp_state = static_cast<ibv_qp_state>(v->qp_state);
  out.path_mtu = static_cast<ibv_mtu>(v->path_mtu);
  out.qkey = v->qkey;
  out.rq_psn = v->rq_psn;
  out.sq_psn = v->sq_psn;
  out.dest_qp_num = v->dest_qp_num;
  out.qp_access_flags = static_cast<int>(v->qp_access_flags);
  out.cap.max_send_wr = v->cap.max_send_wr;
  out.cap.max_recv_wr = v->cap.max_recv_wr;
  out.cap.max_send_sge = v->cap.max_send_sge;
  out.cap.max_recv_sge = v->cap.max_recv_sge;
  out.cap.max_inline_data = v->cap.max_inline_data;
  out.ah_attr.is_global = 1;
  out.ah_attr.port_num = 1;
  std::memcpy(out.ah_attr.grh.dgid.raw, v->ah_attr.dgid.data(), 16);
  out.ah_attr.grh.traffic_class = v->ah_attr.traffic_class;
  out.ah_attr.grh.hop_limit = v->ah_attr.hop_limit;
  out.ah_attr.grh.flow_label = v->ah_attr.flow_label;
  out.pkey_index = v->pkey_index;
  out.max_rd_atomic = v->max_rd_atomic;
  out.max_dest_rd_atomic = v->max_dest_rd_atomic;
  out.min_rnr_timer = v->min_rnr_timer;
  out.port_num = 1;
  out.timeout = v->timeout;
  out.retry_cnt = v->retry_cnt;
  out.rnr_retry = v->rnr_retry;
  return 0;
}

int EngineShimBackend::destroy_qp(const ClientInfo&, ObjId id) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  Qp* p = it->second.get();
  Core* k = cores_[p->core].get();
  const int rc = on_core(p->core, [p, k](engine::CoreLoop&) {
    std::erase(k->qps, p);
    std::erase(k->active_qps, p);
    if (p->port < k->by_qpn.size() && p->qpn < k->by_qpn[p->port].size()) k->by_qpn[p->port][p->qpn] = nullptr;
    if (p->dbc) p->dbc->slots[p->db_bit].qp = nullptr;
    return -p->eng->destroy_qp(p->qpn);
  });
  if (rc == -ETIMEDOUT) it->second.release();
  else give_db_bit(p->dbc, p->db_bit);
  const bool groups = p->mcast_groups != 0;
  const uint32_t port = p->port;
  qps_.erase(it);
  if (groups) dp_.mcast_sync(port);  // the engine left the QP's groups: the device filter follows
  return rc == -ETIMEDOUT ? rc : 0;
}

// ---- multicast ----

// The UD QP behind `id` and the group as a wire GID: 0, or a negative errno.
int EngineShimBackend::mcast_member(ObjId id, const ibv_gid& gid, Qp** qp, wire::Gid* g) {
  auto it = qps_.find(id);
  if (it == qps_.end()) return -ENOENT;
  *qp = it->second.get();
  if ((*qp)->type != verbs::QpType::UD) return -EINVAL;
  std::memcpy(g->data(), gid.raw, 16);
  return 0;
}

int EngineShimBackend::attach_mcast(const ClientInfo&, ObjId id, const ibv_gid& gid) {
  Qp* p = nullptr;
  wire::Gid g;
  if (const int rc = mcast_member(id, gid, &p, &g)) return rc;
  if (!wire::gid_is_multicast(g)) return -EINVAL;
  const int rc = dp_.attach_mcast(p->port, p->qpn, g);
  if (rc == 0) ++p->mcast_groups;  // attaching twice is one membership: counted per call, bounded below
  return -rc;
}

int EngineShimBackend::detach_mcast(const ClientInfo&, ObjId id, const ibv_gid& gid) {
  Qp* p = nullptr;
  wire::Gid g;
  if (const int rc = mcast_member(id, gid, &p, &g)) return rc;
  const int rc = dp_.detach_mcast(p->port, p->qpn, g);
  if (rc == 0 && p->mcast_groups) --p->mcast_groups;
  return -rc;
}

// ---- AH ----

int EngineShimBackend::create_ah(const ClientInfo& c, ObjId pd, const ibv_ah_attr& a, AhResult& out) {
  if (c.dev >= dp_.port_count()) return -ENODEV;
  if (free_ahs_.empty()) return -ENOMEM;
  verbs::Ah ah;
  if (int rc = to_ah(c.dev, a, ah)) return rc;
  const uint32_t n = free_ahs_.back();
  free_ahs_.pop_back();
  AhSlot& s = ahs_[n];
  s.ah = ah;
  s.pd = static_cast<uint32_t>(pd);
  s.port = c.dev;
  // RELEASE: a core that sees live reads the fields written above.
  s.live.store(1, std::memory_order_release);
  out.id = n;
  out.ah_num = n;
  return 0;
}

int EngineShimBackend::destroy_ah(const ClientInfo&, ObjId id) {
  if (id == 0 || id >= kMaxAhs || ahs_[id].live.load() == 0) return -ENOENT;
  ahs_[id].live.store(0, std::memory_order_release);
  // Every core passes one loop iteration: none still reads the slot (the
  // engine copies the AH into its WQE at post time).
  for (size_t i = 0; i < cores_.size(); ++i) on_core(i, [](engine::CoreLoop&) { return 0; });
  free_ahs_.push_back(static_cast<uint32_t>(id));
  return 0;
}

// ---- doorbells (control thread) ----

int EngineShimBackend::open_doorbell(const ClientInfo& c, droce_shm_doorbell* db) {
  if (db == nullptr) return -EINVAL;
  if (dbs_.count(c.id)) return -EALREADY;
  const int core = core_of(c);
  if (core < 0) return core;
  auto d = std::make_unique<DbClient>();
  d->db = db;
  d->core = static_cast<size_t>(core);
  d->slots.resize(DROCE_SHM_DB_BITS);
  d->free_bits.reserve(DROCE_SHM_DB_BITS);
  for (uint32_t b = DROCE_SHM_DB_BITS; b-- > 0;) d->free_bits.push_back(b);  // bit 0 first
  DbClient* p = d.get();
  Core* k = cores_[d->core].get();
  const int rc = on_core(d->core, [p, k](engine::CoreLoop&) {
    k->dbs.push_back(p);
    return 0;
  });
  if (rc) {
    if (rc == -ETIMEDOUT) d.release();  // the core may still run it
    return rc;
  }
  dbs_[c.id] = std::move(d);
  return 0;
}

// A free bit of the client's doorbell (and the DbClient), or DROCE_SHM_DB_NONE
// without a doorbell or with every bit taken: the object is always polled.
uint32_t EngineShimBackend::take_db_bit(const ClientInfo& c, DbClient** dbc) {
  *dbc = nullptr;
  auto it = dbs_.find(c.id);
  if (it == dbs_.end() || it->second->free_bits.empty()) return DROCE_SHM_DB_NONE;
  *dbc = it->second.get();
  const uint32_t b = (*dbc)->free_bits.back();
  (*dbc)->free_bits.pop_back();
  return b;
}

void EngineShimBackend::give_db_bit(DbClient* dbc, uint32_t bit) {
  if (dbc != nullptr && bit < DROCE_SHM_DB_BITS) dbc->free_bits.push_back(bit);
}

void EngineShimBackend::client_gone(const ClientInfo& c) {
  client_core_.erase(c.id);
  auto it = dbs_.find(c.id);
  if (it == dbs_.end()) return;
  DbClient* p = it->second.get();
  Core* k = cores_[p->core].get();
  // The core stops reading the region before the server unmaps it.
  if (on_core(p->core, [p, k](engine::CoreLoop&) {
        std::erase(k->dbs, p);
        return 0;
      }) == -ETIMEDOUT)
    it->second.release();
  dbs_.erase(it);
}

bool EngineShimBackend::take_qp_event(const ClientInfo&, ObjId id, uint32_t& type) {
  auto it = qps_.find(id);
  return it != qps_.end() && take_event(it->second->events, type);
}

bool EngineShimBackend::take_cq_event(const ClientInfo&, ObjId id, uint32_t& type) {
  auto it = cqs_.find(id);
  return it != cqs_.end() && take_event(it->second->events, type);
}

bool EngineShimBackend::take_srq_event(const ClientInfo&, ObjId id, uint32_t& type) {
  auto it = srqs_.find(id);
  return it != srqs_.end() && take_event(it->second->events, type);
}

// ---- data path (core threads) ----

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

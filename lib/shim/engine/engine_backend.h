// droced's ShimBackend: the shim's verbs objects on the real engine.
//
// Placement: a client's CQs, SRQs and QPs all live on one core of the port
// (its device), picked round robin when the client creates its first of
// them; the QPN is handed out by that core's engine, so the core owns it.
// One core per client keeps every shared-memory ring single-producer /
// single-consumer (a CQ shared by several QPs has one producer). Clients
// spread over the cores.
//
// Every control operation runs on the owning core through Dataplane::run_on.
// A per-core poller (Dataplane::add_poller) drains each shim QP's send and
// receive rings and each SRQ ring (every entry copied out, then validated)
// into Engine::post_send / post_recv / post_srq_recv, returns the slots, then
// copies the engine CQs' completions into the shim CQ rings and signals
// armed CQs' eventfds. No allocation or lock per work request.
//
// MRs: the ShimServer maps the client's memfd; the backend registers the
// daemon-side mapping in the engine's MR table with the client's address as
// IOVA (Dataplane::reg_mr_iova, replicated on every core of the port): the
// engine checks PD, bounds and access on every local and remote access.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "config/config.h"
#include "engine/dataplane.h"
#include "shim/backend.h"
#include "shim/ring.h"

namespace droce::shim {

// The IP TTL (IPv4) / hop limit (IPv6) of every RoCEv2 packet the shim's QPs and AHs send:
// the route's default, 64. Linux does the same for any RoCE device (rxe, mlx5, ...): ib_core's
// ib_resolve_eth_dmac() resolves each RoCEv2 address vector through the IP stack
// (rdma_addr_find_l2_eth_by_grh) and overwrites grh.hop_limit with the route's hop limit, so
// the unmodified pingpongs, which ask for hop_limit 1, put TTL 64 on the wire.
inline constexpr uint8_t kRoceRouteHopLimit = 64;

// An application's ibv_ah_attr as the engine's address vector, without the MAC (resolved
// apart): RoCE needs the GRH (-EINVAL without is_global), port 1, an sgid_index below
// gid_count; a traffic class of 0 takes the port's (DSCP << 2); the hop limit is the
// route's (kRoceRouteHopLimit) for unicast, whatever the attribute asks, as on Linux;
// multicast keeps the caller's.
int ah_from_verbs(const ibv_ah_attr& a, size_t gid_count, uint8_t port_tclass, verbs::Ah& out);

// An Ethernet link speed (Mb/s, DPDK's rte_eth_link) as ibv_port_attr's active_width
// (IBV_WIDTH_*) and active_speed (IBV_SPEED_*) with that bandwidth, the mapping Linux
// uses for every RoCE device (ib_get_eth_speed): up to 1G 1X SDR, 10G 1X FDR10, 20G 4X
// DDR, 25G 1X EDR, 40G 4X FDR10, 100G 4X EDR, 200G 4X HDR, more 4X NDR; an unknown
// speed (0) counts as 1X SDR.
struct IbLinkRate {
  uint8_t width, speed;
};
IbLinkRate ib_rate_for_eth(uint32_t speed_mbps);

struct ShimBackendStats {
  uint64_t sq_wqes = 0, rq_wqes = 0, cqes = 0, bad_wqes = 0, corrupt_rings = 0, events = 0, async_events = 0;
  // Doorbells: visits of a QP's or SRQ's rings by the poller (active list and
  // sweep), doorbell bits taken, rings parked (no longer polled until rung).
  uint64_t ring_visits = 0, doorbells = 0, parks = 0;
};

class EngineShimBackend final : public ShimBackend {
 public:
  EngineShimBackend(engine::Dataplane& dp, const config::Config& cfg);
  ~EngineShimBackend() override;
  // Installs / removes the per-core pollers.
  void start();
  void stop() noexcept;
  ShimBackendStats stats() const;

  uint32_t device_count() override;
  int device_info(uint32_t dev, proto::DeviceInfo& out) override;
  int query_device(uint32_t dev, ibv_device_attr& out) override;
  int query_port(uint32_t dev, uint32_t port, ibv_port_attr& out) override;
  int query_gid_table(uint32_t dev, uint32_t port, ibv_gid_entry* out, uint32_t max) override;
  int alloc_pd(const ClientInfo& c, ObjId& out) override;
  int dealloc_pd(const ClientInfo& c, ObjId pd) override;
  int reg_mr(const ClientInfo& c, const MrSetup& s, MrResult& out) override;
  int dereg_mr(const ClientInfo& c, ObjId mr) override;
  int alloc_mw(const ClientInfo& c, ObjId pd, uint32_t type, MwResult& out) override;
  int dealloc_mw(const ClientInfo& c, ObjId mw) override;
  int create_cq(const ClientInfo& c, const CqSetup& s, CqResult& out) override;
  int destroy_cq(const ClientInfo& c, ObjId cq) override;
  int resize_cq(const ClientInfo& c, ObjId cq, droce_shm_ring_hdr* ring, uint32_t ring_entries) override;
  int create_srq(const ClientInfo& c, const SrqSetup& s, SrqResult& out) override;
  int modify_srq(const ClientInfo& c, ObjId srq, const ibv_srq_attr& a, uint32_t mask) override;
  int query_srq(const ClientInfo& c, ObjId srq, ibv_srq_attr& out) override;
  int destroy_srq(const ClientInfo& c, ObjId srq) override;
  int create_qp(const ClientInfo& c, const QpSetup& s, QpResult& out) override;
  int modify_qp(const ClientInfo& c, ObjId qp, const ibv_qp_attr& a, uint32_t mask) override;
  int query_qp(const ClientInfo& c, ObjId qp, uint32_t mask, ibv_qp_attr& out) override;
  int destroy_qp(const ClientInfo& c, ObjId qp) override;
  int create_ah(const ClientInfo& c, ObjId pd, const ibv_ah_attr& a, AhResult& out) override;
  int destroy_ah(const ClientInfo& c, ObjId ah) override;
  int attach_mcast(const ClientInfo& c, ObjId qp, const ibv_gid& gid) override;
  int detach_mcast(const ClientInfo& c, ObjId qp, const ibv_gid& gid) override;
  int open_doorbell(const ClientInfo& c, droce_shm_doorbell* db) override;
  void client_gone(const ClientInfo& c) override;
  bool take_qp_event(const ClientInfo& c, ObjId qp, uint32_t& type) override;
  bool take_cq_event(const ClientInfo& c, ObjId cq, uint32_t& type) override;
  bool take_srq_event(const ClientInfo& c, ObjId srq, uint32_t& type) override;

  static constexpr uint32_t kMaxAhs = 4096;
  // Turns in a row an active QP / SRQ with a doorbell bit is found empty
  // before the poller parks it (stops polling it until its bit is rung).
  static constexpr uint32_t kParkAfter = 256;

 private:
  // The largest IB MTU port dev's configured Ethernet MTU carries (query_port's max_mtu).
  ibv_mtu port_max_mtu(uint32_t dev) const;
  struct Cq;
  struct Srq;
  struct Qp;
  struct Core;
  struct DbClient;
  struct AhSlot {
    verbs::Ah ah;
    uint32_t pd = 0;
    uint32_t port = 0;
    std::atomic<uint32_t> live{0};  // release-published by the control thread
  };

  // Runs fn on core i; -ETIMEDOUT when the core did not answer.
  int on_core(size_t core, std::function<int(engine::CoreLoop&)> fn);
  int core_of(const ClientInfo& c);
  int to_ah(uint32_t port, const ibv_ah_attr& a, verbs::Ah& out);
  int mcast_member(ObjId id, const ibv_gid& gid, Qp** qp, wire::Gid* g);
  uint32_t poll_core(Core& k) noexcept;
  uint32_t drain_qp(Core& k, Qp& q) noexcept;
  uint32_t drain_qp_rings(Core& k, Qp& q) noexcept;
  void publish_rq_done(Qp& q) noexcept;
  uint32_t drain_rq(Core& k, Qp& q, verbs::QpState st) noexcept;
  uint32_t drain_sq(Core& k, Qp& q) noexcept;
  void check_async(Core& k, Qp& q, verbs::QpState st) noexcept;
  uint32_t drain_srq(Core& k, Srq& s) noexcept;
  uint32_t drain_cq(Core& k, Cq& c) noexcept;
  void srq_maint(Core& k, Srq& s) noexcept;
  // Doorbells (core thread): the client's rung bits into the active lists.
  void take_doorbells(Core& k, DbClient& d) noexcept;
  void activate(Core& k, Qp& q) noexcept;
  void activate(Core& k, Srq& s) noexcept;
  bool park(Qp& q) noexcept;
  bool park(Srq& s) noexcept;
  // After a completion of QP qpn reached an engine CQ, before it is
  // published: the QP's (and its SRQ's) `done`, its asynchronous events.
  void before_cqe(Core& k, uint32_t port, uint32_t qpn) noexcept;
  uint32_t take_db_bit(const ClientInfo& c, DbClient** dbc);
  void give_db_bit(DbClient* dbc, uint32_t bit);
  void cq_overrun(Core& k, Cq& c) noexcept;
  // A bad work request: counted, completed in error, the QP to ERR.
  void qp_error(Core& k, Qp& q, verbs::Cq* cq, uint64_t wr_id, verbs::WcStatus st, bool send) noexcept;

  engine::Dataplane& dp_;
  const config::Config& cfg_;
  std::vector<std::unique_ptr<Core>> cores_;
  std::vector<uint64_t> pollers_;
  bool started_ = false;
  std::unique_ptr<AhSlot[]> ahs_;
  std::vector<uint32_t> free_ahs_;
  // Control-thread state (the ShimServer thread).
  std::map<uint64_t, int> client_core_;  // client id -> core
  std::map<ObjId, std::unique_ptr<Cq>> cqs_;
  std::map<ObjId, std::unique_ptr<Srq>> srqs_;
  std::map<ObjId, std::unique_ptr<Qp>> qps_;
  std::map<uint64_t, std::unique_ptr<DbClient>> dbs_;  // client id -> its doorbell
  ObjId next_id_ = 1;
};

}  // namespace droce::shim

// Embedding API: the droce dataplane as a library an application links and
// drives from its own poll loop. No threads of its own unless asked
// (start_loop_threads, below): every call, and poll(), runs on the
// application's thread.
//
//   engine::EmbedOptions o;
//   o.device = "net_af_packet0,iface=veth0";
//   o.ipv4 = {"10.0.0.1"};
//   engine::Embedded node(o);             // EAL, port, dataplane
//   auto pd = node.alloc_pd();
//   void* buf = node.alloc_dma(1 << 20);   // hugepage memory
//   uint32_t key; node.reg_mr(pd, buf, 1 << 20, verbs::kAccessAll, &key);
//   auto qp = node.create_qp(pd, verbs::QpType::RC, caps);
//   ... exchange qp.qpn / psn / rkey / address with the peer ...
//   node.connect(qp, peer);               // INIT -> RTR -> RTS, peer MAC by ARP
//   node.post_send(qp, wr);
//   for (;;) { node.poll(); n = qp.scq->poll(wc, 16); ... }
//
// With queues > 1 the port gets several RX/TX queues and one CoreLoop each
// (all polled by poll()); a QP lives on the loop that owns its QPN, frames
// landing on another queue are forwarded through the SPSC rings.
// start_loop_threads() instead gives loops 1..N-1 a thread each (poll() then
// drives loop 0 and the CM only); control calls (create_qp, connect,
// destroy_qp, reg_mr) reach those loops through their command rings, while
// post_send / post_recv and the QP's CQs belong to its loop's thread (a
// poller installed with dataplane().add_poller).
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cm/agent.h"
#include "cm/gsi.h"
#include "config/fault_table.h"
#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "engine/dataplane.h"

namespace droce::engine {

struct EmbedOptions {
  std::string device;                  // DPDK device (vdev devargs or PCI address)
  dpdk::Port* port = nullptr;          // or a port the application opened (outlives the Embedded; device unused)
  std::vector<std::string> eal_args;   // passed to rte_eal_init (defaults added, see dpdk/eal.h)
  bool init_eal = true;                // false: the application initialised the EAL itself
  uint16_t queues = 1;                 // RX/TX queue pairs = core loops
  std::vector<std::string> ipv4;       // "10.0.0.1"
  std::vector<std::string> ipv6;
  std::optional<wire::MacAddr> mac;
  uint16_t mtu = 0;                    // 0: leave the device's MTU
  uint32_t mbufs = 0;                  // pool size, 0: default
  uint16_t data_room = 0;              // mbuf data room incl. headroom, 0: from the device MTU
  uint8_t dscp = 0;
  bool ecn = true;
  bool cnp = true;
  // DCQCN and CNP settings in the config file's units (config::DcqcnConfig);
  // empty: engine.dcqcn / engine.dcqcn_params / engine.cnp_* as they are.
  std::optional<config::DcqcnConfig> dcqcn;
  transport::EngineConfig engine;      // max_qps, max_mrs, ...
  stats::Registry* registry = nullptr;
  uint32_t link_wait_ms = 3000;        // wait this long for the link to come up
};

struct QpPeer {  // what two sides exchange out of band (as perftest does)
  uint32_t qpn = 0;
  uint32_t psn = 0;
  wire::Gid gid{};
  wire::MacAddr mac{};  // zero: resolve by ARP / ND
};

struct QpOptions {
  verbs::QpType type = verbs::QpType::RC;
  verbs::QpCap cap;
  uint32_t cqe = 4096;
  verbs::Mtu mtu = verbs::Mtu::M1024;
  uint32_t psn = 0;
  uint32_t qkey = 0x11111111;
  uint8_t timeout = 14, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 12;
  uint8_t max_rd_atomic = 16;
  uint8_t max_dest_rd_atomic = 16;
  // The loop (index among the port's loops, 0..loops()-1) the QP lives on;
  // -1: round robin. A placed QP gets a QPN of that loop's residue.
  int loop = -1;
  // CQs shared with other QPs (Embedded::create_cq on the same loop, so the
  // QP needs `loop` set); nullptr: the QP gets CQs of its own, of cqe entries.
  verbs::Cq* send_cq = nullptr;
  verbs::Cq* recv_cq = nullptr;
};

struct QpHandle {
  size_t core = 0;
  uint32_t qpn = 0;
  uint32_t pd = 0;
  transport::Engine* eng = nullptr;
  transport::Qp* qp = nullptr;  // the engine's QP (post_send/post_recv skip the QPN lookup); null after destroy_qp
  verbs::Cq* scq = nullptr;
  verbs::Cq* rcq = nullptr;
  QpOptions opt;
};

class Embedded {
 public:
  explicit Embedded(const EmbedOptions& o);  // throws (EalError, PortError, DataplaneError, std::runtime_error)
  ~Embedded();
  Embedded(const Embedded&) = delete;
  Embedded& operator=(const Embedded&) = delete;

  // One pass over every core loop: RX, transport, timers, TX. Returns work done.
  uint32_t poll() noexcept { return dp_->poll_all() + (agent_ ? poll_cm() : 0); }

  Dataplane& dataplane() noexcept { return *dp_; }
  // Loops 1..loops()-1 on threads of their own (Dataplane::start_threads;
  // their pollers run there), loop 0 and the CM stay with poll(). Throws
  // DataplaneError. stop_loop_threads joins them (also done by ~Embedded).
  void start_loop_threads();
  void stop_loop_threads() noexcept;
  bool loop_threads_running() const noexcept { return dp_->threads_running(); }
  // Core loops of the port (EmbedOptions::queues); loop 0 is the home loop (ARP, CM).
  size_t loops() const noexcept { return dp_->port_cores(0).size(); }
  dpdk::Port& port() noexcept { return *port_; }
  config::PortFaults& faults() noexcept { return (*faults_)[0]; }
  const netstack::GidTable& gids() const { return dp_->gids(0); }
  // Congestion control (ECN, DCQCN, CNPs) of the port, and changing it while
  // the node runs (Dataplane::set_cc; throws DataplaneError).
  PortCc cc() const { return dp_->cc(0); }
  void set_cc(const PortCc& cc) { dp_->set_cc(0, cc); }
  wire::Gid gid(size_t index) const { return dp_->gids(0).at(index); }

  uint32_t alloc_pd() noexcept { return dp_->alloc_pd(); }
  void* alloc_dma(size_t len, uint64_t* iova = nullptr) { return dp_->alloc_dma(len, iova); }
  void free_dma(void* p) noexcept { dp_->free_dma(p); }
  int reg_mr(uint32_t pd, void* addr, uint64_t len, uint32_t access, uint32_t* key) {
    return dp_->reg_mr(0, pd, addr, len, access, key);
  }
  int dereg_mr(uint32_t key) { return dp_->dereg_mr(0, key); }

  // Creates CQs and a QP (RESET -> INIT) on the loop picked for it (o.loop, or
  // round robin). Throws on failure (also for a loop that does not exist).
  QpHandle create_qp(uint32_t pd, const QpOptions& o);
  // A CQ of cqe entries on loop `loop` (0..loops()-1) that several QPs of that
  // loop can share (QpOptions::send_cq / recv_cq, with QpOptions::loop set to
  // the same loop); it lives as long as the node. Throws on failure.
  verbs::Cq* create_cq(int loop, uint32_t cqe);
  // INIT -> RTR -> RTS towards the peer (MAC resolved when zero). 0 or errno.
  int connect(QpHandle& qp, const QpPeer& peer);
  // INIT -> RTR -> RTS with what the RDMA CM negotiated (Agent::qp_params, as
  // rdma_init_qp_attr gives it): peer QPN and PSNs, path MTU, READ depths,
  // ACK timeout and retries (they replace qp.opt's). mac zero: resolved by
  // ARP / ND, polling meanwhile (up to 3 s). 0 or errno.
  int connect(QpHandle& qp, const cm::QpParams& p, const wire::MacAddr& mac = {});
  int destroy_qp(QpHandle& qp);
  int post_send(const QpHandle& qp, const verbs::SendWr& wr) noexcept {
    return qp.qp ? qp.eng->post_send(*qp.qp, wr) : EINVAL;
  }
  int post_recv(const QpHandle& qp, const verbs::RecvWr& wr) noexcept {
    return qp.qp ? qp.eng->post_recv(*qp.qp, wr) : EINVAL;
  }
  // A program posting to many QPs in an order it knows ahead (droce-perf's
  // QP FIFO): prefetch_post a few posts before a post to qp, prefetch_post_wqe
  // one post before (transport::Engine::prefetch_post). Hints only.
  static void prefetch_post(const QpHandle& qp) noexcept {
    if (qp.qp) transport::Engine::prefetch_post(*qp.qp);
  }
  static void prefetch_post_wqe(const QpHandle& qp) noexcept {
    if (qp.qp) transport::Engine::prefetch_post_wqe(*qp.qp);
  }
  // Resolves a peer's MAC (ARP / ND), polling meanwhile. False after timeout_ms.
  bool resolve(const wire::Gid& ip, wire::MacAddr& mac, uint32_t timeout_ms = 3000);

  // The RDMA CM of the port (lib/cm/README.md): made at the first call (QP1 on
  // the home loop's engine, MAD buffers in hugepages, a cm::Agent with the
  // port's node GUID); poll() then drives it (QP1's completions, the Agent's
  // timers every millisecond). Its events go to the sink, called from poll()
  // or from the Agent call that caused them. Throws std::runtime_error when
  // QP1 cannot be made.
  cm::Agent& cm();
  void set_cm_sink(cm::Agent::EventSink sink) { cm_sink_ = std::move(sink); }
  const cm::Gsi* gsi() const noexcept { return gsi_.get(); }

 private:
  uint32_t poll_cm() noexcept;
  std::unique_ptr<dpdk::Eal> eal_;
  std::unique_ptr<dpdk::Port> own_port_;
  dpdk::Port* port_ = nullptr;
  std::unique_ptr<config::FaultTable> faults_;
  std::unique_ptr<Dataplane> dp_;
  // RDMA CM (cm()): destroyed before the dataplane.
  cm::Agent::EventSink cm_sink_;
  void* cm_mem_ = nullptr;
  uint32_t cm_lkey_ = 0;
  std::unique_ptr<cm::Gsi> gsi_;
  std::unique_ptr<cm::Agent> agent_;
  uint64_t cm_next_tick_ = 0;
};

// ---- Shared by the programs that run one embedded node from a command line
// (app/droce-perf, app/droce-interop): "PROGRAM [options] -- [EAL args]".

// Splits argv at the first "--": returns the argc of the program's own
// options and appends what follows to eal.
int split_eal_args(int argc, char** argv, std::vector<std::string>& eal);

// EmbedOptions for a node on `device` with IPv4 addresses ipv4 and MAC `mac`
// ("" = the port's own; a malformed one throws "--mac: bad MAC ..."). A path
// MTU above 1024 gets mbufs for IB MTU 4096 frames (af_packet needs
// framesz=8192 in the devargs for those).
EmbedOptions node_options(const std::string& device, const std::vector<std::string>& eal,
                          const std::vector<std::string>& ipv4, const std::string& mac, uint32_t path_mtu);

// Checks that GID index gid_index exists on the node (throws naming `flag`
// otherwise) and prints " device DEV mac MAC gid[i] GID" on stdout.
void announce_node(Embedded& node, const std::string& device, uint32_t gid_index, const char* flag);

}  // namespace droce::engine

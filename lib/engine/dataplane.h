// The dataplane: one run-to-completion CoreLoop per lcore over DPDK port
// queues, QPN-partitioned transport engines, SPSC forwarding rings between
// cores, a command ring per core for the control path. See README.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "config/fault_table.h"
#include "dpdk/port.h"
#include "dpdk/queue_io.h"
#include "engine/qpn_owner.h"
#include "fault/fault_injector.h"
#include "netstack/netstack.h"
#include "stats/groups.h"
#include "stats/stats.h"
#include "transport/engine.h"

struct rte_ring;

namespace droce::engine {

class DataplaneError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The transport engine's counters as a lib/stats group ("transport").
const stats::GroupDesc& transport_group();

// Congestion control of a port (issue 13): ECT marking of data packets (ecn),
// CNPs for CE (cnp), and the DCQCN settings in the operator's units
// (config::DcqcnConfig).
struct PortCc {
  bool ecn = true;
  bool cnp = true;
  config::DcqcnConfig dcqcn;
};
// Writes them into an engine config (ecn, cnp, cnp_*, dcqcn, dcqcn_params; the
// reaction point's other parameters, such as burst_bytes, stay as they are).
void apply_cc(const PortCc& cc, transport::EngineConfig& ec) noexcept;
// The same read back from an engine config (times rounded to microseconds,
// rates to Mb/s, byte_reset to 64-byte units).
PortCc cc_of(const transport::EngineConfig& ec) noexcept;

struct PortSpec {
  std::string name;
  dpdk::Port* port = nullptr;             // opened by the caller; outlives the Dataplane
  netstack::HostConfig host;              // mac: taken from the port when all zero
  config::PortFaults* faults = nullptr;   // nullptr: no fault injection on this port
  stats::PerCore<stats::PortCounter>* counters = nullptr;  // nullptr: the dataplane makes its own
  uint8_t dscp = 0;
  bool ecn = true;
  bool cnp = true;  // answer CE with CNPs
  // DCQCN reaction point and CNP settings; empty: DataplaneConfig::engine's.
  std::optional<config::DcqcnConfig> dcqcn;
};

struct CoreSpec {
  unsigned lcore = 0;
  struct Queue {
    uint32_t port = 0;  // index into ports
    uint16_t queue = 0;
  };
  std::vector<Queue> queues;  // at most one queue per port per core
  // The loop calls sched_yield() after this many polls in a row found no work
  // (0: never). On a core of its own that returns at once; on a CPU shared with
  // the processes it serves (fewer CPUs than busy loops) it hands the CPU to
  // them instead of spinning out a whole scheduler tick.
  uint32_t idle_yield_polls = 256;
};

struct DataplaneConfig {
  std::vector<PortSpec> ports;
  std::vector<CoreSpec> cores;
  transport::EngineConfig engine;  // max_qps (QPN space of a port), max_mrs, windows; mac/gid per port
  uint32_t ring_size = 1024;       // forwarding ring between two cores (power of two)
  uint32_t cmd_ring_size = 64;
  stats::Registry* registry = nullptr;                         // counters registered here when set
  stats::PerCore<stats::CoreCounter>* core_counters = nullptr;  // nullptr: own
};

class Dataplane;
class CoreLoop;

// io::PacketIo the Engine of one (core, port) slot sees: forwarded frames
// from other cores, then this core's queue through the RX fault injector
// and the classifier; TX through the TX fault injector.
class DemuxIo final : public io::PacketIo {
 public:
  DemuxIo(Dataplane& dp, CoreLoop& core, uint32_t port, uint32_t my_index, dpdk::DpdkQueueIo& q,
          config::PortFaults* faults, stats::CounterBlock<stats::PortCounter>* pc,
          stats::CounterBlock<stats::CoreCounter>* cc);
  ~DemuxIo() override;

  uint16_t rx_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  uint16_t alloc_burst(io::PktBuf** bufs, uint16_t n) noexcept override { return q_.alloc_burst(bufs, n); }
  uint16_t tx_burst(io::PktBuf** bufs, uint16_t n) noexcept override;
  void free_burst(io::PktBuf** bufs, uint16_t n) noexcept override { q_.free_burst(bufs, n); }
  uint32_t buf_capacity() const noexcept override { return q_.buf_capacity(); }
  wire::MacAddr mac() const noexcept override { return q_.mac(); }
  bool zero_copy_tx() const noexcept override { return q_.zero_copy_tx(); }

  // Home core only: ARP/ND timers (retries, probes).
  void netstack_timers(uint64_t now) noexcept;
  dpdk::DpdkQueueIo& queue() noexcept { return q_; }
  // Bytes in the TX fault injector's bottleneck queue now (0 without one):
  // for a sampler on this core's own thread (droce-perf --sample-us).
  uint64_t tx_bottleneck_queue_bytes() const noexcept;
  // Releases frames held by the fault injectors (shutdown).
  void drain() noexcept;

 private:
  friend class Dataplane;
  // Where a frame comes from: the device queue (MAC checked), this core's
  // loopback FIFO, or another core's ring (already classified there: a
  // multicast frame is not fanned out again).
  enum class Origin : uint8_t { Wire, Loop, Ring };
  void classify(io::PktBuf* b, io::PktBuf** out, uint16_t& nout, uint16_t cap, Origin from) noexcept;
  // A frame to QPN 0xFFFFFF (README: Multicast): to every core of the port
  // whose engine has multicast members (one mbuf, its reference count raised),
  // to the home core when none has (its engine counts rx_mcast_no_group).
  void fan_out(io::PktBuf* b, io::PktBuf** out, uint16_t& nout, uint16_t cap) noexcept;
  // A multicast frame our engine sends: a copy into the loopback FIFO when a
  // core of this port has members (another QP of this node may be in the group).
  void loop_mcast_copy(const io::PktBuf* b) noexcept;
  void deliver(io::PktBuf* b, io::PktBuf** out, uint16_t& nout, uint16_t cap) noexcept;
  void forward(io::PktBuf* b, uint32_t to) noexcept;
  void host_frame(io::PktBuf* b, uint64_t now) noexcept;
  void send_host(io::PktBuf* b) noexcept;
  // Loopback (README: Loopback): frames to the port's own MAC go to loop_
  // instead of the device; rx_burst feeds them to classify().
  bool to_self(const io::PktBuf* b) const noexcept {
    return b->len >= 6 && std::memcmp(b->data, mac_.data(), 6) == 0 && to_our_ip(b);
  }
  bool port_has_mcast_members() const noexcept;
  bool to_our_ip(const io::PktBuf* b) const noexcept;
  uint16_t send_frames(io::PktBuf** bufs, uint16_t n, bool must_take, int tries) noexcept;
  // Frames from the fault injector the device refused: back into its TX
  // bottleneck queue, or a counted drop (tx_drop_full).
  void refused(io::PktBuf** bufs, uint16_t n) noexcept;
  bool loop_back(io::PktBuf* b) noexcept;
  void release(io::PktBuf* b) noexcept {
    free_[nfree_++] = b;
    if (nfree_ == kTmp) flush_free();
  }
  void flush_free() noexcept {
    if (nfree_) q_.free_burst(free_, nfree_);
    nfree_ = 0;
  }

  static constexpr uint16_t kTmp = 128;
  static constexpr uint32_t kMaxFan = 64;  // cores of one port a multicast frame may go to
  static constexpr uint32_t kKicks = 256;
  Dataplane& dp_;
  CoreLoop& core_;
  const uint32_t port_;
  const uint32_t me_;  // index among the port's cores
  dpdk::DpdkQueueIo& q_;
  config::PortFaults* faults_;
  std::unique_ptr<fault::FaultInjector> frx_, ftx_;
  stats::CounterBlock<stats::PortCounter>* pc_;
  stats::CounterBlock<stats::CoreCounter>* cc_;
  wire::MacAddr mac_;
  io::PktBuf* free_[kTmp]{};
  uint16_t nfree_ = 0;
  const uint32_t kicks_;    // kKicks on net_af_packet, 0 on ports that send at once
  uint32_t kick_left_ = 0;  // zero-length TX bursts still to do (af_packet sends on the next kick)
  io::PktBuf* backlog_[kTmp]{};  // frames for our engine beyond the burst it asked for
  uint16_t nbacklog_ = 0;
  static constexpr uint32_t kLoop = 256;  // loopback FIFO (power of two)
  io::PktBuf* loop_[kLoop]{};
  uint32_t loop_head_ = 0, loop_tail_ = 0;  // free-running; producer = consumer = this core
};

// One lcore's poll loop. Everything here is touched only by that lcore
// (or by a control thread while the loop is not running).
class CoreLoop {
 public:
  struct Slot {
    uint32_t port = 0;
    uint16_t queue = 0;
    uint32_t index = 0;  // this core's index among the port's cores (its QPN residue)
    std::unique_ptr<dpdk::DpdkQueueIo> qio;
    std::unique_ptr<DemuxIo> demux;
    std::unique_ptr<transport::Engine> eng;
    void* mr_mem = nullptr;  // rte_zmalloc'd MR table
    std::unique_ptr<stats::CounterBlock<transport::Ctr>> tctr;
  };

  CoreLoop(Dataplane& dp, size_t index, unsigned lcore);
  ~CoreLoop();
  CoreLoop(const CoreLoop&) = delete;
  CoreLoop& operator=(const CoreLoop&) = delete;

  size_t index() const noexcept { return index_; }
  unsigned lcore() const noexcept { return lcore_; }
  // The engine of this core for a port, or nullptr if this core does not serve it.
  transport::Engine* engine(uint32_t port) noexcept;
  std::vector<Slot>& slots() noexcept { return slots_; }

  // One iteration: the pollers, every slot's engine, commands, ~1 ms housekeeping.
  uint32_t poll_once() noexcept;
  // Runs on this core, every iteration; returns work done. Core thread only
  // (install it with Dataplane::add_poller).
  using Poller = std::function<uint32_t()>;
  uint64_t add_poller_st(Poller p);
  bool remove_poller_st(uint64_t id);

  // Every QP of every slot to ERR (outstanding work completes with WR_FLUSH_ERR).
  void flush_all_st() noexcept;

  // True while a thread drives this loop (Dataplane::start, start_threads):
  // run_on then goes through the command ring, and poll_all skips it.
  bool driven() const noexcept { return driven_.load(std::memory_order_acquire); }
  // True on the thread that drives this loop (or on any thread when none does).
  bool on_own_thread() const noexcept {
    return !driven() || driver_.load(std::memory_order_acquire) == std::this_thread::get_id();
  }

 private:
  friend class Dataplane;
  void housekeeping(uint64_t now) noexcept;
  void stall(uint64_t gap_tsc) noexcept;
  void run_commands() noexcept;

  Dataplane& dp_;
  size_t index_;
  unsigned lcore_;
  std::vector<Slot> slots_;
  std::vector<int> slot_of_port_;
  rte_ring* cmd_ = nullptr;
  std::vector<std::pair<uint64_t, Poller>> pollers_;
  uint64_t poller_seq_ = 0;
  uint64_t next_hk_ = 0;
  uint64_t last_poll_ = 0;  // TSC of the last poll_once (the stall counters)
  uint64_t stall_tsc_ = 0;  // a gap this long between polls is a stall (1 ms)
  stats::CounterBlock<stats::CoreCounter>* cc_ = nullptr;
  std::atomic<bool> driven_{false};
  std::atomic<std::thread::id> driver_{};
};

struct MrInfo {
  uint32_t port = 0, key = 0, pd = 0, access = 0;
  uint64_t addr = 0, length = 0;
  uint64_t dma_iova = 0;  // bus address of the first byte (hugepage memory), or 0 when unknown
  bool hugepage = false;
  bool zero_copy = false;  // TX may attach its bytes by reference (hugepage, IOVA-contiguous, port multi-seg)
};

struct QpInfo {
  uint32_t port = 0, qpn = 0, dest_qpn = 0, sq_psn = 0, rq_psn = 0, mtu = 0;
  size_t core = 0;
  unsigned lcore = 0;
  verbs::QpType type = verbs::QpType::RC;
  verbs::QpState state = verbs::QpState::Reset;
  uint32_t sq_outstanding = 0, rq_posted = 0;
  transport::QpCounters ctr;
  // DCQCN reaction point (RC/UC): rates in kb/s, alpha of 1024; limited: paced
  // below line rate since a CNP.
  bool rp_limited = false;
  uint32_t rate_kbps = 0, target_kbps = 0, alpha = 0;
  transport::dcqcn::Counters rp;
  // Selective repeat (RC): sr_enabled, the node runs it (the QP has its
  // scoreboard); sr_tx, this QP marks its requests toward a peer known to
  // run it (listed or learned). The counters are in ctr (sr_*).
  bool sr_enabled = false, sr_tx = false;
};

struct NeighInfo {
  uint32_t port = 0;
  netstack::NeighEntry e;
};

class Dataplane {
 public:
  using Ms = std::chrono::milliseconds;

  // Builds cores, engines, rings and netstacks (control path; throws DataplaneError).
  explicit Dataplane(DataplaneConfig cfg);
  ~Dataplane();
  Dataplane(const Dataplane&) = delete;
  Dataplane& operator=(const Dataplane&) = delete;

  // Launches every core loop (rte_eal_remote_launch; a core on the calling
  // lcore gets a registered thread). Throws DataplaneError.
  void start();
  // Flushes every QP with errors, stops and joins the loops. Idempotent.
  void stop() noexcept;
  bool running() const noexcept { return running_; }
  bool stopping() const noexcept { return stop_.load(std::memory_order_relaxed); }

  // Embedded mode (not started): one iteration of every core loop on the
  // caller's thread (loops driven by threads of start_threads are skipped).
  uint32_t poll_all() noexcept;
  // Embedded mode with some loops on threads of their own (lib/engine/README.md,
  // "Loops on threads in embedded mode"): each core in `cores` gets a thread
  // (registered with the EAL for a mempool cache, not pinned) running its loop
  // as start() does, while the caller keeps driving the others with
  // poll_all(). From then on run_on (and every control operation built on it:
  // reg_mr, QP creation through Embedded, ...) reaches those cores through
  // their command rings; from the core's own thread (a poller) it runs
  // inline. Throws DataplaneError when loops run already or a core does not exist.
  void start_threads(const std::vector<size_t>& cores);
  // Stops and joins those threads (QPs stay as they are; run_on is inline
  // again). Idempotent; stop() and the destructor call it.
  void stop_threads() noexcept;
  bool threads_running() const noexcept { return !thr_.empty(); }

  size_t core_count() const noexcept { return cores_.size(); }
  CoreLoop& core(size_t i) { return *cores_.at(i); }
  size_t port_count() const noexcept { return ports_.size(); }
  const PortSpec& port(uint32_t p) const { return cfg_.ports.at(p); }
  // Core indexes serving port p (QPN n belongs to port_cores(p)[n % size],
  // except QPN 1, the GSI QP, which belongs to the home core port_cores(p)[0]).
  const std::vector<size_t>& port_cores(uint32_t p) const { return ports_.at(p).cores; }
  size_t owner_core(uint32_t p, uint32_t qpn) const {
    const PortState& ps = ports_.at(p);
    return ps.cores[ps.owner.of(qpn)];
  }
  size_t home_core(uint32_t p) const { return ports_.at(p).cores.at(0); }
  // A core for a new QP on port p (round robin).
  size_t pick_core(uint32_t p);
  const netstack::GidTable& gids(uint32_t p) const { return ports_.at(p).gids; }

  // Runs fn(core) on core i and waits for it. Inline when the loops are not
  // running. False on timeout (fn may still run later: capture by value).
  bool run_on(size_t core, std::function<void(CoreLoop&)> fn, Ms timeout = Ms(2000));
  // Installs / removes a per-core poller (through run_on).
  uint64_t add_poller(size_t core, CoreLoop::Poller p);
  bool remove_poller(size_t core, uint64_t id);

  // ---- verbs facade (control path, any one thread at a time) ----
  uint32_t alloc_pd() noexcept { return pd_seq_.fetch_add(1) + 1; }
  // Registers on every core of port p (replicated tables, identical keys). 0 or errno.
  int reg_mr(uint32_t p, uint32_t pd, void* addr, uint64_t len, uint32_t access, uint32_t* key) {
    return reg_mr_iova(p, pd, addr, reinterpret_cast<uint64_t>(addr), len, access, key);
  }
  // The same with the address work requests use (iova) apart from where the bytes are (host).
  int reg_mr_iova(uint32_t p, uint32_t pd, void* host, uint64_t iova, uint64_t len, uint32_t access, uint32_t* key);
  // EBUSY while memory windows are bound to it (on any core).
  int dereg_mr(uint32_t p, uint32_t key);
  // Memory windows (ibv_alloc_mw / ibv_dealloc_mw) on every core of port p, in
  // the same order, so keys agree. Binding is a work request on a QP: it takes
  // effect in the table of the QP's core (a type 2 window is used only through
  // that QP; a type 1 window only by QPs of that core, see lib/engine/README.md).
  // dealloc_mw takes the key alloc_mw gave (binds change the key byte). 0 or errno.
  int alloc_mw(uint32_t p, uint32_t pd, uint32_t type, uint32_t* key);
  int dealloc_mw(uint32_t p, uint32_t key);
  // Hugepage memory for registration (rte_malloc); iova_out: bus address when known.
  void* alloc_dma(size_t len, uint64_t* iova_out = nullptr);
  void free_dma(void* p) noexcept;

  std::vector<MrInfo> mrs();
  std::vector<QpInfo> qps();
  std::vector<NeighInfo> neighbours();
  // Multicast (README: Multicast): the UD QP qpn of port p joins (leaves) the
  // group mgid on the core that owns it, then the port's device filter is
  // brought up to date (mcast_sync). 0 or the engine's errno (EINVAL, ENOMEM),
  // ETIMEDOUT when the core did not answer.
  int attach_mcast(uint32_t p, uint32_t qpn, const wire::Gid& mgid);
  int detach_mcast(uint32_t p, uint32_t qpn, const wire::Gid& mgid);
  // The groups of port p's engines (union, each once), read on their cores.
  std::vector<wire::Gid> mcast_groups(uint32_t p);
  // Sets the device's multicast address list to the MACs of port p's groups
  // (rte_eth_dev_set_mc_addr_list; where the PMD has none, all-multicast
  // while any group exists; PMDs without either, such as af_packet, memif and
  // net_ring, take every frame anyway). Call after destroying a UD QP (which
  // leaves its groups). Returns the number of groups.
  size_t mcast_sync(uint32_t p);
  // Resolves a peer's MAC through the port's NetStack (ARP / ND), waiting up
  // to timeout (polling the loops itself in embedded mode). False on failure.
  bool resolve(uint32_t p, const wire::Gid& ip, wire::MacAddr& mac, Ms timeout = Ms(3000));
  // One non-blocking step of the same: asks the port's home core once (sends
  // the ARP request / NS when one is due) and returns at once. Ready (mac
  // written), Pending (asked, no answer yet: call again later) or Failed (no
  // such port, or the core did not answer).
  enum class ResolveStep : uint8_t { Ready, Pending, Failed };
  ResolveStep resolve_step(uint32_t p, const wire::Gid& ip, wire::MacAddr& mac);
  // The same step on the calling thread, which must be port p's home core
  // (a poller or run_on function there; any thread while the loops are not
  // running): for code that lives on the home core, such as the port's CM
  // (lib/shim/engine/engine_cm.h), where run_on would wait for itself.
  ResolveStep resolve_step_st(uint32_t p, const wire::Gid& ip, wire::MacAddr& mac) noexcept;

  stats::PerCore<stats::PortCounter>& port_counters(uint32_t p) { return *ports_.at(p).counters; }
  stats::PerCore<stats::CoreCounter>& core_counters() { return *core_ctr_; }
  const io::Clock& clock() const noexcept { return clock_; }
  // A transport counter of port p summed over its engines (as of their last
  // housekeeping, every millisecond): e.g. Ctr::CnpSent, the notification point's CNPs.
  uint64_t engine_counter(uint32_t p, transport::Ctr c) const;
  // Congestion control of port p (control thread): what its engines run.
  PortCc cc(uint32_t p) const;
  // Applies new settings on every core of port p, each engine between bursts
  // (run_on: the core's command ring; Engine::set_cc). Throws DataplaneError
  // for a port that does not exist or a core that does not answer in time
  // (the cores that did answer keep the new settings).
  void set_cc(uint32_t p, const PortCc& cc);
  // Traffic class for AHs on port p: the configured DSCP (the engine adds ECT(0)).
  uint8_t tclass(uint32_t p) const { return static_cast<uint8_t>(cfg_.ports.at(p).dscp << 2); }

 private:
  friend class DemuxIo;
  friend class CoreLoop;
  struct PortState {
    std::vector<size_t> cores;  // core indexes serving the port, in QPN-residue order
    QpnOwner owner;             // QPN -> index into cores (set once cores is complete)
    std::vector<DemuxIo*> demux;  // by residue
    std::vector<const transport::Engine*> engines;  // by residue (mcast_memberships() read by any core)
    // Multicast MACs the device filter accepts (control thread, mcast_sync).
    std::vector<wire::MacAddr> mc_macs;
    std::unique_ptr<netstack::NetStack> stack;  // touched by the home core (cores[0]) only
    PortCc cc;  // what the port's engines run (control thread, under ctl_mu_)
    netstack::GidTable gids;
    std::vector<rte_ring*> rings;  // rings[src * n + dst], src != dst
    std::unique_ptr<stats::PerCore<stats::PortCounter>> own_counters;
    stats::PerCore<stats::PortCounter>* counters = nullptr;
    size_t rr = 0;
    rte_ring* ring(uint32_t src, uint32_t dst) const noexcept { return rings[src * cores.size() + dst]; }
  };
  static int launch(void* arg);
  void loop(CoreLoop& c, const std::atomic<bool>& stop) noexcept;

  DataplaneConfig cfg_;
  dpdk::TscClock clock_;
  std::vector<PortState> ports_;
  std::vector<std::unique_ptr<CoreLoop>> cores_;
  std::unique_ptr<stats::PerCore<stats::CoreCounter>> own_core_ctr_;
  stats::PerCore<stats::CoreCounter>* core_ctr_ = nullptr;
  std::vector<stats::Registry::Id> reg_ids_;
  std::atomic<bool> stop_{false};
  bool running_ = false;
  std::vector<std::thread> threads_;   // cores on the caller's own lcore
  std::vector<unsigned> launched_;     // lcores launched with rte_eal_remote_launch
  // start_threads: the cores' threads and their stop flag.
  std::vector<std::pair<size_t, std::thread>> thr_;
  std::atomic<bool> thr_stop_{false};
  std::atomic<uint32_t> pd_seq_{0};
  mutable std::mutex ctl_mu_;  // serialises control operations (run_on callers)
  struct MrRec {
    MrInfo info;
    std::vector<dpdk::ExtMem*> ext;  // zero-copy handle per core of the port (nullptr: copy)
  };
  std::vector<MrRec> mrs_;
  struct DmaRec {
    void* p;
    size_t len;
    uint64_t iova;
  };
  std::vector<DmaRec> dma_;
};

}  // namespace droce::engine

#include "engine/dataplane.h"

#include <rte_cycles.h>
#include <sched.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_errno.h>
#include <rte_mbuf.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_memory.h>
#include <rte_ring.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>

namespace droce::engine {

using stats::CoreCounter;
using stats::PortCounter;

namespace {

constexpr size_t kTctr = static_cast<size_t>(transport::Ctr::kCount);

const std::array<std::string_view, kTctr>& transport_names() {
  static const std::array<std::string_view, kTctr> names = [] {
    std::array<std::string_view, kTctr> a{};
    for (size_t i = 0; i < kTctr; ++i) a[i] = transport::ctr_name(static_cast<transport::Ctr>(i));
    return a;
  }();
  return names;
}

std::atomic<uint32_t> g_instance{0};

}  // namespace

const stats::GroupDesc& transport_group() {
  static const stats::GroupDesc g{"transport", std::span<const std::string_view>(transport_names())};
  return g;
}

// ============================================================ CoreLoop

CoreLoop::CoreLoop(Dataplane& dp, size_t index, unsigned lcore) : dp_(dp), index_(index), lcore_(lcore) {
  char name[RTE_RING_NAMESIZE];
  std::snprintf(name, sizeof name, "drcmd%u_%u", g_instance.load() % 100000, static_cast<unsigned>(index % 1000));
  cmd_ = rte_ring_create(name, dp.cfg_.cmd_ring_size, SOCKET_ID_ANY, RING_F_SC_DEQ);
  if (!cmd_) throw DataplaneError(std::string("rte_ring_create ") + name + ": " + rte_strerror(rte_errno));
  slot_of_port_.assign(dp.cfg_.ports.size(), -1);
}

CoreLoop::~CoreLoop() {
  for (auto& s : slots_) {
    s.eng.reset();  // returns its TX buffers through the demux
    if (s.demux) s.demux->drain();
    s.demux.reset();
    s.qio.reset();
    if (s.mr_mem) rte_free(s.mr_mem);
  }
  if (cmd_) rte_ring_free(cmd_);
}

transport::Engine* CoreLoop::engine(uint32_t port) noexcept {
  if (port >= slot_of_port_.size() || slot_of_port_[port] < 0) return nullptr;
  return slots_[static_cast<size_t>(slot_of_port_[port])].eng.get();
}

uint64_t CoreLoop::add_poller_st(Poller p) {
  pollers_.emplace_back(++poller_seq_, std::move(p));
  return poller_seq_;
}

bool CoreLoop::remove_poller_st(uint64_t id) {
  for (size_t i = 0; i < pollers_.size(); ++i)
    if (pollers_[i].first == id) {
      pollers_.erase(pollers_.begin() + static_cast<long>(i));
      return true;
    }
  return false;
}

void CoreLoop::flush_all_st() noexcept {
  for (auto& s : slots_) {
    const uint32_t max = s.eng->config().max_qps;
    for (uint32_t n = 0; n < max; ++n) {
      transport::Qp* q = s.eng->qp(n);
      if (q && q->state != verbs::QpState::Reset && q->state != verbs::QpState::Err) s.eng->qp_to_error(*q);
    }
  }
}

namespace {
struct Cmd {
  std::function<void(CoreLoop&)> fn;
  std::atomic<bool> done{false};
};
}  // namespace

void CoreLoop::run_commands() noexcept {
  void* obj = nullptr;
  while (rte_ring_sc_dequeue(cmd_, &obj) == 0) {
    auto* sp = static_cast<std::shared_ptr<Cmd>*>(obj);
    try {
      (*sp)->fn(*this);
    } catch (...) {
      // Control functions report through their captures; never unwind into the loop.
    }
    (*sp)->done.store(true, std::memory_order_release);
    delete sp;
  }
}

void CoreLoop::housekeeping(uint64_t now_tsc) noexcept {
  next_hk_ = now_tsc + rte_get_tsc_hz() / 1000;
  cc_->add(CoreCounter::timer_runs);
  for (auto& s : slots_) {
    for (size_t i = 0; i < kTctr; ++i) {
      const auto c = static_cast<transport::Ctr>(i);
      s.tctr->set(c, s.eng->counter(c));
    }
    auto* pc = &(*dp_.ports_[s.port].counters)[index_];
    pc->set(PortCounter::rx_drop_bad_icrc, s.eng->counter(transport::Ctr::RxIcrcErr));
    pc->set(PortCounter::rx_drop_no_qp, s.eng->counter(transport::Ctr::RxNoQp));
    if (s.index == 0) s.demux->netstack_timers(dp_.clock_.now_ns());
  }
  cc_->set(CoreCounter::cnp_sent, 0);
  uint64_t cnp_s = 0, cnp_r = 0, occ = 0;
  for (auto& s : slots_) {
    cnp_s += s.eng->counter(transport::Ctr::CnpSent);
    cnp_r += s.eng->counter(transport::Ctr::CnpReceived);
    const auto& ps = dp_.ports_[s.port];
    for (uint32_t src = 0; src < ps.cores.size(); ++src)
      if (src != s.index) occ += rte_ring_count(ps.ring(src, s.index));
  }
  cc_->set(CoreCounter::cnp_sent, cnp_s);
  cc_->set(CoreCounter::cnp_received, cnp_r);
  cc_->set(CoreCounter::ring_occupancy, occ);
}

void CoreLoop::stall(uint64_t gap_tsc) noexcept {
  const uint64_t us = gap_tsc * 1'000'000 / rte_get_tsc_hz();
  cc_->add(CoreCounter::stalls);
  cc_->add(CoreCounter::stall_us, us);
  if (us > cc_->get(CoreCounter::stall_max_us)) cc_->set(CoreCounter::stall_max_us, us);
}

uint32_t CoreLoop::poll_once() noexcept {
  uint32_t work = 0;
  // Pollers first: work requests posted through them (the verbs shim's rings)
  // reach the engine before this iteration's receive burst, so a datagram
  // never finds the receive queue empty while its WQE waits in a ring, and a
  // send goes out in the same iteration it is taken.
  // One TSC read per turn, for the engines' clocks and the housekeeping tick.
  const uint64_t now = rte_rdtsc();
  // A gap of 1 ms or more since the last turn: the thread was descheduled (a
  // shared CPU) or blocked; counted so a measurement can line its losses up
  // with the stalls of either node (stalls, stall_us, stall_max_us).
  if (now - last_poll_ >= stall_tsc_ && last_poll_ != 0) stall(now - last_poll_);
  last_poll_ = now;
  for (auto& p : pollers_) work += p.second();
  const uint64_t now_ns = dp_.clock_.ns_of(now);
  for (auto& s : slots_) work += s.eng->poll(now_ns);
  if (!rte_ring_empty(cmd_)) run_commands();
  if (now >= next_hk_) housekeeping(now);
  cc_->add(CoreCounter::polls);
  if (work) cc_->add(CoreCounter::busy_polls);
  return work;
}

// ============================================================ Dataplane

Dataplane::Dataplane(DataplaneConfig cfg) : cfg_(std::move(cfg)) {
  const uint32_t inst = g_instance.fetch_add(1) + 1;
  if (cfg_.ports.empty()) throw DataplaneError("dataplane: no ports");
  if (cfg_.cores.empty()) throw DataplaneError("dataplane: no cores");
  ports_.resize(cfg_.ports.size());
  for (size_t p = 0; p < cfg_.ports.size(); ++p) {
    PortSpec& spec = cfg_.ports[p];
    if (!spec.port) throw DataplaneError("dataplane: port " + spec.name + " is not open");
    if (spec.host.mac == wire::MacAddr{}) spec.host.mac = spec.port->mac();
    ports_[p].stack = std::make_unique<netstack::NetStack>(spec.host);
    ports_[p].gids = ports_[p].stack->gids();
    if (spec.counters) {
      ports_[p].counters = spec.counters;
    } else {
      ports_[p].own_counters = std::make_unique<stats::PerCore<PortCounter>>(cfg_.cores.size());
      ports_[p].counters = ports_[p].own_counters.get();
    }
    if (ports_[p].counters->size() < cfg_.cores.size())
      throw DataplaneError("dataplane: port " + spec.name + ": fewer counter blocks than cores");
  }
  if (cfg_.core_counters) {
    core_ctr_ = cfg_.core_counters;
  } else {
    own_core_ctr_ = std::make_unique<stats::PerCore<CoreCounter>>(cfg_.cores.size());
    core_ctr_ = own_core_ctr_.get();
  }
  // Cores and which ports they serve.
  for (size_t i = 0; i < cfg_.cores.size(); ++i) {
    const CoreSpec& cs = cfg_.cores[i];
    cores_.push_back(std::make_unique<CoreLoop>(*this, i, cs.lcore));
    CoreLoop& c = *cores_.back();
    c.cc_ = &(*core_ctr_)[i];
    c.stall_tsc_ = rte_get_tsc_hz() / 1000;
    for (const auto& q : cs.queues) {
      if (q.port >= cfg_.ports.size())
        throw DataplaneError("dataplane: core " + std::to_string(i) + ": no port " + std::to_string(q.port));
      if (c.slot_of_port_[q.port] >= 0)
        throw DataplaneError("dataplane: core " + std::to_string(i) + " (lcore " + std::to_string(cs.lcore) +
                             ") has two queues of port " + cfg_.ports[q.port].name + "; one per port per core");
      const dpdk::Port& port = *cfg_.ports[q.port].port;
      if (q.queue >= port.rx_queues() || q.queue >= port.tx_queues())
        throw DataplaneError("dataplane: port " + cfg_.ports[q.port].name + " has no queue " + std::to_string(q.queue));
      c.slot_of_port_[q.port] = static_cast<int>(c.slots_.size());
      CoreLoop::Slot s;
      s.port = q.port;
      s.queue = q.queue;
      s.index = static_cast<uint32_t>(ports_[q.port].cores.size());
      ports_[q.port].cores.push_back(i);
      c.slots_.push_back(std::move(s));
    }
  }
  // Forwarding rings, then the engines.
  for (size_t p = 0; p < ports_.size(); ++p) {
    PortState& ps = ports_[p];
    const size_t n = ps.cores.size();
    if (n == 0) throw DataplaneError("dataplane: port " + cfg_.ports[p].name + " is served by no core");
    ps.owner = QpnOwner(static_cast<uint32_t>(n));
    ps.rings.assign(n * n, nullptr);
    ps.demux.assign(n, nullptr);
    ps.engines.assign(n, nullptr);
    for (size_t s = 0; s < n; ++s)
      for (size_t d = 0; d < n; ++d) {
        if (s == d) continue;
        char name[RTE_RING_NAMESIZE];
        std::snprintf(name, sizeof name, "drfw%u_%u_%u_%u", inst % 100000, static_cast<unsigned>(p % 100),
                      static_cast<unsigned>(s % 100), static_cast<unsigned>(d % 100));
        ps.rings[s * n + d] = rte_ring_create(name, cfg_.ring_size, cfg_.ports[p].port->socket(),
                                              RING_F_SP_ENQ | RING_F_SC_DEQ);
        if (!ps.rings[s * n + d])
          throw DataplaneError(std::string("rte_ring_create ") + name + ": " + rte_strerror(rte_errno));
      }
  }
  // One MR key stream per port: its engines replicate the MR table (same keys everywhere).
  std::vector<uint64_t> key_seeds(ports_.size());
  for (auto& k : key_seeds) k = cfg_.engine.key_seed ? cfg_.engine.key_seed : verbs::random_seed();
  for (auto& cp : cores_) {
    CoreLoop& c = *cp;
    for (auto& s : c.slots_) {
      const PortSpec& spec = cfg_.ports[s.port];
      PortState& ps = ports_[s.port];
      s.qio = std::make_unique<dpdk::DpdkQueueIo>(*spec.port, s.queue);
      transport::EngineConfig ec = cfg_.engine;
      ec.mac = spec.port->mac();
      ec.gid = ps.gids.size() > 1 ? ps.gids.at(1) : ps.gids.at(0);
      for (size_t gi = 0; gi < ps.gids.size(); ++gi) {  // IPv6 sources by destination scope
        const wire::Gid& g = ps.gids.at(gi);
        if (wire::gid_is_ipv4_mapped(g)) continue;
        const bool ll = g[0] == 0xFE && (g[1] & 0xC0) == 0x80;
        wire::Gid& slot = ll ? ec.gid6_link_local : ec.gid6_global;
        if (slot == wire::Gid{}) slot = g;
      }
      ec.ecn = spec.ecn;
      ec.cnp = spec.cnp;
      if (spec.dcqcn) apply_cc(PortCc{spec.ecn, spec.cnp, *spec.dcqcn}, ec);
      ps.cc = cc_of(ec);
      if (spec.dcqcn) ps.cc.dcqcn = *spec.dcqcn;  // exactly as given (cc_of rounds)
      ec.key_seed = key_seeds[s.port];
      ec.qpn_stride = static_cast<uint32_t>(ps.cores.size());
      ec.qpn_offset = s.index;
      ec.mr_mem_bytes = verbs::MrTable::bytes_for(ec.max_mrs);
      s.mr_mem = rte_zmalloc_socket("droce_mr_table", ec.mr_mem_bytes, 64, spec.port->socket());
      if (!s.mr_mem) throw DataplaneError("dataplane: no hugepage memory for the MR table");
      ec.mr_mem = s.mr_mem;
      s.demux = std::make_unique<DemuxIo>(*this, c, s.port, s.index, *s.qio, spec.faults,
                                          &(*ps.counters)[c.index()], c.cc_);
      ps.demux[s.index] = s.demux.get();
      s.eng = std::make_unique<transport::Engine>(ec, *s.demux, clock_);
      ps.engines[s.index] = s.eng.get();
      s.tctr = std::make_unique<stats::CounterBlock<transport::Ctr>>();
    }
  }
  if (cfg_.registry) {
    for (auto& cp : cores_)
      for (auto& s : cp->slots_)
        reg_ids_.push_back(cfg_.registry->add(transport_group(),
                                              cfg_.ports[s.port].name + "/lcore" + std::to_string(cp->lcore()),
                                              *s.tctr));
    for (size_t p = 0; p < ports_.size(); ++p)
      if (ports_[p].own_counters)
        reg_ids_.push_back(cfg_.registry->add(stats::PortCounter_group, cfg_.ports[p].name, *ports_[p].own_counters));
    if (own_core_ctr_)
      for (size_t i = 0; i < cores_.size(); ++i)
        reg_ids_.push_back(
            cfg_.registry->add(stats::CoreCounter_group, std::to_string(cores_[i]->lcore()), (*own_core_ctr_)[i]));
  }
  // Announce ourselves (gratuitous ARP) from each port's home core.
  for (size_t p = 0; p < ports_.size(); ++p) {
    DemuxIo& d = *ports_[p].demux[0];
    for (size_t i = 0; i < cfg_.ports[p].host.ipv4.size(); ++i) {
      io::PktBuf* b = nullptr;
      if (d.queue().alloc_burst(&b, 1) != 1) break;
      b->len = ports_[p].stack->gratuitous_arp(i, {b->data, b->cap});
      if (b->len == 0 || d.queue().tx_burst(&b, 1) != 1) d.queue().free_burst(&b, 1);
    }
  }
}

Dataplane::~Dataplane() {
  stop();
  if (cfg_.registry)
    for (auto id : reg_ids_) cfg_.registry->remove(id);
  cores_.clear();
  // MRs never deregistered: segments still in a ring of a port (a net_ring peer
  // not polled any more) keep their ExtMem, leaked rather than freed under them.
  for (auto& r : mrs_)
    for (dpdk::ExtMem* x : r.ext)
      if (!dpdk::DpdkQueueIo::ext_release(x, 200))
        spdlog::warn("dataplane: MR {:#x}: {} zero-copy segments still queued at exit", r.info.key,
                     dpdk::DpdkQueueIo::ext_inflight(x));
  for (auto& ps : ports_)
    for (rte_ring* r : ps.rings) {
      if (!r) continue;
      void* obj;
      while (rte_ring_dequeue(r, &obj) == 0) {
        io::PktBuf* b = static_cast<io::PktBuf*>(obj);
        rte_pktmbuf_free(dpdk::DpdkQueueIo::mbuf_of(b));
      }
      rte_ring_free(r);
    }
  for (auto& d : dma_) rte_free(d.p);
}

int Dataplane::launch(void* arg) {
  auto* c = static_cast<CoreLoop*>(arg);
  c->driver_.store(std::this_thread::get_id(), std::memory_order_release);
  c->dp_.loop(*c, c->dp_.stop_);
  return 0;
}

void Dataplane::loop(CoreLoop& c, const std::atomic<bool>& stop) noexcept {
  spdlog::debug("dataplane: core {} running on lcore {}", c.index(), rte_lcore_id());
  const uint32_t yield_after = cfg_.cores[c.index()].idle_yield_polls;
  uint32_t idle = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    if (c.poll_once() != 0) {
      idle = 0;
    } else if (yield_after != 0 && ++idle >= yield_after) {
      idle = 0;
      c.cc_->add(stats::CoreCounter::idle_yields);
      sched_yield();
    }
  }
}

void Dataplane::start() {
  if (running_) return;
  if (threads_running()) throw DataplaneError("dataplane: start: loops run on threads of start_threads already");
  stop_.store(false);
  const unsigned self = rte_lcore_id();
  running_ = true;
  for (auto& cp : cores_) cp->driven_.store(true, std::memory_order_release);
  for (auto& cp : cores_) {
    CoreLoop* c = cp.get();
    if (c->lcore() == self) {
      threads_.emplace_back([this, c] {
        c->driver_.store(std::this_thread::get_id(), std::memory_order_release);
        if (rte_thread_register() != 0)
          spdlog::warn("dataplane: rte_thread_register failed ({}): no mempool cache on this core",
                       rte_strerror(rte_errno));
        loop(*c, stop_);
        rte_thread_unregister();
      });
      continue;
    }
    if (!rte_lcore_is_enabled(c->lcore())) {
      stop();
      throw DataplaneError("dataplane: lcore " + std::to_string(c->lcore()) +
                           " is not enabled in EAL (add it to eal.lcores)");
    }
    const int rc = rte_eal_remote_launch(&Dataplane::launch, c, c->lcore());
    if (rc != 0) {
      stop();
      throw DataplaneError("dataplane: rte_eal_remote_launch on lcore " + std::to_string(c->lcore()) + ": " +
                           rte_strerror(-rc));
    }
    launched_.push_back(c->lcore());
  }
}

void Dataplane::start_threads(const std::vector<size_t>& cores) {
  if (running_ || threads_running()) throw DataplaneError("dataplane: start_threads: loops run already");
  for (size_t i : cores)
    if (i >= cores_.size()) throw DataplaneError("dataplane: start_threads: no core " + std::to_string(i));
  thr_stop_.store(false);
  for (size_t i : cores) {
    CoreLoop* c = cores_[i].get();
    if (c->driven()) continue;  // listed twice
    // Driven before the thread exists: from here on run_on queues for it.
    c->driven_.store(true, std::memory_order_release);
    thr_.emplace_back(i, std::thread([this, c] {
      c->driver_.store(std::this_thread::get_id(), std::memory_order_release);
      const bool reg = rte_thread_register() == 0;
      if (!reg)
        spdlog::warn("dataplane: rte_thread_register failed ({}): no mempool cache on core {}",
                     rte_strerror(rte_errno), c->index());
      loop(*c, thr_stop_);
      if (reg) rte_thread_unregister();
    }));
  }
}

void Dataplane::stop_threads() noexcept {
  if (thr_.empty()) return;
  thr_stop_.store(true);
  for (auto& [i, t] : thr_) t.join();
  for (auto& [i, t] : thr_) {
    cores_[i]->driven_.store(false, std::memory_order_release);
    cores_[i]->driver_.store(std::thread::id{}, std::memory_order_release);
    cores_[i]->run_commands();  // anything queued after the loop stopped
  }
  thr_.clear();
}

void Dataplane::stop() noexcept {
  stop_threads();
  if (running_) {
    for (size_t i = 0; i < cores_.size(); ++i) run_on(i, [](CoreLoop& c) { c.flush_all_st(); });
    stop_.store(true);
    for (unsigned l : launched_) rte_eal_wait_lcore(l);
    for (auto& t : threads_) t.join();
    launched_.clear();
    threads_.clear();
    running_ = false;
    for (auto& c : cores_) {
      c->driven_.store(false, std::memory_order_release);
      c->driver_.store(std::thread::id{}, std::memory_order_release);
    }
    for (auto& c : cores_) c->run_commands();  // anything queued after the loops stopped
  } else {
    for (auto& c : cores_) c->flush_all_st();
  }
}

uint32_t Dataplane::poll_all() noexcept {
  uint32_t w = 0;
  for (auto& c : cores_)
    if (!c->driven()) w += c->poll_once();
  return w;
}

size_t Dataplane::pick_core(uint32_t p) {
  std::lock_guard lk(ctl_mu_);
  PortState& ps = ports_.at(p);
  return ps.cores[ps.rr++ % ps.cores.size()];
}

void apply_cc(const PortCc& cc, transport::EngineConfig& ec) noexcept {
  const config::DcqcnConfig& d = cc.dcqcn;
  ec.ecn = cc.ecn;
  ec.cnp = cc.cnp;
  ec.dcqcn = d.enabled;
  ec.cnp_interval_ns = uint64_t{d.min_time_between_cnps_us} * 1000;
  ec.cnp_dscp = static_cast<uint8_t>(d.cnp_dscp);
  ec.cnp_prio = static_cast<uint8_t>(d.cnp_prio);
  transport::dcqcn::Params& p = ec.dcqcn_params;
  p.line_rate_kbps = d.line_rate_mbps * 1000;
  p.min_rate_kbps = d.min_rate_mbps * 1000;
  p.ai_rate_kbps = d.ai_rate_mbps * 1000;
  p.hai_rate_kbps = d.hai_rate_mbps * 1000;
  p.alpha_g = d.alpha_g;
  p.initial_alpha = d.initial_alpha;
  p.alpha_update_period_ns = uint64_t{d.alpha_update_period_us} * 1000;
  p.rate_reduce_monitor_period_ns = uint64_t{d.rate_reduce_monitor_period_us} * 1000;
  p.time_reset_ns = uint64_t{d.time_reset_us} * 1000;
  p.byte_reset = uint64_t{d.byte_reset} * 64;
  p.threshold = d.threshold;
  p.min_dec_fac_pct = d.min_dec_fac_pct;
  p.clamp_tgt_rate = d.clamp_tgt_rate != 0;
  p.stall_hold_ns = uint64_t{d.stall_hold_us} * 1000;
  p.validate_rate = d.validate_rate != 0;
  p.window_ns = uint64_t{d.window_us} * 1000;
}

PortCc cc_of(const transport::EngineConfig& ec) noexcept {
  PortCc cc;
  config::DcqcnConfig& d = cc.dcqcn;
  const transport::dcqcn::Params& p = ec.dcqcn_params;
  auto u32 = [](uint64_t v) { return static_cast<uint32_t>(std::min<uint64_t>(v, UINT32_MAX)); };
  cc.ecn = ec.ecn;
  cc.cnp = ec.cnp;
  d.enabled = ec.dcqcn;
  d.min_time_between_cnps_us = u32(ec.cnp_interval_ns / 1000);
  d.cnp_dscp = ec.cnp_dscp;
  d.cnp_prio = ec.cnp_prio;
  d.line_rate_mbps = p.line_rate_kbps / 1000;
  d.min_rate_mbps = p.min_rate_kbps / 1000;
  d.ai_rate_mbps = p.ai_rate_kbps / 1000;
  d.hai_rate_mbps = p.hai_rate_kbps / 1000;
  d.alpha_g = p.alpha_g;
  d.initial_alpha = p.initial_alpha;
  d.alpha_update_period_us = u32(p.alpha_update_period_ns / 1000);
  d.rate_reduce_monitor_period_us = u32(p.rate_reduce_monitor_period_ns / 1000);
  d.time_reset_us = u32(p.time_reset_ns / 1000);
  d.byte_reset = u32(p.byte_reset / 64);
  d.threshold = p.threshold;
  d.min_dec_fac_pct = p.min_dec_fac_pct;
  d.clamp_tgt_rate = p.clamp_tgt_rate ? 1 : 0;
  d.stall_hold_us = u32(p.stall_hold_ns / 1000);
  d.validate_rate = p.validate_rate ? 1 : 0;
  d.window_us = u32(p.window_ns / 1000);
  return cc;
}

uint64_t Dataplane::engine_counter(uint32_t p, transport::Ctr c) const {
  uint64_t sum = 0;
  for (const auto& core : cores_)
    for (const auto& s : core->slots_)
      if (s.port == p && s.tctr) sum += s.tctr->get(c);
  return sum;
}

PortCc Dataplane::cc(uint32_t p) const {
  if (p >= ports_.size()) throw DataplaneError("dataplane: no port " + std::to_string(p));
  std::lock_guard lk(ctl_mu_);
  return ports_[p].cc;
}

void Dataplane::set_cc(uint32_t p, const PortCc& cc) {
  if (p >= ports_.size()) throw DataplaneError("dataplane: no port " + std::to_string(p));
  std::lock_guard lk(ctl_mu_);
  for (size_t ci : ports_[p].cores) {
    // By value: the core may still run it after a timeout.
    if (!run_on(ci, [p, cc](CoreLoop& c) {
          if (transport::Engine* e = c.engine(p)) {
            transport::EngineConfig ec = e->config();
            apply_cc(cc, ec);  // the engine's other reaction-point parameters stay
            e->set_cc(ec);
          }
        }))
      throw DataplaneError("dataplane: core " + std::to_string(ci) + " did not answer (set_cc)");
  }
  ports_[p].cc = cc;
}

bool Dataplane::run_on(size_t core, std::function<void(CoreLoop&)> fn, Ms timeout) {
  CoreLoop& c = *cores_.at(core);
  if (c.on_own_thread()) {  // not driven by a thread (embedded), or called from the core's own
    fn(c);
    return true;
  }
  auto cmd = std::make_shared<Cmd>();
  cmd->fn = std::move(fn);
  auto* sp = new std::shared_ptr<Cmd>(cmd);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (rte_ring_mp_enqueue(c.cmd_, sp) != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      delete sp;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (uint32_t spin = 0; !cmd->done.load(std::memory_order_acquire); ++spin) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

uint64_t Dataplane::add_poller(size_t core, CoreLoop::Poller p) {
  auto id = std::make_shared<uint64_t>(0);
  if (!run_on(core, [id, p = std::move(p)](CoreLoop& c) mutable { *id = c.add_poller_st(std::move(p)); }))
    throw DataplaneError("dataplane: core " + std::to_string(core) + " did not answer (add_poller)");
  return *id;
}

bool Dataplane::remove_poller(size_t core, uint64_t id) {
  auto ok = std::make_shared<bool>(false);
  if (!run_on(core, [id, ok](CoreLoop& c) { *ok = c.remove_poller_st(id); })) return false;
  return *ok;
}

int Dataplane::reg_mr_iova(uint32_t p, uint32_t pd, void* addr, uint64_t iova_va, uint64_t len, uint32_t access,
                           uint32_t* key) {
  if (p >= ports_.size() || !key || !addr || len == 0 || pd == 0) return EINVAL;
  std::lock_guard lk(ctl_mu_);
  const auto& cores = ports_[p].cores;
  std::vector<uint32_t> keys;
  int err = 0;
  for (size_t ci : cores) {
    auto res = std::make_shared<std::pair<int, uint32_t>>(ETIMEDOUT, 0);
    run_on(ci, [p, pd, addr, iova_va, len, access, res](CoreLoop& c) {
      res->first = c.engine(p)->mrs().reg_iova(verbs::Pd{pd}, addr, iova_va, len, access, &res->second);
    });
    if (res->first != 0) {
      err = res->first;
      break;
    }
    keys.push_back(res->second);
    if (keys.back() != keys.front()) {
      err = EIO;  // replicated tables diverged: cannot happen unless used outside the facade
      break;
    }
  }
  if (err != 0) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t k = keys[i];
      run_on(cores[i], [p, k](CoreLoop& c) { c.engine(p)->dereg_mr(k); });
    }
    return err;
  }
  MrRec r;
  // Zero-copy TX from this MR: one ExtMem per core (each core attaches its own).
  if (cfg_.engine.zero_copy_min != 0 && cfg_.ports[p].port->multi_seg_tx()) {
    const uint32_t k = keys.front();
    for (size_t ci : cores) {
      dpdk::ExtMem* x = dpdk::DpdkQueueIo::ext_create(addr, len);
      if (!x) break;
      r.ext.push_back(x);
      run_on(ci, [p, k, x](CoreLoop& c) { c.engine(p)->mrs().set_dma(k, x); });
    }
    if (r.ext.size() != cores.size()) {  // not DPDK memory or IOVA not contiguous: copy
      for (size_t i = 0; i < r.ext.size(); ++i) {
        run_on(cores[i], [p, k](CoreLoop& c) { c.engine(p)->mrs().set_dma(k, nullptr); });
        dpdk::DpdkQueueIo::ext_release(r.ext[i], 1000);
      }
      r.ext.clear();
    }
  }
  r.info.zero_copy = !r.ext.empty();
  r.info.port = p;
  r.info.key = keys.front();
  r.info.pd = pd;
  r.info.access = access;
  r.info.addr = reinterpret_cast<uint64_t>(addr);
  r.info.length = len;
  if (rte_mem_virt2memseg(addr, nullptr) != nullptr) {
    r.info.hugepage = true;
    const rte_iova_t iova = rte_mem_virt2iova(addr);
    r.info.dma_iova = iova == RTE_BAD_IOVA ? 0 : iova;
  }
  mrs_.push_back(r);
  *key = keys.front();
  return 0;
}

int Dataplane::dereg_mr(uint32_t p, uint32_t key) {
  if (p >= ports_.size()) return EINVAL;
  std::lock_guard lk(ctl_mu_);
  int err = 0;
  // Windows are bound per core (by a QP's work request): refuse while any core
  // has one bound to it, then deregister everywhere, forcing (a bind that raced
  // in between is ended), so the replicated tables never diverge.
  for (size_t ci : ports_[p].cores) {
    auto busy = std::make_shared<bool>(false);
    run_on(ci, [p, key, busy](CoreLoop& c) {
      const verbs::MrEntry* e = c.engine(p)->mrs().entry(key);
      *busy = e && e->mw_bound != 0;
    });
    if (*busy) return EBUSY;
  }
  for (size_t ci : ports_[p].cores) {
    auto rc = std::make_shared<int>(ETIMEDOUT);
    run_on(ci, [p, key, rc](CoreLoop& c) { *rc = c.engine(p)->dereg_mr_force(key); });
    if (*rc != 0) err = *rc;
  }
  // The cores attach no new segments of it now; wait until the device is done with the old ones.
  for (auto& r : mrs_) {
    if (r.info.port != p || r.info.key != key) continue;
    for (dpdk::ExtMem* x : r.ext)
      if (!dpdk::DpdkQueueIo::ext_release(x, 2000)) {
        spdlog::error("dataplane: MR {:#x}: the device still holds {} zero-copy segments after 2 s; its memory "
                      "must not be reused",
                      key, dpdk::DpdkQueueIo::ext_inflight(x));
        err = EBUSY;
      }
    r.ext.clear();
  }
  std::erase_if(mrs_, [&](const MrRec& r) { return r.info.port == p && r.info.key == key; });
  return err;
}

int Dataplane::alloc_mw(uint32_t p, uint32_t pd, uint32_t type, uint32_t* key) {
  if (p >= ports_.size() || !key || pd == 0) return EINVAL;
  if (type != static_cast<uint32_t>(verbs::MwType::Type1) && type != static_cast<uint32_t>(verbs::MwType::Type2))
    return EINVAL;
  std::lock_guard lk(ctl_mu_);
  const auto& cores = ports_[p].cores;
  std::vector<uint32_t> keys;
  int err = 0;
  for (size_t ci : cores) {
    auto res = std::make_shared<std::pair<int, uint32_t>>(ETIMEDOUT, 0);
    run_on(ci, [p, pd, type, res](CoreLoop& c) {
      res->first = c.engine(p)->alloc_mw(verbs::Pd{pd}, static_cast<verbs::MwType>(type), &res->second);
    });
    if (res->first != 0) {
      err = res->first;
      break;
    }
    keys.push_back(res->second);
    if (keys.back() != keys.front()) {
      err = EIO;  // replicated tables diverged
      break;
    }
  }
  if (err != 0) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint32_t k = keys[i];
      run_on(cores[i], [p, k](CoreLoop& c) { c.engine(p)->dealloc_mw(k); });
    }
    return err;
  }
  *key = keys.front();
  return 0;
}

int Dataplane::dealloc_mw(uint32_t p, uint32_t key) {
  if (p >= ports_.size()) return EINVAL;
  std::lock_guard lk(ctl_mu_);
  int err = 0;
  for (size_t ci : ports_[p].cores) {
    auto rc = std::make_shared<int>(ETIMEDOUT);
    run_on(ci, [p, key, rc](CoreLoop& c) { *rc = c.engine(p)->dealloc_mw_any_key(key); });
    if (*rc != 0) err = *rc;
  }
  return err;
}

void* Dataplane::alloc_dma(size_t len, uint64_t* iova_out) {
  void* p = rte_malloc("droce_mr", len, 4096);
  if (!p) return nullptr;
  const rte_iova_t iova = rte_malloc_virt2iova(p);
  std::lock_guard lk(ctl_mu_);
  dma_.push_back({p, len, iova == RTE_BAD_IOVA ? 0 : iova});
  if (iova_out) *iova_out = dma_.back().iova;
  return p;
}

void Dataplane::free_dma(void* p) noexcept {
  std::lock_guard lk(ctl_mu_);
  for (size_t i = 0; i < dma_.size(); ++i)
    if (dma_[i].p == p) {
      rte_free(p);
      dma_.erase(dma_.begin() + static_cast<long>(i));
      return;
    }
}

std::vector<MrInfo> Dataplane::mrs() {
  std::lock_guard lk(ctl_mu_);
  std::vector<MrInfo> out;
  for (const auto& r : mrs_) out.push_back(r.info);
  return out;
}

std::vector<QpInfo> Dataplane::qps() {
  std::vector<QpInfo> out;
  for (size_t i = 0; i < cores_.size(); ++i) {
    auto v = std::make_shared<std::vector<QpInfo>>();
    run_on(i, [v](CoreLoop& c) {
      for (auto& s : c.slots()) {
        const uint32_t max = s.eng->config().max_qps;
        for (uint32_t n = 0; n < max; ++n) {
          const transport::Qp* q = s.eng->qp(n);
          if (!q) continue;
          QpInfo qi;
          qi.port = s.port;
          qi.qpn = q->qpn;
          qi.core = c.index();
          qi.lcore = c.lcore();
          qi.type = q->type;
          qi.state = q->state;
          qi.dest_qpn = q->attr.dest_qp_num;
          qi.sq_psn = q->req.psn;
          qi.rq_psn = q->resp.psn;
          qi.mtu = q->mtu;
          qi.sq_outstanding = q->sq.count();
          qi.rq_posted = q->rq.count();
          qi.ctr = q->ctr;
          qi.rp_limited = q->rp.limited();
          qi.rate_kbps = q->rp.current_kbps();
          qi.target_kbps = q->rp.target_kbps();
          qi.alpha = q->rp.alpha();
          qi.rp = q->rp.counters();
          qi.sr_enabled = q->sr != nullptr;
          qi.sr_tx = q->req.sr_tx;
          v->push_back(qi);
        }
      }
    });
    out.insert(out.end(), v->begin(), v->end());
  }
  return out;
}

int Dataplane::attach_mcast(uint32_t p, uint32_t qpn, const wire::Gid& mgid) {
  if (p >= ports_.size()) return EINVAL;
  auto rc = std::make_shared<int>(ETIMEDOUT);
  const size_t core = owner_core(p, qpn);
  run_on(core, [p, qpn, mgid, rc](CoreLoop& c) {
    transport::Engine* e = c.engine(p);
    *rc = e ? e->attach_mcast(qpn, mgid) : EINVAL;
  });
  if (*rc == 0) mcast_sync(p);
  return *rc;
}

int Dataplane::detach_mcast(uint32_t p, uint32_t qpn, const wire::Gid& mgid) {
  if (p >= ports_.size()) return EINVAL;
  auto rc = std::make_shared<int>(ETIMEDOUT);
  run_on(owner_core(p, qpn), [p, qpn, mgid, rc](CoreLoop& c) {
    transport::Engine* e = c.engine(p);
    *rc = e ? e->detach_mcast(qpn, mgid) : EINVAL;
  });
  if (*rc == 0) mcast_sync(p);
  return *rc;
}

std::vector<wire::Gid> Dataplane::mcast_groups(uint32_t p) {
  std::vector<wire::Gid> out;
  if (p >= ports_.size()) return out;
  for (size_t core : ports_[p].cores) {
    auto v = std::make_shared<std::vector<wire::Gid>>();
    run_on(core, [p, v](CoreLoop& c) {
      if (transport::Engine* e = c.engine(p)) *v = e->mcast_groups();
    });
    for (const auto& g : *v)
      if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  }
  return out;
}

size_t Dataplane::mcast_sync(uint32_t p) {
  const std::vector<wire::Gid> groups = mcast_groups(p);
  std::vector<wire::MacAddr> macs;
  for (const auto& g : groups) {
    const wire::MacAddr m = wire::multicast_mac(g);
    if (std::find(macs.begin(), macs.end(), m) == macs.end()) macs.push_back(m);
  }
  std::sort(macs.begin(), macs.end());
  PortState& ps = ports_.at(p);
  if (macs != ps.mc_macs) {
    const char* how = cfg_.ports[p].port->set_mc_addrs(macs);
    spdlog::debug("port {}: {} multicast MAC(s) accepted ({})", cfg_.ports[p].name, macs.size(), how);
    ps.mc_macs = std::move(macs);
  }
  return groups.size();
}

std::vector<NeighInfo> Dataplane::neighbours() {
  std::vector<NeighInfo> out;
  for (uint32_t p = 0; p < ports_.size(); ++p) {
    auto v = std::make_shared<std::vector<NeighInfo>>();
    run_on(ports_[p].cores[0], [this, p, v](CoreLoop&) {
      for (const auto& e : ports_[p].stack->neighbours().entries())
        if (e.state != netstack::NeighState::Free) v->push_back({p, e});
    });
    out.insert(out.end(), v->begin(), v->end());
  }
  return out;
}

Dataplane::ResolveStep Dataplane::resolve_step_st(uint32_t p, const wire::Gid& ip, wire::MacAddr& mac) noexcept {
  if (p >= ports_.size()) return ResolveStep::Failed;
  DemuxIo& d = *ports_[p].demux[0];
  io::PktBuf* b = nullptr;
  if (d.queue().alloc_burst(&b, 1) != 1) return ResolveStep::Pending;  // no buffer now: ask again later
  uint32_t len = 0;
  const netstack::NetStack::Resolve r = ports_[p].stack->resolve(ip, clock_.now_ns(), mac, {b->data, b->cap}, len);
  if (len) {
    b->len = len;
    d.send_host(b);
  } else {
    d.queue().free_burst(&b, 1);
  }
  using R = netstack::NetStack::Resolve;
  // Failed: the cache holds the failure for a while, then asks again; the
  // caller keeps trying until its own deadline (links that come up late, lost frames).
  return r == R::Ready || r == R::ReadyProbe ? ResolveStep::Ready : ResolveStep::Pending;
}

Dataplane::ResolveStep Dataplane::resolve_step(uint32_t p, const wire::Gid& ip, wire::MacAddr& mac) {
  if (p >= ports_.size()) return ResolveStep::Failed;
  struct St {
    ResolveStep r = ResolveStep::Failed;
    wire::MacAddr mac{};
  };
  auto st = std::make_shared<St>();
  const bool ran = run_on(ports_[p].cores[0], [this, p, ip, st](CoreLoop&) { st->r = resolve_step_st(p, ip, st->mac); });
  if (!ran) return ResolveStep::Failed;
  if (st->r == ResolveStep::Ready) mac = st->mac;
  return st->r;
}

bool Dataplane::resolve(uint32_t p, const wire::Gid& ip, wire::MacAddr& mac, Ms timeout) {
  if (p >= ports_.size()) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_try = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::chrono::steady_clock::now() >= next_try) {
      next_try = std::chrono::steady_clock::now() + Ms(2);
      if (resolve_step(p, ip, mac) == ResolveStep::Ready) return true;
    }
    if (running_) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } else {
      poll_all();
    }
  }
  return false;
}

}  // namespace droce::engine

#include "shim/engine/engine_cm.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "netstack/gid_table.h"

namespace droce::shim {

uint64_t node_guid_of(const wire::MacAddr& m) noexcept { return netstack::node_guid_from_mac(m); }

struct EngineCmBackend::Port {
  uint32_t index = 0;
  size_t core = 0;
  void* mem = nullptr;
  uint32_t lkey = 0;
  // Touched on the home core only (or while the loops are stopped).
  std::unique_ptr<cm::Gsi> gsi;
  std::unique_ptr<cm::Agent> agent;
  Sink sink;
  uint64_t next_tick = 0;
  uint64_t tick_ns = 1'000'000;
  uint64_t poller = 0;
  uint32_t turns = 0;  // of the poller, for kCmClockTurns
  bool has_poller = false;
};

namespace {
// The CM poller reads the clock on one turn of the core loop in this many.
constexpr uint32_t kCmClockTurns = 16;
// The IB MTU (enum) the port's link carries: Ethernet MTU 1500 carries 1024.
uint8_t link_max_mtu(uint32_t eth_mtu) {
  return eth_mtu >= 4200 ? 5 : eth_mtu >= 2100 ? 4 : 3;
}

bool same_family(const wire::Gid& a, const wire::Gid& b) {
  return wire::gid_is_ipv4_mapped(a) == wire::gid_is_ipv4_mapped(b);
}
bool link_local(const wire::Gid& g) { return g[0] == 0xFE && (g[1] & 0xC0) == 0x80; }
int common_prefix(const wire::Gid& a, const wire::Gid& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const uint8_t x = a[i] ^ b[i];
    if (x == 0) {
      n += 8;
      continue;
    }
    return n + __builtin_clz(static_cast<unsigned>(x)) - 24;
  }
  return n;
}
}  // namespace

EngineCmBackend::EngineCmBackend(engine::Dataplane& dp, const config::Config& cfg, EngineCmConfig cm) : dp_(dp) {
  try {
    open_ports(cfg, cm);
  } catch (...) {
    close_ports();
    throw;
  }
}

EngineCmBackend::~EngineCmBackend() { close_ports(); }

void EngineCmBackend::open_ports(const config::Config& cfg, const EngineCmConfig& cm) {
  engine::Dataplane& dp = dp_;
  for (uint32_t p = 0; p < dp.port_count(); ++p) {
    auto ps = std::make_unique<Port>();
    ps->index = p;
    ps->core = dp.home_core(p);
    ps->tick_ns = cm.tick_ns ? cm.tick_ns : 1'000'000;
    const size_t len = cm::Gsi::bytes_for(cm.recv_bufs, cm.send_bufs);
    ps->mem = dp.alloc_dma(len);
    if (!ps->mem) throw std::runtime_error("cm: no hugepage memory for the MAD buffers of port " + std::to_string(p));
    std::memset(ps->mem, 0, len);
    const uint32_t pd = dp.alloc_pd();
    if (int rc = dp.reg_mr(p, pd, ps->mem, len, verbs::kAccessLocalWrite, &ps->lkey)) {
      dp.free_dma(ps->mem);
      throw std::runtime_error("cm: cannot register the MAD buffers of port " + std::to_string(p) + ": " +
                               std::strerror(rc));
    }
    cm::GsiConfig gc;
    gc.pd = verbs::Pd{pd};
    gc.recv_bufs = cm.recv_bufs;
    gc.send_bufs = cm.send_bufs;
    gc.mem = {static_cast<uint8_t*>(ps->mem), len};
    gc.lkey = ps->lkey;
    cm::AgentConfig ac = cm.agent;
    ac.ca_guid = node_guid_of(dp.port(p).host.mac);
    ac.max_path_mtu = p < cfg.ports.size() ? link_max_mtu(cfg.ports[p].mtu) : 3;
    Port* raw = ps.get();
    ports_.push_back(std::move(ps));  // the destructor cleans up from here on
    auto rc = std::make_shared<int>(ETIMEDOUT);
    engine::Dataplane* d = &dp;
    const bool ran = dp.run_on(raw->core, [raw, d, gc, ac, rc](engine::CoreLoop& c) {
      transport::Engine* e = c.engine(raw->index);
      if (!e) {
        *rc = ENODEV;
        return;
      }
      const uint32_t port = raw->index;
      const netstack::GidTable* gids = &d->gids(port);
      raw->gsi = std::make_unique<cm::Gsi>(
          *e, gc,
          [d, port](const wire::Gid& ip, wire::MacAddr& mac) {
            return d->resolve_step_st(port, ip, mac) == engine::Dataplane::ResolveStep::Ready;
          },
          [gids](const wire::Gid& ip) { return gids->index_of(ip) >= 0; });
      *rc = raw->gsi->open();
      if (*rc) {
        raw->gsi.reset();
        return;
      }
      raw->agent = std::make_unique<cm::Agent>(ac, *raw->gsi, [raw](const cm::Event& ev) {
        if (raw->sink) raw->sink(raw->index, ev);
      });
      raw->gsi->attach(*raw->agent);
    });
    if (!ran || *rc)
      throw std::runtime_error("cm: cannot open QP1 on port " + std::to_string(p) + ": " +
                               std::strerror(ran ? *rc : ETIMEDOUT));
    const io::Clock* clock = &dp.clock();
    // On every turn of the home core's loop, beside the data path: QP1's CQs
    // are looked at (two indexes) and reaped only when they hold completions,
    // and the clock is read for the Agent's tick on one turn in kCmClockTurns
    // (the tick is 1 ms; a turn is well under a microsecond when busy).
    raw->poller = dp.add_poller(raw->core, [raw, clock]() -> uint32_t {
      const uint32_t work = raw->gsi->idle() ? 0 : raw->gsi->poll();
      if (++raw->turns % kCmClockTurns != 0) return work;
      const uint64_t now = clock->now_ns();
      if (now >= raw->next_tick) {
        raw->next_tick = now + raw->tick_ns;
        raw->agent->tick(now);
      }
      return work;
    });
    raw->has_poller = true;
  }
}

void EngineCmBackend::close_ports() noexcept {
  for (auto& ps : ports_) {
    if (!ps) continue;
    if (ps->has_poller) dp_.remove_poller(ps->core, ps->poller);
    Port* raw = ps.get();
    // The Agent first (its destroy sends REJ/DREQ through the Gsi), then QP1.
    const bool ran = dp_.run_on(raw->core, [raw](engine::CoreLoop&) {
      raw->agent.reset();
      raw->gsi.reset();
    });
    if (!ran) {
      // The core did not answer: it may still run the function later, so the
      // Port and its memory stay (leaked) rather than freed under it.
      (void)ps.release();
      continue;
    }
    if (ps->lkey) dp_.dereg_mr(ps->index, ps->lkey);
    if (ps->mem) dp_.free_dma(ps->mem);
    ps.reset();
  }
  ports_.clear();
}

uint32_t EngineCmBackend::port_lkey(uint32_t dev) const noexcept { return ports_[dev]->lkey; }

template <typename F>
int EngineCmBackend::on_agent(uint32_t dev, F fn) {
  if (dev >= ports_.size() || !ports_[dev]) return -ENODEV;
  Port* raw = ports_[dev].get();
  auto rc = std::make_shared<int>(-ETIMEDOUT);
  if (!dp_.run_on(raw->core, [raw, rc, fn](engine::CoreLoop&) mutable { *rc = raw->agent ? fn(*raw->agent) : -ENODEV; }))
    return -ETIMEDOUT;
  return *rc;
}

void EngineCmBackend::cm_set_sink(Sink sink) {
  for (auto& ps : ports_) {
    Port* raw = ps.get();
    dp_.run_on(raw->core, [raw, sink](engine::CoreLoop&) { raw->sink = sink; });
  }
}

int EngineCmBackend::cm_local_dev(const wire::Gid& ip, uint32_t* dev) {
  for (uint32_t p = 0; p < dp_.port_count(); ++p)
    if (dp_.gids(p).index_of(ip) >= 0) {
      if (dev) *dev = p;
      return 0;
    }
  return -EADDRNOTAVAIL;
}

// No routing table: the port with an address of dst's family (IPv6: link-local
// for a link-local dst, else a global one) sharing the longest prefix with dst
// (ties: the lower port).
int EngineCmBackend::cm_route(const wire::Gid& dst, uint32_t* dev, wire::Gid* src) {
  int best = -1;
  uint32_t best_dev = 0;
  wire::Gid best_src{};
  const bool dst_ll = link_local(dst);
  for (uint32_t p = 0; p < dp_.port_count(); ++p) {
    for (const wire::Gid& g : dp_.gids(p).all()) {
      if (!same_family(g, dst)) continue;
      if (!wire::gid_is_ipv4_mapped(g) && link_local(g) != dst_ll) continue;
      // dst one of our own addresses: the port that has it, from that
      // address (the dataplane loops the frames back: lib/engine/README.md).
      const int n = g == dst ? 1000 : 1 + common_prefix(g, dst);
      if (n > best) {
        best = n;
        best_dev = p;
        best_src = g;
      }
    }
  }
  if (best < 0) return -ENETUNREACH;
  if (dev) *dev = best_dev;
  if (src) *src = best_src;
  return 0;
}

int EngineCmBackend::cm_resolve(uint32_t dev, const wire::Gid& dst) {
  if (dev >= dp_.port_count()) return -ENODEV;
  wire::MacAddr mac{};
  switch (dp_.resolve_step(dev, dst, mac)) {
    case engine::Dataplane::ResolveStep::Ready: return 0;
    case engine::Dataplane::ResolveStep::Pending: return -EINPROGRESS;
    default: return -EHOSTUNREACH;
  }
}

int EngineCmBackend::cm_gid_index(uint32_t dev, const wire::Gid& ip) {
  if (dev >= dp_.port_count()) return -ENODEV;
  const int i = dp_.gids(dev).index_of(ip);
  return i < 0 ? -ENOENT : i;
}

int EngineCmBackend::cm_listen(uint32_t dev, cm::PortSpace ps, const cm::Endpoint& bound, cm::QpKind kind,
                               uint64_t user, cm::ConnId* out) {
  auto id = std::make_shared<cm::ConnId>(0);
  const int rc = on_agent(dev, [=](cm::Agent& a) { return -a.listen(ps, bound, kind, user, id.get()); });
  if (rc == 0 && out) *out = *id;
  return rc;
}

int EngineCmBackend::cm_connect(uint32_t dev, const cm::ConnectArgs& args, uint64_t user, cm::ConnId* out) {
  auto id = std::make_shared<cm::ConnId>(0);
  const int rc = on_agent(dev, [=](cm::Agent& a) { return -a.connect(args, user, id.get()); });
  if (rc == 0 && out) *out = *id;
  return rc;
}

int EngineCmBackend::cm_accept(uint32_t dev, cm::ConnId id, const cm::ConnParam& p) {
  return on_agent(dev, [=](cm::Agent& a) { return -a.accept(id, p); });
}

int EngineCmBackend::cm_reject(uint32_t dev, cm::ConnId id, std::span<const uint8_t> private_data) {
  std::vector<uint8_t> pd(private_data.begin(), private_data.end());  // the call may outlive the caller's span
  return on_agent(dev, [id, pd = std::move(pd)](cm::Agent& a) { return -a.reject(id, pd); });
}

int EngineCmBackend::cm_establish(uint32_t dev, cm::ConnId id) {
  return on_agent(dev, [=](cm::Agent& a) { return -a.establish(id); });
}

int EngineCmBackend::cm_disconnect(uint32_t dev, cm::ConnId id) {
  return on_agent(dev, [=](cm::Agent& a) { return -a.disconnect(id); });
}

void EngineCmBackend::cm_destroy(uint32_t dev, cm::ConnId id) {
  on_agent(dev, [=](cm::Agent& a) {
    a.destroy(id);
    return 0;
  });
}

int EngineCmBackend::cm_qp_params(uint32_t dev, cm::ConnId id, cm::QpParams* out) {
  auto q = std::make_shared<cm::QpParams>();
  const int rc = on_agent(dev, [=](cm::Agent& a) { return -a.qp_params(id, *q); });
  if (rc == 0 && out) *out = *q;
  return rc;
}

int EngineCmBackend::cm_set_user(uint32_t dev, cm::ConnId id, uint64_t user) {
  return on_agent(dev, [=](cm::Agent& a) { return -a.set_user(id, user); });
}

int EngineCmBackend::connections(uint32_t dev, std::vector<cm::ConnInfo>& out) {
  auto v = std::make_shared<std::vector<cm::ConnInfo>>();
  const int rc = on_agent(dev, [=](cm::Agent& a) {
    *v = a.connections();
    return 0;
  });
  if (rc == 0) out = *v;
  return rc;
}

int EngineCmBackend::counters(uint32_t dev, std::vector<std::pair<std::string, uint64_t>>& out) {
  if (dev >= ports_.size()) return -ENODEV;
  auto v = std::make_shared<std::vector<std::pair<std::string, uint64_t>>>();
  Port* raw = ports_[dev].get();
  const int rc = on_agent(dev, [=](cm::Agent& a) {
    for (size_t i = 0; i < static_cast<size_t>(cm::CmCtr::kCount); ++i)
      v->emplace_back(cm::ctr_name(static_cast<cm::CmCtr>(i)), a.counter(static_cast<cm::CmCtr>(i)));
    raw->gsi->for_each_counter([&](const char* name, uint64_t val) { v->emplace_back(std::string("gsi_") + name, val); });
    return 0;
  });
  if (rc == 0) out = *v;
  return rc;
}

}  // namespace droce::shim

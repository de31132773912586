#include "engine/embed.h"

#include <rte_lcore.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "netstack/gid_table.h"

namespace droce::engine {

Embedded::Embedded(const EmbedOptions& o) {
  if (o.device.empty() && !o.port) throw std::runtime_error("embedded droce: no device given");
  if (o.queues == 0 || o.queues > 16) throw std::runtime_error("embedded droce: queues must be 1..16");
  if (o.init_eal) eal_ = std::make_unique<dpdk::Eal>(dpdk::EalOptions{.args = o.eal_args, .program = "droce-embed"});
  if (o.port) {
    port_ = o.port;
  } else {
    dpdk::PortConfig pc;
    pc.device = o.device;
    pc.rx_queues = pc.tx_queues = o.queues;
    pc.rx_desc = pc.tx_desc = 1024;
    pc.mbufs = o.mbufs ? o.mbufs : 8191u * o.queues;
    pc.mbuf_cache = 256;
    pc.mtu = o.mtu;
    pc.data_room = o.data_room;
    pc.mac = o.mac;
    own_port_ = std::make_unique<dpdk::Port>(pc);
    port_ = own_port_.get();
  }
  // memif and real NICs bring the link up asynchronously; ARP before that is lost.
  port_->wait_link_up(o.link_wait_ms);

  netstack::HostConfig hc;
  hc.mac = port_->mac();
  hc.neigh.retry_ns = 200'000'000;        // an application waiting on resolve(): ask again soon
  hc.neigh.failed_hold_ns = 500'000'000;
  for (const auto& s : o.ipv4) {
    auto g = netstack::parse_ip(s);
    if (!g || !wire::gid_is_ipv4_mapped(*g)) throw std::runtime_error("embedded droce: not an IPv4 address: " + s);
    hc.ipv4.push_back(wire::gid_to_ipv4(*g));
  }
  for (const auto& s : o.ipv6) {
    auto g = netstack::parse_ip(s);
    if (!g || wire::gid_is_ipv4_mapped(*g)) throw std::runtime_error("embedded droce: not an IPv6 address: " + s);
    hc.ipv6.push_back(*g);
  }
  std::vector<config::PortConfig> fcfg(1);
  faults_ = std::make_unique<config::FaultTable>(fcfg);

  DataplaneConfig dc;
  PortSpec ps;
  ps.name = port_->name();
  ps.port = port_;
  ps.host = hc;
  ps.faults = &(*faults_)[0];
  ps.dscp = o.dscp;
  ps.ecn = o.ecn;
  ps.cnp = o.cnp;
  ps.dcqcn = o.dcqcn;
  dc.ports.push_back(std::move(ps));
  for (uint16_t q = 0; q < o.queues; ++q) {
    CoreSpec cs;
    cs.lcore = rte_lcore_id() == LCORE_ID_ANY ? 0 : rte_lcore_id();
    cs.queues.push_back({0, q});
    dc.cores.push_back(cs);
  }
  dc.engine = o.engine;
  dc.registry = o.registry;
  dp_ = std::make_unique<Dataplane>(std::move(dc));
}


Embedded::~Embedded() {
  agent_.reset();  // REJ / DREQ for what is left, through QP1
  gsi_.reset();
  if (cm_lkey_) dp_->dereg_mr(0, cm_lkey_);
  if (cm_mem_) dp_->free_dma(cm_mem_);
  dp_.reset();
  own_port_.reset();
  eal_.reset();
}

cm::Agent& Embedded::cm() {
  if (agent_) return *agent_;
  constexpr uint32_t kBufs = 64;
  const size_t len = cm::Gsi::bytes_for(kBufs, kBufs);
  if (!cm_mem_) {
    cm_mem_ = dp_->alloc_dma(len);
    if (!cm_mem_) throw std::runtime_error("embedded droce: no hugepage memory for the CM's MAD buffers");
    std::memset(cm_mem_, 0, len);
  }
  const uint32_t pd = dp_->alloc_pd();
  if (!cm_lkey_) {
    if (int rc = dp_->reg_mr(0, pd, cm_mem_, len, verbs::kAccessLocalWrite, &cm_lkey_))
      throw std::runtime_error(std::string("embedded droce: cannot register the CM's MAD buffers: ") + std::strerror(rc));
  }
  cm::GsiConfig gc;
  gc.pd = verbs::Pd{pd};
  gc.recv_bufs = gc.send_bufs = kBufs;
  gc.mem = {static_cast<uint8_t*>(cm_mem_), len};
  gc.lkey = cm_lkey_;
  transport::Engine* e = dp_->core(dp_->home_core(0)).engine(0);
  Dataplane* d = dp_.get();
  auto gsi = std::make_unique<cm::Gsi>(
      *e, gc,
      [d](const wire::Gid& ip, wire::MacAddr& mac) {
        return d->resolve_step_st(0, ip, mac) == Dataplane::ResolveStep::Ready;
      },
      [d](const wire::Gid& ip) { return d->gids(0).index_of(ip) >= 0; });
  if (int rc = gsi->open()) throw std::runtime_error(std::string("embedded droce: cannot open QP1: ") + std::strerror(rc));
  cm::AgentConfig ac;
  ac.ca_guid = netstack::node_guid_from_mac(port_->mac());
  ac.max_path_mtu = static_cast<uint8_t>(e->config().max_mtu);
  agent_ = std::make_unique<cm::Agent>(ac, *gsi, [this](const cm::Event& ev) {
    if (cm_sink_) cm_sink_(ev);
  });
  gsi->attach(*agent_);
  gsi_ = std::move(gsi);
  agent_->tick(dp_->clock().now_ns());
  return *agent_;
}

uint32_t Embedded::poll_cm() noexcept {
  uint32_t n = gsi_->poll();
  const uint64_t now = dp_->clock().now_ns();
  if (now >= cm_next_tick_) {
    cm_next_tick_ = now + 1'000'000;
    agent_->tick(now);
  }
  return n;
}

QpHandle Embedded::create_qp(uint32_t pd, const QpOptions& o) {
  QpHandle h;
  if (o.loop >= 0 && static_cast<size_t>(o.loop) >= loops())
    throw std::runtime_error("embedded droce: create_qp: no loop " + std::to_string(o.loop) + " (" +
                             std::to_string(loops()) + " loops)");
  if ((o.send_cq || o.recv_cq) && o.loop < 0)
    throw std::runtime_error("embedded droce: create_qp: shared CQs need the QP's loop (QpOptions::loop)");
  h.core = o.loop >= 0 ? dp_->port_cores(0)[static_cast<size_t>(o.loop)] : dp_->pick_core(0);
  h.pd = pd;
  h.opt = o;
  h.eng = dp_->core(h.core).engine(0);
  // On the loop's own thread when one drives it (start_loop_threads), else here.
  struct Out {
    QpHandle h;
    std::string err;
    bool done = false;
  };
  auto out = std::make_shared<Out>();
  out->h = h;
  const bool ran = dp_->run_on(h.core, [out](CoreLoop&) {
    QpHandle& q = out->h;
    const QpOptions& o = q.opt;
    q.scq = o.send_cq ? o.send_cq : q.eng->create_cq(o.cqe);
    q.rcq = o.recv_cq ? o.recv_cq : q.eng->create_cq(o.cqe);
    if (!q.scq || !q.rcq) {
      out->err = "embedded droce: create_cq failed";
      return;
    }
    verbs::QpInitAttr init;
    init.qp_type = o.type;
    init.pd = q.pd;
    init.send_cq = q.scq;
    init.recv_cq = q.rcq;
    init.cap = o.cap;
    if (int rc = q.eng->create_qp(init, &q.qpn)) {
      out->err = "embedded droce: create_qp: errno " + std::to_string(rc);
      return;
    }
    q.qp = q.eng->qp(q.qpn);
    verbs::QpAttr a;
    a.qp_state = verbs::QpState::Init;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qkey = o.qkey;
    a.qp_access_flags = verbs::kAccessAll;
    const uint32_t m = verbs::kQpState | verbs::kQpPkeyIndex | verbs::kQpPort |
                       (o.type == verbs::QpType::UD ? verbs::kQpQkey : verbs::kQpAccessFlags);
    if (int rc = q.eng->modify_qp(q.qpn, a, m)) {
      out->err = "embedded droce: modify_qp INIT: errno " + std::to_string(rc);
      return;
    }
    out->done = true;
  });
  if (!ran) throw std::runtime_error("embedded droce: create_qp: loop " + std::to_string(h.core) + " did not answer");
  if (!out->done) throw std::runtime_error(out->err);
  return out->h;
}

verbs::Cq* Embedded::create_cq(int loop, uint32_t cqe) {
  if (loop < 0 || static_cast<size_t>(loop) >= loops())
    throw std::runtime_error("embedded droce: create_cq: no loop " + std::to_string(loop) + " (" +
                             std::to_string(loops()) + " loops)");
  const size_t core = dp_->port_cores(0)[static_cast<size_t>(loop)];
  auto cq = std::make_shared<verbs::Cq*>(nullptr);  // outlives a run_on that timed out
  transport::Engine* eng = dp_->core(core).engine(0);
  if (!dp_->run_on(core, [cq, eng, cqe](CoreLoop&) { *cq = eng->create_cq(cqe); }))
    throw std::runtime_error("embedded droce: create_cq: loop " + std::to_string(loop) + " did not answer");
  if (!*cq) throw std::runtime_error("embedded droce: create_cq: " + std::to_string(cqe) + " entries refused");
  return *cq;
}

void Embedded::start_loop_threads() {
  std::vector<size_t> cs(dp_->port_cores(0).begin() + 1, dp_->port_cores(0).end());
  dp_->start_threads(cs);
}

void Embedded::stop_loop_threads() noexcept { dp_->stop_threads(); }

bool Embedded::resolve(const wire::Gid& ip, wire::MacAddr& mac, uint32_t timeout_ms) {
  return dp_->resolve(0, ip, mac, Dataplane::Ms(timeout_ms));
}

int Embedded::connect(QpHandle& qp, const QpPeer& peer) {
  using namespace verbs;
  QpAttr a;
  a.qp_state = QpState::Rtr;
  a.path_mtu = qp.opt.mtu;
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = qp.opt.max_dest_rd_atomic;
  a.min_rnr_timer = qp.opt.min_rnr_timer;
  a.ah_attr.dgid = peer.gid;
  a.ah_attr.dmac = peer.mac;
  a.ah_attr.traffic_class = dp_->tclass(0);
  if (qp.opt.type != QpType::UD && a.ah_attr.dmac == wire::MacAddr{}) {
    if (!resolve(peer.gid, a.ah_attr.dmac)) return EHOSTUNREACH;
  }
  uint32_t m = kQpState;
  if (qp.opt.type == QpType::RC)
    m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
  if (qp.opt.type == QpType::UC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
  QpAttr b = a;
  b.qp_state = QpState::Rts;
  b.sq_psn = qp.opt.psn;
  b.timeout = qp.opt.timeout;
  b.retry_cnt = qp.opt.retry_cnt;
  b.rnr_retry = qp.opt.rnr_retry;
  b.max_rd_atomic = qp.opt.max_rd_atomic;
  uint32_t m2 = kQpState | kQpSqPsn;
  if (qp.opt.type == QpType::RC) m2 |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
  // On the QP's loop (its own thread when one drives it).
  auto rc = std::make_shared<int>(ETIMEDOUT);
  dp_->run_on(qp.core, [rc, eng = qp.eng, qpn = qp.qpn, type = qp.opt.type, mtu = qp.opt.mtu, a, b, m, m2](CoreLoop&) {
    if ((*rc = eng->modify_qp(qpn, a, m)) != 0) return;
    if (type == QpType::UD) eng->qp(qpn)->mtu = mtu_bytes(mtu);
    *rc = eng->modify_qp(qpn, b, m2);
  });
  return *rc;
}

int Embedded::connect(QpHandle& qp, const cm::QpParams& p, const wire::MacAddr& mac) {
  if (p.path_mtu < 1 || p.path_mtu > 5) return EINVAL;
  qp.opt.mtu = static_cast<verbs::Mtu>(p.path_mtu);
  qp.opt.psn = p.sq_psn;
  qp.opt.timeout = p.timeout;
  qp.opt.retry_cnt = p.retry_cnt;
  qp.opt.rnr_retry = p.rnr_retry;
  qp.opt.min_rnr_timer = p.min_rnr_timer;
  qp.opt.max_rd_atomic = p.max_rd_atomic;
  qp.opt.max_dest_rd_atomic = p.max_dest_rd_atomic;
  return connect(qp, QpPeer{p.dest_qpn, p.rq_psn, p.dgid, mac});
}

int Embedded::destroy_qp(QpHandle& qp) {
  if (!qp.eng) return EINVAL;
  auto rc = std::make_shared<int>(ETIMEDOUT);
  dp_->run_on(qp.core, [rc, eng = qp.eng, qpn = qp.qpn](CoreLoop&) { *rc = eng->destroy_qp(qpn); });
  qp.eng = nullptr;
  qp.qp = nullptr;
  return *rc;
}

int split_eal_args(int argc, char** argv, std::vector<std::string>& eal) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      for (int j = i + 1; j < argc; ++j) eal.emplace_back(argv[j]);
      return i;
    }
  return argc;
}

EmbedOptions node_options(const std::string& device, const std::vector<std::string>& eal,
                          const std::vector<std::string>& ipv4, const std::string& mac, uint32_t path_mtu) {
  EmbedOptions e;
  e.device = device;
  e.eal_args = eal;
  e.ipv4 = ipv4;
  if (!mac.empty()) {
    auto m = dpdk::parse_mac(mac);
    if (!m) throw std::runtime_error("--mac: bad MAC " + mac);
    e.mac = *m;
  }
  if (path_mtu > 1024) e.data_room = 8192 + 128;  // IB MTU 2048/4096: frames up to ~4.2 KB
  return e;
}

void announce_node(Embedded& node, const std::string& device, uint32_t gid_index, const char* flag) {
  if (gid_index >= node.gids().size())
    throw std::runtime_error(std::string(flag) + " " + std::to_string(gid_index) + ": the GID table has " +
                             std::to_string(node.gids().size()) + " entries");
  std::printf(" device %s mac %s gid[%u] %s\n", device.c_str(), dpdk::mac_to_string(node.port().mac()).c_str(),
              gid_index, netstack::gid_to_string(node.gid(gid_index)).c_str());
}

}  // namespace droce::engine

#include "dpdk/port.h"

#include <dlfcn.h>
#include <rte_build_config.h>
#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_alarm.h>
#include <rte_interrupts.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "io/packet_io.h"

namespace droce::dpdk {
namespace {

static_assert(sizeof(io::PktBuf) <= kMbufPrivSize);
static_assert(kMbufPrivSize % RTE_MBUF_PRIV_ALIGN == 0);

[[noreturn]] void fail(const std::string& what, int rc) {
  throw PortError(what + ": " + rte_strerror(rc < 0 ? -rc : rc));
}

// Ethernet + VLAN + FCS room above the MTU.
constexpr uint32_t kL2Overhead = RTE_ETHER_HDR_LEN + 4 + RTE_ETHER_CRC_LEN;

}  // namespace

rte_mempool* make_pool(const std::string& name, uint32_t n, uint32_t cache, uint16_t data_room, int socket) {
  cache = std::min<uint32_t>({cache, RTE_MEMPOOL_CACHE_MAX_SIZE, n / 4});
  rte_mempool* mp = rte_pktmbuf_pool_create(name.c_str(), n, cache, kMbufPrivSize, data_room, socket);
  if (mp == nullptr)
    throw PortError("mbuf pool '" + name + "' (" + std::to_string(n) + " x " + std::to_string(data_room) +
                    " B on socket " + std::to_string(socket) + "): " + rte_strerror(rte_errno) +
                    " (are hugepages reserved? scripts/setup.sh)");
  // Each mbuf's io::PktBuf knows its mbuf for good: DPDK never touches the
  // private area after rte_pktmbuf_init, so the data path need not write it.
  rte_mempool_obj_iter(
      mp,
      [](rte_mempool*, void*, void* obj, unsigned) {
        auto* m = static_cast<rte_mbuf*>(obj);
        auto* b = new (rte_mbuf_to_priv(m)) io::PktBuf{};
        b->backend = m;
      },
      nullptr);
  return mp;
}

Port::Port(const PortConfig& cfg) {
  const std::string what = cfg.device.empty() ? "port " + std::to_string(cfg.port_id) : "device '" + cfg.device + "'";
  if (!cfg.device.empty()) {
    int rc = rte_dev_probe(cfg.device.c_str());
    if (rc < 0) fail("probing " + what, rc);
    probed_ = true;
    rte_dev_iterator it{};
    uint16_t pid = RTE_MAX_ETHPORTS;
    if (rte_eth_iterator_init(&it, cfg.device.c_str()) == 0) {
      pid = rte_eth_iterator_next(&it);
      if (pid != RTE_MAX_ETHPORTS) rte_eth_iterator_cleanup(&it);
    }
    if (pid == RTE_MAX_ETHPORTS) {
      // The device exists but is not an ethdev we can match: release it.
      rte_devargs da{};
      if (rte_devargs_parse(&da, cfg.device.c_str()) == 0) {
        if (da.bus != nullptr) rte_eal_hotplug_remove(rte_bus_name(da.bus), da.name);
        std::free(da.data);  // what rte_devargs_reset (experimental in 22.11) frees
      }
      throw PortError(what + " probed but no ethdev port matches it");
    }
    id_ = pid;
  } else {
    if (cfg.port_id < 0 || !rte_eth_dev_is_valid_port(static_cast<uint16_t>(cfg.port_id)))
      throw PortError(what + ": no such ethdev port");
    id_ = static_cast<uint16_t>(cfg.port_id);
  }
  open_ = true;
  try {
    char nm[RTE_ETH_NAME_MAX_LEN] = {};
    rte_eth_dev_get_name_by_port(id_, nm);
    name_ = nm;
    rte_eth_dev_info info{};
    int rc = rte_eth_dev_info_get(id_, &info);
    if (rc != 0) fail(name_ + ": rte_eth_dev_info_get", rc);
    driver_ = info.driver_name ? info.driver_name : "?";
    socket_ = rte_eth_dev_socket_id(id_);
    if (socket_ < 0) socket_ = static_cast<int>(rte_socket_id());
    if (socket_ < 0) socket_ = 0;

    if (cfg.rx_queues == 0 || cfg.tx_queues == 0) throw PortError(name_ + ": need at least one RX and one TX queue");
    if (cfg.rx_queues > info.max_rx_queues || cfg.tx_queues > info.max_tx_queues)
      throw PortError(name_ + " (" + driver_ + "): asked for " + std::to_string(cfg.rx_queues) + " RX / " +
                      std::to_string(cfg.tx_queues) + " TX queues, device has at most " +
                      std::to_string(info.max_rx_queues) + " / " + std::to_string(info.max_tx_queues) +
                      (driver_ == "net_af_packet" ? " (set qpairs= in the devargs)" : ""));
    nrx_ = cfg.rx_queues;
    ntx_ = cfg.tx_queues;

    rte_eth_conf conf{};
    // Zero-copy TX chains header and payload segments (DpdkQueueIo::append_external).
    conf.txmode.offloads = info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
    multi_seg_tx_ = conf.txmode.offloads != 0;
    if (nrx_ > 1) {
      const uint64_t hf = info.flow_type_rss_offloads & (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP);
      if (hf != 0) {
        conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_hf = hf;
      }
    }
    rc = rte_eth_dev_configure(id_, nrx_, ntx_, &conf);
    if (rc != 0) fail(name_ + ": rte_eth_dev_configure(" + std::to_string(nrx_) + ", " + std::to_string(ntx_) + ")", rc);

    uint16_t rxd = cfg.rx_desc, txd = cfg.tx_desc;
    rc = rte_eth_dev_adjust_nb_rx_tx_desc(id_, &rxd, &txd);
    if (rc != 0) fail(name_ + ": rte_eth_dev_adjust_nb_rx_tx_desc", rc);

    if (cfg.mtu != 0) {
      rc = rte_eth_dev_set_mtu(id_, cfg.mtu);
      if (rc != 0)
        fail(name_ + ": set MTU " + std::to_string(cfg.mtu) + " (device allows MTU " + std::to_string(info.min_mtu) +
                 ".." + std::to_string(info.max_mtu) + ", frames up to " + std::to_string(info.max_rx_pktlen) +
                 " B; for af_packet set the MTU with ip link and framesz= instead)",
             rc);
    }

    if (cfg.pool != nullptr) {
      if (rte_pktmbuf_priv_size(cfg.pool) < sizeof(io::PktBuf))
        throw PortError(name_ + ": shared pool has no room for io::PktBuf (use make_pool)");
      pool_ = cfg.pool;
    } else {
      uint32_t room = cfg.data_room;
      if (room == 0) {
        uint16_t mtu = cfg.mtu;
        if (mtu == 0 && rte_eth_dev_get_mtu(id_, &mtu) != 0) mtu = RTE_ETHER_MTU;
        room = std::max<uint32_t>(RTE_MBUF_DEFAULT_BUF_SIZE, mtu + kL2Overhead + RTE_PKTMBUF_HEADROOM);
        room = std::max(room, devargs_data_room(cfg.device));
      }
      if (room > UINT16_MAX) throw PortError(name_ + ": mbuf data room " + std::to_string(room) + " too large");
      uint32_t n = cfg.mbufs;
      const uint32_t cache = cfg.mbuf_cache;
      if (n == 0) {
        n = uint32_t{nrx_} * rxd + uint32_t{ntx_} * txd + (RTE_MAX_LCORE > 8 ? 8 : RTE_MAX_LCORE) * cache + 1024;
        n = std::max<uint32_t>(n, 2048);
      }
      pool_ = make_pool("droce_p" + std::to_string(id_) + "_s" + std::to_string(socket_), n, cache,
                        static_cast<uint16_t>(room), socket_);
      own_pool_ = true;
    }
    data_room_ = rte_pktmbuf_data_room_size(pool_);

    for (uint16_t q = 0; q < nrx_; ++q) {
      rc = rte_eth_rx_queue_setup(id_, q, rxd, static_cast<unsigned>(socket_), nullptr, pool_);
      if (rc != 0)
        fail(name_ + ": RX queue " + std::to_string(q) + " setup (" + std::to_string(rxd) + " descriptors, mbuf room " +
                 std::to_string(data_room_) + " B)",
             rc);
    }
    for (uint16_t q = 0; q < ntx_; ++q) {
      rc = rte_eth_tx_queue_setup(id_, q, txd, static_cast<unsigned>(socket_), nullptr);
      if (rc != 0) fail(name_ + ": TX queue " + std::to_string(q) + " setup", rc);
    }
    if (cfg.mac) set_mac(*cfg.mac);
    rc = rte_eth_dev_start(id_);
    if (rc != 0) fail(name_ + ": rte_eth_dev_start", rc);
    started_ = true;
    if (cfg.promiscuous) set_promiscuous(true);
    rte_ether_addr ea{};
    rc = rte_eth_macaddr_get(id_, &ea);
    if (rc != 0) fail(name_ + ": rte_eth_macaddr_get", rc);
    std::copy(std::begin(ea.addr_bytes), std::end(ea.addr_bytes), mac_.begin());
  } catch (...) {
    close();
    throw;
  }
}

Port::~Port() { close(); }

namespace {
struct CloseJob {
  Port* port;
  std::atomic<bool> done{false};
};
}  // namespace

void Port::close_from_alarm(void* arg) noexcept {
  auto* job = static_cast<CloseJob*>(arg);
  job->port->close_now();
  job->done.store(true, std::memory_order_release);
}

// Virtual devices such as net_memif handle their peer's control messages in
// EAL's interrupt thread. In DPDK 22.11, a peer's disconnect handled there
// while this thread releases the port runs memif_disconnect on the released
// device (a NULL dev_private: SEGV when both sides of a memif pair exit at
// once). EAL alarms run on the interrupt thread, so the port is closed from
// one: the close and the control-channel handler are serialised. If the alarm
// cannot run within the bound, the port is closed here.
void Port::close() noexcept {
  if (!open_) return;
  if (rte_thread_is_intr() == 0) {
    CloseJob job{this};
    if (rte_eal_alarm_set(1, close_from_alarm, &job) == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!job.done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      // Cancels a callback that has not started, waits for one that runs.
      rte_eal_alarm_cancel(close_from_alarm, &job);
      if (job.done.load(std::memory_order_acquire)) return;
    }
  }
  close_now();
}

void Port::close_now() noexcept {
  if (!open_) return;
  if (started_) rte_eth_dev_stop(id_);
  started_ = false;
  rte_eth_dev_info info{};
  rte_device* dev = nullptr;
  if (rte_eth_dev_info_get(id_, &info) == 0) dev = info.device;
  rte_eth_dev_close(id_);
  if (probed_ && dev != nullptr) rte_dev_remove(dev);
  open_ = false;
  if (own_pool_ && pool_ != nullptr) rte_mempool_free(pool_);
  pool_ = nullptr;
}

uint16_t Port::mtu() const {
  uint16_t m = 0;
  const int rc = rte_eth_dev_get_mtu(id_, &m);
  if (rc != 0) fail(name_ + ": get MTU", rc);
  return m;
}

void Port::set_mac(const wire::MacAddr& mac) {
  rte_ether_addr ea{};
  std::copy(mac.begin(), mac.end(), std::begin(ea.addr_bytes));
  const int rc = rte_eth_dev_default_mac_addr_set(id_, &ea);
  if (rc != 0) fail(name_ + ": set MAC " + mac_to_string(mac), rc);
  mac_ = mac;
}

void Port::set_mtu(uint16_t mtu) {
  const int rc = rte_eth_dev_set_mtu(id_, mtu);
  if (rc != 0) fail(name_ + ": set MTU " + std::to_string(mtu), rc);
}

void Port::set_promiscuous(bool on) {
  const int rc = on ? rte_eth_promiscuous_enable(id_) : rte_eth_promiscuous_disable(id_);
  if (rc != 0 && rc != -ENOTSUP) fail(name_ + ": promiscuous " + (on ? "on" : "off"), rc);
}

bool Port::promiscuous() const { return rte_eth_promiscuous_get(id_) == 1; }

const char* Port::set_mc_addrs(const std::vector<wire::MacAddr>& macs) {
  std::vector<rte_ether_addr> a(macs.size());
  for (size_t i = 0; i < macs.size(); ++i) std::memcpy(a[i].addr_bytes, macs[i].data(), 6);
  int rc = rte_eth_dev_set_mc_addr_list(id_, a.empty() ? nullptr : a.data(), static_cast<uint32_t>(a.size()));
  if (rc == 0) return "list";
  rc = macs.empty() ? rte_eth_allmulticast_disable(id_) : rte_eth_allmulticast_enable(id_);
  if (rc == 0) return "allmulti";
  return "none";
}

LinkStatus Port::link() const {
  rte_eth_link l{};
  const int rc = rte_eth_link_get_nowait(id_, &l);
  if (rc != 0) fail(name_ + ": link status", rc);
  return LinkStatus{l.link_status == RTE_ETH_LINK_UP, l.link_speed, l.link_duplex == RTE_ETH_LINK_FULL_DUPLEX};
}

bool Port::wait_link_up(uint32_t timeout_ms) const {
  for (uint32_t t = 0;; t += 10) {
    if (link().up) return true;
    if (t >= timeout_ms) return false;
    rte_delay_ms(10);
  }
}

PortStats Port::stats() const {
  rte_eth_stats s{};
  const int rc = rte_eth_stats_get(id_, &s);
  if (rc != 0) fail(name_ + ": stats", rc);
  return PortStats{s.ipackets, s.opackets, s.ibytes, s.obytes, s.imissed, s.ierrors, s.oerrors, s.rx_nombuf};
}

void Port::reset_stats() { rte_eth_stats_reset(id_); }

std::vector<std::pair<std::string, uint64_t>> Port::xstats() const {
  const int n = rte_eth_xstats_get_names(id_, nullptr, 0);
  if (n < 0) fail(name_ + ": xstats names", n);
  std::vector<rte_eth_xstat_name> names(static_cast<size_t>(n));
  std::vector<rte_eth_xstat> vals(static_cast<size_t>(n));
  if (rte_eth_xstats_get_names(id_, names.data(), static_cast<unsigned>(n)) != n) throw PortError(name_ + ": xstats names changed");
  const int m = rte_eth_xstats_get(id_, vals.data(), static_cast<unsigned>(n));
  if (m < 0 || m > n) fail(name_ + ": xstats", m < 0 ? m : -EIO);
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) {
    const auto& v = vals[static_cast<size_t>(i)];
    if (v.id < static_cast<uint64_t>(n)) out.emplace_back(names[v.id].name, v.value);
  }
  return out;
}

// ---- RingPair -------------------------------------------------------------
namespace {

using FromRingsFn = int (*)(const char*, rte_ring* const[], unsigned, rte_ring* const[], unsigned, unsigned);

// The net_ring PMD is a plugin the EAL loaded from its PMD directory; linking
// it again would register the driver twice. Find the loaded copy instead.
FromRingsFn from_rings_fn() {
  void* h = dlopen(RTE_EAL_PMD_PATH "/librte_net_ring.so", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen(RTE_EAL_PMD_PATH "/librte_net_ring.so", RTLD_NOW);
  if (h == nullptr) throw PortError(std::string("net_ring PMD not loaded: ") + dlerror());
  void* sym = dlsym(h, "rte_eth_from_rings");
  if (sym == nullptr) throw PortError("net_ring PMD has no rte_eth_from_rings");
  return reinterpret_cast<FromRingsFn>(sym);
}

}  // namespace

RingPair::RingPair(const std::string& name, uint16_t queues, uint32_t ring_size) {
  const FromRingsFn from_rings = from_rings_fn();
  auto cleanup = [this] {
    for (auto* r : ab_) rte_ring_free(r);
    for (auto* r : ba_) rte_ring_free(r);
  };
  const int socket = static_cast<int>(rte_socket_id());
  for (uint16_t q = 0; q < queues; ++q) {
    // Single producer/consumer: each queue is owned by one lcore per side.
    const unsigned flags = RING_F_SP_ENQ | RING_F_SC_DEQ;
    rte_ring* r1 = rte_ring_create((name + "_ab" + std::to_string(q)).c_str(), ring_size, socket, flags);
    rte_ring* r2 = rte_ring_create((name + "_ba" + std::to_string(q)).c_str(), ring_size, socket, flags);
    if (r1) ab_.push_back(r1);
    if (r2) ba_.push_back(r2);
    if (!r1 || !r2) {
      const int err = rte_errno;
      cleanup();
      throw PortError("ring pair '" + name + "': rte_ring_create: " + rte_strerror(err));
    }
  }
  const int a = from_rings((name + "_a").c_str(), ba_.data(), queues, ab_.data(), queues, static_cast<unsigned>(socket));
  const int b = a < 0 ? -1 : from_rings((name + "_b").c_str(), ab_.data(), queues, ba_.data(), queues, static_cast<unsigned>(socket));
  if (a < 0 || b < 0) {
    const int err = rte_errno;
    if (a >= 0) rte_eal_hotplug_remove("vdev", ("net_ring_" + name + "_a").c_str());
    cleanup();
    throw PortError("ring pair '" + name + "': rte_eth_from_rings: " + rte_strerror(err));
  }
  a_ = static_cast<uint16_t>(a);
  b_ = static_cast<uint16_t>(b);
  for (uint16_t p : {a_, b_}) {  // rte_eth_from_rings names the vdev "net_ring_<name>"
    char nm[RTE_ETH_NAME_MAX_LEN] = {};
    rte_eth_dev_get_name_by_port(p, nm);
    names_.emplace_back(nm);
  }
}

RingPair::~RingPair() {
  // The ports were closed by their Port objects; remove the vdevs, then rings.
  // Closing a port leaves its vdev behind: remove it (this closes the port
  // if no Port object did).
  for (const auto& n : names_) rte_eal_hotplug_remove("vdev", n.c_str());
  for (auto* r : ab_) rte_ring_free(r);
  for (auto* r : ba_) rte_ring_free(r);
}

uint32_t devargs_data_room(const std::string& device) {
  if (device.rfind("net_af_packet", 0) != 0) return 0;
  const auto pos = device.find(",framesz=");
  if (pos == std::string::npos) return 0;
  const unsigned long framesz = std::strtoul(device.c_str() + pos + 9, nullptr, 10);
  // The PMD copies a frame of up to framesz - TPACKET2_HDRLEN + sizeof(sockaddr_ll)
  // (= framesz - 32) bytes into one mbuf.
  return framesz > 32 ? static_cast<uint32_t>(framesz - 32 + RTE_PKTMBUF_HEADROOM) : 0;
}

std::string mac_to_string(const wire::MacAddr& m) {
  char buf[18];
  std::snprintf(buf, sizeof buf, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return buf;
}

std::optional<wire::MacAddr> parse_mac(const std::string& s) {
  wire::MacAddr m{};
  unsigned v[6];
  char tail;
  if (std::sscanf(s.c_str(), "%2x:%2x:%2x:%2x:%2x:%2x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &tail) != 6)
    return std::nullopt;
  for (int i = 0; i < 6; ++i) m[static_cast<size_t>(i)] = static_cast<uint8_t>(v[i]);
  return m;
}

}  // namespace droce::dpdk

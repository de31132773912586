// One DPDK ethdev port: opened by device string or port id, configured with N
// RX/TX queues, an mbuf pool on the port's NUMA socket, MTU, promiscuous mode
// and MAC; link status and extended statistics for the control path.
//
// Control path only: every method may allocate, log and throw PortError with
// a message naming the port and the failing call. The data path is in
// queue_io.h.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "wire/headers.h"

struct rte_mempool;
struct rte_ring;

namespace droce::dpdk {

class PortError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PortConfig {
  // Device to probe: a vdev with its devargs ("net_af_packet0,iface=veth0,
  // framesz=4096,blocksz=4096", "net_memif0,role=server,socket=/tmp/m.sock",
  // "net_ring0"), or a PCI address ("0000:03:00.0"). Empty: use port_id.
  std::string device;
  int port_id = -1;          // an ethdev that already exists (device empty)
  uint16_t rx_queues = 1;
  uint16_t tx_queues = 1;
  uint16_t rx_desc = 512;
  uint16_t tx_desc = 512;
  uint32_t mbufs = 0;        // pool size; 0: enough for all rings and caches
  uint32_t mbuf_cache = 256; // per-lcore mempool cache
  // mbuf data room incl. headroom; 0: from the MTU (>= 2176), and for
  // net_af_packet at least framesz - 32 + headroom when the devargs set framesz=
  // (jumbo frames: "net_af_packet0,iface=v,framesz=9216,blocksz=36864").
  uint16_t data_room = 0;
  uint16_t mtu = 0;          // 0: leave the device's MTU alone
  bool promiscuous = false;
  std::optional<wire::MacAddr> mac;  // set this MAC on the port
  rte_mempool* pool = nullptr;       // share an existing pool (must come from make_pool)
};

struct LinkStatus {
  bool up = false;
  uint32_t speed_mbps = 0;
  bool full_duplex = false;
};

struct PortStats {
  uint64_t ipackets = 0, opackets = 0, ibytes = 0, obytes = 0;
  uint64_t imissed = 0, ierrors = 0, oerrors = 0, rx_nombuf = 0;
};

// Private area every droce mbuf carries (holds the io::PktBuf); one cache line.
inline constexpr uint16_t kMbufPrivSize = 64;

// Creates a packet mbuf pool whose mbufs carry an io::PktBuf in their private
// area. Throws PortError.
rte_mempool* make_pool(const std::string& name, uint32_t n, uint32_t cache, uint16_t data_room, int socket);

class Port {
 public:
  explicit Port(const PortConfig& cfg);
  ~Port();
  Port(const Port&) = delete;
  Port& operator=(const Port&) = delete;

  uint16_t id() const noexcept { return id_; }
  const std::string& name() const noexcept { return name_; }
  const std::string& driver() const noexcept { return driver_; }
  int socket() const noexcept { return socket_; }
  uint16_t rx_queues() const noexcept { return nrx_; }
  uint16_t tx_queues() const noexcept { return ntx_; }
  rte_mempool* pool() const noexcept { return pool_; }
  uint16_t data_room() const noexcept { return data_room_; }
  wire::MacAddr mac() const noexcept { return mac_; }
  uint16_t mtu() const;
  // The device takes frames chained over several mbufs (RTE_ETH_TX_OFFLOAD_MULTI_SEGS
  // enabled): zero-copy TX is possible.
  bool multi_seg_tx() const noexcept { return multi_seg_tx_; }

  void set_mac(const wire::MacAddr& mac);
  void set_mtu(uint16_t mtu);
  void set_promiscuous(bool on);
  bool promiscuous() const;
  // Multicast MACs the port accepts besides its own (UD multicast groups):
  // rte_eth_dev_set_mc_addr_list; where the PMD has no list, all-multicast on
  // while the list is not empty. Returns how: "list", "allmulti" or "none"
  // (the PMD filters nothing: af_packet, memif and ring ports see every frame).
  const char* set_mc_addrs(const std::vector<wire::MacAddr>& macs);

  LinkStatus link() const;
  // Polls the link every 10 ms for up to timeout_ms; true when up.
  bool wait_link_up(uint32_t timeout_ms) const;
  PortStats stats() const;
  void reset_stats();
  std::vector<std::pair<std::string, uint64_t>> xstats() const;

  // Stops the device and releases it; also done by the destructor. Runs on
  // EAL's interrupt thread (see port.cc), waiting for it up to 5 s.
  void close() noexcept;

 private:
  // The close itself, on the calling thread (close() runs it from an EAL alarm).
  void close_now() noexcept;
  static void close_from_alarm(void* job) noexcept;
  uint16_t id_ = 0;
  bool open_ = false;
  bool started_ = false;
  bool probed_ = false;     // we probed the device: remove it on close
  bool own_pool_ = false;
  bool multi_seg_tx_ = false;
  std::string name_, driver_;
  int socket_ = 0;
  uint16_t nrx_ = 0, ntx_ = 0;
  uint16_t data_room_ = 0;
  rte_mempool* pool_ = nullptr;
  wire::MacAddr mac_{};
};

// Two ethdevs joined back to back by rte_rings (what A sends on queue q, B
// receives on queue q, and the other way round), via the net_ring PMD's
// rte_eth_from_rings. For tests and benchmarks in one process. The returned
// port ids are opened with PortConfig{.port_id = ...}; the rings are freed by
// the destructor, after the ports are closed.
class RingPair {
 public:
  RingPair(const std::string& name, uint16_t queues, uint32_t ring_size = 1024);
  ~RingPair();
  RingPair(const RingPair&) = delete;
  RingPair& operator=(const RingPair&) = delete;
  uint16_t port_a() const noexcept { return a_; }
  uint16_t port_b() const noexcept { return b_; }

 private:
  std::vector<rte_ring*> ab_, ba_;
  std::vector<std::string> names_;
  uint16_t a_ = 0, b_ = 0;
};

// The mbuf data room a device string needs (0: no special need): for
// net_af_packet with framesz=N, N - 32 + RTE_PKTMBUF_HEADROOM.
uint32_t devargs_data_room(const std::string& device);

std::string mac_to_string(const wire::MacAddr& m);
// "02:00:00:00:00:01" -> MacAddr; nullopt if malformed.
std::optional<wire::MacAddr> parse_mac(const std::string& s);

}  // namespace droce::dpdk

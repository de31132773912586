// droce/config: the daemon's config file (TOML, parsed with toml++).
//
// load_config_file() / parse_config() read, check and complete a config: every
// key is typed and range-checked, unknown keys are rejected, and cross-section
// rules (queue ownership, unique names, path MTU vs. port MTU) are enforced.
// Any problem throws ConfigError whose what() names the key and the value:
//     config: port[1].mtu: 70000 is out of range 256..9000
// The defaults are the values the structs below are initialised with; the
// commented example config/droced.toml shows every key.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fault/bottleneck.h"

namespace droce::config {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct EalConfig {
  std::vector<std::string> args;  // passed to rte_eal_init() as is
  std::string lcores;             // "-l"/"--lcores" value, e.g. "0,1" or "(0-3)@(0-1)"; empty = EAL default
  std::optional<uint32_t> main_lcore;
};

struct Ipv4Prefix {
  std::array<uint8_t, 4> addr{};
  uint8_t prefix = 32;
};

struct Ipv6Prefix {
  std::array<uint8_t, 16> addr{};
  uint8_t prefix = 128;
};

// Probabilities in [0, 1], applied per packet by the port's fault injector,
// and its bottleneck mode ([port.fault.tx.bottleneck]: lib/fault/bottleneck.h).
struct FaultRates {
  double drop = 0;
  double duplicate = 0;
  double reorder = 0;
  double corrupt = 0;
  fault::Bottleneck bottleneck;  // inactive (no rate) by default
  bool any() const { return drop > 0 || duplicate > 0 || reorder > 0 || corrupt > 0 || bottleneck.active(); }
};

struct FaultConfig {
  FaultRates rx;
  FaultRates tx;
  uint64_t seed = 1;
};

// Congestion control of a port (issue 13): the DCQCN reaction point of its
// RC/UC QPs (lib/transport/dcqcn.h) and its notification point. Defaults are
// NVIDIA's firmware defaults. [port] dcqcn = true|false switches the reaction
// point; [port.dcqcn_params] holds the rest (dcqcn_keys() lists them, with
// ranges); `droce-ctl dcqcn set` changes them at run time through the same
// checks (set_dcqcn_key, check_dcqcn).
struct DcqcnConfig {
  bool enabled = false;                    // [port] dcqcn
  // Reaction point.
  uint32_t line_rate_mbps = 100'000;       // a QP's rate before its first CNP and the most it recovers to
  uint32_t alpha_g = 1019;                 // alpha keeps g/1024 of itself per alpha update
  uint32_t initial_alpha = 1023;           // of 1024, on the first CNP
  uint32_t alpha_update_period_us = 1;
  uint32_t rate_reduce_monitor_period_us = 4;  // at most one decrease per period
  uint32_t time_reset_us = 300;            // timer increase period
  uint32_t byte_reset = 32767;             // byte-counter increase period, in 64-byte units (NVIDIA's rpg_byte_reset)
  uint32_t threshold = 1;                  // fast-recovery stages (F)
  uint32_t ai_rate_mbps = 5;               // additive increase
  uint32_t hai_rate_mbps = 50;             // hyper increase
  uint32_t min_rate_mbps = 1;
  uint32_t min_dec_fac_pct = 50;           // one decrease cuts at most this share of the rate
  uint32_t stall_hold_us = 0;              // a gap between updates past this is not time (0: off)
  uint32_t validate_rate = 0;              // 1: the timer raises only a rate the pacer enforced
  uint32_t window_us = 0;                  // a limited QP's bytes in flight <= its rate x this (0: off)
  uint32_t clamp_tgt_rate = 0;             // 1: every decrease sets the target to the current rate (the paper's rule)
  // Notification point (answers CE-marked packets with CNPs when [port] cnp is on).
  uint32_t min_time_between_cnps_us = 4;   // per QP
  uint32_t cnp_dscp = 48;
  uint32_t cnp_prio = 6;                   // 802.1p priority of CNPs (tagged ports)

  bool operator==(const DcqcnConfig&) const = default;
};

// One key of [port.dcqcn_params] (and of `droce-ctl dcqcn set`).
struct DcqcnKey {
  const char* name;
  uint32_t DcqcnConfig::*field;
  uint32_t lo, hi;
  const char* help;
};
// Every key, in the order the example config lists them.
const std::vector<DcqcnKey>& dcqcn_keys();
// Sets one key after checking its range: empty, or the error text
// ("ai_rate_mbps: 0 is out of range 1..400000", "foo: unknown key (known keys: ...)").
std::string set_dcqcn_key(DcqcnConfig& c, std::string_view key, int64_t value);
// Rules between keys (min_rate_mbps <= ai_rate_mbps <= line_rate_mbps, ...):
// empty, or the error text.
std::string check_dcqcn(const DcqcnConfig& c);

struct PortConfig {
  std::string name;     // unique; referenced by [[core]] and droce-ctl
  std::string device;   // DPDK device: vdev args ("net_af_packet0,iface=veth0") or PCI address
  uint16_t rx_queues = 1;
  uint16_t tx_queues = 1;
  uint32_t mtu = 1500;  // IP MTU of the port
  std::optional<std::array<uint8_t, 6>> mac;  // empty: the device's own
  std::vector<Ipv4Prefix> ipv4;
  std::vector<Ipv6Prefix> ipv6;
  std::optional<uint16_t> vlan;  // 802.1Q VLAN id 1..4094
  uint8_t vlan_pcp = 0;          // 802.1p priority 0..7 (only with vlan)
  uint8_t dscp = 0;              // DSCP of RoCEv2 packets 0..63
  bool ecn = true;               // mark RoCEv2 data packets ECN-capable (ECT(0))
  bool cnp = true;               // answer CE-marked packets with CNPs (notification point)
  DcqcnConfig dcqcn;             // [port] dcqcn, [port.dcqcn_params]
  FaultConfig fault;
};

// One rx (and tx) queue of one port, owned by one core.
struct QueueRef {
  uint32_t port = 0;  // index into Config::ports
  uint16_t rx = 0;
  uint16_t tx = 0;
};

struct CoreConfig {
  uint32_t lcore = 0;
  std::vector<QueueRef> queues;
  // sched_yield() after this many polls in a row found no work (0: never);
  // see engine::CoreSpec::idle_yield_polls.
  uint32_t idle_yield_polls = 256;
};

struct RoceConfig {
  uint32_t path_mtu = 1024;  // IB MTU: 256, 512, 1024, 2048 or 4096
  uint32_t max_qps = 1024;
  uint32_t max_mrs = 1024;
  uint64_t mr_memory_mb = 256;  // hugepage memory for memory regions
  // RC packets in flight per QP (the go-back-N window, the congestion
  // window's maximum) and the window a QP starts with (0: the maximum; a
  // small one grows by slow start, which the first CNP ends:
  // transport::EngineConfig::initial_inflight_pkts).
  uint32_t window = 64;
  uint32_t initial_window = 0;
  // A tail-loss probe (the last packet sent, again) after this long without
  // progress instead of waiting for the local ACK timeout (us; 0: off;
  // transport::EngineConfig::tail_timeout_ns).
  uint32_t tail_timeout_us = 0;
  // Selective repeat between droce peers (lib/transport/README.md): off by
  // default; the peers known to run it, as 16-byte GIDs (IPv4 ones IPv4-mapped).
  bool selective_repeat = false;
  std::vector<std::array<uint8_t, 16>> selective_repeat_peers;
};

struct ControlConfig {
  std::string socket = "/run/droce/droced.sock";
  uint32_t mode = 0660;            // permission bits of the socket file
  std::string group;               // owning group of the socket; its members may connect
  std::optional<uint32_t> gid;     // resolved from group at load time
  uint32_t max_request = 65536;    // bytes per request line
  uint32_t max_clients = 16;
  uint32_t idle_timeout_ms = 30000;
};

// The shared-memory verbs shim's socket (lib/shim): local processes and the
// drop-in libibverbs.so.1 connect here (clients find it through DROCE_SOCKET).
struct ShimConfig {
  bool enabled = true;
  std::string socket = "/run/droce/verbs.sock";
  uint32_t mode = 0660;
  uint32_t max_clients = 256;
  // Per-client quotas (ShimServerConfig): beyond one, the create call fails
  // with ENOMEM.
  uint32_t max_qps_per_client = 256;
  uint32_t max_cqs_per_client = 512;
  uint32_t max_srqs_per_client = 64;
  uint32_t max_mrs_per_client = 256;
  uint32_t max_ahs_per_client = 512;
  uint64_t max_mr_mb_per_client = 65536;  // registered memory, MiB
  // Address resolution of a client's create_ah / modify_qp(RTR): given up
  // (EHOSTUNREACH) after this long; other clients are served meanwhile.
  uint32_t resolve_timeout_ms = 3000;
};

struct LogConfig {
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  std::string file;            // empty: stderr
};

struct Config {
  std::string source;  // file name (or "<string>")
  EalConfig eal;
  std::vector<PortConfig> ports;
  std::vector<CoreConfig> cores;  // when absent from the file: derived, see derive_cores()
  bool cores_derived = false;
  RoceConfig roce;
  ControlConfig control;
  ShimConfig shim;
  LogConfig log;

  const PortConfig* find_port(std::string_view name) const;
};

// Parses TOML text; `source` names it in messages. Throws ConfigError.
Config parse_config(std::string_view text, std::string_view source = "<string>");
// Reads and parses a file. Throws ConfigError (also when the file cannot be read).
Config load_config_file(const std::string& path);

// Largest IB MTU (256..4096) whose RoCEv2 packets fit in an IP MTU, or 0 when
// none fits; the same headroom Linux uses (iboe_get_mtu: GRH/IP + UDP + BTH +
// the largest extension headers + ICRC = 96 bytes).
uint32_t ib_mtu_for_ip_mtu(uint32_t ip_mtu);

std::string format_ipv4(const Ipv4Prefix& p);
std::string format_ipv6(const Ipv6Prefix& p);
std::string format_mac(const std::array<uint8_t, 6>& m);

bool valid_log_level(std::string_view level);

}  // namespace droce::config

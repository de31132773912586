// The host network functions a kernel-less RoCEv2 host needs on its port:
// ARP, IPv6 neighbour discovery, ICMP and ICMPv6 echo, optional VLAN, and the
// classification that hands RoCEv2 frames (UDP 4791 to one of our addresses)
// to the transport. Everything else is dropped and counted by reason.
//
// Pure: no DPDK, no allocation after construction, no exceptions on the frame
// path. handle() reads one received frame and, when an answer is due, writes
// the answer frame into the caller's buffer (never longer than the request,
// at least 60 bytes; kMaxReplyLen is enough for every answer to a frame of a
// 1500-byte MTU, jumbo echo requests need a buffer as large as the request).
// One NetStack belongs to one thread (the port's control or poll lcore).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "netstack/gid_table.h"
#include "netstack/neigh.h"
#include "wire/headers.h"

namespace droce::netstack {

inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint8_t kIpProtoIcmp = 1;
inline constexpr uint8_t kIpProtoIcmpv6 = 58;
inline constexpr size_t kMinFrameLen = 60;  // Ethernet minimum without FCS

struct HostConfig {
  wire::MacAddr mac{};
  std::vector<uint32_t> ipv4;       // host byte order
  std::vector<wire::Gid> ipv6;      // global / unique-local; the link-local is derived from mac
  uint16_t vlan = 0;                // 0: untagged; 1..4094: only frames of this VLAN, replies tagged
  uint8_t vlan_pcp = 0;
  NeighConfig neigh;
};

// Why a frame was dropped. Names in drop_reason_name().
enum class Drop : uint8_t {
  None = 0,
  Runt,               // shorter than its headers
  NotOurMac,          // unicast to another MAC, or multicast we did not join
  VlanMismatch,       // tagged when we are untagged, other VID, or untagged on a VLAN port
  UnknownEthertype,
  ArpMalformed,
  ArpNotForUs,        // request/reply about another host's address
  ArpConflict,        // another MAC claims one of our IPv4 addresses
  Ipv4Malformed,      // version, IHL, length or header checksum
  Ipv4Fragment,
  Ipv4NotForUs,       // destination is not one of our addresses (incl. broadcast)
  Ipv4BadSource,      // source 0.0.0.0, multicast or broadcast (RFC 1122 3.2.1.3)
  Ipv6Malformed,
  Ipv6NotForUs,
  Ipv6ExtHeader,      // extension headers are not handled
  IcmpMalformed,      // short or bad checksum
  IcmpUnhandled,      // ICMP type we do not answer
  Icmpv6Malformed,
  Icmpv6Unhandled,    // RS, RA, MLD, redirects, ...
  NdMalformed,        // hop limit != 255, code != 0, bad option, multicast target
  NdNotForUs,         // NS for another address
  UdpMalformed,
  UdpNotRoce,         // UDP to a port other than 4791
  IpProtoUnhandled,   // TCP, SCTP, ...
  ReplyNoRoom,        // the caller's reply buffer is too small
  kCount
};
const char* drop_reason_name(Drop d) noexcept;

enum class Verdict : uint8_t {
  Roce,      // RoCEv2 for us: give the frame to the transport
  Reply,     // answer written to the reply buffer: send it
  Consumed,  // handled, nothing to send (ARP reply, NA learned)
  Dropped,   // see Result::drop
};

struct Result {
  Verdict verdict = Verdict::Dropped;
  Drop drop = Drop::None;
  uint32_t reply_len = 0;
  uint16_t l3_off = 0;  // for Roce: offset of the IP header (after any VLAN tag)
};

struct Counters {
  uint64_t rx_frames = 0;
  uint64_t roce = 0;
  uint64_t arp_replies_sent = 0;
  uint64_t arp_requests_sent = 0;   // resolutions, retries and probes
  uint64_t garp_sent = 0;
  uint64_t na_sent = 0;
  uint64_t ns_sent = 0;
  uint64_t echo_replies_sent = 0;   // ICMP
  uint64_t echo6_replies_sent = 0;  // ICMPv6
  uint64_t neigh_updates = 0;       // entries created or refreshed by ARP/ND
  std::array<uint64_t, static_cast<size_t>(Drop::kCount)> drops{};
  uint64_t drop(Drop d) const noexcept { return drops[static_cast<size_t>(d)]; }
  uint64_t dropped() const noexcept;
};

class NetStack {
 public:
  static constexpr size_t kMaxReplyLen = 2048;

  explicit NetStack(const HostConfig& cfg);

  // Classifies one received frame; writes an answer into `reply` when one is due.
  Result handle(std::span<const uint8_t> frame, std::span<uint8_t> reply, uint64_t now_ns) noexcept;

  // Resolving a peer (IPv4-mapped GID for IPv4) before sending to it.
  enum class Resolve : uint8_t {
    Ready,       // mac written; nothing to send
    Request,     // mac not known yet: send the request written to `out`, try again later
    ReadyProbe,  // mac written (old entry) and a confirming request written to `out`
    Pending,     // asked already; try again later
    Failed,      // no answer from the peer
    NoRoom,      // out too small for the request
  };
  Resolve resolve(const wire::Gid& ip, uint64_t now_ns, wire::MacAddr& mac, std::span<uint8_t> out,
                  uint32_t& out_len) noexcept;

  // Timer: writes the next due ARP request / NS (retries and probes) into out
  // and returns its length; 0 when nothing is due. Call until it returns 0.
  uint32_t poll_timers(uint64_t now_ns, std::span<uint8_t> out) noexcept;

  // Gratuitous ARP for our IPv4 address number `index`, to announce us (at start).
  uint32_t gratuitous_arp(size_t index, std::span<uint8_t> out) noexcept;

  bool is_our_ipv4(uint32_t ip) const noexcept;
  bool is_our_ipv6(const wire::Gid& ip) const noexcept;  // link-local or configured
  const GidTable& gids() const noexcept { return gids_; }
  const NeighCache& neighbours() const noexcept { return neigh_; }
  const Counters& counters() const noexcept { return ctr_; }
  const HostConfig& config() const noexcept { return cfg_; }

 private:
  Result drop(Drop d) noexcept;
  uint32_t write_l2(uint8_t* out, const wire::MacAddr& dst, uint16_t ethertype) const noexcept;
  uint32_t l2_len() const noexcept { return cfg_.vlan != 0 ? 18 : 14; }
  Result handle_arp(const uint8_t* p, size_t n, std::span<uint8_t> reply, uint64_t now) noexcept;
  Result handle_ipv4(const uint8_t* frame, size_t l3, size_t n, std::span<uint8_t> reply) noexcept;
  Result handle_ipv6(const uint8_t* frame, size_t l3, size_t n, std::span<uint8_t> reply, uint64_t now) noexcept;
  uint32_t write_arp(std::span<uint8_t> out, uint16_t op, const wire::MacAddr& eth_dst, uint32_t spa,
                     const wire::MacAddr& tha, uint32_t tpa) const noexcept;
  uint32_t write_ns(std::span<uint8_t> out, const wire::Gid& target, bool unicast,
                    const wire::MacAddr& mac) const noexcept;
  uint32_t write_request(const NeighEntry& e, bool unicast, std::span<uint8_t> out) noexcept;
  bool ipv6_dst_accepted(const wire::Gid& dst) const noexcept;

  HostConfig cfg_;
  GidTable gids_;
  wire::Gid link_local_{};
  std::vector<wire::Gid> ipv6_;  // link-local first, then configured
  NeighCache neigh_;
  Counters ctr_;
};

// RFC 1071 one's-complement sum over bytes (no final complement), and the
// finished checksum of a buffer with an optional starting sum.
uint32_t csum_add(uint32_t sum, const uint8_t* p, size_t n) noexcept;
uint16_t csum_fold(uint32_t sum) noexcept;
// ICMPv6 checksum (RFC 4443 2.3) over the pseudo-header and the message.
uint16_t icmpv6_checksum(const wire::Gid& src, const wire::Gid& dst, const uint8_t* msg, size_t len) noexcept;

}  // namespace droce::netstack

#include "netstack/netstack.h"

#include <algorithm>
#include <cstring>

namespace droce::netstack {
namespace {

constexpr wire::MacAddr kBroadcast{0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
constexpr wire::MacAddr kAllNodesMac{0x33, 0x33, 0, 0, 0, 1};
constexpr wire::Gid kAllNodes{0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
constexpr wire::Gid kUnspecified{};

constexpr uint16_t kArpRequest = 1;
constexpr uint16_t kArpReply = 2;
constexpr size_t kArpLen = 28;
constexpr uint8_t kIcmpEchoReply = 0, kIcmpEchoRequest = 8;
constexpr uint8_t kIcmp6EchoRequest = 128, kIcmp6EchoReply = 129;
constexpr uint8_t kNdNs = 135, kNdNa = 136;
constexpr uint8_t kNdOptSlla = 1, kNdOptTlla = 2;
constexpr uint8_t kNaFlagSolicited = 0x40, kNaFlagOverride = 0x20;
constexpr size_t kNdMsgLen = 24;     // type..target
constexpr size_t kNdWithLla = 32;    // + one link-layer address option

uint16_t get16(const uint8_t* p) noexcept { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t get32(const uint8_t* p) noexcept {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
void put16(uint8_t* p, uint16_t v) noexcept {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) noexcept {
  put16(p, static_cast<uint16_t>(v >> 16));
  put16(p + 2, static_cast<uint16_t>(v));
}
wire::MacAddr mac_at(const uint8_t* p) noexcept {
  wire::MacAddr m;
  std::memcpy(m.data(), p, 6);
  return m;
}
wire::Gid gid_at(const uint8_t* p) noexcept {
  wire::Gid g;
  std::memcpy(g.data(), p, 16);
  return g;
}
uint32_t pad_min(uint8_t* out, uint32_t len) noexcept {
  if (len < kMinFrameLen) {
    std::memset(out + len, 0, kMinFrameLen - len);
    len = kMinFrameLen;
  }
  return len;
}

// Finds the link-layer address option `type` in ND options; false if the
// options are malformed (RFC 4861 4.6: a zero length is invalid).
bool nd_find_lla(const uint8_t* opt, size_t n, uint8_t type, bool& found, wire::MacAddr& mac) noexcept {
  found = false;
  while (n >= 2) {
    const size_t len = size_t{opt[1]} * 8;
    if (len == 0 || len > n) return false;
    if (opt[0] == type) {
      if (len < 8) return false;
      found = true;
      mac = mac_at(opt + 2);
    }
    opt += len;
    n -= len;
  }
  return n == 0;
}

}  // namespace

const char* drop_reason_name(Drop d) noexcept {
  static constexpr const char* kNames[] = {
      "none", "runt", "not_our_mac", "vlan_mismatch", "unknown_ethertype", "arp_malformed", "arp_not_for_us",
      "arp_conflict", "ipv4_malformed", "ipv4_fragment", "ipv4_not_for_us", "ipv4_bad_source", "ipv6_malformed",
      "ipv6_not_for_us", "ipv6_ext_header", "icmp_malformed", "icmp_unhandled", "icmpv6_malformed", "icmpv6_unhandled", "nd_malformed",
      "nd_not_for_us", "udp_malformed", "udp_not_roce", "ip_proto_unhandled", "reply_no_room"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Drop::kCount));
  const auto i = static_cast<size_t>(d);
  return i < static_cast<size_t>(Drop::kCount) ? kNames[i] : "?";
}

uint64_t Counters::dropped() const noexcept {
  uint64_t s = 0;
  for (uint64_t v : drops) s += v;
  return s;
}

uint32_t csum_add(uint32_t sum, const uint8_t* p, size_t n) noexcept {
  uint64_t s = sum;
  size_t i = 0;
  for (; i + 1 < n; i += 2) s += (uint32_t{p[i]} << 8) | p[i + 1];
  if (i < n) s += uint32_t{p[i]} << 8;
  while (s >> 32) s = (s & 0xFFFFFFFF) + (s >> 32);
  return static_cast<uint32_t>(s);
}

uint16_t csum_fold(uint32_t sum) noexcept {
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

uint16_t icmpv6_checksum(const wire::Gid& src, const wire::Gid& dst, const uint8_t* msg, size_t len) noexcept {
  uint8_t tail[8] = {};
  put32(tail, static_cast<uint32_t>(len));
  tail[7] = kIpProtoIcmpv6;
  uint32_t s = csum_add(0, src.data(), 16);
  s = csum_add(s, dst.data(), 16);
  s = csum_add(s, tail, 8);
  return csum_fold(csum_add(s, msg, len));
}

NetStack::NetStack(const HostConfig& cfg)
    : cfg_(cfg), gids_(cfg.mac, cfg.ipv4, cfg.ipv6), link_local_(link_local_from_mac(cfg.mac)), neigh_(cfg.neigh) {
  ipv6_.push_back(link_local_);
  for (const auto& g : cfg.ipv6)
    if (std::find(ipv6_.begin(), ipv6_.end(), g) == ipv6_.end()) ipv6_.push_back(g);
}

bool NetStack::is_our_ipv4(uint32_t ip) const noexcept {
  return std::find(cfg_.ipv4.begin(), cfg_.ipv4.end(), ip) != cfg_.ipv4.end();
}

bool NetStack::is_our_ipv6(const wire::Gid& ip) const noexcept {
  return std::find(ipv6_.begin(), ipv6_.end(), ip) != ipv6_.end();
}

bool NetStack::ipv6_dst_accepted(const wire::Gid& dst) const noexcept {
  if (!is_ipv6_multicast(dst)) return is_our_ipv6(dst);
  if (dst == kAllNodes) return true;
  for (const auto& a : ipv6_)
    if (dst == solicited_node(a)) return true;
  return false;
}

Result NetStack::drop(Drop d) noexcept {
  ++ctr_.drops[static_cast<size_t>(d)];
  return Result{Verdict::Dropped, d, 0, 0};
}

uint32_t NetStack::write_l2(uint8_t* out, const wire::MacAddr& dst, uint16_t ethertype) const noexcept {
  std::memcpy(out, dst.data(), 6);
  std::memcpy(out + 6, cfg_.mac.data(), 6);
  if (cfg_.vlan != 0) {
    put16(out + 12, wire::kEtherTypeVlan);
    put16(out + 14, static_cast<uint16_t>((cfg_.vlan_pcp & 7) << 13 | (cfg_.vlan & 0x0FFF)));
    put16(out + 16, ethertype);
    return 18;
  }
  put16(out + 12, ethertype);
  return 14;
}

Result NetStack::handle(std::span<const uint8_t> frame, std::span<uint8_t> reply, uint64_t now) noexcept {
  ++ctr_.rx_frames;
  const uint8_t* p = frame.data();
  const size_t n = frame.size();
  if (n < sizeof(wire::EthHdr)) return drop(Drop::Runt);

  const wire::MacAddr dst = mac_at(p);
  if (dst != cfg_.mac && dst != kBroadcast && dst != kAllNodesMac) {
    bool ok = false;
    if (dst[0] == 0x33 && dst[1] == 0x33 && dst[2] == 0xff)
      for (const auto& a : ipv6_) ok |= dst[3] == a[13] && dst[4] == a[14] && dst[5] == a[15];
    if (!ok) return drop(Drop::NotOurMac);
  }

  size_t l3 = 14;
  uint16_t et = get16(p + 12);
  if (et == wire::kEtherTypeVlan) {
    if (n < 18) return drop(Drop::Runt);
    const uint16_t vid = get16(p + 14) & 0x0FFF;
    if (vid != cfg_.vlan) return drop(Drop::VlanMismatch);  // VID 0 (priority tag) is "untagged"
    et = get16(p + 16);
    l3 = 18;
  } else if (cfg_.vlan != 0) {
    return drop(Drop::VlanMismatch);
  }

  switch (et) {
    case kEtherTypeArp: return handle_arp(p + l3, n - l3, reply, now);
    case wire::kEtherTypeIpv4: return handle_ipv4(p, l3, n, reply);
    case wire::kEtherTypeIpv6: return handle_ipv6(p, l3, n, reply, now);
    default: return drop(Drop::UnknownEthertype);
  }
}

uint32_t NetStack::write_arp(std::span<uint8_t> out, uint16_t op, const wire::MacAddr& eth_dst, uint32_t spa,
                             const wire::MacAddr& tha, uint32_t tpa) const noexcept {
  if (out.size() < kMinFrameLen + 4) return 0;
  uint8_t* o = out.data();
  uint32_t len = write_l2(o, eth_dst, kEtherTypeArp);
  uint8_t* a = o + len;
  put16(a, 1);                      // Ethernet
  put16(a + 2, wire::kEtherTypeIpv4);
  a[4] = 6;
  a[5] = 4;
  put16(a + 6, op);
  std::memcpy(a + 8, cfg_.mac.data(), 6);
  put32(a + 14, spa);
  std::memcpy(a + 18, tha.data(), 6);
  put32(a + 24, tpa);
  return pad_min(o, len + static_cast<uint32_t>(kArpLen));
}

Result NetStack::handle_arp(const uint8_t* a, size_t n, std::span<uint8_t> reply, uint64_t now) noexcept {
  if (n < kArpLen || get16(a) != 1 || get16(a + 2) != wire::kEtherTypeIpv4 || a[4] != 6 || a[5] != 4)
    return drop(Drop::ArpMalformed);
  const uint16_t op = get16(a + 6);
  const wire::MacAddr sha = mac_at(a + 8);
  const uint32_t spa = get32(a + 14);
  const uint32_t tpa = get32(a + 24);
  if ((op != kArpRequest && op != kArpReply) || (sha[0] & 1)) return drop(Drop::ArpMalformed);
  if (spa != 0 && is_our_ipv4(spa)) return drop(sha == cfg_.mac ? Drop::ArpNotForUs : Drop::ArpConflict);
  const wire::Gid sgid = wire::gid_from_ipv4(spa);

  if (op == kArpRequest && is_our_ipv4(tpa)) {
    // RFC 826: learn the sender, then answer. A probe (spa 0) teaches nothing.
    if (spa != 0 && neigh_.confirm(sgid, sha, now, true)) ++ctr_.neigh_updates;
    const uint32_t len = write_arp(reply, kArpReply, sha, tpa, sha, spa);
    if (len == 0) return drop(Drop::ReplyNoRoom);
    ++ctr_.arp_replies_sent;
    return Result{Verdict::Reply, Drop::None, len, 0};
  }
  // Replies to our requests, gratuitous ARP and others' requests refresh
  // entries we already have (Linux arp_accept=0 behaviour); nothing new.
  if (spa != 0 && neigh_.confirm(sgid, sha, now, false)) ++ctr_.neigh_updates;
  if ((op == kArpReply && is_our_ipv4(tpa)) || spa == tpa) return Result{Verdict::Consumed, Drop::None, 0, 0};
  return drop(Drop::ArpNotForUs);
}

Result NetStack::handle_ipv4(const uint8_t* f, size_t l3, size_t n, std::span<uint8_t> reply) noexcept {
  const uint8_t* ip = f + l3;
  const size_t avail = n - l3;
  if (avail < 20 || (ip[0] >> 4) != 4 || (ip[0] & 0x0F) < 5) return drop(Drop::Ipv4Malformed);
  const size_t hl = size_t{ip[0] & 0x0Fu} * 4;
  const size_t tot = get16(ip + 2);
  if (avail < hl || tot < hl || tot > avail) return drop(Drop::Ipv4Malformed);
  if (csum_fold(csum_add(0, ip, hl)) != 0) return drop(Drop::Ipv4Malformed);
  const uint16_t frag = get16(ip + 6);
  if ((frag & wire::kIpv4FlagMF) || (frag & wire::kIpv4OffsetMask)) return drop(Drop::Ipv4Fragment);
  if (!is_our_ipv4(get32(ip + 16))) return drop(Drop::Ipv4NotForUs);
  const uint32_t src = get32(ip + 12);
  if (src == 0 || src >= 0xE0000000u) return drop(Drop::Ipv4BadSource);

  const uint8_t* l4 = ip + hl;
  const size_t l4len = tot - hl;
  switch (ip[9]) {
    case wire::kIpProtoUdp: {
      if (l4len < 8 || get16(l4 + 4) < 8 || get16(l4 + 4) > l4len) return drop(Drop::UdpMalformed);
      if (get16(l4 + 2) != wire::kRoceV2Port) return drop(Drop::UdpNotRoce);
      ++ctr_.roce;
      return Result{Verdict::Roce, Drop::None, 0, static_cast<uint16_t>(l3)};
    }
    case kIpProtoIcmp: {
      if (l4len < 8 || csum_fold(csum_add(0, l4, l4len)) != 0) return drop(Drop::IcmpMalformed);
      if (l4[0] != kIcmpEchoRequest || l4[1] != 0) return drop(Drop::IcmpUnhandled);
      const uint32_t l2 = l2_len();
      if (reply.size() < std::max<size_t>(l2 + tot, kMinFrameLen)) return drop(Drop::ReplyNoRoom);
      uint8_t* o = reply.data();
      write_l2(o, mac_at(f + 6), wire::kEtherTypeIpv4);
      uint8_t* rip = o + l2;
      std::memcpy(rip, ip, tot);
      std::memcpy(rip + 12, ip + 16, 4);  // swap addresses
      std::memcpy(rip + 16, ip + 12, 4);
      rip[8] = 64;                         // TTL
      put16(rip + 10, 0);
      put16(rip + 10, csum_fold(csum_add(0, rip, hl)));
      uint8_t* icmp = rip + hl;
      icmp[0] = kIcmpEchoReply;
      put16(icmp + 2, 0);
      put16(icmp + 2, csum_fold(csum_add(0, icmp, l4len)));
      ++ctr_.echo_replies_sent;
      return Result{Verdict::Reply, Drop::None, pad_min(o, static_cast<uint32_t>(l2 + tot)), 0};
    }
    default: return drop(Drop::IpProtoUnhandled);
  }
}

Result NetStack::handle_ipv6(const uint8_t* f, size_t l3, size_t n, std::span<uint8_t> reply, uint64_t now) noexcept {
  const uint8_t* ip = f + l3;
  const size_t avail = n - l3;
  if (avail < 40 || (ip[0] >> 4) != 6) return drop(Drop::Ipv6Malformed);
  const size_t plen = get16(ip + 4);
  if (40 + plen > avail) return drop(Drop::Ipv6Malformed);
  const wire::Gid src = gid_at(ip + 8);
  const wire::Gid dst = gid_at(ip + 24);
  if (is_ipv6_multicast(src)) return drop(Drop::Ipv6Malformed);
  if (!ipv6_dst_accepted(dst)) return drop(Drop::Ipv6NotForUs);
  const uint8_t nh = ip[6];
  const uint8_t* m = ip + 40;

  if (nh == wire::kIpProtoUdp) {
    if (is_ipv6_multicast(dst)) return drop(Drop::Ipv6NotForUs);
    if (plen < 8 || get16(m + 4) < 8 || get16(m + 4) > plen) return drop(Drop::UdpMalformed);
    if (get16(m + 2) != wire::kRoceV2Port) return drop(Drop::UdpNotRoce);
    ++ctr_.roce;
    return Result{Verdict::Roce, Drop::None, 0, static_cast<uint16_t>(l3)};
  }
  if (nh == 0 || nh == 43 || nh == 44 || nh == 60) return drop(Drop::Ipv6ExtHeader);
  if (nh != kIpProtoIcmpv6) return drop(Drop::IpProtoUnhandled);
  if (plen < 4 || icmpv6_checksum(src, dst, m, plen) != 0) return drop(Drop::Icmpv6Malformed);

  const uint32_t l2 = l2_len();
  switch (m[0]) {
    case kIcmp6EchoRequest: {
      if (m[1] != 0 || plen < 8) return drop(Drop::Icmpv6Malformed);
      if (is_ipv6_multicast(dst)) return drop(Drop::Icmpv6Unhandled);
      if (reply.size() < std::max<size_t>(l2 + 40 + plen, kMinFrameLen)) return drop(Drop::ReplyNoRoom);
      uint8_t* o = reply.data();
      write_l2(o, mac_at(f + 6), wire::kEtherTypeIpv6);
      uint8_t* rip = o + l2;
      std::memcpy(rip, ip, 40 + plen);
      std::memcpy(rip + 8, dst.data(), 16);
      std::memcpy(rip + 24, src.data(), 16);
      rip[7] = 64;
      uint8_t* rm = rip + 40;
      rm[0] = kIcmp6EchoReply;
      put16(rm + 2, 0);
      put16(rm + 2, icmpv6_checksum(dst, src, rm, plen));
      ++ctr_.echo6_replies_sent;
      return Result{Verdict::Reply, Drop::None, pad_min(o, static_cast<uint32_t>(l2 + 40 + plen)), 0};
    }
    case kNdNs: {
      // RFC 4861 7.1.1 validity checks.
      if (ip[7] != 255 || m[1] != 0 || plen < kNdMsgLen) return drop(Drop::NdMalformed);
      const wire::Gid target = gid_at(m + 8);
      if (is_ipv6_multicast(target)) return drop(Drop::NdMalformed);
      bool has_slla = false;
      wire::MacAddr slla{};
      if (!nd_find_lla(m + kNdMsgLen, plen - kNdMsgLen, kNdOptSlla, has_slla, slla)) return drop(Drop::NdMalformed);
      const bool dad = src == kUnspecified;
      if (dad && (has_slla || dst != solicited_node(target))) return drop(Drop::NdMalformed);
      if (!is_our_ipv6(target)) return drop(Drop::NdNotForUs);
      if (!dad && has_slla && neigh_.confirm(src, slla, now, true)) ++ctr_.neigh_updates;

      // Answer (7.2.4): to the soliciter, or to all nodes for a DAD probe.
      if (reply.size() < l2 + 40 + kNdWithLla) return drop(Drop::ReplyNoRoom);
      uint8_t* o = reply.data();
      const wire::MacAddr eth_dst = dad ? kAllNodesMac : has_slla ? slla : mac_at(f + 6);
      const wire::Gid ip_dst = dad ? kAllNodes : src;
      write_l2(o, eth_dst, wire::kEtherTypeIpv6);
      uint8_t* rip = o + l2;
      put32(rip, 6u << 28);
      put16(rip + 4, kNdWithLla);
      rip[6] = kIpProtoIcmpv6;
      rip[7] = 255;
      std::memcpy(rip + 8, target.data(), 16);
      std::memcpy(rip + 24, ip_dst.data(), 16);
      uint8_t* na = rip + 40;
      std::memset(na, 0, kNdWithLla);
      na[0] = kNdNa;
      na[4] = static_cast<uint8_t>(kNaFlagOverride | (dad ? 0 : kNaFlagSolicited));
      std::memcpy(na + 8, target.data(), 16);
      na[24] = kNdOptTlla;
      na[25] = 1;
      std::memcpy(na + 26, cfg_.mac.data(), 6);
      put16(na + 2, icmpv6_checksum(target, ip_dst, na, kNdWithLla));
      ++ctr_.na_sent;
      return Result{Verdict::Reply, Drop::None, static_cast<uint32_t>(l2 + 40 + kNdWithLla), 0};
    }
    case kNdNa: {
      // RFC 4861 7.1.2.
      if (ip[7] != 255 || m[1] != 0 || plen < kNdMsgLen) return drop(Drop::NdMalformed);
      const wire::Gid target = gid_at(m + 8);
      if (is_ipv6_multicast(target)) return drop(Drop::NdMalformed);
      if (is_ipv6_multicast(dst) && (m[4] & kNaFlagSolicited)) return drop(Drop::NdMalformed);
      bool has_tlla = false;
      wire::MacAddr tlla{};
      if (!nd_find_lla(m + kNdMsgLen, plen - kNdMsgLen, kNdOptTlla, has_tlla, tlla)) return drop(Drop::NdMalformed);
      // 7.2.5: only entries that exist are updated.
      if (has_tlla && neigh_.confirm(target, tlla, now, false)) ++ctr_.neigh_updates;
      return Result{Verdict::Consumed, Drop::None, 0, 0};
    }
    default: return drop(Drop::Icmpv6Unhandled);
  }
}

uint32_t NetStack::write_ns(std::span<uint8_t> out, const wire::Gid& target, bool unicast,
                            const wire::MacAddr& mac) const noexcept {
  const uint32_t l2 = l2_len();
  if (out.size() < l2 + 40 + kNdWithLla) return 0;
  uint8_t* o = out.data();
  const wire::Gid dst = unicast ? target : solicited_node(target);
  const wire::MacAddr eth_dst = unicast ? mac : wire::MacAddr{0x33, 0x33, 0xff, target[13], target[14], target[15]};
  // Source: our link-local for link-local targets, else our first configured address.
  const bool ll_target = target[0] == 0xfe && (target[1] & 0xc0) == 0x80;
  const wire::Gid& src = (ll_target || ipv6_.size() < 2) ? link_local_ : ipv6_[1];
  write_l2(o, eth_dst, wire::kEtherTypeIpv6);
  uint8_t* ip = o + l2;
  put32(ip, 6u << 28);
  put16(ip + 4, kNdWithLla);
  ip[6] = kIpProtoIcmpv6;
  ip[7] = 255;
  std::memcpy(ip + 8, src.data(), 16);
  std::memcpy(ip + 24, dst.data(), 16);
  uint8_t* ns = ip + 40;
  std::memset(ns, 0, kNdWithLla);
  ns[0] = kNdNs;
  std::memcpy(ns + 8, target.data(), 16);
  ns[24] = kNdOptSlla;
  ns[25] = 1;
  std::memcpy(ns + 26, cfg_.mac.data(), 6);
  put16(ns + 2, icmpv6_checksum(src, dst, ns, kNdWithLla));
  return l2 + 40 + static_cast<uint32_t>(kNdWithLla);
}

uint32_t NetStack::write_request(const NeighEntry& e, bool unicast, std::span<uint8_t> out) noexcept {
  if (wire::gid_is_ipv4_mapped(e.ip)) {
    if (cfg_.ipv4.empty()) return 0;
    const uint32_t len = write_arp(out, kArpRequest, unicast ? e.mac : kBroadcast, cfg_.ipv4.front(), wire::MacAddr{},
                                   wire::gid_to_ipv4(e.ip));
    if (len != 0) ++ctr_.arp_requests_sent;
    return len;
  }
  const uint32_t len = write_ns(out, e.ip, unicast, e.mac);
  if (len != 0) ++ctr_.ns_sent;
  return len;
}

NetStack::Resolve NetStack::resolve(const wire::Gid& ip, uint64_t now, wire::MacAddr& mac, std::span<uint8_t> out,
                                    uint32_t& out_len) noexcept {
  out_len = 0;
  if (out.size() < l2_len() + 40 + kNdWithLla) return Resolve::NoRoom;
  // A multicast group: its MAC follows from the address (no ARP/ND).
  if (wire::gid_is_multicast(ip)) {
    mac = wire::multicast_mac(ip);
    return Resolve::Ready;
  }
  if (wire::gid_is_ipv4_mapped(ip) && cfg_.ipv4.empty()) return Resolve::Failed;
  // One of our own addresses: our own MAC, no ARP/ND (the dataplane loops
  // frames to it back; lib/engine/README.md, Loopback).
  if (wire::gid_is_ipv4_mapped(ip) ? is_our_ipv4(wire::gid_to_ipv4(ip)) : is_our_ipv6(ip)) {
    mac = cfg_.mac;
    return Resolve::Ready;
  }
  switch (neigh_.lookup(ip, now, mac)) {
    case NeighCache::Lookup::Hit: return Resolve::Ready;
    case NeighCache::Lookup::HitProbe: {
      const NeighEntry* e = neigh_.find(ip);
      out_len = write_request(*e, true, out);
      return Resolve::ReadyProbe;
    }
    case NeighCache::Lookup::Miss: {
      const NeighEntry* e = neigh_.find(ip);
      out_len = write_request(*e, false, out);
      return Resolve::Request;
    }
    case NeighCache::Lookup::Pending: return Resolve::Pending;
    case NeighCache::Lookup::Failed: return Resolve::Failed;
  }
  return Resolve::Failed;
}

uint32_t NetStack::poll_timers(uint64_t now, std::span<uint8_t> out) noexcept {
  if (out.size() < l2_len() + 40 + kNdWithLla) return 0;
  for (;;) {
    const NeighEntry* e = neigh_.next_due(now);
    if (e == nullptr) return 0;
    const uint32_t len = write_request(*e, e->state == NeighState::Stale, out);
    if (len != 0) return len;
  }
}

uint32_t NetStack::gratuitous_arp(size_t index, std::span<uint8_t> out) noexcept {
  if (index >= cfg_.ipv4.size()) return 0;
  const uint32_t ip = cfg_.ipv4[index];
  const uint32_t len = write_arp(out, kArpRequest, kBroadcast, ip, wire::MacAddr{}, ip);
  if (len != 0) ++ctr_.garp_sent;
  return len;
}

}  // namespace droce::netstack

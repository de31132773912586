// RoCEv2 frame headers, as they are on the wire (IBTA vol 1 ch. 9, annex A17).
//
//   | Ethernet (14) | [802.1Q (4)] | IPv4 (20) or IPv6 (40) | UDP (8, dport 4791) |
//   | BTH (12) | extension headers (by opcode) | payload | pad (0-3) | ICRC (4) |
//
// Every struct is trivially copyable with alignment 1 and a size asserted at
// compile time; multi-byte fields are big-endian (bigendian.h). 24-bit fields
// (PSN, QPN, MSN, source QP) are reached through mask accessors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "wire/bigendian.h"

namespace droce::wire {

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeIpv6 = 0x86DD;
inline constexpr uint16_t kEtherTypeVlan = 0x8100;
inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr size_t kIcrcSize = 4;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;

using MacAddr = std::array<uint8_t, 6>;
// A GID is an IPv6 address; IPv4 peers use the IPv4-mapped form ::ffff:a.b.c.d.
using Gid = std::array<uint8_t, 16>;

constexpr Gid gid_from_ipv4(uint32_t ip_host_order) noexcept {
  Gid g{};
  g[10] = 0xFF;
  g[11] = 0xFF;
  g[12] = static_cast<uint8_t>(ip_host_order >> 24);
  g[13] = static_cast<uint8_t>(ip_host_order >> 16);
  g[14] = static_cast<uint8_t>(ip_host_order >> 8);
  g[15] = static_cast<uint8_t>(ip_host_order);
  return g;
}
constexpr bool gid_is_ipv4_mapped(const Gid& g) noexcept {
  for (int i = 0; i < 10; ++i)
    if (g[i] != 0) return false;
  return g[10] == 0xFF && g[11] == 0xFF;
}
constexpr uint32_t gid_to_ipv4(const Gid& g) noexcept {
  return (uint32_t{g[12]} << 24) | (uint32_t{g[13]} << 16) | (uint32_t{g[14]} << 8) | g[15];
}

// Multicast on RoCEv2: the MGID is an IPv6 multicast address (ff00::/8) or an
// IPv4-mapped IPv4 multicast one (::ffff:224.0.0.0/100); packets to the group
// carry destination QPN 0xFFFFFF (IBTA 10.5.2.1) and go to the group's MAC.
inline constexpr uint32_t kMcastQpn = 0xFFFFFF;
constexpr bool gid_is_multicast(const Gid& g) noexcept {
  return g[0] == 0xFF || (gid_is_ipv4_mapped(g) && (g[12] & 0xF0) == 0xE0);
}
// The Ethernet address of a multicast group: 01:00:5e + the low 23 bits of an
// IPv4 group (RFC 1112 6.4), 33:33 + the low 32 bits of an IPv6 one (RFC 2464 7).
constexpr MacAddr multicast_mac(const Gid& g) noexcept {
  if (gid_is_ipv4_mapped(g)) return MacAddr{0x01, 0x00, 0x5E, static_cast<uint8_t>(g[13] & 0x7F), g[14], g[15]};
  return MacAddr{0x33, 0x33, g[12], g[13], g[14], g[15]};
}

struct EthHdr {
  MacAddr dst;
  MacAddr src;
  be16 ethertype;
};
static_assert(sizeof(EthHdr) == 14);

struct VlanTag {
  be16 tci;  // PCP(3) DEI(1) VID(12)
  be16 ethertype;
};
static_assert(sizeof(VlanTag) == 4);

struct Ipv4Hdr {
  uint8_t ver_ihl;
  uint8_t tos;  // DSCP(6) ECN(2)
  be16 total_len;
  be16 id;
  be16 frag_off;  // flags(3) offset(13)
  uint8_t ttl;
  uint8_t proto;
  be16 check;
  std::array<uint8_t, 4> src;
  std::array<uint8_t, 4> dst;

  uint8_t version() const noexcept { return ver_ihl >> 4; }
  uint8_t ihl() const noexcept { return ver_ihl & 0x0F; }
};
static_assert(sizeof(Ipv4Hdr) == 20);
inline constexpr uint16_t kIpv4FlagDF = 0x4000;
inline constexpr uint16_t kIpv4FlagMF = 0x2000;
inline constexpr uint16_t kIpv4OffsetMask = 0x1FFF;

struct Ipv6Hdr {
  be32 ver_tc_flow;  // version(4) traffic class(8) flow label(20)
  be16 payload_len;
  uint8_t next_header;
  uint8_t hop_limit;
  Gid src;
  Gid dst;

  uint8_t version() const noexcept { return static_cast<uint8_t>(ver_tc_flow.get() >> 28); }
  uint8_t traffic_class() const noexcept { return static_cast<uint8_t>(ver_tc_flow.get() >> 20); }
  uint32_t flow_label() const noexcept { return ver_tc_flow.get() & 0xFFFFF; }
};
static_assert(sizeof(Ipv6Hdr) == 40);

// ECN codepoints in the low two bits of the IPv4 TOS / IPv6 traffic class.
inline constexpr uint8_t kEcnMask = 0x03;
inline constexpr uint8_t kEcnNotEct = 0x00;
inline constexpr uint8_t kEcnEct1 = 0x01;
inline constexpr uint8_t kEcnEct0 = 0x02;
inline constexpr uint8_t kEcnCe = 0x03;

struct UdpHdr {
  be16 sport;
  be16 dport;
  be16 len;
  be16 check;
};
static_assert(sizeof(UdpHdr) == 8);

// Base Transport Header (IBTA 9.2).
struct Bth {
  uint8_t opcode;
  uint8_t flags;  // SE(1) M(1) PadCnt(2) TVer(4)
  be16 pkey;
  be32 fb_qpn;   // FECN(1) BECN(1) resv6 | DestQP(24)
  be32 a_psn;    // AckReq(1) resv7 | PSN(24)

  bool se() const noexcept { return flags & 0x80; }
  bool mig() const noexcept { return flags & 0x40; }
  uint8_t pad() const noexcept { return (flags >> 4) & 0x3; }
  uint8_t tver() const noexcept { return flags & 0x0F; }
  bool fecn() const noexcept { return fb_qpn.get() & 0x80000000u; }
  bool becn() const noexcept { return fb_qpn.get() & 0x40000000u; }
  uint8_t resv8a() const noexcept { return static_cast<uint8_t>(fb_qpn.get() >> 24); }
  uint32_t dqpn() const noexcept { return fb_qpn.get() & kMask24; }
  bool ackreq() const noexcept { return a_psn.get() & 0x80000000u; }
  uint8_t resv7() const noexcept { return static_cast<uint8_t>((a_psn.get() >> 24) & 0x7F); }
  uint32_t psn() const noexcept { return a_psn.get() & kMask24; }

  void set_flags(bool se_, bool mig_, uint8_t pad_, uint8_t tver_) noexcept {
    flags = static_cast<uint8_t>((se_ ? 0x80 : 0) | (mig_ ? 0x40 : 0) | ((pad_ & 3) << 4) | (tver_ & 0xF));
  }
  void set_fb_qpn(uint8_t resv8a_, uint32_t qpn) noexcept {
    fb_qpn.set((uint32_t{resv8a_} << 24) | (qpn & kMask24));
  }
  void set_a_psn(bool ackreq_, uint8_t resv7_, uint32_t psn_) noexcept {
    a_psn.set((ackreq_ ? 0x80000000u : 0u) | (uint32_t{resv7_ & 0x7Fu} << 24) | (psn_ & kMask24));
  }
};
static_assert(sizeof(Bth) == 12);
inline constexpr uint8_t kBthFecn = 0x80;  // in resv8a
inline constexpr uint8_t kBthBecn = 0x40;

// RDMA Extended Transport Header (9.3.3).
struct Reth {
  be64 va;
  be32 rkey;
  be32 dma_len;
};
static_assert(sizeof(Reth) == 16);

// ACK Extended Transport Header (9.3.5): syndrome(8) | MSN(24).
struct Aeth {
  be32 syn_msn;
  uint8_t syndrome() const noexcept { return static_cast<uint8_t>(syn_msn.get() >> 24); }
  uint32_t msn() const noexcept { return syn_msn.get() & kMask24; }
  void set(uint8_t syndrome, uint32_t msn) noexcept {
    syn_msn.set((uint32_t{syndrome} << 24) | (msn & kMask24));
  }
};
static_assert(sizeof(Aeth) == 4);

// AETH syndrome encoding (9.7.5.2.1): bits 6-5 select the kind.
inline constexpr uint8_t kAethKindMask = 0x60;
inline constexpr uint8_t kAethAck = 0x00;       // low 5 bits: credit count
inline constexpr uint8_t kAethRnrNak = 0x20;    // low 5 bits: RNR timer code
inline constexpr uint8_t kAethNak = 0x60;       // low 5 bits: NAK code
inline constexpr uint8_t kAethCreditInvalid = 0x1F;
inline constexpr uint8_t kNakPsnSeqError = 0;
inline constexpr uint8_t kNakInvalidRequest = 1;
inline constexpr uint8_t kNakRemoteAccessError = 2;
inline constexpr uint8_t kNakRemoteOperationalError = 3;
inline constexpr uint8_t kNakInvalidRdRequest = 4;

// Atomic Extended Transport Header (9.3.4).
struct AtomicEth {
  be64 va;
  be32 rkey;
  be64 swap_add;
  be64 compare;
};
static_assert(sizeof(AtomicEth) == 28);

// Atomic Acknowledge Extended Transport Header (9.3.6).
struct AtomicAckEth {
  be64 orig;
};
static_assert(sizeof(AtomicAckEth) == 8);

// Datagram Extended Transport Header (9.3.2): Q_Key | resv8 SrcQP(24).
struct Deth {
  be32 qkey;
  be32 sqpn_word;
  uint32_t sqpn() const noexcept { return sqpn_word.get() & kMask24; }
  uint8_t resv8() const noexcept { return static_cast<uint8_t>(sqpn_word.get() >> 24); }
};
static_assert(sizeof(Deth) == 8);

struct ImmDt {
  be32 imm;  // carried opaquely; ibverbs hands it to the user in network order
};
static_assert(sizeof(ImmDt) == 4);

struct Ieth {
  be32 rkey;
};
static_assert(sizeof(Ieth) == 4);

// RoCEv2 Congestion Notification Packet (annex A17.9.2): BTH opcode 0x81
// (FECN/BECN clear, dest QP = the QP to slow down), then 16 reserved bytes
// (zero on transmit, ignored on receive), then the ICRC.
struct CnpBody {
  uint8_t reserved[16];
};
static_assert(sizeof(CnpBody) == 16);
inline constexpr size_t kCnpReservedBytes = sizeof(CnpBody);

static_assert(std::is_trivially_copyable_v<Ipv6Hdr> && std::is_trivially_copyable_v<Bth> &&
              std::is_trivially_copyable_v<AtomicEth>);

// Largest Ethernet+VLAN+IP+UDP+BTH+extension header stack we ever build.
inline constexpr size_t kMaxExtHeaderBytes = sizeof(Reth) + sizeof(ImmDt) + sizeof(Deth) + sizeof(AtomicEth);
inline constexpr size_t kMaxHeaderBytes =
    sizeof(EthHdr) + sizeof(VlanTag) + sizeof(Ipv6Hdr) + sizeof(UdpHdr) + sizeof(Bth) + kMaxExtHeaderBytes;

}  // namespace droce::wire

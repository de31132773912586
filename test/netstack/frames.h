// Hand-built frames for the netstack tests, written byte by byte here (not
// with the code under test), with an independent checksum.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "wire/headers.h"

namespace droce::test {

using Bytes = std::vector<uint8_t>;

inline void put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
// push_back, not insert: GCC 12 -O3 warns falsely (-Warray-bounds) on small inserts.
inline void put(Bytes& b, std::initializer_list<uint8_t> v) {
  for (uint8_t x : v) b.push_back(x);
}
template <typename C>
void put(Bytes& b, const C& c) {
  for (uint8_t x : c) b.push_back(x);
}
inline uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

// RFC 1071, straightforward.
inline uint16_t inet_csum(const Bytes& b, size_t off, size_t len, uint32_t start = 0) {
  uint32_t sum = start;
  for (size_t i = 0; i < len; i += 2) {
    uint32_t w = uint32_t{b[off + i]} << 8;
    if (i + 1 < len) w |= b[off + i + 1];
    sum += w;
    sum = (sum & 0xFFFF) + (sum >> 16);
  }
  return static_cast<uint16_t>(~sum & 0xFFFF);
}

inline uint32_t pseudo6(const wire::Gid& s, const wire::Gid& d, uint32_t len, uint8_t nh) {
  uint32_t sum = 0;
  for (int i = 0; i < 16; i += 2) sum += (uint32_t{s[i]} << 8 | s[i + 1]) + (uint32_t{d[i]} << 8 | d[i + 1]);
  sum += (len >> 16) + (len & 0xFFFF) + nh;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return sum;
}

inline Bytes eth(const wire::MacAddr& dst, const wire::MacAddr& src, uint16_t type, int vlan = -1) {
  Bytes b;
  put(b, dst);
  put(b, src);
  if (vlan >= 0) {
    put16(b, 0x8100);
    put16(b, static_cast<uint16_t>(vlan));
  }
  put16(b, type);
  return b;
}

inline Bytes arp(const wire::MacAddr& eth_dst, uint16_t op, const wire::MacAddr& sha, uint32_t spa,
                 const wire::MacAddr& tha, uint32_t tpa, int vlan = -1) {
  Bytes b = eth(eth_dst, sha, 0x0806, vlan);
  put16(b, 1);
  put16(b, 0x0800);
  put(b, {6, 4});
  put16(b, op);
  put(b, sha);
  put16(b, static_cast<uint16_t>(spa >> 16));
  put16(b, static_cast<uint16_t>(spa));
  put(b, tha);
  put16(b, static_cast<uint16_t>(tpa >> 16));
  put16(b, static_cast<uint16_t>(tpa));
  return b;
}

// IPv4 packet carrying `l4` (protocol proto), checksums filled.
inline Bytes ipv4(const wire::MacAddr& dmac, const wire::MacAddr& smac, uint32_t src, uint32_t dst, uint8_t proto,
                  const Bytes& l4, uint16_t frag = 0x4000, int vlan = -1) {
  Bytes b = eth(dmac, smac, 0x0800, vlan);
  const size_t ip = b.size();
  put(b, {0x45, 0});
  put16(b, static_cast<uint16_t>(20 + l4.size()));
  put16(b, 0x1234);
  put16(b, frag);
  put(b, {64, proto, 0, 0});
  for (uint32_t a : {src, dst}) {
    put16(b, static_cast<uint16_t>(a >> 16));
    put16(b, static_cast<uint16_t>(a));
  }
  const uint16_t c = inet_csum(b, ip, 20);
  b[ip + 10] = static_cast<uint8_t>(c >> 8);
  b[ip + 11] = static_cast<uint8_t>(c);
  put(b, l4);
  return b;
}

inline Bytes icmp_echo(uint8_t type, uint16_t id, uint16_t seq, size_t payload) {
  Bytes m{type, 0, 0, 0};
  put16(m, id);
  put16(m, seq);
  for (size_t i = 0; i < payload; ++i) m.push_back(static_cast<uint8_t>(i * 3));
  const uint16_t c = inet_csum(m, 0, m.size());
  m[2] = static_cast<uint8_t>(c >> 8);
  m[3] = static_cast<uint8_t>(c);
  return m;
}

inline Bytes udp(uint16_t sport, uint16_t dport, size_t payload) {
  Bytes u;
  put16(u, sport);
  put16(u, dport);
  put16(u, static_cast<uint16_t>(8 + payload));
  put16(u, 0);
  u.resize(8 + payload, 0xAB);
  return u;
}

// IPv6 packet with an ICMPv6 message (checksum filled unless keep_csum).
inline Bytes ipv6(const wire::MacAddr& dmac, const wire::MacAddr& smac, const wire::Gid& src, const wire::Gid& dst,
                  uint8_t nh, Bytes msg, uint8_t hop = 255, int vlan = -1, bool fill_csum = true) {
  if (nh == 58 && fill_csum) {
    msg[2] = msg[3] = 0;
    const uint16_t c = inet_csum(msg, 0, msg.size(), pseudo6(src, dst, static_cast<uint32_t>(msg.size()), 58));
    msg[2] = static_cast<uint8_t>(c >> 8);
    msg[3] = static_cast<uint8_t>(c);
  }
  Bytes b = eth(dmac, smac, 0x86DD, vlan);
  put(b, {0x60, 0, 0, 0});
  put16(b, static_cast<uint16_t>(msg.size()));
  put(b, {nh, hop});
  put(b, src);
  put(b, dst);
  put(b, msg);
  return b;
}

// NS (135) or NA (136) with an optional link-layer address option.
inline Bytes nd(uint8_t type, uint8_t flags, const wire::Gid& target, const wire::MacAddr* lla) {
  Bytes m{type, 0, 0, 0, flags, 0, 0, 0};
  put(m, target);
  if (lla != nullptr) {
    m.push_back(type == 135 ? 1 : 2);
    m.push_back(1);
    put(m, *lla);
  }
  return m;
}

}  // namespace droce::test

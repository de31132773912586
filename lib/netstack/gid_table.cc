#include "netstack/gid_table.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

namespace droce::netstack {

wire::Gid link_local_from_mac(const wire::MacAddr& mac) noexcept {
  // RFC 4291 appendix A: flip the universal/local bit, insert ff:fe.
  wire::Gid g{};
  g[0] = 0xfe;
  g[1] = 0x80;
  g[8] = mac[0] ^ 0x02;
  g[9] = mac[1];
  g[10] = mac[2];
  g[11] = 0xff;
  g[12] = 0xfe;
  g[13] = mac[3];
  g[14] = mac[4];
  g[15] = mac[5];
  return g;
}

uint64_t node_guid_from_mac(const wire::MacAddr& m) noexcept {
  const uint8_t b[8] = {static_cast<uint8_t>(m[0] ^ 2), m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]};
  uint64_t g = 0;
  for (uint8_t x : b) g = g << 8 | x;
  return g;
}

wire::Gid solicited_node(const wire::Gid& addr) noexcept {
  wire::Gid g{};
  g[0] = 0xff;
  g[1] = 0x02;
  g[11] = 0x01;
  g[12] = 0xff;
  g[13] = addr[13];
  g[14] = addr[14];
  g[15] = addr[15];
  return g;
}

bool is_ipv6_multicast(const wire::Gid& a) noexcept { return a[0] == 0xff; }

std::string gid_to_string(const wire::Gid& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (wire::gid_is_ipv4_mapped(g)) {
    inet_ntop(AF_INET, g.data() + 12, buf, sizeof buf);
  } else {
    inet_ntop(AF_INET6, g.data(), buf, sizeof buf);
  }
  return buf;
}

std::optional<wire::Gid> parse_ip(const std::string& s) {
  wire::Gid g{};
  uint8_t v4[4];
  if (inet_pton(AF_INET, s.c_str(), v4) == 1) {
    g[10] = g[11] = 0xff;
    std::memcpy(g.data() + 12, v4, 4);
    return g;
  }
  if (inet_pton(AF_INET6, s.c_str(), g.data()) == 1) return g;
  return std::nullopt;
}

GidTable::GidTable(const wire::MacAddr& mac, const std::vector<uint32_t>& ipv4, const std::vector<wire::Gid>& ipv6) {
  auto add = [this](const wire::Gid& g) {
    if (index_of(g) < 0) gids_.push_back(g);
  };
  add(link_local_from_mac(mac));
  for (uint32_t ip : ipv4) add(wire::gid_from_ipv4(ip));
  for (const auto& g : ipv6) add(g);
}

int GidTable::index_of(const wire::Gid& g) const noexcept {
  const auto it = std::find(gids_.begin(), gids_.end(), g);
  return it == gids_.end() ? -1 : static_cast<int>(it - gids_.begin());
}

}  // namespace droce::netstack

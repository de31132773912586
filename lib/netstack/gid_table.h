// The GID table of a RoCEv2 port, derived from its configured addresses and
// numbered as Linux Soft-RoCE (rxe, RoCEv2 only) numbers it:
//   index 0   fe80::/64 link-local from the MAC (modified EUI-64), the default GID
//   index 1.. one ::ffff:a.b.c.d IPv4-mapped GID per IPv4 address, in order
//   then      the IPv6 addresses, in order (duplicates of earlier entries skipped)
// so `-x 1` (perftest's GID index) means the first IPv4 address, as on rxe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "wire/headers.h"

namespace droce::netstack {

wire::Gid link_local_from_mac(const wire::MacAddr& mac) noexcept;
// The node GUID of a RoCE device with this MAC (host value): its EUI-64, as
// the kernel derives it (ibv_query_device shows it big-endian).
uint64_t node_guid_from_mac(const wire::MacAddr& mac) noexcept;
// Solicited-node multicast address ff02::1:ffXX:XXXX of an IPv6 address.
wire::Gid solicited_node(const wire::Gid& addr) noexcept;
bool is_ipv6_multicast(const wire::Gid& a) noexcept;
std::string gid_to_string(const wire::Gid& g);
// Parses an IPv6 address or a dotted IPv4 address (returned IPv4-mapped).
std::optional<wire::Gid> parse_ip(const std::string& s);

class GidTable {
 public:
  GidTable() = default;
  GidTable(const wire::MacAddr& mac, const std::vector<uint32_t>& ipv4, const std::vector<wire::Gid>& ipv6);

  size_t size() const noexcept { return gids_.size(); }
  const wire::Gid& at(size_t index) const { return gids_.at(index); }
  const std::vector<wire::Gid>& all() const noexcept { return gids_; }
  // Index of a GID in the table, or -1.
  int index_of(const wire::Gid& g) const noexcept;

 private:
  std::vector<wire::Gid> gids_;
};

}  // namespace droce::netstack

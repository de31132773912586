// RDMA CM service IDs and the CMA private-data header (Linux cma.c's
// struct cma_hdr): version, IP version in the high nibble, source port
// (big-endian), source and destination addresses of 16 bytes each (IPv4:
// 12 zero bytes, then the address).
#include "cm/cma.h"

#include <cstring>

namespace droce::cm {

bool parse_service_id(uint64_t sid, PortSpace& ps, uint16_t& port) noexcept {
  if ((sid >> 32) != 0) return false;
  const auto space = static_cast<uint16_t>(sid >> 16);
  switch (static_cast<PortSpace>(space)) {
    case PortSpace::Ipoib:
    case PortSpace::Tcp:
    case PortSpace::Udp:
    case PortSpace::Ib:
      ps = static_cast<PortSpace>(space);
      port = static_cast<uint16_t>(sid);
      return true;
  }
  return false;
}

namespace {

constexpr size_t kSrcOff = 4, kDstOff = 20, kAddrSize = 16;

void read_addr(const uint8_t* p, uint8_t ip_version, wire::Gid& g) noexcept {
  if (ip_version == 4) {
    g = wire::Gid{};
    g[10] = 0xff;
    g[11] = 0xff;
    std::memcpy(g.data() + 12, p + 12, 4);
  } else {
    std::memcpy(g.data(), p, kAddrSize);
  }
}

void write_addr(uint8_t* p, uint8_t ip_version, const wire::Gid& g) noexcept {
  if (ip_version == 4) {
    std::memset(p, 0, 12);
    std::memcpy(p + 12, g.data() + 12, 4);
  } else {
    std::memcpy(p, g.data(), kAddrSize);
  }
}

}  // namespace

bool decode_cma_hdr(std::span<const uint8_t> pdata, CmaHdr& h) noexcept {
  if (pdata.size() < kCmaHdrSize) return false;
  const uint8_t* p = pdata.data();
  const uint8_t version = p[0];
  const uint8_t ipv = p[1] >> 4;
  if (version != 0 || (ipv != 4 && ipv != 6)) return false;
  h.version = version;
  h.ip_version = ipv;
  h.src_port = static_cast<uint16_t>((p[2] << 8) | p[3]);
  read_addr(p + kSrcOff, ipv, h.src);
  read_addr(p + kDstOff, ipv, h.dst);
  return true;
}

void encode_cma_hdr(std::span<uint8_t> out, const CmaHdr& h) noexcept {
  if (out.size() < kCmaHdrSize) return;
  uint8_t* p = out.data();
  p[0] = h.version;
  p[1] = static_cast<uint8_t>(h.ip_version << 4);
  p[2] = static_cast<uint8_t>(h.src_port >> 8);
  p[3] = static_cast<uint8_t>(h.src_port);
  write_addr(p + kSrcOff, h.ip_version, h.src);
  write_addr(p + kDstOff, h.ip_version, h.dst);
}

}  // namespace droce::cm

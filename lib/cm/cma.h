// RDMA CM conventions on top of the IB CM (Linux drivers/infiniband/core/cma.c):
// service IDs from port spaces, the CMA private-data header that REQ and
// SIDR_REQ carry before the program's own private data. Pure code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/headers.h"

namespace droce::cm {

enum class PortSpace : uint16_t { Ipoib = 0x0002, Tcp = 0x0106, Udp = 0x0111, Ib = 0x013f };

// (port space << 16) | port.
constexpr uint64_t service_id(PortSpace ps, uint16_t port) noexcept {
  return (uint64_t{static_cast<uint16_t>(ps)} << 16) | port;
}
// True (and ps/port set) when sid is an RDMA CM IP service ID of a known space.
bool parse_service_id(uint64_t sid, PortSpace& ps, uint16_t& port) noexcept;

constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY: UD ids of RDMA_PS_UDP/IPOIB
constexpr size_t kCmaHdrSize = 36;
// Private data a program may put in a REQ / SIDR_REQ after the CMA header.
constexpr size_t kReqUserPrivate = 92 - kCmaHdrSize;       // 56
constexpr size_t kSidrReqUserPrivate = 216 - kCmaHdrSize;  // 180

struct CmaHdr {
  uint8_t version = 0;
  uint8_t ip_version = 4;  // 4 or 6 (the high nibble on the wire)
  uint16_t src_port = 0;
  // Addresses as GIDs: IPv4 as ::ffff:a.b.c.d (on the wire: 12 zero bytes + the address).
  wire::Gid src{};
  wire::Gid dst{};
  friend bool operator==(const CmaHdr&, const CmaHdr&) = default;
};
// False if the header is malformed (short, version != 0, IP version not 4/6).
bool decode_cma_hdr(std::span<const uint8_t> pdata, CmaHdr& h) noexcept;
void encode_cma_hdr(std::span<uint8_t> out, const CmaHdr& h) noexcept;

}  // namespace droce::cm

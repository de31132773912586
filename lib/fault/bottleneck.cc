#include "fault/bottleneck.h"

#include "wire/packet.h"

namespace droce::fault {

bool mark_ce(uint8_t* f, uint32_t len) noexcept {
  if (len < 14) return false;
  uint16_t et = static_cast<uint16_t>((f[12] << 8) | f[13]);
  uint32_t off = 14;
  if (et == wire::kEtherTypeVlan) {
    if (len < 18) return false;
    et = static_cast<uint16_t>((f[16] << 8) | f[17]);
    off = 18;
  }
  uint8_t* p = f + off;
  if (et == wire::kEtherTypeIpv6) {
    if (len < off + 40) return false;
    // Traffic class straddles bytes 0 and 1: ECN is bits 5..4 of byte 1.
    if (((p[1] >> 4) & 3) == wire::kEcnNotEct) return false;
    p[1] |= 0x30;
    return true;
  }
  if (et != wire::kEtherTypeIpv4 || len < off + 20) return false;
  if ((p[1] & 3) == wire::kEcnNotEct) return false;
  p[1] |= 3;
  // Recompute the header checksum as a router would (TOS is masked in the ICRC).
  p[10] = p[11] = 0;
  const uint16_t cs = wire::ipv4_checksum(p, size_t{p[0] & 0x0Fu} * 4);
  p[10] = static_cast<uint8_t>(cs >> 8);
  p[11] = static_cast<uint8_t>(cs);
  return true;
}

}  // namespace droce::fault

#include "nvmf/namespace.h"

#include <cstring>
#include <stdexcept>

namespace droce::nvmf {

namespace {
// A stable 128-bit identifier from the NQN and NSID (FNV-1a, two lanes), so a
// namespace keeps its identity across restarts without configuration; a UUID
// gets the version 4 / variant 1 bits.
std::array<uint8_t, 16> derive_id(const std::string& nqn, uint32_t nsid, uint64_t salt) {
  uint64_t h[2] = {0xcbf29ce484222325ull ^ salt, 0x84222325cbf29ce4ull ^ (salt * 31)};
  auto mix = [&](uint8_t c) {
    for (auto& x : h) x = (x ^ c) * 0x100000001b3ull;
  };
  for (char c : nqn) mix(static_cast<uint8_t>(c));
  for (int i = 0; i < 4; ++i) mix(static_cast<uint8_t>(nsid >> (8 * i)));
  h[1] ^= h[0] >> 17;
  std::array<uint8_t, 16> id{};
  for (int i = 0; i < 8; ++i) {
    id[i] = static_cast<uint8_t>(h[0] >> (8 * i));
    id[8 + i] = static_cast<uint8_t>(h[1] >> (8 * i));
  }
  return id;
}
bool all_zero(const std::array<uint8_t, 16>& a) {
  for (uint8_t x : a)
    if (x) return false;
  return true;
}
}  // namespace

std::unique_ptr<Namespace> Namespace::ram(const NamespaceConfig& c, const std::string& subnqn) {
  if (c.nsid == 0 || c.nsid == 0xffffffffu) throw std::invalid_argument("namespace nsid: must be 1..0xfffffffe");
  if (c.block_size != 512 && c.block_size != 4096)
    throw std::invalid_argument("namespace " + std::to_string(c.nsid) + " block_size: must be 512 or 4096");
  if (c.size_bytes == 0 || c.size_bytes % c.block_size)
    throw std::invalid_argument("namespace " + std::to_string(c.nsid) + " size: must be a positive multiple of block_size");
  std::unique_ptr<Namespace> n(new Namespace);
  n->nsid_ = c.nsid;
  n->shift_ = c.block_size == 512 ? 9 : 12;
  n->blocks_ = c.size_bytes / c.block_size;
  n->uuid_ = all_zero(c.uuid) ? derive_id(subnqn, c.nsid, 1) : c.uuid;
  if (all_zero(c.uuid)) {
    n->uuid_[6] = static_cast<uint8_t>((n->uuid_[6] & 0x0f) | 0x40);
    n->uuid_[8] = static_cast<uint8_t>((n->uuid_[8] & 0x3f) | 0x80);
  }
  n->nguid_ = all_zero(c.nguid) ? derive_id(subnqn, c.nsid, 2) : c.nguid;
  n->mem_.reset(new uint8_t[c.size_bytes]());  // zero-filled
  return n;
}

void Namespace::read(uint64_t slba, std::span<uint8_t> out) const noexcept {
  std::memcpy(out.data(), mem_.get() + (slba << shift_), out.size());
}

void Namespace::write(uint64_t slba, std::span<const uint8_t> in) noexcept {
  std::memcpy(mem_.get() + (slba << shift_), in.data(), in.size());
}

void Namespace::zero(uint64_t slba, uint64_t nlb) noexcept {
  std::memset(mem_.get() + (slba << shift_), 0, nlb << shift_);
}

}  // namespace droce::nvmf

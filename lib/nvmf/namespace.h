// A namespace of an NVM subsystem: NSID, LBA format, identifiers, and its
// backend. The RAM disk is the first backend (plain memory, usable from any
// core: the NVMe ordering rules leave overlapping commands unordered); a file
// backend over io_uring (one ring per core) comes with the RDMA glue.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "nvmf/identify.h"
#include "nvmf/spec.h"

namespace droce::nvmf {

struct NamespaceConfig {
  uint32_t nsid = 1;
  uint32_t block_size = 512;   // 512 or 4096
  uint64_t size_bytes = 0;     // a multiple of block_size, > 0
  std::array<uint8_t, 16> uuid{};   // zero: derived from (subsystem NQN, NSID)
  std::array<uint8_t, 16> nguid{};  // zero: derived likewise
};

class Namespace {
 public:
  // A RAM disk, zero-filled. Throws std::invalid_argument naming the bad field.
  static std::unique_ptr<Namespace> ram(const NamespaceConfig& c, const std::string& subnqn);

  uint32_t nsid() const noexcept { return nsid_; }
  uint32_t block_size() const noexcept { return 1u << shift_; }
  uint8_t lba_shift() const noexcept { return shift_; }
  uint64_t blocks() const noexcept { return blocks_; }
  const std::array<uint8_t, 16>& uuid() const noexcept { return uuid_; }
  const std::array<uint8_t, 16>& nguid() const noexcept { return nguid_; }
  NsIdentity identity() const noexcept { return {blocks_, shift_, 0x09, nguid_}; }

  // True when [slba, slba + nlb) lies inside the namespace (no overflow).
  bool in_range(uint64_t slba, uint64_t nlb) const noexcept { return nlb <= blocks_ && slba <= blocks_ - nlb; }
  // Callers check the range first; out.size() / in.size() == nlb << lba_shift.
  void read(uint64_t slba, std::span<uint8_t> out) const noexcept;
  void write(uint64_t slba, std::span<const uint8_t> in) noexcept;
  void zero(uint64_t slba, uint64_t nlb) noexcept;  // Write Zeroes, deallocate (reads zeroes after)

 private:
  Namespace() = default;
  uint32_t nsid_ = 0;
  uint8_t shift_ = 9;
  uint64_t blocks_ = 0;
  std::array<uint8_t, 16> uuid_{}, nguid_{};
  std::unique_ptr<uint8_t[]> mem_;
};

}  // namespace droce::nvmf

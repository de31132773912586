// Hugepage-backed memory for what the NIC reads and writes directly
// (registered memory regions, the MR table): a DPDK memzone, IOVA-contiguous
// when the EAL can provide it, with the IOVA of every byte known.
// Control path: the constructor throws PortError with the reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct rte_memzone;

namespace droce::dpdk {

class HugeRegion {
 public:
  // size bytes on NUMA socket `socket` (-1: any), aligned to `align`.
  HugeRegion(const std::string& name, size_t size, int socket = -1, size_t align = 4096);
  ~HugeRegion();
  HugeRegion(const HugeRegion&) = delete;
  HugeRegion& operator=(const HugeRegion&) = delete;

  uint8_t* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }
  int socket() const noexcept;
  bool iova_contiguous() const noexcept { return contiguous_; }
  // IOVA of data() + offset (offset < size()); O(1) when contiguous, else a
  // memseg lookup.
  uint64_t iova(size_t offset) const noexcept;

 private:
  const rte_memzone* mz_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool contiguous_ = false;
};

}  // namespace droce::dpdk

#include "dpdk/hugemem.h"

#include <rte_errno.h>
#include <rte_memory.h>
#include <rte_memzone.h>

#include "dpdk/port.h"

namespace droce::dpdk {

HugeRegion::HugeRegion(const std::string& name, size_t size, int socket, size_t align) : size_(size) {
  if (size == 0) throw PortError("memory region '" + name + "': size 0");
  if (name.size() >= RTE_MEMZONE_NAMESIZE) throw PortError("memory region '" + name + "': name too long");
  // IOVA-contiguous first (one IOVA base for the whole region), any layout otherwise.
  mz_ = rte_memzone_reserve_aligned(name.c_str(), size, socket, RTE_MEMZONE_IOVA_CONTIG, static_cast<unsigned>(align));
  contiguous_ = mz_ != nullptr;
  if (mz_ == nullptr) mz_ = rte_memzone_reserve_aligned(name.c_str(), size, socket, 0, static_cast<unsigned>(align));
  if (mz_ == nullptr)
    throw PortError("memory region '" + name + "' (" + std::to_string(size) + " B): " + rte_strerror(rte_errno));
  data_ = static_cast<uint8_t*>(mz_->addr);
}

HugeRegion::~HugeRegion() {
  if (mz_ != nullptr) rte_memzone_free(mz_);
}

int HugeRegion::socket() const noexcept { return mz_->socket_id; }

uint64_t HugeRegion::iova(size_t offset) const noexcept {
  if (contiguous_) return mz_->iova + offset;
  return rte_mem_virt2iova(data_ + offset);
}

}  // namespace droce::dpdk

#include "verbs/mr.h"

#include <cerrno>
#include <new>

#include "verbs/verbs.h"

namespace droce::verbs {

MrTable::MrTable(void* mem, size_t bytes) noexcept
    : entries_(static_cast<MrEntry*>(mem)),
      capacity_(static_cast<uint32_t>(bytes / sizeof(MrEntry) > (1u << 24) ? (1u << 24) : bytes / sizeof(MrEntry))) {
  if (reinterpret_cast<uintptr_t>(mem) % alignof(MrEntry) != 0) capacity_ = 0;
  // Index 0 is kept out of the free list so key 0 is never valid.
  for (uint32_t i = 0; i < capacity_; ++i) {
    new (&entries_[i]) MrEntry{};
    entries_[i].next_free = (i + 1 < capacity_) ? i + 2 : 0;
  }
  free_head_ = capacity_ > 1 ? 2 : 0;  // index 1
}

int MrTable::reg_iova(Pd pd, void* host, uint64_t iova, uint64_t length, uint32_t access,
                      uint32_t* key_out) noexcept {
  if (pd.handle == 0 || key_out == nullptr || (access & ~kAccessAll) != 0) return EINVAL;
  if (host == nullptr && length != 0) return EINVAL;
  if (iova + length < iova) return EINVAL;
  // ibverbs: remote write or atomic requires local write.
  if ((access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(access & kAccessLocalWrite)) return EINVAL;
  if (free_head_ == 0) return ENOMEM;
  const uint32_t idx = free_head_ - 1;
  MrEntry& e = entries_[idx];
  free_head_ = e.next_free;
  uint8_t tag = static_cast<uint8_t>(e.key + 1);
  if (tag == 0) tag = 1;
  e.host = static_cast<uint8_t*>(host);
  e.iova = iova;
  e.length = length;
  e.key = (idx << 8) | tag;
  e.access = access;
  e.pd = pd.handle;
  e.next_free = 0;
  e.dma = nullptr;
  e.state = 1;
  ++in_use_;
  *key_out = e.key;
  return 0;
}

int MrTable::dereg(uint32_t key) noexcept {
  const uint32_t idx = key >> 8;
  if (idx >= capacity_ || idx == 0) return EINVAL;
  MrEntry& e = entries_[idx];
  if (e.key != key || e.state == 0) return EINVAL;
  e.state = 0;
  e.host = nullptr;
  e.dma = nullptr;
  e.length = 0;
  e.next_free = free_head_;
  free_head_ = idx + 1;
  --in_use_;
  return 0;
}

bool MrTable::invalidate(uint32_t key, uint32_t pd) noexcept {
  const uint32_t idx = key >> 8;
  if (idx >= capacity_) return false;
  MrEntry& e = entries_[idx];
  if (e.key != key || e.state != 1 || e.pd != pd) return false;
  e.state = 2;
  return true;
}

}  // namespace droce::verbs

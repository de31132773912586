#include "verbs/mr.h"

#include <sys/random.h>

#include <cerrno>
#include <chrono>
#include <new>

#include "verbs/verbs.h"

namespace droce::verbs {

uint64_t random_seed() noexcept {
  uint64_t s = 0;
  // getrandom never fails for 8 bytes once the pool is initialised; fall back to
  // the clock rather than to a constant if it ever does.
  if (getrandom(&s, sizeof s, 0) != static_cast<ssize_t>(sizeof s) || s == 0)
    s = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) | 1;
  return s;
}

namespace {
uint64_t splitmix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

uint8_t MrTable::next_tag(uint8_t old) noexcept {
  for (;;) {
    const auto t = static_cast<uint8_t>(splitmix64(key_seed_ + key_count_++));
    if (t != 0 && t != old) return t;
  }
}

MrTable::MrTable(void* mem, size_t bytes, uint64_t key_seed) noexcept
    : entries_(static_cast<MrEntry*>(mem)),
      capacity_(static_cast<uint32_t>(bytes / sizeof(MrEntry) > (1u << 23) ? (1u << 23) : bytes / sizeof(MrEntry))),
      key_seed_(key_seed ? key_seed : random_seed()) {
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
  if (pd.handle == 0 || key_out == nullptr || (access & ~(kAccessAll | kAccessMwBind | kMrRemoteInvalidate)) != 0) return EINVAL;
  if (host == nullptr && length != 0) return EINVAL;
  if (iova + length < iova) return EINVAL;
  // ibverbs: remote write or atomic requires local write.
  if ((access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(access & kAccessLocalWrite)) return EINVAL;
  if (free_head_ == 0) return ENOMEM;
  const uint32_t idx = free_head_ - 1;
  MrEntry& e = entries_[idx];
  free_head_ = e.next_free;
  const uint8_t tag = next_tag(static_cast<uint8_t>(e.key));
  e.host = static_cast<uint8_t*>(host);
  e.iova = iova;
  e.length = length;
  e.key = (idx << 8) | tag;
  e.access = access & (kAccessAll | kAccessMwBind);
  e.remote_inv = (access & kMrRemoteInvalidate) != 0;
  e.pd = pd.handle;
  e.next_free = 0;
  e.dma = nullptr;
  e.mw_bound = 0;
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
  if (e.mw_bound != 0) return EBUSY;
  e.state = 0;
  e.host = nullptr;
  e.dma = nullptr;
  e.length = 0;
  e.next_free = free_head_;
  free_head_ = idx + 1;
  --in_use_;
  return 0;
}

bool MrTable::can_invalidate(uint32_t key, uint32_t pd) const noexcept {
  const uint32_t idx = key >> 8;
  if (idx >= capacity_) return false;
  const MrEntry& e = entries_[idx];
  return e.key == key && e.state == 1 && e.pd == pd && e.remote_inv;
}

bool MrTable::invalidate(uint32_t key, uint32_t pd) noexcept {
  if (!can_invalidate(key, pd)) return false;
  entries_[key >> 8].state = 2;
  return true;
}

}  // namespace droce::verbs

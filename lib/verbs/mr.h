// Protection domains and the memory-region table.
//
// The table is a fixed array of entries in a memory block the caller provides
// (the daemon gives hugepages; tests give a vector). A key is
//     key = (index << 8) | tag
// where tag is a fresh pseudo-random byte at each registration (never 0, never
// the slot's previous tag), so a stale key never matches a new registration and
// a peer cannot predict the next key from the last one. The tags come from a
// keyed stream (key_seed): tables given the same seed and the same sequence of
// reg/dereg calls hand out the same keys (the dataplane's per-core replicas of
// one port's table). lookup() is O(1): index, tag, state, PD, bounds
// (overflow-safe) and access rights. lkey == rkey. MR keys have bit 31 clear
// (at most 2^23 entries); memory windows (mw.h) have it set.
#pragma once

#include <cstddef>
#include <cstdint>

namespace droce::verbs {

struct Pd {
  uint32_t handle = 0;  // 0 is never a valid PD
};

enum class MrError : uint8_t { Ok = 0, BadKey, BadPd, OutOfBounds, NoAccess, Invalidated };

struct alignas(64) MrEntry {
  uint8_t* host = nullptr;  // where byte iova lives in this process
  uint64_t iova = 0;        // the address work requests use
  uint64_t length = 0;
  uint32_t key = 0;
  uint32_t access = 0;
  uint32_t pd = 0;
  uint32_t next_free = 0;  // free-list link (index + 1; 0 = end)
  uint8_t state = 0;       // 0 free, 1 valid, 2 invalidated
  bool remote_inv = false; // registered with kMrRemoteInvalidate: SEND with Invalidate may invalidate it
  void* dma = nullptr;     // the I/O backend's handle for zero-copy TX from this MR (or nullptr)
  uint32_t mw_bound = 0;   // memory windows bound to it (MwTable); dereg refuses while > 0
};
static_assert(sizeof(MrEntry) == 64);

// 64 random bits from the kernel (getrandom), never 0: seeds for keys and QPNs.
uint64_t random_seed() noexcept;

class MrTable {
 public:
  static constexpr size_t bytes_for(uint32_t entries) noexcept { return size_t{entries} * sizeof(MrEntry); }

  // mem must be 64-byte aligned; capacity = bytes / sizeof(MrEntry), at most 2^23.
  // key_seed: the key stream's seed; 0 = a random one (getrandom).
  MrTable(void* mem, size_t bytes, uint64_t key_seed = 0) noexcept;
  MrTable(const MrTable&) = delete;
  MrTable& operator=(const MrTable&) = delete;

  // Control path. Returns 0 and the key, or an errno (EINVAL, ENOMEM).
  int reg(Pd pd, void* addr, uint64_t length, uint32_t access, uint32_t* key_out) noexcept {
    return reg_iova(pd, addr, reinterpret_cast<uint64_t>(addr), length, access, key_out);
  }
  int reg_iova(Pd pd, void* host, uint64_t iova, uint64_t length, uint32_t access, uint32_t* key_out) noexcept;
  // 0, EINVAL (no such MR), EBUSY (memory windows are bound to it: IBTA
  // 10.6.7.2.6; unbind or deallocate them first).
  int dereg(uint32_t key) noexcept;
  // Remote invalidation (SEND with Invalidate). False, and the MR untouched, unless
  // key is a valid MR of pd registered with kMrRemoteInvalidate.
  bool can_invalidate(uint32_t key, uint32_t pd) const noexcept;
  bool invalidate(uint32_t key, uint32_t pd) noexcept;

  // Data path: pointer to the bytes [va, va+len) of MR `key` if pd matches and
  // every bit of `access` is granted; nullptr and *err otherwise. access 0 =
  // local read (always allowed).
  // dma (optional): the MR's zero-copy handle (set_dma), nullptr when none.
  uint8_t* lookup(uint32_t key, uint32_t pd, uint64_t va, uint64_t len, uint32_t access,
                  MrError* err, void** dma = nullptr) const noexcept {
    const uint32_t idx = key >> 8;
    if (idx >= capacity_) return fail(err, MrError::BadKey);
    const MrEntry& e = entries_[idx];
    if (e.key != key || e.state == 0) return fail(err, MrError::BadKey);
    if (e.state != 1) return fail(err, MrError::Invalidated);
    if (e.pd != pd) return fail(err, MrError::BadPd);
    // va - iova + len <= length, without overflow.
    if (va < e.iova || len > e.length || va - e.iova > e.length - len) return fail(err, MrError::OutOfBounds);
    if ((e.access & access) != access) return fail(err, MrError::NoAccess);
    if (dma) *dma = e.dma;
    return e.host + (va - e.iova);
  }
  // Control path: attaches the backend's zero-copy handle to a valid MR
  // (cleared by dereg). False if key is not a registered MR.
  bool set_dma(uint32_t key, void* dma) noexcept {
    const uint32_t idx = key >> 8;
    if (idx >= capacity_ || entries_[idx].key != key || entries_[idx].state == 0) return false;
    entries_[idx].dma = dma;
    return true;
  }

  // Control path: the registered MR with this key, or nullptr.
  const MrEntry* entry(uint32_t key) const noexcept {
    const uint32_t idx = key >> 8;
    if (idx >= capacity_ || entries_[idx].key != key || entries_[idx].state == 0) return nullptr;
    return &entries_[idx];
  }
  uint32_t capacity() const noexcept { return capacity_; }
  uint32_t in_use() const noexcept { return in_use_; }

 private:
  friend class MwTable;
  static uint8_t* fail(MrError* err, MrError e) noexcept {
    if (err) *err = e;
    return nullptr;
  }
  uint8_t next_tag(uint8_t old) noexcept;
  MrEntry* entries_;
  uint32_t capacity_;
  uint64_t key_seed_;
  uint64_t key_count_ = 0;
  uint32_t free_head_ = 0;  // index + 1
  uint32_t in_use_ = 0;
};

}  // namespace droce::verbs

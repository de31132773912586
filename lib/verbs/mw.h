// Memory windows (IBTA vol. 1 10.6.7, 9.4.x Bind / Invalidate): the MW table
// beside the MR table.
//
// A window is a remote-access key onto a range of an MR registered with
// kAccessMwBind, with its own rights (a subset of what the MR may grant). Its
// key is
//     key = kMwKeyBit | (index << 8) | key byte
// so one bit tells a window's rkey from an MR's (MR keys have bit 31 clear),
// and lookup_remote() stays O(1): a window costs one more entry read (the
// window, then its MR, whose key, state and bounds are checked again on every
// packet, so a window never reaches memory its MR no longer covers).
//
//  type 1: bound (and unbound, by a bind of length 0) with ibv_bind_mw, which
//          posts a bind work request; usable from any QP of its PD.
//  type 2: bound by an IBV_WR_BIND_MW work request to the QP that posted it,
//          usable only through that QP (another QP: remote access error);
//          invalidated by LOCAL_INV or by a SEND with Invalidate naming it.
// Binding sets the key byte the consumer chose (the index stays). Dealloc
// unbinds. An MR with windows bound cannot be deregistered (MrTable::dereg:
// EBUSY) unless the owner forces it (unbind_mr first: every window on it
// becomes invalid).
//
// Control path (alloc, dealloc, unbind_mr) and the work-request path (bind,
// invalidate) run on the table's owner thread, as the data path does; nothing
// here allocates after construction, locks or logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "verbs/mr.h"
#include "verbs/verbs.h"

namespace droce::verbs {

inline constexpr uint32_t kMwKeyBit = 1u << 31;
constexpr bool is_mw_key(uint32_t key) noexcept { return (key & kMwKeyBit) != 0; }

// enum ibv_mw_type
enum class MwType : uint8_t { Type1 = 1, Type2 = 2 };

enum class MwState : uint8_t { Free = 0, Unbound = 1, Bound = 2 };

struct alignas(64) MwEntry {
  uint64_t va = 0;       // bound range, in the MR's address space (iova)
  uint64_t length = 0;
  uint32_t key = 0;      // current rkey
  uint32_t pd = 0;
  uint32_t mr_key = 0;   // the MR it is bound to (Bound only)
  uint32_t access = 0;   // remote rights granted (kAccessRemote*)
  uint32_t qpn = 0;      // type 2: the QP it is bound to
  uint32_t next_free = 0;
  MwState state = MwState::Free;
  MwType type = MwType::Type1;
};
static_assert(sizeof(MwEntry) == 64);

class MwTable {
 public:
  // capacity windows (at most 2^23); key_seed as MrTable's (0 = random):
  // replicas given the same seed and calls hand out the same keys.
  MwTable(MrTable& mrs, uint32_t capacity, uint64_t key_seed = 0);
  MwTable(const MwTable&) = delete;
  MwTable& operator=(const MwTable&) = delete;

  // ibv_alloc_mw: 0 and the key, EINVAL (bad PD or type), ENOMEM.
  int alloc(Pd pd, MwType type, uint32_t* key_out) noexcept;
  // ibv_dealloc_mw: unbinds (the MR's count drops) and frees. 0 or EINVAL.
  int dealloc(uint32_t key) noexcept;
  // The current key of the allocated window with key's index (binds change
  // its key byte), 0 if none: for callers that hold the key alloc() gave.
  uint32_t current_key(uint32_t key) const noexcept;

  // A bind work request of QP qpn (PD pd), as the requester executes it. The
  // window is named by the index of wr.bind.mw_rkey (its key byte is not
  // checked). WcStatus::Success, or MwBindErr for anything the bind rules
  // refuse (unknown window or MR, other PD, wrong type for the way it was posted,
  // type 2 not free, new key of another index, range outside the MR, rights
  // the MR cannot give, MR without kAccessMwBind, zero-based access).
  WcStatus bind(uint32_t pd, uint32_t qpn, const SendWr& wr) noexcept;
  // LOCAL_INV / SEND with Invalidate of a window: only a bound type 2 window
  // of pd. qpn: the QP the invalidation arrives on (remote) or is posted on
  // (local); any QP of the PD may invalidate (as rxe). True when done.
  bool can_invalidate(uint32_t key, uint32_t pd) const noexcept;
  bool invalidate(uint32_t key, uint32_t pd) noexcept;
  // Control path, O(capacity): every window bound to MR mr_key becomes
  // unbound (before a forced deregistration). Returns how many.
  uint32_t unbind_mr(uint32_t mr_key) noexcept;

  // Remote access through an rkey (RETH / AtomicETH), O(1): an MR key goes to
  // MrTable::lookup; a window key checks the window (state, PD, QP for type 2,
  // range, rights), then its MR (key, state, PD, range) for the host address.
  uint8_t* lookup_remote(uint32_t key, uint32_t pd, uint32_t qpn, uint64_t va, uint64_t len, uint32_t access,
                         MrError* err, void** dma = nullptr) const noexcept {
    if (!is_mw_key(key)) return mrs_.lookup(key, pd, va, len, access, err, dma);
    const uint32_t idx = (key >> 8) & 0x7FFFFF;
    if (idx >= capacity_) return fail(err, MrError::BadKey);
    const MwEntry& w = entries_[idx];
    if (w.key != key || w.state == MwState::Free) return fail(err, MrError::BadKey);
    if (w.state != MwState::Bound) return fail(err, MrError::Invalidated);
    if (w.pd != pd || (w.type == MwType::Type2 && w.qpn != qpn)) return fail(err, MrError::BadPd);
    if (va < w.va || len > w.length || va - w.va > w.length - len) return fail(err, MrError::OutOfBounds);
    if ((w.access & access) != access) return fail(err, MrError::NoAccess);
    // The window's rights stand for the MR's (checked at bind); the MR itself
    // must still be the one bound, valid and covering the range.
    return mrs_.lookup(w.mr_key, pd, va, len, 0, err, dma);
  }

  const MwEntry* find(uint32_t key) const noexcept {
    const uint32_t idx = (key >> 8) & 0x7FFFFF;
    if (!is_mw_key(key) || idx >= capacity_) return nullptr;
    const MwEntry& w = entries_[idx];
    return (w.key == key && w.state != MwState::Free) ? &w : nullptr;
  }
  uint32_t capacity() const noexcept { return capacity_; }
  uint32_t in_use() const noexcept { return in_use_; }

 private:
  static uint8_t* fail(MrError* err, MrError e) noexcept {
    if (err) *err = e;
    return nullptr;
  }
  MwEntry* entry(uint32_t key) noexcept { return const_cast<MwEntry*>(find(key)); }
  void detach(MwEntry& w) noexcept;  // drops its MR's count, state Unbound
  uint8_t next_tag(uint8_t old) noexcept;

  MrTable& mrs_;
  std::unique_ptr<MwEntry[]> entries_;
  uint32_t capacity_;
  uint64_t key_seed_;
  uint64_t key_count_ = 0;
  uint32_t free_head_ = 0;  // index + 1
  uint32_t in_use_ = 0;
};

}  // namespace droce::verbs

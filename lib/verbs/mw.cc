#include "verbs/mw.h"

#include <cerrno>

namespace droce::verbs {

namespace {
uint64_t mix(uint64_t x) noexcept {  // splitmix64, as the MR table's key stream
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// ibv_access_flags a bind may carry: the remote rights, and local write (which
// rxe and rdma-core's tests pass and a window ignores). IBV_ACCESS_ZERO_BASED
// (0x20) windows are not offered.
constexpr uint32_t kBindAccess = kAccessAll;
}  // namespace

MwTable::MwTable(MrTable& mrs, uint32_t capacity, uint64_t key_seed)
    : mrs_(mrs),
      entries_(new MwEntry[capacity > (1u << 23) ? (1u << 23) : capacity]()),
      capacity_(capacity > (1u << 23) ? (1u << 23) : capacity),
      key_seed_((key_seed ? key_seed : random_seed()) ^ 0x6D77u) {
  for (uint32_t i = 0; i < capacity_; ++i) entries_[i].next_free = (i + 1 < capacity_) ? i + 2 : 0;
  free_head_ = capacity_ ? 1 : 0;
}

uint8_t MwTable::next_tag(uint8_t old) noexcept {
  for (;;) {
    const auto t = static_cast<uint8_t>(mix(key_seed_ + key_count_++));
    if (t != 0 && t != old) return t;
  }
}

int MwTable::alloc(Pd pd, MwType type, uint32_t* key_out) noexcept {
  if (pd.handle == 0 || key_out == nullptr || (type != MwType::Type1 && type != MwType::Type2)) return EINVAL;
  if (free_head_ == 0) return ENOMEM;
  const uint32_t idx = free_head_ - 1;
  MwEntry& w = entries_[idx];
  free_head_ = w.next_free;
  const uint8_t tag = next_tag(static_cast<uint8_t>(w.key));
  w = MwEntry{};
  w.key = kMwKeyBit | (idx << 8) | tag;
  w.pd = pd.handle;
  w.type = type;
  w.state = MwState::Unbound;
  ++in_use_;
  *key_out = w.key;
  return 0;
}

void MwTable::detach(MwEntry& w) noexcept {
  if (w.state == MwState::Bound) {
    const uint32_t mi = w.mr_key >> 8;
    if (mi < mrs_.capacity_) {
      MrEntry& m = mrs_.entries_[mi];
      if (m.key == w.mr_key && m.mw_bound) --m.mw_bound;
    }
  }
  w.state = MwState::Unbound;
  w.mr_key = 0;
  w.qpn = 0;
  w.va = w.length = 0;
  w.access = 0;
}

uint32_t MwTable::current_key(uint32_t key) const noexcept {
  const uint32_t idx = (key >> 8) & 0x7FFFFF;
  if (!is_mw_key(key) || idx >= capacity_ || entries_[idx].state == MwState::Free) return 0;
  return entries_[idx].key;
}

int MwTable::dealloc(uint32_t key) noexcept {
  MwEntry* w = entry(key);
  if (!w) return EINVAL;
  detach(*w);
  const uint32_t idx = (key >> 8) & 0x7FFFFF;
  w->state = MwState::Free;
  w->pd = 0;
  w->next_free = free_head_;
  free_head_ = idx + 1;
  --in_use_;
  return 0;
}

WcStatus MwTable::bind(uint32_t pd, uint32_t qpn, const SendWr& wr) noexcept {
  const auto& b = wr.bind;
  // The window is named by its index: a type 2 bind does not update the
  // consumer's ibv_mw.rkey, so its key byte may be an older one. The PD check
  // keeps a consumer to its own windows.
  const uint32_t idx = (b.mw_rkey >> 8) & 0x7FFFFF;
  if (!is_mw_key(b.mw_rkey) || idx >= capacity_ || entries_[idx].state == MwState::Free) return WcStatus::MwBindErr;
  MwEntry* w = &entries_[idx];
  if (w->pd != pd) return WcStatus::MwBindErr;  // C10-72: the QP's PD
  // Type 1 through ibv_bind_mw only, type 2 through a BIND_MW work request only.
  if (b.type1 != (w->type == MwType::Type1)) return WcStatus::MwBindErr;
  if ((b.new_rkey & ~0xFFu) != (w->key & ~0xFFu)) return WcStatus::MwBindErr;  // only the key byte changes
  if (b.access & ~kBindAccess) return WcStatus::MwBindErr;
  if (w->type == MwType::Type2 && (w->state != MwState::Unbound || b.length == 0))
    return WcStatus::MwBindErr;  // o10-37.2.30 (bound: invalidate first), o10-37.2.40
  const MrEntry* m = nullptr;
  if (b.length != 0) {
    const uint32_t mi = b.mr_lkey >> 8;
    if (is_mw_key(b.mr_lkey) || mi >= mrs_.capacity_) return WcStatus::MwBindErr;
    m = &mrs_.entries_[mi];
    if (m->key != b.mr_lkey || m->state != 1 || m->pd != pd) return WcStatus::MwBindErr;
    if (!(m->access & kAccessMwBind)) return WcStatus::MwBindErr;  // C10-73
    if ((b.access & (kAccessRemoteWrite | kAccessRemoteAtomic)) && !(m->access & kAccessLocalWrite))
      return WcStatus::MwBindErr;  // C10-74
    if (b.addr < m->iova || b.length > m->length || b.addr - m->iova > m->length - b.length)
      return WcStatus::MwBindErr;  // C10-75
  }
  detach(*w);  // a type 1 window may be bound again: its old binding ends here
  w->key = b.new_rkey;
  if (b.length == 0) return WcStatus::Success;  // type 1: unbound (no access through it)
  w->va = b.addr;
  w->length = b.length;
  w->access = b.access & kAccessRemoteAll;
  w->mr_key = b.mr_lkey;
  w->qpn = w->type == MwType::Type2 ? qpn : 0;
  w->state = MwState::Bound;
  ++mrs_.entries_[b.mr_lkey >> 8].mw_bound;
  return WcStatus::Success;
}

bool MwTable::can_invalidate(uint32_t key, uint32_t pd) const noexcept {
  const MwEntry* w = find(key);
  // o10-37.2.26: type 1 windows are not invalidated (only unbound by a bind).
  return w && w->type == MwType::Type2 && w->state == MwState::Bound && w->pd == pd;
}

bool MwTable::invalidate(uint32_t key, uint32_t pd) noexcept {
  if (!can_invalidate(key, pd)) return false;
  detach(*entry(key));
  return true;
}

uint32_t MwTable::unbind_mr(uint32_t mr_key) noexcept {
  uint32_t n = 0;
  for (uint32_t i = 0; i < capacity_; ++i) {
    MwEntry& w = entries_[i];
    if (w.state == MwState::Bound && w.mr_key == mr_key) {
      detach(w);
      ++n;
    }
  }
  return n;
}

}  // namespace droce::verbs

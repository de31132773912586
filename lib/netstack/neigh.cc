#include "netstack/neigh.h"

#include <cstring>

namespace droce::netstack {

const char* neigh_state_name(NeighState s) noexcept {
  switch (s) {
    case NeighState::Free: return "free";
    case NeighState::Incomplete: return "incomplete";
    case NeighState::Reachable: return "reachable";
    case NeighState::Stale: return "stale";
    case NeighState::Failed: return "failed";
  }
  return "?";
}

NeighCache::NeighCache(const NeighConfig& cfg) : cfg_(cfg) {
  if (cfg_.entries < kWays) cfg_.entries = kWays;
  if (cfg_.max_probes == 0) cfg_.max_probes = 1;
  buckets_ = (cfg_.entries + kWays - 1) / kWays;
  table_.resize(size_t{buckets_} * kWays);
}

uint32_t NeighCache::bucket_of(const wire::Gid& ip) const noexcept {
  uint64_t lo = 0, hi = 0;
  std::memcpy(&hi, ip.data(), 8);
  std::memcpy(&lo, ip.data() + 8, 8);
  uint64_t h = (lo ^ (hi * 0x9E3779B97F4A7C15ull)) * 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return static_cast<uint32_t>(h % buckets_);
}

NeighEntry* NeighCache::find_mut(const wire::Gid& ip) noexcept {
  NeighEntry* b = &table_[size_t{bucket_of(ip)} * kWays];
  for (uint32_t i = 0; i < kWays; ++i)
    if (b[i].state != NeighState::Free && b[i].ip == ip) return &b[i];
  return nullptr;
}

const NeighEntry* NeighCache::find(const wire::Gid& ip) const noexcept {
  return const_cast<NeighCache*>(this)->find_mut(ip);
}

NeighEntry& NeighCache::victim(uint32_t bucket) noexcept {
  NeighEntry* b = &table_[size_t{bucket} * kWays];
  NeighEntry* best = nullptr;
  auto rank = [](NeighState s) {  // lower is evicted first
    switch (s) {
      case NeighState::Free: return 0;
      case NeighState::Failed: return 1;
      case NeighState::Stale: return 2;
      case NeighState::Reachable: return 3;
      case NeighState::Incomplete: return 4;
    }
    return 5;
  };
  for (uint32_t i = 0; i < kWays; ++i) {
    if (best == nullptr || rank(b[i].state) < rank(best->state) ||
        (rank(b[i].state) == rank(best->state) && b[i].confirmed_ns < best->confirmed_ns))
      best = &b[i];
  }
  if (best->state != NeighState::Free) ++evictions_;
  *best = NeighEntry{};
  return *best;
}

void NeighCache::refresh(NeighEntry& e, uint64_t now) noexcept {
  if (e.state == NeighState::Reachable && now - e.confirmed_ns >= cfg_.reachable_ns) {
    e.state = NeighState::Stale;
    e.probes = 0;
    e.next_probe_ns = now;
  }
  if (e.state == NeighState::Failed && now - e.confirmed_ns >= cfg_.failed_hold_ns) e.state = NeighState::Free;
}

NeighCache::Lookup NeighCache::lookup(const wire::Gid& ip, uint64_t now, wire::MacAddr& mac) noexcept {
  NeighEntry* e = find_mut(ip);
  if (e != nullptr) refresh(*e, now);
  if (e == nullptr || e->state == NeighState::Free) {
    NeighEntry& n = e != nullptr ? *e : victim(bucket_of(ip));
    n.ip = ip;
    n.state = NeighState::Incomplete;
    n.probes = 1;
    n.confirmed_ns = now;
    n.next_probe_ns = now + cfg_.retry_ns;
    return Lookup::Miss;
  }
  switch (e->state) {
    case NeighState::Reachable:
      mac = e->mac;
      return Lookup::Hit;
    case NeighState::Stale:
      mac = e->mac;
      if (e->probes < cfg_.max_probes && now >= e->next_probe_ns) {
        ++e->probes;
        e->next_probe_ns = now + cfg_.retry_ns;
        return Lookup::HitProbe;
      }
      return Lookup::Hit;
    case NeighState::Incomplete: return Lookup::Pending;
    default: return Lookup::Failed;
  }
}

bool NeighCache::confirm(const wire::Gid& ip, const wire::MacAddr& mac, uint64_t now, bool create) noexcept {
  NeighEntry* e = find_mut(ip);
  if (e == nullptr) {
    if (!create) return false;
    e = &victim(bucket_of(ip));
    e->ip = ip;
  }
  e->mac = mac;
  e->state = NeighState::Reachable;
  e->probes = 0;
  e->confirmed_ns = now;
  e->next_probe_ns = 0;
  return true;
}

const NeighEntry* NeighCache::next_due(uint64_t now) noexcept {
  for (auto& e : table_) {
    if (e.state == NeighState::Free) continue;
    refresh(e, now);
    if (e.state == NeighState::Incomplete && now >= e.next_probe_ns) {
      if (e.probes >= cfg_.max_probes) {
        e.state = NeighState::Failed;
        e.confirmed_ns = now;
        continue;
      }
      ++e.probes;
      e.next_probe_ns = now + cfg_.retry_ns;
      return &e;
    }
    if (e.state == NeighState::Stale && e.probes > 0 && now >= e.next_probe_ns) {
      // A Stale entry whose confirmation probes went unanswered.
      if (e.probes >= cfg_.max_probes) {
        e.state = NeighState::Failed;
        e.confirmed_ns = now;
        continue;
      }
      ++e.probes;
      e.next_probe_ns = now + cfg_.retry_ns;
      return &e;
    }
  }
  return nullptr;
}

bool NeighCache::remove(const wire::Gid& ip) noexcept {
  NeighEntry* e = find_mut(ip);
  if (e == nullptr) return false;
  *e = NeighEntry{};
  return true;
}

size_t NeighCache::used() const noexcept {
  size_t n = 0;
  for (const auto& e : table_) n += e.state != NeighState::Free;
  return n;
}

}  // namespace droce::netstack

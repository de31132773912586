// Neighbour cache for ARP (IPv4) and IPv6 neighbour discovery: one fixed-size
// table keyed by the peer's address as a GID (IPv4 in ::ffff:a.b.c.d form).
//
// Set-associative: an address hashes to one bucket of kWays entries, so
// lookup and insert are O(1) and nothing is allocated after construction.
// A full bucket evicts its failed entry first, then the least recently
// confirmed one. States (a small RFC 4861 subset, also used for ARP):
//   Incomplete  a request went out, no answer yet; retried every retry_ns,
//               Failed after max_probes unanswered requests
//   Reachable   answered within reachable_ns
//   Stale       older than reachable_ns: still used, and re-probed
//   Failed      no answer; lookups fail until failed_hold_ns has passed
// The cache only keeps state and says when a request is due; netstack.h
// writes the frames.
#pragma once

#include <cstdint>
#include <vector>

#include "wire/headers.h"

namespace droce::netstack {

struct NeighConfig {
  uint32_t entries = 256;                        // rounded up to a multiple of kWays
  uint64_t reachable_ns = 30'000'000'000ull;     // 30 s, as Linux base_reachable_time
  uint64_t retry_ns = 1'000'000'000ull;          // 1 s between requests
  uint32_t max_probes = 3;
  uint64_t failed_hold_ns = 3'000'000'000ull;    // negative caching
};

enum class NeighState : uint8_t { Free, Incomplete, Reachable, Stale, Failed };
const char* neigh_state_name(NeighState s) noexcept;

struct NeighEntry {
  wire::Gid ip{};
  wire::MacAddr mac{};
  NeighState state = NeighState::Free;
  uint8_t probes = 0;          // requests sent in the current resolution
  uint64_t confirmed_ns = 0;   // last time the peer answered (or Failed since)
  uint64_t next_probe_ns = 0;  // when the next request is due
};

class NeighCache {
 public:
  static constexpr uint32_t kWays = 4;
  explicit NeighCache(const NeighConfig& cfg = {});

  enum class Lookup : uint8_t {
    Hit,          // mac is valid
    HitProbe,     // mac is valid but old: send a request to confirm it
    Miss,         // new entry created (Incomplete): send a request
    Pending,      // a request is out; wait
    Failed,       // the peer did not answer
  };
  // What to do to send to ip at time now. On Hit/HitProbe, mac is written.
  // Miss and HitProbe count one probe; the caller sends the request.
  Lookup lookup(const wire::Gid& ip, uint64_t now, wire::MacAddr& mac) noexcept;

  // The peer answered (ARP reply, NA, or request naming it): record its MAC.
  // create = false updates only an entry that exists (gratuitous ARP,
  // unsolicited NA). Returns true if an entry was created or updated.
  bool confirm(const wire::Gid& ip, const wire::MacAddr& mac, uint64_t now, bool create) noexcept;

  // Timer step: the next entry whose request is due at `now` (Incomplete or
  // Stale being probed); marks it probed. Incomplete entries out of probes
  // become Failed. Returns nullptr when nothing is due. O(entries).
  const NeighEntry* next_due(uint64_t now) noexcept;

  const NeighEntry* find(const wire::Gid& ip) const noexcept;
  bool remove(const wire::Gid& ip) noexcept;
  const std::vector<NeighEntry>& entries() const noexcept { return table_; }
  size_t used() const noexcept;
  uint64_t evictions() const noexcept { return evictions_; }

 private:
  uint32_t bucket_of(const wire::Gid& ip) const noexcept;
  NeighEntry* find_mut(const wire::Gid& ip) noexcept;
  NeighEntry& victim(uint32_t bucket) noexcept;
  void refresh(NeighEntry& e, uint64_t now) noexcept;

  NeighConfig cfg_;
  uint32_t buckets_;
  std::vector<NeighEntry> table_;
  uint64_t evictions_ = 0;
};

}  // namespace droce::netstack

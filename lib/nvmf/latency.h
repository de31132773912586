// A fixed latency histogram with log2 buckets: one add per command, no
// allocation, a few words of state (lib/nvmf/README.md, "Counters").
// Bucket 0 holds 0 ns, bucket b >= 1 holds [2^(b-1), 2^b) ns, the last one
// everything from 2^(kBuckets-2) ns (about 137 s) up. A percentile is the
// upper edge of the bucket holding that rank (capped by the largest value
// seen), so it is at most twice the true value and never below it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace droce::nvmf {

struct QueueLatency {
  static constexpr size_t kBuckets = 40;
  std::array<uint64_t, kBuckets> bucket{};
  uint64_t count = 0;
  uint64_t sum_ns = 0;
  uint64_t max_ns = 0;

  static constexpr size_t bucket_of(uint64_t ns) noexcept {
    return std::min<size_t>(static_cast<size_t>(std::bit_width(ns)), kBuckets - 1);
  }
  // The largest value bucket b holds (the last bucket: unbounded).
  static constexpr uint64_t upper_edge(size_t b) noexcept {
    return b == 0 ? 0 : b >= kBuckets - 1 ? UINT64_MAX : (uint64_t{1} << b) - 1;
  }

  void add(uint64_t ns) noexcept {
    ++bucket[bucket_of(ns)];
    ++count;
    sum_ns += ns;
    max_ns = std::max(max_ns, ns);
  }

  // The p-quantile (0 < p <= 1) as the upper edge of the bucket holding the
  // ceil(p * count)-th smallest value, capped by max_ns; 0 when empty.
  uint64_t percentile(double p) const noexcept {
    if (count == 0) return 0;
    p = std::clamp(p, 0.0, 1.0);
    uint64_t rank = static_cast<uint64_t>(p * static_cast<double>(count));
    if (static_cast<double>(rank) < p * static_cast<double>(count)) ++rank;  // ceil
    rank = std::clamp<uint64_t>(rank, 1, count);
    uint64_t seen = 0;
    for (size_t b = 0; b < kBuckets; ++b) {
      seen += bucket[b];
      if (seen >= rank) return std::min(upper_edge(b), max_ns);
    }
    return max_ns;
  }
  uint64_t mean() const noexcept { return count ? sum_ns / count : 0; }
};

}  // namespace droce::nvmf

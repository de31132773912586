// droce-nvmf-perf's workloads (perf.h).
#include "nvmf/host/perf.h"

#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <vector>

namespace droce::nvmf::host {

namespace {
uint64_t now_ns() noexcept {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
uint64_t mix(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s;
  uint64_t next() noexcept { return mix(s++); }
};
uint64_t pick_seed(uint64_t s) {
  if (s) return s;
  if (getrandom(&s, sizeof s, 0) != sizeof s || s == 0) s = now_ns();
  return s;
}
constexpr uint64_t kStallNs = 10'000'000'000ull;  // no completion for this long: the target is gone

// Checks the parameters against the controller; "" when fine.
std::string check_config(const Host& h, const PerfConfig& c, uint64_t& units, uint32_t& nb) {
  const ControllerInfo& in = h.info();
  if (in.block_size == 0) return "not connected";
  if (c.io_size == 0 || c.io_size % in.block_size) return "io size " + std::to_string(c.io_size) +
                                                           " is not a multiple of the block size " +
                                                           std::to_string(in.block_size);
  if (in.mdts_bytes && c.io_size > in.mdts_bytes)
    return "io size " + std::to_string(c.io_size) + " exceeds the controller's MDTS (" + std::to_string(in.mdts_bytes) + " bytes)";
  const uint64_t cap = uint64_t{in.io_queues} * (in.queue_size - 1u);
  if (c.queue_depth == 0 || c.queue_depth > cap)
    return "queue depth " + std::to_string(c.queue_depth) + " exceeds what the I/O queues hold (" + std::to_string(cap) + ")";
  if (uint64_t{c.queue_depth} * c.io_size > h.data_size()) return "data area too small for queue depth x io size";
  nb = c.io_size / in.block_size;
  uint64_t span = in.blocks;
  if (c.span_bytes) span = std::min<uint64_t>(span, c.span_bytes / in.block_size);
  units = span / nb;
  if (units == 0) return "the namespace (or span) is smaller than one I/O";
  return "";
}

// Keeps queue_depth commands in flight: issue(i) starts command i (its buffer
// is data + i * io_size) and returns false when there is nothing more to do;
// complete(i, completion, latency) consumes it.
template <class Issue, class Complete>
void drive(Host& h, uint32_t qd, PerfResult& r, Issue&& issue, Complete&& complete) {
  std::vector<uint8_t> active(qd, 0);
  uint32_t inflight = 0;
  for (uint32_t i = 0; i < qd; ++i)
    if (issue(i)) {
      active[i] = 1;
      ++inflight;
    } else {
      break;
    }
  uint64_t last = now_ns();
  Completion cs[64];
  while (inflight > 0) {
    const int n = h.poll(cs, 64);
    if (n < 0) {
      r.error = h.failure().empty() ? "the host failed" : h.failure();
      return;
    }
    if (n == 0) {
      if (now_ns() - last > kStallNs) {
        r.error = "no completion for 10 s (" + std::to_string(inflight) + " commands in flight)";
        return;
      }
      continue;
    }
    last = now_ns();
    for (int k = 0; k < n; ++k) {
      const uint32_t i = static_cast<uint32_t>(cs[k].user);
      if (i >= qd || !active[i]) continue;
      if (!cs[k].status.ok()) ++r.errors;
      complete(i, cs[k]);
      if (!issue(i)) {
        active[i] = 0;
        --inflight;
      }
    }
    if (!r.error.empty()) return;
  }
}
}  // namespace

bool parse_pattern(const std::string& s, Pattern& out) noexcept {
  static const std::pair<const char*, Pattern> names[] = {{"randread", Pattern::RandRead}, {"randwrite", Pattern::RandWrite},
                                                          {"read", Pattern::Read},         {"write", Pattern::Write},
                                                          {"randrw", Pattern::RandRw},     {"rw", Pattern::Rw}};
  for (const auto& [n, p] : names)
    if (s == n) {
      out = p;
      return true;
    }
  return false;
}

const char* pattern_name(Pattern p) noexcept {
  switch (p) {
    case Pattern::RandRead: return "randread";
    case Pattern::RandWrite: return "randwrite";
    case Pattern::Read: return "read";
    case Pattern::Write: return "write";
    case Pattern::RandRw: return "randrw";
    case Pattern::Rw: return "rw";
  }
  return "?";
}

// ---------------------------------------------------------------- histogram
size_t LatencyHistogram::bucket(uint64_t ns) noexcept {
  if (ns < 64) return static_cast<size_t>(ns);
  const unsigned e = 63u - static_cast<unsigned>(std::countl_zero(ns));  // >= 6
  const size_t b = (e - 5u) * 64u + ((ns >> (e - 6u)) & 63u);
  return std::min(b, kBuckets - 1);
}

uint64_t LatencyHistogram::upper(size_t b) noexcept {
  if (b < 64) return b;
  const unsigned e = static_cast<unsigned>(b / 64) + 5u;
  const uint64_t sub = b % 64;
  return ((64 + sub + 1) << (e - 6u)) - 1;
}

void LatencyHistogram::add(uint64_t ns) noexcept {
  ++b_[bucket(ns)];
  ++count_;
  sum_ += ns;
  min_ = std::min(min_, ns);
  max_ = std::max(max_, ns);
}

uint64_t LatencyHistogram::percentile(double q) const noexcept {
  if (count_ == 0) return 0;
  const double want = q * static_cast<double>(count_);
  uint64_t acc = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    acc += b_[i];
    if (b_[i] && static_cast<double>(acc) >= want) return std::min(upper(i), max_);
  }
  return max_;
}

// ---------------------------------------------------------------- pattern
void fill_block(uint8_t* p, uint32_t block_size, uint64_t lba, uint64_t seed) noexcept {
  std::memcpy(p, &lba, 8);
  std::memcpy(p + 8, &seed, 8);
  const uint64_t base = mix(lba ^ mix(seed));
  for (uint32_t j = 16; j + 8 <= block_size; j += 8) {
    const uint64_t w = base ^ (uint64_t{j} * 0x9E3779B97F4A7C15ull);
    std::memcpy(p + j, &w, 8);
  }
}

bool check_block(const uint8_t* p, uint32_t block_size, uint64_t lba, uint64_t seed) noexcept {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if (v != lba) return false;
  std::memcpy(&v, p + 8, 8);
  if (v != seed) return false;
  const uint64_t base = mix(lba ^ mix(seed));
  for (uint32_t j = 16; j + 8 <= block_size; j += 8) {
    std::memcpy(&v, p + j, 8);
    if (v != (base ^ (uint64_t{j} * 0x9E3779B97F4A7C15ull))) return false;
  }
  return true;
}

// ---------------------------------------------------------------- workloads
PerfResult run_perf(Host& h, const PerfConfig& c) {
  PerfResult r;
  uint64_t units = 0;
  uint32_t nb = 0;
  r.error = check_config(h, c, units, nb);
  if (!r.error.empty()) return r;
  const ControllerInfo& in = h.info();
  Rng rng{pick_seed(c.seed)};
  std::vector<uint64_t> start(c.queue_depth, 0);
  std::vector<uint8_t> is_read(c.queue_depth, 0);
  uint64_t seq = 0, issued = 0;
  const uint64_t t0 = now_ns();
  const uint64_t end = t0 + static_cast<uint64_t>(c.seconds * 1e9);
  uint8_t* const data = h.data();
  auto issue = [&](uint32_t i) {
    const uint64_t t = now_ns();
    if (t >= end || (c.max_ios && issued >= c.max_ios)) return false;
    bool rd;
    switch (c.pattern) {
      case Pattern::RandRead:
      case Pattern::Read: rd = true; break;
      case Pattern::RandWrite:
      case Pattern::Write: rd = false; break;
      default: rd = rng.next() % 100 < c.read_pct; break;
    }
    const bool random = c.pattern == Pattern::RandRead || c.pattern == Pattern::RandWrite || c.pattern == Pattern::RandRw;
    const uint64_t unit = random ? rng.next() % units : seq++ % units;
    const uint16_t qid = static_cast<uint16_t>(1 + i % in.io_queues);
    const int rc = h.submit(qid, rd ? IoDir::Read : IoDir::Write, unit * nb, nb, data + size_t{i} * c.io_size, i);
    if (rc != 0) {
      if (r.error.empty()) r.error = "submit failed: errno " + std::to_string(rc);
      return false;
    }
    start[i] = t;
    is_read[i] = rd;
    ++issued;
    return true;
  };
  auto complete = [&](uint32_t i, const Completion&) {
    r.lat.add(now_ns() - start[i]);
    ++r.ios;
    (is_read[i] ? r.reads : r.writes)++;
    r.bytes += c.io_size;
  };
  drive(h, c.queue_depth, r, issue, complete);
  r.seconds = static_cast<double>(now_ns() - t0) / 1e9;
  return r;
}

PerfResult run_verify(Host& h, const PerfConfig& c, uint64_t ios) {
  PerfResult r;
  uint64_t units = 0;
  uint32_t nb = 0;
  r.error = check_config(h, c, units, nb);
  if (!r.error.empty()) return r;
  const ControllerInfo& in = h.info();
  const uint64_t seed = pick_seed(c.seed);
  ios = std::min(ios, units);
  if (ios == 0) ios = 1;
  const uint64_t stride = units / ios;
  std::vector<uint64_t> unit_of(c.queue_depth, 0), start(c.queue_depth, 0);
  uint8_t* const data = h.data();
  const uint64_t t0 = now_ns();
  for (int phase = 0; phase < 2 && r.error.empty(); ++phase) {
    const bool rd = phase == 1;
    uint64_t next = 0;
    auto issue = [&](uint32_t i) {
      if (next >= ios) return false;
      const uint64_t unit = next++ * stride;
      uint8_t* buf = data + size_t{i} * c.io_size;
      if (rd) {
        std::memset(buf, 0, c.io_size);  // stale data of the previous command must not pass
      } else {
        for (uint32_t b = 0; b < nb; ++b) fill_block(buf + size_t{b} * in.block_size, in.block_size, unit * nb + b, seed);
      }
      const uint16_t qid = static_cast<uint16_t>(1 + i % in.io_queues);
      const int rc = h.submit(qid, rd ? IoDir::Read : IoDir::Write, unit * nb, nb, buf, i);
      if (rc != 0) {
        if (r.error.empty()) r.error = "submit failed: errno " + std::to_string(rc);
        return false;
      }
      unit_of[i] = unit;
      start[i] = now_ns();
      return true;
    };
    auto complete = [&](uint32_t i, const Completion& cpl) {
      r.lat.add(now_ns() - start[i]);
      ++r.ios;
      (rd ? r.reads : r.writes)++;
      r.bytes += c.io_size;
      if (!rd || !cpl.status.ok()) return;
      const uint8_t* buf = data + size_t{i} * c.io_size;
      for (uint32_t b = 0; b < nb; ++b) {
        ++r.verified_blocks;
        if (!check_block(buf + size_t{b} * in.block_size, in.block_size, unit_of[i] * nb + b, seed)) ++r.mismatches;
      }
    };
    drive(h, c.queue_depth, r, issue, complete);
  }
  r.seconds = static_cast<double>(now_ns() - t0) / 1e9;
  return r;
}

}  // namespace droce::nvmf::host

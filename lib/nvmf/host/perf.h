// Workloads of droce-nvmf-perf on a connected Host: random/sequential
// read/write/mix at a queue depth for a time (IOPS, bandwidth, latency
// percentiles), and a verify pass (write a tagged pattern, read it back,
// compare every block). No allocation per I/O: one buffer per outstanding
// command, carved from the Host's data area.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "nvmf/host/host.h"

namespace droce::nvmf::host {

enum class Pattern : uint8_t { RandRead, RandWrite, Read, Write, RandRw, Rw };
// "randread" ... "rw" (rw: sequential mix, randrw: random mix). False if unknown.
bool parse_pattern(const std::string& s, Pattern& out) noexcept;
const char* pattern_name(Pattern p) noexcept;

struct PerfConfig {
  Pattern pattern = Pattern::RandRead;
  uint32_t read_pct = 50;    // mixes
  uint32_t queue_depth = 1;  // commands in flight in all (spread over the I/O queues)
  uint32_t io_size = 4096;   // bytes, a multiple of the block size
  double seconds = 1;
  uint64_t max_ios = 0;      // stop after this many (0: time only)
  uint64_t span_bytes = 0;   // LBAs used: the first span_bytes of the namespace (0: all)
  uint64_t seed = 0;         // 0: random
};

// Log-linear latency histogram (64 sub-buckets per power of two: ~1.6% resolution).
class LatencyHistogram {
 public:
  void add(uint64_t ns) noexcept;
  uint64_t count() const noexcept { return count_; }
  uint64_t min() const noexcept { return count_ ? min_ : 0; }
  uint64_t max() const noexcept { return max_; }
  double mean() const noexcept { return count_ ? static_cast<double>(sum_) / static_cast<double>(count_) : 0; }
  // The smallest value v with at least q of the samples <= v (upper bound of its bucket, capped at max).
  uint64_t percentile(double q) const noexcept;
  static constexpr size_t kBuckets = 64 * 60;

 private:
  static size_t bucket(uint64_t ns) noexcept;
  static uint64_t upper(size_t b) noexcept;
  std::array<uint64_t, kBuckets> b_{};
  uint64_t count_ = 0, sum_ = 0, min_ = ~uint64_t{0}, max_ = 0;
};

struct PerfResult {
  uint64_t ios = 0, reads = 0, writes = 0, bytes = 0;
  uint64_t errors = 0;          // completions with an error status
  uint64_t mismatches = 0;      // verify: blocks that read back wrong
  uint64_t verified_blocks = 0;
  double seconds = 0;
  LatencyHistogram lat;
  std::string error;            // a failure that stopped the run
  double iops() const noexcept { return seconds > 0 ? static_cast<double>(ios) / seconds : 0; }
  double mib_s() const noexcept { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1048576.0 : 0; }
};

// Runs the workload; needs data_size() >= queue_depth * io_size.
PerfResult run_perf(Host& h, const PerfConfig& c);
// Writes `ios` commands of io_size with a per-block tag (LBA, run seed) over
// the span, then reads them all back and compares every block.
PerfResult run_verify(Host& h, const PerfConfig& c, uint64_t ios);

// The verify pattern of one block (exposed for tests): tag = LBA and seed in
// the first 16 bytes, then words derived from both.
void fill_block(uint8_t* p, uint32_t block_size, uint64_t lba, uint64_t seed) noexcept;
bool check_block(const uint8_t* p, uint32_t block_size, uint64_t lba, uint64_t seed) noexcept;

}  // namespace droce::nvmf::host

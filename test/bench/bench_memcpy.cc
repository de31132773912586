// memcpy bandwidth for a given block size over a working set larger than the
// last-level cache: the baseline droce's 64 KiB WRITE throughput is compared to.
//   bench_memcpy [block-bytes] [seconds]   -> "memcpy <block> B: <GB/s> GB/s <Gb/s> Gb/s"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_args.h"

int main(int argc, char** argv) {
  droce::bench::check_args(argc, argv, 2, "[block bytes, default 65536] [seconds, default 1]");
  const auto block = static_cast<size_t>(droce::bench::arg_or(argc, argv, 1, 65536));
  const double secs = droce::bench::arg_or(argc, argv, 2, 1.0);
  const size_t set = 64u << 20;  // 64 MiB source and destination
  std::vector<unsigned char> src(set, 1), dst(set, 0);
  for (size_t i = 0; i < set; i += 4096) src[i] = static_cast<unsigned char>(i);
  const size_t nblk = set / block;
  size_t bytes = 0, k = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double el = 0;
  do {
    for (int r = 0; r < 64; ++r, ++k) {
      const size_t off = (k % nblk) * block;
      std::memcpy(dst.data() + off, src.data() + off, block);
      bytes += block;
    }
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (el < secs);
  volatile unsigned char sink = dst[set / 2];
  (void)sink;
  std::printf("memcpy %zu B: %.2f GB/s %.2f Gb/s\n", block, bytes / el / 1e9, bytes * 8 / el / 1e9);
  return 0;
}

// Operations-side benchmark, each case next to a baseline measured in the same
// run:
//  - counters: per-core single-writer blocks vs one shared atomic counter,
//    with 2 writer threads (what the per-core design avoids) and vs a plain
//    non-atomic increment on one thread (the floor);
//  - fault injection: cost per frame with all probabilities zero and with 1%
//    drop + 1% reorder, vs handing the burst on untouched;
//  - control socket: request round trip (JSON parse, handler, answer) vs a
//    1-byte ping-pong over the same kind of Unix socket.
// Release build: build/test/bench/bench_ops [seconds-per-case]
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "control/client.h"
#include "control/server.h"
#include "fault/fault_injector.h"
#include "stats/groups.h"

using namespace droce;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs body(iterations) on `threads` threads for about `secs`; returns ops/s in total.
template <class F>
double threaded_rate(int threads, double secs, F body) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> total{0};
  std::vector<std::thread> ts;
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      uint64_t ops = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        body(t, 4096);
        ops += 4096;
      }
      total += ops;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  stop = true;
  for (auto& t : ts) t.join();
  return static_cast<double>(total.load()) / secs_since(t0);
}

class PoolIo : public io::PacketIo {
 public:
  explicit PoolIo(size_t n) : store_(n * 128), bufs_(n) {
    for (size_t i = 0; i < n; ++i) {
      bufs_[i].data = &store_[i * 128];
      bufs_[i].cap = 128;
      bufs_[i].len = 64;
      free_.push_back(&bufs_[i]);
    }
  }
  uint16_t rx_burst(io::PktBuf**, uint16_t) noexcept override { return 0; }
  uint16_t alloc_burst(io::PktBuf** b, uint16_t n) noexcept override {
    uint16_t k = 0;
    while (k < n && !free_.empty()) {
      b[k++] = free_.back();
      free_.pop_back();
    }
    return k;
  }
  uint16_t tx_burst(io::PktBuf**, uint16_t) noexcept override { return 0; }
  void free_burst(io::PktBuf** b, uint16_t n) noexcept override { free_.insert(free_.end(), b, b + n); }
  uint32_t buf_capacity() const noexcept override { return 128; }
  wire::MacAddr mac() const noexcept override { return {}; }

 private:
  std::vector<uint8_t> store_;
  std::vector<io::PktBuf> bufs_;
  std::vector<io::PktBuf*> free_;
};

// Frames per second through apply() (or through a plain copy when fi is null).
double fault_rate(fault::FaultInjector* fi, double secs) {
  PoolIo io(1024);
  io::PktBuf* b[32];
  uint64_t frames = 0;
  auto t0 = Clock::now();
  auto until = t0 + std::chrono::duration<double>(secs);
  uint64_t sink = 0;
  while (Clock::now() < until) {
    for (int r = 0; r < 256; ++r) {
      uint16_t n = io.alloc_burst(b, 32);
      uint16_t k = fi != nullptr ? fi->apply(io, b, n, 32) : n;
      for (uint16_t i = 0; i < k; ++i) sink += b[i]->len;  // the consumer touches each frame
      io.free_burst(b, k);
      frames += n;
    }
  }
  if (fi != nullptr) {
    uint16_t k = fi->flush(b, 32);
    io.free_burst(b, k);
  }
  asm volatile("" : : "r"(sink));
  return static_cast<double>(frames) / secs_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, 1, "[seconds per case, default 0.5]");
  const double secs = bench::arg_or(argc, argv, 1, 0.5);

  // ---- counters
  stats::PerCore<stats::PortCounter> blocks(2);
  alignas(64) std::atomic<uint64_t> shared[2] = {};
  const double per_core = threaded_rate(2, secs, [&](int t, int n) {
    for (int i = 0; i < n; ++i) {
      blocks[static_cast<size_t>(t)].add(stats::PortCounter::rx_packets);
      blocks[static_cast<size_t>(t)].add(stats::PortCounter::rx_bytes, 64);
    }
  });
  const double shared_atomic = threaded_rate(2, secs, [&](int, int n) {
    for (int i = 0; i < n; ++i) {
      shared[0].fetch_add(1, std::memory_order_relaxed);
      shared[1].fetch_add(64, std::memory_order_relaxed);
    }
  });
  struct alignas(64) Plain {
    uint64_t packets = 0, bytes = 0;
  } plain;
  const double plain_rate = threaded_rate(1, secs, [&](int, int n) {
    for (int i = 0; i < n; ++i) {
      plain.packets += 1;
      plain.bytes += 64;
      asm volatile("" : : "r"(&plain) : "memory");
    }
  });
  const double one_core = threaded_rate(1, secs, [&](int, int n) {
    for (int i = 0; i < n; ++i) {
      blocks[0].add(stats::PortCounter::rx_packets);
      blocks[0].add(stats::PortCounter::rx_bytes, 64);
      asm volatile("" : : "r"(&blocks[0]) : "memory");
    }
  });
  std::printf("counters (packets + bytes per update)     updates/s      ratio\n");
  std::printf("  per-core blocks, 2 writers          %14.3e   %7.2fx vs shared atomic\n", per_core,
              per_core / shared_atomic);
  std::printf("  shared atomic fetch_add, 2 writers  %14.3e   baseline\n", shared_atomic);
  std::printf("  per-core block, 1 writer            %14.3e   %7.2fx of plain increments\n", one_core,
              one_core / plain_rate);
  std::printf("  plain increments, 1 writer          %14.3e   baseline\n", plain_rate);

  // ---- fault injection
  config::PortConfig pc;
  pc.name = "p0";
  config::FaultTable table({pc});
  fault::FaultInjector off(table[0], config::FaultDir::rx, 0, &blocks[0]);
  const double base = fault_rate(nullptr, secs);
  const double with_off = fault_rate(&off, secs);
  config::FaultTable table2({pc});
  table2[0].set(config::FaultDir::rx, config::FaultKind::drop, 0.01);
  table2[0].set(config::FaultDir::rx, config::FaultKind::reorder, 0.01);
  table2[0].publish();
  fault::FaultInjector on(table2[0], config::FaultDir::rx, 0, &blocks[0]);
  const double with_on = fault_rate(&on, secs);
  std::printf("\nfault injection (bursts of 32 frames)    frames/s       ns/frame   ratio\n");
  std::printf("  no injector (baseline)              %14.3e   %8.2f\n", base, 1e9 / base);
  std::printf("  injector, all probabilities 0       %14.3e   %8.2f   %5.2fx of baseline rate\n", with_off,
              1e9 / with_off, with_off / base);
  std::printf("  injector, 1%% drop + 1%% reorder      %14.3e   %8.2f   %5.2fx of baseline rate\n", with_on,
              1e9 / with_on, with_on / base);

  // ---- control socket round trip
  char dir[] = "/tmp/droce-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  control::ServerOptions opt;
  opt.path = std::string(dir) + "/b.sock";
  control::Server server(opt);
  server.add("ping", "", [](const control::json&) { return control::json{{"pong", true}}; });
  server.start();
  control::Client client(opt.path);
  uint64_t n = 0;
  auto t0 = Clock::now();
  while (secs_since(t0) < secs) {
    client.call("ping");
    ++n;
  }
  const double rpc_us = secs_since(t0) * 1e6 / static_cast<double>(n);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  std::thread echo([fd = sv[1]] {
    char c;
    while (read(fd, &c, 1) == 1) {
      if (write(fd, &c, 1) != 1) break;
    }
  });
  n = 0;
  t0 = Clock::now();
  while (secs_since(t0) < secs) {
    char c = 'x';
    if (write(sv[0], &c, 1) != 1 || read(sv[0], &c, 1) != 1) return 1;
    ++n;
  }
  const double ping_us = secs_since(t0) * 1e6 / static_cast<double>(n);
  close(sv[0]);
  echo.join();
  close(sv[1]);
  server.stop();
  rmdir(dir);
  std::printf("\ncontrol socket                           us/request   ratio\n");
  std::printf("  JSON request round trip             %11.2f   %6.2fx of the ping-pong\n", rpc_us, rpc_us / ping_us);
  std::printf("  1-byte Unix socket ping-pong        %11.2f   baseline\n", ping_us);
  return 0;
}

// Raw packet rate through drivers/dpdk's DpdkQueueIo, next to a baseline
// measured in the same run:
//   bench_port ring SIZE SECONDS          net_ring pair in one process, one core:
//       the same alloc/fill/TX/RX/free loop through DpdkQueueIo and through the
//       plain ethdev API on the same ports; prints both and the ratio.
//   bench_port tx DEVICE SIZE SECONDS     send as fast as possible (for
//   bench_port rx DEVICE SECONDS [LINGER] test/bench/bench_port.sh, which puts
//       these against dpdk-testpmd txonly/rxonly on a veth pair).
// EAL arguments may follow "--".
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "dpdk/queue_io.h"

using namespace droce;

namespace {

constexpr uint16_t kBurst = 32;

// Ethernet + IPv4 + UDP header, as testpmd's txonly writes (42 bytes).
struct Template {
  uint8_t b[42];
  explicit Template(uint32_t size) {
    static constexpr uint8_t hdr[42] = {
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00,        // Ethernet
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,  // IPv4
        0x30, 0x39, 0x12, 0xB7, 0, 0, 0, 0};                                 // UDP 12345 -> 4791
    std::memcpy(b, hdr, sizeof hdr);
    const uint32_t ip_len = size - 14, udp_len = size - 34;
    b[16] = static_cast<uint8_t>(ip_len >> 8);
    b[17] = static_cast<uint8_t>(ip_len);
    b[38] = static_cast<uint8_t>(udp_len >> 8);
    b[39] = static_cast<uint8_t>(udp_len);
  }
};

struct Rate {
  double mpps = 0;
  uint64_t packets = 0;
};

Rate finish(uint64_t pkts, uint64_t t0, uint64_t t1) {
  const double secs = static_cast<double>(t1 - t0) / static_cast<double>(rte_get_tsc_hz());
  return Rate{secs > 0 ? static_cast<double>(pkts) / secs / 1e6 : 0, pkts};
}

// Loop through DpdkQueueIo: alloc, write header, TX on a, RX on b, free.
Rate ring_droce(dpdk::DpdkQueueIo& a, dpdk::DpdkQueueIo& b, const Template& t, uint32_t size, double secs) {
  io::PktBuf* tx[kBurst];
  io::PktBuf* rx[kBurst];
  uint64_t got = 0;
  const uint64_t t0 = rte_rdtsc(), end = t0 + static_cast<uint64_t>(secs * static_cast<double>(rte_get_tsc_hz()));
  uint64_t now = t0;
  while (now < end) {
    for (int rep = 0; rep < 64; ++rep) {
      const uint16_t n = a.alloc_burst(tx, kBurst);
      for (uint16_t i = 0; i < n; ++i) {
        std::memcpy(tx[i]->data, t.b, sizeof t.b);
        tx[i]->len = size;
      }
      const uint16_t k = a.tx_burst(tx, n);
      if (k < n) a.free_burst(tx + k, static_cast<uint16_t>(n - k));
      const uint16_t m = b.rx_burst(rx, kBurst);
      got += m;
      b.free_burst(rx, m);
    }
    now = rte_rdtsc();
  }
  return finish(got, t0, now);
}

// The same loop on the plain ethdev/mbuf API.
Rate ring_raw(const dpdk::Port& a, const dpdk::Port& b, const Template& t, uint32_t size, double secs) {
  rte_mbuf* tx[kBurst];
  rte_mbuf* rx[kBurst];
  uint64_t got = 0;
  const uint64_t t0 = rte_rdtsc(), end = t0 + static_cast<uint64_t>(secs * static_cast<double>(rte_get_tsc_hz()));
  uint64_t now = t0;
  while (now < end) {
    for (int rep = 0; rep < 64; ++rep) {
      if (rte_pktmbuf_alloc_bulk(a.pool(), tx, kBurst) == 0) {
        for (uint16_t i = 0; i < kBurst; ++i) {
          std::memcpy(rte_pktmbuf_mtod(tx[i], uint8_t*), t.b, sizeof t.b);
          tx[i]->data_len = static_cast<uint16_t>(size);
          tx[i]->pkt_len = size;
        }
        const uint16_t k = rte_eth_tx_burst(a.id(), 0, tx, kBurst);
        if (k < kBurst) rte_pktmbuf_free_bulk(tx + k, kBurst - k);
      }
      const uint16_t m = rte_eth_rx_burst(b.id(), 0, rx, kBurst);
      got += m;
      rte_pktmbuf_free_bulk(rx, m);
    }
    now = rte_rdtsc();
  }
  return finish(got, t0, now);
}

int ring_mode(uint32_t size, double secs) {
  dpdk::RingPair rings("bench", 1, 1024);
  dpdk::Port a(dpdk::PortConfig{.port_id = rings.port_a()});
  dpdk::Port b(dpdk::PortConfig{.port_id = rings.port_b()});
  dpdk::DpdkQueueIo qa(a, 0), qb(b, 0);
  const Template t(size);
  // Alternate the two loops in short rounds; report the best round of each
  // (the one least disturbed by the other processes on this machine).
  constexpr int kRounds = 10;
  Rate best_raw, best_droce;
  for (int r = 0; r < kRounds; ++r) {
    const Rate raw = ring_raw(a, b, t, size, secs / (2 * kRounds));
    const Rate dr = ring_droce(qa, qb, t, size, secs / (2 * kRounds));
    if (raw.mpps > best_raw.mpps) best_raw = raw;
    if (dr.mpps > best_droce.mpps) best_droce = dr;
  }
  if (best_raw.packets == 0 || best_droce.packets == 0) {
    std::printf("ring %u B: no packets moved\n", size);
    return 1;
  }
  std::printf("net_ring pair, 1 core, %4u B: ethdev API %7.2f Mpps | DpdkQueueIo %7.2f Mpps | ratio %.2f\n", size,
              best_raw.mpps, best_droce.mpps, best_droce.mpps / best_raw.mpps);
  return 0;
}

int tx_mode(const std::string& dev, uint32_t size, double secs) {
  dpdk::Port p(dpdk::PortConfig{.device = dev, .rx_desc = 256, .tx_desc = 1024});
  dpdk::DpdkQueueIo q(p, 0);
  const Template t(size);
  io::PktBuf* tx[kBurst];
  io::PktBuf* rx[kBurst];
  uint64_t sent = 0;
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t t0 = rte_rdtsc(), end = t0 + static_cast<uint64_t>(secs * static_cast<double>(hz));
  uint64_t now = t0;
  while (now < end) {
    for (int rep = 0; rep < 16; ++rep) {
      const uint16_t n = q.alloc_burst(tx, kBurst);
      for (uint16_t i = 0; i < n; ++i) {
        std::memcpy(tx[i]->data, t.b, sizeof t.b);
        tx[i]->len = size;
      }
      const uint16_t k = q.tx_burst(tx, n);
      if (k < n) q.free_burst(tx + k, static_cast<uint16_t>(n - k));
      sent += k;
      const uint16_t m = q.rx_burst(rx, kBurst);  // drain anything coming back
      q.free_burst(rx, m);
    }
    now = rte_rdtsc();
  }
  const Rate r = finish(sent, t0, now);
  std::printf("tx %s %u B: %.3f Mpps (%lu packets)\n", dev.c_str(), size, r.mpps, r.packets);
  return 0;
}

int rx_mode(const std::string& dev, double secs, double linger) {
  dpdk::Port p(dpdk::PortConfig{.device = dev, .rx_desc = 1024, .tx_desc = 256});
  dpdk::DpdkQueueIo q(p, 0);
  io::PktBuf* rx[kBurst];
  const uint64_t hz = rte_get_tsc_hz();
  // Count over the window [1 s, secs]: the sender is warmed up by then.
  const uint64_t start = rte_rdtsc();
  const uint64_t w0 = start + hz, end = start + static_cast<uint64_t>(secs * static_cast<double>(hz));
  uint64_t got = 0, now = start, t0 = 0;
  while (now < end) {
    for (int rep = 0; rep < 16; ++rep) {
      const uint16_t m = q.rx_burst(rx, kBurst);
      if (t0 != 0) got += m;
      q.free_burst(rx, m);
    }
    now = rte_rdtsc();
    if (t0 == 0 && now >= w0) t0 = now;
  }
  if (t0 == 0) t0 = now;
  const Rate r = finish(got, t0, now);
  std::printf("rx %s: %.3f Mpps (%lu packets)\n", dev.c_str(), r.mpps, r.packets);
  std::fflush(stdout);
  // Keep draining (uncounted) until the sender has stopped.
  for (const uint64_t stop = now + static_cast<uint64_t>(linger * static_cast<double>(hz)); rte_rdtsc() < stop;) {
    const uint16_t m = q.rx_burst(rx, kBurst);
    q.free_burst(rx, m);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args, eal_args;
  bool eal = false;
  for (int i = 1; i < argc; ++i) {
    if (!eal && std::strcmp(argv[i], "--") == 0) {
      eal = true;
      continue;
    }
    (eal ? eal_args : args).emplace_back(argv[i]);
  }
  auto usage = [&] {
    std::fprintf(stderr, "usage: %s ring SIZE SECONDS | tx DEVICE SIZE SECONDS | rx DEVICE SECONDS [LINGER] [-- EAL args]\n",
                 argv[0]);
    return 2;
  };
  if (args.empty()) return usage();
  try {
    if (std::find(eal_args.begin(), eal_args.end(), "--log-level=lib.eal:error") == eal_args.end())
      eal_args.emplace_back("--log-level=lib.eal:error");
    dpdk::Eal e({.args = eal_args, .program = "bench_port"});
    const std::string& mode = args[0];
    if (mode == "ring" && args.size() == 3) {
      const auto size = static_cast<uint32_t>(std::stoul(args[1]));
      if (size < 60 || size > 2000) throw std::runtime_error("SIZE must be 60..2000");
      return ring_mode(size, std::stod(args[2]));
    }
    if (mode == "tx" && args.size() == 4) {
      const auto size = static_cast<uint32_t>(std::stoul(args[2]));
      if (size < 60 || size > 2000) throw std::runtime_error("SIZE must be 60..2000");
      return tx_mode(args[1], size, std::stod(args[3]));
    }
    if (mode == "rx" && (args.size() == 3 || args.size() == 4))
      return rx_mode(args[1], std::stod(args[2]), args.size() == 4 ? std::stod(args[3]) : 0);
    return usage();
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_port: %s\n", ex.what());
    return 1;
  }
}

// One side of a two-process exchange over net_memif (shared memory, copy
// mode). The client sends numbered frames of varying sizes (every 4th
// zero-copy: payload attached from a hugepage region), the server echoes each
// one back with the MACs swapped, and the client checks that every frame
// returned intact and every zero-copy segment was released. Then the client sends FIN; the server answers
// FIN and stops sending before either side disconnects (the memif PMD can
// crash when a peer leaves during traffic; see DPDK-NOTES.md).
//   memif_peer server|client SOCKET [FRAMES]
// Exit status 0 when the exchange was complete and correct.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include <unistd.h>

#include <rte_mbuf.h>

#include "dpdk/eal.h"
#include "dpdk/hugemem.h"
#include "dpdk/port.h"
#include "dpdk/queue_io.h"

using namespace droce;

namespace {

constexpr uint16_t kTypeData = 0x88B5, kTypeFin = 0x88B6;

uint32_t len_for(uint32_t seq) { return 60 + (seq * 131) % 1440; }

// Every 4th frame is sent zero-copy: 18 header bytes in the frame's own
// buffer, the rest straight from a hugepage region (an "MR") filled with
// byte k = k * 7, starting at offset seq % 1024.
bool zero_copy(uint32_t seq) { return seq % 4 == 0; }
uint8_t mr_byte(size_t k) { return static_cast<uint8_t>(k * 7); }
constexpr size_t kMrSize = 4096;

void write_frame(io::PktBuf* b, const wire::MacAddr& src, uint16_t type, uint32_t seq) {
  const uint32_t len = type == kTypeData ? len_for(seq) : 60;
  std::memset(b->data, 0xFF, 6);
  std::memcpy(b->data + 6, src.data(), 6);
  b->data[12] = static_cast<uint8_t>(type >> 8);
  b->data[13] = static_cast<uint8_t>(type);
  std::memcpy(b->data + 14, &seq, 4);
  for (uint32_t i = 18; i < len; ++i) b->data[i] = static_cast<uint8_t>(seq + i);
  b->len = len;
}

bool frame_ok(const io::PktBuf* b, uint32_t seq) {
  if (b->len != len_for(seq)) return false;
  uint32_t s;
  std::memcpy(&s, b->data + 14, 4);
  if (s != seq) return false;
  for (uint32_t i = 18; i < b->len; ++i) {
    const uint8_t want = zero_copy(seq) ? mr_byte(seq % 1024 + i - 18) : static_cast<uint8_t>(seq + i);
    if (b->data[i] != want) return false;
  }
  return true;
}

int g_zc_freed = 0;
void zc_free(void*, void* opaque) { *static_cast<int*>(opaque) += 1; }

uint16_t type_of(const io::PktBuf* b) { return static_cast<uint16_t>(b->data[12] << 8 | b->data[13]); }

// Sends one frame, retrying while the ring is full (bounded).
bool send(dpdk::DpdkQueueIo& q, uint16_t type, uint32_t seq) {
  io::PktBuf* b;
  if (q.alloc_burst(&b, 1) != 1) return false;
  write_frame(b, q.mac(), type, seq);
  for (int i = 0; i < 100000; ++i)
    if (q.tx_burst(&b, 1) == 1) return true;
  q.free_burst(&b, 1);
  return false;
}

int server(dpdk::DpdkQueueIo& q, const dpdk::TscClock& clk) {
  io::PktBuf* rx[32];
  uint64_t echoed = 0;
  const uint64_t deadline = clk.now_ns() + 30'000'000'000ull;
  while (clk.now_ns() < deadline) {
    const uint16_t n = q.rx_burst(rx, 32);
    bool fin = false;
    uint16_t k = 0;
    for (uint16_t i = 0; i < n; ++i) {
      if (type_of(rx[i]) == kTypeFin) {
        fin = true;
        q.free_burst(&rx[i], 1);
        continue;
      }
      // Echo in place: the received buffer goes back out.
      std::memcpy(rx[i]->data, rx[i]->data + 6, 6);
      std::memcpy(rx[i]->data + 6, q.mac().data(), 6);
      rx[k++] = rx[i];
    }
    uint16_t sent = 0;
    for (int tries = 0; sent < k && tries < 100000; ++tries)
      sent = static_cast<uint16_t>(sent + q.tx_burst(rx + sent, static_cast<uint16_t>(k - sent)));
    if (sent < k) q.free_burst(rx + sent, static_cast<uint16_t>(k - sent));
    echoed += sent;
    if (fin) {
      send(q, kTypeFin, 0);
      std::printf("server: echoed %lu frames, FIN\n", echoed);
      // Stay connected and silent while the client leaves, without touching
      // the rings: the PMD handles the peer's disconnect on the interrupt
      // thread and unmaps the rings there, so an rx_burst running meanwhile
      // can fault (CI saw it once: the server polled its RX queue for 500 ms
      // after FIN and the client took longer than that to leave).
      usleep(500'000);
      return 0;
    }
  }
  std::printf("server: no FIN within 30 s (echoed %lu)\n", echoed);
  return 1;
}

int client(dpdk::DpdkQueueIo& q, const dpdk::TscClock& clk, uint32_t frames) {
  io::PktBuf* tx[32];
  io::PktBuf* rx[32];
  uint32_t sent = 0, got = 0, bad = 0, zc = 0;
  dpdk::HugeRegion mr("memif_mr", kMrSize);
  for (size_t k = 0; k < kMrSize; ++k) mr.data()[k] = mr_byte(k);
  rte_mbuf_ext_shared_info shinfo{};
  shinfo.free_cb = zc_free;
  shinfo.fcb_opaque = &g_zc_freed;
  rte_mbuf_ext_refcnt_set(&shinfo, 0);
  const uint64_t deadline = clk.now_ns() + 20'000'000'000ull;
  while (got < frames && clk.now_ns() < deadline) {
    // Keep at most 256 frames in flight.
    if (sent < frames && sent - got < 256) {
      const uint16_t want = static_cast<uint16_t>(std::min<uint32_t>({32, frames - sent, 256 - (sent - got)}));
      const uint16_t n = q.alloc_burst(tx, want);
      uint16_t ok = 0;
      for (uint16_t i = 0; i < n; ++i) {
        const uint32_t seq = sent + i;
        write_frame(tx[i], q.mac(), kTypeData, seq);
        if (zero_copy(seq)) {
          const size_t off = seq % 1024;
          tx[i]->len = 18;
          if (!q.append_external(tx[i], mr.data() + off, mr.iova(off), static_cast<uint16_t>(len_for(seq) - 18), &shinfo))
            break;
          ++zc;
        }
        ++ok;
      }
      if (ok < n) q.free_burst(tx + ok, static_cast<uint16_t>(n - ok));
      const uint16_t k = q.tx_burst(tx, ok);
      for (uint16_t i = k; i < ok; ++i) zc -= zero_copy(sent + i) ? 1 : 0;
      q.free_burst(tx + k, static_cast<uint16_t>(ok - k));
      sent += k;
    }
    const uint16_t n = q.rx_burst(rx, 32);
    for (uint16_t i = 0; i < n; ++i) {
      if (!frame_ok(rx[i], got)) ++bad;
      ++got;
    }
    q.free_burst(rx, n);
  }
  // The zero-copy segments share one shinfo: its refcnt counts those in
  // flight, and free_cb runs each time it drops to 0.
  const unsigned in_flight = rte_mbuf_ext_refcnt_read(&shinfo);
  std::printf("client: sent %u (%u zero-copy; MR references left %u, releases %d), received %u, bad %u\n", sent, zc,
              in_flight, g_zc_freed, got, bad);
  if (!send(q, kTypeFin, 0)) return 1;
  bool fin = false;
  for (const uint64_t end = clk.now_ns() + 5'000'000'000ull; !fin && clk.now_ns() < end;) {
    const uint16_t n = q.rx_burst(rx, 32);
    for (uint16_t i = 0; i < n; ++i) fin |= type_of(rx[i]) == kTypeFin;
    q.free_burst(rx, n);
  }
  std::printf("client: %s\n", fin ? "FIN from server" : "no FIN from server");
  // Every zero-copy segment was released once the PMD had sent it.
  const bool zc_ok = zc > 0 && in_flight == 0 && g_zc_freed > 0;
  return (got == frames && bad == 0 && fin && zc_ok) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0)) {
    std::fprintf(stderr, "usage: %s server|client SOCKET [FRAMES]\n", argv[0]);
    return 2;
  }
  const std::string role = argv[1];
  const uint32_t frames = argc > 3 ? static_cast<uint32_t>(std::stoul(argv[3])) : 20000;
  try {
    dpdk::Eal eal({.args = {"--log-level=lib.eal:error", "--log-level=pmd.net.memif:error"}, .program = "memif_" + role});
    dpdk::Port port(dpdk::PortConfig{.device = "net_memif0,role=" + role + ",socket=" + argv[2] + ",id=7",
                                     .rx_desc = 1024, .tx_desc = 1024});
    dpdk::DpdkQueueIo q(port, 0);
    dpdk::TscClock clk;
    if (!port.wait_link_up(15000)) {
      std::printf("%s: memif link did not come up\n", role.c_str());
      return 1;
    }
    std::printf("%s: link up\n", role.c_str());
    return role == "server" ? server(q, clk) : client(q, clk, frames);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", role.c_str(), e.what());
    return 1;
  }
}

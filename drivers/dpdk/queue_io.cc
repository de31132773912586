#include "dpdk/queue_io.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <rte_memory.h>
#include <rte_pause.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

namespace droce::dpdk {

__extension__ typedef unsigned __int128 u128;

io::PktBuf* DpdkQueueIo::pktbuf_of(rte_mbuf* m) noexcept { return static_cast<io::PktBuf*>(rte_mbuf_to_priv(m)); }
static_assert(sizeof(rte_mbuf) == DpdkQueueIo::kMbufHeaderSize);

struct ExtMem {
  rte_mbuf_ext_shared_info shinfo;
  uint8_t* base = nullptr;
  size_t len = 0;
  uint64_t iova_base = 0;  // iova(p) = iova_base + (p - base)
  std::atomic<bool> released{false};
};

namespace {
void ext_free_cb(void*, void* opaque) {
  // refcnt reached 0: only after ext_release dropped the registration's reference.
  static_cast<ExtMem*>(opaque)->released.store(true, std::memory_order_release);
}
}  // namespace

ExtMem* DpdkQueueIo::ext_create(void* base, size_t len) noexcept {
  if (base == nullptr || len == 0) return nullptr;
  auto* p = static_cast<uint8_t*>(base);
  const rte_memseg* ms = rte_mem_virt2memseg(p, nullptr);
  if (ms == nullptr) return nullptr;  // not DPDK memory
  const rte_iova_t iova0 = rte_mem_virt2iova(p);
  if (iova0 == RTE_BAD_IOVA) return nullptr;
  if (rte_eal_iova_mode() != RTE_IOVA_VA) {
    // Physical addresses: every page of the range must follow on from the first.
    const size_t pg = ms->hugepage_sz ? ms->hugepage_sz : 4096;
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    for (uintptr_t a = (start / pg + 1) * pg; a < start + len; a += pg) {
      const rte_iova_t io = rte_mem_virt2iova(reinterpret_cast<void*>(a));
      if (io == RTE_BAD_IOVA || io != iova0 + (a - start)) return nullptr;
    }
  }
  auto* m = new (std::nothrow) ExtMem;
  if (m == nullptr) return nullptr;
  m->base = p;
  m->len = len;
  m->iova_base = iova0;
  m->shinfo.free_cb = ext_free_cb;
  m->shinfo.fcb_opaque = m;
  rte_mbuf_ext_refcnt_set(&m->shinfo, 1);  // the registration's reference
  return m;
}

bool DpdkQueueIo::ext_release(ExtMem* m, uint32_t timeout_ms) noexcept {
  if (m == nullptr) return true;
  if (rte_mbuf_ext_refcnt_update(&m->shinfo, -1) == 0) m->released.store(true, std::memory_order_release);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!m->released.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  delete m;
  return true;
}

uint32_t DpdkQueueIo::ext_inflight(const ExtMem* m) noexcept {
  if (m == nullptr || m->released.load(std::memory_order_acquire)) return 0;
  const uint16_t r = rte_mbuf_ext_refcnt_read(&m->shinfo);
  return r ? r - 1u : 0u;
}

void DpdkQueueIo::attach_ext(io::PktBuf** bufs, uint16_t n) noexcept {
  for (uint16_t i = 0; i < n; ++i) {
    io::PktBuf* b = bufs[i];
    if (b->ext == nullptr) [[likely]]
      continue;
    auto* x = static_cast<ExtMem*>(b->ext_ref);
    rte_mbuf* head = mbuf_of(b);
    rte_mbuf* seg[2];
    if (x == nullptr || rte_pktmbuf_alloc_bulk(pool_, seg, 2) != 0) [[unlikely]] {
      // The engine checked the whole frame fits this buffer: copy it in.
      std::memcpy(b->data + b->len, b->ext, b->ext_len);
      std::memcpy(b->data + b->len + b->ext_len, b->tail, b->tail_len);
      b->len += b->ext_len + b->tail_len;
      b->ext = nullptr;
      ctr_.tx_zero_copy_fallback.add(1);
      continue;
    }
    uint8_t* addr = const_cast<uint8_t*>(b->ext);
    // Reference first, then the segment that holds it (freed: -1, free_cb at 0).
    rte_mbuf_ext_refcnt_update(&x->shinfo, 1);
    rte_pktmbuf_attach_extbuf(seg[0], addr, x->iova_base + static_cast<uint64_t>(addr - x->base),
                              static_cast<uint16_t>(b->ext_len), &x->shinfo);
    seg[0]->data_len = static_cast<uint16_t>(b->ext_len);
    std::memcpy(rte_pktmbuf_mtod(seg[1], uint8_t*), b->tail, b->tail_len);
    seg[1]->data_len = b->tail_len;
    seg[0]->next = seg[1];
    head->next = seg[0];
    head->nb_segs = 3;
    b->ext = nullptr;
    ctr_.tx_zero_copy.add(1);
  }
}

DpdkQueueIo::DpdkQueueIo(const Port& port, uint16_t queue)
    : port_(port.id()),
      queue_(queue),
      pool_(port.pool()),
      mac_(port.mac()),
      zero_copy_(port.multi_seg_tx()),
      tx_kick_(port.driver() == "net_af_packet") {
  if (queue >= port.rx_queues() || queue >= port.tx_queues())
    throw PortError(port.name() + ": no queue " + std::to_string(queue));
  capacity_ = static_cast<uint32_t>(port.data_room()) - RTE_PKTMBUF_HEADROOM;
}

uint16_t DpdkQueueIo::rx_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  rte_mbuf* m[kMaxBurst];
  n = std::min(n, kMaxBurst);
  const uint16_t got = rte_eth_rx_burst(port_, queue_, m, n);
  uint16_t k = 0;
  uint64_t bytes = 0;
  for (uint16_t i = 0; i < got; ++i) {
    rte_mbuf* mb = m[i];
    if (mb->nb_segs != 1) [[unlikely]] {
      // One frame in several mbufs (a peer's zero-copy frame over net_ring, a
      // PMD's scattered RX): the engine parses contiguous frames.
      if (rte_pktmbuf_linearize(mb) != 0) {
        ctr_.rx_multiseg_drops.add(1);
        rte_pktmbuf_free(mb);
        continue;
      }
      ctr_.rx_linearized.add(1);
    }
    io::PktBuf* b = pktbuf_of(mb);
    b->ext = nullptr;
    b->data = rte_pktmbuf_mtod(mb, uint8_t*);
    b->len = mb->pkt_len;
    b->cap = static_cast<uint32_t>(mb->buf_len - mb->data_off);
    b->port = port_;
    b->queue = queue_;
    bytes += mb->pkt_len;
    bufs[k++] = b;
  }
  if (k != 0) {
    ctr_.rx_packets.add(k);
    ctr_.rx_bytes.add(bytes);
  }
  return k;
}

uint16_t DpdkQueueIo::alloc_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  rte_mbuf* m[kMaxBurst];
  n = std::min(n, kMaxBurst);
  const uint16_t want = n;
  // All-or-nothing bulk allocation: on shortage, settle for fewer.
  while (n != 0 && rte_pktmbuf_alloc_bulk(pool_, m, n) != 0) n /= 2;
  if (n != want) ctr_.alloc_failures.add(want - n);
  for (uint16_t i = 0; i < n; ++i) {
    io::PktBuf* b = pktbuf_of(m[i]);
    b->data = rte_pktmbuf_mtod(m[i], uint8_t*);
    b->len = 0;
    b->ext = nullptr;
    b->cap = capacity_;
    b->port = port_;
    b->queue = queue_;
    bufs[i] = b;
  }
  return n;
}

uint16_t DpdkQueueIo::tx_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  rte_mbuf* m[kMaxBurst];
  uint16_t done = 0;
  uint64_t bytes = 0;
  while (done < n) {
    const uint16_t chunk = std::min<uint16_t>(static_cast<uint16_t>(n - done), kMaxBurst);
    if (zero_copy_) attach_ext(bufs + done, chunk);
    uint64_t chunk_bytes = 0;
    for (uint16_t i = 0; i < chunk; ++i) {
      const io::PktBuf* b = bufs[done + i];
      rte_mbuf* mb = mbuf_of(b);
      // The engine may have moved the frame start inside the buffer.
      mb->data_off = static_cast<uint16_t>(b->data - static_cast<uint8_t*>(mb->buf_addr));
      mb->data_len = static_cast<uint16_t>(b->len);
      mb->pkt_len = b->len;
      if (mb->nb_segs > 1) [[unlikely]] {  // appended segments (append_external / append_buf)
        for (const rte_mbuf* s = mb->next; s != nullptr; s = s->next) mb->pkt_len += s->data_len;
      }
      chunk_bytes += mb->pkt_len;
      m[i] = mb;
    }
    const uint16_t sent = rte_eth_tx_burst(port_, queue_, m, chunk);
    if (sent < chunk) [[unlikely]] {
      for (uint16_t i = sent; i < chunk; ++i) chunk_bytes -= m[i]->pkt_len;
    }
    bytes += chunk_bytes;
    done = static_cast<uint16_t>(done + sent);
    if (sent < chunk) break;
  }
  if (done != 0) {
    ctr_.tx_packets.add(done);
    ctr_.tx_bytes.add(bytes);
  }
  if (done < n) ctr_.tx_full.add(n - done);
  return done;
}

bool DpdkQueueIo::append_external(io::PktBuf* b, void* addr, uint64_t iova, uint16_t len,
                                  rte_mbuf_ext_shared_info* shinfo) noexcept {
  rte_mbuf* seg = rte_pktmbuf_alloc(pool_);
  if (seg == nullptr) [[unlikely]] {
    ctr_.alloc_failures.add(1);
    return false;
  }
  rte_mbuf_ext_refcnt_update(shinfo, 1);
  rte_pktmbuf_attach_extbuf(seg, addr, iova, len, shinfo);
  seg->data_len = len;
  seg->pkt_len = len;
  rte_mbuf* head = mbuf_of(b);
  rte_pktmbuf_lastseg(head)->next = seg;
  head->nb_segs = static_cast<uint16_t>(head->nb_segs + 1);
  return true;
}

void DpdkQueueIo::append_buf(io::PktBuf* b, io::PktBuf* tail) noexcept {
  rte_mbuf* t = mbuf_of(tail);
  t->data_off = static_cast<uint16_t>(tail->data - static_cast<uint8_t*>(t->buf_addr));
  t->data_len = static_cast<uint16_t>(tail->len);
  t->pkt_len = tail->len;
  rte_mbuf* head = mbuf_of(b);
  rte_pktmbuf_lastseg(head)->next = t;
  head->nb_segs = static_cast<uint16_t>(head->nb_segs + t->nb_segs);
}

void DpdkQueueIo::free_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  rte_mbuf* m[kMaxBurst];
  while (n != 0) {
    const uint16_t chunk = std::min(n, kMaxBurst);
    for (uint16_t i = 0; i < chunk; ++i) m[i] = mbuf_of(bufs[i]);
    rte_pktmbuf_free_bulk(m, chunk);
    bufs += chunk;
    n = static_cast<uint16_t>(n - chunk);
  }
}

TscClock::TscClock() : base_(rte_rdtsc()), hz_(rte_get_tsc_hz()) {
  if (hz_ == 0) hz_ = 1'000'000'000;
  mult_ = static_cast<uint64_t>((static_cast<u128>(1'000'000'000) << 32) / hz_);
}

uint64_t TscClock::now_ns() const noexcept { return ns_of(rte_rdtsc()); }

}  // namespace droce::dpdk

#include "dpdk/queue_io.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include <algorithm>

namespace droce::dpdk {

__extension__ typedef unsigned __int128 u128;

io::PktBuf* DpdkQueueIo::pktbuf_of(rte_mbuf* m) noexcept { return static_cast<io::PktBuf*>(rte_mbuf_to_priv(m)); }
static_assert(sizeof(rte_mbuf) == DpdkQueueIo::kMbufHeaderSize);

DpdkQueueIo::DpdkQueueIo(const Port& port, uint16_t queue)
    : port_(port.id()), queue_(queue), pool_(port.pool()), mac_(port.mac()) {
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
      ctr_.rx_multiseg_drops.add(1);
      rte_pktmbuf_free(mb);
      continue;
    }
    io::PktBuf* b = pktbuf_of(mb);
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

uint64_t TscClock::now_ns() const noexcept {
  const uint64_t d = rte_rdtsc() - base_;
  return static_cast<uint64_t>((static_cast<u128>(d) * mult_) >> 32);
}

}  // namespace droce::dpdk

#include "memlink/memlink.h"

#include <algorithm>
#include <cstring>

#include "wire/packet.h"

namespace droce::memlink {

namespace {
constexpr const char* kCounterNames[] = {"tx_frames", "delivered", "lost",     "reordered", "duplicated",
                                         "corrupted", "ce_marked", "no_route", "pool_empty", "queue_full",
                                         "rx_overrun", "bottleneck_drop", "bottleneck_marked", "pfc_pause"};
static_assert(std::size(kCounterNames) == static_cast<size_t>(Counter::kCount));

// Min-heap order: earliest delivery first, then send order.
struct Later {
  template <typename P>
  bool operator()(const P& a, const P& b) const noexcept {
    return a.at != b.at ? a.at > b.at : a.seq > b.seq;
  }
};

// Offset of the L3 header and whether it is IPv6; false if not IP.
bool l3_of(const io::PktBuf* b, uint32_t* l3, bool* v6) noexcept {
  if (b->len < 14) return false;
  uint32_t off = 12;
  uint16_t et = static_cast<uint16_t>((b->data[off] << 8) | b->data[off + 1]);
  off = 14;
  if (et == wire::kEtherTypeVlan) {
    if (b->len < 18) return false;
    et = static_cast<uint16_t>((b->data[16] << 8) | b->data[17]);
    off = 18;
  }
  if (et == wire::kEtherTypeIpv4) {
    if (b->len < off + 20) return false;
    *v6 = false;
  } else if (et == wire::kEtherTypeIpv6) {
    if (b->len < off + 40) return false;
    *v6 = true;
  } else {
    return false;
  }
  *l3 = off;
  return true;
}
}  // namespace

const char* counter_name(Counter c) noexcept {
  const auto i = static_cast<size_t>(c);
  return i < std::size(kCounterNames) ? kCounterNames[i] : "unknown";
}

namespace {
uint32_t pow2_at_least(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}
}  // namespace

Port::Port(Link* link, uint16_t index, wire::MacAddr mac, uint32_t depth)
    : link_(link),
      index_(index),
      mac_(mac),
      heap_(new Pending[depth]),
      heap_cap_(depth),
      fifo_(new Pending[pow2_at_least(depth)]),
      fifo_mask_(pow2_at_least(depth) - 1) {}

const Port::Pending* Port::earliest() const noexcept {
  const Pending* f = fifo_head_ != fifo_tail_ ? &fifo_[fifo_tail_ & fifo_mask_] : nullptr;
  const Pending* h = heap_len_ ? &heap_[0] : nullptr;
  if (!f) return h;
  if (!h) return f;
  return Later{}(*f, *h) ? h : f;
}

uint32_t Port::buf_capacity() const noexcept { return link_->buf_size_; }

uint16_t Port::alloc_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  uint16_t i = 0;
  for (; i < n; ++i) {
    io::PktBuf* b = link_->get_buf();
    if (!b) {
      link_->count(Counter::PoolEmpty);
      break;
    }
    b->len = 0;
    b->port = index_;
    bufs[i] = b;
  }
  return i;
}

void Port::free_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  for (uint16_t i = 0; i < n; ++i) link_->put_buf(bufs[i]);
}

void Port::enqueue(io::PktBuf* b, uint64_t at, uint64_t bn_depart) noexcept {
  const uint32_t fifo_len = fifo_head_ - fifo_tail_;
  const bool in_order = fifo_len == 0 || fifo_[(fifo_head_ - 1) & fifo_mask_].at <= at;
  if (in_order && fifo_len <= fifo_mask_) {
    fifo_[fifo_head_++ & fifo_mask_] = Pending{at, link_->seq_++, b, bn_depart};
    return;
  }
  if (heap_len_ >= heap_cap_) {
    link_->count(Counter::QueueFull);
    link_->put_buf(b);
    return;
  }
  heap_[heap_len_++] = Pending{at, link_->seq_++, b, bn_depart};
  std::push_heap(heap_.get(), heap_.get() + heap_len_, Later{});
}

uint16_t Port::tx_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  Link& L = *link_;
  if (refuse_tx_ && n) {
    --refuse_tx_;
    return 0;
  }
  const uint64_t now = L.clock_.now_ns();
  tx_ready_ns_ = 0;
  for (uint16_t i = 0; i < n; ++i) {
    io::PktBuf* b = bufs[i];
    if (tx_rate_bps_ && tx_backlog_bytes_) {  // a full TX ring takes no more
      const uint64_t room_ns = tx_backlog_bytes_ > b->len ? (tx_backlog_bytes_ - b->len) * 8'000'000'000ull / tx_rate_bps_ : 0;
      if (tx_next_ > now + room_ns) {
        tx_ready_ns_ = tx_next_ - room_ns;
        return i;
      }
    }
    // Route by destination MAC.
    Port* dst = nullptr;
    for (auto& p : L.ports_) {
      if (p.get() != this && b->len >= 6 && std::memcmp(p->mac_.data(), b->data, 6) == 0) {
        dst = p.get();
        break;
      }
    }
    if (dst && dst->bn_.pfc()) {  // PFC: a paused link takes nothing; the sender keeps the rest
      const uint64_t wire_ns = faults_.delay_ns + (tx_rate_bps_ ? b->len * 8'000'000'000ull / tx_rate_bps_ : 0);
      const uint64_t arrive = (tx_rate_bps_ ? std::max(now, tx_next_) : now) + wire_ns;
      bool paused = false;
      if (!fault::bottleneck_pfc_admit(dst->bn_, dst->bn_next_, dst->bn_pfc_until_, arrive, b->len, &paused)) {
        if (paused) L.count(Counter::PfcPause);
        tx_ready_ns_ = std::max(now + 1, dst->bn_pfc_until_ > wire_ns ? dst->bn_pfc_until_ - wire_ns : 0);
        return i;
      }
    }
    L.count(Counter::TxFrames);
    if (L.recording_) L.recorded_.push_back({now, index_, std::vector<uint8_t>(b->data, b->data + b->len)});
    if (!dst) {
      L.count(Counter::NoRoute);
      L.put_buf(b);
      continue;
    }
    const Faults& f = faults_;
    if (f.loss > 0 && L.uniform() < f.loss) {
      L.count(Counter::Lost);
      L.put_buf(b);
      continue;
    }
    if (f.ce_mark > 0 && L.uniform() < f.ce_mark && L.mark_ce(b)) L.count(Counter::CeMarked);
    const bool corrupted = f.corrupt > 0 && L.uniform() < f.corrupt;
    if (corrupted) {
      L.corrupt(b);
      L.count(Counter::Corrupted);
    }
    uint64_t at = now + f.delay_ns;
    if (tx_rate_bps_) {  // serialised at this port's line rate
      const uint64_t start = std::max(now, tx_next_);
      tx_next_ = start + b->len * 8'000'000'000ull / tx_rate_bps_;
      at = tx_next_ + f.delay_ns;
    }
    uint64_t bn_depart = 0;
    if (dst->bn_.active()) {
      const fault::BnVerdict v = fault::bottleneck_offer(dst->bn_, dst->bn_next_, dst->bn_max_q_, at, b->len,
                                                         [&L] { return L.uniform(); }, &at);
      if (v == fault::BnVerdict::Drop) {
        L.count(Counter::BottleneckDrop);
        L.put_buf(b);
        continue;
      }
      if (v == fault::BnVerdict::Mark && L.mark_ce(b)) L.count(Counter::BottleneckMarked);
      if (dst->bn_.mark_dequeue) bn_depart = at;
    }
    if (f.reorder > 0 && L.uniform() < f.reorder) {
      at += f.reorder_delay_ns;
      L.count(Counter::Reordered);
    }
    if (f.duplicate > 0 && L.uniform() < f.duplicate) {
      if (io::PktBuf* d = L.get_buf()) {
        std::memcpy(d->data, b->data, b->len);
        d->len = b->len;
        d->port = dst->index_;
        L.count(Counter::Duplicated);
        if (corrupted) L.count(Counter::Corrupted);  // two damaged frames delivered
        dst->enqueue(d, now + f.delay_ns + (L.uniform() < 0.5 ? f.reorder_delay_ns : 0));
      } else {
        L.count(Counter::PoolEmpty);
      }
    }
    if (dst->rx_ns_per_frame_) {  // a slow receiver: one frame per ns_per_frame, bounded backlog
      if (dst->in_flight() >= dst->rx_backlog_) {
        L.count(Counter::RxOverrun);
        L.put_buf(b);
        continue;
      }
      if (at < dst->rx_next_) at = dst->rx_next_;
      dst->rx_next_ = at + dst->rx_ns_per_frame_;
    }
    b->port = dst->index_;
    dst->enqueue(b, at, bn_depart);
  }
  return n;
}

uint16_t Port::rx_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  const uint64_t now = link_->clock_.now_ns();
  uint16_t i = 0;
  while (i < n) {
    const Pending* e = earliest();
    if (!e || e->at > now) break;
    Pending p;
    if (e == &heap_[0] && heap_len_) {
      std::pop_heap(heap_.get(), heap_.get() + heap_len_, Later{});
      p = heap_[--heap_len_];
    } else {
      p = fifo_[fifo_tail_++ & fifo_mask_];
    }
    // Marking on departure: the queue behind it when it left (the frames
    // offered since; those still on their way in to the queue count too, at
    // most a link delay and a TX ring per sender).
    if (p.bn_depart && fault::bottleneck_mark_dequeue(bn_, bn_next_, p.bn_depart, p.buf->len,
                                                      [this] { return link_->uniform(); }) &&
        link_->mark_ce(p.buf))
      link_->count(Counter::BottleneckMarked);
    bufs[i++] = p.buf;
  }
  link_->count(Counter::Delivered, i);
  return i;
}

Link::Link(const io::Clock& clock, uint64_t seed, uint32_t pool_bufs, uint32_t buf_size)
    : clock_(clock),
      rng_(seed),
      pool_bufs_(pool_bufs),
      buf_size_(buf_size),
      storage_(new uint8_t[size_t{pool_bufs} * buf_size]),
      bufs_(new io::PktBuf[pool_bufs]),
      free_(new io::PktBuf*[pool_bufs]) {
  for (uint32_t i = 0; i < pool_bufs; ++i) {
    bufs_[i].data = storage_.get() + size_t{i} * buf_size;
    bufs_[i].cap = buf_size;
    bufs_[i].backend = this;
    free_[free_len_++] = &bufs_[i];
  }
}

Port& Link::add_port(wire::MacAddr mac) {
  ports_.push_back(std::unique_ptr<Port>(new Port(this, static_cast<uint16_t>(ports_.size()), mac, pool_bufs_)));
  return *ports_.back();
}

io::PktBuf* Link::get_buf() noexcept { return free_len_ ? free_[--free_len_] : nullptr; }

void Link::put_buf(io::PktBuf* b) noexcept {
  if (b == nullptr || b->backend != this || free_len_ >= pool_bufs_) return;
  b->len = 0;
  free_[free_len_++] = b;
}

uint64_t Port::bottleneck_queue_bytes(uint64_t now) const noexcept {
  return fault::bottleneck_queue_bytes(bn_, bn_next_, now);
}

uint64_t Link::next_delivery_ns() const noexcept {
  uint64_t t = UINT64_MAX;
  for (auto& p : ports_)
    if (const Port::Pending* e = p->earliest()) t = std::min(t, e->at);
  return t;
}

size_t Link::in_flight() const noexcept {
  size_t n = 0;
  for (auto& p : ports_) n += p->in_flight();
  return n;
}

void Link::corrupt(io::PktBuf* b) noexcept {
  // Flip one bit after the masked BTH byte (resv8a): the BTH's QPN/PSN, the
  // extension headers, payload, pad or ICRC, all covered by the ICRC.
  uint32_t l3 = 0;
  bool v6 = false;
  uint32_t from = 14;
  if (l3_of(b, &l3, &v6)) from = l3 + (v6 ? 40 : 20) + 8 + 5;
  if (b->len <= from) from = b->len > 0 ? b->len - 1 : 0;
  if (b->len == 0) return;
  const uint32_t span = b->len - from;
  const uint32_t off = from + static_cast<uint32_t>(uniform() * span) % span;
  b->data[off] ^= static_cast<uint8_t>(1u << (static_cast<uint32_t>(uniform() * 8) & 7));
}

bool Link::mark_ce(io::PktBuf* b) noexcept { return fault::mark_ce(b->data, b->len); }

}  // namespace droce::memlink

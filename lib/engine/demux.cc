// DemuxIo: the per-frame path between a core's DPDK queue and its engine.
// RX: frames from the device queue, from other cores' rings and from the
// loopback FIFO, classified (RoCEv2 to this core's engine or forwarded to the
// QP's owning core, ARP/ND/ICMP to the netstack on the port's home core,
// multicast fanned out) into the engine's burst. TX: the engine's frames to
// the device, frames to our own addresses into the loopback FIFO, and the
// fault injector on either side. The objects and loops that own it are in
// dataplane.cc (README.md).
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include <algorithm>
#include <cstring>

#include "engine/dataplane.h"

namespace droce::engine {

using stats::CoreCounter;
using stats::PortCounter;

namespace {

inline uint16_t be16(const uint8_t* p) noexcept { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

}  // namespace

DemuxIo::DemuxIo(Dataplane& dp, CoreLoop& core, uint32_t port, uint32_t my_index, dpdk::DpdkQueueIo& q,
                 config::PortFaults* faults, stats::CounterBlock<PortCounter>* pc,
                 stats::CounterBlock<CoreCounter>* cc)
    : dp_(dp),
      core_(core),
      port_(port),
      me_(my_index),
      q_(q),
      faults_(faults),
      pc_(pc),
      cc_(cc),
      mac_(q.mac()),
      kicks_(q.tx_needs_kick() ? kKicks : 0) {
  if (faults_) {
    frx_ = std::make_unique<fault::FaultInjector>(*faults_, config::FaultDir::rx, uint64_t{q.queue_id()} * 2, pc_);
    ftx_ = std::make_unique<fault::FaultInjector>(*faults_, config::FaultDir::tx, uint64_t{q.queue_id()} * 2 + 1, pc_);
    frx_->set_clock(&dp_.clock_);  // bottleneck mode
    ftx_->set_clock(&dp_.clock_);
  }
}

DemuxIo::~DemuxIo() { drain(); }

uint64_t DemuxIo::tx_bottleneck_queue_bytes() const noexcept {
  return ftx_ ? ftx_->bottleneck_queue_bytes(dp_.clock().now_ns()) : 0;
}

void DemuxIo::drain() noexcept {
  io::PktBuf* b[32];
  for (auto* f : {frx_.get(), ftx_.get()}) {
    if (!f) continue;
    for (uint16_t k; (k = f->flush(b, 32)) != 0;) q_.free_burst(b, k);  // bounded: each call empties up to 32
  }
  for (uint16_t i = 0; i < nbacklog_; ++i) release(backlog_[i]);
  nbacklog_ = 0;
  while (loop_tail_ != loop_head_) release(loop_[loop_tail_++ & (kLoop - 1)]);
  flush_free();
}

void DemuxIo::forward(io::PktBuf* b, uint32_t to) noexcept {
  rte_ring* r = dp_.ports_[port_].ring(me_, to);
  if (rte_ring_sp_enqueue(r, b) == 0) {
    cc_->add(CoreCounter::ring_enqueued);
  } else {
    cc_->add(CoreCounter::ring_full_drops);
    release(b);
  }
}

void DemuxIo::deliver(io::PktBuf* b, io::PktBuf** out, uint16_t& nout, uint16_t cap) noexcept {
  if (nout < cap) {
    out[nout++] = b;
  } else if (nbacklog_ < kTmp) {
    backlog_[nbacklog_++] = b;
  } else {
    pc_->add(PortCounter::tx_drop_full);  // cannot happen with sane bursts; counted anyway
    release(b);
  }
}

bool DemuxIo::port_has_mcast_members() const noexcept {
  for (const transport::Engine* e : dp_.ports_[port_].engines)
    if (e->mcast_memberships() != 0) return true;
  return false;
}

void DemuxIo::fan_out(io::PktBuf* b, io::PktBuf** out, uint16_t& nout, uint16_t cap) noexcept {
  const Dataplane::PortState& ps = dp_.ports_[port_];
  const uint32_t n = static_cast<uint32_t>(ps.engines.size());
  uint32_t to[kMaxFan];
  uint32_t k = 0;
  for (uint32_t i = 0; i < n && k < kMaxFan; ++i)
    if (ps.engines[i]->mcast_memberships() != 0) to[k++] = i;
  if (k == 0) to[k++] = 0;  // nobody joined anything: the home core's engine counts it
  cc_->add(CoreCounter::mcast_fanout, k);
  // One mbuf for all: each engine only reads it and frees its reference.
  if (k > 1) rte_mbuf_refcnt_update(dpdk::DpdkQueueIo::mbuf_of(b), static_cast<int16_t>(k - 1));
  for (uint32_t i = 0; i < k; ++i) {
    if (to[i] == me_) {
      deliver(b, out, nout, cap);
    } else {
      forward(b, to[i]);
    }
  }
}

void DemuxIo::loop_mcast_copy(const io::PktBuf* b) noexcept {
  // Only frames whose bytes are all at data (a zero-copy frame's payload is
  // the MR's, by reference): UD messages fit one MTU, below zero_copy_min
  // unless the MTU is 4096; those are not looped back (counted).
  if (b->ext != nullptr || loop_head_ - loop_tail_ == kLoop) {
    pc_->add(PortCounter::loopback_drops);
    return;
  }
  io::PktBuf* c = nullptr;
  if (q_.alloc_burst(&c, 1) != 1 || c->cap < b->len) {
    if (c) release(c);
    pc_->add(PortCounter::loopback_drops);
    return;
  }
  std::memcpy(c->data, b->data, b->len);
  c->len = b->len;
  loop_[loop_head_++ & (kLoop - 1)] = c;
  pc_->add(PortCounter::tx_loopback);
}

void DemuxIo::classify(io::PktBuf* b, io::PktBuf** out, uint16_t& nout, uint16_t cap, Origin from) noexcept {
  const bool from_ring = from != Origin::Wire;
  const uint8_t* d = b->data;
  const uint32_t len = b->len;
  if (len < 14) {
    pc_->add(PortCounter::rx_drop_bad_header);
    release(b);
    return;
  }
  uint16_t et = be16(d + 12);
  uint32_t l3 = 14;
  if (et == wire::kEtherTypeVlan) {
    if (len < 18) {
      pc_->add(PortCounter::rx_drop_bad_header);
      release(b);
      return;
    }
    et = be16(d + 16);
    l3 = 18;
  }
  uint32_t l4 = 0;
  if (et == wire::kEtherTypeIpv4) {
    if (len >= l3 + 20 && d[l3 + 9] == wire::kIpProtoUdp) l4 = l3 + (d[l3] & 0x0Fu) * 4;
  } else if (et == wire::kEtherTypeIpv6) {
    if (len >= l3 + 40 && d[l3 + 6] == wire::kIpProtoUdp) l4 = l3 + 40;
  }
  if (l4 != 0 && len >= l4 + 8 + 12 && be16(d + l4 + 2) == wire::kRoceV2Port) {
    const uint8_t* bth = d + l4 + 8;
    const uint32_t dqpn = uint32_t{bth[5]} << 16 | uint32_t{bth[6]} << 8 | bth[7];
    if (!from_ring) {
      // Our MAC, or a group MAC (01:00:5e / 33:33, what the device's filter
      // let in) for a multicast QPN.
      const bool ours = std::memcmp(d, mac_.data(), 6) == 0 || ((d[0] & 1) != 0 && dqpn == wire::kMcastQpn);
      if (!ours) {
        pc_->add(PortCounter::rx_drop_not_ours);
        release(b);
        return;
      }
      pc_->add(PortCounter::rx_roce);
    }
    if (dqpn == wire::kMcastQpn) [[unlikely]] {
      if (from == Origin::Ring) {
        deliver(b, out, nout, cap);  // fanned out by the core that received it
      } else {
        fan_out(b, out, nout, cap);
      }
      return;
    }
    // QPN 1 (the GSI QP, the CM's MADs) lives on the port's home core.
    const uint32_t owner = dp_.ports_[port_].owner.of(dqpn);
    if (owner == me_) {
      deliver(b, out, nout, cap);
    } else {
      forward(b, owner);
    }
    return;
  }
  if (me_ == 0) {
    host_frame(b, dp_.clock_.now_ns());
  } else {
    forward(b, 0);
  }
}

void DemuxIo::host_frame(io::PktBuf* b, uint64_t now) noexcept {
  Dataplane::PortState& ps = dp_.ports_[port_];
  const uint8_t* d = b->data;
  uint16_t et = be16(d + 12);
  uint32_t l3 = 14;
  if (et == wire::kEtherTypeVlan && b->len >= 18) {
    et = be16(d + 16);
    l3 = 18;
  }
  enum { kArp, kIcmp, kNd, kOther } kind = kOther;
  if (et == wire::kEtherTypeArp) kind = kArp;
  else if (et == wire::kEtherTypeIpv4 && b->len > l3 + 9 && d[l3 + 9] == netstack::kIpProtoIcmp) kind = kIcmp;
  else if (et == wire::kEtherTypeIpv6 && b->len > l3 + 6 && d[l3 + 6] == netstack::kIpProtoIcmpv6) kind = kNd;
  if (kind == kArp) pc_->add(PortCounter::rx_arp);
  if (kind == kIcmp) pc_->add(PortCounter::rx_icmp);
  if (kind == kNd) pc_->add(PortCounter::rx_nd);

  io::PktBuf* reply = nullptr;
  if (q_.alloc_burst(&reply, 1) != 1) reply = nullptr;
  const std::span<uint8_t> out = reply ? std::span<uint8_t>(reply->data, reply->cap) : std::span<uint8_t>();
  const netstack::Result r = ps.stack->handle({b->data, b->len}, out, now);
  release(b);
  if (r.verdict == netstack::Verdict::Reply && reply) {
    reply->len = r.reply_len;
    if (kind == kArp) pc_->add(PortCounter::tx_arp);
    if (kind == kIcmp) pc_->add(PortCounter::tx_icmp);
    if (kind == kNd) pc_->add(PortCounter::tx_nd);
    send_host(reply);
    return;
  }
  if (reply) release(reply);
  if (r.verdict == netstack::Verdict::Dropped) {
    using netstack::Drop;
    switch (r.drop) {
      case Drop::VlanMismatch: pc_->add(PortCounter::rx_drop_vlan); break;
      case Drop::NotOurMac: case Drop::ArpNotForUs: case Drop::Ipv4NotForUs: case Drop::Ipv6NotForUs:
      case Drop::NdNotForUs: case Drop::UnknownEthertype: case Drop::UdpNotRoce: case Drop::IpProtoUnhandled:
      case Drop::IcmpUnhandled: case Drop::Icmpv6Unhandled:
        pc_->add(PortCounter::rx_drop_not_ours);
        break;
      default: pc_->add(PortCounter::rx_drop_bad_header); break;
    }
  }
}

void DemuxIo::send_host(io::PktBuf* b) noexcept {
  kick_left_ = kicks_;
  // Host frames bypass the fault injector (README: Limits).
  if (q_.tx_burst(&b, 1) == 1) {
    pc_->add(PortCounter::tx_packets);
    pc_->add(PortCounter::tx_bytes, b->len);
  } else {
    pc_->add(PortCounter::tx_drop_full);
    release(b);
  }
}

void DemuxIo::netstack_timers(uint64_t now) noexcept {
  Dataplane::PortState& ps = dp_.ports_[port_];
  for (int k = 0; k < 8; ++k) {
    io::PktBuf* b = nullptr;
    if (q_.alloc_burst(&b, 1) != 1) return;
    const uint32_t len = ps.stack->poll_timers(now, {b->data, b->cap});
    if (len == 0) {
      q_.free_burst(&b, 1);
      return;
    }
    b->len = len;
    send_host(b);
  }
}

uint16_t DemuxIo::rx_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  uint16_t nout = 0;
  // Doorbell: net_af_packet counts frames it could not hand to the kernel
  // (ENOBUFS/EAGAIN) as sent and leaves them in its TX ring until the next
  // sendto(); an empty burst is that kick. Other PMDs return at once.
  if (kick_left_) {
    --kick_left_;
    rte_eth_tx_burst(q_.port_id(), q_.queue_id(), nullptr, 0);
  }
  // TX bottleneck (fault injector): frames whose departure time has come leave
  // even when the engine sends nothing.
  if (ftx_ && ftx_->bottleneck_frames()) {
    io::PktBuf* out[kTmp];
    const uint16_t k = ftx_->release(out, kTmp);
    const uint16_t sent = k ? send_frames(out, k, true, 4) : 0;
    if (sent < k) refused(out + sent, static_cast<uint16_t>(k - sent));
  }
  // 0. Frames that did not fit last time.
  if (nbacklog_) {
    const uint16_t k = std::min(nbacklog_, n);
    std::memcpy(bufs, backlog_, k * sizeof(io::PktBuf*));
    std::memmove(backlog_, backlog_ + k, (nbacklog_ - k) * sizeof(io::PktBuf*));
    nbacklog_ = static_cast<uint16_t>(nbacklog_ - k);
    nout = k;
  }
  // 1. Frames our engine sent to our own MAC (loopback), back into the
  // classifier: this engine, another core's ring, or the home core. At most
  // half the burst here (the rings and the device queue get their turn), the
  // rest after them if room is left.
  const uint16_t lb_cap = static_cast<uint16_t>(nout + (n - nout + 1) / 2);
  while (nout < lb_cap && loop_tail_ != loop_head_) classify(loop_[loop_tail_++ & (kLoop - 1)], bufs, nout, n, Origin::Loop);
  io::PktBuf* tmp[kTmp];
  // 2. Frames other cores forwarded to us.
  const Dataplane::PortState& ps = dp_.ports_[port_];
  const uint32_t ncores = static_cast<uint32_t>(ps.cores.size());
  if (ncores > 1) {
    for (uint32_t src = 0; src < ncores && nout < n; ++src) {
      if (src == me_) continue;
      rte_ring* r = ps.ring(src, me_);
      const unsigned k = rte_ring_sc_dequeue_burst(r, reinterpret_cast<void**>(tmp), n - nout, nullptr);
      if (k == 0) continue;
      cc_->add(CoreCounter::ring_dequeued, k);
      for (unsigned i = 0; i < k; ++i) classify(tmp[i], bufs, nout, n, Origin::Ring);
    }
  }
  // 3. Our own queue.
  if (nout < n) {
    uint16_t want = static_cast<uint16_t>(n - nout);
    uint16_t k = q_.rx_burst(tmp, want);
    if (k) {
      uint64_t bytes = 0;
      for (uint16_t i = 0; i < k; ++i) bytes += tmp[i]->len;
      pc_->add(PortCounter::rx_packets, k);
      pc_->add(PortCounter::rx_bytes, bytes);
      cc_->add(CoreCounter::rx_bursts);
    }
    if (frx_ && !frx_->passthrough()) k = frx_->apply(q_, tmp, k, kTmp);
    for (uint16_t i = 0; i < k; ++i) {
      if (i + 1 < k) __builtin_prefetch(tmp[i + 1]->data);
      classify(tmp[i], bufs, nout, n, Origin::Wire);
    }
  }
  // 4. More loopback frames if the burst has room.
  while (nout < n && loop_tail_ != loop_head_) classify(loop_[loop_tail_++ & (kLoop - 1)], bufs, nout, n, Origin::Loop);
  flush_free();
  return nout;
}

bool DemuxIo::to_our_ip(const io::PktBuf* b) const noexcept {
  // Only for frames to our own MAC (rare on the wire path). Two ports with one
  // MAC (net_ring pairs in tests) still reach each other: the IP decides.
  const uint8_t* d = b->data;
  if (b->len < 14) return false;
  uint16_t et = be16(d + 12);
  uint32_t l3 = 14;
  if (et == wire::kEtherTypeVlan) {
    if (b->len < 18) return false;
    et = be16(d + 16);
    l3 = 18;
  }
  const netstack::NetStack& st = *dp_.ports_[port_].stack;  // addresses: fixed at construction
  if (et == wire::kEtherTypeIpv4 && b->len >= l3 + 20) {
    const uint8_t* a = d + l3 + 16;
    return st.is_our_ipv4(uint32_t{a[0]} << 24 | uint32_t{a[1]} << 16 | uint32_t{a[2]} << 8 | a[3]);
  }
  if (et == wire::kEtherTypeIpv6 && b->len >= l3 + 40) {
    wire::Gid g;
    std::memcpy(g.data(), d + l3 + 24, 16);
    return st.is_our_ipv6(g);
  }
  return false;
}

bool DemuxIo::loop_back(io::PktBuf* b) noexcept {
  if (loop_head_ - loop_tail_ == kLoop) {
    pc_->add(PortCounter::loopback_full);
    return false;
  }
  if (b->ext != nullptr) [[unlikely]] {
    // Zero-copy frame: the payload is the MR's bytes by reference, which may
    // change once the WQE completes; make the frame whole (the engine made
    // sure it fits its buffer, as DpdkQueueIo's copy fallback relies on).
    if (b->len + b->ext_len + b->tail_len > b->cap) {
      pc_->add(PortCounter::loopback_drops);
      b->ext = nullptr;
      release(b);
      return true;
    }
    std::memcpy(b->data + b->len, b->ext, b->ext_len);
    std::memcpy(b->data + b->len + b->ext_len, b->tail, b->tail_len);
    b->len += b->ext_len + b->tail_len;
    b->ext = nullptr;
  }
  loop_[loop_head_++ & (kLoop - 1)] = b;
  pc_->add(PortCounter::tx_loopback);
  return true;
}

uint16_t DemuxIo::send_frames(io::PktBuf** bufs, uint16_t n, bool must_take, int tries) noexcept {
  // In order, a prefix: runs of wire frames to the device, frames to
  // ourselves to the loopback FIFO. A full FIFO stops here like a full device
  // queue, unless must_take (the frames were taken already): a counted drop.
  uint16_t i = 0, wire = 0;
  uint64_t bytes = 0;
  while (i < n) {
    uint16_t j = i;
    while (j < n && !to_self(bufs[j])) ++j;
    if (j > i) {
      const uint16_t start = i;
      // Multicast frames also go to this node's other members (as rxe
      // loops back a multicast send to the QPs of its own device).
      for (uint16_t x = i; x < j; ++x)
        if ((bufs[x]->data[0] & 1) != 0 && port_has_mcast_members()) [[unlikely]] loop_mcast_copy(bufs[x]);
      for (int t = 0; t < tries && i < j; ++t) i = static_cast<uint16_t>(i + q_.tx_burst(bufs + i, static_cast<uint16_t>(j - i)));
      for (uint16_t x = start; x < i; ++x) bytes += dpdk::DpdkQueueIo::mbuf_of(bufs[x])->pkt_len;
      wire = static_cast<uint16_t>(wire + (i - start));
      if (i < j) break;
    }
    bool stop = false;
    while (i < n && to_self(bufs[i])) {
      if (!loop_back(bufs[i])) {
        if (!must_take) {
          stop = true;
          break;
        }
        pc_->add(PortCounter::loopback_drops);
        release(bufs[i]);
      }
      ++i;
    }
    if (stop) break;
  }
  if (wire) {
    pc_->add(PortCounter::tx_packets, wire);
    pc_->add(PortCounter::tx_bytes, bytes);
    cc_->add(CoreCounter::tx_bursts);
  }
  return i;
}

void DemuxIo::refused(io::PktBuf** bufs, uint16_t n) noexcept {
  // Frames the fault injector handed out that the device did not take: a TX
  // bottleneck keeps them at its head (a switch queue whose egress is busy);
  // without one they are a counted drop.
  const uint16_t back = ftx_->requeue_front(bufs, n);
  if (back < n) {
    pc_->add(PortCounter::tx_drop_full, n - back);
    q_.free_burst(bufs + back, static_cast<uint16_t>(n - back));
  }
}

uint16_t DemuxIo::tx_burst(io::PktBuf** bufs, uint16_t n) noexcept {
  if (n == 0) return 0;
  kick_left_ = kicks_;
  if (!ftx_ || !faults_->active(config::FaultDir::tx)) return send_frames(bufs, n, false, 1);
  // Faults on: the injector may drop, hold or add frames, so this call takes
  // all n; frames the device refuses are counted and freed.
  io::PktBuf* tmp[kTmp];
  // PFC on the bottleneck: what it does not take now stays with the engine.
  const uint16_t m0 = ftx_->pfc_admit(bufs, std::min<uint16_t>(n, kTmp / 2));
  if (m0 == 0) return 0;
  std::memcpy(tmp, bufs, m0 * sizeof(io::PktBuf*));
  const uint16_t m = ftx_->apply(q_, tmp, m0, kTmp);
  const uint16_t sent = send_frames(tmp, m, true, 4);
  if (sent < m) refused(tmp + sent, static_cast<uint16_t>(m - sent));
  return m0;
}

}  // namespace droce::engine

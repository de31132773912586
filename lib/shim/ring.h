// Single-producer single-consumer views of a droce_shm ring (droce_shm_abi.h).
// Header-only, C++20 std::atomic_ref over the plain uint32_t fields of the
// shared header, so the ABI stays C. Each side keeps private copies of the
// geometry and of its own index and a cache of the other side's index: it
// reads the shared line of the other side only when the cache says full
// (producer) or empty (consumer).
//
// Neither side trusts the other's index: an index that moved by more than
// the ring size (a corrupt or hostile peer) makes the view report
// corrupt() and refuse further work; the daemon turns that into an error
// on the object.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "shim/droce_shm_abi.h"

namespace droce::shim {

inline bool ring_geometry_ok(uint32_t entries) {
  return entries >= 1 && entries <= DROCE_SHM_MAX_RING && (entries & (entries - 1)) == 0;
}

// Smallest power of two >= n (n >= 1), or 0 when above the ring limit.
inline uint32_t ring_entries_for(uint32_t n) {
  uint32_t e = 1;
  while (e < n && e <= DROCE_SHM_MAX_RING) e <<= 1;
  return e <= DROCE_SHM_MAX_RING ? e : 0;
}

// Writes a fresh ring header (indexes 0). Done by the daemon before the
// region's fd is sent, so no ordering is needed beyond the socket send.
inline void ring_init(droce_shm_ring_hdr* h, uint32_t kind, uint32_t entries, uint32_t entry_size,
                      uint32_t max_sge, uint32_t max_inline) {
  std::memset(static_cast<void*>(h), 0, sizeof(*h));
  h->magic = DROCE_SHM_RING_MAGIC;
  h->kind = kind;
  h->entries = entries;
  h->entry_size = entry_size;
  h->max_sge = max_sge;
  h->max_inline = max_inline;
  h->db_bit = DROCE_SHM_DB_NONE;  // until the daemon gives the object a doorbell bit
}

// Doorbells (droce_shm_abi.h, "doorbells"), producer side: sets the object's
// bit in the client's doorbell region. Only after the producer found the ring
// idle (the daemon stopped polling it), so a busy ring costs no atomic OR.
inline void doorbell_ring(droce_shm_doorbell* db, uint32_t bit) {
  if (bit >= DROCE_SHM_DB_BITS) return;  // attach() gives no region then
  const uint32_t w = bit / 64;
  // RELEASE ORs: the daemon's acquire exchanges see them (the entries are
  // published by the seq_cst store of prod before).
  std::atomic_ref<uint64_t>(db->word[w]).fetch_or(uint64_t{1} << (bit % 64), std::memory_order_release);
  std::atomic_ref<uint64_t>(db->summary).fetch_or(uint64_t{1} << w, std::memory_order_release);
}

template <typename Entry>
inline Entry* ring_entries(droce_shm_ring_hdr* h) {
  return reinterpret_cast<Entry*>(reinterpret_cast<uint8_t*>(h) + DROCE_SHM_RING_HDR_SIZE);
}

template <typename Entry>
class RingProducer {
 public:
  RingProducer() = default;
  // entries: the size the attaching side agreed on (the daemon's own record,
  // or the create response for the client); the shared geometry line is
  // not trusted. Starts from the current shared indexes. follow_done (receive
  // rings, droce_shm_abi.h "receive depth"): a slot is free again only when
  // the consumer has finished its WQE (`done`), not when it copied it (`cons`).
  // db: the client's doorbell region (send and receive rings of a QP or
  // SRQ), or nullptr: then publish() is one release store, as for CQ rings.
  // The ring's bit is the daemon's db_bit; DROCE_SHM_DB_NONE (or a bit
  // beyond the region) means no doorbell (the daemon polls the ring always).
  bool attach(droce_shm_ring_hdr* h, uint32_t entries, bool follow_done = false,
              droce_shm_doorbell* db = nullptr) {
    if (h == nullptr || !ring_geometry_ok(entries)) return false;
    hdr_ = h;
    db_ = nullptr;
    if (db != nullptr) {
      bit_ = std::atomic_ref<uint32_t>(h->db_bit).load(std::memory_order_relaxed);
      if (bit_ < DROCE_SHM_DB_BITS) db_ = db;
    }
    slots_ = ring_entries<Entry>(h);
    size_ = entries;
    mask_ = entries - 1;
    follow_ = follow_done ? &h->done : &h->cons;
    // relaxed: we are the only writer of prod.
    prod_ = std::atomic_ref<uint32_t>(h->prod).load(std::memory_order_relaxed);
    // acquire: pairs with the consumer's release of cons (or done).
    cons_cache_ = std::atomic_ref<uint32_t>(*follow_).load(std::memory_order_acquire);
    corrupt_ = (prod_ - cons_cache_) > size_;
    return !corrupt_;
  }
  bool attached() const { return hdr_ != nullptr; }
  bool corrupt() const { return corrupt_; }
  uint32_t size() const { return size_; }

  // Free slots, refreshing the cached consumer index only when needed.
  uint32_t free_slots(uint32_t want = 1) {
    uint32_t used = prod_ - cons_cache_;
    if (size_ - used < want && !corrupt_) {
      // ACQUIRE: the consumer finished reading the slots it returned before
      // its release store of cons (done <= cons: before done too); we may
      // overwrite them now.
      uint32_t c = std::atomic_ref<uint32_t>(*follow_).load(std::memory_order_acquire);
      if (prod_ - c > size_) {
        corrupt_ = true;
      } else {
        cons_cache_ = c;
        used = prod_ - c;
      }
    }
    return corrupt_ ? 0 : size_ - used;
  }

  // The i-th slot after the last published one; i < free_slots().
  Entry* slot(uint32_t i) { return &slots_[(prod_ + i) & mask_]; }

  // The doorbell: makes n filled slots visible with one store.
  void publish(uint32_t n) {
    prod_ += n;
    if (db_ == nullptr) {
      // RELEASE: every plain store into the n slots happens-before the
      // consumer's acquire load that sees this prod.
      std::atomic_ref<uint32_t>(hdr_->prod).store(prod_, std::memory_order_release);
      return;
    }
    // SEQ_CST store then SEQ_CST load of idle (droce_shm_abi.h, "doorbells"):
    // against the daemon's seq_cst store of idle then reload of prod when it
    // parks the ring, one of the two sides sees the other. The store is also
    // a release (the slots are published).
    std::atomic_ref<uint32_t>(hdr_->prod).store(prod_, std::memory_order_seq_cst);
    if (std::atomic_ref<uint32_t>(hdr_->idle).load(std::memory_order_seq_cst) != 0) doorbell_ring(db_, bit_);
  }
  bool has_doorbell() const { return db_ != nullptr; }

  bool try_push(const Entry& e) {
    if (free_slots(1) < 1) return false;
    std::memcpy(static_cast<void*>(slot(0)), &e, sizeof(Entry));
    publish(1);
    return true;
  }

  droce_shm_ring_hdr* hdr() { return hdr_; }
  uint32_t prod() const { return prod_; }

 private:
  droce_shm_ring_hdr* hdr_ = nullptr;
  droce_shm_doorbell* db_ = nullptr;  // the client's doorbell region, or none
  uint32_t bit_ = DROCE_SHM_DB_NONE;
  uint32_t* follow_ = nullptr;  // &hdr_->cons, or &hdr_->done (receive rings)
  Entry* slots_ = nullptr;
  uint32_t size_ = 0, mask_ = 0;
  uint32_t prod_ = 0;        // private copy; we are the only writer
  uint32_t cons_cache_ = 0;  // last consumer (or done) index seen
  bool corrupt_ = false;
};

template <typename Entry>
class RingConsumer {
 public:
  RingConsumer() = default;
  bool attach(droce_shm_ring_hdr* h, uint32_t entries) {
    if (h == nullptr || !ring_geometry_ok(entries)) return false;
    hdr_ = h;
    slots_ = ring_entries<Entry>(h);
    size_ = entries;
    mask_ = entries - 1;
    cons_ = std::atomic_ref<uint32_t>(h->cons).load(std::memory_order_relaxed);
    prod_cache_ = std::atomic_ref<uint32_t>(h->prod).load(std::memory_order_acquire);
    corrupt_ = (prod_cache_ - cons_) > size_;
    return !corrupt_;
  }
  bool attached() const { return hdr_ != nullptr; }
  bool corrupt() const { return corrupt_; }
  uint32_t size() const { return size_; }

  // Entries ready to read, refreshing the cached producer index only when
  // the cache is exhausted.
  uint32_t available() {
    if (corrupt_) return 0;
    uint32_t avail = prod_cache_ - cons_;
    if (avail == 0) {
      // ACQUIRE: pairs with the producer's release store of prod; the
      // entries below it are completely written.
      uint32_t p = std::atomic_ref<uint32_t>(hdr_->prod).load(std::memory_order_acquire);
      if (p - cons_ > size_) {
        corrupt_ = true;
        return 0;
      }
      prod_cache_ = p;
      avail = p - cons_;
    }
    return avail;
  }

  // The i-th unread entry; i < available(). A consumer that does not trust
  // the producer copies the entry out (copy()) before validating it, since
  // the producer can still write the shared slot.
  const Entry* slot(uint32_t i) const { return &slots_[(cons_ + i) & mask_]; }
  void copy(uint32_t i, Entry* out) const {
    std::memcpy(static_cast<void*>(out), static_cast<const void*>(slot(i)), sizeof(Entry));
  }

  // Returns n slots to the producer with one store.
  void release(uint32_t n) {
    cons_ += n;
    // RELEASE: our reads of those slots happen-before the producer's
    // acquire load that sees this cons and reuses them.
    std::atomic_ref<uint32_t>(hdr_->cons).store(cons_, std::memory_order_release);
  }

  // The i-th unread entry in place, or nullptr when the producer has not
  // published that many (refreshes the cached producer index only then).
  // For a consumer that trusts the producer (the client reading its CQ).
  const Entry* peek(uint32_t i) {
    if (corrupt_) return nullptr;
    if (prod_cache_ - cons_ <= i) {
      // ACQUIRE: pairs with the producer's release store of prod.
      uint32_t p = std::atomic_ref<uint32_t>(hdr_->prod).load(std::memory_order_acquire);
      if (p - cons_ > size_) {
        corrupt_ = true;
        return nullptr;
      }
      prod_cache_ = p;
      if (p - cons_ <= i) return nullptr;
    }
    return slot(i);
  }

  bool try_pop(Entry* out) {
    if (available() < 1) return false;
    copy(0, out);
    release(1);
    return true;
  }

  droce_shm_ring_hdr* hdr() { return hdr_; }
  uint32_t cons() const { return cons_; }

  // Doorbells, daemon side (droce_shm_abi.h, "doorbells"). park(): tells the
  // producer that we stop polling (idle = 1, SEQ_CST), then reloads prod
  // (SEQ_CST); returns the entries ready then. Non-zero: the caller must
  // unpark() and keep polling (a producer may have published before it saw
  // idle). unpark(): idle = 0, SEQ_CST (the producer stops ringing).
  uint32_t park() {
    std::atomic_ref<uint32_t>(hdr_->idle).store(1, std::memory_order_seq_cst);
    if (corrupt_) return 0;
    const uint32_t p = std::atomic_ref<uint32_t>(hdr_->prod).load(std::memory_order_seq_cst);
    if (p - cons_ > size_) {
      corrupt_ = true;
      return 0;
    }
    prod_cache_ = p;
    return p - cons_;
  }
  void unpark() { std::atomic_ref<uint32_t>(hdr_->idle).store(0, std::memory_order_seq_cst); }
  // The daemon's doorbell bit for this ring's object (written once by it).
  void set_doorbell_bit(uint32_t bit) { std::atomic_ref<uint32_t>(hdr_->db_bit).store(bit, std::memory_order_relaxed); }

 private:
  droce_shm_ring_hdr* hdr_ = nullptr;
  const Entry* slots_ = nullptr;
  uint32_t size_ = 0, mask_ = 0;
  uint32_t cons_ = 0;        // private copy; we are the only writer
  uint32_t prod_cache_ = 0;  // last producer index seen
  bool corrupt_ = false;
};

// ibv_resize_cq, producer side, while the consumer waits for the answer (it
// reads nothing meanwhile): moves the unread entries of `from` into the new,
// empty ring `to` (in order, from its slot 0), carries the notification line
// (armed, events, overflows) over and makes `from` produce into `to`.
// `reserve` more entries must fit as well (completions the producer holds
// elsewhere). Returns 0, -EINVAL when they do not fit (nothing changes), or
// -EIO when the old ring's index is corrupt.
template <typename Entry>
inline int ring_move_unread(RingProducer<Entry>& from, droce_shm_ring_hdr* to, uint32_t to_entries,
                            uint32_t reserve) {
  droce_shm_ring_hdr* h = from.hdr();
  // ACQUIRE: the consumer is done with the slots below cons.
  const uint32_t cons = std::atomic_ref<uint32_t>(h->cons).load(std::memory_order_acquire);
  const uint32_t n = from.prod() - cons;
  if (n > from.size()) return -EIO;
  if (!ring_geometry_ok(to_entries) || static_cast<uint64_t>(n) + reserve > to_entries) return -EINVAL;
  const Entry* src = ring_entries<Entry>(h);
  Entry* dst = ring_entries<Entry>(to);
  for (uint32_t i = 0; i < n; i++)
    std::memcpy(static_cast<void*>(&dst[i]), &src[(cons + i) & (from.size() - 1)], sizeof(Entry));
  to->cons = 0;
  std::atomic_ref<uint32_t>(to->armed).store(std::atomic_ref<uint32_t>(h->armed).load(std::memory_order_seq_cst),
                                             std::memory_order_seq_cst);
  std::atomic_ref<uint32_t>(to->events).store(std::atomic_ref<uint32_t>(h->events).load(std::memory_order_acquire),
                                              std::memory_order_release);
  to->overflows = h->overflows;
  // RELEASE: the copied entries are visible with prod.
  std::atomic_ref<uint32_t>(to->prod).store(n, std::memory_order_release);
  return from.attach(to, to_entries) ? 0 : -EIO;
}

// Receive rings, daemon side: publishes `done` (droce_shm_abi.h, "receive
// depth"), the first WQE not finished yet; done <= cons, never backwards.
// RELEASE: our reads of the slots below it happen-before the client reuses them.
inline void recv_ring_set_done(droce_shm_ring_hdr* h, uint32_t done) {
  std::atomic_ref<uint32_t>(h->done).store(done, std::memory_order_release);
}

// CQ notification, daemon side: called after publishing CQEs (the release
// store of prod). Returns true when the CQ was armed for this completion and
// the caller must signal the completion channel (write its eventfd).
inline bool cq_consume_arm(droce_shm_ring_hdr* h, bool solicited_or_error) {
  // SEQ_CST fence: orders our prod store before the load of armed, against
  // the client's seq_cst store of armed before it polls the ring again;
  // one of the two sides always sees the other (no lost wakeup).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t> armed(h->armed);
  uint32_t a = armed.load(std::memory_order_seq_cst);
  if (a == DROCE_CQ_ARM_NONE) return false;
  if (a == DROCE_CQ_ARM_SOLICITED && !solicited_or_error) return false;
  // SEQ_CST exchange: only one completion consumes an arm.
  if (armed.exchange(DROCE_CQ_ARM_NONE, std::memory_order_seq_cst) == DROCE_CQ_ARM_NONE) return false;
  // RELEASE: the client's acquire load of events finds this CQ.
  std::atomic_ref<uint32_t>(h->events).fetch_add(1, std::memory_order_release);
  return true;
}

// Client side of ibv_req_notify_cq.
inline void cq_arm(droce_shm_ring_hdr* h, bool solicited_only) {
  std::atomic_ref<uint32_t> armed(h->armed);
  // SEQ_CST: see cq_consume_arm. A solicited arm never downgrades a pending
  // "next" arm.
  if (solicited_only) {
    uint32_t expect = DROCE_CQ_ARM_NONE;
    armed.compare_exchange_strong(expect, DROCE_CQ_ARM_SOLICITED, std::memory_order_seq_cst);
  } else {
    armed.store(DROCE_CQ_ARM_NEXT, std::memory_order_seq_cst);
  }
}

inline uint32_t cq_events(droce_shm_ring_hdr* h) {
  // ACQUIRE: pairs with the daemon's release increment.
  return std::atomic_ref<uint32_t>(h->events).load(std::memory_order_acquire);
}

}  // namespace droce::shim

// Completion queues, shared receive queues, work-queue rings and the QP with
// its state machine (modify_qp checks as ibverbs/IBTA 10.3 define them).
//
// Every ring has a power-of-two capacity fixed at creation (control path);
// indexes are free-running uint32 counters, slot = index & mask.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "verbs/verbs.h"

namespace droce::verbs {

constexpr uint32_t round_pow2(uint32_t v) noexcept {
  uint32_t p = 1;
  while (p < v && p < (1u << 30)) p <<= 1;
  return p;
}

template <typename T>
class Ring {
 public:
  Ring() = default;
  explicit Ring(uint32_t min_capacity)
      : mask_(round_pow2(min_capacity ? min_capacity : 1) - 1), slots_(new T[mask_ + 1]()) {}
  uint32_t capacity() const noexcept { return mask_ + 1; }
  T& at(uint32_t idx) noexcept { return slots_[idx & mask_]; }
  const T& at(uint32_t idx) const noexcept { return slots_[idx & mask_]; }
  // head = producer index, tail = consumer index, both free-running.
  uint32_t head = 0;
  uint32_t tail = 0;
  uint32_t count() const noexcept { return head - tail; }
  bool full() const noexcept { return count() >= capacity(); }
  bool empty() const noexcept { return head == tail; }

 private:
  uint32_t mask_ = 0;
  std::unique_ptr<T[]> slots_;
};

class Cq {
 public:
  explicit Cq(uint32_t cqe) : ring_(cqe), cqe_(cqe) {}
  // Engine side. Returns false (and counts) when the CQ is full: a CQ overrun.
  bool push(const Wc& wc) noexcept {
    if (ring_.count() >= cqe_) {
      ++overruns_;
      return false;
    }
    ring_.at(ring_.head++) = wc;
    return true;
  }
  // ibv_poll_cq
  int poll(Wc* out, int n) noexcept {
    int i = 0;
    for (; i < n && !ring_.empty(); ++i) out[i] = ring_.at(ring_.tail++);
    return i;
  }
  uint32_t depth() const noexcept { return cqe_; }
  uint32_t pending() const noexcept { return ring_.count(); }
  uint64_t overruns() const noexcept { return overruns_; }

 private:
  Ring<Wc> ring_;
  uint32_t cqe_;
  uint64_t overruns_ = 0;
};

struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  uint32_t length = 0;  // sum of SGE lengths
  Sge sge[kMaxSge]{};
};

class Srq {
 public:
  Srq(uint32_t pd, uint32_t max_wr) : pd_(pd), ring_(max_wr), max_wr_(max_wr) {}
  int post(const RecvWr& wr) noexcept;  // 0, ENOMEM (full), EINVAL (too many SGEs)
  RecvWqe* front() noexcept { return ring_.empty() ? nullptr : &ring_.at(ring_.tail); }
  void pop() noexcept { ++ring_.tail; }
  uint32_t pd() const noexcept { return pd_; }
  uint32_t count() const noexcept { return ring_.count(); }

 private:
  uint32_t pd_;
  Ring<RecvWqe> ring_;
  uint32_t max_wr_;
};

// State of a send WQE in the transport.
enum class WqeState : uint8_t {
  Posted = 0,   // not yet started by the requester
  Sending,      // some packets sent, more to go
  Sent,         // every request packet sent; waiting for ACK / response
  Done,         // acknowledged (or failed): the completer may retire it
};

// One send queue entry. The requester's and completer's bookkeeping, then the
// work request: a SEND or WRITE of one SGE is read and written within the
// entry's first 128 bytes (the UD address handle and the inline data after).
struct SendWqe {
  WqeState state = WqeState::Posted;
  WcStatus status = WcStatus::Success;
  bool is_inline = false;
  bool sr = false;  // RC selective repeat (lib/transport README): its requests are marked, WRITEs go per packet
  uint32_t length = 0;  // message length in bytes
  uint32_t first_psn = 0;
  uint32_t last_psn = 0;
  uint32_t npkts = 0;
  uint32_t read_pkts_done = 0;  // READ: response packets placed
  uint64_t atomic_orig = 0;
  SendWr wr;
  Ah ah;                // UD: copy of the address handle
  uint8_t inline_data[kMaxInline];

  // A freshly posted WQE: not started, nothing sent or placed yet.
  void mark_posted() noexcept {
    state = WqeState::Posted;
    status = WcStatus::Success;
    first_psn = last_psn = 0;
    npkts = 0;
    read_pkts_done = 0;
    atomic_orig = 0;
    sr = false;
  }
};

struct QpInitAttr {
  QpType qp_type = QpType::RC;
  uint32_t pd = 0;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  Srq* srq = nullptr;
  QpCap cap;
  bool sq_sig_all = false;
};

// The verbs-visible part of a QP: attributes, state and work queues.
class QpBase {
 public:
  QpBase(uint32_t qpn, const QpInitAttr& init);

  // Validates a modify_qp request against the current state and QP type.
  // Returns 0 or an errno (EINVAL), as ibv_modify_qp.
  int check_modify(const QpAttr& attr, uint32_t mask) const noexcept;
  // Copies the attributes selected by mask (after check_modify succeeded).
  void apply_attrs(const QpAttr& attr, uint32_t mask) noexcept;

  // ibv_post_send / ibv_post_recv checks and enqueue; 0 or errno.
  int post_send(const SendWr& wr) noexcept;
  int post_recv(const RecvWr& wr) noexcept;

  // In the order the datapath reads them: what every packet of the QP reads
  // and the send queue on the first cache line, the attributes a packet reads
  // on the second (QpAttr's first fields), the receive queue after them.
  uint32_t qpn;
  QpType type;
  bool sq_sig_all;
  QpState state = QpState::Reset;
  uint32_t pd;
  uint32_t mtu = 1024;  // path MTU in bytes
  Cq* send_cq;
  Cq* recv_cq;
  Srq* srq;
  Ring<SendWqe> sq;     // head: posted; tail: retired by the completer
  QpAttr attr;
  Ring<RecvWqe> rq;     // head: posted; tail: consumed by the responder
};

}  // namespace droce::verbs

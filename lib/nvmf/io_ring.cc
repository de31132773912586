#include "nvmf/io_ring.h"

#include <fcntl.h>
#include <linux/falloc.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <ctime>

#include "nvmf/le.h"
#include "nvmf/queue.h"

namespace droce::nvmf {

namespace {
constexpr uint64_t kCancelTag = ~0ull;   // user_data of cancel requests (their CQEs are ignored)
constexpr uint32_t kZeroBuf = 128 * 1024;
constexpr uint8_t kZeroRange = 0, kPunch = 1, kWrites = 2;

uint64_t coarse_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

bool aligned(const Namespace& ns, const void* buf, uint64_t off, uint64_t len) {
  uint64_t a = ns.direct_align();
  return ns.direct_fd() >= 0 && a && ((reinterpret_cast<uintptr_t>(buf) | off | len) % a) == 0;
}
}  // namespace

Status file_errno_status(int err) noexcept {
  switch (err) {
    case 0: return sc::kSuccess;
    case ENOSPC:
    case EDQUOT: return sc::kCapExceeded;
    case EREMOTEIO: return sc::kLbaRange;
    case EOPNOTSUPP: return sc::kInvalidOpcode;
    case ENODATA: return sc::kAccessDenied;
    default: return sc::kInternal;  // EIO, EBADF, ...
  }
}

IoRing::IoRing(unsigned entries, unsigned timeout_ms) {
  if (entries == 0 || entries > 4096) throw std::invalid_argument("IoRing entries: must be 1..4096");
  timeout_ns_ = uint64_t{timeout_ms} * 1'000'000;
  scan_ns_ = std::min<uint64_t>(timeout_ns_ / 4, 100'000'000);
  now_ns_ = coarse_ns();
  int e = io_uring_queue_init(entries, &ring_, 0);
  if (e < 0) throw std::system_error(-e, std::generic_category(), "io_uring_queue_init");
  tickets_.assign(entries, nullptr);
  free_.reserve(entries);
  for (uint32_t i = entries; i-- > 0;) free_.push_back(i);
  zeroes_ = static_cast<uint8_t*>(std::aligned_alloc(4096, kZeroBuf));
  if (!zeroes_) {
    io_uring_queue_exit(&ring_);
    throw std::bad_alloc();
  }
  std::memset(zeroes_, 0, kZeroBuf);
}

IoRing::~IoRing() {
  // Queues are destroyed first (they abandon their commands); anything left
  // in flight here belongs to nobody.
  io_uring_queue_exit(&ring_);
  std::free(zeroes_);
}

void IoRing::start(BackendOp& op) noexcept {
  ++ctr_.started;
  op.next = nullptr;
  op.abandoned = false;
  op.timed_out = 0;
  op.deadline_ns = timeout_ns_ ? now_ns_ + timeout_ns_ : 0;
  op.range = 0;
  op.step = 0;
  if (op.op.kind == FileOp::WriteZeroes) {
    op.off = op.op.offset;
    op.left = op.op.length;
    op.method = kZeroRange;
    if (op.left == 0) return finish(op, sc::kSuccess, 0);
  } else if (op.op.kind == FileOp::Deallocate) {
    op.left = 0;
    return range_next(op);
  }
  if (!head_ && issue(op)) return;
  enqueue(op);
}

void IoRing::enqueue(BackendOp& op) noexcept {
  ++ctr_.ring_full;
  op.next = nullptr;
  if (tail_) tail_->next = &op;
  else head_ = &op;
  tail_ = &op;
  ctr_.max_waiting = std::max<uint64_t>(ctr_.max_waiting, ++waiting_);
}

bool IoRing::issue(BackendOp& op) noexcept {
  if (free_.empty()) return false;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) return false;
  Namespace& ns = *op.ns;
  switch (op.op.kind) {
    case FileOp::Read:
    case FileOp::Write: {
      bool direct = aligned(ns, op.buf, op.op.offset, op.op.length);
      ctr_.direct += direct;
      int fd = direct ? ns.direct_fd() : ns.fd();
      op.step = static_cast<uint32_t>(op.op.length);
      if (op.op.kind == FileOp::Read)
        io_uring_prep_read(sqe, fd, op.buf, op.step, op.op.offset);
      else
        io_uring_prep_write(sqe, fd, op.buf, op.step, op.op.offset);
      break;
    }
    case FileOp::Flush:
      io_uring_prep_fsync(sqe, ns.fd(), IORING_FSYNC_DATASYNC);
      break;
    case FileOp::WriteZeroes:
    case FileOp::Deallocate:
      if (op.method == kWrites) {
        op.step = static_cast<uint32_t>(std::min<uint64_t>(op.left, kZeroBuf));
        bool direct = aligned(ns, zeroes_, op.off, op.step);
        ctr_.direct += direct;
        int fd = direct ? ns.direct_fd() : ns.fd();
        io_uring_prep_write(sqe, fd, zeroes_, op.step, op.off);
      } else {
        int mode = FALLOC_FL_KEEP_SIZE | (op.method == kZeroRange ? FALLOC_FL_ZERO_RANGE : FALLOC_FL_PUNCH_HOLE);
        io_uring_prep_fallocate(sqe, ns.fd(), mode, op.off, op.left);
      }
      break;
    default:
      // Not a file command: cannot happen (Controller::file_io); give the SQE back as a no-op.
      io_uring_prep_nop(sqe);
      break;
  }
  uint32_t t = free_.back();
  free_.pop_back();
  tickets_[t] = &op;
  io_uring_sqe_set_data64(sqe, t);
  ++unsubmitted_;
  ++ctr_.submitted;
  return true;
}

void IoRing::finish(BackendOp& op, Status st, uint32_t data_len) noexcept {
  ++ctr_.completed;
  if (!st.ok()) ++ctr_.errors;
  op.owner->backend_done(op.slot, st, data_len);
}

// Zeroing of [off, off + left): the first method the file has not refused.
void IoRing::zero_next(BackendOp& op) noexcept {
  uint8_t refused = op.ns->zeroing_refused();
  if (op.method == kZeroRange && (refused & 1)) op.method = op.op.kind == FileOp::Deallocate ? kWrites : kPunch;
  if (op.method == kPunch && (refused & 2)) op.method = op.op.kind == FileOp::Deallocate ? kZeroRange : kWrites;
  if (op.method == kZeroRange && (refused & 1)) op.method = kWrites;
  if (!head_ && issue(op)) return;
  enqueue(op);
}

// Deallocate: range by range (NVMe DSM range: attributes le32, length in
// blocks le32, SLBA le64), each by PUNCH_HOLE, or ZERO_RANGE or writes where
// the file refuses it (deallocated blocks read zeroes: DLFEAT).
void IoRing::range_next(BackendOp& op) noexcept {
  uint8_t shift = op.ns->lba_shift();
  while (op.range < op.op.ranges) {
    const uint8_t* r = op.buf + 16 * size_t{op.range};
    ++op.range;
    uint64_t len = uint64_t{le::get32(r + 4)} << shift;
    if (!len) continue;
    op.off = le::get64(r + 8) << shift;
    op.left = len;
    op.method = kPunch;
    return zero_next(op);
  }
  finish(op, sc::kSuccess, 0);
}

void IoRing::step_done(BackendOp& op, int res) noexcept {
  switch (op.op.kind) {
    case FileOp::Read:
    case FileOp::Write:
      if (res < 0) return finish(op, file_errno_status(-res), 0);
      if (static_cast<uint32_t>(res) != op.step) {
        ++ctr_.short_transfers;
        return finish(op, sc::kInternal, 0);
      }
      return finish(op, sc::kSuccess, op.op.kind == FileOp::Read ? op.step : 0);
    case FileOp::Flush:
      return finish(op, file_errno_status(res < 0 ? -res : 0), 0);
    case FileOp::WriteZeroes:
    case FileOp::Deallocate:
      if (op.method != kWrites && (res == -EOPNOTSUPP || res == -EINVAL)) {
        op.ns->refuse_zeroing(op.method == kZeroRange ? 1 : 2);
        ++ctr_.zeroing_fallbacks;
        return zero_next(op);
      }
      if (res < 0) return finish(op, file_errno_status(-res), 0);
      if (op.method == kWrites) {
        if (res == 0) {
          ++ctr_.short_transfers;
          return finish(op, sc::kInternal, 0);
        }
        op.off += static_cast<uint64_t>(res);
        op.left -= std::min<uint64_t>(op.left, static_cast<uint64_t>(res));
        if (op.left) return zero_next(op);
      }
      if (op.op.kind == FileOp::Deallocate) return range_next(op);
      return finish(op, sc::kSuccess, 0);
    default:
      return finish(op, sc::kInternal, 0);
  }
}

void IoRing::flush_submit() noexcept {
  if (!unsubmitted_) return;
  int n = io_uring_submit(&ring_);
  if (n < 0) {
    ++ctr_.submit_errors;  // EAGAIN/EBUSY: the SQEs stay in the ring for the next poll
    return;
  }
  unsubmitted_ -= std::min<unsigned>(unsubmitted_, static_cast<unsigned>(n));
}

size_t IoRing::reap() noexcept {
  size_t total = 0;
  for (int batch = 0; batch < 8; ++batch) {  // bounded: at most 8 * 32 per call
    io_uring_cqe* cqes[32];
    unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 32);
    if (!n) break;
    uint64_t ud[32];
    int res[32];
    for (unsigned i = 0; i < n; ++i) {
      ud[i] = io_uring_cqe_get_data64(cqes[i]);
      res[i] = cqes[i]->res;
    }
    io_uring_cq_advance(&ring_, n);
    for (unsigned i = 0; i < n; ++i) {
      if (ud[i] == kCancelTag || ud[i] >= tickets_.size()) continue;
      BackendOp* op = tickets_[ud[i]];
      tickets_[ud[i]] = nullptr;
      free_.push_back(static_cast<uint32_t>(ud[i]));
      ++total;
      if (!op || op->abandoned) {
        ++ctr_.orphaned;
        if (!op && orphans_) --orphans_;
        continue;
      }
      if (op->timed_out == 2) {  // answered already: its slot is free again now
        ++ctr_.late;
        op->owner->backend_released(op->slot);
        continue;
      }
      step_done(*op, res[i]);
    }
    if (n < 32) break;
  }
  return total;
}

void IoRing::cancel(uint32_t t) noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (!sqe) {
    flush_submit();
    sqe = io_uring_get_sqe(&ring_);
  }
  if (!sqe) return;
  io_uring_prep_cancel64(sqe, t, 0);
  io_uring_sqe_set_data64(sqe, kCancelTag);
  ++unsubmitted_;
}

void IoRing::expire() noexcept {
  for (uint32_t t = 0; t < tickets_.size(); ++t) {
    BackendOp* op = tickets_[t];
    if (!op || op->abandoned || op->timed_out == 2 || now_ns_ < op->deadline_ns) continue;
    op->deadline_ns = now_ns_ + timeout_ns_;
    if (op->timed_out == 0) {
      op->timed_out = 1;
      ++ctr_.timeouts;
      cancel(t);
      continue;
    }
    // The cancel did not take (uninterruptible in the kernel): answer the
    // host now; the slot and its buffer stay the kernel's until it is back.
    op->timed_out = 2;
    ++ctr_.stuck;
    ++ctr_.completed;
    ++ctr_.errors;
    op->owner->backend_stuck(op->slot);
  }
}

size_t IoRing::poll() noexcept {
  flush_submit();
  size_t n = reap();
  if (timeout_ns_) {
    now_ns_ = coarse_ns();
    if (now_ns_ >= next_scan_ns_ && in_flight() > 0) {
      next_scan_ns_ = now_ns_ + scan_ns_;
      expire();
    }
  }
  // Steps that waited for room, in order.
  while (head_ && issue(*head_)) {
    head_ = head_->next;
    if (!head_) tail_ = nullptr;
    --waiting_;
  }
  flush_submit();
  return n;
}

void IoRing::abandon(const Queue* q, unsigned timeout_ms) noexcept {
  // Not yet submitted: out of the wait list.
  BackendOp** pp = &head_;
  tail_ = nullptr;
  while (*pp) {
    if ((*pp)->owner == q) {
      *pp = (*pp)->next;
      --waiting_;
    } else {
      tail_ = *pp;
      pp = &(*pp)->next;
    }
  }
  auto mine = [&] {
    size_t n = 0;
    for (BackendOp* op : tickets_) n += op && op->owner == q;
    return n;
  };
  if (!mine()) return;
  for (uint32_t t = 0; t < tickets_.size(); ++t) {
    if (!tickets_[t] || tickets_[t]->owner != q) continue;
    tickets_[t]->abandoned = true;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) {
      flush_submit();
      sqe = io_uring_get_sqe(&ring_);
    }
    if (!sqe) break;
    io_uring_prep_cancel64(sqe, t, 0);
    io_uring_sqe_set_data64(sqe, kCancelTag);
    ++unsubmitted_;
  }
  // The kernel may still write into the queue's buffers: wait for those
  // completions (the other queues' are resumed as usual meanwhile).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (mine() && std::chrono::steady_clock::now() < deadline) {
    flush_submit();
    __kernel_timespec ts{0, 10 * 1000 * 1000};
    io_uring_cqe* cqe = nullptr;
    io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    reap();
  }
  for (auto& op : tickets_)
    if (op && op->owner == q) {
      op = nullptr;  // still stuck: their completions will be discarded
      ++orphans_;
    }
}

}  // namespace droce::nvmf

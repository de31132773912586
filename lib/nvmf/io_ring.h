// The file backend's engine: one io_uring per poll loop (per core). The
// queues of that core hand it the commands of file namespaces (a BackendOp
// living in the request's slot); the core's loop calls poll(), which submits
// what was prepared and reaps completions without ever waiting, and each
// completion resumes its request in its Queue (README.md: "The file
// backend"). Nothing is allocated per command: tickets (the io_uring
// user_data) and the wait list of commands that found the ring full are
// fixed or intrusive.
#pragma once

#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "nvmf/namespace.h"
#include "nvmf/spec.h"

namespace droce::nvmf {

class Queue;

// One file command in progress; owned by the request's slot (Queue), driven
// by the IoRing. Commands that take several steps (Dataset Management ranges,
// zeroing by writes) keep their place here.
struct BackendOp {
  Queue* owner = nullptr;
  uint16_t slot = 0;
  Namespace* ns = nullptr;
  FileOp op;
  uint8_t* buf = nullptr;     // Read/Write data; Deallocate: the range list
  // progress
  uint32_t range = 0;         // Deallocate: the range being done
  uint64_t off = 0, left = 0; // zeroing: what is still to do in the current range
  uint8_t method = 0;         // zeroing: 0 ZERO_RANGE, 1 PUNCH_HOLE, 2 writes of zeroes
  uint32_t step = 0;          // bytes the step in flight asked for
  bool abandoned = false;     // its queue went: the completion is discarded
  // The deadline (IoRing's timeout): 0 in time; 1 a cancel was sent at the
  // deadline; 2 still not back a timeout later: answered with an error, its
  // slot held until the kernel gives the buffer back.
  uint8_t timed_out = 0;
  uint64_t deadline_ns = 0;   // CLOCK_MONOTONIC_COARSE
  BackendOp* next = nullptr;  // wait list
};

struct IoRingCounters {
  uint64_t started = 0;        // commands handed to the ring
  uint64_t submitted = 0;      // SQEs (a command may take several)
  uint64_t direct = 0;         // reads/writes through the O_DIRECT descriptor (aligned)
  uint64_t completed = 0;      // commands resumed (success or error)
  uint64_t errors = 0;         // commands resumed with an error status
  uint64_t short_transfers = 0;// reads/writes that moved fewer bytes than asked (an error)
  uint64_t ring_full = 0;      // steps that found no SQE or ticket free and waited
  uint64_t max_waiting = 0;    // the longest the wait list has been
  uint64_t zeroing_fallbacks = 0; // a zeroing method the file refused, the next one tried
  uint64_t orphaned = 0;       // completions of a destroyed queue's commands (discarded)
  uint64_t submit_errors = 0;  // io_uring_submit failures (retried at the next poll)
  uint64_t timeouts = 0;       // commands past the deadline: a cancel sent (their completion, if any, an error)
  uint64_t stuck = 0;          // not back a timeout after the cancel: answered Internal Error, slot held
  uint64_t late = 0;           // completions of such held commands (the slot freed then)
};

// NVMe status for an errno of a file operation, as Linux's nvmet maps it
// (errno_to_nvme_status): ENOSPC/EDQUOT Capacity Exceeded, EREMOTEIO LBA Out
// of Range, EOPNOTSUPP Invalid Opcode, ENODATA Access Denied, anything else
// (EIO among them) Internal Error. A short transfer is an Internal Error too.
Status file_errno_status(int err) noexcept;

class IoRing {
 public:
  // entries: SQ size and the most commands in flight (more wait, counted).
  // Throws std::system_error when io_uring is unavailable (kernel, seccomp,
  // kernel.io_uring_disabled).
  // timeout_ms (0: none): a command in the kernel longer than this is
  // cancelled (IORING_OP_ASYNC_CANCEL; its completion then answers it, an
  // error); one that is still not back a timeout later (a hung device) is
  // answered Internal Error and its request slot held until the kernel gives
  // the buffer back (Queue::backend_busy() counts it). Checked every
  // timeout/4 (at most 100 ms) of poll(); one coarse clock read per poll().
  explicit IoRing(unsigned entries = 128, unsigned timeout_ms = 10000);
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  // Call from the owning core's poll loop, every iteration (after feeding the
  // queues their capsules, before taking their actions): submits the steps
  // prepared since the last call, reaps the completions there are (no wait),
  // resumes their requests (their Queue then has actions) and starts steps
  // that waited for room. Returns the completions reaped.
  size_t poll() noexcept;

  size_t in_flight() const noexcept { return tickets_.size() - free_.size(); }
  size_t waiting() const noexcept { return waiting_; }
  // Commands of destroyed queues the kernel still has (abandon() gave up
  // waiting for them): their buffers must stay allocated until this drops.
  size_t orphans() const noexcept { return orphans_; }
  const IoRingCounters& counters() const noexcept { return ctr_; }

 private:
  friend class Queue;
  void start(BackendOp& op) noexcept;   // a new command (Queue::execute)
  // A queue goes with commands in flight: those are cancelled and waited for
  // (at most timeout_ms; a blocking wait, at teardown only), those not yet
  // submitted dropped.
  void abandon(const Queue* q, unsigned timeout_ms = 2000) noexcept;

  bool issue(BackendOp& op) noexcept;   // one step into an SQE; false: no room
  void enqueue(BackendOp& op) noexcept;
  void step_done(BackendOp& op, int res) noexcept;
  void zero_next(BackendOp& op) noexcept;      // the next zeroing step of op
  void range_next(BackendOp& op) noexcept;     // Deallocate: the next range
  void finish(BackendOp& op, Status st, uint32_t data_len) noexcept;
  size_t reap() noexcept;
  void flush_submit() noexcept;
  void expire() noexcept;                // commands past their deadline
  void cancel(uint32_t ticket) noexcept;

  io_uring ring_{};
  std::vector<BackendOp*> tickets_;  // user_data -> op (nullptr: free or orphaned)
  std::vector<uint32_t> free_;
  BackendOp* head_ = nullptr;        // wait list (FIFO)
  BackendOp* tail_ = nullptr;
  size_t waiting_ = 0;
  unsigned unsubmitted_ = 0;
  uint8_t* zeroes_ = nullptr;        // a zero-filled buffer for zeroing by writes
  uint64_t timeout_ns_ = 0, scan_ns_ = 0, now_ns_ = 0, next_scan_ns_ = 0;
  size_t orphans_ = 0;
  IoRingCounters ctr_;
};

}  // namespace droce::nvmf

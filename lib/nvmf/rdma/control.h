// The target's counters on a control socket at run time (lib/control's
// server and JSON-lines protocol; lib/nvmf/README.md, "Control socket").
// The server's thread answers `nvmf` by asking the poll loop for a snapshot:
// the loop calls service() every pass, which costs one atomic load unless a
// request is waiting, and then builds the snapshot on the loop's own thread
// (the counters are plain fields written by that thread; nothing per command
// is atomic or locked). The control thread waits for it, at most 2 s.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "control/server.h"
#include "nvmf/rdma/target.h"

namespace droce::nvmf::rdma {

// The whole picture as JSON: "target" (TargetCounters), "loops" (per core
// loop: queues, commands, bytes, its IoRing's counters), "queues" (per queue:
// loop, qid, cntlid, state, peer, commands, bytes, errors and drops, latency
// count / mean / p50 / p99 / p99.9 / max in microseconds; with histogram
// true also "latency_hist": [[upper_ns, count], ...] of the non-empty buckets).
control::json snapshot_json(const RdmaTarget& t, bool histogram = false);

class ControlPort {
 public:
  // Binds `path` (lib/control: a stale socket is replaced, a live one refused)
  // and starts the server thread. Throws std::runtime_error with the reason.
  ControlPort(const RdmaTarget& t, const std::string& path, int answer_timeout_ms = 2000);
  ~ControlPort();  // stops the thread and unlinks the socket
  ControlPort(const ControlPort&) = delete;
  ControlPort& operator=(const ControlPort&) = delete;

  // The poll loop's side: call every pass (or often), on the thread that
  // polls the target. Serves a waiting request; returns true when it did.
  bool service() {
    if (asked_.load(std::memory_order_acquire) == answered_) return false;
    serve();
    return true;
  }
  const control::Server& server() const noexcept { return *server_; }
  uint64_t snapshots() const noexcept { return answered_; }

 private:
  void serve();
  control::json ask(bool histogram);  // control thread

  const RdmaTarget& t_;
  int timeout_ms_;
  std::atomic<uint64_t> asked_{0};
  std::atomic<bool> want_hist_{false};
  uint64_t answered_ = 0;  // loop thread
  std::mutex mu_;          // the answer hand-over only (control path)
  std::condition_variable cv_;
  uint64_t ready_seq_ = 0;
  control::json answer_;
  std::unique_ptr<control::Server> server_;
};

}  // namespace droce::nvmf::rdma

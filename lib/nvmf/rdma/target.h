// The NVMe-oF RDMA glue (lib/nvmf/README.md): the pure protocol (`Target`,
// `Queue`) on an embedded droce node (`engine::Embedded`) and its RDMA CM.
// Listens on port 4420 (RDMA_PS_TCP) at the configured addresses; a CM REQ
// whose NVMe-RDMA private data fits becomes one queue (an RC QP, receives of
// SQE + in-capsule size posted before the REP, hugepage buffers registered
// once), anything else gets a REJ with the NVMe-RDMA reject status. poll()
// then moves bytes: received capsules to Queue::on_capsule (the receive is
// reposted at once), the Queue's actions to RDMA READ / WRITE / SEND (with
// Invalidate), work completions back. Nothing is allocated per command.
// Queues are spread over the node's core loops (Embedded::loops(): one RX/TX
// queue, engine and IoRing each). By default one thread, the application's,
// drives them all through poll(); with RdmaOptions::threads loops 1..N-1 run
// on threads of their own (lib/nvmf/README.md, "Several core loops").
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cm/agent.h"
#include "engine/embed.h"
#include "nvmf/cm_private.h"
#include "nvmf/controller.h"
#include "nvmf/io_ring.h"
#include "nvmf/queue.h"

namespace droce::nvmf::rdma {

struct RdmaOptions {
  std::vector<std::string> listen;  // IPv4/IPv6 addresses; empty: every address of the node
  uint16_t port = kRdmaPort;        // 4420
  uint8_t initiator_depth = 16;     // RDMA READs in flight we ask for (the host's REQ caps it)
  uint32_t mac_wait_ms = 3000;      // a REQ whose sender's MAC is unknown waits this long, then REJ
  // SEND with Invalidate when the host's SGL asks for it (0x4F). false: a
  // plain SEND, the host invalidates its key itself (NVMe-oF leaves remote
  // invalidation to the target's choice).
  bool remote_invalidate = true;
  // io_uring entries of each loop's IoRing (file namespaces only): the most
  // file commands in flight at once per loop (more wait in the ring's FIFO, counted).
  unsigned ring_entries = 256;
  // A file command in the kernel longer than this is cancelled, and answered
  // Internal Error a timeout later if the cancel does not take (IoRing).
  unsigned file_timeout_ms = 10000;
  // Loops 1..N-1 of the node each on a thread of its own (Embedded::
  // start_loop_threads, started by the constructor, joined by the
  // destructor); loop 0 (the CM, admin queues) stays with poll() on the
  // caller's thread. false: poll() drives every loop on the caller's thread.
  bool threads = false;
};

// Counters of one queue (the Queue's own plus the glue's).
struct QueueReport {
  uint16_t loop = 0;  // the core loop the queue (its QP, requests, IoRing) lives on
  uint16_t qid = 0;
  uint16_t cntlid = 0;
  uint16_t depth = 0;
  uint32_t qpn = 0;
  std::string peer;
  QueueCounters q;
  uint64_t recv_errors = 0;  // receive completions with an error status
  uint64_t post_errors = 0;  // work requests the engine refused
  uint64_t wc_errors = 0;    // send-side completions with an error status
  bool closed = false;       // gone before the report was made
  uint32_t tid = 0;          // the OS thread (gettid) that last received a capsule of it; 0: none yet
};

// One core loop's share: its live queues and the sums over every queue it
// served (closed ones included, as far as report() keeps them).
struct LoopReport {
  uint16_t loop = 0;
  uint32_t tid = 0;  // the OS thread (gettid) that runs the loop; 0: not run yet
  // Its IoRing (file namespaces), copied by the loop's own thread.
  bool has_ring = false;
  size_t ring_in_flight = 0;
  IoRingCounters ring;
  size_t live_queues = 0;
  uint64_t commands = 0, bytes_in = 0, bytes_out = 0, errors = 0, file_commands = 0;
};

struct TargetCounters {
  uint64_t connect_requests = 0, accepted = 0, rejected = 0;
  uint64_t rejected_private = 0;  // private data that did not fit (NVMe-RDMA reject status)
  uint64_t rejected_resources = 0;  // no memory / QP / MAC
  uint64_t disconnects_sent = 0;  // failed queues, expired keep-alive, shutdown
  uint64_t keep_alive_expired = 0;
  uint64_t queues_destroyed = 0;
  // Disconnected queues whose destruction waited (file commands still in
  // the IoRing) at least one poll: never blocking the loop on them.
  uint64_t destroy_deferred = 0;
  // Messages the home loop sent to other loops' threads (threads mode):
  // queues handed over after the accept, queues to release, report requests.
  uint64_t loop_messages = 0;
  // A report() a loop's thread did not answer within 2 s (its queues are missing from it).
  uint64_t report_timeouts = 0;
  // Queues destroyed while the kernel still had file commands of theirs
  // (~Queue gave up waiting): their memory is kept until the ring gives
  // those back (freed by poll()), never freed under the kernel.
  uint64_t memory_kept = 0;
};

class RdmaTarget {
 public:
  // Throws std::runtime_error when a listen address is malformed or not the
  // node's, or the CM cannot listen, or the target has a file namespace and
  // io_uring is unavailable (the message says so).
  RdmaTarget(engine::Embedded& node, Target& target, const RdmaOptions& o);
  ~RdmaTarget();  // destroys every queue (without waiting for the hosts)
  RdmaTarget(const RdmaTarget&) = delete;
  RdmaTarget& operator=(const RdmaTarget&) = delete;

  // One pass: the node's poll(), CM events, every queue's completions and
  // actions, keep-alive. Returns work done.
  uint32_t poll();
  // Sends DREQ on every queue (hosts see a clean disconnect); poll() until
  // queues() is 0 (or destroy the target).
  void disconnect_all();

  // Queues: live ones and disconnected ones whose file commands are still
  // in the IoRing (destroyed by a later poll once none is left).
  size_t queues() const noexcept;
  // Core loops (the node's, Embedded::loops()): queue qid 0 on loop 0 (the
  // home loop, where the CM runs), I/O queue n on loop n % loops().
  size_t loops() const noexcept { return rings_.size(); }
  static size_t loop_of(uint16_t qid, size_t loops) noexcept { return qid == 0 ? 0 : qid % loops; }
  // True when loops 1..N-1 run on threads of their own (RdmaOptions::threads).
  bool threaded() const noexcept { return threaded_; }
  // The OS thread (gettid) that runs loop l (0: not run yet).
  uint32_t loop_tid(size_t l) const noexcept;
  // A loop's io_uring (nullptr: no file namespace in the target). Its
  // counters belong to the loop's thread: in threads mode read them through
  // loop_report() (copied there by that thread).
  const IoRing* ring(size_t loop = 0) const noexcept { return loop < rings_.size() ? rings_[loop].get() : nullptr; }
  const TargetCounters& counters() const noexcept { return ctr_; }
  // Live queues and, before them, the ones already closed (their last counters).
  std::vector<QueueReport> report() const;
  // Per core loop: live queues, commands and bytes (from report()), its ring's counters.
  std::vector<LoopReport> loop_report() const;
  // The "ADDR:PORT" pairs listened on.
  const std::vector<std::string>& listening() const noexcept { return listening_; }

  struct Conn;  // target.cc
  struct Loop;  // target.cc

 private:
  void on_event(const cm::Event& e);
  void on_connect_request(const cm::Event& e);
  bool try_accept(Conn& c);
  void reject(cm::ConnId id, CmStatus s);
  void destroy(Conn& c);
  uint32_t poll_queue(Conn& c, uint64_t now);  // completions, capsules
  uint32_t post_actions(Conn& c);               // the Queue's actions as work requests
  uint32_t poll_loop(size_t loop, uint64_t now, bool& gone);  // one loop's queues and ring
  uint32_t poll_remote(size_t loop);  // loop >= 1 on its own thread: messages, queues, ring, releases
  bool remote(const Conn& c) const noexcept;  // threads mode, a queue of loop >= 1
  bool remote_loop(size_t l) const noexcept;  // threads mode, loop >= 1
  void send(size_t loop, int kind, Conn* c, std::shared_ptr<void> req);
  void home_adopt(Conn& c);
  void home_drop(Conn& c);
  bool release(Conn& c);  // destroy now (true), or park it while file commands are in the ring
  void sweep();           // conns_ with id 0 out (parked ones to closing_)
  void disconnect(Conn& c);
  QueueReport report_of(const Conn& c) const;
  // report() and, when rings is given, each loop's ring counters (into rings[loop]).
  std::vector<QueueReport> collect(std::vector<LoopReport>* rings) const;

  engine::Embedded& node_;
  Target& target_;
  RdmaOptions opt_;
  // One per core loop (entries null without a file namespace). Declared
  // before the queues: they outlive them (members go in reverse).
  std::vector<std::unique_ptr<IoRing>> rings_;
  // Per core loop: its queues (touched by the loop's thread only), its
  // message box (threads mode), its thread id.
  std::vector<std::unique_ptr<Loop>> loops_;
  bool threaded_ = false;
  std::atomic<bool> close_requests_{false};  // a remote loop's queue failed: the home loop disconnects it
  CmLimits limits_;
  uint32_t pd_ = 0;
  std::vector<cm::ConnId> listeners_;
  std::vector<std::string> listening_;
  std::vector<cm::Event> events_, work_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<Conn>> closing_;  // disconnected, file commands still in the ring
  std::vector<QueueReport> closed_;
  struct Kept {
    uint8_t* mem;
    size_t loop;
  };
  std::vector<Kept> kept_;  // memory_kept: freed once the loop's ring has no orphans
  mutable TargetCounters ctr_;
  uint64_t next_ka_check_ = 0;
};

}  // namespace droce::nvmf::rdma

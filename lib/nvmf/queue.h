// One NVMe-oF queue (admin or I/O) over an RDMA connection, as a pure state
// machine: the glue feeds it received capsules and work completions and posts
// the actions it asks for (RDMA READ, RDMA WRITE, SEND with or without
// Invalidate). Requests live in a fixed array of slots (queue depth), each with
// its data buffer carved from memory the glue registered; nothing is
// allocated per command. The request states are README.md's.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "nvmf/capsule.h"
#include "nvmf/controller.h"
#include "nvmf/io_ring.h"
#include "nvmf/latency.h"

namespace droce::nvmf {

struct Action {
  enum Kind : uint8_t { RdmaRead, RdmaWrite, Send };
  Kind kind = Send;
  uint16_t slot = 0;          // the request (work request id)
  uint8_t* local = nullptr;   // data buffer (READ/WRITE) or the 16-byte CQE (SEND)
  uint32_t len = 0;
  uint64_t remote_addr = 0;   // READ/WRITE
  uint32_t rkey = 0;
  bool invalidate = false;    // SEND with Invalidate of rkey
};

struct QueueConfig {
  uint16_t qid = 0;           // from the CM private data
  uint16_t depth = 32;        // hsqsize + 1
  uint32_t slot_buffer = 0;   // bytes of data buffer per slot (the largest transfer)
  // The io_uring of the queue's core, for commands on file namespaces (I/O
  // queues; nullptr: such commands are answered Internal Error). The ring
  // outlives the queue.
  IoRing* ring = nullptr;
  // Request slots, 0: depth. An RDMA glue gives 2 * depth (as Linux's
  // nvmet-rdma): the host reuses a command slot as soon as it has the
  // response, possibly before the target has seen its SEND complete (the
  // ACK lost or late), so a new command can find every slot still Completing.
  uint16_t slots = 0;
};

struct QueueCounters {
  uint64_t commands = 0, bytes_in = 0, bytes_out = 0;
  uint64_t errors = 0;          // commands answered with an error status
  uint64_t short_capsules = 0;  // dropped: shorter than an SQE
  uint64_t overflow = 0;        // dropped: more commands than the queue depth
  uint64_t bad_completions = 0; // completions for no request in that state
  uint64_t file_commands = 0;   // commands handed to the IoRing (file namespaces)
  uint64_t no_ring = 0;         // file commands on a queue without an IoRing (Internal Error)
  // Per command, from the capsule's arrival (on_capsule's now_ns) to its
  // response SEND's completion (on_complete's now_ns): what the host waits,
  // less the wire. AERs (they wait for an event) are not in it.
  QueueLatency latency;
};

class Queue {
 public:
  // WaitingForBackend: a file namespace's command is with the core's IoRing;
  // its completion resumes the request (RDMA WRITE + response, or response).
  // Held: answered already, but its file command is still in the kernel (past
  // the IoRing's deadline twice): not reused until the kernel gives it back.
  enum class State : uint8_t { Free, ReadingFromHost, Deferred, Completing, WaitingForBackend, Held };

  // data_mem: slots (or depth) * slot_buffer bytes (registered for RDMA by the glue).
  Queue(Target& t, const QueueConfig& c, std::span<uint8_t> data_mem);
  // The admin queue destroys its controller; an I/O queue detaches. File
  // commands still in the IoRing are cancelled and waited for (bounded, 2 s:
  // the kernel may be writing into data_mem), so the glue may free data_mem
  // right after; to never block, destroy a queue once backend_busy() is 0.
  ~Queue();
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  // A received command capsule (SQE + in-capsule data). The bytes are used
  // before this returns: the glue reposts the receive buffer right away.
  void on_capsule(std::span<const uint8_t> capsule, uint64_t now_ns);
  // Completion of an action this queue asked for. ok false: the QP failed;
  // the request is dropped and failed() turns true (the glue disconnects).
  void on_complete(uint16_t slot, Action::Kind kind, bool ok, uint64_t now_ns);
  // AER completions of the controller (admin queue); call every poll.
  void poll();
  // Actions to post, in order; at most out.size() per call.
  size_t take_actions(std::span<Action> out) noexcept;

  // Its controller, nullptr before Connect and after the controller went (gone()).
  Controller* controller() noexcept;
  bool failed() const noexcept { return failed_; }
  const QueueCounters& counters() const noexcept { return ctr_; }
  State state(uint16_t slot) const noexcept { return slots_[slot].state; }
  size_t busy() const noexcept;
  // Requests whose file command the kernel has (WaitingForBackend, or
  // answered after the deadline and held): their buffers are the kernel's.
  size_t backend_busy() const noexcept;

 private:
  friend class IoRing;
  struct Slot {
    State state = State::Free;
    Sqe sqe;
    DataPlan plan;
    std::span<uint8_t> buf;
    std::array<uint8_t, kCqeSize> cqe{};
    uint64_t arrival_ns = 0;  // on_capsule's now_ns
    bool timed = false;       // into the latency histogram at the SEND's completion
    bool held = false;        // its file command is still in the kernel (answered at the deadline)
    BackendOp file;  // the file command in the IoRing (WaitingForBackend)
  };
  // The IoRing resumes a WaitingForBackend request: its status and, for a
  // read, the bytes now in the slot's buffer.
  void backend_done(uint16_t slot, Status st, uint32_t data_len) noexcept;
  // The IoRing gave up on a command (past the deadline, the cancel did not
  // take): answered Internal Error now, the slot held (backend_released frees it).
  void backend_stuck(uint16_t slot) noexcept;
  void backend_released(uint16_t slot) noexcept;
  void start_file(uint16_t i, const Response& r);
  void execute(uint16_t i, uint64_t now_ns);
  void finish(uint16_t i, const Response& r);
  void respond(uint16_t i, Cqe c);
  void push(const Action& a);

  Target& target_;
  QueueConfig cfg_;
  std::vector<Slot> slots_;
  std::vector<Action> actions_;  // ring of capacity 3 * slots
  size_t act_head_ = 0, act_count_ = 0;
  uint16_t cntlid_ = 0;          // 0: not connected
  // Its controller, held from Connect on: an I/O command reads only its
  // immutable parts (subsystem, namespaces) and the atomic CSTS.RDY, with
  // no table lookup and no lock (the queue may run on another loop's thread).
  std::shared_ptr<Controller> ctrl_;
  uint16_t sq_head_ = 0;
  bool failed_ = false;
  QueueCounters ctr_;
};

}  // namespace droce::nvmf

// The NVMe-oF target model, pure: a Target holds Subsystems (NQN, host
// allow-list, namespaces) and the discovery subsystem; Fabrics Connect creates
// a Controller (admin queue) or attaches an I/O queue to one. Each command is
// a function of (controller state, SQE, data buffer) returning a CQE and, for
// controller-to-host commands, how many bytes of the buffer to send: the RDMA
// glue only moves bytes (lib/nvmf/README.md). Time comes in as nanoseconds of
// any monotonic clock.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nvmf/capsule.h"
#include "nvmf/identify.h"
#include "nvmf/namespace.h"
#include "nvmf/spec.h"

namespace droce::nvmf {

struct TargetConfig {
  uint16_t max_queue_depth = 128;   // CAP.MQES + 1; I/O queue entries accepted
  uint16_t admin_queue_depth = 32;  // entries of an admin queue (asqsz)
  uint16_t max_io_queues = 8;
  uint32_t in_capsule_data = 8192;  // bytes after the SQE
  uint8_t mdts = 5;                 // 2^mdts * 4 KiB per command
  uint16_t kas_100ms = 1;           // keep-alive granularity
  // The port the discovery log advertises.
  std::string traddr = "0.0.0.0";
  bool ipv6 = false;
  uint16_t port = kRdmaPort;
  uint16_t portid = 1;
  std::string serial_prefix = "DROCE";
  std::string model = "droce-nvmf";
  std::string firmware = "0.1";

  uint32_t max_transfer() const noexcept { return mdts ? (4096u << mdts) : (1u << 24); }
};

class Subsystem {
 public:
  // Throws std::invalid_argument on a malformed NQN or serial/model too long.
  Subsystem(std::string nqn, std::string serial, std::string model, bool allow_any_host);
  const std::string& nqn() const noexcept { return nqn_; }
  const std::string& serial() const noexcept { return serial_; }
  const std::string& model() const noexcept { return model_; }
  bool is_discovery() const noexcept { return discovery_; }

  void allow_host(std::string hostnqn);  // throws on a malformed NQN
  bool host_allowed(std::string_view hostnqn) const noexcept;

  // Throws std::invalid_argument on a duplicate NSID.
  Namespace& add_namespace(std::unique_ptr<Namespace> ns);
  Namespace* ns(uint32_t nsid) const noexcept;
  std::span<const uint32_t> nsids() const noexcept { return nsids_; }
  uint32_t max_nsid() const noexcept { return nsids_.empty() ? 0 : nsids_.back(); }
  // True when a namespace is backed by a file (a volatile write cache: Identify VWC).
  bool has_file_namespace() const noexcept;

 private:
  friend class Target;
  std::string nqn_, serial_, model_;
  bool allow_any_ = false;
  bool discovery_ = false;
  std::vector<std::string> hosts_;
  std::map<uint32_t, std::unique_ptr<Namespace>> ns_;
  std::vector<uint32_t> nsids_;  // sorted
};

// The outcome of one command.
struct Response {
  Cqe cqe;
  uint32_t data_len = 0;   // controller-to-host: bytes of the data buffer to send
  bool deferred = false;   // AER: the response comes later from take_async()
  // A file namespace's command: nothing done yet; the queue submits `file`
  // on `ns` to its core's io_uring and answers on its completion.
  bool pending = false;
  Namespace* ns = nullptr;
  FileOp file;
};

class Target;

class Controller {
 public:
  Controller(const Target& t, Subsystem& s, uint16_t cntlid, const ConnectData& host, uint32_t kato_ms,
             uint64_t now_ns);

  uint16_t cntlid() const noexcept { return cntlid_; }
  Subsystem& subsystem() const noexcept { return sub_; }
  const std::string& hostnqn() const noexcept { return hostnqn_; }
  const std::array<uint8_t, 16>& hostid() const noexcept { return hostid_; }

  // A command of the admin queue (Fabrics Property Get/Set included; Connect
  // is Target::connect's). data: host->ctrl, the data received; ctrl->host,
  // the buffer to fill (its size is the SGL's length).
  Response execute_admin(const Sqe& s, std::span<uint8_t> data, uint64_t now_ns);
  // A command of an I/O queue (NVM command set). RAM namespace: done here.
  // File namespace: checked here (range, length, write protection) and
  // answered `pending` with the FileOp to carry out (queue.h, io_ring.h).
  Response execute_io(const Sqe& s, std::span<uint8_t> data) noexcept;

  // Keep alive: false once kato passed without a Keep Alive command (the glue
  // then tears the association down; the host reconnects).
  bool alive(uint64_t now_ns) const noexcept { return kato_ms_ == 0 || now_ns < ka_deadline_ns_; }
  uint32_t kato_ms() const noexcept { return kato_ms_; }

  // Asynchronous events: a namespace's attributes changed. Completes an
  // outstanding AER (take_async) or stays pending until one arrives.
  void notify_ns_changed(uint32_t nsid);
  // Completions produced outside a command (AERs). False when none.
  bool take_async(Cqe& out);
  // True while an AER with this cid waits for an event (a reset drops them).
  bool aer_pending(uint16_t cid) const noexcept {
    return std::find(aer_cids_.begin(), aer_cids_.end(), cid) != aer_cids_.end();
  }

  // Read by I/O queues on other loops' threads (one relaxed atomic load per
  // command); written by the admin queue's thread.
  bool ready() const noexcept { return (csts_.load(std::memory_order_relaxed) & csts::kRdy) != 0; }
  uint32_t cc() const noexcept { return cc_; }
  uint32_t csts() const noexcept { return csts_.load(std::memory_order_relaxed); }
  // Target::destroy ran (its admin queue went): I/O queues still holding it
  // answer Command Sequence Error until they go too.
  bool gone() const noexcept { return gone_.load(std::memory_order_acquire); }
  uint64_t cap() const noexcept { return cap_; }
  // I/O queues the host may connect (Set Features Number of Queues; the
  // maximum until the host asks).
  uint16_t io_queues() const noexcept { return io_queues_; }
  // Bumped by every controller reset (CC.EN 1 -> 0, shutdown): the glue drops
  // I/O queues connected under an older generation.
  uint32_t generation() const noexcept { return generation_; }

  // I/O queue bookkeeping (Target::connect, and the glue when a queue goes).
  bool io_queue_connected(uint16_t qid) const noexcept { return qid < ioq_.size() && ioq_[qid]; }
  void io_queue_closed(uint16_t qid) noexcept { if (qid < ioq_.size()) ioq_[qid] = false; }

 private:
  friend class Target;
  Response property_get(const Sqe& s, std::span<uint8_t>);
  Response property_set(const Sqe& s);
  Response identify(const Sqe& s, std::span<uint8_t> data);
  Response get_log_page(const Sqe& s, std::span<uint8_t> data);
  Response set_features(const Sqe& s, uint64_t now_ns);
  Response get_features(const Sqe& s, std::span<uint8_t> data);
  Response async_event(const Sqe& s);
  Response file_io(const Sqe& s, Namespace& ns, std::span<uint8_t> data, uint64_t slba, uint64_t nlb) noexcept;
  void reset() noexcept;
  void deliver_events();

  const Target& target_;
  Subsystem& sub_;
  uint16_t cntlid_;
  std::string hostnqn_;
  std::array<uint8_t, 16> hostid_{};
  uint64_t cap_ = 0;
  uint32_t cc_ = 0;
  std::atomic<uint32_t> csts_{0};
  std::atomic<bool> gone_{false};
  bool ka_expired_ = false;  // named by Target::expired (under Target::mutex())
  uint32_t kato_ms_ = 0;
  uint64_t ka_deadline_ns_ = 0;
  uint16_t io_queues_ = 0;
  bool io_queues_set_ = false;
  uint32_t aec_ = 0;  // Asynchronous Event Configuration
  uint32_t generation_ = 0;
  std::vector<bool> ioq_;
  std::deque<uint16_t> aer_cids_;     // outstanding AERs
  std::deque<uint32_t> events_;       // pending event results (DW0)
  std::deque<Cqe> async_out_;
  std::vector<uint32_t> changed_ns_;  // Changed Namespace List log
  bool ns_event_masked_ = false;      // until the host reads the Changed NS log
};

class Target {
 public:
  explicit Target(TargetConfig c);
  Target(const Target&) = delete;  // controllers refer to their target
  Target& operator=(const Target&) = delete;
  const TargetConfig& config() const noexcept { return cfg_; }

  // Throws std::invalid_argument on a duplicate or malformed NQN. model
  // empty: the target's.
  Subsystem& add_subsystem(std::string nqn, std::string serial, bool allow_any_host, std::string model = {});
  Subsystem* subsystem(std::string_view nqn) noexcept;
  Subsystem& discovery() noexcept { return *subs_.front(); }
  // True when a namespace is backed by a file: the glue then gives every I/O
  // queue its core's IoRing (QueueConfig::ring).
  bool has_file_namespace() const noexcept;

  struct Connected {
    Cqe cqe;                       // the Connect response (DW0: cntlid on success)
    Controller* ctrl = nullptr;    // set on success
    // The same, owned: a queue keeps its controller alive with it (an I/O
    // queue on another loop's thread may outlive the admin queue briefly).
    std::shared_ptr<Controller> ref;
  };
  // Fabrics Connect on queue qid (the CM negotiated it; cmd.qid must match).
  // data: the 1024 bytes (in-capsule or read from the host).
  Connected connect(const Sqe& s, std::span<const uint8_t> data, uint16_t cm_qid, uint64_t now_ns);
  // The admin queue of a controller went away: the controller leaves the
  // table (gone() turns true); the object goes with the last queue holding it.
  void destroy(uint16_t cntlid) noexcept;
  Controller* controller(uint16_t cntlid) noexcept;
  size_t controllers() const noexcept {
    std::lock_guard lk(mu_);
    return ctrls_.size();
  }
  // Serialises what I/O queues on other loops' threads share with the admin
  // queue's thread: the controller table, Connect of an I/O queue, and the
  // admin commands (queue.cc takes it around execute_admin); never taken by
  // an I/O command. One thread driving everything: uncontended.
  std::mutex& mutex() const noexcept { return mu_; }
  // The I/O queue qid of a controller went away (under mutex()).
  void io_queue_closed(Controller& c, uint16_t qid) noexcept {
    std::lock_guard lk(mu_);
    c.io_queue_closed(qid);
  }

  // The discovery log a host may see: one entry per subsystem it is allowed on.
  std::vector<uint8_t> discovery_log(std::string_view hostnqn) const;
  // Controllers whose keep-alive expired at now_ns (the glue disconnects
  // them), each named once: a controller stays in the table until its admin
  // queue is gone, which may take many checks (the host must answer the
  // DREQ); from then on it also refuses the Connect of further I/O queues.
  std::vector<uint16_t> expired(uint64_t now_ns);

 private:
  TargetConfig cfg_;
  std::vector<std::unique_ptr<Subsystem>> subs_;  // [0]: discovery
  std::map<uint16_t, std::shared_ptr<Controller>> ctrls_;
  mutable std::mutex mu_;
  uint16_t next_cntlid_ = kCntlidMin;
  uint64_t genctr_ = 0;
};

}  // namespace droce::nvmf

// nvmf::host::Host: an NVMe-oF RDMA initiator on an embedded droce node
// (README.md). Control calls (connect, discover, shutdown) block, polling the
// node, each wait bounded; submit/poll are the data path: no allocation, no
// locks, no exceptions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cm/agent.h"
#include "engine/embed.h"
#include "nvmf/capsule.h"
#include "nvmf/identify.h"
#include "nvmf/spec.h"

namespace droce::nvmf::host {

struct HostError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct HostOptions {
  std::string target_ip;                // IPv4
  uint16_t port = kRdmaPort;
  std::string subnqn;                   // kDiscoveryNqn for discover()
  std::string hostnqn;                  // empty: nqn.2014-08.org.nvmexpress:uuid:<hostid>
  std::array<uint8_t, 16> hostid{};     // all zero: random
  uint16_t io_queues = 1;
  uint16_t queue_size = 33;             // entries per I/O queue (hsqsize + 1); commands in flight: one less
  uint32_t kato_ms = 5000;              // Keep Alive Timeout (0: none; discovery uses 0)
  size_t data_bytes = 1 << 20;          // the application's data area (registered)
  uint32_t max_inline = 8192;           // largest in-capsule write we send (also capped by IOCCSZ)
  uint32_t timeout_ms = 10000;          // each control wait
  uint8_t traffic_class = 0;
};

// What Identify and the connection negotiated.
struct ControllerInfo {
  uint16_t cntlid = 0;
  uint64_t cap = 0;
  uint32_t vs = 0;
  std::string sn, mn, fr, subnqn;
  uint32_t mdts_bytes = 0;      // 0: no limit
  uint32_t ioccsz = 0;          // 16-byte units
  uint32_t sgls = 0;
  uint16_t maxcmd = 0;
  uint32_t nn = 0;
  uint16_t kas = 0;
  uint8_t cntrltype = 0;
  uint32_t nsid = 1;
  uint64_t blocks = 0;          // namespace size (NSZE)
  uint32_t block_size = 0;      // from the LBA format in use
  uint16_t io_queues = 0;       // connected I/O queues
  uint16_t queue_size = 0;      // entries per I/O queue
  uint32_t inline_bytes = 0;    // writes up to this many bytes go in the capsule
};

struct Completion {
  uint64_t user = 0;
  Status status;
  uint16_t qid = 0;
};

enum class IoDir : uint8_t { Read, Write };

class Host {
 public:
  // Registers the memory; connects nothing yet.
  Host(engine::Embedded& node, const HostOptions& o);
  ~Host();  // shutdown() if still connected (errors ignored), then frees
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // Admin queue, controller enable, Identify, Number of Queues, I/O queues.
  // Throws HostError naming the step that failed.
  void connect();
  // Connects the admin queue to the discovery NQN (whatever options.subnqn
  // says), enables it, reads the whole discovery log, shuts down.
  std::vector<DiscEntry> discover();
  // CC.SHN, CSTS.SHST wait, CM disconnect of every queue. Idempotent.
  void shutdown();

  const ControllerInfo& info() const noexcept { return info_; }
  uint8_t* data() const noexcept { return data_; }
  size_t data_size() const noexcept { return opt_.data_bytes; }

  // Queues one Read or Write of `blocks` blocks at `lba` on I/O queue qid
  // (1-based) with `buf` inside data(). 0, EAGAIN (queue full), EINVAL (bad
  // queue, buffer outside data(), transfer above MDTS or zero), EIO (failed).
  int submit(uint16_t qid, IoDir dir, uint64_t lba, uint32_t blocks, uint8_t* buf, uint64_t user) noexcept;
  // Polls the node and the queues; writes up to max completions. Sends Keep
  // Alive when due. Returns the number written, or -EIO once failed.
  int poll(Completion* out, int max) noexcept;
  uint32_t in_flight(uint16_t qid) const noexcept;
  bool failed() const noexcept { return failed_; }
  const std::string& failure() const noexcept { return failure_; }

  struct Queue;  // host.cc

 private:
  struct Admin;
  void setup_memory();
  void connect_queue(uint16_t qid, uint16_t size);
  void enable_controller();
  void identify();
  Cqe admin_sync(Sqe& s, uint32_t data_len, IoDir dir, const char* what);
  Cqe command_sync(Queue& q, Sqe& s, uint32_t data_len, const char* what);
  void wait_for(const char* what, uint32_t timeout_ms, const std::function<bool()>& done);
  void disconnect_queue(Queue& q);
  void on_cm(const cm::Event& e);
  int poll_queue(Queue& q, Completion* out, int max) noexcept;
  int post_command(Queue& q, uint32_t slot, uint32_t inline_len, uint8_t* inline_buf) noexcept;
  void fail(std::string why) noexcept;
  void keep_alive(uint64_t now_ns) noexcept;

  engine::Embedded& node_;
  HostOptions opt_;
  ControllerInfo info_;
  uint32_t pd_ = 0;
  uint32_t key_ = 0;          // lkey = rkey of the one MR
  uint8_t* mem_ = nullptr;
  size_t mem_len_ = 0;
  uint8_t* admin_buf_ = nullptr;  // admin data (Identify, Connect data, discovery log)
  size_t admin_buf_len_ = 0;
  uint8_t* data_ = nullptr;
  std::vector<Queue*> queues_;  // [0] admin, [1..N] I/O
  std::vector<cm::Event> events_;
  wire::Gid local_ip_{}, target_ip_{};
  uint16_t next_sport_ = 0;
  bool connected_ = false;
  bool failed_ = false;
  std::string failure_;
  uint64_t ka_due_ns_ = 0;
  uint64_t ka_interval_ns_ = 0;
  uint32_t poll_count_ = 0;
};

}  // namespace droce::nvmf::host

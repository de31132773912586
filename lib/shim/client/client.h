// The shim client library: no DPDK. A ShimConnection performs control calls
// (protocol.h) over the daemon's Unix socket; ClientCq / ClientQp / ClientSrq
// map the rings an object's create response sent and post/poll through them
// with no system call.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "shim/protocol.h"
#include "shim/ring.h"
#include "shim/shm.h"

namespace droce::shim {

// $DROCE_SOCKET, else proto::kDefaultSocket.
std::string default_socket_path();

class ShimConnection {
 public:
  ShimConnection() = default;
  ~ShimConnection();
  ShimConnection(const ShimConnection&) = delete;
  ShimConnection& operator=(const ShimConnection&) = delete;

  int connect(const std::string& path);  // 0 or -errno
  void close();
  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }  // for poll(): hang-up = the daemon is gone

  // One request/response. Returns the server's status (0 or -errno) or a
  // local -errno. Received fds go to out_fds (the caller owns them); any
  // beyond max_out are closed.
  template <proto::Op O>
  int call(const typename proto::Body<O>::Request& req, typename proto::Body<O>::Response& resp,
           const int* in_fds = nullptr, int n_in = 0, int* out_fds = nullptr, int max_out = 0,
           int* n_out = nullptr) {
    using Req = typename proto::Body<O>::Request;
    using Resp = typename proto::Body<O>::Response;
    int dummy = 0;
    return call_raw(O, &req, proto::body_size<Req>(), &resp, proto::body_size<Resp>(), in_fds, n_in,
                    out_fds, max_out, n_out ? n_out : &dummy);
  }

 private:
  int call_raw(proto::Op op, const void* req, size_t req_len, void* resp, size_t resp_len, const int* in_fds,
               int n_in, int* out_fds, int max_out, int* n_out);
  int fd_ = -1;
  uint32_t seq_ = 0;
  std::mutex mu_;
};

// A tiny lock for the verbs rule that posting and polling are thread-safe
// per object; uncontended it is one atomic exchange.
class SpinLock {
 public:
  void lock() {
    while (f_.exchange(true, std::memory_order_acquire))
      while (f_.load(std::memory_order_relaxed)) {
      }
  }
  void unlock() { f_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> f_{false};
};

class ClientCq {
 public:
  // Takes ownership of fd.
  int attach(int fd, const proto::CreateCqResp& r);
  // After ResizeCq: maps the new region (takes ownership of fd) and reads
  // from it; the old one is unmapped. On error the old one stays.
  int reattach(int fd, const proto::CreateCqResp& r);
  // Copies up to n completions out and returns them to the ring in one
  // store. No syscall.
  int poll(int n, droce_shm_cqe* out);
  // Extended polling (ibv_start_poll/next_poll/end_poll): the i-th unread
  // completion in place (the daemon writes a slot only after it was
  // returned), nullptr when there is none; consume() returns n in one store.
  const droce_shm_cqe* peek(uint32_t i) { return ring_.peek(i); }
  void consume(uint32_t n) {
    if (n) ring_.release(n);
  }
  void arm(bool solicited_only) { cq_arm(ring_.hdr(), solicited_only); }
  uint32_t events() { return cq_events(ring_.hdr()); }
  uint32_t overflows() { return ring_.hdr()->overflows; }
  SpinLock lock;

 private:
  ShmRegion region_;
  RingConsumer<droce_shm_cqe> ring_;
};

// The connection's doorbell region (droce_shm_abi.h, "doorbells"): rings
// attached with it ring their object's bit when the daemon has parked them.
class ClientDoorbell {
 public:
  // OpenDoorbell on conn; 0, or -errno (then none: every ring is polled).
  int open(ShimConnection& conn);
  droce_shm_doorbell* get() const { return static_cast<droce_shm_doorbell*>(region_.addr()); }

 private:
  ShmRegion region_;
};

class ClientQp {
 public:
  int attach(int fd, const proto::CreateQpResp& r, bool has_srq, droce_shm_doorbell* db = nullptr);
  RingProducer<droce_shm_send_wqe> sq;
  // Unattached with an SRQ. Follows the daemon's `done`: full at max_recv_wr
  // receives not yet finished (ibv_post_recv: ENOMEM).
  RingProducer<droce_shm_recv_wqe> rq;
  SpinLock sq_lock, rq_lock;

 private:
  ShmRegion region_;
};

class ClientSrq {
 public:
  int attach(int fd, const proto::CreateSrqResp& r, droce_shm_doorbell* db = nullptr);
  RingProducer<droce_shm_recv_wqe> rq;  // follows `done`, as ClientQp's rq
  SpinLock lock;

 private:
  ShmRegion region_;
};

// Memory the daemon can reach (README.md, "Memory scheme").
struct MrMemory {
  int fd = -1;          // a dup the caller sends and then closes
  uint64_t map_addr = 0, map_len = 0, fd_offset = 0;
  uint32_t entry = 0;   // registry entry, for release_mr_memory
};
// Makes [addr, addr+len) memfd-backed at the same address (copying the
// current contents) unless it already is, and returns what RegMrReq needs.
int prepare_mr_memory(void* addr, size_t len, MrMemory& out);
// Drops one reference taken by prepare_mr_memory. The pages stay mapped in
// the process (the program still owns its buffer).
void release_mr_memory(uint32_t entry);
// memfd-backed memory from the shim (no copy at registration); hugepages
// for 2 MiB multiples when available.
void* alloc_shared(size_t len);
void free_shared(void* p);

}  // namespace droce::shim

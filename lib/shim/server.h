// ShimServer: droced's side of the shim control protocol (protocol.h).
// Accepts clients on a Unix socket, validates every request, keeps each
// client's objects in its own handle table, calls the ShimBackend, and
// destroys everything a client owned when its connection ends (exit, crash,
// kill -9: the kernel closes the socket).
//
// Threading: all socket I/O and every backend call happen on one thread,
// either the caller of poll_once() or the thread start() spawns.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "shim/backend.h"
#include "shim/cm_backend.h"
#include "shim/shm.h"

namespace droce::shim {

struct ShimServerConfig {
  std::string socket_path = proto::kDefaultSocket;
  uint32_t socket_mode = 0660;       // chmod of the socket file
  uint32_t max_clients = 256;
  uint32_t max_objects_per_client = 65536;
  // Per-client quotas, so that one local client cannot take what the others
  // need. Beyond one, the create call fails with ENOMEM (what ibverbs
  // programs get from a device out of resources, and from ibv_reg_mr beyond
  // RLIMIT_MEMLOCK), counted in ShimServerStats::quota_refused.
  uint32_t max_qps_per_client = 1024;
  uint32_t max_cqs_per_client = 2048;
  uint32_t max_srqs_per_client = 1024;
  uint32_t max_mrs_per_client = 4096;
  uint32_t max_ahs_per_client = 4096;
  uint64_t max_mr_bytes_per_client = 1ull << 36;  // registered bytes (whole pages)
  // A request whose address the backend is still resolving (-EINPROGRESS,
  // backend.h) is parked and retried every resolve_retry_ms; after
  // resolve_timeout_ms it fails with EHOSTUNREACH. Other clients are served
  // meanwhile.
  uint32_t resolve_retry_ms = 2;
  uint32_t resolve_timeout_ms = 3000;
  // RDMA CM (with a CmBackend): per-client CM ids and event channels
  // (beyond one: ENOMEM, counted in quota_refused), and how many
  // CONNECT_REQUESTs a listener may have unread (more are rejected).
  uint32_t max_cm_ids_per_client = 4096;
  uint32_t max_cm_channels_per_client = 256;
  uint32_t max_cm_backlog = 1024;
  bool lock_mr_memory = true;        // mlock registered memory (best effort)
  // Every QP/SRQ/CQ region in a 2 MiB hugepage (TLB-friendly for the engine,
  // 2 MiB per object); otherwise only regions of 1 MiB or more. Falls back
  // to 4 KiB pages when no hugepage is free.
  bool rings_in_hugepages = false;
};

enum class ObjKind : uint8_t { Pd, Mr, Channel, Cq, Srq, Qp, Ah, Mw, Count_ };
const char* obj_kind_name(ObjKind k);

struct ShimServerStats {
  uint64_t clients = 0;        // connected now
  uint64_t clients_total = 0;  // ever accepted
  uint64_t requests = 0;
  uint64_t errors = 0;         // requests answered with an error
  uint64_t dropped = 0;        // connections cut for protocol violations
  uint64_t objects[static_cast<int>(ObjKind::Count_)] = {};
  uint64_t mapped_bytes = 0;   // shared memory the server maps now (rings + MRs)
  uint64_t quota_refused = 0;  // creates refused by a per-client quota
  uint64_t parked = 0;         // requests parked while their address resolved (ever)
  uint64_t parked_now = 0;     // clients whose request is parked now
  // RDMA CM (cm_sessions.h), all zero without a CmBackend.
  uint64_t cm_ids = 0;             // CM ids now
  uint64_t cm_channels = 0;        // CM event channels now
  uint64_t cm_listeners = 0;       // listening ids now
  uint64_t cm_bindings = 0;        // bound (port space, port, address) now
  uint64_t cm_resolving = 0;       // ids resolving their address now
  uint64_t cm_events = 0;          // events queued for clients (ever)
  uint64_t cm_events_dropped = 0;  // events for ids/clients gone, unread at destroy, beyond a backlog
};

class CmSessions;

class ShimServer {
 public:
  // cm: the RDMA CM ops' backend (cm_backend.h); without one every Cm* op
  // answers ENOSYS. It must outlive the server.
  ShimServer(ShimBackend& backend, ShimServerConfig cfg, CmBackend* cm = nullptr);
  ~ShimServer();
  ShimServer(const ShimServer&) = delete;
  ShimServer& operator=(const ShimServer&) = delete;

  // Creates the socket (replacing a stale socket file). 0 or -errno.
  int listen();
  // Serves whatever is ready, waiting up to timeout_ms. 0 or -errno.
  int poll_once(int timeout_ms);
  // Runs poll_once() on a thread until stop().
  int start();
  void stop();

  ShimServerStats stats() const;
  const std::string& socket_path() const { return cfg_.socket_path; }

  struct Client;  // private; public so the .cc's helpers can name it

 private:
  void accept_clients();
  bool serve(Client& c);  // false: drop the connection
  // Runs one request (a new one, or a parked one again when `retry`); false: drop.
  bool handle(Client& c, const uint8_t* in, size_t n, const int* fds, int nfds, bool retry);
  void retry_parked(std::vector<Client*>& gone);
  void drop(Client& c);
  void destroy_all(Client& c);

  ShimBackend& backend_;
  ShimServerConfig cfg_;
  std::unique_ptr<CmSessions> cm_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  uint64_t next_client_id_ = 1;
  std::vector<std::unique_ptr<Client>> clients_;
  std::thread thread_;
  std::atomic<bool> running_{false};

  // Counters: written by the server thread, read by stats() anywhere.
  std::atomic<uint64_t> clients_total_{0}, requests_{0}, errors_{0}, dropped_{0}, mapped_bytes_{0};
  std::atomic<uint64_t> n_clients_{0};
  std::atomic<uint64_t> quota_refused_{0}, parked_{0}, parked_now_{0};
  std::atomic<uint64_t> objects_[static_cast<int>(ObjKind::Count_)] = {};

  friend struct ServerOps;
};

}  // namespace droce::shim

// CmSessions: the RDMA CM side of the ShimServer (protocol.h Cm* ops, the
// drop-in librdmacm's calls). Per client: CM event channels (a semaphore
// eventfd sent to the client + a queue of events) and CM ids (port space, QP
// type, addresses, the agent connection or listeners behind it). Across
// clients: the port bindings ((port space, port, address) unique) and the
// routing of the agents' events.
//
// Data flow: ops arrive on the server thread and call the CmBackend (the
// per-port cm::Agent). The agents' events come back through the backend's sink
// on engine core threads: they are queued (mutex) and the server thread is
// woken (its wake fd); run() routes each by its cookie (one per id, never
// reused) and (device, ConnId) to the id's channel, translates it to
// proto::CmEventResp (librdmacm's rdma_cm_event_type numbers) and writes the
// channel's eventfd once per event. A CONNECT_REQUEST makes a new id in the
// listener's client, on the listener's channel. Events for ids or clients
// that are gone are dropped and counted.
//
// Address resolution never blocks the server thread: CmResolveAddr takes one
// CmBackend::cm_resolve step and run() takes the next ones every
// resolve_retry_ms until the MAC is known (ADDR_RESOLVED) or the request's
// timeout passes (ADDR_ERROR, -ETIMEDOUT).
//
// Eventfd counts: one per event queued. An event that goes before the client
// read it (its id destroyed, or moved to another channel by CmMigrateId)
// leaves its count behind: CmGetEvent then answers -EAGAIN (spurious wakeup,
// never a lost event).
//
// Threading: everything but the sink and stats() runs on the server thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "shim/backend.h"
#include "shim/cm_backend.h"
#include "shim/protocol.h"

namespace droce::shim {

struct CmLimits {
  uint32_t max_ids_per_client = 4096;
  uint32_t max_channels_per_client = 256;
  uint32_t max_backlog = 1024;  // a listener's unread CONNECT_REQUESTs (as Linux's ucma max_backlog)
  uint32_t resolve_retry_ms = 2;
  uint32_t resolve_timeout_ms = 3000;  // CmResolveAddr with timeout_ms 0
};

struct CmStats {
  uint64_t ids = 0;             // CM ids now (every client)
  uint64_t channels = 0;        // CM event channels now
  uint64_t listeners = 0;       // listening ids now
  uint64_t bindings = 0;        // bound (port space, port, address) now
  uint64_t resolving = 0;       // ids whose address is being resolved now
  uint64_t events = 0;          // events queued on a channel (ever)
  uint64_t events_dropped = 0;  // events for ids/clients gone, unread at destroy, beyond a backlog
};

class CmSessions {
 public:
  // wake_fd: the server thread's eventfd (written when events arrive).
  // quota_refused: the server's counter (an id/channel beyond a quota).
  CmSessions(CmBackend& cm, ShimBackend& verbs, CmLimits lim, int wake_fd, std::atomic<uint64_t>& quota_refused);
  ~CmSessions();
  CmSessions(const CmSessions&) = delete;
  CmSessions& operator=(const CmSessions&) = delete;

  // The ops (protocol.h). 0 or -errno.
  int create_channel(const ClientInfo& c, proto::HandleResp& r, int* out_fd);
  int destroy_channel(const ClientInfo& c, const proto::HandleReq& q);
  int create_id(const ClientInfo& c, const proto::CmCreateIdReq& q, proto::HandleResp& r);
  int destroy_id(const ClientInfo& c, const proto::HandleReq& q);
  int migrate_id(const ClientInfo& c, const proto::CmMigrateIdReq& q);
  int bind_addr(const ClientInfo& c, const proto::CmAddrReq& q, proto::CmIdInfo& r);
  int resolve_addr(const ClientInfo& c, const proto::CmResolveAddrReq& q);
  int resolve_route(const ClientInfo& c, const proto::CmIdTimeoutReq& q);
  int listen(const ClientInfo& c, const proto::CmListenReq& q);
  int connect(const ClientInfo& c, const proto::CmConnParamReq& q);
  int accept(const ClientInfo& c, const proto::CmConnParamReq& q);
  int reject(const ClientInfo& c, const proto::CmRejectReq& q);
  int establish(const ClientInfo& c, const proto::HandleReq& q);
  int disconnect(const ClientInfo& c, const proto::HandleReq& q);
  int init_qp_attr(const ClientInfo& c, const proto::CmInitQpAttrReq& q, proto::CmInitQpAttrResp& r);
  int get_event(const ClientInfo& c, const proto::HandleReq& q, proto::CmEventResp& r);
  int query_id(const ClientInfo& c, const proto::HandleReq& q, proto::CmIdInfo& r);
  // A UD id bound to a device joins a group: MULTICAST_JOIN is queued at once
  // (RoCE has no SA; droced keeps no membership, the front attaches the QP).
  // -EINVAL: not UD, not bound to a device, not a multicast address, a family
  // other than the id's, or join_flags other than (send-only) full member.
  int join_multicast(const ClientInfo& c, const proto::CmJoinReq& q);

  // The client's connection ended: every connection and listener it owned is
  // destroyed in its agent (DREQ / REJ go out), its bindings freed.
  void client_gone(const ClientInfo& c);

  // Server thread: routes the queued events, takes due resolution steps.
  void run();
  // Milliseconds until run() has a resolution step due (0: now), -1: none.
  int next_timeout_ms() const;

  CmStats stats() const;

  struct Id;
  struct Channel;
  struct Session;

 private:
  using Clock = std::chrono::steady_clock;
  struct Inbox;

  Session* session(const ClientInfo& c, bool create);
  Id* find_id(const ClientInfo& c, uint32_t h);
  void route(uint32_t dev, const cm::Event& e);
  void deliver(Id& id, const proto::CmEventResp& ev);
  void resolve_step(Id& id, Clock::time_point now);
  void finish_resolve(Id& id, int status);
  int bind(Id& id, int family, const wire::Gid& ip, uint16_t port, uint32_t dev);
  void unbind(Id& id);
  void destroy(Session& s, Id& id);
  void fill_info(const Id& id, proto::CmIdInfo& r) const;
  void fill_ah(uint32_t dev, const wire::Gid& local, const wire::Gid& remote, ibv_ah_attr& ah) const;

  CmBackend& cm_;
  ShimBackend& verbs_;
  CmLimits lim_;
  std::atomic<uint64_t>& quota_refused_;
  std::shared_ptr<Inbox> inbox_;
  uint64_t next_cookie_ = 1;
  std::map<uint64_t, std::unique_ptr<Session>> sessions_;  // by client id
  std::map<uint64_t, Id*> cookies_;                        // every id
  std::map<std::pair<uint32_t, uint32_t>, Id*> conns_;     // (dev, ConnId) of active and passive ids
  struct Binding {
    wire::Gid ip;  // all zero: wildcard
    Id* id;
  };
  std::map<std::pair<uint32_t, uint16_t>, std::vector<Binding>> binds_;  // (port space, port)
  std::vector<Id*> resolving_;
  std::atomic<uint64_t> ids_{0}, channels_{0}, listeners_{0}, bindings_{0}, events_{0}, dropped_{0},
      resolving_n_{0};
};

}  // namespace droce::shim

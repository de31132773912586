// What droced implements for the ShimServer: the verbs objects behind each
// client's handles. Control path only (virtual calls are fine); every call
// returns 0 or -errno and runs on the ShimServer's thread. The server has
// already validated the client's handles and translated them to the ObjIds
// this backend returned; the backend validates attribute values (it knows
// its limits and the QP state machine).
//
// Rings: the server creates each object's shared-memory region and passes
// ring pointers here. The backend's engine core consumes the send/receive
// rings (RingConsumer, copy each entry out before validating it: the client
// can still write it) and produces the CQ ring (RingProducer, then
// cq_consume_arm() and, when it says so, write 1 to the CQ's eventfd). It
// returns a send-ring slot (release) before it publishes the completion of
// the work request that was in it (droce_shm_abi.h, "slot lifetime"). A
// destroy_* call must not return until the engine has stopped touching the
// object's rings and memory; the server unmaps them right after.
//
// Ring semantics the engine owes the client (verbs): receive WQEs may stay in
// the ring until a message needs one (the ring holds max_recv_wr); a QP
// moved to ERR completes everything it has taken and everything still in
// its rings with IBV_WC_WR_FLUSH_ERR; a QP moved to RESET consumes and drops
// what is in its rings without completions. Every value read from a ring is
// untrusted: an entry with a bad opcode, SGE count or length completes with
// an error (and the QP goes to ERR), an index that moved by more than the
// ring size (RingConsumer::corrupt()) is fatal for the object.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "shim/droce_shm_abi.h"
#include "shim/protocol.h"

namespace droce::shim {

using ObjId = uint64_t;  // the backend's own object id

struct ClientInfo {
  uint64_t id;   // server-assigned, unique for the server's lifetime
  uint32_t dev;  // the device the client opened
  pid_t pid;
  uid_t uid;
};

struct MrSetup {
  ObjId pd;
  void* addr;        // daemon-side address of the first byte of the MR
  uint64_t length;
  uint64_t iova;     // the address the client and its peers use
  uint32_t access;   // ibv_access_flags
};
struct MrResult {
  ObjId id;
  uint32_t lkey;
  uint32_t rkey;
};

struct MwResult {
  ObjId id;
  uint32_t rkey;
};

struct CqSetup {
  uint32_t cqe;               // requested
  uint32_t comp_vector;
  droce_shm_ring_hdr* ring;   // completion ring, daemon is the producer
  uint32_t ring_entries;
  int eventfd;                // completion channel's eventfd, or -1
  int async_eventfd;          // the client's (OpenAsync), or -1: write 1 per event
};
struct CqResult {
  ObjId id;
  uint32_t cqn;
};

struct SrqSetup {
  ObjId pd;
  ibv_srq_attr attr;          // max_wr, max_sge as granted, srq_limit
  droce_shm_ring_hdr* ring;   // receive ring, daemon is the consumer
  uint32_t ring_entries;
  int async_eventfd;          // the client's (OpenAsync), or -1
};
struct SrqResult {
  ObjId id;
  uint32_t srqn;
};

struct QpSetup {
  ObjId pd;
  ObjId send_cq;
  ObjId recv_cq;
  ObjId srq;  // 0 = none
  ibv_qp_type type;
  bool sq_sig_all;
  ibv_qp_cap cap;             // as granted
  droce_shm_ring_hdr* sq;     // send ring
  uint32_t sq_entries;
  droce_shm_ring_hdr* rq;     // receive ring, nullptr with an SRQ
  uint32_t rq_entries;
  int async_eventfd;          // the client's (OpenAsync), or -1: write 1 per event
};
struct QpResult {
  ObjId id;
  uint32_t qpn;
};

struct AhResult {
  ObjId id;
  uint32_t ah_num;
};

class ShimBackend {
 public:
  virtual ~ShimBackend() = default;

  virtual uint32_t device_count() = 0;
  virtual int device_info(uint32_t dev, proto::DeviceInfo& out) = 0;
  virtual int query_device(uint32_t dev, ibv_device_attr& out) = 0;
  virtual int query_port(uint32_t dev, uint32_t port, ibv_port_attr& out) = 0;
  // Fills up to max entries of the port's GID table; returns the count or -errno.
  virtual int query_gid_table(uint32_t dev, uint32_t port, ibv_gid_entry* out, uint32_t max) = 0;

  virtual int alloc_pd(const ClientInfo& c, ObjId& out) = 0;
  virtual int dealloc_pd(const ClientInfo& c, ObjId pd) = 0;
  virtual int reg_mr(const ClientInfo& c, const MrSetup& s, MrResult& out) = 0;
  virtual int dereg_mr(const ClientInfo& c, ObjId mr) = 0;
  // Memory windows (type: enum ibv_mw_type). A bound window is unbound by
  // dealloc; an MR with windows bound is refused by dereg_mr (-EBUSY).
  virtual int alloc_mw(const ClientInfo&, ObjId /*pd*/, uint32_t /*type*/, MwResult&) { return -EOPNOTSUPP; }
  virtual int dealloc_mw(const ClientInfo&, ObjId) { return -EINVAL; }
  virtual int create_cq(const ClientInfo& c, const CqSetup& s, CqResult& out) = 0;
  virtual int destroy_cq(const ClientInfo& c, ObjId cq) = 0;
  // ibv_resize_cq: from now on produce into `ring` (`ring_entries`, empty,
  // in a new region), after moving the unread completions of the old ring
  // into it (ring_move_unread); the client reads nothing meanwhile. -EINVAL
  // when the unread completions (with those the backend still holds) do not
  // fit. The server frees the old region after a success.
  virtual int resize_cq(const ClientInfo&, ObjId, droce_shm_ring_hdr* ring, uint32_t ring_entries) {
    (void)ring;
    (void)ring_entries;
    return -EOPNOTSUPP;
  }
  virtual int create_srq(const ClientInfo& c, const SrqSetup& s, SrqResult& out) = 0;
  virtual int modify_srq(const ClientInfo& c, ObjId srq, const ibv_srq_attr& a, uint32_t mask) = 0;
  virtual int query_srq(const ClientInfo& c, ObjId srq, ibv_srq_attr& out) = 0;
  virtual int destroy_srq(const ClientInfo& c, ObjId srq) = 0;
  virtual int create_qp(const ClientInfo& c, const QpSetup& s, QpResult& out) = 0;
  virtual int modify_qp(const ClientInfo& c, ObjId qp, const ibv_qp_attr& a, uint32_t mask) = 0;
  virtual int query_qp(const ClientInfo& c, ObjId qp, uint32_t mask, ibv_qp_attr& out) = 0;
  virtual int destroy_qp(const ClientInfo& c, ObjId qp) = 0;
  // UD address handles. A send WQE names its AH by AhResult::ah_num
  // (droce_shm_send_wqe.ah); the engine resolves it in its own table and
  // must check that the AH's PD is the QP's PD (so one client cannot use
  // another's AH by guessing numbers).
  //
  // Address resolution (ARP / ND) never blocks the caller: modify_qp with an
  // address vector and create_ah return -EINPROGRESS while the destination's
  // MAC is not known yet (the backend has asked for it), having changed
  // nothing. The server then parks that client's request, serves the other
  // clients, and calls again with the same arguments every
  // ShimServerConfig::resolve_retry_ms until the answer is something else or
  // resolve_timeout_ms passed (the client then gets -EHOSTUNREACH).
  virtual int create_ah(const ClientInfo& c, ObjId pd, const ibv_ah_attr& a, AhResult& out) = 0;
  virtual int destroy_ah(const ClientInfo& c, ObjId ah) = 0;
  // ibv_attach_mcast / ibv_detach_mcast of a UD QP (-EINVAL for another
  // type, a GID that is not multicast, or a detach of a group the QP is not
  // in; -ENOMEM when the group tables are full). destroy_qp leaves every group.
  virtual int attach_mcast(const ClientInfo&, ObjId, const ibv_gid&) { return -EOPNOTSUPP; }
  virtual int detach_mcast(const ClientInfo&, ObjId, const ibv_gid&) { return -EOPNOTSUPP; }

  // Asynchronous events. The backend records each event on its object and
  // writes 1 to the client's async_eventfd (given at create time) per event:
  // IBV_EVENT_QP_FATAL when a QP goes to ERR by itself (not by modify_qp),
  // IBV_EVENT_QP_LAST_WQE_REACHED when a QP on an SRQ goes to ERR (any way),
  // IBV_EVENT_CQ_ERR when a CQ overran (its QPs go to ERR),
  // IBV_EVENT_SRQ_LIMIT_REACHED when an SRQ armed with a limit holds fewer
  // WQEs than it (then disarmed). These take one recorded event of the object
  // (the lowest type first): true and its type, false when none.
  virtual bool take_qp_event(const ClientInfo&, ObjId, uint32_t&) { return false; }
  virtual bool take_cq_event(const ClientInfo&, ObjId, uint32_t&) { return false; }
  virtual bool take_srq_event(const ClientInfo&, ObjId, uint32_t&) { return false; }

  // Doorbells (droce_shm_abi.h, "doorbells"): the client's doorbell region,
  // mapped by the server (it stays mapped until after client_gone). A backend
  // that takes it gives each QP and SRQ the client creates from now on a bit
  // (db_bit in its rings, written before create_* returns) and may stop
  // polling a ring that is idle until its bit is set. -EOPNOTSUPP: no
  // doorbells (every ring keeps DROCE_SHM_DB_NONE and is always polled).
  virtual int open_doorbell(const ClientInfo&, droce_shm_doorbell*) { return -EOPNOTSUPP; }

  // Called once when a client connection ends, after its objects are gone.
  virtual void client_gone(const ClientInfo&) {}
};

}  // namespace droce::shim

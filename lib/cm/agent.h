// cm::Agent: the CM state machine of one port (README.md). Pure: MADs go out
// through Io, time comes in through tick(), events go out through the sink.
// One thread: the port's home core in droced, the application's poll loop
// when embedded. Control path (allocates; no per-data-packet work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "cm/cma.h"
#include "cm/mad.h"
#include "wire/headers.h"

namespace droce::cm {

using ConnId = uint32_t;  // the local communication ID (0: none)

struct Endpoint {
  wire::Gid ip{};     // IPv4 as ::ffff:a.b.c.d
  uint16_t port = 0;  // the RDMA CM port (host order)
};

enum class QpKind : uint8_t { Rc, Uc, Ud };

enum class EventType : uint8_t {
  ConnectRequest,   // passive: REQ (RC/UC) or SIDR_REQ (UD) for a listener; `id` is the new connection
  ConnectResponse,  // active RC/UC: REP received; move the QP to RTR/RTS (qp_params), then establish()
  Established,      // passive: RTU received; active UD: SIDR_REP OK (ud_qpn/ud_qkey)
  Rejected,         // REJ received (status = reason), SIDR_REP not OK (status = SIDR status)
  Unreachable,      // the REQ/REP/SIDR_REQ went unanswered through every retry
  Disconnected,     // DREQ received (DREP sent), or our DREQ answered or timed out
};
const char* event_name(EventType t) noexcept;

// rdma_conn_param's fields, as one side offers them.
struct ConnParam {
  uint8_t private_data[kRepPrivate]{};
  uint8_t private_data_len = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t flow_control = 1;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  bool srq = false;
  uint32_t qpn = 0;   // the program's QP
  uint32_t qkey = 0;  // UD
};

struct Event {
  EventType type = EventType::ConnectRequest;
  ConnId id = 0;
  ConnId listen_id = 0;  // ConnectRequest: the listener
  uint64_t user = 0;     // the connection's cookie (a passive one starts with its listener's)
  int status = 0;
  ConnParam param;       // what the peer sent (REQ/REP/REJ/DREQ private data, user part only)
  Endpoint local, remote;
  QpKind kind = QpKind::Rc;
  uint32_t ud_qpn = 0, ud_qkey = 0;  // SIDR_REQ's sender / SIDR_REP's answer
};

// What the program's QP needs for RTR / RTS (rdma_init_qp_attr).
struct QpParams {
  uint32_t dest_qpn = 0;
  uint32_t rq_psn = 0;  // the starting PSN of our REQ/REP (what we expect to receive, as Linux)
  uint32_t sq_psn = 0;  // the peer's REQ/REP starting PSN (it expects us to send from it)
  uint8_t path_mtu = 3;  // IB encoding (3 = 1024)
  uint8_t max_dest_rd_atomic = 0;
  uint8_t max_rd_atomic = 0;
  uint8_t min_rnr_timer = 12;
  uint8_t timeout = 14;  // local ACK timeout
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  wire::Gid sgid{}, dgid{};
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
  uint32_t flow_label = 0;
  uint32_t qkey = 0;  // UD
};

struct ConnectArgs {
  Endpoint local, remote;
  PortSpace ps = PortSpace::Tcp;
  QpKind kind = QpKind::Rc;
  ConnParam param;           // private_data: the program's part (<= 56 bytes RC/UC, <= 180 UD)
  uint8_t path_mtu = 3;      // IB encoding
  uint8_t traffic_class = 0;
  uint32_t timeout_ms = 0;   // UD SIDR: total time to wait; 0: from the CM response timeout
};

struct AgentConfig {
  uint64_t ca_guid = 0;               // our node GUID (host value)
  uint8_t cm_response_timeout = 20;   // what we ask peers for (4.096 us * 2^n), as Linux
  uint8_t max_cm_retries = 15;
  uint8_t max_path_mtu = 5;           // IB encoding: a REQ's larger path MTU is lowered to it
  uint8_t local_ack_timeout = 14;     // the QPs' ACK timeout offered in REQ
  uint32_t max_conns = 4096;
  uint64_t max_retry_wait_ns = 4'000'000'000;  // cap on one MAD retransmission wait
  uint64_t timewait_ns = 1'000'000'000;        // TimeWait length (cap)
  uint64_t mra_after_ns = 0;          // passive: send MRA when the program has not answered (0: half the peer's timeout)
  uint64_t seed = 0;                  // comm IDs and PSNs (0: getrandom)
};

// Counters: one per MAD kind received and sent, retries, rejections, drops.
enum class CmCtr : uint16_t {
  RxMads, RxBad, RxReq, RxMra, RxRej, RxRep, RxRtu, RxDreq, RxDrep, RxSidrReq, RxSidrRep, RxUnknownConn, RxDup,
  TxReq, TxMra, TxRej, TxRep, TxRtu, TxDreq, TxDrep, TxSidrReq, TxSidrRep, TxFail,
  Retries, Timeouts, RejNoListener, RejStale, Established, Disconnected,
  kCount
};
const char* ctr_name(CmCtr c) noexcept;

enum class ConnState : uint8_t {
  Listen, Idle, ReqSent, MraRcvd, ReqRcvd, MraSent, RepSent, RepRcvd, Established, DreqSent, DreqRcvd, TimeWait,
  SidrReqSent, SidrReqRcvd, Closed
};
const char* state_name(ConnState s) noexcept;

struct ConnInfo {  // droce-ctl's view
  ConnId id = 0;
  uint32_t remote_comm_id = 0;
  ConnState state = ConnState::Idle;
  QpKind kind = QpKind::Rc;
  uint64_t service_id = 0;
  Endpoint local, remote;
  uint32_t local_qpn = 0, remote_qpn = 0;
  uint32_t retries = 0;
  bool passive = false;
};

class Agent {
 public:
  struct Io {
    virtual ~Io() = default;
    // One 256-byte MAD to the peer's QP1 at `remote` from our address `local`.
    // False when it cannot go now (e.g. the peer's MAC is still being
    // resolved): the retry timer sends it again.
    virtual bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t traffic_class,
                          std::span<const uint8_t> mad) = 0;
    // Is ip one of this port's addresses?
    virtual bool is_local(const wire::Gid& ip) const = 0;
  };
  using EventSink = std::function<void(const Event&)>;

  Agent(const AgentConfig& cfg, Io& io, EventSink sink);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Every call returns 0 or an errno and may emit events (synchronously).
  // Listens on (ps, bound.port) at bound.ip (all zero: every local address).
  // EADDRINUSE: another listener has that port and address.
  int listen(PortSpace ps, const Endpoint& bound, QpKind kind, uint64_t user, ConnId* out);
  // Active side: REQ (RC/UC) or SIDR_REQ (UD).
  int connect(const ConnectArgs& a, uint64_t user, ConnId* out);
  // Passive side: REP (RC/UC: param.qpn, responder resources/initiator depth
  // as the program offers; the REQ's values cap them) or SIDR_REP OK (UD).
  int accept(ConnId id, const ConnParam& param);
  // Passive: REJ consumer-defined with private data (or SIDR_REP reject).
  int reject(ConnId id, std::span<const uint8_t> private_data);
  // Active RC/UC after ConnectResponse (QP in RTS): RTU. No event: the caller
  // reports ESTABLISHED itself (as librdmacm turns CONNECT_RESPONSE into it).
  int establish(ConnId id);
  // DREQ (established), or DREP when the peer's DREQ came first.
  int disconnect(ConnId id);
  // Forgets a connection or listener now: an established one sends DREQ, one
  // being set up sends REJ; no more events for it.
  void destroy(ConnId id);
  // The RTR/RTS attributes once REQ/REP negotiated them. ENOENT, EINVAL (not yet).
  int qp_params(ConnId id, QpParams& out) const;
  // The cookie events carry (a passive connection starts with its listener's).
  int set_user(ConnId id, uint64_t user);

  // A MAD received on QP1: src/dst addresses from the GRH, the sender's QPN.
  void on_mad(const wire::Gid& src, const wire::Gid& dst, uint32_t src_qpn, std::span<const uint8_t> mad);
  // Timers: retransmissions, MRA, TimeWait. Call every millisecond or so.
  void tick(uint64_t now_ns);

  uint64_t counter(CmCtr c) const noexcept { return ctr_[static_cast<size_t>(c)]; }
  std::vector<ConnInfo> connections() const;

  struct Conn;  // agent.cc

 private:
  AgentConfig cfg_;
  Io& io_;
  EventSink sink_;
  uint64_t now_ = 0;
  uint64_t rng_ = 0;
  std::map<ConnId, std::unique_ptr<Conn>> conns_;
  uint64_t ctr_[static_cast<size_t>(CmCtr::kCount)]{};
  friend struct AgentOps;
};

}  // namespace droce::cm

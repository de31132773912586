// cm::Agent: the CM state machine of one port. See agent.h and README.md.
#include "cm/agent.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace droce::cm {

namespace {

constexpr const char* kCtrNames[] = {
    "rx_mads",  "rx_bad",     "rx_req",      "rx_mra",      "rx_rej",      "rx_rep",      "rx_rtu",
    "rx_dreq",  "rx_drep",    "rx_sidr_req", "rx_sidr_rep", "rx_unknown_conn", "rx_dup",
    "tx_req",   "tx_mra",     "tx_rej",      "tx_rep",      "tx_rtu",      "tx_dreq",     "tx_drep",
    "tx_sidr_req", "tx_sidr_rep", "tx_fail",
    "retries",  "timeouts",   "rej_no_listener", "rej_stale", "established", "disconnected",
};
static_assert(sizeof(kCtrNames) / sizeof(kCtrNames[0]) == static_cast<size_t>(CmCtr::kCount));

constexpr const char* kStateNames[] = {"listen",   "idle",     "req_sent",    "mra_rcvd",    "req_rcvd",
                                       "mra_sent", "rep_sent", "rep_rcvd",    "established", "dreq_sent",
                                       "dreq_rcvd", "timewait", "sidr_req_sent", "sidr_req_rcvd", "closed"};
static_assert(sizeof(kStateNames) / sizeof(kStateNames[0]) == static_cast<size_t>(ConnState::Closed) + 1);

// 4.096 us * 2^t (IBTA's timeout encoding), in ns.
uint64_t timeout_ns(uint8_t t) noexcept {
  return uint64_t{4096} << std::min<uint8_t>(t, 31);
}

// A MAD that could not go out (MAC unknown) is tried again at every tick for this long.
constexpr uint64_t kSendRetryMaxNs = 3'000'000'000;

bool gid_zero(const wire::Gid& g) noexcept {
  for (uint8_t b : g)
    if (b) return false;
  return true;
}

}  // namespace

const char* ctr_name(CmCtr c) noexcept {
  const auto i = static_cast<size_t>(c);
  return i < static_cast<size_t>(CmCtr::kCount) ? kCtrNames[i] : "?";
}
const char* state_name(ConnState s) noexcept {
  const auto i = static_cast<size_t>(s);
  return i <= static_cast<size_t>(ConnState::Closed) ? kStateNames[i] : "?";
}
const char* event_name(EventType t) noexcept {
  switch (t) {
    case EventType::ConnectRequest: return "connect_request";
    case EventType::ConnectResponse: return "connect_response";
    case EventType::Established: return "established";
    case EventType::Rejected: return "rejected";
    case EventType::Unreachable: return "unreachable";
    case EventType::Disconnected: return "disconnected";
  }
  return "?";
}

struct Agent::Conn {
  ConnId id = 0;
  ConnState state = ConnState::Idle;
  bool passive = false;
  bool orphan = false;  // destroyed by its owner: no events, erased when the protocol is done
  QpKind kind = QpKind::Rc;
  PortSpace ps = PortSpace::Tcp;
  uint64_t service_id = 0;
  uint64_t user = 0;
  ConnId listen_id = 0;
  Endpoint local, remote;

  // The peer.
  uint32_t remote_id = 0;
  uint64_t remote_guid = 0;
  uint32_t remote_qpn = 0;
  uint32_t remote_psn = 0;
  // Ours.
  uint32_t local_qpn = 0;
  uint32_t local_psn = 0;
  uint64_t tid = 0;
  // Negotiated QP attributes.
  uint8_t path_mtu = 3;
  uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0;
  uint8_t retry_cnt = 7, rnr_retry = 7, ack_timeout = 14;
  uint8_t traffic_class = 0, hop_limit = 64;
  uint32_t flow_label = 0;
  uint32_t qkey = 0;
  uint8_t peer_cm_timeout = 20;  // how long the peer may take to answer what we send (IBTA encoding)
  uint8_t our_cm_timeout = 20;   // how long the peer waits for our answer (the MRA point)

  // The MAD we wait an answer for (resent on timeout) or answer duplicates with.
  uint8_t mad[kMadSize]{};
  bool have_mad = false;
  bool waiting = false;        // `mad` is resent until answered
  bool unsent = false;         // the last send of `mad` failed (no MAC yet)
  uint64_t unsent_since = 0;
  uint64_t deadline = 0;       // next resend / timeout / timewait end
  uint64_t wait_ns = 0;
  uint32_t retries_left = 0;
  uint32_t retries = 0;
  uint64_t mra_at = 0;         // passive: when to send MRA (0: not pending)
  // Listener.
  uint32_t backlog = 0;
};

// The state machine's steps, as friends of Agent (one place for the private parts).
struct AgentOps {
  using Conn = Agent::Conn;

  static void emit(Agent& a, Conn& c, Event& ev) {
    if (c.orphan) return;
    ev.id = c.id;
    ev.user = c.user;
    ev.local = c.local;
    ev.remote = c.remote;
    ev.kind = c.kind;
    if (a.sink_) a.sink_(ev);
  }

  static uint32_t rnd32(Agent& a) noexcept {
    a.rng_ ^= a.rng_ << 13;
    a.rng_ ^= a.rng_ >> 7;
    a.rng_ ^= a.rng_ << 17;
    return static_cast<uint32_t>(a.rng_ >> 11);
  }

  static Conn* find(Agent& a, ConnId id) {
    auto it = a.conns_.find(id);
    return it == a.conns_.end() ? nullptr : it->second.get();
  }

  static Conn* new_conn(Agent& a) {
    if (a.conns_.size() >= a.cfg_.max_conns) return nullptr;
    for (int k = 0; k < 64; ++k) {
      const ConnId id = rnd32(a);
      if (id == 0 || a.conns_.count(id)) continue;
      auto c = std::make_unique<Conn>();
      c->id = id;
      c->local_psn = rnd32(a) & 0xffffff;
      Conn* p = c.get();
      a.conns_.emplace(id, std::move(c));
      return p;
    }
    return nullptr;
  }

  static void count(Agent& a, CmCtr c) noexcept { ++a.ctr_[static_cast<size_t>(c)]; }

  // Decodes a received message of kind M and counts it (rx), or counts it bad.
  template <typename M>
  static bool take(Agent& a, std::span<const uint8_t> mad, M& m, CmCtr rx) {
    if (decode(mad, m) != MadError::None) {
      count(a, CmCtr::RxBad);
      return false;
    }
    count(a, rx);
    return true;
  }

  // An event with nothing but its type (the rest comes from the connection).
  static void emit(Agent& a, Conn& c, EventType t) {
    Event ev;
    ev.type = t;
    emit(a, c, ev);
  }

  // Sends c.mad (already encoded). `wait`: resend it until answered, with
  // the peer's CM response timeout and our max retries.
  static void send_conn_mad(Agent& a, Conn& c, CmCtr what, bool wait) {
    c.have_mad = true;
    c.waiting = wait;
    if (wait) {
      c.wait_ns = std::min(timeout_ns(c.peer_cm_timeout), a.cfg_.max_retry_wait_ns);
      c.retries_left = a.cfg_.max_cm_retries;
      c.deadline = a.now_ + c.wait_ns;
    }
    transmit(a, c);
    count(a, what);
  }

  static void transmit(Agent& a, Conn& c) {
    const bool ok = a.io_.send_mad(c.local.ip, c.remote.ip, c.traffic_class, std::span<const uint8_t>(c.mad, kMadSize));
    if (ok) {
      c.unsent = false;
    } else if (!c.unsent) {  // counted once per MAD, however often it is tried again
      c.unsent_since = a.now_;
      c.unsent = true;
      count(a, CmCtr::TxFail);
    }
  }

  // A MAD that belongs to no connection state (REJ for an unknown REQ, DREP
  // for an unknown DREQ): sent once.
  static void send_once(Agent& a, const wire::Gid& local, const wire::Gid& remote, const uint8_t* mad, CmCtr what) {
    if (!a.io_.send_mad(local, remote, 0, std::span<const uint8_t>(mad, kMadSize))) count(a, CmCtr::TxFail);
    count(a, what);
  }

  static void stop_waiting(Conn& c) noexcept {
    c.waiting = false;
    c.unsent = false;
  }

  static void enter_timewait(Agent& a, Conn& c) {
    stop_waiting(c);
    c.state = ConnState::TimeWait;
    const uint64_t qp_life = timeout_ns(c.ack_timeout) * (uint64_t{c.retry_cnt} + 1);
    c.deadline = a.now_ + std::min(qp_life, a.cfg_.timewait_ns);
  }

  static void encode_rej(Agent& a, Conn& c, RejReason reason, uint8_t msg_rejected, std::span<const uint8_t> pdata) {
    Rej r;
    r.local_comm_id = c.id;
    r.remote_comm_id = c.remote_id;
    r.message_rejected = msg_rejected;
    r.reason = static_cast<uint16_t>(reason);
    if (!pdata.empty()) std::memcpy(r.private_data, pdata.data(), std::min(pdata.size(), sizeof r.private_data));
    encode(std::span<uint8_t>(c.mad, kMadSize), c.tid, r);
    (void)a;
  }

  static void send_rej(Agent& a, Conn& c, RejReason reason, uint8_t msg_rejected, std::span<const uint8_t> pdata = {}) {
    encode_rej(a, c, reason, msg_rejected, pdata);
    send_conn_mad(a, c, CmCtr::TxRej, false);
  }

  static void send_dreq(Agent& a, Conn& c) {
    Dreq d;
    d.local_comm_id = c.id;
    d.remote_comm_id = c.remote_id;
    d.remote_qpn = c.remote_qpn;
    c.tid = (uint64_t{rnd32(a)} << 32) | c.id;
    encode(std::span<uint8_t>(c.mad, kMadSize), c.tid, d);
    c.state = ConnState::DreqSent;
    send_conn_mad(a, c, CmCtr::TxDreq, true);
  }

  static void send_drep(Agent& a, Conn& c, uint64_t tid) {
    Drep d;
    d.local_comm_id = c.id;
    d.remote_comm_id = c.remote_id;
    encode(std::span<uint8_t>(c.mad, kMadSize), tid, d);
    send_conn_mad(a, c, CmCtr::TxDrep, false);
  }

  static void erase(Agent& a, ConnId id) { a.conns_.erase(id); }

  // ---- received MADs ----

  static Conn* find_listener(Agent& a, uint64_t sid, const wire::Gid& dst) {
    Conn* wild = nullptr;
    for (auto& [id, c] : a.conns_) {
      if (c->state != ConnState::Listen || c->service_id != sid) continue;
      if (c->local.ip == dst) return c.get();
      if (gid_zero(c->local.ip)) wild = c.get();
    }
    return wild;
  }

  // The listener a REQ / SIDR_REQ is for: its CMA header (h) parses, its
  // service ID is an RDMA CM one (ps, port) and a listener has it at dst.
  template <size_t N>
  static Conn* match_listener(Agent& a, uint64_t sid, const uint8_t (&pdata)[N], const wire::Gid& dst, CmaHdr& h,
                              PortSpace& ps, uint16_t& port) {
    if (!decode_cma_hdr(std::span<const uint8_t>(pdata, N), h) || !parse_service_id(sid, ps, port)) return nullptr;
    return find_listener(a, sid, dst);
  }

  // The passive connection a REQ / SIDR_REQ repeats, if any.
  static Conn* find_by_remote(Agent& a, uint32_t remote_id, uint64_t guid, const wire::Gid& src) {
    for (auto& [id, c] : a.conns_)
      if (c->passive && c->remote_id == remote_id && c->remote_guid == guid && c->remote.ip == src &&
          c->state != ConnState::Listen)
        return c.get();
    return nullptr;
  }

  static void on_req(Agent& a, const wire::Gid& src, const wire::Gid& dst, std::span<const uint8_t> mad,
                     uint64_t tid) {
    Req r;
    if (!take(a, mad, r, CmCtr::RxReq)) return;
    if (Conn* d = find_by_remote(a, r.local_comm_id, r.local_ca_guid, src)) {
      count(a, CmCtr::RxDup);
      // A repeated REQ: answer with what we sent last (MRA or REP); a REQ for
      // a connection we hold established with another comm ID is stale.
      if ((d->state == ConnState::MraSent || d->state == ConnState::RepSent) && d->have_mad) transmit(a, *d);
      return;
    }
    // A REQ from a QP we are connected to already under another comm ID: stale.
    for (auto& [id, c] : a.conns_)
      if (c->state == ConnState::Established && c->remote.ip == src && c->remote_qpn == r.local_qpn &&
          c->remote_guid == r.local_ca_guid) {
        count(a, CmCtr::RejStale);
        reject_unknown_req(a, src, dst, r.local_comm_id, tid, RejReason::StaleConn);
        return;
      }
    CmaHdr h;
    PortSpace ps;
    uint16_t port = 0;
    Conn* l = match_listener(a, r.service_id, r.private_data, dst, h, ps, port);
    if (!l || r.transport == CmTransport::Rd || r.transport == CmTransport::Ext ||
        (l->kind == QpKind::Rc) != (r.transport == CmTransport::Rc)) {
      count(a, CmCtr::RejNoListener);
      reject_unknown_req(a, src, dst, r.local_comm_id, tid,
                         l ? RejReason::InvalidTransportType : RejReason::InvalidServiceId);
      return;
    }
    Conn* c = new_conn(a);
    if (!c) {
      reject_unknown_req(a, src, dst, r.local_comm_id, tid, RejReason::NoResources);
      return;
    }
    c->passive = true;
    c->state = ConnState::ReqRcvd;
    c->kind = l->kind;
    c->ps = ps;
    c->service_id = r.service_id;
    c->user = l->user;
    c->listen_id = l->id;
    c->local = {dst, port};
    c->remote = {src, h.src_port};
    c->remote_id = r.local_comm_id;
    c->remote_guid = r.local_ca_guid;
    c->remote_qpn = r.local_qpn;
    c->remote_psn = r.starting_psn;
    c->tid = tid;
    c->path_mtu = std::min<uint8_t>(r.path_mtu ? r.path_mtu : 3, a.cfg_.max_path_mtu);
    // Swapped: what the peer reads at most is what we answer at most.
    c->max_dest_rd_atomic = r.initiator_depth;
    c->max_rd_atomic = r.responder_resources;
    c->retry_cnt = r.retry_count;
    c->rnr_retry = r.rnr_retry_count;
    c->ack_timeout = r.primary.local_ack_timeout ? r.primary.local_ack_timeout : a.cfg_.local_ack_timeout;
    c->traffic_class = r.primary.traffic_class;
    c->hop_limit = r.primary.hop_limit > 1 ? r.primary.hop_limit : 64;
    c->flow_label = r.primary.flow_label;
    c->peer_cm_timeout = r.local_cm_response_timeout;  // the peer answers our REP within this
    c->our_cm_timeout = r.remote_cm_response_timeout;  // the peer waits this long for our REP
    const uint64_t half = timeout_ns(c->our_cm_timeout) / 2;
    c->mra_at = a.now_ + (a.cfg_.mra_after_ns ? a.cfg_.mra_after_ns : half);

    Event ev;
    ev.type = EventType::ConnectRequest;
    ev.listen_id = l->id;
    ev.param.private_data_len = static_cast<uint8_t>(kReqPrivate - kCmaHdrSize);
    std::memcpy(ev.param.private_data, r.private_data + kCmaHdrSize, kReqPrivate - kCmaHdrSize);
    ev.param.responder_resources = r.initiator_depth;
    ev.param.initiator_depth = r.responder_resources;
    ev.param.flow_control = r.end_to_end_flow_control;
    ev.param.retry_count = r.retry_count;
    ev.param.rnr_retry_count = r.rnr_retry_count;
    ev.param.srq = r.srq;
    ev.param.qpn = r.local_qpn;
    emit(a, *c, ev);
  }

  static void reject_unknown_req(Agent& a, const wire::Gid& src, const wire::Gid& dst, uint32_t remote_id,
                                 uint64_t tid, RejReason reason) {
    Rej r;
    r.local_comm_id = 0;
    r.remote_comm_id = remote_id;
    r.message_rejected = 0;
    r.reason = static_cast<uint16_t>(reason);
    uint8_t mad[kMadSize];
    encode(std::span<uint8_t>(mad, kMadSize), tid, r);
    send_once(a, dst, src, mad, CmCtr::TxRej);
  }

  static void on_mra(Agent& a, std::span<const uint8_t> mad) {
    Mra m;
    if (!take(a, mad, m, CmCtr::RxMra)) return;
    Conn* c = find(a, m.remote_comm_id);
    if (!c) return count(a, CmCtr::RxUnknownConn);
    const bool for_req = m.message_mraed == 0 && (c->state == ConnState::ReqSent || c->state == ConnState::MraRcvd);
    const bool for_rep = m.message_mraed == 1 && c->state == ConnState::RepSent;
    if (!for_req && !for_rep) return count(a, CmCtr::RxDup);
    if (for_req) c->state = ConnState::MraRcvd;
    if (c->remote_id == 0) c->remote_id = m.local_comm_id;
    // The peer needs up to its service timeout more: wait that long, with our retries renewed.
    c->wait_ns = std::min(timeout_ns(m.service_timeout) + timeout_ns(c->peer_cm_timeout), a.cfg_.max_retry_wait_ns * 4);
    c->deadline = a.now_ + c->wait_ns;
    c->retries_left = a.cfg_.max_cm_retries;
  }

  static void on_rej(Agent& a, const wire::Gid& src, std::span<const uint8_t> mad) {
    Rej r;
    if (!take(a, mad, r, CmCtr::RxRej)) return;
    Conn* c = find(a, r.remote_comm_id);
    // A REJ of a REQ from a side that never learnt our comm ID (its REQ was
    // refused before a REP: the active side gave up) names the REQ's ID only.
    if (!c && r.message_rejected == 0)
      for (auto& [id, x] : a.conns_)
        if (x->passive && x->remote_id == r.local_comm_id && x->remote.ip == src) c = x.get();
    if (!c || (c->remote_id && r.local_comm_id && c->remote_id != r.local_comm_id)) return count(a, CmCtr::RxUnknownConn);
    switch (c->state) {
      case ConnState::ReqSent:
      case ConnState::MraRcvd:
      case ConnState::RepRcvd:
      case ConnState::RepSent:
      case ConnState::MraSent:
      case ConnState::ReqRcvd:
        break;
      default:
        return count(a, CmCtr::RxDup);
    }
    stop_waiting(*c);
    c->state = ConnState::Closed;
    Event ev;
    ev.type = EventType::Rejected;
    ev.status = r.reason;
    std::memcpy(ev.param.private_data, r.private_data, kRejPrivate);
    ev.param.private_data_len = static_cast<uint8_t>(kRejPrivate);
    const ConnId id = c->id;
    const bool orphan = c->orphan;
    emit(a, *c, ev);
    if (orphan) erase(a, id);
  }

  static void on_rep(Agent& a, std::span<const uint8_t> mad) {
    Rep r;
    if (!take(a, mad, r, CmCtr::RxRep)) return;
    Conn* c = find(a, r.remote_comm_id);
    if (!c || c->passive) return count(a, CmCtr::RxUnknownConn);
    if (c->state == ConnState::Established && c->remote_id == r.local_comm_id) {
      // Our RTU was lost: send it again.
      count(a, CmCtr::RxDup);
      if (c->have_mad) {
        transmit(a, *c);
        count(a, CmCtr::TxRtu);
      }
      return;
    }
    if (c->state != ConnState::ReqSent && c->state != ConnState::MraRcvd) return count(a, CmCtr::RxDup);
    stop_waiting(*c);
    c->state = ConnState::RepRcvd;
    c->remote_id = r.local_comm_id;
    c->remote_guid = r.local_ca_guid;
    c->remote_qpn = r.local_qpn;
    c->remote_psn = r.starting_psn;
    c->max_rd_atomic = r.responder_resources;
    c->max_dest_rd_atomic = r.initiator_depth;
    c->rnr_retry = r.rnr_retry_count;
    Event ev;
    ev.type = EventType::ConnectResponse;
    std::memcpy(ev.param.private_data, r.private_data, kRepPrivate);
    ev.param.private_data_len = static_cast<uint8_t>(kRepPrivate);
    ev.param.responder_resources = r.initiator_depth;
    ev.param.initiator_depth = r.responder_resources;
    ev.param.flow_control = r.end_to_end_flow_control;
    ev.param.rnr_retry_count = r.rnr_retry_count;
    ev.param.srq = r.srq;
    ev.param.qpn = r.local_qpn;
    const ConnId id = c->id;
    if (c->orphan) {  // destroyed meanwhile: refuse the REP
      send_rej(a, *c, RejReason::ConsumerDefined, 1);
      erase(a, id);
      return;
    }
    emit(a, *c, ev);
  }

  static void on_rtu(Agent& a, std::span<const uint8_t> mad) {
    Rtu r;
    if (!take(a, mad, r, CmCtr::RxRtu)) return;
    Conn* c = find(a, r.remote_comm_id);
    if (!c || !c->passive || c->remote_id != r.local_comm_id) return count(a, CmCtr::RxUnknownConn);
    if (c->state != ConnState::RepSent) return count(a, CmCtr::RxDup);
    stop_waiting(*c);
    c->state = ConnState::Established;
    count(a, CmCtr::Established);
    emit(a, *c, EventType::Established);
  }

  static void on_dreq(Agent& a, const wire::Gid& src, const wire::Gid& dst, std::span<const uint8_t> mad,
                      uint64_t tid) {
    Dreq d;
    if (!take(a, mad, d, CmCtr::RxDreq)) return;
    Conn* c = find(a, d.remote_comm_id);
    if (!c || c->remote_id != d.local_comm_id) {
      // No such connection (any more): answer DREP so that the peer stops asking.
      count(a, CmCtr::RxUnknownConn);
      Drep r;
      r.local_comm_id = d.remote_comm_id;
      r.remote_comm_id = d.local_comm_id;
      uint8_t out[kMadSize];
      encode(std::span<uint8_t>(out, kMadSize), tid, r);
      send_once(a, dst, src, out, CmCtr::TxDrep);
      return;
    }
    switch (c->state) {
      case ConnState::Established:
      case ConnState::RepSent:  // the RTU was lost; the peer is done already
      case ConnState::RepRcvd:
      case ConnState::DreqSent:  // both sides disconnect at once
        send_drep(a, *c, tid);
        enter_timewait(a, *c);
        count(a, CmCtr::Disconnected);
        emit(a, *c, EventType::Disconnected);
        break;
      case ConnState::TimeWait:
      case ConnState::Closed:
        // A repeated DREQ: our DREP was lost.
        count(a, CmCtr::RxDup);
        send_drep(a, *c, tid);
        break;
      default:
        count(a, CmCtr::RxDup);
    }
  }

  static void on_drep(Agent& a, std::span<const uint8_t> mad) {
    Drep d;
    if (!take(a, mad, d, CmCtr::RxDrep)) return;
    Conn* c = find(a, d.remote_comm_id);
    if (!c || c->remote_id != d.local_comm_id) return count(a, CmCtr::RxUnknownConn);
    if (c->state != ConnState::DreqSent) return count(a, CmCtr::RxDup);
    enter_timewait(a, *c);
    count(a, CmCtr::Disconnected);
    emit(a, *c, EventType::Disconnected);
  }

  static void on_sidr_req(Agent& a, const wire::Gid& src, const wire::Gid& dst, std::span<const uint8_t> mad,
                          uint64_t tid) {
    SidrReq r;
    if (!take(a, mad, r, CmCtr::RxSidrReq)) return;
    for (auto& [id, c] : a.conns_)
      if (c->passive && c->kind == QpKind::Ud && c->remote_id == r.request_id && c->remote.ip == src &&
          (c->state == ConnState::SidrReqRcvd || c->state == ConnState::TimeWait)) {
        count(a, CmCtr::RxDup);
        if (c->state == ConnState::TimeWait && c->have_mad) transmit(a, *c);  // our SIDR_REP was lost
        return;
      }
    CmaHdr h;
    PortSpace ps;
    uint16_t port = 0;
    Conn* l = match_listener(a, r.service_id, r.private_data, dst, h, ps, port);
    if (!l || l->kind != QpKind::Ud) {
      count(a, CmCtr::RejNoListener);
      SidrRep rep;
      rep.request_id = r.request_id;
      rep.status = static_cast<uint8_t>(SidrStatus::Unsupported);
      rep.service_id = r.service_id;
      uint8_t out[kMadSize];
      encode(std::span<uint8_t>(out, kMadSize), tid, rep);
      send_once(a, dst, src, out, CmCtr::TxSidrRep);
      return;
    }
    Conn* c = new_conn(a);
    if (!c) return;
    c->passive = true;
    c->state = ConnState::SidrReqRcvd;
    c->kind = QpKind::Ud;
    c->ps = ps;
    c->service_id = r.service_id;
    c->user = l->user;
    c->listen_id = l->id;
    c->local = {dst, port};
    c->remote = {src, h.src_port};
    c->remote_id = r.request_id;
    c->tid = tid;
    Event ev;
    ev.type = EventType::ConnectRequest;
    ev.listen_id = l->id;
    ev.param.private_data_len = static_cast<uint8_t>(std::min(kRepPrivate, kSidrReqPrivate - kCmaHdrSize));
    std::memcpy(ev.param.private_data, r.private_data + kCmaHdrSize, ev.param.private_data_len);
    emit(a, *c, ev);
  }

  static void on_sidr_rep(Agent& a, std::span<const uint8_t> mad) {
    SidrRep r;
    if (!take(a, mad, r, CmCtr::RxSidrRep)) return;
    Conn* c = find(a, r.request_id);
    if (!c || c->passive) return count(a, CmCtr::RxUnknownConn);
    if (c->state != ConnState::SidrReqSent) return count(a, CmCtr::RxDup);
    stop_waiting(*c);
    c->state = ConnState::Closed;
    Event ev;
    if (r.status == static_cast<uint8_t>(SidrStatus::Ok)) {
      ev.type = EventType::Established;
      ev.ud_qpn = r.qpn;
      ev.ud_qkey = r.qkey;
      c->remote_qpn = r.qpn;
      c->qkey = r.qkey;
      count(a, CmCtr::Established);
    } else {
      ev.type = EventType::Rejected;
      ev.status = r.status;
    }
    std::memcpy(ev.param.private_data, r.private_data, std::min(kRepPrivate, kSidrRepPrivate));
    ev.param.private_data_len = static_cast<uint8_t>(std::min(kRepPrivate, kSidrRepPrivate));
    const ConnId id = c->id;
    const bool orphan = c->orphan;
    emit(a, *c, ev);
    if (orphan) erase(a, id);
  }

  // ---- timers ----
  static void on_timeout(Agent& a, Conn& c) {
    count(a, CmCtr::Timeouts);
    const ConnId id = c.id;
    switch (c.state) {
      case ConnState::ReqSent:
      case ConnState::MraRcvd:
      case ConnState::RepSent:
      case ConnState::MraSent:
      case ConnState::SidrReqSent: {
        if (c.state == ConnState::SidrReqSent)
          stop_waiting(c);  // SIDR has no REJ
        else
          send_rej(a, c, RejReason::Timeout, c.passive ? 1 : 0);
        c.state = ConnState::Closed;
        Event ev;
        ev.type = EventType::Unreachable;
        ev.status = -ETIMEDOUT;
        const bool orphan = c.orphan;
        emit(a, c, ev);
        if (orphan) erase(a, id);
        break;
      }
      case ConnState::DreqSent: {
        enter_timewait(a, c);
        count(a, CmCtr::Disconnected);
        emit(a, c, EventType::Disconnected);
        break;
      }
      default:
        stop_waiting(c);
    }
  }
};

Agent::Agent(const AgentConfig& cfg, Io& io, EventSink sink) : cfg_(cfg), io_(io), sink_(std::move(sink)) {
  rng_ = cfg_.seed;
  if (rng_ == 0 && getrandom(&rng_, sizeof rng_, 0) != static_cast<ssize_t>(sizeof rng_)) rng_ = 0x9e3779b97f4a7c15ull;
  if (rng_ == 0) rng_ = 1;
}

Agent::~Agent() = default;

int Agent::listen(PortSpace ps, const Endpoint& bound, QpKind kind, uint64_t user, ConnId* out) {
  if (!out) return EINVAL;
  const uint64_t sid = service_id(ps, bound.port);
  for (auto& [id, c] : conns_)
    if (c->state == ConnState::Listen && c->service_id == sid &&
        (c->local.ip == bound.ip || gid_zero(c->local.ip) || gid_zero(bound.ip)))
      return EADDRINUSE;
  Conn* c = AgentOps::new_conn(*this);
  if (!c) return ENOMEM;
  c->state = ConnState::Listen;
  c->ps = ps;
  c->kind = kind;
  c->service_id = sid;
  c->local = bound;
  c->user = user;
  *out = c->id;
  return 0;
}

int Agent::connect(const ConnectArgs& args, uint64_t user, ConnId* out) {
  if (!out) return EINVAL;
  const size_t user_max = args.kind == QpKind::Ud ? kSidrReqUserPrivate : kReqUserPrivate;
  if (args.param.private_data_len > user_max) return EINVAL;
  if (gid_zero(args.remote.ip) || gid_zero(args.local.ip)) return EINVAL;
  Conn* c = AgentOps::new_conn(*this);
  if (!c) return ENOMEM;
  c->state = args.kind == QpKind::Ud ? ConnState::SidrReqSent : ConnState::ReqSent;
  c->kind = args.kind;
  c->ps = args.ps;
  c->service_id = service_id(args.ps, args.remote.port);
  c->user = user;
  c->local = args.local;
  c->remote = args.remote;
  c->local_qpn = args.param.qpn & 0xffffff;
  c->path_mtu = std::min(args.path_mtu, cfg_.max_path_mtu);
  c->traffic_class = args.traffic_class;
  c->peer_cm_timeout = cfg_.cm_response_timeout;
  c->ack_timeout = cfg_.local_ack_timeout;
  c->retry_cnt = args.param.retry_count & 7;
  c->rnr_retry = args.param.rnr_retry_count & 7;
  c->tid = (uint64_t{AgentOps::rnd32(*this)} << 32) | c->id;

  CmaHdr h;
  h.ip_version = wire::gid_is_ipv4_mapped(args.local.ip) ? 4 : 6;
  h.src_port = args.local.port;
  h.src = args.local.ip;
  h.dst = args.remote.ip;
  if (args.kind == QpKind::Ud) {
    SidrReq r;
    r.request_id = c->id;
    r.service_id = c->service_id;
    encode_cma_hdr(std::span<uint8_t>(r.private_data, sizeof r.private_data), h);
    std::memcpy(r.private_data + kCmaHdrSize, args.param.private_data, args.param.private_data_len);
    encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, r);
    AgentOps::send_conn_mad(*this, *c, CmCtr::TxSidrReq, true);
    if (args.timeout_ms) {  // the program's total wait, spread over our retries
      c->wait_ns = std::max<uint64_t>(uint64_t{args.timeout_ms} * 1'000'000 / (cfg_.max_cm_retries + 1u), 1'000'000);
      c->deadline = now_ + c->wait_ns;
    }
  } else {
    Req r;
    r.local_comm_id = c->id;
    r.service_id = c->service_id;
    r.local_ca_guid = cfg_.ca_guid;
    r.local_qpn = c->local_qpn;
    r.responder_resources = args.param.responder_resources;
    r.initiator_depth = args.param.initiator_depth;
    r.remote_cm_response_timeout = cfg_.cm_response_timeout;
    r.transport = args.kind == QpKind::Rc ? CmTransport::Rc : CmTransport::Uc;
    r.end_to_end_flow_control = args.param.flow_control != 0;
    r.starting_psn = c->local_psn;
    r.local_cm_response_timeout = cfg_.cm_response_timeout;
    r.retry_count = c->retry_cnt;
    r.path_mtu = c->path_mtu;
    r.rnr_retry_count = c->rnr_retry;
    r.max_cm_retries = cfg_.max_cm_retries & 0xf;
    r.srq = args.param.srq;
    r.primary.local_gid = args.local.ip;
    r.primary.remote_gid = args.remote.ip;
    r.primary.traffic_class = args.traffic_class;
    r.primary.hop_limit = c->hop_limit;
    r.primary.packet_rate = 0;  // as Linux over RoCE
    // As Linux (cma_get_roce_udp_flow_label): entropy from the two CM ports.
    r.primary.flow_label = (uint32_t{args.local.port} * 31 + args.remote.port) & 0xfffff;
    c->flow_label = r.primary.flow_label;
    r.primary.local_ack_timeout = cfg_.local_ack_timeout;
    encode_cma_hdr(std::span<uint8_t>(r.private_data, sizeof r.private_data), h);
    std::memcpy(r.private_data + kCmaHdrSize, args.param.private_data, args.param.private_data_len);
    // What our QP offers; the REP tells the rest.
    c->max_rd_atomic = args.param.initiator_depth;
    c->max_dest_rd_atomic = args.param.responder_resources;
    encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, r);
    AgentOps::send_conn_mad(*this, *c, CmCtr::TxReq, true);
  }
  *out = c->id;
  return 0;
}

int Agent::accept(ConnId id, const ConnParam& p) {
  Conn* c = AgentOps::find(*this, id);
  if (!c || !c->passive) return ENOENT;
  if (c->kind == QpKind::Ud) {
    if (c->state != ConnState::SidrReqRcvd) return EINVAL;
    if (p.private_data_len > kSidrRepPrivate) return EINVAL;
    SidrRep r;
    r.request_id = c->remote_id;
    r.status = static_cast<uint8_t>(SidrStatus::Ok);
    r.qpn = p.qpn & 0xffffff;
    r.qkey = p.qkey;
    r.service_id = c->service_id;
    std::memcpy(r.private_data, p.private_data, p.private_data_len);
    encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, r);
    c->local_qpn = r.qpn;
    AgentOps::send_conn_mad(*this, *c, CmCtr::TxSidrRep, false);
    // Kept for a while to answer a repeated SIDR_REQ with the same SIDR_REP.
    c->state = ConnState::TimeWait;
    c->deadline = now_ + std::min(timeout_ns(cfg_.cm_response_timeout), cfg_.timewait_ns);
    return 0;
  }
  if (c->state != ConnState::ReqRcvd && c->state != ConnState::MraSent) return EINVAL;
  if (p.private_data_len > kRepPrivate) return EINVAL;
  Rep r;
  r.local_comm_id = c->id;
  r.remote_comm_id = c->remote_id;
  r.local_qpn = p.qpn & 0xffffff;
  r.starting_psn = c->local_psn;
  // The program's offer, capped by what the REQ allows (a peer that reads
  // with depth N never needs more than N resources from us, and vice versa).
  r.responder_resources = std::min(p.responder_resources, c->max_dest_rd_atomic);
  r.initiator_depth = std::min(p.initiator_depth, c->max_rd_atomic);
  r.target_ack_delay = 0;
  r.failover_accepted = 0;
  r.end_to_end_flow_control = p.flow_control != 0;
  r.rnr_retry_count = p.rnr_retry_count & 7;
  r.srq = p.srq;
  r.local_ca_guid = cfg_.ca_guid;
  std::memcpy(r.private_data, p.private_data, p.private_data_len);
  c->local_qpn = r.local_qpn;
  c->max_dest_rd_atomic = r.responder_resources;
  c->max_rd_atomic = r.initiator_depth;
  c->mra_at = 0;
  c->state = ConnState::RepSent;
  encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, r);
  AgentOps::send_conn_mad(*this, *c, CmCtr::TxRep, true);
  return 0;
}

int Agent::reject(ConnId id, std::span<const uint8_t> pdata) {
  Conn* c = AgentOps::find(*this, id);
  if (!c || !c->passive) return ENOENT;
  if (c->kind == QpKind::Ud) {
    if (c->state != ConnState::SidrReqRcvd) return EINVAL;
    SidrRep r;
    r.request_id = c->remote_id;
    r.status = static_cast<uint8_t>(SidrStatus::Reject);
    r.service_id = c->service_id;
    if (!pdata.empty()) std::memcpy(r.private_data, pdata.data(), std::min(pdata.size(), sizeof r.private_data));
    encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, r);
    AgentOps::send_conn_mad(*this, *c, CmCtr::TxSidrRep, false);
    c->state = ConnState::Closed;
    return 0;
  }
  if (c->state != ConnState::ReqRcvd && c->state != ConnState::MraSent) return EINVAL;
  if (pdata.size() > kRejPrivate) return EINVAL;
  c->mra_at = 0;
  AgentOps::send_rej(*this, *c, RejReason::ConsumerDefined, 0, pdata);
  c->state = ConnState::Closed;
  return 0;
}

int Agent::establish(ConnId id) {
  Conn* c = AgentOps::find(*this, id);
  if (!c || c->passive) return ENOENT;
  if (c->state != ConnState::RepRcvd) return EINVAL;
  Rtu r;
  r.local_comm_id = c->id;
  r.remote_comm_id = c->remote_id;
  encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, r);
  AgentOps::send_conn_mad(*this, *c, CmCtr::TxRtu, false);
  c->state = ConnState::Established;
  AgentOps::count(*this, CmCtr::Established);
  return 0;
}

int Agent::disconnect(ConnId id) {
  Conn* c = AgentOps::find(*this, id);
  if (!c) return ENOENT;
  switch (c->state) {
    case ConnState::Established:
    case ConnState::RepSent:
    case ConnState::RepRcvd:
      AgentOps::send_dreq(*this, *c);
      return 0;
    case ConnState::DreqSent:
    case ConnState::TimeWait:
    case ConnState::DreqRcvd:
      return 0;  // on its way down already
    default:
      return EINVAL;
  }
}

void Agent::destroy(ConnId id) {
  Conn* c = AgentOps::find(*this, id);
  if (!c) return;
  c->orphan = true;
  c->mra_at = 0;
  switch (c->state) {
    case ConnState::Established:
    case ConnState::RepRcvd:
      AgentOps::send_dreq(*this, *c);  // kept until DREP / timeout, then TimeWait
      return;
    case ConnState::ReqSent:
    case ConnState::MraRcvd:
      AgentOps::send_rej(*this, *c, RejReason::Timeout, 0);
      break;
    case ConnState::ReqRcvd:
    case ConnState::MraSent:
    case ConnState::RepSent:
      AgentOps::send_rej(*this, *c, RejReason::ConsumerDefined, c->state == ConnState::RepSent ? 1 : 0);
      break;
    case ConnState::DreqSent:
    case ConnState::TimeWait:
      return;  // finishes by itself, then goes
    default:
      break;
  }
  AgentOps::erase(*this, id);
}

int Agent::qp_params(ConnId id, QpParams& o) const {
  auto it = conns_.find(id);
  if (it == conns_.end()) return ENOENT;
  const Conn& c = *it->second;
  if (c.state == ConnState::Listen) return EINVAL;
  o = QpParams{};
  o.sgid = c.local.ip;
  o.dgid = c.remote.ip;
  o.traffic_class = c.traffic_class;
  o.hop_limit = c.hop_limit;
  o.flow_label = c.flow_label;
  // The starting PSN a node puts in its REQ/REP is the PSN it expects to
  // receive: the peer sends from it (Linux's cm.c; test/data/rxe-cm.txt: a
  // Linux active side sends from the REP's PSN, the passive side from the REQ's).
  o.sq_psn = c.kind == QpKind::Ud ? c.local_psn : c.remote_psn;
  if (c.kind == QpKind::Ud) {
    o.qkey = c.qkey ? c.qkey : kUdpQkey;
    o.dest_qpn = c.remote_qpn;
    return 0;
  }
  // RC/UC: RTR needs the peer's QPN and PSN (known to the active side once the REP came).
  if (!c.passive && (c.state == ConnState::ReqSent || c.state == ConnState::MraRcvd || c.state == ConnState::Idle))
    return EINVAL;
  o.dest_qpn = c.remote_qpn;
  o.rq_psn = c.local_psn;
  o.path_mtu = c.path_mtu;
  o.max_dest_rd_atomic = c.max_dest_rd_atomic;
  o.max_rd_atomic = c.max_rd_atomic;
  o.timeout = c.ack_timeout;
  o.retry_cnt = c.retry_cnt;
  o.rnr_retry = c.rnr_retry;
  return 0;
}

int Agent::set_user(ConnId id, uint64_t user) {
  Conn* c = AgentOps::find(*this, id);
  if (!c) return ENOENT;
  c->user = user;
  return 0;
}

void Agent::on_mad(const wire::Gid& src, const wire::Gid& dst, uint32_t src_qpn, std::span<const uint8_t> mad) {
  AgentOps::count(*this, CmCtr::RxMads);
  MadHdr h;
  if (src_qpn != kGsiQpn || decode_hdr(mad, h) != MadError::None) return AgentOps::count(*this, CmCtr::RxBad);
  switch (h.attr_id) {
    case Attr::Req: return AgentOps::on_req(*this, src, dst, mad, h.tid);
    case Attr::Mra: return AgentOps::on_mra(*this, mad);
    case Attr::Rej: return AgentOps::on_rej(*this, src, mad);
    case Attr::Rep: return AgentOps::on_rep(*this, mad);
    case Attr::Rtu: return AgentOps::on_rtu(*this, mad);
    case Attr::Dreq: return AgentOps::on_dreq(*this, src, dst, mad, h.tid);
    case Attr::Drep: return AgentOps::on_drep(*this, mad);
    case Attr::SidrReq: return AgentOps::on_sidr_req(*this, src, dst, mad, h.tid);
    case Attr::SidrRep: return AgentOps::on_sidr_rep(*this, mad);
    default: return AgentOps::count(*this, CmCtr::RxBad);  // LAP/APR/ClassPortInfo: not supported
  }
}

void Agent::tick(uint64_t now) {
  now_ = now;
  std::vector<ConnId> ids;
  ids.reserve(conns_.size());
  for (auto& [id, c] : conns_) ids.push_back(id);
  for (ConnId id : ids) {
    Conn* c = AgentOps::find(*this, id);
    if (!c) continue;
    // A MAD that could not go out (MAC unknown): try again soon, not at the retry timer.
    if (c->unsent && c->have_mad) {
      if (now - c->unsent_since > kSendRetryMaxNs) {
        c->unsent = false;
      } else {
        AgentOps::transmit(*this, *c);
        if (!c->unsent) continue;
      }
    }
    if (c->mra_at && now >= c->mra_at && c->state == ConnState::ReqRcvd) {
      c->mra_at = 0;
      Mra m;
      m.local_comm_id = c->id;
      m.remote_comm_id = c->remote_id;
      m.message_mraed = 0;
      m.service_timeout = cfg_.cm_response_timeout;
      encode(std::span<uint8_t>(c->mad, kMadSize), c->tid, m);
      c->state = ConnState::MraSent;
      AgentOps::send_conn_mad(*this, *c, CmCtr::TxMra, false);
      continue;
    }
    if (c->state == ConnState::TimeWait && now >= c->deadline) {
      c->state = ConnState::Closed;
      c->have_mad = false;
      if (c->orphan) AgentOps::erase(*this, id);
      continue;
    }
    if (!c->waiting || now < c->deadline) continue;
    if (c->retries_left == 0) {
      AgentOps::on_timeout(*this, *c);
      continue;
    }
    --c->retries_left;
    ++c->retries;
    AgentOps::count(*this, CmCtr::Retries);
    AgentOps::transmit(*this, *c);
    c->deadline = now + c->wait_ns;
  }
}

std::vector<ConnInfo> Agent::connections() const {
  std::vector<ConnInfo> v;
  v.reserve(conns_.size());
  for (auto& [id, c] : conns_) {
    ConnInfo i;
    i.id = id;
    i.remote_comm_id = c->remote_id;
    i.state = c->state;
    i.kind = c->kind;
    i.service_id = c->service_id;
    i.local = c->local;
    i.remote = c->remote;
    i.local_qpn = c->local_qpn;
    i.remote_qpn = c->remote_qpn;
    i.retries = c->retries;
    i.passive = c->passive;
    v.push_back(i);
  }
  return v;
}

}  // namespace droce::cm

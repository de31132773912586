#include "shim/cm_sessions.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <random>

namespace droce::shim {

using namespace proto;
using Clock = std::chrono::steady_clock;

namespace {
constexpr uint32_t kNoDev = UINT32_MAX;
constexpr uint16_t kEphemeralLo = 32768, kEphemeralHi = 60999;  // Linux's ip_local_port_range

bool is_any(const wire::Gid& g) {
  if (wire::gid_is_ipv4_mapped(g)) return wire::gid_to_ipv4(g) == 0;
  return std::all_of(g.begin(), g.end(), [](uint8_t b) { return b == 0; });
}

// sockaddr_in / sockaddr_in6 -> family, GID (IPv4 mapped; the wildcard all
// zero), port (host order). -EAFNOSUPPORT for other families.
int parse_addr(const CmAddr& a, int& family, wire::Gid& ip, uint16_t& port) {
  sa_family_t f;
  std::memcpy(&f, a.bytes, sizeof(f));
  if (f == AF_INET) {
    sockaddr_in sin;
    std::memcpy(&sin, a.bytes, sizeof(sin));
    const uint32_t v4 = ntohl(sin.sin_addr.s_addr);
    ip = v4 == 0 ? wire::Gid{} : wire::gid_from_ipv4(v4);
    port = ntohs(sin.sin_port);
  } else if (f == AF_INET6) {
    sockaddr_in6 sin6;
    std::memcpy(&sin6, a.bytes, sizeof(sin6));
    std::memcpy(ip.data(), sin6.sin6_addr.s6_addr, 16);
    if (is_any(ip)) ip = wire::Gid{};
    port = ntohs(sin6.sin6_port);
  } else {
    return -EAFNOSUPPORT;
  }
  family = f;
  return 0;
}

void put_addr(int family, const wire::Gid& ip, uint16_t port, CmAddr& out) {
  std::memset(out.bytes, 0, sizeof(out.bytes));
  if (family == AF_INET) {
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_port = htons(port);
    sin.sin_addr.s_addr = wire::gid_is_ipv4_mapped(ip) ? htonl(wire::gid_to_ipv4(ip)) : 0;
    std::memcpy(out.bytes, &sin, sizeof(sin));
  } else if (family == AF_INET6) {
    sockaddr_in6 sin6{};
    sin6.sin6_family = AF_INET6;
    sin6.sin6_port = htons(port);
    std::memcpy(sin6.sin6_addr.s6_addr, ip.data(), 16);
    std::memcpy(out.bytes, &sin6, sizeof(sin6));
  }
}

bool datagram_ps(uint32_t ps) { return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB; }

int family_of(const wire::Gid& ip) { return wire::gid_is_ipv4_mapped(ip) ? AF_INET : AF_INET6; }

void put_param(const cm::ConnParam& p, CmConnParam& out) {
  static_assert(sizeof(out.private_data) >= sizeof(p.private_data));
  std::memcpy(out.private_data, p.private_data, sizeof(p.private_data));
  out.private_data_len = p.private_data_len;
  out.responder_resources = p.responder_resources;
  out.initiator_depth = p.initiator_depth;
  out.flow_control = p.flow_control;
  out.retry_count = p.retry_count;
  out.rnr_retry_count = p.rnr_retry_count;
  out.srq = p.srq ? 1 : 0;
  out.qp_num = p.qpn;
  out.qkey = p.qkey;
}
}  // namespace

struct CmSessions::Inbox {
  std::mutex mu;
  std::vector<std::pair<uint32_t, cm::Event>> q;
  int wake_fd = -1;
  bool closed = false;
};

struct CmSessions::Channel {
  int efd = -1;
  std::deque<CmEventResp> q;
  uint32_t ids = 0;
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {
    if (efd >= 0) ::close(efd);
  }
};

struct CmSessions::Id {
  enum class Addr : uint8_t { None, Resolving, Resolved };
  enum class Role : uint8_t { None, Listener, Active, Passive };
  Session* s = nullptr;
  uint32_t handle = 0;
  uint32_t channel = 0;
  uint64_t cookie = 0;
  uint32_t rdma_ps = 0;
  cm::PortSpace ps = cm::PortSpace::Tcp;
  cm::QpKind kind = cm::QpKind::Rc;
  // Addresses: family 0 while unbound; src all zero when bound to the wildcard
  // and not resolved yet.
  int family = 0, dst_family = 0;
  wire::Gid src{}, dst{};
  uint16_t sport = 0, dport = 0;
  bool has_binding = false;  // in binds_ (a passive id shares its listener's port)
  bool bound_any = false;    // bound to the wildcard: the device comes with a resolution
  uint32_t dev = kNoDev;
  Addr addr = Addr::None;
  bool route = false;
  Clock::time_point deadline{}, next_try{};
  Role role = Role::None;
  std::vector<std::pair<uint32_t, cm::ConnId>> listens;  // (dev, listener) per device
  uint32_t backlog = 0, pending = 0;                     // listener: unread CONNECT_REQUESTs
  cm::ConnId conn = 0;                                   // active or passive connection on dev
  uint64_t parent_cookie = 0;                            // passive: its listener's
  uint32_t parent_handle = 0;
  bool answered = false;  // passive: accepted or rejected
  uint8_t offered_rr = 0; // the responder resources we offered (INIT before the REP)
};

struct CmSessions::Session {
  uint64_t client = 0;
  uid_t uid = 0;
  uint32_t next_handle = 1;
  std::map<uint32_t, std::unique_ptr<Channel>> channels;
  std::map<uint32_t, std::unique_ptr<Id>> ids;
};

CmSessions::CmSessions(CmBackend& cm, ShimBackend& verbs, CmLimits lim, int wake_fd,
                       std::atomic<uint64_t>& quota_refused)
    : cm_(cm), verbs_(verbs), lim_(lim), quota_refused_(quota_refused), inbox_(std::make_shared<Inbox>()) {
  inbox_->wake_fd = wake_fd;
  // Core threads: queue and wake the server thread. The inbox outlives us
  // if the backend still holds the sink.
  cm_.cm_set_sink([inbox = inbox_](uint32_t dev, const cm::Event& e) {
    std::lock_guard lk(inbox->mu);
    if (inbox->closed) return;
    inbox->q.emplace_back(dev, e);
    uint64_t one = 1;
    if (::write(inbox->wake_fd, &one, sizeof(one)) < 0) {
      // the counter is saturated or the fd nonblocking-full: the server is awake anyway
    }
  });
}

CmSessions::~CmSessions() {
  std::vector<uint64_t> clients;
  for (auto& [id, s] : sessions_) clients.push_back(id);
  for (uint64_t id : clients) client_gone(ClientInfo{id, 0, 0, 0});
  std::lock_guard lk(inbox_->mu);
  inbox_->closed = true;
  inbox_->q.clear();
}

CmSessions::Session* CmSessions::session(const ClientInfo& c, bool create) {
  auto it = sessions_.find(c.id);
  if (it != sessions_.end()) return it->second.get();
  if (!create) return nullptr;
  auto s = std::make_unique<Session>();
  s->client = c.id;
  s->uid = c.uid;
  return sessions_.emplace(c.id, std::move(s)).first->second.get();
}

CmSessions::Id* CmSessions::find_id(const ClientInfo& c, uint32_t h) {
  Session* s = session(c, false);
  if (s == nullptr) return nullptr;
  auto it = s->ids.find(h);
  return it == s->ids.end() ? nullptr : it->second.get();
}

// ---- channels and ids

int CmSessions::create_channel(const ClientInfo& c, HandleResp& r, int* out_fd) {
  Session* s = session(c, true);
  if (s->channels.size() >= lim_.max_channels_per_client) {
    quota_refused_++;
    return -ENOMEM;
  }
  if (s->next_handle == UINT32_MAX) return -ENOSPC;
  auto ch = std::make_unique<Channel>();
  // A semaphore (one read per event) and blocking: rdma_get_cm_event sleeps in read().
  ch->efd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (ch->efd < 0) return -errno;
  *out_fd = ch->efd;  // still owned by the channel
  r.handle = s->next_handle++;
  s->channels.emplace(r.handle, std::move(ch));
  channels_++;
  return 0;
}

int CmSessions::destroy_channel(const ClientInfo& c, const HandleReq& q) {
  Session* s = session(c, false);
  if (s == nullptr) return -EBADF;
  auto it = s->channels.find(q.handle);
  if (it == s->channels.end()) return -EBADF;
  if (it->second->ids != 0) return -EBUSY;
  dropped_ += it->second->q.size();  // none normally: events go with their ids
  s->channels.erase(it);
  channels_--;
  return 0;
}

int CmSessions::create_id(const ClientInfo& c, const CmCreateIdReq& q, HandleResp& r) {
  Session* s = session(c, false);
  if (s == nullptr || !s->channels.contains(q.channel)) return -EBADF;
  cm::QpKind kind;
  switch (q.qp_type) {
    case IBV_QPT_RC: kind = cm::QpKind::Rc; break;
    case IBV_QPT_UC: kind = cm::QpKind::Uc; break;
    case IBV_QPT_UD: kind = cm::QpKind::Ud; break;
    default: return -EINVAL;
  }
  // As the kernel's ucma: TCP is connected, UDP/IPoIB datagram, IB either.
  switch (q.ps) {
    case RDMA_PS_TCP:
      if (kind == cm::QpKind::Ud) return -EINVAL;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      if (kind != cm::QpKind::Ud) return -EINVAL;
      break;
    case RDMA_PS_IB: break;
    default: return -EINVAL;
  }
  if (s->ids.size() >= lim_.max_ids_per_client) {
    quota_refused_++;
    return -ENOMEM;
  }
  if (s->next_handle == UINT32_MAX) return -ENOSPC;
  auto id = std::make_unique<Id>();
  id->s = s;
  id->handle = s->next_handle++;
  id->channel = q.channel;
  id->cookie = next_cookie_++;
  id->rdma_ps = q.ps;
  id->ps = static_cast<cm::PortSpace>(q.ps);
  id->kind = kind;
  s->channels.at(q.channel)->ids++;
  cookies_[id->cookie] = id.get();
  r.handle = id->handle;
  s->ids.emplace(id->handle, std::move(id));
  ids_++;
  return 0;
}

void CmSessions::destroy(Session& s, Id& id) {
  const uint32_t handle = id.handle;
  std::vector<uint32_t> children;  // new ids of CONNECT_REQUESTs the listener never read
  if (auto ch = s.channels.find(id.channel); ch != s.channels.end()) {
    auto& q = ch->second->q;
    for (auto it = q.begin(); it != q.end();) {
      const bool mine = it->id == handle;
      const bool child = it->event == RDMA_CM_EVENT_CONNECT_REQUEST && it->listen_id == handle;
      if (!mine && !child) {
        ++it;
        continue;
      }
      if (child) children.push_back(it->id);
      if (mine && it->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
        if (auto l = s.ids.find(it->listen_id); l != s.ids.end() && l->second->pending > 0) l->second->pending--;
      }
      dropped_++;
      it = q.erase(it);
    }
    ch->second->ids--;
  }
  // The agent forgets it: an established connection sends DREQ, one being
  // set up REJ; no more events.
  for (auto [dev, lid] : id.listens) cm_.cm_destroy(dev, lid);
  if (id.role == Id::Role::Listener) listeners_--;
  if (id.conn != 0) {
    // Only if (dev, ConnId) is still ours: the agent may have forgotten a
    // finished connection and given its comm ID to a new one since.
    if (auto it = conns_.find({id.dev, id.conn}); it != conns_.end() && it->second == &id) {
      cm_.cm_destroy(id.dev, id.conn);
      conns_.erase(it);
    }
  }
  unbind(id);
  std::erase(resolving_, &id);
  resolving_n_ = resolving_.size();
  cookies_.erase(id.cookie);
  s.ids.erase(handle);  // id is gone from here on
  ids_--;
  for (uint32_t h : children)
    if (auto it = s.ids.find(h); it != s.ids.end()) destroy(s, *it->second);
}

int CmSessions::destroy_id(const ClientInfo& c, const HandleReq& q) {
  Id* id = find_id(c, q.handle);
  if (id == nullptr) return -EBADF;
  destroy(*id->s, *id);
  return 0;
}

int CmSessions::migrate_id(const ClientInfo& c, const CmMigrateIdReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  Session& s = *id->s;
  auto to = s.channels.find(q.channel);
  if (to == s.channels.end()) return -EBADF;
  if (q.channel == id->channel) return 0;
  Channel& from = *s.channels.at(id->channel);
  Channel& dst = *to->second;
  // Its unread events move along (CONNECT_REQUESTs of a listener bring their new ids).
  std::vector<uint32_t> children;
  uint64_t moved = 0;
  for (auto it = from.q.begin(); it != from.q.end();) {
    const bool mine = it->id == q.id;
    const bool child = it->event == RDMA_CM_EVENT_CONNECT_REQUEST && it->listen_id == q.id;
    if (!mine && !child) {
      ++it;
      continue;
    }
    if (child) children.push_back(it->id);
    dst.q.push_back(*it);
    moved++;
    it = from.q.erase(it);
  }
  from.ids--;
  dst.ids++;
  id->channel = q.channel;
  for (uint32_t h : children) {
    auto it = s.ids.find(h);
    if (it == s.ids.end() || it->second->channel == q.channel) continue;
    Id& ch = *it->second;
    s.channels.at(ch.channel)->ids--;
    dst.ids++;
    ch.channel = q.channel;
  }
  if (moved != 0) {
    // The old channel keeps its counts (spurious wakeups: CmGetEvent answers -EAGAIN).
    if (::write(dst.efd, &moved, sizeof(moved)) < 0) {
      // cannot fail short of counter overflow
    }
  }
  return 0;
}

// ---- addresses

int CmSessions::bind(Id& id, int family, const wire::Gid& ip, uint16_t port, uint32_t dev) {
  // As Linux: ports below 1024 need privileges (CAP_NET_BIND_SERVICE; here root).
  if (port != 0 && port < 1024 && id.s->uid != 0) return -EACCES;
  auto taken = [&](uint16_t p) {
    auto it = binds_.find({id.rdma_ps, p});
    if (it == binds_.end()) return false;
    for (const Binding& b : it->second)
      if (is_any(b.ip) || is_any(ip) || b.ip == ip) return true;
    return false;
  };
  if (port == 0) {
    static thread_local std::mt19937 rng{std::random_device{}()};
    const uint32_t n = kEphemeralHi - kEphemeralLo + 1;
    const uint32_t start = rng() % n;
    bool found = false;
    for (uint32_t i = 0; i < n && !found; i++) {
      const auto p = static_cast<uint16_t>(kEphemeralLo + (start + i) % n);
      if (!taken(p)) {
        port = p;
        found = true;
      }
    }
    if (!found) return -EADDRNOTAVAIL;
  } else if (taken(port)) {
    return -EADDRINUSE;
  }
  binds_[{id.rdma_ps, port}].push_back(Binding{ip, &id});
  bindings_++;
  id.has_binding = true;
  id.bound_any = is_any(ip);
  id.family = family;
  id.src = ip;
  id.sport = port;
  id.dev = dev;
  return 0;
}

void CmSessions::unbind(Id& id) {
  if (!id.has_binding) return;
  id.has_binding = false;
  auto it = binds_.find({id.rdma_ps, id.sport});
  if (it == binds_.end()) return;
  std::erase_if(it->second, [&](const Binding& b) { return b.id == &id; });
  if (it->second.empty()) binds_.erase(it);
  bindings_--;
}

int CmSessions::bind_addr(const ClientInfo& c, const CmAddrReq& q, CmIdInfo& r) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (id->family != 0 || id->role != Id::Role::None) return -EINVAL;  // bound already
  int family;
  wire::Gid ip;
  uint16_t port;
  if (int rc = parse_addr(q.addr, family, ip, port)) return rc;
  uint32_t dev = kNoDev;
  if (!is_any(ip)) {
    if (cm_.cm_local_dev(ip, &dev) != 0) return -EADDRNOTAVAIL;
  }
  if (int rc = bind(*id, family, ip, port, dev)) return rc;
  fill_info(*id, r);
  return 0;
}

int CmSessions::resolve_addr(const ClientInfo& c, const CmResolveAddrReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  // As Linux: once per id (again only after ADDR_ERROR).
  if (id->role != Id::Role::None || id->addr != Id::Addr::None) return -EINVAL;
  int dfam;
  wire::Gid dst;
  uint16_t dport;
  if (int rc = parse_addr(q.dst, dfam, dst, dport)) return rc;
  if (is_any(dst)) return -EINVAL;
  sa_family_t sfam_raw;
  std::memcpy(&sfam_raw, q.src.bytes, sizeof(sfam_raw));
  if (id->family == 0 && sfam_raw != 0) {
    // A source given: bind to it first (rdma_resolve_addr's src_addr).
    int sfam;
    wire::Gid sip;
    uint16_t sport;
    if (int rc = parse_addr(q.src, sfam, sip, sport)) return rc;
    uint32_t sdev = kNoDev;
    if (!is_any(sip) && cm_.cm_local_dev(sip, &sdev) != 0) return -EADDRNOTAVAIL;
    if (int rc = bind(*id, sfam, sip, sport, sdev)) return rc;
  }
  if (id->family != 0 && id->family != dfam && !(wire::gid_is_ipv4_mapped(dst) && id->family == AF_INET6))
    return -EINVAL;
  // The device and source address toward dst: the bound one, else the route's.
  uint32_t dev = id->dev;
  wire::Gid src = id->src;
  if (dev == kNoDev) {
    if (int rc = cm_.cm_route(dst, &dev, &src)) return rc < 0 ? rc : -ENETUNREACH;
  }
  if (id->family == 0) {
    // Unbound: an ephemeral port on the route's source address.
    if (int rc = bind(*id, dfam, src, 0, dev)) return rc;
  }
  id->dev = dev;
  id->src = src;
  id->dst = dst;
  id->dport = dport;
  id->dst_family = dfam;
  id->route = false;
  id->addr = Id::Addr::Resolving;
  const auto now = Clock::now();
  id->deadline = now + std::chrono::milliseconds(q.timeout_ms != 0 ? q.timeout_ms : lim_.resolve_timeout_ms);
  resolving_.push_back(id);
  resolving_n_ = resolving_.size();
  resolve_step(*id, now);
  return 0;
}

void CmSessions::resolve_step(Id& id, Clock::time_point now) {
  const int rc = cm_.cm_resolve(id.dev, id.dst);
  if (rc == -EINPROGRESS) {
    if (now >= id.deadline) {
      finish_resolve(id, -ETIMEDOUT);
      return;
    }
    id.next_try = std::min(id.deadline, now + std::chrono::milliseconds(lim_.resolve_retry_ms));
    return;
  }
  finish_resolve(id, rc > 0 ? -rc : rc);
}

void CmSessions::finish_resolve(Id& id, int status) {
  std::erase(resolving_, &id);
  resolving_n_ = resolving_.size();
  id.addr = status == 0 ? Id::Addr::Resolved : Id::Addr::None;
  if (status != 0 && id.bound_any) {
    // Back to the wildcard: the next resolution picks its route again.
    id.dev = kNoDev;
    id.src = wire::Gid{};
  }
  CmEventResp ev{};
  ev.event = status == 0 ? RDMA_CM_EVENT_ADDR_RESOLVED : RDMA_CM_EVENT_ADDR_ERROR;
  ev.status = status;
  ev.id = id.handle;
  fill_info(id, ev.info);
  deliver(id, ev);
}

int CmSessions::resolve_route(const ClientInfo& c, const CmIdTimeoutReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (id->addr != Id::Addr::Resolved || id->role != Id::Role::None) return -EINVAL;
  // RoCE: the route is the resolved address (no path record to query).
  id->route = true;
  CmEventResp ev{};
  ev.event = RDMA_CM_EVENT_ROUTE_RESOLVED;
  ev.id = id->handle;
  fill_info(*id, ev.info);
  deliver(*id, ev);
  return 0;
}

int CmSessions::query_id(const ClientInfo& c, const HandleReq& q, CmIdInfo& r) {
  Id* id = find_id(c, q.handle);
  if (id == nullptr) return -EBADF;
  fill_info(*id, r);
  return 0;
}

int CmSessions::join_multicast(const ClientInfo& c, const CmJoinReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (id->kind != cm::QpKind::Ud || id->dev == kNoDev || id->family == 0 || id->role != Id::Role::None) return -EINVAL;
  if (q.join_flags != RDMA_MC_JOIN_FLAG_FULLMEMBER && q.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
    return -EINVAL;
  int fam;
  wire::Gid mgid;
  uint16_t port;
  if (int rc = parse_addr(q.addr, fam, mgid, port)) return rc;
  // The MGID as Linux's cma makes it for RoCEv2: an IPv4 group as its
  // IPv4-mapped address (what parse_addr gives), an IPv6 group as is.
  if (!wire::gid_is_multicast(mgid) || fam != id->family) return -EINVAL;
  CmEventResp ev{};
  ev.event = RDMA_CM_EVENT_MULTICAST_JOIN;
  ev.id = id->handle;
  fill_info(*id, ev.info);
  fill_ah(id->dev, id->src, mgid, ev.ah_attr);  // hop limit 64, as Linux for IPv4 on RoCEv2
  ev.ud_qp_num = wire::kMcastQpn;
  ev.ud_qkey = datagram_ps(id->rdma_ps) || id->rdma_ps == RDMA_PS_IB ? cm::kUdpQkey : 0;
  deliver(*id, ev);
  return 0;
}

void CmSessions::fill_info(const Id& id, CmIdInfo& r) const {
  r = CmIdInfo{};
  r.dev = id.dev;
  r.port_num = 1;
  put_addr(id.family, id.src, id.sport, r.src);
  put_addr(id.dst_family, id.dst, id.dport, r.dst);
  std::memcpy(r.sgid.raw, id.src.data(), 16);
  std::memcpy(r.dgid.raw, id.dst.data(), 16);
  r.pkey = 0xffff;
}

void CmSessions::fill_ah(uint32_t dev, const wire::Gid& local, const wire::Gid& remote, ibv_ah_attr& ah) const {
  ah = ibv_ah_attr{};
  ah.is_global = 1;
  ah.port_num = 1;
  std::memcpy(ah.grh.dgid.raw, remote.data(), 16);
  const int gi = cm_.cm_gid_index(dev, local);
  ah.grh.sgid_index = static_cast<uint8_t>(gi < 0 ? 0 : gi);
  ah.grh.hop_limit = 64;
}

// ---- connections

int CmSessions::listen(const ClientInfo& c, const CmListenReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  const uint32_t backlog = q.backlog > 0 && q.backlog < lim_.max_backlog ? q.backlog : lim_.max_backlog;
  if (id->role == Id::Role::Listener) {
    id->backlog = backlog;  // listening again only changes the backlog, as Linux
    return 0;
  }
  if (id->role != Id::Role::None || id->addr != Id::Addr::None) return -EINVAL;
  if (id->family == 0) {
    // As rdma_listen on an unbound id: the IPv4 wildcard, an ephemeral port.
    if (int rc = bind(*id, AF_INET, wire::Gid{}, 0, kNoDev)) return rc;
  }
  cm::Endpoint ep{is_any(id->src) ? wire::Gid{} : id->src, id->sport};
  std::vector<uint32_t> devs;
  if (id->dev != kNoDev) {
    devs.push_back(id->dev);
  } else {
    for (uint32_t d = 0; d < verbs_.device_count(); d++) devs.push_back(d);  // the wildcard: every device
  }
  for (uint32_t d : devs) {
    cm::ConnId lid = 0;
    int rc = cm_.cm_listen(d, id->ps, ep, id->kind, id->cookie, &lid);
    if (rc != 0) {
      for (auto [dev, l] : id->listens) cm_.cm_destroy(dev, l);
      id->listens.clear();
      return rc > 0 ? -rc : rc;
    }
    id->listens.emplace_back(d, lid);
  }
  id->role = Id::Role::Listener;
  id->backlog = backlog;
  listeners_++;
  return 0;
}

namespace {
// A program's rdma_conn_param: RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH ask
// for the device's maximum; more than it is EINVAL (as librdmacm).
int conn_param(const CmConnParam& in, const ibv_device_attr& da, cm::ConnParam& out) {
  out = cm::ConnParam{};
  std::memcpy(out.private_data, in.private_data, sizeof(out.private_data));
  out.private_data_len = in.private_data_len;
  auto cap = [](uint8_t v, int max, uint8_t& dst) {
    if (v == RDMA_MAX_RESP_RES) v = static_cast<uint8_t>(std::clamp(max, 0, 255));
    if (v > max) return -EINVAL;
    dst = v;
    return 0;
  };
  if (cap(in.responder_resources, da.max_qp_rd_atom, out.responder_resources) ||
      cap(in.initiator_depth, da.max_qp_init_rd_atom, out.initiator_depth))
    return -EINVAL;
  out.flow_control = in.flow_control;
  out.retry_count = std::min<uint8_t>(in.retry_count, 7);
  out.rnr_retry_count = std::min<uint8_t>(in.rnr_retry_count, 7);
  out.srq = in.srq != 0;
  out.qpn = in.qp_num & 0xffffff;
  out.qkey = in.qkey;
  return 0;
}
}  // namespace

int CmSessions::connect(const ClientInfo& c, const CmConnParamReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (!id->route || id->role != Id::Role::None) return -EINVAL;
  const size_t max_pd = id->kind == cm::QpKind::Ud ? cm::kSidrReqUserPrivate : cm::kReqUserPrivate;
  if (q.param.private_data_len > max_pd) return -EINVAL;
  ibv_device_attr da{};
  ibv_port_attr pa{};
  if (int rc = verbs_.query_device(id->dev, da)) return rc;
  if (int rc = verbs_.query_port(id->dev, 1, pa)) return rc;
  cm::ConnectArgs a;
  a.local = {id->src, id->sport};
  a.remote = {id->dst, id->dport};
  a.ps = id->ps;
  a.kind = id->kind;
  if (int rc = conn_param(q.param, da, a.param)) return rc;
  if (datagram_ps(id->rdma_ps)) a.param.qkey = cm::kUdpQkey;
  a.path_mtu = static_cast<uint8_t>(pa.active_mtu);  // ibv_mtu is the IB encoding
  cm::ConnId conn = 0;
  if (int rc = cm_.cm_connect(id->dev, a, id->cookie, &conn)) return rc > 0 ? -rc : rc;
  id->conn = conn;
  id->role = Id::Role::Active;
  id->offered_rr = a.param.responder_resources;
  conns_[{id->dev, conn}] = id;
  return 0;
}

int CmSessions::accept(const ClientInfo& c, const CmConnParamReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (id->role != Id::Role::Passive || id->answered) return -EINVAL;
  const size_t max_pd = id->kind == cm::QpKind::Ud ? cm::kSidrRepPrivate : cm::kRepPrivate;
  if (q.param.private_data_len > max_pd) return -EINVAL;
  ibv_device_attr da{};
  if (int rc = verbs_.query_device(id->dev, da)) return rc;
  cm::ConnParam p;
  if (int rc = conn_param(q.param, da, p)) return rc;
  if (datagram_ps(id->rdma_ps)) p.qkey = cm::kUdpQkey;
  if (int rc = cm_.cm_accept(id->dev, id->conn, p)) return rc > 0 ? -rc : rc;
  id->answered = true;
  id->offered_rr = p.responder_resources;
  return 0;
}

int CmSessions::reject(const ClientInfo& c, const CmRejectReq& q) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (id->role != Id::Role::Passive || id->answered) return -EINVAL;
  if (q.private_data_len > sizeof(q.private_data)) return -EINVAL;
  if (int rc = cm_.cm_reject(id->dev, id->conn, std::span<const uint8_t>(q.private_data, q.private_data_len)))
    return rc > 0 ? -rc : rc;
  id->answered = true;
  return 0;
}

int CmSessions::establish(const ClientInfo& c, const HandleReq& q) {
  Id* id = find_id(c, q.handle);
  if (id == nullptr) return -EBADF;
  if (id->role != Id::Role::Active) return -EINVAL;
  // RTU; no event (the front turns CONNECT_RESPONSE into ESTABLISHED, as librdmacm).
  int rc = cm_.cm_establish(id->dev, id->conn);
  return rc > 0 ? -rc : rc;
}

int CmSessions::disconnect(const ClientInfo& c, const HandleReq& q) {
  Id* id = find_id(c, q.handle);
  if (id == nullptr) return -EBADF;
  if (id->conn == 0) return -EINVAL;
  int rc = cm_.cm_disconnect(id->dev, id->conn);
  return rc > 0 ? -rc : rc;
}

int CmSessions::init_qp_attr(const ClientInfo& c, const CmInitQpAttrReq& q, CmInitQpAttrResp& r) {
  Id* id = find_id(c, q.id);
  if (id == nullptr) return -EBADF;
  if (id->dev == kNoDev) return -EINVAL;  // no device yet
  ibv_qp_attr& a = r.attr;
  a = ibv_qp_attr{};
  a.qp_state = static_cast<ibv_qp_state>(q.qp_state);
  uint32_t mask = IBV_QP_STATE;
  cm::QpParams p{};
  const int prc = id->conn != 0 ? cm_.cm_qp_params(id->dev, id->conn, &p) : -ENOENT;
  if (id->kind == cm::QpKind::Ud) {
    // UD (Linux cma_ib_init_qp_attr): INIT gets the Q_Key; RTR/RTS need nothing
    // negotiated (librdmacm moves a UD QP to RTR and RTS with sq_psn 0).
    switch (q.qp_state) {
      case IBV_QPS_INIT:
        a.pkey_index = 0;
        a.port_num = 1;
        a.qkey = datagram_ps(id->rdma_ps) ? cm::kUdpQkey : (prc == 0 ? p.qkey : 0);
        mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        break;
      case IBV_QPS_RTR: break;
      case IBV_QPS_RTS:
        a.sq_psn = 0;
        mask |= IBV_QP_SQ_PSN;
        break;
      default: return -EINVAL;
    }
    r.mask = mask;
    return 0;
  }
  const bool rc_qp = id->kind == cm::QpKind::Rc;
  switch (q.qp_state) {
    case IBV_QPS_INIT:
      // Linux: before a connection exists (cma_ib_init_qp_attr) no remote
      // access; once REQ/REP are under way (cm.c cm_init_qp_init_attr)
      // remote write, plus read and atomics when we are a responder.
      a.pkey_index = 0;
      a.port_num = 1;
      mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      if (id->conn != 0) {
        a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
        const uint8_t rr = prc == 0 ? p.max_dest_rd_atomic : id->offered_rr;
        if (rr != 0 && rc_qp) a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      }
      break;
    case IBV_QPS_RTR: {
      if (prc != 0) return -EINVAL;  // not negotiated yet
      mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      a.ah_attr.is_global = 1;
      a.ah_attr.port_num = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, p.dgid.data(), 16);
      const int gi = cm_.cm_gid_index(id->dev, p.sgid);
      if (gi < 0) return gi;
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gi);
      a.ah_attr.grh.hop_limit = p.hop_limit;
      a.ah_attr.grh.traffic_class = p.traffic_class;
      a.ah_attr.grh.flow_label = p.flow_label;
      a.path_mtu = static_cast<ibv_mtu>(p.path_mtu);
      a.dest_qp_num = p.dest_qpn;
      a.rq_psn = p.rq_psn;
      if (rc_qp) {
        mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        // The depths negotiated on the wire, within this device's limits
        // (ibv_modify_qp refuses more than max_qp_rd_atom / max_qp_init_rd_atom).
        ibv_device_attr da{};
        if (int rc = verbs_.query_device(id->dev, da)) return rc;
        a.max_dest_rd_atomic = static_cast<uint8_t>(std::min<int>(p.max_dest_rd_atomic, da.max_qp_rd_atom));
        a.min_rnr_timer = p.min_rnr_timer;
      }
      break;
    }
    case IBV_QPS_RTS:
      if (prc != 0) return -EINVAL;
      mask |= IBV_QP_SQ_PSN;
      a.sq_psn = p.sq_psn;
      if (rc_qp) {
        mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        a.timeout = p.timeout;
        a.retry_cnt = p.retry_cnt;
        a.rnr_retry = p.rnr_retry;
        ibv_device_attr da{};
        if (int rc = verbs_.query_device(id->dev, da)) return rc;
        a.max_rd_atomic = static_cast<uint8_t>(std::min<int>(p.max_rd_atomic, da.max_qp_init_rd_atom));
      }
      break;
    default: return -EINVAL;
  }
  r.mask = mask;
  return 0;
}

// ---- events

int CmSessions::get_event(const ClientInfo& c, const HandleReq& q, CmEventResp& r) {
  Session* s = session(c, false);
  if (s == nullptr) return -EBADF;
  auto it = s->channels.find(q.handle);
  if (it == s->channels.end()) return -EBADF;
  auto& qu = it->second->q;
  if (qu.empty()) return -EAGAIN;
  r = qu.front();
  qu.pop_front();
  if (r.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
    if (auto l = s->ids.find(r.listen_id); l != s->ids.end() && l->second->pending > 0) l->second->pending--;
  }
  return 0;
}

void CmSessions::deliver(Id& id, const CmEventResp& ev) {
  Channel& ch = *id.s->channels.at(id.channel);
  ch.q.push_back(ev);
  events_++;
  uint64_t one = 1;
  if (::write(ch.efd, &one, sizeof(one)) < 0) {
    // cannot fail short of counter overflow
  }
}

void CmSessions::run() {
  std::vector<std::pair<uint32_t, cm::Event>> evs;
  {
    std::lock_guard lk(inbox_->mu);
    evs.swap(inbox_->q);
  }
  for (auto& [dev, e] : evs) route(dev, e);
  if (!resolving_.empty()) {
    const auto now = Clock::now();
    std::vector<Id*> due;
    for (Id* id : resolving_)
      if (now >= id->next_try) due.push_back(id);
    for (Id* id : due) resolve_step(*id, now);  // delivers events only: no id goes away here
  }
}

int CmSessions::next_timeout_ms() const {
  if (resolving_.empty()) return -1;
  auto next = Clock::time_point::max();
  for (const Id* id : resolving_) next = std::min(next, id->next_try);
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT32_MAX));
}

void CmSessions::route(uint32_t dev, const cm::Event& e) {
  if (e.type == cm::EventType::ConnectRequest) {
    auto it = cookies_.find(e.user);
    Id* l = it == cookies_.end() ? nullptr : it->second;
    if (l == nullptr || l->role != Id::Role::Listener) {
      // Its listener is gone: the agent rejects the connection.
      cm_.cm_destroy(dev, e.id);
      dropped_++;
      return;
    }
    Session& s = *l->s;
    if (l->pending >= l->backlog || s.ids.size() >= lim_.max_ids_per_client || s.next_handle == UINT32_MAX) {
      cm_.cm_destroy(dev, e.id);
      dropped_++;
      return;
    }
    auto nid = std::make_unique<Id>();
    Id& n = *nid;
    n.s = &s;
    n.handle = s.next_handle++;
    n.channel = l->channel;
    n.cookie = next_cookie_++;
    n.rdma_ps = l->rdma_ps;
    n.ps = l->ps;
    n.kind = e.kind;
    n.family = family_of(e.local.ip);
    n.dst_family = family_of(e.remote.ip);
    n.src = e.local.ip;
    n.sport = e.local.port;
    n.dst = e.remote.ip;
    n.dport = e.remote.port;
    n.dev = dev;
    n.addr = Id::Addr::Resolved;
    n.route = true;
    n.role = Id::Role::Passive;
    n.conn = e.id;
    n.parent_cookie = l->cookie;
    n.parent_handle = l->handle;
    s.channels.at(n.channel)->ids++;
    cookies_[n.cookie] = &n;
    conns_[{dev, e.id}] = &n;
    s.ids.emplace(n.handle, std::move(nid));
    ids_++;
    if (cm_.cm_set_user(dev, e.id, n.cookie) != 0) {
      // The agent no longer knows it (gone meanwhile): nothing to offer.
      destroy(s, n);
      dropped_++;
      return;
    }
    l->pending++;
    CmEventResp ev{};
    ev.event = RDMA_CM_EVENT_CONNECT_REQUEST;
    ev.id = n.handle;
    ev.listen_id = l->handle;
    put_param(e.param, ev.param);
    fill_info(n, ev.info);
    if (n.kind == cm::QpKind::Ud) {
      fill_ah(dev, n.src, n.dst, ev.ah_attr);
      ev.ud_qp_num = e.ud_qpn;
      ev.ud_qkey = e.ud_qkey;
    }
    deliver(n, ev);
    return;
  }
  // Other events belong to a connection: the id that holds (dev, ConnId) with
  // the event's cookie (its own, or its listener's before cm_set_user took).
  auto it = conns_.find({dev, e.id});
  if (it == conns_.end() || (it->second->cookie != e.user && it->second->parent_cookie != e.user)) {
    dropped_++;
    return;
  }
  Id& id = *it->second;
  CmEventResp ev{};
  ev.id = id.handle;
  const bool ud = id.kind == cm::QpKind::Ud;
  switch (e.type) {
    case cm::EventType::ConnectResponse:
      ev.event = RDMA_CM_EVENT_CONNECT_RESPONSE;
      put_param(e.param, ev.param);
      break;
    case cm::EventType::Established:
      ev.event = RDMA_CM_EVENT_ESTABLISHED;
      put_param(e.param, ev.param);
      if (ud) {
        fill_ah(dev, id.src, id.dst, ev.ah_attr);
        ev.ud_qp_num = e.ud_qpn;
        ev.ud_qkey = e.ud_qkey;
      }
      break;
    case cm::EventType::Rejected:
      // A SIDR_REP that is not OK is UNREACHABLE with the SIDR status (as Linux).
      ev.event = ud ? RDMA_CM_EVENT_UNREACHABLE : RDMA_CM_EVENT_REJECTED;
      ev.status = e.status;
      put_param(e.param, ev.param);
      break;
    case cm::EventType::Unreachable:
      ev.event = RDMA_CM_EVENT_UNREACHABLE;
      ev.status = -ETIMEDOUT;
      break;
    case cm::EventType::Disconnected:
      ev.event = RDMA_CM_EVENT_DISCONNECTED;
      break;
    case cm::EventType::ConnectRequest: return;  // handled above
  }
  fill_info(id, ev.info);
  deliver(id, ev);
}

void CmSessions::client_gone(const ClientInfo& c) {
  auto it = sessions_.find(c.id);
  if (it == sessions_.end()) return;
  Session& s = *it->second;
  // Connections first, then listeners (whose unread requests take their new ids along).
  for (int pass = 0; pass < 2; pass++) {
    std::vector<uint32_t> hs;
    for (auto& [h, id] : s.ids)
      if ((id->role == Id::Role::Listener) == (pass == 1)) hs.push_back(h);
    for (uint32_t h : hs)
      if (auto i = s.ids.find(h); i != s.ids.end()) destroy(s, *i->second);
  }
  for (auto& [h, ch] : s.channels) dropped_ += ch->q.size();
  channels_ -= s.channels.size();
  sessions_.erase(it);
}

CmStats CmSessions::stats() const {
  CmStats st;
  st.ids = ids_.load();
  st.channels = channels_.load();
  st.listeners = listeners_.load();
  st.bindings = bindings_.load();
  st.resolving = resolving_n_.load();
  st.events = events_.load();
  st.events_dropped = dropped_.load();
  return st;
}

}  // namespace droce::shim

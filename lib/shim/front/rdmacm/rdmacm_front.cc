// The drop-in librdmacm.so.1: rdma-core 44's public librdmacm ABI on top of
// droced's RDMA CM (the Cm* ops of shim/protocol.h), so that programs built
// against Debian's librdmacm connect through droce with LD_LIBRARY_PATH
// pointing at lib/shim/front (this library and the drop-in libibverbs).
//
// Division of work, as librdmacm over the kernel's ucma: droced owns QP1, the
// CM state machine and the per-channel event queues; this library keeps the
// program-visible objects (rdma_cm_id, rdma_event_channel, rdma_cm_event) and
// moves the program's QPs itself through the verbs API (ibv_modify_qp with
// the attributes CmInitQpAttr returns).
//
// Objects: every one of ours begins with the public struct the program sees,
// so a cast gets back to ours. Ids are reference counted: the program's
// reference (dropped by rdma_destroy_id) and one per event that names the id
// and is not yet acked, so an event never points at freed memory (librdmacm
// instead blocks rdma_destroy_id until the events are acked).
//
// Threads: one control connection per process (opened at the first call),
// whose ShimConnection serialises requests with its mutex; g_mu guards our
// tables only and is never held across a call to the daemon or a blocking
// read of a channel fd.
//
// Symbol versions: librdmacm.map (RDMACM_1.0 ... RDMACM_1.3).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <infiniband/sa.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "shim/client/client.h"

using namespace droce::shim;
using namespace droce::shim::proto;

#define DROCE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint32_t kNoDev = UINT32_MAX;
constexpr uint32_t kUdpQkey = RDMA_UDP_QKEY;  // what droced's CM uses for UD ids

// librdmacm's convention: -1 and errno.
int fail(int e) {
  errno = e;
  return -1;
}
// 0, or -1 with errno from a -errno.
int status(int neg) { return neg == 0 ? 0 : fail(neg < 0 ? -neg : EINVAL); }

// ---- the control connection -----------------------------------------------

std::mutex g_mu;  // tables below; never held across a daemon call or a read
std::condition_variable g_unref;  // an event was acked (FId::reported fell)
ShimConnection* g_conn = nullptr;  // process lifetime

// The process's CM connection, opened on first use.
ShimConnection* conn() {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_conn == nullptr) {
    auto* c = new (std::nothrow) ShimConnection();
    if (c == nullptr) return nullptr;
    if (c->connect(default_socket_path()) != 0) {
      delete c;
      return nullptr;  // no daemon: like librdmacm without an RDMA device
    }
    g_conn = c;
  }
  return g_conn;
}

template <Op O>
int call(const typename Body<O>::Request& req, typename Body<O>::Response& resp, int* out_fd = nullptr) {
  ShimConnection* c = conn();
  if (c == nullptr) return -ENODEV;
  int n = 0;
  return c->call<O>(req, resp, nullptr, 0, out_fd, out_fd ? 1 : 0, &n);
}

// ---- devices ---------------------------------------------------------------

// One per droced device, opened the first time an id binds to it and kept
// for the process lifetime (programs keep id->verbs / id->pd pointers around).
struct CmDevice {
  uint32_t index;
  ibv_context* verbs;
  ibv_pd* pd;  // librdmacm's per-device PD (id->pd)
  uint8_t max_resp_res;   // device max_qp_rd_atom
  uint8_t max_init_depth; // device max_qp_init_rd_atom
  uint8_t active_mtu;
};
std::map<uint32_t, CmDevice*> g_devs;
std::mutex g_dev_mu;  // serialises opening devices (held across verbs calls, not g_mu)

CmDevice* get_device(uint32_t index) {
  std::lock_guard<std::mutex> dg(g_dev_mu);
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_devs.find(index);
    if (it != g_devs.end()) return it->second;
  }
  ListDevicesResp list{};
  if (int rc = call<Op::ListDevices>({}, list)) {
    errno = -rc;
    return nullptr;
  }
  std::string name;
  for (uint32_t i = 0; i < list.count && i < kMaxDevices; i++)
    if (list.dev[i].index == index) name.assign(list.dev[i].name, strnlen(list.dev[i].name, sizeof(list.dev[i].name)));
  if (name.empty()) {
    errno = ENODEV;
    return nullptr;
  }
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (devs == nullptr) return nullptr;
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n; i++)
    if (name == ibv_get_device_name(devs[i])) ctx = ibv_open_device(devs[i]);
  ibv_free_device_list(devs);
  if (ctx == nullptr) {
    if (errno == 0) errno = ENODEV;
    return nullptr;
  }
  ibv_device_attr attr{};
  ibv_port_attr port{};
  ibv_pd* pd = nullptr;
  int rc = ibv_query_device(ctx, &attr);
  if (rc == 0) rc = ibv_query_port(ctx, 1, &port);
  if (rc == 0 && (pd = ibv_alloc_pd(ctx)) == nullptr) rc = errno ? errno : ENOMEM;
  auto* d = rc == 0 ? new (std::nothrow) CmDevice{} : nullptr;
  if (d == nullptr) {
    if (pd) ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    errno = rc ? rc : ENOMEM;
    return nullptr;
  }
  d->index = index;
  d->verbs = ctx;
  d->pd = pd;
  d->max_resp_res = static_cast<uint8_t>(std::min(attr.max_qp_rd_atom, 255));
  d->max_init_depth = static_cast<uint8_t>(std::min(attr.max_qp_init_rd_atom, 255));
  d->active_mtu = static_cast<uint8_t>(port.active_mtu);
  std::lock_guard<std::mutex> g(g_mu);
  g_devs[index] = d;
  return d;
}

// ---- channels, ids, events --------------------------------------------------

struct FChannel {
  rdma_event_channel ch;  // first: programs hold rdma_event_channel*
  uint32_t handle;
  uint32_t readers;  // threads inside rdma_get_cm_event (g_mu)
  bool destroyed;    // rdma_destroy_event_channel ran while readers > 0 (g_mu)
};

struct FId {
  rdma_cm_id id;  // first: programs hold rdma_cm_id*
  uint32_t handle;
  uint32_t refs;       // the program's (until rdma_destroy_id) + one per unacked event naming it
  uint32_t reported;   // events reported on it and not acked (a CONNECT_REQUEST: on its listener)
  bool sync;           // created with a NULL channel: id->channel is private
  bool connect_error;  // CONNECT_RESPONSE failed here: swallow the REJECTED/DISCONNECTED that follow
  CmDevice* dev;
  uint8_t responder_resources;
  uint8_t initiator_depth;
  ibv_sa_path_rec path;              // id->route.path_rec once the route is known
  ibv_qp_init_attr* qp_init_attr;   // rdma_create_ep(RAI_PASSIVE): QPs for rdma_get_request
  uint8_t connect_data[56];          // rdma_addrinfo ai_connect, sent before the program's REQ data
  uint8_t connect_len;
};
std::map<uint32_t, FId*> g_ids;  // handle -> id (live ids only)

// A multicast group the id joined (rdma_join_multicast): the program's
// context comes back in MULTICAST_JOIN's param.ud.private_data, as librdmacm.
struct McJoin {
  ibv_gid mgid;
  void* context;
  uint32_t flags;  // RDMA_MC_JOIN_FLAG_*
  bool attached;   // the id's QP was attached when MULTICAST_JOIN was read
};
std::map<FId*, std::vector<McJoin>> g_joins;  // (g_mu) ids with groups

struct FEvent {
  rdma_cm_event ev;  // first
  FId* owner;        // the id the event names (a reference)
  FId* listener;     // CONNECT_REQUEST: the listening id (a reference)
  uint8_t private_data[256];
};

FChannel* chan_of(rdma_event_channel* c) { return reinterpret_cast<FChannel*>(c); }
FId* fid_of(rdma_cm_id* id) { return reinterpret_cast<FId*>(id); }

void free_id(FId* f) {
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_joins.erase(f);
  }
  free(f->qp_init_attr);
  f->~FId();
  free(f);
}
// Drops one reference (g_mu held by the caller); true when the id must be freed.
bool unref_locked(FId* f) { return --f->refs == 0; }
void unref(FId* f) {
  bool dead;
  {
    std::lock_guard<std::mutex> g(g_mu);
    dead = unref_locked(f);
  }
  if (dead) free_id(f);
}

FChannel* create_channel() {
  HandleResp r{};
  int fd = -1;
  if (int rc = call<Op::CmCreateChannel>({}, r, &fd)) {
    errno = -rc;
    return nullptr;
  }
  if (fd < 0) {
    errno = EPROTO;
    return nullptr;
  }
  auto* c = static_cast<FChannel*>(calloc(1, sizeof(FChannel)));
  if (c == nullptr) {
    HandleReq h{r.handle};
    Empty e;
    call<Op::CmDestroyChannel>(h, e);
    ::close(fd);
    errno = ENOMEM;
    return nullptr;
  }
  c->ch.fd = fd;
  c->handle = r.handle;
  return c;
}

// As with ucma, a thread blocked in rdma_get_cm_event keeps the channel's
// file: destroying the channel under it does not wake it with an error, it
// blocks until the process ends (rping's cm_thread relies on this). The last
// reader out closes and frees a channel destroyed under it.
void destroy_channel(FChannel* c) {
  HandleReq h{c->handle};
  Empty e;
  call<Op::CmDestroyChannel>(h, e);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (c->readers > 0) {
      c->destroyed = true;
      return;
    }
  }
  ::close(c->ch.fd);
  free(c);
}

struct ChannelReader {
  FChannel* c;
  explicit ChannelReader(FChannel* ch) : c(ch) {
    std::lock_guard<std::mutex> g(g_mu);
    ++c->readers;
  }
  ~ChannelReader() {
    bool last;
    {
      std::lock_guard<std::mutex> g(g_mu);
      last = --c->readers == 0 && c->destroyed;
    }
    if (last) {
      int saved = errno;
      ::close(c->ch.fd);
      free(c);
      errno = saved;
    }
  }
  bool destroyed() const {
    std::lock_guard<std::mutex> g(g_mu);
    return c->destroyed;
  }
  ChannelReader(const ChannelReader&) = delete;
  ChannelReader& operator=(const ChannelReader&) = delete;
};

// A new FId (one reference: the program's), not yet in g_ids.
FId* alloc_id(rdma_event_channel* channel, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  void* p = calloc(1, sizeof(FId));
  if (p == nullptr) return nullptr;
  auto* f = new (p) FId();
  f->refs = 1;
  f->id.context = context;
  f->id.ps = ps;
  f->id.qp_type = qp_type;
  f->id.channel = channel;
  f->responder_resources = RDMA_MAX_RESP_RES;
  f->initiator_depth = RDMA_MAX_INIT_DEPTH;
  return f;
}

void insert_id(FId* f) {
  std::lock_guard<std::mutex> g(g_mu);
  g_ids[f->handle] = f;
}

bool is_ud(const FId* f) { return f->id.qp_type == IBV_QPT_UD; }

socklen_t addr_len(const sockaddr* a) {
  if (a == nullptr) return 0;
  if (a->sa_family == AF_INET) return sizeof(sockaddr_in);
  if (a->sa_family == AF_INET6) return sizeof(sockaddr_in6);
  return 0;  // AF_IB and the rest: droce has IP addresses only
}

void to_cm_addr(CmAddr& out, const sockaddr* a) {
  std::memset(&out, 0, sizeof(out));
  if (socklen_t n = addr_len(a)) std::memcpy(out.bytes, a, n);
}

// The id's addresses and device from what droced reports.
int apply_info(FId* f, const CmIdInfo& info) {
  sockaddr_storage s, d;
  static_assert(sizeof(CmAddr) == sizeof(sockaddr_storage));
  std::memcpy(&s, info.src.bytes, sizeof(s));
  std::memcpy(&d, info.dst.bytes, sizeof(d));
  if (s.ss_family == AF_INET || s.ss_family == AF_INET6) f->id.route.addr.src_storage = s;
  if (d.ss_family == AF_INET || d.ss_family == AF_INET6) f->id.route.addr.dst_storage = d;
  f->id.route.addr.addr.ibaddr.sgid = info.sgid;
  f->id.route.addr.addr.ibaddr.dgid = info.dgid;
  f->id.route.addr.addr.ibaddr.pkey = htons(info.pkey);
  if (info.dev != kNoDev && f->dev == nullptr) {
    CmDevice* dev = get_device(info.dev);
    if (dev == nullptr) return -(errno ? errno : ENODEV);
    f->dev = dev;
    f->id.verbs = dev->verbs;
    if (f->id.pd == nullptr) f->id.pd = dev->pd;
  }
  if (info.dev != kNoDev) f->id.port_num = static_cast<uint8_t>(info.port_num ? info.port_num : 1);
  return 0;
}

int query_id(FId* f) {
  CmIdInfo info{};
  if (int rc = call<Op::CmQueryId>(HandleReq{f->handle}, info)) return rc;
  return apply_info(f, info);
}

// The route as a path record (RoCE: no SA; GIDs, P_Key and the port's MTU).
void set_path(FId* f) {
  ibv_sa_path_rec& p = f->path;
  std::memset(&p, 0, sizeof(p));
  p.dgid = f->id.route.addr.addr.ibaddr.dgid;
  p.sgid = f->id.route.addr.addr.ibaddr.sgid;
  p.pkey = f->id.route.addr.addr.ibaddr.pkey;
  p.hop_limit = 64;
  p.reversible = 1;
  p.numb_path = 1;
  p.mtu_selector = 2;  // exactly
  p.mtu = f->dev ? f->dev->active_mtu : static_cast<uint8_t>(IBV_MTU_1024);
  f->id.route.path_rec = &p;
  f->id.route.num_paths = 1;
}

// ---- QP moves (the program's QP, through the drop-in libibverbs) ------------

int init_qp_attr(FId* f, ibv_qp_attr* attr, int* mask) {
  CmInitQpAttrReq req{f->handle, static_cast<uint32_t>(attr->qp_state)};
  CmInitQpAttrResp r{};
  if (int rc = call<Op::CmInitQpAttr>(req, r)) return status(rc);
  *attr = r.attr;
  *mask = static_cast<int>(r.mask);
  return 0;
}

int modify(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  int rc = ibv_modify_qp(qp, a, mask);
  return rc ? fail(rc) : 0;
}

int modify_qp_rtr(FId* f, uint8_t resp_res) {
  ibv_qp* qp = f->id.qp;
  if (qp == nullptr) return 0;
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT;  // INIT -> INIT first: attributes may have changed since create
  if (init_qp_attr(f, &a, &mask) || modify(qp, &a, mask)) return -1;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (init_qp_attr(f, &a, &mask)) return -1;
  if (resp_res != RDMA_MAX_RESP_RES) a.max_dest_rd_atomic = resp_res;
  return modify(qp, &a, mask);
}

int modify_qp_rts(FId* f, uint8_t init_depth) {
  ibv_qp* qp = f->id.qp;
  if (qp == nullptr) return 0;
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_RTS;
  if (init_qp_attr(f, &a, &mask)) return -1;
  if (init_depth != RDMA_MAX_INIT_DEPTH) a.max_rd_atomic = init_depth;
  return modify(qp, &a, mask);
}

int modify_qp_err(FId* f) {
  if (f->id.qp == nullptr) return 0;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  return modify(f->id.qp, &a, IBV_QP_STATE);
}

// The active side's CONNECT_RESPONSE: QP to RTR and RTS, then RTU.
int process_conn_resp(FId* f) {
  int e = 0;
  if (modify_qp_rtr(f, RDMA_MAX_RESP_RES) || modify_qp_rts(f, RDMA_MAX_INIT_DEPTH)) {
    e = errno;
  } else {
    Empty em;
    if (int rc = call<Op::CmEstablish>(HandleReq{f->handle}, em)) e = -rc;
  }
  if (e == 0) return 0;
  modify_qp_err(f);
  return fail(e);
}

// ---- events ------------------------------------------------------------------

void copy_conn(FEvent* e, const CmConnParam& p) {
  rdma_conn_param& c = e->ev.param.conn;
  size_t n = std::min<size_t>(p.private_data_len, sizeof(p.private_data));
  c.private_data_len = static_cast<uint8_t>(n);
  c.private_data = nullptr;
  if (n) {
    std::memcpy(e->private_data, p.private_data, n);
    c.private_data = e->private_data;
  }
  c.responder_resources = p.responder_resources;
  c.initiator_depth = p.initiator_depth;
  c.flow_control = p.flow_control;
  c.retry_count = p.retry_count;
  c.rnr_retry_count = p.rnr_retry_count;
  c.srq = p.srq;
  c.qp_num = p.qp_num;
}

void copy_ud(FEvent* e, const CmEventResp& r) {
  rdma_ud_param& u = e->ev.param.ud;
  size_t n = std::min<size_t>(r.param.private_data_len, sizeof(r.param.private_data));
  u.private_data_len = static_cast<uint8_t>(n);
  u.private_data = nullptr;
  if (n) {
    std::memcpy(e->private_data, r.param.private_data, n);
    u.private_data = e->private_data;
  }
  u.ah_attr = r.ah_attr;
  u.qp_num = r.ud_qp_num;
  u.qkey = r.ud_qkey;
}

int do_migrate(FId* f, rdma_event_channel* channel);

// A CONNECT_REQUEST: the new id droced created (already on the listener's
// channel). Returns it with the program's reference, or nullptr (the new id
// is then destroyed in droced).
FId* new_conn_id(FId* listener, const CmEventResp& r) {
  FId* f = alloc_id(listener->id.channel, listener->id.context, listener->id.ps, listener->id.qp_type);
  if (f == nullptr) {
    Empty e;
    call<Op::CmDestroyId>(HandleReq{r.id}, e);
    return nullptr;
  }
  f->handle = r.id;
  f->responder_resources = r.param.responder_resources;
  f->initiator_depth = r.param.initiator_depth;
  insert_id(f);
  int rc = apply_info(f, r.info);
  if (rc == 0 && f->dev == nullptr) rc = query_id(f);
  if (rc == 0 && f->dev == nullptr) rc = -ENODEV;
  if (rc == 0 && listener->sync) rc = do_migrate(f, nullptr) ? -errno : 0;
  if (rc != 0) {
    rdma_destroy_id(&f->id);
    return nullptr;
  }
  set_path(f);
  return f;
}

const char* const kEventNames[] = {
    "RDMA_CM_EVENT_ADDR_RESOLVED",    "RDMA_CM_EVENT_ADDR_ERROR",       "RDMA_CM_EVENT_ROUTE_RESOLVED",
    "RDMA_CM_EVENT_ROUTE_ERROR",      "RDMA_CM_EVENT_CONNECT_REQUEST",  "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",    "RDMA_CM_EVENT_UNREACHABLE",      "RDMA_CM_EVENT_REJECTED",
    "RDMA_CM_EVENT_ESTABLISHED",      "RDMA_CM_EVENT_DISCONNECTED",     "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",   "RDMA_CM_EVENT_MULTICAST_ERROR",  "RDMA_CM_EVENT_ADDR_CHANGE",
    "RDMA_CM_EVENT_TIMEWAIT_EXIT",    "RDMA_CM_EVENT_ADDRINFO_RESOLVED", "RDMA_CM_EVENT_ADDRINFO_ERROR"};

// Turns droced's event into the program's. Returns the event, or nullptr
// when it is to be skipped (its id is gone, or it is the aftermath of a
// CONNECT_ERROR reported already).
FEvent* process_event(const CmEventResp& r) {
  FId* f = nullptr;
  FId* listener = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mu);
    uint32_t key = r.event == RDMA_CM_EVENT_CONNECT_REQUEST ? r.listen_id : r.id;
    auto it = g_ids.find(key);
    if (it != g_ids.end()) {
      it->second->refs++;  // held while we work on it
      (r.event == RDMA_CM_EVENT_CONNECT_REQUEST ? listener : f) = it->second;
    }
  }
  if (r.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
    if (listener == nullptr) {  // the listener was destroyed meanwhile
      Empty e;
      call<Op::CmDestroyId>(HandleReq{r.id}, e);
      return nullptr;
    }
    f = new_conn_id(listener, r);
    if (f == nullptr) {
      unref(listener);
      return nullptr;
    }
    std::lock_guard<std::mutex> g(g_mu);
    f->refs++;  // the event's
  }
  if (f == nullptr) return nullptr;
  auto* e = static_cast<FEvent*>(calloc(1, sizeof(FEvent)));
  if (e == nullptr) {
    if (listener) unref(listener);
    unref(f);
    return nullptr;
  }
  e->owner = f;
  e->listener = listener;
  e->ev.id = &f->id;
  e->ev.listen_id = listener ? &listener->id : nullptr;
  e->ev.event = static_cast<rdma_cm_event_type>(r.event);
  e->ev.status = r.status;
  bool skip = false;
  switch (r.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: {
      int rc = query_id(f);
      if (rc == 0 && f->dev == nullptr) rc = -ENODEV;
      if (rc != 0) {
        e->ev.event = RDMA_CM_EVENT_ADDR_ERROR;
        e->ev.status = rc;
      }
      break;
    }
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      int rc = query_id(f);
      if (rc != 0) {
        e->ev.event = RDMA_CM_EVENT_ROUTE_ERROR;
        e->ev.status = rc;
      } else {
        set_path(f);
      }
      break;
    }
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      if (is_ud(f)) copy_ud(e, r); else copy_conn(e, r.param);
      break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      copy_conn(e, r.param);
      if (f->id.qp != nullptr) {
        if (process_conn_resp(f) == 0) {
          e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
        } else {
          // Reject the REP. droced may refuse CmReject on an active id;
          // the REJ then goes out when the program destroys the id.
          int err = errno;
          CmRejectReq rj{};
          rj.id = f->handle;
          Empty em;
          call<Op::CmReject>(rj, em);
          e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
          e->ev.status = -err;
          f->connect_error = true;
        }
      }
      break;
    case RDMA_CM_EVENT_ESTABLISHED:
      if (is_ud(f)) copy_ud(e, r); else copy_conn(e, r.param);
      break;
    case RDMA_CM_EVENT_REJECTED:
      if (f->connect_error) { skip = true; break; }
      copy_conn(e, r.param);
      modify_qp_err(f);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      if (f->connect_error) { skip = true; break; }
      copy_conn(e, r.param);
      break;
    case RDMA_CM_EVENT_MULTICAST_JOIN: {
      // As librdmacm: the group's context, and the id's QP attached now
      // (not for a send-only member); a failed attach is MULTICAST_ERROR.
      copy_ud(e, r);
      bool found = false;
      uint32_t flags = 0;
      {
        std::lock_guard<std::mutex> g(g_mu);
        for (McJoin& j : g_joins[f])
          if (std::memcmp(j.mgid.raw, r.ah_attr.grh.dgid.raw, 16) == 0) {
            found = true;
            flags = j.flags;
            e->ev.param.ud.private_data = j.context;
            e->ev.param.ud.private_data_len = 0;
          }
      }
      if (!found) {  // left before the event was read
        skip = true;
        break;
      }
      if (f->id.qp != nullptr && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
        const int rc = ibv_attach_mcast(f->id.qp, &r.ah_attr.grh.dgid, 0);
        if (rc != 0) {
          e->ev.event = RDMA_CM_EVENT_MULTICAST_ERROR;
          e->ev.status = -rc;
        } else {
          std::lock_guard<std::mutex> g(g_mu);
          for (McJoin& j : g_joins[f])
            if (std::memcmp(j.mgid.raw, r.ah_attr.grh.dgid.raw, 16) == 0) j.attached = true;
        }
      }
      break;
    }
    default:
      if (is_ud(f)) copy_ud(e, r); else copy_conn(e, r.param);
      break;
  }
  if (skip) {
    free(e);
    unref(f);
    return nullptr;
  }
  return e;  // keeps the references taken above (the event's)
}

// Sync ids: wait for the event the last call produced and return its status.
int complete(FId* f) {
  if (!f->sync) return 0;
  if (f->id.event) {
    rdma_ack_cm_event(f->id.event);
    f->id.event = nullptr;
  }
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(f->id.channel, &ev)) return -1;
  f->id.event = ev;
  if (ev->status) {
    if (ev->event == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
    return fail(ev->status < 0 ? -ev->status : ev->status);
  }
  return 0;
}

int do_migrate(FId* f, rdma_event_channel* channel) {
  if (f->sync && channel == nullptr) return fail(EINVAL);
  bool sync = channel == nullptr;
  if (sync) {
    FChannel* c = create_channel();
    if (c == nullptr) return -1;
    channel = &c->ch;
  }
  CmMigrateIdReq req{f->handle, chan_of(channel)->handle};
  Empty e;
  if (int rc = call<Op::CmMigrateId>(req, e)) {
    if (sync) destroy_channel(chan_of(channel));
    return status(rc);
  }
  if (f->sync) {
    if (f->id.event) {
      rdma_ack_cm_event(f->id.event);
      f->id.event = nullptr;
    }
    destroy_channel(chan_of(f->id.channel));
  }
  f->sync = sync;
  f->id.channel = channel;
  return 0;
}

int create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps,
              ibv_qp_type qp_type) {
  if (out == nullptr) return fail(EINVAL);
  if (qp_type != IBV_QPT_RC && qp_type != IBV_QPT_UC && qp_type != IBV_QPT_UD) return fail(EINVAL);
  bool sync = channel == nullptr;
  if (sync) {
    FChannel* c = create_channel();
    if (c == nullptr) return -1;
    channel = &c->ch;
  }
  FId* f = alloc_id(channel, context, ps, qp_type);
  if (f == nullptr) {
    if (sync) destroy_channel(chan_of(channel));
    return fail(ENOMEM);
  }
  f->sync = sync;
  CmCreateIdReq req{chan_of(channel)->handle, static_cast<uint32_t>(ps), static_cast<uint32_t>(qp_type), 0};
  HandleResp r{};
  if (int rc = call<Op::CmCreateId>(req, r)) {
    if (sync) destroy_channel(chan_of(channel));
    free_id(f);
    return status(rc);
  }
  f->handle = r.handle;
  insert_id(f);
  *out = &f->id;
  return 0;
}

void destroy_cqs(rdma_cm_id* id) {
  if (id->recv_cq) {
    ibv_destroy_cq(id->recv_cq);
    if (id->send_cq && id->send_cq != id->recv_cq) ibv_destroy_cq(id->send_cq);
  } else if (id->send_cq) {
    ibv_destroy_cq(id->send_cq);
  }
  id->recv_cq = id->send_cq = nullptr;
  if (id->recv_cq_channel) {
    ibv_destroy_comp_channel(id->recv_cq_channel);
    if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
      ibv_destroy_comp_channel(id->send_cq_channel);
  } else if (id->send_cq_channel) {
    ibv_destroy_comp_channel(id->send_cq_channel);
  }
  id->recv_cq_channel = id->send_cq_channel = nullptr;
}

int create_cqs(rdma_cm_id* id, uint32_t send_size, uint32_t recv_size) {
  if (recv_size) {
    if (!(id->recv_cq_channel = ibv_create_comp_channel(id->verbs))) goto err;
    if (!(id->recv_cq = ibv_create_cq(id->verbs, static_cast<int>(recv_size), id, id->recv_cq_channel, 0))) goto err;
  }
  if (send_size) {
    if (!(id->send_cq_channel = ibv_create_comp_channel(id->verbs))) goto err;
    if (!(id->send_cq = ibv_create_cq(id->verbs, static_cast<int>(send_size), id, id->send_cq_channel, 0))) goto err;
  }
  return 0;
err:
  int e = errno ? errno : ENOMEM;
  destroy_cqs(id);
  return fail(e);
}

// RTR/RTS of a UD QP need no peer.
int init_ud_qp(FId* f, ibv_qp* qp) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT;
  if (init_qp_attr(f, &a, &mask) || modify(qp, &a, mask)) return -1;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  if (modify(qp, &a, IBV_QP_STATE)) return -1;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  return modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

int init_conn_qp(FId* f, ibv_qp* qp) {
  ibv_qp_attr a{};
  int mask = 0;
  a.qp_state = IBV_QPS_INIT;
  if (init_qp_attr(f, &a, &mask)) return -1;
  return modify(qp, &a, mask);
}

bool valid_param(FId* f, const rdma_conn_param* p) {
  if (f->id.ps != RDMA_PS_TCP) return true;
  if (f->id.qp == nullptr && p == nullptr) return false;
  if (p == nullptr || f->dev == nullptr) return true;
  if (p->responder_resources != RDMA_MAX_RESP_RES && p->responder_resources > f->dev->max_resp_res) return false;
  if (p->initiator_depth != RDMA_MAX_INIT_DEPTH && p->initiator_depth > f->dev->max_init_depth) return false;
  return true;
}

// rdma_conn_param -> the protocol's (private data copied in).
int fill_param(FId* f, CmConnParam& d, const rdma_conn_param* s, uint32_t qp_num, uint8_t srq) {
  d = {};
  d.qp_num = qp_num;
  d.srq = srq;
  d.responder_resources = f->responder_resources;
  d.initiator_depth = f->initiator_depth;
  d.qkey = is_ud(f) ? kUdpQkey : 0;
  size_t n = f->connect_len;
  std::memcpy(d.private_data, f->connect_data, n);
  if (s) {
    d.flow_control = s->flow_control;
    d.retry_count = s->retry_count;
    d.rnr_retry_count = s->rnr_retry_count;
    if (s->private_data && s->private_data_len) {
      if (n + s->private_data_len > sizeof(d.private_data)) return EINVAL;
      std::memcpy(d.private_data + n, s->private_data, s->private_data_len);
      n += s->private_data_len;
    }
  } else {
    d.retry_count = 7;
    d.rnr_retry_count = 7;
  }
  d.private_data_len = static_cast<uint8_t>(n);
  return 0;
}

bool conn_gone(int rc) { return rc == -ECONNRESET || rc == -EPIPE || rc == -ENOTCONN || rc == -ENODEV; }

}  // namespace

// ---- the exported API -----------------------------------------------------------

DROCE_EXPORT rdma_event_channel* rdma_create_event_channel(void) {
  FChannel* c = create_channel();
  return c ? &c->ch : nullptr;
}

DROCE_EXPORT void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (channel != nullptr) destroy_channel(chan_of(channel));
}

DROCE_EXPORT int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  ibv_qp_type t = (ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP) ? IBV_QPT_UD : IBV_QPT_RC;
  return create_id(channel, id, context, ps, t);
}

DROCE_EXPORT int rdma_destroy_id(rdma_cm_id* id) {
  if (id == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  Empty e;
  int rc = call<Op::CmDestroyId>(HandleReq{f->handle}, e);
  if (rc != 0 && !conn_gone(rc)) return status(rc);
  if (id->event) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_ids.find(f->handle);
    if (it != g_ids.end() && it->second == f) g_ids.erase(it);
  }
  {
    // As librdmacm: block until every event reported for the id is acked
    // (droced has dropped the ones not yet read). A program's cm thread is
    // then past its last event before the channel goes.
    std::unique_lock<std::mutex> g(g_mu);
    g_unref.wait(g, [f] { return f->reported == 0; });
  }
  if (f->sync) destroy_channel(chan_of(id->channel));
  id->channel = nullptr;
  unref(f);  // the program's reference: freed now
  return 0;
}

DROCE_EXPORT int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr_len(addr) == 0) return fail(EINVAL);
  FId* f = fid_of(id);
  CmAddrReq req{};
  req.id = f->handle;
  to_cm_addr(req.addr, addr);
  CmIdInfo info{};
  if (int rc = call<Op::CmBindAddr>(req, info)) return status(rc);
  return status(apply_info(f, info));
}

DROCE_EXPORT int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  if (id == nullptr || addr_len(dst_addr) == 0 || (src_addr && addr_len(src_addr) == 0)) return fail(EINVAL);
  FId* f = fid_of(id);
  CmResolveAddrReq req{};
  req.id = f->handle;
  req.timeout_ms = timeout_ms > 0 ? static_cast<uint32_t>(timeout_ms) : 0;
  if (src_addr) to_cm_addr(req.src, src_addr);
  to_cm_addr(req.dst, dst_addr);
  Empty e;
  if (int rc = call<Op::CmResolveAddr>(req, e)) return status(rc);
  std::memcpy(&id->route.addr.dst_storage, dst_addr, addr_len(dst_addr));
  return complete(f);
}

DROCE_EXPORT int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (id == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  CmIdTimeoutReq req{f->handle, timeout_ms > 0 ? static_cast<uint32_t>(timeout_ms) : 0};
  Empty e;
  if (int rc = call<Op::CmResolveRoute>(req, e)) return status(rc);
  return complete(f);
}

DROCE_EXPORT int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (id == nullptr || qp_attr == nullptr || qp_attr_mask == nullptr) return fail(EINVAL);
  return init_qp_attr(fid_of(id), qp_attr, qp_attr_mask);
}

DROCE_EXPORT int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr || id->qp != nullptr || id->verbs == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = id->pd;
  } else if (attr->pd->context != id->verbs) {
    return fail(EINVAL);
  }
  if (attr->pd == nullptr) return fail(EINVAL);
  // The drop-in's ibv_create_qp_ex takes send ops (an ibv_qp_ex: ibv_wr_*) and
  // the create-flags mask with no flag set; no XRC (EOPNOTSUPP, as it answers).
  constexpr uint32_t kMask =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (attr->comp_mask & ~kMask) return fail(EOPNOTSUPP);
  if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
      (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
    return fail(EINVAL);
  if (create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
                 attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
    return -1;
  if (!attr->send_cq) attr->send_cq = id->send_cq;
  if (!attr->recv_cq) attr->recv_cq = id->recv_cq;
  if (id->srq && !attr->srq) attr->srq = id->srq;
  // verbs.h's ibv_create_qp_ex: ibv_create_qp for PD alone, else the context's create_qp_ex.
  ibv_qp* qp = ibv_create_qp_ex(id->verbs, attr);
  if (qp == nullptr) {
    int e = errno ? errno : ENOMEM;
    destroy_cqs(id);
    return fail(e);
  }
  if (is_ud(f) ? init_ud_qp(f, qp) : init_conn_qp(f, qp)) {
    int e = errno;
    ibv_destroy_qp(qp);
    destroy_cqs(id);
    return fail(e);
  }
  id->pd = qp->pd;
  id->qp = qp;
  return 0;
}

DROCE_EXPORT int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || qp_init_attr == nullptr) return fail(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd ? pd : id->pd;
  int rc = rdma_create_qp_ex(id, &ex);
  std::memcpy(qp_init_attr, &ex, sizeof(*qp_init_attr));
  return rc;
}

DROCE_EXPORT void rdma_destroy_qp(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->qp) ibv_destroy_qp(id->qp);
  id->qp = nullptr;
  destroy_cqs(id);
}

DROCE_EXPORT int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (id == nullptr || attr == nullptr || id->verbs == nullptr) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr) {
    attr->pd = id->pd;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
  }
  // Basic SRQs only (no XRC on droce).
  if (attr->srq_type != IBV_SRQT_BASIC ||
      (attr->comp_mask & ~static_cast<uint32_t>(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE)))
    return fail(EOPNOTSUPP);
  ibv_srq* srq = ibv_create_srq(attr->pd, reinterpret_cast<ibv_srq_init_attr*>(attr));
  if (srq == nullptr) return fail(errno ? errno : ENOMEM);
  if (!id->pd) id->pd = attr->pd;
  id->srq = srq;
  return 0;
}

DROCE_EXPORT int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (id == nullptr || attr == nullptr) return fail(EINVAL);
  ibv_srq_init_attr_ex ex{};
  std::memcpy(&ex, attr, sizeof(*attr));
  ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
  ex.srq_type = IBV_SRQT_BASIC;
  ex.pd = pd;
  int rc = rdma_create_srq_ex(id, &ex);
  std::memcpy(attr, &ex, sizeof(*attr));
  return rc;
}

DROCE_EXPORT void rdma_destroy_srq(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->srq) ibv_destroy_srq(id->srq);
  id->srq = nullptr;
  destroy_cqs(id);
}

DROCE_EXPORT int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (id == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  if (!valid_param(f, conn_param)) return fail(EINVAL);
  uint8_t max_init = f->dev ? f->dev->max_init_depth : 0, max_resp = f->dev ? f->dev->max_resp_res : 0;
  f->initiator_depth = conn_param && conn_param->initiator_depth != RDMA_MAX_INIT_DEPTH ? conn_param->initiator_depth
                                                                                         : max_init;
  f->responder_resources =
      conn_param && conn_param->responder_resources != RDMA_MAX_RESP_RES ? conn_param->responder_resources : max_resp;
  uint32_t qp_num = conn_param ? conn_param->qp_num : 0;
  uint8_t srq = conn_param ? conn_param->srq : 0;
  if (id->qp) {
    qp_num = id->qp->qp_num;
    srq = id->qp->srq != nullptr;
  }
  CmConnParamReq req{};
  req.id = f->handle;
  if (fill_param(f, req.param, conn_param, qp_num, srq)) return fail(EINVAL);
  Empty e;
  if (int rc = call<Op::CmConnect>(req, e)) return status(rc);
  f->connect_len = 0;
  return complete(f);
}

DROCE_EXPORT int rdma_listen(rdma_cm_id* id, int backlog) {
  if (id == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  CmListenReq req{f->handle, backlog > 0 ? static_cast<uint32_t>(backlog) : 0};
  Empty e;
  if (int rc = call<Op::CmListen>(req, e)) return status(rc);
  return status(query_id(f));
}

DROCE_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (listen == nullptr || id == nullptr) return fail(EINVAL);
  FId* l = fid_of(listen);
  if (!l->sync) return fail(EINVAL);
  if (listen->event) {
    rdma_ack_cm_event(listen->event);
    listen->event = nullptr;
  }
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(listen->channel, &ev)) return -1;
  int err = 0;
  if (ev->event == RDMA_CM_EVENT_REJECTED)
    err = ECONNREFUSED;
  else if (ev->status)
    err = ev->status < 0 ? -ev->status : ev->status;
  else if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
    err = EINVAL;
  if (err == 0 && l->qp_init_attr) {
    ibv_qp_init_attr attr = *l->qp_init_attr;
    if (rdma_create_qp(ev->id, listen->pd, &attr)) err = errno;
  }
  if (err) {
    listen->event = ev;
    return fail(err);
  }
  *id = ev->id;
  (*id)->event = ev;
  return 0;
}

DROCE_EXPORT int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (id == nullptr || (id->qp == nullptr && conn_param == nullptr)) return fail(EINVAL);
  FId* f = fid_of(id);
  if (!valid_param(f, conn_param)) return fail(EINVAL);
  uint8_t max_init = f->dev ? f->dev->max_init_depth : 0, max_resp = f->dev ? f->dev->max_resp_res : 0;
  if (!conn_param || conn_param->initiator_depth == RDMA_MAX_INIT_DEPTH)
    f->initiator_depth = std::min(f->initiator_depth, max_init);
  else
    f->initiator_depth = conn_param->initiator_depth;
  if (!conn_param || conn_param->responder_resources == RDMA_MAX_RESP_RES)
    f->responder_resources = std::min(f->responder_resources, max_resp);
  else
    f->responder_resources = conn_param->responder_resources;
  if (!is_ud(f)) {
    if (modify_qp_rtr(f, f->responder_resources) || modify_qp_rts(f, f->initiator_depth)) return -1;
  }
  uint32_t qp_num = id->qp ? id->qp->qp_num : conn_param->qp_num;
  uint8_t srq = id->qp ? id->qp->srq != nullptr : conn_param->srq;
  CmConnParamReq req{};
  req.id = f->handle;
  if (fill_param(f, req.param, conn_param, qp_num, srq)) return fail(EINVAL);
  Empty e;
  if (int rc = call<Op::CmAccept>(req, e)) {
    modify_qp_err(f);
    return status(rc);
  }
  if (is_ud(f)) {
    if (f->sync && id->event) {
      rdma_ack_cm_event(id->event);
      id->event = nullptr;
    }
    return 0;
  }
  return complete(f);
}

static int reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  if (id == nullptr) return fail(EINVAL);
  CmRejectReq req{};
  req.id = fid_of(id)->handle;
  if (private_data && private_data_len) {
    if (private_data_len > sizeof(req.private_data)) return fail(EINVAL);
    std::memcpy(req.private_data, private_data, private_data_len);
    req.private_data_len = private_data_len;
  }
  Empty e;
  return status(call<Op::CmReject>(req, e));
}

DROCE_EXPORT int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject(id, private_data, private_data_len);
}

// No ECE on droce: the REJ carries the consumer reason as rdma_reject's.
DROCE_EXPORT int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return reject(id, private_data, private_data_len);
}

// droced's CM establishes a passive connection on the first packet of its
// QP by itself (lib/cm/README.md), so IBV_EVENT_COMM_EST needs nothing more.
DROCE_EXPORT int rdma_notify(rdma_cm_id* id, ibv_event_type event) {
  if (id == nullptr) return fail(EINVAL);
  (void)event;
  return 0;
}

DROCE_EXPORT int rdma_disconnect(rdma_cm_id* id) {
  if (id == nullptr || id->verbs == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  if (modify_qp_err(f)) return -1;
  Empty e;
  if (int rc = call<Op::CmDisconnect>(HandleReq{f->handle}, e)) return status(rc);
  return complete(f);
}

DROCE_EXPORT int rdma_establish(rdma_cm_id* id) {
  if (id == nullptr || id->qp != nullptr) return fail(EINVAL);
  Empty e;
  return status(call<Op::CmEstablish>(HandleReq{fid_of(id)->handle}, e));
}

DROCE_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (channel == nullptr || event == nullptr) return fail(EINVAL);
  FChannel* c = chan_of(channel);
  ChannelReader reader(c);
  // Each pass consumes one count of the eventfd; a count whose event droced
  // dropped since (its id destroyed) answers -EAGAIN and we wait for the next.
  // Once the channel is destroyed under us nothing writes the eventfd again:
  // a blocking read waits for the process to end, as a read of ucma would.
  for (;;) {
    uint64_t v = 0;
    ssize_t n = ::read(c->ch.fd, &v, sizeof(v));
    if (n < 0) return -1;  // EAGAIN on a non-blocking channel; EINTR on a signal, as librdmacm
    if (n != sizeof(v)) return fail(EIO);
    if (reader.destroyed()) continue;
    CmEventResp r{};
    int rc = call<Op::CmGetEvent>(HandleReq{c->handle}, r);
    if (rc == -EAGAIN || reader.destroyed()) continue;  // droced forgot the channel: -EBADF
    if (rc != 0) return status(rc);
    FEvent* e = process_event(r);
    if (e == nullptr) continue;
    {
      std::lock_guard<std::mutex> g(g_mu);
      (e->listener ? e->listener : e->owner)->reported++;
    }
    *event = &e->ev;
    return 0;
  }
}

DROCE_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  if (event == nullptr) return fail(EINVAL);
  auto* e = reinterpret_cast<FEvent*>(event);
  bool dead_owner = false, dead_listener = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    FId* rep = e->listener ? e->listener : e->owner;
    if (rep && rep->reported > 0) rep->reported--;
    if (e->owner) dead_owner = unref_locked(e->owner);
    if (e->listener) dead_listener = unref_locked(e->listener);
  }
  g_unref.notify_all();
  if (dead_owner) free_id(e->owner);
  if (dead_listener) free_id(e->listener);
  free(e);
  return 0;
}

DROCE_EXPORT const char* rdma_event_str(rdma_cm_event_type event) {
  auto i = static_cast<size_t>(event);
  return i < sizeof(kEventNames) / sizeof(kEventNames[0]) ? kEventNames[i] : "UNKNOWN EVENT";
}

// The options ucma accepts for an IP id are taken and validated; droced's CM
// has no per-id options, so they do not change what goes on the wire.
DROCE_EXPORT int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (id == nullptr || optval == nullptr) return fail(EINVAL);
  if (level != RDMA_OPTION_ID) return fail(ENOSYS);  // RDMA_OPTION_IB (path records): IB only
  switch (optname) {
    case RDMA_OPTION_ID_TOS:
    case RDMA_OPTION_ID_ACK_TIMEOUT:
      return optlen == sizeof(uint8_t) ? 0 : fail(EINVAL);
    case RDMA_OPTION_ID_REUSEADDR:
    case RDMA_OPTION_ID_AFONLY:
      return optlen == sizeof(int) ? 0 : fail(EINVAL);
    default:
      return fail(ENOSYS);
  }
}

DROCE_EXPORT int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (id == nullptr) return fail(EINVAL);
  return do_migrate(fid_of(id), channel);
}

DROCE_EXPORT __be16 rdma_get_src_port(rdma_cm_id* id) {
  const sockaddr* a = &id->route.addr.src_addr;
  if (a->sa_family == AF_INET) return id->route.addr.src_sin.sin_port;
  if (a->sa_family == AF_INET6) return id->route.addr.src_sin6.sin6_port;
  return 0;
}

DROCE_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* id) {
  const sockaddr* a = &id->route.addr.dst_addr;
  if (a->sa_family == AF_INET) return id->route.addr.dst_sin.sin_port;
  if (a->sa_family == AF_INET6) return id->route.addr.dst_sin6.sin6_port;
  return 0;
}

DROCE_EXPORT ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices) *num_devices = 0;
  ListDevicesResp list{};
  if (int rc = call<Op::ListDevices>({}, list)) {
    errno = -rc;
    return nullptr;
  }
  uint32_t n = std::min(list.count, kMaxDevices);
  auto** out = static_cast<ibv_context**>(calloc(n + 1, sizeof(ibv_context*)));
  if (out == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  int k = 0;
  for (uint32_t i = 0; i < n; i++) {
    CmDevice* d = get_device(list.dev[i].index);
    if (d != nullptr) out[k++] = d->verbs;
  }
  if (num_devices) *num_devices = k;
  return out;
}

DROCE_EXPORT void rdma_free_devices(ibv_context** list) { free(list); }

// ---- multicast and ECE -----------------------------------------------------------

// UD multicast (README: Multicast). The MGID of a group address as Linux's
// cma makes it on RoCEv2: IPv4 a.b.c.d -> ::ffff:a.b.c.d, IPv6 as is. False
// when the address is not a multicast one.
static bool mgid_of(const sockaddr* a, ibv_gid& g) {
  std::memset(g.raw, 0, 16);
  if (a->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    g.raw[10] = g.raw[11] = 0xff;
    std::memcpy(g.raw + 12, &in->sin_addr, 4);
    return (g.raw[12] & 0xF0) == 0xE0;
  }
  if (a->sa_family == AF_INET6) {
    std::memcpy(g.raw, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
    return g.raw[0] == 0xff;
  }
  return false;
}

DROCE_EXPORT int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
  if (id == nullptr || attr == nullptr) return fail(EINVAL);
  constexpr uint32_t kKnown = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  if ((attr->comp_mask & ~kKnown) || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) return fail(EINVAL);
  const uint32_t flags = (attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ? uint32_t{attr->join_flags}
                                                                             : uint32_t{RDMA_MC_JOIN_FLAG_FULLMEMBER};
  if (flags >= RDMA_MC_JOIN_FLAG_RESERVED) return fail(EINVAL);
  if (attr->addr == nullptr || addr_len(attr->addr) == 0) return fail(EINVAL);
  FId* f = fid_of(id);
  if (!is_ud(f)) return fail(EINVAL);
  McJoin j{};
  if (!mgid_of(attr->addr, j.mgid)) return fail(EINVAL);
  j.context = context;
  j.flags = flags;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto& v = g_joins[f];
    for (const McJoin& o : v)
      if (std::memcmp(o.mgid.raw, j.mgid.raw, 16) == 0) return fail(EADDRINUSE);
    v.push_back(j);
  }
  CmJoinReq req{};
  req.id = f->handle;
  req.join_flags = flags;
  to_cm_addr(req.addr, attr->addr);
  Empty e;
  if (int rc = call<Op::CmJoinMulticast>(req, e)) {
    std::lock_guard<std::mutex> g(g_mu);
    std::erase_if(g_joins[f], [&](const McJoin& o) { return std::memcmp(o.mgid.raw, j.mgid.raw, 16) == 0; });
    return status(rc);
  }
  return complete(f);
}

DROCE_EXPORT int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  rdma_cm_join_mc_attr_ex a{};
  a.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  a.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  a.addr = addr;
  return rdma_join_multicast_ex(id, &a, context);
}

DROCE_EXPORT int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr == nullptr) return fail(EINVAL);
  FId* f = fid_of(id);
  ibv_gid mgid;
  if (!mgid_of(addr, mgid)) return fail(EINVAL);
  bool found = false, attached = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_joins.find(f);
    if (it != g_joins.end()) {
      auto& v = it->second;
      for (size_t i = 0; i < v.size(); ++i)
        if (std::memcmp(v[i].mgid.raw, mgid.raw, 16) == 0) {
          found = true;
          attached = v[i].attached;
          v.erase(v.begin() + static_cast<long>(i));
          break;
        }
    }
  }
  if (!found) return fail(EADDRNOTAVAIL);
  // A JOIN not read yet is skipped when it is (its group is gone).
  if (attached && id->qp != nullptr) {
    if (int rc = ibv_detach_mcast(id->qp, &mgid, 0)) return fail(rc);
  }
  return 0;
}

// No ECE on droce: the local options are validated as librdmacm does and not
// sent; the peer's read as zero (no vendor).
DROCE_EXPORT int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id == nullptr || id->qp != nullptr || ece == nullptr || ece->vendor_id == 0 || ece->comp_mask != 0)
    return fail(EINVAL);
  return 0;
}

DROCE_EXPORT int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (id == nullptr || id->qp != nullptr || ece == nullptr) return fail(EINVAL);
  *ece = {};
  return 0;
}

// ---- rdma_getaddrinfo ------------------------------------------------------------

namespace {
int copy_sa(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(malloc(len));
  if (*dst == nullptr) return fail(ENOMEM);
  std::memcpy(*dst, src, len);
  *dst_len = len;
  return 0;
}
}  // namespace

DROCE_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_connect);
    free(res->ai_route);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res);
    res = next;
  }
}

// Names through getaddrinfo(3) (numeric hosts included), as librdmacm
// without ibacm: the first address, RAI_PASSIVE to the source address.
// AF_IB is not offered. Errors of getaddrinfo are returned as its EAI_* code.
DROCE_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                                  rdma_addrinfo** res) {
  if (res == nullptr || (!service && !node && !hints)) return fail(EINVAL);
  static const rdma_addrinfo nohints{};
  const rdma_addrinfo* h = hints ? hints : &nohints;
  if ((h->ai_flags & RAI_FAMILY) && h->ai_family == AF_IB) return fail(EAFNOSUPPORT);
  auto* rai = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (rai == nullptr) return fail(ENOMEM);
  int ret = 0;
  if (node || service) {
    addrinfo aih{};
    if (h->ai_flags & RAI_PASSIVE) aih.ai_flags |= AI_PASSIVE;
    if (h->ai_flags & RAI_NUMERICHOST) aih.ai_flags |= AI_NUMERICHOST;
    aih.ai_family = h->ai_family;
    switch (h->ai_qp_type) {
      case IBV_QPT_RC: case IBV_QPT_UC: aih.ai_socktype = SOCK_STREAM; break;
      case IBV_QPT_UD: aih.ai_socktype = SOCK_DGRAM; break;
      default: break;
    }
    switch (h->ai_port_space) {
      case RDMA_PS_TCP: aih.ai_protocol = IPPROTO_TCP; break;
      case RDMA_PS_UDP: case RDMA_PS_IPOIB: aih.ai_protocol = IPPROTO_UDP; break;
      case RDMA_PS_IB:
        aih.ai_protocol = aih.ai_socktype == SOCK_STREAM ? IPPROTO_TCP : aih.ai_socktype == SOCK_DGRAM ? IPPROTO_UDP : 0;
        break;
      default: break;
    }
    addrinfo* ai = nullptr;
    ret = getaddrinfo(node, service, hints ? &aih : nullptr, &ai);
    if (ret != 0) {
      free(rai);
      return ret;
    }
    rai->ai_qp_type = h->ai_qp_type ? h->ai_qp_type
                      : ai->ai_socktype == SOCK_DGRAM ? static_cast<int>(IBV_QPT_UD)
                                                      : IBV_QPT_RC;
    rai->ai_port_space = h->ai_port_space ? h->ai_port_space
                         : ai->ai_protocol == IPPROTO_UDP ? static_cast<int>(RDMA_PS_UDP)
                                                          : RDMA_PS_TCP;
    rai->ai_family = ai->ai_family;
    if (ai->ai_flags & AI_PASSIVE) {
      rai->ai_flags = RAI_PASSIVE;
      if (ai->ai_canonname) rai->ai_src_canonname = strdup(ai->ai_canonname);
      ret = copy_sa(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
    } else {
      if (ai->ai_canonname) rai->ai_dst_canonname = strdup(ai->ai_canonname);
      ret = copy_sa(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
    }
    freeaddrinfo(ai);
  } else {
    rai->ai_flags = h->ai_flags;
    rai->ai_family = h->ai_family;
    rai->ai_qp_type = h->ai_qp_type;
    rai->ai_port_space = h->ai_port_space;
    if (h->ai_dst_len) ret = copy_sa(&rai->ai_dst_addr, &rai->ai_dst_len, h->ai_dst_addr, h->ai_dst_len);
  }
  if (ret == 0 && !rai->ai_src_len && h->ai_src_len)
    ret = copy_sa(&rai->ai_src_addr, &rai->ai_src_len, h->ai_src_addr, h->ai_src_len);
  if (ret != 0) {
    int e = errno;
    rdma_freeaddrinfo(rai);
    return fail(e);
  }
  *res = rai;
  return 0;
}

// ---- endpoints (rdma_verbs.h) ----------------------------------------------------

DROCE_EXPORT int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (id == nullptr || res == nullptr) return fail(EINVAL);
  rdma_cm_id* cm = nullptr;
  if (create_id(nullptr, &cm, nullptr, static_cast<rdma_port_space>(res->ai_port_space),
                static_cast<ibv_qp_type>(res->ai_qp_type)))
    return -1;
  FId* f = fid_of(cm);
  int ret = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    ret = rdma_bind_addr(cm, res->ai_src_addr);
    if (ret == 0) {
      if (pd) cm->pd = pd;
      if (qp_init_attr) {
        f->qp_init_attr = static_cast<ibv_qp_init_attr*>(malloc(sizeof(ibv_qp_init_attr)));
        if (f->qp_init_attr == nullptr) {
          ret = fail(ENOMEM);
        } else {
          *f->qp_init_attr = *qp_init_attr;
          f->qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
        }
      }
    }
  } else {
    ret = rdma_resolve_addr(cm, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (ret == 0) ret = rdma_resolve_route(cm, 2000);
    if (ret == 0 && qp_init_attr) {
      qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      ret = rdma_create_qp(cm, pd, qp_init_attr);
    }
    if (ret == 0 && res->ai_connect_len) {
      if (res->ai_connect_len > sizeof(f->connect_data)) {
        ret = fail(EINVAL);
      } else {
        std::memcpy(f->connect_data, res->ai_connect, res->ai_connect_len);
        f->connect_len = static_cast<uint8_t>(res->ai_connect_len);
      }
    }
  }
  if (ret != 0) {
    int e = errno;
    rdma_destroy_ep(cm);
    return fail(e);
  }
  *id = cm;
  return 0;
}

DROCE_EXPORT void rdma_destroy_ep(rdma_cm_id* id) {
  if (id == nullptr) return;
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) rdma_destroy_srq(id);
  rdma_destroy_id(id);
}

// ---- rsockets: not offered ----------------------------------------------------
// The symbols exist so that programs linking them load; every call fails with
// ENOSYS (README.md).

DROCE_EXPORT int rsocket(int, int, int) { return fail(ENOSYS); }
DROCE_EXPORT int rbind(int, const sockaddr*, socklen_t) { return fail(ENOSYS); }
DROCE_EXPORT int rlisten(int, int) { return fail(ENOSYS); }
DROCE_EXPORT int raccept(int, sockaddr*, socklen_t*) { return fail(ENOSYS); }
DROCE_EXPORT int rconnect(int, const sockaddr*, socklen_t) { return fail(ENOSYS); }
DROCE_EXPORT int rshutdown(int, int) { return fail(ENOSYS); }
DROCE_EXPORT int rclose(int) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rrecv(int, void*, size_t, int) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rrecvmsg(int, msghdr*, int) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rsend(int, const void*, size_t, int) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rsendmsg(int, const msghdr*, int) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rread(int, void*, size_t) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rreadv(int, const iovec*, int) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rwrite(int, const void*, size_t) { return fail(ENOSYS); }
DROCE_EXPORT ssize_t rwritev(int, const iovec*, int) { return fail(ENOSYS); }
DROCE_EXPORT int rpoll(pollfd*, nfds_t, int) { return fail(ENOSYS); }
DROCE_EXPORT int rselect(int, fd_set*, fd_set*, fd_set*, timeval*) { return fail(ENOSYS); }
DROCE_EXPORT int rgetpeername(int, sockaddr*, socklen_t*) { return fail(ENOSYS); }
DROCE_EXPORT int rgetsockname(int, sockaddr*, socklen_t*) { return fail(ENOSYS); }
DROCE_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return fail(ENOSYS); }
DROCE_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return fail(ENOSYS); }
DROCE_EXPORT int rfcntl(int, int, ...) { return fail(ENOSYS); }
DROCE_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return fail(ENOSYS); }
DROCE_EXPORT int riounmap(int, void*, size_t) { return fail(ENOSYS); }
DROCE_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = ENOSYS;
  return static_cast<size_t>(-1);
}

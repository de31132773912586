#include "shim/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "shim/cm_sessions.h"
#include "shim/ring.h"

namespace droce::shim {

using namespace proto;

const char* obj_kind_name(ObjKind k) {
  static const char* const names[] = {"pd", "mr", "channel", "cq", "srq", "qp", "ah", "mw"};
  auto i = static_cast<size_t>(k);
  return i < std::size(names) ? names[i] : "?";
}

namespace {
constexpr uint32_t kAllowedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                    IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING;
size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// A registered memory mapping in the daemon.
struct MrMap {
  void* addr = nullptr;
  size_t len = 0;
  bool locked = false;
  ~MrMap() {
    if (addr != nullptr) {
      if (locked) munlock(addr, len);
      munmap(addr, len);
    }
  }
};
}  // namespace

struct ShimServer::Client {
  int fd = -1;
  ClientInfo info{};
  bool opened = false;
  uint32_t next_handle = 1;
  uint64_t mr_bytes = 0;
  ibv_device_attr dev_attr{};
  struct Obj {
    ObjKind kind;
    ObjId id = 0;
    uint32_t refs = 0;           // objects that name this one
    uint32_t deps[4] = {};       // handles this one names (refs taken)
    ShmRegion region;            // rings of a CQ/SRQ/QP
    std::unique_ptr<MrMap> mr;   // MR mapping
    int eventfd = -1;            // channel
    ibv_qp_cap cap{};            // QP as created
    uint32_t qp_type = 0, sq_sig_all = 0;
    explicit Obj(ObjKind k) : kind(k) {}
    ~Obj() {
      if (eventfd >= 0) close(eventfd);
    }
  };
  std::map<uint32_t, std::unique_ptr<Obj>> objs;
  uint32_t count[static_cast<int>(ObjKind::Count_)] = {};  // objects of each kind (quotas)
  // A request parked while the backend resolves its address (backend.h):
  // the client's socket is not read until it is answered.
  std::vector<uint8_t> parked;
  std::chrono::steady_clock::time_point park_deadline{}, next_try{};
  int async_fd = -1;  // OpenAsync's eventfd (the client has its own copy)
  ShmRegion doorbell;  // OpenDoorbell's region (unmapped after the backend's client_gone)
  ~Client() {
    if (async_fd >= 0) ::close(async_fd);
  }
};

using Client = ShimServer::Client;
using Obj = ShimServer::Client::Obj;

// Request handlers. Each returns 0 or -errno, fills the response body and
// may attach fds (which the caller closes after sending when owned).
struct ServerOps {
  ShimServer& s;
  Client& c;
  int out_fds[2] = {-1, -1};
  int n_out_fds = 0;

  Obj* find(uint32_t h, ObjKind k) {
    auto it = c.objs.find(h);
    if (it == c.objs.end() || it->second->kind != k) return nullptr;
    return it->second.get();
  }
  uint32_t add(std::unique_ptr<Obj> o, std::initializer_list<uint32_t> deps) {
    uint32_t h = c.next_handle++;
    int i = 0;
    for (uint32_t d : deps) {
      if (d != 0) c.objs.at(d)->refs++;
      o->deps[i++] = d;
    }
    s.objects_[static_cast<int>(o->kind)]++;
    c.count[static_cast<int>(o->kind)]++;
    if (o->region.addr() != nullptr) s.mapped_bytes_ += o->region.size();
    if (o->mr) s.mapped_bytes_ += o->mr->len;
    c.objs.emplace(h, std::move(o));
    return h;
  }
  int room() {
    if (c.objs.size() >= s.cfg_.max_objects_per_client || c.next_handle == UINT32_MAX) return -ENOSPC;
    return 0;
  }
  // Room for one more object of kind k within the client's quota (server.h).
  int quota(ObjKind k) {
    if (int e = room()) return e;
    uint64_t limit = UINT64_MAX;
    switch (k) {
      case ObjKind::Qp: limit = s.cfg_.max_qps_per_client; break;
      case ObjKind::Cq: limit = s.cfg_.max_cqs_per_client; break;
      case ObjKind::Srq: limit = s.cfg_.max_srqs_per_client; break;
      case ObjKind::Mr: limit = s.cfg_.max_mrs_per_client; break;
      case ObjKind::Mw: limit = s.cfg_.max_mrs_per_client; break;
      case ObjKind::Ah: limit = s.cfg_.max_ahs_per_client; break;
      default: break;
    }
    if (c.count[static_cast<int>(k)] < limit) return 0;
    s.quota_refused_++;
    return -ENOMEM;
  }
  // Forgets an object after the backend destroyed it.
  void remove(uint32_t h) {
    auto it = c.objs.find(h);
    Obj& o = *it->second;
    for (uint32_t d : o.deps)
      if (d != 0) c.objs.at(d)->refs--;
    s.objects_[static_cast<int>(o.kind)]--;
    c.count[static_cast<int>(o.kind)]--;
    if (o.region.addr() != nullptr) s.mapped_bytes_ -= o.region.size();
    if (o.mr) {
      s.mapped_bytes_ -= o.mr->len;
      c.mr_bytes -= o.mr->len;
    }
    c.objs.erase(it);
  }
  // Destroys one object in the backend and forgets it.
  int destroy(uint32_t h, ObjKind k, bool force) {
    Obj* o = find(h, k);
    if (o == nullptr) return -EBADF;
    if (o->refs != 0 && !force) return -EBUSY;
    int rc = 0;
    switch (k) {
      case ObjKind::Pd: rc = s.backend_.dealloc_pd(c.info, o->id); break;
      case ObjKind::Mr: rc = s.backend_.dereg_mr(c.info, o->id); break;
      case ObjKind::Channel: rc = 0; break;
      case ObjKind::Cq: rc = s.backend_.destroy_cq(c.info, o->id); break;
      case ObjKind::Srq: rc = s.backend_.destroy_srq(c.info, o->id); break;
      case ObjKind::Qp: rc = s.backend_.destroy_qp(c.info, o->id); break;
      case ObjKind::Ah: rc = s.backend_.destroy_ah(c.info, o->id); break;
      case ObjKind::Mw: rc = s.backend_.dealloc_mw(c.info, o->id); break;
      case ObjKind::Count_: return -EINVAL;
    }
    // On a forced destroy (disconnect) the object goes whatever the backend
    // said; otherwise a failed destroy keeps it.
    if (rc == 0 || force) remove(h);
    return rc;
  }

  // What one client can create: the device's object counts, capped by the
  // client's quotas (a create beyond a quota fails with ENOMEM, so reporting
  // more would be untrue; memory windows share the MR quota).
  void cap_to_quotas(ibv_device_attr& a) const {
    const auto cap = [](int& v, uint64_t q) {
      if (q < static_cast<uint64_t>(INT32_MAX) && static_cast<uint64_t>(std::max(v, 0)) > q) v = static_cast<int>(q);
    };
    const ShimServerConfig& k = s.cfg_;
    cap(a.max_qp, k.max_qps_per_client);
    cap(a.max_cq, k.max_cqs_per_client);
    cap(a.max_srq, k.max_srqs_per_client);
    cap(a.max_mr, k.max_mrs_per_client);
    cap(a.max_mw, k.max_mrs_per_client);
    cap(a.max_ah, k.max_ahs_per_client);
    cap(a.max_pd, k.max_objects_per_client);
  }
  int query_device(ibv_device_attr& r) {
    if (int rc = s.backend_.query_device(c.info.dev, r)) return rc;
    cap_to_quotas(r);
    return 0;
  }

  int open_device(const OpenDeviceReq& q, OpenDeviceResp& r) {
    if (c.opened) return -EALREADY;
    if (q.abi_version != DROCE_SHM_ABI_VERSION) return -EPROTO;
    if (q.index >= s.backend_.device_count()) return -ENODEV;
    int rc = s.backend_.device_info(q.index, r.info);
    if (rc == 0) rc = s.backend_.query_device(q.index, c.dev_attr);
    if (rc != 0) return rc;
    cap_to_quotas(c.dev_attr);
    c.info.dev = q.index;
    c.opened = true;
    return 0;
  }
  int list_devices(ListDevicesResp& r) {
    uint32_t n = std::min(s.backend_.device_count(), kMaxDevices);
    r.count = 0;
    for (uint32_t i = 0; i < n; i++)
      if (s.backend_.device_info(i, r.dev[r.count]) == 0) r.dev[r.count++].index = i;
    return 0;
  }
  int query_gid_table(const PortReq& q, GidTableResp& r) {
    int n = s.backend_.query_gid_table(c.info.dev, q.port, r.entry, kMaxGids);
    if (n < 0) return n;
    r.count = static_cast<uint32_t>(std::min<int>(n, static_cast<int>(kMaxGids)));
    return 0;
  }
  int alloc_mw(const AllocMwReq& q, AllocMwResp& r) {
    if (int e = quota(ObjKind::Mw)) return e;
    Obj* pd = find(q.pd, ObjKind::Pd);
    if (pd == nullptr) return -EBADF;
    if (q.type != IBV_MW_TYPE_1 && q.type != IBV_MW_TYPE_2) return -EINVAL;
    auto o = std::make_unique<Obj>(ObjKind::Mw);
    MwResult res{};
    if (int rc = s.backend_.alloc_mw(c.info, pd->id, q.type, res)) return rc;
    o->id = res.id;
    r.handle = add(std::move(o), {q.pd});
    r.rkey = res.rkey;
    return 0;
  }
  int alloc_pd(HandleResp& r) {
    if (int e = room()) return e;
    auto o = std::make_unique<Obj>(ObjKind::Pd);
    if (int rc = s.backend_.alloc_pd(c.info, o->id)) return rc;
    r.handle = add(std::move(o), {});
    return 0;
  }
  int reg_mr(const RegMrReq& q, int fd, RegMrResp& r) {
    if (int e = quota(ObjKind::Mr)) return e;
    if (find(q.pd, ObjKind::Pd) == nullptr) return -EBADF;
    const size_t pg = page_size();
    if (fd < 0) return -EBADF;
    if (q.length == 0 || q.length > c.dev_attr.max_mr_size) return -EINVAL;
    if ((q.access & ~kAllowedAccess) != 0) return -EINVAL;
    // IB spec: remote write or atomic access needs local write.
    if ((q.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(q.access & IBV_ACCESS_LOCAL_WRITE))
      return -EINVAL;
    if (q.map_addr % pg || q.map_len % pg || q.fd_offset % pg || q.map_len == 0) return -EINVAL;
    if (q.addr < q.map_addr || q.addr - q.map_addr > q.map_len || q.length > q.map_len - (q.addr - q.map_addr))
      return -EINVAL;
    if (q.fd_offset > UINT64_MAX - q.map_len) return -EINVAL;
    if (q.map_len > s.cfg_.max_mr_bytes_per_client - c.mr_bytes) {
      s.quota_refused_++;
      return -ENOMEM;
    }
    // The client must not be able to shrink the file under our mapping
    // (that would SIGBUS the daemon): demand the shrink seal.
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) return -EPERM;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) < q.fd_offset + q.map_len)
      return -EINVAL;
    auto map = std::make_unique<MrMap>();
    void* a = mmap(nullptr, q.map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                   static_cast<off_t>(q.fd_offset));
    if (a == MAP_FAILED) return -errno;
    map->addr = a;
    map->len = q.map_len;
    if (s.cfg_.lock_mr_memory) map->locked = mlock(a, q.map_len) == 0;
    auto o = std::make_unique<Obj>(ObjKind::Mr);
    MrSetup setup{find(q.pd, ObjKind::Pd)->id, static_cast<uint8_t*>(a) + (q.addr - q.map_addr), q.length,
                  q.iova, q.access};
    MrResult res{};
    if (int rc = s.backend_.reg_mr(c.info, setup, res)) return rc;
    o->id = res.id;
    o->mr = std::move(map);
    c.mr_bytes += q.map_len;
    r.handle = add(std::move(o), {q.pd});
    r.lkey = res.lkey;
    r.rkey = res.rkey;
    return 0;
  }
  int create_channel(HandleResp& r) {
    if (int e = room()) return e;
    auto o = std::make_unique<Obj>(ObjKind::Channel);
    // Blocking (the client's ibv_get_cq_event sleeps in read) and a semaphore:
    // one read takes one event, so readiness never outlives the events.
    o->eventfd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (o->eventfd < 0) return -errno;
    out_fds[n_out_fds++] = o->eventfd;  // still owned by the object
    r.handle = add(std::move(o), {});
    return 0;
  }
  int open_async() {
    if (c.async_fd < 0) {
      // A semaphore: one read per event. Nonblocking: the core threads write it.
      c.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE | EFD_NONBLOCK);
      if (c.async_fd < 0) return -errno;
    }
    out_fds[n_out_fds++] = c.async_fd;  // still owned by the client
    return 0;
  }
  int open_doorbell(DoorbellResp& r) {
    if (c.doorbell.addr() != nullptr) return -EALREADY;
    ShmRegion region;
    if (int rc = region.create("droce-doorbell", page_round_up(sizeof(droce_shm_doorbell), 4096), false)) return rc;
    auto* db = static_cast<droce_shm_doorbell*>(region.addr());
    std::memset(static_cast<void*>(db), 0, sizeof(*db));
    db->magic = DROCE_SHM_DB_MAGIC;
    db->version = DROCE_SHM_ABI_VERSION;
    db->nbits = DROCE_SHM_DB_BITS;
    if (int rc = s.backend_.open_doorbell(c.info, db)) return rc;
    r.region_size = region.size();
    r.nbits = DROCE_SHM_DB_BITS;
    c.doorbell = std::move(region);
    out_fds[n_out_fds++] = c.doorbell.fd();  // still owned by the region
    return 0;
  }
  int get_async_event(AsyncEventResp& r) {
    for (auto& [h, o] : c.objs) {
      uint32_t t = 0;
      bool got = false;
      if (o->kind == ObjKind::Qp) got = s.backend_.take_qp_event(c.info, o->id, t);
      else if (o->kind == ObjKind::Cq) got = s.backend_.take_cq_event(c.info, o->id, t);
      else if (o->kind == ObjKind::Srq) got = s.backend_.take_srq_event(c.info, o->id, t);
      if (got) {
        r.event_type = t;
        r.handle = h;
        return 0;
      }
    }
    return -EAGAIN;
  }
  int create_cq(const CreateCqReq& q, CreateCqResp& r) {
    if (int e = quota(ObjKind::Cq)) return e;
    Obj* ch = nullptr;
    if (q.channel != 0 && (ch = find(q.channel, ObjKind::Channel)) == nullptr) return -EBADF;
    if (q.cqe < 1 || q.cqe > static_cast<uint32_t>(c.dev_attr.max_cqe)) return -EINVAL;
    if (q.comp_vector >= kCompVectors) return -EINVAL;
    uint32_t entries = ring_entries_for(q.cqe);
    if (entries == 0) return -EINVAL;
    auto o = std::make_unique<Obj>(ObjKind::Cq);
    RingSpec spec{DROCE_SHM_RING_CQ, entries, sizeof(droce_shm_cqe), 0, 0};
    if (int rc = create_object_region(o->region, DROCE_SHM_REGION_CQ, 0, &spec, 1, s.cfg_.rings_in_hugepages)) return rc;
    CqSetup setup{q.cqe, q.comp_vector, region_ring(o->region, 0), entries, ch ? ch->eventfd : -1, c.async_fd};
    CqResult res{};
    if (int rc = s.backend_.create_cq(c.info, setup, res)) return rc;
    o->id = res.id;
    static_cast<droce_shm_region_hdr*>(o->region.addr())->object_num = res.cqn;
    r.cqn = res.cqn;
    r.cqe = entries;
    r.ring_entries = entries;
    r.region_size = o->region.size();
    out_fds[n_out_fds++] = o->region.fd();
    r.handle = add(std::move(o), {q.channel});
    return 0;
  }
  int resize_cq(const ResizeCqReq& q, CreateCqResp& r) {
    Obj* o = find(q.handle, ObjKind::Cq);
    if (o == nullptr) return -EBADF;
    if (q.cqe < 1 || q.cqe > static_cast<uint32_t>(c.dev_attr.max_cqe)) return -EINVAL;
    uint32_t entries = ring_entries_for(q.cqe);
    if (entries == 0) return -EINVAL;
    ShmRegion region;
    RingSpec spec{DROCE_SHM_RING_CQ, entries, sizeof(droce_shm_cqe), 0, 0};
    const uint32_t cqn = static_cast<const droce_shm_region_hdr*>(o->region.addr())->object_num;
    if (int rc = create_object_region(region, DROCE_SHM_REGION_CQ, cqn, &spec, 1, s.cfg_.rings_in_hugepages)) return rc;
    if (int rc = s.backend_.resize_cq(c.info, o->id, region_ring(region, 0), entries)) {
      // A backend that timed out may still switch to the new ring later:
      // leave it mapped for good rather than let the core write freed memory.
      if (rc == -ETIMEDOUT) region.forget_mapping();
      return rc;
    }
    s.mapped_bytes_ -= o->region.size();
    s.mapped_bytes_ += region.size();
    o->region = std::move(region);  // the old one goes: nobody uses it now
    r.handle = q.handle;
    r.cqn = cqn;
    r.cqe = entries;
    r.ring_entries = entries;
    r.region_size = o->region.size();
    out_fds[n_out_fds++] = o->region.fd();
    return 0;
  }
  int create_srq(const CreateSrqReq& q, CreateSrqResp& r) {
    if (int e = quota(ObjKind::Srq)) return e;
    Obj* pd = find(q.pd, ObjKind::Pd);
    if (pd == nullptr) return -EBADF;
    const auto& d = c.dev_attr;
    if (q.attr.max_wr < 1 || q.attr.max_wr > static_cast<uint32_t>(d.max_srq_wr) ||
        q.attr.max_sge > static_cast<uint32_t>(d.max_srq_sge) || q.attr.max_sge > DROCE_SHM_MAX_SGE ||
        q.attr.srq_limit > q.attr.max_wr)
      return -EINVAL;
    uint32_t entries = ring_entries_for(q.attr.max_wr);
    if (entries == 0) return -EINVAL;
    ibv_srq_attr granted = q.attr;
    granted.max_wr = entries;
    granted.max_sge = std::max<uint32_t>(q.attr.max_sge, 1);
    auto o = std::make_unique<Obj>(ObjKind::Srq);
    RingSpec spec{DROCE_SHM_RING_RECV, entries, sizeof(droce_shm_recv_wqe), granted.max_sge, 0};
    if (int rc = create_object_region(o->region, DROCE_SHM_REGION_SRQ, 0, &spec, 1, s.cfg_.rings_in_hugepages)) return rc;
    SrqSetup setup{pd->id, granted, region_ring(o->region, 0), entries, c.async_fd};
    SrqResult res{};
    if (int rc = s.backend_.create_srq(c.info, setup, res)) return rc;
    o->id = res.id;
    static_cast<droce_shm_region_hdr*>(o->region.addr())->object_num = res.srqn;
    r.srqn = res.srqn;
    r.attr = granted;
    r.ring_entries = entries;
    r.region_size = o->region.size();
    out_fds[n_out_fds++] = o->region.fd();
    r.handle = add(std::move(o), {q.pd});
    return 0;
  }
  int create_qp(const CreateQpReq& q, CreateQpResp& r) {
    if (int e = quota(ObjKind::Qp)) return e;
    Obj* pd = find(q.pd, ObjKind::Pd);
    Obj* scq = find(q.send_cq, ObjKind::Cq);
    Obj* rcq = find(q.recv_cq, ObjKind::Cq);
    Obj* srq = nullptr;
    if (pd == nullptr || scq == nullptr || rcq == nullptr) return -EBADF;
    if (q.srq != 0 && (srq = find(q.srq, ObjKind::Srq)) == nullptr) return -EBADF;
    if (q.qp_type != IBV_QPT_RC && q.qp_type != IBV_QPT_UC && q.qp_type != IBV_QPT_UD) return -EOPNOTSUPP;
    if (srq != nullptr && q.qp_type == IBV_QPT_UC) return -EINVAL;  // IBTA: SRQ with RC/UD (XRC not here)
    const auto& d = c.dev_attr;
    ibv_qp_cap cap = q.cap;
    auto max_wr = static_cast<uint32_t>(d.max_qp_wr);
    auto max_sge = std::min<uint32_t>(static_cast<uint32_t>(d.max_sge), DROCE_SHM_MAX_SGE);
    // 0 work requests of a kind is allowed (a QP that only receives or only
    // sends: qperf asks for that), as rxe and RNICs do; it gets the smallest
    // ring, and the actual capacity is reported (>= what was asked).
    if (cap.max_send_wr > max_wr || cap.max_send_sge > max_sge || cap.max_inline_data > DROCE_SHM_MAX_INLINE)
      return -EINVAL;
    if (srq == nullptr && (cap.max_recv_wr > max_wr || cap.max_recv_sge > max_sge)) return -EINVAL;
    uint32_t sq_entries = ring_entries_for(std::max<uint32_t>(cap.max_send_wr, 1));
    uint32_t rq_entries = srq ? 0 : ring_entries_for(std::max<uint32_t>(cap.max_recv_wr, 1));
    cap.max_send_wr = sq_entries;
    cap.max_send_sge = std::max<uint32_t>(cap.max_send_sge, 1);
    cap.max_inline_data = DROCE_SHM_MAX_INLINE;
    if (srq != nullptr) {
      cap.max_recv_wr = 0;
      cap.max_recv_sge = 0;
    } else {
      cap.max_recv_wr = rq_entries;
      cap.max_recv_sge = std::max<uint32_t>(cap.max_recv_sge, 1);
    }
    auto o = std::make_unique<Obj>(ObjKind::Qp);
    RingSpec spec[2] = {
        {DROCE_SHM_RING_SEND, sq_entries, sizeof(droce_shm_send_wqe), cap.max_send_sge, cap.max_inline_data},
        {DROCE_SHM_RING_RECV, rq_entries, sizeof(droce_shm_recv_wqe), cap.max_recv_sge, 0}};
    if (int rc = create_object_region(o->region, DROCE_SHM_REGION_QP, 0, spec, srq ? 1 : 2,
                                      s.cfg_.rings_in_hugepages)) return rc;
    QpSetup setup{pd->id, scq->id, rcq->id, srq ? srq->id : 0, static_cast<ibv_qp_type>(q.qp_type),
                  q.sq_sig_all != 0, cap, region_ring(o->region, 0), sq_entries,
                  srq ? nullptr : region_ring(o->region, 1), rq_entries, c.async_fd};
    QpResult res{};
    if (int rc = s.backend_.create_qp(c.info, setup, res)) return rc;
    o->id = res.id;
    o->cap = cap;
    o->qp_type = q.qp_type;
    o->sq_sig_all = q.sq_sig_all != 0;
    static_cast<droce_shm_region_hdr*>(o->region.addr())->object_num = res.qpn;
    r.qpn = res.qpn;
    r.cap = cap;
    r.sq_entries = sq_entries;
    r.rq_entries = rq_entries;
    r.region_size = o->region.size();
    out_fds[n_out_fds++] = o->region.fd();
    // The same CQ for send and receive takes two references.
    r.handle = add(std::move(o), {q.pd, q.send_cq, q.recv_cq, q.srq});
    return 0;
  }
  int create_ah(const CreateAhReq& q, CreateAhResp& r) {
    if (int e = quota(ObjKind::Ah)) return e;
    Obj* pd = find(q.pd, ObjKind::Pd);
    if (pd == nullptr) return -EBADF;
    if (q.attr.is_global != 1) return -EINVAL;  // RoCE: every AH carries a GRH
    auto o = std::make_unique<Obj>(ObjKind::Ah);
    AhResult res{};
    if (int rc = s.backend_.create_ah(c.info, pd->id, q.attr, res)) return rc;
    o->id = res.id;
    r.ah_num = res.ah_num;
    r.handle = add(std::move(o), {q.pd});
    return 0;
  }
};

namespace {
template <typename T>
const T& body_of(const uint8_t* msg) {
  return *reinterpret_cast<const T*>(msg + sizeof(ReqHdr));
}
}  // namespace

ShimServer::ShimServer(ShimBackend& backend, ShimServerConfig cfg, CmBackend* cm)
    : backend_(backend), cfg_(std::move(cfg)) {
  // The server thread's wake-up: stop(), and CM events from the engine cores.
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (cm != nullptr) {
    CmLimits lim;
    lim.max_ids_per_client = cfg_.max_cm_ids_per_client;
    lim.max_channels_per_client = cfg_.max_cm_channels_per_client;
    lim.max_backlog = cfg_.max_cm_backlog;
    lim.resolve_retry_ms = cfg_.resolve_retry_ms;
    lim.resolve_timeout_ms = cfg_.resolve_timeout_ms;
    cm_ = std::make_unique<CmSessions>(*cm, backend_, lim, wake_fd_, quota_refused_);
  }
}

ShimServer::~ShimServer() {
  stop();
  while (!clients_.empty()) drop(*clients_.back());
  cm_.reset();  // before the wake fd closes: the sink writes it until then
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(cfg_.socket_path.c_str());
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

int ShimServer::listen() {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (cfg_.socket_path.empty() || cfg_.socket_path.size() >= sizeof(sa.sun_path)) return -ENAMETOOLONG;
  std::memcpy(sa.sun_path, cfg_.socket_path.c_str(), cfg_.socket_path.size() + 1);
  // The socket's directory (e.g. /run/droce) may not exist yet.
  if (auto slash = cfg_.socket_path.rfind('/'); slash != std::string::npos && slash > 0)
    mkdir(cfg_.socket_path.substr(0, slash).c_str(), 0755);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  // A socket someone still answers on belongs to a live daemon: never steal it.
  if (int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool live = connect(probe, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
    close(probe);
    if (live) {
      close(fd);
      return -EADDRINUSE;
    }
  }
  unlink(cfg_.socket_path.c_str());  // a stale socket of a dead daemon
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      chmod(cfg_.socket_path.c_str(), cfg_.socket_mode) != 0 || ::listen(fd, 64) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  listen_fd_ = fd;
  return wake_fd_ >= 0 ? 0 : -EMFILE;
}

int ShimServer::start() {
  if (listen_fd_ < 0) {
    if (int rc = listen()) return rc;
  }
  running_ = true;
  thread_ = std::thread([this] {
    while (running_.load(std::memory_order_relaxed)) poll_once(1000);
  });
  return 0;
}

void ShimServer::stop() {
  if (!thread_.joinable()) return;
  running_ = false;
  uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // the thread wakes within its poll timeout anyway
  }
  thread_.join();
}

int ShimServer::poll_once(int timeout_ms) {
  if (listen_fd_ < 0) return -EBADF;
  std::vector<pollfd> pfds;
  pfds.reserve(clients_.size() + 2);
  pfds.push_back({listen_fd_, POLLIN, 0});
  pfds.push_back({wake_fd_, POLLIN, 0});
  // A parked client's socket is watched for hang-up only; the poll wakes in
  // time for the earliest retry.
  const auto now = std::chrono::steady_clock::now();
  for (auto& c : clients_) {
    pfds.push_back({c->fd, static_cast<short>(c->parked.empty() ? POLLIN : 0), 0});
    if (!c->parked.empty()) {
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(c->next_try - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, timeout_ms < 0 ? INT32_MAX : timeout_ms));
    }
  }
  // CM address resolutions due (cm_sessions.h).
  if (cm_) {
    if (int t = cm_->next_timeout_ms(); t >= 0 && (timeout_ms < 0 || t < timeout_ms)) timeout_ms = t;
  }
  int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
  if (n < 0) return errno == EINTR ? 0 : -errno;
  if (pfds[1].revents & POLLIN) {
    uint64_t v;
    if (read(wake_fd_, &v, sizeof(v)) < 0) {
      // nonblocking; nothing to do
    }
  }
  // Serve existing clients first (indexes line up with pfds[2..]).
  std::vector<Client*> gone;
  for (size_t i = 0; i < clients_.size(); i++) {
    short ev = pfds[i + 2].revents;
    if (ev == 0) continue;
    Client& c = *clients_[i];
    if (!(ev & POLLIN) || !serve(c)) gone.push_back(&c);
  }
  retry_parked(gone);
  for (Client* c : gone) drop(*c);
  // CM events from the engine cores, resolution steps due.
  if (cm_) cm_->run();
  if (pfds[0].revents & POLLIN) accept_clients();
  return 0;
}

void ShimServer::accept_clients() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (clients_.size() >= cfg_.max_clients) {
      close(fd);
      dropped_++;
      continue;
    }
    auto c = std::make_unique<Client>();
    c->fd = fd;
    c->info.id = next_client_id_++;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      c->info.pid = cred.pid;
      c->info.uid = cred.uid;
    }
    clients_.push_back(std::move(c));
    clients_total_++;
    n_clients_++;
  }
}

void ShimServer::destroy_all(Client& c) {
  ServerOps ops{*this, c};
  // Dependents first: nothing is destroyed while something names it.
  // Windows before MRs: no QP is left to bind one, and an MR with a window
  // bound would refuse to go (its memory must not be unmapped while it stays).
  static constexpr ObjKind order[] = {ObjKind::Qp, ObjKind::Srq, ObjKind::Ah, ObjKind::Mw, ObjKind::Mr,
                                      ObjKind::Cq, ObjKind::Channel, ObjKind::Pd};
  for (ObjKind k : order) {
    std::vector<uint32_t> hs;
    for (auto& [h, o] : c.objs)
      if (o->kind == k) hs.push_back(h);
    for (uint32_t h : hs) ops.destroy(h, k, true);
  }
}

void ShimServer::retry_parked(std::vector<Client*>& gone) {
  const auto now = std::chrono::steady_clock::now();
  for (auto& p : clients_) {
    Client& c = *p;
    if (c.parked.empty() || now < c.next_try || std::find(gone.begin(), gone.end(), &c) != gone.end()) continue;
    std::vector<uint8_t> msg = std::move(c.parked);
    c.parked.clear();
    parked_now_--;
    if (!handle(c, msg.data(), msg.size(), nullptr, 0, true)) gone.push_back(&c);
  }
}

void ShimServer::drop(Client& c) {
  if (!c.parked.empty()) parked_now_--;
  destroy_all(c);
  if (cm_) cm_->client_gone(c.info);
  if (c.opened) backend_.client_gone(c.info);
  close(c.fd);
  n_clients_--;
  auto it = std::find_if(clients_.begin(), clients_.end(), [&](auto& p) { return p.get() == &c; });
  clients_.erase(it);
}

bool ShimServer::serve(Client& c) {
  alignas(16) uint8_t in[kMaxMessage];
  int fds[4];
  int nfds = 0;
  ssize_t n = recv_with_fds(c.fd, in, sizeof(in), fds, 4, &nfds);
  if (n == -EAGAIN || n == -EINTR) return true;
  if (n <= 0) return false;  // closed or error
  struct FdCloser {
    int* fds;
    int n;
    ~FdCloser() {
      for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    }
  } closer{fds, nfds};
  requests_++;
  return handle(c, in, static_cast<size_t>(n), fds, nfds, false);
}

bool ShimServer::handle(Client& c, const uint8_t* in, size_t n, const int* fds, int nfds, bool retry) {
  if (n < sizeof(ReqHdr)) {
    dropped_++;
    return false;
  }
  ReqHdr hdr;
  std::memcpy(&hdr, in, sizeof(hdr));
  if (hdr.magic != kMagic || hdr.version != kVersion) {
    dropped_++;
    return false;
  }
  alignas(16) uint8_t out[kMaxMessage];
  auto* rh = reinterpret_cast<RespHdr*>(out);
  *rh = RespHdr{kMagic, hdr.op, 0, hdr.seq, 0};
  uint8_t* ob = out + sizeof(RespHdr);
  size_t out_len = 0;
  ServerOps ops{*this, c};
  int rc = -EINVAL;
  size_t body = n - sizeof(ReqHdr);
  auto op = static_cast<Op>(hdr.op);

  // Dispatch: checks the body length, runs the handler with typed bodies.
  auto run = [&]<Op O>(auto&& fn) {
    using B = Body<O>;
    if (body != body_size<typename B::Request>()) {
      rc = -EINVAL;
      return;
    }
    typename B::Response resp{};
    std::memset(static_cast<void*>(&resp), 0, sizeof(resp));
    if constexpr (std::is_same_v<typename B::Request, Empty>) {
      rc = fn(resp);
    } else {
      typename B::Request req;
      std::memcpy(static_cast<void*>(&req), in + sizeof(ReqHdr), sizeof(req));
      rc = fn(req, resp);
    }
    if (rc == 0) {
      out_len = body_size<typename B::Response>();
      std::memcpy(ob, &resp, out_len);
    }
  };
  const bool cm_op = (hdr.op >= static_cast<uint16_t>(Op::CmCreateChannel) && hdr.op <= static_cast<uint16_t>(Op::CmQueryId)) ||
                     hdr.op == static_cast<uint16_t>(Op::CmJoinMulticast);
  if (cm_op) {
    // RDMA CM: no device needs to be open (cm_sessions.h).
    if (!cm_) {
      rc = -ENOSYS;
    } else {
      CmSessions& cm = *cm_;
      const ClientInfo& ci = c.info;
      switch (op) {
        case Op::CmCreateChannel: run.operator()<Op::CmCreateChannel>([&](HandleResp& r) {
            int fd = -1;
            int e = cm.create_channel(ci, r, &fd);
            if (e == 0) ops.out_fds[ops.n_out_fds++] = fd;  // still owned by the channel
            return e; }); break;
        case Op::CmDestroyChannel: run.operator()<Op::CmDestroyChannel>([&](const HandleReq& q, Empty&) { return cm.destroy_channel(ci, q); }); break;
        case Op::CmCreateId: run.operator()<Op::CmCreateId>([&](const CmCreateIdReq& q, HandleResp& r) { return cm.create_id(ci, q, r); }); break;
        case Op::CmDestroyId: run.operator()<Op::CmDestroyId>([&](const HandleReq& q, Empty&) { return cm.destroy_id(ci, q); }); break;
        case Op::CmMigrateId: run.operator()<Op::CmMigrateId>([&](const CmMigrateIdReq& q, Empty&) { return cm.migrate_id(ci, q); }); break;
        case Op::CmBindAddr: run.operator()<Op::CmBindAddr>([&](const CmAddrReq& q, CmIdInfo& r) { return cm.bind_addr(ci, q, r); }); break;
        case Op::CmResolveAddr: run.operator()<Op::CmResolveAddr>([&](const CmResolveAddrReq& q, Empty&) { return cm.resolve_addr(ci, q); }); break;
        case Op::CmResolveRoute: run.operator()<Op::CmResolveRoute>([&](const CmIdTimeoutReq& q, Empty&) { return cm.resolve_route(ci, q); }); break;
        case Op::CmListen: run.operator()<Op::CmListen>([&](const CmListenReq& q, Empty&) { return cm.listen(ci, q); }); break;
        case Op::CmConnect: run.operator()<Op::CmConnect>([&](const CmConnParamReq& q, Empty&) { return cm.connect(ci, q); }); break;
        case Op::CmAccept: run.operator()<Op::CmAccept>([&](const CmConnParamReq& q, Empty&) { return cm.accept(ci, q); }); break;
        case Op::CmReject: run.operator()<Op::CmReject>([&](const CmRejectReq& q, Empty&) { return cm.reject(ci, q); }); break;
        case Op::CmEstablish: run.operator()<Op::CmEstablish>([&](const HandleReq& q, Empty&) { return cm.establish(ci, q); }); break;
        case Op::CmDisconnect: run.operator()<Op::CmDisconnect>([&](const HandleReq& q, Empty&) { return cm.disconnect(ci, q); }); break;
        case Op::CmInitQpAttr: run.operator()<Op::CmInitQpAttr>([&](const CmInitQpAttrReq& q, CmInitQpAttrResp& r) { return cm.init_qp_attr(ci, q, r); }); break;
        case Op::CmGetEvent: run.operator()<Op::CmGetEvent>([&](const HandleReq& q, CmEventResp& r) { return cm.get_event(ci, q, r); }); break;
        case Op::CmQueryId: run.operator()<Op::CmQueryId>([&](const HandleReq& q, CmIdInfo& r) { return cm.query_id(ci, q, r); }); break;
        case Op::CmJoinMulticast: run.operator()<Op::CmJoinMulticast>([&](const CmJoinReq& q, Empty&) { return cm.join_multicast(ci, q); }); break;
        default: rc = -EOPNOTSUPP; break;
      }
    }
  } else if (!c.opened && op != Op::ListDevices && op != Op::OpenDevice) {
    rc = -ENODEV;
  } else {
    switch (op) {
      case Op::ListDevices: run.operator()<Op::ListDevices>([&](ListDevicesResp& r) { return ops.list_devices(r); }); break;
      case Op::OpenDevice: run.operator()<Op::OpenDevice>([&](const OpenDeviceReq& q, OpenDeviceResp& r) { return ops.open_device(q, r); }); break;
      case Op::QueryDevice: run.operator()<Op::QueryDevice>([&](ibv_device_attr& r) { return ops.query_device(r); }); break;
      case Op::QueryPort: run.operator()<Op::QueryPort>([&](const PortReq& q, ibv_port_attr& r) {
          if (q.port < 1 || q.port > c.dev_attr.phys_port_cnt) return -EINVAL;
          int e = backend_.query_port(c.info.dev, q.port, r);
          // The table has kMaxGids slots (QueryGidTable); the unpopulated ones are empty.
          if (e == 0) r.gid_tbl_len = static_cast<int>(kMaxGids);
          return e; }); break;
      case Op::QueryGidTable: run.operator()<Op::QueryGidTable>([&](const PortReq& q, GidTableResp& r) {
          return q.port < 1 || q.port > c.dev_attr.phys_port_cnt ? -EINVAL : ops.query_gid_table(q, r); }); break;
      case Op::AllocPd: run.operator()<Op::AllocPd>([&](HandleResp& r) { return ops.alloc_pd(r); }); break;
      case Op::DeallocPd: run.operator()<Op::DeallocPd>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Pd, false); }); break;
      case Op::RegMr: run.operator()<Op::RegMr>([&](const RegMrReq& q, RegMrResp& r) {
          return nfds == 1 ? ops.reg_mr(q, fds[0], r) : -EBADF; }); break;
      case Op::DeregMr: run.operator()<Op::DeregMr>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Mr, false); }); break;
      case Op::AllocMw: run.operator()<Op::AllocMw>([&](const AllocMwReq& q, AllocMwResp& r) { return ops.alloc_mw(q, r); }); break;
      case Op::DeallocMw: run.operator()<Op::DeallocMw>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Mw, false); }); break;
      case Op::CreateChannel: run.operator()<Op::CreateChannel>([&](HandleResp& r) { return ops.create_channel(r); }); break;
      case Op::DestroyChannel: run.operator()<Op::DestroyChannel>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Channel, false); }); break;
      case Op::CreateCq: run.operator()<Op::CreateCq>([&](const CreateCqReq& q, CreateCqResp& r) { return ops.create_cq(q, r); }); break;
      case Op::ResizeCq: run.operator()<Op::ResizeCq>([&](const ResizeCqReq& q, CreateCqResp& r) { return ops.resize_cq(q, r); }); break;
      case Op::DestroyCq: run.operator()<Op::DestroyCq>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Cq, false); }); break;
      case Op::CreateSrq: run.operator()<Op::CreateSrq>([&](const CreateSrqReq& q, CreateSrqResp& r) { return ops.create_srq(q, r); }); break;
      case Op::ModifySrq: run.operator()<Op::ModifySrq>([&](const ModifySrqReq& q, Empty&) {
          Obj* o = ops.find(q.handle, ObjKind::Srq);
          return o ? backend_.modify_srq(c.info, o->id, q.attr, q.mask) : -EBADF; }); break;
      case Op::QuerySrq: run.operator()<Op::QuerySrq>([&](const HandleReq& q, ibv_srq_attr& r) {
          Obj* o = ops.find(q.handle, ObjKind::Srq);
          return o ? backend_.query_srq(c.info, o->id, r) : -EBADF; }); break;
      case Op::DestroySrq: run.operator()<Op::DestroySrq>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Srq, false); }); break;
      case Op::CreateQp: run.operator()<Op::CreateQp>([&](const CreateQpReq& q, CreateQpResp& r) { return ops.create_qp(q, r); }); break;
      case Op::ModifyQp: run.operator()<Op::ModifyQp>([&](const ModifyQpReq& q, Empty&) {
          Obj* o = ops.find(q.handle, ObjKind::Qp);
          if (o == nullptr) return -EBADF;
          // RDMA READ / atomic depths past the device's are clamped by the engine, not refused:
          // perftest sets its peer's depth (rxe: 128) as its own, and must keep working.
          return backend_.modify_qp(c.info, o->id, q.attr, q.mask); }); break;
      case Op::QueryQp: run.operator()<Op::QueryQp>([&](const QueryQpReq& q, QueryQpResp& r) {
          Obj* o = ops.find(q.handle, ObjKind::Qp);
          if (o == nullptr) return -EBADF;
          r.cap = o->cap;
          r.qp_type = o->qp_type;
          r.sq_sig_all = o->sq_sig_all;
          return backend_.query_qp(c.info, o->id, q.mask, r.attr); }); break;
      case Op::DestroyQp: run.operator()<Op::DestroyQp>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Qp, false); }); break;
      case Op::CreateAh: run.operator()<Op::CreateAh>([&](const CreateAhReq& q, CreateAhResp& r) { return ops.create_ah(q, r); }); break;
      case Op::AttachMcast: run.operator()<Op::AttachMcast>([&](const McastReq& q, Empty&) {
          Obj* o = ops.find(q.qp, ObjKind::Qp);
          return o ? backend_.attach_mcast(c.info, o->id, q.gid) : -EBADF; }); break;
      case Op::DetachMcast: run.operator()<Op::DetachMcast>([&](const McastReq& q, Empty&) {
          Obj* o = ops.find(q.qp, ObjKind::Qp);
          return o ? backend_.detach_mcast(c.info, o->id, q.gid) : -EBADF; }); break;
      case Op::DestroyAh: run.operator()<Op::DestroyAh>([&](const HandleReq& q, Empty&) { return ops.destroy(q.handle, ObjKind::Ah, false); }); break;
      case Op::OpenAsync: run.operator()<Op::OpenAsync>([&](Empty&) { return ops.open_async(); }); break;
      case Op::GetAsyncEvent: run.operator()<Op::GetAsyncEvent>([&](AsyncEventResp& r) { return ops.get_async_event(r); }); break;
      case Op::OpenDoorbell: run.operator()<Op::OpenDoorbell>([&](DoorbellResp& r) { return ops.open_doorbell(r); }); break;
      default: rc = -EOPNOTSUPP; break;
    }
  }
  if (rc == -EINPROGRESS && (op == Op::ModifyQp || op == Op::CreateAh)) {
    // The backend is resolving the address (backend.h): park the request,
    // answer it later, serve the other clients meanwhile.
    const auto now = std::chrono::steady_clock::now();
    if (!retry) {
      c.park_deadline = now + std::chrono::milliseconds(cfg_.resolve_timeout_ms);
      parked_++;
    }
    if (now < c.park_deadline) {
      c.parked.assign(in, in + n);
      c.next_try = now + std::chrono::milliseconds(cfg_.resolve_retry_ms);
      parked_now_++;
      return true;
    }
    rc = -EHOSTUNREACH;  // no answer in time
  } else if (rc == -EINPROGRESS) {
    rc = -EIO;  // only address resolution may park a request
  }
  if (rc != 0) {
    errors_++;
    out_len = 0;
    ops.n_out_fds = 0;
  }
  rh->status = rc;
  rh->nfds = static_cast<uint16_t>(ops.n_out_fds);
  // The socket is nonblocking: a client that does not read its responses
  // fills its buffer and is dropped instead of stalling the server.
  int src = send_with_fds(c.fd, out, sizeof(RespHdr) + out_len, ops.out_fds, ops.n_out_fds);
  if (src != 0) {
    dropped_++;
    return false;
  }
  return true;
}

ShimServerStats ShimServer::stats() const {
  ShimServerStats s;
  s.clients = n_clients_.load();
  s.clients_total = clients_total_.load();
  s.requests = requests_.load();
  s.errors = errors_.load();
  s.dropped = dropped_.load();
  for (int i = 0; i < static_cast<int>(ObjKind::Count_); i++) s.objects[i] = objects_[i].load();
  s.mapped_bytes = mapped_bytes_.load();
  s.quota_refused = quota_refused_.load();
  s.parked = parked_.load();
  s.parked_now = parked_now_.load();
  if (cm_) {
    const CmStats cs = cm_->stats();
    s.cm_ids = cs.ids;
    s.cm_channels = cs.channels;
    s.cm_listeners = cs.listeners;
    s.cm_bindings = cs.bindings;
    s.cm_resolving = cs.resolving;
    s.cm_events = cs.events;
    s.cm_events_dropped = cs.events_dropped;
  }
  return s;
}

}  // namespace droce::shim

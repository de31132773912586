// The drop-in libibverbs.so.1: the public libibverbs ABI of rdma-core 44 on
// top of the shim, so that programs built against Debian's libibverbs run on
// droced with LD_LIBRARY_PATH pointing here and no kernel RDMA device.
//
// Layout: every object is one of our structs whose first member is the
// libibverbs struct the program sees (ibv_pd, ibv_cq, ...), so a cast gets
// back to ours. The context is a struct verbs_context (ibv_context is its last
// member, as the inline functions of verbs.h expect) followed by our state.
// The inline data-path calls of verbs.h (ibv_post_send, ibv_post_recv,
// ibv_post_srq_recv, ibv_poll_cq, ibv_req_notify_cq) jump through
// context->ops to functions here that touch only the shared-memory rings.
//
// Symbol versions: front/libibverbs.map reproduces rdma-core 44's version
// nodes (IBVERBS_1.0 ... IBVERBS_1.14, IBVERBS_PRIVATE_34).
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "shim/client/client.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

using namespace droce::shim;
using namespace droce::shim::proto;

#define DROCE_EXPORT extern "C" __attribute__((visibility("default")))
// Names that also have an IBVERBS_1.0 version (compat_1_0.cc) are bound to
// their default IBVERBS_1.1 version explicitly, as rdma-core does.
#define DROCE_EXPORT_1_1(name)                                       \
  __asm__(".symver droce_v11_" #name "," #name "@@IBVERBS_1.1"); \
  DROCE_EXPORT

// Private (IBVERBS_PRIVATE_34) types that ibv_devinfo uses; rdma-core keeps
// them in infiniband/driver.h, which Debian does not install.
enum ibv_gid_type_sysfs { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };

namespace {

// ---- objects --------------------------------------------------------------

struct FDevice {
  ibv_device dev;  // first: programs hold ibv_device*
  uint32_t index;
  uint64_t guid;   // network byte order
  std::string socket;
};

struct FContext {
  verbs_context vctx;  // ibv_context is its last member
  ShimConnection conn;
  FDevice* dev;
  // async_fd (given to the program) is an epoll set of the daemon's event
  // counter (events_fd) and the control socket (its hang-up: DEVICE_FATAL).
  int async_fd;
  int events_fd;
  struct Async {
    std::mutex mu;
    bool fatal_reported = false;
    std::map<uint32_t, ibv_qp*> qps;    // handle -> QP, for the events' element.qp
    std::map<uint32_t, ibv_cq*> cqs;    // element.cq (IBV_EVENT_CQ_ERR)
    std::map<uint32_t, ibv_srq*> srqs;  // element.srq (IBV_EVENT_SRQ_*)
    // The connection's doorbell region (droce_shm_abi.h, "doorbells"); none
    // when the daemon has none to give (the rings are then always polled).
    ClientDoorbell doorbell;
  };
  Async* async;  // behind a pointer: FContext stays standard-layout
};
static_assert(offsetof(verbs_context, context) + sizeof(ibv_context) == sizeof(verbs_context),
              "verbs_context must end with ibv_context");
static_assert(offsetof(FContext, vctx) == 0);

struct FPd {
  ibv_pd pd;
  uint32_t handle;
};
struct FMr {
  ibv_mr mr;
  uint32_t mem_entry;
};
struct FCq;
struct FChannel {
  ibv_comp_channel ch;
  uint32_t handle;
  std::mutex mu;
  std::vector<FCq*> cqs;
};
struct FCq {
  // ibv_cq_ex begins with the fields of ibv_cq (ibv_cq_ex_to_cq is a cast).
  union {
    ibv_cq cq;
    ibv_cq_ex cqx;  // CQs of ibv_create_cq_ex
  };
  uint32_t handle;
  ClientCq ring;
  uint32_t events_seen = 0;
  FChannel* channel = nullptr;
  uint32_t empty_polls = 0;  // consecutive ibv_poll_cq calls that found nothing
  // Extended polling, from ibv_start_poll to ibv_end_poll (ring.lock held):
  // the current completion (in place in the ring) and how many are read.
  const droce_shm_cqe* cur = nullptr;
  uint32_t polled = 0;
};

// A program spinning on an empty CQ holds its CPU while the daemon's core,
// which must produce the completion, may be waiting for that very CPU (a host
// with fewer CPUs than busy loops). After this many empty polls in a row,
// ibv_poll_cq gives the CPU away once (sched_yield: returns at once when
// nothing else is runnable). DROCE_SHIM_POLL_YIELD=N sets it; 0 never yields.
uint32_t poll_yield_after() {
  static const uint32_t n = [] {
    const char* e = std::getenv("DROCE_SHIM_POLL_YIELD");
    return e && *e ? static_cast<uint32_t>(std::strtoul(e, nullptr, 10)) : 64u;
  }();
  return n;
}
struct FSrq {
  ibv_srq srq;
  uint32_t handle;
  uint32_t max_sge;
  ClientSrq ring;
};
struct FQp {
  // ibv_qp_ex begins with ibv_qp (as rdma-core's verbs_qp).
  union {
    ibv_qp qp;
    ibv_qp_ex qpx;  // QPs of ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
  };
  uint32_t handle;
  ibv_qp_cap cap;
  uint32_t sq_sig_all;
  bool is_ex;
  // The ibv_wr_* batch, from ibv_wr_start to ibv_wr_complete/abort
  // (ring.sq_lock held): WQEs filled but not published, free slots known,
  // the first error (the batch is then dropped at wr_complete).
  uint32_t wr_n;
  uint32_t wr_free;
  int wr_err;
  ClientQp ring;
};
struct FAh {
  ibv_ah ah;
  uint32_t ah_num;
};

FContext* ctx_of(ibv_context* c) {
  return reinterpret_cast<FContext*>(reinterpret_cast<uint8_t*>(c) - offsetof(verbs_context, context));
}
ShimConnection& conn_of(ibv_context* c) { return ctx_of(c)->conn; }

// Errors: pointer-returning calls set errno and return NULL; int-returning
// ones return a positive errno (libibverbs' convention).
template <typename T>
T* fail(int neg) {
  errno = neg < 0 ? -neg : EINVAL;
  return nullptr;
}

template <typename T>
T* new_obj() {
  void* p = calloc(1, sizeof(T));
  return p ? new (p) T() : nullptr;
}
template <typename T>
void delete_obj(T* p) {
  p->~T();
  free(p);
}

// ---- device list ----------------------------------------------------------

std::mutex g_dev_mu;
// Kept for the process lifetime, like rdma-core's (never destroyed, so
// pointers programs hold stay valid during exit too).
std::vector<FDevice*>& g_devices = *new std::vector<FDevice*>();

// Asks the daemon for its devices; `out` gets the ones it has now. Device
// objects are reused across calls (a program may keep ibv_device pointers
// after freeing the list) and never freed, like rdma-core's.
int refresh_devices(std::vector<FDevice*>& out) {
  std::string path = default_socket_path();
  ShimConnection c;
  int rc = c.connect(path);
  if (rc != 0) return rc;
  ListDevicesResp r{};
  if ((rc = c.call<Op::ListDevices>({}, r)) != 0) return rc;
  for (uint32_t i = 0; i < r.count && i < kMaxDevices; i++) {
    const DeviceInfo& d = r.dev[i];
    std::string name(d.name, strnlen(d.name, sizeof(d.name)));
    auto it = std::find_if(g_devices.begin(), g_devices.end(), [&](FDevice* x) {
      return name == x->dev.name && x->socket == path && x->index == d.index;
    });
    if (it != g_devices.end()) {
      out.push_back(*it);
      continue;
    }
    auto* f = new_obj<FDevice>();
    if (f == nullptr) return -ENOMEM;
    f->dev.node_type = IBV_NODE_CA;
    f->dev.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(f->dev.name, sizeof(f->dev.name), "%s", name.c_str());
    std::snprintf(f->dev.dev_name, sizeof(f->dev.dev_name), "%s", name.c_str());
    // No sysfs: these paths name the daemon's socket, for humans.
    std::snprintf(f->dev.dev_path, sizeof(f->dev.dev_path), "%s", path.c_str());
    std::snprintf(f->dev.ibdev_path, sizeof(f->dev.ibdev_path), "%s", path.c_str());
    f->index = d.index;
    f->guid = d.node_guid;
    f->socket = path;
    g_devices.push_back(f);
    out.push_back(f);
  }
  return 0;
}

// ---- data path (reached through context->ops) ------------------------------

constexpr uint32_t kSendOpsRc = (1u << IBV_WR_RDMA_WRITE) | (1u << IBV_WR_RDMA_WRITE_WITH_IMM) |
                                (1u << IBV_WR_SEND) | (1u << IBV_WR_SEND_WITH_IMM) | (1u << IBV_WR_RDMA_READ) |
                                (1u << IBV_WR_ATOMIC_CMP_AND_SWP) | (1u << IBV_WR_ATOMIC_FETCH_AND_ADD) |
                                (1u << IBV_WR_SEND_WITH_INV) | (1u << IBV_WR_LOCAL_INV) | (1u << IBV_WR_BIND_MW);
constexpr uint32_t kSendOpsUc = (1u << IBV_WR_RDMA_WRITE) | (1u << IBV_WR_RDMA_WRITE_WITH_IMM) |
                                (1u << IBV_WR_SEND) | (1u << IBV_WR_SEND_WITH_IMM) | (1u << IBV_WR_LOCAL_INV) |
                                (1u << IBV_WR_BIND_MW);
constexpr uint32_t kSendOpsUd = (1u << IBV_WR_SEND) | (1u << IBV_WR_SEND_WITH_IMM);

// Fills one send WQE; returns 0 or a positive errno.
int fill_send(const FQp& q, const ibv_send_wr& wr, droce_shm_send_wqe* w) {
  uint32_t allowed = q.qp.qp_type == IBV_QPT_RC ? kSendOpsRc : q.qp.qp_type == IBV_QPT_UC ? kSendOpsUc : kSendOpsUd;
  int op = static_cast<int>(wr.opcode);
  if (op < 0 || op > 31 || !(allowed & (1u << op))) return EINVAL;
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > q.cap.max_send_sge) return EINVAL;
  w->wr_id = wr.wr_id;
  w->opcode = static_cast<uint8_t>(wr.opcode);
  w->send_flags = wr.send_flags & ~static_cast<uint32_t>(DROCE_SEND_BIND_TYPE1);
  w->imm_data = wr.imm_data;  // also invalidate_rkey (a union in ibv_send_wr)
  w->remote_addr = 0;
  w->rkey = 0;
  w->compare_add = w->swap = 0;
  w->ah = w->remote_qpn = w->remote_qkey = 0;
  w->inline_len = 0;
  w->reserved = 0;
  if (wr.opcode == IBV_WR_BIND_MW || wr.opcode == IBV_WR_LOCAL_INV) {
    // Local operations: no data (droce_shm_abi.h says where BIND_MW's fields go;
    // LOCAL_INV's key is in imm_data already). The daemon checks them.
    w->num_sge = 0;
    w->send_flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
    if (wr.opcode == IBV_WR_BIND_MW) {
      if (wr.bind_mw.mw == nullptr) return EINVAL;
      const ibv_mw_bind_info& b = wr.bind_mw.bind_info;
      w->imm_data = wr.bind_mw.mw->rkey;
      w->rkey = wr.bind_mw.rkey;
      w->remote_addr = b.addr;
      w->compare_add = b.length;
      w->swap = (b.mr ? b.mr->lkey : 0u) | (uint64_t{static_cast<uint32_t>(b.mw_access_flags)} << 32);
    }
    return 0;
  }
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      w->remote_addr = wr.wr.rdma.remote_addr;
      w->rkey = wr.wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      w->remote_addr = wr.wr.atomic.remote_addr;
      w->rkey = wr.wr.atomic.rkey;
      w->compare_add = wr.wr.atomic.compare_add;
      w->swap = wr.wr.atomic.swap;
      break;
    default:
      break;
  }
  if (q.qp.qp_type == IBV_QPT_UD) {
    if (wr.wr.ud.ah == nullptr) return EINVAL;
    w->ah = reinterpret_cast<const FAh*>(wr.wr.ud.ah)->ah_num;
    w->remote_qpn = wr.wr.ud.remote_qpn;
    w->remote_qkey = wr.wr.ud.remote_qkey;
  }
  bool inl = (wr.send_flags & IBV_SEND_INLINE) && wr.opcode != IBV_WR_RDMA_READ &&
             wr.opcode != IBV_WR_ATOMIC_CMP_AND_SWP && wr.opcode != IBV_WR_ATOMIC_FETCH_AND_ADD;
  if (inl) {
    // Inline: the data is copied now; the buffers need no registration.
    uint32_t total = 0;
    for (int i = 0; i < wr.num_sge; i++) {
      if (wr.sg_list[i].length > DROCE_SHM_MAX_INLINE - total) return EINVAL;
      std::memcpy(w->u.inline_data + total, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      total += wr.sg_list[i].length;
    }
    w->inline_len = static_cast<uint16_t>(total);
    w->num_sge = 0;
  } else {
    w->send_flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
    w->num_sge = static_cast<uint8_t>(wr.num_sge);
    for (int i = 0; i < wr.num_sge; i++)
      w->u.sge[i] = {wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  }
  return 0;
}

// A QP in RESET takes no work request (EINVAL, as rxe and rdma-core's tests
// expect). Only ibv_modify_qp moves a QP into or out of RESET (the engine's
// own transitions go to ERR), so the state ibv_modify_qp records is exact here.
bool in_reset(const ibv_qp* qp) { return __atomic_load_n(&qp->state, __ATOMIC_RELAXED) == IBV_QPS_RESET; }

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  auto* q = reinterpret_cast<FQp*>(qp);
  if (in_reset(qp)) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  std::lock_guard<SpinLock> g(q->ring.sq_lock);
  // free_slots() counts from the last published entry, so it includes the
  // n slots filled but not yet published.
  uint32_t free = q->ring.sq.free_slots(1);
  uint32_t n = 0;
  int rc = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (n >= free && (free = q->ring.sq.free_slots(n + 1)) <= n) {
      rc = ENOMEM;  // the send queue is full
      break;
    }
    if ((rc = fill_send(*q, *wr, q->ring.sq.slot(n))) != 0) break;
    n++;
  }
  if (n) q->ring.sq.publish(n);  // one doorbell for the whole list
  if (rc != 0 && bad) *bad = wr;
  return rc;
}

// ibv_bind_mw (type 1): a BIND_MW entry marked as posted by the bind verb,
// with the window's next key (ibv_inc_rkey), which the window takes now, as
// rdma-core's providers do (the bind completes later, in order, on the QP).
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mb) {
  if (qp == nullptr || mw == nullptr || mb == nullptr || mw->type != IBV_MW_TYPE_1 || in_reset(qp)) return EINVAL;
  auto* q = reinterpret_cast<FQp*>(qp);
  ibv_send_wr wr{};
  wr.wr_id = mb->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = mb->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = mb->bind_info;
  std::lock_guard<SpinLock> g(q->ring.sq_lock);
  if (q->ring.sq.free_slots(1) < 1) return ENOMEM;
  droce_shm_send_wqe* w = q->ring.sq.slot(0);
  if (int rc = fill_send(*q, wr, w)) return rc;
  w->send_flags |= DROCE_SEND_BIND_TYPE1;
  q->ring.sq.publish(1);
  mw->rkey = wr.bind_mw.rkey;
  return 0;
}

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  AllocMwReq q{pd->handle, static_cast<uint32_t>(type)};
  AllocMwResp r{};
  if (int rc = conn_of(pd->context).call<Op::AllocMw>(q, r)) return fail<ibv_mw>(rc);
  auto* m = new_obj<ibv_mw>();
  if (m == nullptr) {
    Empty e;
    conn_of(pd->context).call<Op::DeallocMw>({r.handle}, e);
    return fail<ibv_mw>(-ENOMEM);
  }
  m->context = pd->context;
  m->pd = pd;
  m->rkey = r.rkey;
  m->handle = r.handle;
  m->type = type;
  return m;
}

int dealloc_mw(ibv_mw* mw) {
  Empty e;
  if (int rc = conn_of(mw->context).call<Op::DeallocMw>({mw->handle}, e)) return -rc;
  delete_obj(mw);
  return 0;
}

template <typename Ring>
int post_recv_to(Ring& ring, uint32_t max_sge, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  uint32_t free = ring.free_slots(1);
  uint32_t n = 0;
  int rc = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (n >= free && (free = ring.free_slots(n + 1)) <= n) {
      rc = ENOMEM;
      break;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge) {
      rc = EINVAL;
      break;
    }
    droce_shm_recv_wqe* r = ring.slot(n);
    r->wr_id = wr->wr_id;
    r->num_sge = static_cast<uint32_t>(wr->num_sge);
    r->reserved = 0;
    for (int i = 0; i < wr->num_sge; i++) r->sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
    n++;
  }
  if (n) ring.publish(n);
  if (rc != 0 && bad) *bad = wr;
  return rc;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  auto* q = reinterpret_cast<FQp*>(qp);
  if (qp->srq != nullptr) {
    if (bad) *bad = wr;
    return EINVAL;  // receives go to the SRQ
  }
  if (in_reset(qp)) {
    if (bad) *bad = wr;
    return EINVAL;
  }
  std::lock_guard<SpinLock> g(q->ring.rq_lock);
  return post_recv_to(q->ring.rq, q->cap.max_recv_sge, wr, bad);
}

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  auto* s = reinterpret_cast<FSrq*>(srq);
  std::lock_guard<SpinLock> g(s->ring.lock);
  return post_recv_to(s->ring.rq, s->max_sge, wr, bad);
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  auto* c = reinterpret_cast<FCq*>(cq);
  std::lock_guard<SpinLock> g(c->ring.lock);
  droce_shm_cqe e[16];
  int got = 0;
  while (got < n) {
    int k = c->ring.poll(std::min(n - got, 16), e);
    for (int i = 0; i < k; i++) {
      ibv_wc& w = wc[got + i];
      w.wr_id = e[i].wr_id;
      w.status = static_cast<ibv_wc_status>(e[i].status);
      w.opcode = static_cast<ibv_wc_opcode>(e[i].opcode);
      w.vendor_err = e[i].vendor_err;
      w.byte_len = e[i].byte_len;
      w.imm_data = e[i].imm_data;
      w.qp_num = e[i].qp_num;
      w.src_qp = e[i].src_qp;
      w.wc_flags = e[i].wc_flags;
      w.pkey_index = e[i].pkey_index;
      w.slid = e[i].slid;
      w.sl = e[i].sl;
      w.dlid_path_bits = e[i].dlid_path_bits;
    }
    got += k;
    if (k < 16) break;
  }
  if (got) {
    c->empty_polls = 0;
  } else if (const uint32_t y = poll_yield_after(); y && ++c->empty_polls >= y) {
    c->empty_polls = 0;
    sched_yield();
  }
  return got;
}

int req_notify_cq(ibv_cq* cq, int solicited_only) {
  reinterpret_cast<FCq*>(cq)->ring.arm(solicited_only != 0);
  return 0;
}

// ---- extended CQ (ibv_cq_ex: ibv_start_poll / ibv_next_poll / ibv_end_poll)
// The completions are read in place in the ring; end_poll returns them all
// with one store. start_poll takes the CQ's lock and end_poll drops it
// (start_poll drops it itself when it finds nothing), as rdma-core's
// providers do; nothing between allocates or locks.

FCq* cq_of(ibv_cq_ex* c) { return reinterpret_cast<FCq*>(c); }

int cq_start_poll(ibv_cq_ex* cx, ibv_poll_cq_attr* attr) {
  FCq* c = cq_of(cx);
  if (attr != nullptr && attr->comp_mask != 0) return EINVAL;
  c->ring.lock.lock();
  const droce_shm_cqe* e = c->ring.peek(0);
  if (e == nullptr) {
    c->ring.lock.unlock();
    if (const uint32_t y = poll_yield_after(); y && ++c->empty_polls >= y) {
      c->empty_polls = 0;
      sched_yield();
    }
    return ENOENT;
  }
  c->empty_polls = 0;
  c->cur = e;
  c->polled = 1;
  cx->status = static_cast<ibv_wc_status>(e->status);
  cx->wr_id = e->wr_id;
  return 0;
}

int cq_next_poll(ibv_cq_ex* cx) {
  FCq* c = cq_of(cx);
  const droce_shm_cqe* e = c->ring.peek(c->polled);
  if (e == nullptr) return ENOENT;
  c->cur = e;
  c->polled++;
  cx->status = static_cast<ibv_wc_status>(e->status);
  cx->wr_id = e->wr_id;
  return 0;
}

void cq_end_poll(ibv_cq_ex* cx) {
  FCq* c = cq_of(cx);
  c->ring.consume(c->polled);
  c->polled = 0;
  c->cur = nullptr;
  c->ring.lock.unlock();
}

ibv_wc_opcode cq_read_opcode(ibv_cq_ex* c) { return static_cast<ibv_wc_opcode>(cq_of(c)->cur->opcode); }
uint32_t cq_read_vendor_err(ibv_cq_ex* c) { return cq_of(c)->cur->vendor_err; }
uint32_t cq_read_byte_len(ibv_cq_ex* c) { return cq_of(c)->cur->byte_len; }
// The immediate (network order) or, with IBV_WC_WITH_INV, the invalidated
// rkey (ibv_wc_read_invalidated_rkey reads the same field unconverted).
__be32 cq_read_imm_data(ibv_cq_ex* c) { return cq_of(c)->cur->imm_data; }
uint32_t cq_read_qp_num(ibv_cq_ex* c) { return cq_of(c)->cur->qp_num; }
uint32_t cq_read_src_qp(ibv_cq_ex* c) { return cq_of(c)->cur->src_qp; }
unsigned int cq_read_wc_flags(ibv_cq_ex* c) { return cq_of(c)->cur->wc_flags; }
uint32_t cq_read_slid(ibv_cq_ex* c) { return cq_of(c)->cur->slid; }
uint8_t cq_read_sl(ibv_cq_ex* c) { return cq_of(c)->cur->sl; }
uint8_t cq_read_dlid_path_bits(ibv_cq_ex* c) { return cq_of(c)->cur->dlid_path_bits; }

// What a completion carries (rxe's set): no completion timestamps (the
// engine does not stamp completions), no VLAN, flow tag or tag matching.
constexpr uint64_t kCqExWcFlags = IBV_WC_STANDARD_FLAGS;

void set_cq_ex_ops(ibv_cq_ex& x) {
  x.start_poll = cq_start_poll;
  x.next_poll = cq_next_poll;
  x.end_poll = cq_end_poll;
  x.read_opcode = cq_read_opcode;
  x.read_vendor_err = cq_read_vendor_err;
  x.read_byte_len = cq_read_byte_len;
  x.read_imm_data = cq_read_imm_data;
  x.read_qp_num = cq_read_qp_num;
  x.read_src_qp = cq_read_src_qp;
  x.read_wc_flags = cq_read_wc_flags;
  x.read_slid = cq_read_slid;
  x.read_sl = cq_read_sl;
  x.read_dlid_path_bits = cq_read_dlid_path_bits;
}

// ---- extended QP (ibv_qp_ex: the ibv_wr_* calls) -----------------------------
// ibv_wr_start takes the send queue's lock, each builder fills the next free
// slot of the send ring in place (wr_id and wr_flags from the ibv_qp_ex), the
// setters complete the slot the last builder took, and ibv_wr_complete
// publishes the whole batch with one store (the doorbell) and drops the
// lock. The first error (ring full: ENOMEM; too many SGEs or inline bytes, no
// AH: EINVAL) makes wr_complete drop the batch and return it, as
// ibv_post_send would have refused the WR. Builders exist only for the
// operations the QP was created with.

FQp* qp_of(ibv_qp_ex* q) { return reinterpret_cast<FQp*>(q); }

void wr_start(ibv_qp_ex* qx) {
  FQp* q = qp_of(qx);
  q->ring.sq_lock.lock();
  q->wr_n = 0;
  q->wr_err = 0;
  q->wr_free = q->ring.sq.free_slots(1);
}

int wr_complete(ibv_qp_ex* qx) {
  FQp* q = qp_of(qx);
  const int err = q->wr_err ? q->wr_err : (q->wr_n && in_reset(&q->qp)) ? EINVAL : 0;
  if (err == 0 && q->wr_n) q->ring.sq.publish(q->wr_n);
  q->wr_n = 0;
  q->ring.sq_lock.unlock();
  return err;
}

void wr_abort(ibv_qp_ex* qx) {
  FQp* q = qp_of(qx);
  q->wr_n = 0;  // never published: the slots are simply reused
  q->ring.sq_lock.unlock();
}

// The next slot, initialised for `op`, or nullptr (the batch has failed).
droce_shm_send_wqe* wr_next(FQp* q, uint8_t op) {
  if (q->wr_err) return nullptr;
  if (q->wr_n >= q->wr_free && (q->wr_free = q->ring.sq.free_slots(q->wr_n + 1)) <= q->wr_n) {
    q->wr_err = ENOMEM;  // the send queue is full
    return nullptr;
  }
  droce_shm_send_wqe* w = q->ring.sq.slot(q->wr_n++);
  w->wr_id = q->qpx.wr_id;
  w->remote_addr = 0;
  w->compare_add = w->swap = 0;
  w->rkey = 0;
  w->imm_data = 0;
  // Inline comes from wr_set_inline_data*, not from the flags.
  w->send_flags = q->qpx.wr_flags & ~static_cast<uint32_t>(IBV_SEND_INLINE);
  w->ah = w->remote_qpn = w->remote_qkey = 0;
  w->opcode = op;
  w->num_sge = 0;
  w->inline_len = 0;
  w->reserved = 0;
  return w;
}

// The slot the last builder filled, or nullptr (none, or the batch failed).
droce_shm_send_wqe* wr_last(FQp* q) {
  if (q->wr_err || q->wr_n == 0) return nullptr;
  return q->ring.sq.slot(q->wr_n - 1);
}

void wr_send(ibv_qp_ex* qx) { wr_next(qp_of(qx), DROCE_WR_SEND); }
void wr_send_imm(ibv_qp_ex* qx, __be32 imm) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_SEND_WITH_IMM)) w->imm_data = imm;
}
void wr_send_inv(ibv_qp_ex* qx, uint32_t rkey) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_SEND_WITH_INV)) w->imm_data = rkey;
}
void wr_rdma_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_RDMA_WRITE)) {
    w->rkey = rkey;
    w->remote_addr = addr;
  }
}
void wr_rdma_write_imm(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, __be32 imm) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_RDMA_WRITE_WITH_IMM)) {
    w->rkey = rkey;
    w->remote_addr = addr;
    w->imm_data = imm;
  }
}
void wr_rdma_read(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_RDMA_READ)) {
    w->rkey = rkey;
    w->remote_addr = addr;
  }
}
void wr_atomic_cmp_swp(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_ATOMIC_CMP_AND_SWP)) {
    w->rkey = rkey;
    w->remote_addr = addr;
    w->compare_add = compare;
    w->swap = swap;
  }
}
void wr_atomic_fetch_add(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, uint64_t add) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_ATOMIC_FETCH_AND_ADD)) {
    w->rkey = rkey;
    w->remote_addr = addr;
    w->compare_add = add;
  }
}
// BIND_MW of a type 2 window with the key the consumer chose, and LOCAL_INV:
// the same ring entries ibv_post_send makes (fill_send); the engine checks them.
void wr_bind_mw(ibv_qp_ex* qx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* b) {
  FQp* q = qp_of(qx);
  if (q->wr_err) return;
  if (mw == nullptr || b == nullptr) {
    q->wr_err = EINVAL;
    return;
  }
  if (auto* w = wr_next(q, DROCE_WR_BIND_MW)) {
    w->send_flags &= ~static_cast<uint32_t>(DROCE_SEND_BIND_TYPE1);
    w->imm_data = mw->rkey;
    w->rkey = rkey;
    w->remote_addr = b->addr;
    w->compare_add = b->length;
    w->swap = (b->mr ? b->mr->lkey : 0u) | (uint64_t{static_cast<uint32_t>(b->mw_access_flags)} << 32);
  }
}
void wr_local_inv(ibv_qp_ex* qx, uint32_t invalidate_rkey) {
  if (auto* w = wr_next(qp_of(qx), DROCE_WR_LOCAL_INV)) w->imm_data = invalidate_rkey;
}

void wr_set_ud_addr(ibv_qp_ex* qx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  FQp* q = qp_of(qx);
  droce_shm_send_wqe* w = wr_last(q);
  if (w == nullptr) return;
  if (ah == nullptr) {
    q->wr_err = EINVAL;
    return;
  }
  w->ah = reinterpret_cast<const FAh*>(ah)->ah_num;
  w->remote_qpn = remote_qpn;
  w->remote_qkey = remote_qkey;
}

void wr_set_sge(ibv_qp_ex* qx, uint32_t lkey, uint64_t addr, uint32_t length) {
  droce_shm_send_wqe* w = wr_last(qp_of(qx));
  if (w == nullptr) return;
  w->send_flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
  w->inline_len = 0;
  w->num_sge = length ? 1 : 0;  // a zero-length message has no SGE (as rxe)
  w->u.sge[0] = {addr, length, lkey};
}

void wr_set_sge_list(ibv_qp_ex* qx, size_t n, const ibv_sge* sg) {
  FQp* q = qp_of(qx);
  droce_shm_send_wqe* w = wr_last(q);
  if (w == nullptr) return;
  if (n > q->cap.max_send_sge) {
    q->wr_err = EINVAL;
    return;
  }
  w->send_flags &= ~static_cast<uint32_t>(IBV_SEND_INLINE);
  w->inline_len = 0;
  w->num_sge = static_cast<uint8_t>(n);
  for (size_t i = 0; i < n; i++) w->u.sge[i] = {sg[i].addr, sg[i].length, sg[i].lkey};
}

// Inline data is copied now; the buffers need no registration.
void wr_set_inline_data_list(ibv_qp_ex* qx, size_t n, const ibv_data_buf* bufs) {
  FQp* q = qp_of(qx);
  droce_shm_send_wqe* w = wr_last(q);
  if (w == nullptr) return;
  if (w->opcode == DROCE_WR_RDMA_READ || w->opcode == DROCE_WR_ATOMIC_CMP_AND_SWP ||
      w->opcode == DROCE_WR_ATOMIC_FETCH_AND_ADD) {
    q->wr_err = EINVAL;  // their data comes back: nothing to send inline
    return;
  }
  const size_t max = std::min<size_t>(q->cap.max_inline_data, DROCE_SHM_MAX_INLINE);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (bufs[i].length > max - total) {
      q->wr_err = EINVAL;
      return;
    }
    std::memcpy(w->u.inline_data + total, bufs[i].addr, bufs[i].length);
    total += bufs[i].length;
  }
  w->send_flags |= IBV_SEND_INLINE;
  w->inline_len = static_cast<uint16_t>(total);
  w->num_sge = 0;
}

void wr_set_inline_data(ibv_qp_ex* qx, void* addr, size_t length) {
  const ibv_data_buf b{addr, length};
  wr_set_inline_data_list(qx, 1, &b);
}

// The send operations each QP type offers (as ibv_post_send: kSendOps*);
// TSO, FLUSH and ATOMIC_WRITE are not.
constexpr uint64_t kQpExOpsRc = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                                IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                                IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
constexpr uint64_t kQpExOpsUc = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_LOCAL_INV |
                                IBV_QP_EX_WITH_BIND_MW;
constexpr uint64_t kQpExOpsUd = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;

void set_qp_ex_ops(ibv_qp_ex& x, uint64_t ops) {
  if (ops & IBV_QP_EX_WITH_SEND) x.wr_send = wr_send;
  if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM) x.wr_send_imm = wr_send_imm;
  if (ops & IBV_QP_EX_WITH_SEND_WITH_INV) x.wr_send_inv = wr_send_inv;
  if (ops & IBV_QP_EX_WITH_RDMA_WRITE) x.wr_rdma_write = wr_rdma_write;
  if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) x.wr_rdma_write_imm = wr_rdma_write_imm;
  if (ops & IBV_QP_EX_WITH_RDMA_READ) x.wr_rdma_read = wr_rdma_read;
  if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  if (ops & IBV_QP_EX_WITH_BIND_MW) x.wr_bind_mw = wr_bind_mw;
  if (ops & IBV_QP_EX_WITH_LOCAL_INV) x.wr_local_inv = wr_local_inv;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
}

ibv_qp* create_qp_ex(ibv_context* c, ibv_qp_init_attr_ex* a);
ibv_cq_ex* create_cq_ex(ibv_context* c, ibv_cq_init_attr_ex* a);

int vctx_query_port(ibv_context* c, uint8_t port, ibv_port_attr* attr, size_t len) {
  ibv_port_attr a{};
  int rc = conn_of(c).call<Op::QueryPort>({port}, a);
  if (rc != 0) return -rc;
  std::memcpy(attr, &a, std::min(len, sizeof(a)));
  return 0;
}

// ibv_query_device_ex: the base attributes, phys_port_cnt_ex and
// device_cap_flags_ex (a superset of device_cap_flags); everything else zero
// (no ODP, completion timestamps, TSO, RSS, WQs, packet pacing, tag matching,
// CQ moderation, device memory), as droce has none of them.
int vctx_query_device_ex(ibv_context* c, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                         size_t attr_size) {
  if (input != nullptr && input->comp_mask != 0) return EINVAL;
  if (attr_size < sizeof(attr->orig_attr)) return EINVAL;
  ibv_device_attr_ex a{};
  int rc = conn_of(c).call<Op::QueryDevice>({}, a.orig_attr);
  if (rc != 0) return -rc;
  a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
  a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
  std::memcpy(attr, &a, std::min(attr_size, sizeof(a)));
  return 0;
}

int gid_table(ibv_context* c, uint32_t port, GidTableResp& t) {
  return conn_of(c).call<Op::QueryGidTable>({port}, t);
}

const char* const kWcStatus[] = {
    "success", "local length error", "local QP operation error", "local EE context operation error",
    "local protection error", "Work Request Flushed Error", "memory management operation error",
    "bad response error", "local access error", "remote invalid request error", "remote access error",
    "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
    "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
    "invalid EE context state", "fatal error", "response timeout error", "general error",
    "TM error", "TM Rendezvous Error"};

}  // namespace

// ---- device list and context ------------------------------------------------

DROCE_EXPORT_1_1(ibv_get_device_list)
ibv_device** droce_v11_ibv_get_device_list(int* num) {
  std::lock_guard<std::mutex> g(g_dev_mu);
  std::vector<FDevice*> now;
  if (refresh_devices(now) != 0) now.clear();  // no daemon: an empty list, as libibverbs without devices
  auto** list = static_cast<ibv_device**>(calloc(now.size() + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < now.size(); i++) list[i] = &now[i]->dev;
  if (num) *num = static_cast<int>(now.size());
  return list;
}

DROCE_EXPORT_1_1(ibv_free_device_list)
void droce_v11_ibv_free_device_list(ibv_device** list) { free(list); }

DROCE_EXPORT_1_1(ibv_get_device_name)
const char* droce_v11_ibv_get_device_name(ibv_device* d) { return d->name; }

DROCE_EXPORT_1_1(ibv_get_device_guid)
__be64 droce_v11_ibv_get_device_guid(ibv_device* d) { return reinterpret_cast<FDevice*>(d)->guid; }

DROCE_EXPORT int ibv_get_device_index(ibv_device* d) { return static_cast<int>(reinterpret_cast<FDevice*>(d)->index); }

DROCE_EXPORT_1_1(ibv_open_device)
ibv_context* droce_v11_ibv_open_device(ibv_device* d) {
  auto* dev = reinterpret_cast<FDevice*>(d);
  auto* f = new_obj<FContext>();
  if (f == nullptr) return fail<ibv_context>(-ENOMEM);
  int rc = f->conn.connect(dev->socket);
  OpenDeviceResp r{};
  if (rc == 0) rc = f->conn.call<Op::OpenDevice>({dev->index, DROCE_SHM_ABI_VERSION}, r);
  if (rc != 0) {
    delete_obj(f);
    return fail<ibv_context>(rc);
  }
  f->dev = dev;
  verbs_context& v = f->vctx;
  v.sz = sizeof(verbs_context);
  v.query_port = vctx_query_port;
  v.create_qp_ex = create_qp_ex;
  v.create_cq_ex = create_cq_ex;
  v.query_device_ex = vctx_query_device_ex;
  ibv_context& c = v.context;
  c.device = d;
  // No kernel command fd: the context's own descriptor is its connection to
  // droced, a real fd a program may dup to share the context (rdma-core's
  // shared-PD test does); ibv_import_device on it answers EOPNOTSUPP, as rxe.
  c.cmd_fd = f->conn.fd();
  // Asynchronous events: the daemon's counter of pending events and the
  // control socket's hang-up, both behind one pollable fd.
  Empty e;
  int nfd = 0;
  f->events_fd = -1;
  f->async = new (std::nothrow) FContext::Async();
  if (f->async == nullptr) {
    delete_obj(f);
    return fail<ibv_context>(-ENOMEM);
  }
  if (f->conn.call<Op::OpenAsync>({}, e, nullptr, 0, &f->events_fd, 1, &nfd) != 0 || nfd != 1) f->events_fd = -1;
  // Before any QP or SRQ: they get a bit only from then on. Without one the
  // daemon polls their rings on every turn.
  (void)f->async->doorbell.open(f->conn);
  f->async_fd = epoll_create1(EPOLL_CLOEXEC);
  if (f->async_fd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (f->events_fd >= 0) epoll_ctl(f->async_fd, EPOLL_CTL_ADD, f->events_fd, &ev);
    ev.events = EPOLLRDHUP;
    epoll_ctl(f->async_fd, EPOLL_CTL_ADD, f->conn.fd(), &ev);
  }
  c.async_fd = f->async_fd;
  c.num_comp_vectors = static_cast<int>(proto::kCompVectors);
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  c.ops.poll_cq = poll_cq;
  c.ops.req_notify_cq = req_notify_cq;
  c.ops.post_send = post_send;
  c.ops.post_recv = post_recv;
  c.ops.post_srq_recv = post_srq_recv;
  c.ops.alloc_mw = alloc_mw;
  c.ops.dealloc_mw = dealloc_mw;
  c.ops.bind_mw = bind_mw;
  return &c;
}

DROCE_EXPORT_1_1(ibv_close_device)
int droce_v11_ibv_close_device(ibv_context* c) {
  FContext* f = ctx_of(c);
  if (f->async_fd >= 0) close(f->async_fd);
  if (f->events_fd >= 0) close(f->events_fd);
  delete f->async;
  pthread_mutex_destroy(&c->mutex);
  // Closing the connection makes the daemon destroy whatever is left.
  delete_obj(f);
  return 0;
}

DROCE_EXPORT_1_1(ibv_query_device)
int droce_v11_ibv_query_device(ibv_context* c, ibv_device_attr* attr) {
  ibv_device_attr a{};
  int rc = conn_of(c).call<Op::QueryDevice>({}, a);
  if (rc != 0) return -rc;
  *attr = a;
  return 0;
}

// The pre-1.1-header entry point: the struct is the same size minus the
// trailing fields added later, so copy only the compat part.
struct compat_port_attr_prefix {
  ibv_port_state state;
  ibv_mtu max_mtu, active_mtu;
  int gid_tbl_len;
  uint32_t port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr;
  uint16_t pkey_tbl_len, lid, sm_lid;
  uint8_t lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
      link_layer, flags;
};
DROCE_EXPORT_1_1(ibv_query_port)
int droce_v11_ibv_query_port(ibv_context* c, uint8_t port, _compat_ibv_port_attr* attr) {
  ibv_port_attr a{};
  int rc = conn_of(c).call<Op::QueryPort>({port}, a);
  if (rc != 0) return -rc;
  std::memcpy(static_cast<void*>(attr), &a, sizeof(compat_port_attr_prefix));
  return 0;
}

DROCE_EXPORT_1_1(ibv_query_gid)
int droce_v11_ibv_query_gid(ibv_context* c, uint8_t port, int index, ibv_gid* gid) {
  GidTableResp t{};
  if (gid_table(c, port, t) != 0 || index < 0) return -1;
  for (uint32_t i = 0; i < t.count; i++) {
    if (t.entry[i].gid_index == static_cast<uint32_t>(index)) {
      *gid = t.entry[i].gid;
      return 0;
    }
  }
  ibv_port_attr pa{};
  if (conn_of(c).call<Op::QueryPort>({port}, pa) != 0 || index >= pa.gid_tbl_len) return -1;
  std::memset(gid, 0, sizeof(*gid));  // an empty slot of the table
  return 0;
}

DROCE_EXPORT int ibv_query_gid_type(ibv_context* c, uint8_t port, unsigned int index, ibv_gid_type_sysfs* type) {
  GidTableResp t{};
  if (gid_table(c, port, t) != 0) return -1;
  for (uint32_t i = 0; i < t.count; i++) {
    if (t.entry[i].gid_index == index) {
      *type = t.entry[i].gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
      return 0;
    }
  }
  *type = IBV_GID_TYPE_SYSFS_ROCE_V2;  // empty slots: the port's only type
  return 0;
}

DROCE_EXPORT int _ibv_query_gid_ex(ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* entry,
                                   uint32_t flags, size_t entry_size) {
  if (flags != 0) return EINVAL;
  GidTableResp t{};
  if (int rc = gid_table(c, port, t)) return -rc;
  for (uint32_t i = 0; i < t.count; i++) {
    if (t.entry[i].gid_index == index) {
      std::memcpy(entry, &t.entry[i], std::min(entry_size, sizeof(ibv_gid_entry)));
      return 0;
    }
  }
  return ENODATA;
}

DROCE_EXPORT ssize_t _ibv_query_gid_table(ibv_context* c, ibv_gid_entry* entries, size_t max, uint32_t flags,
                                          size_t entry_size) {
  if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  ibv_device_attr da{};
  if (int rc = conn_of(c).call<Op::QueryDevice>({}, da)) return rc;
  size_t n = 0;
  for (uint32_t port = 1; port <= da.phys_port_cnt; port++) {
    GidTableResp t{};
    if (int rc = gid_table(c, port, t)) return rc;
    for (uint32_t i = 0; i < t.count; i++) {
      if (n == max) return -EINVAL;
      std::memcpy(reinterpret_cast<uint8_t*>(entries) + n * entry_size, &t.entry[i], sizeof(ibv_gid_entry));
      n++;
    }
  }
  return static_cast<ssize_t>(n);
}

DROCE_EXPORT_1_1(ibv_query_pkey)
int droce_v11_ibv_query_pkey(ibv_context*, uint8_t, int index, __be16* pkey) {
  if (index != 0) return -1;
  *pkey = htons(0xffff);  // the default partition, the only one on RoCE
  return 0;
}

DROCE_EXPORT int ibv_get_pkey_index(ibv_context*, uint8_t, __be16 pkey) {
  return ntohs(pkey) == 0xffff ? 0 : -1;
}

// ---- PD / MR ------------------------------------------------------------------

DROCE_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* c) {
  HandleResp r{};
  int rc = conn_of(c).call<Op::AllocPd>({}, r);
  if (rc != 0) return fail<ibv_pd>(rc);
  auto* p = new_obj<FPd>();
  if (p == nullptr) {
    Empty e;
    conn_of(c).call<Op::DeallocPd>({r.handle}, e);
    return fail<ibv_pd>(-ENOMEM);
  }
  p->pd.context = c;
  p->pd.handle = r.handle;
  p->handle = r.handle;
  return &p->pd;
}

DROCE_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  Empty e;
  int rc = conn_of(pd->context).call<Op::DeallocPd>({pd->handle}, e);
  if (rc != 0) return -rc;
  delete_obj(reinterpret_cast<FPd*>(pd));
  return 0;
}

DROCE_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  MrMemory m;
  int rc = prepare_mr_memory(addr, length, m);
  if (rc != 0) return fail<ibv_mr>(rc);
  // Optional access flags (IBV_ACCESS_OPTIONAL_RANGE) may be ignored.
  uint32_t acc = access & ~static_cast<uint32_t>(IBV_ACCESS_OPTIONAL_RANGE);
  RegMrReq q{pd->handle, acc, reinterpret_cast<uint64_t>(addr), length, iova, m.map_addr, m.map_len, m.fd_offset};
  RegMrResp r{};
  rc = conn_of(pd->context).call<Op::RegMr>(q, r, &m.fd, 1);
  close(m.fd);
  if (rc != 0) {
    release_mr_memory(m.entry);
    return fail<ibv_mr>(rc);
  }
  auto* f = new_obj<FMr>();
  if (f == nullptr) {
    Empty e;
    conn_of(pd->context).call<Op::DeregMr>({r.handle}, e);
    release_mr_memory(m.entry);
    return fail<ibv_mr>(-ENOMEM);
  }
  f->mr.context = pd->context;
  f->mr.pd = pd;
  f->mr.addr = addr;
  f->mr.length = length;
  f->mr.handle = r.handle;
  f->mr.lkey = r.lkey;
  f->mr.rkey = r.rkey;
  f->mem_entry = m.entry;
  return &f->mr;
}

DROCE_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uint64_t>(addr), static_cast<unsigned>(access));
}

DROCE_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

DROCE_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  Empty e;
  int rc = conn_of(mr->context).call<Op::DeregMr>({mr->handle}, e);
  if (rc != 0) return -rc;
  auto* f = reinterpret_cast<FMr*>(mr);
  release_mr_memory(f->mem_entry);
  delete_obj(f);
  return 0;
}

DROCE_EXPORT int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, int) {
  errno = EOPNOTSUPP;
  return IBV_REREG_MR_ERR_INPUT;
}

DROCE_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  return fail<ibv_mr>(-EOPNOTSUPP);
}

// ---- completion channels and CQs -------------------------------------------

DROCE_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* c) {
  HandleResp r{};
  int fd = -1, nfd = 0;
  int rc = conn_of(c).call<Op::CreateChannel>({}, r, nullptr, 0, &fd, 1, &nfd);
  if (rc == 0 && nfd != 1) rc = -EPROTO;
  if (rc != 0) return fail<ibv_comp_channel>(rc);
  auto* ch = new_obj<FChannel>();
  if (ch == nullptr) {
    close(fd);
    return fail<ibv_comp_channel>(-ENOMEM);
  }
  ch->ch.context = c;
  ch->ch.fd = fd;
  ch->handle = r.handle;
  return &ch->ch;
}

DROCE_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  auto* ch = reinterpret_cast<FChannel*>(channel);
  Empty e;
  int rc = conn_of(channel->context).call<Op::DestroyChannel>({ch->handle}, e);
  if (rc != 0) {
    errno = -rc;
    return -1;
  }
  close(channel->fd);
  delete_obj(ch);
  return 0;
}

namespace {
FCq* make_cq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  if (cqe < 1) return fail<FCq>(-EINVAL);
  auto* ch = reinterpret_cast<FChannel*>(channel);
  CreateCqResp r{};
  int fd = -1, nfd = 0;
  int rc = conn_of(c).call<Op::CreateCq>(
      {static_cast<uint32_t>(cqe), ch ? ch->handle : 0, static_cast<uint32_t>(comp_vector), 0}, r, nullptr, 0, &fd,
      1, &nfd);
  if (rc == 0 && nfd != 1) rc = -EPROTO;
  if (rc != 0) return fail<FCq>(rc);
  auto* f = new_obj<FCq>();
  if (f == nullptr || (rc = f->ring.attach(fd, r)) != 0) {
    if (f != nullptr) delete_obj(f); else close(fd);
    Empty e;
    conn_of(c).call<Op::DestroyCq>({r.handle}, e);
    return fail<FCq>(rc ? rc : -ENOMEM);
  }
  f->handle = r.handle;
  f->cq.context = c;
  f->cq.channel = channel;
  f->cq.cq_context = cq_context;
  f->cq.handle = r.handle;
  f->cq.cqe = static_cast<int>(r.cqe);
  pthread_mutex_init(&f->cq.mutex, nullptr);
  pthread_cond_init(&f->cq.cond, nullptr);
  f->events_seen = f->ring.events();
  if (ch != nullptr) {
    std::lock_guard<std::mutex> g(ch->mu);
    f->channel = ch;
    ch->cqs.push_back(f);
  }
  {
    FContext::Async& as = *ctx_of(c)->async;
    std::lock_guard<std::mutex> g(as.mu);
    as.cqs[r.handle] = &f->cq;
  }
  return f;
}

// verbs_context::create_cq_ex (ibv_create_cq_ex, inline in verbs.h).
ibv_cq_ex* create_cq_ex(ibv_context* c, ibv_cq_init_attr_ex* a) {
  if (a->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
    return fail<ibv_cq_ex>(-EINVAL);
  if (a->wc_flags & ~kCqExWcFlags) return fail<ibv_cq_ex>(-EOPNOTSUPP);  // timestamps among them
  // IBV_CREATE_CQ_ATTR_SINGLE_THREADED is a hint (the lock stays);
  // IGNORE_OVERRUN would lose completions silently: not offered.
  if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (a->flags & ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED)))
    return fail<ibv_cq_ex>(-EOPNOTSUPP);
  if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) && a->parent_domain != nullptr)
    return fail<ibv_cq_ex>(-EOPNOTSUPP);  // no parent domains
  if (a->comp_vector >= static_cast<uint32_t>(c->num_comp_vectors)) return fail<ibv_cq_ex>(-EINVAL);
  if (a->cqe > static_cast<uint32_t>(INT32_MAX)) return fail<ibv_cq_ex>(-EINVAL);
  FCq* f = make_cq(c, static_cast<int>(a->cqe), a->cq_context, a->channel, static_cast<int>(a->comp_vector));
  if (f == nullptr) return nullptr;
  set_cq_ex_ops(f->cqx);
  return &f->cqx;
}
}  // namespace

DROCE_EXPORT ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* channel,
                                   int comp_vector) {
  FCq* f = make_cq(c, cqe, cq_context, channel, comp_vector);
  return f ? &f->cq : nullptr;
}

DROCE_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  auto* f = reinterpret_cast<FCq*>(cq);
  Empty e;
  int rc = conn_of(cq->context).call<Op::DestroyCq>({f->handle}, e);
  if (rc != 0) return -rc;
  if (f->channel != nullptr) {
    std::lock_guard<std::mutex> g(f->channel->mu);
    auto& v = f->channel->cqs;
    v.erase(std::remove(v.begin(), v.end(), f), v.end());
  }
  {
    FContext::Async& as = *ctx_of(cq->context)->async;
    std::lock_guard<std::mutex> g(as.mu);
    as.cqs.erase(f->handle);
  }
  pthread_mutex_destroy(&cq->mutex);
  pthread_cond_destroy(&cq->cond);
  delete_obj(f);
  return 0;
}

// The daemon builds a ring of the new size holding the unread completions
// (EINVAL when more are unread than cqe) and the front switches to it. The
// CQ's lock keeps pollers out meanwhile, the channel's lock keeps
// ibv_get_cq_event off the old ring's event counter.
DROCE_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  auto* f = reinterpret_cast<FCq*>(cq);
  if (cqe < 1) return EINVAL;
  std::unique_lock<std::mutex> chl;
  if (f->channel != nullptr) chl = std::unique_lock<std::mutex>(f->channel->mu);
  std::lock_guard<SpinLock> g(f->ring.lock);
  CreateCqResp r{};
  int fd = -1, nfd = 0;
  int rc = conn_of(cq->context).call<Op::ResizeCq>({f->handle, static_cast<uint32_t>(cqe)}, r, nullptr, 0, &fd, 1, &nfd);
  if (rc == 0 && nfd != 1) rc = -EPROTO;
  if (rc == 0) rc = f->ring.reattach(fd, r);
  else if (fd >= 0) close(fd);
  if (rc != 0) return -rc;
  cq->cqe = static_cast<int>(r.cqe);
  return 0;
}

// One eventfd token (EFD_SEMAPHORE) per event; the CQ it belongs to is the
// one whose shared event counter moved past what we have handed out.
DROCE_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  auto* ch = reinterpret_cast<FChannel*>(channel);
  for (int tries = 0; tries < 1000000; tries++) {
    uint64_t v;
    ssize_t n = read(channel->fd, &v, sizeof(v));
    // EAGAIN for a nonblocking channel, EINTR when a signal interrupts the
    // wait, as libibverbs (programs such as qperf end a blocking wait with an
    // alarm and look at errno).
    if (n < 0) return -1;
    std::lock_guard<std::mutex> g(ch->mu);
    for (FCq* f : ch->cqs) {
      if (f->ring.events() != f->events_seen) {
        f->events_seen++;
        *cq = &f->cq;
        *cq_context = f->cq.cq_context;
        return 0;
      }
    }
    // A token for a CQ destroyed since: take the next one.
  }
  errno = EIO;
  return -1;
}

DROCE_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- SRQ ------------------------------------------------------------------------

DROCE_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
  CreateSrqResp r{};
  int fd = -1, nfd = 0;
  int rc = conn_of(pd->context).call<Op::CreateSrq>({pd->handle, 0, init->attr}, r, nullptr, 0, &fd, 1, &nfd);
  if (rc == 0 && nfd != 1) rc = -EPROTO;
  if (rc != 0) return fail<ibv_srq>(rc);
  auto* f = new_obj<FSrq>();
  if (f == nullptr || (rc = f->ring.attach(fd, r, ctx_of(pd->context)->async->doorbell.get())) != 0) {
    if (f != nullptr) delete_obj(f); else close(fd);
    Empty e;
    conn_of(pd->context).call<Op::DestroySrq>({r.handle}, e);
    return fail<ibv_srq>(rc ? rc : -ENOMEM);
  }
  f->handle = r.handle;
  f->max_sge = r.attr.max_sge;
  f->srq.context = pd->context;
  f->srq.srq_context = init->srq_context;
  f->srq.pd = pd;
  f->srq.handle = r.handle;
  pthread_mutex_init(&f->srq.mutex, nullptr);
  pthread_cond_init(&f->srq.cond, nullptr);
  init->attr = r.attr;
  {
    FContext::Async& as = *ctx_of(pd->context)->async;
    std::lock_guard<std::mutex> g(as.mu);
    as.srqs[r.handle] = &f->srq;
  }
  return &f->srq;
}

DROCE_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  Empty e;
  return -conn_of(srq->context)
              .call<Op::ModifySrq>({reinterpret_cast<FSrq*>(srq)->handle, static_cast<uint32_t>(mask), *attr}, e);
}

DROCE_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  return -conn_of(srq->context).call<Op::QuerySrq>({reinterpret_cast<FSrq*>(srq)->handle}, *attr);
}

DROCE_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  Empty e;
  auto* f = reinterpret_cast<FSrq*>(srq);
  int rc = conn_of(srq->context).call<Op::DestroySrq>({f->handle}, e);
  if (rc != 0) return -rc;
  {
    FContext::Async& as = *ctx_of(srq->context)->async;
    std::lock_guard<std::mutex> g(as.mu);
    as.srqs.erase(f->handle);
  }
  pthread_mutex_destroy(&srq->mutex);
  pthread_cond_destroy(&srq->cond);
  delete_obj(f);
  return 0;
}

// ---- QP -------------------------------------------------------------------------

namespace {
FQp* make_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
  auto* scq = reinterpret_cast<FCq*>(init->send_cq);
  auto* rcq = reinterpret_cast<FCq*>(init->recv_cq);
  auto* srq = reinterpret_cast<FSrq*>(init->srq);
  if (scq == nullptr || rcq == nullptr) return fail<FQp>(-EINVAL);
  CreateQpReq q{pd->handle, scq->handle, rcq->handle, srq ? srq->handle : 0,
                static_cast<uint32_t>(init->qp_type), static_cast<uint32_t>(init->sq_sig_all), init->cap};
  CreateQpResp r{};
  int fd = -1, nfd = 0;
  int rc = conn_of(pd->context).call<Op::CreateQp>(q, r, nullptr, 0, &fd, 1, &nfd);
  if (rc == 0 && nfd != 1) rc = -EPROTO;
  if (rc != 0) return fail<FQp>(rc);
  auto* f = new_obj<FQp>();
  if (f == nullptr || (rc = f->ring.attach(fd, r, srq != nullptr, ctx_of(pd->context)->async->doorbell.get())) != 0) {
    if (f != nullptr) delete_obj(f); else close(fd);
    Empty e;
    conn_of(pd->context).call<Op::DestroyQp>({r.handle}, e);
    return fail<FQp>(rc ? rc : -ENOMEM);
  }
  f->handle = r.handle;
  f->cap = r.cap;
  f->sq_sig_all = static_cast<uint32_t>(init->sq_sig_all);
  ibv_qp& qp = f->qp;
  qp.context = pd->context;
  qp.qp_context = init->qp_context;
  qp.pd = pd;
  qp.send_cq = init->send_cq;
  qp.recv_cq = init->recv_cq;
  qp.srq = init->srq;
  qp.handle = r.handle;
  qp.qp_num = r.qpn;
  qp.state = IBV_QPS_RESET;
  qp.qp_type = init->qp_type;
  pthread_mutex_init(&qp.mutex, nullptr);
  pthread_cond_init(&qp.cond, nullptr);
  init->cap = r.cap;
  {
    FContext::Async& as = *ctx_of(pd->context)->async;
    std::lock_guard<std::mutex> g(as.mu);
    as.qps[r.handle] = &qp;
  }
  return f;
}

// verbs_context::create_qp_ex (ibv_create_qp_ex, inline in verbs.h, comes
// here for any comp_mask other than PD alone). As rxe: a PD, no create
// flags, and send_ops_flags within what the QP type offers, else EOPNOTSUPP.
ibv_qp* create_qp_ex(ibv_context* c, ibv_qp_init_attr_ex* a) {
  constexpr uint32_t kMask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (a->comp_mask & ~kMask) return fail<ibv_qp>(-EOPNOTSUPP);
  if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags != 0) return fail<ibv_qp>(-EOPNOTSUPP);
  if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || a->pd == nullptr || a->pd->context != c)
    return fail<ibv_qp>(-EINVAL);
  const bool ex = a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (ex) {
    const uint64_t ok = a->qp_type == IBV_QPT_RC ? kQpExOpsRc
                        : a->qp_type == IBV_QPT_UC ? kQpExOpsUc
                        : a->qp_type == IBV_QPT_UD ? kQpExOpsUd
                                                   : 0;
    if (ok == 0 || (a->send_ops_flags & ~ok)) return fail<ibv_qp>(-EOPNOTSUPP);
  }
  // ibv_qp_init_attr_ex begins with the fields of ibv_qp_init_attr.
  FQp* f = make_qp(a->pd, reinterpret_cast<ibv_qp_init_attr*>(a));
  if (f == nullptr) return nullptr;
  if (ex) {
    f->is_ex = true;
    set_qp_ex_ops(f->qpx, a->send_ops_flags);
  }
  return &f->qp;
}
}  // namespace

DROCE_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
  FQp* f = make_qp(pd, init);
  return f ? &f->qp : nullptr;
}

DROCE_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  Empty e;
  int rc = conn_of(qp->context).call<Op::ModifyQp>({reinterpret_cast<FQp*>(qp)->handle, static_cast<uint32_t>(mask), *attr}, e);
  if (rc != 0) return -rc;
  if (mask & IBV_QP_STATE) __atomic_store_n(&qp->state, attr->qp_state, __ATOMIC_RELAXED);
  return 0;
}

DROCE_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) {
  auto* f = reinterpret_cast<FQp*>(qp);
  QueryQpResp r{};
  int rc = conn_of(qp->context).call<Op::QueryQp>({f->handle, static_cast<uint32_t>(mask)}, r);
  if (rc != 0) return -rc;
  *attr = r.attr;
  attr->cap = r.cap;
  if (init != nullptr) {
    *init = ibv_qp_init_attr{};
    init->qp_context = qp->qp_context;
    init->send_cq = qp->send_cq;
    init->recv_cq = qp->recv_cq;
    init->srq = qp->srq;
    init->cap = r.cap;
    init->qp_type = static_cast<ibv_qp_type>(r.qp_type);
    init->sq_sig_all = static_cast<int>(r.sq_sig_all);
  }
  return 0;
}

DROCE_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  auto* f = reinterpret_cast<FQp*>(qp);
  Empty e;
  int rc = conn_of(qp->context).call<Op::DestroyQp>({f->handle}, e);
  if (rc != 0) return -rc;
  {
    FContext::Async& as = *ctx_of(qp->context)->async;
    std::lock_guard<std::mutex> g(as.mu);
    as.qps.erase(f->handle);
  }
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete_obj(f);
  return 0;
}

// The ibv_wr_* view of a QP created by ibv_create_qp_ex with
// IBV_QP_INIT_ATTR_SEND_OPS_FLAGS; NULL for others (as rdma-core).
DROCE_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  auto* f = reinterpret_cast<FQp*>(qp);
  return f->is_ex ? &f->qpx : nullptr;
}

DROCE_EXPORT int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) { return 0; }

DROCE_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
DROCE_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }

// ---- AH -------------------------------------------------------------------------

DROCE_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  CreateAhResp r{};
  int rc = conn_of(pd->context).call<Op::CreateAh>({pd->handle, 0, *attr}, r);
  if (rc != 0) return fail<ibv_ah>(rc);
  auto* f = new_obj<FAh>();
  if (f == nullptr) {
    Empty e;
    conn_of(pd->context).call<Op::DestroyAh>({r.handle}, e);
    return fail<ibv_ah>(-ENOMEM);
  }
  f->ah.context = pd->context;
  f->ah.pd = pd;
  f->ah.handle = r.handle;
  f->ah_num = r.ah_num;
  return &f->ah;
}

DROCE_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  Empty e;
  int rc = conn_of(ah->context).call<Op::DestroyAh>({ah->handle}, e);
  if (rc != 0) return -rc;
  delete_obj(reinterpret_cast<FAh*>(ah));
  return 0;
}

// RoCE: the receive's GRH names the sender's GID (sgid) and ours (dgid).
DROCE_EXPORT int ibv_init_ah_from_wc(ibv_context* c, uint8_t port, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah) {
  if (!(wc->wc_flags & IBV_WC_GRH) || grh == nullptr) return -1;
  *ah = ibv_ah_attr{};
  ah->dlid = wc->slid;
  ah->sl = wc->sl;
  ah->port_num = port;
  ah->is_global = 1;
  ah->grh.hop_limit = 0xff;
  // RoCE v2 receives carry the packet's IP header in the 40 bytes: an IPv6
  // header as is, an IPv4 header in the last 20 (as rxe and mlx5 put it).
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  ibv_gid ours{};
  if ((raw[0] >> 4) == 6) {
    ah->grh.dgid = grh->sgid;
    ah->grh.flow_label = ntohl(grh->version_tclass_flow) & 0xfffff;
    ah->grh.traffic_class = static_cast<uint8_t>((ntohl(grh->version_tclass_flow) >> 20) & 0xff);
    ours = grh->dgid;
  } else if (raw[20] == 0x45) {  // IPv4, no options: ::ffff:a.b.c.d GIDs
    ah->grh.dgid.raw[10] = ah->grh.dgid.raw[11] = 0xff;
    std::memcpy(ah->grh.dgid.raw + 12, raw + 20 + 12, 4);  // the source address
    ours.raw[10] = ours.raw[11] = 0xff;
    std::memcpy(ours.raw + 12, raw + 20 + 16, 4);  // the destination address
    ah->grh.traffic_class = raw[21];
  } else {
    errno = EINVAL;
    return -1;
  }
  GidTableResp t{};
  if (gid_table(c, port, t) == 0) {
    for (uint32_t i = 0; i < t.count; i++)
      if (std::memcmp(t.entry[i].gid.raw, ours.raw, 16) == 0) ah->grh.sgid_index = static_cast<uint8_t>(t.entry[i].gid_index);
  }
  return 0;
}

DROCE_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port) {
  ibv_ah_attr a{};
  if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &a) != 0) return fail<ibv_ah>(-EINVAL);
  return ibv_create_ah(pd, &a);
}

// UD multicast: the daemon attaches the QP on its core (lib/engine README:
// Multicast). Returns 0 or an errno value, as libibverbs does.
DROCE_EXPORT int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (qp == nullptr || gid == nullptr) return EINVAL;
  Empty e;
  return -conn_of(qp->context).call<Op::AttachMcast>({reinterpret_cast<FQp*>(qp)->handle, lid, 0, *gid}, e);
}
DROCE_EXPORT int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (qp == nullptr || gid == nullptr) return EINVAL;
  Empty e;
  return -conn_of(qp->context).call<Op::DetachMcast>({reinterpret_cast<FQp*>(qp)->handle, lid, 0, *gid}, e);
}

// ---- asynchronous events ----------------------------------------------------------
// IBV_EVENT_QP_FATAL when a QP goes to ERR by itself, IBV_EVENT_QP_LAST_WQE_REACHED
// when a QP on an SRQ goes to ERR, IBV_EVENT_CQ_ERR on a CQ overrun,
// IBV_EVENT_SRQ_LIMIT_REACHED (the daemon counts each on events_fd,
// GetAsyncEvent names the object); IBV_EVENT_DEVICE_FATAL once when the
// daemon goes away (the control socket hangs up). Blocks unless the program
// made async_fd nonblocking (then -1 with EAGAIN), as rdma-core's.

DROCE_EXPORT int ibv_get_async_event(ibv_context* c, ibv_async_event* ev) {
  FContext* f = ctx_of(c);
  FContext::Async& as = *f->async;
  const int fl = fcntl(c->async_fd, F_GETFL);
  const bool nonblock = fl >= 0 && (fl & O_NONBLOCK);
  for (;;) {
    bool fatal_done;
    {
      std::lock_guard<std::mutex> g(as.mu);
      fatal_done = as.fatal_reported;
    }
    pollfd p[2] = {{f->events_fd, POLLIN, 0}, {fatal_done ? -1 : f->conn.fd(), POLLRDHUP, 0}};
    const int n = poll(p, 2, nonblock ? 0 : -1);
    if (n < 0) return -1;  // EINTR too, as libibverbs' read()
    if (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR)) {
      std::lock_guard<std::mutex> g(as.mu);
      if (!as.fatal_reported) {
        as.fatal_reported = true;
        // Level-triggered: the hang-up must not keep async_fd readable.
        epoll_ctl(c->async_fd, EPOLL_CTL_DEL, f->conn.fd(), nullptr);
        *ev = ibv_async_event{};
        ev->element.port_num = 1;
        ev->event_type = IBV_EVENT_DEVICE_FATAL;
        return 0;
      }
    }
    if (p[0].revents & POLLIN) {
      uint64_t v = 0;
      if (read(f->events_fd, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v))) {
        AsyncEventResp r{};
        if (f->conn.call<Op::GetAsyncEvent>({}, r) == 0) {
          std::lock_guard<std::mutex> g(as.mu);
          const auto type = static_cast<ibv_event_type>(r.event_type);
          *ev = ibv_async_event{};
          ev->event_type = type;
          // The element the event is about (it may have been destroyed meanwhile).
          if (type == IBV_EVENT_CQ_ERR) {
            if (auto it = as.cqs.find(r.handle); it != as.cqs.end()) {
              ev->element.cq = it->second;
              return 0;
            }
          } else if (type == IBV_EVENT_SRQ_LIMIT_REACHED || type == IBV_EVENT_SRQ_ERR) {
            if (auto it = as.srqs.find(r.handle); it != as.srqs.end()) {
              ev->element.srq = it->second;
              return 0;
            }
          } else if (auto it = as.qps.find(r.handle); it != as.qps.end()) {
            ev->element.qp = it->second;
            return 0;
          }
        }
      }
      continue;
    }
    if (nonblock || n == 0) {
      errno = EAGAIN;
      return -1;
    }
  }
}
// Nothing to release: destroying a QP does not wait for its events' acks.
DROCE_EXPORT void ibv_ack_async_event(ibv_async_event*) {}

// ---- fork, sysfs, misc ----------------------------------------------------------

DROCE_EXPORT int ibv_fork_init(void) { return 0; }
// Registered memory is MAP_SHARED memfd memory: a fork shares it rather than
// copying on write, so nothing breaks and nothing needs MADV_DONTFORK.
DROCE_EXPORT ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
DROCE_EXPORT int ibv_dontfork_range(void*, size_t) { return 0; }
DROCE_EXPORT int ibv_dofork_range(void*, size_t) { return 0; }

DROCE_EXPORT const char* ibv_get_sysfs_path(void) { return "/sys"; }
// droce devices have no sysfs entries.
DROCE_EXPORT int ibv_read_sysfs_file(const char*, const char*, char*, size_t) { return -1; }

DROCE_EXPORT const char* ibv_wc_status_str(ibv_wc_status s) {
  auto i = static_cast<size_t>(s);
  return i < std::size(kWcStatus) ? kWcStatus[i] : "unknown";
}

DROCE_EXPORT const char* ibv_node_type_str(ibv_node_type t) {
  static const char* const n[] = {"unknown", "InfiniBand channel adapter", "InfiniBand switch",
                                  "InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP", "unspecified"};
  auto i = static_cast<int>(t);
  return i >= 0 && i < static_cast<int>(std::size(n)) ? n[i] : "unknown";
}

DROCE_EXPORT const char* ibv_port_state_str(ibv_port_state s) {
  static const char* const n[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
                                  "PORT_ACTIVE_DEFER"};
  auto i = static_cast<size_t>(s);
  return i < std::size(n) ? n[i] : "unknown";
}

DROCE_EXPORT const char* ibv_event_type_str(ibv_event_type e) {
  static const char* const n[] = {
      "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established", "send queue drained",
      "path migrated", "path migration request error", "local catastrophic error", "port active", "port error",
      "LID change", "P_Key change", "SM change", "SRQ catastrophic error", "SRQ limit reached",
      "last WQE reached", "client reregistration", "GID table change", "WQ fatal"};
  auto i = static_cast<size_t>(e);
  return i < std::size(n) ? n[i] : "unknown";
}

namespace {
struct RateRow {
  ibv_rate rate;
  int mult;
  int mbps;
};
const RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},    {IBV_RATE_5_GBPS, 2, 5000},     {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},    {IBV_RATE_30_GBPS, 12, 30000},  {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},   {IBV_RATE_80_GBPS, 32, 80000},  {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, 0, 14062},    {IBV_RATE_56_GBPS, 0, 56250},   {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750},  {IBV_RATE_25_GBPS, 10, 25781},  {IBV_RATE_100_GBPS, 40, 103125},
    {IBV_RATE_200_GBPS, 80, 206250}, {IBV_RATE_300_GBPS, 120, 309375}, {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},   {IBV_RATE_400_GBPS, 160, 425000}, {IBV_RATE_600_GBPS, 240, 637500},
};
}  // namespace

DROCE_EXPORT int ibv_rate_to_mult(ibv_rate r) {
  for (const auto& x : kRates)
    if (x.rate == r && x.mult) return x.mult;
  return -1;
}
DROCE_EXPORT ibv_rate mult_to_ibv_rate(int mult) {
  for (const auto& x : kRates)
    if (x.mult == mult && mult) return x.rate;
  return IBV_RATE_MAX;
}
DROCE_EXPORT int ibv_rate_to_mbps(ibv_rate r) {
  for (const auto& x : kRates)
    if (x.rate == r) return x.mbps;
  return -1;
}
DROCE_EXPORT ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const auto& x : kRates)
    if (x.mbps == mbps) return x.rate;
  return IBV_RATE_MAX;
}

// Importing objects of another process's context needs kernel handles.
DROCE_EXPORT ibv_context* ibv_import_device(int) { return fail<ibv_context>(-EOPNOTSUPP); }
DROCE_EXPORT ibv_pd* ibv_import_pd(ibv_context*, uint32_t) { return fail<ibv_pd>(-EOPNOTSUPP); }
DROCE_EXPORT void ibv_unimport_pd(ibv_pd*) {}
DROCE_EXPORT ibv_mr* ibv_import_mr(ibv_pd*, uint32_t) { return fail<ibv_mr>(-EOPNOTSUPP); }
DROCE_EXPORT void ibv_unimport_mr(ibv_mr*) {}
DROCE_EXPORT ibv_dm* ibv_import_dm(ibv_context*, uint32_t) { return fail<ibv_dm>(-EOPNOTSUPP); }
DROCE_EXPORT void ibv_unimport_dm(ibv_dm*) {}

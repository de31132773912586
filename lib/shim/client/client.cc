#include "shim/client/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

namespace droce::shim {

using namespace proto;

std::string default_socket_path() {
  const char* e = std::getenv("DROCE_SOCKET");
  return e != nullptr && *e != '\0' ? std::string(e) : std::string(kDefaultSocket);
}

ShimConnection::~ShimConnection() { close(); }

void ShimConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int ShimConnection::connect(const std::string& path) {
  close();
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(sa.sun_path)) return -ENAMETOOLONG;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    int e = errno;
    ::close(fd);
    return -e;
  }
  fd_ = fd;
  return 0;
}

int ShimConnection::call_raw(Op op, const void* req, size_t req_len, void* resp, size_t resp_len,
                             const int* in_fds, int n_in, int* out_fds, int max_out, int* n_out) {
  std::lock_guard<std::mutex> g(mu_);
  *n_out = 0;
  if (fd_ < 0) return -ENOTCONN;
  alignas(16) uint8_t buf[kMaxMessage];
  if (sizeof(ReqHdr) + req_len > sizeof(buf)) return -EMSGSIZE;
  ReqHdr h{kMagic, kVersion, static_cast<uint16_t>(op), ++seq_, 0};
  std::memcpy(buf, &h, sizeof(h));
  if (req_len) std::memcpy(buf + sizeof(h), req, req_len);
  if (int rc = send_with_fds(fd_, buf, sizeof(h) + req_len, in_fds, n_in)) return rc;
  int fds[4];
  int nfds = 0;
  ssize_t n = recv_with_fds(fd_, buf, sizeof(buf), fds, 4, &nfds);
  if (n == 0) return -ECONNRESET;
  if (n < 0) return static_cast<int>(n);
  RespHdr rh;
  int rc = 0;
  if (static_cast<size_t>(n) < sizeof(rh)) {
    rc = -EPROTO;
  } else {
    std::memcpy(&rh, buf, sizeof(rh));
    if (rh.magic != kMagic || rh.seq != seq_ || rh.op != static_cast<uint16_t>(op)) {
      rc = -EPROTO;
    } else if (rh.status != 0) {
      rc = rh.status < 0 ? rh.status : -EPROTO;
    } else if (static_cast<size_t>(n) != sizeof(rh) + resp_len) {
      rc = -EPROTO;
    } else if (resp_len) {
      std::memcpy(resp, buf + sizeof(rh), resp_len);
    }
  }
  for (int i = 0; i < nfds; i++) {
    if (rc == 0 && i < max_out)
      out_fds[(*n_out)++] = fds[i];
    else
      ::close(fds[i]);
  }
  return rc;
}

int ClientCq::attach(int fd, const CreateCqResp& r) {
  if (int rc = region_.map(fd, r.region_size)) return rc;
  RingSpec spec{DROCE_SHM_RING_CQ, r.ring_entries, sizeof(droce_shm_cqe), 0, 0};
  if (!check_object_region(region_, DROCE_SHM_REGION_CQ, &spec, 1)) return -EPROTO;
  return ring_.attach(region_ring(region_, 0), r.ring_entries) ? 0 : -EPROTO;
}

int ClientCq::reattach(int fd, const CreateCqResp& r) {
  ShmRegion region;
  if (int rc = region.map(fd, r.region_size)) return rc;
  RingSpec spec{DROCE_SHM_RING_CQ, r.ring_entries, sizeof(droce_shm_cqe), 0, 0};
  if (!check_object_region(region, DROCE_SHM_REGION_CQ, &spec, 1)) return -EPROTO;
  RingConsumer<droce_shm_cqe> ring;
  if (!ring.attach(region_ring(region, 0), r.ring_entries)) return -EPROTO;
  ring_ = ring;
  region_ = std::move(region);
  return 0;
}

int ClientCq::poll(int n, droce_shm_cqe* out) {
  uint32_t a = ring_.available();
  uint32_t k = std::min<uint32_t>(a, static_cast<uint32_t>(n > 0 ? n : 0));
  for (uint32_t i = 0; i < k; i++) ring_.copy(i, &out[i]);
  if (k) ring_.release(k);
  return static_cast<int>(k);
}

int ClientDoorbell::open(ShimConnection& conn) {
  DoorbellResp r{};
  int fd = -1, nfd = 0;
  int rc = conn.call<Op::OpenDoorbell>({}, r, nullptr, 0, &fd, 1, &nfd);
  if (rc != 0) return rc;
  if (nfd != 1) return -EPROTO;
  if (r.nbits != DROCE_SHM_DB_BITS || r.region_size < sizeof(droce_shm_doorbell)) {
    ::close(fd);
    return -EPROTO;
  }
  ShmRegion region;
  if ((rc = region.map(fd, r.region_size)) != 0) return rc;
  const auto* db = static_cast<const droce_shm_doorbell*>(region.addr());
  if (db->magic != DROCE_SHM_DB_MAGIC || db->version != DROCE_SHM_ABI_VERSION) return -EPROTO;
  region_ = std::move(region);
  return 0;
}

int ClientQp::attach(int fd, const CreateQpResp& r, bool has_srq, droce_shm_doorbell* db) {
  if (int rc = region_.map(fd, r.region_size)) return rc;
  RingSpec spec[2] = {
      {DROCE_SHM_RING_SEND, r.sq_entries, sizeof(droce_shm_send_wqe), 0, 0},
      {DROCE_SHM_RING_RECV, r.rq_entries, sizeof(droce_shm_recv_wqe), 0, 0}};
  if (!check_object_region(region_, DROCE_SHM_REGION_QP, spec, has_srq ? 1 : 2)) return -EPROTO;
  if (!sq.attach(region_ring(region_, 0), r.sq_entries, false, db)) return -EPROTO;
  if (!has_srq && !rq.attach(region_ring(region_, 1), r.rq_entries, true, db)) return -EPROTO;
  return 0;
}

int ClientSrq::attach(int fd, const CreateSrqResp& r, droce_shm_doorbell* db) {
  if (int rc = region_.map(fd, r.region_size)) return rc;
  RingSpec spec{DROCE_SHM_RING_RECV, r.ring_entries, sizeof(droce_shm_recv_wqe), 0, 0};
  if (!check_object_region(region_, DROCE_SHM_REGION_SRQ, &spec, 1)) return -EPROTO;
  return rq.attach(region_ring(region_, 0), r.ring_entries, true, db) ? 0 : -EPROTO;
}

// ---- memory registry ------------------------------------------------------

namespace {
struct MemEntry {
  uint64_t start, len;
  int fd;            // the memfd (we keep it for later registrations)
  uint32_t refs;     // live MRs; alloc_shared holds one too
  bool owned_map;    // alloc_shared: we unmap on free_shared
  // Page p of [start, start+len) is at file offset p - base. Registrations
  // that copied the program's pages (not alloc_shared's) leave room below
  // (base < start, a sparse hole) and may grow the file, so a later range
  // that straddles the entry's edge joins it instead of failing.
  uint64_t base;
  bool growable;
};
std::mutex g_mem_mu;
std::map<uint32_t, MemEntry> g_mem;  // id -> entry
uint32_t g_next_mem = 1;

// Room left below a copied registration's first page for ranges that later
// extend it downwards (a hole in a sparse memfd: no memory).
constexpr uint64_t kGrowDown = 1ull << 30;

size_t pg() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// Copies whole pages of the program's memory. The pages hold more than the
// buffer being registered (its neighbours, allocator metadata), so this is
// deliberately exempt from AddressSanitizer, and written as a plain loop the
// compiler must not turn into an (intercepted) memcpy call.
__attribute__((no_sanitize("address"), optimize("no-tree-loop-distribute-patterns"))) void copy_pages(
    void* dst, const void* src, size_t len) {
  auto* d = static_cast<uint64_t*>(dst);
  const auto* s = static_cast<const uint64_t*>(src);
  for (size_t i = 0; i < len / sizeof(uint64_t); i++) d[i] = s[i];
}

// Moves the program's pages [s, e) into the entry's memfd at their offsets:
// copies them into the file, then maps the file over them at the same address.
int adopt_pages(const MemEntry& m, uint64_t s, uint64_t e) {
  if (s == e) return 0;
  void* tmp = mmap(nullptr, e - s, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, static_cast<off_t>(s - m.base));
  if (tmp == MAP_FAILED) return -errno;
  copy_pages(tmp, reinterpret_cast<const void*>(s), e - s);
  munmap(tmp, e - s);
  void* fixed = mmap(reinterpret_cast<void*>(s), e - s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m.fd,
                     static_cast<off_t>(s - m.base));
  return fixed == MAP_FAILED ? -errno : 0;
}

// A new copied registration of [s, e): a sparse memfd with kGrowDown (or as
// much as there is below s) of room under it, sealed against shrinking only.
int new_entry(uint64_t s, uint64_t e, uint32_t* id) {
  const uint64_t room = std::min<uint64_t>(kGrowDown, s);
  int fd = memfd_create("droce-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -errno;
  MemEntry m{s, e - s, fd, 0, false, s - room, true};
  if (ftruncate(fd, static_cast<off_t>(e - m.base)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    int rc = -errno;
    ::close(fd);
    return rc;
  }
  if (int rc = adopt_pages(m, s, e)) {
    ::close(fd);
    return rc;
  }
  *id = g_next_mem++;
  g_mem.emplace(*id, m);
  return 0;
}

// [s, e) overlaps entries without lying inside one. It can join the entry it
// overlaps when that is the only one and a growable one with room below:
// the pages of [s, e) outside it move into its memfd (grown as needed).
// Pages another entry holds cannot (they would leave that entry's MRs).
MemEntry* grow_entry(uint64_t s, uint64_t e, uint32_t* id, int* rc) {
  MemEntry* m = nullptr;
  for (auto& [k, x] : g_mem) {
    if (s < x.start + x.len && x.start < e) {
      if (m != nullptr) return nullptr;
      m = &x;
      *id = k;
    }
  }
  if (m == nullptr || !m->growable || s < m->base) return nullptr;
  const uint64_t lo = std::min(s, m->start), hi = std::max(e, m->start + m->len);
  struct stat st;
  if (fstat(m->fd, &st) != 0) {
    *rc = -errno;
    return nullptr;
  }
  if (hi - m->base > static_cast<uint64_t>(st.st_size) && ftruncate(m->fd, static_cast<off_t>(hi - m->base)) != 0) {
    *rc = -errno;
    return nullptr;
  }
  if ((*rc = adopt_pages(*m, lo, m->start)) != 0) return nullptr;
  m->len += m->start - lo;
  m->start = lo;
  if ((*rc = adopt_pages(*m, m->start + m->len, hi)) != 0) return nullptr;
  m->len = hi - m->start;
  return m;
}

MemEntry* find_containing(uint64_t s, uint64_t e, uint32_t* id, bool* partial) {
  *partial = false;
  for (auto& [k, m] : g_mem) {
    if (s >= m.start && e <= m.start + m.len) {
      *id = k;
      return &m;
    }
    if (s < m.start + m.len && m.start < e) *partial = true;
  }
  return nullptr;
}
}  // namespace

int prepare_mr_memory(void* addr, size_t len, MrMemory& out) {
  if (addr == nullptr || len == 0) return -EINVAL;
  const uint64_t p = pg();
  uint64_t s = reinterpret_cast<uint64_t>(addr) / p * p;
  uint64_t e = (reinterpret_cast<uint64_t>(addr) + len + p - 1) / p * p;
  std::lock_guard<std::mutex> g(g_mem_mu);
  uint32_t id = 0;
  bool partial = false;
  MemEntry* m = find_containing(s, e, &id, &partial);
  if (m == nullptr && partial) {
    int rc = -EINVAL;
    m = grow_entry(s, e, &id, &rc);
    if (m == nullptr) return rc;
  } else if (m == nullptr) {
    if (int rc = new_entry(s, e, &id)) return rc;
    m = &g_mem.at(id);
  }
  int d = fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return -errno;
  m->refs++;
  out.fd = d;
  out.map_addr = s;
  out.map_len = e - s;
  out.fd_offset = s - m->base;
  out.entry = id;
  return 0;
}

void release_mr_memory(uint32_t entry) {
  std::lock_guard<std::mutex> g(g_mem_mu);
  auto it = g_mem.find(entry);
  if (it == g_mem.end()) return;
  if (--it->second.refs == 0) {
    ::close(it->second.fd);
    g_mem.erase(it);
  }
}

void* alloc_shared(size_t len) {
  if (len == 0) return nullptr;
  ShmRegion r;
  size_t rounded = len % kHugePage == 0 ? len : page_round_up(len, pg());
  if (r.create("droce-buf", rounded, len % kHugePage == 0) != 0) return nullptr;
  std::lock_guard<std::mutex> g(g_mem_mu);
  void* a = r.addr();
  size_t sz = r.size();
  uint32_t id = g_next_mem++;
  g_mem.emplace(id, MemEntry{reinterpret_cast<uint64_t>(a), sz, r.release_fd(), 1, true, reinterpret_cast<uint64_t>(a), false});
  r.forget_mapping();  // the mapping now belongs to the registry entry
  return a;
}

void free_shared(void* p) {
  std::lock_guard<std::mutex> g(g_mem_mu);
  for (auto it = g_mem.begin(); it != g_mem.end(); ++it) {
    if (it->second.owned_map && it->second.start == reinterpret_cast<uint64_t>(p)) {
      munmap(p, it->second.len);
      it->second.owned_map = false;
      if (--it->second.refs == 0) {
        ::close(it->second.fd);
        g_mem.erase(it);
      }
      return;
    }
  }
}

}  // namespace droce::shim

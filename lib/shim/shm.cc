#include "shim/shm.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "shim/ring.h"

namespace droce::shim {

ShmRegion& ShmRegion::operator=(ShmRegion&& o) noexcept {
  if (this != &o) {
    reset();
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    fd_ = std::exchange(o.fd_, -1);
    huge_ = std::exchange(o.huge_, false);
  }
  return *this;
}

void ShmRegion::reset() {
  if (addr_ != nullptr) munmap(addr_, size_);
  if (fd_ >= 0) close(fd_);
  addr_ = nullptr;
  size_ = 0;
  fd_ = -1;
  huge_ = false;
}

int ShmRegion::create(const char* name, size_t size, bool try_huge) {
  reset();
  if (size == 0) return -EINVAL;
  int fd = -1;
  bool huge = false;
  if (try_huge && size % kHugePage == 0) {
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | MFD_HUGE_2MB);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) != 0) {
      close(fd);
      fd = -1;
    }
    huge = fd >= 0;
  }
  if (fd < 0) {
    size = page_round_up(size, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -errno;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      int e = errno;
      close(fd);
      return -e;
    }
  }
  // MAP_POPULATE: the pages exist before the data path touches them; a
  // hugetlbfs file without free pages fails here rather than with SIGBUS later.
  void* a = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (a == MAP_FAILED) {
    int e = errno;
    close(fd);
    if (huge) return create(name, size, false);
    return -e;
  }
  // The size is final: whoever receives the fd cannot shrink the file under
  // the other side's mapping (which would turn its accesses into SIGBUS).
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    munmap(a, size);
    close(fd);
    return -e;
  }
  addr_ = a;
  size_ = size;
  fd_ = fd;
  huge_ = huge;
  return 0;
}

int ShmRegion::map(int fd, size_t size) {
  reset();
  struct stat st;
  if (fd < 0) return -EBADF;
  if (fstat(fd, &st) != 0 || size == 0 || static_cast<uint64_t>(st.st_size) < size) {
    close(fd);
    return -EINVAL;
  }
  void* a = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (a == MAP_FAILED) {
    int e = errno;
    close(fd);
    return -e;
  }
  addr_ = a;
  size_ = size;
  fd_ = fd;
  return 0;
}

int create_object_region(ShmRegion& out, uint32_t region_kind, uint32_t object_num,
                         const RingSpec* rings, uint32_t nrings, bool always_huge) {
  if (nrings < 1 || nrings > 2) return -EINVAL;
  uint64_t off[2] = {0, 0};
  uint64_t size = sizeof(droce_shm_region_hdr);
  for (uint32_t i = 0; i < nrings; i++) {
    if (!ring_geometry_ok(rings[i].entries)) return -EINVAL;
    off[i] = size;
    size += droce_shm_ring_bytes(rings[i].entries, rings[i].entry_size);
  }
  // Rings of 1 MiB or more go to hugepages when there are free ones.
  bool huge = always_huge || size >= (1u << 20);
  size_t alloc = huge ? page_round_up(size, kHugePage) : size;
  int rc = out.create("droce-ring", alloc, huge);
  if (rc != 0) return rc;
  auto* h = static_cast<droce_shm_region_hdr*>(out.addr());
  std::memset(static_cast<void*>(h), 0, sizeof(*h));
  h->magic = DROCE_SHM_MAGIC;
  h->version = DROCE_SHM_ABI_VERSION;
  h->kind = region_kind;
  h->nrings = nrings;
  h->size = out.size();
  h->object_num = object_num;
  for (uint32_t i = 0; i < nrings; i++) {
    h->ring_off[i] = off[i];
    ring_init(region_ring(out, i), rings[i].kind, rings[i].entries, rings[i].entry_size,
              rings[i].max_sge, rings[i].max_inline);
  }
  return 0;
}

droce_shm_ring_hdr* region_ring(const ShmRegion& r, uint32_t i) {
  auto* h = static_cast<const droce_shm_region_hdr*>(r.addr());
  return reinterpret_cast<droce_shm_ring_hdr*>(r.bytes() + h->ring_off[i]);
}

bool check_object_region(const ShmRegion& r, uint32_t region_kind, const RingSpec* rings,
                         uint32_t nrings) {
  if (r.addr() == nullptr || r.size() < sizeof(droce_shm_region_hdr)) return false;
  auto* h = static_cast<const droce_shm_region_hdr*>(r.addr());
  if (h->magic != DROCE_SHM_MAGIC || h->version != DROCE_SHM_ABI_VERSION || h->kind != region_kind ||
      h->nrings != nrings)
    return false;
  for (uint32_t i = 0; i < nrings; i++) {
    uint64_t end = h->ring_off[i] + droce_shm_ring_bytes(rings[i].entries, rings[i].entry_size);
    if (h->ring_off[i] % DROCE_SHM_CACHELINE != 0 || end > r.size()) return false;
    const droce_shm_ring_hdr* g = region_ring(r, i);
    if (g->magic != DROCE_SHM_RING_MAGIC || g->kind != rings[i].kind || g->entries != rings[i].entries ||
        g->entry_size != rings[i].entry_size)
      return false;
  }
  return true;
}

int send_with_fds(int sock, const void* buf, size_t len, const int* fds, int nfds) {
  constexpr int kMax = 4;
  if (nfds < 0 || nfds > kMax) return -EINVAL;
  iovec iov{const_cast<void*>(buf), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMax)];
  if (nfds > 0) {
    std::memset(cbuf, 0, sizeof(cbuf));
    msg.msg_control = cbuf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<size_t>(nfds));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<size_t>(nfds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * static_cast<size_t>(nfds));
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n) == len ? 0 : -EMSGSIZE;
    if (errno != EINTR) return -errno;
  }
}

ssize_t recv_with_fds(int sock, void* buf, size_t cap, int* fds, int max_fds, int* nfds) {
  constexpr int kMax = 4;
  iovec iov{buf, cap};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMax)];
  msg.msg_control = cbuf;
  msg.msg_controllen = sizeof(cbuf);
  *nfds = 0;
  ssize_t n;
  for (;;) {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno != EINTR) return -errno;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < cnt; i++) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*nfds < max_fds)
        fds[(*nfds)++] = fd;
      else
        close(fd);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (int i = 0; i < *nfds; i++) close(fds[i]);
    *nfds = 0;
    return -EMSGSIZE;
  }
  return n;
}

}  // namespace droce::shim

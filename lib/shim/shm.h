// Shared-memory regions (memfd, optionally hugetlbfs-backed) and fd passing
// over Unix sockets. Control path only; no DPDK.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "shim/droce_shm_abi.h"

namespace droce::shim {

// An owned fd + MAP_SHARED mapping of it. Movable, not copyable.
class ShmRegion {
 public:
  ShmRegion() = default;
  ~ShmRegion() { reset(); }
  ShmRegion(ShmRegion&& o) noexcept { *this = std::move(o); }
  ShmRegion& operator=(ShmRegion&& o) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  // Creates a memfd of `size` bytes and maps it. With try_huge and a size
  // that is a multiple of 2 MiB, tries MFD_HUGETLB first. Returns 0 or -errno.
  int create(const char* name, size_t size, bool try_huge);
  // Maps an fd received from the peer (takes ownership of fd). The size is
  // checked against fstat. Returns 0 or -errno (fd closed on error).
  int map(int fd, size_t size);
  void reset();

  void* addr() const { return addr_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(addr_); }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  bool huge() const { return huge_; }
  // Gives up the fd (the mapping stays). The caller closes it.
  int release_fd() { return std::exchange(fd_, -1); }
  // Gives up the mapping (it stays mapped; the caller unmaps it).
  void forget_mapping() {
    addr_ = nullptr;
    size_ = 0;
  }

 private:
  void* addr_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  bool huge_ = false;
};

// One region holding the rings of one object (see droce_shm_abi.h).
struct RingSpec {
  uint32_t kind;  // droce_shm_ring_kind
  uint32_t entries;
  uint32_t entry_size;
  uint32_t max_sge;
  uint32_t max_inline;
};
// Creates and initialises the region; ring i starts at hdr->ring_off[i].
// Hugepages (2 MiB, MFD_HUGETLB) when free and either the rings need
// 1 MiB or more or always_huge is set; 4 KiB pages otherwise.
int create_object_region(ShmRegion& out, uint32_t region_kind, uint32_t object_num,
                         const RingSpec* rings, uint32_t nrings, bool always_huge = false);
// Checks a mapped region against what the create response promised.
bool check_object_region(const ShmRegion& r, uint32_t region_kind, const RingSpec* rings,
                         uint32_t nrings);
droce_shm_ring_hdr* region_ring(const ShmRegion& r, uint32_t i);

// sendmsg/recvmsg with SCM_RIGHTS. send: returns 0 or -errno.
// recv: returns bytes received (0 = peer closed) or -errno; received fds are
// O_CLOEXEC; fds beyond max_fds are closed.
int send_with_fds(int sock, const void* buf, size_t len, const int* fds, int nfds);
ssize_t recv_with_fds(int sock, void* buf, size_t cap, int* fds, int max_fds, int* nfds);

constexpr size_t kHugePage = 2u << 20;
inline size_t page_round_up(size_t n, size_t page) { return (n + page - 1) / page * page; }

}  // namespace droce::shim

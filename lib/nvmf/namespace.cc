#include "nvmf/namespace.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace droce::nvmf {

namespace {
// A stable 128-bit identifier from the NQN and NSID (FNV-1a, two lanes), so a
// namespace keeps its identity across restarts without configuration; a UUID
// gets the version 4 / variant 1 bits.
std::array<uint8_t, 16> derive_id(const std::string& nqn, uint32_t nsid, uint64_t salt) {
  uint64_t h[2] = {0xcbf29ce484222325ull ^ salt, 0x84222325cbf29ce4ull ^ (salt * 31)};
  auto mix = [&](uint8_t c) {
    for (auto& x : h) x = (x ^ c) * 0x100000001b3ull;
  };
  for (char c : nqn) mix(static_cast<uint8_t>(c));
  for (int i = 0; i < 4; ++i) mix(static_cast<uint8_t>(nsid >> (8 * i)));
  h[1] ^= h[0] >> 17;
  std::array<uint8_t, 16> id{};
  for (int i = 0; i < 8; ++i) {
    id[i] = static_cast<uint8_t>(h[0] >> (8 * i));
    id[8 + i] = static_cast<uint8_t>(h[1] >> (8 * i));
  }
  return id;
}
bool all_zero(const std::array<uint8_t, 16>& a) {
  for (uint8_t x : a)
    if (x) return false;
  return true;
}
}  // namespace

void Namespace::identify_from(const NamespaceConfig& c, const std::string& subnqn) {
  if (c.nsid == 0 || c.nsid == 0xffffffffu) throw std::invalid_argument("namespace nsid: must be 1..0xfffffffe");
  if (c.block_size != 512 && c.block_size != 4096)
    throw std::invalid_argument("namespace " + std::to_string(c.nsid) + " block_size: must be 512 or 4096");
  nsid_ = c.nsid;
  shift_ = c.block_size == 512 ? 9 : 12;
  uuid_ = all_zero(c.uuid) ? derive_id(subnqn, c.nsid, 1) : c.uuid;
  if (all_zero(c.uuid)) {
    uuid_[6] = static_cast<uint8_t>((uuid_[6] & 0x0f) | 0x40);
    uuid_[8] = static_cast<uint8_t>((uuid_[8] & 0x3f) | 0x80);
  }
  nguid_ = all_zero(c.nguid) ? derive_id(subnqn, c.nsid, 2) : c.nguid;
}

std::unique_ptr<Namespace> Namespace::ram(const NamespaceConfig& c, const std::string& subnqn) {
  std::unique_ptr<Namespace> n(new Namespace);
  n->identify_from(c, subnqn);
  if (c.size_bytes == 0 || c.size_bytes % c.block_size)
    throw std::invalid_argument("namespace " + std::to_string(c.nsid) + " size: must be a positive multiple of block_size");
  n->blocks_ = c.size_bytes / c.block_size;
  n->mem_.reset(new uint8_t[c.size_bytes]());  // zero-filled
  return n;
}

std::unique_ptr<Namespace> Namespace::file(const NamespaceConfig& c, const std::string& subnqn, const std::string& path) {
  std::unique_ptr<Namespace> n(new Namespace);
  n->identify_from(c, subnqn);
  n->backend_ = Backend::File;
  const std::string what = "namespace " + std::to_string(c.nsid) + " path " + path;
  if (c.size_bytes % c.block_size)
    throw std::invalid_argument("namespace " + std::to_string(c.nsid) + " size: must be a multiple of block_size");
  auto sys = [&](const char* step) { return std::system_error(errno, std::generic_category(), what + ": " + step); };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) throw sys("stat");
    if (c.size_bytes == 0)
      throw std::invalid_argument(what + ": does not exist and no size is given to create it");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw sys("create");
    if (::ftruncate(fd, static_cast<off_t>(c.size_bytes)) != 0) {
      int e = errno;
      ::close(fd);
      ::unlink(path.c_str());
      errno = e;
      throw sys("ftruncate");
    }
    ::close(fd);
    if (::stat(path.c_str(), &st) != 0) throw sys("stat");
  }
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))
    throw std::invalid_argument(what + ": neither a regular file nor a block device");
  n->blkdev_ = S_ISBLK(st.st_mode);
  n->fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (n->fd_ < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
    n->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    n->read_only_ = true;
  }
  if (n->fd_ < 0) throw sys("open");
  uint64_t bytes = static_cast<uint64_t>(st.st_size);
  uint32_t lbs = 0;  // the device's logical block size (block devices)
  if (n->blkdev_) {
    if (::ioctl(n->fd_, BLKGETSIZE64, &bytes) != 0) throw sys("BLKGETSIZE64");
    int ss = 0;
    if (::ioctl(n->fd_, BLKSSZGET, &ss) == 0 && ss > 0) lbs = static_cast<uint32_t>(ss);
  }
  if (c.size_bytes && c.size_bytes != bytes)
    throw std::invalid_argument(what + ": its size " + std::to_string(bytes) + " differs from the configured size " +
                                std::to_string(c.size_bytes));
  n->blocks_ = bytes >> n->shift_;
  if (n->blocks_ == 0) throw std::invalid_argument(what + ": smaller than one block");
  // O_DIRECT: a second descriptor, and the alignment it needs.
  n->dfd_ = ::open(path.c_str(), (n->read_only_ ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC);
  if (n->dfd_ >= 0) {
    uint32_t align = lbs;
#ifdef STATX_DIOALIGN
    struct statx sx {};
    if (!align && ::statx(n->dfd_, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align)
      align = std::max(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
#endif
    n->dalign_ = align ? align : 4096;  // unknown: the largest common sector size
  }
  return n;
}

std::unique_ptr<Namespace> Namespace::file_fd(const NamespaceConfig& c, const std::string& subnqn, int fd, bool read_only) {
  std::unique_ptr<Namespace> n(new Namespace);
  n->fd_ = fd;  // adopted, closed by the destructor even when a check below throws
  n->backend_ = Backend::File;
  n->identify_from(c, subnqn);
  if (fd < 0) throw std::invalid_argument("namespace " + std::to_string(c.nsid) + ": no file descriptor");
  if (c.size_bytes == 0 || c.size_bytes % c.block_size)
    throw std::invalid_argument("namespace " + std::to_string(c.nsid) + " size: must be a positive multiple of block_size");
  n->blocks_ = c.size_bytes / c.block_size;
  n->read_only_ = read_only;
  return n;
}

Namespace::~Namespace() {
  if (fd_ >= 0) ::close(fd_);
  if (dfd_ >= 0) ::close(dfd_);
}

void Namespace::read(uint64_t slba, std::span<uint8_t> out) const noexcept {
  std::memcpy(out.data(), mem_.get() + (slba << shift_), out.size());
}

void Namespace::write(uint64_t slba, std::span<const uint8_t> in) noexcept {
  std::memcpy(mem_.get() + (slba << shift_), in.data(), in.size());
}

void Namespace::zero(uint64_t slba, uint64_t nlb) noexcept {
  std::memset(mem_.get() + (slba << shift_), 0, nlb << shift_);
}

}  // namespace droce::nvmf

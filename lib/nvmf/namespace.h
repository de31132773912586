// A namespace of an NVM subsystem: NSID, LBA format, identifiers, and its
// backend. RAM: plain memory, read and written synchronously from any core
// (the NVMe ordering rules leave overlapping commands unordered). File: a
// regular file or a block device, never touched synchronously on a command's
// path: the controller describes the command (FileOp) and the queue's core
// submits it to its io_uring (io_ring.h). The namespace only holds the file
// descriptors and what was learned about the file (read-only, O_DIRECT
// alignment, which zeroing methods work); it is shared read-only by every
// core but for those learned flags (atomics).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "nvmf/identify.h"
#include "nvmf/spec.h"

namespace droce::nvmf {

struct NamespaceConfig {
  uint32_t nsid = 1;
  uint32_t block_size = 512;   // 512 or 4096
  uint64_t size_bytes = 0;     // a multiple of block_size, > 0
  std::array<uint8_t, 16> uuid{};   // zero: derived from (subsystem NQN, NSID)
  std::array<uint8_t, 16> nguid{};  // zero: derived likewise
};

// What a file namespace must do for one command (Controller::execute_io
// answers Response::pending with it; IoRing carries it out).
struct FileOp {
  enum Kind : uint8_t { None, Read, Write, Flush, WriteZeroes, Deallocate };
  Kind kind = None;
  uint64_t offset = 0;   // bytes (Read, Write, WriteZeroes)
  uint64_t length = 0;   // bytes (Read, Write, WriteZeroes)
  uint32_t ranges = 0;   // Deallocate: DSM ranges (16 bytes each) at the start of the data buffer
};

class Namespace {
 public:
  enum class Backend : uint8_t { Ram, File };

  // A RAM disk, zero-filled. Throws std::invalid_argument naming the bad field.
  static std::unique_ptr<Namespace> ram(const NamespaceConfig& c, const std::string& subnqn);
  // A regular file or a block device at path. Absent file: created with
  // c.size_bytes (sparse), or an error when size_bytes is 0. Existing file:
  // its size (rounded down to blocks) is the capacity; a size_bytes given
  // must match it. Block device: the size from BLKGETSIZE64. Opened
  // read-write, or read-only when the file refuses writing (EACCES, EROFS,
  // EPERM; writes are then answered Namespace Is Write Protected); a second
  // descriptor with O_DIRECT when the file system allows it, used for the
  // commands whose offset, length and buffer meet its alignment. Throws
  // std::invalid_argument (bad config) or std::system_error (the file).
  static std::unique_ptr<Namespace> file(const NamespaceConfig& c, const std::string& subnqn, const std::string& path);
  // A file namespace over an open descriptor (adopted, closed with the
  // namespace), c.size_bytes of capacity, no O_DIRECT: any file type io_uring
  // reads and writes (tests use a FIFO as a backend that answers only when
  // written to, and a read-only descriptor for write errors).
  static std::unique_ptr<Namespace> file_fd(const NamespaceConfig& c, const std::string& subnqn, int fd, bool read_only);
  ~Namespace();
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  uint32_t nsid() const noexcept { return nsid_; }
  uint32_t block_size() const noexcept { return 1u << shift_; }
  uint8_t lba_shift() const noexcept { return shift_; }
  uint64_t blocks() const noexcept { return blocks_; }
  const std::array<uint8_t, 16>& uuid() const noexcept { return uuid_; }
  const std::array<uint8_t, 16>& nguid() const noexcept { return nguid_; }
  NsIdentity identity() const noexcept { return {blocks_, shift_, 0x09, nguid_, static_cast<uint8_t>(read_only_ ? 1 : 0)}; }

  // True when [slba, slba + nlb) lies inside the namespace (no overflow).
  bool in_range(uint64_t slba, uint64_t nlb) const noexcept { return nlb <= blocks_ && slba <= blocks_ - nlb; }
  Backend backend() const noexcept { return backend_; }
  bool is_file() const noexcept { return backend_ == Backend::File; }
  bool read_only() const noexcept { return read_only_; }
  bool block_device() const noexcept { return blkdev_; }
  // File: the buffered descriptor, the O_DIRECT one (-1: none) and its
  // alignment (offset, length and memory address).
  int fd() const noexcept { return fd_; }
  int direct_fd() const noexcept { return dfd_; }
  uint32_t direct_align() const noexcept { return dalign_; }
  // Zeroing methods a file refused (EOPNOTSUPP/EINVAL), learned at run time
  // by whichever core tried first: bit 0 FALLOC_FL_ZERO_RANGE, bit 1
  // FALLOC_FL_PUNCH_HOLE. Writing zeroes always works.
  uint8_t zeroing_refused() const noexcept { return refused_.load(std::memory_order_relaxed); }
  void refuse_zeroing(uint8_t bit) const noexcept { refused_.fetch_or(bit, std::memory_order_relaxed); }

  // RAM only. Callers check the range first; out.size() / in.size() == nlb << lba_shift.
  void read(uint64_t slba, std::span<uint8_t> out) const noexcept;
  void write(uint64_t slba, std::span<const uint8_t> in) noexcept;
  void zero(uint64_t slba, uint64_t nlb) noexcept;  // Write Zeroes, deallocate (reads zeroes after)

 private:
  Namespace() = default;
  void identify_from(const NamespaceConfig& c, const std::string& subnqn);
  Backend backend_ = Backend::Ram;
  int fd_ = -1, dfd_ = -1;
  uint32_t dalign_ = 0;
  bool read_only_ = false, blkdev_ = false;
  mutable std::atomic<uint8_t> refused_{0};
  uint32_t nsid_ = 0;
  uint8_t shift_ = 9;
  uint64_t blocks_ = 0;
  std::array<uint8_t, 16> uuid_{}, nguid_{};
  std::unique_ptr<uint8_t[]> mem_;
};

}  // namespace droce::nvmf

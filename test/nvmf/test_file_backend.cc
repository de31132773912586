// File namespaces over io_uring (lib/nvmf/io_ring.cc) driven through a Queue
// and a fake RDMA host, on temporary files: data written then read back (and
// found in the file), Flush, Write Zeroes by each zeroing method, Dataset
// Management deallocate, out-of-range LBAs, a read past a file cut short,
// errors from the kernel and write protection, 128 commands in flight
// resumed out of order behind a backend that answers only when told (a
// FIFO), and a poll loop that goes on while that backend holds a request.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fake_host.h"
#include "nvmf/io_ring.h"
#include "nvmf/le.h"
#include "nvmf/queue.h"

using namespace droce::nvmf;
using Clock = std::chrono::steady_clock;

namespace {
constexpr const char* kSub = "nqn.2026-12.org.droce:file0";
constexpr const char* kHost = "nqn.2014-08.org.nvmexpress:uuid:2b4e28ba-2fa1-11d2-883f-0016d3cca427";
constexpr uint32_t kBlocks = 16384;  // 8 MiB of 512-byte blocks
constexpr uint32_t kSlot = 131072;   // MDTS 5

struct TempDir {
  std::string path;
  TempDir() {
    char d[] = "/tmp/droce-nvmf-file-XXXXXX";
    REQUIRE(mkdtemp(d));
    path = d;
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path + "'";
    (void)!std::system(cmd.c_str());
  }
};

struct AlignedMem {
  uint8_t* p;
  size_t n;
  explicit AlignedMem(size_t bytes) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))), n(bytes) {
    std::memset(p, 0, n);
  }
  ~AlignedMem() { std::free(p); }
  std::span<uint8_t> span() { return {p, n}; }
};

// The host (fake_host.h): its memory, the responses by cid and the cids in
// the order their responses came.
struct Host : testing::HostMemory {
  std::map<uint16_t, Cqe> done;
  std::vector<uint16_t> order;

  // Carries out every action q has now.
  void pump(Queue& q) {
    std::array<Action, 16> a;
    for (size_t n; (n = q.take_actions(a)) > 0;)
      for (size_t i = 0; i < n; ++i)
        if (auto c = carry_out(q, a[i], 0)) {
          done[c->cid] = *c;
          order.push_back(c->cid);
        }
  }
  // The poll loop: ring and queue until cid is answered (bounded).
  Cqe wait(Queue& q, IoRing* ring, uint16_t cid) {
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!done.count(cid)) {
      if (Clock::now() > deadline) FAIL("command " << cid << " not answered within 20 s");
      if (ring) ring->poll();
      pump(q);
    }
    return done[cid];
  }
  static void rw(Sqe& s, uint64_t slba, uint32_t nlb) {
    s.cdw10 = static_cast<uint32_t>(slba);
    s.cdw11 = static_cast<uint32_t>(slba >> 32);
    s.cdw12 = nlb - 1;
  }
  // Sends a command; returns its cid (the answer comes through wait()).
  uint16_t send(Queue& q, const Sqe& s, std::span<const uint8_t> icd = {}) {
    q.on_capsule(capsule(s, icd), 0);
    pump(q);
    return s.cid;
  }
  uint16_t write(Queue& q, uint32_t nsid, uint64_t slba, const std::vector<uint8_t>& data, bool in_capsule = false) {
    Sqe s = cmd(0x01, nsid);
    rw(s, slba, static_cast<uint32_t>(data.size() / 512));
    if (in_capsule) {
      encode_sgl(s.dptr, Sgl{SglKind::InCapsule, 0, static_cast<uint32_t>(data.size())});
      return send(q, s, data);
    }
    keyed(s, region(data), static_cast<uint32_t>(data.size()));
    return send(q, s);
  }
  // A read into a new region; *key receives the region.
  uint16_t read(Queue& q, uint32_t nsid, uint64_t slba, uint32_t nlb, uint32_t* key) {
    Sqe s = cmd(0x02, nsid);
    rw(s, slba, nlb);
    *key = region(std::vector<uint8_t>(size_t{nlb} * 512, 0xcc));
    keyed(s, *key, nlb * 512);
    return send(q, s);
  }
  uint16_t read_into(Queue& q, uint32_t nsid, uint64_t slba, uint32_t nlb, uint32_t key) {
    Sqe s = cmd(0x02, nsid);
    rw(s, slba, nlb);
    keyed(s, key, nlb * 512);
    return send(q, s);
  }
  uint16_t dsm(Queue& q, uint32_t nsid, const std::vector<std::array<uint64_t, 2>>& ranges, bool deallocate) {
    Sqe s = cmd(0x09, nsid);
    s.cdw10 = static_cast<uint32_t>(ranges.size() - 1);
    s.cdw11 = deallocate ? 1u << 2 : 0;
    std::vector<uint8_t> d(ranges.size() * 16, 0);
    for (size_t i = 0; i < ranges.size(); ++i) {
      le::put32(&d[16 * i + 4], static_cast<uint32_t>(ranges[i][1]));
      le::put64(&d[16 * i + 8], ranges[i][0]);
    }
    keyed(s, region(d), static_cast<uint32_t>(d.size()));
    return send(q, s);
  }
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> file_bytes(const std::string& path, uint64_t off, size_t n) {
  std::vector<uint8_t> v(n, 0xee);
  int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ssize_t r = ::pread(fd, v.data(), n, static_cast<off_t>(off));
  ::close(fd);
  REQUIRE(r == static_cast<ssize_t>(n));
  return v;
}

bool all_zero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t x) { return x == 0; });
}

// A target with one subsystem, its admin queue connected and enabled, and an
// I/O queue (qid 1) on an IoRing. Namespaces are added by the test first.
struct Rig {
  TempDir dir;
  std::string img;
  Target target;
  Subsystem* sub;
  Host h;
  IoRing ring;
  AlignedMem amem{4 * 4096}, imem;
  std::unique_ptr<Queue> admin, io;
  uint16_t depth;

  size_t skew = 0;  // bytes the I/O queue's data memory starts past a page boundary

  explicit Rig(uint16_t depth_ = 32, unsigned ring_entries = 128, size_t skew_ = 0, unsigned timeout_ms = 10000)
      : target([] {
          TargetConfig c;
          c.in_capsule_data = 8192;
          c.mdts = 5;
          c.max_queue_depth = 128;
          return c;
        }()),
        ring(ring_entries, timeout_ms),
        imem(size_t{depth_} * kSlot + 4096),
        depth(depth_),
        skew(skew_) {
    img = dir.path + "/disk.img";
    sub = &target.add_subsystem(kSub, "F1", false);
    sub->allow_host(kHost);
    sub->add_namespace(Namespace::file({1, 512, uint64_t{kBlocks} * 512}, kSub, img));
  }
  Namespace& ns1() { return *sub->ns(1); }

  std::array<uint8_t, 1024> connect_data(uint16_t cntlid) {
    ConnectData d;
    d.cntlid = cntlid;
    d.subnqn = kSub;
    d.hostnqn = kHost;
    std::array<uint8_t, 1024> b;
    encode_connect_data(b, d);
    return b;
  }
  void connect(IoRing* io_ring) {
    admin = std::make_unique<Queue>(target, QueueConfig{0, 4, 4096}, amem.span());
    Sqe c = h.cmd(0x7f);
    encode_connect(c, ConnectCmd{0, 0, 3, 0, 0});
    encode_sgl(c.dptr, Sgl{SglKind::InCapsule, 0, 1024});
    auto cd = connect_data(0xffff);
    REQUIRE(h.wait(*admin, nullptr, h.send(*admin, c, cd)).status.ok());
    auto cntlid = static_cast<uint16_t>(h.done[c.cid].result);
    Sqe ps = h.cmd(0x7f);
    encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
    REQUIRE(h.wait(*admin, nullptr, h.send(*admin, ps)).status.ok());
    QueueConfig qc{1, depth, kSlot};
    qc.ring = io_ring;
    io = std::make_unique<Queue>(target, qc, imem.span().subspan(skew, size_t{depth} * kSlot));
    Sqe ic = h.cmd(0x7f);
    encode_connect(ic, ConnectCmd{0, 1, static_cast<uint16_t>(depth - 1), 0, 0});
    encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, 1024});
    auto icd = connect_data(cntlid);
    REQUIRE(h.wait(*io, io_ring, h.send(*io, ic, icd)).status.ok());
  }
  Cqe run(uint16_t cid) { return h.wait(*io, &ring, cid); }
};
}  // namespace

TEST_CASE("file backend: writes and reads through the queue land in the file", "[nvmf][file]") {
  Rig r;
  r.connect(&r.ring);
  Namespace& ns = r.ns1();
  CHECK(ns.is_file());
  CHECK(ns.blocks() == kBlocks);
  INFO("O_DIRECT descriptor " << ns.direct_fd() << ", alignment " << ns.direct_align());

  auto a = pattern(4096, 1), b = pattern(65536, 2), c = pattern(512, 3);
  uint16_t w1 = r.h.write(*r.io, 1, 8, a, true);  // in the capsule
  // The request waits for the backend: no response until the ring is polled.
  CHECK(r.io->backend_busy() == 1);
  CHECK(!r.h.done.count(w1));
  CHECK(r.run(w1).status.ok());
  CHECK(r.io->backend_busy() == 0);
  CHECK(r.run(r.h.write(*r.io, 1, 128, b)).status.ok());   // by RDMA READ, 64 KiB
  CHECK(r.run(r.h.write(*r.io, 1, kBlocks - 1, c)).status.ok());  // the last block

  uint32_t k1 = 0, k2 = 0, k3 = 0;
  uint16_t r1 = r.h.read(*r.io, 1, 8, 8, &k1);
  uint16_t r2 = r.h.read(*r.io, 1, 128, 128, &k2);
  uint16_t r3 = r.h.read(*r.io, 1, kBlocks - 1, 1, &k3);
  CHECK(r.run(r1).status.ok());
  CHECK(r.run(r2).status.ok());
  CHECK(r.run(r3).status.ok());
  CHECK(r.h.mem[k1] == a);
  CHECK(r.h.mem[k2] == b);
  CHECK(r.h.mem[k3] == c);
  // The bytes are in the file, where the LBAs say.
  CHECK(file_bytes(r.img, 8 * 512, 4096) == a);
  CHECK(file_bytes(r.img, 128 * 512, 65536) == b);
  CHECK(file_bytes(r.img, uint64_t{kBlocks - 1} * 512, 512) == c);
  // Never-written blocks read zeroes (a sparse file).
  uint32_t k4 = 0;
  CHECK(r.run(r.h.read(*r.io, 1, 4000, 16, &k4)).status.ok());
  CHECK(all_zero(r.h.mem[k4].data(), 8192));

  CHECK(r.io->counters().file_commands == 7);
  CHECK(r.io->counters().bytes_out == 4096 + 65536 + 512 + 8192);
  CHECK(r.ring.counters().completed == 7);
  CHECK(r.ring.counters().errors == 0);
  CHECK(r.ring.in_flight() == 0);
  // /tmp allows O_DIRECT (ext4 here) and the slot buffers are page aligned: all 7 went direct.
  if (ns.direct_fd() >= 0) CHECK(r.ring.counters().direct == 7);
  // A file namespace means a volatile write cache: Identify Controller says so (VWC), so hosts send Flush.
  Sqe id = r.h.cmd(0x06);
  id.cdw10 = 1;
  uint32_t kid = r.h.region(std::vector<uint8_t>(4096, 0));
  Host::keyed(id, kid, 4096);
  CHECK(r.h.wait(*r.admin, nullptr, r.h.send(*r.admin, id)).status.ok());
  CHECK(r.h.mem[kid][idctrl::kVwc] == 1);
}

TEST_CASE("file backend: buffers that O_DIRECT cannot take go through the page cache", "[nvmf][file]") {
  Rig r(8, 16, 1);  // slot buffers one byte past alignment
  r.connect(&r.ring);
  auto a = pattern(8192, 11);
  REQUIRE(r.run(r.h.write(*r.io, 1, 64, a)).status.ok());
  uint32_t k = 0;
  REQUIRE(r.run(r.h.read(*r.io, 1, 64, 16, &k)).status.ok());
  CHECK(r.h.mem[k] == a);
  CHECK(file_bytes(r.img, 64 * 512, 8192) == a);
  CHECK(r.ring.counters().direct == 0);
  CHECK(r.ring.counters().completed == 2);
}

TEST_CASE("file backend: flush, write zeroes (each method), deallocate", "[nvmf][file]") {
  Rig r;
  r.connect(&r.ring);
  Namespace& ns = r.ns1();
  auto fill = pattern(size_t{1024} * 512, 7);  // LBAs 0..1023
  for (uint32_t lba = 0; lba < 1024; lba += 256)
    REQUIRE(r.run(r.h.write(*r.io, 1, lba, {fill.begin() + lba * 512, fill.begin() + (lba + 256) * 512})).status.ok());

  uint64_t submitted = r.ring.counters().submitted;
  CHECK(r.run(r.h.send(*r.io, r.h.cmd(0x00, 1))).status.ok());  // Flush: an fdatasync
  CHECK(r.ring.counters().submitted == submitted + 1);

  // Write Zeroes by FALLOC_FL_ZERO_RANGE (ext4), then with ZERO_RANGE refused (PUNCH_HOLE), then
  // with both refused (writes of zeroes, 300 KiB: three steps of at most 128 KiB).
  struct Case {
    uint8_t refuse;
    uint64_t slba;
    uint32_t nlb;
  };
  for (Case k : {Case{0, 10, 7}, Case{1, 100, 50}, Case{3, 300, 600}}) {
    ns.refuse_zeroing(k.refuse);
    Sqe wz = r.h.cmd(0x08, 1);
    Host::rw(wz, k.slba, k.nlb);
    CHECK(r.run(r.h.send(*r.io, wz)).status.ok());
    auto f = file_bytes(r.img, 0, fill.size());
    CHECK(all_zero(f.data() + k.slba * 512, k.nlb * 512));
    CHECK(std::memcmp(f.data() + (k.slba - 1) * 512, fill.data() + (k.slba - 1) * 512, 512) == 0);
    CHECK(std::memcmp(f.data() + (k.slba + k.nlb) * 512, fill.data() + (k.slba + k.nlb) * 512, 512) == 0);
    // Read back through the queue too (at most 256 blocks, MDTS, per read).
    for (uint32_t done = 0; done < k.nlb; done += 256) {
      uint32_t n = std::min(256u, k.nlb - done), key = 0;
      CHECK(r.run(r.h.read(*r.io, 1, k.slba + done, n, &key)).status.ok());
      CHECK(all_zero(r.h.mem[key].data(), n * 512));
    }
  }
  CHECK(ns.zeroing_refused() == 3);
  CHECK(r.ring.counters().errors == 0);

  // Deallocate: three ranges (one empty), then the blocks read zeroes (DLFEAT) and the rest is intact.
  Rig d;
  d.connect(&d.ring);
  auto g = pattern(size_t{1024} * 512, 9);
  for (uint32_t lba = 0; lba < 1024; lba += 256)
    REQUIRE(d.run(d.h.write(*d.io, 1, lba, {g.begin() + lba * 512, g.begin() + (lba + 256) * 512})).status.ok());
  // Without the AD bit: nothing happens.
  CHECK(d.run(d.h.dsm(*d.io, 1, {{0, 1024}}, false)).status.ok());
  CHECK(file_bytes(d.img, 0, g.size()) == g);
  CHECK(d.run(d.h.dsm(*d.io, 1, {{16, 8}, {500, 0}, {600, 256}}, true)).status.ok());
  auto f = file_bytes(d.img, 0, g.size());
  CHECK(all_zero(f.data() + 16 * 512, 8 * 512));
  CHECK(all_zero(f.data() + 600 * 512, 256 * 512));
  CHECK(std::memcmp(f.data(), g.data(), 16 * 512) == 0);
  CHECK(std::memcmp(f.data() + 24 * 512, g.data() + 24 * 512, (600 - 24) * 512) == 0);
  CHECK(std::memcmp(f.data() + 856 * 512, g.data() + 856 * 512, (1024 - 856) * 512) == 0);
  // With PUNCH_HOLE refused, deallocate still zeroes (ZERO_RANGE, then writes).
  d.ns1().refuse_zeroing(2);
  CHECK(d.run(d.h.dsm(*d.io, 1, {{40, 4}}, true)).status.ok());
  d.ns1().refuse_zeroing(1);
  CHECK(d.run(d.h.dsm(*d.io, 1, {{50, 300}}, true)).status.ok());
  f = file_bytes(d.img, 0, g.size());
  CHECK(all_zero(f.data() + 40 * 512, 4 * 512));
  CHECK(all_zero(f.data() + 50 * 512, 300 * 512));
  CHECK(std::memcmp(f.data() + 44 * 512, g.data() + 44 * 512, 6 * 512) == 0);
  CHECK(d.ring.counters().errors == 0);
}

TEST_CASE("file backend: out-of-range LBAs, a file cut short, kernel errors, write protection", "[nvmf][file]") {
  Rig r;
  // nsid 2: the same file through a read-only descriptor the namespace believes writable
  // (writes fail in the kernel: EBADF); nsid 3: a read-only namespace (write protected).
  int ro = ::open(r.img.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(ro >= 0);
  r.sub->add_namespace(Namespace::file_fd({2, 512, uint64_t{kBlocks} * 512}, kSub, ro, false));
  int ro2 = ::open(r.img.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(ro2 >= 0);
  r.sub->add_namespace(Namespace::file_fd({3, 512, uint64_t{kBlocks} * 512}, kSub, ro2, true));
  r.connect(&r.ring);

  // Out of range: refused before anything reaches the ring.
  uint64_t started = r.ring.counters().started;
  uint32_t key = 0;
  CHECK(r.run(r.h.read(*r.io, 1, kBlocks - 1, 2, &key)).status == sc::kLbaRange);
  CHECK(r.run(r.h.write(*r.io, 1, kBlocks, pattern(512, 1))).status == sc::kLbaRange);
  CHECK(r.run(r.h.write(*r.io, 1, ~0ull - 3, pattern(4096, 1))).status == sc::kLbaRange);
  Sqe wz = r.h.cmd(0x08, 1);
  Host::rw(wz, kBlocks - 4, 5);
  CHECK(r.run(r.h.send(*r.io, wz)).status == sc::kLbaRange);
  CHECK(r.run(r.h.dsm(*r.io, 1, {{0, 8}, {kBlocks - 1, 2}}, true)).status == sc::kLbaRange);
  CHECK(r.run(r.h.send(*r.io, r.h.cmd(0x02, 9))).status == sc::kInvalidNs);
  CHECK(r.ring.counters().started == started);

  // A read past the end of a file cut short under the namespace: a short read, Internal Error.
  auto a = pattern(4096, 4);
  REQUIRE(r.run(r.h.write(*r.io, 1, 0, a)).status.ok());
  REQUIRE(::truncate(r.img.c_str(), 1 << 20) == 0);  // 2048 blocks left of 16384
  Cqe past = r.run(r.h.read(*r.io, 1, 4096, 8, &key));
  CHECK(past.status == sc::kInternal);
  CHECK(past.status.dnr());
  CHECK(r.ring.counters().short_transfers == 1);
  uint32_t k0 = 0;
  CHECK(r.run(r.h.read(*r.io, 1, 0, 8, &k0)).status.ok());  // before the cut: still there
  CHECK(r.h.mem[k0] == a);

  // The kernel refuses a write (EBADF on a read-only descriptor): Internal Error, as nvmet maps it.
  CHECK(r.run(r.h.write(*r.io, 2, 0, pattern(512, 5))).status == sc::kInternal);
  CHECK(r.run(r.h.read(*r.io, 2, 0, 8, &key)).status.ok());
  CHECK(r.h.mem[key] == a);
  // A write-protected namespace: writes, write zeroes, deallocate refused without touching the file.
  started = r.ring.counters().started;
  CHECK(r.run(r.h.write(*r.io, 3, 0, pattern(512, 6))).status == sc::kNsWriteProtected);
  Sqe wz3 = r.h.cmd(0x08, 3);
  Host::rw(wz3, 0, 8);
  CHECK(r.run(r.h.send(*r.io, wz3)).status == sc::kNsWriteProtected);
  CHECK(r.run(r.h.dsm(*r.io, 3, {{0, 8}}, true)).status == sc::kNsWriteProtected);
  CHECK(r.ring.counters().started == started);
  CHECK(r.run(r.h.read(*r.io, 3, 0, 8, &key)).status.ok());
  CHECK(r.h.mem[key] == a);
  CHECK(file_bytes(r.img, 0, 4096) == a);
  // Identify Namespace says so (NSATTR bit 0), as nvmet does; the writable ones do not.
  for (uint32_t nsid : {1u, 3u}) {
    Sqe id = r.h.cmd(0x06, nsid);
    id.cdw10 = 0;
    uint32_t kid = r.h.region(std::vector<uint8_t>(4096, 0xff));
    Host::keyed(id, kid, 4096);
    REQUIRE(r.h.wait(*r.admin, nullptr, r.h.send(*r.admin, id)).status.ok());
    CHECK(r.h.mem[kid][idns::kNsattr] == (nsid == 3 ? 1 : 0));
  }

  // errno -> status as Linux's nvmet (errno_to_nvme_status).
  CHECK(file_errno_status(0) == sc::kSuccess);
  CHECK(file_errno_status(EIO) == sc::kInternal);
  CHECK(file_errno_status(EBADF) == sc::kInternal);
  CHECK(file_errno_status(ENOSPC) == sc::kCapExceeded);
  CHECK(file_errno_status(EDQUOT) == sc::kCapExceeded);
  CHECK(file_errno_status(EREMOTEIO) == sc::kLbaRange);
  CHECK(file_errno_status(EOPNOTSUPP) == sc::kInvalidOpcode);
  CHECK(file_errno_status(ENODATA) == sc::kAccessDenied);
  CHECK(file_errno_status(EIO).dnr());

}

TEST_CASE("file backend: 128 commands in flight, resumed out of order, the loop never waits", "[nvmf][file]") {
  // A ring of 32 entries under a queue of depth 128: commands wait for room (counted).
  Rig r(128, 32);
  // nsid 2: a FIFO, a backend that answers a read only once something is written into it.
  std::string fifo = r.dir.path + "/slow";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int ffd = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // O_RDWR: the open does not wait for a writer
  REQUIRE(ffd >= 0);
  r.sub->add_namespace(Namespace::file_fd({2, 512, 1 << 20}, kSub, ffd, false));
  r.connect(&r.ring);

  // First: a read from the FIFO, which nothing can answer yet.
  uint32_t kslow = 0;
  auto t0 = Clock::now();
  uint16_t slow = r.h.read(*r.io, 2, 0, 8, &kslow);
  double longest_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  CHECK(r.io->backend_busy() == 1);

  // Then 127 writes of 4 KiB to distinct LBAs, each with its own data.
  std::vector<uint16_t> cids;
  std::map<uint16_t, uint64_t> lba_of;
  for (uint32_t i = 0; i < 127; ++i) {
    t0 = Clock::now();
    uint16_t c = r.h.write(*r.io, 1, uint64_t{i} * 8, pattern(4096, 1000 + i), i % 3 == 0);
    longest_ms = std::max(longest_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cids.push_back(c);
    lba_of[c] = uint64_t{i} * 8;
  }
  CHECK(r.io->busy() == 128);
  CHECK(r.ring.waiting() > 0);  // the ring holds 32; the rest wait in the queue's slots

  // The poll loop: every write completes while the FIFO read still waits; no call waits on it.
  auto deadline = Clock::now() + std::chrono::seconds(20);
  size_t polls = 0;
  while (std::any_of(cids.begin(), cids.end(), [&](uint16_t c) { return !r.h.done.count(c); })) {
    REQUIRE(Clock::now() < deadline);
    t0 = Clock::now();
    r.ring.poll();
    r.h.pump(*r.io);
    longest_ms = std::max(longest_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ++polls;
  }
  for (uint16_t c : cids) CHECK(r.h.done[c].status.ok());
  CHECK(!r.h.done.count(slow));
  CHECK(r.io->state(0) == Queue::State::WaitingForBackend);  // the FIFO read's slot
  CHECK(r.io->backend_busy() == 1);
  CHECK(r.ring.in_flight() == 1);
  CHECK(r.ring.counters().ring_full >= 127 - 31);
  CHECK(r.ring.counters().max_waiting >= 127 - 31);
  // Idle polls with the FIFO read outstanding return at once.
  for (int i = 0; i < 1000; ++i) {
    t0 = Clock::now();
    CHECK(r.ring.poll() == 0);
    longest_ms = std::max(longest_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::printf("file backend: 128 in flight, %zu polls, longest call %.3f ms while the FIFO read waited\n", polls,
              longest_ms);
  // Generous bound for a shared machine: a call that waited on the FIFO would never return at all.
  CHECK(longest_ms < 1000);

  // Now the slow backend answers: the first command completes last.
  auto slow_data = pattern(4096, 77);
  REQUIRE(::write(ffd, slow_data.data(), slow_data.size()) == 4096);
  CHECK(r.run(slow).status.ok());
  CHECK(r.h.mem[kslow] == slow_data);
  CHECK(r.h.order.back() == slow);
  // Out of order: the slow read's response came after 127 commands sent behind it.
  auto pos = std::find(r.h.order.begin(), r.h.order.end(), slow) - r.h.order.begin();
  CHECK(std::count_if(r.h.order.begin(), r.h.order.begin() + pos, [&](uint16_t c) { return lba_of.count(c); }) == 127);

  // 128 reads in flight, checked against what each write put there.
  std::map<uint16_t, std::pair<uint32_t, uint32_t>> reads;  // cid -> (key, write index)
  for (uint32_t i = 0; i < 128; ++i) {
    uint32_t k = 0;
    uint32_t w = i % 127;
    uint16_t c = r.h.read(*r.io, 1, uint64_t{w} * 8, 8, &k);
    reads[c] = {k, w};
  }
  for (auto& [c, kw] : reads) {
    CHECK(r.run(c).status.ok());
    CHECK(r.h.mem[kw.first] == pattern(4096, 1000 + kw.second));
  }
  CHECK(r.ring.in_flight() == 0);
  CHECK(r.ring.waiting() == 0);
  CHECK(r.io->busy() == 0);
  CHECK(r.ring.counters().errors == 0);
}

TEST_CASE("file backend: a queue destroyed with a command in the ring cancels it", "[nvmf][file]") {
  Rig r(8, 8);
  std::string fifo = r.dir.path + "/slow";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int ffd = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(ffd >= 0);
  r.sub->add_namespace(Namespace::file_fd({2, 512, 1 << 20}, kSub, ffd, false));
  r.connect(&r.ring);
  uint32_t k = 0;
  r.h.read(*r.io, 2, 0, 8, &k);
  for (int i = 0; i < 10; ++i) r.ring.poll();
  REQUIRE(r.ring.in_flight() == 1);
  auto t0 = Clock::now();
  r.io.reset();
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  CHECK(ms < 2500);
  CHECK(r.ring.in_flight() == 0);
  // The ring goes on serving the others: a new I/O queue works.
  AlignedMem m2(size_t{8} * kSlot);
  QueueConfig qc{1, 8, kSlot};
  qc.ring = &r.ring;
  Queue io2(r.target, qc, m2.span());
  Sqe ic = r.h.cmd(0x7f);
  encode_connect(ic, ConnectCmd{0, 1, 7, 0, 0});
  encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, 1024});
  auto icd = r.connect_data(static_cast<uint16_t>(r.h.done[1].result));
  REQUIRE(r.h.wait(io2, &r.ring, r.h.send(io2, ic, icd)).status.ok());
  auto a = pattern(512, 3);
  CHECK(r.h.wait(io2, &r.ring, r.h.write(io2, 1, 5, a)).status.ok());
  CHECK(file_bytes(r.img, 5 * 512, 512) == a);
}

TEST_CASE("file backend: a command in the kernel past the deadline is cancelled and answered with an error, "
          "the queue goes on",
          "[nvmf][file][deadline]") {
  // Deadline 1 s: every command of the ring has it, and the write and read
  // below must not pass it on a loaded machine (with 300 ms a sanitizer CI run
  // once counted a second timeout for a 4 KiB file write that still succeeded).
  Rig r(8, 8, 0, 1000);
  std::string fifo = r.dir.path + "/never";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int ffd = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // nobody ever writes into it
  REQUIRE(ffd >= 0);
  r.sub->add_namespace(Namespace::file_fd({2, 512, 1 << 20}, kSub, ffd, false));
  r.connect(&r.ring);
  uint32_t k = 0;
  const auto t0 = Clock::now();
  const uint16_t cid = r.h.read(*r.io, 2, 0, 8, &k);
  Cqe c = r.run(cid);  // without the deadline: never answered (run() fails after 20 s)
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  CHECK(c.status == sc::kInternal);
  // The ring's deadline runs on CLOCK_MONOTONIC_COARSE (a tick of a few ms) read
  // at its last poll, so it can end a few ms short of 1000 by steady_clock.
  CHECK(ms >= 950);
  CHECK(ms < 6000);
  CHECK(r.ring.counters().timeouts == 1);
  CHECK(r.ring.counters().stuck == 0);  // the cancel took: answered by its own completion
  CHECK(r.ring.counters().errors == 1);
  CHECK(r.ring.in_flight() == 0);
  CHECK(r.io->busy() == 0);
  CHECK(r.io->backend_busy() == 0);
  // The queue and the ring go on: a write and its read-back on the file namespace.
  auto a = pattern(4096, 21);
  CHECK(r.run(r.h.write(*r.io, 1, 40, a)).status.ok());
  uint32_t k2 = 0;
  CHECK(r.run(r.h.read(*r.io, 1, 40, 8, &k2)).status.ok());
  CHECK(r.h.mem[k2] == a);
  CHECK(r.ring.counters().timeouts == 1);
}

TEST_CASE("file backend: EIO from the kernel (reads and writes of /proc/self/mem at unmapped addresses) answers "
          "Internal Error with DNR as nvmet maps it, the queue goes on",
          "[nvmf][file][eio]") {
  Rig r;
  // /proc/self/mem: offset = address in this process; the first MiB is never
  // mapped (mmap_min_addr), so the kernel's read and write both fail with EIO.
  int mfd = ::open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  REQUIRE(mfd >= 0);
  std::vector<uint8_t> probe(512);
  errno = 0;
  REQUIRE(::pread(mfd, probe.data(), probe.size(), 4096) == -1);
  REQUIRE(errno == EIO);
  r.sub->add_namespace(Namespace::file_fd({2, 512, 1 << 20}, kSub, mfd, false));
  r.connect(&r.ring);
  uint32_t k = 0;
  Cqe rd = r.run(r.h.read(*r.io, 2, 8, 8, &k));
  CHECK(rd.status == sc::kInternal);
  CHECK(rd.status.dnr());
  Cqe wr = r.run(r.h.write(*r.io, 2, 8, pattern(4096, 5)));
  CHECK(wr.status == sc::kInternal);
  CHECK(wr.status.dnr());
  CHECK(r.ring.counters().errors == 2);
  CHECK(r.ring.counters().short_transfers == 0);
  CHECK(r.io->busy() == 0);
  CHECK(r.io->counters().errors == 2);
  // The same queue serves the next commands.
  auto a = pattern(4096, 6);
  CHECK(r.run(r.h.write(*r.io, 1, 80, a)).status.ok());
  uint32_t k2 = 0;
  CHECK(r.run(r.h.read(*r.io, 1, 80, 8, &k2)).status.ok());
  CHECK(r.h.mem[k2] == a);
  CHECK(file_bytes(r.img, 80 * 512, 4096) == a);
}

TEST_CASE("file backend: an I/O queue without an IoRing answers Internal Error", "[nvmf][file]") {
  Rig r;
  r.connect(nullptr);
  Cqe c = r.h.wait(*r.io, nullptr, r.h.write(*r.io, 1, 0, pattern(512, 1)));
  CHECK(c.status == sc::kInternal);
  CHECK(r.io->counters().no_ring == 1);
  CHECK(r.io->busy() == 0);
}

TEST_CASE("file backend: 4 KiB random reads at queue depth 1, 32 and 128, data checked (figures)", "[nvmf][file]") {
  Rig r(128, 128);
  r.connect(&r.ring);
  constexpr uint32_t kSpan = 4 << 20;  // 4 MiB of known data, LBAs 0..8191
  auto disk = pattern(kSpan, 21);
  for (uint32_t off = 0; off < kSpan; off += kSlot)
    REQUIRE(r.run(r.h.write(*r.io, 1, off / 512, {disk.begin() + off, disk.begin() + off + kSlot})).status.ok());
  std::vector<uint32_t> keys;
  for (int i = 0; i < 128; ++i) keys.push_back(r.h.region(std::vector<uint8_t>(4096)));
  std::mt19937 rng(3);
  for (uint32_t qd : {1u, 32u, 128u}) {
    constexpr uint32_t kReads = 4000;
    std::vector<uint32_t> free_keys = keys;
    std::map<uint16_t, std::pair<uint32_t, uint64_t>> out;  // cid -> (key, lba)
    uint32_t issued = 0, checked = 0, bad = 0;
    uint64_t direct0 = r.ring.counters().direct;
    auto t0 = Clock::now(), deadline = t0 + std::chrono::seconds(60);
    while (checked < kReads) {
      REQUIRE(Clock::now() < deadline);
      while (out.size() < qd && issued < kReads) {
        uint32_t key = free_keys.back();
        free_keys.pop_back();
        uint64_t lba = (rng() % (kSpan / 4096)) * 8;
        out[r.h.read_into(*r.io, 1, lba, 8, key)] = {key, lba};
        ++issued;
      }
      r.ring.poll();
      r.h.pump(*r.io);
      for (auto it = out.begin(); it != out.end();) {
        auto d = r.h.done.find(it->first);
        if (d == r.h.done.end()) {
          ++it;
          continue;
        }
        bad += !d->second.status.ok() ||
               std::memcmp(r.h.mem[it->second.first].data(), disk.data() + it->second.second * 512, 4096) != 0;
        r.h.done.erase(d);
        free_keys.push_back(it->second.first);
        it = out.erase(it);
        ++checked;
      }
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("file backend: 4 KiB random read, QD %u: %.0f IOPS (%u reads, mean latency %.1f us, %s)\n", qd,
                kReads / s, kReads, s * 1e6 / kReads * qd,
                r.ring.counters().direct - direct0 == kReads ? "O_DIRECT" : "page cache");
    CHECK(bad == 0);
  }
  CHECK(r.ring.counters().errors == 0);
}

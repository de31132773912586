// A queue's request state machine (lib/nvmf/queue.cc) against a fake RDMA
// host that carries out the actions on its own memory: Connect by RDMA READ
// (admin queue) and in-capsule (I/O queue, as Linux sends it), reads by RDMA
// WRITE followed by the SEND (with Invalidate when the SGL asks), writes by
// RDMA READ or in-capsule data, AERs, drops and failures.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "fake_host.h"
#include "nvmf/le.h"
#include "nvmf/queue.h"

using namespace droce::nvmf;

namespace {
constexpr const char* kSub = "nqn.2026-12.org.droce:ram0";
constexpr const char* kHost = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";

// The host (fake_host.h): its memory, the CQEs it received, the keys the
// target invalidated, and every action in the order the queue asked for it.
struct FakeHost : testing::HostMemory {
  std::vector<Cqe> cqes;
  std::vector<uint32_t> invalidated;
  std::vector<Action::Kind> order;

  // Runs every action of q, completing READs and SENDs.
  void run(Queue& q, uint64_t now = 0) {
    for (int round = 0; round < 16; ++round) {
      std::array<Action, 8> a;
      size_t n = q.take_actions(a);
      if (!n) return;
      for (size_t i = 0; i < n; ++i) {
        order.push_back(a[i].kind);
        if (auto c = carry_out(q, a[i], now)) {
          cqes.push_back(*c);
          if (a[i].invalidate) invalidated.push_back(a[i].rkey);
        }
      }
    }
    FAIL("actions did not settle");
  }
  std::array<uint8_t, 1024> connect_data(uint16_t cntlid) {
    ConnectData d;
    d.cntlid = cntlid;
    d.subnqn = kSub;
    d.hostnqn = kHost;
    std::array<uint8_t, 1024> b;
    encode_connect_data(b, d);
    return b;
  }
  Cqe last() { return cqes.back(); }
};

void populate(Target& t) {
  Subsystem& s = t.add_subsystem(kSub, "Q1", false);
  s.allow_host(kHost);
  s.add_namespace(Namespace::ram({1, 512, 1 << 20}, kSub));
}

TargetConfig tcfg() {
  TargetConfig c;
  c.in_capsule_data = 8192;
  c.mdts = 3;  // 32 KiB
  return c;
}
}  // namespace

TEST_CASE("queue: admin and I/O queues end to end through a fake RDMA host", "[nvmf][queue]") {
  Target t(tcfg());
  populate(t);
  FakeHost h;
  std::vector<uint8_t> amem(32 * 32768), imem(16 * 32768);
  auto admin = std::make_unique<Queue>(t, QueueConfig{0, 32, 32768}, amem);

  // Before Connect: refused.
  h.run(*admin);
  admin->on_capsule(h.capsule(h.cmd(0x06)), 0);
  h.run(*admin);
  CHECK(h.last().status == sc::kCmdSeqError);
  Sqe nosgl = h.cmd(0x18);
  nosgl.dptr.fill(0);  // type 0x00 (data block, address): not an RDMA SGL, even without data
  admin->on_capsule(h.capsule(nosgl), 0);
  h.run(*admin);
  CHECK(h.last().status == sc::kSglInvalidType);

  // Connect on the admin queue: data by RDMA READ (Linux sends no in-capsule data there).
  Sqe c = h.cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 31, 0, 5000});
  auto cd = h.connect_data(0xffff);
  uint32_t kc = h.region({cd.begin(), cd.end()});
  FakeHost::keyed(c, kc, 1024);
  admin->on_capsule(h.capsule(c), 0);
  h.run(*admin);
  REQUIRE(h.last().status.ok());
  uint16_t cntlid = static_cast<uint16_t>(h.last().result);
  CHECK(cntlid == 1);
  CHECK(h.last().sq_id == 0);
  CHECK(h.last().sq_head == 3);
  CHECK(h.order == std::vector<Action::Kind>{Action::Send, Action::Send, Action::RdmaRead, Action::Send});
  REQUIRE(admin->controller());

  // Enable, then Identify Controller into a keyed SGL with invalidate.
  Sqe ps = h.cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  admin->on_capsule(h.capsule(ps), 0);
  h.run(*admin);
  REQUIRE(admin->controller()->ready());
  Sqe id = h.cmd(0x06);
  id.cdw10 = 1;
  uint32_t kid = h.region(std::vector<uint8_t>(4096, 0xee));
  FakeHost::keyed(id, kid, 4096, true);
  h.order.clear();
  admin->on_capsule(h.capsule(id), 0);
  h.run(*admin);
  CHECK(h.order == std::vector<Action::Kind>{Action::RdmaWrite, Action::Send});
  CHECK(h.last().status.ok());
  CHECK(h.invalidated == std::vector<uint32_t>{kid});
  CHECK(le::get16(&h.mem[kid][78]) == cntlid);
  CHECK(le::get32(&h.mem[kid][1792]) == (64 + 8192) / 16);
  CHECK(admin->busy() == 0);

  // I/O queue 1: Connect with its data in the capsule.
  auto io = std::make_unique<Queue>(t, QueueConfig{1, 16, 32768}, imem);
  Sqe ic = h.cmd(0x7f);
  encode_connect(ic, ConnectCmd{0, 1, 15, 0, 0});
  encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, 1024});
  auto icd = h.connect_data(cntlid);
  io->on_capsule(h.capsule(ic, icd), 0);
  h.run(*io);
  REQUIRE(h.last().status.ok());
  CHECK(h.last().sq_id == 1);
  CHECK(admin->controller()->io_queue_connected(1));

  // Write 4 KiB in the capsule at LBA 8, 16 KiB by RDMA READ at LBA 16; read 24 KiB back.
  std::vector<uint8_t> a(4096), b(16384);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i ^ 0x5a);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13);
  Sqe w1 = h.cmd(0x01, 1);
  w1.cdw10 = 8;
  w1.cdw12 = 7;
  encode_sgl(w1.dptr, Sgl{SglKind::InCapsule, 0, 4096});
  io->on_capsule(h.capsule(w1, a), 0);
  h.run(*io);
  REQUIRE(h.last().status.ok());
  Sqe w2 = h.cmd(0x01, 1);
  w2.cdw10 = 16;
  w2.cdw12 = 31;
  FakeHost::keyed(w2, h.region(b), 16384);
  io->on_capsule(h.capsule(w2), 0);
  h.run(*io);
  REQUIRE(h.last().status.ok());
  Sqe r = h.cmd(0x02, 1);
  r.cdw10 = 8;
  r.cdw12 = 39;  // 40 blocks: LBA 8-47
  uint32_t kr = h.region(std::vector<uint8_t>(20480, 0));
  FakeHost::keyed(r, kr, 20480, true);
  io->on_capsule(h.capsule(r), 0);
  h.run(*io);
  REQUIRE(h.last().status.ok());
  CHECK(std::memcmp(h.mem[kr].data(), a.data(), 4096) == 0);
  CHECK(std::memcmp(h.mem[kr].data() + 4096, b.data(), 16384) == 0);
  CHECK(h.invalidated.back() == kr);
  CHECK(io->counters().bytes_in == 1024 + 4096 + 16384);
  CHECK(io->counters().bytes_out == 20480);
  CHECK(io->counters().errors == 0);

  // Beyond the slot buffer (MDTS 32 KiB): refused before any transfer.
  Sqe big = h.cmd(0x02, 1);
  big.cdw12 = 127;
  FakeHost::keyed(big, kr, 65536, true);
  h.order.clear();
  io->on_capsule(h.capsule(big), 0);
  h.run(*io);
  CHECK(h.last().status == sc::kSglInvalidData);
  CHECK(h.order == std::vector<Action::Kind>{Action::Send});
  // A bad SGL: error, and its key is not invalidated.
  size_t inv = h.invalidated.size();
  Sqe bad = h.cmd(0x02, 1);
  bad.dptr[15] = 0x4e;
  io->on_capsule(h.capsule(bad), 0);
  h.run(*io);
  CHECK(h.last().status == sc::kSglInvalidType);
  CHECK(h.invalidated.size() == inv);
  // Property Get on an I/O queue, Connect again: refused.
  Sqe pg = h.cmd(0x7f);
  encode_property(pg, FabricsType::PropertyGet, PropertyCmd{true, 0, 0});
  io->on_capsule(h.capsule(pg), 0);
  h.run(*io);
  CHECK(h.last().status == sc::kInvalidOpcode);
  io->on_capsule(h.capsule(ic, icd), 0);
  h.run(*io);
  CHECK(h.last().status == sc::kCmdSeqError);

  // The I/O queue goes: detached. The admin queue goes: the controller is destroyed.
  io.reset();
  CHECK(!admin->controller()->io_queue_connected(1));
  admin.reset();
  CHECK(t.controllers() == 0);
}

TEST_CASE("queue: drops, overflow, failures, AERs", "[nvmf][queue]") {
  Target t(tcfg());
  populate(t);
  FakeHost h;
  std::vector<uint8_t> mem(4 * 4096);
  Queue q(t, QueueConfig{0, 4, 4096}, mem);
  std::vector<uint8_t> shortc(63);
  q.on_capsule(shortc, 0);
  CHECK(q.counters().short_capsules == 1);
  CHECK(q.take_actions(std::span<Action>()) == 0);

  Sqe c = h.cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 3, 0, 0});
  encode_sgl(c.dptr, Sgl{SglKind::InCapsule, 0, 1024});
  auto cd = h.connect_data(0xffff);
  q.on_capsule(h.capsule(c, cd), 0);
  h.run(q);
  REQUIRE(h.last().status.ok());
  Sqe ps = h.cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  q.on_capsule(h.capsule(ps), 0);
  h.run(q);
  Sqe aec = h.cmd(0x09);
  aec.cdw10 = 0x0b;
  aec.cdw11 = 1u << 8;
  q.on_capsule(h.capsule(aec), 0);
  h.run(q);

  // Two AERs wait in their slots; the host may send 2 more commands (depth 4), a 5th overflows.
  Sqe aer1 = h.cmd(0x0c), aer2 = h.cmd(0x0c);
  q.on_capsule(h.capsule(aer1), 0);
  q.on_capsule(h.capsule(aer2), 0);
  h.run(q);
  CHECK(q.busy() == 2);
  size_t before = h.cqes.size();
  q.on_capsule(h.capsule(h.cmd(0x18)), 0);
  q.on_capsule(h.capsule(h.cmd(0x18)), 0);
  q.on_capsule(h.capsule(h.cmd(0x18)), 0);
  CHECK(q.counters().overflow == 1);
  h.run(q);
  CHECK(h.cqes.size() == before + 2);

  // A namespace change answers the first AER.
  q.controller()->notify_ns_changed(1);
  q.poll();
  h.run(q);
  CHECK(h.last().cid == aer1.cid);
  CHECK(h.last().result == 0x040002);
  CHECK(q.busy() == 1);
  // A controller reset drops the other: answered as aborted.
  Sqe off = h.cmd(0x7f);
  encode_property(off, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460000});
  q.on_capsule(h.capsule(off), 0);
  h.run(q);
  q.poll();
  h.run(q);
  CHECK(h.last().cid == aer2.cid);
  CHECK(h.last().status == sc::kAbortReq);
  CHECK(q.busy() == 0);

  // Stray and failed completions.
  q.on_complete(99, Action::Send, true, 0);
  q.on_complete(0, Action::Send, true, 0);  // slot 0 is free
  CHECK(q.counters().bad_completions == 2);
  CHECK(!q.failed());
  Sqe w = h.cmd(0x7f);
  encode_property(w, FabricsType::PropertyGet, PropertyCmd{false, 0x1c, 0});
  q.on_capsule(h.capsule(w), 0);
  std::array<Action, 4> a;
  REQUIRE(q.take_actions(a) == 1);
  q.on_complete(a[0].slot, Action::Send, false, 0);
  CHECK(q.failed());
  CHECK(q.busy() == 0);
}

TEST_CASE("queue: random capsules and completions never break it", "[nvmf][queue]") {
  Target t(tcfg());
  populate(t);
  FakeHost h;
  std::vector<uint8_t> amem(8 * 8192), imem(8 * 8192);
  Queue admin(t, QueueConfig{0, 8, 8192}, amem);
  Sqe c = h.cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 7, 0, 0});
  encode_sgl(c.dptr, Sgl{SglKind::InCapsule, 0, 1024});
  auto cd = h.connect_data(0xffff);
  admin.on_capsule(h.capsule(c, cd), 0);
  h.run(admin);
  auto cntlid = static_cast<uint16_t>(h.last().result);
  Sqe ps = h.cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  admin.on_capsule(h.capsule(ps), 0);
  h.run(admin);
  Queue io(t, QueueConfig{1, 8, 8192}, imem);
  Sqe ic = h.cmd(0x7f);
  encode_connect(ic, ConnectCmd{0, 1, 7, 0, 0});
  encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, 1024});
  auto icd = h.connect_data(cntlid);
  io.on_capsule(h.capsule(ic, icd), 0);
  h.run(io);
  REQUIRE(h.last().status.ok());
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    Queue& q = rng() % 3 ? io : admin;
    std::vector<uint8_t> cap(rng() % 3 ? 64 + rng() % 600 : rng() % 64);
    for (auto& x : cap) x = static_cast<uint8_t>(rng());
    if (cap.size() >= 64) {
      cap[1] = rng() % 8 ? 0x40 : cap[1];
      if (rng() % 2) cap[0] = static_cast<uint8_t>(rng() % 10);
      if (rng() % 2) cap[39] = rng() % 2 ? 0x40 : 0x01;  // keyed or in-capsule
      if (rng() % 2) cap[4] = 1;  // NSID 1
    }
    q.on_capsule(cap, 0);
    if (rng() % 2) q.poll();
    // Complete what was asked (no host memory behind random keys), sometimes a stray completion.
    std::array<Action, 32> a;
    for (size_t n; (n = q.take_actions(a)) > 0;)
      for (size_t k = 0; k < n; ++k) {
        REQUIRE(a[k].len <= 8192);
        if (a[k].kind != Action::RdmaWrite) q.on_complete(a[k].slot, a[k].kind, true, 0);
      }
    if (rng() % 50 == 0) q.on_complete(static_cast<uint16_t>(rng() % 10), Action::Send, true, 0);
    REQUIRE(q.busy() <= 8);
  }
  CHECK(!io.failed());
  CHECK(io.counters().commands > 1000);
}

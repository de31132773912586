// The controller model (lib/nvmf/controller.cc) driven as Linux's nvme-rdma
// host drives a target: Connect of the admin queue, Property Get CAP/VS, CC
// enable and CSTS.RDY, Identify, Set Features Number of Queues, I/O queue
// Connect, I/O with data checked, keep alive, AERs, discovery, shutdown; and
// every refusal with its NVMe status.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "nvmf/controller.h"
#include "nvmf/le.h"

using namespace droce::nvmf;

namespace {
constexpr const char* kSub = "nqn.2026-12.org.droce:ram0";
constexpr const char* kHost = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";
constexpr uint64_t kMs = 1000000;

Sqe sqe(uint8_t op, uint32_t nsid = 0, uint32_t cdw10 = 0, uint32_t cdw11 = 0, uint32_t cdw12 = 0) {
  static uint16_t cid = 0;
  Sqe s;
  s.opcode = op;
  s.flags = 0x40;
  s.cid = ++cid;
  s.nsid = nsid;
  s.cdw10 = cdw10;
  s.cdw11 = cdw11;
  s.cdw12 = cdw12;
  return s;
}

struct Host {
  Target& t;
  std::string subnqn = kSub, hostnqn = kHost;
  Controller* ctrl = nullptr;

  Target::Connected connect(uint16_t qid, uint16_t sqsize, uint16_t cntlid, uint32_t kato_ms = 5000, uint64_t now = 0) {
    Sqe s = sqe(0x7f);
    encode_connect(s, ConnectCmd{0, qid, sqsize, 0, kato_ms});
    ConnectData d;
    d.hostid[0] = 0x42;
    d.cntlid = cntlid;
    d.subnqn = subnqn;
    d.hostnqn = hostnqn;
    std::array<uint8_t, 1024> b;
    encode_connect_data(b, d);
    return t.connect(s, b, qid, now);
  }
  Response prop_get(uint32_t off, bool eight) {
    Sqe s = sqe(0);
    encode_property(s, FabricsType::PropertyGet, PropertyCmd{eight, off, 0});
    return ctrl->execute_admin(s, {}, 0);
  }
  Response prop_set(uint32_t off, uint64_t v) {
    Sqe s = sqe(0);
    encode_property(s, FabricsType::PropertySet, PropertyCmd{false, off, v});
    return ctrl->execute_admin(s, {}, 0);
  }
  // What Linux does before the controller is live: connect, CAP, enable, wait RDY.
  void bring_up() {
    auto r = connect(0, 31, 0xffff);
    REQUIRE(r.cqe.status.ok());
    ctrl = r.ctrl;
    REQUIRE(prop_get(0x00, true).cqe.status.ok());
    REQUIRE(prop_set(0x14, 0x00460001).cqe.status.ok());
    REQUIRE(prop_get(0x1c, false).cqe.result == csts::kRdy);
  }
  Response admin(const Sqe& s, std::vector<uint8_t>& data, uint64_t now = 0) {
    return ctrl->execute_admin(s, data, now);
  }
};

TargetConfig tcfg() {
  TargetConfig c;
  c.traddr = "10.0.0.1";
  return c;
}
void populate(Target& t) {
  Subsystem& s = t.add_subsystem(kSub, "DROCE0001", false);
  s.allow_host(kHost);
  s.add_namespace(Namespace::ram({1, 512, 8 << 20}, kSub));
  s.add_namespace(Namespace::ram({3, 4096, 8 << 20}, kSub));
}
}  // namespace

TEST_CASE("controller: Linux's bring-up sequence, Identify, queues, I/O", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  auto r = h.connect(0, 31, 0xffff);
  REQUIRE(r.cqe.status.ok());
  REQUIRE(r.ctrl);
  h.ctrl = r.ctrl;
  uint16_t cntlid = static_cast<uint16_t>(r.cqe.result);
  CHECK(cntlid == 1);
  CHECK(r.ctrl->cntlid() == cntlid);
  CHECK(r.ctrl->hostid()[0] == 0x42);

  // CAP: MQES 127 (0-based), TO 15 (7.5 s), CSS NVM. VS 1.3.
  Response cap = h.prop_get(0x00, true);
  REQUIRE(cap.cqe.status.ok());
  CHECK(cap::mqes(cap.cqe.result) == 127);
  CHECK(cap::to(cap.cqe.result) == 15);
  CHECK(cap::css(cap.cqe.result) == 1);
  CHECK(h.prop_get(0x08, false).cqe.result == 0x00010300);
  CHECK(h.prop_get(0x00, false).cqe.status == sc::kInvalidField);  // CAP is 8 bytes
  CHECK(h.prop_get(0x1c, false).cqe.result == 0);

  // Before CC.EN: only Fabrics commands.
  std::vector<uint8_t> page(4096);
  CHECK(h.admin(sqe(0x06, 0, 1), page).cqe.status == sc::kCmdSeqError);

  REQUIRE(h.prop_set(0x14, 0x00460001).cqe.status.ok());
  CHECK(h.prop_get(0x14, false).cqe.result == 0x00460001);
  CHECK(h.prop_get(0x1c, false).cqe.result == csts::kRdy);
  CHECK(h.prop_set(0x1c, 1).cqe.status == sc::kInvalidField);  // CSTS is read-only

  // Identify Controller.
  Response id = h.admin(sqe(0x06, 0, 1), page);
  REQUIRE(id.cqe.status.ok());
  CHECK(id.data_len == 4096);
  CHECK(le::get16(&page[78]) == cntlid);
  CHECK(le::get32(&page[536]) == (sgls::kSupported | sgls::kKeyed | sgls::kOffset));
  CHECK(le::get16(&page[1800]) == 0);                   // ICDOFF
  CHECK(le::get32(&page[1792]) == (64 + 8192) / 16);    // IOCCSZ
  CHECK(le::get32(&page[1796]) == 1);                   // IORCSZ
  CHECK(le::get16(&page[514]) == 128);                  // MAXCMD
  CHECK(le::get32(&page[516]) == 3);                    // NN
  CHECK(page[77] == 5);                                 // MDTS
  CHECK(page[111] == 1);
  CHECK(std::string(reinterpret_cast<char*>(&page[768])) == kSub);
  CHECK(std::memcmp(&page[4], "DROCE0001", 9) == 0);

  // Set Features Number of Queues: 4 asked, 4 granted; 100 asked, 8 granted.
  Response nq = h.admin(sqe(0x09, 0, 0x07, (3u << 16) | 3u), page);
  REQUIRE(nq.cqe.status.ok());
  CHECK(nq.cqe.result == ((3u << 16) | 3u));
  CHECK(r.ctrl->io_queues() == 4);
  nq = h.admin(sqe(0x09, 0, 0x07, (99u << 16) | 99u), page);
  CHECK(nq.cqe.result == ((7u << 16) | 7u));
  CHECK(h.admin(sqe(0x0a, 0, 0x07), page).cqe.result == ((7u << 16) | 7u));
  CHECK(h.admin(sqe(0x09, 0, 0x07, 0xffff), page).cqe.status == sc::kInvalidField);
  CHECK(h.admin(sqe(0x09, 0, 0x80000007u, 0), page).cqe.status == sc::kFeatureNotSaveable);

  // Active NS list, NS descriptors, Identify Namespace.
  REQUIRE(h.admin(sqe(0x06, 0, 2), page).cqe.status.ok());
  CHECK(le::get32(&page[0]) == 1);
  CHECK(le::get32(&page[4]) == 3);
  CHECK(le::get32(&page[8]) == 0);
  REQUIRE(h.admin(sqe(0x06, 3, 3), page).cqe.status.ok());
  CHECK(page[0] == 2);
  CHECK(std::memcmp(&page[4], t.subsystem(kSub)->ns(3)->nguid().data(), 16) == 0);
  CHECK(h.admin(sqe(0x06, 2, 3), page).cqe.status == sc::kInvalidNs);
  REQUIRE(h.admin(sqe(0x06, 3, 0), page).cqe.status.ok());
  CHECK(le::get64(&page[0]) == (8u << 20) / 4096);
  CHECK(page[130] == 12);
  page.assign(4096, 0xee);
  REQUIRE(h.admin(sqe(0x06, 2, 0), page).cqe.status.ok());  // inactive NSID: zeroes
  CHECK(page[0] == 0);
  CHECK(page[4095] == 0);
  CHECK(h.admin(sqe(0x06, 4, 0), page).cqe.status == sc::kInvalidNs);
  CHECK(h.admin(sqe(0x06, 0, 0), page).cqe.status == sc::kInvalidNs);
  CHECK(h.admin(sqe(0x06, 0, 0x10), page).cqe.status == sc::kInvalidField);  // CNS 10h
  std::vector<uint8_t> small(100);
  Response part = h.admin(sqe(0x06, 0, 1), small);
  CHECK(part.data_len == 100);

  // I/O queue 1 (sqsize 127) and 2; queue 5 beyond the 8 granted? 8 granted, so 9 is refused.
  auto q1 = h.connect(1, 127, cntlid);
  REQUIRE(q1.cqe.status.ok());
  CHECK(q1.ctrl == r.ctrl);
  CHECK(q1.cqe.result == cntlid);
  CHECK(h.connect(1, 127, cntlid).cqe.status == sc::kCmdSeqError);  // twice
  auto q9 = h.connect(9, 127, cntlid);
  CHECK(q9.cqe.status == sc::kConnectInvalidParam);
  CHECK(q9.cqe.result == connect_invalid_param(false, 42));
  auto qbig = h.connect(2, 128, cntlid);
  CHECK(qbig.cqe.status == sc::kConnectInvalidParam);
  CHECK(qbig.cqe.result == connect_invalid_param(false, 44));
  CHECK(h.connect(2, 0, cntlid).cqe.status == sc::kConnectInvalidParam);
  auto qwrong = h.connect(2, 127, 77);
  CHECK(qwrong.cqe.status == sc::kConnectInvalidParam);
  CHECK(qwrong.cqe.result == connect_invalid_param(true, 16));
  r.ctrl->io_queue_closed(1);
  CHECK(h.connect(1, 127, cntlid).cqe.status.ok());  // reconnect after the glue closed it

  // Write 8 blocks at LBA 100 of NSID 1, read them back.
  std::vector<uint8_t> w(4096), rd(4096);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(i * 7 + 3);
  REQUIRE(r.ctrl->execute_io(sqe(0x01, 1, 100, 0, 7), w).cqe.status.ok());
  Response rr = r.ctrl->execute_io(sqe(0x02, 1, 100, 0, 7), rd);
  REQUIRE(rr.cqe.status.ok());
  CHECK(rr.data_len == 4096);
  CHECK(rd == w);
  // Unaligned overlap: 1 block at LBA 101 reads the second block written.
  std::vector<uint8_t> one(512);
  REQUIRE(r.ctrl->execute_io(sqe(0x02, 1, 101, 0, 0), one).cqe.status.ok());
  CHECK(std::memcmp(one.data(), w.data() + 512, 512) == 0);
  // Write Zeroes on LBA 102-103; DSM deallocate of LBA 104 (1 range).
  REQUIRE(r.ctrl->execute_io(sqe(0x08, 1, 102, 0, 1), {}).cqe.status.ok());
  std::vector<uint8_t> dsm(16, 0);
  le::put32(&dsm[4], 1);
  le::put64(&dsm[8], 104);
  REQUIRE(r.ctrl->execute_io(sqe(0x09, 1, 0, 1u << 2, 0), dsm).cqe.status.ok());
  REQUIRE(r.ctrl->execute_io(sqe(0x02, 1, 100, 0, 7), rd).cqe.status.ok());
  CHECK(std::memcmp(rd.data(), w.data(), 1024) == 0);
  CHECK(std::all_of(rd.begin() + 1024, rd.begin() + 2560, [](uint8_t x) { return x == 0; }));
  CHECK(std::memcmp(rd.data() + 2560, w.data() + 2560, 1536) == 0);
  // Flush, then the refusals.
  CHECK(r.ctrl->execute_io(sqe(0x00, 1), {}).cqe.status.ok());
  CHECK(r.ctrl->execute_io(sqe(0x02, 1, 16383, 0, 1), std::span<uint8_t>(rd).first(1024)).cqe.status == sc::kLbaRange);
  CHECK(r.ctrl->execute_io(sqe(0x02, 1, 0, 0x80000000u, 0), one).cqe.status == sc::kLbaRange);
  CHECK(r.ctrl->execute_io(sqe(0x02, 1, 0, 0, 1), one).cqe.status == sc::kSglInvalidData);  // 2 blocks, 512 B SGL
  CHECK(r.ctrl->execute_io(sqe(0x02, 2, 0, 0, 0), one).cqe.status == sc::kInvalidNs);
  CHECK(r.ctrl->execute_io(sqe(0x05, 1, 0, 0, 0), one).cqe.status == sc::kInvalidOpcode);  // Compare
  le::put64(&dsm[8], 16383);
  le::put32(&dsm[4], 2);
  CHECK(r.ctrl->execute_io(sqe(0x09, 1, 0, 1u << 2, 0), dsm).cqe.status == sc::kLbaRange);
  CHECK(r.ctrl->execute_io(sqe(0x09, 1, 1, 1u << 2, 0), dsm).cqe.status == sc::kSglInvalidData);  // 2 ranges, 16 B
  // 4 KiB namespace: one block = 4096 bytes.
  REQUIRE(r.ctrl->execute_io(sqe(0x01, 3, 5, 0, 0), w).cqe.status.ok());
  REQUIRE(r.ctrl->execute_io(sqe(0x02, 3, 5, 0, 0), rd).cqe.status.ok());
  CHECK(rd == w);

  // Misc admin: Abort (not aborted), Keep Alive, unknown opcode, Host ID.
  CHECK(h.admin(sqe(0x08, 0, (5u << 16) | 1u), page).cqe.result == 1);
  CHECK(h.admin(sqe(0x18), page).cqe.status.ok());
  CHECK(h.admin(sqe(0x01), page).cqe.status == sc::kInvalidOpcode);  // Create SQ: not on fabrics
  CHECK(h.admin(sqe(0xc0), page).cqe.status == sc::kInvalidOpcode);
  Response hid = h.admin(sqe(0x0a, 0, 0x81, 1), page);
  REQUIRE(hid.cqe.status.ok());
  CHECK(hid.data_len == 16);
  CHECK(page[0] == 0x42);
  CHECK(h.admin(sqe(0x0a, 0, 0x81, 0), page).cqe.status == sc::kInvalidField);
  CHECK(h.admin(sqe(0x09, 0, 0x81, 1), page).cqe.status == sc::kCmdSeqError);
  CHECK(h.admin(sqe(0x7f, 0x01), page).cqe.status == sc::kCmdSeqError);  // Connect again

  // Shutdown (CC.SHN normal): SHST complete, RDY clear, I/O refused, I/O queues forgotten.
  uint32_t gen = r.ctrl->generation();
  REQUIRE(h.prop_set(0x14, 0x00464001).cqe.status.ok());
  CHECK((h.prop_get(0x1c, false).cqe.result & csts::kShstMask) == csts::kShstComplete);
  CHECK(!r.ctrl->ready());
  CHECK(r.ctrl->generation() == gen + 1);
  CHECK(!r.ctrl->io_queue_connected(1));
  CHECK(r.ctrl->execute_io(sqe(0x02, 1, 0, 0, 0), one).cqe.status == sc::kCmdSeqError);
  REQUIRE(h.prop_set(0x14, 0x00460000).cqe.status.ok());
  CHECK(h.prop_get(0x1c, false).cqe.result == 0);
  // The admin queue goes: the controller is destroyed.
  t.destroy(cntlid);
  CHECK(t.controllers() == 0);
  CHECK(h.connect(1, 127, cntlid).cqe.status == sc::kConnectInvalidParam);
}

TEST_CASE("controller: Connect refusals carry the status and IATTR/IPO", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  Sqe s = sqe(0x7f);
  encode_connect(s, ConnectCmd{1, 0, 31, 0, 0});
  std::array<uint8_t, 1024> b{};
  CHECK(t.connect(s, b, 0, 0).cqe.status == sc::kConnectFormat);
  encode_connect(s, ConnectCmd{0, 0, 31, 0, 0});
  CHECK(t.connect(s, std::span<const uint8_t>(b).first(512), 0, 0).cqe.status == sc::kSglInvalidData);
  std::memset(&b[256], 'x', 256);  // subsystem NQN without NUL
  CHECK(t.connect(s, b, 0, 0).cqe.status == sc::kConnectInvalidParam);

  h.subnqn = "nqn.2026-12.org.droce:nope";
  auto r = h.connect(0, 31, 0xffff);
  CHECK(r.cqe.status == sc::kConnectInvalidParam);
  CHECK(r.cqe.result == connect_invalid_param(true, 256));
  CHECK(!r.ctrl);
  h.subnqn = kSub;
  h.hostnqn = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000000";
  r = h.connect(0, 31, 0xffff);
  CHECK(r.cqe.status == sc::kConnectInvalidHost);
  CHECK(r.cqe.status.dnr());
  CHECK(r.cqe.result == connect_invalid_param(true, 512));
  h.hostnqn = kHost;
  r = h.connect(0, 31, 5);  // admin queue must ask for a dynamic controller
  CHECK(r.cqe.status == sc::kConnectInvalidParam);
  CHECK(r.cqe.result == connect_invalid_param(true, 16));
  CHECK(h.connect(0, 32, 0xffff).cqe.status == sc::kConnectInvalidParam);  // 33 entries > 32
  CHECK(h.connect(0, 0, 0xffff).cqe.status == sc::kConnectInvalidParam);
  // The CM negotiated qid 0 but the capsule says 1.
  Sqe m = sqe(0x7f);
  encode_connect(m, ConnectCmd{0, 1, 31, 0, 0});
  ConnectData d;
  d.subnqn = kSub;
  d.hostnqn = kHost;
  encode_connect_data(b, d);
  auto mm = t.connect(m, b, 0, 0);
  CHECK(mm.cqe.status == sc::kConnectInvalidParam);
  CHECK(mm.cqe.result == connect_invalid_param(false, 42));
  // I/O queue before CC.EN.
  auto a = h.connect(0, 31, 0xffff);
  REQUIRE(a.cqe.status.ok());
  CHECK(h.connect(1, 127, static_cast<uint16_t>(a.cqe.result)).cqe.status == sc::kCmdSeqError);
  // Another host (allowed) cannot attach to this controller.
  t.subsystem(kSub)->allow_host("nqn.2026-12.org.droce:host2");
  Host h2{t};
  h2.hostnqn = "nqn.2026-12.org.droce:host2";
  h.ctrl = a.ctrl;
  REQUIRE(h.prop_set(0x14, 0x00460001).cqe.status.ok());
  CHECK(h2.connect(1, 127, static_cast<uint16_t>(a.cqe.result)).cqe.status == sc::kConnectInvalidParam);
  // Controller IDs are distinct and skip live ones.
  auto b2 = h2.connect(0, 31, 0xffff);
  REQUIRE(b2.cqe.status.ok());
  CHECK(b2.cqe.result != a.cqe.result);
  CHECK(t.controllers() == 2);
  // A bad CC enable is a fatal controller status, not RDY.
  Host h3{t};
  auto c3 = h3.connect(0, 31, 0xffff);
  h3.ctrl = c3.ctrl;
  REQUIRE(h3.prop_set(0x14, 0x00470001).cqe.status.ok());  // IOCQES 7
  CHECK(h3.prop_get(0x1c, false).cqe.result == csts::kCfs);
}

TEST_CASE("controller: keep alive expires unless the host keeps it alive", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  auto r = h.connect(0, 31, 0xffff, 5000, 0);
  REQUIRE(r.cqe.status.ok());
  h.ctrl = r.ctrl;
  REQUIRE(h.prop_set(0x14, 0x00460001).cqe.status.ok());
  CHECK(r.ctrl->kato_ms() == 5000);
  CHECK(r.ctrl->alive(7000 * kMs));
  CHECK(!r.ctrl->alive(7500 * kMs));
  std::vector<uint8_t> none;
  REQUIRE(h.admin(sqe(0x18), none, 7000 * kMs).cqe.status.ok());
  CHECK(r.ctrl->alive(14000 * kMs));
  CHECK(t.expired(14000 * kMs).empty());
  CHECK(t.expired(14500 * kMs) == std::vector<uint16_t>{r.ctrl->cntlid()});
  // Set Features KATO changes it; 0 disables it.
  REQUIRE(h.admin(sqe(0x09, 0, 0x0f, 1000), none, 20000 * kMs).cqe.status.ok());
  CHECK(h.admin(sqe(0x0a, 0, 0x0f), none).cqe.result == 1000);
  CHECK(!r.ctrl->alive(21500 * kMs));
  REQUIRE(h.admin(sqe(0x09, 0, 0x0f, 0), none, 30000 * kMs).cqe.status.ok());
  CHECK(r.ctrl->alive(~0ull));
}

// The glue checks every 100 ms and the controller stays in the table until
// its admin queue is gone (the host has to answer the DREQ first): each
// controller's expiry is named once, not at every check (a run with an
// unreachable host counted 641 expiries of one controller).
TEST_CASE("controller: an expired keep alive is named once, and the controller takes no more I/O queues",
          "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  auto r = h.connect(0, 31, 0xffff, 1000, 0);
  REQUIRE(r.cqe.status.ok());
  h.ctrl = r.ctrl;
  REQUIRE(h.prop_set(0x14, 0x00460001).cqe.status.ok());
  const uint16_t id = r.ctrl->cntlid();
  REQUIRE(h.connect(1, 127, id, 1000, 0).cqe.status.ok());
  Host other{t};  // a second controller that stays alive
  auto r2 = other.connect(0, 31, 0xffff, 0, 0);
  REQUIRE(r2.cqe.status.ok());
  CHECK(t.expired(1000 * kMs).empty());
  CHECK(t.expired(1500 * kMs) == std::vector<uint16_t>{id});
  for (uint64_t ms = 1600; ms <= 60000; ms += 100) {  // still in the table: not named again
    REQUIRE(t.controller(id) == r.ctrl);
    REQUIRE(t.expired(ms * kMs).empty());
  }
  // Being torn down: a further I/O queue is refused.
  CHECK(h.connect(2, 127, id, 1000, 0).cqe.status == sc::kCmdSeqError);
  t.destroy(id);
  CHECK(t.controllers() == 1);
  CHECK(t.expired(~0ull >> 1).empty());
}

TEST_CASE("controller: AERs wait for events; namespace change notice and its log", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  h.bring_up();
  std::vector<uint8_t> page(4096);
  Cqe c;
  // Events disabled (AEC 0): a change is only logged.
  Response a1 = h.admin(sqe(0x0c), page);
  CHECK(a1.deferred);
  h.ctrl->notify_ns_changed(3);
  CHECK(!h.ctrl->take_async(c));
  REQUIRE(h.admin(sqe(0x09, 0, 0x0b, 1u << 8), page).cqe.status.ok());
  CHECK(h.admin(sqe(0x0a, 0, 0x0b), page).cqe.result == (1u << 8));
  h.ctrl->notify_ns_changed(1);
  REQUIRE(h.ctrl->take_async(c));
  CHECK(c.cid == a1.cqe.cid);
  CHECK(c.result == 0x040002);  // notice, NS attribute changed, log 04h
  CHECK(c.status.ok());
  CHECK(!h.ctrl->take_async(c));
  // Masked until the log is read: no AER outstanding and another change.
  h.ctrl->notify_ns_changed(1);
  Response a2 = h.admin(sqe(0x0c), page);
  CHECK(!h.ctrl->take_async(c));
  // Changed NS list (1024 dwords = NUMDL 0x3ff), RAE 0: cleared and unmasked.
  Response lg = h.admin(sqe(0x02, 0xffffffffu, (0x3ffu << 16) | 0x04), page);
  REQUIRE(lg.cqe.status.ok());
  CHECK(lg.data_len == 4096);
  CHECK(le::get32(&page[0]) == 3);
  CHECK(le::get32(&page[4]) == 1);
  CHECK(le::get32(&page[8]) == 0);
  h.ctrl->notify_ns_changed(3);
  REQUIRE(h.ctrl->take_async(c));
  CHECK(c.cid == a2.cqe.cid);
  // Four outstanding at most (AERL 3).
  for (int i = 0; i < 4; ++i) CHECK(h.admin(sqe(0x0c), page).deferred);
  Response over = h.admin(sqe(0x0c), page);
  CHECK(!over.deferred);
  CHECK(over.cqe.status == sc::kAsyncLimit);
  // A controller reset drops the outstanding AERs.
  REQUIRE(h.prop_set(0x14, 0x00460000).cqe.status.ok());
  h.ctrl->notify_ns_changed(1);
  CHECK(!h.ctrl->take_async(c));
}

TEST_CASE("controller: log pages, offsets, lengths", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  h.bring_up();
  std::vector<uint8_t> buf(512, 0xee);
  Response r = h.admin(sqe(0x02, 0, (127u << 16) | 0x02), buf);  // SMART, 512 bytes
  REQUIRE(r.cqe.status.ok());
  CHECK(r.data_len == 512);
  CHECK(buf[0] == 0);
  CHECK(h.admin(sqe(0x02, 0, (127u << 16) | 0x70), buf).cqe.status == sc::kInvalidLogPage);  // not discovery
  CHECK(h.admin(sqe(0x02, 0, (127u << 16) | 0x33), buf).cqe.status == sc::kInvalidLogPage);
  Sqe odd = sqe(0x02, 0, (1u << 16) | 0x02);
  odd.cdw12 = 2;
  CHECK(h.admin(odd, buf).cqe.status == sc::kInvalidField);
  odd.cdw12 = 1024;
  CHECK(h.admin(odd, buf).cqe.status == sc::kInvalidField);  // beyond the log
  odd.cdw12 = 504;  // last 8 bytes of the SMART log, then zeroes
  buf.assign(512, 0xee);
  r = h.admin(odd, buf);
  REQUIRE(r.cqe.status.ok());
  CHECK(r.data_len == 8);
}

TEST_CASE("discovery: Connect, Identify, the log filtered by host, partial reads", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Subsystem& open = t.add_subsystem("nqn.2026-12.org.droce:open", "OPEN1", true);
  open.add_namespace(Namespace::ram({1, 512, 1 << 20}, open.nqn()));
  Host h{t};
  h.subnqn = kDiscoveryNqn;
  auto r = h.connect(0, 31, 0xffff, 0);
  REQUIRE(r.cqe.status.ok());
  h.ctrl = r.ctrl;
  CHECK(cap::mqes(h.prop_get(0, true).cqe.result) == 31);
  REQUIRE(h.prop_set(0x14, 0x00460001).cqe.status.ok());
  std::vector<uint8_t> page(4096);
  REQUIRE(h.admin(sqe(0x06, 0, 1), page).cqe.status.ok());
  CHECK(page[111] == 2);  // discovery controller
  CHECK(std::string(reinterpret_cast<char*>(&page[768])) == kDiscoveryNqn);
  CHECK(le::get32(&page[516]) == 0);
  CHECK(h.admin(sqe(0x06, 1, 0), page).cqe.status == sc::kInvalidField);
  CHECK(h.admin(sqe(0x09, 0, 0x07, 0), page).cqe.status == sc::kInvalidField);
  CHECK(h.admin(sqe(0x08), page).cqe.status == sc::kInvalidOpcode);
  CHECK(h.connect(1, 31, static_cast<uint16_t>(r.cqe.result)).cqe.status == sc::kConnectInvalidParam);
  CHECK(r.ctrl->execute_io(sqe(0x02, 1), page).cqe.status == sc::kInvalidOpcode);

  // As nvme-cli does: the header first (numrec), then the whole log.
  std::vector<uint8_t> hdr(1024);
  REQUIRE(h.admin(sqe(0x02, 0, (255u << 16) | 0x70), hdr).cqe.status.ok());
  uint64_t n = le::get64(&hdr[8]);
  CHECK(n == 2);  // ram0 (allowed for kHost) and open
  std::vector<uint8_t> all(1024 * (n + 1));
  uint32_t numd = static_cast<uint32_t>(all.size() / 4 - 1);
  REQUIRE(h.admin(sqe(0x02, 0, (numd << 16) | 0x70), all).cqe.status.ok());
  DiscEntry e;
  REQUIRE(decode_disc_entry(std::span<const uint8_t>(all).subspan(1024), e));
  CHECK(e.subnqn == kSub);
  CHECK(e.traddr == "10.0.0.1");
  CHECK(e.trsvcid == "4420");
  CHECK(e.asqsz == 32);
  REQUIRE(decode_disc_entry(std::span<const uint8_t>(all).subspan(2048), e));
  CHECK(e.subnqn == "nqn.2026-12.org.droce:open");
  // From an offset: the second entry alone.
  Sqe off = sqe(0x02, 0, (255u << 16) | 0x70);
  off.cdw12 = 2048;
  std::vector<uint8_t> one(1024);
  REQUIRE(h.admin(off, one).cqe.status.ok());
  CHECK(std::memcmp(one.data(), &all[2048], 1024) == 0);
  // Another host sees only the open subsystem.
  Host o{t};
  o.subnqn = kDiscoveryNqn;
  o.hostnqn = "nqn.2026-12.org.droce:other";
  auto ro = o.connect(0, 31, 0xffff, 0);
  REQUIRE(ro.cqe.status.ok());
  o.ctrl = ro.ctrl;
  REQUIRE(o.prop_set(0x14, 0x00460001).cqe.status.ok());
  REQUIRE(o.admin(sqe(0x02, 0, (255u << 16) | 0x70), hdr).cqe.status.ok());
  CHECK(le::get64(&hdr[8]) == 1);
  // The generation counter moves when subsystems are added.
  uint64_t gen = le::get64(&hdr[0]);
  t.add_subsystem("nqn.2026-12.org.droce:later", "L", true);
  REQUIRE(o.admin(sqe(0x02, 0, (255u << 16) | 0x70), hdr).cqe.status.ok());
  CHECK(le::get64(&hdr[0]) == gen + 1);
  CHECK(le::get64(&hdr[8]) == 2);
}

TEST_CASE("target config and subsystem errors name the field", "[nvmf][controller]") {
  TargetConfig c;
  c.max_queue_depth = 129;
  CHECK_THROWS_WITH(Target(c), Catch::Contains("max_queue_depth"));
  c = TargetConfig{};
  c.in_capsule_data = 100;
  CHECK_THROWS_WITH(Target(c), Catch::Contains("in_capsule_data"));
  Target t(tcfg());
  populate(t);
  CHECK_THROWS_WITH(t.add_subsystem(kSub, "X", true), Catch::Contains("duplicate"));
  CHECK_THROWS_WITH(t.add_subsystem("nqn.bad", "X", true), Catch::Contains("malformed"));
  CHECK_THROWS_WITH(t.add_subsystem("nqn.2026-12.org.droce:x", std::string(21, 'S'), true), Catch::Contains("serial"));
  CHECK_THROWS_WITH(t.subsystem(kSub)->add_namespace(Namespace::ram({1, 512, 4096}, kSub)), Catch::Contains("duplicate nsid"));
  CHECK_THROWS_WITH(t.subsystem(kSub)->allow_host("host"), Catch::Contains("malformed"));
}

TEST_CASE("controller: random commands never crash and never claim more data than the buffer", "[nvmf][controller]") {
  Target t(tcfg());
  populate(t);
  Host h{t};
  h.bring_up();
  Host d{t};
  d.subnqn = kDiscoveryNqn;
  auto dr = d.connect(0, 31, 0xffff, 0);
  d.ctrl = dr.ctrl;
  REQUIRE(d.prop_set(0x14, 0x00460001).cqe.status.ok());
  std::mt19937 rng(3);
  std::vector<uint8_t> buf(8192);
  for (int i = 0; i < 30000; ++i) {
    Sqe s;
    std::array<uint8_t, 64> b;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    decode_sqe(b, s);
    if (rng() % 2) s.opcode = static_cast<uint8_t>(rng() % 0x1a);
    if (rng() % 2) s.nsid = rng() % 5;
    if (rng() % 2) s.cdw10 &= 0xff00ffff;
    if (s.opcode == 0x7f && s.fctype() == 0 && (s.cdw11 == 0x14) && rng() % 4) continue;  // keep it enabled mostly
    std::span<uint8_t> data(buf.data(), rng() % 8 ? rng() % buf.size() : 0);
    Controller* c = rng() % 4 ? h.ctrl : d.ctrl;
    Response r = (rng() % 2) ? c->execute_admin(s, data, i * kMs) : c->execute_io(s, data);
    REQUIRE(r.data_len <= data.size());
    REQUIRE(r.cqe.cid == s.cid);
    Cqe a;
    while (c->take_async(a)) {}
  }
}

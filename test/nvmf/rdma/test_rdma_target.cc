// lib/nvmf/rdma: the NVMe-oF RDMA glue over the real engine and RDMA CM.
// Two embedded nodes over a net_ring pair in one process: node B runs
// RdmaTarget, node A is a host made of droce pieces (its QP, its CM) that
// speaks NVMe-RDMA as Linux's nvme-rdma does: CM REQ with the NVMe-RDMA
// private data, Fabrics Connect (admin data by RDMA READ, I/O in the
// capsule), Property Set/Get, Identify into a keyed SGL with invalidation,
// writes by RDMA READ and in-capsule, reads by RDMA WRITE, data checked; a
// REQ that does not fit gets the NVMe-RDMA reject; DREQ from either side
// destroys the queues (and the controller).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "embedded_pair.h"
#include "engine/embed.h"
#include "nvmf/capsule.h"
#include "nvmf/cm_private.h"
#include "nvmf/le.h"
#include "control/client.h"
#include "nvmf/rdma/control.h"
#include "nvmf/rdma/target.h"

using namespace droce;
using namespace droce::nvmf;

namespace {

constexpr const char* kSub = "nqn.2026-12.org.droce:ring0";
constexpr const char* kHost = "nqn.2014-08.org.nvmexpress:uuid:2b4e28ba-2fa1-11d2-883f-0016d3cca427";
constexpr uint32_t kGa = 0x0A400001, kGb = 0x0A400002;  // 10.64.0.1 (host), 10.64.0.2 (target)
constexpr size_t kMem = 1 << 20;
// Host memory layout: capsules to send, response receive buffers, data.
constexpr size_t kCapOff = 0, kCapSize = 64 + 8192;
constexpr size_t kRespOff = 64 * 1024, kRespSize = 64, kResps = 32;
constexpr size_t kDataOff = 128 * 1024;

struct HostQueue {
  engine::QpHandle qp;
  cm::ConnId id = 0;
  uint16_t cid = 0;
};

struct Rig : testing::EmbeddedPair {
  Target target;
  std::unique_ptr<rdma::RdmaTarget> tgt;
  std::vector<cm::Event> ev;
  uint32_t pd = 0, key = 0;
  uint8_t* mem = nullptr;
  uint16_t next_port = 40000;

  // add: the subsystem's namespaces (none given: a 4 MiB RAM disk as nsid 1).
  // loops: core loops of both nodes (the net_ring pair gets as many queues).
  // threads: the target's loops 1..N-1 on threads of their own (RdmaOptions::threads).
  explicit Rig(const TargetConfig& tc, const std::function<void(Subsystem&)>& add = {}, uint16_t loops = 1,
               bool threads = false)
      : EmbeddedPair("nvmfrdma", "10.64.0.1", "10.64.0.2", 4095, loops), target(tc) {
    Subsystem& s = target.add_subsystem(kSub, "RING0", false);
    s.allow_host(kHost);
    if (add)
      add(s);
    else
      s.add_namespace(Namespace::ram({1, 512, 4 << 20}, kSub));
    rdma::RdmaOptions ro;
    ro.listen = {"10.64.0.2"};
    ro.threads = threads;
    tgt = std::make_unique<rdma::RdmaTarget>(b, target, ro);
    a.set_cm_sink([this](const cm::Event& e) { ev.push_back(e); });
    pd = a.alloc_pd();
    mem = static_cast<uint8_t*>(a.alloc_dma(kMem));
    REQUIRE(mem);
    std::memset(mem, 0, kMem);
    REQUIRE(a.reg_mr(pd, mem, kMem, verbs::kAccessAll, &key) == 0);
  }
  ~Rig() {
    tgt.reset();
    a.set_cm_sink({});
  }
  void pump() {
    a.poll();
    tgt->poll();
  }
  // Polls both nodes until cond() holds (bounded in passes and in time).
  template <class F>
  bool until(F cond, int seconds = 10) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    for (int it = 0; it < 50'000'000 && std::chrono::steady_clock::now() < give_up; ++it) {
      if (cond()) return true;
      pump();
    }
    return cond();
  }
  bool take(cm::EventType t, cm::Event* out = nullptr) { return testing::take_event(ev, t, out); }

  // CM connect with the NVMe-RDMA private data. Returns the REJ's status
  // (Ok when accepted: q is then ready for capsules).
  CmStatus connect(HostQueue& q, uint16_t qid, uint16_t hsqsize) {
    engine::QpOptions qo;
    qo.cap.max_send_wr = 64;
    qo.cap.max_recv_wr = kResps;
    q.qp = a.create_qp(pd, qo);
    for (uint32_t i = 0; i < kResps; ++i) post_resp(q, i);
    cm::ConnectArgs args;
    args.local = {wire::gid_from_ipv4(kGa), next_port++};
    args.remote = {wire::gid_from_ipv4(kGb), kRdmaPort};
    CmRequest r{kCmRecfmt, qid, static_cast<uint16_t>(hsqsize + 1), hsqsize};
    encode_cm_request(std::span<uint8_t, kCmRequestSize>(args.param.private_data, kCmRequestSize), r);
    args.param.private_data_len = kCmRequestSize;
    args.param.qpn = q.qp.qpn;
    args.param.responder_resources = 16;  // the target READs host data
    args.param.initiator_depth = 16;
    REQUIRE(a.cm().connect(args, 0, &q.id) == 0);
    cm::Event e;
    REQUIRE(until([&] { return take(cm::EventType::ConnectResponse, &e) || take(cm::EventType::Rejected, &e); }));
    if (e.type == cm::EventType::Rejected) {
      uint16_t recfmt = 0xffff;
      CmStatus st = CmStatus::Ok;
      REQUIRE(decode_cm_reject(std::span<const uint8_t>(e.param.private_data, e.param.private_data_len), recfmt, st));
      CHECK(recfmt == kCmRecfmt);
      a.destroy_qp(q.qp);
      return st;
    }
    uint16_t recfmt = 0xffff, crqsize = 0;
    REQUIRE(decode_cm_accept(std::span<const uint8_t>(e.param.private_data, e.param.private_data_len), recfmt, crqsize));
    CHECK(recfmt == kCmRecfmt);
    CHECK(crqsize == hsqsize + 1);
    cm::QpParams p{};
    REQUIRE(a.cm().qp_params(q.id, p) == 0);
    REQUIRE(a.connect(q.qp, p) == 0);
    REQUIRE(a.cm().establish(q.id) == 0);
    return CmStatus::Ok;
  }
  void post_resp(HostQueue& q, uint32_t i) {
    verbs::RecvWr r;
    r.wr_id = i;
    r.num_sge = 1;
    r.sg_list[0] = {reinterpret_cast<uint64_t>(mem + kRespOff + i * kRespSize), kRespSize, key};
    REQUIRE(a.post_recv(q.qp, r) == 0);
  }
  // Sends one command capsule (SQE + in-capsule data) and waits for its CQE.
  // inv_key: set to the rkey the response invalidated (0: none).
  Cqe run(HostQueue& q, Sqe s, std::span<const uint8_t> icd = {}, uint32_t* inv_key = nullptr) {
    s.flags = 0x40;  // PSDT: SGL
    s.cid = ++q.cid;
    uint8_t* cap = mem + kCapOff;
    encode_sqe(std::span<uint8_t, kSqeSize>(cap, kSqeSize), s);
    if (!icd.empty()) std::memcpy(cap + kSqeSize, icd.data(), icd.size());
    verbs::SendWr w;
    w.wr_id = 1;
    w.num_sge = 1;
    w.sg_list[0] = {reinterpret_cast<uint64_t>(cap), static_cast<uint32_t>(kSqeSize + icd.size()), key};
    REQUIRE(a.post_send(q.qp, w) == 0);
    verbs::Wc wc{};
    bool sent = false, got = false;
    Cqe c;
    REQUIRE(until([&] {
      verbs::Wc sw{};
      if (q.qp.scq->poll(&sw, 1) == 1) {
        CHECK(sw.status == verbs::WcStatus::Success);
        sent = true;
      }
      if (!got && q.qp.rcq->poll(&wc, 1) == 1) got = true;
      return sent && got;
    }));
    REQUIRE(wc.status == verbs::WcStatus::Success);
    REQUIRE(wc.byte_len == kCqeSize);
    decode_cqe(std::span<const uint8_t, kCqeSize>(mem + kRespOff + wc.wr_id * kRespSize, kCqeSize), c);
    if (inv_key) *inv_key = (wc.wc_flags & verbs::kWcWithInv) ? wc.imm_data : 0;
    post_resp(q, static_cast<uint32_t>(wc.wr_id));
    CHECK(c.cid == s.cid);
    return c;
  }
  // Admin queue (Connect by RDMA READ, CC.EN) and I/O queue 1 (Connect in
  // the capsule), as Linux brings a controller up. Returns the cntlid.
  uint16_t bring_up(HostQueue& adm, HostQueue& io, uint32_t kato_ms = 0) {
    REQUIRE(connect(adm, 0, 31) == CmStatus::Ok);
    Sqe c = cmd(0x7f);
    encode_connect(c, ConnectCmd{0, 0, 31, 0, kato_ms});
    auto cd = connect_data(kCntlidDynamic);
    std::memcpy(mem + kDataOff, cd.data(), cd.size());
    keyed(c, kDataOff, kConnectDataSize);
    Cqe rc = run(adm, c);
    REQUIRE(rc.status.ok());
    const uint16_t cntlid = static_cast<uint16_t>(rc.result);
    Sqe ps = cmd(0x7f);
    encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
    REQUIRE(run(adm, ps).status.ok());
    REQUIRE(connect(io, 1, 31) == CmStatus::Ok);
    Sqe ic = cmd(0x7f);
    encode_connect(ic, ConnectCmd{0, 1, 31, 0, 0});
    encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, kConnectDataSize});
    auto icd = connect_data(cntlid);
    REQUIRE(run(io, ic, icd).status.ok());
    return cntlid;
  }
  // Posts one capsule without waiting for its response (see run()).
  void send_capsule(HostQueue& q, Sqe& s) {
    s.flags = 0x40;
    s.cid = ++q.cid;
    uint8_t* cap = mem + kCapOff + 4096;
    encode_sqe(std::span<uint8_t, kSqeSize>(cap, kSqeSize), s);
    verbs::SendWr w;
    w.wr_id = 2;
    w.num_sge = 1;
    w.sg_list[0] = {reinterpret_cast<uint64_t>(cap), static_cast<uint32_t>(kSqeSize), key};
    REQUIRE(a.post_send(q.qp, w) == 0);
  }
  static Sqe cmd(uint8_t op, uint32_t nsid = 0) {
    Sqe s;
    s.opcode = op;
    s.nsid = nsid;
    encode_sgl(s.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
    return s;
  }
  void keyed(Sqe& s, size_t off, uint32_t len, uint32_t k = 0, bool inv = false) {
    encode_sgl(s.dptr, Sgl{inv ? SglKind::KeyedInvalidate : SglKind::Keyed, reinterpret_cast<uint64_t>(mem + off),
                           len, k ? k : key});
  }
  std::array<uint8_t, kConnectDataSize> connect_data(uint16_t cntlid) {
    ConnectData d;
    d.cntlid = cntlid;
    d.subnqn = kSub;
    d.hostnqn = kHost;
    std::array<uint8_t, kConnectDataSize> b;
    encode_connect_data(b, d);
    return b;
  }
};

TargetConfig tcfg() {
  TargetConfig c;
  c.traddr = "10.64.0.2";
  c.in_capsule_data = 8192;
  c.mdts = 3;  // 32 KiB
  c.max_io_queues = 2;
  return c;
}

}  // namespace

TEST_CASE("nvmf rdma: a host of droce pieces connects through the CM, Identify, write and read with data checked",
          "[nvmf][rdma]") {
  Rig r(tcfg());

  // A REQ that does not fit: the NVMe-RDMA reject status comes back in the REJ.
  HostQueue bad;
  CHECK(r.connect(bad, 0, 200) == CmStatus::InvalidHsqsize);
  HostQueue bad2;
  CHECK(r.connect(bad2, 9, 31) == CmStatus::InvalidQid);
  CHECK(r.tgt->counters().rejected_private == 2);
  CHECK(r.tgt->queues() == 0);

  // Admin queue: Connect with its data by RDMA READ (as Linux sends it).
  HostQueue adm;
  REQUIRE(r.connect(adm, 0, 31) == CmStatus::Ok);
  REQUIRE(r.until([&] { return r.tgt->queues() == 1; }));
  Sqe c = Rig::cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 31, 0, 5000});
  auto cd = r.connect_data(kCntlidDynamic);
  std::memcpy(r.mem + kDataOff, cd.data(), cd.size());
  r.keyed(c, kDataOff, kConnectDataSize);
  Cqe rc = r.run(adm, c);
  REQUIRE(rc.status.ok());
  const uint16_t cntlid = static_cast<uint16_t>(rc.result);
  CHECK(rc.sq_id == 0);
  CHECK(r.target.controller(cntlid) != nullptr);

  // CC.EN = 1, then CSTS.RDY by Property Get.
  Sqe ps = Rig::cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  REQUIRE(r.run(adm, ps).status.ok());
  Sqe pg = Rig::cmd(0x7f);
  encode_property(pg, FabricsType::PropertyGet, PropertyCmd{false, 0x1c, 0});
  Cqe csts = r.run(adm, pg);
  REQUIRE(csts.status.ok());
  CHECK((csts.result & 1) == 1);

  // Identify Controller into a key the response invalidates (SGL 0x4F).
  uint8_t* idbuf = r.mem + kDataOff + 8192;
  std::memset(idbuf, 0xee, 4096);
  uint32_t idkey = 0;
  REQUIRE(r.a.reg_mr(r.pd, idbuf, 4096, verbs::kAccessAll | verbs::kMrRemoteInvalidate, &idkey) == 0);
  Sqe id = Rig::cmd(0x06);
  id.cdw10 = 1;
  r.keyed(id, kDataOff + 8192, 4096, idkey, true);
  uint32_t inv = 0;
  REQUIRE(r.run(adm, id, {}, &inv).status.ok());
  CHECK(inv == idkey);
  CHECK(le::get16(idbuf + 78) == cntlid);
  CHECK(std::string(reinterpret_cast<const char*>(idbuf + 768)) == kSub);
  CHECK(le::get32(idbuf + 1792) == (64 + 8192) / 16);  // IOCCSZ

  // I/O queue 1: Connect in the capsule.
  HostQueue io;
  REQUIRE(r.connect(io, 1, 63) == CmStatus::Ok);
  Sqe ic = Rig::cmd(0x7f);
  encode_connect(ic, ConnectCmd{0, 1, 63, 0, 0});
  encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, kConnectDataSize});
  auto icd = r.connect_data(cntlid);
  Cqe ir = r.run(io, ic, icd);
  REQUIRE(ir.status.ok());
  CHECK(ir.sq_id == 1);
  CHECK(r.target.controller(cntlid)->io_queue_connected(1));

  // Write 4 KiB in the capsule at LBA 8 and 32 KiB by RDMA READ at LBA 16, read 36 KiB back by RDMA WRITE.
  std::vector<uint8_t> a1(4096), b1(32768);
  for (size_t i = 0; i < a1.size(); ++i) a1[i] = static_cast<uint8_t>(i ^ 0x5a);
  for (size_t i = 0; i < b1.size(); ++i) b1[i] = static_cast<uint8_t>(i * 13 + (i >> 9));
  Sqe w1 = Rig::cmd(0x01, 1);
  w1.cdw10 = 8;
  w1.cdw12 = 7;
  encode_sgl(w1.dptr, Sgl{SglKind::InCapsule, 0, 4096});
  REQUIRE(r.run(io, w1, a1).status.ok());
  Sqe w2 = Rig::cmd(0x01, 1);
  w2.cdw10 = 16;
  w2.cdw12 = 63;
  std::memcpy(r.mem + kDataOff + 65536, b1.data(), b1.size());
  r.keyed(w2, kDataOff + 65536, 32768);
  REQUIRE(r.run(io, w2).status.ok());
  std::memset(r.mem + kDataOff + 131072, 0, 65536);
  Sqe rd = Rig::cmd(0x02, 1);
  rd.cdw10 = 8;
  rd.cdw12 = 7;
  r.keyed(rd, kDataOff + 131072, 4096);
  REQUIRE(r.run(io, rd).status.ok());
  CHECK(std::memcmp(r.mem + kDataOff + 131072, a1.data(), a1.size()) == 0);
  rd.cdw10 = 16;
  rd.cdw12 = 63;
  r.keyed(rd, kDataOff + 131072 + 4096, 32768);
  REQUIRE(r.run(io, rd).status.ok());
  CHECK(std::memcmp(r.mem + kDataOff + 131072 + 4096, b1.data(), b1.size()) == 0);
  // Beyond MDTS: an error status, the queue stays up.
  Sqe big = Rig::cmd(0x02, 1);
  big.cdw12 = 127;
  r.keyed(big, kDataOff, 65536);
  CHECK(!r.run(io, big).status.ok());

  auto rep = r.tgt->report();
  REQUIRE(rep.size() == 2);
  CHECK(rep[1].qid == 1);
  CHECK(rep[1].cntlid == cntlid);
  CHECK(rep[1].q.commands == 5 + 1);
  CHECK(rep[1].q.latency.count == 5 + 1);  // each answered and its SEND completed
  CHECK(rep[1].q.latency.percentile(0.99) > 0);
  CHECK(rep[1].q.latency.max_ns < 10'000'000'000ull);
  CHECK(rep[1].q.bytes_in == kConnectDataSize + 4096 + 32768);
  CHECK(rep[1].q.bytes_out == 4096 + 32768);
  CHECK(rep[1].q.overflow == 0);
  CHECK(rep[1].wc_errors == 0);

  // The host disconnects the I/O queue; the target disconnects the admin queue (shutdown).
  REQUIRE(r.a.cm().disconnect(io.id) == 0);
  REQUIRE(r.until([&] { return r.tgt->queues() == 1; }));
  CHECK(!r.target.controller(cntlid)->io_queue_connected(1));
  r.tgt->disconnect_all();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  CHECK(r.target.controllers() == 0);
  CHECK(r.take(cm::EventType::Disconnected));
  CHECK(r.tgt->counters().accepted == 2);
  CHECK(r.tgt->counters().queues_destroyed == 2);
  rep = r.tgt->report();
  REQUIRE(rep.size() == 2);
  CHECK(rep[0].closed);
  CHECK(rep[1].closed);
  r.a.destroy_qp(adm.qp);
  r.a.destroy_qp(io.qp);
}

TEST_CASE("nvmf rdma: writes and reads with data checked while the target's port loses 3% of frames each way",
          "[nvmf][rdma][loss]") {
  Rig r(tcfg());
  HostQueue adm, io;
  REQUIRE(r.connect(adm, 0, 31) == CmStatus::Ok);
  Sqe c = Rig::cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 31, 0, 0});
  auto cd = r.connect_data(kCntlidDynamic);
  std::memcpy(r.mem + kDataOff, cd.data(), cd.size());
  r.keyed(c, kDataOff, kConnectDataSize);
  Cqe rc = r.run(adm, c);
  REQUIRE(rc.status.ok());
  const uint16_t cntlid = static_cast<uint16_t>(rc.result);
  Sqe ps = Rig::cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  REQUIRE(r.run(adm, ps).status.ok());
  REQUIRE(r.connect(io, 1, 31) == CmStatus::Ok);
  Sqe ic = Rig::cmd(0x7f);
  encode_connect(ic, ConnectCmd{0, 1, 31, 0, 0});
  encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, kConnectDataSize});
  auto icd = r.connect_data(cntlid);
  REQUIRE(r.run(io, ic, icd).status.ok());

  auto& f = r.b.faults();
  f.set(config::FaultDir::rx, config::FaultKind::drop, 0.03);
  f.set(config::FaultDir::tx, config::FaultKind::drop, 0.03);
  f.publish();
  // 60 rounds: 16 KiB written by RDMA READ at a rotating LBA, read back by RDMA WRITE, compared.
  uint8_t* src = r.mem + kDataOff;
  uint8_t* dst = r.mem + kDataOff + 65536;
  for (uint32_t round = 0; round < 60; ++round) {
    for (size_t i = 0; i < 16384; ++i) src[i] = static_cast<uint8_t>(i * 7 + round * 31 + (i >> 8));
    std::memset(dst, 0, 16384);
    const uint32_t lba = (round * 32) % 4096;
    Sqe w = Rig::cmd(0x01, 1);
    w.cdw10 = lba;
    w.cdw12 = 31;
    r.keyed(w, kDataOff, 16384);
    REQUIRE(r.run(io, w).status.ok());
    Sqe rd = Rig::cmd(0x02, 1);
    rd.cdw10 = lba;
    rd.cdw12 = 31;
    r.keyed(rd, kDataOff + 65536, 16384);
    REQUIRE(r.run(io, rd).status.ok());
    REQUIRE(std::memcmp(src, dst, 16384) == 0);
  }
  f.set(config::FaultDir::rx, config::FaultKind::drop, 0);
  f.set(config::FaultDir::tx, config::FaultKind::drop, 0);
  f.publish();
  auto rep = r.tgt->report();
  REQUIRE(rep.size() == 2);
  CHECK(rep[1].q.commands == 121);
  CHECK(rep[1].q.errors == 0);
  CHECK(rep[1].wc_errors == 0);
  CHECK(rep[1].q.overflow == 0);
  r.tgt->disconnect_all();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  r.a.destroy_qp(adm.qp);
  r.a.destroy_qp(io.qp);
}

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/droce-nvmf-rdma-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + seed * 17 + (i >> 9)) ^ (seed >> 3));
  return v;
}

}  // namespace

TEST_CASE("nvmf rdma: a file namespace through the glue: writes and reads with data checked, the file's bytes after",
          "[nvmf][rdma][file]") {
  TempDir dir;
  const std::string img = dir.path + "/disk.img";
  constexpr uint64_t kSize = 4 << 20;
  Rig r(tcfg(), [&](Subsystem& s) { s.add_namespace(Namespace::file({1, 512, kSize}, kSub, img)); });
  REQUIRE(r.tgt->ring() != nullptr);  // the glue made the loop's io_uring
  HostQueue adm, io;
  r.bring_up(adm, io);

  // 4 KiB in the capsule at LBA 8, 32 KiB by RDMA READ at LBA 100 (not 4 KiB aligned: the buffered descriptor),
  // 16 KiB by RDMA READ at LBA 2048; each read back by RDMA WRITE and compared.
  struct W {
    uint32_t lba;
    std::vector<uint8_t> data;
    bool in_capsule;
  };
  std::vector<W> ws = {{8, pattern(4096, 1), true}, {100, pattern(32768, 2), false}, {2048, pattern(16384, 3), false}};
  for (auto& w : ws) {
    Sqe c = Rig::cmd(0x01, 1);
    c.cdw10 = w.lba;
    c.cdw12 = static_cast<uint32_t>(w.data.size() / 512 - 1);
    if (w.in_capsule) {
      encode_sgl(c.dptr, Sgl{SglKind::InCapsule, 0, static_cast<uint32_t>(w.data.size())});
      REQUIRE(r.run(io, c, w.data).status.ok());
    } else {
      std::memcpy(r.mem + kDataOff, w.data.data(), w.data.size());
      r.keyed(c, kDataOff, static_cast<uint32_t>(w.data.size()));
      REQUIRE(r.run(io, c).status.ok());
    }
  }
  for (auto& w : ws) {
    std::memset(r.mem + kDataOff + 65536, 0, 65536);
    Sqe rd = Rig::cmd(0x02, 1);
    rd.cdw10 = w.lba;
    rd.cdw12 = static_cast<uint32_t>(w.data.size() / 512 - 1);
    r.keyed(rd, kDataOff + 65536, static_cast<uint32_t>(w.data.size()));
    REQUIRE(r.run(io, rd).status.ok());
    CHECK(std::memcmp(r.mem + kDataOff + 65536, w.data.data(), w.data.size()) == 0);
  }
  // Flush (fdatasync through the ring).
  REQUIRE(r.run(io, Rig::cmd(0x00, 1)).status.ok());
  // An LBA beyond the namespace: refused before the ring.
  Sqe oor = Rig::cmd(0x02, 1);
  oor.cdw10 = static_cast<uint32_t>(kSize / 512);
  r.keyed(oor, kDataOff, 512);
  CHECK(r.run(io, oor).status == sc::kLbaRange);

  auto rep = r.tgt->report();
  REQUIRE(rep.size() == 2);
  CHECK(rep[1].q.file_commands == 3 + 3 + 1);
  CHECK(rep[1].q.latency.count == rep[1].q.commands);
  CHECK(rep[1].q.no_ring == 0);
  CHECK(rep[1].q.errors == 1);
  CHECK(r.tgt->ring()->counters().completed == 7);
  CHECK(r.tgt->ring()->counters().errors == 0);

  // The file holds the bytes.
  int fd = ::open(img.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  struct stat st{};
  REQUIRE(::fstat(fd, &st) == 0);
  CHECK(static_cast<uint64_t>(st.st_size) == kSize);
  for (auto& w : ws) {
    std::vector<uint8_t> got(w.data.size());
    REQUIRE(::pread(fd, got.data(), got.size(), off_t{w.lba} * 512) == static_cast<ssize_t>(got.size()));
    CHECK(got == w.data);
  }
  std::vector<uint8_t> gap(512);
  REQUIRE(::pread(fd, gap.data(), gap.size(), 0) == 512);  // never written: zeroes
  CHECK(std::all_of(gap.begin(), gap.end(), [](uint8_t b) { return b == 0; }));
  ::close(fd);

  r.tgt->disconnect_all();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  CHECK(r.target.controllers() == 0);
  r.a.destroy_qp(adm.qp);
  r.a.destroy_qp(io.qp);
}

TEST_CASE("nvmf rdma: a queue disconnected with a file command in the ring is destroyed once it completes, "
          "the loop never waits",
          "[nvmf][rdma][file]") {
  TempDir dir;
  const std::string fifo = dir.path + "/slow";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int ffd = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);  // O_RDWR: the open does not wait for a writer
  REQUIRE(ffd >= 0);
  int wfd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(wfd >= 0);
  // nsid 1: a FIFO, a backend that answers a read only once something is written into it.
  Rig r(tcfg(), [&](Subsystem& s) { s.add_namespace(Namespace::file_fd({1, 512, 1 << 20}, kSub, ffd, false)); });
  HostQueue adm, io;
  r.bring_up(adm, io);
  Sqe rd = Rig::cmd(0x02, 1);
  rd.cdw12 = 7;
  r.keyed(rd, kDataOff, 4096);
  r.send_capsule(io, rd);
  REQUIRE(r.until([&] { return r.tgt->ring()->in_flight() == 1; }));

  // The host goes: the target's queue leaves the CM but stays until the ring gives its read back.
  REQUIRE(r.a.cm().disconnect(io.id) == 0);
  REQUIRE(r.until([&] { return r.tgt->counters().destroy_deferred == 1; }));
  CHECK(r.tgt->queues() == 2);
  CHECK(r.tgt->counters().queues_destroyed == 0);
  // Polls with the read outstanding return at once.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) r.pump();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  CHECK(r.tgt->queues() == 2);

  // The FIFO answers: the read completes, its response is dropped, the queue is destroyed.
  auto bytes = pattern(4096, 9);
  REQUIRE(::write(wfd, bytes.data(), bytes.size()) == 4096);
  REQUIRE(r.until([&] { return r.tgt->queues() == 1; }));
  CHECK(r.tgt->counters().queues_destroyed == 1);
  CHECK(r.tgt->ring()->in_flight() == 0);
  CHECK(r.tgt->ring()->counters().orphaned == 0);  // it came back to its queue, not to a freed one
  auto rep = r.tgt->report();
  REQUIRE(rep.size() == 2);
  CHECK(rep[0].closed);
  CHECK(rep[0].qid == 1);
  CHECK(rep[0].q.file_commands == 1);

  r.tgt->disconnect_all();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  ::close(wfd);
  r.a.destroy_qp(adm.qp);
  r.a.destroy_qp(io.qp);
}

TEST_CASE("nvmf rdma: cores = 2: I/O queues placed on both core loops, commands served by each loop's engine and "
          "io_uring",
          "[nvmf][rdma][cores]") {
  TempDir dir;
  const std::string img = dir.path + "/disk.img";
  TargetConfig tc = tcfg();
  tc.max_io_queues = 4;
  Rig r(tc, [&](Subsystem& s) { s.add_namespace(Namespace::file({1, 512, 4 << 20}, kSub, img)); }, 2);
  REQUIRE(r.b.loops() == 2);
  REQUIRE(r.tgt->loops() == 2);
  REQUIRE(r.tgt->ring(0) != nullptr);
  REQUIRE(r.tgt->ring(1) != nullptr);
  CHECK(r.tgt->ring(0) != r.tgt->ring(1));

  HostQueue adm;
  REQUIRE(r.connect(adm, 0, 31) == CmStatus::Ok);
  Sqe c = Rig::cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 31, 0, 0});
  auto cd = r.connect_data(kCntlidDynamic);
  std::memcpy(r.mem + kDataOff, cd.data(), cd.size());
  r.keyed(c, kDataOff, kConnectDataSize);
  Cqe rc = r.run(adm, c);
  REQUIRE(rc.status.ok());
  const uint16_t cntlid = static_cast<uint16_t>(rc.result);
  Sqe ps = Rig::cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  REQUIRE(r.run(adm, ps).status.ok());

  // I/O queues 2, 1, 3 in that order (round robin would put qid 2 on loop 1):
  // qid n belongs on loop n % 2.
  const uint16_t qids[] = {2, 1, 3};
  HostQueue io[3];
  for (int i = 0; i < 3; ++i) {
    REQUIRE(r.connect(io[i], qids[i], 31) == CmStatus::Ok);
    Sqe ic = Rig::cmd(0x7f);
    encode_connect(ic, ConnectCmd{0, qids[i], 31, 0, 0});
    encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, kConnectDataSize});
    auto icd = r.connect_data(cntlid);
    REQUIRE(r.run(io[i], ic, icd).status.ok());
  }
  // Per queue: 4 writes of 4 KiB (in the capsule) at its own LBAs, read back by RDMA WRITE, compared.
  for (int round = 0; round < 4; ++round)
    for (int i = 0; i < 3; ++i) {
      const uint32_t lba = static_cast<uint32_t>(qids[i] * 256 + round * 8);
      auto data = pattern(4096, static_cast<uint32_t>(qids[i] * 10 + round));
      Sqe w = Rig::cmd(0x01, 1);
      w.cdw10 = lba;
      w.cdw12 = 7;
      encode_sgl(w.dptr, Sgl{SglKind::InCapsule, 0, 4096});
      REQUIRE(r.run(io[i], w, data).status.ok());
      std::memset(r.mem + kDataOff + 65536, 0, 4096);
      Sqe rd = Rig::cmd(0x02, 1);
      rd.cdw10 = lba;
      rd.cdw12 = 7;
      r.keyed(rd, kDataOff + 65536, 4096);
      REQUIRE(r.run(io[i], rd).status.ok());
      CHECK(std::memcmp(r.mem + kDataOff + 65536, data.data(), 4096) == 0);
    }

  // Each queue on loop qid % 2 (admin: loop 0), its QP of that loop's QPN residue
  // (the engine that owns it), each loop's commands counted apart.
  auto rep = r.tgt->report();
  REQUIRE(rep.size() == 4);
  uint64_t per_loop[2] = {0, 0};
  for (const auto& q : rep) {
    CHECK(q.loop == rdma::RdmaTarget::loop_of(q.qid, 2));
    CHECK(q.loop == (q.qid == 0 ? 0 : q.qid % 2));
    CHECK(r.b.dataplane().owner_core(0, q.qpn) == r.b.dataplane().port_cores(0)[q.loop]);
    CHECK(q.q.errors == 0);
    per_loop[q.loop] += q.q.commands;
  }
  auto loops = r.tgt->loop_report();
  REQUIRE(loops.size() == 2);
  CHECK(loops[0].live_queues == 2);  // admin + qid 2
  CHECK(loops[1].live_queues == 2);  // qid 1 and 3
  CHECK(loops[0].commands == per_loop[0]);
  CHECK(loops[1].commands == per_loop[1]);
  CHECK(loops[0].commands == 2 + 1 + 8);      // admin Connect + Property Set; qid 2: Connect + 8 I/O
  CHECK(loops[1].commands == 2 * (1 + 8));    // qid 1 and 3
  CHECK(loops[0].file_commands == 8);
  CHECK(loops[1].file_commands == 16);
  // The file commands went through the io_uring of their own loop.
  CHECK(r.tgt->ring(0)->counters().completed == 8);
  CHECK(r.tgt->ring(1)->counters().completed == 16);
  // And the frames through both loops' engines.
  for (size_t l = 0; l < 2; ++l) {
    size_t qps_here = 0;
    for (const auto& qi : r.b.dataplane().qps())
      if (qi.core == r.b.dataplane().port_cores(0)[l] && qi.type == verbs::QpType::RC && qi.ctr.rx_packets > 0) ++qps_here;
    CHECK(qps_here == 2);
  }

  r.tgt->disconnect_all();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  CHECK(r.target.controllers() == 0);
  r.a.destroy_qp(adm.qp);
  for (auto& q : io) r.a.destroy_qp(q.qp);
}

TEST_CASE("nvmf rdma: cores = 2 with loops on threads: each queue served by its own loop's thread, data checked; "
          "keep-alive expiry tears down I/O queues of the other thread, one with a file command in its ring",
          "[nvmf][rdma][cores][threads]") {
  TempDir dir;
  const std::string img = dir.path + "/disk.img";
  const std::string fifo = dir.path + "/slow";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int ffd = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(ffd >= 0);
  int wfd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  REQUIRE(wfd >= 0);
  TargetConfig tc = tcfg();
  tc.max_io_queues = 4;
  // nsid 1: a file; nsid 2: a FIFO (answers a read only once written to).
  Rig r(
      tc,
      [&](Subsystem& s) {
        s.add_namespace(Namespace::file({1, 512, 4 << 20}, kSub, img));
        s.add_namespace(Namespace::file_fd({2, 512, 1 << 20}, kSub, ffd, false));
      },
      2, true);
  REQUIRE(r.tgt->threaded());
  REQUIRE(r.b.loop_threads_running());
  const uint32_t me = static_cast<uint32_t>(::gettid());

  HostQueue adm;
  REQUIRE(r.connect(adm, 0, 31) == CmStatus::Ok);
  Sqe c = Rig::cmd(0x7f);
  encode_connect(c, ConnectCmd{0, 0, 31, 0, 1000});  // KATO 1 s
  auto cd = r.connect_data(kCntlidDynamic);
  std::memcpy(r.mem + kDataOff, cd.data(), cd.size());
  r.keyed(c, kDataOff, kConnectDataSize);
  Cqe rc = r.run(adm, c);
  REQUIRE(rc.status.ok());
  const uint16_t cntlid = static_cast<uint16_t>(rc.result);
  Sqe ps = Rig::cmd(0x7f);
  encode_property(ps, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  REQUIRE(r.run(adm, ps).status.ok());

  // I/O queues 1, 2, 3: loops 1, 0, 1 (qid % 2).
  const uint16_t qids[] = {1, 2, 3};
  HostQueue io[3];
  for (int i = 0; i < 3; ++i) {
    REQUIRE(r.connect(io[i], qids[i], 31) == CmStatus::Ok);
    Sqe ic = Rig::cmd(0x7f);
    encode_connect(ic, ConnectCmd{0, qids[i], 31, 0, 0});
    encode_sgl(ic.dptr, Sgl{SglKind::InCapsule, 0, kConnectDataSize});
    auto icd = r.connect_data(cntlid);
    REQUIRE(r.run(io[i], ic, icd).status.ok());
  }
  for (int round = 0; round < 4; ++round) {
    REQUIRE(r.run(adm, Rig::cmd(0x18)).status.ok());  // Keep Alive
    for (int i = 0; i < 3; ++i) {
      const uint32_t lba = static_cast<uint32_t>(qids[i] * 256 + round * 8);
      auto data = pattern(4096, static_cast<uint32_t>(qids[i] * 10 + round));
      Sqe w = Rig::cmd(0x01, 1);
      w.cdw10 = lba;
      w.cdw12 = 7;
      encode_sgl(w.dptr, Sgl{SglKind::InCapsule, 0, 4096});
      REQUIRE(r.run(io[i], w, data).status.ok());
      std::memset(r.mem + kDataOff + 65536, 0, 4096);
      Sqe rd = Rig::cmd(0x02, 1);
      rd.cdw10 = lba;
      rd.cdw12 = 7;
      r.keyed(rd, kDataOff + 65536, 4096);
      REQUIRE(r.run(io[i], rd).status.ok());
      CHECK(std::memcmp(r.mem + kDataOff + 65536, data.data(), 4096) == 0);
    }
  }

  // Loop 0 runs on this thread (poll()), loop 1 on another; every queue was
  // served (its capsules received) by the thread of its own loop.
  CHECK(r.tgt->loop_tid(0) == me);
  const uint32_t other = r.tgt->loop_tid(1);
  CHECK(other != 0);
  CHECK(other != me);
  auto rep = r.tgt->report();  // loop 1's queues reported by loop 1's thread
  REQUIRE(rep.size() == 4);
  uint64_t per_loop[2] = {0, 0};
  for (const auto& q : rep) {
    CHECK(q.loop == (q.qid == 0 ? 0 : q.qid % 2));
    CHECK(q.tid == (q.loop == 0 ? me : other));
    CHECK(r.b.dataplane().owner_core(0, q.qpn) == r.b.dataplane().port_cores(0)[q.loop]);
    CHECK(q.q.errors == 0);
    per_loop[q.loop] += q.q.commands;
  }
  auto loops = r.tgt->loop_report();
  REQUIRE(loops.size() == 2);
  CHECK(loops[0].tid == me);
  CHECK(loops[1].tid == other);
  CHECK(loops[0].commands == per_loop[0]);
  CHECK(loops[0].commands == 2 + 4 + 1 + 8);  // admin: Connect, Property Set, 4 Keep Alive; qid 2: Connect + 8 I/O
  CHECK(loops[1].commands == 2 * (1 + 8));    // qid 1 and 3
  CHECK(loops[0].file_commands == 8);
  CHECK(loops[1].file_commands == 16);
  CHECK(r.tgt->counters().loop_messages >= 2 + 2);  // two queues handed to loop 1, two report requests

  // A read of the FIFO on qid 3 (loop 1) stays in loop 1's io_uring; then the
  // host goes quiet. Keep-alive expires: DREQ on all four queues from the
  // home loop; loop 1 releases qid 1 at once and qid 3 once its read is back.
  Sqe fr = Rig::cmd(0x02, 2);
  fr.cdw12 = 7;
  r.keyed(fr, kDataOff, 4096);
  r.send_capsule(io[2], fr);
  REQUIRE(r.until([&] {
    for (const auto& l : r.tgt->loop_report())
      if (l.loop == 1 && l.file_commands == 17) return true;
    return false;
  }));
  const auto quiet = std::chrono::steady_clock::now();
  REQUIRE(r.until([&] { return r.tgt->counters().keep_alive_expired == 1 && r.tgt->queues() == 1; }, 5));
  CHECK(std::chrono::steady_clock::now() - quiet < std::chrono::seconds(4));
  CHECK(r.tgt->counters().disconnects_sent == 4);
  CHECK(r.target.controller(cntlid) == nullptr);  // out of the table; qid 3 still holds it
  // Polls return at once while qid 3's read is outstanding.
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 1000; ++i) r.pump();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  CHECK(r.tgt->queues() == 1);
  auto bytes = pattern(4096, 5);
  REQUIRE(::write(wfd, bytes.data(), bytes.size()) == 4096);
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  CHECK(r.target.controllers() == 0);
  CHECK(r.tgt->counters().queues_destroyed == 4);
  auto fin = r.tgt->report();
  REQUIRE(fin.size() == 4);
  for (const auto& q : fin) {
    CHECK(q.closed);
    CHECK(q.tid == (q.loop == 0 ? me : other));
  }
  REQUIRE(r.until([&] {
    return std::count_if(r.ev.begin(), r.ev.end(), [](const cm::Event& e) { return e.type == cm::EventType::Disconnected; }) == 4;
  }, 5));
  r.tgt.reset();  // joins loop 1's thread
  CHECK(!r.b.loop_threads_running());
  ::close(wfd);
  r.a.destroy_qp(adm.qp);
  for (auto& q : io) r.a.destroy_qp(q.qp);
}

TEST_CASE("nvmf rdma: counters through the control socket at run time, served by the poll loop",
          "[nvmf][rdma][control]") {
  TempDir dir;
  const std::string sock = dir.path + "/nvmf.sock";
  Rig r(tcfg());
  HostQueue adm, io;
  const uint16_t cntlid = r.bring_up(adm, io);
  rdma::ControlPort ctl(*r.tgt, sock, 500);
  auto io_cmd = [&](uint32_t lba) {
    Sqe rd = Rig::cmd(0x02, 1);
    rd.cdw10 = lba;
    rd.cdw12 = 7;
    r.keyed(rd, kDataOff, 4096);
    REQUIRE(r.run(io, rd).status.ok());
  };
  for (uint32_t i = 0; i < 5; ++i) io_cmd(i * 8);

  // A client on another thread; this thread keeps polling (and serving) until it has its answer.
  auto ask = [&](const control::json& args) {
    control::json result;
    std::string error;
    std::atomic<bool> done{false};
    std::thread th([&] {
      try {
        control::Client c(sock, 5000);
        result = c.call("nvmf", args);
      } catch (const std::exception& e) {
        error = e.what();
      }
      done = true;
    });
    const bool ok = r.until([&] {
      ctl.service();
      return done.load();
    });
    th.join();
    REQUIRE(ok);
    INFO(error);
    REQUIRE(error.empty());
    return result;
  };
  control::json j = ask(control::json::object());
  CHECK(j["target"]["accepted"] == 2);
  CHECK(j["target"]["live_queues"] == 2);
  REQUIRE(j["loops"].size() == 1);
  CHECK(j["loops"][0]["live_queues"] == 2);
  REQUIRE(j["queues"].size() == 2);
  const control::json* q1 = nullptr;
  for (const auto& q : j["queues"])
    if (q["qid"] == 1) q1 = &q;
  REQUIRE(q1);
  CHECK((*q1)["cntlid"] == cntlid);
  CHECK((*q1)["state"] == "live");
  CHECK((*q1)["commands"] == 1 + 5);  // Connect + 5 reads
  CHECK((*q1)["bytes_out"] == 5 * 4096);
  CHECK((*q1)["lat_n"] == 6);
  CHECK((*q1)["p50_us"].get<double>() > 0);
  CHECK((*q1)["max_us"].get<double>() >= (*q1)["p99_us"].get<double>());
  CHECK(!q1->contains("latency_hist"));

  // Live: three more reads show up in the next answer, with the histogram this time.
  for (uint32_t i = 0; i < 3; ++i) io_cmd(64 + i * 8);
  j = ask({{"histogram", true}});
  for (const auto& q : j["queues"]) {
    if (q["qid"] != 1) continue;
    CHECK(q["commands"] == 9);
    uint64_t n = 0;
    for (const auto& b : q["latency_hist"]) n += b[1].get<uint64_t>();
    CHECK(n == 9);
  }
  CHECK(ctl.snapshots() == 2);

  // A bad argument is an error answer; a loop that does not serve is a bounded error, not a hang.
  {
    std::string error;
    std::thread th([&] {
      try {
        control::Client c(sock, 5000);
        c.call("nvmf", {{"histogram", 3}});
      } catch (const control::RemoteError& e) {
        error = e.what();
      }
    });
    th.join();  // answered by the server thread itself
    CHECK_THAT(error, Catch::Contains("histogram"));
  }
  {
    std::string error;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread th([&] {
      try {
        control::Client c(sock, 5000);
        c.call("nvmf");
      } catch (const control::RemoteError& e) {
        error = e.what();
      }
    });
    th.join();  // nobody calls service(): the 500 ms answer timeout
    CHECK_THAT(error, Catch::Contains("did not answer"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  }
  ctl.service();  // the late request is served and dropped
  CHECK(ctl.server().counters().get(control::ControlCounter::requests) >= 4);

  r.tgt->disconnect_all();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }));
  r.a.destroy_qp(adm.qp);
  r.a.destroy_qp(io.qp);
}

TEST_CASE("nvmf rdma: keep-alive through the glue: kept alive while the host sends Keep Alive, dropped when it stops",
          "[nvmf][rdma][kato]") {
  Rig r(tcfg());
  HostQueue adm, io;
  const uint16_t cntlid = r.bring_up(adm, io, 200);  // KATO 200 ms: expires 300 ms after the last Keep Alive
  REQUIRE(r.tgt->queues() == 2);
  // 800 ms (4 x KATO) of Keep Alive every 100 ms: the controller stays.
  const auto t0 = std::chrono::steady_clock::now();
  auto next = t0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(800)) {
    if (std::chrono::steady_clock::now() >= next) {
      REQUIRE(r.run(adm, Rig::cmd(0x18)).status.ok());
      next += std::chrono::milliseconds(100);
    }
    r.pump();
  }
  CHECK(r.tgt->counters().keep_alive_expired == 0);
  CHECK(r.tgt->queues() == 2);
  REQUIRE(r.target.controller(cntlid) != nullptr);
  // The host goes quiet: within KATO x 1.5 + the 100 ms check the target drops the controller
  // and disconnects both queues; the host sees a DREQ on each.
  const auto quiet = std::chrono::steady_clock::now();
  REQUIRE(r.until([&] { return r.tgt->queues() == 0; }, 5));
  const auto took = std::chrono::steady_clock::now() - quiet;
  CHECK(took >= std::chrono::milliseconds(200));
  CHECK(took < std::chrono::seconds(2));
  CHECK(r.tgt->counters().keep_alive_expired == 1);
  CHECK(r.tgt->counters().disconnects_sent == 2);
  CHECK(r.target.controllers() == 0);
  REQUIRE(r.until([&] {
    return std::count_if(r.ev.begin(), r.ev.end(), [](const cm::Event& e) { return e.type == cm::EventType::Disconnected; }) == 2;
  }, 5));
  r.a.destroy_qp(adm.qp);
  r.a.destroy_qp(io.qp);
}

int main(int argc, char** argv) {
  std::unique_ptr<dpdk::Eal> eal;
  try {
    eal = std::make_unique<dpdk::Eal>(
        dpdk::EalOptions{.args = {"--no-pci", "--log-level=lib.eal:error"}, .program = "test_rdma_target"});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return Catch::Session().run(argc, argv);
}

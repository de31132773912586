// Capsules (lib/nvmf/capsule.cc): SQE/CQE byte layouts (include/linux/nvme.h),
// SGL descriptors as Linux's nvme-rdma host writes them, the data plan a
// target derives from a command, and the Fabrics commands.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "nvmf/capsule.h"

using namespace droce::nvmf;

namespace {
// A Read (opcode 0x02) as nvme-rdma sends it: flags 0x40 (SGL, PSDT 01b), cid
// 0x1234, nsid 1, keyed SGL with invalidate (addr 0x1122334455667788, length
// 0x001000, key 0xaabbccdd, type 0x4f), SLBA 0x10, NLB 7 (8 blocks).
std::array<uint8_t, 64> linux_read() {
  std::array<uint8_t, 64> b{};
  b[0] = 0x02; b[1] = 0x40; b[2] = 0x34; b[3] = 0x12; b[4] = 0x01;
  const uint8_t sgl[16] = {0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
                           0x00, 0x10, 0x00, 0xdd, 0xcc, 0xbb, 0xaa, 0x4f};
  std::memcpy(&b[24], sgl, 16);
  b[40] = 0x10;  // cdw10: SLBA low
  b[48] = 0x07;  // cdw12: NLB 0-based
  return b;
}
}  // namespace

TEST_CASE("SQE: a Linux read decodes field by field and re-encodes to the same bytes", "[nvmf][capsule]") {
  auto b = linux_read();
  Sqe s;
  decode_sqe(b, s);
  CHECK(s.opcode == 0x02);
  CHECK(s.flags == 0x40);
  CHECK(s.cid == 0x1234);
  CHECK(s.nsid == 1);
  CHECK(s.cdw10 == 0x10);
  CHECK(s.cdw12 == 7);
  Sgl g = s.sgl();
  CHECK(g.kind == SglKind::KeyedInvalidate);
  CHECK(g.addr == 0x1122334455667788ull);
  CHECK(g.length == 0x1000);
  CHECK(g.key == 0xaabbccddu);
  CHECK(data_direction(s) == DataDir::CtrlToHost);
  std::array<uint8_t, 64> out{};
  encode_sqe(out, s);
  CHECK(out == b);
}

TEST_CASE("SGL: keyed, keyed+invalidate, in-capsule offset, unsupported", "[nvmf][capsule]") {
  std::array<uint8_t, 16> d{};
  encode_sgl(d, Sgl{SglKind::Keyed, 0x1000, 0xabcdef, 0x01020304});
  CHECK(d[15] == 0x40);
  CHECK(d[8] == 0xef);
  CHECK(d[10] == 0xab);
  CHECK(d[11] == 0x04);
  CHECK(d[14] == 0x01);
  Sgl g = decode_sgl(d);
  CHECK(g.kind == SglKind::Keyed);
  CHECK(g.length == 0xabcdef);
  CHECK(g.key == 0x01020304);
  encode_sgl(d, Sgl{SglKind::KeyedInvalidate, 1, 2, 3});
  CHECK(d[15] == 0x4f);
  CHECK(decode_sgl(d).kind == SglKind::KeyedInvalidate);
  // In-capsule: nvme-rdma's nvme_rdma_map_sg_inline: address = offset (0 with
  // ICDOFF 0), length le32, type 0x01.
  encode_sgl(d, Sgl{SglKind::InCapsule, 0, 8192});
  CHECK(d == std::array<uint8_t, 16>{0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x20, 0, 0, 0, 0, 0, 0x01});
  CHECK(decode_sgl(d).kind == SglKind::InCapsule);
  CHECK(decode_sgl(d).length == 8192);
  for (uint8_t t : {0x00, 0x02, 0x30, 0x41, 0x50, 0x0f, 0xff}) {
    d[15] = t;
    CHECK(decode_sgl(d).kind == SglKind::Unsupported);
  }
}

TEST_CASE("CQE: result, SQ head/id, cid, status shifted over the phase bit", "[nvmf][capsule]") {
  Cqe c{0x0000000100000002ull, 5, 3, 0xbeef, sc::kConnectInvalidHost};
  std::array<uint8_t, 16> b{};
  encode_cqe(b, c);
  CHECK(b[0] == 2);
  CHECK(b[4] == 1);
  CHECK(b[8] == 5);
  CHECK(b[10] == 3);
  CHECK(b[12] == 0xef);
  CHECK(b[13] == 0xbe);
  // DNR(14) | SCT 1 (8) | SC 0x84, shifted left by one: 0x4184 << 1 = 0x8308.
  CHECK(b[14] == 0x08);
  CHECK(b[15] == 0x83);
  Cqe d;
  decode_cqe(b, d);
  CHECK(d == c);
  CHECK(d.status.sct() == Sct::CommandSpecific);
  CHECK(d.status.sc() == 0x84);
  CHECK(d.status.dnr());
  encode_cqe(b, Cqe{});
  CHECK(b[14] == 0);
  CHECK(b[15] == 0);
  CHECK(sc::kSuccess.ok());
  CHECK(!sc::kAbortReq.dnr());
}

TEST_CASE("data direction: opcode bits for NVMe, fctype bits for Fabrics", "[nvmf][capsule]") {
  Sqe s;
  s.opcode = 0x01;
  CHECK(data_direction(s) == DataDir::HostToCtrl);
  s.opcode = 0x00;
  CHECK(data_direction(s) == DataDir::None);
  s.opcode = 0x06;  // Identify
  CHECK(data_direction(s) == DataDir::CtrlToHost);
  s.opcode = 0x7f;
  s.nsid = 0x01;  // Connect
  CHECK(data_direction(s) == DataDir::HostToCtrl);
  s.nsid = 0x04;  // Property Get
  CHECK(data_direction(s) == DataDir::None);
}

TEST_CASE("data plan: where the data is, and every refusal", "[nvmf][capsule]") {
  DataPlan p;
  Sqe s;
  decode_sqe(linux_read(), s);
  REQUIRE(plan_data(s, 0, 131072, p) == sc::kSuccess);
  CHECK(p.where == DataPlan::RemoteKey);
  CHECK(p.length == 4096);
  CHECK(p.invalidate);
  CHECK(p.key == 0xaabbccddu);
  CHECK(plan_data(s, 0, 2048, p) == sc::kSglInvalidData);  // over MDTS
  Sqe bad = s;
  bad.flags = 0x00;  // PRP
  CHECK(plan_data(bad, 0, 131072, p) == sc::kInvalidField);
  bad.flags = 0x41;  // fused
  CHECK(plan_data(bad, 0, 131072, p) == sc::kInvalidField);
  bad = s;
  bad.dptr[15] = 0x02;  // segment descriptor
  CHECK(plan_data(bad, 0, 131072, p) == sc::kSglInvalidType);

  // A write with in-capsule data.
  Sqe w = s;
  w.opcode = 0x01;
  encode_sgl(w.dptr, Sgl{SglKind::InCapsule, 0, 512});
  REQUIRE(plan_data(w, 4096, 131072, p) == sc::kSuccess);
  CHECK(p.where == DataPlan::InCapsule);
  CHECK(p.offset == 0);
  CHECK(p.length == 512);
  CHECK(plan_data(w, 511, 131072, p) == sc::kSglInvalidData);
  encode_sgl(w.dptr, Sgl{SglKind::InCapsule, 4097, 1});
  CHECK(plan_data(w, 4096, 131072, p) == sc::kSglInvalidOffset);
  encode_sgl(w.dptr, Sgl{SglKind::InCapsule, 4000, 200});
  CHECK(plan_data(w, 4096, 131072, p) == sc::kSglInvalidData);
  // In-capsule data on a read makes no sense.
  Sqe r = s;
  encode_sgl(r.dptr, Sgl{SglKind::InCapsule, 0, 512});
  CHECK(plan_data(r, 4096, 131072, p) == sc::kInvalidField);
  // Null keyed SGL (nvme_rdma_set_sg_null): no data.
  Sqe n = s;
  n.opcode = 0x18;  // Keep Alive
  encode_sgl(n.dptr, Sgl{SglKind::Keyed, 0, 0, 0});
  REQUIRE(plan_data(n, 0, 131072, p) == sc::kSuccess);
  CHECK(p.where == DataPlan::NoData);
  // Data with a no-data command.
  encode_sgl(n.dptr, Sgl{SglKind::Keyed, 0x1000, 16, 1});
  CHECK(plan_data(n, 0, 131072, p) == sc::kInvalidField);
}

TEST_CASE("Connect: command fields at bytes 40-51 and the 1024-byte data", "[nvmf][capsule]") {
  Sqe s;
  encode_connect(s, ConnectCmd{0, 2, 127, 0, 5000});
  std::array<uint8_t, 64> b{};
  encode_sqe(b, s);
  CHECK(b[0] == 0x7f);
  CHECK(b[4] == 0x01);
  CHECK(b[42] == 2);
  CHECK(b[44] == 127);
  CHECK(b[48] == 0x88);  // 5000 = 0x1388
  CHECK(b[49] == 0x13);
  Sqe t;
  decode_sqe(b, t);
  ConnectCmd c = decode_connect(t);
  CHECK(c.qid == 2);
  CHECK(c.sqsize == 127);
  CHECK(c.kato_ms == 5000);

  ConnectData d;
  for (int i = 0; i < 16; ++i) d.hostid[i] = static_cast<uint8_t>(i);
  d.cntlid = 0xffff;
  d.subnqn = "nqn.2026-12.org.droce:ram0";
  d.hostnqn = "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427";
  std::array<uint8_t, 1024> data{};
  encode_connect_data(data, d);
  CHECK(data[15] == 15);
  CHECK(data[16] == 0xff);
  CHECK(std::memcmp(&data[256], "nqn.2026-12.org.droce:ram0", 27) == 0);
  CHECK(std::memcmp(&data[512], "nqn.2014-08", 11) == 0);
  ConnectData e;
  REQUIRE(decode_connect_data(data, e));
  CHECK(e.hostid == d.hostid);
  CHECK(e.cntlid == 0xffff);
  CHECK(e.subnqn == d.subnqn);
  CHECK(e.hostnqn == d.hostnqn);
  CHECK(!decode_connect_data(std::span<const uint8_t>(data).first(1023), e));
  std::memset(&data[512], 'a', 256);  // no NUL in the host NQN field
  CHECK(!decode_connect_data(data, e));
}

TEST_CASE("Property Get/Set: attrib size, offset, 64-bit value", "[nvmf][capsule]") {
  Sqe s;
  encode_property(s, FabricsType::PropertySet, PropertyCmd{false, 0x14, 0x00460001});
  std::array<uint8_t, 64> b{};
  encode_sqe(b, s);
  CHECK(b[4] == 0x00);
  CHECK(b[40] == 0);
  CHECK(b[44] == 0x14);
  CHECK(b[48] == 0x01);
  CHECK(b[50] == 0x46);
  encode_property(s, FabricsType::PropertyGet, PropertyCmd{true, 0x00, 0});
  encode_sqe(b, s);
  CHECK(b[4] == 0x04);
  CHECK(b[40] == 1);
  Sqe t;
  decode_sqe(b, t);
  PropertyCmd p = decode_property(t);
  CHECK(p.eight_bytes);
  CHECK(p.offset == 0);
}

TEST_CASE("spec helpers: CAP/CC fields, VS, NQN syntax", "[nvmf][capsule]") {
  uint64_t c = cap::make(127, false, 15);
  CHECK(cap::mqes(c) == 127);
  CHECK(cap::to(c) == 15);
  CHECK(cap::css(c) == 1);
  uint32_t v = 0x00460001;  // EN, IOSQES 6, IOCQES 4 (what Linux writes)
  CHECK(cc::iosqes(v) == 6);
  CHECK(cc::iocqes(v) == 4);
  CHECK(cc::shn(0x4000) == 1);
  CHECK(make_vs(1, 3) == 0x00010300);
  CHECK(valid_nqn("nqn.2026-12.org.droce:ram0"));
  CHECK(valid_nqn(kDiscoveryNqn));
  CHECK(!valid_nqn("nqn.26-12.org.droce"));
  CHECK(!valid_nqn("iqn.2026-12.org.droce"));
  CHECK(!valid_nqn("nqn.2026-12."));
  CHECK(!valid_nqn("nqn.2026-12.org droce"));
  CHECK(!valid_nqn(std::string(224, 'n')));
}

TEST_CASE("random capsules: decode, plan and re-encode never misbehave", "[nvmf][capsule]") {
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::array<uint8_t, 64> b;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (rng() % 2) b[1] = 0x40;
    Sqe s;
    decode_sqe(b, s);
    std::array<uint8_t, 64> o{};
    encode_sqe(o, s);
    REQUIRE(o == b);
    DataPlan p;
    size_t icd = rng() % 8193;
    if (plan_data(s, icd, 131072, p) == sc::kSuccess && p.where == DataPlan::InCapsule)
      REQUIRE(uint64_t{p.offset} + p.length <= icd);
    if (p.where == DataPlan::RemoteKey) REQUIRE(p.length <= 131072);
  }
}

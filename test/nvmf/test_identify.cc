// Identify pages and the discovery log (lib/nvmf/identify.cc): every field at
// the byte offset of Linux's struct nvme_id_ctrl / nvme_id_ns /
// nvmf_disc_rsp_page_{hdr,entry}; the namespace RAM disk.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "nvmf/identify.h"
#include "nvmf/le.h"
#include "nvmf/namespace.h"

using namespace droce::nvmf;

TEST_CASE("Identify Controller: the fields Linux's host reads, at their offsets", "[nvmf][identify]") {
  CtrlIdentity c;
  c.vid = 0x1b36;
  c.sn = "SN1";
  c.mn = "droce-nvmf";
  c.fr = "0.1";
  c.mdts = 5;
  c.cntlid = 0x0102;
  c.oaes = kOaesNsAttrChanged;
  c.kas = 1;
  c.maxcmd = 128;
  c.nn = 3;
  c.oncs = kOncsDsm | kOncsWriteZeroes;
  c.sgls = sgls::kSupported | sgls::kKeyed | sgls::kOffset;
  c.subnqn = "nqn.2026-12.org.droce:ram0";
  c.ioccsz = 516;
  std::array<uint8_t, 4096> p;
  p.fill(0xcc);
  build_identify_ctrl(p, c);
  const uint8_t* b = p.data();
  CHECK(le::get16(b + 0) == 0x1b36);
  CHECK(std::memcmp(b + 4, "SN1                 ", 20) == 0);   // space padded
  CHECK(std::memcmp(b + 24, "droce-nvmf", 10) == 0);
  CHECK(b[24 + 39] == ' ');
  CHECK(std::memcmp(b + 64, "0.1     ", 8) == 0);
  CHECK(b[77] == 5);
  CHECK(le::get16(b + 78) == 0x0102);
  CHECK(le::get32(b + 80) == 0x00010300);
  CHECK(le::get32(b + 92) == 0x100);
  CHECK(b[111] == 1);
  CHECK(b[259] == 3);
  CHECK(le::get16(b + 320) == 1);
  CHECK(b[512] == 0x66);
  CHECK(b[513] == 0x44);
  CHECK(le::get16(b + 514) == 128);
  CHECK(le::get32(b + 516) == 3);
  CHECK(le::get16(b + 520) == 0x0c);
  CHECK(le::get32(b + 536) == 0x100005);
  CHECK(std::memcmp(b + 768, "nqn.2026-12.org.droce:ram0", 27) == 0);
  CHECK(le::get32(b + 1792) == 516);
  CHECK(le::get32(b + 1796) == 1);
  CHECK(le::get16(b + 1800) == 0);
  CHECK(b[1803] == 1);
  CHECK(b[4095] == 0);  // everything else cleared
  CHECK(b[300] == 0);
}

TEST_CASE("Identify Namespace, active NS list, NS descriptors", "[nvmf][identify]") {
  std::array<uint8_t, 4096> p;
  NsIdentity n{1u << 21, 12, 0x09, {}};
  n.nguid[0] = 0xab;
  build_identify_ns(p, n);
  CHECK(le::get64(&p[0]) == (1u << 21));
  CHECK(le::get64(&p[8]) == (1u << 21));
  CHECK(le::get64(&p[16]) == (1u << 21));
  CHECK(p[25] == 0);  // NLBAF: one format
  CHECK(p[26] == 0);  // FLBAS: format 0
  CHECK(p[33] == 0x09);
  CHECK(p[104] == 0xab);
  CHECK(p[128 + 2] == 12);  // LBADS of format 0

  std::vector<uint32_t> ids = {1, 2, 7, 9};
  build_active_ns_list(p, ids, 0);
  CHECK(le::get32(&p[0]) == 1);
  CHECK(le::get32(&p[12]) == 9);
  CHECK(le::get32(&p[16]) == 0);
  build_active_ns_list(p, ids, 2);
  CHECK(le::get32(&p[0]) == 7);
  CHECK(le::get32(&p[8]) == 0);
  std::vector<uint32_t> many(2000);
  for (uint32_t i = 0; i < 2000; ++i) many[i] = i + 1;
  build_active_ns_list(p, many, 0);
  CHECK(le::get32(&p[4092]) == 1024);  // at most 1024 entries

  std::array<uint8_t, 16> g{}, u{};
  g.fill(0x11);
  u.fill(0x22);
  build_ns_desc_list(p, g, u);
  CHECK(p[0] == 0x02);  // NIDT NGUID
  CHECK(p[1] == 16);
  CHECK(p[4] == 0x11);
  CHECK(p[20] == 0x03);  // NIDT UUID
  CHECK(p[21] == 16);
  CHECK(p[24] == 0x22);
  CHECK(p[40] == 0x04);  // NIDT CSI
  CHECK(p[41] == 1);
  CHECK(p[44] == 0);     // NVM
  CHECK(p[45] == 0);     // end of list
}

TEST_CASE("discovery log: header, 1024-byte entries, RDMA TSAS", "[nvmf][identify]") {
  std::vector<DiscEntry> es(2);
  es[0].subnqn = "nqn.2026-12.org.droce:a";
  es[0].traddr = "10.0.0.1";
  es[1].subnqn = "nqn.2026-12.org.droce:b";
  es[1].traddr = "10.0.0.1";
  es[1].portid = 7;
  auto log = build_discovery_log(42, es);
  REQUIRE(log.size() == 3 * 1024);
  CHECK(le::get64(&log[0]) == 42);
  CHECK(le::get64(&log[8]) == 2);
  CHECK(le::get16(&log[16]) == 0);
  const uint8_t* e = &log[1024];
  CHECK(e[0] == 1);  // RDMA
  CHECK(e[1] == 1);  // IPv4
  CHECK(e[2] == 2);  // NVM subsystem
  CHECK(le::get16(e + 6) == 0xffff);
  CHECK(le::get16(e + 8) == 32);
  CHECK(std::memcmp(e + 32, "4420", 5) == 0);
  CHECK(std::memcmp(e + 256, "nqn.2026-12.org.droce:a", 24) == 0);
  CHECK(std::memcmp(e + 512, "10.0.0.1", 9) == 0);
  CHECK(e[768] == 1);  // connected
  CHECK(e[769] == 1);  // no provider type
  CHECK(e[770] == 1);  // RDMA CM
  DiscEntry d;
  REQUIRE(decode_disc_entry(std::span<const uint8_t>(log).subspan(2048), d));
  CHECK(d.subnqn == "nqn.2026-12.org.droce:b");
  CHECK(d.portid == 7);
  CHECK(d.trsvcid == "4420");
  CHECK(!decode_disc_entry(std::span<const uint8_t>(log).subspan(2049), d));
  CHECK(build_discovery_log(0, {}).size() == 1024);
}

TEST_CASE("namespace: RAM disk, identifiers, range checks, config errors", "[nvmf][identify]") {
  auto ns = Namespace::ram({1, 512, 1 << 20}, "nqn.2026-12.org.droce:a");
  CHECK(ns->blocks() == 2048);
  CHECK(ns->block_size() == 512);
  CHECK(ns->in_range(0, 2048));
  CHECK(ns->in_range(2047, 1));
  CHECK(!ns->in_range(2047, 2));
  CHECK(!ns->in_range(~0ull, 2));  // no overflow
  CHECK(!ns->in_range(0, 2049));
  std::vector<uint8_t> w(1024, 0x5a), r(1024, 0);
  ns->write(10, w);
  ns->read(10, r);
  CHECK(r == w);
  ns->zero(11, 1);
  ns->read(10, r);
  CHECK(r[0] == 0x5a);
  CHECK(r[512] == 0);
  CHECK((ns->uuid()[6] >> 4) == 4);  // version 4
  CHECK((ns->uuid()[8] >> 6) == 2);  // variant 1
  auto ns2 = Namespace::ram({2, 4096, 1 << 20}, "nqn.2026-12.org.droce:a");
  auto ns1b = Namespace::ram({1, 512, 1 << 20}, "nqn.2026-12.org.droce:a");
  CHECK(ns2->uuid() != ns->uuid());
  CHECK(ns1b->uuid() == ns->uuid());  // stable across restarts
  CHECK(ns2->nguid() != ns->nguid());
  CHECK(ns2->lba_shift() == 12);
  CHECK_THROWS_AS(Namespace::ram({0, 512, 4096}, "n"), std::invalid_argument);
  CHECK_THROWS_AS(Namespace::ram({1, 1024, 4096}, "n"), std::invalid_argument);
  CHECK_THROWS_AS(Namespace::ram({1, 512, 1000}, "n"), std::invalid_argument);
  CHECK_THROWS_AS(Namespace::ram({1, 512, 0}, "n"), std::invalid_argument);
}

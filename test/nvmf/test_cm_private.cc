// NVMe-RDMA CM private data (lib/nvmf/cm_private.cc): the bytes Linux's
// nvme-rdma host sends in the CM REQ (include/linux/nvme-rdma.h layouts), the
// checks that pick the reject status, and the REP/REJ the target answers.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <random>

#include "nvmf/cm_private.h"

using namespace droce::nvmf;

namespace {
// What Linux's host puts in the REQ of its admin queue: recfmt 0, qid 0,
// hrqsize 32, hsqsize 31 (le16 each), 24 reserved bytes.
constexpr std::array<uint8_t, 32> kLinuxAdminReq = {0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x1f, 0x00};
}  // namespace

TEST_CASE("CM request: Linux's admin-queue REQ decodes and is accepted", "[nvmf][cm]") {
  CmRequest r;
  REQUIRE(decode_cm_request(kLinuxAdminReq, CmLimits{}, r) == CmStatus::Ok);
  CHECK(r == CmRequest{0, 0, 32, 31});
  std::array<uint8_t, kCmRequestSize> out{};
  encode_cm_request(out, r);
  CHECK(out == kLinuxAdminReq);
}

TEST_CASE("CM request: an I/O queue of 128 entries, qid 3", "[nvmf][cm]") {
  std::array<uint8_t, kCmRequestSize> b{};
  encode_cm_request(b, CmRequest{0, 3, 128, 127});
  CHECK(b[2] == 3);
  CHECK(b[4] == 0x80);
  CHECK(b[6] == 0x7f);
  CmRequest r;
  CHECK(decode_cm_request(b, CmLimits{}, r) == CmStatus::Ok);
  CHECK(r.qid == 3);
  CHECK(r.hsqsize == 127);
}

TEST_CASE("CM request: each bad field gets its NVME_RDMA_CM_* reject status", "[nvmf][cm]") {
  CmLimits lim;  // qid <= 8, admin 32 entries, I/O 128
  CmRequest r;
  auto req = [](CmRequest x) {
    std::array<uint8_t, kCmRequestSize> b{};
    encode_cm_request(b, x);
    return b;
  };
  std::array<uint8_t, 7> shortb{};
  CHECK(decode_cm_request(shortb, lim, r) == CmStatus::InvalidLen);
  CHECK(decode_cm_request(req({1, 0, 32, 31}), lim, r) == CmStatus::InvalidRecfmt);
  CHECK(decode_cm_request(req({0, 9, 32, 31}), lim, r) == CmStatus::InvalidQid);
  CHECK(decode_cm_request(req({0, 8, 32, 31}), lim, r) == CmStatus::Ok);
  CHECK(decode_cm_request(req({0, 0, 32, 32}), lim, r) == CmStatus::InvalidHsqsize);   // 33 > admin 32
  CHECK(decode_cm_request(req({0, 1, 128, 128}), lim, r) == CmStatus::InvalidHsqsize);  // 129 > 128
  CHECK(decode_cm_request(req({0, 1, 2, 0}), lim, r) == CmStatus::InvalidHsqsize);      // I/O needs 2
  CHECK(decode_cm_request(req({0, 1, 2, 1}), lim, r) == CmStatus::Ok);
  CHECK(decode_cm_request(req({0, 1, 0, 1}), lim, r) == CmStatus::InvalidHrqsize);
  CHECK(decode_cm_request(req({0, 1, 129, 127}), lim, r) == CmStatus::InvalidHrqsize);
  CHECK(decode_cm_request(req({0, 0, 33, 31}), lim, r) == CmStatus::InvalidHrqsize);
  CHECK(decode_cm_request(req({0, 0xffff, 32, 31}), lim, r) == CmStatus::InvalidQid);
}

TEST_CASE("CM accept and reject: layouts of nvme_rdma_cm_rep / nvme_rdma_cm_rej", "[nvmf][cm]") {
  std::array<uint8_t, kCmAcceptSize> rep{};
  rep.fill(0xee);
  encode_cm_accept(rep, 128);
  std::array<uint8_t, kCmAcceptSize> want{0x00, 0x00, 0x80, 0x00};
  CHECK(rep == want);
  uint16_t recfmt = 9, crq = 0;
  REQUIRE(decode_cm_accept(rep, recfmt, crq));
  CHECK(recfmt == 0);
  CHECK(crq == 128);

  std::array<uint8_t, kCmRejectSize> rej{};
  encode_cm_reject(rej, CmStatus::InvalidHsqsize);
  CHECK(rej == std::array<uint8_t, 4>{0x00, 0x00, 0x04, 0x00});
  CmStatus s{};
  REQUIRE(decode_cm_reject(rej, recfmt, s));
  CHECK(s == CmStatus::InvalidHsqsize);
  CHECK(!decode_cm_reject(std::span<const uint8_t>(rej).first(3), recfmt, s));
  CHECK(std::string(cm_status_name(CmStatus::NoResources)) == "no resources");
}

TEST_CASE("CM request: random private data never crashes and Ok implies the limits", "[nvmf][cm]") {
  std::mt19937 rng(11);
  CmLimits lim{4, 32, 64};
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::array<uint8_t, kCmRequestSize> b{};
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    b[0] = rng() % 4 ? 0 : b[0];
    b[1] = rng() % 4 ? 0 : b[1];
    b[3] = 0;
    b[2] &= 7;
    b[5] = 0;
    b[7] = 0;
    CmRequest r;
    if (decode_cm_request(std::span<const uint8_t>(b).first(rng() % 33), lim, r) != CmStatus::Ok) continue;
    ++ok;
    REQUIRE(r.recfmt == 0);
    REQUIRE(r.qid <= 4);
    REQUIRE(r.hrqsize >= 1);
    REQUIRE(r.hrqsize <= (r.qid ? 64 : 32));
    REQUIRE(r.hsqsize + 1 <= (r.qid ? 64 : 32));
  }
  CHECK(ok > 50);
}

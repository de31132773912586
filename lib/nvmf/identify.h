// Data structures a target returns: Identify Controller / Namespace (4096-byte
// pages), the active namespace list, the namespace identification descriptor
// list, and the discovery log page. Byte offsets as NVMe Base 2.0 and Linux's
// struct nvme_id_ctrl / nvme_id_ns / nvmf_disc_rsp_page_{hdr,entry}.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nvmf/spec.h"

namespace droce::nvmf {

using Page = std::span<uint8_t, kIdentifySize>;

struct CtrlIdentity {
  uint16_t vid = 0, ssvid = 0;
  std::string sn, mn, fr;   // ASCII, space padded (20, 40, 8)
  uint8_t mdts = 0;         // 2^mdts * 4 KiB per command; 0: no limit
  uint16_t cntlid = 0;
  uint32_t ver = make_vs(1, 3);
  uint32_t oaes = 0;        // async events supported (bit 8: namespace attribute notices)
  uint8_t cntrltype = 1;    // 1 I/O controller, 2 discovery controller
  uint8_t aerl = 3;         // 0-based: outstanding AERs
  uint8_t lpa = 0;          // log page attributes (bit 2: extended data for Get Log Page)
  uint8_t elpe = 0;
  uint16_t kas = 0;         // keep-alive granularity, 100 ms units
  uint8_t sqes = 0x66, cqes = 0x44;  // 64-byte SQE, 16-byte CQE (max << 4 | min, log2)
  uint16_t maxcmd = 0;
  uint32_t nn = 0;          // largest NSID
  uint16_t oncs = 0;
  uint8_t vwc = 0;
  uint32_t sgls = 0;
  std::string subnqn;
  uint32_t ioccsz = 4;      // 16-byte units: SQE (4) + in-capsule data
  uint32_t iorcsz = 1;      // CQE
  uint16_t icdoff = 0;
  uint8_t msdbd = 1;        // SGL descriptors per command
};
void build_identify_ctrl(Page p, const CtrlIdentity& c) noexcept;

// Offsets Linux reads (for tests and for the host side of droce-nvmf-perf).
namespace idctrl {
constexpr size_t kVid = 0, kSn = 4, kMn = 24, kFr = 64, kMdts = 77, kCntlid = 78, kVer = 80,
                 kOaes = 92, kCntrltype = 111, kAerl = 259, kLpa = 261, kKas = 320, kSqes = 512,
                 kCqes = 513, kMaxcmd = 514, kNn = 516, kOncs = 520, kVwc = 525, kSgls = 536,
                 kSubnqn = 768, kIoccsz = 1792, kIorcsz = 1796, kIcdoff = 1800, kMsdbd = 1803;
}

struct NsIdentity {
  uint64_t blocks = 0;      // NSZE = NCAP = NUSE
  uint8_t lba_shift = 9;    // LBA format 0: data size 2^lba_shift
  uint8_t dlfeat = 0;       // bits 2:0 = 1 and bit 3: deallocated blocks read zeroes
  std::array<uint8_t, 16> nguid{};
  uint8_t nsattr = 0;       // bit 0: write protected (a read-only file; Linux then makes the disk read-only)
};
void build_identify_ns(Page p, const NsIdentity& n) noexcept;
namespace idns {
constexpr size_t kNsze = 0, kNcap = 8, kNuse = 16, kNsfeat = 24, kNlbaf = 25, kFlbas = 26, kDlfeat = 33, kNsattr = 99,
                 kNguid = 104, kEui64 = 120, kLbaf0 = 128;
}

// Active NSIDs greater than `after`, ascending, at most 1024 (CNS 02h).
void build_active_ns_list(Page p, std::span<const uint32_t> sorted_nsids, uint32_t after) noexcept;
// NGUID, UUID and CSI (NVM) descriptors, packed (CNS 03h).
void build_ns_desc_list(Page p, const std::array<uint8_t, 16>& nguid, const std::array<uint8_t, 16>& uuid) noexcept;

// ---- Discovery log page (Get Log Page 70h) ----
constexpr size_t kDiscHeaderSize = 1024, kDiscEntrySize = 1024;
struct DiscEntry {
  uint8_t trtype = disc::kTrtypeRdma;
  uint8_t adrfam = disc::kAdrfamIpv4;
  uint8_t subtype = disc::kSubtypeNvme;
  uint8_t treq = disc::kTreqNotSpecified;
  uint16_t portid = 1;
  uint16_t cntlid = kCntlidDynamic;
  uint16_t asqsz = 32;        // admin max SQ size
  std::string trsvcid = "4420";
  std::string subnqn;
  std::string traddr;
  uint8_t rdma_qptype = disc::kRdmaQptypeConnected;
  uint8_t rdma_prtype = disc::kRdmaPrtypeNotSpecified;
  uint8_t rdma_cms = disc::kRdmaCmsRdmaCm;
  uint16_t rdma_pkey = 0;
};
namespace disclog {
constexpr size_t kGenctr = 0, kNumrec = 8, kRecfmt = 16;
constexpr size_t kTrtype = 0, kAdrfam = 1, kSubtype = 2, kTreq = 3, kPortid = 4, kCntlid = 6, kAsqsz = 8,
                 kTrsvcid = 32, kSubnqn = 256, kTraddr = 512, kTsas = 768;
}
// The whole log: header (genctr, numrec, recfmt 0) + one entry per subsystem.
std::vector<uint8_t> build_discovery_log(uint64_t genctr, std::span<const DiscEntry> entries);
bool decode_disc_entry(std::span<const uint8_t> e, DiscEntry& out);

}  // namespace droce::nvmf

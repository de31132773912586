#include "nvmf/identify.h"

#include <algorithm>
#include <cstring>

#include "nvmf/le.h"

namespace droce::nvmf {

void build_identify_ctrl(Page p, const CtrlIdentity& c) noexcept {
  std::fill(p.begin(), p.end(), 0);
  uint8_t* b = p.data();
  le::put16(b + idctrl::kVid, c.vid);
  le::put16(b + 2, c.ssvid);
  le::put_str(b + idctrl::kSn, 20, c.sn, ' ');
  le::put_str(b + idctrl::kMn, 40, c.mn, ' ');
  le::put_str(b + idctrl::kFr, 8, c.fr, ' ');
  b[idctrl::kMdts] = c.mdts;
  le::put16(b + idctrl::kCntlid, c.cntlid);
  le::put32(b + idctrl::kVer, c.ver);
  le::put32(b + idctrl::kOaes, c.oaes);
  b[idctrl::kCntrltype] = c.cntrltype;
  b[idctrl::kAerl] = c.aerl;
  b[idctrl::kLpa] = c.lpa;
  b[262] = c.elpe;
  le::put16(b + idctrl::kKas, c.kas);
  b[idctrl::kSqes] = c.sqes;
  b[idctrl::kCqes] = c.cqes;
  le::put16(b + idctrl::kMaxcmd, c.maxcmd);
  le::put32(b + idctrl::kNn, c.nn);
  le::put16(b + idctrl::kOncs, c.oncs);
  b[idctrl::kVwc] = c.vwc;
  le::put32(b + idctrl::kSgls, c.sgls);
  le::put_str(b + idctrl::kSubnqn, kNqnFieldSize - 1, c.subnqn);
  le::put32(b + idctrl::kIoccsz, c.ioccsz);
  le::put32(b + idctrl::kIorcsz, c.iorcsz);
  le::put16(b + idctrl::kIcdoff, c.icdoff);
  b[idctrl::kMsdbd] = c.msdbd;
  // Power state 0 (psd at 2048): max power left 0, "not reported".
}

void build_identify_ns(Page p, const NsIdentity& n) noexcept {
  std::fill(p.begin(), p.end(), 0);
  uint8_t* b = p.data();
  le::put64(b + idns::kNsze, n.blocks);
  le::put64(b + idns::kNcap, n.blocks);
  le::put64(b + idns::kNuse, n.blocks);
  b[idns::kNlbaf] = 0;  // one LBA format (0-based)
  b[idns::kFlbas] = 0;
  b[idns::kDlfeat] = n.dlfeat;
  b[idns::kNsattr] = n.nsattr;
  std::memcpy(b + idns::kNguid, n.nguid.data(), 16);
  // LBA format 0: MS 0 (le16), LBADS (byte 2), RP 0 (best).
  b[idns::kLbaf0 + 2] = n.lba_shift;
}

void build_active_ns_list(Page p, std::span<const uint32_t> nsids, uint32_t after) noexcept {
  std::fill(p.begin(), p.end(), 0);
  size_t k = 0;
  for (uint32_t id : nsids) {
    if (id <= after) continue;
    if (k == kIdentifySize / 4) break;
    le::put32(p.data() + 4 * k++, id);
  }
}

void build_ns_desc_list(Page p, const std::array<uint8_t, 16>& nguid, const std::array<uint8_t, 16>& uuid) noexcept {
  std::fill(p.begin(), p.end(), 0);
  uint8_t* b = p.data();
  size_t o = 0;
  b[o] = static_cast<uint8_t>(Nidt::Nguid);
  b[o + 1] = 16;
  std::memcpy(b + o + 4, nguid.data(), 16);
  o += 20;
  b[o] = static_cast<uint8_t>(Nidt::Uuid);
  b[o + 1] = 16;
  std::memcpy(b + o + 4, uuid.data(), 16);
  o += 20;
  b[o] = static_cast<uint8_t>(Nidt::Csi);
  b[o + 1] = 1;
  b[o + 4] = 0;  // NVM command set
}

std::vector<uint8_t> build_discovery_log(uint64_t genctr, std::span<const DiscEntry> entries) {
  std::vector<uint8_t> v(kDiscHeaderSize + kDiscEntrySize * entries.size(), 0);
  le::put64(&v[disclog::kGenctr], genctr);
  le::put64(&v[disclog::kNumrec], entries.size());
  le::put16(&v[disclog::kRecfmt], 0);
  for (size_t i = 0; i < entries.size(); ++i) {
    const DiscEntry& e = entries[i];
    uint8_t* b = &v[kDiscHeaderSize + i * kDiscEntrySize];
    b[disclog::kTrtype] = e.trtype;
    b[disclog::kAdrfam] = e.adrfam;
    b[disclog::kSubtype] = e.subtype;
    b[disclog::kTreq] = e.treq;
    le::put16(b + disclog::kPortid, e.portid);
    le::put16(b + disclog::kCntlid, e.cntlid);
    le::put16(b + disclog::kAsqsz, e.asqsz);
    le::put_str(b + disclog::kTrsvcid, 32, e.trsvcid);  // NUL padded, as nvmet fills it
    le::put_str(b + disclog::kSubnqn, kNqnFieldSize - 1, e.subnqn);
    le::put_str(b + disclog::kTraddr, 256, e.traddr);
    b[disclog::kTsas + 0] = e.rdma_qptype;
    b[disclog::kTsas + 1] = e.rdma_prtype;
    b[disclog::kTsas + 2] = e.rdma_cms;
    le::put16(b + disclog::kTsas + 8, e.rdma_pkey);
  }
  return v;
}

bool decode_disc_entry(std::span<const uint8_t> e, DiscEntry& o) {
  if (e.size() < kDiscEntrySize) return false;
  const uint8_t* b = e.data();
  o.trtype = b[disclog::kTrtype];
  o.adrfam = b[disclog::kAdrfam];
  o.subtype = b[disclog::kSubtype];
  o.treq = b[disclog::kTreq];
  o.portid = le::get16(b + disclog::kPortid);
  o.cntlid = le::get16(b + disclog::kCntlid);
  o.asqsz = le::get16(b + disclog::kAsqsz);
  o.trsvcid = std::string(le::get_str(b + disclog::kTrsvcid, 32));
  o.subnqn = std::string(le::get_str(b + disclog::kSubnqn, kNqnFieldSize));
  o.traddr = std::string(le::get_str(b + disclog::kTraddr, 256));
  o.rdma_qptype = b[disclog::kTsas];
  o.rdma_prtype = b[disclog::kTsas + 1];
  o.rdma_cms = b[disclog::kTsas + 2];
  o.rdma_pkey = le::get16(b + disclog::kTsas + 8);
  return true;
}

}  // namespace droce::nvmf

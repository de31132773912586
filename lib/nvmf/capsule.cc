#include "nvmf/capsule.h"

#include <algorithm>
#include <cstring>

#include "nvmf/le.h"

namespace droce::nvmf {

Sgl decode_sgl(std::span<const uint8_t, kSglDescSize> d) noexcept {
  Sgl s;
  s.type = d[15];
  s.addr = le::get64(&d[0]);
  uint8_t type = s.type >> 4, sub = s.type & 0xf;
  if (type == sgl::kKeyedDataBlock && (sub == sgl::kSubAddress || sub == sgl::kSubInvalidate)) {
    s.kind = sub == sgl::kSubAddress ? SglKind::Keyed : SglKind::KeyedInvalidate;
    s.length = le::get24(&d[8]);
    s.key = le::get32(&d[11]);
  } else if (type == sgl::kDataBlock && sub == sgl::kSubOffset) {
    s.kind = SglKind::InCapsule;
    s.length = le::get32(&d[8]);
  } else {
    s.kind = SglKind::Unsupported;
    s.length = le::get32(&d[8]);
  }
  return s;
}

void encode_sgl(std::span<uint8_t, kSglDescSize> d, const Sgl& s) noexcept {
  std::fill(d.begin(), d.end(), 0);
  le::put64(&d[0], s.addr);
  switch (s.kind) {
    case SglKind::Keyed:
    case SglKind::KeyedInvalidate:
      le::put24(&d[8], s.length);
      le::put32(&d[11], s.key);
      d[15] = s.kind == SglKind::Keyed ? sgl::kKeyedAddr : sgl::kKeyedInvalidate;
      break;
    case SglKind::InCapsule:
      le::put32(&d[8], s.length);
      d[15] = sgl::kInCapsule;
      break;
    case SglKind::Unsupported:
      le::put32(&d[8], s.length);
      d[15] = s.type;
      break;
  }
}

void decode_sqe(std::span<const uint8_t, kSqeSize> b, Sqe& s) noexcept {
  s.opcode = b[0];
  s.flags = b[1];
  s.cid = le::get16(&b[2]);
  s.nsid = le::get32(&b[4]);
  s.cdw2 = le::get32(&b[8]);
  s.cdw3 = le::get32(&b[12]);
  s.mptr = le::get64(&b[16]);
  std::memcpy(s.dptr.data(), &b[24], kSglDescSize);
  s.cdw10 = le::get32(&b[40]);
  s.cdw11 = le::get32(&b[44]);
  s.cdw12 = le::get32(&b[48]);
  s.cdw13 = le::get32(&b[52]);
  s.cdw14 = le::get32(&b[56]);
  s.cdw15 = le::get32(&b[60]);
}

void encode_sqe(std::span<uint8_t, kSqeSize> b, const Sqe& s) noexcept {
  b[0] = s.opcode;
  b[1] = s.flags;
  le::put16(&b[2], s.cid);
  le::put32(&b[4], s.nsid);
  le::put32(&b[8], s.cdw2);
  le::put32(&b[12], s.cdw3);
  le::put64(&b[16], s.mptr);
  std::memcpy(&b[24], s.dptr.data(), kSglDescSize);
  le::put32(&b[40], s.cdw10);
  le::put32(&b[44], s.cdw11);
  le::put32(&b[48], s.cdw12);
  le::put32(&b[52], s.cdw13);
  le::put32(&b[56], s.cdw14);
  le::put32(&b[60], s.cdw15);
}

void encode_cqe(std::span<uint8_t, kCqeSize> b, const Cqe& c) noexcept {
  le::put64(&b[0], c.result);
  le::put16(&b[8], c.sq_head);
  le::put16(&b[10], c.sq_id);
  le::put16(&b[12], c.cid);
  le::put16(&b[14], static_cast<uint16_t>(c.status.value << 1));  // phase 0: fabrics ignore it
}

void decode_cqe(std::span<const uint8_t, kCqeSize> b, Cqe& c) noexcept {
  c.result = le::get64(&b[0]);
  c.sq_head = le::get16(&b[8]);
  c.sq_id = le::get16(&b[10]);
  c.cid = le::get16(&b[12]);
  c.status.value = le::get16(&b[14]) >> 1;
}

DataDir data_direction(const Sqe& s) noexcept {
  uint8_t bits = s.opcode == static_cast<uint8_t>(AdminOp::Fabrics) ? s.fctype() : s.opcode;
  return static_cast<DataDir>(bits & 3);
}

Status plan_data(const Sqe& s, size_t in_capsule_len, uint32_t max_len, DataPlan& p) noexcept {
  p = DataPlan{};
  // NVMe-oF: SGLs only (PSDT 01b, the host's NVME_CMD_SGL_METABUF), no fused commands.
  if ((s.flags & kPsdtSglMask) != 0x40 || (s.flags & 3) != 0) return sc::kInvalidField;
  DataDir dir = data_direction(s);
  Sgl g = s.sgl();
  switch (g.kind) {
    case SglKind::Unsupported:
      return sc::kSglInvalidType;
    case SglKind::InCapsule:
      if (g.length == 0) return sc::kSuccess;
      if (dir != DataDir::HostToCtrl) return sc::kInvalidField;
      if (g.addr > in_capsule_len) return sc::kSglInvalidOffset;
      if (g.length > in_capsule_len - g.addr) return sc::kSglInvalidData;
      p.where = DataPlan::InCapsule;
      p.offset = static_cast<uint32_t>(g.addr);
      p.length = g.length;
      return sc::kSuccess;
    case SglKind::Keyed:
    case SglKind::KeyedInvalidate:
      p.invalidate = g.kind == SglKind::KeyedInvalidate;
      p.key = g.key;
      if (g.length == 0) return sc::kSuccess;
      if (dir == DataDir::None || dir == DataDir::Bidir) return sc::kInvalidField;
      if (g.length > max_len) return sc::kSglInvalidData;
      p.where = DataPlan::RemoteKey;
      p.addr = g.addr;
      p.length = g.length;
      return sc::kSuccess;
  }
  return sc::kSglInvalidType;
}

ConnectCmd decode_connect(const Sqe& s) noexcept {
  ConnectCmd c;
  c.recfmt = static_cast<uint16_t>(s.cdw10);
  c.qid = static_cast<uint16_t>(s.cdw10 >> 16);
  c.sqsize = static_cast<uint16_t>(s.cdw11);
  c.cattr = static_cast<uint8_t>(s.cdw11 >> 16);
  c.kato_ms = s.cdw12;
  return c;
}

void encode_connect(Sqe& s, const ConnectCmd& c) noexcept {
  s.opcode = static_cast<uint8_t>(AdminOp::Fabrics);
  s.nsid = static_cast<uint8_t>(FabricsType::Connect);
  s.cdw10 = c.recfmt | (uint32_t{c.qid} << 16);
  s.cdw11 = c.sqsize | (uint32_t{c.cattr} << 16);
  s.cdw12 = c.kato_ms;
}

bool decode_connect_data(std::span<const uint8_t> b, ConnectData& d) {
  if (b.size() < kConnectDataSize) return false;
  if (!std::memchr(&b[256], 0, kNqnFieldSize) || !std::memchr(&b[512], 0, kNqnFieldSize)) return false;
  std::memcpy(d.hostid.data(), &b[0], 16);
  d.cntlid = le::get16(&b[16]);
  d.subnqn = std::string(le::get_str(&b[256], kNqnFieldSize));
  d.hostnqn = std::string(le::get_str(&b[512], kNqnFieldSize));
  return true;
}

void encode_connect_data(std::span<uint8_t, kConnectDataSize> b, const ConnectData& d) noexcept {
  std::fill(b.begin(), b.end(), 0);
  std::memcpy(&b[0], d.hostid.data(), 16);
  le::put16(&b[16], d.cntlid);
  le::put_str(&b[256], kNqnFieldSize - 1, d.subnqn);
  le::put_str(&b[512], kNqnFieldSize - 1, d.hostnqn);
}

PropertyCmd decode_property(const Sqe& s) noexcept {
  PropertyCmd p;
  p.eight_bytes = (s.cdw10 & 7) == 1;
  p.offset = s.cdw11;
  p.value = s.cdw12 | (uint64_t{s.cdw13} << 32);
  return p;
}

void encode_property(Sqe& s, FabricsType t, const PropertyCmd& p) noexcept {
  s.opcode = static_cast<uint8_t>(AdminOp::Fabrics);
  s.nsid = static_cast<uint8_t>(t);
  s.cdw10 = p.eight_bytes ? 1 : 0;
  s.cdw11 = p.offset;
  s.cdw12 = static_cast<uint32_t>(p.value);
  s.cdw13 = static_cast<uint32_t>(p.value >> 32);
}

bool valid_nqn(std::string_view n) noexcept {
  if (n.empty() || n.size() > kNqnMaxLen) return false;
  for (char c : n)
    if (c < 0x21 || c > 0x7e) return false;
  if (n == kDiscoveryNqn) return true;
  // nqn.yyyy-mm.<reverse domain>
  if (n.size() < 12 || n.substr(0, 4) != "nqn.") return false;
  for (size_t i : {4, 5, 6, 7, 9, 10})
    if (n[i] < '0' || n[i] > '9') return false;
  return n[8] == '-' && n[11] == '.' && n.size() > 12;
}

}  // namespace droce::nvmf

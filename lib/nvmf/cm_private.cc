#include "nvmf/cm_private.h"

#include <algorithm>

#include "nvmf/le.h"

namespace droce::nvmf {

const char* cm_status_name(CmStatus s) noexcept {
  switch (s) {
    case CmStatus::Ok: return "ok";
    case CmStatus::InvalidLen: return "invalid length";
    case CmStatus::InvalidRecfmt: return "invalid record format";
    case CmStatus::InvalidQid: return "invalid queue ID";
    case CmStatus::InvalidHsqsize: return "invalid host SQ size";
    case CmStatus::InvalidHrqsize: return "invalid host RQ size";
    case CmStatus::NoResources: return "no resources";
    case CmStatus::InvalidIrd: return "invalid IRD";
    case CmStatus::InvalidOrd: return "invalid ORD";
  }
  return "unknown";
}

CmStatus decode_cm_request(std::span<const uint8_t> p, const CmLimits& lim, CmRequest& r) noexcept {
  // Linux's host sends the whole 32-byte structure; the fields are in the first 8.
  if (p.size() < 8) return CmStatus::InvalidLen;
  r.recfmt = le::get16(&p[0]);
  r.qid = le::get16(&p[2]);
  r.hrqsize = le::get16(&p[4]);
  r.hsqsize = le::get16(&p[6]);
  if (r.recfmt != kCmRecfmt) return CmStatus::InvalidRecfmt;
  if (r.qid > lim.max_qid) return CmStatus::InvalidQid;
  uint32_t depth = r.qid == 0 ? lim.max_admin_depth : lim.max_io_depth;
  uint32_t min = r.qid == 0 ? 1 : 2;
  if (uint32_t{r.hsqsize} + 1 < min || uint32_t{r.hsqsize} + 1 > depth) return CmStatus::InvalidHsqsize;
  if (r.hrqsize < min || r.hrqsize > depth) return CmStatus::InvalidHrqsize;
  return CmStatus::Ok;
}

void encode_cm_request(std::span<uint8_t, kCmRequestSize> out, const CmRequest& r) noexcept {
  std::fill(out.begin(), out.end(), 0);
  le::put16(&out[0], r.recfmt);
  le::put16(&out[2], r.qid);
  le::put16(&out[4], r.hrqsize);
  le::put16(&out[6], r.hsqsize);
}

void encode_cm_accept(std::span<uint8_t, kCmAcceptSize> out, uint16_t crqsize) noexcept {
  std::fill(out.begin(), out.end(), 0);
  le::put16(&out[0], kCmRecfmt);
  le::put16(&out[2], crqsize);
}

bool decode_cm_accept(std::span<const uint8_t> p, uint16_t& recfmt, uint16_t& crqsize) noexcept {
  if (p.size() < 4) return false;
  recfmt = le::get16(&p[0]);
  crqsize = le::get16(&p[2]);
  return true;
}

void encode_cm_reject(std::span<uint8_t, kCmRejectSize> out, CmStatus s) noexcept {
  le::put16(&out[0], kCmRecfmt);
  le::put16(&out[2], static_cast<uint16_t>(s));
}

bool decode_cm_reject(std::span<const uint8_t> p, uint16_t& recfmt, CmStatus& s) noexcept {
  if (p.size() < kCmRejectSize) return false;
  recfmt = le::get16(&p[0]);
  s = static_cast<CmStatus>(le::get16(&p[2]));
  return true;
}

}  // namespace droce::nvmf

// NVMe-RDMA CM private data (NVMe RDMA transport binding; Linux
// include/linux/nvme-rdma.h): what the host puts in the CM REQ, what the
// target answers in the REP or REJ. Pure code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace droce::nvmf {

constexpr size_t kCmRequestSize = 32;  // recfmt, qid, hrqsize, hsqsize, 24 reserved
constexpr size_t kCmAcceptSize = 32;   // recfmt, crqsize, 28 reserved
constexpr size_t kCmRejectSize = 4;    // recfmt, status
constexpr uint16_t kCmRecfmt = 0;      // NVME_RDMA_CM_FMT_1_0

enum class CmStatus : uint16_t {
  Ok = 0,
  InvalidLen = 0x01, InvalidRecfmt = 0x02, InvalidQid = 0x03, InvalidHsqsize = 0x04,
  InvalidHrqsize = 0x05, NoResources = 0x06, InvalidIrd = 0x07, InvalidOrd = 0x08,
};
const char* cm_status_name(CmStatus s) noexcept;

struct CmRequest {
  uint16_t recfmt = kCmRecfmt;
  uint16_t qid = 0;
  uint16_t hrqsize = 0;  // host receive queue size (entries, not 0-based)
  uint16_t hsqsize = 0;  // host send queue size, 0-based (Linux: queue size - 1)
  friend bool operator==(const CmRequest&, const CmRequest&) = default;
};

// What the target accepts: queue limits of its config.
struct CmLimits {
  uint16_t max_qid = 8;              // highest I/O queue id
  uint16_t max_admin_depth = 32;     // entries of the admin queue (hsqsize + 1)
  uint16_t max_io_depth = 128;       // entries of an I/O queue
};

// Decodes the private data of a CM REQ (the part after the RDMA CM header).
// Returns Ok and fills r, or the status to reject with: short data
// (InvalidLen), recfmt != 0, qid above the limit, hsqsize+1 or hrqsize outside
// 1..depth (an I/O queue needs at least 2 entries, as Linux checks).
CmStatus decode_cm_request(std::span<const uint8_t> pdata, const CmLimits& lim, CmRequest& r) noexcept;
void encode_cm_request(std::span<uint8_t, kCmRequestSize> out, const CmRequest& r) noexcept;

// The REP's private data: crqsize = entries of the controller's receive queue.
void encode_cm_accept(std::span<uint8_t, kCmAcceptSize> out, uint16_t crqsize) noexcept;
bool decode_cm_accept(std::span<const uint8_t> pdata, uint16_t& recfmt, uint16_t& crqsize) noexcept;
void encode_cm_reject(std::span<uint8_t, kCmRejectSize> out, CmStatus s) noexcept;
bool decode_cm_reject(std::span<const uint8_t> pdata, uint16_t& recfmt, CmStatus& s) noexcept;

}  // namespace droce::nvmf

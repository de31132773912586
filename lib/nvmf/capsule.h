// NVMe-oF capsules on RDMA: the 64-byte SQE (command capsule, in-capsule data
// after it), the 16-byte CQE (response capsule), SGL descriptors, and the
// Fabrics commands (Connect and its 1024-byte data, Property Get/Set). Pure
// code on byte buffers; every decoder checks its input size.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "nvmf/spec.h"

namespace droce::nvmf {

// SGL descriptor (16 bytes). Keyed data block (type 0x4): address le64, length
// 24 bits, key le32; subtype 0x0 address, 0xF the host asks the target to
// invalidate the key (SEND with Invalidate). Data block (type 0x0) subtype 0x1:
// address = offset into the in-capsule data, length le32.
enum class SglKind : uint8_t { Keyed, KeyedInvalidate, InCapsule, Unsupported };
struct Sgl {
  SglKind kind = SglKind::Keyed;
  uint64_t addr = 0;   // host address (keyed) or offset (in-capsule)
  uint32_t length = 0;
  uint32_t key = 0;    // keyed only
  uint8_t type = 0;    // the raw type byte
  friend bool operator==(const Sgl&, const Sgl&) = default;
};
Sgl decode_sgl(std::span<const uint8_t, kSglDescSize> d) noexcept;
void encode_sgl(std::span<uint8_t, kSglDescSize> d, const Sgl& s) noexcept;

// Submission queue entry, the dwords a target looks at.
struct Sqe {
  uint8_t opcode = 0;
  uint8_t flags = 0;     // FUSE bits 1:0, PSDT bits 7:6
  uint16_t cid = 0;
  uint32_t nsid = 0;
  uint32_t cdw2 = 0, cdw3 = 0;
  uint64_t mptr = 0;
  std::array<uint8_t, kSglDescSize> dptr{};  // SGL1
  uint32_t cdw10 = 0, cdw11 = 0, cdw12 = 0, cdw13 = 0, cdw14 = 0, cdw15 = 0;
  uint8_t fctype() const noexcept { return static_cast<uint8_t>(nsid & 0xff); }  // byte 4 of a Fabrics command
  Sgl sgl() const noexcept { return decode_sgl(dptr); }
  friend bool operator==(const Sqe&, const Sqe&) = default;
};
void decode_sqe(std::span<const uint8_t, kSqeSize> b, Sqe& s) noexcept;
void encode_sqe(std::span<uint8_t, kSqeSize> b, const Sqe& s) noexcept;

// Completion queue entry.
struct Cqe {
  uint64_t result = 0;  // DW0 (and DW1: Property Get of an 8-byte property)
  uint16_t sq_head = 0;
  uint16_t sq_id = 0;
  uint16_t cid = 0;
  Status status;
  friend bool operator==(const Cqe&, const Cqe&) = default;
};
void encode_cqe(std::span<uint8_t, kCqeSize> b, const Cqe& c) noexcept;
void decode_cqe(std::span<const uint8_t, kCqeSize> b, Cqe& c) noexcept;

// Direction of a command's data (NVMe: opcode bits 1:0; Fabrics: fctype bits 1:0).
enum class DataDir : uint8_t { None, HostToCtrl, CtrlToHost, Bidir };
DataDir data_direction(const Sqe& s) noexcept;

// Checks that a command capsule's SGL fits what the transport supports and
// returns where its data is. in_capsule is the data after the SQE that came
// with the SEND. Errors: SGL type (data SGLs must be SGL1 with PSDT != 0),
// in-capsule offset/length beyond the received data, a keyed SGL longer than
// max_len, in-capsule data with a controller-to-host command.
struct DataPlan {
  enum Where : uint8_t { NoData, InCapsule, RemoteKey } where = NoData;
  uint32_t length = 0;
  uint32_t offset = 0;      // InCapsule: into the in-capsule data
  uint64_t addr = 0;        // RemoteKey
  uint32_t key = 0;
  bool invalidate = false;  // answer with SEND with Invalidate of key
};
Status plan_data(const Sqe& s, size_t in_capsule_len, uint32_t max_len, DataPlan& p) noexcept;

// ---- Fabrics commands ----
struct ConnectCmd {
  uint16_t recfmt = 0;
  uint16_t qid = 0;
  uint16_t sqsize = 0;  // 0-based
  uint8_t cattr = 0;
  uint32_t kato_ms = 0;
};
ConnectCmd decode_connect(const Sqe& s) noexcept;
void encode_connect(Sqe& s, const ConnectCmd& c) noexcept;

struct ConnectData {
  std::array<uint8_t, 16> hostid{};
  uint16_t cntlid = kCntlidDynamic;
  std::string subnqn;
  std::string hostnqn;
};
// False if the buffer is short or an NQN field has no NUL within its 256 bytes.
bool decode_connect_data(std::span<const uint8_t> b, ConnectData& d);
void encode_connect_data(std::span<uint8_t, kConnectDataSize> b, const ConnectData& d) noexcept;

// Property Get/Set: attrib bits 2:0 size (0: 4 bytes, 1: 8 bytes), offset, value.
struct PropertyCmd {
  bool eight_bytes = false;
  uint32_t offset = 0;
  uint64_t value = 0;  // Set only
};
PropertyCmd decode_property(const Sqe& s) noexcept;
void encode_property(Sqe& s, FabricsType t, const PropertyCmd& p) noexcept;

// Connect's response DW0 when it fails with "invalid parameters": IATTR (bit 16:
// 1 = the parameter is in the data) and IPO (bits 15:0, its byte offset).
constexpr uint32_t connect_invalid_param(bool in_data, uint16_t offset) noexcept {
  return (uint32_t{in_data} << 16) | offset;
}
// Offsets of the Connect command and data fields (for IPO).
constexpr uint16_t kConnectOffQid = 42, kConnectOffSqsize = 44;
constexpr uint16_t kConnectDataOffCntlid = 16, kConnectDataOffSubnqn = 256, kConnectDataOffHostnqn = 512;

// NQN syntax: "nqn.yyyy-mm.reverse-domain[:anything]" up to 223 bytes
// (or the discovery NQN); only printable ASCII.
bool valid_nqn(std::string_view nqn) noexcept;

}  // namespace droce::nvmf

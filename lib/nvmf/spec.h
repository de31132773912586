// NVMe / NVMe-oF constants a target needs (NVMe Base 2.0, NVMe-oF 1.1, the
// RDMA transport binding; values as Linux's include/linux/nvme.h has them).
#pragma once

#include <cstddef>
#include <cstdint>

namespace droce::nvmf {

constexpr size_t kSqeSize = 64;
constexpr size_t kCqeSize = 16;
constexpr size_t kSglDescSize = 16;
constexpr size_t kIdentifySize = 4096;
constexpr size_t kConnectDataSize = 1024;
constexpr size_t kNqnFieldSize = 256;
constexpr size_t kNqnMaxLen = 223;  // NQN length without the terminating NUL
constexpr uint16_t kRdmaPort = 4420;
constexpr uint16_t kMaxQueueSize = 128;  // NVME_RDMA_MAX_QUEUE_SIZE
constexpr uint16_t kCntlidDynamic = 0xffff;
constexpr uint16_t kCntlidMin = 1, kCntlidMax = 0xffef;
constexpr const char* kDiscoveryNqn = "nqn.2014-08.org.nvmexpress.discovery";

// Admin command opcodes.
enum class AdminOp : uint8_t {
  DeleteSq = 0x00, CreateSq = 0x01, GetLogPage = 0x02, DeleteCq = 0x04, CreateCq = 0x05,
  Identify = 0x06, Abort = 0x08, SetFeatures = 0x09, GetFeatures = 0x0a, AsyncEvent = 0x0c,
  KeepAlive = 0x18, Fabrics = 0x7f,
};
// NVM command set opcodes.
enum class IoOp : uint8_t {
  Flush = 0x00, Write = 0x01, Read = 0x02, WriteUncorrectable = 0x04, Compare = 0x05,
  WriteZeroes = 0x08, DatasetMgmt = 0x09,
};
// Fabrics command types (SQE byte 4 when opcode is 0x7f).
enum class FabricsType : uint8_t { PropertySet = 0x00, Connect = 0x01, PropertyGet = 0x04, Disconnect = 0x08 };

// Identify CNS values.
enum class Cns : uint8_t { Namespace = 0x00, Controller = 0x01, ActiveNsList = 0x02, NsDescList = 0x03 };
// Namespace identification descriptor types.
enum class Nidt : uint8_t { Eui64 = 0x01, Nguid = 0x02, Uuid = 0x03, Csi = 0x04 };

// Feature identifiers.
enum class Feature : uint8_t {
  Arbitration = 0x01, PowerMgmt = 0x02, TempThreshold = 0x04, ErrorRecovery = 0x05,
  VolatileWc = 0x06, NumQueues = 0x07, IrqCoalesce = 0x08, IrqConfig = 0x09,
  WriteAtomic = 0x0a, AsyncEventConfig = 0x0b, KeepAlive = 0x0f, HostId = 0x81,
};

// Log page identifiers.
enum class LogPage : uint8_t { Error = 0x01, Smart = 0x02, FwSlot = 0x03, ChangedNs = 0x04, CmdEffects = 0x05, Discovery = 0x70 };

// Controller properties (Property Get/Set offsets).
enum class Prop : uint32_t { Cap = 0x00, Vs = 0x08, Intms = 0x0c, Intmc = 0x10, Cc = 0x14, Csts = 0x1c, Nssr = 0x20 };

// CAP (64 bits).
namespace cap {
constexpr uint64_t mqes(uint64_t v) noexcept { return v & 0xffff; }            // 0-based
constexpr uint64_t cqr(uint64_t v) noexcept { return (v >> 16) & 1; }
constexpr uint64_t to(uint64_t v) noexcept { return (v >> 24) & 0xff; }         // 500 ms units
constexpr uint64_t css(uint64_t v) noexcept { return (v >> 37) & 0xff; }        // bit 0: NVM
constexpr uint64_t mpsmin(uint64_t v) noexcept { return (v >> 48) & 0xf; }
constexpr uint64_t mpsmax(uint64_t v) noexcept { return (v >> 52) & 0xf; }
constexpr uint64_t make(uint16_t mqes0, bool cqr, uint8_t to500ms) noexcept {
  return uint64_t{mqes0} | (uint64_t{cqr} << 16) | (uint64_t{to500ms} << 24) | (uint64_t{1} << 37);
}
}  // namespace cap
// CC (32 bits).
namespace cc {
constexpr uint32_t kEn = 1u << 0;
constexpr uint32_t css(uint32_t v) noexcept { return (v >> 4) & 7; }
constexpr uint32_t mps(uint32_t v) noexcept { return (v >> 7) & 0xf; }
constexpr uint32_t ams(uint32_t v) noexcept { return (v >> 11) & 7; }
constexpr uint32_t shn(uint32_t v) noexcept { return (v >> 14) & 3; }  // 1 normal, 2 abrupt
constexpr uint32_t iosqes(uint32_t v) noexcept { return (v >> 16) & 0xf; }
constexpr uint32_t iocqes(uint32_t v) noexcept { return (v >> 20) & 0xf; }
}  // namespace cc
// CSTS (32 bits).
namespace csts {
constexpr uint32_t kRdy = 1u << 0;
constexpr uint32_t kCfs = 1u << 1;
constexpr uint32_t kShstOccurring = 1u << 2;
constexpr uint32_t kShstComplete = 2u << 2;
constexpr uint32_t kShstMask = 3u << 2;
}  // namespace csts
constexpr uint32_t make_vs(uint32_t major, uint32_t minor, uint32_t ter = 0) noexcept {
  return (major << 16) | (minor << 8) | ter;
}

// Identify Controller SGLS bits.
namespace sgls {
constexpr uint32_t kSupported = 1u << 0;   // SGLs supported, no alignment requirement
constexpr uint32_t kKeyed = 1u << 2;       // keyed SGL data block (mandatory for RDMA)
constexpr uint32_t kOffset = 1u << 20;     // SGL address is an offset (in-capsule data)
}  // namespace sgls
constexpr uint16_t kOncsDsm = 1u << 2;
constexpr uint16_t kOncsWriteZeroes = 1u << 3;
constexpr uint32_t kOaesNsAttrChanged = 1u << 8;

// SGL descriptor type byte (type << 4 | subtype).
namespace sgl {
constexpr uint8_t kDataBlock = 0x0, kKeyedDataBlock = 0x4;
constexpr uint8_t kSubAddress = 0x0, kSubOffset = 0x1, kSubInvalidate = 0xf;
constexpr uint8_t kKeyedAddr = 0x40, kKeyedInvalidate = 0x4f, kInCapsule = 0x01;
}  // namespace sgl
constexpr uint8_t kPsdtSglMask = 0xc0;  // SQE flags bits 7:6; 01b/10b: SGL

// Discovery log entry values.
namespace disc {
constexpr uint8_t kTrtypeRdma = 1;
constexpr uint8_t kAdrfamIpv4 = 1, kAdrfamIpv6 = 2;
constexpr uint8_t kSubtypeReferral = 1, kSubtypeNvme = 2, kSubtypeCurrent = 3;
constexpr uint8_t kTreqNotSpecified = 0, kTreqRequired = 1, kTreqNotRequired = 2;
constexpr uint8_t kRdmaQptypeConnected = 1, kRdmaPrtypeNotSpecified = 1, kRdmaCmsRdmaCm = 1;
}  // namespace disc

// Status: SCT (status code type) and SC. The CQE's status field holds
// (status << 1) | phase, with status = DNR<<14 | MORE<<13 | CRD<<11 | SCT<<8 | SC.
enum class Sct : uint8_t { Generic = 0, CommandSpecific = 1, MediaError = 2, Path = 3 };
struct Status {
  uint16_t value = 0;  // DNR<<14 | SCT<<8 | SC (the CQE's status field >> 1)
  constexpr Status() = default;
  constexpr Status(Sct t, uint8_t sc, bool dnr = true) noexcept
      : value(static_cast<uint16_t>((dnr && (t != Sct::Generic || sc != 0) ? 1u << 14 : 0) |
                                    (static_cast<unsigned>(t) << 8) | sc)) {}
  constexpr Sct sct() const noexcept { return static_cast<Sct>((value >> 8) & 7); }
  constexpr uint8_t sc() const noexcept { return value & 0xff; }
  constexpr bool dnr() const noexcept { return (value >> 14) & 1; }
  constexpr bool ok() const noexcept { return (value & 0x7ff) == 0; }
  friend constexpr bool operator==(Status a, Status b) noexcept { return (a.value & 0x7ff) == (b.value & 0x7ff); }
};
namespace sc {  // NVME_SC_* of Linux, SCT and SC
constexpr Status kSuccess{};
constexpr Status kInvalidOpcode{Sct::Generic, 0x01};
constexpr Status kInvalidField{Sct::Generic, 0x02};
constexpr Status kCmdIdConflict{Sct::Generic, 0x03};
constexpr Status kDataXferError{Sct::Generic, 0x04};
constexpr Status kInternal{Sct::Generic, 0x06};
constexpr Status kAbortReq{Sct::Generic, 0x07, false};
constexpr Status kAbortQueue{Sct::Generic, 0x08, false};
constexpr Status kInvalidNs{Sct::Generic, 0x0b};
constexpr Status kCmdSeqError{Sct::Generic, 0x0c};
constexpr Status kSglInvalidLast{Sct::Generic, 0x0d};
constexpr Status kSglInvalidCount{Sct::Generic, 0x0e};
constexpr Status kSglInvalidData{Sct::Generic, 0x0f};  // data SGL length invalid
constexpr Status kSglInvalidType{Sct::Generic, 0x11};
constexpr Status kSglInvalidOffset{Sct::Generic, 0x16};
constexpr Status kNsWriteProtected{Sct::Generic, 0x20};
constexpr Status kKaTimeoutExpired{Sct::Generic, 0x19};
constexpr Status kKaTimeoutInvalid{Sct::Generic, 0x1a};
constexpr Status kLbaRange{Sct::Generic, 0x80};
constexpr Status kCapExceeded{Sct::Generic, 0x81};
constexpr Status kNsNotReady{Sct::Generic, 0x82, false};
constexpr Status kQidInvalid{Sct::CommandSpecific, 0x01};
constexpr Status kQueueSize{Sct::CommandSpecific, 0x02};
constexpr Status kAbortLimit{Sct::CommandSpecific, 0x03};
constexpr Status kAsyncLimit{Sct::CommandSpecific, 0x05};
constexpr Status kInvalidLogPage{Sct::CommandSpecific, 0x09};
constexpr Status kFeatureNotSaveable{Sct::CommandSpecific, 0x0d};
constexpr Status kConnectFormat{Sct::CommandSpecific, 0x80};
constexpr Status kConnectCtrlBusy{Sct::CommandSpecific, 0x81};
constexpr Status kConnectInvalidParam{Sct::CommandSpecific, 0x82};
constexpr Status kConnectRestartDisc{Sct::CommandSpecific, 0x83};
constexpr Status kConnectInvalidHost{Sct::CommandSpecific, 0x84};
constexpr Status kWriteFault{Sct::MediaError, 0x80};
constexpr Status kReadError{Sct::MediaError, 0x81};
constexpr Status kAccessDenied{Sct::MediaError, 0x86};
}  // namespace sc

}  // namespace droce::nvmf

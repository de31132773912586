// CM MADs (IBTA vol. 1 ch. 12.6 and 13.4): host-order structs <-> the
// 256-byte wire MAD. Bit layouts as Linux's include/rdma/ibta_vol1_c12.h
// (offsets MSB first, big-endian). Pure code, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/headers.h"

namespace droce::cm {

constexpr size_t kMadSize = 256;
constexpr size_t kMadHdrSize = 24;
constexpr uint32_t kGsiQpn = 1;
constexpr uint32_t kGsiQkey = 0x80010000;
constexpr uint16_t kDefaultPkey = 0xffff;

constexpr uint8_t kMgmtClassCm = 0x07;
constexpr uint8_t kCmClassVersion = 2;
constexpr uint8_t kMethodSend = 0x03;

enum class Attr : uint16_t {
  ClassPortInfo = 0x0001,
  Req = 0x0010,
  Mra = 0x0011,
  Rej = 0x0012,
  Rep = 0x0013,
  Rtu = 0x0014,
  Dreq = 0x0015,
  Drep = 0x0016,
  SidrReq = 0x0017,
  SidrRep = 0x0018,
  Lap = 0x0019,
  Apr = 0x001a,
};
const char* attr_name(Attr a) noexcept;

// Private data sizes per message (IBTA).
constexpr size_t kReqPrivate = 92, kMraPrivate = 222, kRejPrivate = 148, kRepPrivate = 196, kRtuPrivate = 224,
                 kDreqPrivate = 220, kDrepPrivate = 224, kSidrReqPrivate = 216, kSidrRepPrivate = 136;
constexpr size_t kRejAriMax = 72;

struct MadHdr {
  uint8_t base_version = 1;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t tid = 0;
  Attr attr_id = Attr::Req;
  uint32_t attr_mod = 0;
  friend bool operator==(const MadHdr&, const MadHdr&) = default;
};

// Transport service type in REQ (2 bits).
enum class CmTransport : uint8_t { Rc = 0, Uc = 1, Rd = 2, Ext = 3 };

struct Path {  // primary (or alternate) path of a REQ
  uint16_t local_lid = 0xffff;   // RoCE: permissive LID
  uint16_t remote_lid = 0xffff;
  wire::Gid local_gid{};
  wire::Gid remote_gid{};
  uint32_t flow_label = 0;       // 20 bits
  uint8_t packet_rate = 0;       // 6 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;                // 4 bits
  bool subnet_local = false;
  uint8_t local_ack_timeout = 0; // 5 bits
  friend bool operator==(const Path&, const Path&) = default;
};

struct Req {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;  // host value of the big-endian wire field
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;               // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  CmTransport transport = CmTransport::Rc;
  bool end_to_end_flow_control = false;
  uint32_t starting_psn = 0;            // 24 bits
  uint8_t local_cm_response_timeout = 0;  // 5 bits
  uint8_t retry_count = 0;              // 3 bits
  uint16_t pkey = kDefaultPkey;
  uint8_t path_mtu = 0;                 // 4 bits, IB encoding (1 = 256 .. 5 = 4096)
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;          // 3 bits
  uint8_t max_cm_retries = 0;           // 4 bits
  bool srq = false;
  uint8_t extended_transport = 0;       // 3 bits
  Path primary;
  bool has_alternate = false;           // alternate path present (non-zero LIDs/GIDs)
  Path alternate;                       // decode: Path{} when absent; encode: zeros unless has_alternate
  uint8_t private_data[kReqPrivate]{};
  friend bool operator==(const Req&, const Req&) = default;
};

struct Mra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_mraed = 0;            // 2 bits: 0 REQ, 1 REP, 2 LAP
  uint8_t service_timeout = 0;          // 5 bits
  uint8_t private_data[kMraPrivate]{};
  friend bool operator==(const Mra&, const Mra&) = default;
};

// REJ reasons (IBTA table 112) that droce sends or reads.
enum class RejReason : uint16_t {
  NoQp = 1,
  NoEec = 2,
  NoResources = 3,
  Timeout = 4,
  Unsupported = 5,
  InvalidCommId = 6,
  InvalidCommInstance = 7,
  InvalidServiceId = 8,
  InvalidTransportType = 9,
  StaleConn = 10,
  RdcNotExist = 11,
  InvalidGid = 12,
  InvalidLid = 13,
  InvalidSl = 14,
  InvalidTrafficClass = 15,
  InvalidHopLimit = 16,
  InvalidPacketRate = 17,
  InvalidAltGid = 18,
  InvalidAltLid = 19,
  InvalidAltSl = 20,
  InvalidAltTrafficClass = 21,
  InvalidAltHopLimit = 22,
  InvalidAltPacketRate = 23,
  PortCmRedirect = 24,
  PortRedirect = 25,
  InvalidMtu = 26,
  InsufficientRespResources = 27,
  ConsumerDefined = 28,
  InvalidRnrRetry = 29,
  DuplicateLocalCommId = 30,
  InvalidClassVersion = 31,
  InvalidFlowLabel = 32,
  InvalidAltFlowLabel = 33,
};

struct Rej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_rejected = 0;         // 2 bits: 0 REQ, 1 REP, 2 other
  uint8_t ari_length = 0;               // 7 bits
  uint16_t reason = 0;
  uint8_t ari[kRejAriMax]{};
  uint8_t private_data[kRejPrivate]{};
  friend bool operator==(const Rej&, const Rej&) = default;
};

struct Rep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;               // 24 bits
  uint32_t local_eecn = 0;              // 24 bits
  uint32_t starting_psn = 0;            // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;         // 5 bits
  uint8_t failover_accepted = 0;        // 2 bits
  bool end_to_end_flow_control = false;
  uint8_t rnr_retry_count = 0;          // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  uint8_t private_data[kRepPrivate]{};
  friend bool operator==(const Rep&, const Rep&) = default;
};

struct Rtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t private_data[kRtuPrivate]{};
  friend bool operator==(const Rtu&, const Rtu&) = default;
};

struct Dreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;              // 24 bits (remote QPN/EECN)
  uint8_t private_data[kDreqPrivate]{};
  friend bool operator==(const Dreq&, const Dreq&) = default;
};

struct Drep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t private_data[kDrepPrivate]{};
  friend bool operator==(const Drep&, const Drep&) = default;
};

struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = kDefaultPkey;
  uint64_t service_id = 0;
  uint8_t private_data[kSidrReqPrivate]{};
  friend bool operator==(const SidrReq&, const SidrReq&) = default;
};

// SIDR_REP status (IBTA table 122; Linux enum ib_cm_sidr_status).
enum class SidrStatus : uint8_t { Ok = 0, Unsupported = 1, Reject = 2, NoQp = 3, Redirect = 4, VersionUnsupported = 5 };

struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint8_t add_info_length = 0;
  uint32_t qpn = 0;                     // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  uint8_t add_info[72]{};
  uint8_t private_data[kSidrRepPrivate]{};
  friend bool operator==(const SidrRep&, const SidrRep&) = default;
};

// Decoding errors (counted by the caller, then the MAD is dropped).
enum class MadError : uint8_t {
  None = 0,
  Short,          // fewer than 256 bytes
  BaseVersion,    // base version != 1
  NotCm,          // management class != CM
  ClassVersion,   // class version != 2
  Method,         // not SEND
  UnknownAttr,    // attribute ID of no CM message droce handles
  BadField,       // a field with an impossible value (e.g. REJ ARI length > 72)
};
const char* mad_error_name(MadError e) noexcept;

// Header only (any MAD). Error if not a CM SEND MAD of version 1/2, or
// UnknownAttr if its attribute is none of the nine messages below (LAP, APR,
// ClassPortInfo, ...). h is filled whenever mad has 256 bytes or more, so the
// caller can still see what it drops.
MadError decode_hdr(std::span<const uint8_t> mad, MadHdr& h) noexcept;

// Body decoders: mad is the whole 256-byte MAD (header included). The header
// is checked as by decode_hdr, and its attribute must be the message's
// (UnknownAttr otherwise). Reserved bits are ignored. BadField: REJ ARI length
// or SIDR_REP additional information length above 72 (m is filled anyway).
MadError decode(std::span<const uint8_t> mad, Req& m) noexcept;
MadError decode(std::span<const uint8_t> mad, Mra& m) noexcept;
MadError decode(std::span<const uint8_t> mad, Rej& m) noexcept;
MadError decode(std::span<const uint8_t> mad, Rep& m) noexcept;
MadError decode(std::span<const uint8_t> mad, Rtu& m) noexcept;
MadError decode(std::span<const uint8_t> mad, Dreq& m) noexcept;
MadError decode(std::span<const uint8_t> mad, Drep& m) noexcept;
MadError decode(std::span<const uint8_t> mad, SidrReq& m) noexcept;
MadError decode(std::span<const uint8_t> mad, SidrRep& m) noexcept;

// Encoders: write the whole 256-byte MAD (header with attr_id set from the
// message type, tid as given; reserved bytes zero). out.size() >= 256.
// Fields are masked to their width; REJ ARI length and SIDR_REP additional
// information length are capped at 72.
void encode(std::span<uint8_t> out, uint64_t tid, const Req& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const Mra& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const Rej& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const Rep& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const Rtu& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const Dreq& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const Drep& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const SidrReq& m) noexcept;
void encode(std::span<uint8_t> out, uint64_t tid, const SidrRep& m) noexcept;

}  // namespace droce::cm

// Verbs objects with ibverbs semantics: enums whose values equal those of
// <infiniband/verbs.h> (so a shim passes them through unchanged), work
// requests, completions, address handles, QP attributes.
// No libibverbs dependency: the values are asserted against it in tests.
#pragma once

#include <cstdint>

#include "wire/headers.h"
#include "wire/opcode.h"

namespace droce::verbs {

using wire::QpType;
using wire::WrOpcode;

// enum ibv_wc_status
enum class WcStatus : uint8_t {
  Success = 0,
  LocLenErr = 1,
  LocQpOpErr = 2,
  LocEecOpErr = 3,
  LocProtErr = 4,
  WrFlushErr = 5,
  MwBindErr = 6,
  BadRespErr = 7,
  LocAccessErr = 8,
  RemInvReqErr = 9,
  RemAccessErr = 10,
  RemOpErr = 11,
  RetryExcErr = 12,
  RnrRetryExcErr = 13,
  LocRddViolErr = 14,
  RemInvRdReqErr = 15,
  RemAbortErr = 16,
  InvEecnErr = 17,
  InvEecStateErr = 18,
  FatalErr = 19,
  RespTimeoutErr = 20,
  GeneralErr = 21,
};
const char* wc_status_str(WcStatus s) noexcept;

// enum ibv_wc_opcode
enum class WcOpcode : uint8_t {
  Send = 0,
  RdmaWrite = 1,
  RdmaRead = 2,
  CompSwap = 3,
  FetchAdd = 4,
  BindMw = 5,
  LocalInv = 6,
  Recv = 128,
  RecvRdmaWithImm = 129,
};

// enum ibv_wc_flags
enum WcFlags : uint8_t { kWcGrh = 1, kWcWithImm = 2, kWcIpCsumOk = 4, kWcWithInv = 8 };

// enum ibv_access_flags
enum Access : uint32_t {
  kAccessLocalWrite = 1,
  kAccessRemoteWrite = 2,
  kAccessRemoteRead = 4,
  kAccessRemoteAtomic = 8,
};
inline constexpr uint32_t kAccessAll = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
// IBV_ACCESS_MW_BIND: memory windows may be bound to the MR (IBTA C10-73).
inline constexpr uint32_t kAccessMwBind = 16;
inline constexpr uint32_t kAccessRemoteAll = kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
// droce's own registration flag (not an ibv_access_flags bit): the MR is a
// fast-registration MR (what a kernel ULP such as nvmet-rdma registers per I/O),
// which a SEND with Invalidate naming its rkey may invalidate (IBTA 10.6.7: only
// memory windows type 2 and fast-registered regions can be remotely
// invalidated). The embedding API offers it; shim clients cannot set it.
inline constexpr uint32_t kMrRemoteInvalidate = 1u << 31;

// enum ibv_send_flags
enum SendFlags : uint32_t { kSendFence = 1, kSendSignaled = 2, kSendSolicited = 4, kSendInline = 8 };

// enum ibv_qp_state
enum class QpState : uint8_t { Reset = 0, Init = 1, Rtr = 2, Rts = 3, Sqd = 4, Sqe = 5, Err = 6 };
const char* qp_state_str(QpState s) noexcept;

// enum ibv_mtu
enum class Mtu : uint8_t { M256 = 1, M512 = 2, M1024 = 3, M2048 = 4, M4096 = 5 };
constexpr uint32_t mtu_bytes(Mtu m) noexcept { return 128u << static_cast<uint8_t>(m); }
// The largest IB MTU whose RoCEv2 frames fit an Ethernet MTU of link_mtu bytes:
// payload + IPv6 (40) + UDP (8) + BTH (12) + the largest extension header a
// payload packet carries (RETH 16) + ICRC (4).
constexpr Mtu max_mtu_for_link(uint32_t link_mtu) noexcept {
  constexpr uint32_t kOverhead = 40 + 8 + 12 + 16 + 4;
  for (uint8_t m = 5; m > 1; --m)
    if (mtu_bytes(static_cast<Mtu>(m)) + kOverhead <= link_mtu) return static_cast<Mtu>(m);
  return Mtu::M256;
}

// enum ibv_qp_attr_mask
enum QpAttrMask : uint32_t {
  kQpState = 1u << 0,
  kQpCurState = 1u << 1,
  kQpEnSqdAsyncNotify = 1u << 2,
  kQpAccessFlags = 1u << 3,
  kQpPkeyIndex = 1u << 4,
  kQpPort = 1u << 5,
  kQpQkey = 1u << 6,
  kQpAv = 1u << 7,
  kQpPathMtu = 1u << 8,
  kQpTimeout = 1u << 9,
  kQpRetryCnt = 1u << 10,
  kQpRnrRetry = 1u << 11,
  kQpRqPsn = 1u << 12,
  kQpMaxQpRdAtomic = 1u << 13,
  kQpAltPath = 1u << 14,
  kQpMinRnrTimer = 1u << 15,
  kQpSqPsn = 1u << 16,
  kQpMaxDestRdAtomic = 1u << 17,
  kQpPathMigState = 1u << 18,
  kQpCap = 1u << 19,
  kQpDestQpn = 1u << 20,
};

// Limits of this device (ibv_device_attr).
inline constexpr uint32_t kMaxSge = 8;  // = DROCE_SHM_MAX_SGE; UCX asks 5 (RC) and 6 (UD)
inline constexpr uint32_t kMaxInline = 256;
inline constexpr uint32_t kMaxRdAtomic = 128;  // READs/atomics in flight per QP, each way (rxe: 128)
inline constexpr uint32_t kMaxMsgSize = 1u << 31;  // 2 GiB
inline constexpr uint32_t kGrhBytes = 40;

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

// Where a packet goes: the ibv_ah_attr of RoCEv2 (GID + resolved MAC).
struct Ah {
  wire::MacAddr dmac{};
  wire::Gid dgid{};
  uint8_t traffic_class = 0;  // DSCP << 2 | ECN (the engine sets ECT(0) when ECN is on)
  uint8_t hop_limit = 64;
  uint32_t flow_label = 0;
  bool vlan = false;
  uint16_t vlan_tci = 0;
};

// struct ibv_send_wr, flattened (sg_list inline, no chaining). What a SEND or
// WRITE of one SGE reads comes first: with sg_list[0] in the first 64 bytes
// (a send queue entry, SendWqe, starts with it a cache line further on).
struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::Send;
  uint32_t send_flags = kSendSignaled;
  uint32_t num_sge = 0;
  uint32_t imm_data = 0;  // network order, as ibverbs
  uint32_t invalidate_rkey = 0;
  struct {
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
  } rdma;
  Sge sg_list[kMaxSge]{};
  struct {
    uint64_t remote_addr = 0;
    uint64_t compare_add = 0;
    uint64_t swap = 0;
    uint32_t rkey = 0;
  } atomic;
  struct {
    const Ah* ah = nullptr;
    uint32_t remote_qpn = 0;
    uint32_t remote_qkey = 0;
  } ud;
  // BIND_MW (type 2 from a send WR; type 1 from ibv_bind_mw, which posts one
  // too): the window's current rkey, the rkey it gets (same index, the
  // consumer's key byte), the MR (lkey; 0 with length 0 unbinds a type 1
  // window), the range in the MR's address space and the remote rights.
  // LOCAL_INV names its key in invalidate_rkey.
  struct {
    uint32_t mw_rkey = 0;
    uint32_t new_rkey = 0;
    uint32_t mr_lkey = 0;
    uint32_t access = 0;
    uint64_t addr = 0;
    uint64_t length = 0;
    bool type1 = false;  // posted by ibv_bind_mw (type 1 windows only)
  } bind;
};

struct RecvWr {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  Sge sg_list[kMaxSge]{};
};

// struct ibv_wc
struct Wc {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::Success;
  WcOpcode opcode = WcOpcode::Send;
  uint8_t wc_flags = 0;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;  // or invalidated rkey (kWcWithInv)
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint16_t pkey_index = 0;
  uint16_t slid = 0;
  uint8_t sl = 0;
  uint8_t dlid_path_bits = 0;
};

struct QpCap {
  uint32_t max_send_wr = 64;
  uint32_t max_recv_wr = 64;
  uint32_t max_send_sge = kMaxSge;
  uint32_t max_recv_sge = kMaxSge;
  uint32_t max_inline_data = kMaxInline;
};

// struct ibv_qp_attr (the fields RoCE uses). The fields the datapath reads per
// packet come first (the timers' codes, the access flags, the peer's QPN, the
// caps post_send checks): a QP keeps them on one cache line (QpBase).
struct QpAttr {
  QpState qp_state = QpState::Reset;
  QpState cur_qp_state = QpState::Reset;
  Mtu path_mtu = Mtu::M1024;
  uint8_t sq_draining = 0;
  uint8_t max_rd_atomic = 1;
  uint8_t max_dest_rd_atomic = 1;
  uint8_t min_rnr_timer = 0;
  uint8_t port_num = 1;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint16_t pkey_index = 0;
  uint32_t qkey = 0;
  uint32_t dest_qp_num = 0;
  uint32_t qp_access_flags = 0;
  QpCap cap;
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  Ah ah_attr;
};

// IBTA 9.7.5.2.8 table 45: RNR NAK timer field -> nanoseconds. Code 0 is 655.36 ms.
uint64_t rnr_timer_ns(uint8_t code) noexcept;
// Local ACK timeout 4.096 us * 2^timeout; timeout 0 means infinite (returns 0).
constexpr uint64_t ack_timeout_ns(uint8_t timeout) noexcept {
  return timeout == 0 ? 0 : (4096ull << (timeout > 31 ? 31 : timeout));
}

}  // namespace droce::verbs

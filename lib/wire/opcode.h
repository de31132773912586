// The BTH opcode table (IBTA vol 1 table 35 "OpCode field", annex A17 for CNP):
// one constexpr entry per opcode byte saying what the packet is, which extension
// headers follow the BTH and where. Parsing, length checks, building and the
// transport's dispatch all read this table; nothing else encodes that knowledge.
//
// A second table (wr_allowed) says which work-request opcodes each QP type
// accepts, and wire_opcode() maps a work request and a packet's position in
// its message to the opcode the requester sends.
#pragma once

#include <array>
#include <cstdint>

#include "wire/headers.h"

namespace droce::wire {

enum class Transport : uint8_t { RC = 0, UC = 1, RD = 2, UD = 3, CNP = 4, Invalid = 7 };

// Opcode properties. FIRST|LAST means ONLY.
enum OpFlag : uint32_t {
  kOpValid = 1u << 0,
  kOpRequest = 1u << 1,   // requester -> responder
  kOpResponse = 1u << 2,  // responder -> requester (ACK, READ response, ATOMIC ACK)
  kOpFirst = 1u << 3,
  kOpMiddle = 1u << 4,
  kOpLast = 1u << 5,
  kOpPayload = 1u << 6,  // carries (possibly zero bytes of) payload
  kOpImm = 1u << 7,
  kOpReth = 1u << 8,
  kOpAeth = 1u << 9,
  kOpAtomicEth = 1u << 10,
  kOpAtomicAckEth = 1u << 11,
  kOpDeth = 1u << 12,
  kOpIeth = 1u << 13,
  kOpSend = 1u << 14,
  kOpWrite = 1u << 15,
  kOpRead = 1u << 16,  // READ request or READ response
  kOpAtomic = 1u << 17,  // atomic request or atomic ACK
  kOpAck = 1u << 18,     // the plain Acknowledge packet
  kOpCnp = 1u << 19,
  kOpNeedsAck = 1u << 20,     // an RC request the responder must acknowledge
  kOpConsumesRecv = 1u << 21, // completes a receive WQE at the responder (last/only)
  kOpCnpResv = 1u << 22,      // 16 reserved bytes follow the BTH (CNP)
};

struct OpcodeInfo {
  const char* name;
  uint32_t flags;
  Transport transport;
  uint8_t hdr_len;  // BTH + extension headers
  // Offsets from the start of the BTH; 0 means "not present".
  uint8_t off_deth;
  uint8_t off_reth;
  uint8_t off_atomic;
  uint8_t off_aeth;
  uint8_t off_atomic_ack;
  uint8_t off_imm;
  uint8_t off_ieth;

  constexpr bool valid() const noexcept { return flags & kOpValid; }
  constexpr bool has(uint32_t f) const noexcept { return (flags & f) == f; }
  constexpr bool is_first() const noexcept { return flags & kOpFirst; }
  constexpr bool is_last() const noexcept { return flags & kOpLast; }
};

namespace detail {

constexpr OpcodeInfo make_op(const char* name, Transport t, uint32_t flags) {
  OpcodeInfo o{name, flags | kOpValid, t, 0, 0, 0, 0, 0, 0, 0, 0};
  // Extension header order (9.2): DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
  uint8_t off = sizeof(Bth);
  if (flags & kOpDeth) { o.off_deth = off; off += sizeof(Deth); }
  if (flags & kOpReth) { o.off_reth = off; off += sizeof(Reth); }
  if (flags & kOpAtomicEth) { o.off_atomic = off; off += sizeof(AtomicEth); }
  if (flags & kOpAeth) { o.off_aeth = off; off += sizeof(Aeth); }
  if (flags & kOpAtomicAckEth) { o.off_atomic_ack = off; off += sizeof(AtomicAckEth); }
  if (flags & kOpImm) { o.off_imm = off; off += sizeof(ImmDt); }
  if (flags & kOpIeth) { o.off_ieth = off; off += sizeof(Ieth); }
  if (flags & kOpCnpResv) { off += kCnpReservedBytes; }
  o.hdr_len = off;
  return o;
}

constexpr uint32_t kReq = kOpRequest;
constexpr uint32_t kF = kOpFirst, kM = kOpMiddle, kL = kOpLast, kO = kOpFirst | kOpLast;
constexpr uint32_t kP = kOpPayload;

// The send/write opcodes shared by RC and UC (low 5 bits 0x00-0x0B).
constexpr void add_send_write(std::array<OpcodeInfo, 256>& t, Transport tr, uint8_t base, uint32_t extra) {
  const bool rc = tr == Transport::RC;
  const uint32_t S = kOpSend | kReq | kP | extra, W = kOpWrite | kReq | kP | extra;
  const uint32_t R = kOpConsumesRecv;
  t[base + 0x00] = make_op(rc ? "RC_SEND_FIRST" : "UC_SEND_FIRST", tr, S | kF);
  t[base + 0x01] = make_op(rc ? "RC_SEND_MIDDLE" : "UC_SEND_MIDDLE", tr, S | kM);
  t[base + 0x02] = make_op(rc ? "RC_SEND_LAST" : "UC_SEND_LAST", tr, S | kL | R);
  t[base + 0x03] = make_op(rc ? "RC_SEND_LAST_IMM" : "UC_SEND_LAST_IMM", tr, S | kL | R | kOpImm);
  t[base + 0x04] = make_op(rc ? "RC_SEND_ONLY" : "UC_SEND_ONLY", tr, S | kO | R);
  t[base + 0x05] = make_op(rc ? "RC_SEND_ONLY_IMM" : "UC_SEND_ONLY_IMM", tr, S | kO | R | kOpImm);
  t[base + 0x06] = make_op(rc ? "RC_WRITE_FIRST" : "UC_WRITE_FIRST", tr, W | kF | kOpReth);
  t[base + 0x07] = make_op(rc ? "RC_WRITE_MIDDLE" : "UC_WRITE_MIDDLE", tr, W | kM);
  t[base + 0x08] = make_op(rc ? "RC_WRITE_LAST" : "UC_WRITE_LAST", tr, W | kL);
  t[base + 0x09] = make_op(rc ? "RC_WRITE_LAST_IMM" : "UC_WRITE_LAST_IMM", tr, W | kL | R | kOpImm);
  t[base + 0x0A] = make_op(rc ? "RC_WRITE_ONLY" : "UC_WRITE_ONLY", tr, W | kO | kOpReth);
  t[base + 0x0B] = make_op(rc ? "RC_WRITE_ONLY_IMM" : "UC_WRITE_ONLY_IMM", tr, W | kO | R | kOpReth | kOpImm);
}

constexpr std::array<OpcodeInfo, 256> build_table() {
  std::array<OpcodeInfo, 256> t{};
  for (auto& e : t) e = OpcodeInfo{"INVALID", 0, Transport::Invalid, 0, 0, 0, 0, 0, 0, 0, 0};
  constexpr auto RC = Transport::RC;
  add_send_write(t, RC, 0x00, kOpNeedsAck);
  t[0x0C] = make_op("RC_READ_REQUEST", RC, kReq | kOpRead | kO | kOpReth | kOpNeedsAck);
  t[0x0D] = make_op("RC_READ_RESPONSE_FIRST", RC, kOpResponse | kOpRead | kF | kP | kOpAeth);
  t[0x0E] = make_op("RC_READ_RESPONSE_MIDDLE", RC, kOpResponse | kOpRead | kM | kP);
  t[0x0F] = make_op("RC_READ_RESPONSE_LAST", RC, kOpResponse | kOpRead | kL | kP | kOpAeth);
  t[0x10] = make_op("RC_READ_RESPONSE_ONLY", RC, kOpResponse | kOpRead | kO | kP | kOpAeth);
  t[0x11] = make_op("RC_ACKNOWLEDGE", RC, kOpResponse | kOpAck | kO | kOpAeth);
  t[0x12] = make_op("RC_ATOMIC_ACKNOWLEDGE", RC, kOpResponse | kOpAtomic | kO | kOpAeth | kOpAtomicAckEth);
  t[0x13] = make_op("RC_COMPARE_SWAP", RC, kReq | kOpAtomic | kO | kOpAtomicEth | kOpNeedsAck);
  t[0x14] = make_op("RC_FETCH_ADD", RC, kReq | kOpAtomic | kO | kOpAtomicEth | kOpNeedsAck);
  t[0x16] = make_op("RC_SEND_LAST_INV", RC,
                    kReq | kOpSend | kL | kP | kOpIeth | kOpNeedsAck | kOpConsumesRecv);
  t[0x17] = make_op("RC_SEND_ONLY_INV", RC,
                    kReq | kOpSend | kO | kP | kOpIeth | kOpNeedsAck | kOpConsumesRecv);
  add_send_write(t, Transport::UC, 0x20, 0);
  t[0x64] = make_op("UD_SEND_ONLY", Transport::UD, kReq | kOpSend | kO | kP | kOpDeth | kOpConsumesRecv);
  t[0x65] = make_op("UD_SEND_ONLY_IMM", Transport::UD,
                    kReq | kOpSend | kO | kP | kOpDeth | kOpImm | kOpConsumesRecv);
  t[0x81] = make_op("CNP", Transport::CNP, kOpCnp | kOpCnpResv);
  return t;
}

}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = detail::build_table();

constexpr const OpcodeInfo& opcode_info(uint8_t opcode) noexcept { return kOpcodeTable[opcode]; }

// Named opcodes, for code that builds packets.
namespace op {
inline constexpr uint8_t RC_SEND_FIRST = 0x00, RC_SEND_MIDDLE = 0x01, RC_SEND_LAST = 0x02,
                         RC_SEND_LAST_IMM = 0x03, RC_SEND_ONLY = 0x04, RC_SEND_ONLY_IMM = 0x05,
                         RC_WRITE_FIRST = 0x06, RC_WRITE_MIDDLE = 0x07, RC_WRITE_LAST = 0x08,
                         RC_WRITE_LAST_IMM = 0x09, RC_WRITE_ONLY = 0x0A, RC_WRITE_ONLY_IMM = 0x0B,
                         RC_READ_REQUEST = 0x0C, RC_READ_RESPONSE_FIRST = 0x0D,
                         RC_READ_RESPONSE_MIDDLE = 0x0E, RC_READ_RESPONSE_LAST = 0x0F,
                         RC_READ_RESPONSE_ONLY = 0x10, RC_ACKNOWLEDGE = 0x11,
                         RC_ATOMIC_ACKNOWLEDGE = 0x12, RC_COMPARE_SWAP = 0x13, RC_FETCH_ADD = 0x14,
                         RC_SEND_LAST_INV = 0x16, RC_SEND_ONLY_INV = 0x17;
inline constexpr uint8_t UC_BASE = 0x20, UD_SEND_ONLY = 0x64, UD_SEND_ONLY_IMM = 0x65, CNP = 0x81;
}  // namespace op

static_assert(opcode_info(op::RC_WRITE_ONLY_IMM).hdr_len == 12 + 16 + 4);
static_assert(opcode_info(op::RC_WRITE_ONLY_IMM).off_imm == 28);
static_assert(opcode_info(op::RC_ATOMIC_ACKNOWLEDGE).hdr_len == 12 + 4 + 8);
static_assert(opcode_info(op::RC_COMPARE_SWAP).hdr_len == 12 + 28);
static_assert(opcode_info(op::UD_SEND_ONLY_IMM).off_imm == 20);
static_assert(opcode_info(op::CNP).hdr_len == 12 + 16);
static_assert(!opcode_info(0x15).valid() && !opcode_info(0x40).valid());

// ---- Work-request opcodes and which QP type allows which -----------------
// Values are those of enum ibv_wr_opcode, so the shim passes them through.
enum class WrOpcode : uint8_t {
  RdmaWrite = 0,
  RdmaWriteImm = 1,
  Send = 2,
  SendImm = 3,
  RdmaRead = 4,
  AtomicCmpSwp = 5,
  AtomicFetchAdd = 6,
  LocalInv = 7,
  BindMw = 8,
  SendInv = 9,
};
inline constexpr int kNumWrOpcodes = 10;

// Values are those of enum ibv_qp_type.
enum class QpType : uint8_t { RC = 2, UC = 3, UD = 4 };

namespace detail {
constexpr uint32_t wr_bit(WrOpcode o) { return 1u << static_cast<int>(o); }
}  // namespace detail

constexpr bool wr_allowed(QpType t, WrOpcode o) noexcept {
  using detail::wr_bit;
  constexpr uint32_t kSends = wr_bit(WrOpcode::Send) | wr_bit(WrOpcode::SendImm);
  constexpr uint32_t kWrites = wr_bit(WrOpcode::RdmaWrite) | wr_bit(WrOpcode::RdmaWriteImm);
  uint32_t mask = 0;
  switch (t) {
    case QpType::RC:
      mask = kSends | kWrites | wr_bit(WrOpcode::RdmaRead) | wr_bit(WrOpcode::AtomicCmpSwp) |
             wr_bit(WrOpcode::AtomicFetchAdd) | wr_bit(WrOpcode::SendInv) | wr_bit(WrOpcode::LocalInv) |
             wr_bit(WrOpcode::BindMw);
      break;
    case QpType::UC: mask = kSends | kWrites | wr_bit(WrOpcode::LocalInv) | wr_bit(WrOpcode::BindMw); break;
    case QpType::UD: mask = kSends; break;
  }
  return static_cast<int>(o) < kNumWrOpcodes && (mask & wr_bit(o));
}

// Where a packet sits in its message.
enum class Position : uint8_t { First, Middle, Last, Only };

// The opcode a requester sends for packet `pos` of a work request, or -1 when
// the QP type does not allow the work request (or has no such packet).
constexpr int wire_opcode(QpType t, WrOpcode o, Position pos) noexcept {
  if (!wr_allowed(t, o)) return -1;
  const int p = static_cast<int>(pos);
  if (t == QpType::UD) return pos == Position::Only ? (o == WrOpcode::Send ? op::UD_SEND_ONLY : op::UD_SEND_ONLY_IMM) : -1;
  const int base = t == QpType::UC ? op::UC_BASE : 0;
  // First, Middle, Last, Only for each message type.
  constexpr int kSend[4] = {0x00, 0x01, 0x02, 0x04}, kSendImm[4] = {0x00, 0x01, 0x03, 0x05};
  constexpr int kWrite[4] = {0x06, 0x07, 0x08, 0x0A}, kWriteImm[4] = {0x06, 0x07, 0x09, 0x0B};
  constexpr int kSendInv[4] = {0x00, 0x01, 0x16, 0x17};
  switch (o) {
    case WrOpcode::Send: return base + kSend[p];
    case WrOpcode::SendImm: return base + kSendImm[p];
    case WrOpcode::RdmaWrite: return base + kWrite[p];
    case WrOpcode::RdmaWriteImm: return base + kWriteImm[p];
    case WrOpcode::SendInv: return kSendInv[p];
    case WrOpcode::RdmaRead: return pos == Position::Only ? op::RC_READ_REQUEST : -1;
    case WrOpcode::AtomicCmpSwp: return pos == Position::Only ? op::RC_COMPARE_SWAP : -1;
    case WrOpcode::AtomicFetchAdd: return pos == Position::Only ? op::RC_FETCH_ADD : -1;
    default: return -1;
  }
}

static_assert(wire_opcode(QpType::UC, WrOpcode::RdmaWriteImm, Position::Only) == 0x2B);
static_assert(wire_opcode(QpType::UD, WrOpcode::RdmaWrite, Position::Only) == -1);
static_assert(wire_opcode(QpType::RC, WrOpcode::SendInv, Position::Last) == op::RC_SEND_LAST_INV);

}  // namespace droce::wire

// The states of the requester, responder and completer state machines, each an
// enum plus a name table (for traces and tests), as rxe does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace droce::transport {

enum class ReqSt : uint8_t { GetWqe, CheckLimits, StartWqe, BuildPacket, Stop, Yield, kCount };
inline constexpr const char* kReqStNames[] = {"GET_WQE", "CHECK_LIMITS", "START_WQE", "BUILD_PACKET", "STOP", "YIELD"};
static_assert(std::size(kReqStNames) == static_cast<size_t>(ReqSt::kCount));

enum class RespSt : uint8_t {
  CheckPsn, CheckOpSeq, CheckLength, CheckResource, CheckRkey, Execute, Complete, Acknowledge,
  Duplicate, ErrNakSeq, ErrRnr, ErrInvReq, ErrRemAccess, ErrRemOp, ErrLength, ErrInvalidate, DropMsg, Done, kCount
};
inline constexpr const char* kRespStNames[] = {
    "CHECK_PSN", "CHECK_OP_SEQ", "CHECK_LENGTH", "CHECK_RESOURCE", "CHECK_RKEY", "EXECUTE", "COMPLETE",
    "ACKNOWLEDGE", "DUPLICATE", "ERR_NAK_SEQ", "ERR_RNR", "ERR_INV_REQ", "ERR_REM_ACCESS", "ERR_REM_OP",
    "ERR_LENGTH", "ERR_INVALIDATE", "DROP_MSG", "DONE"};
static_assert(std::size(kRespStNames) == static_cast<size_t>(RespSt::kCount));

enum class CompSt : uint8_t { CheckPsn, Ack, ReadResp, AtomicAck, Nak, RnrNak, Retire, Drop, Done, kCount };
inline constexpr const char* kCompStNames[] = {"CHECK_PSN", "ACK",    "READ_RESP", "ATOMIC_ACK", "NAK",
                                               "RNR_NAK",   "RETIRE", "DROP",      "DONE"};
static_assert(std::size(kCompStNames) == static_cast<size_t>(CompSt::kCount));

constexpr const char* state_name(ReqSt s) noexcept { return kReqStNames[static_cast<size_t>(s)]; }
constexpr const char* state_name(RespSt s) noexcept { return kRespStNames[static_cast<size_t>(s)]; }
constexpr const char* state_name(CompSt s) noexcept { return kCompStNames[static_cast<size_t>(s)]; }

}  // namespace droce::transport

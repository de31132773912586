#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "wire/opcode.h"

using namespace droce::wire;

TEST_CASE("opcode table: every valid opcode is consistent", "[wire][opcode]") {
  int valid = 0;
  std::set<std::string> names;
  for (int i = 0; i < 256; ++i) {
    const auto& o = opcode_info(static_cast<uint8_t>(i));
    if (!o.valid()) continue;
    ++valid;
    INFO(o.name);
    CHECK(names.insert(o.name).second);
    // Transport comes from the top three bits (CNP aside).
    if (i != op::CNP) CHECK(static_cast<int>(o.transport) == (i >> 5));
    // Exactly one of request/response/CNP.
    const int kinds = !!(o.flags & kOpRequest) + !!(o.flags & kOpResponse) + !!(o.flags & kOpCnp);
    CHECK(kinds == 1);
    // A request or response has a position.
    if (!(o.flags & kOpCnp)) CHECK((o.flags & (kOpFirst | kOpMiddle | kOpLast)) != 0);
    // Header offsets are increasing and inside hdr_len.
    for (uint8_t off : {o.off_deth, o.off_reth, o.off_atomic, o.off_aeth, o.off_atomic_ack, o.off_imm, o.off_ieth})
      if (off) CHECK((off >= 12 && off < o.hdr_len));
    // Only RC requests need an ACK.
    if (o.flags & kOpNeedsAck) CHECK((o.transport == Transport::RC && (o.flags & kOpRequest)));
    // RETH only on FIRST/ONLY.
    if (o.off_reth) CHECK(o.is_first());
  }
  // RC 0x00-0x14 and 0x16-0x17 (23), UC 0x20-0x2B (12), UD 0x64-0x65 (2), CNP (1).
  CHECK(valid == 23 + 12 + 2 + 1);
}

TEST_CASE("work-request table per QP type", "[wire][opcode]") {
  CHECK(wr_allowed(QpType::RC, WrOpcode::AtomicFetchAdd));
  CHECK(wr_allowed(QpType::RC, WrOpcode::SendInv));
  CHECK_FALSE(wr_allowed(QpType::UC, WrOpcode::RdmaRead));
  CHECK_FALSE(wr_allowed(QpType::UC, WrOpcode::AtomicCmpSwp));
  CHECK(wr_allowed(QpType::UC, WrOpcode::RdmaWriteImm));
  CHECK(wr_allowed(QpType::UD, WrOpcode::SendImm));
  CHECK_FALSE(wr_allowed(QpType::UD, WrOpcode::RdmaWrite));
  // Memory-window work requests (local operations, no packet): RC and UC.
  CHECK(wr_allowed(QpType::RC, WrOpcode::BindMw));
  CHECK(wr_allowed(QpType::RC, WrOpcode::LocalInv));
  CHECK(wr_allowed(QpType::UC, WrOpcode::BindMw));
  CHECK_FALSE(wr_allowed(QpType::UD, WrOpcode::BindMw));
  CHECK_FALSE(wr_allowed(QpType::UD, WrOpcode::LocalInv));
  CHECK(wire_opcode(QpType::RC, WrOpcode::BindMw, Position::Only) == -1);
  // Every opcode wire_opcode() returns is valid, of the right transport, and a request.
  for (auto t : {QpType::RC, QpType::UC, QpType::UD})
    for (int o = 0; o < kNumWrOpcodes; ++o)
      for (auto pos : {Position::First, Position::Middle, Position::Last, Position::Only}) {
        const int code = wire_opcode(t, static_cast<WrOpcode>(o), pos);
        if (code < 0) continue;
        const auto& info = opcode_info(static_cast<uint8_t>(code));
        INFO(info.name);
        CHECK(info.valid());
        CHECK((info.flags & kOpRequest));
        CHECK(wr_allowed(t, static_cast<WrOpcode>(o)));
        CHECK(info.is_first() == (pos == Position::First || pos == Position::Only));
        CHECK(info.is_last() == (pos == Position::Last || pos == Position::Only));
      }
}

TEST_CASE("PSN arithmetic wraps at 2^24", "[wire][psn]") {
  CHECK(psn_add(0xFFFFFF, 1) == 0);
  CHECK(psn_diff(5, 0xFFFFFE) == 7);
  CHECK(psn_diff(0xFFFFFE, 5) == -7);
  CHECK(psn_lt(0xFFFFFE, 5));
  CHECK(psn_gt(5, 0xFFFFFE));
  CHECK(psn_ge(7, 7));
  CHECK(psn_diff(0x800000, 0) == -0x800000);  // half the ring: counts as behind
  CHECK(psn_diff(0x7FFFFF, 0) == 0x7FFFFF);
}

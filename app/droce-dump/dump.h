// droce-dump's decoder: turns captured frames into one text line or one JSON
// object per RoCEv2 packet, counts everything, and prints a summary. main.cc
// reads the capture (libpcap) and feeds frames here; the unit tests feed
// frames built with lib/wire.
//
// Every frame goes through lib/wire's parse_frame with the ICRC check off, so a
// packet whose ICRC is wrong still shows its decoded fields; the ICRC is then
// computed separately and reported as `icrc ok` or `icrc BAD`. A frame is a
// RoCEv2 packet when it is IPv4 or IPv6 carrying UDP to port 4791 (as far as
// its bytes show); one that is but does not parse is "malformed" and printed
// with the parser's precise error; anything else is counted as non-RoCE.
#pragma once

#include <cstdint>
#include <cstdio>
#include <array>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace droce::dump {

struct Options {
  bool json = false;   // JSON Lines instead of text
  bool quiet = false;  // summary only
};

struct Counts {
  uint64_t frames = 0;
  uint64_t roce = 0;  // RoCEv2 packets that parsed (ICRC good or bad)
  uint64_t icrc_ok = 0;
  uint64_t icrc_bad = 0;
  uint64_t malformed = 0;  // to UDP port 4791 but the parser rejects them
  uint64_t non_roce = 0;
  std::array<uint64_t, 256> by_opcode{};     // BTH opcode -> packets (named by lib/wire's table)
  std::map<std::string, uint64_t> errors;     // parse error name -> malformed packets
};

// AETH syndrome (IBTA 9.3.5, 9.7.5.2): the kind and the value of its low bits.
struct AethInfo {
  const char* kind;     // "ACK", "RNR_NAK", "NAK", "reserved"
  uint8_t code;         // low 5 bits: credit code, RNR timer code or NAK code
  int32_t credits;      // ACK: end-to-end credits (-1: code 31, no credit count)
  double rnr_ms;        // RNR_NAK: the timer in milliseconds
  const char* nak;      // NAK: the NAK code's name ("psn_sequence_error", ...)
};
AethInfo decode_aeth(uint8_t syndrome) noexcept;

// Link types droce-dump reads (the libpcap DLT_* value). Ethernet frames go to
// the parser as they are; Linux cooked (SLL, SLL2) and raw IP captures get an
// Ethernet header put in front (addresses zero, the EtherType from the capture).
// Returns false for any other link type.
bool link_supported(int dlt) noexcept;
// Returns the frame as Ethernet (possibly in `scratch`), or an empty span if a
// cooked header is shorter than it must be (then the frame is counted non-RoCE).
std::span<const uint8_t> to_ethernet(int dlt, std::span<const uint8_t> in, std::vector<uint8_t>& scratch);

class Dumper {
 public:
  Dumper(std::FILE* out, Options opt) : out_(out), opt_(opt) {}

  // Starts a capture file: frame numbers and relative times restart. With
  // `announce`, text output gets a "== path" line first (several files).
  void begin_file(const std::string& path, bool announce);
  // One captured Ethernet frame: its captured bytes, its length on the wire,
  // and its timestamp in microseconds.
  void frame(std::span<const uint8_t> bytes, uint32_t wire_len, int64_t ts_us);
  // The summary (text lines or one JSON object).
  void summary();

  const Counts& counts() const noexcept { return c_; }
  // 1 if any RoCEv2 packet failed to parse or its ICRC did not verify, else 0.
  int status() const noexcept { return c_.icrc_bad || c_.malformed ? 1 : 0; }

 private:
  std::FILE* out_;
  Options opt_;
  Counts c_;
  std::string file_;
  std::vector<std::string> files_;
  uint64_t frame_no_ = 0;
  bool have_t0_ = false;
  int64_t t0_us_ = 0;
};

}  // namespace droce::dump

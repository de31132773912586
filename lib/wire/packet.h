// Parsing and building whole RoCEv2 frames (Ethernet through ICRC).
//
// `Headers` holds every field of a frame in host order. The parser fills one
// from a byte span; the builder writes a frame from one. Parsing a frame and
// building from what it decoded gives the same bytes (the golden-trace tests
// check this on captures of Linux Soft-RoCE traffic).
//
// Pure functions over byte buffers: no allocation, no exception, no DPDK, and
// no read outside the given span for any input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/headers.h"
#include "wire/opcode.h"

namespace droce::wire {

struct L2Fields {
  MacAddr dst{};
  MacAddr src{};
  bool vlan = false;
  uint16_t vlan_tci = 0;
};

struct L3Fields {
  bool ipv6 = false;
  uint8_t tos = 0;  // IPv4 TOS or IPv6 traffic class (DSCP << 2 | ECN)
  uint8_t ttl = 64; // IPv4 TTL or IPv6 hop limit
  uint16_t ip_id = 0;
  uint16_t ip_frag = kIpv4FlagDF;
  uint32_t flow_label = 0;
  Gid src{};  // IPv4 addresses in IPv4-mapped form
  Gid dst{};
  uint8_t ecn() const noexcept { return tos & kEcnMask; }
};

struct L4Fields {
  uint16_t sport = 0xC000;
  uint16_t dport = kRoceV2Port;
  uint16_t csum = 0;  // RoCEv2 senders put 0 here (the ICRC covers the packet)
};

struct BthFields {
  uint8_t opcode = 0;
  bool se = false;
  bool mig = false;
  uint8_t pad = 0;  // set by the builder from the payload length; filled by the parser
  uint8_t tver = 0;
  uint16_t pkey = kDefaultPkey;
  uint8_t resv8a = 0;  // FECN (0x80), BECN (0x40), reserved
  uint32_t dqpn = 0;
  bool ackreq = false;
  uint8_t resv7 = 0;
  uint32_t psn = 0;
  bool fecn() const noexcept { return resv8a & kBthFecn; }
  bool becn() const noexcept { return resv8a & kBthBecn; }
};

struct RethFields { uint64_t va = 0; uint32_t rkey = 0; uint32_t len = 0; };
struct AethFields { uint8_t syndrome = 0; uint32_t msn = 0; };
struct AtomicFields { uint64_t va = 0; uint32_t rkey = 0; uint64_t swap_add = 0; uint64_t compare = 0; };
struct DethFields { uint32_t qkey = 0; uint8_t resv8 = 0; uint32_t sqpn = 0; };

// Extension headers; which ones are meaningful depends on the opcode.
struct ExtFields {
  RethFields reth;
  AethFields aeth;
  AtomicFields atomic;
  uint64_t atomic_orig = 0;  // AtomicAckETH
  DethFields deth;
  uint32_t imm = 0;  // ImmDt, as the 32-bit big-endian number on the wire
  uint32_t ieth_rkey = 0;
};

struct Headers {
  L2Fields l2;
  L3Fields l3;
  L4Fields l4;
  BthFields bth;
  ExtFields ext;
};

enum class ParseError : uint8_t {
  Ok = 0,
  Truncated,         // shorter than its headers say
  NotIp,             // Ethernet type is neither IPv4 nor IPv6 (ARP, LLDP, ...)
  BadIpVersion,      // version nibble does not match the Ethernet type
  BadIpHeaderLength, // IPv4 IHL < 5
  BadIpChecksum,
  BadIpLength,       // IP total/payload length exceeds the frame or is too small
  Fragmented,        // IPv4 fragment: RoCEv2 is never fragmented
  NotUdp,
  NotRocePort,       // UDP destination port is not 4791
  BadUdpLength,
  BadBthVersion,     // BTH TVer != 0
  UnknownOpcode,
  BadLength,         // bytes after the headers do not fit the opcode
  BadPadCount,
  IcrcMismatch,
  kCount
};
const char* parse_error_name(ParseError e) noexcept;

// A decoded frame. Pointers refer into the parsed buffer.
struct PacketView {
  Headers h;
  const OpcodeInfo* op = nullptr;
  const uint8_t* frame = nullptr;
  uint32_t frame_len = 0;   // bytes that belong to the frame (trailing Ethernet padding excluded)
  uint16_t l3_off = 0;
  uint16_t ip_hdr_len = 0;
  uint16_t bth_off = 0;
  uint16_t payload_off = 0;
  uint32_t payload_len = 0;  // without pad
  uint32_t icrc = 0;         // as received

  const uint8_t* bth() const noexcept { return frame + bth_off; }
  const uint8_t* payload() const noexcept { return frame + payload_off; }
  std::span<const uint8_t> payload_span() const noexcept { return {payload(), payload_len}; }
};

struct ParseOptions {
  bool verify_ip_checksum = true;
  bool verify_icrc = true;
};

ParseError parse_frame(std::span<const uint8_t> frame, PacketView& out, ParseOptions opt = {}) noexcept;

// ---- Building ----------------------------------------------------------
// Size of the header stack (Ethernet .. last extension header) for h.
size_t header_len(const Headers& h) noexcept;
// Whole frame size for a payload of payload_len bytes (headers, payload, pad, ICRC).
size_t frame_len(const Headers& h, uint32_t payload_len) noexcept;

// Writes Ethernet .. extension headers for a packet carrying payload_len bytes:
// lengths, pad count and the IPv4 checksum are computed here (h.bth.pad is
// ignored). Returns the bytes written, or 0 if `out` is too small or the opcode
// is invalid. The caller appends payload, pad and ICRC (see finish_frame).
size_t build_headers(std::span<uint8_t> out, const Headers& h, uint32_t payload_len) noexcept;

// Zeroes the pad after the payload and writes the ICRC over a frame whose
// headers and payload are in place. Returns the frame length.
size_t finish_frame(std::span<uint8_t> frame, const Headers& h, uint32_t payload_len) noexcept;

// finish_frame for a frame whose payload is not behind its headers (zero-copy
// TX: headers in one buffer, the payload in registered memory, pad + ICRC in a
// third segment). hdr spans the bytes build_headers wrote; the ICRC is
// computed over hdr, payload and pad, and pad + ICRC are written to tail
// (room for 7 bytes). Returns the tail length (pad + 4).
size_t finish_frame_ext(std::span<const uint8_t> hdr, const Headers& h, const uint8_t* payload,
                        uint32_t payload_len, uint8_t* tail) noexcept;

// build_headers + payload copy + finish_frame. Returns the frame length or 0.
size_t build_frame(std::span<uint8_t> out, const Headers& h, std::span<const uint8_t> payload) noexcept;

inline constexpr uint8_t pad_for(uint32_t payload_len) noexcept {
  return static_cast<uint8_t>((4 - (payload_len & 3)) & 3);
}

uint16_t ipv4_checksum(const uint8_t* hdr, size_t len) noexcept;

}  // namespace droce::wire

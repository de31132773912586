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
#include <cstring>
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

// The BTH opcode and destination QPN of a RoCEv2 frame, read at their offsets
// (Ethernet [802.1Q] IPv4/IPv6 UDP to 4791) with no other check: a hint to
// prefetch the QP a burst's frames go to before parse_frame runs on them.
// False when the frame is not laid out as a RoCEv2 frame or is too short.
inline bool peek_bth(const uint8_t* f, uint32_t len, uint8_t& opcode, uint32_t& dqpn) noexcept {
  if (len < 14) return false;
  uint32_t l2 = 14;
  uint16_t type = static_cast<uint16_t>(f[12] << 8 | f[13]);
  if (type == kEtherTypeVlan) {
    if (len < 18) return false;
    type = static_cast<uint16_t>(f[16] << 8 | f[17]);
    l2 = 18;
  }
  uint32_t l3;
  if (type == kEtherTypeIpv4) {
    if (len < l2 + 20) return false;
    l3 = (f[l2] & 0x0Fu) * 4;
  } else if (type == kEtherTypeIpv6) {
    l3 = 40;
  } else {
    return false;
  }
  const uint32_t bth = l2 + l3 + 8;
  if (len < bth + 12 || (f[bth - 6] << 8 | f[bth - 5]) != kRoceV2Port) return false;
  opcode = f[bth];
  dqpn = uint32_t{f[bth + 5]} << 16 | uint32_t{f[bth + 6]} << 8 | f[bth + 7];
  return true;
}

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

// ---- Building from a prebuilt header (connected QPs) ----------------------
// What changes from one packet of a connected QP to the next: the BTH's
// opcode, SE, AckReq, resv7 and PSN, and the extension headers. The rest of
// the BTH (P_Key, destination QP, MigReq, TVer, FECN/BECN) and everything
// below it come from the QP's TxTemplate.
struct PacketFields {
  uint8_t opcode = 0;
  bool se = false;
  bool ackreq = false;
  uint8_t resv7 = 0;
  uint32_t psn = 0;
  ExtFields ext;
};

// Ethernet [+ 802.1Q] + IPv6 + UDP + BTH = 78 bytes at most.
inline constexpr size_t kTemplateBytes = 80;
// The header bytes a TxTemplate holds on its first cache line (after its 8
// bytes of fields): an IPv4 path's Ethernet .. BTH without a VLAN tag (54).
inline constexpr size_t kTemplateLine = 56;

// A connected QP's header bytes, built once when its path is set (RTR, or a
// change of ECN marking): Ethernet .. BTH with the lengths, the IPv4 checksum
// and the per-packet BTH fields zero. A packet copies them and patches those
// in: the IPv4 checksum incrementally from the sum of the fixed words.
//
// The fields come first and the bytes right after them, so that a packet on an
// IPv4 path without a VLAN tag (54 header bytes) reads one cache line of it
// (kTemplateLine), and so does from_peer's check of a received one.
struct TxTemplate {
  uint32_t ip_sum = 0;  // IPv4: ones' complement sum of the header's 16-bit words as they lie in memory
  uint8_t l2_len = 0;   // Ethernet [+ 802.1Q]
  uint8_t l3_len = 0;   // IPv4 or IPv6 header
  bool ipv6 = false;
  uint8_t bth_flags = 0;  // the BTH's MigReq and TVer bits
  uint8_t bytes[kTemplateBytes]{};  // the path's addresses among them (from_peer reads them there)

  size_t bth_off() const noexcept { return size_t{l2_len} + l3_len + 8; }
  uint8_t tos() const noexcept {  // IPv4 TOS or IPv6 traffic class
    const uint8_t* ip = bytes + l2_len;
    return ipv6 ? static_cast<uint8_t>((ip[0] & 0x0F) << 4 | ip[1] >> 4) : ip[1];
  }
  // Whether a received packet's addresses are this path's, reversed: its
  // source the path's destination and its destination the path's source, of
  // the same IP version (rxe check_addr). Reads the addresses in the header bytes.
  bool from_peer(const L3Fields& l3) const noexcept {
    if (l3.ipv6 != ipv6) return false;
    const uint8_t* ip = bytes + l2_len;
    if (ipv6) return std::memcmp(ip + 8, l3.dst.data(), 16) == 0 && std::memcmp(ip + 24, l3.src.data(), 16) == 0;
    return std::memcmp(ip + 12, &l3.dst[12], 4) == 0 && std::memcmp(ip + 16, &l3.src[12], 4) == 0;
  }
  MacAddr src_mac() const noexcept {
    MacAddr m;
    for (size_t i = 0; i < m.size(); ++i) m[i] = bytes[6 + i];
    return m;
  }
};

static_assert(offsetof(TxTemplate, bytes) + kTemplateLine == 64, "TxTemplate: the IPv4 header bytes on its first line");

// The template of h's Ethernet .. UDP fields and its BTH's fixed fields.
void make_template(TxTemplate& t, const Headers& h) noexcept;
// f applied to h's BTH and extension headers (h's addressing is left as is).
void apply_fields(Headers& h, const PacketFields& f) noexcept;

// Where a frame's parts lie: enough to finish it (pad + ICRC).
struct FrameShape {
  uint16_t l2_len = 0;
  uint16_t l3_len = 0;
  uint16_t hdr_len = 0;  // Ethernet .. last extension header
  bool ipv6 = false;
  bool payload = false;  // the opcode carries a payload (and so a pad count)
};
FrameShape frame_shape(const Headers& h) noexcept;
FrameShape frame_shape(const TxTemplate& t, uint8_t opcode) noexcept;
inline size_t frame_len(const FrameShape& s, uint32_t payload_len) noexcept {
  return size_t{s.hdr_len} + payload_len + (s.payload ? pad_for(payload_len) : 0) + kIcrcSize;
}

// build_headers from a template: the same bytes as build_headers of the
// Headers the template was made from with f applied. Returns the header length
// or 0 (out too small, invalid opcode).
size_t build_headers(std::span<uint8_t> out, const TxTemplate& t, const PacketFields& f, uint32_t payload_len) noexcept;
// finish_frame / finish_frame_ext for a frame of the given shape.
size_t finish_frame(std::span<uint8_t> frame, const FrameShape& s, uint32_t payload_len) noexcept;
size_t finish_frame_ext(std::span<const uint8_t> hdr, const FrameShape& s, const uint8_t* payload,
                        uint32_t payload_len, uint8_t* tail) noexcept;


uint16_t ipv4_checksum(const uint8_t* hdr, size_t len) noexcept;

}  // namespace droce::wire

#include "wire/packet.h"

#include <endian.h>

#include <cstring>

#include "wire/icrc.h"

namespace droce::wire {
namespace {

template <typename T>
inline T load(const uint8_t* p) noexcept {
  T t;
  std::memcpy(&t, p, sizeof(T));
  return t;
}
template <typename T>
inline void store(uint8_t* p, const T& t) noexcept {
  std::memcpy(p, &t, sizeof(T));
}

constexpr const char* kParseErrorNames[] = {
    "ok",           "truncated",      "not_ip",         "bad_ip_version", "bad_ip_header_length",
    "bad_ip_checksum", "bad_ip_length", "fragmented",   "not_udp",        "not_roce_port",
    "bad_udp_length", "bad_bth_version", "unknown_opcode", "bad_length",  "bad_pad_count",
    "icrc_mismatch",
};
static_assert(std::size(kParseErrorNames) == static_cast<size_t>(ParseError::kCount));

void decode_ext(const uint8_t* bth, const OpcodeInfo& op, ExtFields& e) noexcept {
  if (op.off_deth) {
    const auto d = load<Deth>(bth + op.off_deth);
    e.deth = {d.qkey.get(), d.resv8(), d.sqpn()};
  }
  if (op.off_reth) {
    const auto r = load<Reth>(bth + op.off_reth);
    e.reth = {r.va.get(), r.rkey.get(), r.dma_len.get()};
  }
  if (op.off_atomic) {
    const auto a = load<AtomicEth>(bth + op.off_atomic);
    e.atomic = {a.va.get(), a.rkey.get(), a.swap_add.get(), a.compare.get()};
  }
  if (op.off_aeth) {
    const auto a = load<Aeth>(bth + op.off_aeth);
    e.aeth = {a.syndrome(), a.msn()};
  }
  if (op.off_atomic_ack) e.atomic_orig = load<AtomicAckEth>(bth + op.off_atomic_ack).orig.get();
  if (op.off_imm) e.imm = load<ImmDt>(bth + op.off_imm).imm.get();
  if (op.off_ieth) e.ieth_rkey = load<Ieth>(bth + op.off_ieth).rkey.get();
}

void encode_ext(uint8_t* bth, const OpcodeInfo& op, const ExtFields& e) noexcept {
  if (op.off_deth) {
    Deth d;
    d.qkey.set(e.deth.qkey);
    d.sqpn_word.set((uint32_t{e.deth.resv8} << 24) | (e.deth.sqpn & kMask24));
    store(bth + op.off_deth, d);
  }
  if (op.off_reth) {
    Reth r;
    r.va.set(e.reth.va);
    r.rkey.set(e.reth.rkey);
    r.dma_len.set(e.reth.len);
    store(bth + op.off_reth, r);
  }
  if (op.off_atomic) {
    AtomicEth a;
    a.va.set(e.atomic.va);
    a.rkey.set(e.atomic.rkey);
    a.swap_add.set(e.atomic.swap_add);
    a.compare.set(e.atomic.compare);
    store(bth + op.off_atomic, a);
  }
  if (op.off_aeth) {
    Aeth a;
    a.set(e.aeth.syndrome, e.aeth.msn);
    store(bth + op.off_aeth, a);
  }
  if (op.off_atomic_ack) {
    AtomicAckEth a;
    a.orig.set(e.atomic_orig);
    store(bth + op.off_atomic_ack, a);
  }
  if (op.off_imm) {
    ImmDt i;
    i.imm.set(e.imm);
    store(bth + op.off_imm, i);
  }
  if (op.off_ieth) {
    Ieth i;
    i.rkey.set(e.ieth_rkey);
    store(bth + op.off_ieth, i);
  }
  if (op.flags & kOpCnpResv) *reinterpret_cast<CnpBody*>(bth + sizeof(Bth)) = CnpBody{};
}

inline size_t l2_len(const Headers& h) noexcept { return sizeof(EthHdr) + (h.l2.vlan ? sizeof(VlanTag) : 0); }
inline size_t l3_len(const Headers& h) noexcept { return h.l3.ipv6 ? sizeof(Ipv6Hdr) : sizeof(Ipv4Hdr); }

}  // namespace

const char* parse_error_name(ParseError e) noexcept {
  const auto i = static_cast<size_t>(e);
  return i < std::size(kParseErrorNames) ? kParseErrorNames[i] : "unknown";
}

uint16_t ipv4_checksum(const uint8_t* hdr, size_t len) noexcept {
  // Ones' complement sums are byte-order independent (RFC 1071): add 32-bit
  // words as they lie in memory, fold, and swap the 16-bit result once.
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 4 <= len; i += 4) {
    uint32_t w;
    std::memcpy(&w, hdr + i, 4);
    sum += w;
  }
  for (; i + 2 <= len; i += 2) {
    uint16_t w;
    std::memcpy(&w, hdr + i, 2);
    sum += w;
  }
  if (i < len) {
    const uint8_t last[2] = {hdr[i], 0};
    uint16_t w;
    std::memcpy(&w, last, 2);
    sum += w;
  }
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  const auto native = static_cast<uint16_t>(~sum);
  return static_cast<uint16_t>(be16toh(native));
}

ParseError parse_frame(std::span<const uint8_t> frame, PacketView& v, ParseOptions opt) noexcept {
  const uint8_t* p = frame.data();
  const size_t n = frame.size();
  if (n < sizeof(EthHdr)) return ParseError::Truncated;
  // The MACs straight from the frame: a copy of the 14-byte Ethernet header
  // into a local first compiles to overlapping 8-byte stack moves whose
  // reloads miss store forwarding (three stalls, half of this function's time).
  std::memcpy(v.h.l2.dst.data(), p, 6);
  std::memcpy(v.h.l2.src.data(), p + 6, 6);
  uint16_t et = static_cast<uint16_t>(uint16_t{p[12]} << 8 | p[13]);
  size_t off = sizeof(EthHdr);
  v.h.l2.vlan = false;
  v.h.l2.vlan_tci = 0;
  if (et == kEtherTypeVlan) {
    if (n < off + sizeof(VlanTag)) return ParseError::Truncated;
    const auto tag = load<VlanTag>(p + off);
    v.h.l2.vlan = true;
    v.h.l2.vlan_tci = tag.tci.get();
    et = tag.ethertype.get();
    off += sizeof(VlanTag);
  }
  v.l3_off = static_cast<uint16_t>(off);
  L3Fields& l3 = v.h.l3;
  size_t l4_off = 0, ip_end = 0;
  if (et == kEtherTypeIpv4) {
    if (n < off + sizeof(Ipv4Hdr)) return ParseError::Truncated;
    const auto ip = load<Ipv4Hdr>(p + off);
    if (ip.version() != 4) return ParseError::BadIpVersion;
    const size_t ihl = size_t{ip.ihl()} * 4;
    if (ihl < sizeof(Ipv4Hdr)) return ParseError::BadIpHeaderLength;
    if (n < off + ihl) return ParseError::Truncated;
    if (opt.verify_ip_checksum && ipv4_checksum(p + off, ihl) != 0) return ParseError::BadIpChecksum;
    const size_t tot = ip.total_len.get();
    if (tot < ihl + sizeof(UdpHdr)) return ParseError::BadIpLength;
    if (off + tot > n) return ParseError::Truncated;
    const uint16_t frag = ip.frag_off.get();
    if ((frag & kIpv4FlagMF) || (frag & kIpv4OffsetMask)) return ParseError::Fragmented;
    if (ip.proto != kIpProtoUdp) return ParseError::NotUdp;
    l3.ipv6 = false;
    l3.tos = ip.tos;
    l3.ttl = ip.ttl;
    l3.ip_id = ip.id.get();
    l3.ip_frag = frag;
    l3.flow_label = 0;
    l3.src = Gid{};
    l3.dst = Gid{};
    l3.src[10] = l3.src[11] = l3.dst[10] = l3.dst[11] = 0xFF;
    std::memcpy(&l3.src[12], ip.src.data(), 4);
    std::memcpy(&l3.dst[12], ip.dst.data(), 4);
    v.ip_hdr_len = static_cast<uint16_t>(ihl);
    l4_off = off + ihl;
    ip_end = off + tot;
  } else if (et == kEtherTypeIpv6) {
    if (n < off + sizeof(Ipv6Hdr)) return ParseError::Truncated;
    const auto ip = load<Ipv6Hdr>(p + off);
    if (ip.version() != 6) return ParseError::BadIpVersion;
    const size_t plen = ip.payload_len.get();
    if (plen < sizeof(UdpHdr)) return ParseError::BadIpLength;
    if (off + sizeof(Ipv6Hdr) + plen > n) return ParseError::Truncated;
    if (ip.next_header != kIpProtoUdp) return ParseError::NotUdp;
    l3.ipv6 = true;
    l3.tos = ip.traffic_class();
    l3.ttl = ip.hop_limit;
    l3.ip_id = 0;
    l3.ip_frag = 0;
    l3.flow_label = ip.flow_label();
    l3.src = ip.src;
    l3.dst = ip.dst;
    v.ip_hdr_len = sizeof(Ipv6Hdr);
    l4_off = off + sizeof(Ipv6Hdr);
    ip_end = l4_off + plen;
  } else {
    return ParseError::NotIp;
  }

  const auto udp = load<UdpHdr>(p + l4_off);
  v.h.l4 = {udp.sport.get(), udp.dport.get(), udp.check.get()};
  if (v.h.l4.dport != kRoceV2Port) return ParseError::NotRocePort;
  if (udp.len.get() != ip_end - l4_off) return ParseError::BadUdpLength;

  const size_t bth_off = l4_off + sizeof(UdpHdr);
  if (bth_off + sizeof(Bth) > ip_end) return ParseError::Truncated;
  const auto bth = load<Bth>(p + bth_off);
  if (bth.tver() != 0) return ParseError::BadBthVersion;
  const OpcodeInfo& op = kOpcodeTable[bth.opcode];
  if (!op.valid()) return ParseError::UnknownOpcode;
  const size_t hdr_end = bth_off + op.hdr_len;
  if (hdr_end + kIcrcSize > ip_end) return ParseError::Truncated;
  const size_t rest = ip_end - kIcrcSize - hdr_end;  // payload + pad
  const uint8_t pad = bth.pad();
  if (!(op.flags & kOpPayload)) {
    if (rest != 0) return ParseError::BadLength;
    if (pad != 0) return ParseError::BadPadCount;
  } else {
    if (rest & 3) return ParseError::BadLength;
    if (pad > rest) return ParseError::BadPadCount;
    if (pad != 0 && !(op.flags & kOpLast)) return ParseError::BadPadCount;
  }

  BthFields& b = v.h.bth;
  b.opcode = bth.opcode;
  b.se = bth.se();
  b.mig = bth.mig();
  b.pad = pad;
  b.tver = bth.tver();
  b.pkey = bth.pkey.get();
  b.resv8a = bth.resv8a();
  b.dqpn = bth.dqpn();
  b.ackreq = bth.ackreq();
  b.resv7 = bth.resv7();
  b.psn = bth.psn();
  decode_ext(p + bth_off, op, v.h.ext);

  v.op = &op;
  v.frame = p;
  v.frame_len = static_cast<uint32_t>(ip_end);
  v.bth_off = static_cast<uint16_t>(bth_off);
  v.payload_off = static_cast<uint16_t>(hdr_end);
  v.payload_len = static_cast<uint32_t>(rest - pad);
  v.icrc = icrc_load(p + ip_end - kIcrcSize);
  if (opt.verify_icrc) {
    const uint32_t c = icrc_compute({p + off, ip_end - kIcrcSize - off}, v.ip_hdr_len, l3.ipv6);
    if (c != v.icrc) return ParseError::IcrcMismatch;
  }
  return ParseError::Ok;
}

size_t header_len(const Headers& h) noexcept {
  return l2_len(h) + l3_len(h) + sizeof(UdpHdr) + kOpcodeTable[h.bth.opcode].hdr_len;
}

size_t frame_len(const Headers& h, uint32_t payload_len) noexcept {
  return header_len(h) + payload_len + pad_for(payload_len) + kIcrcSize;
}

size_t build_headers(std::span<uint8_t> out, const Headers& h, uint32_t payload_len) noexcept {
  const OpcodeInfo& op = kOpcodeTable[h.bth.opcode];
  if (!op.valid()) return 0;
  const size_t hlen = header_len(h);
  if (out.size() < hlen) return 0;
  uint8_t* p = out.data();
  const uint8_t pad = (op.flags & kOpPayload) ? pad_for(payload_len) : 0;
  const size_t udp_len = sizeof(UdpHdr) + op.hdr_len + payload_len + pad + kIcrcSize;

  EthHdr eth;
  eth.dst = h.l2.dst;
  eth.src = h.l2.src;
  eth.ethertype.set(h.l2.vlan ? kEtherTypeVlan : (h.l3.ipv6 ? kEtherTypeIpv6 : kEtherTypeIpv4));
  store(p, eth);
  size_t off = sizeof(EthHdr);
  if (h.l2.vlan) {
    VlanTag tag;
    tag.tci.set(h.l2.vlan_tci);
    tag.ethertype.set(h.l3.ipv6 ? kEtherTypeIpv6 : kEtherTypeIpv4);
    store(p + off, tag);
    off += sizeof(VlanTag);
  }
  if (h.l3.ipv6) {
    Ipv6Hdr ip;
    ip.ver_tc_flow.set((6u << 28) | (uint32_t{h.l3.tos} << 20) | (h.l3.flow_label & 0xFFFFF));
    ip.payload_len.set(static_cast<uint16_t>(udp_len));
    ip.next_header = kIpProtoUdp;
    ip.hop_limit = h.l3.ttl;
    ip.src = h.l3.src;
    ip.dst = h.l3.dst;
    store(p + off, ip);
    off += sizeof(Ipv6Hdr);
  } else {
    Ipv4Hdr ip;
    ip.ver_ihl = 0x45;
    ip.tos = h.l3.tos;
    ip.total_len.set(static_cast<uint16_t>(sizeof(Ipv4Hdr) + udp_len));
    ip.id.set(h.l3.ip_id);
    ip.frag_off.set(h.l3.ip_frag);
    ip.ttl = h.l3.ttl;
    ip.proto = kIpProtoUdp;
    std::memcpy(ip.src.data(), &h.l3.src[12], 4);
    std::memcpy(ip.dst.data(), &h.l3.dst[12], 4);
    store(p + off, ip);
    const uint16_t cs = ipv4_checksum(p + off, sizeof(Ipv4Hdr));
    p[off + 10] = static_cast<uint8_t>(cs >> 8);
    p[off + 11] = static_cast<uint8_t>(cs);
    off += sizeof(Ipv4Hdr);
  }
  UdpHdr udp;
  udp.sport.set(h.l4.sport);
  udp.dport.set(h.l4.dport);
  udp.len.set(static_cast<uint16_t>(udp_len));
  udp.check.set(h.l4.csum);
  store(p + off, udp);
  off += sizeof(UdpHdr);

  Bth bth;
  bth.opcode = h.bth.opcode;
  bth.set_flags(h.bth.se, h.bth.mig, pad, h.bth.tver);
  bth.pkey.set(h.bth.pkey);
  bth.set_fb_qpn(h.bth.resv8a, h.bth.dqpn);
  bth.set_a_psn(h.bth.ackreq, h.bth.resv7, h.bth.psn);
  store(p + off, bth);
  encode_ext(p + off, op, h.ext);
  return hlen;
}

FrameShape frame_shape(const Headers& h) noexcept {
  FrameShape s;
  s.l2_len = static_cast<uint16_t>(l2_len(h));
  s.l3_len = static_cast<uint16_t>(l3_len(h));
  s.hdr_len = static_cast<uint16_t>(s.l2_len + s.l3_len + sizeof(UdpHdr) + kOpcodeTable[h.bth.opcode].hdr_len);
  s.ipv6 = h.l3.ipv6;
  s.payload = kOpcodeTable[h.bth.opcode].flags & kOpPayload;
  return s;
}

FrameShape frame_shape(const TxTemplate& t, uint8_t opcode) noexcept {
  FrameShape s;
  s.l2_len = t.l2_len;
  s.l3_len = t.l3_len;
  s.hdr_len = static_cast<uint16_t>(t.bth_off() + kOpcodeTable[opcode].hdr_len);
  s.ipv6 = t.ipv6;
  s.payload = kOpcodeTable[opcode].flags & kOpPayload;
  return s;
}

size_t finish_frame(std::span<uint8_t> frame, const FrameShape& s, uint32_t payload_len) noexcept {
  const uint8_t pad = s.payload ? pad_for(payload_len) : 0;
  const size_t body_end = size_t{s.hdr_len} + payload_len + pad;
  if (frame.size() < body_end + kIcrcSize) return 0;
  uint8_t* p = frame.data();
  std::memset(p + s.hdr_len + payload_len, 0, pad);
  const uint32_t c = icrc_compute({p + s.l2_len, body_end - s.l2_len}, s.l3_len, s.ipv6);
  icrc_store(p + body_end, c);
  return body_end + kIcrcSize;
}

size_t finish_frame(std::span<uint8_t> frame, const Headers& h, uint32_t payload_len) noexcept {
  return finish_frame(frame, frame_shape(h), payload_len);
}

size_t finish_frame_ext(std::span<const uint8_t> hdr, const FrameShape& s, const uint8_t* payload,
                        uint32_t payload_len, uint8_t* tail) noexcept {
  const uint8_t pad = s.payload ? pad_for(payload_len) : 0;
  const size_t l3 = s.l2_len;
  if (hdr.size() < s.hdr_len || s.hdr_len <= l3) return 0;
  // The masked part (IP, UDP, BTH) then the extension headers, as icrc_compute does.
  IcrcState c = icrc_begin(hdr.data() + l3, s.l3_len, s.ipv6);
  const size_t masked_end = l3 + s.l3_len + 8 + 12;  // IP + UDP + BTH
  icrc_update(c, hdr.data() + masked_end, s.hdr_len - masked_end);
  if (payload_len) icrc_update(c, payload, payload_len);
  for (uint8_t i = 0; i < pad; ++i) tail[i] = 0;
  if (pad) icrc_update(c, tail, pad);
  icrc_store(tail + pad, icrc_finish(c));
  return size_t{pad} + kIcrcSize;
}

size_t finish_frame_ext(std::span<const uint8_t> hdr, const Headers& h, const uint8_t* payload,
                        uint32_t payload_len, uint8_t* tail) noexcept {
  return finish_frame_ext(hdr, frame_shape(h), payload, payload_len, tail);
}

void make_template(TxTemplate& t, const Headers& h) noexcept {
  t = TxTemplate{};
  Headers b = h;
  b.bth.opcode = op::RC_ACKNOWLEDGE;  // any valid opcode: only Ethernet .. BTH are kept
  b.bth.se = false;
  b.bth.pad = 0;
  b.bth.ackreq = false;
  b.bth.resv7 = 0;
  b.bth.psn = 0;
  uint8_t tmp[kTemplateBytes + 8];
  build_headers({tmp, sizeof(tmp)}, b, 0);
  t.l2_len = static_cast<uint8_t>(l2_len(h));
  t.l3_len = static_cast<uint8_t>(l3_len(h));
  t.ipv6 = h.l3.ipv6;
  const size_t bth = t.bth_off();
  std::memcpy(t.bytes, tmp, bth + sizeof(Bth));
  uint8_t* ip = t.bytes + t.l2_len;
  if (t.ipv6) {
    ip[4] = ip[5] = 0;  // payload length
  } else {
    ip[2] = ip[3] = ip[10] = ip[11] = 0;  // total length, checksum
    uint32_t sum = 0;
    for (size_t i = 0; i < sizeof(Ipv4Hdr); i += 2) {
      uint16_t w;
      std::memcpy(&w, ip + i, 2);
      sum += w;
    }
    t.ip_sum = sum;
  }
  uint8_t* udp = ip + t.l3_len;
  udp[4] = udp[5] = 0;  // length
  t.bytes[bth] = 0;     // opcode
  t.bth_flags = static_cast<uint8_t>(t.bytes[bth + 1] & 0x4F);  // MigReq, TVer
  t.bytes[bth + 1] = 0;
  std::memset(t.bytes + bth + 8, 0, 4);  // AckReq, resv7, PSN
}

void apply_fields(Headers& h, const PacketFields& f) noexcept {
  h.bth.opcode = f.opcode;
  h.bth.se = f.se;
  h.bth.ackreq = f.ackreq;
  h.bth.resv7 = f.resv7;
  h.bth.psn = f.psn;
  h.ext = f.ext;
}

size_t build_headers(std::span<uint8_t> out, const TxTemplate& t, const PacketFields& f, uint32_t payload_len) noexcept {
  const OpcodeInfo& op = kOpcodeTable[f.opcode];
  if (!op.valid()) return 0;
  const size_t bth = t.bth_off();
  const size_t hlen = bth + op.hdr_len;
  if (out.size() < hlen) return 0;
  uint8_t* p = out.data();
  if (bth + sizeof(Bth) <= kTemplateLine && out.size() >= kTemplateLine) {
    std::memcpy(p, t.bytes, kTemplateLine);  // fixed sizes: a few vector moves, one cache line of t
  } else if (out.size() >= kTemplateBytes) {
    std::memcpy(p, t.bytes, kTemplateBytes);
  } else {
    std::memcpy(p, t.bytes, bth + sizeof(Bth));
  }
  const uint8_t pad = (op.flags & kOpPayload) ? pad_for(payload_len) : 0;
  const uint32_t udp_len = static_cast<uint32_t>(sizeof(UdpHdr) + op.hdr_len + payload_len + pad + kIcrcSize);
  uint8_t* ip = p + t.l2_len;
  if (t.ipv6) {
    const uint16_t v = htobe16(static_cast<uint16_t>(udp_len));
    std::memcpy(ip + 4, &v, 2);
  } else {
    const uint16_t tot = htobe16(static_cast<uint16_t>(sizeof(Ipv4Hdr) + udp_len));
    std::memcpy(ip + 2, &tot, 2);
    uint32_t sum = t.ip_sum + tot;
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    const auto cs = static_cast<uint16_t>(~sum);
    std::memcpy(ip + 10, &cs, 2);
  }
  const uint16_t ul = htobe16(static_cast<uint16_t>(udp_len));
  std::memcpy(ip + t.l3_len + 4, &ul, 2);
  uint8_t* b = p + bth;
  b[0] = f.opcode;
  b[1] = static_cast<uint8_t>(t.bth_flags | (f.se ? 0x80 : 0) | (pad << 4));
  const uint32_t a_psn = htobe32((f.ackreq ? 0x80000000u : 0u) | (uint32_t{f.resv7 & 0x7Fu} << 24) | (f.psn & kMask24));
  std::memcpy(b + 8, &a_psn, 4);
  encode_ext(b, op, f.ext);
  return hlen;
}

size_t build_frame(std::span<uint8_t> out, const Headers& h, std::span<const uint8_t> payload) noexcept {
  const auto plen = static_cast<uint32_t>(payload.size());
  if (out.size() < frame_len(h, plen)) return 0;
  const size_t hlen = build_headers(out, h, plen);
  if (hlen == 0) return 0;
  if (plen) std::memcpy(out.data() + hlen, payload.data(), plen);
  return finish_frame(out, h, plen);
}

}  // namespace droce::wire

#include "dump.h"

#include <arpa/inet.h>
#include <pcap/dlt.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstring>
#include <nlohmann/json.hpp>

#include "verbs/verbs.h"
#include "wire/icrc.h"
#include "wire/packet.h"

namespace droce::dump {
namespace {

using json = nlohmann::ordered_json;
using namespace droce::wire;

__attribute__((format(printf, 2, 3))) void add(std::string& s, const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) s.append(buf, std::min(static_cast<size_t>(n), sizeof buf - 1));
}

std::string hex(uint64_t v, int digits) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%0*" PRIx64, digits, v);
  return b;
}

uint16_t be16(const uint8_t* p) noexcept { return static_cast<uint16_t>((p[0] << 8) | p[1]); }

// What a frame's bytes say about it before (and whether or not) it parses: is
// it UDP to port 4791 over IPv4/IPv6, its addresses, where its BTH would be.
struct Peek {
  bool roce = false;
  bool have_addr = false;
  bool ipv6 = false;
  uint8_t src[16] = {}, dst[16] = {};
  size_t bth_off = 0;
};

Peek peek(std::span<const uint8_t> f) noexcept {
  Peek k;
  const uint8_t* p = f.data();
  const size_t n = f.size();
  size_t off = sizeof(EthHdr);
  if (n < off) return k;
  uint16_t et = be16(p + 12);
  if (et == kEtherTypeVlan) {
    if (n < off + sizeof(VlanTag)) return k;
    et = be16(p + off + 2);
    off += sizeof(VlanTag);
  }
  size_t l4 = 0;
  if (et == kEtherTypeIpv4) {
    if (n < off + sizeof(Ipv4Hdr) || (p[off] >> 4) != 4) return k;
    k.have_addr = true;
    std::memcpy(k.src, p + off + 12, 4);
    std::memcpy(k.dst, p + off + 16, 4);
    const size_t ihl = size_t{p[off] & 0x0Fu} * 4;
    if (ihl < sizeof(Ipv4Hdr) || p[off + 9] != kIpProtoUdp) return k;
    if (be16(p + off + 6) & kIpv4OffsetMask) return k;  // a later fragment: no UDP header in it
    l4 = off + ihl;
  } else if (et == kEtherTypeIpv6) {
    if (n < off + sizeof(Ipv6Hdr) || (p[off] >> 4) != 6) return k;
    k.have_addr = k.ipv6 = true;
    std::memcpy(k.src, p + off + 8, 16);
    std::memcpy(k.dst, p + off + 24, 16);
    if (p[off + 6] != kIpProtoUdp) return k;
    l4 = off + sizeof(Ipv6Hdr);
  } else {
    return k;
  }
  if (n < l4 + 4) return k;
  k.roce = be16(p + l4 + 2) == kRoceV2Port;
  k.bth_off = l4 + sizeof(UdpHdr);
  return k;
}

std::string addr_str(bool ipv6, const uint8_t* a) {
  char b[INET6_ADDRSTRLEN] = {};
  inet_ntop(ipv6 ? AF_INET6 : AF_INET, a, b, sizeof b);
  return b;
}
std::string addr_str(const L3Fields& l3, bool src) {
  const Gid& g = src ? l3.src : l3.dst;
  return addr_str(l3.ipv6, l3.ipv6 ? g.data() : g.data() + 12);
}

std::string time_str(int64_t rel_us) {
  char b[40];
  const bool neg = rel_us < 0;
  const uint64_t a = neg ? 0 - static_cast<uint64_t>(rel_us) : static_cast<uint64_t>(rel_us);
  std::snprintf(b, sizeof b, "%s%" PRIu64 ".%06" PRIu64, neg ? "-" : "", a / 1000000, a % 1000000);
  return b;
}

const char* nak_name(uint8_t code) noexcept {
  switch (code) {
    case kNakPsnSeqError: return "psn_sequence_error";
    case kNakInvalidRequest: return "invalid_request";
    case kNakRemoteAccessError: return "remote_access_error";
    case kNakRemoteOperationalError: return "remote_operational_error";
    case kNakInvalidRdRequest: return "invalid_rd_request";
    default: return "reserved";
  }
}

// Why the parser rejected a frame to UDP port 4791, in words, with the values
// the frame holds where they help.
std::string error_detail(ParseError e, std::span<const uint8_t> f, uint32_t wire_len, const Peek& k) {
  std::string s;
  const uint8_t* bth = k.bth_off && k.bth_off + 2 <= f.size() ? f.data() + k.bth_off : nullptr;
  const uint8_t opc = bth ? bth[0] : 0;
  const char* opname = opcode_info(opc).name;
  switch (e) {
    case ParseError::Truncated:
      add(s, "the frame ends before its headers say it does (%zu bytes captured", f.size());
      if (f.size() < wire_len)
        add(s, " of %u on the wire: the capture's snap length cut it)", wire_len);
      else
        s += ")";
      break;
    case ParseError::BadIpVersion: s = "IP version does not match the EtherType"; break;
    case ParseError::BadIpHeaderLength: s = "IPv4 header length (IHL) below 5 words"; break;
    case ParseError::BadIpChecksum: s = "IPv4 header checksum does not verify"; break;
    case ParseError::BadIpLength: s = "IP length is longer than the frame or shorter than IP+UDP headers"; break;
    case ParseError::Fragmented: s = "IPv4 fragment (RoCEv2 packets are never fragmented)"; break;
    case ParseError::BadUdpLength: s = "UDP length does not match the IP length"; break;
    case ParseError::BadBthVersion: add(s, "BTH transport header version %u, not 0", bth ? bth[1] & 0x0Fu : 0u); break;
    case ParseError::UnknownOpcode: add(s, "BTH opcode 0x%02x is not a RoCEv2 opcode", opc); break;
    case ParseError::BadLength:
      add(s, "the bytes after the %s headers do not fit the opcode (%s)", opname,
          opcode_info(opc).flags & kOpPayload ? "payload + pad must be a multiple of 4" : "it carries no payload");
      break;
    case ParseError::BadPadCount:
      add(s, "BTH pad count %u is not allowed for %s", bth ? (bth[1] >> 4) & 3u : 0u, opname);
      break;
    default: s = parse_error_name(e); break;
  }
  return s;
}

}  // namespace

AethInfo decode_aeth(uint8_t syn) noexcept {
  AethInfo a{"reserved", static_cast<uint8_t>(syn & 0x1F), -1, 0, nullptr};
  if (syn & 0x80) return a;  // bit 7 is reserved (0)
  switch (syn & kAethKindMask) {
    case kAethAck: {
      a.kind = "ACK";
      // IBTA 9.7.7.2.1 credit count encoding: 0..30 -> the same 1-2-3-4-6-8-12... series
      // as the RNR timer table (which is in 10 us units), code 0 = 0 credits, 31 = no count.
      if (a.code == 0) a.credits = 0;
      else if (a.code != kAethCreditInvalid) a.credits = static_cast<int32_t>(verbs::rnr_timer_ns(a.code) / 10000);
      break;
    }
    case kAethRnrNak:
      a.kind = "RNR_NAK";
      a.rnr_ms = static_cast<double>(verbs::rnr_timer_ns(a.code)) / 1e6;
      break;
    case kAethNak:
      a.kind = "NAK";
      a.nak = nak_name(a.code);
      break;
    default: break;
  }
  return a;
}

bool link_supported(int dlt) noexcept {
  return dlt == DLT_EN10MB || dlt == DLT_LINUX_SLL || dlt == DLT_LINUX_SLL2 || dlt == DLT_RAW ||
         dlt == DLT_IPV4 || dlt == DLT_IPV6;
}

std::span<const uint8_t> to_ethernet(int dlt, std::span<const uint8_t> in, std::vector<uint8_t>& scratch) {
  if (dlt == DLT_EN10MB) return in;
  uint16_t et = 0;
  size_t hdr = 0;
  if (dlt == DLT_LINUX_SLL) {  // 16 bytes, protocol type last
    hdr = 16;
    if (in.size() < hdr) return {};
    et = be16(in.data() + 14);
  } else if (dlt == DLT_LINUX_SLL2) {  // 20 bytes, protocol type first
    hdr = 20;
    if (in.size() < hdr) return {};
    et = be16(in.data());
  } else {  // raw IP: the version nibble says which
    if (in.empty()) return {};
    const unsigned v = in[0] >> 4;
    et = v == 6 ? kEtherTypeIpv6 : v == 4 ? kEtherTypeIpv4 : 0;
  }
  scratch.assign(sizeof(EthHdr), 0);
  scratch[12] = static_cast<uint8_t>(et >> 8);
  scratch[13] = static_cast<uint8_t>(et);
  scratch.insert(scratch.end(), in.begin() + static_cast<std::ptrdiff_t>(hdr), in.end());
  return scratch;
}

void Dumper::begin_file(const std::string& path, bool announce) {
  file_ = path;
  files_.push_back(path);
  frame_no_ = 0;
  have_t0_ = false;
  if (announce && !opt_.json && !opt_.quiet) std::fprintf(out_, "== %s\n", path.c_str());
}

void Dumper::frame(std::span<const uint8_t> bytes, uint32_t wire_len, int64_t ts_us) {
  ++c_.frames;
  ++frame_no_;
  if (!have_t0_) {
    t0_us_ = ts_us;
    have_t0_ = true;
  }
  const std::string t = time_str(ts_us - t0_us_);

  PacketView v;
  ParseOptions po;
  po.verify_icrc = false;  // decode first, verify below: a bad ICRC still shows its fields
  const ParseError e = parse_frame(bytes, v, po);
  if (e != ParseError::Ok) {
    const Peek k = peek(bytes);
    if (e == ParseError::NotIp || e == ParseError::NotUdp || e == ParseError::NotRocePort || !k.roce) {
      ++c_.non_roce;
      return;
    }
    ++c_.malformed;
    ++c_.errors[parse_error_name(e)];
    if (opt_.quiet) return;
    const std::string detail = error_detail(e, bytes, wire_len, k);
    const std::string src = k.have_addr ? addr_str(k.ipv6, k.src) : "?";
    const std::string dst = k.have_addr ? addr_str(k.ipv6, k.dst) : "?";
    if (opt_.json) {
      json j;
      j["type"] = "malformed";
      j["file"] = file_;
      j["frame"] = frame_no_;
      j["time"] = std::stod(t);
      j["src"] = src;
      j["dst"] = dst;
      j["error"] = parse_error_name(e);
      j["detail"] = detail;
      j["caplen"] = bytes.size();
      j["len"] = wire_len;
      std::fprintf(out_, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    } else {
      std::fprintf(out_, "%6" PRIu64 " %12s %-15s -> %-15s MALFORMED %s: %s\n", frame_no_, t.c_str(), src.c_str(),
                   dst.c_str(), parse_error_name(e), detail.c_str());
    }
    return;
  }

  const uint32_t icrc = icrc_compute({v.frame + v.l3_off, v.frame_len - kIcrcSize - v.l3_off}, v.ip_hdr_len,
                                     v.h.l3.ipv6);
  const bool ok = icrc == v.icrc;
  ++c_.roce;
  ++(ok ? c_.icrc_ok : c_.icrc_bad);
  ++c_.by_opcode[v.h.bth.opcode];
  if (opt_.quiet) return;

  const OpcodeInfo& op = *v.op;
  const BthFields& b = v.h.bth;
  const ExtFields& x = v.h.ext;
  const std::string src = addr_str(v.h.l3, true), dst = addr_str(v.h.l3, false);

  if (opt_.json) {
    json j;
    j["type"] = "packet";
    j["file"] = file_;
    j["frame"] = frame_no_;
    j["time"] = std::stod(t);
    j["src"] = src;
    j["dst"] = dst;
    j["ipv6"] = v.h.l3.ipv6;
    if (v.h.l2.vlan) j["vlan"] = v.h.l2.vlan_tci & 0x0FFF;
    j["ecn"] = v.h.l3.ecn();
    j["sport"] = v.h.l4.sport;
    j["opcode"] = b.opcode;
    j["op"] = op.name;
    j["dqpn"] = b.dqpn;
    j["psn"] = b.psn;
    j["ackreq"] = b.ackreq;
    j["se"] = b.se;
    j["mig"] = b.mig;
    j["fecn"] = b.fecn();
    j["becn"] = b.becn();
    j["pkey"] = b.pkey;
    j["pad"] = b.pad;
    if (op.off_deth) j["deth"] = {{"qkey", x.deth.qkey}, {"src_qp", x.deth.sqpn}};
    if (op.off_reth) j["reth"] = {{"va", hex(x.reth.va, 16)}, {"rkey", x.reth.rkey}, {"len", x.reth.len}};
    if (op.off_atomic)
      j["atomic"] = {{"va", hex(x.atomic.va, 16)},
                     {"rkey", x.atomic.rkey},
                     {"swap_add", hex(x.atomic.swap_add, 16)},
                     {"compare", hex(x.atomic.compare, 16)}};
    if (op.off_aeth) {
      const AethInfo a = decode_aeth(x.aeth.syndrome);
      json ja;
      ja["syndrome"] = x.aeth.syndrome;
      ja["kind"] = a.kind;
      ja["code"] = a.code;
      if (a.kind == std::string_view("ACK")) ja["credits"] = a.credits >= 0 ? json(a.credits) : json(nullptr);
      if (a.kind == std::string_view("RNR_NAK")) ja["rnr_ms"] = a.rnr_ms;
      if (a.nak) ja["nak"] = a.nak;
      ja["msn"] = x.aeth.msn;
      j["aeth"] = ja;
    }
    if (op.off_atomic_ack) j["atomic_ack"] = {{"orig", hex(x.atomic_orig, 16)}};
    if (op.off_imm) j["imm"] = hex(x.imm, 8);
    if (op.off_ieth) j["ieth"] = {{"rkey", x.ieth_rkey}};
    j["payload_len"] = v.payload_len;
    j["icrc"] = ok ? "ok" : "bad";
    j["icrc_wire"] = hex(v.icrc, 8);
    j["icrc_computed"] = hex(icrc, 8);
    std::fprintf(out_, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return;
  }

  std::string s;
  add(s, "%6" PRIu64 " %12s %-15s -> %-15s %-23s qpn 0x%06x psn %8u ackreq %d", frame_no_, t.c_str(), src.c_str(),
      dst.c_str(), op.name, b.dqpn, b.psn, b.ackreq ? 1 : 0);
  if (b.se) s += " se";
  if (b.fecn()) s += " fecn";
  if (b.becn()) s += " becn";
  if (v.h.l3.ecn() == kEcnCe) s += " ce";
  if (b.pkey != kDefaultPkey) add(s, " pkey 0x%04x", b.pkey);
  if (v.h.l2.vlan) add(s, " vlan %u", v.h.l2.vlan_tci & 0x0FFFu);
  if (op.off_deth) add(s, " deth qkey 0x%08x srcqp 0x%06x", x.deth.qkey, x.deth.sqpn);
  if (op.off_reth) add(s, " reth va 0x%016" PRIx64 " rkey 0x%08x len %u", x.reth.va, x.reth.rkey, x.reth.len);
  if (op.off_atomic)
    add(s, " atomic va 0x%016" PRIx64 " rkey 0x%08x swap_add 0x%" PRIx64 " compare 0x%" PRIx64, x.atomic.va,
        x.atomic.rkey, x.atomic.swap_add, x.atomic.compare);
  if (op.off_aeth) {
    const AethInfo a = decode_aeth(x.aeth.syndrome);
    add(s, " aeth 0x%02x %s", x.aeth.syndrome, a.kind);
    if (a.kind == std::string_view("ACK")) {
      if (a.credits >= 0)
        add(s, " credits %d", a.credits);
      else
        s += " credits invalid";
    } else if (a.kind == std::string_view("RNR_NAK")) {
      add(s, " timer %u (%.2f ms)", a.code, a.rnr_ms);
    } else if (a.nak) {
      add(s, " %s", a.nak);
    }
    add(s, " msn %u", x.aeth.msn);
  }
  if (op.off_atomic_ack) add(s, " orig 0x%" PRIx64, x.atomic_orig);
  if (op.off_imm) add(s, " imm 0x%08x", x.imm);
  if (op.off_ieth) add(s, " ieth rkey 0x%08x", x.ieth_rkey);
  add(s, " payload %u icrc %s", v.payload_len, ok ? "ok" : "BAD");
  if (!ok) add(s, " (wire 0x%08x, computed 0x%08x)", v.icrc, icrc);
  std::fprintf(out_, "%s\n", s.c_str());
}

void Dumper::summary() {
  if (opt_.json) {
    json j;
    j["type"] = "summary";
    j["files"] = files_;
    j["frames"] = c_.frames;
    j["roce"] = c_.roce;
    j["icrc_ok"] = c_.icrc_ok;
    j["icrc_bad"] = c_.icrc_bad;
    j["malformed"] = c_.malformed;
    j["non_roce"] = c_.non_roce;
    json ops = json::object();
    for (int i = 0; i < 256; ++i)
      if (c_.by_opcode[static_cast<size_t>(i)])
        ops[opcode_info(static_cast<uint8_t>(i)).name] = c_.by_opcode[static_cast<size_t>(i)];
    j["by_opcode"] = ops;
    j["errors"] = json(c_.errors);
    std::fprintf(out_, "%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return;
  }
  if (!opt_.quiet && c_.frames) std::fprintf(out_, "\n");
  std::fprintf(out_,
               "summary: %" PRIu64 " frames, %" PRIu64 " RoCEv2 packets, %" PRIu64 " icrc bad, %" PRIu64
               " malformed, %" PRIu64 " non-RoCE\n",
               c_.frames, c_.roce, c_.icrc_bad, c_.malformed, c_.non_roce);
  for (int i = 0; i < 256; ++i)
    if (c_.by_opcode[static_cast<size_t>(i)])
      std::fprintf(out_, "  %-26s %8" PRIu64 "\n", opcode_info(static_cast<uint8_t>(i)).name,
                   c_.by_opcode[static_cast<size_t>(i)]);
  for (const auto& [name, n] : c_.errors) std::fprintf(out_, "  malformed %-16s %8" PRIu64 "\n", name.c_str(), n);
}

}  // namespace droce::dump

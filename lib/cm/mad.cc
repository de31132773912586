// CM MAD codec. Each message's layout is written once, as a list of
// (byte offset, bit offset, width) fields in the order of the IBTA tables
// (vol. 1 ch. 12.6; offsets from the start of the CM payload, bits MSB first);
// the same list drives the decoder and the encoder.
#include "cm/mad.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

namespace droce::cm {

namespace {

// N bits at bit position pos (MSB first) of a big-endian byte string, N <= 64,
// (pos % 8) + N <= 64. The caller guarantees the bytes exist (every offset is
// a constant inside the 256-byte MAD, whose size is checked first).
uint64_t get_bits(const uint8_t* p, size_t pos, unsigned n) noexcept {
  const size_t first = pos / 8;
  const unsigned lead = pos % 8;
  const unsigned nbytes = (lead + n + 7) / 8;
  assert(n >= 1 && n <= 64 && lead + n <= 64);
  uint64_t acc = 0;
  for (unsigned i = 0; i < nbytes; ++i) acc = (acc << 8) | p[first + i];
  acc >>= nbytes * 8 - lead - n;
  return n == 64 ? acc : acc & ((uint64_t{1} << n) - 1);
}

void put_bits(uint8_t* p, size_t pos, unsigned n, uint64_t v) noexcept {
  const size_t first = pos / 8;
  const unsigned lead = pos % 8;
  const unsigned nbytes = (lead + n + 7) / 8;
  assert(n >= 1 && n <= 64 && lead + n <= 64);
  const unsigned shift = nbytes * 8 - lead - n;
  const uint64_t mask = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
  uint64_t acc = 0;
  for (unsigned i = 0; i < nbytes; ++i) acc = (acc << 8) | p[first + i];
  acc = (acc & ~(mask << shift)) | ((v & mask) << shift);
  for (unsigned i = nbytes; i-- > 0;) {
    p[first + i] = static_cast<uint8_t>(acc);
    acc >>= 8;
  }
}

// Reads fields out of a MAD (already known to be >= 256 bytes).
class Reader {
 public:
  explicit Reader(const uint8_t* mad) noexcept : p_(mad) {}
  // Field of the CM payload at (byte, bit) of `bits` width.
  template <typename T>
  void f(size_t byte, unsigned bit, unsigned bits, T& v) const noexcept {
    const uint64_t x = get_bits(p_, (kMadHdrSize + byte) * 8 + bit, bits);
    if constexpr (std::is_same_v<T, bool>) {
      v = x != 0;
    } else {
      v = static_cast<T>(x);
    }
  }
  template <size_t N>
  void bytes(size_t byte, uint8_t (&v)[N]) const noexcept {
    std::memcpy(v, p_ + kMadHdrSize + byte, N);
  }
  void bytes(size_t byte, wire::Gid& g) const noexcept { std::memcpy(g.data(), p_ + kMadHdrSize + byte, g.size()); }

 private:
  const uint8_t* p_;
};

// Writes fields into a zeroed MAD.
class Writer {
 public:
  explicit Writer(uint8_t* mad) noexcept : p_(mad) {}
  template <typename T>
  void f(size_t byte, unsigned bit, unsigned bits, const T& v) const noexcept {
    uint64_t x;
    if constexpr (std::is_enum_v<T>) {
      x = static_cast<uint64_t>(v);
    } else {
      x = v;
    }
    put_bits(p_, (kMadHdrSize + byte) * 8 + bit, bits, x);
  }
  template <size_t N>
  void bytes(size_t byte, const uint8_t (&v)[N]) const noexcept {
    std::memcpy(p_ + kMadHdrSize + byte, v, N);
  }
  void bytes(size_t byte, const wire::Gid& g) const noexcept {
    std::memcpy(p_ + kMadHdrSize + byte, g.data(), g.size());
  }

 private:
  uint8_t* p_;
};

// ---- Layouts (IBTA vol. 1 tables 106..120) ----------------------------------

template <typename IO, typename P>
void path_fields(const IO& io, size_t base, P& p) {
  io.f(base + 0, 0, 16, p.local_lid);
  io.f(base + 2, 0, 16, p.remote_lid);
  io.bytes(base + 4, p.local_gid);
  io.bytes(base + 20, p.remote_gid);
  io.f(base + 36, 0, 20, p.flow_label);
  io.f(base + 39, 2, 6, p.packet_rate);
  io.f(base + 40, 0, 8, p.traffic_class);
  io.f(base + 41, 0, 8, p.hop_limit);
  io.f(base + 42, 0, 4, p.sl);
  io.f(base + 42, 4, 1, p.subnet_local);
  io.f(base + 43, 0, 5, p.local_ack_timeout);
}
constexpr size_t kReqPrimaryPath = 52, kReqAlternatePath = 96, kReqPathSize = 44;

template <typename IO, typename M>
void req_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(8, 0, 64, m.service_id);
  io.f(16, 0, 64, m.local_ca_guid);
  io.f(28, 0, 32, m.local_qkey);
  io.f(32, 0, 24, m.local_qpn);
  io.f(35, 0, 8, m.responder_resources);
  // 36: local EECN (24), RC/UC only here: zero
  io.f(39, 0, 8, m.initiator_depth);
  // 40: remote EECN (24): zero
  io.f(43, 0, 5, m.remote_cm_response_timeout);
  io.f(43, 5, 2, m.transport);
  io.f(43, 7, 1, m.end_to_end_flow_control);
  io.f(44, 0, 24, m.starting_psn);
  io.f(47, 0, 5, m.local_cm_response_timeout);
  io.f(47, 5, 3, m.retry_count);
  io.f(48, 0, 16, m.pkey);
  io.f(50, 0, 4, m.path_mtu);
  io.f(50, 4, 1, m.rdc_exists);
  io.f(50, 5, 3, m.rnr_retry_count);
  io.f(51, 0, 4, m.max_cm_retries);
  io.f(51, 4, 1, m.srq);
  io.f(51, 5, 3, m.extended_transport);
  path_fields(io, kReqPrimaryPath, m.primary);
  // alternate path: by the caller (present or all zero); 139[5]: SAP supported, zero
  io.bytes(140, m.private_data);
}

template <typename IO, typename M>
void mra_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(4, 0, 32, m.remote_comm_id);
  io.f(8, 0, 2, m.message_mraed);
  io.f(9, 0, 5, m.service_timeout);
  io.bytes(10, m.private_data);
}

template <typename IO, typename M>
void rej_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(4, 0, 32, m.remote_comm_id);
  io.f(8, 0, 2, m.message_rejected);
  io.f(9, 0, 7, m.ari_length);
  io.f(10, 0, 16, m.reason);
  io.bytes(12, m.ari);
  io.bytes(84, m.private_data);
}

template <typename IO, typename M>
void rep_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(4, 0, 32, m.remote_comm_id);
  io.f(8, 0, 32, m.local_qkey);
  io.f(12, 0, 24, m.local_qpn);
  io.f(16, 0, 24, m.local_eecn);
  io.f(20, 0, 24, m.starting_psn);
  io.f(24, 0, 8, m.responder_resources);
  io.f(25, 0, 8, m.initiator_depth);
  io.f(26, 0, 5, m.target_ack_delay);
  io.f(26, 5, 2, m.failover_accepted);
  io.f(26, 7, 1, m.end_to_end_flow_control);
  io.f(27, 0, 3, m.rnr_retry_count);
  io.f(27, 3, 1, m.srq);
  io.f(28, 0, 64, m.local_ca_guid);
  io.bytes(36, m.private_data);
}

template <typename IO, typename M>
void rtu_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(4, 0, 32, m.remote_comm_id);
  io.bytes(8, m.private_data);
}

template <typename IO, typename M>
void dreq_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(4, 0, 32, m.remote_comm_id);
  io.f(8, 0, 24, m.remote_qpn);
  io.bytes(12, m.private_data);
}

template <typename IO, typename M>
void drep_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.local_comm_id);
  io.f(4, 0, 32, m.remote_comm_id);
  io.bytes(8, m.private_data);
}

template <typename IO, typename M>
void sidr_req_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.request_id);
  io.f(4, 0, 16, m.pkey);
  io.f(8, 0, 64, m.service_id);
  io.bytes(16, m.private_data);
}

template <typename IO, typename M>
void sidr_rep_fields(const IO& io, M& m) {
  io.f(0, 0, 32, m.request_id);
  io.f(4, 0, 8, m.status);
  io.f(5, 0, 8, m.add_info_length);
  io.f(8, 0, 24, m.qpn);
  io.f(12, 0, 64, m.service_id);
  io.f(20, 0, 32, m.qkey);
  io.bytes(24, m.add_info);
  io.bytes(96, m.private_data);
}

static_assert(kMadHdrSize + 140 + kReqPrivate == kMadSize);
static_assert(kMadHdrSize + 10 + kMraPrivate == kMadSize);
static_assert(kMadHdrSize + 84 + kRejPrivate == kMadSize && 12 + kRejAriMax == 84);
static_assert(kMadHdrSize + 36 + kRepPrivate == kMadSize);
static_assert(kMadHdrSize + 8 + kRtuPrivate == kMadSize);
static_assert(kMadHdrSize + 12 + kDreqPrivate == kMadSize);
static_assert(kMadHdrSize + 8 + kDrepPrivate == kMadSize);
static_assert(kMadHdrSize + 16 + kSidrReqPrivate == kMadSize);
static_assert(kMadHdrSize + 96 + kSidrRepPrivate == kMadSize);
static_assert(kReqAlternatePath + kReqPathSize == 140 && kReqPrimaryPath + kReqPathSize == kReqAlternatePath);

bool known_attr(uint16_t a) noexcept {
  switch (static_cast<Attr>(a)) {
    case Attr::Req:
    case Attr::Mra:
    case Attr::Rej:
    case Attr::Rep:
    case Attr::Rtu:
    case Attr::Dreq:
    case Attr::Drep:
    case Attr::SidrReq:
    case Attr::SidrRep:
      return true;
    default:
      return false;
  }
}

void encode_hdr(uint8_t* p, uint64_t tid, Attr attr) noexcept {
  std::memset(p, 0, kMadSize);
  p[0] = 1;
  p[1] = kMgmtClassCm;
  p[2] = kCmClassVersion;
  p[3] = kMethodSend;
  // status, class specific: 0
  put_bits(p, 8 * 8, 64, tid);
  put_bits(p, 16 * 8, 16, static_cast<uint16_t>(attr));
  // reserved, attribute modifier: 0
}

// Header checks plus "the attribute is the one of this message".
MadError body_start(std::span<const uint8_t> mad, Attr want) noexcept {
  MadHdr h;
  const MadError e = decode_hdr(mad, h);
  if (e != MadError::None) return e;
  return h.attr_id == want ? MadError::None : MadError::UnknownAttr;
}

template <typename M, typename Fields>
MadError decode_simple(std::span<const uint8_t> mad, Attr want, M& m, Fields fields) noexcept {
  const MadError e = body_start(mad, want);
  if (e != MadError::None) return e;
  fields(Reader(mad.data()), m);
  return MadError::None;
}

template <typename M, typename Fields>
void encode_simple(std::span<uint8_t> out, uint64_t tid, Attr attr, const M& m, Fields fields) noexcept {
  assert(out.size() >= kMadSize);
  if (out.size() < kMadSize) return;
  encode_hdr(out.data(), tid, attr);
  fields(Writer(out.data()), m);
}

bool path_present(const uint8_t* mad, size_t base) noexcept {
  const uint8_t* p = mad + kMadHdrSize + base;
  // LIDs and GIDs (bytes 0..35 of the path): all zero when there is no alternate path.
  return std::any_of(p, p + 36, [](uint8_t b) { return b != 0; });
}

}  // namespace

const char* attr_name(Attr a) noexcept {
  switch (a) {
    case Attr::ClassPortInfo: return "ClassPortInfo";
    case Attr::Req: return "REQ";
    case Attr::Mra: return "MRA";
    case Attr::Rej: return "REJ";
    case Attr::Rep: return "REP";
    case Attr::Rtu: return "RTU";
    case Attr::Dreq: return "DREQ";
    case Attr::Drep: return "DREP";
    case Attr::SidrReq: return "SIDR_REQ";
    case Attr::SidrRep: return "SIDR_REP";
    case Attr::Lap: return "LAP";
    case Attr::Apr: return "APR";
  }
  return "unknown";
}

const char* mad_error_name(MadError e) noexcept {
  switch (e) {
    case MadError::None: return "none";
    case MadError::Short: return "short";
    case MadError::BaseVersion: return "base_version";
    case MadError::NotCm: return "not_cm";
    case MadError::ClassVersion: return "class_version";
    case MadError::Method: return "method";
    case MadError::UnknownAttr: return "unknown_attr";
    case MadError::BadField: return "bad_field";
  }
  return "unknown";
}

MadError decode_hdr(std::span<const uint8_t> mad, MadHdr& h) noexcept {
  if (mad.size() < kMadSize) return MadError::Short;
  const uint8_t* p = mad.data();
  h.base_version = p[0];
  h.mgmt_class = p[1];
  h.class_version = p[2];
  h.method = p[3];
  h.status = static_cast<uint16_t>(get_bits(p, 4 * 8, 16));
  h.class_specific = static_cast<uint16_t>(get_bits(p, 6 * 8, 16));
  h.tid = get_bits(p, 8 * 8, 64);
  const auto attr = static_cast<uint16_t>(get_bits(p, 16 * 8, 16));
  h.attr_id = static_cast<Attr>(attr);
  h.attr_mod = static_cast<uint32_t>(get_bits(p, 20 * 8, 32));
  if (h.base_version != 1) return MadError::BaseVersion;
  if (h.mgmt_class != kMgmtClassCm) return MadError::NotCm;
  if (h.class_version != kCmClassVersion) return MadError::ClassVersion;
  if (h.method != kMethodSend) return MadError::Method;
  if (!known_attr(attr)) return MadError::UnknownAttr;
  return MadError::None;
}

MadError decode(std::span<const uint8_t> mad, Req& m) noexcept {
  const MadError e = body_start(mad, Attr::Req);
  if (e != MadError::None) return e;
  const Reader r(mad.data());
  req_fields(r, m);
  m.has_alternate = path_present(mad.data(), kReqAlternatePath);
  m.alternate = Path{};
  if (m.has_alternate) path_fields(r, kReqAlternatePath, m.alternate);
  return MadError::None;
}

MadError decode(std::span<const uint8_t> mad, Mra& m) noexcept {
  return decode_simple(mad, Attr::Mra, m, [](const Reader& r, Mra& x) { mra_fields(r, x); });
}

MadError decode(std::span<const uint8_t> mad, Rej& m) noexcept {
  const MadError e = body_start(mad, Attr::Rej);
  if (e != MadError::None) return e;
  rej_fields(Reader(mad.data()), m);
  return m.ari_length > kRejAriMax ? MadError::BadField : MadError::None;
}

MadError decode(std::span<const uint8_t> mad, Rep& m) noexcept {
  return decode_simple(mad, Attr::Rep, m, [](const Reader& r, Rep& x) { rep_fields(r, x); });
}

MadError decode(std::span<const uint8_t> mad, Rtu& m) noexcept {
  return decode_simple(mad, Attr::Rtu, m, [](const Reader& r, Rtu& x) { rtu_fields(r, x); });
}

MadError decode(std::span<const uint8_t> mad, Dreq& m) noexcept {
  return decode_simple(mad, Attr::Dreq, m, [](const Reader& r, Dreq& x) { dreq_fields(r, x); });
}

MadError decode(std::span<const uint8_t> mad, Drep& m) noexcept {
  return decode_simple(mad, Attr::Drep, m, [](const Reader& r, Drep& x) { drep_fields(r, x); });
}

MadError decode(std::span<const uint8_t> mad, SidrReq& m) noexcept {
  return decode_simple(mad, Attr::SidrReq, m, [](const Reader& r, SidrReq& x) { sidr_req_fields(r, x); });
}

MadError decode(std::span<const uint8_t> mad, SidrRep& m) noexcept {
  const MadError e = body_start(mad, Attr::SidrRep);
  if (e != MadError::None) return e;
  sidr_rep_fields(Reader(mad.data()), m);
  return m.add_info_length > sizeof(m.add_info) ? MadError::BadField : MadError::None;
}

void encode(std::span<uint8_t> out, uint64_t tid, const Req& m) noexcept {
  encode_simple(out, tid, Attr::Req, m, [](const Writer& w, const Req& x) {
    req_fields(w, x);
    if (x.has_alternate) path_fields(w, kReqAlternatePath, x.alternate);
  });
}

void encode(std::span<uint8_t> out, uint64_t tid, const Mra& m) noexcept {
  encode_simple(out, tid, Attr::Mra, m, [](const Writer& w, const Mra& x) { mra_fields(w, x); });
}

void encode(std::span<uint8_t> out, uint64_t tid, const Rej& m) noexcept {
  encode_simple(out, tid, Attr::Rej, m, [](const Writer& w, const Rej& x) {
    rej_fields(w, x);
    // Never send an ARI length the ARI field cannot hold.
    w.f(9, 0, 7, std::min<uint8_t>(x.ari_length, kRejAriMax));
  });
}

void encode(std::span<uint8_t> out, uint64_t tid, const Rep& m) noexcept {
  encode_simple(out, tid, Attr::Rep, m, [](const Writer& w, const Rep& x) { rep_fields(w, x); });
}

void encode(std::span<uint8_t> out, uint64_t tid, const Rtu& m) noexcept {
  encode_simple(out, tid, Attr::Rtu, m, [](const Writer& w, const Rtu& x) { rtu_fields(w, x); });
}

void encode(std::span<uint8_t> out, uint64_t tid, const Dreq& m) noexcept {
  encode_simple(out, tid, Attr::Dreq, m, [](const Writer& w, const Dreq& x) { dreq_fields(w, x); });
}

void encode(std::span<uint8_t> out, uint64_t tid, const Drep& m) noexcept {
  encode_simple(out, tid, Attr::Drep, m, [](const Writer& w, const Drep& x) { drep_fields(w, x); });
}

void encode(std::span<uint8_t> out, uint64_t tid, const SidrReq& m) noexcept {
  encode_simple(out, tid, Attr::SidrReq, m, [](const Writer& w, const SidrReq& x) { sidr_req_fields(w, x); });
}

void encode(std::span<uint8_t> out, uint64_t tid, const SidrRep& m) noexcept {
  encode_simple(out, tid, Attr::SidrRep, m, [](const Writer& w, const SidrRep& x) {
    sidr_rep_fields(w, x);
    w.f(5, 0, 8, std::min<uint8_t>(x.add_info_length, sizeof(x.add_info)));
  });
}

}  // namespace droce::cm

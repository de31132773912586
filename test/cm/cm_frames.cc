#include "cm_frames.h"

#include "cm_samples.h"
#include "wire/opcode.h"
#include "wire/packet.h"

namespace droce::cm::frames {

std::vector<uint8_t> cm_frame(std::span<const uint8_t> mad, const Addr& a) {
  if (mad.size() < kMadSize) return {};
  wire::Headers h;
  h.l2.src = a.src_mac;
  h.l2.dst = a.dst_mac;
  h.l3.src = wire::gid_from_ipv4(a.src_ip);
  h.l3.dst = wire::gid_from_ipv4(a.dst_ip);
  h.l4.sport = a.sport;
  h.bth.opcode = wire::op::UD_SEND_ONLY;
  h.bth.pkey = kDefaultPkey;
  h.bth.dqpn = kGsiQpn;
  h.bth.psn = a.psn;
  h.ext.deth.qkey = kGsiQkey;
  h.ext.deth.sqpn = kGsiQpn;
  std::vector<uint8_t> f(wire::frame_len(h, kMadSize));
  const size_t n = wire::build_frame(f, h, mad.first(kMadSize));
  f.resize(n);
  return f;
}

namespace {

template <typename M>
Sample make(const std::string& name, const M& m, uint64_t tid, bool from_a, uint32_t psn) {
  std::array<uint8_t, kMadSize> mad{};
  encode(mad, tid, m);
  Addr a;
  a.src_ip = from_a ? samples::kIpA : samples::kIpB;
  a.dst_ip = from_a ? samples::kIpB : samples::kIpA;
  a.src_mac = from_a ? std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0A} : std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0B};
  a.dst_mac = from_a ? std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0B} : std::array<uint8_t, 6>{0x02, 0, 0, 0, 0, 0x0A};
  a.psn = psn;
  MadHdr h;
  (void)decode_hdr(mad, h);
  return Sample{h.attr_id, name, tid, mad, cm_frame(mad, a)};
}

}  // namespace

std::vector<Sample> sample_frames() {
  std::vector<Sample> v;
  v.push_back(make("REQ", samples::req(), 0x1000000000000001ull, true, 1));
  v.push_back(make("REQ+alt", samples::req_alt(), 0x1000000000000002ull, true, 2));
  v.push_back(make("MRA", samples::mra(), 0x1000000000000001ull, false, 1));
  v.push_back(make("REP", samples::rep(), 0x2000000000000003ull, false, 2));
  v.push_back(make("RTU", samples::rtu(), 0x1000000000000004ull, true, 3));
  v.push_back(make("REJ", samples::rej(), 0x2000000000000005ull, false, 3));
  v.push_back(make("DREQ", samples::dreq(), 0x1000000000000006ull, true, 4));
  v.push_back(make("DREP", samples::drep(), 0x2000000000000007ull, false, 4));
  v.push_back(make("SIDR_REQ", samples::sidr_req(), 0x1000000000000008ull, true, 5));
  v.push_back(make("SIDR_REP", samples::sidr_rep(), 0x2000000000000009ull, false, 5));
  return v;
}

bool write_samples(const std::string& path, std::string& err) {
  std::vector<pcapio::Frame> out;
  double ts = 1.0e9;
  for (auto& s : sample_frames()) {
    if (s.frame.empty()) {
      err = "could not build the " + s.name + " frame";
      return false;
    }
    out.push_back(pcapio::Frame{ts, std::move(s.frame)});
    ts += 0.001;
  }
  return pcapio::write_pcap(path, out, err);
}

}  // namespace droce::cm::frames

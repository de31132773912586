// Wireshark's InfiniBand dissector (tshark) must decode every CM MAD droce
// sends: each message kind as a whole RoCEv2 frame (cm_frames.h) in a pcap,
// and what two real cm::Agents send each other, then tshark reads it back. Every frame must be a CM MAD (UD SEND_ONLY to
// QP 1, Q_Key 0x80010000) of the right attribute, the fields the dissector
// knows must hold the values we encoded, and no frame may be malformed or
// carry an expert warning. Needs tshark (scripts/setup.sh installs it): its
// absence fails the test.
//
// Wireshark 4.0 (Debian 12) limits, measured here and left unchecked:
// - MRA, SIDR_REQ and SIDR_REP have no body dissector ("Dissector Not
//   Implemented"): only their MAD header is checked.
// - REQ flow label and packet rate: the dissector reads the packet rate from
//   the low bits of byte 88 (the first byte of the flow label) instead of
//   byte 91, and the flow label from 3 bytes under a 32-bit mask (IBTA table
//   106 and Linux CM_REQ_PRIMARY_PACKET_RATE: byte 91 bits 2..7). With the
//   bytes 00 00 00 2a it shows packet rate 0. Our layout is checked against
//   the IBTA table in test_mad.cc instead.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cm_frames.h"
#include "cm_samples.h"
#include "pcapio/pcap_file.h"

using namespace droce::cm;

namespace {

// Runs a shell command (bounded by `timeout`), returns its exit status and stdout.
int run(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = popen(("timeout -k 5 120 " + cmd + " 2>/dev/null").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct TmpDir {
  std::string path;
  TmpDir() {
    char t[] = "/tmp/droce-cm-ws-XXXXXX";
    REQUIRE(mkdtemp(t) != nullptr);
    path = t;
  }
  ~TmpDir() { std::filesystem::remove_all(path); }
};

template <size_t N>
std::string hex(const uint8_t (&d)[N], size_t from = 0) {
  static const char* x = "0123456789abcdef";
  std::string s;
  for (size_t i = from; i < N; ++i) {
    s += x[d[i] >> 4];
    s += x[d[i] & 15];
  }
  return s;
}

std::string hex(const droce::wire::Gid& g) {
  uint8_t a[16];
  for (size_t i = 0; i < 16; ++i) a[i] = g[i];
  return hex(a);
}

// What one frame's fields must read: numbers compare by value (tshark prints
// some in hex, some in decimal), anything else as text.
struct Want {
  std::map<std::string, uint64_t> num;
  std::map<std::string, std::string> text;
};

void header(Want& w, const frames::Sample& s) {
  w.num["infiniband.bth.opcode"] = 0x64;
  w.num["infiniband.bth.destqp"] = 1;
  w.num["infiniband.bth.p_key"] = 0xFFFF;
  w.num["infiniband.deth.q_key"] = 0x80010000;
  w.num["infiniband.deth.srcqp"] = 1;
  w.num["infiniband.mad.baseversion"] = 1;
  w.num["infiniband.mad.mgmtclass"] = 0x07;
  w.num["infiniband.mad.classversion"] = 2;
  w.num["infiniband.mad.method"] = 0x03;
  w.num["infiniband.mad.status"] = 0;
  w.num["infiniband.mad.attributeid"] = static_cast<uint16_t>(s.attr);
  w.num["infiniband.mad.transactionid"] = s.tid;
  w.num["infiniband.mad.attributemodifier"] = 0;
}

std::string ip_text(const droce::wire::Gid& g) {
  const uint32_t v = droce::wire::gid_to_ipv4(g);
  return std::to_string(v >> 24) + "." + std::to_string((v >> 16) & 255) + "." + std::to_string((v >> 8) & 255) + "." +
         std::to_string(v & 255);
}

void path(Want& w, const char* pre, const Path& p, bool ipv4_names) {
  const std::string b = std::string("infiniband.cm.req.") + pre;
  w.num[b + "locallid"] = p.local_lid;
  w.num[b + "remotelid"] = p.remote_lid;
  if (ipv4_names) {  // the primary path's IPv4-mapped GIDs are shown as IPv4 addresses
    w.text[b + "localgid_ipv4"] = ip_text(p.local_gid);
    w.text[b + "remotegid_ipv4"] = ip_text(p.remote_gid);
  } else {
    w.text[b + "localgid"] = hex(p.local_gid);
    w.text[b + "remotegid"] = hex(p.remote_gid);
  }
  w.num[b + "tfcclass"] = p.traffic_class;
  w.num[b + "hoplim"] = p.hop_limit;
  w.num[b + "sl"] = p.sl;
  w.num[b + "subnetlocal"] = p.subnet_local;
  w.num[b + "localacktout"] = p.local_ack_timeout;
}

void req(Want& w, const Req& m) {
  const std::string b = "infiniband.cm.req";
  w.num[b] = m.local_comm_id;
  w.num[b + ".serviceid"] = m.service_id;
  PortSpace ps{};
  uint16_t port = 0;
  REQUIRE(parse_service_id(m.service_id, ps, port));
  w.num[b + ".serviceid.protocol"] = static_cast<uint16_t>(ps) & 0xFF;
  w.num[b + ".serviceid.dport"] = port;
  w.num[b + ".localcaguid"] = m.local_ca_guid;
  w.num[b + ".localqkey"] = m.local_qkey;
  w.num[b + ".localqpn"] = m.local_qpn;
  w.num[b + ".responderres"] = m.responder_resources;
  w.num[b + ".localeecn"] = 0;
  w.num[b + ".initdepth"] = m.initiator_depth;
  w.num[b + ".remoteeecn"] = 0;
  w.num[b + ".remoteresptout"] = m.remote_cm_response_timeout;
  w.num[b + ".transpsvctype"] = static_cast<uint8_t>(m.transport);
  w.num[b + ".e2eflowctrl"] = m.end_to_end_flow_control;
  w.num[b + ".startpsn"] = m.starting_psn;
  w.num[b + ".localresptout"] = m.local_cm_response_timeout;
  w.num[b + ".retrcount"] = m.retry_count;
  w.num[b + ".pkey"] = m.pkey;
  w.num[b + ".pppmtu"] = m.path_mtu;
  w.num[b + ".rdcexist"] = m.rdc_exists;
  w.num[b + ".rnrretrcount"] = m.rnr_retry_count;
  w.num[b + ".maxcmretr"] = m.max_cm_retries;
  w.num[b + ".srq"] = m.srq;
  w.num[b + ".ext_transport"] = m.extended_transport;
  path(w, "prim_", m.primary, true);
  path(w, "alt_", m.has_alternate ? m.alternate : Path{0, 0}, false);
  // The RDMA CM (IP CM) header in the private data.
  CmaHdr c;
  REQUIRE(decode_cma_hdr(m.private_data, c));
  REQUIRE(c.ip_version == 4);
  w.num[b + ".ip_cm.majv"] = 0;
  w.num[b + ".ip_cm.ipv"] = 4;
  w.num[b + ".ip_cm.sport"] = c.src_port;
  w.text[b + ".ip_cm.sip4"] = ip_text(c.src);
  w.text[b + ".ip_cm.dip4"] = ip_text(c.dst);
  w.text[b + ".ip_cm.private"] = hex(m.private_data, kCmaHdrSize);
}

// The fields of a frame, from its MAD decoded by our codec (the codec's own
// layout is checked against IBTA in test_mad.cc; here Wireshark must agree).
Want want_for(const frames::Sample& s) {
  Want w;
  header(w, s);
  const std::span<const uint8_t> mad(s.mad);
  switch (s.attr) {
    case Attr::Req: {
      Req m;
      REQUIRE(decode(mad, m) == MadError::None);
      req(w, m);
      break;
    }
    case Attr::Rep: {
      Rep m;
      REQUIRE(decode(mad, m) == MadError::None);
      w.num["infiniband.cm.rep"] = m.local_comm_id;
      w.num["infiniband.cm.rep.remotecommid"] = m.remote_comm_id;
      w.num["infiniband.cm.rep.localqkey"] = m.local_qkey;
      w.num["infiniband.cm.rep.localqpn"] = m.local_qpn;
      w.num["infiniband.cm.rep.localeecn"] = m.local_eecn;
      w.num["infiniband.cm.rep.startpsn"] = m.starting_psn;
      w.num["infiniband.cm.rep.respres"] = m.responder_resources;
      w.num["infiniband.cm.rep.initdepth"] = m.initiator_depth;
      w.num["infiniband.cm.rep.tgtackdelay"] = m.target_ack_delay;
      w.num["infiniband.cm.rep.failoveracc"] = m.failover_accepted;
      w.num["infiniband.cm.rep.e2eflowctrl"] = m.end_to_end_flow_control;
      w.num["infiniband.cm.rep.rnrretrcount"] = m.rnr_retry_count;
      w.num["infiniband.cm.rep.srq"] = m.srq;
      w.num["infiniband.cm.rep.localcaguid"] = m.local_ca_guid;
      w.text["infiniband.cm.rep.private"] = hex(m.private_data);
      break;
    }
    case Attr::Rtu: {
      Rtu m;
      REQUIRE(decode(mad, m) == MadError::None);
      w.num["infiniband.cm.rtu.localcommid"] = m.local_comm_id;
      w.num["infiniband.cm.rtu.remotecommid"] = m.remote_comm_id;
      w.text["infiniband.cm.rtu.private"] = hex(m.private_data);
      break;
    }
    case Attr::Rej: {
      Rej m;
      REQUIRE(decode(mad, m) == MadError::None);
      w.num["infiniband.cm.rej.localcommid"] = m.local_comm_id;
      w.num["infiniband.cm.rej.remotecommid"] = m.remote_comm_id;
      w.num["infiniband.cm.rej.msgrej"] = m.message_rejected;
      w.num["infiniband.cm.rej.rejinfolen"] = m.ari_length;
      w.num["infiniband.cm.rej.reason"] = m.reason;
      w.text["infiniband.cm.rej.ari"] = hex(m.ari);
      w.text["infiniband.cm.rej.private"] = hex(m.private_data);
      break;
    }
    case Attr::Dreq: {
      Dreq m;
      REQUIRE(decode(mad, m) == MadError::None);
      w.num["infiniband.cm.dreq.localcommid"] = m.local_comm_id;
      w.num["infiniband.cm.dreq.remotecommid"] = m.remote_comm_id;
      w.num["infiniband.cm.req.remoteqpneecn"] = m.remote_qpn;  // (sic) Wireshark's name for DREQ's field
      w.text["infiniband.cm.dreq.private"] = hex(m.private_data);
      break;
    }
    case Attr::Drep: {
      Drep m;
      REQUIRE(decode(mad, m) == MadError::None);
      w.num["infiniband.cm.drsp.localcommid"] = m.local_comm_id;
      w.num["infiniband.cm.drsp.remotecommid"] = m.remote_comm_id;
      w.text["infiniband.cm.drsp.private"] = hex(m.private_data);
      break;
    }
    default:
      break;  // MRA, SIDR_REQ, SIDR_REP: header only (see the top of this file)
  }
  return w;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> v;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      v.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  v.push_back(cur);
  return v;
}

void require_tshark() {
  std::string out;
  INFO("tshark is missing: scripts/setup.sh installs it (package tshark)");
  REQUIRE(run("tshark --version", out) == 0);
}

// Frames (1-based numbers) that tshark finds malformed or flags with an expert
// warning or error; -1 if tshark failed.
int bad_frames(const std::string& pcap, std::string& list) {
  const int rc = run("tshark -r '" + pcap + "' -Y '_ws.malformed || _ws.expert.severity >= warning' -T fields -e frame.number", list);
  if (rc != 0) return -1;
  int n = 0;
  for (const auto& l : split(list, '\n'))
    if (!l.empty()) ++n;
  return n;
}


// Writes the frames to a pcap, has tshark decode it, and compares. Returns the
// number of field values compared.
size_t check_with_tshark(const std::vector<frames::Sample>& samples) {
  TmpDir dir;
  const std::string pcap = dir.path + "/cm.pcap";
  std::vector<droce::pcapio::Frame> pf;
  for (size_t i = 0; i < samples.size(); ++i) {
    REQUIRE_FALSE(samples[i].frame.empty());
    pf.push_back({1.0e9 + 0.001 * static_cast<double>(i), samples[i].frame});
  }
  std::string err;
  REQUIRE(droce::pcapio::write_pcap(pcap, pf, err));

  std::vector<Want> wants;
  std::vector<std::string> fields;
  {
    std::map<std::string, bool> seen;
    for (const auto& s : samples) {
      wants.push_back(want_for(s));
      for (const auto& [k, v] : wants.back().num)
        if (!seen[k]) seen[k] = true, fields.push_back(k);
      for (const auto& [k, v] : wants.back().text)
        if (!seen[k]) seen[k] = true, fields.push_back(k);
    }
  }
  std::string cmd = "tshark -r '" + pcap + "' -T fields -E separator=/t -E occurrence=a -E aggregator=,";
  for (const auto& f : fields) cmd += " -e " + f;
  std::string out;
  REQUIRE(run(cmd, out) == 0);
  auto rows = split(out, '\n');
  while (!rows.empty() && rows.back().empty()) rows.pop_back();
  REQUIRE(rows.size() == samples.size());

  size_t checked = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto cols = split(rows[i], '\t');
    REQUIRE(cols.size() == fields.size());
    std::map<std::string, std::string> got;
    for (size_t c = 0; c < fields.size(); ++c) got[fields[c]] = cols[c];
    for (const auto& [k, v] : wants[i].num) {
      INFO("frame " << i + 1 << " " << samples[i].name << " " << k << " = '" << got[k] << "'");
      REQUIRE_FALSE(got[k].empty());
      CHECK(std::strtoull(got[k].c_str(), nullptr, 0) == v);
      ++checked;
    }
    for (const auto& [k, v] : wants[i].text) {
      INFO("frame " << i + 1 << " " << samples[i].name << " " << k);
      CHECK(got[k] == v);
      ++checked;
    }
  }

  // The whole verbose decode: no malformed packet, no expert warning or error.
  std::string list;
  CHECK(bad_frames(pcap, list) == 0);
  INFO(list);
  REQUIRE(run("tshark -r '" + pcap + "' -V", out) == 0);
  CHECK(out.find("Malformed") == std::string::npos);
  CHECK(out.find("Dissector bug") == std::string::npos);
  return checked;
}

}  // namespace

TEST_CASE("tshark decodes every CM MAD kind as the right message with our field values", "[cm][wireshark]") {
  require_tshark();
  const auto samples = frames::sample_frames();
  REQUIRE(samples.size() == 10);
  CHECK(check_with_tshark(samples) == 258);
  TmpDir dir;  // and the pcap cm_pcap writes names every message by Wireshark's names
  std::string err, out;
  REQUIRE(frames::write_samples(dir.path + "/s.pcap", err));
  REQUIRE(run("tshark -r '" + dir.path + "/s.pcap'", out) == 0);
  for (const char* name : {"ConnectRequest", "MsgRcptAck", "ConnectReply", "ReadyToUse", "ConnectReject",
                           "DisconnectRequest", "DisconnectReply", "ServiceIDResReq\n", "ServiceIDResReqResp"}) {
    INFO(name);
    CHECK(out.find(std::string("CM: ") + name) != std::string::npos);
  }
}

TEST_CASE("tshark decodes what two real cm::Agents send each other", "[cm][wireshark]") {
  require_tshark();
  std::string err;
  const auto sent = frames::agent_frames(err);
  INFO(err);
  REQUIRE_FALSE(sent.empty());
  // Every kind of MAD the Agent sends is in the exchange.
  std::map<Attr, int> kinds;
  for (const auto& s : sent) ++kinds[s.attr];
  for (Attr a : {Attr::Req, Attr::Mra, Attr::Rej, Attr::Rep, Attr::Rtu, Attr::Dreq, Attr::Drep, Attr::SidrReq,
                 Attr::SidrRep}) {
    INFO(attr_name(a));
    CHECK(kinds[a] >= 1);
  }
  CHECK(check_with_tshark(sent) > 100);
}

TEST_CASE("the malformed check itself finds a cut CM frame", "[cm][wireshark]") {
  require_tshark();
  TmpDir dir;
  auto samples = frames::sample_frames();
  std::vector<droce::pcapio::Frame> f;
  f.push_back({1.0e9, samples[0].frame});
  auto cut = samples[3].frame;  // REP
  cut.resize(62 + 24 + 20);      // Ethernet .. DETH, the MAD header, 20 bytes of body
  f.push_back({1.0e9 + 1, cut});
  const std::string pcap = dir.path + "/cut.pcap";
  std::string err;
  REQUIRE(droce::pcapio::write_pcap(pcap, f, err));
  std::string list;
  CHECK(bad_frames(pcap, list) == 1);
  CHECK(list == "2\n");
}

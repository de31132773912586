// CM MADs as complete RoCEv2 frames, as droce's GSI QP sends them: Ethernet,
// IPv4, UDP 4791, BTH (UD SEND_ONLY to QP 1, P_Key 0xFFFF), DETH (Q_Key
// 0x80010000, source QP 1), the 256-byte MAD, ICRC. Used by the Wireshark
// check (test_wireshark.cc) and the cm_pcap tool.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cm/mad.h"
#include "pcapio/pcap_file.h"

namespace droce::cm::frames {

struct Addr {
  uint32_t src_ip = 0;  // host order
  uint32_t dst_ip = 0;
  std::array<uint8_t, 6> src_mac{};
  std::array<uint8_t, 6> dst_mac{};
  uint16_t sport = 0xC000;
  uint32_t psn = 0;
};

// The frame carrying mad (kMadSize bytes); empty if mad is short.
std::vector<uint8_t> cm_frame(std::span<const uint8_t> mad, const Addr& a);

struct Sample {
  Attr attr;
  std::string name;        // "REQ", "REQ+alt", ...
  uint64_t tid;
  std::array<uint8_t, kMadSize> mad;
  std::vector<uint8_t> frame;
};
// One frame per CM message kind droce sends (cm_samples.h), REQ also with an
// alternate path; A (192.168.7.1) and B (192.168.7.2) take turns as sender.
std::vector<Sample> sample_frames();

// The samples as a pcap at path.
bool write_samples(const std::string& path, std::string& err);

// What two real cm::Agents send each other (their actual MADs, addresses and
// field values) through an in-memory link: RC connect with MRA (the passive
// program slow to answer), REP, RTU, DREQ/DREP, a rejected connect (REJ), a UD
// resolution (SIDR_REQ/SIDR_REP OK) and a refused one (SIDR_REP reject).
// Empty, with err set, if the exchange does not go as scripted.
std::vector<Sample> agent_frames(std::string& err);
bool write_agent_frames(const std::string& path, std::string& err);

}  // namespace droce::cm::frames

// Reading and writing classic pcap captures through libpcap (tests, the demo's
// capture decoder, the fuzz corpus seeder). Not used on the data path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace droce::pcapio {

struct Frame {
  double ts = 0;  // seconds since the epoch
  std::vector<uint8_t> bytes;
};

// Reads every frame of an Ethernet capture. On failure returns false and sets err.
bool read_pcap(const std::string& path, std::vector<Frame>& out, std::string& err);

// Writes frames as an Ethernet (DLT_EN10MB) capture.
bool write_pcap(const std::string& path, const std::vector<Frame>& frames, std::string& err);

}  // namespace droce::pcapio

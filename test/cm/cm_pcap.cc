// cm_pcap OUT.pcap: writes one RoCEv2 frame per CM message kind droce sends
// (cm_frames.h) into a pcap, to look at with Wireshark or to feed
// check_cm_pcap.sh.
#include <cstdio>
#include <string>

#include "cm_frames.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.pcap\n", argv[0]);
    return 2;
  }
  std::string err;
  if (!droce::cm::frames::write_samples(argv[1], err)) {
    std::fprintf(stderr, "cm_pcap: %s\n", err.c_str());
    return 1;
  }
  return 0;
}

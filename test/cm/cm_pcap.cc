// cm_pcap [--agents] OUT.pcap: writes CM MADs as RoCEv2 frames (cm_frames.h)
// into a pcap, to look at with Wireshark or to feed check_cm_pcap.sh: one
// frame per message kind with distinct field values, or with --agents what
// two real cm::Agents send each other through connect, MRA, reject,
// disconnect and SIDR.
#include <cstdio>
#include <cstring>
#include <string>

#include "cm_frames.h"

int main(int argc, char** argv) {
  const bool agents = argc == 3 && std::strcmp(argv[1], "--agents") == 0;
  if (argc != 2 && !agents) {
    std::fprintf(stderr, "usage: %s [--agents] OUT.pcap\n", argv[0]);
    return 2;
  }
  std::string err;
  const std::string out = argv[argc - 1];
  const bool ok = agents ? droce::cm::frames::write_agent_frames(out, err) : droce::cm::frames::write_samples(out, err);
  if (!ok) {
    std::fprintf(stderr, "cm_pcap: %s\n", err.c_str());
    return 1;
  }
  return 0;
}

// droce-pcap: decodes a capture with droce's RoCEv2 parser, one line per
// packet, and verifies every ICRC. Exit status 1 if any RoCEv2 packet fails.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <string>

#include "pcapio/pcap_file.h"
#include "wire/packet.h"

using namespace droce::wire;

namespace {

void print_gid(const Gid& g, char* out, size_t n) {
  if (gid_is_ipv4_mapped(g)) {
    std::snprintf(out, n, "%u.%u.%u.%u", g[12], g[13], g[14], g[15]);
  } else {
    std::snprintf(out, n, "%02x%02x:%02x%02x:...:%02x%02x", g[0], g[1], g[2], g[3], g[14], g[15]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"droce-pcap: decode RoCEv2 frames in a pcap file with droce's parser"};
  std::vector<std::string> files;
  bool quiet = false;
  app.add_option("files", files, "capture files (classic pcap, Ethernet)")->required()->check(CLI::ExistingFile);
  app.add_flag("-q,--quiet", quiet, "print only the summary");
  CLI11_PARSE(app, argc, argv);

  size_t total = 0, roce = 0, bad = 0, other = 0;
  std::map<std::string, size_t> ops, errors;
  for (const auto& path : files) {
    std::vector<droce::pcapio::Frame> frames;
    std::string err;
    if (!droce::pcapio::read_pcap(path, frames, err)) {
      std::fprintf(stderr, "droce-pcap: %s: %s\n", path.c_str(), err.c_str());
      return 2;
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      ++total;
      PacketView v;
      const ParseError e = parse_frame(frames[i].bytes, v);
      if (e == ParseError::NotIp || e == ParseError::NotUdp || e == ParseError::NotRocePort) {
        ++other;
        continue;
      }
      if (e != ParseError::Ok) {
        ++bad;
        ++errors[parse_error_name(e)];
        if (!quiet) std::printf("%5zu  ERROR %s\n", i + 1, parse_error_name(e));
        continue;
      }
      ++roce;
      ++ops[v.op->name];
      if (quiet) continue;
      char src[64], dst[64];
      print_gid(v.h.l3.src, src, sizeof src);
      print_gid(v.h.l3.dst, dst, sizeof dst);
      std::printf("%5zu  %-15s > %-15s %-24s qpn 0x%06x psn %8u%s", i + 1, src, dst, v.op->name, v.h.bth.dqpn,
                  v.h.bth.psn, v.h.bth.ackreq ? " A" : "  ");
      if (v.op->off_reth)
        std::printf(" reth va 0x%llx rkey 0x%x len %u", static_cast<unsigned long long>(v.h.ext.reth.va),
                    v.h.ext.reth.rkey, v.h.ext.reth.len);
      if (v.op->off_aeth) std::printf(" aeth syn 0x%02x msn %u", v.h.ext.aeth.syndrome, v.h.ext.aeth.msn);
      if (v.op->off_atomic)
        std::printf(" atomic va 0x%llx rkey 0x%x", static_cast<unsigned long long>(v.h.ext.atomic.va),
                    v.h.ext.atomic.rkey);
      if (v.op->off_deth) std::printf(" deth qkey 0x%x sqp 0x%x", v.h.ext.deth.qkey, v.h.ext.deth.sqpn);
      if (v.op->off_imm) std::printf(" imm 0x%08x", v.h.ext.imm);
      if (v.op->off_ieth) std::printf(" ieth rkey 0x%x", v.h.ext.ieth_rkey);
      std::printf(" payload %u icrc ok\n", v.payload_len);
    }
  }
  std::printf("\n%zu frames: %zu RoCEv2 packets decoded with a valid ICRC, %zu bad, %zu not RoCEv2\n", total, roce,
              bad, other);
  for (const auto& [name, n] : ops) std::printf("  %-26s %zu\n", name.c_str(), n);
  for (const auto& [name, n] : errors) std::printf("  error %-20s %zu\n", name.c_str(), n);
  return bad ? 1 : 0;
}

// droce-dump: prints every RoCEv2 packet of a pcap or pcapng capture, decoded
// by droce's parser, with its ICRC verified, then a summary by opcode.
// Exit status: 0 all RoCEv2 packets parse and verify, 1 some do not, 2 usage
// or file error. See README.md beside this file for the output.
#include <pcap/pcap.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "dump.h"

namespace {

// Reads one capture into the dumper. Returns false (after printing why) on a
// file error; frames read before the error have been counted. Sets `opened`
// when the file is a capture droce-dump reads.
bool dump_file(const std::string& path, bool announce, droce::dump::Dumper& d, bool& opened) {
  char ebuf[PCAP_ERRBUF_SIZE] = {};
  pcap_t* p = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_MICRO, ebuf);
  if (!p) {
    std::fprintf(stderr, "droce-dump: %s: %s\n", path.c_str(), ebuf);
    return false;
  }
  const int dlt = pcap_datalink(p);
  if (!droce::dump::link_supported(dlt)) {
    const char* name = pcap_datalink_val_to_name(dlt);
    std::fprintf(stderr,
                 "droce-dump: %s: link type %d (%s) is not supported (Ethernet, Linux cooked SLL/SLL2 or raw IP)\n",
                 path.c_str(), dlt, name ? name : "unknown");
    pcap_close(p);
    return false;
  }
  opened = true;
  d.begin_file(path, announce);
  std::vector<uint8_t> scratch;
  pcap_pkthdr* h = nullptr;
  const u_char* data = nullptr;
  int rc;
  while ((rc = pcap_next_ex(p, &h, &data)) == 1) {
    const auto eth = droce::dump::to_ethernet(dlt, {data, h->caplen}, scratch);
    const int64_t ts = static_cast<int64_t>(h->ts.tv_sec) * 1000000 + static_cast<int64_t>(h->ts.tv_usec);
    // The wire length of a non-Ethernet frame, as the Ethernet frame it becomes.
    const int64_t grow = static_cast<int64_t>(eth.size()) - static_cast<int64_t>(h->caplen);
    const int64_t wire = std::max<int64_t>(static_cast<int64_t>(h->len) + grow, static_cast<int64_t>(eth.size()));
    d.frame(eth, static_cast<uint32_t>(wire), ts);
  }
  bool ok = true;
  if (rc == PCAP_ERROR) {
    std::fprintf(stderr, "droce-dump: %s: %s\n", path.c_str(), pcap_geterr(p));
    ok = false;
  }
  pcap_close(p);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "droce-dump: decode the RoCEv2 packets of pcap/pcapng captures with droce's parser, verify each ICRC,\n"
      "and summarize by opcode. Exit status: 0 all RoCEv2 packets parse and verify, 1 some do not,\n"
      "2 usage or file error."};
  std::vector<std::string> files;
  droce::dump::Options opt;
  app.add_option("files", files, "capture files (pcap or pcapng; Ethernet, Linux cooked or raw IP; - for stdin)")
      ->required();
  app.add_flag("--json", opt.json, "one JSON object per packet (JSON Lines), then a summary object");
  app.add_flag("-q,--quiet", opt.quiet, "print only the summary");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  droce::dump::Dumper d(stdout, opt);
  bool files_ok = true, opened = false;
  for (const auto& f : files) files_ok = dump_file(f, files.size() > 1, d, opened) && files_ok;
  if (opened) d.summary();
  std::fflush(stdout);
  return files_ok ? d.status() : 2;
}

#include "pcapio/pcap_file.h"

#include <pcap/pcap.h>

namespace droce::pcapio {

bool read_pcap(const std::string& path, std::vector<Frame>& out, std::string& err) {
  char ebuf[PCAP_ERRBUF_SIZE] = {};
  pcap_t* p = pcap_open_offline(path.c_str(), ebuf);
  if (!p) {
    err = ebuf;
    return false;
  }
  if (pcap_datalink(p) != DLT_EN10MB) {
    err = path + ": not an Ethernet capture";
    pcap_close(p);
    return false;
  }
  pcap_pkthdr* hdr = nullptr;
  const u_char* data = nullptr;
  int rc;
  while ((rc = pcap_next_ex(p, &hdr, &data)) == 1) {
    Frame f;
    f.ts = static_cast<double>(hdr->ts.tv_sec) + static_cast<double>(hdr->ts.tv_usec) * 1e-6;
    f.bytes.assign(data, data + hdr->caplen);
    out.push_back(std::move(f));
  }
  if (rc == -1) err = pcap_geterr(p);
  pcap_close(p);
  return rc == PCAP_ERROR_BREAK;
}

bool write_pcap(const std::string& path, const std::vector<Frame>& frames, std::string& err) {
  pcap_t* p = pcap_open_dead(DLT_EN10MB, 65535);
  if (!p) {
    err = "pcap_open_dead failed";
    return false;
  }
  pcap_dumper_t* d = pcap_dump_open(p, path.c_str());
  if (!d) {
    err = pcap_geterr(p);
    pcap_close(p);
    return false;
  }
  for (const auto& f : frames) {
    pcap_pkthdr h{};
    h.ts.tv_sec = static_cast<time_t>(f.ts);
    h.ts.tv_usec = static_cast<suseconds_t>((f.ts - static_cast<double>(h.ts.tv_sec)) * 1e6);
    h.caplen = h.len = static_cast<bpf_u_int32>(f.bytes.size());
    pcap_dump(reinterpret_cast<u_char*>(d), &h, f.bytes.data());
  }
  pcap_dump_close(d);
  pcap_close(p);
  return true;
}

}  // namespace droce::pcapio

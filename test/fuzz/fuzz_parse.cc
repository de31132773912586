// libFuzzer target for the RoCEv2 frame parser. Any input: no crash, no read
// outside the buffer, no sanitizer report. For inputs that parse, building the
// frame again from the decoded fields must give bytes that parse to the same
// fields (and, with the ICRC verified, the same bytes, but for pad and reserved
// bytes a receiver ignores).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/packet.h"

using namespace droce::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  PacketView v;
  // With the ICRC checked (the path real traffic takes)...
  const ParseError strict = parse_frame({data, size}, v);
  // ...and without it, so mutations reach the checks behind the ICRC.
  PacketView loose;
  const ParseError e = parse_frame({data, size}, loose, {.verify_ip_checksum = false, .verify_icrc = false});
  if (strict == ParseError::Ok && e != ParseError::Ok) std::abort();
  if (e != ParseError::Ok) return 0;
  if (loose.payload_off + loose.payload_len > loose.frame_len) std::abort();

  std::vector<uint8_t> out(frame_len(loose.h, loose.payload_len));
  if (build_frame(out, loose.h, loose.payload_span()) != out.size()) std::abort();
  PacketView again;
  if (parse_frame(out, again) != ParseError::Ok) std::abort();
  if (again.payload_len != loose.payload_len || again.h.bth.psn != loose.h.bth.psn ||
      again.h.bth.opcode != loose.h.bth.opcode ||
      std::memcmp(again.payload(), loose.payload(), loose.payload_len) != 0)
    std::abort();
  // Receivers ignore the pad bytes' contents (the sender must zero them, the
  // builder does): only a frame whose pad is zero can rebuild byte for byte.
  bool pad_zero = true;
  for (uint32_t i = 0; i < loose.h.bth.pad; ++i) pad_zero &= data[loose.payload_off + loose.payload_len + i] == 0;
  // The same for a CNP's 16 reserved bytes (annex A17.9.2): the builder zeroes them.
  if (loose.op->flags & kOpCnpResv)
    for (uint32_t i = 0; i < 16; ++i) pad_zero &= data[loose.bth_off + 12 + i] == 0;
  if (strict == ParseError::Ok && pad_zero && loose.l3_off == 14 + (loose.h.l2.vlan ? 4 : 0) &&
      loose.ip_hdr_len == (loose.h.l3.ipv6 ? 40 : 20) && std::memcmp(out.data(), data, out.size()) != 0) {
    // A verified frame with a plain IP header and a zero pad rebuilds byte for byte.
    std::abort();
  }
  return 0;
}

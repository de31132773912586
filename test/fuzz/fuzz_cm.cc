// libFuzzer target for the CM state machine (cm::Agent) of a port, the code
// that every peer on the network can reach through QP1. Each input is a
// program run against a fresh Agent (the DUT) with a listener for RC, one for
// UD, and a scripted peer:
//
//   op 0  a raw 256-byte MAD from the input (any header);
//   op 1  a CM MAD of a kind the input picks whose body is input bytes, but
//         whose IDs answer the last MAD the DUT sent (its local comm ID as the
//         remote one, its remote one as ours, its TID): the fuzzer reaches the
//         states behind a handshake without guessing 32-bit IDs;
//   op 2  time moves on (up to ~4 s: retries, MRA, TimeWait);
//   op 3  a program call on the DUT: connect, accept / reject the newest
//         request, establish, disconnect, destroy one of its connections.
//
// Invariants (abort, so libFuzzer keeps the input): no sanitizer report;
// every MAD the DUT sends decodes with its own codec as a CM MAD to the peer;
// events name connections the DUT has; the table never exceeds max_conns;
// once every connection is destroyed and time has passed, only the listeners
// are left (nothing leaks).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "cm/agent.h"

using namespace droce;
using namespace droce::cm;

namespace {

#define CHECK_OR_DIE(c)                                                  \
  do {                                                                   \
    if (!(c)) {                                                          \
      std::fprintf(stderr, "invariant failed: %s (line %d)\n", #c, __LINE__); \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

const wire::Gid kMe = wire::gid_from_ipv4(0x0a000001);
const wire::Gid kPeer = wire::gid_from_ipv4(0x0a000002);

struct Io final : Agent::Io {
  uint8_t last[kMadSize]{};
  bool have_last = false;
  size_t sent = 0;
  bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t, std::span<const uint8_t> mad) override {
    CHECK_OR_DIE(mad.size() == kMadSize);
    CHECK_OR_DIE(local == kMe);
    CHECK_OR_DIE(remote == kPeer);
    MadHdr h;
    CHECK_OR_DIE(decode_hdr(mad, h) == MadError::None);
    std::memcpy(last, mad.data(), kMadSize);
    have_last = true;
    ++sent;
    return true;
  }
  bool is_local(const wire::Gid& ip) const override { return ip == kMe; }
};

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint32_t u32() { return u8() | (u8() << 8) | (u8() << 16) | (uint32_t{u8()} << 24); }
  void bytes(uint8_t* out, size_t len) {
    const size_t k = len < n ? len : n;
    std::memcpy(out, p, k);
    std::memset(out + k, 0, len - k);
    p += k;
    n -= k;
  }
};

uint32_t be32(const uint8_t* b) { return (uint32_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3]; }
void put_be32(uint8_t* b, uint32_t v) {
  b[0] = static_cast<uint8_t>(v >> 24);
  b[1] = static_cast<uint8_t>(v >> 16);
  b[2] = static_cast<uint8_t>(v >> 8);
  b[3] = static_cast<uint8_t>(v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Io io;
  AgentConfig cfg;
  cfg.seed = 12345;
  cfg.max_conns = 64;
  cfg.ca_guid = 0x0200aabbccddeeffull;
  std::set<ConnId> requests;  // passive connections the DUT announced
  Agent* self = nullptr;
  Agent a(cfg, io, [&](const Event& e) {
    CHECK_OR_DIE(self != nullptr);
    bool known = false;
    for (auto& c : self->connections()) known |= c.id == e.id;
    CHECK_OR_DIE(known);
    if (e.type == EventType::ConnectRequest) requests.insert(e.id);
  });
  self = &a;
  uint64_t now = 1'000'000;
  a.tick(now);
  ConnId lrc = 0, lud = 0;
  CHECK_OR_DIE(a.listen(PortSpace::Tcp, {{}, 4420}, QpKind::Rc, 1, &lrc) == 0);
  CHECK_OR_DIE(a.listen(PortSpace::Udp, {kMe, 7174}, QpKind::Ud, 2, &lud) == 0);
  std::vector<ConnId> mine;  // connections the program side created

  Reader r{data, size};
  for (int steps = 0; r.n && steps < 256; ++steps) {
    const uint8_t op = r.u8() % 4;
    uint8_t mad[kMadSize];
    if (op == 0) {
      r.bytes(mad, kMadSize);
      a.on_mad(kPeer, kMe, (r.u8() & 1) ? kGsiQpn : 7, std::span<const uint8_t>(mad, kMadSize));
    } else if (op == 1) {
      r.bytes(mad, kMadSize);
      mad[0] = 1;
      mad[1] = kMgmtClassCm;
      mad[2] = kCmClassVersion;
      mad[3] = kMethodSend;
      mad[16] = 0;
      mad[17] = static_cast<uint8_t>(0x10 + mad[17] % 9);  // REQ .. SIDR_REP
      if (io.have_last && (r.u8() & 3) != 0) {
        // Answer the DUT's last MAD: our comm ID at body offset 0, the DUT's at 4.
        std::memcpy(mad + 8, io.last + 8, 8);  // its TID
        const uint32_t its_local = be32(io.last + kMadHdrSize);
        const uint32_t its_remote = be32(io.last + kMadHdrSize + 4);
        if (mad[17] == 0x17 || mad[17] == 0x18) {
          put_be32(mad + kMadHdrSize, its_local);  // SIDR: the request ID
        } else {
          put_be32(mad + kMadHdrSize, its_remote ? its_remote : 0x5eed);
          put_be32(mad + kMadHdrSize + 4, its_local);
        }
      }
      a.on_mad(kPeer, kMe, kGsiQpn, std::span<const uint8_t>(mad, kMadSize));
    } else if (op == 2) {
      now += uint64_t{r.u8()} * 16'000'000 + r.u8() * 10'000;
      a.tick(now);
    } else {
      const uint8_t call = r.u8() % 7;
      if (call == 0) {
        ConnectArgs c;
        c.local = {kMe, 5000};
        c.remote = {kPeer, static_cast<uint16_t>(r.u8())};
        c.kind = static_cast<QpKind>(r.u8() % 3);
        c.ps = c.kind == QpKind::Ud ? PortSpace::Udp : PortSpace::Tcp;
        c.param.qpn = r.u32() & 0xffffff;
        c.param.private_data_len = r.u8() % 64;
        c.param.responder_resources = r.u8();
        c.param.initiator_depth = r.u8();
        ConnId id = 0;
        if (a.connect(c, 9, &id) == 0) mine.push_back(id);
      } else if (!requests.empty() && call <= 2) {
        const ConnId id = *requests.rbegin();
        if (call == 1) {
          ConnParam p;
          p.qpn = r.u32() & 0xffffff;
          p.responder_resources = r.u8();
          p.initiator_depth = r.u8();
          p.private_data_len = r.u8();
          (void)a.accept(id, p);
        } else {
          uint8_t pd[8] = {1, 2, 3, 4, 5, 6, 7, 8};
          (void)a.reject(id, std::span<const uint8_t>(pd, r.u8() % 9));
        }
        mine.push_back(id);
        requests.erase(id);
      } else if (!mine.empty()) {
        const ConnId id = mine[r.u8() % mine.size()];
        QpParams q;
        (void)a.qp_params(id, q);
        if (call == 3) (void)a.establish(id);
        if (call == 4) (void)a.disconnect(id);
        if (call >= 5) {
          a.destroy(id);
          std::erase(mine, id);
        }
      }
    }
    CHECK_OR_DIE(a.connections().size() <= cfg.max_conns);
  }
  // Everything the program holds goes; after enough time nothing but the listeners is left.
  for (ConnId id : mine) a.destroy(id);
  for (ConnId id : requests) a.destroy(id);
  for (auto& c : a.connections())
    if (c.id != lrc && c.id != lud) a.destroy(c.id);
  for (int i = 0; i < 1000; ++i) {  // 100 s: DREQ retries (15 x 4 s) and TimeWait
    now += 100'000'000;
    a.tick(now);
  }
  CHECK_OR_DIE(a.connections().size() == 2);
  return 0;
}

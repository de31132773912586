// A DUT engine on a memlink whose QP's peer is a raw port: tests feed it
// hand-built packets (wire::build_frame) and assert on what it sends back
// (test_protocol.cc, test_hardening.cc). Steps read "Receive ... Expect ...".
#pragma once

#include <span>
#include <vector>

#include "harness.h"

namespace droce::test {

inline constexpr uint32_t kPeerQpn = 0x77;
inline constexpr uint32_t kRqPsn = 1000;  // what the DUT's responder expects first
inline constexpr uint32_t kSqPsn = 500;   // what the DUT's requester sends first

struct Frame {
  std::vector<uint8_t> bytes;
  wire::PacketView v;
};

class Proto {
 public:
  explicit Proto(QpType t = QpType::RC, QpOpts o = {}, EngineConfig cfg = {})
      : link(clock, 1, 1024, 4096 + 256), dut(0, link, clock, cfg), peer(link.add_port(mac_of(1))), type(t) {
    o.rq_psn = kRqPsn;
    o.sq_psn = kSqPsn;
    QpInitAttr init;
    init.qp_type = t;
    init.pd = dut.pd.handle;
    init.send_cq = dut.scq;
    init.recv_cq = dut.rcq;
    REQUIRE(dut.eng->create_qp(init, &qpn) == 0);
    mtu = mtu_bytes(o.mtu);
    // Bring the QP up (a fake peer node only for its address).
    QpAttr a;
    a.qp_state = QpState::Init;
    a.qp_access_flags = kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
    a.qkey = o.qkey;
    REQUIRE(dut.eng->modify_qp(qpn, a, kQpState | kQpPkeyIndex | kQpPort | (t == QpType::UD ? kQpQkey : kQpAccessFlags)) == 0);
    a.qp_state = QpState::Rtr;
    a.path_mtu = o.mtu;
    a.dest_qp_num = kPeerQpn;
    a.rq_psn = kRqPsn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = o.min_rnr_timer;
    a.ah_attr.dmac = mac_of(1);
    a.ah_attr.dgid = gid_of(1);
    uint32_t m = kQpState;
    if (t == QpType::RC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn | kQpMaxDestRdAtomic | kQpMinRnrTimer;
    if (t == QpType::UC) m |= kQpAv | kQpPathMtu | kQpDestQpn | kQpRqPsn;
    REQUIRE(dut.eng->modify_qp(qpn, a, m) == 0);
    a.qp_state = QpState::Rts;
    a.sq_psn = kSqPsn;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = 4;
    m = kQpState | kQpSqPsn;
    if (t == QpType::RC) m |= kQpTimeout | kQpRetryCnt | kQpRnrRetry | kQpMaxQpRdAtomic;
    REQUIRE(dut.eng->modify_qp(qpn, a, m) == 0);
    mem = &dut.buffer(1 << 16);
    for (size_t i = 0; i < mem->mem.size(); ++i) mem->mem[i] = static_cast<uint8_t>(i * 7);
  }

  wire::Headers hdr(uint8_t opcode, uint32_t psn, bool ackreq = true) const {
    wire::Headers h;
    h.l2.src = mac_of(1);
    h.l2.dst = mac_of(0);
    h.l3.src = gid_of(1);
    h.l3.dst = gid_of(0);
    h.l3.tos = wire::kEcnEct0;
    h.bth.opcode = opcode;
    h.bth.dqpn = qpn;
    h.bth.psn = psn;
    h.bth.ackreq = ackreq;
    return h;
  }

  // Receive (at the DUT) one hand-built packet.
  void send(const wire::Headers& h, std::span<const uint8_t> payload = {}) {
    io::PktBuf* b = nullptr;
    REQUIRE(peer.alloc_burst(&b, 1) == 1);
    b->len = static_cast<uint32_t>(wire::build_frame({b->data, b->cap}, h, payload));
    REQUIRE(b->len > 0);
    REQUIRE(peer.tx_burst(&b, 1) == 1);
  }

  // Let the DUT run (advancing the clock by `ns`; or for `polls` polls when
  // non-zero) and collect what it sent. Frames that do not parse fail the test,
  // or (assertions off: a test thread, Catch2 assertions are not thread-safe)
  // are counted in `unparsed`.
  std::vector<Frame> run(uint64_t ns = 5000, int polls = 0) {
    std::vector<Frame> out;
    const uint64_t until = clock.now_ns() + ns;
    for (int it = 0;; ++it) {
      dut.eng->poll();
      io::PktBuf* bufs[32];
      uint16_t n;
      while ((n = peer.rx_burst(bufs, 32)) > 0) {
        for (uint16_t i = 0; i < n; ++i) {
          Frame f;
          f.bytes.assign(bufs[i]->data, bufs[i]->data + bufs[i]->len);
          const bool ok = wire::parse_frame(f.bytes, f.v) == wire::ParseError::Ok;
          if (assertions) REQUIRE(ok);
          if (ok) out.push_back(std::move(f));
          else ++unparsed;
        }
        peer.free_burst(bufs, n);
      }
      if (polls ? it + 1 >= polls : clock.now_ns() >= until) break;
      clock.advance(500);
    }
    for (auto& f : out) wire::parse_frame(f.bytes, f.v);
    return out;
  }

  Qp& q() { return *dut.eng->qp(qpn); }

  memlink::VirtualClock clock;
  memlink::Link link;
  Node dut;
  memlink::Port& peer;
  QpType type;
  uint32_t qpn = 0;
  uint32_t mtu = 1024;
  Node::Buf* mem = nullptr;
  bool assertions = true;
  uint32_t unparsed = 0;
};

inline uint8_t syn_kind(const Frame& f) { return f.v.h.ext.aeth.syndrome & wire::kAethKindMask; }


}  // namespace droce::test

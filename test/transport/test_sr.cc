// Selective repeat between droce peers (lib/transport/README.md): out-of-order
// placement and selective resends under loss with the data checked, go-back-N
// toward a peer that does not run it (no reserved bit on the wire), the
// fallback when a listed peer ignores the mark, and (hidden, [.bench]) the
// goodput of a 64 KiB WRITE stream against go-back-N at 0.1%, 1% and 5% loss.
#include <cstdio>

#include "harness.h"

using namespace droce;
using namespace droce::test;

namespace {

struct Run {
  uint64_t retransmits = 0, lost = 0, virtual_ns = 0, bytes = 0, timeouts = 0, cuts = 0;
  bool ok = false;
};

// A stream of `msgs` WRITEs of `len` bytes from node 0 to node 1 (at most
// `depth` outstanding) over a link losing `loss` of the frames each way; every
// WRITE completes successfully and node 1's buffer holds node 0's bytes.
// qps: an existing pair {qpn on node 0, qpn on node 1} (0: a new one);
// reverse: node 1 writes to node 0. ce0: node 0's ECN-capable frames are
// marked CE with this probability.
Run write_stream(World& w, double loss, uint32_t msgs, uint32_t len, uint32_t depth, const QpOpts& o,
                 bool reverse = false, std::pair<uint32_t, uint32_t>* qps = nullptr, uint64_t delay_ns = 2'000,
                 double ce0 = 0) {
  Node& a = *w.node[reverse ? 1 : 0];
  Node& b = *w.node[reverse ? 0 : 1];
  std::pair<uint32_t, uint32_t> made{};
  if (!qps) {
    made = w.connect(0, 1, QpType::RC, o);
    qps = &made;
  }
  const uint32_t qa = reverse ? qps->second : qps->first;
  memlink::Faults f;
  f.loss = loss;
  f.delay_ns = delay_ns;
  w.link.port(1).set_faults(f);
  f.ce_mark = ce0;  // ce0: node 0's frames CE-marked with this probability
  w.link.port(0).set_faults(f);
  const size_t slots = depth;
  Node::Buf& src = a.buffer(size_t{len} * slots);
  Node::Buf& dst = b.buffer(size_t{len} * slots);
  const uint64_t lost0 = w.link.counter(memlink::Counter::Lost);
  const uint64_t rt0 = a.eng->counter(Ctr::ReqRetransmits);
  const uint64_t t0 = w.clock.now_ns();
  uint32_t posted = 0, done = 0;
  bool failed = false;
  std::vector<uint8_t> expect(size_t{len} * slots);
  auto post = [&] {
    const uint32_t s = posted % slots;
    std::vector<uint8_t> chunk(len);
    fill_random(chunk, 1000 + posted);
    std::memcpy(src.mem.data() + size_t{s} * len, chunk.data(), len);
    std::memcpy(expect.data() + size_t{s} * len, chunk.data(), len);
    SendWr wr = make_wr(posted, WrOpcode::RdmaWrite, src, size_t{s} * len, len);
    wr.rdma.remote_addr = dst.addr() + size_t{s} * len;
    wr.rdma.rkey = dst.key;
    REQUIRE(a.eng->post_send(qa, wr) == 0);
    ++posted;
  };
  while (posted < msgs && posted < depth) post();
  const bool finished = w.run(
      [&] {
        for (const Wc& wc : a.drain(a.scq)) {
          if (wc.status != WcStatus::Success || wc.wr_id != done) failed = true;
          ++done;
          if (posted < msgs) post();
        }
        return done >= msgs || failed;
      },
      50'000'000, 600'000'000'000ull);
  Run r;
  r.ok = finished && !failed && done == msgs;
  r.virtual_ns = w.clock.now_ns() - t0;
  r.bytes = uint64_t{len} * msgs;
  r.lost = w.link.counter(memlink::Counter::Lost) - lost0;
  r.retransmits = a.eng->counter(Ctr::ReqRetransmits) - rt0;
  r.timeouts = a.eng->counter(Ctr::AckTimeouts);
  r.cuts = a.eng->counter(Ctr::WindowCuts);
  // The last `depth` messages' bytes are what the slots hold now.
  if (r.ok) r.ok = std::memcmp(dst.mem.data(), expect.data(), expect.size()) == 0;
  return r;
}

EngineConfig sr_config(bool on, std::vector<wire::Gid> peers = {}) {
  EngineConfig c;
  c.selective_repeat = on;
  c.sr_peers = std::move(peers);
  return c;
}

uint64_t marked_frames_from(memlink::Link& link, uint16_t port) {
  uint64_t n = 0;
  for (const Seen& s : parsed(link))
    if (s.from == port && s.v.h.bth.resv7 != 0) ++n;
  return n;
}

}  // namespace

TEST_CASE("selective repeat: out-of-order WRITE packets are placed and only the lost ones resent", "[sr]") {
  QpOpts o;
  o.mtu = Mtu::M1024;
  o.timeout = 8;
  // Only node 0 lists node 1: node 1 learns it from node 0's marked requests.
  World sr(11, 2, sr_config(true, {gid_of(1)}));
  auto qps = sr.connect(0, 1, QpType::RC, o);
  const Run a = write_stream(sr, 0.01, 64, 64 * 1024, 8, o, false, &qps);
  REQUIRE(a.ok);
  Engine& tx = *sr.node[0]->eng;
  Engine& rx = *sr.node[1]->eng;
  CHECK(rx.counter(Ctr::SrOooPlaced) > 0);
  CHECK(rx.counter(Ctr::SrSackSent) > 0);
  CHECK(tx.counter(Ctr::SrSackReceived) > 0);
  CHECK(tx.counter(Ctr::SrResent) > 0);
  CHECK(rx.counter(Ctr::SrLearned) == 1);
  // The same stream, same seed, go-back-N: many more packets sent again.
  World gbn(11, 2, sr_config(false));
  const Run b = write_stream(gbn, 0.01, 64, 64 * 1024, 8, o);
  REQUIRE(b.ok);
  INFO("SR retransmits " << a.retransmits << " (lost " << a.lost << "), GBN " << b.retransmits << " (lost " << b.lost
                         << ")");
  CHECK(a.retransmits * 3 < b.retransmits);
  // The learned direction: node 1's QP writes to node 0 selectively too.
  const Run c = write_stream(sr, 0.01, 32, 64 * 1024, 8, o, /*reverse=*/true, &qps);
  REQUIRE(c.ok);
  CHECK(tx.counter(Ctr::SrOooPlaced) > 0);
  CHECK(rx.counter(Ctr::SrResent) > 0);
}

TEST_CASE("selective repeat: a node with it on uses plain go-back-N toward a peer that does not", "[sr]") {
  QpOpts o;
  o.timeout = 8;
  // Node 0 enables it but does not know node 1 as a peer running it; node 1 has it off.
  World w(12, 0);
  w.node.push_back(std::make_unique<Node>(0, w.link, w.clock, sr_config(true)));
  w.node.push_back(std::make_unique<Node>(1, w.link, w.clock, sr_config(false)));
  w.link.record(true);
  const Run r = write_stream(w, 0.02, 16, 64 * 1024, 4, o);
  REQUIRE(r.ok);
  REQUIRE(r.lost > 0);
  CHECK(w.node[0]->eng->counter(Ctr::SeqNakReceived) > 0);  // go-back-N did the repair
  CHECK(w.node[0]->eng->counter(Ctr::SrResent) == 0);
  CHECK(marked_frames_from(w.link, 0) == 0);  // no reserved bit toward node 1
  CHECK(marked_frames_from(w.link, 1) == 0);
  // Multi-packet WRITEs keep their FIRST/MIDDLE/LAST opcodes.
  bool middle = false;
  for (const Seen& s : parsed(w.link)) middle |= s.from == 0 && s.v.h.bth.opcode == wire::op::RC_WRITE_MIDDLE;
  CHECK(middle);
}

TEST_CASE("selective repeat: a listed peer that ignores the mark makes the QP fall back", "[sr]") {
  QpOpts o;
  o.timeout = 8;
  // Node 0 lists node 1, which has it off: node 1 treats the mark as reserved
  // (ignored) and answers a loss with a plain NAK; node 0 stops marking.
  World w(13, 0);
  w.node.push_back(std::make_unique<Node>(0, w.link, w.clock, sr_config(true, {gid_of(1)})));
  w.node.push_back(std::make_unique<Node>(1, w.link, w.clock, sr_config(false)));
  w.link.record(true);
  const Run r = write_stream(w, 0.02, 32, 64 * 1024, 4, o);
  REQUIRE(r.ok);
  Engine& tx = *w.node[0]->eng;
  CHECK(tx.counter(Ctr::SrFallbacks) == 1);
  CHECK(w.node[1]->eng->counter(Ctr::SrSackSent) == 0);
  CHECK(marked_frames_from(w.link, 1) == 0);
  // Marked frames only before the fallback: the last WRITEs' frames are plain.
  const auto seen = parsed(w.link);
  size_t last_marked = 0, n = 0;
  for (size_t i = 0; i < seen.size(); ++i)
    if (seen[i].from == 0) {
      ++n;
      if (seen[i].v.h.bth.resv7) last_marked = n;
    }
  CHECK(last_marked > 0);
  CHECK(last_marked < n / 2);
}

TEST_CASE("selective repeat: resends wait for the DCQCN pacer as new packets do", "[sr]") {
  // Node 0 runs DCQCN with every frame it sends CE-marked: its QP is limited
  // from the first CNP on, at a fixed 1 Gb/s (the first CNP sets it, no
  // decrease cuts, no increase comes) with a pacer burst of one byte, so
  // each frame must leave at least its own wire time at 1 Gb/s after the
  // one before. 2% of the frames are lost each way: the lost PSNs are resent
  // from SACKs, and each resend must keep that spacing too.
  EngineConfig c0 = sr_config(true, {gid_of(1)});
  c0.dcqcn = true;
  c0.dcqcn_params.line_rate_kbps = 10'000'000;
  c0.dcqcn_params.rate_to_set_on_first_cnp_kbps = 1'000'000;
  c0.dcqcn_params.min_dec_fac_pct = 0;
  c0.dcqcn_params.time_reset_ns = 1'000'000'000'000ull;
  c0.dcqcn_params.byte_reset = 1ull << 50;
  c0.dcqcn_params.burst_bytes = 1;
  World w(14, 0);
  w.node.push_back(std::make_unique<Node>(0, w.link, w.clock, c0));
  w.node.push_back(std::make_unique<Node>(1, w.link, w.clock, sr_config(true, {gid_of(0)})));
  w.link.record(true);
  QpOpts o;
  o.mtu = Mtu::M1024;
  o.timeout = 14;  // 67 ms: the SACKs repair, not the ACK timeout
  const Run r = write_stream(w, 0.02, 16, 64 * 1024, 2, o, false, nullptr, 2'000, /*ce0=*/1.0);
  REQUIRE(r.ok);
  Engine& tx = *w.node[0]->eng;
  REQUIRE(tx.counter(Ctr::SrResent) > 0);
  REQUIRE(tx.counter(Ctr::AckTimeouts) == 0);
  // Node 0's requests from the first one after the first CNP reached it.
  uint64_t cnp_at = UINT64_MAX;
  struct Tx {
    uint64_t t, wire;
    uint32_t psn;
    bool resend;
  };
  std::vector<Tx> sent;
  uint32_t high = 0;
  bool any = false;
  for (const auto& rec : w.link.recorded()) {
    wire::PacketView v;
    if (wire::parse_frame(rec.bytes, v) != wire::ParseError::Ok) continue;
    if (rec.from_port == 1 && v.h.bth.opcode == wire::op::CNP && cnp_at == UINT64_MAX) cnp_at = rec.time_ns;
    if (rec.from_port != 0 || v.h.bth.opcode != wire::op::RC_WRITE_ONLY) continue;
    const uint32_t psn = v.h.bth.psn;
    const bool resend = any && !wire::psn_gt(psn, high);
    if (!any || wire::psn_gt(psn, high)) high = psn;
    any = true;
    // The pacer charges the payload plus 62 bytes of headers, ICRC and FCS.
    if (cnp_at != UINT64_MAX && rec.time_ns > cnp_at + 2'000) sent.push_back({rec.time_ns, uint64_t{v.payload_len} + 62, psn, resend});
  }
  REQUIRE(sent.size() > 100);
  uint64_t resends = 0, early = 0;
  for (size_t i = 1; i < sent.size(); ++i) {
    resends += sent[i].resend;
    // At 1 Gb/s a frame of B bytes takes 8 B ns; the one-byte burst allows 8 ns.
    if (sent[i].t + 8 < sent[i - 1].t + 8 * sent[i - 1].wire) {
      ++early;
      UNSCOPED_INFO("PSN " << sent[i].psn << (sent[i].resend ? " (resend)" : "") << " at " << sent[i].t << " ns, "
                           << sent[i - 1].wire << " B sent at " << sent[i - 1].t);
    }
  }
  INFO(sent.size() << " paced frames, " << resends << " of them resends");
  CHECK(resends > 0);
  CHECK(early == 0);
}

// Goodput of a stream of 64 KiB WRITEs (MTU 4096, 16 outstanding, 25 Gb/s
// links 2 us and 20 us apart, ACK timeout 4.096 us * 2^6 = 262 us) on the
// virtual clock: selective repeat against go-back-N, same seeds, same loss
// probability each way.
TEST_CASE("selective repeat: goodput against go-back-N at 0.1%, 1% and 5% loss", "[.bench][sr]") {
  QpOpts o;
  o.mtu = Mtu::M4096;
  o.timeout = 6;
  o.max_send_wr = 64;
  std::printf("%-8s %-6s %10s %10s %7s %10s %10s %8s %12s\n", "delay", "loss%", "SR Gb/s", "GBN Gb/s", "ratio",
              "SR resent", "GBN resent", "lost", "timeouts");
  for (uint64_t delay : {2'000ull, 20'000ull}) {
    for (double loss : {0.001, 0.01, 0.05}) {
      double gp[2];
      uint64_t rt[2], to[2], lost = 0;
      for (int mode = 0; mode < 2; ++mode) {
        World w(42, 2, mode == 0 ? sr_config(true, {gid_of(1)}) : sr_config(false));
        w.link.port(0).set_tx_rate(25'000'000'000ull);
        w.link.port(1).set_tx_rate(25'000'000'000ull);
        const Run r = write_stream(w, loss, 2048, 64 * 1024, 16, o, false, nullptr, delay);
        REQUIRE(r.ok);
        gp[mode] = double(r.bytes) * 8 / double(r.virtual_ns);
        rt[mode] = r.retransmits;
        if (mode == 0) lost = r.lost;
        to[mode] = r.timeouts;
      }
      std::printf("%5llu us %-6.1f %10.2f %10.2f %7.2f %10llu %10llu %8llu %5llu/%-5llu\n",
                  static_cast<unsigned long long>(delay / 1000), loss * 100, gp[0], gp[1], gp[0] / gp[1],
                  static_cast<unsigned long long>(rt[0]), static_cast<unsigned long long>(rt[1]),
                  static_cast<unsigned long long>(lost), static_cast<unsigned long long>(to[0]),
                  static_cast<unsigned long long>(to[1]));
    }
  }
}

// The tail-loss resend (EngineConfig::tail_timeout_ns) where it matters: one
// 4 KiB WRITE outstanding at a time (a queue-depth-1 storage workload; every
// lost frame is a tail), ACK timeout 4.096 us * 2^14 = 67 ms (perftest's and
// ibv_rc_pingpong's), 25 Gb/s links 2 us apart, go-back-N, same seeds.
TEST_CASE("tail timeout: QD 1 WRITEs at 0.1%, 1% and 5% loss against the ACK timeout alone", "[.bench][tail]") {
  QpOpts o;
  o.mtu = Mtu::M4096;
  o.timeout = 14;
  std::printf("%-6s %12s %12s %9s %14s %12s %8s\n", "loss%", "tail ops/s", "ACK-to ops/s", "ratio", "timeouts t/a",
              "tail resends", "lost");
  for (double loss : {0.001, 0.01, 0.05}) {
    double ops[2];
    uint64_t to[2], tails = 0, lost = 0;
    for (int mode = 0; mode < 2; ++mode) {
      EngineConfig c;
      c.tail_timeout_ns = mode == 0 ? 100'000 : 0;
      World w(42, 2, c);
      w.link.port(0).set_tx_rate(25'000'000'000ull);
      w.link.port(1).set_tx_rate(25'000'000'000ull);
      const Run r = write_stream(w, loss, 2000, 4096, 1, o);
      REQUIRE(r.ok);
      ops[mode] = 2000.0 * 1e9 / double(r.virtual_ns);
      to[mode] = r.timeouts;
      if (mode == 0) {
        tails = w.node[0]->eng->counter(Ctr::TailRetransmits);
        lost = r.lost;
      }
    }
    std::printf("%-6.1f %12.0f %12.0f %9.1f %7llu/%-6llu %12llu %8llu\n", loss * 100, ops[0], ops[1], ops[0] / ops[1],
                static_cast<unsigned long long>(to[0]), static_cast<unsigned long long>(to[1]),
                static_cast<unsigned long long>(tails), static_cast<unsigned long long>(lost));
  }
}

// The QP's layout (qp.h, README: The fast path, thirteenth session): the
// fields one message reads and writes lie on the few cache lines the engine
// prefetches (Qp::prefetch_rx / prefetch_tx). A field added in the wrong
// place, or a struct that grows, moves one off its line and fails here.
#include <catch2/catch.hpp>

#include <cstddef>
#include <memory>
#include <set>

#include "transport/qp.h"

using namespace droce;
using transport::Qp;

namespace {
struct Lines {
  const Qp& q;
  // The cache line of the object the byte at p lies on.
  size_t of(const void* p) const {
    return static_cast<size_t>(static_cast<const char*>(p) - reinterpret_cast<const char*>(&q)) / 64;
  }
  // The line of [p, p + n), or SIZE_MAX when it spans two.
  size_t of(const void* p, size_t n) const {
    const size_t a = of(p), b = of(static_cast<const char*>(p) + n - 1);
    return a == b ? a : SIZE_MAX;
  }
  template <typename T>
  size_t whole(const T& x) const {
    return of(&x, sizeof(T));
  }
};
}  // namespace

TEST_CASE("layout: the fields a message touches share a few cache lines", "[layout]") {
  verbs::QpInitAttr init;
  auto q = std::make_unique<Qp>(0x11, init);
  REQUIRE(reinterpret_cast<uintptr_t>(q.get()) % 64 == 0);
  const Lines l{*q};
  // Line 0: what every packet reads, and the send queue.
  for (size_t x : {l.whole(q->qpn), l.whole(q->type), l.whole(q->state), l.whole(q->sq_sig_all), l.whole(q->pd),
                   l.whole(q->mtu), l.whole(q->send_cq), l.whole(q->recv_cq), l.whole(q->srq), l.whole(q->sq)})
    CHECK(x == 0);
  // Line 1: the attributes a packet reads (timers, access, peer, caps post_send checks).
  const verbs::QpAttr& a = q->attr;
  for (size_t x : {l.whole(a.timeout), l.whole(a.retry_cnt), l.whole(a.rnr_retry), l.whole(a.min_rnr_timer),
                   l.whole(a.max_rd_atomic), l.whole(a.max_dest_rd_atomic), l.whole(a.qkey), l.whole(a.dest_qp_num),
                   l.whole(a.qp_access_flags), l.whole(a.cap)})
    CHECK(x == 1);
  // The requester's line: its state and the timer wheel entry.
  const size_t req = l.whole(q->req);
  CHECK(req != SIZE_MAX);
  for (size_t x : {l.whole(q->tw_at), l.whole(q->tw_prev), l.whole(q->tw_next), l.whole(q->tw_slot),
                   l.whole(q->tw_on), l.whole(q->in_req_ready)})
    CHECK(x == req);
  // The completer's line, with the DCQCN flag (ReactionPoint's first member).
  const size_t comp = l.whole(q->comp);
  CHECK(comp != SIZE_MAX);
  CHECK(l.of(&q->rp) == comp);
  // The four counters every packet bumps.
  CHECK(l.of(&q->ctr.tx_packets, 32) != SIZE_MAX);
  CHECK(reinterpret_cast<const char*>(&q->ctr.rx_bytes) - reinterpret_cast<const char*>(&q->ctr.tx_packets) == 24);
  // The responder's line: everything a SEND or WRITE packet touches before the receive WQE.
  const size_t resp = l.of(&q->in_resp_ready);
  CHECK(l.of(&q->resp, offsetof(transport::RespState, recv)) == resp);
  // The header template: an IPv4 path's bytes and fields on one line.
  CHECK(l.of(&q->tx, offsetof(wire::TxTemplate, bytes) + wire::kTemplateLine) != SIZE_MAX);
  // Seven distinct lines, and the object no larger than now (1088 bytes; 1899 per idle QP, README).
  CHECK(std::set<size_t>{0, 1, req, comp, l.of(&q->ctr.tx_packets), resp, l.of(&q->tx)}.size() == 7);
  CHECK(sizeof(Qp) <= 1088);
}

// RX dispatch: a received frame parsed, checked and handed to its QP's
// responder or completer; multicast fan-out; the ECN notification point (CNPs).
#include "transport/engine.h"

namespace droce::transport {

void Engine::send_cnp(Qp& q, const wire::PacketView& pkt) noexcept {
  // Notification point (annex A17.9.2): one CNP to the sending QP, rate-limited per QP.
  if (q.cnp_ever && now_ - q.last_cnp_ns < cfg_.cnp_interval_ns) {
    count(Ctr::CnpSuppressed);
    return;
  }
  wire::Headers h;
  h.l2.src = io_.mac();
  h.l2.dst = pkt.h.l2.src;
  h.l2.vlan = pkt.h.l2.vlan;
  h.l2.vlan_tci = pkt.h.l2.vlan_tci;
  h.l3.ipv6 = pkt.h.l3.ipv6;
  h.l3.src = pkt.h.l3.dst;
  h.l3.dst = pkt.h.l3.src;
  h.l3.tos = static_cast<uint8_t>((cfg_.cnp_dscp & 0x3F) << 2);  // CNPs are not ECN-capable
  if (h.l2.vlan) h.l2.vlan_tci = static_cast<uint16_t>((h.l2.vlan_tci & 0x1FFF) | (cfg_.cnp_prio & 7) << 13);
  h.l4.sport = pkt.h.l4.sport;
  h.bth.opcode = wire::op::CNP;
  h.bth.resv8a = wire::kBthBecn;
  h.bth.dqpn = q.type == verbs::QpType::UD ? pkt.h.ext.deth.sqpn : q.attr.dest_qp_num;
  h.bth.psn = 0;
  if (!begin_frame(h, 0)) return;
  end_frame();
  q.cnp_ever = true;
  q.last_cnp_ns = now_;
  ++q.ctr.cnp_sent;
  q.count_tx(0);
  count(Ctr::CnpSent);
}

// A frame to QPN 0xFFFFFF: a copy for every QP attached to its destination
// address (the checks of rx() for each; Q_Key in ud_rx). Bounded by the group
// size, no allocation. A QP does not receive its own packets looped back
// (same source GID and source QPN).
void Engine::rx_mcast(const wire::PacketView& pkt) noexcept {
  count(Ctr::RxMcast);
  McastGroup* g = wire::gid_is_multicast(pkt.h.l3.dst) ? find_group(pkt.h.l3.dst) : nullptr;
  if (!g) {
    count(Ctr::RxMcastNoGroup);
    return;
  }
  const wire::OpcodeInfo& op = *pkt.op;
  if (op.transport != wire::Transport::UD || !(op.flags & wire::kOpRequest)) {
    count(Ctr::RxBadTransport);
    return;
  }
  if ((pkt.h.bth.pkey & 0x7FFF) != (wire::kDefaultPkey & 0x7FFF)) {
    count(Ctr::RxBadPkey);
    return;
  }
  const uint32_t* m = group_qpns(static_cast<size_t>(g - mcast_.data()));
  const bool from_us = pkt.h.l3.src == source_gid(pkt.h.l3.dst);
  for (uint32_t i = 0; i < g->n; ++i) {
    Qp* q = qp(m[i]);
    if (!q) continue;
    if (from_us && pkt.h.ext.deth.sqpn == q->qpn) continue;
    if (!q->can_receive()) {
      count(Ctr::RxBadState);
      continue;
    }
    ++q->ctr.rx_packets;
    q->ctr.rx_bytes += pkt.payload_len;
    count(Ctr::McastDelivered);
    responder_rx(*this, *q, pkt);
  }
}

void Engine::rx(io::PktBuf* b) noexcept {
  count(Ctr::RxFrames);
  wire::PacketView pkt;
  const wire::ParseError err = wire::parse_frame({b->data, b->len}, pkt);
  if (err != wire::ParseError::Ok) {
    count(err == wire::ParseError::IcrcMismatch ? Ctr::RxIcrcErr : Ctr::RxParseErr);
    return;
  }
  if (pkt.h.bth.dqpn == wire::kMcastQpn) {
    rx_mcast(pkt);
    return;
  }
  Qp* q = qp(pkt.h.bth.dqpn);
  if (!q) {
    count(Ctr::RxNoQp);
    return;
  }
  const wire::OpcodeInfo& op = *pkt.op;
  if (op.flags & wire::kOpCnp) {
    count(Ctr::CnpReceived);
    ++q->ctr.cnp_received;
    if (cfg_.dcqcn && q->type != verbs::QpType::UD) {
      q->rp.on_cnp(now_);
      // Congestion ends slow start (RFC 3168's ECE response without the cut:
      // the rate limiter cuts): the window grows one PSN per window from here.
      if (q->req.cwnd < q->comp.ssthresh) q->comp.ssthresh = q->req.cwnd;
      if (!q->sq.empty()) req_ready(*q);  // paced from now on
    }
    return;
  }
  const auto want = q->type == verbs::QpType::RC ? wire::Transport::RC
                    : q->type == verbs::QpType::UC ? wire::Transport::UC
                                                   : wire::Transport::UD;
  if (op.transport != want) {
    count(Ctr::RxBadTransport);
    return;
  }
  if ((pkt.h.bth.pkey & 0x7FFF) != (wire::kDefaultPkey & 0x7FFF)) {  // one P_Key: the default partition
    count(Ctr::RxBadPkey);
    return;
  }
  if (!q->can_receive()) {
    count(Ctr::RxBadState);
    return;
  }
  // A connection takes packets only from its peer, to the address it uses
  // (rxe check_addr): a stranger's frames never reach its state machine.
  if (q->type != verbs::QpType::UD && !q->tx.from_peer(pkt.h.l3)) {
    count(Ctr::RxBadSrcAddr);
    return;
  }
  ++q->ctr.rx_packets;
  q->ctr.rx_bytes += pkt.payload_len;
  if (pkt.h.l3.ecn() == wire::kEcnCe) {
    count(Ctr::CeReceived);
    ++q->ctr.ce_received;
    if (cfg_.cnp) send_cnp(*q, pkt);
  }
  if (op.flags & wire::kOpRequest) {
    responder_rx(*this, *q, pkt);
  } else {
    completer_rx(*this, *q, pkt);
  }
}

}  // namespace droce::transport

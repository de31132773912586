// The daemon's own counter groups: per port (each core that owns a queue of
// the port writes its own block) and per core. The transport declares its QP
// group the same way (DROCE_COUNTERS in its own header) and registers it.
#pragma once

#include "stats/stats.h"

namespace droce::stats {

// clang-format off
#define DROCE_PORT_COUNTERS(X)                                                  \
  X(rx_packets) X(rx_bytes) X(tx_packets) X(tx_bytes)                           \
  X(rx_roce) X(rx_arp) X(rx_icmp) X(rx_nd) X(tx_arp) X(tx_icmp) X(tx_nd)        \
  X(rx_drop_not_ours) X(rx_drop_bad_header) X(rx_drop_bad_icrc)                  \
  X(rx_drop_no_qp) X(rx_drop_vlan) X(tx_drop_full) X(tx_drop_no_route)           \
  X(arp_resolved) X(arp_timeouts)                                               \
  X(fault_rx_drop) X(fault_rx_duplicate) X(fault_rx_reorder) X(fault_rx_corrupt) \
  X(fault_tx_drop) X(fault_tx_duplicate) X(fault_tx_reorder) X(fault_tx_corrupt) \
  X(tx_loopback) X(loopback_full) X(loopback_drops)                            \
  X(fault_rx_bn_drop) X(fault_rx_bn_mark) X(fault_rx_bn_max_queue)            \
  X(fault_rx_bn_pause) X(fault_rx_bn_frames) X(fault_rx_bn_over_kmax)          \
  X(fault_rx_bn_queue_sum)                                                      \
  X(fault_tx_bn_drop) X(fault_tx_bn_mark) X(fault_tx_bn_max_queue) X(fault_tx_bn_pause) \
  X(fault_tx_bn_frames) X(fault_tx_bn_over_kmax) X(fault_tx_bn_queue_sum)
DROCE_COUNTERS(PortCounter, "port", DROCE_PORT_COUNTERS);

#define DROCE_CORE_COUNTERS(X)                                                  \
  X(polls) X(busy_polls) X(rx_bursts) X(tx_bursts) X(timer_runs)                \
  X(ring_enqueued) X(ring_dequeued) X(ring_full_drops) X(ring_occupancy)        \
  X(cnp_sent) X(cnp_received) X(idle_yields) X(mcast_fanout)                     \
  X(stalls) X(stall_us) X(stall_max_us)
DROCE_COUNTERS(CoreCounter, "core", DROCE_CORE_COUNTERS);
// clang-format on

}  // namespace droce::stats

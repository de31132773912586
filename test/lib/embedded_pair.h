// Test fixture: two embedded droce nodes (engine::Embedded) over a net_ring
// pair in one process, on ports the test opens (the test's main has started
// the EAL): a = 1st address on port A, b = 2nd on port B, one queue (core
// loop) each unless `loops` asks for more (the ring pair then has as many).
// Used by test/engine/test_dataplane.cc, test/nvmf/host and test/nvmf/rdma.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cm/agent.h"
#include "dpdk/port.h"
#include "engine/embed.h"

namespace droce::testing {

// An embedded node on port p (opened by the test, no EAL of its own) with
// IPv4 address ip, `loops` core loops (the port's queues) and room for 64 QPs and 64 MRs.
inline engine::EmbedOptions embedded_on(dpdk::Port& p, const char* ip, uint16_t loops = 1) {
  engine::EmbedOptions o;
  o.port = &p;
  o.queues = loops;
  o.init_eal = false;
  o.ipv4 = {ip};
  o.engine.max_qps = 64;
  o.engine.max_mrs = 64;
  return o;
}

// Members in construction order: the ring pair, its two ports, the two nodes
// (destroyed in the reverse order: nodes before the ports they use).
struct EmbeddedPair {
  dpdk::RingPair rings;
  dpdk::Port pa, pb;
  engine::Embedded a, b;
  // name: the ring pair's (unique among the pairs alive at once); mbufs: each
  // port's pool; loops: RX/TX queues of each port = core loops of each node.
  EmbeddedPair(const char* name, const char* ip_a, const char* ip_b, uint32_t mbufs = 4095, uint16_t loops = 1)
      : rings(name, loops),
        pa(dpdk::PortConfig{.port_id = rings.port_a(), .rx_queues = loops, .tx_queues = loops, .mbufs = mbufs}),
        pb(dpdk::PortConfig{.port_id = rings.port_b(), .rx_queues = loops, .tx_queues = loops, .mbufs = mbufs}),
        a(embedded_on(pa, ip_a, loops)),
        b(embedded_on(pb, ip_b, loops)) {}
};

// Removes the first event of type t from v (into *out when out is given);
// false when v holds none. For the events a CM sink collected.
inline bool take_event(std::vector<cm::Event>& v, cm::EventType t, cm::Event* out = nullptr) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i].type == t) {
      if (out) *out = v[i];
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
  return false;
}

}  // namespace droce::testing

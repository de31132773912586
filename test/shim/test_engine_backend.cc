// lib/shim/engine (EngineShimBackend): the parts that need no dataplane.
#include <catch2/catch.hpp>
#include <cstring>

#include "shim/engine/engine_backend.h"

using namespace droce;

// A verbs application's address vector as the shim hands it to the engine. The hop limit is the
// route's (64) whatever the application asks, as Linux/rxe put on the wire: the unmodified
// ibv_*_pingpong ask for hop_limit 1 and rxe sends TTL 64 (scripts/interop.sh checks the TTL of
// every packet droce sends to rxe).
TEST_CASE("shim address vector: RoCEv2 hop limit is the route's, as on Linux", "[shim][ah]") {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.sgid_index = 1;
  const uint8_t dgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1};
  std::memcpy(a.grh.dgid.raw, dgid, 16);
  a.grh.flow_label = 0x12345;
  for (uint8_t asked : {uint8_t{0}, uint8_t{1}, uint8_t{2}, uint8_t{64}, uint8_t{255}}) {
    a.grh.hop_limit = asked;
    verbs::Ah ah;
    ah.hop_limit = 7;
    REQUIRE(shim::ah_from_verbs(a, 2, 26 << 2, ah) == 0);
    CHECK(ah.hop_limit == 64);
    CHECK(ah.hop_limit == shim::kRoceRouteHopLimit);
    CHECK(std::memcmp(ah.dgid.data(), dgid, 16) == 0);
    CHECK(ah.flow_label == 0x12345);
    CHECK(ah.traffic_class == (26 << 2));  // 0 asked: the port's DSCP
  }
  a.grh.traffic_class = 0x60;
  verbs::Ah ah;
  REQUIRE(shim::ah_from_verbs(a, 2, 26 << 2, ah) == 0);
  CHECK(ah.traffic_class == 0x60);
  // Bad attributes: clear errors, nothing else.
  ibv_ah_attr b = a;
  b.is_global = 0;
  CHECK(shim::ah_from_verbs(b, 2, 0, ah) == -EINVAL);
  b = a;
  b.port_num = 2;
  CHECK(shim::ah_from_verbs(b, 2, 0, ah) == -EINVAL);
  b = a;
  b.grh.sgid_index = 2;
  CHECK(shim::ah_from_verbs(b, 2, 0, ah) == -EINVAL);
}

// ibv_query_port's active_width x active_speed from the DPDK link speed, as Linux maps a
// RoCE netdev's (ib_get_eth_speed): ibv_devinfo shows the link's real bandwidth.
TEST_CASE("shim port rate: the Ethernet link speed as IB width and speed", "[shim][port]") {
  // ibv_port_attr's encodings (IBTA PortInfo): widths 1X = 1, 4X = 2; speeds SDR 1,
  // DDR 2, FDR10 8, EDR 32, HDR 64, NDR 128.
  constexpr uint8_t IBV_WIDTH_1X = 1, IBV_WIDTH_4X = 2;
  constexpr uint8_t IBV_SPEED_SDR = 1, IBV_SPEED_DDR = 2, IBV_SPEED_FDR10 = 8, IBV_SPEED_EDR = 32,
                    IBV_SPEED_HDR = 64, IBV_SPEED_NDR = 128;
  struct Case {
    uint32_t mbps;
    uint8_t width, speed;
  };
  for (const Case c : {Case{0, IBV_WIDTH_1X, IBV_SPEED_SDR}, Case{1000, IBV_WIDTH_1X, IBV_SPEED_SDR},
                       Case{10000, IBV_WIDTH_1X, IBV_SPEED_FDR10}, Case{20000, IBV_WIDTH_4X, IBV_SPEED_DDR},
                       Case{25000, IBV_WIDTH_1X, IBV_SPEED_EDR}, Case{40000, IBV_WIDTH_4X, IBV_SPEED_FDR10},
                       Case{50000, IBV_WIDTH_4X, IBV_SPEED_EDR}, Case{100000, IBV_WIDTH_4X, IBV_SPEED_EDR},
                       Case{200000, IBV_WIDTH_4X, IBV_SPEED_HDR}, Case{400000, IBV_WIDTH_4X, IBV_SPEED_NDR}}) {
    const shim::IbLinkRate r = shim::ib_rate_for_eth(c.mbps);
    CHECK(r.width == c.width);
    CHECK(r.speed == c.speed);
  }
}

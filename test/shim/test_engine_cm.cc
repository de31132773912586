// EngineCmBackend on the running test dataplane (engine_env.h): droce0
// (10.77.0.1) connects to a listener on droce1 (10.77.0.2) through the two
// ports' QP1s, their Agents running on the home core.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "engine_env.h"
#include "shim/engine/engine_cm.h"

using namespace droce;
using namespace droce::shim;
using namespace droce::shim::test;

namespace {

wire::Gid gid_of(uint32_t dev) { return wire::gid_from_ipv4(kDevIp[dev]); }

struct Events {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<uint32_t, cm::Event>> v;
  bool on_core_thread = true;
  std::thread::id test_thread = std::this_thread::get_id();

  CmBackend::Sink sink() {
    return [this](uint32_t dev, const cm::Event& e) {
      std::lock_guard<std::mutex> g(mu);
      if (std::this_thread::get_id() == test_thread) on_core_thread = false;
      v.emplace_back(dev, e);
      cv.notify_all();
    };
  }
  // Waits (5 s at most) for an event of type t on dev and takes it.
  bool take(uint32_t dev, cm::EventType t, cm::Event* out = nullptr) {
    std::unique_lock<std::mutex> lk(mu);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      for (size_t i = 0; i < v.size(); ++i)
        if (v[i].first == dev && v[i].second.type == t) {
          if (out) *out = v[i].second;
          v.erase(v.begin() + static_cast<long>(i));
          return true;
        }
      if (cv.wait_until(lk, deadline) == std::cv_status::timeout) return false;
    }
  }
};

}  // namespace

TEST_CASE("engine cm: addresses, routes and GID indexes from the ports' GID tables", "[cm]") {
  EngineCmBackend be(dataplane(), backend_config());
  uint32_t dev = 9;
  REQUIRE(be.cm_local_dev(gid_of(1), &dev) == 0);
  CHECK(dev == 1);
  CHECK(be.cm_local_dev(wire::gid_from_ipv4(0x0A4D0063), &dev) == -EADDRNOTAVAIL);
  CHECK(be.cm_gid_index(0, gid_of(0)) == static_cast<int>(kRoceGidIndex));
  CHECK(be.cm_gid_index(0, gid_of(1)) == -ENOENT);
  CHECK(be.cm_gid_index(7, gid_of(0)) == -ENODEV);
  // 10.77.0.2 is droce1's own: reached through droce1 itself, from that
  // address (the dataplane loops frames to its own MAC back).
  wire::Gid src{};
  REQUIRE(be.cm_route(gid_of(1), &dev, &src) == 0);
  CHECK(dev == 1);
  CHECK(src == gid_of(1));
  REQUIRE(be.cm_route(gid_of(0), &dev, &src) == 0);
  CHECK(dev == 0);
  CHECK(src == gid_of(0));
  REQUIRE(be.cm_route(wire::gid_from_ipv4(0x0A4D0063), &dev, &src) == 0);
  CHECK(src == gid_of(dev));
  wire::Gid v6{};
  v6[0] = 0x20;
  v6[1] = 0x01;
  v6[15] = 1;
  CHECK(be.cm_route(v6, &dev, &src) == -ENETUNREACH);  // no global IPv6 address on these ports
  // Resolution: one step at a time, never a wait.
  int rc = -EINPROGRESS;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (rc == -EINPROGRESS && std::chrono::steady_clock::now() < deadline) {
    rc = be.cm_resolve(0, gid_of(1));
    if (rc == -EINPROGRESS) std::this_thread::yield();
  }
  CHECK(rc == 0);
  wire::Gid nobody{};
  std::memcpy(nobody.data(), unreachable_gid().raw, 16);
  CHECK(be.cm_resolve(0, nobody) == -EINPROGRESS);
  CHECK(be.cm_resolve(5, nobody) == -ENODEV);
  // Each port's QP1 lives on its home core's engine.
  for (uint32_t p = 0; p < 2; ++p) {
    const size_t home = dataplane().home_core(p);
    bool has = false;
    REQUIRE(dataplane().run_on(home, [&](engine::CoreLoop& c) { has = c.engine(p)->qp(1) != nullptr; }));
    CHECK(has);
  }
}

TEST_CASE("engine cm: connect, accept, establish and disconnect between two ports through QP1", "[cm]") {
  Events ev;
  EngineCmBackend be(dataplane(), backend_config());
  be.cm_set_sink(ev.sink());
  cm::ConnId l = 0, act = 0;
  REQUIRE(be.cm_listen(1, cm::PortSpace::Tcp, {{}, 7471}, cm::QpKind::Rc, 99, &l) == 0);
  CHECK(be.cm_listen(1, cm::PortSpace::Tcp, {{}, 7471}, cm::QpKind::Rc, 98, nullptr) == -EADDRINUSE);
  cm::ConnectArgs a;
  a.local = {gid_of(0), 40000};
  a.remote = {gid_of(1), 7471};
  a.param.qpn = 0x123;
  a.param.private_data_len = 4;
  std::memcpy(a.param.private_data, "ping", 4);
  REQUIRE(be.cm_connect(0, a, 5, &act) == 0);
  cm::Event req;
  REQUIRE(ev.take(1, cm::EventType::ConnectRequest, &req));
  CHECK(req.listen_id == l);
  CHECK(req.user == 99);
  CHECK(req.remote.ip == gid_of(0));
  CHECK(req.remote.port == 40000);
  CHECK(req.local.ip == gid_of(1));
  CHECK(std::memcmp(req.param.private_data, "ping", 4) == 0);
  CHECK(be.cm_set_user(1, req.id, 77) == 0);
  cm::ConnParam acc;
  acc.qpn = 0x456;
  REQUIRE(be.cm_accept(1, req.id, acc) == 0);
  CHECK(be.cm_accept(1, req.id, acc) == -EINVAL);
  cm::Event rep;
  REQUIRE(ev.take(0, cm::EventType::ConnectResponse, &rep));
  CHECK(rep.user == 5);
  CHECK(rep.param.qpn == 0x456);
  cm::QpParams qa{}, qb{};
  REQUIRE(be.cm_qp_params(0, act, &qa) == 0);
  REQUIRE(be.cm_qp_params(1, req.id, &qb) == 0);
  CHECK(qa.dest_qpn == 0x456);
  CHECK(qb.dest_qpn == 0x123);
  CHECK(qa.rq_psn == qb.sq_psn);
  CHECK(qa.dgid == gid_of(1));
  CHECK(qa.path_mtu <= 3);  // the ports' links carry 1500 bytes: IB MTU 1024
  REQUIRE(be.cm_establish(0, act) == 0);
  cm::Event est;
  REQUIRE(ev.take(1, cm::EventType::Established, &est));
  CHECK(est.user == 77);
  std::vector<cm::ConnInfo> conns;
  REQUIRE(be.connections(0, conns) == 0);
  REQUIRE(conns.size() == 1);
  CHECK(conns[0].state == cm::ConnState::Established);
  REQUIRE(be.cm_disconnect(0, act) == 0);
  REQUIRE(ev.take(1, cm::EventType::Disconnected));
  REQUIRE(ev.take(0, cm::EventType::Disconnected));
  std::vector<std::pair<std::string, uint64_t>> ctr;
  REQUIRE(be.counters(0, ctr) == 0);
  auto get = [&](const std::string& n) {
    for (auto& [k, v] : ctr)
      if (k == n) return v;
    FAIL("no counter " << n);
    return uint64_t{0};
  };
  CHECK(get("gsi_tx_mads") >= 3);  // REQ, RTU, DREQ
  CHECK(get("gsi_rx_mads") >= 2);  // REP, DREP
  CHECK(get("gsi_rx_short") == 0);
  be.cm_destroy(0, act);
  be.cm_destroy(1, req.id);
  be.cm_destroy(1, l);
  CHECK(ev.on_core_thread);  // events came from the core, not the caller
  CHECK(be.cm_listen(4, cm::PortSpace::Tcp, {{}, 1}, cm::QpKind::Rc, 0, nullptr) == -ENODEV);
}

TEST_CASE("engine cm: a connect to our own address: REQ/REP/RTU/DREQ from QP1 to QP1 of one port (loopback)", "[cm]") {
  Events ev;
  EngineCmBackend be(dataplane(), backend_config());
  be.cm_set_sink(ev.sink());
  uint32_t dev = 9;
  wire::Gid src{};
  REQUIRE(be.cm_route(gid_of(0), &dev, &src) == 0);
  REQUIRE(dev == 0);
  REQUIRE(be.cm_resolve(0, gid_of(0)) == 0);  // our own MAC, at once
  cm::ConnId l = 0, act = 0;
  REQUIRE(be.cm_listen(0, cm::PortSpace::Tcp, {{}, 7480}, cm::QpKind::Rc, 5, &l) == 0);
  cm::ConnectArgs a;
  a.local = {gid_of(0), 40100};
  a.remote = {gid_of(0), 7480};
  a.param.qpn = 0x321;
  REQUIRE(be.cm_connect(0, a, 6, &act) == 0);
  cm::Event req;
  REQUIRE(ev.take(0, cm::EventType::ConnectRequest, &req));
  CHECK(req.listen_id == l);
  CHECK(req.remote.ip == gid_of(0));
  CHECK(req.remote.port == 40100);
  cm::ConnParam acc;
  acc.qpn = 0x654;
  REQUIRE(be.cm_accept(0, req.id, acc) == 0);
  cm::Event rep;
  REQUIRE(ev.take(0, cm::EventType::ConnectResponse, &rep));
  CHECK(rep.user == 6);
  CHECK(rep.param.qpn == 0x654);
  cm::QpParams qa{}, qb{};
  REQUIRE(be.cm_qp_params(0, act, &qa) == 0);
  REQUIRE(be.cm_qp_params(0, req.id, &qb) == 0);
  CHECK(qa.dest_qpn == 0x654);
  CHECK(qb.dest_qpn == 0x321);
  CHECK(qa.dgid == gid_of(0));
  CHECK(qb.dgid == gid_of(0));
  REQUIRE(be.cm_establish(0, act) == 0);
  REQUIRE(ev.take(0, cm::EventType::Established));
  REQUIRE(be.cm_disconnect(0, act) == 0);
  REQUIRE(ev.take(0, cm::EventType::Disconnected));
  REQUIRE(ev.take(0, cm::EventType::Disconnected));
  be.cm_destroy(0, act);
  be.cm_destroy(0, req.id);
  be.cm_destroy(0, l);
}

TEST_CASE("engine cm: a connect to an address nobody answers ends Unreachable, not blocked", "[cm]") {
  Events ev;
  EngineCmConfig cc;
  cc.agent.cm_response_timeout = 8;  // ~1 ms per try
  cc.agent.max_cm_retries = 3;
  EngineCmBackend be(dataplane(), backend_config(), cc);
  be.cm_set_sink(ev.sink());
  cm::ConnectArgs a;
  a.local = {gid_of(0), 40001};
  std::memcpy(a.remote.ip.data(), unreachable_gid().raw, 16);
  a.remote.port = 7471;
  cm::ConnId act = 0;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(be.cm_connect(0, a, 1, &act) == 0);  // returns at once: the MAC is resolved later
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
  REQUIRE(ev.take(0, cm::EventType::Unreachable));
  std::vector<std::pair<std::string, uint64_t>> ctr;
  REQUIRE(be.counters(0, ctr) == 0);
  uint64_t no_mac = 0;
  for (auto& [k, v] : ctr)
    if (k == "gsi_tx_no_mac") no_mac = v;
  CHECK(no_mac >= 1);
}

// AgentPairCm: a CmBackend made of two real cm::Agents (devices 0 and 1, the
// addresses of engine_env.h: 10.77.0.1 and 10.77.0.2) whose MADs cross an
// in-memory wire. A thread plays the engine core: it carries the MADs, ticks
// the agents' timers every millisecond and so calls the server's sink off the
// server thread, as droced's cores do. The state machine is the real one; only
// the GSI QP and ARP are replaced: addresses of the two devices resolve at once,
// 10.77.0.98 after a few steps, other addresses of 10.77.0.0/24 never
// (-EINPROGRESS until the server gives up), anything else has no route.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cm/agent.h"
#include "engine_env.h"
#include "shim/cm_backend.h"

namespace droce::shim::test {

class AgentPairCm final : public CmBackend {
 public:
  static cm::AgentConfig test_config() {
    cm::AgentConfig c;
    c.cm_response_timeout = 14;  // 67 ms
    c.max_cm_retries = 3;
    c.timewait_ns = 50'000'000;
    return c;
  }
  explicit AgentPairCm(cm::AgentConfig cfg = test_config()) {
    for (uint32_t d = 0; d < 2; d++) {
      ports_[d].owner = this;
      ports_[d].dev = d;
      ports_[d].ip = wire::gid_from_ipv4(kDevIp[d]);
      cm::AgentConfig c = cfg;
      c.ca_guid = 0x0200000000000100ull + d;
      agents_[d] = std::make_unique<cm::Agent>(c, ports_[d], [this, d](const cm::Event& e) {
        if (hold_)
          held_.emplace_back(d, e);
        else if (sink_)
          sink_(d, e);
      });
    }
    core_ = std::thread([this] { loop(); });
  }
  ~AgentPairCm() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    core_.join();
  }

  CmBackend* get() { return this; }
  // Drops every MAD sent to dev while set (a peer that went silent).
  void blackhole(uint32_t dev, bool on) {
    std::lock_guard lk(mu_);
    blackhole_[dev] = on;
  }
  // While held, events wait here instead of reaching the server (a server
  // thread that has not routed them yet); released in order.
  void hold_events(bool on) {
    std::lock_guard lk(mu_);
    hold_ = on;
    if (on) return;
    for (auto& [d, e] : held_)
      if (sink_) sink_(d, e);
    held_.clear();
  }
  std::vector<cm::ConnInfo> connections(uint32_t dev) {
    std::lock_guard lk(mu_);
    return agents_[dev]->connections();
  }
  uint64_t counter(uint32_t dev, cm::CmCtr c) {
    std::lock_guard lk(mu_);
    return agents_[dev]->counter(c);
  }

  void cm_set_sink(Sink sink) override {
    std::lock_guard lk(mu_);
    sink_ = std::move(sink);
  }
  int cm_local_dev(const wire::Gid& ip, uint32_t* dev) override {
    for (uint32_t d = 0; d < 2; d++)
      if (ports_[d].ip == ip) {
        *dev = d;
        return 0;
      }
    return -EADDRNOTAVAIL;
  }
  int cm_route(const wire::Gid& dst, uint32_t* dev, wire::Gid* src) override {
    if (!wire::gid_is_ipv4_mapped(dst) || (wire::gid_to_ipv4(dst) & 0xffffff00u) != (kDevIp[0] & 0xffffff00u))
      return -ENETUNREACH;
    // The two devices are wired to each other: each reaches the other's address.
    *dev = dst == ports_[0].ip ? 1 : 0;
    *src = ports_[*dev].ip;
    return 0;
  }
  int cm_resolve(uint32_t dev, const wire::Gid& dst) override {
    if (dev > 1) return -ENODEV;
    if (dst == ports_[0].ip || dst == ports_[1].ip) return 0;
    if (dst == wire::gid_from_ipv4((kDevIp[0] & 0xffffff00u) | 98)) return ++slow_steps_ >= 5 ? 0 : -EINPROGRESS;
    uint32_t d;
    wire::Gid s;
    return cm_route(dst, &d, &s) == 0 ? -EINPROGRESS : -EHOSTUNREACH;
  }
  int cm_gid_index(uint32_t dev, const wire::Gid& ip) override {
    return dev < 2 && ports_[dev].ip == ip ? static_cast<int>(kRoceGidIndex) : -ENOENT;
  }
  int cm_listen(uint32_t dev, cm::PortSpace ps, const cm::Endpoint& bound, cm::QpKind kind, uint64_t user,
                cm::ConnId* out) override {
    return call(dev, [&](cm::Agent& a) { return a.listen(ps, bound, kind, user, out); });
  }
  int cm_connect(uint32_t dev, const cm::ConnectArgs& args, uint64_t user, cm::ConnId* out) override {
    return call(dev, [&](cm::Agent& a) { return a.connect(args, user, out); });
  }
  int cm_accept(uint32_t dev, cm::ConnId id, const cm::ConnParam& p) override {
    return call(dev, [&](cm::Agent& a) { return a.accept(id, p); });
  }
  int cm_reject(uint32_t dev, cm::ConnId id, std::span<const uint8_t> pd) override {
    return call(dev, [&](cm::Agent& a) { return a.reject(id, pd); });
  }
  int cm_establish(uint32_t dev, cm::ConnId id) override {
    return call(dev, [&](cm::Agent& a) { return a.establish(id); });
  }
  int cm_disconnect(uint32_t dev, cm::ConnId id) override {
    return call(dev, [&](cm::Agent& a) { return a.disconnect(id); });
  }
  void cm_destroy(uint32_t dev, cm::ConnId id) override {
    call(dev, [&](cm::Agent& a) {
      a.destroy(id);
      return 0;
    });
  }
  int cm_qp_params(uint32_t dev, cm::ConnId id, cm::QpParams* out) override {
    return call(dev, [&](cm::Agent& a) { return a.qp_params(id, *out); });
  }
  int cm_set_user(uint32_t dev, cm::ConnId id, uint64_t user) override {
    return call(dev, [&](cm::Agent& a) { return a.set_user(id, user); });
  }

 private:
  struct Port final : cm::Agent::Io {
    AgentPairCm* owner = nullptr;
    uint32_t dev = 0;
    wire::Gid ip{};
    // Called with mu_ held (every agent call is).
    bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t, std::span<const uint8_t> mad) override {
      Mad m;
      m.to = remote == owner->ports_[1 - dev].ip ? 1 - dev : 2;
      m.src = local;
      m.dst = remote;
      std::memcpy(m.bytes, mad.data(), cm::kMadSize);
      if (m.to < 2 && !owner->blackhole_[m.to]) owner->wire_.push_back(m);
      owner->cv_.notify_all();
      return true;
    }
    bool is_local(const wire::Gid& g) const override { return g == ip; }
  };
  struct Mad {
    uint32_t to;
    wire::Gid src, dst;
    uint8_t bytes[cm::kMadSize];
  };
  template <typename F>
  int call(uint32_t dev, F f) {
    if (dev > 1) return -ENODEV;
    std::lock_guard lk(mu_);
    const int rc = f(*agents_[dev]);
    return rc > 0 ? -rc : rc;
  }
  static uint64_t now_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  void loop() {
    std::unique_lock lk(mu_);
    while (!stop_) {
      for (int i = 0; i < 1000 && !wire_.empty(); i++) {
        Mad m = wire_.front();
        wire_.pop_front();
        agents_[m.to]->on_mad(m.src, m.dst, cm::kGsiQpn, std::span<const uint8_t>(m.bytes, cm::kMadSize));
      }
      const uint64_t now = now_ns();
      agents_[0]->tick(now);
      agents_[1]->tick(now);
      cv_.wait_for(lk, std::chrono::milliseconds(1), [this] { return stop_ || !wire_.empty(); });
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool blackhole_[2] = {false, false};
  bool hold_ = false;
  std::vector<std::pair<uint32_t, cm::Event>> held_;
  std::deque<Mad> wire_;
  Port ports_[2];
  std::unique_ptr<cm::Agent> agents_[2];
  Sink sink_;
  int slow_steps_ = 0;
  std::thread core_;
};

}  // namespace droce::shim::test

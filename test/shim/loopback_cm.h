// TEST DOUBLE, not shipped: a CmBackend for the loopback backend's one
// device (loopback_backend.h, address 10.99.0.1, GID index 1). A real
// cm::Agent runs the CM; the MADs it sends to 10.99.0.1 come back to it (the
// device talks to itself, as the loopback backend's QPs do), so a listener
// and a connecting program on the same test server connect through REQ/REP/RTU
// and DREQ/DREP like two nodes would. The agent runs on a thread of its own
// (MADs delivered and timers ticked every millisecond); every call takes its
// mutex, so the agent stays single-threaded.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "cm/agent.h"
#include "shim/cm_backend.h"

namespace droce::shim::test {

class LoopbackCm : public CmBackend, private cm::Agent::Io {
 public:
  static constexpr uint8_t kAddr[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1};

  LoopbackCm() {
    std::memcpy(addr_.data(), kAddr, 16);
    cm::AgentConfig cfg;
    cfg.ca_guid = 0x020203fffe040506ull;
    agent_ = std::make_unique<cm::Agent>(cfg, static_cast<cm::Agent::Io&>(*this), [this](const cm::Event& e) {
      if (sink_) sink_(0, e);
    });
    thread_ = std::thread([this] { pump(); });
  }
  ~LoopbackCm() override {
    stop_ = true;
    thread_.join();
  }

  void cm_set_sink(Sink sink) override {
    std::lock_guard<std::mutex> g(mu_);
    sink_ = std::move(sink);
  }
  int cm_local_dev(const wire::Gid& ip, uint32_t* dev) override {
    if (ip != addr_) return -EADDRNOTAVAIL;
    *dev = 0;
    return 0;
  }
  int cm_route(const wire::Gid& dst, uint32_t* dev, wire::Gid* src) override {
    if (dst != addr_) return -ENETUNREACH;
    *dev = 0;
    *src = addr_;
    return 0;
  }
  int cm_resolve(uint32_t dev, const wire::Gid& dst) override {
    return dev == 0 && dst == addr_ ? 0 : -EHOSTUNREACH;
  }
  int cm_gid_index(uint32_t dev, const wire::Gid& ip) override { return dev == 0 && ip == addr_ ? 1 : -ENOENT; }

  int cm_listen(uint32_t dev, cm::PortSpace ps, const cm::Endpoint& bound, cm::QpKind kind, uint64_t user,
                cm::ConnId* out) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->listen(ps, bound, kind, user, out));
  }
  int cm_connect(uint32_t dev, const cm::ConnectArgs& a, uint64_t user, cm::ConnId* out) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->connect(a, user, out));
  }
  int cm_accept(uint32_t dev, cm::ConnId id, const cm::ConnParam& p) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->accept(id, p));
  }
  int cm_reject(uint32_t dev, cm::ConnId id, std::span<const uint8_t> pd) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->reject(id, pd));
  }
  int cm_establish(uint32_t dev, cm::ConnId id) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->establish(id));
  }
  int cm_disconnect(uint32_t dev, cm::ConnId id) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->disconnect(id));
  }
  void cm_destroy(uint32_t dev, cm::ConnId id) override {
    if (dev != 0) return;
    std::lock_guard<std::mutex> g(mu_);
    agent_->destroy(id);
  }
  int cm_qp_params(uint32_t dev, cm::ConnId id, cm::QpParams* out) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->qp_params(id, *out));
  }
  int cm_set_user(uint32_t dev, cm::ConnId id, uint64_t user) override {
    if (dev != 0) return -ENODEV;
    std::lock_guard<std::mutex> g(mu_);
    return neg(agent_->set_user(id, user));
  }

  // Connections the agent still holds (0 once every program is gone and
  // TimeWait passed).
  size_t connections() {
    std::lock_guard<std::mutex> g(mu_);
    return agent_->connections().size();
  }

 private:
  static int neg(int e) { return e > 0 ? -e : e; }

  // Agent::Io (called with mu_ held, from inside the agent).
  bool send_mad(const wire::Gid& local, const wire::Gid& remote, uint8_t, std::span<const uint8_t> mad) override {
    if (remote != addr_) return true;  // nobody else on this wire: lost
    out_.push_back(Mad{local, remote, std::vector<uint8_t>(mad.begin(), mad.end())});
    return true;
  }
  bool is_local(const wire::Gid& ip) const override { return ip == addr_; }

  void pump() {
    const auto t0 = std::chrono::steady_clock::now();
    while (!stop_) {
      {
        std::lock_guard<std::mutex> g(mu_);
        // MADs sent while handling these go out on the next round.
        std::deque<Mad> batch;
        batch.swap(out_);
        for (const Mad& m : batch) agent_->on_mad(m.src, m.dst, 1, m.bytes);
        agent_->tick(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  struct Mad {
    wire::Gid src, dst;
    std::vector<uint8_t> bytes;
  };
  wire::Gid addr_{};
  std::mutex mu_;
  Sink sink_;
  std::unique_ptr<cm::Agent> agent_;
  std::deque<Mad> out_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace droce::shim::test

// droced's skeleton: a Daemon is an ordered list of Components, started in
// order and stopped in reverse; the main thread waits in Daemon::run() for
// SIGINT/SIGTERM or a `shutdown` command.
//
// Components shipped here: StatsComponent (counter blocks for every port and
// core, registered for `counters`) and ControlComponent (the control socket
// with status/counters/fault/shutdown). The dataplane (EAL, ports, cores,
// transport) plugs in as one more Component between the two, using
// DaemonContext for the config, the counter blocks and the fault table, and
// adding its own commands (qps, mrs, arp) to the control server before it
// starts.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "config/fault_table.h"
#include "control/server.h"
#include "stats/groups.h"
#include "stats/stats.h"

namespace droce::daemon {

inline constexpr std::string_view kVersion = "0.1.0";

class Component {
 public:
  virtual ~Component() = default;
  virtual std::string_view name() const = 0;
  // Throws std::runtime_error with a clear message when it cannot start.
  virtual void start() = 0;
  // Must not throw; called only after a successful start().
  virtual void stop() noexcept = 0;
};

// Wakes the main thread: from the control thread (`shutdown`) or anywhere else.
class ShutdownLatch {
 public:
  ShutdownLatch();
  ~ShutdownLatch();
  ShutdownLatch(const ShutdownLatch&) = delete;
  ShutdownLatch& operator=(const ShutdownLatch&) = delete;
  void request(std::string reason) noexcept;
  int fd() const { return fd_; }
  std::string reason() const;

 private:
  int fd_;
  std::atomic<bool> requested_{false};
  std::string reason_;  // written once, before the eventfd write
};

// Everything the components share. Owned by main(), outlives the components.
struct DaemonContext {
  config::Config cfg;
  std::string config_path;
  // For rte_eal_init, without argv[0]: cfg.eal.args, then --lcores/--main-lcore
  // from [eal], then the command line's arguments after --.
  std::vector<std::string> eal_args;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  stats::Registry registry;
  std::unique_ptr<config::FaultTable> faults;
  // Counter blocks: port_counters[p][c] is core c's block for port p;
  // core_counters[c] is core c's own. Core index = index in cfg.cores.
  std::vector<std::unique_ptr<stats::PerCore<stats::PortCounter>>> port_counters;
  std::unique_ptr<stats::PerCore<stats::CoreCounter>> core_counters;
  ShutdownLatch shutdown;
  std::vector<std::string> running;  // names of started components (main thread writes before control starts)
};

class Daemon {
 public:
  explicit Daemon(DaemonContext& ctx) : ctx_(ctx) {}
  ~Daemon() { stop(); }
  void add(std::unique_ptr<Component> c) { components_.push_back(std::move(c)); }
  // Starts every component in order; if one fails, stops those already
  // started (in reverse) and rethrows.
  void start();
  // Blocks until SIGINT/SIGTERM (must be blocked in every thread, see
  // block_signals()) or a shutdown request. Returns the reason.
  std::string run();
  // Stops the started components in reverse order. Idempotent.
  void stop() noexcept;

 private:
  DaemonContext& ctx_;
  std::vector<std::unique_ptr<Component>> components_;
  size_t started_ = 0;
};

// Blocks SIGINT, SIGTERM and SIGHUP (log reopen) in the calling thread (call before any
// thread starts so every thread inherits it) and ignores SIGPIPE.
void block_signals();

// Builds the EAL argument list: config args, -l/--main-lcore from [eal], then
// the command line's extra arguments.
std::vector<std::string> eal_arguments(const config::Config& cfg, const std::vector<std::string>& extra);

class StatsComponent : public Component {
 public:
  explicit StatsComponent(DaemonContext& ctx) : ctx_(ctx) {}
  std::string_view name() const override { return "stats"; }
  void start() override;
  void stop() noexcept override;

 private:
  DaemonContext& ctx_;
  std::vector<stats::Registry::Id> ids_;
};

class ControlComponent : public Component {
 public:
  explicit ControlComponent(DaemonContext& ctx);
  std::string_view name() const override { return "control"; }
  // Lets other components add commands before start().
  control::Server& server() { return server_; }
  // Adds `key` to the `status` answer, filled by `fill` on the control thread
  // (e.g. the dataplane's link states). Only before start().
  void add_status(std::string key, std::function<control::json()> fill);
  void start() override;
  void stop() noexcept override;

 private:
  control::json status() const;
  control::json counters(const control::json& args) const;
  control::json fault_get(const control::json& args) const;
  control::json fault_set(const control::json& args);
  control::json port_faults(size_t port) const;

  DaemonContext& ctx_;
  control::Server server_;
  stats::Registry::Id counters_id_ = 0;
  std::vector<std::pair<std::string, std::function<control::json()>>> status_extra_;
};

}  // namespace droce::daemon

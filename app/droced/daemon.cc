#include "daemon.h"

#include "log/log.h"

#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>

namespace droce::daemon {

using control::CommandError;
using control::json;

namespace {
std::mutex g_reason_mu;
}

// ---------------------------------------------------------------- shutdown

ShutdownLatch::ShutdownLatch() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
}

ShutdownLatch::~ShutdownLatch() { close(fd_); }

void ShutdownLatch::request(std::string reason) noexcept {
  bool expected = false;
  if (!requested_.compare_exchange_strong(expected, true)) return;
  {
    std::lock_guard lock(g_reason_mu);
    reason_ = std::move(reason);
  }
  uint64_t one = 1;
  if (write(fd_, &one, sizeof one) != sizeof one) {
    // Cannot happen with a fresh eventfd; the signal path still works.
  }
}

std::string ShutdownLatch::reason() const {
  std::lock_guard lock(g_reason_mu);
  return reason_;
}

void block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::vector<std::string> eal_arguments(const config::Config& cfg, const std::vector<std::string>& extra) {
  std::vector<std::string> a = cfg.eal.args;
  if (!cfg.eal.lcores.empty()) {
    a.push_back("--lcores");
    a.push_back(cfg.eal.lcores);
  }
  if (cfg.eal.main_lcore) a.push_back("--main-lcore=" + std::to_string(*cfg.eal.main_lcore));
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// ---------------------------------------------------------------- daemon

void Daemon::start() {
  for (; started_ < components_.size(); ++started_) {
    Component& c = *components_[started_];
    try {
      c.start();
    } catch (...) {
      spdlog::error("droced: {} failed to start; stopping the others", c.name());
      stop();
      throw;
    }
    ctx_.running.emplace_back(c.name());
    spdlog::debug("droced: {} started", c.name());
  }
}

void Daemon::stop() noexcept {
  while (started_ > 0) {
    Component& c = *components_[--started_];
    spdlog::debug("droced: stopping {}", c.name());
    c.stop();
  }
}

std::string Daemon::run() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) throw std::runtime_error(std::string("signalfd: ") + std::strerror(errno));
  std::string reason;
  for (;;) {
    pollfd fds[2] = {{sfd, POLLIN, 0}, {ctx_.shutdown.fd(), POLLIN, 0}};
    int rc = poll(fds, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      reason = std::string("poll failed: ") + std::strerror(errno);
      break;
    }
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si{};
      if (read(sfd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGHUP) {
          // logrotate: reopen the log file. The config is not reloaded.
          try {
            if (log::reopen()) spdlog::info("droced: SIGHUP: log file reopened");
          } catch (const std::exception& e) {
            spdlog::error("droced: SIGHUP: {}; still writing the old file", e.what());
          }
          continue;
        }
        const char* abbrev = sigabbrev_np(static_cast<int>(si.ssi_signo));
        reason = "received SIG";
        reason += abbrev != nullptr ? abbrev : std::to_string(si.ssi_signo).c_str();
        reason += " from pid " + std::to_string(si.ssi_pid);
        break;
      }
    }
    if (fds[1].revents & POLLIN) {
      reason = ctx_.shutdown.reason();
      break;
    }
  }
  close(sfd);
  return reason;
}

// ---------------------------------------------------------------- stats

void StatsComponent::start() {
  const size_t ncores = ctx_.cfg.cores.size();
  ctx_.core_counters = std::make_unique<stats::PerCore<stats::CoreCounter>>(ncores);
  for (const config::PortConfig& p : ctx_.cfg.ports) {
    ctx_.port_counters.push_back(std::make_unique<stats::PerCore<stats::PortCounter>>(ncores));
    ids_.push_back(ctx_.registry.add(stats::PortCounter_group, p.name, *ctx_.port_counters.back()));
    std::vector<std::string> lcores;
    for (const auto& c : ctx_.cfg.cores) lcores.push_back(std::to_string(c.lcore));
    ctx_.registry.label_shards(ids_.back(), std::move(lcores));
  }
  for (size_t c = 0; c < ncores; ++c) {
    ids_.push_back(ctx_.registry.add(stats::CoreCounter_group, std::to_string(ctx_.cfg.cores[c].lcore),
                                     (*ctx_.core_counters)[c]));
  }
}

void StatsComponent::stop() noexcept {
  for (auto id : ids_) ctx_.registry.remove(id);
  ids_.clear();
  ctx_.port_counters.clear();
  ctx_.core_counters.reset();
}

// ---------------------------------------------------------------- control

namespace {

control::ServerOptions server_options(const config::ControlConfig& c) {
  control::ServerOptions o;
  o.path = c.socket;
  o.mode = c.mode;
  if (c.gid) o.gid = static_cast<gid_t>(*c.gid);
  o.max_request = c.max_request;
  o.max_clients = c.max_clients;
  o.idle_timeout_ms = static_cast<int>(c.idle_timeout_ms);
  return o;
}

json rates_json(const config::FaultRates& r) {
  // Stored as 32-bit thresholds: show the probability to 9 digits.
  auto p = [](double v) { return std::round(v * 1e9) / 1e9; };
  return {{"drop", p(r.drop)}, {"duplicate", p(r.duplicate)}, {"reorder", p(r.reorder)}, {"corrupt", p(r.corrupt)}};
}

}  // namespace

ControlComponent::ControlComponent(DaemonContext& ctx) : ctx_(ctx), server_(server_options(ctx.cfg.control)) {
  server_.add("status", "daemon, ports, cores and components", [this](const json&) { return status(); });
  server_.add("counters", "counters by group (args: group, nonzero, per_core)", [this](const json& a) { return counters(a); });
  server_.add("fault get", "fault injection settings (args: port)", [this](const json& a) { return fault_get(a); });
  server_.add("fault set", "change fault injection (args: port, dir, drop, duplicate, reorder, corrupt, seed)",
              [this](const json& a) { return fault_set(a); });
  server_.add("shutdown", "stop the daemon cleanly", [this](const json&) {
    ctx_.shutdown.request("shutdown requested over the control socket");
    return json{{"stopping", true}};
  });
}

void ControlComponent::add_status(std::string key, std::function<json()> fill) {
  if (server_.running()) throw std::logic_error("add_status(" + key + ") after start()");
  status_extra_.emplace_back(std::move(key), std::move(fill));
}

void ControlComponent::start() {
  counters_id_ = ctx_.registry.add(control::ControlCounter_group, "socket", server_.counters());
  try {
    server_.start();
  } catch (...) {
    ctx_.registry.remove(counters_id_);
    throw;
  }
}

void ControlComponent::stop() noexcept {
  server_.stop();
  ctx_.registry.remove(counters_id_);
}

json ControlComponent::status() const {
  const auto& cfg = ctx_.cfg;
  json ports = json::array();
  for (const auto& p : cfg.ports) {
    json v4 = json::array(), v6 = json::array();
    for (const auto& a : p.ipv4) v4.push_back(config::format_ipv4(a));
    for (const auto& a : p.ipv6) v6.push_back(config::format_ipv6(a));
    ports.push_back({{"name", p.name},
                     {"device", p.device},
                     {"rxq", p.rx_queues},
                     {"txq", p.tx_queues},
                     {"mtu", p.mtu},
                     {"mac", p.mac ? config::format_mac(*p.mac) : "device"},
                     {"ipv4", v4},
                     {"ipv6", v6},
                     {"vlan", p.vlan ? json(*p.vlan) : json("-")},
                     {"dscp", p.dscp},
                     {"ecn", p.ecn}});
  }
  json cores = json::array();
  for (const auto& c : cfg.cores) {
    json qs = json::array();
    for (const auto& q : c.queues) {
      qs.push_back(cfg.ports[q.port].name + ":rx" + std::to_string(q.rx) + "/tx" + std::to_string(q.tx));
    }
    cores.push_back({{"lcore", c.lcore}, {"queues", qs}});
  }
  auto up = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx_.started).count();
  json out = {{"pid", getpid()},
          {"version", kVersion},
          {"uptime_s", std::round(up * 10) / 10},
          {"config", ctx_.config_path},
          {"components", ctx_.running},
          {"eal_args", ctx_.eal_args},
          {"path_mtu", cfg.roce.path_mtu},
          {"max_qps", cfg.roce.max_qps},
          {"max_mrs", cfg.roce.max_mrs},
          {"mr_memory_mb", cfg.roce.mr_memory_mb},
          {"control_clients", server_.clients()},
          {"ports", ports},
          {"cores", cores}};
  for (const auto& [key, fill] : status_extra_) out[key] = fill();
  return out;
}

json ControlComponent::counters(const json& args) const {
  std::string group;
  if (auto it = args.find("group"); it != args.end()) {
    if (!it->is_string()) throw CommandError("counters: group must be a string");
    group = it->get<std::string>();
  }
  bool nonzero = false;
  if (auto it = args.find("nonzero"); it != args.end()) {
    if (!it->is_boolean()) throw CommandError("counters: nonzero must be true or false");
    nonzero = it->get<bool>();
  }
  bool per_core = false;
  if (auto it = args.find("per_core"); it != args.end()) {
    if (!it->is_boolean()) throw CommandError("counters: per_core must be true or false");
    per_core = it->get<bool>();
  }
  for (const auto& [k, v] : args.items()) {
    if (k != "group" && k != "nonzero" && k != "per_core") {
      throw CommandError("counters: unknown argument '" + k + "'");
    }
  }
  auto groups = ctx_.registry.groups();
  if (!group.empty() && std::find(groups.begin(), groups.end(), group) == groups.end()) {
    std::string list;
    for (const auto& g : groups) {
      if (!list.empty()) list += ", ";
      list += g;
    }
    throw CommandError("counters: no group '" + group + "' (groups: " + list + ")");
  }
  json out = json::array();
  for (const auto& g : ctx_.registry.snapshot(group, nonzero, per_core)) {
    json inst = json::array();
    for (const auto& i : g.instances) {
      json one = {{"name", i.name}, {"values", i.values}};
      if (per_core) {
        json shards = json::array();
        for (size_t s = 0; s < i.shards.size(); ++s) {
          shards.push_back({{"core", i.shard_labels[s]}, {"values", i.shards[s]}});
        }
        one["per_core"] = shards;
      }
      inst.push_back(std::move(one));
    }
    out.push_back({{"group", g.group}, {"names", g.names}, {"instances", inst}});
  }
  return {{"groups", out}};
}

json ControlComponent::port_faults(size_t i) const {
  const config::PortFaults& f = (*ctx_.faults)[i];
  return {{"port", ctx_.cfg.ports[i].name},
          {"seed", f.seed.load(std::memory_order_relaxed)},
          {"rx", rates_json(f.rates(config::FaultDir::rx))},
          {"tx", rates_json(f.rates(config::FaultDir::tx))}};
}

json ControlComponent::fault_get(const json& args) const {
  json ports = json::array();
  std::string only;
  if (auto it = args.find("port"); it != args.end()) {
    if (!it->is_string()) throw CommandError("fault get: port must be a port name");
    only = it->get<std::string>();
    if (ctx_.cfg.find_port(only) == nullptr) throw CommandError("fault get: no port '" + only + "'");
  }
  for (size_t i = 0; i < ctx_.cfg.ports.size(); ++i) {
    if (only.empty() || ctx_.cfg.ports[i].name == only) ports.push_back(port_faults(i));
  }
  return {{"ports", ports}};
}

json ControlComponent::fault_set(const json& args) {
  auto pit = args.find("port");
  if (pit == args.end() || !pit->is_string()) throw CommandError("fault set: port (a port name) is required");
  const std::string port = pit->get<std::string>();
  const config::PortConfig* pc = ctx_.cfg.find_port(port);
  if (pc == nullptr) throw CommandError("fault set: no port '" + port + "'");
  const size_t idx = static_cast<size_t>(pc - ctx_.cfg.ports.data());
  config::PortFaults& f = (*ctx_.faults)[idx];

  // Validate everything before changing anything.
  std::optional<config::FaultDir> dir;
  std::vector<std::pair<config::FaultKind, double>> changes;
  std::optional<uint64_t> seed;
  static const std::pair<const char*, config::FaultKind> kinds[] = {{"drop", config::FaultKind::drop},
                                                                     {"duplicate", config::FaultKind::duplicate},
                                                                     {"reorder", config::FaultKind::reorder},
                                                                     {"corrupt", config::FaultKind::corrupt}};
  for (const auto& [k, v] : args.items()) {
    if (k == "port") continue;
    if (k == "dir") {
      if (v == "rx") dir = config::FaultDir::rx;
      else if (v == "tx") dir = config::FaultDir::tx;
      else throw CommandError("fault set: dir must be \"rx\" or \"tx\", not " + v.dump());
      continue;
    }
    if (k == "seed") {
      if (!v.is_number_unsigned()) throw CommandError("fault set: seed must be a non-negative integer");
      seed = v.get<uint64_t>();
      continue;
    }
    bool known = false;
    for (const auto& [name, kind] : kinds) {
      if (k != name) continue;
      known = true;
      if (!v.is_number()) throw CommandError("fault set: " + k + " must be a number, not " + v.dump());
      double p = v.get<double>();
      if (!(p >= 0 && p <= 1)) throw CommandError("fault set: " + k + ": " + v.dump() + " is out of range 0..1");
      changes.emplace_back(kind, p);
    }
    if (!known) throw CommandError("fault set: unknown argument '" + k + "'");
  }
  if (!changes.empty() && !dir) throw CommandError("fault set: dir (\"rx\" or \"tx\") is required with probabilities");
  if (changes.empty() && !seed) throw CommandError("fault set: nothing to change");
  for (const auto& [kind, p] : changes) f.set(*dir, kind, p);
  if (seed) f.seed.store(*seed, std::memory_order_relaxed);
  f.publish();
  spdlog::info("droced: fault settings of {} changed: {}", port, args.dump());
  return port_faults(idx);
}

}  // namespace droce::daemon

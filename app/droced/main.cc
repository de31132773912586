// droced: the droce daemon.
//
//   droced --config FILE [--log-level LEVEL] [--check] [-- EAL ARGS...]
//
// Exit codes: 0 clean stop (SIGINT, SIGTERM, `droce-ctl shutdown`) or a good
// --check; 1 a start-up failure (socket in use, ...); 2 a bad command line or
// config, with a message naming the key:
//   droced: config: port[1].mtu: 70000 is out of range 256..9000
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>

#include "daemon.h"
#include "dataplane_component.h"
#include "log/log.h"
#include "shim_component.h"

using namespace droce;

int main(int argc, char** argv) {
  CLI::App app{"droced: the droce RoCEv2 dataplane daemon"};
  std::string config_path;
  std::string log_level;
  bool check = false;
  bool no_dataplane = false;
  std::vector<std::string> eal_extra;
  app.add_option("--config", config_path, "config file (TOML), see config/droced.toml")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--log-level", log_level, "override [log] level: trace debug info warn error critical off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_flag("--check", check, "validate the config, print a summary and exit");
  app.add_flag("--no-dataplane", no_dataplane, "control socket and counters only: no EAL, ports or cores");
  app.add_option("eal_args", eal_extra, "extra EAL arguments, after --");
  app.set_version_flag("--version", std::string(daemon::kVersion));
  app.footer(
      "Exit codes: 0 clean stop, 1 start-up failure, 2 bad command line or config.\n"
      "Stop with SIGINT/SIGTERM or `droce-ctl shutdown`.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  daemon::DaemonContext ctx;
  try {
    ctx.cfg = config::load_config_file(config_path);
  } catch (const config::ConfigError& e) {
    std::fprintf(stderr, "droced: %s\n", e.what());
    return 2;
  }
  ctx.config_path = config_path;
  ctx.eal_args = daemon::eal_arguments(ctx.cfg, eal_extra);
  ctx.faults = std::make_unique<config::FaultTable>(ctx.cfg.ports);

  if (check) {
    std::printf("%s: ok: %zu port(s), %zu core(s), control socket %s\n", config_path.c_str(), ctx.cfg.ports.size(),
                ctx.cfg.cores.size(), ctx.cfg.control.socket.c_str());
    return 0;
  }

  try {
    log::setup(ctx.cfg.log, log_level);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "droced: %s\n", e.what());
    return 2;
  }

  // Before any thread exists, so every thread inherits the mask and only the
  // main thread sees the signals (through its signalfd).
  daemon::block_signals();

  daemon::Daemon d(ctx);
  d.add(std::make_unique<daemon::StatsComponent>(ctx));
  // The dataplane (EAL, ports, cores, transport): after stats (it writes the
  // counter blocks), before control (its commands are registered before the
  // socket opens, and it stops after the socket closes).
  auto control = std::make_unique<daemon::ControlComponent>(ctx);
  if (!no_dataplane) {
    auto dpc = std::make_unique<daemon::DataplaneComponent>(ctx, *control);
    // The verbs shim over the dataplane's engines: after it (stopped first).
    std::unique_ptr<daemon::ShimComponent> shimc;
    if (ctx.cfg.shim.enabled) shimc = std::make_unique<daemon::ShimComponent>(ctx, *control, *dpc);
    d.add(std::move(dpc));
    if (shimc) d.add(std::move(shimc));
  }
  d.add(std::move(control));

  spdlog::info("droced {} starting: config {}, {} port(s), {} core(s)", daemon::kVersion, config_path,
               ctx.cfg.ports.size(), ctx.cfg.cores.size());
  try {
    d.start();
  } catch (const std::exception& e) {
    spdlog::critical("droced: cannot start: {}", e.what());
    return 1;
  }
  spdlog::info("droced: running (pid {}), control socket {}", getpid(), ctx.cfg.control.socket);

  int rc = 0;
  try {
    std::string why = d.run();
    spdlog::info("droced: {}; stopping", why);
  } catch (const std::exception& e) {
    spdlog::critical("droced: {}; stopping", e.what());
    rc = 1;
  }
  d.stop();
  spdlog::info("droced: stopped");
  spdlog::shutdown();
  return rc;
}

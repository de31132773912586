// droce-ctl: talks to droced (or droce-nvmf --control) over its control socket.
//
//   droce-ctl [--socket PATH] [--json] [--timeout MS] COMMAND ...
//
// Output: an aligned table, or the raw JSON result with --json. Exit codes: 0
// ok, 1 the daemon answered with an error or could not be reached, 2 usage.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "config/config.h"
#include "control/client.h"
#include "control/table.h"

using droce::control::json;

int main(int argc, char** argv) {
  CLI::App app{"droce-ctl: inspect and steer a running droced"};
  app.require_subcommand(1);
  const char* env = std::getenv("DROCE_CTL_SOCKET");
  std::string socket = env != nullptr ? env : "/run/droce/droced.sock";
  bool as_json = false;
  int timeout_ms = 5000;
  app.add_option("-s,--socket", socket, "control socket (default: $DROCE_CTL_SOCKET or /run/droce/droced.sock)");
  app.add_flag("-j,--json", as_json, "print the JSON result instead of a table");
  app.add_option("--timeout", timeout_ms, "milliseconds to wait for an answer")->check(CLI::Range(1, 600000));

  std::string cmd;
  json args = json::object();

  auto* status = app.add_subcommand("status", "daemon, ports and cores");
  status->callback([&] { cmd = "status"; });

  auto* counters = app.add_subcommand("counters", "counters per port, core, QP, ...");
  std::string group, get;
  bool nonzero = false, per_core = false;
  counters->add_option("-g,--group", group, "only this group (port, core, qp, control, ...)");
  counters->add_flag("-n,--nonzero", nonzero, "hide counters that are zero everywhere");
  counters->add_flag("-c,--per-core", per_core, "also each core's own values");
  counters->add_option("--get", get, "print one value: GROUP.INSTANCE.COUNTER (e.g. port.p0.rx_packets)");
  counters->callback([&] {
    cmd = "counters";
    if (!get.empty()) {
      size_t a = get.find('.'), b = get.rfind('.');
      if (a == std::string::npos || a == b) throw CLI::ValidationError("--get", "want GROUP.INSTANCE.COUNTER, not " + get);
      group = get.substr(0, a);
    }
    if (!group.empty()) args["group"] = group;
    if (nonzero) args["nonzero"] = true;
    if (per_core) args["per_core"] = true;
  });

  for (const char* name : {"qps", "mrs", "arp", "cm"}) {
    std::string desc = std::string("list ") + (std::string(name) == "qps"   ? "queue pairs"
                                                : std::string(name) == "mrs" ? "memory regions"
                                                : std::string(name) == "cm"
                                                    ? "RDMA CM connections and listeners (state, service, peer, QPNs) "
                                                      "and counters"
                                                    : "the ARP/neighbour cache");
    app.add_subcommand(name, desc)->callback([&cmd, name] { cmd = name; });
  }

  auto* fault = app.add_subcommand("fault", "fault injection per port");
  fault->require_subcommand(1);
  auto* fget = fault->add_subcommand("get", "show the settings");
  std::string fport;
  fget->add_option("-p,--port", fport, "only this port");
  fget->callback([&] {
    cmd = "fault get";
    if (!fport.empty()) args["port"] = fport;
  });
  auto* fset = fault->add_subcommand("set", "change the settings of one port and direction");
  std::string sport, dir;
  std::optional<double> drop, dup, reorder, corrupt;
  std::optional<uint64_t> seed;
  fset->add_option("-p,--port", sport, "port name")->required();
  fset->add_option("-d,--dir", dir, "rx or tx")->check(CLI::IsMember({"rx", "tx"}));
  fset->add_option("--drop", drop, "probability 0..1");
  fset->add_option("--duplicate", dup, "probability 0..1");
  fset->add_option("--reorder", reorder, "probability 0..1");
  fset->add_option("--corrupt", corrupt, "probability 0..1");
  fset->add_option("--seed", seed, "PRNG seed");
  fset->callback([&] {
    cmd = "fault set";
    args["port"] = sport;
    if (!dir.empty()) args["dir"] = dir;
    if (drop) args["drop"] = *drop;
    if (dup) args["duplicate"] = *dup;
    if (reorder) args["reorder"] = *reorder;
    if (corrupt) args["corrupt"] = *corrupt;
    if (seed) args["seed"] = *seed;
  });

  auto* dcqcn = app.add_subcommand("dcqcn", "congestion control per port: ECN marking, DCQCN, CNPs");
  dcqcn->require_subcommand(1);
  auto* dget = dcqcn->add_subcommand("get", "show each port's settings and CNP counters");
  std::string dport;
  dget->add_option("-p,--port", dport, "only this port");
  dget->callback([&] {
    cmd = "dcqcn get";
    if (!dport.empty()) args["port"] = dport;
  });
  auto* dset = dcqcn->add_subcommand(
      "set", "change one port's settings while droced runs (the poll cores apply them between bursts; "
             "connected QPs restart at line rate with the new parameters)");
  std::string dsport, d_on, d_ecn, d_cnp;
  dset->add_option("-p,--port", dsport, "port name")->required();
  dset->add_option("--dcqcn", d_on, "DCQCN rate control of RC/UC QPs: on or off")->check(CLI::IsMember({"on", "off"}));
  dset->add_option("--ecn", d_ecn, "ECT(0) marking of data packets: on or off")->check(CLI::IsMember({"on", "off"}));
  dset->add_option("--cnp", d_cnp, "CNPs for CE-marked packets (notification point): on or off")
      ->check(CLI::IsMember({"on", "off"}));
  const auto& keys = droce::config::dcqcn_keys();
  std::vector<std::optional<int64_t>> key_vals(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    dset->add_option(std::string("--") + keys[i].name, key_vals[i],
                     std::string(keys[i].help) + " [" + std::to_string(keys[i].lo) + ".." +
                         std::to_string(keys[i].hi) + "]");
  }
  dset->callback([&] {
    cmd = "dcqcn set";
    args["port"] = dsport;
    if (!d_on.empty()) args["dcqcn"] = d_on == "on";
    if (!d_ecn.empty()) args["ecn"] = d_ecn == "on";
    if (!d_cnp.empty()) args["cnp"] = d_cnp == "on";
    for (size_t i = 0; i < keys.size(); ++i)
      if (key_vals[i]) args[keys[i].name] = *key_vals[i];
  });

  auto* nvmf = app.add_subcommand("nvmf", "droce-nvmf's counters: target, per core loop, per queue (commands, "
                                           "bytes, latency); -s the socket of droce-nvmf --control");
  bool hist = false;
  nvmf->add_flag("--histogram", hist, "each queue's latency buckets too (best with --json)");
  nvmf->callback([&] {
    cmd = "nvmf";
    if (hist) args["histogram"] = true;
  });

  app.add_subcommand("shutdown", "stop the daemon cleanly")->callback([&] { cmd = "shutdown"; });
  app.add_subcommand("help", "list the daemon's commands")->callback([&] { cmd = "help"; });

  auto* call = app.add_subcommand("call", "send any command with JSON arguments");
  std::string call_cmd, call_args;
  call->add_option("command", call_cmd, "command name")->required();
  call->add_option("args", call_args, "arguments as a JSON object");
  call->callback([&] { cmd = call_cmd; });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!call_args.empty()) {
    try {
      args = json::parse(call_args);
    } catch (const json::parse_error& e) {
      std::fprintf(stderr, "droce-ctl: args is not JSON: %s\n", e.what());
      return 2;
    }
    if (!args.is_object()) {
      std::fprintf(stderr, "droce-ctl: args must be a JSON object\n");
      return 2;
    }
  }

  try {
    droce::control::Client client(socket, timeout_ms);
    json result = client.call(cmd, args);
    if (!get.empty()) {
      // GROUP.INSTANCE.COUNTER: the instance name may itself contain dots.
      const std::string inst = get.substr(get.find('.') + 1, get.rfind('.') - get.find('.') - 1);
      const std::string counter = get.substr(get.rfind('.') + 1);
      for (const json& g : result["groups"]) {
        for (size_t i = 0; i < g["names"].size(); ++i) {
          if (g["names"][i] != counter) continue;
          for (const json& in : g["instances"]) {
            if (in["name"] == inst) {
              std::cout << in["values"][i].dump() << "\n";
              return 0;
            }
          }
        }
      }
      std::fprintf(stderr, "droce-ctl: no counter %s\n", get.c_str());
      return 1;
    }
    if (as_json) {
      std::cout << result.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    } else {
      std::cout << droce::control::render_result(result);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "droce-ctl: %s\n", e.what());
    return 1;
  }
  return 0;
}

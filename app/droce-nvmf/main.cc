// droce-nvmf: an NVMe over Fabrics (RDMA) target on an embedded droce node.
// Thin main: options, the [nvmf] config (lib/nvmf/config.h), one poll loop
// driving lib/nvmf/rdma's RdmaTarget, signals, counters at exit and (--control)
// through a control socket at run time.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <sched.h>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "engine/embed.h"
#include "nvmf/config.h"
#include "nvmf/rdma/control.h"
#include "nvmf/rdma/target.h"

using namespace droce;

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

struct Opts {
  std::string device, mac, config, control;
  std::vector<std::string> ip;
  uint32_t mtu = 1024;
  double f_drop_rx = 0, f_drop_tx = 0;
  uint32_t tail_timeout_us = 0;
  bool no_remote_inv = false;
  bool one_thread = false;
};

void print_report(const nvmf::rdma::RdmaTarget& t) {
  const auto& c = t.counters();
  std::printf("droce-nvmf: connect requests %lu accepted %lu rejected %lu (private data %lu, resources %lu) "
              "disconnects sent %lu keep-alive expired %lu queues destroyed %lu\n",
              (unsigned long)c.connect_requests, (unsigned long)c.accepted, (unsigned long)c.rejected,
              (unsigned long)c.rejected_private, (unsigned long)c.rejected_resources, (unsigned long)c.disconnects_sent,
              (unsigned long)c.keep_alive_expired, (unsigned long)c.queues_destroyed);
  for (const auto& l : t.loop_report())
    std::printf("droce-nvmf: loop %u tid %u live_queues %zu commands %lu bytes_in %lu bytes_out %lu errors %lu file_commands %lu\n",
                l.loop, l.tid, l.live_queues, (unsigned long)l.commands, (unsigned long)l.bytes_in, (unsigned long)l.bytes_out,
                (unsigned long)l.errors, (unsigned long)l.file_commands);
  for (const auto& q : t.report())
    std::printf("droce-nvmf: queue %s loop %u qid %u cntlid %u depth %u qpn %u peer %s commands %lu bytes_in %lu bytes_out %lu "
                "errors %lu short %lu overflow %lu bad_completions %lu recv_errors %lu post_errors %lu wc_errors %lu "
                "file_commands %lu latency_n %lu p50_us %.1f p99_us %.1f max_us %.1f\n",
                q.closed ? "closed" : "live", q.loop, q.qid, q.cntlid, q.depth, q.qpn, q.peer.c_str(),
                (unsigned long)q.q.commands, (unsigned long)q.q.bytes_in, (unsigned long)q.q.bytes_out,
                (unsigned long)q.q.errors, (unsigned long)q.q.short_capsules, (unsigned long)q.q.overflow,
                (unsigned long)q.q.bad_completions, (unsigned long)q.recv_errors, (unsigned long)q.post_errors,
                (unsigned long)q.wc_errors, (unsigned long)q.q.file_commands, (unsigned long)q.q.latency.count,
                q.q.latency.percentile(0.5) / 1e3, q.q.latency.percentile(0.99) / 1e3, q.q.latency.max_ns / 1e3);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> eal;
  const int own = engine::split_eal_args(argc, argv, eal);
  Opts o;
  CLI::App app{"droce-nvmf: NVMe over Fabrics (RDMA, port 4420) target on droce"};
  app.add_option("--device", o.device, "DPDK device (e.g. net_af_packet0,iface=veth0)")->required();
  app.add_option("--ip", o.ip, "IPv4 address of this node (repeatable)")->required();
  app.add_option("--mac", o.mac, "MAC address for the port");
  app.add_option("--mtu", o.mtu, "largest path MTU (IB MTU) connections may use")
      ->check(CLI::IsMember({256, 512, 1024, 2048, 4096}));
  app.add_option("-c,--config", o.config, "TOML file with the [nvmf] section (lib/nvmf/README.md)")->required();
  app.add_option("--fault-drop", o.f_drop_rx, "drop this fraction of received frames")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-tx-drop", o.f_drop_tx, "drop this fraction of sent frames")->check(CLI::Range(0.0, 1.0));
  app.add_option("--tail-timeout-us", o.tail_timeout_us,
                 "after this long without progress resend the last packet as a probe instead of waiting for the ACK "
                 "timeout the host's CM asked for (2.1 s from Linux); 0: off (lib/transport/README.md, Tail losses)")
      ->check(CLI::Range(0u, 10'000'000u));
  app.add_option("--control", o.control,
                 "control socket: counters at run time (droce-ctl -s SOCKET nvmf; lib/nvmf/README.md)");
  app.add_flag("--no-remote-invalidate", o.no_remote_inv,
               "answer with a plain SEND even when the host's SGL asks for invalidation (the host invalidates)");
  app.add_flag("--one-thread", o.one_thread,
               "drive every core loop from the main thread (default: loops 1..cores-1 on threads of their own)");
  app.footer("EAL arguments after --. `listen` defaults to the --ip addresses. SIGTERM/SIGINT disconnect the hosts "
             "and exit 0 after printing per-queue counters.");
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(spdlog::level::warn);
  try {
    std::ifstream in(o.config);
    if (!in) throw std::runtime_error("cannot read " + o.config);
    std::stringstream ss;
    ss << in.rdbuf();
    nvmf::NvmfConfig cfg = nvmf::parse_nvmf_config(ss.str(), o.config, o.ip);
    nvmf::Target target(cfg.target);
    nvmf::build_target(cfg, target);

    engine::EmbedOptions e = engine::node_options(o.device, eal, o.ip, o.mac, o.mtu);
    e.queues = cfg.cores;  // one core loop (RX/TX queue, engine, IoRing) each
    e.engine.max_qps = 256;
    e.engine.max_mrs = 256;
    e.engine.max_mtu = static_cast<verbs::Mtu>(__builtin_ctz(o.mtu) - 7);
    e.engine.tail_timeout_ns = uint64_t{o.tail_timeout_us} * 1000;
    engine::Embedded node(e);
    auto& f = node.faults();
    f.set(config::FaultDir::rx, config::FaultKind::drop, o.f_drop_rx);
    f.set(config::FaultDir::tx, config::FaultKind::drop, o.f_drop_tx);
    f.publish();

    nvmf::rdma::RdmaOptions ro;
    ro.listen = cfg.listen;
    ro.port = cfg.target.port;
    ro.remote_invalidate = !o.no_remote_inv;
    ro.threads = !o.one_thread;  // loops 1..N-1 on threads of their own (lib/nvmf/README.md)
    nvmf::rdma::RdmaTarget tgt(node, target, ro);
    std::unique_ptr<nvmf::rdma::ControlPort> ctl;
    if (!o.control.empty()) ctl = std::make_unique<nvmf::rdma::ControlPort>(tgt, o.control);
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    std::string where;
    for (const auto& l : tgt.listening()) where += (where.empty() ? "" : " ") + l;
    size_t nss = 0;
    for (const auto& s : cfg.subsystems) nss += s.namespaces.size();
    std::printf("droce-nvmf: listening on %s (%zu subsystem(s), %zu namespace(s), device %s, %zu core loop(s) on %zu "
                "thread(s))\n",
                where.c_str(), cfg.subsystems.size(), nss, o.device.c_str(), tgt.loops(),
                tgt.threaded() ? tgt.loops() : size_t{1});
    std::fflush(stdout);
    // As the dataplane's own loops (lib/engine/README.md): after 256 polls in a
    // row without work, sched_yield(), so that on a CPU shared with other loop
    // threads (threads mode) or processes an idle loop hands the CPU over.
    uint32_t idle = 0;
    while (!g_stop.load(std::memory_order_relaxed)) {
      if (tgt.poll() != 0) {
        idle = 0;
      } else if (++idle >= 256) {
        idle = 0;
        sched_yield();
      }
      if (ctl) ctl->service();  // one atomic load unless droce-ctl asked
    }
    // Clean shutdown: DREQ to every host, then wait (bounded) for the answers.
    tgt.disconnect_all();
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (tgt.queues() && std::chrono::steady_clock::now() < give_up) {
      tgt.poll();
      if (ctl) ctl->service();
    }
    if (tgt.queues()) std::fprintf(stderr, "droce-nvmf: %zu queue(s) not disconnected in 5 s\n", tgt.queues());
    print_report(tgt);
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "droce-nvmf: %s\n", ex.what());
    return 1;
  }
}

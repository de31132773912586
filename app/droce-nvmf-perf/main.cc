// droce-nvmf-perf: an NVMe-oF RDMA benchmark (like SPDK's `nvme perf`) on an
// embedded droce node: connects to any NVMe-oF RDMA target through droce's
// RDMA CM (lib/nvmf/host), runs a workload for a time and prints IOPS, MiB/s
// and latency percentiles; --verify writes a tagged pattern and reads it back.
//
//   droce-nvmf-perf --device net_af_packet0,iface=dpdk0 --ip 10.77.0.100 -a 10.77.0.1
//       -n nqn.2026-12.org.droce:ram0 -q 32 -o 4096 -w randread -t 10
//
// Exit status: 0 when the run completed without I/O errors (and, with
// --verify, every block read back as written); 1 otherwise.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/embed.h"
#include "nvmf/host/host.h"
#include "nvmf/host/perf.h"

using namespace droce;
using namespace droce::nvmf::host;

namespace {
struct Opts {
  std::string device, mac, target, nqn, hostnqn, workload = "randread";
  std::vector<std::string> ip;
  uint16_t port = 4420;
  uint32_t qd = 1, io_size = 4096, mix = 50, io_queues = 1, seconds = 10;
  uint64_t verify_ios = 1024, span_mib = 0, max_ios = 0;
  bool verify = false, discover = false;
  uint32_t kato_ms = 5000, timeout_ms = 10000;
  uint16_t loops = 1;
};

void print_result(const char* what, const Opts& o, const PerfResult& r) {
  auto us = [](uint64_t ns) { return static_cast<double>(ns) / 1000.0; };
  std::printf("%s: %s %u B qd %u io-queues %u: %llu I/Os (%llu reads, %llu writes) in %.2f s, %llu errors\n", what,
              o.workload.c_str(), o.io_size, o.qd, o.io_queues, static_cast<unsigned long long>(r.ios),
              static_cast<unsigned long long>(r.reads), static_cast<unsigned long long>(r.writes), r.seconds,
              static_cast<unsigned long long>(r.errors));
  std::printf("  IOPS %.0f  MiB/s %.2f  latency us: min %.1f p50 %.1f p99 %.1f p99.9 %.1f max %.1f mean %.1f\n", r.iops(),
              r.mib_s(), us(r.lat.min()), us(r.lat.percentile(0.50)), us(r.lat.percentile(0.99)),
              us(r.lat.percentile(0.999)), us(r.lat.max()), r.lat.mean() / 1000.0);
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> eal;
  const int own = engine::split_eal_args(argc, argv, eal);
  Opts o;
  CLI::App app{"droce-nvmf-perf: NVMe-oF RDMA benchmark on droce (like SPDK's nvme perf)"};
  app.add_option("--device", o.device, "DPDK device of this node (e.g. net_af_packet0,iface=veth0)")->required();
  app.add_option("--ip", o.ip, "IPv4 address of this node (repeatable)")->required();
  app.add_option("--mac", o.mac, "MAC address for the port");
  app.add_option("-a,--target", o.target, "the target's IPv4 address")->required();
  app.add_option("-s,--port", o.port, "the target's RDMA CM port (trsvcid)");
  app.add_option("-n,--nqn", o.nqn, "subsystem NQN");
  app.add_option("--hostnqn", o.hostnqn, "host NQN (default: a random UUID NQN)");
  app.add_option("-q,--queue-depth", o.qd, "commands in flight (spread over the I/O queues)")->check(CLI::Range(1, 4096));
  app.add_option("-o,--io-size", o.io_size, "bytes per command")->check(CLI::Range(512u, 1u << 23));
  app.add_option("-w,--workload", o.workload, "randread randwrite read write rw randrw")
      ->check(CLI::IsMember({"randread", "randwrite", "read", "write", "rw", "randrw"}));
  app.add_option("-M,--mix", o.mix, "read percentage of rw/randrw")->check(CLI::Range(0, 100));
  app.add_option("-t,--time", o.seconds, "seconds to run")->check(CLI::Range(1, 86400));
  app.add_option("--max-ios", o.max_ios, "stop after this many I/Os (0: time only)");
  app.add_option("--span-mib", o.span_mib, "use only the first MiB of the namespace (0: all)");
  app.add_flag("--verify", o.verify, "write a per-block tagged pattern, read it back, compare (instead of the timed run)");
  app.add_option("--verify-ios", o.verify_ios, "commands written and read back by --verify")->check(CLI::Range(1, 1 << 24));
  app.add_option("--io-queues", o.io_queues, "I/O queues to connect")->check(CLI::Range(1, 64));
  app.add_flag("--discover", o.discover, "print the target's discovery log and exit");
  app.add_option("--kato", o.kato_ms, "keep-alive timeout in ms (keep alive every half of it)");
  app.add_option("--queues", o.loops, "RX/TX queues = core loops of this node (a memif peer needs as many as the "
                                     "target's `cores`)")->check(CLI::Range(1, 16));
  app.add_option("--timeout", o.timeout_ms, "ms to wait for each connection step");
  app.footer("EAL arguments after --. Exit status 0 when no command failed (and --verify found no mismatch).");
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!o.discover && o.nqn.empty()) {
    std::fprintf(stderr, "droce-nvmf-perf: -n/--nqn is required (or --discover)\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  try {
    Pattern pat{};
    parse_pattern(o.workload, pat);
    engine::EmbedOptions eo = engine::node_options(o.device, eal, o.ip, o.mac, 1024);
    eo.queues = o.loops;
    auto node = std::make_unique<engine::Embedded>(eo);
    engine::announce_node(*node, o.device, 1, "--ip");
    HostOptions ho;
    ho.target_ip = o.target;
    ho.port = o.port;
    ho.subnqn = o.nqn;
    ho.hostnqn = o.hostnqn;
    ho.io_queues = static_cast<uint16_t>(o.io_queues);
    const uint32_t per_q = (o.qd + o.io_queues - 1) / o.io_queues;
    ho.queue_size = static_cast<uint16_t>(std::min<uint32_t>(per_q + 1, nvmf::kMaxQueueSize));
    ho.kato_ms = o.kato_ms;
    ho.timeout_ms = o.timeout_ms;
    ho.data_bytes = size_t{o.qd} * o.io_size;
    int rc = 0;
    {
      Host host(*node, ho);
      if (o.discover) {
        const auto entries = host.discover();
        std::printf("discovery log of %s:%u: %zu entries\n", o.target.c_str(), o.port, entries.size());
        for (size_t i = 0; i < entries.size(); ++i) {
          const auto& e = entries[i];
          std::printf("  [%zu] subtype %u trtype %u adrfam %u traddr %s trsvcid %s portid %u subnqn %s\n", i, e.subtype,
                      e.trtype, e.adrfam, e.traddr.c_str(), e.trsvcid.c_str(), e.portid, e.subnqn.c_str());
        }
        return 0;
      }
      host.connect();
      const ControllerInfo& in = host.info();
      std::printf(
          "connected: %s cntlid %u model '%s' serial '%s' fw '%s' vs %u.%u, namespace %u: %llu blocks of %u B "
          "(%.1f MiB), MDTS %u B, in-capsule %u B, %u I/O queue(s) of %u\n",
          in.subnqn.c_str(), in.cntlid, in.mn.c_str(), in.sn.c_str(), in.fr.c_str(), in.vs >> 16, (in.vs >> 8) & 0xff,
          in.nsid, static_cast<unsigned long long>(in.blocks), in.block_size,
          static_cast<double>(in.blocks) * in.block_size / 1048576.0, in.mdts_bytes, in.inline_bytes, in.io_queues,
          in.queue_size);
      std::fflush(stdout);
      PerfConfig pc;
      pc.pattern = pat;
      pc.read_pct = o.mix;
      pc.queue_depth = o.qd;
      pc.io_size = o.io_size;
      pc.seconds = o.seconds;
      pc.max_ios = o.max_ios;
      pc.span_bytes = o.span_mib << 20;
      if (o.verify) {
        const PerfResult r = run_verify(host, pc, o.verify_ios);
        print_result("verify", o, r);
        std::printf("verify: %llu blocks checked, %llu mismatches\n", static_cast<unsigned long long>(r.verified_blocks),
                    static_cast<unsigned long long>(r.mismatches));
        if (!r.error.empty()) std::fprintf(stderr, "droce-nvmf-perf: %s\n", r.error.c_str());
        if (!r.error.empty() || r.errors || r.mismatches || r.verified_blocks == 0) rc = 1;
      } else {
        const PerfResult r = run_perf(host, pc);
        print_result("perf", o, r);
        if (!r.error.empty()) std::fprintf(stderr, "droce-nvmf-perf: %s\n", r.error.c_str());
        if (!r.error.empty() || r.errors || r.ios == 0) rc = 1;
      }
      std::fflush(stdout);
      try {
        host.shutdown();
      } catch (const HostError& e) {
        std::fprintf(stderr, "droce-nvmf-perf: %s\n", e.what());
        rc = 1;
      }
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "droce-nvmf-perf: %s\n", e.what());
    return 1;
  }
}

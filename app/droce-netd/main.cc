// droce-netd: the host network side of a droce port on its own. Opens one
// DPDK port, answers ARP, IPv6 neighbour discovery and ping (ICMP/ICMPv6) for
// the configured addresses, resolves the peers given with --resolve, and
// counts RoCEv2 and foreign frames. Used by the integration tests (ping and
// arping from a kernel on the other end of a veth) and to check a port by hand.
//
//   droce-netd --device net_af_packet0,iface=veth1 --ip 10.99.0.2 --ip6 fd00:99::2
//              [--resolve 10.99.0.1] [--duration 10] [-- EAL args]
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dpdk/eal.h"
#include "dpdk/port.h"
#include "dpdk/queue_io.h"
#include "netstack/netstack.h"

using namespace droce;

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

struct Options {
  std::string device;
  std::vector<std::string> ipv4, ipv6, resolve;
  std::string mac;
  uint16_t vlan = 0;
  uint16_t queues = 1;
  uint16_t mtu = 0;
  double duration = 0;
  bool promiscuous = false;
};

int run(const Options& o, const std::vector<std::string>& eal_args) {
  dpdk::Eal eal({.args = eal_args, .program = "droce-netd"});
  dpdk::PortConfig pc{.device = o.device, .rx_queues = o.queues, .tx_queues = o.queues, .rx_desc = 256,
                      .tx_desc = 256, .mbufs = 2047u + 1024u * o.queues, .mbuf_cache = 64};
  pc.promiscuous = o.promiscuous;
  pc.mtu = o.mtu;
  if (!o.mac.empty()) {
    auto m = dpdk::parse_mac(o.mac);
    if (!m) throw std::runtime_error("--mac: not a MAC address: " + o.mac);
    pc.mac = *m;
  }
  dpdk::Port port(pc);
  // All queues are polled by this one lcore; an answer leaves by the queue
  // its request came in on. Frames we originate use queue 0.
  std::vector<std::unique_ptr<dpdk::DpdkQueueIo>> queues;
  for (uint16_t q = 0; q < o.queues; ++q) queues.push_back(std::make_unique<dpdk::DpdkQueueIo>(port, q));
  dpdk::DpdkQueueIo& io = *queues[0];
  dpdk::TscClock clock;

  netstack::HostConfig hc;
  hc.mac = port.mac();
  hc.vlan = o.vlan;
  for (const auto& s : o.ipv4) {
    auto g = netstack::parse_ip(s);
    if (!g || !wire::gid_is_ipv4_mapped(*g)) throw std::runtime_error("--ip: not an IPv4 address: " + s);
    hc.ipv4.push_back(wire::gid_to_ipv4(*g));
  }
  for (const auto& s : o.ipv6) {
    auto g = netstack::parse_ip(s);
    if (!g || wire::gid_is_ipv4_mapped(*g)) throw std::runtime_error("--ip6: not an IPv6 address: " + s);
    hc.ipv6.push_back(*g);
  }
  std::vector<wire::Gid> peers;
  for (const auto& s : o.resolve) {
    auto g = netstack::parse_ip(s);
    if (!g) throw std::runtime_error("--resolve: not an address: " + s);
    peers.push_back(*g);
  }
  netstack::NetStack stack(hc);
  spdlog::info("port {} ({}) mac {} mtu {} socket {} link {}", port.name(), port.driver(),
               dpdk::mac_to_string(port.mac()), port.mtu(), port.socket(), port.link().up ? "up" : "down");
  for (size_t i = 0; i < stack.gids().size(); ++i)
    spdlog::info("gid[{}] {}", i, netstack::gid_to_string(stack.gids().at(i)));

  // Frames we originate (gratuitous ARP, requests) go out one at a time.
  auto send_one = [&](auto&& write) {
    io::PktBuf* b = nullptr;
    if (io.alloc_burst(&b, 1) != 1) return;
    b->len = write(std::span<uint8_t>(b->data, b->cap));
    if (b->len == 0 || io.tx_burst(&b, 1) != 1) io.free_burst(&b, 1);
  };
  for (size_t i = 0; i < hc.ipv4.size(); ++i)
    send_one([&](std::span<uint8_t> out) { return stack.gratuitous_arp(i, out); });

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::printf("ready\n");
  std::fflush(stdout);

  const uint64_t end_ns = o.duration > 0 ? clock.now_ns() + static_cast<uint64_t>(o.duration * 1e9) : UINT64_MAX;
  uint64_t next_timer = 0;
  std::vector<bool> resolved(peers.size(), false);
  io::PktBuf* rx[32];
  io::PktBuf* tx[32];
  io::PktBuf* spare = nullptr;
  while (!g_stop.load(std::memory_order_relaxed)) {
    const uint64_t now = clock.now_ns();
    if (now >= end_ns) break;
    for (auto& qp : queues) {
      dpdk::DpdkQueueIo& q = *qp;
      const uint16_t n = q.rx_burst(rx, 32);
      uint16_t ntx = 0;
      for (uint16_t i = 0; i < n; ++i) {
        if (spare == nullptr && io.alloc_burst(&spare, 1) != 1) spare = nullptr;
        std::span<uint8_t> out = spare ? std::span<uint8_t>(spare->data, spare->cap) : std::span<uint8_t>();
        const auto r = stack.handle({rx[i]->data, rx[i]->len}, out, now);
        if (r.verdict == netstack::Verdict::Reply) {
          spare->len = r.reply_len;
          tx[ntx++] = spare;
          spare = nullptr;
        }
      }
      if (n != 0) q.free_burst(rx, n);
      if (ntx != 0) {
        const uint16_t sent = q.tx_burst(tx, ntx);
        if (sent < ntx) q.free_burst(tx + sent, static_cast<uint16_t>(ntx - sent));
      }
    }
    if (now >= next_timer) {  // every 50 ms: retries, and the peers we were asked to resolve
      next_timer = now + 50'000'000;
      for (size_t i = 0; i < peers.size(); ++i) {
        if (resolved[i]) continue;
        wire::MacAddr mac{};
        send_one([&](std::span<uint8_t> out) {
          uint32_t len = 0;
          const auto r = stack.resolve(peers[i], now, mac, out, len);
          if (r == netstack::NetStack::Resolve::Ready || r == netstack::NetStack::Resolve::ReadyProbe) {
            resolved[i] = true;
            std::printf("resolved %s at %s\n", netstack::gid_to_string(peers[i]).c_str(), dpdk::mac_to_string(mac).c_str());
            std::fflush(stdout);
          } else if (r == netstack::NetStack::Resolve::Failed) {
            resolved[i] = true;
            std::printf("unresolved %s\n", netstack::gid_to_string(peers[i]).c_str());
            std::fflush(stdout);
          }
          return len;
        });
      }
      for (int k = 0; k < 8; ++k) {
        uint32_t len = 0;
        send_one([&](std::span<uint8_t> out) { return len = stack.poll_timers(now, out); });
        if (len == 0) break;
      }
    }
  }
  if (spare != nullptr) io.free_burst(&spare, 1);

  const auto& c = stack.counters();
  std::printf("stat rx_frames %lu\nstat roce %lu\nstat arp_replies_sent %lu\nstat arp_requests_sent %lu\n"
              "stat garp_sent %lu\nstat na_sent %lu\nstat ns_sent %lu\nstat echo_replies_sent %lu\n"
              "stat echo6_replies_sent %lu\nstat neigh_updates %lu\nstat dropped %lu\n",
              c.rx_frames, c.roce, c.arp_replies_sent, c.arp_requests_sent, c.garp_sent, c.na_sent, c.ns_sent,
              c.echo_replies_sent, c.echo6_replies_sent, c.neigh_updates, c.dropped());
  for (size_t i = 1; i < c.drops.size(); ++i)
    if (c.drops[i] != 0)
      std::printf("drop %s %lu\n", netstack::drop_reason_name(static_cast<netstack::Drop>(i)), c.drops[i]);
  for (const auto& qp : queues) {
    const auto& q = qp->counters();
    std::printf("queue %u rx_packets %lu tx_packets %lu tx_full %lu alloc_failures %lu\n", qp->queue_id(),
                q.rx_packets.get(), q.tx_packets.get(), q.tx_full.get(), q.alloc_failures.get());
  }
  for (const auto& e : stack.neighbours().entries())
    if (e.state != netstack::NeighState::Free)
      std::printf("neigh %s %s %s\n", netstack::gid_to_string(e.ip).c_str(), dpdk::mac_to_string(e.mac).c_str(),
                  netstack::neigh_state_name(e.state));
  const auto ps = port.stats();
  std::printf("port ipackets %lu opackets %lu imissed %lu ierrors %lu oerrors %lu\n", ps.ipackets, ps.opackets,
              ps.imissed, ps.ierrors, ps.oerrors);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after "--" goes to the EAL.
  std::vector<std::string> eal_args;
  int own = argc;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      own = i;
      for (int j = i + 1; j < argc; ++j) eal_args.emplace_back(argv[j]);
      break;
    }
  Options o;
  CLI::App app{"droce-netd: ARP, neighbour discovery and ping on a DPDK port"};
  app.add_option("--device", o.device, "DPDK device (vdev devargs or PCI address)")->required();
  app.add_option("--ip", o.ipv4, "IPv4 address of this host (repeatable)");
  app.add_option("--ip6", o.ipv6, "IPv6 address of this host (repeatable)");
  app.add_option("--mac", o.mac, "set this MAC on the port");
  app.add_option("--vlan", o.vlan, "VLAN id (0: untagged)")->check(CLI::Range(0, 4094));
  app.add_option("--queues", o.queues, "RX/TX queue pairs to open and poll")->check(CLI::Range(1, 16));
  app.add_option("--resolve", o.resolve, "resolve this peer's MAC (ARP / ND) and print it");
  app.add_option("--duration", o.duration, "seconds to run (0: until SIGINT/SIGTERM)");
  app.add_option("--mtu", o.mtu, "set the port's MTU (0: leave it)");
  app.add_flag("--promiscuous", o.promiscuous, "put the port in promiscuous mode");
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(o, eal_args);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}

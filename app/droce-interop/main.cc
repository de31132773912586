// droce-interop: a droce node (lib/engine/embed.h) that speaks the out-of-band
// TCP exchange of rdma-core's ibv_rc_pingpong / ibv_uc_pingpong /
// ibv_ud_pingpong, so it runs against the unmodified Debian binaries on a real
// RoCEv2 peer (Linux Soft-RoCE in a guest, ../shared/rxe-peer), as the client
// or as the server, with the data verified.
//
//   server:  droce-interop rc_pingpong --device net_af_packet0,iface=dpdk0 --ip 10.77.0.100
//            (guest: ibv_rc_pingpong -d rxe0 -g 1 <tcp address of this process>)
//   client:  droce-interop rc_pingpong 10.77.0.1 --device ... --ip 10.77.0.100
//            (guest: ibv_rc_pingpong -d rxe0 -g 1)
//
// The exchange (rdma-core libibverbs/examples/*_pingpong.c): the client sends
// "LLLL:QQQQQQ:PPPPPP:<32 hex digits of the GID>" plus a NUL (52 bytes), the
// server connects its QP and answers with its own 52 bytes, the client writes
// "done\0". The client then posts the first SEND; each side sends its next
// message when its previous SEND completed and a message arrived.
//
// Data: the pingpong server receives into and sends from one buffer, so its
// "pong" is the client's last "ping". As the client, droce sends a different
// pattern each iteration (with 0 at every 4 KiB page start, which is what
// --chk on the peer checks) and verifies each pong against its ping. As the
// server, droce checks that every message carries what a pingpong client
// sends (0x7b bytes, 0 or 0x7b at page starts) and echoes it back.
// Exit status: 0 when every iteration completed and verified, 1 otherwise.
#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/embed.h"
#include "engine/node_cli.h"
#include "netstack/gid_table.h"

using namespace droce;
using verbs::QpType;
using Clock = std::chrono::steady_clock;

namespace {

struct Opts {
  std::string test, host, device, mac;
  std::vector<std::string> ip;
  uint16_t tcp_port = 18515;
  uint32_t size = 4096;
  uint32_t iters = 1000;
  uint32_t mtu = 1024;
  uint32_t rx_depth = 500;
  uint32_t gid_index = 1;
  double timeout = 60;  // whole run, seconds
  double f_drop_rx = 0, f_drop_tx = 0;
  uint8_t qp_timeout = 14;
  uint32_t lazy_recv_ms = 0;  // >0: one receive at a time, reposted this long after it completed (RNR test)
  uint8_t min_rnr_timer = 12;
};

constexpr uint32_t kPage = 4096;
constexpr uint64_t kRecvWrid = 1, kSendWrid = 2;  // as the pingpong programs
constexpr uint32_t kQkey = 0x11111111;            // ud_pingpong's Q_Key

// ------------------------------------------------------------------ exchange
struct Dest {
  uint32_t lid = 0, qpn = 0, psn = 0;
  wire::Gid gid{};
};
constexpr size_t kMsgLen = sizeof "0000:000000:000000:00000000000000000000000000000000";

std::string format_dest(const Dest& d) {
  char buf[kMsgLen + 8] = {};
  char gid[33] = {};
  // gid_to_wire_gid: four big-endian 32-bit words as %08x = the GID bytes in order.
  for (int i = 0; i < 16; ++i) std::snprintf(gid + 2 * i, 3, "%02x", d.gid[static_cast<size_t>(i)]);
  std::snprintf(buf, sizeof buf, "%04x:%06x:%06x:%s", d.lid & 0xFFFF, d.qpn & 0xFFFFFF, d.psn & 0xFFFFFF, gid);
  return std::string(buf, kMsgLen);  // with the trailing NUL, as the peer reads sizeof msg
}

Dest parse_dest(const char* msg, size_t n) {
  std::string s(msg, strnlen(msg, n));
  Dest d;
  char gid[33] = {};
  if (std::sscanf(s.c_str(), "%x:%x:%x:%32s", &d.lid, &d.qpn, &d.psn, gid) != 4 || std::strlen(gid) != 32)
    throw std::runtime_error("exchange: cannot parse the peer's address \"" + s + "\"");
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(gid + 2 * i, "%2x", &v) != 1) throw std::runtime_error("exchange: bad GID in \"" + s + "\"");
    d.gid[i] = static_cast<uint8_t>(v);
  }
  return d;
}

void write_exact(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::send(fd, c + off, n - off, MSG_NOSIGNAL);
    if (k <= 0) throw std::runtime_error(std::string("tcp: send failed: ") + std::strerror(errno));
    off += static_cast<size_t>(k);
  }
}

// Reads up to n bytes (stops early at EOF when allow_short), polling the dataplane meanwhile.
template <class F>
size_t read_exact(int fd, void* out, size_t n, F&& poll_fn, Clock::time_point deadline, bool allow_short = false) {
  auto* c = static_cast<uint8_t*>(out);
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::recv(fd, c + off, n - off, MSG_DONTWAIT);
    if (k == 0) {
      if (allow_short) return off;
      throw std::runtime_error("tcp: the peer closed the connection during the exchange");
    }
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw std::runtime_error("tcp: recv failed");
    pollfd pf{fd, POLLIN, 0};
    ::poll(&pf, 1, 0);
    for (int i = 0; i < 32; ++i) poll_fn();
    if (Clock::now() > deadline) throw std::runtime_error("tcp: timed out waiting for the peer's exchange");
  }
  return off;
}

int tcp_listen_accept(uint16_t port, Clock::time_point deadline) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(s, 1) != 0)
    throw std::runtime_error("tcp: cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno));
  std::printf("waiting for the client on TCP port %u\n", port);
  std::fflush(stdout);
  for (;;) {
    pollfd pf{s, POLLIN, 0};
    if (::poll(&pf, 1, 100) > 0) break;
    if (Clock::now() > deadline) {
      close(s);
      throw std::runtime_error("tcp: no client connected before the timeout");
    }
  }
  int c = accept(s, nullptr, nullptr);
  close(s);
  if (c < 0) throw std::runtime_error("tcp: accept failed");
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return c;
}

int tcp_connect(const std::string& host, uint16_t port, Clock::time_point deadline) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) throw std::runtime_error("tcp: bad server address " + host);
  while (Clock::now() < deadline) {  // the server may still be starting
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      int one = 1;
      setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
    close(s);
    usleep(100000);
  }
  throw std::runtime_error("tcp: cannot connect to " + host + ":" + std::to_string(port));
}

// ------------------------------------------------------------------ data
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Ping i: pseudo-random bytes derived from i, 0 at every page start (what --chk checks).
void fill_ping(uint8_t* p, uint32_t size, uint64_t i) {
  for (uint32_t j = 0; j < size; j += 8) {
    const uint64_t w = mix(i * 0x100000001ull + j);
    std::memcpy(p + j, &w, std::min<uint32_t>(8, size - j));
  }
  for (uint32_t j = 0; j < size; j += kPage) p[j] = 0;
}
// What a pingpong client sends: memset 0x7b, and with --chk 0 at page starts.
bool is_pingpong_payload(const uint8_t* p, uint32_t size) {
  for (uint32_t j = 0; j < size; ++j)
    if (p[j] != 0x7b && !(j % kPage == 0 && p[j] == 0)) return false;
  return true;
}

// The 40 bytes before a UD message: an IPv6 header (source GID at 8, destination at 24),
// or for RoCEv2 over IPv4 the IPv4 header in the last 20 bytes (addresses at 32 and 36).
bool grh_matches(const uint8_t* grh, const wire::Gid& src, const wire::Gid& dst) {
  if (wire::gid_is_ipv4_mapped(src))
    return (grh[20] >> 4) == 4 && std::memcmp(grh + 32, src.data() + 12, 4) == 0 &&
           std::memcmp(grh + 36, dst.data() + 12, 4) == 0;
  return (grh[0] >> 4) == 6 && std::memcmp(grh + 8, src.data(), 16) == 0 && std::memcmp(grh + 24, dst.data(), 16) == 0;
}

// ------------------------------------------------------------------ the run
struct Run {
  engine::Embedded& node;
  const Opts& o;
  QpType type;
  bool client;
  engine::QpHandle qp;
  uint32_t key = 0;
  uint8_t* sbuf = nullptr;  // size
  uint8_t* rbuf = nullptr;  // size (+ 40 GRH for UD)
  uint32_t rlen = 0;
  verbs::Ah ah;
  uint32_t rqpn = 0;
  uint32_t routs = 0;
  uint64_t verified = 0, bad = 0;
};

uint32_t post_recvs(Run& r, uint32_t n) {
  uint32_t i = 0;
  for (; i < n; ++i) {
    verbs::RecvWr w;
    w.wr_id = kRecvWrid;
    w.num_sge = 1;
    w.sg_list[0] = {reinterpret_cast<uint64_t>(r.rbuf), r.rlen, r.key};
    if (r.node.post_recv(r.qp, w) != 0) break;
  }
  return i;
}

int post_send(Run& r) {
  verbs::SendWr w;
  w.wr_id = kSendWrid;
  w.opcode = verbs::WrOpcode::Send;
  w.send_flags = verbs::kSendSignaled;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(r.sbuf), r.o.size, r.key};
  if (r.type == QpType::UD) {
    w.ud.ah = &r.ah;
    w.ud.remote_qpn = r.rqpn;
    w.ud.remote_qkey = kQkey;
  }
  return r.node.post_send(r.qp, w);
}

verbs::Mtu mtu_enum(uint32_t m) {
  switch (m) {
    case 256: return verbs::Mtu::M256;
    case 512: return verbs::Mtu::M512;
    case 2048: return verbs::Mtu::M2048;
    case 4096: return verbs::Mtu::M4096;
    default: return verbs::Mtu::M1024;
  }
}

void print_counters(engine::Embedded& node) {
  auto& pc = node.dataplane().port_counters(0);
  std::printf("port: rx %lu tx %lu roce %lu icrc_err %lu fault_rx_drop %lu fault_tx_drop %lu\n",
              pc.sum(stats::PortCounter::rx_packets), pc.sum(stats::PortCounter::tx_packets),
              pc.sum(stats::PortCounter::rx_roce), pc.sum(stats::PortCounter::rx_drop_bad_icrc),
              pc.sum(stats::PortCounter::fault_rx_drop), pc.sum(stats::PortCounter::fault_tx_drop));
  std::printf("transport:");
  for (size_t c = 0; c < node.dataplane().core_count(); ++c) {
    auto* e = node.dataplane().core(c).engine(0);
    for (size_t i = 0; i < static_cast<size_t>(transport::Ctr::kCount); ++i)
      if (e->counter(static_cast<transport::Ctr>(i)))
        std::printf(" %s=%lu", transport::ctr_name(static_cast<transport::Ctr>(i)),
                    static_cast<unsigned long>(e->counter(static_cast<transport::Ctr>(i))));
  }
  std::printf("\n");
}

int run(engine::Embedded& node, const Opts& o) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout));
  const QpType type = o.test == "ud_pingpong" ? QpType::UD : o.test == "uc_pingpong" ? QpType::UC : QpType::RC;
  if (type == QpType::UD && o.size > o.mtu) throw std::runtime_error("ud_pingpong: -s must fit the MTU");
  Run r{node, o, type, !o.host.empty(), {}};
  const uint32_t pd = node.alloc_pd();
  engine::QpOptions qo;
  qo.type = type;
  qo.cap.max_send_wr = 16;
  qo.cap.max_recv_wr = o.rx_depth;
  qo.cqe = o.rx_depth + 16;
  qo.mtu = mtu_enum(o.mtu);
  qo.psn = static_cast<uint32_t>(mix(static_cast<uint64_t>(getpid()) ^ static_cast<uint64_t>(time(nullptr)))) & 0xFFFFFF;
  qo.qkey = kQkey;
  qo.timeout = o.qp_timeout;
  qo.min_rnr_timer = o.min_rnr_timer;
  r.qp = node.create_qp(pd, qo);
  r.rlen = o.size + (type == QpType::UD ? verbs::kGrhBytes : 0);
  const size_t bytes = size_t{o.size} + r.rlen + 128;
  auto* mem = static_cast<uint8_t*>(node.alloc_dma(bytes));
  if (!mem) throw std::runtime_error("no hugepage memory for the buffers");
  std::memset(mem, 0x7b, bytes);
  r.sbuf = mem;
  r.rbuf = mem + ((o.size + 63) & ~63u);
  if (int rc = node.reg_mr(pd, mem, bytes, verbs::kAccessLocalWrite, &r.key))
    throw std::runtime_error("reg_mr: errno " + std::to_string(rc));
  const uint32_t depth = o.lazy_recv_ms ? 1 : o.rx_depth;
  r.routs = post_recvs(r, depth);
  if (r.routs < depth) throw std::runtime_error("could not post " + std::to_string(o.rx_depth) + " receives");

  Dest mine;
  mine.qpn = r.qp.qpn;
  mine.psn = qo.psn;
  mine.gid = node.gid(o.gid_index);
  std::printf("  local address:  LID 0x0000, QPN 0x%06x, PSN 0x%06x, GID %s\n", mine.qpn, mine.psn,
              netstack::gid_to_string(mine.gid).c_str());
  auto pollf = [&] { node.poll(); };
  auto connect_to = [&](const Dest& d) {
    engine::QpPeer pp;
    pp.qpn = d.qpn;
    pp.psn = d.psn;
    pp.gid = d.gid;
    if (!node.resolve(pp.gid, pp.mac, 5000))
      throw std::runtime_error("cannot resolve the peer " + netstack::gid_to_string(pp.gid) + " by ARP/ND");
    if (int rc = node.connect(r.qp, pp)) throw std::runtime_error("connect QP: errno " + std::to_string(rc));
    r.rqpn = d.qpn;
    r.ah.dgid = d.gid;
    r.ah.dmac = pp.mac;
    // The pingpong programs ask for hop limit 1, but Linux (ib_core, RoCEv2) replaces an AH's hop
    // limit by the route's (64): rxe sends TTL 64. Do as Linux does on the wire.
    r.ah.hop_limit = 64;
  };
  Dest peer;
  const std::string my_msg = format_dest(mine);
  if (r.client) {
    int fd = tcp_connect(o.host, o.tcp_port, deadline);
    write_exact(fd, my_msg.data(), my_msg.size());
    char msg[kMsgLen] = {};
    read_exact(fd, msg, sizeof msg, pollf, deadline);
    write_exact(fd, "done", sizeof "done");
    close(fd);
    peer = parse_dest(msg, sizeof msg);
    connect_to(peer);
  } else {
    int fd = tcp_listen_accept(o.tcp_port, deadline);
    char msg[kMsgLen] = {};
    read_exact(fd, msg, sizeof msg, pollf, deadline);
    peer = parse_dest(msg, sizeof msg);
    connect_to(peer);
    write_exact(fd, my_msg.data(), my_msg.size());
    char done[kMsgLen] = {};
    const size_t got = read_exact(fd, done, sizeof done, pollf, deadline, true);  // "done\0" (older clients: 52 bytes)
    close(fd);
    if (std::getenv("DROCE_INTEROP_DEBUG")) { std::printf("debug: read %zu bytes after the exchange\n", got); print_counters(node); }
  }
  std::printf("  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", peer.lid, peer.qpn, peer.psn,
              netstack::gid_to_string(peer.gid).c_str());
  std::fflush(stdout);

  uint32_t scnt = 0, rcnt = 0;
  uint64_t pending = kRecvWrid;
  if (r.client) {
    fill_ping(r.sbuf, o.size, 0);
    if (post_send(r)) throw std::runtime_error("post_send failed");
    pending |= kSendWrid;
  }
  const auto t0 = Clock::now();
  verbs::Wc wc[16];
  bool failed = false;
  uint32_t spins = 0;
  std::optional<Clock::time_point> repost_at;
  while ((rcnt < o.iters || scnt < o.iters) && !failed) {
    node.poll();
    for (verbs::Cq* cq : {r.qp.scq, r.qp.rcq}) {
      const int n = cq->poll(wc, 16);
      for (int i = 0; i < n && !failed; ++i) {
        if (wc[i].status != verbs::WcStatus::Success) {
          std::fprintf(stderr, "Failed status %s for wr_id %lu\n", verbs::wc_status_str(wc[i].status),
                       static_cast<unsigned long>(wc[i].wr_id));
          failed = true;
          break;
        }
        if (wc[i].wr_id == kSendWrid) {
          ++scnt;
        } else {
          const uint8_t* data = r.rbuf + (type == QpType::UD ? verbs::kGrhBytes : 0);
          bool ok = wc[i].byte_len == r.rlen;
          if (ok && type == QpType::UD) ok = grh_matches(r.rbuf, peer.gid, mine.gid) && wc[i].src_qp == peer.qpn;
          if (ok) {
            if (r.client) {
              ok = std::memcmp(data, r.sbuf, o.size) == 0;  // the pong echoes our last ping
            } else {
              ok = is_pingpong_payload(data, o.size);
              std::memcpy(r.sbuf, data, o.size);  // echo, as the pingpong server does
            }
          }
          if (ok) ++r.verified;
          else if (r.bad++ < 5) std::fprintf(stderr, "iteration %u: received data/length (%u) not as expected\n", rcnt, wc[i].byte_len);
          --r.routs;
          if (o.lazy_recv_ms) repost_at = Clock::now() + std::chrono::milliseconds(o.lazy_recv_ms);
          else if (r.routs <= 1) r.routs += post_recvs(r, o.rx_depth - r.routs);
          ++rcnt;
        }
        pending &= ~wc[i].wr_id;
        if (scnt < o.iters && !pending) {
          if (r.client) fill_ping(r.sbuf, o.size, scnt);
          if (post_send(r)) {
            std::fprintf(stderr, "Couldn't post send\n");
            failed = true;
            break;
          }
          pending = kRecvWrid | kSendWrid;
        }
      }
    }
    if (repost_at && Clock::now() >= *repost_at) {  // lazy receives: the peer meets RNR NAKs meanwhile
      r.routs += post_recvs(r, 1);
      repost_at.reset();
    }
    if ((++spins & 1023) == 0 && Clock::now() > deadline) {
      std::fprintf(stderr, "timeout: %u of %u sends and %u of %u receives completed\n", scnt, o.iters, rcnt, o.iters);
      failed = true;
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  // Let the last ACK leave before the port goes away.
  for (int i = 0; i < 2000; ++i) node.poll();
  const double bytes_moved = 2.0 * o.size * rcnt;
  std::printf("%.0f bytes in %.2f seconds = %.2f Mbit/sec\n", bytes_moved, secs, bytes_moved * 8 / secs / 1e6);
  std::printf("%u iters in %.2f seconds = %.2f usec/iter\n", rcnt, secs, secs * 1e6 / std::max<uint32_t>(rcnt, 1));
  print_counters(node);
  const bool pass = !failed && rcnt == o.iters && scnt == o.iters && r.bad == 0 && r.verified == o.iters;
  std::printf("interop: test=%s role=%s size=%u mtu=%u iters=%u verified=%lu bad=%lu usec_per_iter=%.1f mbit=%.2f result=%s\n",
              o.test.c_str(), r.client ? "client" : "server", o.size, o.mtu, rcnt, static_cast<unsigned long>(r.verified),
              static_cast<unsigned long>(r.bad), secs * 1e6 / std::max<uint32_t>(rcnt, 1), bytes_moved * 8 / secs / 1e6,
              pass ? "PASS" : "FAIL");
  node.dataplane().stop();
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  CLI::App app{"droce-interop: rdma-core pingpong exchange against an unmodified peer"};
  app.add_option("test", o.test, "rc_pingpong, uc_pingpong or ud_pingpong")
      ->required()
      ->check(CLI::IsMember({"rc_pingpong", "uc_pingpong", "ud_pingpong"}));
  app.add_option("server", o.host, "server's TCP address (client side); none: be the server");
  engine::add_node_options(app, o.device, o.ip, o.mac);
  app.add_option("-p,--port", o.tcp_port, "TCP port of the exchange (default 18515)");
  app.add_option("-s,--size", o.size, "message size (default 4096)")->check(CLI::Range(1u, 1u << 24));
  app.add_option("-n,--iters", o.iters, "exchanges (default 1000)")->check(CLI::Range(1u, 1u << 30));
  app.add_option("-m,--mtu", o.mtu, "path MTU")->check(CLI::IsMember({256, 512, 1024, 2048, 4096}));
  app.add_option("-r,--rx-depth", o.rx_depth, "receives posted at a time (default 500)")->check(CLI::Range(2u, 8192u));
  app.add_option("-g,--gid-idx", o.gid_index, "local GID index (1 = first IPv4 address, as rxe)");
  app.add_option("--timeout", o.timeout, "give up after this many seconds (default 60)")->check(CLI::Range(1.0, 3600.0));
  app.add_option("--qp-timeout", o.qp_timeout, "local ACK timeout exponent")->check(CLI::Range(1, 31));
  app.add_option("--lazy-recv", o.lazy_recv_ms, "keep one receive posted, repost it MS after it completed (RNR NAKs)");
  app.add_option("--min-rnr-timer", o.min_rnr_timer, "RNR NAK timer code this side asks for (IBTA table 45)")->check(CLI::Range(0, 31));
  app.add_option("--fault-drop", o.f_drop_rx, "drop this fraction of received frames")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-tx-drop", o.f_drop_tx, "drop this fraction of sent frames")->check(CLI::Range(0.0, 1.0));
  app.footer("EAL arguments after --. Exit status 0 when every exchange completed with its data verified.");
  std::vector<std::string> eal;
  if (const auto rc = engine::parse_node_command_line(app, argc, argv, eal)) return *rc;
  spdlog::set_level(spdlog::level::warn);
  try {
    engine::EmbedOptions e = engine::node_options(o.device, eal, o.ip, o.mac, o.mtu);
    if (o.mtu > 1024) e.mbufs = 4095;
    e.engine.max_qps = 16;
    e.engine.max_mrs = 16;
    e.engine.timer_scan_ns = 20'000;
    engine::Embedded node(e);
    auto& f = node.faults();
    f.set(config::FaultDir::rx, config::FaultKind::drop, o.f_drop_rx);
    f.set(config::FaultDir::tx, config::FaultKind::drop, o.f_drop_tx);
    f.publish();
    engine::announce_node(node, o.device, o.gid_index, "-g");
    return run(node, o);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "droce-interop: %s\n", ex.what());
    return 1;
  }
}

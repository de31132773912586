// droce-perf: perftest-like benchmark between two droce nodes. Each side runs
// its own embedded droce node (lib/engine/embed.h) on a DPDK port; the two
// exchange QPN / PSN / rkey / address over TCP (port 18515, as perftest) and
// run send/write/read/atomic x bw/lat with the data verified. Bandwidth tests
// take up to 65536 QPs (-q), the work requests in flight (-t) shared out over
// them.
// raw_ethernet_lat / raw_ethernet_bw: frames echoed / streamed through the
// same port with no transport, the latency and message-rate baselines
// (test/bench/bench_dataplane.sh prints the ratios).
//
//   server:  droce-perf write_bw --device net_af_packet0,iface=vb --ip 10.20.0.2 -- --lcores=0@1
//   client:  droce-perf write_bw 127.0.0.1 --device net_af_packet0,iface=va --ip 10.20.0.1 -s 4096 -- ...
//
// The client decides the test parameters and sends them to the server.
// Exit status: 0 when every run completed and verified, 1 otherwise.
#include <charconv>
#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/embed.h"
#include "engine/node_cli.h"
#include "netstack/gid_table.h"
#include "stats/fairness.h"

using namespace droce;
using verbs::QpType;
using verbs::WrOpcode;

namespace {

enum class Verb : uint32_t { Send, Write, Read, Atomic };
struct Opts {
  std::string test, host, device, mac;
  std::vector<std::string> ip;
  uint32_t size = 65536;
  bool all = false;
  uint64_t iters = 1000;
  // Latency tests (and raw_ethernet_lat): ping-pongs run before the measured
  // ones and not counted. The first round through a port's descriptor rings
  // touches their buffers for the first time: on net_memif those are 4 KiB
  // pages of the shared region that fault in one by one (each ~5-10 us in
  // this VM, ~1,650 faults per process), so without it a run's p99 is the
  // warm-up's (10 us against 1.5 us steady). Enough to go round memif's
  // 1024-descriptor rings twice at one frame per iteration each way.
  uint32_t warmup = 2048;
  double duration = 0;
  uint32_t qps = 1;
  uint32_t mtu = 1024;
  std::string conn = "RC";
  uint32_t gid_index = 1;
  uint32_t depth = 128;
  bool depth_per_qp = false;  // -t per QP (perftest's meaning) instead of shared out over the QPs
  uint16_t tcp_port = 18515;
  bool gbits = false;
  uint16_t queues = 1;
  double f_drop = 0, f_dup = 0, f_reorder = 0, f_corrupt = 0;
  std::string atomic_op = "FETCH_AND_ADD";
  uint8_t qp_timeout = 14;
  uint32_t max_size = 0;  // sizes up to this with -a
  uint32_t window = 64;
  uint32_t cq_mod = 1;  // write_bw / send_bw: one signaled WR per this many (perftest's --cq-mod)
  uint32_t initial_window = 0;  // 0: start at --window
  uint32_t tail_timeout_us = 0;  // 0: a lost tail waits for the ACK timeout
  uint32_t zero_copy_min = transport::EngineConfig{}.zero_copy_min;
  bool dcqcn = false;
  uint32_t dcqcn_line_rate_mbps = 0;  // 0: the config default
  std::vector<std::string> dcqcn_params;  // KEY=N of [port.dcqcn_params]
  fault::Bottleneck bn;               // TX bottleneck of this node (fault injector)
  double bn_gbps = 0;
  double sample_us = 0;    // > 0: sample the bottleneck and each QP's reaction point this often (bw tests)
  std::string sample_csv;  // ... into this CSV file (client side)
};

// ---------------------------------------------------------------- data pattern
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Message t: byte j is byte j of t for j < 8, else byte j%8 of a word derived
// from (t, j/8): any prefix of a message is the shorter message.
void fill(uint8_t* p, uint32_t size, uint64_t t) {
  const uint64_t base = mix(t);
  auto word = [&](uint32_t j) { return j < 8 ? t : base ^ (uint64_t{j / 8} * 0x9E3779B97F4A7C15ull); };
  uint32_t j = 0;
  for (; j + 8 <= size; j += 8) {
    const uint64_t w = word(j);
    std::memcpy(p + j, &w, 8);
  }
  if (j < size) {
    const uint64_t w = word(j);
    std::memcpy(p + j, &w, size - j);
  }
}
bool check(const uint8_t* p, uint32_t size, uint64_t t, uint8_t* scratch) {
  fill(scratch, size, t);
  return std::memcmp(p, scratch, size) == 0;
}

// ---------------------------------------------------------------- TCP exchange
// Fixed-size messages (kMsg bytes on the wire, zero-padded): hello, start,
// ready, result, bye, and the head of done. Variable-length ones, a header
// that says how many entries follow, then the entries:
//   QP list (each way once, after the hello): QpListHdr, then n QpEntry;
//   done (client -> server after each size): Msg{kDone, qps = n}, then n
//   uint64_t, each QP's messages completed.
// Both sides run the same binary: the structs go as they are in memory.
constexpr uint32_t kMsg = 1024;
constexpr uint32_t kMaxQps = 65536;  // -q (issue 12: 64K active QPs)
enum MsgType : uint32_t { kHello = 1, kQps, kStart, kReady, kDone, kResult, kBye };
struct Msg {
  uint32_t type = 0;
  uint32_t verb = 0, qptype = 0, qps = 0, depth = 0, mtu = 0, max_size = 0, lat = 0;
  uint32_t size = 0, ok = 0;
  uint64_t iters = 0, errors = 0;
  char atomic_op[16] = {};
};
static_assert(sizeof(Msg) <= kMsg);
struct QpListHdr {
  uint32_t type = kQps;
  uint32_t n = 0;        // QpEntry that follow; 0 with error set: the sender could not set its QPs up
  uint8_t gid[16] = {};  // every QP's (one node, one GID)
  uint8_t mac[6] = {};
  char error[98] = {};
};
static_assert(sizeof(QpListHdr) == 128);
struct QpEntry {
  uint32_t qpn = 0, psn = 0, rkey = 0, pad = 0;
  uint64_t vaddr = 0;  // the QP's buffer (slots x slot size)
};
static_assert(sizeof(QpEntry) == 24);

// Writes n bytes, waiting (100 ms at a time) up to timeout_s for the peer to take them.
void send_bytes(int fd, const void* p, size_t n, double timeout_s = 120) {
  const auto* c = static_cast<const uint8_t*>(p);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  size_t off = 0;
  while (off < n) {
    const ssize_t k = ::send(fd, c + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw std::runtime_error("tcp: peer went away (send)");
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("tcp: timed out sending to the peer");
    pollfd pf{fd, POLLOUT, 0};
    if (::poll(&pf, 1, 100) < 0 && errno != EINTR) throw std::runtime_error("tcp: poll failed (send)");
  }
}
// One fixed-size message.
void send_all(int fd, const void* p, size_t n) {
  uint8_t buf[kMsg] = {};
  std::memcpy(buf, p, std::min<size_t>(n, kMsg));
  send_bytes(fd, buf, kMsg);
}
// Reads exactly n bytes, up to timeout_s; with poll_fn, keeps polling the
// dataplane while waiting.
template <class F>
void recv_bytes(int fd, void* out, size_t n, F&& poll_fn, double timeout_s) {
  auto* buf = static_cast<uint8_t*>(out);
  size_t off = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  uint32_t spins = 0;
  while (off < n) {
    ssize_t k = ::recv(fd, buf + off, n - off, MSG_DONTWAIT);
    if (k == 0) throw std::runtime_error("tcp: peer closed the connection");
    if (k > 0) {
      off += static_cast<size_t>(k);
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) throw std::runtime_error("tcp: recv failed");
    // Poll for 200 us between two looks at the socket: a recv() is a system
    // call (1-2 us in a VM), and a frame that arrives meanwhile waits for it,
    // which a server in a latency test must not add (perftest's does not).
    const uint64_t until = rte_rdtsc() + rte_get_tsc_hz() / 5000;
    do {
      poll_fn();
    } while (rte_rdtsc() < until);
    if ((++spins & 63) == 0 && std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("tcp: timed out waiting for the peer");
  }
}
// One fixed-size message.
template <class F>
void recv_msg(int fd, void* out, size_t n, F&& poll_fn, double timeout_s = 120) {
  uint8_t buf[kMsg];
  recv_bytes(fd, buf, kMsg, poll_fn, timeout_s);
  std::memcpy(out, buf, n);
}
// Tells the peer, in place of our QP list, why we have none.
void send_qp_error(int fd, const std::string& what) {
  QpListHdr h;
  std::snprintf(h.error, sizeof h.error, "%s", what.c_str());
  try {
    send_bytes(fd, &h, sizeof h, 5);
  } catch (const std::exception&) {
  }
}

int tcp_listen(uint16_t port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
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
  int c = accept(s, nullptr, nullptr);
  close(s);
  if (c < 0) throw std::runtime_error("tcp: accept failed");
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return c;
}

int tcp_connect(const std::string& host, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) throw std::runtime_error("tcp: bad server address " + host);
  int err = 0;
  for (int i = 0; i < 100; ++i) {  // the server may still be starting
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      int one = 1;
      setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
    err = errno;
    close(s);
    usleep(100000);
  }
  throw std::runtime_error("tcp: cannot connect to " + host + ":" + std::to_string(port) + " for 10 s: " +
                           std::strerror(err));
}

// Waits (bounded) until the peer closes the TCP connection: recv returns 0.
void wait_peer_closed(int fd, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  uint8_t buf[kMsg];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) < 0 && errno != EINTR) return;
    if (p.revents == 0) continue;
    const ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
  }
}

// ---------------------------------------------------------------- the node side
// Memory (issue 12 wants 64K QPs in one node): the message buffers of all
// QPs are one hugepage block with one MR, at most kBufferBudget per side
// (the machine's 512 x 2 MiB pages serve both processes and their mbuf
// pools); each QP has max(2, its depth) slots of the message size rounded up
// to 64 bytes (64 B WRITEs over 65536 QPs: 8 MiB). Its send queue is as deep
// as its share of the tx depth (at least 2 entries), its receive queue as
// deep as its slots for SEND tests and 1 otherwise, and the QPs of a loop
// share one send and one receive CQ, so a QP costs a few KB of heap
// (kMaxQueueEntries bounds the send queues of all QPs together).
constexpr size_t kBufferBudget = size_t{256} << 20;
constexpr uint64_t kMaxQueueEntries = uint64_t{1} << 20;

struct Side {
  engine::Embedded* node = nullptr;
  uint32_t pd = 0;
  uint32_t slots = 0, slot_size = 0;  // per QP
  uint8_t* mem = nullptr;             // every QP's slots, one MR
  uint32_t key = 0;
  struct Q {
    engine::QpHandle h;
    uint8_t* buf = nullptr;  // slots * slot_size
    uint32_t key = 0;
    uint32_t rkey = 0;       // peer
    uint64_t raddr = 0;      // peer
    verbs::Ah ah;            // UD
    uint32_t rqpn = 0;
  };
  std::vector<Q> q;                   // never resized once set up (UD WRs point at q[i].ah)
  std::vector<verbs::Cq*> scq, rcq;   // per loop, shared by its QPs (QP i lives on loop i % loops)
  std::vector<uint32_t> index;        // QPN -> index in q (a completion names its QP by QPN)
  std::vector<uint8_t> scratch;
  uint64_t errors = 0;
};

void poll_wcs(engine::Embedded& n, verbs::Cq* cq, std::vector<verbs::Wc>& out) {
  // Initialised once: a value-initialised array per call costs more than the poll.
  static thread_local verbs::Wc wc[32];
  int k;
  while ((k = cq->poll(wc, 32)) > 0) out.insert(out.end(), wc, wc + k);
  (void)n;
}

struct Params {
  Verb verb = Verb::Write;
  QpType type = QpType::RC;
  bool lat = false;
  uint32_t qps = 1, mtu = 1024, max_size = 65536;
  uint32_t depth = 128;   // work requests in flight per QP (its share of the tx depth)
  uint64_t total = 128;   // client: work requests in flight in all
  uint32_t cq_mod = 1;    // client side only
  std::string atomic_op = "FETCH_AND_ADD";
};

// Both sides lay their buffers out from the same parameters (the hello's).
struct Layout {
  uint32_t slot_size = 0, slots = 0;
  size_t bytes = 0;
};
Layout layout_of(const Params& p) {
  Layout l;
  const uint32_t grh = p.type == QpType::UD ? verbs::kGrhBytes : 0;
  l.slot_size = (std::max<uint32_t>(64, p.max_size + grh) + 63) & ~63u;
  // One slot per outstanding work request, at most 64 MiB per QP and the
  // budget over all QPs; at least 2 (the latency tests use slots 0 and 1).
  const uint64_t fit = kBufferBudget / (uint64_t{p.qps} * l.slot_size);
  l.slots = static_cast<uint32_t>(std::max<uint64_t>(
      2, std::min<uint64_t>({p.depth, std::max<uint32_t>(2, (64u << 20) / l.slot_size), fit})));
  l.bytes = size_t{p.qps} * l.slots * l.slot_size;
  if (l.bytes > kBufferBudget)
    throw std::runtime_error(std::to_string(p.qps) + " QPs with messages of up to " + std::to_string(p.max_size) +
                             " bytes need " + std::to_string(l.bytes >> 20) + " MiB of message buffers (2 slots of " +
                             std::to_string(l.slot_size) + " bytes per QP), more than the " +
                             std::to_string(kBufferBudget >> 20) + " MiB droce-perf takes per side: use fewer QPs or smaller messages");
  const uint64_t entries = uint64_t{p.qps} * std::max<uint32_t>(p.depth, 2);
  if (entries > kMaxQueueEntries)
    throw std::runtime_error(std::to_string(p.qps) + " QPs with " + std::to_string(p.depth) +
                             " work requests in flight each need " + std::to_string(entries) +
                             " send-queue entries in all, more than droce-perf's " + std::to_string(kMaxQueueEntries) +
                             " (~600 bytes of heap each): lower -t or leave out --tx-depth-per-qp");
  return l;
}

// WRITE / SEND bandwidth sources: slot k holds message k (of the whole slot,
// so of every size: a prefix of a message is the shorter message), written
// once before any run: the timed loop does not touch payloads, and the
// server checks each slot it was written against message k.
void fill_sources(Side& s, const Params& p) {
  if (p.verb != Verb::Write && p.verb != Verb::Send) return;
  for (auto& q : s.q)
    for (uint32_t k = 0; k < s.slots; ++k) fill(q.buf + size_t{k} * s.slot_size, s.slot_size, k);
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

void setup_side(Side& s, engine::Embedded& node, const Params& p, uint8_t timeout) {
  s.node = &node;
  s.pd = node.alloc_pd();
  const Layout l = layout_of(p);
  s.slot_size = l.slot_size;
  s.slots = l.slots;
  s.scratch.resize(s.slot_size);
  s.mem = static_cast<uint8_t*>(node.alloc_dma(l.bytes));
  if (!s.mem)
    throw std::runtime_error("no hugepage memory for the message buffers: " + std::to_string((l.bytes + (1 << 20) - 1) >> 20) +
                             " MiB (" + std::to_string(p.qps) + " QPs x " + std::to_string(s.slots) + " slots x " +
                             std::to_string(s.slot_size) + " bytes)");
  std::memset(s.mem, 0, l.bytes);
  if (int rc = node.reg_mr(s.pd, s.mem, l.bytes, verbs::kAccessAll, &s.key))
    throw std::runtime_error("reg_mr: errno " + std::to_string(rc));
  const uint32_t sq = std::max<uint32_t>(p.depth, 2);
  const uint32_t rq = p.verb == Verb::Send ? s.slots : 1;
  const uint32_t loops = static_cast<uint32_t>(node.loops());
  for (uint32_t lp = 0; lp < loops; ++lp) {
    // A CQ holds what its QPs can have outstanding: each QP's send queue, or its posted receives.
    const uint64_t nq = (p.qps + loops - 1 - lp) / loops;
    s.scq.push_back(node.create_cq(static_cast<int>(lp), static_cast<uint32_t>(std::max<uint64_t>(64, nq * sq))));
    s.rcq.push_back(node.create_cq(static_cast<int>(lp), static_cast<uint32_t>(std::max<uint64_t>(64, nq * rq))));
  }
  s.q.resize(p.qps);
  for (uint32_t i = 0; i < p.qps; ++i) {
    Side::Q& q = s.q[i];
    engine::QpOptions o;
    o.type = p.type;
    o.cap.max_send_wr = sq;
    o.cap.max_recv_wr = rq;
    o.loop = static_cast<int>(i % loops);
    o.send_cq = s.scq[i % loops];
    o.recv_cq = s.rcq[i % loops];
    o.mtu = mtu_enum(p.mtu);
    o.psn = (0x1000u * (i + 1) + 7) & 0xFFFFFF;
    o.timeout = timeout;
    o.min_rnr_timer = 1;
    if (p.verb == Verb::Read || p.verb == Verb::Atomic)  // as perftest: the device's maximum (-o)
      o.max_rd_atomic = o.max_dest_rd_atomic = static_cast<uint8_t>(std::min<uint32_t>(p.depth, verbs::kMaxRdAtomic));
    try {
      q.h = node.create_qp(s.pd, o);
    } catch (const std::exception& e) {
      throw std::runtime_error("QP " + std::to_string(i + 1) + " of " + std::to_string(p.qps) + ": " + e.what());
    }
    q.buf = s.mem + size_t{i} * s.slots * s.slot_size;
    q.key = s.key;
    if (q.h.qpn >= s.index.size()) s.index.resize(std::max<size_t>(q.h.qpn + 1, s.index.size() * 2), UINT32_MAX);
    s.index[q.h.qpn] = i;
  }
}

std::vector<QpEntry> describe(const Side& s, const engine::Embedded& node, uint32_t gid_index, QpListHdr& h) {
  h = QpListHdr{};
  h.n = static_cast<uint32_t>(s.q.size());
  const wire::Gid gid = node.gid(gid_index);
  std::memcpy(h.gid, gid.data(), 16);
  const wire::MacAddr mac = const_cast<engine::Embedded&>(node).port().mac();
  std::memcpy(h.mac, mac.data(), 6);
  std::vector<QpEntry> v(s.q.size());
  for (size_t i = 0; i < s.q.size(); ++i) {
    v[i].qpn = s.q[i].h.qpn;
    v[i].psn = s.q[i].h.opt.psn;
    v[i].rkey = s.q[i].key;
    v[i].vaddr = reinterpret_cast<uint64_t>(s.q[i].buf);
  }
  return v;
}

void send_qps(int fd, const QpListHdr& h, const std::vector<QpEntry>& v) {
  send_bytes(fd, &h, sizeof h);
  send_bytes(fd, v.data(), v.size() * sizeof(QpEntry));
}

// The peer's QP list: its header (an error the peer sent instead is thrown)
// and `want` entries.
template <class F>
std::vector<QpEntry> recv_qps(int fd, QpListHdr& h, uint32_t want, F&& poll_fn) {
  recv_bytes(fd, &h, sizeof h, poll_fn, 120);
  if (h.type != kQps) throw std::runtime_error("protocol: expected the peer's QP list");
  if (h.error[0] != 0) throw std::runtime_error("peer: " + std::string(h.error, strnlen(h.error, sizeof h.error)));
  if (h.n != want)
    throw std::runtime_error("the peer has " + std::to_string(h.n) + " QPs, we have " + std::to_string(want));
  std::vector<QpEntry> v(h.n);
  recv_bytes(fd, v.data(), v.size() * sizeof(QpEntry), poll_fn, 120);
  return v;
}

void connect_side(Side& s, engine::Embedded& node, const QpListHdr& h, const std::vector<QpEntry>& peer) {
  if (peer.size() != s.q.size()) throw std::runtime_error("peer has a different number of QPs");
  wire::Gid gid{};
  std::memcpy(gid.data(), h.gid, 16);
  // Resolve the MAC by ARP / ND like a host would (the exchanged MAC is only checked); once, all QPs share it.
  wire::MacAddr told{}, mac{};
  std::memcpy(told.data(), h.mac, 6);
  if (!node.resolve(gid, mac, 10000)) throw std::runtime_error("cannot resolve the peer " + netstack::gid_to_string(gid));
  if (mac != told) spdlog::warn("ARP says the peer is at a different MAC than it told us");
  for (size_t i = 0; i < s.q.size(); ++i) {
    engine::QpPeer pp;
    pp.qpn = peer[i].qpn;
    pp.psn = peer[i].psn;
    pp.gid = gid;
    pp.mac = mac;
    if (int rc = node.connect(s.q[i].h, pp))
      throw std::runtime_error("connect QP " + std::to_string(i + 1) + ": errno " + std::to_string(rc));
    s.q[i].rkey = peer[i].rkey;
    s.q[i].raddr = peer[i].vaddr;
    s.q[i].rqpn = pp.qpn;
    s.q[i].ah.dgid = pp.gid;
    s.q[i].ah.dmac = pp.mac;
  }
}

int post_recv_slot(Side& s, size_t qi, uint32_t slot) {
  verbs::RecvWr r;
  r.wr_id = slot;
  r.num_sge = 1;
  r.sg_list[0] = {reinterpret_cast<uint64_t>(s.q[qi].buf + size_t{slot} * s.slot_size), s.slot_size, s.q[qi].key};
  return s.node->post_recv(s.q[qi].h, r);
}

verbs::SendWr make_wr(Side& s, size_t qi, Verb v, uint32_t slot, uint32_t rslot, uint32_t size, uint64_t id,
                      const std::string& aop) {
  Side::Q& q = s.q[qi];
  verbs::SendWr w;
  w.wr_id = id;
  w.send_flags = verbs::kSendSignaled;
  w.num_sge = 1;
  w.sg_list[0] = {reinterpret_cast<uint64_t>(q.buf + size_t{slot} * s.slot_size), size, q.key};
  switch (v) {
    case Verb::Send:
      w.opcode = WrOpcode::Send;
      if (q.h.opt.type == QpType::UD) {
        w.ud.ah = &q.ah;
        w.ud.remote_qpn = q.rqpn;
        w.ud.remote_qkey = q.h.opt.qkey;
      }
      break;
    case Verb::Write:
      w.opcode = WrOpcode::RdmaWrite;
      w.rdma.remote_addr = q.raddr + uint64_t{rslot} * s.slot_size;
      w.rdma.rkey = q.rkey;
      break;
    case Verb::Read:
      w.opcode = WrOpcode::RdmaRead;
      w.rdma.remote_addr = q.raddr + uint64_t{rslot} * s.slot_size;
      w.rdma.rkey = q.rkey;
      break;
    case Verb::Atomic:
      w.opcode = aop == "CMP_AND_SWAP" ? WrOpcode::AtomicCmpSwp : WrOpcode::AtomicFetchAdd;
      w.sg_list[0].length = 8;
      w.atomic.remote_addr = q.raddr;  // the counter: first 8 bytes of the peer's buffer
      w.atomic.rkey = q.rkey;
      w.atomic.compare_add = aop == "CMP_AND_SWAP" ? 0 : 1;
      w.atomic.swap = 0;
      break;
  }
  return w;
}

struct Result {
  uint64_t msgs = 0;
  double secs = 0;
  std::vector<double> qp_secs;  // bandwidth runs: each QP's time to its last completion
  std::vector<double> lat_us;
  uint64_t errors = 0;
};

// ---------------------------------------------------------------- client runs
// --sample-us: every period the TX bottleneck's queue and each QP's reaction
// point (rate, target, alpha, CNPs, decreases, increases) and bytes sent, read
// on the polling thread between polls into rows reserved up front (no
// allocation while the run lasts), written out as CSV when it ends.
struct Sampler {
  struct Row {
    double t_us;
    uint32_t qp;
    uint32_t rate_kbps, target_kbps, alpha;
    uint64_t cnps, decreases, increases, tx_bytes, retransmits, paced;
    uint64_t queue_bytes, drops, marks, pauses;
  };
  uint64_t period_tsc = 0, next_tsc = 0;
  std::vector<Row> rows;
  std::string path;
  bool on() const noexcept { return period_tsc != 0; }
  void sample(Side& s, uint64_t now, uint64_t t0, uint64_t hz) {
    if (now < next_tsc || rows.size() + s.q.size() > rows.capacity()) return;
    next_tsc = now + period_tsc;
    engine::Dataplane& dp = s.node->dataplane();
    auto& pc = dp.port_counters(0);
    const uint64_t drops = pc.sum(stats::PortCounter::fault_tx_bn_drop);
    const uint64_t marks = pc.sum(stats::PortCounter::fault_tx_bn_mark);
    const uint64_t pauses = pc.sum(stats::PortCounter::fault_tx_bn_pause);
    for (size_t qi = 0; qi < s.q.size(); ++qi) {
      const engine::QpHandle& h = s.q[qi].h;
      engine::CoreLoop& c = dp.core(h.core);
      const transport::Qp* q = c.engine(0)->qp(h.qpn);
      if (q == nullptr) continue;
      Row r{};
      r.t_us = static_cast<double>(now - t0) * 1e6 / static_cast<double>(hz);
      r.qp = static_cast<uint32_t>(qi);
      r.rate_kbps = q->rp.limited() ? q->rp.current_kbps() : 0;
      r.target_kbps = q->rp.target_kbps();
      r.alpha = q->rp.alpha();
      r.cnps = q->rp.counters().cnps;
      r.decreases = q->rp.counters().decreases;
      r.increases = q->rp.counters().increases;
      r.tx_bytes = q->ctr.tx_bytes;
      r.retransmits = q->ctr.retransmits;
      r.paced = q->ctr.paced;
      r.queue_bytes = c.slots().empty() ? 0 : c.slots()[0].demux->tx_bottleneck_queue_bytes();
      r.drops = drops;
      r.marks = marks;
      r.pauses = pauses;
      rows.push_back(r);
    }
  }
  void write() const {
    if (!on()) return;
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("--sample-csv: cannot write " + path);
    std::fprintf(f, "t_us,qp,rate_mbps,target_mbps,alpha,cnps,decreases,increases,tx_bytes,retransmits,paced,queue_bytes,drops,marks,pfc_pauses\n");
    for (const Row& r : rows)
      std::fprintf(f, "%.1f,%u,%.3f,%.3f,%u,%lu,%lu,%lu,%lu,%lu,%lu,%lu,%lu,%lu,%lu\n", r.t_us, r.qp, r.rate_kbps / 1e3,
                   r.target_kbps / 1e3, r.alpha, static_cast<unsigned long>(r.cnps),
                   static_cast<unsigned long>(r.decreases), static_cast<unsigned long>(r.increases),
                   static_cast<unsigned long>(r.tx_bytes), static_cast<unsigned long>(r.retransmits),
                   static_cast<unsigned long>(r.paced), static_cast<unsigned long>(r.queue_bytes),
                   static_cast<unsigned long>(r.drops), static_cast<unsigned long>(r.marks),
                   static_cast<unsigned long>(r.pauses));
    std::fclose(f);
  }
};
Sampler g_sampler;

// The timed loop touches no payload: WRITE and SEND sources are filled once
// at setup (slot k holds message k, fill_sources), and with --cq-mod N only
// every Nth work request (and the last) is signaled, a completion of wr_id i
// meaning all up to i are done (as perftest's ib_write_bw). Completions are
// read in batches of 32 in place from the loops' shared send CQs; only READ
// and atomic results are checked per completion.
//
// Many QPs: at most p.total work requests in flight in all and p.depth per
// QP (its share, -t). The QPs with room to post wait in a FIFO (each at most
// once): a turn takes them in order, each posting up to its share, and a QP
// goes back in when a completion frees room in it, so all of them progress
// alike (as bench_transport's QP scaling does) and the loop's cost per turn
// is its work, not the QP count (with 64K QPs, a scan of every QP per turn
// was 200 us: ACKs waited in the port long enough for the ACK timer to fire).
Result run_bw(Side& s, const Params& p, uint32_t size, uint64_t iters, double duration, std::vector<uint64_t>& count) {
  engine::Embedded& n = *s.node;
  Result r;
  const size_t nq = s.q.size();
  const uint32_t depth = std::min(p.depth, s.slots);
  const uint64_t window = std::min<uint64_t>(p.total, uint64_t{depth} * nq);
  const bool per_wc = p.verb == Verb::Read || p.verb == Verb::Atomic;
  const uint64_t cq_mod = per_wc ? 1 : std::max<uint32_t>(1, std::min(p.cq_mod, depth));
  struct Run {
    uint64_t posted = 0, done = 0, limit = 0, last_tsc = 0;
    // posted % depth and posted % cq_mod, kept as counters (a division per
    // post was a fifth of this loop's time)
    uint32_t next_slot = 0, to_signal = 0;
  };
  std::vector<Run> run(nq);
  for (Run& x : run) {
    x.limit = duration > 0 ? UINT64_MAX : iters;
    x.to_signal = static_cast<uint32_t>(cq_mod);
  }
  // The FIFO of QPs that may post now (a ring of nq entries: each QP is in
  // it at most once, queued[qi] says whether it is) and the QPs not done posting.
  std::vector<uint32_t> ready(nq);
  std::vector<uint8_t> queued(nq, 1);
  std::iota(ready.begin(), ready.end(), 0u);
  size_t rd_head = 0, rd_len = nq, unfinished = nq;
  const auto push = [&](uint32_t qi) {
    queued[qi] = 1;
    ready[(rd_head + rd_len++) % nq] = qi;
  };
  std::vector<std::vector<bool>> seen(p.verb == Verb::Atomic ? nq : 0);  // atomic: returned values
  // One work request per QP, built once; a post sets its slot's addresses,
  // its wr_id and whether it is signaled (what perftest does too): the loop
  // measures the stack, not the tool.
  std::vector<verbs::SendWr> wr(nq);
  for (size_t qi = 0; qi < nq; ++qi) wr[qi] = make_wr(s, qi, p.verb, 0, 0, size, 0, p.atomic_op);
  const bool remote_slot = p.verb == Verb::Write || p.verb == Verb::Read;
  verbs::Wc wc[32];
  const uint64_t t0 = rte_rdtsc();
  const uint64_t hz = rte_get_tsc_hz();
  const uint64_t end_tsc = duration > 0 ? t0 + static_cast<uint64_t>(duration * hz) : UINT64_MAX;
  uint64_t last_progress = t0, inflight = 0;
  bool stop_posting = false;
  for (;;) {
    const uint64_t now = rte_rdtsc();
    if (!stop_posting && now >= end_tsc) {
      // Past the end of a timed run, each QP posts up to its next signaled
      // WR so that the last one posted completes.
      stop_posting = true;
      rd_len = 0;
      unfinished = 0;
      for (size_t qi = 0; qi < nq; ++qi) {
        run[qi].limit = (run[qi].posted + cq_mod - 1) / cq_mod * cq_mod;
        queued[qi] = 0;
        if (run[qi].posted < run[qi].limit) {
          ++unfinished;
          if (run[qi].posted - run[qi].done < depth) push(static_cast<uint32_t>(qi));
        }
      }
    }
    for (size_t tries = rd_len; tries > 0 && inflight < window; --tries) {
      const uint32_t qi = ready[rd_head];
      rd_head = rd_head + 1 == nq ? 0 : rd_head + 1;
      --rd_len;
      queued[qi] = 0;
      if (nq >= transport::Engine::kPrefetchMinQps && rd_len > 0) {
        // With thousands of QPs nothing of the next ones is in the caches: a
        // pipeline over the FIFO, each stage reading what the one before asked
        // for. Three QPs ahead this program's entries, two ahead the engine's
        // QP lines (through the handle), one ahead the send queue entry.
        auto ahead = [&](size_t k) {
          const size_t i = rd_head + k;
          return ready[i < nq ? i : i - nq];
        };
        if (rd_len > 2) {
          const uint32_t n3 = ahead(2);
          __builtin_prefetch(&run[n3]);
          __builtin_prefetch(&s.q[n3]);
          __builtin_prefetch(reinterpret_cast<const char*>(&s.q[n3]) + 64);
          __builtin_prefetch(&wr[n3]);
          __builtin_prefetch(reinterpret_cast<const char*>(&wr[n3]) + 64);
        }
        if (rd_len > 1) engine::Embedded::prefetch_post(s.q[ahead(1)].h);
        engine::Embedded::prefetch_post_wqe(s.q[ahead(0)].h);
      }
      Run& x = run[qi];
      Side::Q& q = s.q[qi];
      verbs::SendWr& w = wr[qi];
      while (x.posted < x.limit && x.posted - x.done < depth && inflight < window) {
        const uint64_t i = x.posted;
        const uint32_t slot = x.next_slot;
        const uint64_t off = uint64_t{slot} * s.slot_size;
        if (p.verb == Verb::Read) std::memset(q.buf + off, 0, std::min<uint32_t>(size, 8));
        w.sg_list[0].addr = reinterpret_cast<uint64_t>(q.buf) + off;
        if (remote_slot) w.rdma.remote_addr = q.raddr + off;
        w.wr_id = i;
        const bool signal = x.to_signal == 1 || i + 1 == iters;
        w.send_flags = signal ? uint32_t{verbs::kSendSignaled} : 0u;
        if (n.post_send(q.h, w) != 0) break;
        ++x.posted;
        ++inflight;
        x.next_slot = slot + 1 == depth ? 0 : slot + 1;
        x.to_signal = x.to_signal == 1 ? static_cast<uint32_t>(cq_mod) : x.to_signal - 1;
      }
      if (x.posted >= x.limit) {
        --unfinished;  // done posting
      } else if (x.posted - x.done < depth) {
        push(qi);  // room left (the window or a refused post ended its turn): next in line
      }
    }
    if (unfinished == 0 && inflight == 0) break;
    n.poll();
    if (g_sampler.on()) g_sampler.sample(s, now, t0, hz);
    for (verbs::Cq* cq : s.scq) {
      int k;
      while ((k = cq->poll(wc, 32)) > 0) {
        if (nq >= transport::Engine::kPrefetchMinQps)  // the completions' QP entries, all at once (their misses overlap)
          for (int j = 0; j < k; ++j)
            if (wc[j].qp_num < s.index.size() && s.index[wc[j].qp_num] < nq) __builtin_prefetch(&run[s.index[wc[j].qp_num]]);
        for (int j = 0; j < k; ++j) {
          const uint32_t qi = wc[j].qp_num < s.index.size() ? s.index[wc[j].qp_num] : UINT32_MAX;
          if (wc[j].status != verbs::WcStatus::Success || qi >= nq) {
            spdlog::error("QP {} wr {}: completion {}", wc[j].qp_num, wc[j].wr_id, verbs::wc_status_str(wc[j].status));
            ++r.errors;
            return r;
          }
          if (per_wc) {
            const uint32_t slot = static_cast<uint32_t>(wc[j].wr_id % depth);
            uint8_t* lp = s.q[qi].buf + size_t{slot} * s.slot_size;
            if (p.verb == Verb::Read && !check(lp, size, slot, s.scratch.data())) {
              if (r.errors++ < 5) spdlog::error("READ data mismatch QP {} wr {}", s.q[qi].h.qpn, wc[j].wr_id);
            }
            if (p.verb == Verb::Atomic) {
              uint64_t v;
              std::memcpy(&v, lp, 8);
              if (p.atomic_op == "FETCH_AND_ADD") {
                if (v >= seen[qi].size()) seen[qi].resize(std::max<size_t>(v + 1, seen[qi].size() * 2), false);
                if (seen[qi][v]) {
                  if (r.errors++ < 5) spdlog::error("FETCH_AND_ADD returned {} twice", v);
                }
                seen[qi][v] = true;
              } else if (v != 0) {
                if (r.errors++ < 5) spdlog::error("CMP_AND_SWAP returned {} (expected 0)", v);
              }
            }
          }
          // Completions of one send queue come in order: this one says how
          // many of its QP's WRs are done (every WR up to it, signaled or not).
          Run& x = run[qi];
          const uint64_t d = wc[j].wr_id + 1;
          inflight -= d - x.done;
          x.done = d;
          x.last_tsc = now;
          if (!queued[qi] && x.posted < x.limit) push(qi);
        }
        last_progress = now;
      }
    }
    if (now - last_progress > 20 * hz) {
      spdlog::error("no completion for 20 s: giving up ({} work requests outstanding)", inflight);
      ++r.errors;
      break;
    }
  }
  r.secs = static_cast<double>(rte_rdtsc() - t0) / static_cast<double>(hz);
  r.qp_secs.resize(nq);
  for (size_t qi = 0; qi < nq; ++qi) {
    const Run& x = run[qi];
    r.qp_secs[qi] = x.last_tsc > t0 ? static_cast<double>(x.last_tsc - t0) / static_cast<double>(hz) : 0.0;
    r.msgs += x.done;
    count[qi] = x.done;
    if (p.verb == Verb::Atomic && p.atomic_op == "FETCH_AND_ADD") {
      for (uint64_t v = 0; v < x.done; ++v)
        if (v >= seen[qi].size() || !seen[qi][v]) {
          if (r.errors++ < 5) spdlog::error("FETCH_AND_ADD value {} never returned", v);
        }
    }
  }
  return r;
}

// Latency: READ / atomic: one outstanding op. WRITE / SEND: ping-pong with the server.
Result run_lat(Side& s, const Params& p, uint32_t size, uint64_t iters, uint32_t warmup) {
  engine::Embedded& n = *s.node;
  Result r;
  const uint64_t hz = rte_get_tsc_hz();
  std::vector<verbs::Wc> wcs;
  Side::Q& q = s.q[0];
  uint8_t* tx = q.buf;
  uint8_t* rx = q.buf + s.slot_size;
  if (p.verb == Verb::Send)
    for (uint32_t k = 1; k < s.slots; ++k) post_recv_slot(s, 0, k);
  r.lat_us.reserve(iters);
  uint64_t t_start = rte_rdtsc();
  for (uint64_t i = 0; i < warmup + iters; ++i) {
    if (i == warmup) t_start = rte_rdtsc();
    const uint64_t t0 = rte_rdtsc();
    if (p.verb == Verb::Write || p.verb == Verb::Send) {
      fill(tx, size, i);
      tx[size - 1] = static_cast<uint8_t>(i % 255 + 1);
    }
    if (p.verb == Verb::Read) std::memset(tx, 0, std::min<uint32_t>(size, 8));
    verbs::SendWr w = make_wr(s, 0, p.verb, 0, p.verb == Verb::Write ? 1 : 0, size, i, p.atomic_op);
    if (n.post_send(q.h, w) != 0) {
      ++r.errors;
      break;
    }
    bool sent = false, got = p.verb == Verb::Read || p.verb == Verb::Atomic;
    const uint8_t want = static_cast<uint8_t>(i % 255 + 1);
    const uint64_t give_up = t0 + 20 * hz;
    while (!(sent && got)) {
      n.poll();
      wcs.clear();
      poll_wcs(n, q.h.scq, wcs);
      for (auto& wc : wcs) {
        if (wc.status != verbs::WcStatus::Success) {
          spdlog::error("completion {}", verbs::wc_status_str(wc.status));
          ++r.errors;
          return r;
        }
        sent = true;
      }
      if (p.verb == Verb::Write && !got && rx[size - 1] == want) got = true;
      if (p.verb == Verb::Send) {
        wcs.clear();
        poll_wcs(n, q.h.rcq, wcs);
        for (auto& wc : wcs) {
          if (wc.status != verbs::WcStatus::Success) {
            ++r.errors;
            return r;
          }
          const uint8_t* d = q.buf + wc.wr_id * s.slot_size + (p.type == QpType::UD ? verbs::kGrhBytes : 0);
          if (d[size - 1] != want && r.errors++ < 5) spdlog::error("SEND pong {} carries the wrong stamp", i);
          post_recv_slot(s, 0, static_cast<uint32_t>(wc.wr_id));
          got = true;
        }
      }
      if (rte_rdtsc() > give_up) {
        spdlog::error("iteration {}: no answer for 20 s", i);
        ++r.errors;
        return r;
      }
    }
    const uint64_t t1 = rte_rdtsc();
    if (p.verb == Verb::Read && !check(tx, size, 0, s.scratch.data()) && r.errors++ < 5)
      spdlog::error("READ data mismatch at iteration {}", i);
    if (p.verb == Verb::Write) {  // the pong is the server's copy of our message
      uint8_t* exp = s.scratch.data();
      fill(exp, size, i);
      exp[size - 1] = want;
      if (std::memcmp(rx, exp, size) != 0 && r.errors++ < 5) spdlog::error("WRITE pong {} differs", i);
    }
    double us = static_cast<double>(t1 - t0) * 1e6 / static_cast<double>(hz);
    if (p.verb == Verb::Write || p.verb == Verb::Send) us /= 2;  // perftest reports half the round trip
    if (i >= warmup) r.lat_us.push_back(us);
    ++r.msgs;
  }
  r.secs = static_cast<double>(rte_rdtsc() - t_start) / static_cast<double>(hz);
  return r;
}

// ---------------------------------------------------------------- server side
struct ServerRound {
  uint32_t size = 0;
  uint64_t received = 0;
  uint64_t errors = 0;
  uint64_t lat_next = 0;  // ping-pong: next stamp expected
  uint64_t lat_iters = 0;
};

void server_poll(Side& s, const Params& p, ServerRound& rd, std::vector<verbs::Wc>& wcs) {
  engine::Embedded& n = *s.node;
  n.poll();
  for (verbs::Cq* cq : s.scq) {  // the latency tests' pongs
    wcs.clear();
    poll_wcs(n, cq, wcs);
    for (auto& wc : wcs)
      if (wc.status != verbs::WcStatus::Success && rd.errors++ < 5)
        spdlog::error("server send completion {}", verbs::wc_status_str(wc.status));
  }
  if (p.verb == Verb::Send) {
    for (verbs::Cq* cq : s.rcq) {
      wcs.clear();
      poll_wcs(n, cq, wcs);
      for (auto& wc : wcs) {
        const size_t qi = wc.qp_num < s.index.size() ? s.index[wc.qp_num] : UINT32_MAX;
        if (qi >= s.q.size()) {
          if (rd.errors++ < 5) spdlog::error("server recv completion of an unknown QP {}", wc.qp_num);
          continue;
        }
        if (wc.status != verbs::WcStatus::Success) {
          if (wc.status != verbs::WcStatus::WrFlushErr && rd.errors++ < 5)
            spdlog::error("server recv completion {}", verbs::wc_status_str(wc.status));
          continue;
        }
        auto& q = s.q[qi];
        const uint32_t slot = static_cast<uint32_t>(wc.wr_id);
        const uint8_t* d = q.buf + size_t{slot} * s.slot_size + (p.type == QpType::UD ? verbs::kGrhBytes : 0);
        const uint32_t len = wc.byte_len - (p.type == QpType::UD ? verbs::kGrhBytes : 0);
        bool ok = len == rd.size;
        if (ok && !p.lat) {
          // Message k starts with k's bytes (fill): a message of 8 bytes or more
          // names itself; a shorter one carries k's low bytes, and k is one of
          // the sender's slots (both sides size them from the same parameters).
          uint64_t t = 0;
          std::memcpy(&t, d, rd.size < 8 ? rd.size : 8);
          ok = (rd.size >= 8 || t < s.slots) && check(d, rd.size, t, s.scratch.data());
        }
        if (!ok && rd.errors++ < 5) spdlog::error("SEND data mismatch (len {})", len);
        ++rd.received;
        if (p.lat) {  // pong
          uint8_t* tx = q.buf + size_t{s.slots - 1} * s.slot_size;
          std::memcpy(tx, d, rd.size);
          verbs::SendWr w = make_wr(s, qi, Verb::Send, s.slots - 1, 0, rd.size, rd.received, p.atomic_op);
          if (n.post_send(q.h, w) != 0) ++rd.errors;
        }
        post_recv_slot(s, qi, slot);
      }
    }
  }
  if (p.lat && p.verb == Verb::Write && rd.lat_next < rd.lat_iters) {
    auto& q = s.q[0];
    uint8_t* rx = q.buf + s.slot_size;  // the client writes into our slot 1
    const uint8_t want = static_cast<uint8_t>(rd.lat_next % 255 + 1);
    if (rx[rd.size - 1] == want) {
      // Pong: send the message back into the client's slot 1 (from our slot 0).
      std::memcpy(q.buf, rx, rd.size);
      verbs::SendWr w = make_wr(s, 0, Verb::Write, 0, 1, rd.size, rd.lat_next, p.atomic_op);
      if (n.post_send(q.h, w) != 0) ++rd.errors;
      ++rd.lat_next;
    }
  }
}

// Verifies what the client's round left in our memory.
// count: each QP's messages the client completed.
uint64_t server_verify(Side& s, const Params& p, const std::vector<uint64_t>& count, ServerRound& rd) {
  uint64_t err = rd.errors;
  const uint32_t depth = std::min(p.depth, s.slots);
  for (size_t qi = 0; qi < s.q.size(); ++qi) {
    auto& q = s.q[qi];
    const uint64_t cnt = count[qi];
    if (p.verb == Verb::Write && !p.lat) {
      for (uint32_t slot = 0; slot < depth && slot < cnt; ++slot) {
        // Every message written to this slot is message `slot` (fill_sources).
        const uint8_t* d = q.buf + size_t{slot} * s.slot_size;
        bool ok;
        if (p.type == QpType::RC || rd.size < 8) {
          ok = p.type != QpType::RC || check(d, rd.size, slot, s.scratch.data());
        } else {  // UC: slots whose messages were all lost stay zero; the others hold message `slot` whole
          uint64_t t;
          std::memcpy(&t, d, 8);
          ok = check(d, rd.size, slot, s.scratch.data()) || (t == 0 && d[8] == 0);
        }
        if (!ok && err++ < 5) spdlog::error("WRITE data mismatch in slot {} of QP {}", slot, q.h.qpn);
      }
    }
    if (p.verb == Verb::Atomic && p.atomic_op == "FETCH_AND_ADD") {
      uint64_t v;
      std::memcpy(&v, q.buf, 8);
      if (v != cnt && err++ < 5) spdlog::error("atomic counter of QP {} is {}, expected {}", q.h.qpn, v, cnt);
      std::memset(q.buf, 0, 8);
    }
  }
  if (p.verb == Verb::Send && !p.lat) {
    uint64_t sent = 0;
    for (size_t qi = 0; qi < s.q.size(); ++qi) sent += count[qi];
    if (p.type == QpType::RC ? rd.received != sent : rd.received > sent) {
      if (err++ < 5) spdlog::error("received {} SENDs, the client completed {}", rd.received, sent);
    }
  }
  if (p.lat && p.verb == Verb::Write && rd.lat_next != rd.lat_iters) ++err;
  return err;
}

// ---------------------------------------------------------------- reports
void print_bw_header(bool gbits) {
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf(" #bytes     #iterations    BW average[%s]   MsgRate[Mpps]   verified\n", gbits ? "Gb/sec" : "MB/sec");
}
void print_bw(uint32_t size, const Result& r, bool gbits, bool ok) {
  const double bytes = static_cast<double>(r.msgs) * size;
  const double bw = gbits ? bytes * 8 / r.secs / 1e9 : bytes / r.secs / 1048576.0;
  std::printf(" %-10u %-14lu %-20.3f %-15.6f %s\n", size, static_cast<unsigned long>(r.msgs), bw,
              static_cast<double>(r.msgs) / r.secs / 1e6, ok ? "ok" : "FAILED");
}
// Multi-QP bandwidth runs: each QP's throughput (its messages over the time to
// its last completion), listed up to 16 QPs, Jain's fairness index over them,
// and the spread of the QPs' completed messages (a QP left without any shows).
void print_per_qp(const Side& s, uint32_t size, const Result& r, const std::vector<uint64_t>& count) {
  if (s.q.size() < 2 || r.qp_secs.size() != s.q.size()) return;
  std::vector<double> gbps(s.q.size());
  for (size_t qi = 0; qi < s.q.size(); ++qi) {
    const double secs = r.qp_secs[qi];
    gbps[qi] = secs > 0 ? static_cast<double>(count[qi]) * size * 8 / secs / 1e9 : 0.0;
  }
  if (s.q.size() <= 16) {
    std::printf(" per-QP BW[Gb/sec]:");
    for (size_t qi = 0; qi < s.q.size(); ++qi) std::printf(" qp%zu(0x%x) %.3f", qi, s.q[qi].h.qpn, gbps[qi]);
    std::printf("\n");
  }
  std::vector<uint64_t> c(count);
  std::sort(c.begin(), c.end());
  const size_t idle = static_cast<size_t>(std::upper_bound(c.begin(), c.end(), uint64_t{0}) - c.begin());
  std::printf(" per-QP messages: min %lu median %lu max %lu over %zu QPs, %zu without a completion\n",
              static_cast<unsigned long>(c.front()), static_cast<unsigned long>(c[c.size() / 2]),
              static_cast<unsigned long>(c.back()), c.size(), idle);
  std::printf(" Jain's fairness index: %.4f over %zu QPs\n", stats::jain_index(gbps), gbps.size());
}

void print_lat_header() {
  std::printf("---------------------------------------------------------------------------------------\n");
  std::printf(" #bytes #iterations  t_min[usec]  t_max[usec]  t_typical[usec]  t_avg[usec]  99%%[usec]  99.9%%[usec]  verified\n");
}
void print_lat(uint32_t size, Result& r, bool ok) {
  auto& v = r.lat_us;
  if (v.empty()) {
    std::printf(" %-6u %-12lu no samples %s\n", size, 0ul, ok ? "ok" : "FAILED");
    return;
  }
  std::sort(v.begin(), v.end());
  auto pct = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  const double avg = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  std::printf(" %-6u %-12zu %-12.2f %-12.2f %-16.2f %-12.2f %-10.2f %-12.2f %s\n", size, v.size(), v.front(), v.back(),
              pct(0.5), avg, pct(0.99), pct(0.999), ok ? "ok" : "FAILED");
}

// ---------------------------------------------------------------- raw_ethernet_lat
// The baseline of the latency ratio, measured by the same tool through the
// same port (like perftest's raw_ethernet_lat): Ethernet frames of -s bytes
// (ethertype 0x88B5, IEEE local experimental) with no transport at all; the
// client sends one, the server sends it straight back, and the half round trip
// is reported like write_lat's. The node's dataplane is not polled meanwhile.
constexpr uint16_t kRawEtherType = 0x88B5;
struct RawHello {
  uint8_t mac[6];
  uint16_t size;
  uint32_t warmup;
  uint64_t iters;
};

bool raw_is_ours(const rte_mbuf* m, uint64_t* seq) {
  if (m->data_len < 22) return false;
  const auto* d = rte_pktmbuf_mtod(m, const uint8_t*);
  if (((d[12] << 8) | d[13]) != kRawEtherType) return false;
  std::memcpy(seq, d + 14, 8);
  return true;
}

// Both raw tests: the TCP exchange of MACs and the client's settings, then
// the port's link up. cfg is the client's settings on both sides.
struct RawSetup {
  dpdk::Port& port;
  uint16_t pid;
  wire::MacAddr me;
  bool client;
  int fd;
  RawHello mine{}, peer{};
  const RawHello& cfg() const noexcept { return client ? mine : peer; }
};

RawSetup raw_setup(const Opts& o, engine::Embedded& node) {
  RawSetup r{node.port(), node.port().id(), node.port().mac(), !o.host.empty(), -1};
  r.fd = r.client ? tcp_connect(o.host, o.tcp_port) : tcp_listen(o.tcp_port);
  std::memcpy(r.mine.mac, r.me.data(), 6);
  r.mine.size = static_cast<uint16_t>(std::clamp<uint32_t>(o.size, 60, 1514));
  r.mine.warmup = o.warmup;
  r.mine.iters = o.iters;
  send_all(r.fd, &r.mine, sizeof r.mine);
  recv_msg(r.fd, &r.peer, sizeof r.peer, [] {}, 30);
  if (!r.port.wait_link_up(10000)) throw std::runtime_error(o.test + ": the port's link is down");
  return r;
}

// A raw frame's header: the peer's MAC, ours, the ethertype, the sequence number.
void raw_header(uint8_t* d, const RawSetup& rs, uint64_t seq) {
  std::memcpy(d, rs.peer.mac, 6);
  std::memcpy(d + 6, rs.me.data(), 6);
  d[12] = kRawEtherType >> 8;
  d[13] = kRawEtherType & 0xFF;
  std::memcpy(d + 14, &seq, 8);
}

int run_raw_lat(const Opts& o, engine::Embedded& node) {
  const RawSetup rs = raw_setup(o, node);
  const RawHello& cfg = rs.cfg();
  const uint64_t total = cfg.warmup + cfg.iters;
  const uint64_t hz = rte_get_tsc_hz();
  rte_mbuf* rx[32];
  Result r;
  uint64_t errors = 0;
  if (rs.client) {
    print_lat_header();
    r.lat_us.reserve(cfg.iters);
    for (uint64_t i = 0; i < total && errors == 0; ++i) {
      rte_mbuf* m = rte_pktmbuf_alloc(rs.port.pool());
      if (!m) throw std::runtime_error("raw_ethernet_lat: no mbuf");
      auto* d = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, cfg.size));
      std::memset(d, 0, cfg.size);
      raw_header(d, rs, i);
      const uint64_t t0 = rte_rdtsc();
      uint64_t spins = 0;
      while (rte_eth_tx_burst(rs.pid, 0, &m, 1) == 0)
        if (++spins > 10'000'000) throw std::runtime_error("raw_ethernet_lat: TX queue stays full");
      bool back = false;
      while (!back) {
        const uint16_t n = rte_eth_rx_burst(rs.pid, 0, rx, 32);
        for (uint16_t k = 0; k < n; ++k) {
          uint64_t seq;
          if (raw_is_ours(rx[k], &seq) && seq == i) back = true;
          rte_pktmbuf_free(rx[k]);
        }
        if (!back && rte_rdtsc() - t0 > hz) {
          spdlog::error("raw_ethernet_lat: frame {} did not come back within 1 s", i);
          ++errors;
          break;
        }
      }
      if (back && i >= cfg.warmup) r.lat_us.push_back(static_cast<double>(rte_rdtsc() - t0) * 1e6 / static_cast<double>(hz) / 2);
    }
    print_lat(cfg.size, r, errors == 0);
  } else {
    std::printf(" raw_ethernet_lat server: echoing %lu frames of %u bytes\n", static_cast<unsigned long>(total), cfg.size);
    uint64_t echoed = 0, last = rte_rdtsc();
    while (echoed < total) {
      const uint16_t n = rte_eth_rx_burst(rs.pid, 0, rx, 32);
      for (uint16_t k = 0; k < n; ++k) {
        uint64_t seq;
        if (!raw_is_ours(rx[k], &seq)) {
          rte_pktmbuf_free(rx[k]);
          continue;
        }
        auto* d = rte_pktmbuf_mtod(rx[k], uint8_t*);
        std::memcpy(d, rs.peer.mac, 6);
        std::memcpy(d + 6, rs.me.data(), 6);
        uint64_t spins = 0;
        while (rte_eth_tx_burst(rs.pid, 0, &rx[k], 1) == 0)
          if (++spins > 10'000'000) throw std::runtime_error("raw_ethernet_lat: TX queue stays full");
        ++echoed;
        last = rte_rdtsc();
      }
      if (rte_rdtsc() - last > 5 * hz) {
        spdlog::error("raw_ethernet_lat: no frame for 5 s after {} of {}", echoed, total);
        ++errors;
        break;
      }
    }
  }
  close(rs.fd);
  std::printf("result: %s\n", errors == 0 ? "PASS" : "FAIL");
  return errors == 0 ? 0 : 1;
}

// ---------------------------------------------------------------- raw_ethernet_bw
// The baseline of the message-rate ratio, measured by the same tool through
// the same port (like perftest's raw_ethernet_bw): the client sends Ethernet
// frames of -s bytes (the raw_ethernet_lat frame: ethertype 0x88B5, a
// sequence number) in bursts of 32 for -D seconds (or -n frames), keeping the
// ones a full TX ring refused for the next burst; the server counts them. The
// rate is the server's: frames received after the first --warmup over the
// time from then to the last one (what testpmd's rxonly side reports, and
// what droce's write_bw counts: messages delivered). No transport, no ICRC.
struct RawBwDone {
  uint64_t sent;
};
struct RawBwReport {
  uint64_t received;  // all frames of ours
  uint64_t counted;   // after the warm-up
  double secs;        // from the end of the warm-up to the last frame
};

int run_raw_bw(const Opts& o, engine::Embedded& node) {
  const RawSetup rs = raw_setup(o, node);
  const RawHello& cfg = rs.cfg();
  auto idle = [] {};
  const uint64_t hz = rte_get_tsc_hz();
  constexpr uint16_t kBurst = 32;
  bool ok = true;
  if (rs.client) {
    const uint64_t start = rte_rdtsc();
    const uint64_t end = o.duration > 0 ? start + static_cast<uint64_t>(o.duration * static_cast<double>(hz)) : 0;
    rte_mbuf* m[kBurst];
    uint16_t held = 0;  // frames a full ring refused, sent first next time
    uint64_t seq = 0, sent = 0;
    while (end ? rte_rdtsc() < end : sent < cfg.iters) {
      if (held < kBurst) {
        const uint16_t want = kBurst - held;
        if (rte_pktmbuf_alloc_bulk(rs.port.pool(), m + held, want) != 0) throw std::runtime_error("raw_ethernet_bw: no mbufs");
        for (uint16_t k = held; k < kBurst; ++k) {
          raw_header(reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m[k], cfg.size)), rs, seq++);
        }
        held = kBurst;
      }
      const uint16_t n = rte_eth_tx_burst(rs.pid, 0, m, held);
      sent += n;
      if (n < held) std::memmove(m, m + n, (held - n) * sizeof m[0]);
      held = static_cast<uint16_t>(held - n);
    }
    if (held) rte_pktmbuf_free_bulk(m, held);
    const double tx_secs = static_cast<double>(rte_rdtsc() - start) / static_cast<double>(hz);
    RawBwDone done{sent};
    send_all(rs.fd, &done, sizeof done);
    RawBwReport rep{};
    recv_msg(rs.fd, &rep, sizeof rep, idle, 30);
    ok = rep.counted > 0 && rep.received <= sent;
    print_bw_header(o.gbits);
    Result r;
    r.msgs = rep.counted;
    r.secs = rep.secs;
    print_bw(cfg.size, r, o.gbits, ok);
    std::printf(" raw_ethernet_bw: sent %lu frames in %.3f s (%.3f Mpps offered), the server received %lu (%lu lost)\n",
                static_cast<unsigned long>(sent), tx_secs, static_cast<double>(sent) / tx_secs / 1e6,
                static_cast<unsigned long>(rep.received), static_cast<unsigned long>(sent - std::min(sent, rep.received)));
  } else {
    std::printf(" raw_ethernet_bw server: counting frames of %u bytes\n", cfg.size);
    rte_mbuf* rx[kBurst];
    uint64_t received = 0, counted = 0, t_warm = 0, t_last = 0;
    auto count = [&] {
      const uint16_t n = rte_eth_rx_burst(rs.pid, 0, rx, kBurst);
      if (n == 0) return;
      uint16_t ours = 0;
      uint64_t seq;
      for (uint16_t k = 0; k < n; ++k) ours += raw_is_ours(rx[k], &seq);
      rte_pktmbuf_free_bulk(rx, n);
      if (ours == 0) return;
      received += ours;
      const uint64_t now = rte_rdtsc();
      if (t_warm != 0) {
        counted += ours;
        t_last = now;
      } else if (received >= cfg.warmup) {
        t_warm = now;  // the frames of this burst end the warm-up
      }
    };
    const double limit = (o.duration > 0 ? o.duration : 0) + static_cast<double>(cfg.iters) / 1e5 + 60;
    RawBwDone done{};
    recv_msg(rs.fd, &done, sizeof done, count, limit);
    // Frames still in the ring when the rs.client's message came.
    const uint64_t until = rte_rdtsc() + hz / 100;
    while (rte_rdtsc() < until) count();
    RawBwReport rep{received, counted, t_last > t_warm ? static_cast<double>(t_last - t_warm) / static_cast<double>(hz) : 0};
    send_all(rs.fd, &rep, sizeof rep);
    ok = counted > 0 && received <= done.sent;
    std::printf(" raw_ethernet_bw server: received %lu of %lu frames, %.6f Mpps after the first %u\n",
                static_cast<unsigned long>(received), static_cast<unsigned long>(done.sent),
                rep.secs > 0 ? static_cast<double>(counted) / rep.secs / 1e6 : 0.0, cfg.warmup);
  }
  close(rs.fd);
  std::printf("result: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

Params params_from(const Opts& o) {
  Params p;
  std::string t = o.test;
  const auto us = t.find('_');
  if (us == std::string::npos) throw std::runtime_error("test must be VERB_bw or VERB_lat: " + t);
  const std::string verb = t.substr(0, us), kind = t.substr(us + 1);
  static const std::map<std::string, Verb> verbs{{"send", Verb::Send}, {"write", Verb::Write}, {"read", Verb::Read},
                                                 {"atomic", Verb::Atomic}};
  if (!verbs.count(verb) || (kind != "bw" && kind != "lat")) throw std::runtime_error("unknown test " + t);
  p.verb = verbs.at(verb);
  p.lat = kind == "lat";
  p.type = o.conn == "UC" ? QpType::UC : o.conn == "UD" ? QpType::UD : QpType::RC;
  if (p.type == QpType::UD && p.verb != Verb::Send) throw std::runtime_error("-c UD works with send tests only");
  if (p.type == QpType::UC && (p.verb == Verb::Read || p.verb == Verb::Atomic))
    throw std::runtime_error("-c UC does not support READ or atomics");
  p.qps = p.lat ? 1 : o.qps;
  // -t T over N QPs: each QP keeps at most its share, ceil(T / N) (at least
  // 1), and T in all; --tx-depth-per-qp: T each (perftest's -t), N x T in all.
  if (p.lat) {
    p.depth = 2;
  } else if (o.depth_per_qp) {
    p.depth = o.depth;
  } else {
    p.depth = std::max<uint32_t>(1, (o.depth + p.qps - 1) / p.qps);
  }
  // READs and atomics beyond the responder's resources (max_dest_rd_atomic, at most 128)
  // only wait in the send queue; keeping more outstanding just makes a slow
  // link's ACK timer fire on requests the responder has not started.
  if (p.verb == Verb::Read && p.depth > verbs::kMaxRdAtomic) p.depth = verbs::kMaxRdAtomic;
  p.total = o.depth_per_qp || p.lat ? uint64_t{p.depth} * p.qps : std::min<uint64_t>(o.depth, uint64_t{p.depth} * p.qps);
  p.mtu = o.mtu;
  p.atomic_op = o.atomic_op;
  p.cq_mod = o.cq_mod;
  uint32_t size = p.verb == Verb::Atomic ? 8 : o.size;
  p.max_size = o.all ? (o.max_size ? o.max_size : (p.type == QpType::UD ? o.mtu : (1u << 20))) : size;
  if (p.type == QpType::UD && p.max_size > o.mtu) throw std::runtime_error("-c UD: message size must fit the MTU");
  (void)layout_of(p);  // buffers and queues that cannot fit: say so before starting DPDK
  return p;
}

std::vector<uint32_t> sizes_of(const Opts& o, const Params& p) {
  if (p.verb == Verb::Atomic) return {8};
  if (!o.all) return {o.size};
  std::vector<uint32_t> v;
  for (uint32_t s = 2; s <= p.max_size; s *= 2) v.push_back(s);
  return v;
}

engine::EmbedOptions embed_options(const Opts& o, const std::vector<std::string>& eal) {
  engine::EmbedOptions e = engine::node_options(o.device, eal, o.ip, o.mac, o.mtu);
  e.queues = o.queues;
  // QPNs are dealt per loop (QPN % loops), QP i on loop i % loops. A server
  // takes as many QPs as the client asks for, up to kMaxQps: its QPN table
  // (16 bytes a QPN) is sized for that many.
  const uint32_t qps = o.host.empty() ? kMaxQps : std::max<uint32_t>(o.qps, 254);
  e.engine.max_qps = o.queues * ((qps + o.queues - 1) / o.queues + 2) + 2;
  e.engine.max_mrs = 256;
  e.engine.timer_scan_ns = 20'000;
  e.engine.max_inflight_pkts = o.window;
  e.engine.initial_inflight_pkts = o.initial_window;
  e.engine.tail_timeout_ns = uint64_t{o.tail_timeout_us} * 1000;
  e.engine.zero_copy_min = o.zero_copy_min;
  // --dcqcn-param without --dcqcn sets the notification point's keys (the CNP
  // interval, DSCP, priority) of a receiver whose reaction point stays off.
  if (o.dcqcn || !o.dcqcn_params.empty()) {
    config::DcqcnConfig d;
    d.enabled = o.dcqcn;
    if (o.dcqcn_line_rate_mbps) d.line_rate_mbps = o.dcqcn_line_rate_mbps;
    for (const std::string& kv : o.dcqcn_params) {
      const size_t eq = kv.find('=');
      int64_t v = -1;
      const char* end = kv.data() + kv.size();
      if (eq == std::string::npos || std::from_chars(kv.data() + eq + 1, end, v).ptr != end)
        throw std::runtime_error("--dcqcn-param: expected KEY=N, got '" + kv + "'");
      const std::string err = config::set_dcqcn_key(d, std::string_view(kv).substr(0, eq), v);
      if (!err.empty()) throw std::runtime_error("--dcqcn-param: " + err);
    }
    const std::string err = config::check_dcqcn(d);
    if (!err.empty()) throw std::runtime_error("--dcqcn-line-rate/--dcqcn-param: " + err);
    e.dcqcn = d;
  }
  return e;
}

void apply_faults(engine::Embedded& node, const Opts& o) {
  auto& f = node.faults();
  f.set(config::FaultDir::rx, config::FaultKind::drop, o.f_drop);
  f.set(config::FaultDir::rx, config::FaultKind::duplicate, o.f_dup);
  f.set(config::FaultDir::rx, config::FaultKind::reorder, o.f_reorder);
  f.set(config::FaultDir::rx, config::FaultKind::corrupt, o.f_corrupt);
  fault::Bottleneck bn = o.bn;
  bn.rate_bps = static_cast<uint64_t>(o.bn_gbps * 1e9);
  if (bn.pfc() && bn.pfc_xon_bytes == 0) bn.pfc_xon_bytes = bn.pfc_xoff_bytes / 2;
  if (const auto e = fault::bottleneck_check(bn); bn.active() && e.key != nullptr)
    throw std::runtime_error(std::string("--bn-*: ") + e.key + " " + std::to_string(e.value) + " " + e.what + " (" +
                             std::to_string(e.bound) + ")");
  f.set_bottleneck(config::FaultDir::tx, bn);
  f.publish();
}

void print_counters(engine::Embedded& node) {
  auto& pc = node.dataplane().port_counters(0);
  std::printf(" port: rx %lu tx %lu roce %lu | faults rx drop %lu dup %lu reorder %lu corrupt %lu | icrc errors %lu\n",
              pc.sum(stats::PortCounter::rx_packets), pc.sum(stats::PortCounter::tx_packets),
              pc.sum(stats::PortCounter::rx_roce), pc.sum(stats::PortCounter::fault_rx_drop),
              pc.sum(stats::PortCounter::fault_rx_duplicate), pc.sum(stats::PortCounter::fault_rx_reorder),
              pc.sum(stats::PortCounter::fault_rx_corrupt), pc.sum(stats::PortCounter::rx_drop_bad_icrc));
  if (node.faults().bottleneck(config::FaultDir::tx).active())
    std::printf(" tx bottleneck: drops %lu ECN marks %lu max queue %lu bytes PFC pauses %lu\n",
                static_cast<unsigned long>(pc.sum(stats::PortCounter::fault_tx_bn_drop)),
                static_cast<unsigned long>(pc.sum(stats::PortCounter::fault_tx_bn_mark)),
                static_cast<unsigned long>(pc.sum(stats::PortCounter::fault_tx_bn_max_queue)),
                static_cast<unsigned long>(pc.sum(stats::PortCounter::fault_tx_bn_pause)));
  try {  // what the device itself lost: a ring it overflowed, an mbuf it lacked
    const dpdk::PortStats st = node.port().stats();
    std::printf(" device: missed %lu rx errors %lu no mbuf %lu tx errors %lu | tx full %lu\n",
                static_cast<unsigned long>(st.imissed), static_cast<unsigned long>(st.ierrors),
                static_cast<unsigned long>(st.rx_nombuf), static_cast<unsigned long>(st.oerrors),
                static_cast<unsigned long>(pc.sum(stats::PortCounter::tx_drop_full)));
  } catch (const std::exception&) {
  }
  uint64_t retx = 0, to = 0, naks = 0, fwd = 0, zc = 0, copied = 0;
  for (size_t c = 0; c < node.dataplane().core_count(); ++c) {
    auto* e = node.dataplane().core(c).engine(0);
    retx += e->counter(transport::Ctr::ReqRetransmits);
    to += e->counter(transport::Ctr::AckTimeouts);
    naks += e->counter(transport::Ctr::SeqNakSent) + e->counter(transport::Ctr::SeqNakReceived);
    zc += e->counter(transport::Ctr::TxZeroCopy);
    copied += e->counter(transport::Ctr::TxCopied);
  }
  fwd = node.dataplane().core_counters().sum(stats::CoreCounter::ring_enqueued);
  std::printf(" transport: retransmits %lu ack timeouts %lu seq NAKs %lu | cross-core forwarded %lu | payload tx zero-copy %lu copied %lu\n",
              retx, to, naks, fwd, zc, copied);
  {
    // Where the loop's turns went: polls that found work, RX bursts from the
    // device, frames and ACKs each way (ACKs per message is the responder's
    // coalescing: one ACK per QP per burst that asked for one).
    uint64_t acks_tx = 0, acks_rx = 0, rx = 0, tx = 0;
    for (size_t c = 0; c < node.dataplane().core_count(); ++c) {
      auto* e = node.dataplane().core(c).engine(0);
      acks_tx += e->counter(transport::Ctr::AcksSent);
      acks_rx += e->counter(transport::Ctr::AcksReceived);
      rx += e->counter(transport::Ctr::RxFrames);
      tx += e->counter(transport::Ctr::TxFrames);
    }
    const auto& cc = node.dataplane().core_counters();
    std::printf(" loop: polls %lu busy %lu rx bursts %lu | frames rx %lu tx %lu | ACKs sent %lu received %lu\n",
                static_cast<unsigned long>(cc.sum(stats::CoreCounter::polls)),
                static_cast<unsigned long>(cc.sum(stats::CoreCounter::busy_polls)),
                static_cast<unsigned long>(cc.sum(stats::CoreCounter::rx_bursts)), static_cast<unsigned long>(rx),
                static_cast<unsigned long>(tx), static_cast<unsigned long>(acks_tx), static_cast<unsigned long>(acks_rx));
  }
  {
    uint64_t ce = 0, cnp_tx = 0, cnp_rx = 0, dec = 0, paced = 0;
    for (size_t c = 0; c < node.dataplane().core_count(); ++c) {
      auto* e = node.dataplane().core(c).engine(0);
      ce += e->counter(transport::Ctr::CeReceived);
      cnp_tx += e->counter(transport::Ctr::CnpSent);
      cnp_rx += e->counter(transport::Ctr::CnpReceived);
    }
    for (const auto& q : node.dataplane().qps()) {
      dec += q.rp.decreases;
      paced += q.ctr.paced;
    }
    std::printf(" congestion: CE received %lu CNPs sent %lu received %lu | DCQCN %s rate decreases %lu paced %lu\n",
                static_cast<unsigned long>(ce), static_cast<unsigned long>(cnp_tx), static_cast<unsigned long>(cnp_rx),
                node.cc().dcqcn.enabled ? "on" : "off", static_cast<unsigned long>(dec),
                static_cast<unsigned long>(paced));
  }
  if (std::getenv("DROCE_PERF_VERBOSE")) {
    for (size_t c = 0; c < node.dataplane().core_count(); ++c) {
      auto* e = node.dataplane().core(c).engine(0);
      for (size_t i = 0; i < static_cast<size_t>(transport::Ctr::kCount); ++i)
        if (e->counter(static_cast<transport::Ctr>(i)))
          std::printf("   core %zu %s %lu\n", c, transport::ctr_name(static_cast<transport::Ctr>(i)),
                      static_cast<unsigned long>(e->counter(static_cast<transport::Ctr>(i))));
    }
  }
}

int run_client(const Opts& o, engine::Embedded& node) {
  Params p = params_from(o);
  int fd = tcp_connect(o.host, o.tcp_port);
  Msg hello;
  hello.type = kHello;
  hello.verb = static_cast<uint32_t>(p.verb);
  hello.qptype = static_cast<uint32_t>(p.type);
  hello.qps = p.qps;
  hello.depth = p.depth;
  hello.mtu = p.mtu;
  hello.max_size = p.max_size;
  hello.lat = p.lat;
  std::snprintf(hello.atomic_op, sizeof hello.atomic_op, "%s", p.atomic_op.c_str());
  send_all(fd, &hello, sizeof hello);
  Side s;
  const auto t_setup = std::chrono::steady_clock::now();
  try {
    setup_side(s, node, p, o.qp_timeout);
  } catch (const std::exception& e) {
    send_qp_error(fd, e.what());
    throw;
  }
  auto poll = [&] { node.poll(); };
  QpListHdr ph, mh;
  const std::vector<QpEntry> peer = recv_qps(fd, ph, p.qps, poll);
  send_qps(fd, mh, describe(s, node, o.gid_index, mh));
  connect_side(s, node, ph, peer);
  fill_sources(s, p);
  const double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_setup).count();
  const uint64_t in_all = std::min<uint64_t>(p.total, uint64_t{std::min(p.depth, s.slots)} * p.qps);
  std::printf(" %s test, %s, %u QP(s), MTU %u, tx depth %u per QP, %lu in all, %s\n", o.test.c_str(), o.conn.c_str(),
              p.qps, p.mtu, std::min(p.depth, s.slots), static_cast<unsigned long>(in_all),
              o.duration > 0 ? ("duration " + std::to_string(o.duration) + " s").c_str()
                             : ("iterations " + std::to_string(o.iters) +
                                (p.lat ? " after " + std::to_string(o.warmup) + " not counted" : std::string()))
                                   .c_str());
  std::printf(" set up and connected %u QP(s) on each side in %.2f s\n", p.qps, setup_s);
  if (p.lat) print_lat_header(); else print_bw_header(o.gbits);
  if (o.sample_us > 0 && !p.lat) {
    if (o.sample_csv.empty()) throw std::runtime_error("--sample-us wants --sample-csv FILE");
    g_sampler.period_tsc = std::max<uint64_t>(1, static_cast<uint64_t>(o.sample_us * 1e-6 * rte_get_tsc_hz()));
    g_sampler.path = o.sample_csv;
    const double secs = o.duration > 0 ? o.duration + 1 : 10;
    const double rows = (secs * 1e6 / o.sample_us + 1) * static_cast<double>(s.q.size());
    if (rows > 5e7)
      throw std::runtime_error("--sample-us " + std::to_string(o.sample_us) + " over " + std::to_string(s.q.size()) +
                               " QPs would keep " + std::to_string(static_cast<uint64_t>(rows)) +
                               " samples (at most 50 M): sample less often");
    g_sampler.rows.reserve(static_cast<size_t>(rows));
  }
  bool all_ok = true;
  for (uint32_t size : sizes_of(o, p)) {
    Msg st;
    st.type = kStart;
    st.size = size;
    st.iters = p.lat ? o.iters + o.warmup : o.iters;  // the server answers the warm-up too
    send_all(fd, &st, sizeof st);
    Msg ready;
    recv_msg(fd, &ready, sizeof ready, poll);
    std::vector<uint64_t> count(s.q.size(), 0);
    Result r = p.lat ? run_lat(s, p, size, o.iters, o.warmup) : run_bw(s, p, size, o.iters, o.duration, count);
    if (p.lat) count[0] = r.msgs;
    g_sampler.write();
    // Let the last ACKs / pongs settle before the server checks its memory.
    for (int i = 0; i < 2000; ++i) node.poll();
    Msg done;
    done.type = kDone;
    done.size = size;
    done.qps = static_cast<uint32_t>(count.size());
    send_all(fd, &done, sizeof done);
    send_bytes(fd, count.data(), count.size() * sizeof(uint64_t));
    Msg res;
    recv_msg(fd, &res, sizeof res, poll);
    const bool ok = r.errors == 0 && res.ok == 1;
    if (!ok) all_ok = false;
    if (res.ok != 1) spdlog::error("server found {} error(s) in its memory", res.errors);
    if (p.lat) {
      print_lat(size, r, ok);
    } else {
      print_bw(size, r, o.gbits, ok);
      print_per_qp(s, size, r, count);
    }
    std::fflush(stdout);
    if (r.errors) break;
  }
  Msg bye;
  bye.type = kBye;
  send_all(fd, &bye, sizeof bye);
  std::printf("---------------------------------------------------------------------------------------\n");
  print_counters(node);
  std::printf("result: %s\n", all_ok ? "PASS (data verified)" : "FAIL");
  std::fflush(stdout);
  node.dataplane().stop();
  // Teardown order: the server closes its port first and then the TCP
  // connection; we close ours after that (see close_after_peer in main).
  wait_peer_closed(fd, 10.0);
  close(fd);
  return all_ok ? 0 : 1;
}

int run_server(const Opts& o, engine::Embedded& node, int* tcp_fd) {
  int fd = tcp_listen(o.tcp_port);
  auto poll = [&] { node.poll(); };
  Msg hello;
  recv_msg(fd, &hello, sizeof hello, poll, 30);
  if (hello.type != kHello) throw std::runtime_error("protocol: expected hello");
  Params p;
  p.verb = static_cast<Verb>(hello.verb);
  p.type = static_cast<QpType>(hello.qptype);
  p.qps = hello.qps;
  p.depth = hello.depth;
  p.mtu = hello.mtu;
  p.max_size = hello.max_size;
  p.lat = hello.lat != 0;
  p.atomic_op = std::string(hello.atomic_op, strnlen(hello.atomic_op, sizeof hello.atomic_op));
  Side s;
  try {
    if (p.qps < 1 || p.qps > kMaxQps)
      throw std::runtime_error("the client asks for " + std::to_string(p.qps) + " QPs; droce-perf takes 1 to " +
                               std::to_string(kMaxQps));
    if (p.depth < 1) throw std::runtime_error("the client asks for a tx depth of 0");
    setup_side(s, node, p, o.qp_timeout);
  } catch (const std::exception& e) {
    send_qp_error(fd, e.what());
    throw;
  }
  QpListHdr ph, mh;
  send_qps(fd, mh, describe(s, node, o.gid_index, mh));
  const std::vector<QpEntry> peer = recv_qps(fd, ph, p.qps, poll);
  connect_side(s, node, ph, peer);
  // READ source: each slot holds message `slot` once and for all.
  if (p.verb == Verb::Read)
    for (auto& q : s.q)
      for (uint32_t k = 0; k < s.slots; ++k) fill(q.buf + size_t{k} * s.slot_size, s.slot_size, k);
  if (p.verb == Verb::Send)
    for (size_t qi = 0; qi < s.q.size(); ++qi)
      for (uint32_t k = 0; k < s.slots - (p.lat ? 1 : 0); ++k) post_recv_slot(s, qi, k);
  std::printf("client connected: %u QP(s), verb %u, %s\n", p.qps, hello.verb, p.lat ? "latency" : "bandwidth");
  std::fflush(stdout);
  uint64_t total_err = 0;
  std::vector<verbs::Wc> wcs;
  for (;;) {
    ServerRound rd;
    Msg m;
    recv_msg(fd, &m, sizeof m, [&] { server_poll(s, p, rd, wcs); }, 600);
    if (m.type == kBye) break;
    if (m.type != kStart) throw std::runtime_error("protocol: expected start");
    rd.size = m.size;
    rd.lat_iters = m.iters;
    Msg ready;
    ready.type = kReady;
    send_all(fd, &ready, sizeof ready);
    Msg done;
    recv_msg(fd, &done, sizeof done, [&] { server_poll(s, p, rd, wcs); }, 600);
    if (done.type != kDone) throw std::runtime_error("protocol: expected done");
    if (done.qps != s.q.size()) throw std::runtime_error("protocol: done counts " + std::to_string(done.qps) + " QPs");
    std::vector<uint64_t> count(done.qps);
    recv_bytes(fd, count.data(), count.size() * sizeof(uint64_t), [&] { server_poll(s, p, rd, wcs); }, 60);
    for (int i = 0; i < 2000; ++i) server_poll(s, p, rd, wcs);
    Msg res;
    res.type = kResult;
    res.errors = server_verify(s, p, count, rd);
    res.ok = res.errors == 0;
    total_err += res.errors;
    send_all(fd, &res, sizeof res);
    std::printf(" size %u: %s (received %lu)\n", rd.size, res.ok ? "verified" : "MISMATCH",
                static_cast<unsigned long>(rd.received));
  }
  print_counters(node);
  std::printf("result: %s\n", total_err == 0 ? "PASS (data verified)" : "FAIL");
  std::fflush(stdout);
  node.dataplane().stop();
  *tcp_fd = fd;  // closed by main once the port is closed: the client waits for that
  return total_err == 0 ? 0 : 1;
}

// The memif PMD of DPDK 22.11 can crash when its device is closed while the
// interrupt thread handles the peer's disconnect (the socket callback outlives
// the device). So the two sides never close at once: the server closes first,
// and the client closes only once its link is seen down (bounded, memif only:
// other ports keep their link up when the peer goes).
void close_after_peer(engine::Embedded& node) {
  if (node.port().driver() != "net_memif") return;
  for (int i = 0; i < 200 && node.port().link().up; ++i) usleep(10000);
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  CLI::App app{"droce-perf: perftest-like RoCEv2 benchmark between two droce nodes"};
  app.add_option("test", o.test, "send_bw send_lat write_bw write_lat read_bw read_lat atomic_bw atomic_lat, or raw_ethernet_bw / raw_ethernet_lat (frames with no transport: the baselines)")->required();
  app.add_option("server", o.host, "server address for the TCP exchange (client side); none: be the server");
  engine::add_node_options(app, o.device, o.ip, o.mac);
  app.add_option("-s,--size", o.size, "message size in bytes")->check(CLI::Range(1u, 1u << 30));
  app.add_flag("-a,--all", o.all, "run sizes 2 .. 2^20 (or --max-size)");
  app.add_option("--max-size", o.max_size, "largest size with -a");
  app.add_option("-n,--iters", o.iters, "iterations")->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--warmup", o.warmup,
                 "latency tests and raw_ethernet_lat: ping-pongs run first and not counted (the first round through "
                 "the port's rings faults in their pages; 0: every iteration counted, as perftest does); "
                 "raw_ethernet_bw: frames the server receives before it starts counting")
      ->check(CLI::Range(0u, 1u << 24))
      ->capture_default_str();
  app.add_option("-D,--duration", o.duration, "run for this many seconds (bw tests)");
  app.add_option("-q,--qp", o.qps, "number of QPs (bw tests; 1 to 65536); the work requests in flight are shared out over them (-t)")
      ->check(CLI::Range(1u, kMaxQps));
  app.add_option("-m,--mtu", o.mtu, "path MTU")->check(CLI::IsMember({256, 512, 1024, 2048, 4096}));
  app.add_option("-c,--connection", o.conn, "RC, UC or UD")->check(CLI::IsMember({"RC", "UC", "UD"}));
  app.add_option("-x,--gid-index", o.gid_index, "GID index (1 = first IPv4 address, as rxe)");
  app.add_option("-t,--tx-depth", o.depth,
                 "work requests in flight (default 128). With -q N they are shared out: each QP keeps at most "
                 "ceil(T/N) outstanding (at least 1; its send queue is that deep) and T in all, the QPs posting in "
                 "turn, round robin (-q 1: perftest's tx depth)")
      ->check(CLI::Range(2, 4096));
  app.add_flag("--tx-depth-per-qp", o.depth_per_qp,
               "-t is each QP's (perftest's meaning of -t with -q): N x T work requests in flight in all");
  app.add_option("-p,--port", o.tcp_port, "TCP port of the exchange");
  app.add_option("-A,--atomic_type", o.atomic_op, "FETCH_AND_ADD or CMP_AND_SWAP")
      ->check(CLI::IsMember({"FETCH_AND_ADD", "CMP_AND_SWAP"}));
  app.add_option("--cq-mod", o.cq_mod, "write_bw / send_bw: signal one work request in this many (perftest's --cq-mod; capped at the tx depth)")
      ->check(CLI::Range(1u, 4096u));
  app.add_option("--window", o.window, "packets in flight per QP (go-back-N window)")->check(CLI::Range(1, 65536));
  app.add_option("--initial-window", o.initial_window,
                 "packets a QP may have in flight when it starts (slow start up to --window); 0: --window")
      ->check(CLI::Range(0, 65536));
  app.add_option("--tail-timeout-us", o.tail_timeout_us,
                 "after this long without progress resend the last packet as a probe (and after 3x, 7x, 15x) instead of waiting for the ACK timeout (0: off)")
      ->check(CLI::Range(0u, 10'000'000u));
  app.add_option("--zero-copy-min", o.zero_copy_min,
                 "payloads of at least this many bytes from hugepage MRs are sent by reference (0: always copy)");
  app.add_flag("--report_gbits", o.gbits, "bandwidth in Gb/s (default MB/s)");
  app.add_option("--queues", o.queues, "RX/TX queues = core loops of this node")->check(CLI::Range(1, 8));
  app.add_option("--qp-timeout", o.qp_timeout,
                 "local ACK timeout exponent (4.096 us * 2^t; default 14: 67 ms). With many WRs in flight over many "
                 "QPs a message waits behind all the others (131072 in flight at 1 M/s: 131 ms): raise it (18: 1.07 s) "
                 "or the QPs time out on a lossless port")
      ->check(CLI::Range(1, 31));
  app.add_option("--fault-drop", o.f_drop, "fault injection: RX drop probability")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-dup", o.f_dup, "fault injection: RX duplicate probability")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-reorder", o.f_reorder, "fault injection: RX reorder probability")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-corrupt", o.f_corrupt, "fault injection: RX corrupt probability")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--dcqcn", o.dcqcn, "DCQCN rate control on this node's QPs (NVIDIA's defaults)");
  app.add_option("--dcqcn-line-rate", o.dcqcn_line_rate_mbps, "DCQCN line rate (Mb/s): where a QP starts and recovers to");
  app.add_option("--dcqcn-param", o.dcqcn_params,
                 "DCQCN KEY=N, a key of [port.dcqcn_params] (config/README.md), repeatable; without --dcqcn "
                 "the notification point's keys (min_time_between_cnps_us ...) still apply");
  app.add_option("--bn-gbps", o.bn_gbps, "TX bottleneck: drain rate (Gb/s; 0: none)")->check(CLI::Range(0.0, 1600.0));
  app.add_option("--bn-kmin", o.bn.kmin_bytes, "TX bottleneck: RED Kmin (bytes)");
  app.add_option("--bn-kmax", o.bn.kmax_bytes, "TX bottleneck: RED Kmax (bytes)");
  app.add_option("--bn-pmax", o.bn.pmax, "TX bottleneck: RED Pmax")->check(CLI::Range(0.0, 1.0));
  app.add_option("--bn-limit", o.bn.limit_bytes, "TX bottleneck: tail drop past this many bytes queued");
  app.add_flag("!--bn-no-ecn", o.bn.ecn, "TX bottleneck: tail drop only, no ECN marking");
  app.add_option("--bn-pfc-xoff", o.bn.pfc_xoff_bytes,
                 "TX bottleneck: PFC, pause this node's TX once the queue would pass this many bytes (0: no PFC)");
  app.add_option("--bn-pfc-xon", o.bn.pfc_xon_bytes, "TX bottleneck: PFC, resume once the queue has drained to this (default xoff/2)");
  app.add_option("--sample-us", o.sample_us,
                 "bw tests, client: sample the TX bottleneck's queue and each QP's DCQCN state this often (us)")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--sample-csv", o.sample_csv, "... into this CSV file (t_us,qp,rate_mbps,...)");
  app.add_flag("--bn-mark-dequeue", o.bn.mark_dequeue,
               "TX bottleneck: RED on the queue a frame leaves behind (marking on departure), not the one it finds");
  app.footer(
      "EAL arguments after --. Exit status 0 when every run completed with its data verified.\n"
      "Memory per side: the message buffers of all QPs are one hugepage block of at most 256 MiB (each QP\n"
      "max(2, its depth) slots of the message size rounded up to 64 B: -q 65536 -s 64 takes 8 MiB), and\n"
      "each QP a few KB of heap (its send queue as deep as its share of -t, the loop's CQs shared).");
  std::vector<std::string> eal;
  if (const auto rc = engine::parse_node_command_line(app, argc, argv, eal)) return *rc;
  spdlog::set_level(spdlog::level::warn);
  try {
    const bool raw = o.test == "raw_ethernet_lat" || o.test == "raw_ethernet_bw";
    if (!raw) {
      Params check = params_from(o);  // reject bad combinations before starting DPDK
      (void)check;
    }
    auto node = std::make_unique<engine::Embedded>(embed_options(o, eal));
    if (raw) return o.test == "raw_ethernet_bw" ? run_raw_bw(o, *node) : run_raw_lat(o, *node);
    apply_faults(*node, o);
    engine::announce_node(*node, o.device, o.gid_index, "-x");
    if (!o.host.empty()) {
      const int rc = run_client(o, *node);
      close_after_peer(*node);
      return rc;
    }
    int fd = -1;
    const int rc = run_server(o, *node, &fd);
    node.reset();  // the port is closed before the client learns we are done
    if (fd >= 0) close(fd);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "droce-perf: %s\n", e.what());
    return 1;
  }
}

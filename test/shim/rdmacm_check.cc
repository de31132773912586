// The drop-in librdmacm's behaviour that needs no CM peer, through its public
// API (linked against the front, not Debian's librdmacm).
//   rdmacm_check offline            no daemon at $DROCE_SOCKET
//   rdmacm_check droced IP OTHER PEER
//                                   a droced whose port has address IP; OTHER
//                                   is an address no droced port has, PEER one
//                                   the port reaches (its ARP answered)
// Prints one line per check; exits 1 if any failed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace {

int g_fail = 0, g_pass = 0;
// why: printed after a failure only (errno as the call left it).
void check_impl(bool ok, const std::string& what, const std::string& why = "") {
  std::printf("%s %s%s\n", ok ? "ok  " : "FAIL", what.c_str(), ok ? "" : why.c_str());
  (ok ? g_pass : g_fail)++;
}
// A call returning -1 with errno e.
bool fails_with(int rc, int e) { return rc == -1 && errno == e; }
// The condition first, then the texts (errno as the condition's calls left it).
#define check(cond, ...)                    \
  do {                                      \
    const bool check_ok_ = (cond);          \
    check_impl(check_ok_, __VA_ARGS__);     \
  } while (0)
std::string err() { return std::string(" (errno ") + std::strerror(errno) + ")"; }

sockaddr_in ip4(const char* a, uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_port = htons(port);
  inet_pton(AF_INET, a, &s.sin_addr);
  return s;
}

void offline() {
  errno = 0;
  rdma_event_channel* ch = rdma_create_event_channel();
  check(ch == nullptr && errno == ENODEV, "no daemon: rdma_create_event_channel fails with ENODEV", err());
  rdma_cm_id* id = nullptr;
  check(fails_with(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), ENODEV),
        "no daemon: rdma_create_id (synchronous) fails with ENODEV", err());
  int n = -1;
  ibv_context** devs = rdma_get_devices(&n);
  check(devs == nullptr && n == 0, "no daemon: rdma_get_devices returns no device");

  // rdma_getaddrinfo: numeric host, active side.
  rdma_addrinfo hints{}, *res = nullptr;
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  int rc = rdma_getaddrinfo("10.1.2.3", "7471", &hints, &res);
  bool good = rc == 0 && res && res->ai_dst_addr && res->ai_dst_len == sizeof(sockaddr_in) &&
              res->ai_dst_addr->sa_family == AF_INET && res->ai_src_addr == nullptr &&
              res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP &&
              !(res->ai_flags & RAI_PASSIVE);
  if (good) {
    auto* sin = reinterpret_cast<sockaddr_in*>(res->ai_dst_addr);
    char buf[32];
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    good = std::string(buf) == "10.1.2.3" && ntohs(sin->sin_port) == 7471;
  }
  check(good, "rdma_getaddrinfo 10.1.2.3:7471 -> destination address, RC, RDMA_PS_TCP");
  rdma_freeaddrinfo(res);

  // Passive: the wildcard address goes to the source.
  hints = {};
  hints.ai_flags = RAI_PASSIVE;
  res = nullptr;
  rc = rdma_getaddrinfo(nullptr, "7472", &hints, &res);
  good = rc == 0 && res && (res->ai_flags & RAI_PASSIVE) && res->ai_src_addr && res->ai_dst_addr == nullptr &&
         ntohs(reinterpret_cast<sockaddr_in*>(res->ai_src_addr)->sin_port) == 7472;
  check(good, "rdma_getaddrinfo RAI_PASSIVE -> source address with the port");
  rdma_freeaddrinfo(res);

  // UD hints: RDMA_PS_UDP.
  hints = {};
  hints.ai_qp_type = IBV_QPT_UD;
  hints.ai_flags = RAI_NUMERICHOST;
  res = nullptr;
  rc = rdma_getaddrinfo("10.1.2.4", "7174", &hints, &res);
  check(rc == 0 && res && res->ai_qp_type == IBV_QPT_UD && res->ai_port_space == RDMA_PS_UDP,
        "rdma_getaddrinfo with a UD hint -> RDMA_PS_UDP");
  rdma_freeaddrinfo(res);

  // IPv6.
  res = nullptr;
  rc = rdma_getaddrinfo("fd00::5", "7471", nullptr, &res);
  check(rc == 0 && res && res->ai_dst_addr && res->ai_dst_addr->sa_family == AF_INET6 &&
            res->ai_dst_len == sizeof(sockaddr_in6),
        "rdma_getaddrinfo fd00::5 -> an IPv6 destination");
  rdma_freeaddrinfo(res);

  // A name that is not numeric with RAI_NUMERICHOST: getaddrinfo's error.
  hints = {};
  hints.ai_flags = RAI_NUMERICHOST;
  res = nullptr;
  rc = rdma_getaddrinfo("not-a-number", "7471", &hints, &res);
  check(rc != 0 && res == nullptr, "rdma_getaddrinfo of a non-numeric host with RAI_NUMERICHOST fails");
  check(fails_with(rdma_getaddrinfo(nullptr, nullptr, nullptr, &res), EINVAL),
        "rdma_getaddrinfo with nothing to resolve: EINVAL");
  rdma_freeaddrinfo(nullptr);

  check(std::string(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED)) == "RDMA_CM_EVENT_ESTABLISHED" &&
            std::string(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT)) == "RDMA_CM_EVENT_TIMEWAIT_EXIT" &&
            std::string(rdma_event_str(static_cast<rdma_cm_event_type>(99))) == "UNKNOWN EVENT",
        "rdma_event_str names events as librdmacm does");

  rdma_cm_id fake{};
  fake.route.addr.src_sin = ip4("10.0.0.1", 4791);
  fake.route.addr.dst_sin6.sin6_family = AF_INET6;
  fake.route.addr.dst_sin6.sin6_port = htons(18515);
  check(rdma_get_src_port(&fake) == htons(4791) && rdma_get_dst_port(&fake) == htons(18515),
        "rdma_get_src_port / rdma_get_dst_port read the route's ports (IPv4, IPv6)");

  check(fails_with(rsocket(AF_INET, SOCK_STREAM, 0), ENOSYS), "rsocket: ENOSYS (rsockets not offered)");
  check(fails_with(rdma_ack_cm_event(nullptr), EINVAL), "rdma_ack_cm_event(NULL): EINVAL");
}

// Waits (bounded) for one event on ch; nullptr on timeout or error.
rdma_cm_event* wait_event(rdma_event_channel* ch, int ms) {
  pollfd p{ch->fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

void with_droced(const char* ip, const char* other, const char* peer) {
  rdma_event_channel* ch = rdma_create_event_channel();
  check(ch != nullptr && ch->fd >= 0, "rdma_create_event_channel gives a channel with an fd", err());
  if (ch == nullptr) return;
  int fl = fcntl(ch->fd, F_GETFL);
  fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
  rdma_cm_event* ev = nullptr;
  check(fails_with(rdma_get_cm_event(ch, &ev), EAGAIN), "empty non-blocking channel: EAGAIN", err());
  pollfd p{ch->fd, POLLIN, 0};
  check(poll(&p, 1, 0) == 0, "empty channel fd does not poll readable");
  {
    // A signal ends a blocking wait with EINTR, as librdmacm's read() does
    // (an alarm in the program must get it out of rdma_get_cm_event). The
    // interval timer repeats, so one that lands before the read still
    // leaves another to interrupt it; none comes after 2 s.
    fcntl(ch->fd, F_SETFL, fl & ~O_NONBLOCK);
    struct sigaction sa{}, old{};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, &old);
    itimerval it{{0, 50000}, {0, 50000}};
    setitimer(ITIMER_REAL, &it, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    int rc = 0, e = 0;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
      rc = rdma_get_cm_event(ch, &ev);
      e = errno;
      if (rc != 0) break;
      rdma_ack_cm_event(ev);  // not expected: no event is due
    }
    itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    sigaction(SIGALRM, &old, nullptr);
    errno = e;
    check(rc == -1 && e == EINTR, "a signal ends a blocking rdma_get_cm_event with EINTR", err());
    fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
  }

  rdma_cm_id* id = nullptr;
  check(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0 && id && id->channel == ch &&
            id->qp_type == IBV_QPT_RC && id->ps == RDMA_PS_TCP,
        "rdma_create_id RDMA_PS_TCP: an RC id on the channel", err());
  if (!id) return;
  sockaddr_in bad = ip4(other, 0);
  check(fails_with(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&bad)), EADDRNOTAVAIL),
        std::string("rdma_bind_addr on ") + other + " (no droced port has it): EADDRNOTAVAIL", err());
  sockaddr_in6 bad6{};
  bad6.sin6_family = 77;  // not an address family we know
  check(fails_with(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&bad6)), EINVAL),
        "rdma_bind_addr of an unknown family: EINVAL");
  sockaddr_in mine = ip4(ip, 0);
  int rc = rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&mine));
  check(rc == 0 && id->verbs != nullptr && id->pd != nullptr && id->port_num == 1 &&
            rdma_get_src_port(id) != 0 && rdma_get_local_addr(id)->sa_family == AF_INET,
        std::string("rdma_bind_addr ") + ip + ":0 -> droced's device, an ephemeral port", err());
  if (rc == 0 && id->verbs)
    check(std::strncmp(ibv_get_device_name(id->verbs->device), "droce", 5) == 0,
          std::string("id->verbs is a droce device (") + ibv_get_device_name(id->verbs->device) + ")");
  check(rdma_listen(id, 4) == 0, "rdma_listen on the bound id", err());

  // A second id shares the device context (one per device, as librdmacm).
  rdma_cm_id* id2 = nullptr;
  sockaddr_in mine2 = ip4(ip, 0);
  if (rdma_create_id(ch, &id2, nullptr, RDMA_PS_UDP) == 0 &&
      rdma_bind_addr(id2, reinterpret_cast<sockaddr*>(&mine2)) == 0)
    check(id2->verbs == id->verbs && id2->qp_type == IBV_QPT_UD, "ids on one device share id->verbs; PS_UDP is UD");
  else
    check(false, "second id (RDMA_PS_UDP) bound", err());
  if (id2 && id2->verbs) {
    // rdma_create_qp_ex passes send ops through to the drop-in's
    // ibv_create_qp_ex (an ibv_qp_ex); XRC is refused.
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_UD;
    qa.cap = {4, 4, 1, 1, 0};
    qa.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    const int qrc = rdma_create_qp_ex(id2, &qa);
    check(qrc == 0 && id2->qp != nullptr && ibv_qp_to_qp_ex(id2->qp) != nullptr &&
              id2->qp->state == IBV_QPS_RTS,
          "rdma_create_qp_ex with send ops: a UD ibv_qp_ex in RTS", err());
    if (qrc == 0) rdma_destroy_qp(id2);
    ibv_qp_init_attr_ex xa{};
    xa.qp_type = IBV_QPT_UD;
    xa.cap = {4, 4, 1, 1, 0};
    xa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    check(fails_with(rdma_create_qp_ex(id2, &xa), EOPNOTSUPP) && id2->qp == nullptr,
          "rdma_create_qp_ex with an XRC domain: EOPNOTSUPP", err());
  }
  if (id2) {
    // Multicast: a unicast address is refused, a group joins at once
    // (MULTICAST_JOIN with the group's address vector and the caller's
    // context), twice is EADDRINUSE, leaving twice EADDRNOTAVAIL.
    check(fails_with(rdma_join_multicast(id2, reinterpret_cast<sockaddr*>(&mine2), nullptr), EINVAL),
          "rdma_join_multicast of a unicast address: EINVAL");
    sockaddr_in grp = ip4("239.62.1.1", 0);
    int ctx = 0;
    check(rdma_join_multicast(id2, reinterpret_cast<sockaddr*>(&grp), &ctx) == 0, "rdma_join_multicast 239.62.1.1", err());
    check(fails_with(rdma_join_multicast(id2, reinterpret_cast<sockaddr*>(&grp), &ctx), EADDRINUSE),
          "rdma_join_multicast of the same group again: EADDRINUSE");
    rdma_cm_event* mev = nullptr;
    if (rdma_get_cm_event(ch, &mev) == 0) {
      const uint8_t mgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 62, 1, 1};
      check(mev->event == RDMA_CM_EVENT_MULTICAST_JOIN && mev->id == id2 && mev->status == 0 &&
                mev->param.ud.private_data == &ctx && mev->param.ud.qp_num == 0xFFFFFF &&
                mev->param.ud.qkey == RDMA_UDP_QKEY && mev->param.ud.ah_attr.is_global == 1 &&
                std::memcmp(mev->param.ud.ah_attr.grh.dgid.raw, mgid, 16) == 0,
            std::string("MULTICAST_JOIN: ") + rdma_event_str(mev->event) + ", MGID ::ffff:239.62.1.1, QPN 0xFFFFFF, "
                "RDMA_UDP_QKEY, the join's context");
      rdma_ack_cm_event(mev);
    } else {
      check(false, "MULTICAST_JOIN event", err());
    }
    check(rdma_leave_multicast(id2, reinterpret_cast<sockaddr*>(&grp)) == 0, "rdma_leave_multicast", err());
    check(fails_with(rdma_leave_multicast(id2, reinterpret_cast<sockaddr*>(&grp)), EADDRNOTAVAIL),
          "rdma_leave_multicast again: EADDRNOTAVAIL");
    int tos = 0;
    check(rdma_set_option(id2, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &tos, sizeof(tos)) == 0,
          "rdma_set_option REUSEADDR accepted");
    check(fails_with(rdma_set_option(id2, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)), EINVAL),
          "rdma_set_option TOS with a wrong length: EINVAL");
    check(fails_with(rdma_set_option(id2, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &tos, sizeof(tos)), ENOSYS),
          "rdma_set_option IB_PATH: ENOSYS");
    ibv_ece ece{};
    check(rdma_get_remote_ece(id2, &ece) == 0 && ece.vendor_id == 0 && ece.options == 0,
          "rdma_get_remote_ece: zeroed (no ECE)");
    check(rdma_destroy_id(id2) == 0, "rdma_destroy_id of the UD id", err());
  }

  // An event left unacked when its id is destroyed: as librdmacm, the
  // destroy waits for the ack (here from another thread, 300 ms later), and
  // the event stays valid until then.
  rdma_cm_id* id3 = nullptr;
  sockaddr_in dst = ip4(peer, 7);
  if (rdma_create_id(ch, &id3, reinterpret_cast<void*>(0x5eed), RDMA_PS_TCP) == 0 &&
      rdma_resolve_addr(id3, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0) {
    rdma_cm_event* e = wait_event(ch, 5000);
    check(e != nullptr && e->id == id3 && e->event == RDMA_CM_EVENT_ADDR_RESOLVED && id3->verbs != nullptr,
          std::string("rdma_resolve_addr to the peer: ADDR_RESOLVED, id bound to the device") +
              (e ? std::string(" (got ") + rdma_event_str(e->event) + ")" : err()));
    if (e) {
      bool valid = false;
      int ack_rc = -1;
      std::thread acker([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        valid = e->id->context == reinterpret_cast<void*>(0x5eed);
        ack_rc = rdma_ack_cm_event(e);
      });
      auto t0 = std::chrono::steady_clock::now();
      int rc = rdma_destroy_id(id3);
      auto waited = std::chrono::steady_clock::now() - t0;
      acker.join();
      check(rc == 0 && waited >= std::chrono::milliseconds(250),
            "rdma_destroy_id with an unacked event returns once it is acked");
      check(valid && ack_rc == 0, "the unacked event stays valid and acks during the destroy");
    }
  } else {
    check(false, "rdma_resolve_addr to the peer", err());
  }

  int n = 0;
  ibv_context** devs = rdma_get_devices(&n);
  check(devs && n >= 1 && devs[n] == nullptr && devs[0] == id->verbs,
        "rdma_get_devices lists droced's devices (the ids' contexts), NULL-terminated");
  rdma_free_devices(devs);

  check(rdma_destroy_id(id) == 0, "rdma_destroy_id of the listener", err());
  rdma_destroy_event_channel(ch);

  // Synchronous mode: a NULL channel; rdma_resolve_addr waits for its event.
  rdma_cm_id* sid = nullptr;
  sockaddr_in self = ip4(peer, 7);
  check(rdma_create_id(nullptr, &sid, nullptr, RDMA_PS_TCP) == 0 && sid && sid->channel != nullptr,
        "rdma_create_id(NULL channel): a private channel", err());
  if (sid) {
    check(rdma_resolve_addr(sid, nullptr, reinterpret_cast<sockaddr*>(&self), 2000) == 0 && sid->verbs &&
              sid->event && sid->event->event == RDMA_CM_EVENT_ADDR_RESOLVED,
          "synchronous rdma_resolve_addr returns after ADDR_RESOLVED", err());
    check(rdma_destroy_id(sid) == 0, "rdma_destroy_id of the synchronous id", err());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "offline") {
    offline();
  } else if (mode == "droced" && argc == 5) {
    with_droced(argv[2], argv[3], argv[4]);
  } else {
    std::fprintf(stderr, "usage: rdmacm_check offline | droced IP OTHER_IP PEER_IP\n");
    return 2;
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

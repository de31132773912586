// TEST DOUBLE server, not shipped: a ShimServer over the loopback backend
// (loopback_backend.h) on the socket given as argv[1], for running Debian's
// unmodified ibverbs programs against the front. Prints "ready" when the
// socket listens; prints the server's object counters on SIGUSR1 and when it
// exits on SIGTERM/SIGINT (all zero after well-behaved or killed clients).
// With a second argument "cm" it serves the RDMA CM ops too (loopback_cm.h),
// for the drop-in librdmacm.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "loopback_backend.h"
#include "loopback_cm.h"
#include "shim/server.h"

using namespace droce::shim;

static volatile sig_atomic_t g_stop = 0, g_print = 0;
static void on_signal(int) { g_stop = 1; }
static void on_usr1(int) { g_print = 1; }

static void print_stats(const char* tag, const ShimServer& server, const test::LoopbackBackend& backend) {
  auto s = server.stats();
  std::printf("%s clients=%lu", tag, static_cast<unsigned long>(s.clients));
  for (int k = 0; k < static_cast<int>(ObjKind::Count_); k++)
    std::printf(" %s=%lu", obj_kind_name(static_cast<ObjKind>(k)), static_cast<unsigned long>(s.objects[k]));
  std::printf(" mapped=%lu executed=%lu errors=%lu cm_ids=%lu cm_channels=%lu cm_listeners=%lu\n",
              static_cast<unsigned long>(s.mapped_bytes), static_cast<unsigned long>(backend.wqes_executed()),
              static_cast<unsigned long>(backend.bad_wqes()), static_cast<unsigned long>(s.cm_ids),
              static_cast<unsigned long>(s.cm_channels), static_cast<unsigned long>(s.cm_listeners));
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
    return 2;
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGUSR1, on_usr1);
  test::LoopbackBackend backend;
  ShimServerConfig cfg;
  cfg.socket_path = argv[1];
  cfg.socket_mode = 0600;
  // "cm": the RDMA CM ops too, through a cm::Agent talking to itself (loopback_cm.h).
  const bool with_cm = argc > 2 && std::string(argv[2]) == "cm";
  std::unique_ptr<test::LoopbackCm> cm;
  if (with_cm) cm = std::make_unique<test::LoopbackCm>();
  ShimServer server(backend, cfg, cm.get());
  if (int rc = server.listen(); rc != 0) {
    std::fprintf(stderr, "listen %s: %s\n", argv[1], strerror(-rc));
    return 1;
  }
  backend.start_engine();
  std::printf("ready\n");
  std::fflush(stdout);
  while (!g_stop) {
    server.poll_once(100);
    if (g_print) {
      g_print = 0;
      print_stats("stats", server, backend);
    }
  }
  backend.stop_engine();
  print_stats("final", server, backend);
  return 0;
}

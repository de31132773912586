// lib/control: server and client in one process over a socket in a temp dir,
// good requests and hostile input (garbage, oversized, half-closed, too many
// connections, idle clients, refused peers, clients that do not read).
#include <catch2/catch.hpp>

#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>
#include <thread>

#include "control/client.h"
#include "control/server.h"
#include "control/table.h"

using namespace droce::control;
using droce::stats::CounterBlock;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/droce-ctl-XXXXXX";
    REQUIRE(mkdtemp(t) != nullptr);
    path = t;
  }
  ~TempDir() { std::system(("rm -rf " + path).c_str()); }
};

// A server with a few test commands.
struct Fixture {
  TempDir dir;
  ServerOptions opt;
  std::unique_ptr<Server> server;
  explicit Fixture(std::function<void(ServerOptions&)> tweak = {}) {
    opt.path = dir.path + "/ctl.sock";
    opt.mode = 0600;
    if (tweak) tweak(opt);
    server = std::make_unique<Server>(opt);
    server->add("echo", "returns its args", [](const json& a) { return a; });
    server->add("add", "a + b", [](const json& a) { return json(a.at("a").get<int>() + a.at("b").get<int>()); });
    server->add("fail", "always fails", [](const json&) -> json { throw CommandError("no such QP 42"); });
    server->add("crash", "throws a std::exception", [](const json&) -> json { throw std::runtime_error("boom"); });
    server->add("weird", "throws an int", [](const json&) -> json { throw 42; });
    server->add("big", "a large answer", [](const json& a) {
      return json(std::string(a.value("n", 100000), 'x'));
    });
    server->start();
  }
  Client client(int timeout_ms = 3000) { return Client(opt.path, timeout_ms); }
  uint64_t counter(ControlCounter c) const { return server->counters().get(c); }
};

json parse(const std::optional<std::string>& line) {
  REQUIRE(line.has_value());
  return json::parse(*line);
}

// Polls `pred` for up to 2 s.
template <class F>
bool eventually(F pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace

TEST_CASE("requests and answers", "[control]") {
  Fixture f;
  Client c = f.client();
  json help = c.call("help");
  REQUIRE(help["commands"].is_array());
  CHECK(help["commands"].size() == 7);
  CHECK(help["commands"][0]["name"] == "add");
  CHECK(c.call("echo", {{"x", 1}, {"s", "é"}}) == json{{"x", 1}, {"s", "é"}});
  CHECK(c.call("add", {{"a", 2}, {"b", 40}}) == 42);
  CHECK_THROWS_WITH(c.call("fail"), "no such QP 42");
  CHECK_THROWS_WITH(c.call("crash"), "crash: internal error: boom");
  CHECK_THROWS_WITH(c.call("weird"), "weird: internal error");
  CHECK_THROWS_WITH(c.call("add", {{"a", "x"}, {"b", 1}}), Catch::StartsWith("add: bad arguments:"));
  CHECK_THROWS_WITH(c.call("add", {{"a", 1}}), Catch::StartsWith("add: bad arguments:"));
  CHECK_THROWS_WITH(c.call("nope"), "unknown command 'nope' (try 'help')");
  // Still fine after all those errors.
  CHECK(c.call("add", {{"a", 1}, {"b", 1}}) == 2);
  CHECK(f.counter(ControlCounter::requests) == 10);
  CHECK(f.counter(ControlCounter::errors) == 6);
  CHECK(f.counter(ControlCounter::connections) == 1);
  CHECK(f.server->clients() == 1);
}

TEST_CASE("pipelined requests are answered in order with their ids", "[control]") {
  Fixture f;
  Client c = f.client();
  std::string batch;
  for (int i = 0; i < 50; ++i) batch += json{{"cmd", "add"}, {"args", {{"a", i}, {"b", 1}}}, {"id", i}}.dump() + "\n";
  batch += "\n   \n";                   // blank lines are ignored
  batch += R"({"cmd":"echo","id":"last"})" "\r\n";  // CRLF is fine
  c.send_raw(batch);
  for (int i = 0; i < 50; ++i) {
    json a = parse(c.read_line());
    CHECK(a["ok"] == true);
    CHECK(a["id"] == i);
    CHECK(a["result"] == i + 1);
  }
  json last = parse(c.read_line());
  CHECK(last["id"] == "last");
  CHECK(last["result"] == json::object());
}

TEST_CASE("malformed requests get an error answer and the connection stays", "[control][hostile]") {
  Fixture f;
  Client c = f.client();
  const char* bad[] = {
      "{",                             // truncated
      "not json at all",               //
      "[1,2,3]",                       // not an object
      "42",                            //
      "{\"args\":{}}",                 // no cmd
      "{\"cmd\":17}",                  // cmd not a string
      "{\"cmd\":\"echo\",\"args\":[]}",  // args not an object
      "{\"cmd\":\"echo\"} trailing",   // junk after the object
  };
  for (const char* b : bad) {
    INFO(b);
    c.send_raw(std::string(b) + "\n");
    json a = parse(c.read_line());
    CHECK(a["ok"] == false);
    CHECK(a["error"].is_string());
  }
  // Binary garbage with NULs and invalid UTF-8: the error quotes it safely.
  std::string garbage("\x00\xff\xfe\x80{\"cmd\x01", 10);
  c.send_raw(garbage + "\n");
  json g = parse(c.read_line());
  CHECK(g["ok"] == false);
  CHECK_THAT(g["error"].get<std::string>(), Catch::StartsWith("malformed JSON"));
  // An id is echoed even on an argument error.
  c.send_raw("{\"cmd\":\"echo\",\"args\":5,\"id\":9}\n");
  json a = parse(c.read_line());
  CHECK(a["id"] == 9);
  CHECK(a["error"] == "\"args\" must be an object");
  CHECK(c.call("add", {{"a", 1}, {"b", 2}}) == 3);
  CHECK(f.counter(ControlCounter::malformed) == 10);
}

TEST_CASE("random bytes never stop the server", "[control][hostile]") {
  Fixture f;
  std::mt19937 rng(7);
  for (int conn = 0; conn < 20; ++conn) {
    Client c = f.client();
    std::string junk(static_cast<size_t>(rng() % 4000), '\0');
    for (char& ch : junk) ch = static_cast<char>(rng() % 7 == 0 ? '\n' : rng() % 256);
    c.send_raw(junk);
    c.shutdown_write();
    // Drain whatever it answers; each answer is a JSON error object.
    for (int i = 0; i < 10000; ++i) {
      auto line = c.read_line();
      if (!line) break;
      json a = json::parse(*line);
      CHECK(a["ok"].is_boolean());
    }
  }
  Client c = f.client();
  CHECK(c.call("add", {{"a", 20}, {"b", 22}}) == 42);
}

TEST_CASE("oversized requests are refused and the connection closed", "[control][hostile]") {
  Fixture f([](ServerOptions& o) { o.max_request = 1024; });
  SECTION("no newline at all") {
    Client c = f.client();
    c.send_raw(std::string(1025, 'a'));
    json a = parse(c.read_line());
    CHECK(a["ok"] == false);
    CHECK(a["error"] == "request too large (limit 1024 bytes)");
    CHECK_FALSE(c.read_line().has_value());  // closed
  }
  SECTION("a long line, then more") {
    Client c = f.client();
    c.send_raw("{\"cmd\":\"echo\",\"args\":{\"s\":\"" + std::string(2000, 'b') + "\"}}\n{\"cmd\":\"help\"}\n");
    json a = parse(c.read_line());
    CHECK(a["error"] == "request too large (limit 1024 bytes)");
    CHECK_FALSE(c.read_line().has_value());
  }
  SECTION("megabytes of it") {
    Client c = f.client();
    try {
      c.send_raw(std::string(8 << 20, '{'));
    } catch (const ConnectionError&) {
      // The server may close before we finish writing: that is fine too.
    }
    auto line = c.read_line();
    if (line) CHECK(json::parse(*line)["error"] == "request too large (limit 1024 bytes)");
  }
  CHECK(f.counter(ControlCounter::oversized) >= 1);
  Client ok = f.client();
  CHECK(ok.call("add", {{"a", 1}, {"b", 1}}) == 2);
}

TEST_CASE("half-closed and abandoned connections", "[control][hostile]") {
  Fixture f;
  SECTION("complete requests then shutdown(SHUT_WR): all answered, then EOF") {
    Client c = f.client();
    c.send_raw("{\"cmd\":\"add\",\"args\":{\"a\":1,\"b\":2}}\n{\"cmd\":\"help\"}\n");
    c.shutdown_write();
    CHECK(parse(c.read_line())["result"] == 3);
    CHECK(parse(c.read_line())["ok"] == true);
    CHECK_FALSE(c.read_line().has_value());
  }
  SECTION("an unterminated last request at EOF is still answered") {
    Client c = f.client();
    c.send_raw("{\"cmd\":\"add\",\"args\":{\"a\":5,\"b\":5}}");
    c.shutdown_write();
    CHECK(parse(c.read_line())["result"] == 10);
    CHECK_FALSE(c.read_line().has_value());
  }
  SECTION("half a request then shutdown: an error answer, then EOF") {
    Client c = f.client();
    c.send_raw("{\"cmd\":\"ad");
    c.shutdown_write();
    CHECK(parse(c.read_line())["ok"] == false);
    CHECK_FALSE(c.read_line().has_value());
  }
  SECTION("connect and close, or close mid-request, or close before reading") {
    for (int i = 0; i < 5; ++i) {
      { Client c = f.client(); }
      {
        Client c = f.client();
        c.send_raw("{\"cmd\":\"echo\",\"ar");
      }
      {
        Client c = f.client();
        c.send_raw("{\"cmd\":\"big\",\"args\":{\"n\":2000000}}\n");
      }
    }
  }
  CHECK(eventually([&] { return f.server->clients() == 0; }));
  Client c = f.client();
  CHECK(c.call("add", {{"a", 2}, {"b", 2}}) == 4);
}

TEST_CASE("a client that does not read cannot make the server hoard memory", "[control][hostile]") {
  Fixture f;
  Client c = f.client(5000);
  // 40 answers of 400 KB each (16 MB) requested before reading any of them: the
  // server answers up to its 1 MiB output high-water mark and then waits for
  // the client, so what it holds stays well under the 16 MB asked for.
  constexpr int kAnswers = 40;
  constexpr size_t kBound = 4u << 20;  // 1 MiB + one answer, with the string's growth slack
  std::string batch;
  for (int i = 0; i < kAnswers; ++i) {
    batch += "{\"cmd\":\"big\",\"args\":{\"n\":400000},\"id\":" + std::to_string(i) + "}\n";
  }
  c.send_raw(batch);
  // The server has filled its output up to the mark (and the socket buffer) and stopped.
  REQUIRE(eventually([&] { return f.server->buffered_bytes() >= (1u << 20); }));
  size_t peak = f.server->buffered_bytes();
  INFO("held while the client does not read: " << peak << " bytes");
  CHECK(peak <= kBound);
  // Meanwhile another client is served.
  Client other = f.client();
  CHECK(other.call("add", {{"a", 3}, {"b", 4}}) == 7);
  for (int i = 0; i < kAnswers; ++i) {
    json a = parse(c.read_line());
    REQUIRE(a["id"] == i);
    CHECK(a["result"].get<std::string>().size() == 400000);
    peak = std::max(peak, f.server->buffered_bytes());
  }
  CHECK(peak <= kBound);
  // Once everything is read, the connection does not keep the burst's buffers.
  CHECK(eventually([&] { return f.server->buffered_bytes() <= (256u << 10); }));
  CHECK(f.server->clients() == 2);
}

TEST_CASE("partial requests from every allowed connection keep the server's buffers bounded", "[control][hostile]") {
  constexpr size_t kMaxRequest = 65536;
  constexpr size_t kClients = 16;
  Fixture f([](ServerOptions& o) {
    o.max_request = kMaxRequest;
    o.max_clients = kClients;
  });
  // Just under the limit, no newline: the server must hold it, and nothing more.
  const std::string partial = "{\"cmd\":\"echo\",\"args\":{\"s\":\"" + std::string(kMaxRequest - 40, 'p');
  std::vector<std::unique_ptr<Client>> cs;
  for (size_t i = 0; i < kClients; ++i) {
    cs.push_back(std::make_unique<Client>(f.opt.path, 3000));
    cs.back()->send_raw(partial);
  }
  const size_t sent = kClients * partial.size();
  REQUIRE(eventually([&] { return f.server->buffered_bytes() >= sent; }));
  // Per connection: the request so far plus one read chunk of slack, doubled for string growth.
  CHECK(f.server->buffered_bytes() <= kClients * 2 * (kMaxRequest + 16384));
  // One more byte than the limit, everywhere: each is refused and closed, and the memory is given back.
  for (auto& c : cs) c->send_raw(std::string(100, 'p'));
  for (auto& c : cs) {
    json a = parse(c->read_line());
    CHECK(a["error"] == "request too large (limit 65536 bytes)");
    CHECK_FALSE(c->read_line().has_value());
  }
  CHECK(eventually([&] { return f.server->clients() == 0 && f.server->buffered_bytes() == 0; }));
  CHECK(f.counter(ControlCounter::oversized) == kClients);
}

TEST_CASE("connection limit", "[control][hostile]") {
  Fixture f([](ServerOptions& o) { o.max_clients = 2; });
  auto a = std::make_unique<Client>(f.opt.path);
  Client b = f.client();
  CHECK(a->call("add", {{"a", 1}, {"b", 1}}) == 2);
  CHECK(b.call("add", {{"a", 1}, {"b", 1}}) == 2);
  Client third = f.client();
  CHECK_THROWS_WITH(third.call("help"), "too many control connections (limit 2)");
  CHECK(f.counter(ControlCounter::rejected_full) == 1);
  a.reset();
  CHECK(eventually([&] { return f.server->clients() == 1; }));
  Client fourth = f.client();
  CHECK(fourth.call("add", {{"a", 2}, {"b", 1}}) == 3);
}

TEST_CASE("idle connections are closed", "[control][hostile]") {
  Fixture f([](ServerOptions& o) { o.idle_timeout_ms = 150; });
  Client c = f.client();
  c.send_raw("{\"cmd\":");  // and then nothing
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(c.read_line().has_value());
  auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= std::chrono::milliseconds(100));
  CHECK(waited < std::chrono::milliseconds(2000));
  CHECK(f.counter(ControlCounter::idle_closed) == 1);
}

TEST_CASE("peer credentials are checked", "[control]") {
  ucred seen{};
  Fixture refuse([&](ServerOptions& o) {
    o.authorize = [&](const ucred& c) {
      seen = c;
      return false;
    };
  });
  Client c = refuse.client();
  CHECK_THROWS_WITH(c.call("help"), Catch::StartsWith("permission denied: uid " + std::to_string(getuid())));
  CHECK(seen.pid == getpid());
  CHECK(seen.uid == getuid());
  CHECK(refuse.counter(ControlCounter::rejected_peer) == 1);
  // The default policy lets our own uid in.
  Fixture dflt;
  Client d = dflt.client();
  CHECK(d.call("add", {{"a", 0}, {"b", 0}}) == 0);
}

namespace {
// In a child running as uid/gid 65534 (nobody/nogroup): sends a request and
// returns 0 when it was answered, 1 when refused with "permission denied",
// 2 when it could not even connect, 3 on anything else, 4 when the child was
// killed by a signal (SIGPIPE: writing to a connection the server closed must
// be an EPIPE error the client handles, never its death).
// write_after_close: the child first waits (bounded) for the server to close
// the connection and only then writes: the refusal always wins the race that
// made this helper flaky when it used write() (SIGPIPE, status 4).
int request_as_nobody(const std::string& path, bool write_after_close = false) {
  pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) _exit(2);
    if (write_after_close) {
      // POLLHUP (always reported) once the server has closed its end; 2 s at most.
      pollfd p{fd, POLLRDHUP, 0};
      if (poll(&p, 1, 2000) != 1 || (p.revents & POLLHUP) == 0) _exit(3);
    }
    const char req[] = "{\"cmd\":\"help\"}\n";
    if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) < 0) {
      // The refusal may already have closed the connection (EPIPE); read it anyway.
    }
    char buf[512] = {};
    size_t got = 0;
    for (int i = 0; i < 100 && got < sizeof buf - 1; ++i) {
      ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
      if (std::memchr(buf, '\n', got) != nullptr) break;
    }
    if (std::strstr(buf, "\"ok\":true") != nullptr) _exit(0);
    if (std::strstr(buf, "permission denied") != nullptr) _exit(1);
    _exit(3);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 4;
}
}  // namespace

TEST_CASE("default peer policy with real credentials (root only)", "[control]") {
  if (geteuid() != 0) {
    WARN("not root: cannot run a client as another user; skipped");
    return;
  }
  TempDir dir;
  REQUIRE(chmod(dir.path.c_str(), 0755) == 0);  // let nobody reach the socket
  ServerOptions opt;
  opt.path = dir.path + "/ctl.sock";
  SECTION("another user, not in the group: refused by SO_PEERCRED") {
    opt.mode = 0666;  // the file mode would let it in; the credential check must not
    Server s(opt);
    s.start();
    CHECK(request_as_nobody(opt.path) == 1);
    CHECK(s.counters().get(ControlCounter::rejected_peer) == 1);
  }
  SECTION("refused and closed before the client writes: it reads the refusal, no SIGPIPE") {
    opt.mode = 0666;
    Server s(opt);
    s.start();
    CHECK(request_as_nobody(opt.path, true) == 1);
    CHECK(s.counters().get(ControlCounter::rejected_peer) == 1);
  }
  SECTION("a member of the socket's group: served") {
    opt.mode = 0660;
    opt.gid = 65534;
    Server s(opt);
    s.start();
    struct stat st{};
    REQUIRE(stat(opt.path.c_str(), &st) == 0);
    CHECK(st.st_gid == 65534u);
    CHECK(request_as_nobody(opt.path) == 0);
  }
  SECTION("the file mode alone keeps others out") {
    opt.mode = 0600;
    Server s(opt);
    s.start();
    CHECK(request_as_nobody(opt.path) == 2);
  }
}

TEST_CASE("socket file: mode, stale file, live server, not a socket, removal", "[control]") {
  TempDir dir;
  ServerOptions opt;
  opt.path = dir.path + "/sub/dir/ctl.sock";  // parents are created
  opt.mode = 0640;
  {
    // A stale socket: bound, then its process "died" (fd closed).
    std::system(("mkdir -p " + dir.path + "/sub/dir").c_str());
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, opt.path.c_str());
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    close(fd);
  }
  Server s(opt);
  s.start();
  struct stat st{};
  REQUIRE(stat(opt.path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 0777) == 0640);
  {
    Server second(opt);
    CHECK_THROWS_WITH(second.start(), Catch::Contains("is in use by a running server"));
  }
  // The failed second server did not remove the live one's socket.
  CHECK(stat(opt.path.c_str(), &st) == 0);
  CHECK(Client(opt.path).call("help")["commands"].size() == 1);
  CHECK_THROWS_WITH(s.add("late", "", [](const json&) { return json(); }), Catch::Contains("after start()"));
  Client lingering(opt.path);
  s.stop();
  CHECK(stat(opt.path.c_str(), &st) != 0);  // removed
  CHECK_FALSE(lingering.read_line().has_value());  // its connection was closed
  s.stop();  // idempotent
  // Restart right after on the same path.
  Server again(opt);
  again.start();
  CHECK(Client(opt.path).call("help").contains("commands"));
  again.stop();

  ServerOptions file_opt;
  file_opt.path = dir.path + "/plain";
  std::system(("touch " + file_opt.path).c_str());
  Server s3(file_opt);
  CHECK_THROWS_WITH(s3.start(), Catch::Contains("exists and is not a socket"));
  CHECK(access(file_opt.path.c_str(), F_OK) == 0);  // left alone
}

TEST_CASE("client errors are clear", "[control]") {
  CHECK_THROWS_WITH(Client("/nonexistent/droce.sock"),
                    "cannot connect to /nonexistent/droce.sock: No such file or directory (is droced running?)");
}

TEST_CASE("tables", "[control][table]") {
  std::string t = render_table({"name", "value"}, {{"rx_packets", "12"}, {"tx", "12345"}});
  CHECK(t == "NAME        VALUE\nrx_packets     12\ntx          12345\n");
  json counters = {{"groups",
                    {{{"group", "port"},
                      {"names", {"rx_packets", "tx_packets"}},
                      {"instances", {{{"name", "p0"}, {"values", {5, 7}}}}}}}}};
  CHECK(render_result(counters) ==
        "GROUP  INSTANCE  COUNTER     VALUE\n"
        "port   p0        rx_packets      5\n"
        "port   p0        tx_packets      7\n");
  json qps = {{"qps", {{{"qpn", 17}, {"state", "RTS"}}, {{"qpn", 18}, {"state", "ERR"}, {"peer", "10.0.0.2"}}}}};
  CHECK(render_result(qps) == "QPN  STATE  PEER\n 17  RTS\n 18  ERR    10.0.0.2\n");
  json status = {{"pid", 10}, {"ports", json::array({"p0", "p1"})}, {"roce", {{"path_mtu", 1024}}}};
  CHECK(render_result(status) == "KEY            VALUE\npid            10\nports          p0,p1\nroce.path_mtu  1024\n");
  CHECK(render_result(json{{"entries", json::array()}}) == "(none)\n");
}

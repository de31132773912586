// droce/control: the control socket server (see README.md for threads and protocol).
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "stats/stats.h"

namespace droce::control {

using json = nlohmann::ordered_json;

// Thrown by a handler: the message goes to the client as the error.
class CommandError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// clang-format off
#define DROCE_CONTROL_COUNTERS(X)                                                \
  X(connections) X(rejected_peer) X(rejected_full) X(requests) X(errors)          \
  X(malformed) X(oversized) X(idle_closed)
DROCE_COUNTERS(ControlCounter, "control", DROCE_CONTROL_COUNTERS);
// clang-format on

struct ServerOptions {
  std::string path;                  // socket file
  uint32_t mode = 0660;              // its permission bits
  std::optional<gid_t> gid;          // its group; members may connect
  size_t max_request = 65536;        // bytes per request line
  size_t max_clients = 16;
  int idle_timeout_ms = 30000;       // close a connection idle this long
  // Who may talk to us. Empty: root, our own uid, and members of gid.
  std::function<bool(const ucred&)> authorize;
};

using Handler = std::function<json(const json& args)>;

class Server {
 public:
  explicit Server(ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Registers a command; only before start(). Throws std::logic_error on a
  // duplicate name or after start().
  void add(const std::string& name, std::string summary, Handler h);

  // Binds the socket (removing a stale one, refusing one a live server holds)
  // and starts the control thread. Throws std::runtime_error with the reason.
  void start();
  // Stops the thread, closes every connection, unlinks the socket. Idempotent.
  void stop();

  bool running() const { return thread_.joinable(); }
  const std::string& path() const { return opt_.path; }
  // Written by the control thread only; read by anyone (relaxed).
  const stats::CounterBlock<ControlCounter>& counters() const { return counters_; }
  size_t clients() const { return nclients_.load(std::memory_order_relaxed); }
  // Bytes the control thread holds for its connections (the capacity of every
  // connection's input and output buffers), as of its last poll round. Bounded
  // by max_clients x (max_request + a read chunk + the output high-water mark +
  // one answer), whatever the clients send or fail to read.
  size_t buffered_bytes() const { return buffered_.load(std::memory_order_relaxed); }

  // Handles one request line as the control thread would: returns the answer
  // line (without '\n'). Exposed for tests and for in-process callers.
  std::string handle_line(std::string_view line);

 private:
  struct Command {
    std::string summary;
    Handler handler;
  };
  struct Conn;

  void run();
  void bind_socket();
  bool authorized(const ucred& c) const;
  void accept_all();
  // Returns false when the connection should be closed now.
  bool on_readable(Conn& c);
  bool on_writable(Conn& c);
  void process_input(Conn& c);

  ServerOptions opt_;
  std::map<std::string, Command> commands_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  ino_t sock_ino_ = 0;
  std::thread thread_;
  std::map<int, std::unique_ptr<Conn>> conns_;  // control thread only
  std::atomic<size_t> nclients_{0};
  std::atomic<size_t> buffered_{0};
  stats::CounterBlock<ControlCounter> counters_;
};

// The answer lines, for handlers and tests that build them by hand.
std::string ok_line(const json& result, const json& id);
std::string error_line(const std::string& message, const json& id);

}  // namespace droce::control

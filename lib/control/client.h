// droce/control: the client side of the control socket (droce-ctl, tests,
// scripts linking it). Blocking, one request at a time, every wait bounded.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace droce::control {

using json = nlohmann::ordered_json;

// Could not talk to the server: connect, I/O, timeout, or a garbled answer.
class ConnectionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The server answered {"ok": false, "error": ...}.
class RemoteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Client {
 public:
  // Throws ConnectionError ("cannot connect to PATH: No such file or directory (is droced running?)").
  explicit Client(const std::string& path, int timeout_ms = 5000);
  ~Client();
  Client(Client&& o) noexcept;
  Client& operator=(Client&&) = delete;
  Client(const Client&) = delete;

  // Sends {"cmd", "args", "id"} and returns "result"; RemoteError on an error answer.
  json call(const std::string& cmd, const json& args = json::object());
  // Sends one request object, returns the whole answer object.
  json request(const json& req);

  // Raw access (tests): write bytes; read one answer line (nullopt at EOF).
  void send_raw(std::string_view bytes);
  std::optional<std::string> read_line();
  void shutdown_write();

 private:
  int fd_ = -1;
  int timeout_ms_;
  std::string buf_;
  uint64_t next_id_ = 1;
};

}  // namespace droce::control

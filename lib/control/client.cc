#include "control/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace droce::control {
namespace {
int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Client::Client(const std::string& path, int timeout_ms) : timeout_ms_(timeout_ms) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) throw ConnectionError("socket path too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw ConnectionError(std::string("socket(): ") + std::strerror(errno));
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int e = errno;
    close(fd_);
    fd_ = -1;
    std::string hint = (e == ENOENT || e == ECONNREFUSED) ? " (is droced running?)" : "";
    throw ConnectionError("cannot connect to " + path + ": " + std::strerror(e) + hint);
  }
}

Client::~Client() {
  if (fd_ >= 0) close(fd_);
}

Client::Client(Client&& o) noexcept : fd_(o.fd_), timeout_ms_(o.timeout_ms_), buf_(std::move(o.buf_)), next_id_(o.next_id_) {
  o.fd_ = -1;
}

void Client::send_raw(std::string_view bytes) {
  const int64_t deadline = now_ms() + timeout_ms_;
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int left = static_cast<int>(deadline - now_ms());
      if (left <= 0) throw ConnectionError("timed out sending to the control socket");
      pollfd p{fd_, POLLOUT, 0};
      poll(&p, 1, left);
      continue;
    }
    throw ConnectionError(std::string("send: ") + std::strerror(errno));
  }
}

void Client::shutdown_write() { ::shutdown(fd_, SHUT_WR); }

std::optional<std::string> Client::read_line() {
  const int64_t deadline = now_ms() + timeout_ms_;
  for (;;) {
    if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    int left = static_cast<int>(deadline - now_ms());
    if (left <= 0) throw ConnectionError("timed out waiting for an answer (" + std::to_string(timeout_ms_) + " ms)");
    pollfd p{fd_, POLLIN, 0};
    int rc = poll(&p, 1, left);
    if (rc < 0 && errno != EINTR) throw ConnectionError(std::string("poll: ") + std::strerror(errno));
    if (rc <= 0) continue;
    char tmp[16384];
    ssize_t n = recv(fd_, tmp, sizeof tmp, 0);
    if (n > 0) {
      buf_.append(tmp, static_cast<size_t>(n));
    } else if (n == 0) {
      if (buf_.empty()) return std::nullopt;
      std::string line = std::move(buf_);
      buf_.clear();
      return line;
    } else if (errno != EINTR && errno != EAGAIN) {
      if (errno == ECONNRESET) return std::nullopt;
      throw ConnectionError(std::string("recv: ") + std::strerror(errno));
    }
  }
}

json Client::request(const json& req) {
  std::optional<std::string> line;
  try {
    send_raw(req.dump() + "\n");
  } catch (const ConnectionError&) {
    // A server that refused us at accept has answered and closed already:
    // report its reason rather than our EPIPE.
    try {
      line = read_line();
    } catch (const ConnectionError&) {
    }
    if (!line) throw;
  }
  if (!line) line = read_line();
  if (!line) throw ConnectionError("the server closed the connection without an answer");
  try {
    json ans = json::parse(*line);
    if (!ans.is_object() || !ans.contains("ok")) throw ConnectionError("garbled answer: " + *line);
    return ans;
  } catch (const json::parse_error&) {
    throw ConnectionError("garbled answer: " + *line);
  }
}

json Client::call(const std::string& cmd, const json& args) {
  uint64_t id = next_id_++;
  json ans = request({{"cmd", cmd}, {"args", args}, {"id", id}});
  const json& ok = ans["ok"];
  if (!ok.is_boolean() || !ok.get<bool>()) {
    // Refusals before any request (permission, too many clients) carry no id.
    const json& err = ans["error"];
    throw RemoteError(err.is_string() ? err.get<std::string>() : "unspecified error");
  }
  if (ans.value("id", json()) != json(id)) throw ConnectionError("answer for another request: " + ans.dump());
  return ans.value("result", json());
}

}  // namespace droce::control

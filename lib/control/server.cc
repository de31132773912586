// The control socket server: one thread, poll() over the listening socket, an
// eventfd for stop(), and every client connection (non-blocking).
#include "control/server.h"

#include "log/log.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

namespace droce::control {
namespace {

constexpr size_t kReadChunk = 16384;
// Stop answering a connection's further requests while this much output waits
// for a client that does not read: memory per connection stays bounded.
constexpr size_t kOutHighWater = 1 << 20;
// A connection's buffers keep at most this much capacity once drained: a burst
// of large answers does not stay allocated for the life of the connection.
constexpr size_t kKeepCapacity = 64 << 10;

std::string errstr(int e) { return std::strerror(e); }

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string dump(const json& j) {
  // replace: a client's invalid UTF-8 quoted in a message never makes dump() throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string ok_line(const json& result, const json& id) {
  json r = {{"ok", true}, {"result", result}};
  if (!id.is_null()) r["id"] = id;
  return dump(r);
}

std::string error_line(const std::string& message, const json& id) {
  json r = {{"ok", false}, {"error", message}};
  if (!id.is_null()) r["id"] = id;
  return dump(r);
}

struct Server::Conn {
  int fd = -1;
  std::string in;
  std::string out;
  size_t out_off = 0;
  bool read_closed = false;   // peer shut its write side
  bool close_after_flush = false;
  int64_t last_active = 0;
  ucred cred{};
};

Server::Server(ServerOptions opt) : opt_(std::move(opt)) {
  add("help", "list the commands", [this](const json&) {
    json list = json::array();
    for (const auto& [name, cmd] : commands_) list.push_back({{"name", name}, {"summary", cmd.summary}});
    return json{{"commands", list}};
  });
}

Server::~Server() { stop(); }

void Server::add(const std::string& name, std::string summary, Handler h) {
  if (running()) throw std::logic_error("control: add(" + name + ") after start()");
  if (name.empty()) throw std::logic_error("control: empty command name");
  if (!commands_.emplace(name, Command{std::move(summary), std::move(h)}).second) {
    throw std::logic_error("control: command " + name + " registered twice");
  }
}

bool Server::authorized(const ucred& c) const {
  if (opt_.authorize) return opt_.authorize(c);
  if (c.uid == 0 || c.uid == geteuid()) return true;
  if (!opt_.gid) return false;
  if (c.gid == *opt_.gid) return true;
  // Supplementary groups of the peer's user.
  passwd pw{};
  passwd* res = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(c.uid, &pw, buf.data(), buf.size(), &res) != 0 || res == nullptr) return false;
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) return false;
  }
  for (int i = 0; i < n; ++i) {
    if (groups[static_cast<size_t>(i)] == *opt_.gid) return true;
  }
  return false;
}

void Server::bind_socket() {
  const std::string& path = opt_.path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    throw std::runtime_error("control: socket path \"" + path + "\" is empty or longer than " +
                             std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (ec) throw std::runtime_error("control: cannot create " + parent.string() + ": " + ec.message());
  }

  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throw std::runtime_error("control: " + path + " exists and is not a socket; not touching it");
    }
    // A live server answers connect(); a stale socket file refuses it.
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) throw std::runtime_error("control: socket(): " + errstr(errno));
    int rc = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int err = errno;
    close(probe);
    if (rc == 0) {
      throw std::runtime_error("control: " + path + " is in use by a running server (another droced?)");
    }
    if (err != ECONNREFUSED && err != ENOENT) {
      throw std::runtime_error("control: cannot probe " + path + ": " + errstr(err));
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      throw std::runtime_error("control: cannot remove stale socket " + path + ": " + errstr(errno));
    }
    spdlog::info("control: removed stale socket {}", path);
  }

  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error("control: socket(): " + errstr(errno));
  auto fail = [&](const std::string& what) {
    int e = errno;
    close(listen_fd_);
    listen_fd_ = -1;
    throw std::runtime_error("control: " + what + " " + path + ": " + errstr(e));
  };
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("cannot bind");
  if (chmod(path.c_str(), opt_.mode) != 0) {
    unlink(path.c_str());
    fail("cannot chmod");
  }
  if (opt_.gid && chown(path.c_str(), static_cast<uid_t>(-1), *opt_.gid) != 0) {
    unlink(path.c_str());
    fail("cannot chown");
  }
  if (lstat(path.c_str(), &st) == 0) sock_ino_ = st.st_ino;
  if (listen(listen_fd_, 64) != 0) {
    unlink(path.c_str());
    fail("cannot listen on");
  }
}

void Server::start() {
  if (running()) throw std::logic_error("control: start() twice");
  bind_socket();
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    int e = errno;
    close(listen_fd_);
    listen_fd_ = -1;
    unlink(opt_.path.c_str());
    throw std::runtime_error("control: eventfd(): " + errstr(e));
  }
  thread_ = std::thread([this] { run(); });
  spdlog::info("control: listening on {}", opt_.path);
}

void Server::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof one) != sizeof one) {
    spdlog::error("control: cannot wake the control thread: {}", errstr(errno));
  }
  thread_.join();
  for (auto& [fd, c] : conns_) close(fd);
  conns_.clear();
  nclients_.store(0, std::memory_order_relaxed);
  buffered_.store(0, std::memory_order_relaxed);
  close(listen_fd_);
  close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
  // Remove the socket only if it is still ours (not one a newer server bound).
  struct stat st{};
  if (lstat(opt_.path.c_str(), &st) == 0 && st.st_ino == sock_ino_ && S_ISSOCK(st.st_mode)) {
    unlink(opt_.path.c_str());
  }
  spdlog::info("control: stopped, {} removed", opt_.path);
}

std::string Server::handle_line(std::string_view line) {
  counters_.add(ControlCounter::requests);
  json req;
  try {
    req = json::parse(line);
  } catch (const json::parse_error& e) {
    counters_.add(ControlCounter::malformed);
    counters_.add(ControlCounter::errors);
    return error_line(std::string("malformed JSON: ") + e.what(), nullptr);
  }
  json id = nullptr;
  if (req.is_object() && req.contains("id")) id = req["id"];
  auto bad = [&](const std::string& msg) {
    counters_.add(ControlCounter::malformed);
    counters_.add(ControlCounter::errors);
    return error_line(msg, id);
  };
  if (!req.is_object()) return bad("a request is a JSON object like {\"cmd\": \"help\"}");
  auto cmd_it = req.find("cmd");
  if (cmd_it == req.end() || !cmd_it->is_string()) return bad("request has no \"cmd\" string");
  json args = json::object();
  if (auto a = req.find("args"); a != req.end() && !a->is_null()) {
    if (!a->is_object()) return bad("\"args\" must be an object");
    args = *a;
  }
  const std::string name = cmd_it->get<std::string>();
  auto it = commands_.find(name);
  if (it == commands_.end()) {
    counters_.add(ControlCounter::errors);
    return error_line("unknown command '" + name + "' (try 'help')", id);
  }
  try {
    return ok_line(it->second.handler(args), id);
  } catch (const CommandError& e) {
    counters_.add(ControlCounter::errors);
    return error_line(e.what(), id);
  } catch (const json::exception& e) {
    // A handler reading args of the wrong type.
    counters_.add(ControlCounter::errors);
    return error_line(name + ": bad arguments: " + e.what(), id);
  } catch (const std::exception& e) {
    counters_.add(ControlCounter::errors);
    spdlog::error("control: {} failed: {}", name, e.what());
    return error_line(name + ": internal error: " + e.what(), id);
  } catch (...) {
    counters_.add(ControlCounter::errors);
    spdlog::error("control: {} failed with a non-standard exception", name);
    return error_line(name + ": internal error", id);
  }
}

void Server::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) spdlog::warn("control: accept: {}", errstr(errno));
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    auto refuse = [&](const std::string& msg) {
      std::string line = error_line(msg, nullptr) + "\n";
      // Best effort: the socket buffer of a fresh connection takes it.
      ssize_t n = send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)n;
      close(fd);
    };
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !authorized(cred)) {
      counters_.add(ControlCounter::rejected_peer);
      DROCE_LOG_RATELIMITED(spdlog::level::warn, 5, "control: refused peer pid {} uid {} gid {}", cred.pid, cred.uid,
                            cred.gid);
      refuse("permission denied: uid " + std::to_string(cred.uid) + " may not use this socket");
      continue;
    }
    if (conns_.size() >= opt_.max_clients) {
      counters_.add(ControlCounter::rejected_full);
      refuse("too many control connections (limit " + std::to_string(opt_.max_clients) + ")");
      continue;
    }
    counters_.add(ControlCounter::connections);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->cred = cred;
    c->last_active = now_ms();
    conns_.emplace(fd, std::move(c));
    nclients_.store(conns_.size(), std::memory_order_relaxed);
  }
}

void Server::process_input(Conn& c) {
  while (!c.close_after_flush && c.out.size() - c.out_off < kOutHighWater) {
    size_t nl = c.in.find('\n');
    if (nl == std::string::npos) {
      if (c.in.size() > opt_.max_request) {
        counters_.add(ControlCounter::oversized);
        counters_.add(ControlCounter::errors);
        c.out += error_line("request too large (limit " + std::to_string(opt_.max_request) + " bytes)", nullptr);
        c.out += '\n';
        c.in.clear();
        c.close_after_flush = true;
        return;
      }
      // At EOF an unterminated last line still counts as a request.
      if (c.read_closed && !c.in.empty()) nl = c.in.size();
      else return;
    }
    if (nl > opt_.max_request) {
      counters_.add(ControlCounter::oversized);
      counters_.add(ControlCounter::errors);
      c.out += error_line("request too large (limit " + std::to_string(opt_.max_request) + " bytes)", nullptr);
      c.out += '\n';
      c.in.clear();
      c.close_after_flush = true;
      return;
    }
    std::string_view line(c.in.data(), nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool blank = line.find_first_not_of(" \t") == std::string_view::npos;
    if (!blank) {
      c.out += handle_line(line);
      c.out += '\n';
    }
    c.in.erase(0, std::min(nl + 1, c.in.size()));
    if (c.in.empty() && c.in.capacity() > kKeepCapacity) std::string().swap(c.in);
  }
}

bool Server::on_readable(Conn& c) {
  char buf[kReadChunk];
  // Read at most a little more than one request before answering.
  while (c.in.size() <= opt_.max_request) {
    ssize_t n = recv(c.fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      c.last_active = now_ms();
      continue;
    }
    if (n == 0) {
      c.read_closed = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;  // ECONNRESET and friends
  }
  process_input(c);
  return true;
}

bool Server::on_writable(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      c.last_active = now_ms();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // EPIPE: the client is gone
  }
  c.out.clear();
  c.out_off = 0;
  if (c.out.capacity() > kKeepCapacity) std::string().swap(c.out);
  // Output drained: answer requests that waited for it.
  process_input(c);
  return true;
}

void Server::run() {
  std::vector<pollfd> fds;
  std::vector<Conn*> order;
  for (;;) {
    fds.clear();
    order.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    int64_t now = now_ms();
    int timeout = -1;
    for (auto& [fd, cp] : conns_) {
      Conn& c = *cp;
      short ev = 0;
      bool pending_out = c.out_off < c.out.size();
      if (pending_out) ev |= POLLOUT;
      if (!c.read_closed && !c.close_after_flush && !pending_out) ev |= POLLIN;
      fds.push_back({fd, ev, 0});
      order.push_back(&c);
      int64_t left = c.last_active + opt_.idle_timeout_ms - now;
      int t = static_cast<int>(std::max<int64_t>(0, left));
      if (timeout < 0 || t < timeout) timeout = t;
    }
    int rc = poll(fds.data(), fds.size(), timeout);
    if (rc < 0) {
      if (errno == EINTR) continue;
      spdlog::error("control: poll: {}", errstr(errno));
      return;
    }
    if (fds[0].revents != 0) return;  // stop()
    now = now_ms();
    std::vector<int> to_close;
    for (size_t i = 0; i < order.size(); ++i) {
      Conn& c = *order[i];
      short re = fds[i + 2].revents;
      bool keep = true;
      if (re & POLLNVAL) keep = false;
      try {
        if (keep && (re & (POLLIN | POLLHUP | POLLERR)) && !(fds[i + 2].events & POLLOUT)) keep = on_readable(c);
        if (keep && (re & (POLLOUT | POLLERR))) keep = on_writable(c);
        // New answers produced by reading: try to send them right away.
        if (keep && c.out_off < c.out.size() && !(re & POLLOUT)) keep = on_writable(c);
      } catch (const std::exception& e) {
        // Out of memory or the like, for this connection: drop it, keep serving.
        spdlog::error("control: closing a connection: {}", e.what());
        keep = false;
      }
      bool drained = c.out_off >= c.out.size();
      if (keep && drained && c.close_after_flush) keep = false;
      if (keep && drained && c.read_closed && c.in.empty()) keep = false;
      if (keep && now - c.last_active >= opt_.idle_timeout_ms) {
        counters_.add(ControlCounter::idle_closed);
        keep = false;
      }
      if (!keep) to_close.push_back(c.fd);
    }
    for (int fd : to_close) {
      close(fd);
      conns_.erase(fd);
    }
    nclients_.store(conns_.size(), std::memory_order_relaxed);
    if (fds[1].revents & POLLIN) accept_all();
    size_t held = 0;
    for (const auto& [fd, cp] : conns_) held += cp->in.capacity() + cp->out.capacity();
    buffered_.store(held, std::memory_order_relaxed);
  }
}

}  // namespace droce::control

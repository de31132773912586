#include "log/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <stdexcept>

namespace droce::log {

spdlog::level::level_enum parse_level(std::string_view level) {
  if (!config::valid_log_level(level)) {
    throw std::invalid_argument("log level \"" + std::string(level) +
                                "\" is not one of trace, debug, info, warn, error, critical, off");
  }
  return spdlog::level::from_str(std::string(level));
}

namespace {

constexpr const char* kPattern = "%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%t] %v";

// The default logger writes through a dist_sink so reopen() can swap the file
// sink under the dist_sink's mutex while other threads log.
std::mutex g_mu;
std::shared_ptr<spdlog::sinks::dist_sink_mt> g_dist;
std::string g_file;

std::shared_ptr<spdlog::sinks::sink> file_sink(const std::string& file) {
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
    sink->set_pattern(kPattern);
    return sink;
  } catch (const spdlog::spdlog_ex& e) {
    throw std::runtime_error("log.file: cannot open " + file + ": " + e.what());
  }
}

}  // namespace

void setup(const config::LogConfig& cfg, std::string_view level_override) {
  auto level = parse_level(level_override.empty() ? std::string_view(cfg.level) : level_override);
  std::shared_ptr<spdlog::sinks::sink> sink;
  if (cfg.file.empty()) {
    sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    sink->set_pattern(kPattern);
  } else {
    sink = file_sink(cfg.file);
  }
  auto dist = std::make_shared<spdlog::sinks::dist_sink_mt>(std::vector<std::shared_ptr<spdlog::sinks::sink>>{sink});
  auto logger = std::make_shared<spdlog::logger>("droce", dist);
  logger->set_pattern(kPattern);
  logger->set_level(level);
  // Control-path volume is small (the data path is rate-limited): flush each line.
  logger->flush_on(spdlog::level::trace);
  {
    std::lock_guard lock(g_mu);
    g_dist = dist;
    g_file = cfg.file;
  }
  spdlog::set_default_logger(std::move(logger));
}

bool reopen() {
  std::lock_guard lock(g_mu);
  if (g_dist == nullptr || g_file.empty()) return false;
  g_dist->set_sinks({file_sink(g_file)});
  return true;
}

namespace {

struct LineStream {
  std::string prefix;
  std::function<spdlog::level::level_enum()> level_of_line;
  std::string pending;

  void emit(std::string_view line) {
    while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
    if (line.empty()) return;
    auto level = level_of_line ? level_of_line() : spdlog::level::info;
    spdlog::log(level, "{}{}", prefix, line);
  }
};

ssize_t line_write(void* cookie, const char* buf, size_t size) {
  auto* s = static_cast<LineStream*>(cookie);
  s->pending.append(buf, size);
  size_t start = 0;
  for (size_t nl = s->pending.find('\n'); nl != std::string::npos; nl = s->pending.find('\n', start)) {
    s->emit(std::string_view(s->pending).substr(start, nl - start));
    start = nl + 1;
  }
  s->pending.erase(0, start);
  // A runaway line without a newline is cut rather than kept forever.
  if (s->pending.size() > 64 * 1024) {
    s->emit(s->pending);
    s->pending.clear();
  }
  return static_cast<ssize_t>(size);
}

int line_close(void* cookie) {
  auto* s = static_cast<LineStream*>(cookie);
  s->emit(s->pending);
  delete s;
  return 0;
}

}  // namespace

FILE* open_line_stream(std::string prefix, std::function<spdlog::level::level_enum()> level_of_line) {
  auto* s = new LineStream{std::move(prefix), std::move(level_of_line), {}};
  cookie_io_functions_t fns{};
  fns.write = line_write;
  fns.close = line_close;
  FILE* f = fopencookie(s, "w", fns);
  if (f == nullptr) {
    delete s;
    return nullptr;
  }
  setvbuf(f, nullptr, _IOLBF, 0);
  return f;
}

spdlog::level::level_enum level_from_dpdk(int level) noexcept {
  if (level <= 3) return spdlog::level::critical;  // emergency, alert, critical
  if (level == 4) return spdlog::level::err;
  if (level == 5) return spdlog::level::warn;
  if (level <= 7) return spdlog::level::info;       // notice, info
  return spdlog::level::debug;
}

}  // namespace droce::log

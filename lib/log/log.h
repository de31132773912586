// droce/log: spdlog set up from the [log] config, and rate-limited logging for
// data-path error paths.
//
// On the data path nothing is logged per packet. An error branch that can fire
// per packet (bad header, unknown QP, ...) bumps its counter and may call
//   DROCE_LOG_RATELIMITED(spdlog::level::warn, 5, "port {}: bad ICRC from {}", port, ip);
// which logs at most 5 lines per second for that call site (all threads
// together) and reports how many it suppressed in the next line it lets through.
#pragma once

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#include "config/config.h"

namespace droce::log {

// "trace".."off" -> spdlog level; throws std::invalid_argument naming the value.
spdlog::level::level_enum parse_level(std::string_view level);

// Installs the default logger: a file (appended to) when cfg.file is set, else
// stderr. level_override (from --log-level) wins over cfg.level when not empty.
// Throws std::runtime_error when the file cannot be opened.
void setup(const config::LogConfig& cfg, std::string_view level_override = {});

// Reopens the log file set up by setup() (after logrotate moved it); safe while
// other threads log. False when logging to stderr. Throws std::runtime_error
// when the file cannot be opened (the old one is kept then).
bool reopen();

// A FILE* whose lines go to the default spdlog logger, each prefixed with
// `prefix`: hand it to rte_openlog_stream() so EAL and PMD messages land in the
// daemon's log with its format. level_of_line (called per line, may be empty)
// gives the level, e.g. from rte_log_cur_msg_loglevel() through
// level_from_dpdk(); without it lines log at info. fclose() it when done.
// Returns nullptr (errno set) when the stream cannot be made.
FILE* open_line_stream(std::string prefix, std::function<spdlog::level::level_enum()> level_of_line = {});

// DPDK log levels (RTE_LOG_EMERG = 1 .. RTE_LOG_DEBUG = 8) -> spdlog.
spdlog::level::level_enum level_from_dpdk(int level) noexcept;

inline uint64_t now_ns() noexcept {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// At most `per_second` allowed calls per one-second window. Lock-free; safe from
// any number of threads (counts may be off by a few when threads race on a
// window change, never by more).
class RateLimiter {
 public:
  explicit constexpr RateLimiter(uint32_t per_second) noexcept : per_second_(per_second) {}

  // True when the caller may log now; then *suppressed is the number of calls
  // refused since the previous allowed one.
  bool allow(uint64_t now, uint64_t* suppressed) noexcept {
    uint64_t start = window_start_.load(std::memory_order_relaxed);
    if (now - start >= kWindowNs || !started_.load(std::memory_order_relaxed)) {
      if (window_start_.compare_exchange_strong(start, now, std::memory_order_relaxed)) {
        started_.store(true, std::memory_order_relaxed);
        count_.store(0, std::memory_order_relaxed);
      }
    }
    if (count_.fetch_add(1, std::memory_order_relaxed) < per_second_) {
      *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
      return true;
    }
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  uint64_t pending_suppressed() const noexcept { return suppressed_.load(std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kWindowNs = 1'000'000'000;
  const uint32_t per_second_;
  std::atomic<bool> started_{false};
  std::atomic<uint64_t> window_start_{0};
  std::atomic<uint32_t> count_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace droce::log

#define DROCE_LOG_RATELIMITED(lvl, per_second, ...)                                                     \
  do {                                                                                                  \
    static ::droce::log::RateLimiter droce_rl_(per_second);                                            \
    uint64_t droce_suppressed_ = 0;                                                                     \
    if (::spdlog::should_log(lvl) && droce_rl_.allow(::droce::log::now_ns(), &droce_suppressed_)) {  \
      if (droce_suppressed_ != 0) {                                                                     \
        ::spdlog::log(lvl, "{} ({} more like this suppressed)", ::fmt::format(__VA_ARGS__),           \
                      droce_suppressed_);                                                               \
      } else {                                                                                          \
        ::spdlog::log(lvl, __VA_ARGS__);                                                                \
      }                                                                                                 \
    }                                                                                                   \
  } while (0)

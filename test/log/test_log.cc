// lib/log: level parsing, file logging with levels, the rate limiter.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "log/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

using droce::log::RateLimiter;

namespace {
std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}
void log_bad_packet(int i) { DROCE_LOG_RATELIMITED(spdlog::level::warn, 3, "bad packet {}", i); }
}  // namespace

TEST_CASE("log levels", "[log]") {
  CHECK(droce::log::parse_level("debug") == spdlog::level::debug);
  CHECK(droce::log::parse_level("off") == spdlog::level::off);
  CHECK_THROWS_WITH(droce::log::parse_level("loud"), Catch::Contains("\"loud\" is not one of"));
}

TEST_CASE("rate limiter: N per second, suppressed ones reported", "[log]") {
  RateLimiter rl(3);
  uint64_t sup = 99;
  const uint64_t t0 = 5'000'000'000;
  int allowed = 0;
  for (int i = 0; i < 10; ++i) {
    if (rl.allow(t0 + static_cast<uint64_t>(i) * 1000, &sup)) {
      ++allowed;
      CHECK(sup == 0);
    }
  }
  CHECK(allowed == 3);
  CHECK(rl.pending_suppressed() == 7);
  CHECK_FALSE(rl.allow(t0 + 999'999'999, &sup));  // same window
  REQUIRE(rl.allow(t0 + 1'000'000'000, &sup));      // next window
  CHECK(sup == 8);
  CHECK(rl.allow(t0 + 1'000'000'001, &sup));
  CHECK(sup == 0);
}

TEST_CASE("rate limiter from several threads never exceeds the budget", "[log]") {
  RateLimiter rl(10);
  std::atomic<int> allowed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      uint64_t s;
      for (int i = 0; i < 10000; ++i) allowed += rl.allow(1'000'000'000, &s) ? 1 : 0;
    });
  }
  for (auto& t : ts) t.join();
  CHECK(allowed == 10);
  CHECK(rl.pending_suppressed() == 40000 - 10);
}

TEST_CASE("setup: file sink, level filter, rate-limited call site", "[log]") {
  char dir[] = "/tmp/droce-log-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string file = std::string(dir) + "/d.log";
  droce::config::LogConfig cfg;
  cfg.level = "info";
  cfg.file = file;
  droce::log::setup(cfg, "warn");  // the override wins
  spdlog::info("an info line");
  spdlog::warn("a warn line");
  for (int i = 0; i < 100; ++i) log_bad_packet(i);
  // The call site's one-second window started at or before this instant (the
  // limiter's clock, droce::log::now_ns): wait until that clock is past it.
  const uint64_t window_started_by = droce::log::now_ns();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (droce::log::now_ns() - window_started_by < 1'000'000'000 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(droce::log::now_ns() - window_started_by >= 1'000'000'000);
  log_bad_packet(1000);
  spdlog::default_logger()->flush();
  std::string text = read_file(file);
  CHECK(count(text, "an info line") == 0);
  CHECK(count(text, "a warn line") == 1);
  CHECK(count(text, "bad packet") == 4);
  CHECK(count(text, "bad packet 1000 (97 more like this suppressed)") == 1);
  // Below the level the rate-limited site neither logs nor counts.
  spdlog::set_level(spdlog::level::err);
  log_bad_packet(2000);
  spdlog::default_logger()->flush();
  CHECK(count(read_file(file), "bad packet 2000") == 0);

  droce::config::LogConfig bad;
  bad.file = file + "/x.log";  // under a regular file: cannot exist
  CHECK_THROWS_WITH(droce::log::setup(bad), Catch::Contains("log.file: cannot open"));
  spdlog::set_default_logger(spdlog::stderr_color_mt("test-stderr"));
  unlink(file.c_str());
  rmdir(dir);
}

TEST_CASE("line stream: DPDK-style messages become log lines", "[log]") {
  char dir[] = "/tmp/droce-log-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string file = std::string(dir) + "/d.log";
  droce::config::LogConfig cfg;
  cfg.level = "debug";
  cfg.file = file;
  droce::log::setup(cfg);
  int level = 8;  // what rte_log_cur_msg_loglevel() would say: RTE_LOG_DEBUG
  FILE* f = droce::log::open_line_stream("dpdk: ", [&] { return droce::log::level_from_dpdk(level); });
  REQUIRE(f != nullptr);
  std::fprintf(f, "EAL: Detected CPU lcores: %d\n", 2);
  level = 4;  // RTE_LOG_ERR
  std::fprintf(f, "EAL: Cannot open %s", "/dev/vfio");  // a line written in two parts
  std::fflush(f);
  std::fprintf(f, " (ignored)\nEAL: partial at close");
  std::fflush(f);
  spdlog::default_logger()->flush();
  std::string text = read_file(file);
  CHECK(count(text, "dpdk: EAL: Detected CPU lcores: 2") == 1);
  CHECK(count(text, "dpdk: EAL: Cannot open /dev/vfio (ignored)") == 1);
  // Each line at the level the callback gave when it was completed.
  auto line_of = [&](const std::string& needle) {
    size_t at = text.find(needle);
    REQUIRE(at != std::string::npos);
    size_t begin = text.rfind('\n', at);
    return text.substr(begin == std::string::npos ? 0 : begin + 1, at - (begin == std::string::npos ? 0 : begin + 1));
  };
  CHECK_THAT(line_of("EAL: Detected"), Catch::Contains(" debug "));
  CHECK_THAT(line_of("EAL: Cannot open"), Catch::Contains(" error "));
  CHECK(count(text, "partial at close") == 0);
  std::fclose(f);
  spdlog::default_logger()->flush();
  CHECK(count(read_file(file), "dpdk: EAL: partial at close") == 1);
  CHECK(droce::log::level_from_dpdk(8) == spdlog::level::debug);
  CHECK(droce::log::level_from_dpdk(1) == spdlog::level::critical);
  spdlog::set_default_logger(spdlog::stderr_color_mt("test-stderr-2"));
  unlink(file.c_str());
  rmdir(dir);
}

TEST_CASE("reopen: after the file is moved away, a new one is written", "[log]") {
  char dir[] = "/tmp/droce-log-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string file = std::string(dir) + "/d.log";
  droce::config::LogConfig cfg;
  cfg.file = file;
  droce::log::setup(cfg);
  // Another thread keeps logging through the swap.
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop.load(); ++i) spdlog::info("background line {}", i);
  });
  spdlog::info("before rotation");
  REQUIRE(std::rename(file.c_str(), (file + ".1").c_str()) == 0);
  spdlog::info("after rename, before reopen");
  CHECK(droce::log::reopen());
  spdlog::info("after reopen");
  stop = true;
  writer.join();
  spdlog::default_logger()->flush();
  std::string old_text = read_file(file + ".1"), new_text = read_file(file);
  CHECK(count(old_text, "before rotation") == 1);
  CHECK(count(old_text, "after rename, before reopen") == 1);
  CHECK(count(new_text, "after reopen") == 1);
  CHECK(count(new_text, "before rotation") == 0);
  CHECK_THAT(new_text, Catch::Contains(" info  ["));  // same format in the new file

  droce::config::LogConfig to_stderr;
  droce::log::setup(to_stderr);
  CHECK_FALSE(droce::log::reopen());
  spdlog::set_default_logger(spdlog::stderr_color_mt("test-stderr-3"));
  std::system((std::string("rm -rf ") + dir).c_str());
}

#include "log/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <stdexcept>

namespace droce::log {

spdlog::level::level_enum parse_level(std::string_view level) {
  if (!config::valid_log_level(level)) {
    throw std::invalid_argument("log level \"" + std::string(level) +
                                "\" is not one of trace, debug, info, warn, error, critical, off");
  }
  return spdlog::level::from_str(std::string(level));
}

void setup(const config::LogConfig& cfg, std::string_view level_override) {
  auto level = parse_level(level_override.empty() ? std::string_view(cfg.level) : level_override);
  std::shared_ptr<spdlog::logger> logger;
  if (cfg.file.empty()) {
    logger = std::make_shared<spdlog::logger>("droce", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  } else {
    try {
      logger = std::make_shared<spdlog::logger>(
          "droce", std::make_shared<spdlog::sinks::basic_file_sink_mt>(cfg.file, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      throw std::runtime_error("log.file: cannot open " + cfg.file + ": " + e.what());
    }
  }
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ [%t] %v");
  logger->set_level(level);
  // Control-path volume is small (the data path is rate-limited): flush each line.
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace droce::log

#include "granary/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace granary {
namespace {

std::mutex g_mu;  // guards creation of loggers and the default level

spdlog::level::level_enum& DefaultLevel() {
  static spdlog::level::level_enum level = [] {
    const char* env = std::getenv("GRANARY_LOG_LEVEL");
    if (env == nullptr) return spdlog::level::info;
    auto parsed = ParseLogLevel(env);
    return parsed.ok() ? *parsed : spdlog::level::info;
  }();
  return level;
}

}  // namespace

Result<spdlog::level::level_enum> ParseLogLevel(std::string_view name) {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off},
  };
  for (const auto& [n, level] : kLevels) {
    if (n == name) return level;
  }
  return Status::InvalidArgument("unknown log level '" + std::string(name) +
                                 "'; use one of trace, debug, info, warn, error, off");
}

std::shared_ptr<spdlog::logger> GetLogger(const std::string& component) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(component)) return existing;
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  logger->set_level(DefaultLevel());
  return logger;
}

void SetLogLevel(spdlog::level::level_enum level) {
  std::lock_guard<std::mutex> lock(g_mu);
  DefaultLevel() = level;
  spdlog::apply_all([level](const std::shared_ptr<spdlog::logger>& l) { l->set_level(level); });
}

}  // namespace granary

#pragma once

// Structured logging: one spdlog logger per component ("core", "store",
// "cachenode", ...), all writing to stderr with the same pattern. The level
// comes from GRANARY_LOG_LEVEL (trace, debug, info, warn, error, off; default
// info) unless SetLogLevel is called. Never log per sample at info.
//
// Thread safety: GetLogger and SetLogLevel may be called from any thread; the
// loggers are spdlog's thread-safe (_mt) sinks.

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>

#include "granary/core/status.h"

namespace granary {

std::shared_ptr<spdlog::logger> GetLogger(const std::string& component);

// Parses "info", "debug", ... ; an unknown name is kInvalidArgument.
Result<spdlog::level::level_enum> ParseLogLevel(std::string_view name);

// Applies to every existing and future logger.
void SetLogLevel(spdlog::level::level_enum level);

}  // namespace granary

#include "cache_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "granary/core/config.h"
#include "granary/core/names.h"

namespace granary::cli {
namespace {

// A whole number in [lo, hi], or an error naming `option`.
Result<int64_t> WholeNumber(const std::string& text, const char* option, int64_t lo, int64_t hi,
                            const std::string& hint) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    return Status::InvalidArgument(std::string(option) + " " + Quoted(text) +
                                   " is not a whole number from " + std::to_string(lo) + " to " +
                                   std::to_string(hi) + "; " + hint);
  }
  return static_cast<int64_t>(v);
}

// "0.4" or "40%" as whole percent 0..100.
Result<uint32_t> Percent(const std::string& text) {
  const std::string hint = "write a fraction from 0 to 1 (0.4) or a percentage (40%)";
  const bool percent = !text.empty() && text.back() == '%';
  const std::string number = percent ? text.substr(0, text.size() - 1) : text;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end == number.c_str() || *end != '\0' || errno == ERANGE ||
      !std::isfinite(v)) {
    return Status::InvalidArgument("--min-resident " + Quoted(text) + " is not a number; " + hint);
  }
  const double pct = percent ? v : v * 100.0;
  if (pct < 0 || pct > 100) {
    return Status::InvalidArgument("--min-resident " + Quoted(text) + " is outside 0..100%; " +
                                   hint);
  }
  if (std::fabs(pct - std::round(pct)) > 1e-9) {
    return Status::InvalidArgument("--min-resident " + Quoted(text) +
                                   " is not a whole percentage; round it (e.g. 40%)");
  }
  return static_cast<uint32_t>(std::lround(pct));
}

std::string DurationWords(uint64_t seconds) {
  if (seconds % 86400 == 0) return std::to_string(seconds / 86400) + "d";
  if (seconds % 3600 == 0) return std::to_string(seconds / 3600) + "h";
  if (seconds % 60 == 0) return std::to_string(seconds / 60) + "m";
  return std::to_string(seconds) + "s";
}

}  // namespace

void CacheOptions::Add(CLI::App& command) {
  command.add_option(
      "--priority", priority,
      "Cache priority, -1000..1000 (default 0): a full pool shrinks lower ones first");
  command.add_flag("--pin", pin, "Never shrink it for another dataset");
  command.add_flag("--no-pin", no_pin, "Undo --pin");
  command.add_option("--ttl", ttl,
                     "Drop its cached chunks once not read for this long (e.g. 12h; 0: never)");
  command.add_option("--min-resident", min_resident,
                     "Others never shrink it below this part of its share (0.4 or 40%)");
  command.add_option("--max-resident", max_resident,
                     "Keep at most this many bytes of it in the pool (e.g. 500GiB; none: no "
                     "limit); the rest is streamed from the source");
}

bool CacheOptions::any() const {
  return !priority.empty() || pin || no_pin || !ttl.empty() || !min_resident.empty() ||
         !max_resident.empty();
}

Result<DatasetCacheSpec> CacheOptions::Apply(DatasetCacheSpec base) const {
  if (pin && no_pin) return Status::InvalidArgument("--pin and --no-pin: choose one");
  if (!priority.empty()) {
    GRANARY_ASSIGN_OR_RETURN(
        int64_t p, WholeNumber(priority, "--priority", kMinCachePriority, kMaxCachePriority,
                               "higher keeps its chunks longer (default 0)"));
    base.priority = static_cast<int32_t>(p);
  }
  if (pin) base.pinned = true;
  if (no_pin) base.pinned = false;
  if (!ttl.empty()) {
    if (ttl == "0" || ttl == "none") {
      base.ttl_seconds = 0;
    } else {
      Result<std::chrono::milliseconds> d = ParseDuration(ttl);
      if (!d.ok()) {
        return Status::InvalidArgument("--ttl " + Quoted(ttl) + ": " + d.status().message() +
                                       " (0 or none: no TTL)");
      }
      if (d->count() < 1000 || d->count() % 1000 != 0) {
        return Status::InvalidArgument("--ttl " + Quoted(ttl) +
                                       " is not a whole number of seconds, at least 1s");
      }
      const auto seconds = static_cast<uint64_t>(d->count() / 1000);
      if (seconds > kMaxCacheTtlSeconds) {
        return Status::InvalidArgument("--ttl " + Quoted(ttl) + " is more than ten years");
      }
      base.ttl_seconds = seconds;
    }
  }
  if (!min_resident.empty()) {
    GRANARY_ASSIGN_OR_RETURN(base.min_resident_percent, Percent(min_resident));
  }
  if (!max_resident.empty()) {
    if (max_resident == "none") {
      base.max_resident_bytes.reset();
    } else {
      Result<ByteSize> size = ParseByteSize(max_resident);
      if (!size.ok()) {
        return Status::InvalidArgument("--max-resident " + Quoted(max_resident) + ": " +
                                       size.status().message() + " (none: no limit)");
      }
      base.max_resident_bytes = size->bytes;
    }
  }
  GRANARY_RETURN_IF_ERROR(ValidateDatasetCacheSpec(base));
  return base;
}

std::string CacheText(const DatasetCacheSpec& cache) {
  std::string text = "priority " + std::to_string(cache.priority);
  if (cache.pinned) text += "; pinned";
  if (cache.ttl_seconds > 0) text += "; TTL " + DurationWords(cache.ttl_seconds);
  if (cache.min_resident_percent > 0) {
    text += "; keeps at least " + std::to_string(cache.min_resident_percent) + "%";
  }
  if (cache.max_resident_bytes.has_value()) {
    text += "; at most " + HumanBytes(*cache.max_resident_bytes);
  }
  return text;
}

}  // namespace granary::cli

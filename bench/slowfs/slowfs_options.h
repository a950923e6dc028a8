#pragma once

// SlowFsOptions: what granary-slowfs (the benchmark's slow source, a read-only
// FUSE pass-through) is asked to do: which directory it serves where, and the
// price it charges per operation (latency, bandwidth, concurrency). Profiles
// name the prices of the storage kinds BENCHMARK.md emulates; flags given
// after --profile override its values.
//
// Callers: bench/slowfs/main.cc parses flags into it and calls
// ValidateSlowFsOptions before mounting; tests call both directly.
// Thread safety: plain values; the functions are pure (Validate stats paths).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/status.h"

namespace granary {

// The prices of one kind of storage. bandwidth_mb_s 0 and max_concurrency 0
// mean unlimited.
struct SlowFsProfile {
  std::string name;
  double latency_ms = 0;         // per metadata operation and per read
  double bandwidth_mb_s = 0;     // MB = 10^6 bytes, over all reads together
  uint32_t max_concurrency = 0;  // operations in flight; the rest wait
};

inline constexpr double kMaxSlowFsLatencyMs = 60'000;
inline constexpr double kMaxSlowFsBandwidthMbS = 1'000'000;
inline constexpr uint32_t kMaxSlowFsConcurrency = 4096;

// nfs: 1 ms, 200 MB/s, 16 in flight; object: 20 ms, 100 MB/s, 32 in flight;
// none: no latency, no limits (the pass-through's own cost only).
const std::vector<SlowFsProfile>& SlowFsProfiles();
// kInvalidArgument naming the known profiles when `name` is not one.
Result<SlowFsProfile> FindSlowFsProfile(std::string_view name);

struct SlowFsOptions {
  std::string source;      // the directory served (made absolute by Validate)
  std::string mountpoint;  // an existing empty directory (made absolute by Validate)
  SlowFsProfile profile;   // after overrides
  std::string stats_file;  // if set, the final counters are written there as JSON at exit
  bool debug = false;      // libfuse's -d
};

// Checks everything that can be checked before mounting: latency, bandwidth
// and concurrency in range; source an existing directory; mountpoint an
// existing directory that is neither the source nor inside it (a pass-through
// of a tree that holds its own mount would recurse). Replaces both paths by
// their real absolute paths. kInvalidArgument / kNotFound saying what to fix.
Status ValidateSlowFsOptions(SlowFsOptions& options);

}  // namespace granary

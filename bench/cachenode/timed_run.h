#pragma once

// The load harness of cachenode_bench's (b) benches: worker threads reading
// batches of random samples for a fixed time, the same sequences for every
// bench given the same seed, so serving and the local reads are compared on
// equal work.
//
// Thread safety: TimedRun is called from the main thread and calls each fn
// from its own worker thread.

#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "bench_setup.h"

namespace granary::cachenode_bench {

inline constexpr int kWarmupBatches = 2;

// What a timed run did, summed over its worker threads.
struct LoadFigures {
  uint32_t workers = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double gb_s() const { return PerSecond(bytes, seconds) / 1e9; }
  // GB per CPU-second of this process (server and clients, or the local
  // readers): what other load on the machine does not change much.
  double gb_per_cpu_s() const { return PerSecond(bytes, cpu_seconds) / 1e9; }
};

// The figures as JSON; `batch_name` names a batch ("reads", "batches").
Json ToJson(const LoadFigures& r, std::string_view batch_name);

// Reads one batch of samples; adds the bytes it got to *bytes.
using BatchFn = std::function<Status(std::span<const SampleId> ids, uint64_t* bytes)>;

// Runs fns.size() threads, each calling its fn on batches of `batch` sample
// ids drawn uniformly from [0, samples) by a generator seeded with seed + its
// index (so two runs with the same seed read the same sequences), for
// `seconds` after kWarmupBatches untimed batches each. `on_start` (if any)
// runs once every warm-up is done, just before the timed part starts.
Result<LoadFigures> TimedRun(std::vector<BatchFn>& fns, uint32_t batch, uint64_t samples,
                             double seconds, uint64_t seed,
                             const std::function<void()>& on_start = {});

// The better of two timed runs (by throughput).
void KeepBest(const LoadFigures& run, std::optional<LoadFigures>* best);

}  // namespace granary::cachenode_bench

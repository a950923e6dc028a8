#pragma once

// The sidecar's Prometheus metrics (docs/sidecar.md, "Metrics"): declared once
// with MetricRegistrar, counters bumped where things happen, gauges and the
// fetcher's counters refreshed from snapshots by the refresh loop.
//
// Thread safety: the metric pointers may be used from any thread (prometheus-cpp
// is thread-safe); Refresh is called by one thread with its own Last.

#include <array>
#include <cstdint>

#include "granary/core/status.h"
#include "granary/daemon/observability.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/posix/posix_view.h"
#include "granary/sidecar/sample_cache.h"

namespace granary::sidecar {

struct SidecarMetrics {
  // Requests by type ("hello", "get", ...), unknown types under "other".
  prometheus::Counter* requests[12] = {};
  prometheus::Counter* errors_framing = nullptr;
  prometheus::Counter* errors_request = nullptr;
  prometheus::Counter* sessions_opened = nullptr;
  prometheus::Counter* rejected_clients_full = nullptr;  // {reason="max_clients"}
  prometheus::Counter* rejected_clients_uid = nullptr;   // {reason="per_uid"}
  prometheus::Counter* idle_closes = nullptr;
  prometheus::Counter* plans = nullptr;
  prometheus::Counter* chunk_files_handed = nullptr;    // {outcome="handed"}
  prometheus::Counter* chunk_files_declined = nullptr;  // {outcome="declined"}
  prometheus::Counter* chunk_files_refused = nullptr;   // {outcome="refused"}
  prometheus::Counter* store_errors = nullptr;
  // Samples handed to clients, by how they got into the arena.
  prometheus::Counter* served_prefetch_samples = nullptr;
  prometheus::Counter* served_prefetch_bytes = nullptr;
  prometheus::Counter* served_on_demand_samples = nullptr;
  prometheus::Counter* served_on_demand_bytes = nullptr;
  prometheus::Counter* failed_samples = nullptr;
  prometheus::Counter* prefetched_samples = nullptr;
  prometheus::Counter* prefetched_bytes = nullptr;
  prometheus::Counter* prefetch_failures = nullptr;
  // Fetched, by where from (the fetcher's counters).
  prometheus::Counter* fetched_samples[kSampleSources] = {};
  prometheus::Counter* fetched_bytes[kSampleSources] = {};
  prometheus::Counter* node_failures = nullptr;
  // transport libfabric: whether the provider is usable here (0: TCP only),
  // connections over it, and connections to nodes offering none.
  prometheus::Gauge* fabric_available = nullptr;
  prometheus::Counter* fabric_connects = nullptr;
  prometheus::Counter* fabric_fallbacks = nullptr;
  prometheus::Counter* local_file_pieces = nullptr;
  prometheus::Counter* local_file_opens = nullptr;
  prometheus::Counter* local_file_declined = nullptr;
  prometheus::Counter* evictions = nullptr;
  prometheus::Counter* unknown_releases = nullptr;
  prometheus::Gauge* sessions = nullptr;
  prometheus::Gauge* pins = nullptr;
  prometheus::Gauge* pinned_bytes = nullptr;
  prometheus::Gauge* window_samples = nullptr;
  prometheus::Gauge* window_bytes = nullptr;
  prometheus::Gauge* arena_bytes = nullptr;
  prometheus::Gauge* arena_used_bytes = nullptr;
  prometheus::Gauge* cursors = nullptr;
  prometheus::Histogram* client_wait = nullptr;
  // FUSE requests to the `mounts` views, by operation (posix::FuseOpName).
  prometheus::Counter* posix_requests[posix::kFuseOpCount] = {};

  static Result<SidecarMetrics> Declare(prometheus::Registry& registry);

  void Request(uint16_t type);
  void Served(bool prefetched, uint64_t bytes);

  // What Refresh saw last time (counters advance by the difference).
  struct Last {
    SampleFetcherCounters fetcher;
    uint64_t evictions = 0;
    uint64_t unknown_releases = 0;
    std::array<uint64_t, posix::kFuseOpCount> posix_requests{};
  };
  void Refresh(const SampleCacheStats& caches, const SampleFetcherCounters& fetcher,
               size_t sessions_now, Last* last);
  // `view_requests`: the views' Counters::requests, summed.
  void RefreshPosix(const std::array<uint64_t, posix::kFuseOpCount>& view_requests, Last* last);
};

}  // namespace granary::sidecar

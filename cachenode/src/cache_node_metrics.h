#pragma once

// The cache node's Prometheus metrics: declared once (CacheNodeMetrics::
// Declare, under the naming rules of daemon/observability.h), and refreshed
// from the components' snapshots (ChunkStore::Stats, Server::Counters,
// ChunkReadService::Counters, FabricServer::Counters, Stager::Progress,
// Source::Counters) every
// kMetricsRefreshInterval by the daemon's metrics thread. The components keep
// plain atomics on their hot paths; this is the only place that turns them
// into prometheus-cpp metrics. docs/cachenode.md ("Metrics") lists them.
//
// Counters are advanced by the difference from the last snapshot (a *State
// struct remembers it), so a component that restarts from zero (a dataset's
// new Source after a re-activation) continues the series instead of going
// backwards.
//
// Who calls it: cache_node.cc only. Thread safety: Declare and ForDataset on
// one thread at a time; each Update* with its own State from one thread at a
// time (the metric objects themselves are thread-safe).

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/fabric_server.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/daemon/observability.h"
#include "granary/source/source.h"

namespace granary {

inline constexpr std::chrono::milliseconds kMetricsRefreshInterval{500};
// Classes of granary_cachenode_request_errors_total (framing ... send).
inline constexpr size_t kRequestErrorClassCount = 8;
// Results of granary_cachenode_snapshots_total, in this order.
inline constexpr std::array<std::string_view, 5> kSnapshotResults = {
    "ok",          // manifest stored, dataset Staging
    "failed",      // the walk failed, dataset Failed
    "superseded",  // the record changed during the walk: result dropped
    "abandoned",   // the node stopped during the walk: claim released
    "error",       // the metadata store failed (claim, manifest or final write)
};

// The metrics of one dataset (label dataset="<name>").
struct DatasetMetrics {
  prometheus::Counter* source_opens = nullptr;
  prometheus::Counter* source_read_calls = nullptr;
  prometheus::Counter* source_read_bytes = nullptr;
  prometheus::Counter* staged_samples = nullptr;
  prometheus::Counter* on_demand_fetches = nullptr;
  std::array<prometheus::Counter*, kSourceErrorKinds> source_errors{};  // by SourceErrorKind
  prometheus::Gauge* staged_bytes = nullptr;
  prometheus::Gauge* staged_chunks = nullptr;
  prometheus::Gauge* owned_bytes = nullptr;
  prometheus::Gauge* owned_chunks = nullptr;
  prometheus::Gauge* queue_chunks = nullptr;
  prometheus::Gauge* sample_errors = nullptr;
  prometheus::Gauge* staging_state = nullptr;
  // Under the cache policy (cache_budget.h).
  prometheus::Gauge* kept_bytes = nullptr;
  prometheus::Gauge* budget_bytes = nullptr;
  prometheus::Counter* streamed_bytes = nullptr;
  prometheus::Counter* streamed_ahead_bytes = nullptr;
  prometheus::Counter* reads_from_store = nullptr;
  prometheus::Counter* reads_from_source = nullptr;
  // By reason, in the order of kEvictionReasons.
  std::array<prometheus::Counter*, 4> evicted_bytes{};
  std::array<prometheus::Counter*, 4> evicted_chunks{};
};

// The reason label of granary_cachenode_evicted_*_total, indexed as
// DatasetMetrics::evicted_*: CacheCutName of kLimit, kTtl, kPriority, kFairShare.
inline constexpr std::array<std::string_view, 4> kEvictionReasons = {"limit", "ttl", "priority",
                                                                     "fair_share"};

// What the counters of one dataset were at the last refresh.
struct DatasetMetricState {
  uint64_t opens = 0;
  uint64_t read_calls = 0;
  uint64_t bytes = 0;
  uint64_t completed = 0;
  uint64_t on_demand = 0;
  uint64_t streamed = 0;
  uint64_t streamed_ahead = 0;
  uint64_t from_store = 0;
  uint64_t from_source = 0;
  std::array<uint64_t, kSourceErrorKinds> errors{};
};

// What the node-wide counters were at the last refresh.
struct NodeMetricState {
  ServerCounters server;
  FabricCounters fabric;
  ChunkReadServiceCounters reads;
  uint64_t creates_refused = 0;
  uint64_t creates_no_space = 0;
  uint64_t written = 0;
};

struct CacheNodeMetrics {
  MetricFamily<prometheus::Counter> source_opens;
  MetricFamily<prometheus::Counter> source_read_calls;
  MetricFamily<prometheus::Counter> source_read_bytes;
  MetricFamily<prometheus::Counter> source_errors;  // dataset, kind
  MetricFamily<prometheus::Counter> staged_samples;
  MetricFamily<prometheus::Counter> on_demand_fetches;
  MetricFamily<prometheus::Gauge> staged_bytes;
  MetricFamily<prometheus::Gauge> staged_chunks;
  MetricFamily<prometheus::Gauge> owned_bytes;
  MetricFamily<prometheus::Gauge> owned_chunks;
  MetricFamily<prometheus::Gauge> queue_chunks;
  MetricFamily<prometheus::Gauge> sample_errors;
  MetricFamily<prometheus::Gauge> staging_state;
  MetricFamily<prometheus::Gauge> kept_bytes;
  MetricFamily<prometheus::Gauge> budget_bytes;
  MetricFamily<prometheus::Counter> streamed_bytes;
  MetricFamily<prometheus::Counter> streamed_ahead_bytes;
  MetricFamily<prometheus::Counter> dataset_reads;   // dataset, from
  MetricFamily<prometheus::Counter> evicted_bytes;   // dataset, reason
  MetricFamily<prometheus::Counter> evicted_chunks;  // dataset, reason

  prometheus::Counter* requests_hello = nullptr;
  prometheus::Counter* requests_ping = nullptr;
  prometheus::Counter* requests_stat = nullptr;
  prometheus::Counter* requests_read = nullptr;
  // request_errors_total by class, in the order of kRequestErrorClasses
  // (cache_node_metrics.cc).
  std::array<prometheus::Counter*, kRequestErrorClassCount> request_errors{};
  prometheus::Counter* served_items = nullptr;
  prometheus::Counter* served_item_errors = nullptr;
  prometheus::Counter* served_bytes = nullptr;
  prometheus::Counter* sendfile_bytes = nullptr;
  prometheus::Counter* received_bytes = nullptr;
  prometheus::Counter* connections_accepted = nullptr;
  prometheus::Counter* connections_rejected = nullptr;
  prometheus::Gauge* connections = nullptr;
  prometheus::Gauge* buffered_bytes = nullptr;
  prometheus::Gauge* reply_budget_bytes = nullptr;
  prometheus::Gauge* reply_budget_used_bytes = nullptr;
  prometheus::Counter* reply_budget_waits = nullptr;
  prometheus::Counter* connection_reply_waits = nullptr;
  prometheus::Counter* reply_stall_closes = nullptr;
  prometheus::Counter* auth_granted = nullptr;
  prometheus::Counter* auth_refused = nullptr;
  prometheus::Histogram* request_duration = nullptr;

  prometheus::Counter* items_from_disk = nullptr;
  prometheus::Counter* items_on_demand = nullptr;
  prometheus::Counter* checksum_failures = nullptr;
  prometheus::Counter* restaged_segments = nullptr;
  prometheus::Counter* store_read_errors = nullptr;

  prometheus::Gauge* capacity = nullptr;
  prometheus::Gauge* used = nullptr;
  prometheus::Gauge* filesystem_available = nullptr;
  prometheus::Gauge* chunks = nullptr;
  prometheus::Counter* store_written_bytes = nullptr;
  prometheus::Counter* creates_refused = nullptr;
  prometheus::Counter* creates_no_space = nullptr;
  prometheus::Gauge* datasets = nullptr;
  prometheus::Counter* store_errors = nullptr;

  // The fabric front end (fabric_listen; FabricServer::Counters).
  prometheus::Gauge* fabric_available = nullptr;
  prometheus::Counter* fabric_connections_accepted = nullptr;
  prometheus::Counter* fabric_connections_rejected = nullptr;
  prometheus::Gauge* fabric_connections = nullptr;
  prometheus::Counter* fabric_requests = nullptr;
  prometheus::Counter* fabric_rma_bytes = nullptr;
  prometheus::Counter* fabric_errors = nullptr;

  // Snapshots walked by this node, by result (kSnapshotResults), and how long
  // each walk took. Updated by the snapshot thread directly.
  std::array<prometheus::Counter*, kSnapshotResults.size()> snapshots{};
  prometheus::Histogram* snapshot_seconds = nullptr;

  static Result<CacheNodeMetrics> Declare(prometheus::Registry& registry);
  // The metrics of one dataset, created on first use.
  Result<DatasetMetrics> ForDataset(const std::string& dataset) const;
};

void UpdateNodeMetrics(const CacheNodeMetrics& m, NodeMetricState& last,
                       const ChunkStoreStats& store, const ServerCounters& server,
                       const ChunkReadServiceCounters& reads);
// The fabric front end's counters, or nullopt when it does not serve (off, or
// fallen back to TCP): fabric_available 0.
void UpdateFabricMetrics(const CacheNodeMetrics& m, NodeMetricState& last,
                         const std::optional<FabricCounters>& fabric);
// Zeroes the gauges of a dataset this node no longer stages (the counters
// keep their totals).
void ClearDatasetGauges(const DatasetMetrics& m);
void UpdateDatasetMetrics(const DatasetMetrics& m, DatasetMetricState& last,
                          const StagerProgress& progress, const SourceCounters& source);

}  // namespace granary

#include "cache_node_metrics.h"

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace granary {
namespace {

// Advances `counter` by how much `now` grew since *last; a value that went
// backwards (the component restarted) only resets *last.
void Advance(prometheus::Counter* counter, uint64_t now, uint64_t* last) {
  if (now > *last) counter->Increment(static_cast<double>(now - *last));
  *last = now;
}

// The server's error counters by the `class` label of request_errors_total.
constexpr std::array<std::pair<const char*, uint64_t ServerCounters::*>, kRequestErrorClassCount>
    kRequestErrorClasses = {{
        {"framing", &ServerCounters::framing_errors_total},
        {"truncated", &ServerCounters::truncated_frames_total},
        {"message", &ServerCounters::message_errors_total},
        {"policy", &ServerCounters::policy_errors_total},
        {"service", &ServerCounters::service_errors_total},
        {"internal", &ServerCounters::internal_errors_total},
        {"timeout", &ServerCounters::timeouts_total},
        {"send", &ServerCounters::send_errors_total},
    }};

void SetGauge(prometheus::Gauge* gauge, uint64_t value) { gauge->Set(static_cast<double>(value)); }

}  // namespace

Result<CacheNodeMetrics> CacheNodeMetrics::Declare(prometheus::Registry& registry) {
  MetricRegistrar r(registry, "cachenode");
  CacheNodeMetrics m;
  const std::vector<std::string> dataset = {"dataset"};

  // Staging, per dataset.
  GRANARY_ASSIGN_OR_RETURN(m.source_opens,
                           r.AddCounterFamily("granary_cachenode_source_opens_total",
                                              "Files opened on the dataset's source.", dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.source_read_calls,
      r.AddCounterFamily("granary_cachenode_source_read_calls_total",
                         "Read calls issued to the dataset's source.", dataset));
  GRANARY_ASSIGN_OR_RETURN(m.source_read_bytes,
                           r.AddCounterFamily("granary_cachenode_source_read_bytes_total",
                                              "Bytes read from the dataset's source.", dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.source_errors,
      r.AddCounterFamily("granary_cachenode_source_errors_total",
                         "Failed source reads, by kind (changed, not_found, permission_denied, "
                         "unsafe_path, identity, invalid_request, io).",
                         {"dataset", "kind"}));
  GRANARY_ASSIGN_OR_RETURN(
      m.staged_samples,
      r.AddCounterFamily("granary_cachenode_staged_samples_total",
                         "Samples (pieces of samples larger than a chunk count one each) read "
                         "whole from the source, for bulk staging or on demand.",
                         dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.on_demand_fetches,
      r.AddCounterFamily("granary_cachenode_on_demand_fetches_total",
                         "Segments read from the source for a reader, ahead of bulk staging.",
                         dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.staged_bytes, r.AddGaugeFamily("granary_cachenode_staged_bytes",
                                       "Payload bytes of the owned chunks staged here.", dataset));
  GRANARY_ASSIGN_OR_RETURN(m.staged_chunks,
                           r.AddGaugeFamily("granary_cachenode_staged_chunks",
                                            "Owned chunks with nothing left to stage.", dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.owned_bytes, r.AddGaugeFamily("granary_cachenode_owned_bytes",
                                      "Payload bytes of the chunks this node owns.", dataset));
  GRANARY_ASSIGN_OR_RETURN(m.owned_chunks,
                           r.AddGaugeFamily("granary_cachenode_owned_chunks",
                                            "Chunks placement gives this node.", dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.queue_chunks,
      r.AddGaugeFamily("granary_cachenode_staging_queue_chunks",
                       "Owned chunks neither staged nor being staged (the staging queue).",
                       dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.sample_errors,
      r.AddGaugeFamily("granary_cachenode_sample_errors",
                       "Samples that cannot be staged (changed since the snapshot, gone, "
                       "permission denied, ...).",
                       dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.staging_state,
      r.AddGaugeFamily("granary_cachenode_staging_state",
                       "Staging state: 0 idle, 1 staging, 2 complete, 3 capacity (does not "
                       "fit), 4 disk full (paused), 5 stopped.",
                       dataset));

  // The cache policy (docs/cachenode.md, "When the cache is full").
  GRANARY_ASSIGN_OR_RETURN(
      m.kept_bytes,
      r.AddGaugeFamily("granary_cachenode_kept_bytes",
                       "Payload bytes of the owned chunks this node keeps under the dataset's "
                       "cache budget (the rest is streamed from the source when read).",
                       dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.budget_bytes,
      r.AddGaugeFamily("granary_cachenode_budget_bytes",
                       "Chunk-file bytes the cache policy grants the dataset on this node.",
                       dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.streamed_bytes,
      r.AddCounterFamily("granary_cachenode_streamed_bytes_total",
                         "Bytes read from the source for readers and not kept (outside the "
                         "dataset's budget).",
                         dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.streamed_ahead_bytes,
      r.AddCounterFamily("granary_cachenode_streamed_ahead_bytes_total",
                         "Of the streamed bytes, those read ahead of the reader's item (a READ's "
                         "missing items read together), not on demand.",
                         dataset));
  GRANARY_ASSIGN_OR_RETURN(
      m.dataset_reads,
      r.AddCounterFamily("granary_cachenode_dataset_reads_total",
                         "Items read, by where they came from: store (a hit) or source.",
                         {"dataset", "from"}));
  GRANARY_ASSIGN_OR_RETURN(
      m.evicted_bytes,
      r.AddCounterFamily("granary_cachenode_evicted_bytes_total",
                         "Chunk-file bytes dropped to fit the cache policy, by reason (limit, "
                         "ttl, priority, fair_share).",
                         {"dataset", "reason"}));
  GRANARY_ASSIGN_OR_RETURN(m.evicted_chunks,
                           r.AddCounterFamily("granary_cachenode_evicted_chunks_total",
                                              "Chunks dropped to fit the cache policy, by reason.",
                                              {"dataset", "reason"}));

  // Serving.
  GRANARY_ASSIGN_OR_RETURN(auto requests,
                           r.AddCounterFamily("granary_cachenode_requests_total",
                                              "Protocol requests answered, by type.", {"type"}));
  GRANARY_ASSIGN_OR_RETURN(m.requests_hello, requests.WithLabels({"hello"}));
  GRANARY_ASSIGN_OR_RETURN(m.requests_ping, requests.WithLabels({"ping"}));
  GRANARY_ASSIGN_OR_RETURN(m.requests_stat, requests.WithLabels({"stat"}));
  GRANARY_ASSIGN_OR_RETURN(m.requests_read, requests.WithLabels({"read"}));
  GRANARY_ASSIGN_OR_RETURN(
      auto request_errors,
      r.AddCounterFamily("granary_cachenode_request_errors_total",
                         "Protocol errors by class (framing, truncated, message, policy, service, "
                         "internal, timeout, send).",
                         {"class"}));
  for (size_t i = 0; i < kRequestErrorClasses.size(); ++i) {
    GRANARY_ASSIGN_OR_RETURN(m.request_errors[i],
                             request_errors.WithLabels({kRequestErrorClasses[i].first}));
  }
  GRANARY_ASSIGN_OR_RETURN(m.served_items, r.AddCounter("granary_cachenode_served_items_total",
                                                        "READ items answered, OK or failed."));
  GRANARY_ASSIGN_OR_RETURN(m.served_item_errors,
                           r.AddCounter("granary_cachenode_served_item_errors_total",
                                        "READ items answered with an error."));
  GRANARY_ASSIGN_OR_RETURN(m.served_bytes, r.AddCounter("granary_cachenode_served_bytes_total",
                                                        "Payload bytes of READ replies sent."));
  GRANARY_ASSIGN_OR_RETURN(m.sendfile_bytes, r.AddCounter("granary_cachenode_sendfile_bytes_total",
                                                          "Payload bytes sent with sendfile(2)."));
  GRANARY_ASSIGN_OR_RETURN(m.received_bytes,
                           r.AddCounter("granary_cachenode_received_bytes_total",
                                        "Bytes received on protocol connections."));
  GRANARY_ASSIGN_OR_RETURN(m.connections_accepted,
                           r.AddCounter("granary_cachenode_connections_accepted_total",
                                        "Protocol connections accepted."));
  GRANARY_ASSIGN_OR_RETURN(m.connections_rejected,
                           r.AddCounter("granary_cachenode_connections_rejected_total",
                                        "Protocol connections refused over max_connections."));
  GRANARY_ASSIGN_OR_RETURN(
      m.connections, r.AddGauge("granary_cachenode_connections", "Protocol connections open."));
  GRANARY_ASSIGN_OR_RETURN(
      m.buffered_bytes,
      r.AddGauge("granary_cachenode_buffered_bytes",
                 "Bytes the protocol connections hold in memory (buffers, replies waiting)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.reply_budget_bytes,
      r.AddGauge("granary_cachenode_reply_budget_bytes",
                 "The reply budget: bytes of READ replies all connections may hold in memory "
                 "(reply_buffer_bytes)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.reply_budget_used_bytes,
      r.AddGauge("granary_cachenode_reply_budget_used_bytes",
                 "Bytes of the reply budget reserved by READs started and not yet sent."));
  GRANARY_ASSIGN_OR_RETURN(
      m.reply_budget_waits,
      r.AddCounter("granary_cachenode_reply_budget_waits_total",
                   "READs that waited for the reply budget before they started."));
  GRANARY_ASSIGN_OR_RETURN(
      m.connection_reply_waits,
      r.AddCounter("granary_cachenode_connection_reply_waits_total",
                   "READs that waited for their connection's share of the reply budget (its "
                   "client not reading replies)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.reply_stall_closes,
      r.AddCounter("granary_cachenode_reply_stall_closes_total",
                   "Connections closed for holding reply-budget bytes others waited for while "
                   "their client read nothing for reply_stall_timeout."));
  GRANARY_ASSIGN_OR_RETURN(
      m.auth_granted,
      r.AddCounter("granary_cachenode_auth_granted_total",
                   "Connections that authenticated (cluster key or Kubernetes token)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.auth_refused,
      r.AddCounter("granary_cachenode_auth_refused_total",
                   "Connections refused for authentication: no or a wrong credential, a request "
                   "before AUTH, a client too old to authenticate."));
  prometheus::Histogram::BucketBoundaries bounds(kServerLatencyBucketsSeconds.begin(),
                                                 kServerLatencyBucketsSeconds.end());
  GRANARY_ASSIGN_OR_RETURN(
      m.request_duration,
      r.AddHistogram("granary_cachenode_request_duration_seconds",
                     "From a request decoded to the last byte of its reply sent.", bounds));
  GRANARY_ASSIGN_OR_RETURN(m.items_from_disk,
                           r.AddCounter("granary_cachenode_items_from_disk_total",
                                        "READ items served wholly from the chunk files."));
  GRANARY_ASSIGN_OR_RETURN(
      m.items_on_demand, r.AddCounter("granary_cachenode_items_on_demand_total",
                                      "READ items with a part fetched from the source on demand."));
  GRANARY_ASSIGN_OR_RETURN(
      m.checksum_failures,
      r.AddCounter("granary_cachenode_checksum_failures_total",
                   "Segments read from a chunk file that failed their checksum."));
  GRANARY_ASSIGN_OR_RETURN(
      m.restaged_segments,
      r.AddCounter("granary_cachenode_restaged_segments_total",
                   "Segments that failed their checksum, dropped and fetched again."));
  GRANARY_ASSIGN_OR_RETURN(
      m.store_read_errors,
      r.AddCounter("granary_cachenode_store_read_errors_total",
                   "Segments the chunk store could not read (an I/O error such as EIO); the "
                   "READ item failed."));

  // The chunk store and the node.
  GRANARY_ASSIGN_OR_RETURN(
      m.capacity, r.AddGauge("granary_cachenode_capacity_bytes", "Bytes the chunk store may use."));
  GRANARY_ASSIGN_OR_RETURN(
      m.used, r.AddGauge("granary_cachenode_used_bytes", "Bytes the chunk store uses."));
  GRANARY_ASSIGN_OR_RETURN(m.filesystem_available,
                           r.AddGauge("granary_cachenode_filesystem_available_bytes",
                                      "Bytes the file system of the data directory has left."));
  GRANARY_ASSIGN_OR_RETURN(
      m.chunks, r.AddGauge("granary_cachenode_chunks", "Chunk files in the chunk store."));
  GRANARY_ASSIGN_OR_RETURN(m.creates_refused,
                           r.AddCounter("granary_cachenode_chunk_creates_refused_total",
                                        "Chunk creates refused: past the capacity."));
  GRANARY_ASSIGN_OR_RETURN(m.creates_no_space,
                           r.AddCounter("granary_cachenode_chunk_creates_no_space_total",
                                        "Chunk creates failed: the file system was full."));
  GRANARY_ASSIGN_OR_RETURN(
      m.store_written_bytes,
      r.AddCounter("granary_cachenode_store_written_bytes_total",
                   "Payload bytes written into chunk files (staging and on-demand fills)."));
  GRANARY_ASSIGN_OR_RETURN(m.datasets, r.AddGauge("granary_cachenode_datasets",
                                                  "Datasets this node stages and serves."));
  GRANARY_ASSIGN_OR_RETURN(
      m.store_errors,
      r.AddCounter("granary_cachenode_store_errors_total",
                   "Metadata store calls that failed (heartbeats, listings, progress)."));

  // The fabric front end (fabric_listen).
  GRANARY_ASSIGN_OR_RETURN(
      m.fabric_available,
      r.AddGauge("granary_cachenode_fabric_available",
                 "1 when the node serves the libfabric transport (fabric_listen), 0 when it is "
                 "off or fell back to TCP only (provider or listener not usable)."));
  GRANARY_ASSIGN_OR_RETURN(m.fabric_connections_accepted,
                           r.AddCounter("granary_cachenode_fabric_connections_accepted_total",
                                        "Fabric connections accepted."));
  GRANARY_ASSIGN_OR_RETURN(m.fabric_connections_rejected,
                           r.AddCounter("granary_cachenode_fabric_connections_rejected_total",
                                        "Fabric connections refused over max_connections."));
  GRANARY_ASSIGN_OR_RETURN(m.fabric_connections, r.AddGauge("granary_cachenode_fabric_connections",
                                                            "Fabric connections open."));
  GRANARY_ASSIGN_OR_RETURN(m.fabric_requests,
                           r.AddCounter("granary_cachenode_fabric_requests_total",
                                        "Fabric messages answered (a reply or an ERROR)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.fabric_rma_bytes, r.AddCounter("granary_cachenode_fabric_rma_bytes_total",
                                       "READ payload bytes written into readers' windows by RMA."));
  GRANARY_ASSIGN_OR_RETURN(
      m.fabric_errors,
      r.AddCounter("granary_cachenode_fabric_errors_total",
                   "Fabric errors: bad messages, refused authentication, failed service calls, "
                   "timeouts, failed sends and RMA writes."));

  // Snapshots of the pool's datasets (SnapshotBy::kPool).
  GRANARY_ASSIGN_OR_RETURN(
      auto snapshots,
      r.AddCounterFamily("granary_cachenode_snapshots_total",
                         "Snapshots this node took of its pool's datasets, by result (ok, "
                         "failed, superseded, abandoned, error).",
                         {"result"}));
  for (size_t i = 0; i < kSnapshotResults.size(); ++i) {
    GRANARY_ASSIGN_OR_RETURN(m.snapshots[i],
                             snapshots.WithLabels({std::string(kSnapshotResults[i])}));
  }
  GRANARY_ASSIGN_OR_RETURN(
      m.snapshot_seconds,
      r.AddHistogram("granary_cachenode_snapshot_seconds",
                     "How long the walks of this node's snapshots took (every result).",
                     prometheus::Histogram::BucketBoundaries{0.1, 0.5, 1, 5, 10, 30, 60, 300, 900,
                                                             1800, 3600, 7200}));
  return m;
}

Result<DatasetMetrics> CacheNodeMetrics::ForDataset(const std::string& dataset) const {
  DatasetMetrics d;
  const std::vector<std::string> labels = {dataset};
  GRANARY_ASSIGN_OR_RETURN(d.source_opens, source_opens.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.source_read_calls, source_read_calls.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.source_read_bytes, source_read_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.staged_samples, staged_samples.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.on_demand_fetches, on_demand_fetches.WithLabels(labels));
  for (size_t k = 0; k < kSourceErrorKinds; ++k) {
    GRANARY_ASSIGN_OR_RETURN(
        d.source_errors[k],
        source_errors.WithLabels(
            {dataset, std::string(SourceErrorKindName(static_cast<SourceErrorKind>(k)))}));
  }
  GRANARY_ASSIGN_OR_RETURN(d.staged_bytes, staged_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.staged_chunks, staged_chunks.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.owned_bytes, owned_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.owned_chunks, owned_chunks.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.queue_chunks, queue_chunks.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.sample_errors, sample_errors.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.staging_state, staging_state.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.kept_bytes, kept_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.budget_bytes, budget_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.streamed_bytes, streamed_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.streamed_ahead_bytes, streamed_ahead_bytes.WithLabels(labels));
  GRANARY_ASSIGN_OR_RETURN(d.reads_from_store, dataset_reads.WithLabels({dataset, "store"}));
  GRANARY_ASSIGN_OR_RETURN(d.reads_from_source, dataset_reads.WithLabels({dataset, "source"}));
  for (size_t i = 0; i < kEvictionReasons.size(); ++i) {
    const std::string reason(kEvictionReasons[i]);
    GRANARY_ASSIGN_OR_RETURN(d.evicted_bytes[i], evicted_bytes.WithLabels({dataset, reason}));
    GRANARY_ASSIGN_OR_RETURN(d.evicted_chunks[i], evicted_chunks.WithLabels({dataset, reason}));
  }
  return d;
}

void UpdateNodeMetrics(const CacheNodeMetrics& m, NodeMetricState& last,
                       const ChunkStoreStats& store, const ServerCounters& server,
                       const ChunkReadServiceCounters& reads) {
  ServerCounters& s = last.server;
  Advance(m.requests_hello, server.hello_requests_total, &s.hello_requests_total);
  Advance(m.requests_ping, server.ping_requests_total, &s.ping_requests_total);
  Advance(m.requests_stat, server.stat_requests_total, &s.stat_requests_total);
  Advance(m.requests_read, server.read_requests_total, &s.read_requests_total);
  for (size_t i = 0; i < kRequestErrorClasses.size(); ++i) {
    const auto field = kRequestErrorClasses[i].second;
    Advance(m.request_errors[i], server.*field, &(s.*field));
  }
  Advance(m.served_items, server.read_items_total, &s.read_items_total);
  Advance(m.served_item_errors, server.read_item_errors_total, &s.read_item_errors_total);
  Advance(m.served_bytes, server.payload_bytes_total, &s.payload_bytes_total);
  Advance(m.sendfile_bytes, server.sendfile_bytes_total, &s.sendfile_bytes_total);
  Advance(m.received_bytes, server.received_bytes_total, &s.received_bytes_total);
  Advance(m.connections_accepted, server.connections_accepted_total, &s.connections_accepted_total);
  Advance(m.connections_rejected, server.connections_rejected_total, &s.connections_rejected_total);
  SetGauge(m.connections, server.connections_open);
  SetGauge(m.buffered_bytes, server.buffered_bytes);
  SetGauge(m.reply_budget_bytes, server.reply_budget_bytes);
  SetGauge(m.reply_budget_used_bytes, server.reply_budget_used_bytes);
  Advance(m.reply_budget_waits, server.reply_budget_waits_total, &s.reply_budget_waits_total);
  Advance(m.connection_reply_waits, server.connection_reply_waits_total,
          &s.connection_reply_waits_total);
  Advance(m.reply_stall_closes, server.reply_stall_closes_total, &s.reply_stall_closes_total);
  Advance(m.auth_granted, server.auth_granted_total, &s.auth_granted_total);
  Advance(m.auth_refused, server.auth_refused_total, &s.auth_refused_total);

  // The histogram: the new observations per bucket since the last refresh.
  if (server.latency_count > s.latency_count) {
    std::vector<double> increments(server.latency_buckets.size());
    for (size_t i = 0; i < increments.size(); ++i) {
      const uint64_t now = server.latency_buckets[i];
      const uint64_t before = s.latency_buckets[i];
      increments[i] = now > before ? static_cast<double>(now - before) : 0.0;
    }
    const double sum = server.latency_sum_seconds - s.latency_sum_seconds;
    m.request_duration->ObserveMultiple(increments, sum > 0 ? sum : 0.0);
  }
  s.latency_buckets = server.latency_buckets;
  s.latency_count = server.latency_count;
  s.latency_sum_seconds = server.latency_sum_seconds;

  ChunkReadServiceCounters& r = last.reads;
  Advance(m.items_from_disk, reads.items_from_disk, &r.items_from_disk);
  Advance(m.items_on_demand, reads.items_on_demand, &r.items_on_demand);
  Advance(m.checksum_failures, reads.checksum_failures, &r.checksum_failures);
  Advance(m.restaged_segments, reads.restaged_segments, &r.restaged_segments);
  Advance(m.store_read_errors, reads.store_read_errors, &r.store_read_errors);

  SetGauge(m.capacity, store.capacity_bytes);
  SetGauge(m.used, store.used_bytes);
  SetGauge(m.filesystem_available, store.filesystem_available_bytes);
  SetGauge(m.chunks, store.chunk_count);
  Advance(m.creates_refused, store.creates_refused_total, &last.creates_refused);
  Advance(m.store_written_bytes, store.bytes_written_total, &last.written);
  Advance(m.creates_no_space, store.creates_no_space_total, &last.creates_no_space);
}

void UpdateFabricMetrics(const CacheNodeMetrics& m, NodeMetricState& last,
                         const std::optional<FabricCounters>& fabric) {
  SetGauge(m.fabric_available, fabric.has_value() ? 1 : 0);
  if (!fabric.has_value()) return;
  FabricCounters& f = last.fabric;
  Advance(m.fabric_connections_accepted, fabric->connections_accepted_total,
          &f.connections_accepted_total);
  Advance(m.fabric_connections_rejected, fabric->connections_rejected_total,
          &f.connections_rejected_total);
  SetGauge(m.fabric_connections, fabric->connections_open);
  Advance(m.fabric_requests, fabric->requests_total, &f.requests_total);
  Advance(m.fabric_rma_bytes, fabric->rma_bytes_total, &f.rma_bytes_total);
  Advance(m.fabric_errors, fabric->errors_total, &f.errors_total);
}

void ClearDatasetGauges(const DatasetMetrics& m) {
  for (prometheus::Gauge* g :
       {m.staged_bytes, m.staged_chunks, m.owned_bytes, m.owned_chunks, m.queue_chunks,
        m.sample_errors, m.staging_state, m.kept_bytes, m.budget_bytes}) {
    g->Set(0);
  }
}

void UpdateDatasetMetrics(const DatasetMetrics& m, DatasetMetricState& last,
                          const StagerProgress& progress, const SourceCounters& source) {
  Advance(m.source_opens, source.opens, &last.opens);
  Advance(m.source_read_calls, source.read_calls, &last.read_calls);
  Advance(m.source_read_bytes, source.bytes, &last.bytes);
  Advance(m.staged_samples, source.completed, &last.completed);
  Advance(m.on_demand_fetches, progress.on_demand_fetches, &last.on_demand);
  Advance(m.streamed_bytes, progress.streamed_bytes, &last.streamed);
  Advance(m.streamed_ahead_bytes, progress.streamed_ahead_bytes, &last.streamed_ahead);
  Advance(m.reads_from_store, progress.reads_from_store, &last.from_store);
  Advance(m.reads_from_source, progress.reads_from_source, &last.from_source);
  SetGauge(m.kept_bytes, progress.bytes_kept);
  SetGauge(m.budget_bytes, progress.budget.value_or(progress.file_bytes_owned));
  for (size_t k = 0; k < kSourceErrorKinds; ++k) {
    Advance(m.source_errors[k], source.errors[k], &last.errors[k]);
  }
  SetGauge(m.staged_bytes, progress.bytes_staged);
  SetGauge(m.staged_chunks, progress.chunks_staged);
  SetGauge(m.owned_bytes, progress.bytes_owned);
  SetGauge(m.owned_chunks, progress.chunks_owned);
  SetGauge(m.queue_chunks, progress.queue_depth);
  SetGauge(m.sample_errors, progress.samples_failed_total());
  m.staging_state->Set(static_cast<double>(progress.state));
}

}  // namespace granary

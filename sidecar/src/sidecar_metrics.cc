#include "sidecar_metrics.h"

#include <string>
#include <vector>

#include "granary/protocol/sidecar_protocol.h"

namespace granary::sidecar {
namespace {

constexpr const char* kRequestTypes[12] = {"hello", "open",        "set_plan",    "get",
                                           "next",  "release",     "stat",        "lookup",
                                           "ping",  "directories", "chunk_files", "other"};

void Advance(prometheus::Counter* counter, uint64_t now, uint64_t* last) {
  if (now > *last) counter->Increment(static_cast<double>(now - *last));
  *last = now;
}

void SetGauge(prometheus::Gauge* gauge, uint64_t value) { gauge->Set(static_cast<double>(value)); }

}  // namespace

Result<SidecarMetrics> SidecarMetrics::Declare(prometheus::Registry& registry) {
  MetricRegistrar r(registry, "sidecar");
  SidecarMetrics m;
  GRANARY_ASSIGN_OR_RETURN(
      auto requests,
      r.AddCounterFamily("granary_sidecar_requests_total", "Client requests, by type.", {"type"}));
  for (size_t i = 0; i < std::size(kRequestTypes); ++i) {
    GRANARY_ASSIGN_OR_RETURN(m.requests[i], requests.WithLabels({kRequestTypes[i]}));
  }
  GRANARY_ASSIGN_OR_RETURN(auto errors,
                           r.AddCounterFamily("granary_sidecar_request_errors_total",
                                              "Client errors: framing (connection closed) or "
                                              "request (an ERROR reply, connection kept).",
                                              {"class"}));
  GRANARY_ASSIGN_OR_RETURN(m.errors_framing, errors.WithLabels({"framing"}));
  GRANARY_ASSIGN_OR_RETURN(m.errors_request, errors.WithLabels({"request"}));
  GRANARY_ASSIGN_OR_RETURN(auto posix_requests,
                           r.AddCounterFamily("granary_sidecar_posix_requests_total",
                                              "FUSE requests to the POSIX views of `mounts`, by "
                                              "operation (a warm pass should add none).",
                                              {"op"}));
  for (size_t i = 0; i < posix::kFuseOpCount; ++i) {
    GRANARY_ASSIGN_OR_RETURN(
        m.posix_requests[i],
        posix_requests.WithLabels({std::string(posix::FuseOpName(static_cast<posix::FuseOp>(i)))}));
  }
  GRANARY_ASSIGN_OR_RETURN(m.sessions_opened, r.AddCounter("granary_sidecar_sessions_opened_total",
                                                           "Client connections accepted."));
  GRANARY_ASSIGN_OR_RETURN(
      auto rejected,
      r.AddCounterFamily("granary_sidecar_rejected_clients_total",
                         "Connections refused at accept: max_clients (all places taken), per_uid "
                         "(the peer's uid holds max_clients_per_uid, or only the places reserved "
                         "for root and the sidecar's user are left).",
                         {"reason"}));
  GRANARY_ASSIGN_OR_RETURN(m.rejected_clients_full, rejected.WithLabels({"max_clients"}));
  GRANARY_ASSIGN_OR_RETURN(m.rejected_clients_uid, rejected.WithLabels({"per_uid"}));
  GRANARY_ASSIGN_OR_RETURN(
      m.idle_closes,
      r.AddCounter("granary_sidecar_idle_closes_total",
                   "Client connections closed after idle_timeout with no request or reply in "
                   "progress (their pins dropped)."));
  GRANARY_ASSIGN_OR_RETURN(
      auto chunk_files,
      r.AddCounterFamily("granary_sidecar_chunk_files_total",
                         "Chunks asked for by clients on this host that read them themselves: "
                         "handed (a chunk file's descriptor passed), declined (the local node "
                         "does not hand it over now: read through the arena), refused (the "
                         "client's uid may not have chunk files of the dataset).",
                         {"outcome"}));
  GRANARY_ASSIGN_OR_RETURN(m.chunk_files_handed, chunk_files.WithLabels({"handed"}));
  GRANARY_ASSIGN_OR_RETURN(m.chunk_files_declined, chunk_files.WithLabels({"declined"}));
  GRANARY_ASSIGN_OR_RETURN(m.chunk_files_refused, chunk_files.WithLabels({"refused"}));
  GRANARY_ASSIGN_OR_RETURN(
      m.plans, r.AddCounter("granary_sidecar_plans_total", "Plans announced with SET_PLAN."));
  GRANARY_ASSIGN_OR_RETURN(m.store_errors, r.AddCounter("granary_sidecar_store_errors_total",
                                                        "Failed metadata store calls."));
  GRANARY_ASSIGN_OR_RETURN(
      auto served_samples,
      r.AddCounterFamily("granary_sidecar_served_samples_total",
                         "Samples handed to clients, by how they reached shared memory: "
                         "prefetch (ahead of the request) or on_demand.",
                         {"from"}));
  GRANARY_ASSIGN_OR_RETURN(
      auto served_bytes,
      r.AddCounterFamily("granary_sidecar_served_bytes_total",
                         "Bytes handed to clients, as served_samples_total.", {"from"}));
  GRANARY_ASSIGN_OR_RETURN(m.served_prefetch_samples, served_samples.WithLabels({"prefetch"}));
  GRANARY_ASSIGN_OR_RETURN(m.served_on_demand_samples, served_samples.WithLabels({"on_demand"}));
  GRANARY_ASSIGN_OR_RETURN(m.served_prefetch_bytes, served_bytes.WithLabels({"prefetch"}));
  GRANARY_ASSIGN_OR_RETURN(m.served_on_demand_bytes, served_bytes.WithLabels({"on_demand"}));
  GRANARY_ASSIGN_OR_RETURN(m.failed_samples,
                           r.AddCounter("granary_sidecar_failed_samples_total",
                                        "Samples a client asked for that could not be delivered."));
  GRANARY_ASSIGN_OR_RETURN(m.prefetched_samples,
                           r.AddCounter("granary_sidecar_prefetched_samples_total",
                                        "Samples fetched ahead of the clients."));
  GRANARY_ASSIGN_OR_RETURN(m.prefetched_bytes,
                           r.AddCounter("granary_sidecar_prefetched_bytes_total",
                                        "Bytes fetched ahead of the clients."));
  GRANARY_ASSIGN_OR_RETURN(m.prefetch_failures,
                           r.AddCounter("granary_sidecar_prefetch_failures_total",
                                        "Prefetches that failed (retried on demand)."));
  GRANARY_ASSIGN_OR_RETURN(
      auto fetched_samples,
      r.AddCounterFamily("granary_sidecar_fetched_samples_total",
                         "Samples fetched into shared memory, by where from: local_node, peer, "
                         "source.",
                         {"from"}));
  GRANARY_ASSIGN_OR_RETURN(
      auto fetched_bytes, r.AddCounterFamily("granary_sidecar_fetched_bytes_total",
                                             "Bytes fetched, as fetched_samples_total.", {"from"}));
  for (size_t i = 0; i < kSampleSources; ++i) {
    const std::string from(SampleSourceName(static_cast<SampleSource>(i)));
    GRANARY_ASSIGN_OR_RETURN(m.fetched_samples[i], fetched_samples.WithLabels({from}));
    GRANARY_ASSIGN_OR_RETURN(m.fetched_bytes[i], fetched_bytes.WithLabels({from}));
  }
  GRANARY_ASSIGN_OR_RETURN(m.node_failures,
                           r.AddCounter("granary_sidecar_node_failures_total",
                                        "Cache nodes that failed at the connection level "
                                        "(skipped for node_down_for)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.fabric_available,
      r.AddGauge("granary_sidecar_fabric_available",
                 "1 when transport libfabric is configured and its provider is usable here; 0 "
                 "otherwise (transport tcp, or a provider that is not usable: every node is "
                 "then reached over TCP)."));
  GRANARY_ASSIGN_OR_RETURN(m.fabric_connects,
                           r.AddCounter("granary_sidecar_fabric_connects_total",
                                        "Connections to cache nodes opened over libfabric."));
  GRANARY_ASSIGN_OR_RETURN(
      m.fabric_fallbacks,
      r.AddCounter("granary_sidecar_fabric_fallbacks_total",
                   "Connections to cache nodes opened over TCP although transport libfabric is "
                   "configured (the node offers no fabric address, or serves TLS)."));
  GRANARY_ASSIGN_OR_RETURN(
      m.local_file_pieces,
      r.AddCounter("granary_sidecar_local_file_pieces_total",
                   "Sample pieces read straight from the local cache node's chunk files "
                   "(chunk handoff, local_node_socket)."));
  GRANARY_ASSIGN_OR_RETURN(m.local_file_opens,
                           r.AddCounter("granary_sidecar_local_file_opens_total",
                                        "Chunk files the local cache node handed over."));
  GRANARY_ASSIGN_OR_RETURN(
      m.local_file_declined,
      r.AddCounter("granary_sidecar_local_file_declined_total",
                   "Pieces the chunk handoff path passed to the network (not staged yet, "
                   "refused, failed a checksum, socket down)."));
  GRANARY_ASSIGN_OR_RETURN(m.evictions,
                           r.AddCounter("granary_sidecar_evictions_total",
                                        "Samples evicted from shared memory to make room."));
  GRANARY_ASSIGN_OR_RETURN(m.unknown_releases,
                           r.AddCounter("granary_sidecar_unknown_releases_total",
                                        "Releases of tokens the client did not hold (ignored)."));
  GRANARY_ASSIGN_OR_RETURN(m.sessions,
                           r.AddGauge("granary_sidecar_sessions", "Client connections open."));
  GRANARY_ASSIGN_OR_RETURN(m.pins,
                           r.AddGauge("granary_sidecar_pins", "Sample tokens held by clients."));
  GRANARY_ASSIGN_OR_RETURN(m.pinned_bytes, r.AddGauge("granary_sidecar_pinned_bytes",
                                                      "Bytes of samples pinned by clients."));
  GRANARY_ASSIGN_OR_RETURN(
      m.window_samples,
      r.AddGauge("granary_sidecar_window_samples", "Samples prefetched and not yet handed out."));
  GRANARY_ASSIGN_OR_RETURN(m.window_bytes, r.AddGauge("granary_sidecar_window_bytes",
                                                      "Bytes prefetched and not yet handed out."));
  GRANARY_ASSIGN_OR_RETURN(m.arena_bytes, r.AddGauge("granary_sidecar_arena_bytes",
                                                     "Shared memory of the open datasets."));
  GRANARY_ASSIGN_OR_RETURN(m.arena_used_bytes, r.AddGauge("granary_sidecar_arena_used_bytes",
                                                          "Shared memory holding samples."));
  GRANARY_ASSIGN_OR_RETURN(m.cursors,
                           r.AddGauge("granary_sidecar_plan_cursors", "Plans being prefetched."));
  GRANARY_ASSIGN_OR_RETURN(auto buckets, ExponentialBuckets(0.00005, 4, 10));
  GRANARY_ASSIGN_OR_RETURN(
      m.client_wait, r.AddHistogram("granary_sidecar_client_wait_seconds",
                                    "How long a GET or NEXT waited for its samples.", buckets));
  return m;
}

void SidecarMetrics::Request(uint16_t type) {
  using T = sidecar_protocol::MessageType;
  size_t index = 11;
  if (type >= static_cast<uint16_t>(T::kHello) && type <= static_cast<uint16_t>(T::kChunkFiles)) {
    index = type - static_cast<uint16_t>(T::kHello);
  }
  requests[index]->Increment();
}

void SidecarMetrics::Served(bool prefetched, uint64_t bytes) {
  (prefetched ? served_prefetch_samples : served_on_demand_samples)->Increment();
  (prefetched ? served_prefetch_bytes : served_on_demand_bytes)
      ->Increment(static_cast<double>(bytes));
}

void SidecarMetrics::Refresh(const SampleCacheStats& caches, const SampleFetcherCounters& fetcher,
                             size_t sessions_now, Last* last) {
  for (size_t i = 0; i < kSampleSources; ++i) {
    Advance(fetched_samples[i], fetcher.samples[i], &last->fetcher.samples[i]);
    Advance(fetched_bytes[i], fetcher.bytes[i], &last->fetcher.bytes[i]);
  }
  Advance(node_failures, fetcher.node_failures, &last->fetcher.node_failures);
  Advance(fabric_connects, fetcher.fabric_connects, &last->fetcher.fabric_connects);
  Advance(fabric_fallbacks, fetcher.fabric_fallbacks, &last->fetcher.fabric_fallbacks);
  Advance(local_file_pieces, fetcher.local_file_pieces, &last->fetcher.local_file_pieces);
  Advance(local_file_opens, fetcher.local_file_opens, &last->fetcher.local_file_opens);
  Advance(local_file_declined, fetcher.local_file_declined, &last->fetcher.local_file_declined);
  Advance(evictions, caches.evictions, &last->evictions);
  Advance(unknown_releases, caches.unknown_releases, &last->unknown_releases);
  SetGauge(sessions, sessions_now);
  SetGauge(pins, caches.pins);
  SetGauge(pinned_bytes, caches.pinned_bytes);
  SetGauge(window_samples, caches.window_samples);
  SetGauge(window_bytes, caches.window_bytes);
  SetGauge(arena_bytes, caches.arena_bytes);
  SetGauge(arena_used_bytes, caches.arena_used_bytes);
  SetGauge(cursors, caches.cursors);
}

void SidecarMetrics::RefreshPosix(const std::array<uint64_t, posix::kFuseOpCount>& view_requests,
                                  Last* last) {
  for (size_t i = 0; i < posix::kFuseOpCount; ++i) {
    Advance(posix_requests[i], view_requests[i], &last->posix_requests[i]);
  }
}

}  // namespace granary::sidecar

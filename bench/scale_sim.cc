// Granary at 1,000 cache nodes and 10 million samples, simulated without
// starting them: what placement does to balance and to
// data movement, what the control plane asks of the metadata store, and what a
// sidecar holds in memory. Placement and plans are the real code; the store's
// load is counted from the daemons' loops (cache_node.cc: a heartbeat, a
// reconcile and a progress report per heartbeat_interval; sidecar.cc: the node
// list and each open dataset per refresh_interval; the node lists as
// NodeListFollower asks for them, beside listing every time as before) and
// its capacity measured on a real store holding that many node records.
//
//   build/release/bench/scale_sim [--nodes 1000] [--samples 10000000]
//       [--sample-bytes 93000] [--chunk-bytes 16777216] [--ranks 8000]
//       [--ranks-per-sidecar 8] [--store URL] [--seconds 3] [--json FILE]
//       [--changes-per-hour 60] [--full-list-s 300]
//
// --store defaults to a SQLite file in a temporary directory; pass a
// redis:// URL to measure Redis instead. docs/benchmarks.md, "Scale".

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/core/placement.h"
#include "granary/core/plan.h"
#include "granary/store/open_store.h"
#include "process_rss.h"

namespace granary {
namespace {

using SteadyClock = std::chrono::steady_clock;

struct Options {
  uint32_t nodes = 1000;
  uint64_t samples = 10'000'000;
  uint64_t sample_bytes = 93'000;  // ImageNet-21k: about 1.3 TB over 14 million images
  uint64_t chunk_bytes = kDefaultChunkSize;
  uint32_t ranks = 8000;
  uint32_t ranks_per_sidecar = 8;  // one sidecar per pod of 8 GPUs
  double heartbeat_s = 2.0;        // CacheNodeConfig::heartbeat_interval's default
  double refresh_s = 1.0;          // SidecarConfig::refresh_interval's default
  double full_list_s = 300.0;      // NodeListFollower's safety interval
  double changes_per_hour = 60.0;  // membership changes (joins, leaves, restarts)
  uint32_t datasets = 1;
  std::string store;
  double seconds = 3.0;
  std::string json;
};

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string NodeId(uint32_t i) {
  char id[32];
  std::snprintf(id, sizeof id, "gpu-host-%05u", i);
  return id;
}

std::vector<PlacementNode> Nodes(uint32_t first, uint32_t count) {
  std::vector<PlacementNode> nodes;
  for (uint32_t i = first; i < first + count; ++i) nodes.push_back({NodeId(i), 1.0});
  return nodes;
}

Placement MustPlace(std::vector<PlacementNode> nodes) {
  Result<Placement> p = Placement::Create(std::move(nodes));
  if (!p.ok()) {
    std::fprintf(stderr, "scale_sim: placement: %s\n", p.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*p);
}

// ---- placement: balance and movement ----

struct Balance {
  double max_over_mean = 0;
  double min_over_mean = 0;
};

// Owners (replication r) of every chunk, as node ids, for comparing placements
// whose node lists differ.
std::vector<std::vector<std::string>> AllOwners(const Placement& p, const ContentId& manifest,
                                                uint64_t chunks, uint32_t replication) {
  std::vector<std::vector<std::string>> owners(chunks);
  for (uint64_t c = 0; c < chunks; ++c) {
    owners[c] = p.OwnerIds(manifest, static_cast<ChunkId>(c), replication);
    std::sort(owners[c].begin(), owners[c].end());
  }
  return owners;
}

Balance ChunkBalance(const std::vector<std::vector<std::string>>& owners, size_t node_count) {
  std::map<std::string, uint64_t> per_node;
  for (const auto& o : owners) {
    for (const std::string& id : o) ++per_node[id];
  }
  uint64_t total = 0, most = 0, least = UINT64_MAX;
  for (const auto& [id, n] : per_node) {
    total += n;
    most = std::max(most, n);
    least = std::min(least, n);
  }
  if (per_node.size() < node_count) least = 0;  // a node with no chunk at all
  const double mean = static_cast<double>(total) / static_cast<double>(node_count);
  return {static_cast<double>(most) / mean, static_cast<double>(least) / mean};
}

// Replica placements (chunk, node) present after and not before: what must be
// copied, as a fraction of all replica placements.
double Moved(const std::vector<std::vector<std::string>>& before,
             const std::vector<std::vector<std::string>>& after) {
  uint64_t moved = 0, total = 0;
  for (size_t c = 0; c < before.size(); ++c) {
    for (const std::string& id : after[c]) {
      if (!std::binary_search(before[c].begin(), before[c].end(), id)) ++moved;
    }
    total += after[c].size();
  }
  return static_cast<double>(moved) / static_cast<double>(total);
}

nlohmann::json Placements(const Options& o) {
  const ContentId manifest = ContentId::Of("scale_sim manifest");
  const uint64_t total_bytes = o.samples * o.sample_bytes;
  const uint64_t chunks = (total_bytes + o.chunk_bytes - 1) / o.chunk_bytes;
  nlohmann::json out = {{"chunks", chunks}, {"dataset_bytes", total_bytes}};
  std::printf("Placement: %llu samples of %llu bytes in %llu chunks of %llu MiB over %u nodes\n",
              static_cast<unsigned long long>(o.samples),
              static_cast<unsigned long long>(o.sample_bytes),
              static_cast<unsigned long long>(chunks),
              static_cast<unsigned long long>(o.chunk_bytes >> 20), o.nodes);
  for (uint32_t replication : {1u, 2u}) {
    const auto t0 = SteadyClock::now();
    const Placement base = MustPlace(Nodes(0, o.nodes));
    const auto owners = AllOwners(base, manifest, chunks, replication);
    const double place_s = Seconds(t0, SteadyClock::now());
    const Balance b = ChunkBalance(owners, o.nodes);

    const auto joined = AllOwners(MustPlace(Nodes(0, o.nodes + 1)), manifest, chunks, replication);
    const auto one_left =
        AllOwners(MustPlace(Nodes(1, o.nodes - 1)), manifest, chunks, replication);
    std::vector<PlacementNode> survivors;
    std::mt19937_64 rng(20);
    for (PlacementNode& n : Nodes(0, o.nodes)) {
      if (rng() % 10 != 0) survivors.push_back(std::move(n));
    }
    const uint32_t left = o.nodes - static_cast<uint32_t>(survivors.size());
    const auto tenth_left =
        AllOwners(MustPlace(std::move(survivors)), manifest, chunks, replication);
    const double ideal_join = 1.0 / (o.nodes + 1);
    const double ideal_leave = 1.0 / o.nodes;
    const double ideal_tenth = static_cast<double>(left) / o.nodes;
    nlohmann::json r = {{"max_over_mean", b.max_over_mean},
                        {"min_over_mean", b.min_over_mean},
                        {"moved_one_joins", Moved(owners, joined)},
                        {"moved_one_leaves", Moved(owners, one_left)},
                        {"moved_tenth_leave", Moved(owners, tenth_left)},
                        {"nodes_left_in_tenth", left},
                        {"placement_seconds", place_s}};
    std::printf(
        "  replication %u: chunks per node max/mean %.2f, min/mean %.2f (all %llu chunks placed "
        "in %.2f s)\n"
        "    moved when 1 node joins: %.4f of replicas (ideal %.4f); 1 leaves: %.4f (ideal "
        "%.4f); %u leave at once: %.4f (ideal %.4f)\n",
        replication, b.max_over_mean, b.min_over_mean, static_cast<unsigned long long>(chunks),
        place_s, r["moved_one_joins"].get<double>(), ideal_join,
        r["moved_one_leaves"].get<double>(), ideal_leave, left,
        r["moved_tenth_leave"].get<double>(), ideal_tenth);
    out["replication_" + std::to_string(replication)] = r;
  }
  return out;
}

// ---- the metadata store: load asked and capacity measured ----

struct Load {
  double writes = 0;            // heartbeats and progress reports per second
  double versions = 0;          // NodesVersion calls per second
  double list_nodes = 0;        // ListNodes calls per second
  double node_records = 0;      // node records those calls return per second
  double other_reads = 0;       // ListDatasets, ListPlans, GetDataset per second
  double event_deliveries = 0;  // events x watchers per second (progress while staging)
};

// `follow`: the daemons' loops as they are (NodeListFollower: a version read
// per refresh, a full list when it moved or after full_list_s); without it,
// as they were (a full list per refresh).
Load Asked(const Options& o, bool follow) {
  const double sidecars = std::ceil(static_cast<double>(o.ranks) / o.ranks_per_sidecar);
  const double per_tick = o.nodes / o.heartbeat_s;  // cache-node ticks per second
  const double per_refresh = sidecars / o.refresh_s;
  const double readers = o.nodes + sidecars;
  Load l;
  // Each cache-node tick: Heartbeat, PutProgress per staging dataset (while
  // it changes), the pool's nodes, ListDatasets, ListPlans per dataset.
  l.writes = per_tick * (1 + o.datasets);
  if (follow) {
    l.versions = per_tick + per_refresh;
    // Every reader lists once per change, and once per safety interval.
    l.list_nodes = readers * (o.changes_per_hour / 3600.0 + 1.0 / o.full_list_s);
  } else {
    l.list_nodes = per_tick + per_refresh;
  }
  l.node_records = l.list_nodes * o.nodes;
  l.other_reads = per_tick * (1 + o.datasets) + per_refresh * o.datasets;
  // Every progress report is an event every cache node's watcher receives.
  l.event_deliveries = per_tick * o.datasets * o.nodes;
  return l;
}

struct Capacity {
  double heartbeats_per_s = 0;
  double versions_per_s = 0;
  double list_nodes_per_s = 0;
  double get_dataset_per_s = 0;
};

// The share of one store's time the load takes: each kind of call asked per
// second over what one client measured of it per second (a client that
// waits for each reply keeps the server about as busy as it can).
double Utilization(const Load& l, const Capacity& c) {
  return l.writes / c.heartbeats_per_s + l.versions / c.versions_per_s +
         l.list_nodes / c.list_nodes_per_s + l.other_reads / c.get_dataset_per_s;
}

// Calls `call` for `seconds` (at least once); calls per second.
template <typename Call>
double Rate(double seconds, Call call) {
  const auto t0 = SteadyClock::now();
  uint64_t n = 0;
  do {
    call(n);
    ++n;
  } while (Seconds(t0, SteadyClock::now()) < seconds);
  return static_cast<double>(n) / Seconds(t0, SteadyClock::now());
}

[[noreturn]] void Fail(const char* what, const Status& s) {
  std::fprintf(stderr, "scale_sim: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

Capacity Measure(const Options& o, nlohmann::json* out) {
  std::string url = o.store;
  std::filesystem::path dir;
  if (url.empty()) {
    dir = std::filesystem::temp_directory_path() /
          ("granary-scale-sim-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    url = "sqlite://" + (dir / "granary.db").string();
  }
  Capacity c;
  Result<std::unique_ptr<MetadataStore>> store = OpenMetadataStore(url);
  if (!store.ok()) {
    std::fprintf(stderr, "scale_sim: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  const auto ttl = std::chrono::minutes(10);
  std::vector<NodeRecord> records;
  for (uint32_t i = 0; i < o.nodes; ++i) {
    NodeRecord n;
    n.id = NodeId(i);
    n.pool = "scale";
    n.address = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + ":7070";
    n.capacity_bytes = 7'680'000'000'000;
    n.labels = {{"topology.kubernetes.io/zone", "zone-" + std::to_string(i % 4)}};
    n.started_ms = 1'700'000'000'000;
    records.push_back(std::move(n));
  }
  MetadataStore& s = **store;
  for (const NodeRecord& r : records) {
    if (Status st = s.Heartbeat(r, ttl); !st.ok()) Fail("heartbeat", st);
  }
  DatasetRecord d;
  d.name = "scale-dataset";
  d.spec.source_uri = "file:///lustre/scale";
  d.spec.pool = "scale";
  if (Result<DatasetRecord> made = s.CreateDataset(d);
      !made.ok() && made.status().code() != StatusCode::kAlreadyExists) {
    Fail("create dataset", made.status());
  }
  c.heartbeats_per_s = Rate(o.seconds, [&](uint64_t i) {
    if (Status st = s.Heartbeat(records[i % records.size()], ttl); !st.ok()) Fail("heartbeat", st);
  });
  c.versions_per_s = Rate(o.seconds, [&](uint64_t) {
    if (Result<uint64_t> v = s.NodesVersion(); !v.ok()) Fail("NodesVersion", v.status());
  });
  c.list_nodes_per_s = Rate(o.seconds, [&](uint64_t) {
    Result<std::vector<NodeRecord>> listed = s.ListNodes("scale");
    if (!listed.ok()) Fail("ListNodes", listed.status());
    if (listed->size() != o.nodes) {
      Fail("ListNodes", Status::Internal(std::to_string(listed->size()) + " nodes listed"));
    }
  });
  c.get_dataset_per_s = Rate(o.seconds, [&](uint64_t) {
    if (Result<DatasetRecord> got = s.GetDataset(d.name); !got.ok()) {
      Fail("GetDataset", got.status());
    }
  });
  store->reset();
  if (!dir.empty()) std::filesystem::remove_all(dir);
  *out = {{"store", url.substr(0, url.find(':'))},
          {"heartbeats_per_s", c.heartbeats_per_s},
          {"nodes_version_per_s", c.versions_per_s},
          {"list_nodes_per_s", c.list_nodes_per_s},
          {"get_dataset_per_s", c.get_dataset_per_s}};
  return c;
}

nlohmann::json LoadJson(const Load& l, double utilization) {
  return {{"writes_per_s", l.writes},           {"nodes_version_per_s", l.versions},
          {"list_nodes_per_s", l.list_nodes},   {"node_records_per_s", l.node_records},
          {"other_reads_per_s", l.other_reads}, {"event_deliveries_per_s", l.event_deliveries},
          {"share_of_one_store", utilization}};
}

nlohmann::json StoreLoad(const Options& o) {
  const Load now = Asked(o, /*follow=*/true);
  const Load before = Asked(o, /*follow=*/false);
  nlohmann::json measured;
  const Capacity c = Measure(o, &measured);
  const double u_now = Utilization(now, c);
  const double u_before = Utilization(before, c);
  std::printf(
      "Metadata store at %u nodes, %u ranks (%u per sidecar), heartbeat every %.0f s, sidecar "
      "refresh every %.0f s, %.0f membership changes an hour, a full list at least every %.0f s:\n"
      "  measured on %s from one client: %.0f heartbeats/s, %.0f NodesVersion/s, %.0f "
      "ListNodes/s of %u nodes, %.0f GetDataset/s\n"
      "  asked, following the version: %.0f writes/s, %.0f NodesVersion/s, %.1f ListNodes/s "
      "(%.0f node records/s), %.0f other reads/s: %.0f%% of one store\n"
      "  asked, listing every refresh (before): %.0f ListNodes/s (%.0f node records/s): %.0f%% "
      "of one store\n"
      "  %.0f event deliveries/s while staging\n",
      o.nodes, o.ranks, o.ranks_per_sidecar, o.heartbeat_s, o.refresh_s, o.changes_per_hour,
      o.full_list_s, measured["store"].get<std::string>().c_str(), c.heartbeats_per_s,
      c.versions_per_s, c.list_nodes_per_s, o.nodes, c.get_dataset_per_s, now.writes, now.versions,
      now.list_nodes, now.node_records, now.other_reads, 100 * u_now, before.list_nodes,
      before.node_records, 100 * u_before, now.event_deliveries);
  return {{"asked", LoadJson(now, u_now)},
          {"asked_listing_every_refresh", LoadJson(before, u_before)},
          {"measured", measured}};
}

// ---- a sidecar's plan in memory ----

nlohmann::json PlanMemory(const Options& o) {
  const uint64_t per_chunk = std::max<uint64_t>(1, o.chunk_bytes / o.sample_bytes);
  std::vector<ChunkId> chunk_of(o.samples);
  for (uint64_t s = 0; s < o.samples; ++s) chunk_of[s] = static_cast<ChunkId>(s / per_chunk);
  const size_t rss0 = granary::bench::ProcessRssBytes();
  PlanSpec spec;
  spec.seed = 7;
  spec.world_size = o.ranks;
  spec.mode = PlanMode::kChunkwise;
  const auto t0 = SteadyClock::now();
  Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
  const double order_s = Seconds(t0, SteadyClock::now());
  if (!order.ok()) {
    std::fprintf(stderr, "scale_sim: plan: %s\n", order.status().ToString().c_str());
    std::exit(1);
  }
  const size_t rss1 = granary::bench::ProcessRssBytes();
  std::printf(
      "Plan per sidecar: the epoch order of %llu samples in %.2f s, %.0f MB (the manifest's "
      "memory: bench/manifest_bench --samples %llu)\n",
      static_cast<unsigned long long>(o.samples), order_s, static_cast<double>(rss1 - rss0) / 1e6,
      static_cast<unsigned long long>(o.samples));
  return {{"epoch_order_seconds", order_s},
          {"epoch_order_bytes", order->size() * sizeof(SampleId)},
          {"rss_growth_bytes", rss1 - rss0}};
}

}  // namespace
}  // namespace granary

int main(int argc, char** argv) {
  granary::Options o;
  CLI::App app("Granary at scale, simulated: placement, metadata-store load, plan memory");
  app.add_option("--nodes", o.nodes, "cache nodes")->check(CLI::Range(2u, 100000u));
  app.add_option("--samples", o.samples, "samples in the dataset")
      ->check(CLI::Range(uint64_t{1}, uint64_t{4'000'000'000}));
  app.add_option("--sample-bytes", o.sample_bytes, "mean sample size")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 34));
  app.add_option("--chunk-bytes", o.chunk_bytes, "chunk size")
      ->check(CLI::Range(uint64_t{1} << 16, uint64_t{1} << 34));
  app.add_option("--ranks", o.ranks, "training processes")->check(CLI::Range(1u, 1'000'000u));
  app.add_option("--ranks-per-sidecar", o.ranks_per_sidecar, "ranks sharing a sidecar (a pod)")
      ->check(CLI::Range(1u, 1024u));
  app.add_option("--store", o.store, "metadata store URL to measure (default: SQLite in /tmp)");
  app.add_option("--changes-per-hour", o.changes_per_hour,
                 "membership changes an hour (joins, leaves, restarts)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--full-list-s", o.full_list_s, "seconds between a reader's safety lists")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--seconds", o.seconds, "seconds per store measurement")
      ->check(CLI::Range(0.1, 600.0));
  app.add_option("--json", o.json, "also write the figures to this file");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json out = {{"nodes", o.nodes}, {"samples", o.samples}, {"ranks", o.ranks}};
  out["placement"] = granary::Placements(o);
  out["store"] = granary::StoreLoad(o);
  out["plan"] = granary::PlanMemory(o);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "scale_sim: cannot write %s\n", o.json.c_str());
      return 1;
    }
  }
  return 0;
}

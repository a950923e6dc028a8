// The records' helpers of metadata_store.h: phase, snapshot-by and event
// names, which nodes a dataset uses, progress summaries and a plan's PlanSpec.
// The backends, the URL parsing and the stored documents are in store/.

#include "granary/core/metadata_store.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "granary/core/names.h"
#include "granary/core/plan.h"

namespace granary {

namespace {

constexpr std::pair<DatasetPhase, std::string_view> kPhaseNames[] = {
    {DatasetPhase::kPending, "Pending"}, {DatasetPhase::kSnapshotting, "Snapshotting"},
    {DatasetPhase::kStaging, "Staging"}, {DatasetPhase::kReady, "Ready"},
    {DatasetPhase::kFailed, "Failed"},   {DatasetPhase::kDeleting, "Deleting"},
};

constexpr std::pair<SnapshotBy, std::string_view> kSnapshotByNames[] = {
    {SnapshotBy::kClient, "client"},
    {SnapshotBy::kPool, "pool"},
};

constexpr std::pair<EventKind, std::string_view> kEventKindNames[] = {
    {EventKind::kDataset, "dataset"},   {EventKind::kNode, "node"},
    {EventKind::kProgress, "progress"}, {EventKind::kPlan, "plan"},
    {EventKind::kResync, "resync"},
};

}  // namespace

// ---- public helpers ----

std::string_view DatasetPhaseName(DatasetPhase phase) {
  for (const auto& [p, name] : kPhaseNames) {
    if (p == phase) return name;
  }
  return "Unknown";
}

Result<DatasetPhase> ParseDatasetPhase(std::string_view name) {
  for (const auto& [p, n] : kPhaseNames) {
    if (n == name) return p;
  }
  return Status::InvalidArgument("unknown dataset phase " + Quoted(name) +
                                 "; use Pending, Snapshotting, Staging, Ready, Failed or Deleting");
}

std::string_view SnapshotByName(SnapshotBy by) {
  for (const auto& [b, name] : kSnapshotByNames) {
    if (b == by) return name;
  }
  return "unknown";
}

Result<SnapshotBy> ParseSnapshotBy(std::string_view name) {
  for (const auto& [b, n] : kSnapshotByNames) {
    if (n == name) return b;
  }
  return Status::InvalidArgument("unknown snapshot_by " + Quoted(name) +
                                 "; use client (whoever creates the dataset walks the source) or "
                                 "pool (a cache node of its pool does)");
}

std::string_view EventKindName(EventKind kind) {
  for (const auto& [k, name] : kEventKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

Result<EventKind> ParseEventKind(std::string_view name) {
  for (const auto& [k, kind_name] : kEventKindNames) {
    if (kind_name == name) return k;
  }
  return Status::InvalidArgument("unknown kind " + Quoted(name));
}

double ProgressSummary::fraction() const {
  if (total.bytes_kept() > 0) {
    return std::min(
        1.0, static_cast<double>(total.bytes_staged) / static_cast<double>(total.bytes_kept()));
  }
  if (total.chunks_kept() > 0) {
    return static_cast<double>(total.chunks_staged) / static_cast<double>(total.chunks_kept());
  }
  // Nothing to keep: complete if every node said so.
  return total.chunks_total > 0 && all_staged ? 1.0 : 0.0;
}

double ProgressSummary::resident_fraction() const {
  if (total.bytes_total == 0) return 0.0;
  return std::min(1.0,
                  static_cast<double>(total.bytes_staged) / static_cast<double>(total.bytes_total));
}

Status ValidateDatasetCacheSpec(const DatasetCacheSpec& cache) {
  if (cache.priority < kMinCachePriority || cache.priority > kMaxCachePriority) {
    return Status::InvalidArgument("spec.cache.priority " + std::to_string(cache.priority) +
                                   " is outside " + std::to_string(kMinCachePriority) + ".." +
                                   std::to_string(kMaxCachePriority) + " (default 0)");
  }
  if (cache.ttl_seconds > kMaxCacheTtlSeconds) {
    return Status::InvalidArgument("spec.cache.ttl_seconds " + std::to_string(cache.ttl_seconds) +
                                   " is more than ten years (" +
                                   std::to_string(kMaxCacheTtlSeconds) + " s); use 0 for no TTL");
  }
  if (cache.min_resident_percent > 100) {
    return Status::InvalidArgument("spec.cache.min_resident_percent " +
                                   std::to_string(cache.min_resident_percent) +
                                   " is outside 0..100");
  }
  return Status::Ok();
}

ProgressSummary SummarizeProgress(const std::map<std::string, StagingProgress>& progress,
                                  const std::vector<NodeRecord>& live_nodes) {
  ProgressSummary s;
  for (const NodeRecord& node : live_nodes) {
    auto it = progress.find(node.id);
    if (it == progress.end()) {
      s.all_staged = false;
      continue;
    }
    const StagingProgress& p = it->second;
    s.total.chunks_total += p.chunks_total;
    s.total.chunks_staged += p.chunks_staged;
    s.total.bytes_total += p.bytes_total;
    s.total.bytes_staged += p.bytes_staged;
    s.total.samples_failed += p.samples_failed;
    s.total.chunks_not_kept += std::min(p.chunks_not_kept, p.chunks_total);
    s.total.bytes_not_kept += std::min(p.bytes_not_kept, p.bytes_total);
    s.total.last_read_ms = std::max(s.total.last_read_ms, p.last_read_ms);
    s.all_staged = s.all_staged && p.chunks_staged >= p.chunks_kept();
    s.all_kept = s.all_kept && p.chunks_not_kept == 0;
    ++s.nodes_reporting;
  }
  return s;
}

Result<std::string> PlanRecordJson(const PlanRecord& p) {
  try {
    return nlohmann::json{
        {"plan_id", p.plan_id},
        {"seed", p.seed},
        {"first_epoch", p.first_epoch},
        {"world_size", p.world_size},
        {"batch_size", p.batch_size},
        {"drop_last", p.drop_last},
        {"mode", p.mode},
        {"window_chunks", p.window_chunks},
        {"registered_ms", p.registered_ms},
    }
        .dump();
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument("encode plan " + Quoted(p.plan_id) + ": " + e.what() +
                                   "; every text field must be valid UTF-8");
  }
}

Result<PlanSpec> ToPlanSpec(const PlanRecord& plan, uint64_t epoch, uint32_t rank) {
  const std::string what = "plan " + Quoted(plan.plan_id);
  Result<PlanMode> mode = ParsePlanMode(plan.mode);
  if (!mode.ok()) return mode.status().WithContext(what);
  PlanSpec spec;
  spec.seed = plan.seed;
  spec.epoch = epoch;
  spec.world_size = plan.world_size;
  spec.rank = rank;
  spec.batch_size = plan.batch_size;
  spec.drop_last = plan.drop_last;
  spec.mode = *mode;
  spec.window = plan.window_chunks;
  GRANARY_RETURN_IF_ERROR(ValidatePlanSpec(spec).WithContext(what));
  return spec;
}

// ---- shared by the backends ----

namespace {
// Whether `listed` (DatasetSpec::nodes: unset is every node) has `node_id`.
bool NodeListed(const std::optional<std::vector<std::string>>& listed, std::string_view node_id) {
  return !listed.has_value() || std::find(listed->begin(), listed->end(), node_id) != listed->end();
}
}  // namespace

std::vector<NodeRecord> DatasetNodes(const DatasetSpec& spec,
                                     const std::vector<NodeRecord>& pool_nodes) {
  return ListedNodes(spec.nodes, pool_nodes);
}

std::vector<NodeRecord> ListedNodes(const std::optional<std::vector<std::string>>& listed,
                                    const std::vector<NodeRecord>& pool_nodes) {
  if (!listed.has_value()) return pool_nodes;
  std::vector<NodeRecord> kept;
  for (const NodeRecord& n : pool_nodes) {
    if (NodeListed(listed, n.id)) kept.push_back(n);
  }
  return kept;
}

bool DatasetUsesNode(const DatasetSpec& spec, std::string_view node_id) {
  return NodeListed(spec.nodes, node_id);
}

Result<std::optional<std::vector<NodeRecord>>> NodeListFollower::Poll(
    MetadataStore& store, std::chrono::steady_clock::time_point now) {
  Result<uint64_t> version = store.NodesVersion();
  if (!version.ok()) {
    version_.reset();
    return version.status();
  }
  if (version_ == *version && now - listed_at_ < full_every_) {
    return std::optional<std::vector<NodeRecord>>();
  }
  Result<std::vector<NodeRecord>> nodes = store.ListNodes(pool_);
  if (!nodes.ok()) {
    version_.reset();
    return nodes.status();
  }
  version_ = *version;
  listed_at_ = now;
  ++lists_;
  return std::optional<std::vector<NodeRecord>>(std::move(*nodes));
}

bool MayReadDataset(const DatasetRecord& dataset, uint32_t uid, uint32_t gid,
                    const std::vector<uint32_t>& groups) {
  if (uid == 0 || uid == dataset.owner.uid) return true;
  const DatasetReaders& r = dataset.readers;
  auto granted = [](const std::vector<uint32_t>& sorted, uint32_t id) {
    return std::binary_search(sorted.begin(), sorted.end(), id);
  };
  if (granted(r.uids, uid) || granted(r.gids, gid)) return true;
  return std::any_of(groups.begin(), groups.end(),
                     [&](uint32_t group) { return granted(r.gids, group); });
}

}  // namespace granary

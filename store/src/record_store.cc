// RecordStore: the record-level half of both MetadataStore backends
// (record_store.h). Every message here is the one both backends gave before
// they shared it; the conformance suite holds them to it.

#include "record_store.h"

#include <algorithm>
#include <utility>

#include "granary/core/names.h"
#include "metadata_store_internal.h"

namespace granary::store_internal {

using std::chrono::milliseconds;

std::string RecordStore::Where(RecordKind kind, std::string_view name, std::string_view key) const {
  std::string record;
  switch (kind) {
    case RecordKind::kDataset:
      record = "dataset " + Quoted(name);
      break;
    case RecordKind::kNode:
      record = "node " + Quoted(name);
      break;
    case RecordKind::kProgress:
      record = "progress of dataset " + Quoted(name) + " on node " + Quoted(key);
      break;
    case RecordKind::kPlan:
      record = "plan " + Quoted(key) + " of dataset " + Quoted(name);
      break;
  }
  return record + " (" + Location(kind, name, key) + ") in " + url();
}

Result<DatasetRecord> RecordStore::Decode(const DatasetRow& row) const {
  return DecodeDataset(row.record, row.name, row.revision, row.created_ms,
                       Where(RecordKind::kDataset, row.name));
}

// ---- datasets ----

Result<DatasetRecord> RecordStore::CreateDataset(const DatasetRecord& record) {
  GRANARY_RETURN_IF_ERROR(ValidateDataset(record));
  const std::string what = "create dataset " + Quoted(record.name);
  DatasetRecord stored = record;
  stored.created_ms = stored.updated_ms = clock_->NowMillis();
  stored.revision = 1;
  GRANARY_ASSIGN_OR_RETURN(std::string json, EncodeDataset(stored));
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(bool inserted, InsertDataset(what, record.name, stored.created_ms, json,
                                                        {EventKind::kDataset, record.name}));
  if (!inserted) {
    return Status::AlreadyExists(what + " in " + url() +
                                 ": it already exists; pick another name, or read and update it");
  }
  return stored;
}

Result<DatasetRecord> RecordStore::GetDataset(std::string_view name) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(name));
  const std::string what = "get dataset " + Quoted(name);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(std::optional<DatasetRow> row, ReadDataset(what, name));
  if (!row) {
    return Status::NotFound(what + " from " + url() +
                            ": it does not exist; check the name against the dataset list");
  }
  return Decode(*row);
}

Result<std::vector<DatasetRecord>> RecordStore::ListDatasets() {
  std::vector<DatasetRecord> out;
  auto add = [&](const DatasetRow& row) -> Status {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord r, Decode(row));
    out.push_back(std::move(r));
    return Status::Ok();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    GRANARY_RETURN_IF_ERROR(ReadDatasets("list datasets", add));
  }
  std::sort(out.begin(), out.end(),
            [](const DatasetRecord& a, const DatasetRecord& b) { return a.name < b.name; });
  return out;
}

Result<DatasetRecord> RecordStore::UpdateDataset(const DatasetRecord& record) {
  GRANARY_RETURN_IF_ERROR(ValidateDataset(record));
  const std::string what = "update dataset " + Quoted(record.name);
  DatasetRecord stored = record;
  stored.updated_ms = clock_->NowMillis();
  stored.revision = record.revision + 1;
  GRANARY_ASSIGN_OR_RETURN(std::string json, EncodeDataset(stored));
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(DatasetSwap swap,
                           SwapDataset(what, record.name, record.revision, stored.revision, json,
                                       {EventKind::kDataset, record.name}));
  switch (swap.outcome) {
    case DatasetSwap::Outcome::kAbsent:
      return Status::NotFound(what + " in " + url() +
                              ": it does not exist (deleted?); create it again if it should");
    case DatasetSwap::Outcome::kRevisionDiffers:
      return Status::FailedPrecondition(what + " in " + url() + ": revision " +
                                        std::to_string(record.revision) +
                                        " was changed by someone else; re-read and retry");
    case DatasetSwap::Outcome::kSwapped:
      break;
  }
  stored.created_ms = swap.created_ms;
  return stored;
}

Status RecordStore::DeleteDataset(std::string_view name) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(name));
  const std::string what = "delete dataset " + Quoted(name);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(bool erased,
                           EraseDataset(what, name, {EventKind::kDataset, std::string(name)}));
  if (!erased) return Status::NotFound(what + " in " + url() + ": it does not exist");
  return Status::Ok();
}

// ---- manifests ----

Status RecordStore::PutManifest(std::string_view manifest_id, std::string_view bytes) {
  GRANARY_RETURN_IF_ERROR(ValidateManifestId(manifest_id));
  const std::string what = "put manifest " + Quoted(manifest_id);
  if (bytes.size() > kMaxManifestBytes) {
    return Status::InvalidArgument(
        what + ": " + std::to_string(bytes.size()) + " bytes is more than the limit of " +
        std::to_string(kMaxManifestBytes) + "; raise the chunk size or split the dataset");
  }
  std::lock_guard<std::mutex> lock(mu_);
  return WriteManifest(what, manifest_id, bytes);
}

Result<std::string> RecordStore::GetManifest(std::string_view manifest_id) {
  GRANARY_RETURN_IF_ERROR(ValidateManifestId(manifest_id));
  const std::string what = "get manifest " + Quoted(manifest_id);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(std::optional<std::string> bytes, ReadManifest(what, manifest_id));
  if (!bytes) {
    return Status::NotFound(what + " from " + url() +
                            ": it is not stored; snapshot the dataset again to rebuild it");
  }
  return std::move(*bytes);
}

// ---- nodes ----

Status RecordStore::Heartbeat(const NodeRecord& node, milliseconds ttl) {
  GRANARY_RETURN_IF_ERROR(ValidateNode(node));
  GRANARY_RETURN_IF_ERROR(ValidateNodeTtl(node.id, ttl));
  const std::string what = "heartbeat of node " + Quoted(node.id);
  std::lock_guard<std::mutex> lock(mu_);
  // Read the clock only once the store is ours: a heartbeat that waited for
  // another call must not write a stale time (an earlier expiry, or a
  // heartbeat_ms older than one already stored).
  const int64_t now = clock_->NowMillis();
  NodeRecord stored = node;
  stored.heartbeat_ms = now;
  GRANARY_ASSIGN_OR_RETURN(std::string json, EncodeNode(stored));
  return WriteNode(what, node, NodeIdentity(node), json, now, ttl, {EventKind::kNode, node.id});
}

Result<std::vector<NodeRecord>> RecordStore::ListNodes(std::string_view pool) {
  if (!pool.empty()) GRANARY_RETURN_IF_ERROR(ValidatePoolName(pool));
  std::vector<NodeRecord> out;
  auto add = [&](const NodeRow& row) -> Status {
    const std::string where = Where(RecordKind::kNode, row.id);
    GRANARY_ASSIGN_OR_RETURN(NodeRecord n, DecodeNode(row.record, row.id, where));
    if (row.pool_column && n.pool != *row.pool_column) {
      return CorruptRecord(where, "the pool column " + Quoted(*row.pool_column) +
                                      " differs from the record's pool " + Quoted(n.pool));
    }
    if (pool.empty() || n.pool == pool) out.push_back(std::move(n));
    return Status::Ok();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    GRANARY_RETURN_IF_ERROR(ReadNodes("list nodes", pool, add));
  }
  std::sort(out.begin(), out.end(),
            [](const NodeRecord& a, const NodeRecord& b) { return a.id < b.id; });
  return out;
}

Result<uint64_t> RecordStore::NodesVersion() {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadNodesVersion("read the nodes' version");
}

Status RecordStore::RemoveNode(std::string_view node_id) {
  GRANARY_RETURN_IF_ERROR(ValidateNodeId(node_id));
  const std::string what = "remove node " + Quoted(node_id);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(bool removed,
                           EraseNode(what, node_id, {EventKind::kNode, std::string(node_id)}));
  if (!removed) {
    return Status::NotFound(what + " from " + url() +
                            ": it is not live (never registered, removed, or its heartbeat "
                            "expired)");
  }
  return Status::Ok();
}

// ---- progress and plans ----

Status RecordStore::PutChild(std::string_view what, RecordKind kind, std::string_view dataset,
                             std::string_view key, const std::string& record, EventKind event) {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(
      bool written, WriteChild(what, kind, dataset, key, record, {event, std::string(dataset)}));
  if (!written) {
    return Status::NotFound(std::string(what) + " in " + url() + ": dataset " + Quoted(dataset) +
                            " does not exist; create it first");
  }
  return Status::Ok();
}

Result<std::map<std::string, std::string>> RecordStore::ListChildren(std::string_view what,
                                                                     RecordKind kind,
                                                                     std::string_view dataset) {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(auto children, ReadChildren(what, kind, dataset));
  if (!children) {
    return Status::NotFound(std::string(what) + " from " + url() + ": dataset " + Quoted(dataset) +
                            " does not exist");
  }
  return std::move(*children);
}

Status RecordStore::PutProgress(std::string_view dataset, std::string_view node_id,
                                const StagingProgress& progress) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(dataset));
  GRANARY_RETURN_IF_ERROR(ValidateNodeId(node_id));
  StagingProgress stored = progress;
  stored.updated_ms = clock_->NowMillis();
  GRANARY_ASSIGN_OR_RETURN(std::string json, EncodeProgress(stored));
  return PutChild("put progress of dataset " + Quoted(dataset) + " on node " + Quoted(node_id),
                  RecordKind::kProgress, dataset, node_id, json, EventKind::kProgress);
}

Result<std::map<std::string, StagingProgress>> RecordStore::ListProgress(std::string_view dataset) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(dataset));
  GRANARY_ASSIGN_OR_RETURN(auto raw, ListChildren("list progress of dataset " + Quoted(dataset),
                                                  RecordKind::kProgress, dataset));
  std::map<std::string, StagingProgress> out;
  for (const auto& [node, json] : raw) {
    GRANARY_ASSIGN_OR_RETURN(
        out[node], DecodeProgress(json, node, Where(RecordKind::kProgress, dataset, node)));
  }
  return out;
}

Status RecordStore::PutPlan(std::string_view dataset, const PlanRecord& plan) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(dataset));
  GRANARY_RETURN_IF_ERROR(ValidatePlan(plan));
  PlanRecord stored = plan;
  stored.registered_ms = clock_->NowMillis();
  GRANARY_ASSIGN_OR_RETURN(std::string json, EncodePlan(stored));
  return PutChild("put plan " + Quoted(plan.plan_id) + " of dataset " + Quoted(dataset),
                  RecordKind::kPlan, dataset, plan.plan_id, json, EventKind::kPlan);
}

Result<std::vector<PlanRecord>> RecordStore::ListPlans(std::string_view dataset) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(dataset));
  GRANARY_ASSIGN_OR_RETURN(auto raw, ListChildren("list plans of dataset " + Quoted(dataset),
                                                  RecordKind::kPlan, dataset));
  std::vector<PlanRecord> out;  // sorted: raw is a std::map by plan id
  for (const auto& [plan_id, json] : raw) {
    GRANARY_ASSIGN_OR_RETURN(PlanRecord plan,
                             DecodePlan(json, plan_id, Where(RecordKind::kPlan, dataset, plan_id)));
    out.push_back(std::move(plan));
  }
  return out;
}

Status RecordStore::DeletePlan(std::string_view dataset, std::string_view plan_id) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(dataset));
  GRANARY_RETURN_IF_ERROR(ValidatePlanId(plan_id));
  const std::string what = "delete plan " + Quoted(plan_id) + " of dataset " + Quoted(dataset);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_ASSIGN_OR_RETURN(PlanErase erased, ErasePlan(what, dataset, plan_id,
                                                       {EventKind::kPlan, std::string(dataset)}));
  switch (erased) {
    case PlanErase::kNoDataset:
      return Status::NotFound(what + " in " + url() + ": the dataset does not exist");
    case PlanErase::kNoPlan:
      return Status::NotFound(what + " in " + url() + ": no such plan; list the dataset's plans");
    case PlanErase::kErased:
      break;
  }
  return Status::Ok();
}

}  // namespace granary::store_internal

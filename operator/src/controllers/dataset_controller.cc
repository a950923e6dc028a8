// Dataset → a dataset in the pool's metadata store, and its status back.
// docs/kubernetes.md.

#include <cmath>
#include <set>

#include "controller_context.h"
#include "granary/core/log.h"
#include "granary/core/manifest.h"
#include "granary/core/names.h"
#include "granary/kube/base64.h"
#include "granary/operator/webhook_lookup.h"

namespace granary::kube {
namespace {

constexpr std::string_view kSnapshotAnnotation = "granary.io/snapshot";
// The start of the store message of a dataset whose grant was withdrawn.
constexpr std::string_view kWithdrawn = "the namespace no longer grants this identity: ";

std::string DatasetPath(const std::string& ns, const std::string& name) {
  return "/apis/granary.io/v1alpha1/namespaces/" + ns + "/datasets/" + name;
}

// Files, bytes and chunks of a manifest, decoded once per manifest id.
struct ManifestSummary {
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
};

Result<ManifestSummary> SummaryOf(MetadataStore& store, const std::string& id) {
  static std::mutex mu;
  static std::map<std::string, ManifestSummary> cache;
  {
    std::lock_guard lock(mu);
    if (auto it = cache.find(id); it != cache.end()) return it->second;
  }
  GRANARY_ASSIGN_OR_RETURN(std::string blob, store.GetManifest(id));
  GRANARY_ASSIGN_OR_RETURN(Manifest manifest, Manifest::Decode(blob));
  ManifestSummary s{manifest.sample_count(), manifest.total_bytes(), manifest.chunk_count()};
  std::lock_guard lock(mu);
  if (cache.size() > 4096) cache.clear();
  cache[id] = s;
  return s;
}

// Sets Ready (and the others) False with `reason`, records an Event, and
// patches the status; nothing is staged.
Result<std::chrono::milliseconds> Refuse(ControllerContext& c, const Json& object,
                                         const std::string& reason, const Status& why) {
  const int64_t generation = object["metadata"].value("generation", 0);
  Json status = object.value("status", Json::object());
  Json conditions = status.value("conditions", Json::array());
  const std::string now = NowRfc3339();
  SetCondition(conditions, "Ready", false, reason, why.message(), generation, now);
  status["conditions"] = conditions;
  status["observedGeneration"] = generation;
  status["message"] = why.message();
  if (!status.contains("phase")) status["phase"] = "Pending";
  c.Event(object, "Warning", reason, why.message());
  const std::string ns = object["metadata"].value("namespace", "");
  const std::string name = object["metadata"].value("name", "");
  if (status != object.value("status", Json::object())) {
    GRANARY_RETURN_IF_ERROR(
        c.client().MergePatch(DatasetPath(ns, name) + "/status", {{"status", status}}).status());
  }
  return c.options().ready_interval;
}

Status SetFinalizers(ControllerContext& c, const Json& object, const Json& finalizers) {
  const Json& meta = object["metadata"];
  return c.SetFinalizers(DatasetPath(meta.value("namespace", ""), meta.value("name", "")), object,
                         finalizers);
}

DatasetSpec DesiredSpec(const Dataset& d, std::optional<uint64_t> max_resident_bytes) {
  DatasetSpec spec;
  spec.source_uri = "file://" + d.source;
  spec.include = d.include;
  spec.exclude = d.exclude;
  spec.chunk_size = d.chunk_size;
  spec.pool = d.pool;
  spec.replication = d.replication;
  spec.nodes = d.nodes;
  spec.snapshot_by = SnapshotBy::kPool;
  spec.kubernetes_namespace = d.namespace_;
  spec.cache = d.cache;
  spec.cache.max_resident_bytes = max_resident_bytes;
  return spec;
}

// Sizes in messages as the printer columns and the spec write them (10Gi).
std::string Bytes(uint64_t bytes) { return QuantityString(bytes); }

// What the namespace's quota in the pool leaves this Dataset: nullopt when
// the pool sets no quota for the namespace.
struct QuotaView {
  uint64_t quota = 0;
  uint64_t wanted = 0;  // the namespace's Datasets of known size in the pool, replicas counted
  std::optional<uint64_t> own;  // this one's size, replicas counted (nullopt before its snapshot)
  QuotaShare share;
};

// The size of a Dataset as its status says (totalBytes × replication), for
// the peers of the one reconciled; nullopt before its first snapshot.
std::optional<uint64_t> StatusSize(const Json& object) {
  const Json& status = object.value("status", Json::object());
  if (!status.is_object() || !status.contains("totalBytes") ||
      !status["totalBytes"].is_number_unsigned() || status.value("manifestId", "").empty()) {
    return std::nullopt;
  }
  const Json& spec = object.value("spec", Json::object());
  const int64_t replication =
      spec.is_object() && spec.contains("replication") && spec["replication"].is_number_integer()
          ? spec["replication"].get<int64_t>()
          : 1;
  return status["totalBytes"].get<uint64_t>() *
         static_cast<uint64_t>(std::max<int64_t>(1, replication));
}

std::optional<QuotaView> QuotaOf(ControllerContext& c, const CachePool& pool, const Dataset& d,
                                 std::optional<uint64_t> own_bytes) {
  const NamespaceQuota* quota = nullptr;
  for (const NamespaceQuota& q : pool.quotas) {
    if (q.namespace_ == d.namespace_) quota = &q;
  }
  if (quota == nullptr) return std::nullopt;
  QuotaView view;
  view.quota = quota->bytes;
  view.own = own_bytes;
  const std::string own_key = d.namespace_ + "/" + d.name;
  std::vector<QuotaClaim> claims;
  claims.push_back({own_key, d.cache.priority, d.creation_timestamp, own_bytes});
  c.datasets().Visit([&](const Json& object) {
    const Json& meta = object["metadata"];
    if (meta.value("namespace", "") != d.namespace_ || meta.contains("deletionTimestamp") ||
        object["spec"].value("cachePool", "") != pool.name) {
      return;
    }
    Result<Dataset> peer = ParseDataset(object);
    if (!peer.ok() || peer->name == d.name) return;
    claims.push_back({d.namespace_ + "/" + peer->name, peer->cache.priority,
                      peer->creation_timestamp, StatusSize(object)});
  });
  for (const QuotaClaim& claim : claims) view.wanted += claim.bytes.value_or(0);
  view.share = SplitQuota(view.quota, claims)[own_key];
  return view;
}

bool ManagedByUs(const Json& object) {
  return object["metadata"]
             .value("labels", Json::object())
             .value("app.kubernetes.io/managed-by", "") == kFieldManager;
}

// The copy of pool `pool`'s store Secret in namespace `ns`, which the
// injected sidecars read (SidecarStoreSecretName): owned by every Dataset of
// the pool in `ns` that is not being deleted, and deleted here with the last
// of them (the owner references let Kubernetes' garbage collector remove it
// too when the operator is not running). `url` null: keep the URL it has
// (a Dataset is being deleted). A Secret of that name that granary-operator
// did not make (an admin's) is left alone, with an Event on `object`.
Status SyncStoreCopy(ControllerContext& c, const Json& object, const std::string& ns,
                     const std::string& pool, const std::string* url) {
  // Pods in the operator's namespace get no sidecar; nothing is copied there.
  if (ns == c.options().namespace_) return Status::Ok();
  const std::string name = SidecarStoreSecretName(pool);
  const std::string path = "/api/v1/namespaces/" + ns + "/secrets/" + name;
  Json owners = Json::array();
  std::set<std::string> owner_uids;
  c.datasets().Visit([&](const Json& d) {
    const Json& meta = d["metadata"];
    if (meta.value("namespace", "") != ns || d["spec"].value("cachePool", "") != pool ||
        meta.contains("deletionTimestamp") || meta.value("uid", "").empty()) {
      return;
    }
    owners.push_back({{"apiVersion", std::string(kGroup) + "/" + std::string(kVersion)},
                      {"kind", "Dataset"},
                      {"name", meta.value("name", "")},
                      {"uid", meta.value("uid", "")}});
    owner_uids.insert(meta.value("uid", ""));
  });
  Result<Json> existing = c.Secret(ns, name);
  if (!existing.ok() && existing.status().code() != StatusCode::kNotFound) {
    return existing.status().WithContext("reading the store Secret copy " + ns + "/" + name);
  }
  if (existing.ok() && !ManagedByUs(*existing)) {
    c.Event(object, "Warning", "StoreSecretNotManaged",
            "the Secret " + ns + "/" + name +
                " was not made by granary-operator, so it is left as it is and the injected "
                "sidecars read the store URL from it; delete it to have the pool's copied there");
    return Status::Ok();
  }
  if (owners.empty()) {
    if (!existing.ok()) return Status::Ok();
    Status deleted = c.client().Delete(path);
    if (deleted.code() == StatusCode::kNotFound) return Status::Ok();
    return deleted.WithContext("deleting the store Secret copy " + ns + "/" + name +
                               " of the last Dataset of pool " + pool);
  }
  std::string encoded;
  if (url != nullptr) {
    encoded = Base64Encode(*url);
  } else if (existing.ok()) {
    encoded = existing->value("data", Json::object()).value("url", "");
  } else {
    return Status::Ok();  // the remaining Datasets' reconciles make it
  }
  if (existing.ok() && existing->value("data", Json::object()).value("url", "") == encoded) {
    std::set<std::string> current;
    for (const Json& r : (*existing)["metadata"].value("ownerReferences", Json::array())) {
      current.insert(r.value("uid", ""));
    }
    if (current == owner_uids) return Status::Ok();
  }
  Json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata",
                  {{"name", name},
                   {"namespace", ns},
                   {"labels",
                    {{"app.kubernetes.io/name", "granary-store"},
                     {"app.kubernetes.io/managed-by", std::string(kFieldManager)},
                     {"granary.io/pool", pool}}},
                   {"ownerReferences", owners}}},
                 {"type", "Opaque"},
                 {"data", {{"url", encoded}}}};
  return c.client()
      .Apply(path, secret, std::string(kFieldManager))
      .status()
      .WithContext("copying the store Secret of pool " + pool + " to " + ns + "/" + name);
}

Result<std::chrono::milliseconds> Release(ControllerContext& c, const Json& object,
                                          const Dataset& d, const std::string& gname) {
  if (std::find(d.finalizers.begin(), d.finalizers.end(), kFinalizer) == d.finalizers.end()) {
    return std::chrono::milliseconds(0);
  }
  // The copy first: a failure keeps the finalizer, and the copy is retried.
  GRANARY_RETURN_IF_ERROR(SyncStoreCopy(c, object, d.namespace_, d.pool, nullptr));
  std::optional<Json> pool_object = c.pools().Get(d.pool);
  Status released = Status::Ok();
  if (pool_object) {
    Result<CachePool> pool = ParseCachePool(*pool_object);
    Result<MetadataStore*> store =
        pool.ok() ? c.StoreFor(*pool) : Result<MetadataStore*>(pool.status());
    if (store.ok()) {
      released = (*store)->DeleteDataset(gname);
      if (released.code() == StatusCode::kNotFound) released = Status::Ok();
    } else {
      released = store.status();
    }
    // An unreachable store is retried: the finalizer stays until the record is gone.
    if (!released.ok() && released.code() != StatusCode::kInvalidArgument) return released;
  }
  if (!pool_object || !released.ok()) {
    c.Event(object, "Warning", "ReleaseSkipped",
            "CachePool " + Quoted(d.pool) + " is gone or unusable: the store record of dataset " +
                gname + " could not be deleted here; delete it with `granary dataset delete " +
                gname + "`");
  }
  Json finalizers = Json::array();
  for (const std::string& f : d.finalizers) {
    if (f != kFinalizer) finalizers.push_back(f);
  }
  GRANARY_RETURN_IF_ERROR(SetFinalizers(c, object, finalizers));
  return std::chrono::milliseconds(0);
}

}  // namespace

Result<std::chrono::milliseconds> ReconcileDataset(ControllerContext& c, const std::string& key) {
  std::optional<Json> found = c.datasets().Get(key);
  if (!found) return std::chrono::milliseconds(0);
  const Json& object = *found;
  const OperatorOptions& options = c.options();
  Result<Dataset> parsed = ParseDataset(object);
  if (!parsed.ok()) {
    // Without a parsable spec the store cannot be found; a deletion still
    // goes, with an Event naming what may be left.
    if (object["metadata"].contains("deletionTimestamp")) {
      const Json& meta = object["metadata"];
      const std::string left =
          GranaryDatasetName(meta.value("namespace", ""), meta.value("name", ""));
      c.Event(object, "Warning", "ReleaseSkipped",
              "the spec cannot be read (" + parsed.status().message() +
                  "), so a store record of dataset " + left +
                  " may be left; delete it with `granary dataset delete " + left + "`");
      Json finalizers = Json::array();
      for (const Json& f : object["metadata"].value("finalizers", Json::array())) {
        if (f != kFinalizer) finalizers.push_back(f);
      }
      GRANARY_RETURN_IF_ERROR(SetFinalizers(c, object, finalizers));
      return std::chrono::milliseconds(0);
    }
    return Refuse(c, object, "InvalidSpec", parsed.status());
  }
  const Dataset& d = *parsed;
  const std::string gname = GranaryDatasetName(d.namespace_, d.name);
  if (d.deleting) return Release(c, object, d, gname);
  if (std::find(d.finalizers.begin(), d.finalizers.end(), kFinalizer) == d.finalizers.end()) {
    Json finalizers = object["metadata"].value("finalizers", Json::array());
    finalizers.push_back(kFinalizer);
    GRANARY_RETURN_IF_ERROR(SetFinalizers(c, object, finalizers));
    return std::chrono::milliseconds(0);  // the update comes back through the watch
  }

  std::optional<Json> pool_object = c.pools().Get(d.pool);
  if (!pool_object) {
    return Refuse(c, object, "PoolNotFound",
                  Status::NotFound("spec.cachePool: CachePool " + Quoted(d.pool) +
                                   " does not exist; `kubectl get cachepools` lists them"));
  }
  Result<CachePool> pool = ParseCachePool(*pool_object);
  if (!pool.ok()) return Refuse(c, object, "PoolInvalid", pool.status());
  Result<SourceMount> mount = MountOf(*pool, d.source);
  if (!mount.ok()) return Refuse(c, object, "SourceNotMounted", mount.status());
  // The mount is in the pool's spec but its cache nodes cannot mount it
  // (the pool's reconcile read that from the kubelet): nothing can be read.
  if (std::optional<CacheNodeTrouble> trouble = c.LastCacheNodeTrouble(d.pool);
      trouble && trouble->reason == kSourceMountFailed && trouble->source_mount == mount->name) {
    std::string mounts;
    for (const SourceMount& m : pool->source_mounts) {
      mounts += (mounts.empty() ? "" : ", ") + Quoted(m.name) + " (" +
                (m.host_path.empty() ? "claim " + m.pvc_claim : m.host_path) + " at " +
                m.mount_path + ")";
    }
    return Refuse(
        c, object, std::string(kSourceMountFailed),
        Status::FailedPrecondition("spec.source " + Quoted(d.source) + " is under source mount " +
                                   Quoted(mount->name) + " of CachePool " + Quoted(d.pool) +
                                   " (its sourceMounts: " + mounts +
                                   "), which its cache nodes cannot mount: " + trouble->message));
  }
  Result<Json> ns = c.Namespace(d.namespace_);
  if (!ns.ok()) return ns.status();
  Status granted = CheckGrant(*ns, d.run_as_uid, d.run_as_gid);
  // The pool's Secret is read once per reconcile: for the store and the copy.
  Result<std::string> url = c.StoreUrl(*pool);
  Result<MetadataStore*> store_or =
      url.ok() ? c.StoreAt(*url, *pool) : Result<MetadataStore*>(url.status());
  if (!granted.ok()) {
    // A grant withdrawn after the dataset was made: its cache nodes stop
    // staging it as that identity (Failed keeps its chunks until it is
    // deleted; granted again, it is snapshotted afresh).
    if (store_or.ok()) {
      Result<DatasetRecord> existing = (*store_or)->GetDataset(gname);
      if (existing.ok() && existing->state.phase != DatasetPhase::kFailed) {
        DatasetRecord update = *existing;
        update.state = DatasetState();
        update.state.phase = DatasetPhase::kFailed;
        update.state.message = std::string(kWithdrawn) + granted.message();
        GRANARY_RETURN_IF_ERROR((*store_or)->UpdateDataset(update).status());
      }
    }
    return Refuse(c, object, "IdentityNotGranted", granted);
  }
  if (url.ok()) GRANARY_RETURN_IF_ERROR(SyncStoreCopy(c, object, d.namespace_, d.pool, &*url));
  if (!store_or.ok()) return Refuse(c, object, "StoreUnavailable", store_or.status());
  MetadataStore& store = **store_or;

  // The store record: created once, then kept in step with the spec, the
  // byte limit from the namespace's quota included.
  const DatasetOwner owner{d.run_as_uid, d.run_as_gid};
  const std::string snapshot_request = object["metadata"]
                                           .value("annotations", Json::object())
                                           .value(std::string(kSnapshotAnnotation), "");
  Json status = object.value("status", Json::object());
  Result<DatasetRecord> record = store.GetDataset(gname);
  bool created = false;
  // Its size, replicas counted, once a snapshot says (from the manifest).
  std::optional<uint64_t> own_bytes;
  if (record.ok() && !record->manifest_id.empty() &&
      (record->state.phase == DatasetPhase::kStaging ||
       record->state.phase == DatasetPhase::kReady)) {
    Result<ManifestSummary> summary = SummaryOf(store, record->manifest_id);
    if (!summary.ok()) return summary.status();
    own_bytes = summary->bytes * d.replication;
  }
  const std::optional<QuotaView> quota = QuotaOf(c, *pool, d, own_bytes);
  const DatasetSpec desired =
      DesiredSpec(d, quota ? std::optional<uint64_t>(quota->share.limit) : std::nullopt);
  if (!record.ok() && record.status().code() == StatusCode::kNotFound) {
    DatasetRecord fresh;
    fresh.name = gname;
    fresh.spec = desired;
    fresh.owner = owner;
    fresh.state.phase = DatasetPhase::kPending;
    fresh.state.message = "created by granary-operator for Dataset " + d.namespace_ + "/" + d.name;
    record = store.CreateDataset(fresh);
    created = record.ok();
    if (record.ok()) {
      c.Event(object, "Normal", "Created",
              "dataset " + gname + " created in the metadata store; the cache nodes of pool " +
                  d.pool + " take its snapshot");
    } else if (record.status().code() == StatusCode::kAlreadyExists) {
      record = store.GetDataset(gname);
    }
  }
  if (!record.ok()) return record.status();
  const bool bytes_changed =
      record->spec.source_uri != desired.source_uri || record->spec.include != desired.include ||
      record->spec.exclude != desired.exclude || record->spec.chunk_size != desired.chunk_size ||
      record->spec.snapshot_by != desired.snapshot_by || record->owner != owner;
  const bool placement_changed = record->spec != desired;
  // A new value of the annotation asks for a snapshot; one asked while a
  // snapshot is pending or under way is acted on after it.
  const bool regranted =
      record->state.phase == DatasetPhase::kFailed && record->state.message.starts_with(kWithdrawn);
  const bool resnapshot = regranted || (!created && !snapshot_request.empty() &&
                                        snapshot_request != status.value("snapshotRequest", "") &&
                                        record->state.phase != DatasetPhase::kSnapshotting &&
                                        record->state.phase != DatasetPhase::kPending);
  if (bytes_changed || placement_changed || resnapshot) {
    DatasetRecord update = *record;
    update.spec = desired;
    update.owner = owner;
    if (bytes_changed || resnapshot) {
      update.state = DatasetState();
      update.state.phase = DatasetPhase::kPending;
      update.state.message = bytes_changed ? "the spec changed the bytes: a new snapshot"
                             : regranted   ? "the identity is granted again: a new snapshot"
                                           : "a new snapshot was asked for";
    }
    Result<DatasetRecord> updated = store.UpdateDataset(update);
    if (!updated.ok()) return updated.status();  // a conflict: retried
    record = updated;
    if (bytes_changed || resnapshot) {
      c.Event(object, "Normal", "Resnapshot", update.state.message);
    }
  }
  if (!snapshot_request.empty() && (created || resnapshot)) {
    status["snapshotRequest"] = snapshot_request;
  }

  // Status from the store: the record, the manifest and verified progress.
  const DatasetRecord& r = *record;
  const int64_t generation = d.generation;
  const std::string now = NowRfc3339();
  const std::string old_phase = status.value("phase", "");
  const std::string phase(DatasetPhaseName(r.state.phase));
  Json conditions = status.value("conditions", Json::array());
  status["phase"] = phase;
  status["message"] = r.state.message;
  status["granaryName"] = gname;
  status["observedGeneration"] = generation;
  const bool snapshotted = !r.manifest_id.empty() && (r.state.phase == DatasetPhase::kStaging ||
                                                      r.state.phase == DatasetPhase::kReady);
  bool all_kept = true;
  if (snapshotted) {
    Result<ManifestSummary> summary = SummaryOf(store, r.manifest_id);
    if (!summary.ok()) return summary.status();
    Result<std::vector<NodeRecord>> nodes = store.ListNodes(d.pool);
    if (!nodes.ok()) return nodes.status();
    Result<std::map<std::string, StagingProgress>> progress = store.ListProgress(gname);
    if (!progress.ok()) return progress.status();
    const ProgressSummary p = SummarizeProgress(*progress, *nodes);
    if (status.value("manifestId", "") != r.manifest_id) status["lastSnapshotTime"] = now;
    status["manifestId"] = r.manifest_id;
    status["files"] = summary->files;
    status["totalBytes"] = summary->bytes;
    status["total"] = QuantityString(summary->bytes);
    status["stagedBytes"] = p.total.bytes_staged;
    status["cached"] = QuantityString(p.total.bytes_staged);
    status["stagedPercent"] = static_cast<int64_t>(std::floor(p.fraction() * 100.0));
    status["nodes"] = p.nodes_reporting;
    status["samplesFailed"] = p.total.samples_failed;
    const int64_t resident = static_cast<int64_t>(std::floor(p.resident_fraction() * 100.0));
    status["residentPercent"] = resident;
    status["resident"] = std::to_string(resident) + "%";
    all_kept = p.all_kept;
  }
  switch (r.state.phase) {
    case DatasetPhase::kPending:
    case DatasetPhase::kSnapshotting:
      SetCondition(conditions, "Snapshotted", false, phase, r.state.message, generation, now);
      SetCondition(conditions, "Staged", false, "NotSnapshotted", "waiting for the snapshot",
                   generation, now);
      break;
    case DatasetPhase::kFailed:
      SetCondition(conditions, "Snapshotted", false, "Failed", r.state.message, generation, now);
      SetCondition(conditions, "Staged", false, "Failed", r.state.message, generation, now);
      break;
    default:
      SetCondition(conditions, "Snapshotted", true, "Snapshotted",
                   "manifest " + r.manifest_id.substr(0, 12), generation, now);
      // Ready with part of it kept: what the nodes keep is staged, the rest
      // is streamed from the source (the cache nodes' message says how much).
      SetCondition(conditions, "Staged", r.state.phase == DatasetPhase::kReady,
                   r.state.phase != DatasetPhase::kReady ? "Staging"
                   : all_kept                            ? "Staged"
                                                         : "PartlyResident",
                   r.state.message, generation, now);
  }
  if (!quota) {
    SetCondition(conditions, "QuotaExceeded", false, "NoQuota",
                 "CachePool " + d.pool + " sets no quota for namespace " + d.namespace_, generation,
                 now);
  } else {
    const std::string head = "namespace " + d.namespace_ + "'s quota in pool " + d.pool + " is " +
                             Bytes(quota->quota) + " and its datasets need " + Bytes(quota->wanted);
    if (!quota->own) {
      SetCondition(conditions, "QuotaExceeded", false, "SizeUnknown",
                   head + ": this one may keep " + Bytes(quota->share.limit) +
                       ", and its size is known after its snapshot",
                   generation, now);
    } else if (quota->share.exceeded) {
      const uint64_t percent =
          *quota->own == 0
              ? 0
              : static_cast<uint64_t>(std::floor(100.0 * static_cast<double>(quota->share.limit) /
                                                 static_cast<double>(*quota->own)));
      const std::string message = head + ": this one keeps " + Bytes(quota->share.limit) +
                                  " of its " + Bytes(*quota->own) + " (" + std::to_string(percent) +
                                  "%); the rest is streamed from the source";
      bool was = false;
      for (const Json& cond : conditions) {
        if (cond.value("type", "") == "QuotaExceeded") was = cond.value("status", "") == "True";
      }
      if (!was) c.Event(object, "Warning", "QuotaExceeded", message);
      SetCondition(conditions, "QuotaExceeded", true, "QuotaExceeded", message, generation, now);
    } else {
      SetCondition(conditions, "QuotaExceeded", false, "WithinQuota",
                   head + ": this one keeps all of its " + Bytes(*quota->own), generation, now);
    }
  }
  const bool ready = r.state.phase == DatasetPhase::kReady;
  std::string ready_reason = ready ? "Ready" : phase;
  std::string ready_message = r.state.message;
  // Pending with no cache node of the pool running, and the kubelet saying
  // why: nothing will take the snapshot until the pool is fixed.
  const Json& pool_status = pool_object->value("status", Json::object());
  if (std::optional<CacheNodeTrouble> trouble = c.LastCacheNodeTrouble(d.pool);
      trouble && r.state.phase == DatasetPhase::kPending && pool_status.is_object() &&
      pool_status.value("nodesReady", int64_t{0}) == 0) {
    ready_reason = kCacheNodesNotRunning;
    ready_message = "no cache node of CachePool " + Quoted(d.pool) +
                    " runs, so none takes this Dataset's snapshot: " + trouble->message;
    bool was = false;
    for (const Json& cond : conditions) {
      was = was || (cond.value("type", "") == "Ready" &&
                    cond.value("reason", "") == kCacheNodesNotRunning);
    }
    if (!was) c.Event(object, "Warning", std::string(kCacheNodesNotRunning), ready_message);
  }
  SetCondition(conditions, "Ready", ready, ready_reason, ready_message, generation, now);
  status["conditions"] = conditions;
  if (status != object.value("status", Json::object())) {
    GRANARY_RETURN_IF_ERROR(
        c.client()
            .MergePatch(DatasetPath(d.namespace_, d.name) + "/status", {{"status", status}})
            .status());
  }
  // The pool took chunks of a Ready dataset for others (the cache nodes'
  // cache policy): say so where its users look.
  const Json& old_status = object.value("status", Json::object());
  if (phase == old_phase && r.state.phase == DatasetPhase::kReady &&
      old_status.contains("residentPercent") && status.contains("residentPercent") &&
      status["residentPercent"].get<int64_t>() < old_status["residentPercent"].get<int64_t>()) {
    c.Event(object, "Normal", "Evicted",
            "now " + status["resident"].get<std::string>() + " resident (was " +
                std::to_string(old_status["residentPercent"].get<int64_t>()) +
                "%): the cache nodes gave its space to datasets ranked above it, a quota or its "
                "TTL; the rest is streamed from the source. " +
                r.state.message);
  }
  if (phase != old_phase) {
    if (r.state.phase == DatasetPhase::kReady) {
      c.Event(object, "Normal", "Ready", r.state.message);
    } else if (r.state.phase == DatasetPhase::kFailed) {
      c.Event(object, "Warning", "Failed", r.state.message);
    } else if (r.state.phase == DatasetPhase::kStaging && snapshotted) {
      c.Event(object, "Normal", "Snapshotted", r.state.message);
    }
  }
  return ready ? options.ready_interval : options.progress_interval;
}

}  // namespace granary::kube

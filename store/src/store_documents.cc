// What the two backends share (metadata_store_internal.h): validation of whole
// records, the JSON documents they are stored as (docs/metadata-store.md,
// "Records"), retry backoff and message helpers.

#include <algorithm>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "granary/core/glob.h"
#include "granary/core/manifest.h"
#include "granary/core/names.h"
#include "granary/core/plan.h"
#include "metadata_store_internal.h"

namespace granary {

namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using store_internal::CorruptRecord;

// Throws nlohmann's type_error on invalid UTF-8; callers catch at the boundary.
std::string Dump(const json& j) { return j.dump(); }

template <typename Fn>
Result<std::string> EncodeJson(std::string_view what, Fn&& build) {
  try {
    return Dump(build());
  } catch (const json::exception& e) {
    return Status::InvalidArgument("encode " + std::string(what) + ": " + e.what() +
                                   "; every text field must be valid UTF-8");
  }
}

// Parses `text` and runs `fill` on it; a parse error, a missing field
// (nlohmann throws) or an error `fill` returns becomes kCorruption at `where`.
template <typename T, typename Fn>
Result<T> DecodeJson(std::string_view text, std::string_view where, Fn&& fill) {
  try {
    json j = json::parse(text);
    if (!j.is_object()) return CorruptRecord(where, "the document is not a JSON object");
    Result<T> r = fill(j);
    if (!r.ok()) return CorruptRecord(where, r.status().message());
    return r;
  } catch (const json::exception& e) {
    return CorruptRecord(where, e.what());
  }
}

// Typed field readers for decoding. nlohmann's get<T>() converts silently
// (4294967296 becomes a uint32_t 0, -1 a uint64_t 2^64-1, 2.5 an integer 2),
// so each reader checks the JSON type and the range first. `path` names the
// field in messages. A missing key throws, which DecodeJson reports.

template <typename T>
Result<T> IntField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (std::in_range<T>(i)) return static_cast<T>(i);
  }
  return Status::InvalidArgument(std::string(path) + " is " + Quoted(v.dump()) +
                                 ", not an integer from " +
                                 std::to_string(std::numeric_limits<T>::min()) + " to " +
                                 std::to_string(std::numeric_limits<T>::max()));
}

Result<std::string> StringField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (!v.is_string()) {
    return Status::InvalidArgument(std::string(path) + " is " + Quoted(v.dump()) +
                                   ", not a string");
  }
  return v.get<std::string>();
}

Result<bool> BoolField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (!v.is_boolean()) {
    return Status::InvalidArgument(std::string(path) + " is " + Quoted(v.dump()) +
                                   ", not true or false");
  }
  return v.get<bool>();
}

Result<const json*> ObjectField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  if (!v.is_object()) return Status::InvalidArgument(std::string(path) + " is not an object");
  return &v;
}

Result<std::vector<std::string>> StringListField(const json& obj, const char* key,
                                                 std::string_view path) {
  const json& v = obj.at(key);
  bool ok = v.is_array();
  for (size_t i = 0; ok && i < v.size(); ++i) ok = v[i].is_string();
  if (!ok) return Status::InvalidArgument(std::string(path) + " is not a list of strings");
  return v.get<std::vector<std::string>>();
}

Result<std::vector<uint32_t>> IdListField(const json& obj, const char* key, std::string_view path) {
  const json& v = obj.at(key);
  bool ok = v.is_array();
  for (size_t i = 0; ok && i < v.size(); ++i) {
    ok = v[i].is_number_unsigned() && std::in_range<uint32_t>(v[i].get<uint64_t>());
  }
  if (!ok) return Status::InvalidArgument(std::string(path) + " is not a list of uids or gids");
  return v.get<std::vector<uint32_t>>();
}

Result<std::map<std::string, std::string>> StringMapField(const json& obj, const char* key,
                                                          std::string_view path) {
  const json& v = obj.at(key);
  bool ok = v.is_object();
  for (auto it = v.begin(); ok && it != v.end(); ++it) ok = it->is_string();
  if (!ok) {
    return Status::InvalidArgument(std::string(path) + " is not an object of string values");
  }
  return v.get<std::map<std::string, std::string>>();
}

Status KeyMismatch(std::string_view field, std::string_view value, std::string_view key) {
  return Status::InvalidArgument(std::string(field) + " is " + Quoted(value) +
                                 " but the record is stored under " + Quoted(key));
}

}  // namespace

namespace store_internal {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

bool ParseDecimal(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v > max) return false;
  *out = v;
  return true;
}

Status CorruptRecord(std::string_view where, std::string_view problem) {
  return Status::Corruption("decode " + std::string(where) + ": " + std::string(problem) +
                            "; it was written by an incompatible Granary version or edited by "
                            "hand: rewrite or delete it");
}

Backoff::Backoff(milliseconds budget, milliseconds first, milliseconds max)
    : start_(steady_clock::now()), deadline_(start_ + budget), delay_(first), max_(max) {}

Backoff::Backoff(steady_clock::time_point deadline)
    : start_(steady_clock::now()), deadline_(deadline), delay_(kDefaultFirst), max_(kDefaultMax) {}

bool Backoff::Wait() {
  const auto now = steady_clock::now();
  if (now >= deadline_) return false;
  std::this_thread::sleep_for(std::min<steady_clock::duration>(delay_, deadline_ - now));
  delay_ = std::min(delay_ * 2, max_);
  ++retries_;
  return true;
}

milliseconds Backoff::remaining() const {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline_ - steady_clock::now()));
}

std::string Backoff::Summary() const {
  return std::to_string(retries_ + 1) + " attempts in " +
         FormatDuration(std::chrono::duration_cast<milliseconds>(steady_clock::now() - start_));
}

std::string FormatDuration(std::chrono::milliseconds d) {
  if (d.count() < 1000) return std::to_string(d.count()) + " ms";
  auto tenths = d.count() / 100;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}

Status ValidateDataset(const DatasetRecord& record) {
  GRANARY_RETURN_IF_ERROR(ValidateDatasetName(record.name));
  const std::string what = "dataset " + Quoted(record.name) + ": ";
  const DatasetSpec& spec = record.spec;
  if (spec.source_uri.empty()) {
    return Status::InvalidArgument(what +
                                   "spec.source_uri is empty; name the data, e.g. "
                                   "file:///lustre/imagenet/train");
  }
  if (spec.chunk_size < kMinChunkSize || spec.chunk_size > kMaxChunkSize) {
    return Status::InvalidArgument(what + "spec.chunk_size " + std::to_string(spec.chunk_size) +
                                   " is outside " + std::to_string(kMinChunkSize) + ".." +
                                   std::to_string(kMaxChunkSize) + " bytes (default " +
                                   std::to_string(kDefaultChunkSize) + ")");
  }
  GRANARY_RETURN_IF_ERROR(ValidatePoolName(spec.pool).WithContext(what + "spec.pool"));
  if (spec.replication < 1 || spec.replication > 16) {
    return Status::InvalidArgument(what + "spec.replication " + std::to_string(spec.replication) +
                                   " is outside 1..16");
  }
  if (spec.nodes.has_value()) {
    if (spec.nodes->size() > kMaxDatasetNodes) {
      return Status::InvalidArgument(what + "spec.nodes lists " +
                                     std::to_string(spec.nodes->size()) + " nodes, more than " +
                                     std::to_string(kMaxDatasetNodes));
    }
    std::vector<std::string> sorted = *spec.nodes;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      GRANARY_RETURN_IF_ERROR(ValidateNodeId(sorted[i]).WithContext(what + "spec.nodes"));
      if (i > 0 && sorted[i] == sorted[i - 1]) {
        return Status::InvalidArgument(what + "spec.nodes names node " + Quoted(sorted[i]) +
                                       " twice");
      }
    }
  }
  // Compiled here so a bad glob is refused when the dataset is created, not
  // when a cache node first snapshots it.
  for (const auto& [globs, field] :
       {std::pair{&spec.include, "spec.include"}, std::pair{&spec.exclude, "spec.exclude"}}) {
    Result<GlobSet> compiled = GlobSet::Compile(*globs);
    if (!compiled.ok()) {
      return Status::InvalidArgument(what + field + ": " + compiled.status().message());
    }
  }
  if (DatasetPhaseName(record.state.phase) == "Unknown") {
    return Status::InvalidArgument(what + "state.phase " +
                                   std::to_string(static_cast<int>(record.state.phase)) +
                                   " is not a DatasetPhase");
  }
  if (SnapshotByName(spec.snapshot_by) == "unknown") {
    return Status::InvalidArgument(what + "spec.snapshot_by " +
                                   std::to_string(static_cast<int>(spec.snapshot_by)) +
                                   " is not a SnapshotBy");
  }
  if (!record.state.claimed_by.empty()) {
    GRANARY_RETURN_IF_ERROR(
        ValidateNodeId(record.state.claimed_by).WithContext(what + "state.claimed_by"));
  }
  if (!spec.kubernetes_namespace.empty() && !IsDnsLabel(spec.kubernetes_namespace)) {
    return Status::InvalidArgument(what + "spec.namespace " + Quoted(spec.kubernetes_namespace) +
                                   " is not a Kubernetes namespace name (a DNS-1123 label)");
  }
  if (!record.manifest_id.empty()) {
    GRANARY_RETURN_IF_ERROR(ValidateManifestId(record.manifest_id).WithContext(what));
  }
  GRANARY_RETURN_IF_ERROR(
      ValidateDatasetCacheSpec(spec.cache).WithContext("dataset " + Quoted(record.name)));
  for (const auto& [ids, field] : {std::pair{&record.readers.uids, "readers.uids"},
                                   std::pair{&record.readers.gids, "readers.gids"}}) {
    if (ids->size() > kMaxDatasetReaders) {
      return Status::InvalidArgument(what + field + " lists " + std::to_string(ids->size()) +
                                     " ids, more than " + std::to_string(kMaxDatasetReaders) +
                                     "; grant a group instead of many users");
    }
    for (size_t i = 0; i < ids->size(); ++i) {
      if ((*ids)[i] == 0xffffffffu) {
        return Status::InvalidArgument(what + field + " holds 4294967295, which is no id");
      }
      if (i > 0 && (*ids)[i] <= (*ids)[i - 1]) {
        return Status::InvalidArgument(what + field + " is not sorted and unique at " +
                                       std::to_string((*ids)[i]));
      }
    }
  }
  return Status::Ok();
}

Status ValidateNode(const NodeRecord& node) {
  GRANARY_RETURN_IF_ERROR(ValidateNodeId(node.id));
  const std::string what = "node " + Quoted(node.id);
  GRANARY_RETURN_IF_ERROR(ValidatePoolName(node.pool).WithContext(what + ": pool"));
  size_t colon = node.address.rfind(':');
  uint64_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !ParseDecimal(std::string_view(node.address).substr(colon + 1), 65535, &port) || port == 0) {
    return Status::InvalidArgument(what + ": address " + Quoted(node.address) +
                                   " is not host:port (e.g. 10.0.0.7:7070)");
  }
  for (const auto& [key, value] : node.labels) {
    if (key.empty()) return Status::InvalidArgument(what + ": a label has an empty key");
  }
  return Status::Ok();
}

Status ValidateNodeTtl(std::string_view node_id, milliseconds ttl) {
  if (ttl < kMinNodeTtl || ttl > kMaxNodeTtl) {
    return Status::InvalidArgument("node " + Quoted(node_id) + ": heartbeat ttl " +
                                   std::to_string(ttl.count()) + " ms is outside " +
                                   std::to_string(kMinNodeTtl.count()) + ".." +
                                   std::to_string(kMaxNodeTtl.count()) + " ms");
  }
  return Status::Ok();
}

Status ValidatePlan(const PlanRecord& plan) {
  GRANARY_RETURN_IF_ERROR(ValidatePlanId(plan.plan_id));
  // One definition of a valid plan: the one the planner applies. A plan that
  // converts for its first epoch and rank 0 converts for every rank below
  // world_size and every epoch a uint32_t holds.
  return ToPlanSpec(plan, plan.first_epoch, 0).status();
}

// ---- JSON documents (docs/metadata-store.md, "Records") ----

Result<std::string> EncodeDataset(const DatasetRecord& r) {
  return EncodeJson("dataset " + Quoted(r.name), [&] {
    json doc{
        {"name", r.name},
        {"spec",
         {{"source_uri", r.spec.source_uri},
          {"include", r.spec.include},
          {"exclude", r.spec.exclude},
          {"chunk_size", r.spec.chunk_size},
          {"pool", r.spec.pool},
          {"replication", r.spec.replication}}},
        {"owner", {{"uid", r.owner.uid}, {"gid", r.owner.gid}}},
        {"state", {{"phase", DatasetPhaseName(r.state.phase)}, {"message", r.state.message}}},
        {"manifest_id", r.manifest_id},
        {"updated_ms", r.updated_ms},
    };
    // Written only when set, so records of datasets on the whole pool are as
    // before (and readable by builds that do not know the field).
    if (r.spec.nodes.has_value()) doc["spec"]["nodes"] = *r.spec.nodes;
    // Likewise: absent means "client", the only way before the field existed.
    if (r.spec.snapshot_by != SnapshotBy::kClient) {
      doc["spec"]["snapshot_by"] = SnapshotByName(r.spec.snapshot_by);
    }
    if (!r.spec.kubernetes_namespace.empty()) {
      doc["spec"]["namespace"] = r.spec.kubernetes_namespace;
    }
    if (!r.spec.cache.is_default()) {
      const DatasetCacheSpec& c = r.spec.cache;
      json cache = {{"priority", c.priority},
                    {"pinned", c.pinned},
                    {"ttl_seconds", c.ttl_seconds},
                    {"min_resident_percent", c.min_resident_percent}};
      if (c.max_resident_bytes.has_value()) cache["max_resident_bytes"] = *c.max_resident_bytes;
      doc["spec"]["cache"] = std::move(cache);
    }
    if (!r.state.claimed_by.empty()) doc["state"]["claimed_by"] = r.state.claimed_by;
    if (!r.readers.empty()) doc["readers"] = {{"uids", r.readers.uids}, {"gids", r.readers.gids}};
    return doc;
  });
}

Result<DatasetRecord> DecodeDataset(std::string_view text, std::string_view key_name,
                                    uint64_t revision, int64_t created_ms, std::string_view where) {
  return DecodeJson<DatasetRecord>(text, where, [&](const json& j) -> Result<DatasetRecord> {
    DatasetRecord r;
    GRANARY_ASSIGN_OR_RETURN(r.name, StringField(j, "name", "name"));
    GRANARY_ASSIGN_OR_RETURN(const json* spec, ObjectField(j, "spec", "spec"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.source_uri,
                             StringField(*spec, "source_uri", "spec.source_uri"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.include, StringListField(*spec, "include", "spec.include"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.exclude, StringListField(*spec, "exclude", "spec.exclude"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.chunk_size,
                             IntField<uint64_t>(*spec, "chunk_size", "spec.chunk_size"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.pool, StringField(*spec, "pool", "spec.pool"));
    GRANARY_ASSIGN_OR_RETURN(r.spec.replication,
                             IntField<uint32_t>(*spec, "replication", "spec.replication"));
    if (spec->contains("nodes")) {
      GRANARY_ASSIGN_OR_RETURN(r.spec.nodes, StringListField(*spec, "nodes", "spec.nodes"));
    }
    if (spec->contains("snapshot_by")) {
      GRANARY_ASSIGN_OR_RETURN(std::string by,
                               StringField(*spec, "snapshot_by", "spec.snapshot_by"));
      GRANARY_ASSIGN_OR_RETURN(r.spec.snapshot_by, ParseSnapshotBy(by));
    }
    if (spec->contains("namespace")) {
      GRANARY_ASSIGN_OR_RETURN(r.spec.kubernetes_namespace,
                               StringField(*spec, "namespace", "spec.namespace"));
    }
    if (spec->contains("cache")) {
      GRANARY_ASSIGN_OR_RETURN(const json* cache, ObjectField(*spec, "cache", "spec.cache"));
      DatasetCacheSpec& c = r.spec.cache;
      GRANARY_ASSIGN_OR_RETURN(c.priority,
                               IntField<int32_t>(*cache, "priority", "spec.cache.priority"));
      GRANARY_ASSIGN_OR_RETURN(c.pinned, BoolField(*cache, "pinned", "spec.cache.pinned"));
      GRANARY_ASSIGN_OR_RETURN(c.ttl_seconds,
                               IntField<uint64_t>(*cache, "ttl_seconds", "spec.cache.ttl_seconds"));
      GRANARY_ASSIGN_OR_RETURN(
          c.min_resident_percent,
          IntField<uint32_t>(*cache, "min_resident_percent", "spec.cache.min_resident_percent"));
      if (cache->contains("max_resident_bytes")) {
        GRANARY_ASSIGN_OR_RETURN(
            c.max_resident_bytes,
            IntField<uint64_t>(*cache, "max_resident_bytes", "spec.cache.max_resident_bytes"));
      }
    }
    GRANARY_ASSIGN_OR_RETURN(const json* owner, ObjectField(j, "owner", "owner"));
    GRANARY_ASSIGN_OR_RETURN(r.owner.uid, IntField<uint32_t>(*owner, "uid", "owner.uid"));
    GRANARY_ASSIGN_OR_RETURN(r.owner.gid, IntField<uint32_t>(*owner, "gid", "owner.gid"));
    if (j.contains("readers")) {
      GRANARY_ASSIGN_OR_RETURN(const json* readers, ObjectField(j, "readers", "readers"));
      GRANARY_ASSIGN_OR_RETURN(r.readers.uids, IdListField(*readers, "uids", "readers.uids"));
      GRANARY_ASSIGN_OR_RETURN(r.readers.gids, IdListField(*readers, "gids", "readers.gids"));
    }
    GRANARY_ASSIGN_OR_RETURN(const json* state, ObjectField(j, "state", "state"));
    GRANARY_ASSIGN_OR_RETURN(std::string phase, StringField(*state, "phase", "state.phase"));
    GRANARY_ASSIGN_OR_RETURN(r.state.phase, ParseDatasetPhase(phase));
    GRANARY_ASSIGN_OR_RETURN(r.state.message, StringField(*state, "message", "state.message"));
    if (state->contains("claimed_by")) {
      GRANARY_ASSIGN_OR_RETURN(r.state.claimed_by,
                               StringField(*state, "claimed_by", "state.claimed_by"));
    }
    GRANARY_ASSIGN_OR_RETURN(r.manifest_id, StringField(j, "manifest_id", "manifest_id"));
    GRANARY_ASSIGN_OR_RETURN(r.updated_ms, IntField<int64_t>(j, "updated_ms", "updated_ms"));
    r.created_ms = created_ms;
    r.revision = revision;
    if (r.name != key_name) return KeyMismatch("name", r.name, key_name);
    if (revision == 0) return Status::InvalidArgument("revision is 0; stored revisions start at 1");
    GRANARY_RETURN_IF_ERROR(ValidateDataset(r));
    return r;
  });
}

Result<std::string> EncodeNode(const NodeRecord& n) {
  return EncodeJson("node " + Quoted(n.id), [&] {
    return json{
        {"id", n.id},
        {"pool", n.pool},
        {"address", n.address},
        {"capacity_bytes", n.capacity_bytes},
        {"used_bytes", n.used_bytes},
        {"labels", n.labels},
        {"started_ms", n.started_ms},
        {"heartbeat_ms", n.heartbeat_ms},
    };
  });
}

Result<NodeRecord> DecodeNode(std::string_view text, std::string_view key_id,
                              std::string_view where) {
  return DecodeJson<NodeRecord>(text, where, [&](const json& j) -> Result<NodeRecord> {
    NodeRecord n;
    GRANARY_ASSIGN_OR_RETURN(n.id, StringField(j, "id", "id"));
    GRANARY_ASSIGN_OR_RETURN(n.pool, StringField(j, "pool", "pool"));
    GRANARY_ASSIGN_OR_RETURN(n.address, StringField(j, "address", "address"));
    GRANARY_ASSIGN_OR_RETURN(n.capacity_bytes,
                             IntField<uint64_t>(j, "capacity_bytes", "capacity_bytes"));
    GRANARY_ASSIGN_OR_RETURN(n.used_bytes, IntField<uint64_t>(j, "used_bytes", "used_bytes"));
    GRANARY_ASSIGN_OR_RETURN(n.labels, StringMapField(j, "labels", "labels"));
    GRANARY_ASSIGN_OR_RETURN(n.started_ms, IntField<int64_t>(j, "started_ms", "started_ms"));
    GRANARY_ASSIGN_OR_RETURN(n.heartbeat_ms, IntField<int64_t>(j, "heartbeat_ms", "heartbeat_ms"));
    if (n.id != key_id) return KeyMismatch("id", n.id, key_id);
    GRANARY_RETURN_IF_ERROR(ValidateNode(n));
    return n;
  });
}

std::string NodeIdentity(const NodeRecord& n) {
  return n.pool + "|" + n.address + "|" + std::to_string(n.capacity_bytes) + "|" +
         std::to_string(n.started_ms);
}

Result<std::string> EncodeProgress(const StagingProgress& p) {
  return EncodeJson("staging progress", [&] {
    json doc{
        {"chunks_total", p.chunks_total},     {"chunks_staged", p.chunks_staged},
        {"bytes_total", p.bytes_total},       {"bytes_staged", p.bytes_staged},
        {"samples_failed", p.samples_failed}, {"updated_ms", p.updated_ms},
    };
    // Written only when set, so reports of nodes whose share fits (and that
    // were never read) are as before.
    if (p.chunks_not_kept > 0 || p.bytes_not_kept > 0) {
      doc["chunks_not_kept"] = p.chunks_not_kept;
      doc["bytes_not_kept"] = p.bytes_not_kept;
    }
    if (p.last_read_ms != 0) doc["last_read_ms"] = p.last_read_ms;
    return doc;
  });
}

Result<StagingProgress> DecodeProgress(std::string_view text, std::string_view key_node_id,
                                       std::string_view where) {
  return DecodeJson<StagingProgress>(text, where, [&](const json& j) -> Result<StagingProgress> {
    StagingProgress p;
    GRANARY_ASSIGN_OR_RETURN(p.chunks_total, IntField<uint64_t>(j, "chunks_total", "chunks_total"));
    GRANARY_ASSIGN_OR_RETURN(p.chunks_staged,
                             IntField<uint64_t>(j, "chunks_staged", "chunks_staged"));
    GRANARY_ASSIGN_OR_RETURN(p.bytes_total, IntField<uint64_t>(j, "bytes_total", "bytes_total"));
    GRANARY_ASSIGN_OR_RETURN(p.bytes_staged, IntField<uint64_t>(j, "bytes_staged", "bytes_staged"));
    GRANARY_ASSIGN_OR_RETURN(p.samples_failed,
                             IntField<uint64_t>(j, "samples_failed", "samples_failed"));
    GRANARY_ASSIGN_OR_RETURN(p.updated_ms, IntField<int64_t>(j, "updated_ms", "updated_ms"));
    if (j.contains("chunks_not_kept")) {
      GRANARY_ASSIGN_OR_RETURN(p.chunks_not_kept,
                               IntField<uint64_t>(j, "chunks_not_kept", "chunks_not_kept"));
      GRANARY_ASSIGN_OR_RETURN(p.bytes_not_kept,
                               IntField<uint64_t>(j, "bytes_not_kept", "bytes_not_kept"));
      if (p.chunks_not_kept > p.chunks_total || p.bytes_not_kept > p.bytes_total) {
        return Status::InvalidArgument("chunks_not_kept or bytes_not_kept is more than the share");
      }
    }
    if (j.contains("last_read_ms")) {
      GRANARY_ASSIGN_OR_RETURN(p.last_read_ms,
                               IntField<int64_t>(j, "last_read_ms", "last_read_ms"));
    }
    GRANARY_RETURN_IF_ERROR(ValidateNodeId(key_node_id).WithContext("the key's node id"));
    return p;
  });
}

Result<std::string> EncodePlan(const PlanRecord& p) { return PlanRecordJson(p); }

Result<PlanRecord> DecodePlan(std::string_view text, std::string_view key_plan_id,
                              std::string_view where) {
  return DecodeJson<PlanRecord>(text, where, [&](const json& j) -> Result<PlanRecord> {
    PlanRecord p;
    GRANARY_ASSIGN_OR_RETURN(p.plan_id, StringField(j, "plan_id", "plan_id"));
    GRANARY_ASSIGN_OR_RETURN(p.seed, IntField<uint64_t>(j, "seed", "seed"));
    GRANARY_ASSIGN_OR_RETURN(p.first_epoch, IntField<uint32_t>(j, "first_epoch", "first_epoch"));
    GRANARY_ASSIGN_OR_RETURN(p.world_size, IntField<uint32_t>(j, "world_size", "world_size"));
    GRANARY_ASSIGN_OR_RETURN(p.batch_size, IntField<uint32_t>(j, "batch_size", "batch_size"));
    GRANARY_ASSIGN_OR_RETURN(p.drop_last, BoolField(j, "drop_last", "drop_last"));
    GRANARY_ASSIGN_OR_RETURN(p.mode, StringField(j, "mode", "mode"));
    GRANARY_ASSIGN_OR_RETURN(p.window_chunks,
                             IntField<uint32_t>(j, "window_chunks", "window_chunks"));
    GRANARY_ASSIGN_OR_RETURN(p.registered_ms,
                             IntField<int64_t>(j, "registered_ms", "registered_ms"));
    if (p.plan_id != key_plan_id) return KeyMismatch("plan_id", p.plan_id, key_plan_id);
    GRANARY_RETURN_IF_ERROR(ValidatePlan(p));
    return p;
  });
}

std::string EncodeEvent(const Event& event) {
  // Names are validated ASCII, so this cannot throw.
  return Dump(json{{"kind", EventKindName(event.kind)}, {"name", event.name}});
}

Result<Event> DecodeEvent(std::string_view text) {
  return DecodeJson<Event>(text, "event " + Quoted(text), [&](const json& j) -> Result<Event> {
    GRANARY_ASSIGN_OR_RETURN(std::string kind, StringField(j, "kind", "kind"));
    GRANARY_ASSIGN_OR_RETURN(std::string name, StringField(j, "name", "name"));
    GRANARY_ASSIGN_OR_RETURN(EventKind k, ParseEventKind(kind));
    return Event{k, std::move(name)};
  });
}

}  // namespace store_internal
}  // namespace granary

#include "granary/operator/resources.h"

#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "granary/core/glob.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"

namespace granary::kube {
namespace {

std::string Str(const Json& j, const char* key, const std::string& fallback = "") {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return fallback;
  return j[key].get<std::string>();
}

int64_t Int(const Json& j, const char* key, int64_t fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer()) return fallback;
  return j[key].get<int64_t>();
}

Status CheckAbsolute(const std::string& path, const std::string& field) {
  if (path.empty() || path[0] != '/') {
    return Status::InvalidArgument(field + ": " + Quoted(path) +
                                   " is not an absolute path; write it from /");
  }
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string_view part(path.data() + start, end - start);
    if (part == "..") {
      return Status::InvalidArgument(field + ": " + Quoted(path) + " has a '..' component");
    }
    start = end + 1;
  }
  return Status::Ok();
}

// "/a/b/" -> "/a/b"; "//x" -> "/x".
std::string CleanPath(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool Granted(const std::string& list, uint32_t id) {
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    start = end + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    unsigned long lo = 0, hi = 0;
    char extra = 0;
    if (std::sscanf(item.c_str(), "%lu-%lu%c", &lo, &hi, &extra) == 2) {
      if (id >= lo && id <= hi) return true;
    } else if (std::sscanf(item.c_str(), "%lu%c", &lo, &extra) == 1) {
      if (id == lo) return true;
    }
  }
  return false;
}

Result<DatasetCacheSpec> ParseCacheSpec(const Json& spec);

}  // namespace

Result<uint64_t> ParseQuantityBytes(const Json& value, const std::string& field) {
  if (value.is_number_unsigned() || value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) return Status::InvalidArgument(field + ": " + std::to_string(v) + " is negative");
    return static_cast<uint64_t>(v);
  }
  if (!value.is_string()) {
    return Status::InvalidArgument(field + ": write a quantity such as 16Mi or 800Gi");
  }
  const std::string text = value.get<std::string>();
  size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) != 0 || text[pos] == '.'))
    ++pos;
  const std::string number = text.substr(0, pos);
  const std::string suffix = text.substr(pos);
  static const std::pair<const char*, double> kSuffixes[] = {{"", 1},
                                                             {"k", 1e3},
                                                             {"M", 1e6},
                                                             {"G", 1e9},
                                                             {"T", 1e12},
                                                             {"P", 1e15},
                                                             {"Ki", 1024.0},
                                                             {"Mi", 1048576.0},
                                                             {"Gi", 1073741824.0},
                                                             {"Ti", 1099511627776.0},
                                                             {"Pi", 1125899906842624.0}};
  double scale = 0;
  for (const auto& [s, v] : kSuffixes) {
    if (suffix == s) scale = v;
  }
  char* end = nullptr;
  const double n = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (scale == 0 || n < 0 || end == nullptr || *end != '\0') {
    return Status::InvalidArgument(field + ": " + Quoted(text) +
                                   " is not a byte quantity; write e.g. 16Mi, 800Gi or 1T");
  }
  const double bytes = std::floor(n * scale);
  if (bytes > 1.8e19) return Status::InvalidArgument(field + ": " + Quoted(text) + " is too large");
  return static_cast<uint64_t>(bytes);
}

std::string QuantityString(uint64_t bytes) {
  static const char* kUnits[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(bytes));
  } else if (v >= 100 || std::fabs(v - std::round(v)) < 0.05) {
    std::snprintf(buf, sizeof(buf), "%.0f%s", v, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f%s", v, kUnits[unit]);
  }
  return buf;
}

Result<CachePool> ParseCachePool(const Json& object) {
  CachePool p;
  const Json& meta = object.value("metadata", Json::object());
  const Json& spec = object.value("spec", Json::object());
  p.name = Str(meta, "name");
  p.uid = Str(meta, "uid");
  p.generation = Int(meta, "generation", 0);
  const std::string what = "CachePool " + Quoted(p.name);
  p.deleting = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  for (const Json& f : meta.value("finalizers", Json::array())) {
    if (f.is_string()) p.finalizers.push_back(f.get<std::string>());
  }
  if (spec.contains("quotas") && !spec["quotas"].is_array()) {
    return Status::InvalidArgument(what + ": spec.quotas: write a list of {namespace, bytes}");
  }
  for (const Json& q : spec.value("quotas", Json::array())) {
    NamespaceQuota quota;
    quota.namespace_ = Str(q, "namespace");
    const std::string field = what + ": spec.quotas[" + Quoted(quota.namespace_) + "]";
    if (!IsDnsLabel(quota.namespace_)) {
      return Status::InvalidArgument(field +
                                     ".namespace: write a namespace name (a DNS-1123 label)");
    }
    for (const NamespaceQuota& other : p.quotas) {
      if (other.namespace_ == quota.namespace_) {
        return Status::InvalidArgument(field + ": the namespace has two quotas; write one");
      }
    }
    GRANARY_ASSIGN_OR_RETURN(quota.bytes,
                             ParseQuantityBytes(q.value("bytes", Json()), field + ".bytes"));
    if (quota.bytes == 0) return Status::InvalidArgument(field + ".bytes must be more than 0");
    p.quotas.push_back(std::move(quota));
  }
  if (spec.contains("nodeSelector") && spec["nodeSelector"].is_object()) {
    p.node_selector = spec["nodeSelector"];
  }
  if (spec.contains("tolerations") && spec["tolerations"].is_array()) {
    p.tolerations = spec["tolerations"];
  }
  const Json& storage = spec.value("storage", Json::object());
  p.storage_host_path = CleanPath(Str(storage, "hostPath"));
  GRANARY_RETURN_IF_ERROR(CheckAbsolute(p.storage_host_path, what + ": spec.storage.hostPath"));
  GRANARY_ASSIGN_OR_RETURN(p.capacity_bytes, ParseQuantityBytes(storage.value("capacity", Json()),
                                                                what + ": spec.storage.capacity"));
  if (p.capacity_bytes == 0) {
    return Status::InvalidArgument(what + ": spec.storage.capacity must be more than 0");
  }
  for (const Json& m : spec.value("sourceMounts", Json::array())) {
    SourceMount mount;
    mount.name = Str(m, "name");
    mount.host_path = CleanPath(Str(m, "hostPath"));
    const Json& pvc = m.value("persistentVolumeClaim", Json::object());
    mount.pvc_claim = Str(pvc, "claimName");
    mount.pvc_namespace = Str(pvc, "namespace");
    mount.mount_path = CleanPath(Str(m, "mountPath", mount.host_path));
    const std::string field = what + ": spec.sourceMounts[" + Quoted(mount.name) + "]";
    if (mount.host_path.empty() == mount.pvc_claim.empty()) {
      return Status::InvalidArgument(field +
                                     ": give exactly one of hostPath and persistentVolumeClaim");
    }
    GRANARY_RETURN_IF_ERROR(CheckAbsolute(mount.mount_path, field + ".mountPath"));
    p.source_mounts.push_back(std::move(mount));
  }
  const Json& store =
      spec.value("metadataStore", Json::object()).value("secretRef", Json::object());
  p.store_secret_name = Str(store, "name");
  p.store_secret_namespace = Str(store, "namespace");
  p.store_secret_key = Str(store, "key", "url");
  if (p.store_secret_name.empty()) {
    return Status::InvalidArgument(what + ": spec.metadataStore.secretRef.name is required");
  }
  p.transport = Str(spec, "transport", "tcp");
  const Json& libfabric = spec.value("libfabric", Json::object());
  p.libfabric_provider = Str(libfabric, "provider", "tcp");
  p.libfabric_port = static_cast<int>(Int(libfabric, "port", 7071));
  p.image = Str(spec, "image", p.image);
  p.image_pull_policy = Str(spec, "imagePullPolicy", p.image_pull_policy);
  if (spec.contains("resources") && spec["resources"].is_object()) p.resources = spec["resources"];
  const Json& ports = spec.value("ports", Json::object());
  p.data_port = static_cast<int>(Int(ports, "data", 7070));
  p.metrics_port = static_cast<int>(Int(ports, "metrics", 9464));
  p.node_socket_host_path =
      CleanPath(Str(spec, "nodeSocketHostPath", DefaultNodeSocketHostPath(p.name)));
  GRANARY_RETURN_IF_ERROR(
      CheckAbsolute(p.node_socket_host_path, what + ": spec.nodeSocketHostPath"));
  static const Json kNoSidecar = Json::object();
  const Json& sidecar = spec.is_object() && spec.contains("sidecar") && spec["sidecar"].is_object()
                            ? spec["sidecar"]
                            : kNoSidecar;
  if (sidecar.contains("resources") && sidecar["resources"].is_object()) {
    p.sidecar_resources = sidecar["resources"];
  }
  p.sidecar_metrics_port = static_cast<int>(Int(sidecar, "metricsPort", 9465));
  if (p.sidecar_metrics_port < 1 || p.sidecar_metrics_port > 65535) {
    return Status::InvalidArgument(what + ": spec.sidecar.metricsPort must be in 1..65535");
  }
  if (p.transport == "libfabric") {
    if (p.libfabric_port < 1 || p.libfabric_port > 65535) {
      return Status::InvalidArgument(what + ": spec.libfabric.port must be in 1..65535");
    }
    if (p.libfabric_port == p.data_port || p.libfabric_port == p.metrics_port) {
      return Status::InvalidArgument(what + ": spec.libfabric.port " +
                                     std::to_string(p.libfabric_port) + " is also spec.ports." +
                                     (p.libfabric_port == p.data_port ? "data" : "metrics") +
                                     ": give the fabric a port of its own");
    }
  }
  p.sidecar_chunk_handoff =
      !(sidecar.contains("chunkHandoff") && sidecar["chunkHandoff"].is_boolean() &&
        !sidecar["chunkHandoff"].get<bool>());
  p.allow_posix_view = sidecar.contains("allowPosixView") &&
                       sidecar["allowPosixView"].is_boolean() &&
                       sidecar["allowPosixView"].get<bool>();
  return p;
}

Result<Dataset> ParseDataset(const Json& object) {
  Dataset d;
  const Json& meta = object.value("metadata", Json::object());
  const Json& spec = object.value("spec", Json::object());
  d.namespace_ = Str(meta, "namespace");
  d.name = Str(meta, "name");
  d.uid = Str(meta, "uid");
  d.generation = Int(meta, "generation", 0);
  d.deleting = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  d.phase = Str(object.value("status", Json::object()), "phase");
  for (const Json& f : meta.value("finalizers", Json::array())) {
    if (f.is_string()) d.finalizers.push_back(f.get<std::string>());
  }
  const std::string what = "spec";
  d.pool = Str(spec, "cachePool");
  d.source = CleanPath(Str(spec, "source"));
  GRANARY_RETURN_IF_ERROR(CheckAbsolute(d.source, "spec.source"));
  for (const char* key : {"include", "exclude"}) {
    std::vector<std::string>& out = std::string(key) == "include" ? d.include : d.exclude;
    for (const Json& g : spec.value(key, Json::array())) {
      if (!g.is_string())
        return Status::InvalidArgument(std::string("spec.") + key + ": not a string");
      out.push_back(g.get<std::string>());
    }
    Result<GlobSet> compiled = GlobSet::Compile(out);
    if (!compiled.ok()) {
      return Status::InvalidArgument(std::string("spec.") + key + ": " +
                                     compiled.status().message());
    }
  }
  if (spec.contains("chunkSize")) {
    GRANARY_ASSIGN_OR_RETURN(d.chunk_size, ParseQuantityBytes(spec["chunkSize"], "spec.chunkSize"));
  }
  if (d.chunk_size < (64u << 10) || d.chunk_size > kMaxChunkSize) {
    return Status::InvalidArgument("spec.chunkSize: " + QuantityString(d.chunk_size) +
                                   " is out of range; write 64Ki to 1Gi");
  }
  const int64_t replication = Int(spec, "replication", 1);
  if (replication < 1 || replication > 16) {
    return Status::InvalidArgument("spec.replication: " + std::to_string(replication) +
                                   " is out of range; write 1 to 16");
  }
  d.replication = static_cast<uint32_t>(replication);
  if (spec.contains("nodes") && spec["nodes"].is_array()) {
    std::vector<std::string> nodes;
    for (const Json& n : spec["nodes"]) {
      if (!n.is_string()) return Status::InvalidArgument("spec.nodes: every entry is a node name");
      GRANARY_RETURN_IF_ERROR(ValidateNodeId(n.get<std::string>()).WithContext("spec.nodes"));
      nodes.push_back(n.get<std::string>());
    }
    d.nodes = std::move(nodes);
  }
  const Json& run_as = spec.value("runAs", Json::object());
  const int64_t uid = Int(run_as, "uid", -1);
  const int64_t gid = Int(run_as, "gid", -1);
  if (uid <= 0 || uid >= 4294967295 || gid < 0 || gid >= 4294967295) {
    return Status::InvalidArgument(
        "spec.runAs: write the uid (1 or more: never 0) and gid the source is read as");
  }
  d.run_as_uid = static_cast<uint32_t>(uid);
  d.run_as_gid = static_cast<uint32_t>(gid);
  d.creation_timestamp = Str(meta, "creationTimestamp");
  GRANARY_ASSIGN_OR_RETURN(d.cache, ParseCacheSpec(spec));
  (void)what;
  return d;
}

Result<uint64_t> ParseDurationSeconds(const Json& value, const std::string& field) {
  if (!value.is_string()) {
    return Status::InvalidArgument(field + ": write a duration such as 90s, 30m, 12h or 1h30m");
  }
  const std::string text = value.get<std::string>();
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(field + ": " + Quoted(text) + " " + why +
                                   "; write a duration such as 90s, 30m, 12h or 1h30m");
  };
  if (text.empty()) return bad("is empty");
  static constexpr std::pair<char, uint64_t> kUnits[] = {{'h', 3600}, {'m', 60}, {'s', 1}};
  size_t next_unit = 0;  // h, m, s each at most once, in that order
  uint64_t total = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) != 0) ++pos;
    if (pos == start) return bad("is not a number followed by h, m or s");
    if (pos - start > 12) return bad("is too large");
    if (pos == text.size()) return bad("has a number without a unit (h, m or s)");
    const uint64_t n = std::stoull(text.substr(start, pos - start));
    size_t unit = next_unit;
    while (unit < 3 && kUnits[unit].first != text[pos]) ++unit;
    if (unit == 3) {
      return bad("has a unit other than h, m and s (in that order, each at most once)");
    }
    total += n * kUnits[unit].second;
    if (total > kMaxCacheTtlSeconds) {
      return bad("is longer than ten years (" + std::to_string(kMaxCacheTtlSeconds) + "s)");
    }
    next_unit = unit + 1;
    ++pos;
  }
  return total;
}

std::map<std::string, QuotaShare> SplitQuota(uint64_t quota, std::vector<QuotaClaim> claims) {
  std::sort(claims.begin(), claims.end(), [](const QuotaClaim& a, const QuotaClaim& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.creation_timestamp != b.creation_timestamp) {
      return a.creation_timestamp < b.creation_timestamp;
    }
    return a.key < b.key;
  });
  std::map<std::string, QuotaShare> shares;
  uint64_t left = quota;
  for (const QuotaClaim& c : claims) {
    QuotaShare& share = shares[c.key];
    if (!c.bytes) {
      share.limit = left;
      continue;
    }
    share.limit = std::min(*c.bytes, left);
    share.exceeded = share.limit < *c.bytes;
    left -= share.limit;
  }
  return shares;
}

namespace {

// spec.cache of a Dataset; the CRD's schema refuses the same values first.
Result<DatasetCacheSpec> ParseCacheSpec(const Json& spec) {
  DatasetCacheSpec cache;
  if (!spec.is_object() || !spec.contains("cache")) return cache;
  const Json& c = spec["cache"];
  if (!c.is_object()) {
    return Status::InvalidArgument(
        "spec.cache: write an object with priority, pinned, ttl and minResidentPercent");
  }
  for (const auto& [key, value] : c.items()) {
    if (key != "priority" && key != "pinned" && key != "ttl" && key != "minResidentPercent") {
      return Status::InvalidArgument("spec.cache." + key +
                                     ": unknown field; spec.cache has priority, pinned, ttl and "
                                     "minResidentPercent");
    }
  }
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t& out) -> Status {
    if (!c.contains(key)) return Status::Ok();
    const std::string field = std::string("spec.cache.") + key;
    if (!c[key].is_number_integer()) {
      return Status::InvalidArgument(field + ": write a whole number from " + std::to_string(lo) +
                                     " to " + std::to_string(hi));
    }
    const int64_t v = c[key].is_number_unsigned() && c[key].get<uint64_t>() > INT64_MAX
                          ? INT64_MAX
                          : c[key].get<int64_t>();
    if (v < lo || v > hi) {
      return Status::InvalidArgument(field + ": " + std::to_string(v) + " is out of range; write " +
                                     std::to_string(lo) + " to " + std::to_string(hi));
    }
    out = v;
    return Status::Ok();
  };
  int64_t priority = 0, percent = 0;
  GRANARY_RETURN_IF_ERROR(integer("priority", kMinCachePriority, kMaxCachePriority, priority));
  GRANARY_RETURN_IF_ERROR(integer("minResidentPercent", 0, 100, percent));
  cache.priority = static_cast<int32_t>(priority);
  cache.min_resident_percent = static_cast<uint32_t>(percent);
  if (c.contains("pinned")) {
    if (!c["pinned"].is_boolean()) {
      return Status::InvalidArgument("spec.cache.pinned: write true or false");
    }
    cache.pinned = c["pinned"].get<bool>();
  }
  if (c.contains("ttl")) {
    GRANARY_ASSIGN_OR_RETURN(cache.ttl_seconds, ParseDurationSeconds(c["ttl"], "spec.cache.ttl"));
  }
  GRANARY_RETURN_IF_ERROR(ValidateDatasetCacheSpec(cache));
  return cache;
}

}  // namespace

std::string GranaryDatasetName(const std::string& ns, const std::string& name) {
  const std::string full = ns + "/" + name;
  const uint64_t h = XXH3_64bits(full.data(), full.size());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  std::string base = ns + "-" + name;
  if (base.size() > 52) base.resize(52);
  while (!base.empty() && base.back() == '-') base.pop_back();
  return base + "-" + std::string(hex, 10);
}

Result<SourceMount> MountOf(const CachePool& pool, const std::string& source) {
  const std::string clean = CleanPath(source);
  std::string paths;
  for (const SourceMount& m : pool.source_mounts) {
    if (clean == m.mount_path || (clean.size() > m.mount_path.size() &&
                                  clean.compare(0, m.mount_path.size(), m.mount_path) == 0 &&
                                  (m.mount_path == "/" || clean[m.mount_path.size()] == '/'))) {
      return m;
    }
    paths += (paths.empty() ? "" : ", ") + m.mount_path;
  }
  return Status::InvalidArgument(
      "spec.source " + Quoted(source) + " is not under any source mount of CachePool " +
      Quoted(pool.name) + " (" + (paths.empty() ? "it has none" : paths) +
      "); write a path under one of them, or ask an admin to add a mount");
}

Status CheckGrant(const Json& ns_object, uint32_t uid, uint32_t gid) {
  const Json& annotations =
      ns_object.value("metadata", Json::object()).value("annotations", Json::object());
  const std::string ns = ns_object.value("metadata", Json::object()).value("name", "");
  const std::string uids = Str(annotations, std::string(kAllowedUidsAnnotation).c_str());
  const std::string gids = Str(annotations, std::string(kAllowedGidsAnnotation).c_str());
  if (uid == 0) return Status::PermissionDenied("spec.runAs.uid: 0 (root) is never allowed");
  if (!Granted(uids, uid)) {
    return Status::PermissionDenied("spec.runAs.uid: namespace " + Quoted(ns) +
                                    " is not granted uid " + std::to_string(uid) +
                                    "; ask a cluster admin to add it to the namespace annotation " +
                                    std::string(kAllowedUidsAnnotation) +
                                    (uids.empty() ? " (not set)" : " (now " + Quoted(uids) + ")"));
  }
  if (!Granted(gids, gid)) {
    return Status::PermissionDenied("spec.runAs.gid: namespace " + Quoted(ns) +
                                    " is not granted gid " + std::to_string(gid) +
                                    "; ask a cluster admin to add it to the namespace annotation " +
                                    std::string(kAllowedGidsAnnotation) +
                                    (gids.empty() ? " (not set)" : " (now " + Quoted(gids) + ")"));
  }
  return Status::Ok();
}

std::string NowRfc3339() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void SetCondition(Json& conditions, const std::string& type, bool status, const std::string& reason,
                  const std::string& message, int64_t generation, const std::string& now) {
  if (!conditions.is_array()) conditions = Json::array();
  const std::string s = status ? "True" : "False";
  for (Json& c : conditions) {
    if (c.value("type", "") != type) continue;
    if (c.value("status", "") != s) c["lastTransitionTime"] = now;
    c["status"] = s;
    c["reason"] = reason;
    c["message"] = message;
    c["observedGeneration"] = generation;
    return;
  }
  conditions.push_back({{"type", type},
                        {"status", s},
                        {"reason", reason},
                        {"message", message},
                        {"observedGeneration", generation},
                        {"lastTransitionTime", now}});
}

}  // namespace granary::kube

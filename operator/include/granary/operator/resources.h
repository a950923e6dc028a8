#pragma once

// The granary.io/v1alpha1 resources as the operator reads them: CachePool
// (cluster-scoped) and Dataset (namespaced), parsed from the API server's
// JSON into typed structs. The CRD schemas (charts/granary/crds/) and their
// CEL rules refuse most bad resources at `kubectl apply`; what they cannot
// judge (a glob that does not compile, a source outside every mount of the
// pool, a uid the namespace was not granted) is checked here, and the
// reconcilers report it as a condition and an Event. docs/kubernetes.md.
//
// Thread safety: plain values and pure functions.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "granary/kube/kube_client.h"

namespace granary::kube {

inline constexpr std::string_view kGroup = "granary.io";
inline constexpr std::string_view kVersion = "v1alpha1";
inline constexpr std::string_view kFieldManager = "granary-operator";
inline constexpr std::string_view kFinalizer = "granary.io/release-cache";
// On a CachePool: its deletion waits until no Dataset names it.
inline constexpr std::string_view kPoolFinalizer = "granary.io/pool-in-use";
inline constexpr std::string_view kAllowedUidsAnnotation = "granary.io/allowed-uids";
inline constexpr std::string_view kAllowedGidsAnnotation = "granary.io/allowed-gids";

// Where a cache node's chunk-handoff socket is, inside the cache-node pod and
// the injected sidecar alike: the pool's nodeSocketHostPath is mounted here.
inline constexpr std::string_view kNodeSocketDir = "/run/granary-node";
inline constexpr std::string_view kNodeSocketPath = "/run/granary-node/cachenode.sock";

// A pool's nodeSocketHostPath when its spec names none.
inline std::string DefaultNodeSocketHostPath(const std::string& pool) {
  return "/var/run/granary/" + pool;
}

struct SourceMount {
  std::string name;
  std::string host_path;      // or
  std::string pvc_claim;      // a read-only PVC
  std::string pvc_namespace;  // the PVC's namespace (the operator's by default)
  std::string mount_path;     // where cache nodes see it (default: host_path)
};

// spec.quotas[]: the bytes (replicas counted) the Datasets of one namespace
// may keep in the pool together.
struct NamespaceQuota {
  std::string namespace_;
  uint64_t bytes = 0;
};

struct CachePool {
  std::string name;
  std::string uid;
  int64_t generation = 0;
  bool deleting = false;  // deletionTimestamp set
  std::vector<std::string> finalizers;
  std::vector<NamespaceQuota> quotas;
  Json node_selector = Json::object();
  Json tolerations = Json::array();
  std::string storage_host_path;
  uint64_t capacity_bytes = 0;
  std::vector<SourceMount> source_mounts;
  std::string store_secret_name;
  std::string store_secret_namespace;
  std::string store_secret_key = "url";
  std::string transport = "tcp";
  std::string libfabric_provider = "tcp";
  // spec.libfabric.port: the host port the cache nodes serve the fabric on
  // (transport libfabric only; differs from the data and metrics ports).
  int libfabric_port = 7071;
  std::string image = "granary:0.1.0";
  std::string image_pull_policy = "IfNotPresent";
  Json resources = Json::object();
  int data_port = 7070;
  int metrics_port = 9464;
  // Host directory the pool's cache node and the sidecars on the same host
  // share for the chunk-handoff socket (spec.nodeSocketHostPath; default
  // /var/run/granary/<pool>).
  std::string node_socket_host_path;
  // The injected sidecar (spec.sidecar): its container's resources, the
  // port of its /metrics and /readyz, and whether pods may ask for the
  // POSIX view (granary.io/mount-path).
  Json sidecar_resources = Json::object();
  int sidecar_metrics_port = 9465;
  bool allow_posix_view = false;
  // spec.sidecar.chunkHandoff: mount node_socket_host_path into injected
  // sidecars (a hostPath volume, which Pod Security baseline forbids).
  bool sidecar_chunk_handoff = true;
};

struct Dataset {
  std::string namespace_;
  std::string name;
  std::string uid;
  int64_t generation = 0;
  bool deleting = false;  // deletionTimestamp set
  std::vector<std::string> finalizers;
  std::string pool;
  std::string source;  // absolute path as the cache nodes see it
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  uint64_t chunk_size = 16ull << 20;
  uint32_t replication = 1;
  std::optional<std::vector<std::string>> nodes;
  uint32_t run_as_uid = 0;
  uint32_t run_as_gid = 0;
  std::string phase;  // status.phase as the operator wrote it ("" before its first reconcile)
  std::string creation_timestamp;  // metadata.creationTimestamp (RFC 3339, sorts by time)
  // spec.cache; max_resident_bytes is never read from the spec (the operator
  // computes it from the pool's quota of the namespace: SplitQuota).
  DatasetCacheSpec cache;
};

// A duration as Kubernetes writes one (Go's time.ParseDuration, whole
// seconds): "90s", "30m", "12h", "1h30m", "0s"; h, m and s each at most once
// and in that order. At most kMaxCacheTtlSeconds. Errors name `field`.
Result<uint64_t> ParseDurationSeconds(const Json& value, const std::string& field);

// One Dataset of a namespace in a pool with a quota, as SplitQuota ranks it.
struct QuotaClaim {
  std::string key;  // "namespace/name"
  int32_t priority = 0;
  std::string creation_timestamp;  // RFC 3339
  // Its size with replicas (total bytes × replication); nullopt before its
  // snapshot, when the size is not known yet.
  std::optional<uint64_t> bytes;
};

struct QuotaShare {
  uint64_t limit = 0;     // max_resident_bytes: at most this many bytes, replicas counted
  bool exceeded = false;  // limit is below the dataset's known size
};

// A namespace's quota divided among its Datasets in a pool, in order of
// priority (highest first), then creation (oldest first), then key: each gets
// its size, or what is left of the quota if less. A Dataset of unknown size
// takes nothing from the others and may keep what is left at its place.
std::map<std::string, QuotaShare> SplitQuota(uint64_t quota, std::vector<QuotaClaim> claims);

// A Kubernetes quantity of bytes: an integer, or "16Mi", "1G", "1.5Gi",
// "500k" (binary and decimal suffixes, no exponent forms). Errors name `field`.
Result<uint64_t> ParseQuantityBytes(const Json& value, const std::string& field);
// "1.5Gi", "16Mi", "512" (what the printer columns show).
std::string QuantityString(uint64_t bytes);

Result<CachePool> ParseCachePool(const Json& object);
Result<Dataset> ParseDataset(const Json& object);

// The dataset's name in Granary's metadata store: unique across namespaces,
// a DNS-1123 label (what `granary` and `#DW persistentdw name=` take):
// "<namespace>-<name>" cut to 52 characters, then "-" and 10 hex digits of a
// hash of "namespace/name".
std::string GranaryDatasetName(const std::string& ns, const std::string& name);

// The mount of `pool` that `source` lies under (path-wise, no `..`), or
// kInvalidArgument naming the pool's mount paths.
Result<SourceMount> MountOf(const CachePool& pool, const std::string& source);

// Whether namespace `ns_object` (a Namespace's JSON) grants uid/gid: its
// annotations list them (comma-separated decimals or ranges a-b). uid 0
// never. kPermissionDenied says what to ask an admin for.
Status CheckGrant(const Json& ns_object, uint32_t uid, uint32_t gid);

// metav1.Condition list maintenance: sets `type` to status/reason/message,
// keeping lastTransitionTime when status does not change.
void SetCondition(Json& conditions, const std::string& type, bool status, const std::string& reason,
                  const std::string& message, int64_t generation, const std::string& now);

std::string NowRfc3339();

}  // namespace granary::kube

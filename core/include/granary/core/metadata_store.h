#pragma once

// MetadataStore: Granary's control-plane state behind one interface, chosen by
// URL (docs/metadata-store.md):
//   redis://[[user]:password@]host[:port][/db][?prefix=..&timeout_ms=..&retry_ms=..]
//       the cluster store (hiredis); heartbeats are expiring keys, events are
//       pub/sub messages;
//   sqlite:///absolute/path/granary.db[?retry_ms=..&poll_ms=..]
//       the embedded single-host store; the file and schema are created on first
//       open; several processes may share the file.
//
// It holds datasets (with a revision for optimistic concurrency), manifest
// blobs, live cache nodes (heartbeats that expire), staging progress per dataset
// and node, registered plans, and change events. The records are plain structs;
// both backends store them as the same JSON documents.
//
// Callers: the cache node (heartbeats, progress), the sidecar (datasets,
// manifests, nodes), the CLI, the Kubernetes operator and the Slurm plugin.
//
// Consistency: every call is atomic on its own (a write is applied whole or not
// at all, and a list is one snapshot). Datasets carry `revision`: UpdateDataset
// is a compare-and-set on it. Events are hints that something changed, never the
// state itself: a consumer re-reads the records it cares about, and on an event
// of kind kResync re-reads everything, because events were lost.
//
// Failures: every call returns a Status. A store that cannot be reached is
// kUnavailable after the retry budget (Redis reconnects with exponential
// backoff inside it; SQLite waits for locks up to it). A write returned OK only
// after the backend acknowledged it. A write that failed with kUnavailable may
// or may not have been applied; and a retried non-idempotent write whose first
// attempt was applied but unanswered reports kAlreadyExists (create),
// kFailedPrecondition (update) or kNotFound (delete): re-read and decide.
//
// Signals: the Redis backend sets SIGPIPE to SIG_IGN process-wide if it was at
// its default, because hiredis writes with write(2) and a vanished server must
// be an error to retry, not the end of the process.
//
// Thread safety: a MetadataStore may be called from any number of threads at
// once; each backend serialises calls on its one connection with a mutex, so a
// call may wait for another thread's call (including its retries). A Watcher
// has its own connection and is used by one thread at a time; it does not
// depend on the store that made it and may outlive it. The Clock given in the
// options must outlive both.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/clock.h"
#include "granary/core/manifest.h"
#include "granary/core/names.h"
#include "granary/core/plan.h"
#include "granary/core/status.h"

namespace granary {

// ---- records ----------------------------------------------------------------

enum class DatasetPhase : uint8_t {
  kPending,       // created, nothing done yet
  kSnapshotting,  // walking the source to build the manifest
  kStaging,       // manifest known; chunks being copied onto cache nodes
  kReady,         // every chunk staged
  kFailed,        // see DatasetState::message
  kDeleting,      // being torn down; cached data being released
};
// "Pending", "Snapshotting", ... (the names stored and shown to users).
std::string_view DatasetPhaseName(DatasetPhase phase);
Result<DatasetPhase> ParseDatasetPhase(std::string_view name);

// Who walks a dataset's source to take its snapshot (docs/cachenode.md,
// "Dataset phases").
enum class SnapshotBy : uint8_t {
  // Whoever creates the dataset (the CLI, the Slurm plugin), where the
  // source is mounted; the cache nodes leave Pending and Snapshotting alone.
  kClient,
  // The cache nodes of its pool: one of them claims a Pending dataset (or a
  // Snapshotting one whose claimant is not live any more), walks the source
  // as the owner and sets Staging or Failed. For sources mounted only where
  // the cache nodes run (Kubernetes).
  kPool,
};
// "client", "pool" (the values stored in the record).
std::string_view SnapshotByName(SnapshotBy by);
Result<SnapshotBy> ParseSnapshotBy(std::string_view name);

// How a dataset keeps its place on the cache nodes when its pool is full
// (docs/cachenode.md, "When the cache is full"). Each node grants every
// dataset it stages a byte budget for its share: pinned datasets first, then
// higher priority first, then datasets in use (a plan registered or a read
// within the node's cache_idle_after) before idle ones; datasets in use of
// the same priority split what is left fairly; idle ones keep theirs in the
// order they were last read (the least recently read loses first). A dataset
// keeps a fixed resident subset within its budget (the chunks its plans read
// first) and streams the rest from the source: never churn. Stored as
// "cache" only when not the default, so older records read as before.
struct DatasetCacheSpec {
  int32_t priority = 0;  // kMinCachePriority..kMaxCachePriority
  bool pinned = false;   // never shrunk for another dataset
  // Not read for this long (seconds): its chunks are dropped (it stays Ready
  // and is staged again when read). 0: never. At most kMaxCacheTtlSeconds.
  uint64_t ttl_seconds = 0;
  // Others' needs never shrink it below this percentage of its share: 0..100.
  uint32_t min_resident_percent = 0;
  // At most this many bytes over the whole pool (with replicas), e.g. its
  // namespace's quota (CachePool.spec.quotas) as the operator computes it;
  // each node keeps the same fraction of its share. Unset: no limit.
  std::optional<uint64_t> max_resident_bytes;

  bool is_default() const { return *this == DatasetCacheSpec(); }
  friend bool operator==(const DatasetCacheSpec&, const DatasetCacheSpec&) = default;
};

inline constexpr int32_t kMinCachePriority = -1000;
inline constexpr int32_t kMaxCachePriority = 1000;
inline constexpr uint64_t kMaxCacheTtlSeconds = 10ull * 365 * 24 * 3600;  // ten years

// kInvalidArgument naming the field ("spec.cache.priority", ...) for a value
// out of range.
Status ValidateDatasetCacheSpec(const DatasetCacheSpec& cache);

struct DatasetSpec {
  std::string source_uri;                   // e.g. file:///lustre/imagenet/train
  std::vector<std::string> include;         // globs; empty means everything
  std::vector<std::string> exclude;         // globs
  uint64_t chunk_size = kDefaultChunkSize;  // bytes (manifest.h)
  std::string pool = "default";             // cache pool (DNS-1123 label) that stages it
  uint32_t replication = 1;                 // owners per chunk, >= 1
  // Which of the pool's cache nodes stage and serve it: unset, every live
  // node of the pool; a list, only those node ids (the others hold none of
  // its chunks); an empty list, no node (readers fall through to the source).
  // Slurm jobs use this to stage onto the job's own nodes once they are known.
  std::optional<std::vector<std::string>> nodes;
  // Who takes the snapshot. Stored as "snapshot_by" only when kPool, so
  // records of client-snapshotted datasets are as before.
  SnapshotBy snapshot_by = SnapshotBy::kClient;
  // The Kubernetes namespace of the Dataset this record was made for (by
  // granary-operator); empty for datasets made outside Kubernetes. A cache
  // node lets a pod's token of namespace N read only records with namespace N
  // (peer_auth.h). Stored as "namespace" only when set.
  std::string kubernetes_namespace;
  DatasetCacheSpec cache;

  friend bool operator==(const DatasetSpec&, const DatasetSpec&) = default;
};

// At most this many node ids in DatasetSpec::nodes.
inline constexpr size_t kMaxDatasetNodes = 4096;

// Whose rights staging reads the source with (DESIGN.md, security model).
struct DatasetOwner {
  uint32_t uid = 0;
  uint32_t gid = 0;

  friend bool operator==(const DatasetOwner&, const DatasetOwner&) = default;
};

// Who besides its owner may read a dataset through a service that reads it
// as root on a user's behalf and asks (a Slurm job's sidecar: `#DW
// persistentdw`). Granted by an admin with `granary dataset grant`; root and
// the owner need no grant. Sorted and unique; absent from the stored record
// when both are empty (docs/security.md, "Who may read a dataset").
struct DatasetReaders {
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;  // any member of the group (primary or supplementary)

  bool empty() const { return uids.empty() && gids.empty(); }
  friend bool operator==(const DatasetReaders&, const DatasetReaders&) = default;
};

// At most this many uids, and as many gids, in DatasetReaders.
inline constexpr size_t kMaxDatasetReaders = 1024;

struct DatasetState {
  DatasetPhase phase = DatasetPhase::kPending;
  std::string message;  // why Failed, or what is happening; for humans
  // The id of the cache node walking the source (phase Snapshotting of a
  // SnapshotBy::kPool dataset); empty otherwise. A claim whose node is not
  // live in the store any more is stale: another node of the pool takes it.
  std::string claimed_by;

  friend bool operator==(const DatasetState&, const DatasetState&) = default;
};

struct DatasetRecord {
  std::string name;  // DNS-1123 label: ValidateDatasetName
  DatasetSpec spec;
  DatasetOwner owner;
  DatasetReaders readers;
  DatasetState state;
  std::string manifest_id;  // lowercase hex; empty until snapshotted
  // Set by the store from its Clock: created_ms on create (kept afterwards),
  // updated_ms on every create and update. Values passed in are ignored.
  int64_t created_ms = 0;
  int64_t updated_ms = 0;
  // Set by the store: 1 on create, +1 on every update. UpdateDataset applies
  // only if this equals the stored revision.
  uint64_t revision = 0;

  friend bool operator==(const DatasetRecord&, const DatasetRecord&) = default;
};

// Whether the user `uid`, whose primary group is `gid` and supplementary
// groups `groups`, may read `dataset`: root, its owner, or a reader granted
// by uid or by one of those groups.
bool MayReadDataset(const DatasetRecord& dataset, uint32_t uid, uint32_t gid,
                    const std::vector<uint32_t>& groups);

// The label a cache node sets to "true" in its record when its port serves
// TLS (tls_cert_file): readers then connect with TLS.
inline constexpr std::string_view kNodeLabelTls = "tls";
// The label a cache node sets to "<host>:<port>" when it also serves the
// libfabric transport there (fabric_listen): readers configured for the
// fabric connect to that address (docs/transport.md).
inline constexpr std::string_view kNodeLabelFabric = "fabric";

// A cache node as it announces itself in every heartbeat.
struct NodeRecord {
  std::string id;       // e.g. the host name: ValidateNodeId
  std::string pool;     // DNS-1123 label
  std::string address;  // host:port where peers and sidecars reach it
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  std::map<std::string, std::string> labels;  // free-form, e.g. "zone" -> "a"
  int64_t started_ms = 0;                     // when this incarnation of the node started
  int64_t heartbeat_ms = 0;                   // set by the store on every heartbeat

  friend bool operator==(const NodeRecord&, const NodeRecord&) = default;
};

// The nodes of `pool_nodes` that stage and serve a dataset with `spec`:
// all of them when spec.nodes is unset, else those whose id is listed.
std::vector<NodeRecord> DatasetNodes(const DatasetSpec& spec,
                                     const std::vector<NodeRecord>& pool_nodes);
// The same for a node list alone (DatasetSpec::nodes), in `pool_nodes`' order.
std::vector<NodeRecord> ListedNodes(const std::optional<std::vector<std::string>>& listed,
                                    const std::vector<NodeRecord>& pool_nodes);
// Whether node `node_id` may hold chunks of a dataset with `spec`.
bool DatasetUsesNode(const DatasetSpec& spec, std::string_view node_id);

// How far one node has staged one dataset. Counters, not bitmaps: which chunks
// a node holds is its own chunk store's business.
struct StagingProgress {
  uint64_t chunks_total = 0;   // chunks of the dataset this node owns (its share)
  uint64_t chunks_staged = 0;  // of those it keeps, the ones with nothing left to stage
  uint64_t bytes_total = 0;    // payload bytes of its share
  uint64_t bytes_staged = 0;   // payload bytes of its share present in its store
  uint64_t samples_failed = 0;
  int64_t updated_ms = 0;  // set by the store on every PutProgress
  // Of its share, what it does not keep under its cache budget (streamed from
  // the source when read; the chunks it keeps are the ones its plans read
  // first). 0 when the share fits, and in records written before the fields.
  uint64_t chunks_not_kept = 0;
  uint64_t bytes_not_kept = 0;
  // When this node last served a read of the dataset (its clock, ms since the
  // epoch); 0: never. Cache nodes rank idle datasets by it.
  int64_t last_read_ms = 0;

  uint64_t chunks_kept() const { return chunks_total - std::min(chunks_not_kept, chunks_total); }
  uint64_t bytes_kept() const { return bytes_total - std::min(bytes_not_kept, bytes_total); }

  friend bool operator==(const StagingProgress&, const StagingProgress&) = default;
};

// A dataset's progress over the live nodes of its pool (a dead node's last
// report is history and is not counted). What the cache nodes decide Ready
// on and what the CLI shows.
struct ProgressSummary {
  StagingProgress total;       // sums over the live nodes that reported (updated_ms 0)
  size_t nodes_reporting = 0;  // live nodes with a report
  // Every live node reported and has what it keeps staged (chunks_staged ==
  // chunks_kept()).
  bool all_staged = true;
  // Every reporting node keeps its whole share (chunks_not_kept == 0).
  bool all_kept = true;

  // bytes_staged / bytes_kept(), at most 1: how far staging is (chunks when there are no
  // bytes; 0 with nothing).
  double fraction() const;
  // bytes_staged / bytes_total: how much of the dataset is resident (0 with nothing).
  double resident_fraction() const;
};
ProgressSummary SummarizeProgress(const std::map<std::string, StagingProgress>& progress,
                                  const std::vector<NodeRecord>& live_nodes);

// A registered plan (DESIGN.md, "Plan"): enough to recompute every rank's
// sample order, so cache nodes stage in that order. The fields are PlanSpec's
// (plan.h) without the epoch and rank, which vary; ToPlanSpec adds them. The
// defaults are PlanSpec's.
struct PlanRecord {
  std::string plan_id;  // 1..128 of [A-Za-z0-9._-]
  uint64_t seed = 0;
  uint32_t first_epoch = 0;  // the epoch the job starts (or resumes) at
  uint32_t world_size = 1;   // >= 1
  uint32_t batch_size = 1;   // >= 1
  bool drop_last = false;
  std::string mode = "global";  // PlanModeName: "global" | "chunkwise" | "sequential"
  uint32_t window_chunks = kDefaultChunkWindow;  // PlanSpec::window (chunkwise), >= 1
  int64_t registered_ms = 0;                     // set by the store on every PutPlan

  friend bool operator==(const PlanRecord&, const PlanRecord&) = default;
};

// The PlanSpec of `plan` for one epoch (an absolute epoch number, as in
// PlanSpec::epoch, not one relative to first_epoch) and one rank.
// kInvalidArgument naming the plan if the mode is unknown or the spec fails
// ValidatePlanSpec (e.g. rank >= world_size).
Result<PlanSpec> ToPlanSpec(const PlanRecord& plan, uint64_t epoch, uint32_t rank);

// The plan as one JSON object: the document the store keeps
// (docs/metadata-store.md, "Records") and what `granary plan show --json`
// prints, written in one place. kInvalidArgument for a string that is not
// valid UTF-8.
Result<std::string> PlanRecordJson(const PlanRecord& plan);

enum class EventKind : uint8_t {
  kDataset,   // a dataset was created, updated or deleted; name = dataset
  kNode,      // a node joined, changed pool/address/capacity/incarnation, or was
              // removed; name = node id. Expiry publishes nothing: re-list.
  kProgress,  // staging progress changed; name = dataset
  kPlan,      // a plan was registered or deleted; name = dataset
  kResync,    // events may have been lost; re-read everything. name is empty
};
std::string_view EventKindName(EventKind kind);  // "dataset", "node", ...
// kInvalidArgument "unknown kind 'x'" for a name EventKindName never gives.
Result<EventKind> ParseEventKind(std::string_view name);

struct Event {
  EventKind kind = EventKind::kResync;
  std::string name;

  friend bool operator==(const Event&, const Event&) = default;
};

// The record names' rules (ValidateDatasetName, ValidateNodeId, ...) are in
// names.h, included above.

// ---- options and the interface ---------------------------------------------

struct MetadataStoreOptions {
  // Redis: time to establish a connection, and also the limit on each socket
  // read or write, so a hung server is treated as an unreachable one.
  // URL: timeout_ms.
  std::chrono::milliseconds connect_timeout{2000};
  // Per operation: Redis keeps reconnecting with backoff and retrying for this
  // long; SQLite waits this long for another process's lock (busy timeout).
  // Then the call fails kUnavailable. URL: retry_ms.
  std::chrono::milliseconds retry_budget{5000};
  // SQLite watchers poll the events table this often. URL: poll_ms.
  std::chrono::milliseconds poll_interval{100};
  // SQLite keeps this many most recent events; a watcher further behind gets
  // kResync.
  uint32_t sqlite_event_rows = 10000;
  // Record timestamps; SQLite heartbeat expiry. Null: SystemClock::Default().
  Clock* clock = nullptr;
};

// TTLs accepted by Heartbeat.
inline constexpr std::chrono::milliseconds kMinNodeTtl{10};
inline constexpr std::chrono::milliseconds kMaxNodeTtl{24 * 3600 * 1000};
// Manifest blobs larger than this are rejected (Redis's bulk-string limit is
// 512 MiB; a manifest of ten million files is well under this).
inline constexpr size_t kMaxManifestBytes = 256u << 20;

class MetadataStore {
 public:
  // Change notifications; see the consistency notes above.
  class Watcher {
   public:
    virtual ~Watcher() = default;
    // Waits up to `timeout` for events and returns those that arrived, oldest
    // first (empty when none did). After losing its connection or falling
    // behind, the batch starts with a kResync event. kUnavailable when the
    // backend cannot be reached within `timeout`; call again to keep trying.
    virtual Result<std::vector<Event>> Next(std::chrono::milliseconds timeout) = 0;
  };

  virtual ~MetadataStore() = default;

  // The URL this store was opened with, password replaced by "***".
  virtual const std::string& url() const = 0;

  // Datasets. Create stamps created_ms/updated_ms and revision 1 and returns
  // the stored record; kAlreadyExists if the name is taken.
  virtual Result<DatasetRecord> CreateDataset(const DatasetRecord& record) = 0;
  virtual Result<DatasetRecord> GetDataset(std::string_view name) = 0;
  // Sorted by name.
  virtual Result<std::vector<DatasetRecord>> ListDatasets() = 0;
  // Replaces spec, owner, state and manifest_id if record.revision is the
  // stored revision; returns the stored record (revision + 1). kNotFound if
  // absent, kFailedPrecondition if someone else changed it since it was read.
  virtual Result<DatasetRecord> UpdateDataset(const DatasetRecord& record) = 0;
  // Also deletes the dataset's progress and plans (not its manifest: manifests
  // are content-addressed and may be shared).
  virtual Status DeleteDataset(std::string_view name) = 0;

  // Manifest blobs, by content id (lowercase hex). Put is idempotent.
  virtual Status PutManifest(std::string_view manifest_id, std::string_view bytes) = 0;
  virtual Result<std::string> GetManifest(std::string_view manifest_id) = 0;

  // Registers the node or refreshes it; it is live for `ttl` from now.
  virtual Status Heartbeat(const NodeRecord& node, std::chrono::milliseconds ttl) = 0;
  // Live nodes of `pool`, or of every pool when `pool` is empty; sorted by id.
  virtual Result<std::vector<NodeRecord>> ListNodes(std::string_view pool) = 0;
  // kNotFound if the node is not live.
  virtual Status RemoveNode(std::string_view node_id) = 0;
  // A number that differs from the last one read whenever the live nodes of
  // any pool may have changed: a node joined, changed its identity (pool,
  // address, capacity, start), was removed, or its heartbeat expired.
  // Heartbeats that only keep a node alive leave it alone, so a reader that
  // lists nodes only when it moves (NodeListFollower) costs the store one
  // small read per check, not every node record.
  virtual Result<uint64_t> NodesVersion() = 0;

  // Staging progress of `dataset` on `node_id` (replaces the previous value).
  // kNotFound if the dataset does not exist.
  virtual Status PutProgress(std::string_view dataset, std::string_view node_id,
                             const StagingProgress& progress) = 0;
  // node id -> progress. kNotFound if the dataset does not exist.
  virtual Result<std::map<std::string, StagingProgress>> ListProgress(std::string_view dataset) = 0;

  // Registers (or replaces, by plan_id) a plan of `dataset`.
  virtual Status PutPlan(std::string_view dataset, const PlanRecord& plan) = 0;
  // Sorted by plan_id. kNotFound if the dataset does not exist.
  virtual Result<std::vector<PlanRecord>> ListPlans(std::string_view dataset) = 0;
  // kNotFound if the dataset or the plan does not exist.
  virtual Status DeletePlan(std::string_view dataset, std::string_view plan_id) = 0;

  // A watcher that sees every event published after this call returns. To
  // follow state without gaps: Watch(), then read, then apply events.
  virtual Result<std::unique_ptr<Watcher>> Watch() = 0;
};

// Opening a store by URL (OpenMetadataStore) is in granary/store/open_store.h,
// target granary::store: only what opens a store links the backends.

// Follows the live nodes of one pool at the price of one NodesVersion per
// Poll: the whole list only when the version moved since the last list, or
// `full_every` after it (a safety net, and what a store without versions
// would cost). Used by the sidecars' and the cache nodes' refresh loops
// (docs/metadata-store.md, "Membership"). One thread at a time.
class NodeListFollower {
 public:
  explicit NodeListFollower(std::string pool,
                            std::chrono::milliseconds full_every = std::chrono::minutes(5))
      : pool_(std::move(pool)), full_every_(full_every) {}

  // The pool's live nodes when they may have changed since the last list (or
  // on the first call); nullopt when they have not. A store error is
  // returned and the next Poll lists again.
  Result<std::optional<std::vector<NodeRecord>>> Poll(MetadataStore& store,
                                                      std::chrono::steady_clock::time_point now);
  uint64_t lists() const { return lists_; }  // full lists made

 private:
  std::string pool_;
  std::chrono::milliseconds full_every_;
  std::optional<uint64_t> version_;  // at the last list; none: list next time
  std::chrono::steady_clock::time_point listed_at_{};
  uint64_t lists_ = 0;
};

}  // namespace granary

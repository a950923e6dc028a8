#pragma once

// CacheNode::Impl: the cache-node daemon's state and threads (cache_node.h
// says what it does). Private to cachenode/src. Its methods are in five
// files, by job:
//  - cache_node.cc: start and stop, heartbeats, readiness, metrics, and the
//    CacheNode facade;
//  - cache_node_reconcile.cc: the control loop: datasets of the pool
//    activated (manifest, source, Stager), re-owned on placement changes,
//    re-staged on new plans, dropped, their progress and phase published;
//  - cache_node_budgets.cc: the capacity shared among the active datasets
//    (the cache policy, cache_budget.h), evictions counted;
//  - cache_node_snapshot.cc: snapshots the pool takes, claimed and walked on
//    the snapshot thread;
//  - cache_node_handoff.cc: the chunk handoff's resolver (local_socket).
//
// Threads: the owner (Start, Stop), the control thread (ControlLoop), the
// metrics thread (MetricsLoop), the snapshot thread (one walk at a time), and
// the server's and handoff's threads through the accessors and HandOff; what
// each field is guarded by is said at the field.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache_node_metrics.h"
#include "granary/cachenode/cache_budget.h"
#include "granary/cachenode/cache_node.h"
#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/fabric_server.h"
#include "granary/cachenode/handoff_server.h"
#include "granary/cachenode/read_rights.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/cachenode/token_review.h"
#include "granary/core/log.h"
#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/core/placement.h"
#include "granary/core/plan.h"
#include "granary/daemon/observability.h"
#include "granary/kube/kube_config.h"
#include "granary/peer/peer_auth.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "granary/source/snapshot.h"
#include "granary/store/open_store.h"

namespace granary {
namespace cache_node_internal {

// Source reads a dataset's source allows beyond the bulk workers, so that an
// on-demand read never waits for bulk staging to release a slot.
constexpr uint32_t kOnDemandSourceSlots = 4;
// How long a dataset that could not be set up waits before the next attempt.
constexpr int kActivationRetryTicks = 10;

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline std::string Plural(uint64_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace cache_node_internal

// One dataset this node stages and serves.
struct ActiveDataset {
  std::string name;
  DatasetRecord record;    // as last seen
  uint32_t owner_uid = 0;  // record.owner.uid at activation (read by handoff threads)
  // record.spec.kubernetes_namespace at activation (read by the server's loops)
  std::string kubernetes_namespace;
  ContentId manifest_id;
  std::shared_ptr<const Manifest> manifest;
  std::shared_ptr<Source> source;  // OpenSource
  std::shared_ptr<Stager> stager;
  std::vector<ChunkId> owned;  // ascending
  std::set<ChunkId> to_drop;   // held, no longer owned: dropped once the dataset is Ready
  std::string plans_key;       // PlanFingerprint of the plans the order came from
  StagingProgress published;   // last PutProgress that succeeded
  bool published_once = false;
  // When it succeeded: unchanged progress is put again
  // progress_refresh_interval after, so a record a store lost (a failover
  // before it was replicated, a store restored from an older copy) comes
  // back without a restart.
  std::chrono::steady_clock::time_point published_at{};
  DatasetMetrics metrics;
  DatasetMetricState metric_state;  // guarded by CacheNode::Impl::datasets_mu_
  // The cache policy (cache_budget.h), control thread only: the budget last
  // applied (none: the whole share), why it is below the share, when the
  // pool last read it (the latest last_read_ms of the nodes' progress) and
  // when its newest plan was registered.
  std::optional<uint64_t> budget;
  CacheCut cut = CacheCut::kNone;
  int64_t pool_last_read_ms = 0;
  int64_t last_plan_ms = 0;
  int64_t activated_ms = 0;
  bool started = false;  // its Stager's bulk staging (after the first budget)
};

class CacheNode::Impl {
 public:
  Impl(CacheNodeConfig config, std::vector<std::string> snapshot_helper)
      : config_(std::move(config)), snapshot_helper_(std::move(snapshot_helper)) {}
  ~Impl() { Stop(); }

  Status Start();
  void Stop();
  // The server's authentication from cluster_key_file and kubernetes_auth;
  // null (an open port, warned about) when neither is set.
  Result<std::shared_ptr<const ServerAuth>> MakeServerAuth();

  uint16_t port() const { return server_ ? server_->port() : 0; }
  uint16_t metrics_port() const { return observability_ ? observability_->port() : 0; }
  const NetAddress& advertise() const { return advertise_; }
  const std::string& node_id() const { return config_.node_id; }
  size_t active_datasets() const {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    return datasets_.size();
  }

 private:
  Status OpenStore();
  // The fabric front end (fabric_listen), over the TCP server's options; a
  // provider or listener that fails is warned about and left off (TCP only).
  void StartFabric(const ServerOptions& server_options);
  Status Heartbeat();
  void ControlLoop();
  void MetricsLoop();
  // One pass: read nodes and datasets, start/stop/re-own stagers, publish
  // progress, update dataset phases. Errors of the store are noted for /readyz.
  void Reconcile();
  Result<std::shared_ptr<ActiveDataset>> Activate(const DatasetRecord& record,
                                                  const Placement& placement);
  void Deactivate(const std::string& name, bool drop_chunks, const std::string& why);
  Status Restage(ActiveDataset& ds, std::vector<PlanRecord> plans);
  void Reown(ActiveDataset& ds, const Placement& placement);
  // Shares the store's capacity among the active datasets (cache_budget.h):
  // shrunk budgets first (their chunks dropped, counted as evictions), then
  // grown ones.
  void ApplyCacheBudgets();
  void PublishProgress(ActiveDataset& ds);
  void UpdatePhase(ActiveDataset& ds, const std::vector<NodeRecord>& nodes);
  void SetDatasetMessage(const std::string& name, const std::string& message);
  void DropDisowned(ActiveDataset& ds, const std::string& why);
  void DropOrphans(const std::vector<DatasetRecord>& datasets);
  // Snapshots (SnapshotBy::kPool): on the control thread, starts the
  // snapshot thread on the first dataset to claim, if none runs.
  void ClaimSnapshot(const std::vector<DatasetRecord>& datasets);
  // The snapshot thread's body: SnapshotDataset as this node.
  void RunSnapshot(const DatasetRecord& record);
  // Abandons the walk in progress (if any) and joins the snapshot thread.
  void StopSnapshot();
  Result<std::vector<ChunkId>> Owned(const ActiveDataset& ds, const Placement& placement) const;
  void NoteStoreError(const Status& status);
  void NoteStoreOk();
  Status Readiness() const;
  // The chunk handoff resolver (HandoffServer): a read-only descriptor of one
  // chunk file, for a peer allowed to read the dataset, or one that may read
  // every file of the chunk at the source (MayReadChunk).
  Result<ScopedFd> HandOff(const PeerCredentials& peer, const handoff::OpenChunkRequest& request);
  // Whether local uid `uid` (not root, the node's or the owner's) may read, at
  // the source, every file with bytes in chunk `chunk` of `ds`: checked as
  // that user through the identity executor, answers kept by handoff_rights_.
  Status MayReadChunk(uint32_t uid, const ActiveDataset& ds, ChunkId chunk,
                      const std::string& what);
  void RefreshMetrics();

  const CacheNodeConfig config_;
  const std::vector<std::string> snapshot_helper_;  // SnapshotProcess::helper_argv
  NetAddress advertise_;
  int64_t started_ms_ = 0;
  std::shared_ptr<spdlog::logger> log_ = GetLogger("cachenode");

  std::unique_ptr<MetadataStore> store_;
  std::unique_ptr<MetadataStore::Watcher> watcher_;  // control thread only
  std::shared_ptr<ChunkStore> chunks_;
  std::unique_ptr<IdentityExecutor> executor_;
  std::shared_ptr<ChunkReadService> reads_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<FabricServer> fabric_;    // fabric_listen, when configured and it started
  std::string fabric_advertise_;            // "<advertised host>:<fabric port>", when serving
  std::unique_ptr<HandoffServer> handoff_;  // local_socket, when configured
  ReadRightsCache handoff_rights_;          // MayReadChunk's answers
  std::shared_ptr<prometheus::Registry> registry_;
  CacheNodeMetrics metrics_;
  NodeMetricState node_metric_state_;  // metrics thread only
  std::unique_ptr<ObservabilityServer> observability_;

  // Written by the control thread; read by the metrics thread and accessors.
  mutable std::mutex datasets_mu_;
  std::map<std::string, std::shared_ptr<ActiveDataset>> datasets_;

  // Control-thread state.
  std::map<std::string, std::pair<std::string, int>>
      activation_failures_;  // name -> (error, ticks)
  std::vector<NodeRecord> live_nodes_;
  // The pool's nodes as last listed: listed again only when the store's
  // membership version moved (NodeListFollower), not every tick.
  NodeListFollower node_follower_{config_.pool};  // after config_
  std::vector<NodeRecord> listed_nodes_;
  bool plans_changed_ = true;  // re-read the datasets' plans on the next pass

  // The snapshot thread: started and joined by the control thread (one walk
  // at a time), joined by Stop after the control thread.
  std::thread snapshot_thread_;
  std::string snapshot_dataset_;               // control thread: what it walks
  std::atomic<bool> snapshot_running_{false};  // cleared by the snapshot thread at its end
  std::atomic<bool> snapshot_stop_{false};     // set by Stop: abandon the walk
  std::atomic<bool> reconcile_now_{false};     // the snapshot thread asks for a pass

  std::atomic<bool> store_ok_{false};
  std::atomic<bool> registered_{false};
  mutable std::mutex state_mu_;
  std::condition_variable state_cv_;
  bool stopping_ = false;    // guarded by state_mu_
  std::string store_error_;  // guarded by state_mu_
  bool started_ = false;
  bool stopped_ = false;
  std::thread control_;
  std::thread metrics_thread_;
};

}  // namespace granary

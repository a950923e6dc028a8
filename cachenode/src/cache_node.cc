#include "granary/cachenode/cache_node.h"

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
#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/handoff_server.h"
#include "granary/cachenode/read_rights.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/cachenode/token_review.h"
#include "granary/core/identity.h"
#include "granary/core/log.h"
#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/names.h"
#include "granary/core/peer_auth.h"
#include "granary/core/placement.h"
#include "granary/core/plan.h"
#include "granary/core/posix_source.h"
#include "granary/core/snapshot.h"
#include "granary/daemon/observability.h"
#include "granary/operator/kube_config.h"
#include "granary/store/open_store.h"

namespace granary {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Source reads a dataset's source allows beyond the bulk workers, so that an
// on-demand read never waits for bulk staging to release a slot.
constexpr uint32_t kOnDemandSourceSlots = 4;
// How long a dataset that could not be set up waits before the next attempt.
constexpr int kActivationRetryTicks = 10;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string PlanFingerprint(const std::vector<PlanRecord>& plans) {
  std::string key;
  for (const PlanRecord& p : plans) {
    key += p.plan_id + "/" + std::to_string(p.seed) + "/" + std::to_string(p.first_epoch) + "/" +
           std::to_string(p.world_size) + "/" + std::to_string(p.batch_size) + "/" +
           (p.drop_last ? "1" : "0") + "/" + p.mode + "/" + std::to_string(p.window_chunks) + ";";
  }
  return key;
}

// The order in which the registered plans first read the samples: each plan's
// first epoch, rank by rank in lockstep, oldest plan first. A plan that does
// not compute (a bad record) is skipped with a warning: it cannot be read
// either, so it has no order to follow.
std::vector<SampleId> PlansReadOrder(const std::string& dataset, const Manifest& manifest,
                                     std::vector<PlanRecord> plans) {
  std::stable_sort(plans.begin(), plans.end(), [](const PlanRecord& a, const PlanRecord& b) {
    return a.registered_ms < b.registered_ms;
  });
  std::vector<SampleId> order;
  for (const PlanRecord& plan : plans) {
    Result<PlanSpec> spec = ToPlanSpec(plan, plan.first_epoch, 0);
    Result<std::vector<SampleId>> epoch =
        spec.ok() ? EpochOrder(manifest, *spec) : Result<std::vector<SampleId>>(spec.status());
    Result<std::vector<SampleId>> first =
        epoch.ok() ? FirstReadOrder(*epoch, *spec) : Result<std::vector<SampleId>>(epoch.status());
    if (!first.ok()) {
      GetLogger("cachenode")
          ->warn("ignoring plan {} of dataset {} for the staging order: {}", Quoted(plan.plan_id),
                 Quoted(dataset), first.status().ToString());
      continue;
    }
    order.insert(order.end(), first->begin(), first->end());
  }
  return order;
}

bool IsStaged(DatasetPhase phase) {
  return phase == DatasetPhase::kStaging || phase == DatasetPhase::kReady;
}

std::string Plural(uint64_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

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
  DatasetMetrics metrics;
  DatasetMetricState metric_state;  // guarded by CacheNode::Impl::datasets_mu_
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

// ---- start and stop ---------------------------------------------------------

Status CacheNode::Impl::OpenStore() {
  const auto deadline = SteadyClock::now() + config_.startup_timeout;
  Status last;
  for (int attempt = 0;; ++attempt) {
    Result<std::unique_ptr<MetadataStore>> store = OpenMetadataStore(config_.metadata_store);
    if (store.ok()) {
      store_ = std::move(*store);
      return Status::Ok();
    }
    last = store.status();
    // Only an unreachable store is worth waiting for; a bad URL, a wrong
    // password or a foreign database will not get better.
    if (last.code() != StatusCode::kUnavailable || SteadyClock::now() >= deadline) break;
    if (attempt == 0) {
      log_->warn("the metadata store is not reachable yet ({}); retrying for up to {} ms",
                 last.ToString(), config_.startup_timeout.count());
    }
    std::this_thread::sleep_for(std::min<SteadyClock::duration>(std::chrono::milliseconds(250),
                                                                deadline - SteadyClock::now()));
  }
  return Status(last.code(), "opening the metadata store: " + last.message() +
                                 " (check `metadata_store` in the config and that the store runs)");
}

Result<std::shared_ptr<const ServerAuth>> CacheNode::Impl::MakeServerAuth() {
  if (config_.cluster_key_file.empty() && config_.kubernetes_auth.empty()) {
    log_->warn(
        "`listen` ({}) requires no authentication: whoever reaches it can read every dataset this "
        "node serves; set cluster_key_file (docs/security.md)",
        config_.listen.ToString());
    return std::shared_ptr<const ServerAuth>();
  }
  auto auth = std::make_shared<ServerAuth>();
  if (!config_.cluster_key_file.empty()) {
    Result<ClusterKeys> keys = ClusterKeys::Load(config_.cluster_key_file);
    if (!keys.ok()) return keys.status().WithContext("`cluster_key_file`");
    log_->info("cluster key {} loaded from {}{}", KeyIdHex(keys->current_id()),
               config_.cluster_key_file, keys->size() > 1 ? " (and a second key: rotating)" : "");
    auth->cluster_keys = std::make_shared<const ClusterKeys>(std::move(*keys));
  }
  if (!config_.kubernetes_auth.empty()) {
    Result<kube::KubeConfig> api = config_.kubernetes_auth == "in-cluster"
                                       ? kube::InClusterConfig()
                                       : kube::LoadKubeConfig(config_.kubernetes_auth);
    if (!api.ok()) return api.status().WithContext("`kubernetes_auth`");
    TokenReviewOptions review;
    review.audience = config_.kubernetes_audience;
    Result<std::shared_ptr<TokenReviewVerifier>> verifier =
        TokenReviewVerifier::Create(*api, review);
    if (!verifier.ok()) return verifier.status().WithContext("`kubernetes_auth`");
    auth->tokens = std::move(*verifier);
    log_->info("pods' tokens with audience {} are checked with the API server at {}",
               config_.kubernetes_audience, api->Describe());
  }
  // A token reads the datasets of its namespace that this node serves.
  auth->authorize = [this](const PeerIdentity& who, const std::string& dataset) {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    auto it = datasets_.find(dataset);
    if (it == datasets_.end() || it->second->kubernetes_namespace.empty() ||
        it->second->kubernetes_namespace != who.namespace_) {
      return Status::PermissionDenied("another namespace's dataset, or none");
    }
    return Status::Ok();
  };
  return std::shared_ptr<const ServerAuth>(std::move(auth));
}

Status CacheNode::Impl::Start() {
  started_ms_ = NowMs();
  SetLogLevel(config_.log_level);
  GRANARY_RETURN_IF_ERROR(OpenStore());

  ChunkStoreOptions store_options;
  store_options.scan_mode = config_.scan_mode;
  store_options.scan_threads = config_.scan_threads;
  Result<std::shared_ptr<ChunkStore>> chunks =
      ChunkStore::Open(config_.data_dir, config_.capacity_bytes, store_options);
  if (!chunks.ok()) {
    return Status(chunks.status().code(),
                  "opening the chunk store (`data_dir`): " + chunks.status().message());
  }
  chunks_ = std::move(*chunks);

  IdentityExecutorOptions executor_options;
  executor_options.threads =
      std::min(1024u, 2 * (config_.source_concurrency + kOnDemandSourceSlots));
  GRANARY_ASSIGN_OR_RETURN(executor_, IdentityExecutor::Start(executor_options));
  if (!executor_->can_switch()) {
    log_->warn("running without CAP_SETUID/CAP_SETGID: only datasets owned by uid {} can be staged",
               executor_->process_identity().uid);
  }

  ChunkReadServiceOptions read_options;
  read_options.node_name = config_.node_id;
  reads_ = std::make_shared<ChunkReadService>(chunks_, read_options);

  ServerOptions server_options;
  server_options.listen = config_.listen.ToString();
  server_options.node_name = config_.node_id;
  server_options.io_threads = config_.worker_threads;
  server_options.service_threads = config_.service_threads;
  server_options.max_connections = config_.max_connections;
  server_options.max_connections_per_address = config_.max_connections_per_address;
  server_options.max_unauthenticated_per_address = config_.max_unauthenticated_per_address;
  server_options.drain_timeout = config_.drain_timeout;
  server_options.write_timeout = config_.write_timeout;
  server_options.reply_stall_timeout = config_.reply_stall_timeout;
  server_options.reply_buffer_bytes = config_.reply_buffer_bytes;
  server_options.connection_reply_buffer_bytes = config_.connection_reply_buffer_bytes;
  GRANARY_ASSIGN_OR_RETURN(server_options.auth, MakeServerAuth());
  if (!config_.tls_cert_file.empty()) {
    Result<std::shared_ptr<TlsContext>> tls =
        TlsContext::ForServer(config_.tls_cert_file, config_.tls_key_file);
    if (!tls.ok()) return tls.status().WithContext("`tls_cert_file`");
    server_options.tls = std::move(*tls);
  }
  Result<std::unique_ptr<Server>> server = Server::Start(reads_, server_options);
  if (!server.ok()) {
    return Status(server.status().code(),
                  "starting the server on `listen`: " + server.status().message());
  }
  server_ = std::move(*server);
  advertise_ = config_.advertise;
  if (advertise_.port == 0) advertise_.port = server_->port();

  if (!config_.local_socket.empty()) {
    HandoffServerOptions handoff_options;
    handoff_options.path = config_.local_socket;
    handoff_options.idle_timeout = config_.local_socket_idle_timeout;
    handoff_options.max_per_uid = config_.local_socket_max_per_uid;
    // The owners of the datasets this node serves share the places kept for
    // root and the node's own uid: the sidecars that read them run as them.
    handoff_options.privileged = [this](uint32_t uid) {
      std::lock_guard<std::mutex> lock(datasets_mu_);
      for (const auto& [name, dataset] : datasets_) {
        if (dataset->owner_uid == uid) return true;
      }
      return false;
    };
    GRANARY_ASSIGN_OR_RETURN(
        handoff_,
        HandoffServer::Start(handoff_options, [this](const PeerCredentials& peer,
                                                     const handoff::OpenChunkRequest& request) {
          return HandOff(peer, request);
        }));
  }

  registry_ = std::make_shared<prometheus::Registry>();
  GRANARY_ASSIGN_OR_RETURN(metrics_, CacheNodeMetrics::Declare(*registry_));
  Result<std::unique_ptr<ObservabilityServer>> observability = ObservabilityServer::Start(
      config_.metrics_listen.ToString(), registry_, [this] { return Readiness(); });
  if (!observability.ok()) {
    return Status(
        observability.status().code(),
        "starting the metrics endpoint on `metrics_listen`: " + observability.status().message());
  }
  observability_ = std::move(*observability);

  // The first heartbeat registers the node; without it the node is not part
  // of placement, so start-up fails rather than run unseen.
  GRANARY_RETURN_IF_ERROR(Heartbeat());
  registered_ = true;
  started_ = true;
  log_->info("node {} of pool {} serving on {} (advertised as {}), metrics on {}",
             Quoted(config_.node_id), Quoted(config_.pool),
             config_.listen.host + ":" + std::to_string(server_->port()), advertise_.ToString(),
             observability_->address().ToString());
  control_ = std::thread([this] { ControlLoop(); });
  metrics_thread_ = std::thread([this] { MetricsLoop(); });
  return Status::Ok();
}

void CacheNode::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    stopping_ = true;
  }
  state_cv_.notify_all();
  if (control_.joinable()) control_.join();
  if (metrics_thread_.joinable()) metrics_thread_.join();
  // Before deregistering: the abandoned walk gives its claim back through
  // the store.
  StopSnapshot();
  // Deregister first so that sidecars and peers stop routing here while the
  // server drains what is in flight.
  if (store_ && registered_) {
    Status removed = store_->RemoveNode(config_.node_id);
    if (!removed.ok() && removed.code() != StatusCode::kNotFound) {
      log_->warn("deregistering node {}: {} (it expires after heartbeat_ttl)",
                 Quoted(config_.node_id), removed.ToString());
    }
  }
  if (handoff_) handoff_->Stop();
  if (server_) server_->Stop();
  std::map<std::string, std::shared_ptr<ActiveDataset>> datasets;
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    datasets.swap(datasets_);
  }
  for (auto& [name, ds] : datasets) {
    (void)reads_->Remove(name, ds->manifest_id);
    ds->stager->Stop();
  }
  datasets.clear();
  if (observability_) observability_->Stop();
  if (started_) log_->info("node {} stopped", Quoted(config_.node_id));
}

Status CacheNode::Impl::Heartbeat() {
  NodeRecord node;
  node.id = config_.node_id;
  node.pool = config_.pool;
  node.address = advertise_.ToString();
  node.capacity_bytes = chunks_->capacity();
  node.used_bytes = chunks_->used_bytes();
  node.started_ms = started_ms_;
  if (!config_.tls_cert_file.empty()) node.labels[std::string(kNodeLabelTls)] = "true";
  Status status = store_->Heartbeat(node, config_.heartbeat_ttl);
  if (!status.ok()) {
    return Status(status.code(), "registering node " + Quoted(config_.node_id) +
                                     " in the metadata store: " + status.message());
  }
  return Status::Ok();
}

// ---- readiness --------------------------------------------------------------

void CacheNode::Impl::NoteStoreError(const Status& status) {
  metrics_.store_errors->Increment();
  const bool was_ok = store_ok_.exchange(false);
  std::string message = status.ToString();
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (store_error_ == message && !was_ok) return;
    store_error_ = message;
  }
  log_->warn("metadata store: {} (still serving; retrying)", message);
}

void CacheNode::Impl::NoteStoreOk() {
  if (!store_ok_.exchange(true)) {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (!store_error_.empty()) log_->info("metadata store reachable again");
    store_error_.clear();
  }
}

Status CacheNode::Impl::Readiness() const {
  if (!registered_) return Status::Unavailable("not registered in the metadata store yet");
  if (!store_ok_) {
    std::lock_guard<std::mutex> lock(state_mu_);
    return Status::Unavailable("metadata store " + store_->url() + " unreachable: " +
                               (store_error_.empty() ? "no answer yet" : store_error_));
  }
  return Status::Ok();
}

// ---- the control loop -------------------------------------------------------

void CacheNode::Impl::ControlLoop() {
  auto next_tick = SteadyClock::now();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(state_mu_);
      if (stopping_) return;
    }
    if (SteadyClock::now() >= next_tick) {
      next_tick = SteadyClock::now() + config_.heartbeat_interval;
      Status beat = Heartbeat();
      if (beat.ok()) {
        NoteStoreOk();
      } else {
        NoteStoreError(beat);
      }
      Reconcile();
    }
    // Wait for events until the next tick, in short slices so Stop is quick.
    const auto slice = std::min<SteadyClock::duration>(
        std::chrono::milliseconds(100),
        std::max<SteadyClock::duration>(next_tick - SteadyClock::now(), SteadyClock::duration(0)));
    if (!watcher_) {
      Result<std::unique_ptr<MetadataStore::Watcher>> watcher = store_->Watch();
      if (watcher.ok()) {
        watcher_ = std::move(*watcher);
        plans_changed_ = true;
        next_tick = SteadyClock::now();  // read everything after the watch began
        continue;
      }
    }
    if (watcher_) {
      Result<std::vector<Event>> events =
          watcher_->Next(std::chrono::duration_cast<std::chrono::milliseconds>(slice));
      if (!events.ok()) continue;  // the watcher reconnects on the next call
      bool relevant = false;
      for (const Event& e : *events) {
        relevant = relevant || e.kind != EventKind::kProgress;
        plans_changed_ =
            plans_changed_ || e.kind == EventKind::kPlan || e.kind == EventKind::kResync;
      }
      if (relevant) next_tick = SteadyClock::now();
      if (reconcile_now_.exchange(false)) next_tick = SteadyClock::now();
    } else {
      if (reconcile_now_.exchange(false)) {
        next_tick = SteadyClock::now();
        continue;
      }
      std::unique_lock<std::mutex> lock(state_mu_);
      state_cv_.wait_for(lock, slice, [this] { return stopping_; });
    }
  }
}

Result<std::vector<ChunkId>> CacheNode::Impl::Owned(const ActiveDataset& ds,
                                                    const Placement& placement) const {
  // A dataset placed on other nodes only (DatasetSpec::nodes): none here.
  if (!placement.IndexOf(config_.node_id).ok()) return std::vector<ChunkId>();
  return placement.ChunksOwnedBy(ds.manifest_id, ds.manifest->chunk_count(), config_.node_id,
                                 std::max<uint32_t>(1, ds.record.spec.replication));
}

void CacheNode::Impl::Reconcile() {
  Result<std::vector<NodeRecord>> nodes = store_->ListNodes(config_.pool);
  if (!nodes.ok()) return NoteStoreError(nodes.status());
  Result<std::vector<DatasetRecord>> datasets = store_->ListDatasets();
  if (!datasets.ok()) return NoteStoreError(datasets.status());

  // This node is alive whatever the list says (its heartbeat may have been
  // lost with a restarted store): never compute an ownership without it.
  live_nodes_ = std::move(*nodes);
  if (std::none_of(live_nodes_.begin(), live_nodes_.end(),
                   [&](const NodeRecord& n) { return n.id == config_.node_id; })) {
    NodeRecord self;
    self.id = config_.node_id;
    self.pool = config_.pool;
    self.capacity_bytes = chunks_->capacity();
    live_nodes_.push_back(self);
  }
  Result<Placement> placement = PlacementOverNodes(live_nodes_);
  if (!placement.ok()) {
    log_->error("computing placement over the nodes of pool {}: {}", Quoted(config_.pool),
                placement.status().ToString());
    return;
  }

  std::map<std::string, const DatasetRecord*> wanted;
  for (const DatasetRecord& d : *datasets) {
    if (d.spec.pool == config_.pool && IsStaged(d.state.phase) && !d.manifest_id.empty()) {
      wanted[d.name] = &d;
    }
  }

  // Stop what is no longer wanted (or wanted with another manifest). Chunks
  // are kept across a pause (Pending, Snapshotting, Failed with the same
  // manifest): it may come back. They go when the dataset is deleted, moved
  // to another pool or re-snapshotted.
  std::vector<std::pair<std::string, std::string>> stale;  // name, active manifest id
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    for (const auto& [name, ds] : datasets_) {
      auto it = wanted.find(name);
      if (it == wanted.end() || it->second->manifest_id != ds->record.manifest_id) {
        stale.emplace_back(name, ds->record.manifest_id);
      }
    }
  }
  for (const auto& entry : stale) {
    const std::string& name = entry.first;
    const std::string& manifest_id = entry.second;
    auto it = std::find_if(datasets->begin(), datasets->end(),
                           [&](const DatasetRecord& d) { return d.name == name; });
    const bool keep = it != datasets->end() && it->spec.pool == config_.pool &&
                      it->manifest_id == manifest_id && !IsStaged(it->state.phase) &&
                      it->state.phase != DatasetPhase::kDeleting;
    const std::string why = it == datasets->end()
                                ? "was deleted"
                                : "is now " + std::string(DatasetPhaseName(it->state.phase));
    Deactivate(name, !keep, why);
  }
  DropOrphans(*datasets);
  ClaimSnapshot(*datasets);

  // Plans are read again only after a plan event, a resync or without a
  // watcher (activation reads them anyway).
  if (!watcher_) plans_changed_ = true;
  bool plans_read = true;
  for (const auto& [name, record] : wanted) {
    std::shared_ptr<ActiveDataset> ds;
    {
      std::lock_guard<std::mutex> lock(datasets_mu_);
      if (auto it = datasets_.find(name); it != datasets_.end()) ds = it->second;
    }
    // A dataset on some nodes only (spec.nodes) is placed over those alone:
    // the others own none of its chunks.
    std::vector<NodeRecord> ds_nodes = DatasetNodes(record->spec, live_nodes_);
    Result<Placement> own_placement = Placement();
    if (record->spec.nodes.has_value()) {
      own_placement = PlacementOverNodes(ds_nodes);
      if (!own_placement.ok()) {
        log_->error("computing placement of dataset {} over its nodes: {}", Quoted(name),
                    own_placement.status().ToString());
        continue;
      }
    }
    const Placement& ds_placement = record->spec.nodes.has_value() ? *own_placement : *placement;
    // Not placed here and not active: nothing to stage, serve or publish.
    if (!ds && !DatasetUsesNode(record->spec, config_.node_id)) continue;
    if (!ds) {
      auto failure = activation_failures_.find(name);
      if (failure != activation_failures_.end() && --failure->second.second > 0) continue;
      Result<std::shared_ptr<ActiveDataset>> activated = Activate(*record, ds_placement);
      if (!activated.ok()) {
        const std::string message = activated.status().ToString();
        if (failure == activation_failures_.end() || failure->second.first != message) {
          log_->warn("cannot stage dataset {}: {} (retrying)", Quoted(name), message);
          SetDatasetMessage(name, "node " + config_.node_id + " cannot stage it: " + message);
        }
        activation_failures_[name] = {message, kActivationRetryTicks};
        continue;
      }
      activation_failures_.erase(name);
      ds = *activated;
      std::lock_guard<std::mutex> lock(datasets_mu_);
      datasets_[name] = ds;
    } else {
      ds->record = *record;
      Reown(*ds, ds_placement);
      if (plans_changed_) {
        Result<std::vector<PlanRecord>> plans = store_->ListPlans(name);
        plans_read = plans_read && plans.ok();
        if (plans.ok() && PlanFingerprint(*plans) != ds->plans_key) {
          Status restaged = Restage(*ds, std::move(*plans));
          if (!restaged.ok()) {
            log_->warn("re-ordering the staging of dataset {}: {}", Quoted(name),
                       restaged.ToString());
          }
        }
      }
    }
    PublishProgress(*ds);
    UpdatePhase(*ds, ds_nodes);
  }
  if (plans_read) plans_changed_ = false;
}

Result<std::shared_ptr<ActiveDataset>> CacheNode::Impl::Activate(const DatasetRecord& record,
                                                                 const Placement& placement) {
  auto ds = std::make_shared<ActiveDataset>();
  ds->name = record.name;
  ds->record = record;
  ds->owner_uid = record.owner.uid;
  ds->kubernetes_namespace = record.spec.kubernetes_namespace;
  GRANARY_ASSIGN_OR_RETURN(ds->manifest_id, ContentId::Parse(record.manifest_id));
  GRANARY_ASSIGN_OR_RETURN(std::string blob, store_->GetManifest(record.manifest_id));
  Result<Manifest> manifest = Manifest::Decode(blob);
  if (!manifest.ok()) {
    return Status(manifest.status().code(),
                  "decoding manifest " + record.manifest_id + ": " + manifest.status().message());
  }
  if (!(manifest->id() == ds->manifest_id)) {
    return Status::Corruption("the store's manifest blob " + record.manifest_id +
                              " decodes to manifest " + manifest->id().ToHex() +
                              "; re-snapshot the dataset");
  }
  ds->manifest = std::make_shared<const Manifest>(std::move(*manifest));

  GRANARY_ASSIGN_OR_RETURN(Identity owner,
                           ResolveOwnerIdentity(record.owner.uid, record.owner.gid));
  SourceOptions source_options;
  source_options.dataset = record.name;
  source_options.owner = owner;
  source_options.executor = executor_.get();
  source_options.max_in_flight = config_.source_concurrency + kOnDemandSourceSlots;
  Result<std::unique_ptr<Source>> source = OpenSource(record.spec.source_uri, source_options);
  if (!source.ok()) {
    return Status(source.status().code(),
                  "opening the source as " + owner.ToString() + ": " + source.status().message());
  }
  ds->source = std::move(*source);
  GRANARY_ASSIGN_OR_RETURN(ds->owned, Owned(*ds, placement));

  // What the store holds of this manifest but this node does not own (a
  // restart after membership changed) goes once the dataset is Ready.
  if (Result<std::vector<StoredChunk>> held = chunks_->Chunks(ds->name, ds->manifest_id);
      held.ok()) {
    for (const StoredChunk& c : *held) {
      if (!std::binary_search(ds->owned.begin(), ds->owned.end(), c.chunk)) {
        ds->to_drop.insert(c.chunk);
      }
    }
  }
  GRANARY_ASSIGN_OR_RETURN(ds->metrics, metrics_.ForDataset(ds->name));

  Result<std::vector<PlanRecord>> plans = store_->ListPlans(ds->name);
  if (!plans.ok()) return plans.status();
  GRANARY_RETURN_IF_ERROR(Restage(*ds, std::move(*plans)));
  log_->info("staging dataset {} (manifest {}, {}, {} bytes) from {} as {}: {} of {} chunks here",
             Quoted(ds->name), record.manifest_id, Plural(ds->manifest->sample_count(), "file"),
             ds->manifest->total_bytes(), record.spec.source_uri, owner.ToString(),
             ds->owned.size(), ds->manifest->chunk_count());
  return ds;
}

Result<ScopedFd> CacheNode::Impl::HandOff(const PeerCredentials& peer,
                                          const handoff::OpenChunkRequest& request) {
  std::shared_ptr<ActiveDataset> ds;
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    auto it = datasets_.find(request.dataset);
    if (it != datasets_.end()) ds = it->second;
  }
  const std::string what = "chunk " + std::to_string(request.chunk) + " of dataset " +
                           Quoted(request.dataset) + " on cache node " + Quoted(config_.node_id);
  if (ds == nullptr) {
    return Status::NotFound(what +
                            ": the node does not stage that dataset (yet); read it over "
                            "the network");
  }
  if (!(ds->manifest_id == request.manifest_id)) {
    return Status::NotFound(what + ": the node serves manifest " + ds->manifest_id.ToHex() +
                            ", not " + request.manifest_id.ToHex() + "; reopen the dataset");
  }
  if (request.chunk >= ds->manifest->chunk_count()) {
    return Status::OutOfRange(what + ": the manifest has " +
                              std::to_string(ds->manifest->chunk_count()) + " chunks");
  }
  if (peer.uid != 0 && peer.uid != ::geteuid() && peer.uid != ds->owner_uid) {
    GRANARY_RETURN_IF_ERROR(MayReadChunk(peer.uid, *ds, request.chunk, what));
  }
  GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments,
                           ds->manifest->Segments(request.chunk));
  ChunkKey key{request.dataset, request.manifest_id, request.chunk};
  Result<StoredChunkReader> reader = chunks_->OpenChunkReader(key, segments);
  if (!reader.ok()) return Status(reader.status().code(), what + ": " + reader.status().message());
  const int fd = ::fcntl((*reader)->fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "duplicate the descriptor of " + what);
  return ScopedFd(fd);
}

Status CacheNode::Impl::MayReadChunk(uint32_t uid, const ActiveDataset& ds, ChunkId chunk,
                                     const std::string& what) {
  const std::string owner = "the dataset belongs to uid " + std::to_string(ds.owner_uid);
  const ReadRightsKey key{uid, ds.name, ds.manifest_id, chunk};
  Status answer = handoff_rights_.Decide(key, [&]() -> Status {
    Result<Identity> reader = ResolveUserIdentity(uid);
    if (!reader.ok()) {
      if (reader.status().code() != StatusCode::kNotFound) return reader.status();
      return Status::PermissionDenied(reader.status().message() +
                                      ", so the node cannot check what it may read at the "
                                      "source and hands it nothing (" +
                                      owner + "); read through a sidecar");
    }
    GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments, ds.manifest->Segments(chunk));
    std::vector<SourceFile> files;
    files.reserve(segments.size());
    std::optional<SampleId> last;
    for (const ChunkSegment& segment : segments) {
      if (last == segment.sample) continue;
      last = segment.sample;
      GRANARY_ASSIGN_OR_RETURN(SourceFile file, SourceFileOf(*ds.manifest, segment.sample));
      files.push_back(std::move(file));
    }
    Status readable = ds.source->CheckReadable(*reader, files);
    if (readable.code() != StatusCode::kPermissionDenied) return readable;
    const std::string advice = "through a sidecar, or ask the dataset's owner (uid " +
                               std::to_string(ds.owner_uid) + ") for access to it";
    if (files.size() == 1) {
      return Status::PermissionDenied(readable.message() + ": read it " + advice);
    }
    return Status::PermissionDenied(readable.message() + "; the chunk holds " +
                                    std::to_string(files.size()) +
                                    " files and is handed out only to a user who may read them "
                                    "all: read that file " +
                                    advice);
  });
  if (answer.ok()) return answer;
  log_->debug("chunk handoff to uid {} refused: {}: {}", uid, what, answer.ToString());
  return Status(answer.code(), what + ": " + answer.message());
}

// (Re)creates the dataset's Stager with the order of `plans` and puts it in
// service. A running one is stopped first and then replaced in the read
// service in one step, so the dataset is served throughout: a READ that found
// it unserved would be taken for "not placed here" and read from the source
// (which may be gone once the dataset is Ready). A sidecar registers its plan
// when its job starts reading, so this happens at every job's first reads.
Status CacheNode::Impl::Restage(ActiveDataset& ds, std::vector<PlanRecord> plans) {
  StagerOptions options;
  options.dataset = ds.name;
  options.threads = config_.source_concurrency;
  const std::string key = PlanFingerprint(plans);
  options.order = PlansReadOrder(ds.name, *ds.manifest, std::move(plans));
  const bool ordered = !options.order.empty();
  GRANARY_ASSIGN_OR_RETURN(
      std::unique_ptr<Stager> created,
      Stager::Create(ds.manifest, ds.source, chunks_, ds.owned, std::move(options)));
  std::shared_ptr<Stager> stager = std::move(created);
  const std::shared_ptr<Stager> replaced = ds.stager;
  // Still serving while it stops (a stopped Stager fetches on demand), and
  // stopped before the new one starts (one bulk writer per chunk).
  if (replaced) replaced->Stop();
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    ds.stager = stager;
    ds.plans_key = key;
  }
  GRANARY_RETURN_IF_ERROR(replaced ? reads_->Replace(ds.manifest, stager)
                                   : reads_->Add(ds.manifest, stager));
  GRANARY_RETURN_IF_ERROR(stager->Start());
  log_->info("dataset {}: staging in {} order", Quoted(ds.name),
             ordered ? "the registered plans'" : "chunk");
  return Status::Ok();
}

void CacheNode::Impl::Reown(ActiveDataset& ds, const Placement& placement) {
  Result<std::vector<ChunkId>> owned = Owned(ds, placement);
  if (!owned.ok()) {
    log_->error("computing the chunks of dataset {} this node owns: {}", Quoted(ds.name),
                owned.status().ToString());
    return;
  }
  if (*owned == ds.owned) return;
  Status set = ds.stager->SetOwnedChunks(*owned);
  if (!set.ok()) {
    log_->error("re-owning dataset {}: {}", Quoted(ds.name), set.ToString());
    return;
  }
  uint64_t gained = 0;
  for (ChunkId c : *owned) {
    if (!std::binary_search(ds.owned.begin(), ds.owned.end(), c)) ++gained;
    ds.to_drop.erase(c);
  }
  uint64_t lost = 0;
  for (ChunkId c : ds.owned) {
    if (!std::binary_search(owned->begin(), owned->end(), c)) {
      ++lost;
      ds.to_drop.insert(c);
    }
  }
  log_->info("dataset {}: membership changed ({} live nodes): {} chunks gained, {} given up",
             Quoted(ds.name), live_nodes_.size(), gained, lost);
  std::lock_guard<std::mutex> lock(datasets_mu_);
  ds.owned = std::move(*owned);
}

void CacheNode::Impl::Deactivate(const std::string& name, bool drop_chunks,
                                 const std::string& why) {
  std::shared_ptr<ActiveDataset> ds;
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    auto it = datasets_.find(name);
    if (it == datasets_.end()) return;
    ds = it->second;
    datasets_.erase(it);
  }
  (void)reads_->Remove(name, ds->manifest_id);
  ds->stager->Stop();
  ClearDatasetGauges(ds->metrics);
  log_->info("dataset {} {}: stopped staging it{}", Quoted(name), why,
             drop_chunks ? " and dropping its chunks" : "");
  if (drop_chunks) {
    Status dropped = chunks_->DropManifest(name, ds->manifest_id);
    if (!dropped.ok() && dropped.code() != StatusCode::kNotFound) {
      log_->warn("dropping the chunks of dataset {}: {}", Quoted(name), dropped.ToString());
    }
  }
}

// Chunks of datasets the store no longer has (deleted while this node was
// down), of other pools, or of manifests the dataset no longer uses.
void CacheNode::Impl::DropOrphans(const std::vector<DatasetRecord>& datasets) {
  for (const StoredManifest& held : chunks_->Manifests()) {
    auto it = std::find_if(datasets.begin(), datasets.end(),
                           [&](const DatasetRecord& d) { return d.name == held.dataset; });
    bool orphan = it == datasets.end() || it->spec.pool != config_.pool ||
                  it->state.phase == DatasetPhase::kDeleting;
    if (!orphan && !it->manifest_id.empty()) orphan = it->manifest_id != held.manifest_id.ToHex();
    if (!orphan) continue;
    {
      std::lock_guard<std::mutex> lock(datasets_mu_);
      auto active = datasets_.find(held.dataset);
      if (active != datasets_.end() && active->second->manifest_id == held.manifest_id) continue;
    }
    Status dropped = chunks_->DropManifest(held.dataset, held.manifest_id);
    if (dropped.ok()) {
      log_->info(
          "dropped {} of dataset {} manifest {}: {}", Plural(held.chunk_count, "chunk"),
          Quoted(held.dataset), held.manifest_id.ToHex(),
          it == datasets.end() ? "the dataset no longer exists" : "not used by this pool any more");
    } else if (dropped.code() != StatusCode::kNotFound) {
      log_->warn("dropping the chunks of dataset {}: {}", Quoted(held.dataset), dropped.ToString());
    }
  }
}

void CacheNode::Impl::DropDisowned(ActiveDataset& ds, const std::string& why) {
  if (ds.to_drop.empty()) return;
  uint64_t dropped = 0;
  for (auto it = ds.to_drop.begin(); it != ds.to_drop.end();) {
    Status status = chunks_->DropChunk(ChunkKey{ds.name, ds.manifest_id, *it});
    if (status.ok() || status.code() == StatusCode::kNotFound) {
      if (status.ok()) ++dropped;
      it = ds.to_drop.erase(it);
    } else {
      ++it;  // in use (a writer open): next time
    }
  }
  if (dropped > 0) {
    log_->info("dataset {}: dropped {} this node no longer owns ({})", Quoted(ds.name),
               Plural(dropped, "chunk"), why);
  }
}

void CacheNode::Impl::PublishProgress(ActiveDataset& ds) {
  StagingProgress progress = ds.stager->Progress().ToStagingProgress();
  progress.updated_ms = 0;
  if (ds.published_once && progress == ds.published) return;
  Status put = store_->PutProgress(ds.name, config_.node_id, progress);
  if (!put.ok()) {
    if (put.code() != StatusCode::kNotFound) NoteStoreError(put);
    return;
  }
  ds.published = progress;
  ds.published_once = true;
}

void CacheNode::Impl::SetDatasetMessage(const std::string& name, const std::string& message) {
  Result<DatasetRecord> record = store_->GetDataset(name);
  if (!record.ok() || record->state.message == message) return;
  record->state.message = message;
  // A conflict means someone else just wrote: the next tick looks again.
  (void)store_->UpdateDataset(*record);
}

void CacheNode::Impl::UpdatePhase(ActiveDataset& ds, const std::vector<NodeRecord>& nodes) {
  const StagerProgress mine = ds.stager->Progress();
  if (mine.state == StagingState::kCapacity && !ds.to_drop.empty()) {
    // Chunks this node gave up are in the way of the ones it owns now.
    DropDisowned(ds, "to make room for the chunks it owns now");
    ds.stager->Resume();
  }

  Result<std::map<std::string, StagingProgress>> all = store_->ListProgress(ds.name);
  if (!all.ok()) {
    if (all.status().code() != StatusCode::kNotFound) NoteStoreError(all.status());
    return;
  }
  const uint64_t replicas =
      std::min<uint64_t>(std::max<uint32_t>(1, ds.record.spec.replication), nodes.size());
  const ProgressSummary summary = SummarizeProgress(*all, nodes);
  const uint64_t total = summary.total.chunks_total;
  const uint64_t staged = summary.total.chunks_staged;
  const uint64_t failed = summary.total.samples_failed;
  const uint64_t bytes = summary.total.bytes_staged;
  // Every node's share adds up to the whole dataset only once they all
  // computed placement over the same membership.
  const bool complete = summary.all_staged && total == ds.manifest->chunk_count() * replicas;

  DatasetRecord record = ds.record;
  const DatasetPhase phase = record.state.phase;
  std::string message;
  if (complete && phase == DatasetPhase::kStaging) {
    record.state.phase = DatasetPhase::kReady;
    message = "staged on " + Plural(nodes.size(), "node") + ": " +
              Plural(ds.manifest->chunk_count(), "chunk") + ", " + std::to_string(bytes) + " bytes";
    if (failed > 0) message += "; " + Plural(failed, "sample") + " failed (see the node logs)";
    // Links the source's reads refuse were left out at the snapshot, not
    // failed here: say so, so their absence is not a surprise.
    if (const uint64_t links = ds.manifest->header().stats.skipped_symlinks; links > 0) {
      message += "; " + Plural(links, "symbolic link") + " left out at the snapshot";
    }
  } else if (!complete && phase == DatasetPhase::kReady) {
    record.state.phase = DatasetPhase::kStaging;
    message = "re-staging after a change of the nodes of pool " + config_.pool + ": " +
              std::to_string(staged) + " of " + std::to_string(total) + " chunks staged";
  } else if (!complete && mine.state == StagingState::kCapacity &&
             record.state.message.rfind("does not fit", 0) != 0) {
    message = "does not fit: node " + config_.node_id + " holds " +
              std::to_string(mine.chunks_staged) + " of the " + std::to_string(mine.chunks_owned) +
              " chunks it owns (" + std::to_string(mine.bytes_staged) + " of " +
              std::to_string(mine.bytes_owned) + " bytes) within its capacity of " +
              std::to_string(chunks_->capacity()) +
              " bytes; it staged what the plans read first and serves the rest from the source";
  }
  if (complete) DropDisowned(ds, "the dataset is Ready on the new owners");
  if (message.empty()) return;
  record.state.message = message;
  Result<DatasetRecord> updated = store_->UpdateDataset(record);
  if (updated.ok()) {
    if (updated->state.phase != phase) {
      log_->info("dataset {}: {} -> {}: {}", Quoted(ds.name), DatasetPhaseName(phase),
                 DatasetPhaseName(updated->state.phase), message);
    }
    ds.record = *updated;
  }
}

// ---- snapshots ----------------------------------------------------------------

void CacheNode::Impl::ClaimSnapshot(const std::vector<DatasetRecord>& datasets) {
  if (snapshot_running_) return;  // one walk at a time
  if (snapshot_thread_.joinable()) {
    snapshot_thread_.join();
    snapshot_dataset_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (stopping_) return;
  }
  for (const DatasetRecord& d : datasets) {
    if (d.spec.pool != config_.pool || d.spec.snapshot_by != SnapshotBy::kPool) continue;
    std::string why;
    if (d.state.phase == DatasetPhase::kPending) {
      why = "it is Pending";
    } else if (d.state.phase == DatasetPhase::kSnapshotting) {
      const std::string& claimant = d.state.claimed_by;
      if (claimant.empty()) {
        why = "it is Snapshotting with no claimant";
      } else if (claimant == config_.node_id) {
        // An earlier incarnation of this node claimed it; nothing walks it now.
        why = "this node's claim is from before it restarted";
      } else if (std::none_of(live_nodes_.begin(), live_nodes_.end(),
                              [&](const NodeRecord& n) { return n.id == claimant; })) {
        why = "its claimant, node " + claimant + ", is not live any more";
      }
    }
    if (why.empty()) continue;
    log_->info("dataset {}: claiming its snapshot ({})", Quoted(d.name), why);
    snapshot_dataset_ = d.name;
    snapshot_running_ = true;
    snapshot_thread_ = std::thread([this, d] { RunSnapshot(d); });
    return;
  }
}

void CacheNode::Impl::RunSnapshot(const DatasetRecord& record) {
  DatasetSnapshotOptions options;
  options.claimant = config_.node_id;
  options.process.helper_argv = snapshot_helper_;
  options.stop = &snapshot_stop_;
  options.check_interval = config_.heartbeat_interval;
  Result<DatasetSnapshot> snap = SnapshotDataset(*store_, record, options);
  std::string_view result;
  if (!snap.ok()) {
    result = "error";
    log_->warn("dataset {}: the snapshot could not be recorded: {} (taken again on a later pass)",
               Quoted(record.name), snap.status().ToString());
  } else {
    switch (snap->outcome) {
      case SnapshotOutcome::kNotClaimed:
        log_->info("dataset {}: another node claimed its snapshot first", Quoted(record.name));
        break;
      case SnapshotOutcome::kSnapshotted:
        result = "ok";
        log_->info("dataset {}: snapshot as uid {}: {} in {:.1f} s (manifest {}); Staging",
                   Quoted(record.name), record.owner.uid, snap->summary, snap->seconds,
                   snap->manifest_id);
        break;
      case SnapshotOutcome::kFailed:
        result = "failed";
        log_->warn("dataset {}: {}", Quoted(record.name), snap->record.state.message);
        break;
      case SnapshotOutcome::kSuperseded:
        result = "superseded";
        log_->info(
            "dataset {}: changed during the snapshot (now {}{}); the walk's result is dropped",
            Quoted(record.name), DatasetPhaseName(snap->record.state.phase),
            snap->record.state.claimed_by.empty()
                ? ""
                : ", claimed by " + snap->record.state.claimed_by);
        break;
      case SnapshotOutcome::kAbandoned:
        result = "abandoned";
        log_->info("dataset {}: snapshot abandoned: the node is stopping; the claim is released",
                   Quoted(record.name));
        break;
    }
    if (!result.empty()) metrics_.snapshot_seconds->Observe(snap->seconds);
  }
  for (size_t i = 0; i < kSnapshotResults.size(); ++i) {
    if (kSnapshotResults[i] == result) metrics_.snapshots[i]->Increment();
  }
  snapshot_running_ = false;
  reconcile_now_ = true;  // a dataset may be Staging now, or another waiting to be claimed
}

void CacheNode::Impl::StopSnapshot() {
  snapshot_stop_ = true;
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
}

// ---- metrics ------------------------------------------------------------------

void CacheNode::Impl::MetricsLoop() {
  for (;;) {
    RefreshMetrics();
    std::unique_lock<std::mutex> lock(state_mu_);
    if (state_cv_.wait_for(lock, kMetricsRefreshInterval, [this] { return stopping_; })) return;
  }
}

void CacheNode::Impl::RefreshMetrics() {
  UpdateNodeMetrics(metrics_, node_metric_state_, chunks_->Stats(), server_->Counters(),
                    reads_->Counters());
  std::lock_guard<std::mutex> lock(datasets_mu_);
  metrics_.datasets->Set(static_cast<double>(datasets_.size()));
  for (auto& [name, ds] : datasets_) {
    UpdateDatasetMetrics(ds->metrics, ds->metric_state, ds->stager->Progress(),
                         ds->source->Counters());
  }
}

// ---- CacheNode ------------------------------------------------------------------

Result<std::unique_ptr<CacheNode>> CacheNode::Start(const CacheNodeConfig& config,
                                                    std::vector<std::string> snapshot_helper) {
  auto impl = std::make_unique<Impl>(config, std::move(snapshot_helper));
  Status started = impl->Start();
  if (!started.ok()) {
    impl->Stop();
    return started;
  }
  return std::unique_ptr<CacheNode>(new CacheNode(std::move(impl)));
}

CacheNode::CacheNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CacheNode::~CacheNode() { Stop(); }
void CacheNode::Stop() { impl_->Stop(); }
uint16_t CacheNode::port() const { return impl_->port(); }
uint16_t CacheNode::metrics_port() const { return impl_->metrics_port(); }
const NetAddress& CacheNode::advertise() const { return impl_->advertise(); }
const std::string& CacheNode::node_id() const { return impl_->node_id(); }
size_t CacheNode::active_datasets() const { return impl_->active_datasets(); }

}  // namespace granary

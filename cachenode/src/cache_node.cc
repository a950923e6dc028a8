// The cache-node daemon (cache_node.h; its parts are listed in
// cache_node_impl.h): start and stop, heartbeats, readiness, metrics, and the
// CacheNode facade.

#include "granary/cachenode/cache_node.h"

#include <chrono>
#include <thread>

#include "cache_node_impl.h"
#include "granary/core/thread_name.h"
#include "granary/fabric/endpoint.h"

namespace granary {
namespace {

using SteadyClock = std::chrono::steady_clock;

}  // namespace

using cache_node_internal::kOnDemandSourceSlots;
using cache_node_internal::NowMs;

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
    GRANARY_RETURN_IF_ERROR(CheckCacheNodeAuthentication(config_, "the configuration"));
    log_->warn(
        "serve_without_authentication: `listen` ({}) requires no authentication: whoever reaches "
        "it can read every dataset this node serves (docs/security.md)",
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

void CacheNode::Impl::StartFabric(const ServerOptions& server_options) {
  if (!config_.fabric_listen.has_value()) return;
  const std::string where = "the fabric on `fabric_listen` (" + config_.fabric_listen->ToString() +
                            ", provider " + config_.fabric_provider + ")";
  Status usable = fabric::ProbeProvider(config_.fabric_provider);
  if (usable.ok()) {
    FabricServerOptions options;
    options.listen = config_.fabric_listen->ToString();
    options.provider = config_.fabric_provider;
    options.server = server_options;
    Result<std::unique_ptr<FabricServer>> fabric = FabricServer::Start(reads_, options);
    if (fabric.ok()) {
      fabric_ = std::move(*fabric);
      fabric_advertise_ = NetAddress{advertise_.host, fabric_->port()}.ToString();
      return;
    }
    usable = fabric.status();
  }
  log_->warn(
      "{} is not available: {}; serving TCP only (readers reach this node on `listen`; "
      "granary_cachenode_fabric_available is 0)",
      where, usable.ToString());
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
  read_options.verify_once = config_.verify_reads_once;
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
  StartFabric(server_options);

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
  if (fabric_ != nullptr) {
    log_->info("node {} also serves the fabric ({}) on port {}, advertised as {}",
               Quoted(config_.node_id), config_.fabric_provider, fabric_->port(),
               fabric_advertise_);
  }
  control_ = std::thread([this] {
    NameThisThread("control");
    ControlLoop();
  });
  metrics_thread_ = std::thread([this] {
    NameThisThread("node-metrics");
    MetricsLoop();
  });
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
  if (fabric_) fabric_->Stop();
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
  if (!fabric_advertise_.empty()) node.labels[std::string(kNodeLabelFabric)] = fabric_advertise_;
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
  UpdateFabricMetrics(
      metrics_, node_metric_state_,
      fabric_ != nullptr ? std::optional<FabricCounters>(fabric_->Counters()) : std::nullopt);
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

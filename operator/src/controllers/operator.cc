#include "granary/operator/operator.h"

#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "controller_context.h"
#include "granary/core/log.h"
#include "granary/core/thread_name.h"
#include "granary/operator/informer.h"
#include "granary/operator/leader_election.h"
#include "granary/operator/resources.h"
#include "granary/operator/webhook_lookup.h"
#include "granary/operator/webhook_registration.h"
#include "granary/operator/work_queue.h"

namespace granary::kube {

class Operator::Impl {
 public:
  Impl(KubeClient& client, OperatorOptions options)
      : client_(client), options_(std::move(options)), context_(client_, options_) {}

  Status Start() {
    if (options_.identity.empty()) {
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      options_.identity = std::string(host) + "-" + std::to_string(getpid());
    }
    InformerOptions pools;
    pools.collection_path = "/apis/granary.io/v1alpha1/cachepools";
    pools.resync = options_.resync;
    pool_informer_ = std::make_unique<Informer>(client_, pools, [this](const std::string& key) {
      pool_queue_.Add(key);
      WatchStoreSecrets();
      // A pool's datasets depend on it (missing pool, mounts, store).
      dataset_informer_->Visit([&](const Json& d) {
        if (d["spec"].value("cachePool", "") == key) dataset_queue_.Add(Informer::KeyOf(d));
      });
    });
    InformerOptions datasets;
    datasets.collection_path = "/apis/granary.io/v1alpha1/datasets";
    datasets.resync = options_.resync;
    datasets.count_by = PhaseOf;
    dataset_informer_ = std::make_unique<Informer>(
        client_, datasets, [this](const std::string& key) { OnDataset(key); });
    context_.SetInformers(pool_informer_.get(), dataset_informer_.get());
    // Namespaces: a Dataset's grant (its namespace's annotations) is read
    // from here, and a changed grant reaches the namespace's Datasets at once.
    InformerOptions namespaces;
    namespaces.collection_path = "/api/v1/namespaces";
    namespaces.resync = options_.resync;
    namespace_informer_ =
        std::make_unique<Informer>(client_, namespaces, [this](const std::string& ns) {
          dataset_informer_->Visit([&](const Json& d) {
            if (d["metadata"].value("namespace", "") == ns) {
              dataset_queue_.Add(Informer::KeyOf(d));
            }
          });
        });
    context_.SetNamespaces(namespace_informer_.get());
    // The cache-node pods of the operator's namespace: what the kubelet says
    // of them (an image it cannot pull, a container that exits) reaches
    // their pool's status at once.
    InformerOptions pods;
    pods.collection_path = "/api/v1/namespaces/" + options_.namespace_ + "/pods";
    pods.label_selector = "app.kubernetes.io/name=granary-cachenode";
    pods.resync = options_.resync;
    pod_informer_ = std::make_unique<Informer>(client_, pods, [this](const std::string& key) {
      std::optional<Json> pod = pod_informer_->Get(key);
      const std::string pool =
          pod ? (*pod)["metadata"].value("labels", Json::object()).value("granary.io/pool", "")
              : "";
      if (!pool.empty()) {
        pool_queue_.Add(pool);
      } else {
        for (const std::string& k : pool_informer_->Keys()) pool_queue_.Add(k);  // a pod went
      }
    });
    context_.SetPods(pod_informer_.get());
    // The cluster key's Secret (one Secret, by a field selector): a rotated
    // key reaches every pool's cache nodes at once.
    InformerOptions cluster_key;
    cluster_key.collection_path =
        "/api/v1/namespaces/" + options_.namespace_ +
        "/secrets?fieldSelector=" + UrlEncode("metadata.name=" + options_.cluster_key_secret);
    cluster_key.resync = options_.resync;
    cluster_key_informer_ =
        std::make_unique<Informer>(client_, cluster_key, [this](const std::string&) {
          for (const std::string& k : pool_informer_->Keys()) pool_queue_.Add(k);
        });
    context_.SetSecretCache(
        [this](const std::string& ns, const std::string& name) { return CachedSecret(ns, name); });
    if (options_.webhook && options_.webhook->manage_certificate) {
      // Every replica watches the one Secret (a field selector: no other
      // Secret of the namespace is read).
      InformerOptions tls;
      tls.collection_path =
          "/api/v1/namespaces/" + options_.webhook->namespace_ +
          "/secrets?fieldSelector=" + UrlEncode("metadata.name=" + options_.webhook->secret_name);
      tls.resync = options_.resync;
      webhook_secret_informer_ = std::make_unique<Informer>(
          client_, tls, [this](const std::string& key) { OnWebhookSecret(key); });
      webhook_secret_informer_->Start();
    }
    pool_informer_->Start();
    dataset_informer_->Start();
    namespace_informer_->Start();
    cluster_key_informer_->Start();
    pod_informer_->Start();
    if (options_.leader_elect) {
      LeaderElectionOptions le;
      le.lease_namespace = options_.namespace_;
      le.lease_name = options_.lease_name;
      le.identity = options_.identity;
      le.lease_duration = options_.lease_duration;
      le.renew_deadline = options_.renew_deadline;
      le.retry_period = options_.retry_period;
      elector_ = std::make_unique<LeaderElector>(
          client_, le,
          [this] {
            // Everything known is looked at by the new leader.
            for (const std::string& k : pool_informer_->Keys()) pool_queue_.Add(k);
            for (const std::string& k : dataset_informer_->Keys()) dataset_queue_.Add(k);
            WakeRegistrar();
          },
          [] {});
      elector_->Start();
    }
    for (int i = 0; i < std::max(1, options_.workers); ++i) {
      workers_.emplace_back([this] {
        NameThisThread("reconcile");
        Work();
      });
    }
    if (options_.webhook) {
      registrar_thread_ = std::thread([this] {
        NameThisThread("registrar");
        Register();
      });
    }
    return Status::Ok();
  }

  void Stop() {
    stop_ = true;
    pool_queue_.ShutDown();
    dataset_queue_.ShutDown();
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
    workers_.clear();
    WakeRegistrar();
    if (registrar_thread_.joinable()) registrar_thread_.join();
    if (elector_) elector_->Stop();
    if (pool_informer_) pool_informer_->Stop();
    if (dataset_informer_) dataset_informer_->Stop();
    if (webhook_secret_informer_) webhook_secret_informer_->Stop();
    if (namespace_informer_) namespace_informer_->Stop();
    if (cluster_key_informer_) cluster_key_informer_->Stop();
    if (pod_informer_) pod_informer_->Stop();
    std::map<std::string, std::unique_ptr<Informer>> secrets;
    {
      std::lock_guard lock(store_secrets_mu_);
      secrets.swap(store_secret_informers_);
    }
    secrets.clear();  // each stops its thread
  }

  bool leading() const { return !options_.leader_elect || (elector_ && elector_->is_leader()); }

  Status Ready() const {
    if (!pool_informer_ || !pool_informer_->synced() || !dataset_informer_->synced()) {
      return Status::Unavailable("the CachePool and Dataset informers have not listed yet");
    }
    return Status::Ok();
  }

  Counters counters() const {
    Counters c;
    c.reconciles = reconciles_.load();
    c.reconcile_errors = errors_.load();
    c.relists = (pool_informer_ ? pool_informer_->gone() : 0) +
                (dataset_informer_ ? dataset_informer_->gone() : 0);
    c.webhook_registrations = registrations_.load();
    c.webhook_certs_loaded = certs_loaded_.load();
    return c;
  }

  std::map<std::string, uint64_t> DatasetPhases() const {
    std::map<std::string, uint64_t> by_phase;
    for (const char* phase : kPhases) by_phase[phase] = 0;
    if (dataset_informer_ == nullptr || !dataset_informer_->synced()) return by_phase;
    for (const auto& [phase, count] : dataset_informer_->Counts()) by_phase[phase] += count;
    return by_phase;
  }

  std::vector<Operator::NamespaceUsage> Usage() const {
    std::vector<Operator::NamespaceUsage> out;
    if (!pool_informer_ || !pool_informer_->synced() || !dataset_informer_->synced()) return out;
    std::map<std::pair<std::string, std::string>, Operator::NamespaceUsage> by;
    for (const Json& p : pool_informer_->List()) {
      Result<CachePool> pool = ParseCachePool(p);
      if (!pool.ok()) continue;
      for (const NamespaceQuota& q : pool->quotas) {
        Operator::NamespaceUsage& u = by[{pool->name, q.namespace_}];
        u.pool = pool->name;
        u.namespace_ = q.namespace_;
        u.quota_bytes = q.bytes;
      }
    }
    dataset_informer_->Visit([&](const Json& d) {
      const Json& meta = d["metadata"];
      const std::string pool = d["spec"].value("cachePool", "");
      const std::string ns = meta.value("namespace", "");
      if (pool.empty() || ns.empty()) return;
      Operator::NamespaceUsage& u = by[{pool, ns}];
      u.pool = pool;
      u.namespace_ = ns;
      const Json& st = d.value("status", Json::object());
      if (!st.is_object()) return;
      const int64_t replication = d["spec"].value("replication", 1);
      if (st.contains("totalBytes") && st["totalBytes"].is_number_unsigned()) {
        u.wanted_bytes += st["totalBytes"].get<uint64_t>() *
                          static_cast<uint64_t>(std::max<int64_t>(1, replication));
      }
      if (st.contains("stagedBytes") && st["stagedBytes"].is_number_unsigned()) {
        u.resident_bytes += st["stagedBytes"].get<uint64_t>();
      }
    });
    for (auto& [k, u] : by) out.push_back(std::move(u));
    return out;
  }

  std::optional<Json> CachedDataset(const std::string& key) const {
    if (!dataset_informer_ || !dataset_informer_->synced()) return std::nullopt;
    return dataset_informer_->Get(key);
  }
  std::optional<Json> CachedPool(const std::string& name) const {
    if (!pool_informer_ || !pool_informer_->synced()) return std::nullopt;
    return pool_informer_->Get(name);
  }

 private:
  static constexpr const char* kPhases[] = {"Pending", "Snapshotting", "Staging", "Ready",
                                            "Failed"};

  // A Dataset's status.phase for the counts; not reconciled yet, or a phase
  // this build does not know: Pending.
  static std::string PhaseOf(const Json& d) {
    if (d.contains("status") && d["status"].is_object() && d["status"].contains("phase") &&
        d["status"]["phase"].is_string()) {
      const std::string phase = d["status"]["phase"].get<std::string>();
      for (const char* known : kPhases) {
        if (phase == known) return phase;
      }
    }
    return "Pending";
  }

  // A Dataset changed (or went). Besides itself: when what its namespace's
  // quota split depends on changed (its pool, priority, size, replication,
  // deletion, or it is gone), the other Datasets of its namespace in pools with a quota
  // for that namespace; and a pool being deleted that waits for it.
  void OnDataset(const std::string& key) {
    dataset_queue_.Add(key);
    std::optional<Json> d = dataset_informer_->Get(key);
    std::string fingerprint;
    std::string pool;
    if (d) {
      const Json& spec = (*d)["spec"];
      const Json& status = d->value("status", Json::object());
      pool = spec.value("cachePool", "");
      fingerprint = pool + "|" + spec.value("cache", Json::object()).dump() + "|" +
                    spec.value("replication", Json(1)).dump() + "|" +
                    (status.is_object() ? status.value("totalBytes", Json()).dump() : "") + "|" +
                    ((*d)["metadata"].contains("deletionTimestamp") ? "deleting" : "");
    }
    {
      std::lock_guard lock(fingerprints_mu_);
      auto it = fingerprints_.find(key);
      const bool same =
          d ? (it != fingerprints_.end() && it->second == fingerprint) : it == fingerprints_.end();
      if (same) return;
      if (it != fingerprints_.end()) {
        const std::string before = it->second.substr(0, it->second.find('|'));
        if (pool.empty()) {
          pool = before;  // the pool it was in
        } else if (before != pool && !before.empty()) {
          pool_queue_.Add(before);  // it left that pool, which may not be in use any more
        }
      }
      if (d) {
        fingerprints_[key] = fingerprint;
      } else if (it != fingerprints_.end()) {
        fingerprints_.erase(it);
      }
    }
    if (pool.empty()) return;
    std::optional<Json> pool_object = pool_informer_->Get(pool);
    if (!pool_object) return;
    // Whether a Dataset names it decides the pool's finalizer, and a pool
    // being deleted may be waiting for this one.
    pool_queue_.Add(pool);
    const std::string ns = key.substr(0, key.find('/'));
    bool quota = false;
    Result<CachePool> parsed = ParseCachePool(*pool_object);
    for (const NamespaceQuota& q : parsed.ok() ? parsed->quotas : std::vector<NamespaceQuota>()) {
      quota = quota || q.namespace_ == ns;
    }
    if (!quota) return;
    dataset_informer_->Visit([&](const Json& peer) {
      if (peer["metadata"].value("namespace", "") == ns &&
          peer["spec"].value("cachePool", "") == pool && Informer::KeyOf(peer) != key) {
        dataset_queue_.Add(Informer::KeyOf(peer));
      }
    });
  }

  // The key of the informer of every copy of pool `pool`'s store Secret (in
  // the Datasets' namespaces, all named SidecarStoreSecretName(pool)).
  static std::string StoreCopiesKey(const std::string& pool) { return "copies of " + pool; }

  // A Secret from the informer that watches it, if one has listed: the
  // pools' store Secrets and their copies, and the cluster key.
  std::optional<Result<Json>> CachedSecret(const std::string& ns, const std::string& name) {
    const std::string key = ns + "/" + name;
    auto answer = [&](const Informer& informer) -> std::optional<Result<Json>> {
      if (!informer.synced()) return std::nullopt;
      std::optional<Json> object = informer.Get(key);
      if (object) return Result<Json>(std::move(*object));
      return Result<Json>(Status::NotFound("Secret " + key + " not found"));
    };
    if (ns == options_.namespace_ && name == options_.cluster_key_secret) {
      return answer(*cluster_key_informer_);
    }
    std::lock_guard lock(store_secrets_mu_);
    auto it = store_secret_informers_.find(key);
    if (it != store_secret_informers_.end()) return answer(*it->second);
    const std::string prefix = SidecarStoreSecretName("");
    if (name.rfind(prefix, 0) == 0) {
      it = store_secret_informers_.find(StoreCopiesKey(name.substr(prefix.size())));
      if (it != store_secret_informers_.end()) return answer(*it->second);
    }
    return std::nullopt;
  }

  // "namespace/name" of a pool's store Secret.
  std::string StoreSecretKey(const CachePool& pool) const {
    return (pool.store_secret_namespace.empty() ? options_.namespace_
                                                : pool.store_secret_namespace) +
           "/" + pool.store_secret_name;
  }

  // One informer per store Secret some pool names (few pools, each a watch
  // of one Secret by a field selector): a changed URL reaches the pool's
  // objects and the Datasets' copies (ReconcileDataset) at once, not at the
  // next periodic look. Runs on the pool informer's thread.
  void WatchStoreSecrets() {
    if (stop_) return;
    std::set<std::string> wanted;
    std::map<std::string, std::string> copies;  // StoreCopiesKey -> pool
    for (const Json& p : pool_informer_->List()) {
      Result<CachePool> pool = ParseCachePool(p);
      if (pool.ok() && !pool->store_secret_name.empty()) wanted.insert(StoreSecretKey(*pool));
      if (pool.ok()) {
        copies[StoreCopiesKey(pool->name)] = pool->name;
        wanted.insert(StoreCopiesKey(pool->name));
      }
    }
    std::vector<std::unique_ptr<Informer>> unused;
    std::lock_guard lock(store_secrets_mu_);
    for (auto it = store_secret_informers_.begin(); it != store_secret_informers_.end();) {
      if (wanted.count(it->first) == 0) {
        unused.push_back(std::move(it->second));
        it = store_secret_informers_.erase(it);
      } else {
        ++it;
      }
    }
    for (const std::string& key : wanted) {
      if (store_secret_informers_.count(key) != 0) continue;
      InformerOptions o;
      o.resync = options_.resync;
      std::function<void(const std::string&)> on_change;
      if (auto copy = copies.find(key); copy != copies.end()) {
        // Every namespace's copy of the pool's store Secret: a copy deleted
        // or changed by hand is put back by its namespace's Datasets.
        o.collection_path = "/api/v1/secrets?fieldSelector=" +
                            UrlEncode("metadata.name=" + SidecarStoreSecretName(copy->second));
        on_change = [this, pool = copy->second](const std::string& secret_key) {
          OnStoreCopy(pool, secret_key.substr(0, secret_key.find('/')));
        };
      } else {
        const size_t slash = key.find('/');
        o.collection_path =
            "/api/v1/namespaces/" + key.substr(0, slash) +
            "/secrets?fieldSelector=" + UrlEncode("metadata.name=" + key.substr(slash + 1));
        on_change = [this, key](const std::string&) { OnStoreSecret(key); };
      }
      auto informer = std::make_unique<Informer>(client_, o, std::move(on_change));
      informer->Start();
      store_secret_informers_[key] = std::move(informer);
    }
    // `unused` stop (join their threads) here; their callbacks take no lock.
  }

  // A copy of pool `pool`'s store Secret in namespace `ns` changed: the
  // Datasets of that pool there are looked at.
  void OnStoreCopy(const std::string& pool, const std::string& ns) {
    dataset_informer_->Visit([&](const Json& d) {
      if (d["metadata"].value("namespace", "") == ns && d["spec"].value("cachePool", "") == pool) {
        dataset_queue_.Add(Informer::KeyOf(d));
      }
    });
  }

  // A store Secret changed: its pools and their Datasets are looked at.
  void OnStoreSecret(const std::string& secret_key) {
    std::set<std::string> pools;
    for (const Json& p : pool_informer_->List()) {
      Result<CachePool> pool = ParseCachePool(p);
      if (pool.ok() && StoreSecretKey(*pool) == secret_key) pools.insert(pool->name);
    }
    for (const std::string& pool : pools) pool_queue_.Add(pool);
    dataset_informer_->Visit([&](const Json& d) {
      if (pools.count(d["spec"].value("cachePool", "")) != 0) {
        dataset_queue_.Add(Informer::KeyOf(d));
      }
    });
  }

  // The webhook Secret changed (every replica): a usable new certificate is
  // handed on; the leader's registrar looks at it.
  void OnWebhookSecret(const std::string& key) {
    auto log = GetLogger("operator");
    std::optional<Json> secret = webhook_secret_informer_->Get(key);
    if (secret) {
      Result<WebhookCert> cert = WebhookCertFromSecret(*secret);
      Status usable = cert.ok() ? InspectWebhookCert(*cert).status() : cert.status();
      if (!usable.ok()) {
        log->warn("the webhook Secret {} is not usable ({}); serving the last certificate", key,
                  usable.message());
      } else if (cert->cert_pem != served_cert_pem_) {
        served_cert_pem_ = cert->cert_pem;
        if (options_.on_webhook_cert) options_.on_webhook_cert(*cert);
        ++certs_loaded_;
        log->info("serving the webhook certificate of Secret {}", key);
      }
    }
    WakeRegistrar();
  }

  void WakeRegistrar() {
    std::lock_guard lock(registrar_mu_);
    registrar_wake_ = true;
    registrar_cv_.notify_all();
  }

  void WaitRegistrar(std::chrono::milliseconds d) {
    std::unique_lock lock(registrar_mu_);
    registrar_cv_.wait_for(lock, d, [this] { return registrar_wake_ || stop_.load(); });
    registrar_wake_ = false;
  }

  // The leader keeps the webhook's Secret and registration.
  void Register() {
    auto log = GetLogger("operator");
    WebhookRegistrar registrar(client_, *options_.webhook);
    std::chrono::milliseconds backoff{500};
    while (!stop_) {
      if (!leading() ||
          (webhook_secret_informer_ != nullptr && !webhook_secret_informer_->synced())) {
        WaitRegistrar(std::chrono::milliseconds(200));
        continue;
      }
      Result<std::chrono::milliseconds> next = registrar.Reconcile();
      if (next.ok()) {
        ++registrations_;
        backoff = std::chrono::milliseconds(500);
        WaitRegistrar(*next);
      } else {
        log->warn("keeping the sidecar webhook registered: {} (retry in {} ms)",
                  next.status().ToString(), backoff.count());
        WaitRegistrar(backoff);
        backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(30));
      }
    }
  }

  // Alternates between the two queues so neither kind starves the other.
  void Work() {
    auto log = GetLogger("operator");
    bool pools_first = true;
    while (!stop_) {
      if (!leading() || !pool_informer_->synced() || !dataset_informer_->synced()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      WorkQueue& first = pools_first ? pool_queue_ : dataset_queue_;
      WorkQueue& second = pools_first ? dataset_queue_ : pool_queue_;
      pools_first = !pools_first;
      std::optional<std::string> key = first.Get(std::chrono::milliseconds(0));
      WorkQueue* queue = &first;
      if (!key) {
        key = second.Get(std::chrono::milliseconds(100));
        queue = &second;
      }
      if (!key) continue;
      // A replica that lost the lease between Get and here hands the key back.
      if (!leading()) {
        queue->Done(*key);
        queue->Add(*key);
        continue;
      }
      const bool is_pool = queue == &pool_queue_;
      Result<std::chrono::milliseconds> next =
          is_pool ? ReconcileCachePool(context_, *key) : ReconcileDataset(context_, *key);
      ++reconciles_;
      log->debug("reconciled {} {}: {}", is_pool ? "CachePool" : "Dataset", *key,
                 next.ok() ? "again in " + std::to_string(next->count()) + " ms"
                           : next.status().ToString());
      if (next.ok()) {
        queue->Forget(*key);
        queue->Done(*key);
        if (next->count() > 0) queue->AddAfter(*key, *next);
      } else {
        ++errors_;
        log->warn("reconciling {} {}: {} (retry {})", is_pool ? "CachePool" : "Dataset", *key,
                  next.status().ToString(), queue->Retries(*key) + 1);
        queue->Done(*key);
        queue->AddRateLimited(*key);
      }
    }
  }

  KubeClient& client_;
  OperatorOptions options_;
  ControllerContext context_;
  WorkQueue pool_queue_;
  WorkQueue dataset_queue_;
  std::unique_ptr<Informer> pool_informer_;
  std::unique_ptr<Informer> dataset_informer_;
  std::unique_ptr<Informer> webhook_secret_informer_;
  std::unique_ptr<Informer> namespace_informer_;
  std::unique_ptr<Informer> cluster_key_informer_;
  std::unique_ptr<Informer> pod_informer_;
  std::string served_cert_pem_;  // webhook_secret_informer_'s thread only
  std::mutex store_secrets_mu_;
  // By "ns/name" of a pool's store Secret, and by StoreCopiesKey(pool) for
  // the copies of it in every namespace.
  std::map<std::string, std::unique_ptr<Informer>> store_secret_informers_;
  // By Dataset key: what of it the quota split of its namespace depends on,
  // as last seen (OnDataset, on the dataset informer's thread).
  std::mutex fingerprints_mu_;
  std::map<std::string, std::string> fingerprints_;
  std::unique_ptr<LeaderElector> elector_;
  std::vector<std::thread> workers_;
  std::thread registrar_thread_;
  std::mutex registrar_mu_;
  std::condition_variable registrar_cv_;
  bool registrar_wake_ = false;  // guarded by registrar_mu_
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reconciles_{0}, errors_{0}, registrations_{0}, certs_loaded_{0};
};

Operator::Operator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Operator::~Operator() { Stop(); }

Result<std::unique_ptr<Operator>> Operator::Start(KubeClient& client, OperatorOptions options) {
  auto impl = std::make_unique<Impl>(client, std::move(options));
  GRANARY_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Operator>(new Operator(std::move(impl)));
}

void Operator::Stop() {
  if (impl_) impl_->Stop();
}
bool Operator::leading() const { return impl_->leading(); }
Status Operator::Ready() const { return impl_->Ready(); }
Operator::Counters Operator::counters() const { return impl_->counters(); }

std::map<std::string, uint64_t> Operator::DatasetPhases() const { return impl_->DatasetPhases(); }
std::vector<Operator::NamespaceUsage> Operator::Usage() const { return impl_->Usage(); }
std::optional<Json> Operator::CachedDataset(const std::string& key) const {
  return impl_->CachedDataset(key);
}
std::optional<Json> Operator::CachedPool(const std::string& name) const {
  return impl_->CachedPool(name);
}

}  // namespace granary::kube

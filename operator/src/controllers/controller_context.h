#pragma once

// What the CachePool and Dataset reconcilers share inside granary-operator:
// the API client, the informers' caches, the metadata stores of the pools
// (opened from their Secrets, one per URL), and Events. Objects are read from
// the informers (CachePools, Datasets, Namespaces, and the Secrets the
// operator watches); the API server is asked only for what no informer holds
// yet, so a reconcile costs no GET.
//
// Thread safety: every method may be called from the worker threads at once.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "granary/core/metadata_store.h"
#include "granary/kube/kube_client.h"
#include "granary/operator/cache_node_pods.h"
#include "granary/operator/informer.h"
#include "granary/operator/operator.h"
#include "granary/operator/resources.h"

namespace granary::kube {

class ControllerContext {
 public:
  ControllerContext(KubeClient& client, const OperatorOptions& options)
      : client_(client), options_(options) {}

  KubeClient& client() { return client_; }
  const OperatorOptions& options() const { return options_; }
  void SetInformers(Informer* pools, Informer* datasets) {
    pools_ = pools;
    datasets_ = datasets;
  }
  Informer& pools() { return *pools_; }
  Informer& datasets() { return *datasets_; }
  void SetNamespaces(Informer* namespaces) { namespaces_ = namespaces; }
  // The cache-node pods of the operator's namespace (what the kubelet says
  // of them: CacheNodeTroubleOf).
  void SetPods(Informer* pods) { pods_ = pods; }
  // Where Secret(ns, name) looks first: an answer (the object, or kNotFound)
  // when an informer that has listed holds that Secret's collection; nullopt
  // when none does (then the API server is asked).
  using SecretCache =
      std::function<std::optional<Result<Json>>(const std::string& ns, const std::string& name)>;
  void SetSecretCache(SecretCache cache) { secret_cache_ = std::move(cache); }

  // A Secret, from the informers when they hold it, else from the API server.
  Result<Json> Secret(const std::string& ns, const std::string& name);
  // A Namespace, likewise.
  Result<Json> Namespace(const std::string& name);

  // The store URL in the pool's Secret (secretRef; its namespace defaults to
  // the operator's).
  Result<std::string> StoreUrl(const CachePool& pool);
  // The pool's store, opened once per URL and kept.
  Result<MetadataStore*> StoreFor(const CachePool& pool);
  // The store at `url` (StoreUrl's answer), opened once and kept.
  Result<MetadataStore*> StoreAt(const std::string& url, const CachePool& pool);

  // Why pool `pool`'s cache-node pods do not run (cache_node_pods.h), from
  // the pod informer and, for a pod still creating its containers, its
  // FailedMount Events (one list per such pod, at most a few pods). nullopt
  // when none has a trouble, or the pod informer has not listed (an
  // operator without the RBAC to watch pods reports only the counts). The
  // answer is kept for the pool's Datasets: LastCacheNodeTrouble.
  std::optional<CacheNodeTrouble> CacheNodeTroubleOf(const CachePool& pool);
  std::optional<CacheNodeTrouble> LastCacheNodeTrouble(const std::string& pool);

  // Records a core/v1 Event about `object` (deduplicated: the same reason and
  // message for the same object at most once per 10 minutes).
  void Event(const Json& object, const std::string& type, const std::string& reason,
             const std::string& message);

  // Server-side applies `body` at `path` unless this process applied the very
  // same body there less than kReapplyEvery ago: a pool's periodic refresh
  // then costs no request for objects that did not change (a changed body,
  // or the interval passed, applies; an object deleted by hand comes back
  // within that interval).
  static constexpr std::chrono::minutes kReapplyEvery{2};
  Status ApplyIfChanged(const std::string& path, const Json& body);
  // Sets `object`'s metadata.finalizers (at API path `path`) to `finalizers`,
  // as a compare-and-set on its resourceVersion.
  Status SetFinalizers(const std::string& path, const Json& object, const Json& finalizers);

 private:
  KubeClient& client_;
  const OperatorOptions& options_;
  Informer* pools_ = nullptr;
  Informer* datasets_ = nullptr;
  Informer* namespaces_ = nullptr;
  Informer* pods_ = nullptr;
  SecretCache secret_cache_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<MetadataStore>> stores_;  // by URL; guarded by mu_
  std::map<std::string, std::chrono::steady_clock::time_point> events_;
  // By pool name: CacheNodeTroubleOf's last answer; guarded by mu_.
  std::map<std::string, CacheNodeTrouble> troubles_;
  // path -> (hash of the body applied, when); guarded by mu_.
  std::map<std::string, std::pair<uint64_t, std::chrono::steady_clock::time_point>> applied_;
};

// Each reconciler returns when to look at the key again (0: only on change),
// or an error, after which the key is retried with backoff.
Result<std::chrono::milliseconds> ReconcileCachePool(ControllerContext& context,
                                                     const std::string& key);
Result<std::chrono::milliseconds> ReconcileDataset(ControllerContext& context,
                                                   const std::string& key);

// The objects a CachePool owns (exposed for tests of their shape).
Json CacheNodeConfigMap(const CachePool& pool, const OperatorOptions& options);
Json CacheNodeDaemonSet(const CachePool& pool, const OperatorOptions& options,
                        const std::string& config_hash);
Json OwnerReference(const Json& owner);

}  // namespace granary::kube

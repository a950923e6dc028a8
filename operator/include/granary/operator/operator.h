#pragma once

// granary-operator's controller: Kubernetes CachePools and Datasets turned
// into Granary's world (docs/kubernetes.md).
//
//   CachePool → in the operator's namespace, owned by the pool (server-side
//     apply, fieldManager granary-operator): a Secret with the store URL
//     copied from the pool's secretRef, a ConfigMap with the cache nodes'
//     configuration, a DaemonSet of granary-cachenode on the pool's nodes, a
//     headless Service for their metrics; status from the DaemonSet, the
//     store's node records and what the kubelet says of the pool's pods
//     (cache_node_pods.h).
//   Dataset → a dataset record in the pool's metadata store, named by
//     GranaryDatasetName (unique across namespaces), snapshotted by the
//     pool's cache nodes as the Dataset's runAs identity and staged by them;
//     status (phase, conditions Snapshotted/Staged/Ready, counts) from the
//     store's records and verified progress. A finalizer deletes the record
//     (the nodes drop the chunks) before the Dataset goes. The pool's store
//     Secret is copied into the Dataset's namespace as
//     SidecarStoreSecretName(pool) for the injected sidecars, owned by every
//     Dataset of that pool there, and deleted with the last of them.
//   Webhook (with OperatorOptions::webhook) → the serving certificate's
//     Secret and the MutatingWebhookConfiguration (webhook_registration.h),
//     kept by the leader; every replica is handed each new certificate.
//
// Informers (list+watch) feed a WorkQueue per kind; `workers` threads
// reconcile. With leader election only the Lease holder reconciles; the
// others keep their informers warm and take over within the lease time.
//
// Thread safety: Start/Stop from one thread; the rest is internal.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granary/core/status.h"
#include "granary/kube/kube_client.h"
#include "granary/operator/webhook_cert.h"
#include "granary/operator/webhook_registration.h"

namespace granary::kube {

struct OperatorOptions {
  std::string namespace_ = "granary";  // where it creates pool objects and its Lease
  std::string identity;                // this replica (pod name); default host name + pid
  bool leader_elect = true;
  std::string lease_name = "granary-operator";
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
  int workers = 2;
  // How often a Dataset that is not Ready (and a pool) is looked at again,
  // to follow staging in the store; Ready ones every `ready_interval`.
  std::chrono::milliseconds progress_interval{2000};
  std::chrono::milliseconds ready_interval{30000};
  std::chrono::milliseconds resync{60000};
  // The cache-node command in the DaemonSet's container.
  std::string cachenode_command = "granary-cachenode";
  // The cache nodes' ServiceAccount (it may create TokenReviews, to check
  // the sidecars' tokens) and the Secret holding the cluster key (made, with
  // a fresh key, when missing; never overwritten: docs/security.md).
  std::string cachenode_service_account = "granary-cachenode";
  std::string cluster_key_secret = "granary-cluster-key";
  // The sidecar webhook's certificate and registration; unset: neither.
  std::optional<WebhookRegistrationOptions> webhook;
  // With webhook->manage_certificate: called with every new usable
  // certificate of the webhook Secret, on every replica (from an informer
  // thread), e.g. WebhookServer::SetCertificate.
  std::function<void(const WebhookCert&)> on_webhook_cert;
};

class Operator {
 public:
  static Result<std::unique_ptr<Operator>> Start(KubeClient& client, OperatorOptions options);
  ~Operator();
  Operator(const Operator&) = delete;
  Operator& operator=(const Operator&) = delete;

  void Stop();
  bool leading() const;
  // OK once the informers have listed (readiness).
  Status Ready() const;

  struct Counters {
    uint64_t reconciles = 0;
    uint64_t reconcile_errors = 0;
    uint64_t relists = 0;
    uint64_t webhook_registrations = 0;  // successful WebhookRegistrar::Reconcile calls
    uint64_t webhook_certs_loaded = 0;   // certificates handed to on_webhook_cert
  };
  Counters counters() const;
  // Datasets in the informer's cache by status.phase (Pending, Snapshotting,
  // Staging, Ready, Failed; each present, 0 when none; a Dataset not
  // reconciled yet counts as Pending). All zero until the informer has listed.
  std::map<std::string, uint64_t> DatasetPhases() const;
  // Per pool and namespace, from the informers' caches: the namespace's
  // quota in the pool (0: none), what its Datasets there need (status
  // totalBytes × replication) and hold (status stagedBytes, replicas
  // counted). Every pair with a quota or a Dataset; empty until the
  // informers have listed.
  struct NamespaceUsage {
    std::string pool;
    std::string namespace_;
    uint64_t quota_bytes = 0;
    uint64_t wanted_bytes = 0;
    uint64_t resident_bytes = 0;
  };
  std::vector<NamespaceUsage> Usage() const;
  // A Dataset ("namespace/name") and a CachePool (name) from the informers'
  // caches: nullopt when not there, or before the informer has listed (the
  // webhook then asks the API server: CachedInjectionLookup).
  std::optional<Json> CachedDataset(const std::string& key) const;
  std::optional<Json> CachedPool(const std::string& name) const;

 private:
  class Impl;
  explicit Operator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary::kube

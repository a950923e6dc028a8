#pragma once

// granary-operator's controller: Kubernetes CachePools and Datasets turned
// into Granary's world (docs/kubernetes.md).
//
//   CachePool → in the operator's namespace, owned by the pool (server-side
//     apply, fieldManager granary-operator): a Secret with the store URL
//     copied from the pool's secretRef, a ConfigMap with the cache nodes'
//     configuration, a DaemonSet of granary-cachenode on the pool's nodes, a
//     headless Service for their metrics; status from the DaemonSet and the
//     store's node records.
//   Dataset → a dataset record in the pool's metadata store, named by
//     GranaryDatasetName (unique across namespaces), snapshotted by the
//     pool's cache nodes as the Dataset's runAs identity and staged by them;
//     status (phase, conditions Snapshotted/Staged/Ready, counts) from the
//     store's records and verified progress. A finalizer deletes the record
//     (the nodes drop the chunks) before the Dataset goes.
//
// Informers (list+watch) feed a WorkQueue per kind; `workers` threads
// reconcile. With leader election only the Lease holder reconciles; the
// others keep their informers warm and take over within the lease time.
//
// Thread safety: Start/Stop from one thread; the rest is internal.

#include <chrono>
#include <memory>
#include <string>

#include "granary/core/status.h"
#include "granary/operator/kube_client.h"

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
  };
  Counters counters() const;

 private:
  class Impl;
  explicit Operator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary::kube

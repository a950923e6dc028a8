#include "granary/operator/operator.h"

#include <unistd.h>

#include <thread>
#include <vector>

#include "controller_context.h"
#include "granary/core/log.h"
#include "granary/operator/informer.h"
#include "granary/operator/leader_election.h"
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
      // A pool's datasets depend on it (missing pool, mounts, store).
      for (const Json& d : dataset_informer_->List()) {
        if (d["spec"].value("cachePool", "") == key) dataset_queue_.Add(Informer::KeyOf(d));
      }
    });
    InformerOptions datasets;
    datasets.collection_path = "/apis/granary.io/v1alpha1/datasets";
    datasets.resync = options_.resync;
    dataset_informer_ = std::make_unique<Informer>(
        client_, datasets, [this](const std::string& key) { dataset_queue_.Add(key); });
    context_.SetInformers(pool_informer_.get(), dataset_informer_.get());
    pool_informer_->Start();
    dataset_informer_->Start();
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
          },
          [] {});
      elector_->Start();
    }
    for (int i = 0; i < std::max(1, options_.workers); ++i) {
      workers_.emplace_back([this] { Work(); });
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
    if (elector_) elector_->Stop();
    if (pool_informer_) pool_informer_->Stop();
    if (dataset_informer_) dataset_informer_->Stop();
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
    return c;
  }

 private:
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
  std::unique_ptr<LeaderElector> elector_;
  std::vector<std::thread> workers_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reconciles_{0}, errors_{0};
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

}  // namespace granary::kube

#pragma once

// PlanRegistrar: registers the plans that SET_PLAN announces in the metadata
// store on a thread of its own, so that a SET_PLAN is answered as soon as the
// sidecar's own prefetch has the plan, not after the store's write. The
// registration only serves the cache nodes' staging order; on a busy store
// (an SQLite file other daemons write to, a Redis far away) that write took
// from 8 to 240 ms, and the first batch of every epoch waited for it
// (docs/benchmarks.md, "The first batch of a cold epoch").
//
// Plans queued for the same dataset and plan_id are registered once, the
// newest record winning (every rank of a job announces the same record).
// A failed registration is counted (`on_error`) and logged; the next SET_PLAN
// of that plan tries again. At most kMaxPendingPlans wait; past that a plan
// is refused through `on_error` (a store that stopped answering must not
// grow the sidecar without bound). Destruction registers what is queued,
// then stops.
//
// Thread safety: every member may be called from any thread.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::sidecar {

// Plans waiting for the store at most; past it a plan is not queued (and
// `on_error` says so).
inline constexpr size_t kMaxPendingPlans = 1024;

class PlanRegistrar {
 public:
  // `on_error` runs on the registrar's thread with the dataset, the plan and
  // what failed; it may be empty.
  using ErrorFn =
      std::function<void(const std::string& dataset, const PlanRecord& plan, const Status& failed)>;
  PlanRegistrar(MetadataStore* store, ErrorFn on_error);
  PlanRegistrar(const PlanRegistrar&) = delete;
  PlanRegistrar& operator=(const PlanRegistrar&) = delete;
  ~PlanRegistrar();

  // Queues `plan` of `dataset` for the store; returns at once.
  void Register(std::string dataset, PlanRecord plan);
  // Waits until everything queued before this call has been written (or has
  // failed). For tests and shutdown; the request path never waits.
  void Flush();
  // Registrations written (or failed) so far.
  uint64_t completed() const;

 private:
  struct Pending {
    std::string dataset;
    PlanRecord plan;
  };
  void Loop();

  MetadataStore* const store_;
  const ErrorFn on_error_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // queue_ grew, or stopping_
  std::condition_variable done_cv_;  // completed_ moved
  std::deque<Pending> queue_;        // guarded by mu_
  uint64_t queued_ = 0;              // guarded by mu_: Register calls that added an entry
  uint64_t completed_ = 0;           // guarded by mu_: entries written or failed
  bool stopping_ = false;            // guarded by mu_
  std::thread thread_;               // last: started once the rest is set
};

}  // namespace granary::sidecar

#pragma once

// PlanRegistrar: writes the plans that SET_PLAN announces to the metadata
// store on a thread of its own, so that SET_PLAN is answered as soon as the
// sidecar's own prefetch has the plan. The store's copy only orders the cache
// nodes' staging; a write to a store other daemons also write can take
// hundreds of milliseconds, which every epoch's first batch would otherwise
// wait for (docs/benchmarks.md, "The first batch of a cold epoch").
//
// Plans queued for the same dataset and plan_id are written once, the newest
// record winning (every rank of a job announces the same record). At most
// kMaxPendingPlans wait: past that a plan is refused through `on_error` (a
// store that stopped answering must not grow the sidecar without bound). A
// failed write is reported through `on_error` too; the plan's next SET_PLAN
// queues it again. Destruction waits for the write in progress and drops the
// rest: call Flush first to write it.
//
// Thread safety: every member may be called from any thread.

#include <chrono>
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

// Plans waiting for the store at most.
inline constexpr size_t kMaxPendingPlans = 1024;

class PlanRegistrar {
 public:
  // `on_error` gets the dataset, the plan and why it was not written: on the
  // registrar's thread for a failed write, on the caller's thread for a plan
  // Register refused. It may be empty.
  using ErrorFn =
      std::function<void(const std::string& dataset, const PlanRecord& plan, const Status& failed)>;
  PlanRegistrar(MetadataStore* store, ErrorFn on_error);
  PlanRegistrar(const PlanRegistrar&) = delete;
  PlanRegistrar& operator=(const PlanRegistrar&) = delete;
  ~PlanRegistrar();

  // Queues `plan` of `dataset` for the store; returns at once.
  void Register(std::string dataset, PlanRecord plan);
  // Waits until everything queued before this call has been written (or has
  // failed), or until `deadline`. Returns how many of those were still not
  // done then (0: all were). For tests and shutdown; requests never wait.
  size_t Flush(std::chrono::steady_clock::time_point deadline =
                   std::chrono::steady_clock::time_point::max());
  // Registrations written (or failed) so far.
  uint64_t completed() const;
  // Plans queued and not yet taken by the registrar's thread.
  size_t pending() const;

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

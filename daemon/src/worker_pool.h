#pragma once

// WorkerPool: the observability endpoint's fixed set of threads answering
// complete requests (request_reader.h reads them first), with a bounded
// queue: when it is full, TryEnqueue says so and the request waits with the
// reader instead of growing a queue here. cpp-httplib's own ThreadPool has no
// bound.
//
// Who calls it: ObservabilityServer (observability.cc) only.
//
// Thread safety: TryEnqueue and Shutdown from any thread; Shutdown is
// idempotent and also run by the destructor.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "granary/core/status.h"

namespace granary::observability {

class WorkerPool {
 public:
  // Starts `threads` workers; kResourceExhausted if the threads cannot be
  // made.
  static Result<std::unique_ptr<WorkerPool>> Start(int threads, size_t max_queued);

  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `fn` for a worker unless the queue is full or shutting down.
  bool TryEnqueue(std::function<void()>& fn);

  // Lets the workers finish what is queued, then joins them. Idempotent.
  void Shutdown();

 private:
  explicit WorkerPool(size_t max_queued) : max_queued_(max_queued) {}

  void Run();

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable not_empty_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool shutting_down_ = false;               // guarded by mu_
  std::mutex join_mu_;                       // serializes Shutdown
  std::vector<std::thread> threads_;         // written by Start, then under join_mu_
};

}  // namespace granary::observability

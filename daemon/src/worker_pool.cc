#include "worker_pool.h"

#include <string>
#include <system_error>
#include <utility>

#include "granary/core/thread_name.h"

namespace granary::observability {

Result<std::unique_ptr<WorkerPool>> WorkerPool::Start(int threads, size_t max_queued) {
  std::unique_ptr<WorkerPool> pool(new WorkerPool(max_queued));
  try {
    for (int i = 0; i < threads; ++i) {
      pool->threads_.emplace_back([p = pool.get()] {
        NameThisThread("http-worker");
        p->Run();
      });
    }
  } catch (const std::system_error& e) {
    pool->Shutdown();
    return Status::ResourceExhausted("start " + std::to_string(threads) +
                                     " worker threads: " + e.what() +
                                     "; lower worker_threads or raise the process's limits");
  }
  return pool;
}

WorkerPool::~WorkerPool() { Shutdown(); }

bool WorkerPool::TryEnqueue(std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_ || queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(fn));
  not_empty_.notify_one();
  return true;
}

void WorkerPool::Shutdown() {
  std::lock_guard<std::mutex> join_lock(join_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
  }
  not_empty_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void WorkerPool::Run() {
  while (true) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      not_empty_.wait(lock, [&] { return !queue_.empty() || shutting_down_; });
      if (queue_.empty()) return;  // shutting down, nothing left
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace granary::observability

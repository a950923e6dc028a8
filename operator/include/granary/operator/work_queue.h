#pragma once

// WorkQueue: the keys ("namespace/name") that need reconciling, as in
// client-go's workqueue:
//   - a key is queued at most once however often it is added;
//   - a key being processed is never handed to a second worker; adding it
//     meanwhile marks it dirty, and Done() queues it again;
//   - AddRateLimited() retries a failing key after an exponential delay per
//     key (base..max), Forget() resets it after a success;
//   - AddAfter() queues a key later (periodic status refresh).
// Bounded: at most `max_keys` distinct keys waiting (adds beyond are dropped
// and counted; the informers' periodic resync adds them again).
//
// Thread safety: every method may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace granary::kube {

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::chrono::milliseconds retry_base{200};
    std::chrono::milliseconds retry_max{30000};
    size_t max_keys = 100000;
  };

  WorkQueue() : WorkQueue(Options{}) {}
  explicit WorkQueue(Options options) : options_(options) {}

  void Add(const std::string& key);
  void AddAfter(const std::string& key, std::chrono::milliseconds delay);
  void AddRateLimited(const std::string& key);
  void Forget(const std::string& key);
  // The next key, waiting up to `timeout`; nullopt on time-out or shut-down.
  std::optional<std::string> Get(std::chrono::milliseconds timeout);
  void Done(const std::string& key);
  void ShutDown();

  size_t Retries(const std::string& key) const;
  uint64_t dropped() const;
  size_t Length() const;

 private:
  void AddLocked(const std::string& key);
  void PromoteDueLocked();

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;  // guarded by mu_
  std::set<std::string> queued_;   // keys in queue_
  std::set<std::string> processing_;
  std::set<std::string> dirty_;  // added while processing
  std::multimap<Clock::time_point, std::string> delayed_;
  std::map<std::string, size_t> retries_;
  uint64_t dropped_ = 0;
  bool shut_down_ = false;
};

}  // namespace granary::kube

#include "granary/operator/work_queue.h"

#include <algorithm>

namespace granary::kube {

void WorkQueue::AddLocked(const std::string& key) {
  if (shut_down_) return;
  if (processing_.count(key) != 0) {
    dirty_.insert(key);
    return;
  }
  if (queued_.count(key) != 0) return;
  if (queued_.size() >= options_.max_keys) {
    ++dropped_;
    return;
  }
  queued_.insert(key);
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::Add(const std::string& key) {
  std::lock_guard lock(mu_);
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return Add(key);
  std::lock_guard lock(mu_);
  if (shut_down_) return;
  delayed_.emplace(Clock::now() + delay, key);
  cv_.notify_one();
}

void WorkQueue::AddRateLimited(const std::string& key) {
  std::chrono::milliseconds delay;
  {
    std::lock_guard lock(mu_);
    const size_t n = retries_[key]++;
    const int64_t base = options_.retry_base.count();
    const int64_t max = options_.retry_max.count();
    delay = std::chrono::milliseconds(n >= 20 ? max : std::min<int64_t>(max, base << n));
  }
  AddAfter(key, delay);
}

void WorkQueue::Forget(const std::string& key) {
  std::lock_guard lock(mu_);
  retries_.erase(key);
}

size_t WorkQueue::Retries(const std::string& key) const {
  std::lock_guard lock(mu_);
  auto it = retries_.find(key);
  return it == retries_.end() ? 0 : it->second;
}

void WorkQueue::PromoteDueLocked() {
  const auto now = Clock::now();
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    const std::string key = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    AddLocked(key);
  }
}

std::optional<std::string> WorkQueue::Get(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    PromoteDueLocked();
    if (shut_down_) return std::nullopt;
    if (!queue_.empty()) {
      std::string key = queue_.front();
      queue_.pop_front();
      queued_.erase(key);
      processing_.insert(key);
      return key;
    }
    auto wake = deadline;
    if (!delayed_.empty()) wake = std::min(wake, delayed_.begin()->first);
    if (Clock::now() >= deadline) return std::nullopt;
    cv_.wait_until(lock, wake);
  }
}

void WorkQueue::Done(const std::string& key) {
  std::lock_guard lock(mu_);
  processing_.erase(key);
  if (dirty_.erase(key) != 0) AddLocked(key);
}

void WorkQueue::ShutDown() {
  std::lock_guard lock(mu_);
  shut_down_ = true;
  cv_.notify_all();
}

uint64_t WorkQueue::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

size_t WorkQueue::Length() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

}  // namespace granary::kube

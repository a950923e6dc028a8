// ReadRightsCache (read_rights.h).

#include "granary/cachenode/read_rights.h"

#include <algorithm>
#include <utility>

namespace granary {
namespace {

// Answers that another check would repeat; the rest may pass and are asked
// again.
bool Lasting(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
    case StatusCode::kPermissionDenied:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kInvalidArgument:
      return true;
    default:
      return false;
  }
}

}  // namespace

ReadRightsCache::ReadRightsCache(ReadRightsOptions options) : options_(std::move(options)) {}

std::chrono::steady_clock::time_point ReadRightsCache::Now() const {
  return options_.now ? options_.now() : std::chrono::steady_clock::now();
}

void ReadRightsCache::Trim(std::chrono::steady_clock::time_point now) {
  while (!order_.empty()) {
    const auto& [key, at] = order_.front();
    auto it = answers_.find(key);
    const bool current = it != answers_.end() && it->second.at == at;
    if (current && now - at < options_.ttl && answers_.size() <= options_.capacity) break;
    if (current) answers_.erase(it);
    order_.pop_front();
  }
}

Status ReadRightsCache::Decide(const ReadRightsKey& key, const std::function<Status()>& check) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    Trim(Now());
    if (auto it = answers_.find(key); it != answers_.end()) {
      ++hits_;
      return it->second.status;
    }
    place_.wait(lock, [&] { return running_ < std::max<uint32_t>(1, options_.max_checks); });
    ++running_;
    ++checks_;
  }
  Status status = check();
  std::lock_guard<std::mutex> lock(mu_);
  --running_;
  place_.notify_one();
  if (Lasting(status) && options_.capacity > 0) {
    const auto now = Now();
    answers_[key] = Answer{status, now};
    order_.emplace_back(key, now);
    Trim(now);
  }
  return status;
}

ReadRightsCounters ReadRightsCache::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ReadRightsCounters{checks_, hits_, answers_.size()};
}

}  // namespace granary

#include "throttle.h"

#include <algorithm>
#include <thread>

namespace granary {

TokenBucket::TokenBucket(double bytes_per_second, double burst_bytes)
    : rate_(bytes_per_second),
      burst_(burst_bytes),
      tokens_(burst_bytes),
      last_(std::chrono::steady_clock::now()) {}

std::chrono::nanoseconds TokenBucket::Acquire(uint64_t bytes) {
  if (rate_ <= 0 || bytes == 0) return std::chrono::nanoseconds(0);
  double debt = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    tokens_ = std::min(burst_, tokens_ + elapsed * rate_);
    tokens_ -= static_cast<double>(bytes);
    debt = -tokens_;
  }
  if (debt <= 0) return std::chrono::nanoseconds(0);
  const auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(debt / rate_));
  std::this_thread::sleep_for(wait);
  return wait;
}

bool ConcurrencyGate::Enter() {
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  if (limit_ != 0 && in_flight_ >= limit_) {
    waited = true;
    cv_.wait(lock, [this] { return in_flight_ < limit_; });
  }
  ++in_flight_;
  peak_ = std::max(peak_, in_flight_);
  return waited;
}

void ConcurrencyGate::Leave() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
  }
  cv_.notify_one();
}

uint32_t ConcurrencyGate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

uint32_t ConcurrencyGate::peak_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

}  // namespace granary

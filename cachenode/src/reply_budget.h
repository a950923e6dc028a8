#pragma once

// The cache node server's reply budget (server.h, "Bounded reply memory"):
// bytes that READ replies may hold in memory across the whole server, and a
// reservation of them that a request holds from its start until its reply is
// gone. Private to the server (cachenode/src); any thread.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "granary/protocol/protocol.h"

namespace granary::server_internal {

// The bytes a READ asks for: an upper bound of the memory its reply holds.
inline uint64_t RequestedBytes(const ReadRequest& request) {
  uint64_t total = 0;
  for (const ReadItem& item : request.items) total += item.length;
  return total;
}

// The server-wide reply budget (server.h, "Bounded reply memory"). Any thread.
class ReplyBudget {
 public:
  explicit ReplyBudget(uint64_t limit) : limit_(limit) {}

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_gauge_.load(std::memory_order_relaxed); }
  // Some READ waits for bytes (it may be retrying just now: a moment's false
  // is possible, the next look sees it again).
  bool has_waiters() const { return waiter_count_.load(std::memory_order_relaxed) > 0; }

  // Reserves `bytes` and returns true if they fit (or nothing is reserved);
  // otherwise remembers `wake`, calls it (once, on the releasing thread) the
  // next time bytes are released, and returns false.
  bool ReserveOrWait(uint64_t bytes, std::function<void()> wake) {
    std::lock_guard lock(mu_);
    if (used_ == 0 || (bytes <= limit_ && used_ <= limit_ - bytes)) {
      used_ += bytes;
      used_gauge_.store(used_, std::memory_order_relaxed);
      return true;
    }
    waiters_.push_back(std::move(wake));
    waiter_count_.store(waiters_.size(), std::memory_order_relaxed);
    return false;
  }

  // Unconditionally: a reply's header, found larger than reserved only once
  // it is encoded (a few bytes per item).
  void Grow(uint64_t bytes) {
    std::lock_guard lock(mu_);
    used_ += bytes;
    used_gauge_.store(used_, std::memory_order_relaxed);
  }

  // Every waiter is woken: each tries again, and those that fit go ahead
  // (first fit; the others wait for the next release).
  void Release(uint64_t bytes) {
    std::vector<std::function<void()>> wake;
    {
      std::lock_guard lock(mu_);
      used_ -= std::min(used_, bytes);
      used_gauge_.store(used_, std::memory_order_relaxed);
      wake.swap(waiters_);
      waiter_count_.store(0, std::memory_order_relaxed);
    }
    for (auto& w : wake) w();
  }

 private:
  const uint64_t limit_;
  std::mutex mu_;
  uint64_t used_ = 0;                           // guarded by mu_
  std::vector<std::function<void()>> waiters_;  // guarded by mu_
  std::atomic<uint64_t> used_gauge_{0};         // used_, for readers without mu_
  std::atomic<size_t> waiter_count_{0};         // waiters_.size(), likewise
};

// Bytes reserved from a ReplyBudget, released when destroyed.
class BudgetReservation {
 public:
  BudgetReservation() = default;
  BudgetReservation(ReplyBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  BudgetReservation(BudgetReservation&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  BudgetReservation& operator=(BudgetReservation&& other) noexcept {
    if (this != &other) {
      Reset();
      budget_ = std::exchange(other.budget_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  BudgetReservation(const BudgetReservation&) = delete;
  BudgetReservation& operator=(const BudgetReservation&) = delete;
  ~BudgetReservation() { Reset(); }

  bool held() const { return budget_ != nullptr; }
  uint64_t bytes() const { return bytes_; }

  // Shrinks to, or grows to, `bytes`.
  void Resize(uint64_t bytes) {
    if (budget_ == nullptr) return;
    if (bytes < bytes_) {
      budget_->Release(bytes_ - bytes);
    } else if (bytes > bytes_) {
      budget_->Grow(bytes - bytes_);
    }
    bytes_ = bytes;
  }

  void Reset() {
    if (budget_ != nullptr) budget_->Release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }

 private:
  ReplyBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace granary::server_internal

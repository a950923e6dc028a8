#pragma once

// Clock: where Granary reads time, injected so tests move time by hand
// instead of sleeping.
// - NowMillis(): wall-clock time for things stored or compared across
//   processes (record timestamps, heartbeat expiry in the metadata store).
// - Monotonic(): time that never jumps, for intervals inside one process
//   (timeouts, retry budgets, cache expiry, rate windows). Code that takes a
//   Clock* reads it here rather than calling std::chrono::steady_clock.
//
// Thread safety: every implementation here may be called from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace granary {

class Clock {
 public:
  virtual ~Clock() = default;
  using MonotonicTime = std::chrono::steady_clock::time_point;

  // Milliseconds since the Unix epoch.
  virtual int64_t NowMillis() const = 0;
  // A point on a clock that only moves forward (by default the process's
  // steady clock, so a test clock that moves only wall time keeps it).
  virtual MonotonicTime Monotonic() const { return std::chrono::steady_clock::now(); }
};

class SystemClock final : public Clock {
 public:
  int64_t NowMillis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  MonotonicTime Monotonic() const override { return std::chrono::steady_clock::now(); }
  // A process-wide instance for callers that take a Clock* and were given none.
  static SystemClock* Default() {
    static SystemClock clock;
    return &clock;
  }
};

// Time stands still until a test moves it. Advance() moves both clocks;
// Set() moves the wall clock only (as a clock step would).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t now_ms = 1'700'000'000'000) : now_ms_(now_ms) {}
  int64_t NowMillis() const override { return now_ms_.load(std::memory_order_relaxed); }
  MonotonicTime Monotonic() const override {
    return MonotonicTime(std::chrono::nanoseconds(monotonic_ns_.load(std::memory_order_relaxed)));
  }
  void Set(int64_t now_ms) { now_ms_.store(now_ms, std::memory_order_relaxed); }
  void Advance(std::chrono::milliseconds by) {
    now_ms_.fetch_add(by.count(), std::memory_order_relaxed);
    monotonic_ns_.fetch_add(std::chrono::nanoseconds(by).count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> now_ms_;
  // Starts well away from zero so 'now - timeout' never underflows the epoch.
  std::atomic<int64_t> monotonic_ns_{int64_t{1'000'000} * 1'000'000'000};
};

}  // namespace granary

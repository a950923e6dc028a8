#pragma once

// Clock: where Granary reads wall-clock time for things that are stored or
// compared across processes (record timestamps, heartbeat expiry in the SQLite
// metadata store). Injected so tests can move time by hand instead of sleeping.
// Intervals measured inside one process (retry budgets, poll loops) use
// std::chrono::steady_clock directly and are not affected by a Clock.
//
// Callers: MetadataStore backends, later the cache node and sidecar.
// Thread safety: every implementation here may be called from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace granary {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch.
  virtual int64_t NowMillis() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t NowMillis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // A process-wide instance for callers that take a Clock* and were given none.
  static SystemClock* Default() {
    static SystemClock clock;
    return &clock;
  }
};

// Time stands still until a test moves it.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t now_ms = 1'700'000'000'000) : now_ms_(now_ms) {}
  int64_t NowMillis() const override { return now_ms_.load(std::memory_order_relaxed); }
  void Set(int64_t now_ms) { now_ms_.store(now_ms, std::memory_order_relaxed); }
  void Advance(std::chrono::milliseconds by) {
    now_ms_.fetch_add(by.count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace granary

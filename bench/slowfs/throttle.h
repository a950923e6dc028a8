#pragma once

// The two prices granary-slowfs charges besides latency: a token bucket that
// caps the bytes per second of all reads together, and a gate that caps the
// operations in flight (operations beyond it wait their turn, as requests to a
// server with a fixed number of service slots do).
//
// Callers: SlowFs (slow_fs.cc), from every FUSE worker thread; tests.
// Thread safety: both classes may be used from any number of threads at once.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace granary {

// Tokens are bytes. Acquire(n) takes n tokens and returns once the bucket has
// paid for them: a caller may drive the balance negative (a read bigger than
// the burst still passes) and then sleeps until the refill covers its debt,
// so callers are served in the order they asked and the long-run rate is the
// configured one.
class TokenBucket {
 public:
  // bytes_per_second 0: unlimited (Acquire returns at once). burst_bytes: the
  // most that may pass without waiting after an idle spell.
  TokenBucket(double bytes_per_second, double burst_bytes);

  // Returns how long the caller slept.
  std::chrono::nanoseconds Acquire(uint64_t bytes);

 private:
  const double rate_;   // bytes per second
  const double burst_;  // bytes
  std::mutex mu_;
  double tokens_;                               // guarded by mu_; may be negative
  std::chrono::steady_clock::time_point last_;  // guarded by mu_
};

// At most `limit` holders at once (0: unlimited). Enter blocks until a slot is
// free; Leave frees one.
class ConcurrencyGate {
 public:
  explicit ConcurrencyGate(uint32_t limit) : limit_(limit) {}

  // Returns whether the caller had to wait for a slot.
  bool Enter();
  void Leave();

  uint32_t in_flight() const;
  uint32_t peak_in_flight() const;

 private:
  const uint32_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint32_t in_flight_ = 0;  // guarded by mu_
  uint32_t peak_ = 0;       // guarded by mu_
};

}  // namespace granary

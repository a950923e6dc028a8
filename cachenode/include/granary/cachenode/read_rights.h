#pragma once

// ReadRightsCache: the chunk handoff's decisions about local users other than
// root, the node's user and a dataset's owner (docs/security.md; docs/protocol.md,
// "Chunk handoff"). Such a uid gets a chunk's descriptor only if it may read,
// at the source, every file with bytes in the chunk; finding out opens each of
// those files as that uid (PosixSource::CheckReadable), so the answer is kept
// per (uid, dataset, manifest, chunk) for `ttl`, and at most `capacity`
// answers are kept (the oldest go first). Only lasting answers are kept: Ok,
// kPermissionDenied, kNotFound, kFailedPrecondition, kInvalidArgument; a
// failure that may pass (the user database or the file system unavailable)
// is asked again next time. At most `max_checks` checks run at once (each
// holds one of the identity executor's workers, which staging shares);
// further callers wait for a place.
//
// A right taken away at the source (chmod) is seen within `ttl`; a descriptor
// already handed out stays readable, as an open file does.
//
// Who calls it: CacheNode's handoff resolver, on the handoff server's
// connection threads.
//
// Thread safety: every method may be called from any number of threads.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary {

struct ReadRightsOptions {
  std::chrono::milliseconds ttl{30'000};
  size_t capacity = 16'384;
  uint32_t max_checks = 4;
  // The clock (tests); default std::chrono::steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> now;
};

struct ReadRightsKey {
  uint32_t uid = 0;
  std::string dataset;
  ContentId manifest;
  ChunkId chunk = 0;

  friend bool operator<(const ReadRightsKey& a, const ReadRightsKey& b) {
    return std::tie(a.uid, a.chunk, a.manifest.low, a.manifest.high, a.dataset) <
           std::tie(b.uid, b.chunk, b.manifest.low, b.manifest.high, b.dataset);
  }
};

struct ReadRightsCounters {
  uint64_t checks = 0;  // check() calls
  uint64_t hits = 0;    // answers given from the cache
  uint64_t kept = 0;    // answers kept now
};

class ReadRightsCache {
 public:
  explicit ReadRightsCache(ReadRightsOptions options = {});

  // The answer for `key`: a kept one younger than ttl, else `check()`'s
  // (then kept when lasting).
  Status Decide(const ReadRightsKey& key, const std::function<Status()>& check);

  ReadRightsCounters counters() const;

 private:
  struct Answer {
    Status status;
    std::chrono::steady_clock::time_point at;
  };
  std::chrono::steady_clock::time_point Now() const;
  // Drops answers older than ttl, and the oldest beyond capacity. Needs mu_.
  void Trim(std::chrono::steady_clock::time_point now);

  const ReadRightsOptions options_;
  mutable std::mutex mu_;
  std::condition_variable place_;
  uint32_t running_ = 0;                     // guarded by mu_
  std::map<ReadRightsKey, Answer> answers_;  // guarded by mu_
  // Keys in the order they were answered, with when (an entry whose answer
  // was replaced since is skipped). Guarded by mu_.
  std::deque<std::pair<ReadRightsKey, std::chrono::steady_clock::time_point>> order_;
  uint64_t checks_ = 0;  // guarded by mu_
  uint64_t hits_ = 0;    // guarded by mu_
};

}  // namespace granary

#pragma once

// CacheContentReader: the POSIX view's ContentReader (posix/content_reader.h)
// inside the sidecar, for its `mounts:` option: a file's sample is pinned in
// the dataset's SampleCache (fetched on demand like a client's GET) and the
// view replies straight from the shared-memory arena; the pin is released when
// the view drops the PinnedSample. Hints are fetched into the arena by a
// background thread (pinned and released at once), at most kMaxPendingHints
// queued; hints beyond that are dropped.
//
// Who calls it: the sidecar (creates one per mount); PosixView's workers
// (Acquire, Hint).
//
// Thread safety: Acquire and Hint from any number of threads; a PinnedSample
// may be destroyed on any thread, but not after its reader.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "granary/posix/content_reader.h"
#include "granary/sidecar/sample_cache.h"

namespace granary::sidecar {

class CacheContentReader : public posix::ContentReader {
 public:
  static constexpr size_t kMaxPendingHints = 4096;
  static constexpr size_t kHintBatch = 64;

  CacheContentReader(std::shared_ptr<SampleCache> cache, FetchFn fetch,
                     std::chrono::milliseconds wait_timeout);
  ~CacheContentReader() override;
  CacheContentReader(const CacheContentReader&) = delete;
  CacheContentReader& operator=(const CacheContentReader&) = delete;

  Result<std::unique_ptr<posix::PinnedSample>> Acquire(SampleId id) override;
  void Hint(std::span<const SampleId> ids) override;

 private:
  void HintLoop();

  const std::shared_ptr<SampleCache> cache_;
  const FetchFn fetch_;
  const std::chrono::milliseconds wait_timeout_;
  const uint64_t reads_client_;  // the pins of reads
  const uint64_t hints_client_;  // the short pins of hint fetches

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SampleId> hints_;  // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  std::thread hint_thread_;
};

}  // namespace granary::sidecar

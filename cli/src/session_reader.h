#pragma once

// SessionContentReader: a ContentReader (content_reader.h) over client
// Sessions (libgranary-client, client/include/granary/client/session.h) to a
// running granary-sidecar. This is what `granary mount` reads through: the
// same path as the client library (prefetched, local cache node, peer, on
// demand, source fall-through), with the bytes left in the sidecar's
// shared-memory arena and written from there into the FUSE reply.
//
//  - Reads: a pool of up to max_sessions Sessions, one request in flight on
//    each (a Session serialises its calls), so FUSE threads read in parallel.
//    A PinnedSample keeps its Session alive (the arena stays mapped) and
//    releases its pin when destroyed; idle sessions send queued releases
//    within about flush_interval.
//  - Failures: a call that breaks its Session (the sidecar died or restarted,
//    a timeout) drops that Session; Acquire opens a new one and tries again,
//    with backoff, until reconnect_timeout has passed since the first failure.
//    Only then does the read fail (EIO for the reader). A sample's own error
//    (changed at the source, permission, every node and the source failing)
//    is returned at once: the sidecar has tried everything already.
//  - Hints: Hint() queues ids (at most max_pending_hints, oldest dropped) for
//    one background thread with a Session of its own, which GETs them in
//    batches of hint_batch and releases them at once: the sidecar fetches
//    what is missing in one batched call per cache node and keeps the bytes
//    in its arena, evictable, for the read that follows. Hinted samples count
//    as served in the sidecar's metrics.
//
// Who calls it: `granary mount` (cli/src/mount_command.cc), PosixView.
//
// Thread safety: Acquire, Hint and counters() from any number of threads;
// the destructor stops the hint thread (waiting for its call in flight, at
// most the session's call_timeout).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "granary/client/session.h"
#include "granary/posix/content_reader.h"

namespace granary::cli {

using posix::ContentReader;
using posix::PinnedSample;

struct SessionReaderOptions {
  std::string dataset;
  // Socket path and timeouts of every Session (lookahead is set to 0: the
  // view hints itself, and unused lookahead hints would pin arena bytes).
  client::SessionOptions session;
  // Sessions reading at once (FUSE threads beyond this wait for one).
  size_t max_sessions = 16;
  // How long Acquire keeps reconnecting after its session broke.
  std::chrono::milliseconds reconnect_timeout{15'000};
  // Ids per hint GET; queued hint ids at most.
  size_t hint_batch = 64;
  size_t max_pending_hints = 4096;
  // Idle sessions send their queued releases this often.
  std::chrono::milliseconds flush_interval{200};

  // kInvalidArgument naming the field.
  Status Validate() const;
};

class SessionContentReader : public ContentReader {
 public:
  struct Counters {
    uint64_t acquired = 0;         // samples pinned for reads
    uint64_t acquire_errors = 0;   // Acquire calls that failed
    uint64_t broken_sessions = 0;  // sessions found broken (sidecar gone) and dropped
    uint64_t hinted = 0;           // ids sent in hint GETs
    uint64_t hint_batches = 0;     // hint GETs
    uint64_t hints_dropped = 0;    // ids dropped from a full queue or a failed batch
  };

  // Opens the first Session (checks the socket and the dataset; the
  // sidecar's errors, e.g. kNotFound for an unknown dataset or
  // kFailedPrecondition for one not staged yet) and starts the hint thread.
  static Result<std::unique_ptr<SessionContentReader>> Open(SessionReaderOptions options);

  ~SessionContentReader() override;
  SessionContentReader(const SessionContentReader&) = delete;
  SessionContentReader& operator=(const SessionContentReader&) = delete;

  // The dataset as the sidecar announced it at Open.
  const client::DatasetInfo& info() const { return info_; }

  Result<std::unique_ptr<PinnedSample>> Acquire(SampleId id) override;
  void Hint(std::span<const SampleId> ids) override;

  Counters counters() const;

 private:
  using Clock = std::chrono::steady_clock;

  explicit SessionContentReader(SessionReaderOptions options);
  Result<std::shared_ptr<client::Session>> OpenSession();
  // An idle session, or a new one while fewer than max_sessions are open.
  Result<std::shared_ptr<client::Session>> TakeSession(Clock::time_point deadline);
  void ReturnSession(std::shared_ptr<client::Session> session);
  void DropSession();
  void HintLoop();
  void FlushIdleSessions();

  const SessionReaderOptions options_;
  client::DatasetInfo info_;  // set by Open, before any other thread starts
  bool info_known_ = false;

  std::mutex pool_mu_;  // guards the three below
  std::condition_variable pool_cv_;
  std::vector<std::shared_ptr<client::Session>> idle_;
  size_t open_sessions_ = 0;  // idle or in use

  std::mutex hint_mu_;  // guards the two below
  std::condition_variable hint_cv_;
  std::deque<SampleId> pending_hints_;
  bool stop_ = false;
  std::thread hint_thread_;

  std::atomic<uint64_t> acquired_{0};
  std::atomic<uint64_t> acquire_errors_{0};
  std::atomic<uint64_t> broken_sessions_{0};
  std::atomic<uint64_t> hinted_{0};
  std::atomic<uint64_t> hint_batches_{0};
  std::atomic<uint64_t> hints_dropped_{0};
};

}  // namespace granary::cli

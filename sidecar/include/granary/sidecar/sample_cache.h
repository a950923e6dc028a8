#pragma once

// SampleCache: one open dataset in the sidecar (docs/sidecar.md, "Sample
// cache"): the shared-memory Arena its samples are handed out in, which
// samples are there, which clients pin them, and the prefetch cursors of the
// plans announced for it.
//
//  - Entries: a sample in the arena is kFetching (its bytes are being
//    written), kReady or kFailed. A ready entry is pinned by every token a
//    client holds for it and is never moved or freed while pinned.
//  - Eviction: an entry that has been handed out (consumed) and is not pinned
//    may be evicted to make room: first what clients that read once released
//    (most recent first, its memory still cached), then the rest, least
//    recently released first. Entries
//    prefetched and not yet consumed are the window: they stay until consumed
//    or their cursor is dropped.
//  - Cursors: SetPlan turns (plan, epoch, rank, start position) into the
//    rank's read order. Fetch workers take the next positions not yet in the
//    arena (TakePrefetchWork) while the cursor's window (samples from its
//    lowest unconsumed position, and bytes scheduled and not consumed) has
//    room. A full window is refilled once a quarter of it is free (in samples
//    and in bytes), not sample by sample, so that the workers wake for
//    batches. A sample handed to any client counts as consumed at its position
//    in every cursor that has it in its window, so DataLoader workers that
//    split a rank's batches advance the rank's one cursor.
//  - Acquire: the client path. Ready entries are pinned at once; kFetching
//    ones are waited for; missing ones are fetched on demand (one batched call
//    of the FetchFn, outside the lock); a prefetch that failed is retried once
//    on demand before the error reaches the client.
//
// Who calls it: the Sidecar (connection threads: Acquire, Release, DropClient;
// fetch workers: TakePrefetchWork, CompleteFetch); tests, with a FetchFn that
// fills bytes without a network.
//
// Thread safety: every method may be called from any thread; one mutex guards
// the state, and no fetch runs under it.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "granary/core/plan.h"
#include "granary/core/status.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/sidecar/arena.h"

namespace granary::sidecar {

// Fetches targets (SampleFetcher::Fetch, or a test's function).
using FetchFn = std::function<void(std::span<const FetchTarget>, std::span<FetchOutcome>)>;

struct SampleCacheOptions {
  uint64_t arena_bytes = 320ull << 20;
  uint32_t window_samples = 1024;
  uint64_t window_bytes = 256ull << 20;
  // Cursors kept per dataset; the least recently used goes beyond this.
  size_t max_cursors = 64;
  // Called (under the cache's lock: it must only signal) when prefetch work
  // may have appeared: a cursor set, a window moved.
  std::function<void()> work_available;
};

// One sample handed to a client (or why not).
struct AcquiredSample {
  SampleId id = 0;
  Status status;
  uint64_t token = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
  bool prefetched = false;  // was in the arena thanks to prefetch
  bool hint = false;        // a lookahead item
  double waited_seconds = 0;
};

struct SampleCacheStats {
  uint64_t arena_bytes = 0;
  uint64_t arena_used_bytes = 0;
  uint64_t entries = 0;
  uint64_t pins = 0;
  uint64_t pinned_bytes = 0;
  uint64_t window_samples = 0;  // prefetched (or being fetched), not yet consumed
  uint64_t window_bytes = 0;
  uint64_t cursors = 0;
  uint64_t evictions = 0;
  uint64_t unknown_releases = 0;
  uint64_t evicted_while_waiting = 0;  // Acquire rounds repeated: a sample evicted while it waited

  // Field-wise sum (the sidecar totals its datasets' caches).
  SampleCacheStats& operator+=(const SampleCacheStats& o);
};

class SampleCache {
 public:
  static Result<std::unique_ptr<SampleCache>> Create(FetchDataset dataset,
                                                     const SampleCacheOptions& options);
  ~SampleCache();

  const FetchDataset& dataset() const { return dataset_; }
  // What the fetcher is given for this dataset now: dataset() with the node
  // list SetPlacedNodes last gave (a Slurm job's nodes are added as their
  // prologs run).
  FetchDataset FetchView() const;
  void SetPlacedNodes(std::optional<std::vector<std::string>> nodes);
  const Manifest& manifest() const { return *dataset_.manifest; }
  int arena_fd() const { return arena_->fd(); }
  // The arena's mapping in this process (for in-process readers).
  const char* arena_data() const { return arena_->data(); }
  uint64_t arena_bytes() const { return arena_->size(); }

  // Installs (or replaces) the cursor `key` (e.g. plan id + rank) for `plan`,
  // starting at `start` (an index into plan.samples(); past the read count:
  // nothing to prefetch). A replaced cursor's unconsumed entries become
  // evictable.
  void SetCursor(const std::string& key, const Plan& plan, uint64_t start);

  // The next samples some cursor wants and that are not in the arena, up to
  // `max`, each given arena space and marked kFetching. Empty when every
  // window is full or the arena has no room.
  std::vector<FetchTarget> TakePrefetchWork(uint32_t max);
  // The outcomes of TakePrefetchWork's targets (same order).
  void CompletePrefetch(std::span<const FetchTarget> targets,
                        std::span<const FetchOutcome> outcomes);

  // A client's identity within this cache (pins are per client).
  // `reads_once`: the client reads each sample it is handed once (a training
  // process's session), so what it releases is evicted first, the most
  // recently released first: that range of the arena was just read and is
  // still in the CPU caches, and the next fetch writes into it at a fraction
  // of the cost of memory that has gone cold (a 110 KiB copy into a 16 MiB
  // ring of recently used memory takes about half the time of one into a
  // 128 MiB one). Other clients' releases (the POSIX view, which reads a file
  // piece by piece and prefetches by acquiring and releasing at once) are
  // evicted last, least recently released first.
  uint64_t AddClient(bool reads_once = false);
  // Drops every pin of the client (a closed connection).
  void DropClient(uint64_t client);

  // Pins `ids` for `client`, fetching what is missing with `fetch`, waiting
  // for fetches in progress until `deadline`. Then up to `lookahead` samples
  // that follow the last id in a cursor and are ready are pinned as hints.
  std::vector<AcquiredSample> Acquire(uint64_t client, std::span<const SampleId> ids,
                                      uint32_t lookahead, const FetchFn& fetch,
                                      std::chrono::steady_clock::time_point deadline);
  // Unpins the client's tokens; unknown ones are counted and ignored.
  void Release(uint64_t client, std::span<const uint64_t> tokens);

  SampleCacheStats Stats() const;

 private:
  struct Entry;
  struct Cursor;

  SampleCache(FetchDataset dataset, const SampleCacheOptions& options,
              std::unique_ptr<Arena> arena);

  // Arena space for `size` bytes, evicting consumed unpinned entries; nullopt if none.
  std::optional<uint64_t> AllocateLocked(uint64_t size);
  Entry* NewEntryLocked(SampleId id, uint64_t offset, bool prefetched);
  void EraseEntryLocked(Entry* e);
  void PinLocked(uint64_t client, Entry* e, AcquiredSample* out);
  // `evict_first`: once unpinned, it goes to the front of the eviction order.
  void UnpinLocked(Entry* e, bool evict_first);
  void MarkConsumedLocked(SampleId id);
  // Whether the cursor's window has drained far enough to refill it.
  bool DrainedLocked(const Cursor& c) const;
  void RetireCursorLocked(Cursor* c);
  void WakeWorkersLocked();

  FetchDataset dataset_;
  SampleCacheOptions options_;
  std::unique_ptr<Arena> arena_;

  mutable std::mutex nodes_mu_;
  std::optional<std::vector<std::string>> placed_nodes_;  // guarded by nodes_mu_
  mutable std::mutex mu_;
  std::condition_variable fetched_;  // an entry left kFetching
  std::unordered_map<SampleId, std::unique_ptr<Entry>> entries_;
  std::list<Entry*> evictable_;  // consumed, unpinned, not fetching: oldest first
  std::map<std::string, std::unique_ptr<Cursor>> cursors_;
  struct Client {
    bool reads_once = false;                    // AddClient
    std::unordered_map<uint64_t, Entry*> pins;  // token -> entry
  };
  std::unordered_map<uint64_t, Client> clients_;
  uint64_t next_client_ = 1;
  uint64_t next_token_ = 1;
  uint64_t next_cursor_touch_ = 1;
  uint64_t pins_ = 0;
  uint64_t pinned_bytes_ = 0;
  uint64_t evictions_ = 0;
  uint64_t unknown_releases_ = 0;
  uint64_t evicted_while_waiting_ = 0;
  // Acquire asks again for a sample evicted while it waited, this many times in all.
  static constexpr uint32_t kAcquireRounds = 4;
};

}  // namespace granary::sidecar

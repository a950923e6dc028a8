#pragma once

// Stager: the cache node's staging engine for one (dataset, manifest) on this
// node. It copies the chunks this node owns from the dataset's Source into the
// ChunkStore, in the order the registered plans will first read them, and
// fills single segments on demand for readers that ask for something not
// staged yet. docs/cachenode.md ("Staging") describes the policy.
//
// What it does:
//  - bulk staging: `threads` workers each take the next owned chunk in staging
//    order that is not complete in the store, read every missing segment from
//    the source, Put each, and Commit once, so each sample (each piece of a
//    sample larger than a chunk) is opened once and never re-read once
//    present. A restart resumes from what the store says is present.
//  - on demand: FetchSegment/FetchSample read what is missing right away,
//    ahead of the bulk queue, store it and return its bytes. Bulk workers
//    yield the source to on-demand reads but keep a share of it: a bulk read
//    may start while fewer than max(1, threads / 2) on-demand reads are
//    pending, and in any case after every kBulkReadEveryOnDemand on-demand
//    reads, so a continuous stream of misses cannot starve bulk staging. A
//    segment is read from the source by at most one caller at a time: a
//    FetchSegment for a segment that a bulk worker (or another FetchSegment)
//    is reading waits for that read and shares its bytes, and bytes read on
//    demand for a chunk a bulk worker holds are committed by that worker.
//  - re-staging: DropAndRefetch replaces a stored copy a reader found corrupt,
//    under the same writer hold (handed to the bulk worker filling the chunk,
//    if one is).
//  - per-sample source errors (changed since the snapshot, gone, permission
//    denied, ...) are recorded per sample and counted by kind; such a sample
//    never yields bytes, and the rest of its chunk is still staged. A
//    transient error (kIo: EIO, a time-out) is first retried io_retries times
//    with a backoff; once recorded, it is not final: an on-demand fetch of the
//    sample asks the source once more, and Resume() re-queues every such
//    sample for bulk staging.
//  - capacity: when the next chunk does not fit the store, bulk staging stops
//    taking chunks (state kCapacity). What is staged is then the prefix of the
//    staging order that fit (up to the chunks in flight on other threads).
//    A full file system (ENOSPC or EDQUOT, from creating a chunk file or from
//    a Put or Commit into an existing one) pauses it too (kDiskFull), without
//    failing the chunk, and is retried with a bounded exponential backoff
//    (timed on options.clock), or at Resume(); last_error then names the
//    store and says what to do.
//
// What it does not do: compute placement or plans (the daemon passes the
// owned chunks and the staging order), drop chunks it no longer owns (the
// daemon does, with ChunkStore::DropChunk), or serve segments that are already
// staged to the network (the serving layer reads the store directly).
//
// Who calls it: the cache-node daemon, one Stager per (dataset, manifest) it
// stages; its serving path calls FetchSample/FetchSegment on a miss.
//
// Thread safety: every public method may be called from any number of threads
// at once, except the destructor (no call may be running or start once it
// has begun; it joins the workers, waiting for any source read in flight).
// The Stager shares ownership of its Manifest, Source and ChunkStore, so none
// of them can be destroyed under it. All mutable state is guarded by
// Stager::mu_, which is never held across source reads or store writes (it is
// held for store index look-ups and to close a chunk writer before releasing
// the chunk's hold, so that the next holder can open one).

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "granary/cachenode/chunk_store.h"
#include "granary/core/clock.h"
#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "granary/source/source.h"

namespace granary {

enum class StagingState : uint8_t {
  kIdle,      // not started, or paused by Pause()
  kStaging,   // owned chunks remain and workers are taking them
  kComplete,  // every owned chunk is staged (each segment present or its sample failed)
  kCapacity,  // the next chunk does not fit the store's capacity: staging stopped there
  kDiskFull,  // the file system is full (ENOSPC, EDQUOT): paused, retried with backoff
  kStopped,   // Stop() was called
};

// "idle", "staging", "complete", "capacity", "disk_full", "stopped".
std::string_view StagingStateName(StagingState state);

// Which SourceErrorKind a Status returned by Source::Read counts as.
SourceErrorKind SourceErrorKindOf(const Status& status);

inline constexpr uint32_t kMaxStagerThreads = 1024;
inline constexpr uint32_t kMaxIoRetries = 100;
// Bulk staging's share of the source under on-demand load: a bulk worker may
// start a source read while fewer than max(1, threads / 2) on-demand reads
// are pending, and in any case once this many on-demand reads have started
// since the last bulk read started.
inline constexpr uint32_t kBulkReadEveryOnDemand = 4;
// How long a holder waits for another writer of a chunk file to close
// (Stager::OpenWriter), checking every kWriterRetry.
inline constexpr std::chrono::milliseconds kWriterWait{10'000};
inline constexpr std::chrono::milliseconds kWriterRetry{5};
// The lead-in: the first samples of the staging order, read at Start and at
// SetOrder on kReadAheadThreads threads of their own (StagerOptions::read_ahead).
inline constexpr uint32_t kReadAheadSamples = 64;
inline constexpr uint32_t kReadAheadThreads = 4;
// Bytes read ahead (the lead-in, ReadAhead) one Stager keeps in memory for the
// bulk worker that stages their chunks, at most; past it they are stored at
// once, each with a commit of its own.
inline constexpr uint64_t kParkedFillBytes = 64ull << 20;
// Read buffers kept for reuse by one Stager, at most (bytes of capacity).
inline constexpr uint64_t kSpareBufferBytes = 64ull << 20;

struct StagerOptions {
  // The dataset's name (a DNS-1123 label): the chunk store's key.
  std::string dataset;
  // Bulk staging workers, 1..kMaxStagerThreads: the source concurrency. Keep it
  // below the Source's max_in_flight() so that on-demand reads find a slot.
  uint32_t threads = 4;
  // Sample ids in the order they will first be read across all ranks
  // (FirstReadOrder of the registered plans, concatenated). Chunks are staged
  // in the order their first sample appears here, then the chunks it does not
  // mention in chunk order. Empty: chunk order. Duplicates are allowed.
  std::vector<SampleId> order;
  // The lead-in: the first read_ahead samples of `order` are read at Start
  // (and at SetOrder) by kReadAheadThreads threads of their own, ahead of bulk
  // reads as on-demand reads are, each stored as an on-demand fetch stores
  // it. Bulk workers fill whole chunks, and the first samples of a shuffled
  // order are spread over as many chunks: without this the first batches are
  // fetched on demand one sample after another (a READ's items are fetched one
  // by one), which made a cold epoch's first batch 10-20 times slower than
  // reading the source directly. Not done ahead of every fetch:
  // stored one by one, each costs a commit, and bulk reads wait. 0: off.
  uint32_t read_ahead = kReadAheadSamples;
  // A source read failing with a transient error (SourceErrorKind::kIo: EIO,
  // a time-out, ...) is tried again up to io_retries times, the first after
  // io_retry_backoff, each next one after twice the previous wait, before the
  // sample is recorded as failed. 0..kMaxIoRetries; a backoff >= 0.
  uint32_t io_retries = 3;
  std::chrono::milliseconds io_retry_backoff{200};
  // ENOSPC retries: the first after disk_full_backoff, each next one after
  // twice the previous wait, up to disk_full_backoff_max; after
  // disk_full_retries failed retries staging waits for Resume().
  std::chrono::milliseconds disk_full_backoff{1000};
  std::chrono::milliseconds disk_full_backoff_max{30000};
  uint32_t disk_full_retries = 8;
  // Where the disk-full backoff reads time (Clock::Monotonic); null: the
  // system clock. A test's ManualClock moves it without sleeping; the workers
  // look at the clock at least every kClockRecheck while they wait.
  const Clock* clock = nullptr;
  // The LRU baseline (cache_policy: lru): under a budget, the chunks kept are
  // the most recently read ones (TouchChunk) that fit, not the first of the
  // staging order; a read of a chunk not kept makes it kept (the least
  // recently read ones are dropped to make room) and bulk staging fills it.
  // What most caches do; for benchmarks only.
  bool lru = false;
};

// How often a worker waiting out the disk-full backoff looks at the clock
// again (an injected clock may be moved without a notification).
inline constexpr std::chrono::milliseconds kClockRecheck{50};

// A snapshot of a Stager's progress (Stager::Progress).
struct StagerProgress {
  StagingState state = StagingState::kIdle;
  uint64_t chunks_owned = 0;
  // Owned chunks with nothing left to stage: every segment present or its
  // sample failed. What StagingProgress::chunks_staged publishes.
  uint64_t chunks_staged = 0;
  uint64_t chunks_complete = 0;  // owned chunks with every segment present
  uint64_t chunks_failed = 0;    // owned chunks the store refused to open or write (last_error)
  uint64_t bytes_owned = 0;      // payload bytes of the owned chunks
  uint64_t bytes_staged = 0;     // payload bytes of their present segments
  std::array<uint64_t, kSourceErrorKinds> samples_failed{};  // by SourceErrorKind
  uint64_t queue_depth = 0;           // owned chunks not staged and not in flight
  uint64_t chunks_in_flight = 0;      // chunks a bulk worker holds now
  uint64_t on_demand_fetches = 0;     // FetchSegment calls that read the source themselves
  uint64_t on_demand_shared = 0;      // FetchSegment calls that shared a read in flight
  uint64_t on_demand_not_stored = 0;  // segments read on demand that could not be stored
  uint64_t refetches = 0;             // DropAndRefetch calls (stored copies found corrupt)
  // Under a budget (SetBudget): the owned chunks kept (bulk-staged, stored on
  // demand) and their payload and chunk-file bytes; the rest is streamed.
  uint64_t chunks_kept = 0;
  uint64_t bytes_kept = 0;
  uint64_t file_bytes_kept = 0;
  uint64_t file_bytes_owned = 0;   // chunk-file bytes of the whole share (what it claims)
  std::optional<uint64_t> budget;  // none: every owned chunk is kept
  uint64_t streamed_segments = 0;  // read from the source for readers, not stored (not kept)
  uint64_t streamed_bytes = 0;
  uint64_t streamed_ahead_bytes = 0;  // of those, read ahead of the item (ReadAhead), not on demand
  uint64_t reads_from_store = 0;      // NoteReads: items readers got from the store
  uint64_t reads_from_source = 0;     // NoteReads: items readers waited for the source for
  int64_t last_read_ms = 0;           // NoteReads: wall clock of the last read, 0 never
  uint64_t source_retries = 0;        // source reads tried again after a transient (kIo) error
  // Why staging is paused or why a chunk failed (kCapacity, kDiskFull, a store
  // error); OK otherwise.
  Status last_error;

  uint64_t samples_failed_total() const {
    uint64_t total = 0;
    for (uint64_t n : samples_failed) total += n;
    return total;
  }
  uint64_t samples_failed_of(SourceErrorKind kind) const {
    return samples_failed[static_cast<size_t>(kind)];
  }
  // What is owned but not staged (what the dataset's state reports under kCapacity).
  uint64_t chunks_not_staged() const { return chunks_owned - chunks_staged; }
  uint64_t bytes_not_staged() const { return bytes_owned - bytes_staged; }
  // For MetadataStore::PutProgress (updated_ms is the store's).
  StagingProgress ToStagingProgress() const;
};

class Stager {
 public:
  // A stager for `manifest` of options.dataset, reading `source` (already
  // bound to the dataset owner's identity) into `store`, owning `owned`
  // (chunk ids, any order, duplicates allowed). Reads what the store already
  // holds of the owned chunks; starts no thread (Start does). kInvalidArgument
  // for a bad dataset name, thread count, chunk id or sample id in the order.
  // kInvalidArgument for a null manifest, source or store too. The Stager
  // shares ownership of all three: none can die under it.
  static Result<std::unique_ptr<Stager>> Create(std::shared_ptr<const Manifest> manifest,
                                                std::shared_ptr<Source> source,
                                                std::shared_ptr<ChunkStore> store,
                                                std::span<const ChunkId> owned,
                                                StagerOptions options);

  // Stop()s.
  ~Stager();
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Starts the bulk workers. kFailedPrecondition if started already or stopped.
  Status Start();

  // Replaces the owned chunks (placement changed). Newly owned chunks are
  // staged (a pause for capacity is lifted, to try again); chunks no longer
  // owned are left in the store for the daemon to drop, and one a worker is
  // filling now is finished first. kInvalidArgument for an id past the
  // manifest's chunks (nothing changes).
  Status SetOwnedChunks(std::span<const ChunkId> owned);

  // Pause: bulk workers take no new chunk (those in flight finish). Resume:
  // undoes Pause and also lifts a kCapacity or kDiskFull pause (the daemon
  // calls it after freeing space), and forgets recorded transient (kIo)
  // sample errors so that bulk staging tries those samples again. On-demand
  // fetches work throughout.
  void Pause();
  void Resume();

  // The bytes of chunk files this dataset may keep on this node; none: every
  // owned chunk. The kept chunks are the owned ones first in staging order
  // that fit; staging takes the newly kept ones; what is stored of the others
  // stays until DropNotKept.
  void SetBudget(std::optional<uint64_t> budget_bytes);
  // Drops from the store every owned chunk that is not kept (and no writer
  // holds: those are dropped at a later call). What it freed:
  struct Dropped {
    uint64_t chunks = 0;
    uint64_t file_bytes = 0;
  };
  Dropped DropNotKept();
  // A read service served `from_store` items from the store and
  // `from_source` by reading the source, now (wall clock ms).
  void NoteReads(uint64_t from_store, uint64_t from_source, int64_t now_ms);
  // Under StagerOptions::lru: marks a chunk (the chunk of a sample) as read
  // now. No-op otherwise, or for an id past the manifest.
  void TouchChunk(ChunkId chunk);
  void TouchSample(SampleId sample);
  bool lru() const { return options_.lru; }

  // Stops bulk staging and joins the workers: a worker finishes the source
  // read it is in, commits the segments it has read (only whole, read bytes
  // are ever committed), and exits; a worker waiting to retry a transient
  // error stops waiting. Idempotent. FetchSegment still works. Waits as long
  // as the slowest source read in flight: forever if a read hangs.
  void Stop();
  // Stop, waiting at most `timeout` for the workers: true if they all exited
  // (and were joined). False if some are still blocked in a source read past
  // the timeout: a blocked read (pread on a hung mount, ...) cannot be
  // cancelled, only no longer waited for. Those workers are left running, not
  // detached (they use this object); they exit when their read returns and
  // are joined by a later Stop() or by the destructor, which therefore still
  // waits for them. A daemon that must exit now should exit the process
  // without destroying the Stager.
  bool Stop(std::chrono::milliseconds timeout);

  // The bytes of segment `index` of owned chunk `chunk`: from the store if
  // present, else read from the source now, stored (the chunk file is created
  // if needed) and returned. Errors: kInvalidArgument (bad chunk or index),
  // kFailedPrecondition (a chunk this node does not own: read it from its
  // owner, or from the source), the sample's recorded source error (see
  // Source::Read; a recorded transient kIo error is not returned as such: the
  // source is asked once more, without retries, and the record dropped on
  // success), kCorruption (the stored copy fails its checksum), or a
  // store error reading it. A segment read from the source is returned even
  // when it cannot be stored (capacity, full disk): counted in
  // on_demand_not_stored.
  Result<std::string> FetchSegment(ChunkId chunk, uint32_t index);
  // For a reader that found the stored copy of segment `index` failing its
  // checksum: reads it from the source again, replaces the stored copy (drop,
  // put, commit) and returns the fresh bytes. The replacement goes through the
  // same writer hold as everything else: if a bulk worker holds the chunk's
  // writer, the fresh bytes are handed to it (it drops the bad copy, puts and
  // commits them before letting go) and returned at once; the caller never
  // waits for the worker, and no writer contention (kUnavailable) reaches it.
  // A read of the segment already in flight is shared. Errors as FetchSegment
  // (never kCorruption: the store is not read). The bytes are returned even if
  // they cannot be stored (counted in on_demand_not_stored).
  Result<std::string> DropAndRefetch(ChunkId chunk, uint32_t index);
  // The whole sample: FetchSegment of each of its pieces, concatenated.
  Result<std::string> FetchSample(SampleId sample);
  // Starts reading, on the lead-in threads, the segments of `samples` in
  // owned chunks that are neither stored nor being read (those of chunks not
  // kept too: streamed, not stored), so that the
  // FetchSegment calls that follow (one per item of a READ) share reads
  // already in flight instead of waiting for one source read after another:
  // a cold epoch's first batches, and what a dataset larger than its budget
  // streams. Ids past the manifest are skipped. No-op before Start, after
  // Stop, without lead-in threads (read_ahead 0), on a full disk, or with
  // kParkedFillBytes read ahead and not taken yet.
  void ReadAhead(std::span<const SampleId> samples);

  // Stages in a new order from now on (StagerOptions::order's meaning), in
  // place: the chunks being filled go on, nothing read is dropped, and the
  // next chunk a worker takes is the first unfinished one of the new order.
  // What a registered plan changes: replacing the Stager instead stopped
  // every worker mid-chunk and, while the old one's on-demand fills still held
  // writers, made the new one's workers fail those chunks and read their
  // samples a second time. kInvalidArgument for a sample past the
  // manifest (nothing changes then).
  Status SetOrder(std::span<const SampleId> order);

  StagerProgress Progress() const;
  // The source error recorded for `sample` (OK if none).
  Status SampleError(SampleId sample) const;
  // Every chunk of the manifest in staging order (owned or not).
  std::vector<ChunkId> chunk_order() const {
    std::lock_guard<std::mutex> lock(mu_);
    return chunk_order_;
  }
  const std::string& dataset() const { return options_.dataset; }
  const std::shared_ptr<const Manifest>& manifest() const { return manifest_; }
  const std::shared_ptr<Source>& source() const { return source_; }

 private:
  // One source read of one segment, shared by everyone who needs it. Fields
  // are guarded by mu_; `bytes` is written only by the reader before `done`.
  struct Fill {
    bool done = false;
    bool put = false;      // handed to the chunk's writer (present after its commit)
    bool replace = false;  // the stored copy failed its checksum: drop it before the put
    bool parked = false;   // read ahead, kept here until its chunk's holder puts it
    // Threads waiting for `done` (to copy `bytes`, or the holder to put them):
    // its reader wakes the others only then. `bytes` stay while any waits.
    uint32_t waiters = 0;
    Status status;
    std::string bytes;
  };
  struct ChunkState {
    bool owned = false;
    bool done = false;         // nothing left to stage
    bool active = false;       // a bulk worker has taken it
    bool writer_held = false;  // someone holds (or is opening) its store writer
    bool failed = false;       // the store refused it
    bool kept = false;         // owned and within the budget (RecomputeKeptLocked)
    uint64_t file_bytes = 0;   // ChunkBytes of its file, once computed
    uint32_t segment_count = 0;
    uint64_t payload = 0;
    uint64_t present_bytes = 0;
    uint32_t present_segments = 0;
    // The holder's pass: the segments it found missing, in order. It reads
    // them from the front; a worker with no chunk of its own helps by reading
    // from the back (HelpLocked). [todo_front, todo_back) is unclaimed.
    std::vector<uint32_t> todo;
    size_t todo_front = 0;
    size_t todo_back = 0;
  };
  enum class Outcome { kDone, kStopped, kCapacity, kDiskFull, kFailed };
  using FillKey = std::pair<ChunkId, uint32_t>;

  Stager(std::shared_ptr<const Manifest> manifest, std::shared_ptr<Source> source,
         std::shared_ptr<ChunkStore> store, StagerOptions options,
         std::vector<ChunkId> chunk_order);

  void WorkerLoop();
  // Joins every worker thread; join_mu_ held, stopping_ set.
  void JoinWorkers();
  // Whether a bulk worker may start a source read now (the fairness policy
  // above); mu_ held.
  bool BulkMayReadLocked() const;
  // A chunk for a worker to take, or false; mu_ held.
  bool NextChunkLocked(ChunkId* chunk);
  // With no chunk left to take, reads one unclaimed segment of the soonest
  // chunk a holder is filling (so that the last chunks are not each read by
  // one worker while the others idle). False if there is none. Called and
  // returns with mu_ held (through `lock`); releases it for the read.
  bool HelpLocked(std::unique_lock<std::mutex>& lock);
  Outcome StageChunk(ChunkId chunk);
  // Opens the chunk's writer, creating the file if needed. Only by the holder.
  // Waits (up to kWriterWait) while another writer of the file is open: one
  // of a Stager being replaced, which closes it within a commit.
  Result<StoredChunkWriter> OpenWriter(ChunkId chunk, std::span<const ChunkSegment> segments);
  // Every chunk in the order its first sample appears in `order`, then the
  // rest; kInvalidArgument naming `doing` for a sample past the manifest.
  static Result<std::vector<ChunkId>> ChunkOrder(const Manifest& manifest,
                                                 std::span<const SampleId> order,
                                                 const std::string& doing);
  // What last_error says after a Put or Commit found the file system full.
  std::string DiskFullHint() const;
  // The holder's last step: puts every read, unput fill of `chunk`, commits,
  // updates the chunk's state, closes the writer and releases the hold.
  // `writer` may be empty (it could not be opened, or a Put failed): the fills
  // are then discarded. Returns the first store error (OK if none).
  Status DrainAndRelease(ChunkId chunk, std::span<const ChunkSegment> segments,
                         std::optional<StoredChunkWriter> writer);
  // A fill's source read is done (mu_ held): hands `bytes` and `read` to
  // whoever waits for the fill; a failed read is recorded and the fill
  // forgotten. True when no holder will store it: the caller has just taken
  // the chunk's writer hold and must store it (StoreAsHolder). The caller
  // wakes the waiters.
  bool FinishFillLocked(const FillKey& key, Fill& fill, SampleId sample, std::string bytes,
                        const Status& read);
  // Stores the chunk's read fills as its holder (mu_ not held): opens the
  // writer and DrainAndRelease; a writer that cannot be opened discards them.
  void StoreAsHolder(ChunkId chunk, std::span<const ChunkSegment> segments);
  // One segment from the source, tried again `retries` times after a kIo
  // error (io_retry_backoff, doubling). A bulk read's waits end at Stop().
  Status ReadFromSource(const ChunkSegment& segment, std::string* out, bool bulk, uint32_t retries);
  // FetchSegment (replace false) and DropAndRefetch (replace true).
  Result<std::string> Fetch(ChunkId chunk, uint32_t index, bool replace);
  // Queues reads of the first read_ahead samples of order_ that are owned
  // and not staged, failed or in flight. mu_ held.
  void LeadInLocked();
  // Queues a lead-in read of each missing segment of `sample` in a kept
  // chunk (LeadInLocked, ReadAhead). mu_ held; the caller notifies.
  void QueueReadAheadLocked(SampleId sample, bool also_not_kept);
  // A lead-in thread: reads wanted_ segments, stores them like an on-demand
  // fetch (or hands them to the chunk's holder).
  void LeadInLoop();
  Result<std::string> ReadFromStore(ChunkId chunk, std::span<const ChunkSegment> segments,
                                    uint32_t index);
  void RecordFailureLocked(SampleId sample, const Status& status);
  // Forgets a recorded failure (a transient one being tried again): its
  // chunks are staged again.
  void ForgetFailureLocked(SampleId sample);
  void RefreshFromStoreLocked(ChunkId chunk);
  // Sets every chunk's `kept` from owned, chunk_order_ and budget_. mu_ held.
  void RecomputeKeptLocked();
  void UpdateDoneLocked(ChunkId chunk, std::span<const ChunkSegment> segments,
                        const std::vector<bool>& present);
  StagingState StateLocked() const;
  ChunkKey Key(ChunkId chunk) const { return ChunkKey{options_.dataset, manifest_->id(), chunk}; }
  // A buffer of `size` bytes for a bulk read, from spare_ when one fits (its
  // old bytes are overwritten by the read). mu_ held.
  std::string TakeBufferLocked(uint64_t size);
  // Keeps a fill's buffer for the next read, within kSpareBufferBytes. mu_ held.
  void GiveBackLocked(std::string buffer);

  const std::shared_ptr<const Manifest> manifest_;
  const std::shared_ptr<Source> source_;
  const std::shared_ptr<ChunkStore> store_;
  const StagerOptions options_;
  const Clock* const clock_;  // options_.clock, or the system clock

  mutable std::mutex mu_;
  std::vector<ChunkId> chunk_order_;  // guarded by mu_
  std::vector<SampleId> order_;       // guarded by mu_: options.order, or SetOrder's
  std::deque<FillKey> wanted_;        // guarded by mu_: lead-in fills not started
  // wanted_ grew, or stopping_ was set: the lead-in threads wait on this one
  // only, so that the bulk workers' notifications do not wake them.
  std::condition_variable lead_in_cv_;
  std::condition_variable cv_;                                // any change of the state below
  std::vector<ChunkState> chunks_;                            // guarded by mu_; by chunk id
  std::map<FillKey, std::shared_ptr<Fill>> fills_;            // guarded by mu_
  std::map<SampleId, Status> failed_samples_;                 // guarded by mu_
  std::array<uint64_t, kSourceErrorKinds> failed_by_kind_{};  // guarded by mu_
  size_t cursor_ = 0;               // guarded by mu_: chunk_order_ before it needs nothing
  bool started_ = false;            // guarded by mu_
  bool stopping_ = false;           // guarded by mu_
  bool paused_ = false;             // guarded by mu_
  bool capacity_ = false;           // guarded by mu_
  bool disk_full_ = false;          // guarded by mu_
  uint32_t disk_full_retries_ = 0;  // guarded by mu_
  std::chrono::milliseconds disk_full_wait_{0};  // guarded by mu_
  Clock::MonotonicTime disk_full_retry_at_;      // guarded by mu_
  Status last_error_;                            // guarded by mu_
  uint32_t on_demand_pending_ = 0;               // guarded by mu_
  uint32_t on_demand_since_bulk_ = 0;            // guarded by mu_: on-demand reads since a bulk one
  uint64_t in_flight_ = 0;                       // guarded by mu_
  uint64_t on_demand_fetches_ = 0;               // guarded by mu_
  uint64_t on_demand_shared_ = 0;                // guarded by mu_
  uint64_t on_demand_not_stored_ = 0;            // guarded by mu_
  uint64_t refetches_ = 0;                       // guarded by mu_
  uint64_t source_retries_ = 0;                  // guarded by mu_
  uint64_t parked_bytes_ = 0;                    // guarded by mu_: bytes of parked fills
  std::optional<uint64_t> budget_;               // guarded by mu_
  uint64_t streamed_segments_ = 0;               // guarded by mu_
  uint64_t streamed_bytes_ = 0;                  // guarded by mu_
  uint64_t streamed_ahead_bytes_ = 0;            // guarded by mu_
  std::atomic<uint64_t> reads_from_store_{0};
  std::atomic<uint64_t> reads_from_source_{0};
  std::atomic<int64_t> last_read_ms_{0};
  // Under options_.lru: when each chunk was last read (a tick of lru_tick_).
  std::unique_ptr<std::atomic<uint64_t>[]> last_used_;
  std::atomic<uint64_t> lru_tick_{0};
  // Buffers of fills already committed, reused by bulk reads: a fresh
  // allocation per segment cost page faults and zero-filling, a fifth of
  // staging's CPU (docs/benchmarks.md). Emptied when the workers run out of
  // chunks.
  std::vector<std::string> spare_;    // guarded by mu_
  uint64_t spare_bytes_ = 0;          // guarded by mu_: capacity of spare_'s buffers
  uint32_t workers_running_ = 0;      // guarded by mu_: workers not yet out of WorkerLoop
  std::vector<std::thread> workers_;  // started by Start, joined by Stop
  std::mutex join_mu_;                // serialises Stop's joins
};

}  // namespace granary

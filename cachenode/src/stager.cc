#include "granary/cachenode/stager.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary {
namespace {

std::string ChunkName(const std::string& dataset, ChunkId chunk) {
  return "chunk " + std::to_string(chunk) + " of dataset " + Quoted(dataset);
}

// How many chunks sample `sample` spans (pieces of a sample larger than a chunk).
uint64_t PieceCount(const Manifest& manifest, SampleId sample) {
  const uint64_t size = manifest.SizeOf(sample);
  const uint64_t chunk_size = manifest.chunk_size();
  return size > chunk_size ? (size + chunk_size - 1) / chunk_size : 1;
}

// Puts a segment read from the source. A present segment is kept, unless the
// bytes replace a stored copy that failed its checksum: that is dropped first.
Status PutFill(StoredChunkWriter& writer, uint32_t index, const std::string& bytes, bool replace) {
  if (writer.IsPresent(index)) {
    if (!replace) return Status::Ok();
    GRANARY_RETURN_IF_ERROR(writer.Drop(index));
  }
  return writer.Put(index, bytes);
}

}  // namespace

std::string_view StagingStateName(StagingState state) {
  switch (state) {
    case StagingState::kIdle:
      return "idle";
    case StagingState::kStaging:
      return "staging";
    case StagingState::kComplete:
      return "complete";
    case StagingState::kCapacity:
      return "capacity";
    case StagingState::kDiskFull:
      return "disk_full";
    case StagingState::kStopped:
      return "stopped";
  }
  return "unknown";
}

SourceErrorKind SourceErrorKindOf(const Status& status) {
  switch (status.code()) {
    case StatusCode::kFailedPrecondition:
      return SourceErrorKind::kChanged;
    case StatusCode::kNotFound:
      return SourceErrorKind::kNotFound;
    case StatusCode::kPermissionDenied:
      return SourceErrorKind::kPermissionDenied;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      return SourceErrorKind::kInvalidRequest;
    default:
      return SourceErrorKind::kIo;
  }
}

StagingProgress StagerProgress::ToStagingProgress() const {
  StagingProgress p;
  p.chunks_total = chunks_owned;
  p.chunks_staged = chunks_staged;
  p.bytes_total = bytes_owned;
  p.bytes_staged = bytes_staged;
  p.samples_failed = samples_failed_total();
  return p;
}

Result<std::unique_ptr<Stager>> Stager::Create(std::shared_ptr<const Manifest> manifest,
                                               std::shared_ptr<Source> source,
                                               std::shared_ptr<ChunkStore> store,
                                               std::span<const ChunkId> owned,
                                               StagerOptions options) {
  const std::string doing = "creating the stager of dataset " + Quoted(options.dataset);
  if (!IsDnsLabel(options.dataset)) {
    return Status::InvalidArgument(
        doing +
        ": the dataset name is not a DNS-1123 label (1..63 of "
        "[a-z0-9-], alphanumeric at both ends); pass the dataset's name");
  }
  if (manifest == nullptr) {
    return Status::InvalidArgument(doing + ": no manifest given; load the dataset's manifest");
  }
  if (source == nullptr) {
    return Status::InvalidArgument(doing +
                                   ": no source given; open the dataset's source as its owner");
  }
  if (store == nullptr) {
    return Status::InvalidArgument(doing +
                                   ": no chunk store given; open one with ChunkStore::Open");
  }
  if (options.threads < 1 || options.threads > kMaxStagerThreads) {
    return Status::InvalidArgument(doing + ": threads is " + std::to_string(options.threads) +
                                   "; use 1.." + std::to_string(kMaxStagerThreads));
  }
  if (options.io_retries > kMaxIoRetries || options.io_retry_backoff.count() < 0) {
    return Status::InvalidArgument(
        doing + ": io_retries is " + std::to_string(options.io_retries) + " and io_retry_backoff " +
        std::to_string(options.io_retry_backoff.count()) + " ms; use 0.." +
        std::to_string(kMaxIoRetries) + " retries and a backoff >= 0");
  }
  if (options.disk_full_backoff.count() <= 0 ||
      options.disk_full_backoff_max < options.disk_full_backoff) {
    return Status::InvalidArgument(
        doing + ": disk_full_backoff must be > 0 and disk_full_backoff_max >= it");
  }
  const size_t chunk_count = manifest->chunk_count();
  const size_t sample_count = manifest->sample_count();
  for (ChunkId c : owned) {
    if (c >= chunk_count) {
      return Status::InvalidArgument(doing + ": owned chunk " + std::to_string(c) +
                                     " is past the manifest's " + std::to_string(chunk_count) +
                                     " chunks; compute the owned chunks from this manifest");
    }
  }
  // Chunks in the order their first sample appears in `order`, then the rest.
  std::vector<ChunkId> chunk_order;
  chunk_order.reserve(chunk_count);
  std::vector<bool> seen(chunk_count, false);
  for (SampleId s : options.order) {
    if (s >= sample_count) {
      return Status::InvalidArgument(doing + ": the staging order names sample " +
                                     std::to_string(s) + " but the manifest has " +
                                     std::to_string(sample_count) +
                                     " samples; compute the order from this manifest's plans");
    }
    const ChunkId first = manifest->ChunkOf(s);
    const uint64_t pieces = PieceCount(*manifest, s);
    for (uint64_t p = 0; p < pieces; ++p) {
      const ChunkId c = first + static_cast<ChunkId>(p);
      if (c < chunk_count && !seen[c]) {
        seen[c] = true;
        chunk_order.push_back(c);
      }
    }
  }
  for (size_t c = 0; c < chunk_count; ++c) {
    if (!seen[c]) chunk_order.push_back(static_cast<ChunkId>(c));
  }
  std::unique_ptr<Stager> stager(new Stager(std::move(manifest), std::move(source),
                                            std::move(store), std::move(options),
                                            std::move(chunk_order)));
  {
    std::lock_guard<std::mutex> lock(stager->mu_);
    for (size_t c = 0; c < chunk_count; ++c) {
      GRANARY_ASSIGN_OR_RETURN(ChunkInfo info, stager->manifest_->Chunk(static_cast<ChunkId>(c)));
      stager->chunks_[c].payload = info.payload_bytes;
    }
    for (ChunkId c : owned) {
      if (stager->chunks_[c].owned) continue;
      stager->chunks_[c].owned = true;
      stager->RefreshFromStoreLocked(c);
    }
  }
  return stager;
}

Stager::Stager(std::shared_ptr<const Manifest> manifest, std::shared_ptr<Source> source,
               std::shared_ptr<ChunkStore> store, StagerOptions options,
               std::vector<ChunkId> chunk_order)
    : manifest_(std::move(manifest)),
      source_(std::move(source)),
      store_(std::move(store)),
      options_(std::move(options)),
      chunk_order_(std::move(chunk_order)),
      clock_(options_.clock != nullptr ? options_.clock : SystemClock::Default()),
      chunks_(manifest_->chunk_count()) {}

Stager::~Stager() { Stop(); }

Status Stager::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopping_) {
    return Status::FailedPrecondition("starting the stager of dataset " + Quoted(options_.dataset) +
                                      ": it was started or stopped already; create a new one");
  }
  started_ = true;
  workers_.reserve(options_.threads);
  for (uint32_t i = 0; i < options_.threads; ++i) {
    ++workers_running_;
    workers_.emplace_back([this] { WorkerLoop(); });
  }
  return Status::Ok();
}

Status Stager::SetOwnedChunks(std::span<const ChunkId> owned) {
  const size_t chunk_count = manifest_->chunk_count();
  for (ChunkId c : owned) {
    if (c >= chunk_count) {
      return Status::InvalidArgument("setting the owned chunks of dataset " +
                                     Quoted(options_.dataset) + ": chunk " + std::to_string(c) +
                                     " is past the manifest's " + std::to_string(chunk_count) +
                                     " chunks; compute the owned chunks from this manifest");
    }
  }
  std::vector<bool> now(chunk_count, false);
  for (ChunkId c : owned) now[c] = true;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t c = 0; c < chunk_count; ++c) {
    ChunkState& state = chunks_[c];
    if (now[c] && !state.owned) {
      state.owned = true;
      state.failed = false;
      RefreshFromStoreLocked(static_cast<ChunkId>(c));
    } else if (!now[c]) {
      state.owned = false;
    }
  }
  cursor_ = 0;
  capacity_ = false;  // what is owned changed: maybe it fits now
  cv_.notify_all();
  return Status::Ok();
}

void Stager::Pause() {
  std::lock_guard<std::mutex> lock(mu_);
  paused_ = true;
}

void Stager::Resume() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SampleId> transient;
  for (const auto& [sample, status] : failed_samples_) {
    if (SourceErrorKindOf(status) == SourceErrorKind::kIo) transient.push_back(sample);
  }
  for (SampleId sample : transient) ForgetFailureLocked(sample);
  paused_ = false;
  capacity_ = false;
  disk_full_ = false;
  disk_full_retries_ = 0;
  disk_full_wait_ = std::chrono::milliseconds(0);
  cursor_ = 0;
  cv_.notify_all();
}

void Stager::Stop() {
  std::lock_guard<std::mutex> join_lock(join_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  JoinWorkers();
}

bool Stager::Stop(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> join_lock(join_mu_);
  uint32_t running = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, timeout, [&] { return workers_running_ == 0; });
    running = workers_running_;
  }
  if (running > 0) {
    // Each is blocked in a source read (a hung mount, a stalled service) that
    // nothing here can cancel. Detaching them is not safe (they use this
    // object), so they stay: a later Stop() or the destructor joins them.
    GetLogger("cachenode")
        ->warn(
            "stopping the stager of dataset {}: {} bulk worker(s) still in a source read after "
            "{} ms; left running (the destructor waits for them)",
            Quoted(options_.dataset), running, timeout.count());
    return false;
  }
  JoinWorkers();
  return true;
}

void Stager::JoinWorkers() {
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

bool Stager::BulkMayReadLocked() const {
  const uint32_t reserve = std::max<uint32_t>(1, options_.threads / 2);
  return on_demand_pending_ < reserve || on_demand_since_bulk_ >= kBulkReadEveryOnDemand;
}

// mu_ held. Advances cursor_ past chunks that need nothing, then returns the
// first owned, unfinished chunk no worker has.
bool Stager::NextChunkLocked(ChunkId* chunk) {
  auto needs = [&](ChunkId c) {
    const ChunkState& s = chunks_[c];
    return s.owned && !s.done && !s.failed;
  };
  while (cursor_ < chunk_order_.size() && !needs(chunk_order_[cursor_])) ++cursor_;
  for (size_t i = cursor_; i < chunk_order_.size(); ++i) {
    const ChunkId c = chunk_order_[i];
    if (needs(c) && !chunks_[c].active) {
      *chunk = c;
      return true;
    }
  }
  return false;
}

void Stager::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (paused_ || capacity_) {
      cv_.wait(lock);
      continue;
    }
    if (disk_full_) {
      if (disk_full_retries_ >= options_.disk_full_retries) {
        cv_.wait(lock);  // until Resume
        continue;
      }
      const Clock::MonotonicTime now = clock_->Monotonic();
      if (now < disk_full_retry_at_) {
        cv_.wait_for(lock, std::min<Clock::MonotonicTime::duration>(disk_full_retry_at_ - now,
                                                                    kClockRecheck));
        continue;
      }
      disk_full_ = false;  // try again
      ++disk_full_retries_;
    }
    ChunkId chunk = 0;
    if (!NextChunkLocked(&chunk)) {
      cv_.wait(lock);
      continue;
    }
    chunks_[chunk].active = true;
    ++in_flight_;
    lock.unlock();
    const Outcome outcome = StageChunk(chunk);
    lock.lock();
    chunks_[chunk].active = false;
    --in_flight_;
    switch (outcome) {
      case Outcome::kDone:
      case Outcome::kStopped:
        if (!disk_full_) {
          disk_full_retries_ = 0;
          disk_full_wait_ = std::chrono::milliseconds(0);
        }
        break;
      case Outcome::kCapacity:
        capacity_ = true;
        break;
      case Outcome::kDiskFull:
        disk_full_ = true;
        disk_full_wait_ = disk_full_wait_.count() == 0
                              ? options_.disk_full_backoff
                              : std::min(disk_full_wait_ * 2, options_.disk_full_backoff_max);
        disk_full_retry_at_ = clock_->Monotonic() + disk_full_wait_;
        break;
      case Outcome::kFailed:
        chunks_[chunk].failed = true;
        break;
    }
    cv_.notify_all();
  }
  --workers_running_;
  cv_.notify_all();
}

Stager::Outcome Stager::StageChunk(ChunkId chunk) {
  auto log = GetLogger("cachenode");
  auto segments_or = manifest_->Segments(chunk);
  if (!segments_or.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = segments_or.status().WithContext("staging " + ChunkName(options_.dataset, chunk));
    return Outcome::kFailed;
  }
  const std::vector<ChunkSegment>& segments = *segments_or;
  const ChunkKey key = Key(chunk);

  // Capacity first: a chunk that does not fit is not created at all.
  if (!store_->HasChunk(key)) {
    const uint64_t need = store_->ChunkBytes(segments);
    const uint64_t free = store_->free_bytes();
    if (need > free) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!capacity_) {
        log->warn(
            "staging dataset {}: {} needs {} bytes and the store has {} free; staging "
            "stops here (what is staged is the soonest-needed prefix)",
            Quoted(options_.dataset), ChunkName(options_.dataset, chunk), need, free);
      }
      last_error_ = Status::ResourceExhausted(
          "staging " + ChunkName(options_.dataset, chunk) + ": it needs " + std::to_string(need) +
          " bytes and the chunk store has " + std::to_string(free) + " of its " +
          std::to_string(store_->capacity()) +
          " bytes free; raise the capacity, drop other datasets, or run more cache nodes");
      return Outcome::kCapacity;
    }
  }

  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !chunks_[chunk].writer_held || stopping_; });
    if (stopping_) return Outcome::kStopped;
    chunks_[chunk].writer_held = true;
  }
  auto writer = OpenWriter(chunk, segments);
  if (!writer.ok()) {
    // Nothing to store with: the fills are discarded (an error of its own).
    static_cast<void>(DrainAndRelease(chunk, segments, std::nullopt));
    const Status& s = writer.status();
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = s;
    if (s.code() == StatusCode::kResourceExhausted) {
      // The store refuses past its capacity and on a full file system; with
      // room left in the capacity, it was the file system.
      if (store_->free_bytes() >= store_->ChunkBytes(segments)) {
        log->warn("staging dataset {}: {}; pausing", Quoted(options_.dataset), s.ToString());
        return Outcome::kDiskFull;
      }
      return Outcome::kCapacity;
    }
    log->warn("staging dataset {}: {}", Quoted(options_.dataset), s.ToString());
    return Outcome::kFailed;
  }

  bool stopped = false;
  Status put_error;
  for (uint32_t i = 0; i < segments.size() && put_error.ok(); ++i) {
    if (writer->IsPresent(i)) continue;
    const ChunkSegment& segment = segments[i];
    std::shared_ptr<Fill> fill;
    bool mine = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // On-demand reads go first, but not forever (BulkMayReadLocked).
      cv_.wait(lock, [&] { return BulkMayReadLocked() || stopping_; });
      if (stopping_) {
        stopped = true;
        break;
      }
      on_demand_since_bulk_ = 0;
      if (failed_samples_.contains(segment.sample)) continue;
      auto it = fills_.find({chunk, i});
      if (it != fills_.end()) {
        fill = it->second;
      } else {
        fill = std::make_shared<Fill>();
        fills_.emplace(FillKey{chunk, i}, fill);
        mine = true;
      }
    }
    if (mine) {
      std::string bytes;
      Status read = ReadFromSource(segment, &bytes, /*bulk=*/true, options_.io_retries);
      std::lock_guard<std::mutex> lock(mu_);
      fill->bytes = std::move(bytes);
      fill->status = read;
      fill->done = true;
      if (!read.ok()) {
        RecordFailureLocked(segment.sample, read);
        fills_.erase({chunk, i});
      }
      cv_.notify_all();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return fill->done; });
    }
    bool put_it = false;
    bool replace = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (fill->status.ok() && !fill->put) {
        fill->put = true;
        put_it = true;
        replace = fill->replace;
      }
    }
    if (put_it) put_error = PutFill(*writer, i, fill->bytes, replace);
  }
  if (!put_error.ok()) {
    // The writer refuses further calls: nothing put is committed.
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = put_error.WithContext("staging " + ChunkName(options_.dataset, chunk));
  }
  std::optional<StoredChunkWriter> open(std::move(*writer));
  if (!put_error.ok()) open.reset();  // it refuses further calls: close it, drop the fills
  const Status stored = DrainAndRelease(chunk, segments, std::move(open));
  const Status& error = put_error.ok() ? stored : put_error;
  if (error.code() == StatusCode::kResourceExhausted) {
    // ENOSPC or EDQUOT from a Put or the Commit of a chunk whose file exists
    // (not preallocated, or the file system shrank under it): pause and retry
    // like a refused create; what was put is read again then.
    const Status with_context =
        put_error.ok() ? stored
                       : put_error.WithContext("staging " + ChunkName(options_.dataset, chunk));
    const Status full(with_context.code(), with_context.message() + DiskFullHint());
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_error_ = full;
    }
    log->warn("staging dataset {}: {}; pausing", Quoted(options_.dataset), full.ToString());
    return Outcome::kDiskFull;
  }
  if (!error.ok()) return Outcome::kFailed;
  return stopped ? Outcome::kStopped : Outcome::kDone;
}

std::string Stager::DiskFullHint() const {
  return "; the file system holding chunk store " + store_->root() +
         " is full before the store's capacity (" + std::to_string(store_->capacity()) +
         " bytes) is reached: staging pauses and retries with a backoff; free space on that file "
         "system, or lower the store's capacity (capacity_bytes)";
}

Result<StoredChunkWriter> Stager::OpenWriter(ChunkId chunk,
                                             std::span<const ChunkSegment> segments) {
  const ChunkKey key = Key(chunk);
  if (store_->HasChunk(key)) return store_->OpenChunkWriter(key, segments);
  auto created = store_->CreateChunk(key, segments);
  if (created.ok() || created.status().code() != StatusCode::kAlreadyExists) return created;
  return store_->OpenChunkWriter(key, segments);
}

Status Stager::DrainAndRelease(ChunkId chunk, std::span<const ChunkSegment> segments,
                               std::optional<StoredChunkWriter> writer) {
  const FillKey lo{chunk, 0};
  const FillKey hi{chunk + 1, 0};
  bool broken = !writer.has_value();
  Status first_error;
  for (;;) {
    struct Todo {
      uint32_t index;
      bool replace;
      std::shared_ptr<Fill> fill;
    };
    std::vector<Todo> todo;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = fills_.lower_bound(lo); it != fills_.end() && it->first < hi; ++it) {
        Fill& f = *it->second;
        if (f.done && f.status.ok() && !f.put) {
          f.put = true;
          todo.push_back(Todo{it->first.second, f.replace, it->second});
        }
      }
    }
    Status status;
    if (!broken) {
      for (const Todo& t : todo) {
        status = PutFill(*writer, t.index, t.fill->bytes, t.replace);
        if (!status.ok()) break;
      }
      if (status.ok()) status = writer->Commit();
      if (!status.ok()) broken = true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!status.ok()) {
      last_error_ = status.WithContext("storing " + ChunkName(options_.dataset, chunk));
      if (first_error.ok()) first_error = last_error_;
      GetLogger("cachenode")->warn("{}", last_error_.ToString());
    }
    // Every fill handed to the writer is now present (or lost with a broken
    // writer): forget it; the store answers from here on.
    for (auto it = fills_.lower_bound(lo); it != fills_.end() && it->first < hi;) {
      Fill& f = *it->second;
      if (f.done && f.status.ok() && (f.put || broken)) {
        if (broken) ++on_demand_not_stored_;
        it = fills_.erase(it);
      } else {
        ++it;
      }
    }
    if (!broken) {
      std::vector<bool> present(segments.size());
      for (uint32_t i = 0; i < segments.size(); ++i) present[i] = writer->IsPresent(i);
      UpdateDoneLocked(chunk, segments, present);
    }
    bool more = false;
    for (auto it = fills_.lower_bound(lo); it != fills_.end() && it->first < hi; ++it) {
      if (it->second->done && it->second->status.ok() && !it->second->put) more = true;
    }
    if (!more || broken) {
      // The store allows one writer per chunk: close ours before the next
      // holder may open one (closing a file; no sync, no source I/O).
      writer.reset();
      chunks_[chunk].writer_held = false;
      cv_.notify_all();
      return first_error;
    }
  }
}

Status Stager::ReadFromSource(const ChunkSegment& segment, std::string* out, bool bulk,
                              uint32_t retries) {
  // Size, mtime, ctime and inode as the snapshot recorded them: the source
  // checks them on the descriptor it reads this piece from, so the pieces of a
  // large sample staged at different times (on different nodes) are all of
  // the snapshot's version, never of two.
  const SourceFile file = SourceFileAt(*manifest_, segment.sample);
  std::chrono::milliseconds wait = options_.io_retry_backoff;
  for (uint32_t attempt = 0;; ++attempt) {
    out->assign(segment.length, '\0');
    Status s =
        source_->Read(file, segment.sample_offset, std::span<char>(out->data(), out->size()));
    if (s.ok()) return s;
    out->clear();
    // Changed, gone, permission, ...: facts about the snapshot, final at once.
    if (SourceErrorKindOf(s) != SourceErrorKind::kIo || attempt >= retries) return s;
    std::unique_lock<std::mutex> lock(mu_);
    ++source_retries_;
    // Stop() cuts a bulk worker's wait short (its error is then recorded).
    if (cv_.wait_for(lock, wait, [&] { return bulk && stopping_; })) return s;
    wait *= 2;
  }
}

Result<std::string> Stager::ReadFromStore(ChunkId chunk, std::span<const ChunkSegment> segments,
                                          uint32_t index) {
  GRANARY_ASSIGN_OR_RETURN(StoredChunkReader reader, store_->OpenChunkReader(Key(chunk), segments));
  return reader->Read(index);
}

Result<std::string> Stager::FetchSegment(ChunkId chunk, uint32_t index) {
  return Fetch(chunk, index, /*replace=*/false);
}

Result<std::string> Stager::DropAndRefetch(ChunkId chunk, uint32_t index) {
  return Fetch(chunk, index, /*replace=*/true);
}

Result<std::string> Stager::Fetch(ChunkId chunk, uint32_t index, bool replace) {
  const std::string what = std::string(replace ? "re-fetching" : "fetching") + " segment " +
                           std::to_string(index) + " of " + ChunkName(options_.dataset, chunk);
  if (chunk >= manifest_->chunk_count()) {
    return Status::InvalidArgument(what + ": the manifest has " +
                                   std::to_string(manifest_->chunk_count()) + " chunks");
  }
  GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments, manifest_->Segments(chunk));
  if (index >= segments.size()) {
    return Status::InvalidArgument(what + ": the chunk has " + std::to_string(segments.size()) +
                                   " segments");
  }
  const ChunkSegment& segment = segments[index];
  std::shared_ptr<Fill> fill;
  uint32_t retries = options_.io_retries;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!chunks_[chunk].owned) {
      return Status::FailedPrecondition(what +
                                        ": this node does not own the chunk; read it "
                                        "from its owner or from the source");
    }
    if (replace) ++refetches_;
    if (auto f = failed_samples_.find(segment.sample); f != failed_samples_.end()) {
      if (SourceErrorKindOf(f->second) != SourceErrorKind::kIo) return f->second;
      // A transient error, retried already: ask the source once more now.
      ForgetFailureLocked(segment.sample);
      retries = 0;
    }
    if (auto it = fills_.find({chunk, index}); it != fills_.end()) {
      // Someone is reading it (or has read it and not committed yet): share
      // the fresh bytes. A stored copy being replaced is dropped by whoever
      // puts them (unless they were handed over already: then the next reader
      // to find it corrupt refetches it again).
      fill = it->second;
      if (replace) fill->replace = true;
      ++on_demand_shared_;
      cv_.wait(lock, [&] { return fill->done; });
      if (!fill->status.ok()) return fill->status;
      return fill->bytes;
    }
    bool present = false;
    if (!replace) {
      auto bits = store_->PresentSegments(Key(chunk));
      present = bits.ok() && index < bits->size() && (*bits)[index];
    }
    if (!present) {
      fill = std::make_shared<Fill>();
      fill->replace = replace;
      fills_.emplace(FillKey{chunk, index}, fill);
      ++on_demand_pending_;
      ++on_demand_since_bulk_;
      ++on_demand_fetches_;
      cv_.notify_all();  // a bulk worker waiting for its share may go now
    }
  }
  if (fill == nullptr) return ReadFromStore(chunk, segments, index);

  std::string bytes;
  Status read = ReadFromSource(segment, &bytes, /*bulk=*/false, retries);
  bool hold = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --on_demand_pending_;
    fill->bytes = read.ok() ? bytes : std::string();
    fill->status = read;
    fill->done = true;
    if (!read.ok()) {
      RecordFailureLocked(segment.sample, read);
      fills_.erase({chunk, index});
    } else if (!chunks_[chunk].writer_held) {
      chunks_[chunk].writer_held = true;  // store it ourselves
      hold = true;
    }  // else the holder (a bulk worker) puts it, dropping a replaced copy first, and commits
    cv_.notify_all();
  }
  if (!read.ok()) return read;
  if (hold) {
    auto writer = OpenWriter(chunk, segments);
    if (!writer.ok()) {
      GetLogger("cachenode")
          ->warn("{}: read from the source but not stored: {}", what, writer.status().ToString());
    }
    // A store error is logged and counted (on_demand_not_stored): the reader
    // gets its bytes all the same.
    static_cast<void>(DrainAndRelease(
        chunk, segments, writer.ok() ? std::optional(std::move(*writer)) : std::nullopt));
  }
  return bytes;
}

Result<std::string> Stager::FetchSample(SampleId sample) {
  if (sample >= manifest_->sample_count()) {
    return Status::InvalidArgument("fetching sample " + std::to_string(sample) + " of dataset " +
                                   Quoted(options_.dataset) + ": the manifest has " +
                                   std::to_string(manifest_->sample_count()) + " samples");
  }
  const uint64_t size = manifest_->SizeOf(sample);
  const uint64_t pieces = PieceCount(*manifest_, sample);
  const ChunkId first = manifest_->ChunkOf(sample);
  std::string out;
  out.reserve(size);
  for (uint64_t p = 0; p < pieces; ++p) {
    const ChunkId chunk = first + static_cast<ChunkId>(p);
    GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments, manifest_->Segments(chunk));
    auto it = std::find_if(segments.begin(), segments.end(),
                           [&](const ChunkSegment& s) { return s.sample == sample; });
    if (it == segments.end()) {
      return Status::Internal("fetching sample " + std::to_string(sample) + ": chunk " +
                              std::to_string(chunk) +
                              " has no piece of it; the manifest is "
                              "inconsistent");
    }
    GRANARY_ASSIGN_OR_RETURN(std::string piece,
                             FetchSegment(chunk, static_cast<uint32_t>(it - segments.begin())));
    out += piece;
  }
  return out;
}

void Stager::RecordFailureLocked(SampleId sample, const Status& status) {
  if (failed_samples_.emplace(sample, status).second) {
    ++failed_by_kind_[static_cast<size_t>(SourceErrorKindOf(status))];
    GetLogger("cachenode")
        ->debug("staging dataset {}: sample {} failed: {}", Quoted(options_.dataset), sample,
                status.ToString());
  }
}

void Stager::ForgetFailureLocked(SampleId sample) {
  auto it = failed_samples_.find(sample);
  if (it == failed_samples_.end()) return;
  --failed_by_kind_[static_cast<size_t>(SourceErrorKindOf(it->second))];
  failed_samples_.erase(it);
  // Its chunks have something to stage again.
  const ChunkId first = manifest_->ChunkOf(sample);
  const uint64_t pieces = PieceCount(*manifest_, sample);
  for (uint64_t p = 0; p < pieces; ++p) {
    const ChunkId c = first + static_cast<ChunkId>(p);
    if (c < chunks_.size() && chunks_[c].present_segments < chunks_[c].segment_count) {
      chunks_[c].done = false;
    }
  }
  cursor_ = 0;
  cv_.notify_all();
}

void Stager::RefreshFromStoreLocked(ChunkId chunk) {
  ChunkState& state = chunks_[chunk];
  state.done = false;
  state.present_bytes = 0;
  state.present_segments = 0;
  auto segments = manifest_->Segments(chunk);
  if (!segments.ok()) return;  // cannot happen for an id below chunk_count
  state.segment_count = static_cast<uint32_t>(segments->size());
  auto present = store_->PresentSegments(Key(chunk));
  if (!present.ok() || present->size() != segments->size()) {
    // Not in the store (nothing present), or of another geometry (opening it
    // for writing will say so).
    UpdateDoneLocked(chunk, *segments, std::vector<bool>(segments->size(), false));
    return;
  }
  UpdateDoneLocked(chunk, *segments, *present);
}

void Stager::UpdateDoneLocked(ChunkId chunk, std::span<const ChunkSegment> segments,
                              const std::vector<bool>& present) {
  ChunkState& state = chunks_[chunk];
  state.segment_count = static_cast<uint32_t>(segments.size());
  state.present_bytes = 0;
  state.present_segments = 0;
  bool done = true;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (present[i]) {
      state.present_bytes += segments[i].length;
      ++state.present_segments;
    } else if (!failed_samples_.contains(segments[i].sample)) {
      done = false;
    }
  }
  state.done = done;
}

StagingState Stager::StateLocked() const {
  if (stopping_) return StagingState::kStopped;
  bool all_done = true;
  for (const ChunkState& c : chunks_) {
    if (c.owned && !c.done && !c.failed) {
      all_done = false;
      break;
    }
  }
  if (all_done) return StagingState::kComplete;
  if (disk_full_) return StagingState::kDiskFull;
  if (capacity_) return StagingState::kCapacity;
  if (!started_ || paused_) return StagingState::kIdle;
  return StagingState::kStaging;
}

StagerProgress Stager::Progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  StagerProgress p;
  p.state = StateLocked();
  for (const ChunkState& c : chunks_) {
    if (!c.owned) continue;
    ++p.chunks_owned;
    p.bytes_owned += c.payload;
    p.bytes_staged += c.present_bytes;
    if (c.done) ++p.chunks_staged;
    if (c.present_segments == c.segment_count) ++p.chunks_complete;
    if (c.failed) ++p.chunks_failed;
    if (!c.done && !c.failed && !c.active) ++p.queue_depth;
  }
  p.samples_failed = failed_by_kind_;
  p.chunks_in_flight = in_flight_;
  p.on_demand_fetches = on_demand_fetches_;
  p.on_demand_shared = on_demand_shared_;
  p.on_demand_not_stored = on_demand_not_stored_;
  p.refetches = refetches_;
  p.source_retries = source_retries_;
  p.last_error = last_error_;
  return p;
}

Status Stager::SampleError(SampleId sample) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failed_samples_.find(sample);
  return it == failed_samples_.end() ? Status::Ok() : it->second;
}

}  // namespace granary

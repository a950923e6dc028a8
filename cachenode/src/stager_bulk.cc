// The Stager's bulk workers (stager_internal.h lists the Stager's files).

#include <algorithm>
#include <optional>
#include <utility>

#include "granary/cachenode/stager.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "stager_internal.h"

namespace granary {

using stager_internal::ChunkName;
using stager_internal::PutFill;

bool Stager::BulkMayReadLocked() const {
  const uint32_t reserve = std::max<uint32_t>(1, options_.threads / 2);
  return on_demand_pending_ < reserve || on_demand_since_bulk_ >= kBulkReadEveryOnDemand;
}

// mu_ held. Advances cursor_ past chunks that need nothing, then returns the
// first owned, unfinished chunk no worker has.
bool Stager::NextChunkLocked(ChunkId* chunk) {
  auto needs = [&](ChunkId c) {
    const ChunkState& s = chunks_[c];
    return s.kept && !s.done && !s.failed;
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
      if (HelpLocked(lock)) continue;
      if (in_flight_ == 0) {
        spare_.clear();  // nothing to stage for now: give the memory back
        spare_bytes_ = 0;
      }
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
  std::string bytes;
  size_t todo_count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ChunkState& state = chunks_[chunk];
    state.todo.clear();
    for (uint32_t i = 0; i < segments.size(); ++i) {
      if (!writer->IsPresent(i)) state.todo.push_back(i);
    }
    todo_count = state.todo.size();
    state.todo_front = 0;
    state.todo_back = todo_count;
  }
  for (size_t k = 0; k < todo_count && put_error.ok(); ++k) {
    uint32_t i = 0;
    std::shared_ptr<Fill> fill;
    bool mine = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ChunkState& state = chunks_[chunk];
      i = state.todo[k];
      if (k < state.todo_back) {
        // On-demand reads go first, but not forever (BulkMayReadLocked).
        cv_.wait(lock, [&] { return BulkMayReadLocked() || stopping_; });
        if (stopping_) {
          stopped = true;
          break;
        }
        // Ours unless a helper claimed it while we waited.
        if (k < state.todo_back) state.todo_front = k + 1;
        on_demand_since_bulk_ = 0;
      }  // else a helper reads it: its fill is in fills_ (or it failed)
      if (failed_samples_.contains(segments[i].sample)) continue;
      auto it = fills_.find({chunk, i});
      if (it != fills_.end()) {
        fill = it->second;
      } else {
        fill = std::make_shared<Fill>();
        fills_.emplace(FillKey{chunk, i}, fill);
        mine = true;
        bytes = TakeBufferLocked(segments[i].length);
      }
    }
    const ChunkSegment& segment = segments[i];
    if (mine) {
      Status read = ReadFromSource(segment, &bytes, /*bulk=*/true, options_.io_retries);
      std::lock_guard<std::mutex> lock(mu_);
      fill->bytes = std::move(bytes);
      fill->status = read;
      fill->done = true;
      if (!read.ok()) {
        RecordFailureLocked(segment.sample, read);
        fills_.erase({chunk, i});
      }
      // Per segment: wake only those waiting for this fill (a notify_all per
      // read woke every thread of the Stager).
      if (fill->waiters > 0 || !read.ok()) cv_.notify_all();
    } else {
      std::unique_lock<std::mutex> lock(mu_);
      ++fill->waiters;
      cv_.wait(lock, [&] { return fill->done; });
      --fill->waiters;
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
  {
    // No more claims: what helpers read meanwhile is put below, or by them.
    std::lock_guard<std::mutex> lock(mu_);
    ChunkState& state = chunks_[chunk];
    state.todo.clear();
    state.todo_front = state.todo_back = 0;
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

bool Stager::HelpLocked(std::unique_lock<std::mutex>& lock) {
  if (!BulkMayReadLocked()) return false;
  ChunkId chunk = 0;
  bool found = false;
  for (size_t k = cursor_; k < chunk_order_.size() && !found; ++k) {
    const ChunkState& s = chunks_[chunk_order_[k]];
    if (s.active && s.todo_front < s.todo_back) {
      chunk = chunk_order_[k];
      found = true;
    }
  }
  if (!found) return false;
  ChunkState& state = chunks_[chunk];
  const uint32_t index = state.todo[--state.todo_back];
  on_demand_since_bulk_ = 0;
  auto segments = manifest_->Segments(chunk);
  if (!segments.ok()) return true;  // cannot happen: the holder has them
  const ChunkSegment segment = (*segments)[index];
  // A failed sample is skipped, a read in flight (on demand) waited for, by
  // the holder as by us.
  if (failed_samples_.contains(segment.sample) || fills_.contains({chunk, index})) return true;
  auto fill = std::make_shared<Fill>();
  fills_.emplace(FillKey{chunk, index}, fill);
  std::string bytes = TakeBufferLocked(segment.length);
  lock.unlock();
  Status read = ReadFromSource(segment, &bytes, /*bulk=*/true, options_.io_retries);
  lock.lock();
  // Stored by the holder that waits for it, or by us when the holder stopped
  // (or failed) before our read was done.
  const bool hold = FinishFillLocked({chunk, index}, *fill, segment.sample, std::move(bytes), read);
  if (fill->waiters > 0 || !read.ok()) cv_.notify_all();
  if (hold) {
    lock.unlock();
    StoreAsHolder(chunk, *segments);
    lock.lock();
  }
  return true;
}

bool Stager::FinishFillLocked(const FillKey& key, Fill& fill, SampleId sample, std::string bytes,
                              const Status& read) {
  fill.bytes = std::move(bytes);
  fill.status = read;
  fill.done = true;
  if (!read.ok()) {
    RecordFailureLocked(sample, read);
    fills_.erase(key);
    return false;
  }
  if (chunks_[key.first].writer_held) return false;  // the holder puts it and commits
  chunks_[key.first].writer_held = true;
  return true;
}

void Stager::StoreAsHolder(ChunkId chunk, std::span<const ChunkSegment> segments) {
  auto writer = OpenWriter(chunk, segments);
  static_cast<void>(DrainAndRelease(
      chunk, segments, writer.ok() ? std::optional(std::move(*writer)) : std::nullopt));
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
  auto open = [&]() -> Result<StoredChunkWriter> {
    if (store_->HasChunk(key)) return store_->OpenChunkWriter(key, segments);
    auto created = store_->CreateChunk(key, segments);
    if (created.ok() || created.status().code() != StatusCode::kAlreadyExists) return created;
    return store_->OpenChunkWriter(key, segments);
  };
  // kUnavailable: another writer of the file is open (or it is being
  // created). Within this Stager the hold rules that out, so it is another
  // Stager's: one being replaced, whose on-demand fill is committing. Failing
  // here would drop what was read and fail the chunk for good; it is closed
  // within a commit.
  // Real time, not clock_ (a test's manual clock would never give up).
  const auto give_up = std::chrono::steady_clock::now() + kWriterWait;
  for (;;) {
    Result<StoredChunkWriter> writer = open();
    if (writer.ok() || writer.status().code() != StatusCode::kUnavailable ||
        std::chrono::steady_clock::now() >= give_up) {
      return writer;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, kWriterRetry, [&] { return stopping_; })) return writer;
  }
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
        if (f.parked) parked_bytes_ -= f.bytes.size();
        // Unless an on-demand reader still waits to copy them (Fetch).
        if (f.waiters == 0) GiveBackLocked(std::move(f.bytes));
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
    // Every byte is overwritten by the read: a reused buffer that is large
    // enough only shrinks (no zero-filling), a new one is zero-filled once.
    out->resize(segment.length);
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

std::string Stager::TakeBufferLocked(uint64_t size) {
  // The last fitting one (the most recently used: its pages are the warmest).
  for (size_t i = spare_.size(); i-- > 0;) {
    if (spare_[i].capacity() < size) continue;
    std::string buffer = std::move(spare_[i]);
    spare_[i] = std::move(spare_.back());
    spare_.pop_back();
    spare_bytes_ -= buffer.capacity();
    return buffer;
  }
  return std::string();
}

void Stager::GiveBackLocked(std::string buffer) {
  if (buffer.empty() || spare_bytes_ + buffer.capacity() > kSpareBufferBytes) return;
  spare_bytes_ += buffer.capacity();
  spare_.push_back(std::move(buffer));
}

}  // namespace granary

// The Stager's on-demand fetches for readers (stager_internal.h lists the
// Stager's files).

#include <algorithm>
#include <optional>
#include <utility>

#include "granary/cachenode/stager.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "stager_internal.h"

namespace granary {

using stager_internal::ChunkName;
using stager_internal::PieceCount;

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
      // The fill may be put and committed meanwhile: its bytes stay while we wait.
      ++fill->waiters;
      cv_.wait(lock, [&] { return fill->done; });
      --fill->waiters;
      if (!fill->status.ok()) return fill->status;
      if (fill->parked && !fill->put && !chunks_[chunk].kept) {
        // Read ahead for this READ and not kept here: served once, not stored.
        if (auto again = fills_.find({chunk, index});
            again != fills_.end() && again->second == fill) {
          parked_bytes_ -= fill->bytes.size();
          fills_.erase(again);
          ++streamed_segments_;
          streamed_bytes_ += fill->bytes.size();
          streamed_ahead_bytes_ += fill->bytes.size();
        }
        if (fill->waiters == 0) return std::move(fill->bytes);
      }
      return fill->bytes;
    }
    if (options_.lru && budget_.has_value() && !chunks_[chunk].kept) {
      // The LRU baseline: a read chunk is kept, the least recently read ones
      // give way (dropped below, before this one is stored).
      TouchChunk(chunk);
      RecomputeKeptLocked();
      lock.unlock();
      DropNotKept();  // room for it, before a bulk worker or this fetch creates its file
      lock.lock();
      cursor_ = 0;
      cv_.notify_all();
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
    if (read.ok() && !chunks_[chunk].kept && !chunks_[chunk].writer_held) {
      // Not kept on this node (its budget is smaller than its share): the
      // readers get the bytes, the store does not.
      fill->bytes = bytes;
      fill->status = read;
      fill->done = true;
      fills_.erase({chunk, index});
      ++streamed_segments_;
      streamed_bytes_ += bytes.size();
      cv_.notify_all();
      return bytes;
    }
    // Else the holder (a bulk worker) puts it, dropping a replaced copy first, and commits.
    hold = FinishFillLocked({chunk, index}, *fill, segment.sample,
                            read.ok() ? bytes : std::string(), read);
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

// ---- lead-in ------------------------------------------------------------------

void Stager::LeadInLocked() {
  // Not past the store's capacity (or on a full disk): what is read then
  // cannot be stored.
  if (options_.read_ahead == 0 || stopping_ || capacity_ || disk_full_) return;
  const size_t end = std::min<size_t>(order_.size(), options_.read_ahead);
  const size_t queued = wanted_.size();
  for (size_t q = 0; q < end; ++q) QueueReadAheadLocked(order_[q], /*also_not_kept=*/false);
  if (wanted_.size() > queued) lead_in_cv_.notify_all();
}

void Stager::QueueReadAheadLocked(SampleId t, bool also_not_kept) {
  if (t >= manifest_->sample_count() || failed_samples_.contains(t)) return;
  const ChunkId first = manifest_->ChunkOf(t);
  const uint64_t pieces = PieceCount(*manifest_, t);
  for (uint64_t p = 0; p < pieces; ++p) {
    const ChunkId c = first + static_cast<ChunkId>(p);
    if (c >= chunks_.size() || !chunks_[c].owned || chunks_[c].done || chunks_[c].failed) {
      continue;
    }
    if (!chunks_[c].kept && !also_not_kept) continue;
    auto segments = manifest_->Segments(c);
    if (!segments.ok()) continue;
    auto it = std::find_if(segments->begin(), segments->end(),
                           [&](const ChunkSegment& s) { return s.sample == t; });
    if (it == segments->end()) continue;
    const auto index = static_cast<uint32_t>(it - segments->begin());
    if (fills_.contains({c, index})) continue;
    auto bits = store_->PresentSegments(Key(c));
    if (bits.ok() && index < bits->size() && (*bits)[index]) continue;
    fills_.emplace(FillKey{c, index}, std::make_shared<Fill>());
    wanted_.push_back({c, index});
    ++on_demand_pending_;  // ahead of bulk reads, as an on-demand read
  }
}

void Stager::ReadAhead(std::span<const SampleId> samples) {
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.read_ahead == 0 || stopping_ || !started_ || disk_full_) return;
  // Parked bytes are bounded; past the bound the items are read one by one.
  if (parked_bytes_ >= kParkedFillBytes) return;
  const size_t queued = wanted_.size();
  // Not under the LRU baseline: there a read of a chunk not kept makes it kept.
  for (SampleId t : samples) QueueReadAheadLocked(t, /*also_not_kept=*/!options_.lru);
  if (wanted_.size() > queued) lead_in_cv_.notify_all();
}

void Stager::LeadInLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // What was queued is read even when stopping: fetches wait for it.
    lead_in_cv_.wait(lock, [&] { return stopping_ || !wanted_.empty(); });
    if (wanted_.empty()) break;
    const FillKey key = wanted_.front();
    wanted_.pop_front();
    auto it = fills_.find(key);
    auto segments = manifest_->Segments(key.first);
    if (it == fills_.end() || !segments.ok()) {  // cannot happen: queued with its fill
      --on_demand_pending_;
      continue;
    }
    const std::shared_ptr<Fill> fill = it->second;
    const ChunkSegment segment = (*segments)[key.second];
    ++on_demand_since_bulk_;
    lock.unlock();
    std::string bytes;
    Status read = ReadFromSource(segment, &bytes, /*bulk=*/false, options_.io_retries);
    lock.lock();
    --on_demand_pending_;
    // A chunk this node does not keep is never stored: its bytes wait here for
    // the READ that asked for them (Fetch takes them and lets go).
    if (read.ok() && !stopping_ && !chunks_[key.first].writer_held &&
        (parked_bytes_ + bytes.size() <= kParkedFillBytes || !chunks_[key.first].kept)) {
      // Parked, not stored now: the bulk worker that takes the chunk puts it
      // with the chunk's other segments and commits them once, and readers
      // share it meanwhile. Stored one by one, each read ahead cost a commit
      // of its own (docs/benchmarks.md).
      parked_bytes_ += bytes.size();
      fill->bytes = std::move(bytes);
      fill->status = read;
      fill->done = true;
      fill->parked = true;
      cv_.notify_all();
      continue;
    }
    const bool hold = FinishFillLocked(key, *fill, segment.sample, std::move(bytes), read);
    cv_.notify_all();
    if (hold) {
      lock.unlock();
      StoreAsHolder(key.first, *segments);
      lock.lock();
    }
  }
  --workers_running_;
  cv_.notify_all();
}

}  // namespace granary

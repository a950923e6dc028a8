#include "granary/cachenode/stager.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/thread_name.h"
#include "stager_internal.h"

namespace granary {

using stager_internal::PieceCount;

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
  p.chunks_not_kept = chunks_owned - std::min(chunks_kept, chunks_owned);
  p.bytes_not_kept = bytes_owned - std::min(bytes_kept, bytes_owned);
  p.last_read_ms = last_read_ms;
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
  for (ChunkId c : owned) {
    if (c >= chunk_count) {
      return Status::InvalidArgument(doing + ": owned chunk " + std::to_string(c) +
                                     " is past the manifest's " + std::to_string(chunk_count) +
                                     " chunks; compute the owned chunks from this manifest");
    }
  }
  GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkId> chunk_order,
                           ChunkOrder(*manifest, options.order, doing));
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
    stager->RecomputeKeptLocked();
  }
  return stager;
}

Result<std::vector<ChunkId>> Stager::ChunkOrder(const Manifest& manifest,
                                                std::span<const SampleId> order,
                                                const std::string& doing) {
  const size_t chunk_count = manifest.chunk_count();
  const size_t sample_count = manifest.sample_count();
  std::vector<ChunkId> chunk_order;
  chunk_order.reserve(chunk_count);
  std::vector<bool> seen(chunk_count, false);
  for (SampleId s : order) {
    if (s >= sample_count) {
      return Status::InvalidArgument(doing + ": the staging order names sample " +
                                     std::to_string(s) + " but the manifest has " +
                                     std::to_string(sample_count) +
                                     " samples; compute the order from this manifest's plans");
    }
    const ChunkId first = manifest.ChunkOf(s);
    const uint64_t pieces = PieceCount(manifest, s);
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
  return chunk_order;
}

Status Stager::SetOrder(std::span<const SampleId> order) {
  GRANARY_ASSIGN_OR_RETURN(
      std::vector<ChunkId> chunk_order,
      ChunkOrder(*manifest_, order,
                 "re-ordering the staging of dataset " + Quoted(options_.dataset)));
  std::vector<SampleId> copy(order.begin(), order.end());
  std::lock_guard<std::mutex> lock(mu_);
  chunk_order_ = std::move(chunk_order);
  order_ = std::move(copy);
  RecomputeKeptLocked();
  cursor_ = 0;
  if (started_) LeadInLocked();
  cv_.notify_all();
  return Status::Ok();
}

Stager::Stager(std::shared_ptr<const Manifest> manifest, std::shared_ptr<Source> source,
               std::shared_ptr<ChunkStore> store, StagerOptions options,
               std::vector<ChunkId> chunk_order)
    : manifest_(std::move(manifest)),
      source_(std::move(source)),
      store_(std::move(store)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : SystemClock::Default()),
      chunk_order_(std::move(chunk_order)),
      order_(options_.order),
      chunks_(manifest_->chunk_count()) {
  if (options_.lru) {
    last_used_ = std::make_unique<std::atomic<uint64_t>[]>(manifest_->chunk_count());
  }
}

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
    workers_.emplace_back([this] {
      NameThisThread("stager");
      WorkerLoop();
    });
  }
  // As many as the bulk workers (at least kReadAheadThreads): what a dataset
  // does not keep is streamed through them at the source's concurrency.
  const uint32_t lead_in = std::max(kReadAheadThreads, options_.threads);
  for (uint32_t i = 0; options_.read_ahead > 0 && i < lead_in; ++i) {
    ++workers_running_;
    workers_.emplace_back([this] {
      NameThisThread("stager-lead");
      LeadInLoop();
    });
  }
  LeadInLocked();
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
  RecomputeKeptLocked();
  cursor_ = 0;
  capacity_ = false;  // what is owned changed: maybe it fits now
  cv_.notify_all();
  return Status::Ok();
}

void Stager::RecomputeKeptLocked() {
  uint64_t used = 0;
  bool full = false;
  std::vector<ChunkId> order = chunk_order_;
  if (options_.lru && budget_.has_value()) {
    // The most recently read first; never read ones in staging order.
    std::stable_sort(order.begin(), order.end(), [&](ChunkId a, ChunkId b) {
      return last_used_[a].load(std::memory_order_relaxed) >
             last_used_[b].load(std::memory_order_relaxed);
    });
  } else if (budget_.has_value()) {
    // What is stored (or being stored) first, then the staging order: the
    // resident subset stays put when a plan brings a new order (each epoch's
    // plan has one), so no epoch drops and re-stages part of it.
    std::stable_partition(order.begin(), order.end(), [&](ChunkId c) {
      const ChunkState& s = chunks_[c];
      return s.present_segments > 0 || s.done || s.active || s.writer_held;
    });
  }
  for (ChunkId c : order) {
    ChunkState& s = chunks_[c];
    if (!s.owned) {
      s.kept = false;
      continue;
    }
    if (s.file_bytes == 0) {
      auto segments = manifest_->Segments(c);
      s.file_bytes = segments.ok() ? store_->ChunkBytes(*segments) : 0;
    }
    if (!budget_.has_value()) {
      s.kept = true;
      continue;
    }
    // A prefix: what is stored, then the chunks the plans read first.
    full = full || used + s.file_bytes > *budget_;
    s.kept = !full;
    if (s.kept) used += s.file_bytes;
  }
}

void Stager::SetBudget(std::optional<uint64_t> budget_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (budget_ == budget_bytes) return;
  const bool grew = !budget_bytes.has_value() || (budget_.has_value() && *budget_bytes > *budget_);
  budget_ = budget_bytes;
  RecomputeKeptLocked();
  if (grew) capacity_ = false;  // more may fit now
  cursor_ = 0;
  if (started_) LeadInLocked();
  cv_.notify_all();
}

Stager::Dropped Stager::DropNotKept() {
  std::vector<ChunkId> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Read-ahead bytes parked for chunks no longer kept: no holder will put them.
    for (auto it = fills_.begin(); it != fills_.end();) {
      Fill& f = *it->second;
      if (f.parked && f.done && !f.put && f.waiters == 0 && !chunks_[it->first.first].kept) {
        parked_bytes_ -= f.bytes.size();
        it = fills_.erase(it);
      } else {
        ++it;
      }
    }
    for (size_t c = 0; c < chunks_.size(); ++c) {
      ChunkState& s = chunks_[c];
      if (!s.owned || s.kept || s.writer_held || s.active) continue;
      if (!store_->HasChunk(Key(static_cast<ChunkId>(c)))) continue;
      s.writer_held = true;  // no writer opens it while it goes
      victims.push_back(static_cast<ChunkId>(c));
    }
  }
  Dropped dropped;
  std::vector<uint64_t> freed(victims.size(), 0);
  for (size_t i = 0; i < victims.size(); ++i) {
    Result<StoredChunk> held = store_->Chunk(Key(victims[i]));
    Status status = store_->DropChunk(Key(victims[i]));
    if (status.ok()) {
      ++dropped.chunks;
      dropped.file_bytes += held.ok() ? held->bytes : 0;
    } else if (status.code() != StatusCode::kNotFound) {
      GetLogger("cachenode")
          ->warn("dataset {}: dropping chunk {} it no longer keeps: {}", Quoted(options_.dataset),
                 victims[i], status.ToString());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (ChunkId c : victims) {
    chunks_[c].writer_held = false;
    RefreshFromStoreLocked(c);
  }
  cv_.notify_all();
  return dropped;
}

void Stager::TouchChunk(ChunkId chunk) {
  if (!options_.lru || chunk >= manifest_->chunk_count()) return;
  last_used_[chunk].store(lru_tick_.fetch_add(1, std::memory_order_relaxed) + 1,
                          std::memory_order_relaxed);
}

void Stager::TouchSample(SampleId sample) {
  if (!options_.lru || sample >= manifest_->sample_count()) return;
  TouchChunk(manifest_->ChunkOf(sample));
}

void Stager::NoteReads(uint64_t from_store, uint64_t from_source, int64_t now_ms) {
  reads_from_store_.fetch_add(from_store, std::memory_order_relaxed);
  reads_from_source_.fetch_add(from_source, std::memory_order_relaxed);
  last_read_ms_.store(now_ms, std::memory_order_relaxed);
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
    lead_in_cv_.notify_all();
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
    lead_in_cv_.notify_all();
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
    if (c.kept && !c.done && !c.failed) {
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
    p.file_bytes_owned += c.file_bytes;
    p.bytes_staged += c.present_bytes;
    if (c.present_segments == c.segment_count) ++p.chunks_complete;
    if (c.failed) ++p.chunks_failed;
    if (!c.kept) continue;
    ++p.chunks_kept;
    p.bytes_kept += c.payload;
    p.file_bytes_kept += c.file_bytes;
    if (c.done) ++p.chunks_staged;
    if (!c.done && !c.failed && !c.active) ++p.queue_depth;
  }
  p.budget = budget_;
  p.streamed_segments = streamed_segments_;
  p.streamed_bytes = streamed_bytes_;
  p.streamed_ahead_bytes = streamed_ahead_bytes_;
  p.reads_from_store = reads_from_store_.load(std::memory_order_relaxed);
  p.reads_from_source = reads_from_source_.load(std::memory_order_relaxed);
  p.last_read_ms = last_read_ms_.load(std::memory_order_relaxed);
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
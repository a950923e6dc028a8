#include "granary/cachenode/chunk_read_service.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "granary/core/clock.h"
#include "granary/core/hash.h"
#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary {
namespace {

std::string ManifestName(std::string_view dataset, const ContentId& id) {
  return "dataset " + Quoted(dataset) + " with manifest " + id.ToHex();
}

std::string ItemName(const ReadItem& item) {
  return (item.kind == ReadKind::kSample ? "sample " : "chunk ") + std::to_string(item.id) +
         " bytes [" + std::to_string(item.offset) + ", " +
         std::to_string(item.offset + item.length) + ")";
}

// Whether [offset, offset + length) fits in `size` bytes, without overflow.
bool RangeFits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace

// Reads the items of one READ: keeps the chunk readers it opened for the rest
// of the request, so that a batch of samples from one chunk opens it once.
class ChunkReadService::ItemReader {
 public:
  ItemReader(ChunkReadService& service, const Served& served, const std::string& dataset)
      : service_(service), served_(served), dataset_(dataset) {}

  // Appends bytes [offset, offset + length) of the item to `out`.
  Status ReadItem(const ReadItem& item, std::string* out, bool* on_demand) {
    source_error_ = false;
    pieces_ = 0;
    stored_checksum_.reset();
    const Manifest& manifest = *served_.manifest;
    const uint64_t begin = item.offset;
    const uint64_t end = item.offset + item.length;  // offset < 2^64 - 2^32 (codec)
    if (item.kind == ReadKind::kSample) {
      if (item.id >= manifest.sample_count()) {
        return Status::OutOfRange("reading " + ItemName(item) + " of " + Name() +
                                  ": the manifest has " + std::to_string(manifest.sample_count()) +
                                  " samples");
      }
      const uint64_t size = manifest.SizeOf(item.id);
      if (!RangeFits(item.offset, item.length, size)) {
        return Status::OutOfRange("reading " + ItemName(item) + " of " + Name() +
                                  ": the sample has " + std::to_string(size) + " bytes");
      }
      const uint64_t chunk_size = manifest.chunk_size();
      const uint64_t pieces = size > chunk_size ? (size + chunk_size - 1) / chunk_size : 1;
      const ChunkId first = manifest.ChunkOf(item.id);
      for (uint64_t p = 0; p < pieces; ++p) {
        const ChunkId chunk = first + static_cast<ChunkId>(p);
        GRANARY_ASSIGN_OR_RETURN(const std::vector<ChunkSegment>* segments, Segments(chunk));
        bool found = false;
        for (uint32_t i = 0; i < segments->size(); ++i) {
          const ChunkSegment& s = (*segments)[i];
          if (s.sample != item.id) continue;
          found = true;
          GRANARY_RETURN_IF_ERROR(
              AppendOverlap(chunk, *segments, i, s.sample_offset, begin, end, out, on_demand));
        }
        if (!found) {
          return Status::Internal("reading " + ItemName(item) + " of " + Name() + ": chunk " +
                                  std::to_string(chunk) +
                                  " has no piece of it; the manifest is inconsistent");
        }
      }
    } else {
      if (item.id >= manifest.chunk_count()) {
        return Status::OutOfRange("reading " + ItemName(item) + " of " + Name() +
                                  ": the manifest has " + std::to_string(manifest.chunk_count()) +
                                  " chunks");
      }
      GRANARY_ASSIGN_OR_RETURN(ChunkInfo info, manifest.Chunk(item.id));
      if (!RangeFits(item.offset, item.length, info.payload_bytes)) {
        return Status::OutOfRange("reading " + ItemName(item) + " of " + Name() +
                                  ": the chunk has " + std::to_string(info.payload_bytes) +
                                  " payload bytes");
      }
      GRANARY_ASSIGN_OR_RETURN(const std::vector<ChunkSegment>* segments, Segments(item.id));
      for (uint32_t i = 0; i < segments->size(); ++i) {
        GRANARY_RETURN_IF_ERROR(AppendOverlap(item.id, *segments, i, (*segments)[i].chunk_offset,
                                              begin, end, out, on_demand));
      }
    }
    if (out->size() != item.length) {
      return Status::Internal("reading " + ItemName(item) + " of " + Name() +
                              ": the segments hold " + std::to_string(out->size()) +
                              " of its bytes; the manifest is inconsistent");
    }
    return Status::Ok();
  }

  // Whether the last item failed on a sample's recorded source error.
  bool source_error() const { return source_error_; }
  // The last item's checksum when it was one whole segment read from the
  // store: the segment's stored checksum, which the read just verified its
  // bytes against (the same Checksum64), so they need not be hashed again.
  std::optional<uint64_t> stored_checksum() const {
    return pieces_ == 1 ? stored_checksum_ : std::nullopt;
  }

  // verify_once: a whole sample that is one stored segment this service has
  // verified already goes into `answer` as a file range with the segment's
  // stored checksum, holding the chunk open until the reply is sent. False:
  // nothing was added; read the item (ReadItem).
  bool TryFileRange(const granary::ReadItem& item, ReadAnswer& answer) {
    const Manifest& manifest = *served_.manifest;
    if (!service_.options_.verify_once || item.kind != ReadKind::kSample ||
        item.id >= manifest.sample_count() || item.offset != 0 ||
        item.length != manifest.SizeOf(item.id) || item.length > manifest.chunk_size()) {
      return false;
    }
    const ChunkId chunk = manifest.ChunkOf(item.id);
    Result<OpenChunk*> open = Open(chunk);
    if (!open.ok() || (*open)->reader == nullptr) return false;
    const std::vector<ChunkSegment>& segments = (*open)->segments;
    uint32_t index = 0;
    while (index < segments.size() && segments[index].sample != item.id) ++index;
    if (index == segments.size() || segments[index].length != item.length) return false;
    const StoredChunkReader& reader = *(*open)->reader;
    if (!reader->IsPresent(index) || !IsVerified(chunk, index)) return false;
    Result<uint64_t> offset = reader->PayloadOffset(index);
    if (!offset.ok()) return false;
    answer.AddFileRange(reader->fd(), *offset, item.length, reader->checksum(index));
    answer.Hold((*open)->reader);
    return true;
  }

 private:
  struct OpenChunk {
    std::vector<ChunkSegment> segments;
    // Null: not in the store (or unreadable). Shared: a file range's answer
    // holds it (its fd) until the reply is sent.
    std::shared_ptr<StoredChunkReader> reader;
  };

  bool IsVerified(ChunkId chunk, uint32_t index) const {
    VerifiedSegments& v = *served_.verified;
    std::lock_guard<std::mutex> lock(v.mu);
    auto it = v.chunks.find(chunk);
    return it != v.chunks.end() && index < it->second.size() && it->second[index];
  }
  void SetVerified(ChunkId chunk, uint32_t index, bool verified) {
    if (!service_.options_.verify_once) return;
    VerifiedSegments& v = *served_.verified;
    std::lock_guard<std::mutex> lock(v.mu);
    std::vector<bool>& bits = v.chunks[chunk];
    if (bits.size() <= index) bits.resize(index + 1, false);
    bits[index] = verified;
  }

  std::string Name() const { return ManifestName(dataset_, served_.manifest->id()); }
  ChunkKey Key(ChunkId chunk) const { return ChunkKey{dataset_, served_.manifest->id(), chunk}; }

  Result<OpenChunk*> Open(ChunkId chunk) {
    auto it = chunks_.find(chunk);
    if (it != chunks_.end()) return &it->second;
    OpenChunk open;
    GRANARY_ASSIGN_OR_RETURN(open.segments, served_.manifest->Segments(chunk));
    auto reader = service_.store_->OpenChunkReader(Key(chunk), open.segments);
    if (reader.ok()) {
      open.reader = std::make_shared<StoredChunkReader>(std::move(*reader));
    } else if (reader.status().code() != StatusCode::kNotFound &&
               reader.status().code() != StatusCode::kUnavailable) {
      // On demand decides: the store's index says what is present. A chunk
      // being created (kUnavailable) is a cold epoch's normal case: the
      // Stager serves its samples until the file can be opened.
      GetLogger("cachenode")
          ->warn("reading {} chunk {}: {}", Name(), chunk, reader.status().ToString());
    }
    return &chunks_.emplace(chunk, std::move(open)).first->second;
  }
  Result<const std::vector<ChunkSegment>*> Segments(ChunkId chunk) {
    GRANARY_ASSIGN_OR_RETURN(OpenChunk * open, Open(chunk));
    return &open->segments;
  }

  // Appends the part of segment `index` (covering [seg_begin, seg_begin +
  // length) of the item's address space) that overlaps [begin, end).
  Status AppendOverlap(ChunkId chunk, const std::vector<ChunkSegment>& segments, uint32_t index,
                       uint64_t seg_begin, uint64_t begin, uint64_t end, std::string* out,
                       bool* on_demand) {
    const uint64_t seg_end = seg_begin + segments[index].length;
    if (seg_end <= begin || seg_begin >= end) return Status::Ok();
    std::optional<uint64_t> stored;
    GRANARY_ASSIGN_OR_RETURN(std::string bytes, ReadSegment(chunk, index, on_demand, &stored));
    const uint64_t from = std::max(begin, seg_begin) - seg_begin;
    const uint64_t to = std::min(end, seg_end) - seg_begin;
    ++pieces_;
    if (from == 0 && to == bytes.size() && out->empty()) {
      *out = std::move(bytes);  // a whole segment: no second copy
      stored_checksum_ = stored;
    } else {
      if (out->empty()) out->reserve(end - begin);  // [begin, end) is the whole item
      out->append(bytes, from, to - from);
      stored_checksum_.reset();
    }
    return Status::Ok();
  }

  // The verified bytes of one segment: from its chunk file, else on demand; a
  // copy failing its checksum is dropped and fetched again.
  // `stored`: the segment's stored checksum when the bytes came from the
  // store (verified against it), else left unset.
  Result<std::string> ReadSegment(ChunkId chunk, uint32_t index, bool* on_demand,
                                  std::optional<uint64_t>* stored) {
    GRANARY_ASSIGN_OR_RETURN(OpenChunk * open, Open(chunk));
    if (open->reader != nullptr && (*open->reader)->IsPresent(index)) {
      auto bytes = (*open->reader)->Read(index);
      if (bytes.ok()) {
        *stored = (*open->reader)->checksum(index);
        SetVerified(chunk, index, true);
        return bytes;
      }
      if (bytes.status().code() == StatusCode::kCorruption) {
        return Restage(chunk, open->segments, index, bytes.status(), on_demand);
      }
      if (bytes.status().code() != StatusCode::kNotFound) {
        // The disk failed the read (EIO, ...): this item fails; nothing is
        // served that the store did not verify.
        // Warned once (then at debug): a failing disk fails many reads.
        const bool first = service_.store_read_errors_.fetch_add(1, std::memory_order_relaxed) == 0;
        GetLogger("cachenode")
            ->log(
                first ? spdlog::level::warn : spdlog::level::debug,
                "reading segment {} of chunk {} of {} from chunk store {}: {} (further store read "
                "errors are counted in store_read_errors)",
                index, chunk, Name(), service_.store_->root(), bytes.status().ToString());
        // Short (a READ item's message is cut at 192 bytes): the client knows
        // the dataset it asked for.
        return bytes.status().WithContext("reading segment " + std::to_string(index) +
                                          " of chunk " + std::to_string(chunk) +
                                          " from chunk store " + service_.store_->root());
      }
    }
    *on_demand = true;
    auto fetched = served_.stager->FetchSegment(chunk, index);
    if (fetched.ok()) return fetched;
    if (fetched.status().code() == StatusCode::kCorruption) {
      return Restage(chunk, open->segments, index, fetched.status(), on_demand);
    }
    return Classify(open->segments[index].sample, fetched.status());
  }

  // A chunk this node does not hold is kNotFound on the wire (protocol.md);
  // the Stager says kFailedPrecondition for it, which is also what a changed
  // source file is, so only a sample without a recorded source error is mapped.
  Status Classify(SampleId sample, const Status& status) {
    const bool recorded = !served_.stager->SampleError(sample).ok();
    source_error_ = source_error_ || recorded;
    if (status.code() == StatusCode::kFailedPrecondition && !recorded) {
      return Status::NotFound(status.message() + " (node " + Quoted(service_.options_.node_name) +
                              ")");
    }
    return status;
  }

  // A stored copy failed its checksum: the Stager drops it and reads the
  // segment from the source again, coordinated with its own writer hold (a
  // bulk worker filling the chunk puts and commits the fresh bytes).
  Result<std::string> Restage(ChunkId chunk, const std::vector<ChunkSegment>& segments,
                              uint32_t index, const Status& corruption, bool* on_demand) {
    service_.checksum_failures_.fetch_add(1, std::memory_order_relaxed);
    SetVerified(chunk, index, false);
    GetLogger("cachenode")
        ->warn("re-staging segment {} of chunk {} of {} after a checksum failure: {}", index, chunk,
               Name(), corruption.ToString());
    *on_demand = true;
    auto fetched = served_.stager->DropAndRefetch(chunk, index);
    if (!fetched.ok()) return Classify(segments[index].sample, fetched.status());
    service_.restaged_segments_.fetch_add(1, std::memory_order_relaxed);
    // Our reader's view of the chunk is stale now (the segment was dropped and
    // put again): refresh it, or read the rest of the chunk through the Stager.
    // The entry stays: callers iterate over its segment list.
    if (auto it = chunks_.find(chunk); it != chunks_.end() && it->second.reader != nullptr) {
      if (!it->second.reader->Refresh().ok()) it->second.reader.reset();
    }
    return fetched;
  }

  ChunkReadService& service_;
  const Served& served_;
  bool source_error_ = false;
  uint32_t pieces_ = 0;                      // segments the last item was read from
  std::optional<uint64_t> stored_checksum_;  // of its one segment, when stored
  const std::string& dataset_;
  std::map<ChunkId, OpenChunk> chunks_;
};

ChunkReadService::ChunkReadService(std::shared_ptr<ChunkStore> store,
                                   ChunkReadServiceOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}

Status ChunkReadService::CheckServable(const std::shared_ptr<const Manifest>& manifest,
                                       const std::shared_ptr<Stager>& stager,
                                       const std::string& doing) const {
  if (manifest == nullptr || stager == nullptr) {
    return Status::InvalidArgument(doing + " a dataset in the read service of node " +
                                   Quoted(options_.node_name) +
                                   ": the manifest and the stager must not be null");
  }
  if (stager->manifest()->id() != manifest->id()) {
    return Status::InvalidArgument(doing + " " + ManifestName(stager->dataset(), manifest->id()) +
                                   " in the read service of node " + Quoted(options_.node_name) +
                                   ": the stager stages manifest " +
                                   stager->manifest()->id().ToHex() +
                                   "; create the stager over this manifest");
  }
  return Status::Ok();
}

Status ChunkReadService::Add(std::shared_ptr<const Manifest> manifest,
                             std::shared_ptr<Stager> stager) {
  GRANARY_RETURN_IF_ERROR(CheckServable(manifest, stager, "adding"));
  const std::string what = "adding " + ManifestName(stager->dataset(), manifest->id()) +
                           " to the read service of node " + Quoted(options_.node_name);
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::pair(stager->dataset(), manifest->id());
  if (served_.count(key) != 0) {
    return Status::AlreadyExists(what + ": it is served already; Remove it first");
  }
  served_.emplace(std::move(key), Served{std::move(manifest), std::move(stager),
                                         std::make_shared<VerifiedSegments>()});
  return Status::Ok();
}

Status ChunkReadService::Replace(std::shared_ptr<const Manifest> manifest,
                                 std::shared_ptr<Stager> stager) {
  GRANARY_RETURN_IF_ERROR(CheckServable(manifest, stager, "replacing the stager of"));
  Served replaced;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = served_.find(std::pair(stager->dataset(), manifest->id()));
  if (it == served_.end()) {
    return Status::NotFound("replacing the stager of " +
                            ManifestName(stager->dataset(), manifest->id()) +
                            " in the read service of node " + Quoted(options_.node_name) +
                            ": it is not served; Add it");
  }
  replaced = std::exchange(it->second, Served{std::move(manifest), std::move(stager),
                                              std::make_shared<VerifiedSegments>()});
  return Status::Ok();
}

Status ChunkReadService::Remove(std::string_view dataset, const ContentId& manifest_id) {
  Served removed;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = served_.find(std::pair(std::string(dataset), manifest_id));
  if (it == served_.end()) {
    return Status::NotFound("removing " + ManifestName(dataset, manifest_id) +
                            " from the read service of node " + Quoted(options_.node_name) +
                            ": it is not served");
  }
  removed = std::move(it->second);
  served_.erase(it);
  return Status::Ok();
}

size_t ChunkReadService::dataset_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return served_.size();
}

Result<ChunkReadService::Served> ChunkReadService::Find(std::string_view dataset,
                                                        const ContentId& manifest_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = served_.find(std::pair(std::string(dataset), manifest_id));
  if (it == served_.end()) {
    return Status::NotFound(ManifestName(dataset, manifest_id) + " is not served by node " +
                            Quoted(options_.node_name) +
                            "; check the dataset's placement or register it here");
  }
  return it->second;
}

void ChunkReadService::CountError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOutOfRange:
      items_out_of_range_.fetch_add(1, std::memory_order_relaxed);
      return;
    case StatusCode::kCorruption:
      items_corrupt_.fetch_add(1, std::memory_order_relaxed);
      return;
    default:
      break;
  }
  items_other_error_.fetch_add(1, std::memory_order_relaxed);
}

Result<ReadAnswer> ChunkReadService::Read(const ReadRequest& request) {
  reads_.fetch_add(1, std::memory_order_relaxed);
  auto served = Find(request.dataset, request.manifest_id);
  if (!served.ok()) {
    reads_not_found_.fetch_add(1, std::memory_order_relaxed);
    return served.status();
  }
  ItemReader reader(*this, *served, request.dataset);
  ReadAnswer answer;
  uint64_t from_store = 0;
  uint64_t from_source = 0;
  const bool lru = served->stager->lru();
  if (request.items.size() > 1) {
    // The samples this READ asks for that are not stored yet are read from
    // the source together, not one after another as the loop below reaches
    // them (a cold epoch's first batches).
    std::vector<SampleId> samples;
    samples.reserve(request.items.size());
    for (const ReadItem& item : request.items) {
      if (item.kind == ReadKind::kSample) samples.push_back(item.id);
    }
    served->stager->ReadAhead(samples);
  }
  for (const ReadItem& item : request.items) {
    if (lru) {
      if (item.kind == ReadKind::kChunkRange) {
        served->stager->TouchChunk(item.id);
      } else {
        served->stager->TouchSample(item.id);
      }
    }
    if (reader.TryFileRange(item, answer)) {
      ++from_store;
      items_ok_.fetch_add(1, std::memory_order_relaxed);
      items_from_disk_.fetch_add(1, std::memory_order_relaxed);
      items_sendfile_.fetch_add(1, std::memory_order_relaxed);
      bytes_served_.fetch_add(item.length, std::memory_order_relaxed);
      continue;
    }
    std::string bytes;  // a whole segment's buffer is moved in; else reserved at its first piece
    bool on_demand = false;
    Status status = reader.ReadItem(item, &bytes, &on_demand);
    if (!status.ok()) {
      if (reader.source_error()) {
        items_source_error_.fetch_add(1, std::memory_order_relaxed);
      } else {
        CountError(status);
      }
      answer.AddError(std::move(status));
      continue;
    }
    items_ok_.fetch_add(1, std::memory_order_relaxed);
    ++(on_demand ? from_source : from_store);
    (on_demand ? items_on_demand_ : items_from_disk_).fetch_add(1, std::memory_order_relaxed);
    bytes_served_.fetch_add(bytes.size(), std::memory_order_relaxed);
    const std::optional<uint64_t> stored = reader.stored_checksum();
    const uint64_t checksum = stored.has_value() ? *stored : Checksum64(bytes);
    answer.AddBytes(std::move(bytes), checksum);
  }
  served->stager->NoteReads(from_store, from_source, SystemClock::Default()->NowMillis());
  return answer;
}

Result<StatReply> ChunkReadService::Stat(const StatRequest& request) {
  StatReply reply;
  auto add = [&](std::string key, uint64_t value) {
    reply.entries.push_back(StatEntry{std::move(key), value});
  };
  if (request.dataset.empty()) {
    std::vector<Served> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [key, served] : served_) all.push_back(served);
    }
    StagerProgress sum;
    uint64_t complete = 0;
    for (const Served& s : all) {
      const StagerProgress p = s.stager->Progress();
      sum.chunks_owned += p.chunks_owned;
      sum.chunks_staged += p.chunks_staged;
      sum.bytes_owned += p.bytes_owned;
      sum.bytes_staged += p.bytes_staged;
      sum.on_demand_fetches += p.on_demand_fetches;
      if (p.state == StagingState::kComplete) ++complete;
    }
    add("datasets_served", all.size());
    add("datasets_complete", complete);
    add("chunks_owned", sum.chunks_owned);
    add("chunks_staged", sum.chunks_staged);
    add("bytes_owned", sum.bytes_owned);
    add("bytes_staged", sum.bytes_staged);
    add("on_demand_fetches", sum.on_demand_fetches);
    const ChunkStoreStats store = store_->Stats();
    add("store_capacity_bytes", store.capacity_bytes);
    add("store_used_bytes", store.used_bytes);
    const ChunkReadServiceCounters c = Counters();
    add("reads", c.reads);
    add("reads_not_found", c.reads_not_found);
    add("items_ok", c.items_ok);
    add("items_from_disk", c.items_from_disk);
    add("items_on_demand", c.items_on_demand);
    add("items_out_of_range", c.items_out_of_range);
    add("items_source_error", c.items_source_error);
    add("items_corrupt", c.items_corrupt);
    add("items_other_error", c.items_other_error);
    add("bytes_served", c.bytes_served);
    add("checksum_failures", c.checksum_failures);
    add("restaged_segments", c.restaged_segments);
    add("store_read_errors", c.store_read_errors);
    return reply;
  }
  std::optional<Served> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, served] : served_) {
      if (key.first != request.dataset) continue;
      if (request.manifest_id == ContentId{} || key.second == request.manifest_id) {
        found = served;
        break;
      }
    }
  }
  if (!found.has_value()) {
    return Status::NotFound("stat of " + ManifestName(request.dataset, request.manifest_id) +
                            ": it is not served by node " + Quoted(options_.node_name));
  }
  const StagerProgress p = found->stager->Progress();
  add("state_" + std::string(StagingStateName(p.state)), 1);
  add("chunks_owned", p.chunks_owned);
  add("chunks_staged", p.chunks_staged);
  add("chunks_complete", p.chunks_complete);
  add("chunks_failed", p.chunks_failed);
  add("bytes_owned", p.bytes_owned);
  add("bytes_staged", p.bytes_staged);
  add("queue_depth", p.queue_depth);
  add("chunks_in_flight", p.chunks_in_flight);
  add("on_demand_fetches", p.on_demand_fetches);
  add("on_demand_shared", p.on_demand_shared);
  add("on_demand_not_stored", p.on_demand_not_stored);
  for (size_t k = 0; k < kSourceErrorKinds; ++k) {
    add("samples_failed_" + std::string(SourceErrorKindName(static_cast<SourceErrorKind>(k))),
        p.samples_failed[k]);
  }
  return reply;
}

ChunkReadServiceCounters ChunkReadService::Counters() const {
  ChunkReadServiceCounters c;
  c.reads = reads_.load(std::memory_order_relaxed);
  c.reads_not_found = reads_not_found_.load(std::memory_order_relaxed);
  c.items_ok = items_ok_.load(std::memory_order_relaxed);
  c.items_from_disk = items_from_disk_.load(std::memory_order_relaxed);
  c.items_on_demand = items_on_demand_.load(std::memory_order_relaxed);
  c.items_out_of_range = items_out_of_range_.load(std::memory_order_relaxed);
  c.items_source_error = items_source_error_.load(std::memory_order_relaxed);
  c.items_corrupt = items_corrupt_.load(std::memory_order_relaxed);
  c.items_other_error = items_other_error_.load(std::memory_order_relaxed);
  c.bytes_served = bytes_served_.load(std::memory_order_relaxed);
  c.checksum_failures = checksum_failures_.load(std::memory_order_relaxed);
  c.restaged_segments = restaged_segments_.load(std::memory_order_relaxed);
  c.store_read_errors = store_read_errors_.load(std::memory_order_relaxed);
  c.items_sendfile = items_sendfile_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace granary

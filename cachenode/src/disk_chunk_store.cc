// The on-disk chunk store (disk_chunk_store.h): its in-memory index, the
// writers and readers it hands out, creates, opens and queries. Opening and
// the restart scan are chunk_store_scan.cc; drops are chunk_store_drop.cc.

#include "disk_chunk_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "chunk_store_layout.h"
#include "granary/core/chunk_format.h"
#include "granary/core/names.h"

namespace granary {

namespace cf = chunk_format;
using chunk_store_layout::CheckDataset;
using chunk_store_layout::DescribeChunk;
using chunk_store_layout::kChunkSuffix;
using chunk_store_layout::MakeDirectory;
using chunk_store_layout::WithHint;

namespace {

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

// ---------------------------------------------------------------------------
// Writers and readers: core's ChunkWriter and ChunkReader, with a Handle that
// keeps the chunk's entry (and the store) open.

class DiskChunkStore::Writer final : public StoredChunkWriter::Backend {
 public:
  Writer(Handle handle, ChunkWriter writer)
      : handle_(std::move(handle)), writer_(std::move(writer)) {}

  Status Put(uint32_t index, std::string_view bytes) override {
    GRANARY_RETURN_IF_ERROR(writer_.Put(index, bytes));
    handle_.store().bytes_written_.fetch_add(bytes.size(), std::memory_order_relaxed);
    return Status::Ok();
  }
  Status Commit() override {
    DiskChunkStore& store = handle_.store();
    GRANARY_RETURN_IF_ERROR(store.CheckNotDropped(*handle_.entry(), "commit", key()));
    GRANARY_RETURN_IF_ERROR(writer_.Commit());
    return store.PublishPresence(*handle_.entry(), writer_);
  }
  Status Drop(uint32_t index) override {
    DiskChunkStore& store = handle_.store();
    GRANARY_RETURN_IF_ERROR(store.CheckNotDropped(*handle_.entry(), "drop a segment of", key()));
    GRANARY_RETURN_IF_ERROR(writer_.Drop(index));
    return store.PublishPresence(*handle_.entry(), writer_);
  }
  bool IsPresent(uint32_t index) const override { return writer_.IsPresent(index); }
  uint32_t present_count() const override { return writer_.present_count(); }
  uint32_t segment_count() const override { return writer_.segment_count(); }
  const ChunkKey& key() const override { return writer_.key(); }
  const std::string& path() const override { return writer_.path(); }
  std::span<const ChunkSegment> segments() const override { return writer_.segments(); }

 private:
  // Declared before writer_ so that the file (and its flock) is closed before
  // the store hears that the writer is gone.
  Handle handle_;
  ChunkWriter writer_;
};

class DiskChunkStore::Reader final : public StoredChunkReader::Backend {
 public:
  Reader(Handle handle, ChunkReader reader)
      : handle_(std::move(handle)), reader_(std::move(reader)) {}

  bool IsPresent(uint32_t index) const override { return reader_.IsPresent(index); }
  uint32_t present_count() const override { return reader_.present_count(); }
  uint32_t segment_count() const override { return reader_.segment_count(); }
  const std::string& path() const override { return reader_.path(); }
  const ChunkKey& key() const override { return reader_.key(); }
  std::span<const ChunkSegment> segments() const override { return reader_.segments(); }
  Status Read(uint32_t index, std::span<char> out) const override {
    return reader_.Read(index, out);
  }
  Result<std::string> Read(uint32_t index) const override { return reader_.Read(index); }
  Result<uint64_t> PayloadOffset(uint32_t index) const override {
    return reader_.PayloadOffset(index);
  }
  Status Verify(uint32_t index, std::string_view bytes) const override {
    return reader_.Verify(index, bytes);
  }
  uint64_t checksum(uint32_t index) const override { return reader_.checksum(index); }
  int fd() const override { return reader_.fd(); }
  Result<ChunkScan> Scan(ChunkScanMode mode) const override { return reader_.Scan(mode); }
  Status Refresh() override { return reader_.Refresh(); }

 private:
  Handle handle_;
  ChunkReader reader_;
};

// ---------------------------------------------------------------------------
// Handles

DiskChunkStore::Handle& DiskChunkStore::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Reset();
    store_ = std::move(other.store_);
    entry_ = std::move(other.entry_);
    writer_ = other.writer_;
  }
  return *this;
}

void DiskChunkStore::Handle::Reset() {
  if (store_ != nullptr) store_->ReleaseHandle(*entry_, writer_);
  entry_.reset();
  store_.reset();  // may destroy the store: last
}

// ---------------------------------------------------------------------------
// Construction (Open and the restart scan are chunk_store_scan.cc)

DiskChunkStore::DiskChunkStore(std::string root, uint64_t capacity,
                               const ChunkStoreOptions& options, uint64_t block_size,
                               ScopedFd lock_fd)
    : root_(std::move(root)),
      capacity_(capacity),
      options_(options),
      block_size_(block_size),
      lock_fd_(std::move(lock_fd)) {}

DiskChunkStore::~DiskChunkStore() = default;

// ---------------------------------------------------------------------------
// Sizes and paths

uint64_t DiskChunkStore::ChunkBytes(uint32_t segment_count, uint64_t payload_size) const {
  return RoundUp(cf::HeaderRegionSize(segment_count) + payload_size, block_size_);
}

uint64_t DiskChunkStore::ChunkBytes(std::span<const ChunkSegment> segments) const {
  uint64_t end = 0;
  for (const ChunkSegment& s : segments) end = std::max(end, uint64_t{s.chunk_offset} + s.length);
  auto count = static_cast<uint32_t>(std::min<size_t>(segments.size(), UINT32_MAX));
  return ChunkBytes(count, end);
}

std::string DiskChunkStore::ManifestDirectory(std::string_view dataset,
                                              const ContentId& manifest_id) const {
  return fmt::format("{}/{}/{}", root_, dataset, manifest_id.ToHex());
}

std::string DiskChunkStore::ChunkPath(const ChunkKey& key) const {
  return fmt::format("{}/{}{}", ManifestDirectory(key.dataset, key.manifest_id), key.chunk,
                     kChunkSuffix);
}

Status DiskChunkStore::EnsureManifestDirectory(const ChunkKey& key) const {
  GRANARY_RETURN_IF_ERROR(MakeDirectory(fmt::format("{}/{}", root_, key.dataset)));
  return MakeDirectory(ManifestDirectory(key.dataset, key.manifest_id));
}

// ---------------------------------------------------------------------------
// The index (mu_ held)

std::shared_ptr<DiskChunkStore::Entry> DiskChunkStore::FindLocked(const ChunkKey& key) const {
  auto d = datasets_.find(key.dataset);
  if (d == datasets_.end()) return nullptr;
  auto m = d->second.find(key.manifest_id);
  if (m == d->second.end()) return nullptr;
  auto c = m->second.chunks.find(key.chunk);
  return c == m->second.chunks.end() ? nullptr : c->second;
}

void DiskChunkStore::EraseLocked(const ChunkKey& key, const Entry* entry) {
  auto d = datasets_.find(key.dataset);
  if (d == datasets_.end()) return;
  auto m = d->second.find(key.manifest_id);
  if (m == d->second.end()) return;
  auto c = m->second.chunks.find(key.chunk);
  if (c != m->second.chunks.end() && c->second.get() == entry) m->second.chunks.erase(c);
  // A manifest being dropped stays: creates in it are refused until the drop ends.
  if (m->second.chunks.empty() && !m->second.dropping) d->second.erase(m);
  if (d->second.empty()) datasets_.erase(d);
}

void DiskChunkStore::ReleaseBytesLocked(Entry& entry) {
  used_bytes_ -= entry.bytes;
  entry.bytes = 0;
}

Result<std::shared_ptr<DiskChunkStore::Entry>> DiskChunkStore::AcquireLocked(
    const ChunkKey& key, bool writer, std::string_view doing) {
  std::shared_ptr<Entry> entry = FindLocked(key);
  if (entry == nullptr || entry->state == EntryState::kDropping ||
      entry->state == EntryState::kDropped) {
    return Status::NotFound(
        fmt::format("{}: it is not in the store; create it with CreateChunk", doing));
  }
  if (entry->state == EntryState::kCreating) {
    return Status::Unavailable(
        fmt::format("{}: it is being created; retry when CreateChunk has returned", doing));
  }
  if (writer && entry->writer_open) {
    return Status::Unavailable(
        fmt::format("{}: another writer of it is open; retry when that one is closed", doing));
  }
  ++entry->open_handles;
  if (writer) entry->writer_open = true;
  return entry;
}

void DiskChunkStore::ReleaseHandle(Entry& entry, bool writer) {
  std::lock_guard lock(mu_);
  --entry.open_handles;
  if (writer) entry.writer_open = false;
  if (entry.state == EntryState::kDropped && entry.open_handles == 0) ReleaseBytesLocked(entry);
}

Status DiskChunkStore::CheckNotDropped(const Entry& entry, std::string_view doing,
                                       const ChunkKey& key) const {
  std::lock_guard lock(mu_);
  if (entry.state == EntryState::kReady) return Status::Ok();
  return Status::FailedPrecondition(
      fmt::format("{} {} in chunk store {}: the chunk was dropped while this writer was open; "
                  "create it anew",
                  doing, DescribeChunk(key), root_));
}

Status DiskChunkStore::CheckOpenedFileIsTheEntrys(const Entry& entry,
                                                  std::string_view doing) const {
  // A drop marks the entry before it unlinks the file, so an entry still ready
  // after the open means the file opened was this entry's, not a later
  // chunk's created under the same name.
  std::lock_guard lock(mu_);
  if (entry.state == EntryState::kReady) return Status::Ok();
  return Status::NotFound(fmt::format("{}: it was dropped while being opened", doing));
}

Status DiskChunkStore::PublishPresence(Entry& entry, const ChunkWriter& writer) {
  std::vector<bool> present(writer.segment_count());
  for (uint32_t i = 0; i < writer.segment_count(); ++i) present[i] = writer.IsPresent(i);
  std::lock_guard lock(mu_);
  if (entry.state != EntryState::kReady) {
    return Status::FailedPrecondition(
        fmt::format("commit {} in chunk store {}: the chunk was dropped while this writer was "
                    "open; create it anew",
                    DescribeChunk(writer.key()), root_));
  }
  entry.present = std::move(present);
  entry.present_count = writer.present_count();
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Create, open

Result<StoredChunkWriter> DiskChunkStore::CreateChunk(const ChunkKey& key,
                                                      std::span<const ChunkSegment> segments) {
  const std::string doing = fmt::format("create {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  // The full geometry check is ChunkWriter::Create's; this one only keeps a
  // bogus size from being reported as "does not fit".
  uint64_t payload_end = 0;
  for (const ChunkSegment& s : segments) {
    payload_end = std::max(payload_end, uint64_t{s.chunk_offset} + s.length);
  }
  if (segments.size() > cf::kMaxSegments || payload_end > cf::kMaxPayloadSize) {
    return Status::InvalidArgument(fmt::format(
        "{}: {} segments ending at payload offset {} exceed the chunk file limits ({} segments, "
        "{} bytes); pass the manifest's segment list for the chunk",
        doing, segments.size(), payload_end, cf::kMaxSegments, cf::kMaxPayloadSize));
  }
  const uint64_t bytes = ChunkBytes(static_cast<uint32_t>(segments.size()), payload_end);
  std::shared_ptr<DiskChunkStore> self = shared_from_this();
  auto entry = std::make_shared<Entry>();
  {
    std::lock_guard lock(mu_);
    if (dropping_datasets_.contains(key.dataset)) {
      return Status::Unavailable(
          fmt::format("{}: the dataset is being dropped; retry when the drop is done", doing));
    }
    if (std::shared_ptr<Entry> existing = FindLocked(key); existing != nullptr) {
      switch (existing->state) {
        case EntryState::kReady:
          return Status::AlreadyExists(fmt::format(
              "{}: it is already in the store; fill it with OpenChunkWriter, or DropChunk it "
              "first",
              doing));
        case EntryState::kCreating:
          return Status::Unavailable(fmt::format(
              "{}: another thread is creating it; retry when that create returns", doing));
        case EntryState::kDropping:
        case EntryState::kDropped:
          return Status::Unavailable(
              fmt::format("{}: it is being dropped; retry when the drop is done", doing));
      }
    }
    auto d = datasets_.find(key.dataset);
    if (d != datasets_.end()) {
      auto m = d->second.find(key.manifest_id);
      if (m != d->second.end() && m->second.dropping) {
        return Status::Unavailable(
            fmt::format("{}: the manifest is being dropped; retry when the drop is done", doing));
      }
    }
    if (used_bytes_ > capacity_ || bytes > capacity_ - used_bytes_) {
      ++creates_refused_;
      return Status::ResourceExhausted(fmt::format(
          "{}: it takes {} bytes and the store has {} of its {} bytes free; drop chunks or "
          "datasets, or raise the capacity",
          doing, bytes, used_bytes_ > capacity_ ? 0 : capacity_ - used_bytes_, capacity_));
    }
    used_bytes_ += bytes;
    entry->bytes = bytes;
    entry->open_handles = 1;
    entry->writer_open = true;
    datasets_[key.dataset][key.manifest_id].chunks[key.chunk] = entry;
  }

  const std::string path = ChunkPath(key);
  Status created = EnsureManifestDirectory(key);
  std::optional<ChunkWriter> writer;
  if (created.ok()) {
    ChunkCreateOptions create_options;
    create_options.preallocate = options_.preallocate;
    auto w = ChunkWriter::Create(path, key, segments, create_options);
    if (w.ok()) {
      writer.emplace(std::move(*w));
    } else {
      created = w.status();
    }
  }
  if (!created.ok()) {
    // Create may fail after its file got its name (syncing the directory):
    // leave nothing behind. kAlreadyExists is a file the index did not know;
    // it is not ours to remove.
    if (created.code() != StatusCode::kAlreadyExists) ::unlink(path.c_str());
    bool no_space = created.code() == StatusCode::kResourceExhausted;
    {
      std::lock_guard lock(mu_);
      EraseLocked(key, entry.get());
      ReleaseBytesLocked(*entry);
      if (no_space) ++creates_no_space_;
    }
    changed_.notify_all();
    if (no_space) {
      return WithHint(created.WithContext(doing),
                      "the file system is full before the store's capacity is reached: free "
                      "space on it, or lower the capacity");
    }
    return created.WithContext(doing);
  }
  {
    std::lock_guard lock(mu_);
    entry->state = EntryState::kReady;
    entry->present.assign(segments.size(), false);
    entry->present_count = 0;
    ++chunks_created_;
  }
  changed_.notify_all();
  return StoredChunkWriter(std::make_unique<Writer>(
      Handle(std::move(self), std::move(entry), /*writer=*/true), std::move(*writer)));
}

Result<StoredChunkWriter> DiskChunkStore::OpenChunkWriter(const ChunkKey& key,
                                                          std::span<const ChunkSegment> segments) {
  const std::string doing =
      fmt::format("open a writer of {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::shared_ptr<DiskChunkStore> self = shared_from_this();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mu_);
    GRANARY_ASSIGN_OR_RETURN(entry, AcquireLocked(key, /*writer=*/true, doing));
  }
  Handle handle(std::move(self), std::move(entry), /*writer=*/true);  // released on failure
  auto writer = ChunkWriter::Open(ChunkPath(key), key, segments);
  if (!writer.ok()) return writer.status().WithContext(doing);
  GRANARY_RETURN_IF_ERROR(CheckOpenedFileIsTheEntrys(*handle.entry(), doing));
  return StoredChunkWriter(std::make_unique<Writer>(std::move(handle), std::move(*writer)));
}

Result<StoredChunkReader> DiskChunkStore::OpenChunkReader(const ChunkKey& key,
                                                          std::span<const ChunkSegment> segments) {
  const std::string doing = fmt::format("open {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::shared_ptr<DiskChunkStore> self = shared_from_this();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard lock(mu_);
    GRANARY_ASSIGN_OR_RETURN(entry, AcquireLocked(key, /*writer=*/false, doing));
  }
  Handle handle(std::move(self), std::move(entry), /*writer=*/false);
  auto reader = ChunkReader::Open(ChunkPath(key), key, segments);
  if (!reader.ok()) return reader.status().WithContext(doing);
  GRANARY_RETURN_IF_ERROR(CheckOpenedFileIsTheEntrys(*handle.entry(), doing));
  return StoredChunkReader(std::make_unique<Reader>(std::move(handle), std::move(*reader)));
}

// ---------------------------------------------------------------------------
// Queries

bool DiskChunkStore::HasChunk(const ChunkKey& key) const {
  if (!IsDnsLabel(key.dataset)) return false;
  std::lock_guard lock(mu_);
  std::shared_ptr<Entry> entry = FindLocked(key);
  return entry != nullptr && entry->state == EntryState::kReady;
}

Result<StoredChunk> DiskChunkStore::Chunk(const ChunkKey& key) const {
  const std::string doing = fmt::format("look up {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::lock_guard lock(mu_);
  std::shared_ptr<Entry> entry = FindLocked(key);
  if (entry == nullptr || entry->state != EntryState::kReady) {
    return Status::NotFound(fmt::format("{}: it is not in the store", doing));
  }
  StoredChunk out;
  out.chunk = key.chunk;
  out.segment_count = static_cast<uint32_t>(entry->present.size());
  out.present_count = entry->present_count;
  out.bytes = entry->bytes;
  return out;
}

Result<std::vector<bool>> DiskChunkStore::PresentSegments(const ChunkKey& key) const {
  const std::string doing =
      fmt::format("list present segments of {} in chunk store {}", DescribeChunk(key), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(key.dataset, doing));
  std::lock_guard lock(mu_);
  std::shared_ptr<Entry> entry = FindLocked(key);
  if (entry == nullptr || entry->state != EntryState::kReady) {
    return Status::NotFound(fmt::format("{}: it is not in the store", doing));
  }
  return entry->present;
}

std::vector<StoredManifest> DiskChunkStore::Manifests() const {
  std::vector<StoredManifest> out;
  std::lock_guard lock(mu_);
  for (const auto& [dataset, manifests] : datasets_) {
    for (const auto& [id, m] : manifests) {
      StoredManifest s;
      s.dataset = dataset;
      s.manifest_id = id;
      for (const auto& [chunk, entry] : m.chunks) {
        if (entry->state != EntryState::kReady) continue;
        ++s.chunk_count;
        s.segment_count += entry->present.size();
        s.present_segments += entry->present_count;
        s.bytes += entry->bytes;
        if (entry->present_count == entry->present.size()) ++s.complete_chunks;
      }
      if (s.chunk_count > 0) out.push_back(std::move(s));
    }
  }
  return out;
}

Result<std::vector<StoredChunk>> DiskChunkStore::Chunks(std::string_view dataset,
                                                        const ContentId& manifest_id) const {
  const std::string doing = fmt::format("list chunks of dataset {} manifest {} in chunk store {}",
                                        Quoted(dataset), manifest_id.ToHex(), root_);
  GRANARY_RETURN_IF_ERROR(CheckDataset(dataset, doing));
  std::vector<StoredChunk> out;
  std::lock_guard lock(mu_);
  auto d = datasets_.find(dataset);
  if (d != datasets_.end()) {
    auto m = d->second.find(manifest_id);
    if (m != d->second.end()) {
      for (const auto& [chunk, entry] : m->second.chunks) {
        if (entry->state != EntryState::kReady) continue;
        out.push_back({chunk, static_cast<uint32_t>(entry->present.size()), entry->present_count,
                       entry->bytes});
      }
    }
  }
  if (out.empty()) return Status::NotFound(fmt::format("{}: it has no chunks here", doing));
  return out;
}

uint64_t DiskChunkStore::used_bytes() const {
  std::lock_guard lock(mu_);
  return used_bytes_;
}

uint64_t DiskChunkStore::free_bytes() const {
  std::lock_guard lock(mu_);
  return used_bytes_ >= capacity_ ? 0 : capacity_ - used_bytes_;
}

ChunkStoreStats DiskChunkStore::Stats() const {
  ChunkStoreStats s;
  s.capacity_bytes = capacity_;
  s.scan = scan_;
  {
    std::lock_guard lock(mu_);
    s.used_bytes = used_bytes_;
    s.free_bytes = used_bytes_ >= capacity_ ? 0 : capacity_ - used_bytes_;
    for (const auto& [dataset, manifests] : datasets_) {
      for (const auto& [id, m] : manifests) {
        bool any = false;
        for (const auto& [chunk, entry] : m.chunks) {
          if (entry->state != EntryState::kReady) continue;
          any = true;
          ++s.chunk_count;
          s.present_segments += entry->present_count;
        }
        if (any) ++s.manifest_count;
      }
    }
    s.chunks_created_total = chunks_created_;
    s.bytes_written_total = bytes_written_.load(std::memory_order_relaxed);
    s.chunks_dropped_total = chunks_dropped_;
    s.creates_refused_total = creates_refused_;
    s.creates_no_space_total = creates_no_space_;
  }
  struct statvfs vfs;
  if (::statvfs(root_.c_str(), &vfs) == 0) {
    s.filesystem_available_bytes = uint64_t{vfs.f_bavail} * uint64_t{vfs.f_frsize};
  }
  return s;
}

}  // namespace granary

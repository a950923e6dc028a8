#pragma once

// DiskChunkStore: the ChunkStore on local NVMe (chunk_store.h says what it
// does; docs/cachenode.md, "Chunk store", the policy). Private to
// cachenode/src: callers hold a ChunkStore from ChunkStore::Open.
//
// Its code, by job:
//  - disk_chunk_store.cc: Open, the in-memory index, creates, writers and
//    readers, queries and drops;
//  - chunk_store_scan.cc: Open's restart scan (walk, validate in parallel,
//    remove what failed, index the rest);
//  - chunk_store_layout.{h,cc}: the directory itself (marker, lock, names of
//    dataset, manifest and chunk entries, listing).
//
// Thread safety: as ChunkStore. Every field of the index is guarded by mu_,
// which is held only to look up or update it, never across file creation,
// reads, syncs or unlinks.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/cachenode/chunk_store.h"
#include "granary/core/chunk_file.h"
#include "granary/core/file.h"

namespace granary {

class DiskChunkStore final : public ChunkStore,
                             public std::enable_shared_from_this<DiskChunkStore> {
 public:
  // ChunkStore::Open's work; see there.
  static Result<std::shared_ptr<DiskChunkStore>> Open(const std::string& root,
                                                      uint64_t capacity_bytes,
                                                      const ChunkStoreOptions& options);
  ~DiskChunkStore() override;

  uint64_t ChunkBytes(std::span<const ChunkSegment> segments) const override;
  uint64_t ChunkBytes(uint32_t segment_count, uint64_t payload_size) const override;
  Result<StoredChunkWriter> CreateChunk(const ChunkKey& key,
                                        std::span<const ChunkSegment> segments) override;
  Result<StoredChunkWriter> OpenChunkWriter(const ChunkKey& key,
                                            std::span<const ChunkSegment> segments) override;
  Result<StoredChunkReader> OpenChunkReader(const ChunkKey& key,
                                            std::span<const ChunkSegment> segments) override;
  bool HasChunk(const ChunkKey& key) const override;
  Result<std::vector<bool>> PresentSegments(const ChunkKey& key) const override;
  Result<StoredChunk> Chunk(const ChunkKey& key) const override;
  std::vector<StoredManifest> Manifests() const override;
  Result<std::vector<StoredChunk>> Chunks(std::string_view dataset,
                                          const ContentId& manifest_id) const override;
  Status DropChunk(const ChunkKey& key) override;
  Status DropManifest(std::string_view dataset, const ContentId& manifest_id) override;
  Status DropDataset(std::string_view dataset) override;

  const std::string& root() const override { return root_; }
  uint64_t capacity() const override { return capacity_; }
  uint64_t block_size() const override { return block_size_; }
  uint64_t used_bytes() const override;
  uint64_t free_bytes() const override;
  const ChunkStoreScanReport& scan_report() const override { return scan_; }
  ChunkStoreStats Stats() const override;
  std::string ChunkPath(const ChunkKey& key) const override;

 private:
  class Writer;
  class Reader;

  enum class EntryState {
    kCreating,  // bytes reserved, file being created
    kReady,     // file exists and is in the index
    kDropping,  // being unlinked; still counted
    kDropped,   // out of the index; counted until its last handle closes
  };
  // One chunk. Every field is guarded by mu_.
  struct Entry {
    EntryState state = EntryState::kCreating;
    uint64_t bytes = 0;  // counted in used_bytes_ until released
    std::vector<bool> present;
    uint32_t present_count = 0;
    uint32_t open_handles = 0;  // writers and readers
    bool writer_open = false;
  };
  struct ManifestChunks {
    std::map<ChunkId, std::shared_ptr<Entry>> chunks;
    bool dropping = false;  // DropManifest or DropDataset in progress
  };
  struct ContentIdLess {
    bool operator()(const ContentId& a, const ContentId& b) const {
      return std::pair(a.high, a.low) < std::pair(b.high, b.low);
    }
  };
  using DatasetManifests = std::map<ContentId, ManifestChunks, ContentIdLess>;

  // Keeps one Entry open: counted in open_handles (and writer_open) until it is
  // destroyed, and keeps the store alive.
  class Handle {
   public:
    Handle() = default;
    Handle(std::shared_ptr<DiskChunkStore> store, std::shared_ptr<Entry> entry, bool writer)
        : store_(std::move(store)), entry_(std::move(entry)), writer_(writer) {}
    Handle(Handle&&) noexcept = default;
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { Reset(); }

    DiskChunkStore& store() const { return *store_; }
    const std::shared_ptr<Entry>& entry() const { return entry_; }

   private:
    void Reset();

    std::shared_ptr<DiskChunkStore> store_;
    std::shared_ptr<Entry> entry_;
    bool writer_ = false;
  };

  // An entry chosen for unlinking, with its key.
  struct DropItem {
    ChunkKey key;
    std::shared_ptr<Entry> entry;
    Status unlinked;
  };

  DiskChunkStore(std::string root, uint64_t capacity, const ChunkStoreOptions& options,
                 uint64_t block_size, ScopedFd lock_fd);

  // Open's restart scan (chunk_store_scan.cc).
  Status Scan();
  Status EnsureManifestDirectory(const ChunkKey& key) const;
  std::string ManifestDirectory(std::string_view dataset, const ContentId& manifest_id) const;

  // mu_ held.
  std::shared_ptr<Entry> FindLocked(const ChunkKey& key) const;
  void EraseLocked(const ChunkKey& key, const Entry* entry);
  void ReleaseBytesLocked(Entry& entry);
  Result<std::shared_ptr<Entry>> AcquireLocked(const ChunkKey& key, bool writer,
                                               std::string_view doing);

  void ReleaseHandle(Entry& entry, bool writer);
  Status CheckNotDropped(const Entry& entry, std::string_view doing, const ChunkKey& key) const;
  Status CheckOpenedFileIsTheEntrys(const Entry& entry, std::string_view doing) const;
  Status PublishPresence(Entry& entry, const ChunkWriter& writer);
  // Unlinks the files of `items` (all kDropping), then takes them out of the
  // index, or puts them back to kReady if their file could not be removed.
  Status UnlinkAndForget(std::vector<DropItem>& items, std::string_view doing);

  const std::string root_;
  const uint64_t capacity_;
  const ChunkStoreOptions options_;
  const uint64_t block_size_;
  const ScopedFd lock_fd_;     // flock'd for the store's life
  ChunkStoreScanReport scan_;  // written by Open's scan only, before the store is shared

  mutable std::mutex mu_;
  // Signalled when a create finishes (or fails) and when a drop finishes.
  std::condition_variable changed_;
  std::map<std::string, DatasetManifests, std::less<>> datasets_;  // guarded by mu_
  std::set<std::string, std::less<>> dropping_datasets_;           // guarded by mu_
  uint64_t used_bytes_ = 0;                                        // guarded by mu_
  uint64_t chunks_created_ = 0;                                    // guarded by mu_
  std::atomic<uint64_t> bytes_written_{0};                         // payload bytes put by writers
  uint64_t chunks_dropped_ = 0;                                    // guarded by mu_
  uint64_t creates_refused_ = 0;                                   // guarded by mu_
  uint64_t creates_no_space_ = 0;                                  // guarded by mu_
};

}  // namespace granary

#pragma once

#include <sys/types.h>

// ChunkStore: the chunk files one cache node keeps in its data directory on
// local NVMe, under a byte capacity that it never exceeds. docs/cachenode.md
// ("Chunk store") describes the layout on disk, the capacity policy, the
// restart scan and what each failure becomes.
//
//   <root>/GRANARY_CHUNK_STORE               marker: "this directory is a chunk store"
//   <root>/LOCK                              flock'd by the open store; holds its pid
//   <root>/<dataset>/<manifest id>/<chunk>.chunk   one chunk file (chunk_file.h)
//
// What it does: reserves a chunk's bytes against the capacity before creating
// its file (a chunk that does not fit is refused with kResourceExhausted and
// never written; a full file system is kResourceExhausted too and leaves no
// file behind), hands out writers and readers of chunk files (core's
// ChunkWriter/ChunkReader do the file format), keeps an in-memory index of
// which chunks exist and which of their segments are present, and rebuilds that
// index on Open by scanning and validating every file, deleting leftovers of
// interrupted creates and files that fail validation.
//
// What it does not do: decide what to stage when a dataset does not fit (the
// daemon asks ChunkBytes() and free_bytes() and chooses), or know manifests:
// callers pass each chunk's segment list (Manifest::Segments) and the store
// checks files against it when they are opened.
//
// Who calls it: the cache-node daemon (staging and on-demand fills write
// through StoredChunkWriter; serving reads through StoredChunkReader; dataset
// teardown and stale manifests go through DropManifest/DropDataset).
//
// Thread safety: every ChunkStore method may be called from any number of
// threads at once. The index is guarded by ChunkStore::mu_, which is held only
// to look up or update the index, never across file creation, reads, syncs or
// unlinks. A StoredChunkWriter is used by one thread at a time (like
// ChunkWriter); a StoredChunkReader's const methods may be used by many threads
// at once (like ChunkReader). At most one writer per chunk exists at a time.
//
// Lifetime: Open returns a shared_ptr, and every writer and reader holds a
// reference, so the store (and the lock on its directory) lives until the last
// of them is gone. A dropped chunk's bytes stay counted as used until the last
// writer or reader open on it is closed, because its blocks stay allocated
// until then.

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

#include "granary/cachenode/config.h"  // DataDirOwnershipProblem
#include "granary/core/chunk_file.h"
#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary {

struct ChunkStoreOptions {
  // How Open's scan checks each chunk file after validating its header:
  // kPresence trusts the presence bitmap; kVerifyPayload also reads every
  // present segment and drops (durably) those failing their checksum, so they
  // are re-staged. kVerifyPayload reads the whole store: minutes per terabyte.
  ChunkScanMode scan_mode = ChunkScanMode::kPresence;
  // Threads validating chunk files during Open's scan, 1 to kMaxScanThreads.
  uint32_t scan_threads = 4;
  // Reserve each chunk file's blocks when it is created (ChunkCreateOptions),
  // so a full disk is reported by CreateChunk rather than by a Put.
  bool preallocate = true;
};

// What Open's scan found and did.
struct ChunkStoreScanReport {
  uint64_t chunk_files = 0;               // valid chunk files now in the index
  uint64_t removed_temp_files = 0;        // *.tmp.* leftovers of interrupted creates
  uint64_t removed_invalid_files = 0;     // corrupt, truncated, other format version,
                                          // misplaced, or not named like a chunk file
  uint64_t dropped_corrupt_segments = 0;  // kVerifyPayload: segments marked absent
  uint64_t unknown_entries = 0;           // outside the layout: reported, left alone
};

struct ChunkStoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;   // chunks in the index + creates in flight + dropped chunks still open
  uint64_t free_bytes = 0;   // capacity - used, 0 when over capacity
  uint64_t chunk_count = 0;  // chunks in the index
  uint64_t manifest_count = 0;  // (dataset, manifest id) pairs with at least one chunk
  uint64_t present_segments = 0;
  uint64_t chunks_created_total = 0;
  uint64_t chunks_dropped_total = 0;
  uint64_t creates_refused_total = 0;   // refused: past capacity
  uint64_t creates_no_space_total = 0;  // failed: the file system was full (ENOSPC, EDQUOT)
  // What the file system holding the root says is left for unprivileged
  // writers (statvfs f_bavail); 0 if it cannot be read. May be less than
  // free_bytes when the disk is shared or smaller than the capacity.
  uint64_t filesystem_available_bytes = 0;
  ChunkStoreScanReport scan;  // from Open
};

// One chunk as the index knows it.
struct StoredChunk {
  ChunkId chunk = 0;
  uint32_t segment_count = 0;
  uint32_t present_count = 0;
  uint64_t bytes = 0;  // what it counts against the capacity

  bool complete() const { return present_count == segment_count; }
};

// One (dataset, manifest id) as the index knows it.
struct StoredManifest {
  std::string dataset;
  ContentId manifest_id;
  uint64_t chunk_count = 0;
  uint64_t complete_chunks = 0;
  uint64_t segment_count = 0;  // over its chunks in the store
  uint64_t present_segments = 0;
  uint64_t bytes = 0;
};

class StoredChunkWriter;
class StoredChunkReader;

// DataDirOwnershipProblem (why a directory must not be a data_dir) is in
// config.h, with the data_dir setting it checks.

class ChunkStore : public std::enable_shared_from_this<ChunkStore> {
 public:
  static constexpr uint32_t kMaxScanThreads = 64;
  static constexpr std::string_view kMarkerName = "GRANARY_CHUNK_STORE";
  static constexpr std::string_view kLockName = "LOCK";
  static constexpr std::string_view kChunkSuffix = ".chunk";

  // Opens the store in `root` with a capacity in bytes (> 0). `root` is
  // created (mode 0700) if it is missing and its parent exists. A directory
  // that is not yet a store must be empty (a file system's lost+found aside),
  // because the scan deletes files it does not recognise. Then: takes the
  // directory lock (kUnavailable, naming the holder's pid and host, if another
  // store has it open), scans and validates every chunk file, and rebuilds the
  // index. Over capacity after the scan (the capacity was lowered) is not an
  // error: every create is refused until drops bring usage under it.
  static Result<std::shared_ptr<ChunkStore>> Open(const std::string& root, uint64_t capacity_bytes,
                                                  const ChunkStoreOptions& options = {});

  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;
  ~ChunkStore();

  // What a chunk counts against the capacity: its file (header region +
  // payload, chunk_format.h) rounded up to the file system's block size, which
  // is what a preallocated file occupies. For deciding before creating; the
  // second form takes Manifest::Chunk's segment count and payload end.
  uint64_t ChunkBytes(std::span<const ChunkSegment> segments) const;
  uint64_t ChunkBytes(uint32_t segment_count, uint64_t payload_size) const;

  // Reserves ChunkBytes(segments) and creates the chunk's empty file with this
  // geometry, returning its writer. Errors: kInvalidArgument (bad dataset name
  // or geometry), kAlreadyExists (the chunk is in the store: OpenChunkWriter),
  // kResourceExhausted (past capacity: nothing was written; or the file system
  // is full: nothing is left behind), kUnavailable (the chunk, its manifest or
  // dataset is being dropped, or another thread is creating it: retry).
  Result<StoredChunkWriter> CreateChunk(const ChunkKey& key,
                                        std::span<const ChunkSegment> segments);

  // Reopens a chunk in the store to fill the rest (after a restart, on demand,
  // or to drop corrupt segments for re-staging). `segments` must be the ones
  // it was created with (kFailedPrecondition otherwise: drop it and create it
  // anew). kNotFound if it is not in the store; kUnavailable while another
  // writer of it is open.
  Result<StoredChunkWriter> OpenChunkWriter(const ChunkKey& key,
                                            std::span<const ChunkSegment> segments);

  // Opens a chunk in the store for reading; any number of readers at once, and
  // alongside its writer. Same errors as OpenChunkWriter (except that an open
  // writer is no obstacle); kCorruption if the file was damaged since the scan.
  Result<StoredChunkReader> OpenChunkReader(const ChunkKey& key,
                                            std::span<const ChunkSegment> segments);

  // Whether the chunk is in the store (its file exists, filled or not).
  // false for a malformed key.
  bool HasChunk(const ChunkKey& key) const;
  // Which of its segments are present (committed), in segment order.
  Result<std::vector<bool>> PresentSegments(const ChunkKey& key) const;
  Result<StoredChunk> Chunk(const ChunkKey& key) const;
  // Every (dataset, manifest id) with chunks in the store, sorted.
  std::vector<StoredManifest> Manifests() const;
  // The chunks of one manifest, by chunk id; kNotFound if it has none here.
  Result<std::vector<StoredChunk>> Chunks(std::string_view dataset,
                                          const ContentId& manifest_id) const;

  // Remove chunks and free their capacity (see "Lifetime" above for chunks
  // still open). A create of the same chunk in flight is waited for; creates
  // in a manifest or dataset being dropped are refused with kUnavailable
  // meanwhile. kNotFound if there is nothing to drop. A file that cannot be
  // removed stays in the index and the call fails naming it.
  Status DropChunk(const ChunkKey& key);
  // One manifest of a dataset, e.g. an old manifest id after a new snapshot.
  Status DropManifest(std::string_view dataset, const ContentId& manifest_id);
  // Every manifest of a dataset.
  Status DropDataset(std::string_view dataset);

  const std::string& root() const { return root_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t block_size() const { return block_size_; }
  uint64_t used_bytes() const;
  uint64_t free_bytes() const;
  const ChunkStoreScanReport& scan_report() const { return scan_; }
  ChunkStoreStats Stats() const;

  // Where the chunk's file is (whether or not it exists). For diagnostics and
  // tests; read and write through the store.
  std::string ChunkPath(const ChunkKey& key) const;

 private:
  friend class StoredChunkWriter;
  friend class StoredChunkReader;

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
    Handle(std::shared_ptr<ChunkStore> store, std::shared_ptr<Entry> entry, bool writer)
        : store_(std::move(store)), entry_(std::move(entry)), writer_(writer) {}
    Handle(Handle&&) noexcept = default;
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() { Reset(); }

    ChunkStore& store() const { return *store_; }
    const std::shared_ptr<Entry>& entry() const { return entry_; }

   private:
    void Reset();

    std::shared_ptr<ChunkStore> store_;
    std::shared_ptr<Entry> entry_;
    bool writer_ = false;
  };

  // An entry chosen for unlinking, with its key.
  struct DropItem {
    ChunkKey key;
    std::shared_ptr<Entry> entry;
    Status unlinked;
  };

  ChunkStore(std::string root, uint64_t capacity, const ChunkStoreOptions& options,
             uint64_t block_size, ScopedFd lock_fd);

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
  uint64_t chunks_dropped_ = 0;                                    // guarded by mu_
  uint64_t creates_refused_ = 0;                                   // guarded by mu_
  uint64_t creates_no_space_ = 0;                                  // guarded by mu_
};

// Fills one chunk of the store: a ChunkWriter whose commits update the store's
// index. Put bytes become present at the next Commit (chunk_file.h). Calls
// after the chunk was dropped fail with kFailedPrecondition; a moved-from
// writer must not be used.
class StoredChunkWriter {
 public:
  StoredChunkWriter(StoredChunkWriter&&) noexcept = default;
  // The file is closed before the store hears that the old writer is gone.
  StoredChunkWriter& operator=(StoredChunkWriter&& other) noexcept {
    if (this != &other) {
      writer_ = std::move(other.writer_);
      handle_ = std::move(other.handle_);
    }
    return *this;
  }
  StoredChunkWriter(const StoredChunkWriter&) = delete;
  StoredChunkWriter& operator=(const StoredChunkWriter&) = delete;
  ~StoredChunkWriter() = default;

  Status Put(uint32_t index, std::string_view bytes) { return writer_.Put(index, bytes); }
  Status Commit();
  // Makes a present segment absent (durably) so it can be put again, e.g.
  // after a reader found it corrupt.
  Status Drop(uint32_t index);

  bool IsPresent(uint32_t index) const { return writer_.IsPresent(index); }
  uint32_t present_count() const { return writer_.present_count(); }
  uint32_t segment_count() const { return writer_.segment_count(); }
  bool complete() const { return writer_.complete(); }
  const ChunkKey& key() const { return writer_.key(); }
  const std::string& path() const { return writer_.path(); }
  std::span<const ChunkSegment> segments() const { return writer_.segments(); }

 private:
  friend class ChunkStore;
  StoredChunkWriter(ChunkStore::Handle handle, ChunkWriter writer)
      : handle_(std::move(handle)), writer_(std::move(writer)) {}

  // Declared before writer_ so that the file (and its flock) is closed before
  // the store hears that the writer is gone.
  ChunkStore::Handle handle_;
  ChunkWriter writer_;
};

// Reads one chunk of the store: a ChunkReader that keeps the chunk's bytes
// counted while it is open.
class StoredChunkReader {
 public:
  StoredChunkReader(StoredChunkReader&&) noexcept = default;
  StoredChunkReader& operator=(StoredChunkReader&&) noexcept = default;
  StoredChunkReader(const StoredChunkReader&) = delete;
  StoredChunkReader& operator=(const StoredChunkReader&) = delete;
  ~StoredChunkReader() = default;

  const ChunkReader& operator*() const { return reader_; }
  const ChunkReader* operator->() const { return &reader_; }
  // Sees commits made since it was opened (ChunkReader::Refresh): not
  // concurrently with other calls on this reader.
  Status Refresh() { return reader_.Refresh(); }

 private:
  friend class ChunkStore;
  StoredChunkReader(ChunkStore::Handle handle, ChunkReader reader)
      : handle_(std::move(handle)), reader_(std::move(reader)) {}

  ChunkStore::Handle handle_;
  ChunkReader reader_;
};

}  // namespace granary

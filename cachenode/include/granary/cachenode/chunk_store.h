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
// threads at once. The on-disk store's index is guarded by one mutex
// (DiskChunkStore::mu_, cachenode/src/disk_chunk_store.h), held only to look
// up or update the index, never across file creation, reads, syncs or
// unlinks. A StoredChunkWriter is used by one thread at a time (like
// ChunkWriter); a StoredChunkReader's const methods may be used by many threads
// at once (like ChunkReader). At most one writer per chunk exists at a time.
//
// Code: this header is the interface (ChunkStore, and the writer and reader
// values it hands out); the on-disk store is cachenode/src: disk_chunk_store
// (the index, creates, opens, drops), chunk_store_layout (the directory: marker,
// lock, names) and chunk_store_scan.cc (Open's restart scan). Tests wrap it to
// inject faults (tests/testing/faulty_chunk_store.h).
//
// Lifetime: Open returns a shared_ptr, and every writer and reader holds a
// reference, so the store (and the lock on its directory) lives until the last
// of them is gone. A dropped chunk's bytes stay counted as used until the last
// writer or reader open on it is closed, because its blocks stay allocated
// until then.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/config/cachenode_config.h"  // DataDirOwnershipProblem
#include "granary/core/chunk_file.h"
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
  uint64_t bytes_written_total = 0;  // payload bytes put into chunk files (NVMe writes)
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

// DataDirOwnershipProblem (why a directory must not be a data_dir) is in
// config.h, with the data_dir setting it checks.

// Fills one chunk of a store: Put bytes become present at the next Commit
// (chunk_file.h), and each commit updates the store's index. Calls after the
// chunk was dropped fail with kFailedPrecondition; a moved-from writer must
// not be used. A value that owns what its store made (Backend); the file is
// closed before the store hears that the writer is gone.
class StoredChunkWriter {
 public:
  // What a ChunkStore implementation puts behind a writer: the on-disk
  // store's is core's ChunkWriter plus its index; a test's may fail chosen
  // writes (tests/testing/faulty_chunk_store.h).
  class Backend {
   public:
    virtual ~Backend() = default;
    virtual Status Put(uint32_t index, std::string_view bytes) = 0;
    virtual Status Commit() = 0;
    virtual Status Drop(uint32_t index) = 0;
    virtual bool IsPresent(uint32_t index) const = 0;
    virtual uint32_t present_count() const = 0;
    virtual uint32_t segment_count() const = 0;
    virtual const ChunkKey& key() const = 0;
    virtual const std::string& path() const = 0;
    virtual std::span<const ChunkSegment> segments() const = 0;
  };

  explicit StoredChunkWriter(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}
  StoredChunkWriter(StoredChunkWriter&&) noexcept = default;
  StoredChunkWriter& operator=(StoredChunkWriter&&) noexcept = default;
  StoredChunkWriter(const StoredChunkWriter&) = delete;
  StoredChunkWriter& operator=(const StoredChunkWriter&) = delete;
  ~StoredChunkWriter() = default;

  Status Put(uint32_t index, std::string_view bytes) { return backend_->Put(index, bytes); }
  Status Commit() { return backend_->Commit(); }
  // Makes a present segment absent (durably) so it can be put again, e.g.
  // after a reader found it corrupt.
  Status Drop(uint32_t index) { return backend_->Drop(index); }

  bool IsPresent(uint32_t index) const { return backend_->IsPresent(index); }
  uint32_t present_count() const { return backend_->present_count(); }
  uint32_t segment_count() const { return backend_->segment_count(); }
  bool complete() const { return present_count() == segment_count(); }
  const ChunkKey& key() const { return backend_->key(); }
  const std::string& path() const { return backend_->path(); }
  std::span<const ChunkSegment> segments() const { return backend_->segments(); }

 private:
  std::unique_ptr<Backend> backend_;
};

// Reads one chunk of a store, and keeps the chunk's bytes counted while it is
// open. `reader->Read(i)` and the rest read like core's ChunkReader (the
// const methods may be used by many threads at once).
class StoredChunkReader {
 public:
  // What a ChunkStore implementation puts behind a reader: the on-disk
  // store's is core's ChunkReader (chunk_file.h, which documents each
  // method); a test's may fail chosen reads.
  class Backend {
   public:
    virtual ~Backend() = default;
    virtual bool IsPresent(uint32_t index) const = 0;
    virtual uint32_t present_count() const = 0;
    virtual uint32_t segment_count() const = 0;
    virtual const std::string& path() const = 0;
    virtual const ChunkKey& key() const = 0;
    virtual std::span<const ChunkSegment> segments() const = 0;
    virtual Status Read(uint32_t index, std::span<char> out) const = 0;
    virtual Result<std::string> Read(uint32_t index) const = 0;
    virtual Result<uint64_t> PayloadOffset(uint32_t index) const = 0;
    virtual Status Verify(uint32_t index, std::string_view bytes) const = 0;
    virtual uint64_t checksum(uint32_t index) const = 0;
    // The open chunk file, e.g. for the chunk handoff (read-only).
    virtual int fd() const = 0;
    virtual Result<ChunkScan> Scan(ChunkScanMode mode) const = 0;
    virtual Status Refresh() = 0;
  };

  explicit StoredChunkReader(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}
  StoredChunkReader(StoredChunkReader&&) noexcept = default;
  StoredChunkReader& operator=(StoredChunkReader&&) noexcept = default;
  StoredChunkReader(const StoredChunkReader&) = delete;
  StoredChunkReader& operator=(const StoredChunkReader&) = delete;
  ~StoredChunkReader() = default;

  const Backend& operator*() const { return *backend_; }
  const Backend* operator->() const { return backend_.get(); }
  // Sees commits made since it was opened (ChunkReader::Refresh): not
  // concurrently with other calls on this reader.
  Status Refresh() { return backend_->Refresh(); }

 private:
  std::unique_ptr<Backend> backend_;
};

// The store's interface. Open gives the on-disk store (above, and
// docs/cachenode.md); tests wrap it to inject faults
// (tests/testing/faulty_chunk_store.h). Every method may be called from any
// number of threads at once.
class ChunkStore {
 public:
  static constexpr uint32_t kMaxScanThreads = 64;

  // Opens the on-disk store in `root` with a capacity in bytes (> 0). `root`
  // is created (mode 0700) if it is missing and its parent exists. A directory
  // that is not yet a store must be empty (a file system's lost+found aside),
  // because the scan deletes files it does not recognise. Then: takes the
  // directory lock (kUnavailable, naming the holder's pid and host, if another
  // store has it open), scans and validates every chunk file, and rebuilds the
  // index. Over capacity after the scan (the capacity was lowered) is not an
  // error: every create is refused until drops bring usage under it.
  static Result<std::shared_ptr<ChunkStore>> Open(const std::string& root, uint64_t capacity_bytes,
                                                  const ChunkStoreOptions& options = {});

  virtual ~ChunkStore() = default;

  // What a chunk counts against the capacity: its file (header region +
  // payload, chunk_format.h) rounded up to the file system's block size, which
  // is what a preallocated file occupies. For deciding before creating; the
  // second form takes Manifest::Chunk's segment count and payload end.
  virtual uint64_t ChunkBytes(std::span<const ChunkSegment> segments) const = 0;
  virtual uint64_t ChunkBytes(uint32_t segment_count, uint64_t payload_size) const = 0;

  // Reserves ChunkBytes(segments) and creates the chunk's empty file with this
  // geometry, returning its writer. Errors: kInvalidArgument (bad dataset name
  // or geometry), kAlreadyExists (the chunk is in the store: OpenChunkWriter),
  // kResourceExhausted (past capacity: nothing was written; or the file system
  // is full: nothing is left behind), kUnavailable (the chunk, its manifest or
  // dataset is being dropped, or another thread is creating it: retry).
  virtual Result<StoredChunkWriter> CreateChunk(const ChunkKey& key,
                                                std::span<const ChunkSegment> segments) = 0;

  // Reopens a chunk in the store to fill the rest (after a restart, on demand,
  // or to drop corrupt segments for re-staging). `segments` must be the ones
  // it was created with (kFailedPrecondition otherwise: drop it and create it
  // anew). kNotFound if it is not in the store; kUnavailable while another
  // writer of it is open.
  virtual Result<StoredChunkWriter> OpenChunkWriter(const ChunkKey& key,
                                                    std::span<const ChunkSegment> segments) = 0;

  // Opens a chunk in the store for reading; any number of readers at once, and
  // alongside its writer. Same errors as OpenChunkWriter (except that an open
  // writer is no obstacle); kCorruption if the file was damaged since the scan.
  virtual Result<StoredChunkReader> OpenChunkReader(const ChunkKey& key,
                                                    std::span<const ChunkSegment> segments) = 0;

  // Whether the chunk is in the store (its file exists, filled or not).
  // false for a malformed key.
  virtual bool HasChunk(const ChunkKey& key) const = 0;
  // Which of its segments are present (committed), in segment order.
  virtual Result<std::vector<bool>> PresentSegments(const ChunkKey& key) const = 0;
  virtual Result<StoredChunk> Chunk(const ChunkKey& key) const = 0;
  // Every (dataset, manifest id) with chunks in the store, sorted.
  virtual std::vector<StoredManifest> Manifests() const = 0;
  // The chunks of one manifest, by chunk id; kNotFound if it has none here.
  virtual Result<std::vector<StoredChunk>> Chunks(std::string_view dataset,
                                                  const ContentId& manifest_id) const = 0;

  // Remove chunks and free their capacity (see "Lifetime" above for chunks
  // still open). A create of the same chunk in flight is waited for; creates
  // in a manifest or dataset being dropped are refused with kUnavailable
  // meanwhile. kNotFound if there is nothing to drop. A file that cannot be
  // removed stays in the index and the call fails naming it.
  virtual Status DropChunk(const ChunkKey& key) = 0;
  // One manifest of a dataset, e.g. an old manifest id after a new snapshot.
  virtual Status DropManifest(std::string_view dataset, const ContentId& manifest_id) = 0;
  // Every manifest of a dataset.
  virtual Status DropDataset(std::string_view dataset) = 0;

  // Where the store is (its data directory), for messages and diagnostics.
  virtual const std::string& root() const = 0;
  virtual uint64_t capacity() const = 0;
  virtual uint64_t block_size() const = 0;
  virtual uint64_t used_bytes() const = 0;
  virtual uint64_t free_bytes() const = 0;
  virtual const ChunkStoreScanReport& scan_report() const = 0;
  virtual ChunkStoreStats Stats() const = 0;

  // Where the chunk's file is (whether or not it exists). For diagnostics and
  // tests; read and write through the store.
  virtual std::string ChunkPath(const ChunkKey& key) const = 0;

 protected:
  ChunkStore() = default;
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;
};

}  // namespace granary

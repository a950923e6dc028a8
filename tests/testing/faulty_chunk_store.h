#pragma once

// FaultyChunkStore: a ChunkStore (cachenode/include/granary/cachenode/
// chunk_store.h) that passes every call to a real one and fails chosen
// operations on chosen chunks the way a failing disk does, so that tests can
// produce what a real disk cannot on demand: a full file system (ENOSPC) in
// the middle of staging, without a tmpfs, and an I/O error (EIO) on a read.
//
//  - FailWrites(which, err): Put and Commit of a writer of a chosen chunk fail
//    with Status::FromErrno(err, "write <chunk file>") (ENOSPC:
//    kResourceExhausted), as core's ChunkWriter reports a failed pwrite or
//    fdatasync. Nothing reaches the real chunk file. CreateChunk and
//    OpenChunkWriter still succeed: a chunk file that exists (or is not
//    preallocated) meets the full disk when it is written.
//  - FailReads(which, err): Read and Scan through a reader of a chosen chunk
//    fail with Status::FromErrno(err, "read <chunk file>") (EIO: kIoError),
//    as core's ChunkReader reports a failed pread. Opening the reader, its
//    presence bits and its descriptor are the real file's.
//
// A fault applies to writers and readers opened before it was set too (they
// ask the store on each call). ClearFaults() heals the disk.
//
// Thread safety: every method may be called from any thread at once, as
// ChunkStore's; writers and readers keep the contracts of chunk_store.h.

#include <atomic>
#include <cerrno>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/cachenode/chunk_store.h"

namespace granary::testing {

class FaultyChunkStore final : public ChunkStore,
                               public std::enable_shared_from_this<FaultyChunkStore> {
 public:
  // Which chunks a fault applies to.
  using ChunkFilter = std::function<bool(const ChunkKey& key)>;
  // The chunks with these ids (any dataset and manifest).
  static ChunkFilter ChunkIds(std::set<ChunkId> ids);
  // Every chunk.
  static ChunkFilter AllChunks();

  // Wraps `inner` (e.g. from ChunkStore::Open), sharing its ownership.
  explicit FaultyChunkStore(std::shared_ptr<ChunkStore> inner) : inner_(std::move(inner)) {}

  void FailWrites(ChunkFilter which, int err = ENOSPC);
  void FailReads(ChunkFilter which, int err = EIO);
  void ClearFaults();

  // Calls failed by a fault so far.
  uint64_t write_faults() const { return write_faults_.load(std::memory_order_relaxed); }
  uint64_t read_faults() const { return read_faults_.load(std::memory_order_relaxed); }

  // The fault for an operation on `key` (0: none), counted when not 0.
  int WriteFault(const ChunkKey& key);
  int ReadFault(const ChunkKey& key);

  uint64_t ChunkBytes(std::span<const ChunkSegment> segments) const override {
    return inner_->ChunkBytes(segments);
  }
  uint64_t ChunkBytes(uint32_t segment_count, uint64_t payload_size) const override {
    return inner_->ChunkBytes(segment_count, payload_size);
  }
  Result<StoredChunkWriter> CreateChunk(const ChunkKey& key,
                                        std::span<const ChunkSegment> segments) override;
  Result<StoredChunkWriter> OpenChunkWriter(const ChunkKey& key,
                                            std::span<const ChunkSegment> segments) override;
  Result<StoredChunkReader> OpenChunkReader(const ChunkKey& key,
                                            std::span<const ChunkSegment> segments) override;
  bool HasChunk(const ChunkKey& key) const override { return inner_->HasChunk(key); }
  Result<std::vector<bool>> PresentSegments(const ChunkKey& key) const override {
    return inner_->PresentSegments(key);
  }
  Result<StoredChunk> Chunk(const ChunkKey& key) const override { return inner_->Chunk(key); }
  std::vector<StoredManifest> Manifests() const override { return inner_->Manifests(); }
  Result<std::vector<StoredChunk>> Chunks(std::string_view dataset,
                                          const ContentId& manifest_id) const override {
    return inner_->Chunks(dataset, manifest_id);
  }
  Status DropChunk(const ChunkKey& key) override { return inner_->DropChunk(key); }
  Status DropManifest(std::string_view dataset, const ContentId& manifest_id) override {
    return inner_->DropManifest(dataset, manifest_id);
  }
  Status DropDataset(std::string_view dataset) override { return inner_->DropDataset(dataset); }
  const std::string& root() const override { return inner_->root(); }
  uint64_t capacity() const override { return inner_->capacity(); }
  uint64_t block_size() const override { return inner_->block_size(); }
  uint64_t used_bytes() const override { return inner_->used_bytes(); }
  uint64_t free_bytes() const override { return inner_->free_bytes(); }
  const ChunkStoreScanReport& scan_report() const override { return inner_->scan_report(); }
  ChunkStoreStats Stats() const override { return inner_->Stats(); }
  std::string ChunkPath(const ChunkKey& key) const override { return inner_->ChunkPath(key); }

 private:
  const std::shared_ptr<ChunkStore> inner_;
  mutable std::mutex mu_;
  ChunkFilter fail_writes_;  // guarded by mu_
  int write_errno_ = 0;      // guarded by mu_
  ChunkFilter fail_reads_;   // guarded by mu_
  int read_errno_ = 0;       // guarded by mu_
  std::atomic<uint64_t> write_faults_{0};
  std::atomic<uint64_t> read_faults_{0};
};

}  // namespace granary::testing

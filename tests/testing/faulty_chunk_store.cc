#include "testing/faulty_chunk_store.h"

#include <utility>

namespace granary::testing {
namespace {

// A writer of the real store whose Put and Commit may fail first.
class FaultyWriter final : public StoredChunkWriter::Backend {
 public:
  FaultyWriter(std::shared_ptr<FaultyChunkStore> store, StoredChunkWriter inner)
      : store_(std::move(store)), inner_(std::move(inner)) {}

  Status Put(uint32_t index, std::string_view bytes) override {
    if (int err = store_->WriteFault(key()); err != 0) return Status::FromErrno(err, Doing());
    return inner_.Put(index, bytes);
  }
  Status Commit() override {
    if (int err = store_->WriteFault(key()); err != 0) return Status::FromErrno(err, Doing());
    return inner_.Commit();
  }
  Status Drop(uint32_t index) override { return inner_.Drop(index); }
  bool IsPresent(uint32_t index) const override { return inner_.IsPresent(index); }
  uint32_t present_count() const override { return inner_.present_count(); }
  uint32_t segment_count() const override { return inner_.segment_count(); }
  const ChunkKey& key() const override { return inner_.key(); }
  const std::string& path() const override { return inner_.path(); }
  std::span<const ChunkSegment> segments() const override { return inner_.segments(); }

 private:
  // What core's ChunkWriter says of a failed pwrite (PwriteFull).
  std::string Doing() const { return "write " + inner_.path(); }

  std::shared_ptr<FaultyChunkStore> store_;
  StoredChunkWriter inner_;
};

// A reader of the real store whose reads of segment bytes may fail.
class FaultyReader final : public StoredChunkReader::Backend {
 public:
  FaultyReader(std::shared_ptr<FaultyChunkStore> store, StoredChunkReader inner)
      : store_(std::move(store)), inner_(std::move(inner)) {}

  bool IsPresent(uint32_t index) const override { return inner_->IsPresent(index); }
  uint32_t present_count() const override { return inner_->present_count(); }
  uint32_t segment_count() const override { return inner_->segment_count(); }
  const std::string& path() const override { return inner_->path(); }
  const ChunkKey& key() const override { return inner_->key(); }
  std::span<const ChunkSegment> segments() const override { return inner_->segments(); }
  Status Read(uint32_t index, std::span<char> out) const override {
    if (int err = store_->ReadFault(key()); err != 0) return Status::FromErrno(err, Doing());
    return inner_->Read(index, out);
  }
  Result<std::string> Read(uint32_t index) const override {
    if (int err = store_->ReadFault(key()); err != 0) return Status::FromErrno(err, Doing());
    return inner_->Read(index);
  }
  Result<uint64_t> PayloadOffset(uint32_t index) const override {
    return inner_->PayloadOffset(index);
  }
  Status Verify(uint32_t index, std::string_view bytes) const override {
    return inner_->Verify(index, bytes);
  }
  uint64_t checksum(uint32_t index) const override { return inner_->checksum(index); }
  int fd() const override { return inner_->fd(); }
  Result<ChunkScan> Scan(ChunkScanMode mode) const override {
    if (int err = store_->ReadFault(key()); err != 0) return Status::FromErrno(err, Doing());
    return inner_->Scan(mode);
  }
  Status Refresh() override { return inner_.Refresh(); }

 private:
  // What core's ChunkReader says of a failed pread (PreadFull).
  std::string Doing() const { return "read " + inner_->path(); }

  std::shared_ptr<FaultyChunkStore> store_;
  StoredChunkReader inner_;
};

}  // namespace

FaultyChunkStore::ChunkFilter FaultyChunkStore::ChunkIds(std::set<ChunkId> ids) {
  return [ids = std::move(ids)](const ChunkKey& key) { return ids.contains(key.chunk); };
}

FaultyChunkStore::ChunkFilter FaultyChunkStore::AllChunks() {
  return [](const ChunkKey&) { return true; };
}

void FaultyChunkStore::FailWrites(ChunkFilter which, int err) {
  std::lock_guard lock(mu_);
  fail_writes_ = std::move(which);
  write_errno_ = err;
}

void FaultyChunkStore::FailReads(ChunkFilter which, int err) {
  std::lock_guard lock(mu_);
  fail_reads_ = std::move(which);
  read_errno_ = err;
}

void FaultyChunkStore::ClearFaults() {
  std::lock_guard lock(mu_);
  fail_writes_ = nullptr;
  fail_reads_ = nullptr;
}

int FaultyChunkStore::WriteFault(const ChunkKey& key) {
  std::lock_guard lock(mu_);
  if (!fail_writes_ || !fail_writes_(key)) return 0;
  write_faults_.fetch_add(1, std::memory_order_relaxed);
  return write_errno_;
}

int FaultyChunkStore::ReadFault(const ChunkKey& key) {
  std::lock_guard lock(mu_);
  if (!fail_reads_ || !fail_reads_(key)) return 0;
  read_faults_.fetch_add(1, std::memory_order_relaxed);
  return read_errno_;
}

Result<StoredChunkWriter> FaultyChunkStore::CreateChunk(const ChunkKey& key,
                                                        std::span<const ChunkSegment> segments) {
  GRANARY_ASSIGN_OR_RETURN(StoredChunkWriter inner, inner_->CreateChunk(key, segments));
  return StoredChunkWriter(std::make_unique<FaultyWriter>(shared_from_this(), std::move(inner)));
}

Result<StoredChunkWriter> FaultyChunkStore::OpenChunkWriter(
    const ChunkKey& key, std::span<const ChunkSegment> segments) {
  GRANARY_ASSIGN_OR_RETURN(StoredChunkWriter inner, inner_->OpenChunkWriter(key, segments));
  return StoredChunkWriter(std::make_unique<FaultyWriter>(shared_from_this(), std::move(inner)));
}

Result<StoredChunkReader> FaultyChunkStore::OpenChunkReader(
    const ChunkKey& key, std::span<const ChunkSegment> segments) {
  GRANARY_ASSIGN_OR_RETURN(StoredChunkReader inner, inner_->OpenChunkReader(key, segments));
  return StoredChunkReader(std::make_unique<FaultyReader>(shared_from_this(), std::move(inner)));
}

}  // namespace granary::testing

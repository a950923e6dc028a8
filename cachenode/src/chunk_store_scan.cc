// Opening the on-disk chunk store (disk_chunk_store.h): its directory is
// prepared, locked and marked (chunk_store_layout.h), then the restart scan
// walks the layout, validates every chunk file in parallel, removes what
// failed and rebuilds the index from the rest. docs/cachenode.md ("Chunk
// store", "Restart") describes what each finding becomes.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <optional>
#include <system_error>
#include <thread>

#include "chunk_store_layout.h"
#include "disk_chunk_store.h"
#include "granary/core/names.h"
#include "granary/core/thread_name.h"

namespace granary {

using chunk_store_layout::BlockSizeOf;
using chunk_store_layout::CheckAdoptable;
using chunk_store_layout::DescribeChunk;
using chunk_store_layout::DirEntry;
using chunk_store_layout::EntryType;
using chunk_store_layout::kLockName;
using chunk_store_layout::kLostAndFound;
using chunk_store_layout::kMarkerName;
using chunk_store_layout::kTempInfix;
using chunk_store_layout::ListDirectory;
using chunk_store_layout::LockRoot;
using chunk_store_layout::Log;
using chunk_store_layout::ParseChunkFileName;
using chunk_store_layout::ParseManifestDirName;
using chunk_store_layout::PrepareRoot;
using chunk_store_layout::WithHint;
using chunk_store_layout::WriteOrCheckMarker;

namespace {

// Warnings about individual files the scan removes or skips; the rest are
// only counted (a damaged store must not flood the log).
constexpr uint64_t kMaxScanWarnings = 20;

// A chunk file found by the scan, and what its path says it holds.
struct Candidate {
  std::string path;
  ChunkKey key;
};

// What validating one candidate found: keep it, remove it (`problem`: it is
// provably not a sound chunk file of its place), skip it (it vanished), or
// stop (`error`: it could not be checked, so it is neither kept nor deleted).
struct CheckedFile {
  enum class Verdict { kKeep, kRemove, kVanished, kError };
  Verdict verdict = Verdict::kError;
  std::string problem;
  Status error;
  uint32_t segment_count = 0;
  uint64_t payload_size = 0;
  std::vector<bool> present;
  uint32_t present_count = 0;
  uint32_t dropped_corrupt = 0;
};

// Damage (kCorruption), another format version, or a sound file of another
// chunk is grounds for deleting a file; an I/O error, a permission problem or
// running out of descriptors is not: it says nothing about the file.
CheckedFile Reject(const Status& s) {
  CheckedFile out;
  if (s.code() == StatusCode::kCorruption || s.code() == StatusCode::kVersionMismatch ||
      s.code() == StatusCode::kFailedPrecondition) {
    out.verdict = CheckedFile::Verdict::kRemove;
    out.problem = s.ToString();
  } else if (s.code() == StatusCode::kNotFound) {
    out.verdict = CheckedFile::Verdict::kVanished;
  } else {
    out.verdict = CheckedFile::Verdict::kError;
    out.error = s;
  }
  return out;
}

CheckedFile CheckChunkFile(const Candidate& c, ChunkScanMode mode) {
  auto header = ChunkReader::ReadHeader(c.path);
  if (!header.ok()) return Reject(header.status());
  if (!(header->key == c.key)) {
    return Reject(Status::FailedPrecondition(
        fmt::format("it holds {}, not the chunk its path names", DescribeChunk(header->key))));
  }
  auto reader = ChunkReader::Open(c.path, header->key, header->segments);
  if (!reader.ok()) return Reject(reader.status());
  CheckedFile out;
  out.segment_count = reader->segment_count();
  out.payload_size = header->payload_size;
  if (mode == ChunkScanMode::kVerifyPayload) {
    auto scan = reader->Scan(ChunkScanMode::kVerifyPayload);  // errors are I/O only
    if (!scan.ok()) return Reject(scan.status());
    if (!scan->corrupt.empty()) {
      // Marked absent on disk, so the next scan agrees and they get re-staged.
      auto writer = ChunkWriter::Open(c.path, c.key, header->segments);
      if (!writer.ok()) return Reject(writer.status());
      for (uint32_t index : scan->corrupt) {
        if (Status s = writer->Drop(index); !s.ok()) return Reject(s);
      }
      out.dropped_corrupt = static_cast<uint32_t>(scan->corrupt.size());
    }
    out.present = std::move(scan->valid);
    out.present_count = scan->valid_count;
  } else {
    out.present.resize(out.segment_count);
    for (uint32_t i = 0; i < out.segment_count; ++i) out.present[i] = reader->IsPresent(i);
    out.present_count = reader->present_count();
  }
  out.verdict = CheckedFile::Verdict::kKeep;
  return out;
}

}  // namespace

Result<std::shared_ptr<DiskChunkStore>> DiskChunkStore::Open(const std::string& root_arg,
                                                             uint64_t capacity_bytes,
                                                             const ChunkStoreOptions& options) {
  std::string root = root_arg;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root.empty()) {
    return Status::InvalidArgument(
        "open chunk store: the data directory is empty; set it to a directory on local NVMe");
  }
  if (capacity_bytes == 0) {
    return Status::InvalidArgument(fmt::format(
        "open chunk store {}: capacity is 0 bytes; set it to the bytes this node may use there",
        root));
  }
  if (options.scan_threads == 0 || options.scan_threads > kMaxScanThreads) {
    return Status::InvalidArgument(
        fmt::format("open chunk store {}: scan_threads is {}; it must be 1 to {}", root,
                    options.scan_threads, kMaxScanThreads));
  }
  GRANARY_RETURN_IF_ERROR(PrepareRoot(root));
  GRANARY_RETURN_IF_ERROR(CheckAdoptable(root));
  GRANARY_ASSIGN_OR_RETURN(ScopedFd lock_fd, LockRoot(root));
  GRANARY_RETURN_IF_ERROR(WriteOrCheckMarker(root));
  uint64_t block_size = BlockSizeOf(root);
  std::shared_ptr<DiskChunkStore> store(
      new DiskChunkStore(root, capacity_bytes, options, block_size, std::move(lock_fd)));
  GRANARY_RETURN_IF_ERROR(store->Scan());
  const ChunkStoreScanReport& r = store->scan_;
  Log()->info(
      "chunk store {}: {} chunk files, {} of {} bytes used; removed {} temporary and {} invalid "
      "files, dropped {} corrupt segments, {} unknown entries left alone",
      root, r.chunk_files, store->used_bytes_, capacity_bytes, r.removed_temp_files,
      r.removed_invalid_files, r.dropped_corrupt_segments, r.unknown_entries);
  if (store->used_bytes_ > capacity_bytes) {
    Log()->warn(
        "chunk store {}: {} bytes used, over its capacity of {} bytes; nothing is created until "
        "chunks are dropped",
        root, store->used_bytes_, capacity_bytes);
  }
  return store;
}

Result<std::shared_ptr<ChunkStore>> ChunkStore::Open(const std::string& root,
                                                     uint64_t capacity_bytes,
                                                     const ChunkStoreOptions& options) {
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<DiskChunkStore> store,
                           DiskChunkStore::Open(root, capacity_bytes, options));
  return std::shared_ptr<ChunkStore>(std::move(store));
}

Status DiskChunkStore::Scan() {
  const std::string doing = "scan chunk store " + root_;
  uint64_t warnings = 0;
  auto warn = [&](const std::string& message) {
    if (++warnings <= kMaxScanWarnings) Log()->warn("{}: {}", doing, message);
  };
  auto remove_file = [&](const std::string& path, std::string_view why) -> Status {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return WithHint(Status::FromErrno(errno, fmt::format("{}: remove {} ({})", doing, path, why)),
                      "remove it by hand");
    }
    return Status::Ok();
  };

  // 1. Walk the layout: remove temporaries and files not named like chunks,
  //    collect the chunk files. Nothing outside the leaf directories is removed.
  std::vector<Candidate> candidates;
  GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> top, ListDirectory(root_));
  for (const DirEntry& d : top) {
    const std::string dataset_dir = root_ + "/" + d.name;
    if (d.name == kMarkerName || d.name == kLockName || d.name == kLostAndFound) continue;
    if (d.type != EntryType::kDirectory &&
        d.name.starts_with(fmt::format("{}{}", kMarkerName, kTempInfix))) {
      GRANARY_RETURN_IF_ERROR(remove_file(dataset_dir, "temporary file"));
      ++scan_.removed_temp_files;
      continue;
    }
    if (d.type != EntryType::kDirectory || !IsDnsLabel(d.name)) {
      ++scan_.unknown_entries;
      warn(fmt::format("left alone {}, which is not a dataset directory", Quoted(d.name)));
      continue;
    }
    GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> manifests, ListDirectory(dataset_dir));
    size_t dataset_entries_left = manifests.size();
    for (const DirEntry& m : manifests) {
      const std::string manifest_dir = dataset_dir + "/" + m.name;
      std::optional<ContentId> manifest_id = ParseManifestDirName(m.name);
      if (m.type != EntryType::kDirectory || !manifest_id) {
        ++scan_.unknown_entries;
        warn(fmt::format("left alone {}/{}, which is not a manifest directory", d.name,
                         Quoted(m.name)));
        continue;
      }
      GRANARY_ASSIGN_OR_RETURN(std::vector<DirEntry> files, ListDirectory(manifest_dir));
      size_t manifest_entries_left = files.size();
      for (const DirEntry& f : files) {
        const std::string path = manifest_dir + "/" + f.name;
        if (f.type == EntryType::kDirectory) {
          ++scan_.unknown_entries;
          warn(fmt::format("left alone directory {}/{}/{}", d.name, m.name, Quoted(f.name)));
          continue;
        }
        if (f.name.find(kTempInfix) != std::string::npos) {
          GRANARY_RETURN_IF_ERROR(remove_file(path, "temporary file of an interrupted create"));
          ++scan_.removed_temp_files;
          --manifest_entries_left;
          continue;
        }
        std::optional<ChunkId> chunk = ParseChunkFileName(f.name);
        if (!chunk || f.type != EntryType::kRegular) {
          std::string why = !chunk ? "not named like a chunk file" : "not a regular file";
          GRANARY_RETURN_IF_ERROR(remove_file(path, why));
          ++scan_.removed_invalid_files;
          --manifest_entries_left;
          warn(fmt::format("removed {}/{}/{}: {}", d.name, m.name, Quoted(f.name), why));
          continue;
        }
        candidates.push_back({path, ChunkKey{d.name, *manifest_id, *chunk}});
      }
      if (manifest_entries_left == 0 && ::rmdir(manifest_dir.c_str()) == 0) {
        --dataset_entries_left;
      }
    }
    if (dataset_entries_left == 0) ::rmdir(dataset_dir.c_str());  // tidiness only
  }

  // 2. Validate the chunk files, in parallel: each is opened and its header
  //    region read (and with kVerifyPayload, its whole payload).
  std::vector<CheckedFile> checked(candidates.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < candidates.size(); i = next++) {
      checked[i] = CheckChunkFile(candidates[i], options_.scan_mode);
    }
  };
  std::vector<std::thread> threads;
  size_t extra = std::min<size_t>(options_.scan_threads, candidates.size());
  for (size_t t = 1; t < extra; ++t) {
    try {
      threads.emplace_back([&work] {
        NameThisThread("scan");
        work();
      });
    } catch (const std::system_error& e) {  // no more threads: the ones we have finish the job
      Log()->warn("{}: started {} scan threads of {}: {}", doing, t, extra, e.what());
      break;
    }
  }
  work();
  for (std::thread& t : threads) t.join();

  // 3. Remove what failed, then index the rest. No other thread sees the store
  //    yet, but the index is mu_'s all the same.
  for (size_t i = 0; i < candidates.size(); ++i) {
    const CheckedFile& c = checked[i];
    if (c.verdict == CheckedFile::Verdict::kError) {
      return WithHint(
          c.error.WithContext(fmt::format("{}: validate {}", doing, candidates[i].path)),
          "fix the cause and restart; the file is left as it was");
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (checked[i].verdict != CheckedFile::Verdict::kRemove) continue;
    GRANARY_RETURN_IF_ERROR(remove_file(candidates[i].path, checked[i].problem));
    ++scan_.removed_invalid_files;
    warn(fmt::format("removed {}: {}", candidates[i].path, checked[i].problem));
  }
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < candidates.size(); ++i) {
    CheckedFile& c = checked[i];
    if (c.verdict != CheckedFile::Verdict::kKeep) continue;
    auto entry = std::make_shared<Entry>();
    entry->state = EntryState::kReady;
    entry->bytes = ChunkBytes(c.segment_count, c.payload_size);
    entry->present = std::move(c.present);
    entry->present_count = c.present_count;
    const ChunkKey& key = candidates[i].key;
    datasets_[key.dataset][key.manifest_id].chunks[key.chunk] = entry;
    used_bytes_ += entry->bytes;
    ++scan_.chunk_files;
    scan_.dropped_corrupt_segments += c.dropped_corrupt;
    if (c.dropped_corrupt > 0) {
      warn(fmt::format("{}: {} corrupt segments marked absent for re-staging", candidates[i].path,
                       c.dropped_corrupt));
    }
  }
  if (warnings > kMaxScanWarnings) {
    Log()->warn("{}: {} more warnings not shown", doing, warnings - kMaxScanWarnings);
  }
  return Status::Ok();
}

}  // namespace granary

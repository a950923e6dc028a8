#include "staging_bench.h"

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/file.h"

namespace granary::cachenode_bench {
namespace {

namespace fs = std::filesystem;

// Staging that makes no progress for this long has failed.
constexpr auto kStagingStall = std::chrono::seconds(120);

// Stages every chunk into `store` with a new Stager and waits for it to finish.
Result<RateFigures> Stage(const std::shared_ptr<const Manifest>& manifest,
                          const std::shared_ptr<Source>& source,
                          const std::shared_ptr<ChunkStore>& store, uint32_t threads,
                          uint64_t segment_count, std::shared_ptr<Stager>* stager_out) {
  std::vector<ChunkId> owned(manifest->chunk_count());
  for (size_t c = 0; c < owned.size(); ++c) owned[c] = static_cast<ChunkId>(c);
  StagerOptions options;
  options.dataset = kDataset;
  options.threads = threads;
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<Stager> created,
                           Stager::Create(manifest, source, store, owned, options));
  std::shared_ptr<Stager> stager = std::move(created);
  const SourceCounters before = source->Counters();
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  GRANARY_RETURN_IF_ERROR(stager->Start());
  uint64_t last_bytes = 0;
  auto last_change = t0;
  StagerProgress p;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    p = stager->Progress();
    if (p.state == StagingState::kComplete) break;
    if (p.state == StagingState::kCapacity || p.state == StagingState::kDiskFull ||
        p.state == StagingState::kStopped || p.chunks_failed > 0 || p.samples_failed_total() > 0) {
      return Status::Internal("staging stopped in state " + std::string(StagingStateName(p.state)) +
                              " with " + std::to_string(p.chunks_failed) + " failed chunks and " +
                              std::to_string(p.samples_failed_total()) +
                              " failed samples: " + p.last_error.ToString());
    }
    if (Interrupted()) return InterruptedStatus();
    const auto now = Clock::now();
    if (p.bytes_staged != last_bytes) {
      last_bytes = p.bytes_staged;
      last_change = now;
    } else if (now - last_change > kStagingStall) {
      return Status::DeadlineExceeded("staging made no progress for " +
                                      std::to_string(kStagingStall.count()) + " s at " +
                                      std::to_string(p.bytes_staged) + " bytes");
    }
  }
  RateFigures r;
  r.seconds = Seconds(Clock::now() - t0);
  r.cpu_seconds = CpuSeconds() - cpu0;
  r.bytes = manifest->total_bytes();
  r.files = manifest->sample_count();
  if (p.chunks_complete != manifest->chunk_count() || p.bytes_staged != r.bytes) {
    return Status::Internal("staging said complete with " + std::to_string(p.chunks_complete) +
                            " of " + std::to_string(manifest->chunk_count()) + " chunks and " +
                            std::to_string(p.bytes_staged) + " of " + std::to_string(r.bytes) +
                            " bytes");
  }
  // Each piece of each sample opened once, nothing read twice.
  GRANARY_RETURN_IF_ERROR(
      CheckSourceCounters(before, source->Counters(), segment_count, r.bytes, "staging"));
  *stager_out = std::move(stager);
  return r;
}

// The store disk's own write bandwidth, written the way staging writes: a
// file per chunk, preallocated, filled with one pwrite per segment, then
// fdatasync; `threads` workers. Not a figure of Granary's: it tells whether
// staging is bound by the disk it writes to. The files are removed.
Result<RateFigures> WriteReference(const std::string& dir, const PieceTable& table,
                                   uint32_t threads, uint64_t sample_size) {
  std::error_code ec;
  fs::create_directory(dir, ec);
  if (ec) return Status::IoError("creating " + dir + ": " + ec.message());
  std::string content(std::min<uint64_t>(sample_size, kDefaultChunkSize), '\0');
  FillContent(~0ull, content);
  std::atomic<uint64_t> written{0};
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  Status done = ParallelFor(threads, table.segments.size(), [&](uint64_t c) -> Status {
    const std::string path = dir + "/" + std::to_string(c);
    GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    const std::vector<ChunkSegment>& segments = table.segments[c];
    const uint64_t payload =
        segments.empty() ? 0 : uint64_t{segments.back().chunk_offset} + segments.back().length;
    if (payload > 0) {
      if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(payload)); err != 0) {
        return Status::FromErrno(err, "posix_fallocate of " + path);
      }
    }
    for (const ChunkSegment& s : segments) {
      for (uint64_t off = 0; off < s.length; off += content.size()) {
        const uint64_t n = std::min<uint64_t>(content.size(), s.length - off);
        GRANARY_RETURN_IF_ERROR(
            PwriteFull(fd.get(), content.data(), n, s.chunk_offset + off, path));
      }
    }
    GRANARY_RETURN_IF_ERROR(SyncData(fd.get(), path));
    written.fetch_add(payload, std::memory_order_relaxed);
    return Status::Ok();
  });
  RateFigures r;
  r.seconds = Seconds(Clock::now() - t0);
  r.cpu_seconds = CpuSeconds() - cpu0;
  r.bytes = written.load();
  fs::remove_all(dir, ec);
  GRANARY_RETURN_IF_ERROR(done);
  if (ec) return Status::IoError("removing " + dir + ": " + ec.message());
  return r;
}

}  // namespace

Result<StagingFigures> RunStagingBench(const BenchSetup& setup, const Flags& f,
                                       std::shared_ptr<Stager>* stager_out) {
  const std::string& source_root = setup.source_root;
  const std::shared_ptr<const Manifest>& manifest = setup.manifest;
  const std::shared_ptr<Source>& source = setup.source;
  const std::shared_ptr<ChunkStore>& store = setup.store;
  const PieceTable& table = setup.table;
  StagingFigures r;
  std::shared_ptr<Stager> stager;
  GRANARY_ASSIGN_OR_RETURN(double cached, SourceResidency(source_root, f, /*drop=*/true));
  GRANARY_ASSIGN_OR_RETURN(r.cold,
                           Stage(manifest, source, store, f.threads, table.pieces.size(), &stager));
  r.cold.resident_before = cached;
  stager.reset();
  GRANARY_RETURN_IF_ERROR(store->DropDataset(kDataset));
  GRANARY_ASSIGN_OR_RETURN(cached, SourceResidency(source_root, f, /*drop=*/false));
  GRANARY_ASSIGN_OR_RETURN(r.warm,
                           Stage(manifest, source, store, f.threads, table.pieces.size(), &stager));
  r.warm.resident_before = cached;
  GRANARY_ASSIGN_OR_RETURN(r.disk_write,
                           WriteReference(setup.Join("write-reference"), table, f.threads, f.size));
  r.disk_write.files = manifest->sample_count();
  Progress("  staging: cold " + Fixed(r.cold.mb_s(), 0) + " MB/s, warm " + Fixed(r.warm.mb_s(), 0) +
           " MB/s; the store's disk writes " + Fixed(r.disk_write.mb_s(), 0) + " MB/s");
  *stager_out = std::move(stager);
  return r;
}

}  // namespace granary::cachenode_bench

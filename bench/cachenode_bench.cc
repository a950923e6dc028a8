// The cache node's figures for issue 3's closing note, measured side by side
// in one run on one machine (docs/benchmarks.md, "Cache node"):
//  (a) staging: a Stager copying a generated dataset from a PosixSource into a
//      ChunkStore, against the source's own read bandwidth measured the same
//      way (PosixSource::Read of every sample on --threads workers), with the
//      source's page cache dropped before both (cold) and with it warm;
//  (b) serving: ChunkReadService behind Server on 127.0.0.1, --clients
//      PeerClient threads each doing READs of --batch random samples for
//      --seconds, against reading the same samples from the same chunk files in
//      this process (StoredChunkReader::Read, checksums verified) on as many
//      threads with the same random sequences.
//
// Checks (any failure fails the run, exit status 1): every sample read from
// the source matches the checksum of the bytes generated for it; staging
// opens each source file once and completes every chunk; before the timed
// serving run every sample is read over the wire once and compared byte for
// byte with the generated content; every timed READ item must be OK, of the
// sample's size, with the source's checksum (and PeerClient verifies the bytes
// against it); the server's payload count must equal what the clients got.
// The work directory is removed at the end, also on errors and on
// SIGINT/SIGTERM (a second signal kills at once); every thread is joined.
//
//   build/release/bench/cachenode_bench [--dir DIR] [--files 20000] [--size 110KiB]
//       [--threads 16] [--clients 4] [--batch 16] [--seconds 10] [--json FILE]

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/identity.h"
#include "granary/core/log.h"
#include "granary/core/manifest_builder.h"
#include "granary/core/peer_client.h"
#include "granary/core/posix_source.h"
#include "granary/core/protocol_format.h"
#include "granary/core/tls.h"

namespace granary {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

constexpr char kDataset[] = "bench";
constexpr uint32_t kFilesPerDirectory = 1000;
constexpr uint32_t kGenerateThreads = 2;
constexpr int kWarmupBatches = 2;
// Staging that makes no progress for this long has failed.
constexpr auto kStagingStall = std::chrono::seconds(120);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Gb(uint64_t bytes) { return static_cast<double>(bytes) / 1e9; }
double PerSecond(uint64_t n, double seconds) {
  return seconds > 0 ? static_cast<double>(n) / seconds : 0;
}

// ---- interruption: SIGINT/SIGTERM end the run through its normal cleanup ----

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnSignal(int) { g_interrupted.store(true, std::memory_order_relaxed); }

void InstallSignalHandlers() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = static_cast<int>(SA_RESTART | SA_RESETHAND);  // a second signal kills at once
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

bool Interrupted() { return g_interrupted.load(std::memory_order_relaxed); }
Status InterruptedStatus() {
  return Status::Unavailable("interrupted by a signal; stopped and cleaned up");
}

// CPU seconds (user + system) of every thread of this process so far.
double CpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

// The first error of several threads.
class FirstError {
 public:
  void Set(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.load(std::memory_order_relaxed)) status_ = std::move(status);
    failed_.store(true, std::memory_order_release);
  }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  Status Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  std::atomic<bool> failed_{false};
  Status status_;  // guarded by mu_
};

// Runs fn(i) for every i in [0, n) on `threads` threads, handing out indices
// in order. Stops at the first error (returned) or on an interrupt.
Status ParallelFor(uint32_t threads, uint64_t n, const std::function<Status(uint64_t)>& fn) {
  std::atomic<uint64_t> next{0};
  FirstError error;
  {
    std::vector<std::jthread> workers;
    for (uint32_t t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        while (!error.failed() && !Interrupted()) {
          const uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
          if (i >= n) return;
          if (Status s = fn(i); !s.ok()) error.Set(std::move(s));
        }
      });
    }
  }
  if (error.failed()) return error.Take();
  if (Interrupted()) return InterruptedStatus();
  return Status::Ok();
}

// ---- the dataset ----

// File `index`'s content: a splitmix64 stream seeded by the index, so any
// byte can be generated again to check what was served.
void FillContent(uint64_t index, std::span<char> out) {
  uint64_t state = index * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    const uint64_t v = next();
    std::memcpy(out.data() + i, &v, 8);
  }
  if (i < out.size()) {
    const uint64_t v = next();
    std::memcpy(out.data() + i, &v, out.size() - i);
  }
}

// Names sort in index order, so sample id == file index in the manifest.
std::string RelativePath(uint64_t index) {
  char name[64];
  std::snprintf(name, sizeof(name), "d%05llu/f%09llu.bin",
                static_cast<unsigned long long>(index / kFilesPerDirectory),
                static_cast<unsigned long long>(index));
  return name;
}

// The work directory: created empty, removed (with everything in it) when
// this object is destroyed, unless kept. Declared before everything that
// writes into it, so it is removed last.
class WorkDir {
 public:
  static Result<std::unique_ptr<WorkDir>> Create(const std::string& requested, bool keep) {
    std::string path = requested;
    if (path.empty()) {
      std::string pattern = "/tmp/granary-cachenode-bench.XXXXXX";
      if (::mkdtemp(pattern.data()) == nullptr) {
        return Status::FromErrno(errno, "creating a work directory under /tmp");
      }
      path = pattern;
    } else {
      std::error_code ec;
      if (fs::exists(path, ec)) {
        if (!fs::is_directory(path, ec) || !fs::is_empty(path, ec)) {
          return Status::InvalidArgument(
              "--dir " + path +
              ": it must be an empty directory or not exist, because the benchmark removes "
              "what is in it at the end; name a new directory");
        }
      } else if (!fs::create_directory(path, ec) || ec) {
        return Status::InvalidArgument("--dir " + path + ": cannot create it: " + ec.message() +
                                       "; its parent must exist and be writable");
      }
    }
    std::error_code ec;
    const fs::path real = fs::canonical(path, ec);  // a symlink: remove what it points to
    if (ec) return Status::IoError("--dir " + path + ": " + ec.message());
    return std::unique_ptr<WorkDir>(new WorkDir(real.string(), keep));
  }
  ~WorkDir() {
    if (keep_) {
      std::printf("kept the work directory %s\n", path_.c_str());
      return;
    }
    std::error_code ec;
    fs::remove_all(path_, ec);
    if (ec) std::fprintf(stderr, "could not remove %s: %s\n", path_.c_str(), ec.message().c_str());
  }
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  WorkDir(std::string path, bool keep) : path_(std::move(path)), keep_(keep) {}
  const std::string path_;
  const bool keep_;
};

struct Flags {
  std::string dir;
  bool keep = false;
  uint64_t files = 20'000;
  uint64_t size = 110 << 10;
  uint32_t threads = 16;
  uint32_t clients = 4;
  uint32_t batch = 16;
  double seconds = 10;
  uint32_t io_threads = 2;
  uint32_t service_threads = 4;
  uint32_t repeat = 1;
  uint64_t seed = 1;
  std::string json;
  bool tls = false;
};

// What CLI11's ranges cannot say: sizes that fit the protocol and the disk.
Status CheckFlags(const Flags& f) {
  if (f.size == 0 || f.size > (1ull << 30)) {
    return Status::InvalidArgument("--size " + std::to_string(f.size) +
                                   ": give 1 byte to 1 GiB per file, e.g. 110KiB");
  }
  if (f.size * f.batch > protocol_format::kDefaultMaxReadBytes) {
    return Status::InvalidArgument(
        "--size " + std::to_string(f.size) + " x --batch " + std::to_string(f.batch) +
        ": one READ would ask for more than the protocol's " +
        std::to_string(protocol_format::kDefaultMaxReadBytes) + " bytes; lower --batch or --size");
  }
  return Status::Ok();
}

// Needs room for the source and the store (one copy of the dataset each).
Status CheckFreeSpace(const std::string& dir, uint64_t dataset_bytes, uint64_t files) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return Status::FromErrno(errno, "statvfs of " + dir);
  const uint64_t available = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  // The source, the store and the write reference, file system blocks,
  // chunk headers, and a margin.
  const uint64_t need = 3 * dataset_bytes + files * 8192 + (512ull << 20);
  if (available < need) {
    return Status::ResourceExhausted("the work directory " + dir + " has " +
                                     std::to_string(available >> 20) +
                                     " MiB free and the run "
                                     "needs about " +
                                     std::to_string(need >> 20) +
                                     " MiB (the dataset three times); lower --files or --size, or "
                                     "point --dir elsewhere");
  }
  return Status::Ok();
}

Status GenerateDataset(const std::string& root, const Flags& f, std::vector<uint64_t>* checksums) {
  checksums->assign(f.files, 0);
  const uint64_t dirs = (f.files + kFilesPerDirectory - 1) / kFilesPerDirectory;
  for (uint64_t d = 0; d < dirs; ++d) {
    const std::string dir = root + "/" + RelativePath(d * kFilesPerDirectory);
    std::error_code ec;
    fs::create_directories(fs::path(dir).parent_path(), ec);
    if (ec) return Status::IoError("creating " + dir + ": " + ec.message());
  }
  Status done = ParallelFor(kGenerateThreads, f.files, [&](uint64_t i) -> Status {
    std::string bytes(f.size, '\0');
    FillContent(i, bytes);
    (*checksums)[i] = Checksum64(bytes);
    const std::string path = root + "/" + RelativePath(i);
    GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    return PwriteFull(fd.get(), bytes.data(), bytes.size(), 0, path);
  });
  GRANARY_RETURN_IF_ERROR(done);
  // One syncfs instead of a sync per file: the pages must be clean for the
  // page-cache drops below to take effect.
  GRANARY_ASSIGN_OR_RETURN(ScopedFd root_fd, OpenFile(root, O_RDONLY | O_DIRECTORY));
  if (::syncfs(root_fd.get()) != 0) return Status::FromErrno(errno, "syncfs of " + root);
  return Status::Ok();
}

// The fraction of the source files' pages in the page cache (mincore),
// after dropping them first if `drop` (posix_fadvise DONTNEED; the pages are
// clean, GenerateDataset synced them).
Result<double> SourceResidency(const std::string& root, const Flags& f, bool drop) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages_per_file = (f.size + page - 1) / page;
  std::atomic<uint64_t> resident{0};
  Status done = ParallelFor(kGenerateThreads, f.files, [&](uint64_t i) -> Status {
    const std::string path = root + "/" + RelativePath(i);
    GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_RDONLY));
    if (drop) {
      if (int err = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED); err != 0) {
        return Status::FromErrno(err, "posix_fadvise(DONTNEED) of " + path);
      }
    }
    void* map = ::mmap(nullptr, f.size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap of " + path);
    std::vector<unsigned char> present(pages_per_file);
    const int rc = ::mincore(map, f.size, present.data());
    const int err = errno;
    ::munmap(map, f.size);
    if (rc != 0) return Status::FromErrno(err, "mincore of " + path);
    uint64_t n = 0;
    for (unsigned char p : present) n += p & 1u;
    resident.fetch_add(n, std::memory_order_relaxed);
    return Status::Ok();
  });
  GRANARY_RETURN_IF_ERROR(done);
  return static_cast<double>(resident.load()) / static_cast<double>(pages_per_file * f.files);
}

// Where each piece of each sample is: (chunk, segment index).
struct Piece {
  ChunkId chunk = 0;
  uint32_t index = 0;
};
struct PieceTable {
  std::vector<std::vector<ChunkSegment>> segments;  // by chunk
  std::vector<uint64_t> first;                      // by sample, into pieces; size samples + 1
  std::vector<Piece> pieces;
};

Result<PieceTable> BuildPieceTable(const Manifest& manifest) {
  PieceTable t;
  std::vector<std::vector<Piece>> by_sample(manifest.sample_count());
  for (ChunkId c = 0; c < manifest.chunk_count(); ++c) {
    GRANARY_ASSIGN_OR_RETURN(std::vector<ChunkSegment> segments, manifest.Segments(c));
    for (uint32_t i = 0; i < segments.size(); ++i) {
      by_sample.at(segments[i].sample).push_back(Piece{c, i});
    }
    t.segments.push_back(std::move(segments));
  }
  t.first.push_back(0);
  for (auto& pieces : by_sample) {
    t.pieces.insert(t.pieces.end(), pieces.begin(), pieces.end());
    t.first.push_back(t.pieces.size());
  }
  return t;
}

// ---- (a) source reads and staging ----

struct RateFigures {
  double seconds = 0;
  double cpu_seconds = 0;
  uint64_t bytes = 0;
  uint64_t files = 0;
  double resident_before = -1;  // fraction of the source in the page cache before; -1: not known
  double mb_s() const { return PerSecond(bytes, seconds) / 1e6; }
  double files_s() const { return PerSecond(files, seconds); }
};

Json ToJson(const RateFigures& r) {
  Json j;
  j["seconds"] = r.seconds;
  j["mb_s"] = r.mb_s();
  j["files_s"] = r.files_s();
  j["bytes"] = r.bytes;
  j["files"] = r.files;
  j["cpu_seconds"] = r.cpu_seconds;
  if (r.resident_before >= 0) j["source_resident_before"] = r.resident_before;
  return j;
}

Status CheckSourceCounters(const SourceCounters& before, const SourceCounters& after,
                           uint64_t opens, uint64_t bytes, std::string_view what) {
  const uint64_t got_opens = after.opens - before.opens;
  const uint64_t got_bytes = after.bytes - before.bytes;
  const uint64_t errors = after.errors_total() - before.errors_total();
  if (got_opens != opens || got_bytes != bytes || errors != 0) {
    return Status::Internal(
        std::string(what) + ": the source counted " + std::to_string(got_opens) + " opens, " +
        std::to_string(got_bytes) + " bytes and " + std::to_string(errors) + " errors; expected " +
        std::to_string(opens) + " opens, " + std::to_string(bytes) + " bytes and no error");
  }
  return Status::Ok();
}

// Reads every sample once with `threads` workers, as staging does (one
// PosixSource::Read per sample into a fresh buffer, which is then hashed as
// ChunkWriter::Put hashes it), and checks it against the generated bytes.
Result<RateFigures> ReadSource(PosixSource& source, const Manifest& manifest,
                               const std::vector<uint64_t>& checksums, uint32_t threads) {
  const SourceCounters before = source.Counters();
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  Status done = ParallelFor(threads, manifest.sample_count(), [&](uint64_t i) -> Status {
    const auto id = static_cast<SampleId>(i);
    GRANARY_ASSIGN_OR_RETURN(SourceFile file, SourceFileOf(manifest, id));
    std::string bytes(file.size, '\0');
    GRANARY_RETURN_IF_ERROR(source.Read(file, 0, bytes));
    if (Checksum64(bytes) != checksums[id]) {
      return Status::Corruption("reading sample " + std::to_string(id) + " (" + file.path +
                                ") from the source: its bytes are not the ones generated");
    }
    return Status::Ok();
  });
  GRANARY_RETURN_IF_ERROR(done);
  RateFigures r;
  r.seconds = Seconds(Clock::now() - t0);
  r.cpu_seconds = CpuSeconds() - cpu0;
  r.bytes = manifest.total_bytes();
  r.files = manifest.sample_count();
  GRANARY_RETURN_IF_ERROR(
      CheckSourceCounters(before, source.Counters(), r.files, r.bytes, "reading the source"));
  return r;
}

// Stages every chunk into `store` with a new Stager and waits for it to finish.
Result<RateFigures> Stage(const std::shared_ptr<const Manifest>& manifest,
                          const std::shared_ptr<PosixSource>& source,
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

// ---- (b) serving and local reads ----

struct LoadFigures {
  uint32_t workers = 0;
  double seconds = 0;
  double cpu_seconds = 0;
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double gb_s() const { return PerSecond(bytes, seconds) / 1e9; }
  // GB per CPU-second of this process (server and clients, or the local
  // readers): what other load on the machine does not change much.
  double gb_per_cpu_s() const { return PerSecond(bytes, cpu_seconds) / 1e9; }
};

Json ToJson(const LoadFigures& r, std::string_view batch_name) {
  Json j;
  j["threads"] = r.workers;
  j["seconds"] = r.seconds;
  j["gb_s"] = r.gb_s();
  j[std::string(batch_name) + "_per_s"] = PerSecond(r.batches, r.seconds);
  j["samples_per_s"] = PerSecond(r.samples, r.seconds);
  j["bytes"] = r.bytes;
  j[std::string(batch_name)] = r.batches;
  j["samples"] = r.samples;
  j["latency_p50_ms"] = r.p50_ms;
  j["latency_p99_ms"] = r.p99_ms;
  j["cpu_seconds"] = r.cpu_seconds;
  j["gb_per_cpu_second"] = r.gb_per_cpu_s();
  return j;
}

// Reads one batch of samples; adds the bytes it got to *bytes.
using BatchFn = std::function<Status(std::span<const SampleId> ids, uint64_t* bytes)>;

// Runs fns.size() threads, each calling its fn on batches of `batch` sample
// ids drawn uniformly from [0, samples) by a generator seeded with seed + its
// index (so two runs with the same seed read the same sequences), for
// `seconds` after kWarmupBatches untimed batches each. `on_start` (if any)
// runs once every warm-up is done, just before the timed part starts.
Result<LoadFigures> TimedRun(std::vector<BatchFn>& fns, uint32_t batch, uint64_t samples,
                             double seconds, uint64_t seed,
                             const std::function<void()>& on_start = {}) {
  const size_t n = fns.size();
  FirstError error;
  std::atomic<size_t> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point start;
  Clock::time_point end;
  std::vector<std::vector<double>> latencies(n);
  std::vector<uint64_t> batches(n, 0);
  std::vector<uint64_t> bytes(n, 0);
  std::vector<Clock::time_point> last_done(n);
  double cpu0 = 0;
  {
    std::vector<std::jthread> threads;
    for (size_t w = 0; w < n; ++w) {
      threads.emplace_back([&, w](std::stop_token stop) {
        std::mt19937_64 rng(seed * 1000003 + w);
        std::uniform_int_distribution<uint64_t> pick(0, samples - 1);
        std::vector<SampleId> ids(batch);
        auto draw = [&] {
          for (SampleId& id : ids) id = static_cast<SampleId>(pick(rng));
        };
        uint64_t ignored = 0;
        for (int i = 0; i < kWarmupBatches; ++i) {
          draw();
          if (Status s = fns[w](ids, &ignored); !s.ok()) {
            error.Set(std::move(s));
            break;
          }
        }
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
          if (error.failed() || Interrupted() || stop.stop_requested()) return;
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        latencies[w].reserve(1 << 16);
        // Not stop_requested: the jthreads' destructors request a stop
        // before joining, and the timed part must run to its end.
        while (!error.failed() && !Interrupted()) {
          if (Clock::now() >= end) break;
          draw();
          const auto t0 = Clock::now();
          if (Status s = fns[w](ids, &bytes[w]); !s.ok()) {
            error.Set(std::move(s));
            return;
          }
          const auto t1 = Clock::now();
          latencies[w].push_back(Seconds(t1 - t0) * 1e3);
          ++batches[w];
          last_done[w] = t1;
        }
      });
    }
    while (ready.load() < n && !error.failed() && !Interrupted()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (on_start) on_start();
    cpu0 = CpuSeconds();
    start = Clock::now();
    end =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    for (auto& t : last_done) t = start;
    go.store(true, std::memory_order_release);
  }  // joins
  if (error.failed()) return error.Take();
  if (Interrupted()) return InterruptedStatus();
  LoadFigures r;
  r.workers = static_cast<uint32_t>(n);
  r.cpu_seconds = CpuSeconds() - cpu0;
  std::vector<double> all;
  for (size_t w = 0; w < n; ++w) {
    r.seconds = std::max(r.seconds, Seconds(last_done[w] - start));
    r.batches += batches[w];
    r.bytes += bytes[w];
    all.insert(all.end(), latencies[w].begin(), latencies[w].end());
  }
  r.samples = r.batches * batch;
  if (all.empty())
    return Status::Internal("no batch completed in " + std::to_string(seconds) + " s");
  std::sort(all.begin(), all.end());
  r.p50_ms = all[all.size() / 2];
  r.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

ReadRequest RequestFor(const Manifest& manifest, std::span<const SampleId> ids) {
  ReadRequest r;
  r.dataset = kDataset;
  r.manifest_id = manifest.id();
  r.items.reserve(ids.size());
  for (SampleId id : ids) {
    r.items.push_back(
        ReadItem{ReadKind::kSample, id, 0, static_cast<uint32_t>(manifest.SizeOf(id))});
  }
  return r;
}

// One READ over the wire, every item checked: OK, the sample's size, the
// source's checksum (PeerClient has checked the bytes against it). With
// `compare`, the bytes are also compared with freshly generated content.
Status ReadOverWire(PeerClient& client, const Manifest& manifest,
                    const std::vector<uint64_t>& checksums, std::span<const SampleId> ids,
                    bool compare, uint64_t* bytes) {
  Result<PeerReadResult> result = client.Read(RequestFor(manifest, ids));
  if (!result.ok()) {
    return result.status().WithContext("a READ of " + std::to_string(ids.size()) +
                                       " samples over loopback");
  }
  if (result->size() != ids.size()) {
    return Status::Internal("a READ of " + std::to_string(ids.size()) + " samples got " +
                            std::to_string(result->size()) + " items back");
  }
  std::string expected;
  for (size_t i = 0; i < ids.size(); ++i) {
    const SampleId id = ids[i];
    const std::string what = "sample " + std::to_string(id) + " (" + manifest.PathOf(id) + ")";
    if (!result->status(i).ok()) return result->status(i).WithContext("serving " + what);
    const std::string_view got = result->bytes(i);
    const std::optional<uint64_t>& checksum = result->reply().items[i].checksum;
    if (got.size() != manifest.SizeOf(id) || !checksum.has_value() || *checksum != checksums[id]) {
      return Status::Corruption("serving " + what + ": got " + std::to_string(got.size()) +
                                " bytes with checksum " +
                                (checksum.has_value() ? std::to_string(*checksum) : "none") +
                                "; the source has " + std::to_string(manifest.SizeOf(id)) +
                                " bytes with checksum " + std::to_string(checksums[id]));
    }
    if (compare) {
      expected.resize(got.size());
      FillContent(id, expected);
      if (got != expected) {
        return Status::Corruption("serving " + what + ": the bytes differ from the source's");
      }
    }
    *bytes += got.size();
  }
  return Status::Ok();
}

Result<std::vector<PeerClient>> ConnectClients(uint16_t port, uint32_t n,
                                               std::shared_ptr<const TlsContext> tls) {
  std::vector<PeerClient> clients;
  for (uint32_t c = 0; c < n; ++c) {
    PeerClientOptions options;
    options.client_name = "cachenode-bench/" + std::to_string(c);
    options.tls = tls;
    GRANARY_ASSIGN_OR_RETURN(PeerClient client,
                             PeerClient::Connect("127.0.0.1:" + std::to_string(port), options));
    clients.push_back(std::move(client));
  }
  return clients;
}

// Every sample once over the wire, compared byte for byte (untimed).
Result<uint64_t> VerifyEverySample(std::vector<PeerClient>& clients, const Manifest& manifest,
                                   const std::vector<uint64_t>& checksums, uint32_t batch) {
  const uint64_t samples = manifest.sample_count();
  const uint64_t batches = (samples + batch - 1) / batch;
  FirstError error;
  std::vector<uint64_t> bytes(clients.size(), 0);
  {
    std::vector<std::jthread> threads;
    for (size_t c = 0; c < clients.size(); ++c) {
      threads.emplace_back([&, c] {
        std::vector<SampleId> ids;
        for (uint64_t b = c; b < batches && !error.failed() && !Interrupted();
             b += clients.size()) {
          ids.clear();
          for (uint64_t id = b * batch; id < std::min(samples, (b + 1) * batch); ++id) {
            ids.push_back(static_cast<SampleId>(id));
          }
          if (Status s = ReadOverWire(clients[c], manifest, checksums, ids, true, &bytes[c]);
              !s.ok()) {
            error.Set(std::move(s));
          }
        }
      });
    }
  }
  if (error.failed()) return error.Take();
  if (Interrupted()) return InterruptedStatus();
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  if (total != manifest.total_bytes()) {
    return Status::Internal("the verification pass read " + std::to_string(total) + " of " +
                            std::to_string(manifest.total_bytes()) + " bytes");
  }
  return total;
}

Status ReadLocally(const StoredChunkReader& reader, const Piece& piece, uint64_t* got) {
  GRANARY_ASSIGN_OR_RETURN(std::string bytes, reader->Read(piece.index));
  *got += bytes.size();
  return Status::Ok();
}

Status CheckLocalSize(const Manifest& manifest, SampleId id, uint64_t got) {
  if (got == manifest.SizeOf(id)) return Status::Ok();
  return Status::Internal("reading sample " + std::to_string(id) + " from the chunk files got " +
                          std::to_string(got) + " of its " + std::to_string(manifest.SizeOf(id)) +
                          " bytes");
}

// ---- the run ----

void PrintRate(const std::string& what, const RateFigures& r) {
  char cached[32] = "";
  if (r.resident_before >= 0) {
    std::snprintf(cached, sizeof(cached), "%.1f%%", 100 * r.resident_before);
  }
  std::printf("  %-36s %8.2f %9.0f %9.0f %7.2f %8s\n", what.c_str(), r.seconds, r.mb_s(),
              r.files_s(), r.cpu_seconds, cached);
}

void PrintLoad(const std::string& what, const LoadFigures& r) {
  std::printf("  %-36s %8.2f %6.2f %9.0f %9.0f %7.2f %7.2f %7.2f %8.2f\n", what.c_str(), r.seconds,
              r.gb_s(), PerSecond(r.batches, r.seconds), PerSecond(r.samples, r.seconds), r.p50_ms,
              r.p99_ms, r.cpu_seconds, r.gb_per_cpu_s());
}

void Progress(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string Fixed(double value, int decimals) {
  char out[64];
  std::snprintf(out, sizeof(out), "%.*f", decimals, value);
  return out;
}

// The better of two timed runs (by throughput).
void KeepBest(const LoadFigures& run, std::optional<LoadFigures>* best) {
  if (!best->has_value() || run.gb_s() > (*best)->gb_s()) *best = run;
}

Status Run(const Flags& f) {
  GRANARY_RETURN_IF_ERROR(CheckFlags(f));
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<WorkDir> work, WorkDir::Create(f.dir, f.keep));
  const uint64_t dataset_bytes = f.files * f.size;
  GRANARY_RETURN_IF_ERROR(CheckFreeSpace(work->path(), dataset_bytes, f.files));
  const std::string source_root = work->Join("source");

  Progress("cachenode_bench: " + std::to_string(f.files) + " files x " + std::to_string(f.size) +
           " bytes = " + Fixed(Gb(dataset_bytes), 2) + " GB in " + work->path() + " (" +
           std::to_string(std::thread::hardware_concurrency()) + " CPUs)");
  std::vector<uint64_t> checksums;
  auto t0 = Clock::now();
  GRANARY_RETURN_IF_ERROR(GenerateDataset(source_root, f, &checksums));
  const double generate_s = Seconds(Clock::now() - t0);
  ManifestBuildOptions build;
  build.source_root = source_root;
  build.threads = 4;
  GRANARY_ASSIGN_OR_RETURN(Manifest built, BuildManifest(build));
  auto manifest = std::make_shared<const Manifest>(std::move(built));
  if (manifest->sample_count() != f.files || manifest->total_bytes() != dataset_bytes) {
    return Status::Internal("the manifest has " + std::to_string(manifest->sample_count()) +
                            " samples and " + std::to_string(manifest->total_bytes()) +
                            " bytes; the benchmark wrote " + std::to_string(f.files) + " files");
  }
  for (SampleId id = 0; id < manifest->sample_count(); ++id) {
    if (manifest->PathOf(id) != RelativePath(id)) {
      return Status::Internal("sample " + std::to_string(id) + " is " + manifest->PathOf(id) +
                              ", expected " + RelativePath(id));
    }
  }
  GRANARY_ASSIGN_OR_RETURN(PieceTable table, BuildPieceTable(*manifest));
  Progress("  generated and synced in " + Fixed(generate_s, 1) + " s; " +
           std::to_string(manifest->chunk_count()) + " chunks of up to " +
           std::to_string(manifest->chunk_size() >> 20) + " MiB");

  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<IdentityExecutor> executor,
                           IdentityExecutor::Start({.threads = f.threads}));
  PosixSourceOptions source_options;
  source_options.root = source_root;
  source_options.owner = ProcessIdentity();
  source_options.executor = executor.get();
  source_options.max_in_flight = f.threads;
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<PosixSource> opened,
                           PosixSource::Open(std::move(source_options)));
  std::shared_ptr<PosixSource> source = std::move(opened);

  // (a) The source cold, then warm; staging cold, then warm (into an emptied
  // store); the store disk's write bandwidth for reference.
  GRANARY_ASSIGN_OR_RETURN(double cached, SourceResidency(source_root, f, /*drop=*/true));
  GRANARY_ASSIGN_OR_RETURN(RateFigures source_cold,
                           ReadSource(*source, *manifest, checksums, f.threads));
  source_cold.resident_before = cached;
  GRANARY_ASSIGN_OR_RETURN(cached, SourceResidency(source_root, f, /*drop=*/false));
  GRANARY_ASSIGN_OR_RETURN(RateFigures source_warm,
                           ReadSource(*source, *manifest, checksums, f.threads));
  source_warm.resident_before = cached;
  Progress("  source read: cold " + Fixed(source_cold.mb_s(), 0) + " MB/s, warm " +
           Fixed(source_warm.mb_s(), 0) + " MB/s");

  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<ChunkStore> store,
                           ChunkStore::Open(work->Join("store"), 2 * dataset_bytes + (1ull << 30)));
  std::shared_ptr<Stager> stager;
  GRANARY_ASSIGN_OR_RETURN(cached, SourceResidency(source_root, f, /*drop=*/true));
  GRANARY_ASSIGN_OR_RETURN(RateFigures staging_cold,
                           Stage(manifest, source, store, f.threads, table.pieces.size(), &stager));
  staging_cold.resident_before = cached;
  stager.reset();
  GRANARY_RETURN_IF_ERROR(store->DropDataset(kDataset));
  GRANARY_ASSIGN_OR_RETURN(cached, SourceResidency(source_root, f, /*drop=*/false));
  GRANARY_ASSIGN_OR_RETURN(RateFigures staging_warm,
                           Stage(manifest, source, store, f.threads, table.pieces.size(), &stager));
  staging_warm.resident_before = cached;
  GRANARY_ASSIGN_OR_RETURN(RateFigures disk_write,
                           WriteReference(work->Join("write-reference"), table, f.threads, f.size));
  disk_write.files = manifest->sample_count();
  Progress("  staging: cold " + Fixed(staging_cold.mb_s(), 0) + " MB/s, warm " +
           Fixed(staging_warm.mb_s(), 0) + " MB/s; the store's disk writes " +
           Fixed(disk_write.mb_s(), 0) + " MB/s");

  // (b) Serving the store over loopback, and the same reads locally.
  ChunkReadServiceOptions service_options;
  service_options.node_name = "cachenode-bench";
  auto service = std::make_shared<ChunkReadService>(store, service_options);
  GRANARY_RETURN_IF_ERROR(service->Add(manifest, stager));
  ServerOptions server_options;
  server_options.node_name = "cachenode-bench";
  server_options.io_threads = f.io_threads;
  server_options.service_threads = f.service_threads;
  std::shared_ptr<TlsContext> client_tls;
  if (f.tls) {
    // A self-signed certificate for 127.0.0.1, verified by the clients.
    const std::string cert = work->Join("node.crt"), key = work->Join("node.key");
    GRANARY_RETURN_IF_ERROR(MakeSelfSignedCertificate(cert, key, {"127.0.0.1"}));
    GRANARY_ASSIGN_OR_RETURN(server_options.tls, TlsContext::ForServer(cert, key));
    GRANARY_ASSIGN_OR_RETURN(client_tls, TlsContext::ForClient(cert));
  }
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(service, server_options));
  GRANARY_ASSIGN_OR_RETURN(std::vector<PeerClient> clients,
                           ConnectClients(server->port(), f.clients, client_tls));
  t0 = Clock::now();
  GRANARY_ASSIGN_OR_RETURN(uint64_t verified,
                           VerifyEverySample(clients, *manifest, checksums, f.batch));
  Progress("  verified every sample over the wire byte for byte (" +
           Fixed(Seconds(Clock::now() - t0), 1) + " s)");

  std::vector<BatchFn> serve_fns;
  for (PeerClient& client : clients) {
    serve_fns.push_back(
        [&client, &manifest, &checksums](std::span<const SampleId> ids, uint64_t* bytes) {
          return ReadOverWire(client, *manifest, checksums, ids, false, bytes);
        });
  }
  std::vector<StoredChunkReader> readers;  // every chunk, opened once
  for (ChunkId c = 0; c < manifest->chunk_count(); ++c) {
    GRANARY_ASSIGN_OR_RETURN(
        StoredChunkReader reader,
        store->OpenChunkReader({kDataset, manifest->id(), c}, table.segments[c]));
    readers.push_back(std::move(reader));
  }
  const std::vector<BatchFn> local_fns(
      f.clients, [&](std::span<const SampleId> ids, uint64_t* bytes) -> Status {
        for (SampleId id : ids) {
          uint64_t got = 0;
          for (uint64_t p = table.first[id]; p < table.first[id + 1]; ++p) {
            GRANARY_RETURN_IF_ERROR(
                ReadLocally(readers[table.pieces[p].chunk], table.pieces[p], &got));
          }
          GRANARY_RETURN_IF_ERROR(CheckLocalSize(*manifest, id, got));
          *bytes += got;
        }
        return Status::Ok();
      });
  const std::vector<BatchFn> reopen_fns(
      f.clients, [&](std::span<const SampleId> ids, uint64_t* bytes) -> Status {
        // As ChunkReadService does: the chunks of one batch opened for that batch.
        std::map<ChunkId, StoredChunkReader> open;
        for (SampleId id : ids) {
          uint64_t got = 0;
          for (uint64_t p = table.first[id]; p < table.first[id + 1]; ++p) {
            const Piece& piece = table.pieces[p];
            auto it = open.find(piece.chunk);
            if (it == open.end()) {
              GRANARY_ASSIGN_OR_RETURN(
                  StoredChunkReader reader,
                  store->OpenChunkReader({kDataset, manifest->id(), piece.chunk},
                                         table.segments[piece.chunk]));
              it = open.emplace(piece.chunk, std::move(reader)).first;
            }
            GRANARY_RETURN_IF_ERROR(ReadLocally(it->second, piece, &got));
          }
          GRANARY_RETURN_IF_ERROR(CheckLocalSize(*manifest, id, got));
          *bytes += got;
        }
        return Status::Ok();
      });

  // Serving and the local reads take turns, --repeat times; the best of each
  // is reported (a shared machine only ever makes a run slower).
  std::optional<LoadFigures> serving;
  std::optional<LoadFigures> local;
  std::optional<LoadFigures> local_reopen;
  for (uint32_t round = 0; round < f.repeat; ++round) {
    ServerCounters before;  // after the warm-up READs
    GRANARY_ASSIGN_OR_RETURN(LoadFigures served,
                             TimedRun(serve_fns, f.batch, f.files, f.seconds, f.seed,
                                      [&] { before = server->Counters(); }));
    const ServerCounters after = server->Counters();
    const uint64_t payload = after.payload_bytes_total - before.payload_bytes_total;
    if (payload != served.bytes || after.read_item_errors_total != 0) {
      return Status::Internal("the server sent " + std::to_string(payload) +
                              " payload bytes in a timed run and the clients got " +
                              std::to_string(served.bytes) + "; " +
                              std::to_string(after.read_item_errors_total) + " items failed");
    }
    KeepBest(served, &serving);
    std::vector<BatchFn> fns = local_fns;
    GRANARY_ASSIGN_OR_RETURN(LoadFigures read, TimedRun(fns, f.batch, f.files, f.seconds, f.seed));
    KeepBest(read, &local);
    fns = reopen_fns;
    GRANARY_ASSIGN_OR_RETURN(read, TimedRun(fns, f.batch, f.files, f.seconds, f.seed));
    KeepBest(read, &local_reopen);
    Progress("  round " + std::to_string(round + 1) + ": serving " + Fixed(served.gb_s(), 2) +
             " GB/s, local " + Fixed(local->gb_s(), 2) + " GB/s (best so far)");
  }
  const ChunkReadServiceCounters service_counters = service->Counters();
  if (service_counters.items_on_demand != 0 || service_counters.checksum_failures != 0) {
    return Status::Internal("serving fetched " + std::to_string(service_counters.items_on_demand) +
                            " items on demand and saw " +
                            std::to_string(service_counters.checksum_failures) +
                            " checksum failures; everything should have been staged and sound");
  }

  // The table and the JSON.
  const double staging_ratio_cold = staging_cold.mb_s() / source_cold.mb_s();
  const double staging_ratio_warm = staging_warm.mb_s() / source_warm.mb_s();
  const double serving_ratio = serving->gb_s() / local->gb_s();
  const double serving_ratio_reopen = serving->gb_s() / local_reopen->gb_s();
  const double serving_ratio_cpu = serving->gb_per_cpu_s() / local->gb_per_cpu_s();
  std::printf("\n  %-36s %8s %9s %9s %7s %8s\n", "(a) staging vs source", "seconds", "MB/s",
              "files/s", "cpu-s", "cached");
  PrintRate("source read, cold (" + std::to_string(f.threads) + " threads)", source_cold);
  PrintRate("staging, cold (" + std::to_string(f.threads) + " threads)", staging_cold);
  PrintRate("source read, warm", source_warm);
  PrintRate("staging, warm", staging_warm);
  PrintRate("store disk write (reference)", disk_write);
  std::printf("\n  %-36s %8s %6s %9s %9s %7s %7s %7s %8s\n", "(b) serving vs local", "seconds",
              "GB/s", "batch/s", "samples/s", "p50 ms", "p99 ms", "cpu-s", "GB/cpu-s");
  PrintLoad("serving, loopback (" + std::to_string(f.clients) + " clients x " +
                std::to_string(f.batch) + ")",
            *serving);
  PrintLoad("local chunk reads (" + std::to_string(f.clients) + " threads)", *local);
  PrintLoad("local, chunks opened per batch", *local_reopen);
  std::printf(
      "\n  ratios: staging/source cold %.2f, warm %.2f; serving/local %.2f (%.2f against chunks "
      "opened per batch; %.2f per CPU-second)\n",
      staging_ratio_cold, staging_ratio_warm, serving_ratio, serving_ratio_reopen,
      serving_ratio_cpu);

  if (!f.json.empty()) {
    Json j;
    j["dataset"] = {{"files", f.files},
                    {"bytes", dataset_bytes},
                    {"file_bytes", f.size},
                    {"chunks", manifest->chunk_count()},
                    {"chunk_size", manifest->chunk_size()}};
    j["machine"] = {{"cpus", std::thread::hardware_concurrency()}};
    j["source"] = {{"driver", "posix"},
                   {"threads", f.threads},
                   {"cold", ToJson(source_cold)},
                   {"warm", ToJson(source_warm)}};
    Json cold = ToJson(staging_cold);
    cold["ratio_to_source"] = staging_ratio_cold;
    Json warm = ToJson(staging_warm);
    warm["ratio_to_source"] = staging_ratio_warm;
    j["staging"] = {{"threads", f.threads},
                    {"cold", cold},
                    {"warm", warm},
                    {"store_disk_write", ToJson(disk_write)}};
    Json serving_json = ToJson(*serving, "reads");
    serving_json["batch"] = f.batch;
    serving_json["io_threads"] = f.io_threads;
    serving_json["service_threads"] = f.service_threads;
    serving_json["repeat"] = f.repeat;
    serving_json["tls"] = f.tls;
    j["serving"] = serving_json;
    Json local_json = ToJson(*local, "batches");
    local_json["batch"] = f.batch;
    j["local"] = local_json;
    Json reopen_json = ToJson(*local_reopen, "batches");
    reopen_json["batch"] = f.batch;
    j["local_reopen"] = reopen_json;
    j["ratios"] = {{"staging_vs_source_cold", staging_ratio_cold},
                   {"staging_vs_source_warm", staging_ratio_warm},
                   {"serving_vs_local", serving_ratio},
                   {"serving_vs_local_reopen", serving_ratio_reopen},
                   {"serving_vs_local_per_cpu_second", serving_ratio_cpu}};
    j["verified"] = {{"bytes_compared", verified},
                     {"samples_compared", manifest->sample_count()},
                     {"timed_items_checked", serving->samples}};
    std::ofstream out(f.json);
    out << j.dump(2) << "\n";
    out.close();
    if (!out) return Status::IoError("writing " + f.json + ": " + ErrnoText(errno));
  }
  return Status::Ok();
}

}  // namespace
}  // namespace granary

int main(int argc, char** argv) {
  granary::Flags f;
  CLI::App app{
      "Granary cache node benchmark: staging against the source's read bandwidth, and serving "
      "over loopback against local reads of the same chunk files (docs/benchmarks.md)"};
  app.add_option("--dir", f.dir,
                 "work directory (must be empty or not exist; removed at the end); default a new "
                 "directory under /tmp");
  app.add_flag("--keep", f.keep, "keep the work directory");
  app.add_option("--files", f.files, "files in the generated dataset")
      ->check(CLI::Range(uint64_t{1}, uint64_t{10'000'000}));
  app.add_option("--size", f.size, "bytes per file, e.g. 110KiB (KB = 1000, KiB = 1024)")
      ->transform(CLI::AsSizeValue(true));
  app.add_option("--threads", f.threads, "source concurrency: staging and source-read threads")
      ->check(CLI::Range(uint32_t{1}, granary::kMaxStagerThreads));
  app.add_option("--clients", f.clients, "client connections (and local reader threads)")
      ->check(CLI::Range(1, 256));
  app.add_option("--batch", f.batch, "samples per READ")
      ->check(CLI::Range(uint32_t{1}, granary::protocol_format::kDefaultMaxItems));
  app.add_option("--seconds", f.seconds, "length of each timed serving and local run")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--io-threads", f.io_threads, "server event loops")->check(CLI::Range(1, 64));
  app.add_option("--service-threads", f.service_threads, "server read-service threads")
      ->check(CLI::Range(1, 256));
  app.add_option("--repeat", f.repeat,
                 "serving and local runs take turns this many times; the best of each is kept")
      ->check(CLI::Range(1, 100));
  app.add_option("--seed", f.seed, "seed of the random sample order");
  app.add_option("--json", f.json, "also write the figures as JSON to this file");
  app.add_flag("--tls", f.tls, "serve over TLS (a self-signed certificate the clients verify)");
  CLI11_PARSE(app, argc, argv);

  if (std::getenv("GRANARY_LOG_LEVEL") == nullptr) granary::SetLogLevel(spdlog::level::warn);
  granary::InstallSignalHandlers();
  granary::Status status = granary::Run(f);
  if (!status.ok()) {
    std::fprintf(stderr, "cachenode_bench failed: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

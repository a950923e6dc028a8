#include "bench_setup.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/manifest_builder.h"
#include "granary/protocol/protocol_format.h"

namespace granary::cachenode_bench {

namespace fs = std::filesystem;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Gb(uint64_t bytes) { return static_cast<double>(bytes) / 1e9; }
double PerSecond(uint64_t n, double seconds) {
  return seconds > 0 ? static_cast<double>(n) / seconds : 0;
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

// ---- interruption: SIGINT/SIGTERM end the run through its normal cleanup ----

namespace {

std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnSignal(int) { g_interrupted.store(true, std::memory_order_relaxed); }

}  // namespace

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

// What CLI11's ranges cannot say: sizes that fit the protocol and the disk.
Status CheckFlags(const Flags& f) {
  if (f.tls && f.transport != "tcp") {
    return Status::InvalidArgument("--tls with --transport " + f.transport +
                                   ": TLS is TCP's (the fabric carries none); use --transport tcp");
  }
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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

Json ToJson(const RateFigures& r) {
  Json j;
  j["seconds"] = r.seconds;
  j["mb_s"] = r.mb_s();
  j["files_s"] = r.files_s();
  j["bytes"] = r.bytes;
  j["files"] = r.files;
  j["cpu_seconds"] = r.cpu_seconds;
  j["cpu_seconds_per_gb"] = r.cpu_s_per_gb();
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

BenchSetup::BenchSetup() = default;
BenchSetup::~BenchSetup() = default;

std::string BenchSetup::Join(const std::string& name) const { return work->Join(name); }

Result<std::unique_ptr<BenchSetup>> SetUp(const Flags& f) {
  GRANARY_RETURN_IF_ERROR(CheckFlags(f));
  auto setup = std::make_unique<BenchSetup>();
  GRANARY_ASSIGN_OR_RETURN(setup->work, WorkDir::Create(f.dir, f.keep));
  const uint64_t dataset_bytes = f.files * f.size;
  setup->dataset_bytes = dataset_bytes;
  GRANARY_RETURN_IF_ERROR(CheckFreeSpace(setup->work->path(), dataset_bytes, f.files));
  const std::string source_root = setup->Join("source");
  setup->source_root = source_root;

  Progress("cachenode_bench: " + std::to_string(f.files) + " files x " + std::to_string(f.size) +
           " bytes = " + Fixed(Gb(dataset_bytes), 2) + " GB in " + setup->work->path() + " (" +
           std::to_string(std::thread::hardware_concurrency()) + " CPUs)");
  std::vector<uint64_t>& checksums = setup->checksums;
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
  setup->manifest = manifest;
  GRANARY_ASSIGN_OR_RETURN(setup->table, BuildPieceTable(*manifest));
  Progress("  generated and synced in " + Fixed(generate_s, 1) + " s; " +
           std::to_string(manifest->chunk_count()) + " chunks of up to " +
           std::to_string(manifest->chunk_size() >> 20) + " MiB");

  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<IdentityExecutor> executor,
                           IdentityExecutor::Start({.threads = f.threads}));
  SourceOptions source_options;
  source_options.owner = ProcessIdentity();
  source_options.executor = executor.get();
  source_options.max_in_flight = f.threads;
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<Source> opened,
                           OpenSource("file://" + source_root, std::move(source_options)));
  std::shared_ptr<Source> source = std::move(opened);
  setup->executor = std::move(executor);
  setup->source = source;

  // The store the staging bench fills and the serving and local benches read.
  const WorkDir* work = setup->work.get();
  GRANARY_ASSIGN_OR_RETURN(std::shared_ptr<ChunkStore> store,
                           ChunkStore::Open(work->Join("store"), 2 * dataset_bytes + (1ull << 30)));
  setup->store = std::move(store);
  return setup;
}

}  // namespace granary::cachenode_bench

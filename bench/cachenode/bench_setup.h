#pragma once

// cachenode_bench's shared set-up (bench/cachenode_bench.cc): its flags, the
// work directory, the generated dataset (content that can be generated again
// to check what was read), the source and the store every bench reads or
// writes, and the helpers the benches share: timing, CPU seconds, a parallel
// loop and SIGINT/SIGTERM interruption.
//
// Thread safety: SetUp and the benches run on the main thread; ParallelFor's
// `fn` runs on its worker threads; Interrupted() may be called from any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/cachenode/chunk_store.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"

namespace granary::cachenode_bench {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

inline constexpr char kDataset[] = "bench";
inline constexpr uint32_t kFilesPerDirectory = 1000;
inline constexpr uint32_t kGenerateThreads = 2;

double Seconds(Clock::duration d);
double Gb(uint64_t bytes);
double PerSecond(uint64_t n, double seconds);

// A progress line on stdout, flushed; a number with `decimals` decimals.
void Progress(const std::string& line);
std::string Fixed(double value, int decimals);

// ---- interruption: SIGINT/SIGTERM end the run through its normal cleanup ----

void InstallSignalHandlers();
bool Interrupted();
Status InterruptedStatus();

// CPU seconds (user + system) of every thread of this process so far.
double CpuSeconds();

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
Status ParallelFor(uint32_t threads, uint64_t n, const std::function<Status(uint64_t)>& fn);

// ---- the command line ----

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
  // Serving's wire: "tcp", "libfabric" or "both" (one after the other, each
  // against the same local reads), the libfabric provider, and whether the
  // clients connect from another network namespace (NetnsPair) instead of
  // over loopback.
  std::string transport = "tcp";
  std::string fabric_provider = "tcp";
  bool netns = false;
  // The read service verifies each stored segment once, then sends it as a
  // file range (ChunkReadServiceOptions::verify_once).
  bool verify_once = false;
};

// What CLI11's ranges cannot say: sizes that fit the protocol and the disk.
Status CheckFlags(const Flags& f);

// ---- the dataset ----

// File `index`'s content: a splitmix64 stream seeded by the index, so any
// byte can be generated again to check what was served.
void FillContent(uint64_t index, std::span<char> out);

// Names sort in index order, so sample id == file index in the manifest.
std::string RelativePath(uint64_t index);

// The fraction of the source files' pages in the page cache (mincore),
// after dropping them first if `drop` (posix_fadvise DONTNEED; the pages are
// clean, SetUp synced them).
Result<double> SourceResidency(const std::string& root, const Flags& f, bool drop);

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

// What reading or staging a whole dataset took (the (a) benches).
struct RateFigures {
  double seconds = 0;
  double cpu_seconds = 0;
  uint64_t bytes = 0;
  uint64_t files = 0;
  double resident_before = -1;  // fraction of the source in the page cache before; -1: not known
  double mb_s() const { return PerSecond(bytes, seconds) / 1e6; }
  double files_s() const { return PerSecond(files, seconds); }
  // CPU-seconds of the process per GB (1e9 bytes) moved.
  double cpu_s_per_gb() const {
    return bytes == 0 ? 0 : cpu_seconds / (static_cast<double>(bytes) / 1e9);
  }
};

Json ToJson(const RateFigures& r);

// Fails unless the source counted exactly `opens` opens, `bytes` bytes and no
// error between `before` and `after`.
Status CheckSourceCounters(const SourceCounters& before, const SourceCounters& after,
                           uint64_t opens, uint64_t bytes, std::string_view what);

// ---- the set-up every bench shares ----

class WorkDir;

// The work directory with the generated dataset in it, its manifest, the
// source over it and an empty store beside it. Members are destroyed in
// reverse order, so the work directory goes last.
struct BenchSetup {
  BenchSetup();
  ~BenchSetup();

  std::unique_ptr<WorkDir> work;
  uint64_t dataset_bytes = 0;
  std::string source_root;
  std::vector<uint64_t> checksums;  // by sample, of the generated bytes
  std::shared_ptr<const Manifest> manifest;
  PieceTable table;
  std::unique_ptr<IdentityExecutor> executor;
  std::shared_ptr<Source> source;
  std::shared_ptr<ChunkStore> store;

  // A path in the work directory.
  std::string Join(const std::string& name) const;
};

// Creates the work directory, generates and syncs the dataset, builds its
// manifest and piece table, opens the source and the store.
Result<std::unique_ptr<BenchSetup>> SetUp(const Flags& f);

}  // namespace granary::cachenode_bench

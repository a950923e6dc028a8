#pragma once

// SlowFs: the benchmark's slow source (BENCHMARK.md, "The slow source"). A
// read-only FUSE pass-through of a directory that charges every metadata
// operation and every read a latency, caps the bytes per second of all reads
// together (TokenBucket) and the operations in flight (ConcurrencyGate), and
// keeps the kernel from caching anything (direct_io, entry/attribute/negative
// timeouts 0, no keep_cache), so every read by every reader pays the source's
// price. It counts what it serves: opens, stats (getattr: a lookup and a stat
// each count one; the root directory's own attributes are free and not
// counted), readdirs, reads and bytes.
//
// The counters can be read while it runs from a virtual file at the mount's
// root, `<mount>/.slowfs-stats` (kSlowFsStatsName): one JSON object, taken
// when the file is opened. It is hidden from readdir, and reading it costs no
// latency and is not counted. Once it can be read, the mount is serving.
//
// Callers: bench/slowfs/main.cc (granary-slowfs); tests read the counters.
// Thread safety: FUSE calls the operations from many worker threads at once;
// counters are atomics, the throttles lock internally. Serve() runs once, on
// the thread that owns the object, and returns after a stop signal.

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "granary/core/file.h"
#include "granary/core/status.h"
#include "slowfs_options.h"
#include "throttle.h"

namespace granary {

inline constexpr char kSlowFsStatsName[] = ".slowfs-stats";

// A copy of the counters at one moment.
struct SlowFsCounts {
  uint64_t opens = 0;           // files opened (read-only)
  uint64_t stats = 0;           // getattr calls: lookups, stat, fstat; and access()
  uint64_t readdirs = 0;        // directory listings read
  uint64_t reads = 0;           // read calls
  uint64_t read_bytes = 0;      // bytes returned by them
  uint64_t readlinks = 0;       // symlinks read
  uint64_t statfs = 0;          // statfs calls
  uint64_t refused_writes = 0;  // write-like calls answered EROFS
  uint64_t errors = 0;          // calls that failed at the source (ENOENT included)
  uint64_t waits = 0;           // calls that waited for a concurrency slot
  uint32_t peak_in_flight = 0;  // most calls in flight at once
};

// {"opens":..,"stats":..,...,"profile":"nfs","latency_ms":..,"bandwidth_mb_s":..,
//  "max_concurrency":..}: what .slowfs-stats and --stats-file hold.
std::string SlowFsCountsJson(const SlowFsCounts& counts, const SlowFsProfile& profile);

class SlowFs {
 public:
  // Opens the source directory (options already validated).
  static Result<std::unique_ptr<SlowFs>> Open(const SlowFsOptions& options);

  // Mounts at options.mountpoint, serves until SIGTERM, SIGINT or SIGHUP (or
  // until the mount is unmounted from outside), then unmounts. Writes one
  // "granary-slowfs: serving ..." line on stdout once mounted.
  Status Serve();

  SlowFsCounts counts() const;
  const SlowFsOptions& options() const { return options_; }

  // The file system's operations, called by the FUSE callbacks in
  // slow_fs.cc: `path` is the mount-relative path FUSE gives ("/a/b"); they
  // return 0 or -errno, as FUSE expects.
  int GetAttr(const char* path, struct stat* st, int fd);
  int ReadLink(const char* path, char* buf, size_t size);
  int OpenDir(const char* path, uint64_t* handle);
  int ReadDir(const char* path, void* buf, void* filler, int64_t offset, uint64_t handle);
  int ReleaseDir(uint64_t handle);
  int OpenFile(const char* path, int flags, uint64_t* handle, bool* direct_io);
  int Read(uint64_t handle, char* buf, size_t size, int64_t offset);
  int Release(uint64_t handle);
  int StatFs(struct statvfs* st);
  int Access(const char* path, int mask);
  int RefuseWrite();

 private:
  explicit SlowFs(SlowFsOptions options, ScopedFd root);

  // Holds a concurrency slot for its lifetime, after paying the latency.
  class Slot;
  void PayLatency() const;
  int Failed(int err);

  const SlowFsOptions options_;
  const ScopedFd root_;  // O_PATH | O_DIRECTORY of the source
  TokenBucket bucket_;
  ConcurrencyGate gate_;
  std::atomic<uint64_t> opens_{0}, stats_{0}, readdirs_{0}, reads_{0}, read_bytes_{0},
      readlinks_{0}, statfs_{0}, refused_writes_{0}, errors_{0}, waits_{0};
};

}  // namespace granary

#pragma once

// Source: where a dataset's bytes come from at staging time. The cache node
// reads each sample (or, for a sample larger than a chunk, the piece of it that
// one chunk holds) through this interface, naming it as the manifest recorded
// it: path relative to the source root, and what identifies the version the
// snapshot saw (size, mtime, ctime, inode). A driver checks the opened file
// against those for every read, before and after reading, so a file that
// changed since the snapshot is a per-sample error (kFailedPrecondition),
// never wrong bytes, and pieces of two versions of a file are never joined:
// each piece of a large sample is read (and checked) on its own.
//
// Drivers: PosixSource (posix_source.h) for a mounted file system; S3 and HTTP
// drivers later. OpenSource (below) opens the driver a dataset's source URI
// names: callers never pick a driver by hand, and a new driver is one more
// scheme there (source/src/open_source.cc). Every driver bounds its reads in flight (Read waits for
// a slot, TryRead does not) and counts every open, read call and byte in a SourceCounters snapshot,
// which the cache node exports as metrics. SourceMeter and InFlightLimit below are the shared
// pieces drivers use for that.
//
// Callers: the cache node's staging and on-demand paths (never its event-loop
// threads: Read blocks on the source and on the in-flight limit).
//
// Thread safety: every Source method may be called from any number of threads
// at once. SourceMeter and InFlightLimit are thread-safe.

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "granary/core/manifest.h"
#include "granary/core/status.h"
#include "granary/source/identity.h"

namespace granary {

// A source file as the manifest recorded it.
struct SourceFile {
  std::string path;  // relative to the source root: "a/b.jpg", no leading '/', no '.' or '..'
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // st_mtim in nanoseconds since the epoch
  // st_ctim in nanoseconds and st_ino; 0 when the manifest did not record it
  // (format version 1 or 2): that attribute is then not checked.
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
};

// The source file of sample `id` (unchecked: id < manifest.sample_count()).
inline SourceFile SourceFileAt(const Manifest& manifest, SampleId id) {
  return SourceFile{manifest.PathOf(id), manifest.SizeOf(id), manifest.MtimeOf(id),
                    manifest.CtimeOf(id), manifest.InodeOf(id)};
}

// The source file of sample `id`; kOutOfRange past the end.
inline Result<SourceFile> SourceFileOf(const Manifest& manifest, SampleId id) {
  GRANARY_ASSIGN_OR_RETURN(SampleInfo info, manifest.Sample(id));
  return SourceFile{std::move(info.path), info.size, info.mtime_ns, info.ctime_ns, info.inode};
}

// Why a read failed, for counting (the Status carries the details).
enum class SourceErrorKind : uint8_t {
  kChanged,           // size, mtime, ctime, inode or type differs from the snapshot, or
                      // changed during the read
  kNotFound,          // the file (or a directory on its path) is gone
  kPermissionDenied,  // the dataset's owner may not read it
  kUnsafePath,        // resolves outside the root, or through a link the driver will not follow
  kInvalidRequest,    // a malformed path or a range past the end of the file
  kIdentity,          // the owner's identity could not be taken
  kIo,                // anything else the OS or the service refused
};
inline constexpr size_t kSourceErrorKinds = 7;

// "changed", "not_found", ... (metric label values).
inline std::string_view SourceErrorKindName(SourceErrorKind kind) {
  switch (kind) {
    case SourceErrorKind::kChanged:
      return "changed";
    case SourceErrorKind::kNotFound:
      return "not_found";
    case SourceErrorKind::kPermissionDenied:
      return "permission_denied";
    case SourceErrorKind::kUnsafePath:
      return "unsafe_path";
    case SourceErrorKind::kInvalidRequest:
      return "invalid_request";
    case SourceErrorKind::kIdentity:
      return "identity";
    case SourceErrorKind::kIo:
      return "io";
  }
  return "unknown";
}

// A snapshot of a source's counters. Monotonic totals unless noted.
struct SourceCounters {
  uint64_t opens = 0;       // open calls issued to the source (failed ones too)
  uint64_t read_calls = 0;  // read calls issued (pread, GET, ...)
  uint64_t bytes = 0;       // bytes those calls returned
  uint64_t completed = 0;   // Read/TryRead calls that returned OK
  uint64_t busy = 0;        // TryRead calls refused because every slot was taken
  std::array<uint64_t, kSourceErrorKinds> errors{};  // failed Read/TryRead calls by kind
  uint64_t in_flight = 0;                            // gauge: reads holding a slot now
  uint64_t waiting = 0;                              // gauge: Read calls waiting for a slot now
  uint64_t max_in_flight = 0;                        // high-water mark of in_flight

  uint64_t error(SourceErrorKind kind) const { return errors[static_cast<size_t>(kind)]; }
  uint64_t errors_total() const {
    uint64_t total = 0;
    for (uint64_t e : errors) total += e;
    return total;
  }
};

class Source {
 public:
  virtual ~Source() = default;

  // Reads out.size() bytes of `file` starting at `offset` into `out`, after
  // checking that the file is still what the manifest recorded. Waits while
  // max_in_flight() reads are in flight. Errors (the kind counted):
  //   kFailedPrecondition  changed since the snapshot (kChanged);
  //   kNotFound            gone (kNotFound);
  //   kPermissionDenied    the owner may not read it (kPermissionDenied), or
  //                        its path leaves the root (kUnsafePath), or the
  //                        owner's identity cannot be taken (kIdentity);
  //   kInvalidArgument     a malformed path (kInvalidRequest);
  //   kOutOfRange          offset + out.size() > file.size (kInvalidRequest);
  //   kIoError             anything else (kIo).
  // On error the contents of `out` are unspecified and must not be used.
  virtual Status Read(const SourceFile& file, uint64_t offset, std::span<char> out) = 0;

  // Read, but kResourceExhausted at once (counted as busy, not as an error)
  // instead of waiting when max_in_flight() reads are in flight.
  virtual Status TryRead(const SourceFile& file, uint64_t offset, std::span<char> out) = 0;

  virtual SourceCounters Counters() const = 0;

  // e.g. file:///lustre/imagenet/train; shown in messages.
  virtual const std::string& uri() const = 0;
  virtual uint32_t max_in_flight() const = 0;

  // Whether the local user `reader` may read every file of `files` at the
  // source, as the source itself would decide for that user (PosixSource:
  // the kernel, by mode bits and ACLs). The cache node's chunk handoff asks
  // it before it passes a chunk file to a local user other than the owner.
  // A driver with no notion of local users (S3, HTTP) keeps this default:
  // kFailedPrecondition, so such readers go through a sidecar.
  virtual Status CheckReadable(const Identity& reader, std::span<const SourceFile> files) {
    (void)files;
    return Status::FailedPrecondition("source " + uri() + " cannot check what local user " +
                                      reader.ToString() + " may read; read through a sidecar");
  }
};

// What every driver needs to open a dataset's source.
struct SourceOptions {
  // The dataset's name, for the re-snapshot command messages give.
  std::string dataset;
  // Whose rights every access uses (ResolveOwnerIdentity of the dataset owner).
  Identity owner;
  // Runs the accesses as `owner`; required; must outlive the source.
  IdentityExecutor* executor = nullptr;
  // Reads in flight at most (the cache node's "source concurrency"). 1..65536.
  uint32_t max_in_flight = 16;
};

// The URI forms OpenSource accepts, for messages ("file:///absolute/path").
std::string_view AcceptedSourceUris();

// Opens the source `uri` names with the driver of its scheme: file:// is
// PosixSource (its root is the URI's absolute path). kInvalidArgument naming
// the URI and the accepted forms for a URI without a scheme, a scheme no
// driver reads, or a malformed path; else what the driver's open returns.
Result<std::unique_ptr<Source>> OpenSource(std::string_view uri, SourceOptions options);

// Counts for a driver: call the Count* methods as the calls happen.
class SourceMeter {
 public:
  void CountOpen() { opens_.fetch_add(1, std::memory_order_relaxed); }
  void CountRead(uint64_t bytes) {
    read_calls_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void CountCompleted() { completed_.fetch_add(1, std::memory_order_relaxed); }
  void CountBusy() { busy_.fetch_add(1, std::memory_order_relaxed); }
  void CountError(SourceErrorKind kind) {
    errors_[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
  }
  // Fills every field but the in-flight ones (InFlightLimit::Fill).
  void Fill(SourceCounters* c) const {
    c->opens = opens_.load(std::memory_order_relaxed);
    c->read_calls = read_calls_.load(std::memory_order_relaxed);
    c->bytes = bytes_.load(std::memory_order_relaxed);
    c->completed = completed_.load(std::memory_order_relaxed);
    c->busy = busy_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < kSourceErrorKinds; ++i) {
      c->errors[i] = errors_[i].load(std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<uint64_t> opens_{0};
  std::atomic<uint64_t> read_calls_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> busy_{0};
  std::array<std::atomic<uint64_t>, kSourceErrorKinds> errors_{};
};

// At most `limit` holders at once: a counting semaphore that also reports its
// gauges. Acquire waits (FIFO is not guaranteed); TryAcquire does not.
class InFlightLimit {
 public:
  explicit InFlightLimit(uint32_t limit) : limit_(limit) {}

  void Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    if (in_flight_ >= limit_) {
      ++waiting_;
      cv_.wait(lock, [&] { return in_flight_ < limit_; });
      --waiting_;
    }
    Take();
  }
  bool TryAcquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ >= limit_) return false;
    Take();
    return true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    cv_.notify_one();
  }
  uint32_t limit() const { return limit_; }
  void Fill(SourceCounters* c) const {
    std::lock_guard<std::mutex> lock(mu_);
    c->in_flight = in_flight_;
    c->waiting = waiting_;
    c->max_in_flight = max_in_flight_;
  }

  // Holds one slot until destroyed.
  class Slot {
   public:
    explicit Slot(InFlightLimit* limit) : limit_(limit) {}
    ~Slot() {
      if (limit_ != nullptr) limit_->Release();
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    InFlightLimit* limit_;
  };

 private:
  void Take() {
    ++in_flight_;
    if (in_flight_ > max_in_flight_) max_in_flight_ = in_flight_;
  }

  const uint32_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t in_flight_ = 0;      // guarded by mu_
  uint64_t waiting_ = 0;        // guarded by mu_
  uint64_t max_in_flight_ = 0;  // guarded by mu_
};

}  // namespace granary

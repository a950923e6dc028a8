#include "mount_fallback.h"

#include <algorithm>
#include <new>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/protocol/unix_socket.h"

namespace granary::cli {
namespace {

// A sample read without the sidecar: its bytes on the heap.
class HeapSample : public posix::PinnedSample {
 public:
  HeapSample(std::unique_ptr<char[]> bytes, size_t size) : bytes_(std::move(bytes)), size_(size) {}
  std::string_view bytes() const override { return std::string_view(bytes_.get(), size_); }

 private:
  std::unique_ptr<char[]> bytes_;
  size_t size_;
};

// Errors after which the sidecar may be gone (the session reader gave up
// reconnecting); anything else is the sample's own.
bool MayBeSidecarGone(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded ||
         s.code() == StatusCode::kIoError;
}

}  // namespace

FallbackContentReader::FallbackContentReader(std::shared_ptr<posix::ContentReader> primary,
                                             std::unique_ptr<DirectReader> direct,
                                             std::string sidecar_socket,
                                             std::function<Status(DirectReader&)> refresh_nodes,
                                             std::chrono::milliseconds retry_after)
    : primary_(std::move(primary)),
      direct_(std::move(direct)),
      sidecar_socket_(std::move(sidecar_socket)),
      refresh_nodes_(std::move(refresh_nodes)),
      retry_after_(retry_after) {}

bool FallbackContentReader::SidecarListens() const {
  return ConnectUnix(sidecar_socket_, std::chrono::milliseconds(500)).ok();
}

bool FallbackContentReader::InFallback() const {
  const int64_t until = fallback_until_ns_.load(std::memory_order_acquire);
  return until != 0 && Clock::now().time_since_epoch() < std::chrono::nanoseconds(until);
}

void FallbackContentReader::StartFallback(const Status& why) {
  const auto until = std::chrono::duration_cast<std::chrono::nanoseconds>(
      (Clock::now() + retry_after_).time_since_epoch());
  fallback_until_ns_.store(until.count(), std::memory_order_release);
  const uint64_t n = fallbacks_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n <= 20 || n % 100 == 0) {
    GetLogger("posix")->warn(
        "the sidecar at {} is gone ({}); reading straight from the cache nodes and the source, "
        "and trying the sidecar again in {} ms (fallback {})",
        sidecar_socket_, why.message(), retry_after_.count(), n);
  }
  if (refresh_nodes_) {
    std::unique_lock<std::mutex> lock(refresh_mu_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (Status s = refresh_nodes_(*direct_); !s.ok()) {
        GetLogger("posix")->warn(
            "reading the cache nodes from the store failed ({}); using the "
            "ones known",
            s.message());
      }
    }
  }
}

Result<std::unique_ptr<posix::PinnedSample>> FallbackContentReader::Acquire(SampleId id) {
  if (!InFallback()) {
    Result<std::unique_ptr<posix::PinnedSample>> pinned = primary_->Acquire(id);
    if (pinned.ok() || !MayBeSidecarGone(pinned.status()) || SidecarListens()) return pinned;
    StartFallback(pinned.status());
  }
  return AcquireDirect(id);
}

Result<std::unique_ptr<posix::PinnedSample>> FallbackContentReader::AcquireDirect(SampleId id) {
  direct_reads_.fetch_add(1, std::memory_order_relaxed);
  auto fail = [this](Status s) {
    direct_errors_.fetch_add(1, std::memory_order_relaxed);
    return s;
  };
  const Manifest& manifest = direct_->manifest();
  if (id >= manifest.sample_count()) {
    return fail(Status::OutOfRange("sample " + std::to_string(id) + " is past the end"));
  }
  if (Status may = direct_->MayRead(id); !may.ok()) return fail(may);
  const uint64_t size = manifest.SizeOf(id);
  std::unique_ptr<char[]> bytes(new (std::nothrow) char[std::max<uint64_t>(size, 1)]);
  if (!bytes) {
    return fail(Status::ResourceExhausted("reading " + Quoted(manifest.PathOf(id)) +
                                          " without the sidecar: cannot allocate " +
                                          std::to_string(size) + " bytes"));
  }
  if (Status read = direct_->Read(id, std::span<char>(bytes.get(), size)); !read.ok()) {
    return fail(read.WithContext("reading " + Quoted(manifest.PathOf(id)) +
                                 " without the sidecar (cache nodes, then the source)"));
  }
  return std::unique_ptr<posix::PinnedSample>(
      std::make_unique<HeapSample>(std::move(bytes), static_cast<size_t>(size)));
}

void FallbackContentReader::Hint(std::span<const SampleId> ids) {
  // Direct reads fetch on demand only: hints would need memory of their own.
  if (!InFallback()) primary_->Hint(ids);
}

FallbackContentReader::Counters FallbackContentReader::counters() const {
  Counters c;
  c.fallbacks = fallbacks_.load(std::memory_order_relaxed);
  c.direct_reads = direct_reads_.load(std::memory_order_relaxed);
  c.direct_errors = direct_errors_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace granary::cli

#pragma once

// FallbackContentReader: what `granary mount` reads through
// (docs/posix-view.md, "When something fails"). While the host's sidecar
// answers, every read goes through it (the primary, a SessionContentReader:
// prefetched, pooled, the bytes in its arena). When the sidecar is gone (a
// read gave up reconnecting and nothing listens on its socket), reads go
// straight to the cache nodes, then the source (DirectReader), for
// `retry_after`; then the sidecar is tried again. So a sidecar that dies
// costs readers a pause, not EIO: EIO only where the cache nodes and the
// source cannot serve either. A sample's own error from a live sidecar
// (changed at the source, permission) is returned as it is: the sidecar
// tried every node and the source already.
//
// Direct reads copy each sample into this process's memory (one per FUSE
// thread reading, so bounded by threads x the largest sample read), check
// the caller's right to read it at the source unless it is root or the
// dataset's owner (DirectReader::MayRead), and re-read the pool's live
// nodes from the store when the fallback starts.
//
// Who calls it: PosixView's FUSE threads, made by cli/src/mount_command.cc.
//
// Thread safety: Acquire and Hint from any number of threads; counters() too.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "direct_reader.h"
#include "granary/posix/content_reader.h"

namespace granary::cli {

class FallbackContentReader : public posix::ContentReader {
 public:
  struct Counters {
    uint64_t fallbacks = 0;      // times the sidecar was found gone
    uint64_t direct_reads = 0;   // samples read without the sidecar
    uint64_t direct_errors = 0;  // of those, failed
  };

  // `sidecar_socket`: where the primary's sidecar listens (to tell a gone
  // sidecar from a sample's own error). `refresh_nodes` re-reads the pool's
  // nodes into the direct reader (called when a fallback starts; may be
  // empty).
  FallbackContentReader(std::shared_ptr<posix::ContentReader> primary,
                        std::unique_ptr<DirectReader> direct, std::string sidecar_socket,
                        std::function<Status(DirectReader&)> refresh_nodes,
                        std::chrono::milliseconds retry_after = std::chrono::seconds(5));

  Result<std::unique_ptr<posix::PinnedSample>> Acquire(SampleId id) override;
  void Hint(std::span<const SampleId> ids) override;

  Counters counters() const;

 private:
  using Clock = std::chrono::steady_clock;

  bool SidecarListens() const;
  bool InFallback() const;
  void StartFallback(const Status& why);
  Result<std::unique_ptr<posix::PinnedSample>> AcquireDirect(SampleId id);

  const std::shared_ptr<posix::ContentReader> primary_;
  const std::unique_ptr<DirectReader> direct_;
  const std::string sidecar_socket_;
  const std::function<Status(DirectReader&)> refresh_nodes_;
  const std::chrono::milliseconds retry_after_;

  std::atomic<int64_t> fallback_until_ns_{0};  // steady clock; 0: through the sidecar
  std::mutex refresh_mu_;                      // one refresh at a time
  std::atomic<uint64_t> fallbacks_{0};
  std::atomic<uint64_t> direct_reads_{0};
  std::atomic<uint64_t> direct_errors_{0};
};

}  // namespace granary::cli

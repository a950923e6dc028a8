#pragma once

// ContentReader: where the POSIX view (posix_view.h) gets file contents from.
// The FUSE part knows nothing of sockets or cache nodes: it asks a reader to
// pin a sample's bytes, replies from them, and tells it what will probably be
// read next. Two implementations are meant:
//   - SessionContentReader (cli/src/session_reader.h): client Sessions to a running
//     granary-sidecar; the bytes stay in the sidecar's shared-memory arena and
//     are written from there straight into the FUSE reply (`granary mount`);
//   - the sidecar itself, in process (its `mounts:` option), pinning samples in
//     its SampleCache.
//
// Who calls it: PosixView's FUSE worker threads (Acquire, Hint).
//
// Thread safety: implementations must allow Acquire and Hint from any number
// of threads at once, and a PinnedSample to be destroyed on any thread.

#include <memory>
#include <span>
#include <string_view>

#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary::posix {

// One sample's bytes, held (pinned) for as long as this object lives.
class PinnedSample {
 public:
  virtual ~PinnedSample() = default;
  // The whole sample; valid until this object is destroyed.
  virtual std::string_view bytes() const = 0;
};

class ContentReader {
 public:
  virtual ~ContentReader() = default;

  // The whole of sample `id`, pinned. Errors: kOutOfRange (no such sample),
  // the sample's own error (kFailedPrecondition: changed at the source since
  // the snapshot; kPermissionDenied), kUnavailable / kDeadlineExceeded when
  // the bytes cannot be had now (after the reader's own retries). The view
  // turns any error into EIO for the reading process and logs it.
  virtual Result<std::unique_ptr<PinnedSample>> Acquire(SampleId id) = 0;

  // `ids` will probably be read soon, in this order: a reader may fetch them
  // ahead. Never blocks on I/O; may drop hints it has no room for.
  virtual void Hint(std::span<const SampleId> ids) = 0;
};

}  // namespace granary::posix

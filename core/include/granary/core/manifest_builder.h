#pragma once

// Takes the metadata snapshot of a POSIX source tree: walks it in parallel and
// builds the Manifest (manifest.h). This is the only code that asks the source
// for metadata; everything after it answers from the manifest.
//
// Walk rules:
//   - directories are descended; a directory matched by an exclude glob is
//     pruned with everything under it (counted once in skipped_excluded);
//   - a regular file is a sample if it matches an include glob (or there are
//     none) and no exclude glob;
//   - a symlink is never followed out of the root: a link to a regular file
//     inside the root is a sample under the link's own path (size, mtime,
//     ctime and inode of the target); links to directories (cycles), outside the root or dangling
//     are skipped and counted;
//   - every sample records size, mtime, ctime and inode: what identifies the
//     version of the file the walk saw (FileEntry, source.h);
//   - every directory read is recorded with its permission bits, so one
//     without samples (an empty class folder) is in the manifest too;
//   - sockets, fifos and devices are skipped and counted; entries the walk
//     cannot read, or whose path is longer than 4095 bytes, are skipped and
//     counted (the first is logged at warn, then a total at the end).
//
// Thread safety: BuildManifest may be called concurrently; each call runs its
// own worker threads and blocks until they are done.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary {

struct ManifestBuildOptions {
  std::string source_root;  // a local directory (a mounted PFS path)
  std::string source_uri;   // recorded in the manifest; default file://<real path of root>
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  uint64_t chunk_size = kDefaultChunkSize;
  unsigned threads = 8;  // concurrent directory readers; 1..256
  // Called now and then (every few thousand files and at the end) from a
  // walker thread, never concurrently with itself: files and directories seen.
  std::function<void(uint64_t files, uint64_t directories)> on_progress;
};

Result<Manifest> BuildManifest(const ManifestBuildOptions& options);

}  // namespace granary

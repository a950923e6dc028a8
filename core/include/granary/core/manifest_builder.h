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
//   - a symlink is a sample only if the source's reads will follow it: it is
//     resolved as PosixSource resolves it (openat2 RESOLVE_BENEATH from the
//     root), and a link to a regular file reached that way is a sample under
//     the link's own path (size, mtime, ctime and inode of the target). Absolute
//     links (even to a file inside the root), links leaving the root, links to
//     directories (cycles), loops and dangling links are left out and counted
//     in skipped_symlinks; without openat2 every link is (the source's
//     fallback follows none);
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
#include <string_view>
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
  // false: source_root must not pass through a symbolic link (any component);
  // the root is opened one component at a time with O_NOFOLLOW, and a link is
  // refused (kInvalidArgument naming the link and its target). A dataset's
  // snapshot (snapshot.h) always sets false; true resolves the root first.
  bool follow_root_symlinks = true;
  // Called now and then (every few thousand files and at the end) from a
  // walker thread, never concurrently with itself: files and directories seen.
  std::function<void(uint64_t files, uint64_t directories)> on_progress;
};

Result<Manifest> BuildManifest(const ManifestBuildOptions& options);

// kInvalidArgument, naming the first component of the absolute `path` that is
// a symbolic link and what the whole path resolves to, if there is one; Ok
// otherwise (also when a component is missing or cannot be searched: other
// checks report those). A dataset's source path must not pass through a link
// (docs/source-and-identity.md, "Source paths and symbolic links").
Status RefuseSymlinkInPath(const std::string& path);

// The components of `path`, without empty ones (repeated or trailing
// slashes) and ".".
std::vector<std::string> PathComponents(std::string_view path);

// Opens the directory `path` (O_PATH) one component at a time with
// O_NOFOLLOW, from "/" or the working directory, so that no symbolic link on
// it is followed, not even one put there after a check: the source root's
// open for the snapshot and for reads. -1 with errno set on failure (ENOTDIR
// or ELOOP where a component is a link).
int OpenDirectoryWithoutSymlinks(const std::string& path);

}  // namespace granary

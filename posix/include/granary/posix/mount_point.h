#pragma once

// The directory a POSIX view is mounted on (docs/posix-view.md): checked and,
// after a crash, cleaned before a mount.
//
// PrepareMountPoint(dir):
//   - a stale FUSE mount at `dir` (its server died: stat fails ENOTCONN) is
//     unmounted lazily (umount2 MNT_DETACH as root, `fusermount3 -u -z`
//     otherwise), with a log line, and the checks below run on what is
//     underneath;
//   - `dir` must exist (kNotFound), be a directory (kInvalidArgument), not be
//     a mount point already (kFailedPrecondition naming what is mounted) and
//     be empty (kFailedPrecondition naming an entry).
// Returns the absolute, normalised path to mount on.
//
// Who calls it: `granary mount`, the sidecar's `mounts:`, tests.
//
// Thread safety: free functions, safe from any thread; two callers preparing
// the same directory at once may both find it free (mount then fails EBUSY
// for the second... or stacks; callers serialise per directory).

#include <string>

#include "granary/core/status.h"

namespace granary::posix {

Result<std::string> PrepareMountPoint(const std::string& dir);

// The file system type mounted exactly at absolute `dir` per
// /proc/self/mountinfo (e.g. "fuse.granary"); empty if none.
Result<std::string> MountedFileSystemAt(const std::string& dir);

// Lazily unmounts `dir` (umount2 MNT_DETACH as root, else fusermount3 -u -z).
Status LazyUnmount(const std::string& dir);

}  // namespace granary::posix

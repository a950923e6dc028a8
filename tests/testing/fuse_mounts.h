#pragma once

// Mounts a test leaves behind, taken away in teardown. A FUSE view whose
// server was killed (a sidecar with `mounts:` SIGKILLed at teardown, a
// `granary mount` that crashed) stays mounted, answering "Transport endpoint
// is not connected", and keeps its directory from being removed. The
// fixtures that mount (SidecarProcess, SlowFsMount) and TempDir, under which
// tests put their mount points, detach what is mounted lazily, whether or not
// its server is still there, also when the test failed half-way.
// scripts/check-test-leftovers checks after `make test` that none is left.
//
// Thread safety: functions of no shared state; call them from the test's
// thread.

#include <string>
#include <vector>

#include "granary/core/status.h"

namespace granary::testing {

struct MountEntry {
  std::string mount_point;  // octal escapes (\040) decoded
  std::string fs_type;      // "fuse.granary", "fuse.granary-slowfs", "ext4", ...
};

// Every mount of this process's mount namespace (/proc/self/mountinfo).
Result<std::vector<MountEntry>> ListMounts();

// Lazily detaches what is mounted at `mount_point`, if anything: FUSE mounts
// with `fusermount3 -uz` (allowed to the user who mounted them), others (and
// FUSE mounts fusermount3 could not detach) with umount2(MNT_DETACH), which
// needs root. OK when nothing is mounted there afterwards.
Status DetachMount(const std::string& mount_point);

// DetachMount for every mount at or under `dir`, deepest first.
Status DetachMountsUnder(const std::string& dir);

}  // namespace granary::testing

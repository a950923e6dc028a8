// tests/testing/fuse_mounts.h: what the fixtures that mount do in teardown.
// A FUSE server killed under its mount (granary-slowfs here, as a sidecar with
// `mounts:` is at teardown) leaves the mount dead; DetachMount and TempDir
// take it away, so neither a mount nor a granary-test-* directory is left.

#include "testing/fuse_mounts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "testing/daemon_process.h"
#include "testing/slowfs_mount.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using namespace std::chrono_literals;

bool MountedUnder(const std::string& dir, std::string* fs_type = nullptr) {
  Result<std::vector<MountEntry>> mounts = ListMounts();
  EXPECT_OK(mounts);
  if (!mounts.ok()) return false;
  for (const MountEntry& m : *mounts) {
    if (m.mount_point == dir || m.mount_point.rfind(dir + "/", 0) == 0) {
      if (fs_type != nullptr) *fs_type = m.fs_type;
      return true;
    }
  }
  return false;
}

TEST(FuseMountsTest, ListsMountsWithTheirTypes) {
  Result<std::vector<MountEntry>> mounts = ListMounts();
  ASSERT_OK(mounts);
  bool root = false;
  for (const MountEntry& m : *mounts) root = root || m.mount_point == "/";
  EXPECT_TRUE(root) << "/ is not in /proc/self/mountinfo";
  EXPECT_OK(DetachMount("/nonexistent/granary-test-mount"));  // nothing mounted: nothing to do
}

TEST(FuseMountsTest, ADeadMountIsDetached) {
  TempDir dir;
  const std::string mnt = dir.Join("mnt");
  dir.WriteFile("src/a", "bytes");
  SlowFsMount slow(GRANARY_SLOWFS_BINARY, dir.Join("src"), mnt);
  ASSERT_OK(slow.Start({}, dir.Join("slowfs.log")));
  std::string fs_type;
  ASSERT_TRUE(MountedUnder(mnt, &fs_type));
  EXPECT_EQ(fs_type, "fuse.granary-slowfs");

  ASSERT_OK(slow.KillServer());
  struct stat st {};
  EXPECT_NE(::stat(mnt.c_str(), &st), 0);
  EXPECT_EQ(errno, ENOTCONN) << "a killed FUSE server leaves its mount dead";
  ASSERT_TRUE(MountedUnder(mnt));

  EXPECT_OK(DetachMount(mnt));
  EXPECT_FALSE(MountedUnder(mnt));
  EXPECT_EQ(::stat(mnt.c_str(), &st), 0) << "the mount point is a plain directory again";
}

TEST(FuseMountsTest, TempDirDetachesADeadMountUnderItAndIsRemoved) {
  std::string path;
  {
    TempDir dir;
    path = dir.path();
    dir.WriteFile("src/a", "bytes");
    const std::string mnt = dir.Join("deep/mnt");
    std::filesystem::create_directories(mnt);
    // granary-slowfs without SlowFsMount, whose destructor would detach: only
    // the TempDir is left to do it.
    DaemonProcessOptions o;
    o.binary = GRANARY_SLOWFS_BINARY;
    o.args = {dir.Join("src"), mnt};
    o.log_path = dir.Join("slowfs.log");
    o.name = "granary-slowfs";
    Result<std::unique_ptr<DaemonProcess>> slowfs = DaemonProcess::Start(o);
    ASSERT_OK(slowfs);
    ASSERT_TRUE(WaitFor([&] { return MountedUnder(mnt) || !(*slowfs)->Running(); }, 20s))
        << (*slowfs)->LogTail();
    ASSERT_TRUE(MountedUnder(mnt)) << (*slowfs)->LogTail();
    ASSERT_OK((*slowfs)->Kill().status());
    ASSERT_TRUE(MountedUnder(mnt)) << "a killed FUSE server leaves its mount";
  }
  EXPECT_FALSE(MountedUnder(path));
  EXPECT_FALSE(std::filesystem::exists(path)) << path << " was left behind";
}

}  // namespace
}  // namespace granary::testing

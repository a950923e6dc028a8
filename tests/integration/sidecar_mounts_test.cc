// The sidecar's `mounts` option: a dataset mounted at start-up (the POSIX
// view, served in process from the sidecar's shared memory), over a real cache
// node and Redis.

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>

#include "granary/posix/mount_point.h"
#include "testing/cachenode_fixture.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::CacheCluster;
using ::granary::testing::DatasetOptions;
using ::granary::testing::SidecarOptions;
using ::granary::testing::SidecarProcess;
using ::granary::testing::TestDataset;
using namespace std::chrono_literals;

bool Mounted(const std::string& dir) {
  Result<std::string> type = posix::MountedFileSystemAt(dir);
  return type.ok() && !type->empty();
}

class SidecarMountsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(1));
    DatasetOptions d;
    d.files = 250;
    d.min_size = 100;
    d.max_size = 20000;
    d.files_per_directory = 50;
    auto ds = cluster_->CreateDataset(d);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    ds_ = std::move(*ds);
    ASSERT_OK(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady));
    dir_ = cluster_->dir().path() + "/view";
    ASSERT_EQ(::mkdir(dir_.c_str(), 0755), 0);
  }

  SidecarOptions Options(const std::string& mounts) {
    SidecarOptions o;
    o.store_url = cluster_->store_url();
    o.local_node_id = cluster_->node(0).id();
    o.window_bytes = "1MiB";
    o.arena_bytes = "32MiB";
    o.extra_yaml = "mounts: \"" + mounts + "\"\n";
    return o;
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::string dir_;
};

TEST_F(SidecarMountsTest, TheDatasetIsMountedReadOnlyAndUnmountedAtStop) {
  SidecarProcess sidecar(Options(ds_.name + ":" + dir_), cluster_->dir().path() + "/sidecar");
  ASSERT_OK(sidecar.StartAndWaitReady());
  ASSERT_TRUE(Mounted(dir_)) << "the view is mounted before the sidecar is ready";

  // Every file, by path, equals the snapshot.
  for (SampleId id = 0; id < ds_.sample_count(); ++id) {
    const std::string path = dir_ + "/" + ds_.manifest->PathOf(id);
    EXPECT_EQ(testing::ReadAll(path), ds_.contents[id]) << path;
  }
  // A second pass costs no FUSE request at all (granary_sidecar_posix_requests_total,
  // by op): each pass ends with a statvfs, whose count tells that the metrics
  // show everything before it.
  auto requests_after_statfs = [&](double statfs) {
    struct statvfs sv {};
    EXPECT_EQ(::statvfs(dir_.c_str(), &sv), 0);
    EXPECT_OK(sidecar
                  .WaitForMetric("granary_sidecar_posix_requests_total", {{"op", "statfs"}},
                                 [statfs](double v) { return v >= statfs; })
                  .status());
    std::map<std::string, double> by_op;
    for (const char* op : {"lookup", "getattr", "readdir", "readdirplus", "open", "read", "release",
                           "flush", "ioctl", "getxattr", "access", "statfs"}) {
      auto v = sidecar.MetricValue("granary_sidecar_posix_requests_total", {{"op", op}});
      EXPECT_TRUE(v.ok()) << op << ": " << v.status().ToString();
      by_op[op] = v.ok() ? *v : -1;
    }
    return by_op;
  };
  const std::map<std::string, double> cold = requests_after_statfs(1);
  EXPECT_GT(cold.at("read"), 0);
  EXPECT_GT(cold.at("lookup"), 0);
  for (SampleId id = 0; id < ds_.sample_count(); ++id) {
    const std::string path = dir_ + "/" + ds_.manifest->PathOf(id);
    EXPECT_EQ(testing::ReadAll(path), ds_.contents[id]) << path;
  }
  std::map<std::string, double> warm = requests_after_statfs(2);
  EXPECT_EQ(warm["statfs"], cold.at("statfs") + 1);
  warm["statfs"] = cold.at("statfs");
  EXPECT_EQ(warm, cold) << "a warm pass sent requests to the view";

  // Read-only.
  const std::string first = dir_ + "/" + ds_.manifest->PathOf(0);
  EXPECT_LT(::open(first.c_str(), O_WRONLY), 0);
  EXPECT_EQ(errno, EROFS);
  EXPECT_LT(::mkdir((dir_ + "/new").c_str(), 0755), 0);
  EXPECT_EQ(errno, EROFS);
  struct stat st {};
  ASSERT_EQ(::stat(first.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::getuid()) << "files show the dataset owner";
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), ds_.contents[0].size());

  auto exit = sidecar.Terminate();
  ASSERT_TRUE(exit.ok()) << exit.status().ToString();
  EXPECT_FALSE(Mounted(dir_)) << "SIGTERM unmounts";
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(SidecarMountsTest, ABadMountStopsTheStartWithTheReason) {
  // An unknown dataset.
  SidecarProcess unknown(Options("no-such-ds:" + dir_), cluster_->dir().path() + "/s1");
  ASSERT_OK(unknown.Start());
  auto code = unknown.process()->Wait(30s);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_TRUE(code->exited && code->code != 0);
  EXPECT_THAT(testing::ReadAll(unknown.log_path()), ::testing::HasSubstr("no-such-ds"));
  EXPECT_FALSE(Mounted(dir_));

  // A directory that is not empty.
  testing::WriteAll(dir_ + "/stray", "x");
  SidecarProcess busy(Options(ds_.name + ":" + dir_), cluster_->dir().path() + "/s2");
  ASSERT_OK(busy.Start());
  auto busy_code = busy.process()->Wait(30s);
  ASSERT_TRUE(busy_code.ok()) << busy_code.status().ToString();
  EXPECT_TRUE(busy_code->exited && busy_code->code != 0);
  EXPECT_THAT(testing::ReadAll(busy.log_path()), ::testing::HasSubstr("mounts"));
  EXPECT_FALSE(Mounted(dir_));
}

}  // namespace
}  // namespace granary

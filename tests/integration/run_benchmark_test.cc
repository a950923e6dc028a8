// bench/run-benchmark leaves nothing behind: killed with SIGTERM in the middle
// of a run (the slow source mounted, the cache node and sidecar up, a trainer
// reading), it stops every process it started, unmounts the slow source and
// removes its work directory; and a bad command line exits 2 before starting
// anything. Runs the real script with /usr/bin/python3 over this build's
// binaries and Python package.

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "testing/daemon_process.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

bool MountedUnder(const std::string& dir) {
  std::ifstream mounts("/proc/self/mounts");
  std::string device, point, rest;
  while (mounts >> device >> point && std::getline(mounts, rest)) {
    if (point.compare(0, dir.size(), dir) == 0) return true;
  }
  return false;
}

// Pids of processes (other than this one) whose command line mentions `text`.
std::vector<pid_t> ProcessesMentioning(const std::string& text) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  for (int i = 0; i < 1'000'000; ++i) {
    const dirent* e = readdir(proc);
    if (e == nullptr) break;
    char* end = nullptr;
    const long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == getpid()) continue;
    std::ifstream f("/proc/" + std::string(e->d_name) + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (cmdline.find(text) != std::string::npos) found.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return found;
}

DaemonProcessOptions Script(const TempDir& dir, std::vector<std::string> args) {
  DaemonProcessOptions o;
  o.binary = "/usr/bin/python3";
  o.args = {std::string(GRANARY_SOURCE_DIR) + "/bench/run-benchmark", "--build-dir",
            GRANARY_BUILD_DIR};
  o.args.insert(o.args.end(), args.begin(), args.end());
  o.log_path = dir.Join("run-benchmark.log");
  o.name = "run-benchmark";
  return o;
}

bool FuseUsable() {
  return access("/dev/fuse", R_OK | W_OK) == 0 &&
         (geteuid() == 0 || access("/usr/bin/fusermount3", X_OK) == 0);
}

TEST(RunBenchmarkTest, SigtermMidRunStopsEverythingAndUnmounts) {
  if (!FuseUsable()) GTEST_SKIP() << "no usable /dev/fuse";
  TempDir dir;
  const std::string work = dir.Join("work");
  // Enough files and epochs that the granary trainer is still reading when
  // the signal comes.
  auto p = DaemonProcess::Start(Script(
      dir, {"--files", "1000", "--epochs", "50", "--contenders", "granary", "--work-dir", work}));
  ASSERT_OK(p);
  // The granary contender's trainer has started: slowfs, cachenode, sidecar
  // and a trainer are all running.
  const bool reading = WaitFor(
      [&] { return access((work + "/granary.spec.json").c_str(), F_OK) == 0 || !(*p)->Running(); },
      120s, 50ms);
  ASSERT_TRUE(reading && (*p)->Running()) << (*p)->ReadLog();
  ASSERT_TRUE(MountedUnder(work));
  ASSERT_TRUE(WaitFor([&] { return ProcessesMentioning(work).size() >= 4; }, 30s))
      << "expected slowfs, cachenode, sidecar and a trainer under " << work;

  ASSERT_OK((*p)->Signal(SIGTERM));
  auto exit = (*p)->Wait(60s);
  ASSERT_OK(exit);
  EXPECT_FALSE(exit->ExitedWith(0)) << exit->ToString();
  EXPECT_THAT((*p)->ReadLog(), HasSubstr("stopping everything"));
  EXPECT_TRUE(WaitFor([&] { return ProcessesMentioning(work).empty(); }, 30s))
      << ProcessesMentioning(work).size() << " processes left";
  EXPECT_FALSE(MountedUnder(work));
  EXPECT_NE(access(work.c_str(), F_OK), 0) << work << " was not removed";
  if (MountedUnder(work)) umount2((work + "/mnt").c_str(), MNT_DETACH);
}

TEST(RunBenchmarkTest, BadCommandLinesExitTwoBeforeStartingAnything) {
  TempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--files", "0"}, "--files"},
      {{"--epochs", "x"}, "--epochs"},
      {{"--profile", "tape"}, "--profile"},
      {{"--contenders", "direct,ftp"}, "--contenders"},
      {{"--compute-ms", "-1"}, "--compute-ms"},
      {{"--chunk-size", "lots"}, "--chunk-size"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--work-dir", dir.Join("never")});
    auto p = DaemonProcess::Start(Script(dir, args));
    ASSERT_OK(p);
    auto exit = (*p)->Wait(60s);
    ASSERT_OK(exit);
    EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString() << " for " << c.message;
    EXPECT_THAT((*p)->ReadLog(), HasSubstr(c.message));
    EXPECT_NE(access(dir.Join("never").c_str(), F_OK), 0);
  }
  // A work directory that is not empty is refused (exit 1), and left alone.
  dir.WriteFile("busy/keep", "x");
  auto p = DaemonProcess::Start(Script(dir, {"--small", "--work-dir", dir.Join("busy")}));
  ASSERT_OK(p);
  auto exit = (*p)->Wait(60s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(1)) << exit->ToString();
  EXPECT_THAT((*p)->ReadLog(), HasSubstr("not empty"));
  EXPECT_EQ(ReadAll(dir.Join("busy/keep")), "x");
}

}  // namespace
}  // namespace granary::testing

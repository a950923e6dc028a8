// bench/run-benchmark leaves nothing behind: killed with SIGTERM in the middle
// of a run (the slow source mounted, the cache node and sidecar up, a trainer
// reading), it stops every process it started, unmounts the slow source and
// removes its work directory; and a bad command line exits 2 before starting
// anything. The litdata peer runs from the torch 2.x venv: named without it,
// the run fails at once saying how to make it; with it (when this machine has
// made it), a small run delivers every sample exactly once, its later epoch
// from LitData's local cache. Runs the real script with /usr/bin/python3 over
// this build's binaries and Python package.

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
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

// The torch 2.x venv is found by scripts/cached-venv under $GRANARY_BENCH_CACHE:
// an empty cache has none.
TEST(RunBenchmarkTest, LitDataWithoutTheTorch2VenvFailsBeforeStartingAnything) {
  TempDir dir;
  DaemonProcessOptions o =
      Script(dir, {"--small", "--contenders", "litdata", "--work-dir", dir.Join("never")});
  o.env = {"GRANARY_BENCH_CACHE=" + dir.Join("empty-cache")};
  auto p = DaemonProcess::Start(o);
  ASSERT_OK(p);
  auto exit = (*p)->Wait(60s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(1)) << exit->ToString();
  EXPECT_THAT((*p)->ReadLog(),
              HasSubstr("make it with scripts/cached-venv client/python/requirements/torch2.txt"));
  EXPECT_NE(access(dir.Join("never").c_str(), F_OK), 0) << "the run made its work directory";
}

TEST(RunBenchmarkTest, LitDataDeliversEveryEpochExactlyOnceAndThenReadsItsCache) {
  if (!FuseUsable()) GTEST_SKIP() << "no usable /dev/fuse";
  TempDir dir;
  DaemonProcessOptions venv;
  venv.binary = std::string(GRANARY_SOURCE_DIR) + "/scripts/cached-venv";
  venv.args = {"--no-install",
               std::string(GRANARY_SOURCE_DIR) + "/client/python/requirements/torch2.txt"};
  venv.log_path = dir.Join("cached-venv.log");
  venv.name = "cached-venv";
  auto found = DaemonProcess::Start(venv);
  ASSERT_OK(found);
  auto found_exit = (*found)->Wait(60s);
  ASSERT_OK(found_exit);
  if (found_exit->ExitedWith(3)) GTEST_SKIP() << (*found)->ReadLog();
  ASSERT_TRUE(found_exit->ExitedWith(0)) << (*found)->ReadLog();

  const std::string json = dir.Join("figures.json");
  auto p = DaemonProcess::Start(
      Script(dir, {"--files", "60", "--epochs", "2", "--contenders", "litdata", "--shard-size",
                   "1MiB", "--json", json, "--work-dir", dir.Join("work")}));
  ASSERT_OK(p);
  auto exit = (*p)->Wait(180s);
  ASSERT_OK(exit);
  ASSERT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << (*p)->ReadLog();
  const nlohmann::json figures = nlohmann::json::parse(ReadAll(json));
  const nlohmann::json& litdata = figures.at("contenders").at("litdata");
  EXPECT_TRUE(litdata.at("exactly_once").get<bool>()) << litdata.dump(2);
  ASSERT_EQ(litdata.at("epochs").size(), 2u);
  // The conversion read every file from the source, and wrote several chunks.
  EXPECT_EQ(litdata.at("setup_source").at("opens").get<int>(), 60);
  EXPECT_GE(litdata.at("needs").at("source_shard_bytes").get<double>(),
            figures.at("dataset").at("bytes").get<double>());
  // Epoch 0 copied the chunks from the source; epoch 1 read only the local cache.
  EXPECT_GE(litdata.at("epochs")[0].at("source_bytes").get<double>(),
            figures.at("dataset").at("bytes").get<double>());
  EXPECT_EQ(litdata.at("epochs")[1].at("source_bytes").get<double>(), 0.0);
  EXPECT_GE(litdata.at("needs").at("local_cache_bytes").get<double>(),
            figures.at("dataset").at("bytes").get<double>());
  EXPECT_FALSE(MountedUnder(dir.Join("work")));
}

}  // namespace
}  // namespace granary::testing

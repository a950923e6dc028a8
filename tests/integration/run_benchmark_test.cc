// bench/run-benchmark leaves nothing behind: killed with SIGTERM in the middle
// of a run (the slow source mounted, the cache node and sidecar up, a trainer
// reading), it stops every process it started, unmounts the slow source and
// removes its work directory; and a bad command line exits 2 before starting
// anything. With --cache-fraction (a dataset larger than the cache) a small run
// delivers every sample exactly once through a cache node holding half of it
// and prints each row's figures per warm epoch beside the bound, with the
// ratios the targets name. The litdata peer runs from the torch 2.x venv: named without it,
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
      {{"--cache-fraction", "0"}, "--cache-fraction"},
      {{"--cache-fraction", "1"}, "--cache-fraction"},
      {{"--cache-fraction", "1.5"}, "--cache-fraction"},
      {{"--cache-fraction", "-0.2"}, "--cache-fraction"},
      {{"--cache-fraction", "half"}, "--cache-fraction"},
      {{"--cache-fraction", "nan"}, "--cache-fraction"},
      {{"--cache-fraction", "0.5", "--epochs", "1"}, "--cache-fraction"},
      {{"--contenders", "granary_lru"}, "--cache-fraction"},
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

// A small dataset twice the cache: granary and granary_lru (and
// mosaic_streaming with its cache_limit, when the peers' venv is installed)
// against the bound. The sidecar's memory holds all of so small a dataset, so
// this checks the figures and the bytes, not the speed (bench/run-benchmark
// measures that on the default dataset, docs/benchmarks.md).
TEST(RunBenchmarkTest, CacheFractionRunsEachRowAgainstTheBound) {
  if (!FuseUsable()) GTEST_SKIP() << "no usable /dev/fuse";
  TempDir dir;
  DaemonProcessOptions venv;
  venv.binary = std::string(GRANARY_SOURCE_DIR) + "/scripts/bench-peers-venv";
  venv.args = {"--no-install"};
  venv.log_path = dir.Join("bench-peers-venv.log");
  venv.name = "bench-peers-venv";
  auto found = DaemonProcess::Start(venv);
  ASSERT_OK(found);
  auto found_exit = (*found)->Wait(60s);
  ASSERT_OK(found_exit);
  const bool mosaic = found_exit->ExitedWith(0);
  std::string contenders = "local_limit,granary,granary_lru";
  if (mosaic) contenders += ",mosaic_streaming";

  const std::string json = dir.Join("figures.json");
  // 1 MiB chunks and shards: the resident subset is whole chunks, and Mosaic
  // Streaming wants a cache_limit of at least four shards.
  auto p = DaemonProcess::Start(Script(
      dir, {"--small", "--cache-fraction", "0.5", "--chunk-size", "1MiB", "--shard-size", "1MiB",
            "--contenders", contenders, "--json", json, "--work-dir", dir.Join("work")}));
  ASSERT_OK(p);
  auto exit = (*p)->Wait(300s);
  ASSERT_OK(exit);
  const std::string log = (*p)->ReadLog();
  ASSERT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << log;
  EXPECT_THAT(log, HasSubstr("Larger than the cache: capacity"));
  EXPECT_THAT(log, HasSubstr("\nbound "));
  EXPECT_THAT(log, HasSubstr("granary warm / granary_lru warm"));
  EXPECT_THAT(log, HasSubstr("granary source bytes per warm epoch / (dataset - capacity)"));
  EXPECT_THAT(log, HasSubstr("granary bytes written per warm epoch / capacity"));
  EXPECT_THAT(log, HasSubstr("granary warm epoch time / bound"));

  const nlohmann::json figures = nlohmann::json::parse(ReadAll(json));
  const double bytes = figures.at("dataset").at("bytes").get<double>();
  const nlohmann::json& cache = figures.at("larger_than_cache");
  EXPECT_EQ(cache.at("fraction").get<double>(), 0.5);
  const double capacity = cache.at("capacity_bytes").get<double>();
  EXPECT_NEAR(capacity, 0.5 * bytes * 1.02, 1.0);
  EXPECT_NEAR(cache.at("missed_bytes_bound").get<double>(), bytes - capacity, 1.0);
  EXPECT_GT(cache.at("bound").at("seconds").get<double>(), 0.0);
  std::vector<std::string> rows = {"granary", "granary_lru"};
  if (mosaic) rows.push_back("mosaic_streaming");
  for (const std::string& name : rows) {
    SCOPED_TRACE(name);
    const nlohmann::json& c = figures.at("contenders").at(name);
    EXPECT_TRUE(c.at("exactly_once").get<bool>()) << c.dump(2);
    ASSERT_EQ(c.at("epochs").size(), 2u);
    const nlohmann::json& row = cache.at("rows").at(name);
    EXPECT_EQ(row.at("warm_epochs"), nlohmann::json::array({1}));
    EXPECT_GT(row.at("seconds").get<double>(), 0.0);
    EXPECT_GE(row.at("source_bytes").get<double>(), 0.0);
    // Bytes written into the cache per warm epoch: measured for every row.
    ASSERT_TRUE(row.at("written_bytes").is_number()) << row.dump(2);
    EXPECT_TRUE(row.at("source_vs_missed_bound").is_number());
    EXPECT_TRUE(row.at("written_vs_capacity").is_number());
    EXPECT_TRUE(row.at("time_vs_bound").is_number());
    EXPECT_TRUE(figures.at("ratios").contains("cache_" + name + "_source_vs_missed_bound"));
  }
  for (const std::string name : {"granary", "granary_lru"}) {
    SCOPED_TRACE(name);
    // The node's capacity is the one written into its configuration, and it
    // never holds more than that.
    const nlohmann::json& c = figures.at("contenders").at(name).at("cache");
    EXPECT_EQ(c.at("capacity_bytes").get<double>(), capacity);
    EXPECT_EQ(c.at("node_capacity_bytes").get<double>(), capacity);
    EXPECT_LE(c.at("used_bytes").get<double>(), capacity);
    EXPECT_GT(c.at("resident_payload_bytes").get<double>(), 0.0);
    // Everything the source served, staging included, over the whole run
    // (the node stages only its resident half before the first epoch).
    EXPECT_GT(figures.at("contenders").at(name).at("source_total").at("read_bytes").get<double>(),
              0.0);
  }
  EXPECT_TRUE(figures.at("ratios").contains("cache_granary_warm_vs_granary_lru_warm"));
  if (mosaic) {
    EXPECT_TRUE(figures.at("ratios").contains("cache_granary_warm_vs_mosaic_streaming_warm"));
    EXPECT_EQ(figures.at("contenders").at("mosaic_streaming").at("cache").at("capacity_bytes"),
              capacity);
  }
  EXPECT_FALSE(MountedUnder(dir.Join("work")));
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

// granary-slowfs (bench/slowfs/): the option checks and the throttles as
// units, then the real binary on a real FUSE mount: bytes pass through,
// counters are exact for a known sequence of operations, the latency, the
// bandwidth cap and the concurrency cap are applied (gross timing bounds
// only), everything that would write is EROFS, SIGTERM unmounts and writes
// the final counters, and bad command lines exit 2 saying what to fix.

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "slow_fs.h"
#include "slowfs_options.h"
#include "testing/daemon_process.h"
#include "testing/test_util.h"
#include "throttle.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- options and throttles ------------------------------------------------------------

TEST(SlowFsOptionsTest, ProfilesAndUnknownProfile) {
  auto nfs = FindSlowFsProfile("nfs");
  ASSERT_OK(nfs);
  EXPECT_EQ(nfs->latency_ms, 1.0);
  EXPECT_EQ(nfs->bandwidth_mb_s, 200.0);
  EXPECT_EQ(nfs->max_concurrency, 16u);
  auto object = FindSlowFsProfile("object");
  ASSERT_OK(object);
  EXPECT_EQ(object->latency_ms, 20.0);
  auto bad = FindSlowFsProfile("lustre");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'lustre'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("nfs, object, none"));
}

TEST(SlowFsOptionsTest, ValidateRefusesBadValuesAndPaths) {
  TempDir dir;
  dir.WriteFile("src/a", "x");
  ASSERT_EQ(mkdir(dir.Join("mnt").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.Join("src/inner").c_str(), 0755), 0);
  auto options = [&] {
    SlowFsOptions o;
    o.source = dir.Join("src");
    o.mountpoint = dir.Join("mnt");
    o.profile = *FindSlowFsProfile("nfs");
    return o;
  };
  SlowFsOptions good = options();
  good.source = dir.Join("src/../src");
  ASSERT_OK(ValidateSlowFsOptions(good));
  EXPECT_EQ(good.source, dir.Join("src"));

  struct Case {
    std::function<void(SlowFsOptions&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](SlowFsOptions& o) { o.profile.latency_ms = -1; }, "--latency-ms"},
      {[](SlowFsOptions& o) { o.profile.latency_ms = NAN; }, "--latency-ms"},
      {[](SlowFsOptions& o) { o.profile.latency_ms = 1e9; }, "0 to 60000"},
      {[](SlowFsOptions& o) { o.profile.bandwidth_mb_s = -5; }, "--bandwidth-mb-s"},
      {[](SlowFsOptions& o) { o.profile.bandwidth_mb_s = INFINITY; }, "--bandwidth-mb-s"},
      {[](SlowFsOptions& o) { o.profile.max_concurrency = 5000; }, "--max-concurrency"},
      {[&](SlowFsOptions& o) { o.source = dir.Join("nope"); }, "does not exist"},
      {[&](SlowFsOptions& o) { o.source = dir.Join("src/a"); }, "not a directory"},
      {[](SlowFsOptions& o) { o.source.clear(); }, "is empty"},
      {[&](SlowFsOptions& o) { o.mountpoint = dir.Join("nope"); }, "does not exist"},
      {[&](SlowFsOptions& o) { o.mountpoint = dir.Join("src/inner"); }, "inside it"},
      {[&](SlowFsOptions& o) { o.mountpoint = dir.Join("src"); }, "inside it"},
  };
  for (const Case& c : cases) {
    SlowFsOptions o = options();
    c.change(o);
    const Status s = ValidateSlowFsOptions(o);
    EXPECT_FALSE(s.ok()) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

TEST(ThrottleTest, TokenBucketHoldsTheRateRoughly) {
  TokenBucket unlimited(0, 0);
  EXPECT_EQ(unlimited.Acquire(1 << 30).count(), 0);

  // 20 MB/s, burst 100 kB: 2 MB in 4 threads takes about (2 MB - 100 kB) / 20 MB/s = 95 ms.
  TokenBucket bucket(20e6, 100e3);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&bucket] {
      for (int i = 0; i < 10; ++i) bucket.Acquire(50'000);
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = SecondsSince(start);
  EXPECT_GE(seconds, 0.08);
  EXPECT_LT(seconds, 5.0);
}

TEST(ThrottleTest, ConcurrencyGateCapsHoldersAndCountsWaits) {
  ConcurrencyGate gate(2);
  std::atomic<int> inside{0};
  std::atomic<int> worst{0};
  std::atomic<int> waited{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      if (gate.Enter()) ++waited;
      const int now = ++inside;
      int w = worst.load();
      while (now > w && !worst.compare_exchange_weak(w, now)) {
      }
      std::this_thread::sleep_for(20ms);
      --inside;
      gate.Leave();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(worst.load(), 2);
  EXPECT_EQ(gate.peak_in_flight(), 2u);
  EXPECT_GE(waited.load(), 1);
  EXPECT_EQ(gate.in_flight(), 0u);
}

// ---- the real mount -------------------------------------------------------------------

bool Mounted(const std::string& path) {
  std::ifstream mounts("/proc/self/mounts");
  std::string device, point, rest;
  while (mounts >> device >> point && std::getline(mounts, rest)) {
    if (point == path) return true;
  }
  return false;
}

bool FuseUsable() {
  const int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  close(fd);
  return geteuid() == 0 || access("/usr/bin/fusermount3", X_OK) == 0;
}

nlohmann::json ReadStats(const std::string& mnt) {
  std::ifstream f(mnt + "/" + kSlowFsStatsName);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// A granary-slowfs process serving dir/src at dir/mnt. The destructor stops it
// and, if it could not unmount (killed), detaches the mount so that TempDir can
// remove the tree.
class SlowFsMount {
 public:
  SlowFsMount(const TempDir& dir, std::vector<std::string> flags) {
    mnt_ = dir.Join("mnt");
    mkdir(mnt_.c_str(), 0755);
    DaemonProcessOptions o;
    o.binary = GRANARY_SLOWFS_BINARY;
    o.args = {dir.Join("src"), mnt_, "--stats-file", dir.Join("final.json")};
    o.args.insert(o.args.end(), flags.begin(), flags.end());
    o.log_path = dir.Join("slowfs.log");
    o.name = "granary-slowfs";
    auto p = DaemonProcess::Start(std::move(o));
    if (!p.ok()) {
      ADD_FAILURE() << p.status().ToString();
      return;
    }
    process_ = std::move(*p);
    ready_ =
        WaitFor([&] { return !ReadStats(mnt_).is_discarded() || !process_->Running(); }, 20s) &&
        process_->Running();
    if (!ready_) ADD_FAILURE() << "granary-slowfs did not serve:\n" << process_->ReadLog();
  }
  ~SlowFsMount() {
    if (process_ != nullptr) (void)process_->Terminate(20s);
    if (Mounted(mnt_)) umount2(mnt_.c_str(), MNT_DETACH);
  }

  bool ready() const { return ready_; }
  const std::string& mnt() const { return mnt_; }
  std::string Path(const std::string& rel) const { return mnt_ + "/" + rel; }
  DaemonProcess& process() { return *process_; }
  nlohmann::json Stats() const { return ReadStats(mnt_); }

 private:
  std::string mnt_;
  std::unique_ptr<DaemonProcess> process_;
  bool ready_ = false;
};

class SlowFsMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!FuseUsable()) GTEST_SKIP() << "no usable /dev/fuse (or not root without fusermount3)";
    dir_.WriteFile("src/top.bin", Bytes("top", 3000));
    dir_.WriteFile("src/class1/a.JPEG", Bytes("a", 300'000));
    dir_.WriteFile("src/class1/b.JPEG", Bytes("b", 5000));
    dir_.WriteFile("src/class2/c.JPEG", Bytes("c", 7));
    ASSERT_EQ(symlink("class1/a.JPEG", dir_.Join("src/link").c_str()), 0);
  }

  // Counters minus those in `before`, for the counting keys.
  static nlohmann::json Delta(const nlohmann::json& before, const nlohmann::json& after) {
    nlohmann::json d;
    for (const char* k : {"opens", "stats", "readdirs", "reads", "read_bytes", "readlinks",
                          "refused_writes", "errors"}) {
      d[k] = after[k].get<int64_t>() - before[k].get<int64_t>();
    }
    return d;
  }

  TempDir dir_;
};

std::string ReadWithSyscalls(const std::string& path, size_t buffer) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "<open failed: " + std::string(strerror(errno)) + ">";
  std::string out;
  std::string buf(buffer, '\0');
  for (int i = 0; i < 1000; ++i) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

TEST_F(SlowFsMountTest, PassesBytesThroughAndCountsExactly) {
  SlowFsMount fs(dir_, {"--profile", "none"});
  ASSERT_TRUE(fs.ready());
  const nlohmann::json start = fs.Stats();
  EXPECT_EQ(start["profile"], "none");
  // Reading the counters costs nothing.
  EXPECT_EQ(Delta(start, fs.Stats())["stats"], 0);

  // One open of a file at the root, one read with a buffer larger than the
  // file (a short read: the file ends), one more read that returns 0, close.
  nlohmann::json before = fs.Stats();
  EXPECT_EQ(ReadWithSyscalls(fs.Path("top.bin"), 1 << 20), Bytes("top", 3000));
  nlohmann::json d = Delta(before, fs.Stats());
  EXPECT_EQ(d["opens"], 1);
  EXPECT_EQ(d["reads"], 2);
  EXPECT_EQ(d["read_bytes"], 3000);
  EXPECT_EQ(d["readdirs"], 0);
  // The lookup of top.bin and the permission check's getattr.
  EXPECT_EQ(d["stats"], 2);

  // A 300,000-byte file read in 64 KiB reads: 5 reads with data, 1 at the end.
  before = fs.Stats();
  EXPECT_EQ(ReadWithSyscalls(fs.Path("class1/a.JPEG"), 64 * 1024), Bytes("a", 300'000));
  d = Delta(before, fs.Stats());
  EXPECT_EQ(d["opens"], 1);
  EXPECT_EQ(d["reads"], 6);
  EXPECT_EQ(d["read_bytes"], 300'000);

  // stat() of a file at the root: a lookup and a getattr; of a missing one: a
  // failed lookup.
  before = fs.Stats();
  struct stat st {};
  ASSERT_EQ(stat(fs.Path("top.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 3000);
  EXPECT_NE(stat(fs.Path("missing").c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  d = Delta(before, fs.Stats());
  EXPECT_EQ(d["stats"], 3);
  EXPECT_EQ(d["errors"], 1);
  EXPECT_EQ(d["opens"], 0);

  // A listing of the root: one readdir; .slowfs-stats is not in it.
  before = fs.Stats();
  std::vector<std::string> names;
  DIR* root = opendir(fs.mnt().c_str());
  ASSERT_NE(root, nullptr);
  for (int i = 0; i < 100; ++i) {
    const dirent* e = readdir(root);
    if (e == nullptr) break;
    names.emplace_back(e->d_name);
  }
  closedir(root);
  d = Delta(before, fs.Stats());
  EXPECT_EQ(d["readdirs"], 1);
  EXPECT_EQ(d["stats"], 0);
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre(".", "..", "top.bin", "class1", "class2", "link"));

  // A symlink inside the tree is a symlink, followed by the kernel.
  before = fs.Stats();
  EXPECT_EQ(ReadWithSyscalls(fs.Path("link"), 1 << 20), Bytes("a", 300'000));
  d = Delta(before, fs.Stats());
  EXPECT_EQ(d["readlinks"], 1);
  EXPECT_EQ(d["opens"], 1);
}

TEST_F(SlowFsMountTest, EverythingThatWritesIsReadOnly) {
  SlowFsMount fs(dir_, {"--profile", "none"});
  ASSERT_TRUE(fs.ready());
  auto erofs = [](int rc) { return rc < 0 && errno == EROFS; };
  EXPECT_TRUE(erofs(open(fs.Path("top.bin").c_str(), O_WRONLY)));
  EXPECT_TRUE(erofs(open(fs.Path("top.bin").c_str(), O_RDWR)));
  EXPECT_TRUE(erofs(open(fs.Path("top.bin").c_str(), O_RDONLY | O_TRUNC)));
  EXPECT_TRUE(erofs(open(fs.Path("new").c_str(), O_WRONLY | O_CREAT, 0644)));
  EXPECT_TRUE(erofs(mkdir(fs.Path("d").c_str(), 0755)));
  EXPECT_TRUE(erofs(unlink(fs.Path("top.bin").c_str())));
  EXPECT_TRUE(erofs(rmdir(fs.Path("class2").c_str())));
  EXPECT_TRUE(erofs(rename(fs.Path("top.bin").c_str(), fs.Path("x").c_str())));
  EXPECT_TRUE(erofs(truncate(fs.Path("top.bin").c_str(), 0)));
  EXPECT_TRUE(erofs(chmod(fs.Path("top.bin").c_str(), 0777)));
  EXPECT_TRUE(erofs(symlink("top.bin", fs.Path("s").c_str())));
  EXPECT_TRUE(erofs(link(fs.Path("top.bin").c_str(), fs.Path("l").c_str())));
  EXPECT_TRUE(erofs(open(fs.Path(kSlowFsStatsName).c_str(), O_WRONLY)));
  // The source is untouched.
  EXPECT_EQ(ReadAll(dir_.Join("src/top.bin")), Bytes("top", 3000));
  EXPECT_EQ(access(dir_.Join("src/new").c_str(), F_OK), -1);
  EXPECT_EQ(access(dir_.Join("src/x").c_str(), F_OK), -1);
}

TEST_F(SlowFsMountTest, LatencyIsPaidPerOperation) {
  SlowFsMount fs(dir_, {"--latency-ms", "40", "--bandwidth-mb-s", "0", "--max-concurrency", "0"});
  ASSERT_TRUE(fs.ready());
  EXPECT_EQ(fs.Stats()["latency_ms"], 40.0);
  // stat() is two operations (lookup, getattr): at least 80 ms.
  auto start = Clock::now();
  struct stat st {};
  ASSERT_EQ(stat(fs.Path("top.bin").c_str(), &st), 0);
  EXPECT_GE(SecondsSince(start), 0.075);
  // Reading the counters is free.
  start = Clock::now();
  for (int i = 0; i < 5; ++i) ASSERT_FALSE(fs.Stats().is_discarded());
  EXPECT_LT(SecondsSince(start), 0.15);
}

TEST_F(SlowFsMountTest, BandwidthCapIsRoughlyHonoured) {
  dir_.WriteFile("src/big.bin", Bytes("big", 4'000'000));
  SlowFsMount fs(dir_, {"--latency-ms", "0", "--bandwidth-mb-s", "10", "--max-concurrency", "0"});
  ASSERT_TRUE(fs.ready());
  // 4 MB at 10 MB/s: about 0.4 s (less the 256 KiB burst). Gross bounds only.
  const auto start = Clock::now();
  EXPECT_EQ(ReadWithSyscalls(fs.Path("big.bin"), 1 << 20), Bytes("big", 4'000'000));
  const double seconds = SecondsSince(start);
  EXPECT_GE(seconds, 0.25);
  EXPECT_LT(seconds, 10.0);
}

TEST_F(SlowFsMountTest, ConcurrencyCapMakesOperationsWait) {
  SlowFsMount fs(dir_, {"--latency-ms", "50", "--bandwidth-mb-s", "0", "--max-concurrency", "2"});
  ASSERT_TRUE(fs.ready());
  // 8 threads stat the same file: each stat is 2 operations of 50 ms, 16 in
  // all, at most 2 at a time: at least 8 × 50 ms.
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      struct stat st {};
      if (stat(fs.Path("class1/b.JPEG").c_str(), &st) != 0) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(SecondsSince(start), 0.35);
  const nlohmann::json s = fs.Stats();
  EXPECT_LE(s["peak_in_flight"].get<int>(), 2);
  EXPECT_GT(s["waits"].get<int>(), 0);
}

TEST_F(SlowFsMountTest, SigtermUnmountsAndWritesTheFinalCounters) {
  SlowFsMount fs(dir_, {"--profile", "none"});
  ASSERT_TRUE(fs.ready());
  ASSERT_EQ(ReadWithSyscalls(fs.Path("class2/c.JPEG"), 4096), Bytes("c", 7));
  const nlohmann::json live = fs.Stats();
  ASSERT_TRUE(Mounted(fs.mnt()));
  auto exit = fs.process().Terminate(20s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << fs.process().ReadLog();
  EXPECT_FALSE(Mounted(fs.mnt()));
  const nlohmann::json final_counts = nlohmann::json::parse(ReadAll(dir_.Join("final.json")));
  for (const char* k : {"opens", "stats", "readdirs", "reads", "read_bytes"}) {
    EXPECT_EQ(final_counts[k], live[k]) << k;
  }
  EXPECT_EQ(final_counts["read_bytes"], 7);
  EXPECT_THAT(fs.process().ReadLog(), HasSubstr("served 1 opens"));
}

Result<ExitStatus> RunSlowFs(const TempDir& dir, std::vector<std::string> args, std::string* log) {
  DaemonProcessOptions o;
  o.binary = GRANARY_SLOWFS_BINARY;
  o.args = std::move(args);
  o.log_path = dir.Join("bad.log");
  auto p = DaemonProcess::Start(std::move(o));
  if (!p.ok()) return p.status();
  auto exit = (*p)->Wait(30s);
  *log = (*p)->ReadLog();
  return exit;
}

TEST(SlowFsCommandLineTest, BadFlagsExitTwoSayingWhatToFix) {
  TempDir dir;
  dir.WriteFile("src/a", "x");
  ASSERT_EQ(mkdir(dir.Join("mnt").c_str(), 0755), 0);
  const std::string src = dir.Join("src");
  const std::string mnt = dir.Join("mnt");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "required"},
      {{src}, "mountpoint"},
      {{src, mnt, "--profile", "tape"}, "unknown --profile 'tape'"},
      {{src, mnt, "--latency-ms", "-3"}, "--latency-ms"},
      {{src, mnt, "--latency-ms", "fast"}, "--latency-ms"},
      {{src, mnt, "--bandwidth-mb-s", "-1"}, "--bandwidth-mb-s"},
      {{src, mnt, "--max-concurrency", "100000"}, "--max-concurrency"},
      {{src, mnt, "--max-concurrency", "-2"}, "--max-concurrency"},
      {{dir.Join("missing"), mnt}, "does not exist"},
      {{dir.Join("src/a"), mnt}, "not a directory"},
      {{src, dir.Join("src")}, "inside it"},
      {{src, mnt, "--bogus"}, "bogus"},
  };
  for (const Case& c : cases) {
    std::string log;
    auto exit = RunSlowFs(dir, c.args, &log);
    ASSERT_OK(exit);
    EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString() << " for " << c.message << ": " << log;
    EXPECT_THAT(log, HasSubstr(c.message));
    EXPECT_FALSE(Mounted(mnt));
  }
}

}  // namespace
}  // namespace granary::testing

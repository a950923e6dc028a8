// The POSIX view end to end: real granary-cachenode processes and Redis
// (CacheCluster), a real granary-sidecar (SidecarProcess), real FUSE mounts
// under the cluster's TempDir, read through SessionContentReader in process
// and through the real `granary mount` binary. Covers: every file equal to
// the snapshot with the source moved away (os.walk + open().read() and an
// ImageFolder-style walk under /usr/bin/python3, and std::filesystem), source
// symlinks that point outside never shown, a cache node killed during a full
// read, a sidecar restarted under a read (and one that stays down: EIO after
// the reconnect timeout; through `granary mount`, reads from the cache nodes
// and then the source instead, EIO only with --no-fallback), SIGTERM unmounting cleanly, a stale
// mount from a SIGKILLed run cleaned by the next start, the background mode, and the bad arguments.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "granary/posix/mount_point.h"
#include "granary/posix/posix_view.h"
#include "session_reader.h"  // cli/src: granary mount's reader
#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::posix {
namespace {

namespace fs = std::filesystem;
using cli::SessionContentReader;
using cli::SessionReaderOptions;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::CacheCluster;
using testing::DaemonProcess;
using testing::DaemonProcessOptions;
using testing::SidecarOptions;
using testing::SidecarProcess;
using testing::TestDataset;

// Reads a whole file; sets *error to errno (0 when it was read).
std::string ReadWhole(const std::string& path, int* error) {
  std::string out;
  *error = 0;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = errno;
    return out;
  }
  char buf[1 << 16];
  for (int i = 0; i < 1'000'000; ++i) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      *error = errno;
      break;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

std::string ReadWhole(const std::string& path) {
  int error = 0;
  std::string s = ReadWhole(path, &error);
  EXPECT_EQ(error, 0) << path << ": " << std::strerror(error);
  return s;
}

bool Mounted(const std::string& dir) {
  auto fstype = MountedFileSystemAt(dir);
  return fstype.ok() && *fstype == "fuse.granary";
}

class PosixMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    testing::DatasetOptions d;
    d.name = "imgs";
    d.files = 600;
    d.min_size = 1000;
    d.max_size = 24'000;
    d.files_per_directory = 100;  // six class folders d000..d005
    d.chunk_size = 256 * 1024;
    // Symlink tricks at the source: none of these may appear in the view.
    d.before_snapshot = [](const std::string& root) {
      std::error_code ec;
      fs::create_symlink("/etc/passwd", root + "/d000/passwd", ec);
      fs::create_directory_symlink("/etc", root + "/d001/etc", ec);
      fs::create_symlink("../../outside.bin", root + "/d002/escape.bin", ec);
      fs::create_symlink(root + "/nowhere", root + "/d003/dangling", ec);
      fs::create_directory_symlink("..", root + "/d004/up", ec);
    };
    auto ds = cluster_->CreateDataset(d);
    ASSERT_OK(ds);
    ds_ = std::move(*ds);
    ASSERT_OK(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady));
    StartSidecar();
  }

  void StartSidecar() {
    SidecarOptions o;
    o.store_url = cluster_->store_url();
    o.local_node_id = cluster_->node(0).id();
    o.arena_bytes = "48MiB";
    o.window_bytes = "8MiB";
    const std::string dir = cluster_->dir().Join("sidecar");
    fs::create_directories(dir);
    if (sidecar_ == nullptr) sidecar_ = std::make_unique<SidecarProcess>(o, dir);
    ASSERT_OK(sidecar_->StartAndWaitReady());
  }

  std::string NewDir(const std::string& name) {
    const std::string dir = cluster_->dir().Join(name);
    fs::create_directories(dir);
    return dir;
  }

  struct LibraryMount {
    std::shared_ptr<SessionContentReader> reader;
    std::unique_ptr<PosixView> view;
  };

  LibraryMount MountLibrary(const std::string& dir, milliseconds reconnect = seconds(20),
                            uint32_t window = 64) {
    LibraryMount m;
    SessionReaderOptions ro;
    ro.dataset = ds_.name;
    ro.session.socket_path = sidecar_->socket_path();
    ro.session.call_timeout = seconds(30);
    ro.reconnect_timeout = reconnect;
    auto reader = SessionContentReader::Open(ro);
    EXPECT_OK(reader);
    if (!reader.ok()) return m;
    m.reader = std::move(*reader);
    PosixViewOptions vo;
    vo.mount_point = dir;
    vo.dataset = ds_.name;
    vo.uid = getuid();
    vo.gid = getgid();
    vo.threads = 4;
    vo.readahead.window_samples = window;
    auto view = PosixView::Mount(vo, ds_.manifest, m.reader);
    EXPECT_OK(view);
    if (view.ok()) m.view = std::move(*view);
    return m;
  }

  // `granary [--store URL] mount ...` as a real process, its output in a log.
  std::unique_ptr<DaemonProcess> StartCli(std::vector<std::string> args, const std::string& log) {
    DaemonProcessOptions o;
    o.binary = GRANARY_CLI_BINARY;
    o.args = {"--store", cluster_->store_url()};
    o.args.insert(o.args.end(), args.begin(), args.end());
    o.log_path = cluster_->dir().Join(log);
    o.name = "granary mount";
    o.env = {"GRANARY_LOG_LEVEL=info"};
    auto p = DaemonProcess::Start(o);
    EXPECT_OK(p);
    return p.ok() ? std::move(*p) : nullptr;
  }

  std::vector<std::string> MountArgs(const std::string& dir, bool foreground = true) {
    std::vector<std::string> a = {"mount", ds_.name, dir, "--socket", sidecar_->socket_path()};
    if (foreground) a.push_back("--foreground");
    return a;
  }

  // Every file under `mnt` equals the snapshot, and nothing else is there.
  void ExpectTreeEqualsSnapshot(const std::string& mnt) {
    size_t files = 0;
    for (auto it = fs::recursive_directory_iterator(mnt); it != fs::recursive_directory_iterator();
         ++it) {
      EXPECT_FALSE(it->is_symlink()) << it->path();
      if (it->is_directory()) continue;
      const std::string rel = fs::relative(it->path(), mnt).string();
      auto id = ds_.manifest->Find(rel);
      ASSERT_OK(id);
      ASSERT_EQ(ReadWhole(it->path().string()), ds_.contents[*id]) << rel;
      ++files;
    }
    EXPECT_EQ(files, ds_.sample_count());
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

TEST_F(PosixMountTest, EveryFileEqualsTheSnapshotWithTheSourceGone) {
  const std::string mnt = NewDir("mnt");
  LibraryMount m = MountLibrary(mnt);
  ASSERT_NE(m.view, nullptr);
  // The source is unreachable from here on: any metadata call or read there
  // would fail (fall-through would show up as an EIO or a wrong tree).
  const std::string away = ds_.root + ".away";
  ASSERT_EQ(rename(ds_.root.c_str(), away.c_str()), 0);
  // The reference tree, written from the snapshot's bytes.
  const std::string ref = NewDir("reference");
  for (SampleId id = 0; id < ds_.sample_count(); ++id) {
    const std::string path = ref + "/" + ds_.manifest->PathOf(id);
    fs::create_directories(fs::path(path).parent_path());
    testing::WriteAll(path, ds_.contents[id]);
  }
  const std::string cmd = std::string("/usr/bin/python3 ") + GRANARY_POSIX_TESTS_DIR +
                          "/walk_and_read.py " + mnt + " " + ref + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) output += buf;
  const int rc = pclose(pipe);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("600 files ok"), std::string::npos) << output;
  ExpectTreeEqualsSnapshot(mnt);
  // The symlinks of the source are not there, whatever they pointed at.
  struct stat st;
  for (const char* p : {"d000/passwd", "d001/etc", "d002/escape.bin", "d003/dangling", "d004/up"}) {
    EXPECT_NE(lstat((mnt + "/" + p).c_str(), &st), 0) << p;
  }
  // Nothing came from the source; opens hinted the files that follow.
  auto from_source =
      sidecar_->MetricValue("granary_sidecar_fetched_samples_total", {{"from", "source"}});
  if (from_source.ok()) {
    EXPECT_EQ(*from_source, 0);
  }
  EXPECT_GT(m.view->counters().hinted, 0u);
  EXPECT_GT(m.reader->counters().hint_batches, 0u);
  EXPECT_EQ(m.view->counters().read_errors, 0u);
  ASSERT_EQ(rename(away.c_str(), ds_.root.c_str()), 0);
  m.view->Stop();
  EXPECT_FALSE(Mounted(mnt));
}

// The slow source's counters (.slowfs-stats: one JSON object), by key.
[[maybe_unused]] std::map<std::string, uint64_t> SlowFsCounts(const std::string& mnt) {
  std::map<std::string, uint64_t> out;
  std::ifstream f(mnt + "/.slowfs-stats");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* key : {"opens", "stats", "readdirs", "reads", "read_bytes", "readlinks"}) {
    const size_t at = text.find("\"" + std::string(key) + "\":");
    if (at != std::string::npos) {
      out[key] = std::strtoull(text.c_str() + at + std::strlen(key) + 3, nullptr, 10);
    }
  }
  return out;
}

// Runs a command line through the shell: its exit code and its output.
[[maybe_unused]] int RunShell(const std::string& cmd, std::string* output) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[4096];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) *output += buf;
  return pclose(pipe);
}

// Over the slow source: a dataset whose source is the benchmark's slow source
// (granary-slowfs, which counts every operation it serves). After the
// snapshot the source is never listed again; once staged, an os.walk +
// open().read() and an ImageFolder over `granary mount` equal the source byte
// for byte without a single operation at the source.
TEST_F(PosixMountTest, OverTheSlowSourceNoSourceOperationAfterStaging) {
#ifndef GRANARY_SLOWFS_BINARY
  GTEST_SKIP() << "granary-slowfs is not built (libfuse3-dev missing)";
#else
  // The source: class folders of a few hundred files.
  const std::string src = NewDir("slow-src");
  constexpr int kFiles = 240;
  uint64_t total_bytes = 0;
  for (int i = 0; i < kFiles; ++i) {
    const std::string rel = "c" + std::to_string(i % 4) + "/img_" + std::to_string(i) + ".jpg";
    const std::string bytes = testing::Bytes(rel, 500 + static_cast<size_t>(i) * 131);
    fs::create_directories(fs::path(src + "/" + rel).parent_path());
    testing::WriteAll(src + "/" + rel, bytes);
    total_bytes += bytes.size();
  }
  const std::string slow = NewDir("slow-mnt");
  DaemonProcessOptions so;
  so.binary = GRANARY_SLOWFS_BINARY;
  so.args = {src, slow, "--latency-ms", "1"};
  so.log_path = cluster_->dir().Join("slowfs.log");
  so.name = "granary-slowfs";
  auto slowfs = DaemonProcess::Start(so);
  ASSERT_OK(slowfs);
  struct Detach {  // however the test ends, nothing stays mounted
    std::string dir;
    ~Detach() {
      if (Mounted(dir)) umount2(dir.c_str(), MNT_DETACH);
    }
  } detach_slow{slow};
  ASSERT_TRUE(testing::WaitFor([&] { return SlowFsCounts(slow).count("opens") == 1; }, seconds(20)))
      << (*slowfs)->ReadLog();

  // The snapshot walks the slow source; then staging reads every file once.
  const std::string cli = std::string(GRANARY_CLI_BINARY) + " --store " + cluster_->store_url();
  std::string out;
  ASSERT_EQ(RunShell(cli + " dataset create slow --source " + slow + " --chunk-size 64KiB", &out),
            0)
      << out;
  const std::map<std::string, uint64_t> snapshot = SlowFsCounts(slow);
  EXPECT_GT(snapshot.at("readdirs"), 0u);
  ASSERT_EQ(RunShell(cli + " dataset wait slow --timeout 2m", &out), 0) << out;
  const std::map<std::string, uint64_t> staged = SlowFsCounts(slow);
  EXPECT_EQ(staged.at("readdirs"), snapshot.at("readdirs")) << "a listing after the snapshot";
  EXPECT_EQ(staged.at("opens") - snapshot.at("opens"), uint64_t{kFiles})
      << "each file is read from the source once";
  EXPECT_EQ(staged.at("read_bytes") - snapshot.at("read_bytes"), total_bytes);

  // Over the mount (the granary binary), as unmodified Python reads it.
  const std::string mnt = NewDir("slow-view");
  auto mount = StartCli({"mount", "slow", mnt, "--socket", sidecar_->socket_path(), "--foreground"},
                        "mount-slow.log");
  ASSERT_NE(mount, nullptr);
  ASSERT_TRUE(testing::WaitFor([&] { return Mounted(mnt); }, seconds(20))) << mount->ReadLog();
  out.clear();
  const int rc = RunShell("/usr/bin/python3 " + std::string(GRANARY_POSIX_TESTS_DIR) +
                              "/walk_and_read.py " + mnt + " " + src,
                          &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(std::to_string(kFiles) + " files ok"), std::string::npos) << out;
  const std::map<std::string, uint64_t> after = SlowFsCounts(slow);
  for (const auto& [key, value] : staged) {
    EXPECT_EQ(after.at(key), value) << key << " at the source while reading over the mount";
  }
  auto exit = mount->Terminate(seconds(20));
  ASSERT_OK(exit);
  EXPECT_FALSE(Mounted(mnt));
  ASSERT_OK((*slowfs)->Terminate(seconds(20)));
#endif
}

TEST_F(PosixMountTest, ACacheNodeKilledDuringAFullReadLosesNoByte) {
  const std::string mnt = NewDir("mnt");
  LibraryMount m = MountLibrary(mnt, seconds(20), /*window=*/16);
  ASSERT_NE(m.view, nullptr);
  std::atomic<size_t> done{0};
  std::atomic<bool> killed{false};
  std::vector<std::string> wrong;
  std::thread reader([&] {
    for (SampleId id = 0; id < ds_.sample_count(); ++id) {
      if (id == 150) {
        // Wait (bounded) for the kill, so most reads happen after it.
        testing::WaitFor([&] { return killed.load(); }, seconds(30));
      }
      int error = 0;
      const std::string got = ReadWhole(mnt + "/" + ds_.manifest->PathOf(id), &error);
      if (error != 0 || got != ds_.contents[id]) {
        wrong.push_back(ds_.manifest->PathOf(id) + " (" + std::strerror(error) + ")");
      }
      done = id + 1;
    }
  });
  ASSERT_TRUE(testing::WaitFor([&] { return done.load() >= 150; }, seconds(30)));
  ASSERT_OK(cluster_->node(1).Kill());
  killed = true;
  reader.join();
  EXPECT_EQ(done.load(), ds_.sample_count());
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " files wrong, first " << wrong.front();
  EXPECT_EQ(m.view->counters().read_errors, 0u);
}

TEST_F(PosixMountTest, ASidecarRestartIsRiddenOutAndOneThatStaysDownIsEio) {
  const std::string patient = NewDir("patient");
  const std::string hasty = NewDir("hasty");
  LibraryMount slow = MountLibrary(patient, seconds(30), 0);
  LibraryMount fast = MountLibrary(hasty, milliseconds(1500), 0);
  ASSERT_NE(slow.view, nullptr);
  ASSERT_NE(fast.view, nullptr);
  EXPECT_EQ(ReadWhole(patient + "/" + ds_.manifest->PathOf(0)), ds_.contents[0]);
  EXPECT_EQ(ReadWhole(hasty + "/" + ds_.manifest->PathOf(0)), ds_.contents[0]);
  ASSERT_OK(sidecar_->Kill());
  // Down for good as far as the hasty mount is concerned: EIO, after retrying.
  const auto before = std::chrono::steady_clock::now();
  int error = 0;
  ReadWhole(hasty + "/" + ds_.manifest->PathOf(1), &error);
  EXPECT_EQ(error, EIO);
  EXPECT_GE(std::chrono::steady_clock::now() - before, milliseconds(1400));
  EXPECT_GE(fast.view->counters().read_errors, 1u);
  // A read on the patient mount, with the sidecar restarted under it.
  std::string got;
  int slow_error = -1;
  std::thread reading(
      [&] { got = ReadWhole(patient + "/" + ds_.manifest->PathOf(2), &slow_error); });
  StartSidecar();
  reading.join();
  EXPECT_EQ(slow_error, 0) << std::strerror(slow_error);
  EXPECT_EQ(got, ds_.contents[2]);
  EXPECT_GE(slow.reader->counters().broken_sessions, 1u);
  // And the hasty mount works again too.
  EXPECT_EQ(ReadWhole(hasty + "/" + ds_.manifest->PathOf(3)), ds_.contents[3]);
}

// `granary mount` reads without the sidecar when it is gone: from the cache
// nodes, then (every node gone too) from the source, so readers see no EIO.
// With --no-fallback the same loss is EIO.
TEST_F(PosixMountTest, ASidecarGoneForGoodFallsBackToTheNodesThenTheSource) {
  const std::string mnt = NewDir("mnt");
  const std::string strict = NewDir("strict");
  auto cli = StartCli(MountArgs(mnt), "mount.log");
  std::vector<std::string> strict_args = MountArgs(strict);
  strict_args.insert(strict_args.end(), {"--no-fallback", "--reconnect-timeout", "500ms"});
  auto strict_cli = StartCli(strict_args, "strict.log");
  ASSERT_NE(cli, nullptr);
  ASSERT_NE(strict_cli, nullptr);
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        return (Mounted(mnt) && Mounted(strict)) || !cli->Running() || !strict_cli->Running();
      },
      seconds(30)))
      << cli->LogTail() << strict_cli->LogTail();
  ASSERT_TRUE(Mounted(mnt) && Mounted(strict)) << cli->LogTail() << strict_cli->LogTail();
  EXPECT_EQ(ReadWhole(mnt + "/" + ds_.manifest->PathOf(0)), ds_.contents[0]);
  ASSERT_OK(sidecar_->Kill());

  int error = 0;
  ReadWhole(strict + "/" + ds_.manifest->PathOf(1), &error);
  EXPECT_EQ(error, EIO) << "--no-fallback: the sidecar's loss is EIO";

  // The first half from the cache nodes, the rest with every node gone.
  const SampleId half = static_cast<SampleId>(ds_.sample_count() / 2);
  std::vector<std::string> wrong;
  for (SampleId id = 1; id < ds_.sample_count(); ++id) {
    if (id == half) {
      for (size_t n = 0; n < cluster_->node_count(); ++n) ASSERT_OK(cluster_->node(n).Kill());
    }
    int e = 0;
    const std::string got = ReadWhole(mnt + "/" + ds_.manifest->PathOf(id), &e);
    if (e != 0 || got != ds_.contents[id]) {
      wrong.push_back(ds_.manifest->PathOf(id) + " (" + std::strerror(e) + ")");
    }
  }
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " files wrong, first " << wrong.front();
  EXPECT_NE(cli->ReadLog().find("reading straight from the cache nodes and the source"),
            std::string::npos)
      << cli->LogTail();
  auto exit = cli->Terminate(seconds(20));
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << cli->LogTail();
  ASSERT_OK(strict_cli->Terminate(seconds(20)));
  EXPECT_FALSE(Mounted(mnt));
  EXPECT_FALSE(Mounted(strict));
}

TEST_F(PosixMountTest, TheCommandServesUntilSigtermThenUnmounts) {
  const std::string mnt = NewDir("mnt");
  auto cli = StartCli(MountArgs(mnt), "mount.log");
  ASSERT_NE(cli, nullptr);
  ASSERT_TRUE(testing::WaitFor([&] { return Mounted(mnt) || !cli->Running(); }, seconds(30)))
      << cli->LogTail();
  ASSERT_TRUE(Mounted(mnt)) << cli->LogTail();
  ExpectTreeEqualsSnapshot(mnt);
  struct stat st;
  ASSERT_EQ(stat((mnt + "/d001").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, getuid()) << "the dataset owner's";
  auto exit = cli->Terminate(seconds(20));
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << cli->LogTail();
  EXPECT_FALSE(Mounted(mnt));
  EXPECT_TRUE(fs::is_empty(mnt));
  EXPECT_NE(cli->ReadLog().find("unmounting"), std::string::npos) << cli->LogTail();
  // SIGINT too.
  cli = StartCli(MountArgs(mnt), "mount-int.log");
  ASSERT_TRUE(testing::WaitFor([&] { return Mounted(mnt) || !cli->Running(); }, seconds(30)));
  ASSERT_OK(cli->Signal(SIGINT));
  auto exited = cli->Wait(seconds(20));
  ASSERT_OK(exited);
  EXPECT_TRUE(exited->ExitedWith(0)) << exited->ToString();
  EXPECT_FALSE(Mounted(mnt));
}

TEST_F(PosixMountTest, AStaleMountFromACrashIsCleanedByTheNextStart) {
  const std::string mnt = NewDir("mnt");
  auto crashed = StartCli(MountArgs(mnt), "crashed.log");
  ASSERT_NE(crashed, nullptr);
  ASSERT_TRUE(testing::WaitFor([&] { return Mounted(mnt) || !crashed->Running(); }, seconds(30)));
  ASSERT_OK(crashed->Kill());
  struct stat st;
  ASSERT_NE(stat(mnt.c_str(), &st), 0);
  ASSERT_EQ(errno, ENOTCONN) << "a stale mount";
  auto next = StartCli(MountArgs(mnt), "next.log");
  ASSERT_NE(next, nullptr);
  // Mounted again once the dataset's files are there: between the stale
  // mount's detach and the new mount, the directory is empty (and the mount
  // table may still list the stale one).
  const std::string file = mnt + "/" + ds_.manifest->PathOf(5);
  ASSERT_TRUE(testing::WaitFor(
      [&] { return (Mounted(mnt) && stat(file.c_str(), &st) == 0) || !next->Running(); },
      seconds(30)))
      << next->LogTail();
  EXPECT_NE(next->ReadLog().find("stale mount"), std::string::npos) << next->LogTail();
  EXPECT_EQ(ReadWhole(mnt + "/" + ds_.manifest->PathOf(5)), ds_.contents[5]);
  auto exit = next->Terminate(seconds(20));
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0));
  EXPECT_FALSE(Mounted(mnt));
  EXPECT_EQ(stat(mnt.c_str(), &st), 0);
}

TEST_F(PosixMountTest, TheBackgroundModeReturnsOnceMounted) {
  const std::string mnt = NewDir("mnt");
  auto cli = StartCli(MountArgs(mnt, /*foreground=*/false), "background.log");
  ASSERT_NE(cli, nullptr);
  auto exit = cli->Wait(seconds(30));
  ASSERT_OK(exit);
  ASSERT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << cli->LogTail();
  EXPECT_TRUE(Mounted(mnt)) << "mounted before the command returned";
  const std::string log = cli->ReadLog();
  const size_t at = log.find("(pid ");
  ASSERT_NE(at, std::string::npos) << log;
  const pid_t server = static_cast<pid_t>(std::stol(log.substr(at + 5)));
  EXPECT_EQ(ReadWhole(mnt + "/" + ds_.manifest->PathOf(7)), ds_.contents[7]);
  // Unmounted from outside: the server exits (or is a zombie of a PID 1 that
  // does not reap).
  ASSERT_EQ(std::system(("fusermount3 -u " + mnt).c_str()), 0);
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        std::ifstream stat_file("/proc/" + std::to_string(server) + "/stat");
        std::string line;
        if (!std::getline(stat_file, line)) return true;
        const size_t paren = line.rfind(')');
        return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
      },
      seconds(20)));
  EXPECT_FALSE(Mounted(mnt));
}

TEST_F(PosixMountTest, BadArgumentsAreClearErrors) {
  // A dataset that has no manifest yet.
  DatasetRecord pending;
  pending.name = "pending";
  pending.spec.source_uri = "file://" + ds_.root;
  pending.state.phase = DatasetPhase::kPending;
  ASSERT_OK(cluster_->store().CreateDataset(pending));
  const std::string empty = NewDir("empty");
  const std::string full = NewDir("full");
  testing::WriteAll(full + "/something", "x");
  testing::WriteAll(cluster_->dir().Join("plainfile"), "x");
  const std::string socket = sidecar_->socket_path();
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"mount", "nope", empty, "--socket", socket, "-f"}, 3, "no dataset 'nope'"},
      {{"mount", "pending", empty, "--socket", socket, "-f"}, 1, "Staging or Ready"},
      {{"mount", "imgs", cluster_->dir().Join("missing"), "--socket", socket, "-f"}, 3, "mkdir"},
      {{"mount", "imgs", full, "--socket", socket, "-f"}, 1, "not empty"},
      {{"mount", "imgs", cluster_->dir().Join("plainfile"), "--socket", socket, "-f"},
       2,
       "not a directory"},
      {{"mount", "imgs", empty, "--socket", cluster_->dir().Join("no.sock"), "-f"},
       4,
       "is granary-sidecar running"},
      {{"mount", "Bad_Name", empty, "--socket", socket, "-f"}, 2, "Bad_Name"},
      {{"mount", "imgs", empty, "--socket", socket, "--readahead", "zigzag", "-f"}, 2, "zigzag"},
      {{"mount", "imgs", empty, "--socket", socket, "--reconnect-timeout", "soon", "-f"},
       2,
       "--reconnect-timeout"},
      {{"mount", "imgs"}, 2, "dir"},
      // The background mode passes the child's error and exit code on.
      {{"mount", "nope", empty, "--socket", socket}, 3, "no dataset 'nope'"},
      {{"mount", "imgs", full, "--socket", socket}, 1, "not empty"},
  };
  int n = 0;
  for (const Case& c : cases) {
    auto cli = StartCli(c.args, "bad-" + std::to_string(n++) + ".log");
    ASSERT_NE(cli, nullptr);
    auto exit = cli->Wait(seconds(30));
    ASSERT_OK(exit);
    const std::string log = cli->ReadLog();
    EXPECT_TRUE(exit->ExitedWith(c.code))
        << exit->ToString() << " for " << c.args[1] << ": " << log;
    EXPECT_NE(log.find(c.says), std::string::npos) << log;
  }
  EXPECT_FALSE(Mounted(empty));
  EXPECT_TRUE(fs::is_empty(empty));
}

}  // namespace
}  // namespace granary::posix

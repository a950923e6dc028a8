// PosixView on a real FUSE mount under a TempDir, reading from an in-memory
// ContentReader (the FUSE part does not know where bytes come from; the
// sidecar-backed reader is tested in tests/integration/posix_mount_test.cc).
// Walks and reads through the kernel, every write-like syscall, `..` and
// symlinks, read errors, kernel caching, readahead hints, stop and external
// unmount, and the mount point checks (missing, file, non-empty, mounted,
// stale after a crash).
//
// The views are served by this test process itself, so a crash or a deadlock
// in the serving code could leave a thread in a FUSE request that nobody will
// ever answer: the kernel waits for the answer uninterruptibly, and not even
// ctest's SIGKILL ends the process. Every mount is therefore watched by a
// FuseWatchdog, a process outside this one that aborts the FUSE connection
// (fusectl's abort file) when the test has not finished in time: a stuck
// request then fails with ENOTCONN and the test fails instead of hanging.

#include "granary/posix/posix_view.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "granary/posix/mount_point.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary::posix {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

// See the comment at the top. Start() forks the watchdog; the destructor
// tells it the test is over (it exits touching nothing) and reaps it. The
// watchdog aborts the connection of the mount and detaches it when the
// timeout passes first, or when this process dies without saying so (no
// stale mount is left under /tmp then). fork() copies only the calling
// thread, so the child does nothing but async-signal-safe calls.
class FuseWatchdog {
 public:
  static constexpr std::chrono::seconds kTimeout{60};

  static Result<std::unique_ptr<FuseWatchdog>> Start(const std::string& mount_point,
                                                     std::chrono::milliseconds timeout) {
    struct stat st;
    if (stat(mount_point.c_str(), &st) != 0) {
      return Status::FromErrno(errno, "watchdog: stat " + mount_point);
    }
    // fusectl names a connection by the kernel's dev_t of the mount:
    // (major << 20) | minor.
    const std::string abort_path =
        "/sys/fs/fuse/connections/" +
        std::to_string((static_cast<uint64_t>(major(st.st_dev)) << 20) | minor(st.st_dev)) +
        "/abort";
    if (access(abort_path.c_str(), F_OK) != 0) {
      // fusectl is not mounted yet (root can mount it).
      mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, nullptr);
      if (access(abort_path.c_str(), F_OK) != 0) {
        return Status::FailedPrecondition(
            "watchdog: no " + abort_path +
            " (mount fusectl: mount -t fusectl none /sys/fs/fuse/connections)");
      }
    }
    // A socket pair, not a pipe: the end of the test is sent with
    // MSG_NOSIGNAL (the watchdog may have exited already).
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return Status::FromErrno(errno, "watchdog: socketpair");
    }
    const std::string message = "posix_view_test watchdog: the test did not end within " +
                                std::to_string(timeout.count()) +
                                " ms; aborting the FUSE connection of " + mount_point + "\n";
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      close(fds[0]);
      close(fds[1]);
      return Status::FromErrno(err, "watchdog: fork");
    }
    if (pid == 0) {
      // Keep stdin/out/err and the pipe's read end only: holding the FUSE
      // device (or anything else of the test's) would keep it alive.
      if (dup2(fds[0], 3) != 3) _exit(2);
      syscall(SYS_close_range, 4u, ~0u, 0u);
      pollfd p = {3, POLLIN, 0};
      int ready;
      do {
        ready = poll(&p, 1, static_cast<int>(timeout.count()));
      } while (ready < 0 && errno == EINTR);
      char byte = 0;
      if (ready > 0 && read(3, &byte, 1) == 1 && byte == 'd') _exit(0);  // the test ended
      if (ready == 0) {
        [[maybe_unused]] const ssize_t w = write(2, message.data(), message.size());
      }
      const int fd = open(abort_path.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        [[maybe_unused]] const ssize_t w = write(fd, "1", 1);
        close(fd);
      }
      umount2(mount_point.c_str(), MNT_DETACH);
      _exit(ready == 0 ? 1 : 0);
    }
    close(fds[0]);
    return std::unique_ptr<FuseWatchdog>(new FuseWatchdog(pid, fds[1]));
  }

  ~FuseWatchdog() {
    [[maybe_unused]] const ssize_t w = send(done_fd_, "d", 1, MSG_NOSIGNAL);
    close(done_fd_);
    int status = 0;
    if (pid_ > 0 &&
        !testing::WaitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, seconds(10))) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
  }

  // Waits up to `timeout` for the watchdog to have fired (it exits 1 then).
  bool WaitFired(std::chrono::milliseconds timeout) {
    int status = 0;
    if (!testing::WaitFor([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, timeout)) {
      return false;
    }
    pid_ = -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 1;
  }

 private:
  FuseWatchdog(pid_t pid, int done_fd) : pid_(pid), done_fd_(done_fd) {}
  pid_t pid_;
  int done_fd_;
};

class MemoryReader : public ContentReader {
 public:
  explicit MemoryReader(std::vector<std::string> contents) : contents_(std::move(contents)) {}

  Result<std::unique_ptr<PinnedSample>> Acquire(SampleId id) override {
    acquires_.fetch_add(1);
    if (id >= contents_.size()) return Status::OutOfRange("no sample " + std::to_string(id));
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (failing_.count(id) != 0)
        return Status::Unavailable("sample " + std::to_string(id) + " is unreadable (test)");
      // A hung reader: held until Unblock() (bounded, so a worker always ends).
      if (blocked_.count(id) != 0) {
        ++waiting_;
        cv_.wait_for(lock, std::chrono::seconds(30), [&] { return blocked_.count(id) == 0; });
        --waiting_;
      }
    }
    return std::unique_ptr<PinnedSample>(new Pin(this, contents_[id]));
  }

  void Hint(std::span<const SampleId> ids) override {
    std::lock_guard<std::mutex> lock(mu_);
    hinted_.insert(hinted_.end(), ids.begin(), ids.end());
  }

  void Fail(SampleId id) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_.insert(id);
  }
  void Block(SampleId id) {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_.insert(id);
  }
  void Unblock() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocked_.clear();
    }
    cv_.notify_all();
  }
  int waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }
  std::vector<SampleId> hinted() {
    std::lock_guard<std::mutex> lock(mu_);
    return hinted_;
  }
  int live_pins() const { return live_pins_.load(); }
  int acquires() const { return acquires_.load(); }

 private:
  class Pin : public PinnedSample {
   public:
    Pin(MemoryReader* r, const std::string& bytes) : r_(r), bytes_(bytes) { ++r_->live_pins_; }
    ~Pin() override { --r_->live_pins_; }
    std::string_view bytes() const override { return bytes_; }

   private:
    MemoryReader* r_;
    const std::string& bytes_;
  };

  const std::vector<std::string> contents_;
  std::atomic<int> live_pins_{0};
  std::atomic<int> acquires_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<SampleId> failing_;
  std::set<SampleId> blocked_;
  int waiting_ = 0;
  std::vector<SampleId> hinted_;
};

struct Dataset {
  std::shared_ptr<const Manifest> manifest;
  std::vector<std::string> contents;  // by id
};

// Class folders like ImageNet's, a file at the root, an empty file, one
// large file read in many requests.
Dataset MakeDataset() {
  std::vector<std::pair<std::string, std::string>> files;
  for (int c = 0; c < 5; ++c) {
    for (int i = 0; i < 40; ++i) {
      const std::string path =
          "train/n0" + std::to_string(c) + "/img_" + std::to_string(i) + ".jpg";
      files.emplace_back(path, testing::Bytes(path, 500 + static_cast<size_t>(i * 97 + c * 13)));
    }
  }
  files.emplace_back("README", testing::Bytes("readme", 77));
  files.emplace_back("empty", "");
  files.emplace_back("big/blob.bin", testing::Bytes("blob", 3 * 1024 * 1024 + 5));
  std::sort(files.begin(), files.end());
  ManifestHeaderInfo header;
  header.source_uri = "file:///nowhere";
  header.chunk_size = 64 * 1024;
  std::vector<FileEntry> entries;
  int64_t mtime = 1'700'000'000'123'456'789;
  for (const auto& [path, bytes] : files) {
    entries.push_back({path, bytes.size(), mtime += 1000,
                       static_cast<uint16_t>(path == "train/n02/img_7.jpg" ? 0640 : 0444)});
  }
  // Modes of the source, and a class folder without files (still a class).
  auto m = Manifest::FromEntries(header, entries, {{"train", 0750}, {"train/n05-empty", 0700}});
  EXPECT_OK(m);
  Dataset d;
  d.manifest = std::make_shared<const Manifest>(std::move(*m));
  for (SampleId id = 0; id < d.manifest->sample_count(); ++id) {
    for (const auto& [path, bytes] : files) {
      if (path == d.manifest->PathOf(id)) d.contents.push_back(bytes);
    }
  }
  return d;
}

std::string ReadWhole(const std::string& path, int* error = nullptr) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (error != nullptr) *error = errno;
    return {};
  }
  std::string out;
  char buf[65536];
  for (int i = 0; i < 100000; ++i) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (error != nullptr) *error = errno;
      close(fd);
      return out;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (error != nullptr) *error = 0;
  return out;
}

class PosixViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = MakeDataset();
    mnt_ = dir_.Join("mnt");
    fs::create_directories(mnt_);
    reader_ = std::make_shared<MemoryReader>(data_.contents);
  }
  void TearDown() override {
    if (view_ != nullptr) view_->Stop();
    watchdog_.reset();
  }

  PosixViewOptions Options() const {
    PosixViewOptions o;
    o.mount_point = mnt_;
    o.dataset = "imagenet";
    o.uid = 1234;
    o.gid = 5678;
    o.threads = 4;
    o.readahead.window_samples = 16;
    return o;
  }

  void MountIt(PosixViewOptions o) {
    auto view = PosixView::Mount(std::move(o), data_.manifest, reader_);
    ASSERT_OK(view);
    view_ = std::move(*view);
    watchdog_.reset();
    auto watchdog = FuseWatchdog::Start(mnt_, FuseWatchdog::kTimeout);
    ASSERT_OK(watchdog);
    watchdog_ = std::move(*watchdog);
  }
  void MountIt() { MountIt(Options()); }

  testing::TempDir dir_;
  std::string mnt_;
  Dataset data_;
  std::shared_ptr<MemoryReader> reader_;
  std::unique_ptr<PosixView> view_;
  std::unique_ptr<FuseWatchdog> watchdog_;
};

TEST_F(PosixViewTest, WalkAndReadEqualTheDatasetByteForByte) {
  MountIt();
  std::map<std::string, std::string> seen;
  std::set<std::string> dirs;
  for (auto it = fs::recursive_directory_iterator(mnt_); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string rel = fs::relative(it->path(), mnt_).string();
    if (it->is_directory()) {
      dirs.insert(rel);
    } else {
      ASSERT_TRUE(it->is_regular_file()) << rel;
      seen[rel] = ReadWhole(it->path().string());
    }
  }
  ASSERT_EQ(seen.size(), data_.manifest->sample_count());
  for (SampleId id = 0; id < data_.manifest->sample_count(); ++id) {
    const std::string path = data_.manifest->PathOf(id);
    ASSERT_EQ(seen.count(path), 1u) << path;
    ASSERT_EQ(seen[path], data_.contents[id]) << path;
  }
  EXPECT_EQ(dirs, (std::set<std::string>{"train", "big", "train/n00", "train/n01", "train/n02",
                                         "train/n03", "train/n04", "train/n05-empty"}));
  // Attributes from the manifest and the options.
  struct stat st;
  const SampleId some = *data_.manifest->Find("train/n02/img_7.jpg");
  ASSERT_EQ(stat((mnt_ + "/train/n02/img_7.jpg").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), data_.manifest->SizeOf(some));
  EXPECT_EQ(static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
            data_.manifest->MtimeOf(some));
  ASSERT_EQ(stat((mnt_ + "/train").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_nlink, 8u);  // 2 + six class folders
  ASSERT_EQ(stat((mnt_ + "/train/n05-empty").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(stat((mnt_ + "/big").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0555u);  // implied by a file, not listed: the default
  struct statvfs sv;
  ASSERT_EQ(statvfs(mnt_.c_str(), &sv), 0);
  EXPECT_NE(sv.f_flag & ST_RDONLY, 0u);
  EXPECT_EQ(sv.f_files, view_->tree().max_inode());
  // Everything read: no pin is held (pins kept between reads of a file expire).
  EXPECT_TRUE(testing::WaitFor([&] { return reader_->live_pins() == 0; }, seconds(10)))
      << reader_->live_pins();
  // A missing name is ENOENT, under a file ENOTDIR.
  EXPECT_NE(stat((mnt_ + "/train/n09").c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_NE(stat((mnt_ + "/README/x").c_str(), &st), 0);
  EXPECT_EQ(errno, ENOTDIR);
}

TEST_F(PosixViewTest, LargeFileReadsAtAnyOffset) {
  MountIt();
  const SampleId id = *data_.manifest->Find("big/blob.bin");
  const std::string& want = data_.contents[id];
  const int fd = open((mnt_ + "/big/blob.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  // Offsets across the whole file and past its end.
  for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{131071},
                       uint64_t{1} << 20, want.size() - 3, want.size(), want.size() + 100}) {
    char buf[10000];
    const ssize_t n = pread(fd, buf, sizeof(buf), static_cast<off_t>(off));
    ASSERT_GE(n, 0) << off;
    const size_t expect = off >= want.size() ? 0 : std::min<size_t>(10000, want.size() - off);
    ASSERT_EQ(static_cast<size_t>(n), expect) << off;
    EXPECT_EQ(std::string(buf, static_cast<size_t>(n)),
              want.substr(std::min(off, want.size()), expect));
  }
  close(fd);
  EXPECT_EQ(ReadWhole(mnt_ + "/big/blob.bin"), want);
  // mmap reads through the page cache.
  const int mfd = open((mnt_ + "/big/blob.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(mfd, 0);
  void* map = mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, mfd, 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  EXPECT_EQ(std::string_view(static_cast<const char*>(map), want.size()), want);
  munmap(map, want.size());
  close(mfd);
  EXPECT_EQ(ReadWhole(mnt_ + "/empty"), "");
  EXPECT_TRUE(testing::WaitFor([&] { return reader_->live_pins() == 0; }, seconds(10)))
      << reader_->live_pins() << " pins, " << view_->kept_pins() << " kept";
}

TEST_F(PosixViewTest, EveryWriteLikeCallIsReadOnly) {
  MountIt();
  const std::string f = mnt_ + "/README";
  const std::string d = mnt_ + "/train";
  const std::string before = ReadWhole(f);
  auto expect_erofs = [](int rc, const char* what) {
    EXPECT_EQ(rc, -1) << what;
    EXPECT_EQ(errno, EROFS) << what << ": " << std::strerror(errno);
  };
  expect_erofs(open(f.c_str(), O_WRONLY), "open O_WRONLY");
  expect_erofs(open(f.c_str(), O_RDWR), "open O_RDWR");
  expect_erofs(open(f.c_str(), O_RDONLY | O_TRUNC), "open O_TRUNC");
  expect_erofs(open(f.c_str(), O_WRONLY | O_APPEND), "open O_APPEND");
  expect_erofs(open((mnt_ + "/new").c_str(), O_WRONLY | O_CREAT, 0644), "open O_CREAT");
  expect_erofs(creat((d + "/new.jpg").c_str(), 0644), "creat");
  expect_erofs(mkdir((mnt_ + "/newdir").c_str(), 0755), "mkdir");
  expect_erofs(rmdir((d + "/n00").c_str()), "rmdir");
  expect_erofs(unlink(f.c_str()), "unlink");
  expect_erofs(rename(f.c_str(), (mnt_ + "/README2").c_str()), "rename");
  expect_erofs(rename((d + "/n00").c_str(), (d + "/n99").c_str()), "rename dir");
  expect_erofs(link(f.c_str(), (mnt_ + "/hard").c_str()), "link");
  expect_erofs(symlink("/etc/passwd", (mnt_ + "/sym").c_str()), "symlink");
  expect_erofs(chmod(f.c_str(), 0777), "chmod");
  expect_erofs(chown(f.c_str(), 0, 0), "chown");
  expect_erofs(truncate(f.c_str(), 0), "truncate");
  expect_erofs(utimes(f.c_str(), nullptr), "utimes");
  expect_erofs(mknod((mnt_ + "/fifo").c_str(), S_IFIFO | 0644, 0), "mknod");
  expect_erofs(setxattr(f.c_str(), "user.x", "1", 1, 0), "setxattr");
  expect_erofs(removexattr(f.c_str(), "user.x"), "removexattr");
  expect_erofs(access(f.c_str(), W_OK), "access W_OK");
  // A read-only descriptor cannot write either.
  const int fd = open(f.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(write(fd, "x", 1), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(ftruncate(fd, 0), -1);
  close(fd);
  EXPECT_EQ(ReadWhole(f), before);
  struct stat st;
  EXPECT_NE(stat((mnt_ + "/new").c_str(), &st), 0);
  EXPECT_NE(stat((mnt_ + "/newdir").c_str(), &st), 0);
  EXPECT_EQ(access(f.c_str(), R_OK), 0);
  EXPECT_TRUE(testing::WaitFor([&] { return reader_->live_pins() == 0; }, seconds(10)));
}

TEST_F(PosixViewTest, DotDotAndSymlinksStayInside) {
  MountIt();
  // Inside the mount, ".." climbs the dataset's own tree and stops at its root,
  // whose parent is the directory the mount sits in (the VFS's), never the source.
  struct stat root, st;
  ASSERT_EQ(stat(mnt_.c_str(), &root), 0);
  ASSERT_EQ(stat((mnt_ + "/train/n01/../..").c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, root.st_ino);
  EXPECT_EQ(st.st_dev, root.st_dev);
  ASSERT_EQ(stat((mnt_ + "/train/n01/../../train/../big/../train/n01").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_EQ(stat((mnt_ + "/..").c_str(), &st), 0);
  struct stat parent;
  ASSERT_EQ(stat(dir_.path().c_str(), &parent), 0);
  EXPECT_EQ(st.st_ino, parent.st_ino);
  // Through a descriptor of a directory inside, ".." chains end at the root.
  const int dfd = open((mnt_ + "/train/n03").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dfd, 0);
  ASSERT_EQ(fstatat(dfd, "../..", &st, 0), 0);
  EXPECT_EQ(st.st_ino, root.st_ino);
  EXPECT_NE(fstatat(dfd, "../../../../etc/passwd", &st, 0), 0)
      << "the mount's parent is a temp dir";
  close(dfd);
  // No entry is a symlink, readlink refuses, names with odd bytes are not found.
  for (auto it = fs::recursive_directory_iterator(mnt_); it != fs::recursive_directory_iterator();
       ++it) {
    EXPECT_FALSE(it->is_symlink()) << it->path();
  }
  char buf[64];
  EXPECT_EQ(readlink((mnt_ + "/README").c_str(), buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_NE(stat((mnt_ + "/train/n0\\1").c_str(), &st), 0);
  EXPECT_NE(stat((mnt_ + "/...").c_str(), &st), 0);
  std::string long_name(300, 'a');
  EXPECT_NE(stat((mnt_ + "/" + long_name).c_str(), &st), 0);
  EXPECT_TRUE(errno == ENOENT || errno == ENAMETOOLONG) << std::strerror(errno);
}

TEST_F(PosixViewTest, AReadErrorIsEioForThatFileOnly) {
  const SampleId bad = *data_.manifest->Find("train/n01/img_3.jpg");
  reader_->Fail(bad);
  MountIt();
  int error = 0;
  ReadWhole(mnt_ + "/train/n01/img_3.jpg", &error);
  EXPECT_EQ(error, EIO);
  struct stat st;
  EXPECT_EQ(stat((mnt_ + "/train/n01/img_3.jpg").c_str(), &st), 0) << "metadata needs no read";
  EXPECT_EQ(ReadWhole(mnt_ + "/train/n01/img_4.jpg"),
            data_.contents[*data_.manifest->Find("train/n01/img_4.jpg")]);
  EXPECT_GE(view_->counters().read_errors, 1u);
}

TEST_F(PosixViewTest, TheKernelCachesWarmReadsAndMetadata) {
  // Without pinned readahead, whose thread may still be pinning the last
  // files ahead after the first pass (FirstReadsPinTheFilesThatFollow).
  PosixViewOptions o = Options();
  o.pin_ahead = 0;
  MountIt(o);
  auto read_all = [&] {
    for (SampleId id = 0; id < data_.manifest->sample_count(); ++id) {
      ASSERT_EQ(ReadWhole(mnt_ + "/" + data_.manifest->PathOf(id)), data_.contents[id]);
    }
  };
  read_all();
  const PosixView::Counters cold = view_->counters();
  const int acquires = reader_->acquires();
  // Each file once (all but the empty one); out-of-order kernel reads of the
  // big one may pin it again.
  EXPECT_GE(cold.acquires, data_.manifest->sample_count() - 1);
  EXPECT_LE(cold.acquires, data_.manifest->sample_count() + 8);
  read_all();
  const PosixView::Counters warm = view_->counters();
  // keep_cache: pages stay; long entry/attr timeouts: no lookup or getattr;
  // no_open, no flush: no request at all.
  EXPECT_EQ(reader_->acquires(), acquires);
  EXPECT_EQ(warm.reads, cold.reads);
  EXPECT_EQ(warm.lookups, cold.lookups);
  EXPECT_EQ(warm.getattrs, cold.getattrs);
  for (size_t op = 0; op < kFuseOpCount; ++op) {
    EXPECT_EQ(warm.requests[op], cold.requests[op]) << FuseOpName(static_cast<FuseOp>(op));
  }
  // But every ioctl reaches the view (the kernel forwards them all): what
  // isatty() on each file opened by Python's open() costs. Counted, ENOTTY.
  const int fd = open((mnt_ + "/README").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(isatty(fd), 0);
  EXPECT_EQ(errno, ENOTTY);
  EXPECT_EQ(isatty(fd), 0);
  close(fd);
  const PosixView::Counters after = view_->counters();
  EXPECT_EQ(after.requests[static_cast<size_t>(FuseOp::kIoctl)],
            warm.requests[static_cast<size_t>(FuseOp::kIoctl)] + 2);
}

// What the watchdog is for: a request that its server never answers (here a
// reader that hangs) is failed by the watchdog aborting the connection, so
// the reading thread returns (ENOTCONN) instead of waiting forever.
TEST_F(PosixViewTest, TheWatchdogEndsARequestThatIsNeverAnswered) {
  const SampleId stuck = *data_.manifest->Find("train/n02/img_5.jpg");
  reader_->Block(stuck);
  MountIt();
  watchdog_.reset();  // the test's own, with a short timeout instead
  auto watchdog = FuseWatchdog::Start(mnt_, milliseconds(1500));
  ASSERT_OK(watchdog);
  int error = 0;
  const auto start = std::chrono::steady_clock::now();
  ReadWhole(mnt_ + "/train/n02/img_5.jpg", &error);
  EXPECT_EQ(error, ENOTCONN) << std::strerror(error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
  EXPECT_TRUE((*watchdog)->WaitFired(seconds(10)));
  EXPECT_EQ(reader_->waiting(), 1);
  reader_->Unblock();
  EXPECT_TRUE(view_->WaitEnded(seconds(10)));
  view_->Stop();
  // Detached by the watchdog: nothing is left mounted.
  EXPECT_EQ(*MountedFileSystemAt(mnt_), "");
}

TEST_F(PosixViewTest, OpensHintTheFilesThatFollow) {
  MountIt();
  const SampleId first = *data_.manifest->Find("train/n00/img_0.jpg");
  ReadWhole(mnt_ + "/train/n00/img_0.jpg");
  const std::vector<SampleId> hinted = reader_->hinted();
  ASSERT_FALSE(hinted.empty());
  EXPECT_EQ(hinted.front(), first + 1);
  EXPECT_LE(hinted.size(), 16u);
  for (size_t i = 1; i < hinted.size(); ++i) EXPECT_EQ(hinted[i], hinted[i - 1] + 1);
  EXPECT_EQ(view_->counters().hinted, hinted.size());
  // Off: no hints.
  view_->Stop();
  view_.reset();
  auto quiet = std::make_shared<MemoryReader>(data_.contents);
  reader_ = quiet;
  PosixViewOptions o = Options();
  o.readahead.window_samples = 0;
  MountIt(o);
  ReadWhole(mnt_ + "/train/n00/img_0.jpg");
  EXPECT_TRUE(quiet->hinted().empty());
}

// A reader in another epoch than the plan the view follows (a job started
// over, the next epoch): after a few jumps the view finds the epoch it reads
// and pins ahead in it; a reader that follows nothing switches nothing.
TEST_F(PosixViewTest, ReadaheadFollowsTheEpochTheReaderIsIn) {
  PlanRecord plan;
  plan.plan_id = "job-1";
  plan.seed = 7;
  plan.first_epoch = 4;
  plan.registered_ms = 1;
  auto at4 = ReadaheadOrder::FromPlan(*data_.manifest, plan);
  ASSERT_OK(at4);
  auto at0 = ReadaheadOrder::FromPlan(*data_.manifest, plan, 0);
  ASSERT_OK(at0);
  PosixViewOptions o = Options();
  o.readahead_order = *at4;
  o.pin_ahead = 4;
  std::atomic<int> listed{0};
  o.list_plans = [&listed, plan] {
    listed.fetch_add(1);
    return std::vector<PlanRecord>{plan};
  };
  MountIt(o);
  EXPECT_EQ(view_->readahead_order(), "plan 'job-1' (epoch 4)");
  auto read_at = [&](const ReadaheadOrder& order, uint64_t p) {
    const SampleId id = order.At(p);
    ASSERT_EQ(ReadWhole(mnt_ + "/" + data_.manifest->PathOf(id)), data_.contents[id]) << p;
  };
  for (uint64_t p = 0; p < 20; ++p) read_at(**at0, p);
  ASSERT_TRUE(testing::WaitFor([&] { return view_->counters().order_switches == 1; }, seconds(10)))
      << view_->counters().order_searches;
  EXPECT_EQ(view_->readahead_order(), "plan 'job-1' (epoch 0)");
  EXPECT_GE(listed.load(), 1);
  const uint64_t used = view_->counters().pinned_ahead_used;
  // Each read pins the next ones in the background: a reader on a loaded
  // machine (the ASan pass beside other suites) gives them a moment, as a
  // trainer's compute between batches does, so it does not race every pin.
  for (uint64_t p = 20; p < 40; ++p) {
    const uint64_t pinned = view_->counters().pinned_ahead;
    read_at(**at0, p);
    (void)testing::WaitFor([&] { return view_->counters().pinned_ahead > pinned; },
                           std::chrono::milliseconds(200));
  }
  EXPECT_GT(view_->counters().pinned_ahead_used, used);

  // Random reads (no order fits): a search or two, backed off; no switch.
  std::vector<SampleId> ids(data_.manifest->sample_count());
  for (SampleId id = 0; id < ids.size(); ++id) ids[id] = id;
  std::mt19937 rng(11);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (SampleId id : ids) {
    if ((*at0)->PositionOf(id) < 40 || data_.contents[id].empty()) continue;
    ASSERT_EQ(ReadWhole(mnt_ + "/" + data_.manifest->PathOf(id)), data_.contents[id]);
  }
  EXPECT_EQ(view_->counters().order_switches, 1u);
  EXPECT_LE(view_->counters().order_searches, 4u);
  EXPECT_EQ(view_->readahead_order(), "plan 'job-1' (epoch 0)");
}

// With allow_other the kernel checks modes (default_permissions): they are
// the source's, so other users get in exactly where the source let them.
TEST_F(PosixViewTest, FirstReadsPinTheFilesThatFollow) {
  PosixViewOptions o = Options();
  o.pin_ahead = 8;
  MountIt(o);
  const SampleId first = *data_.manifest->Find("train/n01/img_0.jpg");
  // A reader jumping about pins nothing ahead.
  for (SampleId id : {first + 30, first + 12, first + 60, first}) {
    ASSERT_EQ(ReadWhole(mnt_ + "/" + data_.manifest->PathOf(id)), data_.contents[id]);
  }
  EXPECT_EQ(view_->counters().pinned_ahead, 0u);
  // One that follows the order (first, then first + 1): the next 8 are
  // pinned by the view's own thread ...
  ASSERT_EQ(ReadWhole(mnt_ + "/" + data_.manifest->PathOf(first + 1)), data_.contents[first + 1]);
  ASSERT_TRUE(testing::WaitFor([&] { return view_->counters().pinned_ahead >= 8; }, seconds(10)))
      << view_->counters().pinned_ahead;
  EXPECT_EQ(view_->counters().pinned_ahead_used, 0u);
  // ... so their first reads find them pinned (and pin the ones after).
  for (SampleId id = first + 2; id <= first + 9; ++id) {
    ASSERT_EQ(ReadWhole(mnt_ + "/" + data_.manifest->PathOf(id)), data_.contents[id]);
  }
  EXPECT_EQ(view_->counters().pinned_ahead_used, 8u);
  // Pins nobody reads expire: none is left.
  EXPECT_TRUE(testing::WaitFor([&] { return reader_->live_pins() == 0; }, seconds(10)))
      << reader_->live_pins();
  // Off: nothing pinned ahead.
  view_->Stop();
  view_.reset();
  o.pin_ahead = 0;
  MountIt(o);
  ASSERT_EQ(ReadWhole(mnt_ + "/train/n01/img_0.jpg"), data_.contents[first]);
  ASSERT_EQ(ReadWhole(mnt_ + "/train/n01/img_1.jpg"), data_.contents[first + 1]);
  EXPECT_EQ(view_->counters().pinned_ahead, 0u);
}

TEST_F(PosixViewTest, AllowOtherShowsTheSourceModes) {
  PosixViewOptions o = Options();
  o.allow_other = true;
  MountIt(o);
  struct stat st;
  ASSERT_EQ(stat((mnt_ + "/README").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  ASSERT_EQ(stat((mnt_ + "/train").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(stat((mnt_ + "/train/n02/img_7.jpg").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
}

TEST_F(PosixViewTest, StopUnmountsAndExternalUnmountEnds) {
  MountIt();
  auto fstype = MountedFileSystemAt(mnt_);
  ASSERT_OK(fstype);
  EXPECT_EQ(*fstype, "fuse.granary");
  EXPECT_FALSE(view_->ended());
  view_->Stop();
  EXPECT_TRUE(view_->ended());
  fstype = MountedFileSystemAt(mnt_);
  ASSERT_OK(fstype);
  EXPECT_EQ(*fstype, "");
  EXPECT_TRUE(fs::is_empty(mnt_));
  view_->Stop();  // idempotent
  view_.reset();
  // Mounted again, then unmounted from outside: the workers end.
  MountIt();
  ASSERT_EQ(ReadWhole(mnt_ + "/README"), data_.contents[*data_.manifest->Find("README")]);
  ASSERT_EQ(std::system(("fusermount3 -u " + mnt_).c_str()), 0);
  EXPECT_TRUE(view_->WaitEnded(milliseconds(10'000)));
  view_->Stop();
  EXPECT_EQ(*MountedFileSystemAt(mnt_), "");
}

TEST_F(PosixViewTest, BadOptionsAreRefused) {
  PosixViewOptions o = Options();
  o.mount_point = "relative/dir";
  EXPECT_EQ(PosixView::Mount(o, data_.manifest, reader_).status().code(),
            StatusCode::kInvalidArgument);
  o = Options();
  o.threads = 0;
  EXPECT_EQ(PosixView::Mount(o, data_.manifest, reader_).status().code(),
            StatusCode::kInvalidArgument);
  o = Options();
  o.dataset = "Not A Name";
  EXPECT_EQ(PosixView::Mount(o, data_.manifest, reader_).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PosixView::Mount(Options(), data_.manifest, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PosixView::Mount(Options(), nullptr, reader_).status().code(),
            StatusCode::kInvalidArgument);
  o = Options();
  o.mount_point = dir_.Join("missing");
  auto missing = PosixView::Mount(o, data_.manifest, reader_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos);
}

TEST(MountPointTest, ChecksTheDirectory) {
  testing::TempDir dir;
  auto missing = PrepareMountPoint(dir.Join("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("mkdir"), std::string::npos);
  dir.WriteFile("file", "x");
  auto file = PrepareMountPoint(dir.Join("file"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("not a directory"), std::string::npos);
  dir.WriteFile("full/inside.txt", "x");
  auto full = PrepareMountPoint(dir.Join("full"));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(full.status().message().find("inside.txt"), std::string::npos);
  fs::create_directories(dir.Join("empty"));
  auto ok = PrepareMountPoint(dir.Join("empty/./../empty"));
  ASSERT_OK(ok);
  EXPECT_EQ(*ok, dir.Join("empty"));
  EXPECT_EQ(PrepareMountPoint("").status().code(), StatusCode::kInvalidArgument);
}

// In a pod the view's directory is a volume: a bind mount of the kubelet's
// emptyDir. An empty one is a fine mount point; a non-empty one is refused as
// any non-empty directory is.
TEST(MountPointTest, AnEmptyBindMountIsAMountPointAndAFullOneIsNot) {
  if (geteuid() != 0) GTEST_SKIP() << "bind mounts need root";
  testing::TempDir dir;
  fs::create_directories(dir.Join("volume"));
  fs::create_directories(dir.Join("view"));
  ASSERT_EQ(mount(dir.Join("volume").c_str(), dir.Join("view").c_str(), nullptr, MS_BIND, nullptr),
            0)
      << std::strerror(errno);
  ASSERT_NE(*MountedFileSystemAt(dir.Join("view")), "");
  auto ok = PrepareMountPoint(dir.Join("view"));
  EXPECT_OK(ok);
  dir.WriteFile("volume/left.txt", "x");
  auto full = PrepareMountPoint(dir.Join("view"));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(full.status().message().find("left.txt"), std::string::npos);
  ASSERT_EQ(umount2(dir.Join("view").c_str(), MNT_DETACH), 0);
}

TEST_F(PosixViewTest, AMountPointInUseIsRefused) {
  MountIt();
  auto busy = PrepareMountPoint(mnt_);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.status().message().find("fuse.granary"), std::string::npos)
      << busy.status().ToString();
}

TEST_F(PosixViewTest, AStaleMountFromACrashIsCleanedUp) {
  // A process that mounted and was killed leaves a mount whose server is gone.
  const std::string mnt = mnt_;
  const Dataset data = data_;
  auto child = testing::ChildProcess::Start([mnt, data](int control_fd) {
    auto reader = std::make_shared<MemoryReader>(data.contents);
    PosixViewOptions o;
    o.mount_point = mnt;
    o.dataset = "crashed";
    o.threads = 1;
    auto view = PosixView::Mount(o, data.manifest, reader);
    if (!view.ok()) return 1;
    const char byte = 1;
    if (write(control_fd, &byte, 1) != 1) return 2;
    pause();  // until SIGKILL
    return 0;
  });
  ASSERT_OK(child);
  ASSERT_OK((*child)->AwaitReady(milliseconds(10'000)));
  ASSERT_EQ(kill((*child)->pid(), SIGKILL), 0);
  ASSERT_OK((*child)->Wait(milliseconds(10'000)).status().code() == StatusCode::kInternal
                ? Status::Ok()
                : Status::Internal("the child was expected to die by SIGKILL"));
  struct stat st;
  ASSERT_NE(stat(mnt_.c_str(), &st), 0);
  ASSERT_EQ(errno, ENOTCONN) << "a stale mount";
  auto cleaned = PrepareMountPoint(mnt_);
  ASSERT_OK(cleaned);
  EXPECT_EQ(stat(mnt_.c_str(), &st), 0);
  EXPECT_EQ(*MountedFileSystemAt(mnt_), "");
  // And the directory mounts again.
  MountIt();
  EXPECT_EQ(ReadWhole(mnt_ + "/README"), data_.contents[*data_.manifest->Find("README")]);
}

}  // namespace
}  // namespace granary::posix

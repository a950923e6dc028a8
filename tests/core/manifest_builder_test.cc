#include "granary/core/manifest_builder.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "testing/test_util.h"

namespace granary {
namespace {

namespace fs = std::filesystem;

class ManifestBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = src_.Join("root");
    fs::create_directories(root_);
  }
  void File(const std::string& rel, size_t size) {
    src_.WriteFile("root/" + rel, std::string(size, 'x'));
  }
  Result<Manifest> Snapshot(ManifestBuildOptions o = {}) {
    o.source_root = root_;
    o.chunk_size = 4096;
    return BuildManifest(o);
  }
  std::vector<std::string> Paths(const Manifest& m) {
    std::vector<std::string> p;
    for (SampleId s = 0; s < m.sample_count(); ++s) p.push_back(m.PathOf(s));
    return p;
  }

  testing::TempDir src_;
  std::string root_;
};

TEST_F(ManifestBuilderTest, WalksNestedTreeInSortedOrder) {
  File("b/2.jpg", 20);
  File("b/1.jpg", 10);
  File("a.jpg", 5);
  File("c/d/e/f.jpg", 7);
  fs::create_directories(root_ + "/empty");
  auto m = Snapshot();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Paths(*m), (std::vector<std::string>{"a.jpg", "b/1.jpg", "b/2.jpg", "c/d/e/f.jpg"}));
  EXPECT_EQ(m->SizeOf(2), 20u);
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/b/2.jpg").c_str(), &st), 0);
  EXPECT_EQ(m->MtimeOf(2),
            static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  EXPECT_EQ(m->header().stats.directories, 6u);  // root, b, c, c/d, c/d/e, empty
  EXPECT_EQ(m->header().source_uri, "file://" + fs::canonical(root_).string());
}

TEST_F(ManifestBuilderTest, RecordsModesAndDirectoriesWithoutSamples) {
  File("cls/a.jpg", 3);
  File("cls/b.jpg", 4);
  fs::create_directories(root_ + "/empty/inner");
  ASSERT_EQ(::chmod((root_ + "/cls/a.jpg").c_str(), 0640), 0);
  ASSERT_EQ(::chmod((root_ + "/cls/b.jpg").c_str(), 0755), 0);
  ASSERT_EQ(::chmod((root_ + "/cls").c_str(), 0750), 0);
  ASSERT_EQ(::chmod((root_ + "/empty/inner").c_str(), 0711), 0);
  ASSERT_EQ(::chmod(root_.c_str(), 0705), 0);
  auto m = Snapshot();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->ModeOf(0), 0640);
  EXPECT_EQ(m->ModeOf(1), 0755);
  std::vector<std::string> dirs;
  for (uint32_t d = 0; d < m->directory_count(); ++d) dirs.push_back(m->DirectoryPath(d));
  EXPECT_EQ(dirs, (std::vector<std::string>{"", "cls", "empty", "empty/inner"}));
  EXPECT_EQ(m->DirectoryMode(0), 0705);
  EXPECT_EQ(m->DirectoryMode(1), 0750);
  EXPECT_EQ(m->DirectoryMode(3), 0711);
  // Another thread count, the same manifest (directories merge in any order).
  ManifestBuildOptions many;
  many.threads = 16;
  auto again = Snapshot(many);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->id(), m->id());
  // A chmod at the source is a new snapshot.
  ASSERT_EQ(::chmod((root_ + "/empty").c_str(), 0700), 0);
  auto chmodded = Snapshot();
  ASSERT_TRUE(chmodded.ok());
  EXPECT_NE(chmodded->id(), m->id());
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
}

TEST_F(ManifestBuilderTest, ThreadCountDoesNotChangeTheManifest) {
  for (int d = 0; d < 20; ++d) {
    for (int f = 0; f < 15; ++f)
      File("d" + std::to_string(d) + "/f" + std::to_string(f), static_cast<size_t>(f) * 100);
  }
  ManifestBuildOptions one;
  one.threads = 1;
  ManifestBuildOptions many;
  many.threads = 16;
  auto a = Snapshot(one);
  auto b = Snapshot(many);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sample_count(), 300u);
  EXPECT_EQ(a->id(), b->id());
}

TEST_F(ManifestBuilderTest, IncludeAndExcludeGlobs) {
  File("train/a.jpg", 1);
  File("train/b.png", 1);
  File("train/.cache/c.jpg", 1);
  File("val/d.jpg", 1);
  File("x.tmp", 1);
  ManifestBuildOptions o;
  o.include = {"*.jpg"};
  o.exclude = {".cache", "val/**"};
  auto m = Snapshot(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Paths(*m), std::vector<std::string>{"train/a.jpg"});
  // .cache pruned as a directory (1), val/d.jpg excluded as a file (1; the val
  // directory itself does not match "val/**").
  EXPECT_EQ(m->header().stats.skipped_excluded, 2u);
  EXPECT_EQ(m->header().stats.skipped_not_included, 2u);  // b.png, x.tmp
  EXPECT_EQ(m->header().include, std::vector<std::string>{"*.jpg"});
}

TEST_F(ManifestBuilderTest, SymlinksNeverLeadOutOfTheRoot) {
  File("real/a.bin", 3);
  src_.WriteFile("outside/secret", "top secret");
  ASSERT_EQ(::symlink("real/a.bin", (root_ + "/link_in").c_str()), 0);
  ASSERT_EQ(::symlink((src_.path() + "/outside/secret").c_str(), (root_ + "/link_out").c_str()), 0);
  ASSERT_EQ(::symlink("../outside/secret", (root_ + "/real/rel_out").c_str()), 0);
  ASSERT_EQ(::symlink("real", (root_ + "/link_dir").c_str()), 0);
  ASSERT_EQ(::symlink(".", (root_ + "/real/loop").c_str()), 0);
  ASSERT_EQ(::symlink("missing", (root_ + "/dangling").c_str()), 0);
  auto m = Snapshot();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Paths(*m), (std::vector<std::string>{"link_in", "real/a.bin"}));
  EXPECT_EQ(m->SizeOf(0), 3u);
  EXPECT_EQ(m->header().stats.skipped_symlinks, 5u);
}

TEST_F(ManifestBuilderTest, SymlinkedRootIsResolved) {
  File("a", 1);
  std::string alias = src_.Join("alias");
  ASSERT_EQ(::symlink(root_.c_str(), alias.c_str()), 0);
  ManifestBuildOptions o;
  o.source_root = alias;
  auto m = BuildManifest(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sample_count(), 1u);
}

TEST_F(ManifestBuilderTest, SpecialFilesAreSkippedAndCounted) {
  File("a", 1);
  ASSERT_EQ(::mkfifo((root_ + "/fifo").c_str(), 0600), 0);
  auto m = Snapshot();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->sample_count(), 1u);
  EXPECT_EQ(m->header().stats.skipped_special, 1u);
}

TEST_F(ManifestBuilderTest, ProgressIsReported) {
  // More than the 4,096 files between progress reports, in a few directories.
  for (int i = 0; i < 5000; ++i) File("d" + std::to_string(i % 4) + "/f" + std::to_string(i), 0);
  uint64_t last_files = 0;
  int calls = 0;
  ManifestBuildOptions o;
  o.on_progress = [&](uint64_t files, uint64_t) {
    last_files = files;
    ++calls;
  };
  ASSERT_TRUE(Snapshot(o).ok());
  EXPECT_GE(calls, 2);  // at least one periodic report and the final one
  EXPECT_EQ(last_files, 5000u);
}

TEST_F(ManifestBuilderTest, OverlongPathsAreSkippedAndCounted) {
  // 20 nested directories of 200 bytes each: "<dirs>/" is 4020 bytes, so a file
  // name of 8 bytes fits in 4095 and one of 100 does not. Created level by level
  // with openat, since the absolute paths are longer than PATH_MAX.
  File("ok", 1);
  int fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 20; ++i) {
    std::string name(200, static_cast<char>('a' + i));
    ASSERT_EQ(::mkdirat(fd, name.c_str(), 0755), 0);
    int next = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY);
    ::close(fd);
    ASSERT_GE(next, 0);
    fd = next;
  }
  for (const std::string& name : {std::string("fits.jpg"), std::string(100, 'z')}) {
    int f = ::openat(fd, name.c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(f, 0);
    ::close(f);
  }
  ::close(fd);
  auto m = Snapshot();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sample_count(), 2u);
  EXPECT_EQ(m->PathOf(0).size(), 4028u);  // "aaa.../fits.jpg" sorts before "ok"
  EXPECT_EQ(m->header().stats.skipped_unreadable, 1u);
}

TEST_F(ManifestBuilderTest, BadInputsAreClearErrors) {
  ManifestBuildOptions o;
  o.source_root = root_ + "/does-not-exist";
  auto missing = BuildManifest(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does-not-exist"), std::string::npos);

  File("plain", 1);
  o.source_root = root_ + "/plain";
  auto not_dir = BuildManifest(o);
  ASSERT_FALSE(not_dir.ok());
  EXPECT_NE(not_dir.status().message().find("directory"), std::string::npos);

  o.source_root = "";
  EXPECT_FALSE(BuildManifest(o).ok());

  ManifestBuildOptions bad_threads;
  bad_threads.threads = 0;
  auto t = Snapshot(bad_threads);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("threads"), std::string::npos);

  ManifestBuildOptions bad_glob;
  bad_glob.exclude = {"[oops"};
  auto g = Snapshot(bad_glob);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("exclude"), std::string::npos);

  ManifestBuildOptions bad_chunk;
  bad_chunk.source_root = root_;
  bad_chunk.chunk_size = 10;
  EXPECT_EQ(BuildManifest(bad_chunk).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ManifestBuilderTest, UnreadableDirectoryIsSkippedAndCounted) {
  if (::geteuid() == 0) {
    // Root reads everything; drop to an unprivileged user in a child to test this.
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      File("ok/a", 1);
      File("locked/b", 1);
      ::chmod((root_ + "/locked").c_str(), 0);
      ::chmod(src_.path().c_str(), 0755);
      ::chmod(root_.c_str(), 0755);
      ::chmod((root_ + "/ok").c_str(), 0755);
      ::chmod((root_ + "/ok/a").c_str(), 0644);
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      auto m = Snapshot();
      bool good = m.ok() && m->sample_count() == 1 && m->header().stats.skipped_unreadable == 1;
      ::_exit(good ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    return;
  }
  File("ok/a", 1);
  File("locked/b", 1);
  ::chmod((root_ + "/locked").c_str(), 0);
  auto m = Snapshot();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->sample_count(), 1u);
  EXPECT_EQ(m->header().stats.skipped_unreadable, 1u);
}

}  // namespace
}  // namespace granary

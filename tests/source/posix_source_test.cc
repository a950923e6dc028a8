#include "granary/source/posix_source.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/manifest_builder.h"
#include "granary/core/names.h"
#include "granary/protocol/protocol_format.h"
#include "granary/source/identity.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::Bytes;

namespace fs = std::filesystem;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;

constexpr uint32_t kNobody = 65534;

bool IsRoot() { return ::geteuid() == 0; }

std::string ThreadStatusIds() {
  std::ifstream in("/proc/thread-self/status");
  std::string line, ids;
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0 || line.rfind("Gid:", 0) == 0 || line.rfind("Groups:", 0) == 0) {
      ids += line + "\n";
    }
  }
  return ids;
}

// Sets a file's mtime (without following a symlink).
void SetMtime(const std::string& path, int64_t ns) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = ns / 1'000'000'000;
  times[1].tv_nsec = ns % 1'000'000'000;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

class PosixSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = IdentityExecutor::Start({.threads = 8});
    ASSERT_OK(e);
    executor_ = std::move(*e);
    root_ = dir_.Join("root");
    fs::create_directories(root_);
  }

  // A file under the root with Bytes(rel, size).
  void Write(const std::string& rel, size_t size) {
    dir_.WriteFile("root/" + rel, Bytes(rel, size));
  }
  std::string Path(const std::string& rel) const { return root_ + "/" + rel; }

  // The snapshot: the manifest of the root as it is now.
  void Snapshot() {
    ManifestBuildOptions options;
    options.source_root = root_;
    options.threads = 2;
    auto m = BuildManifest(options);
    ASSERT_OK(m);
    manifest_ = std::make_unique<Manifest>(std::move(*m));
  }
  SourceFile File(const std::string& rel) const {
    auto id = manifest_->Find(rel);
    EXPECT_TRUE(id.ok()) << rel << ": " << id.status().ToString();
    if (!id.ok()) return SourceFile{rel, 0, 0};
    auto f = SourceFileOf(*manifest_, *id);
    EXPECT_TRUE(f.ok());
    return f.ok() ? *f : SourceFile{};
  }

  PosixSourceOptions Options() const {
    PosixSourceOptions o;
    o.root = root_;
    o.owner = ProcessIdentity();
    o.executor = executor_.get();
    return o;
  }
  std::unique_ptr<PosixSource> OpenSource(PosixSourceOptions o) {
    auto s = PosixSource::Open(std::move(o));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<PosixSource> OpenSource() { return OpenSource(Options()); }

  static Result<std::string> ReadAll(Source& source, const SourceFile& file) {
    std::string out(file.size, '\0');
    GRANARY_RETURN_IF_ERROR(source.Read(file, 0, std::span<char>(out.data(), out.size())));
    return out;
  }

  TempDir dir_;
  std::string root_;
  std::unique_ptr<IdentityExecutor> executor_;
  std::unique_ptr<Manifest> manifest_;
};

// ---- good reads ------------------------------------------------------------

TEST_F(PosixSourceTest, ReadsEverySampleOfASnapshotExactlyOnce) {
  Write("a.bin", 1000);
  Write("d/b.bin", 1);
  Write("d/e/c.bin", 70'000);
  Write("empty", 0);
  Write("z", 4096);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  EXPECT_TRUE(source->uses_openat2());
  EXPECT_EQ(source->uri(), "file://" + root_);
  uint64_t total = 0;
  for (SampleId id = 0; id < manifest_->sample_count(); ++id) {
    auto file = SourceFileOf(*manifest_, id);
    ASSERT_OK(file);
    auto bytes = ReadAll(*source, *file);
    ASSERT_OK(bytes);
    EXPECT_EQ(*bytes, Bytes(file->path, file->size)) << file->path;
    total += file->size;
  }
  SourceCounters c = source->Counters();
  EXPECT_EQ(c.opens, 5u);  // source opens equal samples read
  EXPECT_EQ(c.completed, 5u);
  EXPECT_EQ(c.bytes, total);
  EXPECT_EQ(c.read_calls, 4u);  // one pread per non-empty local file; none for the empty one
  EXPECT_EQ(c.errors_total(), 0u);
  EXPECT_EQ(c.busy, 0u);
  EXPECT_EQ(c.in_flight, 0u);
  EXPECT_EQ(c.waiting, 0u);
  EXPECT_EQ(c.max_in_flight, 1u);
}

TEST_F(PosixSourceTest, ReadsRangesOfALargeFile) {
  constexpr size_t kSize = (1u << 20) + 123;
  Write("big", kSize);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  const SourceFile file = File("big");
  const std::string want = Bytes("big", kSize);
  constexpr size_t kPiece = 64 << 10;
  std::string got;
  for (uint64_t off = 0; off < kSize; off += kPiece) {
    std::string piece(std::min<uint64_t>(kPiece, kSize - off), '\0');
    ASSERT_OK(source->Read(file, off, std::span<char>(piece.data(), piece.size())));
    got += piece;
  }
  EXPECT_EQ(got, want);
  // A range in the middle, and an empty one at the end.
  std::string mid(1000, '\0');
  ASSERT_OK(source->Read(file, 500'001, std::span<char>(mid.data(), mid.size())));
  EXPECT_EQ(mid, want.substr(500'001, 1000));
  ASSERT_OK(source->Read(file, kSize, std::span<char>()));
  const uint64_t pieces = (kSize + kPiece - 1) / kPiece;
  EXPECT_EQ(source->Counters().opens, pieces + 2);
  EXPECT_EQ(source->Counters().bytes, kSize + 1000);
}

TEST_F(PosixSourceTest, RangesPastTheEndAreRejectedWithoutAnOpen) {
  Write("f", 100);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  const SourceFile file = File("f");
  std::string buf(101, '\0');
  Status s = source->Read(file, 0, std::span<char>(buf.data(), 101));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("past the end"));
  EXPECT_EQ(source->Read(file, 101, std::span<char>()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(source->Read(file, 60, std::span<char>(buf.data(), 41)).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(source->Read(file, UINT64_MAX, std::span<char>(buf.data(), 2)).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(source->Counters().opens, 0u);
  EXPECT_EQ(source->Counters().error(SourceErrorKind::kInvalidRequest), 4u);
}

TEST_F(PosixSourceTest, ZeroLengthFilesAreCheckedToo) {
  Write("empty", 0);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  ASSERT_OK(source->Read(File("empty"), 0, std::span<char>()));
  EXPECT_EQ(source->Counters().opens, 1u);
  EXPECT_EQ(source->Counters().read_calls, 0u);
  // It grew after the snapshot: an error, though zero bytes were asked for.
  dir_.WriteFile("root/empty", "now with bytes");
  Status s = source->Read(File("empty"), 0, std::span<char>());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("size 14 bytes, snapshot 0"));
}

TEST_F(PosixSourceTest, FollowsSymlinksThatStayInsideTheRoot) {
  Write("real/file", 300);
  fs::create_symlink("real/file", Path("link"));
  fs::create_directories(Path("x"));
  fs::create_symlink("../real/file", Path("x/uplink"));
  Snapshot();
  ASSERT_EQ(manifest_->sample_count(), 3u);  // the walk includes links to files inside
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  for (const char* name : {"link", "x/uplink"}) {
    auto bytes = ReadAll(*source, File(name));
    ASSERT_OK(bytes);
    EXPECT_EQ(*bytes, Bytes("real/file", 300)) << name;
  }
}

// ---- the file changed since the snapshot -------------------------------------

TEST_F(PosixSourceTest, ChangedSizeIsAnErrorAndNothingIsRead) {
  Write("f", 100);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  const SourceFile file = File("f");
  dir_.WriteFile("root/f", Bytes("f", 101));
  std::string buf(100, 'x');
  Status s = source->Read(file, 0, std::span<char>(buf.data(), buf.size()));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'f'"));
  EXPECT_THAT(s.message(), HasSubstr("changed since the snapshot"));
  EXPECT_THAT(s.message(), HasSubstr("size 101 bytes, snapshot 100"));
  EXPECT_THAT(s.message(), HasSubstr("re-snapshot the dataset"));
  EXPECT_EQ(buf, std::string(100, 'x'));  // no bytes returned
  SourceCounters c = source->Counters();
  EXPECT_EQ(c.opens, 1u);
  EXPECT_EQ(c.read_calls, 0u);
  EXPECT_EQ(c.bytes, 0u);
  EXPECT_EQ(c.error(SourceErrorKind::kChanged), 1u);
  EXPECT_EQ(c.completed, 0u);
}

TEST_F(PosixSourceTest, ChangedMtimeAloneIsAnError) {
  Write("f", 100);
  SetMtime(Path("f"), 1'600'000'000'123'456'789);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  const SourceFile file = File("f");
  ASSERT_EQ(file.mtime_ns, 1'600'000'000'123'456'789);
  SetMtime(Path("f"), 1'600'000'000'123'456'790);  // one nanosecond later, same bytes
  std::string buf(100, '\0');
  Status s = source->Read(file, 0, std::span<char>(buf.data(), buf.size()));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("mtime 1600000000123456790 ns, snapshot 1600000000123456789"));
  EXPECT_EQ(source->Counters().bytes, 0u);
  // The mtime set back as it was: the ctime moved with each change, and
  // nothing can set it back, so the file stays refused.
  SetMtime(Path("f"), 1'600'000'000'123'456'789);
  s = source->Read(file, 0, std::span<char>(buf.data(), buf.size()));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("ctime"));
  EXPECT_EQ(source->Counters().bytes, 0u);
}

// Security: a 300,000-byte file rewritten after the
// snapshot at the same size with its mtime restored (`touch -r`). Pieces read
// before the rewrite are the snapshot's; every piece read after it, the
// first ones again included, is refused: pieces of the two versions can
// never be joined into one sample.
TEST_F(PosixSourceTest, RewriteThatRestoresSizeAndMtimeIsRefusedForEveryPiece) {
  constexpr size_t kSize = 300'000;
  constexpr size_t kPiece = 64 << 10;
  Write("f", kSize);
  Snapshot();
  PosixSourceOptions o = Options();
  o.dataset = "pets";
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  const SourceFile file = File("f");
  ASSERT_NE(file.ctime_ns, 0);
  ASSERT_NE(file.inode, 0u);
  const std::string old_bytes = Bytes("f", kSize);
  for (uint64_t off = 0; off < 2 * kPiece; off += kPiece) {
    std::string piece(kPiece, '\0');
    ASSERT_OK(source->Read(file, off, std::span<char>(piece.data(), piece.size())));
    EXPECT_EQ(piece, old_bytes.substr(off, kPiece));
  }
  testing::RewriteKeepingMtime(Path("f"), Bytes("f, version 2", kSize));
  struct stat st {};
  ASSERT_EQ(::stat(Path("f").c_str(), &st), 0);
  ASSERT_EQ(static_cast<uint64_t>(st.st_size), file.size);
  ASSERT_EQ(st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec, file.mtime_ns);

  for (uint64_t off = 0; off < kSize; off += kPiece) {
    std::string piece(std::min<uint64_t>(kPiece, kSize - off), 'x');
    Status s = source->Read(file, off, std::span<char>(piece.data(), piece.size()));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << "bytes from " << off;
    EXPECT_THAT(s.message(), HasSubstr("'f'"));
    EXPECT_THAT(s.message(), HasSubstr("changed since the snapshot"));
    EXPECT_THAT(s.message(), HasSubstr("ctime "));
    EXPECT_THAT(s.message(), HasSubstr("its ctime moved, size and mtime kept"));
    // What changed and what to do come first: a cache node's reply keeps only
    // the start of an item's message.
    const std::string command = "`granary dataset snapshot pets`";
    EXPECT_LE(s.message().find(command) + command.size(), protocol_format::kMaxItemMessageLength)
        << s.message();
    EXPECT_EQ(piece, std::string(piece.size(), 'x')) << "no bytes returned from " << off;
  }
  SourceCounters c = source->Counters();
  EXPECT_EQ(c.completed, 2u);
  EXPECT_EQ(c.bytes, 2 * kPiece);  // nothing read after the rewrite
  EXPECT_EQ(c.error(SourceErrorKind::kChanged), 5u);
}

// The same file swapped for another by a rename: same name, size and mtime,
// another inode.
TEST_F(PosixSourceTest, FileRenamedOverWithTheSameSizeAndMtimeIsRefused) {
  Write("cls/f", 5000);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  const SourceFile file = File("cls/f");
  testing::ReplaceKeepingMtime(Path("cls/f"), Bytes("another f", 5000));
  struct stat st {};
  ASSERT_EQ(::stat(Path("cls/f").c_str(), &st), 0);
  ASSERT_EQ(st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec, file.mtime_ns);
  ASSERT_NE(st.st_ino, file.inode);
  std::string buf(5000, 'x');
  Status s = source->Read(file, 0, std::span<char>(buf.data(), buf.size()));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'cls/f'"));
  EXPECT_THAT(s.message(), HasSubstr("another file was renamed over it"));
  EXPECT_THAT(s.message(), HasSubstr("inode " + std::to_string(st.st_ino) + ", snapshot " +
                                     std::to_string(file.inode)));
  EXPECT_THAT(s.message(), HasSubstr("`granary dataset snapshot NAME`"));
  EXPECT_EQ(buf, std::string(5000, 'x'));
  EXPECT_EQ(source->Counters().bytes, 0u);
}

// A manifest of format version 1 or 2 recorded no ctime or inode (0 in the
// SourceFile): size and mtime are checked as before, the rest cannot be.
TEST_F(PosixSourceTest, WithoutARecordedCtimeAndInodeSizeAndMtimeAreChecked) {
  Write("f", 100);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  SourceFile old = File("f");
  old.ctime_ns = 0;
  old.inode = 0;
  testing::ReplaceKeepingMtime(Path("f"), Bytes("f2", 100));
  auto bytes = ReadAll(*source, old);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes("f2", 100));
  EXPECT_EQ(ReadAll(*source, File("f")).status().code(), StatusCode::kFailedPrecondition);
  old.size = 99;
  Status s = source->Read(old, 0, std::span<char>(bytes->data(), 99));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("size 100 bytes, snapshot 99"));
}

TEST_F(PosixSourceTest, DeletedFileIsNotFound) {
  Write("d/f", 10);
  Write("g", 10);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  fs::remove(Path("g"));
  Status s = ReadAll(*source, File("g")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no longer exists"));
  // Its directory replaced by a file.
  fs::remove_all(Path("d"));
  dir_.WriteFile("root/d", "x");
  s = ReadAll(*source, File("d/f")).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("no longer a directory"));
  EXPECT_EQ(source->Counters().error(SourceErrorKind::kNotFound), 2u);
}

// Directories are opened once and kept: a directory deleted and made again
// since (with the same files) is opened afresh, and one replaced by a symlink
// leading out of the root is refused, never followed.
TEST_F(PosixSourceTest, KeptDirectoriesFollowTheSourceAndStayInside) {
  Write("cls/a", 10);
  Write("cls/b", 20);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  ASSERT_OK(ReadAll(*source, File("cls/a")));  // cls is kept from here on
  // cls made again with the same files (same bytes, same mtimes): another
  // file (the file system may even reuse the inode number; the ctime moved),
  // so the snapshot's is refused once the new directory was found; as a
  // manifest without ctimes and inodes (version 2) saw it, it reads.
  const fs::file_time_type b_mtime = fs::last_write_time(Path("cls/b"));
  fs::remove_all(Path("cls"));
  Write("cls/b", 20);
  fs::last_write_time(Path("cls/b"), b_mtime);
  Status replaced = ReadAll(*source, File("cls/b")).status();
  EXPECT_EQ(replaced.code(), StatusCode::kFailedPrecondition) << replaced.ToString();
  EXPECT_THAT(replaced.message(), HasSubstr("changed since the snapshot"));
  SourceFile b_file = File("cls/b");
  b_file.ctime_ns = 0;
  b_file.inode = 0;
  auto b = ReadAll(*source, b_file);
  ASSERT_OK(b);
  EXPECT_EQ(*b, Bytes("cls/b", 20));
  // cls replaced by a link to a directory outside the root holding a file
  // of the same name, size and mtime: refused as outside.
  TempDir outside;
  outside.WriteFile("a", Bytes("cls/a", 10));
  fs::last_write_time(outside.Join("a"), fs::last_write_time(Path("cls/b")));
  fs::remove_all(Path("cls"));
  fs::create_directory_symlink(outside.path(), Path("cls"));
  Status s = ReadAll(*source, b_file).status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("outside the source root"));
  EXPECT_EQ(source->Counters().error(SourceErrorKind::kUnsafePath), 1u);
}

TEST_F(PosixSourceTest, FileReplacedByAFifoOrADirectoryIsAnErrorNotAHang) {
  Write("fifo", 10);
  Write("dir", 10);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  fs::remove(Path("fifo"));
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0644), 0);
  fs::remove(Path("dir"));
  fs::create_directories(Path("dir"));
  Status s = ReadAll(*source, File("fifo")).status();  // would block forever without O_NONBLOCK
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("it is a FIFO now"));
  s = ReadAll(*source, File("dir")).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("it is a directory now"));
  EXPECT_EQ(source->Counters().error(SourceErrorKind::kChanged), 2u);
}

TEST_F(PosixSourceTest, ChangesDuringTheReadAreErrors) {
  Write("grows", 5000);
  Write("shrinks", 5000);
  Write("rewritten", 5000);
  Write("restored", 5000);
  Snapshot();
  const SourceFile grows = File("grows");
  const SourceFile shrinks = File("shrinks");
  const SourceFile rewritten = File("rewritten");
  const SourceFile restored = File("restored");
  PosixSourceOptions o = Options();
  // Between the check and the read, change the file the way a writer would.
  o.stage_hook = [&](SourceReadStage stage, const SourceFile& f) {
    if (stage != SourceReadStage::kChecked) return;
    std::string p = Path(f.path);
    if (f.path == "grows") {
      std::ofstream(p, std::ios::app) << "more";
    } else if (f.path == "shrinks") {
      ASSERT_EQ(::truncate(p.c_str(), 3000), 0);
    } else if (f.path == "restored") {
      // Same size, new bytes, the mtime set back: only the ctime moves.
      testing::RewriteKeepingMtime(p, Bytes("restored, version 2", 5000));
    } else {
      std::fstream out(p, std::ios::in | std::ios::out | std::ios::binary);
      out.seekp(10);
      out << "XYZ";  // same size, new bytes; the mtime moves
      out.close();
      SetMtime(p, f.mtime_ns + 1);
    }
  };
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  Status s = ReadAll(*source, grows).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("size 5004 bytes, snapshot 5000"));
  EXPECT_THAT(s.message(), HasSubstr("during the read"));
  s = ReadAll(*source, shrinks).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("ended after 3000 of 5000 bytes"));
  s = ReadAll(*source, rewritten).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("during the read"));
  s = ReadAll(*source, restored).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("ctime "));
  EXPECT_THAT(s.message(), HasSubstr("during the read"));
  SourceCounters c = source->Counters();
  EXPECT_EQ(c.error(SourceErrorKind::kChanged), 4u);
  EXPECT_EQ(c.completed, 0u);
}

// ---- paths that must not escape the root -----------------------------------

TEST_F(PosixSourceTest, MalformedPathsAreRejectedBeforeAnyOpen) {
  dir_.WriteFile("outside", "secret");
  Write("a/b", 6);
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  const std::vector<std::string> bad = {
      "",
      "/etc/passwd",
      "../outside",
      "a/../../outside",
      "a/../b",
      "./a/b",
      "a/./b",
      "a//b",
      "a/b/",
      "..",
      ".",
      "a/..",
      "a/b/..",
      std::string("a\0b", 3),
      std::string(4096, 'x'),
  };
  for (const std::string& path : bad) {
    char buf[6];
    Status s = source->Read(SourceFile{path, 6, 0}, 0, std::span<char>(buf, 6));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << Quoted(path);
    EXPECT_THAT(s.message(), HasSubstr("from 'file://")) << Quoted(path);
  }
  EXPECT_EQ(source->Counters().opens, 0u);
  EXPECT_EQ(source->Counters().error(SourceErrorKind::kInvalidRequest), bad.size());
}

class EscapeTest : public PosixSourceTest, public ::testing::WithParamInterface<bool> {};

TEST_P(EscapeTest, ASymlinkSwappedInThatLeadsOutsideIsRefused) {
  const bool openat2 = GetParam();
  // Outside the root: a file identical to the snapshot's, so that only the
  // escape check can stop the read.
  Write("f", 100);
  Write("d/g", 100);
  Snapshot();
  const SourceFile f = File("f");
  const SourceFile g = File("d/g");
  dir_.WriteFile("outside/f", Bytes("f", 100));
  dir_.WriteFile("outside/d/g", Bytes("d/g", 100));
  SetMtime(dir_.Join("outside/f"), f.mtime_ns);
  SetMtime(dir_.Join("outside/d/g"), g.mtime_ns);
  // The file swapped for an absolute symlink; the directory for a relative one.
  fs::remove(Path("f"));
  fs::create_symlink(dir_.Join("outside/f"), Path("f"));
  fs::remove_all(Path("d"));
  fs::create_symlink("../outside/d", Path("d"));
  // And a link to the root's parent, used as a directory.
  fs::create_symlink("..", Path("up"));

  PosixSourceOptions o = Options();
  o.use_openat2 = openat2;
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(source->uses_openat2(), openat2);
  for (const SourceFile& file : {f, g, SourceFile{"up/outside/f", 100, f.mtime_ns}}) {
    std::string buf(100, '\0');
    Status s = source->Read(file, 0, std::span<char>(buf.data(), buf.size()));
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << file.path << ": " << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(openat2 ? "outside the source root" : "symlink"));
    EXPECT_THAT(s.message(), HasSubstr(Quoted(file.path)));
    EXPECT_NE(buf, Bytes(file.path == "d/g" ? "d/g" : "f", 100));
  }
  SourceCounters c = source->Counters();
  EXPECT_EQ(c.error(SourceErrorKind::kUnsafePath), 3u);
  EXPECT_EQ(c.bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Openat2AndWalk, EscapeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "openat2" : "walk";
                         });

TEST_F(PosixSourceTest, WithoutOpenat2SymlinksInsideAreRefusedButFilesRead) {
  Write("real/file", 50);
  Write("a/b/c", 70);
  fs::create_symlink("real/file", Path("link"));
  Snapshot();
  PosixSourceOptions o = Options();
  o.use_openat2 = false;
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  auto bytes = ReadAll(*source, File("a/b/c"));
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes("a/b/c", 70));
  Status s = ReadAll(*source, File("link")).status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("without openat2"));
  fs::remove(Path("a/b/c"));
  EXPECT_EQ(ReadAll(*source, File("a/b/c")).status().code(), StatusCode::kNotFound);
}

// ---- opening a source -------------------------------------------------------

// Security: the root is opened without following a symbolic link on
// its path, as the snapshot walks it, so a link re-pointed after the snapshot
// (/data/link -> /etc) cannot swap the tree that staging reads.
TEST_F(PosixSourceTest, OpenRefusesARootPathThroughASymbolicLink) {
  Write("a", 10);
  fs::create_directory_symlink(root_, dir_.Join("link"));
  fs::create_directory_symlink(dir_.path(), dir_.Join("alias"));
  for (const auto& [root, link] : std::vector<std::pair<std::string, std::string>>{
           {dir_.Join("link"), dir_.Join("link")}, {dir_.Join("alias/root"), dir_.Join("alias")}}) {
    PosixSourceOptions o = Options();
    o.root = root;
    Status s = PosixSource::Open(o).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("passes through the symbolic link '" + link + "'"));
    EXPECT_THAT(s.message(), HasSubstr("resolves to '" + root_ + "'"));
  }
  EXPECT_NE(OpenSource(), nullptr) << "the resolved path itself opens";
}

TEST_F(PosixSourceTest, OpenRejectsBadOptions) {
  PosixSourceOptions o = Options();
  o.executor = nullptr;
  EXPECT_EQ(PosixSource::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.max_in_flight = 0;
  EXPECT_EQ(PosixSource::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.max_in_flight = kMaxSourceInFlight + 1;
  EXPECT_EQ(PosixSource::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.root = "";
  EXPECT_EQ(PosixSource::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.root = dir_.Join("missing");
  Status s = PosixSource::Open(o).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("does not exist"));
  dir_.WriteFile("plain", "x");
  o.root = dir_.Join("plain");
  s = PosixSource::Open(o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not a directory"));
  o = Options();
  o.owner.uid = kInvalidId;
  EXPECT_EQ(PosixSource::Open(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(PosixSourceUriTest, RootFromUri) {
  EXPECT_EQ(*PosixSource::RootFromUri("file:///lustre/imagenet/train"), "/lustre/imagenet/train");
  EXPECT_EQ(*PosixSource::RootFromUri("file:///data/"), "/data");
  EXPECT_EQ(*PosixSource::RootFromUri("file:///"), "/");
  for (std::string_view bad :
       {"s3://bucket/x", "file://host/x", "file://", "file:relative", "/plain/path", ""}) {
    EXPECT_EQ(PosixSource::RootFromUri(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(PosixSource::RootFromUri(std::string_view("file:///a\0b", 11)).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- counters and the in-flight bound --------------------------------------

TEST_F(PosixSourceTest, CountersAreExactInAMixedRun) {
  for (int i = 0; i < 20; ++i) Write("f" + std::to_string(i), static_cast<size_t>(i) * 10);
  Snapshot();
  auto source = OpenSource();
  ASSERT_NE(source, nullptr);
  fs::remove(Path("f3"));
  fs::remove(Path("f4"));
  dir_.WriteFile("root/f5", "changed");
  uint64_t bytes = 0;
  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    SourceFile file = File("f" + std::to_string(i));
    if (ReadAll(*source, file).ok()) {
      bytes += file.size;
      ++ok;
    }
  }
  char c1[1];
  EXPECT_FALSE(source->Read(SourceFile{"../x", 1, 0}, 0, std::span<char>(c1, 1)).ok());
  SourceCounters c = source->Counters();
  EXPECT_EQ(ok, 17);
  EXPECT_EQ(c.opens, 20u);
  EXPECT_EQ(c.completed, 17u);
  EXPECT_EQ(c.bytes, bytes);
  EXPECT_EQ(c.read_calls, 16u);  // f0 is empty
  EXPECT_EQ(c.error(SourceErrorKind::kNotFound), 2u);
  EXPECT_EQ(c.error(SourceErrorKind::kChanged), 1u);
  EXPECT_EQ(c.error(SourceErrorKind::kInvalidRequest), 1u);
  EXPECT_EQ(c.errors_total(), 4u);
}

TEST_F(PosixSourceTest, NoMoreThanMaxInFlightReadsAtOnce) {
  constexpr int kFiles = 16;
  constexpr uint32_t kLimit = 3;
  for (int i = 0; i < kFiles; ++i) Write("f" + std::to_string(i), 100);
  Snapshot();
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;        // readers between open and return; guarded by mu
  int max_inside = 0;    // guarded by mu
  bool release = false;  // guarded by mu
  PosixSourceOptions o = Options();
  o.max_in_flight = kLimit;
  o.stage_hook = [&](SourceReadStage stage, const SourceFile&) {
    std::unique_lock<std::mutex> lock(mu);
    if (stage == SourceReadStage::kBeforeOpen) {
      max_inside = std::max(max_inside, ++inside);
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
    } else if (stage == SourceReadStage::kRead) {
      --inside;
    }
  };
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  std::atomic<int> ok{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < kFiles; ++i) {
    readers.emplace_back([&, i] {
      if (ReadAll(*source, File("f" + std::to_string(i))).ok()) ++ok;
    });
  }
  // Three hold a slot (stopped in the hook); the other thirteen wait for one.
  EXPECT_TRUE(WaitFor([&] {
    SourceCounters c = source->Counters();
    return c.in_flight == kLimit && c.waiting == kFiles - kLimit;
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(inside, static_cast<int>(kLimit));
  }
  // TryRead does not wait.
  char buf[100];
  Status busy = source->TryRead(File("f0"), 0, std::span<char>(buf, 100));
  EXPECT_EQ(busy.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(busy.message(), HasSubstr("3 source reads are in flight"));
  EXPECT_EQ(source->Counters().busy, 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  for (auto& t : readers) t.join();
  EXPECT_EQ(ok.load(), kFiles);
  EXPECT_EQ(max_inside, static_cast<int>(kLimit));
  SourceCounters c = source->Counters();
  EXPECT_EQ(c.max_in_flight, kLimit);
  EXPECT_EQ(c.in_flight, 0u);
  EXPECT_EQ(c.waiting, 0u);
  EXPECT_EQ(c.opens, static_cast<uint64_t>(kFiles));  // the refused TryRead opened nothing
  EXPECT_EQ(c.errors_total(), 0u);
  // With a slot free again, TryRead reads.
  EXPECT_OK(source->TryRead(File("f0"), 0, std::span<char>(buf, 100)));
}

TEST_F(PosixSourceTest, BoundHoldsUnderAFreeRunningPool) {
  constexpr int kFiles = 300;
  constexpr uint32_t kLimit = 2;
  for (int i = 0; i < kFiles; ++i)
    Write("d" + std::to_string(i % 7) + "/f" + std::to_string(i), 64);
  Snapshot();
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  PosixSourceOptions o = Options();
  o.max_in_flight = kLimit;
  o.stage_hook = [&](SourceReadStage stage, const SourceFile&) {
    if (stage == SourceReadStage::kBeforeOpen) {
      int now = ++inside;
      int seen = max_inside.load();
      while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::yield();  // widen the window for overlap
    } else if (stage == SourceReadStage::kRead) {
      --inside;
    }
  };
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  std::atomic<SampleId> next{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t) {
    pool.emplace_back([&] {
      for (SampleId id = next++; id < manifest_->sample_count(); id = next++) {
        auto file = SourceFileOf(*manifest_, id);
        if (!file.ok() || !ReadAll(*source, *file).ok()) ++failed;
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LE(max_inside.load(), static_cast<int>(kLimit));
  SourceCounters c = source->Counters();
  EXPECT_LE(c.max_in_flight, kLimit);
  EXPECT_EQ(c.opens, static_cast<uint64_t>(kFiles));
  EXPECT_EQ(c.completed, static_cast<uint64_t>(kFiles));
  EXPECT_EQ(c.bytes, static_cast<uint64_t>(kFiles) * 64);
}

// Without CAP_SETUID/CAP_SETGID a source can only be read as the process
// itself; another user's dataset is refused at Open with the reason.
int OpenOthersDatasetUnprivileged(const std::string& root) {
  auto executor = IdentityExecutor::Start({.threads = 2});
  if (!executor.ok() || (*executor)->can_switch()) return 10;
  Identity self = ProcessIdentity();
  PosixSourceOptions o;
  o.root = root;
  o.executor = executor->get();
  o.owner = Identity{self.uid == 0 ? 1u : 0u, self.gid, {}, ""};
  Status s = PosixSource::Open(o).status();
  if (s.code() != StatusCode::kPermissionDenied) return 11;
  if (s.message().find("without CAP_SETUID and CAP_SETGID") == std::string::npos) return 12;
  if (s.message().find("run the cache node as root") == std::string::npos) return 13;
  o.owner = self;
  if (!PosixSource::Open(o).ok()) return 14;
  return 0;
}

TEST_F(PosixSourceTest, AnotherUsersDatasetNeedsPrivileges) {
  if (!IsRoot()) {
    EXPECT_EQ(OpenOthersDatasetUnprivileged(root_), 0);
    return;
  }
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  executor_.reset();  // no threads of ours while forking
  const std::string root = root_;
  auto child = testing::ChildProcess::Start([root](int) {
    gid_t groups[1] = {kNobody};
    if (::setgroups(1, groups) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      return 1;
    }
    return OpenOthersDatasetUnprivileged(root);
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(std::chrono::seconds(20));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "check number " << *code << " failed in the unprivileged child";
}

// ---- reading as the dataset's owner (root only) ------------------------------

class OwnerTest : public PosixSourceTest {
 protected:
  void SetUp() override {
    if (!IsRoot()) {
      GTEST_SKIP() << "needs root: reading as another user needs CAP_SETUID and CAP_SETGID "
                      "(CI runs the suite as root)";
    }
    PosixSourceTest::SetUp();
    // The test's scratch directory is 0700: let other users search it.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
    ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
    for (uint32_t gid = 47011; gid < 48000; ++gid) {
      if (::getgrgid(gid) == nullptr) {
        group_ = gid;
        break;
      }
    }
    ASSERT_NE(group_, 0u) << "no unused gid in 47011..47999";
  }

  Identity Nobody() {
    auto id = ResolveOwnerIdentity(kNobody, kNobody);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : Identity{kNobody, kNobody, {kNobody}, ""};
  }
  void Chmod(const std::string& rel, mode_t mode, uint32_t gid = 0) {
    ASSERT_EQ(::chown(Path(rel).c_str(), 0, gid), 0);
    ASSERT_EQ(::chmod(Path(rel).c_str(), mode), 0);
  }

  uint32_t group_ = 0;
};

TEST_F(OwnerTest, AFileOnlyRootCanReadIsDeniedToItsOwnerNobody) {
  Write("secret.bin", 100);
  Write("public.bin", 100);
  Write("group.bin", 100);
  Write("closed/inside.bin", 100);
  Chmod("secret.bin", 0600);
  Chmod("public.bin", 0644);
  Chmod("group.bin", 0640, group_);
  Chmod("closed", 0700);
  Chmod("closed/inside.bin", 0644);
  Snapshot();

  PosixSourceOptions o = Options();
  o.owner = Nobody();
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  const std::string before = ThreadStatusIds();

  Status s = ReadAll(*source, File("secret.bin")).status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("'secret.bin'"));
  EXPECT_THAT(s.message(), HasSubstr("owner uid 65534"));
  EXPECT_THAT(s.message(), HasSubstr("may not read this file"));
  auto bytes = ReadAll(*source, File("public.bin"));
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes("public.bin", 100));
  EXPECT_EQ(ReadAll(*source, File("group.bin")).status().code(), StatusCode::kPermissionDenied);
  s = ReadAll(*source, File("closed/inside.bin")).status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);  // no search right on its directory
  EXPECT_EQ(source->Counters().error(SourceErrorKind::kPermissionDenied), 3u);
  EXPECT_EQ(source->Counters().completed, 1u);

  // The calling thread's identity is untouched by reads as someone else.
  EXPECT_EQ(ThreadStatusIds(), before);

  // A member of the file's group reads it; an explicit group list, since the
  // user database does not know this test's group.
  PosixSourceOptions member = Options();
  member.owner = Identity{kNobody, kNobody, {group_, kNobody}, "nobody"};
  auto as_member = OpenSource(std::move(member));
  ASSERT_NE(as_member, nullptr);
  bytes = ReadAll(*as_member, File("group.bin"));
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes("group.bin", 100));
  EXPECT_EQ(ReadAll(*as_member, File("secret.bin")).status().code(), StatusCode::kPermissionDenied);

  // Root as the owner reads everything: the difference is the identity alone.
  PosixSourceOptions as_root = Options();
  as_root.owner = Identity{0, 0, {0}, "root"};
  auto root_source = OpenSource(std::move(as_root));
  ASSERT_NE(root_source, nullptr);
  EXPECT_OK(ReadAll(*root_source, File("secret.bin")));
  EXPECT_OK(ReadAll(*root_source, File("closed/inside.bin")));
}

TEST_F(OwnerTest, TheOwnerMustBeAbleToReachTheRoot) {
  ASSERT_EQ(::chmod(root_.c_str(), 0700), 0);
  PosixSourceOptions o = Options();
  o.owner = Nobody();
  Status s = PosixSource::Open(o).status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("uid 65534"));
  EXPECT_THAT(s.message(), HasSubstr("search (x) permission"));
  // A directory above the root that the owner cannot search stops it too,
  // though the root itself is open to all.
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  fs::create_directories(Path("sub"));
  ASSERT_EQ(::chmod(Path("sub").c_str(), 0755), 0);
  ASSERT_EQ(::chmod(root_.c_str(), 0700), 0);
  o.root = Path("sub");
  EXPECT_EQ(PosixSource::Open(o).status().code(), StatusCode::kPermissionDenied);
}

// The chunk handoff's question for a local user other than the owner: may
// they read these files at the source? Asked of a source that root owns.
TEST_F(OwnerTest, CheckReadableAnswersForAnotherUserAsTheKernelWould) {
  Write("public.bin", 100);
  Write("secret.bin", 100);
  Write("group.bin", 100);
  Write("closed/inside.bin", 100);
  Write("open/inside.bin", 100);
  Chmod("public.bin", 0644);
  Chmod("secret.bin", 0600);
  Chmod("group.bin", 0640, group_);
  Chmod("closed", 0700);
  Chmod("closed/inside.bin", 0644);
  Chmod("open", 0755);
  Chmod("open/inside.bin", 0644);
  Snapshot();
  const std::vector<SourceFile> public_files = {File("public.bin"), File("open/inside.bin")};
  const Identity member{kNobody, kNobody, {group_, kNobody}, "nobody"};
  const Identity root{0, 0, {0}, "root"};

  for (bool openat2 : {true, false}) {
    SCOPED_TRACE(openat2 ? "openat2" : "walk without openat2");
    PosixSourceOptions o = Options();  // owned by root
    o.use_openat2 = openat2;
    auto source = OpenSource(std::move(o));
    ASSERT_NE(source, nullptr);

    EXPECT_OK(source->CheckReadable(Nobody(), public_files));
    Status s = source->CheckReadable(
        Nobody(), std::vector<SourceFile>{File("public.bin"), File("secret.bin")});
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(s.message(), HasSubstr("uid 65534"));
    EXPECT_THAT(s.message(), HasSubstr("may not read 'secret.bin'"));
    s = source->CheckReadable(Nobody(), std::vector<SourceFile>{File("closed/inside.bin")});
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);  // no search right on its directory
    EXPECT_THAT(s.message(), HasSubstr("'closed/inside.bin'"));
    // Its groups count, as for the kernel.
    EXPECT_EQ(source->CheckReadable(Nobody(), std::vector<SourceFile>{File("group.bin")}).code(),
              StatusCode::kPermissionDenied);
    EXPECT_OK(source->CheckReadable(member, std::vector<SourceFile>{File("group.bin")}));
    EXPECT_OK(source->CheckReadable(
        root, std::vector<SourceFile>{File("secret.bin"), File("closed/inside.bin")}));
    // Checks are not reads of the source.
    EXPECT_EQ(source->Counters().opens, 0u);
  }

  PosixSourceOptions o = Options();
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  // A file replaced since the snapshot: the staged bytes may be another
  // file's, whatever the new one allows.
  const std::string replacement = Path("public.bin.new");
  {
    std::ofstream out(replacement);
    out << Bytes("public.bin", 100);
  }
  ASSERT_EQ(::chmod(replacement.c_str(), 0644), 0);
  ASSERT_EQ(::rename(replacement.c_str(), Path("public.bin").c_str()), 0);
  Status s = source->CheckReadable(Nobody(), std::vector<SourceFile>{File("public.bin")});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("changed since the snapshot"));
  // A deleted file is not found.
  ASSERT_EQ(::unlink(Path("open/inside.bin").c_str()), 0);
  EXPECT_EQ(
      source->CheckReadable(Nobody(), std::vector<SourceFile>{File("open/inside.bin")}).code(),
      StatusCode::kNotFound);
  // A root the user cannot reach: nothing below it is readable to them.
  ASSERT_EQ(::chmod(root_.c_str(), 0700), 0);
  s = source->CheckReadable(Nobody(), std::vector<SourceFile>{File("secret.bin")});
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("the source root"));
}

TEST_F(OwnerTest, CallingThreadsKeepTheirIdentityUnderConcurrentReads) {
  for (int i = 0; i < 40; ++i) Write("f" + std::to_string(i), 256);
  Snapshot();
  PosixSourceOptions o = Options();
  o.owner = Nobody();
  o.max_in_flight = 4;
  auto source = OpenSource(std::move(o));
  ASSERT_NE(source, nullptr);
  std::atomic<int> changed{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 6; ++t) {
    readers.emplace_back([&, t] {
      const std::string before = ThreadStatusIds();
      for (int i = t; i < 40; i += 6) {
        if (!ReadAll(*source, File("f" + std::to_string(i))).ok()) ++failed;
        if (ThreadStatusIds() != before) ++changed;
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(changed.load(), 0);
  EXPECT_EQ(source->Counters().opens, 40u);
}

}  // namespace
}  // namespace granary

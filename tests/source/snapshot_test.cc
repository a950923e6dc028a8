// SnapshotAsOwner and SnapshotDataset (source/include/granary/source/snapshot.h)
// on real trees and a real SQLite store: the walk in this process and in a
// fork()ed child that became the owner (root only), the failures a dataset's
// message must explain (missing, not a directory, not readable by the owner),
// abandoning a walk, and the record's life: claim by compare-and-set, Staging
// with the manifest, Failed with the reason, Pending when stopped or when the
// spec changed during the walk. The helper process mode (posix_spawn of
// `granary-cachenode --snapshot-child`) runs in the cache node's suites
// (tests/integration/cachenode_snapshot_test.cc).

#include "granary/source/snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "granary/core/manifest_builder.h"
#include "granary/core/metadata_store.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "granary/store/open_store.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint32_t kNobody = 65534;

bool IsRoot() { return ::geteuid() == 0; }

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Others may search the temp dir (0700 by default), so that an owner
    // other than root can reach the tree.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
    root_ = dir_.Join("src");
    for (size_t i = 0; i < 12; ++i) {
      dir_.WriteFile("src/d" + std::to_string(i % 3) + "/f" + std::to_string(i) + ".bin",
                     testing::Bytes("f" + std::to_string(i), 100 + 37 * i));
    }
    // Only root may list this one.
    ASSERT_EQ(::mkdir(dir_.Join("src/secret").c_str(), 0700), 0);
    dir_.WriteFile("src/secret/key.bin", "root only");
    auto store = OpenMetadataStore("sqlite://" + dir_.Join("granary.db"));
    ASSERT_OK(store);
    store_ = std::move(*store);
  }

  ManifestBuildOptions Options(const std::string& root) const {
    ManifestBuildOptions o;
    o.source_root = root;
    o.source_uri = "file://" + root;
    o.chunk_size = 4096;
    o.threads = 2;
    return o;
  }

  DatasetRecord CreateRecord(const std::string& name, const std::string& root, DatasetOwner owner,
                             SnapshotBy by = SnapshotBy::kPool) {
    DatasetRecord r;
    r.name = name;
    r.spec.source_uri = "file://" + root;
    r.spec.chunk_size = 4096;
    r.spec.snapshot_by = by;
    r.owner = owner;
    r.state = {DatasetPhase::kPending, "created", ""};
    auto created = store_->CreateDataset(r);
    EXPECT_OK(created);
    return created.ok() ? *created : r;
  }

  DatasetOwner Self() const { return {::geteuid(), ::getegid()}; }

  testing::TempDir dir_;
  std::string root_;
  std::unique_ptr<MetadataStore> store_;
};

// No child is left behind (every fork reaped).
void ExpectNoChildren() {
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(SnapshotTest, OwnTreeIsWalkedInThisProcess) {
  auto manifest = SnapshotAsOwner(Self(), Options(root_));
  ASSERT_OK(manifest);
  auto direct = BuildManifest(Options(root_));
  ASSERT_OK(direct);
  EXPECT_EQ(manifest->id(), direct->id());
  EXPECT_EQ(manifest->sample_count(), 13u) << "the tree is this process's own";
}

TEST_F(SnapshotTest, ForkedChildBecomesTheOwnerAndSeesOnlyWhatTheOwnerMay) {
  if (!IsRoot()) GTEST_SKIP() << "needs root to become another owner";
  ManifestBuildOptions o = Options(root_);
  uint64_t last_files = 0;
  int calls = 0;
  o.on_progress = [&](uint64_t files, uint64_t) {
    last_files = files;
    ++calls;
  };
  auto manifest = SnapshotAsOwner({kNobody, kNobody}, o);
  ASSERT_OK(manifest);
  EXPECT_EQ(manifest->sample_count(), 12u);
  EXPECT_FALSE(manifest->Find("secret/key.bin").ok());
  EXPECT_GE(calls, 1) << "the child's progress reached the parent";
  EXPECT_EQ(last_files, 12u);
  // Root's own walk has the file: the difference is the identity, not the tree.
  auto as_root = SnapshotAsOwner({0, 0}, Options(root_));
  ASSERT_OK(as_root);
  EXPECT_OK(as_root->Find("secret/key.bin"));
  ExpectNoChildren();
}

TEST_F(SnapshotTest, FailuresSayWhatIsWrongWithTheRoot) {
  std::vector<DatasetOwner> owners = {Self()};
  if (IsRoot()) owners.push_back({kNobody, kNobody});  // in a forked child
  for (const DatasetOwner& owner : owners) {
    SCOPED_TRACE("uid " + std::to_string(owner.uid));
    auto missing = SnapshotAsOwner(owner, Options(dir_.Join("nope")));
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
    EXPECT_THAT(missing.status().message(), HasSubstr("does not exist"));
    EXPECT_THAT(missing.status().message(), HasSubstr(dir_.Join("nope")));

    auto file = SnapshotAsOwner(owner, Options(root_ + "/d0/f0.bin"));
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument) << file.status().ToString();
    EXPECT_THAT(file.status().message(), HasSubstr("is not a directory"));
  }
  if (IsRoot()) {
    auto secret = SnapshotAsOwner({kNobody, kNobody}, Options(root_ + "/secret"));
    ASSERT_FALSE(secret.ok());
    EXPECT_EQ(secret.status().code(), StatusCode::kPermissionDenied) << secret.status().ToString();
    EXPECT_THAT(secret.status().message(), HasSubstr("uid 65534 may not read"));
    auto below = SnapshotAsOwner({kNobody, kNobody}, Options(root_ + "/secret/deeper"));
    ASSERT_FALSE(below.ok());
    EXPECT_EQ(below.status().code(), StatusCode::kPermissionDenied) << below.status().ToString();
    EXPECT_THAT(below.status().message(), HasSubstr("no search right"));
  }
  ExpectNoChildren();
}

TEST_F(SnapshotTest, NonRootMayWalkOnlyAsItself) {
  if (IsRoot()) GTEST_SKIP() << "runs as root: every owner is allowed";
  auto other = SnapshotAsOwner({::geteuid() + 1, ::getegid()}, Options(root_));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("only as itself"));
}

TEST_F(SnapshotTest, KeepGoingFalseKillsTheChild) {
  if (!IsRoot()) GTEST_SKIP() << "needs root: without an identity switch the walk has no child";
  SnapshotProcess process;
  int asked = 0;
  process.keep_going = [&] {
    ++asked;
    return false;
  };
  auto abandoned = SnapshotAsOwner({kNobody, kNobody}, Options(root_), process);
  ASSERT_FALSE(abandoned.ok());
  EXPECT_EQ(abandoned.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(abandoned.status().message(), HasSubstr("abandoned"));
  EXPECT_EQ(asked, 1);
  ExpectNoChildren();
}

// ---- SnapshotDataset ------------------------------------------------------------

TEST_F(SnapshotTest, ClientSnapshotSetsStagingWithTheManifest) {
  DatasetRecord record = CreateRecord("pets", root_, Self(), SnapshotBy::kClient);
  DatasetSnapshotOptions o;
  o.walk_threads = 2;
  auto snap = SnapshotDataset(*store_, record, o);
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kSnapshotted);
  auto stored = store_->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.phase, DatasetPhase::kStaging);
  EXPECT_EQ(stored->state.claimed_by, "");
  EXPECT_EQ(stored->manifest_id, snap->manifest_id);
  EXPECT_THAT(stored->state.message,
              StartsWith("snapshot: " + std::to_string(snap->files) + " files, "));
  EXPECT_THAT(stored->state.message, HasSubstr(std::to_string(snap->chunks) + " chunks"));
  auto blob = store_->GetManifest(snap->manifest_id);
  ASSERT_OK(blob);
  auto manifest = Manifest::Decode(*blob);
  ASSERT_OK(manifest);
  EXPECT_EQ(manifest->sample_count(), snap->files);
  EXPECT_EQ(stored->revision, record.revision + 2) << "one claim, one result";
}

TEST_F(SnapshotTest, AClaimantLosingTheCompareAndSetDoesNothing) {
  DatasetRecord record = CreateRecord("pets", root_, Self());
  // Another node claims first.
  DatasetRecord other = record;
  other.state = {DatasetPhase::kSnapshotting, "node n2 is walking", "n2"};
  ASSERT_OK(store_->UpdateDataset(other));
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  auto snap = SnapshotDataset(*store_, record, o);  // the revision it read is stale
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kNotClaimed);
  auto stored = store_->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.claimed_by, "n2");
  EXPECT_EQ(stored->revision, record.revision + 1);
}

TEST_F(SnapshotTest, AFailedWalkSetsFailedWithWhatToDo) {
  DatasetRecord record = CreateRecord("gone", dir_.Join("nope"), Self());
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  auto snap = SnapshotDataset(*store_, record, o);
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kFailed);
  EXPECT_EQ(snap->error.code(), StatusCode::kNotFound);
  auto stored = store_->GetDataset("gone");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.phase, DatasetPhase::kFailed);
  EXPECT_EQ(stored->state.claimed_by, "");
  const std::string& m = stored->state.message;
  EXPECT_THAT(m, StartsWith("snapshot failed: source file://" + dir_.Join("nope") + " as uid " +
                            std::to_string(::geteuid()) + " gid " + std::to_string(::getegid()) +
                            " on node n1: "));
  EXPECT_THAT(m, HasSubstr("does not exist"));
  EXPECT_THAT(m, HasSubstr("mounted at that path on the cache nodes of pool default"));
  EXPECT_THAT(m, HasSubstr("set the phase to Pending"));
  EXPECT_TRUE(stored->manifest_id.empty());
}

TEST_F(SnapshotTest, StoppedWalkGivesTheClaimBack) {
  if (!IsRoot()) GTEST_SKIP() << "needs root: without an identity switch the walk has no child";
  DatasetRecord record = CreateRecord("pets", root_, {kNobody, kNobody});
  std::atomic<bool> stop{true};
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  o.stop = &stop;
  auto snap = SnapshotDataset(*store_, record, o);
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kAbandoned);
  auto stored = store_->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.phase, DatasetPhase::kPending);
  EXPECT_EQ(stored->state.claimed_by, "");
  EXPECT_THAT(stored->state.message, HasSubstr("node n1 stopped during the snapshot"));
  EXPECT_TRUE(stored->manifest_id.empty());
  ExpectNoChildren();
}

TEST_F(SnapshotTest, ANewSnapshotAskedDuringTheWalkDropsTheResult) {
  if (!IsRoot()) GTEST_SKIP() << "needs root: the record is changed from the child's progress";
  DatasetRecord record = CreateRecord("pets", root_, {kNobody, kNobody});
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  o.check_interval = std::chrono::milliseconds(0);
  bool changed = false;
  o.on_progress = [&](uint64_t, uint64_t) {
    if (changed) return;
    changed = true;
    auto r = store_->GetDataset("pets");
    ASSERT_OK(r);
    r->state = {DatasetPhase::kPending, "new snapshot requested", ""};
    ASSERT_OK(store_->UpdateDataset(*r));
  };
  auto snap = SnapshotDataset(*store_, record, o);
  ASSERT_OK(snap);
  EXPECT_TRUE(changed);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kSuperseded);
  auto stored = store_->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.phase, DatasetPhase::kPending);
  EXPECT_EQ(stored->state.message, "new snapshot requested");
  EXPECT_TRUE(stored->manifest_id.empty());
}

TEST_F(SnapshotTest, ASpecChangedDuringTheWalkGoesBackToPending) {
  if (!IsRoot()) GTEST_SKIP() << "needs root: the record is changed from the child's progress";
  DatasetRecord record = CreateRecord("pets", root_, {kNobody, kNobody});
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  o.check_interval = std::chrono::milliseconds(0);
  bool changed = false;
  o.on_progress = [&](uint64_t, uint64_t) {
    if (changed) return;
    changed = true;
    auto r = store_->GetDataset("pets");
    ASSERT_OK(r);
    r->spec.include = {"d1/**"};  // still Snapshotting, still n1's claim
    ASSERT_OK(store_->UpdateDataset(*r));
  };
  auto snap = SnapshotDataset(*store_, record, o);
  ASSERT_OK(snap);
  EXPECT_TRUE(changed);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kSuperseded);
  auto stored = store_->GetDataset("pets");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.phase, DatasetPhase::kPending);
  EXPECT_EQ(stored->state.claimed_by, "");
  EXPECT_THAT(stored->state.message, HasSubstr("the spec changed during the snapshot"));
  EXPECT_TRUE(stored->manifest_id.empty());
}

TEST_F(SnapshotTest, NothingIncludedIsAnEmptySnapshotNotAFailure) {
  DatasetRecord record = CreateRecord("none", root_, Self());
  record.spec.include = {"**/*.nothing"};
  auto updated = store_->UpdateDataset(record);
  ASSERT_OK(updated);
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  auto snap = SnapshotDataset(*store_, *updated, o);
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kSnapshotted);
  EXPECT_EQ(snap->files, 0u);
  EXPECT_EQ(store_->GetDataset("none")->state.phase, DatasetPhase::kStaging);
}

// Security: a source given as a link (/data/link -> /etc), or through
// one, was resolved and walked as its target. Now any link on the source path
// is refused, naming the link and the resolved path, for the CLI's walk and
// the pool's alike (both go through SnapshotAsOwner), and as the owner.
TEST_F(SnapshotTest, ASourcePathThroughASymbolicLinkIsRefusedNamingBothPaths) {
  const std::string link = dir_.Join("link");
  ASSERT_EQ(::symlink(root_.c_str(), link.c_str()), 0);
  const std::string alias = dir_.Join("alias");  // a link as a middle component
  ASSERT_EQ(::symlink(dir_.path().c_str(), alias.c_str()), 0);
  const std::string to_file = dir_.Join("to_file");  // a source that is a link to a file
  ASSERT_EQ(::symlink((root_ + "/d0/f0.bin").c_str(), to_file.c_str()), 0);
  const std::string dangling = dir_.Join("dangling");
  ASSERT_EQ(::symlink(dir_.Join("missing").c_str(), dangling.c_str()), 0);
  const std::string loop = dir_.Join("loop");
  ASSERT_EQ(::symlink(loop.c_str(), loop.c_str()), 0);

  std::vector<DatasetOwner> owners = {Self()};
  if (IsRoot()) owners.push_back({kNobody, kNobody});  // in a forked child
  for (const DatasetOwner& owner : owners) {
    SCOPED_TRACE("uid " + std::to_string(owner.uid));
    for (const auto& [source, link_part, resolved] :
         std::vector<std::tuple<std::string, std::string, std::string>>{
             {link, link, root_},
             {alias + "/src", alias, root_},
             {to_file, to_file, root_ + "/d0/f0.bin"},
             {dangling, dangling, ""},
             {loop, loop, ""}}) {
      SCOPED_TRACE(source);
      auto m = SnapshotAsOwner(owner, Options(source));
      ASSERT_FALSE(m.ok());
      EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();
      EXPECT_THAT(m.status().message(),
                  HasSubstr("passes through the symbolic link '" + link_part + "'"));
      if (!resolved.empty()) {
        EXPECT_THAT(m.status().message(), HasSubstr("resolves to '" + resolved + "'"));
        EXPECT_THAT(m.status().message(), HasSubstr("--source " + resolved));
      } else {
        EXPECT_THAT(m.status().message(), HasSubstr("does not resolve"));
      }
    }
  }
  // A pool's snapshot of such a record fails with the same reason.
  DatasetRecord record = CreateRecord("linked", link, Self());
  DatasetSnapshotOptions o;
  o.claimant = "n1";
  auto snap = SnapshotDataset(*store_, record, o);
  ASSERT_OK(snap);
  EXPECT_EQ(snap->outcome, SnapshotOutcome::kFailed);
  auto stored = store_->GetDataset("linked");
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state.phase, DatasetPhase::kFailed);
  EXPECT_THAT(stored->state.message, HasSubstr("passes through the symbolic link '" + link + "'"));
  EXPECT_THAT(stored->state.message, HasSubstr("resolves to '" + root_ + "'"));
  EXPECT_TRUE(stored->manifest_id.empty());
  ExpectNoChildren();
}

// Security: an absolute link inside the source to a file inside the
// root was a sample that every read then refused as unsafe ("Ready, 1 sample
// failed"). The snapshot now resolves links as the source's reads do, so
// every sample of the manifest reads, and what was left out is in the summary.
TEST_F(SnapshotTest, LinksTheSourceWouldRefuseAreLeftOutAndEverySampleReads) {
  dir_.WriteFile("outside/secret.bin", "not the dataset's");
  ASSERT_EQ(::symlink((root_ + "/d0/f0.bin").c_str(), (root_ + "/absolute_in").c_str()), 0);
  ASSERT_EQ(::symlink("d0/f0.bin", (root_ + "/relative_in").c_str()), 0);
  ASSERT_EQ(::symlink("../d0/f3.bin", (root_ + "/d1/up_but_inside").c_str()), 0);
  ASSERT_EQ(::symlink("../outside/secret.bin", (root_ + "/leaves").c_str()), 0);
  ASSERT_EQ(::symlink(dir_.Join("outside").c_str(), (root_ + "/dir_outside").c_str()), 0);
  ASSERT_EQ(::symlink("d1", (root_ + "/dir_inside").c_str()), 0);
  ASSERT_EQ(::symlink("loop", (root_ + "/loop").c_str()), 0);
  ASSERT_EQ(::symlink("missing.bin", (root_ + "/dangling").c_str()), 0);

  DatasetRecord record = CreateRecord("links", root_, Self(), SnapshotBy::kClient);
  auto snap = SnapshotDataset(*store_, record, DatasetSnapshotOptions{});
  ASSERT_OK(snap);
  ASSERT_EQ(snap->outcome, SnapshotOutcome::kSnapshotted) << snap->error.ToString();
  EXPECT_EQ(snap->files, 15u) << "12 files, root's secret/key.bin and the two relative links";
  EXPECT_THAT(snap->summary, HasSubstr("; 6 symbolic links left out"));
  auto stored = store_->GetDataset("links");
  ASSERT_OK(stored);
  EXPECT_THAT(stored->state.message, HasSubstr("6 symbolic links left out"));

  auto encoded = store_->GetManifest(snap->manifest_id);
  ASSERT_OK(encoded);
  auto manifest = Manifest::Decode(*encoded);
  ASSERT_OK(manifest);
  EXPECT_FALSE(manifest->Find("absolute_in").ok());
  EXPECT_OK(manifest->Find("relative_in"));
  EXPECT_OK(manifest->Find("d1/up_but_inside"));
  EXPECT_EQ(manifest->header().stats.skipped_symlinks, 6u);

  // Staging's reads agree: every sample of the manifest reads.
  auto executor = IdentityExecutor::Start({.threads = 2});
  ASSERT_OK(executor);
  PosixSourceOptions so;
  so.root = root_;
  so.owner = ProcessIdentity();
  so.executor = executor->get();
  auto source = PosixSource::Open(std::move(so));
  ASSERT_OK(source);
  for (SampleId id = 0; id < manifest->sample_count(); ++id) {
    auto file = SourceFileOf(*manifest, id);
    ASSERT_OK(file);
    std::string out(file->size, '\0');
    const Status read = (*source)->Read(*file, 0, std::span<char>(out.data(), out.size()));
    EXPECT_TRUE(read.ok()) << manifest->PathOf(id) << ": " << read.ToString();
  }
}

}  // namespace
}  // namespace granary

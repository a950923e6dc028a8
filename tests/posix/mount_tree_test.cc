// MountTree (the POSIX view's inode table) and Readahead, from manifests
// built in memory: no mount, no FUSE.

#include "granary/posix/mount_tree.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/core/plan.h"
#include "granary/posix/readahead.h"
#include "testing/test_util.h"

namespace granary::posix {
namespace {

std::shared_ptr<const Manifest> MakeManifest(const std::vector<std::string>& paths,
                                             uint64_t size = 100, uint64_t chunk_size = 1024) {
  ManifestHeaderInfo header;
  header.source_uri = "file:///src";
  header.chunk_size = chunk_size;
  std::vector<FileEntry> entries;
  int64_t mtime = 1'000'000'000;
  for (const std::string& p : paths) entries.push_back({p, size, mtime += 1'000'000'000});
  auto m = Manifest::FromEntries(header, std::move(entries));
  EXPECT_OK(m);
  return m.ok() ? std::make_shared<const Manifest>(std::move(*m)) : nullptr;
}

std::vector<std::string> ListNames(const MountTree& t, Inode dir) {
  std::vector<std::string> names;
  for (uint32_t child : t.Children(dir)) names.emplace_back(t.NameOf(child));
  return names;
}

TEST(MountTreeTest, TreeFollowsThePathsOfTheManifest) {
  // Byte order puts "a-b/..." before "a/..." and "a/b.txt" before "a/b/...".
  auto m = MakeManifest({"a/x", "a-b/y", "a/z", "a/b/c", "a/b.txt", "top.bin", "d/e/f/g.jpg"});
  ASSERT_NE(m, nullptr);
  auto tree = MountTree::Build(m);
  ASSERT_OK(tree);
  const MountTree& t = *tree;
  EXPECT_EQ(t.sample_count(), 7u);
  EXPECT_EQ(t.directory_count(), 7u);  // root, a, a-b, a/b, d, d/e, d/e/f
  EXPECT_EQ(t.max_inode(), 14u);
  EXPECT_EQ(ListNames(t, kRootInode), (std::vector<std::string>{"a", "a-b", "d", "top.bin"}));
  const Inode a = t.Lookup(kRootInode, "a");
  ASSERT_NE(a, kNoInode);
  EXPECT_TRUE(t.IsDirectory(a));
  EXPECT_EQ(ListNames(t, a), (std::vector<std::string>{"b", "b.txt", "x", "z"}));
  EXPECT_EQ(t.SubdirectoryCount(a), 1u);
  EXPECT_EQ(t.SubdirectoryCount(kRootInode), 3u);
  // Every sample is found by its path, with its id, size and parent chain.
  for (SampleId id = 0; id < m->sample_count(); ++id) {
    const std::string path = m->PathOf(id);
    Inode at = kRootInode;
    size_t begin = 0;
    while (true) {
      const size_t slash = path.find('/', begin);
      at = t.Lookup(at, path.substr(begin, slash == std::string::npos ? slash : slash - begin));
      ASSERT_NE(at, kNoInode) << path;
      if (slash == std::string::npos) break;
      begin = slash + 1;
    }
    EXPECT_FALSE(t.IsDirectory(at));
    EXPECT_EQ(t.SampleOf(at), id);
    EXPECT_EQ(MountTree::InodeOfSample(id), at);
    EXPECT_EQ(t.PathOf(at), path);
    EXPECT_EQ(t.Size(at), 100u);
    EXPECT_EQ(t.MtimeNs(at), m->MtimeOf(id));
  }
  // Directories carry the newest mtime beneath them.
  const Inode d = t.Lookup(kRootInode, "d");
  EXPECT_EQ(t.MtimeNs(d), m->MtimeOf(*m->Find("d/e/f/g.jpg")));
  int64_t newest = 0;
  for (SampleId id = 0; id < m->sample_count(); ++id) newest = std::max(newest, m->MtimeOf(id));
  EXPECT_EQ(t.MtimeNs(kRootInode), newest);
  EXPECT_EQ(t.PathOf(t.Lookup(t.Lookup(d, "e"), "f")), "d/e/f");
}

TEST(MountTreeTest, DotDotStaysInsideAndBadInodesAreRefused) {
  auto m = MakeManifest({"a/b/c.txt"});
  ASSERT_NE(m, nullptr);
  auto tree = MountTree::Build(m);
  ASSERT_OK(tree);
  const MountTree& t = *tree;
  EXPECT_EQ(t.Lookup(kRootInode, ".."), kRootInode);
  EXPECT_EQ(t.Lookup(kRootInode, "."), kRootInode);
  EXPECT_EQ(t.Parent(kRootInode), kRootInode);
  const Inode a = t.Lookup(kRootInode, "a");
  const Inode b = t.Lookup(a, "b");
  EXPECT_EQ(t.Lookup(b, ".."), a);
  EXPECT_EQ(t.Lookup(a, ".."), kRootInode);
  const Inode c = t.Lookup(b, "c.txt");
  ASSERT_NE(c, kNoInode);
  // A file has no children; lookups under it find nothing.
  EXPECT_EQ(t.Lookup(c, "x"), kNoInode);
  EXPECT_EQ(t.Lookup(c, ".."), kNoInode);
  EXPECT_TRUE(t.Children(c).empty());
  // Names that are not one component are never found.
  for (const char* bad : {"", "a/b", "/a", "b/c.txt", "c.txt/", "..."}) {
    EXPECT_EQ(t.Lookup(kRootInode, bad), kNoInode) << bad;
  }
  EXPECT_EQ(t.Lookup(a, "b/c.txt"), kNoInode);
  // Inodes past the table, and 0.
  for (Inode bad : {Inode{0}, t.max_inode() + 1, Inode{1} << 40}) {
    EXPECT_FALSE(t.Valid(bad));
    EXPECT_EQ(t.Lookup(bad, "a"), kNoInode);
    EXPECT_TRUE(t.Children(bad).empty());
    EXPECT_EQ(t.Parent(bad), kRootInode);
    EXPECT_EQ(t.NameOf(bad), "");
    EXPECT_EQ(t.Size(bad), 0u);
  }
}

TEST(MountTreeTest, EmptyManifestIsAnEmptyRoot) {
  auto m = MakeManifest({});
  ASSERT_NE(m, nullptr);
  auto tree = MountTree::Build(m);
  ASSERT_OK(tree);
  EXPECT_EQ(tree->max_inode(), 1u);
  EXPECT_TRUE(tree->IsDirectory(kRootInode));
  EXPECT_TRUE(tree->Children(kRootInode).empty());
  EXPECT_EQ(tree->Lookup(kRootInode, "x"), kNoInode);
}

TEST(MountTreeTest, BadManifestsAreClearErrors) {
  EXPECT_EQ(MountTree::Build(nullptr).status().code(), StatusCode::kInvalidArgument);
  // A name longer than NAME_MAX could not be looked up by the kernel: the
  // manifest refuses it already (the tree checks again).
  const std::string long_name(256, 'x');
  for (const std::string& path : {"ok/" + long_name, long_name + "/f"}) {
    ManifestHeaderInfo header;
    auto m = Manifest::FromEntries(header, {FileEntry{path, 1, 0}});
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  }
  // "a" as a file and as a directory: a manifest no real walk makes.
  auto both = MakeManifest({"a", "a/b"});
  if (both != nullptr) {
    auto tree = MountTree::Build(both);
    ASSERT_FALSE(tree.ok());
    EXPECT_NE(tree.status().message().find("both a file and a directory"), std::string::npos)
        << tree.status().ToString();
  }
}

TEST(MountTreeTest, DirectoriesWithoutFilesAndModesAreShown) {
  ManifestHeaderInfo header;
  header.chunk_size = 1024;
  auto built = Manifest::FromEntries(
      header,
      {{"cls/a.jpg", 3, 5'000, 0640}, {"cls/b.jpg", 4, 7'000, 04755}, {"top", 1, 9'000, 0600}},
      {{"", 0750}, {"cls", 0710}, {"empty", 0700}, {"empty/inner", 02775}});
  ASSERT_OK(built);
  auto m = std::make_shared<const Manifest>(std::move(*built));
  auto tree = MountTree::Build(m);
  ASSERT_OK(tree);
  const MountTree& t = *tree;
  EXPECT_EQ(t.directory_count(), 4u);
  EXPECT_EQ(ListNames(t, kRootInode), (std::vector<std::string>{"cls", "empty", "top"}));
  EXPECT_EQ(t.SubdirectoryCount(kRootInode), 2u);
  const Inode empty = t.Lookup(kRootInode, "empty");
  ASSERT_NE(empty, kNoInode);
  EXPECT_TRUE(t.IsDirectory(empty));
  EXPECT_EQ(ListNames(t, empty), (std::vector<std::string>{"inner"}));
  const Inode inner = t.Lookup(empty, "inner");
  ASSERT_NE(inner, kNoInode);
  EXPECT_TRUE(t.Children(inner).empty());
  EXPECT_EQ(t.Lookup(inner, ".."), empty);
  EXPECT_EQ(t.PathOf(inner), "empty/inner");
  // Modes as at the source, without set-user-ID / set-group-ID (nosuid).
  EXPECT_EQ(t.Mode(kRootInode), static_cast<uint32_t>(S_IFDIR | 0750));
  EXPECT_EQ(t.Mode(t.Lookup(kRootInode, "cls")), static_cast<uint32_t>(S_IFDIR | 0710));
  EXPECT_EQ(t.Mode(empty), static_cast<uint32_t>(S_IFDIR | 0700));
  EXPECT_EQ(t.Mode(inner), static_cast<uint32_t>(S_IFDIR | 0775));
  const Inode cls = t.Lookup(kRootInode, "cls");
  EXPECT_EQ(t.Mode(t.Lookup(cls, "a.jpg")), static_cast<uint32_t>(S_IFREG | 0640));
  EXPECT_EQ(t.Mode(t.Lookup(cls, "b.jpg")), static_cast<uint32_t>(S_IFREG | 0755));
  EXPECT_EQ(t.Mode(t.Lookup(kRootInode, "top")), static_cast<uint32_t>(S_IFREG | 0600));
  EXPECT_EQ(t.Mode(t.max_inode() + 1), 0u);
  // A directory with no file under it shows the dataset's newest mtime.
  EXPECT_EQ(t.MtimeNs(inner), 9'000);
  EXPECT_EQ(t.MtimeNs(cls), 7'000);
}

TEST(MountTreeTest, Version1ManifestsShowReadOnlyModes) {
  auto m = MakeManifest({"a/b"});
  ASSERT_NE(m, nullptr);
  auto tree = MountTree::Build(m);
  ASSERT_OK(tree);
  // MakeManifest leaves modes out: the defaults, as for a version 1 manifest.
  EXPECT_EQ(tree->Mode(kRootInode), static_cast<uint32_t>(S_IFDIR | 0555));
  EXPECT_EQ(tree->Mode(MountTree::InodeOfSample(0)), static_cast<uint32_t>(S_IFREG | 0444));
}

TEST(MountTreeTest, ManyFilesStayCompact) {
  std::vector<std::string> paths;
  for (int c = 0; c < 100; ++c) {
    for (int f = 0; f < 1000; ++f) {
      paths.push_back("class" + std::to_string(c) + "/img_" + std::to_string(f) + ".jpg");
    }
  }
  auto m = MakeManifest(paths, 10, 1 << 20);
  ASSERT_NE(m, nullptr);
  auto tree = MountTree::Build(m);
  ASSERT_OK(tree);
  EXPECT_EQ(tree->directory_count(), 101u);
  // 4 bytes of tables per file; names stay in the manifest.
  EXPECT_LT(tree->MemoryBytes(), 100'000u * 5) << tree->MemoryBytes();
  const Inode c7 = tree->Lookup(kRootInode, "class7");
  const Inode f = tree->Lookup(c7, "img_999.jpg");
  ASSERT_NE(f, kNoInode);
  EXPECT_EQ(tree->PathOf(f), "class7/img_999.jpg");
}

TEST(ReadaheadTest, ManifestOrderHintsAWindowAheadInBatches) {
  std::vector<std::string> paths;
  for (int i = 0; i < 1000; ++i) paths.push_back("f" + std::to_string(1000 + i));
  auto m = MakeManifest(paths, 100, 4096);
  ASSERT_NE(m, nullptr);
  Readahead ra(ReadaheadOrder::ManifestOrder(m->sample_count()), m.get(),
               ReadaheadOptions{.window_samples = 64, .window_bytes = 1 << 20});
  std::vector<SampleId> hinted;
  size_t batches = 0;
  for (SampleId id = 0; id < 1000; ++id) {
    std::vector<SampleId> h = ra.OnOpen(id);
    if (!h.empty()) ++batches;
    for (SampleId x : h) {
      EXPECT_GT(x, id) << "hints are ahead of the open";
      EXPECT_LE(x, id + 64) << "and within the window";
      hinted.push_back(x);
    }
  }
  // Every sample but the first hinted exactly once, in order, in ~32-sample batches.
  std::vector<SampleId> expected;
  for (SampleId id = 1; id < 1000; ++id) expected.push_back(id);
  EXPECT_EQ(hinted, expected);
  EXPECT_GT(batches, 25u);
  EXPECT_LT(batches, 40u);
}

TEST(ReadaheadTest, BytesBoundTheWindowAndJumpsStartOver) {
  std::vector<std::string> paths;
  for (int i = 0; i < 100; ++i) paths.push_back("f" + std::to_string(100 + i));
  auto m = MakeManifest(paths, 1000, 4096);
  ASSERT_NE(m, nullptr);
  Readahead ra(ReadaheadOrder::ManifestOrder(m->sample_count()), m.get(),
               ReadaheadOptions{.window_samples = 64, .window_bytes = 5000});
  EXPECT_EQ(ra.OnOpen(0), (std::vector<SampleId>{1, 2, 3, 4, 5}));  // the first open
  // A jump hints nothing; the open that follows it starts over from there.
  EXPECT_TRUE(ra.OnOpen(50).empty());
  EXPECT_EQ(ra.OnOpen(51), (std::vector<SampleId>{52, 53, 54, 55, 56}));
  EXPECT_TRUE(ra.OnOpen(10).empty());  // back: a jump too
  EXPECT_EQ(ra.OnOpen(11), (std::vector<SampleId>{12, 13, 14, 15, 16}));
  // A reader in another order (every open a jump) is sent nothing.
  for (SampleId id : {80u, 30u, 70u, 20u, 90u, 40u}) EXPECT_TRUE(ra.OnOpen(id).empty()) << id;
  EXPECT_TRUE(ra.OnOpen(99).size() == 0u);  // nothing after the last
  Readahead off(ReadaheadOrder::ManifestOrder(m->sample_count()), m.get(),
                ReadaheadOptions{.window_samples = 0, .window_bytes = 5000});
  EXPECT_TRUE(off.OnOpen(0).empty());
  EXPECT_TRUE(ra.OnOpen(100000).empty()) << "an id past the manifest hints nothing";
}

TEST(ReadaheadTest, ARegisteredPlanIsFollowed) {
  std::vector<std::string> paths;
  for (int i = 0; i < 200; ++i) paths.push_back("f" + std::to_string(1000 + i));
  auto m = MakeManifest(paths, 100, 1024);
  ASSERT_NE(m, nullptr);
  PlanRecord older;
  older.plan_id = "older";
  older.seed = 1;
  older.registered_ms = 10;
  PlanRecord plan;
  plan.plan_id = "job-7";
  plan.seed = 42;
  plan.first_epoch = 3;
  plan.world_size = 2;
  plan.batch_size = 4;
  plan.registered_ms = 20;
  auto order = ReadaheadOrder::Choose(*m, {older, plan});
  ASSERT_OK(order);
  EXPECT_NE((*order)->description().find("job-7"), std::string::npos);
  auto spec = ToPlanSpec(plan, 3, 0);
  ASSERT_OK(spec);
  auto epoch = EpochOrder(*m, *spec);
  ASSERT_OK(epoch);
  auto first = FirstReadOrder(*epoch, *spec);
  ASSERT_OK(first);
  ASSERT_EQ((*order)->size(), first->size());
  for (uint64_t p = 0; p < first->size(); ++p) {
    EXPECT_EQ((*order)->At(p), (*first)[p]);
    EXPECT_EQ((*order)->PositionOf((*first)[p]), p);
  }
  Readahead ra(*order, m.get(), ReadaheadOptions{.window_samples = 8, .window_bytes = 1 << 20});
  const std::vector<SampleId> hints = ra.OnOpen((*first)[10]);
  EXPECT_EQ(hints, std::vector<SampleId>(first->begin() + 11, first->begin() + 19));
  // No plan: manifest order. A bad plan: a clear error.
  auto none = ReadaheadOrder::Choose(*m, {});
  ASSERT_OK(none);
  EXPECT_EQ((*none)->description(), "manifest order");
  PlanRecord bad = plan;
  bad.mode = "zigzag";
  auto refused = ReadaheadOrder::FromPlan(*m, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("job-7"), std::string::npos)
      << refused.status().ToString();
}

TEST(ReadaheadTest, MatchFindsTheEpochAReaderFollows) {
  std::vector<std::string> paths;
  for (int i = 0; i < 1000; ++i) paths.push_back("f" + std::to_string(10000 + i));
  auto m = MakeManifest(paths, 100, 1024);
  ASSERT_NE(m, nullptr);
  PlanRecord plan;
  plan.plan_id = "job-9";
  plan.seed = 5;
  plan.first_epoch = 6;
  plan.registered_ms = 30;
  PlanRecord other;
  other.plan_id = "other";
  other.seed = 77;
  other.registered_ms = 10;
  auto at2 = ReadaheadOrder::FromPlan(*m, plan, 2);
  ASSERT_OK(at2);
  EXPECT_EQ((*at2)->description(), "plan 'job-9' (epoch 2)");
  EXPECT_EQ((*at2)->plan_id(), "job-9");
  EXPECT_EQ((*at2)->epoch(), 2u);
  // First reads of epoch 2, a little out of step (two reader threads).
  std::vector<SampleId> recent;
  for (uint64_t p : {100u, 102u, 101u, 104u, 103u, 105u, 107u, 106u})
    recent.push_back((*at2)->At(p));
  EXPECT_TRUE((*at2)->Fits(recent));
  auto found = ReadaheadOrder::Match(*m, {other, plan}, recent);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->description(), "plan 'job-9' (epoch 2)");
  // The epoch after the one followed is tried first; the result is the same.
  found = ReadaheadOrder::Match(*m, {other, plan}, recent, "job-9", 2);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->epoch(), 2u);
  // A tree walk: manifest order.
  std::vector<SampleId> walk = {40, 41, 42, 43, 44, 45};
  found = ReadaheadOrder::Match(*m, {other, plan}, walk);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->description(), "manifest order");
  // Reads that follow nothing (ids far apart in every order tried), too few
  // reads, a sample outside the manifest, or an epoch beyond those tried.
  std::vector<SampleId> scattered = {3, 500, 17, 940, 260, 711, 88, 402};
  EXPECT_EQ(ReadaheadOrder::Match(*m, {other, plan}, scattered), nullptr);
  EXPECT_EQ(ReadaheadOrder::Match(*m, {other, plan}, std::vector<SampleId>{(*at2)->At(5)}),
            nullptr);
  EXPECT_FALSE((*at2)->Fits(std::vector<SampleId>{(*at2)->At(5), 5000}));
  EXPECT_FALSE((*at2)->Fits({}));
  auto far = ReadaheadOrder::FromPlan(*m, plan, 40);
  ASSERT_OK(far);
  std::vector<SampleId> late;
  for (uint64_t p = 300; p < 310; ++p) late.push_back((*far)->At(p));
  EXPECT_EQ(ReadaheadOrder::Match(*m, {plan}, late), nullptr);
  EXPECT_NE(ReadaheadOrder::Match(*m, {plan}, late, "job-9", 40), nullptr);
  // A plan the core refuses is skipped, not an error.
  PlanRecord bad = plan;
  bad.mode = "zigzag";
  found = ReadaheadOrder::Match(*m, {bad, plan}, recent);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->epoch(), 2u);
}

TEST(ReadaheadTest, SetOrderStartsOver) {
  std::vector<std::string> paths;
  for (int i = 0; i < 100; ++i) paths.push_back("f" + std::to_string(1000 + i));
  auto m = MakeManifest(paths, 100, 1024);
  ASSERT_NE(m, nullptr);
  PlanRecord plan;
  plan.plan_id = "job-1";
  plan.seed = 3;
  auto order = ReadaheadOrder::FromPlan(*m, plan, 1);
  ASSERT_OK(order);
  Readahead ra(ReadaheadOrder::ManifestOrder(m->sample_count()), m.get(),
               ReadaheadOptions{.window_samples = 4, .window_bytes = 1 << 20});
  EXPECT_EQ(ra.OnOpen(10), (std::vector<SampleId>{11, 12, 13, 14}));
  ra.SetOrder(*order);
  const SampleId at = (*order)->At(20);
  EXPECT_EQ(ra.OnOpen(at), (std::vector<SampleId>{(*order)->At(21), (*order)->At(22),
                                                  (*order)->At(23), (*order)->At(24)}));
}

}  // namespace
}  // namespace granary::posix

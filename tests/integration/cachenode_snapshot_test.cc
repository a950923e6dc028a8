// Snapshots taken by a pool's cache nodes (SnapshotBy::kPool; docs/cachenode.md,
// "Snapshots"): real granary-cachenode processes, a real redis-server, the real
// granary CLI, and for the walks that must last, a real FUSE source
// (granary-slowfs, bench/slowfs) that charges every metadata operation.
//
//  - two nodes, `granary dataset create --snapshot-by pool --wait`: exactly one
//    snapshot is taken (the nodes' snapshots_total), as the owner, equal to the
//    manifest of a direct walk; the dataset becomes Ready and every sample read
//    back equals the source;
//  - a source that does not exist, a file, and a directory the owner may not
//    read end Failed with a message naming the source, the uid and what to do,
//    and nothing is staged; an include that matches nothing is an empty
//    dataset, not a failure;
//  - after the source changed, `granary dataset snapshot` takes a new snapshot:
//    a new manifest id, the new bytes served, the old manifest's chunks dropped;
//  - the claimant killed (SIGKILL) mid-walk: its helper dies with it, the other
//    node takes the claim over once the first one's heartbeat expired, and the
//    dataset becomes Ready with the right bytes;
//  - the claimant stopped (SIGTERM) mid-walk: it exits at once, its helper is
//    gone, and the dataset is Pending again with no claimant.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "granary/core/manifest_builder.h"
#include "granary/source/snapshot.h"
#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/slowfs_mount.h"
#include "testing/test_util.h"

#ifndef GRANARY_CLI_BINARY
#error "GRANARY_CLI_BINARY must name the granary binary"
#endif

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;

constexpr uint32_t kNobody = 65534;
constexpr char kSnapshots[] = "granary_cachenode_snapshots_total";
// How a node's snapshot helper is called (cache_node.h, kSnapshotChildFlag).
constexpr char kSnapshotChildFlagForTest[] = "--snapshot-child";

// Writes `files` files of 1..6 KiB under root/<prefix>dNN/, `per_dir` a
// directory (files 0644, directories 0755).
void WriteTree(const std::string& root, const std::string& prefix, size_t files, size_t per_dir,
               const std::string& seed) {
  for (size_t i = 0; i < files; ++i) {
    const std::string dir = root + "/" + prefix + "d" + std::to_string(i / per_dir);
    std::filesystem::create_directories(dir);
    WriteAll(dir + "/f" + std::to_string(i) + ".bin",
             Bytes(seed + std::to_string(i), 1024 + (i * 997) % 5120));
  }
}

// The dataset as the nodes snapshotted it: its manifest from the store, each
// sample's bytes from `local_root` (where this test sees the source).
Result<TestDataset> Snapshotted(MetadataStore& store, const std::string& name,
                                const std::string& local_root) {
  GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, store.GetDataset(name));
  GRANARY_ASSIGN_OR_RETURN(std::string blob, store.GetManifest(record.manifest_id));
  GRANARY_ASSIGN_OR_RETURN(Manifest manifest, Manifest::Decode(blob));
  TestDataset ds;
  ds.name = name;
  ds.pool = record.spec.pool;
  ds.root = local_root;
  ds.manifest_id = manifest.id();
  ds.manifest = std::make_shared<const Manifest>(std::move(manifest));
  for (SampleId id = 0; id < ds.manifest->sample_count(); ++id) {
    ds.contents.push_back(ReadAll(local_root + "/" + ds.manifest->PathOf(id)));
    ds.total_bytes += ds.contents.back().size();
  }
  return ds;
}

void ExpectAllSamplesCorrect(MetadataStore& store, const TestDataset& ds) {
  DatasetReader reader(&store, ds);
  std::vector<std::string> wrong;
  EXPECT_OK(reader.ReadAllCorrect(ds.AllIds(), 60s, &wrong));
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " wrong; the first: " << wrong.front();
}

// A record as the operator writes one: Pending, snapshotted by the pool.
Status CreatePoolDataset(MetadataStore& store, const std::string& name, const std::string& root,
                         DatasetOwner owner, std::vector<std::string> include = {}) {
  DatasetRecord r;
  r.name = name;
  r.spec.source_uri = "file://" + root;
  r.spec.include = std::move(include);
  r.spec.chunk_size = 16 * 1024;
  r.spec.snapshot_by = SnapshotBy::kPool;
  r.owner = owner;
  r.state = {DatasetPhase::kPending, "created by the test", ""};
  return store.CreateDataset(r).status();
}

struct CliRun {
  ExitStatus exit;
  std::string output;  // stdout and stderr
};

// Runs the granary binary against the cluster's store; bounded by `timeout`.
CliRun RunGranary(CacheCluster& cluster, const std::vector<std::string>& args,
                  std::chrono::milliseconds timeout = 120s) {
  static int runs = 0;
  DaemonProcessOptions o;
  o.binary = GRANARY_CLI_BINARY;
  o.args = {"--store", cluster.store_url()};
  o.args.insert(o.args.end(), args.begin(), args.end());
  o.log_path = cluster.dir().Join("granary-" + std::to_string(++runs) + ".log");
  o.name = "granary";
  CliRun run;
  auto process = DaemonProcess::Start(o);
  if (!process.ok()) {
    ADD_FAILURE() << process.status().ToString();
    return run;
  }
  auto exit = (*process)->Wait(timeout);
  if (!exit.ok()) {
    ADD_FAILURE() << "granary did not finish within " << timeout.count() << " ms";
    (void)(*process)->Kill();
  } else {
    run.exit = *exit;
  }
  run.output = (*process)->ReadLog();
  return run;
}

// Sum over the nodes given of a metric; each must answer.
double SumOver(const std::vector<CacheNode*>& nodes, std::string_view name, const Labels& labels) {
  double sum = 0;
  for (const CacheNode* node : nodes) {
    auto v = node->MetricValue(name, labels);
    EXPECT_TRUE(v.ok()) << node->id() << ": " << v.status().ToString();
    if (v.ok()) sum += *v;
  }
  return sum;
}

std::vector<CacheNode*> AllNodes(CacheCluster& cluster) {
  std::vector<CacheNode*> nodes;
  for (size_t i = 0; i < cluster.node_count(); ++i) nodes.push_back(&cluster.node(i));
  return nodes;
}

#ifdef GRANARY_SLOWFS_BINARY  // the helpers of the mid-walk cases below
// Waits until the dataset is Snapshotting under a claim (of `claimant`, if
// given); the record then.
Result<DatasetRecord> WaitForClaim(MetadataStore& store, const std::string& name,
                                   std::chrono::milliseconds timeout,
                                   const std::string& claimant = "") {
  Result<DatasetRecord> last = Status::NotFound("never read");
  const bool claimed = WaitFor(
      [&] {
        last = store.GetDataset(name);
        return last.ok() && last->state.phase == DatasetPhase::kSnapshotting &&
               !last->state.claimed_by.empty() &&
               (claimant.empty() || last->state.claimed_by == claimant);
      },
      timeout, 20ms);
  if (!claimed) {
    return Status::DeadlineExceeded(
        "dataset " + name + " was never claimed" + (claimant.empty() ? "" : " by " + claimant) +
        ": " +
        (last.ok() ? std::string(DatasetPhaseName(last->state.phase)) + ": " + last->state.message
                   : last.status().ToString()));
  }
  return last;
}

// The pid of `parent`'s child running the snapshot helper, once there is one.
Result<pid_t> SnapshotHelperOf(pid_t parent, std::chrono::milliseconds timeout) {
  pid_t found = 0;
  WaitFor(
      [&] {
        std::error_code ec;
        for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
          const std::string pid = entry.path().filename();
          if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
          std::ifstream stat(entry.path() / "stat");
          std::string line;
          std::getline(stat, line);
          // "pid (comm) state ppid ...": comm may hold spaces; parse from the last ')'.
          const size_t close = line.rfind(')');
          if (close == std::string::npos) continue;
          std::istringstream rest(line.substr(close + 2));
          char state = 0;
          long ppid = 0;
          rest >> state >> ppid;
          if (ppid != parent) continue;
          std::ifstream cmdline(entry.path() / "cmdline");
          std::string args((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
          if (args.find(kSnapshotChildFlagForTest) != std::string::npos) {
            found = static_cast<pid_t>(std::stol(pid));
            return true;
          }
        }
        return false;
      },
      timeout, 20ms);
  if (found == 0) {
    return Status::NotFound("no snapshot helper under pid " + std::to_string(parent));
  }
  return found;
}

bool ProcessGone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  // A zombie not reaped yet is gone for this purpose.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}
#endif  // GRANARY_SLOWFS_BINARY

// ---- the snapshot, its failures, and a new snapshot -----------------------------------

TEST(CacheNodeSnapshotTest, TwoNodesTakeExactlyOneSnapshotAndServeTheSourceBytes) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the nodes walk as uid 65534";
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(2));
  // The owner (nobody) must reach the tree: the temp dir is 0700.
  ASSERT_EQ(::chmod((*cluster)->dir().path().c_str(), 0711), 0);
  const std::string root = (*cluster)->dir().Join("src-one");
  WriteTree(root, "", 300, 50, "one");
  ASSERT_EQ(::chmod(root.c_str(), 0755), 0);

  CliRun create = RunGranary(
      **cluster, {"dataset", "create", "one", "--source", root, "--snapshot-by", "pool", "--owner",
                  "65534:65534", "--chunk-size", "16KiB", "--wait", "--timeout", "90s"});
  ASSERT_TRUE(create.exit.ExitedWith(0)) << create.exit.ToString() << "\n" << create.output;
  EXPECT_THAT(create.output, HasSubstr("dataset one is Ready"));

  MetadataStore& store = (*cluster)->store();
  auto record = store.GetDataset("one");
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kReady);
  EXPECT_EQ(record->spec.snapshot_by, SnapshotBy::kPool);
  EXPECT_EQ(record->state.claimed_by, "");
  EXPECT_EQ(record->owner.uid, kNobody);

  // The snapshot a direct walk takes of the same tree.
  ManifestBuildOptions build;
  build.source_root = root;
  build.source_uri = "file://" + root;
  build.chunk_size = 16 * 1024;
  auto direct = BuildManifest(build);
  ASSERT_OK(direct);
  EXPECT_EQ(record->manifest_id, direct->id().ToHex());
  EXPECT_EQ(direct->sample_count(), 300u);

  // Exactly one snapshot, over both nodes, of any result.
  const std::vector<CacheNode*> nodes = AllNodes(**cluster);
  EXPECT_EQ(SumOver(nodes, kSnapshots, {{"result", "ok"}}), 1);
  EXPECT_EQ(SumOver(nodes, kSnapshots, {}), 1);
  EXPECT_EQ(SumOver(nodes, "granary_cachenode_snapshot_seconds_count", {}), 1);

  auto ds = Snapshotted(store, "one", root);
  ASSERT_OK(ds);
  ExpectAllSamplesCorrect(store, *ds);
}

TEST(CacheNodeSnapshotTest, FailuresNameTheSourceAndTheUidAndNothingIsStaged) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: the nodes walk as uid 65534";
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(2));
  MetadataStore& store = (*cluster)->store();
  const TempDir& dir = (*cluster)->dir();
  ASSERT_EQ(::chmod(dir.path().c_str(), 0711), 0);
  // Readable by nobody, but the include matches nothing.
  const std::string open_root = dir.Join("open");
  WriteTree(open_root, "", 20, 10, "open");
  ASSERT_EQ(::chmod(open_root.c_str(), 0755), 0);
  // Root's only: 0700, owned by root.
  const std::string closed_root = dir.Join("closed");
  WriteTree(closed_root, "", 20, 10, "closed");
  ASSERT_EQ(::chmod(closed_root.c_str(), 0700), 0);

  const DatasetOwner nobody{kNobody, kNobody};
  ASSERT_OK(CreatePoolDataset(store, "missing", dir.Join("nope"), nobody));
  ASSERT_OK(CreatePoolDataset(store, "file", open_root + "/d0/f0.bin", nobody));
  ASSERT_OK(CreatePoolDataset(store, "closed", closed_root, nobody));
  ASSERT_OK(CreatePoolDataset(store, "empty", open_root, nobody, {"**/*.none"}));

  auto missing = (*cluster)->WaitForPhase("missing", DatasetPhase::kFailed);
  ASSERT_OK(missing);
  const std::string as_nobody = " as uid 65534 gid 65534 on node node-";
  EXPECT_THAT(missing->state.message,
              StartsWith("snapshot failed: source file://" + dir.Join("nope") + as_nobody));
  EXPECT_THAT(missing->state.message, HasSubstr("does not exist"));
  EXPECT_THAT(missing->state.message,
              HasSubstr("check that the source is mounted at that path on the cache nodes of pool "
                        "default"));
  EXPECT_EQ(missing->state.claimed_by, "");

  auto file = (*cluster)->WaitForPhase("file", DatasetPhase::kFailed);
  ASSERT_OK(file);
  EXPECT_THAT(file->state.message, HasSubstr("is not a directory"));
  EXPECT_THAT(file->state.message, HasSubstr("point the dataset at a directory"));

  auto closed = (*cluster)->WaitForPhase("closed", DatasetPhase::kFailed);
  ASSERT_OK(closed);
  EXPECT_THAT(closed->state.message,
              StartsWith("snapshot failed: source file://" + closed_root + as_nobody));
  EXPECT_THAT(closed->state.message, HasSubstr("uid 65534 may not read the directory"));
  EXPECT_THAT(closed->state.message, HasSubstr("give uid 65534 read and search rights"));
  EXPECT_TRUE(closed->manifest_id.empty());

  // Nothing included: an empty dataset, which is Ready.
  auto empty = (*cluster)->WaitForPhase("empty", DatasetPhase::kReady);
  ASSERT_OK(empty);
  EXPECT_THAT(empty->state.message, HasSubstr("0 chunks"));

  // Nothing staged for the failed ones, and one walk each.
  for (const char* name : {"missing", "file", "closed"}) {
    auto progress = store.ListProgress(name);
    ASSERT_OK(progress);
    EXPECT_TRUE(progress->empty()) << name;
  }
  const std::vector<CacheNode*> nodes = AllNodes(**cluster);
  for (CacheNode* node : nodes) EXPECT_TRUE(node->ChunkFiles().empty()) << node->id();
  // A snapshot is counted after its phase is written: wait for the last one.
  EXPECT_TRUE(WaitFor(
      [&] {
        return SumOver(nodes, kSnapshots, {{"result", "failed"}}) >= 3;
      },
      20s));
  EXPECT_EQ(SumOver(nodes, kSnapshots, {{"result", "failed"}}), 3);
  EXPECT_EQ(SumOver(nodes, kSnapshots, {{"result", "ok"}}), 1);
  EXPECT_EQ(SumOver(nodes, kSnapshots, {}), 4);
}

// Security, as the pool's snapshots see it: a source path through a
// symbolic link is refused as the CLI refuses it (naming the link and what it
// resolves to), and an absolute link inside the source, which staging's reads
// refuse, is left out and said in the Ready message, not "1 sample failed".
TEST(CacheNodeSnapshotTest, SymbolicLinksOnTheSourcePathAndInsideItAsTheCliHasThem) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  MetadataStore& store = (*cluster)->store();
  const TempDir& dir = (*cluster)->dir();
  const DatasetOwner self{::getuid(), ::getgid()};
  const std::string root = dir.Join("tree");
  WriteTree(root, "", 20, 10, "tree");
  const std::string link = dir.Join("link");
  ASSERT_EQ(::symlink(root.c_str(), link.c_str()), 0);
  ASSERT_EQ(::symlink((root + "/d0/f0.bin").c_str(), (root + "/absolute_in").c_str()), 0);

  ASSERT_OK(CreatePoolDataset(store, "linked", link, self));
  auto linked = (*cluster)->WaitForPhase("linked", DatasetPhase::kFailed);
  ASSERT_OK(linked);
  EXPECT_THAT(linked->state.message, HasSubstr("passes through the symbolic link '" + link + "'"));
  EXPECT_THAT(linked->state.message, HasSubstr("resolves to '" + root + "'"));
  EXPECT_TRUE(linked->manifest_id.empty());

  ASSERT_OK(CreatePoolDataset(store, "tree", root, self));
  auto ready = (*cluster)->WaitForPhase("tree", DatasetPhase::kReady);
  ASSERT_OK(ready);
  EXPECT_THAT(ready->state.message, HasSubstr("1 symbolic link left out at the snapshot"));
  EXPECT_THAT(ready->state.message, ::testing::Not(HasSubstr("failed")));
}

TEST(CacheNodeSnapshotTest, NewSnapshotAfterTheSourceChangedDropsTheOldChunks) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(2));
  MetadataStore& store = (*cluster)->store();
  const std::string root = (*cluster)->dir().Join("src-changing");
  WriteTree(root, "", 200, 50, "v1");
  ASSERT_OK(CreatePoolDataset(store, "changing", root, {::getuid(), ::getgid()}));
  auto first = (*cluster)->WaitForPhase("changing", DatasetPhase::kReady, 90s);
  ASSERT_OK(first);
  const std::string old_id = first->manifest_id;
  auto holds_old = [&] {
    for (CacheNode* node : AllNodes(**cluster)) {
      for (const std::string& f : node->ChunkFiles()) {
        if (f.find("/" + old_id + "/") != std::string::npos) return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(holds_old()) << "the first snapshot was not staged";

  // One file grows, one is new.
  WriteAll(root + "/d0/f0.bin", Bytes("v2 of f0", 7000));
  WriteAll(root + "/d3/new.bin", Bytes("a new file", 3000));
  CliRun again = RunGranary(**cluster, {"dataset", "snapshot", "changing"});
  ASSERT_TRUE(again.exit.ExitedWith(0)) << again.exit.ToString() << "\n" << again.output;
  EXPECT_THAT(again.output, HasSubstr("Pending; a cache node of pool default takes its snapshot"));
  CliRun wait = RunGranary(**cluster, {"dataset", "wait", "changing", "--timeout", "90s"});
  ASSERT_TRUE(wait.exit.ExitedWith(0)) << wait.exit.ToString() << "\n" << wait.output;

  auto second = store.GetDataset("changing");
  ASSERT_OK(second);
  ASSERT_EQ(second->state.phase, DatasetPhase::kReady);
  EXPECT_NE(second->manifest_id, old_id);
  auto ds = Snapshotted(store, "changing", root);
  ASSERT_OK(ds);
  EXPECT_EQ(ds->sample_count(), 201u);
  ExpectAllSamplesCorrect(store, *ds);
  EXPECT_TRUE(WaitFor([&] { return !holds_old(); }, 20s))
      << "chunks of the old manifest " << old_id << " are still on the nodes";
  EXPECT_EQ(SumOver(AllNodes(**cluster), kSnapshots, {{"result", "ok"}}), 2);
}

// ---- walks that last: a slow FUSE source ----------------------------------------------

#ifdef GRANARY_SLOWFS_BINARY

// A tree whose walk pays for 60 files it keeps and 800 it does not (include
// data/**): seconds at 20 ms an operation, while staging reads only the 60.
void WriteSlowTree(const std::string& src) {
  WriteTree(src, "data/", 60, 30, "slow");
  for (size_t d = 0; d < 40; ++d) {
    const std::string dir = src + "/noise/n" + std::to_string(d);
    std::filesystem::create_directories(dir);
    for (size_t i = 0; i < 20; ++i) WriteAll(dir + "/x" + std::to_string(i), "");
  }
}

constexpr double kSlowLatencyMs = 20;

TEST(CacheNodeSnapshotTest, ClaimantKilledMidWalkAnotherNodeTakesOver) {
  TempDir slow_dir;  // outlives the mount, which outlives the nodes
  SlowFsMount slow(GRANARY_SLOWFS_BINARY, slow_dir.Join("src"), slow_dir.Join("mnt"));
  WriteSlowTree(slow_dir.Join("src"));
  ASSERT_OK(slow.Start({.latency_ms = kSlowLatencyMs}, slow_dir.Join("slowfs.log")));
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions options;
  options.source_concurrency = 8;
  ASSERT_OK((*cluster)->StartNodes(2, options));
  MetadataStore& store = (*cluster)->store();
  ASSERT_OK(CreatePoolDataset(store, "slow", slow_dir.Join("mnt"), {::getuid(), ::getgid()},
                              {"data/**"}));

  auto claimed = WaitForClaim(store, "slow", 30s);
  ASSERT_OK(claimed);
  CacheNode* victim = (*cluster)->FindNode(claimed->state.claimed_by);
  ASSERT_NE(victim, nullptr) << claimed->state.claimed_by;
  CacheNode* survivor =
      victim == &(*cluster)->node(0) ? &(*cluster)->node(1) : &(*cluster)->node(0);
  auto helper = SnapshotHelperOf(victim->process()->pid(), 10s);
  ASSERT_OK(helper);
  auto killed = victim->Kill();
  ASSERT_OK(killed);
  EXPECT_EQ(killed->signal, SIGKILL);
  // Killed mid-walk: its claim is still there, nothing recorded.
  auto at_kill = store.GetDataset("slow");
  ASSERT_OK(at_kill);
  ASSERT_EQ(at_kill->state.phase, DatasetPhase::kSnapshotting)
      << "the walk ended before the kill: make the slow tree larger; " << at_kill->state.message;
  EXPECT_EQ(at_kill->state.claimed_by, victim->id());
  // Its helper dies with it (PR_SET_PDEATHSIG), not walking on for nobody.
  EXPECT_TRUE(WaitFor([&] { return ProcessGone(*helper); }, 10s))
      << "the killed node's snapshot helper " << *helper << " still runs";

  // The claim goes stale when the victim's heartbeat expires (1 s); the
  // survivor takes it over and the dataset becomes Ready.
  auto retaken = WaitForClaim(store, "slow", 30s, survivor->id());
  ASSERT_OK(retaken);
  EXPECT_THAT(retaken->state.message,
              HasSubstr("node " + survivor->id() + " is walking the source as uid"));
  auto ready = (*cluster)->WaitForPhase("slow", DatasetPhase::kReady, 120s);
  ASSERT_OK(ready);
  EXPECT_EQ(ready->state.claimed_by, "");
  EXPECT_EQ(SumOver({survivor}, kSnapshots, {{"result", "ok"}}), 1);
  EXPECT_EQ(SumOver({survivor}, kSnapshots, {}), 1);

  auto ds = Snapshotted(store, "slow", slow_dir.Join("src"));
  ASSERT_OK(ds);
  EXPECT_EQ(ds->sample_count(), 60u);
  ExpectAllSamplesCorrect(store, *ds);
}

TEST(CacheNodeSnapshotTest, ClaimantStoppedMidWalkGivesTheClaimBack) {
  TempDir slow_dir;
  SlowFsMount slow(GRANARY_SLOWFS_BINARY, slow_dir.Join("src"), slow_dir.Join("mnt"));
  WriteSlowTree(slow_dir.Join("src"));
  ASSERT_OK(slow.Start({.latency_ms = kSlowLatencyMs}, slow_dir.Join("slowfs.log")));
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  MetadataStore& store = (*cluster)->store();
  ASSERT_OK(CreatePoolDataset(store, "slow", slow_dir.Join("mnt"), {::getuid(), ::getgid()},
                              {"data/**"}));
  CacheNode& node = (*cluster)->node(0);
  auto claimed = WaitForClaim(store, "slow", 30s);
  ASSERT_OK(claimed);
  auto helper = SnapshotHelperOf(node.process()->pid(), 10s);
  ASSERT_OK(helper);

  auto stopped = node.Terminate(10s);
  ASSERT_OK(stopped);
  EXPECT_TRUE(stopped->ExitedWith(0)) << stopped->ToString();
  EXPECT_TRUE(ProcessGone(*helper))
      << "the stopped node's snapshot helper " << *helper << " still runs";
  auto released = store.GetDataset("slow");
  ASSERT_OK(released);
  ASSERT_EQ(released->state.phase, DatasetPhase::kPending)
      << "the walk ended before the stop: make the slow tree larger; " << released->state.message;
  EXPECT_EQ(released->state.claimed_by, "");
  EXPECT_THAT(released->state.message,
              HasSubstr("node " + node.id() + " stopped during the snapshot"));
  EXPECT_THAT(node.Log(), HasSubstr("snapshot abandoned"));
}

#endif  // GRANARY_SLOWFS_BINARY

}  // namespace
}  // namespace granary::testing

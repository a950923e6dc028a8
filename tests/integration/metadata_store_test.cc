// The MetadataStore conformance suite: every test runs unchanged against a real
// redis-server (started by the RedisServer fixture), a real SQLite file, and a
// real SQLite file that a second process uses at the same time. Backend-specific
// failure cases live in redis_store_test.cc and tests/store/sqlite_store_test.cc.

#include "granary/core/metadata_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "granary/core/clock.h"
#include "granary/core/plan.h"
#include "granary/store/open_store.h"
#include "testing/child_process.h"
#include "testing/redis_server.h"
#include "testing/store_records.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- backends ----

class SqliteBackend {
 public:
  // SQLite expires nodes by the store's Clock (Redis by its own).
  static constexpr bool kExpiryFollowsStoreClock = true;

  Status SetUp() { return Status::Ok(); }
  Status TearDown() { return Status::Ok(); }
  // Every store of one test opens the same file, as processes on one host would.
  std::string Url() const { return "sqlite://" + dir_.Join("granary.db"); }

 private:
  testing::TempDir dir_;
};

// What the helper process of SqliteTwoProcessesBackend does, until told to
// stop on control_fd: write a manifest blob of its own, read it back, list
// datasets, round after round. Manifests publish no events and appear in no
// list, so the cases under test cannot see the helper except through the
// file's locks. After its first round it sends a byte on control_fd, so every
// case starts with the helper running. The exit code says what went wrong.
enum HelperExit : int {
  kHelperOk = 0,
  kHelperOpenFailed = 2,
  kHelperWriteFailed = 3,
  kHelperReadBackWrong = 4,
  kHelperListFailed = 5,
  kHelperNeverStopped = 6,
};

int RunSharingHelper(const std::string& url, int control_fd) {
  auto store = OpenMetadataStore(url);
  if (!store.ok()) return kHelperOpenFailed;
  // Bounds the loop (at least a millisecond a round: over a minute) should the
  // parent never ask it to stop; the parent's death ends it sooner.
  constexpr int kMaxRounds = 60'000;
  for (int round = 0; round < kMaxRounds; ++round) {
    pollfd pfd{control_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 1) != 0) return kHelperOk;  // asked to stop (or the parent is gone)
    char id[32];
    std::snprintf(id, sizeof(id), "f00d%08x", static_cast<unsigned>(round));
    const std::string blob(1024, static_cast<char>(round));
    if (!(*store)->PutManifest(id, blob).ok()) return kHelperWriteFailed;
    auto back = (*store)->GetManifest(id);
    if (!back.ok() || *back != blob) return kHelperReadBackWrong;
    if (!(*store)->ListDatasets().ok()) return kHelperListFailed;
    if (round == 0) {
      const char ready = 'r';
      (void)::send(control_fd, &ready, 1, MSG_NOSIGNAL);
    }
  }
  return kHelperNeverStopped;
}

// The SQLite file shared by two processes at once: a helper child process
// opens the same file before the test starts and keeps writing and reading
// through its own store until the test ends, so every case runs while another
// process takes the file's locks. (The race to create the schema is
// sqlite_store_test's TwoProcessesWritingAtOnceSeeEachOthersWrites.)
class SqliteTwoProcessesBackend {
 public:
  static constexpr bool kExpiryFollowsStoreClock = true;

  Status SetUp() {
    // Fork before this process opens the file: SQLite connections must not
    // cross fork().
    GRANARY_ASSIGN_OR_RETURN(helper_, testing::ChildProcess::Start([url = Url()](int control_fd) {
                               return RunSharingHelper(url, control_fd);
                             }));
    return helper_->AwaitReady(std::chrono::seconds(30));
  }
  // Stops the helper and reports how it fared. If the test never gets here,
  // helper_'s destructor kills and reaps it.
  Status TearDown() {
    if (helper_ == nullptr) return Status::Ok();
    helper_->RequestStop();
    GRANARY_ASSIGN_OR_RETURN(int code, helper_->Wait(std::chrono::seconds(30)));
    if (code != kHelperOk) {
      return Status::Internal(
          "the second process sharing the SQLite file exited with " + std::to_string(code) +
          " (2 open, 3 write, 4 read back wrong, 5 list, 6 never asked to stop)");
    }
    return Status::Ok();
  }
  std::string Url() const { return "sqlite://" + dir_.Join("granary.db"); }

 private:
  testing::TempDir dir_;
  std::unique_ptr<testing::ChildProcess> helper_;  // after dir_: reaped before it is removed
};

class RedisBackend {
 public:
  static constexpr bool kExpiryFollowsStoreClock = false;

  // One server per test process; each test gets its own key prefix.
  Status SetUp() {
    static Result<std::unique_ptr<testing::RedisServer>> server = testing::RedisServer::Start();
    if (!server.ok()) return server.status();
    static int next_prefix = 0;
    url_ = (*server)->url(0, "?prefix=t" + std::to_string(++next_prefix));
    return Status::Ok();
  }
  Status TearDown() { return Status::Ok(); }
  std::string Url() const { return url_; }

 private:
  std::string url_;
};

template <typename Backend>
class MetadataStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status s = backend_.SetUp();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    Status s = backend_.TearDown();
    EXPECT_TRUE(s.ok()) << s.ToString();
  }

  std::unique_ptr<MetadataStore> Open(MetadataStoreOptions options = {}) {
    auto store = OpenMetadataStore(backend_.Url(), options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }

  Backend backend_;
};

class BackendNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, RedisBackend>) return "Redis";
    if (std::is_same_v<T, SqliteTwoProcessesBackend>) return "SqliteTwoProcesses";
    return "Sqlite";
  }
};

using Backends = ::testing::Types<RedisBackend, SqliteBackend, SqliteTwoProcessesBackend>;
TYPED_TEST_SUITE(MetadataStoreTest, Backends, BackendNames);

// ---- helpers ----

using testing::MakeDataset;
using testing::MakeNode;
using testing::MakePlan;

std::vector<std::string> NodeIds(const std::vector<NodeRecord>& nodes) {
  std::vector<std::string> ids;
  for (const auto& n : nodes) ids.push_back(n.id);
  return ids;
}

// Collects events until `want` have arrived or 30 s pass (a deadline for a
// broken store, not a speed limit: it returns as soon as they are in).
std::vector<Event> Collect(MetadataStore::Watcher& watcher, size_t want) {
  std::vector<Event> got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (got.size() < want && std::chrono::steady_clock::now() < deadline) {
    auto batch = watcher.Next(milliseconds(200));
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch.ok()) break;
    got.insert(got.end(), batch->begin(), batch->end());
  }
  return got;
}

// ---- datasets ----

TYPED_TEST(MetadataStoreTest, DatasetRoundTripsEveryField) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  DatasetRecord in = MakeDataset("imagenet-train");
  in.manifest_id = "00112233445566778899aabbccddeeff";
  in.state.message = "unicode ok: caf\xc3\xa9";
  auto created = store->CreateDataset(in);
  ASSERT_OK(created);
  EXPECT_EQ(created->revision, 1u);
  EXPECT_GT(created->created_ms, 0);
  EXPECT_EQ(created->updated_ms, created->created_ms);

  auto got = store->GetDataset("imagenet-train");
  ASSERT_OK(got);
  EXPECT_EQ(*got, *created);
  DatasetRecord expected = in;
  expected.created_ms = created->created_ms;
  expected.updated_ms = created->updated_ms;
  expected.revision = 1;
  EXPECT_EQ(*got, expected);
  EXPECT_FALSE(got->spec.nodes.has_value()) << "unset: the whole pool";

  // Placed on some nodes, then on none, then on the whole pool again.
  for (std::optional<std::vector<std::string>> nodes :
       {std::optional<std::vector<std::string>>(std::vector<std::string>{"gpu-07", "gpu-02"}),
        std::optional<std::vector<std::string>>(std::vector<std::string>{}),
        std::optional<std::vector<std::string>>()}) {
    DatasetRecord current = *store->GetDataset("imagenet-train");
    current.spec.nodes = nodes;
    auto updated = store->UpdateDataset(current);
    ASSERT_OK(updated);
    auto read = store->GetDataset("imagenet-train");
    ASSERT_OK(read);
    EXPECT_EQ(read->spec.nodes, nodes);
  }

  // Who snapshots, and a cache node's claim on the walk.
  EXPECT_EQ(got->spec.snapshot_by, SnapshotBy::kPool);
  DatasetRecord claimed = *store->GetDataset("imagenet-train");
  claimed.state = {DatasetPhase::kSnapshotting, "node gpu-07 is walking the source", "gpu-07"};
  ASSERT_OK(store->UpdateDataset(claimed));
  auto read = store->GetDataset("imagenet-train");
  ASSERT_OK(read);
  EXPECT_EQ(read->state.claimed_by, "gpu-07");
  EXPECT_EQ(read->state.phase, DatasetPhase::kSnapshotting);
  EXPECT_EQ(read->spec.snapshot_by, SnapshotBy::kPool);
  // Back to the defaults: a client snapshot and no claim.
  read->spec.snapshot_by = SnapshotBy::kClient;
  read->state = {DatasetPhase::kStaging, "snapshot: 3 files", ""};
  ASSERT_OK(store->UpdateDataset(*read));
  auto back = store->GetDataset("imagenet-train");
  ASSERT_OK(back);
  EXPECT_EQ(back->spec.snapshot_by, SnapshotBy::kClient);
  EXPECT_EQ(back->state.claimed_by, "");
  EXPECT_EQ(back->state.message, "snapshot: 3 files");

  // A cache policy set, then the default again (not stored).
  DatasetCacheSpec cache;
  cache.priority = -7;
  cache.pinned = true;
  cache.ttl_seconds = 3600;
  cache.min_resident_percent = 40;
  cache.max_resident_bytes = 123'456'789'012ull;
  for (const DatasetCacheSpec& c : {cache, DatasetCacheSpec{}}) {
    DatasetRecord current = *store->GetDataset("imagenet-train");
    current.spec.cache = c;
    ASSERT_OK(store->UpdateDataset(current));
    auto set = store->GetDataset("imagenet-train");
    ASSERT_OK(set);
    EXPECT_EQ(set->spec.cache, c);
  }

  // Readers granted, then none again.
  for (const DatasetReaders& readers :
       {DatasetReaders{{65534, 70000}, {100}}, DatasetReaders{{}, {5}}, DatasetReaders{}}) {
    DatasetRecord current = *store->GetDataset("imagenet-train");
    current.readers = readers;
    ASSERT_OK(store->UpdateDataset(current));
    auto granted = store->GetDataset("imagenet-train");
    ASSERT_OK(granted);
    EXPECT_EQ(granted->readers, readers);
  }
}

TYPED_TEST(MetadataStoreTest, CreateOfExistingNameIsAlreadyExists) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("cifar")));
  auto again = store->CreateDataset(MakeDataset("cifar"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("'cifar'"));
}

TYPED_TEST(MetadataStoreTest, UpdateBumpsRevisionStampsTimeAndKeepsCreated) {
  ManualClock clock(1'000'000);
  MetadataStoreOptions options;
  options.clock = &clock;
  auto store = this->Open(options);
  ASSERT_NE(store, nullptr);
  auto created = store->CreateDataset(MakeDataset("coco"));
  ASSERT_OK(created);
  EXPECT_EQ(created->created_ms, 1'000'000);

  clock.Advance(milliseconds(5000));
  DatasetRecord change = *created;
  change.state = {DatasetPhase::kReady, "all staged", ""};
  change.manifest_id = "abc123";
  change.created_ms = 42;  // ignored: created_ms belongs to the store
  auto updated = store->UpdateDataset(change);
  ASSERT_OK(updated);
  EXPECT_EQ(updated->revision, 2u);
  EXPECT_EQ(updated->created_ms, 1'000'000);
  EXPECT_EQ(updated->updated_ms, 1'005'000);
  EXPECT_EQ(updated->state.phase, DatasetPhase::kReady);

  auto got = store->GetDataset("coco");
  ASSERT_OK(got);
  EXPECT_EQ(*got, *updated);
}

TYPED_TEST(MetadataStoreTest, UpdateFromStaleRevisionIsFailedPrecondition) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("coco")));
  auto a = store->GetDataset("coco");
  auto b = store->GetDataset("coco");
  ASSERT_OK(a);
  ASSERT_OK(b);
  a->state.message = "writer a";
  b->state.message = "writer b";
  ASSERT_OK(store->UpdateDataset(*a));
  auto lost = store->UpdateDataset(*b);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(lost.status().message(), HasSubstr("changed by someone else; re-read and retry"));

  auto got = store->GetDataset("coco");
  ASSERT_OK(got);
  EXPECT_EQ(got->state.message, "writer a");
  EXPECT_EQ(got->revision, 2u);
  // Re-read and retry works.
  got->state.message = "writer b";
  ASSERT_OK(store->UpdateDataset(*got));
}

TYPED_TEST(MetadataStoreTest, MissingDatasetIsNotFoundEverywhere) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  DatasetRecord ghost = MakeDataset("ghost");
  ghost.revision = 1;
  EXPECT_EQ(store->GetDataset("ghost").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->UpdateDataset(ghost).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->DeleteDataset("ghost").code(), StatusCode::kNotFound);
  EXPECT_EQ(store->PutProgress("ghost", "node-1", {}).code(), StatusCode::kNotFound);
  EXPECT_EQ(store->ListProgress("ghost").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->PutPlan("ghost", MakePlan("p1")).code(), StatusCode::kNotFound);
  EXPECT_EQ(store->ListPlans("ghost").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->DeletePlan("ghost", "p1").code(), StatusCode::kNotFound);
  EXPECT_THAT(store->GetDataset("ghost").status().message(), HasSubstr("'ghost'"));
  // Nothing was left behind by the refused writes.
  auto all = store->ListDatasets();
  ASSERT_OK(all);
  EXPECT_TRUE(all->empty());
}

TYPED_TEST(MetadataStoreTest, ListDatasetsIsSortedByName) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  auto empty = store->ListDatasets();
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());
  for (const char* name : {"zeta", "alpha", "m-1"})
    ASSERT_OK(store->CreateDataset(MakeDataset(name)));
  ASSERT_OK(store->DeleteDataset("m-1"));
  ASSERT_OK(store->CreateDataset(MakeDataset("beta")));
  auto all = store->ListDatasets();
  ASSERT_OK(all);
  std::vector<std::string> names;
  for (const auto& d : *all) names.push_back(d.name);
  EXPECT_EQ(names, (std::vector<std::string>{"alpha", "beta", "zeta"}));
  EXPECT_EQ((*all)[0], *store->GetDataset("alpha"));
}

TYPED_TEST(MetadataStoreTest, BadNamesAndSpecsAreInvalidArgument) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  for (std::string bad :
       {std::string(""), std::string("Upper"), std::string("-lead"), std::string("trail-"),
        std::string("under_score"), std::string("a.b"), std::string("sp ace"), std::string(64, 'a'),
        std::string("caf\xc3\xa9")}) {
    auto r = store->CreateDataset(MakeDataset(bad));
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("DNS-1123 label"));
    EXPECT_EQ(store->GetDataset(bad).status().code(), StatusCode::kInvalidArgument);
  }
  ASSERT_OK(store->CreateDataset(MakeDataset(std::string(63, 'a'))));
  ASSERT_OK(store->CreateDataset(MakeDataset("0-9")));

  auto expect_invalid = [&](DatasetRecord r, const std::string& needle) {
    auto s = store->CreateDataset(r);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr(needle));
  };
  DatasetRecord r = MakeDataset("specs");
  r.spec.source_uri.clear();
  expect_invalid(r, "source_uri");
  r = MakeDataset("specs");
  r.spec.chunk_size = 10;
  expect_invalid(r, "chunk_size");
  r = MakeDataset("specs");
  r.spec.replication = 0;
  expect_invalid(r, "replication");
  r = MakeDataset("specs");
  r.spec.pool = "GPU";
  expect_invalid(r, "pool");
  r = MakeDataset("specs");
  r.manifest_id = "not-hex";
  expect_invalid(r, "manifest id");
  r = MakeDataset("specs");
  r.state.message = "\xff\xfe";
  expect_invalid(r, "UTF-8");
  // Globs are compiled at create time, not when a node first snapshots.
  r = MakeDataset("specs");
  r.spec.include = {"**/*.jpg", "train/[a-"};
  expect_invalid(r, "spec.include");
  expect_invalid(r, "train/[a-");
  r = MakeDataset("specs");
  r.spec.exclude = {"tmp\\"};
  expect_invalid(r, "spec.exclude");
  r = MakeDataset("specs");
  r.spec.nodes = std::vector<std::string>{"gpu-1", "bad id"};
  expect_invalid(r, "spec.nodes");
  r.spec.nodes = std::vector<std::string>{"gpu-1", "gpu-1"};
  expect_invalid(r, "twice");
  r.spec.nodes = std::vector<std::string>(kMaxDatasetNodes + 1, "gpu-1");
  expect_invalid(r, "more than");
  r = MakeDataset("specs");
  r.state.claimed_by = "no/such node";
  expect_invalid(r, "state.claimed_by");
  r = MakeDataset("specs");
  r.spec.snapshot_by = static_cast<SnapshotBy>(7);
  expect_invalid(r, "spec.snapshot_by");
  r = MakeDataset("specs");
  r.readers.uids = {5, 3};
  expect_invalid(r, "readers.uids is not sorted and unique at 3");
  r.readers.uids = {3, 3};
  expect_invalid(r, "readers.uids is not sorted and unique");
  r.readers.uids = {0xffffffffu};
  expect_invalid(r, "readers.uids holds 4294967295");
  r.readers.uids = {};
  r.readers.gids.resize(kMaxDatasetReaders + 1);
  for (size_t i = 0; i < r.readers.gids.size(); ++i) r.readers.gids[i] = static_cast<uint32_t>(i);
  expect_invalid(r, "readers.gids lists 1025 ids");
  r = MakeDataset("specs");
  r.spec.cache.priority = 1001;
  expect_invalid(r, "spec.cache.priority 1001 is outside -1000..1000");
  r.spec.cache.priority = -1001;
  expect_invalid(r, "spec.cache.priority -1001");
  r.spec.cache.priority = 0;
  r.spec.cache.min_resident_percent = 101;
  expect_invalid(r, "spec.cache.min_resident_percent 101 is outside 0..100");
  r.spec.cache.min_resident_percent = 0;
  r.spec.cache.ttl_seconds = kMaxCacheTtlSeconds + 1;
  expect_invalid(r, "spec.cache.ttl_seconds");
  EXPECT_EQ(store->GetDataset("specs").status().code(), StatusCode::kNotFound);

  EXPECT_EQ(store->Heartbeat(MakeNode("bad/id", "p"), milliseconds(1000)).code(),
            StatusCode::kInvalidArgument);
  NodeRecord n = MakeNode("node-1", "p");
  n.address = "no-port";
  EXPECT_THAT(store->Heartbeat(n, milliseconds(1000)).message(), HasSubstr("host:port"));
  EXPECT_EQ(store->Heartbeat(MakeNode("node-1", "p"), milliseconds(0)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->ListNodes("Bad Pool").status().code(), StatusCode::kInvalidArgument);
}

// ---- manifests ----

TYPED_TEST(MetadataStoreTest, ManifestBlobsOfSeveralMegabytesRoundTrip) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  std::string blob(6 << 20, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (char& c : blob) {  // every byte value, zeros included
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  const std::string id = "0123456789abcdef0123456789abcdef";
  ASSERT_OK(store->PutManifest(id, blob));
  ASSERT_OK(store->PutManifest(id, blob));  // idempotent
  auto got = store->GetManifest(id);
  ASSERT_OK(got);
  EXPECT_TRUE(*got == blob);

  ASSERT_OK(store->PutManifest("ee", ""));
  auto empty = store->GetManifest("ee");
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());

  auto missing = store->GetManifest("ffff");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'ffff'"));
  EXPECT_EQ(store->PutManifest("XYZ", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->GetManifest("").status().code(), StatusCode::kInvalidArgument);
}

// ---- nodes ----

TYPED_TEST(MetadataStoreTest, HeartbeatsRegisterRefreshAndFilterByPool) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  const milliseconds ttl(60'000);
  ASSERT_OK(store->Heartbeat(MakeNode("node-b", "pool-a"), ttl));
  ASSERT_OK(store->Heartbeat(MakeNode("node-a", "pool-a"), ttl));
  ASSERT_OK(store->Heartbeat(MakeNode("node-c", "pool-b"), ttl));

  auto all = store->ListNodes("");
  ASSERT_OK(all);
  EXPECT_EQ(NodeIds(*all), (std::vector<std::string>{"node-a", "node-b", "node-c"}));
  auto a = store->ListNodes("pool-a");
  ASSERT_OK(a);
  EXPECT_EQ(NodeIds(*a), (std::vector<std::string>{"node-a", "node-b"}));
  auto none = store->ListNodes("pool-z");
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());

  NodeRecord expected = MakeNode("node-a", "pool-a");
  expected.heartbeat_ms = (*a)[0].heartbeat_ms;
  EXPECT_GT(expected.heartbeat_ms, 0);
  EXPECT_EQ((*a)[0], expected);

  // A refresh replaces the record; a node may move pools.
  NodeRecord moved = MakeNode("node-a", "pool-b");
  moved.used_bytes = 7;
  ASSERT_OK(store->Heartbeat(moved, ttl));
  auto b = store->ListNodes("pool-b");
  ASSERT_OK(b);
  ASSERT_EQ(NodeIds(*b), (std::vector<std::string>{"node-a", "node-c"}));
  EXPECT_EQ((*b)[0].used_bytes, 7u);
  EXPECT_EQ(NodeIds(*store->ListNodes("pool-a")), (std::vector<std::string>{"node-b"}));

  ASSERT_OK(store->RemoveNode("node-b"));
  EXPECT_EQ(store->RemoveNode("node-b").code(), StatusCode::kNotFound);
  EXPECT_EQ(NodeIds(*store->ListNodes("")), (std::vector<std::string>{"node-a", "node-c"}));
}

// The membership version moves on every change of the live nodes (a join,
// an identity change, a removal, an expiry) and stays put while heartbeats
// only keep nodes alive, so readers list nodes only when it moves.
TYPED_TEST(MetadataStoreTest, NodesVersionMovesOnMembershipChangesOnly) {
  ManualClock clock;
  MetadataStoreOptions options;
  options.clock = &clock;
  auto store = this->Open(options);
  ASSERT_NE(store, nullptr);
  auto version = [&] {
    auto v = store->NodesVersion();
    EXPECT_OK(v);
    return v.ok() ? *v : 0;
  };
  const milliseconds long_ttl(600'000);
  const uint64_t empty = version();
  EXPECT_EQ(version(), empty) << "reading it changes nothing";
  ASSERT_OK(store->Heartbeat(MakeNode("a", "p"), long_ttl));
  const uint64_t joined = version();
  EXPECT_NE(joined, empty) << "a join";
  NodeRecord a = MakeNode("a", "p");
  for (int i = 0; i < 5; ++i) {
    a.used_bytes = static_cast<uint64_t>(i) * 1000;  // refreshes: not an identity change
    ASSERT_OK(store->Heartbeat(a, long_ttl));
    clock.Advance(milliseconds(1000));
  }
  EXPECT_EQ(version(), joined) << "heartbeats that only refresh";
  a.address = "elsewhere:7070";
  ASSERT_OK(store->Heartbeat(a, long_ttl));
  const uint64_t moved = version();
  EXPECT_NE(moved, joined) << "an identity change";
  ASSERT_OK(store->Heartbeat(MakeNode("b", "other-pool"), long_ttl));
  const uint64_t other = version();
  EXPECT_NE(other, moved) << "a join in another pool";
  ASSERT_OK(store->RemoveNode("b"));
  const uint64_t removed = version();
  EXPECT_NE(removed, other) << "a removal";
  EXPECT_EQ(store->RemoveNode("b").code(), StatusCode::kNotFound);
  EXPECT_EQ(version(), removed) << "removing a node that is not there";

  // An expiry is seen at once, before any sweep; the sweep (the next
  // heartbeat of another node) moves it again, never back.
  ASSERT_OK(store->Heartbeat(MakeNode("short", "p"), milliseconds(200)));
  const uint64_t with_short = version();
  clock.Advance(milliseconds(200));
  uint64_t expired = with_short;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        expired = version();
        return expired != with_short;
      },
      std::chrono::seconds(30)));
  ASSERT_OK(store->Heartbeat(a, long_ttl));
  const uint64_t swept = version();
  EXPECT_NE(swept, expired);
  EXPECT_NE(swept, with_short);
  EXPECT_EQ(NodeIds(*store->ListNodes("p")), (std::vector<std::string>{"a"}));
  EXPECT_EQ(version(), swept);
}

// NodeListFollower lists the pool only when the version moved (or after its
// safety interval), and hands back what it listed.
TYPED_TEST(MetadataStoreTest, NodeListFollowerListsOnlyWhenMembershipMoved) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  const milliseconds ttl(600'000);
  ASSERT_OK(store->Heartbeat(MakeNode("a", "p"), ttl));
  NodeListFollower follower("p", std::chrono::seconds(60));
  auto now = std::chrono::steady_clock::now();
  auto first = follower.Poll(*store, now);
  ASSERT_OK(first);
  ASSERT_TRUE(first->has_value());
  EXPECT_EQ(NodeIds(**first), (std::vector<std::string>{"a"}));
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(store->Heartbeat(MakeNode("a", "p"), ttl));
    auto again = follower.Poll(*store, now + std::chrono::seconds(i));
    ASSERT_OK(again);
    EXPECT_FALSE(again->has_value()) << "listed with nothing changed";
  }
  EXPECT_EQ(follower.lists(), 1u);
  ASSERT_OK(store->Heartbeat(MakeNode("b", "p"), ttl));
  auto joined = follower.Poll(*store, now + std::chrono::seconds(11));
  ASSERT_OK(joined);
  ASSERT_TRUE(joined->has_value());
  EXPECT_EQ(NodeIds(**joined), (std::vector<std::string>{"a", "b"}));
  // The safety interval lists again though nothing moved.
  auto late = follower.Poll(*store, now + std::chrono::seconds(72));
  ASSERT_OK(late);
  EXPECT_TRUE(late->has_value());
  EXPECT_EQ(follower.lists(), 3u);
}

TYPED_TEST(MetadataStoreTest, NodesExpireWhenHeartbeatsStop) {
  // SQLite expires nodes by the store's Clock: moving the ManualClock past the
  // TTL expires "short" at once. Redis expires them by its own clock: the short
  // TTL runs out by itself. No assertion depends on a call finishing within
  // the TTL: that "short" was registered shows in its join event.
  ManualClock clock;
  MetadataStoreOptions options;
  options.clock = &clock;
  auto store = this->Open(options);
  ASSERT_NE(store, nullptr);
  auto watcher = store->Watch();
  ASSERT_OK(watcher);
  const milliseconds short_ttl(200);
  const milliseconds long_ttl(600'000);
  ASSERT_OK(store->Heartbeat(MakeNode("short", "p"), short_ttl));
  ASSERT_OK(store->Heartbeat(MakeNode("long", "p"), long_ttl));
  EXPECT_EQ(Collect(**watcher, 2),
            (std::vector<Event>{{EventKind::kNode, "short"}, {EventKind::kNode, "long"}}));
  if constexpr (TypeParam::kExpiryFollowsStoreClock) {
    // Time stands still, so nothing has expired yet.
    EXPECT_EQ(NodeIds(*store->ListNodes("p")), (std::vector<std::string>{"long", "short"}));
  }

  clock.Advance(short_ttl);
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto nodes = store->ListNodes("p");
        return nodes.ok() && NodeIds(*nodes) == std::vector<std::string>{"long"};
      },
      std::chrono::seconds(30)));
  EXPECT_EQ(store->RemoveNode("short").code(), StatusCode::kNotFound);
  // Heartbeating again brings it back.
  ASSERT_OK(store->Heartbeat(MakeNode("short", "p"), long_ttl));
  EXPECT_EQ(NodeIds(*store->ListNodes("p")), (std::vector<std::string>{"long", "short"}));
}

// ---- progress and plans ----

TYPED_TEST(MetadataStoreTest, ProgressIsKeptPerNode) {
  ManualClock clock(5'000);
  MetadataStoreOptions options;
  options.clock = &clock;
  auto store = this->Open(options);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  auto empty = store->ListProgress("ds");
  ASSERT_OK(empty);
  EXPECT_TRUE(empty->empty());

  StagingProgress p{10, 3, 1000, 300, 1, 0};
  ASSERT_OK(store->PutProgress("ds", "node-1", p));
  ASSERT_OK(store->PutProgress("ds", "node-2", StagingProgress{10, 0, 1000, 0, 0, 0}));
  clock.Advance(milliseconds(100));
  p.chunks_staged = 4;
  ASSERT_OK(store->PutProgress("ds", "node-1", p));

  auto got = store->ListProgress("ds");
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 2u);
  StagingProgress want = p;
  want.updated_ms = 5'100;
  EXPECT_EQ(got->at("node-1"), want);
  EXPECT_EQ(got->at("node-2").chunks_staged, 0u);
  EXPECT_EQ(got->at("node-2").updated_ms, 5'000);
  EXPECT_EQ(store->PutProgress("ds", "bad id", p).code(), StatusCode::kInvalidArgument);

  // What a node does not keep of its share and when it was last read, and
  // back to none: the record reads as a node whose share fits.
  p.chunks_not_kept = 6;
  p.bytes_not_kept = 600;
  p.last_read_ms = 1'700'000'000'000;
  ASSERT_OK(store->PutProgress("ds", "node-1", p));
  auto kept = store->ListProgress("ds");
  ASSERT_OK(kept);
  EXPECT_EQ(kept->at("node-1").chunks_not_kept, 6u);
  EXPECT_EQ(kept->at("node-1").bytes_not_kept, 600u);
  EXPECT_EQ(kept->at("node-1").chunks_kept(), 4u);
  EXPECT_EQ(kept->at("node-1").last_read_ms, 1'700'000'000'000);
  p.chunks_not_kept = 0;
  p.bytes_not_kept = 0;
  p.last_read_ms = 0;
  ASSERT_OK(store->PutProgress("ds", "node-1", p));
  kept = store->ListProgress("ds");
  ASSERT_OK(kept);
  EXPECT_EQ(kept->at("node-1").chunks_kept(), 10u);
  EXPECT_EQ(kept->at("node-1").last_read_ms, 0);
}

TYPED_TEST(MetadataStoreTest, PlansAreRegisteredListedReplacedAndDeleted) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  ASSERT_OK(store->PutPlan("ds", MakePlan("plan-b")));
  ASSERT_OK(store->PutPlan("ds", MakePlan("plan-a")));
  PlanRecord replaced = MakePlan("plan-b");
  replaced.mode = "sequential";
  ASSERT_OK(store->PutPlan("ds", replaced));

  auto plans = store->ListPlans("ds");
  ASSERT_OK(plans);
  ASSERT_EQ(plans->size(), 2u);
  EXPECT_EQ((*plans)[0].plan_id, "plan-a");
  PlanRecord want = MakePlan("plan-a");
  want.registered_ms = (*plans)[0].registered_ms;
  EXPECT_GT(want.registered_ms, 0);
  EXPECT_EQ((*plans)[0], want);
  EXPECT_EQ((*plans)[1].mode, "sequential");

  ASSERT_OK(store->DeletePlan("ds", "plan-a"));
  EXPECT_EQ(store->DeletePlan("ds", "plan-a").code(), StatusCode::kNotFound);
  EXPECT_EQ(store->ListPlans("ds")->size(), 1u);

  PlanRecord bad = MakePlan("plan-c");
  bad.mode = "random";
  auto s = store->PutPlan("ds", bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("global, chunkwise, sequential"));
  bad = MakePlan("plan-c");
  bad.world_size = 0;
  EXPECT_EQ(store->PutPlan("ds", bad).code(), StatusCode::kInvalidArgument);
  bad = MakePlan("plan-c");
  bad.window_chunks = 0;
  s = store->PutPlan("ds", bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("window"));
  EXPECT_EQ(store->PutPlan("ds", MakePlan("bad/id")).code(), StatusCode::kInvalidArgument);
}

TYPED_TEST(MetadataStoreTest, DeletingADatasetDeletesItsProgressAndPlans) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  ASSERT_OK(store->CreateDataset(MakeDataset("other")));
  for (const char* ds : {"ds", "other"}) {
    ASSERT_OK(store->PutProgress(ds, "node-1", StagingProgress{1, 1, 1, 1, 0, 0}));
    ASSERT_OK(store->PutPlan(ds, MakePlan("p")));
  }
  ASSERT_OK(store->DeleteDataset("ds"));
  EXPECT_EQ(store->ListProgress("ds").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->ListPlans("ds").status().code(), StatusCode::kNotFound);

  // A new dataset of the same name starts empty.
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  EXPECT_TRUE(store->ListProgress("ds")->empty());
  EXPECT_TRUE(store->ListPlans("ds")->empty());
  // Its neighbour kept everything.
  EXPECT_EQ(store->ListProgress("other")->size(), 1u);
  EXPECT_EQ(store->ListPlans("other")->size(), 1u);
}

// ---- events ----

TYPED_TEST(MetadataStoreTest, WatcherSeesEveryKindOfMutationInOrder) {
  auto store = this->Open();
  ASSERT_NE(store, nullptr);
  auto watcher = store->Watch();
  ASSERT_OK(watcher);
  auto quiet = (*watcher)->Next(milliseconds(50));
  ASSERT_OK(quiet);
  EXPECT_TRUE(quiet->empty());

  auto created = store->CreateDataset(MakeDataset("ds"));
  ASSERT_OK(created);
  ASSERT_OK(store->UpdateDataset(*created));
  ASSERT_OK(store->PutProgress("ds", "node-1", {}));
  ASSERT_OK(store->PutPlan("ds", MakePlan("p")));
  ASSERT_OK(store->DeletePlan("ds", "p"));
  ASSERT_OK(store->Heartbeat(MakeNode("node-1", "p"), milliseconds(60'000)));
  ASSERT_OK(store->Heartbeat(MakeNode("node-1", "p"), milliseconds(60'000)));  // no change
  NodeRecord moved = MakeNode("node-1", "q");
  ASSERT_OK(store->Heartbeat(moved, milliseconds(60'000)));  // changed pool
  ASSERT_OK(store->RemoveNode("node-1"));
  ASSERT_OK(store->PutManifest("aa", "bytes"));  // manifests publish nothing
  ASSERT_OK(store->DeleteDataset("ds"));
  ASSERT_OK(store->CreateDataset(MakeDataset("ds-x")));
  // Refused writes publish nothing.
  EXPECT_EQ(store->CreateDataset(MakeDataset("ds-x")).status().code(), StatusCode::kAlreadyExists);
  DatasetRecord stale = MakeDataset("ds-x");
  stale.revision = 7;
  EXPECT_EQ(store->UpdateDataset(stale).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->RemoveNode("never-there").code(), StatusCode::kNotFound);
  ASSERT_OK(store->DeleteDataset("ds-x"));

  const std::vector<Event> want = {
      {EventKind::kDataset, "ds"},   {EventKind::kDataset, "ds"},   {EventKind::kProgress, "ds"},
      {EventKind::kPlan, "ds"},      {EventKind::kPlan, "ds"},      {EventKind::kNode, "node-1"},
      {EventKind::kNode, "node-1"},  {EventKind::kNode, "node-1"},  {EventKind::kDataset, "ds"},
      {EventKind::kDataset, "ds-x"}, {EventKind::kDataset, "ds-x"},
  };
  EXPECT_EQ(Collect(**watcher, want.size()), want);
  auto after = (*watcher)->Next(milliseconds(100));
  ASSERT_OK(after);
  EXPECT_TRUE(after->empty()) << "more events than mutations";
}

TYPED_TEST(MetadataStoreTest, WatcherSeesWritesOfAnotherStoreAndOutlivesItsOwn) {
  auto writer = this->Open();
  auto reader = this->Open();
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  auto watcher = reader->Watch();
  ASSERT_OK(watcher);
  reader.reset();  // the watcher has its own connection
  ASSERT_OK(writer->CreateDataset(MakeDataset("from-elsewhere")));
  ASSERT_OK(writer->Heartbeat(MakeNode("node-9", "p"), milliseconds(60'000)));
  EXPECT_EQ(Collect(**watcher, 2), (std::vector<Event>{{EventKind::kDataset, "from-elsewhere"},
                                                       {EventKind::kNode, "node-9"}}));
}

// ---- concurrency ----

TYPED_TEST(MetadataStoreTest, ConcurrentUpdatesFromThreadsAndInstancesNeverLoseOne) {
  auto first = this->Open();
  auto second = this->Open();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  DatasetRecord counter = MakeDataset("counter");
  counter.state.message = "0";
  ASSERT_OK(first->CreateDataset(counter));

  constexpr int kThreads = 4;
  constexpr int kIncrements = 10;
  constexpr int kMaxAttempts = 2000;  // bounds the loop if the store misbehaves
  std::atomic<int> conflicts{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Two threads on each instance: the store's own mutex and the backend's
    // cross-connection concurrency are both exercised.
    MetadataStore* store = (t % 2 == 0 ? first : second).get();
    threads.emplace_back([store, &conflicts, &failures] {
      int done = 0;
      for (int attempt = 0; attempt < kMaxAttempts && done < kIncrements; ++attempt) {
        auto r = store->GetDataset("counter");
        if (!r.ok()) {
          ++failures;
          return;
        }
        r->state.message = std::to_string(std::stoi(r->state.message) + 1);
        auto u = store->UpdateDataset(*r);
        if (u.ok()) {
          ++done;
        } else if (u.status().code() == StatusCode::kFailedPrecondition) {
          ++conflicts;
        } else {
          ++failures;
          return;
        }
      }
      if (done != kIncrements) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto final_state = second->GetDataset("counter");
  ASSERT_OK(final_state);
  EXPECT_EQ(final_state->state.message, std::to_string(kThreads * kIncrements));
  EXPECT_EQ(final_state->revision, static_cast<uint64_t>(kThreads * kIncrements + 1));
}

TYPED_TEST(MetadataStoreTest, TwoInstancesWritingAtOnceSeeEachOthersWrites) {
  auto first = this->Open();
  auto second = this->Open();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  std::atomic<int> failures{0};
  auto writer = [&failures](MetadataStore* store, const std::string& prefix) {
    for (int i = 0; i < 15; ++i) {
      if (!store->CreateDataset(MakeDataset(prefix + std::to_string(i))).ok()) ++failures;
      if (!store->Heartbeat(MakeNode(prefix + "node", "p"), milliseconds(60'000)).ok()) ++failures;
    }
  };
  std::thread a(writer, first.get(), "a-");
  std::thread b(writer, second.get(), "b-");
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  for (MetadataStore* store : {first.get(), second.get()}) {
    auto all = store->ListDatasets();
    ASSERT_OK(all);
    EXPECT_EQ(all->size(), 30u);
    EXPECT_EQ(NodeIds(*store->ListNodes("p")), (std::vector<std::string>{"a-node", "b-node"}));
  }
}

// ---- URLs (no backend needed) ----

TEST(OpenMetadataStoreTest, BadUrlsAreInvalidArgumentListingTheAcceptedForms) {
  const char* bad[] = {
      "",
      "granary.db",
      "http://example.com/",
      "redis://",
      "redis://:@host",
      "redis://host:",
      "redis://host:0",
      "redis://host:65536",
      "redis://host:abc",
      "redis://host/db1",
      "redis://host/1/2",
      "redis://ho st",
      "redis://host?unknown=1",
      "redis://host?prefix=",
      "redis://host?prefix=a&prefix=b",
      "redis://host?timeout_ms=0",
      "redis://host?retry_ms=-5",
      "redis://host?poll_ms=5",
      "redis://user@host",
      "sqlite://relative/granary.db",
      "sqlite:relative.db",
      "sqlite://",
      "sqlite:///var/lib/",
      "sqlite:///tmp/x.db?prefix=a",
      "sqlite:///tmp/x.db?retry_ms=abc",
  };
  for (const char* url : bad) {
    auto r = OpenMetadataStore(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
        << url << ": " << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr("redis://[[user]:password@]host[:port][/db]"))
        << url;
    EXPECT_THAT(r.status().message(), HasSubstr("sqlite:///absolute/path/granary.db")) << url;
  }
  auto unknown = OpenMetadataStore("redis://host?bogus=1");
  EXPECT_THAT(unknown.status().message(), HasSubstr("'bogus'"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("prefix, retry_ms, timeout_ms"));
}

TEST(OpenMetadataStoreTest, PasswordsNeverAppearInMessages) {
  auto r = OpenMetadataStore("redis://admin:hunter2@host:99999/0");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), Not(HasSubstr("hunter2")));
  EXPECT_THAT(r.status().message(), HasSubstr("admin:***@host"));
}

TEST(OpenMetadataStoreTest, PasswordsWithReservedCharactersNeverAppearInMessages) {
  // Users paste passwords unencoded: everything up to the last '@' is user
  // info, whatever '/', '?', '#', ':' or '@' it holds.
  for (const std::string& password : std::vector<std::string>{
           "SECRETa/SECRETb", "SECRETa?SECRETb", "SECRETa#SECRETb", "SECRETa@SECRETb",
           "SECRETa:SECRETb", "SECRETa/?#@:SECRETb", "SECRETa/0"}) {
    const std::string user_info = "admin:" + password + "@";
    for (const std::string& url : {
             "redis://" + user_info,                    // the host is missing
             "redis://" + user_info + "/0",             // the host is missing
             "redis://:" + password + "@host:0/0",      // bad port
             "redis://" + user_info + "ho st/0",        // bad host
             "redis://" + user_info + "host/db1",       // bad database
             "redis://" + user_info + "host?bogus=1",   // unknown parameter
             "redis://" + user_info + "host#fragment",  // a fragment
             "redis://admin:" + password + "%zz@host",  // bad percent-encoding
             "rediss://" + user_info + "host",          // unknown scheme
             user_info + "host:6379",                   // no scheme
             std::string("SECRETc@host:6379"),          // no scheme, no user
         }) {
      auto r = OpenMetadataStore(url);
      ASSERT_FALSE(r.ok()) << url;
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
      EXPECT_THAT(r.status().message(), Not(HasSubstr("SECRET"))) << url;
      EXPECT_THAT(r.status().message(), HasSubstr("***@")) << url;
    }
    MetadataStoreOptions bad_options;
    bad_options.poll_interval = milliseconds(0);
    auto r = OpenMetadataStore("redis://" + user_info + "host", bad_options);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), Not(HasSubstr("SECRET")));
  }
  auto r = OpenMetadataStore("redis://admin:pa/ss@host:0/0");
  EXPECT_THAT(r.status().message(), HasSubstr("'redis://admin:***@host:0/0'"));
  EXPECT_THAT(r.status().message(), HasSubstr("the port '0'"));
}

TEST(OpenMetadataStoreTest, BadOptionsAreInvalidArgument) {
  MetadataStoreOptions options;
  options.connect_timeout = milliseconds(0);
  EXPECT_EQ(OpenMetadataStore("sqlite:///tmp/never-created.db", options).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DatasetNamesTest, PhaseAndKindNamesRoundTrip) {
  for (auto phase : {DatasetPhase::kPending, DatasetPhase::kSnapshotting, DatasetPhase::kStaging,
                     DatasetPhase::kReady, DatasetPhase::kFailed, DatasetPhase::kDeleting}) {
    auto parsed = ParseDatasetPhase(DatasetPhaseName(phase));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, phase);
  }
  EXPECT_EQ(ParseDatasetPhase("ready").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EventKindName(EventKind::kResync), "resync");
  EXPECT_TRUE(ValidateNodeId("gpu-node-01.cluster.local").ok());
  EXPECT_FALSE(ValidateNodeId("node:1").ok());
  EXPECT_FALSE(ValidateNodeId(std::string(254, 'n')).ok());
}

TEST(PlanRecordTest, DefaultsAreThoseOfPlanSpec) {
  const PlanRecord record;
  const PlanSpec spec;
  EXPECT_EQ(record.window_chunks, spec.window);
  EXPECT_EQ(record.mode, PlanModeName(spec.mode));
  EXPECT_EQ(record.world_size, spec.world_size);
  EXPECT_EQ(record.batch_size, spec.batch_size);
  EXPECT_EQ(record.drop_last, spec.drop_last);
  auto converted = ToPlanSpec(record, 0, 0);
  ASSERT_OK(converted);
  EXPECT_EQ(*converted, spec);
}

TEST(PlanRecordTest, ToPlanSpecCarriesEveryFieldAndValidates) {
  const PlanRecord record = MakePlan("job-42");
  auto spec = ToPlanSpec(record, 7, 63);
  ASSERT_OK(spec);
  PlanSpec want;
  want.seed = record.seed;
  want.epoch = 7;
  want.world_size = 64;
  want.rank = 63;
  want.batch_size = 256;
  want.drop_last = true;
  want.mode = PlanMode::kChunkwise;
  want.window = 4;
  EXPECT_EQ(*spec, want);

  auto bad_rank = ToPlanSpec(record, 7, 64);
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("plan 'job-42'"));
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("rank 64"));
  EXPECT_EQ(ToPlanSpec(record, kMaxPlanEpoch + 1, 0).status().code(), StatusCode::kInvalidArgument);
  PlanRecord bad_mode = record;
  bad_mode.mode = "Global";
  auto mode = ToPlanSpec(bad_mode, 0, 0);
  EXPECT_EQ(mode.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(mode.status().message(), HasSubstr("global, chunkwise, sequential"));
  PlanRecord no_window = record;
  no_window.window_chunks = 0;
  EXPECT_EQ(ToPlanSpec(no_window, 0, 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace granary

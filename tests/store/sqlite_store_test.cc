// SQLite-only behaviour of the metadata store: two processes on one file, a
// file locked by someone else, files that are corrupt, foreign or newer,
// records damaged behind the store's back, expiry by the injected clock, and
// watchers that fall behind pruning.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/clock.h"
#include "granary/core/metadata_store.h"
#include "granary/store/open_store.h"
#include "testing/child_process.h"
#include "testing/sqlite_lock.h"
#include "testing/store_records.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

using testing::MakeDataset;
using testing::MakeNode;
using testing::MakePlan;

bool HasDataset(MetadataStore& store, const std::string& name) {
  return store.GetDataset(name).ok();
}

class SqliteStoreTest : public ::testing::Test {
 protected:
  std::string path() const { return dir_.Join("granary.db"); }
  std::string url(const std::string& query = "") const { return "sqlite://" + path() + query; }

  std::unique_ptr<MetadataStore> Open(const std::string& url, MetadataStoreOptions options = {}) {
    auto store = OpenMetadataStore(url, options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }

  // A raw connection, as another program would have.
  sqlite3* RawOpen() {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path().c_str(), &db), SQLITE_OK);
    return db;
  }
  static void RawExec(sqlite3* db, const char* sql) {
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &error), SQLITE_OK)
        << sql << ": " << (error != nullptr ? error : "");
    sqlite3_free(error);
  }
  // The text in column 0 of the first row of `sql`, whose ?s take `params`.
  static std::string RawQuery(sqlite3* db, const char* sql,
                              const std::vector<std::string>& params) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    for (size_t i = 0; i < params.size(); ++i) {
      sqlite3_bind_text(stmt, static_cast<int>(i + 1), params[i].c_str(), -1, SQLITE_TRANSIENT);
    }
    std::string out;
    const int rc = sqlite3_step(stmt);
    if (rc == SQLITE_ROW) {
      const auto* text = sqlite3_column_text(stmt, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    } else {
      EXPECT_EQ(rc, SQLITE_DONE) << sql << ": " << sqlite3_errmsg(db);
    }
    sqlite3_finalize(stmt);
    return out;
  }

  testing::TempDir dir_;
};

// Runs in the forked child; the exit code says what went wrong.
int ChildWritesAndWaitsForParent(const std::string& url) {
  auto store = OpenMetadataStore(url);
  if (!store.ok()) return 2;
  for (int i = 0; i < 10; ++i) {
    if (!(*store)->CreateDataset(MakeDataset("child-" + std::to_string(i))).ok()) return 3;
  }
  if (!(*store)->Heartbeat(MakeNode("child-node"), milliseconds(60'000)).ok()) return 4;
  bool seen =
      testing::WaitFor([&] { return HasDataset(**store, "parent-9"); }, std::chrono::seconds(20));
  return seen ? 0 : 5;
}

TEST_F(SqliteStoreTest, TwoProcessesWritingAtOnceSeeEachOthersWrites) {
  // Fork before this process opens the file: SQLite connections must not
  // cross fork(). The schema is created by whichever process gets there first.
  // `child` kills and reaps the process if an assertion below returns early.
  auto child = testing::ChildProcess::Start(
      [url = url()](int /*control_fd*/) { return ChildWritesAndWaitsForParent(url); });
  ASSERT_OK(child);

  auto store = Open(url());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(store->CreateDataset(MakeDataset("parent-" + std::to_string(i))));
  }
  EXPECT_TRUE(
      testing::WaitFor([&] { return HasDataset(*store, "child-9"); }, std::chrono::seconds(20)));
  auto code = (*child)->Wait(std::chrono::seconds(25));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "child exit codes: 2 open, 3 create, 4 heartbeat, "
                         "5 never saw the parent's writes";
  auto all = store->ListDatasets();
  ASSERT_OK(all);
  EXPECT_EQ(all->size(), 20u);
  auto nodes = store->ListNodes("");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].id, "child-node");
}

TEST_F(SqliteStoreTest, LockedFileFailsAfterTheBusyTimeoutThenSucceedsOnceReleased) {
  auto store = Open(url("?retry_ms=300"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("existing")));

  testing::SqliteWriteLock other(path());
  const auto start = steady_clock::now();
  auto blocked = store->CreateDataset(MakeDataset("blocked"));
  const auto elapsed = steady_clock::now() - start;
  ASSERT_FALSE(blocked.ok());
  EXPECT_EQ(blocked.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(blocked.status().message(), HasSubstr("database is locked"));
  EXPECT_THAT(blocked.status().message(), HasSubstr(path()));
  EXPECT_THAT(blocked.status().message(), HasSubstr("busy timeout of 300 ms"));
  EXPECT_GE(elapsed, milliseconds(250));  // it waited for the lock before giving up
  // WAL: readers are not blocked by a writer.
  EXPECT_OK(store->GetDataset("existing"));

  other.Unlock();
  ASSERT_OK(store->CreateDataset(MakeDataset("blocked")));
}

// Security: the store is not world-readable (dataset names, owners and
// manifest ids were readable by every user on the host at 0644).
TEST_F(SqliteStoreTest, ANewStoreFileIsReadableByItsOwnerOnly) {
  const std::string path = dir_.Join("fresh.db");
  ::umask(022);
  auto store = OpenMetadataStore("sqlite://" + path);
  ASSERT_OK(store);
  ASSERT_OK((*store)->CreateDataset(testing::MakeDataset("pets")));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // An existing file keeps the mode its owner gave it.
  const std::string shared = dir_.Join("shared.db");
  testing::WriteAll(shared, "");
  ASSERT_EQ(::chmod(shared.c_str(), 0640), 0);
  auto kept = OpenMetadataStore("sqlite://" + shared);
  ASSERT_OK(kept);
  ASSERT_OK((*kept)->CreateDataset(testing::MakeDataset("pets")));
  ASSERT_EQ(::stat(shared.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

TEST_F(SqliteStoreTest, GarbageFileIsCorruptionAtOpenNamingTheFile) {
  std::string garbage(64 << 10, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 7);
  dir_.WriteFile("granary.db", garbage);
  auto store = OpenMetadataStore(url());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(store.status().message(), HasSubstr(path()));
  EXPECT_THAT(store.status().message(), HasSubstr("move it aside"));
}

TEST_F(SqliteStoreTest, DamagedPagesAreCorruptionWhenRead) {
  {
    auto store = Open(url());
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 20; ++i)
      ASSERT_OK(store->CreateDataset(MakeDataset("d" + std::to_string(i))));
  }  // the last connection checkpoints the WAL into the file
  std::string content;
  {
    FILE* f = std::fopen(path().c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) content.append(buf, n);
    std::fclose(f);
  }
  ASSERT_GT(content.size(), 4096u);
  // Keep page 1 (header and schema), scribble over every table page.
  for (size_t i = 4096; i < content.size(); ++i) content[i] = static_cast<char>(0xA5);
  dir_.WriteFile("granary.db", content);

  auto store = OpenMetadataStore(url());
  Status status = store.ok() ? (*store)->ListDatasets().status() : store.status();
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr(path()));
}

TEST_F(SqliteStoreTest, ForeignSqliteDatabaseIsRefused) {
  sqlite3* other = RawOpen();
  RawExec(other, "CREATE TABLE accounts (id INTEGER PRIMARY KEY)");
  sqlite3_close(other);
  auto store = OpenMetadataStore(url());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("not a Granary store"));
}

TEST_F(SqliteStoreTest, NewerSchemaIsVersionMismatch) {
  ASSERT_NE(Open(url()), nullptr);
  sqlite3* other = RawOpen();
  RawExec(other, "PRAGMA user_version = 2");
  sqlite3_close(other);
  auto store = OpenMetadataStore(url());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 2"));
}

TEST_F(SqliteStoreTest, MissingDirectoryIsNotFound) {
  const std::string dir = dir_.Join("no/such/dir");
  auto store = OpenMetadataStore("sqlite://" + dir + "/granary.db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(store.status().message(), HasSubstr(dir));
  EXPECT_THAT(store.status().message(), HasSubstr("create it"));
}

TEST_F(SqliteStoreTest, AcknowledgedWritesSurviveReopening) {
  {
    auto first = Open(url());
    ASSERT_NE(first, nullptr);
    ASSERT_OK(first->CreateDataset(MakeDataset("kept")));
  }
  auto store = Open(url());
  ASSERT_NE(store, nullptr);
  EXPECT_OK(store->GetDataset("kept"));
}

TEST_F(SqliteStoreTest, ExpiryFollowsTheInjectedClock) {
  ManualClock clock;
  MetadataStoreOptions options;
  options.clock = &clock;
  auto store = Open(url(), options);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->Heartbeat(MakeNode("node-1"), milliseconds(1000)));
  clock.Advance(milliseconds(999));
  EXPECT_EQ(store->ListNodes("")->size(), 1u);
  clock.Advance(milliseconds(1));
  EXPECT_TRUE(store->ListNodes("")->empty());
  EXPECT_EQ(store->RemoveNode("node-1").code(), StatusCode::kNotFound);
}

// A clock whose next reading can be held up: after Arm(), the next
// NowMillis() blocks until Release(). Counts readings.
class GateClock final : public Clock {
 public:
  explicit GateClock(int64_t now_ms) : now_ms_(now_ms) {}

  int64_t NowMillis() const override {
    std::unique_lock<std::mutex> lock(mu_);
    ++readings_;
    if (armed_) {
      armed_ = false;
      blocked_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
      blocked_ = false;
    }
    return now_ms_;
  }
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    released_ = false;
  }
  bool WaitUntilBlocked(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return blocked_; });
  }
  void Release(int64_t now_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ms_ = now_ms;
    released_ = true;
    cv_.notify_all();
  }
  int readings() const {
    std::lock_guard<std::mutex> lock(mu_);
    return readings_;
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int64_t now_ms_;              // guarded by mu_
  mutable bool armed_ = false;  // guarded by mu_
  mutable bool blocked_ = false;
  bool released_ = true;
  mutable int readings_ = 0;
};

TEST_F(SqliteStoreTest, HeartbeatReadsTheClockOnlyOnceItHoldsTheStore) {
  GateClock clock(1'000'000);
  MetadataStoreOptions options;
  options.clock = &clock;
  auto store = Open(url(), options);
  ASSERT_NE(store, nullptr);

  Status first_status;
  Status second_status;
  std::thread first;
  std::thread second;
  struct Joiner {  // releases and joins whatever an assertion leaves running
    GateClock& clock;
    std::thread& a;
    std::thread& b;
    ~Joiner() {
      clock.Release(2'000'000);
      if (a.joinable()) a.join();
      if (b.joinable()) b.join();
    }
  } joiner{clock, first, second};

  // The first heartbeat stops while reading the clock...
  clock.Arm();
  first = std::thread([&] { first_status = store->Heartbeat(MakeNode("node-a"), 60'000ms); });
  ASSERT_TRUE(clock.WaitUntilBlocked(std::chrono::seconds(30)));
  // ...so a second one must wait for the store before it reads the time.
  const int readings = clock.readings();
  second = std::thread([&] { second_status = store->Heartbeat(MakeNode("node-b"), 60'000ms); });
  EXPECT_FALSE(testing::WaitFor([&] { return clock.readings() > readings; }, milliseconds(300)))
      << "the second heartbeat read the clock while the first one held the store";
  clock.Release(2'000'000);
  first.join();
  second.join();
  ASSERT_OK(first_status);
  ASSERT_OK(second_status);

  // Both stamped the time they wrote at, not a time from before they waited.
  auto nodes = store->ListNodes("");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].heartbeat_ms, 2'000'000);
  EXPECT_EQ((*nodes)[1].heartbeat_ms, 2'000'000);
}

TEST_F(SqliteStoreTest, DamagedRecordsReadBackAsCorruptionNamingTheRow) {
  auto store = Open(url());
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  ASSERT_OK(store->PutPlan("ds", MakePlan("p")));
  ASSERT_OK(store->PutProgress("ds", "node-1", {}));
  ASSERT_OK(store->Heartbeat(MakeNode("node-1"), std::chrono::seconds(600)));
  sqlite3* raw = RawOpen();
  struct Row {
    const char* select;
    const char* update;  // ?1 the record, then the key columns
    std::vector<std::string> key;
    std::string shown;  // how the message names it
  };
  auto row_of = [](testing::StoredRecord record) -> Row {
    switch (record) {
      case testing::StoredRecord::kDataset:
        return {"SELECT record FROM datasets WHERE name = ?",
                "UPDATE datasets SET record = ?1 WHERE name = ?2",
                {"ds"},
                "dataset 'ds' (row of table datasets)"};
      case testing::StoredRecord::kNode:
        return {"SELECT record FROM nodes WHERE id = ?",
                "UPDATE nodes SET record = ?1 WHERE id = ?2",
                {"node-1"},
                "node 'node-1' (row of table nodes)"};
      case testing::StoredRecord::kProgress:
        return {"SELECT record FROM progress WHERE dataset = ? AND node = ?",
                "UPDATE progress SET record = ?1 WHERE dataset = ?2 AND node = ?3",
                {"ds", "node-1"},
                "(row 'ds', 'node-1' of table progress)"};
      case testing::StoredRecord::kPlan:
        return {"SELECT record FROM plans WHERE dataset = ? AND plan_id = ?",
                "UPDATE plans SET record = ?1 WHERE dataset = ?2 AND plan_id = ?3",
                {"ds", "p"},
                "(row 'ds', 'p' of table plans)"};
    }
    return {};
  };
  auto reads = [&](testing::StoredRecord record) -> std::vector<Status> {
    switch (record) {
      case testing::StoredRecord::kDataset:
        return {store->GetDataset("ds").status(), store->ListDatasets().status()};
      case testing::StoredRecord::kNode:
        return {store->ListNodes("").status(), store->ListNodes("default").status()};
      case testing::StoredRecord::kProgress:
        return {store->ListProgress("ds").status()};
      case testing::StoredRecord::kPlan:
        return {store->ListPlans("ds").status()};
    }
    return {};
  };

  for (const auto& c : testing::RecordCorruptions()) {
    SCOPED_TRACE(c.from + " -> " + c.to);
    const Row row = row_of(c.record);
    const std::string good = RawQuery(raw, row.select, row.key);
    std::string bad = good;
    const size_t at = bad.find(c.from);
    ASSERT_NE(at, std::string::npos) << good;
    bad.replace(at, c.from.size(), c.to);
    std::vector<std::string> params = {bad};
    params.insert(params.end(), row.key.begin(), row.key.end());
    RawQuery(raw, row.update, params);
    for (const Status& s : reads(c.record)) {
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
      EXPECT_THAT(s.message(), HasSubstr(row.shown));
      EXPECT_THAT(s.message(), HasSubstr(path()));
      EXPECT_THAT(s.message(), HasSubstr(c.problem));
      EXPECT_THAT(s.message(), HasSubstr("rewrite or delete it"));
    }
    params[0] = good;
    RawQuery(raw, row.update, params);
    for (const Status& s : reads(c.record)) EXPECT_OK(s);
  }

  // A record written before spec.snapshot_by existed reads as a client
  // snapshot, and a client-snapshotted record is written without the key.
  {
    const char* select = "SELECT record FROM datasets WHERE name = ?";
    const char* update = "UPDATE datasets SET record = ?1, revision = 1 WHERE name = ?2";
    const std::string good = RawQuery(raw, select, {"ds"});
    std::string old = good;
    const std::string key = R"("snapshot_by":"pool",)";
    const size_t at = old.find(key);
    ASSERT_NE(at, std::string::npos) << good;
    old.erase(at, key.size());
    RawQuery(raw, update, {old, "ds"});
    auto read = store->GetDataset("ds");
    ASSERT_OK(read);
    EXPECT_EQ(read->spec.snapshot_by, SnapshotBy::kClient);
    ASSERT_OK(store->UpdateDataset(*read));
    EXPECT_EQ(RawQuery(raw, select, {"ds"}).find("snapshot_by"), std::string::npos);
    RawQuery(raw, update, {good, "ds"});
  }

  // The columns beside the JSON are checked too.
  RawExec(raw, "UPDATE datasets SET revision = 0 WHERE name = 'ds'");
  auto got = store->GetDataset("ds");
  EXPECT_EQ(got.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(got.status().message(), HasSubstr("revision is 0"));
  RawExec(raw, "UPDATE datasets SET revision = 1 WHERE name = 'ds'");
  RawExec(raw, "UPDATE nodes SET pool = 'other' WHERE id = 'node-1'");
  auto nodes = store->ListNodes("");
  EXPECT_EQ(nodes.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(nodes.status().message(), HasSubstr("the pool column 'other'"));
  RawExec(raw, "UPDATE nodes SET pool = 'default' WHERE id = 'node-1'");
  RawExec(raw, "UPDATE progress SET node = 'bad id' WHERE node = 'node-1'");
  auto progress = store->ListProgress("ds");
  EXPECT_EQ(progress.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(progress.status().message(), HasSubstr("node id 'bad id'"));
  sqlite3_close(raw);
}

TEST_F(SqliteStoreTest, WatcherThatFallsBehindPruningGetsResyncFirst) {
  MetadataStoreOptions options;
  options.sqlite_event_rows = 5;
  options.poll_interval = milliseconds(5);
  auto store = Open(url(), options);
  ASSERT_NE(store, nullptr);

  auto keeping_up = store->Watch();
  auto behind = store->Watch();
  ASSERT_OK(keeping_up);
  ASSERT_OK(behind);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(store->CreateDataset(MakeDataset("d" + std::to_string(i))));
    auto batch = (*keeping_up)->Next(milliseconds(2000));
    ASSERT_OK(batch);
    ASSERT_EQ(batch->size(), 1u);
    EXPECT_EQ((*batch)[0], (Event{EventKind::kDataset, "d" + std::to_string(i)}));
  }

  auto batch = (*behind)->Next(milliseconds(2000));
  ASSERT_OK(batch);
  ASSERT_FALSE(batch->empty());
  EXPECT_EQ((*batch)[0], (Event{EventKind::kResync, ""}));
  EXPECT_EQ(batch->back(), (Event{EventKind::kDataset, "d19"}));
  EXPECT_LE(batch->size(), 1u + 5u);
  auto quiet = (*behind)->Next(milliseconds(20));
  ASSERT_OK(quiet);
  EXPECT_TRUE(quiet->empty()) << "resync is delivered once per gap";

  // A watcher made now starts after the pruned range: nothing to resync.
  auto fresh = store->Watch();
  ASSERT_OK(fresh);
  auto none = (*fresh)->Next(milliseconds(20));
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace granary

// SQLite-only behaviour of the metadata store: two processes on one file, a
// file locked by someone else, files that are corrupt, foreign or newer,
// expiry by the injected clock, and watchers that fall behind pruning.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/clock.h"
#include "granary/core/metadata_store.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;

DatasetRecord MakeDataset(const std::string& name) {
  DatasetRecord r;
  r.name = name;
  r.spec.source_uri = "file:///data/" + name;
  return r;
}

NodeRecord MakeNode(const std::string& id) {
  NodeRecord n;
  n.id = id;
  n.pool = "default";
  n.address = "10.0.0.1:7070";
  return n;
}

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
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(ChildWritesAndWaitsForParent(url()));

  auto store = Open(url());
  ASSERT_NE(store, nullptr);
  for (int i = 0; i < 10; ++i) {
    ASSERT_OK(store->CreateDataset(MakeDataset("parent-" + std::to_string(i))));
  }
  EXPECT_TRUE(
      testing::WaitFor([&] { return HasDataset(*store, "child-9"); }, std::chrono::seconds(20)));
  int wstatus = 0;
  bool exited = testing::WaitFor([&] { return ::waitpid(child, &wstatus, WNOHANG) == child; },
                                 std::chrono::seconds(25));
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &wstatus, 0);
  }
  ASSERT_TRUE(exited) << "child did not finish";
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "child exit codes: 2 open, 3 create, 4 heartbeat, "
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

  sqlite3* other = RawOpen();
  RawExec(other, "BEGIN EXCLUSIVE");
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

  RawExec(other, "COMMIT");
  ASSERT_OK(store->CreateDataset(MakeDataset("blocked")));
  sqlite3_close(other);
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

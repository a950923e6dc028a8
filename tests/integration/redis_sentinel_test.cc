// The Redis store under Redis Sentinel (redis+sentinel:// URLs,
// docs/metadata-store.md, "Failover"): a real primary, a replica and three
// sentinels on loopback (testing/redis_sentinel.h). The store finds the
// primary through the sentinels, follows it through a failover (the primary
// killed) with every acknowledged and replicated record kept, its watcher
// resyncs, and a demoted primary that comes back is not written to. Bad
// URLs, a wrong master name, sentinels that do not answer and sentinel
// passwords each give an error naming what to fix.

#include "testing/redis_sentinel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/store/open_store.h"
#include "testing/store_records.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using testing::MakeDataset;
using testing::MakeNode;
using ::testing::Not;
using testing::RedisSentinelOptions;
using testing::RedisSentinelSet;

class RedisSentinelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto set = RedisSentinelSet::Start();
    if (!set.ok()) {
      setup_error_ = new std::string(set.status().ToString());
      return;
    }
    set_ = set->release();
  }
  static void TearDownTestSuite() {
    delete set_;
    set_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(setup_error_, nullptr) << *setup_error_; }

  // A store through the sentinels, with a retry budget that outlasts a
  // failover, under a prefix of this test's own.
  std::unique_ptr<MetadataStore> Open(const std::string& prefix) {
    auto store = OpenMetadataStore(set_->url("?retry_ms=30000&prefix=" + prefix));
    EXPECT_OK(store);
    return store.ok() ? std::move(*store) : nullptr;
  }

  static RedisSentinelSet* set_;
  static std::string* setup_error_;
};

RedisSentinelSet* RedisSentinelTest::set_ = nullptr;
std::string* RedisSentinelTest::setup_error_ = nullptr;

TEST_F(RedisSentinelTest, TheStoreFollowsTheNewPrimaryAfterAFailover) {
  auto store = Open("failover");
  ASSERT_NE(store, nullptr);
  auto watcher = store->Watch();
  ASSERT_OK(watcher);
  for (int i = 0; i < 20; ++i) {
    ASSERT_OK(store->CreateDataset(MakeDataset("before-" + std::to_string(i))));
  }
  ASSERT_OK(store->Heartbeat(MakeNode("gpu-1", "gpu-a"), seconds(60)));
  ASSERT_OK(set_->WaitReplicated());
  auto old_primary = set_->PrimaryPort();
  ASSERT_OK(old_primary);
  auto version_before = store->NodesVersion();
  ASSERT_OK(version_before);

  auto new_primary = set_->KillPrimaryAndWaitForFailover();
  ASSERT_OK(new_primary);
  EXPECT_NE(*new_primary, *old_primary);

  // The membership version moved, though no node changed: a failover may
  // have lost increments, so readers list their nodes again.
  auto version_after = store->NodesVersion();
  ASSERT_OK(version_after);
  EXPECT_NE(*version_after, *version_before);
  // Every replicated record is there, and writes go to the new primary.
  auto listed = store->ListDatasets();
  ASSERT_OK(listed);
  EXPECT_EQ(listed->size(), 20u);
  DatasetRecord d = *store->GetDataset("before-3");
  d.state.message = "after the failover";
  ASSERT_OK(store->UpdateDataset(d));
  ASSERT_OK(store->CreateDataset(MakeDataset("after")));
  ASSERT_OK(store->Heartbeat(MakeNode("gpu-1", "gpu-a"), seconds(60)));
  auto nodes = store->ListNodes("gpu-a");
  ASSERT_OK(nodes);
  EXPECT_EQ(nodes->size(), 1u);

  // The watcher lost its connection: a resync first, then events again.
  bool resync = false;
  bool saw_after = false;
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  while (!(resync && saw_after) && std::chrono::steady_clock::now() < deadline) {
    auto batch = (*watcher)->Next(milliseconds(500));
    if (!batch.ok()) continue;  // within the budget while the failover settles
    for (const Event& e : *batch) {
      resync |= e.kind == EventKind::kResync;
      if (resync && e.kind == EventKind::kDataset && e.name == "late") saw_after = true;
    }
    if (resync && !saw_after) ASSERT_OK(store->CreateDataset(MakeDataset("late")));
  }
  EXPECT_TRUE(resync) << "the watcher was not told to resync";
  EXPECT_TRUE(saw_after) << "no event from the new primary";

  // The old primary comes back, as a replica of the new one: the store does
  // not write to it (a new connection asks the sentinels, and ROLE).
  testing::RedisServer* old = set_->ServerOnPort(*old_primary);
  ASSERT_NE(old, nullptr);
  ASSERT_OK(old->Restart());
  auto reopened = Open("failover");
  ASSERT_NE(reopened, nullptr);
  ASSERT_OK(reopened->CreateDataset(MakeDataset("after-return")));
  auto primary_now = set_->PrimaryPort();
  ASSERT_OK(primary_now);
  EXPECT_EQ(*primary_now, *new_primary);
}

TEST_F(RedisSentinelTest, BadSentinelUrlsSayWhatToFix) {
  const std::vector<uint16_t> ports = set_->sentinel_ports();
  const std::string one = "127.0.0.1:" + std::to_string(ports[0]);
  struct Case {
    std::string url;
    StatusCode code;
    std::string says;
  } cases[] = {
      {"redis+sentinel://" + one, StatusCode::kInvalidArgument, "the master name"},
      {"redis+sentinel://" + one + "/", StatusCode::kInvalidArgument, "the master name"},
      {"redis+sentinel://" + one + "/bad name", StatusCode::kInvalidArgument, "the master name"},
      {"redis+sentinel://" + one + ",/granary", StatusCode::kInvalidArgument,
       "the host is missing"},
      {"redis+sentinel://" + one + ",127.0.0.1:0/granary", StatusCode::kInvalidArgument,
       "is not a number from 1 to 65535"},
      {"redis+sentinel://" + one + "/granary/x", StatusCode::kInvalidArgument,
       "is not a database number"},
      {"redis+sentinel://" + one + "/granary?sentinel_password_file=relative",
       StatusCode::kInvalidArgument, "is not an absolute path"},
      {"redis+sentinel://" + one + "/granary?sentinel_password_file=/no/such/file",
       StatusCode::kNotFound, "sentinel_password_file"},
      {"redis+sentinel://" + one + "/granary?colour=red", StatusCode::kInvalidArgument,
       "unknown query parameter 'colour' for redis+sentinel"},
      {"redis://127.0.0.1:1/0?sentinel_password_file=/x", StatusCode::kInvalidArgument,
       "unknown query parameter 'sentinel_password_file' for redis"},
      // Sentinels that know no such master: a wrong name, not worth a retry.
      {"redis+sentinel://" + one + "/nosuchmaster?retry_ms=200", StatusCode::kInvalidArgument,
       "no sentinel knows a master named 'nosuchmaster'"},
  };
  for (const Case& c : cases) {
    auto store = OpenMetadataStore(c.url);
    ASSERT_FALSE(store.ok()) << c.url;
    EXPECT_EQ(store.status().code(), c.code) << c.url << ": " << store.status().ToString();
    EXPECT_THAT(store.status().message(), HasSubstr(c.says)) << c.url;
  }
  // No sentinel answers: each is named, and it is worth retrying.
  const std::string dead = "127.0.0.1:" + std::to_string(testing::FreeTcpPort());
  auto store = OpenMetadataStore("redis+sentinel://" + dead + ",127.0.0.1:1/granary");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().ToString();
  EXPECT_THAT(store.status().message(), HasSubstr("no sentinel told the primary"));
  EXPECT_THAT(store.status().message(), HasSubstr("sentinel " + dead));
  EXPECT_THAT(store.status().message(), HasSubstr("sentinel 127.0.0.1:1"));
  // A data server given as a sentinel says so.
  auto primary = set_->PrimaryPort();
  ASSERT_OK(primary);
  store = OpenMetadataStore("redis+sentinel://127.0.0.1:" + std::to_string(*primary) +
                            "/granary?retry_ms=200");
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr("is it a sentinel?"));
  // One dead sentinel before a live one: the live one answers.
  auto live = OpenMetadataStore("redis+sentinel://" + dead + "," + one + "/granary");
  ASSERT_OK(live);
  EXPECT_OK((*live)->ListDatasets().status());
}

// Sentinels and data servers with passwords: the data servers' from the
// URL's user info, the sentinels' from a file (never in the URL), and each
// missing or wrong one is named.
TEST(RedisSentinelAuthTest, PasswordsForTheSentinelsAndTheServers) {
  RedisSentinelOptions o;
  o.replicas = 1;
  o.sentinels = 3;
  o.password = "data-secret";
  o.sentinel_password = "sentinel-secret";
  auto set = RedisSentinelSet::Start(o);
  ASSERT_OK(set);
  testing::TempDir dir;
  dir.WriteFile("sentinel.pass", "sentinel-secret\n");
  ASSERT_EQ(::chmod(dir.Join("sentinel.pass").c_str(), 0600), 0);
  dir.WriteFile("wrong.pass", "nope\n");
  dir.WriteFile("empty.pass", "");

  auto store =
      OpenMetadataStore((*set)->url("?sentinel_password_file=" + dir.Join("sentinel.pass")));
  ASSERT_OK(store);
  ASSERT_OK((*store)->CreateDataset(MakeDataset("with-passwords")));
  EXPECT_THAT((*store)->url(), Not(HasSubstr("data-secret")));

  auto no_file = OpenMetadataStore((*set)->url("?retry_ms=200"));
  ASSERT_FALSE(no_file.ok());
  EXPECT_EQ(no_file.status().code(), StatusCode::kPermissionDenied) << no_file.status().ToString();
  EXPECT_THAT(no_file.status().message(), HasSubstr("give sentinel_password_file"));
  auto wrong = OpenMetadataStore((*set)->url("?sentinel_password_file=" + dir.Join("wrong.pass")));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_THAT(wrong.status().message(), HasSubstr("refused AUTH"));
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr("nope")));
  auto empty = OpenMetadataStore((*set)->url("?sentinel_password_file=" + dir.Join("empty.pass")));
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("is empty"));
  // The data servers' password missing from the URL.
  std::string without =
      (*set)->url("?retry_ms=200&sentinel_password_file=" + dir.Join("sentinel.pass"));
  without.replace(without.find(":data-secret@"), std::string(":data-secret@").size(), "");
  auto no_data_password = OpenMetadataStore(without);
  ASSERT_FALSE(no_data_password.ok());
  EXPECT_EQ(no_data_password.status().code(), StatusCode::kPermissionDenied)
      << no_data_password.status().ToString();
}

}  // namespace
}  // namespace granary

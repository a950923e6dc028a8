// Redis-only behaviour of the metadata store: an unreachable server, a server
// that crashes and restarts under a writer, authentication, databases, and the
// key schema documented in docs/metadata-store.md. Each test starts its own
// redis-server through the RedisServer fixture.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/metadata_store.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

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

PlanRecord MakePlan(const std::string& id) {
  PlanRecord p;
  p.plan_id = id;
  return p;
}

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start();
    ASSERT_OK(server);
    server_ = std::move(*server);
  }

  std::unique_ptr<MetadataStore> Open(const std::string& url, MetadataStoreOptions options = {}) {
    auto store = OpenMetadataStore(url, options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }

  std::unique_ptr<testing::RedisServer> server_;
};

// A raw hiredis connection for looking at keys behind the store's back.
struct RawRedis {
  explicit RawRedis(uint16_t port) : c(redisConnect("127.0.0.1", port)) {}
  ~RawRedis() { redisFree(c); }
  RawRedis(const RawRedis&) = delete;
  RawRedis& operator=(const RawRedis&) = delete;

  // The reply as text: strings and statuses as they are, integers in decimal,
  // nil as "(nil)", errors as "ERR: ...".
  std::string Run(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) return std::string("IO: ") + c->errstr;
    std::string out;
    switch (r->type) {
      case REDIS_REPLY_INTEGER:
        out = std::to_string(r->integer);
        break;
      case REDIS_REPLY_NIL:
        out = "(nil)";
        break;
      case REDIS_REPLY_ERROR:
        out = "ERR: " + std::string(r->str, r->len);
        break;
      case REDIS_REPLY_ARRAY:
        out = "array of " + std::to_string(r->elements);
        break;
      default:
        out = std::string(r->str, r->len);
    }
    freeReplyObject(r);
    return out;
  }

  redisContext* c;
};

TEST(RedisStoreOpenTest, NothingListeningIsQuickUnavailableNamingTheUrl) {
  const uint16_t port = testing::FreeTcpPort();
  const std::string url = "redis://127.0.0.1:" + std::to_string(port) + "/0";
  const auto start = steady_clock::now();
  auto store = OpenMetadataStore(url);
  const auto elapsed = steady_clock::now() - start;
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr("connect to " + url));
  EXPECT_THAT(store.status().message(), HasSubstr("Connection refused"));
  EXPECT_THAT(store.status().message(), HasSubstr("is redis-server running"));
  // Open does not spend the retry budget (5 s by default): it fails fast.
  EXPECT_LT(elapsed, std::chrono::seconds(2));
}

TEST_F(RedisStoreTest, AcknowledgedWritesSurviveACrashAndWritesResumeAfterRestart) {
  MetadataStoreOptions options;
  options.retry_budget = std::chrono::seconds(15);  // outlasts the outage below
  auto store = Open(server_->url(), options);
  ASSERT_NE(store, nullptr);
  std::vector<std::string> acknowledged;
  auto write = [&](const std::string& name) {
    auto r = store->CreateDataset(MakeDataset(name));
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    if (r.ok()) acknowledged.push_back(name);
    ASSERT_OK(store->PutProgress(name, "node-1", StagingProgress{1, 1, 1, 1, 0, 0}));
  };
  for (int i = 0; i < 5; ++i) write("before-" + std::to_string(i));

  // A crash: only what Redis fsynced before replying survives.
  ASSERT_OK(server_->Kill());
  // These block in reconnect-with-backoff until the server is back. They run
  // on their own thread because the fixture must (re)start the server from
  // this one, which outlives it.
  std::thread writer([&] {
    for (int i = 0; i < 5; ++i) write("during-" + std::to_string(i));
  });
  // The outage the writer has to ride out; not an assertion.
  std::this_thread::sleep_for(milliseconds(300));
  Status restarted = server_->Restart();
  writer.join();
  ASSERT_OK(restarted);
  for (int i = 0; i < 5; ++i) write("after-" + std::to_string(i));
  EXPECT_EQ(acknowledged.size(), 15u);

  // Read back through a fresh connection, after one more crash and restart.
  ASSERT_OK(server_->Kill());
  ASSERT_OK(server_->Restart());
  auto reader = Open(server_->url());
  ASSERT_NE(reader, nullptr);
  for (const std::string& name : acknowledged) {
    EXPECT_OK(reader->GetDataset(name));
    auto progress = reader->ListProgress(name);
    ASSERT_OK(progress);
    EXPECT_EQ(progress->size(), 1u) << name;
  }
  EXPECT_EQ(reader->ListDatasets()->size(), acknowledged.size());
}

TEST_F(RedisStoreTest, WritesWhileTheServerStaysDownFailAfterTheBudgetThenRecover) {
  MetadataStoreOptions options;
  options.retry_budget = milliseconds(500);
  auto store = Open(server_->url(), options);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(server_->Stop());

  const auto start = steady_clock::now();
  auto r = store->CreateDataset(MakeDataset("lost"));
  const auto elapsed = steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("create dataset 'lost' on " + server_->url()));
  EXPECT_THAT(r.status().message(), HasSubstr("retry budget of 500 ms"));
  EXPECT_GE(elapsed, milliseconds(500));        // it kept retrying for the budget...
  EXPECT_LT(elapsed, std::chrono::seconds(5));  // ...and no longer
  EXPECT_EQ(store->ListNodes("").status().code(), StatusCode::kUnavailable);

  ASSERT_OK(server_->Restart());
  ASSERT_OK(store->CreateDataset(MakeDataset("lost")));
}

TEST_F(RedisStoreTest, WatcherReportsTheOutageThenResyncs) {
  auto store = Open(server_->url());
  ASSERT_NE(store, nullptr);
  auto watcher = store->Watch();
  ASSERT_OK(watcher);

  ASSERT_OK(server_->Kill());
  auto down = (*watcher)->Next(milliseconds(200));
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(down.status().message(), HasSubstr(server_->url()));

  ASSERT_OK(server_->Restart());
  std::vector<Event> got;
  for (int i = 0; i < 20 && got.empty(); ++i) {
    auto batch = (*watcher)->Next(milliseconds(250));
    if (batch.ok()) got = *batch;
  }
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.front(), (Event{EventKind::kResync, ""}));

  // And it is subscribed again.
  ASSERT_OK(store->CreateDataset(MakeDataset("after")));
  auto next = (*watcher)->Next(milliseconds(5000));
  ASSERT_OK(next);
  ASSERT_FALSE(next->empty());
  EXPECT_EQ(next->front(), (Event{EventKind::kDataset, "after"}));
}

TEST_F(RedisStoreTest, DatabasesAndPrefixesAreSeparateNamespaces) {
  auto db0 = Open(server_->url(0));
  auto db1 = Open(server_->url(1));
  auto other = Open(server_->url(0, "?prefix=other"));
  ASSERT_NE(db0, nullptr);
  ASSERT_NE(db1, nullptr);
  ASSERT_NE(other, nullptr);
  ASSERT_OK(db1->CreateDataset(MakeDataset("only-in-db1")));
  ASSERT_OK(other->CreateDataset(MakeDataset("only-in-other")));
  EXPECT_TRUE(db0->ListDatasets()->empty());
  EXPECT_EQ(db1->ListDatasets()->size(), 1u);
  EXPECT_EQ(other->ListDatasets()->size(), 1u);

  auto no_such_db = OpenMetadataStore(server_->url(99));
  EXPECT_EQ(no_such_db.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(no_such_db.status().message(), HasSubstr("databases"));
}

TEST(RedisStoreAuthTest, PasswordAuthenticatesAndIsNeverShown) {
  auto server = testing::RedisServer::Start({"--requirepass", "s3cret"});
  ASSERT_OK(server);
  const std::string host = "127.0.0.1:" + std::to_string((*server)->port());

  auto store = OpenMetadataStore("redis://:s3cret@" + host + "/0");
  ASSERT_OK(store);
  EXPECT_EQ((*store)->url(), "redis://:***@" + host + "/0");
  ASSERT_OK((*store)->CreateDataset(MakeDataset("secret-data")));

  auto wrong = OpenMetadataStore("redis://:wrong@" + host + "/0");
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("password"));
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr(":wrong@")));

  auto none = OpenMetadataStore("redis://" + host + "/0");
  EXPECT_EQ(none.status().code(), StatusCode::kPermissionDenied);
}

TEST_F(RedisStoreTest, KeysFollowTheDocumentedSchema) {
  auto store = Open(server_->url(0, "?prefix=doc"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  ASSERT_OK(store->PutProgress("ds", "node-1", {}));
  ASSERT_OK(store->PutPlan("ds", MakePlan("p")));
  ASSERT_OK(store->PutManifest("aa", "blob"));
  ASSERT_OK(store->Heartbeat(MakeNode("node-1"), milliseconds(60'000)));

  RawRedis raw(server_->port());
  ASSERT_NE(raw.c, nullptr);
  ASSERT_EQ(raw.c->err, 0) << raw.c->errstr;
  EXPECT_EQ(raw.Run({"TYPE", "doc:datasets"}), "set");
  EXPECT_EQ(raw.Run({"SISMEMBER", "doc:datasets", "ds"}), "1");
  EXPECT_EQ(raw.Run({"TYPE", "doc:dataset:ds"}), "hash");
  EXPECT_EQ(raw.Run({"HGET", "doc:dataset:ds", "revision"}), "1");
  EXPECT_EQ(raw.Run({"HEXISTS", "doc:dataset:ds", "created_ms"}), "1");
  EXPECT_THAT(raw.Run({"HGET", "doc:dataset:ds", "record"}), HasSubstr("\"source_uri\""));
  EXPECT_EQ(raw.Run({"TYPE", "doc:progress:ds"}), "hash");
  EXPECT_THAT(raw.Run({"HGET", "doc:progress:ds", "node-1"}), HasSubstr("\"chunks_staged\""));
  EXPECT_EQ(raw.Run({"TYPE", "doc:plans:ds"}), "hash");
  EXPECT_THAT(raw.Run({"HGET", "doc:plans:ds", "p"}), HasSubstr("\"seed\""));
  EXPECT_EQ(raw.Run({"GET", "doc:manifest:aa"}), "blob");
  EXPECT_EQ(raw.Run({"TYPE", "doc:nodes"}), "set");
  EXPECT_EQ(raw.Run({"TYPE", "doc:node:node-1"}), "hash");
  EXPECT_THAT(raw.Run({"HGET", "doc:node:node-1", "record"}), HasSubstr("\"address\""));
  EXPECT_NE(raw.Run({"HGET", "doc:node:node-1", "identity"}), "(nil)");
  const int64_t pttl = std::stoll(raw.Run({"PTTL", "doc:node:node-1"}));
  EXPECT_GT(pttl, 0);
  EXPECT_LE(pttl, 60'000);
  EXPECT_EQ(raw.Run({"DBSIZE"}), "7");  // the keys above and nothing else

  // Events go to doc:events as {"kind":..,"name":..}.
  RawRedis sub(server_->port());
  EXPECT_EQ(sub.Run({"SUBSCRIBE", "doc:events"}), "array of 3");
  ASSERT_OK(store->DeleteDataset("ds"));
  void* reply = nullptr;
  ASSERT_EQ(redisGetReply(sub.c, &reply), REDIS_OK);
  auto* message = static_cast<redisReply*>(reply);
  ASSERT_EQ(message->elements, 3u);
  EXPECT_EQ(std::string(message->element[2]->str, message->element[2]->len),
            R"({"kind":"dataset","name":"ds"})");
  freeReplyObject(message);

  // The delete took the dataset's hashes with it; the manifest stays.
  EXPECT_EQ(raw.Run({"EXISTS", "doc:dataset:ds", "doc:progress:ds", "doc:plans:ds"}), "0");
  EXPECT_EQ(raw.Run({"SISMEMBER", "doc:datasets", "ds"}), "0");
  EXPECT_EQ(raw.Run({"EXISTS", "doc:manifest:aa"}), "1");

  // An expired node leaves the index the next time nodes are listed.
  ASSERT_OK(store->Heartbeat(MakeNode("short"), milliseconds(50)));
  EXPECT_EQ(raw.Run({"SISMEMBER", "doc:nodes", "short"}), "1");
  EXPECT_TRUE(testing::WaitFor([&] { return raw.Run({"EXISTS", "doc:node:short"}) == "0"; }));
  ASSERT_OK(store->ListNodes(""));
  EXPECT_EQ(raw.Run({"SISMEMBER", "doc:nodes", "short"}), "0");
}

}  // namespace
}  // namespace granary

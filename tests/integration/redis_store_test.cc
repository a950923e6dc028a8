// Redis-only behaviour of the metadata store: an unreachable server, a server
// that crashes and restarts under a writer, authentication, databases, the key
// schema documented in docs/metadata-store.md, and records damaged behind the
// store's back. Each test starts its own redis-server through the RedisServer
// fixture (whose own guarantees are tested at the end).

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/store/open_store.h"
#include "testing/child_process.h"
#include "testing/redis_server.h"
#include "testing/store_records.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::MakeDataset;
using testing::MakeNode;
using testing::MakePlan;

// A TCP socket this test holds on 127.0.0.1, to decide what a client finds at a
// port: bound without listening, every connection is refused and no other
// process can bind the port; listening (and never accepting), connections
// complete and then wait, unanswered, in its backlog.
class PortHolder {
 public:
  // `port` 0: any free port.
  static Result<std::unique_ptr<PortHolder>> Bind(uint16_t port, bool listen) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno(errno, "socket");
    std::unique_ptr<PortHolder> holder(new PortHolder(fd));
    // Only the listener reuses the address: it takes over a port a killed
    // server left in TIME_WAIT. The non-listening holder must keep everyone
    // (SO_REUSEADDR included) off its port.
    const int one = 1;
    if (listen && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
      return Status::FromErrno(errno, "setsockopt SO_REUSEADDR");
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return Status::FromErrno(errno, "bind 127.0.0.1:" + std::to_string(port));
    }
    if (listen && ::listen(fd, 16) != 0) return Status::FromErrno(errno, "listen");
    socklen_t len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return Status::FromErrno(errno, "getsockname");
    }
    holder->port_ = ntohs(addr.sin_port);
    return holder;
  }
  ~PortHolder() { ::close(fd_); }
  PortHolder(const PortHolder&) = delete;
  PortHolder& operator=(const PortHolder&) = delete;

  uint16_t port() const { return port_; }
  // A listening holder has a connection waiting in its backlog.
  bool HasPendingConnection() const {
    pollfd pfd{fd_, POLLIN, 0};
    return ::poll(&pfd, 1, 0) == 1;
  }

 private:
  explicit PortHolder(int fd) : fd_(fd) {}
  int fd_;
  uint16_t port_ = 0;
};

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
  // Every connect, read and write is bounded, so a test never hangs on Redis.
  explicit RawRedis(uint16_t port) : c(redisConnectWithTimeout("127.0.0.1", port, kTimeout)) {
    if (c != nullptr && c->err == 0) redisSetTimeout(c, kTimeout);
  }
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

  static constexpr timeval kTimeout = {10, 0};
  redisContext* c;
};

TEST(RedisStoreOpenTest, NothingListeningIsUnavailableAtOnceNamingTheUrl) {
  // A port this test holds without listening: connections are refused, and no
  // other process can start a server there meanwhile.
  auto refusing = PortHolder::Bind(0, /*listen=*/false);
  ASSERT_OK(refusing);
  const std::string url = "redis://127.0.0.1:" + std::to_string((*refusing)->port()) + "/0";
  MetadataStoreOptions options;
  options.retry_budget = std::chrono::seconds(120);
  const auto start = steady_clock::now();
  auto store = OpenMetadataStore(url, options);
  const auto elapsed = steady_clock::now() - start;
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr("connect to " + url));
  EXPECT_THAT(store.status().message(), HasSubstr("Connection refused"));
  EXPECT_THAT(store.status().message(), HasSubstr("is redis-server running"));
  // Open tries once: it does not spend the retry budget. (Not a speed limit:
  // the bound is far below the budget and far above a refused connect.)
  EXPECT_LT(elapsed, std::chrono::seconds(60));
}

TEST_F(RedisStoreTest, AcknowledgedWritesSurviveACrashAndWritesResumeAfterRestart) {
  MetadataStoreOptions options;
  options.retry_budget = std::chrono::seconds(60);  // outlasts the outage below
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
  // Until the restart, a listener that never answers holds the port, so the
  // test can see the writer reconnecting instead of sleeping and hoping.
  auto stand_in = PortHolder::Bind(server_->port(), /*listen=*/true);
  ASSERT_OK(stand_in);
  // These block in reconnect-with-backoff until the server is back. They run
  // on their own thread because the fixture must (re)start the server from
  // this one, which outlives it.
  std::thread writer([&] {
    for (int i = 0; i < 5; ++i) write("during-" + std::to_string(i));
  });
  // The writer lost its connection and is reconnecting: it rides the outage.
  const bool reconnecting = testing::WaitFor([&] { return (*stand_in)->HasPendingConnection(); },
                                             std::chrono::seconds(30));
  stand_in->reset();  // resets the waiting connection: the writer retries
  Status restarted = server_->Restart();
  writer.join();
  EXPECT_TRUE(reconnecting) << "the writer never tried to reconnect during the outage";
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
  EXPECT_GE(elapsed, milliseconds(500));  // it kept retrying for the budget...
  // ...and then gave up (a generous bound: a loaded machine is slow, but not
  // a minute slow).
  EXPECT_LT(elapsed, std::chrono::seconds(60));
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
  EXPECT_TRUE(testing::WaitFor([&] {
    auto batch = (*watcher)->Next(milliseconds(250));
    if (batch.ok()) got = *batch;
    return !got.empty();
  }));
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.front(), (Event{EventKind::kResync, ""}));

  // And it is subscribed again.
  ASSERT_OK(store->CreateDataset(MakeDataset("after")));
  auto next = (*watcher)->Next(std::chrono::seconds(30));
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
  // Unencoded '/', '?', '#', '@' and ':' in the password: the user info runs to
  // the last '@' of the URL.
  const std::string password = "s3/c?r#e@t:x";
  auto server = testing::RedisServer::Start({"--requirepass", password});
  ASSERT_OK(server);
  const std::string host = "127.0.0.1:" + std::to_string((*server)->port());

  auto store = OpenMetadataStore("redis://:" + password + "@" + host + "/0");
  ASSERT_OK(store);
  EXPECT_EQ((*store)->url(), "redis://:***@" + host + "/0");
  ASSERT_OK((*store)->CreateDataset(MakeDataset("secret-data")));
  // Percent-encoded, it is the same password.
  auto encoded = OpenMetadataStore("redis://:s3%2Fc%3Fr%23e%40t%3Ax@" + host + "/0");
  ASSERT_OK(encoded);
  EXPECT_OK((*encoded)->GetDataset("secret-data"));

  auto wrong = OpenMetadataStore("redis://:wr/o#ng@" + host + "/0");
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("password"));
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr("wr/o#ng")));
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr("o#ng")));

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
  // Membership: the expiry set (score: when the node expires, ms) and the
  // version counter, bumped by the join.
  EXPECT_EQ(raw.Run({"TYPE", "doc:nodes-expiry"}), "zset");
  EXPECT_NE(raw.Run({"ZSCORE", "doc:nodes-expiry", "node-1"}), "(nil)");
  EXPECT_EQ(raw.Run({"GET", "doc:nodes-version"}), "1");
  EXPECT_EQ(raw.Run({"DBSIZE"}), "9");  // the keys above and nothing else

  // Events go to doc:events as {"kind":..,"name":..}. RawRedis bounds every
  // read, so a missing message fails here instead of hanging.
  RawRedis sub(server_->port());
  ASSERT_NE(sub.c, nullptr);
  ASSERT_EQ(sub.c->err, 0) << sub.c->errstr;
  EXPECT_EQ(sub.Run({"SUBSCRIBE", "doc:events"}), "array of 3");
  ASSERT_OK(store->DeleteDataset("ds"));
  void* reply = nullptr;
  ASSERT_EQ(redisGetReply(sub.c, &reply), REDIS_OK) << sub.c->errstr;
  auto* message = static_cast<redisReply*>(reply);
  ASSERT_EQ(message->type, REDIS_REPLY_ARRAY);
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

TEST_F(RedisStoreTest, DamagedRecordsReadBackAsCorruptionNamingTheKey) {
  auto store = Open(server_->url(0, "?prefix=bad"));
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateDataset(MakeDataset("ds")));
  ASSERT_OK(store->PutPlan("ds", MakePlan("p")));
  ASSERT_OK(store->PutProgress("ds", "node-1", {}));
  ASSERT_OK(store->Heartbeat(MakeNode("node-1"), std::chrono::seconds(600)));
  RawRedis raw(server_->port());
  ASSERT_NE(raw.c, nullptr);
  ASSERT_EQ(raw.c->err, 0) << raw.c->errstr;

  using testing::StoredRecord;
  struct Where {
    std::string key;
    std::string field;
    std::string shown;  // how the message names it
  };
  auto where_of = [](StoredRecord record) -> Where {
    switch (record) {
      case StoredRecord::kDataset:
        return {"bad:dataset:ds", "record", "(key 'bad:dataset:ds')"};
      case StoredRecord::kNode:
        return {"bad:node:node-1", "record", "(key 'bad:node:node-1')"};
      case StoredRecord::kProgress:
        return {"bad:progress:ds", "node-1", "(field 'node-1' of key 'bad:progress:ds')"};
      case StoredRecord::kPlan:
        return {"bad:plans:ds", "p", "(field 'p' of key 'bad:plans:ds')"};
    }
    return {};
  };
  // Every read that returns the record.
  auto reads = [&](StoredRecord record) -> std::vector<Status> {
    switch (record) {
      case StoredRecord::kDataset:
        return {store->GetDataset("ds").status(), store->ListDatasets().status()};
      case StoredRecord::kNode:
        return {store->ListNodes("").status(), store->ListNodes("default").status()};
      case StoredRecord::kProgress:
        return {store->ListProgress("ds").status()};
      case StoredRecord::kPlan:
        return {store->ListPlans("ds").status()};
    }
    return {};
  };

  for (const auto& c : testing::RecordCorruptions()) {
    SCOPED_TRACE(c.from + " -> " + c.to);
    const Where w = where_of(c.record);
    const std::string good = raw.Run({"HGET", w.key, w.field});
    std::string bad = good;
    const size_t at = bad.find(c.from);
    ASSERT_NE(at, std::string::npos) << good;
    bad.replace(at, c.from.size(), c.to);
    ASSERT_EQ(raw.Run({"HSET", w.key, w.field, bad}), "0");
    for (const Status& s : reads(c.record)) {
      EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
      EXPECT_THAT(s.message(), HasSubstr(w.shown));
      EXPECT_THAT(s.message(), HasSubstr(server_->url(0, "?prefix=bad")));
      EXPECT_THAT(s.message(), HasSubstr(c.problem));
      EXPECT_THAT(s.message(), HasSubstr("rewrite or delete it"));
    }
    ASSERT_EQ(raw.Run({"HSET", w.key, w.field, good}), "0");
    for (const Status& s : reads(c.record)) EXPECT_OK(s);
  }

  // A record written before spec.snapshot_by existed reads as a client
  // snapshot, and a client-snapshotted record is written without the key.
  {
    const std::string good = raw.Run({"HGET", "bad:dataset:ds", "record"});
    std::string old = good;
    const std::string key = R"("snapshot_by":"pool",)";
    const size_t at = old.find(key);
    ASSERT_NE(at, std::string::npos) << good;
    old.erase(at, key.size());
    ASSERT_EQ(raw.Run({"HSET", "bad:dataset:ds", "record", old}), "0");
    auto read = store->GetDataset("ds");
    ASSERT_OK(read);
    EXPECT_EQ(read->spec.snapshot_by, SnapshotBy::kClient);
    ASSERT_OK(store->UpdateDataset(*read));
    EXPECT_EQ(raw.Run({"HGET", "bad:dataset:ds", "record"}).find("snapshot_by"), std::string::npos);
    ASSERT_EQ(raw.Run({"HSET", "bad:dataset:ds", "record", good}), "0");
    ASSERT_EQ(raw.Run({"HSET", "bad:dataset:ds", "revision", "1"}), "0");
  }

  // The numbers kept beside the dataset's JSON are checked too.
  ASSERT_EQ(raw.Run({"HSET", "bad:dataset:ds", "revision", "x1"}), "0");
  auto got = store->GetDataset("ds");
  EXPECT_EQ(got.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(got.status().message(), HasSubstr("revision 'x1'"));
  ASSERT_EQ(raw.Run({"HSET", "bad:dataset:ds", "revision", "0"}), "0");
  EXPECT_EQ(store->ListDatasets().status().code(), StatusCode::kCorruption);
  ASSERT_EQ(raw.Run({"HSET", "bad:dataset:ds", "revision", "1"}), "0");
  EXPECT_OK(store->GetDataset("ds"));
  // A name in the index whose hash holds another dataset's record.
  ASSERT_EQ(raw.Run({"COPY", "bad:dataset:ds", "bad:dataset:ds-copy"}), "1");
  ASSERT_EQ(raw.Run({"SADD", "bad:datasets", "ds-copy"}), "1");
  auto listed = store->ListDatasets();
  EXPECT_EQ(listed.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(listed.status().message(), HasSubstr("stored under 'ds-copy'"));
}

// ---- the RedisServer fixture ----

TEST(RedisServerFixtureTest, RestartNeverTakesAnotherServerOnItsPortForItself) {
  auto server = testing::RedisServer::Start();
  ASSERT_OK(server);
  const uint16_t port = (*server)->port();
  ASSERT_OK((*server)->Stop());

  // While ours is down, another process starts a Redis on the port.
  testing::TempDir dir;
  const std::string binary = testing::RedisServer::Binary();
  auto intruder = testing::ChildProcess::Start([&](int) {
    std::vector<std::string> args = {
        binary,   "--port", std::to_string(port), "--bind", "127.0.0.1",   "--dir", dir.path(),
        "--save", "",       "--appendonly",       "no",     "--daemonize", "no"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    return 127;
  });
  ASSERT_OK(intruder);
  ASSERT_TRUE(testing::WaitFor([&] {
    RawRedis probe(port);
    return probe.c != nullptr && probe.c->err == 0 && probe.Run({"PING"}) == "PONG";
  })) << "the other redis-server did not start";

  // Ours cannot bind and exits; the other one answers PING in the meantime,
  // but its INFO names another process.
  Status restarted = (*server)->Restart();
  ASSERT_FALSE(restarted.ok());
  EXPECT_THAT(restarted.message(),
              HasSubstr("another redis-server (pid " + std::to_string((*intruder)->pid()) + ")"));
  EXPECT_FALSE((*server)->running());
}

}  // namespace
}  // namespace granary

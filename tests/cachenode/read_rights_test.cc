// ReadRightsCache: the chunk handoff's kept answers about other local users:
// per (uid, dataset, manifest, chunk), for ttl (an injected clock), at most
// capacity of them, only lasting ones, at most max_checks checks at once.

#include "granary/cachenode/read_rights.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "testing/test_util.h"

namespace granary {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class ReadRightsCacheTest : public ::testing::Test {
 protected:
  ReadRightsOptions Options() {
    ReadRightsOptions o;
    o.ttl = 30s;
    o.capacity = 4;
    o.now = [this] { return now_; };
    return o;
  }
  static ReadRightsKey Key(uint32_t uid, ChunkId chunk, std::string dataset = "ds") {
    return ReadRightsKey{uid, std::move(dataset), ContentId{1, 2}, chunk};
  }
  // A check that counts its calls and answers `answer`.
  std::function<Status()> Check(Status answer) {
    return [this, answer] {
      ++checks_;
      return answer;
    };
  }

  Clock::time_point now_ = Clock::time_point(1h);
  int checks_ = 0;
};

TEST_F(ReadRightsCacheTest, AnAnswerIsKeptPerUidDatasetManifestAndChunkForTheTtl) {
  ReadRightsCache cache(Options());
  const Status denied = Status::PermissionDenied("uid 65534 may not read 'a'");
  EXPECT_EQ(cache.Decide(Key(65534, 1), Check(denied)).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(cache.Decide(Key(65534, 1), Check(Status::Ok())).message(), denied.message());
  EXPECT_EQ(checks_, 1);
  // Another uid, chunk, dataset or manifest is another question.
  EXPECT_OK(cache.Decide(Key(1000, 1), Check(Status::Ok())));
  EXPECT_OK(cache.Decide(Key(65534, 2), Check(Status::Ok())));
  EXPECT_OK(cache.Decide(Key(65534, 1, "other"), Check(Status::Ok())));
  ReadRightsKey manifest = Key(65534, 1);
  manifest.manifest = ContentId{3, 4};
  EXPECT_OK(cache.Decide(manifest, Check(Status::Ok())));
  EXPECT_EQ(checks_, 5);
  EXPECT_EQ(cache.counters().hits, 1u);

  // Past the ttl the question is asked again: a right granted since counts.
  now_ += 30s;
  EXPECT_OK(cache.Decide(Key(65534, 1), Check(Status::Ok())));
  EXPECT_EQ(checks_, 6);
}

TEST_F(ReadRightsCacheTest, FailuresThatMayPassAreNotKept) {
  ReadRightsCache cache(Options());
  EXPECT_EQ(cache.Decide(Key(7, 0), Check(Status::Unavailable("NSS down"))).code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(cache.Decide(Key(7, 0), Check(Status::IoError("EIO"))).code(), StatusCode::kIoError);
  EXPECT_OK(cache.Decide(Key(7, 0), Check(Status::Ok())));
  EXPECT_OK(cache.Decide(Key(7, 0), Check(Status::Unavailable("not asked"))));
  EXPECT_EQ(checks_, 3);
}

TEST_F(ReadRightsCacheTest, AtMostCapacityAnswersAreKeptOldestGoFirst) {
  ReadRightsCache cache(Options());
  for (ChunkId c = 0; c < 10; ++c) {
    now_ += 1s;
    EXPECT_OK(cache.Decide(Key(7, c), Check(Status::Ok())));
    EXPECT_LE(cache.counters().kept, 4u);
  }
  EXPECT_EQ(checks_, 10);
  EXPECT_OK(cache.Decide(Key(7, 9), Check(Status::Ok())));  // kept
  EXPECT_OK(cache.Decide(Key(7, 0), Check(Status::Ok())));  // gone: asked again
  EXPECT_EQ(checks_, 11);
}

TEST_F(ReadRightsCacheTest, AtMostMaxChecksRunAtOnce) {
  ReadRightsOptions o = Options();
  o.max_checks = 2;
  o.capacity = 0;  // nothing kept: every call checks
  ReadRightsCache cache(o);
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      Status s = cache.Decide(Key(7, static_cast<ChunkId>(t)), [&] {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(20ms);
        --running;
        return Status::Ok();
      });
      EXPECT_OK(s);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 2);
  EXPECT_EQ(cache.counters().checks, 8u);
  EXPECT_EQ(cache.counters().kept, 0u);
}

}  // namespace
}  // namespace granary

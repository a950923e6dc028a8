// The cache node's budget policy (cache_budget.h) on its own: who keeps what
// when the shares do not fit.

#include "granary/cachenode/cache_budget.h"

#include <gtest/gtest.h>

#include <vector>

namespace granary {
namespace {

CacheClaim Claim(const std::string& name, uint64_t share, bool in_use = true,
                 int64_t last_used_ms = 0) {
  CacheClaim c;
  c.dataset = name;
  c.share_bytes = share;
  c.limit_bytes = share;
  c.in_use = in_use;
  c.last_used_ms = last_used_ms;
  return c;
}

TEST(CacheBudgetTest, EverythingFitsEveryoneKeepsItsShare) {
  std::vector<CacheClaim> claims = {Claim("a", 300), Claim("b", 400, false)};
  auto grants = AllocateCacheBudgets(claims, 1000);
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[0].bytes, 300u);
  EXPECT_EQ(grants[1].bytes, 400u);
  EXPECT_EQ(grants[0].cut, CacheCut::kNone);
  EXPECT_EQ(grants[1].cut, CacheCut::kNone);
}

TEST(CacheBudgetTest, TwoInUseOfOnePrioritySplitFairly) {
  std::vector<CacheClaim> claims = {Claim("old", 1000), Claim("new", 1000)};
  auto grants = AllocateCacheBudgets(claims, 1000);
  EXPECT_EQ(grants[0].bytes, 500u);
  EXPECT_EQ(grants[1].bytes, 500u);
  EXPECT_EQ(grants[0].cut, CacheCut::kFairShare);
  EXPECT_EQ(CacheCutName(grants[1].cut), "fair_share");
  // A small one gets all it asks; the others split the rest.
  claims.push_back(Claim("small", 100));
  grants = AllocateCacheBudgets(claims, 1000);
  EXPECT_EQ(grants[2].bytes, 100u);
  EXPECT_EQ(grants[2].cut, CacheCut::kNone);
  EXPECT_EQ(grants[0].bytes, 450u);
  EXPECT_EQ(grants[1].bytes, 450u);
}

TEST(CacheBudgetTest, IdleDatasetsLoseBeforeInUseOnesLeastRecentlyReadFirst) {
  std::vector<CacheClaim> claims = {Claim("idle-old", 400, false, 1000),
                                    Claim("idle-recent", 400, false, 5000),
                                    Claim("busy", 500, true, 100)};
  auto grants = AllocateCacheBudgets(claims, 1000);
  EXPECT_EQ(grants[2].bytes, 500u);
  EXPECT_EQ(grants[1].bytes, 400u);
  EXPECT_EQ(grants[0].bytes, 100u);
  EXPECT_EQ(grants[0].cut, CacheCut::kPriority);
}

TEST(CacheBudgetTest, HigherPriorityFirstAndPinnedNeverShrinks) {
  std::vector<CacheClaim> claims = {Claim("low", 800), Claim("high", 800), Claim("pinned", 300)};
  claims[0].cache.priority = -5;
  claims[1].cache.priority = 10;
  claims[2].cache.pinned = true;
  claims[2].cache.priority = -1000;
  claims[2].in_use = false;
  auto grants = AllocateCacheBudgets(claims, 1000);
  EXPECT_EQ(grants[2].bytes, 300u);
  EXPECT_EQ(grants[1].bytes, 700u);
  EXPECT_EQ(grants[0].bytes, 0u);
  EXPECT_EQ(grants[0].cut, CacheCut::kPriority);
  EXPECT_EQ(grants[1].cut, CacheCut::kPriority);
}

TEST(CacheBudgetTest, MinimumResidentPercentIsAFloorOthersCannotTake) {
  std::vector<CacheClaim> claims = {Claim("low", 1000), Claim("high", 1000)};
  claims[0].cache.priority = -1;
  claims[0].cache.min_resident_percent = 30;
  auto grants = AllocateCacheBudgets(claims, 1000);
  EXPECT_EQ(grants[0].bytes, 300u);
  EXPECT_EQ(grants[1].bytes, 700u);
}

TEST(CacheBudgetTest, TtlDropsAnUnreadDatasetButNotAPinnedOne) {
  std::vector<CacheClaim> claims = {Claim("stale", 100, false), Claim("kept", 100, false)};
  claims[0].expired = true;
  claims[1].expired = true;
  claims[1].cache.pinned = true;
  auto grants = AllocateCacheBudgets(claims, 1000);
  EXPECT_EQ(grants[0].bytes, 0u);
  EXPECT_EQ(grants[0].cut, CacheCut::kTtl);
  EXPECT_EQ(grants[1].bytes, 100u);
}

TEST(CacheBudgetTest, ALimitCapsAndIsSaidSo) {
  std::vector<CacheClaim> claims = {Claim("quota", 1000)};
  claims[0].limit_bytes = 250;
  auto grants = AllocateCacheBudgets(claims, 10'000);
  EXPECT_EQ(grants[0].bytes, 250u);
  EXPECT_EQ(grants[0].cut, CacheCut::kLimit);
}

TEST(CacheBudgetTest, PinnedOverCapacityGetsWhatFitsAndNothingOverflows) {
  std::vector<CacheClaim> claims = {Claim("p1", 800), Claim("p2", 800), Claim("x", 100)};
  claims[0].cache.pinned = true;
  claims[1].cache.pinned = true;
  auto grants = AllocateCacheBudgets(claims, 1000);
  uint64_t sum = 0;
  for (const CacheGrant& g : grants) sum += g.bytes;
  EXPECT_EQ(sum, 1000u);
  EXPECT_EQ(grants[2].bytes, 0u);
  // No claims, no capacity: nothing to do, nothing breaks.
  EXPECT_TRUE(AllocateCacheBudgets({}, 0).empty());
  EXPECT_EQ(AllocateCacheBudgets(claims, 0)[0].bytes, 0u);
}

TEST(CacheBudgetTest, ScaledLimitIsTheSameFractionOfEveryShare) {
  DatasetCacheSpec cache;
  EXPECT_EQ(ScaledLimit(500, cache, 1000, 1), 500u);  // no limit
  cache.max_resident_bytes = 1000;
  EXPECT_EQ(ScaledLimit(500, cache, 4000, 1), 125u);  // a quarter of the dataset
  EXPECT_EQ(ScaledLimit(500, cache, 1000, 2), 250u);  // half of it with two replicas
  EXPECT_EQ(ScaledLimit(500, cache, 100, 1), 500u);   // more than the dataset: the share
  cache.max_resident_bytes = 0;
  EXPECT_EQ(ScaledLimit(500, cache, 1000, 1), 0u);
  EXPECT_EQ(ScaledLimit(500, cache, 0, 1), 500u);  // an empty dataset
}

}  // namespace
}  // namespace granary

// The DistributedSampler order behind granary.torch (sampler_plan.h): torch's
// partitioning semantics, the plan code's permutation, and the SET_PLAN that
// announces it.

#include "granary/client/sampler_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "testing/test_util.h"

namespace granary::client {
namespace {

SamplerSpec Spec(uint64_t n, uint32_t world, uint32_t rank, bool shuffle, bool drop_last,
                 uint64_t seed = 0, uint64_t epoch = 0) {
  SamplerSpec s;
  s.sample_count = n;
  s.num_replicas = world;
  s.rank = rank;
  s.shuffle = shuffle;
  s.drop_last = drop_last;
  s.seed = seed;
  s.epoch = epoch;
  return s;
}

std::vector<SampleId> Indices(const SamplerSpec& spec) {
  Result<std::vector<SampleId>> r = SamplerIndices(spec);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<SampleId>{};
}

// torch.utils.data.DistributedSampler(shuffle=False) on 10 samples, computed by
// hand from its source: pad by repeating the start, or cut; rank r takes r::world.
TEST(SamplerPlanTest, SequentialMatchesTorchByHand) {
  EXPECT_EQ(Indices(Spec(10, 3, 0, false, false)), (std::vector<SampleId>{0, 3, 6, 9}));
  EXPECT_EQ(Indices(Spec(10, 3, 1, false, false)), (std::vector<SampleId>{1, 4, 7, 0}));
  EXPECT_EQ(Indices(Spec(10, 3, 2, false, false)), (std::vector<SampleId>{2, 5, 8, 1}));
  EXPECT_EQ(Indices(Spec(10, 3, 0, false, true)), (std::vector<SampleId>{0, 3, 6}));
  EXPECT_EQ(Indices(Spec(10, 3, 2, false, true)), (std::vector<SampleId>{2, 5, 8}));
  // Padding longer than the dataset repeats it cyclically (torch does the same).
  EXPECT_EQ(Indices(Spec(2, 5, 4, false, false)), (std::vector<SampleId>{0}));
  EXPECT_EQ(Indices(Spec(2, 5, 3, false, false)), (std::vector<SampleId>{1}));
  EXPECT_TRUE(Indices(Spec(0, 2, 1, true, false)).empty());
}

TEST(SamplerPlanTest, ShareSizesAreTorchs) {
  for (uint64_t n : {0u, 1u, 7u, 10u, 301u}) {
    for (uint32_t world : {1u, 2u, 3u, 8u}) {
      for (bool drop_last : {false, true}) {
        const RankShare share = SamplerShare(Spec(n, world, 0, true, drop_last));
        const uint64_t expected = drop_last && n % world != 0 ? n / world : (n + world - 1) / world;
        EXPECT_EQ(share.num_samples, expected) << n << " " << world << " " << drop_last;
        EXPECT_EQ(share.total_size, expected * world);
        for (uint32_t rank = 0; rank < world; ++rank) {
          EXPECT_EQ(Indices(Spec(n, world, rank, true, drop_last, 7)).size(), expected);
        }
      }
    }
  }
}

// Every sample once per epoch across ranks (plus the padding repeats, which
// are the first total−n of the epoch order); disjoint without padding.
TEST(SamplerPlanTest, RanksCoverTheEpochOnce) {
  const uint64_t n = 301;
  for (uint32_t world : {1u, 2u, 4u}) {
    for (uint64_t epoch : {0u, 1u, 5u}) {
      std::map<SampleId, int> seen;
      for (uint32_t rank = 0; rank < world; ++rank) {
        for (SampleId id : Indices(Spec(n, world, rank, true, false, 42, epoch))) ++seen[id];
      }
      ASSERT_EQ(seen.size(), n) << "world " << world;
      int repeats = 0;
      for (const auto& [id, count] : seen) {
        ASSERT_GE(count, 1);
        repeats += count - 1;
      }
      EXPECT_EQ(static_cast<uint64_t>(repeats),
                SamplerShare(Spec(n, world, 0, true, false)).total_size - n);
    }
  }
}

TEST(SamplerPlanTest, ShuffleIsThePlanCodesGlobalOrderAndDependsOnSeedAndEpoch) {
  const SamplerSpec spec = Spec(500, 2, 1, true, false, 9, 3);
  // The core plan over a real chunk layout gives the same order: global mode
  // does not depend on chunks, so the sidecar's plan equals the sampler's.
  std::vector<ChunkId> chunk_of(500);
  for (size_t s = 0; s < chunk_of.size(); ++s) chunk_of[s] = static_cast<ChunkId>(s / 37);
  PlanSpec plan = SamplerPlanSpec(spec);
  EXPECT_EQ(plan.mode, PlanMode::kGlobal);
  auto order = EpochOrder(chunk_of, plan);
  ASSERT_OK(order);
  auto expected = RankSamples(*order, plan);
  ASSERT_OK(expected);
  EXPECT_EQ(Indices(spec), *expected);

  const std::vector<SampleId> base = Indices(spec);
  std::vector<SampleId> sorted = base;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(base, sorted) << "shuffle=True must not be id order";
  EXPECT_NE(Indices(Spec(500, 2, 1, true, false, 10, 3)), base) << "seed";
  EXPECT_NE(Indices(Spec(500, 2, 1, true, false, 9, 4)), base) << "epoch";
  EXPECT_EQ(Indices(Spec(500, 2, 1, true, false, 9, 3)), base) << "deterministic";
  EXPECT_EQ(SamplerPlanSpec(Spec(5, 1, 0, false, false)).mode, PlanMode::kSequential);
}

TEST(SamplerPlanTest, BadSpecsAreRejectedLikeTorch) {
  auto r = SamplerIndices(Spec(10, 2, 2, true, false));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("invalid rank 2, rank should be in the interval [0, 1]"),
            std::string::npos)
      << r.status().message();
  r = SamplerIndices(Spec(10, 0, 0, true, false));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_replicas is 0"), std::string::npos);
  r = SamplerIndices(Spec(10, 1, 0, true, false, 0, kMaxPlanEpoch + 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("epoch"), std::string::npos);
  r = SamplerIndices(Spec(uint64_t{1} << 33, 1, 0, true, false));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("split the dataset"), std::string::npos);
}

TEST(SamplerPlanTest, SetPlanAnnouncesTheSamplersOrder) {
  SamplerSpec spec = Spec(301, 2, 1, true, true, 123, 4);
  auto set = SamplerSetPlan(spec, 17);
  ASSERT_OK(set);
  EXPECT_EQ(set->plan_id, "py-123-2");
  EXPECT_EQ(set->seed, 123u);
  EXPECT_EQ(set->epoch, 4u);
  EXPECT_EQ(set->world_size, 2u);
  EXPECT_EQ(set->rank, 1u);
  EXPECT_EQ(set->batch_size, 1u);
  EXPECT_TRUE(set->drop_last);
  EXPECT_EQ(set->mode, 0);  // global
  EXPECT_EQ(set->start_position, 17u);
  // The encoder accepts it as it is (plan id charset, ranges).
  EXPECT_OK(sidecar_protocol::EncodeRequest(1, *set));

  spec.shuffle = false;
  set = SamplerSetPlan(spec, SamplerShare(spec).num_samples);  // resume at the very end
  ASSERT_OK(set);
  EXPECT_EQ(set->mode, 2);  // sequential
  auto past = SamplerSetPlan(spec, SamplerShare(spec).num_samples + 1);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(SamplerSetPlan(Spec(10, 2, 5, true, false)).ok());
}

}  // namespace
}  // namespace granary::client

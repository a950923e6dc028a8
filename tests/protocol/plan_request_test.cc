// SetPlanFor, PlanSpecOf and PlanRecordOf (core/include/granary/core/
// plan_request.h): every PlanSpec field survives SET_PLAN both ways, and the
// PlanRecord a SET_PLAN registers gives back, for its epoch and rank, the
// PlanSpec the SET_PLAN asked for (ToPlanSpec, as the cache nodes read it).

#include "granary/protocol/plan_request.h"

#include <gtest/gtest.h>

#include <vector>

#include "testing/test_util.h"

namespace granary {
namespace {

std::vector<PlanSpec> Specs() {
  std::vector<PlanSpec> specs;
  for (PlanMode mode : {PlanMode::kGlobal, PlanMode::kChunkwise, PlanMode::kSequential}) {
    for (bool drop_last : {false, true}) {
      PlanSpec spec;
      spec.seed = 0xfedcba9876543210ull;  // above 2^63
      spec.epoch = 7;
      spec.world_size = 64;
      spec.rank = 63;
      spec.batch_size = 256;
      spec.drop_last = drop_last;
      spec.mode = mode;
      spec.window = 3;
      specs.push_back(spec);
    }
  }
  return specs;
}

TEST(PlanRequestTest, EveryPlanSpecFieldSurvivesSetPlan) {
  for (const PlanSpec& spec : Specs()) {
    const sidecar_protocol::SetPlan set = SetPlanFor("job-1", spec, 42);
    EXPECT_EQ(set.plan_id, "job-1");
    EXPECT_EQ(set.start_position, 42u);
    EXPECT_EQ(PlanSpecOf(set), spec) << PlanModeName(spec.mode);
    // And through the wire.
    Result<std::string> bytes = sidecar_protocol::EncodeRequest(9, set);
    ASSERT_OK(bytes);
    Result<sidecar_protocol::Frame> frame = sidecar_protocol::DecodeFrame(*bytes);
    ASSERT_OK(frame);
    Result<sidecar_protocol::Request> decoded = sidecar_protocol::DecodeRequest(*frame);
    ASSERT_OK(decoded);
    ASSERT_TRUE(std::holds_alternative<sidecar_protocol::SetPlan>(*decoded));
    EXPECT_EQ(std::get<sidecar_protocol::SetPlan>(*decoded), set);
  }
}

TEST(PlanRequestTest, RegisteredRecordGivesBackTheRequestedSpec) {
  for (const PlanSpec& spec : Specs()) {
    const sidecar_protocol::SetPlan set = SetPlanFor("job-1", spec, 0);
    const PlanRecord record = PlanRecordOf(set);
    EXPECT_EQ(record.plan_id, "job-1");
    EXPECT_EQ(record.first_epoch, spec.epoch);
    EXPECT_EQ(record.mode, PlanModeName(spec.mode));
    EXPECT_EQ(record.registered_ms, 0) << "the store sets it";
    Result<PlanSpec> back = ToPlanSpec(record, spec.epoch, spec.rank);
    ASSERT_OK(back);
    EXPECT_EQ(*back, spec) << PlanModeName(spec.mode);
  }
}

TEST(PlanRequestTest, UnknownModeIsLeftForValidation) {
  sidecar_protocol::SetPlan set = SetPlanFor("job-1", PlanSpec{}, 0);
  set.mode = 9;
  EXPECT_EQ(ValidatePlanSpec(PlanSpecOf(set)).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace granary

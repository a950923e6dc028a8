#include "granary/client/sampler_plan.h"

#include <fmt/format.h>

#include <limits>

#include "granary/protocol/plan_request.h"

namespace granary::client {

Status ValidateSamplerSpec(const SamplerSpec& spec) {
  if (spec.num_replicas == 0) {
    return Status::InvalidArgument(
        "distributed sampler: num_replicas is 0; it must be at least 1 (the number of ranks)");
  }
  if (spec.rank >= spec.num_replicas) {
    return Status::InvalidArgument(
        fmt::format("distributed sampler: invalid rank {}, rank should be in the interval [0, {}]",
                    spec.rank, spec.num_replicas - 1));
  }
  if (spec.epoch > kMaxPlanEpoch) {
    return Status::InvalidArgument(fmt::format(
        "distributed sampler: epoch {} is past the largest a plan supports ({}); count epochs "
        "from 0",
        spec.epoch, kMaxPlanEpoch));
  }
  if (spec.sample_count > std::numeric_limits<SampleId>::max()) {
    return Status::InvalidArgument(
        fmt::format("distributed sampler: {} samples is more than a plan can order ({}); split "
                    "the dataset",
                    spec.sample_count, std::numeric_limits<SampleId>::max()));
  }
  return Status::Ok();
}

PlanSpec SamplerPlanSpec(const SamplerSpec& spec) {
  PlanSpec plan;
  plan.seed = spec.seed;
  plan.epoch = spec.epoch;
  plan.world_size = spec.num_replicas;
  plan.rank = spec.rank;
  plan.batch_size = 1;
  plan.drop_last = spec.drop_last;
  plan.mode = spec.shuffle ? PlanMode::kGlobal : PlanMode::kSequential;
  return plan;
}

RankShare SamplerShare(const SamplerSpec& spec) {
  return ComputeRankShare(spec.sample_count, spec.num_replicas == 0 ? 1 : spec.num_replicas,
                          spec.drop_last);
}

Result<std::vector<SampleId>> SamplerIndices(const SamplerSpec& spec) {
  GRANARY_RETURN_IF_ERROR(ValidateSamplerSpec(spec));
  const PlanSpec plan = SamplerPlanSpec(spec);
  // Global and sequential orders do not depend on chunks: one chunk for all.
  const std::vector<ChunkId> chunk_of(static_cast<size_t>(spec.sample_count), ChunkId{0});
  GRANARY_ASSIGN_OR_RETURN(const std::vector<SampleId> order, EpochOrder(chunk_of, plan));
  return RankSamples(order, plan);
}

std::string SamplerPlanId(const SamplerSpec& spec) {
  return fmt::format("py-{}-{}", spec.seed, spec.num_replicas);
}

Result<sidecar_protocol::SetPlan> SamplerSetPlan(const SamplerSpec& spec, uint64_t start_position) {
  GRANARY_RETURN_IF_ERROR(ValidateSamplerSpec(spec));
  const RankShare share = SamplerShare(spec);
  if (start_position > share.num_samples) {
    return Status::OutOfRange(fmt::format(
        "distributed sampler: start position {} is past the {} samples of rank {}'s share; "
        "resume with a state_dict saved by this sampler",
        start_position, share.num_samples, spec.rank));
  }
  return SetPlanFor(SamplerPlanId(spec), SamplerPlanSpec(spec), start_position);
}

}  // namespace granary::client

#pragma once

// What granary.torch.DistributedSampler computes, in C++: the indices one
// rank reads in one epoch, with torch.utils.data.DistributedSampler's
// partitioning semantics (num_samples, total_size, padding, drop_last), from
// the core plan code (plan.h: EpochOrder, then RankSamples) — the Python
// binding calls this and never re-implements it. Also the SET_PLAN that
// announces the same order to the sidecar, so its prefetch follows it exactly.
//
// The sampler's indices are a dataset's sample ids when the dataset is a
// Granary one. shuffle=True is plan mode global, shuffle=False sequential:
// neither depends on how samples are packed into chunks, so the order is
// computed over `sample_count` samples alone and equals the sidecar's plan of
// the same manifest.
//
// Callers: the Python binding (granary._native), C++ training loops, tests.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/plan.h"
#include "granary/core/status.h"
#include "granary/protocol/sidecar_protocol.h"

namespace granary::client {

struct SamplerSpec {
  uint64_t sample_count = 0;  // len(dataset)
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint32_t num_replicas = 1;
  uint32_t rank = 0;
  bool shuffle = true;
  bool drop_last = false;
};

// OK, or kInvalidArgument naming the bad field: num_replicas >= 1, rank <
// num_replicas, epoch <= kMaxPlanEpoch, sample_count within what a plan can
// order.
Status ValidateSamplerSpec(const SamplerSpec& spec);

// The PlanSpec with batch_size 1 that describes the sampler.
PlanSpec SamplerPlanSpec(const SamplerSpec& spec);

// DistributedSampler's num_samples and total_size.
RankShare SamplerShare(const SamplerSpec& spec);

// The rank's indices for the epoch, in order: num_samples of them.
Result<std::vector<SampleId>> SamplerIndices(const SamplerSpec& spec);

// "py-<seed>-<num_replicas>" (the id the Python sampler announces).
std::string SamplerPlanId(const SamplerSpec& spec);

// The SET_PLAN announcing the sampler's order from `start_position` (an index
// into SamplerIndices; at most num_samples).
Result<sidecar_protocol::SetPlan> SamplerSetPlan(const SamplerSpec& spec,
                                                 uint64_t start_position = 0);

}  // namespace granary::client

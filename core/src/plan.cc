#include "granary/core/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <numeric>
#include <utility>

#include "granary/core/philox.h"

namespace granary {
namespace {

// Shuffle bounds are 32-bit, so an order holds fewer than 2^32 samples (a
// manifest holds at most 2^32 − 2).
constexpr uint64_t kMaxPlanSamples = 0xffffffffull;

// The samples that belong to one chunk: a run of consecutive ids.
struct SampleRange {
  SampleId begin = 0;
  SampleId end = 0;
};

Status CheckSampleCount(size_t n) {
  if (n > kMaxPlanSamples) {
    return Status::InvalidArgument(
        fmt::format("plan: {} samples is more than the {} a plan can order; split the dataset", n,
                    kMaxPlanSamples));
  }
  return Status::Ok();
}

// The units of chunkwise mode: maximal runs of samples with the same chunk, in
// id (and so chunk) order. Chunks holding only continuations of a large sample
// have no run, so every unit holds at least one sample.
template <typename ChunkOfFn>
Result<std::vector<SampleRange>> ChunkRuns(size_t n, const ChunkOfFn& chunk_of) {
  std::vector<SampleRange> runs;
  ChunkId previous = 0;
  for (size_t s = 0; s < n; ++s) {
    const ChunkId c = chunk_of(s);
    const SampleId id = static_cast<SampleId>(s);
    if (s > 0 && c == previous) {
      runs.back().end = id + 1;
      continue;
    }
    if (s > 0 && c < previous) {
      return Status::InvalidArgument(fmt::format(
          "plan: sample {} is in chunk {}, before chunk {} of sample {}; samples are packed "
          "into chunks in id order, so the chunk map must not decrease (rebuild the manifest)",
          s, c, previous, s - 1));
    }
    runs.push_back({id, id + 1});
    previous = c;
  }
  return runs;
}

std::vector<SampleId> ChunkwiseOrder(size_t n, const std::vector<SampleRange>& runs,
                                     const PlanSpec& spec) {
  const uint32_t epoch = static_cast<uint32_t>(spec.epoch);
  std::vector<uint32_t> chunk_order(runs.size());
  std::iota(chunk_order.begin(), chunk_order.end(), 0u);
  PhiloxStream chunk_rng(spec.seed, kStreamChunkOrder, epoch, 0);
  Shuffle(std::span<uint32_t>(chunk_order), &chunk_rng);

  std::vector<SampleId> order;
  order.reserve(n);
  uint32_t window_index = 0;
  for (size_t start = 0; start < chunk_order.size(); start += spec.window, ++window_index) {
    const size_t window_begin = order.size();
    const size_t stop = std::min<size_t>(chunk_order.size(), start + spec.window);
    for (size_t p = start; p < stop; ++p) {
      const SampleRange& run = runs[chunk_order[p]];
      for (SampleId s = run.begin; s < run.end; ++s) order.push_back(s);
    }
    PhiloxStream window_rng(spec.seed, kStreamWindow, epoch, window_index);
    Shuffle(std::span<SampleId>(order).subspan(window_begin), &window_rng);
  }
  return order;
}

template <typename ChunkOfFn>
Result<std::vector<SampleId>> EpochOrderOf(size_t n, const ChunkOfFn& chunk_of,
                                           const PlanSpec& spec) {
  GRANARY_RETURN_IF_ERROR(ValidatePlanSpec(spec));
  GRANARY_RETURN_IF_ERROR(CheckSampleCount(n));
  switch (spec.mode) {
    case PlanMode::kSequential:
    case PlanMode::kGlobal: {
      std::vector<SampleId> order(n);
      std::iota(order.begin(), order.end(), SampleId{0});
      if (spec.mode == PlanMode::kGlobal) {
        PhiloxStream rng(spec.seed, kStreamSampleOrder, static_cast<uint32_t>(spec.epoch), 0);
        Shuffle(std::span<SampleId>(order), &rng);
      }
      return order;
    }
    case PlanMode::kChunkwise: {
      GRANARY_ASSIGN_OR_RETURN(const std::vector<SampleRange> runs, ChunkRuns(n, chunk_of));
      return ChunkwiseOrder(n, runs, spec);
    }
  }
  return Status::Internal("plan: unhandled mode after validation");
}

uint64_t BatchCount(uint64_t samples, const PlanSpec& spec) {
  return spec.drop_last ? samples / spec.batch_size
                        : (samples + spec.batch_size - 1) / spec.batch_size;
}

// Position p of the padded (or cut) epoch order of length total.
inline SampleId PaddedAt(std::span<const SampleId> order, uint64_t p) {
  return order[static_cast<size_t>(p % order.size())];
}

}  // namespace

std::string_view PlanModeName(PlanMode mode) {
  switch (mode) {
    case PlanMode::kGlobal:
      return "global";
    case PlanMode::kChunkwise:
      return "chunkwise";
    case PlanMode::kSequential:
      return "sequential";
  }
  return "unknown";
}

Result<PlanMode> ParsePlanMode(std::string_view name) {
  for (PlanMode m : {PlanMode::kGlobal, PlanMode::kChunkwise, PlanMode::kSequential}) {
    if (name == PlanModeName(m)) return m;
  }
  return Status::InvalidArgument(fmt::format(
      "plan: unknown shuffle mode '{}'; use one of global, chunkwise, sequential", name));
}

Status ValidatePlanSpec(const PlanSpec& spec) {
  if (spec.world_size == 0) {
    return Status::InvalidArgument(
        "plan: world_size is 0; it must be at least 1 (the number of training processes)");
  }
  if (spec.rank >= spec.world_size) {
    return Status::InvalidArgument(
        fmt::format("plan: rank {} is out of range for world_size {}; rank must be in "
                    "[0, world_size)",
                    spec.rank, spec.world_size));
  }
  if (spec.batch_size == 0) {
    return Status::InvalidArgument("plan: batch_size is 0; it must be at least 1");
  }
  if (spec.window == 0) {
    return Status::InvalidArgument(
        fmt::format("plan: window is 0; a chunkwise window must hold at least 1 chunk "
                    "(default {})",
                    kDefaultChunkWindow));
  }
  if (spec.epoch > kMaxPlanEpoch) {
    return Status::InvalidArgument(fmt::format(
        "plan: epoch {} is too large; epochs must be in [0, {}]", spec.epoch, kMaxPlanEpoch));
  }
  switch (spec.mode) {
    case PlanMode::kGlobal:
    case PlanMode::kChunkwise:
    case PlanMode::kSequential:
      return Status::Ok();
  }
  return Status::InvalidArgument(
      fmt::format("plan: mode {} is not a known shuffle mode; use global, chunkwise or sequential",
                  static_cast<int>(spec.mode)));
}

RankShare ComputeRankShare(uint64_t sample_count, uint32_t world_size, bool drop_last) {
  assert(world_size >= 1);
  RankShare share;
  // DistributedSampler: ceil((n − world) / world) when dropping, which is
  // floor(n / world) for n % world != 0, and 0 (not negative) when n < world.
  share.num_samples = drop_last && sample_count % world_size != 0
                          ? sample_count / world_size
                          : (sample_count + world_size - 1) / world_size;
  share.total_size = share.num_samples * world_size;
  return share;
}

Result<std::vector<SampleId>> EpochOrder(const Manifest& manifest, const PlanSpec& spec) {
  return EpochOrderOf(
      manifest.sample_count(),
      [&manifest](size_t s) { return manifest.ChunkOf(static_cast<SampleId>(s)); }, spec);
}

Result<std::vector<SampleId>> EpochOrder(std::span<const ChunkId> chunk_of, const PlanSpec& spec) {
  return EpochOrderOf(
      chunk_of.size(), [chunk_of](size_t s) { return chunk_of[s]; }, spec);
}

Result<std::vector<SampleId>> RankSamples(std::span<const SampleId> epoch_order,
                                          const PlanSpec& spec) {
  GRANARY_RETURN_IF_ERROR(ValidatePlanSpec(spec));
  GRANARY_RETURN_IF_ERROR(CheckSampleCount(epoch_order.size()));
  const RankShare share = ComputeRankShare(epoch_order.size(), spec.world_size, spec.drop_last);
  std::vector<SampleId> samples;
  samples.reserve(static_cast<size_t>(share.num_samples));
  for (uint64_t p = spec.rank; p < share.total_size; p += spec.world_size) {
    samples.push_back(PaddedAt(epoch_order, p));
  }
  return samples;
}

Result<std::vector<SampleId>> AllRanksReadOrder(std::span<const SampleId> epoch_order,
                                                const PlanSpec& spec) {
  GRANARY_RETURN_IF_ERROR(ValidatePlanSpec(spec));
  GRANARY_RETURN_IF_ERROR(CheckSampleCount(epoch_order.size()));
  const RankShare share = ComputeRankShare(epoch_order.size(), spec.world_size, spec.drop_last);
  const uint64_t steps = BatchCount(share.num_samples, spec);
  const uint64_t per_rank = std::min(steps * spec.batch_size, share.num_samples);
  std::vector<SampleId> order;
  order.reserve(static_cast<size_t>(per_rank * spec.world_size));
  for (uint64_t step = 0; step < steps; ++step) {
    const uint64_t first = step * spec.batch_size;
    const uint64_t last = std::min(first + spec.batch_size, per_rank);
    for (uint64_t r = 0; r < spec.world_size; ++r) {
      // Rank r's j-th sample is position r + j·world of the padded order.
      for (uint64_t j = first; j < last; ++j) {
        order.push_back(PaddedAt(epoch_order, r + j * spec.world_size));
      }
    }
  }
  return order;
}

Result<std::vector<SampleId>> FirstReadOrder(std::span<const SampleId> epoch_order,
                                             const PlanSpec& spec) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<SampleId> order, AllRanksReadOrder(epoch_order, spec));
  // Ids are < n only for an epoch order that is a permutation; be safe with any.
  SampleId max_id = 0;
  for (SampleId s : epoch_order) max_id = std::max(max_id, s);
  std::vector<bool> seen(epoch_order.empty() ? 0 : size_t{max_id} + 1, false);
  size_t kept = 0;
  for (SampleId s : order) {
    if (!seen[s]) {
      seen[s] = true;
      order[kept++] = s;
    }
  }
  order.resize(kept);
  return order;
}

Plan::Plan(PlanSpec spec, std::vector<SampleId> samples)
    : spec_(spec),
      samples_(std::move(samples)),
      batch_count_(static_cast<size_t>(BatchCount(samples_.size(), spec_))) {}

Result<Plan> Plan::Create(const Manifest& manifest, const PlanSpec& spec) {
  GRANARY_ASSIGN_OR_RETURN(const std::vector<SampleId> order, EpochOrder(manifest, spec));
  return FromEpochOrder(order, spec);
}

Result<Plan> Plan::FromEpochOrder(std::span<const SampleId> epoch_order, const PlanSpec& spec) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<SampleId> samples, RankSamples(epoch_order, spec));
  return Plan(spec, std::move(samples));
}

size_t Plan::read_count() const {
  return std::min(batch_count_ * size_t{spec_.batch_size}, samples_.size());
}

std::span<const SampleId> Plan::Batch(size_t index) const {
  if (index >= batch_count_) return {};
  const size_t begin = index * spec_.batch_size;
  const size_t size = std::min<size_t>(spec_.batch_size, samples_.size() - begin);
  return std::span<const SampleId>(samples_).subspan(begin, size);
}

}  // namespace granary

#pragma once

// Plans: the exact sample ids every training rank reads in an epoch, in order,
// split into batches. Because Granary's sampler is the one the training job
// uses, the same function tells cache nodes what to stage next and sidecars what
// to prefetch (DESIGN.md, "Plan"). One implementation: the Python binding calls
// this, never re-implements it.
//
// A plan is computed in three steps (docs/placement-and-plans.md):
//  1. the epoch order: a sequence of all sample ids, from (seed, epoch, mode):
//     - sequential: 0, 1, ..., n−1;
//     - global: a uniform permutation: Shuffle of 0..n−1 with PhiloxStream(seed,
//       kStreamSampleOrder, epoch, 0) (philox.h);
//     - chunkwise: the chunks that samples belong to (a sample belongs to
//       ChunkOf(sample), the first chunk of a large one; chunks holding only
//       continuations of a large sample are not units) are shuffled with
//       PhiloxStream(seed, kStreamChunkOrder, epoch, 0); the shuffled list is cut
//       into windows of `window` chunks; window k lists its chunks' samples (in
//       shuffled chunk order, ids ascending within a chunk) and shuffles them with
//       PhiloxStream(seed, kStreamWindow, epoch, k). Reads stay within `window`
//       chunks at a time, so staging and source reads are large and sequential.
//  2. the rank's share, exactly as PyTorch's DistributedSampler:
//       num_samples = floor(n / world)      if drop_last and n % world != 0
//                   = ceil(n / world)       otherwise
//       total = num_samples · world
//     without drop_last the order is padded to `total` by repeating it from its
//     start (cyclically if the padding exceeds n); with drop_last it is cut to
//     `total`. Rank r takes positions r, r + world, r + 2·world, ...
//  3. batches: consecutive runs of batch_size of the rank's share; with
//     drop_last the trailing partial batch is dropped too, as
//     DataLoader(drop_last=True) does (in PyTorch these are two flags; a Granary
//     plan has one for both, because a job that drops one drops the other).
//
// Callers: the client library and Python binding (what to read next), sidecars
// (prefetch), cache nodes (staging order, via FirstReadOrder), the CLI.
//
// Thread safety: free functions are pure; a Plan is immutable after Create and
// may be read by any number of threads.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary {

enum class PlanMode : uint8_t {
  kGlobal,      // uniform permutation of all samples (the default)
  kChunkwise,   // shuffled chunks, samples shuffled within windows of chunks
  kSequential,  // id order
};

// "global", "chunkwise", "sequential".
std::string_view PlanModeName(PlanMode mode);
// The inverse of PlanModeName; anything else is kInvalidArgument.
Result<PlanMode> ParsePlanMode(std::string_view name);

inline constexpr uint32_t kDefaultChunkWindow = 8;
// Epochs are one 32-bit word of the Philox counter.
inline constexpr uint64_t kMaxPlanEpoch = 0xffffffffull;

// PhiloxStream `stream` values: part of the plan definition, never renumber.
inline constexpr uint32_t kStreamSampleOrder = 0;
inline constexpr uint32_t kStreamChunkOrder = 1;
inline constexpr uint32_t kStreamWindow = 2;

struct PlanSpec {
  uint64_t seed = 0;
  uint64_t epoch = 0;       // 0 .. kMaxPlanEpoch
  uint32_t world_size = 1;  // training processes (DistributedSampler num_replicas)
  uint32_t rank = 0;        // 0 .. world_size − 1
  uint32_t batch_size = 1;  // samples per batch of one rank
  bool drop_last = false;   // DistributedSampler(drop_last) and DataLoader(drop_last)
  PlanMode mode = PlanMode::kGlobal;
  uint32_t window = kDefaultChunkWindow;  // chunks per window (chunkwise only; must be >= 1)

  friend bool operator==(const PlanSpec&, const PlanSpec&) = default;
};

// OK, or kInvalidArgument naming the first bad field and its allowed range.
Status ValidatePlanSpec(const PlanSpec& spec);

// DistributedSampler's sizes for n samples; world_size >= 1.
struct RankShare {
  uint64_t num_samples = 0;  // per rank
  uint64_t total_size = 0;   // num_samples · world_size: the padded or cut epoch length
};
RankShare ComputeRankShare(uint64_t sample_count, uint32_t world_size, bool drop_last);

// Step 1: the order of all samples for (seed, epoch, mode, window).
Result<std::vector<SampleId>> EpochOrder(const Manifest& manifest, const PlanSpec& spec);
// The same for a dataset given by each sample's chunk: chunk_of[s] is
// ChunkOf(s), non-decreasing as packing is in id order. For tests and tools
// that have no Manifest; EpochOrder(manifest) equals EpochOrder(its chunk_of).
Result<std::vector<SampleId>> EpochOrder(std::span<const ChunkId> chunk_of, const PlanSpec& spec);

// Step 2: rank `spec.rank`'s share of an epoch order, in read order.
Result<std::vector<SampleId>> RankSamples(std::span<const SampleId> epoch_order,
                                          const PlanSpec& spec);

// What all ranks read, step by step: for step k = 0, 1, ..., batch k of rank 0,
// batch k of rank 1, ..., batch k of rank world−1 (every rank has as many
// batches). Ranks run their steps in lockstep, so this is the order in which the
// job reads; with batch_size 1 it is the padded or cut epoch order itself.
// spec.rank is not used. Padding repeats appear where they are read.
Result<std::vector<SampleId>> AllRanksReadOrder(std::span<const SampleId> epoch_order,
                                                const PlanSpec& spec);
// AllRanksReadOrder without repeats: the order in which samples are first read
// by any rank, i.e. the order a cache node should stage in. Samples never read
// (drop_last) are absent.
Result<std::vector<SampleId>> FirstReadOrder(std::span<const SampleId> epoch_order,
                                             const PlanSpec& spec);

// One rank's plan for one epoch: its samples in order and their batches.
class Plan {
 public:
  static Result<Plan> Create(const Manifest& manifest, const PlanSpec& spec);
  static Result<Plan> FromEpochOrder(std::span<const SampleId> epoch_order, const PlanSpec& spec);

  const PlanSpec& spec() const { return spec_; }
  // What DistributedSampler yields to this rank (num_samples ids). With drop_last
  // the last read_count()..end of them are in no batch and are not read.
  const std::vector<SampleId>& samples() const { return samples_; }
  // Samples in batches: the first read_count() of samples().
  size_t read_count() const;
  size_t batch_count() const { return batch_count_; }
  // Batch `index`: batch_size ids, fewer for a last partial one; empty when
  // index >= batch_count().
  std::span<const SampleId> Batch(size_t index) const;

 private:
  Plan(PlanSpec spec, std::vector<SampleId> samples);

  PlanSpec spec_;
  std::vector<SampleId> samples_;
  size_t batch_count_ = 0;
};

}  // namespace granary

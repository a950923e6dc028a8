// Micro-benchmarks of the core math that runs on every membership change and
// every epoch: placement of a dataset's chunks over a pool, and plan orders at
// ImageNet scale. Google Benchmark; run from a release build:
//
//   build/release/bench/core_bench [--benchmark_filter=Placement]

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "granary/core/hash.h"
#include "granary/core/manifest.h"
#include "granary/core/placement.h"
#include "granary/core/plan.h"

namespace granary {
namespace {

constexpr ContentId kManifest{0x0123456789abcdefull, 0xfedcba9876543210ull};

Placement Pool(int nodes) {
  std::vector<PlacementNode> v;
  for (int i = 0; i < nodes; ++i) {
    v.push_back({"node-" + std::to_string(i), 1e12 * (1 + i % 3)});
  }
  return std::move(Placement::Create(std::move(v))).value();
}

// Owners of 100,000 chunks over a pool: what every cache node computes when
// membership changes.
void BM_PlacementOwners(benchmark::State& state) {
  Placement p = Pool(static_cast<int>(state.range(0)));
  const auto replication = static_cast<uint32_t>(state.range(1));
  std::vector<uint32_t> owners;
  for (auto _ : state) {
    for (ChunkId c = 0; c < 100'000; ++c) {
      p.OwnersInto(kManifest, c, replication, &owners);
      benchmark::DoNotOptimize(owners.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * 100'000);
}
BENCHMARK(BM_PlacementOwners)
    ->Args({10, 1})
    ->Args({100, 1})
    ->Args({100, 3})
    ->Unit(benchmark::kMillisecond);

// An ImageNet-sized chunk map: 1.28M samples, ~110 KiB each, 16 MiB chunks.
const std::vector<ChunkId>& ImageNetChunks() {
  static const std::vector<ChunkId> chunks = [] {
    std::vector<ChunkId> v(1'281'167);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<ChunkId>(i / 148);
    return v;
  }();
  return chunks;
}

void BM_EpochOrder(benchmark::State& state) {
  PlanSpec spec;
  spec.mode = static_cast<PlanMode>(state.range(0));
  spec.seed = 42;
  for (auto _ : state) {
    auto order = EpochOrder(ImageNetChunks(), spec);
    benchmark::DoNotOptimize(order->data());
    ++spec.epoch;
  }
  state.SetLabel(std::string(PlanModeName(spec.mode)));
}
BENCHMARK(BM_EpochOrder)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

// One rank's plan (of 64) from an epoch order, and the staging order.
void BM_RankPlanAndStagingOrder(benchmark::State& state) {
  PlanSpec spec;
  spec.world_size = 64;
  spec.rank = 5;
  spec.batch_size = 256;
  auto order = std::move(EpochOrder(ImageNetChunks(), spec)).value();
  for (auto _ : state) {
    auto plan = Plan::FromEpochOrder(order, spec);
    auto staging = FirstReadOrder(order, spec);
    benchmark::DoNotOptimize(plan->samples().data());
    benchmark::DoNotOptimize(staging->data());
  }
}
BENCHMARK(BM_RankPlanAndStagingOrder)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace granary

// The checksum of every chunk segment and wire item (core/src/hash.cc):
// bytes per second at sample-like sizes.
static void BM_Checksum64(benchmark::State& state) {
  std::string bytes(static_cast<size_t>(state.range(0)), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  for (auto _ : state) benchmark::DoNotOptimize(granary::Checksum64(bytes.data(), bytes.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Checksum64)->Arg(256)->Arg(4096)->Arg(110 << 10)->Arg(1 << 20);

BENCHMARK_MAIN();

#include "granary/core/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "granary/core/hash.h"
#include "granary/core/manifest.h"
#include "granary/core/philox.h"
#include "testing/test_util.h"

namespace granary {
namespace {

// Chi-square critical value at p = 0.001 for `df` degrees of freedom
// (Wilson–Hilferty; within 1% of the exact value for df >= 5). Every statistical
// test below runs on fixed seeds, so it is deterministic: it cannot flake, and a
// biased implementation fails it every time.
double ChiSquareCritical001(double df) {
  const double z = 3.090232;  // upper 0.001 quantile of the standard normal
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

double ChiSquare(const std::vector<double>& observed, double expected) {
  double chi2 = 0;
  for (double o : observed) chi2 += (o - expected) * (o - expected) / expected;
  return chi2;
}

PlanSpec Spec(PlanMode mode, uint64_t seed = 42, uint64_t epoch = 0) {
  PlanSpec spec;
  spec.mode = mode;
  spec.seed = seed;
  spec.epoch = epoch;
  return spec;
}

std::vector<SampleId> Order(size_t n, const PlanSpec& spec) {
  std::vector<ChunkId> chunk_of(n);
  for (size_t s = 0; s < n; ++s) chunk_of[s] = static_cast<ChunkId>(s / 4);
  Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
  EXPECT_TRUE(order.ok()) << order.status().ToString();
  return order.ok() ? *order : std::vector<SampleId>();
}

bool IsPermutation(const std::vector<SampleId>& order, size_t n) {
  if (order.size() != n) return false;
  std::vector<bool> seen(n, false);
  for (SampleId s : order) {
    if (s >= n || seen[s]) return false;
    seen[s] = true;
  }
  return true;
}

// ---- Philox4x32-10, bounded integers, Fisher–Yates ----

TEST(PhiloxTest, KnownAnswerVectors) {
  // Random123's kat_vectors for philox4x32 with 10 rounds.
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  static_assert(Philox4x32({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5, "usable at compile time");
}

TEST(PhiloxTest, StreamLaysOutCounterAndKeyAsSpecified) {
  const uint64_t seed = 0x0123456789abcdefull;
  PhiloxStream stream(seed, /*stream=*/5, /*epoch=*/9, /*sub=*/3);
  const PhiloxKey key = {0x89abcdef, 0x01234567};
  const PhiloxCounter block0 = Philox4x32({0, 3, 9, 5}, key);
  const PhiloxCounter block1 = Philox4x32({1, 3, 9, 5}, key);
  EXPECT_EQ(stream.draws(), 0u);
  for (uint32_t w : block0) EXPECT_EQ(stream.Next32(), w);
  for (uint32_t w : block1) EXPECT_EQ(stream.Next32(), w);
  EXPECT_EQ(stream.draws(), 8u);
}

TEST(PhiloxTest, UniformBelowIsExactLemire) {
  // Re-derive every result from the raw draws with the specified method.
  PhiloxStream raw(7, 0, 0, 0), bounded(7, 0, 0, 0);
  for (uint32_t bound : {1u, 2u, 3u, 7u, 1000u, 0x80000001u, 0xc0000000u, 0xffffffffu}) {
    for (int i = 0; i < 2000; ++i) {
      uint64_t m = uint64_t{raw.Next32()} * bound;
      while (static_cast<uint32_t>(m) < (0u - bound) % bound) m = uint64_t{raw.Next32()} * bound;
      ASSERT_EQ(bounded.UniformBelow(bound), static_cast<uint32_t>(m >> 32)) << bound;
    }
  }
  EXPECT_EQ(raw.draws(), bounded.draws());
  EXPECT_GT(raw.draws(), 8u * 2000) << "large bounds must have rejected some draws";
}

TEST(PhiloxTest, UniformBelowHasNoBiasAtAnAwkwardBound) {
  // bound = 3·2^30: plain x % bound puts half of all values below 2^30 (instead
  // of a third), and multiply-shift without rejection favours one residue mod 3.
  const uint32_t bound = 0xc0000000u;
  PhiloxStream rng(2024, 0, 0, 0);
  std::vector<double> thirds(3, 0), residues(3, 0);
  const int n = 300000;
  for (int i = 0; i < n; ++i) {
    const uint32_t v = rng.UniformBelow(bound);
    ASSERT_LT(v, bound);
    thirds[v >> 30] += 1;
    residues[v % 3] += 1;
  }
  EXPECT_LT(ChiSquare(thirds, n / 3.0), 13.82);  // df 2, p = 0.001
  EXPECT_LT(ChiSquare(residues, n / 3.0), 13.82);
}

TEST(PhiloxTest, ShuffleIsFisherYatesFromTheBack) {
  std::vector<uint32_t> items(50);
  std::iota(items.begin(), items.end(), 0u);
  std::vector<uint32_t> expected = items;
  PhiloxStream a(99, 0, 1, 0), b(99, 0, 1, 0);
  Shuffle(std::span<uint32_t>(items), &a);
  for (size_t i = expected.size() - 1; i >= 1; --i) {
    std::swap(expected[i], expected[b.UniformBelow(static_cast<uint32_t>(i + 1))]);
  }
  EXPECT_EQ(items, expected);
  std::vector<uint32_t> one = {5}, none;
  PhiloxStream c(1, 0, 0, 0);
  Shuffle(std::span<uint32_t>(one), &c);
  Shuffle(std::span<uint32_t>(none), &c);
  EXPECT_EQ(c.draws(), 0u) << "a list of 0 or 1 items needs no draw";
}

// ---- Epoch orders ----

// Pinned orders, also computed by an independent Python implementation of the
// definition in plan.h/philox.h. A change here changes every job's sample order:
// never update these to make a test pass.
TEST(EpochOrderTest, PinnedOrders) {
  EXPECT_EQ(Order(10, Spec(PlanMode::kGlobal, 42, 0)),
            (std::vector<SampleId>{7, 3, 8, 9, 1, 5, 2, 0, 4, 6}));
  EXPECT_EQ(Order(10, Spec(PlanMode::kGlobal, 42, 1)),
            (std::vector<SampleId>{7, 2, 3, 5, 6, 9, 4, 8, 1, 0}));
  EXPECT_EQ(Order(16, Spec(PlanMode::kGlobal, 0x123456789abcdef0ull, 7)),
            (std::vector<SampleId>{0, 3, 11, 12, 6, 4, 10, 9, 5, 7, 15, 1, 13, 8, 2, 14}));
  // Chunk 3 holds only the continuation of sample 8 (a large file): not a unit.
  const std::vector<ChunkId> chunk_of = {0, 0, 0, 1, 1, 2, 2, 2, 2, 4, 5, 5};
  PlanSpec spec = Spec(PlanMode::kChunkwise, 42, 0);
  spec.window = 2;
  Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
  ASSERT_OK(order);
  EXPECT_EQ(*order, (std::vector<SampleId>{3, 4, 9, 11, 5, 8, 6, 7, 10, 1, 2, 0}));
  EXPECT_EQ(Order(5, Spec(PlanMode::kSequential)), (std::vector<SampleId>{0, 1, 2, 3, 4}));
}

TEST(EpochOrderTest, EveryModeIsABijection) {
  for (PlanMode mode : {PlanMode::kGlobal, PlanMode::kChunkwise, PlanMode::kSequential}) {
    for (size_t n : {0ul, 1ul, 2ul, 3ul, 17ul, 1000ul, 100003ul}) {
      EXPECT_TRUE(IsPermutation(Order(n, Spec(mode, n)), n)) << PlanModeName(mode) << " " << n;
    }
  }
}

TEST(EpochOrderTest, SameInputsSameOrderAndEpochsOrSeedsDiffer) {
  for (PlanMode mode : {PlanMode::kGlobal, PlanMode::kChunkwise}) {
    const std::vector<SampleId> a = Order(5000, Spec(mode, 1, 0));
    EXPECT_EQ(a, Order(5000, Spec(mode, 1, 0)));
    EXPECT_NE(a, Order(5000, Spec(mode, 1, 1)));
    EXPECT_NE(a, Order(5000, Spec(mode, 2, 0)));
    EXPECT_NE(a, Order(5000, Spec(mode, 1ull << 32, 0))) << "the seed's high half counts";
    EXPECT_NE(a, Order(5000, Spec(PlanMode::kSequential)));
  }
  EXPECT_EQ(Order(100, Spec(PlanMode::kSequential, 1, 0)),
            Order(100, Spec(PlanMode::kSequential, 2, 5)));
}

TEST(EpochOrderTest, GlobalPermutationsOfFourAreUniform) {
  // 24 permutations, 1000 expected each, over 24000 seeds and over 24000 epochs.
  auto chi2 = [](auto spec_for) {
    std::map<std::vector<SampleId>, double> counts;
    for (uint64_t i = 0; i < 24000; ++i) counts[Order(4, spec_for(i))] += 1;
    std::vector<double> observed;
    for (const auto& [perm, count] : counts) observed.push_back(count);
    EXPECT_EQ(observed.size(), 24u);
    return ChiSquare(observed, 1000.0);
  };
  const double critical = ChiSquareCritical001(23);  // 49.7 (exact 49.73)
  EXPECT_LT(chi2([](uint64_t i) { return Spec(PlanMode::kGlobal, i, 0); }), critical);
  EXPECT_LT(chi2([](uint64_t i) { return Spec(PlanMode::kGlobal, 77, i); }), critical);
}

TEST(EpochOrderTest, GlobalPositionOfEachElementIsUniform) {
  // n = 32 over 32000 seeds: every (element, position) cell expects 1000. With
  // fixed row and column sums the table has (n − 1)^2 degrees of freedom.
  constexpr size_t kN = 32;
  constexpr int kSeeds = 32000;
  std::vector<double> cells(kN * kN, 0);
  for (int seed = 0; seed < kSeeds; ++seed) {
    const std::vector<SampleId> order =
        Order(kN, Spec(PlanMode::kGlobal, 1000u + static_cast<uint64_t>(seed), 3));
    for (size_t pos = 0; pos < kN; ++pos) cells[order[pos] * kN + pos] += 1;
  }
  EXPECT_LT(ChiSquare(cells, kSeeds / static_cast<double>(kN)),
            ChiSquareCritical001((kN - 1) * (kN - 1)));
}

// Chunk map with chunks of 1..max_per_chunk samples, and, every so often, a
// large sample followed by continuation chunks that no sample belongs to.
std::vector<ChunkId> RaggedChunks(size_t n, uint32_t max_per_chunk, uint64_t seed) {
  std::vector<ChunkId> chunk_of;
  ChunkId chunk = 0;
  PhiloxStream rng(seed, 0, 0, 0);
  while (chunk_of.size() < n) {
    const uint32_t take = 1 + rng.UniformBelow(max_per_chunk);
    for (uint32_t k = 0; k < take && chunk_of.size() < n; ++k) chunk_of.push_back(chunk);
    chunk += rng.UniformBelow(10) == 0 ? 1 + rng.UniformBelow(4) : 1;  // skip continuations
  }
  return chunk_of;
}

TEST(EpochOrderTest, ChunkwiseStaysWithinWindowsOfChunks) {
  const std::vector<ChunkId> chunk_of = RaggedChunks(20000, 30, 5);
  const size_t units = std::set<ChunkId>(chunk_of.begin(), chunk_of.end()).size();
  for (uint32_t window : {1u, 2u, 8u, 64u}) {
    PlanSpec spec = Spec(PlanMode::kChunkwise, 11, 2);
    spec.window = window;
    Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
    ASSERT_OK(order);
    ASSERT_TRUE(IsPermutation(*order, chunk_of.size()));
    // Each chunk's samples span [first, last] positions; overlapping spans merge
    // into segments. Windows are contiguous and each chunk is in one window, so
    // every segment lies inside one window and touches at most `window` chunks.
    std::map<ChunkId, std::pair<size_t, size_t>> span;
    for (size_t pos = 0; pos < order->size(); ++pos) {
      const ChunkId c = chunk_of[(*order)[pos]];
      auto [it, fresh] = span.try_emplace(c, pos, pos);
      if (!fresh) it->second.second = pos;
    }
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& [c, s] : span) spans.push_back(s);
    std::sort(spans.begin(), spans.end());
    size_t max_chunks = 0, segments = 0;
    for (size_t i = 0; i < spans.size();) {
      size_t end = spans[i].second, chunks = 0;
      for (; i < spans.size() && spans[i].first <= end; ++i) {
        end = std::max(end, spans[i].second);
        ++chunks;
      }
      max_chunks = std::max(max_chunks, chunks);
      ++segments;
    }
    EXPECT_LE(max_chunks, window);
    EXPECT_GE(segments, (units + window - 1) / window);
    // Windows are really used: samples of neighbouring chunks are mixed.
    if (window > 1) {
      EXPECT_EQ(max_chunks, window);
    }
    // Shuffled within chunks too, not just chunk by chunk in id order.
    EXPECT_FALSE(std::is_sorted(order->begin(), order->begin() + 30));
  }
}

TEST(EpochOrderTest, ChunkwiseChunkOrderIsShuffled) {
  // With window 1 the order is the chunks in shuffled order, each shuffled inside.
  std::vector<ChunkId> chunk_of(4000);
  for (size_t s = 0; s < chunk_of.size(); ++s) chunk_of[s] = static_cast<ChunkId>(s / 10);
  PlanSpec spec = Spec(PlanMode::kChunkwise, 3, 0);
  spec.window = 1;
  Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
  ASSERT_OK(order);
  std::vector<ChunkId> chunk_sequence;
  for (size_t pos = 0; pos < order->size(); pos += 10) {
    const ChunkId c = chunk_of[(*order)[pos]];
    for (size_t k = 0; k < 10; ++k) ASSERT_EQ(chunk_of[(*order)[pos + k]], c);
    chunk_sequence.push_back(c);
  }
  EXPECT_FALSE(std::is_sorted(chunk_sequence.begin(), chunk_sequence.end()));
  // Window >= number of chunks: a shuffle of everything, still a bijection.
  spec.window = 1000000;
  ASSERT_OK(EpochOrder(chunk_of, spec));
}

// ---- Rank shares (DistributedSampler) ----

// torch.utils.data.DistributedSampler.__iter__, transcribed: Python's
// math.ceil on a possibly negative quotient, the two padding branches, the cut.
std::vector<SampleId> TorchDistributedSampler(std::vector<SampleId> indices, int64_t world,
                                              int64_t rank, bool drop_last) {
  const int64_t n = static_cast<int64_t>(indices.size());
  auto ceil_div = [](int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); };
  const int64_t num_samples =
      drop_last && n % world != 0 ? ceil_div(n - world, world) : ceil_div(n, world);
  const int64_t total_size = num_samples * world;
  if (!drop_last) {
    const int64_t padding_size = total_size - n;
    if (padding_size <= n) {
      indices.insert(indices.end(), indices.begin(), indices.begin() + padding_size);
    } else {
      std::vector<SampleId> repeated;
      for (int64_t k = 0; k < ceil_div(padding_size, n); ++k) {
        repeated.insert(repeated.end(), indices.begin(), indices.begin() + n);
      }
      indices.insert(indices.end(), repeated.begin(), repeated.begin() + padding_size);
    }
  } else {
    indices.resize(static_cast<size_t>(total_size));
  }
  EXPECT_EQ(static_cast<int64_t>(indices.size()), total_size);
  std::vector<SampleId> mine;
  for (int64_t p = rank; p < total_size; p += world)
    mine.push_back(indices[static_cast<size_t>(p)]);
  EXPECT_EQ(static_cast<int64_t>(mine.size()), num_samples);
  return mine;
}

TEST(RankSharesTest, MatchTorchDistributedSampler) {
  for (size_t n = 0; n <= 40; ++n) {
    const std::vector<SampleId> order = Order(n, Spec(PlanMode::kGlobal, n));
    for (uint32_t world = 1; world <= 9; ++world) {
      for (bool drop_last : {false, true}) {
        PlanSpec spec = Spec(PlanMode::kGlobal, n);
        spec.world_size = world;
        spec.drop_last = drop_last;
        const RankShare share = ComputeRankShare(n, world, drop_last);
        for (uint32_t rank = 0; rank < world; ++rank) {
          spec.rank = rank;
          Result<std::vector<SampleId>> mine = RankSamples(order, spec);
          ASSERT_OK(mine);
          ASSERT_EQ(*mine, TorchDistributedSampler(order, world, rank, drop_last))
              << "n " << n << " world " << world << " rank " << rank << " drop " << drop_last;
          EXPECT_EQ(mine->size(), share.num_samples);
        }
      }
    }
  }
}

std::vector<std::vector<SampleId>> AllShares(const std::vector<SampleId>& order, uint32_t world,
                                             bool drop_last) {
  std::vector<std::vector<SampleId>> shares;
  PlanSpec spec;
  spec.world_size = world;
  spec.drop_last = drop_last;
  for (uint32_t r = 0; r < world; ++r) {
    spec.rank = r;
    shares.push_back(*RankSamples(order, spec));
  }
  return shares;
}

TEST(RankSharesTest, DisjointAndCoveringWhenWorldDividesN) {
  const std::vector<SampleId> order = Order(1200, Spec(PlanMode::kGlobal, 5));
  for (uint32_t world : {1u, 2u, 3u, 8u, 100u, 1200u}) {
    for (bool drop_last : {false, true}) {
      std::vector<SampleId> all;
      for (const auto& share : AllShares(order, world, drop_last)) {
        EXPECT_EQ(share.size(), 1200u / world);
        all.insert(all.end(), share.begin(), share.end());
      }
      EXPECT_TRUE(IsPermutation(all, 1200)) << world;
    }
  }
}

TEST(RankSharesTest, PaddingRepeatsTheStartOfTheOrder) {
  for (size_t n : {1ul, 5ul, 97ul, 1001ul}) {
    const std::vector<SampleId> order = Order(n, Spec(PlanMode::kGlobal, n + 1));
    for (uint32_t world : {2u, 3u, 7u, 64u}) {
      const RankShare share = ComputeRankShare(n, world, false);
      std::map<SampleId, size_t> times;
      for (const auto& s : AllShares(order, world, false)) {
        EXPECT_EQ(s.size(), share.num_samples);
        for (SampleId id : s) ++times[id];
      }
      ASSERT_EQ(times.size(), n) << "every sample is read";
      // The extra reads are exactly the padding: positions n..total−1 of the
      // padded order, i.e. order[0], order[1], ... cyclically.
      std::map<SampleId, size_t> expected_extra;
      for (uint64_t p = n; p < share.total_size; ++p) ++expected_extra[order[p % n]];
      for (const auto& [id, count] : times) {
        const auto it = expected_extra.find(id);
        EXPECT_EQ(count - 1, it == expected_extra.end() ? 0 : it->second) << id;
      }
    }
  }
}

TEST(RankSharesTest, DropLastCutsTheTail) {
  for (size_t n : {0ul, 3ul, 10ul, 97ul, 1001ul}) {
    const std::vector<SampleId> order = Order(n, Spec(PlanMode::kGlobal, n + 2));
    for (uint32_t world : {2u, 3u, 7u, 64u}) {
      const RankShare share = ComputeRankShare(n, world, true);
      EXPECT_EQ(share.num_samples, n / world);
      std::vector<SampleId> all;
      for (const auto& s : AllShares(order, world, true)) {
        EXPECT_EQ(s.size(), share.num_samples);
        all.insert(all.end(), s.begin(), s.end());
      }
      std::set<SampleId> distinct(all.begin(), all.end());
      EXPECT_EQ(distinct.size(), all.size()) << "disjoint";
      EXPECT_EQ(n - all.size(), n % world) << "drops exactly n − total";
      // What is dropped is the end of the epoch order.
      std::set<SampleId> head(order.begin(), order.begin() + static_cast<long>(all.size()));
      EXPECT_EQ(distinct, head);
    }
  }
}

// ---- Batches and the all-ranks order ----

Plan MakePlan(const std::vector<SampleId>& order, uint32_t world, uint32_t rank, uint32_t batch,
              bool drop_last) {
  PlanSpec spec;
  spec.world_size = world;
  spec.rank = rank;
  spec.batch_size = batch;
  spec.drop_last = drop_last;
  Result<Plan> plan = Plan::FromEpochOrder(order, spec);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return std::move(plan).value();
}

TEST(PlanTest, WorkedExampleFromTheDesignNote) {
  // docs/placement-and-plans.md: n = 10, seed 42, epoch 0, global, 4 ranks,
  // batch_size 2. Order 7 3 8 9 1 5 2 0 4 6.
  const std::vector<SampleId> order = Order(10, Spec(PlanMode::kGlobal, 42, 0));
  Plan r0 = MakePlan(order, 4, 0, 2, false);
  EXPECT_EQ(r0.samples(), (std::vector<SampleId>{7, 1, 4}));
  ASSERT_EQ(r0.batch_count(), 2u);
  EXPECT_EQ(std::vector<SampleId>(r0.Batch(0).begin(), r0.Batch(0).end()),
            (std::vector<SampleId>{7, 1}));
  EXPECT_EQ(std::vector<SampleId>(r0.Batch(1).begin(), r0.Batch(1).end()),
            (std::vector<SampleId>{4}));
  EXPECT_TRUE(r0.Batch(2).empty());
  EXPECT_TRUE(r0.Batch(SIZE_MAX).empty());
  EXPECT_EQ(MakePlan(order, 4, 3, 2, false).samples(), (std::vector<SampleId>{9, 0, 3}));
  Plan d2 = MakePlan(order, 4, 2, 2, true);
  EXPECT_EQ(d2.samples(), (std::vector<SampleId>{8, 2}));
  EXPECT_EQ(d2.batch_count(), 1u);

  PlanSpec spec;
  spec.world_size = 4;
  spec.batch_size = 2;
  EXPECT_EQ(*AllRanksReadOrder(order, spec),
            (std::vector<SampleId>{7, 1, 3, 5, 8, 2, 9, 0, 4, 6, 7, 3}));
  EXPECT_EQ(*FirstReadOrder(order, spec), (std::vector<SampleId>{7, 1, 3, 5, 8, 2, 9, 0, 4, 6}));
  spec.drop_last = true;
  EXPECT_EQ(*FirstReadOrder(order, spec), (std::vector<SampleId>{7, 1, 3, 5, 8, 2, 9, 0}));
}

TEST(PlanTest, BatchesSplitTheRankSequence) {
  const std::vector<SampleId> order = Order(103, Spec(PlanMode::kGlobal, 8));
  for (uint32_t batch : {1u, 4u, 7u, 26u, 200u}) {
    for (bool drop_last : {false, true}) {
      Plan plan = MakePlan(order, 4, 1, batch, drop_last);
      const size_t n = plan.samples().size();  // 26 without drop_last, 25 with
      EXPECT_EQ(n, drop_last ? 25u : 26u);
      EXPECT_EQ(plan.batch_count(), drop_last ? n / batch : (n + batch - 1) / batch);
      std::vector<SampleId> joined;
      for (size_t b = 0; b < plan.batch_count(); ++b) {
        const auto batch_ids = plan.Batch(b);
        if (drop_last || b + 1 < plan.batch_count()) {
          EXPECT_EQ(batch_ids.size(), batch);
        }
        joined.insert(joined.end(), batch_ids.begin(), batch_ids.end());
      }
      EXPECT_EQ(joined.size(), plan.read_count());
      EXPECT_TRUE(std::equal(joined.begin(), joined.end(), plan.samples().begin()));
      if (!drop_last) {
        EXPECT_EQ(plan.read_count(), n);
      }
    }
  }
}

TEST(PlanTest, AllRanksReadOrderInterleavesBatchesByStep) {
  for (size_t n : {0ul, 1ul, 13ul, 100ul}) {
    const std::vector<SampleId> order = Order(n, Spec(PlanMode::kGlobal, n + 3));
    for (uint32_t world : {1u, 3u, 4u}) {
      for (uint32_t batch : {1u, 2u, 5u}) {
        for (bool drop_last : {false, true}) {
          std::vector<Plan> plans;
          for (uint32_t r = 0; r < world; ++r)
            plans.push_back(MakePlan(order, world, r, batch, drop_last));
          std::vector<SampleId> expected;
          for (size_t step = 0; step < plans[0].batch_count(); ++step) {
            for (const Plan& p : plans) {
              ASSERT_EQ(p.batch_count(), plans[0].batch_count());
              expected.insert(expected.end(), p.Batch(step).begin(), p.Batch(step).end());
            }
          }
          PlanSpec spec;
          spec.world_size = world;
          spec.batch_size = batch;
          spec.drop_last = drop_last;
          Result<std::vector<SampleId>> all = AllRanksReadOrder(order, spec);
          ASSERT_OK(all);
          EXPECT_EQ(*all, expected);
          // Staging order: the first reads, each read sample once.
          Result<std::vector<SampleId>> first = FirstReadOrder(order, spec);
          ASSERT_OK(first);
          std::vector<SampleId> dedup;
          std::set<SampleId> seen;
          for (SampleId s : expected) {
            if (seen.insert(s).second) dedup.push_back(s);
          }
          EXPECT_EQ(*first, dedup);
          if (!drop_last) {
            EXPECT_EQ(first->size(), n) << "every sample is staged";
          }
          if (batch == 1) {
            const RankShare share = ComputeRankShare(n, world, drop_last);
            ASSERT_EQ(all->size(), share.total_size);
            for (size_t p = 0; p < all->size(); ++p) EXPECT_EQ((*all)[p], order[p % n]);
          }
        }
      }
    }
  }
}

// ---- From a manifest ----

Manifest MakeManifest(const std::vector<uint64_t>& sizes) {
  ManifestHeaderInfo header;
  header.source_uri = "file:///data/train";
  header.chunk_size = kMinChunkSize;  // 1 KiB
  std::vector<FileEntry> entries;
  for (size_t i = 0; i < sizes.size(); ++i) {
    char path[32];
    std::snprintf(path, sizeof(path), "s%06zu.bin", i);
    entries.push_back({path, sizes[i], 1700000000000000000});
  }
  Result<Manifest> m = Manifest::FromEntries(header, std::move(entries));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

TEST(PlanTest, ManifestPlansMatchChunkMapPlans) {
  // Small samples several to a chunk, some empty ones, and large ones that span
  // several chunks (their continuation chunks own no sample).
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < 3000; ++i) {
    const uint64_t h = Hash64(&i, sizeof(i), 1);
    sizes.push_back(i % 97 == 0 ? 3000 + h % 5000 : (i % 31 == 0 ? 0 : 50 + h % 400));
  }
  const Manifest manifest = MakeManifest(sizes);
  ASSERT_GT(manifest.chunk_count(), 1000u);
  std::vector<ChunkId> chunk_of;
  for (SampleId s = 0; s < manifest.sample_count(); ++s) chunk_of.push_back(manifest.ChunkOf(s));
  EXPECT_LT(std::set<ChunkId>(chunk_of.begin(), chunk_of.end()).size(), manifest.chunk_count())
      << "the test needs chunks that hold only continuations";
  for (PlanMode mode : {PlanMode::kGlobal, PlanMode::kChunkwise, PlanMode::kSequential}) {
    PlanSpec spec = Spec(mode, 1234, 5);
    spec.world_size = 8;
    spec.rank = 3;
    spec.batch_size = 16;
    Result<std::vector<SampleId>> from_manifest = EpochOrder(manifest, spec);
    ASSERT_OK(from_manifest);
    EXPECT_TRUE(IsPermutation(*from_manifest, sizes.size()));
    EXPECT_EQ(*from_manifest, *EpochOrder(chunk_of, spec));
    Result<Plan> plan = Plan::Create(manifest, spec);
    ASSERT_OK(plan);
    EXPECT_EQ(plan->samples(), *RankSamples(*from_manifest, spec));
    EXPECT_EQ(plan->spec(), spec);
  }
}

// ---- Bad inputs ----

TEST(PlanSpecTest, ModeNamesRoundTrip) {
  for (PlanMode mode : {PlanMode::kGlobal, PlanMode::kChunkwise, PlanMode::kSequential}) {
    Result<PlanMode> parsed = ParsePlanMode(PlanModeName(mode));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_EQ(PlanModeName(PlanMode::kChunkwise), "chunkwise");
  Result<PlanMode> bad = ParsePlanMode("random");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "plan: unknown shuffle mode 'random'; use one of global, chunkwise, sequential");
  EXPECT_FALSE(ParsePlanMode("Global").ok());
  EXPECT_FALSE(ParsePlanMode("").ok());
}

TEST(PlanSpecTest, RejectsBadParametersWithClearMessages) {
  auto message = [](auto edit) {
    PlanSpec spec;
    spec.world_size = 4;
    edit(spec);
    Status s = ValidatePlanSpec(spec);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    // Every entry point checks the same way.
    const std::vector<SampleId> order = {0, 1, 2};
    const std::vector<ChunkId> chunk_of = {0, 0, 1};
    EXPECT_EQ(EpochOrder(chunk_of, spec).status(), s);
    EXPECT_EQ(RankSamples(order, spec).status(), s);
    EXPECT_EQ(AllRanksReadOrder(order, spec).status(), s);
    EXPECT_EQ(FirstReadOrder(order, spec).status(), s);
    EXPECT_EQ(Plan::FromEpochOrder(order, spec).status(), s);
    return s.message();
  };
  EXPECT_EQ(message([](PlanSpec& s) { s.world_size = 0; }),
            "plan: world_size is 0; it must be at least 1 (the number of training processes)");
  EXPECT_EQ(message([](PlanSpec& s) { s.rank = 4; }),
            "plan: rank 4 is out of range for world_size 4; rank must be in [0, world_size)");
  EXPECT_EQ(message([](PlanSpec& s) { s.batch_size = 0; }),
            "plan: batch_size is 0; it must be at least 1");
  EXPECT_EQ(message([](PlanSpec& s) { s.window = 0; }),
            "plan: window is 0; a chunkwise window must hold at least 1 chunk (default 8)");
  EXPECT_EQ(message([](PlanSpec& s) { s.epoch = kMaxPlanEpoch + 1; }),
            "plan: epoch 4294967296 is too large; epochs must be in [0, 4294967295]");
  EXPECT_EQ(message([](PlanSpec& s) { s.mode = static_cast<PlanMode>(7); }),
            "plan: mode 7 is not a known shuffle mode; use global, chunkwise or sequential");

  PlanSpec ok;
  ok.epoch = kMaxPlanEpoch;
  EXPECT_TRUE(ValidatePlanSpec(ok).ok());
  EXPECT_EQ(Order(3, Spec(PlanMode::kGlobal, 1, kMaxPlanEpoch)).size(), 3u);
}

TEST(PlanSpecTest, RejectsADecreasingChunkMap) {
  PlanSpec spec = Spec(PlanMode::kChunkwise);
  const std::vector<ChunkId> chunk_of = {0, 0, 2, 1};
  Result<std::vector<SampleId>> order = EpochOrder(chunk_of, spec);
  EXPECT_EQ(order.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(order.status().message().find("sample 3 is in chunk 1, before chunk 2 of sample 2"),
            std::string::npos);
  // Other modes do not look at chunks.
  spec.mode = PlanMode::kGlobal;
  EXPECT_OK(EpochOrder(chunk_of, spec));
}

}  // namespace
}  // namespace granary

#include "granary/core/placement.h"

#include <gtest/gtest.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "granary/core/byte_order.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using placement_internal::ChunkKey;
using placement_internal::NegLogQ56;
using placement_internal::NodeKey;
using placement_internal::PairHash;

const ContentId kManifest{0x0123456789abcdefull, 0xfedcba9876543210ull};

std::string NodeName(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "node-%03zu", i);
  return buf;
}

std::vector<PlacementNode> EqualNodes(size_t n) {
  std::vector<PlacementNode> nodes;
  for (size_t i = 0; i < n; ++i) nodes.push_back({NodeName(i), 1.0});
  return nodes;
}

Placement Make(std::vector<PlacementNode> nodes) {
  Result<Placement> p = Placement::Create(std::move(nodes));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(p).value() : Placement();
}

// Primary owner id of every chunk in [0, chunks).
std::vector<std::string> PrimaryIds(const Placement& p, uint32_t chunks) {
  std::vector<std::string> ids;
  ids.reserve(chunks);
  for (uint32_t c = 0; c < chunks; ++c) ids.push_back(p.nodes()[p.Primary(kManifest, c)].id);
  return ids;
}

// Chi-square critical value at p = 0.001 for `df` degrees of freedom
// (Wilson–Hilferty; within 1% of the exact value for df >= 5).
double ChiSquareCritical001(double df) {
  const double z = 3.090232;  // upper 0.001 quantile of the standard normal
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// A digest of the owners of many chunks over nodes of mixed weights: any change
// in hashing, scoring, tie-breaking or ordering changes it.
uint64_t OwnersDigest() {
  std::vector<PlacementNode> nodes;
  for (size_t i = 0; i < 37; ++i) nodes.push_back({NodeName(i), 1.0 + static_cast<double>(i % 5)});
  Placement p = Make(std::move(nodes));
  std::string bytes;
  ByteWriter w(&bytes);
  std::vector<uint32_t> owners;
  for (ChunkId c = 0; c < 20000; ++c) {
    p.OwnersInto(kManifest, c, 3, &owners);
    for (uint32_t o : owners) w.Put(o);
  }
  return Hash64(bytes, 0);
}

// When the test binary is started with this variable set, it prints the digest
// and exits before main(): a fresh process (new address space layout, new heap)
// computing the same thing as the parent.
constexpr char kDigestChildEnv[] = "GRANARY_PLACEMENT_DIGEST_CHILD";
const bool kDigestChild = [] {
  if (std::getenv(kDigestChildEnv) == nullptr) return false;
  std::printf("digest=%016llx\n", static_cast<unsigned long long>(OwnersDigest()));
  std::fflush(stdout);
  std::_Exit(0);
}();

TEST(PlacementTest, SameOwnersInAFreshProcess) {
  (void)kDigestChild;
  char exe[PATH_MAX];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(len, 0);
  exe[len] = '\0';
  const std::string command = std::string(kDigestChildEnv) + "=1 '" + exe + "'";
  FILE* child = ::popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr);
  char line[128] = {};
  const bool got = std::fgets(line, sizeof(line), child) != nullptr;
  ASSERT_EQ(::pclose(child), 0);
  ASSERT_TRUE(got);
  char expected[64];
  std::snprintf(expected, sizeof(expected), "digest=%016llx\n",
                static_cast<unsigned long long>(OwnersDigest()));
  EXPECT_STREQ(line, expected);
}

// Pinned values: a change to any of these is a change to the placement of every
// existing cache, i.e. a format change. Do not update them to make a test pass.
TEST(PlacementTest, PinnedHashesScoresAndOwners) {
  EXPECT_EQ(ChunkKey(kManifest, 0), 0x4a848a05d5ae5593ull);
  EXPECT_EQ(ChunkKey(kManifest, 7), 0x30f3c73daa23a35full);
  EXPECT_EQ(NodeKey("node-000"), 0x935c801aace82bcull);
  EXPECT_EQ(PairHash(ChunkKey(kManifest, 7), NodeKey("node-000")), 0x7135aac5a8ff3857ull);
  EXPECT_EQ(OwnersDigest(), 0xdf55e5ce871f4683ull);

  // NegLogQ56 against round(−ln((t + 1/2)/2^53)·2^56) computed with 200-bit
  // arithmetic.
  EXPECT_EQ(NegLogQ56(0), 2697111979847435178ull);  // 54·ln 2·2^56
  EXPECT_EQ(NegLogQ56((uint64_t{1} << 53) - 1), 4ull);
  EXPECT_EQ(NegLogQ56(uint64_t{1} << 52), 49946518145322866ull);
  EXPECT_EQ(NegLogQ56(1234567890123ull), 640956509395837477ull);

  Placement p = Make({{"alpha", 1.0}, {"bravo", 2.0}, {"charlie", 1.0}, {"delta", 4.0}});
  std::vector<std::vector<std::string>> owners;
  for (ChunkId c = 0; c < 6; ++c) owners.push_back(p.OwnerIds(kManifest, c, 2));
  // Also computed independently (Python: libxxhash through ctypes, mpmath logs).
  const std::vector<std::vector<std::string>> expected = {
      {"delta", "bravo"}, {"delta", "charlie"}, {"delta", "bravo"},
      {"delta", "bravo"}, {"charlie", "bravo"}, {"alpha", "bravo"}};
  EXPECT_EQ(owners, expected);
}

TEST(PlacementTest, NegLogIsAnExponentialDraw) {
  // Mean and variance of −ln(u) for u uniform are both 1.
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double e =
        std::ldexp(static_cast<double>(NegLogQ56(Hash64(&i, sizeof(i), 99) >> 11)), -56);
    sum += e;
    sum_sq += e * e;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  // Standard errors: 1/sqrt(n) = 0.0022 for the mean, sqrt(8/n) = 0.0063 for the
  // variance; 5 of them.
  EXPECT_NEAR(mean, 1.0, 0.011);
  EXPECT_NEAR(var, 1.0, 0.032);
  EXPECT_EQ(NegLogQ56(0), NegLogQ56(uint64_t{1} << 53)) << "only the low 53 bits count";
}

// The definition, computed the slow obvious way: score every node, sort.
std::vector<uint32_t> ReferenceOwners(const Placement& p, ChunkId chunk, uint32_t r) {
  std::vector<std::pair<double, uint32_t>> scored;
  for (uint32_t i = 0; i < p.node_count(); ++i) {
    const uint64_t h = PairHash(ChunkKey(kManifest, chunk), NodeKey(p.nodes()[i].id));
    scored.push_back({p.nodes()[i].weight / static_cast<double>(NegLogQ56(h >> 11)), i});
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<uint32_t> owners;
  for (size_t k = 0; k < std::min<size_t>(r, scored.size()); ++k)
    owners.push_back(scored[k].second);
  return owners;
}

TEST(PlacementTest, MatchesTheDefinition) {
  // Mixed weights over six orders of magnitude, so that the shortcut that skips
  // hopeless nodes is exercised against very different bars.
  std::vector<PlacementNode> nodes;
  for (size_t i = 0; i < 23; ++i) {
    nodes.push_back({NodeName(i), std::pow(10.0, static_cast<double>(i % 7)) *
                                      (1 + 0.1 * static_cast<double>(i))});
  }
  Placement p = Make(nodes);
  for (ChunkId c = 0; c < 3000; ++c) {
    for (uint32_t r : {1u, 2u, 3u, 23u}) {
      ASSERT_EQ(p.Owners(kManifest, c, r), ReferenceOwners(p, c, r)) << "chunk " << c << " r " << r;
    }
  }
}

TEST(PlacementTest, NegLogIsAtLeastOneMinusU) {
  // The shortcut in Placement relies on NegLogQ56(t) >= (1 − u)·2^56 − 2.
  auto check = [](uint64_t t) {
    const uint64_t floor = (uint64_t{1} << 56) - 8 * t - 6;
    ASSERT_GE(NegLogQ56(t), floor) << "t " << t;
  };
  const uint64_t kMax = (uint64_t{1} << 53) - 1;
  for (uint64_t d = 0; d < 100000; ++d) check(kMax - d);
  for (uint64_t i = 0; i < 1000000; ++i) check(Hash64(&i, sizeof(i), 7) >> 11);
  for (int b = 0; b < 53; ++b) {
    for (uint64_t d = 0; d < 2; ++d) check(kMax - (uint64_t{1} << b) + d);
  }
}

TEST(PlacementTest, EmptyPoolHasNoOwners) {
  Placement p = Make({});
  EXPECT_EQ(p.node_count(), 0u);
  EXPECT_TRUE(p.Owners(kManifest, 3, 2).empty());
  EXPECT_EQ(p.Primary(kManifest, 3), Placement::kNoOwner);
  Placement d;
  EXPECT_TRUE(d.Owners(kManifest, 0, 1).empty());
}

TEST(PlacementTest, NodesAreSortedByIdAndInputOrderDoesNotMatter) {
  std::vector<PlacementNode> nodes = EqualNodes(12);
  nodes[3].weight = 3.5;
  std::vector<PlacementNode> reversed(nodes.rbegin(), nodes.rend());
  Placement a = Make(nodes);
  Placement b = Make(reversed);
  EXPECT_EQ(a.nodes(), nodes);
  EXPECT_EQ(b.nodes(), nodes);
  for (ChunkId c = 0; c < 2000; ++c)
    EXPECT_EQ(a.Owners(kManifest, c, 3), b.Owners(kManifest, c, 3));
  ASSERT_OK(a.IndexOf("node-003"));
  EXPECT_EQ(*a.IndexOf("node-003"), 3u);
  EXPECT_EQ(a.IndexOf("node-999").status().code(), StatusCode::kNotFound);
}

TEST(PlacementTest, OwnersDependOnManifest) {
  Placement p = Make(EqualNodes(10));
  const ContentId other{kManifest.high, kManifest.low + 1};
  int differ = 0;
  for (ChunkId c = 0; c < 1000; ++c) differ += p.Primary(kManifest, c) != p.Primary(other, c);
  // Independent placements agree on 1/10 of chunks; expect ~900 to differ.
  EXPECT_GT(differ, 850);
}

TEST(PlacementTest, BalancedOverEqualNodes) {
  constexpr size_t kNodes = 100;
  constexpr uint32_t kChunks = 1000 * kNodes;
  Placement p = Make(EqualNodes(kNodes));
  std::vector<double> count(kNodes, 0);
  for (ChunkId c = 0; c < kChunks; ++c) count[p.Primary(kManifest, c)] += 1;
  const double mean = kChunks / static_cast<double>(kNodes);
  const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
  EXPECT_LE(*hi / mean, 1.1);
  EXPECT_GE(*lo / mean, 0.9);
  double chi2 = 0;
  for (double c : count) chi2 += (c - mean) * (c - mean) / mean;
  EXPECT_LT(chi2, ChiSquareCritical001(kNodes - 1));
}

TEST(PlacementTest, SharesFollowWeights) {
  // Capacities of a mixed pool in bytes; the expected share is weight / total.
  const std::vector<double> weights = {1.92e12,  3.84e12, 3.84e12, 7.68e12,  7.68e12,
                                       15.36e12, 1.92e12, 3.84e12, 30.72e12, 0.96e12};
  std::vector<PlacementNode> nodes;
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    nodes.push_back({NodeName(i), weights[i]});
    total += weights[i];
  }
  Placement p = Make(nodes);
  constexpr uint32_t kChunks = 200000;
  std::vector<double> count(weights.size(), 0);
  for (ChunkId c = 0; c < kChunks; ++c) count[p.Primary(kManifest, c)] += 1;
  double chi2 = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double expected = kChunks * weights[i] / total;
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
  }
  EXPECT_LT(chi2, ChiSquareCritical001(static_cast<double>(weights.size() - 1)));
}

TEST(PlacementTest, DoubleWeightGetsTwiceTheChunks) {
  // Ten nodes, one of weight 2: it should get 2/11 of the chunks, each other 1/11.
  std::vector<PlacementNode> nodes = EqualNodes(10);
  nodes[4].weight = 2.0;
  Placement p = Make(nodes);
  constexpr uint32_t kChunks = 110000;
  std::vector<double> count(10, 0);
  for (ChunkId c = 0; c < kChunks; ++c) count[p.Primary(kManifest, c)] += 1;
  double light = 0;
  for (size_t i = 0; i < 10; ++i) light += i == 4 ? 0 : count[i];
  const double ratio = count[4] / (light / 9);
  // Binomial noise: the heavy count (~20000) has a relative sd of 0.0064, the
  // mean of the light ones (~10000) 0.0033, so the ratio's sd is ~0.0145; 0.1 is
  // about 7 sd: a real weighting error (e.g. score w·u instead of w/−ln u gives
  // ~1.6) cannot hide in it.
  EXPECT_NEAR(ratio, 2.0, 0.1);
}

TEST(PlacementTest, ScalingAllWeightsByAPowerOfTwoChangesNothing) {
  std::vector<PlacementNode> bytes, gib;
  for (size_t i = 0; i < 16; ++i) {
    const double g = static_cast<double>(100 + 37 * i);
    gib.push_back({NodeName(i), g});
    bytes.push_back({NodeName(i), g * 1073741824.0});
  }
  Placement a = Make(bytes), b = Make(gib);
  for (ChunkId c = 0; c < 5000; ++c)
    ASSERT_EQ(a.Owners(kManifest, c, 2), b.Owners(kManifest, c, 2));
}

TEST(PlacementTest, AddingANodeMovesAboutOneNthAndOnlyToIt) {
  constexpr size_t kNodes = 20;
  constexpr uint32_t kChunks = 50000;
  std::vector<PlacementNode> nodes = EqualNodes(kNodes);
  const std::vector<std::string> before = PrimaryIds(Make(nodes), kChunks);
  nodes.push_back({"node-new", 1.0});
  const std::vector<std::string> after = PrimaryIds(Make(nodes), kChunks);
  double moved = 0;
  for (uint32_t c = 0; c < kChunks; ++c) {
    if (before[c] != after[c]) {
      ++moved;
      ASSERT_EQ(after[c], "node-new") << "chunk " << c << " moved between two old nodes";
    }
  }
  // Expected kChunks/21 = 2381 with sd sqrt(2381·20/21) = 48; 10% is 5 sd.
  const double expected = kChunks / static_cast<double>(kNodes + 1);
  EXPECT_NEAR(moved, expected, 0.1 * expected);
}

TEST(PlacementTest, RemovingANodeMovesOnlyItsChunks) {
  constexpr uint32_t kChunks = 50000;
  std::vector<PlacementNode> nodes = EqualNodes(20);
  const std::vector<std::string> before = PrimaryIds(Make(nodes), kChunks);
  nodes.erase(nodes.begin() + 7);
  const std::vector<std::string> after = PrimaryIds(Make(nodes), kChunks);
  int moved = 0;
  for (uint32_t c = 0; c < kChunks; ++c) {
    if (before[c] == "node-007") {
      ++moved;
      EXPECT_NE(after[c], "node-007");
    } else {
      ASSERT_EQ(before[c], after[c]) << "chunk " << c << " moved though its owner stayed";
    }
  }
  EXPECT_GT(moved, 0);
}

TEST(PlacementTest, WeightChangeMovesChunksOnlyToOrFromThatNode) {
  constexpr uint32_t kChunks = 30000;
  std::vector<PlacementNode> nodes = EqualNodes(15);
  const std::vector<std::string> before = PrimaryIds(Make(nodes), kChunks);
  nodes[5].weight = 3.0;
  const std::vector<std::string> after = PrimaryIds(Make(nodes), kChunks);
  int gained = 0;
  for (uint32_t c = 0; c < kChunks; ++c) {
    if (before[c] != after[c]) {
      ASSERT_EQ(after[c], "node-005");
      ++gained;
    }
  }
  // From 1/15 to 3/17 of the chunks: ~3294 more.
  EXPECT_NEAR(gained, kChunks * (3.0 / 17 - 1.0 / 15), 400);
}

TEST(PlacementTest, ReplicasAreDistinctAndExtendThePrimary) {
  std::vector<PlacementNode> nodes = EqualNodes(9);
  nodes[2].weight = 5;
  nodes[6].weight = 0.25;
  Placement p = Make(nodes);
  std::vector<uint32_t> reused;
  for (ChunkId c = 0; c < 3000; ++c) {
    const std::vector<uint32_t> three = p.Owners(kManifest, c, 3);
    ASSERT_EQ(three.size(), 3u);
    EXPECT_EQ(std::set<uint32_t>(three.begin(), three.end()).size(), 3u);
    EXPECT_EQ(three[0], p.Primary(kManifest, c));
    const std::vector<uint32_t> two = p.Owners(kManifest, c, 2);
    EXPECT_TRUE(std::equal(two.begin(), two.end(), three.begin()));
    // Asking for more replicas than nodes gives every node, in preference order.
    const std::vector<uint32_t> all = p.Owners(kManifest, c, 100);
    ASSERT_EQ(all.size(), 9u);
    EXPECT_TRUE(std::equal(three.begin(), three.end(), all.begin()));
    std::vector<uint32_t> sorted = all;
    std::sort(sorted.begin(), sorted.end());
    for (uint32_t i = 0; i < 9; ++i) EXPECT_EQ(sorted[i], i);
    // More replicas than fit in the inline buffer take the heap path; same order.
    p.OwnersInto(kManifest, c, 9, &reused);
    EXPECT_EQ(reused, all);
    EXPECT_TRUE(p.Owners(kManifest, c, 0).empty());
  }
}

TEST(PlacementTest, ManyReplicasBeyondTheInlineBuffer) {
  Placement p = Make(EqualNodes(40));
  for (ChunkId c = 0; c < 200; ++c) {
    const std::vector<uint32_t> all = p.Owners(kManifest, c, 40);
    const std::vector<uint32_t> some = p.Owners(kManifest, c, 20);
    ASSERT_EQ(all.size(), 40u);
    EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin()));
    EXPECT_EQ(std::set<uint32_t>(all.begin(), all.end()).size(), 40u);
  }
}

TEST(PlacementTest, RemovingANodeKeepsTheOtherReplicas) {
  constexpr uint32_t kChunks = 5000;
  std::vector<PlacementNode> nodes = EqualNodes(12);
  Placement before = Make(nodes);
  nodes.erase(nodes.begin() + 4);
  Placement after = Make(nodes);
  for (ChunkId c = 0; c < kChunks; ++c) {
    const std::vector<std::string> old_ids = before.OwnerIds(kManifest, c, 3);
    const std::vector<std::string> new_ids = after.OwnerIds(kManifest, c, 3);
    std::vector<std::string> survivors;
    for (const std::string& id : old_ids) {
      if (id != "node-004") survivors.push_back(id);
    }
    // The survivors stay owners, in the same order, at the front.
    ASSERT_TRUE(std::equal(survivors.begin(), survivors.end(), new_ids.begin())) << "chunk " << c;
    if (survivors.size() == old_ids.size()) {
      EXPECT_EQ(new_ids, old_ids);
    }
  }
}

TEST(PlacementTest, ChunksOwnedByPartitionsTheChunks) {
  constexpr uint32_t kChunks = 4000;
  std::vector<PlacementNode> nodes = EqualNodes(7);
  nodes[0].weight = 2;
  Placement p = Make(nodes);
  for (uint32_t r : {1u, 2u}) {
    std::vector<int> times(kChunks, 0);
    for (const PlacementNode& n : p.nodes()) {
      Result<std::vector<ChunkId>> owned = p.ChunksOwnedBy(kManifest, kChunks, n.id, r);
      ASSERT_OK(owned);
      EXPECT_TRUE(std::is_sorted(owned->begin(), owned->end()));
      const uint32_t index = *p.IndexOf(n.id);
      for (ChunkId c : *owned) {
        ++times[c];
        const std::vector<uint32_t> o = p.Owners(kManifest, c, r);
        EXPECT_NE(std::find(o.begin(), o.end(), index), o.end());
      }
    }
    for (int t : times) ASSERT_EQ(t, static_cast<int>(r));
  }
}

TEST(PlacementTest, RejectsBadNodes) {
  auto error = [](std::vector<PlacementNode> nodes) {
    Result<Placement> p = Placement::Create(std::move(nodes));
    EXPECT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    return p.status().message();
  };
  EXPECT_NE(error({{"a", 1}, {"", 1}}).find("node #1 (weight 1) has an empty id"),
            std::string::npos);
  EXPECT_NE(error({{"a", 1}, {"b", 1}, {"a", 2}}).find("node id 'a' appears more than once"),
            std::string::npos);
  EXPECT_NE(error({{"a", 0}}).find("node 'a' has weight 0; a weight must be finite and > 0"),
            std::string::npos);
  EXPECT_NE(error({{"a", -3}}).find("weight -3"), std::string::npos);
  EXPECT_NE(error({{"a", std::nan("")}}).find("weight nan"), std::string::npos);
  EXPECT_NE(error({{"a", std::numeric_limits<double>::infinity()}}).find("weight inf"),
            std::string::npos);
}

TEST(PlacementTest, ChunksOwnedByRejectsBadArguments) {
  Placement p = Make(EqualNodes(3));
  EXPECT_EQ(p.ChunksOwnedBy(kManifest, 10, "node-001", 0).status().code(),
            StatusCode::kInvalidArgument);
  Result<std::vector<ChunkId>> unknown = p.ChunksOwnedBy(kManifest, 10, "node-9", 1);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("no node 'node-9'"), std::string::npos);
  EXPECT_EQ(p.ChunksOwnedBy(kManifest, (uint64_t{1} << 32) + 1, "node-001", 1).status().code(),
            StatusCode::kInvalidArgument);
  Result<std::vector<ChunkId>> none = p.ChunksOwnedBy(kManifest, 0, "node-001", 1);
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace granary

#include "granary/core/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <limits>
#include <utility>

#include "granary/core/byte_order.h"
#include "granary/core/metadata_store.h"

// Scores are compared across machines; that only holds with IEEE-754 doubles
// evaluated at their own precision (not x87 80-bit intermediates).
static_assert(std::numeric_limits<double>::is_iec559, "placement needs IEEE-754 doubles");
static_assert(FLT_EVAL_METHOD == 0, "placement needs doubles evaluated as doubles (SSE2 or alike)");

namespace granary {
namespace placement_internal {
namespace {

__extension__ typedef unsigned __int128 U128;
__extension__ typedef __int128 I128;

// ln(num / den) for 1 <= num/den <= 2, as a fraction of 2^64, by
// ln x = 2·atanh(s) = 2·(s + s^3/3 + s^5/5 + ...) with s = (x−1)/(x+1) <= 1/3.
// Only evaluated at compile time, to build the tables below; each of the ~20
// truncated terms loses < 2^-64, far below the 2^-62 the tables keep.
consteval uint64_t LnRatioQ64(U128 num, U128 den) {
  const uint64_t s = static_cast<uint64_t>(((num - den) << 64) / (num + den));
  const uint64_t s2 = static_cast<uint64_t>((static_cast<U128>(s) * s) >> 64);
  uint64_t sum = 0;
  uint64_t power = s;  // s^k
  for (uint64_t k = 1; power != 0; k += 2) {
    sum += power / k;
    power = static_cast<uint64_t>((static_cast<U128>(power) * s2) >> 64);
  }
  return 2 * sum;
}

// ln 2 · 2^64 = 0xb17217f7d1cf79ab.c9e..., rounded. It is multiplied by up to 54,
// so it is kept to 64 bits rather than taken from the series; the series must
// agree with it, which checks the series.
constexpr uint64_t kLn2Q64 = 0xb17217f7d1cf79acull;
static_assert(LnRatioQ64(2, 1) >= kLn2Q64 - 64 && LnRatioQ64(2, 1) <= kLn2Q64);

constexpr int kTableBits = 8;
constexpr size_t kTableSize = size_t{1} << kTableBits;

// For mantissas m in [1 + i/256, 1 + (i+1)/256): kRecipQ63[i] ≈ 2^63 / c_i with
// c_i = 1 + (2i+1)/512 the interval's midpoint, so m·kRecipQ63[i]/2^63 = 1 + z
// with |z| < 2^-9; kLnQ62[i] = ln(2^63 / kRecipQ63[i]) exactly for that integer,
// so the rounding of the reciprocal costs no accuracy.
struct LnTables {
  std::array<uint64_t, kTableSize> recip_q63{};
  std::array<int64_t, kTableSize> ln_q62{};
};

consteval LnTables MakeLnTables() {
  LnTables t;
  for (size_t i = 0; i < kTableSize; ++i) {
    const U128 den = 2 * kTableSize + 2 * i + 1;  // c_i = den / 512
    const U128 recip = ((U128{1} << 72) + den / 2) / den;
    t.recip_q63[i] = static_cast<uint64_t>(recip);
    t.ln_q62[i] = static_cast<int64_t>((LnRatioQ64(U128{1} << 63, recip) + 2) >> 2);
  }
  return t;
}

constexpr LnTables kLn = MakeLnTables();
constexpr int64_t kOneQ62 = int64_t{1} << 62;

constexpr int64_t InverseQ62(int64_t k) { return (kOneQ62 + k / 2) / k; }

// a·b for Q62 fixed-point values, rounded towards −infinity.
inline int64_t MulQ62(int64_t a, int64_t b) {
  return static_cast<int64_t>((static_cast<I128>(a) * b) >> 62);
}

}  // namespace

uint64_t ChunkKey(const ContentId& manifest, ChunkId chunk) {
  std::array<uint8_t, 20> bytes;
  const std::array<uint8_t, 16> id = manifest.ToBytes();
  std::copy(id.begin(), id.end(), bytes.begin());
  StoreLe<uint32_t>(bytes.data() + 16, chunk);
  return Hash64(bytes.data(), bytes.size(), 0);
}

uint64_t NodeKey(std::string_view node_id) { return Hash64(node_id, 0); }

uint64_t PairHash(uint64_t chunk_key, uint64_t node_key) {
  std::array<uint8_t, 16> bytes;
  StoreLe<uint64_t>(bytes.data(), chunk_key);
  StoreLe<uint64_t>(bytes.data() + 8, node_key);
  return Hash64(bytes.data(), bytes.size(), 0);
}

uint64_t NegLogQ56(uint64_t t) {
  // u = (t + 1/2)/2^53 = v/2^54 with v odd, and v = 2^e·m with m in [1, 2), so
  // −ln u = (54 − e)·ln 2 − ln m.
  const uint64_t v = 2 * (t & ((uint64_t{1} << 53) - 1)) + 1;
  const int e = static_cast<int>(std::bit_width(v)) - 1;
  const uint64_t m_q63 = v << (63 - e);
  const size_t i = static_cast<size_t>(m_q63 >> (63 - kTableBits)) & (kTableSize - 1);
  const U128 scaled = static_cast<U128>(m_q63) * kLn.recip_q63[i];  // (1 + z)·2^126
  const int64_t z = static_cast<int64_t>(static_cast<I128>(scaled - (U128{1} << 126)) >> 64);
  // ln(1 + z) = z − z²/2 + z³/3 − z⁴/4 + z⁵/5 − z⁶/6 + O(z⁷); |z| < 2^-9 makes the
  // dropped terms < 2^-65.
  int64_t p = -InverseQ62(6);
  p = InverseQ62(5) + MulQ62(z, p);
  p = -InverseQ62(4) + MulQ62(z, p);
  p = InverseQ62(3) + MulQ62(z, p);
  p = -InverseQ62(2) + MulQ62(z, p);
  p = kOneQ62 + MulQ62(z, p);
  const int64_t ln_m = MulQ62(z, p) + kLn.ln_q62[i];
  const I128 neg_ln_u = static_cast<I128>(54 - e) * kLn2Q64 - static_cast<I128>(ln_m) * 4;  // Q64
  const I128 q56 = (neg_ln_u + 128) >> 8;
  return q56 < 1 ? 1 : static_cast<uint64_t>(q56);
}

}  // namespace placement_internal

namespace {

using placement_internal::ChunkKey;
using placement_internal::NegLogQ56;
using placement_internal::NodeKey;
using placement_internal::PairHash;

// More than this many replicas needs a heap buffer for the running top list.
constexpr size_t kInlineReplicas = 16;

struct Candidate {
  double score = 0;
  uint32_t index = 0;  // nodes are sorted by id, so a smaller index is a smaller id
};

inline bool Better(const Candidate& a, const Candidate& b) {
  return a.score > b.score || (a.score == b.score && a.index < b.index);
}

// Sets *out to node `index`'s candidate for the chunk and returns true, or returns
// false when it cannot beat `bar` (the current worst of the running top list;
// null while the list is not full).
inline bool Score(uint64_t chunk_key, uint64_t node_key, double weight, uint32_t index,
                  const Candidate* bar, Candidate* out) {
  const uint64_t t = PairHash(chunk_key, node_key) >> 11;
  if (bar != nullptr) {
    // Most nodes lose to the bar by far, so skip their logarithm: −ln u >= 1 − u
    // and NegLogQ56 is within one unit of −ln(u)·2^56, so e >= (1 − u)·2^56 − 2.
    // The score with that floor bounds the real one from above through the same
    // monotone rounded operations, so skipping on it never changes the result.
    const uint64_t e_floor = (uint64_t{1} << 56) - 8 * t - 6;
    if (weight / static_cast<double>(e_floor) < bar->score) return false;
  }
  *out = Candidate{weight / static_cast<double>(NegLogQ56(t)), index};
  return true;
}

}  // namespace

Placement::Placement(std::vector<PlacementNode> nodes) : nodes_(std::move(nodes)) {
  node_keys_.reserve(nodes_.size());
  for (const PlacementNode& n : nodes_) node_keys_.push_back(NodeKey(n.id));
}

Result<Placement> Placement::Create(std::vector<PlacementNode> nodes) {
  if (nodes.size() > std::numeric_limits<uint32_t>::max()) {
    return Status::InvalidArgument(
        fmt::format("placement: {} nodes is more than the {} a pool can have; split the pool",
                    nodes.size(), std::numeric_limits<uint32_t>::max()));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const PlacementNode& n = nodes[i];
    if (n.id.empty()) {
      return Status::InvalidArgument(
          fmt::format("placement: node #{} (weight {}) has an empty id; give every node a unique, "
                      "non-empty id",
                      i, n.weight));
    }
    if (!std::isfinite(n.weight) || !(n.weight > 0)) {
      return Status::InvalidArgument(
          fmt::format("placement: node '{}' has weight {}; a weight must be finite and > 0 "
                      "(e.g. the node's chunk store capacity in bytes)",
                      n.id, n.weight));
    }
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const PlacementNode& a, const PlacementNode& b) { return a.id < b.id; });
  for (size_t i = 1; i < nodes.size(); ++i) {
    if (nodes[i].id == nodes[i - 1].id) {
      return Status::InvalidArgument(fmt::format(
          "placement: node id '{}' appears more than once; node ids must be unique in a pool",
          nodes[i].id));
    }
  }
  return Placement(std::move(nodes));
}

Result<uint32_t> Placement::IndexOf(std::string_view node_id) const {
  auto it = std::lower_bound(nodes_.begin(), nodes_.end(), node_id,
                             [](const PlacementNode& n, std::string_view id) { return n.id < id; });
  if (it == nodes_.end() || it->id != node_id) {
    return Status::NotFound(fmt::format(
        "placement: no node '{}' among the {} nodes of the pool; check the node id or the "
        "pool's membership",
        node_id, nodes_.size()));
  }
  return static_cast<uint32_t>(it - nodes_.begin());
}

uint32_t Placement::Primary(const ContentId& manifest, ChunkId chunk) const {
  if (nodes_.empty()) return kNoOwner;
  const uint64_t chunk_key = ChunkKey(manifest, chunk);
  Candidate best;
  Score(chunk_key, node_keys_[0], nodes_[0].weight, 0, nullptr, &best);
  for (uint32_t i = 1; i < nodes_.size(); ++i) {
    Candidate c;
    if (Score(chunk_key, node_keys_[i], nodes_[i].weight, i, &best, &c) && Better(c, best)) {
      best = c;
    }
  }
  return best.index;
}

void Placement::OwnersInto(const ContentId& manifest, ChunkId chunk, uint32_t replication,
                           std::vector<uint32_t>* owners) const {
  owners->clear();
  const size_t r = std::min<size_t>(replication, nodes_.size());
  if (r == 0) return;
  if (r == 1) {
    owners->push_back(Primary(manifest, chunk));
    return;
  }
  std::array<Candidate, kInlineReplicas> inline_top;
  std::vector<Candidate> heap_top;
  Candidate* top = inline_top.data();
  if (r > kInlineReplicas) {
    heap_top.resize(r);
    top = heap_top.data();
  }
  // top[0, filled) is kept sorted best first; a candidate that does not beat the
  // current r-th costs one comparison, which is the common case.
  const uint64_t chunk_key = ChunkKey(manifest, chunk);
  size_t filled = 0;
  for (uint32_t i = 0; i < nodes_.size(); ++i) {
    Candidate c;
    const Candidate* bar = filled < r ? nullptr : &top[r - 1];
    if (!Score(chunk_key, node_keys_[i], nodes_[i].weight, i, bar, &c)) continue;
    size_t pos;
    if (filled < r) {
      pos = filled++;
    } else if (Better(c, top[r - 1])) {
      pos = r - 1;
    } else {
      continue;
    }
    while (pos > 0 && Better(c, top[pos - 1])) {
      top[pos] = top[pos - 1];
      --pos;
    }
    top[pos] = c;
  }
  for (size_t k = 0; k < r; ++k) owners->push_back(top[k].index);
}

std::vector<uint32_t> Placement::Owners(const ContentId& manifest, ChunkId chunk,
                                        uint32_t replication) const {
  std::vector<uint32_t> owners;
  OwnersInto(manifest, chunk, replication, &owners);
  return owners;
}

std::vector<std::string> Placement::OwnerIds(const ContentId& manifest, ChunkId chunk,
                                             uint32_t replication) const {
  std::vector<std::string> ids;
  for (uint32_t i : Owners(manifest, chunk, replication)) ids.push_back(nodes_[i].id);
  return ids;
}

Result<std::vector<ChunkId>> Placement::ChunksOwnedBy(const ContentId& manifest,
                                                      uint64_t chunk_count,
                                                      std::string_view node_id,
                                                      uint32_t replication) const {
  if (replication == 0) {
    return Status::InvalidArgument(fmt::format(
        "placement: replication 0 for node '{}' means no chunk has an owner; use 1 or more",
        node_id));
  }
  constexpr uint64_t kMaxChunks = uint64_t{std::numeric_limits<ChunkId>::max()} + 1;
  if (chunk_count > kMaxChunks) {
    return Status::InvalidArgument(
        fmt::format("placement: chunk count {} exceeds the {} that 32-bit chunk ids can name",
                    chunk_count, kMaxChunks));
  }
  GRANARY_ASSIGN_OR_RETURN(const uint32_t node, IndexOf(node_id));
  std::vector<ChunkId> chunks;
  std::vector<uint32_t> owners;
  for (uint64_t c = 0; c < chunk_count; ++c) {
    const ChunkId chunk = static_cast<ChunkId>(c);
    bool owned;
    if (replication == 1) {
      owned = Primary(manifest, chunk) == node;
    } else {
      OwnersInto(manifest, chunk, replication, &owners);
      owned = std::find(owners.begin(), owners.end(), node) != owners.end();
    }
    if (owned) chunks.push_back(chunk);
  }
  return chunks;
}

Result<Placement> PlacementOverNodes(const std::vector<NodeRecord>& nodes) {
  std::vector<PlacementNode> placement_nodes;
  placement_nodes.reserve(nodes.size());
  for (const NodeRecord& n : nodes) {
    placement_nodes.push_back(
        PlacementNode{n.id, n.capacity_bytes > 0 ? static_cast<double>(n.capacity_bytes) : 1.0});
  }
  return Placement::Create(std::move(placement_nodes));
}

}  // namespace granary

#include "granary/cachenode/cache_budget.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace granary {
namespace {

// Ranks from the first served to the last: pinned, then priority, then in use.
auto RankKey(const CacheClaim& c) {
  return std::make_tuple(c.cache.pinned ? 0 : 1, -static_cast<int64_t>(c.cache.priority),
                         c.in_use ? 0 : 1);
}

// Gives each of `members` (indices into wants/granted) up to its want, out of
// `*left`, the least wanting first and the rest in equal parts (max-min fair).
void FairSplit(std::vector<size_t> members, const std::vector<uint64_t>& wants,
               std::vector<uint64_t>& granted, uint64_t* left) {
  std::sort(members.begin(), members.end(),
            [&](size_t a, size_t b) { return wants[a] - granted[a] < wants[b] - granted[b]; });
  for (size_t k = 0; k < members.size(); ++k) {
    const size_t i = members[k];
    const uint64_t equal = *left / (members.size() - k);
    const uint64_t give = std::min(wants[i] - granted[i], equal);
    granted[i] += give;
    *left -= give;
  }
}

}  // namespace

std::string_view CacheCutName(CacheCut cut) {
  switch (cut) {
    case CacheCut::kNone:
      return "none";
    case CacheCut::kLimit:
      return "limit";
    case CacheCut::kTtl:
      return "ttl";
    case CacheCut::kPriority:
      return "priority";
    case CacheCut::kFairShare:
      return "fair_share";
  }
  return "unknown";
}

uint64_t ScaledLimit(uint64_t share_bytes, const DatasetCacheSpec& cache, uint64_t dataset_bytes,
                     uint32_t replicas) {
  if (!cache.max_resident_bytes.has_value()) return share_bytes;
  const long double whole =
      static_cast<long double>(dataset_bytes) * static_cast<long double>(std::max(1u, replicas));
  if (whole <= 0 || static_cast<long double>(*cache.max_resident_bytes) >= whole) {
    return share_bytes;
  }
  const long double part = static_cast<long double>(share_bytes) *
                           static_cast<long double>(*cache.max_resident_bytes) / whole;
  return std::min(share_bytes, static_cast<uint64_t>(part));
}

std::vector<CacheGrant> AllocateCacheBudgets(std::span<const CacheClaim> claims,
                                             uint64_t capacity_bytes) {
  const size_t n = claims.size();
  std::vector<uint64_t> wants(n);
  for (size_t i = 0; i < n; ++i) {
    const CacheClaim& c = claims[i];
    wants[i] = (c.expired && !c.cache.pinned) ? 0 : std::min(c.limit_bytes, c.share_bytes);
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto ka = RankKey(claims[a]);
    const auto kb = RankKey(claims[b]);
    if (ka != kb) return ka < kb;
    // Idle ones of a rank: the most recently used first (the least recently
    // read loses first). In-use ones split fairly, in any order.
    return claims[a].last_used_ms > claims[b].last_used_ms;
  });

  std::vector<uint64_t> granted(n, 0);
  uint64_t left = capacity_bytes;
  // Floors: pinned claims whole, then everyone's minimum, in rank order.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i : order) {
      const CacheClaim& c = claims[i];
      uint64_t floor = 0;
      if (pass == 0 && c.cache.pinned) floor = wants[i];
      if (pass == 1) {
        floor =
            static_cast<uint64_t>(static_cast<long double>(wants[i]) *
                                  static_cast<long double>(c.cache.min_resident_percent) / 100.0L);
      }
      const uint64_t give = std::min(floor > granted[i] ? floor - granted[i] : 0, left);
      granted[i] += give;
      left -= give;
    }
  }
  // The rest by rank, group by group.
  for (size_t g = 0; g < n && left > 0;) {
    size_t end = g;
    while (end < n && RankKey(claims[order[end]]) == RankKey(claims[order[g]])) ++end;
    std::vector<size_t> members(order.begin() + static_cast<std::ptrdiff_t>(g),
                                order.begin() + static_cast<std::ptrdiff_t>(end));
    if (claims[order[g]].in_use) {
      FairSplit(std::move(members), wants, granted, &left);
    } else {
      for (size_t i : members) {
        const uint64_t give = std::min(wants[i] - granted[i], left);
        granted[i] += give;
        left -= give;
      }
    }
    g = end;
  }

  // Why each is below its share: the first cause in the policy's order.
  std::vector<CacheGrant> grants(n);
  for (size_t i = 0; i < n; ++i) {
    const CacheClaim& c = claims[i];
    CacheGrant& grant = grants[i];
    grant.dataset = c.dataset;
    grant.bytes = granted[i];
    if (granted[i] >= c.share_bytes) continue;
    if (c.expired && !c.cache.pinned) {
      grant.cut = CacheCut::kTtl;
    } else if (granted[i] >= wants[i]) {
      grant.cut = CacheCut::kLimit;
    } else {
      // Someone of its own rank got more than it: the space was split;
      // otherwise those ranked above took it.
      bool split = false;
      for (size_t j = 0; j < n && !split; ++j) {
        split = j != i && RankKey(claims[j]) == RankKey(c) && c.in_use && granted[j] > 0;
      }
      grant.cut = split ? CacheCut::kFairShare : CacheCut::kPriority;
    }
  }
  return grants;
}

}  // namespace granary

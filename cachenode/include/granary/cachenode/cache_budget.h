#pragma once

// How a cache node shares its capacity among the datasets it stages when
// their shares do not all fit (docs/cachenode.md, "When the cache is full").
//
// Every dataset here claims the bytes of its share (the chunk files of the
// chunks this node owns), capped by its limit (DatasetCacheSpec::
// max_resident_bytes, scaled to this node's share). AllocateCacheBudgets
// grants each a budget, in bytes of chunk files, so that the grants add up to
// at most the capacity:
//  1. A dataset past its TTL (not read for ttl_seconds, not pinned) gets 0.
//  2. Floors first: a pinned dataset's whole claim, then every dataset's
//     min_resident_percent of its claim, in rank order, as far as they go.
//  3. Then the rest, by rank: pinned before not; higher priority before
//     lower; in use (a plan registered or a read within the idle window)
//     before idle. In-use datasets of one priority that do not all fit split
//     what is left fairly (max-min: none gets more than it claims, the rest
//     equally); idle ones of one priority are served most recently read
//     first, so the least recently read loses first.
// The function is pure (the daemon gathers the claims and applies the
// grants), so the policy is tested without a cluster.
//
// A dataset keeps the chunks its plans read first that fit its budget and
// reads the rest from the source when asked (Stager::SetBudget): its budget
// shrinking evicts its last kept chunks, growing stages the next ones. Each
// grant says why it is below the claim, for the eviction metrics and the
// dataset's status.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/metadata_store.h"

namespace granary {

// Why a dataset keeps less than its share.
enum class CacheCut : uint8_t {
  kNone,       // it keeps its whole claim
  kLimit,      // its max_resident_bytes (a namespace quota) caps it
  kTtl,        // not read for longer than its TTL
  kPriority,   // datasets ranked above it took the space
  kFairShare,  // datasets of its own rank in use split the space with it
};

// "none", "limit", "ttl", "priority", "fair_share" (the metrics' reason label).
std::string_view CacheCutName(CacheCut cut);

struct CacheClaim {
  std::string dataset;
  DatasetCacheSpec cache;
  uint64_t share_bytes = 0;  // chunk-file bytes of this node's share
  uint64_t limit_bytes = 0;  // share_bytes capped by max_resident_bytes (scaled)
  bool in_use = false;       // a plan registered or read within the idle window
  bool expired = false;      // not read within cache.ttl_seconds
  int64_t last_used_ms = 0;  // latest read (any node), plan or creation
};

struct CacheGrant {
  std::string dataset;
  uint64_t bytes = 0;
  CacheCut cut = CacheCut::kNone;
};

// One grant per claim, in the claims' order.
std::vector<CacheGrant> AllocateCacheBudgets(std::span<const CacheClaim> claims,
                                             uint64_t capacity_bytes);

// The part of a share a byte limit over the whole pool allows this node:
// share × limit / (dataset_bytes × replicas), at most the share.
uint64_t ScaledLimit(uint64_t share_bytes, const DatasetCacheSpec& cache, uint64_t dataset_bytes,
                     uint32_t replicas);

}  // namespace granary

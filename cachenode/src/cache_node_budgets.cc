// The cache node's share of its capacity among the datasets it stages
// (cache_node_impl.h; docs/cachenode.md, "When the cache is full"): each
// pass gathers every active dataset's claim, asks the policy
// (cache_budget.h) for the budgets and applies them, shrinks (and what they
// drop, counted as evictions) before growths.

#include <algorithm>

#include "cache_node_impl.h"

namespace granary {

using cache_node_internal::Plural;

namespace {

std::string CutReason(CacheCut cut) {
  switch (cut) {
    case CacheCut::kLimit:
      return "its max_resident_bytes (its namespace's quota) allows no more";
    case CacheCut::kTtl:
      return "it was not read within its TTL";
    case CacheCut::kPriority:
      return "datasets ranked above it (pinned, of higher priority, or in use) need the space";
    case CacheCut::kFairShare:
      return "datasets in use of the same priority share the node";
    case CacheCut::kNone:
      break;
  }
  return "the node is full";
}

size_t EvictionReasonIndex(CacheCut cut) {
  const std::string_view name = CacheCutName(cut);
  for (size_t i = 0; i < kEvictionReasons.size(); ++i) {
    if (kEvictionReasons[i] == name) return i;
  }
  return 2;  // "priority": someone else needed the space
}

}  // namespace

void CacheNode::Impl::ApplyCacheBudgets() {
  std::vector<std::shared_ptr<ActiveDataset>> active;
  {
    std::lock_guard<std::mutex> lock(datasets_mu_);
    for (const auto& entry : datasets_) active.push_back(entry.second);
  }
  if (active.empty()) return;
  const int64_t now = cache_node_internal::NowMs();
  const int64_t idle_after = config_.cache_idle_after.count();
  std::vector<CacheClaim> claims;
  claims.reserve(active.size());
  for (const std::shared_ptr<ActiveDataset>& ds : active) {
    const StagerProgress p = ds->stager->Progress();
    CacheClaim c;
    c.dataset = ds->name;
    c.cache = ds->record.spec.cache;
    c.share_bytes = p.file_bytes_owned;
    c.limit_bytes = ScaledLimit(c.share_bytes, c.cache, ds->manifest->total_bytes(),
                                std::max<uint32_t>(1, ds->record.spec.replication));
    const int64_t read = std::max(p.last_read_ms, ds->pool_last_read_ms);
    const int64_t asked = std::max(read, ds->last_plan_ms);
    c.last_used_ms = std::max({asked, ds->record.created_ms, ds->activated_ms});
    c.in_use = asked > 0 && now - asked < idle_after;
    c.expired = c.cache.ttl_seconds > 0 &&
                now - c.last_used_ms > static_cast<int64_t>(c.cache.ttl_seconds) * 1000;
    claims.push_back(std::move(c));
  }
  const std::vector<CacheGrant> grants = AllocateCacheBudgets(claims, chunks_->capacity());

  // Shrinks first, so that what they free is there for the growths.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < active.size(); ++i) {
      ActiveDataset& ds = *active[i];
      const CacheGrant& grant = grants[i];
      const std::optional<uint64_t> budget =
          grant.bytes >= claims[i].share_bytes ? std::nullopt : std::optional(grant.bytes);
      const bool shrinks = budget.has_value() && (!ds.budget.has_value() || *budget < *ds.budget);
      if (pass == 0) {
        if (shrinks) ds.stager->SetBudget(budget);
        if (!budget.has_value()) continue;
        // Also what an earlier pass could not drop (a writer held it).
        const Stager::Dropped dropped = ds.stager->DropNotKept();
        if (dropped.chunks == 0) continue;
        const size_t reason = EvictionReasonIndex(grant.cut);
        ds.metrics.evicted_chunks[reason]->Increment(static_cast<double>(dropped.chunks));
        ds.metrics.evicted_bytes[reason]->Increment(static_cast<double>(dropped.file_bytes));
        log_->info("dataset {}: dropped {} ({} bytes) it no longer keeps here: {}", Quoted(ds.name),
                   Plural(dropped.chunks, "chunk"), dropped.file_bytes, CutReason(grant.cut));
        continue;
      }
      if (!shrinks && budget != ds.budget) {
        ds.stager->SetBudget(budget);
        if (ds.stager->Progress().state == StagingState::kCapacity) ds.stager->Resume();
      }
      if (budget != ds.budget || grant.cut != ds.cut) {
        if (budget.has_value()) {
          log_->info("dataset {}: keeps {} of the {} bytes of its share here: {}", Quoted(ds.name),
                     *budget, claims[i].share_bytes, CutReason(grant.cut));
        } else if (ds.budget.has_value()) {
          log_->info("dataset {}: keeps its whole share here again", Quoted(ds.name));
        }
      }
      ds.budget = budget;
      ds.cut = grant.cut;
    }
  }
}

}  // namespace granary

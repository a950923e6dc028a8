#include "granary/posix/readahead.h"

#include <algorithm>
#include <utility>

#include "granary/core/names.h"
#include "granary/core/plan.h"

namespace granary::posix {

std::shared_ptr<const ReadaheadOrder> ReadaheadOrder::ManifestOrder(size_t sample_count) {
  std::shared_ptr<ReadaheadOrder> order(new ReadaheadOrder());
  order->size_ = sample_count;
  order->sample_count_ = sample_count;
  order->description_ = "manifest order";
  return order;
}

Result<std::shared_ptr<const ReadaheadOrder>> ReadaheadOrder::FromPlan(const Manifest& manifest,
                                                                       const PlanRecord& plan) {
  const std::string what = "following plan " + Quoted(plan.plan_id) + " for readahead";
  Result<PlanSpec> spec = ToPlanSpec(plan, plan.first_epoch, 0);
  if (!spec.ok()) return spec.status().WithContext(what);
  Result<std::vector<SampleId>> epoch = EpochOrder(manifest, *spec);
  if (!epoch.ok()) return epoch.status().WithContext(what);
  Result<std::vector<SampleId>> first = FirstReadOrder(*epoch, *spec);
  if (!first.ok()) return first.status().WithContext(what);
  std::shared_ptr<ReadaheadOrder> order(new ReadaheadOrder());
  order->sample_count_ = manifest.sample_count();
  order->order_ = std::move(*first);
  order->size_ = order->order_.size();
  order->position_.assign(manifest.sample_count(), static_cast<uint32_t>(order->size_));
  for (size_t p = 0; p < order->order_.size(); ++p) {
    order->position_[order->order_[p]] = static_cast<uint32_t>(p);
  }
  order->description_ =
      "plan " + Quoted(plan.plan_id) + " (epoch " + std::to_string(plan.first_epoch) + ")";
  return std::shared_ptr<const ReadaheadOrder>(std::move(order));
}

Result<std::shared_ptr<const ReadaheadOrder>> ReadaheadOrder::Choose(
    const Manifest& manifest, const std::vector<PlanRecord>& plans) {
  const PlanRecord* newest = nullptr;
  for (const PlanRecord& p : plans) {
    if (newest == nullptr || p.registered_ms > newest->registered_ms) newest = &p;
  }
  if (newest == nullptr) return ManifestOrder(manifest.sample_count());
  return FromPlan(manifest, *newest);
}

uint64_t ReadaheadOrder::PositionOf(SampleId id) const {
  if (id >= sample_count_) return size_;
  return position_.empty() ? id : position_[id];
}

SampleId ReadaheadOrder::At(uint64_t position) const {
  return order_.empty() ? static_cast<SampleId>(position) : order_[position];
}

Readahead::Readahead(std::shared_ptr<const ReadaheadOrder> order, const Manifest* manifest,
                     ReadaheadOptions options)
    : order_(std::move(order)), manifest_(manifest), options_(options) {}

std::vector<SampleId> Readahead::OnOpen(SampleId id) {
  std::vector<SampleId> hints;
  if (options_.window_samples == 0 || options_.window_bytes == 0) return hints;
  const uint64_t p = order_->PositionOf(id);
  if (p >= order_->size()) return hints;
  const uint64_t window = options_.window_samples;
  std::lock_guard<std::mutex> lock(mu_);
  const bool inside = p + 1 >= hinted_begin_ && p < hinted_end_ + window / 2;
  uint64_t from;
  if (!inside && opened_) {
    // A jump: hint nothing yet, and start over from here once a read follows
    // (a reader in another order would otherwise be sent a window per file).
    hinted_begin_ = p;
    hinted_end_ = p + 1;
    return hints;
  }
  opened_ = true;
  if (!inside) {
    from = p + 1;  // the first open
  } else if (p + 1 + window / 2 < hinted_end_) {
    return hints;  // more than half a window is still ahead
  } else {
    from = std::max(hinted_end_, p + 1);
  }
  const uint64_t limit = std::min(order_->size(), p + 1 + window);
  uint64_t bytes = 0;
  uint64_t end = from;
  for (; end < limit && bytes < options_.window_bytes; ++end) {
    const SampleId next = order_->At(end);
    hints.push_back(next);
    bytes += manifest_->SizeOf(next);
  }
  if (!inside) hinted_begin_ = p;
  hinted_end_ = std::max(end, from);
  return hints;
}

}  // namespace granary::posix

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
  return FromPlan(manifest, plan, plan.first_epoch);
}

Result<std::shared_ptr<const ReadaheadOrder>> ReadaheadOrder::FromPlan(const Manifest& manifest,
                                                                       const PlanRecord& plan,
                                                                       uint64_t epoch_number) {
  const std::string what = "following plan " + Quoted(plan.plan_id) + " (epoch " +
                           std::to_string(epoch_number) + ") for readahead";
  Result<PlanSpec> spec = ToPlanSpec(plan, epoch_number, 0);
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
      "plan " + Quoted(plan.plan_id) + " (epoch " + std::to_string(epoch_number) + ")";
  order->plan_id_ = plan.plan_id;
  order->epoch_ = epoch_number;
  return std::shared_ptr<const ReadaheadOrder>(std::move(order));
}

std::shared_ptr<const ReadaheadOrder> ReadaheadOrder::Match(const Manifest& manifest,
                                                            const std::vector<PlanRecord>& plans,
                                                            std::span<const SampleId> recent,
                                                            const std::string& prefer_plan,
                                                            uint64_t prefer_epoch) {
  if (recent.size() < 2) return nullptr;
  std::vector<const PlanRecord*> newest_first;
  for (const PlanRecord& p : plans) newest_first.push_back(&p);
  std::stable_sort(
      newest_first.begin(), newest_first.end(),
      [](const PlanRecord* a, const PlanRecord* b) { return a->registered_ms > b->registered_ms; });
  for (const PlanRecord* plan : newest_first) {
    std::vector<uint64_t> epochs;
    auto add = [&epochs](uint64_t e) {
      if (epochs.size() < kMatchEpochs &&
          std::find(epochs.begin(), epochs.end(), e) == epochs.end()) {
        epochs.push_back(e);
      }
    };
    if (plan->plan_id == prefer_plan) add(prefer_epoch);
    add(plan->first_epoch);
    add(uint64_t{plan->first_epoch} + 1);
    for (uint64_t e = 0; epochs.size() < kMatchEpochs; ++e) add(e);
    for (uint64_t e : epochs) {
      Result<std::shared_ptr<const ReadaheadOrder>> order = FromPlan(manifest, *plan, e);
      if (!order.ok()) break;  // the plan itself is refused: every epoch would be
      if ((*order)->Fits(recent)) return *order;
    }
  }
  std::shared_ptr<const ReadaheadOrder> ids = ManifestOrder(manifest.sample_count());
  return ids->Fits(recent) ? ids : nullptr;
}

bool ReadaheadOrder::Fits(std::span<const SampleId> recent) const {
  if (recent.empty()) return false;
  uint64_t lowest = size_;
  uint64_t highest = 0;
  for (SampleId id : recent) {
    const uint64_t p = PositionOf(id);
    if (p >= size_) return false;
    lowest = std::min(lowest, p);
    highest = std::max(highest, p);
  }
  return highest - lowest <= 4 * static_cast<uint64_t>(recent.size()) + 64;
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
    : manifest_(manifest), options_(options), order_(std::move(order)) {}

void Readahead::SetOrder(std::shared_ptr<const ReadaheadOrder> order) {
  std::lock_guard<std::mutex> lock(mu_);
  order_ = std::move(order);
  hinted_begin_ = 0;
  hinted_end_ = 0;
  opened_ = false;
}

std::vector<SampleId> Readahead::OnOpen(SampleId id) {
  std::vector<SampleId> hints;
  if (options_.window_samples == 0 || options_.window_bytes == 0) return hints;
  const uint64_t window = options_.window_samples;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t p = order_->PositionOf(id);
  if (p >= order_->size()) return hints;
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

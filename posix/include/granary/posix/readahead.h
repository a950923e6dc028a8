#pragma once

// Readahead for unmodified readers of the POSIX view (docs/posix-view.md):
// when a file is opened, the samples likely to be read next are hinted to the
// ContentReader, so the sidecar fetches them (whole chunks' worth, batched
// per cache node) before they are asked for.
//
//  - ReadaheadOrder: the order followed. Manifest order (ids ascending, which
//    is chunk order: a tree walk reads directories in the order the manifest
//    packed them), or the first-read order of a plan registered for the
//    dataset (a Granary sampler in use: every rank's epoch order, as cache
//    nodes stage it).
//    A reader may follow another epoch of a plan than the one registered
//    last (a job starting over at epoch 0, the next epoch, a second job):
//    ReadaheadOrder::Match finds, among the registered plans' epochs and
//    manifest order, one in which the reader's recent first reads lie close
//    together, and the view switches to it (posix_view.h).
//  - Readahead: the window. On an open at position p it hints what lies
//    between what it hinted already and p + window (at most window_samples
//    samples and window_bytes bytes ahead), once the reader is within half a
//    window of the end of what was hinted. The first open hints a window; a
//    later jump outside the window hints nothing, and the next open that
//    follows it starts over from there (a reader in another order, such as a
//    shuffled epoch that is not the plan followed, is not sent a window of
//    hints per file). Hints are therefore sent in batches of about half a
//    window.
//
// Who calls it: PosixView (open); `granary mount` picks the order.
//
// Thread safety: ReadaheadOrder is immutable. Readahead::OnOpen and SetOrder
// may be called from any number of threads (one mutex).

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/core/status.h"

namespace granary::posix {

class ReadaheadOrder {
 public:
  // Ids ascending.
  static std::shared_ptr<const ReadaheadOrder> ManifestOrder(size_t sample_count);
  // FirstReadOrder of `plan` at its first epoch (or at `epoch`, an absolute
  // epoch number). kInvalidArgument for a plan the core refuses.
  static Result<std::shared_ptr<const ReadaheadOrder>> FromPlan(const Manifest& manifest,
                                                                const PlanRecord& plan);
  static Result<std::shared_ptr<const ReadaheadOrder>> FromPlan(const Manifest& manifest,
                                                                const PlanRecord& plan,
                                                                uint64_t epoch);
  // The most recently registered plan's order if `plans` has one, else
  // manifest order.
  static Result<std::shared_ptr<const ReadaheadOrder>> Choose(const Manifest& manifest,
                                                              const std::vector<PlanRecord>& plans);

  // The first order that Fits `recent` among: each plan's epochs (newest
  // plan first; for each, `prefer_epoch` if it is the plan `prefer_plan`,
  // then its first epoch and the one after, then epochs 0, 1, ...; at most
  // kMatchEpochs per plan), then manifest order. Null when none fits (or
  // `recent` has fewer than 2 ids). Plans the core refuses are skipped.
  static constexpr uint32_t kMatchEpochs = 16;
  static std::shared_ptr<const ReadaheadOrder> Match(const Manifest& manifest,
                                                     const std::vector<PlanRecord>& plans,
                                                     std::span<const SampleId> recent,
                                                     const std::string& prefer_plan = "",
                                                     uint64_t prefer_epoch = 0);
  // Whether first reads `recent` lie close together in this order: all in
  // it, within a span of 4 positions per read plus 64 (several reader
  // threads or DataLoader workers read a little out of order).
  bool Fits(std::span<const SampleId> recent) const;

  // Positions 0..size()-1; a sample the order does not hold (dropped by
  // drop_last) has position size().
  uint64_t size() const { return size_; }
  uint64_t PositionOf(SampleId id) const;
  SampleId At(uint64_t position) const;
  // "manifest order" or "plan <id> (epoch E)".
  const std::string& description() const { return description_; }
  // The plan and epoch followed; "" and 0 for manifest order.
  const std::string& plan_id() const { return plan_id_; }
  uint64_t epoch() const { return epoch_; }

 private:
  ReadaheadOrder() = default;
  uint64_t size_ = 0;
  uint64_t sample_count_ = 0;
  std::vector<SampleId> order_;     // empty: identity
  std::vector<uint32_t> position_;  // by sample id; empty: identity
  std::string description_;
  std::string plan_id_;
  uint64_t epoch_ = 0;
};

struct ReadaheadOptions {
  uint32_t window_samples = 256;
  uint64_t window_bytes = 64ull << 20;
};

class Readahead {
 public:
  Readahead(std::shared_ptr<const ReadaheadOrder> order, const Manifest* manifest,
            ReadaheadOptions options);

  // Sample `id` was opened: the ids to hint now (often none), in order.
  std::vector<SampleId> OnOpen(SampleId id);
  // Follow `order` from now on (as if nothing had been opened yet).
  void SetOrder(std::shared_ptr<const ReadaheadOrder> order);

 private:
  const Manifest* const manifest_;
  const ReadaheadOptions options_;

  std::mutex mu_;  // guards the four below
  std::shared_ptr<const ReadaheadOrder> order_;
  uint64_t hinted_begin_ = 0;  // positions [hinted_begin_, hinted_end_) were hinted
  uint64_t hinted_end_ = 0;
  bool opened_ = false;  // an open was seen
};

}  // namespace granary::posix

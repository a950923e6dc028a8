// PosixView's pins and its ahead thread: the pins kept between the reads of a
// file (no_open mode), the samples pinned ahead of their first reads, and the
// search for the order a reader follows (ReadaheadOrder::Match). The FUSE
// callbacks (fuse_callbacks.cc) call FindPin, KeepPin and OnFirstRead.
#include <algorithm>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/posix/posix_view.h"

namespace granary::posix {

std::shared_ptr<PinnedSample> PosixView::FindPin(SampleId id, bool reaches_end, bool* ahead) {
  std::lock_guard<std::mutex> lock(pins_mu_);
  auto it = pins_.find(id);
  *ahead = false;
  if (it == pins_.end()) return nullptr;
  std::shared_ptr<PinnedSample> pin = it->second->pin;
  if (it->second->ahead_bytes > 0) {
    *ahead = true;
    ahead_bytes_ -= it->second->ahead_bytes;
    it->second->ahead_bytes = 0;
    counters_.pinned_ahead_used.fetch_add(1, std::memory_order_relaxed);
  }
  if (reaches_end) {
    pin_order_.erase(it->second);
    pins_.erase(it);
  }
  return pin;
}

void PosixView::KeepPin(SampleId id, std::shared_ptr<PinnedSample> pin, uint64_t ahead_bytes) {
  std::vector<std::shared_ptr<PinnedSample>> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(pins_mu_);
  if (pins_.count(id) != 0) return;
  pin_order_.push_back(KeptPin{id, std::move(pin), std::chrono::steady_clock::now(), ahead_bytes});
  pins_.emplace(id, std::prev(pin_order_.end()));
  ahead_bytes_ += ahead_bytes;
  while (pins_.size() > max_pins_) {
    ahead_bytes_ -= pin_order_.front().ahead_bytes;
    pins_.erase(pin_order_.front().id);
    dropped.push_back(std::move(pin_order_.front().pin));
    pin_order_.pop_front();
  }
}

void PosixView::ExpirePins() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<PinnedSample>> dropped;
  std::lock_guard<std::mutex> lock(pins_mu_);
  while (!pin_order_.empty() && now - pin_order_.front().kept >= kPinIdle) {
    ahead_bytes_ -= pin_order_.front().ahead_bytes;
    pins_.erase(pin_order_.front().id);
    dropped.push_back(std::move(pin_order_.front().pin));
    pin_order_.pop_front();
  }
}

void PosixView::OnFirstRead(SampleId id, bool pin) {
  const std::vector<SampleId> hints = readahead_.OnOpen(id);
  if (!hints.empty()) {
    counters_.hinted.fetch_add(hints.size(), std::memory_order_relaxed);
    reader_->Hint(hints);
  }
  if (!ahead_thread_.joinable()) return;
  // How far a first read may land from the previous one and still count as
  // following (several reader threads or DataLoader workers interleave):
  // 256 positions, less in a small order. A jump counts one up, a near read
  // one down; at kJumpsBeforeSearch a search is asked for.
  constexpr uint32_t kJumpsBeforeSearch = 8;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    if (ahead_stop_) return;
    const uint64_t p = order_->PositionOf(id);
    recent_[recent_count_++ % kRecentReads] = id;
    const uint64_t near_span = std::clamp<uint64_t>(order_->size() / 16, 4, 256);
    const bool near = p < order_->size() && ahead_last_ != kNoPosition &&
                      p + near_span >= ahead_last_ && p <= ahead_last_ + near_span;
    if (!near) {
      ++jumps_;
    } else if (jumps_ > 0) {
      --jumps_;
    }
    if (options_.list_plans != nullptr && jumps_ >= kJumpsBeforeSearch && !search_wanted_ &&
        std::chrono::steady_clock::now() >= next_search_) {
      search_wanted_ = true;
      wake = true;
    }
    // Only a reader that follows the order is pinned ahead of: a first read
    // shortly after the previous one. A jump (a random reader, another
    // order) pins nothing and starts over from here, so random reads do not
    // cost pin_ahead sidecar fetches each.
    const bool follows = p < order_->size() && ahead_last_ != kNoPosition && p > ahead_last_ &&
                         p <= ahead_last_ + 2 * static_cast<uint64_t>(options_.pin_ahead) + 2;
    ahead_last_ = p < order_->size() ? p : kNoPosition;
    if (pin && options_.pin_ahead > 0 && p < order_->size()) {
      if (!follows) {
        ahead_queue_.clear();
        ahead_end_ = p + 1;
      } else {
        const uint64_t want_end = std::min<uint64_t>(p + 1 + options_.pin_ahead, order_->size());
        ahead_end_ = std::max(ahead_end_, p + 1);
        for (; ahead_end_ < want_end; ++ahead_end_) ahead_queue_.push_back(order_->At(ahead_end_));
        while (ahead_queue_.size() > options_.pin_ahead) ahead_queue_.pop_front();
        wake = wake || !ahead_queue_.empty();
      }
    }
  }
  if (wake) ahead_cv_.notify_one();
}

void PosixView::SearchOrder() {
  std::vector<SampleId> recent;
  std::shared_ptr<const ReadaheadOrder> current;
  {
    std::lock_guard<std::mutex> lock(ahead_mu_);
    const uint64_t n = std::min<uint64_t>(recent_count_, kRecentReads);
    for (uint64_t i = recent_count_ - n; i < recent_count_; ++i) {
      recent.push_back(recent_[i % kRecentReads]);
    }
    current = order_;
  }
  counters_.order_searches.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const ReadaheadOrder> found;
  if (!current->Fits(recent)) {  // else the reader does follow, only not in step
    found = ReadaheadOrder::Match(tree_.manifest(), options_.list_plans(), recent,
                                  current->plan_id(), current->epoch() + 1);
  }
  const bool switching = found != nullptr && found->description() != current->description();
  if (switching) {
    readahead_.SetOrder(found);
    GetLogger("posix")->info("dataset {}: readahead now follows {} (the reads left {})",
                             Quoted(options_.dataset), found->description(),
                             current->description());
  }
  std::lock_guard<std::mutex> lock(ahead_mu_);
  search_wanted_ = false;
  jumps_ = 0;
  if (switching) {
    order_ = std::move(found);
    ahead_queue_.clear();
    ahead_last_ = kNoPosition;
    search_backoff_ = std::chrono::milliseconds(1000);
    counters_.order_switches.fetch_add(1, std::memory_order_relaxed);  // once it holds
  } else {
    search_backoff_ =
        std::min<std::chrono::milliseconds>(2 * search_backoff_, std::chrono::milliseconds(64'000));
  }
  next_search_ = std::chrono::steady_clock::now() + search_backoff_;
}

void PosixView::AheadLoop() {
  // Bounded by Stop() (ahead_stop_).
  while (true) {
    SampleId id;
    {
      std::unique_lock<std::mutex> lock(ahead_mu_);
      if (!ahead_cv_.wait_for(lock, kPinIdle, [this] {
            return ahead_stop_ || !ahead_queue_.empty() || search_wanted_;
          })) {
        lock.unlock();
        ExpirePins();
        continue;
      }
      if (ahead_stop_) return;
      if (search_wanted_) {
        lock.unlock();
        SearchOrder();
        continue;
      }
      id = ahead_queue_.front();
      ahead_queue_.pop_front();
    }
    const uint64_t size = tree_.manifest().SizeOf(id);
    if (size == 0 || size > options_.pin_ahead_bytes) continue;
    {
      std::lock_guard<std::mutex> lock(pins_mu_);
      if (pins_.count(id) != 0 || ahead_bytes_ + size > options_.pin_ahead_bytes) continue;
    }
    Result<std::unique_ptr<PinnedSample>> pin = reader_->Acquire(id);
    if (!pin.ok() || (*pin)->bytes().size() != size) continue;  // its read will say why
    counters_.acquires.fetch_add(1, std::memory_order_relaxed);
    counters_.pinned_ahead.fetch_add(1, std::memory_order_relaxed);
    KeepPin(id, std::shared_ptr<PinnedSample>(std::move(*pin)), size);
  }
}

std::string PosixView::readahead_order() {
  std::lock_guard<std::mutex> lock(ahead_mu_);
  return order_->description();
}

size_t PosixView::kept_pins() {
  std::lock_guard<std::mutex> lock(pins_mu_);
  return pins_.size();
}

}  // namespace granary::posix

// Session's samples: the pins it holds (views handed out, hints, releases
// queued for the next request) and the calls that hand samples out (GET,
// NEXT, SET_PLAN), each reply item adopted as a view into the sidecar's
// arena. Opening and the connection are in session.cc, metadata calls in
// session_metadata.cc.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>
#include <variant>

#include "granary/client/session.h"
#include "granary/core/names.h"

namespace granary::client {

namespace sp = sidecar_protocol;

// ---- pins ------------------------------------------------------------------------

std::vector<uint64_t> Session::TakeReleases(size_t max) {
  std::lock_guard<std::mutex> lock(release_mu_);
  const size_t n = std::min(max, pending_release_.size());
  std::vector<uint64_t> taken(pending_release_.end() - static_cast<std::ptrdiff_t>(n),
                              pending_release_.end());
  pending_release_.resize(pending_release_.size() - n);
  return taken;
}

Status Session::SendQueuedReleases(Clock::time_point deadline) {
  const size_t per_request = std::max<size_t>(
      1, std::min<size_t>(limits_.max_items, (limits_.max_body_bytes - kBodyOverhead) / 8));
  size_t pending;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    pending = pending_release_.size();
  }
  const size_t rounds = (pending + per_request - 1) / per_request;
  for (size_t round = 0; round < rounds; ++round) {
    std::vector<uint64_t> tokens = TakeReleases(per_request);
    if (tokens.empty()) break;
    GRANARY_RETURN_IF_ERROR(Call(sp::Release{std::move(tokens)}, sp::MessageType::kOk, deadline,
                                 "RELEASE to the sidecar at " + socket_path_)
                                .status());
  }
  return Status::Ok();
}

void Session::Release(const SampleView& view) {
  if (view.token == 0 || !InOpeningProcess()) return;
  std::lock_guard<std::mutex> lock(release_mu_);
  auto it = outstanding_.find(view.token);
  if (it == outstanding_.end()) return;
  if (--it->second == 0) outstanding_.erase(it);
  pending_release_.push_back(view.token);
}

Status Session::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  return SendQueuedReleases(Clock::now() + options_.call_timeout);
}

size_t Session::pinned_count() const {
  std::lock_guard<std::mutex> lock(release_mu_);
  size_t n = 0;
  for (const auto& [token, count] : outstanding_) n += count;
  return n;
}

size_t Session::hint_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hints_.size();
}

Result<SampleView> Session::Adopt(const sp::SampleItem& item) {
  const std::string what = fmt::format("sample {} of dataset {}", item.id, Quoted(dataset_));
  if (!item.status.ok()) return item.status.WithContext(what);
  if (item.token == 0) {
    return Status::Corruption(what +
                              ": the sidecar sent it without a pin token; report this "
                              "sidecar bug");
  }
  const auto drop = [&](Status status) {
    std::lock_guard<std::mutex> lock(release_mu_);
    pending_release_.push_back(item.token);
    return status;
  };
  if (item.offset > map_size_ || item.length > map_size_ - item.offset) {
    return drop(Status::Corruption(fmt::format(
        "{}: the sidecar placed it at bytes [{}, +{}) of an arena of {} bytes; not read (report "
        "this sidecar bug)",
        what, item.offset, item.length, map_size_)));
  }
  SampleView view;
  view.id = item.id;
  view.data = map_ + item.offset;
  view.size = item.length;
  view.checksum = item.checksum;
  view.token = item.token;
  if (options_.verify_checksums) {
    const uint64_t actual = Checksum64(view.data, static_cast<size_t>(view.size));
    if (actual != item.checksum) {
      return drop(Status::Corruption(
          fmt::format("{}: its {} bytes in the arena have checksum {:016x}, the sidecar said "
                      "{:016x}",
                      what, view.size, actual, item.checksum)));
    }
  }
  std::lock_guard<std::mutex> lock(release_mu_);
  ++outstanding_[item.token];
  return view;
}

void Session::AddHint(const SampleView& view) {
  auto it = hints_.find(view.id);
  if (it != hints_.end()) {
    const auto old = it->second;
    TakeHint(old);
    Release(*old);
    hint_order_.erase(old);
  }
  hint_order_.push_back(view);
  hints_[view.id] = std::prev(hint_order_.end());
  hint_bytes_ += view.size;
}

void Session::TrimHints() {
  const size_t keep = size_t{2} * lookahead_;
  while ((hints_.size() > keep || hint_bytes_ > hint_bytes_limit_) && !hint_order_.empty()) {
    TakeHint(hint_order_.begin());
    Release(hint_order_.front());
    hint_order_.pop_front();
  }
}

void Session::TakeHint(std::list<SampleView>::iterator it) {
  hints_.erase(it->id);
  hint_bytes_ -= std::min(hint_bytes_, it->size);
}

// ---- samples ---------------------------------------------------------------------

Result<SampleView> Session::Get(uint32_t id) {
  std::vector<Result<SampleView>> got = GetMany(std::span<const uint32_t>(&id, 1));
  return std::move(got.front());
}

std::vector<Result<SampleView>> Session::GetMany(std::span<const uint32_t> ids) {
  std::vector<Result<SampleView>> out;
  out.reserve(ids.size());
  std::lock_guard<std::mutex> lock(mu_);
  const Status usable = CheckUsable();
  std::vector<uint32_t> misses;
  std::vector<size_t> slots;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= info_.sample_count) {
      out.emplace_back(Status::OutOfRange(
          fmt::format("get sample {} of dataset {}: the dataset has {} samples (ids 0..{})", id,
                      Quoted(dataset_), info_.sample_count,
                      info_.sample_count == 0 ? 0 : info_.sample_count - 1)));
      continue;
    }
    if (!usable.ok()) {
      out.emplace_back(usable);
      continue;
    }
    auto hit = hints_.find(id);
    if (hit != hints_.end()) {
      const auto view = hit->second;
      out.emplace_back(*view);
      TakeHint(view);
      hint_order_.erase(view);
      continue;
    }
    out.emplace_back(Status::Internal("not fetched"));
    misses.push_back(id);
    slots.push_back(i);
  }
  if (!misses.empty()) FetchMisses(misses, slots, &out);
  return out;
}

void Session::FetchMisses(std::span<const uint32_t> ids, std::span<const size_t> slots,
                          std::vector<Result<SampleView>>* out) {
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  const uint32_t lookahead = std::min(lookahead_, limits_.max_items / 2);
  const size_t body_room = limits_.max_body_bytes - kBodyOverhead;
  // Half the body for releases, half for ids; ids + hints within max_items.
  const size_t max_releases =
      std::max<size_t>(1, std::min<size_t>(limits_.max_items, body_room / 2 / 8));
  const size_t max_ids =
      std::max<size_t>(1, std::min<size_t>({limits_.max_items - lookahead, body_room / 2 / 4,
                                            limits_.max_body_bytes / 64}));
  const std::string doing =
      "GET from dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  for (size_t begin = 0; begin < ids.size(); begin += max_ids) {
    const size_t end = std::min(ids.size(), begin + max_ids);
    if (Status usable = CheckUsable(); !usable.ok()) {
      for (size_t i = begin; i < end; ++i) (*out)[slots[i]] = usable;
      continue;
    }
    sp::Get get;
    get.release = TakeReleases(max_releases);
    get.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                   ids.begin() + static_cast<std::ptrdiff_t>(end));
    get.lookahead = end == ids.size() ? lookahead : 0;
    Result<sp::Reply> reply = Call(get, sp::MessageType::kSamples, deadline, doing);
    if (!reply.ok()) {
      for (size_t i = begin; i < end; ++i) (*out)[slots[i]] = reply.status();
      continue;
    }
    const auto& samples = std::get<sp::Samples>(*reply);
    // The answers (items that are not hints) must be the ids asked, in order.
    size_t answered = 0;
    bool matches = true;
    for (const sp::SampleItem& item : samples.items) {
      if (item.hint) {
        if (item.id >= info_.sample_count) matches = false;
        continue;
      }
      if (answered >= get.ids.size() || item.id != get.ids[answered]) matches = false;
      ++answered;
    }
    if (!matches || answered != get.ids.size()) {
      Status broken = Break(Status::Unavailable(fmt::format(
          "{}: the SAMPLES reply does not answer the {} ids asked, in order (it has {} answers); "
          "the connection is closed",
          doing, get.ids.size(), answered)));
      for (size_t i = begin; i < end; ++i) (*out)[slots[i]] = broken;
      continue;
    }
    answered = 0;
    for (const sp::SampleItem& item : samples.items) {
      if (item.hint) {
        if (!item.status.ok()) continue;
        Result<SampleView> view = Adopt(item);
        if (view.ok()) AddHint(*view);
        continue;
      }
      (*out)[slots[begin + answered]] = Adopt(item);
      ++answered;
    }
    TrimHints();
  }
}

std::optional<SampleView> Session::TryGetHinted(uint32_t id) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || !CheckUsable().ok()) return std::nullopt;
  auto hit = hints_.find(id);
  if (hit == hints_.end()) return std::nullopt;
  const auto view = hit->second;
  SampleView out = *view;
  TakeHint(view);
  hint_order_.erase(view);
  return out;
}

Status Session::SetPlan(const sp::SetPlan& plan) {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  return Call(plan, sp::MessageType::kOk, Clock::now() + options_.call_timeout,
              "SET_PLAN " + Quoted(plan.plan_id) + " on dataset " + Quoted(dataset_) +
                  " at the sidecar at " + socket_path_)
      .status();
}

Result<std::vector<Result<SampleView>>> Session::Next(uint32_t max, bool* end_of_epoch) {
  if (end_of_epoch != nullptr) *end_of_epoch = false;
  if (max == 0) {
    return Status::InvalidArgument("NEXT: max samples is 0; ask for at least 1");
  }
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  const size_t body_room = limits_.max_body_bytes - kBodyOverhead;
  sp::Next next;
  next.release =
      TakeReleases(std::max<size_t>(1, std::min<size_t>(limits_.max_items, body_room / 8)));
  next.max_samples = std::min(max, limits_.max_items);
  const std::string doing =
      "NEXT on dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  GRANARY_ASSIGN_OR_RETURN(sp::Reply reply, Call(next, sp::MessageType::kSamples,
                                                 Clock::now() + options_.call_timeout, doing));
  const auto& samples = std::get<sp::Samples>(reply);
  size_t answers = 0;
  for (const sp::SampleItem& item : samples.items) {
    if (item.id >= info_.sample_count) {
      answers = next.max_samples + size_t{1};
      break;
    }
    if (!item.hint) ++answers;
  }
  if (answers > next.max_samples) {
    return Break(Status::Unavailable(fmt::format(
        "{}: the SAMPLES reply has more than the {} samples asked, or ids past the end; the "
        "connection is closed",
        doing, next.max_samples)));
  }
  std::vector<Result<SampleView>> out;
  out.reserve(answers);
  for (const sp::SampleItem& item : samples.items) {
    if (item.hint) {
      if (!item.status.ok()) continue;
      Result<SampleView> view = Adopt(item);
      if (view.ok()) AddHint(*view);
      continue;
    }
    out.push_back(Adopt(item));
  }
  TrimHints();
  if (end_of_epoch != nullptr) *end_of_epoch = samples.end_of_epoch;
  return out;
}

}  // namespace granary::client

#include "granary/sidecar/sample_cache.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "granary/core/names.h"

namespace granary::sidecar {

namespace {
constexpr uint32_t kNoPosition = std::numeric_limits<uint32_t>::max();
}  // namespace

struct SampleCache::Entry {
  enum class State { kFetching, kReady, kFailed };
  SampleId id = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  State state = State::kFetching;
  Status error;
  uint32_t pins = 0;
  bool prefetched = false;
  bool consumed = false;
  bool evictable = false;  // in evictable_
  std::list<Entry*>::iterator lru;
};

struct SampleCache::Cursor {
  std::vector<SampleId> order;                // the rank's read order
  std::vector<uint8_t> consumed;              // per position
  std::vector<uint32_t> first_pos;            // per sample id: first position, or kNoPosition
  std::multimap<SampleId, uint32_t> repeats;  // positions after the first (padding)
  size_t low = 0;                             // first unconsumed position
  size_t next = 0;                            // first position not yet scheduled
  uint64_t ahead_bytes = 0;                   // sizes of positions in [low, next) not consumed
  uint64_t touched = 0;
  // Refilling its window: set when the window has drained to its low mark
  // (DrainedLocked), cleared when TakePrefetchWork has filled it again.
  bool filling = true;
};

Result<std::unique_ptr<SampleCache>> SampleCache::Create(FetchDataset dataset,
                                                         const SampleCacheOptions& options) {
  if (dataset.manifest == nullptr) {
    return Status::InvalidArgument("sample cache for " + Quoted(dataset.name) + ": no manifest");
  }
  if (options.window_bytes == 0 || options.window_samples == 0 ||
      options.arena_bytes < options.window_bytes) {
    return Status::InvalidArgument("sample cache for " + Quoted(dataset.name) +
                                   ": the arena must hold at least the window");
  }
  GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<Arena> arena,
                           Arena::Create("granary-" + dataset.name, options.arena_bytes));
  return std::unique_ptr<SampleCache>(
      new SampleCache(std::move(dataset), options, std::move(arena)));
}

SampleCache::SampleCache(FetchDataset dataset, const SampleCacheOptions& options,
                         std::unique_ptr<Arena> arena)
    : dataset_(std::move(dataset)),
      options_(options),
      arena_(std::move(arena)),
      placed_nodes_(dataset_.nodes) {}

FetchDataset SampleCache::FetchView() const {
  FetchDataset view = dataset_;
  std::lock_guard<std::mutex> lock(nodes_mu_);
  view.nodes = placed_nodes_;
  return view;
}

void SampleCache::SetPlacedNodes(std::optional<std::vector<std::string>> nodes) {
  std::lock_guard<std::mutex> lock(nodes_mu_);
  placed_nodes_ = std::move(nodes);
}

SampleCache::~SampleCache() = default;

// ---- entries ------------------------------------------------------------------------

std::optional<uint64_t> SampleCache::AllocateLocked(uint64_t size) {
  const uint64_t want = std::max<uint64_t>(size, 1);
  while (true) {
    if (std::optional<uint64_t> offset = arena_->Allocate(want)) return offset;
    if (evictable_.empty()) return std::nullopt;
    Entry* victim = evictable_.front();
    ++evictions_;
    EraseEntryLocked(victim);
  }
}

SampleCache::Entry* SampleCache::NewEntryLocked(SampleId id, uint64_t offset, bool prefetched) {
  auto e = std::make_unique<Entry>();
  e->id = id;
  e->offset = offset;
  e->size = manifest().SizeOf(id);
  e->prefetched = prefetched;
  Entry* raw = e.get();
  entries_[id] = std::move(e);
  return raw;
}

void SampleCache::EraseEntryLocked(Entry* e) {
  if (e->evictable) {
    evictable_.erase(e->lru);
    e->evictable = false;
  }
  arena_->Free(e->offset, std::max<uint64_t>(e->size, 1));
  entries_.erase(e->id);  // destroys *e
}

void SampleCache::PinLocked(uint64_t client, Entry* e, AcquiredSample* out) {
  if (e->evictable) {
    evictable_.erase(e->lru);
    e->evictable = false;
  }
  ++e->pins;
  ++pins_;
  pinned_bytes_ += e->size;
  const uint64_t token = next_token_++;
  clients_[client].pins[token] = e;
  out->status = Status::Ok();
  out->token = token;
  out->offset = e->offset;
  out->length = e->size;
  out->checksum = e->checksum;
  out->prefetched = e->prefetched;
  // Every hand-out advances the cursors that have the sample in their window
  // (the entry may have been consumed before, by another rank or epoch).
  e->consumed = true;
  MarkConsumedLocked(e->id);
}

void SampleCache::UnpinLocked(Entry* e, bool evict_first) {
  --e->pins;
  --pins_;
  pinned_bytes_ -= e->size;
  if (e->pins == 0 && e->consumed && e->state != Entry::State::kFetching && !e->evictable) {
    e->lru = evictable_.insert(evict_first ? evictable_.begin() : evictable_.end(), e);
    e->evictable = true;
  }
}

// ---- cursors --------------------------------------------------------------------------

void SampleCache::MarkConsumedLocked(SampleId id) {
  bool wake = false;
  for (auto& [key, c] : cursors_) {
    if (id >= c->first_pos.size()) continue;
    uint32_t pos = c->first_pos[id];
    if (pos == kNoPosition) continue;
    if (c->consumed[pos] != 0) {
      // A padding repeat: the first unconsumed later position, if any.
      pos = kNoPosition;
      auto [lo, hi] = c->repeats.equal_range(id);
      for (auto it = lo; it != hi; ++it) {
        if (c->consumed[it->second] == 0) {
          pos = it->second;
          break;
        }
      }
      if (pos == kNoPosition) continue;
    }
    if (pos < c->low) continue;  // before the resume point
    c->consumed[pos] = 1;
    if (pos < c->next) c->ahead_bytes -= manifest().SizeOf(id);
    while (c->low < c->order.size() && c->consumed[c->low] != 0) ++c->low;
    if (c->next < c->low) c->next = c->low;
    if (!c->filling && DrainedLocked(*c)) c->filling = true;
    // While filling, each consumed sample may be the room (or the eviction)
    // a worker waiting on a full arena needs.
    wake = wake || c->filling;
  }
  if (wake) WakeWorkersLocked();
}

bool SampleCache::DrainedLocked(const Cursor& c) const {
  // A quarter of the window free in both of its bounds (and at least one
  // sample): refilling by the sample as each is consumed would wake every
  // fetch worker per sample for a fetch of one, which costs the sidecar more
  // in wake-ups and lock hand-offs than the reads themselves.
  if (c.next >= c.order.size()) return false;
  const uint64_t samples_ahead = c.next - c.low;
  const uint64_t sample_room = std::max<uint64_t>(1, options_.window_samples / 4);
  const uint64_t byte_room = std::max<uint64_t>(1, options_.window_bytes / 4);
  return samples_ahead + sample_room <= options_.window_samples &&
         c.ahead_bytes + byte_room <= options_.window_bytes;
}

void SampleCache::SetCursor(const std::string& key, const Plan& plan, uint64_t start) {
  auto c = std::make_unique<Cursor>();
  const auto read = std::span<const SampleId>(plan.samples()).first(plan.read_count());
  c->order.assign(read.begin(), read.end());
  c->consumed.assign(c->order.size(), 0);
  c->first_pos.assign(manifest().sample_count(), kNoPosition);
  for (size_t pos = 0; pos < c->order.size(); ++pos) {
    const SampleId id = c->order[pos];
    if (id >= c->first_pos.size()) continue;
    if (c->first_pos[id] == kNoPosition) {
      c->first_pos[id] = static_cast<uint32_t>(pos);
    } else {
      c->repeats.emplace(id, static_cast<uint32_t>(pos));
    }
  }
  c->low = std::min<size_t>(start, c->order.size());
  c->next = c->low;

  std::lock_guard<std::mutex> lock(mu_);
  c->touched = next_cursor_touch_++;
  if (auto it = cursors_.find(key); it != cursors_.end()) {
    RetireCursorLocked(it->second.get());
    cursors_.erase(it);
  }
  while (cursors_.size() >= options_.max_cursors) {
    auto oldest = std::min_element(
        cursors_.begin(), cursors_.end(),
        [](const auto& a, const auto& b) { return a.second->touched < b.second->touched; });
    RetireCursorLocked(oldest->second.get());
    cursors_.erase(oldest);
  }
  cursors_[key] = std::move(c);
  WakeWorkersLocked();
}

void SampleCache::RetireCursorLocked(Cursor* c) {
  // Its window's entries are nobody's window any more: evictable once unpinned.
  for (size_t pos = c->low; pos < c->next; ++pos) {
    auto it = entries_.find(c->order[pos]);
    if (it == entries_.end()) continue;
    Entry* e = it->second.get();
    if (e->consumed) continue;
    e->consumed = true;
    if (e->pins == 0 && e->state != Entry::State::kFetching && !e->evictable) {
      e->lru = evictable_.insert(evictable_.end(), e);
      e->evictable = true;
    }
  }
}

void SampleCache::WakeWorkersLocked() {
  if (options_.work_available) options_.work_available();
}

std::vector<FetchTarget> SampleCache::TakePrefetchWork(uint32_t max) {
  std::vector<FetchTarget> work;
  std::lock_guard<std::mutex> lock(mu_);
  // Cursors furthest behind their window first, so one busy rank does not starve another.
  std::vector<Cursor*> order;
  for (auto& [key, c] : cursors_) order.push_back(c.get());
  std::sort(order.begin(), order.end(),
            [](const Cursor* a, const Cursor* b) { return a->ahead_bytes < b->ahead_bytes; });
  for (Cursor* c : order) {
    if (!c->filling) continue;
    // Slow start: while the reader is close behind prefetch (a new plan, or
    // a reader that caught up: fewer than `max` positions and a quarter of
    // either window bound scheduled ahead of it), take a quarter of `max`.
    // A fetch is answered whole, so the reader's next batch waits for every
    // sample of the fetch that holds it (docs/sidecar.md, "Prefetch").
    const size_t close_behind = std::min<size_t>(max, std::max(1u, options_.window_samples / 4));
    size_t cap = max;
    if (c->next - c->low < close_behind && c->ahead_bytes < options_.window_bytes / 4) {
      cap = std::min<size_t>(max, work.size() + std::max(1u, max / 4));
    }
    while (work.size() < cap && c->next < c->order.size() &&
           c->next < c->low + options_.window_samples && c->ahead_bytes < options_.window_bytes) {
      const SampleId id = c->order[c->next];
      const uint64_t size = manifest().SizeOf(id);
      if (c->consumed[c->next] == 0) {
        auto it = entries_.find(id);
        if (it == entries_.end()) {
          std::optional<uint64_t> offset = AllocateLocked(size);
          if (!offset) return work;  // the arena is full of windows and pins
          Entry* e = NewEntryLocked(id, *offset, /*prefetched=*/true);
          work.push_back(FetchTarget{id, std::span<char>(arena_->data() + e->offset, size)});
        } else if (it->second->consumed && it->second->pins == 0) {
          // Already here from an earlier epoch or another rank: keep it for this window.
          Entry* e = it->second.get();
          if (e->evictable) {
            evictable_.erase(e->lru);
            e->evictable = false;
          }
          e->consumed = false;
          e->prefetched = true;
        }
        c->ahead_bytes += size;
      }
      ++c->next;
    }
    if (c->next >= c->order.size() || c->next >= c->low + options_.window_samples ||
        c->ahead_bytes >= options_.window_bytes) {
      c->filling = false;  // full (or at the end): until it drains to its low mark
    }
    if (work.size() >= cap) break;
  }
  return work;
}

void SampleCache::CompletePrefetch(std::span<const FetchTarget> targets,
                                   std::span<const FetchOutcome> outcomes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < targets.size(); ++i) {
    auto it = entries_.find(targets[i].id);
    if (it == entries_.end()) continue;
    Entry* e = it->second.get();
    e->state = outcomes[i].status.ok() ? Entry::State::kReady : Entry::State::kFailed;
    e->error = outcomes[i].status;
    e->checksum = outcomes[i].checksum;
    if (e->pins == 0 && e->consumed && !e->evictable) {
      e->lru = evictable_.insert(evictable_.end(), e);
      e->evictable = true;
    }
  }
  fetched_.notify_all();
}

// ---- clients ------------------------------------------------------------------------

uint64_t SampleCache::AddClient(bool reads_once) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_client_++;
  clients_[id].reads_once = reads_once;
  return id;
}

void SampleCache::DropClient(uint64_t client) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  for (auto& [token, e] : it->second.pins) UnpinLocked(e, it->second.reads_once);
  clients_.erase(it);
}

void SampleCache::Release(uint64_t client, std::span<const uint64_t> tokens) {
  if (tokens.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  Client& c = clients_[client];
  auto& pins = c.pins;
  for (uint64_t token : tokens) {
    auto it = pins.find(token);
    if (it == pins.end()) {
      ++unknown_releases_;
      continue;
    }
    UnpinLocked(it->second, c.reads_once);
    pins.erase(it);
  }
}

std::vector<AcquiredSample> SampleCache::Acquire(uint64_t client, std::span<const SampleId> ids,
                                                 uint32_t lookahead, const FetchFn& fetch,
                                                 std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point started = Clock::now();
  std::vector<AcquiredSample> out(ids.size());
  std::vector<FetchTarget> on_demand;
  std::unique_lock<std::mutex> lock(mu_);

  // Rounds: a sample that is ready is pinned at once (so that room made for
  // the others cannot evict it); what is missing (or failed in prefetch) is
  // fetched on demand, in one call; then the fetches in progress are waited
  // for. A sample evicted while this request waited (its fetch finished, and
  // another request needed the room before this one got the lock back) is
  // asked for again in the next round.
  std::vector<char> done(ids.size(), 0);
  for (uint32_t round = 0; round < kAcquireRounds; ++round) {
    on_demand.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (done[i]) continue;
      out[i].id = ids[i];
      const SampleId id = ids[i];
      if (id >= manifest().sample_count()) {
        out[i].status = Status::OutOfRange("sample " + std::to_string(id) + " of " +
                                           Quoted(dataset_.name) + " does not exist: it has " +
                                           std::to_string(manifest().sample_count()) + " samples");
        done[i] = 1;
        continue;
      }
      auto it = entries_.find(id);
      if (it != entries_.end() && it->second->state == Entry::State::kFailed &&
          it->second->prefetched && it->second->pins == 0) {
        EraseEntryLocked(it->second.get());
        it = entries_.end();
      }
      if (it != entries_.end()) {
        if (it->second->state == Entry::State::kReady) {
          PinLocked(client, it->second.get(), &out[i]);
          done[i] = 1;
        }
        continue;  // fetching (or failed, not ours to erase): step 2
      }
      const uint64_t size = manifest().SizeOf(id);
      std::optional<uint64_t> offset = AllocateLocked(size);
      if (!offset) {
        out[i].status = Status::ResourceExhausted(
            "no room in the sidecar's shared memory for sample " + std::to_string(id) + " (" +
            std::to_string(size) + " bytes): " + std::to_string(pinned_bytes_) +
            " bytes are pinned by clients of " + Quoted(dataset_.name) + " (" +
            std::to_string(arena_->size()) +
            " bytes in all); release samples sooner or raise arena_bytes");
        done[i] = 1;
        continue;
      }
      Entry* e = NewEntryLocked(id, *offset, /*prefetched=*/false);
      on_demand.push_back(FetchTarget{id, std::span<char>(arena_->data() + e->offset, size)});
    }
    if (!on_demand.empty()) {
      std::vector<FetchOutcome> outcomes(on_demand.size());
      lock.unlock();
      fetch(on_demand, outcomes);
      lock.lock();
      for (size_t i = 0; i < on_demand.size(); ++i) {
        Entry* e = entries_.at(on_demand[i].id).get();
        e->state = outcomes[i].status.ok() ? Entry::State::kReady : Entry::State::kFailed;
        e->error = outcomes[i].status;
        e->checksum = outcomes[i].checksum;
      }
      fetched_.notify_all();
    }

    // 2. Wait for fetches in progress (prefetch, or another client's on-demand).
    bool evicted = false;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (done[i]) continue;
      auto fetching = [&] {
        auto it = entries_.find(ids[i]);
        return it != entries_.end() && it->second->state == Entry::State::kFetching;
      };
      if (fetching()) {
        if (!fetched_.wait_until(lock, deadline, [&] { return !fetching(); })) {
          out[i].status = Status::DeadlineExceeded(
              "sample " + std::to_string(ids[i]) + " of " + Quoted(dataset_.name) +
              " was still being fetched when the sidecar's wait_timeout ran out; the cache "
              "nodes or the source are too slow or stuck");
          done[i] = 1;
          continue;
        }
      }
      auto it = entries_.find(ids[i]);
      if (it == entries_.end()) {
        evicted = true;  // the next round fetches it again
        continue;
      }
      Entry* e = it->second.get();
      done[i] = 1;
      if (e->state == Entry::State::kFailed) {
        out[i].status = e->error;
        if (e->pins == 0) EraseEntryLocked(e);  // the next request tries again
        continue;
      }
      PinLocked(client, e, &out[i]);
    }
    if (!evicted) break;
    ++evicted_while_waiting_;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (done[i]) continue;
    out[i].status = Status::Unavailable(
        "sample " + std::to_string(ids[i]) + " of " + Quoted(dataset_.name) + " was evicted " +
        std::to_string(kAcquireRounds) +
        " times while this request waited for it: the shared memory is too small for what "
        "the clients hold and prefetch; raise arena_bytes (or lower window_bytes)");
  }
  const double waited = std::chrono::duration<double>(Clock::now() - started).count();
  for (AcquiredSample& a : out) a.waited_seconds = waited;

  // 3. Lookahead: ready samples that follow the last id in a cursor.
  if (lookahead > 0 && !ids.empty()) {
    const SampleId last = ids.back();
    for (auto& [key, c] : cursors_) {
      if (last >= c->first_pos.size() || c->first_pos[last] == kNoPosition) continue;
      size_t pos = c->first_pos[last] + 1;
      uint32_t given = 0;
      for (; pos < c->order.size() && given < lookahead; ++pos, ++given) {
        auto it = entries_.find(c->order[pos]);
        if (it == entries_.end() || it->second->state != Entry::State::kReady) break;
        AcquiredSample hint;
        hint.id = c->order[pos];
        hint.hint = true;
        PinLocked(client, it->second.get(), &hint);
        out.push_back(std::move(hint));
      }
      break;
    }
  }
  return out;
}

SampleCacheStats& SampleCacheStats::operator+=(const SampleCacheStats& o) {
  arena_bytes += o.arena_bytes;
  arena_used_bytes += o.arena_used_bytes;
  entries += o.entries;
  pins += o.pins;
  pinned_bytes += o.pinned_bytes;
  window_samples += o.window_samples;
  window_bytes += o.window_bytes;
  cursors += o.cursors;
  evictions += o.evictions;
  unknown_releases += o.unknown_releases;
  evicted_while_waiting += o.evicted_while_waiting;
  return *this;
}

SampleCacheStats SampleCache::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SampleCacheStats s;
  s.arena_bytes = arena_->size();
  s.arena_used_bytes = arena_->used();
  s.entries = entries_.size();
  s.pins = pins_;
  s.pinned_bytes = pinned_bytes_;
  for (const auto& [id, e] : entries_) {
    if (e->prefetched && !e->consumed) {
      ++s.window_samples;
      s.window_bytes += e->size;
    }
  }
  s.cursors = cursors_.size();
  s.evictions = evictions_;
  s.unknown_releases = unknown_releases_;
  s.evicted_while_waiting = evicted_while_waiting_;
  return s;
}

}  // namespace granary::sidecar

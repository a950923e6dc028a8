// SampleCache and Arena: the sidecar's shared memory and what is in it, with a
// FetchFn that writes known bytes (no network): pins, eviction, windows,
// cursors, on-demand, failures, clients dropped.

#include "granary/sidecar/sample_cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "testing/test_util.h"

namespace granary::sidecar {
namespace {

using std::chrono::steady_clock;

// The byte at offset `i` of sample `id`.
char ByteOf(SampleId id, uint64_t i) { return static_cast<char>((id * 131 + i * 7) & 0xff); }

std::shared_ptr<const Manifest> MakeManifest(size_t n, uint64_t size) {
  ManifestHeaderInfo header;
  header.source_uri = "file:///nowhere";
  header.chunk_size = 64 * 1024;
  std::vector<FileEntry> entries;
  for (size_t i = 0; i < n; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "c%zu/f%05zu", i % 3, i);
    entries.push_back(FileEntry{name, size, 1});
  }
  Result<Manifest> m = Manifest::FromEntries(header, std::move(entries));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::make_shared<const Manifest>(std::move(*m));
}

// Fills targets with ByteOf, counting calls; ids in `fail` fail.
struct FakeFetch {
  std::mutex mu;
  std::multiset<SampleId> fetched;
  std::set<SampleId> fail;

  FetchFn Fn() {
    return [this](std::span<const FetchTarget> targets, std::span<FetchOutcome> outcomes) {
      for (size_t i = 0; i < targets.size(); ++i) {
        std::lock_guard<std::mutex> lock(mu);
        fetched.insert(targets[i].id);
        if (fail.count(targets[i].id) != 0) {
          outcomes[i].status = Status::Unavailable("scripted failure");
          continue;
        }
        for (uint64_t b = 0; b < targets[i].out.size(); ++b)
          targets[i].out[b] = ByteOf(targets[i].id, b);
        outcomes[i].status = Status::Ok();
        outcomes[i].from = SampleSource::kPeer;
      }
    };
  }
  size_t Count(SampleId id) {
    std::lock_guard<std::mutex> lock(mu);
    return fetched.count(id);
  }
};

std::unique_ptr<SampleCache> MakeCache(size_t n, uint64_t size, uint64_t arena, uint32_t window,
                                       uint64_t window_bytes) {
  FetchDataset ds;
  ds.name = "ds";
  ds.manifest = MakeManifest(n, size);
  SampleCacheOptions o;
  o.arena_bytes = arena;
  o.window_samples = window;
  o.window_bytes = window_bytes;
  Result<std::unique_ptr<SampleCache>> cache = SampleCache::Create(std::move(ds), o);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(*cache);
}

bool BytesOk(const SampleCache& cache, const char* base, const AcquiredSample& a) {
  if (!a.status.ok() || a.length != cache.manifest().SizeOf(a.id)) return false;
  for (uint64_t i = 0; i < a.length; ++i) {
    if (base[a.offset + i] != ByteOf(a.id, i)) return false;
  }
  return true;
}

steady_clock::time_point Soon() { return steady_clock::now() + std::chrono::seconds(10); }

TEST(ArenaTest, AllocatesAlignedFreesAndCoalesces) {
  auto arena = Arena::Create("t", 1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  Arena& a = **arena;
  auto x = a.Allocate(100);
  auto y = a.Allocate(1000);
  auto z = a.Allocate(10);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x % kArenaAlignment, 0u);
  EXPECT_EQ(*y % kArenaAlignment, 0u);
  EXPECT_EQ(a.used(), Arena::Rounded(100) + Arena::Rounded(1000) + Arena::Rounded(10));
  a.Free(*y, 1000);
  a.Free(*x, 100);
  a.Free(*z, 10);
  EXPECT_EQ(a.used(), 0u);
  // Coalesced: the whole arena is one range again.
  auto all = a.Allocate(a.size());
  ASSERT_TRUE(all);
  EXPECT_EQ(*all, 0u);
  EXPECT_FALSE(a.Allocate(1));
}

TEST(ArenaTest, BestFitTakesTheSmallestRangeThatFits) {
  auto arena = Arena::Create("t", 1 << 20);
  ASSERT_TRUE(arena.ok());
  Arena& a = **arena;
  // Holes of 4 KiB at 0 and of 1 KiB at 8 KiB, separated by allocations.
  auto h1 = a.Allocate(4096);
  auto k1 = a.Allocate(4096);
  auto h2 = a.Allocate(1024);
  auto k2 = a.Allocate(4096);
  ASSERT_TRUE(h1 && k1 && h2 && k2);
  a.Free(*h1, 4096);
  a.Free(*h2, 1024);
  auto small = a.Allocate(1000);
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, *h2) << "1000 bytes go in the 1 KiB hole, not the first (4 KiB) one";
  auto mid = a.Allocate(3000);
  ASSERT_TRUE(mid);
  EXPECT_EQ(*mid, *h1);
}

TEST(ArenaTest, RandomAllocationsNeverOverlapAndAllCoalesceBack) {
  auto arena = Arena::Create("t", 4 << 20);
  ASSERT_TRUE(arena.ok());
  Arena& a = **arena;
  std::mt19937_64 rng(11);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, requested bytes
  std::vector<char> owner(a.size() / kArenaAlignment, 0);
  uint64_t used = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      const uint64_t bytes = 1 + rng() % (96 * 1024);
      auto at = a.Allocate(bytes);
      if (!at) continue;  // full or fragmented: fine, frees follow
      ASSERT_EQ(*at % kArenaAlignment, 0u);
      ASSERT_LE(*at + bytes, a.size());
      for (uint64_t u = *at / kArenaAlignment;
           u < (*at + bytes + kArenaAlignment - 1) / kArenaAlignment; ++u) {
        ASSERT_EQ(owner[u], 0) << "range at " << *at << " overlaps a live one";
        owner[u] = 1;
      }
      live.emplace_back(*at, bytes);
      used += Arena::Rounded(bytes);
    } else {
      const size_t k = rng() % live.size();
      const auto [at, bytes] = live[k];
      live[k] = live.back();
      live.pop_back();
      for (uint64_t u = at / kArenaAlignment;
           u < (at + bytes + kArenaAlignment - 1) / kArenaAlignment; ++u) {
        owner[u] = 0;
      }
      a.Free(at, bytes);
      used -= Arena::Rounded(bytes);
    }
    ASSERT_EQ(a.used(), used);
  }
  for (const auto& [at, bytes] : live) a.Free(at, bytes);
  EXPECT_EQ(a.used(), 0u);
  auto all = a.Allocate(a.size());
  ASSERT_TRUE(all) << "every range coalesced back into one";
  EXPECT_EQ(*all, 0u);
}

TEST(ArenaTest, SealedAgainstResizeAndWrites) {
  auto arena = Arena::Create("t", 1 << 16);
  ASSERT_TRUE(arena.ok());
  const int fd = (*arena)->fd();
  EXPECT_NE(::ftruncate(fd, 0), 0) << "a client must not shrink the arena";
  EXPECT_NE(::ftruncate(fd, 1 << 20), 0);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED)
      << "a client must not map it writable";
  EXPECT_LT(::pwrite(fd, "x", 1, 0), 0);
  void* ro = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  (*arena)->data()[5] = 'q';
  EXPECT_EQ(static_cast<char*>(ro)[5], 'q') << "the sidecar's writes are visible read-only";
  ::munmap(ro, 4096);
  EXPECT_FALSE(Arena::Create("t", 0).ok());
}

TEST(SampleCacheTest, OnDemandPinsAndReleases) {
  FakeFetch fetch;
  auto cache = MakeCache(100, 1000, 1 << 20, 16, 1 << 16);
  const uint64_t client = cache->AddClient();
  std::vector<SampleId> ids = {3, 7, 3};
  auto got = cache->Acquire(client, ids, 0, fetch.Fn(), Soon());
  ASSERT_EQ(got.size(), 3u);
  // The arena is read through a mapping of the fd, as a client does.
  void* map = ::mmap(nullptr, cache->arena_bytes(), PROT_READ, MAP_SHARED, cache->arena_fd(), 0);
  ASSERT_NE(map, MAP_FAILED);
  for (const auto& a : got) EXPECT_TRUE(BytesOk(*cache, static_cast<char*>(map), a));
  EXPECT_EQ(fetch.Count(3), 1u) << "one fetch for a sample asked twice";
  EXPECT_FALSE(got[0].prefetched);
  EXPECT_EQ(cache->Stats().pins, 3u);
  EXPECT_EQ(cache->Stats().pinned_bytes, 3000u);
  std::vector<uint64_t> tokens = {got[0].token, got[1].token, got[2].token, 999999};
  cache->Release(client, tokens);
  EXPECT_EQ(cache->Stats().pins, 0u);
  EXPECT_EQ(cache->Stats().unknown_releases, 1u);
  // Another client cannot release what it does not hold.
  auto again = cache->Acquire(client, std::vector<SampleId>{3}, 0, fetch.Fn(), Soon());
  const uint64_t other = cache->AddClient();
  cache->Release(other, std::vector<uint64_t>{again[0].token});
  EXPECT_EQ(cache->Stats().pins, 1u);
  ::munmap(map, cache->arena_bytes());
}

TEST(SampleCacheTest, BadIdsAndFailuresAreItemErrors) {
  FakeFetch fetch;
  fetch.fail = {5};
  auto cache = MakeCache(10, 100, 1 << 20, 4, 1 << 16);
  const uint64_t client = cache->AddClient();
  auto got = cache->Acquire(client, std::vector<SampleId>{10, 5, 1}, 0, fetch.Fn(), Soon());
  EXPECT_EQ(got[0].status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(got[1].status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(got[2].status.ok());
  // A failure is not cached: the next request tries again.
  fetch.fail.clear();
  auto retry = cache->Acquire(client, std::vector<SampleId>{5}, 0, fetch.Fn(), Soon());
  EXPECT_TRUE(retry[0].status.ok());
  EXPECT_EQ(fetch.Count(5), 2u);
}

TEST(SampleCacheTest, DroppedClientReclaimsPinsAndPinnedBytesBoundTheArena) {
  FakeFetch fetch;
  // Room for 4 samples of 60 KiB.
  auto cache = MakeCache(50, 60 * 1024, 256 * 1024, 2, 64 * 1024);
  const uint64_t greedy = cache->AddClient();
  auto held = cache->Acquire(greedy, std::vector<SampleId>{0, 1, 2, 3}, 0, fetch.Fn(), Soon());
  for (const auto& a : held) ASSERT_TRUE(a.status.ok());
  const uint64_t other = cache->AddClient();
  auto starved = cache->Acquire(other, std::vector<SampleId>{9}, 0, fetch.Fn(), Soon());
  EXPECT_EQ(starved[0].status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(starved[0].status.message().find("pinned"), std::string::npos);
  cache->DropClient(greedy);
  EXPECT_EQ(cache->Stats().pins, 0u);
  EXPECT_EQ(cache->Stats().pinned_bytes, 0u);
  auto fed = cache->Acquire(other, std::vector<SampleId>{9}, 0, fetch.Fn(), Soon());
  EXPECT_TRUE(fed[0].status.ok()) << "evicts the released samples to make room";
  EXPECT_GT(cache->Stats().evictions, 0u);
}

TEST(SampleCacheTest, ASampleAskedWithMissingOnesIsNotEvictedToMakeThemRoom) {
  FakeFetch fetch;
  // Room for 4 samples of 60 KiB; 0..3 are read, released and evictable.
  auto cache = MakeCache(50, 60 * 1024, 256 * 1024, 2, 64 * 1024);
  const uint64_t client = cache->AddClient();
  auto first = cache->Acquire(client, std::vector<SampleId>{0, 1, 2, 3}, 0, fetch.Fn(), Soon());
  std::vector<uint64_t> tokens;
  for (const auto& a : first) {
    ASSERT_TRUE(a.status.ok());
    tokens.push_back(a.token);
  }
  cache->Release(client, tokens);
  // 0 is in the arena and the oldest; 9, 10, 11 need the room of three others.
  auto got = cache->Acquire(client, std::vector<SampleId>{0, 9, 10, 11}, 0, fetch.Fn(), Soon());
  void* map = ::mmap(nullptr, cache->arena_bytes(), PROT_READ, MAP_SHARED, cache->arena_fd(), 0);
  ASSERT_NE(map, MAP_FAILED);
  for (const auto& a : got) {
    EXPECT_TRUE(a.status.ok()) << a.id << ": " << a.status.ToString();
    EXPECT_TRUE(BytesOk(*cache, static_cast<char*>(map), a)) << a.id;
  }
  EXPECT_EQ(fetch.Count(0), 1u) << "0 was served from the arena, not fetched again";
  EXPECT_EQ(cache->Stats().evictions, 3u);
  ::munmap(map, cache->arena_bytes());
}

TEST(SampleCacheTest, WhatAReadOnceClientReleasesIsEvictedFirstNewestFirst) {
  for (const bool reads_once : {true, false}) {
    FakeFetch fetch;
    // Four 1000-byte samples fill the 4 KiB arena.
    auto cache = MakeCache(20, 1000, 4096, 1, 1024);
    const uint64_t client = cache->AddClient(reads_once);
    auto got = cache->Acquire(client, std::vector<SampleId>{0, 1, 2, 3}, 0, fetch.Fn(), Soon());
    std::vector<uint64_t> tokens;
    for (const auto& a : got) {
      ASSERT_TRUE(a.status.ok()) << a.status.ToString();
      tokens.push_back(a.token);
    }
    cache->Release(client, tokens);  // 0 first, 3 last
    auto five = cache->Acquire(client, std::vector<SampleId>{4}, 0, fetch.Fn(), Soon());
    ASSERT_TRUE(five[0].status.ok());
    EXPECT_EQ(cache->Stats().evictions, 1u);
    // The one evicted is fetched again when asked for; the others are not.
    const SampleId evicted = reads_once ? 3 : 0;
    const SampleId kept = reads_once ? 0 : 3;
    auto again = cache->Acquire(client, std::vector<SampleId>{kept}, 0, fetch.Fn(), Soon());
    ASSERT_TRUE(again[0].status.ok());
    EXPECT_EQ(fetch.Count(kept), 1u)
        << (reads_once ? "read once" : "default") << ": " << kept << " stayed";
    cache->Release(client, std::vector<uint64_t>{five[0].token, again[0].token});
    auto back = cache->Acquire(client, std::vector<SampleId>{evicted}, 0, fetch.Fn(), Soon());
    ASSERT_TRUE(back[0].status.ok());
    EXPECT_EQ(fetch.Count(evicted), 2u)
        << (reads_once ? "read once" : "default") << ": " << evicted << " was the one evicted";
  }
}

TEST(SampleCacheTest, PrefetchFollowsTheCursorWithinItsWindow) {
  FakeFetch fetch;
  auto cache = MakeCache(200, 1000, 1 << 20, 8, 1 << 20);
  PlanSpec spec;
  spec.seed = 7;
  spec.world_size = 2;
  spec.rank = 1;
  auto plan = Plan::Create(cache->manifest(), spec);
  ASSERT_TRUE(plan.ok());
  cache->SetCursor("p/rank1", *plan, 0);
  auto work = cache->TakePrefetchWork(100);
  ASSERT_EQ(work.size(), 8u) << "window_samples bounds the work";
  for (size_t i = 0; i < work.size(); ++i) EXPECT_EQ(work[i].id, plan->samples()[i]);
  EXPECT_TRUE(cache->TakePrefetchWork(100).empty()) << "the window is full";
  std::vector<FetchOutcome> outcomes(work.size());
  fetch.Fn()(work, outcomes);
  cache->CompletePrefetch(work, outcomes);
  EXPECT_EQ(cache->Stats().window_samples, 8u);

  // Consuming the first three moves the window by three.
  const uint64_t client = cache->AddClient();
  std::vector<SampleId> first(plan->samples().begin(), plan->samples().begin() + 3);
  auto got = cache->Acquire(client, first, 0, fetch.Fn(), Soon());
  for (const auto& a : got) {
    EXPECT_TRUE(a.status.ok());
    EXPECT_TRUE(a.prefetched);
  }
  auto more = cache->TakePrefetchWork(100);
  ASSERT_EQ(more.size(), 3u);
  EXPECT_EQ(more[0].id, plan->samples()[8]);
  std::vector<FetchOutcome> more_outcomes(more.size());
  fetch.Fn()(more, more_outcomes);
  cache->CompletePrefetch(more, more_outcomes);

  // Lookahead hands out the ready samples that follow in the plan.
  auto hinted =
      cache->Acquire(client, std::vector<SampleId>{plan->samples()[3]}, 4, fetch.Fn(), Soon());
  ASSERT_EQ(hinted.size(), 5u);
  for (size_t i = 1; i < 5; ++i) {
    EXPECT_TRUE(hinted[i].hint);
    EXPECT_EQ(hinted[i].id, plan->samples()[3 + i]);
  }
  EXPECT_EQ(fetch.Count(plan->samples()[0]), 1u) << "prefetched samples are not fetched again";
}

TEST(SampleCacheTest, AFullWindowRefillsOnceAQuarterOfItIsFree) {
  FakeFetch fetch;
  int wakes = 0;
  FetchDataset ds;
  ds.name = "ds";
  ds.manifest = MakeManifest(200, 1000);
  SampleCacheOptions o;
  o.arena_bytes = 1 << 20;
  o.window_samples = 16;
  o.window_bytes = 1 << 20;
  o.work_available = [&] { ++wakes; };
  auto made = SampleCache::Create(std::move(ds), o);
  ASSERT_TRUE(made.ok());
  auto& cache = *made;
  PlanSpec spec;
  spec.mode = PlanMode::kSequential;
  auto plan = Plan::Create(cache->manifest(), spec);
  ASSERT_TRUE(plan.ok());
  cache->SetCursor("p/rank0", *plan, 0);
  auto work = cache->TakePrefetchWork(40);
  ASSERT_EQ(work.size(), 10u) << "a quarter of a batch: the window is new";
  auto rest = cache->TakePrefetchWork(100);
  ASSERT_EQ(rest.size(), 6u) << "the window is filled to its bound across calls";
  for (auto* batch : {&work, &rest}) {
    std::vector<FetchOutcome> outcomes(batch->size());
    fetch.Fn()(*batch, outcomes);
    cache->CompletePrefetch(*batch, outcomes);
  }
  const uint64_t client = cache->AddClient();
  const int wakes_before = wakes;
  for (SampleId id = 0; id < 3; ++id) {
    auto got = cache->Acquire(client, std::vector<SampleId>{id}, 0, fetch.Fn(), Soon());
    ASSERT_TRUE(got[0].status.ok());
  }
  EXPECT_TRUE(cache->TakePrefetchWork(100).empty())
      << "three of sixteen consumed: not yet a quarter of the window free";
  EXPECT_EQ(wakes, wakes_before) << "no worker is woken for less than a quarter";
  auto fourth = cache->Acquire(client, std::vector<SampleId>{3}, 0, fetch.Fn(), Soon());
  ASSERT_TRUE(fourth[0].status.ok());
  EXPECT_GT(wakes, wakes_before) << "a quarter free wakes the workers";
  auto refill = cache->TakePrefetchWork(100);
  ASSERT_EQ(refill.size(), 4u);
  EXPECT_EQ(refill.front().id, 16u);
  EXPECT_EQ(refill.back().id, 19u);
  std::vector<FetchOutcome> outcomes(refill.size());
  fetch.Fn()(refill, outcomes);
  cache->CompletePrefetch(refill, outcomes);
  // A sample read before prefetch reached it still comes (on demand).
  auto ahead = cache->Acquire(client, std::vector<SampleId>{40}, 0, fetch.Fn(), Soon());
  ASSERT_TRUE(ahead[0].status.ok());
  EXPECT_FALSE(ahead[0].prefetched);
}

// A fetch is answered whole: while the reader is close behind prefetch (a
// new plan, or a reader that caught up), fetches are a quarter of `max`, so
// the reader's next batch is not held back by the rest of a large fetch.
TEST(SampleCacheTest, PrefetchStartsSmallWhileTheReaderIsCloseBehind) {
  FakeFetch fetch;
  auto cache = MakeCache(1000, 100, 1 << 20, 512, 1 << 20);
  PlanSpec spec;
  spec.mode = PlanMode::kSequential;
  auto plan = Plan::Create(cache->manifest(), spec);
  ASSERT_TRUE(plan.ok());
  cache->SetCursor("p/rank0", *plan, 0);
  std::vector<std::vector<FetchTarget>> takes;
  for (int i = 0; i < 6; ++i) takes.push_back(cache->TakePrefetchWork(64));
  std::vector<size_t> sizes;
  for (const auto& t : takes) sizes.push_back(t.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{16, 16, 16, 16, 64, 64}))
      << "four quarters, then whole fetches once 64 positions are ahead";
  SampleId expected = 0;
  for (const auto& t : takes) {
    for (const FetchTarget& target : t) EXPECT_EQ(target.id, expected++) << "in plan order";
  }
  for (auto& t : takes) {
    std::vector<FetchOutcome> outcomes(t.size());
    fetch.Fn()(t, outcomes);
    cache->CompletePrefetch(t, outcomes);
  }

  // The reader catches up (consumes all 192 scheduled): small fetches again.
  const uint64_t client = cache->AddClient();
  for (SampleId id = 0; id < expected; ++id) {
    auto got = cache->Acquire(client, std::vector<SampleId>{id}, 0, fetch.Fn(), Soon());
    ASSERT_TRUE(got[0].status.ok());
    cache->Release(client, std::vector<uint64_t>{got[0].token});
  }
  auto again = cache->TakePrefetchWork(64);
  ASSERT_EQ(again.size(), 16u) << "the reader is at the prefetch edge again";
  EXPECT_EQ(again.front().id, expected);
  EXPECT_EQ(cache->TakePrefetchWork(1).size(), 1u) << "a max of 1 still takes one";

  // A window that holds fewer than `max` samples ahead (64 KiB of 1000-byte
  // samples: 66) ends slow start at a quarter of its bytes, not at `max`.
  auto small = MakeCache(1000, 1000, 4 << 20, 1024, 64 * 1024);
  small->SetCursor("p/rank0", *Plan::Create(small->manifest(), spec), 0);
  std::vector<size_t> small_sizes;
  for (int i = 0; i < 4; ++i) small_sizes.push_back(small->TakePrefetchWork(64).size());
  EXPECT_EQ(small_sizes, (std::vector<size_t>{16, 16, 34, 0}))
      << "two quarters (16 KB ahead is a quarter of the window's bytes), then the rest of the "
         "window in one fetch";
}

TEST(SampleCacheTest, WindowBytesAndResumeStart) {
  FakeFetch fetch;
  auto cache = MakeCache(100, 10 * 1024, 4 << 20, 1000, 30 * 1024);
  PlanSpec spec;
  spec.mode = PlanMode::kSequential;
  auto plan = Plan::Create(cache->manifest(), spec);
  ASSERT_TRUE(plan.ok());
  cache->SetCursor("p/rank0", *plan, 50);
  auto work = cache->TakePrefetchWork(100);
  ASSERT_EQ(work.size(), 3u) << "30 KiB of window holds three 10 KiB samples";
  EXPECT_EQ(work[0].id, 50u) << "a resumed cursor starts at its position";
}

TEST(SampleCacheTest, ReplacingACursorFreesItsWindowAndConcurrentClientsAgree) {
  FakeFetch fetch;
  auto cache = MakeCache(300, 2000, 1 << 20, 64, 1 << 20);
  PlanSpec spec;
  auto epoch0 = Plan::Create(cache->manifest(), spec);
  ASSERT_TRUE(epoch0.ok());
  cache->SetCursor("p/rank0", *epoch0, 0);
  auto work = cache->TakePrefetchWork(1000);
  std::vector<FetchOutcome> outcomes(work.size());
  fetch.Fn()(work, outcomes);
  cache->CompletePrefetch(work, outcomes);
  spec.epoch = 1;
  auto epoch1 = Plan::Create(cache->manifest(), spec);
  cache->SetCursor("p/rank0", *epoch1, 0);
  EXPECT_EQ(cache->Stats().cursors, 1u);

  // Four threads read the whole epoch; each sample's bytes are right.
  void* map = ::mmap(nullptr, cache->arena_bytes(), PROT_READ, MAP_SHARED, cache->arena_fd(), 0);
  ASSERT_NE(map, MAP_FAILED);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t client = cache->AddClient();
      for (size_t i = static_cast<size_t>(t); i < epoch1->samples().size(); i += 4) {
        auto got = cache->Acquire(client, std::vector<SampleId>{epoch1->samples()[i]}, 2,
                                  fetch.Fn(), Soon());
        for (const auto& a : got) {
          if (!BytesOk(*cache, static_cast<char*>(map), a)) ++bad;
        }
        std::vector<uint64_t> tokens;
        for (const auto& a : got) tokens.push_back(a.token);
        cache->Release(client, tokens);
      }
      cache->DropClient(client);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(cache->Stats().pins, 0u);
  ::munmap(map, cache->arena_bytes());
}

}  // namespace
}  // namespace granary::sidecar

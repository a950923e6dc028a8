// The cache node's staging engine on real files: a generated source tree of a
// few hundred small files and a few larger than a chunk (64 KiB chunks), a
// real PosixSource and a real ChunkStore in temporary directories. Every byte
// staged equals the source and each segment is read from the source once
// (bulk, on demand, across restarts); the staging order is followed; on-demand
// fetches share reads and go ahead of bulk staging; changed files are per-sample
// errors; capacity stops staging at a prefix of the order; Stop never leaves
// wrong bytes present; bad inputs are refused.

#include "granary/cachenode/stager.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/names.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "testing/source_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

namespace fs = std::filesystem;
using ::granary::testing::Bytes;
using ::granary::testing::FirstChunkWithSegments;
using ::granary::testing::OpenPosixSourceAsProcess;
using ::granary::testing::ScriptedSource;
using ::granary::testing::SnapshotTree;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kChunkSize = 64 << 10;
constexpr uint64_t kBigCapacity = 1ull << 30;
constexpr char kDataset[] = "imagenet";

// Set on the threads of a test that play on-demand readers.
thread_local bool t_on_demand_reader = false;

class StagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = IdentityExecutor::Start({.threads = 8});
    ASSERT_OK(e);
    executor_ = std::move(*e);
    root_ = dir_.Join("source");
    store_dir_ = dir_.Join("store");
    // 300 small files in a few directories, and three larger than a chunk.
    std::mt19937 rng(42);
    for (int i = 0; i < 300; ++i) {
      const std::string rel = "d" + std::to_string(i % 7) + "/f" + std::to_string(i) + ".bin";
      Write(rel, 1 + rng() % 6000);
    }
    Write("big/a.bin", 150'000);
    Write("big/b.bin", 200'000);
    Write("big/c.bin", 70'000);
    Snapshot();
  }

  void Write(const std::string& rel, size_t size) {
    sizes_[rel] = size;
    dir_.WriteFile("source/" + rel, Bytes(rel, size));
  }
  std::string Expected(const ChunkSegment& s) const {
    const std::string path = manifest_->PathOf(s.sample);
    return Bytes(path, sizes_.at(path)).substr(s.sample_offset, s.length);
  }

  // A test that failed with reads held at the gate must not hang in the
  // Stager's destructor (it joins workers blocked in those reads).
  void TearDown() override {
    if (gated_ != nullptr) gated_->Open();
    stager_.reset();
  }

  void Snapshot() {
    auto m = SnapshotTree(root_, kChunkSize);
    ASSERT_OK(m);
    manifest_ = std::move(*m);
    ASSERT_GT(manifest_->chunk_count(), 20u);
    total_segments_ = 0;
    for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) {
      total_segments_ += manifest_->Segments(c)->size();
    }
  }

  // A fresh source (fresh counters) and store (a "restart" when one existed).
  void OpenSourceAndStore(uint64_t capacity = kBigCapacity, ChunkStoreOptions store_options = {}) {
    stager_.reset();
    gated_.reset();
    store_.reset();
    source_.reset();
    auto s = OpenPosixSourceAsProcess(root_, executor_.get());
    ASSERT_OK(s);
    source_ = std::move(*s);
    gated_ = std::make_shared<ScriptedSource>(source_);
    auto store = ChunkStore::Open(store_dir_, capacity, store_options);
    ASSERT_OK(store);
    store_ = std::move(*store);
  }

  std::vector<ChunkId> AllChunks() const {
    std::vector<ChunkId> all(manifest_->chunk_count());
    for (ChunkId c = 0; c < all.size(); ++c) all[c] = c;
    return all;
  }

  void CreateStager(std::vector<ChunkId> owned, StagerOptions options = {}) {
    options.dataset = kDataset;
    auto s = Stager::Create(manifest_, gated_, store_, owned, std::move(options));
    ASSERT_OK(s);
    stager_ = std::move(*s);
  }
  StagerOptions Threads(uint32_t n) {
    StagerOptions o;
    o.threads = n;
    return o;
  }

  bool WaitForState(StagingState state) {
    return WaitFor([&] { return stager_->Progress().state == state; }, 20s);
  }

  ChunkKey Key(ChunkId c) const { return ChunkKey{kDataset, manifest_->id(), c}; }

  // Every sample once, shuffled with `seed` (a plan's epoch).
  std::vector<SampleId> ShuffledOrder(uint32_t seed) const {
    std::vector<SampleId> order(manifest_->sample_count());
    for (SampleId s = 0; s < order.size(); ++s) order[s] = s;
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    return order;
  }
  // The chunk-file bytes of the first `n` chunks of `chunk_order`.
  uint64_t FileBytesOfFirst(const std::vector<ChunkId>& chunk_order, size_t n) const {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i)
      bytes += store_->ChunkBytes(*manifest_->Segments(chunk_order[i]));
    return bytes;
  }

  // Eight samples of one chunk (as a READ of a cold batch names them), asked
  // for with ReadAhead while every source read is held: checks that the
  // lead-in threads all wait at the gate at once (read together), then opens it.
  std::vector<SampleId> ReadAheadHeldTogether() {
    const ChunkId chunk = *FirstChunkWithSegments(*manifest_, 8);
    const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk);
    std::vector<SampleId> batch;
    for (size_t i = 0; i < 8; ++i) batch.push_back(segments[i].sample);
    gated_->HoldIf([](const SourceFile&, uint64_t) { return true; });
    stager_->ReadAhead(batch);
    EXPECT_TRUE(WaitFor([&] { return gated_->held() == static_cast<int>(kReadAheadThreads); }, 10s))
        << gated_->held() << " reads in flight";
    gated_->Open();
    return batch;
  }

  // Verifies every present segment of `chunk` (checksum and source bytes);
  // returns how many are present.
  size_t VerifyChunk(ChunkId chunk) {
    if (!store_->HasChunk(Key(chunk))) return 0;
    auto segments = manifest_->Segments(chunk);
    EXPECT_OK(segments);
    auto reader = store_->OpenChunkReader(Key(chunk), *segments);
    EXPECT_OK(reader);
    if (!reader.ok()) return 0;
    auto scan = (*reader)->Scan(ChunkScanMode::kVerifyPayload);
    EXPECT_OK(scan);
    EXPECT_TRUE(scan->corrupt.empty()) << "chunk " << chunk;
    size_t present = 0;
    for (uint32_t i = 0; i < segments->size(); ++i) {
      if (!(*reader)->IsPresent(i)) continue;
      ++present;
      auto bytes = (*reader)->Read(i);
      EXPECT_OK(bytes);
      EXPECT_TRUE(bytes.ok() && *bytes == Expected((*segments)[i]))
          << "chunk " << chunk << " segment " << i;
    }
    return present;
  }
  size_t VerifyAll() {
    size_t present = 0;
    for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) present += VerifyChunk(c);
    return present;
  }
  bool ChunkComplete(ChunkId c) const {
    auto chunk = store_->Chunk(Key(c));
    return chunk.ok() && chunk->complete();
  }
  // How often the source was asked for `path` at `offset`.
  int ReadsOf(const std::string& path, uint64_t offset = 0) const {
    return ReadCounts()[{path, offset}];
  }
  // How often the source was asked for each (path, offset).
  std::map<std::pair<std::string, uint64_t>, int> ReadCounts() const {
    std::map<std::pair<std::string, uint64_t>, int> counts;
    for (const auto& r : gated_->log()) ++counts[r];
    return counts;
  }

  TempDir dir_;
  std::string root_;
  std::string store_dir_;
  std::map<std::string, size_t> sizes_;
  std::unique_ptr<IdentityExecutor> executor_;
  std::shared_ptr<const Manifest> manifest_;
  size_t total_segments_ = 0;
  std::shared_ptr<PosixSource> source_;
  std::shared_ptr<ScriptedSource> gated_;
  std::shared_ptr<ChunkStore> store_;
  std::unique_ptr<Stager> stager_;
};

TEST_F(StagerTest, StagesEverythingOnceAndARestartReadsNothing) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(4));
  EXPECT_EQ(stager_->Progress().state, StagingState::kIdle);
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));

  EXPECT_EQ(VerifyAll(), total_segments_);
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) EXPECT_TRUE(ChunkComplete(c)) << c;
  // One open per segment: a sample per small file, one per piece of a big one.
  const size_t pieces = 3 + 4 + 2;  // 150000, 200000, 70000 bytes in 64 KiB chunks
  EXPECT_EQ(total_segments_, manifest_->sample_count() - 3 + pieces);
  SourceCounters counters = source_->Counters();
  EXPECT_EQ(counters.opens, total_segments_);
  EXPECT_EQ(counters.bytes, manifest_->total_bytes());
  EXPECT_EQ(counters.errors_total(), 0u);
  for (const auto& [read, n] : ReadCounts()) EXPECT_EQ(n, 1) << read.first << "@" << read.second;

  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.chunks_owned, manifest_->chunk_count());
  EXPECT_EQ(p.chunks_staged, p.chunks_owned);
  EXPECT_EQ(p.chunks_complete, p.chunks_owned);
  EXPECT_EQ(p.bytes_owned, manifest_->total_bytes());
  EXPECT_EQ(p.bytes_staged, manifest_->total_bytes());
  EXPECT_EQ(p.queue_depth, 0u);
  EXPECT_EQ(p.samples_failed_total(), 0u);
  EXPECT_EQ(p.chunks_not_staged(), 0u);
  StagingProgress published = p.ToStagingProgress();
  EXPECT_EQ(published.chunks_total, p.chunks_owned);
  EXPECT_EQ(published.bytes_staged, manifest_->total_bytes());

  // Restart: a new store scan, a new source, a new stager: nothing to read.
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(4));
  EXPECT_EQ(stager_->Progress().state, StagingState::kComplete);
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  auto bytes = stager_->FetchSample(0);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes(manifest_->PathOf(0), manifest_->SizeOf(0)));
  EXPECT_EQ(source_->Counters().opens, 0u);
  stager_->Stop();
  EXPECT_EQ(stager_->Progress().state, StagingState::kStopped);
}

TEST_F(StagerTest, StopMidwayLeavesOnlyRightBytesAndARestartReadsOnlyTheRest) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(2));
  std::atomic<int> reads{0};
  gated_->HoldIf([&](const SourceFile&, uint64_t) { return ++reads > 120; });
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return gated_->held() == 2; }, 20s));
  std::thread stopper([&] { stager_->Stop(); });
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kStopped; }, 20s));
  gated_->Open();
  stopper.join();
  EXPECT_EQ(stager_->Progress().state, StagingState::kStopped);

  // Every segment read was committed (the two held reads finished first), and
  // every present segment is intact and right.
  const size_t read_before = gated_->log().size();
  EXPECT_EQ(read_before, 122u);
  EXPECT_EQ(VerifyAll(), read_before);
  EXPECT_LT(read_before, total_segments_);

  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(3));
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(source_->Counters().opens, total_segments_ - read_before);
  EXPECT_EQ(VerifyAll(), total_segments_);
}

TEST_F(StagerTest, FollowsTheStagingOrderExactlyWithOneThread) {
  OpenSourceAndStore();
  std::vector<SampleId> order = ShuffledOrder(7);
  order.resize(order.size() / 3);  // chunks it never names come after, in chunk order
  StagerOptions options = Threads(1);
  options.order = order;
  options.read_ahead = 0;  // the bulk order alone (no lead-in reads first)
  CreateStager(AllChunks(), options);

  // The expected chunk order, computed here independently.
  std::vector<ChunkId> expected;
  std::set<ChunkId> seen;
  for (SampleId s : order) {
    auto info = manifest_->Sample(s);
    ASSERT_OK(info);
    for (uint32_t p = 0; p < info->chunk_count; ++p) {
      if (seen.insert(info->chunk + p).second) expected.push_back(info->chunk + p);
    }
  }
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) {
    if (!seen.contains(c)) expected.push_back(c);
  }
  EXPECT_EQ(stager_->chunk_order(), expected);
  EXPECT_NE(expected, AllChunks());

  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  // The reads, mapped back to (chunk, segment), are the chunks in that order,
  // each chunk's segments in payload order.
  std::map<std::pair<std::string, uint64_t>, std::pair<ChunkId, uint32_t>> where;
  std::vector<std::pair<ChunkId, uint32_t>> expected_reads;
  for (ChunkId c : expected) {
    auto segments = manifest_->Segments(c);
    for (uint32_t i = 0; i < segments->size(); ++i) {
      where[{manifest_->PathOf((*segments)[i].sample), (*segments)[i].sample_offset}] = {c, i};
      expected_reads.emplace_back(c, i);
    }
  }
  std::vector<std::pair<ChunkId, uint32_t>> reads;
  for (const auto& r : gated_->log()) reads.push_back(where.at(r));
  EXPECT_EQ(reads, expected_reads);
}

// A plan registered while staging runs re-orders it in place (what the cache
// node does now, instead of replacing the Stager): the chunk being
// filled is finished, the next ones follow the new order, nothing is read
// twice.
TEST_F(StagerTest, SetOrderMidStagingFollowsTheNewOrderAndReadsNothingTwice) {
  OpenSourceAndStore();
  // The worker takes chunk `busy` first and stops in the read of its second
  // segment.
  auto found = FirstChunkWithSegments(*manifest_, 3);
  ASSERT_OK(found);
  const ChunkId busy = *found;
  const std::vector<ChunkSegment> first = *manifest_->Segments(busy);
  StagerOptions options = Threads(1);
  options.order = {first[0].sample};
  options.read_ahead = 0;  // the bulk order alone (no lead-in reads first)
  CreateStager(AllChunks(), options);
  const std::string held_path = manifest_->PathOf(first[1].sample);
  gated_->HoldIf([&](const SourceFile& f, uint64_t) { return f.path == held_path; });
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return gated_->held() == 1; }, 20s));

  // The new order: every sample, backwards.
  std::vector<SampleId> order(manifest_->sample_count());
  for (SampleId s = 0; s < order.size(); ++s)
    order[s] = static_cast<SampleId>(order.size() - 1 - s);
  ASSERT_OK(stager_->SetOrder(order));
  // Chunks by their first sample in that order (a big sample's pieces in
  // chunk order).
  std::vector<ChunkId> expected;
  std::set<ChunkId> seen;
  for (SampleId s : order) {
    auto info = manifest_->Sample(s);
    ASSERT_OK(info);
    for (uint32_t p = 0; p < info->chunk_count; ++p) {
      if (seen.insert(info->chunk + p).second) expected.push_back(info->chunk + p);
    }
  }
  ASSERT_EQ(expected.size(), manifest_->chunk_count());
  EXPECT_EQ(stager_->chunk_order(), expected);
  // A bad order changes nothing.
  const std::vector<SampleId> bad = {static_cast<SampleId>(manifest_->sample_count())};
  EXPECT_EQ(stager_->SetOrder(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stager_->chunk_order(), expected);

  gated_->Open();
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(VerifyAll(), total_segments_);
  for (const auto& [read, n] : ReadCounts()) EXPECT_EQ(n, 1) << read.first << "@" << read.second;
  // The chunks as read: `busy` (being filled), then the new order.
  std::map<std::pair<std::string, uint64_t>, ChunkId> chunk_of;
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) {
    const std::vector<ChunkSegment> segments = *manifest_->Segments(c);
    for (const ChunkSegment& seg : segments) {
      chunk_of[{manifest_->PathOf(seg.sample), seg.sample_offset}] = c;
    }
  }
  std::vector<ChunkId> chunks_read;
  for (const auto& r : gated_->log()) {
    const ChunkId c = chunk_of.at(r);
    if (chunks_read.empty() || chunks_read.back() != c) chunks_read.push_back(c);
  }
  std::vector<ChunkId> want = {busy};
  for (ChunkId c : expected) {
    if (c != busy) want.push_back(c);
  }
  EXPECT_EQ(chunks_read, want);
}

// The first samples of the staging order are read at Start on their own
// threads (the lead-in), ahead of bulk staging, which fills whole chunks: a
// reader of the first batches finds them read, not fetched one by one. A new
// order (SetOrder) gets its own lead-in. Nothing is read twice.
TEST_F(StagerTest, TheFirstSamplesOfTheOrderAreReadAtStartKeptForTheirChunksAndNothingTwice) {
  OpenSourceAndStore();
  // Small files only (one piece each), in a shuffled order.
  std::vector<SampleId> order;
  for (SampleId s = 0; s < manifest_->sample_count(); ++s) {
    if (manifest_->SizeOf(s) <= kChunkSize) order.push_back(s);
  }
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  StagerOptions options = Threads(2);
  options.order = order;
  options.read_ahead = 8;
  CreateStager(AllChunks(), options);
  stager_->Pause();  // no bulk reads: only the lead-in
  auto stored = [&](SampleId s) {
    const ChunkId c = manifest_->ChunkOf(s);
    auto bits = store_->PresentSegments(Key(c));
    auto segments = manifest_->Segments(c);
    for (uint32_t i = 0; bits.ok() && i < segments->size(); ++i) {
      if ((*segments)[i].sample == s) return static_cast<bool>((*bits)[i]);
    }
    return false;
  };
  ASSERT_OK(stager_->Start());
  // Read, and kept in memory for the bulk worker that stages their chunks
  // (one commit per chunk), not stored one by one.
  ASSERT_TRUE(WaitFor([&] { return source_->Counters().opens == 8; }, 20s))
      << source_->Counters().opens << " samples read";
  for (size_t q = 0; q < 8; ++q) EXPECT_EQ(ReadsOf(manifest_->PathOf(order[q])), 1) << q;
  EXPECT_FALSE(stored(order[0]));
  EXPECT_FALSE(stored(order[8]));
  for (size_t q = 0; q < 8; ++q) {
    auto b = stager_->FetchSample(order[q]);
    ASSERT_OK(b);
    EXPECT_EQ(*b, Bytes(manifest_->PathOf(order[q]), manifest_->SizeOf(order[q])));
  }
  EXPECT_EQ(source_->Counters().opens, 8u);  // nothing read twice

  // A new order: its first 8 not stored yet are read.
  std::vector<SampleId> reversed(order.rbegin(), order.rend());
  ASSERT_OK(stager_->SetOrder(reversed));
  ASSERT_TRUE(WaitFor([&] { return source_->Counters().opens == 16; }, 20s))
      << source_->Counters().opens << " samples read";
  for (size_t q = 0; q < 8; ++q) EXPECT_EQ(ReadsOf(manifest_->PathOf(reversed[q])), 1) << q;
  stager_->Resume();
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(VerifyAll(), total_segments_);
  for (const auto& [read, n] : ReadCounts()) EXPECT_EQ(n, 1) << read.first << "@" << read.second;
}

TEST_F(StagerTest, FetchNowReadsAheadOfBulkStagingAndIsNeverReadAgain) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(2));
  stager_->Pause();  // before Start: the workers take nothing until Resume
  ASSERT_OK(stager_->Start());
  EXPECT_EQ(stager_->Progress().state, StagingState::kIdle);
  // Hold every bulk read but those of the sample fetched below.
  const ChunkId last = stager_->chunk_order().back();
  auto last_segments = manifest_->Segments(last);
  ASSERT_OK(last_segments);
  const SampleId wanted = last_segments->back().sample;
  gated_->HoldIf(
      [&](const SourceFile& f, uint64_t) { return f.path != manifest_->PathOf(wanted); });
  stager_->Resume();
  ASSERT_TRUE(WaitFor([&] { return gated_->held() >= 1; }, 20s));

  // Bulk staging is stuck far from `last`: the fetch does not wait for it.
  auto bytes = stager_->FetchSample(wanted);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes(manifest_->PathOf(wanted), manifest_->SizeOf(wanted)));
  EXPECT_EQ(stager_->Progress().on_demand_fetches, 1u);
  EXPECT_TRUE(store_->HasChunk(Key(last)));
  auto present = store_->PresentSegments(Key(last));
  ASSERT_OK(present);
  EXPECT_TRUE(present->back());
  // A second fetch is served from the store.
  auto again = stager_->FetchSample(wanted);
  ASSERT_OK(again);
  EXPECT_EQ(*again, *bytes);
  EXPECT_EQ(stager_->Progress().on_demand_fetches, 1u);

  gated_->Open();
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(source_->Counters().opens, total_segments_);
  for (const auto& [read, n] : ReadCounts()) EXPECT_EQ(n, 1) << read.first << "@" << read.second;
  EXPECT_EQ(VerifyAll(), total_segments_);
}

TEST_F(StagerTest, FetchNowOfAChunkABulkWorkerHoldsIsCommittedByTheWorker) {
  OpenSourceAndStore();
  // The first chunk in chunk order with at least 4 segments.
  auto found = FirstChunkWithSegments(*manifest_, 4);
  ASSERT_OK(found);
  const ChunkId chunk = *found;
  const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk);
  CreateStager({chunk}, Threads(1));
  const std::string first_path = manifest_->PathOf(segments[0].sample);
  gated_->HoldIf([&](const SourceFile& f, uint64_t) { return f.path == first_path; });
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return gated_->held() == 1; }, 20s));

  // The worker holds the chunk and waits on segment 0; segment 3 comes now.
  auto bytes = stager_->FetchSegment(chunk, 3);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Expected(segments[3]));
  // So does segment 0, sharing the worker's read once it is let through.
  std::thread sharer([&] {
    auto b = stager_->FetchSegment(chunk, 0);
    EXPECT_OK(b);
    EXPECT_TRUE(b.ok() && *b == Expected(segments[0]));
  });
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().on_demand_shared == 1; }, 20s));
  gated_->Open();
  sharer.join();
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(source_->Counters().opens, segments.size());
  for (const auto& [read, n] : ReadCounts()) EXPECT_EQ(n, 1) << read.first << "@" << read.second;
  EXPECT_EQ(VerifyChunk(chunk), segments.size());
  EXPECT_EQ(stager_->Progress().on_demand_fetches, 1u);
}

TEST_F(StagerTest, ConcurrentFetchesOfOneSampleShareOneSourceRead) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(1));  // not started: on demand only
  const SampleId wanted = 17;
  const std::string path = manifest_->PathOf(wanted);
  gated_->HoldIf([&](const SourceFile& f, uint64_t) { return f.path == path; });
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      auto b = stager_->FetchSample(wanted);
      if (b.ok() && *b == Bytes(path, manifest_->SizeOf(wanted))) ++right;
    });
  }
  ASSERT_TRUE(WaitFor(
      [&] { return gated_->held() == 1 && stager_->Progress().on_demand_shared == kThreads - 1; },
      20s));
  gated_->Open();
  for (auto& t : threads) t.join();
  EXPECT_EQ(right, kThreads);
  EXPECT_EQ(source_->Counters().opens, 1u);
  EXPECT_EQ(stager_->Progress().on_demand_fetches, 1u);
  EXPECT_EQ(VerifyChunk(manifest_->ChunkOf(wanted)), 1u);
}

// A reader's DropAndRefetch of a segment of the chunk a bulk worker is filling
// (holding its writer) is answered at once from its own source read; the
// worker drops the old copy, puts the fresh bytes and commits them.
TEST_F(StagerTest, DropAndRefetchIsHandedToTheBulkWorkerHoldingTheChunk) {
  OpenSourceAndStore();
  // A chunk of several segments, the first two staged on demand.
  auto found = FirstChunkWithSegments(*manifest_, 4);
  ASSERT_OK(found);
  const ChunkId chunk = *found;
  const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk);
  // One worker: a second would help read the held chunk's other segments
  // meanwhile (Stager::HelpLocked), which the counts below would include.
  CreateStager({chunk}, Threads(1));
  ASSERT_OK(stager_->FetchSegment(chunk, 0));
  ASSERT_OK(stager_->FetchSegment(chunk, 1));
  const size_t opens = source_->Counters().opens;
  // The bulk worker takes the chunk and stops in the read of segment 2,
  // holding the chunk's writer.
  const std::string held_path = manifest_->PathOf(segments[2].sample);
  gated_->HoldIf([&](const SourceFile& f, uint64_t) { return f.path == held_path; });
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return gated_->held() == 1; }, 20s));
  EXPECT_EQ(stager_->Progress().chunks_in_flight, 1u);

  auto bytes = stager_->DropAndRefetch(chunk, 0);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Expected(segments[0]));
  EXPECT_EQ(gated_->held(), 1);  // answered while the worker still holds the chunk
  EXPECT_EQ(source_->Counters().opens, opens + 1);
  EXPECT_EQ(stager_->Progress().refetches, 1u);

  gated_->Open();
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(VerifyChunk(chunk), segments.size());
  // Replaced by the worker, and read from the source once more only.
  EXPECT_EQ(source_->Counters().opens, opens + 1 + segments.size() - 2);
  auto again = stager_->FetchSegment(chunk, 0);
  ASSERT_OK(again);
  EXPECT_EQ(*again, Expected(segments[0]));
  EXPECT_EQ(source_->Counters().opens, opens + 1 + segments.size() - 2);

  // With no writer held, the caller replaces the copy itself.
  auto third = stager_->DropAndRefetch(chunk, 1);
  ASSERT_OK(third);
  EXPECT_EQ(*third, Expected(segments[1]));
  EXPECT_EQ(VerifyChunk(chunk), segments.size());
  EXPECT_TRUE(ChunkComplete(chunk));
  // Bad calls.
  EXPECT_EQ(stager_->DropAndRefetch(chunk, static_cast<uint32_t>(segments.size())).status().code(),
            StatusCode::kInvalidArgument);
  const ChunkId other = static_cast<ChunkId>((chunk + 1) % manifest_->chunk_count());
  EXPECT_EQ(stager_->DropAndRefetch(other, 0).status().code(),
            StatusCode::kFailedPrecondition);  // not owned
}

TEST_F(StagerTest, ChangedAndVanishedFilesArePerSampleErrors) {
  // Sample 5 is rewritten after the snapshot (same size, other bytes and
  // mtime), sample 9 is deleted.
  const std::string changed = manifest_->PathOf(5);
  const std::string gone = manifest_->PathOf(9);
  const ChunkId chunk = manifest_->ChunkOf(5);
  dir_.WriteFile("source/" + changed, Bytes(changed + "v2", manifest_->SizeOf(5)));
  const auto mtime = fs::last_write_time(root_ + "/" + changed);
  fs::last_write_time(root_ + "/" + changed, mtime + 5s);
  fs::remove(root_ + "/" + gone);

  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(3));
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.samples_failed_of(SourceErrorKind::kChanged), 1u);
  EXPECT_EQ(p.samples_failed_of(SourceErrorKind::kNotFound), 1u);
  EXPECT_EQ(p.samples_failed_total(), 2u);
  EXPECT_EQ(p.chunks_staged, p.chunks_owned);
  EXPECT_EQ(p.ToStagingProgress().samples_failed, 2u);
  EXPECT_EQ(p.bytes_staged, manifest_->total_bytes() - manifest_->SizeOf(5) - manifest_->SizeOf(9));
  EXPECT_EQ(stager_->SampleError(5).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stager_->SampleError(9).code(), StatusCode::kNotFound);
  EXPECT_OK(stager_->SampleError(6));

  // Never served; the rest of the chunk is.
  auto fetched = stager_->FetchSample(5);
  EXPECT_EQ(fetched.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(fetched.status().message(), HasSubstr(Quoted(changed)));
  EXPECT_EQ(stager_->FetchSample(9).status().code(), StatusCode::kNotFound);
  auto segments = manifest_->Segments(chunk);
  auto present = store_->PresentSegments(Key(chunk));
  ASSERT_OK(present);
  for (uint32_t i = 0; i < segments->size(); ++i) {
    const SampleId s = (*segments)[i].sample;
    EXPECT_EQ((*present)[i], s != 5 && s != 9) << "sample " << s;
  }
  EXPECT_EQ(VerifyAll(), total_segments_ - 2);
  // The failed samples cost one open each, like the others.
  EXPECT_EQ(source_->Counters().opens, total_segments_);
}

// Security, in the stager: a 300,000-byte sample (five
// 64 KiB chunks) on a node with room for two. Once those two are staged, the
// file is rewritten at the same size and its mtime restored (touch -r). The
// on-demand read of the whole sample (two pieces from the store, three from
// the source) must not join the old version's pieces with the new one's, nor
// may staging the rest once there is room.
TEST_F(StagerTest, PiecesOfARewrittenFileAreNeverJoinedWithStagedOnes) {
  Write("big/e.bin", 300'000);
  Snapshot();
  auto found = manifest_->Find("big/e.bin");
  ASSERT_OK(found);
  const SampleId big = *found;
  ASSERT_EQ(manifest_->Sample(big)->chunk_count, 5u);
  std::vector<ChunkId> owned;
  for (ChunkId c = manifest_->ChunkOf(big); c < manifest_->ChunkOf(big) + 5; ++c) {
    owned.push_back(c);
  }
  // Room for the first two chunks of the order, not a byte more.
  OpenSourceAndStore();
  CreateStager(owned, Threads(1));
  std::vector<ChunkId> order;  // the owned chunks in staging order
  for (ChunkId c : stager_->chunk_order()) {
    if (std::find(owned.begin(), owned.end(), c) != owned.end()) order.push_back(c);
  }
  ASSERT_EQ(order.size(), 5u);
  const uint64_t capacity = store_->ChunkBytes(*manifest_->Segments(order[0])) +
                            store_->ChunkBytes(*manifest_->Segments(order[1]));
  stager_.reset();
  OpenSourceAndStore(capacity);
  CreateStager(owned, Threads(1));
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kCapacity));
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(ChunkComplete(order[i]), i < 2) << i;

  testing::RewriteKeepingMtime(root_ + "/big/e.bin", Bytes("big/e.bin, version 2", 300'000));
  auto fetched = stager_->FetchSample(big);
  ASSERT_FALSE(fetched.ok()) << "returned " << fetched->size() << " bytes, of which the first "
                             << "two pieces are the snapshot's and the rest the rewrite's";
  EXPECT_EQ(fetched.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(fetched.status().message(), HasSubstr("'big/e.bin'"));
  EXPECT_THAT(fetched.status().message(), HasSubstr("ctime "));
  EXPECT_THAT(fetched.status().message(), HasSubstr("granary dataset snapshot"));
  EXPECT_EQ(SourceErrorKindOf(fetched.status()), SourceErrorKind::kChanged);

  // A restart with room for everything: the rest is not staged from the new
  // version; what was staged is the snapshot's and stays.
  OpenSourceAndStore(kBigCapacity);
  CreateStager(owned, Threads(1));
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.samples_failed_of(SourceErrorKind::kChanged), 1u);
  EXPECT_EQ(stager_->SampleError(big).code(), StatusCode::kFailedPrecondition);
  for (size_t i = 0; i < order.size(); ++i) {
    auto present = store_->PresentSegments(Key(order[i]));
    const bool staged = present.ok() && !present->empty() && (*present)[0];
    EXPECT_EQ(staged, i < 2) << "chunk " << order[i];
  }
  EXPECT_EQ(VerifyAll(), 2u);  // the two pieces staged before, with the snapshot's bytes
  EXPECT_FALSE(stager_->FetchSample(big).ok());
}

// The file system fills up under chunk files that exist already (created
// without preallocation): the Puts fail with ENOSPC. Staging pauses as
// disk_full, fails no chunk, and finishes once space is back.
TEST_F(StagerTest, AFullFileSystemUnderExistingChunkFilesPausesAndIsRetried) {
  const std::string mnt = dir_.Join("small");
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=2m") != 0) {
    GTEST_SKIP() << "cannot mount a 2 MiB tmpfs here (" << std::strerror(errno)
                 << "); the test needs CAP_SYS_ADMIN";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  store_dir_ = mnt + "/store";
  ChunkStoreOptions sparse;
  sparse.preallocate = false;
  OpenSourceAndStore(kBigCapacity, sparse);
  StagerOptions options = Threads(2);
  options.disk_full_backoff = 20ms;
  options.disk_full_backoff_max = 100ms;
  options.disk_full_retries = 1000;  // keeps retrying until the space is back
  CreateStager(AllChunks(), options);
  stager_->Pause();
  ASSERT_OK(stager_->Start());
  // Every chunk file exists, holding its first segment only.
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) ASSERT_OK(stager_->FetchSegment(c, 0));
  // Fill the file system.
  const std::string filler = mnt + "/filler";
  const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  const std::string block(4096, 'x');
  int err = 0;
  for (int i = 0; i < 1024 && err == 0; ++i) {
    if (::write(fd, block.data(), block.size()) < 0) err = errno;
  }
  ::close(fd);
  ASSERT_EQ(err, ENOSPC);

  stager_->Resume();
  ASSERT_TRUE(WaitForState(StagingState::kDiskFull));
  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.chunks_failed, 0u);
  EXPECT_EQ(p.last_error.code(), StatusCode::kResourceExhausted) << p.last_error.ToString();
  EXPECT_LT(p.chunks_complete, p.chunks_owned);

  fs::remove(filler);
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  p = stager_->Progress();
  EXPECT_EQ(p.chunks_failed, 0u);
  EXPECT_EQ(p.chunks_complete, p.chunks_owned);
  EXPECT_EQ(VerifyAll(), total_segments_);
  stager_.reset();
}

// Transient source errors (EIO) are retried with a backoff; one outlasting the
// retries is recorded as kIo but is not final: an on-demand fetch asks the
// source again, and Resume() re-queues it for bulk staging.
TEST_F(StagerTest, TransientSourceErrorsAreRetriedAndNeverFinal) {
  OpenSourceAndStore();
  const std::string flaky = manifest_->PathOf(7);  // fails twice, then reads
  const std::string dead = manifest_->PathOf(11);  // fails four times
  const SampleId big = *manifest_->Find("big/a.bin");
  const std::string broken = manifest_->PathOf(big);  // fails until repaired (3 pieces)
  ASSERT_GT(manifest_->SizeOf(big), 2 * kChunkSize);
  std::atomic<int> flaky_left{2};
  std::atomic<int> dead_left{4};
  std::atomic<bool> repaired{false};
  gated_->SetHook([&](const SourceFile& f, uint64_t) {
    const bool fail = (f.path == flaky && flaky_left.fetch_sub(1) > 0) ||
                      (f.path == dead && dead_left.fetch_sub(1) > 0) ||
                      (f.path == broken && !repaired);
    return fail ? Status::IoError("read " + Quoted(f.path) + ": Input/output error (injected)")
                : Status::Ok();
  });
  StagerOptions options = Threads(3);
  options.io_retries = 3;
  options.io_retry_backoff = 5ms;
  CreateStager(AllChunks(), options);
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.samples_failed_of(SourceErrorKind::kIo), 2u);  // dead and broken
  EXPECT_EQ(p.samples_failed_total(), 2u);
  EXPECT_OK(stager_->SampleError(7));
  EXPECT_EQ(stager_->SampleError(11).code(), StatusCode::kIoError);
  EXPECT_EQ(stager_->SampleError(big).code(), StatusCode::kIoError);
  EXPECT_EQ(ReadsOf(flaky), 3);  // two failures and the read
  EXPECT_EQ(ReadsOf(dead), 4);   // the read and three retries
  EXPECT_GE(p.source_retries, 2u + 3u);

  // On demand: asked once more (no retries), and it reads now.
  auto bytes = stager_->FetchSample(11);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes(dead, manifest_->SizeOf(11)));
  EXPECT_OK(stager_->SampleError(11));
  EXPECT_EQ(ReadsOf(dead), 5);
  EXPECT_EQ(stager_->Progress().samples_failed_of(SourceErrorKind::kIo), 1u);
  // Still broken: one attempt, the error again, still counted once.
  const int broken_reads = ReadsOf(broken);
  EXPECT_EQ(stager_->FetchSegment(manifest_->ChunkOf(big), 0).status().code(),
            StatusCode::kIoError);
  EXPECT_EQ(ReadsOf(broken), broken_reads + 1);
  EXPECT_EQ(stager_->Progress().samples_failed_of(SourceErrorKind::kIo), 1u);

  // Repaired: Resume re-queues it and bulk staging stages all its pieces.
  repaired = true;
  stager_->Resume();
  ASSERT_TRUE(WaitFor(
      [&] {
        const StagerProgress q = stager_->Progress();
        return q.state == StagingState::kComplete && q.samples_failed_total() == 0 &&
               q.chunks_complete == q.chunks_owned && q.chunks_in_flight == 0;
      },
      20s));
  EXPECT_EQ(VerifyAll(), total_segments_);
}

// A continuous stream of on-demand reads that never lets the number pending
// drop to zero (each reader's read finishes only once the next one has
// started) does not starve bulk staging: it still completes.
TEST_F(StagerTest, ContinuousOnDemandReadsDoNotStarveBulkStaging) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(1));
  // The readers' chunk, staged beforehand: they replace two of its segments
  // over and over, each replacement a source read.
  auto found = FirstChunkWithSegments(*manifest_, 2);
  ASSERT_OK(found);
  const ChunkId hot = *found;
  const uint32_t hot_segments = static_cast<uint32_t>(manifest_->Segments(hot)->size());
  for (uint32_t i = 0; i < hot_segments; ++i) ASSERT_OK(stager_->FetchSegment(hot, i));
  std::mutex mu;
  std::condition_variable cv;
  uint64_t started = 0;  // guarded by mu
  bool stop = false;     // guarded by mu
  gated_->SetHook([&](const SourceFile&, uint64_t) {
    if (!t_on_demand_reader) return Status::Ok();
    std::unique_lock<std::mutex> lock(mu);
    const uint64_t me = started++;
    cv.notify_all();
    cv.wait(lock, [&] { return stop || started > me + 1; });  // relay to the next read
    return Status::Ok();
  });
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (uint32_t r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      t_on_demand_reader = true;
      const ChunkSegment segment = (*manifest_->Segments(hot))[r];
      for (int i = 0; i < 100'000; ++i) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop) return;
        }
        auto bytes = stager_->DropAndRefetch(hot, r);
        if (!bytes.ok() || *bytes != Expected(segment)) ++wrong;
      }
    });
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return started >= 4;
      },
      20s));
  ASSERT_OK(stager_->Start());
  const bool completed = WaitForState(StagingState::kComplete);
  uint64_t on_demand_reads = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    on_demand_reads = started;
    stop = true;
    cv.notify_all();
  }
  for (auto& t : readers) t.join();
  EXPECT_TRUE(completed) << stager_->Progress().chunks_staged << " of "
                         << stager_->Progress().chunks_owned << " chunks staged";
  EXPECT_EQ(wrong.load(), 0);
  // The stream went on throughout (about kBulkReadEveryOnDemand on-demand
  // reads per bulk read; with bulk reads waiting for none pending, bulk
  // staging never gets past the first chunk).
  EXPECT_GE(on_demand_reads, total_segments_ - hot_segments);
  EXPECT_EQ(VerifyAll(), total_segments_);
}

// A source read that hangs (held at the gate) cannot be cancelled; Stop with a
// timeout stops waiting for it and says so, fetches keep working, and once the
// read returns the worker exits and is joined.
TEST_F(StagerTest, StopWithATimeoutDoesNotWaitForAHungSourceRead) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(2));
  const ChunkId first = stager_->chunk_order().front();
  const std::string hung = manifest_->PathOf(manifest_->Segments(first)->front().sample);
  gated_->HoldIf(
      [&](const SourceFile& f, uint64_t offset) { return f.path == hung && offset == 0; });
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return gated_->held() == 1; }, 20s));
  EXPECT_FALSE(stager_->Stop(50ms));
  EXPECT_EQ(stager_->Progress().state, StagingState::kStopped);
  EXPECT_EQ(gated_->held(), 1);
  const ChunkId last = stager_->chunk_order().back();
  const SampleId other = manifest_->Segments(last)->back().sample;
  auto bytes = stager_->FetchSample(other);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Bytes(manifest_->PathOf(other), manifest_->SizeOf(other)));
  gated_->Open();  // the read returns
  EXPECT_TRUE(stager_->Stop(20s));
  EXPECT_TRUE(stager_->Stop(0ms));  // idempotent
  EXPECT_EQ(stager_->Start().code(), StatusCode::kFailedPrecondition);
  VerifyAll();  // whatever is present is right
}

TEST_F(StagerTest, CapacityStopsAtAPrefixOfTheOrderAndServingGoesOn) {
  const std::vector<SampleId> order = ShuffledOrder(3);
  // Room for exactly the first 5 chunks of the order, and a byte short of the 6th.
  OpenSourceAndStore();
  StagerOptions options = Threads(1);
  options.order = order;
  // No lead-in: it stores the first samples of the order as on-demand fetches
  // do, in whatever chunks they are, which a capacity prefix does not bound.
  options.read_ahead = 0;
  CreateStager(AllChunks(), options);
  const std::vector<ChunkId> chunk_order = stager_->chunk_order();
  const uint64_t capacity = FileBytesOfFirst(chunk_order, 5) +
                            store_->ChunkBytes(*manifest_->Segments(chunk_order[5])) - 1;
  stager_.reset();
  OpenSourceAndStore(capacity);
  CreateStager(AllChunks(), options);
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kCapacity));

  EXPECT_LE(store_->used_bytes(), capacity);
  for (size_t i = 0; i < chunk_order.size(); ++i) {
    EXPECT_EQ(ChunkComplete(chunk_order[i]), i < 5) << "position " << i;
    EXPECT_EQ(store_->HasChunk(Key(chunk_order[i])), i < 5) << "position " << i;
  }
  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.chunks_staged, 5u);
  EXPECT_EQ(p.chunks_not_staged(), manifest_->chunk_count() - 5);
  EXPECT_EQ(p.last_error.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(p.last_error.message(), HasSubstr("raise the capacity"));

  // Staged samples are served from the store; an unstaged one is read from
  // the source and returned, but cannot be stored.
  const SampleId staged = manifest_->Segments(chunk_order[0])->front().sample;
  const size_t opens = source_->Counters().opens;
  auto b = stager_->FetchSample(staged);
  ASSERT_OK(b);
  EXPECT_EQ(*b, Bytes(manifest_->PathOf(staged), manifest_->SizeOf(staged)));
  EXPECT_EQ(source_->Counters().opens, opens);
  const SampleId unstaged = manifest_->Segments(chunk_order[5])->front().sample;
  auto u = stager_->FetchSample(unstaged);
  ASSERT_OK(u);
  EXPECT_EQ(*u, Bytes(manifest_->PathOf(unstaged), manifest_->SizeOf(unstaged)));
  EXPECT_GE(stager_->Progress().on_demand_not_stored, 1u);
  EXPECT_LE(store_->used_bytes(), capacity);
  EXPECT_EQ(stager_->Progress().state, StagingState::kCapacity);
}

TEST_F(StagerTest, ABudgetKeepsAPrefixOfTheOrderStreamsTheRestAndNeverChurns) {
  const std::vector<SampleId> order = ShuffledOrder(5);
  OpenSourceAndStore();
  StagerOptions options = Threads(2);
  options.order = order;
  CreateStager(AllChunks(), options);
  const std::vector<ChunkId> chunk_order = stager_->chunk_order();
  // A budget of the first 8 chunks of the order, and a byte short of the 9th.
  const uint64_t budget = FileBytesOfFirst(chunk_order, 8) +
                          store_->ChunkBytes(*manifest_->Segments(chunk_order[8])) - 1;
  stager_->SetBudget(budget);
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));  // what it keeps is staged

  StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.chunks_kept, 8u);
  EXPECT_EQ(p.chunks_staged, 8u);
  EXPECT_EQ(p.chunks_owned, manifest_->chunk_count());
  ASSERT_TRUE(p.budget.has_value());
  EXPECT_LE(p.file_bytes_kept, budget);
  EXPECT_EQ(p.ToStagingProgress().chunks_not_kept, manifest_->chunk_count() - 8);
  EXPECT_EQ(p.ToStagingProgress().chunks_kept(), 8u);
  // The lead-in stored only first samples that lie in kept chunks.
  for (size_t i = 0; i < chunk_order.size(); ++i) {
    EXPECT_EQ(store_->HasChunk(Key(chunk_order[i])), i < 8) << "position " << i;
  }
  EXPECT_LE(store_->used_bytes(), budget);

  // Every sample read twice (two epochs): right bytes, and what is not kept
  // is read from the source each time and never stored.
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (SampleId s = 0; s < manifest_->sample_count(); ++s) {
      auto b = stager_->FetchSample(s);
      ASSERT_OK(b);
      ASSERT_EQ(*b, Bytes(manifest_->PathOf(s), manifest_->SizeOf(s))) << s;
    }
  }
  p = stager_->Progress();
  EXPECT_GT(p.streamed_segments, 0u);
  EXPECT_GT(p.streamed_bytes, 0u);
  EXPECT_EQ(p.on_demand_not_stored, 0u);
  EXPECT_LE(store_->used_bytes(), budget);
  for (size_t i = 0; i < chunk_order.size(); ++i) {
    EXPECT_EQ(store_->HasChunk(Key(chunk_order[i])), i < 8) << "position " << i;
  }
  // A new order (each epoch's plan brings one) keeps the resident subset:
  // nothing is dropped, nothing staged again.
  std::vector<SampleId> reversed(order.rbegin(), order.rend());
  ASSERT_OK(stager_->SetOrder(reversed));
  EXPECT_EQ(stager_->DropNotKept().chunks, 0u);
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  for (size_t i = 0; i < chunk_order.size(); ++i) {
    EXPECT_EQ(store_->HasChunk(Key(chunk_order[i])), i < 8) << "position " << i;
  }
  EXPECT_EQ(stager_->Progress().chunks_kept, 8u);
  // The kept chunks were read from the source once, whatever the epochs did.
  const auto counts = ReadCounts();
  for (size_t i = 0; i < 8; ++i) {
    const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk_order[i]);
    for (const ChunkSegment& seg : segments) {
      EXPECT_EQ(counts.at({manifest_->PathOf(seg.sample), seg.sample_offset}), 1)
          << manifest_->PathOf(seg.sample);
    }
  }
}

TEST_F(StagerTest, AShrunkBudgetDropsTheLastKeptChunksAndAGrownOneStagesThemAgain) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(2));
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  const std::vector<ChunkId> chunk_order = stager_->chunk_order();
  const uint64_t used = store_->used_bytes();
  // Nothing outside a budget: nothing to drop.
  EXPECT_EQ(stager_->DropNotKept().chunks, 0u);

  uint64_t half = 0;
  size_t kept = 0;
  while (half + store_->ChunkBytes(*manifest_->Segments(chunk_order[kept])) <= used / 2) {
    half += store_->ChunkBytes(*manifest_->Segments(chunk_order[kept]));
    ++kept;
  }
  stager_->SetBudget(half);
  const Stager::Dropped dropped = stager_->DropNotKept();
  EXPECT_EQ(dropped.chunks, manifest_->chunk_count() - kept);
  EXPECT_EQ(store_->used_bytes(), used - dropped.file_bytes);
  EXPECT_LE(store_->used_bytes(), half);
  for (size_t i = 0; i < chunk_order.size(); ++i) {
    EXPECT_EQ(store_->HasChunk(Key(chunk_order[i])), i < kept) << "position " << i;
  }
  EXPECT_EQ(stager_->Progress().state, StagingState::kComplete);
  // Dropped chunks are still read right (from the source).
  const SampleId gone = manifest_->Segments(chunk_order.back())->front().sample;
  auto b = stager_->FetchSample(gone);
  ASSERT_OK(b);
  EXPECT_EQ(*b, Bytes(manifest_->PathOf(gone), manifest_->SizeOf(gone)));
  EXPECT_FALSE(store_->HasChunk(Key(chunk_order.back())));

  // No budget again: everything is staged back, byte-exact.
  stager_->SetBudget(std::nullopt);
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(VerifyAll(), total_segments_);
  EXPECT_EQ(stager_->Progress().chunks_kept, manifest_->chunk_count());
  // A budget of 0 keeps nothing.
  stager_->SetBudget(0);
  EXPECT_EQ(stager_->DropNotKept().chunks, manifest_->chunk_count());
  EXPECT_EQ(store_->used_bytes(), 0u);
  EXPECT_EQ(stager_->Progress().chunks_kept, 0u);
  EXPECT_EQ(stager_->Progress().state, StagingState::kComplete);
}

TEST_F(StagerTest, TheLruBaselineKeepsWhatWasReadLastAndDropsTheLeastRecent) {
  OpenSourceAndStore();
  StagerOptions options = Threads(1);
  options.lru = true;
  options.read_ahead = 0;
  CreateStager(AllChunks(), options);
  const std::vector<ChunkId> chunk_order = stager_->chunk_order();
  const uint64_t budget = FileBytesOfFirst(chunk_order, 4);
  stager_->SetBudget(budget);
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  for (size_t i = 0; i < chunk_order.size(); ++i) {
    EXPECT_EQ(store_->HasChunk(Key(chunk_order[i])), i < 4) << "position " << i;
  }
  // Read the 2nd, 3rd and 4th kept chunks, then one not kept: the 1st (the
  // least recently read) gives way to it.
  for (size_t i = 1; i < 4; ++i) stager_->TouchChunk(chunk_order[i]);
  const ChunkId later = chunk_order[10];
  const std::vector<ChunkSegment> segments = *manifest_->Segments(later);
  auto b = stager_->FetchSegment(later, 0);
  ASSERT_OK(b);
  EXPECT_EQ(*b, Expected(segments[0]));
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_FALSE(store_->HasChunk(Key(chunk_order[0])));
  EXPECT_TRUE(ChunkComplete(later));
  for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(store_->HasChunk(Key(chunk_order[i]))) << i;
  EXPECT_LE(store_->used_bytes(), budget);
  EXPECT_GT(VerifyAll(), 0u);  // every stored byte is right (VerifyChunk checks each)
}

TEST_F(StagerTest, ReadAheadOfAReadsSamplesReadsThemTogetherAndOnce) {
  OpenSourceAndStore();
  CreateStager(AllChunks(), Threads(1));
  stager_->Pause();  // no bulk staging: only what is asked for is read
  ASSERT_OK(stager_->Start());
  // Eight small samples of one chunk, as a READ of a cold batch names them.
  const std::vector<SampleId> batch = ReadAheadHeldTogether();
  for (SampleId s : batch) {
    auto b = stager_->FetchSample(s);
    ASSERT_OK(b);
    EXPECT_EQ(*b, Bytes(manifest_->PathOf(s), manifest_->SizeOf(s)));
  }
  for (SampleId s : batch) EXPECT_EQ(ReadsOf(manifest_->PathOf(s)), 1) << manifest_->PathOf(s);
  // Asked again: stored, nothing read. Bad ids are skipped.
  stager_->ReadAhead(batch);
  stager_->ReadAhead(std::vector<SampleId>{static_cast<SampleId>(manifest_->sample_count()), 0});
  for (SampleId s : batch) EXPECT_EQ(ReadsOf(manifest_->PathOf(s)), 1) << manifest_->PathOf(s);
}

TEST_F(StagerTest, ReadAheadStreamsWhatABudgetDoesNotKeepTogetherAndStoresNothing) {
  OpenSourceAndStore();
  StagerOptions options = Threads(2);
  options.read_ahead = 8;
  CreateStager(AllChunks(), options);
  stager_->SetBudget(0);  // nothing kept: everything is streamed
  ASSERT_OK(stager_->Start());
  const std::vector<SampleId> batch = ReadAheadHeldTogether();
  const ChunkId chunk = manifest_->ChunkOf(batch[0]);
  for (SampleId s : batch) {
    auto b = stager_->FetchSample(s);
    ASSERT_OK(b);
    EXPECT_EQ(*b, Bytes(manifest_->PathOf(s), manifest_->SizeOf(s)));
    EXPECT_EQ(ReadsOf(manifest_->PathOf(s)), 1) << manifest_->PathOf(s);
  }
  EXPECT_FALSE(store_->HasChunk(Key(chunk)));
  EXPECT_EQ(store_->used_bytes(), 0u);
  const StagerProgress p = stager_->Progress();
  EXPECT_EQ(p.streamed_segments, 8u);
  EXPECT_EQ(p.streamed_ahead_bytes, p.streamed_bytes);  // all of it read ahead
  // Read again: streamed again (not kept), each read once more.
  for (SampleId s : batch) {
    auto b = stager_->FetchSample(s);
    ASSERT_OK(b);
    EXPECT_EQ(ReadsOf(manifest_->PathOf(s)), 2) << manifest_->PathOf(s);
  }
  EXPECT_EQ(store_->used_bytes(), 0u);
  // Those were on demand: streamed, not ahead.
  EXPECT_EQ(stager_->Progress().streamed_ahead_bytes, p.streamed_ahead_bytes);
  EXPECT_EQ(stager_->Progress().streamed_bytes, 2 * p.streamed_bytes);
}

TEST_F(StagerTest, NewlyOwnedChunksGetStaged) {
  OpenSourceAndStore();
  std::vector<ChunkId> even;
  for (ChunkId c = 0; c < manifest_->chunk_count(); c += 2) even.push_back(c);
  CreateStager(even, Threads(2));
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) {
    EXPECT_EQ(store_->HasChunk(Key(c)), c % 2 == 0) << c;
  }
  EXPECT_EQ(stager_->Progress().chunks_owned, even.size());
  // Not owned: the caller is told to go elsewhere.
  EXPECT_EQ(stager_->FetchSegment(1, 0).status().code(), StatusCode::kFailedPrecondition);

  ASSERT_OK(stager_->SetOwnedChunks(AllChunks()));
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  EXPECT_EQ(stager_->Progress().chunks_owned, manifest_->chunk_count());
  EXPECT_EQ(VerifyAll(), total_segments_);
  EXPECT_EQ(source_->Counters().opens, total_segments_);
  // Ownership shrinking leaves the files alone.
  ASSERT_OK(stager_->SetOwnedChunks(std::vector<ChunkId>{0}));
  EXPECT_EQ(stager_->Progress().chunks_owned, 1u);
  EXPECT_TRUE(store_->HasChunk(Key(1)));
}

TEST_F(StagerTest, BadInputsAreRefusedClearly) {
  OpenSourceAndStore();
  auto create = [&](std::vector<ChunkId> owned, StagerOptions o) {
    return Stager::Create(manifest_, gated_, store_, owned, std::move(o)).status();
  };
  StagerOptions o;
  o.dataset = "Not A Label";
  Status s = create({0}, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("DNS-1123"));
  o.dataset = kDataset;
  o.threads = 0;
  EXPECT_EQ(create({0}, o).code(), StatusCode::kInvalidArgument);
  o.threads = kMaxStagerThreads + 1;
  EXPECT_EQ(create({0}, o).code(), StatusCode::kInvalidArgument);
  o.threads = 2;
  s = create({static_cast<ChunkId>(manifest_->chunk_count())}, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("past the manifest"));
  o.order = {0, static_cast<SampleId>(manifest_->sample_count())};
  s = create({0}, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("staging order"));
  o.order.clear();
  o.io_retries = kMaxIoRetries + 1;
  s = create({0}, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("io_retries"));
  o.io_retries = 3;
  o.io_retry_backoff = -1ms;
  EXPECT_EQ(create({0}, o).code(), StatusCode::kInvalidArgument);
  o.io_retry_backoff = 200ms;
  o.disk_full_backoff = 0ms;
  EXPECT_EQ(create({0}, o).code(), StatusCode::kInvalidArgument);
  StagerOptions named;
  named.dataset = kDataset;
  EXPECT_EQ(Stager::Create(manifest_, gated_, nullptr, {}, named).status().code(),
            StatusCode::kInvalidArgument);
  s = Stager::Create(nullptr, gated_, store_, {}, named).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no manifest"));
  s = Stager::Create(manifest_, nullptr, store_, {}, named).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no source"));

  CreateStager({0}, Threads(1));
  EXPECT_EQ(
      stager_->FetchSegment(static_cast<ChunkId>(manifest_->chunk_count()), 0).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(stager_->FetchSegment(0, 1u << 30).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stager_->FetchSample(static_cast<SampleId>(manifest_->sample_count())).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stager_->SetOwnedChunks(std::vector<ChunkId>{1u << 30}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stager_->Progress().chunks_owned, 1u);  // unchanged
  ASSERT_OK(stager_->Start());
  EXPECT_EQ(stager_->Start().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WaitForState(StagingState::kComplete));
  stager_->Stop();
  stager_->Stop();  // idempotent
  EXPECT_EQ(stager_->Start().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(StagingStateName(StagingState::kDiskFull), "disk_full");
  EXPECT_EQ(SourceErrorKindOf(Status::FailedPrecondition("x")), SourceErrorKind::kChanged);
}

}  // namespace
}  // namespace granary

// The cache policy on real granary-cachenode processes and a real Redis
// (docs/cachenode.md, "When the cache is full"): nodes whose capacity holds
// one dataset but not two.
//
//  - two datasets in use split the node; the one already staged is shrunk
//    while a reader reads it, and every byte its reader gets is right; once
//    it goes idle the other gets its whole share, without an admin;
//  - a pinned dataset never shrinks, whatever the priority of the other;
//  - a byte limit (a namespace quota) keeps that fraction, and the dataset
//    says "Ready, N% resident";
//  - a TTL drops a dataset nobody reads; reading it again brings it back;
//  - a restart on the same data dir keeps the resident set: reading the kept
//    samples opens no source file;
//  - through a sidecar that reads chunk files itself (the handoff), a dataset
//    shrunk mid-epoch gives every byte right, and the sidecar lets go of the
//    dropped files so the node's used bytes fall back under its capacity.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "granary/client/session.h"
#include "testing/cachenode_fixture.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;

// Sizes chosen so one dataset fits a node and two do not.
DatasetOptions Small(const std::string& name) {
  DatasetOptions o;
  o.name = name;
  o.files = 600;
  o.min_size = 2048;
  o.max_size = 6144;
  o.chunk_size = 64 * 1024;
  return o;
}

// The node's capacity: 1.5 times one dataset's payload.
uint64_t CapacityFor(const TestDataset& ds) { return ds.total_bytes * 3 / 2; }

// Reads every sample once and counts wrong bytes and errors.
struct Pass {
  size_t failed = 0;
  size_t wrong = 0;
  std::string first_error;
};
Pass ReadAll(MetadataStore& store, const TestDataset& ds) {
  Pass pass;
  DatasetReader reader(&store, ds);
  Status refreshed = reader.Refresh();
  if (!refreshed.ok()) {
    pass.failed = ds.sample_count();
    pass.first_error = refreshed.ToString();
    return pass;
  }
  const std::vector<DatasetReader::Outcome> got = reader.Read(ds.AllIds());
  for (SampleId id = 0; id < got.size(); ++id) {
    if (!got[id].status.ok()) {
      if (pass.failed++ == 0) pass.first_error = got[id].status.ToString();
    } else if (got[id].bytes != ds.contents[id]) {
      ++pass.wrong;
    }
  }
  return pass;
}

StagingProgress ProgressOf(MetadataStore& store, const std::string& dataset) {
  auto all = store.ListProgress(dataset);
  StagingProgress sum;
  if (!all.ok()) return sum;
  for (const auto& [node, p] : *all) {
    sum.chunks_total += p.chunks_total;
    sum.chunks_not_kept += p.chunks_not_kept;
    sum.bytes_total += p.bytes_total;
    sum.bytes_staged += p.bytes_staged;
    sum.bytes_not_kept += p.bytes_not_kept;
  }
  return sum;
}

Status SetCache(MetadataStore& store, const std::string& dataset, const DatasetCacheSpec& cache) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, store.GetDataset(dataset));
    record.spec.cache = cache;
    Result<DatasetRecord> updated = store.UpdateDataset(record);
    if (updated.ok()) return Status::Ok();
    if (updated.status().code() != StatusCode::kFailedPrecondition) return updated.status();
  }
  return Status::Unavailable("the record of " + dataset + " kept changing");
}

// The files under `under` that process `pid` holds open though they were
// unlinked.
std::vector<std::string> DeletedFilesHeldBy(pid_t pid, const std::string& under) {
  std::vector<std::string> held;
  std::error_code ec;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), link_ec).string();
    if (!link_ec && target.ends_with(" (deleted)") && target.starts_with(under)) {
      held.push_back(target);
    }
  }
  return held;
}

class CacheEvictionTest : public ::testing::Test {
 protected:
  // One node whose capacity holds `first` and half of another of its size.
  void StartWith(const TestDataset& sizing, const std::string& extra_yaml = "") {
    CacheNodeOptions options;
    options.capacity_bytes = CapacityFor(sizing);
    options.extra_yaml = "cache_idle_after: 3s\n" + extra_yaml;
    ASSERT_OK(cluster_->StartNodes(1, options));
  }
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
  }
  std::unique_ptr<CacheCluster> cluster_;
};

TEST_F(CacheEvictionTest, TwoInUseSplitTheNodeUnderAReaderAndTheIdleOneGivesWay) {
  auto a = cluster_->CreateDataset(Small("first"));
  ASSERT_OK(a);
  StartWith(*a);
  ASSERT_OK(cluster_->WaitForPhase("first", DatasetPhase::kReady, 60s));
  EXPECT_EQ(ProgressOf(cluster_->store(), "first").chunks_not_kept, 0u)
      << cluster_->Describe("first");

  // A reader of the first reads pass after pass while the second arrives.
  std::atomic<bool> stop{false};
  std::atomic<size_t> passes{0}, failed{0}, wrong{0};
  std::string first_error;
  std::thread reader([&] {
    for (int i = 0; i < 200 && !stop.load(); ++i) {
      Pass p = ReadAll(cluster_->store(), *a);
      failed += p.failed;
      wrong += p.wrong;
      if (first_error.empty()) first_error = p.first_error;
      ++passes;
    }
  });
  auto b = cluster_->CreateDataset(Small("second"));
  ASSERT_OK(b);
  // The second is read too: both in use, so they split the node, and the
  // first gives up chunks while its reader reads.
  std::thread second_reader([&] {
    for (int i = 0; i < 200 && !stop.load(); ++i) ReadAll(cluster_->store(), *b);
  });
  ASSERT_OK(cluster_->WaitForPhase("second", DatasetPhase::kReady, 60s));
  EXPECT_TRUE(WaitFor(
      [&] {
        return ProgressOf(cluster_->store(), "first").chunks_not_kept > 0 &&
               ProgressOf(cluster_->store(), "second").chunks_not_kept > 0;
      },
      30s))
      << cluster_->Describe("first") << "\n"
      << cluster_->Describe("second");
  CacheNode& node = cluster_->node(0);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto v = node.MetricValue("granary_cachenode_evicted_chunks_total",
                                  {{"dataset", "first"}, {"reason", "fair_share"}});
        return v.ok() && *v > 0;
      },
      20s));
  auto used = node.MetricValue("granary_cachenode_used_bytes", {});
  ASSERT_OK(used);
  EXPECT_LE(*used, static_cast<double>(CapacityFor(*a)));
  auto record = cluster_->store().GetDataset("second");
  ASSERT_OK(record);
  EXPECT_THAT(record->state.message, HasSubstr("% resident"));
  EXPECT_THAT(record->state.message, HasSubstr("streamed from the source"));

  // The first's reader stops: it goes idle, and the second (still read) gets
  // its whole share.
  stop = true;
  reader.join();
  stop = false;
  std::thread keep_reading([&] {
    for (int i = 0; i < 400 && !stop.load(); ++i) ReadAll(cluster_->store(), *b);
  });
  EXPECT_TRUE(WaitFor(
      [&] {
        auto r = cluster_->store().GetDataset("second");
        return ProgressOf(cluster_->store(), "second").chunks_not_kept == 0 && r.ok() &&
               r->state.phase == DatasetPhase::kReady &&
               r->state.message.rfind("staged on", 0) == 0;
      },
      60s))
      << cluster_->Describe("second");
  stop = true;
  keep_reading.join();
  second_reader.join();

  EXPECT_GT(passes.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(failed.load(), 0u) << first_error;
  // The first, now mostly streamed, still reads right.
  Pass after = ReadAll(cluster_->store(), *a);
  EXPECT_EQ(after.failed, 0u) << after.first_error;
  EXPECT_EQ(after.wrong, 0u);
  EXPECT_GT(ProgressOf(cluster_->store(), "first").chunks_not_kept, 0u);
  EXPECT_OK(node.WaitForMetric("granary_cachenode_streamed_bytes_total", {{"dataset", "first"}},
                               [](double v) { return v > 0; }));
}

TEST_F(CacheEvictionTest, ThreeDatasetsByPriorityTheHighestWholeTheNextWhatIsLeftTheLastNothing) {
  auto high = cluster_->CreateDataset(Small("high"));
  ASSERT_OK(high);
  auto mid = cluster_->CreateDataset(Small("mid"));
  ASSERT_OK(mid);
  auto low = cluster_->CreateDataset(Small("low"));
  ASSERT_OK(low);
  for (const auto& [name, priority] :
       std::vector<std::pair<std::string, int32_t>>{{"high", 10}, {"mid", 0}, {"low", -10}}) {
    DatasetCacheSpec cache;
    cache.priority = priority;
    ASSERT_OK(SetCache(cluster_->store(), name, cache));
  }
  StartWith(*high);  // room for one and a half of them
  for (const char* name : {"high", "mid", "low"}) {
    ASSERT_OK(cluster_->WaitForPhase(name, DatasetPhase::kReady, 60s));
  }
  EXPECT_EQ(ProgressOf(cluster_->store(), "high").chunks_not_kept, 0u);
  const StagingProgress m = ProgressOf(cluster_->store(), "mid");
  EXPECT_GT(m.chunks_not_kept, 0u);
  EXPECT_LT(m.chunks_not_kept, m.chunks_total);
  const StagingProgress l = ProgressOf(cluster_->store(), "low");
  EXPECT_EQ(l.chunks_not_kept, l.chunks_total);
  EXPECT_EQ(l.bytes_staged, 0u);
  auto low_record = cluster_->store().GetDataset("low");
  ASSERT_OK(low_record);
  EXPECT_THAT(low_record->state.message, HasSubstr("Ready, 0% resident"));
  // Every byte of each is still served right.
  for (const TestDataset* ds : {&*high, &*mid, &*low}) {
    Pass pass = ReadAll(cluster_->store(), *ds);
    EXPECT_EQ(pass.failed, 0u) << ds->name << ": " << pass.first_error;
    EXPECT_EQ(pass.wrong, 0u) << ds->name;
  }
  // The lowest raised above the others: it takes the space, the middle one
  // gives it up, the highest keeps its own.
  DatasetCacheSpec top;
  top.priority = 100;
  ASSERT_OK(SetCache(cluster_->store(), "low", top));
  EXPECT_TRUE(WaitFor(
      [&] {
        return ProgressOf(cluster_->store(), "low").chunks_not_kept == 0 &&
               ProgressOf(cluster_->store(), "mid").chunks_not_kept ==
                   ProgressOf(cluster_->store(), "mid").chunks_total;
      },
      60s))
      << cluster_->Describe("low") << "\n"
      << cluster_->Describe("mid");
  EXPECT_OK(cluster_->node(0).WaitForMetric("granary_cachenode_evicted_chunks_total",
                                            {{"dataset", "mid"}, {"reason", "priority"}},
                                            [](double v) { return v > 0; }));
}

TEST_F(CacheEvictionTest, APinnedDatasetNeverShrinksForAHigherPriorityOne) {
  auto a = cluster_->CreateDataset(Small("pinned"));
  ASSERT_OK(a);
  DatasetCacheSpec pin;
  pin.pinned = true;
  pin.priority = -100;
  ASSERT_OK(SetCache(cluster_->store(), "pinned", pin));
  StartWith(*a);
  ASSERT_OK(cluster_->WaitForPhase("pinned", DatasetPhase::kReady, 60s));
  auto b = cluster_->CreateDataset(Small("urgent"));
  ASSERT_OK(b);
  DatasetCacheSpec high;
  high.priority = 500;
  ASSERT_OK(SetCache(cluster_->store(), "urgent", high));
  ASSERT_OK(cluster_->WaitForPhase("urgent", DatasetPhase::kReady, 60s));
  Pass p = ReadAll(cluster_->store(), *b);  // in use, and right
  EXPECT_EQ(p.failed, 0u) << p.first_error;
  EXPECT_EQ(p.wrong, 0u);
  EXPECT_TRUE(
      WaitFor([&] { return ProgressOf(cluster_->store(), "urgent").chunks_not_kept > 0; }, 30s));
  EXPECT_EQ(ProgressOf(cluster_->store(), "pinned").chunks_not_kept, 0u);
  auto evicted = cluster_->node(0).MetricValue("granary_cachenode_evicted_chunks_total",
                                               {{"dataset", "pinned"}, {"reason", "priority"}});
  ASSERT_OK(evicted);
  EXPECT_EQ(*evicted, 0);
}

TEST_F(CacheEvictionTest, ALimitKeepsItsFractionAndTheStatusSaysSo) {
  auto a = cluster_->CreateDataset(Small("limited"));
  ASSERT_OK(a);
  DatasetCacheSpec limit;
  limit.max_resident_bytes = a->total_bytes * 2 / 5;  // 40%
  ASSERT_OK(SetCache(cluster_->store(), "limited", limit));
  StartWith(*a);
  auto ready = cluster_->WaitForPhase("limited", DatasetPhase::kReady, 60s);
  ASSERT_OK(ready);
  EXPECT_THAT(ready->state.message, HasSubstr("% resident"));
  const StagingProgress p = ProgressOf(cluster_->store(), "limited");
  EXPECT_GT(p.chunks_not_kept, 0u);
  EXPECT_LE(p.bytes_staged, a->total_bytes * 2 / 5);
  EXPECT_GE(p.bytes_staged, a->total_bytes / 5) << cluster_->Describe("limited");
  Pass pass = ReadAll(cluster_->store(), *a);
  EXPECT_EQ(pass.failed, 0u) << pass.first_error;
  EXPECT_EQ(pass.wrong, 0u);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto kept =
            cluster_->node(0).MetricValue("granary_cachenode_kept_bytes", {{"dataset", "limited"}});
        return kept.ok() && *kept == static_cast<double>(p.bytes_total - p.bytes_not_kept);
      },
      10s));

  // The limit lifted: the whole dataset is staged.
  ASSERT_OK(SetCache(cluster_->store(), "limited", DatasetCacheSpec{}));
  EXPECT_TRUE(WaitFor(
      [&] {
        auto r = cluster_->store().GetDataset("limited");
        return ProgressOf(cluster_->store(), "limited").chunks_not_kept == 0 && r.ok() &&
               r->state.message.rfind("staged on", 0) == 0;
      },
      60s))
      << cluster_->Describe("limited");
}

TEST_F(CacheEvictionTest, ATtlDropsAnUnreadDatasetAndAReadBringsItBack) {
  auto a = cluster_->CreateDataset(Small("ttl"));
  ASSERT_OK(a);
  DatasetCacheSpec ttl;
  ttl.ttl_seconds = 2;
  ASSERT_OK(SetCache(cluster_->store(), "ttl", ttl));
  StartWith(*a);
  ASSERT_OK(cluster_->WaitForPhase("ttl", DatasetPhase::kReady, 60s));
  CacheNode& node = cluster_->node(0);
  EXPECT_TRUE(WaitFor(
      [&] {
        auto v = node.MetricValue("granary_cachenode_evicted_chunks_total",
                                  {{"dataset", "ttl"}, {"reason", "ttl"}});
        auto used = node.MetricValue("granary_cachenode_used_bytes", {});
        return v.ok() && *v > 0 && used.ok() && *used == 0;
      },
      30s))
      << cluster_->Describe("ttl");
  auto record = cluster_->store().GetDataset("ttl");
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kReady);
  EXPECT_THAT(record->state.message, HasSubstr("0% resident"));
  // Read again: right bytes (from the source), and it is kept again.
  Pass pass = ReadAll(cluster_->store(), *a);
  EXPECT_EQ(pass.failed, 0u) << pass.first_error;
  EXPECT_EQ(pass.wrong, 0u);
  EXPECT_TRUE(
      WaitFor([&] { return ProgressOf(cluster_->store(), "ttl").chunks_not_kept == 0; }, 30s))
      << cluster_->Describe("ttl");
}

TEST_F(CacheEvictionTest, ARestartKeepsTheResidentSet) {
  auto a = cluster_->CreateDataset(Small("kept"));
  ASSERT_OK(a);
  DatasetCacheSpec limit;
  limit.max_resident_bytes = a->total_bytes / 2;
  ASSERT_OK(SetCache(cluster_->store(), "kept", limit));
  StartWith(*a);
  ASSERT_OK(cluster_->WaitForPhase("kept", DatasetPhase::kReady, 60s));
  CacheNode& node = cluster_->node(0);
  const StagingProgress before = ProgressOf(cluster_->store(), "kept");
  ASSERT_GT(before.chunks_not_kept, 0u);
  // The node's gauges lag the store by up to a refresh (500 ms): wait for the
  // refresh that counts every staged chunk, then for used bytes to hold still
  // over two refreshes.
  ASSERT_OK(
      node.WaitForMetric("granary_cachenode_staged_chunks", {{"dataset", "kept"}},
                         [&](double v) { return v == static_cast<double>(before.chunks_staged); }));
  Result<double> used =
      node.WaitForSettledMetric("granary_cachenode_used_bytes", {}, [](double v) { return v > 0; });
  ASSERT_OK(used);

  auto stopped = node.Terminate();
  ASSERT_OK(stopped);
  ASSERT_OK(node.StartAndWaitReady());
  EXPECT_TRUE(WaitFor(
      [&] {
        auto v = node.MetricValue("granary_cachenode_kept_bytes", {{"dataset", "kept"}});
        return v.ok() && *v == static_cast<double>(before.bytes_total - before.bytes_not_kept);
      },
      30s));
  // Nothing was staged again and nothing dropped: the same files, no source opens.
  auto again = node.MetricValue("granary_cachenode_used_bytes", {});
  ASSERT_OK(again);
  EXPECT_EQ(*again, *used);
  auto opens = node.MetricValue("granary_cachenode_source_opens_total", {{"dataset", "kept"}});
  ASSERT_OK(opens);
  EXPECT_EQ(*opens, 0);
  auto evicted = node.MetricValue("granary_cachenode_evicted_chunks_total",
                                  {{"dataset", "kept"}, {"reason", "limit"}});
  ASSERT_OK(evicted);
  EXPECT_EQ(*evicted, 0);
}

TEST_F(CacheEvictionTest, ThroughTheHandoffAShrunkDatasetReadsRightAndItsFilesAreLetGo) {
  DatasetOptions larger = Small("handed");
  larger.min_size = 40 * 1024;  // about 30 MB: more than the sidecar's arena
  larger.max_size = 60 * 1024;
  larger.chunk_size = 256 * 1024;
  auto a = cluster_->CreateDataset(larger);
  ASSERT_OK(a);
  const std::string socket = cluster_->dir().path() + "/node.sock";
  StartWith(*a, "local_socket: " + socket + "\n");
  ASSERT_OK(cluster_->WaitForPhase("handed", DatasetPhase::kReady, 60s));
  SidecarOptions o;
  o.store_url = cluster_->store_url();
  o.local_node_id = cluster_->node(0).id();
  // An arena smaller than the dataset: each epoch reads the chunk files again.
  o.window_bytes = "1MiB";
  o.arena_bytes = "17MiB";  // the least it may be
  o.window_samples = 64;
  o.extra_yaml = "local_node_socket: " + socket + "\n";
  SidecarProcess sidecar(o, cluster_->dir().path() + "/sidecar");
  ASSERT_OK(sidecar.StartAndWaitReady());
  client::SessionOptions options;
  options.socket_path = sidecar.socket_path();
  auto session = client::Session::Open(a->name, options);
  ASSERT_TRUE(session.ok()) << session.status().ToString();

  // Epoch 1 with every chunk kept, then a limit of a quarter set mid-epoch 2.
  size_t wrong = 0;
  std::string first_error;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (uint32_t id = 0; id < a->sample_count(); ++id) {
      if (epoch == 1 && id == a->sample_count() / 3) {
        DatasetCacheSpec quarter;
        quarter.max_resident_bytes = a->total_bytes / 4;
        ASSERT_OK(SetCache(cluster_->store(), "handed", quarter));
      }
      auto bytes = (*session)->Read(id);
      if (!bytes.ok()) {
        if (first_error.empty()) first_error = bytes.status().ToString();
        ++wrong;
      } else if (*bytes != a->contents[id]) {
        ++wrong;
      }
    }
  }
  EXPECT_EQ(wrong, 0u) << first_error;
  auto opens = sidecar.WaitForMetric("granary_sidecar_local_file_opens_total", {},
                                     [](double v) { return v > 0; });
  EXPECT_TRUE(opens.ok()) << "the sidecar never read a chunk file itself";
  CacheNode& node = cluster_->node(0);
  auto evicted = node.WaitForMetric("granary_cachenode_evicted_chunks_total",
                                    {{"dataset", "handed"}, {"reason", "limit"}},
                                    [](double v) { return v > 0; });
  ASSERT_OK(evicted);
  // The node counts a dropped file until its last holder closes it: the
  // sidecar's descriptors of dropped files are closed at its next reads.
  for (uint32_t id = 0; id < a->sample_count(); ++id) (void)(*session)->Read(id);
  std::this_thread::sleep_for(1100ms);
  for (uint32_t id = 0; id < a->sample_count(); ++id) {
    auto bytes = (*session)->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, a->contents[id]) << "sample " << id;
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        auto used = node.MetricValue("granary_cachenode_used_bytes", {});
        return used.ok() && *used <= static_cast<double>(a->total_bytes) / 4 * 1.1;
      },
      20s));
  // The blocks of a dropped file are freed once no process holds it: the
  // sidecar holds none of them any more.
  std::vector<std::string> held;
  EXPECT_TRUE(WaitFor(
      [&] {
        // A read now and then: the sidecar looks at its descriptors when it reads.
        (void)(*session)->Read(0);
        held = DeletedFilesHeldBy(sidecar.process()->pid(), cluster_->dir().path());
        return held.empty();
      },
      10s))
      << "the sidecar still holds " << held.size() << " dropped chunk files open, e.g. "
      << held.front();
}

}  // namespace
}  // namespace granary::testing

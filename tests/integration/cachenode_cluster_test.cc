// Integration tests of granary-cachenode as a cluster: real
// daemon processes and a real redis-server on loopback, through the fixture in
// tests/testing/cachenode_fixture.h.
//
//  - three nodes stage a dataset of thousands of files: every sample read from
//    its owner equals the source, each source file is opened once over all
//    nodes, and a second read pass opens nothing;
//  - kill -9 of a node mid-staging: the others take over its chunks, the
//    dataset becomes Ready, and a reader during the failure never gets wrong
//    bytes;
//  - Redis restarted mid-run: the nodes reconnect, heartbeat and finish;
//  - a node restarted on its data dir after Ready opens no source file again;
//  - `promtool check metrics` accepts what a node that staged and served
//    exports, and every metric of the contract is there;
//  - a plan registered while the node stages (its stager is re-created in
//    the plan's order) never leaves the dataset unserved.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "granary/core/file.h"
#include "granary/core/manifest_builder.h"
#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/slowfs_mount.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;

constexpr char kOpens[] = "granary_cachenode_source_opens_total";

// Reads every sample once, each from its owner, and checks every byte.
void ExpectAllSamplesCorrect(MetadataStore& store, const TestDataset& ds) {
  DatasetReader reader(&store, ds);
  ASSERT_OK(reader.Refresh());
  const std::vector<DatasetReader::Outcome> got = reader.Read(ds.AllIds());
  size_t failed = 0;
  size_t wrong = 0;
  for (SampleId id = 0; id < got.size(); ++id) {
    if (!got[id].status.ok()) {
      if (++failed <= 5) {
        ADD_FAILURE() << "sample " << id << " from " << got[id].node << ": "
                      << got[id].status.ToString();
      }
    } else if (got[id].bytes != ds.contents[id]) {
      if (++wrong <= 5) {
        ADD_FAILURE() << "sample " << id << " from " << got[id].node << ": wrong bytes ("
                      << got[id].bytes.size() << " bytes, the source has " << ds.contents[id].size()
                      << ")";
      }
    }
  }
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(wrong, 0u);
}

// Every node's metric value for one dataset, summed; each node must answer.
Result<double> SumOverNodes(const std::vector<CacheNode*>& nodes, std::string_view name,
                            const Labels& labels) {
  double sum = 0;
  for (const CacheNode* node : nodes) {
    GRANARY_ASSIGN_OR_RETURN(double v, node->MetricValue(name, labels));
    sum += v;
  }
  return sum;
}

std::vector<CacheNode*> AllNodes(CacheCluster& cluster) {
  std::vector<CacheNode*> nodes;
  for (size_t i = 0; i < cluster.node_count(); ++i) nodes.push_back(&cluster.node(i));
  return nodes;
}

TEST(CacheNodeClusterTest, ThreeNodesStageEverySampleOnceAndServeTheSourceBytes) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(3));
  DatasetOptions o;
  o.name = "three";
  o.files = 3000;
  o.chunk_size = 128 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_GT(ds->manifest->chunk_count(), 50u);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 90s));

  // Every live node reports its share staged, and the shares add up to the
  // dataset: each chunk staged exactly once.
  auto progress = (*cluster)->store().ListProgress(ds->name);
  ASSERT_OK(progress);
  ASSERT_EQ(progress->size(), 3u) << (*cluster)->Describe(ds->name);
  uint64_t chunks = 0;
  uint64_t bytes = 0;
  for (const auto& [node, p] : *progress) {
    EXPECT_EQ(p.chunks_staged, p.chunks_total) << node;
    EXPECT_EQ(p.bytes_staged, p.bytes_total) << node;
    EXPECT_EQ(p.samples_failed, 0u) << node;
    EXPECT_GT(p.chunks_total, 0u) << node << " owns nothing";
    chunks += p.chunks_total;
    bytes += p.bytes_total;
  }
  EXPECT_EQ(chunks, ds->manifest->chunk_count());
  EXPECT_EQ(bytes, ds->total_bytes);

  ExpectAllSamplesCorrect((*cluster)->store(), *ds);

  // A node that does not own a sample's chunk says so per item, with no bytes.
  DatasetReader reader(&(*cluster)->store(), *ds);
  ASSERT_OK(reader.Refresh());
  int checked = 0;
  for (SampleId id = 0; id < ds->sample_count() && checked < 3; id += 97) {
    auto owner = reader.OwnerOf(id);
    ASSERT_OK(owner);
    for (size_t i = 0; i < 3; ++i) {
      CacheNode& node = (*cluster)->node(i);
      if (node.id() == *owner) continue;
      auto got = reader.ReadFrom(node.id(), {id});
      // kNotFound: "not held here, ask the owner" (docs/protocol.md), kept
      // apart from kFailedPrecondition, a source file changed since the snapshot.
      EXPECT_EQ(StatusCodeName(got[0].status.code()), StatusCodeName(StatusCode::kNotFound))
          << "sample " << id << " from non-owner " << node.id() << ": " << got[0].status.ToString();
      EXPECT_THAT(got[0].status.message(), HasSubstr("read it from its owner"));
      EXPECT_THAT(got[0].status.message(), HasSubstr(node.id()));
      EXPECT_TRUE(got[0].bytes.empty());
      ++checked;
      break;
    }
  }

  // Each source file was opened once, over all nodes.
  const std::vector<CacheNode*> nodes = AllNodes(**cluster);
  const Labels of_ds{{"dataset", ds->name}};
  const double files = static_cast<double>(ds->sample_count());
  EXPECT_TRUE(WaitFor(
      [&] {
        auto opens = SumOverNodes(nodes, kOpens, of_ds);
        return opens.ok() && *opens >= files;
      },
      20s));
  auto opens = SumOverNodes(nodes, kOpens, of_ds);
  ASSERT_OK(opens);
  EXPECT_EQ(*opens, files);
  // The gauges are refreshed on the node's metrics interval, so the last
  // refresh may predate the last chunk's commit; wait for one that follows it.
  for (CacheNode* node : nodes) {
    Result<double> owned = 0.0;
    Result<double> staged = 0.0;
    EXPECT_TRUE(WaitFor(
        [&] {
          owned = node->MetricValue("granary_cachenode_owned_chunks", of_ds);
          staged = node->MetricValue("granary_cachenode_staged_chunks", of_ds);
          return owned.ok() && staged.ok() && *owned > 0 && *owned == *staged;
        },
        20s));
    ASSERT_OK(owned);
    ASSERT_OK(staged);
    EXPECT_EQ(*owned, *staged) << node->id();
  }

  // A second full pass is served from the chunk stores: no source opens.
  ExpectAllSamplesCorrect((*cluster)->store(), *ds);
  ASSERT_TRUE(WaitFor(
      [&] {
        auto served = SumOverNodes(nodes, "granary_cachenode_served_items_total", {});
        return served.ok() && *served >= 2 * files;
      },
      20s))
      << "the nodes did not count two passes of served items";
  auto again = SumOverNodes(nodes, kOpens, of_ds);
  ASSERT_OK(again);
  EXPECT_EQ(*again, files) << "the second read pass opened source files";
  auto fetches = SumOverNodes(nodes, "granary_cachenode_on_demand_fetches_total", of_ds);
  ASSERT_OK(fetches);
  EXPECT_EQ(*fetches, 0) << "reads after Ready went to the source";
}

TEST(CacheNodeClusterTest, KillNineMidStagingOthersTakeOverAndReadersGetCorrectBytes) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions slow;
  slow.source_concurrency = 1;
  ASSERT_OK((*cluster)->StartNodes(3, slow));
  DatasetOptions o;
  o.name = "failover";
  o.files = 3000;
  o.chunk_size = 16 * 1024;  // many chunks: staging takes a while with one reader
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  MetadataStore& store = (*cluster)->store();
  CacheNode& victim = (*cluster)->node(1);

  // A reader that keeps reading while the node dies: retries per-item errors
  // (recomputing owners) until each sample returns bytes, and records any
  // bytes that are not the source's.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> samples_read{0};
  std::vector<std::string> wrong;
  std::vector<std::string> stuck;
  std::thread reader_thread([&] {
    DatasetReader reader(&store, *ds, 5s);
    uint64_t next = 0;
    while (!stop.load()) {
      std::vector<SampleId> batch;
      for (int i = 0; i < 64; ++i) {
        batch.push_back(static_cast<SampleId>((next * 7919) % ds->sample_count()));
        ++next;
      }
      const Status s = reader.ReadAllCorrect(batch, 30s, &wrong);
      if (!s.ok()) stuck.push_back(s.ToString());
      samples_read += batch.size();
    }
  });

  // Kill it once it has staged something but not everything it owns.
  StagingProgress at_kill;
  const bool mid = WaitFor(
      [&] {
        auto p = store.ListProgress(ds->name);
        if (!p.ok()) return false;
        auto it = p->find(victim.id());
        if (it == p->end() || it->second.chunks_staged == 0) return false;
        at_kill = it->second;
        return true;
      },
      60s, 5ms);
  auto killed = victim.Kill();
  ASSERT_TRUE(mid) << "the victim never published progress; " << (*cluster)->Describe(ds->name);
  ASSERT_OK(killed);
  EXPECT_EQ(killed->signal, SIGKILL);
  EXPECT_LT(at_kill.chunks_staged, at_kill.chunks_total)
      << "the victim had finished staging before it was killed: make the test's dataset larger";
  const uint64_t read_at_kill = samples_read.load();

  // The victim expires (heartbeat_ttl 1 s), the others own everything, and
  // the dataset becomes Ready.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto nodes = store.ListNodes("default");
        return nodes.ok() && nodes->size() == 2;
      },
      20s))
      << (*cluster)->Describe(ds->name);
  auto ready = (*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 90s);
  // Let the reader run on a little after Ready, then stop it.
  const uint64_t read_at_ready = samples_read.load();
  WaitFor([&] { return samples_read.load() >= read_at_ready + 256; }, 30s);
  stop = true;
  reader_thread.join();
  ASSERT_OK(ready);

  EXPECT_TRUE(wrong.empty()) << wrong.size() << " wrong reads; the first: " << wrong.front();
  EXPECT_TRUE(stuck.empty()) << stuck.size() << " batches failed; the first: " << stuck.front();
  EXPECT_GT(read_at_ready, read_at_kill) << "the reader read nothing during the failure";

  auto progress = store.ListProgress(ds->name);
  ASSERT_OK(progress);
  uint64_t owned = 0;
  for (size_t i : {0u, 2u}) {
    const CacheNode& node = (*cluster)->node(i);
    ASSERT_TRUE(progress->contains(node.id())) << node.id();
    const StagingProgress& p = progress->at(node.id());
    EXPECT_EQ(p.chunks_staged, p.chunks_total) << node.id();
    owned += p.chunks_total;
  }
  EXPECT_EQ(owned, ds->manifest->chunk_count()) << (*cluster)->Describe(ds->name);
  ExpectAllSamplesCorrect(store, *ds);
}

TEST(CacheNodeClusterTest, RedisRestartedMidRunNodesReconnectAndFinish) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions slow;
  slow.source_concurrency = 1;
  ASSERT_OK((*cluster)->StartNodes(2, slow));
  DatasetOptions o;
  o.name = "redis-restart";
  o.files = 2000;
  o.chunk_size = 16 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  MetadataStore& store = (*cluster)->store();
  // Both nodes have started staging.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto p = store.ListProgress(ds->name);
        return p.ok() && p->size() == 2;
      },
      30s))
      << (*cluster)->Describe(ds->name);

  // Restart Redis (a crash, then a start on the same port and directory).
  auto before = store.GetDataset(ds->name);
  ASSERT_OK(before);
  EXPECT_EQ(before->state.phase, DatasetPhase::kStaging)
      << "staging was over before Redis went down: make the test's dataset larger";
  ASSERT_OK((*cluster)->redis().Kill());
  ASSERT_OK((*cluster)->redis().Restart());

  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 90s));
  // Both still heartbeat: listed now, and still listed well past their TTL.
  for (int round = 0; round < 2; ++round) {
    auto nodes = store.ListNodes("default");
    ASSERT_OK(nodes);
    EXPECT_EQ(nodes->size(), 2u) << (*cluster)->Describe(ds->name);
    if (round == 0) std::this_thread::sleep_for(1500ms);  // > heartbeat_ttl: expiry would show
  }
  for (size_t i = 0; i < 2; ++i) {
    CacheNode& node = (*cluster)->node(i);
    EXPECT_OK(node.WaitReady(20s));
    EXPECT_TRUE(node.Running()) << node.id();
  }
  ExpectAllSamplesCorrect(store, *ds);
}

TEST(CacheNodeClusterTest, RestartOnTheSameDataDirOpensNoSourceFileAgain) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  DatasetOptions o;
  o.name = "restart";
  o.files = 1500;
  o.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  CacheNode& node = (*cluster)->node(0);
  const Labels of_ds{{"dataset", ds->name}};
  const double chunks = static_cast<double>(ds->manifest->chunk_count());
  ASSERT_OK(node.WaitForMetric(kOpens, of_ds,
                               [&](double v) { return v == static_cast<double>(o.files); }));
  const std::vector<std::string> files_before = node.ChunkFiles();
  EXPECT_EQ(files_before.size(), ds->manifest->chunk_count());

  auto stopped = node.Terminate(20s);
  ASSERT_OK(stopped);
  EXPECT_TRUE(stopped->ExitedWith(0)) << stopped->ToString();
  ASSERT_OK(node.StartAndWaitReady());

  // It scanned its store, owns and holds every chunk, and the dataset is
  // Ready again.
  ASSERT_OK(node.WaitForMetric("granary_cachenode_staged_chunks", of_ds,
                               [&](double v) { return v == chunks; }));
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 30s));
  ExpectAllSamplesCorrect((*cluster)->store(), *ds);
  ASSERT_OK(node.WaitForMetric("granary_cachenode_served_items_total", {},
                               [&](double v) { return v >= static_cast<double>(o.files); }));
  auto opens = node.MetricValue(kOpens, of_ds);
  ASSERT_OK(opens);
  EXPECT_EQ(*opens, 0) << "the restarted node read source files again";
  auto fetches = node.MetricValue("granary_cachenode_on_demand_fetches_total", of_ds);
  ASSERT_OK(fetches);
  EXPECT_EQ(*fetches, 0);
  EXPECT_EQ(node.ChunkFiles(), files_before);
}

#ifdef GRANARY_SLOWFS_BINARY

// A job's sidecar registers its plan when the job starts reading, and the
// node then re-orders the dataset's staging in the plan's order (in place
// now; it used to re-create the Stager). A READ in
// that moment must still find the dataset served: "not served by node" sends
// the sidecar to the source, which may be gone once the dataset is Ready
// (SlurmClusterTest.PersistentDwJobReadsAStagedDatasetWithoutTheSource failed
// so now and then). The old Stager used to be out of the read service while
// it stopped, which lasts until its workers' source reads return: over
// granary-slowfs at 200 ms an operation, with four workers busy, that is most
// of 200 ms, and the reader below asks about every millisecond.
TEST(CacheNodeClusterTest, PlanRegisteredMidStagingLeavesTheDatasetServedThroughout) {
  TempDir slow_dir;  // outlives the mount, which outlives the node
  const std::string src = slow_dir.Join("src");
  constexpr size_t kFiles = 400;  // minutes of staging at 200 ms an operation
  for (size_t i = 0; i < kFiles; ++i) {
    char rel[32];
    std::snprintf(rel, sizeof(rel), "f%04zu.bin", i);
    slow_dir.WriteFile(std::string("src/") + rel, Bytes(rel, 4096));
  }
  SlowFsMount slow(GRANARY_SLOWFS_BINARY, src, slow_dir.Join("mnt"));
  ASSERT_OK(slow.Start({.latency_ms = 200}, slow_dir.Join("slowfs.log")));
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  // Snapshotted on the tree itself (quick), staged through the slow mount.
  ManifestBuildOptions build;
  build.source_root = src;
  build.source_uri = "file://" + slow.mount_point();
  build.chunk_size = 16 * 1024;
  auto manifest = BuildManifest(build);
  ASSERT_OK(manifest);
  ASSERT_EQ(manifest->sample_count(), kFiles);
  TestDataset ds;
  ds.name = "replan";
  ds.pool = "default";
  ds.root = src;
  ds.manifest = std::make_shared<const Manifest>(std::move(*manifest));
  ds.manifest_id = ds.manifest->id();
  for (SampleId id = 0; id < kFiles; ++id) ds.contents.push_back(ReadAll(ds.PathOf(id)));
  ASSERT_OK((*cluster)->RegisterManifest(ds.name, *ds.manifest));
  ASSERT_OK((*cluster)->StartNodes(1));
  CacheNode& node = (*cluster)->node(0);

  // The last sample, in the chunk bulk staging reaches last: fetched on
  // demand once (stored), read from the chunk file from then on.
  const SampleId last = kFiles - 1;
  DatasetReader reader(&(*cluster)->store(), ds);
  std::vector<std::string> wrong;
  ASSERT_OK(reader.ReadAllCorrect({last}, 60s, &wrong));
  ASSERT_TRUE(wrong.empty()) << wrong.front();

  // Reads it from the node until told to stop (or for a minute at most).
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> served{0};
  std::vector<std::string> failures;  // the reader thread's until it is joined
  std::thread reading([&] {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!stop && std::chrono::steady_clock::now() < deadline) {
      const DatasetReader::Outcome got = reader.ReadFrom(node.id(), {last}).at(0);
      if (got.status.ok() && got.bytes == ds.contents[last]) {
        ++served;
      } else if (failures.size() < 5) {
        failures.push_back(got.status.ok() ? "wrong bytes" : got.status.ToString());
      }
    }
  });
  const uint64_t served_before = WaitFor([&] { return served > 0; }, 20s) ? served.load() : 0;
  PlanRecord plan;
  plan.plan_id = "job-1";
  const Status put = (*cluster)->store().PutPlan(ds.name, plan);
  auto in_plan_order = [&] {
    return node.Log().find("staging in the registered plans' order") != std::string::npos;
  };
  const bool restaged = put.ok() && WaitFor(in_plan_order, 30s);
  stop = true;
  reading.join();
  ASSERT_OK(put);
  ASSERT_TRUE(restaged) << "the node did not re-order the staging after the plan";
  EXPECT_GT(served_before, 0u) << "the reader never got the sample before the plan";
  EXPECT_GT(served.load(), served_before) << "no read during or after the restage";
  EXPECT_THAT(failures, ::testing::IsEmpty())
      << "a READ found the dataset unserved while its stager was replaced";
  // Bulk staging was still going (its workers in source reads) when the plan
  // came: otherwise the old Stager stopped at once and this proved nothing.
  auto record = (*cluster)->store().GetDataset(ds.name);
  ASSERT_OK(record);
  EXPECT_EQ(record->state.phase, DatasetPhase::kStaging)
      << "staging finished before the plan; make the tree larger or the mount slower";
}

#endif  // GRANARY_SLOWFS_BINARY

TEST(CacheNodeClusterTest, PromtoolAcceptsTheMetricsOfANodeThatStagedAndServed) {
  const char* promtool = "/usr/bin/promtool";
  if (::access(promtool, X_OK) != 0) {
    GTEST_SKIP() << "promtool is not installed at " << promtool
                 << " (scripts/install-deps installs it)";
  }
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  DatasetOptions o;
  o.name = "metrics";
  o.files = 500;
  o.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  ExpectAllSamplesCorrect((*cluster)->store(), *ds);
  CacheNode& node = (*cluster)->node(0);
  ASSERT_OK(node.WaitForMetric("granary_cachenode_served_items_total", {},
                               [&](double v) { return v >= static_cast<double>(o.files); }));

  auto scraped = node.Get("/metrics");
  ASSERT_OK(scraped);
  ASSERT_EQ(scraped->status, 200);
  const std::string path = (*cluster)->dir().Join("metrics.txt");
  WriteAll(path, scraped->body);
  DaemonProcessOptions check;
  check.binary = "/bin/sh";
  check.args = {"-c", std::string(promtool) + " check metrics < " + path};
  check.log_path = (*cluster)->dir().Join("promtool.log");
  check.name = "promtool";
  auto run = DaemonProcess::Start(check);
  ASSERT_OK(run);
  auto exit = (*run)->Wait(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << "promtool check metrics: " << exit->ToString() << "\n"
                                   << (*run)->ReadLog();

  // Every metric of the contract is exported.
  auto samples = ParsePrometheusText(scraped->body);
  ASSERT_OK(samples);
  std::set<std::string> names;
  for (const MetricSample& s : *samples) names.insert(s.name);
  for (const char* name : {"source_opens_total",
                           "source_read_calls_total",
                           "source_read_bytes_total",
                           "staged_bytes",
                           "staged_chunks",
                           "owned_chunks",
                           "owned_bytes",
                           "staging_queue_chunks",
                           "sample_errors",
                           "on_demand_fetches_total",
                           "checksum_failures_total",
                           "restaged_segments_total",
                           "requests_total",
                           "served_bytes_total",
                           "served_items_total",
                           "request_duration_seconds_bucket",
                           "request_duration_seconds_sum",
                           "request_duration_seconds_count",
                           "connections",
                           "capacity_bytes",
                           "used_bytes",
                           "datasets",
                           "store_errors_total",
                           "snapshots_total",
                           "snapshot_seconds_bucket",
                           "snapshot_seconds_count",
                           "kept_bytes",
                           "budget_bytes",
                           "streamed_bytes_total",
                           "streamed_ahead_bytes_total",
                           "dataset_reads_total",
                           "store_written_bytes_total"}) {
    EXPECT_TRUE(names.contains(std::string("granary_cachenode_") + name))
        << "granary_cachenode_" << name << " is not exported";
  }
  // Families that only get series once something goes wrong are declared
  // (HELP/TYPE) even if they have no sample yet.
  for (const char* name : {"source_errors_total", "request_errors_total", "evicted_bytes_total",
                           "evicted_chunks_total"}) {
    EXPECT_THAT(scraped->body, HasSubstr(std::string("# TYPE granary_cachenode_") + name))
        << "granary_cachenode_" << name << " is not declared";
  }
  const Labels of_ds{{"dataset", ds->name}};
  EXPECT_EQ(SumSamples(*samples, kOpens, of_ds), static_cast<double>(o.files));
  EXPECT_EQ(SumSamples(*samples, "granary_cachenode_staged_chunks", of_ds),
            static_cast<double>(ds->manifest->chunk_count()));
  EXPECT_EQ(SumSamples(*samples, "granary_cachenode_datasets"), 1);
  EXPECT_EQ(SumSamples(*samples, "granary_cachenode_capacity_bytes"),
            static_cast<double>(node.options().capacity_bytes));
  EXPECT_GE(SumSamples(*samples, "granary_cachenode_served_bytes_total").value_or(0),
            static_cast<double>(ds->total_bytes));
}

}  // namespace
}  // namespace granary::testing

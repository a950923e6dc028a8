// Integration tests of the sidecar's SampleFetcher (sidecar/include/granary/
// sidecar/sample_fetcher.h; docs/sidecar.md, "Where samples come from"): real
// granary-cachenode processes and a real redis-server on loopback, through
// the fixture in tests/testing/cachenode_fixture.h.
//
//  - every sample of a Ready dataset on two nodes of unequal capacity arrives
//    with the source's bytes, each from the node placement names (no item is
//    re-asked: the nodes, which hold only their own chunks, agree with the
//    fetcher's placement), counted as local node or peer; READs are batched;
//  - replication 2: every sample from the local node;
//  - samples larger than a chunk arrive whole, also with READs and pieces cut
//    smaller than a chunk;
//  - 8 threads fetching overlapping ids at once;
//  - bad targets and bad calls: per-item errors, the rest delivered;
//  - a node killed with SIGKILL while a reader fetches: everything arrives,
//    node_failures > 0; then every node dead: everything from the source, a
//    dead node costs one failure per node_down_for, not one per Fetch; with
//    source fall-through off every item fails kUnavailable naming the nodes;
//  - a source file changed after the snapshot: that sample fails
//    kFailedPrecondition through a node and through the source, the rest
//    arrive.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>

#include "granary/core/hash.h"
#include "granary/fetcher/sample_fetcher.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/tls.h"
#include "testing/cachenode_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using sidecar::FetchDataset;
using sidecar::FetchOutcome;
using sidecar::FetchTarget;
using sidecar::SampleFetcher;
using sidecar::SampleFetcherCounters;
using sidecar::SampleFetcherOptions;
using sidecar::SampleSource;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr size_t kLocal = static_cast<size_t>(SampleSource::kLocalNode);
constexpr size_t kPeer = static_cast<size_t>(SampleSource::kPeer);
constexpr size_t kSrc = static_cast<size_t>(SampleSource::kSource);

SampleFetcherOptions TestOptions(std::string local_node_id = "") {
  SampleFetcherOptions o;
  o.client_name = "sidecar-fetcher-test";
  o.local_node_id = std::move(local_node_id);
  o.peer.connect_timeout = 2s;
  o.peer.call_timeout = 20s;
  return o;
}

std::unique_ptr<SampleFetcher> NewFetcher(SampleFetcherOptions o) {
  auto f = SampleFetcher::Create(std::move(o), nullptr);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(*f) : nullptr;
}

FetchDataset ForFetch(const TestDataset& ds, uint32_t replication = 1) {
  FetchDataset d;
  d.name = ds.name;
  d.manifest = ds.manifest;
  d.source_uri = "file://" + ds.root;
  d.owner = DatasetOwner{::getuid(), ::getgid()};
  d.replication = replication;
  return d;
}

std::vector<NodeRecord> LiveNodes(CacheCluster& cluster, const std::string& pool = "default") {
  auto nodes = cluster.store().ListNodes(pool);
  EXPECT_TRUE(nodes.ok()) << nodes.status().ToString();
  return nodes.ok() ? *nodes : std::vector<NodeRecord>{};
}

// What one pass of Fetch calls returned, by position in `ids`.
struct Fetched {
  std::vector<SampleId> ids;
  std::vector<FetchOutcome> outcomes;
  std::vector<std::string> bytes;
};

// Fetches `ids` in batches of `batch`, each into a buffer of its manifest size.
Fetched FetchIds(SampleFetcher& f, const FetchDataset& d, std::vector<SampleId> ids, size_t batch) {
  Fetched got;
  got.ids = std::move(ids);
  got.outcomes.resize(got.ids.size());
  got.bytes.resize(got.ids.size());
  for (size_t i = 0; i < got.ids.size(); ++i) got.bytes[i].resize(d.manifest->SizeOf(got.ids[i]));
  for (size_t start = 0; start < got.ids.size(); start += batch) {
    const size_t n = std::min(batch, got.ids.size() - start);
    std::vector<FetchTarget> targets(n);
    for (size_t k = 0; k < n; ++k) {
      targets[k] = FetchTarget{got.ids[start + k], std::span<char>(got.bytes[start + k])};
    }
    f.Fetch(d, targets, std::span<FetchOutcome>(got.outcomes).subspan(start, n));
  }
  return got;
}

// "" when every outcome is OK with the snapshot's bytes and their checksum;
// else the first problems.
std::string Problems(const Fetched& got, const TestDataset& ds) {
  std::string out;
  int n = 0;
  for (size_t i = 0; i < got.ids.size(); ++i) {
    const SampleId id = got.ids[i];
    const FetchOutcome& o = got.outcomes[i];
    std::string problem;
    if (!o.status.ok()) {
      problem = o.status.ToString();
    } else if (got.bytes[i] != ds.contents[id]) {
      problem = "wrong bytes from " + std::string(sidecar::SampleSourceName(o.from));
    } else if (o.checksum != Checksum64(ds.contents[id])) {
      problem = "checksum " + std::to_string(o.checksum) + " is not that of the bytes";
    }
    if (!problem.empty() && ++n <= 5) out += "\n  sample " + std::to_string(id) + ": " + problem;
  }
  if (n > 5) out += "\n  ... " + std::to_string(n) + " in all";
  return out;
}

uint64_t Delivered(const SampleFetcherCounters& c) {
  return c.samples[kLocal] + c.samples[kPeer] + c.samples[kSrc];
}

// ---- a Ready dataset on two nodes ---------------------------------------------------

class FetcherOnTwoNodesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    // Unequal capacities: the fetcher must weight placement as the nodes do.
    CacheNodeOptions small;
    small.capacity_bytes = 1ull << 30;
    CacheNodeOptions large;
    large.capacity_bytes = 3ull << 30;
    ASSERT_OK(cluster_->AddNode(small).StartAndWaitReady());
    ASSERT_OK(cluster_->AddNode(large).StartAndWaitReady());
  }

  Result<TestDataset> ReadyDataset(DatasetOptions o) {
    GRANARY_ASSIGN_OR_RETURN(TestDataset ds, cluster_->CreateDataset(o));
    GRANARY_RETURN_IF_ERROR(cluster_->WaitForPhase(ds.name, DatasetPhase::kReady, 60s).status());
    return ds;
  }

  std::unique_ptr<CacheCluster> cluster_;
};

TEST_F(FetcherOnTwoNodesTest, EverySampleFromItsOwnerCountedAsLocalOrPeer) {
  DatasetOptions o;
  o.name = "two";
  o.files = 800;
  o.chunk_size = 64 * 1024;
  auto ds = ReadyDataset(o);
  ASSERT_OK(ds);
  CacheNode& local = cluster_->node(0);
  auto fetcher = NewFetcher(TestOptions(local.id()));
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(LiveNodes(*cluster_));
  const FetchDataset d = ForFetch(*ds);

  const size_t kBatch = 256;
  const Fetched got = FetchIds(*fetcher, d, ds->AllIds(), kBatch);
  EXPECT_EQ(Problems(got, *ds), "");

  // Each sample came from the node that owns its chunk now, computed here
  // independently; the node agreed (after Ready a node holds only its own
  // chunks and answers NotFound for others, which would be re-asked).
  auto placement = PlacementOf(cluster_->store(), "default");
  ASSERT_OK(placement);
  size_t expect_local = 0;
  size_t mismatched = 0;
  for (SampleId id = 0; id < ds->sample_count(); ++id) {
    const uint32_t owner = placement->Primary(ds->manifest_id, ds->manifest->ChunkOf(id));
    const bool is_local = placement->nodes()[owner].id == local.id();
    expect_local += is_local ? 1 : 0;
    const SampleSource want = is_local ? SampleSource::kLocalNode : SampleSource::kPeer;
    if (got.outcomes[id].from != want && ++mismatched <= 3) {
      ADD_FAILURE() << "sample " << id << " counted from "
                    << sidecar::SampleSourceName(got.outcomes[id].from) << ", its owner is "
                    << placement->nodes()[owner].id;
    }
  }
  ASSERT_GT(expect_local, 0u);
  ASSERT_LT(expect_local, ds->sample_count());
  const SampleFetcherCounters c = fetcher->counters();
  EXPECT_EQ(c.samples[kLocal], expect_local);
  EXPECT_EQ(c.samples[kPeer], ds->sample_count() - expect_local);
  EXPECT_EQ(c.samples[kSrc], 0u);
  EXPECT_EQ(c.bytes[kLocal] + c.bytes[kPeer], ds->total_bytes);
  EXPECT_EQ(c.item_retries, 0u) << "a node did not hold what the fetcher's placement gave it";
  EXPECT_EQ(c.node_failures, 0u);
  EXPECT_EQ(c.failed_samples, 0u);
  // Batched: one READ per node per Fetch (4 batches, 2 nodes), not one per sample.
  const uint64_t batches = (ds->sample_count() + kBatch - 1) / kBatch;
  EXPECT_LE(c.reads_sent, 2 * batches);
  EXPECT_GE(c.reads_sent, batches);

  // Single-sample Fetches (the on-demand path) reuse the pooled connection:
  // this thread's Fetches, one at a time, need one connection per node. The
  // node's metrics are a snapshot refreshed twice a second; a scrape counting
  // every item served so far also counts every connection made before them.
  std::vector<SampleId> local_ids;
  for (SampleId id = 0; id < ds->sample_count() && local_ids.size() < 20; ++id) {
    if (got.outcomes[id].from == SampleSource::kLocalNode) local_ids.push_back(id);
  }
  EXPECT_EQ(Problems(FetchIds(*fetcher, d, local_ids, 1), *ds), "");
  const double served = static_cast<double>(expect_local + local_ids.size());
  double accepted = -1;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto m = local.Metrics();
        if (!m.ok()) return false;
        auto items = SumSamples(*m, "granary_cachenode_served_items_total");
        auto conns = SumSamples(*m, "granary_cachenode_connections_accepted_total");
        if (!items || !conns || *items < served) return false;
        accepted = *conns;
        return true;
      },
      10s));
  EXPECT_EQ(accepted, 1) << "connections to the local node were not reused";
}

TEST_F(FetcherOnTwoNodesTest, ReplicationTwoPrefersTheLocalNode) {
  DatasetOptions o;
  o.name = "rep";
  o.files = 300;
  o.chunk_size = 32 * 1024;
  o.replication = 2;
  auto ds = ReadyDataset(o);
  ASSERT_OK(ds);
  for (size_t which = 0; which < 2; ++which) {
    auto fetcher = NewFetcher(TestOptions(cluster_->node(which).id()));
    ASSERT_NE(fetcher, nullptr);
    fetcher->SetNodes(LiveNodes(*cluster_));
    const Fetched got = FetchIds(*fetcher, ForFetch(*ds, 2), ds->AllIds(), 100);
    EXPECT_EQ(Problems(got, *ds), "");
    const SampleFetcherCounters c = fetcher->counters();
    EXPECT_EQ(c.samples[kLocal], ds->sample_count()) << "local node " << which;
    EXPECT_EQ(c.samples[kPeer], 0u);
    EXPECT_EQ(c.item_retries, 0u);
  }
}

TEST_F(FetcherOnTwoNodesTest, SamplesLargerThanAChunkArriveWhole) {
  DatasetOptions o;
  o.name = "big";
  o.files = 24;
  o.min_size = 1024;
  o.max_size = 300 * 1024;
  o.chunk_size = 16 * 1024;
  auto ds = ReadyDataset(o);
  ASSERT_OK(ds);
  size_t spanning = 0;
  for (SampleId id = 0; id < ds->sample_count(); ++id) {
    auto info = ds->manifest->Sample(id);
    ASSERT_OK(info);
    if (info->chunk_count > 2) ++spanning;
  }
  ASSERT_GE(spanning, 10u) << "the dataset should have many samples spanning chunks";
  const FetchDataset d = ForFetch(*ds);

  auto fetcher = NewFetcher(TestOptions(cluster_->node(1).id()));
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(LiveNodes(*cluster_));
  const Fetched got = FetchIds(*fetcher, d, ds->AllIds(), 256);
  EXPECT_EQ(Problems(got, *ds), "");
  EXPECT_EQ(fetcher->counters().item_retries, 0u);
  // Pieces of one sample on both nodes: counted once, from the farther.
  EXPECT_EQ(Delivered(fetcher->counters()), ds->sample_count());

  // Pieces cut below a chunk and READs of at most 3 items and 5000 bytes.
  SampleFetcherOptions tight = TestOptions();
  tight.max_items_per_read = 3;
  tight.max_bytes_per_read = 5000;
  auto small = NewFetcher(tight);
  ASSERT_NE(small, nullptr);
  small->SetNodes(LiveNodes(*cluster_));
  const Fetched again = FetchIds(*small, d, ds->AllIds(), 256);
  EXPECT_EQ(Problems(again, *ds), "");
  EXPECT_GE(small->counters().reads_sent, ds->total_bytes / 5000);
  EXPECT_EQ(small->counters().item_retries, 0u);
}

TEST_F(FetcherOnTwoNodesTest, EightThreadsFetchOverlappingIdsAtOnce) {
  DatasetOptions o;
  o.name = "threads";
  o.files = 600;
  o.chunk_size = 64 * 1024;
  auto ds = ReadyDataset(o);
  ASSERT_OK(ds);
  auto fetcher = NewFetcher(TestOptions(cluster_->node(0).id()));
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(LiveNodes(*cluster_));
  const FetchDataset d = ForFetch(*ds);

  constexpr size_t kThreads = 8;
  std::vector<std::string> problems(kThreads);
  std::vector<size_t> fetched(kThreads, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t: 400 ids starting at 50 t, wrapping, in batches of 1..256,
      // with every id twice in some batches.
      std::vector<SampleId> ids;
      for (size_t k = 0; k < 400; ++k) {
        ids.push_back(static_cast<SampleId>((50 * t + k) % ds->sample_count()));
      }
      for (size_t k = 0; k < 40; ++k) ids.push_back(ids[k * 7]);
      const size_t batch = t == 0 ? 1 : 32 * t;
      const Fetched got = FetchIds(*fetcher, d, ids, batch);
      problems[t] = Problems(got, *ds);
      fetched[t] = got.ids.size();
    });
  }
  for (std::thread& t : threads) t.join();
  size_t total = 0;
  for (size_t t = 0; t < kThreads; ++t) {
    EXPECT_EQ(problems[t], "") << "thread " << t;
    total += fetched[t];
  }
  const SampleFetcherCounters c = fetcher->counters();
  EXPECT_EQ(Delivered(c), total);
  EXPECT_EQ(c.failed_samples, 0u);
  EXPECT_EQ(c.item_retries, 0u);
  EXPECT_EQ(c.node_failures, 0u);
}

TEST_F(FetcherOnTwoNodesTest, BadTargetsFailAloneAndBadCallsFailCleanly) {
  DatasetOptions o;
  o.name = "bad";
  o.files = 50;
  auto ds = ReadyDataset(o);
  ASSERT_OK(ds);
  auto fetcher = NewFetcher(TestOptions());
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(LiveNodes(*cluster_));
  const FetchDataset d = ForFetch(*ds);
  const SampleId n = static_cast<SampleId>(ds->sample_count());

  std::string good0(ds->contents[0].size(), '\0');
  std::string good1(ds->contents[1].size(), '\0');
  std::string short2(ds->contents[2].size() - 1, '\0');
  std::string long3(ds->contents[3].size() + 1, '\0');
  std::string any(16, '\0');
  std::vector<FetchTarget> targets = {
      {0, std::span<char>(good0)}, {2, std::span<char>(short2)},
      {n, std::span<char>(any)},   {std::numeric_limits<SampleId>::max(), std::span<char>(any)},
      {3, std::span<char>(long3)}, {4, std::span<char>()},
      {1, std::span<char>(good1)},
  };
  std::vector<FetchOutcome> outcomes(targets.size());
  fetcher->Fetch(d, targets, outcomes);
  EXPECT_OK(outcomes[0].status);
  EXPECT_EQ(good0, ds->contents[0]);
  EXPECT_OK(outcomes[6].status);
  EXPECT_EQ(good1, ds->contents[1]);
  for (size_t i : {size_t{1}, size_t{4}, size_t{5}}) {
    EXPECT_EQ(outcomes[i].status.code(), StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(outcomes[i].status.message(), HasSubstr("pass exactly its size"));
  }
  for (size_t i : {size_t{2}, size_t{3}}) {
    EXPECT_EQ(outcomes[i].status.code(), StatusCode::kOutOfRange) << i;
    EXPECT_THAT(outcomes[i].status.message(), HasSubstr("past the end"));
  }
  EXPECT_EQ(fetcher->counters().failed_samples, 5u);
  EXPECT_EQ(Delivered(fetcher->counters()), 2u);

  // Outcomes that do not match the targets: every outcome says so.
  std::vector<FetchOutcome> two(2);
  fetcher->Fetch(d, std::span<const FetchTarget>(targets).first(1), two);
  for (const FetchOutcome& out : two) {
    EXPECT_EQ(out.status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(out.status.message(), HasSubstr("one outcome per target"));
  }
  // No manifest; a dataset name the protocol refuses.
  std::vector<FetchOutcome> one(1);
  FetchDataset no_manifest = d;
  no_manifest.manifest = nullptr;
  fetcher->Fetch(no_manifest, std::span<const FetchTarget>(targets).first(1), one);
  EXPECT_EQ(one[0].status.code(), StatusCode::kInvalidArgument);
  FetchDataset bad_name = d;
  bad_name.name = "Not_A_Label";
  fetcher->Fetch(bad_name, std::span<const FetchTarget>(targets).first(1), one);
  EXPECT_EQ(one[0].status.code(), StatusCode::kInvalidArgument);
  // Nothing to fetch: nothing happens.
  fetcher->Fetch(d, {}, {});
  EXPECT_EQ(fetcher->counters().node_failures, 0u) << "bad input was taken for a node failure";

  // Bad options are refused at Create.
  auto refused = [](SampleFetcherOptions opt) {
    return !SampleFetcher::Create(std::move(opt), nullptr).ok();
  };
  SampleFetcherOptions opt = TestOptions();
  opt.max_items_per_read = 0;
  EXPECT_TRUE(refused(opt));
  opt = TestOptions();
  opt.max_bytes_per_read = 0;
  EXPECT_TRUE(refused(opt));
  opt = TestOptions();
  opt.client_name = "has space";
  EXPECT_TRUE(refused(opt));
  opt = TestOptions();
  opt.peer.verify_checksums = false;
  EXPECT_TRUE(refused(opt));
  opt = TestOptions();
  opt.node_down_for = 0ms;
  EXPECT_TRUE(refused(opt));
  opt = TestOptions();
  opt.source_concurrency = 0;
  EXPECT_TRUE(refused(opt));
  opt = TestOptions("bad node id!");
  EXPECT_TRUE(refused(opt));
  EXPECT_OK(SampleFetcher::Create(TestOptions(), nullptr));
}

// ---- failures -----------------------------------------------------------------------

// A dataset placed on some nodes of the pool (DatasetSpec::nodes): staged
// there only, read from there only (the other nodes are never asked), moved
// when its node list changes, and read from the source when it lists none.
TEST(DatasetNodesTest, StagedAndReadOnItsNodesOnlyAndMovedWithItsList) {
  auto made = CacheCluster::Create();
  ASSERT_OK(made);
  CacheCluster& cluster = **made;
  ASSERT_OK(cluster.StartNodes(3));
  const std::string a = cluster.node(0).id();
  const std::string b = cluster.node(1).id();
  const std::string c = cluster.node(2).id();
  DatasetOptions o;
  o.name = "placed";
  o.files = 600;
  o.chunk_size = 64 * 1024;
  o.nodes = std::vector<std::string>{b};
  auto ds = cluster.CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK(cluster.WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  const uint64_t chunks = ds->manifest->chunk_count();
  auto staged_on = [&](const std::string& node) -> uint64_t {
    auto progress = cluster.store().ListProgress(ds->name);
    if (!progress.ok()) return 0;
    auto it = progress->find(node);
    return it == progress->end() ? 0 : it->second.chunks_staged;
  };
  EXPECT_EQ(staged_on(b), chunks) << cluster.Describe(ds->name);
  EXPECT_EQ(staged_on(a), 0u);
  EXPECT_EQ(staged_on(c), 0u);

  auto fetcher = NewFetcher(TestOptions());
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(LiveNodes(cluster));
  FetchDataset d = ForFetch(*ds);
  d.nodes = std::vector<std::string>{b};
  Fetched got = FetchIds(*fetcher, d, ds->AllIds(), 128);
  EXPECT_EQ(Problems(got, *ds), "");
  SampleFetcherCounters counters = fetcher->counters();
  EXPECT_EQ(counters.samples[static_cast<size_t>(SampleSource::kPeer)], ds->sample_count());
  EXPECT_EQ(counters.samples[static_cast<size_t>(SampleSource::kSource)], 0u);
  for (size_t n : {size_t{0}, size_t{2}}) {
    auto served = cluster.node(n).MetricValue("granary_cachenode_served_items_total");
    ASSERT_OK(served);
    EXPECT_EQ(*served, 0) << cluster.node(n).id() << " was asked for a dataset not placed on it";
  }

  // Moved to the two others: they stage it all, and b gives its chunks up.
  auto move_to = [&](std::optional<std::vector<std::string>> nodes) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto record = cluster.store().GetDataset(ds->name);
      ASSERT_OK(record);
      record->spec.nodes = nodes;
      if (cluster.store().UpdateDataset(*record).ok()) return;
    }
    FAIL() << "the dataset record kept changing";
  };
  move_to(std::vector<std::string>{a, c});
  ASSERT_TRUE(WaitFor(
      [&] {
        auto owned =
            cluster.node(1).MetricValue("granary_cachenode_owned_chunks", {{"dataset", ds->name}});
        return staged_on(a) + staged_on(c) == chunks && staged_on(a) > 0 && staged_on(c) > 0 &&
               owned.ok() && *owned == 0;
      },
      60s))
      << cluster.Describe(ds->name);
  ASSERT_OK(cluster.WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  d.nodes = std::vector<std::string>{a, c};
  got = FetchIds(*fetcher, d, ds->AllIds(), 128);
  EXPECT_EQ(Problems(got, *ds), "");
  counters = fetcher->counters();
  EXPECT_EQ(counters.samples[static_cast<size_t>(SampleSource::kPeer)], 2 * ds->sample_count());
  EXPECT_EQ(counters.samples[static_cast<size_t>(SampleSource::kSource)], 0u);

  // No node: nothing is asked, everything comes from the source.
  move_to(std::vector<std::string>{});
  d.nodes = std::vector<std::string>{};
  const uint64_t reads_before = counters.reads_sent;
  got = FetchIds(*fetcher, d, ds->AllIds(), 128);
  EXPECT_EQ(Problems(got, *ds), "");
  counters = fetcher->counters();
  EXPECT_EQ(counters.samples[static_cast<size_t>(SampleSource::kSource)], ds->sample_count());
  EXPECT_EQ(counters.reads_sent, reads_before);
  // And a list naming a node the pool does not have is the same as none.
  d.nodes = std::vector<std::string>{"node-elsewhere"};
  got = FetchIds(*fetcher, d, {0, 1, 2}, 128);
  EXPECT_EQ(Problems(got, *ds), "");
  EXPECT_EQ(fetcher->counters().reads_sent, reads_before);
}

TEST(SampleFetcherSecurityTest, NodesServingTlsWithTheClusterKeyAreReadByTheirRecordsLabel) {
  auto made = CacheCluster::Create();
  ASSERT_OK(made);
  CacheCluster& cluster = **made;
  const std::string cert = cluster.dir().Join("node.crt"), key = cluster.dir().Join("node.key");
  ASSERT_OK(MakeSelfSignedCertificate(cert, key, {"127.0.0.1"}));
  auto hex = GenerateClusterKeyHex();
  ASSERT_OK(hex);
  cluster.dir().WriteFile("cluster.key", *hex + "\n");
  const std::string key_file = cluster.dir().Join("cluster.key");
  ASSERT_EQ(::chmod(key_file.c_str(), 0600), 0);
  // One node with TLS and the key, one with the key only.
  CacheNodeOptions tls_node;
  tls_node.extra_yaml = "cluster_key_file: " + key_file + "\ntls_cert_file: " + cert +
                        "\ntls_key_file: " + key + "\n";
  CacheNodeOptions plain_node;
  plain_node.extra_yaml = "cluster_key_file: " + key_file + "\n";
  cluster.AddNode(tls_node);
  cluster.AddNode(plain_node);
  for (size_t i = 0; i < 2; ++i) ASSERT_OK(cluster.node(i).StartAndWaitReady());
  DatasetOptions o;
  o.name = "sealed";
  o.files = 300;
  o.chunk_size = 64 * 1024;
  auto ds = cluster.CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK(cluster.WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  std::vector<NodeRecord> nodes = LiveNodes(cluster);
  ASSERT_EQ(nodes.size(), 2u);
  size_t labelled = 0;
  for (const NodeRecord& n : nodes) labelled += n.labels.count(std::string(kNodeLabelTls));
  EXPECT_EQ(labelled, 1u);

  // The sidecar's reader: the key, and a TLS context verifying the node's certificate.
  SampleFetcherOptions with = TestOptions();
  auto keys = ClusterKeys::Load(key_file);
  ASSERT_OK(keys);
  with.peer.credentials.cluster_key = std::make_shared<const ClusterKeys>(std::move(*keys));
  auto tls = TlsContext::ForClient(cert);
  ASSERT_OK(tls);
  with.peer.tls = *tls;
  with.source_fallthrough = false;
  auto fetcher = NewFetcher(with);
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(nodes);
  const FetchDataset d = ForFetch(*ds);
  EXPECT_EQ(Problems(FetchIds(*fetcher, d, ds->AllIds(), 128), *ds), "");
  EXPECT_EQ(fetcher->counters().samples[kSrc], 0u);

  // Without the key: nothing from either node (and no source to fall to).
  SampleFetcherOptions without = TestOptions();
  without.peer.tls = *tls;
  without.source_fallthrough = false;
  auto refused = NewFetcher(without);
  ASSERT_NE(refused, nullptr);
  refused->SetNodes(nodes);
  const Fetched none = FetchIds(*refused, d, {0, 1, 2}, 3);
  for (const FetchOutcome& outcome : none.outcomes) {
    EXPECT_FALSE(outcome.status.ok());
    EXPECT_THAT(outcome.status.message(), ::testing::HasSubstr("requires authentication"));
  }
}

TEST(SampleFetcherFailureTest, NodeKilledMidwayThenAllDeadThenNoFallthrough) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(2));
  DatasetOptions o;
  o.name = "kill";
  o.files = 600;
  o.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  const std::vector<NodeRecord> both = LiveNodes(**cluster);
  ASSERT_EQ(both.size(), 2u);
  const FetchDataset d = ForFetch(*ds);
  auto fetcher = NewFetcher(TestOptions((*cluster)->node(0).id()));
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(both);

  // A reader fetching in batches of 64, re-listing the nodes before each
  // batch as the sidecar does every heartbeat, until two whole passes after
  // the kill are done.
  std::atomic<bool> killed{false};
  std::string problems;
  size_t passes_after = 0;
  std::thread reader([&] {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (passes_after < 2 && std::chrono::steady_clock::now() < deadline) {
      const bool after = killed.load();
      std::vector<SampleId> ids = ds->AllIds();
      Fetched got;
      got.ids = ids;
      got.outcomes.resize(ids.size());
      got.bytes.resize(ids.size());
      for (size_t start = 0; start < ids.size(); start += 64) {
        if (auto nodes = (*cluster)->store().ListNodes("default"); nodes.ok()) {
          fetcher->SetNodes(*nodes);
        }
        Fetched part = FetchIds(*fetcher, d,
                                {ids.begin() + static_cast<long>(start),
                                 ids.begin() + static_cast<long>(std::min(start + 64, ids.size()))},
                                64);
        for (size_t k = 0; k < part.ids.size(); ++k) {
          got.outcomes[start + k] = std::move(part.outcomes[k]);
          got.bytes[start + k] = std::move(part.bytes[k]);
        }
      }
      problems += Problems(got, *ds);
      if (after) ++passes_after;
    }
  });
  ASSERT_TRUE(WaitFor([&] { return fetcher->counters().reads_sent >= 6; }, 20s));
  auto exit = (*cluster)->node(1).Kill();
  killed = true;
  reader.join();
  ASSERT_OK(exit);
  EXPECT_EQ(problems, "");
  EXPECT_EQ(passes_after, 2u) << "the reader did not finish two passes after the kill";
  SampleFetcherCounters c = fetcher->counters();
  EXPECT_GT(c.node_failures, 0u);
  EXPECT_EQ(c.failed_samples, 0u);
  EXPECT_GT(c.samples[kLocal], 0u);

  // Every node dead: everything from the source, with the old node list (the
  // store may not have expired them yet).
  ASSERT_OK((*cluster)->node(0).Kill());
  SampleFetcherOptions sticky = TestOptions();
  sticky.node_down_for = 60s;
  auto orphan = NewFetcher(sticky);
  ASSERT_NE(orphan, nullptr);
  orphan->SetNodes(both);
  const Fetched from_source = FetchIds(*orphan, d, ds->AllIds(), 256);
  EXPECT_EQ(Problems(from_source, *ds), "");
  c = orphan->counters();
  EXPECT_EQ(c.samples[kSrc], ds->sample_count());
  EXPECT_EQ(c.bytes[kSrc], ds->total_bytes);
  EXPECT_GE(c.node_failures, 1u);
  EXPECT_LE(c.node_failures, 2u) << "a dead node was marked down more than once";
  // Marked down: the next passes cost no connection attempt.
  const uint64_t failures = c.node_failures;
  EXPECT_EQ(Problems(FetchIds(*orphan, d, ds->AllIds(), 100), *ds), "");
  EXPECT_EQ(orphan->counters().node_failures, failures);

  // Source fall-through off: every item fails, naming the nodes tried.
  SampleFetcherOptions strict = TestOptions();
  strict.source_fallthrough = false;
  auto no_source = NewFetcher(strict);
  ASSERT_NE(no_source, nullptr);
  no_source->SetNodes(both);
  for (int pass = 0; pass < 2; ++pass) {  // the second finds the nodes marked down
    const Fetched none = FetchIds(*no_source, d, ds->AllIds(), 256);
    for (size_t i = 0; i < none.ids.size(); ++i) {
      const Status& s = none.outcomes[i].status;
      ASSERT_EQ(s.code(), StatusCode::kUnavailable) << "pass " << pass << ": " << s.ToString();
      ASSERT_THAT(s.message(), HasSubstr(both[0].id)) << s.message();
      ASSERT_THAT(s.message(), HasSubstr(both[1].id)) << s.message();
      ASSERT_THAT(s.message(), HasSubstr("source fall-through is off"));
    }
  }
  EXPECT_EQ(no_source->counters().failed_samples, 2 * ds->sample_count());
  EXPECT_EQ(Delivered(no_source->counters()), 0u);

  // No node listed at all.
  auto nothing = NewFetcher(strict);
  ASSERT_NE(nothing, nullptr);
  const Fetched unlisted = FetchIds(*nothing, d, {0}, 1);
  EXPECT_EQ(unlisted.outcomes[0].status.code(), StatusCode::kUnavailable);
  EXPECT_THAT(unlisted.outcomes[0].status.message(), HasSubstr("no live cache node"));
}

TEST(SampleFetcherFailureTest, SourceFileChangedAfterTheSnapshotFailsThatSampleOnly) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  DatasetOptions o;
  o.name = "changed";
  o.files = 200;
  o.chunk_size = 64 * 1024;
  // The dataset exists before any node: nothing is staged when the file changes.
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  const SampleId changed = 77;
  {
    std::ofstream out(ds->PathOf(changed), std::ios::app | std::ios::binary);
    out << "appended after the snapshot";
  }
  ASSERT_OK((*cluster)->StartNodes(1));
  // Wait until the node serves the dataset (it publishes its progress).
  ASSERT_TRUE(WaitFor(
      [&] {
        auto p = (*cluster)->store().ListProgress(ds->name);
        return p.ok() && !p->empty();
      },
      20s))
      << (*cluster)->Describe(ds->name);
  const FetchDataset d = ForFetch(*ds);

  auto fetcher = NewFetcher(TestOptions());
  ASSERT_NE(fetcher, nullptr);
  fetcher->SetNodes(LiveNodes(**cluster));
  // Through the node, then through the source (no node listed).
  auto direct = NewFetcher(TestOptions());
  ASSERT_NE(direct, nullptr);
  for (SampleFetcher* f : {fetcher.get(), direct.get()}) {
    const Fetched got = FetchIds(*f, d, ds->AllIds(), 64);
    for (SampleId id = 0; id < ds->sample_count(); ++id) {
      if (id == changed) {
        EXPECT_EQ(got.outcomes[id].status.code(), StatusCode::kFailedPrecondition)
            << got.outcomes[id].status.ToString();
        EXPECT_THAT(got.outcomes[id].status.message(), HasSubstr("changed since the snapshot"));
        continue;
      }
      ASSERT_OK(got.outcomes[id].status);
      ASSERT_EQ(got.bytes[id], ds->contents[id]) << "sample " << id;
    }
    EXPECT_EQ(f->counters().failed_samples, 1u);
  }
  EXPECT_EQ(fetcher->counters().samples[kPeer], ds->sample_count() - 1);
  EXPECT_EQ(fetcher->counters().item_retries, 0u) << "a changed file is final, not retried";
  EXPECT_EQ(direct->counters().samples[kSrc], ds->sample_count() - 1);
}

}  // namespace
}  // namespace granary::testing

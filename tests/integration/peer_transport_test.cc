// The peer-transport seam (granary/peer/peer_transport.h): the TCP transport
// reads like PeerClient, and the sidecar's fetcher, reading through a
// transport that times out in the middle of a batch, corrupts bytes on the way
// and refuses connections (tests/testing/scripted_peer_transport.h), still
// hands out every sample with the source's bytes, from another replica or the
// source, and counts what happened. Real cache nodes, real store, real files.

#include "granary/peer/peer_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "granary/core/hash.h"
#include "granary/fabric/fabric_transport.h"
#include "granary/fetcher/sample_fetcher.h"
#include "testing/cachenode_fixture.h"
#include "testing/scripted_peer_transport.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using sidecar::FetchDataset;
using sidecar::FetchOutcome;
using sidecar::FetchTarget;
using sidecar::SampleFetcher;
using sidecar::SampleFetcherCounters;
using sidecar::SampleFetcherOptions;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class PeerTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    DatasetOptions o;
    o.name = "seam";
    o.files = 400;
    o.chunk_size = 64 * 1024;
    o.replication = 2;  // every chunk on both nodes: a failed read has another replica
    auto ds = cluster_->CreateDataset(o);
    ASSERT_OK(ds);
    ds_ = std::make_unique<TestDataset>(std::move(*ds));
    ASSERT_OK(cluster_->WaitForPhase(ds_->name, DatasetPhase::kReady, 60s));
    auto nodes = cluster_->store().ListNodes("default");
    ASSERT_OK(nodes);
    ASSERT_EQ(nodes->size(), 2u);
    nodes_ = *nodes;
  }

  FetchDataset ForFetch() const {
    FetchDataset d;
    d.name = ds_->name;
    d.manifest = ds_->manifest;
    d.source_uri = "file://" + ds_->root;
    d.owner = DatasetOwner{::getuid(), ::getgid()};
    d.replication = 2;
    return d;
  }

  std::unique_ptr<SampleFetcher> Fetcher(std::shared_ptr<PeerTransport> transport) {
    SampleFetcherOptions o;
    o.client_name = "peer-transport-test";
    o.peer.connect_timeout = 2s;
    o.peer.call_timeout = 20s;
    o.node_down_for = 60s;  // a node marked down stays down for the test
    o.transport = std::move(transport);
    auto f = SampleFetcher::Create(std::move(o), nullptr);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return nullptr;
    (*f)->SetNodes(nodes_);
    return std::move(*f);
  }

  // Every sample in batches of 32: "" when each came back OK with the
  // source's bytes and their checksum, else the first problems.
  std::string FetchAll(SampleFetcher& f) {
    const FetchDataset d = ForFetch();
    const std::vector<SampleId> ids = ds_->AllIds();
    std::string problems;
    for (size_t start = 0; start < ids.size(); start += 32) {
      const size_t n = std::min<size_t>(32, ids.size() - start);
      std::vector<std::string> bytes(n);
      std::vector<FetchTarget> targets(n);
      std::vector<FetchOutcome> outcomes(n);
      for (size_t k = 0; k < n; ++k) {
        bytes[k].resize(ds_->manifest->SizeOf(ids[start + k]));
        targets[k] = FetchTarget{ids[start + k], std::span<char>(bytes[k])};
      }
      f.Fetch(d, targets, outcomes);
      for (size_t k = 0; k < n; ++k) {
        const SampleId id = ids[start + k];
        if (!outcomes[k].status.ok()) {
          problems += "\n  sample " + std::to_string(id) + ": " + outcomes[k].status.ToString();
        } else if (bytes[k] != ds_->contents[id]) {
          problems += "\n  sample " + std::to_string(id) + ": wrong bytes";
        } else if (outcomes[k].checksum != Checksum64(ds_->contents[id])) {
          problems += "\n  sample " + std::to_string(id) + ": wrong checksum";
        }
      }
    }
    return problems;
  }

  std::unique_ptr<CacheCluster> cluster_;
  std::unique_ptr<TestDataset> ds_;
  std::vector<NodeRecord> nodes_;
};

TEST_F(PeerTransportTest, TcpTransportConnectsReadsAndNamesWhatFailed) {
  std::shared_ptr<PeerTransport> tcp = TcpPeerTransport();
  EXPECT_EQ(tcp->name(), "tcp");
  EXPECT_EQ(TcpPeerTransport(), tcp) << "one process-wide instance";
  PeerClientOptions options;
  options.client_name = "peer-transport-test";
  auto connection = tcp->Connect(nodes_[0].address, options);
  ASSERT_OK(connection);
  ASSERT_TRUE((*connection)->connected());
  ASSERT_OK((*connection)->Ping());
  ReadRequest read;
  read.dataset = ds_->name;
  read.manifest_id = ds_->manifest->id();
  read.items.push_back(
      ReadItem{ReadKind::kSample, 7, 0, static_cast<uint32_t>(ds_->manifest->SizeOf(7))});
  auto got = (*connection)->Read(read);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  ASSERT_OK(got->status(0));
  EXPECT_EQ(got->bytes(0), ds_->contents[7]);
  EXPECT_GT((*connection)->limits().max_items, 0u);
  (*connection)->Close();
  EXPECT_FALSE((*connection)->connected());

  // Nothing listens there: the error names the address.
  const uint16_t closed = FreeTcpPort();
  auto refused = tcp->Connect("127.0.0.1:" + std::to_string(closed), options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().ToString();
  EXPECT_THAT(refused.status().message(), HasSubstr(std::to_string(closed)));
  // Not an address at all.
  auto bad = tcp->Connect("no-port-here", options);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
}

TEST_F(PeerTransportTest, AReadTimingOutMidBatchBreaksOnlyThatNodeAndEverySampleArrives) {
  auto scripted = ScriptedPeerTransport::Wrap(TcpPeerTransport());
  scripted->TimeoutRead(nodes_[0].address, 2);
  scripted->TimeoutRead(nodes_[1].address, 2);
  auto fetcher = Fetcher(scripted);
  ASSERT_NE(fetcher, nullptr);
  EXPECT_EQ(FetchAll(*fetcher), "");
  const SampleFetcherCounters c = fetcher->counters();
  EXPECT_EQ(scripted->faults_fired(), 2u);
  EXPECT_GE(c.node_failures, 2u) << "a timed-out connection marks its node down";
  EXPECT_EQ(c.failed_samples, 0u);
  // Both nodes down after their timeouts: the rest came from the source.
  EXPECT_GT(c.samples[static_cast<size_t>(sidecar::SampleSource::kSource)], 0u);
}

TEST_F(PeerTransportTest, BytesCorruptedOnTheWayAreNeverHandedOut) {
  auto scripted = ScriptedPeerTransport::Wrap(TcpPeerTransport());
  for (uint64_t nth = 1; nth <= 4; ++nth) {
    scripted->CorruptRead(nodes_[0].address, nth, 0);
    scripted->CorruptRead(nodes_[1].address, nth, 1);
  }
  auto fetcher = Fetcher(scripted);
  ASSERT_NE(fetcher, nullptr);
  EXPECT_EQ(FetchAll(*fetcher), "");
  const SampleFetcherCounters c = fetcher->counters();
  EXPECT_GE(scripted->faults_fired(), 2u);
  EXPECT_GE(c.item_retries, 2u) << "each corrupted item is read again elsewhere";
  EXPECT_EQ(c.node_failures, 0u) << "a corrupted item is not a dead node";
  EXPECT_EQ(c.failed_samples, 0u);
}

TEST_F(PeerTransportTest, ARefusedConnectionSendsItsSamplesToTheOtherReplica) {
  auto scripted = ScriptedPeerTransport::Wrap(TcpPeerTransport());
  scripted->RefuseConnects(nodes_[1].address, 1);
  auto fetcher = Fetcher(scripted);
  ASSERT_NE(fetcher, nullptr);
  EXPECT_EQ(FetchAll(*fetcher), "");
  const SampleFetcherCounters c = fetcher->counters();
  EXPECT_EQ(scripted->faults_fired(), 1u);
  EXPECT_EQ(c.node_failures, 1u);
  EXPECT_EQ(c.failed_samples, 0u);
  EXPECT_EQ(scripted->reads(nodes_[1].address), 0u) << "a node marked down is not read";
  EXPECT_GT(scripted->reads(nodes_[0].address), 0u);
}

// verify_reads: once, end to end: a node checks each segment the first time
// and then sends it from its chunk file (sendfile over TCP; a file range read
// into the fabric front end's buffer and written by RMA). Every sample read
// twice over each transport is the source's, with its checksum (which the
// readers verify), and the second TCP pass went out with sendfile.
TEST(VerifyOnceTest, ANodeThatVerifiesOnceServesTheSourcesBytesOverBothTransports) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions o;
  o.extra_yaml =
      "verify_reads: once\nfabric_listen: 127.0.0.1:" + std::to_string(FreeTcpPort()) + "\n";
  CacheNode& node = (*cluster)->AddNode(o);
  ASSERT_OK(node.Start());
  ASSERT_OK(node.WaitReady(30s));
  DatasetOptions d;
  d.name = "once";
  d.files = 200;
  d.chunk_size = 64 * 1024;
  auto ds = (*cluster)->CreateDataset(d);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  auto nodes = (*cluster)->store().ListNodes("default");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 1u);
  const auto fabric_label = nodes->front().labels.find(std::string(kNodeLabelFabric));
  ASSERT_NE(fabric_label, nodes->front().labels.end()) << "the node advertises no fabric";

  ReadRequest request;
  request.dataset = ds->name;
  request.manifest_id = ds->manifest_id;
  for (SampleId id : ds->AllIds()) {
    request.items.push_back(
        {ReadKind::kSample, id, 0, static_cast<uint32_t>(ds->contents[id].size())});
  }
  auto check = [&](PeerConnection& connection, const std::string& what) {
    for (int pass = 0; pass < 2; ++pass) {
      auto result = connection.Read(request);
      ASSERT_OK(result);
      for (size_t k = 0; k < request.items.size(); ++k) {
        const SampleId id = request.items[k].id;
        ASSERT_TRUE(result->status(k).ok())
            << what << " pass " << pass << " sample " << id << ": " << result->status(k).ToString();
        ASSERT_EQ(result->bytes(k), ds->contents[id]) << what << " pass " << pass;
        ASSERT_EQ(result->reply().items[k].checksum, Checksum64(ds->contents[id]));
      }
    }
  };
  PeerClientOptions options;
  options.client_name = "verify-once-test";
  auto tcp = TcpPeerTransport()->Connect(node.address(), options);
  ASSERT_OK(tcp);
  check(**tcp, "tcp");
  EXPECT_OK(node.WaitForMetric("granary_cachenode_sendfile_bytes_total", {}, [&](double v) {
    return v >= 0.9 * static_cast<double>(ds->total_bytes);
  }));
  auto fabric = fabric::FabricPeerTransport("tcp")->Connect(fabric_label->second, options);
  ASSERT_OK(fabric);
  check(**fabric, "libfabric");
}

}  // namespace
}  // namespace granary::testing

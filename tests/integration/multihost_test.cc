// Cache nodes across hosts, over each
// transport the sidecar can be given (TCP, and libfabric with its tcp
// provider; docs/transport.md): four
// "hosts" as network namespaces on a bridge (testing/netns_hosts.h), one
// granary-cachenode per host, Redis in the root namespace listening on the
// bridge, and the trainer's host (host 0) running a granary-sidecar that a
// libgranary-client Session reads through.
//
//  - a dataset staged across the hosts and read from the trainer's host
//    equals the source byte for byte, the sidecar fetched from the other
//    hosts and never from the source, and each source file was opened once
//    (counted by the nodes: granary_cachenode_source_opens_total, as
//    cachenode_cluster_test counts it);
//  - a host cut off mid-epoch (its link down, the process alive): the epoch
//    completes with the source's bytes, the host's node record expires and
//    the other hosts own and stage all its chunks; the dataset is then
//    deleted and made again from a changed source, and when the link comes
//    back the host rejoins without serving stale data: whatever it answers
//    for the new dataset is the new source's bytes, it stops serving the
//    deleted one, and serves exactly its share of the new one;
//  - a host killed: the others take its chunks over while the trainer reads
//    on; restarted, it rebuilds from its chunk store (no source file opened)
//    and serves its share again.
//
// With libfabric, every node also serves the fabric on its host's address
// (fabric_listen) and the sidecar reads over it (transport libfabric): each
// case also checks that it did (fabric connections, no fall-back to TCP).
//
// Skipped when network namespaces cannot be made (not root). Every wait is
// bounded; the network and every process are gone after each test, also
// when it fails (NetnsHosts' destructor).

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "granary/client/session.h"
#include "granary/protocol/protocol.h"
#include "testing/cachenode_fixture.h"
#include "testing/child_process.h"
#include "testing/daemon_process.h"
#include "testing/netns_hosts.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using namespace std::chrono_literals;
using Labels = std::map<std::string, std::string>;

constexpr size_t kHosts = 4;
constexpr size_t kTrainerHost = 0;
constexpr char kOpens[] = "granary_cachenode_source_opens_total";
constexpr char kOwned[] = "granary_cachenode_owned_chunks";
constexpr char kStaged[] = "granary_cachenode_staged_chunks";

// The transport the sidecar reads the nodes over.
class MultiHostTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool fabric() const { return std::string(GetParam()) == "libfabric"; }

  void SetUp() override {
    if (auto why = NetnsHosts::Unavailable()) GTEST_SKIP() << *why;
    auto hosts = NetnsHosts::Create(kHosts);
    ASSERT_OK(hosts);
    hosts_ = std::move(*hosts);
    // Redis in the root namespace, on the bridge too: every host reaches it.
    auto cluster = CacheCluster::Create({"--bind", "127.0.0.1", hosts_->bridge_address()});
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    store_url_ = "redis://" + hosts_->bridge_address() + ":" +
                 std::to_string(cluster_->redis().port()) + "/0";
    for (size_t i = 0; i < kHosts; ++i) {
      CacheNodeOptions o;
      o.node_id = "host" + std::to_string(i);
      o.metadata_store = store_url_;
      // A cut host's record expires a second after its last heartbeat.
      o.heartbeat_interval = "200ms";
      o.heartbeat_ttl = "1s";
      if (fabric()) {
        // Any port is free inside the host's own namespace.
        o.extra_yaml = "fabric_listen: " + hosts_->host(i).address + ":" +
                       std::to_string(FreeTcpPort()) + "\nfabric_provider: tcp\n";
      }
      CacheNode& node = cluster_->AddNode(o);
      node.BindTo(hosts_->host(i).address);
      node.RunThrough(hosts_->ExecPrefix(i));
      ASSERT_OK(node.Start());
    }
    for (size_t i = 0; i < kHosts; ++i) ASSERT_OK(cluster_->node(i).WaitReady(60s));

    SidecarOptions o;
    o.store_url = store_url_;
    o.local_node_id = node(kTrainerHost).id();
    o.window_bytes = "2MiB";
    o.arena_bytes = "32MiB";
    // A cut host's connections hang rather than fail: give up on a call to
    // it after seconds, not the default's half minute.
    o.extra_yaml = "call_timeout: 5s\n";
    if (fabric()) o.extra_yaml += "transport: libfabric\n";
    const std::string dir = cluster_->dir().Join("sidecar");
    std::filesystem::create_directories(dir);
    sidecar_ = std::make_unique<SidecarProcess>(o, dir);
    sidecar_->BindTo(hosts_->host(kTrainerHost).address);
    sidecar_->RunThrough(hosts_->ExecPrefix(kTrainerHost));
    ASSERT_OK(sidecar_->StartAndWaitReady(60s));
  }

  // Every case read over the transport it is given.
  void TearDown() override {
    if (sidecar_ != nullptr && !IsSkipped() && !HasFatalFailure()) ExpectReadOverTheTransport();
  }

  CacheNode& node(size_t host) { return cluster_->node(host); }

  // With libfabric: the sidecar's connections to the nodes went over the
  // fabric (at least `at_least` of them), none fell back to TCP.
  void ExpectReadOverTheTransport(double at_least = 1) {
    if (!fabric()) return;
    EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_fabric_connects_total", {},
                                      [&](double v) { return v >= at_least; }));
    auto available = sidecar_->MetricValue("granary_sidecar_fabric_available");
    ASSERT_OK(available);
    EXPECT_EQ(*available, 1);
    auto fallbacks = sidecar_->MetricValue("granary_sidecar_fabric_fallbacks_total");
    ASSERT_OK(fallbacks);
    EXPECT_EQ(*fallbacks, 0) << "the sidecar reached a node over TCP";
  }

  // A dataset placed on all live hosts, Ready. Other sizes, other bytes.
  TestDataset StageDataset(const std::string& name, size_t min_size = 512,
                           size_t max_size = 6 * 1024) {
    DatasetOptions d;
    d.name = name;
    d.files = 1500;
    d.min_size = min_size;
    d.max_size = max_size;
    d.chunk_size = 64 * 1024;
    auto ds = cluster_->CreateDataset(d);
    EXPECT_OK(ds);
    if (!ds.ok()) return {};
    EXPECT_OK(cluster_->WaitForPhase(ds->name, DatasetPhase::kReady, 90s));
    return std::move(*ds);
  }

  std::unique_ptr<client::Session> OpenSession(const std::string& dataset) {
    client::SessionOptions o;
    o.socket_path = sidecar_->socket_path();
    o.verify_checksums = true;
    o.call_timeout = 60s;
    auto s = client::Session::Open(dataset, o);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Reads samples [first, end) through the trainer's session, 64 at a time,
  // and checks every byte against the source.
  void ReadThroughSidecar(client::Session& session, const TestDataset& ds, uint32_t first,
                          uint32_t end) {
    for (uint32_t at = first; at < end; at += 64) {
      std::vector<uint32_t> ids;
      for (uint32_t id = at; id < std::min<uint32_t>(at + 64, end); ++id) ids.push_back(id);
      auto views = session.GetMany(ids);
      ASSERT_EQ(views.size(), ids.size());
      for (size_t k = 0; k < ids.size(); ++k) {
        ASSERT_TRUE(views[k].ok()) << "sample " << ids[k] << ": " << views[k].status().ToString();
        ASSERT_EQ(views[k]->bytes(), ds.contents[ids[k]]) << "sample " << ids[k];
        session.Release(*views[k]);
      }
    }
  }

  // Waits until the nodes of `hosts` together own every chunk of `ds`, each
  // once, and each has staged what it owns.
  void ExpectOwnedAndStagedBy(const std::vector<size_t>& hosts, const TestDataset& ds,
                              std::chrono::milliseconds timeout) {
    const Labels of_ds{{"dataset", ds.name}};
    const double chunks = static_cast<double>(ds.manifest->chunk_count());
    std::string last;
    const bool done = WaitFor(
        [&] {
          double owned_sum = 0;
          last.clear();
          for (size_t h : hosts) {
            auto owned = node(h).MetricValue(kOwned, of_ds);
            auto staged = node(h).MetricValue(kStaged, of_ds);
            if (!owned.ok() || !staged.ok()) {
              last = node(h).id() + ": " + (owned.ok() ? staged : owned).status().ToString();
              return false;
            }
            last += " " + node(h).id() + " owns " + std::to_string(*owned) + ", staged " +
                    std::to_string(*staged) + ";";
            if (*owned != *staged || *owned == 0) return false;
            owned_sum += *owned;
          }
          return owned_sum == chunks;
        },
        timeout, 100ms);
    EXPECT_TRUE(done) << "the chunks of " << ds.name << " (" << chunks
                      << ") were not owned and staged by the expected hosts within "
                      << timeout.count() << " ms:" << last << "\n"
                      << cluster_->Describe(ds.name);
  }

  // The ids of the store's live nodes.
  std::set<std::string> LiveNodes() {
    std::set<std::string> ids;
    auto nodes = cluster_->store().ListNodes("default");
    if (nodes.ok()) {
      for (const NodeRecord& n : *nodes) ids.insert(n.id);
    }
    return ids;
  }

  // Samples `ids` of `ds` asked of `host`'s node directly, by its address
  // (listed live or not): per sample, the status and, when OK, the bytes.
  std::vector<std::pair<Status, std::string>> ReadDirect(size_t host, const TestDataset& ds,
                                                         const std::vector<SampleId>& ids) {
    std::vector<std::pair<Status, std::string>> out(ids.size());
    auto client = node(host).Connect(5s);
    if (!client.ok()) {
      for (auto& o : out) o.first = client.status();
      return out;
    }
    for (size_t at = 0; at < ids.size(); at += 64) {
      ReadRequest request;
      request.dataset = ds.name;
      request.manifest_id = ds.manifest_id;
      const size_t end = std::min(at + 64, ids.size());
      for (size_t k = at; k < end; ++k) {
        request.items.push_back(
            {ReadKind::kSample, ids[k], 0, static_cast<uint32_t>(ds.contents[ids[k]].size())});
      }
      auto reply = client->Read(request);
      for (size_t k = at; k < end; ++k) {
        if (!reply.ok()) {
          out[k].first = reply.status();
        } else if (!reply->status(k - at).ok()) {
          out[k].first = reply->status(k - at);
        } else {
          out[k].second = std::string(reply->bytes(k - at));
        }
      }
    }
    return out;
  }

  // Reads every sample from `host`'s node: what it answers with bytes must
  // be the source's, and it must answer with bytes exactly for the samples
  // placement gives it (the others: kNotFound, "read it from its owner").
  void ExpectServesExactlyItsShare(size_t host, const TestDataset& ds) {
    DatasetReader reader(&cluster_->store(), ds);
    ASSERT_OK(reader.Refresh());
    const std::vector<DatasetReader::Outcome> got = reader.ReadFrom(node(host).id(), ds.AllIds());
    size_t served = 0;
    size_t bad = 0;
    for (SampleId id = 0; id < got.size(); ++id) {
      auto owner = reader.OwnerOf(id);
      ASSERT_OK(owner);
      const bool mine = *owner == node(host).id();
      if (got[id].status.ok()) {
        ++served;
        if (!mine || got[id].bytes != ds.contents[id]) {
          if (++bad <= 5) {
            ADD_FAILURE() << node(host).id() << " served sample " << id << " (owner " << *owner
                          << "): " << (mine ? "bytes other than the source's" : "not its own");
          }
        }
      } else if (mine || got[id].status.code() != StatusCode::kNotFound) {
        if (++bad <= 5) {
          ADD_FAILURE() << node(host).id() << " on sample " << id << " (owner " << *owner
                        << "): " << got[id].status.ToString();
        }
      }
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_GT(served, 0u) << node(host).id() << " owns no sample";
  }

  // Declared in teardown order, last first: the sidecar, then the nodes and
  // Redis, then the network (which kills whatever is still inside).
  std::unique_ptr<NetnsHosts> hosts_;
  std::unique_ptr<CacheCluster> cluster_;
  std::string store_url_;  // Redis as the hosts reach it
  std::unique_ptr<SidecarProcess> sidecar_;
};

TEST_P(MultiHostTest, DatasetStagedAcrossHostsReadsBackByteForByteOpeningEachFileOnce) {
  const TestDataset ds = StageDataset("across");
  ASSERT_NE(ds.manifest, nullptr);

  // Staged across the hosts: every host owns and staged a share.
  std::vector<size_t> all;
  for (size_t h = 0; h < kHosts; ++h) all.push_back(h);
  ExpectOwnedAndStagedBy(all, ds, 30s);

  // The trainer's epoch through the sidecar on host 0.
  auto session = OpenSession(ds.name);
  ASSERT_NE(session, nullptr);
  ReadThroughSidecar(*session, ds, 0, static_cast<uint32_t>(ds.sample_count()));

  // The bytes crossed the namespaces: the sidecar fetched from the other
  // hosts' nodes, nothing from the source, and every host served. (Metrics
  // are refreshed about every 500 ms: wait for the epoch to be counted.)
  constexpr char kFetched[] = "granary_sidecar_fetched_samples_total";
  ASSERT_OK(sidecar_->WaitForMetric(
      kFetched, {}, [&](double v) { return v >= static_cast<double>(ds.sample_count()); }));
  auto from_peers = sidecar_->MetricValue(kFetched, {{"from", "peer"}});
  ASSERT_OK(from_peers);
  EXPECT_GT(*from_peers, 0);
  auto from_source = sidecar_->MetricValue(kFetched, {{"from", "source"}});
  ASSERT_OK(from_source);
  EXPECT_EQ(*from_source, 0) << "the sidecar read the source";
  // (Over the fabric, what a node served is counted by its fabric front end.)
  const char* served = fabric() ? "granary_cachenode_fabric_rma_bytes_total"
                                : "granary_cachenode_served_items_total";
  for (size_t h = 1; h < kHosts; ++h) {
    EXPECT_OK(node(h).WaitForMetric(served, {}, [](double v) { return v > 0; }));
  }
  // One connection per other host at least.
  ExpectReadOverTheTransport(static_cast<double>(kHosts - 1));

  // Each source file opened once over all hosts.
  const Labels of_ds{{"dataset", ds.name}};
  const double files = static_cast<double>(ds.sample_count());
  double opens = 0;
  EXPECT_TRUE(WaitFor(
      [&] {
        opens = 0;
        for (size_t h = 0; h < kHosts; ++h) {
          auto v = node(h).MetricValue(kOpens, of_ds);
          if (!v.ok()) return false;
          opens += *v;
        }
        return opens >= files;
      },
      20s));
  EXPECT_EQ(opens, files);
}

TEST_P(MultiHostTest, HostCutOffMidEpochIsReplacedAndRejoinsWithoutServingStaleData) {
  const TestDataset ds = StageDataset("cut");
  ASSERT_NE(ds.manifest, nullptr);
  constexpr size_t kCut = 2;
  const std::string cut_id = node(kCut).id();
  auto session = OpenSession(ds.name);
  ASSERT_NE(session, nullptr);
  const uint32_t samples = static_cast<uint32_t>(ds.sample_count());

  // Half an epoch, then the host's cable is pulled; the epoch goes on.
  ReadThroughSidecar(*session, ds, 0, samples / 2);
  ASSERT_OK(hosts_->CutLink(kCut));
  const auto cut_at = std::chrono::steady_clock::now();
  ReadThroughSidecar(*session, ds, samples / 2, samples);
  const auto epoch_took = std::chrono::steady_clock::now() - cut_at;
  RecordProperty(
      "second_half_after_the_cut_ms",
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(epoch_took).count()));

  // The sidecar met the cut host (a connection-level failure), so the epoch
  // above is the fall-back's, not a window prefetched before the cut.
  auto node_failures = sidecar_->WaitForMetric("granary_sidecar_node_failures_total", {},
                                               [](double v) { return v > 0; });
  EXPECT_OK(node_failures);

  // Its record expires; the other hosts own and stage all its chunks, and
  // serve them from where readers now look.
  ASSERT_TRUE(WaitFor([&] { return LiveNodes().count(cut_id) == 0; }, 20s))
      << cut_id << " was still listed live 20 s after its link went down";
  ExpectOwnedAndStagedBy({0, 1, 3}, ds, 60s);
  {
    DatasetReader reader(&cluster_->store(), ds);
    std::vector<std::string> wrong;
    ASSERT_OK(reader.ReadAllCorrect(ds.AllIds(), 60s, &wrong));
    EXPECT_TRUE(wrong.empty()) << wrong.front();
  }

  // While the host is away, the dataset is deleted and made again from a
  // changed source (other sizes, other bytes): what the host holds is stale.
  session.reset();
  ASSERT_OK(cluster_->store().DeleteDataset(ds.name));
  const TestDataset v2 = StageDataset(ds.name, 7 * 1024, 9 * 1024);
  ASSERT_NE(v2.manifest, nullptr);
  ASSERT_NE(v2.manifest_id, ds.manifest_id);

  // The link comes back. From the first moment, whatever the host answers
  // for the new dataset is the new source's bytes; it re-registers, stops
  // serving the deleted one, owns and stages its share of the new one, and
  // serves exactly that.
  ASSERT_OK(hosts_->RestoreLink(kCut));
  std::vector<SampleId> probe;
  for (SampleId id = 0; id < v2.sample_count(); id += 5) probe.push_back(id);
  size_t answered = 0;
  size_t wrong = 0;
  const bool caught_up = WaitFor(
      [&] {
        const auto got = ReadDirect(kCut, v2, probe);
        for (size_t k = 0; k < probe.size(); ++k) {
          if (!got[k].first.ok()) continue;
          ++answered;
          if (got[k].second != v2.contents[probe[k]] && ++wrong <= 5) {
            ADD_FAILURE() << cut_id << " served sample " << probe[k]
                          << " of the re-made dataset with other bytes than its source's ("
                          << got[k].second.size() << " bytes, the source has "
                          << v2.contents[probe[k]].size() << ")";
          }
        }
        return LiveNodes().count(cut_id) == 1 && answered > 0;
      },
      60s, 20ms);
  ASSERT_TRUE(caught_up) << cut_id << " did not rejoin and serve the re-made dataset within 60 s";
  EXPECT_EQ(wrong, 0u);
  ExpectOwnedAndStagedBy({0, 1, 2, 3}, v2, 60s);
  ExpectServesExactlyItsShare(kCut, v2);
  EXPECT_TRUE(WaitFor(
      [&] {
        for (const auto& [status, bytes] : ReadDirect(kCut, ds, ds.AllIds())) {
          if (status.ok()) return false;
        }
        return true;
      },
      30s))
      << cut_id << " still serves the deleted dataset 30 s after rejoining";

  // An epoch of the new dataset through the sidecar, with the host back.
  session = OpenSession(v2.name);
  ASSERT_NE(session, nullptr);
  ReadThroughSidecar(*session, v2, 0, static_cast<uint32_t>(v2.sample_count()));
}

TEST_P(MultiHostTest, HostKilledAndRestartedRebuildsFromItsChunkStoreAndServes) {
  const TestDataset ds = StageDataset("restart");
  ASSERT_NE(ds.manifest, nullptr);
  constexpr size_t kVictim = 1;
  CacheNode& victim = node(kVictim);
  const Labels of_ds{{"dataset", ds.name}};
  auto owned = victim.WaitForMetric(kOwned, of_ds, [](double v) { return v > 0; });
  ASSERT_OK(owned);
  ASSERT_OK(victim.WaitForMetric(kStaged, of_ds, [&](double v) { return v == *owned; }));
  const std::vector<std::string> chunk_files = victim.ChunkFiles();
  ASSERT_EQ(static_cast<double>(chunk_files.size()), *owned);

  auto killed = victim.Kill();
  ASSERT_OK(killed);
  EXPECT_EQ(killed->signal, 9) << killed->ToString();

  // Down long enough for its record to expire and the others to take its
  // chunks over; the trainer's epoch goes on meanwhile.
  ASSERT_TRUE(WaitFor([&] { return LiveNodes().count(victim.id()) == 0; }, 20s))
      << victim.id() << " was still listed live 20 s after it was killed";
  ExpectOwnedAndStagedBy({0, 2, 3}, ds, 60s);
  auto session = OpenSession(ds.name);
  ASSERT_NE(session, nullptr);
  ReadThroughSidecar(*session, ds, 0, static_cast<uint32_t>(ds.sample_count()));

  ASSERT_OK(victim.StartAndWaitReady(60s));  // in its namespace again

  // Rebuilt from its chunk store: its share staged again without one source
  // open, the same chunk files, and it serves them.
  ASSERT_OK(victim.WaitForMetric(
      kStaged, of_ds, [&](double v) { return v == *owned; }, 30s));
  ExpectOwnedAndStagedBy({0, 1, 2, 3}, ds, 30s);
  auto opens = victim.MetricValue(kOpens, of_ds);
  ASSERT_OK(opens);
  EXPECT_EQ(*opens, 0) << "the restarted host read the source again";
  EXPECT_EQ(victim.ChunkFiles(), chunk_files);
  ExpectServesExactlyItsShare(kVictim, ds);

  // The trainer's next epoch, with the restarted host among the sources.
  ReadThroughSidecar(*session, ds, 0, static_cast<uint32_t>(ds.sample_count()));
}

// ---- the fixture itself ---------------------------------------------------------

// Names of namespaces and interfaces starting with `prefix`: the first word
// of `ip netns list`'s lines, the name of `ip -o link show`'s ("7: name@peer:").
std::vector<std::string> NamesWithPrefix(const std::string& prefix) {
  std::vector<std::string> found;
  for (const bool links : {false, true}) {
    auto out = links ? RunCommand({IpBinary(), "-o", "link", "show"})
                     : RunCommand({IpBinary(), "netns", "list"});
    EXPECT_OK(out);
    if (!out.ok()) continue;
    std::istringstream lines(*out);
    std::string line;
    while (std::getline(lines, line)) {
      const size_t colon = links ? line.find(": ") : 0;
      if (colon == std::string::npos) continue;
      const size_t start = links ? colon + 2 : 0;
      const std::string name = line.substr(start, line.find_first_of(" :@", start) - start);
      if (name.rfind(prefix, 0) == 0) found.push_back(name);
    }
  }
  return found;
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiHostTest, ::testing::Values("tcp", "libfabric"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           return std::string(param.param);
                         });

TEST(NetnsHostsTest, CutsAndRestoresALinkAndDestroyKillsWhatRunsInside) {
  if (auto why = NetnsHosts::Unavailable()) GTEST_SKIP() << *why;
  auto hosts = NetnsHosts::Create(3);
  ASSERT_OK(hosts);
  const std::string prefix = (*hosts)->prefix();
  EXPECT_LE((*hosts)->bridge().size(), 15u);
  EXPECT_LE((*hosts)->host(2).link.size(), 15u);
  EXPECT_EQ(NamesWithPrefix(prefix).size(), 3 + 3 + 1) << "3 namespaces, 3 veths, a bridge";

  // A process inside host 1 sees that host's address and nothing of the root's.
  auto addresses = RunCommand([&] {
    std::vector<std::string> argv = (*hosts)->ExecPrefix(1);
    for (const char* a : {"ip", "-o", "-4", "addr", "show"}) argv.push_back(a);
    return argv;
  }());
  ASSERT_OK(addresses);
  EXPECT_NE(addresses->find(" " + (*hosts)->host(1).address + "/24"), std::string::npos)
      << *addresses;
  EXPECT_NE(addresses->find("127.0.0.1"), std::string::npos) << "lo is up: " << *addresses;
  EXPECT_EQ(addresses->find((*hosts)->bridge_address() + "/"), std::string::npos) << *addresses;

  const auto link_up = [&] {
    auto out = RunCommand({IpBinary(), "-o", "link", "show", (*hosts)->host(2).link});
    EXPECT_OK(out);
    return out.ok() && out->find(",UP") != std::string::npos;
  };
  EXPECT_TRUE(link_up());
  ASSERT_OK((*hosts)->CutLink(2));
  EXPECT_FALSE(link_up());
  ASSERT_OK((*hosts)->RestoreLink(2));
  EXPECT_TRUE(link_up());

  TempDir dir;
  DaemonProcessOptions o;
  o.args = (*hosts)->ExecPrefix(1);
  o.binary = o.args.front();
  o.args.erase(o.args.begin());
  o.args.push_back("sleep");
  o.args.push_back("600");
  o.log_path = dir.Join("sleep.log");
  auto sleeper = DaemonProcess::Start(o);
  ASSERT_OK(sleeper);
  // `ip netns exec` enters the namespace, then execs sleep: wait for the
  // exec, so that what Destroy must kill is inside (a Destroy racing ip's own
  // set-up left ip hung once).
  const std::string comm = "/proc/" + std::to_string((*sleeper)->pid()) + "/comm";
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream f(comm);
        std::string name;
        return std::getline(f, name) && name == "sleep";
      },
      10s))
      << "the sleeper never started inside host 1";

  const auto started = std::chrono::steady_clock::now();
  ASSERT_OK((*hosts)->Destroy());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s);
  ASSERT_OK((*sleeper)->Wait(5s));  // killed by Destroy, reaped here
  EXPECT_EQ((*sleeper)->exit_status()->signal, 9);
  EXPECT_TRUE(NamesWithPrefix(prefix).empty());
}

TEST(NetnsHostsTest, RemovesWhatARunWhoseProcessIsGoneLeftBehind) {
  if (auto why = NetnsHosts::Unavailable()) GTEST_SKIP() << *why;
  // A run of a process that is alive while its names are made, then gone
  // (a concurrent run's Create removes nothing of a live process).
  auto run = ChildProcess::Start([](int control_fd) {
    char byte;
    return ::read(control_fd, &byte, 1) >= 0 ? 0 : 1;
  });
  ASSERT_OK(run);
  char tag[16];
  std::snprintf(tag, sizeof(tag), "gn%06x0", static_cast<unsigned>((*run)->pid()));
  const std::string stale = tag;
  const std::string ip = IpBinary();
  struct Cleanup {  // also when an assertion below fails: the run ends, its names go
    std::function<void()> run;
    ~Cleanup() { run(); }
  } cleanup{[&] {
    run->reset();
    (void)NetnsHosts::RemoveStaleRuns();
  }};
  ASSERT_OK(RunCommand({ip, "netns", "add", stale + "n0"}));
  ASSERT_OK(RunCommand({ip, "link", "add", "name", stale + "br", "type", "bridge"}));
  ASSERT_OK(
      RunCommand({ip, "link", "add", stale + "v0", "type", "veth", "peer", "name", stale + "h0"}));
  ASSERT_OK(RunCommand({ip, "link", "set", stale + "h0", "netns", stale + "n0"}));
  ASSERT_EQ(NamesWithPrefix(stale).size(), 3u);
  ASSERT_OK(NetnsHosts::RemoveStaleRuns());
  EXPECT_EQ(NamesWithPrefix(stale).size(), 3u) << "removed while its process lived";
  (*run)->RequestStop();
  ASSERT_OK((*run)->Wait(5s));
  ASSERT_OK(NetnsHosts::RemoveStaleRuns());
  EXPECT_TRUE(NamesWithPrefix(stale).empty());
}

}  // namespace
}  // namespace granary::testing

// Authentication on a real cache node's TCP port (docs/security.md; without
// it any local user read any dataset over the port). The node is
// configured with cluster_key_file; readers present no key, a wrong key, the
// right one, and both keys of a rotation. The handshake's byte-level cases
// (replayed proofs, requests before AUTH, old clients) are in
// tests/cachenode/server_test.cc; pods' tokens against a real API server in
// tests/integration/kubernetes/token_auth_test.cc.

#include <gmock/gmock.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "granary/peer/peer_auth.h"
#include "testing/cachenode_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

std::string KeyFile(const CacheCluster& cluster, const std::string& name,
                    const std::vector<std::string>& hex_keys, mode_t mode = 0600) {
  std::string text = "# test cluster key\n";
  for (const std::string& k : hex_keys) text += k + "\n";
  cluster.dir().WriteFile(name, text);
  const std::string path = cluster.dir().Join(name);
  EXPECT_EQ(::chmod(path.c_str(), mode), 0);
  return path;
}

std::string NewKey() {
  auto hex = GenerateClusterKeyHex();
  EXPECT_OK(hex);
  return hex.ok() ? *hex : std::string();
}

ClientCredentials CredentialsFrom(const std::string& path) {
  auto keys = ClusterKeys::Load(path);
  EXPECT_OK(keys);
  ClientCredentials c;
  if (keys.ok()) c.cluster_key = std::make_shared<const ClusterKeys>(std::move(*keys));
  return c;
}

// Every outcome OK with the source's bytes; or every one failed with `code`
// and `text`. Returns how many matched.
size_t CountExact(const std::vector<DatasetReader::Outcome>& got, const TestDataset& ds) {
  size_t exact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].status.ok() && got[i].bytes == ds.contents[i]) ++exact;
  }
  return exact;
}

void ExpectAllRefused(const std::vector<DatasetReader::Outcome>& got, const std::string& text) {
  for (const DatasetReader::Outcome& o : got) {
    ASSERT_EQ(o.status.code(), StatusCode::kPermissionDenied) << o.status.ToString();
    ASSERT_THAT(o.status.message(), HasSubstr(text));
    ASSERT_TRUE(o.bytes.empty());
  }
}

TEST(CacheNodeAuthTest, OnlyAHolderOfTheClusterKeyReadsOverTheTcpPort) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  const std::string key = KeyFile(**cluster, "cluster.key", {NewKey()});
  CacheNodeOptions node;
  node.extra_yaml = "cluster_key_file: " + key + "\n";
  ASSERT_OK((*cluster)->StartNodes(2, node));
  DatasetOptions o;
  o.name = "secret";
  o.files = 200;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));

  DatasetReader reader(&(*cluster)->store(), *ds);
  // No credential: nothing, and the reason says what to configure.
  ExpectAllRefused(reader.Read(ds->AllIds()), "requires authentication");
  // Another cluster's key.
  const std::string other = KeyFile(**cluster, "other.key", {NewKey()});
  reader.SetCredentials(CredentialsFrom(other));
  ExpectAllRefused(reader.Read(ds->AllIds()), "is not one of this node's");
  // The cluster's key: every byte.
  reader.SetCredentials(CredentialsFrom(key));
  EXPECT_EQ(CountExact(reader.Read(ds->AllIds()), *ds), ds->contents.size());

  // Counted by the nodes (metrics lag by up to 500 ms): the reader's one
  // connection per node it read from granted, the wrong key refused (a client
  // with no credential gives up before AUTH: the node sees it only close).
  auto total = [&](const char* name) {
    double sum = 0;
    for (size_t i = 0; i < (*cluster)->node_count(); ++i) {
      Result<double> v = (*cluster)->node(i).MetricValue(name);
      if (v.ok()) sum += *v;
    }
    return sum;
  };
  EXPECT_TRUE(WaitFor([&] {
    return total("granary_cachenode_auth_granted_total") >= 1 &&
           total("granary_cachenode_auth_refused_total") >= 1;
  })) << "granted "
      << total("granary_cachenode_auth_granted_total") << ", refused "
      << total("granary_cachenode_auth_refused_total");
  EXPECT_LE(total("granary_cachenode_auth_granted_total"), 2);
}

// The documented configuration, examples/cachenode.yaml, run here: its
// settings as they are, except what names this host's paths and addresses
// (written by the fixture) and what needs a Kubernetes API server or a
// certificate. Without its key lines the node refuses to start, saying what
// to do; with its key a reader without the key (any local user: the key file
// is root's, mode 0600) gets no byte of a root-only dataset over TCP.
TEST(CacheNodeAuthTest, TheExampleConfigurationServesNoReaderWithoutTheKey) {
  const std::string example = ReadAll(std::string(GRANARY_SOURCE_DIR) + "/examples/cachenode.yaml");
  ASSERT_FALSE(example.empty());
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  // Keys the fixture writes for this host, and those that need what a test
  // host lacks (the API server, certificates), or that it adapts.
  const std::set<std::string> adapted = {"node_id",
                                         "pool",
                                         "listen",
                                         "advertise",
                                         "data_dir",
                                         "capacity",
                                         "metadata_store",
                                         "source_concurrency",
                                         "worker_threads",
                                         "service_threads",
                                         "max_connections",
                                         "metrics_listen",
                                         "heartbeat_interval",
                                         "heartbeat_ttl",
                                         "drain_timeout",
                                         "log_level",
                                         "tls_cert_file",
                                         "tls_key_file",
                                         "kubernetes_auth",
                                         "kubernetes_audience",
                                         "cluster_key_file",
                                         "local_socket"};
  std::string settings;
  std::set<std::string> seen;
  std::istringstream lines(example);
  for (std::string line; std::getline(lines, line);) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.empty() || line[0] == ' ') continue;
    const std::string key = line.substr(0, colon);
    seen.insert(key);
    if (adapted.count(key) == 0) settings += line + "\n";
  }
  for (const char* key : {"cluster_key_file", "kubernetes_auth", "max_connections_per_address",
                          "max_unauthenticated_per_address", "verify_reads"}) {
    EXPECT_EQ(seen.count(key), 1u) << "examples/cachenode.yaml no longer shows " << key;
  }
  settings += "local_socket: " + (*cluster)->dir().Join("node.sock") + "\n";

  CacheNodeOptions without_key;
  without_key.extra_yaml = settings;
  without_key.opt_out_of_authentication = false;
  CacheNode& refused = (*cluster)->AddNode(without_key);
  ASSERT_OK(refused.Start());
  auto exit = refused.WaitExit(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString() << "\n" << refused.Log();
  EXPECT_THAT(refused.Log(), HasSubstr("granary cluster-key generate"));

  const std::string key = KeyFile(**cluster, "cluster.key", {NewKey()});
  CacheNodeOptions with_key;
  with_key.extra_yaml = settings + "cluster_key_file: " + key + "\n";
  with_key.opt_out_of_authentication = false;
  ASSERT_OK((*cluster)->StartNodes(1, with_key));
  DatasetOptions o;
  o.name = "roots";
  o.files = 40;
  o.owner = DatasetOwner{0, 0};
  o.before_snapshot = [](const std::string& root) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      ::chmod(e.path().c_str(), e.is_directory() ? 0700 : 0600);
    }
    ::chmod(root.c_str(), 0700);
  };
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  DatasetReader reader(&(*cluster)->store(), *ds);
  ExpectAllRefused(reader.Read(ds->AllIds()), "requires authentication");
  reader.SetCredentials(CredentialsFrom(key));
  EXPECT_EQ(CountExact(reader.Read(ds->AllIds()), *ds), ds->contents.size());
}

TEST(CacheNodeAuthTest, ARotationAcceptsBothKeysThenOnlyTheNewOne) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  const std::string old_key = NewKey(), new_key = NewKey();
  const std::string old_file = KeyFile(**cluster, "old.key", {old_key});
  const std::string new_file = KeyFile(**cluster, "new.key", {new_key});
  // Step 1 of docs/security.md: the node takes the new key beside the old one.
  const std::string both = KeyFile(**cluster, "node.key", {new_key, old_key});
  CacheNodeOptions node;
  node.extra_yaml = "cluster_key_file: " + both + "\n";
  ASSERT_OK((*cluster)->StartNodes(1, node));
  DatasetOptions o;
  o.files = 50;
  auto ds = (*cluster)->CreateDataset(o);
  ASSERT_OK(ds);
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 60s));
  for (const std::string& file : {old_file, new_file}) {
    DatasetReader reader(&(*cluster)->store(), *ds);
    reader.SetCredentials(CredentialsFrom(file));
    EXPECT_EQ(CountExact(reader.Read(ds->AllIds()), *ds), ds->contents.size()) << file;
  }
  // Last step: the old key removed and the node restarted; its holders are out.
  KeyFile(**cluster, "node.key", {new_key});
  CacheNode& n = (*cluster)->node(0);
  ASSERT_OK(n.Terminate().status());
  ASSERT_OK(n.StartAndWaitReady());
  DatasetReader stale(&(*cluster)->store(), *ds);
  stale.SetCredentials(CredentialsFrom(old_file));
  ExpectAllRefused(stale.Read({0, 1}), "is not one of this node's");
  DatasetReader fresh(&(*cluster)->store(), *ds);
  fresh.SetCredentials(CredentialsFrom(new_file));
  EXPECT_EQ(CountExact(fresh.Read(ds->AllIds()), *ds), ds->contents.size());
}

TEST(CacheNodeAuthTest, AKeyFileOthersMayReadStopsTheNodeAtStartSayingWhy) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  const std::string key = KeyFile(**cluster, "loose.key", {NewKey()}, 0644);
  CacheNodeOptions options;
  options.extra_yaml = "cluster_key_file: " + key + "\n";
  CacheNode& node = (*cluster)->AddNode(options);
  Status started = node.StartAndWaitReady(20s);
  ASSERT_FALSE(started.ok());
  const std::string log = ReadAll(node.log_path());
  EXPECT_THAT(log, HasSubstr("cluster_key_file"));
  EXPECT_THAT(log, HasSubstr("chmod 600 " + key));
}

}  // namespace
}  // namespace granary::testing

// Integration tests of granary-cachenode's start-up and shutdown:
// configuration errors (exit 2 with the file, line and a suggestion), run-time
// start-up failures (exit 1: metadata store unreachable, data dir locked by
// another node), and SIGTERM (exit 0 within the drain timeout, deregistered at
// once rather than after the heartbeat TTL). Real processes, real Redis.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Result<std::unique_ptr<DaemonProcess>> RunCacheNode(const TempDir& dir,
                                                    std::vector<std::string> args) {
  DaemonProcessOptions o;
  o.binary = CacheNodeBinary();
  o.args = std::move(args);
  o.log_path = dir.Join("cachenode.log");
  o.name = "granary-cachenode";
  return DaemonProcess::Start(std::move(o));
}

// The 1-based line of the first line of `text` that starts with `prefix`.
int LineOf(const std::string& text, const std::string& prefix) {
  int line = 1;
  size_t at = 0;
  while (at < text.size()) {
    if (text.compare(at, prefix.size(), prefix) == 0) return line;
    at = text.find('\n', at);
    if (at == std::string::npos) break;
    ++at;
    ++line;
  }
  return -1;
}

TEST(CacheNodeStartupTest, MissingConfigFileAndBadCommandLinesExitTwo) {
  TempDir dir;
  const std::string missing = dir.Join("no-such.yaml");
  auto p = RunCacheNode(dir, {"--config", missing});
  ASSERT_OK(p);
  auto exit = (*p)->Wait(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString();
  EXPECT_THAT((*p)->ReadLog(), HasSubstr(missing));

  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{}, {"--config"}, {"--bogus-flag"}}) {
    auto q = RunCacheNode(dir, args);
    ASSERT_OK(q);
    auto code = (*q)->Wait(30s);
    ASSERT_OK(code);
    EXPECT_TRUE(code->ExitedWith(2)) << code->ToString() << " for " << args.size() << " args";
  }
}

TEST(CacheNodeStartupTest, UnknownKeyAndBadValuesExitTwoNamingTheLine) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions o;
  o.extra_yaml = "capacty: 1GiB\n";
  CacheNode& node = (*cluster)->AddNode(o);
  const std::string yaml = node.ConfigYaml();
  const int line = LineOf(yaml, "capacty:");
  ASSERT_GT(line, 1);
  ASSERT_OK(node.Start());
  auto exit = node.WaitExit(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString();
  EXPECT_THAT(node.Log(), HasSubstr(node.config_path() + ":" + std::to_string(line) +
                                    ": unknown key 'capacty' (did you mean 'capacity'?)"));

  // --check says the same without starting anything.
  auto checked = RunCacheNode((*cluster)->dir(), {"--config", node.config_path(), "--check"});
  ASSERT_OK(checked);
  auto check_exit = (*checked)->Wait(30s);
  ASSERT_OK(check_exit);
  EXPECT_TRUE(check_exit->ExitedWith(2)) << check_exit->ToString();
  EXPECT_THAT((*checked)->ReadLog(), HasSubstr("did you mean 'capacity'?"));

  // A value out of range.
  node.mutable_options().extra_yaml.clear();
  node.mutable_options().worker_threads = 0;
  const int threads_line = LineOf(node.ConfigYaml(), "worker_threads:");
  ASSERT_OK(node.Start());
  exit = node.WaitExit(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString();
  EXPECT_THAT(node.Log(), HasSubstr(node.config_path() + ":" + std::to_string(threads_line) +
                                    ": key 'worker_threads'"));

  // A good file passes --check (exit 0) and nothing is started.
  node.mutable_options().worker_threads = 2;
  ASSERT_OK(node.Start({"--check"}));
  exit = node.WaitExit(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << exit->ToString() << "\n" << node.Log();
  auto nodes = (*cluster)->store().ListNodes("");
  ASSERT_OK(nodes);
  EXPECT_TRUE(nodes->empty()) << "--check registered a node";
}

// Secure by default: a node with neither a cluster key nor Kubernetes
// authentication refuses to start (exit 2, --check too) and says how to make a
// key; serve_without_authentication lets it serve on loopback only; a listen
// address beyond loopback needs the second, unsafe option as well.
TEST(CacheNodeStartupTest, WithoutAuthenticationItRefusesToStartUnlessToldToOnLoopback) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions o;
  o.opt_out_of_authentication = false;
  CacheNode& node = (*cluster)->AddNode(o);
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{}, {"--check"}}) {
    ASSERT_OK(node.Start(extra));
    auto exit = node.WaitExit(30s);
    ASSERT_OK(exit);
    EXPECT_TRUE(exit->ExitedWith(2)) << exit->ToString() << "\n" << node.Log();
    EXPECT_THAT(node.Log(), HasSubstr("no authentication"));
    EXPECT_THAT(node.Log(), HasSubstr("granary cluster-key generate"));
    EXPECT_THAT(node.Log(), HasSubstr("cluster_key_file"));
    EXPECT_THAT(node.Log(), HasSubstr("kubernetes_auth"));
    EXPECT_THAT(node.Log(), HasSubstr("serve_without_authentication: true"));
  }
  auto nodes = (*cluster)->store().ListNodes("");
  ASSERT_OK(nodes);
  EXPECT_TRUE(nodes->empty()) << "a node without authentication registered";

  // The opt-out on a wildcard address: refused, naming the unsafe option.
  const std::string port = std::to_string(FreeTcpPort());
  node.mutable_options().extra_yaml = "serve_without_authentication: true\n";
  std::string yaml = node.ConfigYaml();
  yaml.replace(yaml.find("listen: 127.0.0.1:"), std::string("listen: ").size() + 1,
               "listen: 0.0.0.0:" + port + "\n#");
  WriteAll(node.config_path(), yaml);
  auto refused = RunCacheNode((*cluster)->dir(), {"--config", node.config_path()});
  ASSERT_OK(refused);
  auto refused_exit = (*refused)->Wait(30s);
  ASSERT_OK(refused_exit);
  EXPECT_TRUE(refused_exit->ExitedWith(2)) << refused_exit->ToString();
  EXPECT_THAT((*refused)->ReadLog(), HasSubstr("0.0.0.0:" + port + ", which is not loopback"));
  EXPECT_THAT((*refused)->ReadLog(),
              HasSubstr("unsafe_serve_without_authentication_beyond_loopback: true"));

  // The opt-out on loopback: it serves, and warns that it does so.
  ASSERT_OK(node.StartAndWaitReady(30s));
  EXPECT_THAT(node.Log(), HasSubstr("requires no authentication"));
  Result<PeerClient> reader = node.Connect(5s);
  ASSERT_OK(reader);
  ASSERT_OK(node.Terminate().status());
}

TEST(CacheNodeStartupTest, UnreachableMetadataStoreExitsOneNamingTheUrl) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions o;
  const std::string url = "redis://127.0.0.1:" + std::to_string(FreeTcpPort()) + "/0";
  o.metadata_store = url;
  o.extra_yaml = "startup_timeout: 1s\n";
  CacheNode& node = (*cluster)->AddNode(o);
  ASSERT_OK(node.Start());
  const auto start = Clock::now();
  auto exit = node.WaitExit(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(1)) << exit->ToString();
  EXPECT_LT(Clock::now() - start, 20s) << "startup_timeout 1s was not honoured";
  EXPECT_THAT(node.Log(), HasSubstr(url.substr(0, url.size() - 2)));  // the host and port
}

TEST(CacheNodeStartupTest, SecondNodeOnTheSameDataDirExitsOneNamingTheHolder) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  ASSERT_OK((*cluster)->StartNodes(1));
  CacheNode& first = (*cluster)->node(0);
  CacheNodeOptions o;
  o.data_dir = first.data_dir();
  CacheNode& second = (*cluster)->AddNode(o);
  ASSERT_OK(second.Start());
  auto exit = second.WaitExit(30s);
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(1)) << exit->ToString();
  const std::string log = second.Log();
  EXPECT_THAT(log, HasSubstr(first.data_dir()));
  EXPECT_THAT(log, HasSubstr(std::to_string(first.process()->pid())))
      << "the message does not name the process holding the lock";
  // The first one is unharmed, and the second never registered.
  EXPECT_TRUE(first.Running());
  EXPECT_OK(first.WaitReady(10s));
  auto nodes = (*cluster)->store().ListNodes("default");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].id, first.id());
}

TEST(CacheNodeStartupTest, SigtermMidStagingExitsZeroInTimeAndDeregistersAtOnce) {
  auto cluster = CacheCluster::Create();
  ASSERT_OK(cluster);
  CacheNodeOptions o;
  o.heartbeat_ttl = "20s";  // so that only RemoveNode can make it vanish at once
  o.drain_timeout = "3s";
  o.source_concurrency = 1;
  ASSERT_OK((*cluster)->StartNodes(2, o));
  DatasetOptions d;
  d.name = "sigterm";
  d.files = 2000;
  d.chunk_size = 16 * 1024;
  auto ds = (*cluster)->CreateDataset(d);
  ASSERT_OK(ds);
  MetadataStore& store = (*cluster)->store();
  CacheNode& leaving = (*cluster)->node(1);
  ASSERT_TRUE(WaitFor(
      [&] {
        auto p = store.ListProgress(ds->name);
        return p.ok() && p->contains(leaving.id()) && p->at(leaving.id()).chunks_staged > 0;
      },
      30s))
      << (*cluster)->Describe(ds->name);

  const auto start = Clock::now();
  auto exit = leaving.Terminate(30s);
  const auto took = Clock::now() - start;
  ASSERT_OK(exit);
  EXPECT_TRUE(exit->ExitedWith(0)) << exit->ToString();
  EXPECT_LT(took, 3s + 1s) << "took "
                           << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                           << " ms with drain_timeout 3s";
  auto nodes = store.ListNodes("default");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 1u) << "the stopped node is still listed: it did not deregister";
  EXPECT_EQ((*nodes)[0].id, (*cluster)->node(0).id());
  EXPECT_THAT(leaving.Log(), HasSubstr("SIGTERM"));

  // The remaining node takes over and completes the dataset.
  ASSERT_OK((*cluster)->WaitForPhase(ds->name, DatasetPhase::kReady, 90s));
  auto progress = store.ListProgress(ds->name);
  ASSERT_OK(progress);
  const StagingProgress& p = progress->at((*cluster)->node(0).id());
  EXPECT_EQ(p.chunks_total, ds->manifest->chunk_count());
  EXPECT_EQ(p.chunks_staged, p.chunks_total);
}

}  // namespace
}  // namespace granary::testing

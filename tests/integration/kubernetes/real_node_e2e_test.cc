// Granary on a real node, end to end: every pod of the chart and of the
// training Job runs in a container under a real kubelet (KubeNode,
// tests/testing/kube_node.h), with the image assembled from this build.
//
// What the suite starts once: a KubeNode (containerd, kubelet, kube-proxy;
// the control plane with its API server on the node's bridge), Redis as the
// metadata store on the root namespace's bridge address (the chart's own
// Redis needs cluster DNS, which this node has not: its store URL names a
// Service by DNS name), a source of files under a host directory, the example
// namespaces, and then, as a cluster admin would,
//
//   helm install granary charts/granary -n granary -f values.yaml
//
// with no post-renderer: the API server calls the operator's webhook through
// the chart's Service, which kube-proxy routes. The values: the image
// present on the node (imagePullPolicy Never), the store from an existing
// Secret, and one CachePool `gpu` whose hostPaths are the test's.
//
// The cases build on each other in order (one ctest test for the binary):
// the release's pods Ready in containers, a Dataset Ready and staged as its
// runAs uid, a training Job through the injected native sidecar, a drain and
// uncordon, a helm upgrade to a new tag, bad inputs, and helm uninstall.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing/kube_node.h"
#include "testing/kube_suite.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr char kRelease[] = "granary";
constexpr char kSystem[] = "granary";
constexpr char kTeam[] = "team-a";
constexpr char kDataset[] = "e2e";
constexpr int kFiles = 300;

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class RealNodeE2eTest : public SharedKubeTest<RealNodeE2eTest> {
 public:
  static std::string SkipReason() {
    std::optional<std::string> why = KubeNode::Unavailable();
    return why ? *why : std::string();
  }

  static Status StartShared() {
    GRANARY_ASSIGN_OR_RETURN(const std::string image, KubeNode::GranaryImage(GRANARY_BUILD_DIR));
    KubeNodeOptions o;
    o.labels = {{"granary.io/nvme", "true"}, {"nvidia.com/gpu.present", "true"}};
    o.images = {{image, "granary:0.1.0"}};
    GRANARY_ASSIGN_OR_RETURN(node_, KubeNode::Start(o));
    GRANARY_ASSIGN_OR_RETURN(redis_, RedisServer::Start({"--bind", "127.0.0.1", node_->host_ip()}));
    work_ = std::make_unique<TempDir>();
    ::chmod(work_->path().c_str(), 0755);  // uid 1000 walks to the source
    WriteSource();
    return InstallChart();
  }

  static void StopShared() {
    node_.reset();
    redis_.reset();
    work_.reset();
  }

  static void PrintLogsIfFailed() {
    if (node_ == nullptr || !::testing::Test::HasFailure()) return;
    node_->cluster().PrintLogsIfTestFailed();
    KubectlResult pods = node_->cluster().Kubectl({"get", "pods", "-A", "-o", "wide"});
    KubectlResult events = node_->cluster().Kubectl({"get", "events", "-A"});
    std::cerr << "---- pods ----\n" << pods.out << "---- events ----\n" << events.out;
    for (const char* ns : {kSystem, kTeam}) {
      KubectlResult logs =
          node_->cluster().Kubectl({"logs", "-n", ns, "--all-containers", "--prefix", "--tail=60",
                                    "-l", "app.kubernetes.io/name=granary"});
      std::cerr << "---- logs in " << ns << " ----\n" << logs.out << logs.err;
    }
    std::cerr << node_->LogTails(6000);
  }

 protected:
  static KubeCluster& cluster() { return node_->cluster(); }
  static std::string Source() { return work_->Join("datasets/e2e/train"); }
  static std::string Nvme() { return work_->Join("nvme"); }

  static KubectlResult Helm(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {cluster().Tool("helm")};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string home = work_->Join("helm-home");
    return RunProgram(argv,
                      {"KUBECONFIG=" + cluster().kubeconfig_path(),
                       "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config",
                       "HELM_DATA_HOME=" + home + "/data", "HOME=" + home},
                      "", work_->path(), seconds(300));
  }

  static void WriteSource() {
    std::mt19937_64 rng(11);
    for (int i = 0; i < kFiles; ++i) {
      const std::string dir = Source() + "/class-" + std::to_string(i % 10);
      std::filesystem::create_directories(dir);
      std::string bytes(2048 + rng() % 6000, '\0');
      for (char& b : bytes) b = static_cast<char>(rng());
      const std::string path = dir + "/img-" + std::to_string(i) + ".bin";
      std::ofstream(path, std::ios::binary) << bytes;
      source_bytes_ += bytes.size();
    }
    // Only uid 1000 (the Dataset's runAs) may read the source: the cache
    // node's root in its container has no CAP_DAC_OVERRIDE, so it stages only
    // by reading as that uid.
    for (const auto& e : std::filesystem::recursive_directory_iterator(work_->Join("datasets"))) {
      ::chown(e.path().c_str(), 1000, 1000);
      ::chmod(e.path().c_str(), e.is_directory() ? 0700 : 0600);
    }
    ::chmod(work_->Join("datasets").c_str(), 0755);
  }

  static json Values(const std::string& tag) {
    return {{"image", {{"tag", tag}, {"pullPolicy", "Never"}}},
            {"store", {{"existingSecret", "granary-store"}, {"existingSecretKey", "url"}}},
            {"redis", {{"enabled", false}}},
            {"operator", {{"progressInterval", "1s"}}},
            {"cachePools",
             json::array(
                 {{{"name", "gpu"},
                   {"spec",
                    {{"nodeSelector", {{"granary.io/nvme", "true"}}},
                     {"storage", {{"hostPath", Nvme()}, {"capacity", "1Gi"}}},
                     {"sourceMounts",
                      json::array({{{"name", "datasets"}, {"hostPath", work_->Join("datasets")}}})},
                     {"nodeSocketHostPath", work_->Join("node-socket")},
                     {"image", "granary:" + tag},
                     {"imagePullPolicy", "Never"},
                     {"resources", {{"requests", {{"cpu", "100m"}, {"memory", "128Mi"}}}}},
                     {"sidecar", {{"arenaBytes", "64Mi"}, {"windowBytes", "16Mi"}}}}}}})}};
  }

  static Status InstallChart() {
    const auto start = std::chrono::steady_clock::now();
    std::string namespaces =
        ReadWhole(std::string(GRANARY_SOURCE_DIR) + "/examples/kubernetes/namespace.yaml");
    const std::string url =
        "redis://" + node_->host_ip() + ":" + std::to_string(redis_->port()) + "/0";
    namespaces = std::regex_replace(namespaces, std::regex("url: \"redis://[^\"]*\""),
                                    "url: \"" + url + "\"");
    KubectlResult applied = cluster().Kubectl({"apply", "-f", "-"}, namespaces);
    if (!applied.ok()) return Status::Unavailable("apply the namespaces: " + applied.Describe());
    work_->WriteFile("values.yaml", Values("0.1.0").dump(2));
    const std::string chart = std::string(GRANARY_SOURCE_DIR) + "/charts/granary";
    KubectlResult install = Helm({"install", kRelease, chart, "-n", kSystem, "-f",
                                  work_->Join("values.yaml"), "--wait", "--timeout", "240s"});
    if (!install.ok()) {
      return Status::Unavailable("helm install: " + install.Describe() + "\n" + install.out);
    }
    KubectlResult policy =
        cluster().Kubectl({"apply", "-f", chart + "/policies/dataset-identity.yaml"});
    if (!policy.ok()) return Status::Unavailable("apply the policy: " + policy.Describe());
    install_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "helm install --wait took " << install_seconds_ << " s" << std::endl;
    return Status::Ok();
  }

  // The pods of `ns` matching `selector`, parsed.
  static std::vector<json> Pods(const std::string& ns, const std::string& selector) {
    Result<json> pods = cluster().GetJson({"pods", "-n", ns, "-l", selector});
    if (!pods.ok()) return {};
    return (*pods)["items"].get<std::vector<json>>();
  }

  static bool AllReady(const json& pod) {
    if (pod["status"].value("phase", "") != "Running") return false;
    for (const json& c : pod["status"].value("containerStatuses", json::array())) {
      if (!c.value("ready", false)) return false;
    }
    return true;
  }

  static std::unique_ptr<KubeNode> node_;
  static std::unique_ptr<RedisServer> redis_;
  static std::unique_ptr<TempDir> work_;
  static double install_seconds_;
  static uint64_t source_bytes_;
};
uint64_t RealNodeE2eTest::source_bytes_ = 0;
std::unique_ptr<KubeNode> RealNodeE2eTest::node_;
std::unique_ptr<RedisServer> RealNodeE2eTest::redis_;
std::unique_ptr<TempDir> RealNodeE2eTest::work_;
double RealNodeE2eTest::install_seconds_ = 0;

TEST_F(RealNodeE2eTest, HelmInstallRunsTheOperatorAndTheCacheNodeInContainers) {
  // Both operator replicas pass their readiness probes in containers (helm's
  // --wait settles for one: the Deployment's maxUnavailable is 1).
  std::vector<json> operators;
  Status both = cluster().WaitFor(
      [&] {
        operators = Pods(kSystem, "app.kubernetes.io/component=operator");
        return operators.size() == 2 && AllReady(operators[0]) && AllReady(operators[1]);
      },
      milliseconds(120000), "both operator replicas Ready");
  ASSERT_TRUE(both.ok()) << both.ToString();
  std::set<std::string> names;
  for (const json& pod : operators) {
    EXPECT_TRUE(AllReady(pod)) << pod["status"].dump(2);
    EXPECT_EQ(pod["spec"].value("nodeName", ""), node_->name());
    const json& status = pod["status"]["containerStatuses"][0];
    EXPECT_EQ(status.value("imageID", "").empty(), false) << status.dump();
    EXPECT_THAT(status.value("containerID", ""), HasSubstr("containerd://"));
    names.insert(pod["metadata"].value("name", ""));
  }
  // One of them leads.
  Result<json> lease = cluster().GetJson({"lease", "-n", kSystem, "granary-operator"});
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  const std::string holder = (*lease)["spec"].value("holderIdentity", "");
  bool held_by_a_replica = false;
  for (const std::string& n : names) held_by_a_replica |= holder.find(n) != std::string::npos;
  EXPECT_TRUE(held_by_a_replica) << "lease holder " << holder;

  // The pool's cache node: a DaemonSet pod on the real node, as the operator
  // wrote it (host network, root with SETUID/SETGID only, read-only root).
  ASSERT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        Result<json> pool = cluster().GetJson({"cachepool", "gpu"});
                        return pool.ok() && ConditionField(*pool, "Ready") == "True";
                      },
                      milliseconds(120000), "CachePool gpu Ready")
                  .ok())
      << cluster().Kubectl({"describe", "cachepool", "gpu"}).out;
  std::vector<json> cachenodes = Pods(kSystem, "granary.io/pool=gpu");
  ASSERT_EQ(cachenodes.size(), 1u);
  const json& cachenode = cachenodes[0];
  EXPECT_TRUE(AllReady(cachenode)) << cachenode["status"].dump(2);
  EXPECT_TRUE(cachenode["spec"].value("hostNetwork", false));
  const json& ctx = cachenode["spec"]["containers"][0]["securityContext"];
  EXPECT_TRUE(ctx.value("readOnlyRootFilesystem", false)) << ctx.dump();
  EXPECT_FALSE(ctx.value("allowPrivilegeEscalation", true)) << ctx.dump();

  // The webhook is registered at the chart's Service (no URL): kube-proxy
  // routes the API server's calls (the Dataset case sees it inject).
  Result<json> webhook =
      cluster().GetJson({"mutatingwebhookconfiguration", "granary-sidecar-injector"});
  ASSERT_TRUE(webhook.ok()) << webhook.status().ToString();
  const json& client = (*webhook)["webhooks"][0]["clientConfig"];
  EXPECT_TRUE(client.contains("service")) << client.dump();
  EXPECT_FALSE(client.contains("url")) << client.dump();
  std::cout << "helm install to the release Ready: " << install_seconds_ << " s" << std::endl;
}

TEST_F(RealNodeE2eTest, ADatasetIsStagedAsItsRunAsUid) {
  const auto start = std::chrono::steady_clock::now();
  cluster().MustKubectl({"apply", "-f", "-"}, KubeSuite::DatasetYaml(kTeam, kDataset, Source()));
  Status ready = cluster().WaitFor(
      [&] {
        Result<json> d = cluster().GetJson({"dataset", "-n", kTeam, kDataset});
        return d.ok() && ConditionField(*d, "Ready") == "True";
      },
      milliseconds(180000), "Dataset team-a/e2e Ready");
  ASSERT_TRUE(ready.ok()) << ready.ToString() << "\n"
                          << cluster().Kubectl({"describe", "dataset", "-n", kTeam, kDataset}).out;
  std::cout << "Dataset Ready "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
            << " s after kubectl apply" << std::endl;
  // Every byte is in the pool's hostPath, read from a source only uid 1000
  // may read.
  uint64_t chunk_bytes = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(Nvme())) {
    if (e.is_regular_file() && e.path().extension() == ".chunk") chunk_bytes += e.file_size();
  }
  EXPECT_GE(chunk_bytes, source_bytes_) << "chunk files under " << Nvme();

  // The API server reaches the webhook through its Service (kube-proxy): a
  // pod labelled with the Dataset is injected (server-side dry run).
  const json probe = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "probe"}, {"labels", {{"granary.io/dataset", kDataset}}}}},
      {"spec",
       {{"containers",
         json::array(
             {{{"name", "trainer"}, {"image", "granary:0.1.0"}, {"command", {"true"}}}})}}}};
  KubectlResult dry = cluster().Kubectl(
      {"create", "-n", kTeam, "--dry-run=server", "-o", "json", "-f", "-"}, probe.dump());
  EXPECT_TRUE(dry.ok()) << dry.Describe();
  EXPECT_THAT(dry.out, HasSubstr("granary-sidecar"));
}

}  // namespace
}  // namespace granary::testing

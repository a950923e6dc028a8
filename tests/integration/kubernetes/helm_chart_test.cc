// The Helm chart (charts/granary) with the real helm against the real control
// plane: lint and template, values.schema.json refusing bad values
// with the field named, then `helm install` from the working tree, whose
// operator Deployment PodRunner runs for real (the pod's in-cluster service
// account: the chart's RBAC is what the operator gets), a CachePool from
// values and a Dataset reaching Ready on the test's Redis, `helm upgrade` with
// changed values rolling the operator without losing the Dataset, and
// `helm uninstall` leaving exactly what docs/install.md says stays.
//
// The cluster has two GPU nodes: gpu-node-1 (granary.io/nvme, the pool's one
// cache node) and gpu-node-2. PodRunner runs the pods of gpu-node-1 only: two
// operator processes on this one host would want the same ports. The test's
// values make the operator's anti-affinity required (the chart's default is
// preferred), so the two replicas are on different nodes at every moment and
// one of them, on gpu-node-1, is a real process; the other is kwok's. The
// chart's default rollout (one replica at a time, no surge) is what lets the
// upgrade proceed under that rule on two nodes.
//
// One cluster for the binary, run as one ctest test: the cases build on each
// other in order (install, upgrade, uninstall).

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "testing/cachenode_fixture.h"
#include "testing/kube_cluster.h"
#include "testing/kube_suite.h"
#include "testing/pod_runner.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr char kRelease[] = "granary";
constexpr char kNamespace[] = "granary";  // the release's, from examples/kubernetes/namespace.yaml
constexpr char kTeam[] = "team-a";
constexpr char kDataset[] = "chart-ds";
// <release>-granary would be granary-granary: the release name contains the chart's.
constexpr char kOperator[] = "granary-operator";
constexpr char kWebhookService[] = "granary-webhook";
constexpr char kWebhookConfiguration[] = "granary-sidecar-injector";

std::string ChartDir() { return std::string(GRANARY_SOURCE_DIR) + "/charts/granary"; }

class HelmChartTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::string> tools = KubeCluster::ToolsDir();
    if (!tools.ok()) {
      skip_reason_ = new std::string(tools.status().ToString());
      return;
    }
    dir_ = new TempDir();
    ::chmod(dir_->path().c_str(), 0755);  // uid 1000 (the Dataset's runAs) walks to the source
    KubeClusterOptions o;
    o.nodes = {
        {"gpu-node-1",
         {{"nvidia.com/gpu.present", "true"},
          {"granary.io/nvme", "true"},
          {"kubernetes.io/hostname", "gpu-node-1"}}},
        {"gpu-node-2",
         {{"nvidia.com/gpu.present", "true"}, {"kubernetes.io/hostname", "gpu-node-2"}}},
    };
    Result<std::unique_ptr<KubeCluster>> cluster = KubeCluster::Start(o);
    if (!cluster.ok()) {
      setup_error_ = new std::string("starting the cluster: " + cluster.status().ToString());
      return;
    }
    cluster_ = cluster->release();
    Result<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
    if (!redis.ok()) {
      setup_error_ = new std::string("starting Redis: " + redis.status().ToString());
      return;
    }
    redis_ = redis->release();
    PodRunnerOptions ro;
    ro.images = {{"granary", GRANARY_POD_BIN_DIR}};
    ro.nodes = {"gpu-node-1"};
    runner_ = new PodRunner(*cluster_, ro);
    if (Status s = runner_->Start(); !s.ok()) {
      if (s.code() == StatusCode::kFailedPrecondition) {
        skip_reason_ = new std::string(s.ToString());
      } else {
        setup_error_ = new std::string("starting PodRunner: " + s.ToString());
      }
      return;
    }
    metrics_port_ = FreeTcpPort();
    WriteValues();
    WriteSource();
  }

  static void TearDownTestSuite() {
    if (cluster_ != nullptr) cluster_->PrintLogsIfTestFailed();
    // The runner first (the operator and the cache node), then the store and the cluster.
    delete runner_;
    delete redis_;
    delete cluster_;
    delete dir_;
    runner_ = nullptr;
    redis_ = nullptr;
    cluster_ = nullptr;
    dir_ = nullptr;
  }

  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
  }

  void TearDown() override {
    if (HasFailure() && runner_ != nullptr) runner_->PrintLogsIfTestFailed();
  }

  // The test's values: the store Secret of namespace.yaml (the test's Redis),
  // the pool with this host's paths and free ports, the operator's ports free
  // and its anti-affinity required (above).
  static void WriteValues() {
    const std::string nvme = dir_->Join("nvme");
    const std::string sockets = dir_->Join("node-socket");
    std::filesystem::create_directories(datasets());
    std::filesystem::create_directories(sockets);
    ::chmod(datasets().c_str(), 0755);
    ::chmod(sockets.c_str(), 0755);
    json values = {
        {"store", {{"existingSecret", "granary-store"}, {"existingSecretKey", "url"}}},
        // The chart's Redis (a StatefulSet PodRunner does not run) is off: the
        // store is the test's, through store.existingSecret.
        {"redis", {{"enabled", false}}},
        {"operator",
         {{"metricsPort", metrics_port_},
          {"webhook", {{"port", FreeTcpPort()}}},
          {"progressInterval", "300ms"},
          {"leaderElection",
           {{"leaseDuration", "4s"}, {"renewDeadline", "3s"}, {"retryPeriod", "500ms"}}},
          {"affinity",
           {{"podAntiAffinity",
             {{"requiredDuringSchedulingIgnoredDuringExecution",
               json::array({{{"topologyKey", "kubernetes.io/hostname"},
                             {"labelSelector",
                              {{"matchLabels",
                                {{"app.kubernetes.io/name", "granary"},
                                 {"app.kubernetes.io/component", "operator"}}}}}}})}}}}}}},
        {"cachePools",
         json::array(
             {{{"name", "gpu"},
               {"spec",
                {{"nodeSelector", {{"granary.io/nvme", "true"}}},
                 {"storage", {{"hostPath", nvme}, {"capacity", "1Gi"}}},
                 {"sourceMounts", json::array({{{"name", "datasets"}, {"hostPath", datasets()}}})},
                 {"nodeSocketHostPath", sockets},
                 {"ports", {{"data", FreeTcpPort()}, {"metrics", FreeTcpPort()}}},
                 {"sidecar", {{"metricsPort", FreeTcpPort()}}},
                 {"resources", {{"requests", {{"cpu", "100m"}, {"memory", "128Mi"}}}}}}}}})}};
    // helm reads YAML; JSON is YAML.
    dir_->WriteFile("values.yaml", values.dump(2));
  }

  static std::string datasets() { return dir_->Join("datasets"); }

  static void WriteSource() {
    const std::string top = datasets() + "/chart/train";
    for (int i = 0; i < 40; ++i) {
      const std::string path = top + "/class" + std::to_string(i % 4) + "/f" + std::to_string(i);
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      WriteAll(path,
               std::string(static_cast<size_t>(4096 + i * 97), static_cast<char>('a' + i % 26)));
      ::chmod(path.c_str(), 0644);
    }
    for (const auto& e : std::filesystem::recursive_directory_iterator(datasets())) {
      if (e.is_directory()) ::chmod(e.path().c_str(), 0755);
    }
  }

  // helm with the cluster's admin kubeconfig and its own home under dir_.
  static KubectlResult Helm(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {cluster_->Tool("helm")};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string home = dir_->Join("helm-home");
    return RunProgram(argv,
                      {"KUBECONFIG=" + cluster_->kubeconfig_path(),
                       "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config",
                       "HELM_DATA_HOME=" + home + "/data", "HOME=" + home},
                      "", dir_->path(), std::chrono::seconds(240));
  }

  static std::string MustHelm(const std::vector<std::string>& args) {
    KubectlResult r = Helm(args);
    if (!r.ok()) {
      std::string command = "helm";
      for (const std::string& a : args) command += " " + a;
      ADD_FAILURE() << command << ": " << r.Describe() << "\n" << r.out;
    }
    return r.out;
  }

  // The operator's pods (kubectl get pods -l component=operator).
  static json OperatorPods() {
    Result<json> pods =
        cluster_->GetJson({"pods", "-n", kNamespace, "-l", "app.kubernetes.io/component=operator"});
    return pods.ok() ? (*pods)["items"] : json::array();
  }

  // The operator pod bound to gpu-node-1 (the one PodRunner runs); "" if none.
  static std::string PodOnNodeOne() {
    for (const json& p : OperatorPods()) {
      if (p["spec"].value("nodeName", "") == "gpu-node-1" &&
          !p["metadata"].contains("deletionTimestamp")) {
        return p["metadata"].value("name", "");
      }
    }
    return "";
  }

  // Waits until the Deployment has rolled out: every replica updated, available.
  static Status WaitRolledOut(std::chrono::milliseconds timeout) {
    return cluster_->WaitFor(
        [] {
          Result<json> d = cluster_->GetJson({"deployment", "-n", kNamespace, kOperator});
          if (!d.ok()) return false;
          const json& st = (*d)["status"];
          const int want = (*d)["spec"].value("replicas", 0);
          return (*d)["metadata"].value("generation", 0) == st.value("observedGeneration", -1) &&
                 st.value("updatedReplicas", 0) == want &&
                 st.value("availableReplicas", 0) == want && st.value("replicas", 0) == want;
        },
        timeout, "deployment " + std::string(kOperator) + " rolled out");
  }

  // Waits until the real operator process on gpu-node-1 runs as pod `pod` and
  // answers /readyz with 200 (its informers listed, its webhook certificate
  // loaded), and holds the Lease.
  static Status WaitRealOperatorReady(const std::string& pod, std::chrono::milliseconds timeout) {
    Status running = runner_->WaitForRunning(PodRunner::Pod(kNamespace, pod), 1, timeout);
    if (!running.ok()) return running;
    const std::string address = "127.0.0.1:" + std::to_string(metrics_port_);
    Status ready = cluster_->WaitFor(
        [&] {
          Result<HttpResponse> r = HttpGet(address, "/readyz", seconds(2));
          return r.ok() && r->status == 200;
        },
        timeout, "the operator of pod " + pod + " answering /readyz 200 on " + address);
    if (!ready.ok()) return ready;
    return cluster_->WaitFor(
        [&] {
          Result<json> lease = cluster_->GetJson({"lease", "-n", kNamespace, "granary-operator"});
          return lease.ok() && (*lease)["spec"].value("holderIdentity", "") == pod;
        },
        timeout, "the Lease granary-operator held by " + pod);
  }

  // The operator of `pod` (run here) logged no call the API server refused
  // (HTTP 403, PermissionDenied): the chart's RBAC lets it do all it did.
  static void ExpectNoRefusedCalls(const std::string& pod) {
    bool found = false;
    for (const RunningContainer& c : runner_->Running()) {
      if (c.pod != pod) continue;
      found = true;
      const std::string log = ReadAll(c.log_path);
      EXPECT_THAT(log, ::testing::Not(HasSubstr("PermissionDenied")))
          << "the chart's RBAC refused a call of the operator:\n"
          << log;
    }
    EXPECT_TRUE(found) << "no operator process of pod " << pod << " runs";
  }

  static Result<json> Dataset() { return cluster_->GetJson({"dataset", "-n", kTeam, kDataset}); }

  static Status WaitDatasetReady(std::chrono::milliseconds timeout) {
    Status s = cluster_->WaitFor(
        [] {
          Result<json> d = Dataset();
          return d.ok() && ConditionField(*d, "Ready") == "True";
        },
        timeout, "Dataset team-a/chart-ds Ready");
    if (s.ok()) return s;
    return Status(
        s.code(),
        s.message() + "\n" + cluster_->Kubectl({"describe", "dataset", "-n", kTeam, kDataset}).out);
  }

  static std::string* skip_reason_;
  static std::string* setup_error_;
  static TempDir* dir_;
  static KubeCluster* cluster_;
  static RedisServer* redis_;
  static PodRunner* runner_;
  static uint16_t metrics_port_;
  static std::string* manifest_id_;  // the Dataset's, after install
};

std::string* HelmChartTest::skip_reason_ = nullptr;
std::string* HelmChartTest::setup_error_ = nullptr;
TempDir* HelmChartTest::dir_ = nullptr;
KubeCluster* HelmChartTest::cluster_ = nullptr;
RedisServer* HelmChartTest::redis_ = nullptr;
PodRunner* HelmChartTest::runner_ = nullptr;
uint16_t HelmChartTest::metrics_port_ = 0;
std::string* HelmChartTest::manifest_id_ = nullptr;

TEST_F(HelmChartTest, LintsAndRendersTheDefaultsAndTheTestValues) {
  KubectlResult lint = Helm({"lint", "--strict", ChartDir()});
  ASSERT_TRUE(lint.ok()) << lint.Describe() << "\n" << lint.out;
  lint = Helm({"lint", "--strict", ChartDir(), "-f", dir_->Join("values.yaml")});
  ASSERT_TRUE(lint.ok()) << lint.Describe() << "\n" << lint.out;

  KubectlResult defaults =
      Helm({"template", kRelease, ChartDir(), "-n", kNamespace, "--kube-version", "1.37.0"});
  ASSERT_TRUE(defaults.ok()) << defaults.Describe();
  // The defaults: the image the Dockerfile builds, 2 replicas, the webhook flags,
  // preferred anti-affinity, no CachePool.
  EXPECT_THAT(defaults.out, HasSubstr("image: \"granary:0.1.0\""));
  EXPECT_THAT(defaults.out, HasSubstr("replicas: 2"));
  EXPECT_THAT(defaults.out, HasSubstr("- --webhook-service=granary-webhook"));
  EXPECT_THAT(defaults.out, HasSubstr("- --webhook-service-port=443"));
  EXPECT_THAT(defaults.out, HasSubstr("- --namespace=granary"));
  EXPECT_THAT(defaults.out, HasSubstr("preferredDuringSchedulingIgnoredDuringExecution"));
  EXPECT_THAT(defaults.out, HasSubstr("readOnlyRootFilesystem: true"));
  EXPECT_THAT(defaults.out, HasSubstr("kind: PodDisruptionBudget"));
  EXPECT_THAT(defaults.out, ::testing::Not(HasSubstr("kind: CachePool")));
  // The operator registers the webhook itself: the chart has no configuration.
  EXPECT_THAT(defaults.out, ::testing::Not(HasSubstr("kind: MutatingWebhookConfiguration")));

  KubectlResult with_pool = Helm({"template", kRelease, ChartDir(), "-n", kNamespace,
                                  "--kube-version", "1.37.0", "-f", dir_->Join("values.yaml")});
  ASSERT_TRUE(with_pool.ok()) << with_pool.Describe();
  EXPECT_THAT(with_pool.out, HasSubstr("kind: CachePool"));
  // The pool's store defaults to store.existingSecret.
  EXPECT_TRUE(std::regex_search(with_pool.out,
                                std::regex("secretRef:\\s+key: url\\s+name: granary-store\\s+"
                                           "namespace: granary")))
      << with_pool.out;
  // Without an existing Secret the pool names the chart's Redis store Secret.
  KubectlResult chart_store =
      Helm({"template", "r", ChartDir(), "-n", "ops", "--kube-version", "1.37.0", "--set",
            "cachePools[0].name=p", "--set", "cachePools[0].spec.nodeSelector.a=b"});
  ASSERT_TRUE(chart_store.ok()) << chart_store.Describe();
  EXPECT_TRUE(std::regex_search(chart_store.out,
                                std::regex("secretRef:\\s+key: url\\s+name: r-granary-store\\s+"
                                           "namespace: ops")))
      << chart_store.out;
  // The chart says which Kubernetes it needs: the oldest release the
  // Kubernetes suites run on (make test-k8s-versions), 1.34.
  KubectlResult old = Helm({"template", kRelease, ChartDir(), "--kube-version", "1.33.9"});
  EXPECT_FALSE(old.ok());
  EXPECT_THAT(old.err, HasSubstr("kubeVersion"));
  KubectlResult oldest = Helm({"template", kRelease, ChartDir(), "--kube-version", "1.34.0"});
  EXPECT_TRUE(oldest.ok()) << oldest.Describe();
}

TEST_F(HelmChartTest, SchemaRefusesBadValuesNamingTheField) {
  struct Case {
    std::vector<std::string> set;
    std::string field;
    std::string why;
  };
  const std::vector<Case> cases = {
      {{"--set", "operator.replicas=two"}, "/operator/replicas", "want integer"},
      {{"--set", "image.pullPolicy=Sometimes"}, "/image/pullPolicy", "must be one of"},
      {{"--set", "operator.replicaCount=3"}, "/operator", "'replicaCount' not allowed"},
      {{"--set", "store.existingSecretName=x"}, "/store", "'existingSecretName' not allowed"},
      {{"--set", "operator.logLevel=verbose"}, "/operator/logLevel", "must be one of"},
      {{"--set", "operator.webhook.failurePolicy=Retry"},
       "/operator/webhook/failurePolicy",
       "must be one of"},
      {{"--set", "operator.leaderElection.leaseDuration=15 seconds"},
       "/operator/leaderElection/leaseDuration",
       "does not match pattern"},
      {{"--set", "cachePools[0].name=Bad_Name", "--set", "cachePools[0].spec.a=b"},
       "/cachePools/0/name",
       "does not match pattern"},
      {{"--set", "cachePools[0].name=p"}, "/cachePools/0", "missing property 'spec'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"template", kRelease, ChartDir(), "--kube-version", "1.37.0"};
    args.insert(args.end(), c.set.begin(), c.set.end());
    KubectlResult r = Helm(args);
    EXPECT_FALSE(r.ok()) << c.set.back() << " was accepted";
    EXPECT_THAT(r.err, HasSubstr("at '" + c.field + "'")) << c.set.back();
    EXPECT_THAT(r.err, HasSubstr(c.why)) << c.set.back();
  }
  // helm install refuses them too, before anything reaches the cluster.
  KubectlResult install = Helm({"install", "bad", ChartDir(), "-n", kNamespace, "--set",
                                "operator.replicas=two", "--wait", "--timeout", "30s"});
  EXPECT_FALSE(install.ok());
  EXPECT_THAT(install.err, HasSubstr("at '/operator/replicas'"));
  EXPECT_FALSE(cluster_->GetJson({"deployment", "-n", kNamespace, "bad-granary-operator"}).ok());
}

TEST_F(HelmChartTest, InstallRunsTheOperatorAndAPoolAndDatasetGetReady) {
  // The namespaces of the examples: granary with the store Secret (the test's
  // Redis), team-a with its uid/gid grants.
  std::string namespaces =
      ReadAll(std::string(GRANARY_SOURCE_DIR) + "/examples/kubernetes/namespace.yaml");
  namespaces = std::regex_replace(namespaces, std::regex("url: \"redis://[^\"]*\""),
                                  "url: \"" + redis_->url() + "\"");
  cluster_->MustKubectl({"apply", "--validate=strict", "-f", "-"}, namespaces);

  MustHelm({"install", kRelease, ChartDir(), "-n", kNamespace, "-f", dir_->Join("values.yaml"),
            "--wait", "--timeout", "120s"});
  ASSERT_FALSE(HasFailure());
  // Helm installed the CRDs from crds/; the identity policy is applied by hand (docs).
  cluster_->MustKubectl({"apply", "-f", ChartDir() + "/policies/dataset-identity.yaml"});
  // The default values' objects (the chart's Redis on) pass the real API
  // server's validation too (a dry run: nothing is made).
  KubectlResult defaults =
      Helm({"template", "defaults", ChartDir(), "-n", kNamespace, "--kube-version", "1.37.0"});
  ASSERT_TRUE(defaults.ok()) << defaults.Describe();
  KubectlResult dry_run = cluster_->Kubectl(
      {"apply", "--dry-run=server", "--validate=strict", "-f", "-"}, defaults.out);
  EXPECT_TRUE(dry_run.ok()) << dry_run.Describe() << "\n" << dry_run.out;

  ASSERT_OK(WaitRolledOut(seconds(60)));
  const json pods = OperatorPods();
  ASSERT_EQ(pods.size(), 2u) << pods.dump(1);
  EXPECT_NE(pods[0]["spec"].value("nodeName", ""), pods[1]["spec"].value("nodeName", ""));
  for (const json& p : pods) {
    EXPECT_EQ(p["spec"].value("serviceAccountName", ""), kOperator);
    EXPECT_EQ(p["spec"]["securityContext"].value("runAsUser", 0), 65532);
  }
  const std::string real = PodOnNodeOne();
  ASSERT_FALSE(real.empty()) << pods.dump(1);
  ASSERT_OK(WaitRealOperatorReady(real, seconds(60)));

  // The leader registered the webhook through the chart's Service, with its certificate.
  Status registered = cluster_->WaitFor(
      [] {
        Result<json> m = cluster_->GetJson({"mutatingwebhookconfiguration", kWebhookConfiguration});
        if (!m.ok()) return false;
        const json& svc = (*m)["webhooks"][0]["clientConfig"].value("service", json::object());
        return svc.value("name", "") == kWebhookService &&
               svc.value("namespace", "") == kNamespace && svc.value("port", 0) == 443 &&
               !(*m)["webhooks"][0]["clientConfig"].value("caBundle", "").empty();
      },
      seconds(60), "MutatingWebhookConfiguration " + std::string(kWebhookConfiguration));
  ASSERT_OK(registered);
  ASSERT_TRUE(cluster_->GetJson({"secret", "-n", kNamespace, "granary-webhook-tls"}).ok());
  // The Service the configuration names selects the operator's pods on its webhook port.
  Result<json> endpoints = cluster_->GetJson(
      {"endpointslices", "-n", kNamespace, "-l", "kubernetes.io/service-name=granary-webhook"});
  ASSERT_TRUE(endpoints.ok()) << endpoints.status().ToString();

  // The pool from values: its cache node on gpu-node-1 runs here and registers.
  ASSERT_OK(
      runner_->WaitForRunning(PodRunner::WithLabel("granary.io/pool", "gpu"), 1, seconds(60)));
  Status pool_ready = cluster_->WaitFor(
      [] {
        Result<json> p = cluster_->GetJson({"cachepool", "gpu"});
        return p.ok() && ConditionField(*p, "Ready") == "True" &&
               p->value("status", json::object()).value("capacityBytes", uint64_t{0}) > 0;
      },
      seconds(90), "CachePool gpu Ready");
  ASSERT_TRUE(pool_ready.ok()) << pool_ready.ToString() << "\n"
                               << cluster_->Kubectl({"get", "cachepool", "gpu", "-o", "yaml"}).out;

  cluster_->MustKubectl({"apply", "-f", "-"},
                        KubeSuite::DatasetYaml(kTeam, kDataset, datasets() + "/chart/train"));
  ASSERT_OK(WaitDatasetReady(seconds(120)));
  Result<json> d = Dataset();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)["status"].value("files", 0), 40);
  manifest_id_ = new std::string((*d)["status"].value("manifestId", ""));
  EXPECT_FALSE(manifest_id_->empty());
  // The operator copied the store Secret for the team's sidecars (RBAC: secrets anywhere).
  EXPECT_TRUE(cluster_->GetJson({"secret", "-n", kTeam, "granary-store-gpu"}).ok());
  // No replica logged a refused API call.
  for (const ContainerExit& e : runner_->Exits()) {
    if (e.pod.rfind(kOperator, 0) == 0) {
      ADD_FAILURE() << "operator " << e.pod << " ended: " << e.status << "\n"
                    << ReadAll(e.log_path);
    }
  }
  ExpectNoRefusedCalls(real);
}

TEST_F(HelmChartTest, UpgradeRollsTheOperatorAndKeepsTheDataset) {
  ASSERT_NE(manifest_id_, nullptr) << "the install case did not get the Dataset Ready";
  const std::string before = PodOnNodeOne();
  MustHelm({"upgrade", kRelease, ChartDir(), "-n", kNamespace, "-f", dir_->Join("values.yaml"),
            "--set", "operator.logLevel=debug", "--wait", "--timeout", "120s"});
  ASSERT_FALSE(HasFailure());
  ASSERT_OK(WaitRolledOut(seconds(90)));
  const json pods = OperatorPods();
  ASSERT_EQ(pods.size(), 2u) << pods.dump(1);
  for (const json& p : pods) {
    const json args = p["spec"]["containers"][0]["args"];
    EXPECT_NE(std::find(args.begin(), args.end(), "--log-level=debug"), args.end()) << args;
  }
  const std::string after = PodOnNodeOne();
  ASSERT_FALSE(after.empty());
  EXPECT_NE(after, before) << "the pod on gpu-node-1 was not replaced";
  ASSERT_OK(WaitRealOperatorReady(after, seconds(60)));
  // The new process logs at debug (its first reconcile may come a moment
  // after it is ready: the log is polled, bounded).
  for (const RunningContainer& c : runner_->Running()) {
    if (c.pod == after) {
      EXPECT_TRUE(testing::WaitFor(
          [&] { return ReadAll(c.log_path).find(" debug [") != std::string::npos; }, seconds(30)))
          << ReadAll(c.log_path);
    }
  }
  // The Dataset is still Ready with the same manifest, and the new leader reconciles it.
  ASSERT_OK(WaitDatasetReady(seconds(60)));
  Result<json> d = Dataset();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)["status"].value("manifestId", ""), *manifest_id_);
  ExpectNoRefusedCalls(after);
  // Helm recorded the upgrade as revision 2, deployed.
  KubectlResult history = Helm({"history", kRelease, "-n", kNamespace, "-o", "json"});
  ASSERT_TRUE(history.ok()) << history.Describe();
  const json revisions = json::parse(history.out, nullptr, false);
  ASSERT_TRUE(revisions.is_array() && revisions.size() == 2) << history.out;
  EXPECT_EQ(revisions[1].value("revision", 0), 2);
  EXPECT_EQ(revisions[1].value("status", ""), "deployed");
}

TEST_F(HelmChartTest, UninstallLeavesWhatTheDocsSay) {
  ASSERT_NE(manifest_id_, nullptr) << "the install case did not get the Dataset Ready";
  // Without --wait: the chart's pool is held (below), which --wait would wait
  // for until its time-out.
  MustHelm({"uninstall", kRelease, "-n", kNamespace});
  ASSERT_FALSE(HasFailure());
  // The chart's pool is still named by the Dataset: its deletion is held by the
  // operator's finalizer, which no operator removes any more, and its cache
  // node keeps running (docs/kubernetes.md, "Deleting a pool in use").
  ASSERT_OK(cluster_->WaitFor(
      [&] {
        Result<json> pool = cluster_->GetJson({"cachepool", "gpu"});
        return pool.ok() && (*pool)["metadata"].contains("deletionTimestamp");
      },
      seconds(60), "the chart's CachePool to be deleting"));
  Result<json> held = cluster_->GetJson({"cachepool", "gpu"});
  ASSERT_OK(held);
  EXPECT_THAT((*held)["metadata"].value("finalizers", json::array()).dump(),
              HasSubstr("granary.io/pool-in-use"));
  EXPECT_TRUE(cluster_->GetJson({"daemonset", "-n", kNamespace, "granary-cachenode-gpu"}).ok());
  // What the docs say to do without an operator: let it go.
  cluster_->MustKubectl(
      {"patch", "cachepool", "gpu", "--type=merge", "-p", R"({"metadata":{"finalizers":null}})"});
  // Gone: everything the chart templated, and (garbage-collected) the pool's objects.
  const std::vector<std::vector<std::string>> gone = {
      {"deployment", "-n", kNamespace, kOperator},
      {"service", "-n", kNamespace, kWebhookService},
      {"service", "-n", kNamespace, std::string(kOperator) + "-metrics"},
      {"serviceaccount", "-n", kNamespace, kOperator},
      {"role", "-n", kNamespace, kOperator},
      {"rolebinding", "-n", kNamespace, kOperator},
      {"poddisruptionbudget", "-n", kNamespace, kOperator},
      {"clusterrole", kOperator},
      {"clusterrolebinding", kOperator},
      {"cachepool", "gpu"},
      {"daemonset", "-n", kNamespace, "granary-cachenode-gpu"},
  };
  for (const auto& what : gone) {
    Status deleted = cluster_->WaitFor(
        [&] {
          Result<json> o = cluster_->GetJson(what);
          return !o.ok() && o.status().code() == StatusCode::kNotFound;
        },
        seconds(60), "deleted: " + what.front() + " " + what.back());
    EXPECT_OK(deleted);
  }
  ASSERT_OK(runner_->WaitFor(
      [](const std::vector<RunningContainer>& running) {
        for (const RunningContainer& c : running) {
          if (c.ns == kNamespace) return false;
        }
        return true;
      },
      seconds(60), "no operator or cache-node process left"));
  // Stays (docs/install.md, "Uninstalling"): the CRDs and so the Datasets, the
  // webhook registration and its certificate Secret, the Lease.
  EXPECT_TRUE(cluster_->GetJson({"crd", "cachepools.granary.io"}).ok());
  EXPECT_TRUE(cluster_->GetJson({"crd", "datasets.granary.io"}).ok());
  Result<json> d = Dataset();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)["status"].value("manifestId", ""), *manifest_id_);
  EXPECT_TRUE(cluster_->GetJson({"mutatingwebhookconfiguration", kWebhookConfiguration}).ok());
  EXPECT_TRUE(cluster_->GetJson({"secret", "-n", kNamespace, "granary-webhook-tls"}).ok());
  EXPECT_TRUE(cluster_->GetJson({"lease", "-n", kNamespace, "granary-operator"}).ok());
  KubectlResult releases = Helm({"list", "-n", kNamespace, "-q"});
  ASSERT_TRUE(releases.ok()) << releases.Describe();
  EXPECT_EQ(releases.out, "");
  // What the docs say to run after uninstalling works.
  cluster_->MustKubectl({"delete", "mutatingwebhookconfiguration", kWebhookConfiguration});
}

}  // namespace
}  // namespace granary::testing

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

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/cachenode_fixture.h"
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

class RealNodeE2eTest : public SharedKubeTest<RealNodeE2eTest> {
 public:
  static std::string SkipReason() {
    std::optional<std::string> why = KubeNode::Unavailable();
    return why ? *why : std::string();
  }

  static Status StartShared() {
    GRANARY_ASSIGN_OR_RETURN(const std::string image, KubeNode::GranaryImage(GRANARY_BUILD_DIR));
    GRANARY_ASSIGN_OR_RETURN(const std::string trainer,
                             KubeNode::GranaryImage(GRANARY_BUILD_DIR, /*trainer=*/true));
    KubeNodeOptions o;
    o.labels = {{"granary.io/nvme", "true"}, {"nvidia.com/gpu.present", "true"}};
    o.images = {{image, "granary:0.1.0"}, {trainer, "granary-trainer:0.1.0"}};
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
    return KubeSuite::RealNodeChartValues(work_->path(), tag);
  }

  static Status InstallChart() {
    const auto start = std::chrono::steady_clock::now();
    const std::string url =
        "redis://" + node_->host_ip() + ":" + std::to_string(redis_->port()) + "/0";
    const std::string namespaces = KubeSuite::ExampleNamespaces(GRANARY_SOURCE_DIR, url);
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

  // Waits for Job `name` in `ns` to complete or fail: "Complete", "Failed",
  // or "" after `timeout`.
  static std::string WaitJob(const std::string& ns, const std::string& name, milliseconds timeout) {
    std::string outcome;
    (void)cluster().WaitFor(
        [&] {
          Result<json> j = cluster().GetJson({"job", "-n", ns, name});
          if (!j.ok()) return false;
          if (ConditionField(*j, "Complete") == "True") outcome = "Complete";
          if (ConditionField(*j, "Failed") == "True") outcome = "Failed";
          return !outcome.empty();
        },
        timeout, "Job " + ns + "/" + name);
    return outcome;
  }

  // Waits for pod `name` in `ns` to end: its phase, or "" after `timeout`.
  static std::string WaitPodEnd(const std::string& ns, const std::string& name,
                                milliseconds timeout) {
    std::string phase;
    (void)cluster().WaitFor(
        [&] {
          Result<json> p = cluster().GetJson({"pod", "-n", ns, name});
          if (!p.ok()) return false;
          phase = (*p)["status"].value("phase", "");
          return phase == "Succeeded" || phase == "Failed";
        },
        timeout, "pod " + ns + "/" + name + " to end");
    return phase == "Succeeded" || phase == "Failed" ? phase : "";
  }

  // A sample of the cache node's /metrics (host network: the node's address).
  static double CacheNodeMetric(const std::string& name, const std::string& from) {
    Result<HttpResponse> r = HttpGet(node_->node_ip() + ":9464", "/metrics", seconds(10));
    if (!r.ok() || r->status != 200) return -1;
    Result<std::vector<MetricSample>> samples = ParsePrometheusText(r->body);
    if (!samples.ok()) return -1;
    return SumSamples(*samples, name, {{"from", from}}).value_or(0);
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

// A Job of the training image, labelled with the Dataset: the webhook injects
// the native sidecar, the trainer (tests/trainer/check_epochs.py) reads two
// epochs through granary.torch and checks every sample against the source;
// the Job completes, and the sidecar stopped after the trainer.
TEST_F(RealNodeE2eTest, ATrainingJobReadsTwoEpochsThroughTheInjectedNativeSidecar) {
  cluster().MustKubectl(KubeSuite::TrainerScriptConfigMap(kTeam));
  json job = KubeSuite::TrainingJob(kTeam, "train", kDataset, Source(), 9465, "");
  json& pod_spec = job["spec"]["template"]["spec"];
  json& trainer = pod_spec["containers"][0];
  trainer["image"] = "granary-trainer:0.1.0";
  trainer["command"] = {"python3", "/app/train.py"};
  // The source (mounted as the golden copy) is uid 1000's alone.
  pod_spec["securityContext"] = {{"runAsUser", 1000}, {"runAsGroup", 1000}};
  pod_spec["terminationGracePeriodSeconds"] = 5;
  const auto start = std::chrono::steady_clock::now();
  cluster().MustKubectl({"apply", "-f", "-"}, job.dump());
  std::string outcome;
  Status finished = cluster().WaitFor(
      [&] {
        Result<json> j = cluster().GetJson({"job", "-n", kTeam, "train"});
        if (!j.ok()) return false;
        if (ConditionField(*j, "Complete") == "True") outcome = "Complete";
        if (ConditionField(*j, "Failed") == "True") outcome = "Failed";
        return !outcome.empty();
      },
      milliseconds(300000), "Job team-a/train to finish");
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  KubectlResult logs = cluster().Kubectl({"logs", "-n", kTeam, "job/train", "-c", "trainer"});
  ASSERT_TRUE(finished.ok()) << finished.ToString() << "\n" << logs.out << logs.err;
  EXPECT_EQ(outcome, "Complete") << logs.out << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("trainer OK")) << logs.err;
  std::cout << "training Job: apply to Complete " << took << " s; the trainer said:\n"
            << logs.out << std::endl;

  std::vector<json> pods = Pods(kTeam, "job-name=train");
  ASSERT_EQ(pods.size(), 1u);
  const json& pod = pods[0];
  EXPECT_EQ(pod["status"].value("phase", ""), "Succeeded");
  // The injected sidecar is a native sidecar (an init container that runs
  // alongside), and it ended after the trainer, not before.
  const json init_statuses = pod["status"].value("initContainerStatuses", json::array());
  const json* sidecar = nullptr;
  for (const json& c : init_statuses) {
    if (c.value("name", "") == "granary-sidecar") sidecar = &c;
  }
  ASSERT_NE(sidecar, nullptr) << pod["status"].dump(2);
  bool restart_always = false;
  for (const json& c : pod["spec"]["initContainers"]) {
    if (c.value("name", "") == "granary-sidecar") {
      restart_always = c.value("restartPolicy", "") == "Always";
    }
  }
  EXPECT_TRUE(restart_always) << pod["spec"].dump(2);
  const json& trainer_status = pod["status"]["containerStatuses"][0];
  const std::string trainer_end = trainer_status["state"]["terminated"].value("finishedAt", "");
  const std::string sidecar_end = (*sidecar)["state"]["terminated"].value("finishedAt", "");
  ASSERT_FALSE(trainer_end.empty()) << trainer_status.dump(2);
  ASSERT_FALSE(sidecar_end.empty()) << sidecar->dump(2);
  EXPECT_GE(sidecar_end, trainer_end);  // RFC 3339 in UTC: ordered as strings
  EXPECT_EQ(trainer_status["state"]["terminated"].value("exitCode", -1), 0);
}

// The POSIX view: a pod annotated with a mount path gets the dataset as a
// read-only file tree there, mounted by its (privileged) sidecar through FUSE
// and propagated to the app container; unmodified code reads every file by
// path.
TEST_F(RealNodeE2eTest, ThePosixViewInAPodServesEveryFileByPath) {
  const json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", "by-path"},
        {"namespace", kTeam},
        {"labels", {{"granary.io/dataset", kDataset}}},
        {"annotations", {{"granary.io/mount-path", "/data"}}}}},
      {"spec",
       {{"restartPolicy", "Never"},
        {"terminationGracePeriodSeconds", 5},
        {"securityContext", {{"runAsUser", 1000}, {"runAsGroup", 1000}}},
        {"containers",
         json::array({{{"name", "reader"},
                       {"image", "granary:0.1.0"},
                       {"command", {"python3", "-c"}},
                       {"args",
                        {"import hashlib, os, sys\n"
                         "n = 0\n"
                         "for root, _, files in os.walk('/golden'):\n"
                         "    for f in files:\n"
                         "        rel = os.path.relpath(os.path.join(root, f), '/golden')\n"
                         "        want = open(os.path.join('/golden', rel), 'rb').read()\n"
                         "        got = open(os.path.join('/data', rel), 'rb').read()\n"
                         "        if got != want: sys.exit('differs: ' + rel)\n"
                         "        n += 1\n"
                         "print('read %d files by path' % n)\n"}},
                       {"volumeMounts", json::array({{{"name", "golden"},
                                                      {"mountPath", "/golden"},
                                                      {"readOnly", true}}})}}})},
        {"volumes", json::array({{{"name", "golden"},
                                  {"hostPath", {{"path", Source()}, {"type", "Directory"}}}}})}}}};
  cluster().MustKubectl({"apply", "-f", "-"}, pod.dump());
  const std::string phase = WaitPodEnd(kTeam, "by-path", milliseconds(180000));
  KubectlResult logs = cluster().Kubectl({"logs", "-n", kTeam, "by-path", "-c", "reader"});
  KubectlResult sidecar =
      cluster().Kubectl({"logs", "-n", kTeam, "by-path", "-c", "granary-sidecar"});
  EXPECT_EQ(phase, "Succeeded") << logs.out << logs.err << "\nsidecar:\n" << sidecar.out;
  EXPECT_THAT(logs.out, HasSubstr("read " + std::to_string(kFiles) + " files by path"));
  cluster().MustKubectl({"delete", "pod", "-n", kTeam, "by-path", "--wait=true"});
}

// The Job's pod as the webhook made it, for `ns`, without the same-host
// handoff (its node-socket volume): the sidecar then reads over TCP with the
// pod's projected ServiceAccount token. Not labelled, so not injected again.
json CopyWithoutHandoff(const json& injected, const std::string& ns, const std::string& name) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", name},
                {"namespace", ns},
                {"annotations", injected["metadata"].value("annotations", json::object())}}},
              {"spec", injected["spec"]}};
  json& spec = pod["spec"];
  spec.erase("nodeName");
  spec["restartPolicy"] = "Never";
  std::string socket_volume;
  json volumes = json::array();
  for (const json& v : spec["volumes"]) {
    if (v.contains("hostPath") && v.value("name", "").find("node-socket") != std::string::npos) {
      socket_volume = v.value("name", "");
      continue;
    }
    volumes.push_back(v);
  }
  spec["volumes"] = volumes;
  for (const char* list : {"initContainers", "containers"}) {
    for (json& c : spec[list]) {
      json mounts = json::array();
      for (const json& m : c.value("volumeMounts", json::array())) {
        if (m.value("name", "") != socket_volume) mounts.push_back(m);
      }
      c["volumeMounts"] = mounts;
    }
  }
  // Two epochs, with no demand that the handoff served.
  json& trainer = spec["containers"][0];
  trainer["args"] = {"--golden=/golden", "--epochs=2"};
  return pod;
}

// The projected token over TCP: a pod whose sidecar cannot use the handoff
// reads its namespace's Dataset from the cache node's port; the same pod in
// another namespace (its token says team-b) is refused, naming why.
TEST_F(RealNodeE2eTest, TheProjectedTokenOverTcpReadsItsOwnNamespaceAndIsRefusedElsewhere) {
  std::vector<json> pods = Pods(kTeam, "job-name=train");
  ASSERT_EQ(pods.size(), 1u) << "needs the training Job's pod";
  const json& injected = pods[0];

  cluster().MustKubectl({"apply", "-f", "-"}, CopyWithoutHandoff(injected, kTeam, "tcp").dump());
  std::string phase = WaitPodEnd(kTeam, "tcp", milliseconds(180000));
  KubectlResult logs = cluster().Kubectl({"logs", "-n", kTeam, "tcp", "-c", "trainer"});
  EXPECT_EQ(phase, "Succeeded") << logs.out << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("trainer OK"));

  // team-b: what the pod needs besides the token (the script, the store
  // Secret copy), as an admin who copied them over would have.
  cluster().MustKubectl({"create", "namespace", "team-b"});
  cluster().MustKubectl(KubeSuite::TrainerScriptConfigMap("team-b"));
  for (const json& v : injected["spec"]["volumes"]) {
    const std::string secret =
        v.contains("secret") ? v["secret"].value("secretName", "") : std::string();
    if (secret.empty()) continue;
    Result<json> copy = cluster().GetJson({"secret", "-n", kTeam, secret});
    ASSERT_TRUE(copy.ok()) << copy.status().ToString();
    json body = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", {{"name", secret}, {"namespace", "team-b"}}},
                 {"type", (*copy).value("type", "Opaque")},
                 {"data", (*copy)["data"]}};
    cluster().MustKubectl({"apply", "-f", "-"}, body.dump());
  }
  cluster().MustKubectl({"apply", "-f", "-"},
                        CopyWithoutHandoff(injected, "team-b", "elsewhere").dump());
  phase = WaitPodEnd("team-b", "elsewhere", milliseconds(180000));
  KubectlResult refused = cluster().Kubectl({"logs", "-n", "team-b", "elsewhere", "-c", "trainer"});
  KubectlResult sidecar =
      cluster().Kubectl({"logs", "-n", "team-b", "elsewhere", "-c", "granary-sidecar"});
  EXPECT_NE(phase, "Succeeded") << refused.out;
  EXPECT_THAT(refused.out + sidecar.out, HasSubstr("team-b")) << "trainer:\n"
                                                              << refused.out << "\nsidecar:\n"
                                                              << sidecar.out;
  EXPECT_THAT(refused.out, ::testing::Not(HasSubstr("trainer OK")));
  // The reader is told why and what helps: not "check the cache nodes run".
  EXPECT_THAT(refused.out, HasSubstr("a token reads only its own namespace's datasets"));
  EXPECT_THAT(refused.out, HasSubstr("The cache nodes refused this reader"));
  std::cout << "refused in team-b; the trainer said:\n"
            << refused.out << "the sidecar said:\n"
            << sidecar.out << std::endl;
  cluster().MustKubectl({"delete", "namespace", "team-b", "--wait=false"});
  cluster().MustKubectl({"delete", "pod", "-n", kTeam, "tcp", "--wait=true"});
}

// A training pod evicted by a drain; the cache node's container killed and
// the kubelet restarted meanwhile; after uncordon a new Job reads every
// sample from what the node kept (no source read).
TEST_F(RealNodeE2eTest, DrainAndUncordonKeepTheStagedChunks) {
  cluster().MustKubectl({"delete", "job", "-n", kTeam, "train", "--wait=true"});
  json job = KubeSuite::TrainingJob(kTeam, "long", kDataset, Source(), 9465, "");
  json& pod_spec = job["spec"]["template"]["spec"];
  pod_spec["containers"][0]["image"] = "granary-trainer:0.1.0";
  pod_spec["containers"][0]["command"] = {"sh", "-c",
                                          "python3 /app/train.py --golden=/golden --epochs=1 && "
                                          "echo waiting && sleep 600"};
  pod_spec["containers"][0].erase("args");
  pod_spec["securityContext"] = {{"runAsUser", 1000}, {"runAsGroup", 1000}};
  pod_spec["terminationGracePeriodSeconds"] = 2;
  cluster().MustKubectl({"apply", "-f", "-"}, job.dump());
  std::string pod_name;
  ASSERT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        std::vector<json> pods = Pods(kTeam, "job-name=long");
                        if (pods.size() != 1) return false;
                        pod_name = pods[0]["metadata"].value("name", "");
                        KubectlResult l =
                            cluster().Kubectl({"logs", "-n", kTeam, pod_name, "-c", "trainer"});
                        return l.out.find("waiting") != std::string::npos;
                      },
                      milliseconds(180000), "the long Job's first epoch")
                  .ok());
  const double source_reads = CacheNodeMetric("granary_cachenode_dataset_reads_total", "source");

  // Drain: the training pod is evicted (the operator's replicas, kept by
  // their PodDisruptionBudget on this one node, and the DaemonSet's cache
  // node stay).
  KubectlResult drain =
      cluster().Kubectl({"drain", node_->name(), "--ignore-daemonsets", "--delete-emptydir-data",
                         "--pod-selector=app.kubernetes.io/component!=operator", "--timeout=120s"});
  ASSERT_TRUE(drain.ok()) << drain.Describe() << drain.out;
  EXPECT_THAT(drain.out, HasSubstr("evicting pod team-a/" + pod_name));
  ASSERT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        return !cluster().GetJson({"pod", "-n", kTeam, pod_name}).ok();
                      },
                      milliseconds(60000), "the evicted pod gone")
                  .ok());
  // The node's maintenance: the kubelet restarts, the cache node's
  // container is killed (the kubelet starts it again).
  std::vector<json> cachenodes = Pods(kSystem, "granary.io/pool=gpu");
  ASSERT_EQ(cachenodes.size(), 1u);
  const int restarts_before =
      cachenodes[0]["status"]["containerStatuses"][0].value("restartCount", 0);
  ASSERT_TRUE(node_->RestartKubelet().ok());
  std::string id = cachenodes[0]["status"]["containerStatuses"][0].value("containerID", "");
  id = id.substr(id.find("://") + 3);
  KubectlResult killed = node_->Ctr({"tasks", "kill", "-s", "SIGKILL", id});
  ASSERT_TRUE(killed.ok()) << killed.Describe();
  ASSERT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        std::vector<json> p = Pods(kSystem, "granary.io/pool=gpu");
                        return p.size() == 1 && AllReady(p[0]) &&
                               p[0]["status"]["containerStatuses"][0].value("restartCount", 0) >
                                   restarts_before;
                      },
                      milliseconds(120000), "the cache node restarted and Ready")
                  .ok());
  // The operator's replicas did not restart with the kubelet.
  for (const json& op : Pods(kSystem, "app.kubernetes.io/component=operator")) {
    EXPECT_EQ(op["status"]["containerStatuses"][0].value("restartCount", -1), 0)
        << op["metadata"].value("name", "");
  }
  cluster().MustKubectl({"uncordon", node_->name()});
  cluster().MustKubectl({"delete", "job", "-n", kTeam, "long", "--wait=true"});

  json again = KubeSuite::TrainingJob(kTeam, "again", kDataset, Source(), 9465, "");
  json& again_spec = again["spec"]["template"]["spec"];
  again_spec["containers"][0]["image"] = "granary-trainer:0.1.0";
  again_spec["containers"][0]["command"] = {"python3", "/app/train.py"};
  again_spec["securityContext"] = {{"runAsUser", 1000}, {"runAsGroup", 1000}};
  cluster().MustKubectl({"apply", "-f", "-"}, again.dump());
  EXPECT_EQ(WaitJob(kTeam, "again", milliseconds(240000)), "Complete")
      << cluster().Kubectl({"logs", "-n", kTeam, "job/again", "-c", "trainer"}).out;
  // The restarted cache node served it from the chunks it kept: its source
  // reads since the restart are none (its counters start again at 0).
  EXPECT_EQ(CacheNodeMetric("granary_cachenode_dataset_reads_total", "source"), 0)
      << "before the drain: " << source_reads;
  EXPECT_GT(CacheNodeMetric("granary_cachenode_dataset_reads_total", "store"), 0);
}

// The cache node's container killed while a trainer reads: the kubelet
// starts it again, and every epoch completes with the right bytes.
TEST_F(RealNodeE2eTest, ACacheNodeKilledMidEpochLeavesEveryEpochCorrect) {
  json job = KubeSuite::TrainingJob(kTeam, "midepoch", kDataset, Source(), 9465, "");
  json& spec = job["spec"]["template"]["spec"];
  spec["containers"][0]["image"] = "granary-trainer:0.1.0";
  spec["containers"][0]["command"] = {"python3", "/app/train.py"};
  // --compare-local: each epoch says it ended ("epoch N: ...").
  spec["containers"][0]["args"] = {"--golden=/golden", "--epochs=300", "--compare-local"};
  spec["securityContext"] = {{"runAsUser", 1000}, {"runAsGroup", 1000}};
  cluster().MustKubectl({"apply", "-f", "-"}, job.dump());
  std::string pod_name;
  ASSERT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        std::vector<json> pods = Pods(kTeam, "job-name=midepoch");
                        if (pods.size() != 1) return false;
                        pod_name = pods[0]["metadata"].value("name", "");
                        return cluster()
                                   .Kubectl({"logs", "-n", kTeam, pod_name, "-c", "trainer"})
                                   .out.find("epoch 2:") != std::string::npos;
                      },
                      milliseconds(180000), "the trainer past its first epochs")
                  .ok());
  std::vector<json> cachenodes = Pods(kSystem, "granary.io/pool=gpu");
  ASSERT_EQ(cachenodes.size(), 1u);
  const json& status = cachenodes[0]["status"]["containerStatuses"][0];
  const int restarts = status.value("restartCount", 0);
  std::string id = status.value("containerID", "");
  id = id.substr(id.find("://") + 3);
  KubectlResult killed = node_->Ctr({"tasks", "kill", "-s", "SIGKILL", id});
  ASSERT_TRUE(killed.ok()) << killed.Describe();
  // It was killed mid-run: the trainer had not finished.
  const std::string before =
      cluster().Kubectl({"logs", "-n", kTeam, pod_name, "-c", "trainer"}).out;
  ASSERT_EQ(before.find("trainer OK"), std::string::npos)
      << "the trainer finished before the kill; give it more epochs";
  EXPECT_EQ(WaitJob(kTeam, "midepoch", milliseconds(300000)), "Complete");
  const std::string log =
      cluster().Kubectl({"logs", "-n", kTeam, "job/midepoch", "-c", "trainer"}).out;
  EXPECT_THAT(
      log, HasSubstr("trainer OK: 300 samples checked through the sidecar in each of 300 epochs"))
      << log.substr(log.size() > 3000 ? log.size() - 3000 : 0);
  // The kubelet saw it die and started it again (its status may lag the Job).
  EXPECT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        std::vector<json> after = Pods(kSystem, "granary.io/pool=gpu");
                        return after.size() == 1 &&
                               after[0]["status"]["containerStatuses"][0].value("restartCount", 0) >
                                   restarts;
                      },
                      milliseconds(60000), "the cache node's restart counted")
                  .ok());
  // And the pool says so: Ready again once its cache node is.
  EXPECT_TRUE(cluster()
                  .WaitFor(
                      [&] {
                        Result<json> pool = cluster().GetJson({"cachepool", "gpu"});
                        return pool.ok() && ConditionField(*pool, "Ready") == "True";
                      },
                      milliseconds(120000), "CachePool gpu Ready again")
                  .ok())
      << cluster().Kubectl({"describe", "cachepool", "gpu"}).out;
  cluster().MustKubectl({"delete", "job", "-n", kTeam, "midepoch", "--wait=true"});
}

// Bad inputs, each a condition with the reason from what the real kubelet
// says, and nothing of the good pool or its Dataset lost: an image the node
// does not have, a storage hostPath the cache node cannot write, a source
// mount whose host directory does not exist (and a Dataset under it).
TEST_F(RealNodeE2eTest, BadPoolsAndSourcesAreConditionsWithTheReason) {
  Result<json> gpu = cluster().GetJson({"cachepool", "gpu"});
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  // The cache nodes use the host's network: each pool its own ports.
  auto pool = [&](const std::string& name, int port_base) {
    json spec = (*gpu)["spec"];
    spec["ports"] = {{"data", port_base}, {"metrics", port_base + 1}};
    spec["nodeSocketHostPath"] = work_->Join("node-socket-" + name);
    return json{{"apiVersion", "granary.io/v1alpha1"},
                {"kind", "CachePool"},
                {"metadata", {{"name", name}}},
                {"spec", spec}};
  };
  json no_image = pool("no-image", 7170);
  no_image["spec"]["image"] = "granary:no-such-tag";
  // A directory the cache node's root, with no CAP_DAC_OVERRIDE, may not write.
  const std::string locked = work_->Join("locked");
  std::filesystem::create_directories(locked);
  ASSERT_EQ(::chown(locked.c_str(), 1000, 1000), 0);
  ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
  json read_only = pool("read-only", 7270);
  read_only["spec"]["storage"]["hostPath"] = locked;
  json no_source = pool("no-source", 7370);
  no_source["spec"]["sourceMounts"] =
      json::array({{{"name", "gone"}, {"hostPath", work_->Join("not-mounted")}}});
  for (const json& p : {no_image, read_only, no_source}) {
    cluster().MustKubectl({"apply", "-f", "-"}, p.dump());
  }
  cluster().MustKubectl(
      {"apply", "-f", "-"},
      ReplaceAll(KubeSuite::DatasetYaml(kTeam, "unmounted", work_->Join("not-mounted") + "/x"),
                 "cachePool: gpu", "cachePool: no-source"));

  auto wait_reason = [&](const std::vector<std::string>& what, const std::string& reason) {
    std::string message;
    Status s = cluster().WaitFor(
        [&] {
          Result<json> o = cluster().GetJson(what);
          if (!o.ok() || ConditionField(*o, "Ready") != "False" ||
              ConditionField(*o, "Ready", "reason") != reason) {
            return false;
          }
          message = ConditionField(*o, "Ready", "message");
          return true;
        },
        milliseconds(120000), what.back() + " Ready=False " + reason);
    EXPECT_TRUE(s.ok()) << s.ToString() << "\n"
                        << cluster()
                               .Kubectl([&] {
                                 std::vector<std::string> a = {"describe"};
                                 a.insert(a.end(), what.begin(), what.end());
                                 return a;
                               }())
                               .out;
    return message;
  };
  const std::string image_message = wait_reason({"cachepool", "no-image"}, "ImagePullFailed");
  EXPECT_THAT(image_message, HasSubstr("granary:no-such-tag"));
  EXPECT_THAT(image_message, HasSubstr(node_->name()));
  const std::string write_message = wait_reason({"cachepool", "read-only"}, "CacheNodeCrashing");
  EXPECT_THAT(write_message, HasSubstr(locked));
  EXPECT_THAT(write_message, HasSubstr("ermission denied"));
  const std::string mount_message = wait_reason({"cachepool", "no-source"}, "SourceMountFailed");
  EXPECT_THAT(mount_message, HasSubstr(work_->Join("not-mounted")));
  const std::string dataset_message =
      wait_reason({"dataset", "-n", kTeam, "unmounted"}, "SourceMountFailed");
  EXPECT_THAT(dataset_message, HasSubstr("gone"));
  std::cout << "ImagePullFailed: " << image_message << "\nCacheNodeCrashing: " << write_message
            << "\nSourceMountFailed (pool): " << mount_message
            << "\nSourceMountFailed (Dataset): " << dataset_message << std::endl;

  // Nothing lost: the good pool and its Dataset are as they were.
  Result<json> good = cluster().GetJson({"dataset", "-n", kTeam, kDataset});
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(ConditionField(*good, "Ready"), "True");
  Result<json> good_pool = cluster().GetJson({"cachepool", "gpu"});
  ASSERT_TRUE(good_pool.ok());
  EXPECT_EQ(ConditionField(*good_pool, "Ready"), "True");
  // And the bad ones go.
  cluster().MustKubectl(
      {"delete", "dataset", "-n", kTeam, "unmounted", "--wait=true", "--timeout=120s"});
  cluster().MustKubectl({"delete", "cachepool", "no-image", "read-only", "no-source", "--wait=true",
                         "--timeout=120s"});
  EXPECT_TRUE(
      cluster()
          .WaitFor(
              [&] {
                return Pods(kSystem, "granary.io/pool in (no-image,read-only,no-source)").empty();
              },
              milliseconds(120000), "the bad pools' pods gone")
          .ok());
}

// helm upgrade to a new tag rolls the operator and the cache node, and the
// Dataset stays Ready throughout.
TEST_F(RealNodeE2eTest, HelmUpgradeToANewTagRollsEverythingAndTheDatasetStaysReady) {
  for (const char* name : {"granary:0.1.1", "docker.io/library/granary:0.1.1"}) {
    KubectlResult tagged = node_->Ctr({"images", "tag", "--force", "granary:0.1.0", name});
    ASSERT_TRUE(tagged.ok()) << tagged.Describe();
  }
  work_->WriteFile("values-0.1.1.yaml", Values("0.1.1").dump(2));
  std::atomic<bool> done{false};
  std::atomic<int> polls{0}, not_ready{0};
  std::thread watcher([&] {
    while (!done) {
      Result<json> d = cluster().GetJson({"dataset", "-n", kTeam, kDataset});
      ++polls;
      if (!d.ok() || ConditionField(*d, "Ready") != "True") ++not_ready;
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  const std::string chart = std::string(GRANARY_SOURCE_DIR) + "/charts/granary";
  KubectlResult upgrade = Helm({"upgrade", kRelease, chart, "-n", kSystem, "-f",
                                work_->Join("values-0.1.1.yaml"), "--wait", "--timeout", "240s"});
  Status rolled = cluster().WaitFor(
      [&] {
        std::vector<json> pods = Pods(kSystem, "app.kubernetes.io/component=operator");
        std::vector<json> nodes = Pods(kSystem, "granary.io/pool=gpu");
        if (pods.size() != 2 || nodes.size() != 1) return false;
        for (const json& p : {pods[0], pods[1], nodes[0]}) {
          if (!AllReady(p) || p["spec"]["containers"][0].value("image", "") != "granary:0.1.1") {
            return false;
          }
        }
        return true;
      },
      milliseconds(240000), "the operator and the cache node on granary:0.1.1");
  done = true;
  watcher.join();
  ASSERT_TRUE(upgrade.ok()) << upgrade.Describe() << upgrade.out;
  ASSERT_TRUE(rolled.ok()) << rolled.ToString();
  EXPECT_GT(polls.load(), 5);
  EXPECT_EQ(not_ready.load(), 0) << "of " << polls.load() << " looks at the Dataset";
}

// helm uninstall (the Datasets deleted first, as docs/install.md says)
// leaves what docs/install.md lists, and nothing of the release runs.
TEST_F(RealNodeE2eTest, HelmUninstallLeavesWhatTheDocsSay) {
  cluster().MustKubectl(
      {"delete", "dataset", "-n", kTeam, kDataset, "--wait=true", "--timeout=120s"});
  KubectlResult uninstall =
      Helm({"uninstall", kRelease, "-n", kSystem, "--wait", "--timeout", "180s"});
  ASSERT_TRUE(uninstall.ok()) << uninstall.Describe();
  Status gone = cluster().WaitFor(
      [&] {
        Result<json> pods = cluster().GetJson({"pods", "-n", kSystem});
        return pods.ok() && (*pods)["items"].empty();
      },
      milliseconds(120000), "every pod of the release gone");
  EXPECT_TRUE(gone.ok()) << cluster().Kubectl({"get", "pods", "-n", kSystem}).out;
  // What stays: the CRDs, the webhook configuration and its Secret (the
  // operator made them), the Lease.
  EXPECT_TRUE(cluster().GetJson({"crd", "datasets.granary.io"}).ok());
  EXPECT_TRUE(cluster().GetJson({"crd", "cachepools.granary.io"}).ok());
  EXPECT_TRUE(cluster().GetJson({"mutatingwebhookconfiguration", "granary-sidecar-injector"}).ok());
  EXPECT_TRUE(cluster().GetJson({"secret", "-n", kSystem, "granary-webhook-tls"}).ok());
  // What goes: the Deployment, the pool and its DaemonSet, the Services.
  EXPECT_FALSE(cluster().GetJson({"deployment", "-n", kSystem, "granary-operator"}).ok());
  EXPECT_FALSE(cluster().GetJson({"cachepool", "gpu"}).ok());
  EXPECT_FALSE(cluster().GetJson({"daemonset", "-n", kSystem, "granary-cachenode-gpu"}).ok());
  EXPECT_FALSE(cluster().GetJson({"service", "-n", kSystem, "granary-webhook"}).ok());
}

}  // namespace
}  // namespace granary::testing

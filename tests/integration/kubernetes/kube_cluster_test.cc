// The Kubernetes test fixture itself (tests/testing/kube_cluster.h and
// pod_runner.h): a real control plane with kwok's fake GPU nodes, RBAC on,
// objects surviving an API server restart, and a Granary pod (a real
// granary-cachenode fed by a ConfigMap and a Secret) run by PodRunner and
// stopped when the pod is deleted; and Jobs whose pods really run to their
// end (KubeClusterOptions::kwok_completes_job_pods = false with
// PodRunnerOptions::report_completion) next to kwok's default of completing
// them at once.
//
// One cluster serves each suite (SetUpTestSuite): KubeClusterTest's with
// the default options, KubeClusterJobTest's without kwok's "complete" stage.
// ctest runs each case in its own process (gtest_discover_tests), so there
// each case starts one.

#include "testing/kube_cluster.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "testing/pod_runner.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A /proc file of a process (their size is 0, so read to the end).
std::string ReadProcFile(pid_t pid, const std::string& name) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + name, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class KubeClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { StartSuiteCluster({}); }
  static void StartSuiteCluster(KubeClusterOptions options) {
    delete skip_reason_;
    delete start_error_;
    skip_reason_ = start_error_ = nullptr;
    Result<std::string> tools = KubeCluster::ToolsDir();
    if (!tools.ok()) {
      skip_reason_ = new std::string(tools.status().ToString());
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    Result<std::unique_ptr<KubeCluster>> cluster = KubeCluster::Start(std::move(options));
    const auto took =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
    if (!cluster.ok()) {
      start_error_ = new std::string(cluster.status().ToString());
      return;
    }
    cluster_ = cluster->release();
    std::cout << "KubeCluster::Start took " << took.count() << " ms (" << cluster_->server() << ", "
              << cluster_->dir() << ")" << std::endl;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
    ASSERT_EQ(start_error_, nullptr) << *start_error_;
  }
  void TearDown() override {
    if (cluster_ != nullptr) cluster_->PrintLogsIfTestFailed();
  }

  static KubeCluster& cluster() { return *cluster_; }

  // Granary's images run from this build's binaries; gpu-node-1's pods only.
  static PodRunnerOptions RunnerOptions() {
    PodRunnerOptions o;
    o.images = {{"granary", GRANARY_POD_BIN_DIR}};
    o.nodes = {"gpu-node-1"};
    return o;
  }

  // The runner for the Job tests: besides Granary's images, "training"
  // images whose commands are this host's programs (sh, true, false, sleep).
  static PodRunnerOptions JobRunnerOptions(bool report_completion) {
    PodRunnerOptions o = RunnerOptions();
    o.images["pytorch/pytorch"] = "/usr/bin";
    o.images["busybox"] = "/usr/bin";
    o.report_completion = report_completion;
    return o;
  }

  // A Job of one pod on gpu-node-1 that is not retried (backoffLimit 0,
  // restartPolicy Never), with `containers` and `init_containers`.
  static json Job(const std::string& name, const json& containers,
                  const json& init_containers = json::array()) {
    json pod_spec = {{"nodeSelector", {{"kubernetes.io/hostname", "gpu-node-1"}}},
                     {"restartPolicy", "Never"},
                     {"terminationGracePeriodSeconds", 5},
                     {"containers", containers}};
    if (!init_containers.empty()) pod_spec["initContainers"] = init_containers;
    return {{"apiVersion", "batch/v1"},
            {"kind", "Job"},
            {"metadata", {{"name", name}}},
            {"spec", {{"backoffLimit", 0}, {"template", {{"spec", pod_spec}}}}}};
  }

  // Whether Job ns/name has condition `type` True; `last` gets the Job.
  static bool JobHasCondition(const std::string& ns, const std::string& name,
                              const std::string& type, json* last) {
    Result<json> job = cluster().GetJson({"job", name, "-n", ns});
    if (!job.ok()) return false;
    *last = *job;
    for (const json& c : (*job)["status"].value("conditions", json::array())) {
      if (c.value("type", "") == type && c.value("status", "") == "True") return true;
    }
    return false;
  }

  // The one pod of Job ns/name (an empty object if there is none, or more).
  static json JobPod(const std::string& ns, const std::string& name) {
    Result<json> pods = cluster().GetJson({"pods", "-n", ns, "-l", "job-name=" + name});
    if (!pods.ok() || (*pods)["items"].size() != 1) return json::object();
    return (*pods)["items"][0];
  }

  // The terminated state of container `container` in the pod's
  // `list` (containerStatuses, initContainerStatuses); null if not there.
  static json Terminated(const json& pod, const char* list, const std::string& container) {
    for (const json& s : pod["status"].value(list, json::array())) {
      if (s.value("name", "") == container && s["state"].contains("terminated")) {
        return s["state"]["terminated"];
      }
    }
    return nullptr;
  }

  // kubectl that must succeed.
  static std::string MustKubectl(const std::vector<std::string>& args,
                                 const std::string& stdin_text = "") {
    return cluster_->MustKubectl(args, stdin_text);
  }

  static KubeCluster* cluster_;
  static std::string* skip_reason_;
  static std::string* start_error_;
};

KubeCluster* KubeClusterTest::cluster_ = nullptr;
std::string* KubeClusterTest::skip_reason_ = nullptr;
std::string* KubeClusterTest::start_error_ = nullptr;

TEST_F(KubeClusterTest, FakeGpuNodesAreReadyWithTheirLabelsAndCapacity) {
  Result<json> nodes = cluster().GetJson({"nodes"});
  ASSERT_OK(nodes);
  std::map<std::string, json> by_name;
  for (const json& n : (*nodes)["items"]) by_name[n["metadata"]["name"]] = n;
  ASSERT_EQ(by_name.size(), 2u) << nodes->dump(2);
  for (const char* name : {"gpu-node-1", "gpu-node-2"}) {
    ASSERT_TRUE(by_name.contains(name)) << name;
    const json& n = by_name[name];
    EXPECT_EQ(n["metadata"]["labels"].value("nvidia.com/gpu.present", ""), "true");
    EXPECT_EQ(n["metadata"]["labels"].value("granary.io/nvme", ""), "true");
    EXPECT_EQ(n["status"]["allocatable"].value("nvidia.com/gpu", ""), "8");
    EXPECT_EQ(n["status"]["capacity"].value("cpu", ""), "32");
    bool ready = false;
    for (const json& c : n["status"]["conditions"]) {
      if (c["type"] == "Ready") ready = c["status"] == "True";
    }
    EXPECT_TRUE(ready) << n["status"].dump(2);
  }
  // What a person would type: the table shows them Ready.
  const std::string table =
      MustKubectl({"get", "nodes", "-l", "nvidia.com/gpu.present=true,granary.io/nvme=true"});
  EXPECT_NE(table.find("gpu-node-1"), std::string::npos) << table;
  EXPECT_NE(table.find("gpu-node-2"), std::string::npos) << table;
  EXPECT_NE(table.find("Ready"), std::string::npos) << table;
  EXPECT_EQ(table.find("NotReady"), std::string::npos) << table;
}

TEST_F(KubeClusterTest, DeploymentOfAnotherImageGetsRunningPodsFromKwok) {
  MustKubectl({"create", "namespace", "kwok-deploy"});
  MustKubectl({"apply", "-n", "kwok-deploy", "-f", "-"}, R"(
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {nvidia.com/gpu.present: "true"}
      containers:
      - name: web
        image: nginx:1.27
        resources: {limits: {nvidia.com/gpu: "1"}}
)");
  // The controller manager makes the ReplicaSet and pods, the scheduler binds
  // them to the fake nodes (GPU resources counted), kwok reports them Running.
  std::string last;
  Status all_running = cluster().WaitFor(
      [&] {
        Result<json> pods = cluster().GetJson({"pods", "-n", "kwok-deploy", "-l", "app=web"});
        if (!pods.ok()) return false;
        int running = 0;
        for (const json& p : (*pods)["items"]) {
          const std::string node = p["spec"].value("nodeName", "");
          if (p["status"].value("phase", "") == "Running" && node.starts_with("gpu-node-")) {
            ++running;
          }
        }
        last = pods->dump();
        return running == 3;
      },
      seconds(60), "3 Running pods of deployment web");
  EXPECT_TRUE(all_running.ok()) << all_running.ToString() << "\nlast seen: " << last;
  EXPECT_OK(cluster().WaitFor(
      [&] {
        Result<json> d = cluster().GetJson({"deployment", "web", "-n", "kwok-deploy"});
        return d.ok() && (*d)["status"].value("readyReplicas", 0) == 3;
      },
      seconds(60), "deployment web to report 3 ready replicas"));
  MustKubectl({"delete", "namespace", "kwok-deploy", "--wait=false"});
}

TEST_F(KubeClusterTest, RbacForbidsAServiceAccountWhatItWasNotGranted) {
  MustKubectl({"create", "namespace", "rbac-test"});
  MustKubectl({"create", "serviceaccount", "reader", "-n", "rbac-test"});
  MustKubectl({"create", "secret", "generic", "s", "-n", "rbac-test", "--from-literal=k=v"});
  MustKubectl({"create", "role", "configmap-reader", "-n", "rbac-test", "--verb=get,list",
               "--resource=configmaps"});
  MustKubectl({"create", "rolebinding", "reader", "-n", "rbac-test", "--role=configmap-reader",
               "--serviceaccount=rbac-test:reader"});
  Result<std::string> kubeconfig = cluster().ServiceAccountKubeconfig("rbac-test", "reader");
  ASSERT_OK(kubeconfig);
  auto kubectl_as_reader = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {cluster().Tool("kubectl"), "--kubeconfig=" + *kubeconfig};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProgram(argv, {"HOME=" + cluster().dir()}, "", cluster().dir(), seconds(60));
  };
  // The token authenticates (what it was granted works)...
  KubectlResult granted = kubectl_as_reader({"get", "configmaps", "-n", "rbac-test"});
  EXPECT_EQ(granted.exit_code, 0) << granted.Describe();
  KubectlResult whoami = kubectl_as_reader({"auth", "whoami", "-o", "json"});
  EXPECT_EQ(whoami.exit_code, 0) << whoami.Describe();
  EXPECT_NE(whoami.out.find("system:serviceaccount:rbac-test:reader"), std::string::npos)
      << whoami.out;
  // ...and RBAC refuses the rest.
  KubectlResult secrets = kubectl_as_reader({"get", "secrets", "-n", "rbac-test"});
  EXPECT_NE(secrets.exit_code, 0) << secrets.out;
  EXPECT_NE(secrets.err.find("forbidden"), std::string::npos) << secrets.Describe();
  KubectlResult can_i = kubectl_as_reader({"auth", "can-i", "list", "secrets", "-n", "rbac-test"});
  EXPECT_EQ(can_i.out.substr(0, 2), "no") << can_i.Describe();
  // The admin may.
  EXPECT_EQ(MustKubectl({"auth", "can-i", "list", "secrets", "-n", "rbac-test"}).substr(0, 3),
            "yes");
}

TEST_F(KubeClusterTest, RestartApiServerKeepsObjects) {
  MustKubectl({"create", "namespace", "restart-test"});
  MustKubectl({"create", "configmap", "kept", "-n", "restart-test", "--from-literal=key=value"});
  const std::string server = cluster().server();
  ASSERT_OK(cluster().RestartApiServer());
  EXPECT_EQ(cluster().server(), server);
  Result<json> cm = cluster().GetJson({"configmap", "kept", "-n", "restart-test"});
  ASSERT_OK(cm);
  EXPECT_EQ((*cm)["data"].value("key", ""), "value");
  // The controllers reconnected: a namespace created now gets its default
  // ServiceAccount from the controller manager.
  MustKubectl({"create", "namespace", "after-restart"});
  EXPECT_OK(cluster().WaitFor(
      [&] {
        return cluster().GetJson({"serviceaccount", "default", "-n", "after-restart"}).ok();
      },
      seconds(60), "the default ServiceAccount of a namespace created after the restart"));
}

// A pod of image granary/test that runs granary-cachenode as a DaemonSet's pod
// would: its configuration from a ConfigMap mounted at a path that does not
// exist on this host, the node id from the downward API through $(NODE_NAME),
// its data directory and SQLite store on host paths.
TEST_F(KubeClusterTest, PodRunnerRunsAGranaryPodFromItsSpecAndStopsItWhenDeleted) {
  PodRunner runner(cluster(), RunnerOptions());
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);

  TempDir host;  // the "node's" host paths
  ASSERT_EQ(::mkdir(host.Join("nvme").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(host.Join("store").c_str(), 0755), 0);
  const uint16_t listen_port = FreeTcpPort();
  const uint16_t metrics_port = FreeTcpPort();
  const std::string config =
      "pool: default\n"
      "listen: 127.0.0.1:" +
      std::to_string(listen_port) +
      "\n"
      "metrics_listen: 127.0.0.1:" +
      std::to_string(metrics_port) +
      "\n"
      "data_dir: /var/lib/granary-kube-test/data\n"
      "capacity: 64MiB\n"
      "metadata_store: sqlite:///var/lib/granary-kube-test/store/granary.db\n"
      "heartbeat_interval: 1s\n"
      "serve_without_authentication: true\n";  // loopback, one test
  const std::string mount_dir = "/etc/granary-kube-test";
  ASSERT_FALSE(std::filesystem::exists(mount_dir)) << "left over by an earlier run: " << mount_dir;

  MustKubectl({"create", "namespace", "granary-test"});
  MustKubectl({"create", "configmap", "cachenode", "-n", "granary-test",
               "--from-literal=cachenode.yaml=" + config});
  MustKubectl({"create", "secret", "generic", "token", "-n", "granary-test",
               "--from-literal=value=s3cret"});
  const json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "cachenode"}, {"labels", {{"app", "granary-cachenode"}}}}},
      {"spec",
       {{"nodeSelector", {{"kubernetes.io/hostname", "gpu-node-1"}}},
        {"terminationGracePeriodSeconds", 5},
        {"containers",
         {{{"name", "cachenode"},
           {"image", "granary/test:dev"},
           {"command", {"/usr/bin/granary-cachenode"}},
           {"args", {"--config", mount_dir + "/cachenode.yaml", "--node-id", "$(NODE_NAME)"}},
           {"env",
            {{{"name", "NODE_NAME"},
              {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
             {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}},
             {{"name", "TOKEN"},
              {"valueFrom", {{"secretKeyRef", {{"name", "token"}, {"key", "value"}}}}}},
             {{"name", "GREETING"}, {"value", "hello $(NODE_NAME)"}}}},
           {"volumeMounts",
            {{{"name", "config"}, {"mountPath", mount_dir}, {"readOnly", true}},
             {{"name", "nvme"}, {"mountPath", "/var/lib/granary-kube-test/data"}},
             {{"name", "store"}, {"mountPath", "/var/lib/granary-kube-test/store"}}}}}}},
        {"volumes",
         {{{"name", "config"}, {"configMap", {{"name", "cachenode"}}}},
          {{"name", "nvme"}, {"hostPath", {{"path", host.Join("nvme")}}}},
          {{"name", "store"}, {"hostPath", {{"path", host.Join("store")}}}}}}}}};
  MustKubectl({"apply", "-n", "granary-test", "-f", "-"}, pod.dump());

  ASSERT_OK(runner.WaitForRunning(PodRunner::Pod("granary-test", "cachenode"), 1, seconds(60)));
  std::vector<RunningContainer> running = runner.Running();
  ASSERT_EQ(running.size(), 1u);
  const RunningContainer& c = running[0];
  EXPECT_EQ(c.node, "gpu-node-1");
  EXPECT_EQ(c.container, "cachenode");
  EXPECT_EQ(c.labels.at("app"), "granary-cachenode");

  // The daemon really runs from the mounted configuration: it serves
  // /readyz on the port the ConfigMap names, and its chunk store and SQLite
  // store are in the host paths.
  EXPECT_TRUE(WaitFor(
      [&] {
        KubectlResult curl = RunProgram(
            {"curl", "-sf", "http://127.0.0.1:" + std::to_string(metrics_port) + "/readyz"}, {}, "",
            host.path(), seconds(5));
        return curl.exit_code == 0;
      },
      seconds(60), milliseconds(200)))
      << runner.EventLog();
  EXPECT_TRUE(std::filesystem::exists(host.Join("store/granary.db")));
  // Through the process's own root (its mount namespace) the ConfigMap's file
  // is at the pod spec's path; on the host the mount point is empty.
  const std::string proc_root = "/proc/" + std::to_string(c.pid) + "/root";
  EXPECT_EQ(ReadAll(proc_root + mount_dir + "/cachenode.yaml"), config);
  EXPECT_TRUE(std::filesystem::is_directory(mount_dir));
  EXPECT_TRUE(std::filesystem::is_empty(mount_dir));
  // The environment is the pod's, resolved.
  std::string environ = ReadProcFile(c.pid, "environ");
  for (char& ch : environ) {
    if (ch == '\0') ch = '\n';
  }
  for (const char* want : {"NODE_NAME=gpu-node-1\n", "POD_IP=127.0.0.1\n", "TOKEN=s3cret\n",
                           "GREETING=hello gpu-node-1\n", "HOSTNAME=cachenode\n"}) {
    EXPECT_NE(environ.find(want), std::string::npos) << want << " in\n" << environ;
  }
  // $(NODE_NAME) in args was expanded too.
  std::string cmdline = ReadProcFile(c.pid, "cmdline");
  for (char& ch : cmdline) {
    if (ch == '\0') ch = ' ';
  }
  EXPECT_NE(cmdline.find("--node-id gpu-node-1"), std::string::npos) << cmdline;

  // A crash is restarted (restartPolicy Always).
  ASSERT_EQ(::kill(c.pid, SIGKILL), 0);
  EXPECT_OK(runner.WaitForRunning(
      [&](const RunningContainer& r) { return r.pod == "cachenode" && r.restarts == 1; }, 1,
      seconds(30)));

  // Deleting the pod stops the process (SIGTERM: a clean exit) and removes
  // the mount point this runner created.
  MustKubectl({"delete", "pod", "cachenode", "-n", "granary-test", "--wait=false"});
  EXPECT_OK(runner.WaitFor([](const std::vector<RunningContainer>& r) { return r.empty(); },
                           seconds(30), "the deleted pod's process to stop"));
  bool stopped_cleanly = false;
  for (const ContainerExit& e : runner.Exits()) {
    if (e.pod == "cachenode" && e.stopped) stopped_cleanly = e.exited && e.code == 0;
  }
  EXPECT_TRUE(stopped_cleanly) << runner.EventLog();
  EXPECT_FALSE(std::filesystem::exists(mount_dir));
}

// A pod as the webhook makes them: an init container that runs to completion
// first, then a native sidecar (an init container with restartPolicy:
// Always) that keeps running next to a main container of another image,
// which is left to kwok.
TEST_F(KubeClusterTest, PodRunnerRunsInitContainersInOrderAndNativeSidecars) {
  PodRunner runner(cluster(), RunnerOptions());
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);
  TempDir host;
  const uint16_t metrics_port = FreeTcpPort();
  const std::string config = "listen: 127.0.0.1:" + std::to_string(FreeTcpPort()) +
                             "\nmetrics_listen: 127.0.0.1:" + std::to_string(metrics_port) +
                             "\ndata_dir: " + host.Join("data") +
                             "\ncapacity: 64MiB\nmetadata_store: sqlite://" +
                             host.Join("granary.db") + "\nserve_without_authentication: true\n";
  MustKubectl({"create", "namespace", "sidecars"});
  MustKubectl(
      {"create", "configmap", "node", "-n", "sidecars", "--from-literal=cachenode.yaml=" + config});
  const json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "trainer"}, {"namespace", "sidecars"}}},
      {"spec",
       {{"nodeName", "gpu-node-1"},
        {"terminationGracePeriodSeconds", 5},
        {"initContainers",
         {{{"name", "first"}, {"image", "granary/test:dev"}, {"command", {"granary", "--help"}}},
          {{"name", "sidecar"},
           {"image", "granary/test:dev"},
           {"restartPolicy", "Always"},
           {"command", {"granary-cachenode", "--config", "/etc/node/cachenode.yaml"}},
           {"volumeMounts", {{{"name", "config"}, {"mountPath", "/etc/node"}}}}}}},
        {"containers", {{{"name", "train"}, {"image", "pytorch/pytorch:2.5.1"}}}},
        {"volumes", {{{"name", "config"}, {"configMap", {{"name", "node"}}}}}}}}};
  MustKubectl({"apply", "-f", "-"}, pod.dump());
  ASSERT_OK(runner.WaitForRunning(
      [](const RunningContainer& r) { return r.pod == "trainer" && r.container == "sidecar"; }, 1,
      seconds(60)));
  // "first" ended (successfully) before the sidecar started; "train" never ran.
  std::vector<ContainerExit> exits = runner.Exits();
  ASSERT_EQ(exits.size(), 1u) << runner.EventLog();
  EXPECT_EQ(exits[0].container, "first");
  EXPECT_TRUE(exits[0].exited && exits[0].code == 0) << exits[0].status;
  std::vector<RunningContainer> running = runner.Running();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_TRUE(running[0].init);
  EXPECT_TRUE(WaitFor(
      [&] {
        return RunProgram(
                   {"curl", "-sf", "http://127.0.0.1:" + std::to_string(metrics_port) + "/readyz"},
                   {}, "", host.path(), seconds(5))
                   .exit_code == 0;
      },
      seconds(60), milliseconds(200)))
      << runner.EventLog();
  MustKubectl({"delete", "pod", "trainer", "-n", "sidecars", "--wait=false"});
  EXPECT_OK(runner.WaitFor([](const std::vector<RunningContainer>& r) { return r.empty(); },
                           seconds(30), "the sidecar to stop"));
}

// Pods of other images, and Granary pods on nodes the runner does not serve,
// are not run.
TEST_F(KubeClusterTest, PodRunnerLeavesOtherPodsToKwok) {
  PodRunner runner(cluster(), RunnerOptions());
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);
  MustKubectl({"create", "namespace", "others"});
  MustKubectl({"run", "busybox", "-n", "others", "--image=busybox:1.36",
               "--overrides={\"spec\":{\"nodeName\":\"gpu-node-1\"}}", "--command", "--", "granary",
               "--help"});
  MustKubectl({"run", "elsewhere", "-n", "others", "--image=granary/test:dev",
               "--overrides={\"spec\":{\"nodeName\":\"gpu-node-2\"}}", "--command", "--", "granary",
               "--help"});
  MustKubectl({"run", "help", "-n", "others", "--image=granary/test:dev", "--restart=Never",
               "--overrides={\"spec\":{\"nodeName\":\"gpu-node-1\"}}", "--command", "--", "granary",
               "--help"});
  // The granary/test pod on gpu-node-1 runs to completion (restartPolicy Never)...
  EXPECT_OK(runner.WaitFor(
      [&](const std::vector<RunningContainer>&) {
        for (const ContainerExit& e : runner.Exits()) {
          if (e.pod == "help") return true;
        }
        return false;
      },
      seconds(60), "granary --help to run"));
  for (const ContainerExit& e : runner.Exits()) {
    if (e.pod != "help") continue;
    EXPECT_TRUE(e.exited && e.code == 0) << e.status << " " << ReadAll(e.log_path);
    EXPECT_FALSE(ReadAll(e.log_path).empty());
  }
  // ...and nothing else was ever run; kwok reports the busybox pod Running.
  for (const ContainerExit& e : runner.Exits()) EXPECT_EQ(e.pod, "help");
  EXPECT_TRUE(runner.Running().empty());
  EXPECT_OK(cluster().WaitFor(
      [&] {
        Result<json> p = cluster().GetJson({"pod", "busybox", "-n", "others"});
        return p.ok() && (*p)["status"].value("phase", "") == "Running";
      },
      seconds(60), "kwok to report the busybox pod Running"));
}

// The default: kwok marks a Job's pod Succeeded as soon as it is Running,
// so the Job completes although its container (`sleep 600`, run here) has
// not ended; the runner then stops it.
TEST_F(KubeClusterTest, KwokCompletesJobPodsByDefault) {
  PodRunner runner(cluster(), JobRunnerOptions(/*report_completion=*/false));
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);
  MustKubectl({"create", "namespace", "kwok-jobs"});
  const json job =
      Job("sleeper",
          {{{"name", "train"}, {"image", "pytorch/pytorch:2.5.1"}, {"command", {"sleep", "600"}}}});
  MustKubectl({"apply", "-n", "kwok-jobs", "-f", "-"}, job.dump());
  json last;
  Status completed =
      cluster().WaitFor([&] { return JobHasCondition("kwok-jobs", "sleeper", "Complete", &last); },
                        seconds(60), "kwok to complete Job sleeper");
  EXPECT_TRUE(completed.ok()) << completed.ToString() << "\n" << last.dump(2);
  EXPECT_EQ(last["status"].value("succeeded", 0), 1) << last.dump(2);
  // Whatever of it ran here was stopped, long before `sleep 600` could end.
  EXPECT_OK(runner.WaitFor(
      [](const std::vector<RunningContainer>& r) {
        return std::none_of(r.begin(), r.end(), [](const RunningContainer& c) {
          return c.pod.starts_with("sleeper-");
        });
      },
      seconds(30), "the completed Job's container to stop"));
  for (const ContainerExit& e : runner.Exits()) {
    if (e.pod.starts_with("sleeper-")) {
      EXPECT_TRUE(e.stopped) << e.status;
    }
  }
}

// A cluster whose kwok does not complete Job pods: their end is what the
// runner reports.
class KubeClusterJobTest : public KubeClusterTest {
 protected:
  static void SetUpTestSuite() {
    KubeClusterOptions options;
    options.kwok_completes_job_pods = false;
    StartSuiteCluster(std::move(options));
  }
};

// kwok's own stages still make pods Running and Ready, and delete them; a
// Job's pod that nobody runs stays Running and its Job active.
TEST_F(KubeClusterJobTest, KwokKeepsJobPodsRunningWithoutItsCompleteStage) {
  MustKubectl({"create", "namespace", "job-kwok"});
  const json job = Job("elsewhere", {{{"name", "train"}, {"image", "nginx:1.27"}}});
  MustKubectl({"apply", "-n", "job-kwok", "-f", "-"}, job.dump());
  std::string pod_name;
  json pod;
  Status running = cluster().WaitFor(
      [&] {
        pod = JobPod("job-kwok", "elsewhere");
        if (pod.empty()) return false;
        pod_name = pod["metadata"].value("name", "");
        bool ready = false;
        for (const json& c : pod["status"].value("conditions", json::array())) {
          if (c.value("type", "") == "Ready") ready = c.value("status", "") == "True";
        }
        return pod["status"].value("phase", "") == "Running" && ready;
      },
      seconds(60), "kwok to report the Job's pod Running and Ready");
  ASSERT_TRUE(running.ok()) << running.ToString() << "\n" << pod.dump(2);
  // Given time in which the default stages complete it (well under a second
  // in KwokCompletesJobPodsByDefault), it stays Running.
  std::this_thread::sleep_for(seconds(3));
  pod = JobPod("job-kwok", "elsewhere");
  EXPECT_EQ(pod["status"].value("phase", ""), "Running") << pod.dump(2);
  json last;
  EXPECT_FALSE(JobHasCondition("job-kwok", "elsewhere", "Complete", &last)) << last.dump(2);
  EXPECT_EQ(last["status"].value("active", 0), 1) << last.dump(2);
  // The "delete" stage: a deleted pod goes (the Job controller then makes
  // another one).
  MustKubectl({"delete", "pod", pod_name, "-n", "job-kwok", "--wait=false"});
  EXPECT_OK(cluster().WaitFor(
      [&] {
        return !cluster().GetJson({"pod", pod_name, "-n", "job-kwok"}).ok();
      },
      seconds(60), "the deleted pod to be gone"));
  MustKubectl({"delete", "namespace", "job-kwok", "--wait=false"});
}

// A Job whose container really runs (sh, for 2 s) and exits 0: its pod is
// Succeeded only once the process has ended, and the Job completes.
TEST_F(KubeClusterJobTest, JobCompletesWhenItsContainerExitsZero) {
  PodRunner runner(cluster(), JobRunnerOptions(/*report_completion=*/true));
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);
  MustKubectl({"create", "namespace", "job-ok"});
  const json job = Job("train", {{{"name", "train"},
                                  {"image", "pytorch/pytorch:2.5.1"},
                                  {"command", {"sh", "-c", "sleep 2; echo trained"}}}});
  MustKubectl({"apply", "-n", "job-ok", "-f", "-"}, job.dump());
  ASSERT_OK(runner.WaitForRunning(
      [](const RunningContainer& r) { return r.ns == "job-ok" && r.container == "train"; }, 1,
      seconds(60)));
  json last;
  EXPECT_FALSE(JobHasCondition("job-ok", "train", "Complete", &last))
      << "the Job completed while its container runs: " << last.dump(2);
  Status completed =
      cluster().WaitFor([&] { return JobHasCondition("job-ok", "train", "Complete", &last); },
                        seconds(60), "Job train to complete");
  EXPECT_TRUE(completed.ok()) << completed.ToString() << "\n"
                              << last.dump(2) << "\n"
                              << runner.EventLog();
  EXPECT_EQ(last["status"].value("succeeded", 0), 1) << last.dump(2);
  EXPECT_EQ(last["status"].value("failed", 0), 0) << last.dump(2);
  const std::vector<ContainerExit> exits = runner.Exits();
  ASSERT_EQ(exits.size(), 1u) << runner.EventLog();
  EXPECT_TRUE(exits[0].exited && exits[0].code == 0 && !exits[0].stopped) << exits[0].status;
  EXPECT_NE(ReadAll(exits[0].log_path).find("trained"), std::string::npos);
  const json pod = JobPod("job-ok", "train");
  EXPECT_EQ(pod["status"].value("phase", ""), "Succeeded") << pod.dump(2);
  const json terminated = Terminated(pod, "containerStatuses", "train");
  ASSERT_TRUE(terminated.is_object()) << pod.dump(2);
  EXPECT_EQ(terminated.value("exitCode", -1), 0);
  EXPECT_EQ(terminated.value("reason", ""), "Completed");
  MustKubectl({"delete", "namespace", "job-ok", "--wait=false"});
}

// A container that exits 1 (`false`) under restartPolicy Never: the pod is
// Failed, and the Job (backoffLimit 0) fails.
TEST_F(KubeClusterJobTest, JobFailsWhenItsContainerExitsNonZero) {
  PodRunner runner(cluster(), JobRunnerOptions(/*report_completion=*/true));
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);
  MustKubectl({"create", "namespace", "job-fail"});
  const json job = Job(
      "broken", {{{"name", "train"}, {"image", "pytorch/pytorch:2.5.1"}, {"command", {"false"}}}});
  MustKubectl({"apply", "-n", "job-fail", "-f", "-"}, job.dump());
  json last;
  Status failed =
      cluster().WaitFor([&] { return JobHasCondition("job-fail", "broken", "Failed", &last); },
                        seconds(60), "Job broken to fail");
  EXPECT_TRUE(failed.ok()) << failed.ToString() << "\n"
                           << last.dump(2) << "\n"
                           << runner.EventLog();
  EXPECT_EQ(last["status"].value("failed", 0), 1) << last.dump(2);
  EXPECT_EQ(last["status"].value("succeeded", 0), 0) << last.dump(2);
  EXPECT_FALSE(JobHasCondition("job-fail", "broken", "Complete", &last)) << last.dump(2);
  const std::vector<ContainerExit> exits = runner.Exits();
  ASSERT_EQ(exits.size(), 1u) << runner.EventLog();
  EXPECT_TRUE(exits[0].exited && exits[0].code == 1) << exits[0].status;
  const json pod = JobPod("job-fail", "broken");
  EXPECT_EQ(pod["status"].value("phase", ""), "Failed") << pod.dump(2);
  const json terminated = Terminated(pod, "containerStatuses", "train");
  ASSERT_TRUE(terminated.is_object()) << pod.dump(2);
  EXPECT_EQ(terminated.value("exitCode", -1), 1);
  EXPECT_EQ(terminated.value("reason", ""), "Error");
  // Not restarted: restartPolicy Never.
  EXPECT_TRUE(runner.Running().empty());
  MustKubectl({"delete", "namespace", "job-fail", "--wait=false"});
}

// The pod the webhook makes of a training Job: a native sidecar (an init
// container with restartPolicy Always, here `sleep 600`) next to the app.
// When the app exits the sidecar is stopped, and the Job completes.
TEST_F(KubeClusterJobTest, JobWithANativeSidecarCompletesWhenTheAppExits) {
  PodRunner runner(cluster(), JobRunnerOptions(/*report_completion=*/true));
  Status started = runner.Start();
  if (started.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << started.ToString();
  ASSERT_OK(started);
  MustKubectl({"create", "namespace", "job-sidecar"});
  const json job = Job("train",
                       {{{"name", "train"},
                         {"image", "pytorch/pytorch:2.5.1"},
                         {"command", {"sh", "-c", "sleep 2"}}}},
                       {{{"name", "granary-sidecar"},
                         {"image", "busybox:1.36"},
                         {"restartPolicy", "Always"},
                         {"command", {"sleep", "600"}}}});
  MustKubectl({"apply", "-n", "job-sidecar", "-f", "-"}, job.dump());
  // Both run at once.
  ASSERT_OK(runner.WaitForRunning(PodRunner::InNamespace("job-sidecar"), 2, seconds(60)));
  json last;
  Status completed =
      cluster().WaitFor([&] { return JobHasCondition("job-sidecar", "train", "Complete", &last); },
                        seconds(60), "Job train to complete");
  EXPECT_TRUE(completed.ok()) << completed.ToString() << "\n"
                              << last.dump(2) << "\n"
                              << runner.EventLog();
  EXPECT_EQ(last["status"].value("succeeded", 0), 1) << last.dump(2);
  EXPECT_TRUE(runner.Running().empty());
  // The app ended by itself, then the sidecar was stopped (SIGTERM).
  const std::vector<ContainerExit> exits = runner.Exits();
  ASSERT_EQ(exits.size(), 2u) << runner.EventLog();
  EXPECT_EQ(exits[0].container, "train");
  EXPECT_TRUE(exits[0].exited && exits[0].code == 0 && !exits[0].stopped) << exits[0].status;
  EXPECT_EQ(exits[1].container, "granary-sidecar");
  EXPECT_TRUE(exits[1].stopped) << exits[1].status;
  EXPECT_FALSE(exits[1].exited) << exits[1].status;  // sleep dies of SIGTERM
  const json pod = JobPod("job-sidecar", "train");
  EXPECT_EQ(pod["status"].value("phase", ""), "Succeeded") << pod.dump(2);
  const json app = Terminated(pod, "containerStatuses", "train");
  ASSERT_TRUE(app.is_object()) << pod.dump(2);
  EXPECT_EQ(app.value("exitCode", -1), 0);
  const json sidecar = Terminated(pod, "initContainerStatuses", "granary-sidecar");
  ASSERT_TRUE(sidecar.is_object()) << pod.dump(2);
  EXPECT_EQ(sidecar.value("exitCode", -1), 128 + SIGTERM);
  MustKubectl({"delete", "namespace", "job-sidecar", "--wait=false"});
}

}  // namespace
}  // namespace granary::testing

#include "testing/kube_suite.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <iostream>
#include <regex>

#include "granary/core/file.h"
#include "granary/kube/base64.h"
#include "granary/store/open_store.h"

namespace granary::testing {

using nlohmann::json;
using std::chrono::seconds;

std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string ConditionField(const json& object, const std::string& type, const std::string& field) {
  for (const json& c : object.value("status", json::object()).value("conditions", json::array())) {
    if (c.value("type", "") == type) return c.value(field, "");
  }
  return "";
}

KubeSuite::KubeSuite(KubeSuiteOptions options) : options_(std::move(options)) {
  ::chmod(dir_.path().c_str(), 0755);
}

KubeSuite::~KubeSuite() {
  // The operators first (they write to the store and the API server), then the
  // cache node, then the store and the control plane under them.
  operators_.clear();
  runner_.reset();
  redis_.reset();
  cluster_.reset();
}

Status KubeSuite::Start() {
  KubeClusterOptions o;
  o.nodes.clear();
  for (int i = 1; i <= options_.pool_nodes + 1; ++i) {
    FakeNode node{"gpu-node-" + std::to_string(i), {{"nvidia.com/gpu.present", "true"}}};
    if (i <= options_.pool_nodes) node.labels["granary.io/nvme"] = "true";
    o.nodes.push_back(std::move(node));
  }
  o.nodes.insert(o.nodes.end(), options_.extra_nodes.begin(), options_.extra_nodes.end());
  o.start_timeout = options_.cluster_start_timeout;
  o.kwok_completes_job_pods = !options_.run_jobs;
  GRANARY_ASSIGN_OR_RETURN(cluster_, KubeCluster::Start(o));
  GRANARY_ASSIGN_OR_RETURN(redis_, RedisServer::Start());
  GRANARY_RETURN_IF_ERROR(ApplyCrdsPolicyAndNamespaces());
  PodRunnerOptions ro;
  ro.images = options_.extra_images;
  ro.images["granary"] = options_.pod_bin_dir;
  ro.nodes = {"gpu-node-1"};
  ro.report_completion = options_.run_jobs;
  runner_ = std::make_unique<PodRunner>(*cluster_, ro);
  GRANARY_RETURN_IF_ERROR(runner_->Start());
  GRANARY_RETURN_IF_ERROR(StartOperator(options_.operator_flags));
  return ApplyPoolAndWaitReady();
}

Status KubeSuite::ApplyCrdsPolicyAndNamespaces() {
  const std::string& root = options_.source_dir;
  KubectlResult r =
      cluster_->Kubectl({"apply", "--server-side", "-f", root + "/charts/granary/crds/"});
  if (!r.ok()) return Status::Internal("applying the CRDs: " + r.Describe());
  r = cluster_->Kubectl({"wait", "--for=condition=established", "--timeout=60s",
                         "crd/datasets.granary.io", "crd/cachepools.granary.io"});
  if (!r.ok()) return Status::Internal("CRDs not established: " + r.Describe());
  r = cluster_->Kubectl({"apply", "-f", root + "/charts/granary/policies/dataset-identity.yaml"});
  if (!r.ok()) return Status::Internal("applying the identity policy: " + r.Describe());
  // The example namespaces, with the store Secret naming the test's Redis.
  r = cluster_->Kubectl({"apply", "--validate=strict", "-f", "-"},
                        ExampleNamespaces(root, redis_->url()));
  if (!r.ok()) return Status::Internal("applying namespace.yaml: " + r.Describe());
  // What the chart's cachenode-rbac.yaml makes: the cache nodes' account,
  // which may create TokenReviews (they check the sidecars' tokens).
  r = cluster_->Kubectl({"apply", "--validate=strict", "-f", "-"}, R"(apiVersion: v1
kind: ServiceAccount
metadata: {name: granary-cachenode, namespace: granary}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: granary-cachenode}
rules:
  - {apiGroups: [authentication.k8s.io], resources: [tokenreviews], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: granary-cachenode}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: granary-cachenode}
subjects: [{kind: ServiceAccount, name: granary-cachenode, namespace: granary}]
)");
  if (!r.ok()) return Status::Internal("applying the cache nodes' RBAC: " + r.Describe());
  return Status::Ok();
}

Status KubeSuite::ApplyPoolAndWaitReady() {
  std::filesystem::create_directories(datasets());
  ::chmod(datasets().c_str(), 0755);
  std::filesystem::create_directories(node_socket_dir());
  ::chmod(node_socket_dir().c_str(), 0755);
  data_port_ = FreeTcpPort();
  metrics_port_ = FreeTcpPort();
  sidecar_metrics_port_ = FreeTcpPort();
  std::string pool = ReadAll(options_.source_dir + "/examples/kubernetes/cachepool.yaml");
  pool = ReplaceAll(pool, "/nvme/granary", nvme());
  pool = ReplaceAll(pool, "/mnt/datasets", datasets());
  pool = ReplaceAll(pool, "data: 7070", "data: " + std::to_string(data_port_));
  pool = ReplaceAll(pool, "metrics: 9464", "metrics: " + std::to_string(metrics_port_));
  pool = ReplaceAll(pool, "metricsPort: 9465",
                    "metricsPort: " + std::to_string(sidecar_metrics_port_));
  pool = ReplaceAll(pool, "/var/run/granary/gpu", node_socket_dir());
  if (options_.transport == "libfabric") {
    fabric_port_ = FreeTcpPort();
    const std::string tcp = "\n  transport: tcp\n";
    if (pool.find(tcp) == std::string::npos) {
      return Status::Internal(
          "examples/kubernetes/cachepool.yaml has no 'transport: tcp' line "
          "to make a libfabric pool of");
    }
    pool = ReplaceAll(pool, tcp,
                      "\n  transport: libfabric\n  libfabric:\n    provider: tcp\n    port: " +
                          std::to_string(fabric_port_) + "\n");
  }
  KubectlResult r = cluster_->Kubectl({"apply", "--validate=strict", "-f", "-"}, pool);
  if (!r.ok()) return Status::Internal("applying cachepool.yaml: " + r.Describe());
  GRANARY_RETURN_IF_ERROR(
      runner_->WaitForRunning(PodRunner::InNamespace("granary"), 1, options_.pool_ready_timeout));
  Status ready = cluster_->WaitFor(
      [&] {
        Result<json> p = cluster_->GetJson({"cachepool", "gpu"});
        return p.ok() && ConditionField(*p, "Ready") == "True" &&
               p->value("status", json::object()).value("capacityBytes", uint64_t{0}) > 0;
      },
      options_.pool_ready_timeout, "CachePool gpu Ready with its node registered");
  if (!ready.ok()) {
    return Status(
        ready.code(),
        ready.message() + "\n" + cluster_->Kubectl({"get", "cachepool", "gpu", "-o", "yaml"}).out);
  }
  return Status::Ok();
}

Status KubeSuite::StartOperator(const std::vector<std::string>& extra) {
  DaemonProcessOptions o;
  o.binary = options_.operator_binary;
  o.name = "operator-" + std::to_string(++operator_count_);
  o.log_path = dir_.Join(o.name + ".log");
  o.args = {"--kubeconfig=" + cluster_->kubeconfig_path(),
            "--namespace=granary",
            "--identity=" + o.name,
            "--metrics-listen=127.0.0.1:0",
            "--progress-interval=300ms",
            "--lease-duration=4s",
            "--renew-deadline=3s",
            "--retry-period=500ms",
            "--log-level=debug"};
  o.args.insert(o.args.end(), extra.begin(), extra.end());
  GRANARY_ASSIGN_OR_RETURN(auto p, DaemonProcess::Start(o));
  operators_.push_back(std::move(p));
  return Status::Ok();
}

Result<std::string> KubeSuite::ClusterKeyFile() const {
  GRANARY_ASSIGN_OR_RETURN(json secret,
                           cluster_->GetJson({"secret", "-n", "granary", "granary-cluster-key"}));
  const std::string encoded = secret.value("data", json::object()).value("key", "");
  GRANARY_ASSIGN_OR_RETURN(std::string key, kube::Base64Decode(encoded, "the cluster key"));
  const std::string path = dir_.Join("cluster.key");
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(path, key, 0600));
  return path;
}

Result<std::unique_ptr<MetadataStore>> KubeSuite::Store() const {
  return OpenMetadataStore(redis_->url());
}

void KubeSuite::WriteSource(const std::string& rel,
                            const std::vector<std::pair<std::string, std::string>>& files) const {
  const std::filesystem::path top = std::filesystem::path(datasets()) / rel;
  for (const auto& [path, bytes] : files) {
    const std::filesystem::path full = top / path;
    std::filesystem::create_directories(full.parent_path());
    WriteAll(full.string(), bytes);
    ::chmod(full.c_str(), 0644);
  }
  // Every directory from datasets() down, so the tree's users can walk to it.
  for (std::filesystem::path p = top; p.string().size() >= datasets().size(); p = p.parent_path()) {
    ::chmod(p.c_str(), 0755);
    if (p.string() == datasets()) break;
  }
  for (const auto& e : std::filesystem::recursive_directory_iterator(top)) {
    if (e.is_directory()) ::chmod(e.path().c_str(), 0755);
  }
}

std::string KubeSuite::DatasetYaml(const std::string& ns, const std::string& name,
                                   const std::string& source, const std::string& extra) {
  return "apiVersion: granary.io/v1alpha1\nkind: Dataset\nmetadata: {name: " + name +
         ", namespace: " + ns + "}\nspec:\n  cachePool: gpu\n  source: " + source +
         "\n  chunkSize: 64Ki\n  runAs: {uid: 1000, gid: 1000}\n" + extra;
}

json KubeSuite::TrainingJob(const std::string& ns, const std::string& name,
                            const std::string& dataset, const std::string& golden,
                            uint16_t sidecar_metrics_port, const std::string& python_path) {
  const json trainer = {
      {"name", "trainer"},
      {"image", "pytorch/pytorch:2.5.1"},
      {"command", {"/usr/bin/python3", "/app/train.py"}},
      {"args",
       {"--golden=/golden", "--epochs=2", "--compare-local",
        "--metrics-port=" + std::to_string(sidecar_metrics_port)}},
      {"env", json::array({{{"name", "PYTHONPATH"}, {"value", python_path}},
                           {{"name", "PYTHONDONTWRITEBYTECODE"}, {"value", "1"}}})},
      {"volumeMounts",
       json::array({{{"name", "script"}, {"mountPath", "/app"}},
                    {{"name", "golden"}, {"mountPath", "/golden"}, {"readOnly", true}}})}};
  const json volumes =
      json::array({{{"name", "script"}, {"configMap", {{"name", "train-script"}}}},
                   {{"name", "golden"}, {"hostPath", {{"path", golden}, {"type", "Directory"}}}}});
  return {{"apiVersion", "batch/v1"},
          {"kind", "Job"},
          {"metadata", {{"name", name}, {"namespace", ns}}},
          {"spec",
           {{"backoffLimit", 0},
            {"template",
             {{"metadata", {{"labels", {{"granary.io/dataset", dataset}}}}},
              {"spec",
               {{"restartPolicy", "Never"},
                {"containers", json::array({trainer})},
                {"volumes", volumes}}}}}}}};
}

std::string KubeSuite::ExampleNamespaces(const std::string& source_dir,
                                         const std::string& store_url) {
  return std::regex_replace(ReadAll(source_dir + "/examples/kubernetes/namespace.yaml"),
                            std::regex("url: \"redis://[^\"]*\""), "url: \"" + store_url + "\"");
}

json KubeSuite::RealNodeChartValues(const std::string& dir, const std::string& tag) {
  return {
      {"image", {{"tag", tag}, {"pullPolicy", "Never"}}},
      {"store", {{"existingSecret", "granary-store"}, {"existingSecretKey", "url"}}},
      {"redis", {{"enabled", false}}},
      {"operator", {{"progressInterval", "1s"}}},
      {"cachePools",
       json::array(
           {{{"name", "gpu"},
             {"spec",
              {{"nodeSelector", {{"granary.io/nvme", "true"}}},
               {"storage", {{"hostPath", dir + "/nvme"}, {"capacity", "1Gi"}}},
               {"sourceMounts",
                json::array({{{"name", "datasets"}, {"hostPath", dir + "/datasets"}}})},
               {"nodeSocketHostPath", dir + "/node-socket"},
               {"image", "granary:" + tag},
               {"imagePullPolicy", "Never"},
               {"resources", {{"requests", {{"cpu", "100m"}, {"memory", "128Mi"}}}}},
               {"sidecar",
                {{"arenaBytes", "64Mi"}, {"windowBytes", "16Mi"}, {"allowPosixView", true}}}}}}})}};
}

std::vector<std::string> KubeSuite::TrainerScriptConfigMap(const std::string& ns) {
  return {
      "create",
      "configmap",
      "train-script",
      "-n",
      ns,
      "--from-file=train.py=" + std::string(GRANARY_SOURCE_DIR) + "/tests/trainer/check_epochs.py"};
}

Result<json> KubeSuite::Dataset(const std::string& ns, const std::string& name) const {
  return cluster_->GetJson({"dataset", "-n", ns, name});
}

Status KubeSuite::WaitDatasetCondition(const std::string& ns, const std::string& name,
                                       const std::string& type, const std::string& status,
                                       const std::string& reason,
                                       std::chrono::milliseconds timeout) const {
  Status s = cluster_->WaitFor(
      [&] {
        Result<json> d = Dataset(ns, name);
        return d.ok() && ConditionField(*d, type) == status &&
               (reason.empty() || ConditionField(*d, type, "reason") == reason);
      },
      timeout, "dataset " + ns + "/" + name + " " + type + "=" + status + " " + reason);
  if (s.ok()) return s;
  return Status(s.code(), s.message() + "\n" +
                              cluster_->Kubectl({"describe", "dataset", "-n", ns, name}).out);
}

Result<std::vector<MetricSample>> KubeSuite::OperatorMetrics(const DaemonProcess& op) {
  static const std::regex address("metrics on (127\\.0\\.0\\.1:[0-9]+)");
  const std::string log = ReadAll(op.log_path());
  std::smatch m;
  if (!std::regex_search(log, m, address)) {
    return Status::NotFound("no metrics address in " + op.log_path() + " yet");
  }
  GRANARY_ASSIGN_OR_RETURN(HttpResponse r, HttpGet(m[1].str(), "/metrics"));
  if (r.status != 200) {
    return Status::Unavailable(m[1].str() + "/metrics: HTTP " + std::to_string(r.status));
  }
  return ParsePrometheusText(r.body);
}

std::string KubeSuite::OperatorLogs(size_t max_bytes_each) const {
  std::string out;
  for (const auto& p : operators_) {
    std::string log = ReadAll(p->log_path());
    if (log.size() > max_bytes_each) log = "..." + log.substr(log.size() - max_bytes_each);
    out += "---- " + p->name() + " ----\n" + log;
  }
  return out;
}

void KubeSuite::PrintLogsIfTestFailed() {
  if (!::testing::Test::HasFailure()) return;
  if (cluster_) cluster_->PrintLogsIfTestFailed();
  if (runner_) runner_->PrintLogsIfTestFailed();
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      test == nullptr ? "" : std::string(test->test_suite_name()) + "." + test->name();
  if (!operators_.empty() && operator_logs_printed_.insert(name).second) {
    std::cerr << OperatorLogs();
  }
}

}  // namespace granary::testing

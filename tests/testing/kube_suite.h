#pragma once

// KubeSuite: what a Kubernetes suite needs before its first case, started in
// one call: a real control plane (KubeCluster), a real Redis as the metadata
// store, PodRunner running the pods of Granary's images as local processes,
// granary-operator as a real process, and the example CachePool `gpu`
// (examples/kubernetes/cachepool.yaml) Ready with its one cache node
// registered.
//
//   KubeSuiteOptions o;
//   o.source_dir = GRANARY_SOURCE_DIR; o.pod_bin_dir = GRANARY_POD_BIN_DIR;
//   o.operator_binary = GRANARY_OPERATOR_BINARY;
//   KubeSuite suite(o);
//   ASSERT_OK(suite.Start());                     // ~15 s; pool Ready when it returns
//   suite.WriteSource("imagenet/train", files);   // under suite.datasets()
//   suite.cluster().MustKubectl({"apply", "-f", "-"},
//                               KubeSuite::DatasetYaml("team-a", "x", suite.datasets() + "/..."));
//   ASSERT_OK(suite.WaitDatasetCondition("team-a", "x", "Ready", "True", "", 60s));
//
// What Start applies, in order: the CRDs and the identity policy as the chart
// ships them (charts/granary/), the example namespaces (team-a, granted uid
// and gid 1000, and granary with the store Secret, its URL replaced by the
// test's Redis), then starts PodRunner and the operator (namespace granary,
// short lease and progress intervals), and applies the example pool with its
// paths and ports made this host's: the chunk store at nvme(), the one source
// mount at datasets(), free data, metrics and sidecar metrics ports, the
// handoff socket's directory at node_socket_dir(). The cluster has
// options.pool_nodes fake GPU nodes with granary.io/nvme=true and one
// without; PodRunner runs the pods of gpu-node-1 only, so the pool runs one
// real cache node (two would want the same ports on this host).
//
// Everything lives in dir(), a TempDir of mode 0755 (uid 1000, the Datasets'
// runAs, and a Slurm job's user must be able to walk to the sources).
// Destruction stops the operators, then the runner (the cache node), then
// Redis, then the cluster; if Start failed half-way, what started is stopped
// the same way, and its logs are still there for the message
// (OperatorLogs, PrintLogsIfTestFailed).
//
// Who uses it: tests/integration/kubernetes/operator_test.cc (the operator's cases:
// more replicas through StartOperator, files under dir() through WriteFile),
// mixed_site_test.cc (with a SlurmCluster on the same store and cache node)
// and training_pod_test.cc (four pool nodes, Jobs run to their end, the
// webhook through options.operator_flags).
//
// Thread safety: the test's main thread owns it. cluster(), runner() and
// redis() hand out the fixtures, whose own contracts then apply.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "granary/core/metadata_store.h"
#include "granary/core/status.h"
#include "testing/cachenode_fixture.h"
#include "testing/daemon_process.h"
#include "testing/kube_cluster.h"
#include "testing/pod_runner.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {

struct KubeSuiteOptions {
  std::string source_dir;       // the source tree: charts/granary/, examples/kubernetes/
  std::string pod_bin_dir;      // what PodRunner maps the `granary` images to
  std::string operator_binary;  // granary-operator
  std::chrono::milliseconds pool_ready_timeout{60000};
  // Pool nodes (granary.io/nvme=true): gpu-node-1..N, then one GPU node
  // outside the pool. PodRunner runs pods of gpu-node-1 only (one cache node:
  // they would all want the same ports here); kwok fakes the others.
  int pool_nodes = 1;
  // Jobs run to their end: kwok leaves Job pods to PodRunner, which writes
  // their terminal status (KubeClusterOptions::kwok_completes_job_pods,
  // PodRunnerOptions::report_completion).
  bool run_jobs = false;
  // More images PodRunner runs (prefix -> directory), e.g. a training image
  // mapped to /usr/bin so that `python3 train.py` runs.
  std::map<std::string, std::string> extra_images;
  // Flags for the first granary-operator (e.g. --webhook-*).
  std::vector<std::string> operator_flags;
  // The pool's spec.transport. "libfabric": the cache node also serves the
  // fabric (provider tcp) on a free port, spec.libfabric.port.
  std::string transport = "tcp";
  // More fake nodes kwok keeps Ready (granary-operator-load's), after those.
  std::vector<FakeNode> extra_nodes;
  // How long the control plane may take to have every node Ready.
  std::chrono::milliseconds cluster_start_timeout{120000};
};

class KubeSuite {
 public:
  explicit KubeSuite(KubeSuiteOptions options);
  ~KubeSuite();
  KubeSuite(const KubeSuite&) = delete;
  KubeSuite& operator=(const KubeSuite&) = delete;

  // Starts everything above; bounded. An error names the step and carries
  // what kubectl or the pool's status said.
  Status Start();
  // One more granary-operator replica (each has its own identity and log);
  // `extra` flags are appended.
  Status StartOperator(const std::vector<std::string>& extra = {});

  KubeCluster& cluster() const { return *cluster_; }
  RedisServer& redis() const { return *redis_; }
  PodRunner& runner() const { return *runner_; }
  const std::vector<std::unique_ptr<DaemonProcess>>& operators() const { return operators_; }

  const std::string& dir() const { return dir_.path(); }
  // dir()/<rel>.
  std::string Join(const std::string& rel) const { return dir_.Join(rel); }
  // Writes dir()/<rel>, its parent directories made as needed (modes as
  // created: for a source uid 1000 reads, WriteSource).
  void WriteFile(const std::string& rel, const std::string& contents) const {
    dir_.WriteFile(rel, contents);
  }
  // The pool's one source mount: Datasets' sources lie under it.
  std::string datasets() const { return dir_.Join("datasets"); }
  // The pool's chunk store directory.
  std::string nvme() const { return dir_.Join("nvme"); }
  uint16_t data_port() const { return data_port_; }
  // spec.libfabric.port with transport libfabric, else 0.
  uint16_t fabric_port() const { return fabric_port_; }
  // The cache node's /metrics, /healthz and /readyz: 127.0.0.1:<port>.
  std::string metrics_address() const { return "127.0.0.1:" + std::to_string(metrics_port_); }
  // The pool's nodeSocketHostPath: the cache node's chunk-handoff socket is
  // in it, and injected sidecars mount it.
  std::string node_socket_dir() const { return dir_.Join("node-socket"); }
  // The pool's spec.sidecar.metricsPort (a free port: an injected sidecar
  // listens on it on this host).
  uint16_t sidecar_metrics_port() const { return sidecar_metrics_port_; }

  // A new client of the suite's store.
  Result<std::unique_ptr<MetadataStore>> Store() const;

  // The cluster key the operator made (Secret granary-cluster-key), written
  // to a mode-0600 file of the suite's directory: what an admin passes to
  // `granary --cluster-key-file` to read from the pool's cache nodes.
  Result<std::string> ClusterKeyFile() const;

  // Writes `files` (path relative to the tree -> bytes) under
  // datasets()/<rel>, every directory on the way 0755 and every file 0644, so
  // that uid 1000 (the example namespace's grant) and any other user may read
  // them. Fails the test if a file cannot be written.
  void WriteSource(const std::string& rel,
                   const std::vector<std::pair<std::string, std::string>>& files) const;

  // The training Job the end-to-end tests and `make demo-k8s` run: Job `name`
  // in `ns`, its pod labelled granary.io/dataset=`dataset` and nothing else
  // about Granary, image pytorch/pytorch:2.5.1 (PodRunner maps "pytorch" to
  // /usr/bin) running `python3 /app/train.py` (tests/trainer/check_epochs.py,
  // from the ConfigMap train-script: MakeTrainerScript) for two epochs over
  // `golden` (a hostPath of the source), comparing with the local files and
  // checking the sidecar's handoff counters on `sidecar_metrics_port`;
  // PYTHONPATH `python_path`.
  static nlohmann::json TrainingJob(const std::string& ns, const std::string& name,
                                    const std::string& dataset, const std::string& golden,
                                    uint16_t sidecar_metrics_port, const std::string& python_path);
  // examples/kubernetes/namespace.yaml of `source_dir` (team-a granted uid
  // and gid 1000; granary with the store Secret granary-store) with the
  // Secret's URL replaced by `store_url`.
  static std::string ExampleNamespaces(const std::string& source_dir, const std::string& store_url);
  // The chart's values for a release on a real node (testing/kube_node.h):
  // the image `granary:<tag>` already on the node (pullPolicy Never), the
  // store from the Secret granary-store, no Redis of the chart's, and one
  // CachePool `gpu` on the nodes labelled granary.io/nvme=true with its
  // hostPaths under `dir` (nvme, datasets, node-socket) and the POSIX view
  // allowed.
  static nlohmann::json RealNodeChartValues(const std::string& dir, const std::string& tag);

  // `kubectl create configmap train-script -n ns` of tests/trainer/check_epochs.py
  // as train.py: the kubectl arguments.
  static std::vector<std::string> TrainerScriptConfigMap(const std::string& ns);

  // A Dataset of `ns` in pool gpu read as uid/gid 1000, chunkSize 64Ki, with
  // `extra` (indented spec lines) appended to its spec.
  static std::string DatasetYaml(const std::string& ns, const std::string& name,
                                 const std::string& source, const std::string& extra = "");
  // `kubectl get dataset -n ns name -o json`.
  Result<nlohmann::json> Dataset(const std::string& ns, const std::string& name) const;
  // Waits until the Dataset's condition `type` has `status` (and `reason`,
  // unless empty): kDeadlineExceeded with its `kubectl describe` otherwise.
  Status WaitDatasetCondition(const std::string& ns, const std::string& name,
                              const std::string& type, const std::string& status,
                              const std::string& reason, std::chrono::milliseconds timeout) const;

  // The tail of every operator replica's log, for messages.
  std::string OperatorLogs(size_t max_bytes_each = 6000) const;
  // The /metrics of operator replica `op` (its address from its log: it
  // listens on a free port), parsed. kNotFound before it logged the address.
  static Result<std::vector<MetricSample>> OperatorMetrics(const DaemonProcess& op);
  // If the current test has failed: the cluster's and the runner's logs (once
  // each, by those fixtures) and the operators' tails (once per failed test:
  // a suite that keeps one KubeSuite for its cases calls it from TearDown, and
  // may call it again from TearDownTestSuite).
  void PrintLogsIfTestFailed();

 private:
  Status ApplyCrdsPolicyAndNamespaces();
  Status ApplyPoolAndWaitReady();

  KubeSuiteOptions options_;
  TempDir dir_;
  // Declared in start order: destroyed in the reverse (operators first).
  std::unique_ptr<KubeCluster> cluster_;
  std::unique_ptr<RedisServer> redis_;
  std::unique_ptr<PodRunner> runner_;
  std::vector<std::unique_ptr<DaemonProcess>> operators_;
  uint16_t data_port_ = 0;
  uint16_t fabric_port_ = 0;
  uint16_t metrics_port_ = 0;
  uint16_t sidecar_metrics_port_ = 0;
  int operator_count_ = 0;
  // The tests (suite.name; "" outside a test) whose operator logs were printed.
  std::set<std::string> operator_logs_printed_;
};

// `text` with every `from` replaced by `to`.
std::string ReplaceAll(std::string text, const std::string& from, const std::string& to);

// A field (`status`, `reason`, `message`) of condition `type` in an object's
// status.conditions; empty if there is no such condition.
std::string ConditionField(const nlohmann::json& object, const std::string& type,
                           const std::string& field = "status");

}  // namespace granary::testing

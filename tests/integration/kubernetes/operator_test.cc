// granary-operator against a real control plane, on the shared fixture
// KubeSuite (tests/testing/kube_suite.h): the CRDs and the identity policy
// applied as the chart ships them, the example namespaces and CachePool
// (examples/kubernetes) applied with kubectl on this test's directories and
// ports, the cache-node DaemonSet the operator generates run as a real
// granary-cachenode process (PodRunner), a real Redis as the metadata store,
// and the operator itself a real process (or, for the informer's relist, the
// library in process). The cases add the example Dataset and Datasets of
// their own in team-a, replicas of the operator, and kill and restart them;
// one adds a pool whose pod kwok fakes and writes that pod's status as the
// kubelet would (an image it cannot pull, a crash, a mount it cannot make)
// and checks the pool's and its Datasets' conditions.
// The last cases run the operator with its sidecar webhook (certificate,
// registration) and check the store Secret it copies to the Datasets'
// namespaces.
//
// The pool is the example's with transport libfabric (its tcp provider): the
// cache node serves the fabric beside its TCP port, and the example case reads
// every sample back over each.
//
// The whole binary is one ctest test (one cluster for every case): a cluster
// costs seconds to start and the cases build on one CachePool.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "granary/core/metadata_store.h"
#include "granary/kube/base64.h"
#include "granary/kube/kube_client.h"
#include "granary/kube/kube_config.h"
#include "granary/operator/informer.h"
#include "granary/operator/resources.h"
#include "granary/operator/webhook_cert.h"
#include "granary/operator/webhook_lookup.h"
#include "testing/daemon_process.h"
#include "testing/kube_cluster.h"
#include "testing/kube_suite.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

class OperatorTest : public SharedKubeTest<OperatorTest> {
 public:
  static Status StartShared() {
    KubeSuiteOptions o;
    o.source_dir = GRANARY_SOURCE_DIR;
    o.pod_bin_dir = GRANARY_POD_BIN_DIR;
    o.operator_binary = GRANARY_OPERATOR_BINARY;
    o.transport = "libfabric";
    suite_ = new KubeSuite(o);
    Status s = suite_->Start();
    if (!s.ok()) return Status(s.code(), s.message() + "\n" + suite_->OperatorLogs());
    return Status::Ok();
  }
  static void StopShared() {
    if (suite_ != nullptr) suite_->PrintLogsIfTestFailed();
    delete suite_;
    suite_ = nullptr;
  }
  static void PrintLogsIfFailed() {
    if (suite_ != nullptr) suite_->PrintLogsIfTestFailed();
  }

 protected:
  static KubeCluster& cluster() { return suite_->cluster(); }

  static std::string Kubectl(const std::vector<std::string>& args, const std::string& in = "") {
    return cluster().MustKubectl(args, in);
  }

  // A source tree of `files` files of random sizes and a notes.txt under
  // datasets()/<rel> (uid 1000 may read it); the files without notes.txt.
  static std::vector<std::pair<std::string, std::string>> MakeSource(const std::string& rel,
                                                                     int files, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < files; ++i) {
      const std::string path =
          "class" + std::to_string(i % 4) + "/img" + std::to_string(i) + ".JPEG";
      out.emplace_back(path, Bytes(rel + path, 100 + rng() % 200000));
    }
    std::vector<std::pair<std::string, std::string>> written = out;
    written.emplace_back("notes.txt", "not a JPEG: excluded by include");
    suite_->WriteSource(rel, written);
    return out;
  }

  // The cases' Datasets are in team-a, the example namespace.
  static std::string DatasetYaml(const std::string& name, const std::string& source,
                                 const std::string& extra = "") {
    return KubeSuite::DatasetYaml("team-a", name, source, extra);
  }
  static Result<json> Dataset(const std::string& name) { return suite_->Dataset("team-a", name); }
  static Status WaitCondition(const std::string& name, const std::string& type,
                              const std::string& status, const std::string& reason,
                              milliseconds timeout) {
    return suite_->WaitDatasetCondition("team-a", name, type, status, reason, timeout);
  }

  static KubectlResult Run(const std::vector<std::string>& argv) {
    return RunProgram(argv, {}, "", suite_->dir(), seconds(60));
  }

  // granary_cachenode_snapshots_total{result="ok"} of the pool's cache node.
  static double SnapshotsOk() {
    KubectlResult r = Run({"curl", "-sf", "http://" + suite_->metrics_address() + "/metrics"});
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    std::smatch m;
    const std::regex line("granary_cachenode_snapshots_total\\{result=\"ok\"\\} ([0-9.e+]+)");
    if (!std::regex_search(r.out, m, line)) {
      ADD_FAILURE() << "no snapshots_total{result=\"ok\"} in the cache node's metrics";
      return -1;
    }
    return std::stod(m[1].str());
  }

  // A sample of the newest running operator replica's /metrics (0 when absent), e.g.
  // OperatorMetric("granary_operator_api_requests_total", {{"verb", "get"}}).
  static double OperatorMetric(const std::string& name,
                               const std::map<std::string, std::string>& labels = {}) {
    const DaemonProcess* running = nullptr;
    for (const auto& p : suite_->operators()) {
      if (p->Running()) running = p.get();
    }
    if (running == nullptr) {
      ADD_FAILURE() << "no operator replica is running";
      return -1;
    }
    Result<std::vector<MetricSample>> samples = KubeSuite::OperatorMetrics(*running);
    if (!samples.ok()) {
      ADD_FAILURE() << samples.status().ToString();
      return -1;
    }
    return SumSamples(*samples, name, labels).value_or(0);
  }

  static inline KubeSuite* suite_ = nullptr;
};

TEST_F(OperatorTest, ExampleDatasetStagesAndReportsWhatTheStoreSays) {
  const auto files = MakeSource("imagenet/train", 120, 1);
  std::string yaml = ReadAll(std::string(GRANARY_SOURCE_DIR) + "/examples/kubernetes/dataset.yaml");
  yaml = ReplaceAll(yaml, "/mnt/datasets", suite_->datasets());
  yaml = ReplaceAll(yaml, "chunkSize: 16Mi", "chunkSize: 1Mi");
  Kubectl({"apply", "--validate=strict", "-f", "-"}, yaml);
  KubectlResult wait = cluster().Kubectl(
      {"wait", "-n", "team-a", "--for=condition=Ready", "dataset/imagenet-train", "--timeout=50s"});
  ASSERT_TRUE(wait.ok()) << wait.Describe() << "\n"
                         << Kubectl({"describe", "dataset", "-n", "team-a"});

  Result<json> d = Dataset("imagenet-train");
  ASSERT_OK(d);
  const json& st = (*d)["status"];
  const std::string gname = st.value("granaryName", "");
  EXPECT_EQ(gname, kube::GranaryDatasetName("team-a", "imagenet-train"));
  EXPECT_EQ(st.value("phase", ""), "Ready");
  EXPECT_EQ(ConditionField(*d, "Snapshotted"), "True");
  EXPECT_EQ(ConditionField(*d, "Staged"), "True");
  EXPECT_THAT((*d)["metadata"]["finalizers"].dump(), HasSubstr("granary.io/release-cache"));
  uint64_t total = 0;
  for (const auto& [p, b] : files) total += b.size();
  EXPECT_EQ(st.value("files", size_t{0}), files.size());  // notes.txt is not included
  EXPECT_EQ(st.value("totalBytes", uint64_t{0}), total);
  EXPECT_EQ(st.value("stagedBytes", uint64_t{0}), total);
  EXPECT_EQ(st.value("stagedPercent", 0), 100);
  EXPECT_EQ(st.value("nodes", 0), 1);

  // The same numbers as granary's own view of the store.
  KubectlResult show = Run({GRANARY_CLI_BINARY, "--store", suite_->redis().url(), "-o", "json",
                            "dataset", "show", gname});
  ASSERT_EQ(show.exit_code, 0) << show.Describe();
  json shown = json::parse(show.out, nullptr, false);
  ASSERT_FALSE(shown.is_discarded()) << show.out;
  EXPECT_EQ(shown.value("manifest_id", ""), st.value("manifestId", ""));
  EXPECT_EQ(shown.value("phase", ""), "Ready");
  EXPECT_EQ(shown["owner"].value("uid", 0), 1000);
  EXPECT_THAT(show.out, HasSubstr(std::to_string(total)));
  const std::string table = Kubectl({"get", "datasets", "-n", "team-a"});
  EXPECT_THAT(table, HasSubstr("CACHED%"));
  EXPECT_THAT(table,
              ::testing::ContainsRegex("imagenet-train +gpu +" + std::to_string(files.size()) +
                                       " +[0-9.]+[KMG]i +[0-9.]+[KMG]i +100 +100% +Ready"));
  EXPECT_EQ(st.value("residentPercent", 0), 100);
  EXPECT_EQ(ConditionField(*d, "Staged", "reason"), "Staged");  // the whole dataset is kept
  EXPECT_EQ(ConditionField(*d, "QuotaExceeded"), "False");
  EXPECT_EQ(ConditionField(*d, "QuotaExceeded", "reason"), "NoQuota");
  // The pool's objects: owned by the CachePool, applied by granary-operator.
  for (const char* kind : {"daemonset", "configmap", "service", "secret"}) {
    SCOPED_TRACE(kind);
    const std::string name =
        std::string("granary-cachenode-gpu") + (std::string(kind) == "secret" ? "-store" : "");
    Result<json> owned = cluster().GetJson({kind, "-n", "granary", name, "--show-managed-fields"});
    ASSERT_OK(owned);
    const json& meta = (*owned)["metadata"];
    ASSERT_EQ(meta["ownerReferences"].size(), 1u) << meta.dump(2);
    EXPECT_EQ(meta["ownerReferences"][0].value("kind", ""), "CachePool");
    EXPECT_EQ(meta["ownerReferences"][0].value("name", ""), "gpu");
    bool applied = false;
    for (const json& f : meta["managedFields"]) {
      applied |=
          f.value("manager", "") == "granary-operator" && f.value("operation", "") == "Apply";
    }
    EXPECT_TRUE(applied) << meta["managedFields"].dump(2);
  }
  // The chunk-handoff socket: the pool's nodeSocketHostPath (this test's
  // directory, not the host-wide /var/run/granary/gpu) mounted at
  // /run/granary-node, where the cache node's configuration puts the socket.
  Result<json> ds = cluster().GetJson({"daemonset", "-n", "granary", "granary-cachenode-gpu"});
  ASSERT_OK(ds);
  const json& pod = (*ds)["spec"]["template"]["spec"];
  std::string socket_host_path, socket_mount_path;
  for (const json& v : pod["volumes"]) {
    if (v.value("name", "") == "node-socket") {
      socket_host_path = v.value("hostPath", json::object()).value("path", "");
    }
  }
  for (const json& m : pod["containers"][0].value("volumeMounts", json::array())) {
    if (m.value("name", "") == "node-socket") socket_mount_path = m.value("mountPath", "");
  }
  EXPECT_EQ(socket_host_path, suite_->node_socket_dir()) << pod["volumes"].dump(2);
  EXPECT_EQ(socket_mount_path, "/run/granary-node") << pod["containers"].dump(2);
  Result<json> config = cluster().GetJson({"configmap", "-n", "granary", "granary-cachenode-gpu"});
  ASSERT_OK(config);
  EXPECT_THAT((*config)["data"].value("cachenode.yaml", ""),
              HasSubstr("\nlocal_socket: /run/granary-node/cachenode.sock\n"));
  // transport libfabric: the node serves the fabric on the pool's port, which
  // the pod declares.
  const std::string fabric_port = std::to_string(suite_->fabric_port());
  EXPECT_THAT((*config)["data"].value("cachenode.yaml", ""),
              HasSubstr("\nfabric_listen: 0.0.0.0:" + fabric_port + "\nfabric_provider: tcp\n"));
  bool fabric_port_declared = false;
  for (const json& p : pod["containers"][0].value("ports", json::array())) {
    fabric_port_declared |=
        p.value("name", "") == "fabric" && p.value("containerPort", 0) == suite_->fabric_port();
  }
  EXPECT_TRUE(fabric_port_declared) << pod["containers"][0].dump(2);
  EXPECT_TRUE(std::filesystem::is_socket(suite_->node_socket_dir() + "/cachenode.sock"))
      << "no cachenode.sock in " << suite_->node_socket_dir();
  const std::string pools = Kubectl({"get", "cachepools"});
  EXPECT_THAT(pools, ::testing::ContainsRegex("gpu +1 +1 +"));

  // The node requires authentication: without the cluster key, nothing.
  std::vector<std::string> args = {GRANARY_CLI_BINARY, "--store", suite_->redis().url()};
  args.insert(args.end(), {"cat", gname, "--direct", "--no-source", files.begin()->first});
  KubectlResult refused = Run(args);
  EXPECT_NE(refused.exit_code, 0) << refused.Describe();
  EXPECT_EQ(refused.out, "");
  EXPECT_THAT(refused.err, HasSubstr("requires authentication"));
  // Every sample read back through the cache node with the key the operator
  // made (no source fall-through).
  Result<std::string> key = suite_->ClusterKeyFile();
  ASSERT_OK(key);
  args = {GRANARY_CLI_BINARY, "--store", suite_->redis().url(), "--cluster-key-file", *key};
  args.insert(args.end(), {"cat", gname, "--direct", "--no-source"});
  std::string expected;
  for (const auto& [p, b] : files) {
    args.push_back(p);
    expected += b;
  }
  KubectlResult cat = Run(args);
  ASSERT_EQ(cat.exit_code, 0) << cat.Describe();
  EXPECT_EQ(cat.out.size(), expected.size());
  EXPECT_TRUE(cat.out == expected) << "bytes read back differ from the source";
  // And over the fabric the node advertises: the same bytes, written into the
  // reader's window by RMA (the node counts them), no fall-back to TCP.
  args.insert(args.begin() + 1, {"--transport", "libfabric"});
  KubectlResult fabric_cat = Run(args);
  ASSERT_EQ(fabric_cat.exit_code, 0) << fabric_cat.Describe();
  EXPECT_TRUE(fabric_cat.out == expected) << "bytes read over libfabric differ from the source";
  EXPECT_THAT(fabric_cat.err, Not(HasSubstr("instead of"))) << "a node was read over TCP";
  double rma_bytes = 0;
  ASSERT_OK(cluster().WaitFor(
      [&] {
        KubectlResult m = Run({"curl", "-sf", "http://" + suite_->metrics_address() + "/metrics"});
        std::smatch found;
        const std::regex line("\ngranary_cachenode_fabric_rma_bytes_total ([0-9.e+]+)");
        if (!std::regex_search(m.out, found, line)) return false;
        rma_bytes = std::stod(found[1].str());
        return rma_bytes >= static_cast<double>(expected.size());
      },
      seconds(10), "the cache node's fabric RMA bytes to cover what was read"));
}

TEST_F(OperatorTest, BadDatasetsGetAConditionAndAnEventAndStageNothing) {
  MakeSource("good", 3, 2);
  std::filesystem::create_directories(suite_->datasets() + "/locked");
  suite_->WriteFile("datasets/locked/a.JPEG", "secret");
  chmod((suite_->datasets() + "/locked").c_str(), 0700);  // root's: uid 1000 cannot list it
  Kubectl({"apply", "-f", "-"}, ReplaceAll(DatasetYaml("no-pool", suite_->datasets() + "/good"),
                                           "cachePool: gpu", "cachePool: nowhere") +
                                    "---\n" + DatasetYaml("outside", "/etc") + "---\n" +
                                    DatasetYaml("missing", suite_->datasets() + "/does-not-exist") +
                                    "---\n" +
                                    DatasetYaml("unreadable", suite_->datasets() + "/locked"));
  ASSERT_OK(WaitCondition("no-pool", "Ready", "False", "PoolNotFound", seconds(30)));
  ASSERT_OK(WaitCondition("outside", "Ready", "False", "SourceNotMounted", seconds(30)));
  ASSERT_OK(WaitCondition("missing", "Ready", "False", "Failed", seconds(60)));
  ASSERT_OK(WaitCondition("unreadable", "Ready", "False", "Failed", seconds(60)));
  EXPECT_THAT(ConditionField(*Dataset("outside"), "Ready", "message"),
              HasSubstr(suite_->datasets()));
  EXPECT_THAT(ConditionField(*Dataset("missing"), "Ready", "message"), HasSubstr("does-not-exist"));
  EXPECT_THAT(ConditionField(*Dataset("unreadable"), "Ready", "message"), HasSubstr("1000"));
  const std::string events = Kubectl({"get", "events", "-n", "team-a", "-o", "json"});
  for (const char* reason : {"PoolNotFound", "SourceNotMounted", "Failed"}) {
    EXPECT_THAT(events, HasSubstr("\"reason\": \"" + std::string(reason) + "\"")) << reason;
  }
  EXPECT_THAT(Kubectl({"describe", "dataset", "-n", "team-a", "outside"}),
              HasSubstr("SourceNotMounted"));
  // Nothing of them is in the store but records without a manifest.
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  EXPECT_EQ((*store)->GetDataset(kube::GranaryDatasetName("team-a", "no-pool")).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ((*store)->GetDataset(kube::GranaryDatasetName("team-a", "outside")).status().code(),
            StatusCode::kNotFound);
  Result<DatasetRecord> unreadable =
      (*store)->GetDataset(kube::GranaryDatasetName("team-a", "unreadable"));
  ASSERT_OK(unreadable);
  EXPECT_TRUE(unreadable->manifest_id.empty());
  // The pool cannot be changed (the CRD says so); a fixed source is taken up:
  // the missing directory created and a new snapshot asked for.
  MakeSource("does-not-exist", 2, 7);
  Kubectl({"annotate", "dataset", "-n", "team-a", "missing", "granary.io/snapshot=retry-1"});
  ASSERT_OK(WaitCondition("missing", "Ready", "True", "", seconds(60)));
  Kubectl({"delete", "dataset", "-n", "team-a", "no-pool", "outside", "missing", "unreadable",
           "--timeout=60s"});
}

// A pool whose cache-node pod does not run, as the kubelet reports it: kwok
// does not pull images, so the test writes the pod's status through its
// status subresource the way the kubelet does (waiting ErrImagePull, then
// CrashLoopBackOff with the real cache node's last words about a data
// directory it cannot create, then running again, then creating its
// containers with a FailedMount Event). The pool's image names no Granary
// image, so PodRunner leaves its pod to kwok; the example pool gpu and its
// Dataset are not touched.
TEST_F(OperatorTest, CacheNodePodsThatDoNotRunGiveThePoolAReasonAndRecovery) {
  const auto files = MakeSource("unaffected", 3, 11);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("unaffected", suite_->datasets() + "/unaffected"));
  ASSERT_OK(WaitCondition("unaffected", "Ready", "True", "", seconds(60)));
  auto ready_since = [&](const Result<json>& object) {
    return object.ok() ? ConditionField(*object, "Ready", "lastTransitionTime") : "";
  };
  const std::string gpu_since = ready_since(cluster().GetJson({"cachepool", "gpu"}));
  const std::string unaffected_since = ready_since(Dataset("unaffected"));
  ASSERT_NE(gpu_since, "");

  const std::string image = "registry.invalid/no-such-image:1";
  const std::string missing_mount = suite_->Join("no-such-mount");
  Kubectl({"apply", "--validate=strict", "-f", "-"},
          "apiVersion: granary.io/v1alpha1\nkind: CachePool\nmetadata: {name: broken}\nspec:\n"
          "  nodeSelector: {granary.io/nvme: \"true\"}\n"
          "  storage: {hostPath: " +
              suite_->Join("broken-nvme") +
              ", capacity: 1Gi}\n"
              "  sourceMounts: [{name: shared, hostPath: " +
              missing_mount +
              "}]\n"
              "  metadataStore: {secretRef: {name: granary-store, namespace: granary, key: url}}\n"
              "  nodeSocketHostPath: " +
              suite_->Join("broken-socket") +
              "\n"
              "  image: " +
              image +
              "\n"
              "  ports: {data: " +
              std::to_string(FreeTcpPort()) + ", metrics: " + std::to_string(FreeTcpPort()) +
              "}\n");
  auto pool = [&](const std::string& field, const std::string& type = "Ready") {
    Result<json> p = cluster().GetJson({"cachepool", "broken"});
    return p.ok() ? ConditionField(*p, type, field) : "";
  };
  auto wait_pool = [&](const std::string& status, const std::string& reason) {
    Status s =
        cluster().WaitFor([&] { return pool("status") == status && pool("reason") == reason; },
                          seconds(30), "CachePool broken Ready=" + status + " " + reason);
    if (s.ok()) return s;
    return Status(s.code(),
                  s.message() + "\n" +
                      cluster().Kubectl({"get", "cachepool", "broken", "-o", "yaml"}).out +
                      suite_->OperatorLogs());
  };
  // kwok reports the pod Running and Ready first, as a node that pulled it.
  ASSERT_OK(wait_pool("True", "NodesReady"));
  Result<json> pods = cluster().GetJson({"pods", "-n", "granary", "-l", "granary.io/pool=broken"});
  ASSERT_OK(pods);
  ASSERT_EQ((*pods)["items"].size(), 1u) << pods->dump(1);
  const json pod = (*pods)["items"][0];
  const std::string pod_name = pod["metadata"].value("name", "");
  const std::string node = pod["spec"].value("nodeName", "");
  ASSERT_EQ(node, "gpu-node-1");
  EXPECT_EQ(pod["spec"]["containers"][0].value("terminationMessagePolicy", ""),
            "FallbackToLogsOnError");
  // Writes the pod's status as the kubelet would: `ready` and one container
  // status; podIP stays, so kwok leaves the pod alone.
  auto write_status = [&](const std::string& phase, bool ready, const json& container) {
    json c = {{"name", "cachenode"}, {"image", image},    {"imageID", ""},
              {"ready", ready},      {"restartCount", 0}, {"started", ready}};
    c.update(container);
    const std::string r = ready ? "True" : "False";
    json patch = {{"status",
                   {{"phase", phase},
                    {"conditions", json::array({{{"type", "PodScheduled"}, {"status", "True"}},
                                                {{"type", "Initialized"}, {"status", "True"}},
                                                {{"type", "ContainersReady"}, {"status", r}},
                                                {{"type", "Ready"}, {"status", r}}})},
                    {"containerStatuses", json::array({c})}}}};
    Kubectl({"patch", "pod", "-n", "granary", pod_name, "--subresource=status", "--type=merge",
             "-p", patch.dump()});
  };
  auto pool_events = [&](const std::string& reason) {
    Result<json> events = cluster().GetJson(
        {"events", "-n", "default", "--field-selector",
         "involvedObject.kind=CachePool,involvedObject.name=broken,reason=" + reason});
    return events.ok() ? (*events)["items"].size() : 0;
  };

  // 1. The image cannot be pulled.
  const std::string pull_error = "failed to pull and unpack image \"" + image +
                                 "\": failed to resolve reference: no such host";
  write_status("Pending", false,
               {{"state", {{"waiting", {{"reason", "ErrImagePull"}, {"message", pull_error}}}}}});
  ASSERT_OK(wait_pool("False", "ImagePullFailed"));
  const std::string pull_message = pool("message");
  EXPECT_THAT(pull_message, HasSubstr("granary/" + pod_name +
                                      " on node gpu-node-1 cannot pull "
                                      "image '" +
                                      image + "': " + pull_error));
  EXPECT_THAT(pull_message, HasSubstr("spec.image"));
  // Backing off says the same: no new message, no second Event.
  const std::string backoff =
      "Back-off pulling image \"" + image + "\": ErrImagePull: " + pull_error;
  const json backoff_state = {{"waiting", {{"reason", "ImagePullBackOff"}, {"message", backoff}}}};
  write_status("Pending", false, {{"state", backoff_state}});
  std::this_thread::sleep_for(seconds(2));  // several reconciles at --progress-interval=300ms
  EXPECT_EQ(pool("reason"), "ImagePullFailed");
  EXPECT_EQ(pool("message"), pull_message);
  EXPECT_EQ(pool_events("ImagePullFailed"), 1u);
  // A Dataset of the pool waits for a snapshot no cache node can take, and
  // says why.
  Kubectl({"apply", "-f", "-"}, ReplaceAll(DatasetYaml("waiting", missing_mount + "/waiting"),
                                           "cachePool: gpu", "cachePool: broken"));
  ASSERT_OK(WaitCondition("waiting", "Ready", "False", "CacheNodesNotRunning", seconds(30)));
  EXPECT_THAT(ConditionField(*Dataset("waiting"), "Ready", "message"),
              HasSubstr("no cache node of CachePool 'broken' runs, so none takes this Dataset's "
                        "snapshot: " +
                        pull_message));
  EXPECT_EQ((*Dataset("waiting"))["status"].value("phase", ""), "Pending");

  // 2. It runs and exits: the real cache node's last words, with a data
  // directory it cannot create (under a regular file), as
  // FallbackToLogsOnError hands them to the status.
  suite_->WriteFile("broken-file", "not a directory");
  suite_->WriteFile("broken-cachenode.yaml",
                    "pool: broken\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\n"
                    "data_dir: " +
                        suite_->Join("broken-file") +
                        "/broken\ncapacity: 1000000\n"
                        "metadata_store: " +
                        suite_->redis().url() + "\nserve_without_authentication: true\n");
  KubectlResult exited = Run({std::string(GRANARY_POD_BIN_DIR) + "/granary-cachenode",
                              "--config=" + suite_->Join("broken-cachenode.yaml"),
                              "--node-id=broken-1", "--advertise=127.0.0.1:1"});
  ASSERT_EQ(exited.exit_code, 1) << exited.Describe();
  ASSERT_THAT(exited.err, HasSubstr("data_dir"));
  write_status(
      "Running", false,
      {{"restartCount", 3},
       {"state",
        {{"waiting",
          {{"reason", "CrashLoopBackOff"},
           {"message", "back-off 40s restarting failed container"}}}}},
       {"lastState",
        {{"terminated", {{"exitCode", 1}, {"reason", "Error"}, {"message", exited.err}}}}}});
  ASSERT_OK(wait_pool("False", "CacheNodeCrashing"));
  const std::string crash_message = pool("message");
  EXPECT_THAT(crash_message, HasSubstr("on node gpu-node-1 exits with exit code 1 (Error): "));
  EXPECT_THAT(crash_message, HasSubstr(suite_->Join("broken-file") + "/broken"));
  EXPECT_THAT(crash_message, HasSubstr("chunk store"));
  EXPECT_EQ(pool_events("CacheNodeCrashing"), 1u);

  // 3. It runs again: the reason clears, with a Normal Event.
  write_status("Running", true, {{"state", {{"running", {{"startedAt", kube::NowRfc3339()}}}}}});
  ASSERT_OK(wait_pool("True", "NodesReady"));
  EXPECT_EQ(pool("message"), "1 of 1 cache nodes ready");
  EXPECT_EQ(pool_events("CacheNodesRecovered"), 1u);
  ASSERT_OK(WaitCondition("waiting", "Ready", "False", "Pending", seconds(30)));

  // 4. A source mount the node cannot mount: the kubelet keeps the pod
  // creating its containers and says why in a FailedMount Event.
  write_status("Pending", false, {{"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}});
  const std::string mount_error =
      "MountVolume.SetUp failed for volume \"source-shared\" : "
      "hostPath type check failed: " +
      missing_mount + " is not a directory";
  const json event = {{"apiVersion", "v1"},
                      {"kind", "Event"},
                      {"metadata", {{"name", pod_name + ".failedmount"}, {"namespace", "granary"}}},
                      {"involvedObject",
                       {{"apiVersion", "v1"},
                        {"kind", "Pod"},
                        {"name", pod_name},
                        {"namespace", "granary"},
                        {"uid", pod["metadata"].value("uid", "")}}},
                      {"reason", "FailedMount"},
                      {"type", "Warning"},
                      {"message", mount_error},
                      {"source", {{"component", "kubelet"}, {"host", node}}},
                      {"firstTimestamp", kube::NowRfc3339()},
                      {"lastTimestamp", kube::NowRfc3339()},
                      {"count", 1}};
  Kubectl({"create", "-f", "-"}, event.dump());
  ASSERT_OK(wait_pool("False", "SourceMountFailed"));
  EXPECT_THAT(pool("message"),
              HasSubstr("cannot mount spec.sourceMounts['shared'] (hostPath " + missing_mount +
                        " at " + missing_mount + "): " + mount_error));
  // A Dataset under that mount says so, and nothing of it reaches the store.
  Kubectl({"apply", "-f", "-"}, ReplaceAll(DatasetYaml("unmountable", missing_mount + "/train"),
                                           "cachePool: gpu", "cachePool: broken"));
  ASSERT_OK(WaitCondition("unmountable", "Ready", "False", "SourceMountFailed", seconds(30)));
  const std::string dataset_message = ConditionField(*Dataset("unmountable"), "Ready", "message");
  EXPECT_THAT(dataset_message, HasSubstr("spec.source '" + missing_mount + "/train'"));
  EXPECT_THAT(dataset_message, HasSubstr("source mount 'shared' of CachePool 'broken' (its "
                                         "sourceMounts: 'shared' (" +
                                         missing_mount + " at " + missing_mount + "))"));
  EXPECT_THAT(dataset_message, HasSubstr(mount_error));
  ASSERT_OK(WaitCondition("waiting", "Ready", "False", "SourceMountFailed", seconds(30)));
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  EXPECT_EQ((*store)->GetDataset(kube::GranaryDatasetName("team-a", "unmountable")).status().code(),
            StatusCode::kNotFound);

  // Nothing else changed: the example pool and its Dataset stayed Ready
  // throughout (a transition would have moved lastTransitionTime).
  Result<json> gpu = cluster().GetJson({"cachepool", "gpu"});
  ASSERT_OK(gpu);
  EXPECT_EQ(ConditionField(*gpu, "Ready"), "True");
  EXPECT_EQ(ConditionField(*gpu, "Ready", "reason"), "NodesReady");
  EXPECT_EQ(ready_since(gpu), gpu_since);
  Result<json> unaffected = Dataset("unaffected");
  ASSERT_OK(unaffected);
  EXPECT_EQ(ConditionField(*unaffected, "Ready"), "True");
  EXPECT_EQ(ready_since(unaffected), unaffected_since);

  Kubectl({"delete", "dataset", "-n", "team-a", "unmountable", "waiting", "unaffected",
           "--timeout=60s"});
  Kubectl({"delete", "cachepool", "broken", "--timeout=60s"});
}

TEST_F(OperatorTest, DeletingADatasetDropsItsChunksAndRecordsThenTheFinalizer) {
  MakeSource("deleteme", 20, 3);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("deleteme", suite_->datasets() + "/deleteme"));
  ASSERT_OK(WaitCondition("deleteme", "Ready", "True", "", seconds(60)));
  const std::string gname = kube::GranaryDatasetName("team-a", "deleteme");
  const std::string manifest = (*Dataset("deleteme"))["status"].value("manifestId", "");
  ASSERT_FALSE(manifest.empty());
  auto chunk_files = [&] {
    size_t n = 0;
    for (auto& e : std::filesystem::recursive_directory_iterator(suite_->nvme())) {
      if (e.is_regular_file() &&
          e.path().string().find(manifest.substr(0, 16)) != std::string::npos)
        ++n;
    }
    return n;
  };
  EXPECT_GT(chunk_files(), 0u) << "no chunk file names the manifest under " << suite_->nvme();
  KubectlResult del =
      cluster().Kubectl({"delete", "dataset", "-n", "team-a", "deleteme", "--timeout=60s"});
  ASSERT_TRUE(del.ok()) << del.Describe();
  EXPECT_EQ(Dataset("deleteme").status().code(), StatusCode::kNotFound);
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  EXPECT_EQ((*store)->GetDataset(gname).status().code(), StatusCode::kNotFound);
  ASSERT_OK(cluster().WaitFor([&] { return chunk_files() == 0; }, seconds(30),
                              "the cache node dropping the deleted dataset's chunk files"));
}

// The cases of a namespace with a quota use their own, granted uid 1000 like
// team-a, so no other case's Datasets count against it.
constexpr char kQuotaNamespace[] = "team-q";

Status MakeQuotaNamespace(KubeCluster& cluster) {
  KubectlResult r = cluster.Kubectl(
      {"apply", "-f", "-"},
      std::string("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ") + kQuotaNamespace +
          "\n  annotations: {granary.io/allowed-uids: \"1000\", granary.io/allowed-gids: "
          "\"1000\"}\n");
  return r.ok() ? Status::Ok() : Status::Unavailable(r.Describe());
}

// The pool's quotas (a JSON list, or null for none).
void SetQuotas(KubeCluster& cluster, const json& quotas) {
  cluster.MustKubectl({"patch", "cachepool", "gpu", "--type=merge", "-p",
                       json({{"spec", {{"quotas", quotas}}}}).dump()});
}

TEST_F(OperatorTest, CacheSettingsAndTheNamespaceQuotaReachTheStoreRecords) {
  ASSERT_OK(MakeQuotaNamespace(cluster()));
  const auto first_files = MakeSource("quota/first", 16, 21);
  const auto second_files = MakeSource("quota/second", 16, 22);
  uint64_t first = 0, second = 0;
  for (const auto& [p, b] : first_files) first += b.size();
  for (const auto& [p, b] : second_files) second += b.size();
  // Room for the first and half of the second (their JPEGs: notes.txt is not included).
  const uint64_t quota = first + second / 2;
  SetQuotas(cluster(), {{{"namespace", kQuotaNamespace}, {"bytes", quota}}});
  Kubectl({"apply", "-f", "-"},
          KubeSuite::DatasetYaml(kQuotaNamespace, "first", suite_->datasets() + "/quota/first",
                                 "  include: ['*.JPEG']\n"
                                 "  cache: {pinned: true, ttl: 1h30m, minResidentPercent: 50}\n"));
  ASSERT_OK(
      suite_->WaitDatasetCondition(kQuotaNamespace, "first", "Ready", "True", "", seconds(60)));
  // Created after the first at the same priority: it gets what is left.
  Kubectl({"apply", "-f", "-"},
          KubeSuite::DatasetYaml(kQuotaNamespace, "second", suite_->datasets() + "/quota/second",
                                 "  include: ['*.JPEG']\n"));
  ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, "second", "QuotaExceeded", "True",
                                         "QuotaExceeded", seconds(60)));
  ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, "first", "QuotaExceeded", "False",
                                         "WithinQuota", seconds(30)));
  Result<json> d = suite_->Dataset(kQuotaNamespace, "second");
  ASSERT_OK(d);
  const std::string message = ConditionField(*d, "QuotaExceeded", "message");
  EXPECT_THAT(message, HasSubstr(std::string("namespace ") + kQuotaNamespace +
                                 "'s quota in pool gpu is " + kube::QuantityString(quota) +
                                 " and its datasets need " + kube::QuantityString(first + second)));
  EXPECT_THAT(message, HasSubstr("this one keeps " + kube::QuantityString(second - second / 2)));
  EXPECT_THAT(message, HasSubstr("the rest is streamed from the source"));
  EXPECT_THAT(Kubectl({"get", "events", "-n", kQuotaNamespace, "--field-selector",
                       "involvedObject.name=second,reason=QuotaExceeded"}),
              HasSubstr("QuotaExceeded"));

  // The store records: the cache settings as written, the limit from the quota.
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  auto record = [&](const std::string& name) {
    return (*store)->GetDataset(kube::GranaryDatasetName(kQuotaNamespace, name));
  };
  Result<DatasetRecord> r = record("first");
  ASSERT_OK(r);
  EXPECT_TRUE(r->spec.cache.pinned);
  EXPECT_EQ(r->spec.cache.ttl_seconds, 5400u);
  EXPECT_EQ(r->spec.cache.min_resident_percent, 50u);
  EXPECT_EQ(r->spec.cache.priority, 0);
  EXPECT_EQ(r->spec.cache.max_resident_bytes, std::optional<uint64_t>(first));
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<DatasetRecord> s = record("second");
        return s.ok() && s->spec.cache.max_resident_bytes == quota - first;
      },
      seconds(30), "the second's record to carry what the quota leaves it"));

  // A new priority is a spec change without a new snapshot: the second now
  // goes first, and the first gets what is left.
  Kubectl({"patch", "dataset", "-n", kQuotaNamespace, "second", "--type=merge", "-p",
           R"({"spec": {"cache": {"priority": 10}}})"});
  ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, "second", "QuotaExceeded", "False",
                                         "WithinQuota", seconds(30)));
  ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, "first", "QuotaExceeded", "True",
                                         "QuotaExceeded", seconds(30)));
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<DatasetRecord> f = record("first"), s = record("second");
        return f.ok() && s.ok() && f->spec.cache.max_resident_bytes == quota - second &&
               s->spec.cache.max_resident_bytes == second && s->spec.cache.priority == 10;
      },
      seconds(30), "the records to follow the new priority"));
  // The cache node gives up part of the first: its status and Events say so.
  ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, "first", "Staged", "True",
                                         "PartlyResident", seconds(30)));
  ASSERT_OK(cluster().WaitFor(
      [&] {
        return Kubectl({"get", "events", "-n", kQuotaNamespace, "--field-selector",
                        "involvedObject.name=first,reason=Evicted"})
                   .find("resident (was 100%)") != std::string::npos;
      },
      seconds(30), "an Evicted Event on the first"));

  // Raising the quota clears the condition on both.
  SetQuotas(cluster(), {{{"namespace", kQuotaNamespace}, {"bytes", first + second}}});
  for (const char* name : {"first", "second"}) {
    SCOPED_TRACE(name);
    ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, name, "QuotaExceeded", "False",
                                           "WithinQuota", seconds(30)));
  }
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<DatasetRecord> f = record("first"), s = record("second");
        return f.ok() && s.ok() && f->spec.cache.max_resident_bytes == first &&
               s->spec.cache.max_resident_bytes == second;
      },
      seconds(30), "the records to get their whole size"));
  // The operator's gauges (its exporter looks once a second).
  const std::map<std::string, std::string> labels = {{"pool", "gpu"},
                                                     {"namespace", kQuotaNamespace}};
  ASSERT_OK(cluster().WaitFor(
      [&] {
        return OperatorMetric("granary_operator_namespace_quota_bytes", labels) ==
                   static_cast<double>(first + second) &&
               OperatorMetric("granary_operator_namespace_wanted_bytes", labels) ==
                   static_cast<double>(first + second) &&
               OperatorMetric("granary_operator_namespace_resident_bytes", labels) >=
                   static_cast<double>(first);  // the first is Ready
      },
      seconds(10), "the namespace's quota, wanted and resident bytes"));

  // No quota: no limit in the records.
  SetQuotas(cluster(), nullptr);
  ASSERT_OK(suite_->WaitDatasetCondition(kQuotaNamespace, "second", "QuotaExceeded", "False",
                                         "NoQuota", seconds(30)));
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<DatasetRecord> f = record("first"), s = record("second");
        return f.ok() && s.ok() && !f->spec.cache.max_resident_bytes &&
               !s->spec.cache.max_resident_bytes;
      },
      seconds(30), "the records to lose their limit"));
  Kubectl({"delete", "dataset", "-n", kQuotaNamespace, "first", "second", "--timeout=60s"});
}

TEST_F(OperatorTest, DeletingACachePoolIsHeldWhileADatasetUsesIt) {
  ASSERT_OK(MakeQuotaNamespace(cluster()));
  // A second pool like the suite's on no node (no cache node runs for it).
  Result<json> gpu = cluster().GetJson({"cachepool", "gpu"});
  ASSERT_OK(gpu);
  json spare = {{"apiVersion", "granary.io/v1alpha1"},
                {"kind", "CachePool"},
                {"metadata", {{"name", "spare"}}},
                {"spec", (*gpu)["spec"]}};
  spare["spec"]["nodeSelector"] = {{"granary.io/no-such-label", "true"}};
  spare["spec"].erase("quotas");
  Kubectl({"create", "-f", "-"}, spare.dump());
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> p = cluster().GetJson({"cachepool", "spare"});
        Result<json> ds =
            cluster().GetJson({"daemonset", "-n", "granary", "granary-cachenode-spare"});
        return p.ok() && ds.ok();
      },
      seconds(30), "the pool's DaemonSet"));
  // No Dataset names it yet: no finalizer (deleting it would not wait).
  Result<json> unused = cluster().GetJson({"cachepool", "spare"});
  ASSERT_OK(unused);
  EXPECT_EQ((*unused)["metadata"]
                .value("finalizers", json::array())
                .dump()
                .find("granary.io/pool-in-use"),
            std::string::npos);
  MakeSource("spare", 2, 31);
  std::string yaml =
      KubeSuite::DatasetYaml(kQuotaNamespace, "on-spare", suite_->datasets() + "/spare");
  yaml = ReplaceAll(yaml, "cachePool: gpu", "cachePool: spare");
  Kubectl({"apply", "-f", "-"}, yaml);
  const std::string gname = kube::GranaryDatasetName(kQuotaNamespace, "on-spare");
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  ASSERT_OK(cluster().WaitFor([&] { return (*store)->GetDataset(gname).ok(); }, seconds(30),
                              "the Dataset's store record"));
  // A Dataset names it: the finalizer holds it now.
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> p = cluster().GetJson({"cachepool", "spare"});
        return p.ok() && (*p)["metadata"]
                                 .value("finalizers", json::array())
                                 .dump()
                                 .find("granary.io/pool-in-use") != std::string::npos;
      },
      seconds(30), "the pool's finalizer once a Dataset names it"));

  // Deleting the pool: held, saying why.
  Kubectl({"delete", "cachepool", "spare", "--wait=false"});
  std::string message;
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> p = cluster().GetJson({"cachepool", "spare"});
        if (!p.ok()) return false;
        for (const json& c : (*p)["status"].value("conditions", json::array())) {
          if (c.value("type", "") == "Deleting" && c.value("status", "") == "True" &&
              c.value("reason", "") == "DatasetsStillUseIt") {
            message = c.value("message", "");
            return true;
          }
        }
        return false;
      },
      seconds(30), "condition Deleting=True on the pool"));
  EXPECT_THAT(message, HasSubstr(std::string(kQuotaNamespace) + "/on-spare"));
  EXPECT_THAT(Kubectl({"get", "events", "-A", "--field-selector",
                       "involvedObject.name=spare,reason=DeletionHeld"}),
              HasSubstr("DeletionHeld"));
  std::this_thread::sleep_for(seconds(3));  // still there a while later, with its cache nodes
  EXPECT_OK(cluster().GetJson({"cachepool", "spare"}).status());
  EXPECT_OK(cluster().GetJson({"daemonset", "-n", "granary", "granary-cachenode-spare"}).status());

  // The Dataset goes (its record released through the pool's store), then the pool.
  Kubectl({"delete", "dataset", "-n", kQuotaNamespace, "on-spare", "--timeout=60s"});
  EXPECT_EQ((*store)->GetDataset(gname).status().code(), StatusCode::kNotFound);
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> p = cluster().GetJson({"cachepool", "spare"});
        Result<json> ds =
            cluster().GetJson({"daemonset", "-n", "granary", "granary-cachenode-spare"});
        return !p.ok() && p.status().code() == StatusCode::kNotFound && !ds.ok() &&
               ds.status().code() == StatusCode::kNotFound;
      },
      seconds(30), "the pool and its DaemonSet to go"));
}

TEST_F(OperatorTest, OperatorKilledAndApiServerRestartedStatusConvergesWithOneSnapshot) {
  MakeSource("restarts", 40, 4);
  const double snapshots_before = SnapshotsOk();
  Kubectl({"apply", "-f", "-"}, DatasetYaml("restarts", suite_->datasets() + "/restarts"));
  // Kill the operator as soon as it has created the store record.
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  const std::string gname = kube::GranaryDatasetName("team-a", "restarts");
  ASSERT_OK(cluster().WaitFor([&] { return (*store)->GetDataset(gname).ok(); }, seconds(30),
                              "the store record"));
  ASSERT_OK(suite_->operators().back()->Kill().status());
  ASSERT_OK(cluster().RestartApiServer());
  ASSERT_OK(suite_->StartOperator());
  ASSERT_OK(WaitCondition("restarts", "Ready", "True", "", seconds(90)));
  Result<DatasetRecord> record = (*store)->GetDataset(gname);
  ASSERT_OK(record);
  EXPECT_EQ(record->manifest_id, (*Dataset("restarts"))["status"].value("manifestId", ""));
  // One snapshot: the cache node walked the source once, and the Events say
  // Created and Snapshotted at most once. Created may be missing: the kill
  // can land between the record and its Event (Events are best effort, and
  // the new operator finds the record made); two would mean it was made twice.
  EXPECT_EQ(SnapshotsOk() - snapshots_before, 1.0);
  const std::string events = Kubectl({"get", "events", "-n", "team-a", "--field-selector",
                                      "involvedObject.name=restarts", "-o", "json"});
  json list = json::parse(events);
  int snapshotted = 0, created = 0;
  for (const json& e : list["items"]) {
    snapshotted += e.value("reason", "") == "Snapshotted" ? 1 : 0;
    created += e.value("reason", "") == "Created" ? 1 : 0;
  }
  EXPECT_LE(snapshotted, 1) << events;
  EXPECT_LE(created, 1) << events;
}

TEST_F(OperatorTest, SpecChangeOfTheBytesTakesANewSnapshot) {
  MakeSource("respec", 10, 5);
  suite_->WriteSource("respec", {{"extra/more.png", "png bytes"}});
  Kubectl({"apply", "-f", "-"},
          DatasetYaml("respec", suite_->datasets() + "/respec", "  include: [\"*.JPEG\"]\n"));
  ASSERT_OK(WaitCondition("respec", "Ready", "True", "", seconds(60)));
  const std::string first = (*Dataset("respec"))["status"].value("manifestId", "");
  EXPECT_EQ((*Dataset("respec"))["status"].value("files", 0), 10);
  Kubectl({"patch", "dataset", "-n", "team-a", "respec", "--type=merge", "-p",
           R"({"spec":{"include":["*.JPEG","*.png"]}})"});
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> d = Dataset("respec");
        return d.ok() && ConditionField(*d, "Ready") == "True" &&
               (*d)["status"].value("manifestId", "") != first &&
               (*d)["status"].value("files", 0) == 11 &&
               (*d)["status"].value("observedGeneration", 0) ==
                   (*d)["metadata"].value("generation", -1);
      },
      seconds(60), "a new snapshot with the .png file"));
  // Replication (placement) alone does not re-snapshot.
  const std::string second = (*Dataset("respec"))["status"].value("manifestId", "");
  Kubectl({"patch", "dataset", "-n", "team-a", "respec", "--type=merge", "-p",
           R"({"spec":{"replication":2}})"});
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  const std::string gname = kube::GranaryDatasetName("team-a", "respec");
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<DatasetRecord> r = (*store)->GetDataset(gname);
        return r.ok() && r->spec.replication == 2;
      },
      seconds(30), "replication 2 in the store"));
  EXPECT_EQ((*store)->GetDataset(gname)->manifest_id, second);
  Kubectl({"delete", "dataset", "-n", "team-a", "respec", "--timeout=60s"});
}

TEST_F(OperatorTest, AWithdrawnGrantStopsTheDatasetAndAGrantAgainTakesItUp) {
  MakeSource("granted", 6, 8);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("granted", suite_->datasets() + "/granted"));
  ASSERT_OK(WaitCondition("granted", "Ready", "True", "", seconds(60)));
  const std::string gname = kube::GranaryDatasetName("team-a", "granted");
  Result<std::unique_ptr<MetadataStore>> store = suite_->Store();
  ASSERT_OK(store);
  // An admin withdraws uid 1000 (the policy checks creates and runAs
  // changes; the operator checks every reconcile, and watches Namespaces:
  // the change reaches the namespace's Datasets at once, well before the
  // periodic look at a Ready Dataset, every 30 s).
  Kubectl({"annotate", "namespace", "team-a", "--overwrite", "granary.io/allowed-uids=2000"});
  ASSERT_OK(WaitCondition("granted", "Ready", "False", "IdentityNotGranted", seconds(10)));
  Result<DatasetRecord> stopped = (*store)->GetDataset(gname);
  ASSERT_OK(stopped);
  EXPECT_EQ(stopped->state.phase, DatasetPhase::kFailed);
  EXPECT_THAT(stopped->state.message, HasSubstr("no longer grants"));
  EXPECT_THAT(ConditionField(*Dataset("granted"), "Ready", "message"), HasSubstr("uid 1000"));
  // Granted again: a new snapshot as that identity, Ready again.
  Kubectl({"annotate", "namespace", "team-a", "--overwrite", "granary.io/allowed-uids=1000"});
  ASSERT_OK(WaitCondition("granted", "Ready", "True", "", seconds(60)));
  EXPECT_EQ((*store)->GetDataset(gname)->state.phase, DatasetPhase::kReady);
  // The snapshot annotation: a new value takes a new snapshot, the same
  // value again does not.
  const double before = SnapshotsOk();
  Kubectl({"annotate", "dataset", "-n", "team-a", "granted", "granary.io/snapshot=one"});
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> d = Dataset("granted");
        return d.ok() && (*d)["status"].value("snapshotRequest", "") == "one" &&
               ConditionField(*d, "Ready") == "True";
      },
      seconds(60), "the snapshot asked for by the annotation"));
  EXPECT_EQ(SnapshotsOk() - before, 1.0);
  Kubectl({"annotate", "dataset", "-n", "team-a", "granted", "--overwrite", "touch=1"});
  std::this_thread::sleep_for(milliseconds(1500));  // several reconciles at 300 ms
  EXPECT_EQ(SnapshotsOk() - before, 1.0);
  Kubectl({"delete", "dataset", "-n", "team-a", "granted", "--timeout=60s"});
}

// Reconciles read the Namespace, the pool's store Secret, the Datasets'
// copies of it and the cluster key from the operator's informers: with a
// Dataset reconciled again and again (every touch, and every 300 ms while it
// is not Ready), the operator GETs no Secret and no Namespace. Its own
// counter of requests says so (granary_operator_api_requests_total); a copy
// of the store Secret deleted by hand is put back at once, from its watch.
TEST_F(OperatorTest, ReconcilesReadTheInformersNotTheApiServer) {
  MakeSource("cached", 5, 6);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("cached", suite_->datasets() + "/cached"));
  ASSERT_OK(WaitCondition("cached", "Ready", "True", "", seconds(60)));
  const std::string requests = "granary_operator_api_requests_total";
  const std::map<std::string, std::string> secrets = {{"resource", "secrets"}, {"verb", "get"}};
  const std::map<std::string, std::string> namespaces = {{"resource", "namespaces"},
                                                         {"verb", "get"}};
  const std::string reconciles = "granary_operator_reconciles_total";
  // The exporter copies the counters every second: wait for a quiet one.
  std::this_thread::sleep_for(milliseconds(1500));
  const double secrets_before = OperatorMetric(requests, secrets);
  const double namespaces_before = OperatorMetric(requests, namespaces);
  const double reconciles_before = OperatorMetric(reconciles);
  for (int i = 0; i < 5; ++i) {
    Kubectl({"annotate", "dataset", "-n", "team-a", "cached", "--overwrite",
             "touch=" + std::to_string(i)});
    std::this_thread::sleep_for(milliseconds(400));
  }
  // At least one reconcile per touch, once the exporter has copied them.
  Status counted =
      cluster().WaitFor([&] { return OperatorMetric(reconciles) - reconciles_before >= 5.0; },
                        seconds(20), "five reconciles counted");
  EXPECT_TRUE(counted.ok()) << counted.ToString() << "; reconciles: " << OperatorMetric(reconciles)
                            << ", before the touches " << reconciles_before;
  // The counter counts: the Datasets' watch is in it.
  EXPECT_GE(OperatorMetric(requests, {{"resource", "datasets"}, {"verb", "watch"}}), 1.0);
  EXPECT_EQ(OperatorMetric(requests, secrets), secrets_before)
      << "Secrets read with GET while reconciling";
  EXPECT_EQ(OperatorMetric(requests, namespaces), namespaces_before)
      << "Namespaces read with GET while reconciling";
  // The copy of the store Secret the sidecars read, deleted: back at once.
  Kubectl({"delete", "secret", "-n", "team-a", "granary-store-gpu"});
  ASSERT_OK(cluster().WaitFor(
      [&] {
        return cluster().GetJson({"secret", "-n", "team-a", "granary-store-gpu"}).ok();
      },
      seconds(10), "the store Secret's copy in team-a made again"));
  Kubectl({"delete", "dataset", "-n", "team-a", "cached", "--timeout=60s"});
}

TEST_F(OperatorTest, InformerListsAgainWhenTheApiServerSaysGone) {
  Result<kube::KubeConfig> config = kube::LoadKubeConfig(cluster().kubeconfig_path());
  ASSERT_OK(config);
  Result<std::unique_ptr<kube::KubeClient>> client = kube::KubeClient::Create(*config);
  ASSERT_OK(client);
  kube::InformerOptions o;
  o.collection_path = "/api/v1/namespaces";
  o.start_resource_version = "1";  // long compacted away: the API server answers 410
  std::atomic<int> changes{0};
  kube::Informer informer(**client, o, [&](const std::string&) { ++changes; });
  informer.Start();
  ASSERT_OK(cluster().WaitFor([&] { return informer.synced(); }, seconds(20), "the relist"));
  EXPECT_GE(informer.gone(), 1u);
  EXPECT_TRUE(informer.Get("team-a").has_value());
  // And the watch that follows sees new objects.
  Kubectl({"create", "namespace", "informer-probe"});
  ASSERT_OK(cluster().WaitFor([&] { return informer.Get("informer-probe").has_value(); },
                              seconds(20), "the new namespace through the watch"));
  informer.Stop();
  // A client without credentials is refused, with the API server's reason.
  kube::KubeConfig anonymous = *config;
  anonymous.client_cert_pem.clear();
  anonymous.client_key_pem.clear();
  Result<std::unique_ptr<kube::KubeClient>> anon = kube::KubeClient::Create(anonymous);
  ASSERT_OK(anon);
  Result<kube::Json> secrets = (*anon)->Get("/api/v1/secrets");
  EXPECT_EQ(secrets.status().code(), StatusCode::kPermissionDenied) << secrets.status().ToString();
  // A client that does not trust the cluster's CA does not talk to it.
  kube::KubeConfig untrusting = *config;
  untrusting.ca_pem.clear();
  Result<std::unique_ptr<kube::KubeClient>> wary = kube::KubeClient::Create(untrusting);
  ASSERT_OK(wary);
  EXPECT_EQ((*wary)->Get("/version").status().code(), StatusCode::kUnavailable);
}

TEST_F(OperatorTest, TwoReplicasOneLeadsTheOtherTakesOverAfterSigkill) {
  ASSERT_OK(suite_->StartOperator());  // a second replica
  auto holder = [&]() -> std::string {
    Result<json> lease = cluster().GetJson({"lease", "-n", "granary", "granary-operator"});
    return lease.ok() ? (*lease)["spec"].value("holderIdentity", "") : "";
  };
  ASSERT_OK(cluster().WaitFor([&] { return !holder().empty(); }, seconds(20), "a lease holder"));
  const std::string first = holder();
  DaemonProcess* leader = nullptr;
  DaemonProcess* other = nullptr;
  for (auto& p : suite_->operators()) {
    if (!p->Running()) continue;
    (p->name() == first ? leader : other) = p.get();
  }
  ASSERT_NE(leader, nullptr) << first;
  ASSERT_NE(other, nullptr);
  ASSERT_OK(leader->Kill().status());
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_OK(cluster().WaitFor([&] { return holder() == other->name(); }, seconds(20),
                              "the other replica taking the lease"));
  const auto took =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - killed);
  EXPECT_LE(took.count(), 4000 + 2 * 500 + 1500) << "lease 4 s, retry 500 ms";
  std::cout << "failover took " << took.count() << " ms" << std::endl;
  // Its /metrics say so.
  const std::regex port_line("metrics on 127\\.0\\.0\\.1:([0-9]+)");
  std::smatch port;
  const std::string log = ReadAll(other->log_path());
  ASSERT_TRUE(std::regex_search(log, port, port_line)) << log;
  ASSERT_OK(cluster().WaitFor(
      [&] {
        KubectlResult m = Run({"curl", "-sf", "http://127.0.0.1:" + port[1].str() + "/metrics"});
        return m.out.find("granary_operator_leader 1") != std::string::npos &&
               m.out.find("granary_operator_reconciles_total") != std::string::npos;
      },
      seconds(10), "granary_operator_leader 1 on the new leader's /metrics"));
  EXPECT_EQ(Run({"curl", "-sf", "http://127.0.0.1:" + port[1].str() + "/readyz"}).exit_code, 0);
  // The new leader acts.
  MakeSource("after-failover", 5, 6);
  Kubectl({"apply", "-f", "-"},
          DatasetYaml("after-failover", suite_->datasets() + "/after-failover"));
  ASSERT_OK(WaitCondition("after-failover", "Ready", "True", "", seconds(60)));
  // Datasets by phase, from its cache: every phase present, the Ready ones
  // counted as kubectl counts them.
  Result<json> all = cluster().GetJson({"datasets", "-A"});
  ASSERT_OK(all);
  size_t ready = 0;
  for (const json& d : (*all)["items"]) {
    if (d.value("status", json::object()).value("phase", "") == "Ready") ++ready;
  }
  std::string text;
  ASSERT_OK(cluster().WaitFor(
      [&] {
        text = Run({"curl", "-sf", "http://127.0.0.1:" + port[1].str() + "/metrics"}).out;
        return text.find("granary_operator_datasets{phase=\"Ready\"} " + std::to_string(ready)) !=
               std::string::npos;
      },
      seconds(10), "granary_operator_datasets{phase=\"Ready\"} " + std::to_string(ready)));
  for (const char* phase : {"Pending", "Snapshotting", "Staging", "Failed"}) {
    EXPECT_NE(text.find(std::string("granary_operator_datasets{phase=\"") + phase + "\"}"),
              std::string::npos)
        << phase;
  }
}

TEST_F(OperatorTest, BadCommandLinesAndUnreachableServersAreClearErrors) {
  const std::string bin = GRANARY_OPERATOR_BINARY;
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  suite_->WriteFile("bad.kubeconfig", "apiVersion: v1\nclusters: [unclosed\n");
  suite_->WriteFile("nowhere.kubeconfig",
                    "apiVersion: v1\ncurrent-context: x\nclusters:\n- name: c\n  cluster: {server: "
                    "\"https://127.0.0.1:" +
                        std::to_string(FreeTcpPort()) +
                        "\"}\ncontexts:\n- name: x\n  context: {cluster: c}\n");
  const std::vector<Case> cases = {
      {{"--kubeconfig=" + suite_->Join("missing")}, 2, "cannot be read"},
      {{"--kubeconfig=" + suite_->Join("bad.kubeconfig")}, 2, "kubeconfig"},
      {{"--kubeconfig=" + cluster().kubeconfig_path(), "--context=nope"}, 2, "no context 'nope'"},
      {{"--kubeconfig=" + cluster().kubeconfig_path(), "--lease-duration=abc"},
       2,
       "--lease-duration"},
      {{"--kubeconfig=" + cluster().kubeconfig_path(), "--lease-duration=2s",
        "--renew-deadline=3s"},
       2,
       "--renew-deadline < --lease-duration"},
      {{"--kubeconfig=" + cluster().kubeconfig_path(), "--workers=0"}, 2, "workers"},
      {{"--kubeconfig=" + cluster().kubeconfig_path(), "--log-level=loud"}, 2, "--log-level"},
      {{"--kubeconfig=" + suite_->Join("nowhere.kubeconfig")}, 1, "connecting to the API server"},
      {{"--kubeconfig=" + cluster().kubeconfig_path(), "--metrics-listen=256.0.0.1:1"},
       1,
       "--metrics-listen"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(argv.back());
    KubectlResult r = Run(argv);
    EXPECT_EQ(r.exit_code, c.code) << r.Describe();
    EXPECT_THAT(r.out + r.err, HasSubstr(c.says));
  }
}

// --- the sidecar webhook's certificate and registration, the store Secret copies

// A Secret's key, base64-decoded ("" if it has none).
std::string SecretValue(const json& secret, const std::string& key) {
  const json& data = secret.value("data", json::object());
  if (!data.contains(key)) return "";
  Result<std::string> value = kube::Base64Decode(data[key].get<std::string>(), key);
  return value.ok() ? *value : "";
}

size_t Certificates(const std::string& pem) {
  size_t n = 0;
  for (size_t at = pem.find("BEGIN CERTIFICATE"); at != std::string::npos;
       at = pem.find("BEGIN CERTIFICATE", at + 1)) {
    ++n;
  }
  return n;
}

::testing::AssertionResult Holds(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s.ToString();
}

class OperatorWebhookTest : public OperatorTest {
 protected:
  static Result<json> TlsSecret() {
    return cluster().GetJson({"secret", "-n", "granary", "granary-webhook-tls"});
  }
  static Result<json> Registration() {
    return cluster().GetJson({"mutatingwebhookconfiguration", "granary-sidecar-injector"});
  }
  static std::string CaBundle() {
    Result<json> config = Registration();
    if (!config.ok() || (*config)["webhooks"].empty()) return "";
    return (*config)["webhooks"][0]["clientConfig"].value("caBundle", "");
  }
  // The registration's caBundle is the Secret's ca.crt (both base64 of the
  // same bytes).
  static bool Registered() {
    Result<json> secret = TlsSecret();
    return secret.ok() && !CaBundle().empty() &&
           CaBundle() == (*secret)["data"].value("ca.crt", "");
  }
  // A server-side dry run of a pod labelled for `dataset` in team-a: the API
  // server calls the webhook (verifying it with the caBundle) as for a create.
  static bool Injected(const std::string& dataset, std::string* last) {
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", "probe"}, {"labels", {{"granary.io/dataset", dataset}}}}},
                {"spec",
                 {{"containers", json::array({{{"name", "trainer"},
                                               {"image", "pytorch/pytorch:2"},
                                               {"command", {"python3", "train.py"}}}})}}}};
    KubectlResult r = cluster().Kubectl(
        {"create", "-n", "team-a", "--dry-run=server", "-o", "json", "-f", "-"}, pod.dump());
    *last = r.Describe() + r.out.substr(0, 300);
    return r.ok() && r.out.find("granary-sidecar") != std::string::npos;
  }
  // Stops every running replica and starts one serving the webhook on a
  // fresh port, registered by URL; `extra` flags appended. Its port.
  static Result<uint16_t> StartWebhookOperator(const std::vector<std::string>& extra = {}) {
    for (auto& p : suite_->operators()) {
      if (p->Running()) GRANARY_RETURN_IF_ERROR(p->Terminate(seconds(10)).status());
    }
    const uint16_t port = FreeTcpPort();
    std::vector<std::string> flags = {
        "--webhook-listen=127.0.0.1:" + std::to_string(port),
        "--webhook-url=https://127.0.0.1:" + std::to_string(port) + "/mutate",
        "--webhook-cert-ip=127.0.0.1", "--webhook-timeout=5s"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    GRANARY_RETURN_IF_ERROR(suite_->StartOperator(flags));
    return port;
  }
};

TEST_F(OperatorWebhookTest, OperatorMakesItsCertificateRegistersAndRecreatesIt) {
  MakeSource("webhook", 4, 9);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("webhook-ds", suite_->datasets() + "/webhook"));
  ASSERT_OK(WaitCondition("webhook-ds", "Ready", "True", "", seconds(60)));
  Result<uint16_t> port = StartWebhookOperator();
  ASSERT_OK(port);
  ASSERT_TRUE(Holds(cluster().WaitFor(
      Registered, seconds(30), "the Secret granary-webhook-tls and the registration's caBundle")))
      << suite_->OperatorLogs();
  Result<json> secret = TlsSecret();
  ASSERT_OK(secret);
  EXPECT_EQ((*secret)["type"], "kubernetes.io/tls");
  EXPECT_EQ((*secret)["metadata"]["labels"]["app.kubernetes.io/managed-by"], "granary-operator");
  kube::WebhookCert cert{SecretValue(*secret, "ca.crt"), SecretValue(*secret, "tls.crt"),
                         SecretValue(*secret, "tls.key")};
  Result<kube::WebhookCertInfo> info = kube::InspectWebhookCert(cert);
  ASSERT_OK(info);
  EXPECT_EQ(info->ip_addresses, std::vector<std::string>{"127.0.0.1"});
  EXPECT_TRUE(info->dns_names.empty());
  EXPECT_EQ(Certificates(cert.ca_pem), 1u);
  Result<json> config = cluster().GetJson(
      {"mutatingwebhookconfiguration", "granary-sidecar-injector", "--show-managed-fields"});
  ASSERT_OK(config);
  const json& w = (*config)["webhooks"][0];
  EXPECT_EQ(w["clientConfig"]["url"], "https://127.0.0.1:" + std::to_string(*port) + "/mutate");
  EXPECT_EQ(w["failurePolicy"], "Fail");
  EXPECT_EQ(w["timeoutSeconds"], 5);
  EXPECT_EQ(w["sideEffects"], "None");
  EXPECT_EQ(w["rules"][0]["operations"], json::array({"CREATE"}));
  EXPECT_EQ(w["namespaceSelector"]["matchExpressions"][0]["values"], json::array({"granary"}));
  EXPECT_EQ(w["objectSelector"]["matchExpressions"][0]["key"], "granary.io/dataset");
  bool applied = false;
  for (const json& f : (*config)["metadata"]["managedFields"]) {
    applied |= f.value("manager", "") == "granary-operator" && f.value("operation", "") == "Apply";
  }
  EXPECT_TRUE(applied);

  // The API server calls it (TLS verified with the caBundle): a pod created
  // with kubectl gets the sidecar.
  std::string last;
  ASSERT_TRUE(Holds(cluster().WaitFor([&] { return Injected("webhook-ds", &last); }, seconds(30),
                                      "the API server calling the operator's webhook")))
      << last << "\n"
      << suite_->OperatorLogs();
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "webhook-pod"}, {"labels", {{"granary.io/dataset", "webhook-ds"}}}}},
      {"spec", {{"containers", json::array({{{"name", "t"}, {"image", "pytorch/pytorch:2"}}})}}}};
  Kubectl({"create", "-n", "team-a", "-f", "-"}, pod.dump());
  Result<json> stored = cluster().GetJson({"pod", "-n", "team-a", "webhook-pod"});
  ASSERT_OK(stored);
  ASSERT_TRUE((*stored)["spec"].contains("initContainers")) << stored->dump(2);
  EXPECT_EQ((*stored)["spec"]["initContainers"][0]["name"], "granary-sidecar");
  Kubectl({"delete", "pod", "-n", "team-a", "webhook-pod", "--wait=false"});

  // The Secret deleted: made again, and the registration follows (the new
  // CA first, then the one the running replica still served); pods are
  // still injected, so the replica serves the new certificate.
  const std::string old_ca = cert.ca_pem;
  Kubectl({"delete", "secret", "-n", "granary", "granary-webhook-tls"});
  ASSERT_TRUE(Holds(cluster().WaitFor(
      [&] {
        Result<json> s = TlsSecret();
        return s.ok() && SecretValue(*s, "ca.crt").rfind(old_ca, 0) != 0 && Registered();
      },
      seconds(30), "a new Secret and caBundle")))
      << suite_->OperatorLogs();
  EXPECT_NE(CaBundle(), kube::Base64Encode(old_ca));
  ASSERT_TRUE(Holds(cluster().WaitFor([&] { return Injected("webhook-ds", &last); }, seconds(30),
                                      "pods injected with the new certificate")))
      << last;
  const std::string log = ReadAll(suite_->operators().back()->log_path());
  EXPECT_THAT(log, HasSubstr("making the Secret granary/granary-webhook-tls"));
  size_t loaded = 0;
  for (size_t at = log.find("serving the webhook certificate of Secret"); at != std::string::npos;
       at = log.find("serving the webhook certificate of Secret", at + 1)) {
    ++loaded;
  }
  EXPECT_GE(loaded, 2u) << "the replica did not load the recreated certificate";
}

TEST_F(OperatorWebhookTest, AShortValidityIsRenewedAndPodsAreStillInjected) {
  // A replica with certificates valid 40 s, renewed 30 s before their end:
  // one renewal about every 10 s.
  Result<uint16_t> port =
      StartWebhookOperator({"--webhook-cert-validity=40s", "--webhook-cert-renew-before=30s"});
  ASSERT_OK(port);
  // The year-long certificate of the last case is kept (names unchanged),
  // so it is replaced by a short one only once deleted.
  Kubectl({"delete", "secret", "-n", "granary", "granary-webhook-tls", "--ignore-not-found"});
  std::set<std::string> seen;
  ASSERT_TRUE(Holds(cluster().WaitFor(
      [&] {
        Result<json> s = TlsSecret();
        if (!s.ok()) return false;
        kube::WebhookCert c{SecretValue(*s, "ca.crt"), SecretValue(*s, "tls.crt"),
                            SecretValue(*s, "tls.key")};
        Result<kube::WebhookCertInfo> i = kube::InspectWebhookCert(c);
        if (i.ok() && i->not_after - std::chrono::system_clock::now() < std::chrono::minutes(2)) {
          seen.insert(c.cert_pem);
        }
        return seen.size() >= 3;
      },
      seconds(60), "two renewals of a 40 s certificate")))
      << suite_->OperatorLogs();
  // After a renewal ca.crt holds the new CA and the replaced one; the
  // registration carries both.
  ASSERT_OK(cluster().WaitFor(Registered, seconds(10), "the caBundle of the renewal"));
  EXPECT_EQ(Certificates(SecretValue(*TlsSecret(), "ca.crt")), 2u);
  std::string last;
  ASSERT_TRUE(Holds(cluster().WaitFor([&] { return Injected("webhook-ds", &last); }, seconds(30),
                                      "pods injected after the renewals")))
      << last;
  // Pods keep being injected across the next renewal.
  const std::string before = SecretValue(*TlsSecret(), "tls.crt");
  ASSERT_OK(cluster().WaitFor(
      [&] { return TlsSecret().ok() && SecretValue(*TlsSecret(), "tls.crt") != before; },
      seconds(30), "one more renewal"));
  ASSERT_TRUE(Holds(cluster().WaitFor([&] { return Injected("webhook-ds", &last); }, seconds(30),
                                      "pods injected after one more renewal")))
      << last;
  EXPECT_THAT(ReadAll(suite_->operators().back()->log_path()), HasSubstr("renewing the Secret"));
}

TEST_F(OperatorWebhookTest, BadWebhookFlagsExitTwoNamingTheFlag) {
  const std::string bin = GRANARY_OPERATOR_BINARY;
  const std::string kubeconfig = "--kubeconfig=" + cluster().kubeconfig_path();
  const std::string listen = "--webhook-listen=127.0.0.1:" + std::to_string(FreeTcpPort());
  const std::string url = "--webhook-url=https://127.0.0.1:1/mutate";
  // Bring your own certificate (the files are read, not parsed, before the
  // registration flags are checked).
  suite_->WriteFile("own-certs/tls.crt", "certificate");
  suite_->WriteFile("own-certs/tls.key", "key");
  const std::string cert_dir = "--webhook-cert-dir=" + suite_->Join("own-certs");
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{listen, url, "--webhook-failure-policy=Maybe"}, "--webhook-failure-policy"},
      {{listen, url, "--webhook-timeout=0s"}, "--webhook-timeout"},
      {{listen, url, "--webhook-timeout=31s"}, "--webhook-timeout"},
      {{listen, url, "--webhook-timeout=soon"}, "--webhook-timeout"},
      {{listen, "--webhook-url=https://127.0.0.1:99999/mutate"}, "--webhook-url"},
      {{listen, "--webhook-url=not a url"}, "--webhook-url"},
      {{listen, "--webhook-url=http://127.0.0.1:8443/mutate"}, "--webhook-url"},
      {{listen, url, "--webhook-service=granary-webhook"}, "--webhook-service"},
      {{listen, url, "--webhook-cert-ip=localhost"}, "--webhook-cert-ip"},
      {{listen, url, "--webhook-cert-validity=1h", "--webhook-cert-renew-before=2h"},
       "--webhook-cert-renew-before"},
      {{url}, "--webhook-listen"},
      {{listen, url, cert_dir}, "--webhook-ca-file"},
      {{listen, url, cert_dir, "--webhook-ca-file=" + suite_->Join("nonexistent")},
       "--webhook-ca-file"},
      {{listen, cert_dir, "--webhook-ca-file=" + suite_->Join("own-certs/tls.crt")},
       "--webhook-ca-file"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {bin, kubeconfig, "--metrics-listen=127.0.0.1:0"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    SCOPED_TRACE(c.args.back());
    KubectlResult r = Run(argv);
    EXPECT_EQ(r.exit_code, 2) << r.Describe();
    EXPECT_THAT(r.out + r.err, HasSubstr(c.says));
  }
}

// Last: changes the pool's store Secret (the cache node restarts).
TEST_F(OperatorWebhookTest, StoreSecretIsCopiedToEveryNamespaceWithADatasetOfThePool) {
  Kubectl({"apply", "-f", "-"},
          "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-c\n  annotations:\n"
          "    granary.io/allowed-uids: \"1000\"\n    granary.io/allowed-gids: \"1000\"\n---\n"
          "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-d\n  annotations:\n"
          "    granary.io/allowed-uids: \"1000\"\n    granary.io/allowed-gids: \"1000\"\n");
  MakeSource("copies", 3, 10);
  auto in_team_c = [&](const std::string& name) {
    return KubeSuite::DatasetYaml("team-c", name, suite_->datasets() + "/copies");
  };
  const std::string secret_name = kube::SidecarStoreSecretName("gpu");
  auto copy = [&] { return cluster().GetJson({"secret", "-n", "team-c", secret_name}); };
  auto owners = [&]() -> std::set<std::string> {
    std::set<std::string> names;
    Result<json> s = copy();
    if (!s.ok()) return names;
    for (const json& r : (*s)["metadata"].value("ownerReferences", json::array())) {
      names.insert(r.value("kind", "") + "/" + r.value("name", ""));
    }
    return names;
  };
  Kubectl({"apply", "-f", "-"}, in_team_c("copy-1"));
  ASSERT_TRUE(Holds(cluster().WaitFor([&] { return copy().ok(); }, seconds(30),
                                      "the store Secret copy in team-c")))
      << suite_->OperatorLogs();
  Result<json> copied = copy();
  ASSERT_OK(copied);
  EXPECT_EQ(SecretValue(*copied, "url"), suite_->redis().url());
  EXPECT_EQ((*copied)["metadata"]["labels"]["app.kubernetes.io/managed-by"], "granary-operator");
  EXPECT_EQ(owners(), std::set<std::string>{"Dataset/copy-1"});
  Kubectl({"apply", "-f", "-"}, in_team_c("copy-2"));
  ASSERT_OK(cluster().WaitFor(
      [&] {
        return owners() == std::set<std::string>{"Dataset/copy-1", "Dataset/copy-2"};
      },
      seconds(30), "both Datasets owning the copy"));
  // No Dataset, no copy: not in team-d, nor in the operator's namespace.
  EXPECT_EQ(cluster().GetJson({"secret", "-n", "team-d", secret_name}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(cluster().GetJson({"secret", "-n", "granary", secret_name}).status().code(),
            StatusCode::kNotFound);

  // The pool's Secret changes (the same Redis by another name): the copy follows.
  const std::string renamed = ReplaceAll(suite_->redis().url(), "127.0.0.1", "localhost");
  ASSERT_NE(renamed, suite_->redis().url());
  Kubectl({"patch", "secret", "-n", "granary", "granary-store", "--type=merge", "-p",
           json({{"stringData", {{"url", renamed}}}}).dump()});
  ASSERT_OK(cluster().WaitFor([&] { return copy().ok() && SecretValue(*copy(), "url") == renamed; },
                              seconds(20), "the copy taking the new URL"));

  // The last Dataset gone, the copy goes; before, it loses one owner.
  Kubectl({"delete", "dataset", "-n", "team-c", "copy-1", "--timeout=60s"});
  ASSERT_OK(cluster().WaitFor([&] { return owners() == std::set<std::string>{"Dataset/copy-2"}; },
                              seconds(30), "copy-2 alone owning the copy"));
  Kubectl({"delete", "dataset", "-n", "team-c", "copy-2", "--timeout=60s"});
  ASSERT_OK(cluster().WaitFor([&] { return copy().status().code() == StatusCode::kNotFound; },
                              seconds(30), "the copy deleted with the last Dataset"));
  // team-a keeps its copy while it has Datasets of the pool.
  EXPECT_TRUE(cluster().GetJson({"secret", "-n", "team-a", secret_name}).ok());
  Kubectl({"patch", "secret", "-n", "granary", "granary-store", "--type=merge", "-p",
           json({{"stringData", {{"url", suite_->redis().url()}}}}).dump()});
}

}  // namespace
}  // namespace granary::testing

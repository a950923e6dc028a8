// granary-operator against a real control plane (tests/testing/kube_cluster.h):
// the CRDs and the identity policy applied as the chart ships them, the
// examples in examples/kubernetes applied with kubectl, the cache-node
// DaemonSet the operator generates run as real granary-cachenode processes
// (PodRunner), a real Redis as the metadata store, and the operator itself a
// real process (or, for the informer's relist, the library in process).
// The last cases run the operator with its sidecar webhook (certificate,
// registration) and check the store Secret it copies to the Datasets'
// namespaces.
//
// The whole binary is one ctest test (one cluster for every case): a cluster
// costs seconds to start and the cases build on one CachePool.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "granary/core/metadata_store.h"
#include "granary/operator/base64.h"
#include "granary/operator/informer.h"
#include "granary/operator/kube_client.h"
#include "granary/operator/kube_config.h"
#include "granary/operator/resources.h"
#include "granary/operator/webhook_cert.h"
#include "granary/operator/webhook_lookup.h"
#include "testing/daemon_process.h"
#include "testing/kube_cluster.h"
#include "testing/pod_runner.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string Condition(const json& object, const std::string& type, const char* field = "status") {
  for (const json& c : object.value("status", json::object()).value("conditions", json::array())) {
    if (c.value("type", "") == type) return c.value(field, "");
  }
  return "";
}

class OperatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<std::string> tools = KubeCluster::ToolsDir();
    if (!tools.ok()) {
      skip_ = new std::string(tools.status().ToString());
      return;
    }
    env_ = new Env;
    Status s = env_->Start();
    if (!s.ok()) error_ = new std::string(s.ToString() + "\n" + env_->OperatorLogs());
  }
  static void TearDownTestSuite() {
    delete env_;
    env_ = nullptr;
  }
  void SetUp() override {
    if (skip_ != nullptr) GTEST_SKIP() << *skip_;
    ASSERT_EQ(error_, nullptr) << *error_;
  }
  void TearDown() override {
    if (env_ != nullptr && env_->cluster) {
      env_->cluster->PrintLogsIfTestFailed();
      if (env_->runner) env_->runner->PrintLogsIfTestFailed();
      if (HasFailure()) std::cerr << env_->OperatorLogs();
    }
  }

  // Everything the cases share: the cluster, Redis, the runner, the pool.
  struct Env {
    TempDir dir;  // sources and the pool's NVMe directory (mode 0755: uid 1000 walks it)
    std::unique_ptr<KubeCluster> cluster;
    std::unique_ptr<RedisServer> redis;
    std::unique_ptr<PodRunner> runner;
    std::vector<std::unique_ptr<DaemonProcess>> operators;
    uint16_t data_port = 0;
    uint16_t metrics_port = 0;
    int operator_count = 0;

    std::string datasets() const { return dir.Join("datasets"); }
    std::string nvme() const { return dir.Join("nvme"); }

    Status Start() {
      chmod(dir.path().c_str(), 0755);
      KubeClusterOptions o;
      // One node with NVMe: the pool's DaemonSet runs one cache node (every
      // fake node's processes share this host's ports).
      o.nodes = {{"gpu-node-1", {{"nvidia.com/gpu.present", "true"}, {"granary.io/nvme", "true"}}},
                 {"gpu-node-2", {{"nvidia.com/gpu.present", "true"}}}};
      GRANARY_ASSIGN_OR_RETURN(cluster, KubeCluster::Start(o));
      GRANARY_ASSIGN_OR_RETURN(redis, RedisServer::Start());
      const std::string root = GRANARY_SOURCE_DIR;
      KubectlResult r =
          cluster->Kubectl({"apply", "--server-side", "-f", root + "/charts/granary/crds/"});
      if (!r.ok()) return Status::Internal("applying the CRDs: " + r.Describe());
      r = cluster->Kubectl({"wait", "--for=condition=established", "--timeout=60s",
                            "crd/datasets.granary.io", "crd/cachepools.granary.io"});
      if (!r.ok()) return Status::Internal("CRDs not established: " + r.Describe());
      r = cluster->Kubectl(
          {"apply", "-f", root + "/charts/granary/policies/dataset-identity.yaml"});
      if (!r.ok()) return Status::Internal("applying the identity policy: " + r.Describe());
      // The example namespaces, with the store Secret naming the test's Redis.
      std::string namespaces = ReadAll(root + "/examples/kubernetes/namespace.yaml");
      namespaces = std::regex_replace(namespaces, std::regex("url: \"redis://[^\"]*\""),
                                      "url: \"" + redis->url() + "\"");
      r = cluster->Kubectl({"apply", "--validate=strict", "-f", "-"}, namespaces);
      if (!r.ok()) return Status::Internal("applying namespace.yaml: " + r.Describe());
      PodRunnerOptions ro;
      ro.images = {{"granary", GRANARY_POD_BIN_DIR}};
      runner = std::make_unique<PodRunner>(*cluster, ro);
      GRANARY_RETURN_IF_ERROR(runner->Start());
      GRANARY_RETURN_IF_ERROR(StartOperator());
      // The example pool, on this host's directories and free ports.
      std::filesystem::create_directories(datasets());
      data_port = FreeTcpPort();
      metrics_port = FreeTcpPort();
      std::string pool = ReadAll(root + "/examples/kubernetes/cachepool.yaml");
      pool = ReplaceAll(pool, "/nvme/granary", nvme());
      pool = ReplaceAll(pool, "/mnt/datasets", datasets());
      pool = ReplaceAll(pool, "data: 7070", "data: " + std::to_string(data_port));
      pool = ReplaceAll(pool, "metrics: 9464", "metrics: " + std::to_string(metrics_port));
      r = cluster->Kubectl({"apply", "--validate=strict", "-f", "-"}, pool);
      if (!r.ok()) return Status::Internal("applying cachepool.yaml: " + r.Describe());
      GRANARY_RETURN_IF_ERROR(
          runner->WaitForRunning(PodRunner::InNamespace("granary"), 1, seconds(60)));
      Status ready = cluster->WaitFor(
          [&] {
            Result<json> p = cluster->GetJson({"cachepool", "gpu"});
            return p.ok() && Condition(*p, "Ready") == "True" &&
                   p->value("status", json::object()).value("capacityBytes", uint64_t{0}) > 0;
          },
          seconds(60), "CachePool gpu Ready with its node registered");
      if (!ready.ok()) {
        return Status(ready.code(),
                      ready.message() + "\n" +
                          cluster->Kubectl({"get", "cachepool", "gpu", "-o", "yaml"}).out);
      }
      return ready;
    }

    Status StartOperator(const std::vector<std::string>& extra = {}) {
      DaemonProcessOptions o;
      o.binary = GRANARY_OPERATOR_BINARY;
      o.name = "operator-" + std::to_string(++operator_count);
      o.log_path = dir.Join(o.name + ".log");
      o.args = {"--kubeconfig=" + cluster->kubeconfig_path(),
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
      operators.push_back(std::move(p));
      return Status::Ok();
    }

    Result<std::unique_ptr<MetadataStore>> Store() const { return OpenMetadataStore(redis->url()); }

    std::string OperatorLogs() const {
      std::string out;
      for (const auto& p : operators) {
        std::string log = ReadAll(p->log_path());
        if (log.size() > 6000) log = "..." + log.substr(log.size() - 6000);
        out += "---- " + p->name() + " ----\n" + log;
      }
      return out;
    }
  };

  static KubeCluster& cluster() { return *env_->cluster; }

  static std::string Kubectl(const std::vector<std::string>& args, const std::string& in = "") {
    return cluster().MustKubectl(args, in);
  }

  // A source tree of `files` files of random sizes (uid 1000 may read it).
  static std::vector<std::pair<std::string, std::string>> MakeSource(const std::string& rel,
                                                                     int files, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < files; ++i) {
      const std::string path =
          "class" + std::to_string(i % 4) + "/img" + std::to_string(i) + ".JPEG";
      const std::string bytes = Bytes(rel + path, 100 + rng() % 200000);
      env_->dir.WriteFile("datasets/" + rel + "/" + path, bytes);
      out.emplace_back(path, bytes);
    }
    env_->dir.WriteFile("datasets/" + rel + "/notes.txt", "not a JPEG: excluded by include");
    std::filesystem::path p = env_->datasets();
    for (auto& e : std::filesystem::recursive_directory_iterator(env_->datasets())) {
      chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644);
    }
    chmod(env_->datasets().c_str(), 0755);
    return out;
  }

  static std::string DatasetYaml(const std::string& name, const std::string& source,
                                 const std::string& extra = "") {
    return "apiVersion: granary.io/v1alpha1\nkind: Dataset\nmetadata: {name: " + name +
           ", namespace: team-a}\nspec:\n  cachePool: gpu\n  source: " + source +
           "\n  chunkSize: 64Ki\n  runAs: {uid: 1000, gid: 1000}\n" + extra;
  }

  static KubectlResult Run(const std::vector<std::string>& argv) {
    return RunProgram(argv, {}, "", env_->dir.path(), seconds(60));
  }

  // granary_cachenode_snapshots_total{result="ok"} of the pool's cache node.
  static double SnapshotsOk() {
    KubectlResult r =
        Run({"curl", "-sf", "http://127.0.0.1:" + std::to_string(env_->metrics_port) + "/metrics"});
    EXPECT_EQ(r.exit_code, 0) << r.Describe();
    std::smatch m;
    const std::regex line("granary_cachenode_snapshots_total\\{result=\"ok\"\\} ([0-9.e+]+)");
    if (!std::regex_search(r.out, m, line)) {
      ADD_FAILURE() << "no snapshots_total{result=\"ok\"} in the cache node's metrics";
      return -1;
    }
    return std::stod(m[1].str());
  }

  static Result<json> Dataset(const std::string& name) {
    return cluster().GetJson({"dataset", "-n", "team-a", name});
  }

  static Status WaitCondition(const std::string& name, const std::string& type,
                              const std::string& status, const std::string& reason,
                              milliseconds timeout) {
    return cluster().WaitFor(
        [&] {
          Result<json> d = Dataset(name);
          return d.ok() && Condition(*d, type) == status &&
                 (reason.empty() || Condition(*d, type, "reason") == reason);
        },
        timeout, "dataset " + name + " " + type + "=" + status + " " + reason);
  }

  static Env* env_;
  static std::string* skip_;
  static std::string* error_;
};

OperatorTest::Env* OperatorTest::env_ = nullptr;
std::string* OperatorTest::skip_ = nullptr;
std::string* OperatorTest::error_ = nullptr;

TEST_F(OperatorTest, ExampleDatasetStagesAndReportsWhatTheStoreSays) {
  const auto files = MakeSource("imagenet/train", 120, 1);
  std::string yaml = ReadAll(std::string(GRANARY_SOURCE_DIR) + "/examples/kubernetes/dataset.yaml");
  yaml = ReplaceAll(yaml, "/mnt/datasets", env_->datasets());
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
  EXPECT_EQ(Condition(*d, "Snapshotted"), "True");
  EXPECT_EQ(Condition(*d, "Staged"), "True");
  EXPECT_THAT((*d)["metadata"]["finalizers"].dump(), HasSubstr("granary.io/release-cache"));
  uint64_t total = 0;
  for (const auto& [p, b] : files) total += b.size();
  EXPECT_EQ(st.value("files", size_t{0}), files.size());  // notes.txt is not included
  EXPECT_EQ(st.value("totalBytes", uint64_t{0}), total);
  EXPECT_EQ(st.value("stagedBytes", uint64_t{0}), total);
  EXPECT_EQ(st.value("stagedPercent", 0), 100);
  EXPECT_EQ(st.value("nodes", 0), 1);

  // The same numbers as granary's own view of the store.
  KubectlResult show = Run(
      {GRANARY_CLI_BINARY, "--store", env_->redis->url(), "-o", "json", "dataset", "show", gname});
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
                                       " +[0-9.]+[KMG]i +[0-9.]+[KMG]i +100 +Ready"));
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
  const std::string pools = Kubectl({"get", "cachepools"});
  EXPECT_THAT(pools, ::testing::ContainsRegex("gpu +1 +1 +"));

  // Every sample read back through the cache node (no source fall-through).
  std::vector<std::string> args = {
      GRANARY_CLI_BINARY, "--store", env_->redis->url(), "cat", gname, "--direct", "--no-source"};
  std::string expected;
  for (const auto& [p, b] : files) {
    args.push_back(p);
    expected += b;
  }
  KubectlResult cat = Run(args);
  ASSERT_EQ(cat.exit_code, 0) << cat.Describe();
  EXPECT_EQ(cat.out.size(), expected.size());
  EXPECT_TRUE(cat.out == expected) << "bytes read back differ from the source";
}

TEST_F(OperatorTest, BadDatasetsGetAConditionAndAnEventAndStageNothing) {
  MakeSource("good", 3, 2);
  std::filesystem::create_directories(env_->datasets() + "/locked");
  env_->dir.WriteFile("datasets/locked/a.JPEG", "secret");
  chmod((env_->datasets() + "/locked").c_str(), 0700);  // root's: uid 1000 cannot list it
  Kubectl({"apply", "-f", "-"}, ReplaceAll(DatasetYaml("no-pool", env_->datasets() + "/good"),
                                           "cachePool: gpu", "cachePool: nowhere") +
                                    "---\n" + DatasetYaml("outside", "/etc") + "---\n" +
                                    DatasetYaml("missing", env_->datasets() + "/does-not-exist") +
                                    "---\n" +
                                    DatasetYaml("unreadable", env_->datasets() + "/locked"));
  ASSERT_OK(WaitCondition("no-pool", "Ready", "False", "PoolNotFound", seconds(30)));
  ASSERT_OK(WaitCondition("outside", "Ready", "False", "SourceNotMounted", seconds(30)));
  ASSERT_OK(WaitCondition("missing", "Ready", "False", "Failed", seconds(60)));
  ASSERT_OK(WaitCondition("unreadable", "Ready", "False", "Failed", seconds(60)));
  EXPECT_THAT(Condition(*Dataset("outside"), "Ready", "message"), HasSubstr(env_->datasets()));
  EXPECT_THAT(Condition(*Dataset("missing"), "Ready", "message"), HasSubstr("does-not-exist"));
  EXPECT_THAT(Condition(*Dataset("unreadable"), "Ready", "message"), HasSubstr("1000"));
  const std::string events = Kubectl({"get", "events", "-n", "team-a", "-o", "json"});
  for (const char* reason : {"PoolNotFound", "SourceNotMounted", "Failed"}) {
    EXPECT_THAT(events, HasSubstr("\"reason\": \"" + std::string(reason) + "\"")) << reason;
  }
  EXPECT_THAT(Kubectl({"describe", "dataset", "-n", "team-a", "outside"}),
              HasSubstr("SourceNotMounted"));
  // Nothing of them is in the store but records without a manifest.
  Result<std::unique_ptr<MetadataStore>> store = env_->Store();
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

TEST_F(OperatorTest, DeletingADatasetDropsItsChunksAndRecordsThenTheFinalizer) {
  MakeSource("deleteme", 20, 3);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("deleteme", env_->datasets() + "/deleteme"));
  ASSERT_OK(WaitCondition("deleteme", "Ready", "True", "", seconds(60)));
  const std::string gname = kube::GranaryDatasetName("team-a", "deleteme");
  const std::string manifest = (*Dataset("deleteme"))["status"].value("manifestId", "");
  ASSERT_FALSE(manifest.empty());
  auto chunk_files = [&] {
    size_t n = 0;
    for (auto& e : std::filesystem::recursive_directory_iterator(env_->nvme())) {
      if (e.is_regular_file() &&
          e.path().string().find(manifest.substr(0, 16)) != std::string::npos)
        ++n;
    }
    return n;
  };
  EXPECT_GT(chunk_files(), 0u) << "no chunk file names the manifest under " << env_->nvme();
  KubectlResult del =
      cluster().Kubectl({"delete", "dataset", "-n", "team-a", "deleteme", "--timeout=60s"});
  ASSERT_TRUE(del.ok()) << del.Describe();
  EXPECT_EQ(Dataset("deleteme").status().code(), StatusCode::kNotFound);
  Result<std::unique_ptr<MetadataStore>> store = env_->Store();
  ASSERT_OK(store);
  EXPECT_EQ((*store)->GetDataset(gname).status().code(), StatusCode::kNotFound);
  ASSERT_OK(cluster().WaitFor([&] { return chunk_files() == 0; }, seconds(30),
                              "the cache node dropping the deleted dataset's chunk files"));
}

TEST_F(OperatorTest, OperatorKilledAndApiServerRestartedStatusConvergesWithOneSnapshot) {
  MakeSource("restarts", 40, 4);
  const double snapshots_before = SnapshotsOk();
  Kubectl({"apply", "-f", "-"}, DatasetYaml("restarts", env_->datasets() + "/restarts"));
  // Kill the operator as soon as it has created the store record.
  Result<std::unique_ptr<MetadataStore>> store = env_->Store();
  ASSERT_OK(store);
  const std::string gname = kube::GranaryDatasetName("team-a", "restarts");
  ASSERT_OK(cluster().WaitFor([&] { return (*store)->GetDataset(gname).ok(); }, seconds(30),
                              "the store record"));
  ASSERT_OK(env_->operators.back()->Kill().status());
  ASSERT_OK(cluster().RestartApiServer());
  ASSERT_OK(env_->StartOperator());
  ASSERT_OK(WaitCondition("restarts", "Ready", "True", "", seconds(90)));
  Result<DatasetRecord> record = (*store)->GetDataset(gname);
  ASSERT_OK(record);
  EXPECT_EQ(record->manifest_id, (*Dataset("restarts"))["status"].value("manifestId", ""));
  // One snapshot: the cache node walked the source once, and the Events say
  // Created and Snapshotted once.
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
  EXPECT_EQ(created, 1) << events;
}

TEST_F(OperatorTest, SpecChangeOfTheBytesTakesANewSnapshot) {
  MakeSource("respec", 10, 5);
  env_->dir.WriteFile("datasets/respec/extra/more.png", "png bytes");
  chmod((env_->datasets() + "/respec/extra").c_str(), 0755);
  chmod((env_->datasets() + "/respec/extra/more.png").c_str(), 0644);
  Kubectl({"apply", "-f", "-"},
          DatasetYaml("respec", env_->datasets() + "/respec", "  include: [\"*.JPEG\"]\n"));
  ASSERT_OK(WaitCondition("respec", "Ready", "True", "", seconds(60)));
  const std::string first = (*Dataset("respec"))["status"].value("manifestId", "");
  EXPECT_EQ((*Dataset("respec"))["status"].value("files", 0), 10);
  Kubectl({"patch", "dataset", "-n", "team-a", "respec", "--type=merge", "-p",
           R"({"spec":{"include":["*.JPEG","*.png"]}})"});
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> d = Dataset("respec");
        return d.ok() && Condition(*d, "Ready") == "True" &&
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
  Result<std::unique_ptr<MetadataStore>> store = env_->Store();
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
  Kubectl({"apply", "-f", "-"}, DatasetYaml("granted", env_->datasets() + "/granted"));
  ASSERT_OK(WaitCondition("granted", "Ready", "True", "", seconds(60)));
  const std::string gname = kube::GranaryDatasetName("team-a", "granted");
  Result<std::unique_ptr<MetadataStore>> store = env_->Store();
  ASSERT_OK(store);
  // An admin withdraws uid 1000 (the policy checks creates and runAs
  // changes; the operator checks every reconcile). A touch of the Dataset
  // makes the operator look at once.
  Kubectl({"annotate", "namespace", "team-a", "--overwrite", "granary.io/allowed-uids=2000"});
  Kubectl({"annotate", "dataset", "-n", "team-a", "granted", "touch=1"});
  ASSERT_OK(WaitCondition("granted", "Ready", "False", "IdentityNotGranted", seconds(30)));
  Result<DatasetRecord> stopped = (*store)->GetDataset(gname);
  ASSERT_OK(stopped);
  EXPECT_EQ(stopped->state.phase, DatasetPhase::kFailed);
  EXPECT_THAT(stopped->state.message, HasSubstr("no longer grants"));
  EXPECT_THAT(Condition(*Dataset("granted"), "Ready", "message"), HasSubstr("uid 1000"));
  // Granted again: a new snapshot as that identity, Ready again.
  Kubectl({"annotate", "namespace", "team-a", "--overwrite", "granary.io/allowed-uids=1000"});
  Kubectl({"annotate", "dataset", "-n", "team-a", "granted", "--overwrite", "touch=2"});
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
               Condition(*d, "Ready") == "True";
      },
      seconds(60), "the snapshot asked for by the annotation"));
  EXPECT_EQ(SnapshotsOk() - before, 1.0);
  Kubectl({"annotate", "dataset", "-n", "team-a", "granted", "--overwrite", "touch=3"});
  std::this_thread::sleep_for(milliseconds(1500));  // several reconciles at 300 ms
  EXPECT_EQ(SnapshotsOk() - before, 1.0);
  Kubectl({"delete", "dataset", "-n", "team-a", "granted", "--timeout=60s"});
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
  ASSERT_OK(env_->StartOperator());  // a second replica
  auto holder = [&]() -> std::string {
    Result<json> lease = cluster().GetJson({"lease", "-n", "granary", "granary-operator"});
    return lease.ok() ? (*lease)["spec"].value("holderIdentity", "") : "";
  };
  ASSERT_OK(cluster().WaitFor([&] { return !holder().empty(); }, seconds(20), "a lease holder"));
  const std::string first = holder();
  DaemonProcess* leader = nullptr;
  DaemonProcess* other = nullptr;
  for (auto& p : env_->operators) {
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
          DatasetYaml("after-failover", env_->datasets() + "/after-failover"));
  ASSERT_OK(WaitCondition("after-failover", "Ready", "True", "", seconds(60)));
}

TEST_F(OperatorTest, BadCommandLinesAndUnreachableServersAreClearErrors) {
  const std::string bin = GRANARY_OPERATOR_BINARY;
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  env_->dir.WriteFile("bad.kubeconfig", "apiVersion: v1\nclusters: [unclosed\n");
  env_->dir.WriteFile(
      "nowhere.kubeconfig",
      "apiVersion: v1\ncurrent-context: x\nclusters:\n- name: c\n  cluster: {server: "
      "\"https://127.0.0.1:" +
          std::to_string(FreeTcpPort()) + "\"}\ncontexts:\n- name: x\n  context: {cluster: c}\n");
  const std::vector<Case> cases = {
      {{"--kubeconfig=" + env_->dir.Join("missing")}, 2, "cannot be read"},
      {{"--kubeconfig=" + env_->dir.Join("bad.kubeconfig")}, 2, "kubeconfig"},
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
      {{"--kubeconfig=" + env_->dir.Join("nowhere.kubeconfig")}, 1, "connecting to the API server"},
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
    for (auto& p : env_->operators) {
      if (p->Running()) GRANARY_RETURN_IF_ERROR(p->Terminate(seconds(10)).status());
    }
    const uint16_t port = FreeTcpPort();
    std::vector<std::string> flags = {
        "--webhook-listen=127.0.0.1:" + std::to_string(port),
        "--webhook-url=https://127.0.0.1:" + std::to_string(port) + "/mutate",
        "--webhook-cert-ip=127.0.0.1", "--webhook-timeout=5s"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    GRANARY_RETURN_IF_ERROR(env_->StartOperator(flags));
    return port;
  }
};

TEST_F(OperatorWebhookTest, OperatorMakesItsCertificateRegistersAndRecreatesIt) {
  MakeSource("webhook", 4, 9);
  Kubectl({"apply", "-f", "-"}, DatasetYaml("webhook-ds", env_->datasets() + "/webhook"));
  ASSERT_OK(WaitCondition("webhook-ds", "Ready", "True", "", seconds(60)));
  Result<uint16_t> port = StartWebhookOperator();
  ASSERT_OK(port);
  ASSERT_TRUE(Holds(cluster().WaitFor(
      Registered, seconds(30), "the Secret granary-webhook-tls and the registration's caBundle")))
      << env_->OperatorLogs();
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
      << env_->OperatorLogs();
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
      << env_->OperatorLogs();
  EXPECT_NE(CaBundle(), kube::Base64Encode(old_ca));
  ASSERT_TRUE(Holds(cluster().WaitFor([&] { return Injected("webhook-ds", &last); }, seconds(30),
                                      "pods injected with the new certificate")))
      << last;
  const std::string log = ReadAll(env_->operators.back()->log_path());
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
      << env_->OperatorLogs();
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
  EXPECT_THAT(ReadAll(env_->operators.back()->log_path()), HasSubstr("renewing the Secret"));
}

TEST_F(OperatorWebhookTest, BadWebhookFlagsExitTwoNamingTheFlag) {
  const std::string bin = GRANARY_OPERATOR_BINARY;
  const std::string kubeconfig = "--kubeconfig=" + cluster().kubeconfig_path();
  const std::string listen = "--webhook-listen=127.0.0.1:" + std::to_string(FreeTcpPort());
  const std::string url = "--webhook-url=https://127.0.0.1:1/mutate";
  // Bring your own certificate (the files are read, not parsed, before the
  // registration flags are checked).
  env_->dir.WriteFile("own-certs/tls.crt", "certificate");
  env_->dir.WriteFile("own-certs/tls.key", "key");
  const std::string cert_dir = "--webhook-cert-dir=" + env_->dir.Join("own-certs");
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
      {{listen, url, cert_dir, "--webhook-ca-file=" + env_->dir.Join("nonexistent")},
       "--webhook-ca-file"},
      {{listen, cert_dir, "--webhook-ca-file=" + env_->dir.Join("own-certs/tls.crt")},
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
    return ReplaceAll(DatasetYaml(name, env_->datasets() + "/copies"), "namespace: team-a",
                      "namespace: team-c");
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
      << env_->OperatorLogs();
  Result<json> copied = copy();
  ASSERT_OK(copied);
  EXPECT_EQ(SecretValue(*copied, "url"), env_->redis->url());
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
  const std::string renamed = ReplaceAll(env_->redis->url(), "127.0.0.1", "localhost");
  ASSERT_NE(renamed, env_->redis->url());
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
           json({{"stringData", {{"url", env_->redis->url()}}}}).dump()});
}

}  // namespace
}  // namespace granary::testing

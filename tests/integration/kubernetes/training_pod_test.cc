// A training Job on the real control plane, end to end: the real
// API server calls granary-operator's webhook (registered by the operator,
// with its own certificate), the stored pod carries the injected sidecar, the
// real scheduler binds it to a pool node, and PodRunner runs the injected
// sidecar from the pod spec, then the app container, `python3 train.py`
// (tests/trainer/check_epochs.py), which reads every sample of two epochs through
// granary.torch over $GRANARY_SOCKET and checks each against the source. The
// Job completes when the trainer exits 0 (PodRunner reports the pod's end).
//
// The pool has 4 nodes; one real cache node runs on gpu-node-1 (KubeSuite).
// The trained Dataset is placed on gpu-node-1 (spec.nodes), so the webhook's
// preferred affinity draws the pod there; a second Dataset placed on
// gpu-node-3 and gpu-node-4 draws its pods to those two.
//
// One cluster for the binary, run as one ctest test: the cases share the
// pool and build on its Datasets.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "granary/operator/resources.h"
#include "testing/kube_suite.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr char kNamespace[] = "team-a";
constexpr char kTrained[] = "e2e-train";
constexpr char kPlaced[] = "e2e-placed";
constexpr int kFiles = 600;

std::string PythonPath() { return ::granary::testing::PythonPath(GRANARY_PYTHONPATH); }

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const json* FindNamed(const json& list, const std::string& name) {
  if (!list.is_array()) return nullptr;
  for (const json& item : list) {
    if (item.value("name", "") == name) return &item;
  }
  return nullptr;
}

std::string EnvValue(const json& container, const std::string& name) {
  const json env = container.value("env", json::array());
  const json* var = FindNamed(env, name);
  return var != nullptr ? var->value("value", "<valueFrom>") : "<unset>";
}

class TrainingPodTest : public SharedKubeTest<TrainingPodTest> {
 public:
  static std::string SkipReason() {
    return kAsanBuild ? "an ASan build's Python module cannot be loaded by python3" : "";
  }
  static Status StartShared() {
    webhook_port_ = FreeTcpPort();
    KubeSuiteOptions o;
    o.source_dir = GRANARY_SOURCE_DIR;
    o.pod_bin_dir = GRANARY_POD_BIN_DIR;
    o.operator_binary = GRANARY_OPERATOR_BINARY;
    o.pool_nodes = 4;
    o.run_jobs = true;
    // The training image's `python3` is this host's.
    o.extra_images = {{"pytorch", "/usr/bin"}};
    const std::string address = "127.0.0.1:" + std::to_string(webhook_port_);
    o.operator_flags = {"--webhook-listen=" + address,
                        "--webhook-url=https://" + address + "/mutate",
                        "--webhook-cert-ip=127.0.0.1"};
    suite_ = new KubeSuite(o);
    Status up = suite_->Start();
    if (!up.ok()) return Status(up.code(), up.message() + "\n" + suite_->OperatorLogs());
    // The source: files of 1..48 KiB in 8 class folders, random bytes.
    std::mt19937_64 rng(17);
    std::vector<std::pair<std::string, std::string>> files;
    for (int i = 0; i < kFiles; ++i) {
      std::string bytes(1024 + rng() % (47 * 1024), '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      files.emplace_back("class" + std::to_string(i % 8) + "/img" + std::to_string(i) + ".JPEG",
                         std::move(bytes));
    }
    suite_->WriteSource("e2e/train", files);
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
  static std::string Source() { return suite_->datasets() + "/e2e/train"; }

  // Applies Dataset `name` (the e2e source, placed on `nodes`) and waits
  // for its condition.
  static void ApplyDataset(const std::string& name, const std::vector<std::string>& nodes,
                           const std::string& condition) {
    std::string extra = "  nodes:\n";
    for (const std::string& n : nodes) extra += "    - " + n + "\n";
    cluster().MustKubectl({"apply", "--validate=strict", "-f", "-"},
                          KubeSuite::DatasetYaml(kNamespace, name, Source(), extra));
    ASSERT_OK(suite_->WaitDatasetCondition(kNamespace, name, condition, "True", "", seconds(120)));
  }

  // Waits until a dry-run pod naming `dataset` is injected: the operator has
  // registered the webhook and the API server trusts its certificate.
  static void WaitWebhookInjects(const std::string& dataset) {
    std::string last;
    Status injected = cluster().WaitFor(
        [&] {
          KubectlResult r = cluster().Kubectl(
              {"create", "-n", kNamespace, "--dry-run=server", "-o", "json", "-f", "-"},
              BarePod("probe", dataset).dump());
          last = r.Describe();
          return r.ok() && r.out.find("granary-sidecar") != std::string::npos;
        },
        seconds(60), "granary-operator's registered webhook to inject a pod");
    ASSERT_TRUE(injected.ok()) << injected.ToString() << "; last: " << last << "\n"
                               << suite_->OperatorLogs();
  }

  static json BarePod(const std::string& name, const std::string& dataset) {
    return {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", name}, {"labels", {{"granary.io/dataset", dataset}}}}},
            {"spec",
             {{"containers", json::array({{{"name", "trainer"},
                                           {"image", "example.org/other/trainer:1"},
                                           {"command", {"python3", "train.py"}}}})}}}};
  }

  static inline KubeSuite* suite_ = nullptr;
  static inline uint16_t webhook_port_ = 0;
};

TEST_F(TrainingPodTest, AJobReadsEveryEpochSampleThroughItsInjectedSidecar) {
  ApplyDataset(kTrained, {"gpu-node-1"}, "Ready");
  // The store Secret the sidecar mounts, copied by the operator.
  ASSERT_OK(cluster().WaitFor(
      [] {
        return cluster().GetJson({"secret", "-n", kNamespace, "granary-store-gpu"}).ok();
      },
      seconds(30), "Secret team-a/granary-store-gpu"));
  WaitWebhookInjects(kTrained);

  cluster().MustKubectl(KubeSuite::TrainerScriptConfigMap(kNamespace));
  // What a user writes: a label, and nothing about Granary in the container.
  const json job = KubeSuite::TrainingJob(kNamespace, "train", kTrained, Source(),
                                          suite_->sidecar_metrics_port(), PythonPath());
  cluster().MustKubectl({"apply", "-f", "-"}, job.dump());

  // The stored pod: injected, and bound by the real scheduler to the node
  // that holds the dataset's chunks.
  json pod;
  ASSERT_OK(cluster().WaitFor(
      [&] {
        Result<json> pods = cluster().GetJson({"pods", "-n", kNamespace, "-l", "job-name=train"});
        if (!pods.ok() || (*pods)["items"].empty()) return false;
        pod = (*pods)["items"][0];
        return !pod["spec"].value("nodeName", "").empty();
      },
      seconds(60), "the Job's pod to be created and scheduled"));
  EXPECT_EQ(pod["spec"]["nodeName"], "gpu-node-1");
  const json& sidecar = pod["spec"]["initContainers"][0];
  EXPECT_EQ(sidecar["name"], "granary-sidecar");
  EXPECT_EQ(sidecar["restartPolicy"], "Always");
  EXPECT_EQ(sidecar["securityContext"]["runAsUser"], 1000);
  const json& trainer = pod["spec"]["containers"][0];
  EXPECT_EQ(EnvValue(trainer, "GRANARY_SOCKET"), "/run/granary/sidecar.sock");
  EXPECT_EQ(EnvValue(trainer, "GRANARY_DATASET"), kube::GranaryDatasetName(kNamespace, kTrained));
  const json& preferred =
      pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(preferred.size(), 1u) << preferred.dump();
  EXPECT_EQ(preferred[0]["preference"]["matchFields"][0]["values"], json::array({"gpu-node-1"}));
  std::cout << "the injected pod spec (what the API server stored):\n"
            << pod["spec"].dump(2) << "\n"
            << pod["metadata"]["annotations"].dump(2) << "\n";

  // The Job completes once the trainer has read and checked both epochs.
  std::string last;
  Status done = cluster().WaitFor(
      [&] {
        Result<json> j = cluster().GetJson({"job", "-n", kNamespace, "train"});
        if (!j.ok()) return false;
        last = j->value("status", json::object()).dump();
        return ConditionField(*j, "Complete") == "True" || ConditionField(*j, "Failed") == "True";
      },
      seconds(240), "Job team-a/train to complete");
  std::string trainer_log;
  std::string sidecar_log;
  for (const ContainerExit& e : suite_->runner().Exits()) {
    if (e.container == "trainer") trainer_log = ReadWhole(e.log_path);
    if (e.container == "granary-sidecar") sidecar_log = ReadWhole(e.log_path);
  }
  ASSERT_TRUE(done.ok()) << done.ToString() << " " << last << "\ntrainer:\n"
                         << trainer_log << "\nsidecar:\n"
                         << sidecar_log;
  Result<json> finished = cluster().GetJson({"job", "-n", kNamespace, "train"});
  ASSERT_OK(finished);
  EXPECT_EQ(ConditionField(*finished, "Complete"), "True")
      << (*finished)["status"].dump() << "\ntrainer:\n"
      << trainer_log << "\nsidecar:\n"
      << sidecar_log;
  EXPECT_THAT(trainer_log, HasSubstr("trainer OK: " + std::to_string(kFiles) + " samples"));
  // The same-host chunk handoff served the reads (train.py fails without it).
  EXPECT_THAT(trainer_log, HasSubstr("granary_sidecar_local_file_pieces_total"));
  std::cout << "trainer's output:\n" << trainer_log << "\n";
  // The operator logs what its webhook did.
  EXPECT_THAT(suite_->OperatorLogs(100000),
              HasSubstr("webhook: injected the sidecar into pod team-a/train-"));
}

TEST_F(TrainingPodTest, PodsOfADatasetPlacedOnTwoOfFourNodesLandOnThoseTwo) {
  // Snapshotted is enough: the pods are only scheduled (kwok runs them).
  ApplyDataset(kPlaced, {"gpu-node-3", "gpu-node-4"}, "Snapshotted");
  WaitWebhookInjects(kPlaced);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "placed-" + std::to_string(i);
    cluster().MustKubectl({"create", "-n", kNamespace, "-f", "-"}, BarePod(name, kPlaced).dump());
    std::string node;
    ASSERT_OK(cluster().WaitFor(
        [&] {
          Result<json> p = cluster().GetJson({"pod", "-n", kNamespace, name});
          node = p.ok() ? (*p)["spec"].value("nodeName", "") : "";
          return !node.empty();
        },
        seconds(30), "pod " + name + " to be scheduled"));
    EXPECT_THAT(node, ::testing::AnyOf("gpu-node-3", "gpu-node-4")) << name;
  }
}

TEST_F(TrainingPodTest, APodNamingAnotherNamespacesDatasetIsRefused) {
  // The Dataset exists in team-a; a pod in another namespace naming it finds
  // no Dataset of that name in its own namespace.
  cluster().MustKubectl({"create", "namespace", "team-b"});
  KubectlResult r =
      cluster().Kubectl({"create", "-n", "team-b", "-f", "-"}, BarePod("x", kTrained).dump());
  ASSERT_FALSE(r.ok()) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("Dataset team-b/" + std::string(kTrained) + " does not exist"));
  EXPECT_THAT(suite_->OperatorLogs(100000), HasSubstr("webhook: refused pod team-b/x: "));
}

}  // namespace
}  // namespace granary::testing

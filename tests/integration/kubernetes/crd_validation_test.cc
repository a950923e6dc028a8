// The granary.io/v1alpha1 resources as a real kube-apiserver sees them: the
// CRDs (charts/granary/crds/), the identity admission policy
// (charts/granary/policies/dataset-identity.yaml) and the examples
// (examples/kubernetes/). What the API server accepts (the examples with
// `kubectl apply --validate=strict`, defaults filled in, unknown fields pruned,
// printer columns, status through the subresource, `kubectl wait`), and what
// it refuses: every bad Dataset and CachePool below is one change to the
// example, and the refusal must name the field.
//
// No operator runs here: this is the API server's side of the contract only.
// One cluster serves the whole binary (SetUpTestSuite). ctest runs each case in
// its own process (gtest_discover_tests), so there each case starts one; the
// cases are few and table-driven for that reason.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/kube_cluster.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

const std::string kSource = GRANARY_SOURCE_DIR;
const std::string kCrdDir = kSource + "/charts/granary/crds";
const std::string kPolicy = kSource + "/charts/granary/policies/dataset-identity.yaml";
const std::string kExamples = kSource + "/examples/kubernetes";

// A namespace with no grant annotations (made in SetUpTestSuite).
constexpr char kNoGrants[] = "no-grants";

class CrdValidationTest : public SharedKubeTest<CrdValidationTest> {
 public:
  static Status StartShared() {
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<KubeCluster> cluster, KubeCluster::Start());
    cluster_ = cluster.release();
    return Install();
  }
  static void StopShared() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static void PrintLogsIfFailed() {
    if (cluster_ != nullptr) cluster_->PrintLogsIfTestFailed();
  }

 protected:
  // The CRDs and the policy, as `helm install` and an admin would: the CRDs
  // established, the team namespace of the examples with its grants, a
  // namespace without grants, and the policy in force.
  static Status Install() {
    auto run = [](const std::vector<std::string>& args, const std::string& in = "") -> Status {
      KubectlResult r = cluster_->Kubectl(args, in);
      if (r.ok()) return Status::Ok();
      std::string cmd = "kubectl";
      for (const std::string& a : args) cmd += " " + a;
      return Status::Unavailable(cmd + ": " + r.Describe());
    };
    GRANARY_RETURN_IF_ERROR(run({"apply", "--validate=strict", "-f", kCrdDir}));
    GRANARY_RETURN_IF_ERROR(run({"wait", "--for=condition=Established", "--timeout=60s",
                                 "crd/cachepools.granary.io", "crd/datasets.granary.io"}));
    GRANARY_RETURN_IF_ERROR(run({"apply", "--validate=strict", "-f", kPolicy}));
    GRANARY_RETURN_IF_ERROR(
        run({"apply", "--validate=strict", "-f", kExamples + "/namespace.yaml"}));
    GRANARY_RETURN_IF_ERROR(run({"create", "namespace", kNoGrants}));
    // A new policy takes effect when the API server's policy informer has it:
    // wait until it refuses what it must (dry run: nothing is created).
    json probe = Example("dataset.yaml");
    probe["metadata"]["name"] = "policy-probe";
    probe["spec"]["runAs"]["uid"] = 4242;
    std::string last;
    Status active = cluster_->WaitFor(
        [&] {
          KubectlResult r =
              cluster_->Kubectl({"create", "--dry-run=server", "-f", "-"}, probe.dump());
          last = r.Describe();
          return !r.ok() && r.err.find("granary-dataset-identity") != std::string::npos;
        },
        seconds(60), "the identity policy to refuse uid 4242");
    if (!active.ok()) return Status::DeadlineExceeded(active.ToString() + "; last: " + last);
    return Status::Ok();
  }

  // An example file as JSON (kubectl converts it), to change one field of.
  static json Example(const std::string& file) {
    KubectlResult r = cluster_->Kubectl(
        {"create", "--dry-run=client", "-o", "json", "-f", kExamples + "/" + file});
    EXPECT_TRUE(r.ok()) << file << ": " << r.Describe();
    json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  }

  // kubectl that must succeed.
  static std::string MustKubectl(const std::vector<std::string>& args,
                                 const std::string& stdin_text = "") {
    return cluster_->MustKubectl(args, stdin_text);
  }

  // `kubectl apply --validate=strict` of `object`.
  static KubectlResult Apply(const json& object, bool dry_run = false) {
    std::vector<std::string> args = {"apply", "--validate=strict", "-f", "-"};
    if (dry_run) args.push_back("--dry-run=server");
    return cluster_->Kubectl(args, object.dump());
  }

  static KubeCluster& cluster() { return *cluster_; }

  static KubeCluster* cluster_;
};

KubeCluster* CrdValidationTest::cluster_ = nullptr;

// One change to an example object, and what the refusal must say (the field
// path first).
struct BadCase {
  std::string what;
  std::function<void(json&)> change;
  std::vector<std::string> says;
};

// Applies each case (for real: a refused object is not created) and checks
// the refusal.
void ExpectRefused(KubeCluster& cluster, const json& example, const std::vector<BadCase>& cases) {
  int n = 0;
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    json object = example;
    object["metadata"]["name"] = "bad-" + std::to_string(++n);
    c.change(object);
    KubectlResult r = cluster.Kubectl({"apply", "--validate=strict", "-f", "-"}, object.dump());
    EXPECT_FALSE(r.ok()) << "accepted: " << object.dump();
    for (const std::string& s : c.says) EXPECT_THAT(r.err, HasSubstr(s)) << r.Describe();
  }
}

TEST_F(CrdValidationTest, ExamplesApplyWithDefaultsColumnsAndStatus) {
  // The examples as a user applies them.
  MustKubectl({"apply", "--validate=strict", "-f", kExamples + "/cachepool.yaml"});
  MustKubectl({"apply", "--validate=strict", "-f", kExamples + "/dataset.yaml"});
  Result<json> ds = cluster().GetJson({"dataset", "imagenet-train", "-n", "team-a"});
  ASSERT_OK(ds);
  EXPECT_EQ((*ds)["spec"]["source"], "/mnt/datasets/imagenet/train");
  EXPECT_EQ((*ds)["spec"]["runAs"], json({{"uid", 1000}, {"gid", 1000}}));

  // Short names, the category, and the printer columns.
  const std::string pools = MustKubectl({"get", "gpool"});
  EXPECT_THAT(pools, ::testing::ContainsRegex("NAME +NODES +READY +CAPACITY +USED +DATASETS +AGE"))
      << pools;
  const std::string datasets = MustKubectl({"get", "gds", "-n", "team-a"});
  EXPECT_THAT(datasets, ::testing::ContainsRegex(
                            "NAME +POOL +FILES +TOTAL +CACHED +CACHED% +RESIDENT +PHASE +AGE"))
      << datasets;
  const std::string both = MustKubectl({"get", "granary", "-A"});
  EXPECT_THAT(both, HasSubstr("cachepool.granary.io/gpu")) << both;
  EXPECT_THAT(both, HasSubstr("dataset.granary.io/imagenet-train")) << both;
  // spec.cachePool is a selectable field.
  EXPECT_THAT(MustKubectl({"get", "gds", "-A", "--field-selector", "spec.cachePool=gpu"}),
              HasSubstr("imagenet-train"));
  EXPECT_THAT(MustKubectl({"get", "gds", "-A", "--field-selector", "spec.cachePool=other"}),
              ::testing::Not(HasSubstr("imagenet-train")));

  // Defaults: a minimal CachePool and Dataset, as the API server stores them.
  json pool = {{"apiVersion", "granary.io/v1alpha1"},
               {"kind", "CachePool"},
               {"metadata", {{"name", "minimal"}}},
               {"spec",
                {{"nodeSelector", {{"granary.io/nvme", "true"}}},
                 {"storage", {{"hostPath", "/nvme/granary"}, {"capacity", "100Gi"}}},
                 {"sourceMounts", {{{"name", "data"}, {"hostPath", "/mnt/data"}}}},
                 {"metadataStore",
                  {{"secretRef", {{"name", "granary-store"}, {"namespace", "granary"}}}}}}}};
  KubectlResult created = cluster().Kubectl({"create", "-o", "json", "-f", "-"}, pool.dump());
  ASSERT_TRUE(created.ok()) << created.Describe();
  const json p = json::parse(created.out)["spec"];
  EXPECT_EQ(p["transport"], "tcp");
  EXPECT_EQ(p["image"], "granary:0.1.0");
  EXPECT_EQ(p["imagePullPolicy"], "IfNotPresent");
  EXPECT_EQ(p["ports"], json({{"data", 7070}, {"metrics", 9464}}));
  EXPECT_EQ(p["sidecar"],
            json({{"allowPosixView", false}, {"chunkHandoff", true}, {"metricsPort", 9465}}));
  EXPECT_FALSE(p.contains("nodeSocketHostPath")) << "the operator's default, per pool";
  EXPECT_EQ(p["metadataStore"]["secretRef"]["key"], "url");
  EXPECT_FALSE(p.contains("libfabric"));

  json dataset = {{"apiVersion", "granary.io/v1alpha1"},
                  {"kind", "Dataset"},
                  {"metadata", {{"name", "minimal"}, {"namespace", "team-a"}}},
                  {"spec",
                   {{"cachePool", "minimal"},
                    {"source", "/mnt/data/x"},
                    {"runAs", {{"uid", 1000}, {"gid", 1000}}}}}};
  created = cluster().Kubectl({"create", "-o", "json", "-f", "-"}, dataset.dump());
  ASSERT_TRUE(created.ok()) << created.Describe();
  const json d = json::parse(created.out)["spec"];
  EXPECT_EQ(d["chunkSize"], "16Mi");
  EXPECT_EQ(d["replication"], 1);
  EXPECT_FALSE(d.contains("include"));
  EXPECT_FALSE(d.contains("nodes"));

  // Unknown fields: refused with --validate=strict (BadDatasets), dropped
  // (pruned) without it.
  json extra = dataset;
  extra["metadata"]["name"] = "pruned";
  extra["spec"]["colour"] = "blue";
  extra["spec"]["runAs"]["user"] = "alice";
  created =
      cluster().Kubectl({"create", "--validate=false", "-o", "json", "-f", "-"}, extra.dump());
  ASSERT_TRUE(created.ok()) << created.Describe();
  const json pruned = json::parse(created.out)["spec"];
  EXPECT_FALSE(pruned.contains("colour")) << pruned.dump();
  EXPECT_FALSE(pruned["runAs"].contains("user")) << pruned.dump();

  // Status goes through the subresource; the columns show it; kubectl wait
  // sees the Ready condition. (Written by hand here: no operator runs.)
  json spec_status = {{"status", {{"phase", "Ready"}}}};
  MustKubectl({"patch", "dataset", "imagenet-train", "-n", "team-a", "--type=merge", "-p",
               spec_status.dump()});
  Result<json> after = cluster().GetJson({"dataset", "imagenet-train", "-n", "team-a"});
  ASSERT_OK(after);
  EXPECT_FALSE(after->contains("status")) << "status written without the subresource";

  json status = {{"status",
                  {{"observedGeneration", 1},
                   {"phase", "Ready"},
                   {"files", 1281167},
                   {"totalBytes", 150323855360},
                   {"stagedBytes", 150323855360},
                   {"stagedPercent", 100},
                   {"residentPercent", 48},
                   {"resident", "48%"},
                   {"total", "140Gi"},
                   {"cached", "140Gi"},
                   {"nodes", 2},
                   {"manifestId", "0123456789abcdef"},
                   {"granaryName", "team-a.imagenet-train"},
                   {"lastSnapshotTime", "2025-01-01T00:00:00Z"},
                   {"conditions",
                    {{{"type", "Snapshotted"},
                      {"status", "True"},
                      {"observedGeneration", 1},
                      {"lastTransitionTime", "2025-01-01T00:00:00Z"},
                      {"reason", "ManifestBuilt"},
                      {"message", "1281167 files, 140Gi"}},
                     {{"type", "Staged"},
                      {"status", "True"},
                      {"observedGeneration", 1},
                      {"lastTransitionTime", "2025-01-01T00:10:00Z"},
                      {"reason", "AllChunksVerified"},
                      {"message", "every chunk on its node"}},
                     {{"type", "Ready"},
                      {"status", "True"},
                      {"observedGeneration", 1},
                      {"lastTransitionTime", "2025-01-01T00:10:00Z"},
                      {"reason", "Cached"},
                      {"message", "served from cache"}}}}}}};
  MustKubectl({"patch", "dataset", "imagenet-train", "-n", "team-a", "--subresource=status",
               "--type=merge", "-p", status.dump()});
  const std::string row = MustKubectl({"get", "gds", "imagenet-train", "-n", "team-a"});
  EXPECT_THAT(
      row, ::testing::ContainsRegex("imagenet-train +gpu +1281167 +140Gi +140Gi +100 +48% +Ready"))
      << row;
  MustKubectl(
      {"wait", "--for=condition=Ready", "--timeout=10s", "dataset/imagenet-train", "-n", "team-a"});

  json pool_status = {{"status",
                       {{"nodesDesired", 2},
                        {"nodesReady", 1},
                        {"capacityBytes", 1717986918400},
                        {"usedBytes", 150323855360},
                        {"capacity", "1600Gi"},
                        {"used", "140Gi"},
                        {"datasets", 1}}}};
  MustKubectl({"patch", "cachepool", "gpu", "--subresource=status", "--type=merge", "-p",
               pool_status.dump()});
  const std::string pool_row = MustKubectl({"get", "gpool", "gpu"});
  EXPECT_THAT(pool_row, ::testing::ContainsRegex("gpu +2 +1 +1600Gi +140Gi +1")) << pool_row;

  // A status the schema does not allow is refused too.
  json bad_status = {
      {"status", {{"phase", "Done"}, {"stagedPercent", 101}, {"residentPercent", -1}}}};
  KubectlResult r =
      cluster().Kubectl({"patch", "dataset", "imagenet-train", "-n", "team-a",
                         "--subresource=status", "--type=merge", "-p", bad_status.dump()});
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.err, HasSubstr("status.phase")) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("status.stagedPercent")) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("status.residentPercent")) << r.Describe();
}

TEST_F(CrdValidationTest, CacheSettingsAndQuotasAreCheckedNamingTheField) {
  // Dataset spec.cache: each bad value refused with its field; unknown fields
  // too (--validate=strict).
  const json dataset = Example("dataset.yaml");
  ExpectRefused(
      cluster(), dataset,
      {{"priority above 1000",
        [](json& o) { o["spec"]["cache"]["priority"] = 1001; },
        {"spec.cache.priority", "less than or equal to 1000"}},
       {"priority below -1000",
        [](json& o) { o["spec"]["cache"]["priority"] = -1001; },
        {"spec.cache.priority", "greater than or equal to -1000"}},
       {"a huge priority",
        [](json& o) { o["spec"]["cache"]["priority"] = 9007199254740993LL; },
        {"spec.cache.priority"}},
       {"a priority that is not a number",
        [](json& o) { o["spec"]["cache"]["priority"] = "high"; },
        {"spec.cache.priority", "integer"}},
       {"pinned that is not a boolean",
        [](json& o) { o["spec"]["cache"]["pinned"] = "yes"; },
        {"spec.cache.pinned", "boolean"}},
       {"a negative minResidentPercent",
        [](json& o) { o["spec"]["cache"]["minResidentPercent"] = -1; },
        {"spec.cache.minResidentPercent", "greater than or equal to 0"}},
       {"minResidentPercent above 100",
        [](json& o) { o["spec"]["cache"]["minResidentPercent"] = 101; },
        {"spec.cache.minResidentPercent", "less than or equal to 100"}},
       {"a ttl in days",
        [](json& o) { o["spec"]["cache"]["ttl"] = "2d"; },
        {"spec.cache.ttl", "should match"}},
       {"a ttl without a unit",
        [](json& o) { o["spec"]["cache"]["ttl"] = "3600"; },
        {"spec.cache.ttl", "should match"}},
       {"a negative ttl",
        [](json& o) { o["spec"]["cache"]["ttl"] = "-1h"; },
        {"spec.cache.ttl", "should match"}},
       {"a ttl as a number",
        [](json& o) { o["spec"]["cache"]["ttl"] = 3600; },
        {"spec.cache.ttl", "string"}},
       {"a ttl over ten years",
        [](json& o) { o["spec"]["cache"]["ttl"] = "87601h"; },
        {"spec.cache.ttl", "at most 87600h"}},
       {"an empty ttl", [](json& o) { o["spec"]["cache"]["ttl"] = ""; }, {"spec.cache.ttl"}},
       {"an unknown field in spec.cache",
        [](json& o) { o["spec"]["cache"]["policy"] = "lru"; },
        {"spec.cache.policy", "unknown field"}}});
  const std::vector<std::pair<std::string, std::function<void(json&)>>> good = {
      {"every setting at its edge",
       [](json& o) {
         o["spec"]["cache"] = {
             {"priority", -1000}, {"pinned", true}, {"ttl", "87600h"}, {"minResidentPercent", 100}};
       }},
      {"a pinned dataset that may shrink to half (its quota may still cap it)",
       [](json& o) {
         o["spec"]["cache"] = {{"pinned", true}, {"minResidentPercent", 50}};
       }},
      {"ttl 1h30m", [](json& o) { o["spec"]["cache"]["ttl"] = "1h30m"; }},
      {"ttl 0s (never)", [](json& o) { o["spec"]["cache"]["ttl"] = "0s"; }},
      {"an empty cache object", [](json& o) { o["spec"]["cache"] = json::object(); }},
  };
  for (const auto& [what, change] : good) {
    SCOPED_TRACE(what);
    json object = dataset;
    change(object);
    KubectlResult r = Apply(object, /*dry_run=*/true);
    EXPECT_TRUE(r.ok()) << r.Describe();
  }

  // CachePool spec.quotas.
  const json pool = Example("cachepool.yaml");
  auto quotas = [](json q) { return [q](json& o) { o["spec"]["quotas"] = q; }; };
  ExpectRefused(cluster(), pool,
                {{"a quota of 0 bytes",
                  quotas({{{"namespace", "team-a"}, {"bytes", 0}}}),
                  {"spec.quotas[0].bytes", "greater than 0"}},
                 {"a quota of \"0Gi\"",
                  quotas({{{"namespace", "team-a"}, {"bytes", "0Gi"}}}),
                  {"spec.quotas[0].bytes", "greater than 0"}},
                 {"a negative quota",
                  quotas({{{"namespace", "team-a"}, {"bytes", -5}}}),
                  {"spec.quotas[0].bytes"}},
                 {"a quota that is no quantity",
                  quotas({{{"namespace", "team-a"}, {"bytes", "lots"}}}),
                  {"spec.quotas[0].bytes", "not lots"}},
                 {"a fractional byte count",
                  quotas({{{"namespace", "team-a"}, {"bytes", "0.5"}}}),
                  {"spec.quotas[0].bytes"}},
                 {"two quotas for one namespace",
                  quotas({{{"namespace", "team-a"}, {"bytes", "1Gi"}},
                          {{"namespace", "team-a"}, {"bytes", "2Gi"}}}),
                  {"spec.quotas[1]", "Duplicate value"}},
                 {"a namespace that is no DNS label",
                  quotas({{{"namespace", "Team_A"}, {"bytes", "1Gi"}}}),
                  {"spec.quotas[0].namespace", "should match"}},
                 {"a quota without bytes",
                  quotas({{{"namespace", "team-a"}}}),
                  {"spec.quotas[0].bytes: Required value"}},
                 {"an unknown field in a quota",
                  quotas({{{"namespace", "team-a"}, {"bytes", "1Gi"}, {"files", 10}}}),
                  {"spec.quotas[0].files", "unknown field"}}});
  json with_quotas = pool;
  with_quotas["spec"]["quotas"] = {{{"namespace", "team-a"}, {"bytes", "10Gi"}},
                                   {{"namespace", "team-b"}, {"bytes", 1073741824}}};
  KubectlResult r = Apply(with_quotas, /*dry_run=*/true);
  EXPECT_TRUE(r.ok()) << r.Describe();
}

TEST_F(CrdValidationTest, BadDatasetsAreRefusedWithTheirFieldPath) {
  const json example = Example("dataset.yaml");
  ASSERT_EQ(example["metadata"]["namespace"], "team-a");
  std::vector<BadCase> cases = {
      {"missing source",
       [](json& o) { o["spec"].erase("source"); },
       {"spec.source: Required value"}},
      {"relative source",
       [](json& o) { o["spec"]["source"] = "mnt/datasets/x"; },
       {"spec.source", "absolute path"}},
      {"'..' in source",
       [](json& o) { o["spec"]["source"] = "/mnt/datasets/../../etc"; },
       {"spec.source", "'..'"}},
      {"'..' at the end of source",
       [](json& o) { o["spec"]["source"] = "/mnt/datasets/.."; },
       {"spec.source", "'..'"}},
      {"'//' in source",
       [](json& o) { o["spec"]["source"] = "/mnt//datasets"; },
       {"spec.source", "'//'"}},
      {"source of 4096 bytes",
       [](json& o) { o["spec"]["source"] = "/" + std::string(4095, 'a'); },
       {"spec.source", "4095"}},
      {"no cachePool",
       [](json& o) { o["spec"].erase("cachePool"); },
       {"spec.cachePool: Required value"}},
      {"glob with an unclosed [",
       [](json& o) {
         o["spec"]["include"] = {"*.JPEG", "*.[jJ"};
       },
       {"spec.include[1]", "bad glob pattern", "*.[jJ"}},
      {"glob whose [ is closed only in the next component",
       [](json& o) { o["spec"]["exclude"] = {"a[b/c]d"}; },
       {"spec.exclude[0]", "bad glob"}},
      {"glob ending in a lone backslash",
       [](json& o) { o["spec"]["exclude"] = {"x\\"}; },
       {"spec.exclude[0]", "bad glob"}},
      {"empty glob", [](json& o) { o["spec"]["exclude"] = {""}; }, {"spec.exclude[0]"}},
      {"glob of only '/'",
       [](json& o) { o["spec"]["include"] = {"//"}; },
       {"spec.include[0]", "empty or only '/'"}},
      {"replication 0",
       [](json& o) { o["spec"]["replication"] = 0; },
       {"spec.replication", "greater than or equal to 1"}},
      {"replication 100",
       [](json& o) { o["spec"]["replication"] = 100; },
       {"spec.replication", "less than or equal to 16"}},
      {"replication above the listed nodes",
       [](json& o) {
         o["spec"]["replication"] = 3;
         o["spec"]["nodes"] = {"gpu-node-1", "gpu-node-2"};
       },
       {"spec.replication", "number of nodes"}},
      {"a node listed twice",
       [](json& o) {
         o["spec"]["nodes"] = {"gpu-node-1", "gpu-node-1"};
       },
       {"spec.nodes[1]", "Duplicate value"}},
      {"chunk size 1Ki",
       [](json& o) { o["spec"]["chunkSize"] = "1Ki"; },
       {"spec.chunkSize", "64Ki to 1Gi"}},
      {"chunk size 2Gi",
       [](json& o) { o["spec"]["chunkSize"] = "2Gi"; },
       {"spec.chunkSize", "64Ki to 1Gi"}},
      {"chunk size abc",
       [](json& o) { o["spec"]["chunkSize"] = "abc"; },
       {"spec.chunkSize", "64Ki to 1Gi", "not abc"}},
      {"chunk size 1024 as an integer",
       [](json& o) { o["spec"]["chunkSize"] = 1024; },
       {"spec.chunkSize", "64Ki to 1Gi"}},
      {"chunk size not a whole number of bytes",
       [](json& o) { o["spec"]["chunkSize"] = "100000.5"; },
       {"spec.chunkSize"}},
      {"chunk size with an exponent (granary-operator reads units only)",
       [](json& o) { o["spec"]["chunkSize"] = "1e6"; },
       {"spec.chunkSize", "one of the units"}},
      {"chunk size with a sign",
       [](json& o) { o["spec"]["chunkSize"] = "+64Ki"; },
       {"spec.chunkSize"}},
      {"an unknown field",
       [](json& o) { o["spec"]["colour"] = "blue"; },
       {"unknown field \"spec.colour\""}},
      {"an unknown field in runAs",
       [](json& o) { o["spec"]["runAs"]["user"] = "alice"; },
       {"unknown field \"spec.runAs.user\""}},
      {"no runAs", [](json& o) { o["spec"].erase("runAs"); }, {"spec.runAs: Required value"}},
      {"uid 0",
       [](json& o) { o["spec"]["runAs"]["uid"] = 0; },
       {"spec.runAs.uid", "greater than or equal to 1"}},
      {"uid 2^32-1", [](json& o) { o["spec"]["runAs"]["uid"] = 4294967295LL; }, {"spec.runAs.uid"}},
      {"prefetch window of 0 bytes",
       [](json& o) { o["spec"]["prefetch"]["windowBytes"] = 0; },
       {"spec.prefetch.windowBytes"}},
      {"a uid the namespace was not granted",
       [](json& o) { o["spec"]["runAs"]["uid"] = 1234; },
       {"granary-dataset-identity", "spec.runAs.uid", "uid 1234", "namespace team-a",
        "granary.io/allowed-uids"}},
      {"a gid the namespace was not granted",
       [](json& o) { o["spec"]["runAs"]["gid"] = 0; },
       {"granary-dataset-identity", "spec.runAs.gid", "gid 0", "namespace team-a",
        "granary.io/allowed-gids"}},
      {"a namespace without grants",
       [](json& o) { o["metadata"]["namespace"] = kNoGrants; },
       {"granary-dataset-identity", "namespace no-grants may not create Datasets",
        "granary.io/allowed-uids"}},
      {"a name of 64 characters",
       [](json& o) { o["metadata"]["name"] = std::string(64, 'd'); },
       {"metadata.name", "at most 63 characters"}},
      {"a name with a dot",
       [](json& o) { o["metadata"]["name"] = "imagenet.train"; },
       {"metadata.name", "DNS-1123 label"}},
  };
  ExpectRefused(cluster(), example, cases);

  // What the rules must not refuse (server-side dry run).
  std::vector<std::pair<std::string, std::function<void(json&)>>> good = {
      {"globs with a literal ], an escaped [ and a negated class",
       [](json& o) {
         o["spec"]["include"] = {"[]]x", "a\\[b", "**/x[!a-z]y", "/train/*.JPEG"};
       }},
      {"chunk size 64Ki as an integer", [](json& o) { o["spec"]["chunkSize"] = 65536; }},
      {"chunk size 1Gi", [](json& o) { o["spec"]["chunkSize"] = "1Gi"; }},
      {"chunk size in decimal units", [](json& o) { o["spec"]["chunkSize"] = "8M"; }},
      {"a name of 63 characters", [](json& o) { o["metadata"]["name"] = std::string(63, 'd'); }},
      {"replication 2 on two listed nodes",
       [](json& o) {
         o["spec"]["replication"] = 2;
         o["spec"]["nodes"] = {"gpu-node-1", "gpu-node-2"};
       }},
      {"a source ending in '/' with a '...' component",
       [](json& o) { o["spec"]["source"] = "/mnt/datasets/.../x/"; }},
  };
  for (const auto& [what, change] : good) {
    SCOPED_TRACE(what);
    json object = example;
    change(object);
    KubectlResult r = Apply(object, /*dry_run=*/true);
    EXPECT_TRUE(r.ok()) << r.Describe();
  }
}

TEST_F(CrdValidationTest, BadCachePoolsAreRefusedWithTheirFieldPath) {
  const json example = Example("cachepool.yaml");
  const json pvc = {{"claimName", "datasets"}, {"namespace", "granary"}};
  std::vector<BadCase> cases = {
      {"no nodeSelector",
       [](json& o) { o["spec"].erase("nodeSelector"); },
       {"spec.nodeSelector: Required value"}},
      {"an empty nodeSelector",
       [](json& o) { o["spec"]["nodeSelector"] = json::object(); },
       {"spec.nodeSelector", "at least 1"}},
      {"a nodeSelector key that is no label key",
       [](json& o) {
         o["spec"]["nodeSelector"] = {{"has space", "x"}};
       },
       {"spec.nodeSelector", "label key"}},
      {"relative storage hostPath",
       [](json& o) { o["spec"]["storage"]["hostPath"] = "nvme"; },
       {"spec.storage.hostPath"}},
      {"relative nodeSocketHostPath",
       [](json& o) { o["spec"]["nodeSocketHostPath"] = "run/granary"; },
       {"spec.nodeSocketHostPath"}},
      {"a nodeSocketHostPath with ..",
       [](json& o) { o["spec"]["nodeSocketHostPath"] = "/var/run/../../etc"; },
       {"spec.nodeSocketHostPath", "'..'"}},
      {"sidecar metricsPort 0",
       [](json& o) { o["spec"]["sidecar"]["metricsPort"] = 0; },
       {"spec.sidecar.metricsPort"}},
      {"sidecar resources that are no quantities",
       [](json& o) {
         o["spec"]["sidecar"]["resources"] = {{"limits", {{"memory", "lots"}}}};
       },
       {"spec.sidecar.resources.limits.memory"}},
      {"capacity 0",
       [](json& o) { o["spec"]["storage"]["capacity"] = 0; },
       {"spec.storage.capacity", "greater than 0"}},
      {"capacity \"0\"",
       [](json& o) { o["spec"]["storage"]["capacity"] = "0"; },
       {"spec.storage.capacity", "greater than 0"}},
      {"capacity -1Gi",
       [](json& o) { o["spec"]["storage"]["capacity"] = "-1Gi"; },
       {"spec.storage.capacity"}},
      {"capacity in exbibytes",
       [](json& o) { o["spec"]["storage"]["capacity"] = "1Ei"; },
       {"spec.storage.capacity", "one of the units"}},
      {"no storage capacity",
       [](json& o) { o["spec"]["storage"].erase("capacity"); },
       {"spec.storage.capacity: Required value"}},
      {"a source mount with both hostPath and a claim",
       [&](json& o) {
         o["spec"]["sourceMounts"][0]["persistentVolumeClaim"] = pvc;
         o["spec"]["sourceMounts"][0]["mountPath"] = "/mnt/datasets";
       },
       {"spec.sourceMounts[0]", "exactly one of hostPath and persistentVolumeClaim"}},
      {"a source mount with neither",
       [](json& o) {
         o["spec"]["sourceMounts"] = {{{"name", "datasets"}}};
       },
       {"spec.sourceMounts[0]", "exactly one of hostPath and persistentVolumeClaim"}},
      {"a claim without mountPath",
       [&](json& o) {
         o["spec"]["sourceMounts"] = {{{"name", "datasets"}, {"persistentVolumeClaim", pvc}}};
       },
       {"spec.sourceMounts[0].mountPath", "required"}},
      {"a relative source hostPath",
       [](json& o) { o["spec"]["sourceMounts"][0]["hostPath"] = "mnt/datasets"; },
       {"spec.sourceMounts[0].hostPath"}},
      {"two mounts at one path",
       [](json& o) {
         o["spec"]["sourceMounts"] = {
             {{"name", "a"}, {"hostPath", "/mnt/a"}},
             {{"name", "b"}, {"hostPath", "/mnt/b"}, {"mountPath", "/mnt/a"}}};
       },
       {"spec.sourceMounts", "same mountPath"}},
      {"two mounts of one name",
       [](json& o) {
         o["spec"]["sourceMounts"] = {{{"name", "a"}, {"hostPath", "/mnt/a"}},
                                      {{"name", "a"}, {"hostPath", "/mnt/b"}}};
       },
       {"spec.sourceMounts[1]", "Duplicate value"}},
      {"no source mounts",
       [](json& o) { o["spec"]["sourceMounts"] = json::array(); },
       {"spec.sourceMounts"}},
      {"no store secret",
       [](json& o) { o["spec"]["metadataStore"] = json::object(); },
       {"spec.metadataStore.secretRef: Required value"}},
      {"the same data and metrics port",
       [](json& o) {
         o["spec"]["ports"] = {{"data", 9000}, {"metrics", 9000}};
       },
       {"spec.ports", "must differ"}},
      {"a data port equal to the default metrics port",
       [](json& o) {
         o["spec"]["ports"] = {{"data", 9464}};
       },
       {"spec.ports", "must differ"}},
      {"port 0", [](json& o) { o["spec"]["ports"]["data"] = 0; }, {"spec.ports.data"}},
      {"a libfabric block with transport tcp",
       [](json& o) {
         o["spec"]["libfabric"] = {{"provider", "verbs"}};
       },
       {"spec.libfabric", "only with transport: libfabric"}},
      {"a libfabric port of 0",
       [](json& o) {
         o["spec"]["transport"] = "libfabric";
         o["spec"]["libfabric"] = {{"provider", "tcp"}, {"port", 0}};
       },
       {"spec.libfabric.port"}},
      {"an unknown transport",
       [](json& o) { o["spec"]["transport"] = "rdma"; },
       {"spec.transport", "Unsupported value"}},
      {"tolerationSeconds without NoExecute",
       [](json& o) { o["spec"]["tolerations"][0]["tolerationSeconds"] = 30; },
       {"spec.tolerations[0].tolerationSeconds", "NoExecute"}},
      {"a bad pull policy",
       [](json& o) { o["spec"]["imagePullPolicy"] = "Sometimes"; },
       {"spec.imagePullPolicy"}},
      {"a resource that is no quantity",
       [](json& o) { o["spec"]["resources"]["limits"]["memory"] = "lots"; },
       {"spec.resources.limits.memory"}},
      {"an unknown field",
       [](json& o) { o["spec"]["storage"]["size"] = "1Ti"; },
       {"unknown field \"spec.storage.size\""}},
      {"windowSamples 0",
       [](json& o) { o["spec"]["sidecar"]["windowSamples"] = 0; },
       {"spec.sidecar.windowSamples"}},
      {"a name with a dot",
       [](json& o) { o["metadata"]["name"] = "gpu.a"; },
       {"metadata.name", "DNS-1123 label"}},
  };
  ExpectRefused(cluster(), example, cases);

  std::vector<std::pair<std::string, std::function<void(json&)>>> good = {
      {"libfabric with its block",
       [](json& o) {
         o["spec"]["transport"] = "libfabric";
         o["spec"]["libfabric"] = {{"provider", "verbs"}};
       }},
      {"libfabric with a port of its own",
       [](json& o) {
         o["spec"]["transport"] = "libfabric";
         o["spec"]["libfabric"] = {{"provider", "tcp"}, {"port", 7171}};
       }},
      {"a claim with a mountPath, beside a host path",
       [&](json& o) {
         o["spec"]["sourceMounts"].push_back(
             {{"name", "pvc"}, {"persistentVolumeClaim", pvc}, {"mountPath", "/mnt/pvc"}});
       }},
      {"capacity as an integer", [](json& o) { o["spec"]["storage"]["capacity"] = 1 << 30; }},
      {"a toleration of every taint",
       [](json& o) {
         o["spec"]["tolerations"] = {{{"operator", "Exists"}}};
       }},
  };
  for (const auto& [what, change] : good) {
    SCOPED_TRACE(what);
    json object = example;
    change(object);
    KubectlResult r = Apply(object, /*dry_run=*/true);
    EXPECT_TRUE(r.ok()) << r.Describe();
  }
}

TEST_F(CrdValidationTest, IdentityPolicyChecksGrantsOnCreateAndOnRunAsChanges) {
  // Ranges and spaces in the grant; entries that parse as neither grant nothing.
  MustKubectl({"create", "namespace", "team-b"});
  MustKubectl({"annotate", "namespace", "team-b", "granary.io/allowed-uids=1000, 2000-2099 ,junk",
               "granary.io/allowed-gids=100"});
  json ds = Example("dataset.yaml");
  ds["metadata"]["namespace"] = "team-b";
  ds["metadata"]["name"] = "ranged";
  ds["spec"]["runAs"] = {{"uid", 2050}, {"gid", 100}};
  KubectlResult r = Apply(ds);
  ASSERT_TRUE(r.ok()) << r.Describe();
  for (int uid : {1999, 2100}) {
    json other = ds;
    other["metadata"]["name"] = "uid-" + std::to_string(uid);
    other["spec"]["runAs"]["uid"] = uid;
    r = Apply(other);
    EXPECT_FALSE(r.ok()) << uid;
    EXPECT_THAT(r.err,
                HasSubstr("uid " + std::to_string(uid) + " is not granted to namespace team-b"))
        << r.Describe();
  }
  // Only the uids, not the gids: still no Datasets.
  MustKubectl({"create", "namespace", "team-c"});
  MustKubectl({"annotate", "namespace", "team-c", "granary.io/allowed-uids=1000"});
  json c = Example("dataset.yaml");
  c["metadata"]["namespace"] = "team-c";
  r = Apply(c);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.err, HasSubstr("namespace team-c may not create Datasets: it has no "
                               "granary.io/allowed-gids annotation"))
      << r.Describe();

  // Changing runAs is checked again.
  r = cluster().Kubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
                         R"({"spec":{"runAs":{"uid":3000}}})"});
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.err, HasSubstr("spec.runAs.uid: uid 3000 is not granted to namespace team-b"))
      << r.Describe();
  MustKubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
               R"({"spec":{"runAs":{"uid":2001}}})"});

  // The pool cannot be changed.
  r = cluster().Kubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
                         R"({"spec":{"cachePool":"other"}})"});
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.err, HasSubstr("spec.cachePool")) << r.Describe();
  EXPECT_THAT(r.err, HasSubstr("cannot be changed")) << r.Describe();

  // A grant withdrawn: updates that leave runAs alone still pass (the
  // operator's finalizer, labels, placement), so the Dataset can be deleted.
  MustKubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
               R"({"metadata":{"finalizers":["granary.io/release"]}})"});
  MustKubectl({"annotate", "namespace", "team-b", "granary.io/allowed-uids-"});
  MustKubectl({"label", "dataset", "ranged", "-n", "team-b", "tier=gold"});
  MustKubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
               R"({"spec":{"replication":1}})"});
  r = cluster().Kubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
                         R"({"spec":{"runAs":{"uid":2002}}})"});
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.err, HasSubstr("namespace team-b may not create Datasets")) << r.Describe();
  MustKubectl({"delete", "dataset", "ranged", "-n", "team-b", "--wait=false"});
  MustKubectl({"patch", "dataset", "ranged", "-n", "team-b", "--type=merge", "-p",
               R"({"metadata":{"finalizers":null}})"});
  EXPECT_OK(cluster().WaitFor(
      [&] {
        return cluster().GetJson({"dataset", "ranged", "-n", "team-b"}).status().code() ==
               StatusCode::kNotFound;
      },
      seconds(30), "dataset team-b/ranged to be gone"));
}

}  // namespace
}  // namespace granary::testing

// granary::operator's pieces that need no API server: quantities, names,
// grants, mounts, conditions, why cache-node pods do not run, kubeconfig parsing, the work queue,
// the webhook's registration (options, renewal decision, objects). The reconcilers against a real
// control plane: tests/integration/kubernetes/operator_test.cc.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <thread>

#include "granary/core/metadata_store.h"
#include "granary/kube/base64.h"
#include "granary/kube/kube_config.h"
#include "granary/operator/cache_node_pods.h"
#include "granary/operator/resources.h"
#include "granary/operator/webhook_cert.h"
#include "granary/operator/webhook_registration.h"
#include "granary/operator/work_queue.h"
#include "testing/test_util.h"

namespace granary::kube {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Base64Test, RoundTripsAndRefusesNonBase64) {
  for (const std::string& s :
       {std::string(), std::string("a"), std::string("ab"), std::string("abc"),
        std::string("redis://:p@h:6379/0"), std::string("\0\xff\x01", 3)}) {
    Result<std::string> back = Base64Decode(Base64Encode(s), "x");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, s);
  }
  EXPECT_EQ(Base64Encode("CERT"), "Q0VSVA==");
  EXPECT_EQ(*Base64Decode("Q0VS\nVA==\n", "x"), "CERT");
  EXPECT_THAT(Base64Decode("Q0VSVA=", "the key 'url'").status().message(),
              HasSubstr("the key 'url'"));
  EXPECT_FALSE(Base64Decode("Q0V*VA==", "x").ok());
}

TEST(QuantityTest, ParsesKubernetesQuantities) {
  EXPECT_EQ(*ParseQuantityBytes(Json(1024), "x"), 1024u);
  EXPECT_EQ(*ParseQuantityBytes(Json("16Mi"), "x"), 16u << 20);
  EXPECT_EQ(*ParseQuantityBytes(Json("1.5Gi"), "x"), 3u << 29);
  EXPECT_EQ(*ParseQuantityBytes(Json("2G"), "x"), 2000000000u);
  EXPECT_EQ(*ParseQuantityBytes(Json("500k"), "x"), 500000u);
  EXPECT_EQ(*ParseQuantityBytes(Json("800Ti"), "x"), 800ull << 40);
  for (const char* bad : {"", "abc", "16MB", "-1", "1e3", "Mi", "16 Mi", "1.2.3Gi"}) {
    SCOPED_TRACE(bad);
    Result<uint64_t> r = ParseQuantityBytes(Json(bad), "spec.storage.capacity");
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("spec.storage.capacity"));
  }
  EXPECT_FALSE(ParseQuantityBytes(Json(-5), "x").ok());
  EXPECT_FALSE(ParseQuantityBytes(Json::array(), "x").ok());
  EXPECT_FALSE(ParseQuantityBytes(Json("99999999999Pi"), "x").ok());
  EXPECT_EQ(QuantityString(512), "512");
  EXPECT_EQ(QuantityString(16u << 20), "16Mi");
  EXPECT_EQ(QuantityString(3u << 29), "1.5Gi");
}

TEST(GranaryDatasetNameTest, UniqueAcrossNamespacesAndAValidName) {
  const std::string a = GranaryDatasetName("a-b", "c");
  const std::string b = GranaryDatasetName("a", "b-c");
  EXPECT_NE(a, b);  // "<ns>-<name>" alone would collide
  EXPECT_EQ(a, GranaryDatasetName("a-b", "c"));
  EXPECT_THAT(a, ::testing::StartsWith("a-b-c-"));
  const std::string long_name = GranaryDatasetName(std::string(63, 'n'), std::string(63, 'd'));
  EXPECT_LE(long_name.size(), 63u);
  for (const std::string& n :
       {a, b, long_name, GranaryDatasetName("x", std::string(51, 'y') + "-z")}) {
    EXPECT_TRUE(ValidateDatasetName(n).ok()) << n;
  }
}

Json Pool() {
  return Json::parse(R"({
    "apiVersion": "granary.io/v1alpha1", "kind": "CachePool",
    "metadata": {"name": "gpu", "uid": "u1", "generation": 3},
    "spec": {"nodeSelector": {"granary.io/nvme": "true"},
             "storage": {"hostPath": "/mnt/nvme/", "capacity": "800Gi"},
             "sourceMounts": [{"name": "datasets", "hostPath": "/mnt/datasets"},
                              {"name": "pvc", "persistentVolumeClaim": {"claimName": "c"}, "mountPath": "/pvc"}],
             "metadataStore": {"secretRef": {"name": "store"}}}})");
}

TEST(CachePoolTest, ParsesWithDefaults) {
  Result<CachePool> p = ParseCachePool(Pool());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->storage_host_path, "/mnt/nvme");
  EXPECT_EQ(p->capacity_bytes, 800ull << 30);
  ASSERT_EQ(p->source_mounts.size(), 2u);
  EXPECT_EQ(p->source_mounts[0].mount_path, "/mnt/datasets");
  EXPECT_EQ(p->source_mounts[1].mount_path, "/pvc");
  EXPECT_EQ(p->store_secret_key, "url");
  EXPECT_EQ(p->data_port, 7070);
  EXPECT_EQ(p->transport, "tcp");
}

TEST(CachePoolTest, LibfabricTakesAProviderAndAPortOfItsOwn) {
  Json j = Pool();
  j["spec"]["transport"] = "libfabric";
  j["spec"]["libfabric"] = {{"provider", "verbs"}};
  Result<CachePool> p = ParseCachePool(j);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->transport, "libfabric");
  EXPECT_EQ(p->libfabric_provider, "verbs");
  EXPECT_EQ(p->libfabric_port, 7071);
  j["spec"]["libfabric"]["port"] = 7070;  // the data port
  EXPECT_THAT(ParseCachePool(j).status().message(),
              HasSubstr("spec.libfabric.port 7070 is also spec.ports.data"));
  j["spec"]["libfabric"]["port"] = 9464;
  EXPECT_THAT(ParseCachePool(j).status().message(), HasSubstr("spec.ports.metrics"));
  j["spec"]["libfabric"]["port"] = 70000;
  EXPECT_THAT(ParseCachePool(j).status().message(), HasSubstr("spec.libfabric.port must be in"));
  // Without transport libfabric the port is not looked at.
  j["spec"]["transport"] = "tcp";
  EXPECT_TRUE(ParseCachePool(j).ok());
}

TEST(CachePoolTest, RefusesWhatTheSchemaCannotCatch) {
  Json j = Pool();
  j["spec"]["storage"]["capacity"] = "0";
  EXPECT_THAT(ParseCachePool(j).status().message(), HasSubstr("capacity"));
  j = Pool();
  j["spec"]["storage"]["hostPath"] = "nvme";
  EXPECT_THAT(ParseCachePool(j).status().message(), HasSubstr("spec.storage.hostPath"));
  j = Pool();
  j["spec"]["sourceMounts"][0]["persistentVolumeClaim"] = {{"claimName", "x"}};
  EXPECT_THAT(ParseCachePool(j).status().message(), HasSubstr("exactly one"));
  j = Pool();
  j["spec"]["metadataStore"] = Json::object();
  EXPECT_THAT(ParseCachePool(j).status().message(), HasSubstr("secretRef.name"));
}

TEST(CachePoolTest, QuotasPerNamespace) {
  Json j = Pool();
  Result<CachePool> p = ParseCachePool(j);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_TRUE(p->quotas.empty());
  j["spec"]["quotas"] = Json::parse(R"([{"namespace": "team-a", "bytes": "10Gi"},
                                        {"namespace": "team-b", "bytes": 4096}])");
  p = ParseCachePool(j);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->quotas.size(), 2u);
  EXPECT_EQ(p->quotas[0].namespace_, "team-a");
  EXPECT_EQ(p->quotas[0].bytes, 10ull << 30);
  EXPECT_EQ(p->quotas[1].bytes, 4096u);
  const std::pair<const char*, const char*> bad[] = {
      {R"([{"namespace": "team-a", "bytes": 0}])", "bytes must be more than 0"},
      {R"([{"namespace": "team-a", "bytes": -5}])", "negative"},
      {R"([{"namespace": "team-a", "bytes": "lots"}])", "not a byte quantity"},
      {R"([{"namespace": "team-a"}])", "spec.quotas['team-a'].bytes"},
      {R"([{"namespace": "Team_A", "bytes": 1}])", ".namespace"},
      {R"([{"namespace": "team-a", "bytes": 1}, {"namespace": "team-a", "bytes": 2}])",
       "two quotas"},
      {R"({"team-a": 1})", "spec.quotas"},
  };
  for (const auto& [quotas, says] : bad) {
    SCOPED_TRACE(quotas);
    j["spec"]["quotas"] = Json::parse(quotas);
    p = ParseCachePool(j);
    ASSERT_FALSE(p.ok());
    EXPECT_THAT(p.status().message(), HasSubstr(says));
  }
}

TEST(MountOfTest, SourceMustLieUnderAMount) {
  CachePool p = *ParseCachePool(Pool());
  EXPECT_EQ(MountOf(p, "/mnt/datasets/imagenet/train")->name, "datasets");
  EXPECT_EQ(MountOf(p, "/mnt/datasets")->name, "datasets");
  EXPECT_EQ(MountOf(p, "/pvc/x")->name, "pvc");
  for (const char* bad : {"/mnt/datasets2/x", "/mnt", "/etc", "/pvcx"}) {
    SCOPED_TRACE(bad);
    Result<SourceMount> m = MountOf(p, bad);
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(m.status().message(), HasSubstr("/mnt/datasets, /pvc"));
  }
}

Json Dataset(const std::string& spec_patch = "{}") {
  Json j = Json::parse(R"({
    "apiVersion": "granary.io/v1alpha1", "kind": "Dataset",
    "metadata": {"name": "imagenet", "namespace": "team-a", "uid": "d1", "generation": 1},
    "spec": {"cachePool": "gpu", "source": "/mnt/datasets/imagenet", "runAs": {"uid": 1000, "gid": 1000}}})");
  j["spec"].merge_patch(Json::parse(spec_patch));
  return j;
}

TEST(DatasetTest, ParsesWithDefaults) {
  Result<kube::Dataset> d = ParseDataset(Dataset());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->chunk_size, 16u << 20);
  EXPECT_EQ(d->replication, 1u);
  EXPECT_FALSE(d->nodes.has_value());
  EXPECT_FALSE(d->deleting);
  d = ParseDataset(
      Dataset(R"({"chunkSize": "64Ki", "replication": 2, "nodes": ["n1"], "include": ["*.jpg"]})"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->chunk_size, 64u << 10);
  EXPECT_EQ(d->replication, 2u);
  EXPECT_EQ(*d->nodes, std::vector<std::string>{"n1"});
}

TEST(DatasetTest, BadSpecsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"source": "relative/x"})", "spec.source"},
      {R"({"source": "/mnt/../etc"})", "spec.source"},
      {R"({"include": ["[abc"]})", "spec.include"},
      {R"({"exclude": [""]})", "spec.exclude"},
      {R"({"chunkSize": "1Ki"})", "spec.chunkSize"},
      {R"({"chunkSize": "2Gi"})", "spec.chunkSize"},
      {R"({"chunkSize": "abc"})", "spec.chunkSize"},
      {R"({"replication": 0})", "spec.replication"},
      {R"({"replication": 100})", "spec.replication"},
      {R"({"runAs": {"uid": 0, "gid": 0}})", "spec.runAs"},
      {R"({"runAs": null})", "spec.runAs"},
      {R"({"nodes": ["bad node"]})", "spec.nodes"},
  };
  for (const auto& [patch, field] : cases) {
    SCOPED_TRACE(patch);
    Result<kube::Dataset> d = ParseDataset(Dataset(patch));
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(d.status().message(), HasSubstr(field));
  }
}

TEST(DatasetTest, CacheSpecMapsToTheStoreRecordsFields) {
  Result<kube::Dataset> d = ParseDataset(Dataset());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->cache.is_default());
  d = ParseDataset(Dataset(
      R"({"cache": {"priority": -1000, "pinned": true, "ttl": "1h30m", "minResidentPercent": 100}})"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->cache.priority, -1000);
  EXPECT_TRUE(d->cache.pinned);
  EXPECT_EQ(d->cache.ttl_seconds, 5400u);
  EXPECT_EQ(d->cache.min_resident_percent, 100u);
  EXPECT_FALSE(d->cache.max_resident_bytes.has_value());  // only ever from a quota
}

TEST(DatasetTest, BadCacheSpecsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"cache": {"priority": 1001}})", "spec.cache.priority"},
      {R"({"cache": {"priority": -1001}})", "spec.cache.priority"},
      {R"({"cache": {"priority": 99999999999999999999}})", "spec.cache.priority"},
      {R"({"cache": {"priority": "high"}})", "spec.cache.priority"},
      {R"({"cache": {"priority": 1.5}})", "spec.cache.priority"},
      {R"({"cache": {"minResidentPercent": -1}})", "spec.cache.minResidentPercent"},
      {R"({"cache": {"minResidentPercent": 101}})", "spec.cache.minResidentPercent"},
      {R"({"cache": {"pinned": "yes"}})", "spec.cache.pinned"},
      {R"({"cache": {"ttl": "soon"}})", "spec.cache.ttl"},
      {R"({"cache": {"ttl": 3600}})", "spec.cache.ttl"},
      {R"({"cache": {"ttl": "87601h"}})", "spec.cache.ttl"},
      {R"({"cache": {"policy": "lru"}})", "spec.cache.policy"},
      {R"({"cache": "big"})", "spec.cache"},
  };
  for (const auto& [patch, field] : cases) {
    SCOPED_TRACE(patch);
    Result<kube::Dataset> d = ParseDataset(Dataset(patch));
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(d.status().message(), HasSubstr(field));
  }
}

TEST(DurationTest, WholeHoursMinutesAndSecondsInThatOrder) {
  const std::pair<const char*, uint64_t> good[] = {
      {"0s", 0},       {"90s", 90},
      {"30m", 1800},   {"12h", 43200},
      {"1h30m", 5400}, {"1h0m1s", 3601},
      {"2m30s", 150},  {"87600h", kMaxCacheTtlSeconds},
      {"0h", 0},       {"315360000s", kMaxCacheTtlSeconds}};
  for (const auto& [text, seconds] : good) {
    SCOPED_TRACE(text);
    Result<uint64_t> d = ParseDurationSeconds(Json(text), "spec.cache.ttl");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(*d, seconds);
  }
  const char* bad[] = {"",     "12",  "h",    "1d",  "-1h",   "1.5h",     "30m1h",
                       "1h1h", "1ms", " 1h",  "1h ", "1H",    "87600h1s", "999999999999999h",
                       "1e3s", "+1s", "1h30", "P1D", "1h-30m"};
  for (const char* text : bad) {
    SCOPED_TRACE(text);
    Result<uint64_t> d = ParseDurationSeconds(Json(text), "spec.cache.ttl");
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(d.status().message(), HasSubstr("spec.cache.ttl"));
  }
  EXPECT_FALSE(ParseDurationSeconds(Json(60), "spec.cache.ttl").ok());
  EXPECT_FALSE(ParseDurationSeconds(Json(), "spec.cache.ttl").ok());
}

TEST(QuotaTest, PriorityThenAgeGetTheQuotaFirst) {
  constexpr uint64_t kGi = 1ull << 30;
  // 10Gi among a 6Gi, an 8Gi and a 1Gi dataset: the oldest first at equal priority.
  std::map<std::string, QuotaShare> s =
      SplitQuota(10 * kGi, {{"a/late", 0, "2026-01-02T00:00:00Z", 8 * kGi},
                            {"a/early", 0, "2026-01-01T00:00:00Z", 6 * kGi},
                            {"a/small", 0, "2026-01-03T00:00:00Z", 1 * kGi}});
  EXPECT_EQ(s["a/early"].limit, 6 * kGi);
  EXPECT_FALSE(s["a/early"].exceeded);
  EXPECT_EQ(s["a/late"].limit, 4 * kGi);
  EXPECT_TRUE(s["a/late"].exceeded);
  EXPECT_EQ(s["a/small"].limit, 0u);  // nothing left
  EXPECT_TRUE(s["a/small"].exceeded);
  // A higher priority goes first whatever its age.
  s = SplitQuota(10 * kGi, {{"a/late", 5, "2026-01-02T00:00:00Z", 8 * kGi},
                            {"a/early", 0, "2026-01-01T00:00:00Z", 6 * kGi}});
  EXPECT_EQ(s["a/late"].limit, 8 * kGi);
  EXPECT_FALSE(s["a/late"].exceeded);
  EXPECT_EQ(s["a/early"].limit, 2 * kGi);
  EXPECT_TRUE(s["a/early"].exceeded);
  // Equal priority and age: by key, so every reconcile splits the same way.
  s = SplitQuota(kGi, {{"a/y", 0, "t", kGi}, {"a/x", 0, "t", kGi}});
  EXPECT_EQ(s["a/x"].limit, kGi);
  EXPECT_EQ(s["a/y"].limit, 0u);
}

TEST(QuotaTest, UnknownSizesTakeNothingAndFitIsNotExceeded) {
  std::map<std::string, QuotaShare> s =
      SplitQuota(100, {{"a/new", 10, "2026-01-03T00:00:00Z", std::nullopt},
                       {"a/old", 0, "2026-01-01T00:00:00Z", 60},
                       {"a/mid", 0, "2026-01-02T00:00:00Z", 40}});
  EXPECT_EQ(s["a/new"].limit, 100u);  // before its snapshot: what is left at its place
  EXPECT_FALSE(s["a/new"].exceeded);
  EXPECT_EQ(s["a/old"].limit, 60u);
  EXPECT_EQ(s["a/mid"].limit, 40u);  // exactly the quota: not exceeded
  EXPECT_FALSE(s["a/mid"].exceeded);
  EXPECT_TRUE(SplitQuota(100, {}).empty());
  s = SplitQuota(100, {{"a/zero", 0, "t", 0}});
  EXPECT_EQ(s["a/zero"].limit, 0u);
  EXPECT_FALSE(s["a/zero"].exceeded);
  // Sizes near the top of uint64 do not wrap.
  s = SplitQuota(UINT64_MAX, {{"a/x", 0, "t", UINT64_MAX}, {"a/y", 0, "u", 5}});
  EXPECT_EQ(s["a/x"].limit, UINT64_MAX);
  EXPECT_EQ(s["a/y"].limit, 0u);
  EXPECT_TRUE(s["a/y"].exceeded);
}

TEST(GrantTest, NamespaceAnnotationsGrantUidsAndGids) {
  Json ns = {
      {"metadata",
       {{"name", "team-a"},
        {"annotations",
         {{"granary.io/allowed-uids", "1000, 2000-2999"}, {"granary.io/allowed-gids", "1000"}}}}}};
  EXPECT_TRUE(CheckGrant(ns, 1000, 1000).ok());
  EXPECT_TRUE(CheckGrant(ns, 2500, 1000).ok());
  Status s = CheckGrant(ns, 3000, 1000);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("uid 3000"));
  EXPECT_THAT(s.message(), HasSubstr("granary.io/allowed-uids"));
  EXPECT_THAT(CheckGrant(ns, 1000, 0).message(), HasSubstr("gid 0"));
  EXPECT_THAT(CheckGrant(ns, 0, 1000).message(), HasSubstr("never"));
  Json bare = {{"metadata", {{"name", "team-b"}}}};
  EXPECT_THAT(CheckGrant(bare, 1000, 1000).message(), HasSubstr("(not set)"));
  Json junk = {
      {"metadata", {{"name", "x"}, {"annotations", {{"granary.io/allowed-uids", "a,b-,-,0x10"}}}}}};
  EXPECT_FALSE(CheckGrant(junk, 16, 0).ok());
}

TEST(ConditionTest, KeepsTransitionTimeWhileStatusHolds) {
  Json conditions = Json::array();
  SetCondition(conditions, "Ready", false, "Staging", "1 of 2", 1, "t1");
  SetCondition(conditions, "Ready", false, "Staging", "2 of 2", 2, "t2");
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_EQ(conditions[0]["lastTransitionTime"], "t1");
  EXPECT_EQ(conditions[0]["observedGeneration"], 2);
  SetCondition(conditions, "Ready", true, "Ready", "done", 2, "t3");
  EXPECT_EQ(conditions[0]["lastTransitionTime"], "t3");
  EXPECT_EQ(conditions[0]["status"], "True");
}

// A cache-node pod of pool "gpu" as the API server returns it, with
// `status` as the kubelet wrote it.
Json CacheNodePod(const std::string& name, const Json& status) {
  return {{"metadata",
           {{"name", name},
            {"namespace", "granary"},
            {"uid", "uid-" + name},
            {"labels", {{"granary.io/pool", "gpu"}}}}},
          {"spec", {{"nodeName", "node-" + name}}},
          {"status", status}};
}

Json Waiting(const std::string& reason, const std::string& message, const Json& last = nullptr) {
  Json cs = {{"name", "cachenode"},
             {"image", "registry.example/granary:9"},
             {"restartCount", 3},
             {"state", {{"waiting", {{"reason", reason}, {"message", message}}}}}};
  if (!last.is_null()) cs["lastState"] = {{"terminated", last}};
  return {{"phase", "Running"}, {"containerStatuses", Json::array({cs})}};
}

CachePool PoolForPods() {
  CachePool pool;
  pool.name = "gpu";
  pool.image = "registry.example/granary:9";
  pool.image_pull_policy = "IfNotPresent";
  pool.storage_host_path = "/nvme/granary";
  pool.node_socket_host_path = "/var/run/granary/gpu";
  pool.source_mounts.push_back({"shared", "/mnt/shared", "", "", "/mnt/shared"});
  pool.source_mounts.push_back({"claims", "", "data-claim", "", "/mnt/claims"});
  return pool;
}

// The wall clock of the cases: the pods' times are written against it.
const std::chrono::system_clock::time_point kNow =
    std::chrono::sys_days{std::chrono::year{2026} / 12 / 2} + std::chrono::hours{15};

// DiagnoseCacheNodePods where the case has a trouble: a failure without one.
CacheNodeTrouble Diagnose(const CachePool& pool, const std::vector<Json>& pods,
                          const std::map<std::string, std::vector<std::string>>& mounts = {}) {
  std::optional<CacheNodeTrouble> t = DiagnoseCacheNodePods(pool, pods, mounts, kNow);
  if (!t) {
    ADD_FAILURE() << "no trouble found in " << Json(pods).dump();
    return {};
  }
  return *t;
}

TEST(CacheNodePodsTest, RunningAndStartingPodsHaveNoTrouble) {
  const CachePool pool = PoolForPods();
  const Json running = {
      {"phase", "Running"},
      {"containerStatuses",
       Json::array({{{"name", "cachenode"},
                     {"ready", true},
                     {"restartCount", 1},
                     {"state", {{"running", {{"startedAt", "2026-12-02T00:00:00Z"}}}}},
                     {"lastState", {{"terminated", {{"exitCode", 1}, {"message", "old"}}}}}}})}};
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {CacheNodePod("a", running)}, {}, kNow), std::nullopt);
  const Json creating = {
      {"phase", "Pending"},
      {"containerStatuses",
       Json::array({{{"name", "cachenode"},
                     {"state", {{"waiting", {{"reason", "ContainerCreating"}}}}}}})}};
  EXPECT_TRUE(CreatingContainers(CacheNodePod("b", creating)));
  EXPECT_FALSE(CreatingContainers(CacheNodePod("a", running)));
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {CacheNodePod("b", creating)}, {}, kNow), std::nullopt);
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {}, {}, kNow), std::nullopt);
}

TEST(CacheNodePodsTest, AnImageThatCannotBePulledNamesTheImageTheNodeAndWhatToDo) {
  const CachePool pool = PoolForPods();
  const std::string error =
      "failed to pull and unpack image \"registry.example/granary:9\": not found";
  std::optional<CacheNodeTrouble> pull =
      DiagnoseCacheNodePods(pool, {CacheNodePod("a", Waiting("ErrImagePull", error))}, {}, kNow);
  ASSERT_TRUE(pull.has_value());
  EXPECT_EQ(pull->reason, "ImagePullFailed");
  EXPECT_EQ(pull->pod, "granary/a");
  EXPECT_EQ(pull->node, "node-a");
  EXPECT_THAT(pull->message, HasSubstr("granary/a on node node-a cannot pull image "
                                       "'registry.example/granary:9': " +
                                       error));
  EXPECT_THAT(pull->message, HasSubstr("spec.image"));
  // Backing off between pulls says the same, so the condition holds still.
  std::optional<CacheNodeTrouble> backoff = DiagnoseCacheNodePods(
      pool,
      {CacheNodePod("a", Waiting("ImagePullBackOff",
                                 "Back-off pulling image \"registry.example/granary:9\": "
                                 "ErrImagePull: " +
                                     error))},
      {}, kNow);
  ASSERT_TRUE(backoff.has_value());
  EXPECT_EQ(backoff->message, pull->message);
  CachePool never = pool;
  never.image_pull_policy = "Never";
  EXPECT_THAT(Diagnose(never, {CacheNodePod("a", Waiting("ErrImageNeverPull", "x"))}, {}).message,
              HasSubstr("imagePullPolicy is Never"));
  EXPECT_EQ(Diagnose(pool, {CacheNodePod("a", Waiting("InvalidImageName", "x"))}, {}).reason,
            "ImagePullFailed");
}

TEST(CacheNodePodsTest, AContainerThatExitsShowsItsLastWords) {
  const CachePool pool = PoolForPods();
  const std::string words =
      "2026-12-02T14:47:22.304 info [store] created metadata store\n"
      "granary-cachenode: PermissionDenied: opening the chunk store (`data_dir`): open chunk "
      "store /nvme/granary/gpu: create the directory: Permission denied\n";
  std::optional<CacheNodeTrouble> crash = DiagnoseCacheNodePods(
      pool,
      {CacheNodePod("a", Waiting("CrashLoopBackOff", "back-off 40s restarting failed container",
                                 {{"exitCode", 1}, {"reason", "Error"}, {"message", words}}))},
      {}, kNow);
  ASSERT_TRUE(crash.has_value());
  EXPECT_EQ(crash->reason, "CacheNodeCrashing");
  EXPECT_THAT(crash->message,
              HasSubstr("granary/a on node node-a exits with exit code 1 (Error): "
                        "granary-cachenode: PermissionDenied: opening the chunk store"));
  EXPECT_THAT(crash->message, Not(HasSubstr("created metadata store")));  // the last line only
  EXPECT_THAT(crash->message, Not(HasSubstr("back-off 40s")));  // changes with every restart
  // Started again after that exit and not ready yet: still crashing.
  Json restarted = Waiting("x", "", {{"exitCode", 1}, {"reason", "Error"}, {"message", words}});
  restarted["containerStatuses"][0]["state"] = {
      {"running", {{"startedAt", "2026-12-02T14:59:50Z"}}}};  // 10 s before kNow
  restarted["containerStatuses"][0]["ready"] = false;
  EXPECT_EQ(Diagnose(pool, {CacheNodePod("a", restarted)}, {}).message, crash->message);
  restarted["containerStatuses"][0]["ready"] = true;  // and now it serves
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {CacheNodePod("a", restarted)}, {}, kNow), std::nullopt);
  // Running for an hour and not ready: something else than that old exit.
  restarted["containerStatuses"][0]["ready"] = false;
  restarted["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-12-02T14:00:00Z";
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {CacheNodePod("a", restarted)}, {}, kNow), std::nullopt);
  // Terminated now (before the back-off), without a message: where its log is.
  Json ended = {
      {"phase", "Running"},
      {"containerStatuses",
       Json::array({{{"name", "cachenode"}, {"state", {{"terminated", {{"exitCode", 2}}}}}}})}};
  EXPECT_THAT(Diagnose(pool, {CacheNodePod("a", ended)}, {}).message,
              HasSubstr("exit code 2 and left no message; `kubectl logs -n granary a --previous`"));
  // A clean exit (a stop) is no trouble.
  ended["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 0;
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {CacheNodePod("a", ended)}, {}, kNow), std::nullopt);
  EXPECT_THAT(Diagnose(pool,
                       {CacheNodePod("a", Waiting("CrashLoopBackOff", "",
                                                  {{"exitCode", 137}, {"reason", "OOMKilled"}}))},
                       {})
                  .message,
              HasSubstr("(OOMKilled): it ran out of its memory limit; raise the CachePool's "
                        "spec.resources.limits.memory"));
  std::optional<CacheNodeTrouble> config = DiagnoseCacheNodePods(
      pool,
      {CacheNodePod("a", Waiting("CreateContainerConfigError",
                                 "secret \"granary-cachenode-gpu-store\" not found"))},
      {}, kNow);
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->reason, "CacheNodeNotCreated");
  EXPECT_THAT(config->message, HasSubstr("(CreateContainerConfigError: secret "
                                         "\"granary-cachenode-gpu-store\" not found)"));
}

TEST(CacheNodePodsTest, AVolumeTheKubeletCannotMountIsNamedAsTheSpecNamesIt) {
  const CachePool pool = PoolForPods();
  const Json creating = {{"phase", "Pending"}};
  const std::string source =
      "MountVolume.SetUp failed for volume \"source-shared\" : hostPath type check failed: "
      "/mnt/shared is not a directory";
  std::optional<CacheNodeTrouble> t = DiagnoseCacheNodePods(
      pool, {CacheNodePod("a", creating)}, {{"granary/a", {"older message", source}}}, kNow);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->reason, "SourceMountFailed");
  EXPECT_EQ(t->source_mount, "shared");
  EXPECT_THAT(t->message, HasSubstr("granary/a on node node-a cannot mount "
                                    "spec.sourceMounts['shared'] (hostPath /mnt/shared at "
                                    "/mnt/shared): " +
                                    source));
  EXPECT_THAT(t->message, Not(HasSubstr("older message")));  // the newest Event
  t = DiagnoseCacheNodePods(pool, {CacheNodePod("a", creating)},
                            {{"granary/a",
                              {"MountVolume.SetUp failed for volume \"source-claims\" : claim "
                               "gone"}}},
                            kNow);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->source_mount, "claims");
  EXPECT_THAT(t->message, HasSubstr("persistentVolumeClaim 'data-claim' at /mnt/claims"));
  t = DiagnoseCacheNodePods(
      pool, {CacheNodePod("a", creating)},
      {{"granary/a", {"MountVolume.SetUp failed for volume \"data\" : read-only file system"}}},
      kNow);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->reason, "VolumeMountFailed");
  EXPECT_EQ(t->source_mount, "");
  EXPECT_THAT(t->message, HasSubstr("cannot mount spec.storage.hostPath /nvme/granary: "));
  // A pod that runs had its mounts: old Events of it say nothing now.
  EXPECT_EQ(DiagnoseCacheNodePods(pool, {CacheNodePod("a", {{"phase", "Running"}})},
                                  {{"granary/a", {source}}}, kNow),
            std::nullopt);
}

TEST(CacheNodePodsTest, SeveralFailingPodsTheFirstByNameIsDescribedAndTheOthersCounted) {
  const CachePool pool = PoolForPods();
  Json deleting = CacheNodePod("a", Waiting("ErrImagePull", "gone"));
  deleting["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z";
  std::optional<CacheNodeTrouble> t = DiagnoseCacheNodePods(
      pool,
      {CacheNodePod("d", Waiting("ErrImagePull", "x")), CacheNodePod("c", {{"phase", "Running"}}),
       deleting,
       CacheNodePod("b", Waiting("CrashLoopBackOff", "", {{"exitCode", 1}, {"message", "m"}}))},
      {}, kNow);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->pod, "granary/b");
  EXPECT_EQ(t->reason, "CacheNodeCrashing");
  EXPECT_EQ(t->pods_failing, 2);
  EXPECT_THAT(t->message, HasSubstr("(and 1 more of the pool's 3 cache-node pods do not run)"));
}

TEST(CacheNodePodsTest, LastLineOfATerminationMessage) {
  EXPECT_EQ(LastLine(""), "");
  EXPECT_EQ(LastLine("one"), "one");
  EXPECT_EQ(LastLine("one\ntwo\n\n"), "two");
  EXPECT_EQ(LastLine(std::string(700, 'x')).size(), 600u);
}

TEST(KubeConfigTest, ReadsContextsCertificatesAndTokens) {
  testing::TempDir dir;
  const std::string ca = dir.path() + "/ca.crt";
  std::ofstream(ca) << "CA PEM";
  const std::string path = dir.path() + "/config";
  std::ofstream(path) << R"(apiVersion: v1
kind: Config
current-context: admin
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: ca.crt}
- name: v6
  cluster: {server: "https://[::1]:443/", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}
- name: sa
  user: {token: abc}
contexts:
- name: admin
  context: {cluster: c, user: admin, namespace: granary-system}
- name: sa
  context: {cluster: v6, user: sa}
- name: broken
  context: {cluster: nowhere, user: sa}
)";
  Result<KubeConfig> c = LoadKubeConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->host, "127.0.0.1");
  EXPECT_EQ(c->port, "6443");
  EXPECT_EQ(c->ca_pem, "CA PEM");
  EXPECT_EQ(c->client_cert_pem, "CERT");
  EXPECT_EQ(c->client_key_pem, "KEY");
  EXPECT_EQ(c->namespace_, "granary-system");
  c = LoadKubeConfig(path, "sa");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, "443");
  EXPECT_TRUE(c->insecure_skip_verify);
  EXPECT_EQ(c->token, "abc");
  EXPECT_THAT(LoadKubeConfig(path, "broken").status().message(), HasSubstr("'nowhere'"));
  EXPECT_THAT(LoadKubeConfig(path, "nope").status().message(), HasSubstr("no context"));
  EXPECT_EQ(LoadKubeConfig(dir.path() + "/missing").status().code(), StatusCode::kNotFound);
  std::ofstream(dir.path() + "/bad") << "clusters: [unclosed";
  EXPECT_FALSE(LoadKubeConfig(dir.path() + "/bad").ok());
  std::ofstream(dir.path() + "/list") << "- a\n- b\n";
  EXPECT_THAT(LoadKubeConfig(dir.path() + "/list").status().message(), HasSubstr("mapping"));
}

TEST(KubeConfigTest, ServerUrls) {
  KubeConfig c;
  EXPECT_TRUE(ParseServerUrl("https://api.example:6443", &c).ok());
  EXPECT_EQ(c.host, "api.example");
  EXPECT_TRUE(ParseServerUrl("https://api.example", &c).ok());
  EXPECT_EQ(c.port, "443");
  for (const char* bad : {"http://x:80", "https://", "https://x:0", "https://x:99999",
                          "https://x:1/api", "https://[::1", "https://x:abc"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(ParseServerUrl(bad, &c).ok());
  }
}

TEST(KubeConfigTest, InClusterNeedsTheServiceAccountFiles) {
  testing::TempDir dir;
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  EXPECT_FALSE(InClusterConfig(dir.path()).ok());  // no ca.crt, no token
  std::ofstream(dir.path() + "/ca.crt") << "CA";
  std::ofstream(dir.path() + "/token") << "tok\n";
  std::ofstream(dir.path() + "/namespace") << "granary-system\n";
  Result<KubeConfig> c = InClusterConfig(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->namespace_, "granary-system");
  EXPECT_EQ(c->token_file, dir.path() + "/token");
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(InClusterConfig(dir.path()).status().code(), StatusCode::kNotFound);
}

TEST(WorkQueueTest, DeduplicatesAndNeverHandsAKeyToTwoWorkers) {
  WorkQueue q;
  q.Add("a");
  q.Add("a");
  q.Add("b");
  EXPECT_EQ(q.Length(), 2u);
  std::optional<std::string> k = q.Get(std::chrono::milliseconds(0));
  ASSERT_EQ(k, "a");
  q.Add("a");  // while processing: dirty, not queued
  EXPECT_EQ(q.Get(std::chrono::milliseconds(0)), "b");
  EXPECT_EQ(q.Get(std::chrono::milliseconds(0)), std::nullopt);
  q.Done("a");  // queued again now
  EXPECT_EQ(q.Get(std::chrono::milliseconds(0)), "a");
  q.Done("a");
  q.Done("b");
  EXPECT_EQ(q.Get(std::chrono::milliseconds(0)), std::nullopt);
}

TEST(WorkQueueTest, RetriesBackOffPerKeyAndForgetResets) {
  WorkQueue q(WorkQueue::Options{.retry_base = std::chrono::milliseconds(20),
                                 .retry_max = std::chrono::milliseconds(80)});
  q.AddRateLimited("k");  // 20 ms
  EXPECT_EQ(q.Get(std::chrono::milliseconds(0)), std::nullopt);
  EXPECT_EQ(q.Get(std::chrono::milliseconds(2000)), "k");
  q.Done("k");
  q.AddRateLimited("k");
  q.AddRateLimited("k");
  EXPECT_EQ(q.Retries("k"), 3u);
  q.Forget("k");
  EXPECT_EQ(q.Retries("k"), 0u);
  EXPECT_EQ(q.Get(std::chrono::milliseconds(2000)), "k");
}

TEST(WorkQueueTest, BoundedAndShutDownWakesWaiters) {
  WorkQueue q(WorkQueue::Options{.max_keys = 2});
  q.Add("1");
  q.Add("2");
  q.Add("3");
  EXPECT_EQ(q.Length(), 2u);
  EXPECT_EQ(q.dropped(), 1u);
  WorkQueue empty;
  std::thread t([&] { EXPECT_EQ(empty.Get(std::chrono::seconds(30)), std::nullopt); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  empty.ShutDown();
  t.join();
  empty.Add("x");
  EXPECT_EQ(empty.Length(), 0u);
}

// --- the webhook's registration

WebhookRegistrationOptions ServiceRegistration() {
  WebhookRegistrationOptions o;
  o.namespace_ = "granary";
  o.service_name = "granary-webhook";
  o.cert_ips = {"127.0.0.1"};
  o.cert_validity = std::chrono::hours(100);
  o.renew_before = std::chrono::hours(10);
  return o;
}

Json TlsSecretOf(const WebhookRegistrationOptions& o) {
  Result<WebhookCert> cert = MakeWebhookCert(DesiredWebhookCert(o));
  EXPECT_TRUE(cert.ok()) << cert.status().ToString();
  return WebhookTlsSecret(o, *cert);
}

TEST(WebhookRegistrationTest, BadOptionsNameTheirFlag) {
  EXPECT_TRUE(ValidateWebhookRegistration(ServiceRegistration()).ok());
  struct Case {
    std::function<void(WebhookRegistrationOptions&)> change;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](auto& o) { o.service_name.clear(); }, "--webhook-url"},
      {[](auto& o) { o.url = "https://127.0.0.1:1/mutate"; }, "exactly one"},
      {[](auto& o) { o.service_name = "Not_A_Label"; }, "--webhook-service"},
      {[](auto& o) { o.service_port = 0; }, "--webhook-service-port"},
      {[](auto& o) { o.failure_policy = "Maybe"; }, "--webhook-failure-policy"},
      {[](auto& o) { o.timeout_seconds = 0; }, "--webhook-timeout"},
      {[](auto& o) { o.timeout_seconds = 31; }, "--webhook-timeout"},
      {[](auto& o) { o.cert_ips = {"localhost"}; }, "--webhook-cert-ip"},
      {[](auto& o) { o.renew_before = o.cert_validity; }, "--webhook-cert-renew-before"},
      {[](auto& o) {
         o.manage_certificate = false;
         o.ca_bundle_pem = "not PEM";
       },
       "--webhook-ca-file"},
  };
  for (const Case& c : cases) {
    WebhookRegistrationOptions o = ServiceRegistration();
    c.change(o);
    Status s = ValidateWebhookRegistration(o);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
}

TEST(WebhookRegistrationTest, UrlsMustBeHttpsWithAHost) {
  EXPECT_EQ(*WebhookUrlHost("https://127.0.0.1:8443/mutate"), "127.0.0.1");
  EXPECT_EQ(*WebhookUrlHost("https://webhook.example.com/mutate"), "webhook.example.com");
  EXPECT_EQ(*WebhookUrlHost("https://[::1]:443/mutate"), "::1");
  EXPECT_EQ(*WebhookUrlHost("https://h"), "h");
  for (const char* bad :
       {"http://127.0.0.1/mutate", "127.0.0.1:8443/mutate", "https://", "https:///mutate",
        "https://h:/x", "https://h:99999/x", "https://h:8x/x", "https://u@h/x", "https://h/x?y=1",
        "https://h/x#f", "https://[::1/x", "https://[nope]/x", "https://h_1/x", "ftp://h/x"}) {
    Result<std::string> host = WebhookUrlHost(bad);
    EXPECT_FALSE(host.ok()) << bad;
    EXPECT_THAT(host.status().message(), HasSubstr("--webhook-url")) << bad;
  }
  EXPECT_THAT(WebhookUrlHost("http://h/x").status().message(), HasSubstr("http://"));
}

TEST(WebhookRegistrationTest, TheCertificateNamesTheServiceOrTheUrlHostAndTheIps) {
  WebhookCertRequest service = DesiredWebhookCert(ServiceRegistration());
  EXPECT_EQ(service.dns_names.size(), 4u);
  EXPECT_THAT(service.dns_names, ::testing::Contains("granary-webhook.granary.svc"));
  EXPECT_EQ(service.ip_addresses, std::vector<std::string>{"127.0.0.1"});
  EXPECT_EQ(service.validity, std::chrono::hours(100));
  WebhookRegistrationOptions o = ServiceRegistration();
  o.service_name.clear();
  o.url = "https://127.0.0.1:9443/mutate";
  WebhookCertRequest url = DesiredWebhookCert(o);
  EXPECT_TRUE(url.dns_names.empty());
  EXPECT_EQ(url.ip_addresses, std::vector<std::string>{"127.0.0.1"});  // once
  o.url = "https://hook.example.com/mutate";
  EXPECT_EQ(DesiredWebhookCert(o).dns_names, std::vector<std::string>{"hook.example.com"});
}

TEST(WebhookRegistrationTest, InspectReadsNamesDatesAndTheSigningCa) {
  WebhookCertRequest request;
  request.dns_names = {"a.example", "b.example"};
  request.ip_addresses = {"127.0.0.1", "::1"};
  request.validity = std::chrono::hours(2);
  const auto before = std::chrono::system_clock::now();
  Result<WebhookCert> cert = MakeWebhookCert(request);
  ASSERT_TRUE(cert.ok());
  Result<WebhookCertInfo> info = InspectWebhookCert(*cert);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->dns_names, request.dns_names);
  EXPECT_EQ(info->ip_addresses, (std::vector<std::string>{"127.0.0.1", "::1"}));
  EXPECT_EQ(info->issuer_pem, cert->ca_pem);
  const auto expected = before + std::chrono::hours(2);
  EXPECT_LE(std::chrono::abs(info->not_after - expected), std::chrono::seconds(5));
  EXPECT_LE(std::chrono::abs(info->not_before - (before - std::chrono::hours(1))),
            std::chrono::seconds(5));
  // A bundle with another CA first still finds the signer.
  Result<WebhookCert> other = MakeWebhookCert(request);
  ASSERT_TRUE(other.ok());
  WebhookCert bundled = *cert;
  bundled.ca_pem = other->ca_pem + cert->ca_pem;
  ASSERT_TRUE(InspectWebhookCert(bundled).ok());
  EXPECT_EQ(InspectWebhookCert(bundled)->issuer_pem, cert->ca_pem);
  // Another CA, another key, garbage: refused with what is wrong.
  WebhookCert wrong_ca = *cert;
  wrong_ca.ca_pem = other->ca_pem;
  EXPECT_THAT(InspectWebhookCert(wrong_ca).status().message(), HasSubstr("ca.crt"));
  WebhookCert wrong_key = *cert;
  wrong_key.key_pem = other->key_pem;
  EXPECT_THAT(InspectWebhookCert(wrong_key).status().message(), HasSubstr("tls.key"));
  WebhookCert garbage = *cert;
  garbage.cert_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  EXPECT_THAT(InspectWebhookCert(garbage).status().message(), HasSubstr("tls.crt"));
}

TEST(WebhookRegistrationTest, RenewalDecision) {
  const WebhookRegistrationOptions o = ServiceRegistration();
  const auto now = std::chrono::system_clock::now();
  using Action = CertRenewal::Action;
  // Missing, of the wrong type, missing a key, not base64: a new one.
  EXPECT_EQ(DecideCertRenewal(nullptr, o, now).action, Action::kCreate);
  Json secret = TlsSecretOf(o);
  Json opaque = secret;
  opaque["type"] = "Opaque";
  EXPECT_EQ(DecideCertRenewal(&opaque, o, now).action, Action::kCreate);
  Json keyless = secret;
  keyless["data"].erase("tls.key");
  CertRenewal keyless_decision = DecideCertRenewal(&keyless, o, now);
  EXPECT_EQ(keyless_decision.action, Action::kCreate);
  EXPECT_THAT(keyless_decision.reason, HasSubstr("tls.key"));
  Json not_base64 = secret;
  not_base64["data"]["tls.crt"] = "***";
  EXPECT_EQ(DecideCertRenewal(&not_base64, o, now).action, Action::kCreate);
  Json mismatched = secret;
  mismatched["data"]["tls.key"] = TlsSecretOf(o)["data"]["tls.key"];
  EXPECT_EQ(DecideCertRenewal(&mismatched, o, now).action, Action::kCreate);

  // Fresh: kept until 10 h before its end (100 h from now).
  CertRenewal keep = DecideCertRenewal(&secret, o, now);
  ASSERT_EQ(keep.action, Action::kKeep) << keep.reason;
  EXPECT_LE(std::chrono::abs(keep.renew_at - (now + std::chrono::hours(90))),
            std::chrono::seconds(5));
  EXPECT_FALSE(keep.current.ca_pem.empty());
  // Within renew_before of its end: renewed, the old CA known.
  CertRenewal expiring = DecideCertRenewal(&secret, o, now + std::chrono::hours(91));
  EXPECT_EQ(expiring.action, Action::kRenew);
  EXPECT_THAT(expiring.reason, HasSubstr("expires"));
  EXPECT_EQ(expiring.info.issuer_pem, keep.current.ca_pem);
  EXPECT_EQ(DecideCertRenewal(&secret, o, now + std::chrono::hours(89)).action, Action::kKeep);
  // Names that no longer match: another Service, another IP, a URL instead.
  WebhookRegistrationOptions renamed = o;
  renamed.service_name = "other-webhook";
  EXPECT_EQ(DecideCertRenewal(&secret, renamed, now).action, Action::kRenew);
  WebhookRegistrationOptions more_ips = o;
  more_ips.cert_ips.push_back("10.0.0.1");
  CertRenewal ips = DecideCertRenewal(&secret, more_ips, now);
  EXPECT_EQ(ips.action, Action::kRenew);
  EXPECT_THAT(ips.reason, HasSubstr("10.0.0.1"));
  WebhookRegistrationOptions by_url = o;
  by_url.service_name.clear();
  by_url.url = "https://127.0.0.1:8443/mutate";
  EXPECT_EQ(DecideCertRenewal(&secret, by_url, now).action, Action::kRenew);
  // The same names written differently (order, IPv6 spelling) are the same.
  WebhookRegistrationOptions v6 = o;
  v6.cert_ips = {"0:0:0:0:0:0:0:1", "127.0.0.1"};
  Json v6_secret = TlsSecretOf(v6);
  v6.cert_ips = {"127.0.0.1", "::1"};
  EXPECT_EQ(DecideCertRenewal(&v6_secret, v6, now).action, Action::kKeep);
}

TEST(WebhookRegistrationTest, SecretAndConfiguration) {
  WebhookRegistrationOptions o = ServiceRegistration();
  Json secret = TlsSecretOf(o);
  EXPECT_EQ(secret["type"], "kubernetes.io/tls");
  EXPECT_EQ(secret["metadata"]["name"], "granary-webhook-tls");
  EXPECT_EQ(secret["metadata"]["namespace"], "granary");
  EXPECT_EQ(secret["metadata"]["labels"]["app.kubernetes.io/managed-by"], "granary-operator");
  Result<WebhookCert> back = WebhookCertFromSecret(secret);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(InspectWebhookCert(*back).ok());

  o.failure_policy = "Ignore";
  o.timeout_seconds = 7;
  Json config = MutatingWebhookConfiguration(o, "CA PEM");
  EXPECT_EQ(config["apiVersion"], "admissionregistration.k8s.io/v1");
  EXPECT_EQ(config["kind"], "MutatingWebhookConfiguration");
  EXPECT_EQ(config["metadata"]["name"], "granary-sidecar-injector");
  ASSERT_EQ(config["webhooks"].size(), 1u);
  const Json& w = config["webhooks"][0];
  EXPECT_EQ(w["name"], "sidecar.granary.io");
  EXPECT_EQ(w["clientConfig"]["caBundle"], Base64Encode("CA PEM"));
  EXPECT_EQ(w["clientConfig"]["service"],
            Json::parse(R"({"name":"granary-webhook","namespace":"granary","path":"/mutate",
                            "port":443})"));
  EXPECT_FALSE(w["clientConfig"].contains("url"));
  EXPECT_EQ(w["rules"], Json::parse(R"([{"apiGroups":[""],"apiVersions":["v1"],
      "operations":["CREATE"],"resources":["pods"],"scope":"Namespaced"}])"));
  EXPECT_EQ(w["objectSelector"], Json::parse(R"({"matchExpressions":[
      {"key":"granary.io/dataset","operator":"Exists"}]})"));
  EXPECT_EQ(w["namespaceSelector"], Json::parse(R"({"matchExpressions":[
      {"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["granary"]}]})"));
  EXPECT_EQ(w["sideEffects"], "None");
  EXPECT_EQ(w["admissionReviewVersions"], Json::array({"v1"}));
  EXPECT_EQ(w["failurePolicy"], "Ignore");
  EXPECT_EQ(w["timeoutSeconds"], 7);
  o.service_name.clear();
  o.url = "https://127.0.0.1:9443/mutate";
  Json by_url = MutatingWebhookConfiguration(o, "CA PEM");
  EXPECT_EQ(by_url["webhooks"][0]["clientConfig"]["url"], o.url);
  EXPECT_FALSE(by_url["webhooks"][0]["clientConfig"].contains("service"));
}

}  // namespace
}  // namespace granary::kube

// The webhook's mutation as pure functions (operator/include/granary/operator/
// webhook_patch.h): each patch is applied with a small RFC 6902 applier below
// and the resulting pod is checked.

#include "granary/operator/webhook_patch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "granary/kube/base64.h"

namespace granary::kube {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// --- A small RFC 6902 applier (add, replace, remove, test) over RFC 6901 paths.

std::string Unescape(const std::string& token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size()) {
      out += token[i + 1] == '1' ? '/' : '~';
      ++i;
    } else {
      out += token[i];
    }
  }
  return out;
}

std::vector<std::string> Tokens(const std::string& path) {
  std::vector<std::string> tokens;
  if (path.empty()) return tokens;
  EXPECT_EQ(path[0], '/') << path;
  size_t start = 1;
  while (true) {
    size_t slash = path.find('/', start);
    tokens.push_back(Unescape(path.substr(start, slash - start)));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return tokens;
}

// Applies `patch` to `doc`; false (with a test failure) if an operation
// cannot apply as RFC 6902 says (a missing parent, an index out of range,
// an "add" to a member that exists is allowed and replaces, per the RFC).
bool Apply(Json& doc, const Json& patch) {
  if (!patch.is_array()) {
    ADD_FAILURE() << "patch is not an array";
    return false;
  }
  for (const Json& op : patch) {
    const std::string kind = op.at("op");
    std::vector<std::string> tokens = Tokens(op.at("path"));
    if (tokens.empty()) {
      ADD_FAILURE() << "operation on the root";
      return false;
    }
    const std::string last = tokens.back();
    tokens.pop_back();
    Json* parent = &doc;
    for (const std::string& t : tokens) {
      if (parent->is_object() && parent->contains(t)) {
        parent = &(*parent)[t];
      } else if (parent->is_array() && !t.empty() &&
                 t.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(t) < parent->size()) {
        parent = &(*parent)[std::stoul(t)];
      } else {
        ADD_FAILURE() << "path " << op.at("path") << ": missing parent at " << t;
        return false;
      }
    }
    if (kind == "add") {
      if (parent->is_object()) {
        (*parent)[last] = op.at("value");
      } else if (parent->is_array()) {
        if (last == "-") {
          parent->push_back(op.at("value"));
        } else {
          size_t index = std::stoul(last);
          if (index > parent->size()) {
            ADD_FAILURE() << "index out of range in " << op.at("path");
            return false;
          }
          parent->insert(parent->begin() + static_cast<std::ptrdiff_t>(index), op.at("value"));
        }
      } else {
        ADD_FAILURE() << "add into a scalar at " << op.at("path");
        return false;
      }
    } else {
      ADD_FAILURE() << "the webhook only adds; got " << kind;
      return false;
    }
  }
  return true;
}

// --- Fixtures

CachePool Pool() {
  CachePool pool;
  pool.name = "gpu";
  pool.image = "granary:0.1.0";
  pool.node_selector = {{"granary.io/nvme", "true"}, {"nvidia.com/gpu.present", "true"}};
  pool.tolerations =
      Json::array({{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
  return pool;
}

InjectionInputs Inputs() {
  InjectionInputs in;
  in.dataset_namespace = "team-a";
  in.dataset_name = "imagenet-train";
  in.pool = Pool();
  in.store_secret_name = "granary-gpu-store";
  in.run_as_uid = 1000;
  in.run_as_gid = 2000;
  in.dataset_phase = "Ready";
  in.pool.node_socket_host_path = "/var/run/granary/gpu";
  return in;
}

Json TrainingPod() {
  return Json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "train", "namespace": "team-a",
                 "labels": {"granary.io/dataset": "imagenet-train"}},
    "spec": {
      "containers": [
        {"name": "trainer", "image": "pytorch:2", "command": ["python3", "train.py"],
         "env": [{"name": "EPOCHS", "value": "3"}]},
        {"name": "logger", "image": "busybox"}
      ]
    }
  })");
}

std::string Review(const Json& pod, const std::string& operation = "CREATE",
                   const std::string& ns = "team-a") {
  Json review = {{"apiVersion", "admission.k8s.io/v1"},
                 {"kind", "AdmissionReview"},
                 {"request",
                  {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
                   {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                   {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
                   {"namespace", ns},
                   {"operation", operation},
                   {"object", pod}}}};
  return review.dump();
}

Json Patched(const Json& pod, const InjectionInputs& in = Inputs()) {
  Result<Json> patch = BuildInjectionPatch(pod, in);
  EXPECT_TRUE(patch.ok()) << patch.status().message();
  Json out = pod;
  if (patch.ok()) {
    EXPECT_TRUE(Apply(out, *patch));
  }
  return out;
}

const Json* FindNamed(const Json& list, const std::string& name) {
  for (const Json& item : list) {
    if (item.value("name", "") == name) return &item;
  }
  return nullptr;
}

std::string EnvValue(const Json& container, const std::string& name) {
  if (!container.contains("env")) return "<unset>";
  const Json* var = FindNamed(container["env"], name);
  return var != nullptr ? var->value("value", "<valueFrom>") : "<unset>";
}

// --- Tests

TEST(WebhookPatchTest, InjectsTheNativeSidecarEnvVolumesAffinityAndTolerations) {
  const Json pod = Patched(TrainingPod());
  const Json& spec = pod["spec"];

  ASSERT_TRUE(spec.contains("initContainers"));
  ASSERT_EQ(spec["initContainers"].size(), 1u);
  const Json& sidecar = spec["initContainers"][0];
  EXPECT_EQ(sidecar["name"], "granary-sidecar");
  EXPECT_EQ(sidecar["restartPolicy"], "Always");
  EXPECT_EQ(sidecar["image"], "granary:0.1.0");
  EXPECT_EQ(sidecar["command"], Json::array({"granary-sidecar"}));
  EXPECT_EQ(sidecar["args"], Json::array({"--config=/etc/granary/sidecar/sidecar.yaml",
                                          "--local-node=$(GRANARY_NODE_NAME)"}));
  EXPECT_EQ(sidecar["startupProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(sidecar["startupProbe"]["httpGet"]["port"], 9465);
  EXPECT_EQ(sidecar["readinessProbe"]["httpGet"]["path"], "/readyz");
  // The dataset owner's identity, which the cache node's chunk handoff accepts.
  EXPECT_EQ(sidecar["securityContext"]["runAsNonRoot"], true);
  EXPECT_EQ(sidecar["securityContext"]["runAsUser"], 1000);
  EXPECT_EQ(sidecar["securityContext"]["runAsGroup"], 2000);
  EXPECT_EQ(sidecar["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(sidecar["securityContext"]["privileged"], false);
  EXPECT_EQ(spec["securityContext"]["supplementalGroups"], Json::array({2000}));
  EXPECT_FALSE(sidecar.contains("resources"));
  EXPECT_EQ(EnvValue(sidecar, "GRANARY_SOCKET"), "/run/granary/sidecar.sock");
  const Json* node = FindNamed(sidecar["env"], "GRANARY_NODE_NAME");
  ASSERT_NE(node, nullptr);
  EXPECT_EQ((*node)["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
  // The store URL is nowhere in the pod spec: a file from the Secret, in the
  // sidecar only.
  EXPECT_EQ(FindNamed(sidecar["env"], "GRANARY_METADATA_STORE"), nullptr);
  const Json* store = FindNamed(spec["volumes"], "granary-store");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ((*store)["secret"]["secretName"], "granary-gpu-store");
  EXPECT_EQ((*store)["secret"]["items"][0], Json({{"key", "url"}, {"path", "url"}}));
  const Json* store_mount = FindNamed(sidecar["volumeMounts"], "granary-store");
  ASSERT_NE(store_mount, nullptr);
  EXPECT_EQ((*store_mount)["mountPath"], "/etc/granary/store");
  EXPECT_EQ((*store_mount)["readOnly"], true);
  // The cache node's handoff socket, from the pool's host directory.
  const Json* node_socket = FindNamed(spec["volumes"], "granary-node-socket");
  ASSERT_NE(node_socket, nullptr);
  EXPECT_EQ((*node_socket)["hostPath"]["path"], "/var/run/granary/gpu");
  const Json* node_mount = FindNamed(sidecar["volumeMounts"], "granary-node-socket");
  ASSERT_NE(node_mount, nullptr);
  EXPECT_EQ((*node_mount)["mountPath"], "/run/granary-node");
  // The pod's own token, for the cache nodes only (audience granary), in the
  // sidecar only: it proves the pod's namespace over TCP.
  const Json* token = FindNamed(spec["volumes"], "granary-token");
  ASSERT_NE(token, nullptr);
  const Json& projected = (*token)["projected"]["sources"][0]["serviceAccountToken"];
  EXPECT_EQ(projected["audience"], "granary");
  EXPECT_EQ(projected["path"], "token");
  EXPECT_EQ(projected["expirationSeconds"], 3600);
  const Json* token_mount = FindNamed(sidecar["volumeMounts"], "granary-token");
  ASSERT_NE(token_mount, nullptr);
  EXPECT_EQ((*token_mount)["mountPath"], "/var/run/secrets/granary");
  EXPECT_EQ((*token_mount)["readOnly"], true);
  for (const Json& c : spec["containers"]) {
    EXPECT_EQ(FindNamed(c["volumeMounts"], "granary-store"), nullptr) << c["name"];
    EXPECT_EQ(FindNamed(c["volumeMounts"], "granary-node-socket"), nullptr) << c["name"];
    EXPECT_EQ(FindNamed(c["volumeMounts"], "granary-token"), nullptr) << c["name"];
  }

  // The config annotation (its key escaped as ~1 in the patch) and its volume.
  const std::string config = pod["metadata"]["annotations"]["granary.io/sidecar-config"];
  EXPECT_THAT(config, HasSubstr("socket: /run/granary/sidecar.sock\n"));
  EXPECT_THAT(config, HasSubstr("pool: gpu\n"));
  EXPECT_THAT(config, HasSubstr("metrics_listen: 0.0.0.0:9465\n"));
  EXPECT_THAT(config, HasSubstr("metadata_store_file: /etc/granary/store/url\n"));
  EXPECT_THAT(config, HasSubstr("peer_token_file: /var/run/secrets/granary/token\n"));
  EXPECT_THAT(config, HasSubstr("local_node_socket: /run/granary-node/cachenode.sock\n"));
  EXPECT_THAT(config, Not(HasSubstr("mounts:")));
  // The pod has no source mounted: the cache nodes read what they lack.
  EXPECT_THAT(config, HasSubstr("source_fallthrough: false\n"));
  const Json* config_volume = FindNamed(spec["volumes"], "granary-sidecar-config");
  ASSERT_NE(config_volume, nullptr);
  EXPECT_EQ((*config_volume)["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.annotations['granary.io/sidecar-config']");
  const Json* socket_volume = FindNamed(spec["volumes"], "granary-socket");
  ASSERT_NE(socket_volume, nullptr);
  EXPECT_TRUE(socket_volume->contains("emptyDir"));

  const std::string granary_name = GranaryDatasetName("team-a", "imagenet-train");
  for (const Json& c : spec["containers"]) {
    EXPECT_EQ(EnvValue(c, "GRANARY_SOCKET"), "/run/granary/sidecar.sock") << c["name"];
    EXPECT_EQ(EnvValue(c, "GRANARY_DATASET"), granary_name) << c["name"];
    const Json* mount = FindNamed(c["volumeMounts"], "granary-socket");
    ASSERT_NE(mount, nullptr) << c["name"];
    EXPECT_EQ((*mount)["mountPath"], "/run/granary");
  }
  EXPECT_EQ(EnvValue(spec["containers"][0], "EPOCHS"), "3");  // the user's env kept

  const Json& terms = spec["affinity"]["nodeAffinity"]
                          ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_EQ(terms.size(), 1u);
  EXPECT_EQ(terms[0]["matchExpressions"].size(), 2u);
  EXPECT_EQ(terms[0]["matchExpressions"][0],
            Json({{"key", "granary.io/nvme"}, {"operator", "In"}, {"values", {"true"}}}));
  EXPECT_EQ(spec["tolerations"], Pool().tolerations);
}

TEST(WebhookPatchTest, PathsAreEscaped) {
  Result<Json> patch = BuildInjectionPatch(TrainingPod(), Inputs());
  ASSERT_TRUE(patch.ok()) << patch.status().message();
  bool found = false;
  for (const Json& op : *patch) {
    if (op["path"] == "/metadata/annotations/granary.io~1sidecar-config") found = true;
  }
  EXPECT_TRUE(found) << patch->dump(1);
  EXPECT_EQ(EscapeJsonPointer("a/b~c"), "a~1b~0c");
}

TEST(WebhookPatchTest, OtherInitContainersGetTheEnvAndRunAfterTheSidecar) {
  Json pod = TrainingPod();
  pod["spec"]["initContainers"] = Json::parse(R"([
    {"name": "warmup", "image": "busybox", "env": [{"name": "GRANARY_SOCKET", "value": "/mine"}],
     "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}])");
  pod["spec"]["volumes"] = Json::parse(R"([{"name": "scratch", "emptyDir": {}}])");
  pod["metadata"]["annotations"] = {{"team", "a"}};
  const Json out = Patched(pod);
  const Json& init = out["spec"]["initContainers"];
  ASSERT_EQ(init.size(), 2u);
  EXPECT_EQ(init[0]["name"], "granary-sidecar");
  EXPECT_EQ(init[1]["name"], "warmup");
  EXPECT_EQ(EnvValue(init[1], "GRANARY_SOCKET"), "/mine");  // what the user set is kept
  EXPECT_EQ(EnvValue(init[1], "GRANARY_DATASET"), GranaryDatasetName("team-a", "imagenet-train"));
  EXPECT_NE(FindNamed(init[1]["volumeMounts"], "scratch"), nullptr);
  EXPECT_NE(FindNamed(init[1]["volumeMounts"], "granary-socket"), nullptr);
  EXPECT_EQ(out["spec"]["volumes"].size(), 6u);
  EXPECT_EQ(out["metadata"]["annotations"]["team"], "a");
}

TEST(WebhookPatchTest, UserAffinityNodeNameAndTolerationsAreKept) {
  Json pod = TrainingPod();
  pod["spec"]["nodeName"] = "gpu-3";
  pod["spec"]["affinity"] = Json::parse(R"({
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
    "nodeAffinity": {
      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-3"]}]}
      ]},
      "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [
          {"key": "fast", "operator": "Exists"}]}}]}})");
  pod["spec"]["tolerations"] = Json::parse(R"([{"key": "mine", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])");
  const Json original = pod;
  const Json out = Patched(pod);

  EXPECT_EQ(out["spec"]["nodeName"], "gpu-3");
  EXPECT_EQ(out["spec"]["affinity"]["podAntiAffinity"],
            original["spec"]["affinity"]["podAntiAffinity"]);
  const Json& na = out["spec"]["affinity"]["nodeAffinity"];
  EXPECT_EQ(na["preferredDuringSchedulingIgnoredDuringExecution"],
            original["spec"]["affinity"]["nodeAffinity"]
                    ["preferredDuringSchedulingIgnoredDuringExecution"]);
  const Json& terms = na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_EQ(terms.size(), 2u);  // no term added: the user's terms stay the alternatives
  // Term 0: the user's expression first, then the pool's, ANDed.
  ASSERT_EQ(terms[0]["matchExpressions"].size(), 3u);
  EXPECT_EQ(terms[0]["matchExpressions"][0]["key"], "zone");
  EXPECT_EQ(terms[0]["matchExpressions"][1]["key"], "granary.io/nvme");
  // Term 1: its matchFields kept, the pool's expressions added.
  EXPECT_EQ(
      terms[1]["matchFields"],
      original["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
              ["nodeSelectorTerms"][1]["matchFields"]);
  EXPECT_EQ(terms[1]["matchExpressions"].size(), 2u);
  // Tolerations: the user's kept, the pool's one already there not doubled.
  EXPECT_EQ(out["spec"]["tolerations"], original["spec"]["tolerations"]);
}

TEST(WebhookPatchTest, AffinityWithoutRequiredTermsGetsThePoolsTerm) {
  Json pod = TrainingPod();
  pod["spec"]["affinity"] = Json::parse(R"({"nodeAffinity": {
      "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}]}})");
  const Json out = Patched(pod);
  const Json& na = out["spec"]["affinity"]["nodeAffinity"];
  EXPECT_EQ(na["preferredDuringSchedulingIgnoredDuringExecution"].size(), 1u);
  EXPECT_EQ(na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
              ["matchExpressions"]
                  .size(),
            2u);
}

TEST(WebhookPatchTest, ADatasetOnSomeNodesIsPreferredThere) {
  InjectionInputs in = Inputs();
  in.preferred_nodes = {"gpu-1", "gpu-3"};
  // One term per node: the API server allows one value per node field selector.
  const auto term = [](const std::string& node) {
    return Json{{"weight", 100},
                {"preference",
                 {{"matchFields", Json::array({{{"key", "metadata.name"},
                                                {"operator", "In"},
                                                {"values", Json::array({node})}}})}}}};
  };
  const Json expected = Json::array({term("gpu-1"), term("gpu-3")});
  const Json out = Patched(TrainingPod(), in);
  const Json& na = out["spec"]["affinity"]["nodeAffinity"];
  EXPECT_EQ(na["preferredDuringSchedulingIgnoredDuringExecution"], expected);
  EXPECT_EQ(na["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].size(), 1u);

  // The user's own preferences stay; ours is added after them.
  Json pod = TrainingPod();
  pod["spec"]["affinity"] = Json::parse(R"({"nodeAffinity": {
      "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 7, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}]}})");
  const Json mine = Patched(pod, in);
  const Json& prefs =
      mine["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(prefs.size(), 3u);
  EXPECT_EQ(prefs[0]["weight"], 7);
  EXPECT_EQ(prefs[1], expected[0]);
  EXPECT_EQ(prefs[2], expected[1]);

  // Many nodes: one term on the hostname label.
  InjectionInputs many = Inputs();
  for (int i = 0; i < 40; ++i) many.preferred_nodes.push_back("gpu-" + std::to_string(i));
  const Json wide = Patched(
      TrainingPod(),
      many)["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
  ASSERT_EQ(wide.size(), 1u);
  EXPECT_EQ(wide[0]["preference"]["matchExpressions"][0]["key"], "kubernetes.io/hostname");
  EXPECT_EQ(wide[0]["preference"]["matchExpressions"][0]["values"].size(), 40u);

  // A pool without a node selector and a placed dataset: only the preference.
  in.pool.node_selector = Json::object();
  const Json bare = Patched(TrainingPod(), in);
  EXPECT_FALSE(bare["spec"]["affinity"]["nodeAffinity"].contains(
      "requiredDuringSchedulingIgnoredDuringExecution"));
  EXPECT_EQ(
      bare["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
          .size(),
      2u);
}

// Pod Security baseline forbids hostPath volumes: a pool can leave the
// chunk handoff out, and then the pod has none.
TEST(WebhookPatchTest, APoolWithoutTheChunkHandoffAddsNoHostPath) {
  InjectionInputs in = Inputs();
  in.pool.sidecar_chunk_handoff = false;
  const Json out = Patched(TrainingPod(), in);
  for (const Json& v : out["spec"]["volumes"]) {
    EXPECT_FALSE(v.contains("hostPath")) << v.dump();
  }
  EXPECT_EQ(FindNamed(out["spec"]["initContainers"][0]["volumeMounts"], "granary-node-socket"),
            nullptr);
  EXPECT_THAT(out["metadata"]["annotations"]["granary.io/sidecar-config"].get<std::string>(),
              Not(HasSubstr("local_node_socket")));
}

TEST(WebhookPatchTest, TheSidecarGetsThePoolsResourcesPortAndTheGroupIsAddedOnce) {
  InjectionInputs in = Inputs();
  in.pool.sidecar_resources = {{"requests", {{"cpu", "500m"}, {"memory", "1Gi"}}}};
  in.pool.sidecar_metrics_port = 19465;
  Json pod = TrainingPod();
  pod["spec"]["securityContext"] = {{"runAsUser", 1000}, {"supplementalGroups", {2000, 7}}};
  const Json out = Patched(pod, in);
  const Json& sidecar = out["spec"]["initContainers"][0];
  EXPECT_EQ(sidecar["resources"], in.pool.sidecar_resources);
  EXPECT_EQ(sidecar["ports"][0]["containerPort"], 19465);
  EXPECT_EQ(sidecar["readinessProbe"]["httpGet"]["port"], 19465);
  EXPECT_THAT(out["metadata"]["annotations"]["granary.io/sidecar-config"].get<std::string>(),
              HasSubstr("metrics_listen: 0.0.0.0:19465\n"));
  EXPECT_EQ(out["spec"]["securityContext"]["supplementalGroups"], Json::array({2000, 7}));
  EXPECT_EQ(out["spec"]["securityContext"]["runAsUser"], 1000);
  pod["spec"]["securityContext"]["supplementalGroups"] = {7};
  EXPECT_EQ(Patched(pod, in)["spec"]["securityContext"]["supplementalGroups"],
            Json::array({7, 2000}));
}

TEST(WebhookPatchTest, ADatasetWithoutASnapshotIsRefusedWithWhatToWaitFor) {
  struct Case {
    std::string phase;
    bool staged_only;
    std::string says;  // "" = admitted
  };
  const std::vector<Case> cases = {
      {"Ready", false, ""},
      {"Staging", false, ""},
      {"Ready", true, ""},
      {"Staging", true, "still staging"},
      {"Pending", false, "no snapshot yet (phase Pending)"},
      {"Snapshotting", false, "no snapshot yet (phase Snapshotting)"},
      {"Failed", false, "has failed"},
      {"", false, "not been reconciled"},
  };
  for (const Case& c : cases) {
    InjectionInputs in = Inputs();
    in.dataset_phase = c.phase;
    Json pod = TrainingPod();
    if (c.staged_only) pod["metadata"]["annotations"] = {{"granary.io/require-staged", "true"}};
    Result<Json> patch = BuildInjectionPatch(pod, in);
    if (c.says.empty()) {
      EXPECT_TRUE(patch.ok()) << c.phase << ": " << patch.status().message();
      continue;
    }
    ASSERT_FALSE(patch.ok()) << c.phase;
    EXPECT_EQ(patch.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(patch.status().message(), HasSubstr(c.says));
    EXPECT_THAT(patch.status().message(), HasSubstr("Dataset team-a/imagenet-train"));
    EXPECT_THAT(patch.status().message(), HasSubstr("kubectl get dataset imagenet-train"));
  }
}

TEST(WebhookPatchTest, ThePosixViewIsMountedWhereAskedAndCostsAPrivilegedSidecar) {
  InjectionInputs in = Inputs();
  in.pool.allow_posix_view = true;
  Json pod = TrainingPod();
  pod["metadata"]["annotations"] = {{"granary.io/mount-path", "/data"}};
  const Json out = Patched(pod, in);
  const Json& sidecar = out["spec"]["initContainers"][0];
  EXPECT_EQ(sidecar["securityContext"]["privileged"], true);
  EXPECT_EQ(sidecar["securityContext"]["runAsUser"], 0);
  const Json* view_mount = FindNamed(sidecar["volumeMounts"], "granary-view");
  ASSERT_NE(view_mount, nullptr);
  EXPECT_EQ((*view_mount)["mountPath"], "/run/granary-view");
  EXPECT_EQ((*view_mount)["mountPropagation"], "Bidirectional");
  for (const Json& c : out["spec"]["containers"]) {
    const Json* m = FindNamed(c["volumeMounts"], "granary-view");
    ASSERT_NE(m, nullptr) << c["name"];
    EXPECT_EQ((*m)["mountPath"], "/data");
    EXPECT_EQ((*m)["mountPropagation"], "HostToContainer");
    EXPECT_EQ((*m)["readOnly"], true);
  }
  EXPECT_NE(FindNamed(out["spec"]["volumes"], "granary-view"), nullptr);
  EXPECT_THAT(out["metadata"]["annotations"]["granary.io/sidecar-config"].get<std::string>(),
              HasSubstr("mounts: " + GranaryDatasetName("team-a", "imagenet-train") +
                        ":/run/granary-view\n"));

  // Refused: a pool that does not allow it, and paths that are not usable.
  Result<Json> forbidden = BuildInjectionPatch(pod, Inputs());
  ASSERT_FALSE(forbidden.ok());
  EXPECT_EQ(forbidden.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(forbidden.status().message(), HasSubstr("allowPosixView"));
  for (const std::string bad :
       {"data", "/", "/data/../etc", "/run/granary", "/run", "/etc/granary/store/x", "/da\nta"}) {
    Json p = TrainingPod();
    p["metadata"]["annotations"] = {{"granary.io/mount-path", bad}};
    Result<Json> refused = BuildInjectionPatch(p, in);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("granary.io/mount-path")) << bad;
  }
  // A container that already mounts something at the view's path.
  Json taken = pod;
  taken["spec"]["containers"][0]["volumeMounts"] = {{{"name", "mine"}, {"mountPath", "/data"}}};
  taken["spec"]["volumes"] = {{{"name", "mine"}, {"emptyDir", Json::object()}}};
  Result<Json> clash = BuildInjectionPatch(taken, in);
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(clash.status().message(), HasSubstr("already mounts something at /data"));
}

TEST(WebhookPatchTest, SeveralDatasetsShareOneSidecarOfOnePoolAndIdentity) {
  Json pod = TrainingPod();
  pod["metadata"]["annotations"] = {{"granary.io/datasets", " coco ,imagenet-train,, laion"}};
  Result<std::vector<std::string>> names = NamedDatasets(pod, "imagenet-train");
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, (std::vector<std::string>{"imagenet-train", "coco", "laion"}));
  EXPECT_EQ(*NamedDatasets(TrainingPod(), "imagenet-train"),
            std::vector<std::string>{"imagenet-train"});
  for (const std::string& bad :
       std::vector<std::string>{"Bad_Name", "a,b c", std::string(64, 'a')}) {
    Json p = TrainingPod();
    p["metadata"]["annotations"] = {{"granary.io/datasets", bad}};
    Result<std::vector<std::string>> refused = NamedDatasets(p, "imagenet-train");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("granary.io/datasets"));
  }
  std::string many;
  for (int i = 0; i < 20; ++i) many += "d" + std::to_string(i) + ",";
  Json crowded = TrainingPod();
  crowded["metadata"]["annotations"] = {{"granary.io/datasets", many}};
  EXPECT_FALSE(NamedDatasets(crowded, "imagenet-train").ok());

  InjectionInputs in = Inputs();
  in.preferred_nodes = {"gpu-1"};
  InjectionInputs coco = Inputs();
  coco.dataset_name = "coco";
  coco.preferred_nodes = {"gpu-1", "gpu-2"};
  ASSERT_TRUE(AddDataset(coco, &in).ok());
  InjectionInputs other_pool = coco;
  other_pool.pool.name = "cpu";
  Status pool_refused = AddDataset(other_pool, &in);
  EXPECT_EQ(pool_refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(pool_refused.message(), HasSubstr("CachePool cpu"));
  InjectionInputs other_uid = coco;
  other_uid.run_as_uid = 1001;
  Status uid_refused = AddDataset(other_uid, &in);
  EXPECT_THAT(uid_refused.message(), HasSubstr("runs as one identity"));
  ASSERT_EQ(in.extra.size(), 1u);

  const Json out = Patched(TrainingPod(), in);
  for (const Json& c : out["spec"]["containers"]) {
    EXPECT_EQ(EnvValue(c, "GRANARY_DATASET"), GranaryDatasetName("team-a", "imagenet-train"));
    EXPECT_EQ(EnvValue(c, "GRANARY_DATASETS"), GranaryDatasetName("team-a", "imagenet-train") +
                                                   "," + GranaryDatasetName("team-a", "coco"));
  }
  // The nodes of both, once each.
  EXPECT_EQ(
      out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
          .size(),
      2u);
  // Each must have a snapshot; the POSIX view serves one Dataset only.
  in.extra[0].phase = "Pending";
  Result<Json> pending = BuildInjectionPatch(TrainingPod(), in);
  ASSERT_FALSE(pending.ok());
  EXPECT_THAT(pending.status().message(), HasSubstr("Dataset team-a/coco has no snapshot yet"));
  in.extra[0].phase = "Ready";
  in.pool.allow_posix_view = true;
  Json view = TrainingPod();
  view["metadata"]["annotations"] = {{"granary.io/mount-path", "/data"}};
  Result<Json> two_views = BuildInjectionPatch(view, in);
  ASSERT_FALSE(two_views.ok());
  EXPECT_THAT(two_views.status().message(), HasSubstr("serves one Dataset"));
}

TEST(WebhookPatchTest, AnInjectedPodGetsNoPatch) {
  const Json once = Patched(TrainingPod());
  EXPECT_TRUE(AlreadyInjected(once));
  Result<Json> again = BuildInjectionPatch(once, Inputs());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(again->empty()) << again->dump(1);
  EXPECT_EQ(PatchResponse("u", *again), AllowResponse("u"));
}

TEST(WebhookPatchTest, ThePoolsTransportReachesTheSidecar) {
  InjectionInputs in = Inputs();
  EXPECT_THAT(SidecarConfigYaml(in), Not(HasSubstr("transport:")));
  in.pool.transport = "libfabric";
  in.pool.libfabric_provider = "verbs";
  const std::string yaml = SidecarConfigYaml(in);
  EXPECT_THAT(yaml, HasSubstr("transport: libfabric\n"));
  EXPECT_THAT(yaml, HasSubstr("libfabric_provider: verbs\n"));
}

TEST(WebhookPatchTest, WindowComesFromTheDatasetElseThePool) {
  const Json pool = Json::parse(
      R"({"spec": {"sidecar": {"windowBytes": "128Mi", "windowSamples": 512, "arenaBytes": "200Mi"}}})");
  const Json dataset = Json::parse(R"({"spec": {"prefetch": {"windowBytes": "512Mi"}}})");
  Result<SidecarWindow> w = ResolveSidecarWindow(pool, dataset);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->window_bytes, 512ull << 20);
  EXPECT_EQ(w->window_samples, 512u);
  EXPECT_EQ(w->arena_bytes, (512ull + 64) << 20);  // the pool's arena was too small for it

  Result<SidecarWindow> pool_only = ResolveSidecarWindow(pool, Json::object());
  ASSERT_TRUE(pool_only.ok());
  EXPECT_EQ(pool_only->window_bytes, 128ull << 20);
  EXPECT_EQ(pool_only->arena_bytes, 200ull << 20);

  Result<SidecarWindow> none = ResolveSidecarWindow(Json::object(), Json::object());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->window_bytes);
  EXPECT_FALSE(none->window_samples);

  InjectionInputs in = Inputs();
  in.window = *w;
  const std::string yaml = SidecarConfigYaml(in);
  EXPECT_THAT(yaml, HasSubstr("window_bytes: 536870912\n"));
  EXPECT_THAT(yaml, HasSubstr("window_samples: 512\n"));

  Result<SidecarWindow> bad = ResolveSidecarWindow(
      Json::object(), Json::parse(R"({"spec": {"prefetch": {"windowSamples": 0}}})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("spec.prefetch.windowSamples"));
}

TEST(WebhookPatchTest, DecideSelectsLabelledCreatesOutsideTheOperatorNamespace) {
  Result<AdmissionRequest> create = ParseAdmissionReview(Review(TrainingPod()));
  ASSERT_TRUE(create.ok()) << create.status().message();
  EXPECT_EQ(create->uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
  InjectionDecision d = Decide(*create, "granary");
  EXPECT_EQ(d.kind, InjectionDecision::Kind::kInject);
  EXPECT_EQ(d.dataset, "imagenet-train");

  Result<AdmissionRequest> update = ParseAdmissionReview(Review(TrainingPod(), "UPDATE"));
  ASSERT_TRUE(update.ok());
  EXPECT_EQ(Decide(*update, "granary").kind, InjectionDecision::Kind::kSkip);

  Result<AdmissionRequest> own = ParseAdmissionReview(Review(TrainingPod(), "CREATE", "granary"));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(Decide(*own, "granary").kind, InjectionDecision::Kind::kSkip);

  Json unlabelled = TrainingPod();
  unlabelled["metadata"].erase("labels");
  Result<AdmissionRequest> plain = ParseAdmissionReview(Review(unlabelled));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Decide(*plain, "granary").kind, InjectionDecision::Kind::kSkip);
  Json other_label = TrainingPod();
  other_label["metadata"]["labels"] = {{"app", "x"}, {"granary.io/dataset", 5}};
  Result<AdmissionRequest> odd = ParseAdmissionReview(Review(other_label));
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(Decide(*odd, "granary").kind, InjectionDecision::Kind::kSkip);

  Result<AdmissionRequest> del = ParseAdmissionReview(
      R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
          "request":{"uid":"u","operation":"DELETE","namespace":"team-a"}})");
  ASSERT_TRUE(del.ok()) << del.status().message();
  EXPECT_EQ(Decide(*del, "granary").kind, InjectionDecision::Kind::kSkip);
}

TEST(WebhookPatchTest, ResponsesAreAdmissionReviews) {
  const Json patch = Json::array({{{"op", "add"}, {"path", "/a"}, {"value", 1}}});
  const Json response = Json::parse(PatchResponse("abc", patch));
  EXPECT_EQ(response["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(response["kind"], "AdmissionReview");
  EXPECT_EQ(response["response"]["uid"], "abc");
  EXPECT_EQ(response["response"]["allowed"], true);
  EXPECT_EQ(response["response"]["patchType"], "JSONPatch");
  Result<std::string> decoded =
      Base64Decode(response["response"]["patch"].get<std::string>(), "response.patch");
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_EQ(Json::parse(*decoded), patch);

  const Json deny = Json::parse(DenyResponse("abc", 403, "Dataset team-a/x does not exist"));
  EXPECT_EQ(deny["response"]["allowed"], false);
  EXPECT_EQ(deny["response"]["status"]["code"], 403);
  EXPECT_EQ(deny["response"]["status"]["message"], "Dataset team-a/x does not exist");
  EXPECT_EQ(Json::parse(AllowResponse("abc"))["response"],
            Json({{"uid", "abc"}, {"allowed", true}}));
}

TEST(WebhookPatchTest, HostileBodiesAreErrors) {
  auto error_of = [](const std::string& body) {
    Result<AdmissionRequest> r = ParseAdmissionReview(body);
    EXPECT_FALSE(r.ok()) << body.substr(0, 200);
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_THAT(error_of(""), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of("{\"apiVersion\": "), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of("\xff\xfe{}"), HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of("[1,2]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"})"),
              HasSubstr("admissionReviewVersions"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"Pod"})"),
              HasSubstr("kind AdmissionReview"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"})"),
              HasSubstr("no request"));
  EXPECT_THAT(
      error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}})"),
      HasSubstr("no uid"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
                           "request":{"uid":7,"operation":"CREATE"}})"),
              HasSubstr("no uid"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
                           "request":{"uid":"u"}})"),
              HasSubstr("no operation"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
                           "request":{"uid":"u","operation":"CREATE"}})"),
              HasSubstr("no object"));
  EXPECT_THAT(error_of(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",
                           "request":{"uid":"u","operation":"CREATE","object":[]}})"),
              HasSubstr("no object"));
  Json secret = TrainingPod();
  secret["kind"] = "Secret";
  EXPECT_THAT(error_of(Review(secret)), HasSubstr("not for a Pod"));

  EXPECT_THAT(error_of(std::string(kMaxReviewBytes + 1, ' ')), HasSubstr("larger than"));
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_THAT(error_of(deep), HasSubstr("nests deeper"));
  // Brackets inside strings do not count as nesting.
  Json bracketed = TrainingPod();
  bracketed["metadata"]["annotations"] = {{"x", std::string(1000, '[')}};
  EXPECT_TRUE(ParseAdmissionReview(Review(bracketed)).ok());
}

TEST(WebhookPatchTest, PodsOfTheWrongShapeAreErrorsNotCrashes) {
  for (const char* text : {
           R"({"metadata": {}})",
           R"({"metadata": {}, "spec": []})",
           R"({"metadata": {}, "spec": {"containers": {}}})",
           R"({"metadata": {}, "spec": {"containers": []}})",
           R"({"metadata": {}, "spec": {"containers": [7]}})",
           R"({"metadata": {}, "spec": {"containers": [{"env": {}}]}})",
           R"({"metadata": {}, "spec": {"containers": [{"volumeMounts": 1}]}})",
           R"({"metadata": {"annotations": []}, "spec": {"containers": [{}]}})",
           R"({"spec": {"containers": [{}]}})",
           R"({"metadata": {}, "spec": {"containers": [{}], "initContainers": 3}})",
           R"({"metadata": {}, "spec": {"containers": [{}], "volumes": {}}})",
           R"({"metadata": {}, "spec": {"containers": [{}], "affinity": 1}})",
           R"({"metadata": {}, "spec": {"containers": [{}], "affinity": {"nodeAffinity": {
               "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [1]}}}}})",
           R"({"metadata": {}, "spec": {"containers": [{}], "tolerations": "x"}})",
           R"({"metadata": {}, "spec": {"containers": [{}],
               "volumes": [{"name": "granary-socket", "emptyDir": {}}]}})",
       }) {
    Result<Json> patch = BuildInjectionPatch(Json::parse(text), Inputs());
    EXPECT_FALSE(patch.ok()) << text;
  }
  Result<Json> minimal = BuildInjectionPatch(
      Json::parse(R"({"metadata": {}, "spec": {"containers": [{}]}})"), Inputs());
  EXPECT_TRUE(minimal.ok()) << minimal.status().message();
}

}  // namespace
}  // namespace granary::kube

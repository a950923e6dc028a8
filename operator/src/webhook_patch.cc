#include "granary/operator/webhook_patch.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "granary/core/names.h"
#include "granary/operator/base64.h"

namespace granary::kube {
namespace {

// Nesting depth of a JSON text, counted outside strings; stops early once
// `limit` is exceeded. nlohmann's parser is iterative, but its dump and
// several accessors recurse, so deep input is refused before parsing.
bool NestingWithin(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > limit) return false;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return true;
}

const Json* Member(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string StringMember(const Json& object, const char* key) {
  const Json* v = Member(object, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}

Json Op(const std::string& path, Json value) {
  return {{"op", "add"}, {"path", path}, {"value", std::move(value)}};
}

Json SidecarEnvForApps(const InjectionInputs& inputs) {
  std::string all = GranaryDatasetName(inputs.dataset_namespace, inputs.dataset_name);
  for (const ExtraDataset& d : inputs.extra) {
    all += "," + GranaryDatasetName(inputs.dataset_namespace, d.name);
  }
  return Json::array({
      {{"name", "GRANARY_SOCKET"}, {"value", std::string(kSocketPath)}},
      {{"name", "GRANARY_DATASET"},
       {"value", GranaryDatasetName(inputs.dataset_namespace, inputs.dataset_name)}},
      {{"name", "GRANARY_DATASETS"}, {"value", all}},
  });
}

Json SocketMount() {
  return {{"name", std::string(kSocketVolumeName)}, {"mountPath", std::string(kSocketDir)}};
}

// The pod's annotation `key`, or "".
std::string AnnotationOf(const Json& pod, std::string_view key) {
  const Json* metadata = Member(pod, "metadata");
  const Json* annotations = metadata != nullptr ? Member(*metadata, "annotations") : nullptr;
  return annotations != nullptr ? StringMember(*annotations, std::string(key).c_str()) : "";
}

// The POSIX view's path in the app containers (the annotation), checked.
Result<std::string> ViewPath(const Json& pod, const InjectionInputs& inputs) {
  const std::string path = AnnotationOf(pod, kMountPathAnnotation);
  if (path.empty()) return path;
  const std::string what = "annotation " + std::string(kMountPathAnnotation) + ": \"" + path + "\"";
  if (!inputs.extra.empty()) {
    return Status::InvalidArgument(
        what + ": the POSIX view serves one Dataset, and the pod names " +
        std::to_string(inputs.extra.size() + 1) + " (annotation " +
        std::string(kDatasetsAnnotation) + "); remove one of the two annotations");
  }
  if (!inputs.pool.allow_posix_view) {
    return Status::FailedPrecondition(
        what + ": CachePool " + inputs.pool.name +
        " does not allow the POSIX view (its spec.sidecar.allowPosixView is false); remove the "
        "annotation and read through granary.torch, or ask an admin to allow it");
  }
  bool dotdot = false;
  for (size_t at = 0; at < path.size();) {
    size_t end = path.find('/', at);
    if (end == std::string::npos) end = path.size();
    if (path.compare(at, end - at, "..") == 0 && end - at == 2) dotdot = true;
    at = end + 1;
  }
  bool control = false;
  for (char ch : path) control = control || static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
  if (path.front() != '/' || path == "/" || dotdot || control || path.size() > 1024) {
    return Status::InvalidArgument(what +
                                   " is not an absolute directory path (not /, no '..'); write "
                                   "e.g. /data");
  }
  for (std::string_view reserved :
       {kSocketDir, kViewDir, kSidecarConfigDir, kStoreDir, kTokenDir}) {
    const std::string r(reserved);
    if (path == r || path.starts_with(r + "/") || r.starts_with(path + "/")) {
      return Status::InvalidArgument(what + " overlaps " + r +
                                     ", which Granary's sidecar uses; choose another path");
    }
  }
  return path;
}

Json SidecarContainer(const InjectionInputs& inputs, bool view) {
  const std::string config_path = std::string(kSidecarConfigDir) + "/sidecar.yaml";
  const int port = inputs.pool.sidecar_metrics_port;
  Json probe_get = {{"path", "/readyz"}, {"port", port}};
  Json mounts = Json::array({SocketMount(),
                             {{"name", std::string(kConfigVolumeName)},
                              {"mountPath", std::string(kSidecarConfigDir)},
                              {"readOnly", true}},
                             {{"name", std::string(kStoreVolumeName)},
                              {"mountPath", std::string(kStoreDir)},
                              {"readOnly", true}},
                             {{"name", std::string(kTokenVolumeName)},
                              {"mountPath", std::string(kTokenDir)},
                              {"readOnly", true}}});
  if (inputs.pool.sidecar_chunk_handoff) {
    // Connecting to a socket needs no write access to its mount.
    mounts.push_back({{"name", std::string(kNodeSocketVolumeName)},
                      {"mountPath", std::string(kNodeSocketDir)},
                      {"readOnly", true}});
  }
  // The dataset owner's identity (never root: CheckGrant refuses uid 0). The
  // POSIX view needs mount(2) in the host's mount namespace: root, privileged,
  // and Bidirectional propagation of the view's volume.
  Json security = {{"runAsNonRoot", true},
                   {"runAsUser", inputs.run_as_uid},
                   {"runAsGroup", inputs.run_as_gid},
                   {"allowPrivilegeEscalation", false},
                   {"privileged", false},
                   {"readOnlyRootFilesystem", true},
                   {"capabilities", {{"drop", Json::array({"ALL"})}}},
                   {"seccompProfile", {{"type", "RuntimeDefault"}}}};
  if (view) {
    security = {{"runAsUser", 0},
                {"runAsGroup", inputs.run_as_gid},
                {"privileged", true},
                {"readOnlyRootFilesystem", true}};
    mounts.push_back({{"name", std::string(kViewVolumeName)},
                      {"mountPath", std::string(kViewDir)},
                      {"mountPropagation", "Bidirectional"}});
  }
  Json container = {
      {"name", std::string(kSidecarContainerName)},
      {"image", inputs.pool.image},
      {"imagePullPolicy", inputs.pool.image_pull_policy},
      {"restartPolicy", "Always"},  // a native sidecar
      {"command", Json::array({"granary-sidecar"})},
      // $(GRANARY_NODE_NAME) is expanded by the kubelet from the env below.
      {"args", Json::array({"--config=" + config_path, "--local-node=$(GRANARY_NODE_NAME)"})},
      {"env", Json::array({
                  {{"name", "GRANARY_SOCKET"}, {"value", std::string(kSocketPath)}},
                  {{"name", "GRANARY_NODE_NAME"},
                   {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
              })},
      {"ports",
       Json::array({{{"name", "granary-metrics"}, {"containerPort", port}, {"protocol", "TCP"}}})},
      {"startupProbe", {{"httpGet", probe_get}, {"periodSeconds", 1}, {"failureThreshold", 120}}},
      {"readinessProbe", {{"httpGet", probe_get}, {"periodSeconds", 5}, {"failureThreshold", 3}}},
      {"volumeMounts", mounts},
      {"securityContext", security},
  };
  if (!inputs.pool.sidecar_resources.empty()) {
    container["resources"] = inputs.pool.sidecar_resources;
  }
  return container;
}

// One term's expressions for the pool's node selector (label: value -> In).
Json SelectorExpressions(const CachePool& pool) {
  Json expressions = Json::array();
  if (!pool.node_selector.is_object()) return expressions;
  for (auto it = pool.node_selector.begin(); it != pool.node_selector.end(); ++it) {
    if (!it.value().is_string()) continue;
    expressions.push_back(
        {{"key", it.key()}, {"operator", "In"}, {"values", Json::array({it.value()})}});
  }
  return expressions;
}

// Adds env vars and the socket mount to containers[i] (existing list).
// `view_path`: the POSIX view's mount point in these containers ("" for none).
Status AddToContainers(const Json& spec, const char* list_name, const InjectionInputs& inputs,
                       const std::string& view_path, Json& ops) {
  const Json* list = Member(spec, list_name);
  if (list == nullptr) return Status::Ok();
  if (!list->is_array()) {
    return Status::InvalidArgument(std::string("spec.") + list_name + " is not a list");
  }
  const Json env = SidecarEnvForApps(inputs);
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& c = (*list)[i];
    if (!c.is_object()) {
      return Status::InvalidArgument(std::string("spec.") + list_name + "[" + std::to_string(i) +
                                     "] is not an object");
    }
    const std::string base = std::string("/spec/") + list_name + "/" + std::to_string(i);
    const Json* have_env = Member(c, "env");
    if (have_env == nullptr || have_env->is_null()) {
      ops.push_back(Op(base + "/env", env));
    } else if (have_env->is_array()) {
      for (const Json& var : env) {
        bool present = false;
        for (const Json& e : *have_env) {
          if (StringMember(e, "name") == var["name"].get<std::string>()) present = true;
        }
        // A variable the user set is kept as written.
        if (!present) ops.push_back(Op(base + "/env/-", var));
      }
    } else {
      return Status::InvalidArgument(base + "/env is not a list");
    }
    Json add = Json::array({SocketMount()});
    if (!view_path.empty()) {
      add.push_back({{"name", std::string(kViewVolumeName)},
                     {"mountPath", view_path},
                     {"readOnly", true},
                     {"mountPropagation", "HostToContainer"}});
    }
    const Json* mounts = Member(c, "volumeMounts");
    if (mounts == nullptr || mounts->is_null()) {
      ops.push_back(Op(base + "/volumeMounts", add));
    } else if (mounts->is_array()) {
      for (const Json& want : add) {
        bool taken = false;
        for (const Json& m : *mounts) {
          if (StringMember(m, "mountPath") == want["mountPath"].get<std::string>() ||
              StringMember(m, "name") == want["name"].get<std::string>()) {
            taken = true;
          }
        }
        if (taken && want["name"] == std::string(kViewVolumeName)) {
          return Status::InvalidArgument(base + " already mounts something at " + view_path +
                                         " (annotation " + std::string(kMountPathAnnotation) +
                                         "); choose another path for the view");
        }
        if (!taken) ops.push_back(Op(base + "/volumeMounts/-", want));
      }
    } else {
      return Status::InvalidArgument(base + "/volumeMounts is not a list");
    }
  }
  return Status::Ok();
}

// The required node affinity to the pool's nodes; for a Dataset placed on
// some nodes only, a preferred term (weight 100) to those nodes.
Status AddAffinity(const Json& spec, const InjectionInputs& inputs, Json& ops) {
  const Json expressions = SelectorExpressions(inputs.pool);
  const std::string req_key = "requiredDuringSchedulingIgnoredDuringExecution";
  const std::string pref_key = "preferredDuringSchedulingIgnoredDuringExecution";
  Json node_affinity = Json::object();
  const Json term = {{"matchExpressions", expressions}};
  if (!expressions.empty()) {
    node_affinity[req_key] = {{"nodeSelectorTerms", Json::array({term})}};
  }
  // A node field selector takes one value per term: one term per node (the
  // node names the cache nodes' ids are, --node-id=spec.nodeName), or, for
  // more nodes than kMaxPreferredNodeTerms, one term on their hostname label.
  std::vector<std::string> nodes = inputs.preferred_nodes;
  for (const ExtraDataset& d : inputs.extra) {
    for (const std::string& n : d.nodes) {
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    }
  }
  Json preferred = Json::array();
  if (nodes.size() > kMaxPreferredNodeTerms) {
    preferred.push_back({{"weight", 100},
                         {"preference",
                          {{"matchExpressions", Json::array({{{"key", "kubernetes.io/hostname"},
                                                              {"operator", "In"},
                                                              {"values", nodes}}})}}}});
  } else {
    for (const std::string& node : nodes) {
      preferred.push_back({{"weight", 100},
                           {"preference",
                            {{"matchFields", Json::array({{{"key", "metadata.name"},
                                                           {"operator", "In"},
                                                           {"values", Json::array({node})}}})}}}});
    }
  }
  if (!preferred.empty()) node_affinity[pref_key] = preferred;
  if (node_affinity.empty()) return Status::Ok();

  const Json* affinity = Member(spec, "affinity");
  if (affinity == nullptr || affinity->is_null()) {
    ops.push_back(Op("/spec/affinity", {{"nodeAffinity", node_affinity}}));
    return Status::Ok();
  }
  if (!affinity->is_object()) return Status::InvalidArgument("spec.affinity is not an object");
  const Json* node = Member(*affinity, "nodeAffinity");
  if (node == nullptr || node->is_null()) {
    ops.push_back(Op("/spec/affinity/nodeAffinity", node_affinity));
    return Status::Ok();
  }
  if (!node->is_object()) {
    return Status::InvalidArgument("spec.affinity.nodeAffinity is not an object");
  }
  const std::string node_path = "/spec/affinity/nodeAffinity/";
  if (!preferred.empty()) {
    const Json* have = Member(*node, pref_key.c_str());
    if (have == nullptr || have->is_null()) {
      ops.push_back(Op(node_path + pref_key, preferred));
    } else if (have->is_array()) {
      // The user's own preferences stay; ours are more terms.
      for (const Json& p : preferred) ops.push_back(Op(node_path + pref_key + "/-", p));
    } else {
      return Status::InvalidArgument("spec.affinity.nodeAffinity." + pref_key + " is not a list");
    }
  }
  if (expressions.empty()) return Status::Ok();
  const Json required = node_affinity[req_key];
  const Json* req = Member(*node, req_key.c_str());
  const std::string req_path = node_path + req_key;
  if (req == nullptr || req->is_null()) {
    ops.push_back(Op(req_path, required));
    return Status::Ok();
  }
  const Json* terms = Member(*req, "nodeSelectorTerms");
  if (terms == nullptr || !terms->is_array() || terms->empty()) {
    if (terms != nullptr && !terms->is_null() && !terms->is_array()) {
      return Status::InvalidArgument("spec.affinity.nodeAffinity." + req_key +
                                     ".nodeSelectorTerms is not a list");
    }
    ops.push_back(Op(req_path + "/nodeSelectorTerms", Json::array({term})));
    return Status::Ok();
  }
  // Terms are ORed: the pool's expressions go into every term the user wrote
  // (ANDed with theirs), so the pod needs a pool node and the user's choice.
  for (size_t j = 0; j < terms->size(); ++j) {
    const Json& t = (*terms)[j];
    if (!t.is_object()) return Status::InvalidArgument("a nodeSelectorTerm is not an object");
    const std::string term_path = req_path + "/nodeSelectorTerms/" + std::to_string(j);
    const Json* have = Member(t, "matchExpressions");
    if (have == nullptr || have->is_null()) {
      ops.push_back(Op(term_path + "/matchExpressions", expressions));
    } else if (have->is_array()) {
      for (const Json& e : expressions) ops.push_back(Op(term_path + "/matchExpressions/-", e));
    } else {
      return Status::InvalidArgument("a nodeSelectorTerm's matchExpressions is not a list");
    }
  }
  return Status::Ok();
}

// The Dataset must have a snapshot to serve (Staging or Ready), or be Ready
// when the pod asks for a fully staged dataset.
Status CheckOnePhase(const Json& pod, const std::string& ns, const std::string& name,
                     const std::string& phase);

Status CheckDatasetPhase(const Json& pod, const InjectionInputs& inputs) {
  GRANARY_RETURN_IF_ERROR(
      CheckOnePhase(pod, inputs.dataset_namespace, inputs.dataset_name, inputs.dataset_phase));
  for (const ExtraDataset& d : inputs.extra) {
    GRANARY_RETURN_IF_ERROR(CheckOnePhase(pod, inputs.dataset_namespace, d.name, d.phase));
  }
  return Status::Ok();
}

Status CheckOnePhase(const Json& pod, const std::string& ns, const std::string& name,
                     const std::string& phase) {
  const bool staged_only = AnnotationOf(pod, kRequireStagedAnnotation) == "true";
  if (phase == "Ready" || (phase == "Staging" && !staged_only)) return Status::Ok();
  const std::string what = "Dataset " + ns + "/" + name;
  const std::string wait_for = staged_only ? "Ready" : "Staging or Ready";
  const std::string retry = "; create the pod again once `kubectl get dataset " + name + " -n " +
                            ns + "` shows " + wait_for + " (a Job's controller retries on its own)";
  if (phase.empty()) {
    return Status::FailedPrecondition(what + " has not been reconciled by granary-operator yet" +
                                      retry);
  }
  if (phase == "Failed") {
    return Status::FailedPrecondition(what + " has failed (see `kubectl describe dataset " + name +
                                      "`); fix it first" + retry);
  }
  if (phase == "Staging") {
    return Status::FailedPrecondition(what + " is still staging and the pod's annotation " +
                                      std::string(kRequireStagedAnnotation) +
                                      " asks for it staged whole" + retry);
  }
  return Status::FailedPrecondition(what + " has no snapshot yet (phase " + phase + ")" + retry);
}

// The dataset owner's gid joins the pod's supplemental groups, so that every
// container may connect to the sidecar's socket (mode 0660, that group).
Status AddSupplementalGroup(const Json& spec, uint32_t gid, Json& ops) {
  const Json* security = Member(spec, "securityContext");
  if (security == nullptr || security->is_null()) {
    ops.push_back(Op("/spec/securityContext", {{"supplementalGroups", Json::array({gid})}}));
    return Status::Ok();
  }
  if (!security->is_object())
    return Status::InvalidArgument("spec.securityContext is not an object");
  const Json* groups = Member(*security, "supplementalGroups");
  if (groups == nullptr || groups->is_null()) {
    ops.push_back(Op("/spec/securityContext/supplementalGroups", Json::array({gid})));
    return Status::Ok();
  }
  if (!groups->is_array()) {
    return Status::InvalidArgument("spec.securityContext.supplementalGroups is not a list");
  }
  for (const Json& g : *groups) {
    if (g.is_number_integer() && g.get<int64_t>() == static_cast<int64_t>(gid)) {
      return Status::Ok();
    }
  }
  ops.push_back(Op("/spec/securityContext/supplementalGroups/-", gid));
  return Status::Ok();
}

Result<Json> BuildPatchUnchecked(const Json& pod, const InjectionInputs& inputs) {
  Json ops = Json::array();
  if (AlreadyInjected(pod)) return ops;
  const Json* spec = Member(pod, "spec");
  if (spec == nullptr || !spec->is_object()) return Status::InvalidArgument("the pod has no spec");
  const Json* containers = Member(*spec, "containers");
  if (containers == nullptr || !containers->is_array() || containers->empty()) {
    return Status::InvalidArgument("the pod's spec.containers is not a non-empty list");
  }

  GRANARY_RETURN_IF_ERROR(CheckDatasetPhase(pod, inputs));
  GRANARY_ASSIGN_OR_RETURN(const std::string view_path, ViewPath(pod, inputs));
  const bool view = !view_path.empty();

  // Annotations: the sidecar's configuration (read via downwardAPI).
  const Json* metadata = Member(pod, "metadata");
  if (metadata == nullptr || !metadata->is_object()) {
    return Status::InvalidArgument("the pod has no metadata");
  }
  const Json* annotations = Member(*metadata, "annotations");
  if (annotations == nullptr || annotations->is_null()) {
    ops.push_back(Op("/metadata/annotations", Json::object()));
  } else if (!annotations->is_object()) {
    return Status::InvalidArgument("metadata.annotations is not an object");
  }
  ops.push_back(Op("/metadata/annotations/" + EscapeJsonPointer(kSidecarConfigAnnotation),
                   SidecarConfigYaml(inputs, view ? std::string(kViewDir) : "")));

  // Env and socket mounts on the existing containers, before the sidecar is
  // inserted at initContainers[0] (which shifts the existing indices).
  GRANARY_RETURN_IF_ERROR(AddToContainers(*spec, "initContainers", inputs, view_path, ops));
  GRANARY_RETURN_IF_ERROR(AddToContainers(*spec, "containers", inputs, view_path, ops));

  const Json* init = Member(*spec, "initContainers");
  if (init == nullptr || init->is_null()) {
    ops.push_back(Op("/spec/initContainers", Json::array({SidecarContainer(inputs, view)})));
  } else {
    // First, so the other init containers already find the socket.
    ops.push_back(Op("/spec/initContainers/0", SidecarContainer(inputs, view)));
  }

  const Json socket_volume = {{"name", std::string(kSocketVolumeName)},
                              {"emptyDir", {{"medium", "Memory"}, {"sizeLimit", "1Mi"}}}};
  const Json config_volume = {
      {"name", std::string(kConfigVolumeName)},
      {"downwardAPI",
       {{"defaultMode", 0444},
        {"items",
         Json::array({{{"path", "sidecar.yaml"},
                       {"fieldRef",
                        {{"fieldPath", "metadata.annotations['" +
                                           std::string(kSidecarConfigAnnotation) + "']"}}}}})}}}};
  // 0444: the sidecar runs as the dataset owner, not root; only the sidecar
  // mounts it.
  const Json store_volume = {
      {"name", std::string(kStoreVolumeName)},
      {"secret",
       {{"secretName", inputs.store_secret_name},
        {"defaultMode", 0444},
        {"items", Json::array({{{"key", inputs.store_secret_key}, {"path", "url"}}})}}}};
  const Json node_socket_volume = {{"name", std::string(kNodeSocketVolumeName)},
                                   {"hostPath",
                                    {{"path", inputs.pool.node_socket_host_path.empty()
                                                  ? DefaultNodeSocketHostPath(inputs.pool.name)
                                                  : inputs.pool.node_socket_host_path},
                                     {"type", "DirectoryOrCreate"}}}};
  // The pod's own ServiceAccount, for audience granary only: it proves the
  // pod's namespace to the cache nodes and is no use against the API server.
  const Json token_volume = {
      {"name", std::string(kTokenVolumeName)},
      {"projected",
       {{"defaultMode", 0444},
        {"sources", Json::array({{{"serviceAccountToken",
                                   {{"audience", std::string(kTokenAudience)},
                                    {"expirationSeconds", kTokenExpirationSeconds},
                                    {"path", "token"}}}}})}}}};
  Json ours = Json::array({socket_volume, config_volume, store_volume, token_volume});
  // A hostPath volume: the Pod Security baseline and restricted levels
  // forbid it; a pool for such namespaces turns the handoff off.
  if (inputs.pool.sidecar_chunk_handoff) ours.push_back(node_socket_volume);
  if (view) ours.push_back({{"name", std::string(kViewVolumeName)}, {"emptyDir", Json::object()}});
  const Json* volumes = Member(*spec, "volumes");
  if (volumes == nullptr || volumes->is_null()) {
    ops.push_back(Op("/spec/volumes", ours));
  } else if (volumes->is_array()) {
    for (const Json& v : *volumes) {
      const std::string name = StringMember(v, "name");
      for (const Json& mine : ours) {
        if (name == mine["name"].get<std::string>()) {
          return Status::InvalidArgument("the pod already has a volume named " + name +
                                         ", which Granary's sidecar needs; rename it");
        }
      }
    }
    for (const Json& mine : ours) ops.push_back(Op("/spec/volumes/-", mine));
  } else {
    return Status::InvalidArgument("spec.volumes is not a list");
  }
  GRANARY_RETURN_IF_ERROR(AddSupplementalGroup(*spec, inputs.run_as_gid, ops));

  GRANARY_RETURN_IF_ERROR(AddAffinity(*spec, inputs, ops));

  if (inputs.pool.tolerations.is_array() && !inputs.pool.tolerations.empty()) {
    const Json* tolerations = Member(*spec, "tolerations");
    if (tolerations == nullptr || tolerations->is_null()) {
      ops.push_back(Op("/spec/tolerations", inputs.pool.tolerations));
    } else if (tolerations->is_array()) {
      for (const Json& t : inputs.pool.tolerations) {
        bool present = false;
        for (const Json& have : *tolerations) present = present || have == t;
        if (!present) ops.push_back(Op("/spec/tolerations/-", t));
      }
    } else {
      return Status::InvalidArgument("spec.tolerations is not a list");
    }
  }
  return ops;
}

Result<std::optional<uint64_t>> OptionalBytes(const Json& object, const char* key,
                                              const std::string& field) {
  const Json* v = Member(object, key);
  if (v == nullptr || v->is_null()) return std::optional<uint64_t>();
  GRANARY_ASSIGN_OR_RETURN(uint64_t bytes, ParseQuantityBytes(*v, field));
  return std::optional<uint64_t>(bytes);
}

Result<std::optional<uint64_t>> OptionalCount(const Json& object, const char* key,
                                              const std::string& field) {
  const Json* v = Member(object, key);
  if (v == nullptr || v->is_null()) return std::optional<uint64_t>();
  if (!v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > 1048576) {
    return Status::InvalidArgument(field + " must be an integer in 1..1048576, not " + v->dump());
  }
  return std::optional<uint64_t>(v->get<uint64_t>());
}

}  // namespace

std::string EscapeJsonPointer(std::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (char ch : segment) {
    if (ch == '~') {
      out += "~0";
    } else if (ch == '/') {
      out += "~1";
    } else {
      out += ch;
    }
  }
  return out;
}

Result<AdmissionRequest> ParseAdmissionReview(std::string_view body) {
  if (body.size() > kMaxReviewBytes) {
    return Status::InvalidArgument("AdmissionReview body of " + std::to_string(body.size()) +
                                   " bytes is larger than the " + std::to_string(kMaxReviewBytes) +
                                   "-byte limit");
  }
  if (!NestingWithin(body, kMaxReviewDepth)) {
    return Status::InvalidArgument("AdmissionReview body nests deeper than " +
                                   std::to_string(kMaxReviewDepth) + " levels");
  }
  Json review = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (review.is_discarded()) {
    return Status::InvalidArgument("AdmissionReview body is not valid JSON");
  }
  if (!review.is_object()) return Status::InvalidArgument("AdmissionReview is not a JSON object");
  if (StringMember(review, "apiVersion") != "admission.k8s.io/v1" ||
      StringMember(review, "kind") != "AdmissionReview") {
    return Status::InvalidArgument(
        "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got " +
        StringMember(review, "apiVersion") + " " + StringMember(review, "kind") +
        " (register the webhook with admissionReviewVersions: [v1])");
  }
  const Json* request = Member(review, "request");
  if (request == nullptr || !request->is_object()) {
    return Status::InvalidArgument("AdmissionReview has no request object");
  }
  AdmissionRequest out;
  out.uid = StringMember(*request, "uid");
  if (out.uid.empty()) return Status::InvalidArgument("AdmissionReview request has no uid");
  out.operation = StringMember(*request, "operation");
  if (out.operation.empty()) {
    return Status::InvalidArgument("AdmissionReview request has no operation");
  }
  out.namespace_ = StringMember(*request, "namespace");
  if (out.operation == "CREATE" || out.operation == "UPDATE") {
    const Json* object = Member(*request, "object");
    if (object == nullptr || !object->is_object()) {
      return Status::InvalidArgument("AdmissionReview " + out.operation + " request has no object");
    }
    const Json* kind = Member(*request, "kind");
    const bool pod_kind = kind != nullptr && StringMember(*kind, "kind") == "Pod" &&
                          StringMember(*kind, "group").empty();
    if (!pod_kind || StringMember(*object, "kind") != "Pod") {
      return Status::InvalidArgument(
          "AdmissionReview request is not for a Pod (the webhook is registered for pods only)");
    }
    out.pod = *object;
  }
  return out;
}

InjectionDecision Decide(const AdmissionRequest& request, const std::string& operator_namespace) {
  InjectionDecision d;
  if (request.operation != "CREATE") {
    d.reason = request.operation + " is never mutated";
    return d;
  }
  if (request.namespace_ == operator_namespace) {
    d.reason = "pods in the operator's namespace are left alone";
    return d;
  }
  const Json* metadata = Member(request.pod, "metadata");
  const Json* labels = metadata != nullptr ? Member(*metadata, "labels") : nullptr;
  const Json* label =
      labels != nullptr ? Member(*labels, std::string(kDatasetLabel).c_str()) : nullptr;
  if (label == nullptr || !label->is_string() || label->get<std::string>().empty()) {
    d.reason = "no granary.io/dataset label";
    return d;
  }
  d.kind = InjectionDecision::Kind::kInject;
  d.dataset = label->get<std::string>();
  return d;
}

bool AlreadyInjected(const Json& pod) {
  const Json* spec = Member(pod, "spec");
  const Json* init = spec != nullptr ? Member(*spec, "initContainers") : nullptr;
  if (init == nullptr || !init->is_array()) return false;
  for (const Json& c : *init) {
    if (StringMember(c, "name") == kSidecarContainerName) return true;
  }
  return false;
}

Result<SidecarWindow> ResolveSidecarWindow(const Json& pool_object, const Json& dataset_object) {
  static const Json kEmpty = Json::object();
  auto section = [](const Json& object, const char* key) -> const Json& {
    const Json* spec = Member(object, "spec");
    const Json* s = spec != nullptr ? Member(*spec, key) : nullptr;
    return s != nullptr && s->is_object() ? *s : kEmpty;
  };
  const Json& pool = section(pool_object, "sidecar");
  const Json& prefetch = section(dataset_object, "prefetch");
  SidecarWindow w;
  GRANARY_ASSIGN_OR_RETURN(
      auto pool_bytes, OptionalBytes(pool, "windowBytes", "CachePool spec.sidecar.windowBytes"));
  GRANARY_ASSIGN_OR_RETURN(
      auto pool_samples,
      OptionalCount(pool, "windowSamples", "CachePool spec.sidecar.windowSamples"));
  GRANARY_ASSIGN_OR_RETURN(w.arena_bytes,
                           OptionalBytes(pool, "arenaBytes", "CachePool spec.sidecar.arenaBytes"));
  GRANARY_ASSIGN_OR_RETURN(
      auto ds_bytes, OptionalBytes(prefetch, "windowBytes", "Dataset spec.prefetch.windowBytes"));
  GRANARY_ASSIGN_OR_RETURN(auto ds_samples, OptionalCount(prefetch, "windowSamples",
                                                          "Dataset spec.prefetch.windowSamples"));
  w.window_bytes = ds_bytes ? ds_bytes : pool_bytes;
  w.window_samples = ds_samples ? ds_samples : pool_samples;
  // The pool's arena was sized for its window; a dataset window that outgrows
  // it would be refused by the sidecar, so the arena follows it then.
  if (w.arena_bytes && w.window_bytes && *w.arena_bytes < *w.window_bytes + (16ull << 20)) {
    w.arena_bytes = *w.window_bytes + (64ull << 20);
  }
  return w;
}

void SetDatasetInputs(const Dataset& dataset, InjectionInputs* inputs) {
  inputs->dataset_namespace = dataset.namespace_;
  inputs->dataset_name = dataset.name;
  inputs->run_as_uid = dataset.run_as_uid;
  inputs->run_as_gid = dataset.run_as_gid;
  inputs->preferred_nodes = dataset.nodes.value_or(std::vector<std::string>());
  inputs->dataset_phase = dataset.phase;
}

Result<std::vector<std::string>> NamedDatasets(const Json& pod, const std::string& label_value) {
  std::vector<std::string> names = {label_value};
  const std::string list = AnnotationOf(pod, kDatasetsAnnotation);
  const std::string what = "annotation " + std::string(kDatasetsAnnotation) + ": \"" + list + "\"";
  size_t at = 0;
  while (at < list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    std::string name = list.substr(at, end - at);
    at = end + 1;
    while (!name.empty() && name.front() == ' ') name.erase(name.begin());
    while (!name.empty() && name.back() == ' ') name.pop_back();
    if (name.empty()) continue;  // "a,,b", "a,"
    if (!IsDnsLabel(name)) {
      return Status::InvalidArgument(what + ": \"" + name +
                                     "\" is not a Dataset name; write Dataset names of the pod's "
                                     "namespace separated by commas, e.g. imagenet-train,coco");
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.size() > kMaxDatasetsPerPod) {
    return Status::InvalidArgument(what + " names " + std::to_string(names.size()) +
                                   " Datasets; one pod may use at most " +
                                   std::to_string(kMaxDatasetsPerPod));
  }
  return names;
}

Status AddDataset(const InjectionInputs& other, InjectionInputs* inputs) {
  const std::string what = "Dataset " + other.dataset_namespace + "/" + other.dataset_name;
  const std::string first = "Dataset " + inputs->dataset_namespace + "/" + inputs->dataset_name;
  if (other.pool.name != inputs->pool.name) {
    return Status::FailedPrecondition(what + " is in CachePool " + other.pool.name + ", " + first +
                                      " in " + inputs->pool.name +
                                      "; one pod's sidecar serves the Datasets of one pool: run "
                                      "them in separate pods");
  }
  if (other.run_as_uid != inputs->run_as_uid || other.run_as_gid != inputs->run_as_gid) {
    return Status::FailedPrecondition(
        what + " is read as uid/gid " + std::to_string(other.run_as_uid) + "/" +
        std::to_string(other.run_as_gid) + ", " + first + " as " +
        std::to_string(inputs->run_as_uid) + "/" + std::to_string(inputs->run_as_gid) +
        "; the sidecar runs as one identity: give them the same spec.runAs or use separate pods");
  }
  inputs->extra.push_back({other.dataset_name, other.preferred_nodes, other.dataset_phase});
  return Status::Ok();
}

std::string SidecarConfigYaml(const InjectionInputs& inputs, const std::string& view_dir) {
  std::string yaml = "# Written by granary-operator's webhook for Dataset " +
                     inputs.dataset_namespace + "/" + inputs.dataset_name + ".\n";
  yaml += "socket: " + std::string(kSocketPath) + "\n";
  yaml += "pool: " + inputs.pool.name + "\n";
  yaml += "metadata_store_file: " + std::string(kStoreDir) + "/url\n";
  yaml += "peer_token_file: " + std::string(kTokenDir) + "/token\n";
  if (inputs.pool.sidecar_chunk_handoff) {
    yaml += "local_node_socket: " + std::string(kNodeSocketPath) + "\n";
  }
  // The pod mounts no source file system: what no cache node has is read by
  // the cache nodes on demand, never by the sidecar.
  yaml += "source_fallthrough: false\n";
  yaml += "metrics_listen: 0.0.0.0:" + std::to_string(inputs.pool.sidecar_metrics_port) + "\n";
  if (!view_dir.empty()) {
    yaml += "mounts: " + GranaryDatasetName(inputs.dataset_namespace, inputs.dataset_name) + ":" +
            view_dir + "\n";
  }
  if (inputs.window.window_samples) {
    yaml += "window_samples: " + std::to_string(*inputs.window.window_samples) + "\n";
  }
  if (inputs.window.window_bytes) {
    yaml += "window_bytes: " + std::to_string(*inputs.window.window_bytes) + "\n";
  }
  if (inputs.window.arena_bytes) {
    yaml += "arena_bytes: " + std::to_string(*inputs.window.arena_bytes) + "\n";
  }
  return yaml;
}

Result<Json> BuildInjectionPatch(const Json& pod, const InjectionInputs& inputs) {
  try {
    return BuildPatchUnchecked(pod, inputs);
  } catch (const std::exception& e) {
    // Every access is type-checked first; this is the boundary's net.
    return Status::InvalidArgument(std::string("the pod could not be read: ") + e.what());
  }
}

namespace {
Json ReviewEnvelope(const std::string& uid, Json response) {
  response["uid"] = uid;
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"response", std::move(response)}};
}

// Never throws on invalid UTF-8 (replaced with U+FFFD).
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
}  // namespace

std::string AllowResponse(const std::string& uid) {
  return Dump(ReviewEnvelope(uid, {{"allowed", true}}));
}

std::string PatchResponse(const std::string& uid, const Json& patch) {
  if (patch.empty()) return AllowResponse(uid);
  return Dump(ReviewEnvelope(
      uid, {{"allowed", true}, {"patchType", "JSONPatch"}, {"patch", Base64Encode(Dump(patch))}}));
}

std::string DenyResponse(const std::string& uid, int code, const std::string& message) {
  return Dump(ReviewEnvelope(
      uid, {{"allowed", false}, {"status", {{"code", code}, {"message", message}}}}));
}

}  // namespace granary::kube

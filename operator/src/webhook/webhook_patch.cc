#include "granary/operator/webhook_patch.h"

// The JSONPatch that injects the sidecar into a pod: its container, the app
// containers' environment and mounts, the volumes, node affinity, the
// supplemental group and tolerations, each added only where the user has not
// written it. The AdmissionReview envelope is in admission_review.cc, the
// inputs (window, Datasets, sidecar YAML) in injection_inputs.cc.

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "../api/api_object_fields.h"
#include "granary/core/names.h"

namespace granary::kube {
namespace {

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

bool AlreadyInjected(const Json& pod) {
  const Json* spec = Member(pod, "spec");
  const Json* init = spec != nullptr ? Member(*spec, "initContainers") : nullptr;
  if (init == nullptr || !init->is_array()) return false;
  for (const Json& c : *init) {
    if (StringMember(c, "name") == kSidecarContainerName) return true;
  }
  return false;
}

Result<Json> BuildInjectionPatch(const Json& pod, const InjectionInputs& inputs) {
  try {
    return BuildPatchUnchecked(pod, inputs);
  } catch (const std::exception& e) {
    // Every access is type-checked first; this is the boundary's net.
    return Status::InvalidArgument(std::string("the pod could not be read: ") + e.what());
  }
}

}  // namespace granary::kube

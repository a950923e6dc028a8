#include "granary/operator/webhook_patch.h"

#include <exception>
#include <string>
#include <utility>

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
  return Json::array({
      {{"name", "GRANARY_SOCKET"}, {"value", std::string(kSocketPath)}},
      {{"name", "GRANARY_DATASET"},
       {"value", GranaryDatasetName(inputs.dataset_namespace, inputs.dataset_name)}},
  });
}

Json SocketMount() {
  return {{"name", std::string(kSocketVolumeName)}, {"mountPath", std::string(kSocketDir)}};
}

Json SidecarContainer(const InjectionInputs& inputs) {
  const std::string config_path = std::string(kSidecarConfigDir) + "/sidecar.yaml";
  Json probe_get = {{"path", "/readyz"}, {"port", kSidecarMetricsPort}};
  Json container = {
      {"name", std::string(kSidecarContainerName)},
      {"image", inputs.pool.image},
      {"imagePullPolicy", inputs.pool.image_pull_policy},
      {"restartPolicy", "Always"},  // a native sidecar
      {"command", Json::array({"granary-sidecar"})},
      {"args", Json::array({"--config=" + config_path})},
      {"env", Json::array({
                  {{"name", "GRANARY_SOCKET"}, {"value", std::string(kSocketPath)}},
                  {{"name", "GRANARY_NODE_NAME"},
                   {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
                  // Expanded by the kubelet ($(VAR) references to earlier entries).
                  {{"name", "GRANARY_LOCAL_NODE"}, {"value", "$(GRANARY_NODE_NAME)"}},
                  {{"name", "GRANARY_METADATA_STORE"},
                   {"valueFrom",
                    {{"secretKeyRef",
                      {{"name", inputs.store_secret_name}, {"key", inputs.store_secret_key}}}}}},
              })},
      {"ports", Json::array({{{"name", "granary-metrics"},
                              {"containerPort", kSidecarMetricsPort},
                              {"protocol", "TCP"}}})},
      {"startupProbe", {{"httpGet", probe_get}, {"periodSeconds", 1}, {"failureThreshold", 120}}},
      {"readinessProbe", {{"httpGet", probe_get}, {"periodSeconds", 5}, {"failureThreshold", 3}}},
      {"volumeMounts", Json::array({SocketMount(),
                                    {{"name", std::string(kConfigVolumeName)},
                                     {"mountPath", std::string(kSidecarConfigDir)},
                                     {"readOnly", true}}})},
      {"securityContext",
       {{"runAsNonRoot", true},
        {"runAsUser", kSidecarUid},
        {"runAsGroup", kSidecarUid},
        {"allowPrivilegeEscalation", false},
        {"privileged", false},
        {"readOnlyRootFilesystem", true},
        {"capabilities", {{"drop", Json::array({"ALL"})}}},
        {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
  };
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
Status AddToContainers(const Json& spec, const char* list_name, const InjectionInputs& inputs,
                       Json& ops) {
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
    const Json* mounts = Member(c, "volumeMounts");
    if (mounts == nullptr || mounts->is_null()) {
      ops.push_back(Op(base + "/volumeMounts", Json::array({SocketMount()})));
    } else if (mounts->is_array()) {
      bool taken = false;
      for (const Json& m : *mounts) {
        if (StringMember(m, "mountPath") == kSocketDir ||
            StringMember(m, "name") == kSocketVolumeName) {
          taken = true;
        }
      }
      if (!taken) ops.push_back(Op(base + "/volumeMounts/-", SocketMount()));
    } else {
      return Status::InvalidArgument(base + "/volumeMounts is not a list");
    }
  }
  return Status::Ok();
}

Status AddAffinity(const Json& spec, const InjectionInputs& inputs, Json& ops) {
  const Json expressions = SelectorExpressions(inputs.pool);
  if (expressions.empty()) return Status::Ok();
  const Json term = {{"matchExpressions", expressions}};
  const Json required = {{"nodeSelectorTerms", Json::array({term})}};
  const std::string req_key = "requiredDuringSchedulingIgnoredDuringExecution";
  const Json* affinity = Member(spec, "affinity");
  if (affinity == nullptr || affinity->is_null()) {
    ops.push_back(Op("/spec/affinity", {{"nodeAffinity", {{req_key, required}}}}));
    return Status::Ok();
  }
  if (!affinity->is_object()) return Status::InvalidArgument("spec.affinity is not an object");
  const Json* node = Member(*affinity, "nodeAffinity");
  if (node == nullptr || node->is_null()) {
    ops.push_back(Op("/spec/affinity/nodeAffinity", {{req_key, required}}));
    return Status::Ok();
  }
  if (!node->is_object())
    return Status::InvalidArgument("spec.affinity.nodeAffinity is not an object");
  const Json* req = Member(*node, req_key.c_str());
  const std::string req_path = "/spec/affinity/nodeAffinity/" + req_key;
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

Result<Json> BuildPatchUnchecked(const Json& pod, const InjectionInputs& inputs) {
  Json ops = Json::array();
  if (AlreadyInjected(pod)) return ops;
  const Json* spec = Member(pod, "spec");
  if (spec == nullptr || !spec->is_object()) return Status::InvalidArgument("the pod has no spec");
  const Json* containers = Member(*spec, "containers");
  if (containers == nullptr || !containers->is_array() || containers->empty()) {
    return Status::InvalidArgument("the pod's spec.containers is not a non-empty list");
  }

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
                   SidecarConfigYaml(inputs)));

  // Env and socket mounts on the existing containers, before the sidecar is
  // inserted at initContainers[0] (which shifts the existing indices).
  GRANARY_RETURN_IF_ERROR(AddToContainers(*spec, "initContainers", inputs, ops));
  GRANARY_RETURN_IF_ERROR(AddToContainers(*spec, "containers", inputs, ops));

  const Json* init = Member(*spec, "initContainers");
  if (init == nullptr || init->is_null()) {
    ops.push_back(Op("/spec/initContainers", Json::array({SidecarContainer(inputs)})));
  } else {
    // First, so the other init containers already find the socket.
    ops.push_back(Op("/spec/initContainers/0", SidecarContainer(inputs)));
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
  const Json* volumes = Member(*spec, "volumes");
  if (volumes == nullptr || volumes->is_null()) {
    ops.push_back(Op("/spec/volumes", Json::array({socket_volume, config_volume})));
  } else if (volumes->is_array()) {
    for (const Json& v : *volumes) {
      const std::string name = StringMember(v, "name");
      if (name == kSocketVolumeName || name == kConfigVolumeName) {
        return Status::InvalidArgument("the pod already has a volume named " + name +
                                       ", which Granary's sidecar needs; rename it");
      }
    }
    ops.push_back(Op("/spec/volumes/-", socket_volume));
    ops.push_back(Op("/spec/volumes/-", config_volume));
  } else {
    return Status::InvalidArgument("spec.volumes is not a list");
  }

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

std::string SidecarConfigYaml(const InjectionInputs& inputs) {
  std::string yaml = "# Written by granary-operator's webhook for Dataset " +
                     inputs.dataset_namespace + "/" + inputs.dataset_name + ".\n";
  yaml += "socket: " + std::string(kSocketPath) + "\n";
  yaml += "pool: " + inputs.pool.name + "\n";
  yaml += "metrics_listen: 0.0.0.0:" + std::to_string(kSidecarMetricsPort) + "\n";
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

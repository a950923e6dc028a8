// What the sidecar-injecting webhook (webhook_patch.h) injects, gathered
// before the patch is built: the prefetch window from the CachePool and the
// Dataset, the Datasets a pod names and whether one sidecar can serve them
// together, and the sidecar's YAML configuration.
#include <algorithm>
#include <string>
#include <utility>

#include "../api/api_object_fields.h"
#include "granary/core/names.h"
#include "granary/operator/webhook_patch.h"

namespace granary::kube {
namespace {

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
  if (inputs.pool.transport == "libfabric") {
    yaml += "transport: libfabric\n";
    yaml += "libfabric_provider: " + inputs.pool.libfabric_provider + "\n";
  }
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

}  // namespace granary::kube

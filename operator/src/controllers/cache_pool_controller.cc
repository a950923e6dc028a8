// CachePool → the cache-node DaemonSet and what it mounts. docs/kubernetes.md.

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include "controller_context.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/kube/base64.h"
#include "granary/peer/peer_auth.h"

namespace granary::kube {
namespace {

std::string PoolObjectName(const CachePool& pool) { return "granary-cachenode-" + pool.name; }

Json Labels(const CachePool& pool) {
  return {{"app.kubernetes.io/name", "granary-cachenode"},
          {"app.kubernetes.io/managed-by", "granary-operator"},
          {"granary.io/pool", pool.name}};
}

Json Metadata(const CachePool& pool, const Json& owner, const OperatorOptions& options,
              const std::string& name) {
  return {{"name", name},
          {"namespace", options.namespace_},
          {"labels", Labels(pool)},
          {"ownerReferences", Json::array({OwnerReference(owner)})}};
}

constexpr const char* kConfigDir = "/etc/granary/cachenode";
constexpr const char* kStoreDir = "/etc/granary/store";
constexpr const char* kClusterKeyDir = "/etc/granary/cluster-key";

// The cluster key's Secret: made with a fresh key when missing, never
// overwritten (a new key would lock out every client of the old one). Returns
// the key's text, which the pods' template hashes so a rotated key rolls the
// cache nodes.
Result<std::string> EnsureClusterKey(ControllerContext& c) {
  const OperatorOptions& options = c.options();
  const std::string path =
      "/api/v1/namespaces/" + options.namespace_ + "/secrets/" + options.cluster_key_secret;
  Result<Json> secret = c.Secret(options.namespace_, options.cluster_key_secret);
  if (!secret.ok() && secret.status().code() == StatusCode::kNotFound) {
    GRANARY_ASSIGN_OR_RETURN(std::string hex, GenerateClusterKeyHex());
    Json fresh = {{"apiVersion", "v1"},
                  {"kind", "Secret"},
                  {"metadata",
                   {{"name", options.cluster_key_secret},
                    {"namespace", options.namespace_},
                    {"labels", {{"app.kubernetes.io/managed-by", std::string(kFieldManager)}}}}},
                  {"type", "Opaque"},
                  {"data", {{"key", Base64Encode(hex + "\n")}}}};
    Result<Json> made =
        c.client().Create("/api/v1/namespaces/" + options.namespace_ + "/secrets", fresh);
    if (!made.ok() && made.status().code() != StatusCode::kAlreadyExists) return made.status();
    // The object made, or (made by another replica a moment ago) the API's.
    secret = made.ok() ? std::move(made) : c.client().Get(path);
  }
  if (!secret.ok()) return secret.status().WithContext("the cluster key Secret");
  const std::string encoded = secret->value("data", Json::object()).value("key", "");
  if (encoded.empty()) {
    return Status::FailedPrecondition(
        "Secret " + options.namespace_ + "/" + options.cluster_key_secret +
        " has no 'key'; put the cluster key there (`granary "
        "cluster-key generate`) or delete the Secret to get a new one");
  }
  return Base64Decode(encoded, "Secret " + options.cluster_key_secret + " key");
}

// Datasets (any namespace, being deleted or not) that name pool `name`, as
// "namespace/name", sorted.
std::vector<std::string> DatasetsOf(ControllerContext& c, const std::string& name) {
  std::vector<std::string> keys;
  c.datasets().Visit([&](const Json& d) {
    if (d["spec"].value("cachePool", "") == name) keys.push_back(Informer::KeyOf(d));
  });
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status SetPoolFinalizers(ControllerContext& c, const Json& object, const Json& finalizers) {
  return c.SetFinalizers(
      "/apis/granary.io/v1alpha1/cachepools/" + object["metadata"].value("name", ""), object,
      finalizers);
}

// A CachePool being deleted: held while Datasets name it (they still need
// its cache nodes and its store to be released), with condition Deleting and
// an Event naming them; then the objects made for it are deleted and the
// finalizer removed.
Result<std::chrono::milliseconds> FinishDeletion(ControllerContext& c, const Json& object,
                                                 const std::string& name,
                                                 const std::vector<std::string>& finalizers) {
  if (std::find(finalizers.begin(), finalizers.end(), kPoolFinalizer) == finalizers.end()) {
    return std::chrono::milliseconds(0);
  }
  const OperatorOptions& options = c.options();
  const std::vector<std::string> users = DatasetsOf(c, name);
  if (!users.empty()) {
    std::string listed;
    for (size_t i = 0; i < users.size() && i < 10; ++i) listed += (i ? ", " : "") + users[i];
    if (users.size() > 10) listed += " (+" + std::to_string(users.size() - 10) + " more)";
    const std::string message = "deleting CachePool " + name +
                                " waits until no Dataset uses it: " + listed + "; delete " +
                                (users.size() == 1 ? "that Dataset" : "those Datasets") +
                                " (the pool's cache nodes release their cache first)";
    Json status = object.value("status", Json::object());
    Json conditions = status.value("conditions", Json::array());
    SetCondition(conditions, "Deleting", true, "DatasetsStillUseIt", message,
                 object["metadata"].value("generation", 0), NowRfc3339());
    status["conditions"] = conditions;
    c.Event(object, "Warning", "DeletionHeld", message);
    if (status != object.value("status", Json::object())) {
      GRANARY_RETURN_IF_ERROR(
          c.client()
              .MergePatch("/apis/granary.io/v1alpha1/cachepools/" + name + "/status",
                          {{"status", status}})
              .status());
    }
    return options.progress_interval;
  }
  // What granary-operator made for the pool (owned by it too: the garbage
  // collector would remove them after the pool, but the cache nodes stop now).
  const std::string object_name = "granary-cachenode-" + name;
  const std::string base = "/api/v1/namespaces/" + options.namespace_;
  for (const std::string& path :
       {"/apis/apps/v1/namespaces/" + options.namespace_ + "/daemonsets/" + object_name,
        base + "/services/" + object_name, base + "/configmaps/" + object_name,
        base + "/secrets/" + object_name + "-store"}) {
    Status deleted = c.client().Delete(path);
    if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) {
      return deleted.WithContext("deleting " + path + " of CachePool " + name);
    }
  }
  Json kept = Json::array();
  for (const std::string& f : finalizers) {
    if (f != kPoolFinalizer) kept.push_back(f);
  }
  GRANARY_RETURN_IF_ERROR(SetPoolFinalizers(c, object, kept));
  c.Event(object, "Normal", "Deleted",
          "no Dataset uses CachePool " + name + " any more: its cache nodes were removed");
  return std::chrono::milliseconds(0);
}

}  // namespace

namespace {

// The cache node's ports: data, metrics, and the fabric's with transport
// libfabric.
bool IsCacheNodeTrouble(const std::string& reason) {
  for (std::string_view r : {kImagePullFailed, kCacheNodeCrashing, kCacheNodeNotCreated,
                             kVolumeMountFailed, kSourceMountFailed}) {
    if (reason == r) return true;
  }
  return false;
}

Json ContainerPorts(const CachePool& pool) {
  Json ports = Json::array(
      {{{"name", "data"}, {"containerPort", pool.data_port}, {"protocol", "TCP"}},
       {{"name", "metrics"}, {"containerPort", pool.metrics_port}, {"protocol", "TCP"}}});
  if (pool.transport == "libfabric") {
    ports.push_back(
        {{"name", "fabric"}, {"containerPort", pool.libfabric_port}, {"protocol", "TCP"}});
  }
  return ports;
}

}  // namespace

Json CacheNodeConfigMap(const CachePool& pool, const OperatorOptions& options) {
  (void)options;
  // Per-node values (node_id, advertise) come on the command line; the rest
  // is the same on every node of the pool.
  std::string yaml;
  yaml += "# Written by granary-operator for CachePool " + pool.name + "; edits are overwritten.\n";
  yaml += "pool: " + pool.name + "\n";
  yaml += "listen: 0.0.0.0:" + std::to_string(pool.data_port) + "\n";
  yaml += "metrics_listen: 0.0.0.0:" + std::to_string(pool.metrics_port) + "\n";
  yaml += "data_dir: " + pool.storage_host_path + "/" + pool.name + "\n";
  yaml += "capacity: " + std::to_string(pool.capacity_bytes) + "\n";
  yaml += std::string("metadata_store_file: ") + kStoreDir + "/url\n";
  // The chunk handoff for sidecars on the same host (injected ones mount the
  // same host directory, the pool's nodeSocketHostPath).
  yaml += "local_socket: " + std::string(kNodeSocketPath) + "\n";
  // Every connection to the port authenticates: peers and admins with the
  // cluster key, injected sidecars with their pod's token (its namespace only).
  yaml += std::string("cluster_key_file: ") + kClusterKeyDir + "/key\n";
  yaml += "kubernetes_auth: in-cluster\n";
  if (pool.transport == "libfabric") {
    // The fabric beside the TCP port (which peers without it, the CLI and
    // the staging path keep using); advertised in the node's record.
    yaml += "fabric_listen: 0.0.0.0:" + std::to_string(pool.libfabric_port) + "\n";
    yaml += "fabric_provider: " + pool.libfabric_provider + "\n";
  }
  return {{"cachenode.yaml", yaml}};
}

Json CacheNodeDaemonSet(const CachePool& pool, const OperatorOptions& options,
                        const std::string& config_hash) {
  Json volumes = Json::array();
  Json mounts = Json::array();
  volumes.push_back({{"name", "config"}, {"configMap", {{"name", PoolObjectName(pool)}}}});
  mounts.push_back({{"name", "config"}, {"mountPath", kConfigDir}, {"readOnly", true}});
  volumes.push_back(
      {{"name", "store"},
       {"secret", {{"secretName", PoolObjectName(pool) + "-store"}, {"defaultMode", 0400}}}});
  mounts.push_back({{"name", "store"}, {"mountPath", kStoreDir}, {"readOnly", true}});
  volumes.push_back(
      {{"name", "cluster-key"},
       {"secret", {{"secretName", options.cluster_key_secret}, {"defaultMode", 0400}}}});
  mounts.push_back({{"name", "cluster-key"}, {"mountPath", kClusterKeyDir}, {"readOnly", true}});
  volumes.push_back(
      {{"name", "data"},
       {"hostPath", {{"path", pool.storage_host_path}, {"type", "DirectoryOrCreate"}}}});
  mounts.push_back({{"name", "data"}, {"mountPath", pool.storage_host_path}});
  volumes.push_back(
      {{"name", "node-socket"},
       {"hostPath", {{"path", pool.node_socket_host_path}, {"type", "DirectoryOrCreate"}}}});
  mounts.push_back({{"name", "node-socket"}, {"mountPath", std::string(kNodeSocketDir)}});
  for (const SourceMount& m : pool.source_mounts) {
    const std::string name = "source-" + m.name;
    if (!m.host_path.empty()) {
      volumes.push_back(
          {{"name", name}, {"hostPath", {{"path", m.host_path}, {"type", "Directory"}}}});
    } else {
      volumes.push_back(
          {{"name", name},
           {"persistentVolumeClaim", {{"claimName", m.pvc_claim}, {"readOnly", true}}}});
    }
    mounts.push_back({{"name", name}, {"mountPath", m.mount_path}, {"readOnly", true}});
  }
  Json container = {
      {"name", "cachenode"},
      {"image", pool.image},
      {"imagePullPolicy", pool.image_pull_policy},
      {"command", Json::array({options.cachenode_command})},
      {"args", Json::array({std::string("--config=") + kConfigDir + "/cachenode.yaml",
                            "--node-id=$(GRANARY_NODE_NAME)",
                            "--advertise=$(GRANARY_HOST_IP):" + std::to_string(pool.data_port)})},
      {"env", Json::array({{{"name", "GRANARY_NODE_NAME"},
                            {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
                           {{"name", "GRANARY_HOST_IP"},
                            {"valueFrom", {{"fieldRef", {{"fieldPath", "status.hostIP"}}}}}}})},
      {"ports", ContainerPorts(pool)},
      {"readinessProbe",
       {{"httpGet", {{"path", "/readyz"}, {"port", "metrics"}}}, {"periodSeconds", 5}}},
      {"livenessProbe",
       {{"httpGet", {{"path", "/healthz"}, {"port", "metrics"}}},
        {"periodSeconds", 10},
        {"failureThreshold", 6}}},
      {"volumeMounts", mounts},
      // A cache node that cannot start says why on stderr and exits: its
      // last lines become the termination message the pool's status shows.
      {"terminationMessagePolicy", "FallbackToLogsOnError"},
      // Root, to take each dataset owner's identity when reading its source
      // (setuid/setgid) and to own the chunk store; nothing else.
      {"securityContext",
       {{"runAsUser", 0},
        {"allowPrivilegeEscalation", false},
        {"readOnlyRootFilesystem", true},
        {"capabilities",
         {{"drop", Json::array({"ALL"})}, {"add", Json::array({"SETUID", "SETGID"})}}}}}};
  if (!pool.resources.empty()) container["resources"] = pool.resources;
  Json pod_spec = {{"hostNetwork", true},
                   {"serviceAccountName", options.cachenode_service_account},
                   {"dnsPolicy", "ClusterFirstWithHostNet"},
                   {"terminationGracePeriodSeconds", 30},
                   {"nodeSelector", pool.node_selector},
                   {"containers", Json::array({container})},
                   {"volumes", volumes}};
  if (!pool.tolerations.empty()) pod_spec["tolerations"] = pool.tolerations;
  return {
      {"selector",
       {{"matchLabels",
         {{"app.kubernetes.io/name", "granary-cachenode"}, {"granary.io/pool", pool.name}}}}},
      {"updateStrategy", {{"type", "RollingUpdate"}, {"rollingUpdate", {{"maxUnavailable", 1}}}}},
      {"template",
       {{"metadata",
         {{"labels", Labels(pool)}, {"annotations", {{"granary.io/config-hash", config_hash}}}}},
        {"spec", pod_spec}}}};
}

Result<std::chrono::milliseconds> ReconcileCachePool(ControllerContext& c, const std::string& key) {
  std::optional<Json> object = c.pools().Get(key);
  if (!object) return std::chrono::milliseconds(0);  // deleted: its objects go with their owner
  const OperatorOptions& options = c.options();
  const std::string status_path = "/apis/granary.io/v1alpha1/cachepools/" + key + "/status";
  const int64_t generation = (*object)["metadata"].value("generation", 0);
  Json status = object->value("status", Json::object());
  Json conditions = status.value("conditions", Json::array());
  const std::string now = NowRfc3339();
  auto fail = [&](const std::string& reason,
                  const Status& why) -> Result<std::chrono::milliseconds> {
    SetCondition(conditions, "Ready", false, reason, why.message(), generation, now);
    status["conditions"] = conditions;
    status["observedGeneration"] = generation;
    c.Event(*object, "Warning", reason, why.message());
    GRANARY_RETURN_IF_ERROR(c.client().MergePatch(status_path, {{"status", status}}).status());
    return std::chrono::milliseconds(options.ready_interval);
  };

  // The finalizer and a held deletion need no usable spec.
  std::vector<std::string> finalizers;
  for (const Json& f : (*object)["metadata"].value("finalizers", Json::array())) {
    if (f.is_string()) finalizers.push_back(f.get<std::string>());
  }
  if ((*object)["metadata"].contains("deletionTimestamp")) {
    return FinishDeletion(c, *object, key, finalizers);
  }
  // The finalizer is there exactly while Datasets name the pool: a pool no
  // Dataset uses goes at once when deleted, also with no operator running
  // (helm uninstall removes the operator and the chart's pools together; its
  // objects are owned by the pool and garbage-collected).
  const bool in_use = !DatasetsOf(c, key).empty();
  const bool held =
      std::find(finalizers.begin(), finalizers.end(), kPoolFinalizer) != finalizers.end();
  if (in_use != held) {
    Json changed = Json::array();
    for (const Json& f : (*object)["metadata"].value("finalizers", Json::array())) {
      if (f != kPoolFinalizer) changed.push_back(f);
    }
    if (in_use) changed.push_back(kPoolFinalizer);
    GRANARY_RETURN_IF_ERROR(SetPoolFinalizers(c, *object, changed));
    return std::chrono::milliseconds(0);  // the update comes back through the watch
  }
  Result<CachePool> parsed = ParseCachePool(*object);
  if (!parsed.ok()) return fail("InvalidSpec", parsed.status());
  const CachePool& pool = *parsed;
  // A pod mounts claims of its own namespace only: the cache nodes run in
  // the operator's.
  for (const SourceMount& m : pool.source_mounts) {
    if (!m.pvc_claim.empty() && !m.pvc_namespace.empty() && m.pvc_namespace != options.namespace_) {
      return fail("InvalidSpec",
                  Status::InvalidArgument(
                      "spec.sourceMounts[" + Quoted(m.name) + "].persistentVolumeClaim.namespace " +
                      Quoted(m.pvc_namespace) + ": the cache nodes run in namespace " +
                      Quoted(options.namespace_) +
                      " and can mount only its claims; create the claim there"));
    }
  }
  Result<std::string> url = c.StoreUrl(pool);
  if (!url.ok()) return fail("StoreSecretMissing", url.status());

  const std::string name = PoolObjectName(pool);
  const std::string base = "/api/v1/namespaces/" + options.namespace_;
  Json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", Metadata(pool, *object, options, name + "-store")},
                 {"type", "Opaque"},
                 {"data", {{"url", Base64Encode(*url)}}}};
  GRANARY_RETURN_IF_ERROR(c.ApplyIfChanged(base + "/secrets/" + name + "-store", secret));
  const Json config_data = CacheNodeConfigMap(pool, options);
  Json config = {{"apiVersion", "v1"},
                 {"kind", "ConfigMap"},
                 {"metadata", Metadata(pool, *object, options, name)},
                 {"data", config_data}};
  GRANARY_RETURN_IF_ERROR(c.ApplyIfChanged(base + "/configmaps/" + name, config));
  Result<std::string> cluster_key = EnsureClusterKey(c);
  if (!cluster_key.ok()) return fail("ClusterKeyMissing", cluster_key.status());
  const std::string hashed = config_data.dump() + *url + *cluster_key;
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(hashed.data(), hashed.size())));
  Json daemonset = {{"apiVersion", "apps/v1"},
                    {"kind", "DaemonSet"},
                    {"metadata", Metadata(pool, *object, options, name)},
                    {"spec", CacheNodeDaemonSet(pool, options, hash)}};
  Result<Json> applied =
      c.client().Apply("/apis/apps/v1/namespaces/" + options.namespace_ + "/daemonsets/" + name,
                       daemonset, std::string(kFieldManager));
  if (!applied.ok()) {
    if (applied.status().code() == StatusCode::kInvalidArgument) {
      return fail("InvalidDaemonSet", applied.status());
    }
    return applied.status();
  }
  Json service = {
      {"apiVersion", "v1"},
      {"kind", "Service"},
      {"metadata", Metadata(pool, *object, options, name)},
      {"spec",
       {{"clusterIP", "None"},
        {"selector",
         {{"app.kubernetes.io/name", "granary-cachenode"}, {"granary.io/pool", pool.name}}},
        {"ports",
         Json::array(
             {{{"name", "data"}, {"port", pool.data_port}, {"targetPort", "data"}},
              {{"name", "metrics"}, {"port", pool.metrics_port}, {"targetPort", "metrics"}}})}}}};
  GRANARY_RETURN_IF_ERROR(c.ApplyIfChanged(base + "/services/" + name, service));

  // Status: the DaemonSet's counts, the store's node records and datasets.
  const Json& ds_status = applied->value("status", Json::object());
  const int64_t desired = ds_status.value("desiredNumberScheduled", 0);
  const int64_t ready = ds_status.value("numberReady", 0);
  status["nodesDesired"] = desired;
  status["nodesReady"] = ready;
  Result<MetadataStore*> store = c.StoreAt(*url, pool);  // the Secret was read above
  if (!store.ok()) {
    SetCondition(conditions, "StoreReachable", false, "StoreUnavailable", store.status().message(),
                 generation, now);
  } else {
    Result<std::vector<NodeRecord>> nodes = (*store)->ListNodes(pool.name);
    Result<std::vector<DatasetRecord>> datasets = (*store)->ListDatasets();
    if (nodes.ok() && datasets.ok()) {
      uint64_t capacity = 0, used = 0;
      for (const NodeRecord& n : *nodes) {
        capacity += n.capacity_bytes;
        used += n.used_bytes;
      }
      int64_t count = 0;
      for (const DatasetRecord& d : *datasets) count += d.spec.pool == pool.name ? 1 : 0;
      status["capacityBytes"] = capacity;
      status["usedBytes"] = used;
      status["capacity"] = QuantityString(capacity);
      status["used"] = QuantityString(used);
      status["datasets"] = count;
      SetCondition(conditions, "StoreReachable", true, "StoreReachable",
                   std::to_string(nodes->size()) + " cache nodes registered", generation, now);
    } else {
      const Status why = nodes.ok() ? datasets.status() : nodes.status();
      SetCondition(conditions, "StoreReachable", false, "StoreUnavailable", why.message(),
                   generation, now);
    }
  }
  // What the kubelet says of pods that do not run: the reason replaces
  // NodesNotReady, with an Event when it changes. A pod's trouble counts
  // before the DaemonSet's counts catch up with it.
  std::optional<CacheNodeTrouble> trouble = c.CacheNodeTroubleOf(pool);
  const bool all_ready = desired > 0 && ready == desired && !trouble;
  const std::string counts =
      std::to_string(ready) + " of " + std::to_string(desired) + " cache nodes ready";
  std::string was_reason, was_message;
  for (const Json& cond : conditions) {
    if (cond.value("type", "") != "Ready") continue;
    was_reason = cond.value("reason", "");
    was_message = cond.value("message", "");
  }
  if (!trouble) {
    SetCondition(conditions, "Ready", all_ready, all_ready ? "NodesReady" : "NodesNotReady", counts,
                 generation, now);
    if (IsCacheNodeTrouble(was_reason)) {
      c.Event(*object, "Normal", "CacheNodesRecovered",
              "the cache-node pods no longer report " + was_reason + " (" + counts + ")");
    }
  } else {
    // The counts are in status.nodesReady, kept out of the message: it then
    // changes only with what the kubelet says.
    if (trouble->reason != was_reason || trouble->message != was_message) {
      c.Event(*object, "Warning", trouble->reason, trouble->message);
    }
    SetCondition(conditions, "Ready", false, trouble->reason, trouble->message, generation, now);
  }
  status["conditions"] = conditions;
  status["observedGeneration"] = generation;
  if (status != object->value("status", Json::object())) {
    GRANARY_RETURN_IF_ERROR(c.client().MergePatch(status_path, {{"status", status}}).status());
  }
  // Datasets of this pool depend on it: look at them again.
  return all_ready ? options.ready_interval : options.progress_interval;
}

}  // namespace granary::kube

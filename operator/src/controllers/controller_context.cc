#include "controller_context.h"

#include <xxhash.h>

#include <algorithm>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/kube/base64.h"
#include "granary/store/open_store.h"

namespace granary::kube {

Result<Json> ControllerContext::Secret(const std::string& ns, const std::string& name) {
  if (secret_cache_) {
    if (std::optional<Result<Json>> cached = secret_cache_(ns, name)) return std::move(*cached);
  }
  return client_.Get("/api/v1/namespaces/" + ns + "/secrets/" + name);
}

Result<Json> ControllerContext::Namespace(const std::string& name) {
  if (namespaces_ != nullptr && namespaces_->synced()) {
    std::optional<Json> cached = namespaces_->Get(name);
    if (cached) return std::move(*cached);
    return Status::NotFound("namespace " + Quoted(name) + " not found");
  }
  return client_.Get("/api/v1/namespaces/" + name);
}

Result<std::string> ControllerContext::StoreUrl(const CachePool& pool) {
  const std::string ns =
      pool.store_secret_namespace.empty() ? options_.namespace_ : pool.store_secret_namespace;
  Result<Json> secret = Secret(ns, pool.store_secret_name);
  if (!secret.ok()) {
    return Status(secret.status().code(), "the metadata store Secret " + ns + "/" +
                                              pool.store_secret_name + " of CachePool " +
                                              Quoted(pool.name) + ": " + secret.status().message());
  }
  const Json& data = secret->value("data", Json::object());
  if (!data.contains(pool.store_secret_key) || !data[pool.store_secret_key].is_string()) {
    return Status::NotFound("the Secret " + ns + "/" + pool.store_secret_name + " has no key " +
                            Quoted(pool.store_secret_key) +
                            "; put the store URL (redis://...) under that key");
  }
  GRANARY_ASSIGN_OR_RETURN(std::string url,
                           Base64Decode(data[pool.store_secret_key].get<std::string>(),
                                        "key " + Quoted(pool.store_secret_key) + " of the Secret " +
                                            ns + "/" + pool.store_secret_name));
  while (!url.empty() && std::isspace(static_cast<unsigned char>(url.back())) != 0) url.pop_back();
  return url;
}

Result<MetadataStore*> ControllerContext::StoreFor(const CachePool& pool) {
  GRANARY_ASSIGN_OR_RETURN(std::string url, StoreUrl(pool));
  return StoreAt(url, pool);
}

Result<MetadataStore*> ControllerContext::StoreAt(const std::string& url, const CachePool& pool) {
  std::lock_guard lock(mu_);
  auto it = stores_.find(url);
  if (it != stores_.end()) return it->second.get();
  Result<std::unique_ptr<MetadataStore>> store = OpenMetadataStore(url);
  if (!store.ok()) {
    return store.status().WithContext("opening the metadata store of CachePool " +
                                      Quoted(pool.name));
  }
  MetadataStore* raw = store->get();
  stores_[url] = std::move(*store);
  return raw;
}

void ControllerContext::Event(const Json& object, const std::string& type,
                              const std::string& reason, const std::string& message) {
  const Json& meta = object.value("metadata", Json::object());
  const std::string uid = meta.value("uid", "");
  const std::string dedup = uid + "\n" + reason + "\n" + message;
  {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    auto it = events_.find(dedup);
    if (it != events_.end() && now - it->second < std::chrono::minutes(10)) return;
    events_[dedup] = now;
    if (events_.size() > 10000) events_.clear();
  }
  std::string ns = meta.value("namespace", "");
  if (ns.empty()) ns = "default";  // events of cluster-scoped objects
  const std::string now = NowRfc3339();
  Json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"generateName", meta.value("name", "granary") + "."}, {"namespace", ns}}},
      {"involvedObject",
       {{"apiVersion", object.value("apiVersion", "")},
        {"kind", object.value("kind", "")},
        {"name", meta.value("name", "")},
        {"namespace", meta.value("namespace", "")},
        {"uid", uid},
        {"resourceVersion", meta.value("resourceVersion", "")}}},
      {"reason", reason},
      {"message", message.size() > 1000 ? message.substr(0, 1000) : message},
      {"type", type},
      {"source", {{"component", "granary-operator"}}},
      {"reportingComponent", "granary-operator"},
      {"reportingInstance", options_.identity},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1}};
  Result<Json> created = client_.Create("/api/v1/namespaces/" + ns + "/events", event);
  if (!created.ok()) {
    GetLogger("operator")
        ->warn("recording event {} on {}: {}", reason, meta.value("name", ""),
               created.status().ToString());
  }
}

Json OwnerReference(const Json& owner) {
  const Json& meta = owner.value("metadata", Json::object());
  return {{"apiVersion", owner.value("apiVersion", "")},
          {"kind", owner.value("kind", "")},
          {"name", meta.value("name", "")},
          {"uid", meta.value("uid", "")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

Status ControllerContext::ApplyIfChanged(const std::string& path, const Json& body) {
  const std::string text = body.dump();
  const uint64_t hash = XXH3_64bits(text.data(), text.size());
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = applied_.find(path);
    if (it != applied_.end() && it->second.first == hash &&
        now - it->second.second < kReapplyEvery) {
      return Status::Ok();
    }
  }
  GRANARY_RETURN_IF_ERROR(client_.Apply(path, body, std::string(kFieldManager)).status());
  std::lock_guard<std::mutex> lock(mu_);
  applied_[path] = {hash, now};
  return Status::Ok();
}

Status ControllerContext::SetFinalizers(const std::string& path, const Json& object,
                                        const Json& finalizers) {
  const Json& meta = object["metadata"];
  // The resourceVersion makes the patch a compare-and-set on the list.
  Json patch = {
      {"metadata",
       {{"finalizers", finalizers}, {"resourceVersion", meta.value("resourceVersion", "")}}}};
  return client().MergePatch(path, patch).status();
}

std::optional<CacheNodeTrouble> ControllerContext::CacheNodeTroubleOf(const CachePool& pool) {
  std::vector<Json> pods;
  if (pods_ != nullptr && pods_->synced()) {
    pods_->Visit([&](const Json& pod) {
      const Json& meta = pod["metadata"];
      if (meta.value("labels", Json::object()).value("granary.io/pool", "") == pool.name) {
        pods.push_back(pod);
      }
    });
  }
  // The kubelet says why it cannot mount a volume only in Events on the pod.
  std::map<std::string, std::vector<std::string>> failed_mounts;
  int asked = 0;
  for (const Json& pod : pods) {
    if (!CreatingContainers(pod) || ++asked > 3) continue;
    const Json& meta = pod["metadata"];
    const std::string ns = meta.value("namespace", "");
    const std::string name = meta.value("name", "");
    Result<Json> events = client_.Get(
        "/api/v1/namespaces/" + ns + "/events?fieldSelector=" +
        UrlEncode("involvedObject.kind=Pod,involvedObject.name=" + name + ",reason=FailedMount"));
    if (!events.ok()) continue;  // without the right to list Events: the counts only
    std::vector<std::pair<std::string, std::string>> said;  // (when, message)
    for (const Json& e : events->value("items", Json::array())) {
      if (e.value("involvedObject", Json::object()).value("uid", "") != meta.value("uid", "")) {
        continue;  // a pod of the same name before this one
      }
      std::string when =
          e.value("lastTimestamp", Json()).is_string() ? e["lastTimestamp"].get<std::string>()
          : e.value("eventTime", Json()).is_string()   ? e["eventTime"].get<std::string>()
                                                     : e["metadata"].value("creationTimestamp", "");
      said.emplace_back(when, e.value("message", ""));
    }
    std::sort(said.begin(), said.end());
    for (auto& [when, message] : said) failed_mounts[ns + "/" + name].push_back(message);
  }
  std::optional<CacheNodeTrouble> trouble =
      DiagnoseCacheNodePods(pool, pods, failed_mounts, std::chrono::system_clock::now());
  std::lock_guard lock(mu_);
  if (trouble) {
    troubles_[pool.name] = *trouble;
  } else {
    troubles_.erase(pool.name);
  }
  return trouble;
}

std::optional<CacheNodeTrouble> ControllerContext::LastCacheNodeTrouble(const std::string& pool) {
  std::lock_guard lock(mu_);
  auto it = troubles_.find(pool);
  if (it == troubles_.end()) return std::nullopt;
  return it->second;
}

}  // namespace granary::kube

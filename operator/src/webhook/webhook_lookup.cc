#include "granary/operator/webhook_lookup.h"

#include <string>

#include "granary/operator/resources.h"

namespace granary::kube {

std::string SidecarStoreSecretName(const std::string& pool) { return "granary-store-" + pool; }

namespace {

// `cached` if it holds the object, else a GET of `path`.
Result<Json> CachedOrGet(KubeClient& client,
                         const std::function<std::optional<Json>(const std::string&)>& cached,
                         const std::string& key, const std::string& path) {
  if (cached) {
    if (std::optional<Json> object = cached(key)) return std::move(*object);
  }
  return client.Get(path);
}

}  // namespace

InjectionLookup ApiInjectionLookup(KubeClient& client) {
  return CachedInjectionLookup(client, InjectionCache{});
}

InjectionLookup CachedInjectionLookup(KubeClient& client, InjectionCache cache) {
  return [&client, cache = std::move(cache)](const std::string& ns,
                                             const std::string& name) -> Result<InjectionInputs> {
    const std::string what = "Dataset " + ns + "/" + name;
    const std::string base = "/apis/" + std::string(kGroup) + "/" + std::string(kVersion);
    Result<Json> dataset_object = CachedOrGet(client, cache.dataset, ns + "/" + name,
                                              base + "/namespaces/" + ns + "/datasets/" + name);
    if (!dataset_object.ok()) {
      if (dataset_object.status().code() == StatusCode::kNotFound) {
        return Status::NotFound(what +
                                " does not exist; create it, or fix the pod's granary.io/dataset "
                                "label (it names a Dataset in the pod's own namespace)");
      }
      return Status(dataset_object.status().code(),
                    "reading " + what + ": " + dataset_object.status().message());
    }
    Result<Dataset> dataset = ParseDataset(*dataset_object);
    if (!dataset.ok()) {
      return Status::InvalidArgument(what + " is invalid: " + dataset.status().message());
    }
    if (dataset->deleting) {
      return Status::FailedPrecondition(what + " is being deleted; use another Dataset");
    }
    const std::string pool_what = "CachePool " + dataset->pool + " (of " + what + ")";
    Result<Json> pool_object =
        CachedOrGet(client, cache.pool, dataset->pool, base + "/cachepools/" + dataset->pool);
    if (!pool_object.ok()) {
      if (pool_object.status().code() == StatusCode::kNotFound) {
        return Status::NotFound(pool_what + " does not exist; ask an admin to create it");
      }
      return Status(pool_object.status().code(),
                    "reading " + pool_what + ": " + pool_object.status().message());
    }
    Result<CachePool> pool = ParseCachePool(*pool_object);
    if (!pool.ok()) {
      return Status::InvalidArgument(pool_what + " is invalid: " + pool.status().message());
    }
    GRANARY_ASSIGN_OR_RETURN(SidecarWindow window,
                             ResolveSidecarWindow(*pool_object, *dataset_object));
    InjectionInputs inputs;
    SetDatasetInputs(*dataset, &inputs);  // namespace and name as read: ns and name
    inputs.pool = *pool;
    inputs.window = window;
    inputs.store_secret_name = SidecarStoreSecretName(pool->name);
    return inputs;
  };
}

}  // namespace granary::kube

#pragma once

// The webhook's lookup: for a pod labelled granary.io/dataset=<name> in
// namespace <ns>, reads Dataset <ns>/<name> and its CachePool and returns
// what BuildInjectionPatch needs. Used by granary-operator's WebhookServer
// (--webhook-listen). docs/kubernetes-webhook.md.
//
// Thread safety: the returned function may be called from any thread
// (KubeClient is thread-safe; the cache's functions must be too).

#include <functional>
#include <optional>
#include <string>

#include "granary/kube/kube_client.h"
#include "granary/operator/webhook_server.h"

namespace granary::kube {

// The Secret, in the pod's namespace, holding the store URL (key "url") the
// injected sidecar reads (mounted as a file, metadata_store_file): the
// operator keeps one copy of pool <pool>'s store Secret, named
// "granary-store-<pool>", in every namespace that has a Dataset of that pool.
std::string SidecarStoreSecretName(const std::string& pool);

// Refusals (the message reaches the user through kubectl):
//  - kNotFound: the Dataset, or its CachePool, does not exist;
//  - kFailedPrecondition: the Dataset is being deleted;
//  - kInvalidArgument: the Dataset or CachePool cannot be read;
//  - other codes: the API server could not be asked.
// `client` must outlive the returned function.
//
// Where the objects are read: the operator's informers first (`cache`), so
// that an admission request costs no request to the API server; the API
// server when the cache does not have the object (not listed yet, or created
// a moment ago: a pod applied with its Dataset must not be refused for it).
struct InjectionCache {
  std::function<std::optional<Json>(const std::string& key)> dataset;  // "ns/name"
  std::function<std::optional<Json>(const std::string& name)> pool;
};
InjectionLookup CachedInjectionLookup(KubeClient& client, InjectionCache cache);
// The API server only (two GETs per call).
InjectionLookup ApiInjectionLookup(KubeClient& client);

}  // namespace granary::kube

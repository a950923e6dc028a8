#pragma once

// The webhook's lookup through the API server: for a pod labelled
// granary.io/dataset=<name> in namespace <ns>, reads Dataset <ns>/<name> and
// its CachePool and returns what BuildInjectionPatch needs. Used by
// granary-operator's WebhookServer (--webhook-listen). docs/kubernetes-webhook.md.
//
// Thread safety: the returned function may be called from any thread
// (KubeClient is thread-safe). Each call makes two GETs to the API server.

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
InjectionLookup ApiInjectionLookup(KubeClient& client);

}  // namespace granary::kube

#pragma once

// The sidecar-injecting mutation of Granary's mutating admission webhook, as
// pure functions: parse an AdmissionReview v1 body, decide whether the pod is
// Granary's to mutate, build the RFC 6902 JSONPatch that injects the sidecar,
// and write the AdmissionReview response. No I/O: the HTTPS endpoint (not in
// this file) looks the Dataset and CachePool up and calls these.
// docs/kubernetes-webhook.md.
//
// Thread safety: plain values and pure functions.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/status.h"
#include "granary/kube/kube_client.h"
#include "granary/operator/resources.h"

namespace granary::kube {

inline constexpr std::string_view kDatasetLabel = "granary.io/dataset";
// Set on an injected pod; holds the sidecar's YAML configuration, which the
// sidecar reads through a downwardAPI volume.
inline constexpr std::string_view kSidecarConfigAnnotation = "granary.io/sidecar-config";
inline constexpr std::string_view kSidecarContainerName = "granary-sidecar";
inline constexpr std::string_view kSocketVolumeName = "granary-socket";
inline constexpr std::string_view kConfigVolumeName = "granary-sidecar-config";
inline constexpr std::string_view kSocketDir = "/run/granary";
inline constexpr std::string_view kSocketPath = "/run/granary/sidecar.sock";
inline constexpr std::string_view kSidecarConfigDir = "/etc/granary/sidecar";
// The store URL, from the Secret SidecarStoreSecretName(pool) in the pod's
// namespace, mounted in the sidecar only (metadata_store_file).
inline constexpr std::string_view kStoreVolumeName = "granary-store";
inline constexpr std::string_view kStoreDir = "/etc/granary/store";
// The sidecar's projected ServiceAccount token (audience granary), which it
// proves to the cache nodes (peer_token_file); the kubelet rotates it.
inline constexpr std::string_view kTokenVolumeName = "granary-token";
inline constexpr std::string_view kTokenDir = "/var/run/secrets/granary";
inline constexpr std::string_view kTokenAudience = "granary";
inline constexpr int64_t kTokenExpirationSeconds = 3600;
// The host directory of the cache node's chunk-handoff socket (the pool's
// nodeSocketHostPath), mounted read-only in the sidecar at kNodeSocketDir
// (resources.h).
inline constexpr std::string_view kNodeSocketVolumeName = "granary-node-socket";
// Asks for the POSIX view of the dataset at this absolute path in the app
// containers (needs the pool's spec.sidecar.allowPosixView).
inline constexpr std::string_view kMountPathAnnotation = "granary.io/mount-path";
inline constexpr std::string_view kViewVolumeName = "granary-view";
inline constexpr std::string_view kViewDir = "/run/granary-view";
// "true": admit the pod only once its Dataset is Ready (staged whole);
// otherwise a Dataset with a snapshot (Staging or Ready) is enough.
inline constexpr std::string_view kRequireStagedAnnotation = "granary.io/require-staged";
// More Datasets for one pod: a comma-separated list of Dataset names of the
// pod's namespace, served by the same sidecar (the label names the first, and
// is what selects the pod). GRANARY_DATASETS lists them all.
inline constexpr std::string_view kDatasetsAnnotation = "granary.io/datasets";
inline constexpr size_t kMaxDatasetsPerPod = 16;
// A Dataset placed on at most this many nodes gets one preferred-affinity term
// per node (metadata.name); more, one term on kubernetes.io/hostname.
inline constexpr size_t kMaxPreferredNodeTerms = 32;

// Bodies larger than this are refused before parsing (the API server's own
// object limit is 1.5 MiB; a review carries the object once, plus oldObject).
inline constexpr size_t kMaxReviewBytes = 4u << 20;
// Deeper JSON nesting than this is refused before parsing.
inline constexpr int kMaxReviewDepth = 64;

// What the webhook needs of an AdmissionReview's request.
struct AdmissionRequest {
  std::string uid;
  std::string operation;   // CREATE, UPDATE, DELETE, CONNECT
  std::string namespace_;  // request.namespace (the pod's)
  Json pod;                // request.object (null for DELETE/CONNECT)
};

// Parses an AdmissionReview v1 body. kInvalidArgument says what is wrong
// (not JSON, too large or deep, wrong apiVersion/kind, missing
// request/uid/operation, an object that is not a Pod for CREATE/UPDATE).
// Never throws.
Result<AdmissionRequest> ParseAdmissionReview(std::string_view body);

// Whether a request is Granary's to mutate. kSkip: allow unchanged.
struct InjectionDecision {
  enum class Kind { kSkip, kInject };
  Kind kind = Kind::kSkip;
  std::string dataset;  // the label's value, for kInject
  std::string reason;   // why skipped (for logs)
};
InjectionDecision Decide(const AdmissionRequest& request, const std::string& operator_namespace);

// Whether the pod already carries the injected sidecar.
bool AlreadyInjected(const Json& pod);

// The prefetch window the sidecar gets: the Dataset's spec.prefetch, else the
// pool's spec.sidecar, else the sidecar's own defaults (unset fields).
struct SidecarWindow {
  std::optional<uint64_t> window_bytes;
  std::optional<uint64_t> window_samples;
  std::optional<uint64_t> arena_bytes;
};
// `pool_object` and `dataset_object` are the resources as the API server
// returns them. kInvalidArgument names a bad field.
Result<SidecarWindow> ResolveSidecarWindow(const Json& pool_object, const Json& dataset_object);

// A Dataset a pod names beyond its label's (annotation granary.io/datasets).
struct ExtraDataset {
  std::string name;  // Kubernetes name, in the pod's namespace
  std::vector<std::string> nodes;
  std::string phase;
};

struct InjectionInputs {
  std::string dataset_namespace;
  std::string dataset_name;  // the Kubernetes name (the label's value)
  CachePool pool;
  SidecarWindow window;
  // The Secret, in the pod's namespace, whose key holds the store URL.
  std::string store_secret_name;
  std::string store_secret_key = "url";
  // The Dataset's spec.runAs: the sidecar runs as this uid and gid, the
  // dataset's owner in the store, whom the cache node's chunk handoff
  // accepts; the pod gets the gid as a supplemental group so its containers
  // may connect to the sidecar's socket (mode 0660).
  uint32_t run_as_uid = 0;
  uint32_t run_as_gid = 0;
  // The Dataset's spec.nodes (placed on some nodes only): preferred affinity.
  std::vector<std::string> preferred_nodes;
  // The Dataset's status.phase: Staging or Ready have a snapshot to serve.
  std::string dataset_phase;
  // Further Datasets of the pod (AddDataset), the sidecar serves them too.
  std::vector<ExtraDataset> extra;
};

// The Datasets a selected pod names: the label's value, then those of the
// annotation granary.io/datasets not already named, in order. kInvalidArgument
// for a name that is not a DNS-1123 label or more than kMaxDatasetsPerPod.
Result<std::vector<std::string>> NamedDatasets(const Json& pod, const std::string& label_value);

// Adds `other` (the lookup of a further Dataset of the same pod) to `inputs`:
// kFailedPrecondition, saying why, unless it is in the same CachePool and read
// as the same uid and gid (one sidecar, one identity).
Status AddDataset(const InjectionInputs& other, InjectionInputs* inputs);

// Copies what a Dataset gives the injection into `inputs`.
void SetDatasetInputs(const Dataset& dataset, InjectionInputs* inputs);

// The sidecar's configuration file (YAML), without the store URL and the
// node name: the URL is a mounted file, the node comes on the command line.
// `view_dir`: where the sidecar mounts the POSIX view ("" for none).
std::string SidecarConfigYaml(const InjectionInputs& inputs, const std::string& view_dir = "");

// The JSONPatch (an array of RFC 6902 operations) that injects the sidecar
// into `pod`; an empty array when the pod is already injected. Only "add"
// operations: nothing the user wrote is replaced or removed.
// kInvalidArgument for a pod whose spec is not the shape the API server
// would store (e.g. containers not an array).
Result<Json> BuildInjectionPatch(const Json& pod, const InjectionInputs& inputs);

// RFC 6901 escaping of one path segment: "~" -> "~0", "/" -> "~1".
std::string EscapeJsonPointer(std::string_view segment);

// AdmissionReview v1 responses (the whole body to send back).
std::string AllowResponse(const std::string& uid);
std::string PatchResponse(const std::string& uid, const Json& patch);
std::string DenyResponse(const std::string& uid, int code, const std::string& message);

}  // namespace granary::kube

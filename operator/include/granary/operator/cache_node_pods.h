#pragma once

// Why a CachePool's cache-node pods do not run, read from what the kubelet
// writes: each pod's container status (an image it cannot pull, a container
// that exits, a container it cannot create) and, for a pod still creating
// its containers, the pod's FailedMount Events (a hostPath that is not
// there, a claim that cannot be mounted). The CachePool reconciler reports
// the answer as the pool's Ready condition; the Dataset reconciler reports
// a failed source mount on the Datasets under it. docs/kubernetes.md,
// "Conditions".
//
// Thread safety: plain values and pure functions.

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "granary/kube/kube_client.h"
#include "granary/operator/resources.h"

namespace granary::kube {

// The pool's Ready reasons for cache-node pods that do not run.
inline constexpr std::string_view kImagePullFailed = "ImagePullFailed";
inline constexpr std::string_view kCacheNodeCrashing = "CacheNodeCrashing";
inline constexpr std::string_view kCacheNodeNotCreated = "CacheNodeNotCreated";
inline constexpr std::string_view kVolumeMountFailed = "VolumeMountFailed";
// Of a pool and of the Datasets under the mount: a source mount failed.
inline constexpr std::string_view kSourceMountFailed = "SourceMountFailed";
// Of a Pending Dataset whose pool has no cache node running, with a trouble.
inline constexpr std::string_view kCacheNodesNotRunning = "CacheNodesNotRunning";

struct CacheNodeTrouble {
  std::string reason;   // one of the reasons above
  std::string message;  // what failed, where, what the kubelet said, what to do
  std::string pod;      // "namespace/name" of the pod the message is about
  std::string node;
  // kSourceMountFailed: the name of the pool's spec.sourceMounts entry.
  std::string source_mount;
  int pods_failing = 0;  // pods of the pool with a trouble (this one included)
};

// The cache-node container's termination message as the status shows it
// (the node's last words on stderr, with terminationMessagePolicy
// FallbackToLogsOnError): its last non-empty line, at most 600 bytes.
std::string LastLine(const std::string& text);

// The trouble of the pool's cache-node pods (`pods`: the pods' JSON, any
// order; `failed_mounts`: by pod "namespace/name", the messages of its
// Warning Events with reason FailedMount, newest last), or nullopt when no
// pod has one (pods that run, or are merely starting, have none). With
// several failing pods, the first by name is described and the others
// counted. Pods being deleted are left out.
// A container that started again after exiting with an error and is not
// ready yet counts as crashing for kCrashRecentFor after its start (the
// kubelet's longest back-off): the reason then holds while it loops, and an
// old exit does not hang on a node that runs but is not ready for another
// cause. `now` is the wall clock (pods' times are RFC 3339).
inline constexpr std::chrono::minutes kCrashRecentFor{5};
std::optional<CacheNodeTrouble> DiagnoseCacheNodePods(
    const CachePool& pool, const std::vector<Json>& pods,
    const std::map<std::string, std::vector<std::string>>& failed_mounts,
    std::chrono::system_clock::time_point now);

// Whether `pod` is creating its containers (scheduled, not running, no
// container status that says more): its FailedMount Events may say why.
bool CreatingContainers(const Json& pod);

}  // namespace granary::kube

// Why a pool's cache-node pods do not run, from what the kubelet wrote.

#include "granary/operator/cache_node_pods.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "granary/core/names.h"

namespace granary::kube {
namespace {

const Json& Field(const Json& object, const char* key) {
  static const Json kEmpty = Json::object();
  if (!object.is_object()) return kEmpty;
  auto it = object.find(key);
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

// Whether `object` has `key` as an object ({"running": {}} is running).
bool Has(const Json& object, const char* key) {
  if (!object.is_object()) return false;
  auto it = object.find(key);
  return it != object.end() && it->is_object();
}

std::string Text(const Json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

bool OneOf(const std::string& s, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

// "2026-12-02T14:47:22Z" (what the kubelet writes; fractions and offsets
// other than Z are not used for these times), or nullopt.
std::optional<std::chrono::system_clock::time_point> ParseTime(const std::string& text) {
  std::tm tm{};
  char zone = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &zone) != 7 ||
      zone != 'Z') {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

// The error in an ImagePullBackOff message, which newer kubelets append to
// "Back-off pulling image ...: ErrImagePull: <error>", so that the condition
// does not change each time the kubelet goes from pulling to backing off.
std::string PullError(const std::string& reason, const std::string& message) {
  if (reason != "ImagePullBackOff") return message;
  const std::string marker = "ErrImagePull: ";
  const size_t at = message.find(marker);
  if (at != std::string::npos) return message.substr(at + marker.size());
  return "the kubelet backs off pulling it after failed pulls";
}

// What pool's volume `volume` (a name in the DaemonSet the operator writes)
// is, for a message; `mount` is set to the source mount's name.
std::string VolumeOf(const CachePool& pool, const std::string& volume, std::string* mount) {
  for (const SourceMount& m : pool.source_mounts) {
    if (volume != "source-" + m.name) continue;
    *mount = m.name;
    const std::string from = !m.host_path.empty() ? "hostPath " + m.host_path
                                                  : "persistentVolumeClaim " + Quoted(m.pvc_claim);
    return "spec.sourceMounts[" + Quoted(m.name) + "] (" + from + " at " + m.mount_path + ")";
  }
  if (volume == "data") return "spec.storage.hostPath " + pool.storage_host_path;
  if (volume == "node-socket") return "spec.nodeSocketHostPath " + pool.node_socket_host_path;
  return "volume " + Quoted(volume);
}

struct PodTrouble {
  std::string reason;
  std::string message;
  std::string source_mount;
};

std::optional<PodTrouble> TroubleOf(const CachePool& pool, const Json& pod,
                                    const std::vector<std::string>* mounts_failed,
                                    std::chrono::system_clock::time_point now) {
  const Json& meta = Field(pod, "metadata");
  const Json& status = Field(pod, "status");
  const std::string where = "cache node pod " + Text(meta, "namespace") + "/" + Text(meta, "name") +
                            " on node " + Text(Field(pod, "spec"), "nodeName");
  const Json statuses = status.value("containerStatuses", Json::array());
  for (const Json& cs : statuses.is_array() ? statuses : Json::array()) {
    const Json& state = Field(cs, "state");
    const Json& waiting = Field(state, "waiting");
    const std::string reason = Text(waiting, "reason");
    const std::string message = Text(waiting, "message");
    const std::string image = !Text(cs, "image").empty() ? Text(cs, "image") : pool.image;
    if (OneOf(reason, {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                       "RegistryUnavailable", "SignatureValidationFailed"})) {
      std::string what =
          where + " cannot pull image " + Quoted(image) + ": " + PullError(reason, message) + "; ";
      if (reason == "ErrImageNeverPull" || pool.image_pull_policy == "Never") {
        what +=
            "spec.imagePullPolicy is Never, so load the image into the node's container "
            "runtime, ";
      } else {
        what +=
            "push the image to a registry the node pulls from (with spec.imagePullPolicy "
            "IfNotPresent a node may also have it loaded into its container runtime), ";
      }
      return PodTrouble{std::string(kImagePullFailed), what + "or fix the CachePool's spec.image",
                        ""};
    }
    const Json& terminated = Has(state, "terminated") ? Field(state, "terminated")
                                                      : Field(Field(cs, "lastState"), "terminated");
    const int64_t code = terminated.value("exitCode", int64_t{0});
    // Started again after exiting, and not ready yet: still the crash the
    // kubelet reported a moment ago (the condition holds while it loops).
    std::optional<std::chrono::system_clock::time_point> started =
        ParseTime(Text(Field(state, "running"), "startedAt"));
    const bool restarting = Has(state, "running") && !cs.value("ready", false) &&
                            Has(Field(cs, "lastState"), "terminated") && code != 0 && started &&
                            now - *started < kCrashRecentFor;
    if (reason == "CrashLoopBackOff" || (Has(state, "terminated") && code != 0) || restarting) {
      std::string what = where + " exits";
      if (!terminated.empty()) {
        what += " with exit code " + std::to_string(code);
        if (!Text(terminated, "reason").empty()) what += " (" + Text(terminated, "reason") + ")";
      }
      const std::string last = LastLine(Text(terminated, "message"));
      if (Text(terminated, "reason") == "OOMKilled") {
        what +=
            ": it ran out of its memory limit; raise the CachePool's "
            "spec.resources.limits.memory or lower spec.storage.capacity";
      } else if (!last.empty()) {
        what += ": " + last +
                "; fix what it names (the CachePool's spec, a path on the node, "
                "the store), and the kubelet restarts it";
      } else {
        what += " and left no message; `kubectl logs -n " + Text(meta, "namespace") + " " +
                Text(meta, "name") + " --previous` shows its log";
      }
      return PodTrouble{std::string(kCacheNodeCrashing), what, ""};
    }
    if (OneOf(reason, {"CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                       "PreCreateHookError", "PostStartHookError"})) {
      return PodTrouble{std::string(kCacheNodeNotCreated),
                        "the kubelet cannot start the container of " + where + " (" + reason +
                            (message.empty() ? "" : ": " + message) +
                            "); fix what it names (the CachePool's spec, a Secret or ConfigMap "
                            "the pod mounts, the node)",
                        ""};
    }
  }
  if (mounts_failed != nullptr && !mounts_failed->empty() && CreatingContainers(pod)) {
    const std::string& said = mounts_failed->back();
    std::string volume;
    const std::string marker = "volume \"";
    if (size_t at = said.find(marker); at != std::string::npos) {
      const size_t from = at + marker.size();
      volume = said.substr(from, said.find('"', from) - from);
    }
    PodTrouble t;
    const std::string what = VolumeOf(pool, volume, &t.source_mount);
    t.reason = std::string(t.source_mount.empty() ? kVolumeMountFailed : kSourceMountFailed);
    t.message = where + " cannot mount " + what + ": " + said + "; ";
    if (t.source_mount.empty()) {
      t.message += "make that path usable on the node or fix the CachePool's spec";
    } else {
      t.message +=
          "make it exist on the node (the shared file system mounted there, or the claim "
          "bound), or fix the CachePool's spec.sourceMounts";
    }
    return t;
  }
  return std::nullopt;
}

}  // namespace

std::string LastLine(const std::string& text) {
  size_t end = text.size();
  while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r' || text[end - 1] == ' ')) {
    --end;
  }
  const size_t start = text.rfind('\n', end == 0 ? 0 : end - 1);
  std::string line = text.substr(start == std::string::npos ? 0 : start + 1,
                                 end - (start == std::string::npos ? 0 : start + 1));
  if (line.size() > 600) line = line.substr(0, 597) + "...";
  return line;
}

bool CreatingContainers(const Json& pod) {
  const Json& status = Field(pod, "status");
  if (Text(Field(pod, "spec"), "nodeName").empty()) return false;
  const std::string phase = Text(status, "phase");
  if (!phase.empty() && phase != "Pending") return false;
  const Json statuses = status.value("containerStatuses", Json::array());
  for (const Json& cs : statuses.is_array() ? statuses : Json::array()) {
    const Json& state = Field(cs, "state");
    if (Has(state, "running") || Has(state, "terminated")) return false;
    const std::string reason = Text(Field(state, "waiting"), "reason");
    if (!reason.empty() && reason != "ContainerCreating") return false;
  }
  return true;
}

std::optional<CacheNodeTrouble> DiagnoseCacheNodePods(
    const CachePool& pool, const std::vector<Json>& pods,
    const std::map<std::string, std::vector<std::string>>& failed_mounts,
    std::chrono::system_clock::time_point now) {
  std::vector<const Json*> sorted;
  for (const Json& pod : pods) {
    if (!Field(pod, "metadata").contains("deletionTimestamp")) sorted.push_back(&pod);
  }
  std::sort(sorted.begin(), sorted.end(), [](const Json* a, const Json* b) {
    return Text(Field(*a, "metadata"), "name") < Text(Field(*b, "metadata"), "name");
  });
  std::optional<CacheNodeTrouble> first;
  int failing = 0;
  for (const Json* pod : sorted) {
    const Json& meta = Field(*pod, "metadata");
    const std::string key = Text(meta, "namespace") + "/" + Text(meta, "name");
    auto mounts = failed_mounts.find(key);
    std::optional<PodTrouble> t =
        TroubleOf(pool, *pod, mounts == failed_mounts.end() ? nullptr : &mounts->second, now);
    if (!t) continue;
    ++failing;
    if (first) continue;
    first = CacheNodeTrouble{
        t->reason, t->message, key, Text(Field(*pod, "spec"), "nodeName"), t->source_mount, 0};
  }
  if (!first) return std::nullopt;
  first->pods_failing = failing;
  if (failing > 1) {
    first->message += " (and " + std::to_string(failing - 1) + " more of the pool's " +
                      std::to_string(sorted.size()) + " cache-node pods do not run)";
  }
  return first;
}

}  // namespace granary::kube

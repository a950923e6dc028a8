#include "testing/pod_runner.h"

#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>

#include "granary/core/file.h"
#include "granary/kube/base64.h"
#include "testing/daemon_process.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using std::chrono::system_clock;

constexpr const char* kUnshare = "/usr/bin/unshare";
constexpr const char* kSetpriv = "/usr/bin/setpriv";
constexpr const char* kEnv = "/usr/bin/env";
constexpr milliseconds kSetUpRetry{1000};
constexpr milliseconds kBackoffReset{10000};
constexpr size_t kMaxEvents = 4000;

// Run by /bin/sh inside the container's new mount namespace (unshare has
// made / rprivate): bind-mounts each "kind src dst ro|rw" quadruple up to
// "--", then changes to the working directory and execs the rest. Mount
// points nested in another volume are created here, inside that volume.
constexpr const char* kMountScript = R"sh(set -e
while [ "$1" != "--" ]; do
  kind=$1; src=$2; dst=$3; ro=$4; shift 4
  if [ ! -e "$dst" ]; then
    if [ "$kind" = d ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; : > "$dst"; fi
  fi
  mount --bind "$src" "$dst"
  if [ "$ro" = ro ]; then mount -o remount,bind,ro "$dst"; fi
done
shift
cd "$1"
shift
exec "$@"
)sh";

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// "registry/x/granary-cachenode:1.0@sha256:..." -> "granary-cachenode".
std::string ImageBaseName(const std::string& image) {
  std::string name = image.substr(0, image.find('@'));
  name = BaseName(name);
  return name.substr(0, name.find(':'));
}

// Kubernetes' $(VAR) expansion: defined references are replaced, $$ is a
// literal $, anything else stays as written.
std::string Expand(const std::string& in, const std::map<std::string, std::string>& vars) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '$' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    if (in[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (in[i + 1] == '(') {
      const size_t close = in.find(')', i + 2);
      if (close != std::string::npos) {
        const std::string name = in.substr(i + 2, close - i - 2);
        auto it = vars.find(name);
        out += it != vars.end() ? it->second : "$(" + name + ")";
        i = close;
        continue;
      }
    }
    out += in[i];
  }
  return out;
}

std::string Quote(const std::string& s) { return json(s).dump(); }

// "2026-11-25T16:22:24Z", as the API server writes times.
std::string Rfc3339(system_clock::time_point t) {
  const std::time_t secs = system_clock::to_time_t(t);
  std::tm utc{};
  ::gmtime_r(&secs, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

Status MakeDirs(const std::string& path, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::IoError("create directory " + path + ": " + ec.message());
  if (::chmod(path.c_str(), mode) != 0) return Status::FromErrno(errno, "chmod " + path);
  return Status::Ok();
}

// Writes one file of a ConfigMap/Secret/downwardAPI/token volume.
Status WriteVolumeFile(const std::string& dir, const std::string& rel, const std::string& data,
                       int mode) {
  if (rel.empty() || rel.starts_with("/") || rel.find("..") != std::string::npos) {
    return Status::InvalidArgument("volume file path '" + rel + "' is not a relative path");
  }
  const std::string path = dir + "/" + rel;
  const size_t slash = path.rfind('/');
  GRANARY_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash), 0755));
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(path, data, static_cast<mode_t>(mode)));
  if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0) {
    return Status::FromErrno(errno, "chmod " + path);
  }
  return Status::Ok();
}

// key -> bytes of a ConfigMap (data and binaryData) or Secret (data, base64).
Result<std::map<std::string, std::string>> ObjectData(const json& object, bool secret) {
  std::map<std::string, std::string> out;
  for (const char* field : {"data", "binaryData", "stringData"}) {
    if (!object.contains(field) || !object[field].is_object()) continue;
    const bool encoded = secret ? std::string(field) == "data" : std::string(field) == "binaryData";
    for (const auto& [k, v] : object[field].items()) {
      if (!v.is_string()) continue;
      if (!encoded) {
        out[k] = v.get<std::string>();
        continue;
      }
      Result<std::string> bytes = kube::Base64Decode(v.get<std::string>(), "key " + k);
      if (!bytes.ok()) return Status::Corruption(bytes.status().message());
      out[k] = std::move(*bytes);
    }
  }
  return out;
}

// A container's startupProbe, tried once as the kubelet would on this host
// (every pod's network is the host's here): httpGet on 127.0.0.1 (the port a
// number or the name of one of the container's ports) passes on a 2xx or 3xx
// status; no probe passes at once; other probe kinds (exec, tcpSocket, grpc)
// are not run and pass.
bool StartupProbePasses(const json& container) {
  const json probe = container.value("startupProbe", json::object());
  if (!probe.is_object() || !probe.contains("httpGet")) return true;
  const json get = probe["httpGet"];
  int port = 0;
  if (get.contains("port") && get["port"].is_number_integer()) {
    port = get["port"].get<int>();
  } else if (get.contains("port") && get["port"].is_string()) {
    for (const json& p : container.value("ports", json::array())) {
      if (p.value("name", "") == get["port"].get<std::string>()) port = p.value("containerPort", 0);
    }
  }
  if (port <= 0 || port > 65535) return false;
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(0, 300000);
  client.set_read_timeout(1, 0);
  httplib::Result r = client.Get(get.value("path", "/"));
  return r && r->status >= 200 && r->status < 400;
}

}  // namespace

struct PodRunner::ContainerState {
  std::string name;
  std::string image;
  std::string image_dir;  // empty: not a Granary image (left to kwok)
  bool init = false;
  bool sidecar = false;  // an init container with restartPolicy: Always
  json spec;
  std::unique_ptr<DaemonProcess> process;
  std::string log_path;
  int restarts = 0;
  bool ever_started = false;
  bool completed = false;  // ran to a successful exit and is not to run again
  // A native sidecar's startupProbe has passed for its current process (the
  // containers after it start only then, as the kubelet does).
  bool startup_passed = false;
  bool startup_wait_logged = false;
  bool given_up = false;  // failed and the restart policy says not again
  milliseconds backoff{0};
  steady_clock::time_point next_start{};
  steady_clock::time_point started_at{};
  // How its last process ended, and when it ran (for the pod's status).
  std::optional<ExitStatus> last_exit;
  system_clock::time_point started_wall{};
  system_clock::time_point finished_wall{};
};

struct PodRunner::PodState {
  std::string uid;
  std::string ns;
  std::string name;
  std::string node;
  json pod;
  std::string restart_policy;
  milliseconds grace{0};
  std::string dir;
  bool set_up = false;
  bool failed = false;               // not to be run (any more)
  bool completion_reported = false;  // its terminal status is written (report_completion)
  steady_clock::time_point next_setup{};
  std::map<std::string, std::string> volume_paths;  // volume name -> its directory or host path
  std::vector<ContainerState> containers;           // init containers first, in order
  std::vector<std::string> created_paths;           // mount points this pod holds a reference on
  std::set<std::string> problems;                   // each logged once
};

namespace {

Result<std::string> FieldValue(const json& pod, const std::string& path) {
  const json& meta = pod["metadata"];
  auto label_like = [&](const char* field, const std::string& prefix) -> Result<std::string> {
    const std::string key = path.substr(prefix.size(), path.size() - prefix.size() - 2);
    if (meta.contains(field) && meta[field].contains(key)) {
      return meta[field][key].get<std::string>();
    }
    return std::string();
  };
  auto all = [&](const char* field) {
    std::string out;
    if (meta.contains(field)) {
      for (const auto& [k, v] : meta[field].items()) {
        out += k + "=" + Quote(v.get<std::string>()) + "\n";
      }
    }
    return out;
  };
  if (path == "metadata.name") return meta.value("name", "");
  if (path == "metadata.namespace") return meta.value("namespace", "");
  if (path == "metadata.uid") return meta.value("uid", "");
  if (path == "metadata.labels") return all("labels");
  if (path == "metadata.annotations") return all("annotations");
  if (path.starts_with("metadata.labels['") && path.ends_with("']")) {
    return label_like("labels", "metadata.labels['");
  }
  if (path.starts_with("metadata.annotations['") && path.ends_with("']")) {
    return label_like("annotations", "metadata.annotations['");
  }
  if (path == "spec.nodeName") return pod["spec"].value("nodeName", "");
  if (path == "spec.serviceAccountName") return pod["spec"].value("serviceAccountName", "default");
  if (path == "status.podIP" || path == "status.hostIP" || path == "status.podIPs" ||
      path == "status.hostIPs") {
    return std::string("127.0.0.1");  // every container runs on this host's loopback
  }
  return Status::InvalidArgument("fieldRef " + path + " is not supported by the test's PodRunner");
}

}  // namespace

PodRunner::PodRunner(const KubeCluster& cluster, PodRunnerOptions options)
    : cluster_(cluster), options_(std::move(options)) {
  ::chmod(dir_.path().c_str(), 0755);  // containers that run as another user reach their volumes
}

PodRunner::PodRunner(const KubeCluster& cluster, std::map<std::string, std::string> images)
    : PodRunner(cluster, [&] {
        PodRunnerOptions o;
        o.images = std::move(images);
        return o;
      }()) {}

PodRunner::~PodRunner() {
  Stop();
  PrintLogsIfTestFailed();
}

Status PodRunner::Start() {
  if (started_) return Status::FailedPrecondition("PodRunner::Start: already started");
  for (const auto& [prefix, dir] : options_.images) {
    if (!IsDirectory(dir)) {
      return Status::NotFound("PodRunner: the binaries for images '" + prefix + "' are to be in " +
                              dir + ", which is not a directory");
    }
  }
  for (const char* tool : {kUnshare, kEnv, "/bin/sh"}) {
    if (::access(tool, X_OK) != 0) {
      return Status::FailedPrecondition(std::string("PodRunner needs ") + tool +
                                        " (util-linux, coreutils)");
    }
  }
  KubectlResult probe =
      RunProgram({kUnshare, "--mount", "--propagation", "private", "--", "/bin/true"}, {}, "",
                 dir_.path(), milliseconds(10000));
  if (probe.exit_code != 0) {
    return Status::FailedPrecondition(
        "PodRunner runs each container in its own mount namespace, which needs root "
        "(CAP_SYS_ADMIN); `unshare --mount` failed here: " +
        probe.Describe());
  }
  for (const char* sub : {"pods", "logs"}) {
    GRANARY_RETURN_IF_ERROR(MakeDirs(dir_.Join(sub), 0755));
  }
  started_ = true;
  Event("runner started; images: " + [&] {
    std::string s;
    for (const auto& [prefix, dir] : options_.images) s += prefix + " -> " + dir + "; ";
    return s;
  }());
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void PodRunner::Stop() {
  if (!started_) return;
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_requested_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  started_ = false;
}

void PodRunner::Loop() {
  while (true) {
    try {
      Poll();
    } catch (const std::exception& e) {
      // A pod spec this runner misread (a field of an unexpected type): say
      // so and go on with the others at the next poll.
      Event(std::string("error while handling the pods (the runner goes on): ") + e.what());
    }
    std::unique_lock<std::mutex> lock(stop_mu_);
    if (stop_cv_.wait_for(lock, options_.poll_interval, [&] { return stop_requested_; })) break;
  }
  for (auto& [uid, pod] : pods_) {
    StopPod(pod.get(), "the runner stops");
    CleanUpPod(pod.get());
  }
  pods_.clear();
  PublishSnapshot();
  Event("runner stopped");
}

std::string PodRunner::ImageDir(const std::string& image) const {
  size_t best = 0;
  std::string dir;
  for (const auto& [prefix, d] : options_.images) {
    if (prefix.empty() || prefix.size() <= best) continue;
    bool match = image.starts_with(prefix);
    for (size_t slash = image.find('/'); !match && slash != std::string::npos;
         slash = image.find('/', slash + 1)) {
      match = image.compare(slash + 1, prefix.size(), prefix) == 0;
    }
    if (match) {
      best = prefix.size();
      dir = d;
    }
  }
  return dir;
}

void PodRunner::Poll() {
  Result<json> list = cluster_.ApiRequest("GET", "/api/v1/pods?fieldSelector=spec.nodeName%21%3D");
  if (!list.ok()) {
    // The API server may be restarting: keep what runs, try again.
    static thread_local std::string last;
    if (list.status().message() != last) {
      last = list.status().message();
      Event("cannot list pods (keeping what runs): " + last);
    }
    return;
  }
  std::set<std::string> wanted;
  std::map<std::string, std::string> why_not;  // uid -> why a known pod is to stop
  for (const json& pod : list->value("items", json::array())) {
    const json& meta = pod["metadata"];
    const std::string uid = meta.value("uid", "");
    const std::string node = pod["spec"].value("nodeName", "");
    const std::string phase = pod.contains("status") ? pod["status"].value("phase", "") : "";
    if (!options_.nodes.empty() && !options_.nodes.contains(node)) {
      why_not[uid] = "it is bound to node " + node + ", which this runner does not serve";
      continue;
    }
    if (meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null()) {
      why_not[uid] = "it is being deleted";
      continue;
    }
    if (phase == "Succeeded" || phase == "Failed") {
      why_not[uid] = "its phase is " + phase;
      continue;
    }
    bool granary = false;
    for (const char* list_name : {"initContainers", "containers"}) {
      for (const json& c : pod["spec"].value(list_name, json::array())) {
        if (!ImageDir(c.value("image", "")).empty()) granary = true;
      }
    }
    if (!granary) continue;
    wanted.insert(uid);
    auto it = pods_.find(uid);
    if (it != pods_.end()) {
      it->second->pod = pod;
      continue;
    }
    auto state = std::make_unique<PodState>();
    state->uid = uid;
    state->ns = meta.value("namespace", "");
    state->name = meta.value("name", "");
    state->node = node;
    state->pod = pod;
    state->restart_policy = pod["spec"].value("restartPolicy", "Always");
    const int64_t grace = pod["spec"].value("terminationGracePeriodSeconds", int64_t{30});
    state->grace = std::min(options_.max_stop_timeout, milliseconds(grace * 1000));
    state->dir = dir_.Join("pods/" + uid);
    std::string names;
    for (const char* list_name : {"initContainers", "containers"}) {
      for (const json& c : pod["spec"].value(list_name, json::array())) {
        ContainerState cs;
        cs.name = c.value("name", "");
        cs.image = c.value("image", "");
        cs.image_dir = ImageDir(cs.image);
        cs.init = std::string(list_name) == "initContainers";
        cs.sidecar = cs.init && c.value("restartPolicy", "") == "Always";
        cs.spec = c;
        cs.log_path = dir_.Join("logs/" + state->ns + "_" + state->name + "_" + cs.name + "_" +
                                uid.substr(0, 8) + ".log");
        if (!cs.image_dir.empty()) names += (names.empty() ? "" : ", ") + cs.name;
        state->containers.push_back(std::move(cs));
      }
    }
    Event("pod " + state->ns + "/" + state->name + " (uid " + uid + ") on " + node + ": runs " +
          names);
    pods_.emplace(uid, std::move(state));
  }
  for (auto it = pods_.begin(); it != pods_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    auto reason = why_not.find(it->first);
    StopPod(it->second.get(),
            reason != why_not.end() ? reason->second : "it is gone from the API server");
    CleanUpPod(it->second.get());
    it = pods_.erase(it);
  }
  for (auto& [uid, pod] : pods_) StepPod(pod.get());
  PublishSnapshot();
}

namespace {

// The mount points runners of this process created on the host, with how
// many pods hold each: a path one pod created must outlive that pod while
// another pod's container has a mount there (removing a directory that is a
// mount point in another mount namespace detaches that mount).
std::mutex mount_points_mu;
std::map<std::string, int>& MountPointRefs() {
  static auto* refs = new std::map<std::string, int>();  // guarded by mount_points_mu
  return *refs;
}

}  // namespace

Status PodRunner::SetUpPod(PodState* pod) {
  const json& spec = pod->pod["spec"];
  const std::string volumes_dir = pod->dir + "/volumes";
  GRANARY_RETURN_IF_ERROR(MakeDirs(volumes_dir, 0755));
  const std::string ns = pod->ns;

  auto get = [&](const std::string& kind, const std::string& name, bool optional,
                 bool* found) -> Result<json> {
    *found = false;
    Result<json> object =
        cluster_.ApiRequest("GET", "/api/v1/namespaces/" + ns + "/" + kind + "/" + name);
    if (object.ok()) {
      *found = true;
      return object;
    }
    if (object.status().code() == StatusCode::kNotFound && optional) return json::object();
    return object.status();
  };
  // Writes a ConfigMap's or Secret's keys (or its `items`) into `dir`.
  auto write_keys = [&](const std::string& dir, const std::string& kind, const json& source,
                        int default_mode) -> Status {
    const bool secret = kind == "secrets";
    const std::string name = source.value(secret ? "secretName" : "name", source.value("name", ""));
    bool found = false;
    GRANARY_ASSIGN_OR_RETURN(json object, get(kind, name, source.value("optional", false), &found));
    if (!found) return Status::Ok();
    GRANARY_ASSIGN_OR_RETURN(auto data, ObjectData(object, secret));
    if (source.contains("items")) {
      for (const json& item : source["items"]) {
        const std::string key = item.value("key", "");
        auto it = data.find(key);
        if (it == data.end()) {
          if (source.value("optional", false)) continue;
          return Status::NotFound(kind + " " + ns + "/" + name + " has no key " + key);
        }
        GRANARY_RETURN_IF_ERROR(WriteVolumeFile(dir, item.value("path", key), it->second,
                                                item.value("mode", default_mode)));
      }
    } else {
      for (const auto& [key, value] : data) {
        GRANARY_RETURN_IF_ERROR(WriteVolumeFile(dir, key, value, default_mode));
      }
    }
    return Status::Ok();
  };
  auto write_downward = [&](const std::string& dir, const json& items, int default_mode) -> Status {
    for (const json& item : items) {
      if (!item.contains("fieldRef")) {
        return Status::InvalidArgument("downwardAPI item " + item.value("path", "") +
                                       ": only fieldRef is supported by the test's PodRunner");
      }
      GRANARY_ASSIGN_OR_RETURN(std::string value,
                               FieldValue(pod->pod, item["fieldRef"].value("fieldPath", "")));
      GRANARY_RETURN_IF_ERROR(
          WriteVolumeFile(dir, item.value("path", ""), value, item.value("mode", default_mode)));
    }
    return Status::Ok();
  };

  for (const json& volume : spec.value("volumes", json::array())) {
    const std::string name = volume.value("name", "");
    const std::string dir = volumes_dir + "/" + name;
    if (volume.contains("hostPath")) {
      const std::string path = volume["hostPath"].value("path", "");
      const std::string type = volume["hostPath"].value("type", "");
      if (type == "DirectoryOrCreate" && !Exists(path)) {
        GRANARY_RETURN_IF_ERROR(MakeDirs(path, 0755));
      } else if (type == "FileOrCreate" && !Exists(path)) {
        GRANARY_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.rfind('/')), 0755));
        GRANARY_RETURN_IF_ERROR(WriteFileAtomically(path, "", 0644));
      } else if (!Exists(path)) {
        return Status::NotFound("hostPath volume " + name + ": " + path + " does not exist");
      }
      pod->volume_paths[name] = path;
      continue;
    }
    GRANARY_RETURN_IF_ERROR(MakeDirs(dir, 0755));
    pod->volume_paths[name] = dir;
    if (volume.contains("emptyDir")) {
      if (::chmod(dir.c_str(), 0777) != 0) return Status::FromErrno(errno, "chmod " + dir);
    } else if (volume.contains("configMap")) {
      GRANARY_RETURN_IF_ERROR(write_keys(dir, "configmaps", volume["configMap"],
                                         volume["configMap"].value("defaultMode", 0644)));
    } else if (volume.contains("secret")) {
      GRANARY_RETURN_IF_ERROR(write_keys(dir, "secrets", volume["secret"],
                                         volume["secret"].value("defaultMode", 0644)));
    } else if (volume.contains("downwardAPI")) {
      GRANARY_RETURN_IF_ERROR(write_downward(dir,
                                             volume["downwardAPI"].value("items", json::array()),
                                             volume["downwardAPI"].value("defaultMode", 0644)));
    } else if (volume.contains("projected")) {
      const int mode = volume["projected"].value("defaultMode", 0644);
      for (const json& source : volume["projected"].value("sources", json::array())) {
        if (source.contains("configMap")) {
          GRANARY_RETURN_IF_ERROR(write_keys(dir, "configmaps", source["configMap"], mode));
        } else if (source.contains("secret")) {
          GRANARY_RETURN_IF_ERROR(write_keys(dir, "secrets", source["secret"], mode));
        } else if (source.contains("downwardAPI")) {
          GRANARY_RETURN_IF_ERROR(
              write_downward(dir, source["downwardAPI"].value("items", json::array()), mode));
        } else if (source.contains("serviceAccountToken")) {
          const json& t = source["serviceAccountToken"];
          json request = {{"apiVersion", "authentication.k8s.io/v1"},
                          {"kind", "TokenRequest"},
                          {"spec",
                           {{"expirationSeconds", t.value("expirationSeconds", int64_t{3607})},
                            {"boundObjectRef",
                             {{"apiVersion", "v1"},
                              {"kind", "Pod"},
                              {"name", pod->name},
                              {"uid", pod->uid}}}}}};
          if (t.contains("audience")) request["spec"]["audiences"] = {t["audience"]};
          const std::string sa = spec.value("serviceAccountName", "default");
          GRANARY_ASSIGN_OR_RETURN(
              json answer,
              cluster_.ApiRequest("POST",
                                  "/api/v1/namespaces/" + ns + "/serviceaccounts/" + sa + "/token",
                                  request.dump()));
          const std::string token = answer["status"].value("token", "");
          if (token.empty()) {
            return Status::Internal("TokenRequest for " + ns + "/" + sa + " returned no token");
          }
          GRANARY_RETURN_IF_ERROR(WriteVolumeFile(dir, t.value("path", "token"), token, mode));
        } else {
          return Status::InvalidArgument(
              "projected volume " + name +
              ": a source the test's PodRunner does not support: " + source.dump());
        }
      }
    } else {
      return Status::InvalidArgument("volume " + name +
                                     ": a type the test's PodRunner does not support (it runs "
                                     "hostPath, emptyDir, configMap, secret, downwardAPI, "
                                     "projected): " +
                                     volume.dump());
    }
  }

  // The mount points, in the host's file system, of the mounts that are not
  // nested in another mount of the same container.
  std::lock_guard<std::mutex> lock(mount_points_mu);
  std::map<std::string, int>& refs = MountPointRefs();
  for (ContainerState& c : pod->containers) {
    if (c.image_dir.empty()) continue;
    std::vector<std::string> paths;
    for (const json& m : c.spec.value("volumeMounts", json::array())) {
      paths.push_back(m.value("mountPath", ""));
    }
    for (const json& m : c.spec.value("volumeMounts", json::array())) {
      const std::string dst = m.value("mountPath", "");
      const std::string volume = m.value("name", "");
      auto source = pod->volume_paths.find(volume);
      if (source == pod->volume_paths.end()) {
        return Status::InvalidArgument("container " + c.name + " mounts volume " + volume +
                                       ", which the pod does not declare");
      }
      if (dst.empty() || dst[0] != '/') {
        return Status::InvalidArgument("container " + c.name + ": mountPath '" + dst +
                                       "' is not absolute");
      }
      std::string src = source->second;
      const std::string sub = m.value("subPath", "");
      if (!sub.empty()) {
        src += "/" + sub;
        if (!Exists(src)) GRANARY_RETURN_IF_ERROR(MakeDirs(src, 0755));  // as the kubelet does
      }
      bool nested = false;
      for (const std::string& other : paths) {
        if (other != dst && dst.starts_with(other + "/")) nested = true;
      }
      if (nested) continue;
      // Create what is missing, top down, holding a reference on each.
      std::vector<std::string> chain;
      for (std::string p = dst; !p.empty() && p != "/"; p = p.substr(0, p.rfind('/'))) {
        chain.push_back(p);
      }
      std::reverse(chain.begin(), chain.end());
      for (size_t i = 0; i < chain.size(); ++i) {
        const std::string& p = chain[i];
        auto ref = refs.find(p);
        if (ref != refs.end()) {
          ++ref->second;
          pod->created_paths.push_back(p);
          continue;
        }
        if (Exists(p)) continue;
        const bool last = i + 1 == chain.size();
        if (last && !IsDirectory(src)) {
          GRANARY_RETURN_IF_ERROR(WriteFileAtomically(p, "", 0644));
        } else if (::mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) {
          return Status::FromErrno(errno, "create mount point " + p + " for container " + c.name);
        }
        refs[p] = 1;
        pod->created_paths.push_back(p);
        Event("created mount point " + p + " (removed when no pod uses it)");
      }
    }
  }
  return Status::Ok();
}

void PodRunner::StepPod(PodState* pod) {
  if (pod->failed || pod->completion_reported) return;
  const auto now = steady_clock::now();
  if (!pod->set_up) {
    if (now < pod->next_setup) return;
    Status s = SetUpPod(pod);
    if (!s.ok()) {
      Problem(pod, "cannot set up its volumes (retrying): " + s.ToString());
      if (s.code() == StatusCode::kInvalidArgument) {
        pod->failed = true;
        Problem(pod, "the pod will not run here");
      }
      pod->next_setup = now + kSetUpRetry;
      return;
    }
    pod->set_up = true;
  }
  for (ContainerState& c : pod->containers) {
    if (c.process != nullptr && !c.process->Running()) ReapContainer(pod, &c);
  }
  if (pod->failed) {
    // An init container failed for good: the pod's sidecars end too.
    StopPod(pod, "an init container failed and restartPolicy is Never");
    return;
  }
  if (options_.report_completion && RegularContainersEnded(*pod)) {
    ReportCompletion(pod);
    return;
  }
  for (ContainerState& c : pod->containers) {
    if (c.image_dir.empty()) continue;  // kwok's
    const bool runnable =
        c.process == nullptr && !c.completed && !c.given_up && now >= c.next_start;
    if (runnable) {
      Status s = StartContainer(pod, &c);
      if (!s.ok()) {
        Problem(pod, "cannot start container " + c.name + " (retrying): " + s.ToString());
        c.next_start = now + kSetUpRetry;
      }
    }
    // An init container that runs to completion holds back the ones after it.
    if (c.init && !c.sidecar && !c.completed) return;
    // So does a native sidecar until its startupProbe passes.
    if (c.sidecar && !c.startup_passed) {
      c.startup_passed = c.process != nullptr && c.process->Running() && StartupProbePasses(c.spec);
      if (!c.startup_passed) {
        if (!c.startup_wait_logged) {
          Event("pod " + pod->ns + "/" + pod->name + ": the containers after " + c.name +
                " wait for its startupProbe");
          c.startup_wait_logged = true;
        }
        return;
      }
      Event("pod " + pod->ns + "/" + pod->name + ": " + c.name + "'s startupProbe passed");
    }
  }
}

Status PodRunner::StartContainer(PodState* pod, ContainerState* c) {
  const json& pod_json = pod->pod;
  const json& spec = c->spec;
  const std::string ns = pod->ns;

  // The environment: what a container gets, then envFrom, then env.
  std::vector<std::pair<std::string, std::string>> env;
  std::map<std::string, std::string> vars;
  auto set = [&](const std::string& k, const std::string& v) {
    if (vars.contains(k)) {
      for (auto& e : env) {
        if (e.first == k) e.second = v;
      }
    } else {
      env.emplace_back(k, v);
    }
    vars[k] = v;
  };
  const std::string port = std::to_string(cluster_.api_port());
  set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
  set("HOME", "/root");
  set("HOSTNAME", pod->name);
  set("KUBERNETES_SERVICE_HOST", "127.0.0.1");
  set("KUBERNETES_SERVICE_PORT", port);
  set("KUBERNETES_SERVICE_PORT_HTTPS", port);
  set("KUBERNETES_PORT", "tcp://127.0.0.1:" + port);
  for (const char* passed : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TMPDIR"}) {
    if (const char* v = std::getenv(passed)) set(passed, v);
  }
  auto object_data = [&](const std::string& kind, const std::string& name,
                         bool optional) -> Result<std::map<std::string, std::string>> {
    Result<json> object =
        cluster_.ApiRequest("GET", "/api/v1/namespaces/" + ns + "/" + kind + "/" + name);
    if (!object.ok()) {
      if (object.status().code() == StatusCode::kNotFound && optional) {
        return std::map<std::string, std::string>();
      }
      return object.status();
    }
    return ObjectData(*object, kind == "secrets");
  };
  for (const json& from : spec.value("envFrom", json::array())) {
    const std::string prefix = from.value("prefix", "");
    for (const char* kind : {"configMapRef", "secretRef"}) {
      if (!from.contains(kind)) continue;
      GRANARY_ASSIGN_OR_RETURN(
          auto data,
          object_data(std::string(kind) == "secretRef" ? "secrets" : "configmaps",
                      from[kind].value("name", ""), from[kind].value("optional", false)));
      for (const auto& [k, v] : data) set(prefix + k, v);
    }
  }
  for (const json& e : spec.value("env", json::array())) {
    const std::string name = e.value("name", "");
    if (e.contains("value")) {
      set(name, Expand(e["value"].get<std::string>(), vars));
      continue;
    }
    if (!e.contains("valueFrom")) {
      set(name, "");
      continue;
    }
    const json& from = e["valueFrom"];
    if (from.contains("fieldRef")) {
      GRANARY_ASSIGN_OR_RETURN(std::string v,
                               FieldValue(pod_json, from["fieldRef"].value("fieldPath", "")));
      set(name, v);
    } else if (from.contains("secretKeyRef") || from.contains("configMapKeyRef")) {
      const bool secret = from.contains("secretKeyRef");
      const json& ref = secret ? from["secretKeyRef"] : from["configMapKeyRef"];
      const bool optional = ref.value("optional", false);
      const std::string object = ref.value("name", "");
      GRANARY_ASSIGN_OR_RETURN(auto data,
                               object_data(secret ? "secrets" : "configmaps", object, optional));
      auto it = data.find(ref.value("key", ""));
      if (it == data.end()) {
        if (optional) continue;
        return Status::NotFound("env " + name + ": " + (secret ? "secret " : "configmap ") + ns +
                                "/" + object + " has no key " + ref.value("key", ""));
      }
      set(name, it->second);
    } else {
      return Status::InvalidArgument("env " + name + ": valueFrom " + from.dump() +
                                     " is not supported by the test's PodRunner");
    }
  }

  // argv.
  std::vector<std::string> command;
  for (const json& a : spec.value("command", json::array())) command.push_back(Expand(a, vars));
  const std::string binary_name = command.empty() ? ImageBaseName(c->image) : BaseName(command[0]);
  const std::string binary = c->image_dir + "/" + binary_name;
  if (::access(binary.c_str(), X_OK) != 0) {
    return Status::NotFound("no executable " + binary_name + " in " + c->image_dir + " for image " +
                            c->image +
                            " (the command's base name, or the image's "
                            "name when there is no command)");
  }
  std::vector<std::string> program_args;
  if (command.size() > 1) program_args.assign(command.begin() + 1, command.end());
  for (const json& a : spec.value("args", json::array())) program_args.push_back(Expand(a, vars));

  // The wrapper: unshare, sh binding the volumes, [setpriv], env -i, the binary.
  struct Mount {
    std::string kind, src, dst, ro;
  };
  std::vector<Mount> mounts;
  for (const json& m : spec.value("volumeMounts", json::array())) {
    std::string src = pod->volume_paths.at(m.value("name", ""));
    const std::string sub = m.value("subPath", "");
    if (!sub.empty()) src += "/" + sub;
    mounts.push_back({IsDirectory(src) ? "d" : "f", src, m.value("mountPath", ""),
                      m.value("readOnly", false) ? "ro" : "rw"});
  }
  std::stable_sort(mounts.begin(), mounts.end(), [](const Mount& a, const Mount& b) {
    return std::count(a.dst.begin(), a.dst.end(), '/') <
           std::count(b.dst.begin(), b.dst.end(), '/');
  });
  DaemonProcessOptions o;
  o.binary = kUnshare;
  o.args = {"--mount", "--propagation", "private",           "--", "/bin/sh",
            "-c",      kMountScript,    "granary-pod-mounts"};
  for (const Mount& m : mounts) {
    for (const std::string* s : {&m.kind, &m.src, &m.dst, &m.ro}) o.args.push_back(*s);
  }
  o.args.push_back("--");
  o.args.push_back(spec.value("workingDir", std::string("/")));
  const json pod_security = pod_json["spec"].value("securityContext", json::object());
  const json security = spec.value("securityContext", json::object());
  auto id = [&](const char* field) -> int64_t {
    if (security.contains(field)) return security[field].get<int64_t>();
    if (pod_security.contains(field)) return pod_security[field].get<int64_t>();
    return -1;
  };
  const int64_t uid = id("runAsUser");
  const int64_t gid = id("runAsGroup");
  if (uid > 0 || gid > 0) {
    o.args.push_back(kSetpriv);
    if (uid >= 0) o.args.push_back("--reuid=" + std::to_string(uid));
    if (gid >= 0) o.args.push_back("--regid=" + std::to_string(gid));
    o.args.push_back("--clear-groups");
    o.args.push_back("--");
  }
  o.args.push_back(kEnv);
  o.args.push_back("-i");
  for (const auto& [k, v] : env) o.args.push_back(k + "=" + v);
  o.args.push_back(binary);
  o.args.insert(o.args.end(), program_args.begin(), program_args.end());
  o.log_path = c->log_path;
  o.name = pod->ns + "/" + pod->name + "/" + c->name;

  GRANARY_ASSIGN_OR_RETURN(c->process, DaemonProcess::Start(std::move(o)));
  if (c->ever_started) ++c->restarts;
  c->ever_started = true;
  c->started_at = steady_clock::now();
  c->startup_passed = false;
  c->startup_wait_logged = false;
  c->started_wall = system_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(all_logs_.begin(), all_logs_.end(), c->log_path) == all_logs_.end()) {
      all_logs_.push_back(c->log_path);
    }
  }
  std::string shown = binary;
  for (const std::string& a : program_args) shown += " " + a;
  Event("started " + pod->ns + "/" + pod->name + "/" + c->name + " (pid " +
        std::to_string(c->process->pid()) +
        (c->restarts > 0 ? ", restart " + std::to_string(c->restarts) : "") + "): " + shown +
        "; log " + c->log_path);
  return Status::Ok();
}

void PodRunner::ReapContainer(PodState* pod, ContainerState* c) {
  const ExitStatus status = c->process->exit_status().value_or(ExitStatus{});
  const auto now = steady_clock::now();
  const auto ran = std::chrono::duration_cast<milliseconds>(now - c->started_at);
  {
    std::lock_guard<std::mutex> lock(mu_);
    exits_.push_back({pod->ns, pod->name, c->name, status.ToString(), status.exited, status.code,
                      false, c->log_path});
  }
  c->last_exit = status;
  c->finished_wall = system_clock::now();
  RetireProcess(c);
  const bool success = status.ExitedWith(0);
  bool restart = false;
  if (c->sidecar) {
    restart = true;
  } else if (c->init) {
    if (success) {
      c->completed = true;
    } else {
      restart = pod->restart_policy != "Never";
    }
  } else if (pod->restart_policy == "Always") {
    restart = true;
  } else if (pod->restart_policy == "OnFailure") {
    restart = !success;
    c->completed = success;
  } else {
    c->completed = success;
  }
  std::string next;
  if (restart) {
    c->backoff = ran >= kBackoffReset || c->backoff.count() == 0
                     ? options_.initial_backoff
                     : std::min(c->backoff * 2, options_.max_backoff);
    c->next_start = now + c->backoff;
    next = "restarting in " + std::to_string(c->backoff.count()) + " ms";
  } else if (c->completed) {
    next = "completed";
  } else {
    c->given_up = true;
    next = "not restarted (restartPolicy " + pod->restart_policy + ")";
    if (c->init) pod->failed = true;
  }
  Event("container " + pod->ns + "/" + pod->name + "/" + c->name + " ended after " +
        std::to_string(ran.count()) + " ms: " + status.ToString() + "; " + next);
}

void PodRunner::StopPod(PodState* pod, const std::string& why) {
  std::vector<ContainerState*> regular, init;
  for (ContainerState& c : pod->containers) {
    if (c.process == nullptr) continue;
    (c.init ? init : regular).push_back(&c);
  }
  if (regular.empty() && init.empty()) {
    Event("pod " + pod->ns + "/" + pod->name + ": " + why + "; nothing of it runs");
    return;
  }
  Event("stopping pod " + pod->ns + "/" + pod->name + ": " + why);
  // The regular containers first, then the sidecars, as the kubelet does.
  for (std::vector<ContainerState*>* group : {&regular, &init}) {
    const auto deadline = steady_clock::now() + pod->grace;
    for (ContainerState* c : *group) (void)c->process->Signal(SIGTERM);
    for (ContainerState* c : *group) {
      const auto left =
          std::max(milliseconds(0),
                   std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now()));
      Result<ExitStatus> status = c->process->Terminate(left);
      const ExitStatus ended = c->process->exit_status().value_or(ExitStatus{});
      {
        std::lock_guard<std::mutex> lock(mu_);
        exits_.push_back({pod->ns, pod->name, c->name, ended.ToString(), ended.exited, ended.code,
                          true, c->log_path});
      }
      Event("stopped " + pod->ns + "/" + pod->name + "/" + c->name + ": " +
            (status.ok() ? ended.ToString() : status.status().message()));
      c->last_exit = ended;
      c->finished_wall = system_clock::now();
      RetireProcess(c);
    }
  }
}

bool PodRunner::RegularContainersEnded(const PodState& pod) const {
  if (pod.restart_policy != "Never" && pod.restart_policy != "OnFailure") return false;
  bool any = false;
  for (const ContainerState& c : pod.containers) {
    if (c.init) continue;
    // A container this runner does not run is kwok's: the pod's end is not
    // known here.
    if (c.image_dir.empty()) return false;
    if (!c.completed && !c.given_up) return false;
    any = true;
  }
  return any;
}

void PodRunner::ReportCompletion(PodState* pod) {
  const json& observed = pod->pod.contains("status") ? pod->pod["status"] : json::object();
  // The status kwok's "ready" stage writes first (Running, podIP): written
  // after it, the terminal status is the last word; written before, kwok
  // might still make the pod Running over it.
  if (observed.value("phase", "") != "Running") {
    Problem(pod,
            "its regular containers have ended; waiting for kwok to report it Running "
            "before writing its terminal status");
    return;
  }
  bool all_succeeded = true;
  for (const ContainerState& c : pod->containers) {
    if (!c.init && !(c.last_exit.has_value() && c.last_exit->ExitedWith(0))) all_succeeded = false;
  }
  const std::string phase = all_succeeded ? "Succeeded" : "Failed";
  // As the kubelet: the native sidecars end after the regular containers.
  StopPod(pod, "its regular containers have all ended (restartPolicy " + pod->restart_policy +
                   "): the pod has " + phase);

  const std::string now = Rfc3339(system_clock::now());
  auto status_of = [&](const ContainerState& c) {
    const ExitStatus ended = c.last_exit.value_or(ExitStatus{});
    const int code = ended.exited ? ended.code : 128 + ended.signal;
    return json{{"name", c.name},
                {"image", c.image},
                {"imageID", ""},
                {"ready", false},
                {"started", false},
                {"restartCount", c.restarts},
                {"state",
                 {{"terminated",
                   {{"exitCode", code},
                    {"reason", code == 0 ? "Completed" : "Error"},
                    {"startedAt", Rfc3339(c.started_wall)},
                    {"finishedAt", Rfc3339(c.finished_wall)}}}}}};
  };
  json containers = json::array();
  for (const ContainerState& c : pod->containers) {
    if (!c.init) containers.push_back(status_of(c));
  }
  // Init containers run here get their end; kwok's entries for the others
  // stay (a merge patch replaces a list whole).
  json init_statuses = json::array();
  for (const ContainerState& c : pod->containers) {
    if (!c.init) continue;
    if (!c.image_dir.empty() && c.ever_started) {
      init_statuses.push_back(status_of(c));
      continue;
    }
    for (const json& s : observed.value("initContainerStatuses", json::array())) {
      if (s.value("name", "") == c.name) init_statuses.push_back(s);
    }
  }
  json conditions = json::array();
  bool ready_seen = false, containers_ready_seen = false;
  for (json cond : observed.value("conditions", json::array())) {
    const std::string type = cond.value("type", "");
    if (type == "Ready" || type == "ContainersReady") {
      (type == "Ready" ? ready_seen : containers_ready_seen) = true;
      cond["status"] = "False";
      cond["reason"] = "PodCompleted";
      cond["lastTransitionTime"] = now;
    }
    conditions.push_back(cond);
  }
  for (const auto& [type, seen] :
       {std::pair{"Ready", ready_seen}, std::pair{"ContainersReady", containers_ready_seen}}) {
    if (!seen) {
      conditions.push_back({{"type", type},
                            {"status", "False"},
                            {"reason", "PodCompleted"},
                            {"lastTransitionTime", now}});
    }
  }
  const json patch = {{"metadata", {{"uid", pod->uid}}},
                      {"status",
                       {{"phase", phase},
                        {"conditions", conditions},
                        {"containerStatuses", containers},
                        {"initContainerStatuses", init_statuses}}}};
  Result<json> written = cluster_.ApiRequest(
      "PATCH", "/api/v1/namespaces/" + pod->ns + "/pods/" + pod->name + "/status", patch.dump());
  if (!written.ok()) {
    Problem(pod, "cannot write its terminal status (retrying at the next poll): " +
                     written.status().ToString());
    return;
  }
  pod->completion_reported = true;
  std::string codes;
  for (const json& c : containers) {
    codes += (codes.empty() ? "" : ", ") + c.value("name", "") + " exit " +
             std::to_string(c["state"]["terminated"].value("exitCode", -1));
  }
  Event("pod " + pod->ns + "/" + pod->name + ": wrote phase " + phase + " (" + codes +
        ") through the status subresource");
}

void PodRunner::RetireProcess(ContainerState* c) {
  // DaemonProcess prints its log when destroyed after a failure; the others
  // are printed by PrintLogsIfTestFailed.
  if (::testing::Test::HasFailure()) {
    std::lock_guard<std::mutex> lock(mu_);
    printed_logs_.insert(c->log_path);
  }
  c->process.reset();
}

void PodRunner::CleanUpPod(PodState* pod) {
  {
    std::lock_guard<std::mutex> lock(mount_points_mu);
    std::map<std::string, int>& refs = MountPointRefs();
    for (auto it = pod->created_paths.rbegin(); it != pod->created_paths.rend(); ++it) {
      auto ref = refs.find(*it);
      if (ref == refs.end() || --ref->second > 0) continue;
      refs.erase(ref);
      struct stat st {};
      if (::lstat(it->c_str(), &st) != 0) continue;
      // Only what is still as this runner made it: an empty directory or file.
      const int rc = S_ISDIR(st.st_mode)                        ? ::rmdir(it->c_str())
                     : (S_ISREG(st.st_mode) && st.st_size == 0) ? ::unlink(it->c_str())
                                                                : -1;
      Event((rc == 0 ? "removed mount point " : "left mount point ") + *it +
            (rc == 0 ? "" : " (not empty)"));
    }
  }
  pod->created_paths.clear();
  std::error_code ec;
  std::filesystem::remove_all(pod->dir, ec);
}

void PodRunner::PublishSnapshot() {
  std::vector<RunningContainer> running;
  for (const auto& [uid, pod] : pods_) {
    std::map<std::string, std::string> labels;
    const json& meta = pod->pod["metadata"];
    if (meta.contains("labels")) {
      for (const auto& [k, v] : meta["labels"].items()) labels[k] = v.get<std::string>();
    }
    for (const ContainerState& c : pod->containers) {
      if (c.process == nullptr) continue;
      running.push_back({pod->ns, pod->name, pod->uid, pod->node, c.name, labels, c.init,
                         c.process->pid(), c.log_path, c.restarts});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  running_ = std::move(running);
}

void PodRunner::Event(const std::string& line) {
  static const auto start = steady_clock::now();
  const double at =
      static_cast<double>(
          std::chrono::duration_cast<milliseconds>(steady_clock::now() - start).count()) /
      1000.0;
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "[%9.3f s] ", at);
  const std::string text = stamp + line;
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.size() >= kMaxEvents)
    events_.erase(events_.begin(), events_.begin() + kMaxEvents / 4);
  events_.push_back(text);
}

void PodRunner::Problem(PodState* pod, const std::string& line) {
  if (!pod->problems.insert(line).second) return;
  Event("problem with pod " + pod->ns + "/" + pod->name + ": " + line);
}

std::vector<RunningContainer> PodRunner::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

std::vector<ContainerExit> PodRunner::Exits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exits_;
}

std::string PodRunner::EventLog() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const std::string& e : events_) out += e + "\n";
  return out;
}

Status PodRunner::WaitFor(
    const std::function<bool(const std::vector<RunningContainer>&)>& condition,
    milliseconds timeout, const std::string& what) const {
  const auto deadline = steady_clock::now() + timeout;
  while (true) {
    const std::vector<RunningContainer> running = Running();
    if (condition(running)) return Status::Ok();
    if (steady_clock::now() >= deadline) {
      std::string runs;
      for (const RunningContainer& r : running) {
        runs += "\n  " + r.ns + "/" + r.pod + "/" + r.container + " on " + r.node + " (pid " +
                std::to_string(r.pid) + ")";
      }
      std::string events = EventLog();
      if (events.size() > 6000) events = "...\n" + events.substr(events.size() - 6000);
      return Status::DeadlineExceeded(
          "PodRunner: waited " + std::to_string(timeout.count()) + " ms for " + what +
          "; running:" + (runs.empty() ? " nothing" : runs) + "\nevents:\n" + events);
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
}

Status PodRunner::WaitForRunning(const std::function<bool(const RunningContainer&)>& match,
                                 size_t count, milliseconds timeout) const {
  return WaitFor(
      [&](const std::vector<RunningContainer>& running) {
        return static_cast<size_t>(std::count_if(running.begin(), running.end(), match)) >= count;
      },
      timeout, std::to_string(count) + " matching container(s) to run");
}

std::function<bool(const RunningContainer&)> PodRunner::Pod(const std::string& ns,
                                                            const std::string& name) {
  return [ns, name](const RunningContainer& r) { return r.ns == ns && r.pod == name; };
}

std::function<bool(const RunningContainer&)> PodRunner::InNamespace(const std::string& ns) {
  return [ns](const RunningContainer& r) { return r.ns == ns; };
}

std::function<bool(const RunningContainer&)> PodRunner::WithLabel(const std::string& key,
                                                                  const std::string& value) {
  return [key, value](const RunningContainer& r) {
    auto it = r.labels.find(key);
    return it != r.labels.end() && it->second == value;
  };
}

void PodRunner::PrintLogsIfTestFailed() {
  if (!::testing::Test::HasFailure()) return;
  std::vector<std::string> logs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (logs_printed_) return;
    logs_printed_ = true;
    for (const std::string& path : all_logs_) {
      if (!printed_logs_.contains(path)) logs.push_back(path);
    }
  }
  for (const std::string& path : logs) {
    Result<std::string> text = ReadFileToString(path);
    std::string tail = text.ok() ? *text : text.status().ToString();
    if (tail.size() > 16384) tail = "[...]\n" + tail.substr(tail.size() - 16384);
    std::cerr << "---- container log " << path << " ----\n"
              << tail << "---- end of " << path << " ----" << std::endl;
  }
  std::cerr << "---- PodRunner events (" << dir_.path() << ") ----\n"
            << EventLog() << "---- end of the PodRunner events ----" << std::endl;
}

}  // namespace granary::testing

#include "testing/kube_node.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "granary/core/file.h"
#include "testing/daemon_process.h"
#include "testing/fuse_mounts.h"

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kCommandTimeout{60000};
constexpr milliseconds kStopTimeout{15000};
constexpr const char* kServiceCidr = "10.96.0.0/16";
constexpr const char* kPauseImage = "granary.local/pause:1";

std::string SourceDir() {
#ifdef GRANARY_SOURCE_DIR
  return GRANARY_SOURCE_DIR;
#else
  const char* env = std::getenv("GRANARY_SOURCE_DIR");
  return env != nullptr ? env : ".";
#endif
}

bool Executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

bool OnPath(const std::string& name) {
  for (const char* dir :
       {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}) {
    if (Executable(std::string(dir) + "/" + name)) return true;
  }
  return false;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> NetnsList() {
  std::vector<std::string> names;
  Result<std::string> out = RunCommand({IpBinary(), "netns", "list"});
  if (!out.ok()) return names;
  std::istringstream in(*out);
  std::string line;
  while (std::getline(in, line)) {
    std::string name = line.substr(0, line.find(' '));
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

// Removes a cgroup directory tree bottom-up (cgroup directories are removed
// with rmdir; their files go with them).
void RemoveCgroupTree(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return;
  std::vector<std::string> children;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (e->d_type == DT_DIR) children.push_back(path + "/" + name);
  }
  ::closedir(d);
  for (const std::string& child : children) RemoveCgroupTree(child);
  ::rmdir(path.c_str());
}

}  // namespace

std::optional<std::string> KubeNode::Unavailable() {
  if (::geteuid() != 0) return std::string("a real node needs root (containerd, runc, cgroups)");
  for (const char* tool :
       {"containerd", "ctr", "runc", "containerd-shim-runc-v2", "nsenter", "iptables", "gcc"}) {
    if (!OnPath(tool)) {
      return std::string(tool) +
             " is missing: scripts/install-deps test installs what a real node needs";
    }
  }
  for (const char* plugin : {"bridge", "host-local", "loopback"}) {
    if (!Executable(std::string("/usr/lib/cni/") + plugin)) {
      return std::string("/usr/lib/cni/") + plugin +
             " is missing (Debian's containernetworking-plugins)";
    }
  }
  Result<std::string> tools = KubeCluster::ToolsDir();
  if (!tools.ok()) return tools.status().ToString();
  for (const char* tool : {"kubelet", "kube-proxy"}) {
    if (!Executable(*tools + "/" + tool)) {
      return "no " + std::string(tool) + " in " + *tools +
             ": run scripts/k8s-tools --node (it builds kubelet and kube-proxy)";
    }
  }
  if (std::optional<std::string> why = NetnsHosts::Unavailable()) return why;
  return std::nullopt;
}

Result<std::string> KubeNode::GranaryImage(const std::string& build_dir, bool trainer) {
  const std::string archive = build_dir + (trainer ? "/image/granary-trainer_0.1.0.oci.tar"
                                                   : "/image/granary_0.1.0.oci.tar");
  struct stat image {};
  bool fresh = ::stat(archive.c_str(), &image) == 0;
  for (const char* binary :
       {"operator/granary-operator", "cachenode/granary-cachenode", "sidecar/granary-sidecar",
        "cli/granary", "python/granary/_native.abi3.so"}) {
    struct stat st {};
    const std::string path = build_dir + "/" + binary;
    if (::stat(path.c_str(), &st) != 0) {
      return Status::NotFound(path + " is not built: the image holds it");
    }
    if (fresh && st.st_mtim.tv_sec >= image.st_mtim.tv_sec) fresh = false;
  }
  if (fresh) return archive;
  std::vector<std::string> argv = {SourceDir() + "/scripts/image/assemble", "--build-dir",
                                   build_dir, "--output", archive};
  if (trainer) argv.push_back("--trainer");
  Result<std::string> out = RunCommand(argv, milliseconds(900000));
  if (!out.ok()) return out.status().WithContext("assemble the image from " + build_dir);
  return archive;
}

KubeNode::KubeNode(KubeNodeOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<KubeNode>> KubeNode::Start(KubeNodeOptions options) {
  if (std::optional<std::string> why = Unavailable()) return Status::FailedPrecondition(*why);
  std::unique_ptr<KubeNode> node(new KubeNode(std::move(options)));
  GRANARY_ASSIGN_OR_RETURN(node->tools_dir_, KubeCluster::ToolsDir());
  auto fail = [&](const Status& s) {
    return s.WithContext("start the real node " + node->name() + ":\n" + node->LogTails(3072));
  };
  if (Status s = node->LockMachine(); !s.ok()) return s;
  if (Status s = node->MakeNetwork(); !s.ok()) return fail(s);
  KubeClusterOptions cluster_options = node->options_.cluster;
  cluster_options.api_address = node->host_ip_;
  Result<std::unique_ptr<KubeCluster>> cluster = KubeCluster::Start(cluster_options);
  if (!cluster.ok()) return cluster.status().WithContext("start the control plane");
  node->cluster_ = std::move(*cluster);
  if (Status s = node->MakeWorkDir(); !s.ok()) return fail(s);
  if (Status s = node->StartContainerd(); !s.ok()) return fail(s);
  for (const auto& [archive, name] : node->options_.images) {
    if (Status s = node->LoadImage(archive, name); !s.ok()) return fail(s);
  }
  if (Status s = node->WriteCniConfig(); !s.ok()) return fail(s);
  if (Status s = node->StartKubelet(); !s.ok()) return fail(s);
  if (Status s = node->StartKubeProxy(); !s.ok()) return fail(s);
  if (Status s = node->WaitReady(node->options_.start_timeout); !s.ok()) return fail(s);
  return node;
}

KubeNode::~KubeNode() {
  const bool failed = ::testing::Test::HasFailure();
  if (failed) {
    std::cerr << "---- the real node's logs (" << options_.name << ") ----\n"
              << LogTails(16384) << "\n";
  }
  Teardown();
}

Status KubeNode::LockMachine() {
  const char* path = "/run/lock/granary-kubenode.lock";
  if (::mkdir("/run/lock", 0755) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "mkdir /run/lock");
  }
  lock_fd_ = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) return Status::FromErrno(errno, std::string("open ") + path);
  const auto deadline = steady_clock::now() + options_.start_timeout;
  bool said = false;
  while (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      return Status::FromErrno(errno, std::string("lock ") + path);
    }
    if (!said) {
      std::cerr << "KubeNode: another real node runs on this machine (" << path
                << " is locked); waiting for it to stop" << std::endl;
      said = true;
    }
    if (steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded(
          std::string("another real node (a test or scripts/kubelet-probe) held ") + path +
          " for longer than the start time-out; one kubelet at a time runs on a machine");
    }
    std::this_thread::sleep_for(milliseconds(500));
  }
  return Status::Ok();
}

Status KubeNode::MakeNetwork() {
  GRANARY_ASSIGN_OR_RETURN(network_, NetnsHosts::Create(1));
  netns_ = network_->host(0).netns;
  node_ip_ = network_->host(0).address;
  host_ip_ = network_->bridge_address();
  // The root namespace reaches pods and Services through the node; both
  // routes go with the bridge.
  for (const std::string& cidr : {pod_cidr_, std::string(kServiceCidr)}) {
    Result<std::string> r =
        RunCommand({IpBinary(), "route", "add", cidr, "via", node_ip_, "dev", network_->bridge()});
    if (!r.ok()) {
      return r.status().WithContext("route " + cidr + " to the node (is " + cidr +
                                    " already routed on this machine?)");
    }
  }
  // As on any host, a default route: a host-network process's connection to
  // a Service address needs a route before kube-proxy's rules rewrite it.
  if (Result<std::string> r =
          RunCommand({IpBinary(), "-n", netns_, "route", "add", "default", "via", host_ip_});
      !r.ok()) {
    return r.status().WithContext("the node's default route");
  }
  // The node forwards between its pods, its link and Services.
  auto sysctl = [&](const std::string& setting) {
    return RunCommand(
        {"nsenter", "--net=/run/netns/" + netns_, "--", "sysctl", "-q", "-w", setting});
  };
  if (Result<std::string> r = sysctl("net.ipv4.ip_forward=1"); !r.ok()) {
    return r.status().WithContext("let the node forward");
  }
  // Its bridge's traffic passes iptables: a pod reaching a Service whose
  // endpoint is a pod on the same bridge. None of the tests' flows needs it
  // (theirs are routed: pods to the API server, the API server to a
  // webhook), so a machine without bridge netfilter only gets a warning.
  (void)RunCommand({"modprobe", "br_netfilter"});
  if (Result<std::string> r = sysctl("net.bridge.bridge-nf-call-iptables=1"); !r.ok()) {
    std::cerr << "KubeNode: no bridge netfilter here (" << r.status().ToString()
              << "); a pod reaching a Service served by a pod on the same node will not work"
              << std::endl;
  }
  return Status::Ok();
}

Status KubeNode::MakeWorkDir() {
  for (const char* sub : {"containerd", "cni", "cni-ipam", "kubelet", "pod-logs", "log"}) {
    const std::string path = dir_.Join(sub);
    if (::mkdir(path.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + path);
  }
  // Bidirectional mount propagation (a sidecar's FUSE view) needs the
  // kubelet's pod directories on a shared mount; "/" is private here.
  if (::mount(dir_.path().c_str(), dir_.path().c_str(), nullptr, MS_BIND, nullptr) != 0) {
    return Status::FromErrno(errno, "bind-mount " + dir_.path() + " onto itself");
  }
  if (::mount(nullptr, dir_.path().c_str(), nullptr, MS_SHARED | MS_REC, nullptr) != 0) {
    return Status::FromErrno(errno, "make " + dir_.path() + " a shared mount");
  }
  return Status::Ok();
}

Result<std::unique_ptr<DaemonProcess>> KubeNode::StartInNode(const std::string& name,
                                                             const std::string& binary,
                                                             std::vector<std::string> args) {
  DaemonProcessOptions o;
  o.binary = "nsenter";
  o.args = {"--net=/run/netns/" + netns_, "--", binary};
  o.args.insert(o.args.end(), args.begin(), args.end());
  o.log_path = dir_.Join("log/" + name + ".log");
  o.name = name;
  o.fail_on_sanitizer_report = false;
  return DaemonProcess::Start(std::move(o));
}

Status KubeNode::StartContainerd() {
  containerd_socket_ = dir_.Join("containerd/containerd.sock");
  netns_before_ = NetnsList();
  const std::string config =
      "version = 2\n"
      "root = \"" +
      dir_.Join("containerd/root") +
      "\"\n"
      "state = \"" +
      dir_.Join("containerd/state") +
      "\"\n"
      "[grpc]\n  address = \"" +
      containerd_socket_ +
      "\"\n"
      "[ttrpc]\n  address = \"" +
      containerd_socket_ +
      ".ttrpc\"\n"
      "[debug]\n  address = \"\"\n"
      "[metrics]\n  address = \"\"\n"
      "[plugins.\"io.containerd.grpc.v1.cri\"]\n"
      "  sandbox_image = \"" +
      kPauseImage +
      "\"\n"
      // The kernel here refuses lowering oom_score_adj; without this runc
      // fails every sandbox ("can't get final child's PID from pipe").
      "  restrict_oom_score_adj = true\n"
      "  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n"
      "    bin_dir = \"/usr/lib/cni\"\n"
      "    conf_dir = \"" +
      dir_.Join("cni") + "\"\n";
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(dir_.Join("containerd/config.toml"), config, 0644));
  GRANARY_ASSIGN_OR_RETURN(
      containerd_,
      StartInNode("containerd", "containerd", {"--config", dir_.Join("containerd/config.toml")}));
  const auto deadline = steady_clock::now() + milliseconds(30000);
  while (true) {
    if (!containerd_->Running()) {
      return Status::Unavailable("containerd exited as it started: " + containerd_->LogTail(4096));
    }
    KubectlResult r = Ctr({"version"});
    if (r.ok()) break;
    if (steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded("containerd did not answer on " + containerd_socket_ +
                                      " within 30 s: " + r.Describe());
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  Result<std::string> pause = RunCommand({SourceDir() + "/scripts/image/pause"}, kCommandTimeout);
  if (!pause.ok()) return pause.status().WithContext("make the pause image");
  KubectlResult imported = Ctr({"images", "import", Trim(*pause)});
  if (!imported.ok()) return Status::Unavailable("import the pause image: " + imported.Describe());
  return Status::Ok();
}

KubectlResult KubeNode::Ctr(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"ctr", "--address", containerd_socket_, "-n", "k8s.io"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, {}, "", dir_.path(), kCommandTimeout);
}

Status KubeNode::LoadImage(const std::string& archive, const std::string& name) {
  KubectlResult r = RunProgram({SourceDir() + "/scripts/image/load-containerd", "--address",
                                containerd_socket_, archive, name},
                               {}, "", dir_.path(), milliseconds(300000));
  if (!r.ok()) return Status::Unavailable("load " + archive + " as " + name + ": " + r.Describe());
  return Status::Ok();
}

Status KubeNode::WriteCniConfig() {
  const std::string gateway = pod_cidr_.substr(0, pod_cidr_.rfind('.')) + ".1";
  const nlohmann::json conf = {{"cniVersion", "1.0.0"},
                               {"name", "granary-test"},
                               {"plugins",
                                {{{"type", "bridge"},
                                  {"bridge", "granary0"},
                                  {"isGateway", true},
                                  {"ipMasq", false},
                                  {"hairpinMode", true},
                                  {"ipam",
                                   {{"type", "host-local"},
                                    {"dataDir", dir_.Join("cni-ipam")},
                                    {"ranges", {{{{"subnet", pod_cidr_}, {"gateway", gateway}}}}},
                                    {"routes", {{{"dst", "0.0.0.0/0"}}}}}}},
                                 {{"type", "loopback"}}}}};
  return WriteFileAtomically(dir_.Join("cni/10-granary.conflist"), conf.dump(2), 0644);
}

Status KubeNode::StartKubelet() {
  if (kubelet_kubeconfig_.empty()) {
    GRANARY_ASSIGN_OR_RETURN(
        kubelet_kubeconfig_,
        cluster_->ClientKubeconfig("kubelet-" + options_.name,
                                   "/O=system:nodes/CN=system:node:" + options_.name));
    const std::string config =
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        // This machine has cgroup v1 controllers; v1.37 runs on them when told.
        "failCgroupV1: false\n"
        "cgroupDriver: cgroupfs\n"
        "address: " +
        node_ip_ +
        "\n"
        "port: 10250\n"
        "readOnlyPort: 0\n"
        "healthzBindAddress: 127.0.0.1\n"
        "healthzPort: 10248\n"
        // A test node: its API (logs, exec) answers anyone who reaches the
        // node's address.
        "authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}\n"
        "authorization: {mode: AlwaysAllow}\n"
        "containerRuntimeEndpoint: unix://" +
        containerd_socket_ +
        "\n"
        "clusterDomain: cluster.local\n"
        "failSwapOn: false\n"
        "enforceNodeAllocatable: []\n"
        // The kubelet cannot size the private containerd's image filesystem
        // and would otherwise think the disk full.
        "evictionHard: {memory.available: \"10Mi\", nodefs.available: \"1%\", "
        "imagefs.available: \"1%\"}\n"
        "imageGCHighThresholdPercent: 100\n"
        "imageGCLowThresholdPercent: 99\n"
        "serializeImagePulls: false\n"
        "nodeStatusUpdateFrequency: 4s\n"
        "syncFrequency: 10s\n"
        "podLogsDir: " +
        dir_.Join("pod-logs") + "\n";
    GRANARY_RETURN_IF_ERROR(WriteFileAtomically(dir_.Join("kubelet.yaml"), config, 0644));
  }
  std::string labels;
  for (const auto& [k, v] : options_.labels) labels += (labels.empty() ? "" : ",") + k + "=" + v;
  std::vector<std::string> args = {"--config=" + dir_.Join("kubelet.yaml"),
                                   "--kubeconfig=" + kubelet_kubeconfig_,
                                   "--root-dir=" + dir_.Join("kubelet"),
                                   "--hostname-override=" + options_.name,
                                   "--node-ip=" + node_ip_,
                                   "-v=1"};
  if (!labels.empty()) args.push_back("--node-labels=" + labels);
  GRANARY_ASSIGN_OR_RETURN(kubelet_, StartInNode("kubelet", tools_dir_ + "/kubelet", args));
  return Status::Ok();
}

Status KubeNode::StartKubeProxy() {
  GRANARY_ASSIGN_OR_RETURN(
      const std::string kubeconfig,
      cluster_->ClientKubeconfig("kube-proxy-" + options_.name, "/CN=system:kube-proxy"));
  const std::string config =
      "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
      "kind: KubeProxyConfiguration\n"
      "clientConnection: {kubeconfig: " +
      kubeconfig +
      "}\n"
      "mode: iptables\n"
      "clusterCIDR: " +
      pod_cidr_ +
      "\n"
      "hostnameOverride: " +
      options_.name +
      "\n"
      "bindAddress: " +
      node_ip_ +
      "\n"
      "healthzBindAddress: 127.0.0.1:10256\n"
      "metricsBindAddress: 127.0.0.1:10249\n"
      // The conntrack table's size is the machine's, not the node's.
      "conntrack: {maxPerCore: 0, min: 0}\n";
  GRANARY_RETURN_IF_ERROR(WriteFileAtomically(dir_.Join("kube-proxy.yaml"), config, 0644));
  GRANARY_ASSIGN_OR_RETURN(kube_proxy_,
                           StartInNode("kube-proxy", tools_dir_ + "/kube-proxy",
                                       {"--config=" + dir_.Join("kube-proxy.yaml"), "-v=1"}));
  return Status::Ok();
}

Status KubeNode::WaitReady(milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  std::string last = "not registered";
  while (true) {
    for (DaemonProcess* d : {containerd_.get(), kubelet_.get(), kube_proxy_.get()}) {
      if (d != nullptr && !d->Running()) {
        return Status::Unavailable(
            d->name() + " exited (" +
            (d->exit_status() ? d->exit_status()->ToString() : std::string("?")) +
            ") before node " + options_.name + " was Ready: " + d->LogTail(4096));
      }
    }
    Result<nlohmann::json> node = cluster_->ApiRequest("GET", "/api/v1/nodes/" + options_.name);
    if (node.ok()) {
      for (const nlohmann::json& c : node->value("status", nlohmann::json::object())
                                         .value("conditions", nlohmann::json::array())) {
        if (c.value("type", "") != "Ready") continue;
        if (c.value("status", "") == "True") return Status::Ok();
        last = c.value("status", "") + " " + c.value("reason", "") + ": " + c.value("message", "");
      }
    }
    if (steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded("node " + options_.name + " was not Ready within " +
                                      std::to_string(timeout.count()) + " ms (last: " + last + ")");
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
}

Status KubeNode::RestartKubelet() {
  if (kubelet_ != nullptr) (void)kubelet_->Terminate(kStopTimeout);
  kubelet_.reset();
  GRANARY_RETURN_IF_ERROR(StartKubelet());
  return WaitReady(options_.start_timeout);
}

std::string KubeNode::LogTails(size_t max_bytes) const {
  std::string out;
  for (const DaemonProcess* d : {containerd_.get(), kubelet_.get(), kube_proxy_.get()}) {
    if (d == nullptr) continue;
    out += "---- " + d->name() + " ----\n" + d->LogTail(max_bytes) + "\n";
  }
  return out;
}

void KubeNode::StopContainers() {
  if (containerd_ == nullptr || !containerd_->Running()) return;
  auto ids = [&](const std::vector<std::string>& what) {
    std::vector<std::string> out;
    KubectlResult r = Ctr(what);
    std::istringstream in(r.out);
    std::string line;
    while (std::getline(in, line)) {
      line = Trim(line);
      if (!line.empty()) out.push_back(line);
    }
    return out;
  };
  for (const std::string& task : ids({"tasks", "ls", "-q"})) {
    (void)Ctr({"tasks", "kill", "-s", "SIGKILL", task});
  }
  for (const std::string& task : ids({"tasks", "ls", "-q"})) {
    (void)Ctr({"tasks", "rm", "-f", task});
  }
  for (const std::string& c : ids({"containers", "ls", "-q"})) (void)Ctr({"containers", "rm", c});
}

void KubeNode::Teardown() {
  if (kube_proxy_ != nullptr) (void)kube_proxy_->Terminate(kStopTimeout);
  if (kubelet_ != nullptr) (void)kubelet_->Terminate(kStopTimeout);
  StopContainers();
  if (containerd_ != nullptr) (void)containerd_->Terminate(kStopTimeout);
  // Shims outlive a containerd that stops; theirs name its socket.
  (void)RunCommand(
      {"pkill", "-9", "-f", "containerd-shim-runc-v2 .*-address " + containerd_socket_});
  // The pods' network namespaces (containerd's /run/netns/cni-*).
  std::set<std::string> before(netns_before_.begin(), netns_before_.end());
  if (containerd_ != nullptr) {
    for (const std::string& ns : NetnsList()) {
      if (before.count(ns) == 0 && ns.rfind("cni-", 0) == 0) {
        (void)RunCommand({IpBinary(), "netns", "del", ns});
      }
    }
  }
  if (Status s = DetachMountsUnder(dir_.path()); !s.ok()) ADD_FAILURE() << s.ToString();
  if (DIR* d = ::opendir("/sys/fs/cgroup")) {
    std::vector<std::string> hierarchies;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") hierarchies.push_back("/sys/fs/cgroup/" + name);
    }
    ::closedir(d);
    for (const std::string& h : hierarchies) RemoveCgroupTree(h + "/kubepods");
  }
  cluster_.reset();
  network_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
  lock_fd_ = -1;
}

}  // namespace granary::testing

#pragma once

// KubeNode: a real Kubernetes node beside the tests' control plane. Pods run
// in containers: a private containerd (its CRI plugin) with runc, kubelet
// and kube-proxy built by `scripts/k8s-tools --node`, pod networking from
// Debian's CNI plugins (bridge + host-local).
//
//   KubeNodeOptions o;
//   o.images = {{archive, "granary:0.1.0"}};
//   auto node = KubeNode::Start(o);                   // ~15 s; the Node is Ready
//   KubeCluster& cluster = (*node)->cluster();        // kubectl, helm, ... as usual
//
// The node lives in a network namespace of its own (NetnsHosts with one
// host), so kube-proxy's iptables rules, the CNI bridge and the pods' veths
// are all inside it and go with it:
//
//   root namespace                       the node's namespace
//   kube-apiserver on 10.x.y.1 --bridge-- 10.x.y.2: containerd, kubelet, kube-proxy,
//   routes: pod CIDR and Service CIDR         hostNetwork pods; bridge granary0
//   via 10.x.y.2                              10.245.0.1/24 to the pods' veths
//
// The control plane (KubeCluster) is started here with its API server on the
// root namespace's bridge address, which pods reach through the `kubernetes`
// Service (kube-proxy) and the test reaches directly; the API server reaches
// Services (a webhook's) through the route to the node, where kube-proxy
// translates them. The kubelet, containerd and kube-proxy enter only the
// node's network namespace (nsenter --net), not a mount namespace of their
// own, so the kubelet's volume mounts are the ones containerd sees, and they
// stay in one work directory, a shared mount (Bidirectional propagation
// needs it) (a TempDir, /tmp/granary-test-*).
//
// The kubelet authenticates as system:node:<name> (the Node authorizer),
// kube-proxy as system:kube-proxy; the kubelet's own API (logs, exec) takes
// anonymous requests on the node's address (a test node only). Its cgroups
// are the cgroupfs driver's `kubepods` tree (cgroup v1 controllers here:
// failCgroupV1 false); two KubeNodes cannot run at once on one machine (the
// suites run RUN_SERIAL), nor beside scripts/kubelet-probe: Start takes
// an exclusive lock on /run/lock/granary-kubenode.lock for the node's life,
// waiting for another test's node to stop (bounded by start_timeout).
//
// No registry is reached: the pause image is built by scripts/image/pause,
// and every image a pod names must be loaded first (options.images, or
// LoadImage) under the name its pod spec gives; pods say imagePullPolicy
// IfNotPresent or Never.
//
// The destructor (also after a Start that failed half way) stops kube-proxy
// and the kubelet, kills every container and sandbox containerd runs, stops
// containerd and the shims, detaches every mount under the work directory,
// removes the pods' network namespaces, the `kubepods` cgroups and the node's
// namespace, and stops the control plane; scripts/check-test-leftovers checks
// that nothing is left.
//
// Needs root, containerd, ctr, runc, containerd-shim-runc-v2, nsenter,
// iptables, Debian's CNI plugins in /usr/lib/cni, gcc (the pause image),
// `ip netns`, and the node tools; Unavailable() says what is missing.

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "granary/core/status.h"
#include "testing/kube_cluster.h"
#include "testing/netns_hosts.h"
#include "testing/test_util.h"

namespace granary::testing {

struct KubeNodeOptions {
  std::string name = "granary-node-1";
  // Node labels (the kubelet's --node-labels).
  std::map<std::string, std::string> labels = {{"granary.io/nvme", "true"}};
  // OCI archives to load into the node's containerd, each under the name
  // pods give it ({archive, "granary:0.1.0"}).
  std::vector<std::pair<std::string, std::string>> images;
  // The control plane's options; api_address is set here. Default: no fake
  // nodes (kwok's) beside the real one.
  KubeClusterOptions cluster = NoFakeNodes();
  std::chrono::milliseconds start_timeout{120000};

  static KubeClusterOptions NoFakeNodes() {
    KubeClusterOptions o;
    o.nodes.clear();
    return o;
  }
};

class KubeNode {
 public:
  // Why a real node cannot run here (not root, a tool missing), or nullopt.
  static std::optional<std::string> Unavailable();

  // The image the chart names (granary:0.1.0), assembled by
  // scripts/image/assemble from `build_dir`'s binaries into
  // <build_dir>/image/granary_0.1.0.oci.tar unless that archive is newer
  // than every binary it holds. Its path. `trainer`: the training image
  // (granary-trainer:0.1.0, the same plus Debian's python3-torch) instead.
  static Result<std::string> GranaryImage(const std::string& build_dir, bool trainer = false);

  // The node's network namespace, the control plane, containerd (with the
  // images loaded), the kubelet and kube-proxy; returns once the Node is
  // Ready. On failure everything started so far is stopped and removed, and
  // the error carries the daemons' log tails.
  static Result<std::unique_ptr<KubeNode>> Start(KubeNodeOptions options = {});

  ~KubeNode();
  KubeNode(const KubeNode&) = delete;
  KubeNode& operator=(const KubeNode&) = delete;

  KubeCluster& cluster() { return *cluster_; }
  const std::string& name() const { return options_.name; }
  // The node's InternalIP (its namespace's address on the bridge).
  const std::string& node_ip() const { return node_ip_; }
  // The pods' subnet ("10.245.0.0/24").
  const std::string& pod_cidr() const { return pod_cidr_; }
  const std::string& netns() const { return netns_; }
  // The root namespace's address on the bridge: the API server's, and where
  // a server of the test's listens for pods to reach it.
  const std::string& host_ip() const { return host_ip_; }
  const std::string& dir() const { return dir_.path(); }
  const std::string& containerd_socket() const { return containerd_socket_; }

  // Loads an OCI archive into the node's containerd under `name` (and the
  // fully qualified name the kubelet resolves it to).
  Status LoadImage(const std::string& archive, const std::string& name);

  // `ctr -n k8s.io <args>` against the node's containerd.
  KubectlResult Ctr(const std::vector<std::string>& args) const;

  // Stops the kubelet (SIGTERM) and starts it again with the same
  // configuration; running containers are left running meanwhile, as on a
  // node whose kubelet restarts. Waits for the Node to be Ready again.
  Status RestartKubelet();

  // Waits until the Node reports Ready (bounded).
  Status WaitReady(std::chrono::milliseconds timeout);

  // The tails of containerd's, the kubelet's and kube-proxy's logs.
  std::string LogTails(size_t max_bytes = 4096) const;

 private:
  explicit KubeNode(KubeNodeOptions options);
  Status LockMachine();
  Status MakeNetwork();
  Status MakeWorkDir();
  Status StartContainerd();
  Status WriteCniConfig();
  Status StartKubelet();
  Status StartKubeProxy();
  Result<std::unique_ptr<DaemonProcess>> StartInNode(const std::string& name,
                                                     const std::string& binary,
                                                     std::vector<std::string> args);
  void Teardown();
  void StopContainers();

  KubeNodeOptions options_;
  TempDir dir_;
  std::unique_ptr<NetnsHosts> network_;
  std::unique_ptr<KubeCluster> cluster_;
  std::string netns_;
  std::string node_ip_;
  std::string host_ip_;
  std::string pod_cidr_ = "10.245.0.0/24";
  std::string containerd_socket_;
  std::string kubelet_kubeconfig_;
  std::string tools_dir_;
  std::vector<std::string> netns_before_;  // `ip netns list` before containerd ran
  std::unique_ptr<DaemonProcess> containerd_;
  std::unique_ptr<DaemonProcess> kubelet_;
  std::unique_ptr<DaemonProcess> kube_proxy_;
  int lock_fd_ = -1;  // the machine-wide lock, held while the node exists
};

}  // namespace granary::testing

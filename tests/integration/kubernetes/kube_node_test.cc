// The real node itself (tests/testing/kube_node.h): a kubelet registered with
// the tests' control plane runs Granary's image in containers with pod
// networking, kube-proxy routes Services (from the API server's side and
// from pods), a kubelet restart leaves running pods running, and stopping
// the node leaves nothing behind. One node serves the whole binary (ctest
// runs it as one test); the last case stops it.

#include "testing/kube_node.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "testing/fuse_mounts.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

class KubeNodeTest : public SharedKubeTest<KubeNodeTest> {
 public:
  static std::string SkipReason() {
    std::optional<std::string> why = KubeNode::Unavailable();
    return why ? *why : std::string();
  }
  static Status StartShared() {
    GRANARY_ASSIGN_OR_RETURN(const std::string image, KubeNode::GranaryImage(GRANARY_BUILD_DIR));
    KubeNodeOptions o;
    o.images = {{image, "granary:0.1.0"}};
    // A fake node of kwok's beside the real one, as suites of many nodes
    // would have.
    o.cluster.nodes = {{"gpu-fake-1", {{"nvidia.com/gpu.present", "true"}}}};
    const auto start = std::chrono::steady_clock::now();
    GRANARY_ASSIGN_OR_RETURN(node_, KubeNode::Start(o));
    std::cout << "KubeNode::Start took "
              << std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start)
                     .count()
              << " ms (node " << node_->node_ip() << ", API server " << node_->cluster().server()
              << ")" << std::endl;
    return Status::Ok();
  }
  static void StopShared() { node_.reset(); }
  static void PrintLogsIfFailed() {
    if (node_ != nullptr && ::testing::Test::HasFailure()) {
      node_->cluster().PrintLogsIfTestFailed();
      std::cerr << node_->LogTails(8192);
    }
  }

 protected:
  KubeCluster& cluster() { return node_->cluster(); }

  // Waits until pod `name` in `ns` is Running with every container ready.
  json WaitRunning(const std::string& ns, const std::string& name) {
    json pod;
    Status s = cluster().WaitFor(
        [&] {
          Result<json> p =
              cluster().ApiRequest("GET", "/api/v1/namespaces/" + ns + "/pods/" + name);
          if (!p.ok()) return false;
          pod = *p;
          if (pod["status"].value("phase", "") != "Running") return false;
          for (const json& c : pod["status"].value("containerStatuses", json::array())) {
            if (!c.value("ready", false)) return false;
          }
          return true;
        },
        milliseconds(90000), "pod " + ns + "/" + name + " Running");
    EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << pod.dump(2);
    return pod;
  }

  // The Kubernetes release of the tools in use ("v1.37.2"), from `kubelet
  // --version` ("Kubernetes v1.37.2"): scripts/k8s-tools builds one release
  // per directory, and `make test-k8s-versions` runs this suite on an older one.
  std::string ToolsVersion() {
    KubectlResult r = RunProgram({cluster().Tool("kubelet"), "--version"}, {}, "",
                                 cluster().tools_dir(), milliseconds(30000));
    EXPECT_TRUE(r.ok()) << r.Describe();
    const std::string prefix = "Kubernetes ";
    std::string version = r.out.rfind(prefix, 0) == 0 ? r.out.substr(prefix.size()) : r.out;
    while (!version.empty() && std::isspace(static_cast<unsigned char>(version.back()))) {
      version.pop_back();
    }
    EXPECT_EQ(version.rfind("v1.", 0), 0u) << "kubelet --version said: " << r.out;
    return version;
  }

  static std::unique_ptr<KubeNode> node_;
};
std::unique_ptr<KubeNode> KubeNodeTest::node_;

constexpr const char* kServerPod = R"yaml(apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
  labels: {app: web}
spec:
  nodeName: granary-node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: granary:0.1.0
    imagePullPolicy: Never
    command: ["python3", "-c"]
    args:
    - |
      import http.server, os
      class H(http.server.BaseHTTPRequestHandler):
          def do_GET(self):
              body = ("uid=%d" % os.getuid()).encode()
              self.send_response(200); self.end_headers(); self.wfile.write(body)
      http.server.HTTPServer(("", 8080), H).serve_forever()
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
    securityContext: {runAsUser: 65532, runAsGroup: 65532, readOnlyRootFilesystem: true,
                      allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
)yaml";

TEST_F(KubeNodeTest, TheNodeIsARealKubeletRegisteredWithTheControlPlane) {
  Result<json> node = cluster().ApiRequest("GET", "/api/v1/nodes/" + node_->name());
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  const json& info = (*node)["status"]["nodeInfo"];
  EXPECT_EQ(info.value("kubeletVersion", ""), ToolsVersion());
  EXPECT_NE(info.value("containerRuntimeVersion", "").find("containerd://"), std::string::npos)
      << info.dump();
  EXPECT_EQ((*node)["metadata"]["labels"].value("granary.io/nvme", ""), "true");
  bool internal_ip = false;
  for (const json& a : (*node)["status"].value("addresses", json::array())) {
    if (a.value("type", "") == "InternalIP" && a.value("address", "") == node_->node_ip()) {
      internal_ip = true;
    }
  }
  EXPECT_TRUE(internal_ip) << (*node)["status"].dump();
  // kwok's fake node stands beside it, Ready with its status faked.
  Result<json> fake = cluster().ApiRequest("GET", "/api/v1/nodes/gpu-fake-1");
  ASSERT_TRUE(fake.ok()) << fake.status().ToString();
  EXPECT_EQ((*fake)["metadata"]["annotations"].value("kwok.x-k8s.io/node", ""), "fake");
  // No kwok annotation: nothing fakes this node's status.
  EXPECT_FALSE(
      (*node)["metadata"].value("annotations", json::object()).contains("kwok.x-k8s.io/node"));
}

TEST_F(KubeNodeTest, APodRunsInAContainerAndAServiceReachesItThroughKubeProxy) {
  cluster().MustKubectl({"apply", "-f", "-"}, kServerPod);
  json pod = WaitRunning("default", "web");
  const std::string pod_ip = pod["status"].value("podIP", "");
  ASSERT_EQ(pod_ip.rfind("10.245.0.", 0), 0u)
      << "pod IP " << pod_ip << " not in " << node_->pod_cidr();
  Result<json> svc = cluster().GetJson({"service", "web", "-n", "default"});
  ASSERT_TRUE(svc.ok()) << svc.status().ToString();
  const std::string cluster_ip = (*svc)["spec"].value("clusterIP", "");
  // From the root namespace (where the API server is) to the Service's
  // address: kube-proxy's rules in the node translate it to the pod.
  std::string body;
  Status reached = cluster().WaitFor(
      [&] {
        httplib::Client http(cluster_ip, 80);
        http.set_connection_timeout(1, 0);
        http.set_read_timeout(2, 0);
        httplib::Result r = http.Get("/");
        if (!r || r->status != 200) return false;
        body = r->body;
        return true;
      },
      milliseconds(30000), "GET http://" + cluster_ip + "/ through kube-proxy");
  ASSERT_TRUE(reached.ok()) << reached.ToString() << "\n" << node_->LogTails();
  // The container ran as its securityContext says.
  EXPECT_EQ(body, "uid=65532");
  cluster().MustKubectl({"delete", "pod", "web", "-n", "default", "--wait=true"});
}

// A pod reaches the API server as in-cluster clients do: the `kubernetes`
// Service's address and its ServiceAccount token.
TEST_F(KubeNodeTest, APodReachesTheApiServerThroughTheKubernetesService) {
  cluster().MustKubectl({"apply", "-f", "-"}, R"yaml(apiVersion: v1
kind: Pod
metadata: {name: in-cluster, namespace: default}
spec:
  nodeName: granary-node-1
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: granary:0.1.0
    imagePullPolicy: Never
    command: ["python3", "-c"]
    args:
    - |
      import json, os, ssl, urllib.request
      sa = "/var/run/secrets/kubernetes.io/serviceaccount"
      ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
      host = os.environ["KUBERNETES_SERVICE_HOST"]
      req = urllib.request.Request("https://%s/version" % host,
          headers={"Authorization": "Bearer " + open(sa + "/token").read()})
      print("version", json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"])
)yaml");
  std::string phase;
  Status done = cluster().WaitFor(
      [&] {
        Result<json> p = cluster().ApiRequest("GET", "/api/v1/namespaces/default/pods/in-cluster");
        if (!p.ok()) return false;
        phase = (*p)["status"].value("phase", "");
        return phase == "Succeeded" || phase == "Failed";
      },
      milliseconds(90000), "pod in-cluster to finish");
  ASSERT_TRUE(done.ok()) << done.ToString();
  KubectlResult logs = cluster().Kubectl({"logs", "in-cluster", "-n", "default"});
  EXPECT_EQ(phase, "Succeeded") << logs.out << logs.err;
  EXPECT_NE(logs.out.find("version " + ToolsVersion()), std::string::npos)
      << logs.Describe() << logs.out;
  cluster().MustKubectl({"delete", "pod", "in-cluster", "-n", "default", "--wait=true"});
}

TEST_F(KubeNodeTest, AKubeletRestartLeavesItsPodsRunning) {
  cluster().MustKubectl({"apply", "-f", "-"}, kServerPod);
  json before = WaitRunning("default", "web");
  const std::string started =
      before["status"]["containerStatuses"][0]["state"]["running"].value("startedAt", "");
  ASSERT_FALSE(started.empty()) << before.dump(2);
  ASSERT_TRUE(node_->RestartKubelet().ok());
  json after = WaitRunning("default", "web");
  const json& status = after["status"]["containerStatuses"][0];
  EXPECT_EQ(status.value("restartCount", -1), 0) << status.dump(2);
  EXPECT_EQ(status["state"]["running"].value("startedAt", ""), started) << status.dump(2);
  cluster().MustKubectl({"delete", "pod", "web", "-n", "default", "--wait=true"});
}

// Last: stops the node and checks what it leaves.
TEST_F(KubeNodeTest, StoppingTheNodeLeavesNothingBehind) {
  cluster().MustKubectl({"apply", "-f", "-"}, kServerPod);
  WaitRunning("default", "web");
  const std::string dir = node_->dir();
  const std::string netns = node_->netns();
  const std::string socket = node_->containerd_socket();
  node_.reset();
  struct stat st {};
  EXPECT_NE(::stat(dir.c_str(), &st), 0) << dir << " is still there";
  Result<std::vector<MountEntry>> mounts = ListMounts();
  ASSERT_TRUE(mounts.ok()) << mounts.status().ToString();
  for (const MountEntry& m : *mounts) {
    EXPECT_NE(m.mount_point.rfind(dir, 0), 0u) << "a mount is left: " << m.mount_point;
  }
  Result<std::string> netns_list = RunCommand({IpBinary(), "netns", "list"});
  ASSERT_TRUE(netns_list.ok());
  EXPECT_EQ(netns_list->find(netns), std::string::npos) << *netns_list;
  EXPECT_EQ(netns_list->find("cni-"), std::string::npos) << *netns_list;
  Result<std::string> shims = RunCommand({"pgrep", "-af", "containerd-shim"});
  if (shims.ok()) {
    EXPECT_EQ(shims->find(socket), std::string::npos) << *shims;
  }
  for (const char* h : {"cpu", "memory", "pids", "systemd"}) {
    const std::string kubepods = std::string("/sys/fs/cgroup/") + h + "/kubepods";
    EXPECT_NE(::stat(kubepods.c_str(), &st), 0) << kubepods << " is still there";
  }
}

}  // namespace
}  // namespace granary::testing

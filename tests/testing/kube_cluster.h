#pragma once

// KubeCluster: a real Kubernetes control plane on 127.0.0.1 for the
// Kubernetes suites (operator, webhook, chart): etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler built from the published Go
// modules by scripts/k8s-tools, and kwok keeping fake GPU nodes Ready and
// moving the pods bound to them to Running. Granary's own pods on those nodes
// are run for real by PodRunner (testing/pod_runner.h).
//
//   auto cluster = KubeCluster::Start();               // ~4 s; nodes Ready when it returns
//   KubectlResult r = (*cluster)->Kubectl({"apply", "-f", "-"}, yaml);
//   auto pods = (*cluster)->GetJson({"pods", "-n", "ns"});  // kubectl get pods -n ns -o json
//   auto kubeconfig = (*cluster)->ServiceAccountKubeconfig("granary-system", "granary-operator");
//
// Everything lives in one TempDir: a throwaway CA and the certificates made
// from it with the openssl command line (the API server's serving
// certificate for IP 127.0.0.1 and DNS localhost; client certificates for the
// admin (CN=granary-admin, O=system:masters), the controller manager
// (system:kube-controller-manager) and the scheduler (system:kube-scheduler);
// the service-account signing key pair), a kubeconfig per client, etcd's data
// and every daemon's log. The API server authorizes with RBAC only, issues
// service-account tokens for `https://kubernetes.default.svc.cluster.local`
// with the audiences of that issuer and `granary`, and allocates Service IPs
// from 10.96.0.0/16. The controller manager runs every default controller
// (the default ServiceAccount, the kube-root-ca.crt ConfigMap, Deployments,
// ReplicaSets, DaemonSets, Jobs, garbage collection, ...) with its own
// credentials, which are in system:masters: minting a token for each
// controller's service account (--use-service-account-credentials, as
// kubeadm runs it) made Start 5 s slower, and the controllers' own RBAC is not
// what Granary's tests test. Nothing serves on the controller manager's or
// the scheduler's ports (--secure-port=0). Every port is a free loopback
// port. The daemons run under DaemonProcess: killed with the test, their logs
// printed if it fails.
//
// Pods on the fake nodes: kwok's "ready" stage reports a pod bound to one
// Running and Ready (its containers running, its init containers completed
// or, for native sidecars, running) with podIP in 10.244.0.0/16, and deletes
// a pod marked for deletion. By default kwok also completes a Job's pods at
// once; options.kwok_completes_job_pods = false leaves that to the test
// (PodRunnerOptions::report_completion).
//
// The fake nodes are Node objects created here with their labels, capacity
// and allocatable (cpu, memory, pods, nvidia.com/gpu) and the annotation
// kwok.x-k8s.io/node=fake, which is what makes kwok manage them (kwok runs
// with --manage-all-nodes=false). They carry no taint, so DaemonSets and
// ordinary pods land on them without tolerations.
//
// Start waits, bounded by options.start_timeout, until /readyz answers ok,
// every fake node is Ready and the `default` ServiceAccount exists in
// `default`; otherwise it fails (kUnavailable/kDeadlineExceeded) with the
// tails of the daemons' logs.
//
// Thread safety: the thread that started the cluster owns it (Start,
// RestartApiServer, PrintLogsIfTestFailed, the destructor). Kubectl, GetJson,
// ApiRequest, WaitFor, ServiceAccountKubeconfig, ApiServerLogTail and the
// accessors may be called from any thread at once (PodRunner polls from its
// own thread); while RestartApiServer runs they fail or time out like any
// client of a stopped API server.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "granary/core/status.h"
#include "testing/daemon_process.h"
#include "testing/test_util.h"

namespace granary::testing {

// A fake node kwok keeps Ready.
struct FakeNode {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string cpu = "32";
  std::string memory = "256Gi";
  std::string gpus = "8";  // nvidia.com/gpu capacity and allocatable
};

struct KubeClusterOptions {
  std::vector<FakeNode> nodes = {
      {"gpu-node-1", {{"nvidia.com/gpu.present", "true"}, {"granary.io/nvme", "true"}}},
      {"gpu-node-2", {{"nvidia.com/gpu.present", "true"}, {"granary.io/nvme", "true"}}},
  };
  std::chrono::milliseconds start_timeout{120000};
  // true: kwok runs with its default pod stages, which mark every Running
  // pod owned by a Job Succeeded at once (its containers never run to their
  // end). false: kwok gets its pod stages from a file this cluster writes
  // (kwok-stages.yaml in dir()): "ready" (Running and Ready, as the default
  // does, but never for a pod whose phase is Succeeded or Failed) and
  // "delete" (a pod marked for deletion is deleted), and no "complete": a
  // Job's pods stay Running until someone (PodRunner with
  // report_completion) writes their terminal status, and only then does the
  // Job controller complete or fail the Job.
  bool kwok_completes_job_pods = true;
  // The address the API server listens on and advertises. 127.0.0.1 for
  // control-plane-only suites; a real node (testing/kube_node.h) needs one
  // its pods can reach, the root namespace's address on the node's bridge:
  // then the `kubernetes` Service's endpoint is that address (the endpoint
  // reconciler runs) and the Node authorizer is on beside RBAC.
  std::string api_address = "127.0.0.1";
};

// What a kubectl command did.
struct KubectlResult {
  int exit_code = -1;  // 128 + signal if a signal ended it; -1 if it could not run or timed out
  std::string out;
  std::string err;

  bool ok() const { return exit_code == 0; }
  // "exit 1: <stderr>" for messages.
  std::string Describe() const;
};

class KubeCluster {
 public:
  // The directory holding the tools: $GRANARY_K8S_BIN if set, else what
  // `<source>/scripts/k8s-tools --no-build` prints. kNotFound saying to run
  // scripts/k8s-tools when they are not built.
  static Result<std::string> ToolsDir();

  static Result<std::unique_ptr<KubeCluster>> Start(KubeClusterOptions options = {});

  // Stops kwok, the scheduler, the controller manager, the API server and
  // etcd (in that order, bounded) and removes the TempDir; also when the test
  // failed (the daemons' logs are printed then).
  ~KubeCluster();
  KubeCluster(const KubeCluster&) = delete;
  KubeCluster& operator=(const KubeCluster&) = delete;

  // The admin kubeconfig (client certificate in system:masters).
  const std::string& kubeconfig_path() const { return kubeconfig_path_; }
  // https://127.0.0.1:PORT
  const std::string& server() const { return server_; }
  uint16_t api_port() const { return api_port_; }
  // The cluster CA's certificate (PEM): what the API server's serving
  // certificate and every client certificate chain to.
  const std::string& ca_file() const { return ca_file_; }
  // The admin client certificate and key (PEM), for clients that do not
  // read kubeconfigs.
  const std::string& admin_cert_file() const { return admin_cert_file_; }
  const std::string& admin_key_file() const { return admin_key_file_; }
  const std::string& dir() const { return dir_.path(); }
  const std::string& tools_dir() const { return tools_dir_; }
  // The tool's path in tools_dir(), e.g. Tool("helm").
  std::string Tool(const std::string& name) const { return tools_dir_ + "/" + name; }
  const KubeClusterOptions& options() const { return options_; }

  // kubectl with the admin kubeconfig; `stdin_text` is its standard input.
  // Bounded: 60 s, after which it is killed (exit_code -1, err says so).
  KubectlResult Kubectl(const std::vector<std::string>& args,
                        const std::string& stdin_text = "") const;
  // Kubectl that must succeed: a test failure naming the command and what
  // kubectl said otherwise. Its stdout.
  std::string MustKubectl(const std::vector<std::string>& args,
                          const std::string& stdin_text = "") const;

  // `kubectl get <args> -o json`, parsed. kNotFound when kubectl says the
  // object is not found; kUnavailable for other failures.
  Result<nlohmann::json> GetJson(const std::vector<std::string>& args) const;

  // One request to the API server with the admin certificate, without a
  // kubectl process (cheap enough to poll): `path` like "/api/v1/pods". The
  // response body parsed as JSON; kNotFound on 404, kAlreadyExists on 409,
  // kUnavailable when the server cannot be reached or answers otherwise.
  Result<nlohmann::json> ApiRequest(const std::string& method, const std::string& path,
                                    const std::string& body = "") const;

  // Polls `condition` (every 200 ms) until it holds: OK, or kDeadlineExceeded
  // naming `what` after `timeout`.
  Status WaitFor(std::function<bool()> condition, std::chrono::milliseconds timeout,
                 const std::string& what) const;

  // Stops kube-apiserver (SIGTERM, bounded) and starts it again with the same
  // port, certificates and etcd, then waits for /readyz (bounded by
  // options.start_timeout). Objects survive: they are in etcd.
  Status RestartApiServer();

  // A kubeconfig (a file in dir()) that authenticates as ServiceAccount
  // `sa` in namespace `ns` with a token from the TokenRequest API
  // (`kubectl create token`, valid 24 h). The ServiceAccount must exist.
  Result<std::string> ServiceAccountKubeconfig(const std::string& ns, const std::string& sa) const;

  // A kubeconfig (a file in dir()) with a client certificate the cluster's
  // CA signs for `subject` ("/O=system:nodes/CN=system:node:n1"): how the
  // kubelet and kube-proxy of a real node authenticate. `name` names the
  // files.
  Result<std::string> ClientKubeconfig(const std::string& name, const std::string& subject);

  // The last `max_bytes` of the API server's log (for messages).
  std::string ApiServerLogTail(size_t max_bytes = 8192) const;
  // The tails of every daemon's log.
  std::string LogTails(size_t max_bytes = 4096) const;

  // Prints the daemons' logs now if the current test has failed (each is
  // printed at most once): for fixtures that keep one cluster for a whole
  // suite, from TearDown().
  void PrintLogsIfTestFailed();

 private:
  explicit KubeCluster(KubeClusterOptions options);
  Status MakePki();
  Status RunOpenssl(const std::vector<std::string>& argv);
  // <dir>/pki/<name>.crt and .key: a P-256 key and a certificate for
  // `subject`, self-signed or signed by the cluster's CA.
  Status MakeCertificate(const std::string& name, const std::string& subject,
                         const std::vector<std::string>& extensions, bool self_signed);
  Status WriteKubeconfig(const std::string& path, const std::string& user_auth) const;
  Status StartEtcd();
  Status StartApiServer();
  Status WaitApiServerReady(std::chrono::steady_clock::time_point deadline);
  Status StartControllers();
  Status StartKwok();
  Status CreateNodes();
  Status WaitClusterReady(std::chrono::steady_clock::time_point deadline);
  Result<std::unique_ptr<DaemonProcess>> StartDaemon(const std::string& tool,
                                                     std::vector<std::string> args);

  KubeClusterOptions options_;
  TempDir dir_;
  std::string tools_dir_;
  uint16_t api_port_ = 0;
  uint16_t etcd_client_port_ = 0;
  uint16_t etcd_peer_port_ = 0;
  std::string server_;
  std::string ca_file_;
  std::string admin_cert_file_;
  std::string admin_key_file_;
  std::string kubeconfig_path_;
  std::vector<std::string> api_server_args_;
  std::unique_ptr<DaemonProcess> etcd_;
  std::unique_ptr<DaemonProcess> api_server_;
  std::unique_ptr<DaemonProcess> controller_manager_;
  std::unique_ptr<DaemonProcess> scheduler_;
  std::unique_ptr<DaemonProcess> kwok_;
  mutable std::atomic<uint64_t> commands_run_{0};  // names each command's files
};

// Runs a program to its end with `stdin_text` as its input, capturing its
// stdout and stderr (through files in `scratch_dir`), killed after
// `timeout`. `env` ("KEY=value") is added to the test's environment. Safe to
// call from any thread (posix_spawn, no code between fork and exec).
KubectlResult RunProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         const std::string& stdin_text, const std::string& scratch_dir,
                         std::chrono::milliseconds timeout);

// The life of a Kubernetes suite whose cases share what SetUpTestSuite starts
// (a control plane, a KubeSuite, servers): derive `class S : public
// SharedKubeTest<S>` and define in S
//   static Status StartShared();      // the shared fixtures; an error fails every case
//   static void StopShared();         // in TearDownTestSuite, also after a failed start
//   static void PrintLogsIfFailed();  // after each case (the fixtures print once)
// and optionally `static std::string SkipReason()` (non-empty: skip every case).
// Every case is skipped, saying why, when the Kubernetes tools are not built,
// and fails with the start's error when the start failed.
template <typename Suite>
class SharedKubeTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    Skip().clear();  // a derived suite runs this again
    Error().clear();
    if (std::string why = Suite::SkipReason(); !why.empty()) {
      Skip() = why;
      return;
    }
    Result<std::string> tools = KubeCluster::ToolsDir();
    if (!tools.ok()) {
      Skip() = tools.status().ToString();
      return;
    }
    Status started = Suite::StartShared();
    if (!started.ok()) Error() = started.ToString();
  }
  static void TearDownTestSuite() { Suite::StopShared(); }
  static std::string SkipReason() { return {}; }

 protected:
  void SetUp() override {
    if (!Skip().empty()) GTEST_SKIP() << Skip();
    ASSERT_TRUE(Error().empty()) << Error();
  }
  void TearDown() override { Suite::PrintLogsIfFailed(); }

 private:
  static std::string& Skip() {
    static std::string why;
    return why;
  }
  static std::string& Error() {
    static std::string why;
    return why;
  }
};

}  // namespace granary::testing

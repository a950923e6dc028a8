#include "testing/kube_cluster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <thread>

#include "granary/core/file.h"

extern char** environ;

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kKubectlTimeout{60000};
constexpr milliseconds kOpensslTimeout{30000};
constexpr milliseconds kStopTimeout{15000};
constexpr milliseconds kApiServerStopTimeout{5000};
constexpr const char* kIssuer = "https://kubernetes.default.svc.cluster.local";

std::string Tail(const std::string& text, size_t max_bytes) {
  return text.size() <= max_bytes ? text : text.substr(text.size() - max_bytes);
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

// kwok's pod stages when it is not to complete Job pods
// (KubeClusterOptions::kwok_completes_job_pods = false). kwok v0.7.0 uses
// the pod stages of its configuration instead of all of its default ones
// (pod-ready, pod-complete, pod-delete in kustomize/stage/pod/fast), so this
// repeats "ready" and "delete" as they are there and leaves out "complete".
// "ready" also skips a pod whose phase is terminal: the test writes that
// status (with podIP kept, which already keeps "ready" off it) and kwok is
// not to make such a pod Running again.
constexpr const char* kKwokPodStagesWithoutComplete = R"yaml(apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: granary-pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'NotIn'
      values:
      - 'Succeeded'
      - 'Failed'
  next:
    statusTemplate: |
      {{ $now := Now }}

      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      {{ range .spec.readinessGates }}
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: {{ .conditionType | Quote }}
      {{ end }}

      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}

      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        {{ if eq .restartPolicy "Always" }}
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ else }}
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
        {{ end }}
      {{ end }}

      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: granary-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    finalizers:
      empty: true
    delete: true
)yaml";

// A YAML double-quoted scalar (JSON's string syntax is a subset of YAML's).
std::string Quoted(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace

std::string KubectlResult::Describe() const {
  std::string what =
      exit_code < 0 ? std::string("did not run to its end") : "exit " + std::to_string(exit_code);
  const std::string text = Trim(err.empty() ? out : err);
  return what + (text.empty() ? "" : ": " + Tail(text, 4096));
}

KubectlResult RunProgram(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         const std::string& stdin_text, const std::string& scratch_dir,
                         milliseconds timeout) {
  static std::atomic<uint64_t> runs{0};
  KubectlResult result;
  if (argv.empty()) {
    result.err = "run a program: no argv";
    return result;
  }
  const std::string base = scratch_dir + "/run-" + std::to_string(::getpid()) + "-" +
                           std::to_string(runs.fetch_add(1)) + ".";
  const std::string in_path = base + "in", out_path = base + "out", err_path = base + "err";
  auto cleanup = [&] {
    ::unlink(in_path.c_str());
    ::unlink(out_path.c_str());
    ::unlink(err_path.c_str());
  };
  if (Status s = WriteFileAtomically(in_path, stdin_text, 0600); !s.ok()) {
    result.err = "run " + argv[0] + ": " + s.ToString();
    return result;
  }
  Result<ScopedFd> in = OpenFile(in_path, O_RDONLY | O_CLOEXEC);
  Result<ScopedFd> out = OpenFile(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  Result<ScopedFd> err = OpenFile(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (!in.ok() || !out.ok() || !err.ok()) {
    result.err = "run " + argv[0] + ": cannot open its files in " + scratch_dir;
    cleanup();
    return result;
  }

  std::vector<std::string> args = argv;
  std::vector<char*> c_argv;
  for (std::string& a : args) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  std::vector<std::string> environment = ChildEnvironment(env);
  std::vector<char*> c_env;
  for (std::string& e : environment) c_env.push_back(e.data());
  c_env.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in->get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out->get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err->get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = argv[0].find('/') == std::string::npos
                     ? ::posix_spawnp(&pid, c_argv[0], &actions, &attr, c_argv.data(), c_env.data())
                     : ::posix_spawn(&pid, c_argv[0], &actions, &attr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    result.err = "run " + argv[0] + ": " + ErrnoText(rc);
    cleanup();
    return result;
  }

  const auto deadline = steady_clock::now() + timeout;
  int wstatus = 0;
  bool timed_out = false;
  milliseconds pause{2};
  while (true) {
    const pid_t r = ::waitpid(pid, &wstatus, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      result.err = "wait for " + argv[0] + ": " + ErrnoText(errno);
      cleanup();
      return result;
    }
    if (steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
      }
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(50));
  }
  Result<std::string> out_text = ReadFileToString(out_path);
  Result<std::string> err_text = ReadFileToString(err_path);
  result.out = out_text.ok() ? *out_text : std::string();
  result.err = err_text.ok() ? *err_text : std::string();
  cleanup();
  if (timed_out) {
    result.exit_code = -1;
    result.err = argv[0] + " did not end within " + std::to_string(timeout.count()) +
                 " ms; killed it. Its stderr: " + result.err;
  } else if (WIFEXITED(wstatus)) {
    result.exit_code = WEXITSTATUS(wstatus);
  } else {
    result.exit_code = 128 + WTERMSIG(wstatus);
  }
  return result;
}

Result<std::string> KubeCluster::ToolsDir() {
  const std::vector<std::string> needed = {
      "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd", "kwok"};
  const char* env = std::getenv("GRANARY_K8S_BIN");
  std::string dir;
  if (env != nullptr && *env != '\0') {
    dir = env;
  } else {
#ifdef GRANARY_SOURCE_DIR
    const std::string script = std::string(GRANARY_SOURCE_DIR) + "/scripts/k8s-tools";
    KubectlResult r = RunProgram({script, "--no-build"}, {}, "", "/tmp", milliseconds(30000));
    if (r.exit_code != 0) {
      return Status::NotFound("the Kubernetes test tools are not built (" + script +
                              " --no-build: " + r.Describe() + "); run " + script +
                              " once (it builds them into ~/.cache/granary, about 20 minutes)");
    }
    dir = Trim(r.out);
#else
    return Status::NotFound(
        "GRANARY_K8S_BIN is not set and this build does not know the source directory; run "
        "scripts/k8s-tools and set GRANARY_K8S_BIN to the directory it prints");
#endif
  }
  for (const std::string& tool : needed) {
    if (::access((dir + "/" + tool).c_str(), X_OK) != 0) {
      return Status::NotFound("the Kubernetes test tools in " + dir + " lack " + tool +
                              "; run scripts/k8s-tools (it builds them and prints their "
                              "directory, for GRANARY_K8S_BIN)");
    }
  }
  return dir;
}

KubeCluster::KubeCluster(KubeClusterOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<KubeCluster>> KubeCluster::Start(KubeClusterOptions options) {
  std::unique_ptr<KubeCluster> cluster(new KubeCluster(std::move(options)));
  const auto deadline = steady_clock::now() + cluster->options_.start_timeout;
  GRANARY_ASSIGN_OR_RETURN(cluster->tools_dir_, ToolsDir());
  for (const char* sub : {"pki", "etcd", "log", "run"}) {
    const std::string path = cluster->dir_.Join(sub);
    if (::mkdir(path.c_str(), 0700) != 0) return Status::FromErrno(errno, "mkdir " + path);
  }
  GRANARY_RETURN_IF_ERROR(cluster->MakePki());
  GRANARY_RETURN_IF_ERROR(cluster->StartEtcd());
  GRANARY_RETURN_IF_ERROR(cluster->StartApiServer());
  // The controller manager and the scheduler wait for the API server
  // themselves: their start-up overlaps its own (about 3 s). kwok starts once
  // it answers.
  GRANARY_RETURN_IF_ERROR(cluster->StartControllers());
  GRANARY_RETURN_IF_ERROR(cluster->WaitApiServerReady(deadline));
  GRANARY_RETURN_IF_ERROR(cluster->StartKwok());
  GRANARY_RETURN_IF_ERROR(cluster->CreateNodes());
  GRANARY_RETURN_IF_ERROR(cluster->WaitClusterReady(deadline));
  return cluster;
}

KubeCluster::~KubeCluster() {
  for (std::unique_ptr<DaemonProcess>* d :
       {&kwok_, &scheduler_, &controller_manager_, &api_server_, &etcd_}) {
    if (*d != nullptr) {
      (void)(*d)->Terminate(d == &api_server_ ? kApiServerStopTimeout : kStopTimeout);
    }
  }
  PrintLogsIfTestFailed();
}

Status KubeCluster::RunOpenssl(const std::vector<std::string>& argv) {
  KubectlResult r = RunProgram(argv, {}, "", dir_.Join("run"), kOpensslTimeout);
  if (r.exit_code != 0) {
    std::string cmd;
    for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Status::Unavailable("make the test cluster's certificates: " + cmd + ": " +
                               r.Describe() + " (is the openssl command installed?)");
  }
  return Status::Ok();
}

Status KubeCluster::MakeCertificate(const std::string& name, const std::string& subject,
                                    const std::vector<std::string>& extensions, bool self_signed) {
  const std::string pki = dir_.Join("pki");
  std::vector<std::string> argv = {"openssl",
                                   "req",
                                   "-x509",
                                   "-new",
                                   "-newkey",
                                   "ec",
                                   "-pkeyopt",
                                   "ec_paramgen_curve:prime256v1",
                                   "-nodes",
                                   "-keyout",
                                   pki + "/" + name + ".key",
                                   "-out",
                                   pki + "/" + name + ".crt",
                                   "-days",
                                   "7",
                                   "-subj",
                                   subject};
  if (!self_signed) argv.insert(argv.end(), {"-CA", pki + "/ca.crt", "-CAkey", pki + "/ca.key"});
  for (const std::string& e : extensions) {
    argv.push_back("-addext");
    argv.push_back(e);
  }
  return RunOpenssl(argv);
}

namespace {
const std::vector<std::string> kClientCertificate = {
    "basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
    "extendedKeyUsage=clientAuth"};
}  // namespace

Status KubeCluster::MakePki() {
  const std::string pki = dir_.Join("pki");
  GRANARY_RETURN_IF_ERROR(
      MakeCertificate("ca", "/CN=granary-test-ca",
                      {"basicConstraints=critical,CA:TRUE",
                       "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"},
                      true));
  std::string san =
      "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,"
      "DNS:kubernetes.default,DNS:kubernetes.default.svc,"
      "DNS:kubernetes.default.svc.cluster.local";
  if (options_.api_address != "127.0.0.1") san += ",IP:" + options_.api_address;
  GRANARY_RETURN_IF_ERROR(MakeCertificate(
      "apiserver", "/CN=kube-apiserver",
      {"basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
       "extendedKeyUsage=serverAuth", san},
      false));
  GRANARY_RETURN_IF_ERROR(
      MakeCertificate("admin", "/O=system:masters/CN=granary-admin", kClientCertificate, false));
  GRANARY_RETURN_IF_ERROR(MakeCertificate("controller-manager",
                                          "/O=system:masters/CN=system:kube-controller-manager",
                                          kClientCertificate, false));
  GRANARY_RETURN_IF_ERROR(
      MakeCertificate("scheduler", "/CN=system:kube-scheduler", kClientCertificate, false));
  // The service-account token signing key pair (ES256).
  GRANARY_RETURN_IF_ERROR(RunOpenssl({"openssl", "genpkey", "-algorithm", "EC", "-pkeyopt",
                                      "ec_paramgen_curve:P-256", "-out", pki + "/sa.key"}));
  GRANARY_RETURN_IF_ERROR(
      RunOpenssl({"openssl", "pkey", "-in", pki + "/sa.key", "-pubout", "-out", pki + "/sa.pub"}));

  ca_file_ = pki + "/ca.crt";
  admin_cert_file_ = pki + "/admin.crt";
  admin_key_file_ = pki + "/admin.key";
  api_port_ = FreeTcpPort();
  server_ = "https://" + options_.api_address + ":" + std::to_string(api_port_);
  kubeconfig_path_ = dir_.Join("admin.kubeconfig");
  GRANARY_RETURN_IF_ERROR(
      WriteKubeconfig(kubeconfig_path_, "    client-certificate: " + Quoted(admin_cert_file_) +
                                            "\n    client-key: " + Quoted(admin_key_file_) + "\n"));
  for (const char* who : {"controller-manager", "scheduler"}) {
    GRANARY_RETURN_IF_ERROR(
        WriteKubeconfig(dir_.Join(std::string(who) + ".kubeconfig"),
                        "    client-certificate: " + Quoted(pki + "/" + who + ".crt") +
                            "\n    client-key: " + Quoted(pki + "/" + who + ".key") + "\n"));
  }
  return Status::Ok();
}

Result<std::string> KubeCluster::ClientKubeconfig(const std::string& name,
                                                  const std::string& subject) {
  GRANARY_RETURN_IF_ERROR(MakeCertificate(name, subject, kClientCertificate, false));
  const std::string pki = dir_.Join("pki");
  const std::string path = dir_.Join(name + ".kubeconfig");
  GRANARY_RETURN_IF_ERROR(
      WriteKubeconfig(path, "    client-certificate: " + Quoted(pki + "/" + name + ".crt") +
                                "\n    client-key: " + Quoted(pki + "/" + name + ".key") + "\n"));
  return path;
}

Status KubeCluster::WriteKubeconfig(const std::string& path, const std::string& user_auth) const {
  const std::string text =
      "apiVersion: v1\n"
      "kind: Config\n"
      "clusters:\n"
      "- name: granary-test\n"
      "  cluster:\n"
      "    server: " +
      Quoted(server_) +
      "\n"
      "    certificate-authority: " +
      Quoted(ca_file_) +
      "\n"
      "users:\n"
      "- name: user\n"
      "  user:\n" +
      user_auth +
      "contexts:\n"
      "- name: granary-test\n"
      "  context:\n"
      "    cluster: granary-test\n"
      "    user: user\n"
      "current-context: granary-test\n";
  return WriteFileAtomically(path, text, 0600);
}

Result<std::unique_ptr<DaemonProcess>> KubeCluster::StartDaemon(const std::string& tool,
                                                                std::vector<std::string> args) {
  DaemonProcessOptions o;
  o.binary = Tool(tool);
  o.args = std::move(args);
  o.log_path = dir_.Join("log/" + tool + ".log");
  o.name = tool;
  // Go programs log recovered panics ("runtime error: ...") that are no
  // sanitizer's report.
  o.fail_on_sanitizer_report = false;
  return DaemonProcess::Start(std::move(o));
}

Status KubeCluster::StartEtcd() {
  etcd_client_port_ = FreeTcpPort();
  etcd_peer_port_ = FreeTcpPort();
  const std::string client = "http://127.0.0.1:" + std::to_string(etcd_client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(etcd_peer_port_);
  GRANARY_ASSIGN_OR_RETURN(
      etcd_,
      StartDaemon("etcd", {"--name=granary-test", "--data-dir=" + dir_.Join("etcd"),
                           "--listen-client-urls=" + client, "--advertise-client-urls=" + client,
                           "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
                           "--initial-cluster=granary-test=" + peer,
                           // A test's cluster need not survive a power cut.
                           "--unsafe-no-fsync", "--log-level=warn",
                           // One member: elect it at once, not after a second.
                           "--heartbeat-interval=10", "--election-timeout=100"}));
  httplib::Client http("127.0.0.1", etcd_client_port_);
  http.set_connection_timeout(1, 0);
  http.set_read_timeout(2, 0);
  std::string last = "no answer";
  const bool healthy = granary::testing::WaitFor(
      [&] {
        if (!etcd_->Running()) return true;
        httplib::Result r = http.Get("/health");
        if (!r) return false;
        last = std::to_string(r->status) + " " + r->body;
        return r->status == 200 && r->body.find("\"true\"") != std::string::npos;
      },
      milliseconds(30000), milliseconds(100));
  if (!etcd_->Running() || !healthy) {
    return Status::Unavailable("etcd on " + client + " did not become healthy (last: " + last +
                               "): " + etcd_->LogTail(4096));
  }
  return Status::Ok();
}

Status KubeCluster::StartApiServer() {
  const std::string pki = dir_.Join("pki");
  if (api_server_args_.empty()) {
    const bool api_on_loopback = options_.api_address == "127.0.0.1";
    api_server_args_ = {
        "--etcd-servers=http://127.0.0.1:" + std::to_string(etcd_client_port_),
        "--bind-address=" + options_.api_address,
        "--advertise-address=" + options_.api_address,
        "--secure-port=" + std::to_string(api_port_),
        "--tls-cert-file=" + pki + "/apiserver.crt",
        "--tls-private-key-file=" + pki + "/apiserver.key",
        "--client-ca-file=" + pki + "/ca.crt",
        "--service-account-key-file=" + pki + "/sa.pub",
        "--service-account-signing-key-file=" + pki + "/sa.key",
        std::string("--service-account-issuer=") + kIssuer,
        std::string("--api-audiences=") + kIssuer + ",granary",
        api_on_loopback ? "--authorization-mode=RBAC" : "--authorization-mode=Node,RBAC",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--allow-privileged=true",
        // The "kubernetes" Service's endpoint would be 127.0.0.1, which
        // Endpoints reject (loopback); in-cluster clients here are local
        // processes that use KUBERNETES_SERVICE_HOST=127.0.0.1 instead. With
        // a real node it is the API server's address on the node's bridge.
        api_on_loopback ? "--endpoint-reconciler-type=none" : "--endpoint-reconciler-type=lease",
        "--cert-dir=" + pki,
        "--profiling=false",
        // A real node's name is no DNS name here: logs and exec go to its address.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
    };
  }
  GRANARY_ASSIGN_OR_RETURN(api_server_, StartDaemon("kube-apiserver", api_server_args_));
  return Status::Ok();
}

Status KubeCluster::WaitApiServerReady(steady_clock::time_point deadline) {
  std::string last = "no answer";
  httplib::SSLClient http(options_.api_address, api_port_, admin_cert_file_, admin_key_file_);
  http.set_ca_cert_path(ca_file_.c_str());
  http.enable_server_certificate_verification(true);
  http.set_connection_timeout(1, 0);
  http.set_read_timeout(5, 0);
  while (true) {
    if (!api_server_->Running()) {
      return Status::Unavailable(
          "kube-apiserver exited (" +
          (api_server_->exit_status() ? api_server_->exit_status()->ToString() : std::string("?")) +
          ") before it was ready: " + ApiServerLogTail(8192));
    }
    httplib::Result r = http.Get("/readyz");
    if (r && r->status == 200) return Status::Ok();
    last = r ? std::to_string(r->status) + " " + Tail(r->body, 2048)
             : "no answer (" + httplib::to_string(r.error()) + ")";
    if (steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded("kube-apiserver on " + server_ +
                                      " did not become ready (last /readyz: " + last +
                                      "): " + ApiServerLogTail(8192));
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
}

Status KubeCluster::StartControllers() {
  const std::string pki = dir_.Join("pki");
  GRANARY_ASSIGN_OR_RETURN(
      controller_manager_,
      StartDaemon(
          "kube-controller-manager",
          {"--kubeconfig=" + dir_.Join("controller-manager.kubeconfig"), "--leader-elect=false",
           "--secure-port=0", "--use-service-account-credentials=false",
           "--service-account-private-key-file=" + pki + "/sa.key",
           "--root-ca-file=" + pki + "/ca.crt", "--cluster-signing-cert-file=" + pki + "/ca.crt",
           "--cluster-signing-key-file=" + pki + "/ca.key",
           "--service-cluster-ip-range=10.96.0.0/16", "--cluster-name=granary-test",
           "--concurrent-deployment-syncs=5", "--profiling=false"}));
  GRANARY_ASSIGN_OR_RETURN(
      scheduler_, StartDaemon("kube-scheduler",
                              {"--kubeconfig=" + dir_.Join("scheduler.kubeconfig"),
                               "--leader-elect=false", "--secure-port=0", "--profiling=false"}));
  return Status::Ok();
}

Status KubeCluster::StartKwok() {
  std::vector<std::string> args = {
      "--kubeconfig=" + kubeconfig_path_,
      "--manage-all-nodes=false",
      "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
      "--manage-nodes-with-label-selector=",
      "--node-lease-duration-seconds=40",
      "--cidr=10.244.0.1/16",
      "--node-ip=127.0.0.1"};
  if (!options_.kwok_completes_job_pods) {
    const std::string stages = dir_.Join("kwok-stages.yaml");
    GRANARY_RETURN_IF_ERROR(WriteFileAtomically(stages, kKwokPodStagesWithoutComplete, 0644)
                                .WithContext("write kwok's pod stages"));
    args.push_back("--config=" + stages);
  }
  GRANARY_ASSIGN_OR_RETURN(kwok_, StartDaemon("kwok", std::move(args)));
  return Status::Ok();
}

Status KubeCluster::CreateNodes() {
  for (const FakeNode& node : options_.nodes) {
    nlohmann::json labels = {{"kubernetes.io/hostname", node.name},
                             {"kubernetes.io/os", "linux"},
                             {"kubernetes.io/arch", "amd64"},
                             {"type", "kwok"}};
    for (const auto& [k, v] : node.labels) labels[k] = v;
    const nlohmann::json resources = {
        {"cpu", node.cpu}, {"memory", node.memory}, {"pods", "110"}, {"nvidia.com/gpu", node.gpus}};
    const nlohmann::json body = {
        {"apiVersion", "v1"},
        {"kind", "Node"},
        {"metadata",
         {{"name", node.name},
          {"labels", labels},
          {"annotations",
           {{"kwok.x-k8s.io/node", "fake"}, {"node.alpha.kubernetes.io/ttl", "0"}}}}},
        {"status",
         {{"capacity", resources},
          {"allocatable", resources},
          {"nodeInfo",
           {{"architecture", "amd64"},
            {"operatingSystem", "linux"},
            {"kubeletVersion", "fake"},
            {"kubeProxyVersion", "fake"}}}}}};
    Result<nlohmann::json> created = ApiRequest("POST", "/api/v1/nodes", body.dump());
    if (!created.ok()) return created.status().WithContext("create fake node " + node.name);
  }
  return Status::Ok();
}

Status KubeCluster::WaitClusterReady(steady_clock::time_point deadline) {
  std::string last = "nothing asked yet";
  while (true) {
    for (DaemonProcess* d : {etcd_.get(), api_server_.get(), controller_manager_.get(),
                             scheduler_.get(), kwok_.get()}) {
      if (!d->Running()) {
        return Status::Unavailable(d->name() + " exited (" +
                                   (d->exit_status() ? d->exit_status()->ToString() : "?") +
                                   ") while the test cluster started:\n" + LogTails(6144));
      }
    }
    bool ready = true;
    Result<nlohmann::json> nodes = ApiRequest("GET", "/api/v1/nodes");
    if (!nodes.ok()) {
      ready = false;
      last = nodes.status().ToString();
    } else {
      for (const FakeNode& want : options_.nodes) {
        bool node_ready = false;
        for (const nlohmann::json& n : nodes->value("items", nlohmann::json::array())) {
          if (n["metadata"].value("name", "") != want.name) continue;
          for (const nlohmann::json& c : n["status"].value("conditions", nlohmann::json::array())) {
            if (c.value("type", "") == "Ready" && c.value("status", "") == "True") {
              node_ready = true;
            }
          }
        }
        if (!node_ready) {
          ready = false;
          last = "node " + want.name + " is not Ready";
          break;
        }
      }
    }
    if (ready) {
      Result<nlohmann::json> sa =
          ApiRequest("GET", "/api/v1/namespaces/default/serviceaccounts/default");
      if (!sa.ok()) {
        ready = false;
        last = "no default ServiceAccount yet (" + sa.status().ToString() + ")";
      }
    }
    if (ready) return Status::Ok();
    if (steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded("the test cluster was not ready within " +
                                      std::to_string(options_.start_timeout.count()) +
                                      " ms: " + last + "\n" + LogTails(6144));
    }
    std::this_thread::sleep_for(milliseconds(200));
  }
}

KubectlResult KubeCluster::Kubectl(const std::vector<std::string>& args,
                                   const std::string& stdin_text) const {
  std::vector<std::string> argv = {Tool("kubectl"), "--kubeconfig=" + kubeconfig_path_};
  argv.insert(argv.end(), args.begin(), args.end());
  // Discovery is cached in the TempDir, not in the user's home.
  return RunProgram(argv, {"KUBECACHEDIR=" + dir_.Join("run/kubectl-cache"), "HOME=" + dir()},
                    stdin_text, dir_.Join("run"), kKubectlTimeout);
}

std::string KubeCluster::MustKubectl(const std::vector<std::string>& args,
                                     const std::string& stdin_text) const {
  KubectlResult r = Kubectl(args, stdin_text);
  std::string cmd;
  for (const std::string& a : args) cmd += " " + a;
  EXPECT_EQ(r.exit_code, 0) << "kubectl" << cmd << ": " << r.Describe();
  return r.out;
}

Result<nlohmann::json> KubeCluster::GetJson(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"get"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("-o");
  argv.push_back("json");
  KubectlResult r = Kubectl(argv);
  std::string what = "kubectl";
  for (const std::string& a : argv) what += " " + a;
  if (r.exit_code != 0) {
    if (r.err.find("NotFound") != std::string::npos ||
        r.err.find("not found") != std::string::npos) {
      return Status::NotFound(what + ": " + r.Describe());
    }
    return Status::Unavailable(what + ": " + r.Describe());
  }
  try {
    return nlohmann::json::parse(r.out);
  } catch (const nlohmann::json::exception& e) {
    return Status::Internal(what + " printed no JSON (" + e.what() + "): " + Tail(r.out, 2048));
  }
}

Result<nlohmann::json> KubeCluster::ApiRequest(const std::string& method, const std::string& path,
                                               const std::string& body) const {
  httplib::SSLClient http(options_.api_address, api_port_, admin_cert_file_, admin_key_file_);
  http.set_ca_cert_path(ca_file_.c_str());
  http.enable_server_certificate_verification(true);
  http.set_connection_timeout(2, 0);
  http.set_read_timeout(30, 0);
  http.set_write_timeout(30, 0);
  const std::string what = method + " " + server_ + path;
  const httplib::Headers headers = {{"Accept", "application/json"}};
  auto send = [&]() -> std::optional<httplib::Result> {
    if (method == "GET") return http.Get(path.c_str(), headers);
    if (method == "POST") return http.Post(path.c_str(), headers, body, "application/json");
    if (method == "PUT") return http.Put(path.c_str(), headers, body, "application/json");
    if (method == "PATCH") {
      return http.Patch(path.c_str(), headers, body, "application/merge-patch+json");
    }
    if (method == "DELETE") return http.Delete(path.c_str(), headers, body, "application/json");
    return std::nullopt;
  };
  std::optional<httplib::Result> sent = send();
  if (!sent) return Status::InvalidArgument(what + ": unsupported method");
  httplib::Result& r = *sent;
  if (!r) return Status::Unavailable(what + ": " + httplib::to_string(r.error()));
  if (r->status == 404) return Status::NotFound(what + ": 404 " + Tail(r->body, 1024));
  if (r->status == 409) return Status::AlreadyExists(what + ": 409 " + Tail(r->body, 1024));
  if (r->status < 200 || r->status >= 300) {
    return Status::Unavailable(what + ": " + std::to_string(r->status) + " " + Tail(r->body, 2048));
  }
  try {
    return nlohmann::json::parse(r->body);
  } catch (const nlohmann::json::exception& e) {
    return Status::Internal(what + ": the answer is not JSON (" + e.what() +
                            "): " + Tail(r->body, 1024));
  }
}

Status KubeCluster::WaitFor(std::function<bool()> condition, milliseconds timeout,
                            const std::string& what) const {
  const auto start = steady_clock::now();
  if (granary::testing::WaitFor(condition, timeout, milliseconds(200))) return Status::Ok();
  const auto waited = std::chrono::duration_cast<milliseconds>(steady_clock::now() - start).count();
  return Status::DeadlineExceeded("waited " + std::to_string(waited) + " ms for " + what +
                                  "; it did not happen");
}

Status KubeCluster::RestartApiServer() {
  if (api_server_ != nullptr) {
    // SIGTERM starts the graceful shutdown (it stops taking requests and its
    // controllers at once), but its HTTP server then waits out a fixed 60 s
    // before the process exits (kubernetes/kubernetes#131052): kill it after
    // kApiServerStopTimeout. Its state is in etcd either way.
    (void)api_server_->Terminate(kApiServerStopTimeout);
    api_server_.reset();
  }
  GRANARY_RETURN_IF_ERROR(StartApiServer());
  return WaitApiServerReady(steady_clock::now() + options_.start_timeout);
}

Result<std::string> KubeCluster::ServiceAccountKubeconfig(const std::string& ns,
                                                          const std::string& sa) const {
  KubectlResult r = Kubectl({"create", "token", sa, "-n", ns, "--duration=24h"});
  if (r.exit_code != 0) {
    return Status::Unavailable("kubectl create token " + sa + " -n " + ns + ": " + r.Describe() +
                               " (does the ServiceAccount exist?)");
  }
  const std::string token = Trim(r.out);
  if (token.empty()) return Status::Internal("kubectl create token " + sa + " printed no token");
  const std::string path = dir_.Join("sa-" + ns + "-" + sa + "-" +
                                     std::to_string(commands_run_.fetch_add(1)) + ".kubeconfig");
  GRANARY_RETURN_IF_ERROR(WriteKubeconfig(path, "    token: " + Quoted(token) + "\n"));
  return path;
}

std::string KubeCluster::ApiServerLogTail(size_t max_bytes) const {
  Result<std::string> log = ReadFileToString(dir_.Join("log/kube-apiserver.log"));
  return log.ok() ? Tail(*log, max_bytes) : log.status().ToString();
}

std::string KubeCluster::LogTails(size_t max_bytes) const {
  std::string out;
  for (const char* tool :
       {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}) {
    Result<std::string> log = ReadFileToString(dir_.Join(std::string("log/") + tool + ".log"));
    out += std::string("--- ") + tool + " ---\n" +
           (log.ok() ? Tail(*log, max_bytes) : log.status().ToString()) + "\n";
  }
  return out;
}

void KubeCluster::PrintLogsIfTestFailed() {
  for (DaemonProcess* d :
       {etcd_.get(), api_server_.get(), controller_manager_.get(), scheduler_.get(), kwok_.get()}) {
    if (d != nullptr) d->PrintLogIfTestFailed();
  }
}

}  // namespace granary::testing

// granary-demo-k8s (`make demo-k8s`, scripts/demo-k8s): the Kubernetes side of
// Granary on this one machine, on a real node, with the fixtures the
// end-to-end tests use:
//
//   1. KubeNode (tests/testing/kube_node.h): the control plane (etcd,
//      kube-apiserver, kube-controller-manager, kube-scheduler) and one real
//      node in a network namespace of its own: containerd with runc, kubelet
//      and kube-proxy, pod networking from Debian's CNI plugins. The images
//      granary:0.1.0 and granary-trainer:0.1.0 are assembled from this build
//      (scripts/image/assemble) and loaded into the node's containerd; no
//      registry is used. RedisServer as the metadata store, on the address
//      the node reaches the host at.
//   2. `helm install granary charts/granary` from the working tree (helm from
//      scripts/k8s-tools): the store from an existing Secret (the Redis
//      above), both operator replicas, and the CachePool `gpu` with this
//      host's paths. The API server calls the webhook through the chart's
//      Service, which kube-proxy routes: nothing of what the chart renders
//      is changed.
//   3. The Dataset identity policy (charts/granary/policies), the example
//      namespaces (examples/kubernetes/namespace.yaml, the store URL made the
//      Redis'), a generated source of 2,000 files (20 classes x 100, 4-12
//      KiB) and a Dataset of it in team-a; `kubectl wait` for the operator,
//      the pool and the Dataset.
//   4. A Job labelled granary.io/dataset=demo whose container (image
//      granary-trainer:0.1.0: Python and torch) knows nothing of Granary:
//      the operator's webhook injects the native sidecar, the kubelet runs it
//      and then `python3 train.py` (tests/trainer/check_epochs.py: two epochs
//      through granary.torch, every sample's SHA-256 checked against the
//      source, then the same order from the local files), and the Job
//      completes. Prints `kubectl get cachepools,datasets`, the Job and the
//      trainer's output.
//   5. With GRANARY_DEMO_KEEP=1 (`make demo-k8s KEEP=1`), leaves everything
//      up and prints `export KUBECONFIG=...` and a few kubectl commands to try,
//      until Ctrl-C.
//   6. Deletes the Dataset, `helm uninstall`s, and stops everything: the node
//      (containers, mounts, network, cgroups), Redis, the control plane, the
//      temp directories.
//
// SIGINT and SIGTERM (Ctrl-C) end the step under way within about a second
// (every wait is polled in short slices) and unwind the same way as step 6,
// then exit 130 (0 in KEEP mode, where Ctrl-C is the way to end it).
// scripts/demo-k8s starts this program in a session of its own and forwards
// Ctrl-C to it alone: a terminal's SIGINT to the whole process group would
// also end etcd, the API server and the kubelet at once. The program also
// gets SIGTERM when its parent (the script) dies. Needs root (the node) and
// the tools of `scripts/k8s-tools --node`. Exit 0 when the Job completed, 1 on
// a failure (with the logs of what failed), 130 when interrupted.

#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/kube_cluster.h"
#include "testing/kube_node.h"
#include "testing/kube_suite.h"
#include "testing/redis_server.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using nlohmann::json;
using std::chrono::seconds;

constexpr char kRelease[] = "granary";
constexpr char kNamespace[] = "granary";
constexpr char kTeam[] = "team-a";
constexpr char kDataset[] = "demo";
constexpr int kClasses = 20;
constexpr int kPerClass = 100;

volatile std::sig_atomic_t g_signal = 0;

void OnSignal(int sig) { g_signal = sig; }

bool Interrupted() { return g_signal != 0; }

const auto g_start = std::chrono::steady_clock::now();

std::string Elapsed() {
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%6.1f s", s);
  return buf;
}

void Step(const std::string& what) {
  std::cout << "== [" << Elapsed() << "] " << what << std::endl;
}

std::string Indent(const std::string& text, const std::string& prefix = "  ") {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out += prefix + line + "\n";
  return out;
}

// A failed step: what, and what helps to see why.
struct Failure {
  std::string message;
};

class Demo {
 public:
  Demo() { ::chmod(work_.path().c_str(), 0755); }  // uid 1000 (runAs) walks to the source

  // The fixtures in reverse start order: Redis, then the node and the
  // control plane; then the work directory (TempDir).
  ~Demo() {
    if (node_ != nullptr) {
      Step("stopping the node (containers, mounts, network, cgroups), Redis and the control plane");
    }
    redis_.reset();
    node_.reset();
  }

  void Run() {
    Result<std::string> tools = KubeCluster::ToolsDir();
    if (!tools.ok()) throw Failure{tools.status().ToString()};
    StartFixtures();
    WriteSource();
    InstallChart();
    ApplyDataset();
    RunJob();
    if (keep_) Keep();
    TearDownRelease();
  }

  // Everything that helps after a failure: the operator's and the pods' logs,
  // the runner's events, the cluster's objects.
  void PrintDiagnostics() {
    if (node_ == nullptr) return;
    KubeCluster& cluster = node_->cluster();
    std::cerr << "-- kubectl get pods,jobs,cachepools,datasets -A\n"
              << cluster.Kubectl({"get", "pods,jobs,cachepools,datasets", "-A", "-o", "wide"}).out
              << "-- kubectl get events -A\n"
              << Tail(cluster.Kubectl({"get", "events", "-A"}).out, 6000);
    for (const char* ns : {kNamespace, kTeam}) {
      std::cerr << "-- logs in " << ns << "\n"
                << Tail(cluster
                            .Kubectl({"logs", "-n", ns, "--all-containers", "--prefix", "--tail=40",
                                      "-l", "app.kubernetes.io/name"})
                            .out,
                        6000);
    }
    std::cerr << "-- the node's daemons\n" << node_->LogTails(3000);
  }

 private:
  static std::string Tail(const std::string& text, size_t max = 4000) {
    return text.size() <= max ? text : "..." + text.substr(text.size() - max);
  }

  // Throws when a signal came: the destructors unwind the fixtures.
  static void CheckInterrupted() {
    if (Interrupted()) throw Failure{"interrupted"};
  }

  // Polls `condition` every 200 ms until it holds, a signal comes, or `timeout`.
  void WaitUntil(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
                 const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!condition()) {
      CheckInterrupted();
      if (std::chrono::steady_clock::now() >= deadline) {
        throw Failure{what + " did not happen within " +
                      std::to_string(std::chrono::duration_cast<seconds>(timeout).count()) + " s"};
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  KubectlResult Kubectl(const std::vector<std::string>& args, const std::string& in = "") {
    CheckInterrupted();
    return node_->cluster().Kubectl(args, in);
  }

  std::string MustKubectl(const std::vector<std::string>& args, const std::string& in = "") {
    KubectlResult r = Kubectl(args, in);
    if (!r.ok()) {
      std::string command = "kubectl";
      for (const std::string& a : args) command += " " + a;
      throw Failure{command + ": " + r.Describe() + "\n" + r.out};
    }
    return r.out;
  }

  // `kubectl wait <args> --timeout=2s`, repeated until it succeeds (its
  // output printed), a signal comes, or `timeout`.
  void KubectlWait(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
    std::string shown = "kubectl wait";
    for (const std::string& a : args) shown += " " + a;
    std::cout << "  $ " << shown << std::endl;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::string> argv = {"wait"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--timeout=2s");
    for (;;) {
      KubectlResult r = Kubectl(argv);
      if (r.ok()) {
        std::cout << Indent(r.out) << std::flush;
        return;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        throw Failure{shown + " did not succeed within " +
                      std::to_string(std::chrono::duration_cast<seconds>(timeout).count()) +
                      " s: " + r.Describe()};
      }
      // Not found yet, or its condition not yet met: try again.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }

  // helm with the cluster's admin kubeconfig and its own home in the work dir.
  KubectlResult Helm(const std::vector<std::string>& args) {
    CheckInterrupted();
    std::vector<std::string> argv = {node_->cluster().Tool("helm")};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string home = work_.Join("helm-home");
    return RunProgram(argv,
                      {"KUBECONFIG=" + node_->cluster().kubeconfig_path(),
                       "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config",
                       "HELM_DATA_HOME=" + home + "/data", "HOME=" + home},
                      "", work_.path(), seconds(120));
  }

  void StartFixtures() {
    Step(
        "the images granary:0.1.0 and granary-trainer:0.1.0 from this build "
        "(scripts/image/assemble)");
    Result<std::string> image = KubeNode::GranaryImage(GRANARY_BUILD_DIR);
    if (!image.ok()) throw Failure{"assembling the image: " + image.status().ToString()};
    CheckInterrupted();
    Result<std::string> trainer = KubeNode::GranaryImage(GRANARY_BUILD_DIR, /*trainer=*/true);
    if (!trainer.ok())
      throw Failure{"assembling the trainer image: " + trainer.status().ToString()};
    std::cout << "  " << *image << "\n  " << *trainer << std::endl;
    CheckInterrupted();
    Step(
        "the control plane and a real node (containerd, kubelet, kube-proxy; the images "
        "loaded into its containerd), and Redis");
    KubeNodeOptions o;
    o.labels = {{"granary.io/nvme", "true"}, {"nvidia.com/gpu.present", "true"}};
    o.images = {{*image, "granary:0.1.0"}, {*trainer, "granary-trainer:0.1.0"}};
    Result<std::unique_ptr<KubeNode>> node = KubeNode::Start(o);
    if (!node.ok()) throw Failure{"starting the node: " + node.status().ToString()};
    node_ = std::move(*node);
    CheckInterrupted();
    Result<std::unique_ptr<RedisServer>> redis =
        RedisServer::Start({"--bind", "127.0.0.1", node_->host_ip()});
    if (!redis.ok()) throw Failure{"starting Redis: " + redis.status().ToString()};
    redis_ = std::move(*redis);
    std::cout << "  API server " << node_->cluster().server() << " (kubeconfig "
              << node_->cluster().kubeconfig_path() << "), node " << node_->name() << " at "
              << node_->node_ip() << ", Redis " << RedisUrl() << std::endl;
    std::cout << Indent(MustKubectl({"get", "nodes", "-o", "wide"}));
  }

  std::string RedisUrl() const {
    return "redis://" + node_->host_ip() + ":" + std::to_string(redis_->port()) + "/0";
  }

  std::string Source() const { return work_.Join("datasets") + "/demo/train"; }

  void WriteSource() {
    Step("a source of " + std::to_string(kClasses * kPerClass) + " files (" +
         std::to_string(kClasses) + " classes x " + std::to_string(kPerClass) + ", 4-12 KiB) in " +
         Source());
    std::mt19937_64 rng(7);
    for (int c = 0; c < kClasses; ++c) {
      char cls[32];
      std::snprintf(cls, sizeof cls, "/class-%02d", c);
      const std::string dir = Source() + cls;
      std::filesystem::create_directories(dir);
      for (int i = 0; i < kPerClass; ++i) {
        std::string bytes(4096 + rng() % 8193, '\0');
        for (char& b : bytes) b = static_cast<char>(rng());
        char name[32];
        std::snprintf(name, sizeof name, "/img-%04d.bin", i);
        const std::string path = dir + name;
        std::ofstream(path, std::ios::binary) << bytes;
        ::chmod(path.c_str(), 0644);
      }
    }
    for (const auto& e : std::filesystem::recursive_directory_iterator(work_.Join("datasets"))) {
      if (e.is_directory()) ::chmod(e.path().c_str(), 0755);
    }
    ::chmod(work_.Join("datasets").c_str(), 0755);
  }

  void InstallChart() {
    const std::string chart = std::string(GRANARY_SOURCE_DIR) + "/charts/granary";
    Step(
        "the example namespaces (examples/kubernetes/namespace.yaml: team-a granted uid/gid "
        "1000; granary with the store Secret, its URL made the Redis')");
    const std::string namespaces = KubeSuite::ExampleNamespaces(GRANARY_SOURCE_DIR, RedisUrl());
    std::cout << Indent(MustKubectl({"apply", "--validate=strict", "-f", "-"}, namespaces));

    // This host's paths; the store from the Secret above; the image present
    // on the node.
    const std::string nvme = work_.Join("nvme");
    std::filesystem::create_directories(nvme);
    const json values = KubeSuite::RealNodeChartValues(work_.path(), "0.1.0");
    work_.WriteFile("values.yaml", values.dump(2));

    Step("helm install " + std::string(kRelease) + " charts/granary -n " + kNamespace +
         " (values: " + work_.Join("values.yaml") + ")");
    std::cout << "  values: image.pullPolicy=Never, store.existingSecret=granary-store, "
                 "redis.enabled=false, cachePools[0]: gpu (this host's paths)"
              << std::endl;
    KubectlResult install =
        Helm({"install", kRelease, chart, "-n", kNamespace, "-f", work_.Join("values.yaml")});
    if (!install.ok()) throw Failure{"helm install: " + install.Describe() + "\n" + install.out};
    // helm's summary without the NOTES (charts/granary/templates/NOTES.txt).
    std::istringstream lines(install.out);
    for (std::string line; std::getline(lines, line) && line != "NOTES:";) {
      std::cout << "  " << line << "\n";
    }
    Step(
        "the Dataset identity policy (charts/granary/policies/dataset-identity.yaml), "
        "applied separately as docs/install.md says");
    std::cout << Indent(MustKubectl({"apply", "-f", chart + "/policies/dataset-identity.yaml"}));

    Step("waiting for the operator's two replicas and the pool's cache node (in containers)");
    KubectlWait({"-n", kNamespace, "--for=condition=Available", "deployment/granary-operator"},
                seconds(180));
    KubectlWait({"--for=condition=Ready", "cachepool/gpu"}, seconds(180));
    std::cout << Indent(MustKubectl({"get", "pods", "-n", kNamespace, "-o", "wide"}));
  }

  void ApplyDataset() {
    Step("Dataset team-a/demo (pool gpu, read as uid/gid 1000) of the source");
    const std::string yaml = KubeSuite::DatasetYaml(kTeam, kDataset, Source());
    std::cout << Indent(yaml, "  | ");
    std::cout << Indent(MustKubectl({"apply", "--validate=strict", "-f", "-"}, yaml));
    KubectlWait({"-n", kTeam, "--for=condition=Ready", "dataset/" + std::string(kDataset)},
                seconds(180));
    std::cout << "  $ kubectl get cachepools,datasets -A\n"
              << Indent(MustKubectl({"get", "cachepools,datasets", "-A"}));
  }

  void RunJob() {
    Step(
        "waiting for the operator's webhook to inject a pod labelled granary.io/dataset=demo "
        "(server-side dry run)");
    const json probe = {
        {"apiVersion", "v1"},
        {"kind", "Pod"},
        {"metadata", {{"name", "probe"}, {"labels", {{"granary.io/dataset", kDataset}}}}},
        {"spec",
         {{"containers", json::array({{{"name", "trainer"},
                                       {"image", "granary-trainer:0.1.0"},
                                       {"command", {"true"}}}})}}}};
    WaitUntil(
        [&] {
          KubectlResult r = Kubectl(
              {"create", "-n", kTeam, "--dry-run=server", "-o", "json", "-f", "-"}, probe.dump());
          return r.ok() && r.out.find("granary-sidecar") != std::string::npos;
        },
        seconds(60), "the webhook injecting a dry-run pod");

    Step(
        "a training Job: label granary.io/dataset=demo, image granary-trainer:0.1.0, "
        "python3 train.py (tests/trainer/check_epochs.py, 2 epochs), as uid 1000");
    MustKubectl(KubeSuite::TrainerScriptConfigMap(kTeam));
    // The pool's default sidecar metrics port (9465): the trainer checks the
    // handoff served.
    json job = KubeSuite::TrainingJob(kTeam, "train", kDataset, Source(), 9465, "");
    json& pod_spec = job["spec"]["template"]["spec"];
    pod_spec["containers"][0]["image"] = "granary-trainer:0.1.0";
    pod_spec["containers"][0]["command"] = {"python3", "/app/train.py"};
    pod_spec["securityContext"] = {{"runAsUser", 1000}, {"runAsGroup", 1000}};
    std::cout << Indent(MustKubectl({"apply", "-f", "-"}, job.dump()));

    json pod;
    WaitUntil(
        [&] {
          Result<json> pods =
              node_->cluster().GetJson({"pods", "-n", kTeam, "-l", "job-name=train"});
          if (!pods.ok() || (*pods)["items"].empty()) return false;
          pod = (*pods)["items"][0];
          return !pod["spec"].value("nodeName", "").empty();
        },
        seconds(60), "the Job's pod created and scheduled");
    const json& spec = pod["spec"];
    std::cout << "  pod " << pod["metadata"].value("name", "") << " on "
              << spec.value("nodeName", "") << "; what the webhook injected:\n";
    for (const json& c : spec.value("initContainers", json::array())) {
      std::cout << "    initContainer " << c.value("name", "") << ": image " << c.value("image", "")
                << ", restartPolicy " << c.value("restartPolicy", "") << ", runAsUser "
                << c["securityContext"].value("runAsUser", -1) << "\n";
    }
    for (const json& c : spec.value("containers", json::array())) {
      std::cout << "    container " << c.value("name", "") << ": env";
      for (const json& e : c.value("env", json::array())) {
        const std::string name = e.value("name", "");
        if (name.rfind("GRANARY_", 0) == 0) {
          std::cout << " " << name << "=" << e.value("value", "<valueFrom>");
        }
      }
      std::cout << "\n";
    }
    std::cout << std::flush;

    Step("the Job runs: the kubelet starts the injected sidecar, then the trainer");
    std::cout << "  $ kubectl wait -n team-a --for=condition=Complete job/train" << std::endl;
    std::string done;
    WaitUntil(
        [&] {
          Result<json> j = node_->cluster().GetJson({"job", "-n", kTeam, "train"});
          if (!j.ok()) return false;
          if (ConditionField(*j, "Failed") == "True") {
            done = "Failed";
            return true;
          }
          KubectlResult r = node_->cluster().Kubectl(
              {"wait", "-n", kTeam, "--for=condition=Complete", "job/train", "--timeout=1s"});
          if (r.ok()) {
            std::cout << Indent(r.out);
            done = "Complete";
          }
          return r.ok();
        },
        seconds(300), "Job team-a/train finishing");

    const std::string trainer_log =
        Kubectl({"logs", "-n", kTeam, "job/train", "-c", "trainer"}).out;
    std::cout << "  $ kubectl get jobs,pods -n team-a\n"
              << Indent(MustKubectl({"get", "jobs,pods", "-n", kTeam}));
    Step("the trainer's output");
    std::cout << Indent(trainer_log);
    if (done != "Complete") throw Failure{"Job team-a/train failed"};
    job_complete_ = true;
    // The operator looks at a Ready pool again every 30 s: its USED and
    // DATASETS columns follow the store then.
    Step(
        "the pool's status counting the Dataset and its staged bytes (the operator refreshes "
        "a Ready pool every 30 s)");
    WaitUntil(
        [&] {
          Result<json> p = node_->cluster().GetJson({"cachepool", "gpu"});
          if (!p.ok()) return false;
          const json st = p->value("status", json::object());
          return st.value("datasets", 0) >= 1 && st.value("usedBytes", uint64_t{0}) > 0;
        },
        seconds(70), "CachePool gpu's status counting the Dataset");
    std::cout << "  $ kubectl get cachepools,datasets -A\n"
              << Indent(MustKubectl({"get", "cachepools,datasets", "-A"})) << std::flush;
  }

  // KEEP=1: everything stays up for a person to look at, until Ctrl-C.
  void Keep() {
    Step("KEEP=1: the cluster stays up until Ctrl-C; in another shell, as root:");
    std::cout << "  export KUBECONFIG=" << node_->cluster().kubeconfig_path() << "\n"
              << "  export PATH=" << node_->cluster().tools_dir() << ":$PATH\n"
              << "  kubectl get nodes -o wide\n"
              << "  kubectl get cachepools,datasets -A\n"
              << "  kubectl get pods -A -o wide\n"
              << "  kubectl describe dataset -n team-a demo\n"
              << "  kubectl logs -n team-a job/train -c granary-sidecar\n"
              << "  kubectl logs -n granary -l granary.io/pool=gpu\n"
              << "  helm list -A\n"
              << "  (the node's containers: ctr --address " << node_->containerd_socket()
              << " -n k8s.io containers ls)" << std::endl;
    while (!Interrupted()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g_signal = 0;  // the end of KEEP, not a failure: tear down as usual
    kept_ = true;
  }

 public:
  bool kept() const { return kept_; }

 private:
  void TearDownRelease() {
    Step("deleting the Dataset (its finalizer needs the operator) and helm uninstall");
    MustKubectl({"delete", "dataset", "-n", kTeam, kDataset, "--wait=false"});
    KubectlWait({"-n", kTeam, "--for=delete", "dataset/" + std::string(kDataset)}, seconds(60));
    KubectlResult uninstall =
        Helm({"uninstall", kRelease, "-n", kNamespace, "--wait", "--timeout", "60s"});
    if (!uninstall.ok()) {
      throw Failure{"helm uninstall: " + uninstall.Describe() + "\n" + uninstall.out};
    }
    std::cout << Indent(uninstall.out) << std::flush;
  }

 public:
  bool job_complete() const { return job_complete_; }

 private:
  TempDir work_;  // destroyed last: the fixtures' processes use it
  bool kept_ = false;
  std::unique_ptr<KubeNode> node_;
  std::unique_ptr<RedisServer> redis_;
  const bool keep_ = [] {
    const char* keep = std::getenv("GRANARY_DEMO_KEEP");
    return keep != nullptr && std::string(keep) == "1";
  }();
  bool job_complete_ = false;
};

int Main() {
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the script that started it died
  if (::geteuid() != 0) {
    std::cerr << "granary-demo-k8s: run as root (the real node: containerd, the kubelet, "
                 "network namespaces)\n";
    return 1;
  }
  int rc = 0;
  {
    Demo demo;
    try {
      demo.Run();
    } catch (const Failure& f) {
      if (Interrupted()) {
        std::cerr << "granary-demo-k8s: interrupted (signal " << g_signal
                  << "); tearing everything down\n";
        rc = 130;
      } else {
        std::cerr << "granary-demo-k8s: " << f.message << "\n";
        demo.PrintDiagnostics();
        rc = 1;
      }
    } catch (const std::exception& e) {
      std::cerr << "granary-demo-k8s: " << e.what() << "\n";
      demo.PrintDiagnostics();
      rc = 1;
    }
    if (rc == 0 && !demo.job_complete()) rc = 1;
  }
  Step(rc == 0 ? "demo-k8s: OK (everything stopped, temp directories removed)"
               : "demo-k8s: everything stopped, temp directories removed");
  return rc;
}

}  // namespace
}  // namespace granary::testing

int main() { return granary::testing::Main(); }

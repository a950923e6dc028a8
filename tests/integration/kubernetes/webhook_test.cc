// The sidecar-injecting webhook against a real kube-apiserver (KubeCluster):
// a WebhookServer in this process on 127.0.0.1 with a certificate from
// MakeWebhookCert, registered with a MutatingWebhookConfiguration in URL form
// (caBundle = its CA, objectSelector on granary.io/dataset, CREATE only, the
// operator's namespace excluded, failurePolicy Fail). Pods are created with
// kubectl; what the API server stored is checked. The Dataset lookup of the
// first cases is the test's own; the last cases run granary-operator's, which
// reads the Dataset and CachePool from the API server.
//
// One cluster for the whole binary, run as one ctest test: the cases run in
// order; the last two take the test's server down and then register
// granary-operator's webhook (--webhook-listen) instead.

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "granary/kube/base64.h"
#include "granary/operator/resources.h"
#include "granary/operator/webhook_cert.h"
#include "granary/operator/webhook_lookup.h"
#include "granary/operator/webhook_server.h"
#include "testing/kube_cluster.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

using kube::InjectionInputs;
using kube::WebhookServer;
using nlohmann::json;
using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr char kOperatorNs[] = "granary";
constexpr char kTeamNs[] = "team-a";

json Pod(const std::string& name, const std::string& dataset) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", name}}},
              {"spec",
               {{"containers", json::array({{{"name", "trainer"},
                                             {"image", "pytorch/pytorch:2"},
                                             {"command", {"python3", "train.py"}}}})}}}};
  if (!dataset.empty()) pod["metadata"]["labels"] = {{"granary.io/dataset", dataset}};
  return pod;
}

const json* FindNamed(const json& list, const std::string& name) {
  if (!list.is_array()) return nullptr;
  for (const json& item : list) {
    if (item.value("name", "") == name) return &item;
  }
  return nullptr;
}

class WebhookTest : public SharedKubeTest<WebhookTest> {
 public:
  static Status StartShared() { return SetUpAll(); }
  static void StopShared() {
    if (server_ != nullptr) server_->Stop();
    delete server_;
    server_ = nullptr;
    delete cluster_;
    cluster_ = nullptr;
  }
  static void PrintLogsIfFailed() {
    if (cluster_ != nullptr) cluster_->PrintLogsIfTestFailed();
  }

 protected:
  static Status SetUpAll() {
    GRANARY_ASSIGN_OR_RETURN(std::unique_ptr<KubeCluster> cluster, KubeCluster::Start());
    cluster_ = cluster.release();
    for (const char* ns : {kOperatorNs, kTeamNs}) {
      KubectlResult r = cluster_->Kubectl({"create", "namespace", ns});
      if (!r.ok())
        return Status::Unavailable(std::string("create namespace ") + ns + ": " + r.Describe());
    }

    kube::WebhookCertRequest request;
    request.dns_names = kube::ServiceDnsNames("granary-webhook", kOperatorNs);
    request.ip_addresses = {"127.0.0.1"};
    GRANARY_ASSIGN_OR_RETURN(kube::WebhookCert cert, kube::MakeWebhookCert(request));
    kube::WebhookServerOptions options;
    options.cert_pem = cert.cert_pem;
    options.key_pem = cert.key_pem;
    options.operator_namespace = kOperatorNs;
    options.on_reply = [](const kube::MutateReply&) { ++calls_; };
    GRANARY_ASSIGN_OR_RETURN(
        std::unique_ptr<WebhookServer> server,
        WebhookServer::Start(
            options, [](const std::string& ns, const std::string& name) -> Result<InjectionInputs> {
              if (ns != kTeamNs || name != "imagenet") {
                return Status::NotFound("Dataset " + ns + "/" + name +
                                        " does not exist; create it or fix the pod's label");
              }
              InjectionInputs in;
              in.dataset_namespace = ns;
              in.dataset_name = name;
              in.pool.name = "gpu";
              in.pool.node_selector = {{"granary.io/nvme", "true"}};
              in.pool.tolerations = json::array(
                  {{{"key", "nvidia.com/gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}});
              in.store_secret_name = "granary-gpu-store";
              in.run_as_uid = 1000;
              in.run_as_gid = 1000;
              in.dataset_phase = "Ready";
              return in;
            }));
    server_ = server.release();

    json config = WebhookConfig(server_->port(), cert.ca_pem);
    KubectlResult applied = cluster_->Kubectl({"apply", "-f", "-"}, config.dump());
    if (!applied.ok()) return Status::Unavailable("apply webhook: " + applied.Describe());

    // The API server picks the configuration up through an informer: wait
    // until a server-side dry run of a labelled pod comes back injected.
    std::string last;
    Status active = cluster_->WaitFor(
        [&] {
          json probe = Pod("probe", "imagenet");
          KubectlResult r = cluster_->Kubectl(
              {"create", "-n", kTeamNs, "--dry-run=server", "-o", "json", "-f", "-"}, probe.dump());
          last = r.Describe() + r.out.substr(0, 300);
          return r.ok() && r.out.find("granary-sidecar") != std::string::npos;
        },
        seconds(60), "the webhook to be called");
    if (!active.ok()) return Status::DeadlineExceeded(active.ToString() + "; last: " + last);
    return Status::Ok();
  }

  static json WebhookConfig(uint16_t port, const std::string& ca_pem) {
    return {{"apiVersion", "admissionregistration.k8s.io/v1"},
            {"kind", "MutatingWebhookConfiguration"},
            {"metadata", {{"name", "granary-sidecar"}}},
            {"webhooks",
             json::array({{
                 {"name", "sidecar.granary.io"},
                 {"admissionReviewVersions", {"v1"}},
                 {"sideEffects", "None"},
                 {"failurePolicy", "Fail"},
                 {"timeoutSeconds", 5},
                 {"reinvocationPolicy", "Never"},
                 {"clientConfig",
                  {{"url", "https://127.0.0.1:" + std::to_string(port) + "/mutate"},
                   {"caBundle", kube::Base64Encode(ca_pem)}}},
                 {"rules", json::array({{{"operations", {"CREATE"}},
                                         {"apiGroups", {""}},
                                         {"apiVersions", {"v1"}},
                                         {"resources", {"pods"}},
                                         {"scope", "Namespaced"}}})},
                 {"objectSelector",
                  {{"matchExpressions",
                    json::array({{{"key", "granary.io/dataset"}, {"operator", "Exists"}}})}}},
                 {"namespaceSelector",
                  {{"matchExpressions", json::array({{{"key", "kubernetes.io/metadata.name"},
                                                      {"operator", "NotIn"},
                                                      {"values", {kOperatorNs}}}})}}},
             }})}};
  }

  static KubectlResult Create(const std::string& ns, const json& pod) {
    return cluster_->Kubectl({"create", "-n", ns, "-f", "-"}, pod.dump());
  }
  static Result<json> Get(const std::string& ns, const std::string& name) {
    return cluster_->GetJson({"pod", name, "-n", ns});
  }

  static inline KubeCluster* cluster_ = nullptr;
  static inline WebhookServer* server_ = nullptr;
  // Requests the API server sent to the test's webhook.
  static inline std::atomic<int> calls_{0};
};

TEST_F(WebhookTest, LabelledPodIsStoredWithTheSidecarEnvAndAffinityAndIsScheduled) {
  KubectlResult created = Create(kTeamNs, Pod("train", "imagenet"));
  ASSERT_TRUE(created.ok()) << created.Describe();
  Result<json> pod = Get(kTeamNs, "train");
  ASSERT_TRUE(pod.ok()) << pod.status().ToString();
  const json& spec = (*pod)["spec"];

  ASSERT_TRUE(spec.contains("initContainers")) << pod->dump(1);
  const json& sidecar = spec["initContainers"][0];
  EXPECT_EQ(sidecar["name"], "granary-sidecar");
  EXPECT_EQ(sidecar["restartPolicy"], "Always");
  EXPECT_EQ(sidecar["startupProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(sidecar["securityContext"]["runAsNonRoot"], true);
  EXPECT_THAT((*pod)["metadata"]["annotations"]["granary.io/sidecar-config"].get<std::string>(),
              HasSubstr("pool: gpu"));

  const json& trainer = spec["containers"][0];
  const json* socket = FindNamed(trainer["env"], "GRANARY_SOCKET");
  ASSERT_NE(socket, nullptr) << trainer.dump(1);
  EXPECT_EQ((*socket)["value"], "/run/granary/sidecar.sock");
  const json* dataset = FindNamed(trainer["env"], "GRANARY_DATASET");
  ASSERT_NE(dataset, nullptr);
  EXPECT_EQ((*dataset)["value"], kube::GranaryDatasetName(kTeamNs, "imagenet"));
  EXPECT_NE(FindNamed(trainer["volumeMounts"], "granary-socket"), nullptr);
  EXPECT_NE(FindNamed(spec["volumes"], "granary-socket"), nullptr);

  const json& terms = spec["affinity"]["nodeAffinity"]
                          ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_EQ(terms.size(), 1u);
  EXPECT_EQ(terms[0]["matchExpressions"][0]["key"], "granary.io/nvme");
  bool tolerated = false;
  for (const json& t : spec["tolerations"])
    tolerated = tolerated || t.value("key", "") == "nvidia.com/gpu";
  EXPECT_TRUE(tolerated) << spec["tolerations"].dump();

  // The real scheduler binds it to a pool node.
  std::string node;
  Status bound = cluster_->WaitFor(
      [&] {
        Result<json> p = Get(kTeamNs, "train");
        if (!p.ok()) return false;
        node = (*p)["spec"].value("nodeName", "");
        return !node.empty();
      },
      seconds(60), "pod train to be scheduled");
  ASSERT_TRUE(bound.ok()) << bound.ToString();
  EXPECT_THAT(node, ::testing::StartsWith("gpu-node-"));
}

TEST_F(WebhookTest, UserAffinityAndNodeNameAreKept) {
  json pod = Pod("pinned", "imagenet");
  pod["spec"]["nodeName"] = "gpu-node-2";
  pod["spec"]["affinity"] = {
      {"nodeAffinity",
       {{"requiredDuringSchedulingIgnoredDuringExecution",
         {{"nodeSelectorTerms",
           json::array({{{"matchExpressions", json::array({{{"key", "nvidia.com/gpu.present"},
                                                            {"operator", "In"},
                                                            {"values", {"true"}}}})}}})}}}}}};
  KubectlResult created = Create(kTeamNs, pod);
  ASSERT_TRUE(created.ok()) << created.Describe();
  Result<json> stored = Get(kTeamNs, "pinned");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ((*stored)["spec"]["nodeName"], "gpu-node-2");
  const json& terms =
      (*stored)["spec"]["affinity"]["nodeAffinity"]
               ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
  ASSERT_EQ(terms.size(), 1u);
  ASSERT_EQ(terms[0]["matchExpressions"].size(), 2u);
  EXPECT_EQ(terms[0]["matchExpressions"][0]["key"], "nvidia.com/gpu.present");
  EXPECT_EQ(terms[0]["matchExpressions"][1]["key"], "granary.io/nvme");
}

TEST_F(WebhookTest, UnlabelledPodsAndTheOperatorNamespaceAreUntouched) {
  // The API server never calls the webhook for them (its objectSelector and
  // namespaceSelector), so nothing can have changed them; and none of what
  // the webhook adds is there.
  const int calls_before = calls_.load();
  for (const auto& [ns, pod] :
       {std::pair<std::string, json>{kTeamNs, Pod("plain", "")},
        std::pair<std::string, json>{kOperatorNs, Pod("own", "imagenet")}}) {
    KubectlResult created = Create(ns, pod);
    ASSERT_TRUE(created.ok()) << created.Describe();
    Result<json> stored = Get(ns, pod["metadata"]["name"]);
    ASSERT_TRUE(stored.ok());
    EXPECT_FALSE((*stored)["spec"].contains("initContainers")) << stored->dump(1);
    EXPECT_FALSE((*stored)["spec"].contains("affinity"));
    EXPECT_FALSE((*stored)["metadata"].contains("annotations"));
    EXPECT_EQ(
        FindNamed((*stored)["spec"]["containers"][0].value("env", json::array()), "GRANARY_SOCKET"),
        nullptr);
  }
  EXPECT_EQ(calls_.load(), calls_before) << "the webhook was called for a pod it must not see";
}

TEST_F(WebhookTest, UpdatesAreNotMutated) {
  // A pod created without the label and labelled afterwards (an UPDATE):
  // registered for CREATE only, the webhook is not even called.
  ASSERT_TRUE(Create(kTeamNs, Pod("late", "")).ok());
  const int calls_before = calls_.load();
  KubectlResult labelled =
      cluster_->Kubectl({"label", "-n", kTeamNs, "pod/late", "granary.io/dataset=imagenet"});
  ASSERT_TRUE(labelled.ok()) << labelled.Describe();
  EXPECT_EQ(calls_.load(), calls_before);
  Result<json> late = Get(kTeamNs, "late");
  ASSERT_TRUE(late.ok());
  EXPECT_EQ((*late)["metadata"]["labels"]["granary.io/dataset"], "imagenet");
  EXPECT_FALSE((*late)["spec"].contains("initContainers"));

  // An injected pod updated keeps exactly one sidecar.
  ASSERT_TRUE(Create(kTeamNs, Pod("touched", "imagenet")).ok());
  KubectlResult annotated = cluster_->Kubectl({"annotate", "-n", kTeamNs, "pod/touched", "team=a"});
  ASSERT_TRUE(annotated.ok()) << annotated.Describe();
  Result<json> touched = Get(kTeamNs, "touched");
  ASSERT_TRUE(touched.ok());
  EXPECT_EQ((*touched)["spec"]["initContainers"].size(), 1u);
  EXPECT_EQ((*touched)["metadata"]["annotations"]["team"], "a");
}

TEST_F(WebhookTest, PodNamingAMissingDatasetIsRefusedWithTheReason) {
  KubectlResult created = Create(kTeamNs, Pod("lost", "no-such-dataset"));
  ASSERT_FALSE(created.ok());
  EXPECT_THAT(created.err, HasSubstr("Dataset team-a/no-such-dataset does not exist"));
  EXPECT_FALSE(Get(kTeamNs, "lost").ok());
}

// Takes the test's webhook down.
TEST_F(WebhookTest, WebhookDownRefusesLabelledPodsOnlyWithFailurePolicyFail) {
  server_->Stop();
  KubectlResult labelled = Create(kTeamNs, Pod("while-down", "imagenet"));
  ASSERT_FALSE(labelled.ok());
  EXPECT_THAT(labelled.err, HasSubstr("sidecar.granary.io"));
  KubectlResult plain = Create(kTeamNs, Pod("plain-while-down", ""));
  EXPECT_TRUE(plain.ok()) << plain.Describe();
}

// A port that was free a moment ago (the operator binds it itself).
uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// After the test's own server is down: granary-operator --webhook-listen,
// looking the example Dataset and CachePool up through the API server.
TEST_F(WebhookTest, GranaryOperatorServesTheWebhookFromRealDatasets) {
  const std::string source = GRANARY_SOURCE_DIR;
  KubectlResult crds =
      cluster_->Kubectl({"apply", "--server-side", "-f", source + "/charts/granary/crds/"});
  ASSERT_TRUE(crds.ok()) << crds.Describe();
  ASSERT_TRUE(cluster_
                  ->Kubectl({"wait", "--for=condition=established", "--timeout=60s",
                             "crd/cachepools.granary.io", "crd/datasets.granary.io"})
                  .ok());
  for (const char* file : {"cachepool.yaml", "dataset.yaml"}) {
    KubectlResult r = cluster_->Kubectl({"apply", "-f", source + "/examples/kubernetes/" + file});
    ASSERT_TRUE(r.ok()) << file << ": " << r.Describe();
  }

  kube::WebhookCertRequest request;
  request.ip_addresses = {"127.0.0.1"};
  Result<kube::WebhookCert> cert = kube::MakeWebhookCert(request);
  ASSERT_TRUE(cert.ok()) << cert.status().ToString();
  TempDir dir;
  dir.WriteFile("certs/tls.crt", cert->cert_pem);
  dir.WriteFile("certs/tls.key", cert->key_pem);
  const uint16_t port = FreePort();
  ASSERT_NE(port, 0);
  DaemonProcessOptions o;
  o.binary = GRANARY_OPERATOR_BINARY;
  o.name = "granary-operator";
  o.log_path = dir.Join("operator.log");
  o.args = {"--kubeconfig=" + cluster_->kubeconfig_path(),
            "--namespace=granary",
            "--leader-elect=false",
            "--metrics-listen=127.0.0.1:0",
            "--webhook-listen=127.0.0.1:" + std::to_string(port),
            "--webhook-cert-dir=" + dir.Join("certs")};
  Result<std::unique_ptr<DaemonProcess>> op = DaemonProcess::Start(o);
  ASSERT_TRUE(op.ok()) << op.status().ToString();

  KubectlResult applied =
      cluster_->Kubectl({"apply", "-f", "-"}, WebhookConfig(port, cert->ca_pem).dump());
  ASSERT_TRUE(applied.ok()) << applied.Describe();
  // No cache node runs here, so the Dataset gets no snapshot: the webhook
  // refuses pods that name it, saying what to wait for.
  std::string last;
  Status refusing = cluster_->WaitFor(
      [&] {
        KubectlResult r = cluster_->Kubectl(
            {"create", "-n", kTeamNs, "--dry-run=server", "-o", "json", "-f", "-"},
            Pod("probe", "imagenet-train").dump());
        last = r.Describe();
        return !r.ok() && r.err.find("has no snapshot yet") != std::string::npos;
      },
      seconds(60), "granary-operator's webhook to refuse a Dataset without a snapshot");
  ASSERT_TRUE(refusing.ok()) << refusing.ToString() << "; last: " << last << "\n"
                             << (*op)->LogTail();
  EXPECT_THAT(last, HasSubstr("kubectl get dataset imagenet-train -n team-a"));

  // Once the Dataset has a snapshot (its phase as the operator would write
  // it; the end-to-end test snapshots one for real), pods are admitted.
  KubectlResult staged = cluster_->Kubectl({"patch", "dataset", "imagenet-train", "-n", kTeamNs,
                                            "--subresource=status", "--type=merge", "-p",
                                            R"({"status":{"phase":"Staging"}})"});
  ASSERT_TRUE(staged.ok()) << staged.Describe();
  Status active = cluster_->WaitFor(
      [&] {
        KubectlResult r = cluster_->Kubectl(
            {"create", "-n", kTeamNs, "--dry-run=server", "-o", "json", "-f", "-"},
            Pod("probe", "imagenet-train").dump());
        last = r.Describe();
        return r.ok() && r.out.find("granary-sidecar") != std::string::npos;
      },
      seconds(60), "granary-operator's webhook to inject a sidecar");
  ASSERT_TRUE(active.ok()) << active.ToString() << "; last: " << last << "\n" << (*op)->LogTail();

  KubectlResult created = Create(kTeamNs, Pod("real", "imagenet-train"));
  ASSERT_TRUE(created.ok()) << created.Describe();
  Result<json> pod = Get(kTeamNs, "real");
  ASSERT_TRUE(pod.ok());
  // The window from the Dataset's spec.prefetch (512Mi, 2048), the arena
  // grown past the pool's 320Mi to hold it, the pool's store Secret.
  const std::string config = (*pod)["metadata"]["annotations"]["granary.io/sidecar-config"];
  EXPECT_THAT(config, HasSubstr("pool: gpu\n"));
  EXPECT_THAT(config, HasSubstr("window_bytes: 536870912\n"));
  EXPECT_THAT(config, HasSubstr("window_samples: 2048\n"));
  EXPECT_THAT(config, HasSubstr("arena_bytes: 603979776\n"));
  const json* store = FindNamed((*pod)["spec"]["volumes"], "granary-store");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ((*store)["secret"]["secretName"], kube::SidecarStoreSecretName("gpu"));
  // The sidecar runs as the Dataset's runAs identity (examples/kubernetes/dataset.yaml).
  const json& sidecar = (*pod)["spec"]["initContainers"][0];
  EXPECT_EQ(sidecar["securityContext"]["runAsUser"], 1000);
  const json* dataset = FindNamed((*pod)["spec"]["containers"][0]["env"], "GRANARY_DATASET");
  ASSERT_NE(dataset, nullptr);
  EXPECT_EQ((*dataset)["value"], kube::GranaryDatasetName(kTeamNs, "imagenet-train"));
  EXPECT_EQ(
      (*pod)["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
      "granary.io/nvme");

  KubectlResult missing = Create(kTeamNs, Pod("missing", "no-such-dataset"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.err, HasSubstr("Dataset team-a/no-such-dataset does not exist"));
}

// The flags are checked before anything is reached (no cluster needed).
TEST(WebhookFlagsTest, BadWebhookFlagsAreUsageErrors) {
  TempDir dir;
  dir.WriteFile("empty/.keep", "");
  const std::string binary = GRANARY_OPERATOR_BINARY;
  for (const std::string& args : {
           std::string("--webhook-listen=127.0.0.1:0"),
           "--webhook-cert-dir=" + dir.Join("empty"),
           "--webhook-listen=127.0.0.1:0 --webhook-cert-dir=" + dir.Join("empty"),
           "--webhook-listen=not:an:address --webhook-cert-dir=" + dir.Join("empty"),
       }) {
    const std::string command = binary + " " + args + " >/dev/null 2>&1";
    const int status = std::system(command.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << command;
    EXPECT_EQ(WEXITSTATUS(status), 2) << command;
  }
}

}  // namespace
}  // namespace granary::testing

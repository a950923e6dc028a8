// granary-operator: the Kubernetes controller for CachePools and Datasets
// (docs/kubernetes.md). Connects with a kubeconfig (--kubeconfig) or as its
// pod's service account, serves /metrics, /healthz and /readyz (and, with
// --webhook-listen, the sidecar-injecting webhook, whose certificate and
// registration it keeps with --webhook-service or --webhook-url), and runs
// until SIGTERM or SIGINT. Exit status: 0 clean stop, 1 start-up failure
// (API server unreachable, metrics address in use), 2 bad command line.

#include <CLI/CLI.hpp>
#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "granary/core/config.h"
#include "granary/core/log.h"
#include "granary/core/net_address.h"
#include "granary/core/thread_name.h"
#include "granary/daemon/daemon_main.h"
#include "granary/daemon/observability.h"
#include "granary/kube/kube_client.h"
#include "granary/kube/kube_config.h"
#include "granary/operator/operator.h"
#include "granary/operator/webhook_lookup.h"
#include "granary/operator/webhook_registration.h"
#include "granary/operator/webhook_server.h"

namespace {

int64_t ParseMillis(const std::string& text, const char* flag, bool* ok) {
  granary::Result<std::chrono::milliseconds> d = granary::ParseDuration(text);
  if (!d.ok() || d->count() <= 0) {
    std::fprintf(stderr, "granary-operator: %s %s: write a duration such as 15s\n", flag,
                 text.c_str());
    *ok = false;
    return 0;
  }
  return d->count();
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  return static_cast<bool>(in) || in.eof();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "granary-operator: runs Granary on Kubernetes: CachePools become cache-node DaemonSets, "
      "Datasets become staged Granary datasets (docs/kubernetes.md)."};
  granary::DaemonMain daemon("granary-operator", app);
  std::string kubeconfig, context, ns, identity, metrics_listen = "0.0.0.0:9467";
  std::string lease_duration = "15s", renew_deadline = "10s", retry_period = "2s";
  std::string progress_interval = "2s";
  std::string cachenode_command = "granary-cachenode";
  std::string cachenode_service_account = "granary-cachenode";
  std::string cluster_key_secret = "granary-cluster-key";
  std::string webhook_listen, webhook_cert_dir;
  std::string webhook_service, webhook_url, webhook_ca_file,
      webhook_failure_policy = "Fail", webhook_timeout = "10s", webhook_cert_validity = "8760h",
      webhook_cert_renew_before = "720h";
  std::vector<std::string> webhook_cert_ips;
  int webhook_service_port = 443;
  bool leader_elect = true;
  int workers = 2;
  app.add_option("--kubeconfig", kubeconfig,
                 "A kubeconfig file; default: in-cluster service account, else $KUBECONFIG");
  app.add_option("--context", context, "The kubeconfig context (default: current-context)");
  app.add_option("--namespace", ns,
                 "Where pool objects and the Lease live (default: the pod's or kubeconfig's "
                 "namespace, else granary)");
  app.add_option("--identity", identity, "This replica's name in the Lease (default: $POD_NAME)");
  app.add_option("--leader-elect", leader_elect, "Elect one acting replica through a Lease")
      ->default_val(true);
  app.add_option("--lease-duration", lease_duration, "How long a Lease holds without renewal");
  app.add_option("--renew-deadline", renew_deadline, "A leader that cannot renew this long stops");
  app.add_option("--retry-period", retry_period, "How often candidates try and leaders renew");
  app.add_option("--progress-interval", progress_interval,
                 "How often Datasets that are not Ready are looked at again");
  app.add_option("--workers", workers, "Reconciling threads")->check(CLI::Range(1, 64));
  app.add_option("--metrics-listen", metrics_listen, "/metrics, /healthz, /readyz (host:port)");
  app.add_option("--cachenode-service-account", cachenode_service_account,
                 "ServiceAccount of the cache-node pods (needs create on tokenreviews)")
      ->capture_default_str();
  app.add_option("--cluster-key-secret", cluster_key_secret,
                 "Secret (in --namespace) with the cluster key under 'key'; made when missing")
      ->capture_default_str();
  app.add_option("--cachenode-command", cachenode_command,
                 "The command of the cache-node containers it generates");
  app.add_option("--webhook-listen", webhook_listen,
                 "Serve the sidecar-injecting webhook (HTTPS POST /mutate) on this IP:port; "
                 "default: off (docs/kubernetes-webhook.md)");
  app.add_option("--webhook-cert-dir", webhook_cert_dir,
                 "The webhook's serving certificate and key: <dir>/tls.crt and <dir>/tls.key "
                 "(PEM), e.g. a mounted kubernetes.io/tls Secret, instead of the certificate "
                 "the operator makes");
  app.add_option("--webhook-service", webhook_service,
                 "Register the webhook as this Service in the operator's namespace (port "
                 "--webhook-service-port, path /mutate), and keep its certificate in the Secret "
                 "granary-webhook-tls");
  app.add_option("--webhook-service-port", webhook_service_port, "The webhook Service's port");
  app.add_option("--webhook-url", webhook_url,
                 "Register the webhook at this https URL instead of a Service (tests, outside "
                 "the cluster)");
  app.add_option("--webhook-ca-file", webhook_ca_file,
                 "With --webhook-cert-dir: register with this CA bundle (PEM) as caBundle");
  app.add_option("--webhook-cert-ip", webhook_cert_ips,
                 "An IP address the operator's webhook certificate also names (repeatable)");
  app.add_option("--webhook-cert-validity", webhook_cert_validity,
                 "How long a webhook certificate the operator makes is valid");
  app.add_option("--webhook-cert-renew-before", webhook_cert_renew_before,
                 "Renew the webhook certificate when less than this of its validity is left");
  app.add_option("--webhook-failure-policy", webhook_failure_policy,
                 "Fail (labelled pods are refused while the webhook is down) or Ignore");
  app.add_option("--webhook-timeout", webhook_timeout,
                 "How long the API server waits for the webhook (1s to 30s)");
  if (std::optional<int> exit = daemon.Parse(argc, argv)) return *exit;
  daemon.ApplyLogLevel(spdlog::level::info);  // no configuration file: info unless --log-level
  granary::kube::WebhookServerOptions webhook_options;
  std::optional<granary::kube::WebhookRegistrationOptions> registration;
  const bool registering = !webhook_service.empty() || !webhook_url.empty();
  auto usage = [&daemon](const std::string& message) { return daemon.Usage(message); };
  if (!webhook_listen.empty()) {
    granary::Result<granary::NetAddress> address =
        granary::ParseNetAddress(webhook_listen, "--webhook-listen");
    if (!address.ok()) return usage(address.status().message());
    if (webhook_cert_dir.empty() && !registering) {
      return usage(
          "--webhook-listen needs --webhook-service or --webhook-url (the operator makes its "
          "certificate and registers the webhook) or --webhook-cert-dir (a directory with "
          "tls.crt and tls.key)");
    }
    if (!webhook_cert_dir.empty()) {
      for (auto [name, out] : {std::pair{"tls.crt", &webhook_options.cert_pem},
                               std::pair{"tls.key", &webhook_options.key_pem}}) {
        const std::string path = webhook_cert_dir + "/" + name;
        if (!ReadFile(path, out) || out->empty()) {
          return usage("--webhook-cert-dir: cannot read " + path +
                       "; put the webhook's PEM certificate and key there as tls.crt and tls.key");
        }
      }
    }
    webhook_options.listen_host = address->host;
    webhook_options.listen_port = address->port;
  } else if (!webhook_cert_dir.empty() || registering || !webhook_ca_file.empty()) {
    return usage(
        "--webhook-cert-dir, --webhook-service, --webhook-url and --webhook-ca-file need "
        "--webhook-listen (where this replica serves the webhook)");
  }
  if (registering) {
    granary::kube::WebhookRegistrationOptions r;
    r.service_name = webhook_service;
    r.service_port = webhook_service_port;
    r.url = webhook_url;
    r.failure_policy = webhook_failure_policy;
    granary::Result<std::chrono::milliseconds> timeout = granary::ParseDuration(webhook_timeout);
    if (!timeout.ok() || timeout->count() % 1000 != 0) {
      return usage("--webhook-timeout " + webhook_timeout +
                   ": write whole seconds from 1s to 30s, such as 10s");
    }
    r.timeout_seconds = static_cast<int>(timeout->count() / 1000);
    r.cert_ips = webhook_cert_ips;
    r.manage_certificate = webhook_cert_dir.empty();
    if (!r.manage_certificate) {
      if (webhook_ca_file.empty()) {
        return usage(
            "--webhook-cert-dir with --webhook-service or --webhook-url needs --webhook-ca-file "
            "(the CA the API server is to trust); or leave out --webhook-cert-dir and the "
            "operator makes and renews its own certificate");
      }
      if (!ReadFile(webhook_ca_file, &r.ca_bundle_pem)) {
        return usage("--webhook-ca-file: cannot read " + webhook_ca_file);
      }
      if (!webhook_cert_ips.empty()) {
        return usage(
            "--webhook-cert-ip names an IP in the certificate the operator makes; with "
            "--webhook-cert-dir put it in your own certificate");
      }
    }
    for (auto [text, flag, out] :
         {std::tuple{&webhook_cert_validity, "--webhook-cert-validity", &r.cert_validity},
          std::tuple{&webhook_cert_renew_before, "--webhook-cert-renew-before", &r.renew_before}}) {
      granary::Result<std::chrono::milliseconds> d = granary::ParseDuration(*text);
      if (!d.ok() || d->count() < 1000) {
        return usage(std::string(flag) + " " + *text + ": write a duration such as 720h");
      }
      *out = std::chrono::duration_cast<std::chrono::seconds>(*d);
    }
    registration = r;
  } else if (!webhook_ca_file.empty()) {
    return usage("--webhook-ca-file needs --webhook-service or --webhook-url (where to register)");
  } else if (!webhook_cert_ips.empty()) {
    return usage("--webhook-cert-ip needs --webhook-service or --webhook-url");
  }

  granary::kube::OperatorOptions options;
  bool durations_ok = true;
  options.lease_duration =
      std::chrono::milliseconds(ParseMillis(lease_duration, "--lease-duration", &durations_ok));
  options.renew_deadline =
      std::chrono::milliseconds(ParseMillis(renew_deadline, "--renew-deadline", &durations_ok));
  options.retry_period =
      std::chrono::milliseconds(ParseMillis(retry_period, "--retry-period", &durations_ok));
  options.progress_interval = std::chrono::milliseconds(
      ParseMillis(progress_interval, "--progress-interval", &durations_ok));
  if (!durations_ok) return granary::kDaemonExitUsage;
  if (options.renew_deadline >= options.lease_duration ||
      options.retry_period >= options.renew_deadline) {
    return usage("write --retry-period < --renew-deadline < --lease-duration");
  }

  granary::Result<granary::kube::KubeConfig> config =
      kubeconfig.empty() ? granary::kube::InClusterConfig()
                         : granary::kube::LoadKubeConfig(kubeconfig, context);
  if (!config.ok() && kubeconfig.empty() &&
      config.status().code() == granary::StatusCode::kNotFound) {
    config = granary::kube::LoadKubeConfig("", context);
  }
  if (!config.ok()) return daemon.BadConfig(config.status());
  options.namespace_ = !ns.empty()                   ? ns
                       : !config->namespace_.empty() ? config->namespace_
                                                     : "granary";
  if (identity.empty()) {
    if (const char* pod = std::getenv("POD_NAME"); pod != nullptr) identity = pod;
  }
  options.identity = identity;
  options.leader_elect = leader_elect;
  options.workers = workers;
  options.cachenode_command = cachenode_command;
  options.cachenode_service_account = cachenode_service_account;
  options.cluster_key_secret = cluster_key_secret;
  if (registration) {
    registration->namespace_ = options.namespace_;
    granary::Status valid = granary::kube::ValidateWebhookRegistration(*registration);
    if (!valid.ok()) return usage(valid.message());
    options.webhook = registration;
  }

  daemon.PrepareSignals();  // before the client, the servers and the operator start threads
  auto client = granary::kube::KubeClient::Create(*config);
  if (!client.ok()) return usage(client.status().ToString());
  // The API server must answer before the operator calls itself started.
  granary::Result<granary::kube::Json> version = (*client)->Get("/version");
  if (!version.ok()) {
    std::fprintf(stderr, "granary-operator: the API server at %s: %s\n", config->Describe().c_str(),
                 version.status().ToString().c_str());
    return granary::kDaemonExitRuntime;
  }
  auto registry = std::make_shared<prometheus::Registry>();
  granary::MetricRegistrar metrics(*registry, "operator");
  auto reconciles = metrics.AddCounter("granary_operator_reconciles_total",
                                       "Reconciles of CachePools and Datasets.");
  auto errors = metrics.AddCounter("granary_operator_reconcile_errors_total",
                                   "Reconciles that failed and were retried.");
  auto relists = metrics.AddCounter("granary_operator_relists_total",
                                    "Lists again after a watch's resourceVersion was gone (410).");
  auto leader = metrics.AddGauge("granary_operator_leader", "1 while this replica leads.");
  auto webhook_requests = metrics.AddCounterFamily(
      "granary_operator_webhook_requests_total",
      "Admission requests the sidecar webhook answered, by outcome: injected, skipped (not "
      "selected, an UPDATE, already injected), refused (a Dataset the pod may not use), "
      "lookup_error (the Dataset could not be looked up), bad_request (not a usable "
      "AdmissionReview or pod), error.",
      {"outcome"});
  auto datasets = metrics.AddGaugeFamily(
      "granary_operator_datasets",
      "Datasets this replica's cache holds, by status.phase (every replica reports all).",
      {"phase"});
  auto api_requests = metrics.AddCounterFamily(
      "granary_operator_api_requests_total",
      "Requests this replica made to the Kubernetes API server, by verb (get, list, watch, "
      "create, update, patch, delete) and resource, as kube-apiserver counts them.",
      {"verb", "resource"});
  auto quota_bytes = metrics.AddGaugeFamily(
      "granary_operator_namespace_quota_bytes",
      "The bytes (replicas counted) a namespace's Datasets may keep in a pool together "
      "(CachePool spec.quotas), for each namespace with a quota.",
      {"pool", "namespace"});
  auto wanted_bytes = metrics.AddGaugeFamily(
      "granary_operator_namespace_wanted_bytes",
      "What a namespace's Datasets in a pool would keep if nothing limited them: their "
      "snapshots' bytes times their replication, summed.",
      {"pool", "namespace"});
  auto resident_bytes = metrics.AddGaugeFamily(
      "granary_operator_namespace_resident_bytes",
      "What a namespace's Datasets in a pool keep staged on the cache nodes (their "
      "status.stagedBytes, replicas counted), summed.",
      {"pool", "namespace"});
  if (!reconciles.ok() || !errors.ok() || !relists.ok() || !leader.ok() || !webhook_requests.ok() ||
      !datasets.ok() || !api_requests.ok() || !quota_bytes.ok() || !wanted_bytes.ok() ||
      !resident_bytes.ok()) {
    std::fprintf(stderr, "granary-operator: declaring metrics failed\n");
    return granary::kDaemonExitRuntime;
  }
  auto log = granary::GetLogger("operator");
  // The operator, once started, for the webhook's lookups (cleared before it stops).
  std::atomic<const granary::kube::Operator*> op_for_webhook{nullptr};
  // The webhook server first: the operator hands it the certificates it reads.
  std::unique_ptr<granary::kube::WebhookServer> webhook;
  if (!webhook_listen.empty()) {
    webhook_options.operator_namespace = options.namespace_;
    // Every answer is counted; refusals and failures are logged with the pod.
    webhook_options.on_reply = [family = *webhook_requests,
                                log](const granary::kube::MutateReply& reply) {
      granary::Result<prometheus::Counter*> counter = family.WithLabels({reply.outcome});
      if (counter.ok()) (*counter)->Increment();
      if (reply.outcome == "injected") {
        log->info("webhook: injected the sidecar into pod {}", reply.pod);
      } else if (reply.outcome == "refused") {
        log->info("webhook: refused pod {}: {}", reply.pod, reply.message);
      } else {  // lookup_error, bad_request, error
        log->warn("webhook: {} for pod {}: {}", reply.outcome, reply.pod, reply.message);
      }
    };
    // Admission requests read the operator's informers once it has started
    // (before that: the API server).
    granary::kube::InjectionCache cache;
    cache.dataset =
        [&op_for_webhook](const std::string& key) -> std::optional<granary::kube::Json> {
      const granary::kube::Operator* o = op_for_webhook.load();
      return o != nullptr ? o->CachedDataset(key) : std::nullopt;
    };
    cache.pool = [&op_for_webhook](const std::string& name) -> std::optional<granary::kube::Json> {
      const granary::kube::Operator* o = op_for_webhook.load();
      return o != nullptr ? o->CachedPool(name) : std::nullopt;
    };
    auto started = granary::kube::WebhookServer::Start(
        webhook_options, granary::kube::CachedInjectionLookup(**client, std::move(cache)));
    if (!started.ok()) {
      std::fprintf(stderr, "granary-operator: --webhook-listen %s: %s\n", webhook_listen.c_str(),
                   started.status().ToString().c_str());
      return started.status().code() == granary::StatusCode::kInvalidArgument
                 ? granary::kDaemonExitUsage
                 : granary::kDaemonExitRuntime;
    }
    webhook = std::move(*started);
    log->info("serving the sidecar webhook on {}:{}{}", webhook_options.listen_host,
              webhook->port(),
              webhook->has_certificate() ? "" : " once the Secret has its certificate");
    if (registration && registration->manage_certificate) {
      granary::kube::WebhookServer* server = webhook.get();
      options.on_webhook_cert = [server, log](const granary::kube::WebhookCert& cert) {
        granary::Status s = server->SetCertificate(cert.cert_pem, cert.key_pem);
        if (!s.ok()) log->warn("loading the webhook certificate: {}", s.ToString());
      };
    }
  }
  auto op = granary::kube::Operator::Start(**client, options);
  if (!op.ok()) return daemon.StartFailed(op.status());
  op_for_webhook = op->get();
  auto server = granary::ObservabilityServer::Start(metrics_listen, registry, [&] {
    granary::Status ready = (*op)->Ready();
    if (ready.ok() && webhook && !webhook->has_certificate()) {
      return granary::Status::Unavailable("the webhook has no certificate yet (Secret " +
                                          std::string(granary::kube::kWebhookTlsSecretName) + ")");
    }
    return ready;
  });
  if (!server.ok()) {
    std::fprintf(stderr, "granary-operator: --metrics-listen %s: %s\n", metrics_listen.c_str(),
                 server.status().ToString().c_str());
    return granary::kDaemonExitRuntime;
  }
  log->info("granary-operator {} started against {} (namespace {}, metrics on {})",
            options.identity, config->Describe(), options.namespace_,
            (*server)->address().ToString());
  std::atomic<bool> done{false};
  std::thread exporter([&] {
    granary::NameThisThread("exporter");
    granary::kube::Operator::Counters last;
    std::map<granary::kube::RequestKind, uint64_t> last_requests;
    // (pool, namespace) of the quota, wanted and resident series exported.
    std::array<std::set<std::pair<std::string, std::string>>, 3> exported;
    while (!done) {
      for (const auto& [kind, count] : (*client)->RequestCounts()) {
        granary::Result<prometheus::Counter*> counter =
            api_requests->WithLabels({kind.verb, kind.resource});
        if (counter.ok()) {
          (*counter)->Increment(static_cast<double>(count - last_requests[kind]));
        }
        last_requests[kind] = count;
      }
      const auto c = (*op)->counters();
      (*reconciles)->Increment(static_cast<double>(c.reconciles - last.reconciles));
      (*errors)->Increment(static_cast<double>(c.reconcile_errors - last.reconcile_errors));
      (*relists)->Increment(static_cast<double>(c.relists - last.relists));
      (*leader)->Set((*op)->leading() ? 1 : 0);
      for (const auto& [phase, count] : (*op)->DatasetPhases()) {
        granary::Result<prometheus::Gauge*> gauge = datasets->WithLabels({phase});
        if (gauge.ok()) (*gauge)->Set(static_cast<double>(count));
      }
      // Per (pool, namespace); series gone since the last round are removed.
      std::array<std::set<std::pair<std::string, std::string>>, 3> now;
      const std::array<const granary::MetricFamily<prometheus::Gauge>*, 3> families = {
          &*quota_bytes, &*wanted_bytes, &*resident_bytes};
      for (const granary::kube::Operator::NamespaceUsage& u : (*op)->Usage()) {
        const uint64_t values[3] = {u.quota_bytes, u.wanted_bytes, u.resident_bytes};
        for (size_t i = 0; i < 3; ++i) {
          if (i == 0 && u.quota_bytes == 0) continue;  // no quota: no series
          granary::Result<prometheus::Gauge*> gauge =
              families[i]->WithLabels({u.pool, u.namespace_});
          if (!gauge.ok()) continue;
          (*gauge)->Set(static_cast<double>(values[i]));
          now[i].insert({u.pool, u.namespace_});
        }
      }
      for (size_t i = 0; i < 3; ++i) {
        for (const auto& [pool, space] : exported[i]) {
          if (now[i].count({pool, space}) != 0) continue;
          granary::Result<prometheus::Gauge*> gauge = families[i]->WithLabels({pool, space});
          if (gauge.ok()) families[i]->family()->Remove(*gauge);
        }
      }
      exported = std::move(now);
      last = c;
      for (int i = 0; i < 10 && !done; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  daemon.WaitForStop("operator");
  done = true;
  exporter.join();
  if (webhook) webhook->Stop();
  op_for_webhook = nullptr;
  (*op)->Stop();
  (*server)->Stop();
  return 0;
}

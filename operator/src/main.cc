// granary-operator: the Kubernetes controller for CachePools and Datasets
// (docs/kubernetes.md). Connects with a kubeconfig (--kubeconfig) or as its
// pod's service account, serves /metrics, /healthz and /readyz (and, with
// --webhook-listen, the sidecar-injecting webhook), and runs
// until SIGTERM or SIGINT. Exit status: 0 clean stop, 1 start-up failure
// (API server unreachable, metrics address in use), 2 bad command line.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "granary/core/config.h"
#include "granary/core/log.h"
#include "granary/core/net_address.h"
#include "granary/daemon/observability.h"
#include "granary/daemon/stop_signals.h"
#include "granary/operator/kube_client.h"
#include "granary/operator/kube_config.h"
#include "granary/operator/operator.h"
#include "granary/operator/webhook_lookup.h"
#include "granary/operator/webhook_server.h"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitUsage = 2;

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "granary-operator: runs Granary on Kubernetes: CachePools become cache-node DaemonSets, "
      "Datasets become staged Granary datasets (docs/kubernetes.md)."};
  std::string kubeconfig, context, ns, identity, metrics_listen = "0.0.0.0:9467",
                                                 log_level = "info";
  std::string lease_duration = "15s", renew_deadline = "10s", retry_period = "2s";
  std::string progress_interval = "2s";
  std::string cachenode_command = "granary-cachenode";
  std::string webhook_listen, webhook_cert_dir;
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
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  app.add_option("--cachenode-command", cachenode_command,
                 "The command of the cache-node containers it generates");
  app.add_option("--webhook-listen", webhook_listen,
                 "Serve the sidecar-injecting webhook (HTTPS POST /mutate) on this IP:port; "
                 "default: off (docs/kubernetes-webhook.md)");
  app.add_option("--webhook-cert-dir", webhook_cert_dir,
                 "The webhook's serving certificate and key: <dir>/tls.crt and <dir>/tls.key "
                 "(PEM), e.g. a mounted kubernetes.io/tls Secret");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  granary::Result<spdlog::level::level_enum> level = granary::ParseLogLevel(log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "granary-operator: --log-level: %s\n", level.status().message().c_str());
    return kExitUsage;
  }
  granary::SetLogLevel(*level);
  granary::kube::WebhookServerOptions webhook_options;
  if (!webhook_listen.empty()) {
    granary::Result<granary::NetAddress> address =
        granary::ParseNetAddress(webhook_listen, "--webhook-listen");
    if (!address.ok()) {
      std::fprintf(stderr, "granary-operator: %s\n", address.status().message().c_str());
      return kExitUsage;
    }
    if (webhook_cert_dir.empty()) {
      std::fprintf(stderr,
                   "granary-operator: --webhook-listen needs --webhook-cert-dir (a directory "
                   "with tls.crt and tls.key)\n");
      return kExitUsage;
    }
    auto read = [](const std::string& path, std::string* out) {
      std::ifstream in(path);
      if (!in) return false;
      std::ostringstream text;
      text << in.rdbuf();
      *out = text.str();
      return static_cast<bool>(in) || in.eof();
    };
    for (auto [name, out] : {std::pair{"tls.crt", &webhook_options.cert_pem},
                             std::pair{"tls.key", &webhook_options.key_pem}}) {
      const std::string path = webhook_cert_dir + "/" + name;
      if (!read(path, out) || out->empty()) {
        std::fprintf(stderr,
                     "granary-operator: --webhook-cert-dir: cannot read %s; put the webhook's "
                     "PEM certificate and key there as tls.crt and tls.key\n",
                     path.c_str());
        return kExitUsage;
      }
    }
    webhook_options.listen_host = address->host;
    webhook_options.listen_port = address->port;
  } else if (!webhook_cert_dir.empty()) {
    std::fprintf(stderr, "granary-operator: --webhook-cert-dir needs --webhook-listen\n");
    return kExitUsage;
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
  if (!durations_ok) return kExitUsage;
  if (options.renew_deadline >= options.lease_duration ||
      options.retry_period >= options.renew_deadline) {
    std::fprintf(stderr,
                 "granary-operator: write --retry-period < --renew-deadline < --lease-duration\n");
    return kExitUsage;
  }

  granary::Result<granary::kube::KubeConfig> config =
      kubeconfig.empty() ? granary::kube::InClusterConfig()
                         : granary::kube::LoadKubeConfig(kubeconfig, context);
  if (!config.ok() && kubeconfig.empty() &&
      config.status().code() == granary::StatusCode::kNotFound) {
    config = granary::kube::LoadKubeConfig("", context);
  }
  if (!config.ok()) {
    std::fprintf(stderr, "granary-operator: %s\n", config.status().message().c_str());
    return kExitUsage;
  }
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

  const sigset_t stop_signals = granary::BlockStopSignals();
  auto client = granary::kube::KubeClient::Create(*config);
  if (!client.ok()) {
    std::fprintf(stderr, "granary-operator: %s\n", client.status().ToString().c_str());
    return kExitUsage;
  }
  // The API server must answer before the operator calls itself started.
  granary::Result<granary::kube::Json> version = (*client)->Get("/version");
  if (!version.ok()) {
    std::fprintf(stderr, "granary-operator: the API server at %s: %s\n", config->Describe().c_str(),
                 version.status().ToString().c_str());
    return kExitRuntime;
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
  if (!reconciles.ok() || !errors.ok() || !relists.ok() || !leader.ok()) {
    std::fprintf(stderr, "granary-operator: declaring metrics failed\n");
    return kExitRuntime;
  }
  auto op = granary::kube::Operator::Start(**client, options);
  if (!op.ok()) {
    std::fprintf(stderr, "granary-operator: %s\n", op.status().ToString().c_str());
    return kExitRuntime;
  }
  auto server =
      granary::ObservabilityServer::Start(metrics_listen, registry, [&] { return (*op)->Ready(); });
  if (!server.ok()) {
    std::fprintf(stderr, "granary-operator: --metrics-listen %s: %s\n", metrics_listen.c_str(),
                 server.status().ToString().c_str());
    return kExitRuntime;
  }
  auto log = granary::GetLogger("operator");
  std::unique_ptr<granary::kube::WebhookServer> webhook;
  if (!webhook_listen.empty()) {
    webhook_options.operator_namespace = options.namespace_;
    auto started = granary::kube::WebhookServer::Start(webhook_options,
                                                       granary::kube::ApiInjectionLookup(**client));
    if (!started.ok()) {
      std::fprintf(stderr, "granary-operator: --webhook-listen %s: %s\n", webhook_listen.c_str(),
                   started.status().ToString().c_str());
      (*op)->Stop();
      return started.status().code() == granary::StatusCode::kInvalidArgument ? kExitUsage
                                                                              : kExitRuntime;
    }
    webhook = std::move(*started);
    log->info("serving the sidecar webhook on {}:{}", webhook_options.listen_host, webhook->port());
  }
  log->info("granary-operator {} started against {} (namespace {}, metrics on {})",
            options.identity, config->Describe(), options.namespace_,
            (*server)->address().ToString());
  std::atomic<bool> done{false};
  std::thread exporter([&] {
    granary::kube::Operator::Counters last;
    while (!done) {
      const auto c = (*op)->counters();
      (*reconciles)->Increment(static_cast<double>(c.reconciles - last.reconciles));
      (*errors)->Increment(static_cast<double>(c.reconcile_errors - last.reconcile_errors));
      (*relists)->Increment(static_cast<double>(c.relists - last.relists));
      (*leader)->Set((*op)->leading() ? 1 : 0);
      last = c;
      for (int i = 0; i < 10 && !done; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const std::string_view by = granary::WaitForStopSignal(stop_signals);
  log->info("received {}: stopping", by);
  done = true;
  exporter.join();
  if (webhook) webhook->Stop();
  (*op)->Stop();
  (*server)->Stop();
  return 0;
}

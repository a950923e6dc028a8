#pragma once

// The sidecar webhook's certificate and registration, kept by
// granary-operator's leader (docs/kubernetes-webhook.md, "Registration,
// certificate and store Secret"):
//   - a kubernetes.io/tls Secret (default granary-webhook-tls) in the
//     operator's namespace holding ca.crt, tls.crt and tls.key, made when
//     missing or unusable and renewed before it expires or when the names it
//     must carry change. Every renewal makes a new CA; ca.crt then holds the
//     new CA followed by the one being replaced, so replicas still serving
//     the old certificate stay trusted until they have read the new one;
//   - the MutatingWebhookConfiguration (default granary-sidecar-injector),
//     server-side applied with caBundle = ca.crt.
// Every replica serves with the Secret's certificate (the operator's Secret
// informer hands each new one to WebhookServer::SetCertificate).
//
// The pure pieces (option checks, the renewal decision, the objects) are
// free functions for unit tests; WebhookRegistrar does the API calls.
//
// Thread safety: the free functions are pure. A WebhookRegistrar is used by
// one thread at a time (granary-operator's registration thread).

#include <chrono>
#include <string>
#include <vector>

#include "granary/core/status.h"
#include "granary/kube/kube_client.h"
#include "granary/operator/webhook_cert.h"

namespace granary::kube {

inline constexpr std::string_view kWebhookTlsSecretName = "granary-webhook-tls";
inline constexpr std::string_view kWebhookConfigurationName = "granary-sidecar-injector";
inline constexpr std::string_view kWebhookName = "sidecar.granary.io";
inline constexpr std::string_view kWebhookPath = "/mutate";

struct WebhookRegistrationOptions {
  std::string namespace_;  // the operator's: the Secret, the Service, excluded from injection
  // How the API server reaches the webhook: a Service in namespace_
  // (service_name, service_port, kWebhookPath), or an https URL. One of the two.
  std::string service_name;
  int service_port = 443;
  std::string url;
  std::string configuration_name = std::string(kWebhookConfigurationName);
  std::string secret_name = std::string(kWebhookTlsSecretName);
  std::string failure_policy = "Fail";  // or Ignore
  int timeout_seconds = 10;             // 1..30
  // true: the operator makes and renews the Secret. false ("bring your own
  // certificate"): it only registers, with `ca_bundle_pem` as the caBundle.
  bool manage_certificate = true;
  std::string ca_bundle_pem;
  // Extra IP SANs (e.g. 127.0.0.1 for tests); the URL's host is added on its own.
  std::vector<std::string> cert_ips;
  std::chrono::seconds cert_validity{std::chrono::hours(24 * 365)};
  std::chrono::seconds renew_before{std::chrono::hours(720)};
  // How often the leader looks at the Secret and the configuration at the
  // latest (a change of the Secret is seen at once through the watch).
  std::chrono::milliseconds recheck{30000};
};

// Usage errors (kInvalidArgument), each naming its flag: neither or both of
// --webhook-service and --webhook-url, a URL that is not https://host[:port]/path
// (no user, query or fragment), a failure policy other than Fail or Ignore,
// a timeout outside 1..30 s, a bad --webhook-cert-ip, a renewal period not
// shorter than the validity.
Status ValidateWebhookRegistration(const WebhookRegistrationOptions& options);

// The host of an https URL ("127.0.0.1" of https://127.0.0.1:8443/mutate;
// brackets of an IPv6 literal removed). kInvalidArgument for anything else.
Result<std::string> WebhookUrlHost(const std::string& url);

// The names the serving certificate must carry: the Service's DNS names
// (ServiceDnsNames) or the URL's host (as a DNS name or an IP), plus cert_ips.
WebhookCertRequest DesiredWebhookCert(const WebhookRegistrationOptions& options);

// What the leader does with the Secret it found.
struct CertRenewal {
  enum class Action {
    kKeep,    // usable: serve it until renew_at
    kCreate,  // missing or unusable: a new one, replacing whatever is there
    kRenew,   // expiring, or its names no longer match: a new one
  };
  Action action = Action::kCreate;
  std::string reason;                              // for the log
  std::chrono::system_clock::time_point renew_at;  // kKeep: when it must be renewed
  WebhookCert current;                             // kKeep and kRenew: what the Secret holds
  WebhookCertInfo info;
};

// `secret` null: the Secret does not exist. Pure apart from OpenSSL parsing.
CertRenewal DecideCertRenewal(const Json* secret, const WebhookRegistrationOptions& options,
                              std::chrono::system_clock::time_point now);

// The certificate in a kubernetes.io/tls Secret's data (base64-decoded);
// kInvalidArgument when a key is missing or not base64. Not checked further
// (InspectWebhookCert does that).
Result<WebhookCert> WebhookCertFromSecret(const Json& secret);

// The Secret holding `cert`, labelled app.kubernetes.io/managed-by: granary-operator.
Json WebhookTlsSecret(const WebhookRegistrationOptions& options, const WebhookCert& cert);

// The MutatingWebhookConfiguration: pods, CREATE only; objectSelector
// granary.io/dataset Exists; the operator's namespace excluded; sideEffects
// None; admissionReviewVersions [v1]; caBundle = base64(ca_bundle_pem).
Json MutatingWebhookConfiguration(const WebhookRegistrationOptions& options,
                                  const std::string& ca_bundle_pem);

// The leader's side: one Reconcile looks at the Secret (making or renewing
// it when it must) and applies the configuration.
class WebhookRegistrar {
 public:
  WebhookRegistrar(KubeClient& client, WebhookRegistrationOptions options)
      : client_(client), options_(std::move(options)) {}

  // When to look again (options.recheck at the latest, sooner when the
  // certificate is due for renewal), or the error of an API call.
  Result<std::chrono::milliseconds> Reconcile();

 private:
  Result<std::string> KeepSecret();  // the CA bundle to register

  KubeClient& client_;
  const WebhookRegistrationOptions options_;
  std::chrono::milliseconds next_{0};
};

}  // namespace granary::kube

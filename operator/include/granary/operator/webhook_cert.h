#pragma once

// The webhook's TLS material: a self-signed CA and a serving certificate it
// signs, made with OpenSSL's C API (kept in webhook_cert.cc). The CA goes into
// the MutatingWebhookConfiguration's caBundle; the serving certificate carries
// the webhook Service's DNS names and any IP addresses as SANs.
// docs/kubernetes-webhook.md.
//
// Thread safety: pure functions (OpenSSL 3 is thread-safe for these calls).

#include <chrono>
#include <string>
#include <vector>

#include "granary/core/status.h"

namespace granary::kube {

struct WebhookCertRequest {
  std::string common_name = "granary-webhook";
  std::vector<std::string> dns_names;     // e.g. granary-webhook.granary.svc
  std::vector<std::string> ip_addresses;  // e.g. 127.0.0.1
  std::chrono::hours validity{24 * 365};
};

struct WebhookCert {
  std::string ca_pem;    // the CA certificate (the caBundle, before base64)
  std::string cert_pem;  // the serving certificate
  std::string key_pem;   // its private key (PKCS#8)
};

// A fresh CA (ECDSA P-256) and a serving certificate signed by it for
// `request`'s names. kInvalidArgument for no names or a bad IP address;
// kInternal when OpenSSL fails (its error queue in the message).
Result<WebhookCert> MakeWebhookCert(const WebhookCertRequest& request);

// The DNS names a Service is reached by inside the cluster:
// <service>, <service>.<ns>, <service>.<ns>.svc, <service>.<ns>.svc.cluster.local.
std::vector<std::string> ServiceDnsNames(const std::string& service, const std::string& ns);

}  // namespace granary::kube

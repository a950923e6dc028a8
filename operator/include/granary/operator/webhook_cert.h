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
  // From one hour ago (clock skew) until now + validity; both certificates.
  std::chrono::seconds validity{std::chrono::hours(24 * 365)};
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

// What a serving certificate says, read back (granary-operator decides from
// this whether the webhook's Secret must be renewed).
struct WebhookCertInfo {
  std::chrono::system_clock::time_point not_before;
  std::chrono::system_clock::time_point not_after;
  std::vector<std::string> dns_names;     // its DNS SANs, in certificate order
  std::vector<std::string> ip_addresses;  // its IP SANs, as text (e.g. 127.0.0.1)
  std::string issuer_pem;                 // the certificate of `cert.ca_pem` that signed it
};

// Reads `cert.cert_pem` (its first certificate) and checks that `cert.key_pem`
// is its private key and that one certificate of `cert.ca_pem` (a PEM bundle)
// signed it. kInvalidArgument naming what is wrong otherwise. Validity dates
// are reported, not judged.
Result<WebhookCertInfo> InspectWebhookCert(const WebhookCert& cert);

// The DNS names a Service is reached by inside the cluster:
// <service>, <service>.<ns>, <service>.<ns>.svc, <service>.<ns>.svc.cluster.local.
std::vector<std::string> ServiceDnsNames(const std::string& service, const std::string& ns);

}  // namespace granary::kube

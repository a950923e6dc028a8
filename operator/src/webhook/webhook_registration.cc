#include "granary/operator/webhook_registration.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/kube/base64.h"
#include "granary/operator/resources.h"

namespace granary::kube {
namespace {

constexpr std::string_view kBeginCert = "-----BEGIN CERTIFICATE-----";
constexpr std::string_view kEndCert = "-----END CERTIFICATE-----";

// The IP address in canonical text, or "" when `text` is not one.
std::string CanonicalIp(const std::string& text) {
  unsigned char bytes[16];
  char out[INET6_ADDRSTRLEN] = {};
  if (inet_pton(AF_INET, text.c_str(), bytes) == 1) {
    return inet_ntop(AF_INET, bytes, out, sizeof(out)) != nullptr ? out : "";
  }
  if (inet_pton(AF_INET6, text.c_str(), bytes) == 1) {
    return inet_ntop(AF_INET6, bytes, out, sizeof(out)) != nullptr ? out : "";
  }
  return "";
}

std::vector<std::string> Sorted(std::vector<std::string> v, bool ips) {
  if (ips) {
    for (std::string& s : v) s = CanonicalIp(s);
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "none" : out;
}

std::string Rfc3339(std::chrono::system_clock::time_point t) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// The first certificate of a PEM bundle, "" if none.
std::string FirstCertificate(const std::string& bundle) {
  const size_t begin = bundle.find(kBeginCert);
  if (begin == std::string::npos) return "";
  const size_t end = bundle.find(kEndCert, begin);
  if (end == std::string::npos) return "";
  return bundle.substr(begin, end + kEndCert.size() - begin) + "\n";
}

std::string SecretPath(const WebhookRegistrationOptions& o) {
  return "/api/v1/namespaces/" + o.namespace_ + "/secrets/" + o.secret_name;
}

std::string ConfigurationPath(const WebhookRegistrationOptions& o) {
  return "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/" +
         o.configuration_name;
}

}  // namespace

Result<std::string> WebhookUrlHost(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--webhook-url " + Quoted(url) + ": " + why +
                                   "; write https://<host>[:<port>]/mutate");
  };
  constexpr std::string_view kScheme = "https://";
  if (url.rfind("http://", 0) == 0) {
    return bad("the API server calls webhooks over TLS only, not http://");
  }
  if (url.rfind(kScheme, 0) != 0) return bad("not an https:// URL");
  if (url.find_first_of("?#@ \t\n") != std::string::npos) {
    return bad("a webhook URL has no user, query, fragment or spaces");
  }
  const std::string rest = url.substr(kScheme.size());
  const std::string authority = rest.substr(0, rest.find('/'));
  std::string host, port;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return bad("an unclosed [ in the host");
    host = authority.substr(1, close - 1);
    if (CanonicalIp(host).empty() || host.find(':') == std::string::npos) {
      return bad("[" + host + "] is not an IPv6 address");
    }
    const std::string after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') return bad("only :<port> may follow ]");
    if (!after.empty()) port = after.substr(1);
    if (!after.empty() && port.empty()) return bad("an empty port");
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("an empty port");
    }
    if (host.empty()) return bad("no host");
    for (const char c : host) {
      if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '-' && c != '.') {
        return bad("the host " + Quoted(host) + " is not a DNS name or an IP address");
      }
    }
  }
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c)) != 0;
        })) {
      return bad("the port " + Quoted(port) + " is not a number");
    }
    const int value = std::stoi(port);
    if (value < 1 || value > 65535) return bad("the port " + port + " is not in 1..65535");
  }
  return host;
}

Status ValidateWebhookRegistration(const WebhookRegistrationOptions& o) {
  if (o.service_name.empty() == o.url.empty()) {
    return Status::InvalidArgument(
        "--webhook-service and --webhook-url: give exactly one (how the API server reaches "
        "the webhook: a Service in the operator's namespace, or an https URL)");
  }
  if (!o.url.empty()) GRANARY_RETURN_IF_ERROR(WebhookUrlHost(o.url).status());
  if (!o.service_name.empty()) {
    const std::string& n = o.service_name;
    const bool label = n.size() <= 63 && std::isalnum(static_cast<unsigned char>(n.front())) != 0 &&
                       std::isalnum(static_cast<unsigned char>(n.back())) != 0 &&
                       std::all_of(n.begin(), n.end(), [](char c) {
                         return (std::islower(static_cast<unsigned char>(c)) != 0) ||
                                (std::isdigit(static_cast<unsigned char>(c)) != 0) || c == '-';
                       });
    if (!label) {
      return Status::InvalidArgument("--webhook-service " + Quoted(o.service_name) +
                                     ": not a Service name (a DNS label such as granary-webhook)");
    }
    if (o.service_port < 1 || o.service_port > 65535) {
      return Status::InvalidArgument("--webhook-service-port " + std::to_string(o.service_port) +
                                     ": write a port in 1..65535");
    }
  }
  if (o.failure_policy != "Fail" && o.failure_policy != "Ignore") {
    return Status::InvalidArgument("--webhook-failure-policy " + Quoted(o.failure_policy) +
                                   ": write Fail or Ignore (docs/kubernetes-webhook.md)");
  }
  if (o.timeout_seconds < 1 || o.timeout_seconds > 30) {
    return Status::InvalidArgument("--webhook-timeout " + std::to_string(o.timeout_seconds) +
                                   "s: the API server allows 1s to 30s");
  }
  for (const std::string& ip : o.cert_ips) {
    if (CanonicalIp(ip).empty()) {
      return Status::InvalidArgument("--webhook-cert-ip " + Quoted(ip) +
                                     ": not an IP address (write e.g. 127.0.0.1)");
    }
  }
  if (o.manage_certificate) {
    if (o.cert_validity.count() <= 0 || o.renew_before.count() <= 0 ||
        o.renew_before >= o.cert_validity) {
      return Status::InvalidArgument(
          "--webhook-cert-renew-before must be shorter than --webhook-cert-validity (and both "
          "positive), else every certificate would be renewed at once");
    }
  } else if (FirstCertificate(o.ca_bundle_pem).empty()) {
    return Status::InvalidArgument("--webhook-ca-file: no PEM certificate in it");
  }
  return Status::Ok();
}

WebhookCertRequest DesiredWebhookCert(const WebhookRegistrationOptions& o) {
  WebhookCertRequest request;
  request.common_name = "granary-webhook";
  request.validity = o.cert_validity;
  if (!o.service_name.empty()) request.dns_names = ServiceDnsNames(o.service_name, o.namespace_);
  if (!o.url.empty()) {
    Result<std::string> host = WebhookUrlHost(o.url);
    if (host.ok()) {
      if (CanonicalIp(*host).empty()) {
        request.dns_names.push_back(*host);
      } else {
        request.ip_addresses.push_back(*host);
      }
    }
  }
  for (const std::string& ip : o.cert_ips) request.ip_addresses.push_back(ip);
  request.dns_names = Sorted(request.dns_names, false);
  request.ip_addresses = Sorted(request.ip_addresses, true);
  return request;
}

Result<WebhookCert> WebhookCertFromSecret(const Json& secret) {
  const Json& data = secret.value("data", Json::object());
  WebhookCert cert;
  for (auto [key, out] : {std::pair{"ca.crt", &cert.ca_pem}, std::pair{"tls.crt", &cert.cert_pem},
                          std::pair{"tls.key", &cert.key_pem}}) {
    if (!data.contains(key) || !data[key].is_string()) {
      return Status::InvalidArgument(std::string("the Secret has no key ") + key);
    }
    GRANARY_ASSIGN_OR_RETURN(*out, Base64Decode(data[key].get<std::string>(),
                                                std::string("key ") + key + " of the Secret"));
  }
  return cert;
}

CertRenewal DecideCertRenewal(const Json* secret, const WebhookRegistrationOptions& o,
                              std::chrono::system_clock::time_point now) {
  CertRenewal out;
  if (secret == nullptr) {
    out.reason = "the Secret does not exist";
    return out;
  }
  if (secret->value("type", "") != "kubernetes.io/tls") {
    out.reason =
        "the Secret is of type " + Quoted(secret->value("type", "")) + ", not kubernetes.io/tls";
    return out;
  }
  Result<WebhookCert> cert = WebhookCertFromSecret(*secret);
  if (!cert.ok()) {
    out.reason = cert.status().message();
    return out;
  }
  Result<WebhookCertInfo> info = InspectWebhookCert(*cert);
  if (!info.ok()) {
    out.reason = info.status().message();
    return out;
  }
  out.current = *cert;
  out.info = *info;
  const WebhookCertRequest desired = DesiredWebhookCert(o);
  const std::vector<std::string> dns = Sorted(info->dns_names, false);
  const std::vector<std::string> ips = Sorted(info->ip_addresses, true);
  if (dns != desired.dns_names || ips != desired.ip_addresses) {
    out.action = CertRenewal::Action::kRenew;
    out.reason = "it names DNS " + Joined(dns) + " and IP " + Joined(ips) + ", not DNS " +
                 Joined(desired.dns_names) + " and IP " + Joined(desired.ip_addresses);
    return out;
  }
  out.renew_at = info->not_after - o.renew_before;
  if (now >= out.renew_at) {
    out.action = CertRenewal::Action::kRenew;
    out.reason = "it expires at " + Rfc3339(info->not_after) + ", within " +
                 std::to_string(o.renew_before.count()) + " s";
    return out;
  }
  out.action = CertRenewal::Action::kKeep;
  out.reason =
      "valid until " + Rfc3339(info->not_after) + ", renewed from " + Rfc3339(out.renew_at);
  return out;
}

Json WebhookTlsSecret(const WebhookRegistrationOptions& o, const WebhookCert& cert) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata",
           {{"name", o.secret_name},
            {"namespace", o.namespace_},
            {"labels",
             {{"app.kubernetes.io/name", "granary-webhook"},
              {"app.kubernetes.io/managed-by", "granary-operator"}}}}},
          {"type", "kubernetes.io/tls"},
          {"data",
           {{"ca.crt", Base64Encode(cert.ca_pem)},
            {"tls.crt", Base64Encode(cert.cert_pem)},
            {"tls.key", Base64Encode(cert.key_pem)}}}};
}

Json MutatingWebhookConfiguration(const WebhookRegistrationOptions& o,
                                  const std::string& ca_bundle_pem) {
  Json client_config = {{"caBundle", Base64Encode(ca_bundle_pem)}};
  if (!o.url.empty()) {
    client_config["url"] = o.url;
  } else {
    client_config["service"] = {{"name", o.service_name},
                                {"namespace", o.namespace_},
                                {"path", std::string(kWebhookPath)},
                                {"port", o.service_port}};
  }
  Json webhook = {
      {"name", std::string(kWebhookName)},
      {"clientConfig", client_config},
      {"rules", Json::array({{{"apiGroups", Json::array({""})},
                              {"apiVersions", Json::array({"v1"})},
                              {"operations", Json::array({"CREATE"})},
                              {"resources", Json::array({"pods"})},
                              {"scope", "Namespaced"}}})},
      {"objectSelector",
       {{"matchExpressions",
         Json::array({{{"key", "granary.io/dataset"}, {"operator", "Exists"}}})}}},
      {"namespaceSelector",
       {{"matchExpressions", Json::array({{{"key", "kubernetes.io/metadata.name"},
                                           {"operator", "NotIn"},
                                           {"values", Json::array({o.namespace_})}}})}}},
      {"sideEffects", "None"},
      {"admissionReviewVersions", Json::array({"v1"})},
      {"failurePolicy", o.failure_policy},
      {"timeoutSeconds", o.timeout_seconds},
      {"reinvocationPolicy", "Never"}};
  return {{"apiVersion", "admissionregistration.k8s.io/v1"},
          {"kind", "MutatingWebhookConfiguration"},
          {"metadata",
           {{"name", o.configuration_name},
            {"labels", {{"app.kubernetes.io/managed-by", "granary-operator"}}}}},
          {"webhooks", Json::array({webhook})}};
}

Result<std::string> WebhookRegistrar::KeepSecret() {
  const auto now = std::chrono::system_clock::now();
  Result<Json> found = client_.Get(SecretPath(options_));
  if (!found.ok() && found.status().code() != StatusCode::kNotFound) {
    return found.status().WithContext("reading the webhook Secret");
  }
  const Json* secret = found.ok() ? &*found : nullptr;
  CertRenewal decision = DecideCertRenewal(secret, options_, now);
  if (decision.action == CertRenewal::Action::kKeep) {
    next_ = std::chrono::duration_cast<std::chrono::milliseconds>(decision.renew_at - now);
    return decision.current.ca_pem;
  }
  auto log = GetLogger("operator");
  GRANARY_ASSIGN_OR_RETURN(WebhookCert fresh, MakeWebhookCert(DesiredWebhookCert(options_)));
  // The CA being replaced stays trusted next to the new one: replicas serve
  // the old certificate until their watch brings the new Secret. A CA key is
  // never stored, so the old CA signs nothing new; it expires with its
  // certificate, at most renew_before after this renewal.
  std::string previous_ca = decision.info.issuer_pem;
  if (previous_ca.empty()) {
    // The Secret is gone or unusable: the CA registered now is the one the
    // replicas' certificates chain to.
    Result<Json> config = client_.Get(ConfigurationPath(options_));
    if (config.ok()) {
      for (const Json& w : config->value("webhooks", Json::array())) {
        if (w.value("name", "") != kWebhookName) continue;
        Result<std::string> bundle =
            Base64Decode(w["clientConfig"].value("caBundle", ""), "the registered caBundle");
        if (bundle.ok()) previous_ca = FirstCertificate(*bundle);
      }
    }
  } else if (decision.info.not_after <= now) {
    previous_ca.clear();  // expired: it trusts nothing any more
  }
  if (!previous_ca.empty() && previous_ca != FirstCertificate(fresh.ca_pem)) {
    fresh.ca_pem += previous_ca;
  }
  log->info("webhook certificate: {} the Secret {}/{}: {}",
            decision.action == CertRenewal::Action::kCreate ? "making" : "renewing",
            options_.namespace_, options_.secret_name, decision.reason);
  // Registered first, so the API server trusts the new CA before any
  // replica serves the new certificate.
  GRANARY_RETURN_IF_ERROR(client_
                              .Apply(ConfigurationPath(options_),
                                     MutatingWebhookConfiguration(options_, fresh.ca_pem),
                                     std::string(kFieldManager))
                              .status()
                              .WithContext("registering the webhook"));
  Json secret_object = WebhookTlsSecret(options_, fresh);
  const std::string collection = "/api/v1/namespaces/" + options_.namespace_ + "/secrets";
  if (secret != nullptr && secret->value("type", "") == "kubernetes.io/tls") {
    // A compare-and-set (the resourceVersion): a Secret changed meanwhile
    // fails here and is looked at again.
    Json patch = {{"metadata",
                   {{"resourceVersion", (*secret)["metadata"].value("resourceVersion", "")},
                    {"labels", secret_object["metadata"]["labels"]}}},
                  {"data", secret_object["data"]}};
    GRANARY_RETURN_IF_ERROR(client_.MergePatch(SecretPath(options_), patch)
                                .status()
                                .WithContext("renewing the webhook Secret"));
  } else {
    if (secret != nullptr) {
      // Another type cannot become kubernetes.io/tls (type is immutable).
      Status deleted = client_.Delete(SecretPath(options_));
      if (!deleted.ok() && deleted.code() != StatusCode::kNotFound) {
        return deleted.WithContext("replacing the unusable webhook Secret");
      }
    }
    GRANARY_RETURN_IF_ERROR(client_.Create(collection, secret_object)
                                .status()
                                .WithContext("creating the webhook Secret"));
  }
  next_ = std::chrono::seconds(1);  // look again: confirms what was written
  return fresh.ca_pem;
}

Result<std::chrono::milliseconds> WebhookRegistrar::Reconcile() {
  next_ = options_.recheck;
  std::string bundle = options_.ca_bundle_pem;
  if (options_.manage_certificate) {
    GRANARY_ASSIGN_OR_RETURN(bundle, KeepSecret());
  }
  GRANARY_RETURN_IF_ERROR(client_
                              .Apply(ConfigurationPath(options_),
                                     MutatingWebhookConfiguration(options_, bundle),
                                     std::string(kFieldManager))
                              .status()
                              .WithContext("registering the webhook"));
  return std::clamp(next_, std::chrono::milliseconds(1000), options_.recheck);
}

}  // namespace granary::kube

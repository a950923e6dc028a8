#pragma once

// KubeConfig: where the Kubernetes API server is and how granary-operator
// proves who it is. Two sources, as every Kubernetes client has:
//   - a kubeconfig file (LoadKubeConfig): the current context's cluster
//     (server, certificate-authority[-data], insecure-skip-tls-verify) and
//     user (client-certificate[-data] + client-key[-data], token, tokenFile);
//   - in-cluster (InClusterConfig): KUBERNETES_SERVICE_HOST/PORT and the
//     service-account files under /var/run/secrets/kubernetes.io/serviceaccount.
// PEM contents are read into the struct at load time, except a token file,
// which is read again before each request (projected tokens rotate).
//
// Thread safety: a plain value; loading touches only the files it names.

#include <string>

#include "granary/core/status.h"

namespace granary::kube {

struct KubeConfig {
  std::string host;  // name or address, no brackets
  std::string port = "443";
  std::string ca_pem;  // empty: the system's trust store
  bool insecure_skip_verify = false;
  std::string client_cert_pem;  // with client_key_pem: TLS client authentication
  std::string client_key_pem;
  std::string token;       // bearer token
  std::string token_file;  // bearer token read from this file per request
  std::string namespace_;  // the context's (or pod's) namespace; may be empty

  std::string Describe() const;  // "https://host:port" for messages
};

// Reads `path` (empty: $KUBECONFIG's first entry, else ~/.kube/config) and
// takes `context` (empty: current-context). Relative file names are resolved
// against the kubeconfig's directory, as kubectl does.
Result<KubeConfig> LoadKubeConfig(const std::string& path, const std::string& context = "");

// The pod's service account. `root` replaces /var/run/secrets/kubernetes.io/
// serviceaccount (tests).
Result<KubeConfig> InClusterConfig(
    const std::string& root = "/var/run/secrets/kubernetes.io/serviceaccount");

// "https://h:p" (or "h:p") → host and port; IPv6 in brackets.
Status ParseServerUrl(const std::string& server, KubeConfig* config);

}  // namespace granary::kube

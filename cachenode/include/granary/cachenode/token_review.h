#pragma once

// TokenReviewVerifier: checks a pod's projected ServiceAccount token by asking
// the Kubernetes API server (POST authentication.k8s.io/v1 TokenReview with
// the audience the node accepts), the way the kubelet and aggregated API
// servers check tokens. The API server checks the signature, the expiry, the
// audience and that the pod or Secret the token is bound to still exists; the
// verifier then requires a ServiceAccount user
// ("system:serviceaccount:<namespace>:<name>") and grants that namespace.
//
// Answers are cached by the token's SHA-256 for at most `cache_ttl` (a minute
// by default) and never past the token's own expiry, so a node asks the API
// server once per sidecar connection burst, not per connection; refusals are
// not cached. The cache is bounded (`max_cached`, oldest dropped).
//
// The cache node's ServiceAccount needs `create` on tokenreviews
// (the chart's ClusterRole, docs/install.md, "RBAC").
//
// Thread safety: Verify may be called from any number of threads.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "granary/core/status.h"
#include "granary/kube/kube_config.h"
#include "granary/peer/peer_auth.h"

namespace granary {

struct TokenReviewOptions {
  std::string audience = "granary";
  std::chrono::milliseconds cache_ttl{60'000};
  size_t max_cached = 4096;
};

class TokenReviewVerifier : public TokenVerifier {
 public:
  static Result<std::shared_ptr<TokenReviewVerifier>> Create(kube::KubeConfig api,
                                                             TokenReviewOptions options = {});
  ~TokenReviewVerifier() override;

  Result<PeerIdentity> Verify(std::string_view token) override;

  // Round trips to the API server so far (tests, metrics).
  uint64_t reviews() const;

 private:
  struct Impl;
  explicit TokenReviewVerifier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "system:serviceaccount:<ns>:<name>" → the namespace identity; anything else
// is kPermissionDenied saying the token is not a ServiceAccount's.
Result<PeerIdentity> IdentityOfServiceAccount(std::string_view username);

}  // namespace granary

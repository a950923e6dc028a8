#include "granary/cachenode/token_review.h"

#include <openssl/sha.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "granary/core/names.h"
#include "granary/kube/base64.h"
#include "granary/kube/kube_client.h"

namespace granary {
namespace {

using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
constexpr std::string_view kServiceAccountPrefix = "system:serviceaccount:";

std::string Digest(std::string_view token) {
  unsigned char out[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), out);
  return std::string(reinterpret_cast<const char*>(out), sizeof(out));
}

// The token's `exp` claim (seconds since the epoch), read without checking the
// signature: the API server has checked the token; this only keeps a cached
// answer from outliving it. nullopt when the token is not a readable JWT.
std::optional<int64_t> ExpiryOf(std::string_view token) {
  const size_t first = token.find('.');
  const size_t second = first == std::string_view::npos ? first : token.find('.', first + 1);
  if (second == std::string_view::npos) return std::nullopt;
  std::string payload(token.substr(first + 1, second - first - 1));
  std::replace(payload.begin(), payload.end(), '-', '+');
  std::replace(payload.begin(), payload.end(), '_', '/');
  while (payload.size() % 4 != 0) payload += '=';
  Result<std::string> json = kube::Base64Decode(payload, "token payload");
  if (!json.ok()) return std::nullopt;
  Json claims = Json::parse(*json, nullptr, /*allow_exceptions=*/false);
  if (!claims.is_object() || !claims.contains("exp") || !claims["exp"].is_number_integer()) {
    return std::nullopt;
  }
  return claims["exp"].get<int64_t>();
}

}  // namespace

Result<PeerIdentity> IdentityOfServiceAccount(std::string_view username) {
  if (!username.starts_with(kServiceAccountPrefix)) {
    return Status::PermissionDenied("the token belongs to " + Quoted(username) +
                                    ", not to a ServiceAccount; mount a projected ServiceAccount "
                                    "token with audience granary");
  }
  std::string_view rest = username.substr(kServiceAccountPrefix.size());
  const size_t colon = rest.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size()) {
    return Status::PermissionDenied("the token's user " + Quoted(username) +
                                    " is not system:serviceaccount:<namespace>:<name>");
  }
  PeerIdentity identity;
  identity.kind = PeerIdentity::Kind::kNamespace;
  identity.namespace_ = std::string(rest.substr(0, colon));
  identity.subject = std::string(username);
  if (!IsDnsLabel(identity.namespace_)) {
    return Status::PermissionDenied("the token's namespace " + Quoted(identity.namespace_) +
                                    " is not a namespace name");
  }
  return identity;
}

struct TokenReviewVerifier::Impl {
  std::unique_ptr<kube::KubeClient> client;
  TokenReviewOptions options;
  std::mutex mu;
  struct Entry {
    PeerIdentity identity;
    SteadyClock::time_point until;
  };
  std::map<std::string, Entry> cache;  // guarded by mu
  uint64_t reviews = 0;                // guarded by mu
};

TokenReviewVerifier::TokenReviewVerifier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenReviewVerifier::~TokenReviewVerifier() = default;

Result<std::shared_ptr<TokenReviewVerifier>> TokenReviewVerifier::Create(
    kube::KubeConfig api, TokenReviewOptions options) {
  if (options.audience.empty()) {
    return Status::InvalidArgument("token review: the audience is empty; write e.g. granary");
  }
  auto impl = std::make_unique<Impl>();
  GRANARY_ASSIGN_OR_RETURN(impl->client, kube::KubeClient::Create(std::move(api)));
  impl->options = std::move(options);
  return std::shared_ptr<TokenReviewVerifier>(new TokenReviewVerifier(std::move(impl)));
}

uint64_t TokenReviewVerifier::reviews() const {
  std::lock_guard lock(impl_->mu);
  return impl_->reviews;
}

Result<PeerIdentity> TokenReviewVerifier::Verify(std::string_view token) {
  const std::string key = Digest(token);
  const auto now = SteadyClock::now();
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) {
      if (it->second.until > now) return it->second.identity;
      impl_->cache.erase(it);
    }
    ++impl_->reviews;
  }
  const std::string& audience = impl_->options.audience;
  Json review = {{"apiVersion", "authentication.k8s.io/v1"},
                 {"kind", "TokenReview"},
                 {"spec", {{"token", std::string(token)}, {"audiences", Json::array({audience})}}}};
  Result<Json> answer =
      impl_->client->Create("/apis/authentication.k8s.io/v1/tokenreviews", review);
  if (!answer.ok()) {
    // The API server could not be asked (or refused us): not the client's fault.
    const StatusCode code = answer.status().code() == StatusCode::kPermissionDenied
                                ? StatusCode::kUnavailable
                                : answer.status().code();
    return Status(code, "the cache node could not review the token with the API server: " +
                            answer.status().message() +
                            (answer.status().code() == StatusCode::kPermissionDenied
                                 ? " (the cache node's ServiceAccount needs create on "
                                   "tokenreviews)"
                                 : ""));
  }
  const Json status = answer->value("status", Json::object());
  if (!status.value("authenticated", false)) {
    std::string why = status.value("error", std::string());
    return Status::PermissionDenied("the API server did not accept the token for audience " +
                                    Quoted(audience) + (why.empty() ? std::string() : ": " + why) +
                                    " (expired, forged, for another audience, or its pod is gone)");
  }
  const Json audiences = status.value("audiences", Json::array());
  if (audiences.is_array() && !audiences.empty() &&
      std::find(audiences.begin(), audiences.end(), Json(audience)) == audiences.end()) {
    return Status::PermissionDenied("the token is not for audience " + Quoted(audience));
  }
  const std::string username = status.value("user", Json::object()).value("username", "");
  GRANARY_ASSIGN_OR_RETURN(PeerIdentity identity, IdentityOfServiceAccount(username));

  auto until = now + impl_->options.cache_ttl;
  if (std::optional<int64_t> exp = ExpiryOf(token)) {
    const auto left =
        std::chrono::seconds(*exp) - std::chrono::duration_cast<std::chrono::seconds>(
                                         std::chrono::system_clock::now().time_since_epoch());
    until = std::min(until, now + std::chrono::duration_cast<SteadyClock::duration>(left));
  }
  std::lock_guard lock(impl_->mu);
  if (impl_->cache.size() >= impl_->options.max_cached) {
    // Drop the entry that expires first (expired ones among them).
    auto oldest = std::min_element(
        impl_->cache.begin(), impl_->cache.end(),
        [](const auto& a, const auto& b) { return a.second.until < b.second.until; });
    if (oldest != impl_->cache.end()) impl_->cache.erase(oldest);
  }
  if (until > now && impl_->options.max_cached > 0)
    impl_->cache[key] = Impl::Entry{identity, until};
  return identity;
}

}  // namespace granary

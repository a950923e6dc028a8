// The peer protocol's rules for one connection (peer_session.h): HELLO,
// PING, AUTH, AUTH_PROOF, the refusals, and who may read which dataset.

#include "peer_session.h"

#include <cstring>
#include <utility>

#include "granary/core/names.h"

namespace granary::server_internal {

namespace pf = protocol_format;

PeerSession::PeerSession(const ServerOptions& options,
                         std::function<Result<std::string>()> channel_binding)
    : options_(options), channel_binding_(std::move(channel_binding)) {}

SessionStep PeerSession::Reply(uint64_t id, const ResponseMessage& response) const {
  SessionStep step;
  Result<OutgoingFrame> reply =
      EncodeResponse(id, response, {}, EncodeOptions{version_, options_.limits});
  if (reply.ok()) {
    step.reply = std::move(*reply);
  } else {
    step.reply = OutgoingFrame{EncodeError(id, reply.status(), true, version_), {}};
    step.closing = true;
    step.refusal = reply.status();
  }
  return step;
}

SessionStep PeerSession::Refuse(uint64_t id, const Status& status) const {
  SessionStep step;
  step.reply = OutgoingFrame{EncodeError(id, status, true, error_version()), {}};
  step.closing = true;
  step.refusal = status;
  step.warn = true;
  return step;
}

SessionStep PeerSession::AuthRefused(uint64_t id, const Status& status) const {
  SessionStep step =
      Refuse(id, Status(status.code(), "authentication refused: " + status.message()));
  step.auth_refused = true;
  return step;
}

SessionStep PeerSession::OnFrame(const Frame& frame) {
  const uint64_t id = frame.header.request_id;
  const uint16_t type = frame.header.type;
  if (!hello_done_) {
    if (type != pf::kTypeHello) {
      SessionStep step =
          Refuse(id, Status::FailedPrecondition(std::string(MessageTypeName(type)) +
                                                " before HELLO: open every connection with HELLO"));
      step.policy_error = true;
      return step;
    }
    return OnHello(frame);
  }
  Result<RequestMessage> message = DecodeRequest(frame, options_.limits);
  if (!message.ok()) {
    // The frame was read whole: the stream is in step. Answer and go on.
    SessionStep step;
    step.reply = OutgoingFrame{EncodeError(id, message.status(), false, version_), {}};
    step.refusal = message.status();
    step.message_error = true;
    return step;
  }
  if (std::holds_alternative<HelloRequest>(*message)) {
    SessionStep step =
        Refuse(id, Status::FailedPrecondition("a second HELLO on one connection (version " +
                                              std::to_string(version_) +
                                              " was agreed): send HELLO only first"));
    step.policy_error = true;
    return step;
  }
  if (auto* auth = std::get_if<AuthRequest>(&*message)) return OnAuth(id, std::move(*auth));
  if (const auto* proof = std::get_if<AuthProofRequest>(&*message)) return OnAuthProof(id, *proof);
  if (std::holds_alternative<PingRequest>(*message)) return Reply(id, PongReply{});
  if (!authenticated_) {
    SessionStep step =
        Refuse(id, Status::PermissionDenied(std::string(MessageTypeName(type)) +
                                            " before authentication: this cache node requires "
                                            "AUTH first (docs/protocol.md, \"Authentication\")"));
    step.policy_error = true;
    step.auth_refused = true;
    return step;
  }
  if (Status allowed = Authorize(*message); !allowed.ok()) {
    SessionStep step;
    step.reply = OutgoingFrame{EncodeError(id, allowed, false, version_), {}};
    step.refusal = allowed;
    step.policy_error = true;
    return step;
  }
  SessionStep step;
  if (auto* read = std::get_if<ReadRequest>(&*message)) {
    step.service.emplace(std::move(*read));
  } else {
    step.service.emplace(std::move(std::get<StatRequest>(*message)));
  }
  return step;
}

SessionStep PeerSession::OnHello(const Frame& frame) {
  const uint64_t id = frame.header.request_id;
  Result<RequestMessage> message = DecodeRequest(frame, options_.limits);
  if (!message.ok()) {
    // A HELLO that does not decode leaves no version: closing.
    SessionStep step = Refuse(id, message.status());
    step.message_error = true;
    return step;
  }
  const auto& hello = std::get<HelloRequest>(*message);
  Result<uint16_t> version = NegotiateVersion(hello);
  if (!version.ok()) {
    SessionStep step = Refuse(id, version.status());
    step.policy_error = true;
    return step;
  }
  const bool auth_required = options_.auth != nullptr;
  if (auth_required && *version < pf::kAuthVersion) {
    SessionStep step =
        Refuse(id, Status::VersionMismatch(
                       "this cache node requires authentication, which needs protocol version " +
                       std::to_string(pf::kAuthVersion) + "; the client speaks " +
                       std::to_string(hello.min_version) + ".." +
                       std::to_string(hello.max_version) + ": upgrade it"));
    step.policy_error = true;
    step.auth_refused = true;
    return step;
  }
  hello_done_ = true;
  authenticated_ = !auth_required;
  version_ = *version;
  peer_name_ = hello.peer_name;
  // ServerOptions::Validate encoded this reply at start: it does not fail.
  SessionStep step =
      Reply(id, HelloReply{version_, options_.node_name, options_.limits, auth_required});
  step.hello_agreed = true;
  return step;
}

SessionStep PeerSession::OnAuth(uint64_t id, AuthRequest auth) {
  const ServerAuth* config = options_.auth.get();
  if (config == nullptr || authenticated_ || auth_state_ != AuthState::kNone) {
    SessionStep step =
        Refuse(id, Status::FailedPrecondition(
                       config == nullptr
                           ? "AUTH to a cache node that requires no authentication (its "
                             "HELLO_REPLY did not ask for it): send AUTH only when asked"
                           : "a second AUTH on one connection: authenticate once, after HELLO"));
    step.policy_error = true;
    return step;
  }
  if (auth.method == AuthMethod::kKubernetesToken) {
    if (config->tokens == nullptr) {
      return AuthRefused(id, Status::PermissionDenied(
                                 "this cache node accepts no Kubernetes tokens (auth.kubernetes "
                                 "is not configured): authenticate with the cluster key"));
    }
    auth_state_ = AuthState::kVerifying;
    SessionStep step;
    step.service.emplace(std::move(auth));
    return step;
  }
  KeyId key_id{};
  std::memcpy(key_id.data(), auth.credential.data(), key_id.size());
  const std::string* key =
      config->cluster_keys != nullptr ? config->cluster_keys->Find(key_id) : nullptr;
  if (key == nullptr) {
    return AuthRefused(
        id,
        Status::PermissionDenied(
            config->cluster_keys == nullptr
                ? std::string("this cache node accepts no cluster key (auth.cluster_key_file "
                              "is not configured)")
                : "the client's cluster key " + KeyIdHex(key_id) + " is not one of this node's (" +
                      KeyIdHex(config->cluster_keys->current_id()) +
                      (config->cluster_keys->size() > 1 ? " and one more" : "") +
                      "): give both sides the same cluster_key_file; while rotating, "
                      "put the new key on every node before any client uses it"));
  }
  auth_key_ = key;
  auth_key_id_ = key_id;
  client_nonce_ = auth.client_nonce;
  server_nonce_ = RandomNonce();
  if (channel_binding_) {
    Result<std::string> binding = channel_binding_();
    if (!binding.ok()) return AuthRefused(id, binding.status());
    binding_ = std::move(*binding);
  }
  AuthReply challenge{false, server_nonce_,
                      ClusterKeyProof(*key, ProofRole::kServer, client_nonce_, server_nonce_,
                                      options_.node_name, peer_name_, binding_),
                      ""};
  auth_state_ = AuthState::kChallenged;
  return Reply(id, challenge);
}

SessionStep PeerSession::OnAuthProof(uint64_t id, const AuthProofRequest& proof) {
  if (auth_state_ != AuthState::kChallenged) {
    SessionStep step =
        Refuse(id, Status::FailedPrecondition(
                       "AUTH_PROOF without a challenge: send AUTH with the cluster key's id "
                       "first, then the proof of the AUTH_REPLY's nonce"));
    step.policy_error = true;
    return step;
  }
  const AuthProof expected =
      ClusterKeyProof(*auth_key_, ProofRole::kClient, client_nonce_, server_nonce_,
                      options_.node_name, peer_name_, binding_);
  if (!ProofsEqual(expected, proof.proof)) {
    return AuthRefused(id,
                       Status::PermissionDenied(
                           "the proof does not match cluster key " + KeyIdHex(auth_key_id_) +
                           " for this connection's challenge (a proof is good for one connection "
                           "only; the client may hold another key with the same id)"));
  }
  PeerIdentity identity;
  identity.kind = PeerIdentity::Kind::kCluster;
  identity.subject = "cluster key " + KeyIdHex(auth_key_id_);
  Grant(std::move(identity));
  SessionStep step = Reply(id, AuthProofReply{identity_.Scope()});
  step.granted = true;
  step.auth_granted = true;
  return step;
}

void PeerSession::Grant(PeerIdentity identity) {
  identity_ = std::move(identity);
  authenticated_ = true;
  auth_state_ = AuthState::kDone;
  auth_key_ = nullptr;
}

Status PeerSession::Authorize(const RequestMessage& message) const {
  if (!authenticated_ || options_.auth == nullptr ||
      identity_.kind == PeerIdentity::Kind::kCluster) {
    return Status::Ok();
  }
  std::string dataset;
  if (const auto* read = std::get_if<ReadRequest>(&message)) dataset = read->dataset;
  if (const auto* stat = std::get_if<StatRequest>(&message)) dataset = stat->dataset;
  if (dataset.empty()) return Status::Ok();  // the node's own STAT
  const auto& authorize = options_.auth->authorize;
  Status allowed = authorize ? authorize(identity_, dataset)
                             : Status::PermissionDenied("no dataset is readable with a token");
  if (allowed.ok()) return allowed;
  return Status::PermissionDenied("dataset " + Quoted(dataset) + " is not readable as " +
                                  identity_.Scope() + " (" + identity_.subject +
                                  "): a token reads only its own namespace's datasets");
}

}  // namespace granary::server_internal

#include <cstring>
#include <utility>
#include <variant>

#include "connection.h"
#include "granary/core/names.h"

namespace granary::server_internal {

void Connection::Handshake() {
  if (phase_ != Phase::kOpen) return;
  Result<TlsWant> want = tls_->Handshake();
  if (!want.ok()) {
    Add(server_.counters().policy_errors);
    server_.WarnAboutClient("connection " + Describe() + ": " + want.status().message() +
                            "; closed it");
    Close();
    return;
  }
  if (*want == TlsWant::kNothing) {
    tls_ready_ = true;
    Pump();
    return;
  }
  auto self = shared_from_this();
  socket_.async_wait(*want == TlsWant::kRead ? Socket::wait_read : Socket::wait_write,
                     [self](const ErrorCode& ec) {
                       if (ec) {
                         if (ec != asio::error::operation_aborted) self->Close();
                         return;
                       }
                       self->Handshake();
                     });
}

void Connection::OnAuth(uint64_t id, uint16_t type, AuthRequest auth) {
  const ServerAuth* config = server_.options().auth.get();
  if (config == nullptr || authenticated_ || auth_state_ != AuthState::kNone) {
    Add(server_.counters().policy_errors);
    PolicyError(
        id, type,
        Status::FailedPrecondition(
            config == nullptr ? "AUTH to a cache node that requires no authentication (its "
                                "HELLO_REPLY did not ask for it): send AUTH only when asked"
                              : "a second AUTH on one connection: authenticate once, after HELLO"));
    return;
  }
  if (auth.method == AuthMethod::kKubernetesToken) {
    if (config->tokens == nullptr) {
      AuthRefused(id, type,
                  Status::PermissionDenied(
                      "this cache node accepts no Kubernetes tokens (auth.kubernetes is not "
                      "configured): authenticate with the cluster key"));
      return;
    }
    auth_state_ = AuthState::kVerifying;
    auto work = NewWork(id, type);
    work->request_bytes = auth.credential.size();
    work->service_request.emplace(std::move(auth));
    queue_.push_back(std::move(work));
    Pump();
    return;
  }
  KeyId key_id{};
  std::memcpy(key_id.data(), auth.credential.data(), key_id.size());
  const std::string* key =
      config->cluster_keys != nullptr ? config->cluster_keys->Find(key_id) : nullptr;
  if (key == nullptr) {
    AuthRefused(
        id, type,
        Status::PermissionDenied(
            config->cluster_keys == nullptr
                ? std::string("this cache node accepts no cluster key (auth.cluster_key_file "
                              "is not configured)")
                : "the client's cluster key " + KeyIdHex(key_id) + " is not one of this node's (" +
                      KeyIdHex(config->cluster_keys->current_id()) +
                      (config->cluster_keys->size() > 1 ? " and one more" : "") +
                      "): give both sides the same cluster_key_file; while rotating, "
                      "put the new key on every node before any client uses it"));
    return;
  }
  auth_key_ = key;
  auth_key_id_ = key_id;
  client_nonce_ = auth.client_nonce;
  server_nonce_ = RandomNonce();
  const std::string& server_name = server_.options().node_name;
  if (tls_ != nullptr) {
    Result<std::array<uint8_t, 32>> binding = tls_->ChannelBinding();
    if (!binding.ok()) {
      AuthRefused(id, type, binding.status());
      return;
    }
    binding_.assign(reinterpret_cast<const char*>(binding->data()), binding->size());
  }
  AuthReply challenge{false, server_nonce_,
                      ClusterKeyProof(*key, ProofRole::kServer, client_nonce_, server_nonce_,
                                      server_name, peer_name_, binding_),
                      ""};
  auth_state_ = AuthState::kChallenged;
  Result<OutgoingFrame> reply =
      EncodeResponse(id, challenge, {}, EncodeOptions{version_, server_.options().limits});
  QueueReady(id, type,
             reply.ok() ? std::move(*reply) : ErrorFrame(id, reply.status(), true, version_),
             !reply.ok());
}

void Connection::OnAuthProof(uint64_t id, uint16_t type, const AuthProofRequest& proof) {
  if (auth_state_ != AuthState::kChallenged) {
    Add(server_.counters().policy_errors);
    PolicyError(id, type,
                Status::FailedPrecondition(
                    "AUTH_PROOF without a challenge: send AUTH with the cluster key's id "
                    "first, then the proof of the AUTH_REPLY's nonce"));
    return;
  }
  const AuthProof expected =
      ClusterKeyProof(*auth_key_, ProofRole::kClient, client_nonce_, server_nonce_,
                      server_.options().node_name, peer_name_, binding_);
  if (!ProofsEqual(expected, proof.proof)) {
    AuthRefused(id, type,
                Status::PermissionDenied(
                    "the proof does not match cluster key " + KeyIdHex(auth_key_id_) +
                    " for this connection's challenge (a proof is good for one connection "
                    "only; the client may hold another key with the same id)"));
    return;
  }
  PeerIdentity identity;
  identity.kind = PeerIdentity::Kind::kCluster;
  identity.subject = "cluster key " + KeyIdHex(auth_key_id_);
  Grant(std::move(identity));
  Add(server_.counters().auth_granted);
  Result<OutgoingFrame> reply = EncodeResponse(id, AuthProofReply{identity_.Scope()}, {},
                                               EncodeOptions{version_, server_.options().limits});
  QueueReady(id, type,
             reply.ok() ? std::move(*reply) : ErrorFrame(id, reply.status(), true, version_),
             !reply.ok());
}

void Connection::Grant(PeerIdentity identity) {
  server_.OnAuthenticated(*gauge_);
  identity_ = std::move(identity);
  authenticated_ = true;
  auth_state_ = AuthState::kDone;
  auth_key_ = nullptr;
  server_.log().debug("connection {}: authenticated as {} ({})", Describe(), identity_.subject,
                      identity_.Scope());
}

void Connection::AuthRefused(uint64_t id, uint16_t type, const Status& status) {
  Add(server_.counters().auth_refused);
  PolicyError(id, type, Status(status.code(), "authentication refused: " + status.message()));
}

Status Connection::Authorize(const RequestMessage& message) const {
  if (!authenticated_ || server_.options().auth == nullptr ||
      identity_.kind == PeerIdentity::Kind::kCluster) {
    return Status::Ok();
  }
  std::string dataset;
  if (const auto* read = std::get_if<ReadRequest>(&message)) dataset = read->dataset;
  if (const auto* stat = std::get_if<StatRequest>(&message)) dataset = stat->dataset;
  if (dataset.empty()) return Status::Ok();  // the node's own STAT
  const auto& authorize = server_.options().auth->authorize;
  Status allowed = authorize ? authorize(identity_, dataset)
                             : Status::PermissionDenied("no dataset is readable with a token");
  if (allowed.ok()) return allowed;
  return Status::PermissionDenied("dataset " + Quoted(dataset) + " is not readable as " +
                                  identity_.Scope() + " (" + identity_.subject +
                                  "): a token reads only its own namespace's datasets");
}

}  // namespace granary::server_internal

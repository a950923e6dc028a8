#include "granary/peer/peer_handshake.h"

#include <cstring>
#include <utility>
#include <variant>

#include "granary/core/file.h"
#include "granary/peer/peer_auth.h"
#include "granary/protocol/protocol_format.h"

namespace granary {

namespace pf = protocol_format;

namespace {

// AUTH (and AUTH_PROOF) after a HELLO_REPLY that asks for it; sets the scope.
Status Authenticate(const PeerClientOptions& options, std::string_view address,
                    PeerHandshake& agreed, const HandshakeExchange& exchange,
                    const ChannelBindingFn& binding_fn) {
  const std::string where =
      "authenticate to cache node " + std::string(address) + " (" + agreed.server_name + ")";
  const ClientCredentials& creds = options.credentials;
  if (creds.empty()) {
    return Status::PermissionDenied(
        where +
        ": the node requires authentication and this client has no credential; give it "
        "the cluster key (cluster_key_file, readable by root only: run as root) or, in "
        "a Kubernetes pod, a projected token with audience granary (docs/security.md)");
  }
  AuthRequest auth;
  auth.client_nonce = RandomNonce();
  if (creds.cluster_key != nullptr) {
    auth.method = AuthMethod::kClusterKey;
    const KeyId id = creds.cluster_key->current_id();
    auth.credential.assign(reinterpret_cast<const char*>(id.data()), id.size());
  } else {
    auth.method = AuthMethod::kKubernetesToken;
    Result<std::string> token = ReadFileToString(creds.token_file);
    if (!token.ok()) return token.status().WithContext(where + ": read the token file");
    while (!token->empty() && (token->back() == '\n' || token->back() == '\r')) token->pop_back();
    auth.credential = std::move(*token);
  }
  GRANARY_ASSIGN_OR_RETURN(ResponseMessage response,
                           exchange(auth, agreed.version, agreed.limits, where));
  if (const auto* error = std::get_if<ErrorReply>(&response)) {
    return Status(error->status.code(), where + ": " + error->status.message());
  }
  const auto* reply = std::get_if<AuthReply>(&response);
  if (reply == nullptr) {
    return Status::InvalidArgument(where + ": the server answered AUTH with " +
                                   std::string(ResponseName(response)));
  }
  if (auth.method == AuthMethod::kKubernetesToken) {
    if (!reply->granted) {
      return Status::InvalidArgument(where + ": the server answered a token with a challenge");
    }
    agreed.scope = reply->scope;
    return Status::Ok();
  }
  if (reply->granted) {
    return Status::PermissionDenied(
        where +
        ": the server granted a cluster-key AUTH without proving it holds the key; it is "
        "not a Granary cache node of this cluster");
  }
  const std::string& key = creds.cluster_key->current();
  std::string binding;
  if (binding_fn) {
    Result<std::string> b = binding_fn();
    if (!b.ok()) return b.status().WithContext(where);
    binding = std::move(*b);
  }
  const AuthProof expected =
      ClusterKeyProof(key, ProofRole::kServer, auth.client_nonce, reply->server_nonce,
                      agreed.server_name, options.client_name, binding);
  if (!ProofsEqual(expected, reply->server_proof)) {
    return Status::PermissionDenied(
        where + ": the server's proof does not match the cluster key " +
        KeyIdHex(creds.cluster_key->current_id()) +
        ": it holds another key (or is not a node of this cluster); check cluster_key_file");
  }
  AuthProofRequest proof{ClusterKeyProof(key, ProofRole::kClient, auth.client_nonce,
                                         reply->server_nonce, agreed.server_name,
                                         options.client_name, binding)};
  GRANARY_ASSIGN_OR_RETURN(response, exchange(proof, agreed.version, agreed.limits, where));
  if (const auto* error = std::get_if<ErrorReply>(&response)) {
    return Status(error->status.code(), where + ": " + error->status.message());
  }
  const auto* granted = std::get_if<AuthProofReply>(&response);
  if (granted == nullptr) {
    return Status::InvalidArgument(where + ": the server answered AUTH_PROOF with " +
                                   std::string(ResponseName(response)));
  }
  agreed.scope = granted->scope;
  return Status::Ok();
}

}  // namespace

Result<ResponseMessage> DecodeReplyTo(const Frame& frame, uint64_t request_id,
                                      const ProtocolLimits& limits, std::string_view doing,
                                      bool* broken) {
  *broken = true;
  Result<ResponseMessage> decoded = DecodeResponse(frame, limits);
  if (!decoded.ok()) {
    return decoded.status().WithContext(std::string(doing) +
                                        ": the server's reply does not decode");
  }
  ResponseMessage& response = *decoded;
  const auto* error = std::get_if<ErrorReply>(&response);
  if (frame.header.request_id != request_id) {
    if (error != nullptr && frame.header.request_id == 0) {
      // The server gave up on the connection (overloaded, draining, idle, or
      // our own bytes were bad): its status, with what we were doing.
      return Status(
          error->status.code(),
          std::string(doing) + ": the server closed the connection: " + error->status.message());
    }
    return Status::InvalidArgument(
        std::string(doing) + ": the server answered request " +
        std::to_string(frame.header.request_id) + " with " + std::string(ResponseName(response)) +
        " while request " + std::to_string(request_id) +
        " was waiting; it does not follow the protocol, the connection is closed");
  }
  if (error != nullptr) {
    *broken = error->closing;
    return Status(error->status.code(), std::string(doing) + ": " + error->status.message());
  }
  *broken = false;
  return std::move(response);
}

std::string_view ResponseName(const ResponseMessage& message) {
  static constexpr std::string_view kNames[] = {
      "HELLO_REPLY", "PONG", "STAT_REPLY", "READ_REPLY", "ERROR", "AUTH_REPLY", "AUTH_PROOF_REPLY"};
  return kNames[message.index()];
}

Result<PeerHandshake> RunClientHandshake(const PeerClientOptions& options, std::string_view address,
                                         const HandshakeExchange& exchange,
                                         const ChannelBindingFn& binding) {
  const std::string where = "connect to cache node " + std::string(address);
  HelloRequest hello{pf::kMinVersion, pf::kMaxVersion, options.client_name};
  GRANARY_ASSIGN_OR_RETURN(ResponseMessage response,
                           exchange(hello, pf::kHandshakeVersion, options.limits,
                                    "HELLO to cache node " + std::string(address)));
  const auto* reply = std::get_if<HelloReply>(&response);
  if (reply == nullptr) {
    if (const auto* error = std::get_if<ErrorReply>(&response)) {
      return Status(error->status.code(), where + ": " + error->status.message());
    }
    return Status::InvalidArgument(where + ": the server answered HELLO with " +
                                   std::string(ResponseName(response)) +
                                   "; it does not speak the protocol");
  }
  if (reply->version < pf::kMinVersion || reply->version > pf::kMaxVersion) {
    return Status::VersionMismatch(where + ": the server chose protocol version " +
                                   std::to_string(reply->version) + ", outside the offered " +
                                   std::to_string(pf::kMinVersion) + ".." +
                                   std::to_string(pf::kMaxVersion) + "; upgrade the older side");
  }
  PeerHandshake agreed;
  agreed.version = reply->version;
  agreed.server_name = reply->peer_name;
  agreed.limits = CommonLimits(options.limits, reply->limits);
  if (reply->auth_required) {
    GRANARY_RETURN_IF_ERROR(Authenticate(options, address, agreed, exchange, binding));
  }
  return agreed;
}

}  // namespace granary

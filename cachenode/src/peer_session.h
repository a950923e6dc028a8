#pragma once

// PeerSession: the peer protocol's rules for one connection of a cache node,
// apart from any wire (docs/protocol.md, "Authentication", "Bad input"):
// HELLO (version negotiation; a version-1 client refused where authentication
// is required), PING, AUTH (the cluster key's challenge, a Kubernetes token
// handed to the service pool's verifier), AUTH_PROOF, the refusals (anything
// before HELLO, a second HELLO, STAT or READ before AUTH, AUTH to an open node,
// a second AUTH, a proof without a challenge) and what an identity may read.
//
// A front end (the TCP Connection, connection.cc; the fabric FabricServer,
// fabric_server.cc) takes each complete frame off its wire, gives it to
// OnFrame, and does what the SessionStep says: send the reply, or run the
// service request and send its answer; count and log what the step names;
// after a closing reply read nothing more and close. So the rules, their
// messages and what they count are written once.
//
// Thread safety: one session per connection, used by one thread at a time.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "granary/cachenode/server.h"
#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"
#include "granary/protocol/protocol.h"
#include "granary/protocol/protocol_format.h"

namespace granary::server_internal {

// What a connection asks of the service pool: a READ or STAT for the
// ReadService, or a Kubernetes token for the TokenVerifier (both may block).
using ServiceRequest = std::variant<ReadRequest, StatRequest, AuthRequest>;

// What to do with one frame.
struct SessionStep {
  // The reply to send now; empty when `service` is set (its answer is the reply).
  OutgoingFrame reply;
  std::optional<ServiceRequest> service;
  // The reply is a closing ERROR: read no more requests, close once it is sent.
  bool closing = false;
  // Why the request was refused (an ERROR reply), for the log: at warn when
  // `warn` ("answered ERROR and closed it"), else at debug.
  Status refusal;
  bool warn = false;
  // What to count (docs/protocol.md: every refusal is counted).
  bool policy_error = false;
  bool message_error = false;
  bool auth_refused = false;
  bool auth_granted = false;
  // This frame was the HELLO that agreed version(): accept frames of that
  // version only from now on (FrameDecoder::ExpectVersion).
  bool hello_agreed = false;
  // The connection was granted an identity by this frame (a cluster key's proof).
  bool granted = false;
};

class PeerSession {
 public:
  // `options` (node_name, limits, auth) must outlive the session.
  // `channel_binding`: the TLS channel binding the proofs cover, asked at the
  // cluster key's AUTH; null or empty: none (no TLS).
  explicit PeerSession(const ServerOptions& options,
                       std::function<Result<std::string>()> channel_binding = nullptr);

  // One complete frame of the client's (its header passed the decoder's checks).
  SessionStep OnFrame(const Frame& frame);

  // A Kubernetes token the service pool's verifier accepted: the connection
  // reads as `identity` from now on.
  void Grant(PeerIdentity identity);

  bool hello_done() const { return hello_done_; }
  bool authenticated() const { return authenticated_; }
  // The agreed version; kHandshakeVersion before HELLO.
  uint16_t version() const { return version_; }
  // The version a closing ERROR goes out in now.
  uint16_t error_version() const {
    return hello_done_ ? version_ : protocol_format::kHandshakeVersion;
  }
  // The client's name from HELLO; empty before it.
  const std::string& peer_name() const { return peer_name_; }
  const PeerIdentity& identity() const { return identity_; }

 private:
  enum class AuthState { kNone, kChallenged, kVerifying, kDone };

  SessionStep OnHello(const Frame& frame);
  SessionStep OnAuth(uint64_t id, AuthRequest auth);
  SessionStep OnAuthProof(uint64_t id, const AuthProofRequest& proof);
  // Whether this connection's identity may touch the request's dataset. A
  // refusal names no more than the request did: the same answer whether the
  // dataset exists in another namespace or not at all.
  Status Authorize(const RequestMessage& message) const;

  // A reply, or (when it cannot be encoded, which valid options rule out) a
  // closing ERROR.
  SessionStep Reply(uint64_t id, const ResponseMessage& response) const;
  // A closing ERROR that ends the connection, logged at warn.
  SessionStep Refuse(uint64_t id, const Status& status) const;
  // An authentication refusal: counted, and closing.
  SessionStep AuthRefused(uint64_t id, const Status& status) const;

  const ServerOptions& options_;
  const std::function<Result<std::string>()> channel_binding_;

  bool hello_done_ = false;
  uint16_t version_ = protocol_format::kHandshakeVersion;
  std::string peer_name_;
  bool authenticated_ = false;
  AuthState auth_state_ = AuthState::kNone;
  PeerIdentity identity_;
  const std::string* auth_key_ = nullptr;  // the key the challenge used (in ServerAuth)
  KeyId auth_key_id_{};
  AuthNonce client_nonce_{};
  AuthNonce server_nonce_{};
  std::string binding_;  // the TLS session's channel binding, in the proofs
};

}  // namespace granary::server_internal

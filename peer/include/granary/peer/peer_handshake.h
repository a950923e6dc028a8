#pragma once

// The opening of a peer-protocol connection as a reader sees it, whatever the
// wire (docs/protocol.md, "Handshake" and "Authentication"): HELLO, the checks
// of the node's answer, and AUTH (cluster key challenge-response, or a
// Kubernetes token) when the node asks. PeerClient (TCP) and the libfabric
// transport both run it; each supplies the exchange of one request for its
// reply over its own wire.

#include <functional>
#include <string>
#include <string_view>

#include "granary/core/status.h"
#include "granary/peer/peer_transport.h"
#include "granary/protocol/protocol.h"

namespace granary {

// What the handshake agreed.
struct PeerHandshake {
  uint16_t version = 0;
  std::string server_name;
  ProtocolLimits limits;  // CommonLimits(the reader's, the node's)
  std::string scope;      // what AUTH granted; empty when the node asked for none
};

// Sends `request` encoded with `version` and `limits` and returns the reply
// (an ERROR reply is returned as a message, not as a failure). A failure is
// the wire's (the caller closes the connection).
using HandshakeExchange =
    std::function<Result<ResponseMessage>(const RequestMessage& request, uint16_t version,
                                          const ProtocolLimits& limits, std::string_view doing)>;

// The TLS channel binding of the connection, for the proofs (peer_auth.h);
// null on a wire without TLS.
using ChannelBindingFn = std::function<Result<std::string>()>;

// HELLO, then AUTH when the node requires it. `address` names the node in
// messages. Any failure leaves the connection unusable: close it.
Result<PeerHandshake> RunClientHandshake(const PeerClientOptions& options, std::string_view address,
                                         const HandshakeExchange& exchange,
                                         const ChannelBindingFn& binding = nullptr);

// The reply to request `request_id` that `frame` carries, decoded with
// `limits`, as every transport takes it: the message; or the Status the call
// ends with: the node's ERROR for the request, its closing ERROR for the
// connection (request id 0), a reply that does not decode or answers another
// request. *broken is set when the connection must be closed: on every
// failure but a non-closing ERROR for the request. `doing` starts messages.
Result<ResponseMessage> DecodeReplyTo(const Frame& frame, uint64_t request_id,
                                      const ProtocolLimits& limits, std::string_view doing,
                                      bool* broken);

// "READ_REPLY", "ERROR", ...: the reply's name, for messages.
std::string_view ResponseName(const ResponseMessage& message);

}  // namespace granary

#pragma once

// The libfabric transport as a reader uses it (docs/transport.md,
// "libfabric"): a PeerTransport whose connections are fabric endpoints
// (endpoint.h). Requests and replies are messages; a READ's payload is written
// by the node straight into this connection's registered window (RMA) and
// copied out once, into the PeerReadResult. The handshake (HELLO, AUTH) is the
// one every transport runs (peer_handshake.h); there is no TLS on this wire.
//
// Connect takes the node's fabric address (its record's `fabric` label), not
// its TCP address: the fetcher picks which (sample_fetcher_nodes.cc).

#include <memory>
#include <string>

#include "granary/peer/peer_transport.h"

namespace granary::fabric {

// Connections over `provider` ("tcp" here, "verbs" on InfiniBand or RoCE).
// Options with a TlsContext are refused (kInvalidArgument): TLS is TCP's.
std::shared_ptr<PeerTransport> FabricPeerTransport(std::string provider);

}  // namespace granary::fabric

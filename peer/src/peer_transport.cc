// TcpPeerTransport: the PeerTransport over TCP (and TLS), which is PeerClient.

#include "granary/peer/peer_transport.h"

#include <utility>

#include "granary/peer/peer_client.h"

namespace granary {
namespace {

class TcpTransport final : public PeerTransport {
 public:
  std::string_view name() const override { return "tcp"; }

  Result<std::unique_ptr<PeerConnection>> Connect(std::string_view address,
                                                  const PeerClientOptions& options) override {
    GRANARY_ASSIGN_OR_RETURN(PeerClient client, PeerClient::Connect(address, options));
    return std::unique_ptr<PeerConnection>(std::make_unique<PeerClient>(std::move(client)));
  }
};

}  // namespace

std::shared_ptr<PeerTransport> TcpPeerTransport() {
  static const std::shared_ptr<PeerTransport> tcp = std::make_shared<TcpTransport>();
  return tcp;
}

}  // namespace granary

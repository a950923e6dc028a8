#include <utility>
#include <variant>

#include "granary/fabric/endpoint.h"
#include "granary/fabric/fabric_transport.h"
#include "granary/peer/peer_handshake.h"
#include "granary/protocol/protocol_format.h"

namespace granary::fabric {

namespace pf = protocol_format;

namespace {

using Clock = std::chrono::steady_clock;

class FabricConnection final : public PeerConnection {
 public:
  FabricConnection(NetAddress address, std::string provider, PeerClientOptions options)
      : address_(std::move(address)),
        provider_(std::move(provider)),
        options_(std::move(options)) {}

  Status Open() {
    Close();
    const Clock::time_point deadline = Clock::now() + options_.connect_timeout;
    EndpointOptions endpoint_options;
    endpoint_options.provider = provider_;
    endpoint_options.max_message_bytes = MessageBytesFor(options_.limits.max_body_bytes);
    GRANARY_ASSIGN_OR_RETURN(endpoint_, Endpoint::Connect(address_, endpoint_options, deadline));
    auto exchange = [&](const RequestMessage& request, uint16_t version,
                        const ProtocolLimits& limits,
                        std::string_view doing) -> Result<ResponseMessage> {
      return Exchange(request, version, limits, RemoteWindow{}, nullptr, deadline, doing);
    };
    Result<PeerHandshake> agreed =
        RunClientHandshake(options_, "fabric:" + address_.ToString(), exchange);
    if (!agreed.ok()) return Fail(agreed.status());
    agreed_ = std::move(*agreed);
    return Status::Ok();
  }

  Result<PeerReadResult> Read(const ReadRequest& request) override {
    if (auto own = EncodeRequest(1, request, EncodeOptions{pf::kMaxVersion, options_.limits});
        !own.ok()) {
      return own.status();
    }
    GRANARY_RETURN_IF_ERROR(EnsureConnected());
    const std::string doing =
        "READ from cache node " + address_.ToString() + " (fabric, " + provider_ + ")";
    Result<RemoteWindow> window = endpoint_->Window(request.RequestedBytes());
    if (!window.ok()) return Fail(window.status().WithContext(doing));
    std::string payload;
    GRANARY_ASSIGN_OR_RETURN(ResponseMessage response,
                             Exchange(request, agreed_.version, agreed_.limits, *window, &payload,
                                      Clock::now() + options_.call_timeout, doing));
    auto* reply = std::get_if<ReadReply>(&response);
    if (reply == nullptr) {
      return Fail(Status::InvalidArgument(doing + ": the node answered with " +
                                          std::string(ResponseName(response)) +
                                          "; it does not follow the protocol"));
    }
    if (Status s = CheckReadReply(request, *reply); !s.ok()) {
      return Fail(s.WithContext(doing + ": the reply does not match the request"));
    }
    return PeerReadResult::Assemble(std::move(*reply), std::move(payload),
                                    options_.verify_checksums, doing);
  }

  Result<StatReply> Stat(const StatRequest& request) override {
    GRANARY_RETURN_IF_ERROR(EnsureConnected());
    GRANARY_ASSIGN_OR_RETURN(ResponseMessage response,
                             Exchange(request, agreed_.version, agreed_.limits, RemoteWindow{},
                                      nullptr, Clock::now() + options_.call_timeout,
                                      "STAT of cache node " + address_.ToString()));
    auto* reply = std::get_if<StatReply>(&response);
    if (reply == nullptr) {
      return Fail(Status::InvalidArgument("STAT of cache node " + address_.ToString() +
                                          ": the node answered with " +
                                          std::string(ResponseName(response))));
    }
    return std::move(*reply);
  }

  Status Ping() override {
    GRANARY_RETURN_IF_ERROR(EnsureConnected());
    GRANARY_ASSIGN_OR_RETURN(ResponseMessage response,
                             Exchange(PingRequest{}, agreed_.version, agreed_.limits,
                                      RemoteWindow{}, nullptr, Clock::now() + options_.call_timeout,
                                      "PING of cache node " + address_.ToString()));
    if (!std::holds_alternative<PongReply>(response)) {
      return Fail(Status::InvalidArgument("PING of cache node " + address_.ToString() +
                                          ": the node answered with " +
                                          std::string(ResponseName(response))));
    }
    return Status::Ok();
  }

  void Close() override { endpoint_.reset(); }
  bool connected() const override { return endpoint_ != nullptr && !endpoint_->broken(); }
  const ProtocolLimits& limits() const override { return agreed_.limits; }

 private:
  Status EnsureConnected() {
    if (connected()) return Status::Ok();
    return Open();
  }

  Status Fail(Status status) {
    Close();
    return status;
  }

  // One request and its reply. `payload` receives a READ_REPLY's payload from
  // the window (null: none may come). An ERROR for the request is its Status.
  Result<ResponseMessage> Exchange(const RequestMessage& request, uint16_t version,
                                   const ProtocolLimits& limits, const RemoteWindow& window,
                                   std::string* payload, Clock::time_point deadline,
                                   std::string_view doing) {
    const std::string what(doing);
    const uint64_t id = next_request_id_++;
    Result<std::string> frame = EncodeRequest(id, request, EncodeOptions{version, limits});
    if (!frame.ok()) return frame.status().WithContext(what);
    if (Status s = endpoint_->Send(EncodeRequestMessage(window, *frame), deadline); !s.ok()) {
      return Fail(s.WithContext(what));
    }
    if (Status s = endpoint_->Receive(message_, deadline); !s.ok()) {
      return Fail(s.WithContext(what));
    }
    FrameDecoder decoder(FrameDirection::kResponses, limits, PayloadMode::kDetached);
    if (!std::holds_alternative<HelloRequest>(request)) decoder.ExpectVersion(version);
    Result<size_t> used = decoder.Feed(message_);
    if (!used.ok() || !decoder.has_frame() || *used != message_.size()) {
      return Fail(Status::InvalidArgument(
          what + ": the node's message is not one whole frame" +
          (used.ok() ? std::string() : " (" + used.status().message() + ")") +
          "; it does not follow the protocol"));
    }
    Frame reply_frame = decoder.TakeFrame();
    const uint64_t payload_length = decoder.payload_remaining();
    if (payload_length > 0) {
      if (payload == nullptr || payload_length > window.length) {
        return Fail(Status::InvalidArgument(
            what + ": the node's reply says " + std::to_string(payload_length) +
            " payload bytes, more than the " + std::to_string(window.length) +
            "-byte window this request offered; it does not follow the protocol"));
      }
      *payload = std::string(endpoint_->WindowBytes(payload_length));
    }
    bool broken = false;
    Result<ResponseMessage> reply = DecodeReplyTo(reply_frame, id, limits, what, &broken);
    if (!reply.ok() && broken) return Fail(reply.status());
    return reply;
  }

  NetAddress address_;
  std::string provider_;
  PeerClientOptions options_;
  std::unique_ptr<Endpoint> endpoint_;
  PeerHandshake agreed_;
  std::string message_;  // the last message received
  uint64_t next_request_id_ = 1;
};

class Transport final : public PeerTransport {
 public:
  explicit Transport(std::string provider)
      : provider_(std::move(provider)), name_("libfabric/" + provider_) {}

  std::string_view name() const override { return name_; }

  Result<std::unique_ptr<PeerConnection>> Connect(std::string_view address,
                                                  const PeerClientOptions& options) override {
    GRANARY_RETURN_IF_ERROR(options.Validate());
    if (options.tls != nullptr) {
      return Status::InvalidArgument(
          "the libfabric transport carries no TLS: reach a node that serves TLS over TCP");
    }
    GRANARY_ASSIGN_OR_RETURN(NetAddress parsed,
                             ParseNetAddress(address, "cache node fabric address"));
    auto connection = std::make_unique<FabricConnection>(std::move(parsed), provider_, options);
    GRANARY_RETURN_IF_ERROR(connection->Open());
    return std::unique_ptr<PeerConnection>(std::move(connection));
  }

 private:
  std::string provider_;
  std::string name_;
};

}  // namespace

std::shared_ptr<PeerTransport> FabricPeerTransport(std::string provider) {
  return std::make_shared<Transport>(std::move(provider));
}

}  // namespace granary::fabric

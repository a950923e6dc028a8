// The cache node protocol's FrameDecoder (protocol.h): the shared frame layer
// (wire_frame.h) under this protocol's header rules.

#include <string>
#include <utility>

#include "granary/protocol/protocol.h"
#include "protocol_rules.h"

namespace granary {

using namespace protocol_internal;

namespace {

wire::FrameReader::Payload ReaderPayload(PayloadMode mode) {
  return mode == PayloadMode::kDetached ? wire::FrameReader::Payload::kDetached
                                        : wire::FrameReader::Payload::kBuffered;
}

Frame FromWireFrame(wire::WireFrame f) {
  return Frame{FromWire(f.header), std::move(f.body), std::move(f.payload)};
}

}  // namespace

FrameDecoder::FrameDecoder(FrameDirection direction, ProtocolLimits limits,
                           PayloadMode payload_mode)
    : direction_(direction), limits_(limits), reader_(kFrameFormat, ReaderPayload(payload_mode)) {
  Status s = limits_.Validate();
  if (!s.ok()) static_cast<void>(reader_.Fail(s.WithContext("frame decoder")));
}

Status FrameDecoder::CheckHeader(const wire::WireHeader& wire_header) const {
  static const std::string kLimitAdvice =
      "; the peer ignores the limits (advertised in HELLO_REPLY): close the connection";
  static const std::string kShapeAdvice =
      "; the peer does not follow the protocol it negotiated: close the connection";
  const FrameHeader h = FromWire(wire_header);
  bool handshake = h.version == pf::kHandshakeVersion && IsHandshakeType(h.type);
  bool version_ok = expected_version_.has_value() ? h.version == *expected_version_ || handshake
                                                  : IsSpokenVersion(h.version) || handshake;
  if (!version_ok) {
    std::string speaks = expected_version_.has_value() ? "the connection agreed on version " +
                                                             std::to_string(*expected_version_)
                                                       : "this build speaks " + VersionRange();
    return Status::VersionMismatch("read " + FrameWhat(h) + ": protocol version " +
                                   std::to_string(h.version) + " is not accepted (" + speaks +
                                   "); close the connection and reconnect with HELLO");
  }
  if (wire_header.flags != 0) {
    return Status::InvalidArgument("read " + FrameWhat(h) + ": reserved header flags are " +
                                   std::to_string(wire_header.flags) + ", must be 0" +
                                   kShapeAdvice);
  }
  if (h.body_length > limits_.max_body_bytes) {
    return Status::OutOfRange("read " + FrameWhat(h) + ": body of " +
                              std::to_string(h.body_length) + " bytes exceeds the limit of " +
                              std::to_string(limits_.max_body_bytes) + " bytes" + kLimitAdvice);
  }
  if (h.payload_length != 0) {
    if (direction_ == FrameDirection::kRequests) {
      return Status::InvalidArgument("read " + FrameWhat(h) +
                                     ": requests carry no payload, this one announces " +
                                     std::to_string(h.payload_length) + " bytes" + kShapeAdvice);
    }
    if (h.type != pf::kTypeReadReply) {
      return Status::InvalidArgument("read " + FrameWhat(h) +
                                     ": only READ_REPLY frames carry a payload, this one "
                                     "announces " +
                                     std::to_string(h.payload_length) + " bytes" + kShapeAdvice);
    }
    if (h.payload_length > limits_.max_read_bytes) {
      return Status::OutOfRange("read " + FrameWhat(h) + ": payload of " +
                                std::to_string(h.payload_length) + " bytes exceeds the limit of " +
                                std::to_string(limits_.max_read_bytes) + " bytes" + kLimitAdvice);
    }
  }
  // Both terms are within their (capped) limits above: the sum cannot overflow.
  uint64_t total = pf::kFrameHeaderSize + uint64_t{h.body_length} + h.payload_length;
  if (total > limits_.max_message_bytes) {
    return Status::OutOfRange("read " + FrameWhat(h) + ": frame of " + std::to_string(total) +
                              " bytes exceeds the limit of " +
                              std::to_string(limits_.max_message_bytes) + " bytes" + kLimitAdvice);
  }
  return Status::Ok();
}

Result<size_t> FrameDecoder::Feed(std::string_view data) {
  return reader_.Feed(data, [this](const wire::WireHeader& h) { return CheckHeader(h); });
}

Frame FrameDecoder::TakeFrame() { return FromWireFrame(reader_.TakeFrame()); }

Status FrameDecoder::Finish() const { return reader_.Finish(); }

Result<Frame> DecodeFrame(std::string_view bytes, FrameDirection direction,
                          const ProtocolLimits& limits) {
  FrameDecoder decoder(direction, limits);
  GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(bytes));
  if (!decoder.has_frame()) {
    Status cut = decoder.Finish();
    if (cut.ok()) return Status::InvalidArgument("decode frame: no bytes to decode");
    return cut;
  }
  if (used != bytes.size()) {
    return Status::InvalidArgument("decode frame: " + std::to_string(bytes.size() - used) +
                                   " bytes of trailing garbage after a " +
                                   FrameWhat(decoder.TakeFrame().header));
  }
  return decoder.TakeFrame();
}

}  // namespace granary

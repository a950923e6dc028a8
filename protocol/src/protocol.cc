// The cache node protocol (protocol.h): its limits, message names, status
// numbers, version negotiation and the checks of a READ_REPLY against its
// READ. The encoders are in protocol_encode.cc, the decoders in
// protocol_decode.cc, the frame decoder in protocol_frame_decoder.cc, the
// field rules they share in protocol_rules.cc.

#include "granary/protocol/protocol.h"

#include <algorithm>
#include <string>
#include <vector>

#include "granary/core/names.h"
#include "protocol_rules.h"

namespace granary {

namespace pf = protocol_format;

// ---------------------------------------------------------------------------
// Limits

Status ProtocolLimits::Validate() const {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("protocol limits: " + what);
  };
  if (max_items == 0 || max_items > pf::kMaxItemsCap) {
    return bad("max_items " + std::to_string(max_items) + " must be 1.." +
               std::to_string(pf::kMaxItemsCap));
  }
  uint64_t needed = std::max<uint64_t>(
      {pf::kMinBodyBytes, pf::MaxReadBodySize(max_items), pf::MaxReadReplyBodySize(max_items)});
  if (max_body_bytes < needed || max_body_bytes > pf::kMaxBodyBytesCap) {
    return bad("max_body_bytes " + std::to_string(max_body_bytes) + " must be " +
               std::to_string(needed) + ".." + std::to_string(pf::kMaxBodyBytesCap) + " for " +
               std::to_string(max_items) + " items; lower max_items or raise it");
  }
  if (max_read_bytes == 0 || max_read_bytes > pf::kMaxReadBytesCap) {
    return bad("max_read_bytes " + std::to_string(max_read_bytes) + " must be 1.." +
               std::to_string(pf::kMaxReadBytesCap));
  }
  uint64_t least = pf::kFrameHeaderSize + uint64_t{max_body_bytes};
  if (max_message_bytes < least || max_message_bytes > pf::kMaxMessageBytesCap) {
    return bad("max_message_bytes " + std::to_string(max_message_bytes) + " must be " +
               std::to_string(least) + ".." + std::to_string(pf::kMaxMessageBytesCap) +
               " (at least the header and max_body_bytes)");
  }
  return Status::Ok();
}

ProtocolLimits CommonLimits(const ProtocolLimits& a, const ProtocolLimits& b) {
  ProtocolLimits l;
  l.max_body_bytes = std::min(a.max_body_bytes, b.max_body_bytes);
  l.max_items = std::min(a.max_items, b.max_items);
  l.max_read_bytes = std::min(a.max_read_bytes, b.max_read_bytes);
  l.max_message_bytes = std::min(a.max_message_bytes, b.max_message_bytes);
  return l;
}

// ---------------------------------------------------------------------------
// Messages

std::string_view MessageTypeName(uint16_t type) {
  switch (type) {
    case pf::kTypeHello:
      return "HELLO";
    case pf::kTypePing:
      return "PING";
    case pf::kTypeStat:
      return "STAT";
    case pf::kTypeRead:
      return "READ";
    case pf::kTypeHelloReply:
      return "HELLO_REPLY";
    case pf::kTypePong:
      return "PONG";
    case pf::kTypeStatReply:
      return "STAT_REPLY";
    case pf::kTypeReadReply:
      return "READ_REPLY";
    case pf::kTypeError:
      return "ERROR";
    case pf::kTypeAuth:
      return "AUTH";
    case pf::kTypeAuthProof:
      return "AUTH_PROOF";
    case pf::kTypeAuthReply:
      return "AUTH_REPLY";
    case pf::kTypeAuthProofReply:
      return "AUTH_PROOF_REPLY";
    default:
      return "unknown";
  }
}

uint64_t ReadRequest::RequestedBytes() const {
  uint64_t total = 0;
  for (const ReadItem& item : items) total += item.length;
  return total;
}

uint64_t ReadReply::PayloadBytes() const {
  uint64_t total = 0;
  for (const ReadReplyItem& item : items) total += item.length;
  return total;
}

uint16_t ToWireStatus(StatusCode code) { return static_cast<uint16_t>(static_cast<int>(code)); }

std::optional<StatusCode> FromWireStatus(uint16_t wire) {
  if (wire > pf::kWireMaxKnown) return std::nullopt;
  return static_cast<StatusCode>(wire);
}

Result<uint16_t> NegotiateVersion(const HelloRequest& hello, uint16_t server_min,
                                  uint16_t server_max) {
  if (hello.min_version == 0 || hello.min_version > hello.max_version) {
    return Status::InvalidArgument("negotiate protocol version with " + Quoted(hello.peer_name) +
                                   ": its version range " + std::to_string(hello.min_version) +
                                   ".." + std::to_string(hello.max_version) +
                                   " is empty or starts at 0");
  }
  uint16_t low = std::max(hello.min_version, server_min);
  uint16_t high = std::min(hello.max_version, server_max);
  if (low > high) {
    return Status::VersionMismatch("negotiate protocol version with " + Quoted(hello.peer_name) +
                                   ": it speaks versions " + std::to_string(hello.min_version) +
                                   ".." + std::to_string(hello.max_version) + ", this server " +
                                   std::to_string(server_min) + ".." + std::to_string(server_max) +
                                   "; upgrade the older side");
  }
  return high;
}

Status CheckReadReply(const ReadRequest& request, const ReadReply& reply) {
  if (request.items.size() != reply.items.size()) {
    return Status::InvalidArgument("check READ_REPLY: " + std::to_string(reply.items.size()) +
                                   " items answer a READ of " +
                                   std::to_string(request.items.size()));
  }
  for (size_t i = 0; i < reply.items.size(); ++i) {
    const ReadReplyItem& item = reply.items[i];
    if (item.status.ok() && item.length != request.items[i].length) {
      return Status::InvalidArgument("check READ_REPLY: item " + std::to_string(i) + " has " +
                                     std::to_string(item.length) + " bytes, " +
                                     std::to_string(request.items[i].length) + " were asked for");
    }
  }
  return Status::Ok();
}

Result<std::vector<std::string_view>> SplitReadPayload(const ReadReply& reply,
                                                       std::string_view payload) {
  if (reply.PayloadBytes() != payload.size()) {
    return Status::InvalidArgument("split READ_REPLY payload: the items' lengths add up to " +
                                   std::to_string(reply.PayloadBytes()) +
                                   " bytes, the payload is " + std::to_string(payload.size()));
  }
  std::vector<std::string_view> pieces;
  pieces.reserve(reply.items.size());
  size_t at = 0;
  for (const ReadReplyItem& item : reply.items) {
    pieces.push_back(payload.substr(at, item.length));
    at += item.length;
  }
  return pieces;
}

}  // namespace granary

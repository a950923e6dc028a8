// The sidecar's local protocol (sidecar_protocol.h): limits, names and
// versions, the encoders and decoders, and the frame decoder. Message bodies
// are described once, in sidecar_messages.h; the encoders and decoders walk
// those descriptions (sidecar_fields.h). Frames go through the shared frame
// layer (wire_frame.h).

#include "granary/protocol/sidecar_protocol.h"

#include <algorithm>
#include <string>
#include <utility>
#include <variant>

#include "granary/core/names.h"
#include "granary/protocol/wire_frame.h"
#include "sidecar_fields.h"
#include "sidecar_messages.h"

namespace granary::sidecar_protocol {
namespace {

namespace sf = sidecar_protocol_format;
using fields::Prefixed;

bool IsSpokenVersion(uint16_t v) { return v >= kMinVersion && v <= kMaxVersion; }

std::string VersionRange() { return wire::VersionRange(kMinVersion, kMaxVersion); }

bool IsRequestType(uint16_t t) { return t >= sf::kTypeHello && t <= sf::kTypeChunkFiles; }
bool IsReplyType(uint16_t t) { return t >= sf::kTypeHelloReply && t <= sf::kTypeChunkFilesReply; }
bool IsHandshakeType(uint16_t t) { return t == sf::kTypeHello || t == sf::kTypeHelloReply; }

// "GET", or "message type 4242" for a number this build does not know.
std::string TypeText(uint16_t type) {
  std::string_view name = MessageTypeName(type);
  if (name == "unknown") return "message type " + std::to_string(type);
  return std::string(name);
}

// "GET frame (request id 7)", or "frame of type 4242 (request id 7)".
std::string FrameWhat(const FrameHeader& h) {
  std::string_view name = MessageTypeName(h.type);
  return wire::DescribeFrame(name == "unknown" ? std::string_view() : name, h.type,
                             /*hex_types=*/false, /*has_request_id=*/true, h.request_id);
}

FrameHeader FromWire(const wire::WireHeader& h) {
  return FrameHeader{h.version, h.type, h.body_length, h.request_id};
}

std::string DescribeWire(const wire::WireHeader& h) { return FrameWhat(FromWire(h)); }

// GRSC: flags and request_id, no payload.
const wire::FrameFormat kFrameFormat = {
    .magic = {sf::kMagic[0], sf::kMagic[1], sf::kMagic[2], sf::kMagic[3]},
    .has_flags = true,
    .has_payload_length = false,
    .has_request_id = true,
    .frame_noun = "sidecar frame",
    .bad_magic_advice =
        "the peer does not speak Granary's sidecar protocol or the stream lost its place: close "
        "the connection",
    .connection_noun = "sidecar connection",
    .describe = &DescribeWire,
};
static_assert(sf::kFrameHeaderSize == 24 && sf::kFlagsOffset == 8 && sf::kBodyLengthOffset == 12 &&
              sf::kRequestIdOffset == 16);

// kVersionMismatch when a frame of `version` cannot carry `type`.
Status CheckTypeInVersion(const std::string& what, uint16_t type, uint16_t version) {
  const uint16_t needs = MinVersionOf(type);
  if (version >= needs) return Status::Ok();
  return Status::VersionMismatch(
      what + ": version: " + TypeText(type) + " exists from sidecar protocol version " +
      std::to_string(needs) + ", this frame is version " + std::to_string(version) +
      "; a connection that agreed on an older version cannot use it (upgrade the older side)");
}

// ---------------------------------------------------------------------------
// Bodies: each message's description (sidecar_messages.h) walked by a visitor.

template <class Variant>
uint16_t TypeOf(const Variant& message) {
  return std::visit([](const auto& m) { return fields::kTypeOf<std::decay_t<decltype(m)>>; },
                    message);
}

// The rules an encoder refuses and a decoder rejects; the error names the field.
template <class Variant>
Status Check(const Variant& message, const Limits& limits) {
  fields::RuleChecker checker(limits);
  std::visit([&](const auto& m) { fields::Fields(checker, m); }, message);
  return checker.status();
}

template <class Variant>
std::string EncodeBody(const Variant& message, const Limits& limits) {
  std::string body;
  fields::BodyWriter writer(limits, &body);
  std::visit([&](const auto& m) { fields::Fields(writer, m); }, message);
  return body;
}

// The alternative of `Variant` whose message has wire type `type` (false:
// none has).
template <class Variant, size_t... I>
bool EmplaceByType(uint16_t type, Variant* out, std::index_sequence<I...>) {
  return ((fields::kTypeOf<std::variant_alternative_t<I, Variant>> == type
               ? (out->template emplace<I>(), true)
               : false) ||
          ...);
}

// A complete frame's body as the message its type names, read and checked.
template <class Variant>
Result<Variant> DecodeBody(const Frame& f, const Limits& limits) {
  Variant out;
  if (!EmplaceByType(f.header.type, &out,
                     std::make_index_sequence<std::variant_size_v<Variant>>())) {
    return Status::Internal("decode " + FrameWhat(f.header) + ": not a type of this direction");
  }
  fields::BodyReader reader(limits, f.body);
  std::visit([&](auto& m) { fields::Fields(reader, m); }, out);
  reader.End();
  Status s = reader.ok() ? Check(out, limits) : reader.status();
  if (!s.ok()) return Prefixed("decode " + FrameWhat(f.header), s);
  return out;
}

// A Frame may come from anywhere, not only from a FrameDecoder.
Status CheckFrameShape(const Frame& f) {
  const FrameHeader& h = f.header;
  if (f.body.size() != h.body_length) {
    return Status::InvalidArgument("decode " + FrameWhat(h) + ": header: announces " +
                                   std::to_string(h.body_length) + " body bytes, the frame holds " +
                                   std::to_string(f.body.size()));
  }
  if (!IsSpokenVersion(h.version)) {
    return Status::VersionMismatch("decode " + FrameWhat(h) +
                                   ": version: " + std::to_string(h.version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  if (IsHandshakeType(h.type) && h.version != kHandshakeVersion) {
    return Status::VersionMismatch("decode " + FrameWhat(h) + ": version: sent as " +
                                   std::to_string(h.version) + ", " + TypeText(h.type) +
                                   " is always version " + std::to_string(kHandshakeVersion));
  }
  return CheckTypeInVersion("decode " + FrameWhat(h), h.type, h.version);
}

// Frame header rules of FrameDecoder: a failure here is a framing error.
Status CheckHeader(const wire::WireHeader& wh, const Limits& limits) {
  static const std::string kAdvice =
      "; the stream cannot be trusted any more: close the connection";
  const FrameHeader h = FromWire(wh);
  if (!IsSpokenVersion(h.version)) {
    return Status::VersionMismatch(
        "read " + FrameWhat(h) + ": version: " + std::to_string(h.version) +
        " is not spoken by this build (" + VersionRange() + "); close and reconnect with HELLO");
  }
  if (wh.flags != 0) {
    return Status::InvalidArgument("read " + FrameWhat(h) + ": flags: " + std::to_string(wh.flags) +
                                   ", must be 0" + kAdvice);
  }
  if (h.body_length > limits.max_body_bytes) {
    return Status::OutOfRange(
        "read " + FrameWhat(h) + ": body_length: " + std::to_string(h.body_length) +
        " bytes exceed the limit of " + std::to_string(limits.max_body_bytes) +
        " (limits.max_body_bytes, advertised in HELLO_REPLY)" + kAdvice);
  }
  return Status::Ok();
}

// The frame of an encoded message.
std::string Assembled(uint16_t version, uint16_t type, uint64_t request_id,
                      const std::string& body) {
  return wire::EncodeFrame(kFrameFormat, wire::WireHeader{version, type, 0, 0, 0, request_id},
                           body);
}

Result<std::string> Assemble(const std::string& what, uint16_t version, uint16_t type,
                             uint64_t request_id, const std::string& body, const Limits& limits) {
  if (body.size() > limits.max_body_bytes) {
    return Status::OutOfRange(what + ": body of " + std::to_string(body.size()) +
                              " bytes exceeds the receiver's limit of " +
                              std::to_string(limits.max_body_bytes) +
                              " bytes (limits.max_body_bytes); split the message");
  }
  return Assembled(version, type, request_id, body);
}

// The checks before any body: limits, version, type in version.
Status CheckEnvelope(const std::string& what, const Limits& limits, uint16_t* version,
                     uint16_t type) {
  Status valid = limits.Validate();
  if (!valid.ok()) return Prefixed(what, valid);
  if (!IsSpokenVersion(*version)) {
    return Status::InvalidArgument(what + ": version " + std::to_string(*version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  if (IsHandshakeType(type)) *version = kHandshakeVersion;
  return CheckTypeInVersion(what, type, *version);
}

}  // namespace

// ---------------------------------------------------------------------------
// Limits, names, versions

Status Limits::Validate() const {
  if (max_body_bytes < sf::kMinBodyBytes || max_body_bytes > kMaxBodyBytesCap) {
    return Status::InvalidArgument(
        "sidecar protocol limits: max_body_bytes " + std::to_string(max_body_bytes) + " must be " +
        std::to_string(sf::kMinBodyBytes) + ".." + std::to_string(kMaxBodyBytesCap));
  }
  if (max_items == 0 || max_items > kMaxItemsCap) {
    return Status::InvalidArgument("sidecar protocol limits: max_items " +
                                   std::to_string(max_items) + " must be 1.." +
                                   std::to_string(kMaxItemsCap));
  }
  return Status::Ok();
}

Limits CommonLimits(const Limits& a, const Limits& b) {
  return Limits{std::min(a.max_body_bytes, b.max_body_bytes), std::min(a.max_items, b.max_items)};
}

std::string_view MessageTypeName(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "HELLO";
    case MessageType::kOpen:
      return "OPEN";
    case MessageType::kSetPlan:
      return "SET_PLAN";
    case MessageType::kGet:
      return "GET";
    case MessageType::kNext:
      return "NEXT";
    case MessageType::kRelease:
      return "RELEASE";
    case MessageType::kStat:
      return "STAT";
    case MessageType::kLookup:
      return "LOOKUP";
    case MessageType::kPing:
      return "PING";
    case MessageType::kHelloReply:
      return "HELLO_REPLY";
    case MessageType::kOpenReply:
      return "OPEN_REPLY";
    case MessageType::kOk:
      return "OK";
    case MessageType::kSamples:
      return "SAMPLES";
    case MessageType::kStatReply:
      return "STAT_REPLY";
    case MessageType::kLookupReply:
      return "LOOKUP_REPLY";
    case MessageType::kPong:
      return "PONG";
    case MessageType::kError:
      return "ERROR";
    case MessageType::kDirectories:
      return "DIRECTORIES";
    case MessageType::kDirectoriesReply:
      return "DIRECTORIES_REPLY";
    case MessageType::kChunkFiles:
      return "CHUNK_FILES";
    case MessageType::kChunkFilesReply:
      return "CHUNK_FILES_REPLY";
  }
  return "unknown";
}

uint16_t MinVersionOf(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kDirectories:
    case MessageType::kDirectoriesReply:
      return kDirectoriesVersion;
    case MessageType::kChunkFiles:
    case MessageType::kChunkFilesReply:
      return kChunkFilesVersion;
    default:
      return kMinVersion;
  }
}

Result<uint16_t> NegotiateVersion(const Hello& hello) {
  if (hello.min_version == 0 || hello.min_version > hello.max_version) {
    return Status::InvalidArgument("negotiate sidecar protocol version with client " +
                                   Quoted(hello.client_name) + ": its version range " +
                                   std::to_string(hello.min_version) + ".." +
                                   std::to_string(hello.max_version) + " is empty or starts at 0");
  }
  uint16_t low = std::max(hello.min_version, kMinVersion);
  uint16_t high = std::min(hello.max_version, kMaxVersion);
  if (low > high) {
    return Status::VersionMismatch("negotiate sidecar protocol version with client " +
                                   Quoted(hello.client_name) + ": it speaks versions " +
                                   std::to_string(hello.min_version) + ".." +
                                   std::to_string(hello.max_version) + ", this sidecar " +
                                   VersionRange() + "; upgrade the older side");
  }
  return high;
}

// ---------------------------------------------------------------------------
// Encoders

Result<std::string> EncodeRequest(uint64_t request_id, const Request& request, const Limits& limits,
                                  uint16_t version) {
  const uint16_t type = TypeOf(request);
  const std::string what =
      "encode " + TypeText(type) + " request (id " + std::to_string(request_id) + ")";
  GRANARY_RETURN_IF_ERROR(CheckEnvelope(what, limits, &version, type));
  if (request_id == 0) {
    return Status::InvalidArgument(
        what +
        ": request id 0 is reserved for errors that blame no request; number requests "
        "from 1");
  }
  Status s = Check(request, limits);
  if (!s.ok()) return Prefixed(what, s);
  return Assemble(what, version, type, request_id, EncodeBody(request, limits), limits);
}

Result<std::string> EncodeReply(uint64_t request_id, const Reply& reply, const Limits& limits,
                                uint16_t version) {
  const uint16_t type = TypeOf(reply);
  const std::string what =
      "encode " + TypeText(type) + " reply (request id " + std::to_string(request_id) + ")";
  GRANARY_RETURN_IF_ERROR(CheckEnvelope(what, limits, &version, type));
  if (request_id == 0 && type != sf::kTypeError) {
    return Status::InvalidArgument(what +
                                   ": request id 0 is only for an ERROR that blames no request");
  }
  Status s = Check(reply, limits);
  if (!s.ok()) return Prefixed(what, s);
  return Assemble(what, version, type, request_id, EncodeBody(reply, limits), limits);
}

std::string EncodeError(uint64_t request_id, const Status& status, bool closing, uint16_t version) {
  Status sent = status.ok() ? Status::Internal("request " + std::to_string(request_id) +
                                               " failed with no error recorded (a sidecar bug)")
                            : status;
  if (!IsSpokenVersion(version)) version = kHandshakeVersion;
  return Assembled(version, sf::kTypeError, request_id,
                   EncodeBody(Reply(Error{sent, closing}), Limits{}));
}

// ---------------------------------------------------------------------------
// Decoders

Result<Request> DecodeRequest(const Frame& frame, const Limits& limits) {
  const FrameHeader& h = frame.header;
  GRANARY_RETURN_IF_ERROR(CheckFrameShape(frame));
  if (IsReplyType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) +
                                   ": type: a reply type; a sidecar accepts requests only");
  }
  if (!IsRequestType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) + ": type: unknown request type " +
                                   std::to_string(h.type) +
                                   "; the client may speak a newer protocol");
  }
  if (h.request_id == 0) {
    return Status::InvalidArgument(
        "decode " + FrameWhat(h) +
        ": request_id: 0 is reserved for errors that blame no request; number requests from 1");
  }
  return DecodeBody<Request>(frame, limits);
}

Result<Reply> DecodeReply(const Frame& frame, const Limits& limits) {
  const FrameHeader& h = frame.header;
  GRANARY_RETURN_IF_ERROR(CheckFrameShape(frame));
  if (IsRequestType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) +
                                   ": type: a request type; a client accepts replies only");
  }
  if (!IsReplyType(h.type)) {
    return Status::InvalidArgument("decode " + FrameWhat(h) + ": type: unknown reply type " +
                                   std::to_string(h.type) +
                                   "; the sidecar may speak a newer protocol");
  }
  if (h.request_id == 0 && h.type != sf::kTypeError) {
    return Status::InvalidArgument("decode " + FrameWhat(h) +
                                   ": request_id: 0 is only for an ERROR that blames no request");
  }
  return DecodeBody<Reply>(frame, limits);
}

// ---------------------------------------------------------------------------
// FrameDecoder

FrameDecoder::FrameDecoder(Limits limits) : limits_(limits), reader_(kFrameFormat) {
  Status s = limits_.Validate();
  if (!s.ok()) static_cast<void>(reader_.Fail(s.WithContext("sidecar frame decoder")));
}

Result<size_t> FrameDecoder::Feed(std::string_view data) {
  return reader_.Feed(data, [this](const wire::WireHeader& h) { return CheckHeader(h, limits_); });
}

Frame FrameDecoder::TakeFrame() {
  wire::WireFrame f = reader_.TakeFrame();
  return Frame{FromWire(f.header), std::move(f.body)};
}

Result<Frame> DecodeFrame(std::string_view bytes, const Limits& limits) {
  FrameDecoder decoder(limits);
  GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(bytes));
  if (!decoder.has_frame()) {
    Status cut = decoder.Finish();
    if (cut.ok()) return Status::InvalidArgument("decode sidecar frame: no bytes to decode");
    return cut;
  }
  if (used != bytes.size()) {
    return Status::InvalidArgument("decode sidecar frame: " + std::to_string(bytes.size() - used) +
                                   " trailing bytes after a " +
                                   FrameWhat(decoder.TakeFrame().header));
  }
  return decoder.TakeFrame();
}

}  // namespace granary::sidecar_protocol

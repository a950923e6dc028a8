// The cache node protocol's encoders (protocol.h): requests, responses with
// their payload pieces, and ERROR.

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <utility>

#include "granary/core/byte_order.h"
#include "granary/core/file.h"
#include "granary/protocol/protocol.h"
#include "overloaded.h"
#include "protocol_rules.h"

namespace granary {

using namespace protocol_internal;

namespace {

void PutDataset(ByteWriter* w, std::string_view name) {
  std::string field(pf::kDatasetFieldSize, '\0');
  std::memcpy(field.data(), name.data(), std::min<size_t>(name.size(), pf::kDatasetFieldSize - 1));
  w->PutBytes(field);
}

void PutContentId(ByteWriter* w, const ContentId& id) {
  std::array<uint8_t, 16> bytes = id.ToBytes();
  w->PutBytes(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// Fixed header + body, after checking the body against the receiver's limits.
Result<std::string> Assemble(uint16_t version, uint16_t type, uint64_t request_id,
                             const std::string& body, uint64_t payload_length,
                             const ProtocolLimits& limits) {
  if (body.size() > limits.max_body_bytes) {
    return Status::OutOfRange("encode " + std::string(MessageTypeName(type)) + ": body of " +
                              std::to_string(body.size()) + " bytes exceeds the limit of " +
                              std::to_string(limits.max_body_bytes) + " bytes");
  }
  uint64_t total = pf::kFrameHeaderSize + uint64_t{body.size()} + payload_length;
  if (total > limits.max_message_bytes) {
    return Status::OutOfRange("encode " + std::string(MessageTypeName(type)) + ": frame of " +
                              std::to_string(total) + " bytes exceeds the limit of " +
                              std::to_string(limits.max_message_bytes) + " bytes");
  }
  return wire::EncodeFrame(kFrameFormat,
                           wire::WireHeader{version, type, 0, 0, payload_length, request_id}, body);
}

void EncodeErrorBody(ByteWriter* w, const Status& status, bool closing) {
  std::string_view message = wire::Cut(status.message(), pf::kMaxErrorMessageLength);
  w->Put(ToWireStatus(status.code()));
  w->Put(closing ? pf::kErrorClosing : uint16_t{0});
  w->Put(static_cast<uint32_t>(message.size()));
  w->PutBytes(message);
}

template <size_t N>
void PutArray(ByteWriter* w, const std::array<uint8_t, N>& a) {
  w->PutBytes(std::string_view(reinterpret_cast<const char*>(a.data()), N));
}

}  // namespace

// ---------------------------------------------------------------------------
// Encoding

uint64_t PieceSize(const PayloadPiece& piece) {
  return std::visit(Overloaded{[](std::string_view s) -> uint64_t { return s.size(); },
                               [](const FileRange& f) { return f.length; }},
                    piece);
}

uint64_t OutgoingFrame::payload_length() const {
  uint64_t total = 0;
  for (const PayloadPiece& p : payload) total += PieceSize(p);
  return total;
}

Result<std::string> Flatten(const OutgoingFrame& frame) {
  std::string out = frame.header;
  for (const PayloadPiece& piece : frame.payload) {
    if (const auto* memory = std::get_if<std::string_view>(&piece)) {
      out.append(*memory);
      continue;
    }
    const FileRange& f = std::get<FileRange>(piece);
    size_t at = out.size();
    out.resize(at + f.length);
    GRANARY_RETURN_IF_ERROR(
        PreadFull(f.fd, out.data() + at, f.length, f.offset,
                  "flatten frame: payload piece of fd " + std::to_string(f.fd)));
  }
  return out;
}

Result<std::string> EncodeRequest(uint64_t request_id, const RequestMessage& request,
                                  const EncodeOptions& options) {
  const ProtocolLimits& limits = options.limits;
  GRANARY_RETURN_IF_ERROR(limits.Validate());
  if (!IsSpokenVersion(options.version)) {
    return Status::InvalidArgument("encode request: version " + std::to_string(options.version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  if (request_id == 0) {
    return Status::InvalidArgument(
        "encode request: request id 0 is reserved for connection errors; number requests from 1");
  }
  std::string body;
  ByteWriter w(&body);
  uint16_t version = options.version;
  uint16_t type = 0;
  Status status =
      std::visit(Overloaded{
                     [&](const HelloRequest& hello) -> Status {
                       type = pf::kTypeHello;
                       version = pf::kHandshakeVersion;
                       GRANARY_RETURN_IF_ERROR(CheckPeerName(hello.peer_name));
                       if (hello.min_version == 0 || hello.min_version > hello.max_version) {
                         return Status::InvalidArgument(
                             "encode HELLO: version range " + std::to_string(hello.min_version) +
                             ".." + std::to_string(hello.max_version) + " is empty or starts at 0");
                       }
                       w.Put(hello.min_version);
                       w.Put(hello.max_version);
                       w.Put(uint32_t{0});
                       w.Put(static_cast<uint16_t>(hello.peer_name.size()));
                       w.Put(uint16_t{0});
                       w.PutBytes(hello.peer_name);
                       return Status::Ok();
                     },
                     [&](const PingRequest&) -> Status {
                       type = pf::kTypePing;
                       return Status::Ok();
                     },
                     [&](const StatRequest& stat) -> Status {
                       type = pf::kTypeStat;
                       GRANARY_RETURN_IF_ERROR(CheckStatRequest(stat));
                       PutDataset(&w, stat.dataset);
                       PutContentId(&w, stat.manifest_id);
                       w.Put(uint32_t{0});
                       return Status::Ok();
                     },
                     [&](const ReadRequest& read) -> Status {
                       type = pf::kTypeRead;
                       GRANARY_RETURN_IF_ERROR(CheckReadRequest(read, limits));
                       body.reserve(pf::MaxReadBodySize(read.items.size()));
                       PutDataset(&w, read.dataset);
                       PutContentId(&w, read.manifest_id);
                       w.Put(static_cast<uint32_t>(read.items.size()));
                       w.Put(uint32_t{0});
                       for (const ReadItem& item : read.items) {
                         w.Put(static_cast<uint16_t>(item.kind));
                         w.Put(uint16_t{0});
                         w.Put(item.id);
                         w.Put(item.offset);
                         w.Put(item.length);
                         w.Put(uint32_t{0});
                       }
                       return Status::Ok();
                     },
                     [&](const AuthRequest& auth) -> Status {
                       type = pf::kTypeAuth;
                       GRANARY_RETURN_IF_ERROR(RequireAuthVersion(version));
                       GRANARY_RETURN_IF_ERROR(CheckAuthRequest(auth));
                       w.Put(static_cast<uint16_t>(auth.method));
                       w.Put(uint16_t{0});
                       w.Put(static_cast<uint32_t>(auth.credential.size()));
                       PutArray(&w, auth.client_nonce);
                       w.PutBytes(auth.credential);
                       return Status::Ok();
                     },
                     [&](const AuthProofRequest& proof) -> Status {
                       type = pf::kTypeAuthProof;
                       GRANARY_RETURN_IF_ERROR(RequireAuthVersion(version));
                       PutArray(&w, proof.proof);
                       return Status::Ok();
                     },
                 },
                 request);
  if (!status.ok()) {
    return Status(status.code(), "encode " + std::string(MessageTypeName(type)) + " request " +
                                     std::to_string(request_id) + ": " + status.message());
  }
  return Assemble(version, type, request_id, body, 0, limits);
}

Result<OutgoingFrame> EncodeResponse(uint64_t request_id, const ResponseMessage& response,
                                     std::vector<PayloadPiece> payload,
                                     const EncodeOptions& options) {
  const ProtocolLimits& limits = options.limits;
  GRANARY_RETURN_IF_ERROR(limits.Validate());
  if (!IsSpokenVersion(options.version)) {
    return Status::InvalidArgument("encode response: version " + std::to_string(options.version) +
                                   " is not spoken by this build (" + VersionRange() + ")");
  }
  std::string body;
  ByteWriter w(&body);
  uint16_t version = options.version;
  uint16_t type = 0;
  uint64_t payload_length = 0;
  Status status = std::visit(
      Overloaded{
          [&](const HelloReply& hello) -> Status {
            type = pf::kTypeHelloReply;
            version = pf::kHandshakeVersion;
            GRANARY_RETURN_IF_ERROR(CheckPeerName(hello.peer_name));
            GRANARY_RETURN_IF_ERROR(hello.limits.Validate());
            if (!IsSpokenVersion(hello.version)) {
              return Status::InvalidArgument("chosen version " + std::to_string(hello.version) +
                                             " is not spoken by this build (" + VersionRange() +
                                             ")");
            }
            if (hello.auth_required && hello.version < pf::kAuthVersion) {
              return Status::InvalidArgument(
                  "authentication cannot be required in protocol version " +
                  std::to_string(hello.version) + "; it needs version " +
                  std::to_string(pf::kAuthVersion));
            }
            w.Put(hello.version);
            w.Put(uint16_t{0});
            w.Put(hello.auth_required ? pf::kHelloReplyAuthRequired : uint32_t{0});
            w.Put(hello.limits.max_body_bytes);
            w.Put(hello.limits.max_items);
            w.Put(hello.limits.max_read_bytes);
            w.Put(hello.limits.max_message_bytes);
            w.Put(static_cast<uint16_t>(hello.peer_name.size()));
            w.Put(uint16_t{0});
            w.PutBytes(hello.peer_name);
            return Status::Ok();
          },
          [&](const PongReply&) -> Status {
            type = pf::kTypePong;
            return Status::Ok();
          },
          [&](const StatReply& stat) -> Status {
            type = pf::kTypeStatReply;
            GRANARY_RETURN_IF_ERROR(CheckStatReply(stat));
            w.Put(static_cast<uint16_t>(stat.state));
            w.Put(uint16_t{0});
            w.Put(static_cast<uint32_t>(stat.entries.size()));
            for (const StatEntry& e : stat.entries) {
              w.Put(static_cast<uint8_t>(e.key.size()));
              w.PutBytes(e.key);
              w.Put(e.value);
            }
            return Status::Ok();
          },
          [&](const ReadReply& read) -> Status {
            type = pf::kTypeReadReply;
            GRANARY_RETURN_IF_ERROR(CheckReplyItems(read, limits));
            payload_length = read.PayloadBytes();
            uint64_t pieces = 0;
            for (size_t i = 0; i < payload.size(); ++i) {
              if (const auto* f = std::get_if<FileRange>(&payload[i]); f != nullptr && f->fd < 0) {
                return Status::InvalidArgument("payload piece " + std::to_string(i) +
                                               " is a file range without a file (fd " +
                                               std::to_string(f->fd) + ")");
              }
              uint64_t size = PieceSize(payload[i]);
              if (size > payload_length - std::min(pieces, payload_length)) {
                pieces = payload_length + 1;  // more than the items need; no overflow
                break;
              }
              pieces += size;
            }
            if (pieces != payload_length) {
              return Status::InvalidArgument("the payload pieces do not add up to the items' " +
                                             std::to_string(payload_length) +
                                             " bytes; pass exactly the OK items' bytes");
            }
            w.Put(static_cast<uint32_t>(read.items.size()));
            w.Put(uint32_t{0});
            std::vector<std::string_view> messages;
            messages.reserve(read.items.size());
            for (const ReadReplyItem& item : read.items) {
              std::string_view message;
              if (!item.status.ok())
                message = wire::Cut(item.status.message(), pf::kMaxItemMessageLength);
              messages.push_back(message);
              w.Put(ToWireStatus(item.status.code()));
              w.Put(item.checksum.has_value() ? pf::kReplyItemHasChecksum : uint16_t{0});
              w.Put(static_cast<uint16_t>(message.size()));
              w.Put(uint16_t{0});
              w.Put(item.length);
              w.Put(uint32_t{0});
              w.Put(item.checksum.value_or(0));
            }
            for (std::string_view m : messages) w.PutBytes(m);
            return Status::Ok();
          },
          [&](const ErrorReply& error) -> Status {
            type = pf::kTypeError;
            if (error.status.ok()) return Status::InvalidArgument("an ERROR needs a failed status");
            EncodeErrorBody(&w, error.status, error.closing);
            return Status::Ok();
          },
          [&](const AuthReply& auth) -> Status {
            type = pf::kTypeAuthReply;
            GRANARY_RETURN_IF_ERROR(RequireAuthVersion(version));
            if (auth.granted) {
              GRANARY_RETURN_IF_ERROR(CheckAuthScope(auth.scope));
            } else if (!auth.scope.empty()) {
              return Status::InvalidArgument("a challenge carries no scope");
            }
            w.Put(uint16_t{auth.granted ? uint16_t{1} : uint16_t{0}});
            w.Put(uint16_t{0});
            w.Put(static_cast<uint32_t>(auth.scope.size()));
            PutArray(&w, auth.server_nonce);
            PutArray(&w, auth.server_proof);
            w.PutBytes(auth.scope);
            return Status::Ok();
          },
          [&](const AuthProofReply& auth) -> Status {
            type = pf::kTypeAuthProofReply;
            GRANARY_RETURN_IF_ERROR(RequireAuthVersion(version));
            GRANARY_RETURN_IF_ERROR(CheckAuthScope(auth.scope));
            w.Put(uint32_t{0});
            w.Put(static_cast<uint32_t>(auth.scope.size()));
            w.PutBytes(auth.scope);
            return Status::Ok();
          },
      },
      response);
  if (status.ok() && type != pf::kTypeReadReply && !payload.empty()) {
    status = Status::InvalidArgument("only READ_REPLY carries a payload");
  }
  if (!status.ok()) {
    return Status(status.code(), "encode " + std::string(MessageTypeName(type)) + " for request " +
                                     std::to_string(request_id) + ": " + status.message());
  }
  OutgoingFrame frame;
  GRANARY_ASSIGN_OR_RETURN(frame.header,
                           Assemble(version, type, request_id, body, payload_length, limits));
  frame.payload = std::move(payload);
  return frame;
}

std::string EncodeError(uint64_t request_id, const Status& status, bool closing, uint16_t version) {
  Status sent = status.ok() ? Status::Internal("request " + std::to_string(request_id) +
                                               " failed with no error recorded (a server bug)")
                            : status;
  if (!IsSpokenVersion(version)) version = pf::kHandshakeVersion;
  std::string body;
  ByteWriter w(&body);
  EncodeErrorBody(&w, sent, closing);
  return wire::EncodeFrame(kFrameFormat,
                           wire::WireHeader{version, pf::kTypeError, 0, 0, 0, request_id}, body);
}

}  // namespace granary

// The cache node protocol's message decoders (protocol.h): a complete frame
// to a RequestMessage or ResponseMessage, with every field rule applied.

#include <array>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/names.h"
#include "granary/protocol/protocol.h"
#include "protocol_rules.h"

namespace granary {

using namespace protocol_internal;

namespace {

// Checks that a frame is internally consistent and of a version this build
// speaks (a Frame may come from anywhere, not only from a FrameDecoder).
Status CheckFrameShape(const Frame& f, bool request) {
  const FrameHeader& h = f.header;
  if (f.body.size() != h.body_length) {
    return DecodeInvalid(h, "the header announces " + std::to_string(h.body_length) +
                                " body bytes, the frame holds " + std::to_string(f.body.size()));
  }
  if (!f.payload.empty() && f.payload.size() != h.payload_length) {
    return DecodeInvalid(h, "the header announces " + std::to_string(h.payload_length) +
                                " payload bytes, the frame holds " +
                                std::to_string(f.payload.size()));
  }
  bool handshake_ok = h.version == pf::kHandshakeVersion && IsHandshakeType(h.type);
  if (!IsSpokenVersion(h.version) && !handshake_ok) {
    return Status::VersionMismatch("decode " + FrameWhat(h) + ": protocol version " +
                                   std::to_string(h.version) + " is not spoken by this build (" +
                                   VersionRange() + ")");
  }
  if ((h.type == pf::kTypeHello || h.type == pf::kTypeHelloReply) &&
      h.version != pf::kHandshakeVersion) {
    return Status::VersionMismatch(
        "decode " + FrameWhat(h) + ": sent as version " + std::to_string(h.version) +
        ", handshake frames are always version " + std::to_string(pf::kHandshakeVersion));
  }
  if (request && h.payload_length != 0) {
    return DecodeInvalid(h, "requests carry no payload, this one announces " +
                                std::to_string(h.payload_length) + " bytes");
  }
  if (!request && h.payload_length != 0 && h.type != pf::kTypeReadReply) {
    return DecodeInvalid(h, "only READ_REPLY frames carry a payload, this one announces " +
                                std::to_string(h.payload_length) + " bytes");
  }
  return Status::Ok();
}

Status ExpectSize(const FrameHeader& h, size_t expected) {
  if (h.body_length != expected) {
    return DecodeInvalid(h, "body is " + std::to_string(h.body_length) + " bytes, expected " +
                                std::to_string(expected));
  }
  return Status::Ok();
}

Status ExpectZero(const FrameHeader& h, uint64_t v, const char* field) {
  if (v != 0) {
    return DecodeInvalid(
        h, std::string("reserved field ") + field + " is " + std::to_string(v) + ", must be 0");
  }
  return Status::Ok();
}

Result<std::string> GetDataset(const FrameHeader& h, ByteReader* r, bool allow_empty) {
  std::string_view field;
  r->GetBytes(pf::kDatasetFieldSize, &field);
  size_t nul = field.find('\0');
  if (nul == std::string_view::npos) {
    return DecodeInvalid(h, "dataset field " + Quoted(field) + " has no NUL terminator");
  }
  if (field.find_first_not_of('\0', nul) != std::string_view::npos) {
    return DecodeInvalid(h,
                         "dataset field " + Quoted(field) + " has bytes after its NUL terminator");
  }
  std::string name(field.substr(0, nul));
  Status s = CheckDatasetName(name, allow_empty);
  if (!s.ok()) return DecodeInvalid(h, s.message());
  return name;
}

ContentId GetContentId(ByteReader* r) {
  std::string_view bytes;
  r->GetBytes(pf::kManifestIdSize, &bytes);
  return ContentId::FromBytes(reinterpret_cast<const uint8_t*>(bytes.data()));
}

// A checked Status from an encoder/decoder rule, put in the decoder's context.
Status InContext(const FrameHeader& h, const Status& s) {
  if (s.ok()) return s;
  return Status(s.code(), "decode " + FrameWhat(h) + ": " + s.message());
}

Result<RequestMessage> DecodeHello(const Frame& f) {
  const FrameHeader& h = f.header;
  if (f.body.size() < pf::kHelloFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than HELLO's fixed " +
                                std::to_string(pf::kHelloFixedSize));
  }
  ByteReader r(f.body);
  HelloRequest hello;
  uint32_t flags = 0;
  uint16_t name_length = 0, reserved = 0;
  r.Get(&hello.min_version);
  r.Get(&hello.max_version);
  r.Get(&flags);
  r.Get(&name_length);
  r.Get(&reserved);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, flags, "flags"));
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, reserved, "reserved"));
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, size_t{pf::kHelloFixedSize} + name_length));
  std::string_view name;
  r.GetBytes(name_length, &name);
  hello.peer_name = std::string(name);
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckPeerName(hello.peer_name)));
  if (hello.min_version == 0 || hello.min_version > hello.max_version) {
    return DecodeInvalid(h, "version range " + std::to_string(hello.min_version) + ".." +
                                std::to_string(hello.max_version) + " is empty or starts at 0");
  }
  return RequestMessage(std::move(hello));
}

// Authentication frames exist from version 2 on.
Status ExpectAuthVersion(const FrameHeader& h) {
  if (h.version < pf::kAuthVersion) {
    return DecodeInvalid(h, "authentication frames need protocol version " +
                                std::to_string(pf::kAuthVersion) + ", this one is version " +
                                std::to_string(h.version));
  }
  return Status::Ok();
}

template <size_t N>
void GetArray(ByteReader* r, std::array<uint8_t, N>* out) {
  std::string_view bytes;
  r->GetBytes(N, &bytes);
  std::memcpy(out->data(), bytes.data(), N);
}

Result<RequestMessage> DecodeAuth(const Frame& f) {
  const FrameHeader& h = f.header;
  GRANARY_RETURN_IF_ERROR(ExpectAuthVersion(h));
  if (f.body.size() < pf::kAuthFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than AUTH's fixed " +
                                std::to_string(pf::kAuthFixedSize));
  }
  ByteReader r(f.body);
  AuthRequest auth;
  uint16_t method = 0, flags = 0;
  uint32_t length = 0;
  r.Get(&method);
  r.Get(&flags);
  r.Get(&length);
  GetArray(&r, &auth.client_nonce);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, flags, "flags"));
  if (length > pf::kMaxTokenLength) {
    return DecodeRange(h, "a credential of " + std::to_string(length) + " bytes; at most " +
                              std::to_string(pf::kMaxTokenLength));
  }
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, size_t{pf::kAuthFixedSize} + length));
  std::string_view credential;
  r.GetBytes(length, &credential);
  auth.method = static_cast<AuthMethod>(method);
  auth.credential = std::string(credential);
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckAuthRequest(auth)));
  return RequestMessage(std::move(auth));
}

Result<RequestMessage> DecodeAuthProof(const Frame& f) {
  const FrameHeader& h = f.header;
  GRANARY_RETURN_IF_ERROR(ExpectAuthVersion(h));
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, pf::kAuthProofRequestSize));
  ByteReader r(f.body);
  AuthProofRequest proof;
  GetArray(&r, &proof.proof);
  return RequestMessage(proof);
}

Result<std::string> GetScope(const FrameHeader& h, ByteReader* r, size_t fixed, uint32_t length) {
  if (length > pf::kMaxAuthScopeLength) {
    return DecodeRange(h, "a scope of " + std::to_string(length) + " bytes; at most " +
                              std::to_string(pf::kMaxAuthScopeLength));
  }
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, fixed + length));
  std::string_view scope;
  r->GetBytes(length, &scope);
  return std::string(scope);
}

Result<ResponseMessage> DecodeAuthReply(const Frame& f) {
  const FrameHeader& h = f.header;
  GRANARY_RETURN_IF_ERROR(ExpectAuthVersion(h));
  if (f.body.size() < pf::kAuthReplyFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than AUTH_REPLY's fixed " +
                                std::to_string(pf::kAuthReplyFixedSize));
  }
  ByteReader r(f.body);
  AuthReply reply;
  uint16_t granted = 0, reserved = 0;
  uint32_t length = 0;
  r.Get(&granted);
  r.Get(&reserved);
  r.Get(&length);
  GetArray(&r, &reply.server_nonce);
  GetArray(&r, &reply.server_proof);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, reserved, "reserved"));
  if (granted > 1)
    return DecodeInvalid(h, "granted is " + std::to_string(granted) + ", not 0 or 1");
  reply.granted = granted == 1;
  GRANARY_ASSIGN_OR_RETURN(reply.scope, GetScope(h, &r, pf::kAuthReplyFixedSize, length));
  if (reply.granted) {
    GRANARY_RETURN_IF_ERROR(InContext(h, CheckAuthScope(reply.scope)));
  } else if (!reply.scope.empty()) {
    return DecodeInvalid(h, "a challenge carries no scope");
  }
  return ResponseMessage(std::move(reply));
}

Result<ResponseMessage> DecodeAuthProofReply(const Frame& f) {
  const FrameHeader& h = f.header;
  GRANARY_RETURN_IF_ERROR(ExpectAuthVersion(h));
  if (f.body.size() < pf::kAuthProofReplyFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than AUTH_PROOF_REPLY's fixed " +
                                std::to_string(pf::kAuthProofReplyFixedSize));
  }
  ByteReader r(f.body);
  AuthProofReply reply;
  uint32_t reserved = 0, length = 0;
  r.Get(&reserved);
  r.Get(&length);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, reserved, "reserved"));
  GRANARY_ASSIGN_OR_RETURN(reply.scope, GetScope(h, &r, pf::kAuthProofReplyFixedSize, length));
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckAuthScope(reply.scope)));
  return ResponseMessage(std::move(reply));
}

Result<RequestMessage> DecodeStat(const Frame& f) {
  const FrameHeader& h = f.header;
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, pf::kStatRequestSize));
  ByteReader r(f.body);
  StatRequest stat;
  GRANARY_ASSIGN_OR_RETURN(stat.dataset, GetDataset(h, &r, /*allow_empty=*/true));
  stat.manifest_id = GetContentId(&r);
  uint32_t flags = 0;
  r.Get(&flags);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, flags, "flags"));
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckStatRequest(stat)));
  return RequestMessage(std::move(stat));
}

Result<RequestMessage> DecodeRead(const Frame& f, const ProtocolLimits& limits) {
  const FrameHeader& h = f.header;
  if (f.body.size() < pf::kReadFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than READ's fixed " +
                                std::to_string(pf::kReadFixedSize));
  }
  uint32_t count = LoadLe<uint32_t>(f.body.data() + pf::kReadItemCountOffset);
  // The count is checked before anything is allocated for the items.
  if (count > limits.max_items) {
    return DecodeRange(h, std::to_string(count) + " items exceed the limit of " +
                              std::to_string(limits.max_items) +
                              " items per request; split the batch");
  }
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, pf::MaxReadBodySize(count)));
  ByteReader r(f.body);
  ReadRequest read;
  GRANARY_ASSIGN_OR_RETURN(read.dataset, GetDataset(h, &r, /*allow_empty=*/false));
  read.manifest_id = GetContentId(&r);
  uint32_t flags = 0;
  r.Skip(4);  // item count, read above
  r.Get(&flags);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, flags, "flags"));
  read.items.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint16_t kind = 0, item_flags = 0;
    uint32_t reserved = 0;
    ReadItem item;
    r.Get(&kind);
    r.Get(&item_flags);
    r.Get(&item.id);
    r.Get(&item.offset);
    r.Get(&item.length);
    r.Get(&reserved);
    if (item_flags != 0 || reserved != 0) {
      return DecodeInvalid(h, "item " + std::to_string(i) + " has nonzero reserved fields");
    }
    item.kind = static_cast<ReadKind>(kind);
    read.items.push_back(item);
  }
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckReadRequest(read, limits)));
  return RequestMessage(std::move(read));
}

Result<ResponseMessage> DecodeHelloReply(const Frame& f) {
  const FrameHeader& h = f.header;
  if (f.body.size() < pf::kHelloReplyFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than HELLO_REPLY's fixed " +
                                std::to_string(pf::kHelloReplyFixedSize));
  }
  ByteReader r(f.body);
  HelloReply reply;
  uint16_t reserved = 0, name_length = 0, name_reserved = 0;
  uint32_t flags = 0;
  r.Get(&reply.version);
  r.Get(&reserved);
  r.Get(&flags);
  r.Get(&reply.limits.max_body_bytes);
  r.Get(&reply.limits.max_items);
  r.Get(&reply.limits.max_read_bytes);
  r.Get(&reply.limits.max_message_bytes);
  r.Get(&name_length);
  r.Get(&name_reserved);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, reserved, "reserved"));
  if (reply.version >= pf::kAuthVersion) {
    reply.auth_required = (flags & pf::kHelloReplyAuthRequired) != 0;
    flags &= ~pf::kHelloReplyAuthRequired;
  }
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, flags, "flags"));
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, name_reserved, "name reserved"));
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, size_t{pf::kHelloReplyFixedSize} + name_length));
  std::string_view name;
  r.GetBytes(name_length, &name);
  reply.peer_name = std::string(name);
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckPeerName(reply.peer_name)));
  if (!IsSpokenVersion(reply.version)) {
    return Status::VersionMismatch("decode " + FrameWhat(h) + ": the server chose version " +
                                   std::to_string(reply.version) + ", this build speaks " +
                                   VersionRange());
  }
  GRANARY_RETURN_IF_ERROR(InContext(h, reply.limits.Validate()));
  return ResponseMessage(std::move(reply));
}

Result<ResponseMessage> DecodeStatReply(const Frame& f) {
  const FrameHeader& h = f.header;
  if (f.body.size() < pf::kStatReplyFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than STAT_REPLY's fixed " +
                                std::to_string(pf::kStatReplyFixedSize));
  }
  ByteReader r(f.body);
  uint16_t state = 0, reserved = 0;
  uint32_t count = 0;
  r.Get(&state);
  r.Get(&reserved);
  r.Get(&count);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, reserved, "reserved"));
  if (count > pf::kMaxStatEntries) {
    return DecodeRange(h, std::to_string(count) + " entries exceed the limit of " +
                              std::to_string(pf::kMaxStatEntries));
  }
  if (uint64_t{count} * pf::kStatEntryOverhead > r.remaining()) {
    return DecodeInvalid(h, std::to_string(count) + " entries need at least " +
                                std::to_string(uint64_t{count} * pf::kStatEntryOverhead) +
                                " bytes, the body has " + std::to_string(r.remaining()) + " left");
  }
  StatReply reply;
  reply.state = static_cast<NodeState>(state);
  reply.entries.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    uint8_t key_length = 0;
    std::string_view key;
    StatEntry e;
    if (!r.Get(&key_length) || !r.GetBytes(key_length, &key) || !r.Get(&e.value)) {
      return DecodeInvalid(h, "entry " + std::to_string(i) + " of " + std::to_string(count) +
                                  " runs past the end of the body");
    }
    e.key = std::string(key);
    reply.entries.push_back(std::move(e));
  }
  if (r.remaining() != 0) {
    return DecodeInvalid(h, std::to_string(r.remaining()) + " bytes follow the last of " +
                                std::to_string(count) + " entries");
  }
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckStatReply(reply)));
  return ResponseMessage(std::move(reply));
}

Result<ResponseMessage> DecodeReadReply(const Frame& f, const ProtocolLimits& limits) {
  const FrameHeader& h = f.header;
  if (f.body.size() < pf::kReadReplyFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than READ_REPLY's fixed " +
                                std::to_string(pf::kReadReplyFixedSize));
  }
  ByteReader r(f.body);
  uint32_t count = 0, flags = 0;
  r.Get(&count);
  r.Get(&flags);
  GRANARY_RETURN_IF_ERROR(ExpectZero(h, flags, "flags"));
  if (count > limits.max_items) {
    return DecodeRange(h, std::to_string(count) + " items exceed the limit of " +
                              std::to_string(limits.max_items));
  }
  uint64_t items_size = uint64_t{pf::kReplyItemSize} * count;
  if (items_size > r.remaining()) {
    return DecodeInvalid(h, std::to_string(count) + " items need " +
                                std::to_string(pf::kReadReplyFixedSize + items_size) +
                                " body bytes, the body has " + std::to_string(f.body.size()));
  }
  struct Raw {
    uint16_t status, flags, message_length;
  };
  std::vector<Raw> raw(count);
  ReadReply reply;
  reply.items.resize(count);
  uint64_t messages = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint16_t reserved1 = 0;
    uint32_t reserved2 = 0;
    uint64_t checksum = 0;
    r.Get(&raw[i].status);
    r.Get(&raw[i].flags);
    r.Get(&raw[i].message_length);
    r.Get(&reserved1);
    r.Get(&reply.items[i].length);
    r.Get(&reserved2);
    r.Get(&checksum);
    std::string which = "item " + std::to_string(i);
    if (reserved1 != 0 || reserved2 != 0) {
      return DecodeInvalid(h, which + " has nonzero reserved fields");
    }
    if ((raw[i].flags & ~pf::kReplyItemHasChecksum) != 0) {
      return DecodeInvalid(h, which + " has unknown flags " + wire::Hex16(raw[i].flags));
    }
    if (raw[i].message_length > pf::kMaxItemMessageLength) {
      return DecodeRange(h, which + " has a message of " + std::to_string(raw[i].message_length) +
                                " bytes, more than " + std::to_string(pf::kMaxItemMessageLength));
    }
    if (raw[i].status == pf::kWireOk && raw[i].message_length != 0) {
      return DecodeInvalid(h, which + " is OK but carries a message");
    }
    if ((raw[i].flags & pf::kReplyItemHasChecksum) != 0) {
      reply.items[i].checksum = checksum;
    } else if (checksum != 0) {
      return DecodeInvalid(h, which + " has a checksum without its flag");
    }
    messages += raw[i].message_length;
  }
  if (r.remaining() != messages) {
    return DecodeInvalid(h, "the items' messages add up to " + std::to_string(messages) +
                                " bytes, the body has " + std::to_string(r.remaining()) +
                                " after the items");
  }
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view message;
    r.GetBytes(raw[i].message_length, &message);
    reply.items[i].status = StatusFromWire(raw[i].status, std::string(message));
  }
  GRANARY_RETURN_IF_ERROR(InContext(h, CheckReplyItems(reply, limits)));
  if (reply.PayloadBytes() != h.payload_length) {
    return DecodeInvalid(h, "the items' lengths add up to " + std::to_string(reply.PayloadBytes()) +
                                " bytes, the payload is " + std::to_string(h.payload_length));
  }
  return ResponseMessage(std::move(reply));
}

Result<ResponseMessage> DecodeErrorReply(const Frame& f) {
  const FrameHeader& h = f.header;
  if (f.body.size() < pf::kErrorFixedSize) {
    return DecodeInvalid(h, "body of " + std::to_string(f.body.size()) +
                                " bytes is shorter than ERROR's fixed " +
                                std::to_string(pf::kErrorFixedSize));
  }
  ByteReader r(f.body);
  uint16_t wire = 0, flags = 0;
  uint32_t length = 0;
  r.Get(&wire);
  r.Get(&flags);
  r.Get(&length);
  if ((flags & ~pf::kErrorClosing) != 0) {
    return DecodeInvalid(h, "unknown flags " + wire::Hex16(flags));
  }
  if (wire == pf::kWireOk) return DecodeInvalid(h, "an ERROR must not carry status OK");
  if (length > pf::kMaxErrorMessageLength) {
    return DecodeRange(h, "message of " + std::to_string(length) + " bytes exceeds " +
                              std::to_string(pf::kMaxErrorMessageLength));
  }
  GRANARY_RETURN_IF_ERROR(ExpectSize(h, size_t{pf::kErrorFixedSize} + length));
  std::string_view message;
  r.GetBytes(length, &message);
  ErrorReply error;
  error.status = StatusFromWire(wire, std::string(message));
  error.closing = (flags & pf::kErrorClosing) != 0;
  return ResponseMessage(std::move(error));
}

}  // namespace

// ---------------------------------------------------------------------------
// Decoding

Result<RequestMessage> DecodeRequest(const Frame& frame, const ProtocolLimits& limits) {
  const FrameHeader& h = frame.header;
  GRANARY_RETURN_IF_ERROR(CheckFrameShape(frame, /*request=*/true));
  if ((h.type & pf::kResponseBit) != 0) {
    return DecodeInvalid(h, "a server accepts requests only, this is a response type");
  }
  if (h.request_id == 0) {
    return DecodeInvalid(h,
                         "request id 0 is reserved for connection errors; number requests from 1");
  }
  switch (h.type) {
    case pf::kTypeHello:
      return DecodeHello(frame);
    case pf::kTypePing:
      GRANARY_RETURN_IF_ERROR(ExpectSize(h, 0));
      return RequestMessage(PingRequest{});
    case pf::kTypeStat:
      return DecodeStat(frame);
    case pf::kTypeRead:
      return DecodeRead(frame, limits);
    case pf::kTypeAuth:
      return DecodeAuth(frame);
    case pf::kTypeAuthProof:
      return DecodeAuthProof(frame);
    default:
      return DecodeInvalid(h, "unknown request type " + wire::Hex16(h.type) +
                                  "; the client may speak a newer protocol");
  }
}

Result<ResponseMessage> DecodeResponse(const Frame& frame, const ProtocolLimits& limits) {
  const FrameHeader& h = frame.header;
  GRANARY_RETURN_IF_ERROR(CheckFrameShape(frame, /*request=*/false));
  switch (h.type) {
    case pf::kTypeHelloReply:
      return DecodeHelloReply(frame);
    case pf::kTypePong:
      GRANARY_RETURN_IF_ERROR(ExpectSize(h, 0));
      return ResponseMessage(PongReply{});
    case pf::kTypeStatReply:
      return DecodeStatReply(frame);
    case pf::kTypeReadReply:
      return DecodeReadReply(frame, limits);
    case pf::kTypeError:
      return DecodeErrorReply(frame);
    case pf::kTypeAuthReply:
      return DecodeAuthReply(frame);
    case pf::kTypeAuthProofReply:
      return DecodeAuthProofReply(frame);
    default:
      if ((h.type & pf::kResponseBit) == 0) {
        return DecodeInvalid(h, "a client accepts responses only, this is a request type");
      }
      return DecodeInvalid(h, "unknown response type " + wire::Hex16(h.type) +
                                  "; the server may speak a newer protocol");
  }
}

}  // namespace granary

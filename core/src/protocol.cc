#include "granary/core/protocol.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "granary/core/byte_order.h"
#include "granary/core/file.h"
#include "granary/core/names.h"

namespace granary {
namespace {

namespace pf = protocol_format;

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

std::string Hex16(uint16_t v) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (int shift = 12; shift >= 0; shift -= 4) s += kHex[(v >> shift) & 0xf];
  return s;
}

// "READ frame (request id 7)", or "frame type 0x1234 (request id 7)".
std::string FrameWhat(const FrameHeader& h) {
  std::string_view name = MessageTypeName(h.type);
  std::string s =
      name == "unknown" ? "frame of type " + Hex16(h.type) : std::string(name) + " frame";
  return s + " (request id " + std::to_string(h.request_id) + ")";
}

Status DecodeInvalid(const FrameHeader& h, const std::string& what) {
  return Status::InvalidArgument("decode " + FrameWhat(h) + ": " + what);
}
Status DecodeRange(const FrameHeader& h, const std::string& what) {
  return Status::OutOfRange("decode " + FrameWhat(h) + ": " + what);
}

bool IsSpokenVersion(uint16_t v) { return v >= pf::kMinVersion && v <= pf::kMaxVersion; }

bool IsHandshakeType(uint16_t type) {
  return type == pf::kTypeHello || type == pf::kTypeHelloReply || type == pf::kTypeError;
}

std::string VersionRange() {
  return std::to_string(pf::kMinVersion) + ".." + std::to_string(pf::kMaxVersion);
}

// ---------------------------------------------------------------------------
// Field rules, shared by encoders and decoders so that whatever an encoder
// produces, a decoder with the same limits accepts.

Status CheckPeerName(std::string_view name) {
  if (name.empty() || name.size() > pf::kMaxPeerNameLength) {
    return Status::InvalidArgument("peer name " + Quoted(name) + " must be 1.." +
                                   std::to_string(pf::kMaxPeerNameLength) + " bytes long");
  }
  for (char c : name) {
    if (c < 0x21 || c > 0x7e) {
      return Status::InvalidArgument("peer name " + Quoted(name) +
                                     " may hold only graphic ASCII (no spaces or control bytes)");
    }
  }
  return Status::Ok();
}

Status CheckDatasetName(std::string_view name, bool allow_empty) {
  if (name.empty() && allow_empty) return Status::Ok();
  if (!IsDnsLabel(name)) {
    return Status::InvalidArgument(
        "dataset name " + Quoted(name) +
        " is not a DNS-1123 label (1..63 of [a-z0-9-], alphanumeric at both ends)");
  }
  return Status::Ok();
}

Status CheckStatRequest(const StatRequest& r) {
  GRANARY_RETURN_IF_ERROR(CheckDatasetName(r.dataset, /*allow_empty=*/true));
  if (r.dataset.empty() && !r.manifest_id.IsZero()) {
    return Status::InvalidArgument(
        "a node-wide STAT (no dataset) must have a zero manifest id, not " + r.manifest_id.ToHex());
  }
  return Status::Ok();
}

Status CheckReadRequest(const ReadRequest& r, const ProtocolLimits& limits) {
  if (r.items.size() > limits.max_items) {
    return Status::OutOfRange("READ of " + std::to_string(r.items.size()) +
                              " items exceeds the limit of " + std::to_string(limits.max_items) +
                              " items per request; split the batch");
  }
  if (r.items.empty()) return Status::InvalidArgument("READ has no items; send at least one");
  GRANARY_RETURN_IF_ERROR(CheckDatasetName(r.dataset, /*allow_empty=*/false));
  if (r.manifest_id.IsZero()) {
    return Status::InvalidArgument("READ of dataset " + Quoted(r.dataset) +
                                   " has a zero manifest id; name the snapshot to read from");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < r.items.size(); ++i) {
    const ReadItem& item = r.items[i];
    std::string which = "item " + std::to_string(i);
    if (item.kind != ReadKind::kSample && item.kind != ReadKind::kChunkRange) {
      return Status::InvalidArgument(which + " has unknown kind " +
                                     std::to_string(static_cast<uint16_t>(item.kind)) +
                                     " (1 = sample, 2 = chunk range)");
    }
    if (item.length == 0) {
      return Status::InvalidArgument(which + " is a zero-length read of id " +
                                     std::to_string(item.id) +
                                     "; ask for at least 1 byte (empty samples need no read)");
    }
    if (item.offset > std::numeric_limits<uint64_t>::max() - item.length) {
      return Status::OutOfRange(which + ": offset " + std::to_string(item.offset) + " + length " +
                                std::to_string(item.length) + " overflows 64 bits");
    }
    if (item.kind == ReadKind::kChunkRange && item.offset + item.length > pf::kMaxChunkRangeEnd) {
      return Status::OutOfRange(which + ": chunk " + std::to_string(item.id) + " range [" +
                                std::to_string(item.offset) + ", " +
                                std::to_string(item.offset + item.length) +
                                ") ends past the largest chunk payload (1 GiB)");
    }
    total += item.length;  // at most 2^16 items of < 2^32: no overflow
  }
  if (total > limits.max_read_bytes) {
    return Status::OutOfRange(
        "READ asks for " + std::to_string(total) + " bytes, more than the limit of " +
        std::to_string(limits.max_read_bytes) + " bytes per request; split the batch");
  }
  // The reply must fit max_message_bytes whatever its items' messages say.
  uint64_t reply = pf::kFrameHeaderSize + pf::MaxReadReplyBodySize(r.items.size()) + total;
  if (reply > limits.max_message_bytes) {
    return Status::OutOfRange(
        "READ of " + std::to_string(r.items.size()) + " items and " + std::to_string(total) +
        " bytes could get a reply of " + std::to_string(reply) + " bytes, more than the limit of " +
        std::to_string(limits.max_message_bytes) + " bytes per message; split the batch");
  }
  return Status::Ok();
}

Status CheckStatKey(std::string_view key) {
  bool ok = !key.empty() && key.size() <= pf::kMaxStatKeyLength;
  for (char c : key) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  if (!ok) {
    return Status::InvalidArgument("STAT key " + Quoted(key) + " must be 1.." +
                                   std::to_string(pf::kMaxStatKeyLength) + " of [a-z0-9_]");
  }
  return Status::Ok();
}

bool IsKnownNodeState(uint16_t v) {
  return v == pf::kNodeStarting || v == pf::kNodeServing || v == pf::kNodeDraining;
}

Status CheckStatReply(const StatReply& r) {
  if (!IsKnownNodeState(static_cast<uint16_t>(r.state))) {
    return Status::InvalidArgument("unknown node state " +
                                   std::to_string(static_cast<uint16_t>(r.state)) +
                                   " (1 = starting, 2 = serving, 3 = draining)");
  }
  if (r.entries.size() > pf::kMaxStatEntries) {
    return Status::OutOfRange(std::to_string(r.entries.size()) +
                              " STAT entries exceed the limit of " +
                              std::to_string(pf::kMaxStatEntries));
  }
  std::unordered_set<std::string_view> seen;
  for (const StatEntry& e : r.entries) {
    GRANARY_RETURN_IF_ERROR(CheckStatKey(e.key));
    if (!seen.insert(e.key).second) {
      return Status::InvalidArgument("STAT key " + Quoted(e.key) + " appears twice");
    }
  }
  return Status::Ok();
}

Status CheckReplyItems(const ReadReply& r, const ProtocolLimits& limits) {
  if (r.items.size() > limits.max_items) {
    return Status::OutOfRange("READ_REPLY of " + std::to_string(r.items.size()) +
                              " items exceeds the limit of " + std::to_string(limits.max_items));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < r.items.size(); ++i) {
    const ReadReplyItem& item = r.items[i];
    if (!item.status.ok() && (item.length != 0 || item.checksum.has_value())) {
      return Status::InvalidArgument("item " + std::to_string(i) + " failed (" +
                                     std::string(StatusCodeName(item.status.code())) +
                                     ") but has payload bytes or a checksum");
    }
    total += item.length;
  }
  if (total > limits.max_read_bytes) {
    return Status::OutOfRange("READ_REPLY carries " + std::to_string(total) +
                              " payload bytes, more than the limit of " +
                              std::to_string(limits.max_read_bytes));
  }
  return Status::Ok();
}

// A Status received from the peer. Unknown codes become kInternal, naming them.
Status StatusFromWire(uint16_t wire, std::string message) {
  std::optional<StatusCode> code = FromWireStatus(wire);
  if (!code.has_value()) {
    std::string m = "peer sent status code " + std::to_string(wire) + ", unknown to this build";
    if (!message.empty()) m += ": " + message;
    return Status(StatusCode::kInternal, std::move(m));
  }
  if (*code == StatusCode::kOk) return Status::Ok();
  return Status(*code, std::move(message));
}

std::string_view Cut(std::string_view s, size_t max) {
  return s.substr(0, std::min(s.size(), max));
}

// ---------------------------------------------------------------------------
// Encoding

void PutFrameHeader(ByteWriter* w, uint16_t version, uint16_t type, uint64_t request_id,
                    uint32_t body_length, uint64_t payload_length) {
  w->PutBytes(std::string_view(pf::kMagic, sizeof(pf::kMagic)));
  w->Put(version);
  w->Put(type);
  w->Put(uint32_t{0});
  w->Put(body_length);
  w->Put(payload_length);
  w->Put(request_id);
}

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
  std::string out;
  out.reserve(pf::kFrameHeaderSize + body.size());
  ByteWriter w(&out);
  PutFrameHeader(&w, version, type, request_id, static_cast<uint32_t>(body.size()), payload_length);
  w.PutBytes(body);
  return out;
}

void EncodeErrorBody(ByteWriter* w, const Status& status, bool closing) {
  std::string_view message = Cut(status.message(), pf::kMaxErrorMessageLength);
  w->Put(ToWireStatus(status.code()));
  w->Put(closing ? pf::kErrorClosing : uint16_t{0});
  w->Put(static_cast<uint32_t>(message.size()));
  w->PutBytes(message);
}

// ---------------------------------------------------------------------------
// Decoding

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

template <size_t N>
void PutArray(ByteWriter* w, const std::array<uint8_t, N>& a) {
  w->PutBytes(std::string_view(reinterpret_cast<const char*>(a.data()), N));
}

Status RequireAuthVersion(uint16_t version) {
  if (version < pf::kAuthVersion) {
    return Status::InvalidArgument("authentication needs protocol version " +
                                   std::to_string(pf::kAuthVersion) + ", the connection speaks " +
                                   std::to_string(version));
  }
  return Status::Ok();
}

Status CheckAuthRequest(const AuthRequest& a) {
  switch (a.method) {
    case AuthMethod::kClusterKey:
      if (a.credential.size() != pf::kAuthKeyIdSize) {
        return Status::InvalidArgument("a cluster-key AUTH carries the key's " +
                                       std::to_string(pf::kAuthKeyIdSize) + "-byte id, not " +
                                       std::to_string(a.credential.size()) + " bytes");
      }
      return Status::Ok();
    case AuthMethod::kKubernetesToken:
      if (a.credential.empty() || a.credential.size() > pf::kMaxTokenLength) {
        return Status::InvalidArgument(
            "a Kubernetes token of " + std::to_string(a.credential.size()) +
            " bytes; tokens are 1.." + std::to_string(pf::kMaxTokenLength) + " bytes");
      }
      for (char c : a.credential) {
        if (c <= ' ' || c > '~') {
          return Status::InvalidArgument(
              "the Kubernetes token holds a byte that is not graphic ASCII; send the token "
              "file's contents without its line end");
        }
      }
      return Status::Ok();
  }
  return Status::InvalidArgument("unknown authentication method " +
                                 std::to_string(static_cast<uint16_t>(a.method)) +
                                 "; this build knows 1 (cluster key) and 2 (Kubernetes token)");
}

Status CheckAuthScope(std::string_view scope) {
  if (scope.empty() || scope.size() > pf::kMaxAuthScopeLength) {
    return Status::InvalidArgument("an authentication scope of " + std::to_string(scope.size()) +
                                   " bytes; scopes are 1.." +
                                   std::to_string(pf::kMaxAuthScopeLength) + " bytes");
  }
  for (char c : scope) {
    if (c <= ' ' || c > '~') {
      return Status::InvalidArgument("the authentication scope holds a non-graphic byte");
    }
  }
  return Status::Ok();
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
      return DecodeInvalid(h, which + " has unknown flags " + Hex16(raw[i].flags));
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
    return DecodeInvalid(h, "unknown flags " + Hex16(flags));
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
                message = Cut(item.status.message(), pf::kMaxItemMessageLength);
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
  ByteWriter bw(&body);
  EncodeErrorBody(&bw, sent, closing);
  std::string out;
  ByteWriter w(&out);
  PutFrameHeader(&w, version, pf::kTypeError, request_id, static_cast<uint32_t>(body.size()), 0);
  w.PutBytes(body);
  return out;
}

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
      return DecodeInvalid(
          h, "unknown request type " + Hex16(h.type) + "; the client may speak a newer protocol");
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
      return DecodeInvalid(
          h, "unknown response type " + Hex16(h.type) + "; the server may speak a newer protocol");
  }
}

// ---------------------------------------------------------------------------
// FrameDecoder

FrameDecoder::FrameDecoder(FrameDirection direction, ProtocolLimits limits,
                           PayloadMode payload_mode)
    : direction_(direction), limits_(limits), payload_mode_(payload_mode) {
  Status s = limits_.Validate();
  if (!s.ok()) status_ = s.WithContext("frame decoder");
}

Status FrameDecoder::Fail(Status status) {
  status_ = std::move(status);
  return status_;
}

Status FrameDecoder::CheckHeader() {
  static const std::string kLimitAdvice =
      "; the peer ignores the limits (advertised in HELLO_REPLY): close the connection";
  static const std::string kShapeAdvice =
      "; the peer does not follow the protocol it negotiated: close the connection";
  const char* b = header_bytes_;
  if (std::memcmp(b + pf::kMagicOffset, pf::kMagic, sizeof(pf::kMagic)) != 0) {
    return Fail(Status::InvalidArgument(
        "read frame header: bad magic " +
        Quoted(std::string_view(b + pf::kMagicOffset, sizeof(pf::kMagic))) +
        " (expected 'GRNW'); the peer does not speak Granary's cache protocol or the stream "
        "lost its place: close the connection"));
  }
  FrameHeader& h = frame_.header;
  h.version = LoadLe<uint16_t>(b + pf::kVersionOffset);
  h.type = LoadLe<uint16_t>(b + pf::kTypeOffset);
  uint32_t flags = LoadLe<uint32_t>(b + pf::kFlagsOffset);
  h.body_length = LoadLe<uint32_t>(b + pf::kBodyLengthOffset);
  h.payload_length = LoadLe<uint64_t>(b + pf::kPayloadLengthOffset);
  h.request_id = LoadLe<uint64_t>(b + pf::kRequestIdOffset);

  bool handshake = h.version == pf::kHandshakeVersion && IsHandshakeType(h.type);
  bool version_ok = expected_version_.has_value() ? h.version == *expected_version_ || handshake
                                                  : IsSpokenVersion(h.version) || handshake;
  if (!version_ok) {
    std::string speaks = expected_version_.has_value() ? "the connection agreed on version " +
                                                             std::to_string(*expected_version_)
                                                       : "this build speaks " + VersionRange();
    return Fail(Status::VersionMismatch("read " + FrameWhat(h) + ": protocol version " +
                                        std::to_string(h.version) + " is not accepted (" + speaks +
                                        "); close the connection and reconnect with HELLO"));
  }
  if (flags != 0) {
    return Fail(Status::InvalidArgument("read " + FrameWhat(h) + ": reserved header flags are " +
                                        std::to_string(flags) + ", must be 0" + kShapeAdvice));
  }
  if (h.body_length > limits_.max_body_bytes) {
    return Fail(Status::OutOfRange("read " + FrameWhat(h) + ": body of " +
                                   std::to_string(h.body_length) + " bytes exceeds the limit of " +
                                   std::to_string(limits_.max_body_bytes) + " bytes" +
                                   kLimitAdvice));
  }
  if (h.payload_length != 0) {
    if (direction_ == FrameDirection::kRequests) {
      return Fail(Status::InvalidArgument(
          "read " + FrameWhat(h) + ": requests carry no payload, this one announces " +
          std::to_string(h.payload_length) + " bytes" + kShapeAdvice));
    }
    if (h.type != pf::kTypeReadReply) {
      return Fail(Status::InvalidArgument("read " + FrameWhat(h) +
                                          ": only READ_REPLY frames carry a payload, this one "
                                          "announces " +
                                          std::to_string(h.payload_length) + " bytes" +
                                          kShapeAdvice));
    }
    if (h.payload_length > limits_.max_read_bytes) {
      return Fail(
          Status::OutOfRange("read " + FrameWhat(h) + ": payload of " +
                             std::to_string(h.payload_length) + " bytes exceeds the limit of " +
                             std::to_string(limits_.max_read_bytes) + " bytes" + kLimitAdvice));
    }
  }
  // Both terms are within their (capped) limits above: the sum cannot overflow.
  uint64_t total = pf::kFrameHeaderSize + uint64_t{h.body_length} + h.payload_length;
  if (total > limits_.max_message_bytes) {
    return Fail(Status::OutOfRange("read " + FrameWhat(h) + ": frame of " + std::to_string(total) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(limits_.max_message_bytes) + " bytes" +
                                   kLimitAdvice));
  }
  return Status::Ok();
}

Result<size_t> FrameDecoder::Feed(std::string_view data) {
  if (!status_.ok()) return status_;
  if (has_frame_ || payload_remaining_ > 0) return size_t{0};
  size_t used = 0;
  while (!has_frame_) {
    if (stage_ == Stage::kHeader) {
      size_t n = std::min(data.size() - used, pf::kFrameHeaderSize - header_filled_);
      std::memcpy(header_bytes_ + header_filled_, data.data() + used, n);
      header_filled_ += n;
      used += n;
      if (header_filled_ < pf::kFrameHeaderSize) break;
      GRANARY_RETURN_IF_ERROR(CheckHeader());
      stage_ = Stage::kBody;
    }
    if (stage_ == Stage::kBody) {
      size_t want = frame_.header.body_length - frame_.body.size();
      size_t n = std::min(data.size() - used, want);
      if (n > 0) AppendWithin(&frame_.body, data.substr(used, n), frame_.header.body_length);
      used += n;
      if (frame_.body.size() < frame_.header.body_length) break;
      if (frame_.header.payload_length == 0 || payload_mode_ == PayloadMode::kDetached) {
        has_frame_ = true;
        break;
      }
      stage_ = Stage::kPayload;
    }
    if (stage_ == Stage::kPayload) {
      // payload_length <= max_read_bytes <= 1 GiB: fits a size_t.
      auto total = static_cast<size_t>(frame_.header.payload_length);
      size_t n = std::min(data.size() - used, total - frame_.payload.size());
      if (n > 0) AppendWithin(&frame_.payload, data.substr(used, n), total);
      used += n;
      if (frame_.payload.size() < total) break;
      has_frame_ = true;
    }
  }
  return used;
}

Frame FrameDecoder::TakeFrame() {
  assert(has_frame_ && "TakeFrame without a complete frame");
  Frame out = std::move(frame_);
  frame_ = Frame{};
  has_frame_ = false;
  stage_ = Stage::kHeader;
  header_filled_ = 0;
  if (payload_mode_ == PayloadMode::kDetached) payload_remaining_ = out.header.payload_length;
  return out;
}

uint64_t FrameDecoder::ConsumePayload(uint64_t n) {
  uint64_t used = std::min(n, payload_remaining_);
  payload_remaining_ -= used;
  return used;
}

Status FrameDecoder::Finish() const {
  if (!status_.ok()) return status_;
  auto cut = [](const std::string& what) {
    return Status::InvalidArgument("connection closed mid-frame: " + what +
                                   "; the peer stopped or the stream was truncated");
  };
  if (payload_remaining_ > 0) {
    return cut(std::to_string(payload_remaining_) +
               " payload bytes of the last READ_REPLY missing");
  }
  if (has_frame_) return Status::Ok();
  switch (stage_) {
    case Stage::kHeader:
      if (header_filled_ == 0) return Status::Ok();
      return cut("got " + std::to_string(header_filled_) + " of " +
                 std::to_string(pf::kFrameHeaderSize) + " header bytes");
    case Stage::kBody:
      return cut("got " + std::to_string(frame_.body.size()) + " of " +
                 std::to_string(frame_.header.body_length) + " body bytes of a " +
                 FrameWhat(frame_.header));
    case Stage::kPayload:
      return cut("got " + std::to_string(frame_.payload.size()) + " of " +
                 std::to_string(frame_.header.payload_length) + " payload bytes of a " +
                 FrameWhat(frame_.header));
  }
  return Status::Ok();
}

size_t FrameDecoder::buffered_bytes() const {
  return frame_.body.capacity() + frame_.payload.capacity();
}

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

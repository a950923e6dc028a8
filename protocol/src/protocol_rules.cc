// Field rules of the cache node protocol, shared by its encoders and decoders
// (protocol_rules.h).

#include "protocol_rules.h"

#include <limits>
#include <unordered_set>
#include <utility>

#include "granary/core/names.h"

namespace granary::protocol_internal {

namespace {
std::string DescribeWire(const wire::WireHeader& h) { return FrameWhat(FromWire(h)); }
}  // namespace

const wire::FrameFormat kFrameFormat = {
    .magic = {pf::kMagic[0], pf::kMagic[1], pf::kMagic[2], pf::kMagic[3]},
    .has_flags = true,
    .has_payload_length = true,
    .has_request_id = true,
    .frame_noun = "frame",
    .bad_magic_advice =
        "the peer does not speak Granary's cache protocol or the stream lost its place: close "
        "the connection",
    .connection_noun = "connection",
    .describe = &DescribeWire,
};
static_assert(pf::kFrameHeaderSize == 32 && pf::kBodyLengthOffset == 12 &&
              pf::kPayloadLengthOffset == 16 && pf::kRequestIdOffset == 24);

FrameHeader FromWire(const wire::WireHeader& h) {
  return FrameHeader{h.version, h.type, h.request_id, h.body_length, h.payload_length};
}

wire::WireHeader ToWire(const FrameHeader& h) {
  return wire::WireHeader{h.version, h.type, 0, h.body_length, h.payload_length, h.request_id};
}

std::string FrameWhat(const FrameHeader& h) {
  std::string_view name = MessageTypeName(h.type);
  return wire::DescribeFrame(name == "unknown" ? std::string_view() : name, h.type,
                             /*hex_types=*/true, /*has_request_id=*/true, h.request_id);
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

std::string VersionRange() { return wire::VersionRange(pf::kMinVersion, pf::kMaxVersion); }

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

namespace {

bool IsKnownNodeState(uint16_t v) {
  return v == pf::kNodeStarting || v == pf::kNodeServing || v == pf::kNodeDraining;
}

}  // namespace

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

}  // namespace granary::protocol_internal

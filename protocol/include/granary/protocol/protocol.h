#pragma once

// The cache node's wire protocol as a pure codec: typed messages, their
// encoders, and an incremental frame decoder. No sockets, no Asio: the bytes
// come from and go to whatever transport the caller has. The byte layout is in
// protocol_format.h; docs/protocol.md describes it byte by byte, with version
// negotiation and what a server does with each class of bad input.
//
// A connection carries frames: a 32-byte fixed header, a body (the message's
// headers: bounded by ProtocolLimits::max_body_bytes), and for READ_REPLY a
// payload (the requested bytes) after the body. Payloads are never mixed into
// the body: the encoder returns the header bytes and a list of payload pieces
// (memory spans or file ranges) so a server can writev/sendfile/preadv them, and
// later an RDMA transport can place them, without one copy into a big buffer.
//
// Who calls it:
//  - the cache node's server: a FrameDecoder(kRequests) per connection,
//    DecodeRequest on each frame, EncodeResponse/EncodeError for the answer;
//  - the sidecar's (and peer nodes') client: EncodeRequest, a
//    FrameDecoder(kResponses), DecodeResponse, CheckReadReply, SplitReadPayload;
//  - tests/fuzz/protocol_fuzz.cc.
//
// Errors: two classes, and the caller must tell them apart.
//  - Framing errors come from FrameDecoder (bad magic, unsupported version,
//    reserved flags, lengths over the limits, a stream cut mid-frame). The byte
//    stream can no longer be trusted: send an ERROR with kErrorClosing (best
//    effort) and close the connection. The decoder stays failed.
//  - Message errors come from DecodeRequest/DecodeResponse on a complete frame
//    (unknown type, counts that disagree with lengths, bad names, zero-length or
//    overflowing reads, too many items or bytes). The stream is still in step:
//    a server answers ERROR with the frame's request id and keeps serving.
// Codes: kInvalidArgument (malformed), kOutOfRange (a length, count or offset
// past a limit), kVersionMismatch (a version this build does not speak).
//
// Thread safety: the free functions are pure and may run on any thread. A
// FrameDecoder belongs to one connection and is used by one thread at a time.
// Message structs are values.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "granary/core/hash.h"
#include "granary/core/status.h"
#include "granary/protocol/protocol_format.h"
#include "granary/protocol/wire_frame.h"

namespace granary {

// ---------------------------------------------------------------------------
// Limits

// What a receiver accepts; checked from fixed-size fields before it buffers or
// allocates. Defaults are protocol_format's kDefault*; a caller may tighten any
// of them. A server advertises its limits in HELLO_REPLY; a client sizes its
// batches with CommonLimits(own, server's).
struct ProtocolLimits {
  uint32_t max_body_bytes = protocol_format::kDefaultMaxBodyBytes;  // body of any frame
  uint32_t max_items = protocol_format::kDefaultMaxItems;           // items in one READ
  uint64_t max_read_bytes = protocol_format::kDefaultMaxReadBytes;  // bytes one READ asks for
  // The whole frame (header + body + payload): the one number a transport
  // needs to bound a connection's receive buffer. At least header +
  // max_body_bytes. A READ is accepted only if its largest possible reply
  // (header, READ_REPLY body with full-length item messages, payload) fits, so
  // tightening this also bounds what one READ may ask for.
  uint64_t max_message_bytes = protocol_format::kDefaultMaxMessageBytes;

  // Nonzero, within the protocol_format caps, and consistent: max_body_bytes
  // holds a READ and its READ_REPLY of max_items items (and at least
  // kMinBodyBytes), max_message_bytes as above. kInvalidArgument naming the field.
  Status Validate() const;

  friend bool operator==(const ProtocolLimits&, const ProtocolLimits&) = default;
};

// The field-by-field minimum of two valid limits (itself valid).
ProtocolLimits CommonLimits(const ProtocolLimits& a, const ProtocolLimits& b);

// ---------------------------------------------------------------------------
// Messages

enum class MessageType : uint16_t {
  kHello = protocol_format::kTypeHello,
  kPing = protocol_format::kTypePing,
  kStat = protocol_format::kTypeStat,
  kRead = protocol_format::kTypeRead,
  kAuth = protocol_format::kTypeAuth,
  kAuthProof = protocol_format::kTypeAuthProof,
  kHelloReply = protocol_format::kTypeHelloReply,
  kPong = protocol_format::kTypePong,
  kStatReply = protocol_format::kTypeStatReply,
  kReadReply = protocol_format::kTypeReadReply,
  kAuthReply = protocol_format::kTypeAuthReply,
  kAuthProofReply = protocol_format::kTypeAuthProofReply,
  kError = protocol_format::kTypeError,
};

// "HELLO", "READ_REPLY", ..., or "unknown" for a value this build does not know.
std::string_view MessageTypeName(uint16_t type);

// Opens a connection: the client's version range and name.
struct HelloRequest {
  uint16_t min_version = protocol_format::kMinVersion;
  uint16_t max_version = protocol_format::kMaxVersion;
  std::string peer_name;  // 1..255 bytes of graphic ASCII, e.g. "sidecar/job-42@gpu-3"

  friend bool operator==(const HelloRequest&, const HelloRequest&) = default;
};

// Liveness: answered by PongReply.
struct PingRequest {
  friend bool operator==(const PingRequest&, const PingRequest&) = default;
};

// Health and counters: of the whole node (dataset empty, manifest_id zero) or
// of one dataset (manifest_id zero: whichever manifest the node serves).
struct StatRequest {
  std::string dataset;
  ContentId manifest_id;

  friend bool operator==(const StatRequest&, const StatRequest&) = default;
};

enum class ReadKind : uint16_t {
  kSample = protocol_format::kReadKindSample,          // id: SampleId; offset within the sample
  kChunkRange = protocol_format::kReadKindChunkRange,  // id: ChunkId; offset within its payload
};

// One range to read: bytes [offset, offset + length) of a sample or a chunk.
// A range of a large sample is how a client reads it in pieces.
struct ReadItem {
  ReadKind kind = ReadKind::kSample;
  uint32_t id = 0;
  uint64_t offset = 0;
  uint32_t length = 0;  // at least 1

  friend bool operator==(const ReadItem&, const ReadItem&) = default;
};

// A batch of reads from one dataset snapshot, answered in one READ_REPLY.
struct ReadRequest {
  std::string dataset;    // DNS-1123 label
  ContentId manifest_id;  // not zero
  std::vector<ReadItem> items;

  // Sum of the items' lengths: what the reply's payload will hold at most.
  uint64_t RequestedBytes() const;

  friend bool operator==(const ReadRequest&, const ReadRequest&) = default;
};

// Authentication (version 2; docs/protocol.md, "Authentication"; the proofs
// are computed by peer_auth.h). Bytes of nonces and proofs are raw.
enum class AuthMethod : uint16_t {
  kClusterKey = protocol_format::kAuthMethodClusterKey,
  kKubernetesToken = protocol_format::kAuthMethodKubernetesToken,
};
using AuthNonce = std::array<uint8_t, protocol_format::kAuthNonceSize>;
using AuthProof = std::array<uint8_t, protocol_format::kAuthProofSize>;

// Opens authentication: the method, a fresh client nonce, and the credential
// (cluster key: the key's 8-byte id; Kubernetes: the token).
struct AuthRequest {
  AuthMethod method = AuthMethod::kClusterKey;
  AuthNonce client_nonce{};
  std::string credential;

  friend bool operator==(const AuthRequest&, const AuthRequest&) = default;
};

// The client's answer to the server's challenge (cluster key only).
struct AuthProofRequest {
  AuthProof proof{};

  friend bool operator==(const AuthProofRequest&, const AuthProofRequest&) = default;
};

using RequestMessage = std::variant<HelloRequest, PingRequest, StatRequest, ReadRequest,
                                    AuthRequest, AuthProofRequest>;

// The server's answer to HELLO: the version both will speak from now on, the
// server's name, and the limits it enforces.
struct HelloReply {
  uint16_t version = protocol_format::kMaxVersion;
  std::string peer_name;  // as in HelloRequest
  ProtocolLimits limits;
  // Version 2 and later: the client must authenticate before STAT or READ.
  bool auth_required = false;

  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

struct PongReply {
  friend bool operator==(const PongReply&, const PongReply&) = default;
};

enum class NodeState : uint16_t {
  kStarting = protocol_format::kNodeStarting,
  kServing = protocol_format::kNodeServing,
  kDraining = protocol_format::kNodeDraining,
};

// A named counter or gauge: key is 1..63 of [a-z0-9_], e.g. "staged_bytes".
struct StatEntry {
  std::string key;
  uint64_t value = 0;

  friend bool operator==(const StatEntry&, const StatEntry&) = default;
};

struct StatReply {
  NodeState state = NodeState::kServing;
  std::vector<StatEntry> entries;  // at most kMaxStatEntries, keys unique

  friend bool operator==(const StatReply&, const StatReply&) = default;
};

// One item's outcome. OK: `length` bytes are in the payload (equal to the
// requested length), with their XXH3-64 if the server had it. Not OK: no bytes;
// the status says why (message cut to kMaxItemMessageLength bytes on the wire).
struct ReadReplyItem {
  Status status;
  uint32_t length = 0;
  std::optional<uint64_t> checksum;

  friend bool operator==(const ReadReplyItem&, const ReadReplyItem&) = default;
};

// Items in request order. The bytes are not here: they are the frame's payload
// (Frame::payload, or read by the caller in PayloadMode::kDetached), the OK
// items' bytes concatenated in item order.
struct ReadReply {
  std::vector<ReadReplyItem> items;

  uint64_t PayloadBytes() const;  // sum of the items' lengths

  friend bool operator==(const ReadReply&, const ReadReply&) = default;
};

// A request failed as a whole, or the connection is failing (request id 0 when
// no request is to blame). `closing`: the sender closes the connection after it.
struct ErrorReply {
  Status status;  // never OK
  bool closing = false;

  friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

// The answer to AUTH: a challenge (cluster key: the server's nonce and its
// proof that it holds the key too) or, for a token, granted with its scope.
struct AuthReply {
  bool granted = false;
  AuthNonce server_nonce{};  // zero when granted
  AuthProof server_proof{};  // zero when granted
  std::string scope;         // granted only: "cluster" or "namespace/<name>"

  friend bool operator==(const AuthReply&, const AuthReply&) = default;
};

// The answer to AUTH_PROOF: granted, with its scope.
struct AuthProofReply {
  std::string scope;

  friend bool operator==(const AuthProofReply&, const AuthProofReply&) = default;
};

using ResponseMessage = std::variant<HelloReply, PongReply, StatReply, ReadReply, ErrorReply,
                                     AuthReply, AuthProofReply>;

// The numeric code on the wire for a status code, and back. An unknown wire
// value maps to kInternal (the decoders put the number in the message).
uint16_t ToWireStatus(StatusCode code);
std::optional<StatusCode> FromWireStatus(uint16_t wire);

// The version a server speaking [server_min, server_max] chooses for a client's
// HELLO: the highest both speak. kVersionMismatch naming both ranges when there
// is none, kInvalidArgument when the client's range is empty or has version 0.
Result<uint16_t> NegotiateVersion(const HelloRequest& hello,
                                  uint16_t server_min = protocol_format::kMinVersion,
                                  uint16_t server_max = protocol_format::kMaxVersion);

// Whether `reply` answers `request`: as many items, each OK item exactly as long
// as asked. kInvalidArgument naming the first item that is not.
Status CheckReadReply(const ReadRequest& request, const ReadReply& reply);

// Each item's bytes within a READ_REPLY's payload (empty for failed items).
// kInvalidArgument if the payload is not exactly ReadReply::PayloadBytes() long.
Result<std::vector<std::string_view>> SplitReadPayload(const ReadReply& reply,
                                                       std::string_view payload);

// ---------------------------------------------------------------------------
// Frames

// The fixed header of a frame, decoded. `type` is the raw value: the frame
// layer passes types it does not know, DecodeRequest/DecodeResponse reject them.
struct FrameHeader {
  uint16_t version = protocol_format::kMaxVersion;
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint32_t body_length = 0;
  uint64_t payload_length = 0;

  friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// A complete frame as received.
struct Frame {
  FrameHeader header;
  std::string body;     // body_length bytes
  std::string payload;  // payload_length bytes, or empty in PayloadMode::kDetached

  friend bool operator==(const Frame&, const Frame&) = default;
};

// `length` bytes of an open file from `offset` (for sendfile/preadv). The fd
// is borrowed: it must stay open until the frame is sent.
struct FileRange {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;

  friend bool operator==(const FileRange&, const FileRange&) = default;
};

// One piece of a payload: borrowed memory (must outlive the send) or a file range.
using PayloadPiece = std::variant<std::string_view, FileRange>;
uint64_t PieceSize(const PayloadPiece& piece);

// An encoded frame ready to send: first `header` (fixed header + body), then
// the payload pieces in order; their sizes add up to the header's payload_length.
struct OutgoingFrame {
  std::string header;
  std::vector<PayloadPiece> payload;

  uint64_t payload_length() const;
};

// The whole frame as one string, reading file pieces with pread. For tests
// and small transports; a server sends the pieces instead.
Result<std::string> Flatten(const OutgoingFrame& frame);

struct EncodeOptions {
  // The negotiated version. HELLO and HELLO_REPLY are always sent as
  // kHandshakeVersion whatever this says.
  uint16_t version = protocol_format::kMaxVersion;
  // The receiver's limits: an encoder refuses to produce a frame they reject.
  ProtocolLimits limits;
};

// Encodes a request. Fails (kInvalidArgument / kOutOfRange, as the receiver
// would) on anything the receiver would reject: bad names, zero-length reads,
// too many items or bytes, request id 0, an unsupported version.
Result<std::string> EncodeRequest(uint64_t request_id, const RequestMessage& request,
                                  const EncodeOptions& options = {});

// Encodes a response. `payload` is only for ReadReply: pieces whose sizes add
// up to ReadReply::PayloadBytes(). Item and error messages longer than the
// wire allows are cut (protocol_format::kMaxItemMessageLength,
// kMaxErrorMessageLength); everything else the receiver would reject fails.
Result<OutgoingFrame> EncodeResponse(uint64_t request_id, const ResponseMessage& response,
                                     std::vector<PayloadPiece> payload = {},
                                     const EncodeOptions& options = {});

// An ERROR frame, for the server's error paths: cannot fail. An OK status is
// sent as kInternal (a bug on the sender's side). Use version kHandshakeVersion
// before a version is negotiated.
std::string EncodeError(uint64_t request_id, const Status& status, bool closing,
                        uint16_t version = protocol_format::kHandshakeVersion);

// Decodes the message in a complete frame (see "Errors" above). DecodeRequest
// accepts request types only, DecodeResponse response types only. `limits` are
// the receiver's own: DecodeRequest enforces max_items and max_read_bytes.
Result<RequestMessage> DecodeRequest(const Frame& frame, const ProtocolLimits& limits = {});
Result<ResponseMessage> DecodeResponse(const Frame& frame, const ProtocolLimits& limits = {});

// Which side of a connection a decoder is on.
enum class FrameDirection {
  kRequests,   // server side: frames carry requests; no payloads
  kResponses,  // client side: READ_REPLY frames carry payloads up to max_read_bytes
};

enum class PayloadMode {
  kBuffered,  // Frame::payload holds the payload
  kDetached,  // the frame is ready after its body; the caller takes the payload
              // bytes itself (e.g. straight into shared memory): see ConsumePayload
};

// Splits a byte stream into frames (the shared wire::FrameReader under this
// protocol's header rules). Feed it bytes as they arrive, split
// anywhere; it holds at most one frame, never more than the limits allow, and
// grows its buffers only as bytes actually arrive (a header announcing a large
// body costs nothing until the body comes). After an error it stays failed:
// close the connection.
//
//   FrameDecoder decoder(FrameDirection::kRequests, limits);
//   while (data not empty) {
//     GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(data));
//     data.remove_prefix(used);
//     if (decoder.has_frame()) Handle(decoder.TakeFrame());
//   }
class FrameDecoder {
 public:
  // `limits` must be valid (ProtocolLimits::Validate); invalid limits make the
  // decoder fail on first use with that error.
  explicit FrameDecoder(FrameDirection direction, ProtocolLimits limits = {},
                        PayloadMode payload_mode = PayloadMode::kBuffered);

  // Consumes bytes from the front of `data` until a frame is complete or the
  // bytes run out; returns how many it consumed. While a frame waits to be
  // taken, or a detached payload is outstanding, it consumes nothing.
  Result<size_t> Feed(std::string_view data);

  bool has_frame() const { return reader_.has_frame(); }
  // The complete frame (has_frame() must be true); the decoder moves on.
  Frame TakeFrame();

  // After TakeFrame() in kDetached mode: payload bytes of that frame still to
  // come. The caller takes them from the stream itself and reports how many
  // with ConsumePayload(n), which returns the part of n that was payload
  // (min(n, payload_remaining())).
  uint64_t payload_remaining() const { return reader_.payload_remaining(); }
  uint64_t ConsumePayload(uint64_t n) { return reader_.ConsumePayload(n); }

  // Only frames of this version are accepted from now on (HELLO, HELLO_REPLY
  // and ERROR still also as kHandshakeVersion). Call after negotiation.
  void ExpectVersion(uint16_t version) { expected_version_ = version; }

  // The end of the stream: OK between frames; else kInvalidArgument saying
  // where the stream was cut (e.g. "12 of 32 header bytes").
  Status Finish() const;

  // The sticky error, or OK.
  const Status& status() const { return reader_.status(); }
  // Bytes of the current partial frame held in memory.
  size_t buffered_bytes() const { return reader_.buffered_bytes(); }

 private:
  // The header rules of this protocol (version, flags, limits, payloads),
  // applied by the shared frame layer before it buffers a body.
  Status CheckHeader(const wire::WireHeader& header) const;

  FrameDirection direction_;
  ProtocolLimits limits_;
  std::optional<uint16_t> expected_version_;
  wire::FrameReader reader_;
};

// Decodes exactly one frame that spans all of `bytes` (tests, fuzzers, callers
// that already hold a whole message). Trailing bytes are kInvalidArgument.
Result<Frame> DecodeFrame(std::string_view bytes, FrameDirection direction,
                          const ProtocolLimits& limits = {});

}  // namespace granary

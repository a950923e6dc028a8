#pragma once

// Byte layout of the cache node's wire protocol (versions 1 and 2): the frames that
// sidecars and peer cache nodes exchange with a cache node over TCP (and, later,
// RDMA). docs/protocol.md describes every field, the limits, version
// negotiation and how a server answers bad input; protocol.h encodes and decodes
// it. The fixed header is the shared one of wire_frame.h with every optional
// field. Changing any value here changes the protocol: bump kMaxVersion and
// keep speaking the old one.
//
//   frame := fixed header (32 bytes) + body (body_length bytes)
//                                    + payload (payload_length bytes)
//   fixed header:
//     0   magic           4 bytes  "GRNW"
//     4   version         u16      protocol version of this frame
//     6   type            u16      kType* below
//     8   flags           u32      0 (reserved; a receiver rejects other values)
//    12   body_length     u32      bytes of the body that follows
//    16   payload_length  u64      bytes of payload after the body (READ_REPLY only)
//    24   request_id      u64      chosen by the client, echoed by the response
//
// Bodies (all offsets from the start of the body):
//   HELLO        0 min_version u16, 2 max_version u16, 4 flags u32 (0),
//                8 name_length u16, 10 reserved u16 (0), 12 peer name
//   HELLO_REPLY  0 version u16, 2 reserved u16 (0), 4 flags u32 (0 in version 1;
//                kHelloReplyAuthRequired in version 2),
//                8 max_body_bytes u32, 12 max_items u32, 16 max_read_bytes u64,
//                24 max_message_bytes u64, 32 name_length u16, 34 reserved u16 (0),
//                36 peer name
//   PING, PONG   empty
//   AUTH         (version 2) 0 method u16, 2 flags u16 (0), 4 credential_length u32,
//                8 client_nonce 32 bytes, 40 credential
//   AUTH_REPLY   (version 2) 0 granted u16 (0: a challenge follows, 1: granted),
//                2 reserved u16 (0), 4 scope_length u32, 8 server_nonce 32 bytes,
//                40 server_proof 32 bytes, 72 scope
//   AUTH_PROOF   (version 2) 0 client_proof 32 bytes
//   AUTH_PROOF_REPLY (version 2) 0 reserved u32 (0), 4 scope_length u32, 8 scope
//   STAT         0 dataset 64 bytes (NUL-padded, may be empty), 64 manifest_id 16 bytes,
//                80 flags u32 (0)
//   STAT_REPLY   0 state u16, 2 reserved u16 (0), 4 entry_count u32, 8 entries:
//                key_length u8, key, value u64 (each entry 9 + key_length bytes)
//   READ         0 dataset 64 bytes (NUL-padded), 64 manifest_id 16 bytes,
//                80 item_count u32, 84 flags u32 (0), 88 items (24 bytes each):
//                  0 kind u16, 2 flags u16 (0), 4 id u32, 8 offset u64,
//                  16 length u32, 20 reserved u32 (0)
//   READ_REPLY   0 item_count u32, 4 flags u32 (0), 8 items (24 bytes each):
//                  0 status u16, 2 flags u16, 4 message_length u16, 6 reserved u16 (0),
//                  8 length u32, 12 reserved u32 (0), 16 checksum u64
//                then the items' messages, concatenated in item order;
//                the payload is the OK items' bytes, concatenated in item order
//   ERROR        0 status u16, 2 flags u16, 4 message_length u32, 8 message
//
// Every integer is little-endian. A manifest id is ContentId::ToBytes (low half,
// then high half).
//
// Thread safety: constants only.

#include <cstdint>

#include "granary/core/status.h"

namespace granary::protocol_format {

inline constexpr char kMagic[4] = {'G', 'R', 'N', 'W'};

// The versions this build speaks. The fixed header and the HELLO, HELLO_REPLY
// and ERROR bodies are frozen in every version, so any two builds can negotiate.
inline constexpr uint16_t kMinVersion = 1;
inline constexpr uint16_t kMaxVersion = 2;
// Version 2 adds authentication (AUTH, AUTH_PROOF and their replies,
// kHelloReplyAuthRequired); nothing else changed. A node that requires
// authentication refuses a client that speaks only version 1.
inline constexpr uint16_t kAuthVersion = 2;
// HELLO, HELLO_REPLY and an ERROR sent before a version is agreed always carry
// this version in their fixed header, whatever versions the peers speak.
inline constexpr uint16_t kHandshakeVersion = 1;

// Fixed frame header.
inline constexpr uint32_t kMagicOffset = 0;           // 4 bytes
inline constexpr uint32_t kVersionOffset = 4;         // u16
inline constexpr uint32_t kTypeOffset = 6;            // u16
inline constexpr uint32_t kFlagsOffset = 8;           // u32, zero in version 1
inline constexpr uint32_t kBodyLengthOffset = 12;     // u32
inline constexpr uint32_t kPayloadLengthOffset = 16;  // u64
inline constexpr uint32_t kRequestIdOffset = 24;      // u64
inline constexpr uint32_t kFrameHeaderSize = 32;

// Message types. Responses have kResponseBit set; a reply's type is its
// request's type | kResponseBit. ERROR answers any request.
inline constexpr uint16_t kResponseBit = 0x8000;
inline constexpr uint16_t kTypeHello = 0x0001;
inline constexpr uint16_t kTypePing = 0x0002;
inline constexpr uint16_t kTypeStat = 0x0003;
inline constexpr uint16_t kTypeRead = 0x0004;
inline constexpr uint16_t kTypeAuth = 0x0005;       // version 2
inline constexpr uint16_t kTypeAuthProof = 0x0006;  // version 2
inline constexpr uint16_t kTypeHelloReply = kResponseBit | kTypeHello;
inline constexpr uint16_t kTypePong = kResponseBit | kTypePing;
inline constexpr uint16_t kTypeStatReply = kResponseBit | kTypeStat;
inline constexpr uint16_t kTypeReadReply = kResponseBit | kTypeRead;
inline constexpr uint16_t kTypeAuthReply = kResponseBit | kTypeAuth;
inline constexpr uint16_t kTypeAuthProofReply = kResponseBit | kTypeAuthProof;
inline constexpr uint16_t kTypeError = 0x80FF;

// HELLO body.
inline constexpr uint32_t kHelloMinVersionOffset = 0;  // u16
inline constexpr uint32_t kHelloMaxVersionOffset = 2;  // u16
inline constexpr uint32_t kHelloFlagsOffset = 4;       // u32, zero
inline constexpr uint32_t kHelloNameLengthOffset = 8;  // u16
inline constexpr uint32_t kHelloReservedOffset = 10;   // u16, zero
inline constexpr uint32_t kHelloFixedSize = 12;        // the name follows

// HELLO_REPLY body.
inline constexpr uint32_t kHelloReplyVersionOffset = 0;        // u16
inline constexpr uint32_t kHelloReplyReservedOffset = 2;       // u16, zero
inline constexpr uint32_t kHelloReplyFlagsOffset = 4;          // u32, zero
inline constexpr uint32_t kHelloReplyMaxBodyOffset = 8;        // u32
inline constexpr uint32_t kHelloReplyMaxItemsOffset = 12;      // u32
inline constexpr uint32_t kHelloReplyMaxReadOffset = 16;       // u64
inline constexpr uint32_t kHelloReplyMaxMessageOffset = 24;    // u64
inline constexpr uint32_t kHelloReplyNameLengthOffset = 32;    // u16
inline constexpr uint32_t kHelloReplyNameReservedOffset = 34;  // u16, zero
inline constexpr uint32_t kHelloReplyFixedSize = 36;           // the name follows
// HELLO_REPLY flags (version 2): the client must authenticate (AUTH) before
// anything but PING.
inline constexpr uint32_t kHelloReplyAuthRequired = 0x0001;
inline constexpr uint32_t kMaxPeerNameLength = 255;  // bytes, graphic ASCII

// AUTH body (version 2).
inline constexpr uint32_t kAuthMethodOffset = 0;            // u16 kAuthMethod*
inline constexpr uint32_t kAuthFlagsOffset = 2;             // u16, zero
inline constexpr uint32_t kAuthCredentialLengthOffset = 4;  // u32
inline constexpr uint32_t kAuthClientNonceOffset = 8;       // kAuthNonceSize bytes
inline constexpr uint32_t kAuthFixedSize = 40;              // the credential follows
inline constexpr uint32_t kAuthNonceSize = 32;
inline constexpr uint32_t kAuthProofSize = 32;  // HMAC-SHA256
// Methods. Cluster key: the credential is the key's 8-byte id (KeyId in
// peer_auth.h); the server answers with a challenge. Kubernetes token: the
// credential is a ServiceAccount token (a JWT, 1..kMaxTokenLength bytes); the
// server answers granted or ERROR.
inline constexpr uint16_t kAuthMethodClusterKey = 1;
inline constexpr uint16_t kAuthMethodKubernetesToken = 2;
inline constexpr uint32_t kAuthKeyIdSize = 8;
inline constexpr uint32_t kMaxTokenLength = 16u << 10;

// AUTH_REPLY body (version 2).
inline constexpr uint32_t kAuthReplyGrantedOffset = 0;       // u16: 0 challenge, 1 granted
inline constexpr uint32_t kAuthReplyReservedOffset = 2;      // u16, zero
inline constexpr uint32_t kAuthReplyScopeLengthOffset = 4;   // u32
inline constexpr uint32_t kAuthReplyServerNonceOffset = 8;   // kAuthNonceSize bytes
inline constexpr uint32_t kAuthReplyServerProofOffset = 40;  // kAuthProofSize bytes
inline constexpr uint32_t kAuthReplyFixedSize = 72;          // the scope follows
// A granted scope: "cluster" or "namespace/<name>" (at most this long).
inline constexpr uint32_t kMaxAuthScopeLength = 128;

// AUTH_PROOF body (version 2): the client's proof, nothing else.
inline constexpr uint32_t kAuthProofRequestSize = kAuthProofSize;

// AUTH_PROOF_REPLY body (version 2).
inline constexpr uint32_t kAuthProofReplyReservedOffset = 0;     // u32, zero
inline constexpr uint32_t kAuthProofReplyScopeLengthOffset = 4;  // u32
inline constexpr uint32_t kAuthProofReplyFixedSize = 8;          // the scope follows

// Dataset field of STAT and READ: a DNS-1123 label, NUL-padded; at least one NUL.
inline constexpr uint32_t kDatasetFieldSize = 64;
inline constexpr uint32_t kManifestIdSize = 16;

// STAT body.
inline constexpr uint32_t kStatDatasetOffset = 0;      // 64 bytes
inline constexpr uint32_t kStatManifestIdOffset = 64;  // 16 bytes
inline constexpr uint32_t kStatFlagsOffset = 80;       // u32, zero
inline constexpr uint32_t kStatRequestSize = 84;

// STAT_REPLY body.
inline constexpr uint32_t kStatReplyStateOffset = 0;       // u16
inline constexpr uint32_t kStatReplyReservedOffset = 2;    // u16, zero
inline constexpr uint32_t kStatReplyEntryCountOffset = 4;  // u32
inline constexpr uint32_t kStatReplyFixedSize = 8;         // the entries follow
inline constexpr uint32_t kStatEntryOverhead = 9;          // key_length u8 + value u64
inline constexpr uint32_t kMaxStatEntries = 256;
inline constexpr uint32_t kMaxStatKeyLength = 63;  // [a-z0-9_]

// Node states in STAT_REPLY.
inline constexpr uint16_t kNodeStarting = 1;  // scanning its chunk store; not serving yet
inline constexpr uint16_t kNodeServing = 2;
inline constexpr uint16_t kNodeDraining = 3;  // shutting down: finishing in-flight requests

// READ body.
inline constexpr uint32_t kReadDatasetOffset = 0;      // 64 bytes
inline constexpr uint32_t kReadManifestIdOffset = 64;  // 16 bytes
inline constexpr uint32_t kReadItemCountOffset = 80;   // u32
inline constexpr uint32_t kReadFlagsOffset = 84;       // u32, zero
inline constexpr uint32_t kReadFixedSize = 88;         // the items follow

// One READ item.
inline constexpr uint32_t kReadItemKindOffset = 0;       // u16
inline constexpr uint32_t kReadItemFlagsOffset = 2;      // u16, zero
inline constexpr uint32_t kReadItemIdOffset = 4;         // u32 sample or chunk id
inline constexpr uint32_t kReadItemOffsetOffset = 8;     // u64 byte offset in the sample/chunk
inline constexpr uint32_t kReadItemLengthOffset = 16;    // u32 bytes, at least 1
inline constexpr uint32_t kReadItemReservedOffset = 20;  // u32, zero
inline constexpr uint32_t kReadItemSize = 24;
inline constexpr uint16_t kReadKindSample = 1;      // id is a SampleId; offset within the sample
inline constexpr uint16_t kReadKindChunkRange = 2;  // id is a ChunkId; offset within its payload
// A chunk payload is at most 1 GiB (kMaxChunkSize in manifest.h): a chunk range
// ending past it is out of range whatever the chunk.
inline constexpr uint64_t kMaxChunkRangeEnd = 1ull << 30;

// READ_REPLY body.
inline constexpr uint32_t kReadReplyItemCountOffset = 0;  // u32
inline constexpr uint32_t kReadReplyFlagsOffset = 4;      // u32, zero
inline constexpr uint32_t kReadReplyFixedSize = 8;        // the items follow

// One READ_REPLY item.
inline constexpr uint32_t kReplyItemStatusOffset = 0;         // u16 wire status code
inline constexpr uint32_t kReplyItemFlagsOffset = 2;          // u16
inline constexpr uint32_t kReplyItemMessageLengthOffset = 4;  // u16
inline constexpr uint32_t kReplyItemReserved1Offset = 6;      // u16, zero
inline constexpr uint32_t kReplyItemLengthOffset = 8;         // u32 payload bytes
inline constexpr uint32_t kReplyItemReserved2Offset = 12;     // u32, zero
inline constexpr uint32_t kReplyItemChecksumOffset = 16;      // u64
inline constexpr uint32_t kReplyItemSize = 24;
inline constexpr uint16_t kReplyItemHasChecksum = 0x0001;  // checksum = XXH3-64 of the item's bytes
// An item's message is cut to this many bytes by the encoder, so the reply to
// any request that fits the limits fits them too.
inline constexpr uint32_t kMaxItemMessageLength = 192;

// ERROR body.
inline constexpr uint32_t kErrorStatusOffset = 0;         // u16 wire status code, not 0
inline constexpr uint32_t kErrorFlagsOffset = 2;          // u16
inline constexpr uint32_t kErrorMessageLengthOffset = 4;  // u32
inline constexpr uint32_t kErrorFixedSize = 8;            // the message follows
inline constexpr uint16_t kErrorClosing = 0x0001;  // the sender closes the connection after it
inline constexpr uint32_t kMaxErrorMessageLength = 4096;  // longer messages are cut

// Limits: defaults, and the caps a ProtocolLimits may not exceed. A receiver
// checks them from the fixed header (body and payload) and fixed body fields
// (item and entry counts) before it buffers or allocates anything.
inline constexpr uint32_t kDefaultMaxBodyBytes = 1u << 20;     // 1 MiB
inline constexpr uint32_t kDefaultMaxItems = 4096;             // per READ
inline constexpr uint64_t kDefaultMaxReadBytes = 64ull << 20;  // requested bytes per READ
inline constexpr uint64_t kDefaultMaxMessageBytes =
    kFrameHeaderSize + uint64_t{kDefaultMaxBodyBytes} + kDefaultMaxReadBytes;
inline constexpr uint32_t kMaxBodyBytesCap = 16u << 20;  // 16 MiB
inline constexpr uint32_t kMaxItemsCap = 65536;
inline constexpr uint64_t kMaxReadBytesCap = 1ull << 30;  // 1 GiB
inline constexpr uint64_t kMaxMessageBytesCap =
    kFrameHeaderSize + uint64_t{kMaxBodyBytesCap} + kMaxReadBytesCap;
// A body limit below this could not carry a full STAT_REPLY or ERROR.
inline constexpr uint32_t kMinBodyBytes = 32u << 10;  // 32 KiB

// The largest body a READ or READ_REPLY of `items` items can have.
constexpr uint64_t MaxReadBodySize(uint64_t items) {
  return kReadFixedSize + uint64_t{kReadItemSize} * items;
}
constexpr uint64_t MaxReadReplyBodySize(uint64_t items) {
  return kReadReplyFixedSize + uint64_t{kReplyItemSize + kMaxItemMessageLength} * items;
}

// Wire status codes: the numeric values of granary::StatusCode, frozen here.
// A receiver maps a value it does not know to kInternal, naming the number.
inline constexpr uint16_t kWireOk = 0;
inline constexpr uint16_t kWireInvalidArgument = 1;
inline constexpr uint16_t kWireNotFound = 2;
inline constexpr uint16_t kWireAlreadyExists = 3;
inline constexpr uint16_t kWireFailedPrecondition = 4;
inline constexpr uint16_t kWireOutOfRange = 5;
inline constexpr uint16_t kWireCorruption = 6;
inline constexpr uint16_t kWireVersionMismatch = 7;
inline constexpr uint16_t kWireIoError = 8;
inline constexpr uint16_t kWirePermissionDenied = 9;
inline constexpr uint16_t kWireResourceExhausted = 10;
inline constexpr uint16_t kWireUnavailable = 11;
inline constexpr uint16_t kWireDeadlineExceeded = 12;
inline constexpr uint16_t kWireInternal = 13;
inline constexpr uint16_t kWireMaxKnown = kWireInternal;

// Reordering StatusCode would silently change the wire: fail the build instead.
static_assert(static_cast<int>(StatusCode::kOk) == kWireOk);
static_assert(static_cast<int>(StatusCode::kInvalidArgument) == kWireInvalidArgument);
static_assert(static_cast<int>(StatusCode::kNotFound) == kWireNotFound);
static_assert(static_cast<int>(StatusCode::kAlreadyExists) == kWireAlreadyExists);
static_assert(static_cast<int>(StatusCode::kFailedPrecondition) == kWireFailedPrecondition);
static_assert(static_cast<int>(StatusCode::kOutOfRange) == kWireOutOfRange);
static_assert(static_cast<int>(StatusCode::kCorruption) == kWireCorruption);
static_assert(static_cast<int>(StatusCode::kVersionMismatch) == kWireVersionMismatch);
static_assert(static_cast<int>(StatusCode::kIoError) == kWireIoError);
static_assert(static_cast<int>(StatusCode::kPermissionDenied) == kWirePermissionDenied);
static_assert(static_cast<int>(StatusCode::kResourceExhausted) == kWireResourceExhausted);
static_assert(static_cast<int>(StatusCode::kUnavailable) == kWireUnavailable);
static_assert(static_cast<int>(StatusCode::kDeadlineExceeded) == kWireDeadlineExceeded);
static_assert(static_cast<int>(StatusCode::kInternal) == kWireInternal);

static_assert(MaxReadReplyBodySize(kDefaultMaxItems) <= kDefaultMaxBodyBytes);
static_assert(MaxReadBodySize(kDefaultMaxItems) <= kDefaultMaxBodyBytes);
static_assert(MaxReadReplyBodySize(kMaxItemsCap) <= kMaxBodyBytesCap);
static_assert(kStatReplyFixedSize + kMaxStatEntries * (kStatEntryOverhead + kMaxStatKeyLength) <=
              kMinBodyBytes);
static_assert(kErrorFixedSize + kMaxErrorMessageLength <= kMinBodyBytes);
static_assert(kHelloReplyFixedSize + kMaxPeerNameLength <= kMinBodyBytes);
static_assert(kDefaultMaxBodyBytes >= kMinBodyBytes);

}  // namespace granary::protocol_format

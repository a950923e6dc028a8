#pragma once

// Byte layout of the chunk handoff (version 1): how a sidecar asks the cache
// node on its own host for a chunk file's descriptor over a Unix stream
// socket. docs/protocol.md, "Chunk handoff", describes every field and what
// the node answers; chunk_handoff.h encodes and decodes it. The frame header
// is the shared one of wire_frame.h without flags, payload or request id.
// Changing any value here changes the protocol: bump kVersion.
//
//   frame := fixed header (12 bytes) + body (body_length bytes)
//   fixed header:
//     0   magic        4 bytes  "GRHO"
//     4   version      u16      kVersion; a receiver rejects any other
//     6   type         u16      kType* below
//     8   body_length  u32      at most kMaxBodySize
//
// Bodies (offsets from the start of the body; n = a string's length):
//   OPEN_CHUNK        0 dataset_length u8 (n), 1 dataset (n bytes, a DNS-1123
//                     label), 1+n manifest_id 16 bytes (ContentId::ToBytes: low
//                     half, then high half), 17+n chunk u32. 21 + n bytes; nothing
//                     may follow.
//   OPEN_CHUNK_REPLY  0 status u32 (StatusCode's number: 0 OK, 2 NotFound, ...),
//                     4 message_length u16 (n <= kMaxMessageLength), 6 message.
//                     6 + n bytes. When the status is OK the chunk file's
//                     descriptor (O_RDONLY) comes with the reply's first byte
//                     (SCM_RIGHTS).
//
// Every integer is little-endian.
//
// Thread safety: constants only.

#include <cstddef>
#include <cstdint>

namespace granary::chunk_handoff_format {

inline constexpr char kMagic[4] = {'G', 'R', 'H', 'O'};
inline constexpr uint16_t kVersion = 1;

// Fixed frame header.
inline constexpr size_t kMagicOffset = 0;       // 4 bytes
inline constexpr size_t kVersionOffset = 4;     // u16
inline constexpr size_t kTypeOffset = 6;        // u16
inline constexpr size_t kBodyLengthOffset = 8;  // u32
inline constexpr size_t kHeaderSize = 12;

// Message types.
inline constexpr uint16_t kTypeOpenChunk = 1;
inline constexpr uint16_t kTypeOpenChunkReply = 2;

// OPEN_CHUNK body.
inline constexpr size_t kOpenChunkDatasetLengthOffset = 0;              // u8, then the name
inline constexpr size_t kManifestIdSize = 16;                           // after the name
inline constexpr size_t kOpenChunkFixedSize = 1 + kManifestIdSize + 4;  // 21 + the name

// OPEN_CHUNK_REPLY body.
inline constexpr size_t kReplyStatusOffset = 0;         // u32
inline constexpr size_t kReplyMessageLengthOffset = 4;  // u16
inline constexpr size_t kReplyFixedSize = 6;            // the message follows
inline constexpr size_t kMaxMessageLength = 1024;       // longer messages are cut

// The largest body either message can have; a larger body_length is a
// framing error (the node closes the connection).
inline constexpr uint32_t kMaxBodySize = 1100;
static_assert(kOpenChunkFixedSize + 63 <= kMaxBodySize);  // a DNS label is at most 63
static_assert(kReplyFixedSize + kMaxMessageLength <= kMaxBodySize);

}  // namespace granary::chunk_handoff_format

#pragma once

// Byte layout of the sidecar's local protocol (versions 1 to 3): what a
// training process says to granary-sidecar over a Unix stream socket.
// docs/protocol.md, "Sidecar protocol", describes every field, the limits,
// version negotiation and how the sidecar answers bad input;
// sidecar_protocol.h encodes and decodes it, and protocol/src/sidecar_messages.h
// holds each body's field list, the one place a field is added. The frame
// header is the shared one of wire_frame.h without a payload. Changing any
// value here changes the protocol: bump kMaxVersion and keep speaking the old
// one.
//
//   frame := fixed header (24 bytes) + body (body_length bytes)
//   fixed header:
//     0   magic        4 bytes  "GRSC"
//     4   version      u16      at most the agreed version (HELLO, HELLO_REPLY:
//                               always kHandshakeVersion)
//     6   type         u16      kType* below
//     8   flags        u32      0 (reserved; a receiver rejects other values)
//    12   body_length  u32      at most the receiver's max_body_bytes
//    16   request_id   u64      chosen by the client, >= 1, echoed by the reply;
//                               0 only in an ERROR that blames no request
//
// Bodies: a string is a u16 length + bytes; a list a u32 count + elements; a
// status a u16 wire code (protocol_format.h's kWire*) + a string message
// (empty for OK). Offsets from the start of the body; after a variable-length
// field, from its end.
//   HELLO        0 min_version u16, 2 max_version u16, 4 client_name string
//   OPEN         0 dataset string
//   SET_PLAN     0 seed u64, 8 epoch u64, 16 start_position u64, 24 world_size u32,
//                28 rank u32, 32 batch_size u32, 36 window_chunks u32, 40 mode u8,
//                41 drop_last u8 (0/1), 42 plan_id string
//   GET          0 lookahead u32, 4 release list of u64, then ids list of u32
//   NEXT         0 max_samples u32, 4 release list of u64
//   RELEASE      0 tokens list of u64
//   STAT         0 first_id u32, 4 count u32
//   LOOKUP       0 paths list of strings
//   PING, OK, PONG  empty
//   DIRECTORIES  (version 2) 0 first u32, 4 count u32
//   CHUNK_FILES  (version 3) 0 ids list of u32
//   HELLO_REPLY  0 version u16, 2 max_body_bytes u32, 6 max_items u32,
//                10 sidecar_name string
//   OPEN_REPLY   0 manifest_id 16 bytes, 16 sample_count u64, 24 total_bytes u64,
//                32 chunk_count u64, 40 arena_bytes u64 (48 bytes)
//   SAMPLES      0 item_count u32, 4 end_of_epoch u8, 5 items, each: id u32,
//                flags u8 (kSampleFlagHint), token u64, offset u64, length u64,
//                checksum u64, status
//   STAT_REPLY   0 first_id u32, 4 entries list, each: size u64, mtime_ns i64,
//                path string
//   LOOKUP_REPLY 0 items list, each: id u32, status
//   DIRECTORIES_REPLY (version 2) 0 first u32, 4 total u32, 8 entries list,
//                each: mode u16, path string
//   CHUNK_FILES_REPLY (version 3) 0 chunks list, each: chunk u32, status,
//                samples list (each: id u32, offset u64, length u64, checksum
//                u64), elsewhere list of u32. One descriptor (SCM_RIGHTS, with
//                the reply's first byte) per chunk whose status is OK, in list
//                order; at most kMaxChunkFilesPerReply of them.
//   ERROR        0 status u16, 2 flags u16 (kErrorFlagClosing), 4 message string
//
// Every integer is little-endian. A manifest id is ContentId::ToBytes (low
// half, then high half).
//
// Thread safety: constants only.

#include <cstddef>
#include <cstdint>

namespace granary::sidecar_protocol_format {

inline constexpr char kMagic[4] = {'G', 'R', 'S', 'C'};

// The versions this build speaks. The fixed header and the HELLO,
// HELLO_REPLY and ERROR bodies are frozen in every version.
inline constexpr uint16_t kMinVersion = 1;
inline constexpr uint16_t kMaxVersion = 3;
// The first version with DIRECTORIES / DIRECTORIES_REPLY.
inline constexpr uint16_t kDirectoriesVersion = 2;
// The first version with CHUNK_FILES / CHUNK_FILES_REPLY (direct reads).
inline constexpr uint16_t kChunkFilesVersion = 3;
// HELLO and HELLO_REPLY always carry this version in their frame header (and
// ERROR may, before a version is agreed), so any two builds can negotiate.
inline constexpr uint16_t kHandshakeVersion = 1;

// Fixed frame header.
inline constexpr size_t kMagicOffset = 0;        // 4 bytes
inline constexpr size_t kVersionOffset = 4;      // u16
inline constexpr size_t kTypeOffset = 6;         // u16
inline constexpr size_t kFlagsOffset = 8;        // u32, zero
inline constexpr size_t kBodyLengthOffset = 12;  // u32
inline constexpr size_t kRequestIdOffset = 16;   // u64
inline constexpr size_t kFrameHeaderSize = 24;

// Message types: requests 1.., replies 101...
inline constexpr uint16_t kTypeHello = 1;
inline constexpr uint16_t kTypeOpen = 2;
inline constexpr uint16_t kTypeSetPlan = 3;
inline constexpr uint16_t kTypeGet = 4;
inline constexpr uint16_t kTypeNext = 5;
inline constexpr uint16_t kTypeRelease = 6;
inline constexpr uint16_t kTypeStat = 7;
inline constexpr uint16_t kTypeLookup = 8;
inline constexpr uint16_t kTypePing = 9;
inline constexpr uint16_t kTypeDirectories = 10;  // version 2
inline constexpr uint16_t kTypeChunkFiles = 11;   // version 3
inline constexpr uint16_t kTypeHelloReply = 101;
inline constexpr uint16_t kTypeOpenReply = 102;
inline constexpr uint16_t kTypeOk = 103;
inline constexpr uint16_t kTypeSamples = 104;
inline constexpr uint16_t kTypeStatReply = 105;
inline constexpr uint16_t kTypeLookupReply = 106;
inline constexpr uint16_t kTypePong = 107;
inline constexpr uint16_t kTypeError = 108;
inline constexpr uint16_t kTypeDirectoriesReply = 109;  // version 2
inline constexpr uint16_t kTypeChunkFilesReply = 110;   // version 3

// Flag bits.
inline constexpr uint8_t kSampleFlagHint = 0x01;       // SAMPLES item: a lookahead hint
inline constexpr uint16_t kErrorFlagClosing = 0x0001;  // the sidecar closes after this ERROR

// Limits: caps no limit may exceed, and the defaults (Limits in
// sidecar_protocol.h). max_body_bytes bounds every frame's body, checked from
// the header; max_items every list and every count a reply must answer.
inline constexpr uint32_t kMinBodyBytes = 4096;
inline constexpr uint32_t kMaxBodyBytesCap = 64u << 20;
inline constexpr uint32_t kDefaultMaxBodyBytes = 4u << 20;
inline constexpr uint32_t kMaxItemsCap = 1u << 20;
inline constexpr uint32_t kDefaultMaxItems = 4096;

// Field lengths.
inline constexpr size_t kMaxNameLength = 255;         // client and sidecar names, graphic ASCII
inline constexpr size_t kMaxDatasetLength = 63;       // a DNS-1123 label
inline constexpr size_t kMaxPlanIdLength = 128;       // [A-Za-z0-9._-]
inline constexpr size_t kMaxPathLength = 4096;        // names.h's kMaxSamplePathLength
inline constexpr size_t kMaxMessageLength = 1024;     // status and ERROR messages (cut to this)
inline constexpr uint16_t kMaxDirectoryMode = 07777;  // st_mode & 07777
inline constexpr size_t kManifestIdSize = 16;
// Chunk descriptors one CHUNK_FILES_REPLY passes at most (one sendmsg; the
// socket helpers pass at most 4 descriptors at once).
inline constexpr size_t kMaxChunkFilesPerReply = 4;

// Smallest encodings of list elements: a count is accepted only if that many
// elements could fit in what is left of the body, before anything is reserved.
inline constexpr size_t kTokenSize = 8;
inline constexpr size_t kIdSize = 4;
inline constexpr size_t kStatusMinSize = 2 + 2;  // code, message length
inline constexpr size_t kSampleItemMinSize = 4 + 1 + 8 + 8 + 8 + 8 + kStatusMinSize;  // 41
inline constexpr size_t kStatEntryMinSize = 8 + 8 + 2 + 1;        // size, mtime, path >= 1
inline constexpr size_t kLookupItemMinSize = 4 + kStatusMinSize;  // id, status
inline constexpr size_t kDirectoryItemMinSize = 2 + 2 + 1;        // mode, path >= 1
inline constexpr size_t kPathMinSize = 2 + 1;                     // length, >= 1 byte
inline constexpr size_t kSamplesFixedSize = 4 + 1;                // count, end_of_epoch
inline constexpr size_t kLookupReplyFixedSize = 4;                // count
inline constexpr size_t kDirectSampleSize = 4 + 8 + 8 + 8;        // id, offset, length, checksum
inline constexpr size_t kChunkFileMinSize = 4 + kStatusMinSize + 4 + 4;  // chunk, status, 2 counts

}  // namespace granary::sidecar_protocol_format

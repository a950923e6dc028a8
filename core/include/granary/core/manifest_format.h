#pragma once

// Byte layout of an encoded manifest (version 3; versions 1 and 2 are still read). docs/formats.md
// describes it field by field; this header holds the sized constants both sides share.
//
//   file   := fixed_header (64 bytes) + zstd frame of `body`
//   fixed_header:
//     0  magic            8 bytes  "GRNYMANF"
//     8  version          u32      kManifestVersion
//    12  header_size      u32      64
//    16  flags            u32      0 (reserved; a reader rejects other values)
//    20  reserved         u32      0
//    24  content_id       16 bytes XXH3-128 of the uncompressed body (low half, high half)
//    40  body_size        u64      uncompressed body bytes
//    48  compressed_size  u64      bytes of the zstd frame that follows
//    56  frame_checksum   u64      XXH3-64 of the zstd frame
//
// Every integer is little-endian.

#include <cstddef>
#include <cstdint>

namespace granary::manifest_format {

inline constexpr char kMagic[8] = {'G', 'R', 'N', 'Y', 'M', 'A', 'N', 'F'};
// Version 2 added the permission bits of samples and directories (and lists
// directories without samples); version 1 manifests are still read, with
// kDefaultFileMode / kDefaultDirectoryMode, and re-encode as version 1.
// Version 3 added each sample's ctime (ns) and inode, which the source reads
// check besides size and mtime; version 1 and 2 manifests are still read (no
// ctime or inode: those reads check size and mtime only) and re-encode as
// themselves.
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kOldestVersion = 1;
inline constexpr size_t kHeaderSize = 64;

inline constexpr size_t kMagicOffset = 0;
inline constexpr size_t kVersionOffset = 8;
inline constexpr size_t kHeaderSizeOffset = 12;
inline constexpr size_t kFlagsOffset = 16;
inline constexpr size_t kReservedOffset = 20;
inline constexpr size_t kContentIdOffset = 24;
inline constexpr size_t kBodySizeOffset = 40;
inline constexpr size_t kCompressedSizeOffset = 48;
inline constexpr size_t kFrameChecksumOffset = 56;

// zstd level used when encoding: a manifest is written once and read often.
inline constexpr int kZstdLevel = 6;

// Limits a reader enforces before allocating, so corrupt input cannot make it
// allocate without bound.
inline constexpr uint64_t kMaxBodySize = 1ull << 36;    // 64 GiB
inline constexpr uint64_t kMaxCompressionRatio = 1024;  // body <= frame * ratio (+1 MiB)
inline constexpr uint32_t kRootDirectory = 0;           // directory 0 is the root ""
inline constexpr uint32_t kNoParent = 0xFFFFFFFFu;      // parent of the root
inline constexpr size_t kMaxNameLength = 255;           // one path component (NAME_MAX)
inline constexpr size_t kMaxPathLength = 4095;          // whole relative path (PATH_MAX - 1)

}  // namespace granary::manifest_format

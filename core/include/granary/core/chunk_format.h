#pragma once

// Byte layout of a chunk file (version 1): one chunk of one dataset in a cache
// node's chunk store. docs/formats.md ("Chunk file") describes it field by field
// with the commit protocol; chunk_file.h reads and writes it. Changing any value
// here changes the format: bump kVersion and keep reading the old one.
//
//   file := header region (header_region_size bytes) + payload (payload_size bytes)
//   header region:
//     0                  fixed header           128 bytes   immutable
//     128                segment table          n x 24      immutable
//     128 + 24n          payload checksums      n x u64     written by Commit
//     128 + 32n          presence bitmap        ceil(n/8)   written by Commit
//     ...                zero padding up to header_region_size (a multiple of 4096)
//   fixed header:
//     0   magic               8 bytes   "GRNYCHNK"
//     8   version             u32       kVersion
//    12   header_region_size  u32       HeaderRegionSize(n): where the payload starts
//    16   dataset             64 bytes  DNS-1123 label, NUL-padded
//    80   manifest_id         16 bytes  ContentId::ToBytes (low half, high half)
//    96   chunk_id            u32
//   100   segment_count       u32       n
//   104   payload_size        u64       end of the last segment
//   112   flags               u64       0 (reserved; a reader rejects other values)
//   120   layout_checksum     u64       Hash64(segment table, seed = Checksum64(bytes [0,120)))
//   segment table entry i:
//     0   sample              u32
//     4   reserved            u32       0
//     8   sample_offset       u64       offset of this piece within the sample
//    16   chunk_offset        u32       bytes are at file offset header_region_size + this
//    20   length              u32
//
// Every integer is little-endian.
//
// Thread safety: constants and pure functions only.

#include <cstdint>

namespace granary::chunk_format {

inline constexpr char kMagic[8] = {'G', 'R', 'N', 'Y', 'C', 'H', 'N', 'K'};
inline constexpr uint32_t kVersion = 1;

// The payload starts on a page boundary so it can be read with O_DIRECT,
// mmap'd or registered for RDMA without copying.
inline constexpr uint32_t kPayloadAlignment = 4096;

// Fixed header: byte offsets and sizes.
inline constexpr uint32_t kMagicOffset = 0;              // 8 bytes
inline constexpr uint32_t kVersionOffset = 8;            // u32
inline constexpr uint32_t kHeaderRegionSizeOffset = 12;  // u32
inline constexpr uint32_t kDatasetOffset = 16;           // 64 bytes, NUL-padded
inline constexpr uint32_t kDatasetFieldSize = 64;
inline constexpr uint32_t kManifestIdOffset = 80;       // 16 bytes (ContentId::ToBytes)
inline constexpr uint32_t kChunkIdOffset = 96;          // u32
inline constexpr uint32_t kSegmentCountOffset = 100;    // u32
inline constexpr uint32_t kPayloadSizeOffset = 104;     // u64
inline constexpr uint32_t kFlagsOffset = 112;           // u64, zero in version 1
inline constexpr uint32_t kLayoutChecksumOffset = 120;  // u64
inline constexpr uint32_t kFixedHeaderSize = 128;
inline constexpr uint32_t kLayoutChecksummedFixedBytes = 120;  // bytes [0, 120)

// Longest dataset name (a DNS-1123 label); the field keeps at least one NUL.
inline constexpr uint32_t kMaxDatasetNameLength = 63;

// One segment table entry: byte offsets within the entry.
inline constexpr uint32_t kSegmentSampleOffset = 0;      // u32 sample id
inline constexpr uint32_t kSegmentReservedOffset = 4;    // u32, zero
inline constexpr uint32_t kSegmentSampleByteOffset = 8;  // u64 offset within the sample
inline constexpr uint32_t kSegmentChunkOffset = 16;      // u32 offset within the payload
inline constexpr uint32_t kSegmentLengthOffset = 20;     // u32 bytes
inline constexpr uint32_t kSegmentEntrySize = 24;
inline constexpr uint32_t kPayloadChecksumSize = 8;  // u64 XXH3-64 per segment

// Limits. A chunk's payload is at most kMaxChunkSize (1 GiB, manifest.h), so
// u32 offsets and lengths suffice. The segment limit bounds the header region
// (about 540 MB at the limit) so that its size always fits in a u32; a reader
// never allocates more than the file it was given actually holds.
inline constexpr uint64_t kMaxPayloadSize = 1ull << 30;
inline constexpr uint32_t kMaxSegments = 1u << 24;

// Where the variable sections start, for a given segment count.
constexpr uint64_t SegmentTableOffset() { return kFixedHeaderSize; }
constexpr uint64_t ChecksumsOffset(uint32_t segment_count) {
  return kFixedHeaderSize + uint64_t{kSegmentEntrySize} * segment_count;
}
constexpr uint64_t BitmapOffset(uint32_t segment_count) {
  return ChecksumsOffset(segment_count) + uint64_t{kPayloadChecksumSize} * segment_count;
}
constexpr uint64_t BitmapSize(uint32_t segment_count) { return (uint64_t{segment_count} + 7) / 8; }
constexpr uint64_t HeaderRegionUsedSize(uint32_t segment_count) {
  return BitmapOffset(segment_count) + BitmapSize(segment_count);
}
// The payload offset: the used header bytes rounded up to kPayloadAlignment.
constexpr uint64_t HeaderRegionSize(uint32_t segment_count) {
  return (HeaderRegionUsedSize(segment_count) + kPayloadAlignment - 1) / kPayloadAlignment *
         kPayloadAlignment;
}

static_assert(HeaderRegionSize(0) == kPayloadAlignment);
static_assert(HeaderRegionSize(kMaxSegments) <= UINT32_MAX, "header_region_size is a u32");
static_assert(kLayoutChecksumOffset + 8 == kFixedHeaderSize);
static_assert(kDatasetFieldSize > kMaxDatasetNameLength);

}  // namespace granary::chunk_format

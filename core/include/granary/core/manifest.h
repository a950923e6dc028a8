#pragma once

// Manifest: the immutable metadata snapshot of a dataset.
//
// Every regular file under the source root is a sample. Sample ids follow the
// byte-wise sorted order of the paths relative to the root. Samples are packed
// into chunks in id order (see "Packing" below); each chunk is a file in a cache
// node's chunk store. After the snapshot, nothing asks the source for metadata:
// stat, list and path lookup are answered from here.
//
// Packing (deterministic from sizes and chunk_size alone):
//   - a sample no larger than chunk_size lives whole in one chunk. It goes into
//     the current chunk if it fits, else a new chunk is started;
//   - a sample larger than chunk_size starts a new chunk at offset 0 and fills
//     ceil(size / chunk_size) consecutive chunks of its own;
//   - an empty sample takes no bytes and belongs to the current chunk;
//   - a chunk holding kMaxSamplesPerChunk samples is closed even if bytes remain.
// So every chunk holds either whole samples or one piece of one large sample.
//
// The on-disk encoding is in manifest_format.h and docs/formats.md.
//
// Thread safety: a Manifest is immutable after Decode/Build; any number of
// threads may read it concurrently. Moving it is not thread-safe.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/hash.h"
#include "granary/core/status.h"

namespace granary {

using SampleId = uint32_t;
using ChunkId = uint32_t;

inline constexpr uint32_t kNoParentDirectory = 0xFFFFFFFFu;  // the root's parent

inline constexpr uint64_t kDefaultChunkSize = 16ull << 20;  // 16 MiB
inline constexpr uint64_t kMinChunkSize = 1ull << 10;       // 1 KiB (tests)
inline constexpr uint64_t kMaxChunkSize = 1ull << 30;       // 1 GiB
// Samples in one chunk at most (a chunk file's segment table stays small even
// for a dataset of empty files); a chunk that reaches it is closed.
inline constexpr uint32_t kMaxSamplesPerChunk = 1u << 24;

// Permission bits (st_mode & 07777) shown when the source's are not known: a
// manifest of format version 1 recorded none, and entries built by hand may
// leave them out. The dataset is read-only, so nothing is writable.
inline constexpr uint16_t kDefaultFileMode = 0444;
inline constexpr uint16_t kDefaultDirectoryMode = 0555;
inline constexpr uint16_t kMaxMode = 07777;

// One file of the source, as the walk saw it.
//
// size, mtime_ns, ctime_ns and inode together identify the version of the file
// the snapshot saw: every read of its bytes from the source checks them on
// the opened descriptor (source.h). ctime cannot be set from user space, so a
// rewrite that restores the mtime (`touch -r`, `cp -p`, `rsync -t`) still shows;
// a new inode shows a file replaced by a rename. 0 in ctime_ns or inode means
// "not recorded" (manifests of format version 1 and 2, entries built by hand):
// that attribute is then not checked.
struct FileEntry {
  std::string path;  // relative to the source root, '/'-separated, no leading '/'
  uint64_t size = 0;
  int64_t mtime_ns = 0;              // st_mtim in nanoseconds since the epoch
  uint16_t mode = kDefaultFileMode;  // st_mode & 07777
  int64_t ctime_ns = 0;              // st_ctim in nanoseconds since the epoch; 0: not recorded
  uint64_t inode = 0;                // st_ino; 0: not recorded
};

// One directory of the source, as the walk saw it. Directories holding
// samples are implied by the samples' paths; listing them here records their
// modes, and lists directories that hold no sample at all (an empty class
// folder is still a class to torchvision's ImageFolder).
struct DirectoryEntry {
  std::string path;                       // relative to the source root; "" is the root itself
  uint16_t mode = kDefaultDirectoryMode;  // st_mode & 07777
};

// What the walk saw besides the samples. Part of the manifest (and its id).
struct WalkStats {
  uint64_t directories = 0;           // directories descended into, root included
  uint64_t skipped_excluded = 0;      // files or directories matched by an exclude glob
  uint64_t skipped_not_included = 0;  // files that matched no include glob
  uint64_t skipped_special = 0;       // sockets, fifos, devices
  uint64_t skipped_symlinks = 0;      // links reads refuse: absolute, leaving the root, to
                                      // a directory, loops, dangling
  uint64_t skipped_unreadable = 0;    // entries it could not stat or open, or paths > 4095 bytes

  friend bool operator==(const WalkStats&, const WalkStats&) = default;
};

// The part of a manifest that is not per sample.
struct ManifestHeaderInfo {
  std::string source_uri;  // e.g. file:///lustre/imagenet/train
  uint64_t chunk_size = kDefaultChunkSize;
  std::vector<std::string> include;  // globs; empty means everything
  std::vector<std::string> exclude;  // globs
  WalkStats stats;
};

// Where one sample is and what it was at snapshot time.
struct SampleInfo {
  SampleId id = 0;
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  ChunkId chunk = 0;                 // first (usually only) chunk holding its bytes
  uint32_t chunk_offset = 0;         // offset of its first byte in that chunk's payload
  uint32_t chunk_count = 1;          // chunks it spans (>1 only when size > chunk_size)
  uint16_t mode = kDefaultFileMode;  // permission bits at snapshot time
  int64_t ctime_ns = 0;              // st_ctim at snapshot time; 0: not recorded (FileEntry)
  uint64_t inode = 0;                // st_ino at snapshot time; 0: not recorded
};

// One chunk: the samples with bytes in it.
struct ChunkInfo {
  ChunkId id = 0;
  SampleId first_sample = 0;   // first sample with bytes in this chunk
  uint32_t sample_count = 0;   // samples with bytes in this chunk (1 for pieces of a large one)
  uint32_t payload_bytes = 0;  // bytes of payload (<= chunk_size)
};

// One contiguous piece of one sample inside one chunk.
struct ChunkSegment {
  SampleId sample = 0;
  uint64_t sample_offset = 0;  // offset of this piece within the sample (0 unless spanning)
  uint32_t chunk_offset = 0;   // offset within the chunk's payload
  uint32_t length = 0;

  friend bool operator==(const ChunkSegment&, const ChunkSegment&) = default;
};

class Manifest;
namespace internal {
Result<Manifest> DecodeManifestBody(std::string_view body, const ContentId& id, uint32_t version);
}  // namespace internal

class Manifest {
 public:
  Manifest();
  ~Manifest();
  Manifest(Manifest&&) noexcept;
  Manifest& operator=(Manifest&&) noexcept;
  Manifest(const Manifest&) = delete;
  Manifest& operator=(const Manifest&) = delete;

  // Builds from files already sorted or not (sorted here), packing per header.
  // `directories` adds directories (with their modes) beside those the files'
  // paths imply; an implied directory not listed gets kDefaultDirectoryMode.
  // Fails on duplicate or invalid paths, a directory listed twice, a mode
  // above 07777, bad chunk size, or limits exceeded.
  static Result<Manifest> FromEntries(ManifestHeaderInfo header, std::vector<FileEntry> entries,
                                      std::vector<DirectoryEntry> directories = {});

  // Parses the encoded form (manifest_format.h). Every malformed input is a
  // Status (kCorruption, kVersionMismatch), never a crash.
  static Result<Manifest> Decode(std::string_view bytes);
  static Result<Manifest> Load(const std::string& path);

  // The canonical encoding; Decode(Encode()) is identical, and Encode() of a
  // decoded manifest returns the same bytes.
  std::string Encode() const;
  Status Save(const std::string& path) const;  // atomically

  // Content hash of the canonical (uncompressed) content; the manifest id.
  const ContentId& id() const;

  const ManifestHeaderInfo& header() const;
  uint64_t chunk_size() const { return header().chunk_size; }
  size_t sample_count() const;
  size_t chunk_count() const;
  uint64_t total_bytes() const;
  size_t directory_count() const;

  // Per-sample lookups; ids past the end are kOutOfRange.
  Result<SampleInfo> Sample(SampleId id) const;
  // Unchecked fast accessors for hot loops (id < sample_count()).
  uint64_t SizeOf(SampleId id) const;
  int64_t MtimeOf(SampleId id) const;
  ChunkId ChunkOf(SampleId id) const;
  uint32_t ChunkOffsetOf(SampleId id) const;
  std::string PathOf(SampleId id) const;
  // The last component of the sample's path (a view into the manifest).
  std::string_view NameOf(SampleId id) const;
  // Permission bits at snapshot time (st_mode & 07777).
  uint16_t ModeOf(SampleId id) const;
  // st_ctim (ns) and st_ino at snapshot time; 0 when not recorded (a manifest
  // of format version 1 or 2, or an entry built without them).
  int64_t CtimeOf(SampleId id) const;
  uint64_t InodeOf(SampleId id) const;
  // The format version this manifest encodes as (manifest_format.h): its own
  // for a decoded one, kVersion for a built one.
  uint32_t format_version() const;
  // The directory (index below directory_count()) holding the sample.
  uint32_t DirectoryOf(SampleId id) const;

  // Directories: index 0 is the root (path ""); a parent's index is lower
  // than its children's; sorted by path. Unchecked (d < directory_count()).
  uint32_t DirectoryParent(uint32_t d) const;  // kNoParentDirectory for the root
  const std::string& DirectoryPath(uint32_t d) const;
  std::string_view DirectoryName(uint32_t d) const;  // the last component; "" for the root
  uint16_t DirectoryMode(uint32_t d) const;

  // Path -> id ("a/b.jpg", no leading slash; "./" and "//" are not normalised).
  Result<SampleId> Find(std::string_view path) const;

  Result<ChunkInfo> Chunk(ChunkId id) const;
  // The pieces stored in a chunk, in payload order.
  Result<std::vector<ChunkSegment>> Segments(ChunkId id) const;

  // Heap bytes held by this object (for the <100 bytes/sample budget).
  size_t MemoryBytes() const;

 private:
  friend Result<Manifest> internal::DecodeManifestBody(std::string_view body, const ContentId& id,
                                                       uint32_t version);
  struct Rep;
  explicit Manifest(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

}  // namespace granary

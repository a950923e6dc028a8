#pragma once

// Chunk files: one chunk of one dataset as a cache node keeps it on local NVMe.
// The byte layout is in chunk_format.h and docs/formats.md ("Chunk file").
//
// A chunk file is created empty with its full geometry (the manifest's segment
// list for that chunk) and then filled sample by sample (on-demand fills) or
// whole (bulk staging) by a ChunkWriter. A segment counts as present only after
// its bytes and checksum are durable, so a crash at any point leaves every
// present segment intact; ChunkReader verifies each segment's checksum on every
// read, so media corruption is reported (kCorruption) instead of served.
//
// Who calls it: the cache node's chunk store. Staging and on-demand fills write
// through ChunkWriter; serving reads through ChunkReader; a restarting node lists
// its files with ChunkReader::ReadHeader, looks up the manifest named in each,
// and rebuilds its state with ChunkReader::Open + Scan. Neither class needs a
// Manifest: callers pass Manifest::Segments(chunk), or build segment lists by hand.
//
// Thread safety:
//  - ChunkWriter: one thread at a time. At most one writer per file, across
//    processes too: Create and Open take an exclusive flock(2) on the file and
//    fail with kUnavailable while another writer holds it.
//  - ChunkReader: the const methods (IsPresent, Read, Verify, Scan, ...) may be
//    called from any number of threads at once (they use pread). Refresh must
//    not run concurrently with any other method of the same reader.
//  - Readers may be open while a writer fills the file. A reader sees what was
//    committed when it was opened or last refreshed.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/manifest.h"
#include "granary/core/status.h"

namespace granary {

// Whose chunk a file holds: written at creation, checked on every open.
struct ChunkKey {
  std::string dataset;  // DNS-1123 label: [a-z0-9-], 1..63, alphanumeric at both ends
  ContentId manifest_id;
  ChunkId chunk = 0;

  friend bool operator==(const ChunkKey&, const ChunkKey&) = default;
};

// What a chunk file says about itself, read without knowing what to expect
// (the store's restart scan uses it to find the manifest to check against).
struct ChunkFileHeader {
  ChunkKey key;
  std::vector<ChunkSegment> segments;
  uint64_t payload_size = 0;
  uint32_t header_region_size = 0;  // the file offset where the payload starts
  uint32_t present_count = 0;       // segments whose presence bit is set
};

struct ChunkCreateOptions {
  // Reserve the payload's blocks at creation (fallocate) so that a full disk is
  // reported by Create, not by a Put halfway through staging. Falls back to a
  // sparse file where the file system cannot preallocate.
  bool preallocate = true;
};

namespace internal {
// The decoded header region of an open chunk file, shared by reader and writer.
struct ChunkFileState {
  ScopedFd fd;
  std::string path;
  ChunkKey key;
  std::vector<ChunkSegment> segments;
  std::vector<uint64_t> checksums;  // per segment; meaningful only where present
  std::vector<uint8_t> bitmap;      // as on disk: bit i%8 of byte i/8
  uint64_t payload_size = 0;
  uint32_t header_region_size = 0;
  uint32_t present_count = 0;

  bool IsPresent(uint32_t index) const {
    return index < segments.size() && ((unsigned{bitmap[index / 8]} >> (index % 8)) & 1u) != 0;
  }
  // "chunk file <path> (dataset <d>, chunk <c>)", for error messages.
  std::string Describe() const;
  // kInvalidArgument unless index < segments.size().
  Status CheckIndex(uint32_t index, std::string_view doing) const;
};
}  // namespace internal

// Fills a chunk file. Bytes given to Put become present (visible to readers,
// durable, checksummed) at the next Commit, never before.
class ChunkWriter {
 public:
  // Creates an empty chunk file at `path` (mode 0600) with the given geometry:
  // `segments` in payload order, non-overlapping, each end within 1 GiB.
  // Crash-safe: the file appears under `path` only once its header is durable.
  // An existing file is kAlreadyExists (use Open to continue filling it).
  static Result<ChunkWriter> Create(const std::string& path, const ChunkKey& key,
                                    std::span<const ChunkSegment> segments,
                                    const ChunkCreateOptions& options = {});

  // Reopens an existing chunk file to fill the rest (after a restart, or for
  // on-demand fills). Verifies it like ChunkReader::Open, and loads which
  // segments are already present.
  static Result<ChunkWriter> Open(const std::string& path, const ChunkKey& key,
                                  std::span<const ChunkSegment> segments);

  ChunkWriter(ChunkWriter&&) noexcept = default;
  ChunkWriter& operator=(ChunkWriter&&) noexcept = default;
  ChunkWriter(const ChunkWriter&) = delete;
  ChunkWriter& operator=(const ChunkWriter&) = delete;
  // Does not commit: segments put since the last Commit stay absent.
  ~ChunkWriter() = default;

  // Writes the bytes of segment `index` (exactly its length) into the payload.
  // A segment already present must be dropped first (kFailedPrecondition); a
  // segment put but not committed may be put again. Bad index or length is
  // kInvalidArgument.
  Status Put(uint32_t index, std::string_view bytes);

  // Makes every segment put since the last Commit durable and present: write
  // their checksums, fdatasync, set their presence bits, fdatasync. Two syncs
  // however many segments, so fill a whole chunk with Puts and one Commit.
  // After a failed write or sync the writer refuses further calls: reopen it.
  Status Commit();

  // Makes a segment absent again, durably, so that it can be re-staged after a
  // reader found it corrupt. Dropping an absent segment is a no-op; dropping a
  // pending one discards its Put.
  Status Drop(uint32_t index);

  bool IsPresent(uint32_t index) const { return state_.IsPresent(index); }
  bool IsPending(uint32_t index) const { return index < pending_.size() && pending_[index]; }
  uint32_t present_count() const { return state_.present_count; }
  uint32_t pending_count() const { return pending_count_; }
  uint32_t segment_count() const { return static_cast<uint32_t>(state_.segments.size()); }
  bool complete() const { return state_.present_count == segment_count(); }
  const std::string& path() const { return state_.path; }
  const ChunkKey& key() const { return state_.key; }
  std::span<const ChunkSegment> segments() const { return state_.segments; }

 private:
  explicit ChunkWriter(internal::ChunkFileState state);
  Status CheckUsable() const;
  Status Fail(Status status);

  internal::ChunkFileState state_;
  std::vector<bool> pending_;
  uint32_t pending_count_ = 0;
  uint32_t pending_lo_ = 0;  // bounds (inclusive) of pending indices; may be loose
  uint32_t pending_hi_ = 0;
  Status failed_;  // not OK once a write or sync failed: the file state is unknown
};

enum class ChunkScanMode {
  kPresence,       // trust the presence bitmap: reads nothing more
  kVerifyPayload,  // read every present segment and check its checksum
};

// Which segments of a chunk file can be served.
struct ChunkScan {
  std::vector<bool> valid;  // per segment: present and, if verified, intact
  uint32_t valid_count = 0;
  std::vector<uint32_t> corrupt;  // present segments whose bytes fail their checksum
};

// Reads and verifies a chunk file.
class ChunkReader {
 public:
  // Opens `path` and checks that it is a sound chunk file (magic, version,
  // checksums, layout, exact length) holding `expected` with exactly
  // `expected_segments`. Errors: kCorruption (damaged or truncated),
  // kVersionMismatch (a format this build does not read), kFailedPrecondition
  // (a sound file of another dataset, manifest, chunk or geometry).
  static Result<ChunkReader> Open(const std::string& path, const ChunkKey& expected,
                                  std::span<const ChunkSegment> expected_segments);

  // Verifies `path` the same way, without expectations, and returns what it
  // holds. For the store's restart scan.
  static Result<ChunkFileHeader> ReadHeader(const std::string& path);
  // As Open, over a descriptor opened elsewhere (read-only is enough): a chunk
  // file a cache node handed over (chunk_handoff.h). `label` names the file in
  // messages.
  static Result<ChunkReader> FromFd(ScopedFd fd, const std::string& label, const ChunkKey& expected,
                                    std::span<const ChunkSegment> expected_segments);

  ChunkReader(ChunkReader&&) noexcept = default;
  ChunkReader& operator=(ChunkReader&&) noexcept = default;
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;
  ~ChunkReader() = default;

  // Re-reads the presence bitmap and checksums to see commits made since Open.
  Status Refresh();

  bool IsPresent(uint32_t index) const { return state_.IsPresent(index); }
  uint32_t present_count() const { return state_.present_count; }
  uint32_t segment_count() const { return static_cast<uint32_t>(state_.segments.size()); }
  const std::string& path() const { return state_.path; }
  const ChunkKey& key() const { return state_.key; }
  std::span<const ChunkSegment> segments() const { return state_.segments; }

  // Reads segment `index` into `out` (exactly its length) and verifies it.
  // Errors: kInvalidArgument (bad index or size), kNotFound (not present: fall
  // through to the source), kCorruption (checksum mismatch or truncated file:
  // drop the segment with ChunkWriter::Drop and re-stage it).
  Status Read(uint32_t index, std::span<char> out) const;
  Result<std::string> Read(uint32_t index) const;

  // For servers that read with preadv or sendfile on fd(): where the bytes of
  // segment `index` start in the file, and a check of bytes read by other means.
  Result<uint64_t> PayloadOffset(uint32_t index) const;
  Status Verify(uint32_t index, std::string_view bytes) const;
  // The stored XXH3-64 of present segment `index` (as of Open/Refresh).
  uint64_t checksum(uint32_t index) const { return state_.checksums[index]; }
  int fd() const { return state_.fd.get(); }

  // What a restarting node can serve. kCorruption of a segment is reported in
  // the result, not as an error; errors are I/O failures only.
  Result<ChunkScan> Scan(ChunkScanMode mode) const;

 private:
  explicit ChunkReader(internal::ChunkFileState state) : state_(std::move(state)) {}

  internal::ChunkFileState state_;
};

}  // namespace granary

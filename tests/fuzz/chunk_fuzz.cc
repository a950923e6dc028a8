// libFuzzer target for chunk files (core/src/chunk_file.cc): the input is the
// whole content of a chunk file, which goes through everything that reads one
// (ReadHeader, Open, Scan, Read) and, when it opens, through a writer that
// repairs and fills it. Any crash, sanitizer report, huge allocation, or broken
// invariant below is a finding.
//
// Fix-up: an input whose layout checksum field is zero gets the right checksum
// computed before it is parsed. Without this, almost every mutation would stop
// at the checksum and the table checks behind it would never be reached; the
// seed corpus (tests/fuzz/corpus/chunk, written by chunk_file_test's SeedCorpus
// test) holds files both with and without a zeroed checksum.
//
// The file lives in a memfd, so nothing touches the disk.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/chunk_file.h"
#include "granary/core/chunk_format.h"
#include "granary/core/hash.h"

namespace granary {
namespace {

namespace cf = chunk_format;

void Check(bool condition, const char* what, const Status& status = Status::Ok()) {
  if (condition) return;
  std::fprintf(stderr, "chunk_fuzz invariant broken: %s (%s)\n", what, status.ToString().c_str());
  std::abort();
}

void FixLayoutChecksum(std::string* file) {
  if (file->size() < cf::kFixedHeaderSize) return;
  if (LoadLe<uint64_t>(file->data() + cf::kLayoutChecksumOffset) != 0) return;
  auto count = LoadLe<uint32_t>(file->data() + cf::kSegmentCountOffset);
  uint64_t table_end = cf::SegmentTableOffset() + uint64_t{cf::kSegmentEntrySize} * count;
  if (table_end > file->size()) return;
  uint64_t seed = Checksum64(file->data(), cf::kLayoutChecksummedFixedBytes);
  StoreLe(file->data() + cf::kLayoutChecksumOffset,
          Hash64(file->data() + cf::kFixedHeaderSize, table_end - cf::kFixedHeaderSize, seed));
}

// Deterministic bytes for refilling a segment.
std::string Fill(const ChunkSegment& s) {
  return std::string(s.length, static_cast<char>('a' + s.sample % 26));
}

void Exercise(const std::string& path) {
  auto header = ChunkReader::ReadHeader(path);
  if (!header.ok()) {
    Check(header.status().code() == StatusCode::kCorruption ||
              header.status().code() == StatusCode::kVersionMismatch,
          "ReadHeader fails only with kCorruption or kVersionMismatch", header.status());
    return;
  }
  const std::vector<ChunkSegment>& segments = header->segments;

  auto reader = ChunkReader::Open(path, header->key, segments);
  Check(reader.ok(), "a file ReadHeader accepts opens with its own key", reader.status());
  Check(reader->present_count() == header->present_count, "same present count");
  ChunkKey other = header->key;
  other.chunk ^= 1;
  Check(ChunkReader::Open(path, other, segments).status().code() == StatusCode::kFailedPrecondition,
        "another chunk id is kFailedPrecondition");

  auto quick = reader->Scan(ChunkScanMode::kPresence);
  Check(quick.ok(), "presence scan", quick.status());
  auto full = reader->Scan(ChunkScanMode::kVerifyPayload);
  Check(full.ok(), "verifying scan", full.status());
  for (uint32_t i = 0; i < reader->segment_count(); ++i) {
    Check(quick->valid[i] == reader->IsPresent(i), "presence scan is the bitmap");
    auto bytes = reader->Read(i);
    if (full->valid[i]) {
      Check(bytes.ok(), "valid segments read", bytes.status());
      Check(bytes->size() == segments[i].length, "read returns the segment's length");
    } else if (reader->IsPresent(i)) {
      Check(bytes.status().code() == StatusCode::kCorruption, "corrupt segments fail to read",
            bytes.status());
    } else {
      Check(bytes.status().code() == StatusCode::kNotFound, "absent segments are not found",
            bytes.status());
    }
  }

  // Repair the way the store does: drop what is corrupt, fill what is absent.
  auto writer = ChunkWriter::Open(path, header->key, segments);
  Check(writer.ok(), "a file the reader opens opens for writing", writer.status());
  for (uint32_t i : full->corrupt) {
    Status s = writer->Drop(i);
    Check(s.ok(), "drop", s);
  }
  for (uint32_t i = 0; i < writer->segment_count(); ++i) {
    if (writer->IsPresent(i)) continue;
    Status s = writer->Put(i, Fill(segments[i]));
    Check(s.ok(), "put", s);
  }
  Status s = writer->Commit();
  Check(s.ok(), "commit", s);
  Check(writer->complete(), "complete after filling every absent segment");
  s = reader->Refresh();
  Check(s.ok(), "refresh", s);
  auto after = reader->Scan(ChunkScanMode::kVerifyPayload);
  Check(after.ok() && after->valid_count == reader->segment_count(),
        "every segment valid after the repair", after.status());
}

}  // namespace
}  // namespace granary

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string file(reinterpret_cast<const char*>(data), size);
  granary::FixLayoutChecksum(&file);
  int fd = ::memfd_create("chunk_fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t done = 0;
  while (done < file.size()) {
    ssize_t n = ::write(fd, file.data() + done, file.size() - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  granary::Exercise("/proc/self/fd/" + std::to_string(fd));
  ::close(fd);
  return 0;
}

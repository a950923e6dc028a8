// ChunkWriter and ChunkReader (chunk_file.h, chunk_format.h). Kept whole at
// about 630 lines: its one job is the chunk file's layout on disk. The writer
// and the reader load and check a file with the same code (LoadChunkFile,
// CheckExpected, the header region and its checksum), so the two sides cannot
// disagree about a byte; splitting them would put that shared code in a
// header of its own for two users.

#include "granary/core/chunk_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "granary/core/byte_order.h"
#include "granary/core/chunk_format.h"
#include "granary/core/names.h"

namespace granary {

namespace cf = chunk_format;

namespace {

constexpr std::string_view kRestage = "delete the file and re-stage the chunk";

// Empty if `segments` is a valid chunk geometry (payload order, no overlap,
// within kMaxPayloadSize), else what is wrong. Sets *payload_size to the end of
// the last segment.
std::string SegmentProblem(std::span<const ChunkSegment> segments, uint64_t* payload_size) {
  *payload_size = 0;
  if (segments.size() > cf::kMaxSegments) {
    return fmt::format("{} segments, more than the limit of {} (use a smaller chunk size)",
                       segments.size(), cf::kMaxSegments);
  }
  uint64_t end = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ChunkSegment& s = segments[i];
    if (s.chunk_offset < end) {
      return fmt::format(
          "segment {} (sample {}) starts at payload offset {}, before the end of the "
          "previous segment ({}): segments must be in payload order without overlap",
          i, s.sample, s.chunk_offset, end);
    }
    end = uint64_t{s.chunk_offset} + s.length;
    if (end > cf::kMaxPayloadSize) {
      return fmt::format("segment {} (sample {}) ends at payload offset {}, past the {} byte limit",
                         i, s.sample, end, cf::kMaxPayloadSize);
    }
    if (s.sample_offset > UINT64_MAX - s.length) {
      return fmt::format("segment {} (sample {}) has sample_offset {} + length {} past 2^64", i,
                         s.sample, s.sample_offset, s.length);
    }
  }
  *payload_size = end;
  return {};
}

uint64_t LayoutChecksum(const char* region, uint32_t segment_count) {
  uint64_t seed = Checksum64(region, cf::kLayoutChecksummedFixedBytes);
  return Hash64(region + cf::SegmentTableOffset(), size_t{cf::kSegmentEntrySize} * segment_count,
                seed);
}

// The header region of a new, empty chunk file: every checksum zero, every
// presence bit clear.
std::string EncodeHeaderRegion(const ChunkKey& key, std::span<const ChunkSegment> segments,
                               uint64_t payload_size) {
  auto count = static_cast<uint32_t>(segments.size());
  std::string region(cf::HeaderRegionSize(count), '\0');
  char* p = region.data();
  std::memcpy(p + cf::kMagicOffset, cf::kMagic, sizeof(cf::kMagic));
  StoreLe(p + cf::kVersionOffset, cf::kVersion);
  StoreLe(p + cf::kHeaderRegionSizeOffset, static_cast<uint32_t>(region.size()));
  std::memcpy(p + cf::kDatasetOffset, key.dataset.data(), key.dataset.size());
  auto id = key.manifest_id.ToBytes();
  std::memcpy(p + cf::kManifestIdOffset, id.data(), id.size());
  StoreLe(p + cf::kChunkIdOffset, key.chunk);
  StoreLe(p + cf::kSegmentCountOffset, count);
  StoreLe(p + cf::kPayloadSizeOffset, payload_size);
  StoreLe(p + cf::kFlagsOffset, uint64_t{0});
  for (uint32_t i = 0; i < count; ++i) {
    char* e = p + cf::SegmentTableOffset() + uint64_t{cf::kSegmentEntrySize} * i;
    StoreLe(e + cf::kSegmentSampleOffset, segments[i].sample);
    StoreLe(e + cf::kSegmentReservedOffset, uint32_t{0});
    StoreLe(e + cf::kSegmentSampleByteOffset, segments[i].sample_offset);
    StoreLe(e + cf::kSegmentChunkOffset, segments[i].chunk_offset);
    StoreLe(e + cf::kSegmentLengthOffset, segments[i].length);
  }
  StoreLe(p + cf::kLayoutChecksumOffset, LayoutChecksum(p, count));
  return region;
}

Status Corrupt(const std::string& path, std::string_view problem) {
  return Status::Corruption(fmt::format("chunk file {}: {}; {}", path, problem, kRestage));
}

uint32_t CountPresent(const std::vector<uint8_t>& bitmap) {
  uint32_t n = 0;
  for (uint8_t b : bitmap) n += static_cast<uint32_t>(std::popcount(b));
  return n;
}

// Bits past the last segment must be clear: a set one means the bitmap was
// damaged, and the damage may extend to bits we cannot check.
Status CheckBitmapTail(const std::string& path, const std::vector<uint8_t>& bitmap,
                       uint32_t segment_count) {
  if (segment_count % 8 == 0) return Status::Ok();
  auto used = static_cast<uint8_t>((1u << (segment_count % 8)) - 1u);
  if ((unsigned{bitmap.back()} & ~unsigned{used}) != 0) {
    return Corrupt(path,
                   fmt::format("presence bitmap has bits set past segment {}", segment_count - 1));
  }
  return Status::Ok();
}

// Reads and checks everything in the header region; the result is a file that
// is sound, whatever it holds.
Result<internal::ChunkFileState> LoadChunkFile(ScopedFd fd, const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(uint64_t file_size, FileSize(fd.get(), path));
  if (file_size < cf::kFixedHeaderSize) {
    return Corrupt(path, fmt::format("file is truncated ({} bytes, the fixed header alone is {})",
                                     file_size, cf::kFixedHeaderSize));
  }
  char fixed[cf::kFixedHeaderSize];
  GRANARY_RETURN_IF_ERROR(PreadFull(fd.get(), fixed, sizeof(fixed), 0, path));
  if (std::memcmp(fixed + cf::kMagicOffset, cf::kMagic, sizeof(cf::kMagic)) != 0) {
    return Corrupt(path, "bad magic: this is not a Granary chunk file");
  }
  auto version = LoadLe<uint32_t>(fixed + cf::kVersionOffset);
  if (version != cf::kVersion) {
    return Status::VersionMismatch(fmt::format(
        "chunk file {} has format version {}, this build reads version {}; it was written by a "
        "different Granary release: {}",
        path, version, cf::kVersion, kRestage));
  }
  // Sizes are checked against each other and the file before anything is
  // allocated from them.
  auto count = LoadLe<uint32_t>(fixed + cf::kSegmentCountOffset);
  auto region_size = LoadLe<uint32_t>(fixed + cf::kHeaderRegionSizeOffset);
  auto payload_size = LoadLe<uint64_t>(fixed + cf::kPayloadSizeOffset);
  if (count > cf::kMaxSegments) {
    return Corrupt(
        path, fmt::format("segment count {} is over the limit of {}", count, cf::kMaxSegments));
  }
  if (region_size != cf::HeaderRegionSize(count)) {
    return Corrupt(path,
                   fmt::format("header region size {} does not match {} segments (must be {})",
                               region_size, count, cf::HeaderRegionSize(count)));
  }
  if (payload_size > cf::kMaxPayloadSize) {
    return Corrupt(path, fmt::format("payload size {} is over the limit of {}", payload_size,
                                     cf::kMaxPayloadSize));
  }
  uint64_t want_size = uint64_t{region_size} + payload_size;
  if (file_size < want_size) {
    return Corrupt(path, fmt::format("file is truncated ({} bytes, its header says {})", file_size,
                                     want_size));
  }
  if (file_size > want_size) {
    return Corrupt(path, fmt::format("file is {} bytes, longer than the {} its header says",
                                     file_size, want_size));
  }

  std::string region(region_size, '\0');
  GRANARY_RETURN_IF_ERROR(PreadFull(fd.get(), region.data(), region.size(), 0, path));
  const char* p = region.data();
  uint64_t stored = LoadLe<uint64_t>(p + cf::kLayoutChecksumOffset);
  uint64_t computed = LayoutChecksum(p, count);
  if (stored != computed) {
    return Corrupt(path, fmt::format("header checksum mismatch (stored {:016x}, computed {:016x})",
                                     stored, computed));
  }
  // From here the fixed fields and the table are as written; what follows
  // catches files written wrongly rather than damaged ones.
  if (LoadLe<uint64_t>(p + cf::kFlagsOffset) != 0) {
    return Corrupt(path, "flags field is not zero");
  }
  std::string_view dataset_field(p + cf::kDatasetOffset, cf::kDatasetFieldSize);
  std::string_view dataset = dataset_field.substr(0, dataset_field.find('\0'));
  if (!IsDnsLabel(dataset) ||
      dataset_field.find_first_not_of('\0', dataset.size()) != std::string_view::npos) {
    return Corrupt(path, fmt::format("dataset name field {} is not a NUL-padded DNS-1123 label",
                                     Quoted(dataset_field)));
  }

  internal::ChunkFileState state;
  state.path = path;
  state.key.dataset = std::string(dataset);
  state.key.manifest_id =
      ContentId::FromBytes(reinterpret_cast<const uint8_t*>(p + cf::kManifestIdOffset));
  state.key.chunk = LoadLe<uint32_t>(p + cf::kChunkIdOffset);
  state.payload_size = payload_size;
  state.header_region_size = region_size;
  state.segments.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    const char* e = p + cf::SegmentTableOffset() + uint64_t{cf::kSegmentEntrySize} * i;
    if (LoadLe<uint32_t>(e + cf::kSegmentReservedOffset) != 0) {
      return Corrupt(path, fmt::format("segment {} has a non-zero reserved field", i));
    }
    ChunkSegment& s = state.segments[i];
    s.sample = LoadLe<uint32_t>(e + cf::kSegmentSampleOffset);
    s.sample_offset = LoadLe<uint64_t>(e + cf::kSegmentSampleByteOffset);
    s.chunk_offset = LoadLe<uint32_t>(e + cf::kSegmentChunkOffset);
    s.length = LoadLe<uint32_t>(e + cf::kSegmentLengthOffset);
  }
  uint64_t table_payload_size;
  std::string problem = SegmentProblem(state.segments, &table_payload_size);
  if (!problem.empty()) return Corrupt(path, "segment table: " + problem);
  if (table_payload_size != payload_size) {
    return Corrupt(path, fmt::format("payload size {} does not match the segment table's end {}",
                                     payload_size, table_payload_size));
  }

  state.checksums.resize(count);
  for (uint32_t i = 0; i < count; ++i) {
    state.checksums[i] =
        LoadLe<uint64_t>(p + cf::ChecksumsOffset(count) + uint64_t{cf::kPayloadChecksumSize} * i);
  }
  const char* bitmap = p + cf::BitmapOffset(count);
  state.bitmap.assign(bitmap, bitmap + cf::BitmapSize(count));
  GRANARY_RETURN_IF_ERROR(CheckBitmapTail(path, state.bitmap, count));
  std::string_view padding(region);
  padding.remove_prefix(cf::HeaderRegionUsedSize(count));
  if (padding.find_first_not_of('\0') != std::string_view::npos) {
    return Corrupt(path, "header padding is not zero");
  }
  state.present_count = CountPresent(state.bitmap);
  state.fd = std::move(fd);
  return state;
}

// A sound file may still be someone else's chunk: a stale file of an older
// manifest, or one renamed by hand. That is not damage, so kFailedPrecondition.
Status CheckExpected(const internal::ChunkFileState& state, const ChunkKey& key,
                     std::span<const ChunkSegment> segments) {
  auto mismatch = [&](const std::string& what) {
    return Status::FailedPrecondition(
        fmt::format("chunk file {} is not the expected chunk: {}; delete it and stage the chunk "
                    "anew",
                    state.path, what));
  };
  if (state.key.dataset != key.dataset) {
    return mismatch(
        fmt::format("it holds dataset '{}', expected '{}'", state.key.dataset, key.dataset));
  }
  if (state.key.manifest_id != key.manifest_id) {
    return mismatch(fmt::format("it holds manifest {}, expected {}", state.key.manifest_id.ToHex(),
                                key.manifest_id.ToHex()));
  }
  if (state.key.chunk != key.chunk) {
    return mismatch(fmt::format("it holds chunk {}, expected {}", state.key.chunk, key.chunk));
  }
  if (state.segments.size() != segments.size()) {
    return mismatch(
        fmt::format("it has {} segments, expected {}", state.segments.size(), segments.size()));
  }
  for (size_t i = 0; i < segments.size(); ++i) {
    const ChunkSegment& a = state.segments[i];
    const ChunkSegment& b = segments[i];
    if (a != b) {
      return mismatch(fmt::format(
          "segment {} is (sample {}, sample_offset {}, chunk_offset {}, length {}), expected "
          "(sample {}, sample_offset {}, chunk_offset {}, length {})",
          i, a.sample, a.sample_offset, a.chunk_offset, a.length, b.sample, b.sample_offset,
          b.chunk_offset, b.length));
    }
  }
  return Status::Ok();
}

// One writer per file: two writers would each set presence bits from their own
// copy of the bitmap and clear each other's.
Status LockForWriting(int fd, const std::string& path) {
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) return Status::Ok();
  if (errno == EWOULDBLOCK) {
    return Status::Unavailable(fmt::format(
        "chunk file {} is open for writing elsewhere; retry when that writer is done", path));
  }
  return Status::FromErrno(errno, "lock chunk file " + path);
}

// Gives the file its full length. With `preallocate`, blocks are reserved now,
// so ENOSPC surfaces here as kResourceExhausted.
Status SetFileSize(int fd, uint64_t size, bool preallocate, const std::string& path) {
  if (preallocate) {
    int rc;
    do {
      rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size));
    } while (rc < 0 && errno == EINTR);
    if (rc == 0) return Status::Ok();
    if (errno != EOPNOTSUPP && errno != ENOSYS) {
      return Status::FromErrno(errno,
                               fmt::format("reserve {} bytes for chunk file {}", size, path));
    }
  }
  if (::ftruncate(fd, static_cast<off_t>(size)) < 0) {
    return Status::FromErrno(errno, fmt::format("extend chunk file {} to {} bytes", path, size));
  }
  return Status::Ok();
}

// fsync, not fdatasync: a directory has no "data" apart from its entries.
}  // namespace

std::string internal::ChunkFileState::Describe() const {
  return fmt::format("chunk file {} (dataset {}, chunk {})", path, key.dataset, key.chunk);
}

// ---------------------------------------------------------------------------
// ChunkWriter

ChunkWriter::ChunkWriter(internal::ChunkFileState state)
    : state_(std::move(state)), pending_(state_.segments.size(), false) {}

Result<ChunkWriter> ChunkWriter::Create(const std::string& path, const ChunkKey& key,
                                        std::span<const ChunkSegment> segments,
                                        const ChunkCreateOptions& options) {
  const std::string doing = "create chunk file " + path;
  if (!IsDnsLabel(key.dataset)) {
    return Status::InvalidArgument(fmt::format(
        "{}: dataset name {} is not a DNS-1123 label (1 to {} of [a-z0-9-], starting and "
        "ending alphanumeric)",
        doing, Quoted(key.dataset), cf::kMaxDatasetNameLength));
  }
  uint64_t payload_size;
  std::string problem = SegmentProblem(segments, &payload_size);
  if (!problem.empty()) {
    return Status::InvalidArgument(
        fmt::format("{}: {}; pass the manifest's segment list for the chunk", doing, problem));
  }
  std::string region = EncodeHeaderRegion(key, segments, payload_size);

  // The file is built under a temporary name and linked into place once its
  // header is durable, so `path` never names a half-written header. link()
  // rather than rename() so that an existing chunk file is never replaced.
  std::string tmp = path + ".tmp.XXXXXX";
  int raw = ::mkostemp(tmp.data(), O_CLOEXEC);  // mode 0600: chunk data is not world-readable
  if (raw < 0) return Status::FromErrno(errno, doing + ": create temporary file " + tmp);
  ScopedFd fd(raw);
  Status s = LockForWriting(fd.get(), tmp);
  if (s.ok()) s = PwriteFull(fd.get(), region.data(), region.size(), 0, tmp);
  if (s.ok()) s = SetFileSize(fd.get(), region.size() + payload_size, options.preallocate, tmp);
  if (s.ok()) s = SyncData(fd.get(), tmp);
  if (s.ok() && ::link(tmp.c_str(), path.c_str()) < 0) {
    if (errno == EEXIST) {
      s = Status::AlreadyExists(
          "it already exists; reopen it with ChunkWriter::Open to continue filling it, or delete "
          "it first");
    } else {
      s = Status::FromErrno(errno, "link " + tmp);
    }
  }
  ::unlink(tmp.c_str());
  if (!s.ok()) return s.WithContext(doing);
  GRANARY_RETURN_IF_ERROR(SyncDirectoryOf(path).WithContext(doing));

  internal::ChunkFileState state;
  state.fd = std::move(fd);
  state.path = path;
  state.key = key;
  state.segments.assign(segments.begin(), segments.end());
  state.checksums.assign(segments.size(), 0);
  state.bitmap.assign(cf::BitmapSize(static_cast<uint32_t>(segments.size())), 0);
  state.payload_size = payload_size;
  state.header_region_size = static_cast<uint32_t>(region.size());
  return ChunkWriter(std::move(state));
}

Result<ChunkWriter> ChunkWriter::Open(const std::string& path, const ChunkKey& key,
                                      std::span<const ChunkSegment> segments) {
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_RDWR));
  GRANARY_RETURN_IF_ERROR(LockForWriting(fd.get(), path));
  GRANARY_ASSIGN_OR_RETURN(internal::ChunkFileState state, LoadChunkFile(std::move(fd), path));
  GRANARY_RETURN_IF_ERROR(CheckExpected(state, key, segments));
  return ChunkWriter(std::move(state));
}

Status ChunkWriter::CheckUsable() const {
  if (failed_.ok()) return Status::Ok();
  return Status::FailedPrecondition(fmt::format(
      "{}: an earlier write or sync failed ({}), so what reached the disk is unknown; reopen "
      "the file with ChunkWriter::Open and put the uncommitted segments again",
      state_.Describe(), failed_.message()));
}

Status internal::ChunkFileState::CheckIndex(uint32_t index, std::string_view doing) const {
  if (index < segments.size()) return Status::Ok();
  return Status::InvalidArgument(fmt::format("{} segment {} of {}: it has only {} segments", doing,
                                             index, Describe(), segments.size()));
}

Status ChunkWriter::Fail(Status status) {
  // After a failed fdatasync the kernel may have dropped the dirty pages while
  // a retried sync would succeed, so no later Commit may be trusted.
  failed_ = status;
  return status;
}

Status ChunkWriter::Put(uint32_t index, std::string_view bytes) {
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  GRANARY_RETURN_IF_ERROR(state_.CheckIndex(index, "put"));
  const ChunkSegment& seg = state_.segments[index];
  if (bytes.size() != seg.length) {
    return Status::InvalidArgument(
        fmt::format("put segment {} (sample {}) of {}: got {} bytes, the segment is {} bytes",
                    index, seg.sample, state_.Describe(), bytes.size(), seg.length));
  }
  if (IsPresent(index)) {
    return Status::FailedPrecondition(
        fmt::format("put segment {} (sample {}) of {}: it is already present; Drop it first to "
                    "re-stage it",
                    index, seg.sample, state_.Describe()));
  }
  if (pending_[index]) {
    pending_[index] = false;  // its old bytes are about to be overwritten
    --pending_count_;
  }
  if (Status s = PwriteFull(state_.fd.get(), bytes.data(), bytes.size(),
                            uint64_t{state_.header_region_size} + seg.chunk_offset, state_.path);
      !s.ok()) {
    return Fail(std::move(s));  // part of the write may have landed over pending bytes
  }
  state_.checksums[index] = Checksum64(bytes);
  if (pending_count_ == 0) {
    pending_lo_ = pending_hi_ = index;
  } else {
    pending_lo_ = std::min(pending_lo_, index);
    pending_hi_ = std::max(pending_hi_, index);
  }
  pending_[index] = true;
  ++pending_count_;
  return Status::Ok();
}

Status ChunkWriter::Commit() {
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  if (pending_count_ == 0) return Status::Ok();
  const uint32_t count = segment_count();
  const std::string doing = "commit " + state_.Describe();
  const int fd = state_.fd.get();

  // 1. Checksums of the pending range. Entries in between that are not pending
  //    are rewritten with the values already on disk.
  std::string sums;
  ByteWriter w(&sums);
  for (uint32_t i = pending_lo_; i <= pending_hi_; ++i) w.Put(state_.checksums[i]);
  if (Status s =
          PwriteFull(fd, sums.data(), sums.size(),
                     cf::ChecksumsOffset(count) + uint64_t{cf::kPayloadChecksumSize} * pending_lo_,
                     state_.path);
      !s.ok()) {
    return Fail(s.WithContext(doing));
  }
  // 2. Payload and checksums durable before any presence bit can be: a bit that
  //    reaches the disk always describes bytes that are already there.
  if (Status s = SyncData(fd, state_.path); !s.ok()) return Fail(s.WithContext(doing));

  // 3. The presence bits, as whole bytes of the bitmap.
  const uint32_t first_byte = pending_lo_ / 8;
  const uint32_t last_byte = pending_hi_ / 8;
  std::vector<uint8_t> bytes(state_.bitmap.begin() + first_byte,
                             state_.bitmap.begin() + last_byte + 1);
  uint32_t newly_present = 0;
  for (uint32_t i = pending_lo_; i <= pending_hi_; ++i) {
    if (!pending_[i]) continue;
    bytes[i / 8 - first_byte] =
        static_cast<uint8_t>(unsigned{bytes[i / 8 - first_byte]} | (1u << (i % 8)));
    ++newly_present;
  }
  if (Status s = PwriteFull(fd, bytes.data(), bytes.size(), cf::BitmapOffset(count) + first_byte,
                            state_.path);
      !s.ok()) {
    return Fail(s.WithContext(doing));
  }
  // 4. So that Commit returning means present after a crash too (the store
  //    reports staging progress from it).
  if (Status s = SyncData(fd, state_.path); !s.ok()) return Fail(s.WithContext(doing));

  std::copy(bytes.begin(), bytes.end(), state_.bitmap.begin() + first_byte);
  state_.present_count += newly_present;
  for (uint32_t i = pending_lo_; i <= pending_hi_; ++i) pending_[i] = false;
  pending_count_ = 0;
  return Status::Ok();
}

Status ChunkWriter::Drop(uint32_t index) {
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  GRANARY_RETURN_IF_ERROR(state_.CheckIndex(index, "drop"));
  if (pending_[index]) {
    pending_[index] = false;
    --pending_count_;
    return Status::Ok();
  }
  if (!IsPresent(index)) return Status::Ok();
  // Durable now, before a Put overwrites the payload: otherwise a crash could
  // leave the old bit set over half-new bytes (still caught by the checksum, but
  // present should mean intact).
  const std::string doing = fmt::format("drop segment {} of {}", index, state_.Describe());
  auto byte = static_cast<uint8_t>(unsigned{state_.bitmap[index / 8]} & ~(1u << (index % 8)));
  if (Status s = PwriteFull(state_.fd.get(), &byte, 1,
                            cf::BitmapOffset(segment_count()) + index / 8, state_.path);
      !s.ok()) {
    return Fail(s.WithContext(doing));
  }
  if (Status s = SyncData(state_.fd.get(), state_.path); !s.ok()) {
    return Fail(s.WithContext(doing));
  }
  state_.bitmap[index / 8] = byte;
  --state_.present_count;
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// ChunkReader

Result<ChunkReader> ChunkReader::Open(const std::string& path, const ChunkKey& expected,
                                      std::span<const ChunkSegment> expected_segments) {
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_RDONLY));
  GRANARY_ASSIGN_OR_RETURN(internal::ChunkFileState state, LoadChunkFile(std::move(fd), path));
  GRANARY_RETURN_IF_ERROR(CheckExpected(state, expected, expected_segments));
  return ChunkReader(std::move(state));
}

Result<ChunkReader> ChunkReader::FromFd(ScopedFd fd, const std::string& label,
                                        const ChunkKey& expected,
                                        std::span<const ChunkSegment> expected_segments) {
  GRANARY_ASSIGN_OR_RETURN(internal::ChunkFileState state, LoadChunkFile(std::move(fd), label));
  GRANARY_RETURN_IF_ERROR(CheckExpected(state, expected, expected_segments));
  return ChunkReader(std::move(state));
}

Result<ChunkFileHeader> ChunkReader::ReadHeader(const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_RDONLY));
  GRANARY_ASSIGN_OR_RETURN(internal::ChunkFileState state, LoadChunkFile(std::move(fd), path));
  ChunkFileHeader h;
  h.key = std::move(state.key);
  h.segments = std::move(state.segments);
  h.payload_size = state.payload_size;
  h.header_region_size = state.header_region_size;
  h.present_count = state.present_count;
  return h;
}

Status ChunkReader::Refresh() {
  const uint32_t count = segment_count();
  // Bitmap first: a writer makes checksums durable before it sets a bit, so
  // checksums read after a set bit are at least as new as that bit.
  std::vector<uint8_t> bitmap(state_.bitmap.size());
  GRANARY_RETURN_IF_ERROR(PreadFull(state_.fd.get(), bitmap.data(), bitmap.size(),
                                    cf::BitmapOffset(count), state_.path));
  GRANARY_RETURN_IF_ERROR(CheckBitmapTail(state_.path, bitmap, count));
  std::string sums(size_t{cf::kPayloadChecksumSize} * count, '\0');
  GRANARY_RETURN_IF_ERROR(PreadFull(state_.fd.get(), sums.data(), sums.size(),
                                    cf::ChecksumsOffset(count), state_.path));
  for (uint32_t i = 0; i < count; ++i) {
    state_.checksums[i] = LoadLe<uint64_t>(sums.data() + uint64_t{cf::kPayloadChecksumSize} * i);
  }
  state_.bitmap = std::move(bitmap);
  state_.present_count = CountPresent(state_.bitmap);
  return Status::Ok();
}

Result<uint64_t> ChunkReader::PayloadOffset(uint32_t index) const {
  GRANARY_RETURN_IF_ERROR(state_.CheckIndex(index, "locate"));
  return uint64_t{state_.header_region_size} + state_.segments[index].chunk_offset;
}

Status ChunkReader::Verify(uint32_t index, std::string_view bytes) const {
  GRANARY_RETURN_IF_ERROR(state_.CheckIndex(index, "verify"));
  const ChunkSegment& seg = state_.segments[index];
  uint64_t computed = Checksum64(bytes);
  if (bytes.size() == seg.length && computed == state_.checksums[index]) return Status::Ok();
  return Status::Corruption(fmt::format(
      "{}: segment {} (sample {}, bytes [{}, {}) of the sample) fails its checksum "
      "(stored {:016x}, computed {:016x} over {} bytes); drop the segment and re-stage it",
      state_.Describe(), index, seg.sample, seg.sample_offset, seg.sample_offset + seg.length,
      state_.checksums[index], computed, bytes.size()));
}

Status ChunkReader::Read(uint32_t index, std::span<char> out) const {
  GRANARY_RETURN_IF_ERROR(state_.CheckIndex(index, "read"));
  const ChunkSegment& seg = state_.segments[index];
  if (out.size() != seg.length) {
    return Status::InvalidArgument(
        fmt::format("read segment {} (sample {}) of {}: buffer is {} bytes, the segment is {}",
                    index, seg.sample, state_.Describe(), out.size(), seg.length));
  }
  if (!IsPresent(index)) {
    return Status::NotFound(
        fmt::format("read segment {} (sample {}) of {}: not staged yet; read it from the source",
                    index, seg.sample, state_.Describe()));
  }
  GRANARY_RETURN_IF_ERROR(PreadFull(state_.fd.get(), out.data(), out.size(),
                                    uint64_t{state_.header_region_size} + seg.chunk_offset,
                                    state_.path));
  return Verify(index, std::string_view(out.data(), out.size()));
}

Result<std::string> ChunkReader::Read(uint32_t index) const {
  GRANARY_RETURN_IF_ERROR(state_.CheckIndex(index, "read"));
  std::string out(state_.segments[index].length, '\0');
  GRANARY_RETURN_IF_ERROR(Read(index, std::span<char>(out.data(), out.size())));
  return out;
}

Result<ChunkScan> ChunkReader::Scan(ChunkScanMode mode) const {
  ChunkScan scan;
  const uint32_t count = segment_count();
  scan.valid.assign(count, false);
  std::string buffer;
  for (uint32_t i = 0; i < count; ++i) {
    if (!IsPresent(i)) continue;
    if (mode == ChunkScanMode::kVerifyPayload) {
      buffer.resize(state_.segments[i].length);
      Status s = Read(i, std::span<char>(buffer.data(), buffer.size()));
      if (s.code() == StatusCode::kCorruption) {
        scan.corrupt.push_back(i);
        continue;
      }
      GRANARY_RETURN_IF_ERROR(s);
    }
    scan.valid[i] = true;
    ++scan.valid_count;
  }
  return scan;
}

}  // namespace granary

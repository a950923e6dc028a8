#include "granary/core/chunk_file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/chunk_format.h"
#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::ReadAll;
using ::granary::testing::WriteAll;

namespace cf = chunk_format;
using ::granary::testing::TempDir;
using ::testing::HasSubstr;

const ChunkKey kKey{"imagenet-train", ContentId{0x0123456789abcdefull, 0xfedcba9876543210ull}, 42};

// Contiguous segments of whole samples, numbered from `first_sample`, as the
// manifest packs small samples.
std::vector<ChunkSegment> Packed(const std::vector<uint32_t>& lengths,
                                 SampleId first_sample = 100) {
  std::vector<ChunkSegment> segments;
  uint32_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    segments.push_back({first_sample + static_cast<SampleId>(i), 0, offset, lengths[i]});
    offset += lengths[i];
  }
  return segments;
}

// Deterministic bytes of one segment, different for every sample and offset.
std::string SegmentBytes(const ChunkSegment& s) {
  std::string out(s.length, '\0');
  uint64_t x = (uint64_t{s.sample} << 32) ^ s.sample_offset ^ 0x9e3779b97f4a7c15ull;
  for (auto& c : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  return out;
}

// Makes a hand-edited header region consistent again, so that a test reaches
// the checks behind the layout checksum.
void FixLayoutChecksum(std::string* file) {
  auto count = LoadLe<uint32_t>(file->data() + cf::kSegmentCountOffset);
  uint64_t seed = Checksum64(file->data(), cf::kLayoutChecksummedFixedBytes);
  uint64_t sum =
      Hash64(file->data() + cf::kFixedHeaderSize, size_t{cf::kSegmentEntrySize} * count, seed);
  StoreLe(file->data() + cf::kLayoutChecksumOffset, sum);
}

// Creates a chunk at `path` and commits the segments whose index is in `fill`
// (all if empty and `fill_all`).
void MakeChunk(const std::string& path, const std::vector<ChunkSegment>& segments,
               const std::vector<uint32_t>& fill, const ChunkKey& key = kKey) {
  auto w = ChunkWriter::Create(path, key, segments);
  ASSERT_OK(w);
  for (uint32_t i : fill) ASSERT_OK(w->Put(i, SegmentBytes(segments[i])));
  ASSERT_OK(w->Commit());
}

std::vector<uint32_t> All(const std::vector<ChunkSegment>& segments) {
  std::vector<uint32_t> all;
  for (uint32_t i = 0; i < segments.size(); ++i) all.push_back(i);
  return all;
}

void ExpectAllReadable(const ChunkReader& r) {
  for (uint32_t i = 0; i < r.segment_count(); ++i) {
    auto bytes = r.Read(i);
    ASSERT_OK(bytes);
    EXPECT_EQ(*bytes, SegmentBytes(r.segments()[i])) << "segment " << i;
  }
}

class ChunkFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name = "c42.chunk") const { return dir_.Join(name); }
  TempDir dir_;
};

TEST_F(ChunkFileTest, WholeChunkRoundTrip) {
  auto segments = Packed({1000, 1, 0, 4097, 77, 65536});
  auto w = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w);
  EXPECT_EQ(w->segment_count(), 6u);
  EXPECT_EQ(w->present_count(), 0u);
  for (uint32_t i = 0; i < segments.size(); ++i) ASSERT_OK(w->Put(i, SegmentBytes(segments[i])));
  EXPECT_EQ(w->pending_count(), 6u);
  EXPECT_EQ(w->present_count(), 0u);
  ASSERT_OK(w->Commit());
  EXPECT_TRUE(w->complete());
  EXPECT_EQ(w->pending_count(), 0u);

  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 6u);
  EXPECT_EQ(r->key(), kKey);
  ExpectAllReadable(*r);

  // The payload starts page-aligned right after the header region, and the
  // file is exactly header region + payload.
  uint64_t payload = 1000 + 1 + 0 + 4097 + 77 + 65536;
  EXPECT_EQ(std::filesystem::file_size(Path()), cf::HeaderRegionSize(6) + payload);
  auto off = r->PayloadOffset(3);
  ASSERT_OK(off);
  EXPECT_EQ(*off, 4096u + 1001u);
}

TEST_F(ChunkFileTest, CreatedFileIsPrivateAndLeavesNoTemporaries) {
  MakeChunk(Path(), Packed({10, 20}), {});
  struct stat st {};
  ASSERT_EQ(::stat(Path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path())) ++entries;
  EXPECT_EQ(entries, 1u);
}

TEST_F(ChunkFileTest, SampleBySampleFillIsVisibleAfterEachCommit) {
  auto segments = Packed({300, 200, 100, 50, 25, 12, 6, 3, 1, 400});  // bitmap spans 2 bytes
  auto w = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w);
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  // Out of order, as on-demand fills arrive.
  std::vector<uint32_t> order{9, 0, 5, 7, 8, 1, 2, 3, 4, 6};
  uint32_t done = 0;
  for (uint32_t i : order) {
    ASSERT_OK(w->Put(i, SegmentBytes(segments[i])));
    ASSERT_OK(w->Commit());
    ++done;
    EXPECT_TRUE(w->IsPresent(i));
    EXPECT_EQ(w->present_count(), done);
    EXPECT_FALSE(r->IsPresent(i)) << "a reader sees commits only after Refresh";
    ASSERT_OK(r->Refresh());
    EXPECT_TRUE(r->IsPresent(i));
    EXPECT_EQ(r->present_count(), done);
    auto bytes = r->Read(i);
    ASSERT_OK(bytes);
    EXPECT_EQ(*bytes, SegmentBytes(segments[i]));
  }
  EXPECT_TRUE(w->complete());
  ExpectAllReadable(*r);
}

TEST_F(ChunkFileTest, ReopenAndContinueFilling) {
  auto segments = Packed({111, 222, 333, 444, 555});
  MakeChunk(Path(), segments, {0, 2});
  {
    auto w = ChunkWriter::Open(Path(), kKey, segments);
    ASSERT_OK(w);
    EXPECT_EQ(w->present_count(), 2u);
    EXPECT_TRUE(w->IsPresent(0));
    EXPECT_FALSE(w->IsPresent(1));
    EXPECT_TRUE(w->IsPresent(2));
    ASSERT_OK(w->Put(1, SegmentBytes(segments[1])));
    ASSERT_OK(w->Put(4, SegmentBytes(segments[4])));
    ASSERT_OK(w->Commit());
  }
  {
    auto w = ChunkWriter::Open(Path(), kKey, segments);
    ASSERT_OK(w);
    EXPECT_EQ(w->present_count(), 4u);
    ASSERT_OK(w->Put(3, SegmentBytes(segments[3])));
    ASSERT_OK(w->Commit());
    EXPECT_TRUE(w->complete());
  }
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 5u);
  ExpectAllReadable(*r);
}

TEST_F(ChunkFileTest, PutWithoutCommitIsNotPresentAfterReopen) {
  auto segments = Packed({64, 64, 64});
  {
    auto w = ChunkWriter::Create(Path(), kKey, segments);
    ASSERT_OK(w);
    ASSERT_OK(w->Put(0, SegmentBytes(segments[0])));
    ASSERT_OK(w->Commit());
    ASSERT_OK(w->Put(1, SegmentBytes(segments[1])));
    EXPECT_TRUE(w->IsPending(1));
    EXPECT_FALSE(w->IsPresent(1));
    // The "crash": the writer goes away without committing.
  }
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_TRUE(r->IsPresent(0));
  EXPECT_FALSE(r->IsPresent(1));
  EXPECT_EQ(r->present_count(), 1u);
  EXPECT_EQ(r->Read(1).status().code(), StatusCode::kNotFound);

  // The lost segment can be filled again.
  auto w = ChunkWriter::Open(Path(), kKey, segments);
  ASSERT_OK(w);
  ASSERT_OK(w->Put(1, SegmentBytes(segments[1])));
  ASSERT_OK(w->Commit());
  ASSERT_OK(r->Refresh());
  auto bytes = r->Read(1);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, SegmentBytes(segments[1]));
}

TEST_F(ChunkFileTest, CrashAfterChecksumsBeforeBitsLeavesSegmentAbsent) {
  // What the disk holds if the crash came between Commit's two syncs: payload
  // and checksum written, presence bit not.
  auto segments = Packed({500, 500});
  MakeChunk(Path(), segments, {0, 1});
  std::string file = ReadAll(Path());
  file[cf::BitmapOffset(2)] = 0;
  WriteAll(Path(), file);
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 0u);
  EXPECT_EQ(r->Read(0).status().code(), StatusCode::kNotFound);
}

TEST_F(ChunkFileTest, OverwrittenPayloadOfPresentSegmentIsDetected) {
  auto segments = Packed({4000, 3000, 2000});
  MakeChunk(Path(), segments, All(segments));
  {
    // Present bit durable, then the payload changes under it (a torn
    // re-stage, a misdirected write, media damage).
    auto fd = OpenFile(Path(), O_WRONLY);
    ASSERT_OK(fd);
    std::string junk(100, 'x');
    ASSERT_OK(PwriteFull(fd->get(), junk.data(), junk.size(), 4096 + 4000 + 1500, "test"));
  }
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_TRUE(r->IsPresent(1));
  auto bytes = r->Read(1);
  ASSERT_EQ(bytes.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(bytes.status().message(), HasSubstr("segment 1 (sample 101"));
  EXPECT_THAT(bytes.status().message(), HasSubstr("chunk 42"));
  EXPECT_THAT(bytes.status().message(), HasSubstr(Path()));
  EXPECT_THAT(bytes.status().message(), HasSubstr("re-stage"));
  ASSERT_OK(r->Read(0));
  ASSERT_OK(r->Read(2));

  auto quick = r->Scan(ChunkScanMode::kPresence);
  ASSERT_OK(quick);
  EXPECT_EQ(quick->valid_count, 3u);
  auto full = r->Scan(ChunkScanMode::kVerifyPayload);
  ASSERT_OK(full);
  EXPECT_EQ(full->valid_count, 2u);
  EXPECT_EQ(full->valid, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(full->corrupt, std::vector<uint32_t>{1});

  // The store's recovery: drop, re-stage, commit.
  auto w = ChunkWriter::Open(Path(), kKey, segments);
  ASSERT_OK(w);
  EXPECT_EQ(w->Put(1, SegmentBytes(segments[1])).code(), StatusCode::kFailedPrecondition);
  ASSERT_OK(w->Drop(1));
  EXPECT_FALSE(w->IsPresent(1));
  EXPECT_EQ(w->present_count(), 2u);
  ASSERT_OK(r->Refresh());
  EXPECT_EQ(r->Read(1).status().code(), StatusCode::kNotFound);
  ASSERT_OK(w->Put(1, SegmentBytes(segments[1])));
  ASSERT_OK(w->Commit());
  ASSERT_OK(r->Refresh());
  ExpectAllReadable(*r);
}

// Makes writes at or past `limit` bytes into any file fail (EFBIG) while in
// scope: a real I/O error in the middle of a Commit, without a fault-injecting
// file layer.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(uint64_t limit) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lower = saved_;
    lower.rlim_cur = limit;
    ::setrlimit(RLIMIT_FSIZE, &lower);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  sighandler_t old_handler_;
};

TEST_F(ChunkFileTest, FailedPutPoisonsTheWriter) {
  auto segments = Packed({100, 100, 100});
  auto w = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w);
  ASSERT_OK(w->Put(0, SegmentBytes(segments[0])));
  Status failed;
  {
    // Segment 1's payload starts at 4096 + 100: half of it lands, then EFBIG.
    FileSizeLimit fail_writes(4096 + 150);
    failed = w->Put(1, SegmentBytes(segments[1]));
  }
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(w->Commit().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Put(2, SegmentBytes(segments[2])).code(), StatusCode::kFailedPrecondition);
  { ChunkWriter closed = std::move(*w); }
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 0u);
}

TEST_F(ChunkFileTest, FailedCommitPoisonsTheWriterAndLeavesSegmentsAbsent) {
  auto segments = Packed({100, 100, 100});
  const uint32_t n = 3;
  // Fail at each write of the commit: the checksums, then the presence bits.
  for (uint64_t limit : {cf::ChecksumsOffset(n) + 4, cf::BitmapOffset(n)}) {
    SCOPED_TRACE(limit);
    std::filesystem::remove(Path());
    auto w = ChunkWriter::Create(Path(), kKey, segments);
    ASSERT_OK(w);
    ASSERT_OK(w->Put(0, SegmentBytes(segments[0])));
    ASSERT_OK(w->Commit());
    ASSERT_OK(w->Put(1, SegmentBytes(segments[1])));
    Status failed;
    {
      FileSizeLimit fail_writes(limit);
      failed = w->Commit();
    }
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.message(), HasSubstr("commit chunk file"));
    EXPECT_FALSE(w->IsPresent(1));
    // Everything after is refused, though the disk works again.
    Status again = w->Commit();
    EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(again.message(), HasSubstr("reopen"));
    EXPECT_EQ(w->Put(2, SegmentBytes(segments[2])).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(w->Drop(0).code(), StatusCode::kFailedPrecondition);
    { ChunkWriter closed = std::move(*w); }

    auto r = ChunkReader::Open(Path(), kKey, segments);
    ASSERT_OK(r);
    EXPECT_TRUE(r->IsPresent(0));
    EXPECT_FALSE(r->IsPresent(1));
    ASSERT_OK(r->Read(0));
    auto w2 = ChunkWriter::Open(Path(), kKey, segments);
    ASSERT_OK(w2);
    ASSERT_OK(w2->Put(1, SegmentBytes(segments[1])));
    ASSERT_OK(w2->Commit());
    ASSERT_OK(r->Refresh());
    ASSERT_OK(r->Read(1));
  }
}

TEST_F(ChunkFileTest, DropOfPendingDiscardsThePut) {
  auto segments = Packed({10, 10});
  auto w = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w);
  ASSERT_OK(w->Put(0, SegmentBytes(segments[0])));
  ASSERT_OK(w->Drop(0));
  EXPECT_FALSE(w->IsPending(0));
  ASSERT_OK(w->Drop(1));  // absent: no-op
  ASSERT_OK(w->Commit());
  EXPECT_EQ(w->present_count(), 0u);
}

TEST_F(ChunkFileTest, PutTwiceBeforeCommitKeepsTheLastBytes) {
  auto segments = Packed({8});
  auto w = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w);
  ASSERT_OK(w->Put(0, "AAAAAAAA"));
  ASSERT_OK(w->Put(0, "BBBBBBBB"));
  EXPECT_EQ(w->pending_count(), 1u);
  ASSERT_OK(w->Commit());
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  auto bytes = r->Read(0);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, "BBBBBBBB");
}

TEST_F(ChunkFileTest, TruncatedOrExtendedFilesAreCorrupt) {
  auto segments = Packed({700, 300});
  MakeChunk(Path(), segments, All(segments));
  const std::string file = ReadAll(Path());
  ASSERT_EQ(file.size(), 4096u + 1000u);
  for (size_t len :
       {size_t{0}, size_t{1}, size_t{64}, size_t{127}, size_t{128}, size_t{129}, size_t{500},
        size_t{4095}, size_t{4096}, size_t{4097}, file.size() - 300, file.size() - 1}) {
    SCOPED_TRACE(len);
    WriteAll(Path("t.chunk"), file.substr(0, len));
    auto r = ChunkReader::Open(Path("t.chunk"), kKey, segments);
    ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
    EXPECT_THAT(r.status().message(), HasSubstr("t.chunk"));
    EXPECT_EQ(ChunkReader::ReadHeader(Path("t.chunk")).status().code(), StatusCode::kCorruption);
    EXPECT_EQ(ChunkWriter::Open(Path("t.chunk"), kKey, segments).status().code(),
              StatusCode::kCorruption);
  }
  WriteAll(Path("t.chunk"), file + "x");
  auto r = ChunkReader::Open(Path("t.chunk"), kKey, segments);
  ASSERT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(r.status().message(), HasSubstr("longer"));
}

TEST_F(ChunkFileTest, TruncationAfterOpenIsReportedOnRead) {
  auto segments = Packed({700, 300});
  MakeChunk(Path(), segments, All(segments));
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  std::filesystem::resize_file(Path(), 4096 + 800);
  ASSERT_OK(r->Read(0));
  EXPECT_EQ(r->Read(1).status().code(), StatusCode::kCorruption);
  auto scan = r->Scan(ChunkScanMode::kVerifyPayload);
  ASSERT_OK(scan);
  EXPECT_EQ(scan->corrupt, std::vector<uint32_t>{1});
}

// Every single-bit flip in the used header region, and in every payload byte,
// is either a failed open, a segment that fails verification, or a segment
// that is no longer present: never wrong bytes served.
TEST_F(ChunkFileTest, SingleBitFlipsAreDetected) {
  // 11 segments so the bitmap has a partly used second byte; 8 and 9 absent so
  // flips can also set bits.
  auto segments = Packed({40, 0, 33, 17, 64, 5, 1, 29, 12, 8, 50});
  std::vector<uint32_t> fill{0, 1, 2, 3, 4, 5, 6, 7, 10};
  MakeChunk(Path(), segments, fill);
  const std::string pristine = ReadAll(Path());
  const auto n = static_cast<uint32_t>(segments.size());
  const uint64_t used = cf::HeaderRegionUsedSize(n);
  const uint64_t region = cf::HeaderRegionSize(n);
  const std::string flipped_path = Path("flipped.chunk");

  auto segment_at_payload = [&](uint64_t payload_pos) -> uint32_t {
    for (uint32_t i = 0; i < n; ++i) {
      if (payload_pos >= segments[i].chunk_offset &&
          payload_pos < uint64_t{segments[i].chunk_offset} + segments[i].length) {
        return i;
      }
    }
    ADD_FAILURE() << "no segment at payload offset " << payload_pos;
    return 0;
  };

  std::vector<uint64_t> positions;
  for (uint64_t p = 0; p < used; ++p) positions.push_back(p);
  for (uint64_t p : {used, used + 1, region / 2, region - 1}) positions.push_back(p);  // padding
  for (uint64_t p = region; p < pristine.size(); ++p) positions.push_back(p);

  int open_failures = 0, verify_failures = 0, now_absent = 0;
  for (uint64_t pos : positions) {
    for (int bit : {static_cast<int>(pos % 8), static_cast<int>((pos + 5) % 8)}) {
      SCOPED_TRACE(::testing::Message() << "byte " << pos << " bit " << bit);
      std::string file = pristine;
      file[pos] = static_cast<char>(file[pos] ^ (1 << bit));
      WriteAll(flipped_path, file);
      auto r = ChunkReader::Open(flipped_path, kKey, segments);
      if (pos < cf::ChecksumsOffset(n) || (pos >= used && pos < region)) {
        // Fixed header, segment table, padding: the file is rejected.
        ASSERT_FALSE(r.ok());
        if (pos >= cf::kVersionOffset && pos < cf::kVersionOffset + 4) {
          EXPECT_EQ(r.status().code(), StatusCode::kVersionMismatch);
        } else {
          EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
        }
        ++open_failures;
        continue;
      }
      if (pos == cf::BitmapOffset(n) + 1 && bit >= 3) {
        // Bits past the last segment.
        ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
        ++open_failures;
        continue;
      }
      ASSERT_OK(r);
      // Segment whose state the flip touched.
      uint32_t hit;
      if (pos < cf::BitmapOffset(n)) {
        hit = static_cast<uint32_t>((pos - cf::ChecksumsOffset(n)) / 8);
      } else if (pos < used) {
        hit = static_cast<uint32_t>((pos - cf::BitmapOffset(n)) * 8 + static_cast<uint64_t>(bit));
      } else {
        hit = segment_at_payload(pos - region);
      }
      bool was_present = std::find(fill.begin(), fill.end(), hit) != fill.end();
      for (uint32_t i = 0; i < n; ++i) {
        auto bytes = r->Read(i);
        if (i != hit) {
          bool present = std::find(fill.begin(), fill.end(), i) != fill.end();
          if (present) {
            ASSERT_OK(bytes);
            EXPECT_EQ(*bytes, SegmentBytes(segments[i]));
          } else {
            EXPECT_EQ(bytes.status().code(), StatusCode::kNotFound);
          }
          continue;
        }
        if (bytes.ok()) {
          ADD_FAILURE() << "flip went unnoticed on segment " << i
                        << " (present before: " << was_present << ")";
        } else if (bytes.status().code() == StatusCode::kCorruption) {
          ++verify_failures;
        } else {
          EXPECT_EQ(bytes.status().code(), StatusCode::kNotFound);
          ++now_absent;
        }
      }
    }
  }
  // Each class of outcome happened (so the loop really covered each region).
  EXPECT_GT(open_failures, 700);
  EXPECT_GT(verify_failures, 500);
  EXPECT_GT(now_absent, 0);
}

TEST_F(ChunkFileTest, SetPresenceBitOfNeverFilledSegmentFailsVerification) {
  auto segments = Packed({100, 0, 100});
  MakeChunk(Path(), segments, {});
  std::string file = ReadAll(Path());
  file[cf::BitmapOffset(3)] = 0x07;
  WriteAll(Path(), file);
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->Read(i).status().code(), StatusCode::kCorruption) << "segment " << i;
  }
}

TEST_F(ChunkFileTest, WrongExpectationsNameWhatDiffers) {
  auto segments = Packed({10, 20, 30});
  MakeChunk(Path(), segments, All(segments));
  struct Case {
    ChunkKey key;
    std::vector<ChunkSegment> segments;
    std::string says;
  };
  ChunkKey other_dataset = kKey;
  other_dataset.dataset = "coco";
  ChunkKey other_manifest = kKey;
  other_manifest.manifest_id.low ^= 1;
  ChunkKey other_chunk = kKey;
  other_chunk.chunk = 43;
  auto fewer = Packed({10, 20});
  auto longer = Packed({10, 20, 31});
  auto other_sample = Packed({10, 20, 30}, 101);
  auto piece = segments;
  piece[2].sample_offset = 4096;
  std::vector<Case> cases{
      {other_dataset, segments, "dataset 'imagenet-train', expected 'coco'"},
      {other_manifest, segments, "manifest " + kKey.manifest_id.ToHex()},
      {other_chunk, segments, "chunk 42, expected 43"},
      {kKey, fewer, "3 segments, expected 2"},
      {kKey, longer, "segment 2 is (sample 102, sample_offset 0, chunk_offset 30, length 30)"},
      {kKey, other_sample, "segment 0 is (sample 100"},
      {kKey, piece, "expected (sample 102, sample_offset 4096"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    auto r = ChunkReader::Open(Path(), c.key, c.segments);
    ASSERT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(c.says));
    auto w = ChunkWriter::Open(Path(), c.key, c.segments);
    EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  }
}

TEST_F(ChunkFileTest, UnknownVersionIsVersionMismatch) {
  auto segments = Packed({10});
  MakeChunk(Path(), segments, All(segments));
  std::string file = ReadAll(Path());
  StoreLe(file.data() + cf::kVersionOffset, uint32_t{2});
  FixLayoutChecksum(&file);  // a well-formed file of a later format
  WriteAll(Path(), file);
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_EQ(r.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(r.status().message(), HasSubstr("version 2"));
  EXPECT_THAT(r.status().message(), HasSubstr("reads version 1"));
  EXPECT_EQ(ChunkReader::ReadHeader(Path()).status().code(), StatusCode::kVersionMismatch);
}

TEST_F(ChunkFileTest, NotAChunkFile) {
  std::string junk(8192, 'j');
  WriteAll(Path(), junk);
  auto r = ChunkReader::ReadHeader(Path());
  ASSERT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(r.status().message(), HasSubstr("bad magic"));
  EXPECT_EQ(ChunkReader::Open(Path("missing.chunk"), kKey, {}).status().code(),
            StatusCode::kNotFound);
}

// Inconsistencies behind a valid layout checksum: what a buggy writer (not
// damage) would produce. Each is a clean kCorruption.
TEST_F(ChunkFileTest, InconsistentHeadersBehindAValidChecksum) {
  auto segments = Packed({10, 20, 30});
  MakeChunk(Path(), segments, All(segments));
  const std::string pristine = ReadAll(Path());
  const uint64_t table = cf::SegmentTableOffset();
  struct Case {
    std::string name;
    std::function<void(std::string*)> edit;
    std::string says;
  };
  std::vector<Case> cases{
      {"flags", [](std::string* f) { (*f)[cf::kFlagsOffset] = 1; }, "flags"},
      {"reserved", [&](std::string* f) { (*f)[table + cf::kSegmentReservedOffset] = 1; },
       "reserved"},
      {"uppercase dataset", [](std::string* f) { (*f)[cf::kDatasetOffset] = 'I'; }, "DNS-1123"},
      {"junk after dataset NUL",
       [](std::string* f) { (*f)[cf::kDatasetOffset + cf::kDatasetFieldSize - 1] = 'x'; },
       "NUL-padded"},
      {"overlap",
       [&](std::string* f) {
         StoreLe(f->data() + table + cf::kSegmentEntrySize + cf::kSegmentChunkOffset, uint32_t{5});
       },
       "without overlap"},
      {"payload size",
       [](std::string* f) {
         StoreLe(f->data() + cf::kPayloadSizeOffset, uint64_t{59});
         f->pop_back();
       },
       "does not match the segment table"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string file = pristine;
    c.edit(&file);
    FixLayoutChecksum(&file);
    WriteAll(Path("bad.chunk"), file);
    auto r = ChunkReader::ReadHeader(Path("bad.chunk"));
    ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(c.says));
  }
}

TEST_F(ChunkFileTest, BogusCountsAreRejectedBeforeAllocating) {
  auto segments = Packed({10});
  MakeChunk(Path(), segments, All(segments));
  const std::string pristine = ReadAll(Path());
  struct Case {
    uint32_t count;
    uint32_t region_size;
    uint64_t payload_size;
    std::string says;
  };
  std::vector<Case> cases{
      {0xFFFFFFFFu, 4096, 10, "over the limit"},
      {cf::kMaxSegments + 1, 4096, 10, "over the limit"},
      // Consistent with each other but claiming ~540 MB the file does not have.
      {cf::kMaxSegments, static_cast<uint32_t>(cf::HeaderRegionSize(cf::kMaxSegments)), 10,
       "truncated"},
      {1, 8192, 10, "header region size 8192"},
      {1, 0, 10, "header region size 0"},
      {1, 4096, uint64_t{1} << 40, "payload size"},
      {1, 4096, UINT64_MAX, "payload size"},
      {1, 4096, 1u << 30, "truncated"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.says);
    std::string file = pristine;
    StoreLe(file.data() + cf::kSegmentCountOffset, c.count);
    StoreLe(file.data() + cf::kHeaderRegionSizeOffset, c.region_size);
    StoreLe(file.data() + cf::kPayloadSizeOffset, c.payload_size);
    WriteAll(Path("bad.chunk"), file);
    auto r = ChunkReader::ReadHeader(Path("bad.chunk"));
    ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(c.says));
  }
}

TEST_F(ChunkFileTest, ZeroLengthSegments) {
  auto segments = Packed({0, 5, 0, 0, 7, 0});
  MakeChunk(Path(), segments, All(segments));
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 6u);
  ExpectAllReadable(*r);
  auto empty = r->Read(0);
  ASSERT_OK(empty);
  EXPECT_EQ(*empty, "");
  ASSERT_OK(r->Read(3, std::span<char>()));

  // A chunk of nothing but empty samples has no payload at all.
  auto only_empty = Packed({0, 0, 0});
  MakeChunk(Path("empty.chunk"), only_empty, {0, 2});
  EXPECT_EQ(std::filesystem::file_size(Path("empty.chunk")), 4096u);
  auto r2 = ChunkReader::Open(Path("empty.chunk"), kKey, only_empty);
  ASSERT_OK(r2);
  EXPECT_EQ(r2->present_count(), 2u);
  ASSERT_OK(r2->Read(2));
  EXPECT_EQ(r2->Read(1).status().code(), StatusCode::kNotFound);
  // A flipped checksum of an empty segment is still caught.
  std::string file = ReadAll(Path("empty.chunk"));
  file[cf::ChecksumsOffset(3) + 2 * 8 + 3] ^= 0x10;
  WriteAll(Path("empty.chunk"), file);
  auto r3 = ChunkReader::Open(Path("empty.chunk"), kKey, only_empty);
  ASSERT_OK(r3);
  EXPECT_EQ(r3->Read(2).status().code(), StatusCode::kCorruption);
}

TEST_F(ChunkFileTest, NoSegmentsAtAll) {
  MakeChunk(Path(), {}, {});
  auto r = ChunkReader::Open(Path(), kKey, {});
  ASSERT_OK(r);
  EXPECT_EQ(r->segment_count(), 0u);
  EXPECT_EQ(r->Read(0).status().code(), StatusCode::kInvalidArgument);
  auto scan = r->Scan(ChunkScanMode::kVerifyPayload);
  ASSERT_OK(scan);
  EXPECT_TRUE(scan->valid.empty());
}

TEST_F(ChunkFileTest, PieceOfALargeSample) {
  // The third 256 KiB piece of a large sample, as the manifest lays it out.
  const uint32_t chunk_size = 256 << 10;
  std::vector<ChunkSegment> segments{{7, 2ull * chunk_size, 0, chunk_size}};
  ChunkKey key = kKey;
  key.chunk = 9;
  MakeChunk(Path(), segments, {0}, key);
  auto header = ChunkReader::ReadHeader(Path());
  ASSERT_OK(header);
  EXPECT_EQ(header->key, key);
  EXPECT_EQ(header->segments, segments);
  EXPECT_EQ(header->payload_size, chunk_size);
  EXPECT_EQ(header->present_count, 1u);
  auto r = ChunkReader::Open(Path(), key, segments);
  ASSERT_OK(r);
  ExpectAllReadable(*r);

  // A piece's error names where in the sample it is.
  std::string file = ReadAll(Path());
  file[4096 + 1000] ^= 1;
  WriteAll(Path(), file);
  auto r2 = ChunkReader::Open(Path(), key, segments);
  ASSERT_OK(r2);
  auto bytes = r2->Read(0);
  ASSERT_EQ(bytes.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(bytes.status().message(), HasSubstr("sample 7, bytes [524288, 786432)"));
}

TEST_F(ChunkFileTest, ReadHeaderReportsWhatTheFileHolds) {
  auto segments = Packed({3, 4, 5}, 1000);
  MakeChunk(Path(), segments, {1});
  auto h = ChunkReader::ReadHeader(Path());
  ASSERT_OK(h);
  EXPECT_EQ(h->key, kKey);
  EXPECT_EQ(h->segments, segments);
  EXPECT_EQ(h->payload_size, 12u);
  EXPECT_EQ(h->header_region_size, 4096u);
  EXPECT_EQ(h->present_count, 1u);
}

TEST_F(ChunkFileTest, PayloadOffsetAndVerifyForZeroCopyServers) {
  auto segments = Packed({123, 456});
  MakeChunk(Path(), segments, All(segments));
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  auto off = r->PayloadOffset(1);
  ASSERT_OK(off);
  std::string buf(456, '\0');
  ASSERT_OK(PreadFull(r->fd(), buf.data(), buf.size(), *off, "test"));
  EXPECT_EQ(buf, SegmentBytes(segments[1]));
  ASSERT_OK(r->Verify(1, buf));
  buf[0] ^= 1;
  EXPECT_EQ(r->Verify(1, buf).code(), StatusCode::kCorruption);
  EXPECT_EQ(r->Verify(1, buf.substr(1)).code(), StatusCode::kCorruption);
  EXPECT_EQ(r->PayloadOffset(2).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ChunkFileTest, BadArguments) {
  auto segments = Packed({10, 20});
  auto w = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w);
  EXPECT_EQ(w->Put(2, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Put(UINT32_MAX, "x").code(), StatusCode::kInvalidArgument);
  Status s = w->Put(0, "short");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("got 5 bytes, the segment is 10 bytes"));
  EXPECT_EQ(w->Put(0, std::string(11, 'x')).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Drop(2).code(), StatusCode::kInvalidArgument);
  ASSERT_OK(w->Put(0, SegmentBytes(segments[0])));
  ASSERT_OK(w->Commit());
  ASSERT_OK(w->Commit());  // nothing pending: no-op

  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->Read(2).status().code(), StatusCode::kInvalidArgument);
  std::string small(9, '\0');
  EXPECT_EQ(r->Read(0, std::span<char>(small.data(), small.size())).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(r->Verify(5, "").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(r->IsPresent(2));
  EXPECT_FALSE(r->IsPresent(UINT32_MAX));
}

TEST_F(ChunkFileTest, CreateRejectsBadKeysAndGeometry) {
  auto ok_segments = Packed({10});
  for (const std::string& name :
       std::vector<std::string>{"", "Upper", "-lead", "trail-", "under_score", "dot.ted",
                                std::string(64, 'a'), std::string("nul\0x", 5)}) {
    SCOPED_TRACE(name);
    ChunkKey key = kKey;
    key.dataset = name;
    auto w = ChunkWriter::Create(Path(), key, ok_segments);
    ASSERT_EQ(w.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(w.status().message(), HasSubstr("DNS-1123"));
  }
  ChunkKey longest = kKey;
  longest.dataset = std::string(63, 'z');
  MakeChunk(Path("longest.chunk"), ok_segments, {0}, longest);
  ASSERT_OK(ChunkReader::Open(Path("longest.chunk"), longest, ok_segments));

  std::vector<std::vector<ChunkSegment>> bad{
      {{1, 0, 0, 10}, {2, 0, 5, 10}},   // overlap
      {{1, 0, 10, 10}, {2, 0, 0, 10}},  // not in payload order
      {{1, 0, (1u << 30) - 4, 5}},      // ends past 1 GiB
      {{1, UINT64_MAX - 3, 0, 5}},      // sample offset overflows
  };
  for (const auto& segments : bad) {
    auto w = ChunkWriter::Create(Path(), kKey, segments);
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().ToString();
  }
  EXPECT_FALSE(std::filesystem::exists(Path()));
  // Gaps between segments are allowed; the bytes in a gap are never read.
  std::vector<ChunkSegment> gapped{{1, 0, 0, 10}, {2, 0, 100, 10}};
  MakeChunk(Path("gapped.chunk"), gapped, All(gapped));
  auto r = ChunkReader::Open(Path("gapped.chunk"), kKey, gapped);
  ASSERT_OK(r);
  ExpectAllReadable(*r);
}

TEST_F(ChunkFileTest, CreateNeverReplacesAnExistingChunk) {
  auto segments = Packed({10});
  MakeChunk(Path(), segments, {0});
  auto again = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("ChunkWriter::Open"));
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 1u);
  EXPECT_EQ(ChunkWriter::Create(dir_.Join("no/such/dir/c.chunk"), kKey, segments).status().code(),
            StatusCode::kNotFound);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path())) ++entries;
  EXPECT_EQ(entries, 1u) << "a failed create leaves no temporary file";
}

TEST_F(ChunkFileTest, OneWriterPerFile) {
  auto segments = Packed({10});
  auto w1 = ChunkWriter::Create(Path(), kKey, segments);
  ASSERT_OK(w1);
  auto w2 = ChunkWriter::Open(Path(), kKey, segments);
  ASSERT_EQ(w2.status().code(), StatusCode::kUnavailable);
  // Readers are not blocked.
  ASSERT_OK(ChunkReader::Open(Path(), kKey, segments));
  { ChunkWriter gone = std::move(*w1); }
  ASSERT_OK(ChunkWriter::Open(Path(), kKey, segments));
}

TEST_F(ChunkFileTest, SparseWhenNotPreallocated) {
  auto segments = Packed({1u << 20});
  ChunkCreateOptions options;
  options.preallocate = false;
  ASSERT_OK(ChunkWriter::Create(Path(), kKey, segments, options));
  struct stat st {};
  ASSERT_EQ(::stat(Path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4096u + (1u << 20));
  auto r = ChunkReader::Open(Path(), kKey, segments);
  ASSERT_OK(r);
  EXPECT_EQ(r->present_count(), 0u);
}

// Seeds for tests/fuzz/chunk_fuzz.cc: valid chunk files and near misses. This
// test checks what each one is; with GRANARY_CHUNK_CORPUS_OUT set it also
// writes them there, which is how tests/fuzz/corpus/chunk/ is regenerated:
//   GRANARY_CHUNK_CORPUS_OUT=$PWD/tests/fuzz/corpus/chunk
//   build/debug/tests/chunk_file_test --gtest_filter='*SeedCorpus*'
// Files whose layout checksum is zero are fixed up by the fuzzer before
// parsing (see chunk_fuzz.cc), so mutations of them reach the table checks.
TEST_F(ChunkFileTest, SeedCorpus) {
  struct Seed {
    std::string file;
    StatusCode open;  // ReadHeader's outcome, after the fuzzer's fix-up
  };
  std::map<std::string, Seed> seeds;
  auto make = [&](const std::string& name, const std::vector<ChunkSegment>& segments,
                  const std::vector<uint32_t>& fill) {
    MakeChunk(Path(name), segments, fill);
    return ReadAll(Path(name));
  };
  auto zero_sum = [](std::string f) {
    StoreLe(f.data() + cf::kLayoutChecksumOffset, uint64_t{0});
    return f;
  };
  const std::string none = make("none", {}, {});
  const std::string absent = make("absent", Packed({30, 20, 10}), {});
  const std::string full = make("full", Packed({64, 0, 33, 100, 7}), {0, 1, 2, 3, 4});
  const std::string partial =
      make("partial", Packed({9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11}), {0, 2, 3, 7, 8, 10});
  const std::string piece = make("piece", {{3, 1ull << 20, 0, 700}}, {0});
  seeds["empty-chunk"] = {none, StatusCode::kOk};
  seeds["absent-3"] = {absent, StatusCode::kOk};
  seeds["full-5"] = {full, StatusCode::kOk};
  seeds["partial-11"] = {partial, StatusCode::kOk};
  seeds["large-piece"] = {piece, StatusCode::kOk};
  seeds["fixup-full-5"] = {zero_sum(full), StatusCode::kOk};
  seeds["fixup-partial-11"] = {zero_sum(partial), StatusCode::kOk};
  {
    std::string f = zero_sum(full);
    StoreLe(f.data() + cf::SegmentTableOffset() + cf::kSegmentEntrySize + cf::kSegmentChunkOffset,
            uint32_t{3});
    seeds["fixup-overlap"] = {f, StatusCode::kCorruption};
  }
  seeds["truncated"] = {full.substr(0, full.size() - 1), StatusCode::kCorruption};
  seeds["header-only"] = {full.substr(0, cf::kFixedHeaderSize), StatusCode::kCorruption};
  {
    std::string f = full;
    StoreLe(f.data() + cf::kVersionOffset, uint32_t{2});
    seeds["version-2"] = {f, StatusCode::kVersionMismatch};
  }
  {
    std::string f = full;
    f[f.size() - 3] ^= 0x40;
    seeds["payload-flip"] = {f, StatusCode::kOk};  // opens; segment 4 fails on read
  }
  {
    std::string f = partial;
    f[cf::BitmapOffset(11) + 1] = static_cast<char>(f[cf::BitmapOffset(11) + 1] | 0x80);
    seeds["stray-bitmap-bit"] = {f, StatusCode::kCorruption};
  }
  {
    std::string f = absent;
    f[cf::BitmapOffset(3)] = 0x07;  // present, but checksums are zero
    seeds["present-never-filled"] = {f, StatusCode::kOk};
  }

  const char* out = std::getenv("GRANARY_CHUNK_CORPUS_OUT");
  for (const auto& [name, seed] : seeds) {
    SCOPED_TRACE(name);
    std::string file = seed.file;
    if (file.size() >= cf::kFixedHeaderSize &&
        LoadLe<uint64_t>(file.data() + cf::kLayoutChecksumOffset) == 0) {
      FixLayoutChecksum(&file);
    }
    WriteAll(Path("seed"), file);
    EXPECT_EQ(ChunkReader::ReadHeader(Path("seed")).status().code(), seed.open);
    if (out != nullptr) {
      std::filesystem::create_directories(out);
      WriteAll(std::string(out) + "/" + name, seed.file);
    }
  }
}

}  // namespace
}  // namespace granary

namespace granary {
namespace {

TEST_F(ChunkFileTest, FromFdChecksLikeOpenAndReadsThroughTheDescriptor) {
  auto segments = Packed({300, 5000, 17});
  MakeChunk(Path(), segments, {0, 2});
  auto fd = OpenFile(Path(), O_RDONLY);
  ASSERT_OK(fd);
  auto r = ChunkReader::FromFd(std::move(*fd), "handed chunk", kKey, segments);
  ASSERT_OK(r);
  EXPECT_TRUE(r->IsPresent(0));
  EXPECT_FALSE(r->IsPresent(1));
  std::string out(300, '\0');
  ASSERT_OK(r->Read(0, std::span<char>(out.data(), out.size())));
  EXPECT_EQ(out, SegmentBytes(segments[0]));
  EXPECT_EQ(r->checksum(0), Checksum64(out));
  EXPECT_EQ(r->Read(1).status().code(), StatusCode::kNotFound);

  // Another chunk's key, or other segments: the file is not this chunk.
  ChunkKey other = kKey;
  other.chunk = 43;
  auto fd2 = OpenFile(Path(), O_RDONLY);
  ASSERT_OK(fd2);
  auto wrong = ChunkReader::FromFd(std::move(*fd2), "handed chunk", other, segments);
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(), HasSubstr("handed chunk"));

  // A file that is not a chunk at all.
  WriteAll(Path("junk"), std::string(4096, 'x'));
  auto fd3 = OpenFile(Path("junk"), O_RDONLY);
  ASSERT_OK(fd3);
  EXPECT_EQ(ChunkReader::FromFd(std::move(*fd3), "junk", kKey, segments).status().code(),
            StatusCode::kCorruption);
}

}  // namespace
}  // namespace granary

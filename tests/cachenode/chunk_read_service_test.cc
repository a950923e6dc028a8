// The cache node's ReadService over its chunk store and stager, on real files:
// a generated source tree (small files and a few larger than a chunk, 64 KiB
// chunks), a real PosixSource, ChunkStore and Stager in temporary directories,
// and the real Server + PeerClient on 127.0.0.1. Batched reads equal the
// source; unstaged samples come on demand; a flipped payload byte is detected,
// counted, served correct and re-staged; changed source files and bad ids are
// per-item errors; unknown datasets fail the request and the connection keeps
// serving; concurrent readers get the right bytes.

#include "granary/cachenode/chunk_read_service.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granary/cachenode/server.h"
#include "granary/core/hash.h"
#include "granary/core/names.h"
#include "granary/peer/peer_client.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "testing/source_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

namespace fs = std::filesystem;
using ::granary::testing::Bytes;
using ::granary::testing::FirstChunkWithSegments;
using ::granary::testing::OpenPosixSourceAsProcess;
using ::granary::testing::ScriptedSource;
using ::granary::testing::SnapshotTree;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kChunkSize = 64 << 10;
constexpr char kDataset[] = "imagenet";

class ChunkReadServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = IdentityExecutor::Start({.threads = 4});
    ASSERT_OK(e);
    executor_ = std::move(*e);
    root_ = dir_.Join("source");
    std::mt19937 rng(7);
    for (int i = 0; i < 200; ++i) {
      Write("d" + std::to_string(i % 5) + "/f" + std::to_string(i) + ".bin", 1 + rng() % 5000);
    }
    Write("big/a.bin", 150'000);  // three pieces
    Write("big/b.bin", 70'000);   // two pieces
    auto m = SnapshotTree(root_, kChunkSize);
    ASSERT_OK(m);
    manifest_ = std::move(*m);
    ASSERT_GT(manifest_->chunk_count(), 8u);

    auto s = OpenPosixSourceAsProcess(root_, executor_.get());
    ASSERT_OK(s);
    source_ = std::make_shared<ScriptedSource>(std::move(*s));
    auto store = ChunkStore::Open(dir_.Join("store"), 1ull << 30);
    ASSERT_OK(store);
    store_ = std::move(*store);
    ChunkReadServiceOptions so;
    so.node_name = "node-a";
    service_ = std::make_shared<ChunkReadService>(store_, so);
  }
  void TearDown() override {
    if (source_ != nullptr) source_->Open();  // never join a worker held at the gate
    service_.reset();
    stager_.reset();
  }

  void Write(const std::string& rel, size_t size) {
    sizes_[rel] = size;
    dir_.WriteFile("source/" + rel, Bytes(rel, size));
  }
  std::string Expected(SampleId id) const {
    const std::string path = manifest_->PathOf(id);
    return Bytes(path, sizes_.at(path));
  }
  std::string ChunkPayload(ChunkId chunk) const {
    std::string out;
    const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk);
    for (const ChunkSegment& s : segments) {
      out += Expected(s.sample).substr(s.sample_offset, s.length);
    }
    return out;
  }

  // A stager owning `owned` (all chunks if empty), registered with the service.
  void Serve(std::vector<ChunkId> owned = {}, bool start = false) {
    if (owned.empty()) {
      for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) owned.push_back(c);
    }
    StagerOptions o;
    o.dataset = kDataset;
    o.threads = 2;
    auto s = Stager::Create(manifest_, source_, store_, owned, o);
    ASSERT_OK(s);
    stager_ = std::shared_ptr<Stager>(std::move(*s));
    ASSERT_OK(service_->Add(manifest_, stager_));
    if (start) {
      ASSERT_OK(stager_->Start());
      ASSERT_TRUE(
          WaitFor([&] { return stager_->Progress().state == StagingState::kComplete; }, 20s));
    }
  }

  ReadRequest Request(std::vector<ReadItem> items) const {
    ReadRequest r;
    r.dataset = kDataset;
    r.manifest_id = manifest_->id();
    r.items = std::move(items);
    return r;
  }
  static ReadItem Sample(SampleId id, uint64_t offset, uint32_t length) {
    return ReadItem{ReadKind::kSample, id, offset, length};
  }
  ReadItem WholeSample(SampleId id) const {
    return Sample(id, 0, static_cast<uint32_t>(manifest_->SizeOf(id)));
  }
  static ReadItem ChunkRange(ChunkId id, uint64_t offset, uint32_t length) {
    return ReadItem{ReadKind::kChunkRange, id, offset, length};
  }

  // The bytes of item `i` of an answer (all pieces are memory).
  static std::string ItemBytes(const ReadAnswer& answer, size_t i) {
    size_t piece = 0;
    for (size_t k = 0; k < i; ++k) {
      if (answer.reply().items[k].status.ok() && answer.reply().items[k].length > 0) ++piece;
    }
    const auto* view = std::get_if<std::string_view>(&answer.payload().at(piece));
    return view == nullptr ? std::string() : std::string(*view);
  }

  SampleId Find(const std::string& path) const {
    auto id = manifest_->Find(path);
    EXPECT_OK(id);
    return id.ok() ? *id : 0;
  }
  ChunkKey Key(ChunkId c) const { return ChunkKey{kDataset, manifest_->id(), c}; }
  // The index of sample `id`'s (first) segment in its chunk.
  uint32_t IndexOf(SampleId id) const {
    const std::vector<ChunkSegment> segments = *manifest_->Segments(manifest_->ChunkOf(id));
    uint32_t index = 0;
    while (segments[index].sample != id) ++index;
    return index;
  }
  // Flips one payload byte of a stored segment in its chunk file, behind the
  // store's back: its checksum no longer matches.
  void FlipPayloadByte(ChunkId chunk, uint32_t index) {
    auto segments = manifest_->Segments(chunk);
    ASSERT_OK(segments);
    auto reader = store_->OpenChunkReader(Key(chunk), *segments);
    ASSERT_OK(reader);
    auto offset = (*reader)->PayloadOffset(index);
    ASSERT_OK(offset);
    const int fd = ::open(store_->ChunkPath(Key(chunk)).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    const auto at = static_cast<off_t>(*offset + (*segments)[index].length / 2);
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte = static_cast<char>(byte ^ 0x40);
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ::close(fd);
    ASSERT_EQ((*reader)->Read(index).status().code(), StatusCode::kCorruption);
  }
  // Every segment of `chunk` is present and passes its checksum.
  void ExpectChunkIntact(ChunkId chunk) {
    auto segments = manifest_->Segments(chunk);
    ASSERT_OK(segments);
    auto reader = store_->OpenChunkReader(Key(chunk), *segments);
    ASSERT_OK(reader);
    auto scan = (*reader)->Scan(ChunkScanMode::kVerifyPayload);
    ASSERT_OK(scan);
    EXPECT_TRUE(scan->corrupt.empty()) << "chunk " << chunk;
    EXPECT_EQ((*reader)->present_count(), (*reader)->segment_count()) << "chunk " << chunk;
  }

  TempDir dir_;
  std::string root_;
  std::map<std::string, size_t> sizes_;
  std::unique_ptr<IdentityExecutor> executor_;
  std::shared_ptr<const Manifest> manifest_;
  std::shared_ptr<ScriptedSource> source_;
  std::shared_ptr<ChunkStore> store_;
  std::shared_ptr<Stager> stager_;
  std::shared_ptr<ChunkReadService> service_;
};

TEST_F(ChunkReadServiceTest, BatchedReadOfStagedSamplesEqualsTheSource) {
  Serve({}, /*start=*/true);
  std::vector<ReadItem> items;
  for (SampleId id = 0; id < manifest_->sample_count(); ++id) items.push_back(WholeSample(id));
  auto answer = service_->Read(Request(items));
  ASSERT_OK(answer);
  ASSERT_EQ(answer->item_count(), items.size());
  for (SampleId id = 0; id < manifest_->sample_count(); ++id) {
    const ReadReplyItem& item = answer->reply().items[id];
    ASSERT_OK(item.status);
    ASSERT_EQ(item.length, manifest_->SizeOf(id));
    const std::string bytes = ItemBytes(*answer, id);
    EXPECT_EQ(bytes, Expected(id)) << "sample " << id;
    EXPECT_EQ(item.checksum, Checksum64(bytes));
  }
  const ChunkReadServiceCounters c = service_->Counters();
  EXPECT_EQ(c.items_from_disk, manifest_->sample_count());
  EXPECT_EQ(c.items_on_demand, 0u);
  EXPECT_EQ(c.checksum_failures, 0u);
}

// verify_once: a whole sample that is one stored segment is read and
// verified once, then answered as a file range of its chunk file (sendfile)
// with the stored checksum; parts of samples, samples over several chunks and
// a service without verify_once always read. The file range's bytes are the
// source's; bytes that rot after the check keep the stored checksum, which
// is what a reader checks them against.
TEST_F(ChunkReadServiceTest, VerifyOnceServesVerifiedSegmentsAsFileRanges) {
  ChunkReadServiceOptions so;
  so.node_name = "node-a";
  so.verify_once = true;
  service_ = std::make_shared<ChunkReadService>(store_, so);
  Serve({}, /*start=*/true);
  const SampleId small = 3;
  const SampleId big = Find("big/a.bin");
  ASSERT_LE(manifest_->SizeOf(small), manifest_->chunk_size());
  const std::vector<ReadItem> items = {
      WholeSample(small), WholeSample(big),
      Sample(small, 1, static_cast<uint32_t>(manifest_->SizeOf(small) - 1))};
  auto first = service_->Read(Request(items));
  ASSERT_OK(first);
  for (const PayloadPiece& piece : first->payload()) {
    EXPECT_TRUE(std::holds_alternative<std::string_view>(piece)) << "the first read verifies";
  }
  EXPECT_EQ(service_->Counters().items_sendfile, 0u);

  auto second = service_->Read(Request(items));
  ASSERT_OK(second);
  ASSERT_EQ(second->item_count(), 3u);
  for (size_t i = 0; i < 3; ++i) ASSERT_OK(second->reply().items[i].status);
  // Item 0: one file range with the stored (= the source's) checksum.
  const auto* range = std::get_if<FileRange>(&second->payload().at(0));
  ASSERT_NE(range, nullptr) << "a verified whole segment goes as a file range";
  std::string bytes(range->length, '\0');
  ASSERT_EQ(::pread(range->fd, bytes.data(), bytes.size(), static_cast<off_t>(range->offset)),
            static_cast<ssize_t>(bytes.size()));
  EXPECT_EQ(bytes, Expected(small));
  EXPECT_EQ(second->reply().items[0].checksum, Checksum64(Expected(small)));
  // The big sample (three chunks) and the partial item are read as before.
  for (size_t p = 1; p < second->payload().size(); ++p) {
    EXPECT_TRUE(std::holds_alternative<std::string_view>(second->payload()[p])) << p;
  }
  EXPECT_EQ(ItemBytes(*second, 2), Expected(small).substr(1));
  EXPECT_EQ(service_->Counters().items_sendfile, 1u);

  // Rot after the check: still a file range, still the stored checksum, so
  // the bytes no longer match it and a reader's check refuses them.
  FlipPayloadByte(manifest_->ChunkOf(small), IndexOf(small));
  auto third = service_->Read(Request({WholeSample(small)}));
  ASSERT_OK(third);
  range = std::get_if<FileRange>(&third->payload().at(0));
  ASSERT_NE(range, nullptr);
  ASSERT_EQ(::pread(range->fd, bytes.data(), bytes.size(), static_cast<off_t>(range->offset)),
            static_cast<ssize_t>(bytes.size()));
  EXPECT_NE(Checksum64(bytes), *third->reply().items[0].checksum);
}

TEST_F(ChunkReadServiceTest, WithoutVerifyOnceEveryReadIsVerifiedHere) {
  Serve({}, /*start=*/true);
  for (int round = 0; round < 2; ++round) {
    auto answer = service_->Read(Request({WholeSample(3)}));
    ASSERT_OK(answer);
    ASSERT_EQ(answer->payload().size(), 1u);
    EXPECT_TRUE(std::holds_alternative<std::string_view>(answer->payload()[0])) << round;
  }
  EXPECT_EQ(service_->Counters().items_sendfile, 0u);
}

TEST_F(ChunkReadServiceTest, UnstagedSamplesComeOnDemandAndAreStored) {
  Serve();  // bulk staging never started
  const SampleId big = Find("big/a.bin");
  const SampleId small = Find("d3/f8.bin");
  auto answer = service_->Read(
      Request({WholeSample(small), WholeSample(big), Sample(big, kChunkSize - 10, 70'000)}));
  ASSERT_OK(answer);
  ASSERT_EQ(answer->item_count(), 3u);
  for (size_t i = 0; i < 3; ++i) ASSERT_OK(answer->reply().items[i].status);
  EXPECT_EQ(ItemBytes(*answer, 0), Expected(small));
  EXPECT_EQ(ItemBytes(*answer, 1), Expected(big));
  EXPECT_EQ(ItemBytes(*answer, 2), Expected(big).substr(kChunkSize - 10, 70'000));
  EXPECT_EQ(service_->Counters().items_on_demand, 3u);
  // Stored: the next read comes from disk.
  EXPECT_TRUE(store_->HasChunk(Key(manifest_->ChunkOf(small))));
  auto again = service_->Read(Request({WholeSample(small), WholeSample(big)}));
  ASSERT_OK(again);
  EXPECT_EQ(ItemBytes(*again, 0), Expected(small));
  EXPECT_EQ(ItemBytes(*again, 1), Expected(big));
  EXPECT_EQ(service_->Counters().items_from_disk, 2u);
}

TEST_F(ChunkReadServiceTest, ChunkRangesSpanSegments) {
  Serve();
  const ChunkId chunk = 1;
  const std::string payload = ChunkPayload(chunk);
  ASSERT_GT(payload.size(), 1000u);
  const uint32_t len = static_cast<uint32_t>(payload.size() - 200);
  auto answer = service_->Read(Request(
      {ChunkRange(chunk, 100, len), ChunkRange(chunk, 0, static_cast<uint32_t>(payload.size())),
       ChunkRange(chunk, payload.size() - 1, 2), ChunkRange(chunk, payload.size(), 1),
       ChunkRange(static_cast<ChunkId>(manifest_->chunk_count()), 0, 1)}));
  ASSERT_OK(answer);
  ASSERT_OK(answer->reply().items[0].status);
  ASSERT_OK(answer->reply().items[1].status);
  EXPECT_EQ(ItemBytes(*answer, 0), payload.substr(100, len));
  EXPECT_EQ(ItemBytes(*answer, 1), payload);
  for (size_t i = 2; i < 5; ++i) {
    EXPECT_EQ(answer->reply().items[i].status.code(), StatusCode::kOutOfRange) << i;
    EXPECT_EQ(answer->reply().items[i].length, 0u);
  }
  EXPECT_THAT(answer->reply().items[2].status.message(), HasSubstr("payload bytes"));
  EXPECT_EQ(service_->Counters().items_out_of_range, 3u);
}

TEST_F(ChunkReadServiceTest, FlippedPayloadByteIsDetectedRestagedAndServedCorrect) {
  Serve({}, /*start=*/true);
  const SampleId id = Find("d1/f11.bin");
  const ChunkId chunk = manifest_->ChunkOf(id);
  auto segments = manifest_->Segments(chunk);
  ASSERT_OK(segments);
  const uint32_t index = IndexOf(id);
  FlipPayloadByte(chunk, index);
  auto answer = service_->Read(Request({WholeSample(id), WholeSample(id)}));
  ASSERT_OK(answer);
  ASSERT_OK(answer->reply().items[0].status);
  ASSERT_OK(answer->reply().items[1].status);
  EXPECT_EQ(ItemBytes(*answer, 0), Expected(id));
  EXPECT_EQ(ItemBytes(*answer, 1), Expected(id));
  const ChunkReadServiceCounters c = service_->Counters();
  EXPECT_EQ(c.checksum_failures, 1u);
  EXPECT_EQ(c.restaged_segments, 1u);
  // Re-staged: present again, and the file itself now verifies.
  auto present = store_->PresentSegments(Key(chunk));
  ASSERT_OK(present);
  EXPECT_TRUE((*present)[index]);
  auto reader = store_->OpenChunkReader(Key(chunk), *segments);
  ASSERT_OK(reader);
  auto bytes = (*reader)->Read(index);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes, Expected(id));
}

// The chunk holding the corrupt segment is being filled by a bulk worker (it
// holds the chunk's writer, stopped in a source read): the reader is answered
// at once with fresh bytes, and the worker replaces the stored copy.
TEST_F(ChunkReadServiceTest, CorruptSegmentOfAChunkBeingStagedIsServedAtOnceAndReplaced) {
  auto found = FirstChunkWithSegments(*manifest_, 4);
  ASSERT_OK(found);
  const ChunkId chunk = *found;
  const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk);
  Serve({chunk});
  ASSERT_OK(stager_->FetchSegment(chunk, 0));
  ASSERT_OK(stager_->FetchSegment(chunk, 1));
  FlipPayloadByte(chunk, 0);
  const std::string held_path = manifest_->PathOf(segments[2].sample);
  source_->HoldIf([&](const SourceFile& f, uint64_t) { return f.path == held_path; });
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return source_->held() == 1; }, 20s));

  const SampleId id = segments[0].sample;
  auto answer = service_->Read(Request({WholeSample(id)}));
  ASSERT_OK(answer);
  ASSERT_OK(answer->reply().items[0].status);
  EXPECT_EQ(ItemBytes(*answer, 0), Expected(id));
  EXPECT_EQ(source_->held(), 1);  // the worker still holds the chunk
  EXPECT_EQ(service_->Counters().checksum_failures, 1u);
  EXPECT_EQ(service_->Counters().restaged_segments, 1u);

  source_->Open();
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kComplete; }, 20s));
  ExpectChunkIntact(chunk);
  auto again = service_->Read(Request({WholeSample(id)}));
  ASSERT_OK(again);
  EXPECT_EQ(ItemBytes(*again, 0), Expected(id));
  EXPECT_EQ(service_->Counters().checksum_failures, 1u);
}

// Many rounds of: a chunk with a corrupt stored segment is handed to bulk
// staging while readers read the whole chunk. Whoever holds the writer, the
// readers get the right bytes or nothing else (no kCorruption, no
// kUnavailable), and the chunk ends up intact.
TEST_F(ChunkReadServiceTest, CorruptionRacingBulkStagingOfTheSameChunkNeverServesWrongBytes) {
  auto found = FirstChunkWithSegments(*manifest_, 4);
  ASSERT_OK(found);
  const ChunkId chunk = *found;
  const std::string payload = ChunkPayload(chunk);
  const uint32_t segment_count = static_cast<uint32_t>(manifest_->Segments(chunk)->size());
  Serve({chunk});
  stager_->Pause();
  ASSERT_OK(stager_->Start());
  constexpr int kRounds = 25;
  std::atomic<int> wrong{0};
  std::atomic<int> right{0};
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Start again from a chunk file holding only a corrupt copy of one segment.
    ASSERT_OK(stager_->SetOwnedChunks({}));
    if (store_->HasChunk(Key(chunk))) ASSERT_OK(store_->DropChunk(Key(chunk)));
    ASSERT_OK(stager_->SetOwnedChunks(std::vector<ChunkId>{chunk}));
    const uint32_t bad = static_cast<uint32_t>(round) % segment_count;
    ASSERT_OK(stager_->FetchSegment(chunk, bad));
    FlipPayloadByte(chunk, bad);

    std::vector<std::thread> readers;
    for (int t = 0; t < 2; ++t) {
      readers.emplace_back([&] {
        auto answer =
            service_->Read(Request({ChunkRange(chunk, 0, static_cast<uint32_t>(payload.size()))}));
        if (answer.ok() && answer->reply().items[0].status.ok() &&
            ItemBytes(*answer, 0) == payload) {
          ++right;
        } else {
          ++wrong;
          ADD_FAILURE() << (answer.ok() ? answer->reply().items[0].status.ToString()
                                        : answer.status().ToString());
        }
      });
    }
    stager_->Resume();
    for (auto& r : readers) r.join();
    // Complete, and no worker still committing a replacement handed to it.
    ASSERT_TRUE(WaitFor(
        [&] {
          const StagerProgress p = stager_->Progress();
          return p.state == StagingState::kComplete && p.chunks_in_flight == 0;
        },
        20s));
    stager_->Pause();
    EXPECT_EQ(stager_->Progress().chunks_failed, 0u) << stager_->Progress().last_error.ToString();
    ExpectChunkIntact(chunk);
  }
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(right.load(), 2 * kRounds);
  EXPECT_GE(service_->Counters().checksum_failures, static_cast<uint64_t>(kRounds));
  EXPECT_EQ(service_->Counters().items_corrupt, 0u);
}

// A corrupt stored copy whose source file changed since: it can be neither
// served nor re-staged, so the item fails and no byte of it is sent.
TEST_F(ChunkReadServiceTest, CorruptCopyOfAChangedFileIsNeverServed) {
  Serve({}, /*start=*/true);
  const std::string changed = "d4/f9.bin";
  const SampleId id = Find(changed);
  const ChunkId chunk = manifest_->ChunkOf(id);
  const uint32_t index = IndexOf(id);
  FlipPayloadByte(chunk, index);
  dir_.WriteFile("source/" + changed, Bytes(changed + "v2", sizes_[changed]));
  const auto mtime = fs::last_write_time(root_ + "/" + changed);
  fs::last_write_time(root_ + "/" + changed, mtime + 5s);

  auto answer = service_->Read(Request({WholeSample(id)}));
  ASSERT_OK(answer);
  ASSERT_EQ(answer->item_count(), 1u);
  EXPECT_EQ(answer->reply().items[0].status.code(), StatusCode::kFailedPrecondition)
      << answer->reply().items[0].status.ToString();
  EXPECT_TRUE(answer->payload().empty());
  EXPECT_EQ(service_->Counters().checksum_failures, 1u);
  EXPECT_EQ(service_->Counters().restaged_segments, 0u);
}

TEST_F(ChunkReadServiceTest, ChangedSourceFileIsAPerItemErrorWithNoBytes) {
  const std::string changed = "d2/f7.bin";
  Serve();
  dir_.WriteFile("source/" + changed, Bytes(changed + "v2", sizes_[changed]));
  const auto mtime = fs::last_write_time(root_ + "/" + changed);
  fs::last_write_time(root_ + "/" + changed, mtime + 5s);
  const SampleId id = Find(changed);
  const SampleId other = Find("d2/f12.bin");
  auto answer = service_->Read(
      Request({WholeSample(id), WholeSample(other), WholeSample(id),
               ChunkRange(manifest_->ChunkOf(id), manifest_->ChunkOffsetOf(id), 1)}));
  ASSERT_OK(answer);
  ASSERT_EQ(answer->item_count(), 4u);
  for (size_t i : {0u, 2u, 3u}) {
    const ReadReplyItem& item = answer->reply().items[i];
    EXPECT_EQ(item.status.code(), StatusCode::kFailedPrecondition) << item.status.ToString();
    EXPECT_THAT(item.status.message(), HasSubstr(Quoted(changed)));
    EXPECT_EQ(item.length, 0u);
  }
  ASSERT_OK(answer->reply().items[1].status);
  ASSERT_EQ(answer->payload().size(), 1u);  // only the good item has bytes
  EXPECT_EQ(ItemBytes(*answer, 1), Expected(other));
  EXPECT_EQ(service_->Counters().items_source_error, 3u);
  EXPECT_EQ(service_->Counters().items_other_error, 0u);
}

TEST_F(ChunkReadServiceTest, BadRequestsAndIds) {
  const SampleId owned_sample = Find("d0/f0.bin");
  const SampleId foreign = Find("big/a.bin");
  ASSERT_NE(manifest_->ChunkOf(owned_sample), manifest_->ChunkOf(foreign));
  Serve({manifest_->ChunkOf(owned_sample)});  // owns that chunk only
  const SampleId count = static_cast<SampleId>(manifest_->sample_count());
  // Unknown dataset or manifest: the whole request.
  ReadRequest unknown = Request({WholeSample(0)});
  unknown.dataset = "other";
  auto r = service_->Read(unknown);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("is not served by node 'node-a'"));
  ReadRequest stale = Request({WholeSample(0)});
  stale.manifest_id = ContentId{1, 2};
  EXPECT_EQ(service_->Read(stale).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_->Counters().reads_not_found, 2u);

  const SampleId in_chunk0 = owned_sample;
  const uint32_t size0 = static_cast<uint32_t>(manifest_->SizeOf(in_chunk0));
  auto answer = service_->Read(Request({
      Sample(count, 0, 1),               // past the manifest
      Sample(in_chunk0, size0, 1),       // past the sample's end
      Sample(in_chunk0, 1, size0),       // overlapping its end
      Sample(in_chunk0, ~0ull - 10, 5),  // offset near 2^64
      WholeSample(foreign),              // a chunk this node does not own
      WholeSample(in_chunk0),            // fine
  }));
  ASSERT_OK(answer);
  ASSERT_EQ(answer->item_count(), 6u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(answer->reply().items[i].status.code(), StatusCode::kOutOfRange)
        << i << ": " << answer->reply().items[i].status.ToString();
  }
  EXPECT_EQ(answer->reply().items[4].status.code(), StatusCode::kNotFound)
      << answer->reply().items[4].status.ToString();
  EXPECT_THAT(answer->reply().items[4].status.message(), HasSubstr("does not own"));
  ASSERT_OK(answer->reply().items[5].status);
  EXPECT_EQ(ItemBytes(*answer, 5), Expected(in_chunk0));

  // Registry misuse.
  EXPECT_EQ(service_->Add(manifest_, stager_).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(service_->Add(nullptr, stager_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->Add(manifest_, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->Remove("other", manifest_->id()).code(), StatusCode::kNotFound);
  ASSERT_OK(service_->Remove(kDataset, manifest_->id()));
  EXPECT_EQ(service_->dataset_count(), 0u);
  EXPECT_EQ(service_->Read(Request({WholeSample(0)})).status().code(), StatusCode::kNotFound);
}

TEST_F(ChunkReadServiceTest, AddRefusesAStagerOfAnotherManifestWithTheSameChunkCount) {
  Serve();
  ASSERT_OK(service_->Remove(kDataset, manifest_->id()));
  // The same tree snapshotted again after one file's mtime moved: same
  // geometry, another manifest id.
  const fs::path touched = fs::path(root_) / manifest_->PathOf(0);
  fs::last_write_time(touched, fs::last_write_time(touched) + 5s);
  auto m = SnapshotTree(root_, kChunkSize);
  ASSERT_OK(m);
  const std::shared_ptr<const Manifest> other = *m;
  ASSERT_EQ(other->chunk_count(), manifest_->chunk_count());
  ASSERT_NE(other->id(), manifest_->id());
  Status s = service_->Add(other, stager_);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("create the stager over this manifest"));
  EXPECT_EQ(service_->dataset_count(), 0u);
  EXPECT_EQ(stager_->manifest(), manifest_);
  EXPECT_EQ(stager_->source(), source_);
}

// The daemon re-creates a dataset's Stager when the registered plans change:
// Replace swaps it in one step, so the dataset is served before, at and after.
TEST_F(ChunkReadServiceTest, ReplaceSwapsTheStagerAndTheDatasetStaysServed) {
  StagerOptions o;
  o.dataset = kDataset;
  o.threads = 2;
  std::vector<ChunkId> all;
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) all.push_back(c);
  auto created = Stager::Create(manifest_, source_, store_, all, o);
  ASSERT_OK(created);
  std::shared_ptr<Stager> next(std::move(*created));
  EXPECT_EQ(service_->Replace(manifest_, next).code(), StatusCode::kNotFound)
      << "nothing to replace yet";
  EXPECT_EQ(service_->dataset_count(), 0u);

  Serve({}, /*start=*/true);
  const std::weak_ptr<Stager> old = stager_;
  stager_->Stop();
  ASSERT_OK(service_->Replace(manifest_, next));
  stager_.reset();
  EXPECT_TRUE(old.expired()) << "the service still holds the replaced stager";
  EXPECT_EQ(service_->dataset_count(), 1u);
  auto answer = service_->Read(Request({WholeSample(0)}));
  ASSERT_OK(answer);
  ASSERT_OK(answer->reply().items[0].status);
  EXPECT_EQ(ItemBytes(*answer, 0), Expected(0));
  auto stat = service_->Stat(StatRequest{kDataset, manifest_->id()});
  ASSERT_OK(stat);

  EXPECT_EQ(service_->Replace(nullptr, next).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->Replace(manifest_, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(service_->dataset_count(), 1u);
  ASSERT_OK(service_->Remove(kDataset, manifest_->id()));
}

TEST_F(ChunkReadServiceTest, StatNodeAndDataset) {
  Serve({}, /*start=*/true);
  auto node = service_->Stat(StatRequest{});
  ASSERT_OK(node);
  std::map<std::string, uint64_t> entries;
  for (const StatEntry& e : node->entries) {
    EXPECT_TRUE(entries.emplace(e.key, e.value).second) << "duplicate " << e.key;
  }
  EXPECT_EQ(entries["datasets_served"], 1u);
  EXPECT_EQ(entries["datasets_complete"], 1u);
  EXPECT_EQ(entries["chunks_owned"], manifest_->chunk_count());
  EXPECT_EQ(entries["bytes_staged"], entries["bytes_owned"]);
  auto ds = service_->Stat(StatRequest{kDataset, manifest_->id()});
  ASSERT_OK(ds);
  entries.clear();
  for (const StatEntry& e : ds->entries) entries.emplace(e.key, e.value);
  EXPECT_EQ(entries["state_complete"], 1u);
  EXPECT_EQ(entries["chunks_staged"], manifest_->chunk_count());
  EXPECT_OK(service_->Stat(StatRequest{kDataset, ContentId{}}));
  EXPECT_EQ(service_->Stat(StatRequest{"nope", ContentId{}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(service_->Stat(StatRequest{kDataset, ContentId{3, 4}}).status().code(),
            StatusCode::kNotFound);
}

TEST_F(ChunkReadServiceTest, ConcurrentReadersDuringBulkStaging) {
  Serve();
  ASSERT_OK(stager_->Start());  // bulk staging races the readers
  std::atomic<int> wrong{0};
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int round = 0; round < 10; ++round) {
        std::vector<ReadItem> items;
        for (int k = 0; k < 16; ++k) {
          items.push_back(WholeSample(static_cast<SampleId>(rng() % manifest_->sample_count())));
        }
        auto answer = service_->Read(Request(items));
        if (!answer.ok()) {
          ++wrong;
          continue;
        }
        for (size_t i = 0; i < items.size(); ++i) {
          if (answer->reply().items[i].status.ok() &&
              ItemBytes(*answer, i) == Expected(items[i].id)) {
            ++ok;
          } else {
            ++wrong;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load(), 4 * 10 * 16);
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kComplete; }, 20s));
}

TEST_F(ChunkReadServiceTest, EndToEndThroughServerAndPeerClient) {
  Serve({}, /*start=*/true);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.node_name = "node-a";
  auto server = Server::Start(service_, options);
  ASSERT_OK(server);
  PeerClientOptions co;
  co.client_name = "chunk-read-service-test";
  co.connect_timeout = 5s;
  co.call_timeout = 10s;
  auto client = PeerClient::Connect("127.0.0.1:" + std::to_string((*server)->port()), co);
  ASSERT_OK(client);

  const SampleId big = Find("big/a.bin");
  std::vector<ReadItem> items;
  for (SampleId id = 0; id < 50; ++id) items.push_back(WholeSample(id));
  items.push_back(WholeSample(big));
  items.push_back(Sample(static_cast<SampleId>(manifest_->sample_count()), 0, 1));
  items.push_back(ChunkRange(0, 0, 1000));
  auto reply = client->Read(Request(items));
  ASSERT_OK(reply);
  ASSERT_EQ(reply->size(), items.size());
  for (SampleId id = 0; id < 50; ++id) {
    ASSERT_OK(reply->status(id));
    EXPECT_EQ(reply->bytes(id), Expected(id)) << id;
  }
  ASSERT_OK(reply->status(50));
  EXPECT_EQ(reply->bytes(50), Expected(big));
  EXPECT_EQ(reply->status(51).code(), StatusCode::kOutOfRange);
  ASSERT_OK(reply->status(52));
  EXPECT_EQ(reply->bytes(52), ChunkPayload(0).substr(0, 1000));

  ReadRequest unknown = Request({WholeSample(0)});
  unknown.dataset = "other";
  auto failed = client->Read(unknown);
  EXPECT_EQ(failed.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(failed.status().message(), HasSubstr("not served by node"));

  // The connection keeps serving.
  auto again = client->Read(Request({WholeSample(3)}));
  ASSERT_OK(again);
  EXPECT_EQ(again->bytes(0), Expected(3));
  auto stat = client->Stat(StatRequest{kDataset, manifest_->id()});
  ASSERT_OK(stat);
  EXPECT_FALSE(stat->entries.empty());
  (*server)->Stop();
}

}  // namespace
}  // namespace granary

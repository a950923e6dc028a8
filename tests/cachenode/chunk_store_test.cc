// The cache node's chunk store on real files: create, fill and reopen; the
// capacity reached exactly and never passed (also by concurrent creates);
// the restart scan rebuilding the same index and removing damaged, foreign
// and temporary files; the directory lock against a second store (in this
// process and another); drops freeing capacity; a full file system (a small
// tmpfs in a private mount namespace); and bad inputs.

#include "granary/cachenode/chunk_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/chunk_format.h"
#include "granary/core/file.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::ReadAll;
using ::granary::testing::WriteAll;

namespace fs = std::filesystem;
using ::granary::testing::TempDir;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr ContentId kManifestA{0x0123456789abcdefull, 0x1111111111111111ull};
constexpr ContentId kManifestB{0x0123456789abcdefull, 0x2222222222222222ull};
constexpr uint64_t kGiB = 1ull << 30;

ChunkKey Key(ChunkId chunk, const std::string& dataset = "imagenet",
             const ContentId& manifest = kManifestA) {
  return ChunkKey{dataset, manifest, chunk};
}

// Contiguous whole samples, as the manifest packs small ones.
std::vector<ChunkSegment> Packed(const std::vector<uint32_t>& lengths, SampleId first = 100) {
  std::vector<ChunkSegment> segments;
  uint32_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    segments.push_back({first + static_cast<SampleId>(i), 0, offset, lengths[i]});
    offset += lengths[i];
  }
  return segments;
}

// The geometry most tests use: 5 samples, 20000 payload bytes.
std::vector<ChunkSegment> Geometry() { return Packed({1000, 3000, 5000, 7000, 4000}); }

std::string SegmentBytes(const ChunkSegment& s) {
  std::string out(s.length, '\0');
  uint64_t x = (uint64_t{s.sample} << 32) ^ s.sample_offset ^ 0x9e3779b97f4a7c15ull;
  for (auto& c : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  return out;
}

// Puts the segments listed (all if empty) and commits once.
Status Fill(StoredChunkWriter& writer, std::vector<uint32_t> indices = {}) {
  if (indices.empty()) {
    for (uint32_t i = 0; i < writer.segment_count(); ++i) indices.push_back(i);
  }
  for (uint32_t i : indices) {
    GRANARY_RETURN_IF_ERROR(writer.Put(i, SegmentBytes(writer.segments()[i])));
  }
  return writer.Commit();
}

std::shared_ptr<ChunkStore> OpenOrDie(const std::string& root, uint64_t capacity,
                                      const ChunkStoreOptions& options = {}) {
  auto store = ChunkStore::Open(root, capacity, options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return store.ok() ? *store : nullptr;
}

// Every regular file under the store's dataset directories, relative to root.
std::vector<std::string> FilesUnder(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it.depth() == 0) continue;  // the marker, LOCK, files left alone at the top
    if (!it->is_directory() || it->is_symlink()) {
      out.push_back(fs::relative(it->path(), root).string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What the files of the store's chunks take, by their real length.
uint64_t BytesOnDisk(const ChunkStore& store) {
  uint64_t total = 0;
  for (const std::string& rel : FilesUnder(store.root())) {
    auto size = fs::file_size(fs::path(store.root()) / rel);
    total += (size + store.block_size() - 1) / store.block_size() * store.block_size();
  }
  return total;
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

class ChunkStoreTest : public ::testing::Test {
 protected:
  std::string root() const { return dir_.Join("store"); }
  TempDir dir_;
};

// ---------------------------------------------------------------------------
// Create, fill, reopen

TEST_F(ChunkStoreTest, CreateFillReopenAndRead) {
  const auto segments = Geometry();
  {
    auto store = OpenOrDie(root(), 10 << 20);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->used_bytes(), 0u);
    EXPECT_FALSE(store->HasChunk(Key(7)));
    auto writer = store->CreateChunk(Key(7), segments);
    ASSERT_OK(writer);
    EXPECT_TRUE(store->HasChunk(Key(7)));
    EXPECT_EQ(store->PresentSegments(Key(7)).value(), std::vector<bool>(5, false));
    ASSERT_OK(Fill(*writer, {0, 3}));
    EXPECT_EQ(store->PresentSegments(Key(7)).value(),
              (std::vector<bool>{true, false, false, true, false}));
    EXPECT_EQ(store->used_bytes(), store->ChunkBytes(segments));
  }  // writer, then store, closed

  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->scan_report().chunk_files, 1u);
  EXPECT_EQ(store->used_bytes(), store->ChunkBytes(segments));
  EXPECT_EQ(store->PresentSegments(Key(7)).value(),
            (std::vector<bool>{true, false, false, true, false}));
  auto chunk = store->Chunk(Key(7));
  ASSERT_OK(chunk);
  EXPECT_EQ(chunk->segment_count, 5u);
  EXPECT_EQ(chunk->present_count, 2u);
  EXPECT_FALSE(chunk->complete());

  // Fill the rest after the "restart".
  auto writer = store->OpenChunkWriter(Key(7), segments);
  ASSERT_OK(writer);
  EXPECT_TRUE(writer->IsPresent(0));
  ASSERT_OK(Fill(*writer, {1, 2, 4}));
  EXPECT_TRUE(writer->complete());
  EXPECT_TRUE(store->Chunk(Key(7))->complete());

  auto reader = store->OpenChunkReader(Key(7), segments);
  ASSERT_OK(reader);
  for (uint32_t i = 0; i < 5; ++i) {
    auto bytes = (*reader)->Read(i);
    ASSERT_OK(bytes);
    EXPECT_EQ(*bytes, SegmentBytes(segments[i])) << "segment " << i;
  }
}

TEST_F(ChunkStoreTest, FilesAndDirectoriesAreNotWorldReadable) {
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  auto writer = store->CreateChunk(Key(1), Geometry());
  ASSERT_OK(writer);
  const std::string path = store->ChunkPath(Key(1));
  EXPECT_EQ(path, root() + "/imagenet/" + kManifestA.ToHex() + "/1.chunk");
  EXPECT_EQ(ModeOf(root()), 0700u);
  EXPECT_EQ(ModeOf(root() + "/imagenet"), 0700u);
  EXPECT_EQ(ModeOf(root() + "/imagenet/" + kManifestA.ToHex()), 0700u);
  EXPECT_EQ(ModeOf(path), 0600u);
  EXPECT_EQ(ModeOf(root() + "/LOCK"), 0600u);
  EXPECT_EQ(ModeOf(root() + "/GRANARY_CHUNK_STORE"), 0600u);
}

TEST_F(ChunkStoreTest, ChunkBytesIsWhatTheFileTakesOnDisk) {
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  ASSERT_GE(store->block_size(), 512u);
  const auto segments = Geometry();
  const uint64_t file_size = chunk_format::HeaderRegionSize(5) + 20000;
  const uint64_t bytes = store->ChunkBytes(segments);
  EXPECT_EQ(bytes, store->ChunkBytes(5, 20000));
  EXPECT_GE(bytes, file_size);
  EXPECT_LT(bytes - file_size, store->block_size());
  EXPECT_EQ(bytes % store->block_size(), 0u);

  auto writer = store->CreateChunk(Key(1), segments);
  ASSERT_OK(writer);
  struct stat st {};
  ASSERT_EQ(::stat(store->ChunkPath(Key(1)).c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), file_size);
  // Preallocated: the blocks are there, and the store counts at least them.
  EXPECT_GE(bytes, static_cast<uint64_t>(st.st_blocks) * 512);
  EXPECT_EQ(store->used_bytes(), bytes);
}

// ---------------------------------------------------------------------------
// Capacity

TEST_F(ChunkStoreTest, CapacityIsReachedExactlyThenRefusedWithoutWriting) {
  const auto segments = Geometry();
  uint64_t per_chunk;
  {
    auto probe = OpenOrDie(dir_.Join("probe"), 1);
    ASSERT_NE(probe, nullptr);
    per_chunk = probe->ChunkBytes(segments);
  }
  auto store = OpenOrDie(root(), 3 * per_chunk);
  ASSERT_NE(store, nullptr);
  for (ChunkId c = 0; c < 3; ++c) {
    auto writer = store->CreateChunk(Key(c), segments);
    ASSERT_OK(writer);
    ASSERT_OK(Fill(*writer));
  }
  EXPECT_EQ(store->used_bytes(), 3 * per_chunk);
  EXPECT_EQ(store->free_bytes(), 0u);

  auto refused = store->CreateChunk(Key(3), segments);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("0 of its"));
  EXPECT_THAT(refused.status().message(), HasSubstr("raise the capacity"));
  EXPECT_FALSE(fs::exists(store->ChunkPath(Key(3))));
  EXPECT_EQ(FilesUnder(root()).size(), 3u);
  EXPECT_FALSE(store->HasChunk(Key(3)));
  EXPECT_EQ(store->used_bytes(), 3 * per_chunk);
  ChunkStoreStats stats = store->Stats();
  EXPECT_EQ(stats.creates_refused_total, 1u);
  EXPECT_EQ(stats.chunks_created_total, 3u);
  EXPECT_EQ(stats.chunk_count, 3u);
  EXPECT_EQ(stats.present_segments, 15u);
  EXPECT_GT(stats.filesystem_available_bytes, 0u);

  // Dropping one makes room for exactly one.
  ASSERT_OK(store->DropChunk(Key(2)));
  EXPECT_EQ(store->free_bytes(), per_chunk);
  ASSERT_OK(store->CreateChunk(Key(3), segments));
  EXPECT_EQ(store->free_bytes(), 0u);
}

TEST_F(ChunkStoreTest, OneByteShortOfAChunkIsRefused) {
  const auto segments = Geometry();
  uint64_t per_chunk;
  {
    auto probe = OpenOrDie(dir_.Join("probe"), 1);
    ASSERT_NE(probe, nullptr);
    per_chunk = probe->ChunkBytes(segments);
  }
  auto store = OpenOrDie(root(), 2 * per_chunk - 1);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->CreateChunk(Key(0), segments));
  auto refused = store->CreateChunk(Key(1), segments);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store->used_bytes(), per_chunk);
  EXPECT_EQ(store->free_bytes(), per_chunk - 1);
}

TEST_F(ChunkStoreTest, LoweredCapacityOpensOverCapacityAndRefusesUntilDrops) {
  const auto segments = Geometry();
  uint64_t per_chunk;
  {
    auto store = OpenOrDie(root(), 10 << 20);
    ASSERT_NE(store, nullptr);
    per_chunk = store->ChunkBytes(segments);
    for (ChunkId c = 0; c < 3; ++c) ASSERT_OK(store->CreateChunk(Key(c), segments));
  }
  auto store = OpenOrDie(root(), per_chunk);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->used_bytes(), 3 * per_chunk);
  EXPECT_EQ(store->free_bytes(), 0u);
  EXPECT_EQ(store->CreateChunk(Key(9), segments).status().code(), StatusCode::kResourceExhausted);
  ASSERT_OK(store->DropChunk(Key(0)));
  ASSERT_OK(store->DropChunk(Key(1)));
  EXPECT_EQ(store->CreateChunk(Key(9), segments).status().code(), StatusCode::kResourceExhausted);
  ASSERT_OK(store->DropChunk(Key(2)));
  EXPECT_OK(store->CreateChunk(Key(9), segments));
}

TEST_F(ChunkStoreTest, ConcurrentCreatesNeverExceedCapacity) {
  const auto segments = Geometry();
  uint64_t per_chunk;
  {
    auto probe = OpenOrDie(dir_.Join("probe"), 1);
    ASSERT_NE(probe, nullptr);
    per_chunk = probe->ChunkBytes(segments);
  }
  const uint64_t capacity = 10 * per_chunk + per_chunk / 2;
  auto store = OpenOrDie(root(), capacity);
  ASSERT_NE(store, nullptr);

  constexpr int kThreads = 6;
  constexpr int kAttempts = 8;  // 48 attempts for 10 places
  std::atomic<int> created{0};
  std::atomic<int> refused{0};
  std::atomic<int> other_errors{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> max_used{0};
  std::thread monitor([&] {
    for (int i = 0; i < 100000 && !done; ++i) {
      uint64_t used = store->used_bytes();
      uint64_t seen = max_used.load();
      while (used > seen && !max_used.compare_exchange_weak(seen, used)) {
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAttempts; ++i) {
        auto writer = store->CreateChunk(Key(static_cast<ChunkId>(t * 100 + i)), segments);
        if (writer.ok()) {
          if (Fill(*writer).ok()) {
            ++created;
          } else {
            ++other_errors;
          }
        } else if (writer.status().code() == StatusCode::kResourceExhausted) {
          ++refused;
        } else {
          ++other_errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  monitor.join();

  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_EQ(created.load(), 10);
  EXPECT_EQ(refused.load(), kThreads * kAttempts - 10);
  EXPECT_LE(max_used.load(), capacity);
  EXPECT_EQ(store->used_bytes(), 10 * per_chunk);
  EXPECT_EQ(FilesUnder(root()).size(), 10u);
  EXPECT_EQ(BytesOnDisk(*store), store->used_bytes());
}

// Creates, fills, reads and drops racing on a small set of chunk ids: the
// accounting ends equal to the files on disk, and a restart agrees.
TEST_F(ChunkStoreTest, ConcurrentCreateReadDropKeepsAccountingExact) {
  const auto segments = Geometry();
  uint64_t per_chunk;
  {
    auto probe = OpenOrDie(dir_.Join("probe"), 1);
    ASSERT_NE(probe, nullptr);
    per_chunk = probe->ChunkBytes(segments);
  }
  const uint64_t capacity = 6 * per_chunk;
  uint64_t final_used;
  {
    auto store = OpenOrDie(root(), capacity);
    ASSERT_NE(store, nullptr);
    std::atomic<int> unexpected{0};
    std::atomic<uint64_t> max_used{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<uint32_t>(t));
        for (int i = 0; i < 60; ++i) {
          ChunkKey key =
              Key(static_cast<ChunkId>(rng() % 10), rng() % 3 == 0 ? "coco" : "imagenet");
          auto expected = [&](const Status& s, std::initializer_list<StatusCode> ok_codes) {
            if (s.ok()) return;
            for (StatusCode c : ok_codes) {
              if (s.code() == c) return;
            }
            ADD_FAILURE() << s.ToString();
            ++unexpected;
          };
          switch (rng() % 4) {
            case 0: {
              auto w = store->CreateChunk(key, segments);
              expected(w.status(), {StatusCode::kResourceExhausted, StatusCode::kAlreadyExists,
                                    StatusCode::kUnavailable});
              if (w.ok()) {
                // Dropped by another thread meanwhile is the only way to fail.
                Status s = Fill(*w);
                expected(s, {StatusCode::kFailedPrecondition});
              }
              break;
            }
            case 1: {
              auto r = store->OpenChunkReader(key, segments);
              expected(r.status(), {StatusCode::kNotFound, StatusCode::kUnavailable});
              if (r.ok()) {
                for (uint32_t s = 0; s < 5; ++s) {
                  if (!(*r)->IsPresent(s)) continue;
                  auto bytes = (*r)->Read(s);
                  expected(bytes.status(), {});
                  if (bytes.ok() && *bytes != SegmentBytes(segments[s])) ++unexpected;
                }
              }
              break;
            }
            case 2:
              expected(store->DropChunk(key), {StatusCode::kNotFound});
              break;
            default:
              if (rng() % 8 == 0) {
                expected(store->DropDataset(key.dataset), {StatusCode::kNotFound});
              }
              break;
          }
          uint64_t used = store->used_bytes();
          uint64_t seen = max_used.load();
          while (used > seen && !max_used.compare_exchange_weak(seen, used)) {
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(unexpected.load(), 0);
    EXPECT_LE(max_used.load(), capacity);
    uint64_t indexed = 0;
    for (const StoredManifest& m : store->Manifests()) indexed += m.bytes;
    final_used = store->used_bytes();
    EXPECT_EQ(final_used, indexed);
    EXPECT_EQ(BytesOnDisk(*store), final_used);
  }
  auto store = OpenOrDie(root(), capacity);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->used_bytes(), final_used);
  EXPECT_EQ(store->scan_report().removed_invalid_files, 0u);
  EXPECT_EQ(store->scan_report().removed_temp_files, 0u);
}

// ---------------------------------------------------------------------------
// Restart scan

TEST_F(ChunkStoreTest, RestartScanRebuildsTheSameIndex) {
  const auto small = Geometry();
  const auto large = Packed({70000, 1, 0, 9000}, 500);  // with an empty sample
  std::vector<StoredManifest> before_manifests;
  std::map<std::string, std::vector<bool>> before_present;
  uint64_t before_used;
  auto keys = std::vector<std::pair<ChunkKey, const std::vector<ChunkSegment>*>>{
      {Key(0), &small},         {Key(1), &large},         {Key(5, "imagenet", kManifestB), &small},
      {Key(2, "coco"), &large}, {Key(3, "coco"), &small},
  };
  {
    auto store = OpenOrDie(root(), 10 << 20, ChunkStoreOptions{.scan_threads = 1});
    ASSERT_NE(store, nullptr);
    uint32_t n = 0;
    for (const auto& [key, segments] : keys) {
      auto writer = store->CreateChunk(key, *segments);
      ASSERT_OK(writer);
      std::vector<uint32_t> some;
      for (uint32_t i = 0; i < writer->segment_count(); ++i) {
        if ((i + n) % 2 == 0) some.push_back(i);
      }
      ++n;
      if (!some.empty()) ASSERT_OK(Fill(*writer, some));
    }
    before_manifests = store->Manifests();
    for (const auto& [key, segments] : keys) {
      before_present[store->ChunkPath(key)] = store->PresentSegments(key).value();
    }
    before_used = store->used_bytes();
  }
  for (uint32_t threads : {1u, 4u}) {
    auto store = OpenOrDie(root(), 10 << 20, ChunkStoreOptions{.scan_threads = threads});
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->scan_report().chunk_files, keys.size());
    EXPECT_EQ(store->scan_report().removed_invalid_files, 0u);
    EXPECT_EQ(store->used_bytes(), before_used);
    auto after = store->Manifests();
    ASSERT_EQ(after.size(), before_manifests.size());
    for (size_t i = 0; i < after.size(); ++i) {
      EXPECT_EQ(after[i].dataset, before_manifests[i].dataset);
      EXPECT_EQ(after[i].manifest_id, before_manifests[i].manifest_id);
      EXPECT_EQ(after[i].chunk_count, before_manifests[i].chunk_count);
      EXPECT_EQ(after[i].present_segments, before_manifests[i].present_segments);
      EXPECT_EQ(after[i].segment_count, before_manifests[i].segment_count);
      EXPECT_EQ(after[i].bytes, before_manifests[i].bytes);
    }
    for (const auto& [key, segments] : keys) {
      EXPECT_EQ(store->PresentSegments(key).value(), before_present[store->ChunkPath(key)]);
    }
    auto coco = store->Chunks("coco", kManifestA);
    ASSERT_OK(coco);
    ASSERT_EQ(coco->size(), 2u);
    EXPECT_EQ((*coco)[0].chunk, 2u);
    EXPECT_EQ((*coco)[1].chunk, 3u);
  }
}

TEST_F(ChunkStoreTest, ScanRemovesDamagedForeignAndTemporaryFilesAndKeepsAccountingExact) {
  const auto segments = Geometry();
  std::string manifest_dir;
  {
    auto store = OpenOrDie(root(), 10 << 20);
    ASSERT_NE(store, nullptr);
    for (ChunkId c = 0; c < 6; ++c) {
      auto writer = store->CreateChunk(Key(c), segments);
      ASSERT_OK(writer);
      ASSERT_OK(Fill(*writer));
    }
    manifest_dir = fs::path(store->ChunkPath(Key(0))).parent_path().string();
  }
  auto path = [&](ChunkId c) { return manifest_dir + "/" + std::to_string(c) + ".chunk"; };
  // Truncated: chunk 1 loses its last byte.
  fs::resize_file(path(1), fs::file_size(path(1)) - 1);
  // Bit flip in the header: chunk 2's segment table.
  std::string two = ReadAll(path(2));
  two[chunk_format::kFixedHeaderSize + 5] ^= 0x10;
  WriteAll(path(2), two);
  // Misplaced: chunk 3's file under chunk 9's name (a sound file of another chunk).
  fs::copy_file(path(3), path(9));
  // Foreign files: not a chunk at all, a non-canonical name, a symlink, garbage.
  WriteAll(manifest_dir + "/notes.txt", "hello");
  fs::copy_file(path(4), manifest_dir + "/04.chunk");
  fs::create_symlink(path(5), manifest_dir + "/8.chunk");
  WriteAll(manifest_dir + "/7.chunk", std::string(5000, 'x'));
  // Leftovers of interrupted creates.
  WriteAll(path(10) + ".tmp.AbC123", std::string(100, '\0'));
  WriteAll(root() + "/GRANARY_CHUNK_STORE.tmp.xYz789", "granary");
  // Outside the layout: left alone, counted.
  WriteAll(root() + "/README", "not ours");
  fs::create_directories(root() + "/Not_A_Label");
  fs::create_directories(root() + "/imagenet/not-a-manifest-id");

  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  const ChunkStoreScanReport& r = store->scan_report();
  EXPECT_EQ(r.chunk_files, 4u);            // 0, 3, 4, 5
  EXPECT_EQ(r.removed_temp_files, 2u);     // the two .tmp. files
  EXPECT_EQ(r.removed_invalid_files, 7u);  // 1, 2, 9, notes.txt, 04.chunk, 8.chunk, 7.chunk
  EXPECT_EQ(r.unknown_entries, 3u);        // README, Not_A_Label, not-a-manifest-id
  EXPECT_EQ(r.dropped_corrupt_segments, 0u);
  EXPECT_EQ(store->used_bytes(), 4 * store->ChunkBytes(segments));
  EXPECT_EQ(BytesOnDisk(*store), store->used_bytes());
  EXPECT_EQ(FilesUnder(root()),
            (std::vector<std::string>{"imagenet/" + kManifestA.ToHex() + "/0.chunk",
                                      "imagenet/" + kManifestA.ToHex() + "/3.chunk",
                                      "imagenet/" + kManifestA.ToHex() + "/4.chunk",
                                      "imagenet/" + kManifestA.ToHex() + "/5.chunk"}));
  EXPECT_TRUE(fs::exists(root() + "/README"));
  EXPECT_TRUE(fs::exists(root() + "/Not_A_Label"));
  EXPECT_TRUE(fs::exists(path(5)));  // the symlink went, not its target
  for (ChunkId c : {1u, 2u, 7u, 8u, 9u}) EXPECT_FALSE(store->HasChunk(Key(c))) << c;
  for (ChunkId c : {0u, 3u, 4u, 5u}) {
    auto reader = store->OpenChunkReader(Key(c), segments);
    ASSERT_OK(reader);
    EXPECT_EQ((*reader)->Read(4).value(), SegmentBytes(segments[4]));
  }
  // Removed chunks can be staged again.
  EXPECT_OK(store->CreateChunk(Key(1), segments));
}

TEST_F(ChunkStoreTest, OtherFormatVersionIsRemovedAtScan) {
  const auto segments = Geometry();
  {
    auto store = OpenOrDie(root(), 10 << 20);
    ASSERT_NE(store, nullptr);
    ASSERT_OK(store->CreateChunk(Key(0), segments));
    ASSERT_OK(store->CreateChunk(Key(1), segments));
  }
  const std::string path = root() + "/imagenet/" + kManifestA.ToHex() + "/1.chunk";
  std::string file = ReadAll(path);
  file[chunk_format::kVersionOffset] = 2;
  WriteAll(path, file);
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->scan_report().removed_invalid_files, 1u);
  EXPECT_EQ(store->used_bytes(), store->ChunkBytes(segments));
  EXPECT_FALSE(fs::exists(path));
}

// A file that cannot be read says nothing about its contents: the scan stops
// and leaves it, rather than delete a chunk that may be sound.
TEST_F(ChunkStoreTest, UnreadableChunkFileFailsOpenAndIsKept) {
  // As root, permission bits do not stop us: the child drops to nobody, in a
  // directory nobody owns.
  fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read |
                                   fs::perms::group_exec | fs::perms::others_read |
                                   fs::perms::others_exec);
  const std::string owned = dir_.Join("owned");
  fs::create_directories(owned);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(owned.c_str(), 65534, 65534), 0);
  }
  auto child = testing::ChildProcess::Start([owned](int) {
    if (::geteuid() == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
          ::setresuid(65534, 65534, 65534) != 0) {
        return 2;
      }
    }
    const std::string root = owned + "/store";
    std::string path;
    {
      auto store = ChunkStore::Open(root, 10 << 20);
      if (!store.ok()) return 3;
      if (!(*store)->CreateChunk(Key(0), Geometry()).ok()) return 4;
      if (!(*store)->CreateChunk(Key(1), Geometry()).ok()) return 5;
      path = (*store)->ChunkPath(Key(1));
    }
    if (::chmod(path.c_str(), 0) != 0) return 6;
    auto refused = ChunkStore::Open(root, 10 << 20);
    std::fprintf(stderr, "child: %s\n", refused.status().ToString().c_str());
    if (refused.status().code() != StatusCode::kPermissionDenied) return 7;
    if (refused.status().message().find(path) == std::string::npos) return 8;
    if (refused.status().message().find("left as it was") == std::string::npos) return 9;
    if (!fs::exists(path)) return 10;
    if (::chmod(path.c_str(), 0600) != 0) return 11;
    auto store = ChunkStore::Open(root, 10 << 20);
    if (!store.ok() || (*store)->scan_report().chunk_files != 2) return 12;
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(10s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "see the child's stderr; exit codes are its checks in order";
}

TEST_F(ChunkStoreTest, VerifyingScanDropsCorruptSegmentsDurably) {
  const auto segments = Geometry();
  std::string path;
  {
    auto store = OpenOrDie(root(), 10 << 20);
    ASSERT_NE(store, nullptr);
    auto writer = store->CreateChunk(Key(0), segments);
    ASSERT_OK(writer);
    ASSERT_OK(Fill(*writer));
    path = store->ChunkPath(Key(0));
  }
  std::string file = ReadAll(path);
  file[chunk_format::HeaderRegionSize(5) + segments[2].chunk_offset + 17] ^= 0x01;
  WriteAll(path, file);

  {  // The presence scan trusts the bitmap; the reader still refuses the bytes.
    auto store = OpenOrDie(root(), 10 << 20);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->PresentSegments(Key(0)).value(), std::vector<bool>(5, true));
    auto reader = store->OpenChunkReader(Key(0), segments);
    ASSERT_OK(reader);
    EXPECT_EQ((*reader)->Read(2).status().code(), StatusCode::kCorruption);
  }
  {
    auto store =
        OpenOrDie(root(), 10 << 20, ChunkStoreOptions{.scan_mode = ChunkScanMode::kVerifyPayload});
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->scan_report().dropped_corrupt_segments, 1u);
    EXPECT_EQ(store->scan_report().chunk_files, 1u);
    EXPECT_EQ(store->PresentSegments(Key(0)).value(),
              (std::vector<bool>{true, true, false, true, true}));
  }
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->PresentSegments(Key(0)).value(),
            (std::vector<bool>{true, true, false, true, true}));
  // Re-stage it.
  auto writer = store->OpenChunkWriter(Key(0), segments);
  ASSERT_OK(writer);
  ASSERT_OK(Fill(*writer, {2}));
  auto reader = store->OpenChunkReader(Key(0), segments);
  ASSERT_OK(reader);
  EXPECT_EQ((*reader)->Read(2).value(), SegmentBytes(segments[2]));
}

// ---------------------------------------------------------------------------
// The directory lock

TEST_F(ChunkStoreTest, SecondOpenInThisProcessFailsNamingThePid) {
  auto first = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(first, nullptr);
  auto second = ChunkStore::Open(root(), 10 << 20);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another cache node"));
  EXPECT_THAT(second.status().message(), HasSubstr("pid " + std::to_string(::getpid())));
  // The handles keep the store open; when all are gone, it can be opened again.
  auto writer = first->CreateChunk(Key(0), Geometry());
  ASSERT_OK(writer);
  first.reset();
  EXPECT_EQ(ChunkStore::Open(root(), 10 << 20).status().code(), StatusCode::kUnavailable);
  { auto gone = std::move(*writer); }
  EXPECT_OK(ChunkStore::Open(root(), 10 << 20));
}

TEST_F(ChunkStoreTest, SecondOpenFromAnotherProcessFailsNamingItsPid) {
  const std::string dir = root();
  auto child = testing::ChildProcess::Start([dir](int control_fd) {
    auto store = ChunkStore::Open(dir, 10 << 20);
    if (!store.ok()) {
      std::fprintf(stderr, "child: %s\n", store.status().ToString().c_str());
      return 2;
    }
    char byte = 'r';
    if (::send(control_fd, &byte, 1, MSG_NOSIGNAL) != 1) return 3;
    (void)::recv(control_fd, &byte, 1, 0);  // until the parent says stop, or dies
    return 0;
  });
  ASSERT_OK(child);
  ASSERT_OK((*child)->AwaitReady(10s));
  auto second = ChunkStore::Open(dir, 10 << 20);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("pid " + std::to_string((*child)->pid())));
  (*child)->RequestStop();
  auto code = (*child)->Wait(10s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0);
  EXPECT_OK(ChunkStore::Open(dir, 10 << 20));
}

// ---------------------------------------------------------------------------
// Drops

TEST_F(ChunkStoreTest, DropManifestAndDropDatasetFreeCapacity) {
  const auto segments = Geometry();
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  const uint64_t per_chunk = store->ChunkBytes(segments);
  for (ChunkId c = 0; c < 3; ++c) {
    ASSERT_OK(store->CreateChunk(Key(c, "imagenet", kManifestA), segments));
    ASSERT_OK(store->CreateChunk(Key(c, "imagenet", kManifestB), segments));
    ASSERT_OK(store->CreateChunk(Key(c, "coco", kManifestA), segments));
  }
  EXPECT_EQ(store->used_bytes(), 9 * per_chunk);
  EXPECT_EQ(store->Manifests().size(), 3u);

  // An old manifest of a dataset.
  ASSERT_OK(store->DropManifest("imagenet", kManifestA));
  EXPECT_EQ(store->used_bytes(), 6 * per_chunk);
  EXPECT_FALSE(store->HasChunk(Key(0, "imagenet", kManifestA)));
  EXPECT_TRUE(store->HasChunk(Key(0, "imagenet", kManifestB)));
  EXPECT_FALSE(fs::exists(root() + "/imagenet/" + kManifestA.ToHex()));
  EXPECT_EQ(store->Chunks("imagenet", kManifestA).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->DropManifest("imagenet", kManifestA).code(), StatusCode::kNotFound);

  // The whole dataset.
  ASSERT_OK(store->DropDataset("imagenet"));
  EXPECT_EQ(store->used_bytes(), 3 * per_chunk);
  EXPECT_FALSE(fs::exists(root() + "/imagenet"));
  ASSERT_EQ(store->Manifests().size(), 1u);
  EXPECT_EQ(store->Manifests()[0].dataset, "coco");
  EXPECT_EQ(store->DropDataset("imagenet").code(), StatusCode::kNotFound);
  ChunkStoreStats stats = store->Stats();
  EXPECT_EQ(stats.chunks_dropped_total, 6u);
  EXPECT_EQ(stats.chunk_count, 3u);
  EXPECT_EQ(stats.manifest_count, 1u);
  EXPECT_EQ(BytesOnDisk(*store), store->used_bytes());

  // Staged again afterwards.
  EXPECT_OK(store->CreateChunk(Key(0, "imagenet", kManifestA), segments));
  EXPECT_EQ(store->used_bytes(), 4 * per_chunk);

  // And a restart agrees.
  const uint64_t used = store->used_bytes();
  store.reset();
  store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->used_bytes(), used);
}

TEST_F(ChunkStoreTest, DroppedChunkStaysCountedWhileOpen) {
  const auto segments = Geometry();
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  const uint64_t per_chunk = store->ChunkBytes(segments);
  auto writer = store->CreateChunk(Key(0), segments);
  ASSERT_OK(writer);
  ASSERT_OK(Fill(*writer, {0, 1}));
  auto reader = store->OpenChunkReader(Key(0), segments);
  ASSERT_OK(reader);

  ASSERT_OK(store->DropChunk(Key(0)));
  EXPECT_FALSE(store->HasChunk(Key(0)));
  EXPECT_FALSE(fs::exists(store->ChunkPath(Key(0))));
  EXPECT_EQ(store->used_bytes(), per_chunk);  // its blocks are still allocated
  // The open reader still reads what it had; the writer may not commit.
  EXPECT_EQ((*reader)->Read(1).value(), SegmentBytes(segments[1]));
  ASSERT_OK(writer->Put(2, SegmentBytes(segments[2])));
  Status commit = writer->Commit();
  EXPECT_EQ(commit.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(commit.message(), HasSubstr("dropped"));
  // A new chunk under the same key is counted on its own.
  ASSERT_OK(store->CreateChunk(Key(0), segments));
  EXPECT_EQ(store->used_bytes(), 2 * per_chunk);

  { auto gone = std::move(*writer); }
  EXPECT_EQ(store->used_bytes(), 2 * per_chunk);  // the reader is still open
  { auto gone = std::move(*reader); }
  EXPECT_EQ(store->used_bytes(), per_chunk);
}

// ---------------------------------------------------------------------------
// A full file system (ENOSPC): a 256 KiB tmpfs in a private mount namespace,
// under a store whose capacity is far larger.

// Returns 0 once `dir` is a private tmpfs of `size`, else the errno.
int MountPrivateTmpfs(const std::string& dir, const std::string& size) {
  uid_t uid = ::geteuid();
  gid_t gid = ::getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return errno;
  auto write = [](const char* path, const std::string& text) {
    int fd = ::open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    return ok;
  };
  if (!write("/proc/self/setgroups", "deny") ||
      !write("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
      !write("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
    return errno != 0 ? errno : EPERM;
  }
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return errno;
  std::string options = "size=" + size + ",mode=0700";
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) return errno;
  return 0;
}

TEST_F(ChunkStoreTest, FullFileSystemIsResourceExhaustedAndLeavesNothingBehind) {
  const std::string dir = dir_.Join("nvme");
  fs::create_directories(dir);
  constexpr int kSkipped = 77;
  auto child = testing::ChildProcess::Start([dir](int) {
    if (int err = MountPrivateTmpfs(dir, "256k"); err != 0) {
      std::fprintf(stderr, "child: cannot mount a private tmpfs: %s\n", std::strerror(err));
      return kSkipped;
    }
    const std::string root = dir + "/store";
    const auto segments = Packed({30000, 30000});  // about 64 KiB a chunk
    int created = 0;
    Status failure;
    uint64_t used = 0;
    {
      auto store = ChunkStore::Open(root, 100 << 20);
      if (!store.ok()) {
        std::fprintf(stderr, "child: %s\n", store.status().ToString().c_str());
        return 2;
      }
      for (ChunkId c = 0; c < 16 && failure.ok(); ++c) {
        auto writer = (*store)->CreateChunk(Key(c), segments);
        if (!writer.ok()) {
          failure = writer.status();
          break;
        }
        ++created;
      }
      std::fprintf(stderr, "child: %d created, then %s\n", created, failure.ToString().c_str());
      if (failure.code() != StatusCode::kResourceExhausted) return 3;
      if (failure.message().find("file system is full") == std::string::npos) return 4;
      if (created == 0) return 5;
      used = (*store)->used_bytes();
      if (used != static_cast<uint64_t>(created) * (*store)->ChunkBytes(segments)) return 6;
      if ((*store)->Stats().creates_no_space_total != 1) return 7;
      // Nothing half-created: only the complete chunk files.
      if (FilesUnder(root).size() != static_cast<size_t>(created)) return 8;
      if ((*store)->HasChunk(Key(static_cast<ChunkId>(created)))) return 9;
    }
    auto store = ChunkStore::Open(root, 100 << 20);
    if (!store.ok()) return 10;
    if ((*store)->used_bytes() != used) return 11;
    if ((*store)->scan_report().removed_temp_files != 0) return 12;
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(30s);
  ASSERT_OK(code);
  if (*code == kSkipped) GTEST_SKIP() << "no unprivileged mount namespaces here";
  EXPECT_EQ(*code, 0) << "see the child's stderr; exit codes are its checks in order";
}

// A failed create (here: the file-size limit, EFBIG) releases its reservation
// and leaves no file, whatever the error.
TEST_F(ChunkStoreTest, FailedCreateReleasesItsReservation) {
  const auto segments = Packed({200000});
  auto child = testing::ChildProcess::Start([dir = root(), segments](int) {
    auto store = ChunkStore::Open(dir, 10 << 20);
    if (!store.ok()) return 2;
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit saved{};
    if (::getrlimit(RLIMIT_FSIZE, &saved) != 0) return 3;
    rlimit limit{100000, saved.rlim_max};  // the soft limit only, so it can be restored
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
    auto writer = (*store)->CreateChunk(Key(0), segments);
    std::fprintf(stderr, "child: %s\n", writer.status().ToString().c_str());
    if (writer.ok()) return 4;
    if ((*store)->used_bytes() != 0) return 5;
    if ((*store)->HasChunk(Key(0))) return 6;
    if (!FilesUnder(dir).empty()) return 7;
    if (::setrlimit(RLIMIT_FSIZE, &saved) != 0) return 8;
    if (!(*store)->CreateChunk(Key(0), segments).ok()) return 9;
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(30s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "see the child's stderr; exit codes are its checks in order";
}

// ---------------------------------------------------------------------------
// Bad inputs

TEST_F(ChunkStoreTest, BadOpenArguments) {
  auto zero = ChunkStore::Open(root(), 0);
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("capacity is 0"));
  EXPECT_FALSE(fs::exists(root()));  // nothing created for a bad call

  EXPECT_EQ(ChunkStore::Open("", 1 << 20).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ChunkStore::Open(root(), 1 << 20, ChunkStoreOptions{.scan_threads = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ChunkStore::Open(root(), 1 << 20, ChunkStoreOptions{.scan_threads = 65}).status().code(),
      StatusCode::kInvalidArgument);

  dir_.WriteFile("a-file", "x");
  auto file = ChunkStore::Open(dir_.Join("a-file"), 1 << 20);
  EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr("not a directory"));

  auto orphan = ChunkStore::Open(dir_.Join("missing/store"), 1 << 20);
  EXPECT_EQ(orphan.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(orphan.status().message(), HasSubstr("parent directory does not exist"));

  // Trailing slashes name the same store.
  {
    auto store = OpenOrDie(root() + "//", 1 << 20);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->root(), root());
  }
}

TEST_F(ChunkStoreTest, NonEmptyDirectoryThatIsNotAStoreIsNotAdopted) {
  dir_.WriteFile("store/precious.txt", "do not delete");
  fs::create_directories(root() + "/imagenet");
  auto store = ChunkStore::Open(root(), 1 << 20);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("'imagenet'"));
  EXPECT_THAT(store.status().message(), HasSubstr("empty directory"));
  EXPECT_TRUE(fs::exists(root() + "/precious.txt"));
  EXPECT_FALSE(fs::exists(root() + "/LOCK"));

  // lost+found (a mount point) is fine.
  fs::create_directories(dir_.Join("mnt/lost+found"));
  EXPECT_OK(ChunkStore::Open(dir_.Join("mnt"), 1 << 20));
}

TEST_F(ChunkStoreTest, ForeignOrNewerMarkerIsRefused) {
  { ASSERT_NE(OpenOrDie(root(), 1 << 20), nullptr); }
  WriteAll(root() + "/GRANARY_CHUNK_STORE", "granary chunk store\nlayout 2\n");
  auto newer = ChunkStore::Open(root(), 1 << 20);
  EXPECT_EQ(newer.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(newer.status().message(), HasSubstr("layout '2\\x0a'"));
  WriteAll(root() + "/GRANARY_CHUNK_STORE", "something else");
  EXPECT_EQ(ChunkStore::Open(root(), 1 << 20).status().code(), StatusCode::kCorruption);
}

TEST_F(ChunkStoreTest, RootNotWritableIsPermissionDenied) {
  // As root, permission bits do not stop us: the child drops to nobody.
  fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read |
                                   fs::perms::group_exec | fs::perms::others_read |
                                   fs::perms::others_exec);
  const std::string readonly = dir_.Join("readonly");
  fs::create_directories(readonly);
  fs::permissions(readonly, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                fs::perms::group_exec | fs::perms::others_read |
                                fs::perms::others_exec);
  auto child = testing::ChildProcess::Start([readonly](int) {
    if (::geteuid() == 0) {
      if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
          ::setresuid(65534, 65534, 65534) != 0) {
        return 2;
      }
    }
    auto store = ChunkStore::Open(readonly, 1 << 20);
    std::fprintf(stderr, "child: %s\n", store.status().ToString().c_str());
    if (store.status().code() != StatusCode::kPermissionDenied) return 3;
    // Owned by root, not by this user: refused before anything is written.
    if (store.status().message().find("owned by uid 0") == std::string::npos) return 4;
    auto inside = ChunkStore::Open(readonly + "/store", 1 << 20);
    std::fprintf(stderr, "child: %s\n", inside.status().ToString().c_str());
    if (inside.status().code() != StatusCode::kPermissionDenied) return 5;
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(10s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "see the child's stderr; exit codes are its checks in order";
}

// Security: a data_dir another user may write could hold a
// symbolic link where the node writes its LOCK, and a root node would
// overwrite what it points to. Such a directory is refused, and the LOCK is
// never followed.
TEST_F(ChunkStoreTest, ADataDirAnotherUserMayWriteIsRefusedAndItsLockNeverFollowed) {
  const std::string victim = dir_.Join("victim");
  WriteAll(victim, "precious\n");
  // The report's set-up: a sticky world-writable parent, a directory in it
  // made by uid 65534 with LOCK -> victim, and the node (root) told to use it.
  const std::string shared = dir_.Join("shared");
  fs::create_directories(shared);
  ::chmod(shared.c_str(), 01777);
  const std::string planted = shared + "/gc";
  fs::create_directories(planted);
  ASSERT_EQ(::symlink(victim.c_str(), (planted + "/LOCK").c_str()), 0);
  ASSERT_EQ(::lchown(planted.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::lchown((planted + "/LOCK").c_str(), 65534, 65534), 0);
  auto store = ChunkStore::Open(planted, 1 << 20);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(store.status().message(), HasSubstr("owned by uid 65534"));
  EXPECT_THAT(store.status().message(), HasSubstr("give the node a directory of its own"));
  EXPECT_EQ(ReadAll(victim), "precious\n");

  // Our own directory, but writable by others.
  const std::string open_to_all = dir_.Join("open");
  fs::create_directories(open_to_all);
  ::chmod(open_to_all.c_str(), 0777);
  auto writable = ChunkStore::Open(open_to_all, 1 << 20);
  ASSERT_FALSE(writable.ok());
  EXPECT_EQ(writable.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(writable.status().message(), HasSubstr("mode 0777"));
  ::chmod(open_to_all.c_str(), 0775);
  EXPECT_THAT(ChunkStore::Open(open_to_all, 1 << 20).status().message(), HasSubstr("mode 0775"));
  EXPECT_EQ(DataDirOwnershipProblem(open_to_all, ::geteuid()).empty(), false);

  // Our own 0700 directory with a LOCK symlink in it (left by whoever): not
  // followed, named, the victim intact.
  const std::string own = dir_.Join("own");
  fs::create_directories(own);
  ::chmod(own.c_str(), 0700);
  EXPECT_EQ(DataDirOwnershipProblem(own, ::geteuid()), "");
  ASSERT_EQ(::symlink(victim.c_str(), (own + "/LOCK").c_str()), 0);
  auto linked = ChunkStore::Open(own, 1 << 20);
  ASSERT_FALSE(linked.ok());
  EXPECT_EQ(linked.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(linked.status().message(), HasSubstr("is a symbolic link"));
  EXPECT_EQ(ReadAll(victim), "precious\n");
  // Removed, the directory is a store.
  ASSERT_EQ(::unlink((own + "/LOCK").c_str()), 0);
  EXPECT_OK(ChunkStore::Open(own, 1 << 20));
}

TEST_F(ChunkStoreTest, BadKeysAndUnknownChunks) {
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  const auto segments = Geometry();
  for (const std::string& bad :
       {std::string(""), std::string("ImageNet"), std::string("-a"), std::string("a/../b"),
        std::string(64, 'a'), std::string("a\nb")}) {
    ChunkKey key = Key(0, bad);
    auto created = store->CreateChunk(key, segments);
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(created.status().message(), HasSubstr("DNS-1123"));
    EXPECT_EQ(store->OpenChunkWriter(key, segments).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->OpenChunkReader(key, segments).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->PresentSegments(key).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Chunk(key).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->DropChunk(key).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->DropManifest(bad, kManifestA).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->DropDataset(bad).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Chunks(bad, kManifestA).status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(store->HasChunk(key));
  }
  EXPECT_EQ(store->used_bytes(), 0u);
  EXPECT_TRUE(FilesUnder(root()).empty());

  // Unknown chunks.
  auto reader = store->OpenChunkReader(Key(42), segments);
  EXPECT_EQ(reader.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(reader.status().message(), HasSubstr("chunk 42 of dataset 'imagenet'"));
  EXPECT_THAT(reader.status().message(), HasSubstr("not in the store"));
  EXPECT_EQ(store->OpenChunkWriter(Key(42), segments).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->PresentSegments(Key(42)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Chunk(Key(42)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->DropChunk(Key(42)).code(), StatusCode::kNotFound);
  EXPECT_EQ(store->DropManifest("imagenet", kManifestA).code(), StatusCode::kNotFound);
  EXPECT_EQ(store->DropDataset("imagenet").code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Chunks("imagenet", kManifestA).status().code(), StatusCode::kNotFound);
}

TEST_F(ChunkStoreTest, BadGeometriesAndMisuse) {
  auto store = OpenOrDie(root(), 10 << 20);
  ASSERT_NE(store, nullptr);
  // Overlapping segments: the writer's own check; nothing stays reserved.
  std::vector<ChunkSegment> overlap = {{1, 0, 0, 100}, {2, 0, 50, 100}};
  auto bad = store->CreateChunk(Key(0), overlap);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->used_bytes(), 0u);
  EXPECT_FALSE(store->HasChunk(Key(0)));
  // Past the chunk file's payload limit: refused as invalid, not as "does not fit".
  std::vector<ChunkSegment> huge = {{1, 0, 0, static_cast<uint32_t>(kGiB)},
                                    {2, 0, static_cast<uint32_t>(kGiB), 1}};
  EXPECT_EQ(store->CreateChunk(Key(0), huge).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->used_bytes(), 0u);
  EXPECT_TRUE(FilesUnder(root()).empty());

  const auto segments = Geometry();
  auto writer = store->CreateChunk(Key(0), segments);
  ASSERT_OK(writer);
  // Created twice.
  auto again = store->CreateChunk(Key(0), segments);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("OpenChunkWriter"));
  // Two writers.
  auto second = store->OpenChunkWriter(Key(0), segments);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("another writer"));
  // Other geometry than the file's.
  auto other = Packed({1000, 3000, 5000, 7000, 4001});
  auto reader = store->OpenChunkReader(Key(0), other);
  EXPECT_EQ(reader.status().code(), StatusCode::kFailedPrecondition);
  // Writer errors come through unchanged.
  EXPECT_EQ(writer->Put(9, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(writer->Put(0, "short").code(), StatusCode::kInvalidArgument);
  // Once the writer is closed, another may open.
  { auto gone = std::move(*writer); }
  EXPECT_OK(store->OpenChunkWriter(Key(0), segments));
  EXPECT_EQ(store->used_bytes(), store->ChunkBytes(segments));
}

}  // namespace
}  // namespace granary

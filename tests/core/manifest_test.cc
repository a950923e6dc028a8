#include "granary/core/manifest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "granary/core/byte_order.h"
#include "granary/core/manifest_format.h"
#include "manifest_codec.h"
#include "testing/test_util.h"

namespace granary {
namespace {

ManifestHeaderInfo Header(uint64_t chunk_size = 1024) {
  ManifestHeaderInfo h;
  h.source_uri = "file:///data/set";
  h.chunk_size = chunk_size;
  h.include = {"*.jpg"};
  h.exclude = {"**/.cache"};
  h.stats.directories = 3;
  h.stats.skipped_special = 1;
  return h;
}

Manifest Build(std::vector<FileEntry> entries, uint64_t chunk_size = 1024) {
  auto m = Manifest::FromEntries(Header(chunk_size), std::move(entries));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

// ImageNet-like: class folders with a few files each, varied sizes.
std::vector<FileEntry> ImageNetLike(size_t classes, size_t per_class, uint64_t seed) {
  std::mt19937_64 rng(seed);  // test data only; formats never depend on it
  std::vector<FileEntry> e;
  for (size_t c = 0; c < classes; ++c) {
    char cls[16];
    std::snprintf(cls, sizeof(cls), "n%08zu", 1440764 + c * 7);
    for (size_t i = 0; i < per_class; ++i) {
      e.push_back({std::string(cls) + "/" + cls + "_" + std::to_string(10000 + i) + ".JPEG",
                   20 + rng() % 3000,
                   static_cast<int64_t>(1'600'000'000'000'000'000 + rng() % 1000)});
    }
  }
  return e;
}

// Every byte of every sample is in exactly one segment, in order.
void ExpectSegmentsCoverSamples(const Manifest& m) {
  std::map<SampleId, uint64_t> covered;
  for (ChunkId c = 0; c < m.chunk_count(); ++c) {
    auto info = m.Chunk(c);
    ASSERT_TRUE(info.ok());
    auto segs = m.Segments(c);
    ASSERT_TRUE(segs.ok());
    ASSERT_EQ(segs->size(), info->sample_count);
    uint64_t payload = 0;
    for (const auto& s : *segs) {
      EXPECT_EQ(s.chunk_offset, payload) << "chunk " << c;
      EXPECT_EQ(s.sample_offset, covered[s.sample]) << "sample " << s.sample;
      covered[s.sample] += s.length;
      payload += s.length;
    }
    EXPECT_EQ(payload, info->payload_bytes);
    EXPECT_LE(payload, m.chunk_size());
  }
  for (SampleId s = 0; s < m.sample_count(); ++s) EXPECT_EQ(covered[s], m.SizeOf(s)) << s;
}

TEST(ManifestTest, IdsFollowSortedPaths) {
  Manifest m = Build({{"b/2", 10, 1}, {"a", 5, 2}, {"b/10", 7, 3}, {"a.txt", 1, 4}});
  ASSERT_EQ(m.sample_count(), 4u);
  EXPECT_EQ(m.PathOf(0), "a");
  EXPECT_EQ(m.PathOf(1), "a.txt");
  EXPECT_EQ(m.PathOf(2), "b/10");
  EXPECT_EQ(m.PathOf(3), "b/2");
  auto s = m.Sample(2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size, 7u);
  EXPECT_EQ(s->mtime_ns, 3);
  EXPECT_EQ(m.total_bytes(), 23u);
  EXPECT_EQ(m.directory_count(), 2u);  // root and b
}

TEST(ManifestTest, PacksSmallSamplesWholeAndSpansLargeOnes) {
  // chunk 1024: 600+400 fit (1000), 100 opens chunk 1, 3000 spans 3 fresh chunks,
  // 0 goes to a new chunk after the large one, then 1024 exactly fills it? no: 0+1024 fits.
  Manifest m = Build({{"f0", 600, 0},
                      {"f1", 400, 0},
                      {"f2", 100, 0},
                      {"f3", 3000, 0},
                      {"f4", 0, 0},
                      {"f5", 1024, 0},
                      {"f6", 1, 0}});
  EXPECT_EQ(m.ChunkOf(0), 0u);
  EXPECT_EQ(m.ChunkOf(1), 0u);
  EXPECT_EQ(m.ChunkOffsetOf(1), 600u);
  EXPECT_EQ(m.ChunkOf(2), 1u);
  EXPECT_EQ(m.ChunkOf(3), 2u);  // spans 2,3,4
  EXPECT_EQ(m.ChunkOffsetOf(3), 0u);
  EXPECT_EQ(m.Sample(3)->chunk_count, 3u);
  EXPECT_EQ(m.ChunkOf(4), 5u);
  EXPECT_EQ(m.ChunkOf(5), 5u);
  EXPECT_EQ(m.ChunkOf(6), 6u);
  EXPECT_EQ(m.chunk_count(), 7u);
  auto piece = m.Segments(4);
  ASSERT_TRUE(piece.ok());
  ASSERT_EQ(piece->size(), 1u);
  EXPECT_EQ((*piece)[0], (ChunkSegment{3, 2048, 0, 952}));
  ExpectSegmentsCoverSamples(m);
}

TEST(ManifestTest, SegmentsCoverEverySampleOnRandomSizes) {
  std::mt19937_64 rng(7);
  std::vector<FileEntry> e;
  for (int i = 0; i < 2000; ++i) {
    uint64_t size = rng() % 10 == 0 ? rng() % 5000 : rng() % 400;
    e.push_back({"d" + std::to_string(i % 13) + "/f" + std::to_string(i), size, i});
  }
  ExpectSegmentsCoverSamples(Build(e));
}

TEST(ManifestTest, HugeSampleCostsNoMemoryPerPiece) {
  const uint64_t tib = 1ull << 40;
  Manifest m = Build({{"a", 10, 0}, {"big", tib + 5, 0}, {"c", 20, 0}});
  EXPECT_EQ(m.chunk_count(), 1 + (1ull << 30) + 1 + 1);
  EXPECT_LT(m.MemoryBytes(), 4096u);
  auto last_piece = m.Chunk(static_cast<ChunkId>(1 + (1ull << 30)));
  ASSERT_TRUE(last_piece.ok());
  EXPECT_EQ(last_piece->first_sample, 1u);
  EXPECT_EQ(last_piece->payload_bytes, 5u);
  auto seg = m.Segments(static_cast<ChunkId>(1 + (1ull << 30)));
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ((*seg)[0].sample_offset, tib);
  EXPECT_EQ(m.ChunkOf(2), static_cast<ChunkId>(m.chunk_count() - 1));
  auto overflow = Manifest::FromEntries(Header(1ull << 30), {{"a", UINT64_MAX, 0}, {"b", 2, 0}});
  ASSERT_FALSE(overflow.ok());
  auto too_many = Manifest::FromEntries(Header(1024), {{"a", 1ull << 60, 0}});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("larger chunk size"), std::string::npos);
}

TEST(ManifestTest, EmptyDatasetHasNoChunks) {
  Manifest m = Build({});
  EXPECT_EQ(m.sample_count(), 0u);
  EXPECT_EQ(m.chunk_count(), 0u);
  auto again = Manifest::Decode(m.Encode());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->id(), m.id());
  EXPECT_EQ(m.Find("x").status().code(), StatusCode::kNotFound);
}

TEST(ManifestTest, EncodeDecodeRoundTripIsExact) {
  Manifest m = Build(ImageNetLike(20, 30, 1));
  std::string bytes = m.Encode();
  auto d = Manifest::Decode(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->id(), m.id());
  EXPECT_EQ(d->Encode(), bytes);
  EXPECT_EQ(d->header().source_uri, "file:///data/set");
  EXPECT_EQ(d->header().include, std::vector<std::string>{"*.jpg"});
  EXPECT_EQ(d->header().exclude, std::vector<std::string>{"**/.cache"});
  EXPECT_EQ(d->header().stats, m.header().stats);
  ASSERT_EQ(d->sample_count(), m.sample_count());
  ASSERT_EQ(d->chunk_count(), m.chunk_count());
  for (SampleId s = 0; s < m.sample_count(); ++s) {
    EXPECT_EQ(d->PathOf(s), m.PathOf(s));
    EXPECT_EQ(d->SizeOf(s), m.SizeOf(s));
    EXPECT_EQ(d->MtimeOf(s), m.MtimeOf(s));
    EXPECT_EQ(d->ChunkOf(s), m.ChunkOf(s));
    EXPECT_EQ(d->ChunkOffsetOf(s), m.ChunkOffsetOf(s));
  }
}

TEST(ManifestTest, IdIsAContentHash) {
  auto entries = ImageNetLike(5, 10, 2);
  Manifest a = Build(entries);
  std::reverse(entries.begin(), entries.end());
  EXPECT_EQ(Build(entries).id(), a.id()) << "input order must not matter";
  auto changed = entries;
  changed[3].size += 1;
  EXPECT_NE(Build(changed).id(), a.id());
  changed = entries;
  changed[3].mtime_ns += 1;
  EXPECT_NE(Build(changed).id(), a.id());
  changed = entries;
  changed[3].path += "x";
  EXPECT_NE(Build(changed).id(), a.id());
  EXPECT_NE(Build(entries, 2048).id(), a.id());
  EXPECT_EQ(a.id().ToHex().size(), 32u);
}

TEST(ManifestTest, FindByPath) {
  Manifest m = Build(ImageNetLike(10, 50, 3));
  for (SampleId s = 0; s < m.sample_count(); ++s) {
    auto found = m.Find(m.PathOf(s));
    ASSERT_TRUE(found.ok()) << m.PathOf(s);
    EXPECT_EQ(*found, s);
  }
  std::string p = m.PathOf(7);
  for (const std::string& miss : {std::string(""), "/" + p, p + "x", p.substr(0, p.size() - 1),
                                  p.substr(p.find('/') + 1), std::string("n00000000")}) {
    auto r = m.Find(miss);
    ASSERT_FALSE(r.ok()) << miss;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  }
}

TEST(ManifestTest, OutOfRangeIdsAreErrors) {
  Manifest m = Build({{"a", 1, 1}});
  EXPECT_EQ(m.Sample(1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(m.Chunk(1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(m.Segments(99).status().code(), StatusCode::kOutOfRange);
}

TEST(ManifestTest, RejectsBadEntries) {
  for (const std::string& bad :
       {std::string(""), std::string("/abs"), std::string("a//b"), std::string("a/./b"),
        std::string("../up"), std::string("a/"), std::string("a/..", 4), std::string("nul\0x", 5),
        std::string(256, 'n'), std::string(5000, 'p')}) {
    auto m = Manifest::FromEntries(Header(), {{bad, 1, 1}});
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  }
  auto dup = Manifest::FromEntries(Header(), {{"a/b", 1, 1}, {"a/b", 2, 2}});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("appears twice"), std::string::npos);
  for (uint64_t cs : {uint64_t{0}, uint64_t{1023}, uint64_t{(1ull << 30) + 1}}) {
    auto m = Manifest::FromEntries(Header(cs), {{"a", 1, 1}});
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("chunk size"), std::string::npos);
  }
}

TEST(ManifestTest, TruncationAtEveryLengthIsCorruption) {
  std::string bytes = Build(ImageNetLike(3, 20, 4)).Encode();
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto d = Manifest::Decode(std::string_view(bytes).substr(0, len));
    ASSERT_FALSE(d.ok()) << len;
    EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << len;
  }
  auto longer = Manifest::Decode(bytes + "x");
  EXPECT_EQ(longer.status().code(), StatusCode::kCorruption);
}

TEST(ManifestTest, EveryBitFlipIsDetected) {
  std::string bytes = Build(ImageNetLike(2, 10, 5)).Encode();
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit : {0, 3, 7}) {
      std::string flipped = bytes;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      auto d = Manifest::Decode(flipped);
      ASSERT_FALSE(d.ok()) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(ManifestTest, WrongVersionAndMagicAreClear) {
  std::string bytes = Build({{"a", 1, 1}}).Encode();
  for (uint32_t version : {0u, 4u}) {
    std::string other = bytes;
    StoreLe(other.data() + manifest_format::kVersionOffset, version);
    auto d = Manifest::Decode(other);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kVersionMismatch);
    EXPECT_NE(d.status().message().find("version " + std::to_string(version)), std::string::npos);
    EXPECT_NE(d.status().message().find("versions 1 to 3"), std::string::npos);
  }
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_NE(Manifest::Decode(bad_magic).status().message().find("not a Granary manifest"),
            std::string::npos);
}

// Bodies that pass the checksums but lie: only a forger or a bug makes these,
// and the parser must still refuse them cleanly.
TEST(ManifestTest, MalformedBodiesAreRefused) {
  // Bodies built by hand with the documented layout (docs/formats.md).
  // Of format `version`: 1 has no mode columns, 2 no ctime and inode columns.
  auto body_of = [](uint64_t chunk, std::vector<std::pair<uint32_t, std::string>> dirs,
                    std::vector<std::tuple<uint32_t, std::string, uint64_t>> samples,
                    uint64_t claimed_samples, uint32_t version = 3, uint16_t file_mode = 0644) {
    std::string b;
    ByteWriter w(&b);
    w.Put(chunk);
    w.Put(claimed_samples);
    w.Put(static_cast<uint32_t>(dirs.size()));
    w.Put(uint32_t{0});  // source uri ""
    w.Put(uint32_t{0});  // includes
    w.Put(uint32_t{0});  // excludes
    for (int i = 0; i < 6; ++i) w.Put(uint64_t{0});
    for (auto& [parent, name] : dirs) {
      w.Put(parent);
      w.Put(static_cast<uint16_t>(name.size()));
      w.PutBytes(name);
    }
    for (auto& s : samples) w.Put(std::get<0>(s));
    for (auto& s : samples) w.Put(static_cast<uint16_t>(std::get<1>(s).size()));
    for (auto& s : samples) w.PutBytes(std::get<1>(s));
    for (auto& s : samples) w.Put(std::get<2>(s));
    for (size_t i = 0; i < samples.size(); ++i) w.Put(int64_t{0});
    if (version >= 2) {
      for (size_t i = 0; i < samples.size(); ++i) w.Put(file_mode);
      for (size_t i = 0; i < dirs.size(); ++i) w.Put(uint16_t{0755});
    }
    if (version >= 3) {
      for (size_t i = 0; i < samples.size(); ++i) w.Put(int64_t{1'700'000'000'000'000'000} + i);
      for (size_t i = 0; i < samples.size(); ++i) w.Put(uint64_t{1000} + i);
    }
    return b;
  };
  const uint32_t kRoot = manifest_format::kNoParent;
  ContentId id{1, 2};
  auto ok = internal::DecodeManifestBody(
      body_of(1024, {{kRoot, ""}, {0, "a"}}, {{1, "x", 5}, {1, "y", 6}, {0, "z", 1}}, 3), id);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->PathOf(1), "a/y");
  EXPECT_EQ(ok->ModeOf(1), 0644);
  EXPECT_EQ(ok->DirectoryMode(1), 0755);
  EXPECT_EQ(ok->CtimeOf(1), 1'700'000'000'000'000'001);
  EXPECT_EQ(ok->InodeOf(2), 1002u);
  // Without the ctime and inode columns it is a good version 2 body, and
  // without the mode columns too a good version 1 body.
  auto v2 = internal::DecodeManifestBody(
      body_of(1024, {{kRoot, ""}, {0, "a"}}, {{1, "x", 5}}, 1, /*version=*/2), id, 2);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(v2->ModeOf(0), 0644);
  EXPECT_EQ(v2->CtimeOf(0), 0);
  EXPECT_EQ(v2->InodeOf(0), 0u);
  auto v1 = internal::DecodeManifestBody(
      body_of(1024, {{kRoot, ""}, {0, "a"}}, {{1, "x", 5}}, 1, /*version=*/1), id, 1);
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(v1->ModeOf(0), kDefaultFileMode);
  EXPECT_EQ(v1->DirectoryMode(0), kDefaultDirectoryMode);
  EXPECT_EQ(v1->CtimeOf(0), 0);
  // Bodies of a version this build does not know are refused as such.
  EXPECT_EQ(
      internal::DecodeManifestBody(body_of(1024, {{kRoot, ""}}, {}, 0), id, 4).status().code(),
      StatusCode::kVersionMismatch);

  struct Case {
    const char* what;
    std::string body;
  } cases[] = {
      {"unsorted", body_of(1024, {{kRoot, ""}}, {{0, "b", 1}, {0, "a", 1}}, 2)},
      {"duplicate", body_of(1024, {{kRoot, ""}}, {{0, "a", 1}, {0, "a", 1}}, 2)},
      {"bad dir index", body_of(1024, {{kRoot, ""}}, {{5, "a", 1}}, 1)},
      {"bad parent", body_of(1024, {{kRoot, ""}, {1, "a"}}, {{0, "a", 1}}, 1)},
      {"root not first", body_of(1024, {{0, "x"}}, {{0, "a", 1}}, 1)},
      {"no dirs", body_of(1024, {}, {}, 0)},
      {"slash in name", body_of(1024, {{kRoot, ""}}, {{0, "a/b", 1}}, 1)},
      {"dot name", body_of(1024, {{kRoot, ""}}, {{0, "..", 1}}, 1)},
      {"huge count", body_of(1024, {{kRoot, ""}}, {{0, "a", 1}}, 1ull << 40)},
      {"count too small", body_of(1024, {{kRoot, ""}}, {{0, "a", 1}, {0, "b", 1}}, 1)},
      {"bad chunk size", body_of(7, {{kRoot, ""}}, {{0, "a", 1}}, 1)},
      {"empty", std::string()},
      {"mode beyond 07777", body_of(1024, {{kRoot, ""}}, {{0, "a", 1}}, 1, 3, 010000)},
      {"version 1 body read as 3", body_of(1024, {{kRoot, ""}}, {{0, "a", 1}}, 1, 1)},
      {"version 2 body read as 3", body_of(1024, {{kRoot, ""}}, {{0, "a", 1}}, 1, 2)},
      {"inode column short",
       body_of(1024, {{kRoot, ""}}, {{0, "a", 1}}, 1)
           .substr(0, body_of(1024, {{kRoot, ""}}, {{0, "a", 1}}, 1).size() - 1)},
  };
  for (const auto& c : cases) {
    auto r = internal::DecodeManifestBody(c.body, id);
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << c.what;
  }
}

TEST(ManifestTest, ModesAndDirectoriesWithoutSamplesRoundTrip) {
  std::vector<FileEntry> files = {
      {"cls/a.jpg", 3, 100, 0640}, {"cls/b.jpg", 5, 200, 0400}, {"top", 0, 300, 04755}};
  std::vector<DirectoryEntry> dirs = {
      {"", 0750}, {"cls", 0700}, {"empty", 0755}, {"deep/er/est", 0711}};
  auto m = Manifest::FromEntries(Header(), files, dirs);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // root, cls, deep (implied), deep/er (implied), deep/er/est, empty.
  ASSERT_EQ(m->directory_count(), 6u);
  std::vector<std::string> paths;
  for (uint32_t d = 0; d < m->directory_count(); ++d) paths.push_back(m->DirectoryPath(d));
  EXPECT_EQ(paths,
            (std::vector<std::string>{"", "cls", "deep", "deep/er", "deep/er/est", "empty"}));
  EXPECT_EQ(m->DirectoryMode(0), 0750);
  EXPECT_EQ(m->DirectoryMode(1), 0700);
  EXPECT_EQ(m->DirectoryMode(2), kDefaultDirectoryMode);
  EXPECT_EQ(m->DirectoryMode(4), 0711);
  EXPECT_EQ(m->DirectoryName(4), "est");
  EXPECT_EQ(m->DirectoryParent(4), 3u);
  EXPECT_EQ(m->DirectoryParent(0), kNoParentDirectory);
  EXPECT_EQ(m->DirectoryName(0), "");
  EXPECT_EQ(m->ModeOf(0), 0640);
  EXPECT_EQ(m->ModeOf(1), 0400);
  EXPECT_EQ(m->ModeOf(2), 04755);
  EXPECT_EQ(m->Sample(1)->mode, 0400);
  EXPECT_EQ(m->DirectoryOf(0), 1u);
  EXPECT_EQ(m->DirectoryOf(2), 0u);

  auto back = Manifest::Decode(m->Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->id(), m->id());
  EXPECT_EQ(back->Encode(), m->Encode());
  EXPECT_EQ(back->directory_count(), 6u);
  EXPECT_EQ(back->DirectoryPath(5), "empty");
  EXPECT_EQ(back->ModeOf(2), 04755);
  EXPECT_EQ(back->DirectoryMode(4), 0711);

  // A mode is part of the content: a chmod at the source is a new manifest.
  files[0].mode = 0644;
  auto chmodded = Manifest::FromEntries(Header(), files, dirs);
  ASSERT_TRUE(chmodded.ok());
  EXPECT_NE(chmodded->id(), m->id());
  dirs[2].mode = 0700;
  auto dir_chmodded = Manifest::FromEntries(Header(), files, dirs);
  ASSERT_TRUE(dir_chmodded.ok());
  EXPECT_NE(dir_chmodded->id(), chmodded->id());
}

TEST(ManifestTest, BadModesAndDirectoriesAreRefused) {
  auto too_big = Manifest::FromEntries(Header(), {{"a", 1, 1, 010000}});
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("07777"), std::string::npos);
  auto dir_too_big = Manifest::FromEntries(Header(), {}, {{"d", 0170000}});
  ASSERT_FALSE(dir_too_big.ok());
  EXPECT_NE(dir_too_big.status().message().find("'d'"), std::string::npos);
  auto twice = Manifest::FromEntries(Header(), {}, {{"d", 0755}, {"d", 0700}});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos);
  for (const char* bad : {"/abs", "a//b", "a/..", ".", "x/"}) {
    auto r = Manifest::FromEntries(Header(), {}, {{bad, 0755}});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// A manifest written by the version 1 format (before modes): made by Granary
// at 648c622 from {"cls/a.jpg", 3, 100}, {"cls/b.jpg", 2000, 200}, {"top", 0,
// 300} with chunk size 1024 and source file:///data/v1.
TEST(ManifestTest, Version1ManifestsStillRead) {
  const std::string bytes = testing::Version1ManifestBytes();
  auto m = Manifest::Decode(bytes);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->id().ToHex(), "6db55b90c23d137a237bc58b7b7e7433");
  ASSERT_EQ(m->sample_count(), 3u);
  EXPECT_EQ(m->PathOf(1), "cls/b.jpg");
  EXPECT_EQ(m->SizeOf(1), 2000u);
  EXPECT_EQ(m->ModeOf(0), kDefaultFileMode);
  EXPECT_EQ(m->DirectoryMode(1), kDefaultDirectoryMode);
  EXPECT_EQ(m->header().source_uri, "file:///data/v1");
  // It stays version 1: the same bytes, so its id (and every chunk key) holds.
  EXPECT_EQ(m->Encode(), bytes);
  // The same files built now make a version 3 manifest with another id.
  auto now = Manifest::FromEntries(
      m->header(), {{"cls/a.jpg", 3, 100}, {"cls/b.jpg", 2000, 200}, {"top", 0, 300}});
  ASSERT_TRUE(now.ok());
  EXPECT_NE(now->id(), m->id());
  EXPECT_EQ(LoadLe<uint32_t>(reinterpret_cast<const uint8_t*>(now->Encode().data()) +
                             manifest_format::kVersionOffset),
            3u);
}

// A manifest written by the version 2 format (modes, no ctime or inode): made
// by Granary at f747c30 (testing::Version2ManifestBytes says from what). It is
// read, its files have no ctime or inode (the source checks their size and
// mtime only), and it stays version 2, byte for byte.
TEST(ManifestTest, Version2ManifestsStillRead) {
  const std::string bytes = testing::Version2ManifestBytes();
  auto m = Manifest::Decode(bytes);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->id().ToHex(), "8cfd8e25de4b65259b95adb8a0f7650f");
  EXPECT_EQ(m->format_version(), 2u);
  ASSERT_EQ(m->sample_count(), 3u);
  EXPECT_EQ(m->PathOf(1), "cls/b.jpg");
  EXPECT_EQ(m->SizeOf(1), 2000u);
  EXPECT_EQ(m->MtimeOf(1), 200);
  EXPECT_EQ(m->ModeOf(0), 0640);
  EXPECT_EQ(m->ModeOf(2), 0600);
  ASSERT_EQ(m->directory_count(), 3u);
  EXPECT_EQ(m->DirectoryPath(2), "empty");
  EXPECT_EQ(m->DirectoryMode(1), 0750);
  EXPECT_EQ(m->header().source_uri, "file:///data/v2");
  for (SampleId id = 0; id < m->sample_count(); ++id) {
    EXPECT_EQ(m->CtimeOf(id), 0);
    EXPECT_EQ(m->InodeOf(id), 0u);
    EXPECT_EQ(m->Sample(id)->ctime_ns, 0);
    EXPECT_EQ(m->Sample(id)->inode, 0u);
  }
  EXPECT_EQ(m->Encode(), bytes);
  // The same files built now: version 3, another id.
  auto now = Manifest::FromEntries(
      m->header(),
      {{"cls/a.jpg", 3, 100, 0640}, {"cls/b.jpg", 2000, 200, 0444}, {"top", 0, 300, 0600}},
      {{"", 0755}, {"cls", 0750}, {"empty", 0700}});
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->format_version(), 3u);
  EXPECT_NE(now->id(), m->id());
}

TEST(ManifestTest, CtimeAndInodeRoundTripAndAreContent) {
  std::vector<FileEntry> files = {{"a", 3, 100, 0644, 1'700'000'000'123'456'789, 42},
                                  {"b/c", 70'000, 200, 0600, 1'700'000'001'000'000'000, 1ull << 40},
                                  {"d", 5, 300}};  // built by hand: nothing recorded
  auto m = Manifest::FromEntries(Header(), files);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format_version(), manifest_format::kVersion);
  EXPECT_EQ(m->CtimeOf(0), 1'700'000'000'123'456'789);
  EXPECT_EQ(m->InodeOf(1), 1ull << 40);
  EXPECT_EQ(m->CtimeOf(2), 0);
  EXPECT_EQ(m->InodeOf(2), 0u);
  auto info = m->Sample(1);
  ASSERT_OK(info);
  EXPECT_EQ(info->ctime_ns, 1'700'000'001'000'000'000);
  EXPECT_EQ(info->inode, 1ull << 40);
  auto back = Manifest::Decode(m->Encode());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->id(), m->id());
  EXPECT_EQ(back->Encode(), m->Encode());
  for (SampleId id = 0; id < 3; ++id) {
    EXPECT_EQ(back->CtimeOf(id), m->CtimeOf(id));
    EXPECT_EQ(back->InodeOf(id), m->InodeOf(id));
  }
  // Another version of a file is another manifest.
  files[0].ctime_ns += 1;
  auto touched = Manifest::FromEntries(Header(), files);
  ASSERT_TRUE(touched.ok());
  EXPECT_NE(touched->id(), m->id());
  files[0].ctime_ns -= 1;
  files[1].inode += 1;
  auto replaced = Manifest::FromEntries(Header(), files);
  ASSERT_TRUE(replaced.ok());
  EXPECT_NE(replaced->id(), m->id());
}

TEST(ManifestTest, SaveAndLoad) {
  testing::TempDir dir;
  Manifest m = Build(ImageNetLike(4, 4, 6));
  ASSERT_TRUE(m.Save(dir.Join("m.grm")).ok());
  auto loaded = Manifest::Load(dir.Join("m.grm"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->id(), m.id());
  auto missing = Manifest::Load(dir.Join("nope.grm"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.grm"), std::string::npos);
  dir.WriteFile("junk.grm", "hello");
  auto junk = Manifest::Load(dir.Join("junk.grm"));
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("junk.grm"), std::string::npos);
}

TEST(ManifestTest, MemoryUnderBudgetForImageNetLikePaths) {
  Manifest m = Build(ImageNetLike(100, 1000, 8), kDefaultChunkSize);
  ASSERT_TRUE(m.Find(m.PathOf(5)).ok());  // include the path index
  double per_sample = static_cast<double>(m.MemoryBytes()) / static_cast<double>(m.sample_count());
  EXPECT_LT(per_sample, 100.0);
}

}  // namespace
}  // namespace granary

// Staging through the benchmark's slow source (granary-slowfs, bench/slowfs:
// a FUSE pass-through with no kernel caching that counts every operation it
// serves), with on-demand readers racing the bulk workers. What the source
// sees is the figure: each piece of each file opened and read once
// for the whole training, and no metadata operation beyond what the kernel's
// own open of a path costs. Reading a staged dataset again touches the source
// not at all.
//
// What the kernel's open costs on such a mount, relative to a directory
// descriptor kept from an earlier open (PosixSource keeps them): the
// directory's attributes for the search-permission check, the LOOKUP of the
// name, and the file's attributes for the open's read-permission check
// (default_permissions with a zero attribute timeout). PosixSource adds
// nothing to those three: its checks before and after the read use the
// attributes the kernel already holds (AT_STATX_DONT_SYNC). An fstat after the
// read, as it did before, made it four (docs/benchmarks.md, "Source
// operations per staged file"). Each directory costs one LOOKUP more, once.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/stager.h"
#include "granary/source/identity.h"
#include "granary/source/posix_source.h"
#include "testing/slowfs_mount.h"
#include "testing/source_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::Bytes;
using ::granary::testing::OpenPosixSourceAsProcess;
using ::granary::testing::SlowFsMount;
using ::granary::testing::SnapshotTree;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using namespace std::chrono_literals;

constexpr uint64_t kChunkSize = 64 << 10;
constexpr char kDataset[] = "slowfs-staged";
// The kernel's own metadata operations per open of a path on granary-slowfs
// (the comment at the top).
constexpr uint64_t kKernelStatsPerOpen = 3;

bool FuseUsable() {
  const int fd = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  ::close(fd);
  return ::geteuid() == 0 || ::access("/usr/bin/fusermount3", X_OK) == 0;
}

// The mount's live counters (granary-slowfs's .slowfs-stats).
std::map<std::string, uint64_t> Counters(const std::string& mnt) {
  std::ifstream f(mnt + "/.slowfs-stats");
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::map<std::string, uint64_t> out;
  if (j.is_discarded()) return out;
  for (const char* key : {"opens", "stats", "reads", "read_bytes", "readdirs", "errors"}) {
    out[key] = j.value(key, uint64_t{0});
  }
  return out;
}

std::map<std::string, uint64_t> Delta(const std::map<std::string, uint64_t>& before,
                                      const std::map<std::string, uint64_t>& after) {
  std::map<std::string, uint64_t> d;
  for (const auto& [k, v] : after) d[k] = v - before.at(k);
  return d;
}

class StagerSlowFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!FuseUsable()) GTEST_SKIP() << "needs /dev/fuse and root or fusermount3";
    auto e = IdentityExecutor::Start({.threads = 8});
    ASSERT_OK(e);
    executor_ = std::move(*e);
    // 240 small files in six directories, and two larger than a chunk.
    std::mt19937 rng(21);
    for (int i = 0; i < 240; ++i) {
      Write("c" + std::to_string(i % 6) + "/s" + std::to_string(i) + ".bin", 1 + rng() % 9000);
    }
    Write("big/a.bin", 150'000);
    Write("big/b.bin", 90'000);
    slow_ =
        std::make_unique<SlowFsMount>(GRANARY_SLOWFS_BINARY, dir_.Join("src"), dir_.Join("mnt"));
    // A latency so that readers and workers overlap; every operation counted.
    ASSERT_OK(slow_->Start({.latency_ms = 0.5}, dir_.Join("slowfs.log")));
    const std::string mnt = slow_->mount_point();
    auto m = SnapshotTree(mnt, kChunkSize);
    ASSERT_OK(m);
    manifest_ = std::move(*m);
    for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) {
      segments_ += manifest_->Segments(c)->size();
    }
    auto s = OpenPosixSourceAsProcess(mnt, executor_.get());
    ASSERT_OK(s);
    source_ = std::move(*s);
    auto store = ChunkStore::Open(dir_.Join("store"), 1ull << 30);
    ASSERT_OK(store);
    store_ = std::move(*store);
  }

  void TearDown() override {
    stager_.reset();  // its workers before the mount goes
    source_.reset();
  }

  void Write(const std::string& rel, size_t size) {
    sizes_[rel] = size;
    dir_.WriteFile("src/" + rel, Bytes(rel, size));
  }
  std::string Expected(SampleId s) const {
    const std::string path = manifest_->PathOf(s);
    return Bytes(path, sizes_.at(path));
  }

  TempDir dir_;
  std::map<std::string, size_t> sizes_;
  std::unique_ptr<IdentityExecutor> executor_;
  std::unique_ptr<SlowFsMount> slow_;
  std::shared_ptr<const Manifest> manifest_;
  uint64_t segments_ = 0;
  std::shared_ptr<PosixSource> source_;
  std::shared_ptr<ChunkStore> store_;
  std::unique_ptr<Stager> stager_;
};

TEST_F(StagerSlowFsTest, EachPieceIsOpenedOnceAndCostsOnlyTheKernelsLookup) {
  const std::string mnt = slow_->mount_point();
  const auto before = Counters(mnt);
  ASSERT_FALSE(before.empty());

  std::vector<ChunkId> all(manifest_->chunk_count());
  for (ChunkId c = 0; c < all.size(); ++c) all[c] = c;
  StagerOptions options;
  options.dataset = kDataset;
  options.threads = 6;
  auto created = Stager::Create(manifest_, source_, store_, all, options);
  ASSERT_OK(created);
  stager_ = std::move(*created);
  ASSERT_OK(stager_->Start());

  // Readers ask for every sample in their own orders while the bulk workers
  // stage: on demand, shared with a read in flight, or from the store.
  std::atomic<int> wrong{0};
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      std::vector<SampleId> order(manifest_->sample_count());
      for (SampleId s = 0; s < order.size(); ++s) order[s] = s;
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(r)));
      for (SampleId s : order) {
        auto bytes = stager_->FetchSample(s);
        if (!bytes.ok() || *bytes != Expected(s)) {
          wrong.fetch_add(1);
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.empty()) {
            std::string why = bytes.ok() ? "wrong bytes" : bytes.status().ToString();
            if (bytes.ok()) {
              const std::string want = Expected(s);
              size_t at = 0;
              while (at < bytes->size() && at < want.size() && (*bytes)[at] == want[at]) ++at;
              why += " (" + std::to_string(bytes->size()) + " bytes, expected " +
                     std::to_string(want.size()) + ", first difference at " + std::to_string(at) +
                     ")";
            }
            first_error = "sample " + std::to_string(s) + " " + manifest_->PathOf(s) + ": " + why;
          }
        }
      }
    });
  }
  for (std::thread& t : readers) t.join();
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kComplete; }, 60s));
  EXPECT_EQ(wrong.load(), 0) << first_error;
  const StagerProgress p = stager_->Progress();
  EXPECT_GT(p.on_demand_fetches + p.on_demand_shared, 0u) << "no reader raced the workers";

  const auto d = Delta(before, Counters(mnt));
  // One open and one read per piece (a sample per small file, one per chunk
  // a big file spans), for bulk and on-demand reads together.
  EXPECT_EQ(d.at("opens"), segments_);
  EXPECT_EQ(d.at("reads"), segments_);
  EXPECT_EQ(d.at("read_bytes"), manifest_->total_bytes());
  EXPECT_EQ(d.at("readdirs"), 0u);
  EXPECT_EQ(d.at("errors"), 0u);
  // Plus one LOOKUP per directory, whose descriptor PosixSource keeps.
  std::set<std::string> directories;
  for (SampleId s = 0; s < manifest_->sample_count(); ++s) {
    const std::string path = manifest_->PathOf(s);
    directories.insert(path.substr(0, path.rfind('/')));
  }
  EXPECT_LE(d.at("stats"), kKernelStatsPerOpen * d.at("opens") + directories.size())
      << "more metadata operations per open than the kernel's own lookup costs";
  const SourceCounters c = source_->Counters();
  EXPECT_EQ(c.opens, segments_);
  EXPECT_EQ(c.errors_total(), 0u);

  // Staged: reading everything again costs the source nothing.
  const auto staged = Counters(mnt);
  for (SampleId s = 0; s < manifest_->sample_count(); ++s) {
    auto bytes = stager_->FetchSample(s);
    ASSERT_OK(bytes);
    ASSERT_EQ(*bytes, Expected(s)) << "sample " << s;
  }
  const auto again = Delta(staged, Counters(mnt));
  EXPECT_EQ(again.at("opens"), 0u);
  EXPECT_EQ(again.at("stats"), 0u);
  EXPECT_EQ(again.at("reads"), 0u);
}

}  // namespace
}  // namespace granary

// libgranary-client's direct reads (session_direct.cc) against the real
// thing: a granary-cachenode with its handoff socket, a granary-sidecar that
// reads its chunk files (local_node_socket) and hands them to sessions, and
// Redis (CacheCluster). Every sample byte-exact or a clear error, never
// another dataset's bytes: while readers in several processes run and chunks
// are dropped, evicted and staged again and the node restarts; when the
// sidecar dies mid-epoch; when a chunk file is damaged on disk; and a uid
// that may not have a dataset's chunk files never receives a descriptor.

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "granary/client/session.h"
#include "granary/core/chunk_file.h"
#include "granary/protocol/chunk_handoff.h"
#include "testing/cachenode_fixture.h"
#include "testing/child_process.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::client {
namespace {

using namespace std::chrono_literals;
using testing::CacheCluster;
using testing::CacheNodeOptions;
using testing::ChildProcess;
using testing::DatasetOptions;
using testing::SidecarOptions;
using testing::SidecarProcess;
using testing::TestDataset;

// Descriptors this process holds on chunk files (their links end in .chunk,
// or in ".chunk (deleted)" once the node dropped them), with whether each is
// open read-only.
struct HeldChunkFiles {
  bool listed = false;  // /proc/self/fd could be read
  size_t count = 0;
  size_t writable = 0;
};
HeldChunkFiles ChunkFilesHeldHere() {
  HeldChunkFiles held;
  std::error_code ec;
  auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
  held.listed = !ec;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(it->path(), link_ec).string();
    if (link_ec || target.find(".chunk") == std::string::npos) continue;
    ++held.count;
    const int fd = std::stoi(it->path().filename().string());
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) != O_RDONLY) ++held.writable;
  }
  return held;
}

Status SetCache(MetadataStore& store, const std::string& dataset, const DatasetCacheSpec& cache) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    GRANARY_ASSIGN_OR_RETURN(DatasetRecord record, store.GetDataset(dataset));
    record.spec.cache = cache;
    Result<DatasetRecord> updated = store.UpdateDataset(record);
    if (updated.ok()) return Status::Ok();
    if (updated.status().code() != StatusCode::kFailedPrecondition) return updated.status();
  }
  return Status::Unavailable("the record of " + dataset + " kept changing");
}

class DirectReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    // Others may search the test's directory (the sockets are in it), not list it.
    ASSERT_EQ(::chmod(cluster_->dir().path().c_str(), 0711), 0);
    handoff_ = cluster_->dir().path() + "/node.sock";
    CacheNodeOptions node;
    node.extra_yaml = "local_socket: " + handoff_ + "\n";
    ASSERT_OK(cluster_->StartNodes(1, node));
    ds_ = CreateDataset("ds");
    other_ = CreateDataset("other");
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    ASSERT_OK(StartSidecar());
  }

  TestDataset CreateDataset(const std::string& name) {
    DatasetOptions d;
    d.name = name;
    d.files = 300;
    d.min_size = 300;
    d.max_size = 9000;
    d.chunk_size = 64 * 1024;
    auto ds = cluster_->CreateDataset(d);
    EXPECT_OK(ds);
    if (!ds.ok()) return {};
    EXPECT_OK(cluster_->WaitForPhase(name, DatasetPhase::kReady));
    return std::move(*ds);
  }

  Status StartSidecar() {
    SidecarOptions o;
    o.store_url = cluster_->store_url();
    o.local_node_id = cluster_->node(0).id();
    o.window_bytes = "1MiB";
    o.arena_bytes = "32MiB";
    o.window_samples = 64;
    o.extra_yaml = "local_node_socket: " + handoff_ + "\n";
    sidecar_ = std::make_unique<SidecarProcess>(o, cluster_->dir().path() + "/sidecar");
    GRANARY_RETURN_IF_ERROR(sidecar_->StartAndWaitReady());
    ::chmod((cluster_->dir().path() + "/sidecar").c_str(), 0711);
    return Status::Ok();
  }

  SessionOptions Options() const {
    SessionOptions o;
    o.socket_path = sidecar_->socket_path();
    o.call_timeout = 30s;
    o.connect_timeout = 10s;
    return o;
  }

  std::unique_ptr<Session> Open(const std::string& dataset) {
    auto s = Session::Open(dataset, Options());
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<CacheCluster> cluster_;
  std::string handoff_;
  TestDataset ds_;
  TestDataset other_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

TEST_F(DirectReadTest, StagedSamplesAreReadFromTheirChunkFilesReadOnlyAndByteExact) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->protocol_version(), sidecar_protocol::kChunkFilesVersion);
  for (uint32_t id = 0; id < ds_.sample_count(); ++id) {
    auto bytes = session->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]) << "sample " << id;
  }
  const DirectReadCounters c = session->direct_counters();
  EXPECT_OK(session->direct_status());
  // Every sample is staged and whole (samples are smaller than a chunk).
  EXPECT_EQ(c.samples, ds_.sample_count());
  EXPECT_EQ(c.fallbacks, 0u);
  EXPECT_EQ(c.chunk_files, ds_.manifest->chunk_count());
  const HeldChunkFiles held = ChunkFilesHeldHere();
  ASSERT_TRUE(held.listed);
  EXPECT_GT(held.count, 0u);
  EXPECT_EQ(held.writable, 0u) << "a chunk file was handed over writable";
  auto handed = sidecar_->MetricValue("granary_sidecar_chunk_files_total", {{"outcome", "handed"}});
  ASSERT_OK(handed);
  EXPECT_EQ(*handed, static_cast<double>(ds_.manifest->chunk_count()));

  // Off: everything through the arena, no descriptor taken.
  SessionOptions off = Options();
  off.direct_reads = false;
  auto arena = Session::Open(ds_.name, off);
  ASSERT_OK(arena);
  for (uint32_t id = 0; id < ds_.sample_count(); id += 7) {
    auto bytes = (*arena)->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]);
  }
  EXPECT_EQ((*arena)->direct_counters().samples, 0u);
  EXPECT_EQ((*arena)->direct_counters().chunk_files, 0u);
}

// A dataset of more chunks than the 64 files a session once kept: shuffled
// passes take each chunk's file once (none is let go and asked for again,
// which would cost a round trip and a new map per sample).
TEST_F(DirectReadTest, ShuffledPassesOverManyChunksTakeEachChunkFileOnce) {
  DatasetOptions d;
  d.name = "many";
  d.files = 300;
  d.min_size = 300;
  d.max_size = 9000;
  d.chunk_size = 16 * 1024;
  auto many = cluster_->CreateDataset(d);
  ASSERT_OK(many);
  ASSERT_OK(cluster_->WaitForPhase(d.name, DatasetPhase::kReady));
  ASSERT_GT(many->manifest->chunk_count(), 64u);
  auto session = Open(d.name);
  ASSERT_NE(session, nullptr);
  std::vector<uint32_t> order(many->sample_count());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(3);
  for (int pass = 0; pass < 3; ++pass) {
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t id : order) {
      auto bytes = session->Read(id);
      ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
      ASSERT_EQ(*bytes, many->contents[id]) << "sample " << id;
    }
  }
  const DirectReadCounters c = session->direct_counters();
  EXPECT_EQ(c.chunk_files, many->manifest->chunk_count());
  EXPECT_GT(c.samples, 0u);
  EXPECT_EQ(c.fallbacks, 0u);
}

// What a reader in a forked child has done so far, in memory shared with the
// parent (MAP_SHARED before the fork), so the parent waits on progress rather
// than on time.
struct ReaderProgress {
  std::atomic<uint64_t> correct{0};
  std::atomic<uint64_t> wrong{0};    // bytes that are not the sample's: never allowed
  std::atomic<uint64_t> errors{0};   // clear errors (a Status)
  std::atomic<uint64_t> direct{0};   // of the correct ones, read from a chunk file
  std::atomic<uint64_t> dropped{0};  // chunk files let go because the node dropped them
  std::atomic<uint64_t> fallbacks{0};
  std::atomic<bool> done{false};
  uint64_t reads() const { return correct.load() + errors.load(); }
};

// Reads shuffled passes over `ds`, every fourth read from `other` instead,
// each compared with what it must be, until the parent asks it to stop, 2000
// passes are done or 120 s passed. Exits 0, or 2 for wrong bytes, 3 for no
// correct read at all, 4 when it could not open a session.
int ReadInChild(int control_fd, const SessionOptions& options, const TestDataset& ds,
                const TestDataset& other, unsigned seed, ReaderProgress* progress) {
  auto session = Session::Open(ds.name, options);
  auto other_session = Session::Open(other.name, options);
  if (!session.ok() || !other_session.ok()) return 4;
  std::vector<uint32_t> order(ds.sample_count());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  bool ready_sent = false;
  bool stop = false;
  for (int pass = 0; pass < 2000 && !stop && std::chrono::steady_clock::now() < deadline; ++pass) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < order.size() && !stop; ++i) {
      const uint32_t id = order[i];
      const bool from_other = i % 4 == 0 && id < other.sample_count();
      auto bytes = from_other ? (*other_session)->Read(id) : (*session)->Read(id);
      if (!bytes.ok()) {
        progress->errors.fetch_add(1);
      } else if (*bytes != (from_other ? other.contents[id] : ds.contents[id])) {
        progress->wrong.fetch_add(1);
      } else {
        progress->correct.fetch_add(1);
      }
      if (i % 32 == 0) {
        const DirectReadCounters a = (*session)->direct_counters();
        const DirectReadCounters b = (*other_session)->direct_counters();
        progress->direct.store(a.samples + b.samples);
        progress->dropped.store(a.dropped + b.dropped);
        progress->fallbacks.store(a.fallbacks + b.fallbacks);
        pollfd p{control_fd, POLLIN, 0};
        stop = ::poll(&p, 1, 0) > 0;
      }
    }
    if (!ready_sent) {
      const char byte = 'r';
      ready_sent = ::write(control_fd, &byte, 1) == 1;
    }
  }
  progress->done.store(true);
  if (progress->wrong.load() > 0) return 2;
  return progress->correct.load() == 0 ? 3 : 0;
}

// The files under `under` that process `pid` holds open though they were
// unlinked.
size_t DeletedFilesHeldBy(pid_t pid, const std::string& under) {
  size_t held = 0;
  std::error_code ec;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), link_ec).string();
    if (!link_ec && target.ends_with(" (deleted)") && target.starts_with(under)) ++held;
  }
  return held;
}

TEST_F(DirectReadTest, ForkedReadersStayByteExactWhileChunksAreDroppedRestagedAndTheNodeRestarts) {
  constexpr size_t kReaders = 3;
  void* shared = ::mmap(nullptr, sizeof(ReaderProgress) * kReaders, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* progress = new (shared) ReaderProgress[kReaders];
  struct Unmap {
    void* p;
    ~Unmap() { ::munmap(p, sizeof(ReaderProgress) * kReaders); }
  } unmap{shared};
  std::vector<std::unique_ptr<ChildProcess>> children;
  const SessionOptions options = Options();
  for (size_t r = 0; r < kReaders; ++r) {
    const TestDataset& ds = ds_;
    const TestDataset& other = other_;
    ReaderProgress* mine = &progress[r];
    auto child = ChildProcess::Start([&options, &ds, &other, r, mine](int control_fd) {
      return ReadInChild(control_fd, options, ds, other, static_cast<unsigned>(r + 1), mine);
    });
    ASSERT_OK(child);
    children.push_back(std::move(*child));
  }
  for (auto& child : children) ASSERT_OK(child->AwaitReady(90s));
  // Every reader reads on, `n` more reads each (bounded wait).
  const auto all_read_on = [&](uint64_t n) {
    std::vector<uint64_t> from;
    for (size_t r = 0; r < kReaders; ++r) from.push_back(progress[r].reads());
    return testing::WaitFor(
        [&] {
          for (size_t r = 0; r < kReaders; ++r) {
            if (progress[r].reads() < from[r] + n && !progress[r].done.load()) return false;
          }
          return true;
        },
        30s);
  };
  const std::string data_dir = cluster_->node(0).data_dir();
  auto handed_before =
      sidecar_->MetricValue("granary_sidecar_chunk_files_total", {{"outcome", "handed"}});
  ASSERT_OK(handed_before);

  // Evicted: a limit of a quarter of the dataset drops chunk files the
  // readers hold; they let them go and read on.
  DatasetCacheSpec quarter;
  quarter.max_resident_bytes = ds_.total_bytes / 4;
  ASSERT_OK(SetCache(cluster_->store(), ds_.name, quarter));
  EXPECT_OK(cluster_->node(0).WaitForMetric(
      "granary_cachenode_evicted_chunks_total", {{"dataset", ds_.name}, {"reason", "limit"}},
      [](double v) { return v > 0; }, 30s));
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        for (size_t r = 0; r < kReaders; ++r) {
          if (DeletedFilesHeldBy(children[r]->pid(), data_dir) > 0) return false;
        }
        return true;
      },
      30s))
      << "a reader still holds chunk files the node dropped";
  // Each reader publishes its counters every 32 reads: waited for.
  const auto dropped = [&] {
    uint64_t n = 0;
    for (size_t r = 0; r < kReaders; ++r) n += progress[r].dropped.load();
    return n;
  };
  EXPECT_TRUE(testing::WaitFor([&] { return dropped() > 0; }, 10s))
      << "no reader saw a dropped chunk file";
  EXPECT_TRUE(all_read_on(300));

  // The node goes away (the readers read what they hold, the sidecar the
  // rest from the source) and comes back with its chunk files.
  ASSERT_OK(cluster_->node(0).Kill());
  EXPECT_TRUE(all_read_on(300));
  ASSERT_OK(cluster_->node(0).StartAndWaitReady());
  EXPECT_TRUE(all_read_on(300));

  // No limit: what was dropped is staged again as it is read. The other
  // dataset's files all go, then come back.
  ASSERT_OK(SetCache(cluster_->store(), ds_.name, DatasetCacheSpec{}));
  DatasetCacheSpec none;
  none.max_resident_bytes = 1;
  ASSERT_OK(SetCache(cluster_->store(), other_.name, none));
  EXPECT_OK(cluster_->node(0).WaitForMetric(
      "granary_cachenode_evicted_chunks_total", {{"dataset", other_.name}, {"reason", "limit"}},
      [](double v) { return v > 0; }, 30s));
  EXPECT_TRUE(all_read_on(300));
  ASSERT_OK(SetCache(cluster_->store(), other_.name, DatasetCacheSpec{}));
  // Staged again as the readers (through the sidecar) read them, and handed
  // over again.
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto handed =
            sidecar_->MetricValue("granary_sidecar_chunk_files_total", {{"outcome", "handed"}});
        return handed.ok() && *handed > *handed_before;
      },
      30s, 50ms))
      << "no chunk file was handed over again";
  EXPECT_TRUE(all_read_on(300));

  for (auto& child : children) child->RequestStop();
  for (size_t r = 0; r < kReaders; ++r) {
    auto code = children[r]->Wait(120s);
    ASSERT_OK(code);
    const ReaderProgress& p = progress[r];
    EXPECT_EQ(*code, 0) << "reader " << r << " (2: wrong bytes, 3: nothing read, 4: no session)";
    EXPECT_EQ(p.wrong.load(), 0u) << "reader " << r;
    EXPECT_GT(p.direct.load(), 0u) << "reader " << r << " never read a chunk file itself";
    std::cout << "reader " << r << ": " << p.correct.load() << " correct, " << p.errors.load()
              << " errors, " << p.direct.load() << " direct, " << p.fallbacks.load()
              << " fallbacks, " << p.dropped.load() << " dropped files\n";
  }
}

// Maps of chunk files this process holds that the node has unlinked (their
// lines in /proc/self/maps end in ".chunk (deleted)").
size_t DroppedChunkFilesMappedHere() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    if (line.ends_with(".chunk (deleted)")) files.insert(line.substr(line.find('/')));
  }
  return files.size();
}

TEST_F(DirectReadTest, MappedSamplesStayByteExactAfterTheNodeDropsTheirFiles) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  std::vector<uint32_t> all(ds_.sample_count());
  for (uint32_t id = 0; id < all.size(); ++id) all[id] = id;
  std::vector<MappedSample> held;
  for (uint32_t id : all) {
    session->LocateDirect(std::span<const uint32_t>(&id, 1));
    auto mapped = session->MapDirect(id);
    ASSERT_TRUE(mapped.ok()) << id << ": " << mapped.status().ToString();
    ASSERT_EQ(mapped->bytes(), ds_.contents[id]) << "sample " << id;
    held.push_back(*std::move(mapped));
  }
  EXPECT_EQ(session->direct_counters().chunk_files, ds_.manifest->chunk_count());

  // Every chunk file of the dataset dropped: the node unlinks them (never
  // truncates), so the maps read on, with the same bytes, and no SIGBUS.
  DatasetCacheSpec none;
  none.max_resident_bytes = 1;
  ASSERT_OK(SetCache(cluster_->store(), ds_.name, none));
  EXPECT_TRUE(testing::WaitFor(
      [&] { return DroppedChunkFilesMappedHere() == ds_.manifest->chunk_count(); }, 30s))
      << DroppedChunkFilesMappedHere() << " of " << ds_.manifest->chunk_count()
      << " mapped chunk files dropped";
  for (const MappedSample& m : held) {
    ASSERT_EQ(m.bytes(), ds_.contents[m.id]) << "sample " << m.id << " after its file was dropped";
  }

  // The session lets the dropped files go (within a second of a read) and
  // reads on through the arena; the views still hold their maps.
  ASSERT_OK(SetCache(cluster_->store(), ds_.name, DatasetCacheSpec{}));
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        (void)session->MapDirect(0);
        return session->direct_counters().dropped > 0;
      },
      10s, 100ms));
  for (uint32_t id : all) {
    auto bytes = session->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]) << "sample " << id;
  }
  EXPECT_EQ(DroppedChunkFilesMappedHere(), ds_.manifest->chunk_count())
      << "the views hold their files' maps";
  held.clear();
  session.reset();
  EXPECT_EQ(DroppedChunkFilesMappedHere(), 0u) << "a dropped file stayed mapped";
}

TEST_F(DirectReadTest, ASidecarThatDiesMidEpochFailsClearlyNeverWithWrongBytes) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  const auto half = static_cast<uint32_t>(ds_.sample_count() / 2);
  for (uint32_t id = 0; id < half; ++id) {
    auto bytes = session->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]);
  }
  ASSERT_GT(session->direct_counters().samples, 0u);
  ASSERT_OK(sidecar_->Kill());

  size_t correct = 0;
  size_t failed = 0;
  for (uint32_t id = 0; id < ds_.sample_count(); ++id) {
    auto bytes = session->Read(id);
    if (bytes.ok()) {
      ASSERT_EQ(*bytes, ds_.contents[id]) << "sample " << id;
      ++correct;
      continue;
    }
    ++failed;
    EXPECT_EQ(bytes.status().code(), StatusCode::kUnavailable) << bytes.status().ToString();
    EXPECT_NE(bytes.status().message().find(sidecar_->socket_path()), std::string::npos)
        << bytes.status().ToString();
  }
  // What was handed over before reads on (verified); what needs the sidecar fails.
  EXPECT_GE(correct, half);
  EXPECT_GT(failed, 0u);
  EXPECT_FALSE(session->Ping().ok());

  ASSERT_OK(sidecar_->StartAndWaitReady());
  auto again = Open(ds_.name);
  ASSERT_NE(again, nullptr);
  for (uint32_t id = 0; id < ds_.sample_count(); ++id) {
    auto bytes = again->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]);
  }
}

TEST_F(DirectReadTest, AChunkFileDamagedOnDiskIsDetectedRepairedAndTheReaderGetsTheRightBytes) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  const SampleId victim = 5;
  auto first = session->Read(victim);
  ASSERT_OK(first);
  ASSERT_EQ(*first, ds_.contents[victim]);
  ASSERT_EQ(session->direct_counters().samples, 1u);

  // Damage the sample's bytes in the node's file of its chunk, in place.
  const ChunkId chunk = ds_.manifest->ChunkOf(victim);
  auto segments = ds_.manifest->Segments(chunk);
  ASSERT_OK(segments);
  const ChunkKey key{ds_.name, ds_.manifest_id, chunk};
  std::string path;
  uint64_t offset = 0;
  for (const std::string& file : cluster_->node(0).ChunkFiles()) {
    auto reader = ChunkReader::Open(file, key, *segments);
    if (!reader.ok()) continue;
    for (uint32_t i = 0; i < reader->segment_count(); ++i) {
      if (reader->segments()[i].sample != victim) continue;
      auto at = reader->PayloadOffset(i);
      ASSERT_OK(at);
      path = file;
      offset = *at;
    }
  }
  ASSERT_FALSE(path.empty()) << "no chunk file of chunk " << chunk << " on the node";
  {
    ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    const std::string flipped(16, '\xA5');
    ASSERT_EQ(::pwrite(fd.get(), flipped.data(), flipped.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(flipped.size()));
  }

  auto second = session->Read(victim);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, ds_.contents[victim]);
  const DirectReadCounters c = session->direct_counters();
  EXPECT_EQ(c.corrupt, 1u);
  EXPECT_EQ(c.fallbacks, 1u);
  EXPECT_EQ(c.samples, 1u) << "the damaged bytes were counted as read";

  // The sidecar's own read of it failed its check too, and the node, asked
  // over the network, staged it again: the node's file of the chunk reads
  // right.
  handoff::ChunkHandoffClient handoff(handoff_, 5s);
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto fd = handoff.OpenChunk({ds_.name, ds_.manifest_id, chunk});
        if (!fd.ok()) return false;
        auto reader = ChunkReader::FromFd(std::move(*fd), "handed", key, *segments);
        if (!reader.ok()) return false;
        for (uint32_t i = 0; i < reader->segment_count(); ++i) {
          if (reader->segments()[i].sample != victim) continue;
          auto bytes = reader->Read(i);
          return bytes.ok() && *bytes == ds_.contents[victim];
        }
        return false;
      },
      20s))
      << "the node did not stage the damaged sample again";
}

TEST_F(DirectReadTest, AUidThatMayNotHaveTheChunkFilesNeverReceivesADescriptor) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  // The dataset belongs to root (this process); uid 65534, in root's group
  // so that it may use the sidecar's socket (mode 0660), reads through the
  // arena only.
  const SessionOptions options = Options();
  const TestDataset& ds = ds_;
  auto child = ChildProcess::Start([&options, &ds](int) {
    const gid_t socket_group = 0;
    if (::setgroups(1, &socket_group) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) {
      return 10;
    }
    // Changing uid made the process undumpable, which hides /proc/self/fd
    // from itself: the check below must see its descriptors.
    if (::prctl(PR_SET_DUMPABLE, 1) != 0) return 18;
    const HeldChunkFiles before = ChunkFilesHeldHere();
    if (!before.listed) return 19;
    if (before.count != 0) return 11;
    auto session = Session::Open(ds.name, options);
    if (!session.ok()) return 12;
    for (uint32_t id = 0; id < ds.sample_count(); ++id) {
      auto bytes = (*session)->Read(id);
      if (!bytes.ok()) return 13;
      if (*bytes != ds.contents[id]) return 14;
    }
    if ((*session)->direct_counters().chunk_files != 0) return 15;
    if (ChunkFilesHeldHere().count != 0) return 16;
    if ((*session)->direct_status().code() != StatusCode::kPermissionDenied) return 17;
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(60s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "10: setuid failed, 11: held chunk files before, 12: no session, 13: a "
                         "read failed, 14: wrong bytes, 15: handed a chunk file, 16: holds a "
                         "chunk file, 17: direct reads not refused, 18/19: /proc/self/fd not "
                         "readable";
  auto refused =
      sidecar_->MetricValue("granary_sidecar_chunk_files_total", {{"outcome", "refused"}});
  ASSERT_OK(refused);
  EXPECT_GE(*refused, 1);
  auto handed = sidecar_->MetricValue("granary_sidecar_chunk_files_total", {{"outcome", "handed"}});
  ASSERT_OK(handed);
  EXPECT_EQ(*handed, 0);

  // Root (the owner) is handed them: the check above can fail.
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  ASSERT_OK(session->Read(0));
  EXPECT_GT(ChunkFilesHeldHere().count, 0u);
}

}  // namespace
}  // namespace granary::client

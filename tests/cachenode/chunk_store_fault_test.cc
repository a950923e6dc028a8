// The cache node's store, stager and read service when the disk fails, with
// faults injected by tests/testing/faulty_chunk_store.h over a real on-disk
// ChunkStore (a real source tree, PosixSource, Stager, ChunkReadService, and
// the real Server + PeerClient on 127.0.0.1):
//  - the file system fills up (ENOSPC) in the middle of staging: staging
//    pauses in kDiskFull with an error that names the store and says what to
//    do, retries after its backoff (moved by a ManualClock, no sleeping),
//    and the node keeps serving what it staged;
//  - a stored chunk's read fails with EIO: the READ item fails with an error
//    naming the chunk and the store (no bytes, never other bytes), the
//    failure is counted, the server stays up and the other items are served.

#include <gmock/gmock.h>

#include <chrono>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "granary/cachenode/chunk_read_service.h"
#include "granary/cachenode/chunk_store.h"
#include "granary/cachenode/server.h"
#include "granary/cachenode/stager.h"
#include "granary/core/clock.h"
#include "granary/peer/peer_client.h"
#include "granary/source/identity.h"
#include "testing/faulty_chunk_store.h"
#include "testing/source_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::Bytes;
using ::granary::testing::FaultyChunkStore;
using ::granary::testing::OpenPosixSourceAsProcess;
using ::granary::testing::SnapshotTree;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kChunkSize = 32 << 10;
constexpr char kDataset[] = "imagenet";

class ChunkStoreFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = IdentityExecutor::Start({.threads = 4});
    ASSERT_OK(e);
    executor_ = std::move(*e);
    const std::string root = dir_.Join("source");
    std::mt19937 rng(11);
    for (int i = 0; i < 120; ++i) {
      const std::string rel = "d" + std::to_string(i % 4) + "/f" + std::to_string(i) + ".bin";
      sizes_[rel] = 1 + rng() % 3000;
      dir_.WriteFile("source/" + rel, Bytes(rel, sizes_[rel]));
    }
    auto m = SnapshotTree(root, kChunkSize);
    ASSERT_OK(m);
    manifest_ = std::move(*m);
    ASSERT_GE(manifest_->chunk_count(), 4u);
    auto s = OpenPosixSourceAsProcess(root, executor_.get());
    ASSERT_OK(s);
    source_ = std::move(*s);
    auto real = ChunkStore::Open(dir_.Join("store"), 1ull << 30);
    ASSERT_OK(real);
    store_ = std::make_shared<FaultyChunkStore>(std::move(*real));
    ChunkReadServiceOptions so;
    so.node_name = "node-a";
    service_ = std::make_shared<ChunkReadService>(store_, so);
  }
  void TearDown() override {
    server_.reset();
    service_.reset();
    stager_.reset();
  }

  // A stager owning every chunk, in chunk order, on the test's clock.
  void CreateStager() {
    std::vector<ChunkId> owned;
    for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) owned.push_back(c);
    StagerOptions o;
    o.dataset = kDataset;
    o.threads = 1;  // one chunk at a time: the fault meets chunks in order
    // Far longer than the test's deadlines: only the test's clock can end it.
    o.disk_full_backoff = 1h;
    o.disk_full_backoff_max = 2h;
    o.disk_full_retries = 100;
    o.clock = &clock_;
    auto s = Stager::Create(manifest_, source_, store_, owned, o);
    ASSERT_OK(s);
    stager_ = std::shared_ptr<Stager>(std::move(*s));
    ASSERT_OK(service_->Add(manifest_, stager_));
  }

  // The server over the service, and a client of it.
  void StartServer() {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.node_name = "node-a";
    auto server = Server::Start(service_, options);
    ASSERT_OK(server);
    server_ = std::move(*server);
    PeerClientOptions co;
    co.client_name = "chunk-store-fault-test";
    co.connect_timeout = 5s;
    co.call_timeout = 10s;
    auto client = PeerClient::Connect("127.0.0.1:" + std::to_string(server_->port()), co);
    ASSERT_OK(client);
    client_.emplace(std::move(*client));
  }

  std::string Expected(SampleId id) const {
    const std::string path = manifest_->PathOf(id);
    return Bytes(path, sizes_.at(path));
  }
  ReadRequest Request(std::vector<SampleId> ids) const {
    ReadRequest r;
    r.dataset = kDataset;
    r.manifest_id = manifest_->id();
    for (SampleId id : ids) {
      r.items.push_back(
          ReadItem{ReadKind::kSample, id, 0, static_cast<uint32_t>(manifest_->SizeOf(id))});
    }
    return r;
  }
  // Samples whose (only) piece lies in `chunk`.
  std::vector<SampleId> SamplesOf(ChunkId chunk) const {
    std::vector<SampleId> out;
    const std::vector<ChunkSegment> segments = *manifest_->Segments(chunk);
    for (const ChunkSegment& s : segments) out.push_back(s.sample);
    return out;
  }
  bool ChunkComplete(ChunkId chunk) const {
    auto c = store_->Chunk(ChunkKey{kDataset, manifest_->id(), chunk});
    return c.ok() && c->complete();
  }

  TempDir dir_;
  std::map<std::string, size_t> sizes_;
  ManualClock clock_;
  std::unique_ptr<IdentityExecutor> executor_;
  std::shared_ptr<const Manifest> manifest_;
  std::shared_ptr<Source> source_;
  std::shared_ptr<FaultyChunkStore> store_;
  std::shared_ptr<Stager> stager_;
  std::shared_ptr<ChunkReadService> service_;
  std::unique_ptr<Server> server_;
  std::optional<PeerClient> client_;
};

TEST_F(ChunkStoreFaultTest, DiskFullPausesStagingNamesTheStoreAndTheNodeServesWhatItHas) {
  // The disk fills up from chunk 2 on: chunks 0 and 1 fit, every write after
  // them finds no space.
  const ChunkId full_from = 2;
  std::set<ChunkId> later;
  for (ChunkId c = full_from; c < manifest_->chunk_count(); ++c) later.insert(c);
  store_->FailWrites(FaultyChunkStore::ChunkIds(later), ENOSPC);
  CreateStager();
  StartServer();
  ASSERT_OK(stager_->Start());

  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kDiskFull; }, 20s))
      << StagingStateName(stager_->Progress().state);
  const StagerProgress paused = stager_->Progress();
  EXPECT_EQ(paused.last_error.code(), StatusCode::kResourceExhausted);
  // It names the store and the chunk, and says what to do.
  EXPECT_THAT(paused.last_error.message(), HasSubstr("chunk store " + store_->root()));
  EXPECT_THAT(paused.last_error.message(), HasSubstr("chunk " + std::to_string(full_from)));
  EXPECT_THAT(paused.last_error.message(), HasSubstr("No space left on device"));
  EXPECT_THAT(paused.last_error.message(), HasSubstr("free space on that file system"));
  EXPECT_EQ(paused.chunks_failed, 0u) << "a full disk fails no chunk: it is retried";
  EXPECT_TRUE(ChunkComplete(0));
  EXPECT_TRUE(ChunkComplete(1));
  EXPECT_FALSE(ChunkComplete(full_from));

  // The node serves what it staged, from disk, over the network.
  const std::vector<SampleId> staged = SamplesOf(0);
  auto reply = client_->Read(Request(staged));
  ASSERT_OK(reply);
  for (size_t i = 0; i < staged.size(); ++i) {
    ASSERT_OK(reply->status(i));
    EXPECT_EQ(reply->bytes(i), Expected(staged[i])) << "sample " << staged[i];
  }
  EXPECT_GT(service_->Counters().items_from_disk, 0u);

  // No retry before the backoff has passed on the stager's clock ...
  const uint64_t faults = store_->write_faults();
  clock_.Advance(59min);
  std::this_thread::sleep_for(3 * kClockRecheck);  // the workers look at the clock meanwhile
  EXPECT_EQ(store_->write_faults(), faults) << "retried before disk_full_backoff";
  EXPECT_EQ(stager_->Progress().state, StagingState::kDiskFull);
  // ... and once it has, with space back, staging finishes.
  store_->ClearFaults();
  clock_.Advance(1min);
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kComplete; }, 20s))
      << StagingStateName(stager_->Progress().state) << ": "
      << stager_->Progress().last_error.ToString();
  for (ChunkId c = 0; c < manifest_->chunk_count(); ++c) EXPECT_TRUE(ChunkComplete(c)) << c;
}

TEST_F(ChunkStoreFaultTest, ReadGettingEioFailsTheItemIsCountedAndTheServerStaysUp) {
  CreateStager();
  ASSERT_OK(stager_->Start());
  ASSERT_TRUE(WaitFor([&] { return stager_->Progress().state == StagingState::kComplete; }, 20s));
  StartServer();
  const ChunkId bad = 1;
  store_->FailReads(FaultyChunkStore::ChunkIds({bad}), EIO);

  const std::vector<SampleId> failing = SamplesOf(bad);
  const std::vector<SampleId> good = SamplesOf(0);
  std::vector<SampleId> ids = good;
  ids.insert(ids.end(), failing.begin(), failing.end());
  auto reply = client_->Read(Request(ids));
  ASSERT_OK(reply);
  ASSERT_EQ(reply->size(), ids.size());
  for (size_t i = 0; i < good.size(); ++i) {
    ASSERT_OK(reply->status(i));
    EXPECT_EQ(reply->bytes(i), Expected(good[i]));
  }
  for (size_t i = good.size(); i < ids.size(); ++i) {
    const Status s = reply->status(i);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("Input/output error"));
    EXPECT_THAT(s.message(), HasSubstr("chunk " + std::to_string(bad)));
    EXPECT_THAT(s.message(), HasSubstr("chunk store " + store_->root()));
  }
  const ChunkReadServiceCounters c = service_->Counters();
  EXPECT_EQ(c.store_read_errors, failing.size());
  EXPECT_EQ(c.items_other_error, failing.size());
  EXPECT_GE(store_->read_faults(), failing.size());

  // The server and the connection go on; a healed disk serves the chunk again.
  store_->ClearFaults();
  auto again = client_->Read(Request(failing));
  ASSERT_OK(again);
  for (size_t i = 0; i < failing.size(); ++i) {
    ASSERT_OK(again->status(i));
    EXPECT_EQ(again->bytes(i), Expected(failing[i]));
  }
  EXPECT_EQ(service_->Counters().store_read_errors, failing.size());
}

// The fault store itself: it fails only what it was told to, as the OS would.
TEST_F(ChunkStoreFaultTest, FaultsHitOnlyTheChosenChunks) {
  const ChunkKey key0{kDataset, manifest_->id(), 0};
  const ChunkKey key1{kDataset, manifest_->id(), 1};
  const auto segments0 = *manifest_->Segments(0);
  const auto segments1 = *manifest_->Segments(1);
  store_->FailWrites(FaultyChunkStore::ChunkIds({1}), ENOSPC);
  auto w0 = store_->CreateChunk(key0, segments0);
  ASSERT_OK(w0);
  ASSERT_OK(w0->Put(
      0, Expected(segments0[0].sample).substr(segments0[0].sample_offset, segments0[0].length)));
  ASSERT_OK(w0->Commit());
  auto w1 = store_->CreateChunk(key1, segments1);
  ASSERT_OK(w1);
  const Status put = w1->Put(0, std::string(segments1[0].length, 'x'));
  EXPECT_EQ(put.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(put.message(), HasSubstr(store_->ChunkPath(key1)));
  EXPECT_EQ(store_->write_faults(), 1u);

  store_->FailReads(FaultyChunkStore::ChunkIds({0}), EIO);
  auto r0 = store_->OpenChunkReader(key0, segments0);
  ASSERT_OK(r0);
  EXPECT_TRUE((*r0)->IsPresent(0));
  EXPECT_EQ((*r0)->Read(0).status().code(), StatusCode::kIoError);
  store_->ClearFaults();
  auto bytes = (*r0)->Read(0);
  ASSERT_OK(bytes);
  EXPECT_EQ(*bytes,
            Expected(segments0[0].sample).substr(segments0[0].sample_offset, segments0[0].length));
}

}  // namespace
}  // namespace granary

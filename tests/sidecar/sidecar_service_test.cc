// SidecarService (sidecar/include/granary/sidecar/sidecar_service.h) driven in
// process, with no socket: a real SQLite store holding a Ready dataset over a
// real source tree, a real SampleFetcher (no cache node listed: every sample
// comes from the source, read as this process's user) and real sample caches.
//
//  - HELLO first: anything else before it ends the connection; a second HELLO
//    is refused without ending it;
//  - OPEN answers the manifest's sizes and passes the arena; an unknown
//    dataset, one of another pool, one not yet snapshotted and a second OPEN
//    are refused saying what to do;
//  - SET_PLAN, then NEXT walks the rank's share in plan order with the
//    source's bytes in the arena, up to end_of_epoch and past it (nothing
//    more); the plan is registered in the store as the SET_PLAN gave it; a
//    rank out of range and a start past the share are refused;
//  - GET by id, RELEASE (tokens not held are counted and ignored), and Close
//    dropping every pin;
//  - STAT, LOOKUP and DIRECTORIES from the manifest, with their range errors;
//  - requests before OPEN, NEXT before SET_PLAN; errors counted.

#include "granary/sidecar/sidecar_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "granary/core/hash.h"
#include "granary/protocol/plan_request.h"
#include "granary/store/open_store.h"
#include "sidecar_metrics.h"
#include "testing/source_fixture.h"
#include "testing/sqlite_lock.h"
#include "testing/test_util.h"

namespace granary::sidecar {
namespace {

namespace sp = sidecar_protocol;
using ::granary::testing::TempDir;
using ::testing::HasSubstr;

constexpr int kFiles = 40;

std::string PathOf(int i) {
  return "d" + std::to_string(i % 3) + "/f" + std::to_string(i) + ".bin";
}
std::string ContentOf(int i) {
  return std::string(static_cast<size_t>(100 + 37 * i), static_cast<char>('a' + i % 26));
}

sp::Hello HelloFrom(const std::string& name) {
  sp::Hello hello;
  hello.client_name = name;
  return hello;
}

class SidecarServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < kFiles; ++i) dir_.WriteFile("source/" + PathOf(i), ContentOf(i));
    Result<std::shared_ptr<const Manifest>> manifest =
        testing::SnapshotTree(dir_.Join("source"), 4096);
    ASSERT_OK(manifest);
    manifest_ = *manifest;
    Result<std::unique_ptr<MetadataStore>> store =
        OpenMetadataStore("sqlite://" + dir_.Join("granary.db") + "?retry_ms=60000");
    ASSERT_OK(store);
    store_ = std::move(*store);
    ASSERT_OK(store_->PutManifest(manifest_->id().ToHex(), manifest_->Encode()));
    ASSERT_OK(CreateDataset("images", "default", DatasetPhase::kReady));

    Result<SidecarMetrics> metrics = SidecarMetrics::Declare(registry_);
    ASSERT_OK(metrics);
    metrics_ = *metrics;
    Result<std::unique_ptr<SampleFetcher>> fetcher = SampleFetcher::Create({}, nullptr);
    ASSERT_OK(fetcher);
    fetcher_ = std::move(*fetcher);
    SidecarServiceOptions options;
    options.name = "test-sidecar";
    options.cache.arena_bytes = 4 << 20;
    options.cache.window_samples = 8;
    options.cache.window_bytes = 1 << 20;
    options.wait_timeout = std::chrono::seconds(30);
    service_ = std::make_unique<SidecarService>(options, store_.get(), fetcher_.get(), &metrics_);
  }

  Status CreateDataset(const std::string& name, const std::string& pool, DatasetPhase phase,
                       bool snapshotted = true) {
    DatasetRecord record;
    record.name = name;
    record.spec.source_uri = "file://" + dir_.Join("source");
    record.spec.chunk_size = manifest_->chunk_size();
    record.spec.pool = pool;
    record.owner = DatasetOwner{::getuid(), ::getgid()};
    record.state.phase = phase;
    if (snapshotted) record.manifest_id = manifest_->id().ToHex();
    return store_->CreateDataset(record).status();
  }

  // A session past HELLO with "images" open.
  SidecarSession OpenSession() {
    SidecarSession s;
    EXPECT_OK(service_->Hello(s, HelloFrom("test")));
    EXPECT_OK(service_->Open(s, sp::Open{"images"}));
    return s;
  }

  // The bytes the arena holds for `item`.
  std::string ArenaBytes(const SidecarSession& s, const sp::SampleItem& item) {
    return std::string(s.cache->arena_data() + item.offset, item.length);
  }

  TempDir dir_;
  std::shared_ptr<const Manifest> manifest_;
  std::unique_ptr<MetadataStore> store_;
  prometheus::Registry registry_;
  SidecarMetrics metrics_;
  std::unique_ptr<SampleFetcher> fetcher_;
  std::unique_ptr<SidecarService> service_;
};

// The sample of manifest id `id`, by its path.
int FileOf(const Manifest& m, SampleId id) {
  for (int i = 0; i < kFiles; ++i) {
    if (m.PathOf(id) == PathOf(i)) return i;
  }
  return -1;
}

TEST_F(SidecarServiceTest, HelloComesFirst) {
  SidecarSession s;
  // Through HandleFrame, as the socket server calls it.
  const auto frame_of = [](const sp::Request& request) {
    Result<std::string> bytes = sp::EncodeRequest(1, request);
    EXPECT_OK(bytes);
    Result<sp::Frame> frame = sp::DecodeFrame(*bytes);
    EXPECT_OK(frame);
    return *frame;
  };
  SidecarAnswer early = service_->HandleFrame(s, frame_of(sp::Open{"images"}));
  EXPECT_EQ(early.error.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.error.message(), HasSubstr("before HELLO"));
  EXPECT_TRUE(early.closing);
  EXPECT_EQ(s.cache, nullptr);

  sp::Hello hello;
  hello.client_name = "trainer";
  SidecarAnswer agreed = service_->HandleFrame(s, frame_of(hello));
  ASSERT_OK(agreed.error);
  const auto* reply = std::get_if<sp::HelloReply>(&agreed.reply);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->sidecar_name, "test-sidecar");
  EXPECT_EQ(reply->version, sp::kMaxVersion);
  EXPECT_EQ(s.version, sp::kMaxVersion);
  EXPECT_EQ(s.client_name, "trainer");

  SidecarAnswer again = service_->HandleFrame(s, frame_of(hello));
  EXPECT_EQ(again.error.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.error.message(), HasSubstr("HELLO sent twice"));
  EXPECT_FALSE(again.closing) << "the stream is in step";
  EXPECT_EQ(metrics_.errors_request->Value(), 2.0);
}

TEST_F(SidecarServiceTest, OpenAnswersTheManifestAndPassesTheArena) {
  SidecarSession s;
  ASSERT_OK(service_->Hello(s, HelloFrom("test")));
  SidecarAnswer opened = service_->Handle(s, sp::Open{"images"});
  ASSERT_OK(opened.error);
  const auto* reply = std::get_if<sp::OpenReply>(&opened.reply);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->manifest_id, manifest_->id());
  EXPECT_EQ(reply->sample_count, static_cast<uint64_t>(kFiles));
  EXPECT_EQ(reply->total_bytes, manifest_->total_bytes());
  EXPECT_EQ(reply->chunk_count, manifest_->chunk_count());
  EXPECT_EQ(reply->arena_bytes, 4u << 20);
  ASSERT_NE(s.cache, nullptr);
  EXPECT_EQ(opened.fd, s.cache->arena_fd());

  // One cache per dataset, shared by sessions.
  SidecarSession other = OpenSession();
  EXPECT_EQ(other.cache, s.cache);
  EXPECT_EQ(service_->Caches().size(), 1u);

  Result<sp::OpenReply> twice = service_->Open(s, sp::Open{"images"});
  EXPECT_EQ(twice.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("already has dataset 'images' open"));
}

TEST_F(SidecarServiceTest, OpenRefusesWhatItCannotServeSayingWhatToDo) {
  ASSERT_OK(CreateDataset("elsewhere", "gpu-b", DatasetPhase::kReady));
  ASSERT_OK(CreateDataset("pending", "default", DatasetPhase::kPending, /*snapshotted=*/false));
  SidecarSession s;
  ASSERT_OK(service_->Hello(s, HelloFrom("test")));

  Result<sp::OpenReply> unknown = service_->Open(s, sp::Open{"nope"});
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("dataset 'nope' does not exist"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("granary dataset create nope"));

  Result<sp::OpenReply> pool = service_->Open(s, sp::Open{"elsewhere"});
  EXPECT_EQ(pool.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(pool.status().message(), HasSubstr("is in pool 'gpu-b'"));
  EXPECT_THAT(pool.status().message(), HasSubstr("this sidecar serves pool 'default'"));

  Result<sp::OpenReply> pending = service_->Open(s, sp::Open{"pending"});
  EXPECT_EQ(pending.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(pending.status().message(), HasSubstr("granary dataset wait pending"));

  EXPECT_EQ(s.cache, nullptr) << "a refused OPEN leaves the session without a dataset";
  EXPECT_TRUE(service_->Caches().empty());
}

// A sidecar told which datasets it serves (a Slurm job's) opens those and
// refuses every other dataset of its pool, naming what it serves.
TEST_F(SidecarServiceTest, OpenRefusesADatasetOutsideItsDatasetsOption) {
  ASSERT_OK(CreateDataset("other", "default", DatasetPhase::kReady));
  for (const std::vector<std::string>& served :
       {std::vector<std::string>{"images"}, std::vector<std::string>{}}) {
    SidecarServiceOptions options;
    options.cache.arena_bytes = 4 << 20;
    options.cache.window_samples = 8;
    options.cache.window_bytes = 1 << 20;
    options.datasets = served;
    SidecarService service(options, store_.get(), fetcher_.get(), &metrics_);
    SidecarSession s;
    ASSERT_OK(service.Hello(s, HelloFrom("test")));
    Result<sp::OpenReply> other = service.Open(s, sp::Open{"other"});
    EXPECT_EQ(other.status().code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(other.status().message(),
                HasSubstr(served.empty() ? "serves no dataset" : "serves only images"));
    EXPECT_THAT(other.status().message(), HasSubstr("`datasets` option"));
    Result<sp::OpenReply> missing = service.Open(s, sp::Open{"nope"});
    EXPECT_EQ(missing.status().code(), StatusCode::kPermissionDenied)
        << "not even whether it exists";
    if (!served.empty()) EXPECT_OK(service.Open(s, sp::Open{"images"}));
  }
}

TEST_F(SidecarServiceTest, RequestsBeforeOpenAreRefused) {
  SidecarSession s;
  ASSERT_OK(service_->Hello(s, HelloFrom("test")));
  const std::vector<sp::Request> requests = {sp::SetPlan{},     sp::Get{},          sp::Next{},
                                             sp::Release{},     sp::Stat{},         sp::Lookup{},
                                             sp::Directories{}, sp::ChunkFiles{{0}}};
  for (const sp::Request& request : requests) {
    SidecarAnswer a = service_->Handle(s, request);
    EXPECT_EQ(a.error.code(), StatusCode::kFailedPrecondition) << request.index();
    EXPECT_THAT(a.error.message(), HasSubstr("before OPEN; open a dataset first"));
    EXPECT_FALSE(a.closing);
  }
  EXPECT_EQ(metrics_.errors_request->Value(), static_cast<double>(requests.size()));
  EXPECT_TRUE(std::holds_alternative<sp::Pong>(service_->Handle(s, sp::Ping{}).reply));
}

TEST_F(SidecarServiceTest, NextWalksThePlanInOrderThenEndsTheEpoch) {
  SidecarSession s = OpenSession();
  PlanSpec spec;
  spec.seed = 7;
  spec.epoch = 2;
  spec.world_size = 3;
  spec.rank = 1;
  spec.mode = PlanMode::kGlobal;
  const sp::SetPlan set = SetPlanFor("job-7", spec, 0);
  EXPECT_EQ(service_->Next(s, sp::Next{{}, 4}).status().code(), StatusCode::kFailedPrecondition)
      << "NEXT before SET_PLAN";
  ASSERT_OK(service_->SetPlan(s, set));

  // Registered in the store as the SET_PLAN gave it (off the request path).
  service_->FlushPlans();
  Result<std::vector<PlanRecord>> plans = store_->ListPlans("images");
  ASSERT_OK(plans);
  ASSERT_EQ(plans->size(), 1u);
  PlanRecord registered = (*plans)[0];
  registered.registered_ms = 0;
  EXPECT_EQ(registered, PlanRecordOf(set));

  Result<Plan> expected = Plan::Create(*manifest_, spec);
  ASSERT_OK(expected);
  std::vector<SampleId> got;
  std::vector<uint64_t> tokens;
  bool ended = false;
  for (int round = 0; round < 100 && !ended; ++round) {
    Result<sp::Samples> samples = service_->Next(s, sp::Next{tokens, 4});
    ASSERT_OK(samples);
    tokens.clear();
    EXPECT_LE(samples->items.size(), 4u);
    for (const sp::SampleItem& item : samples->items) {
      ASSERT_TRUE(item.status.ok()) << item.id << ": " << item.status.ToString();
      EXPECT_FALSE(item.hint);
      const int file = FileOf(*manifest_, item.id);
      ASSERT_GE(file, 0);
      EXPECT_EQ(ArenaBytes(s, item), ContentOf(file)) << PathOf(file);
      EXPECT_EQ(item.checksum, Checksum64(ArenaBytes(s, item)));
      got.push_back(item.id);
      tokens.push_back(item.token);
    }
    ended = samples->end_of_epoch;
  }
  ASSERT_TRUE(ended);
  const std::vector<SampleId>& order = expected->samples();
  EXPECT_EQ(got, std::vector<SampleId>(order.begin(), order.begin() + static_cast<ptrdiff_t>(
                                                                          expected->read_count())));

  // Past the end: nothing more, still the end of the epoch.
  Result<sp::Samples> past = service_->Next(s, sp::Next{tokens, 4});
  ASSERT_OK(past);
  EXPECT_TRUE(past->items.empty());
  EXPECT_TRUE(past->end_of_epoch);
  EXPECT_EQ(s.cache->Stats().pins, 0u) << "the last NEXT released the rest";
}

// SET_PLAN is answered once the sidecar's prefetch has the plan; its write to
// the store (for the cache nodes' staging order) happens after. Here the store
// is locked by another writer for as long as the test wants (its busy timeout
// is a minute): SET_PLAN must not wait for it, and the plan reaches the store
// once the lock is gone.
TEST_F(SidecarServiceTest, SetPlanDoesNotWaitForTheStore) {
  SidecarSession s = OpenSession();
  PlanSpec spec;
  spec.seed = 11;
  const sp::SetPlan set = SetPlanFor("job-locked", spec, 0);
  testing::SqliteWriteLock lock(dir_.Join("granary.db"));

  std::future<Result<sp::Ok>> answered =
      std::async(std::launch::async, [&] { return service_->SetPlan(s, set); });
  const bool ready = answered.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(ready) << "SET_PLAN waited for the locked store";
  // The store object is the one the registrar writes through: asking it now
  // would wait behind that write. Nothing is written while the lock is held.
  EXPECT_EQ(service_->plans_registered(), 0u);
  lock.Unlock();
  ASSERT_OK(answered.get());

  // Prefetch already follows the plan: NEXT walks it.
  Result<sp::Samples> next = service_->Next(s, sp::Next{{}, 4});
  ASSERT_OK(next);
  EXPECT_EQ(next->items.size(), 4u);

  service_->FlushPlans();
  Result<std::vector<PlanRecord>> after = store_->ListPlans("images");
  ASSERT_OK(after);
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ(after->front().plan_id, "job-locked");
  EXPECT_EQ(metrics_.store_errors->Value(), 0.0);
}

TEST_F(SidecarServiceTest, SetPlanRefusesARankOutOfRangeAndAStartPastTheShare) {
  SidecarSession s = OpenSession();
  PlanSpec spec;
  spec.world_size = 4;
  spec.rank = 4;
  Result<sp::Ok> rank = service_->SetPlan(s, SetPlanFor("job", spec, 0));
  EXPECT_EQ(rank.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(rank.status().message(), HasSubstr("SET_PLAN 'job'"));
  EXPECT_THAT(rank.status().message(), HasSubstr("rank"));

  spec.rank = 3;
  Result<sp::Ok> start = service_->SetPlan(s, SetPlanFor("job", spec, kFiles));
  EXPECT_EQ(start.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(start.status().message(), HasSubstr("start_position 40 is past the rank's 10"));

  EXPECT_EQ(s.plan, nullptr) << "a refused SET_PLAN sets nothing";
  Result<sp::Samples> next = service_->Next(s, sp::Next{{}, 4});
  EXPECT_EQ(next.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(next.status().message(), HasSubstr("NEXT before SET_PLAN"));
  service_->FlushPlans();
  Result<std::vector<PlanRecord>> plans = store_->ListPlans("images");
  ASSERT_OK(plans);
  EXPECT_TRUE(plans->empty()) << "nothing registered";
}

TEST_F(SidecarServiceTest, GetPinsReleaseUnpinsAndCloseDropsTheRest) {
  SidecarSession s = OpenSession();
  sp::Get get;
  get.ids = {3, 0, 39};
  Result<sp::Samples> samples = service_->Get(s, get);
  ASSERT_OK(samples);
  ASSERT_EQ(samples->items.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    const sp::SampleItem& item = samples->items[k];
    ASSERT_OK(item.status);
    EXPECT_EQ(item.id, get.ids[k]);
    EXPECT_EQ(ArenaBytes(s, item), ContentOf(FileOf(*manifest_, item.id)));
  }
  EXPECT_EQ(s.cache->Stats().pins, 3u);

  // Past the manifest: that item fails, naming the id.
  sp::Get bad;
  bad.ids = {kFiles};
  Result<sp::Samples> past = service_->Get(s, bad);
  ASSERT_OK(past);
  ASSERT_EQ(past->items.size(), 1u);
  EXPECT_EQ(past->items[0].status.code(), StatusCode::kOutOfRange);

  ASSERT_OK(service_->Release(s, sp::Release{{samples->items[0].token}}));
  EXPECT_EQ(s.cache->Stats().pins, 2u);
  // A token not held (released already, or never handed out) is counted and ignored.
  ASSERT_OK(service_->Release(s, sp::Release{{samples->items[0].token, 999999}}));
  EXPECT_EQ(s.cache->Stats().pins, 2u);
  EXPECT_EQ(s.cache->Stats().unknown_releases, 2u);

  const std::shared_ptr<SampleCache> cache = s.cache;
  service_->Close(s);
  EXPECT_EQ(cache->Stats().pins, 0u);
  EXPECT_EQ(s.cache, nullptr);
}

TEST_F(SidecarServiceTest, StatLookupAndDirectoriesAnswerFromTheManifest) {
  SidecarSession s = OpenSession();
  Result<sp::StatReply> stat = service_->Stat(s, sp::Stat{38, 10});
  ASSERT_OK(stat);
  EXPECT_EQ(stat->first_id, 38u);
  ASSERT_EQ(stat->entries.size(), 2u) << "cut at the end of the manifest";
  EXPECT_EQ(stat->entries[1].path, manifest_->PathOf(39));
  EXPECT_EQ(stat->entries[1].size, manifest_->SizeOf(39));
  Result<sp::StatReply> stat_past = service_->Stat(s, sp::Stat{kFiles, 1});
  EXPECT_EQ(stat_past.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(stat_past.status().message(), HasSubstr("'images' has 40 samples"));

  Result<sp::LookupReply> lookup =
      service_->Lookup(s, sp::Lookup{{PathOf(5), "d0/missing.bin", "../escape"}});
  ASSERT_OK(lookup);
  ASSERT_EQ(lookup->items.size(), 3u);
  ASSERT_OK(lookup->items[0].status);
  EXPECT_EQ(manifest_->PathOf(lookup->items[0].id), PathOf(5));
  EXPECT_EQ(lookup->items[1].status.code(), StatusCode::kNotFound);
  EXPECT_THAT(lookup->items[1].status.message(), HasSubstr("no file 'd0/missing.bin'"));
  EXPECT_EQ(lookup->items[2].status.code(), StatusCode::kInvalidArgument);

  Result<sp::DirectoriesReply> dirs = service_->Directories(s, sp::Directories{0, 100});
  ASSERT_OK(dirs);
  EXPECT_EQ(dirs->total, 3u);
  std::set<std::string> names;
  for (const sp::DirectoryItem& d : dirs->entries) names.insert(d.path);
  EXPECT_EQ(names, (std::set<std::string>{"d0", "d1", "d2"}));
  Result<sp::DirectoriesReply> dirs_past = service_->Directories(s, sp::Directories{4, 1});
  EXPECT_EQ(dirs_past.status().code(), StatusCode::kOutOfRange);
}

// Chunk files go only to root, the sidecar's own uid and the dataset owner;
// anyone else (or a peer whose uid is unknown) is refused the whole request
// and handed no descriptor.
TEST_F(SidecarServiceTest, ChunkFilesAreRefusedToOtherUidsAndWithoutALocalNode) {
  EXPECT_TRUE(SidecarService::MayHaveChunkFiles(0, 1234));
  EXPECT_TRUE(SidecarService::MayHaveChunkFiles(::geteuid(), 1234));
  EXPECT_TRUE(SidecarService::MayHaveChunkFiles(1234, 1234));
  EXPECT_EQ(SidecarService::MayHaveChunkFiles(1235, 1234), ::geteuid() == 1235);

  SidecarSession s = OpenSession();
  // Neither root, this process (the sidecar) nor the owner (also this process).
  s.uid = ::geteuid() == 0 ? 65534u : ::geteuid() + 1;
  SidecarAnswer refused = service_->Handle(s, sp::ChunkFiles{{0, 1}});
  EXPECT_EQ(refused.error.code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.error.message(),
              AllOf(HasSubstr("uid " + std::to_string(*s.uid)), HasSubstr("arena")));
  EXPECT_TRUE(refused.owned_fds.empty());
  EXPECT_EQ(metrics_.chunk_files_refused->Value(), 1);
  s.uid.reset();
  EXPECT_EQ(service_->Handle(s, sp::ChunkFiles{{0}}).error.code(), StatusCode::kPermissionDenied);

  // The owner, but this sidecar reads no local node's files (no local_node_socket).
  s.uid = ::getuid();
  SidecarAnswer off = service_->Handle(s, sp::ChunkFiles{{0}});
  EXPECT_EQ(off.error.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(off.error.message(), HasSubstr("local_node_socket"));
  EXPECT_TRUE(off.owned_fds.empty());
  EXPECT_EQ(metrics_.chunk_files_handed->Value(), 0);
}

}  // namespace
}  // namespace granary::sidecar

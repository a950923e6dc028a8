// libgranary-client's Session against the real thing: a granary-sidecar
// process (SidecarProcess) reading from two granary-cachenode processes and
// Redis (CacheCluster). Bytes, checksums, metadata, plans, pins measured on
// the sidecar's /metrics, two datasets side by side, and a sidecar that dies.

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>

#include "granary/client/sampler_plan.h"
#include "granary/client/session.h"
#include "granary/core/hash.h"
#include "testing/cachenode_fixture.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::client {
namespace {

using std::chrono::seconds;
using testing::CacheCluster;
using testing::SidecarOptions;
using testing::SidecarProcess;
using testing::TestDataset;

class SessionIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_OK(cluster);
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    ds_ = CreateDataset("ds", 200);
    SidecarOptions o;
    o.local_node_id = cluster_->node(0).id();
    auto sidecar = testing::StartClusterSidecar(*cluster_, o);
    ASSERT_OK(sidecar);
    sidecar_ = std::move(*sidecar);
  }

  TestDataset CreateDataset(const std::string& name, size_t files) {
    testing::DatasetOptions d;
    d.name = name;
    d.files = files;
    d.min_size = 256;
    d.max_size = 4096;
    d.chunk_size = 32 * 1024;
    auto ds = cluster_->CreateDataset(d);
    EXPECT_OK(ds);
    return ds.ok() ? std::move(*ds) : TestDataset{};
  }

  std::unique_ptr<Session> Open(const std::string& dataset, uint32_t lookahead = 64) {
    SessionOptions o;
    o.socket_path = sidecar_->socket_path();
    o.lookahead = lookahead;
    o.verify_checksums = true;
    o.call_timeout = seconds(30);
    auto s = Session::Open(dataset, o);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

TEST_F(SessionIntegrationTest, EverySampleHasItsSourceBytes) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->info().sample_count, ds_.sample_count());
  EXPECT_EQ(session->info().total_bytes, ds_.total_bytes);
  EXPECT_EQ(session->info().manifest_id, ds_.manifest_id);
  EXPECT_EQ(session->info().chunk_count, ds_.manifest->chunk_count());
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < ds_.sample_count(); ++i) ids.push_back(i);
  auto views = session->GetMany(ids);
  ASSERT_EQ(views.size(), ids.size());
  for (uint32_t i = 0; i < ids.size(); ++i) {
    ASSERT_OK(views[i]);
    ASSERT_EQ(views[i]->bytes(), ds_.contents[i]) << "sample " << i;
    EXPECT_EQ(views[i]->checksum, Checksum64(ds_.contents[i]));
    session->Release(*views[i]);
  }
  // Copies, one at a time, in reverse.
  for (uint32_t i = static_cast<uint32_t>(ds_.sample_count()); i-- > 0;) {
    auto bytes = session->Read(i);
    ASSERT_OK(bytes);
    ASSERT_EQ(*bytes, ds_.contents[i]);
  }
  auto past = session->Get(static_cast<uint32_t>(ds_.sample_count()));
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
}

TEST_F(SessionIntegrationTest, MetadataComesFromTheManifest) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  auto list = session->List(0, static_cast<uint32_t>(ds_.sample_count()));
  ASSERT_OK(list);
  ASSERT_EQ(list->size(), ds_.sample_count());
  for (uint32_t i = 0; i < list->size(); ++i) {
    EXPECT_EQ((*list)[i].path, ds_.manifest->PathOf(i));
    EXPECT_EQ((*list)[i].size, ds_.contents[i].size());
  }
  auto stat = session->Stat(17);
  ASSERT_OK(stat);
  EXPECT_EQ(stat->path, ds_.manifest->PathOf(17));
  for (uint32_t i : {0u, 99u, 199u}) {
    auto id = session->Lookup(ds_.manifest->PathOf(i));
    ASSERT_OK(id);
    EXPECT_EQ(*id, i);
  }
  auto missing = session->Lookup("d000/nope.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  for (const char* bad : {"../x", "/etc/passwd", "a/../b"}) {
    auto r = session->Lookup(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Every directory but the root, in the manifest's order, with its mode.
  auto dirs = session->Directories();
  ASSERT_OK(dirs);
  ASSERT_EQ(dirs->size(), ds_.manifest->directory_count() - 1);
  ASSERT_GE(dirs->size(), 2u) << "the dataset spreads its files over directories";
  for (uint32_t d = 1; d < ds_.manifest->directory_count(); ++d) {
    EXPECT_EQ((*dirs)[d - 1].path, ds_.manifest->DirectoryPath(d));
    EXPECT_EQ((*dirs)[d - 1].mode, ds_.manifest->DirectoryMode(d));
  }
  EXPECT_OK(session->Ping());
}

TEST_F(SessionIntegrationTest, NextFollowsTheAnnouncedPlan) {
  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  SamplerSpec spec;
  spec.sample_count = ds_.sample_count();
  spec.seed = 3;
  spec.epoch = 1;
  spec.num_replicas = 2;
  spec.rank = 1;
  auto expected = SamplerIndices(spec);
  ASSERT_OK(expected);
  auto plan = SamplerSetPlan(spec, 10);
  ASSERT_OK(plan);
  ASSERT_OK(session->SetPlan(*plan));
  std::vector<uint32_t> got;
  bool end = false;
  for (int round = 0; round < 1000 && !end; ++round) {
    auto batch = session->Next(7, &end);
    ASSERT_OK(batch);
    for (auto& v : *batch) {
      ASSERT_OK(v);
      ASSERT_EQ(v->bytes(), ds_.contents[v->id]);
      got.push_back(v->id);
      session->Release(*v);
    }
  }
  EXPECT_TRUE(end);
  EXPECT_EQ(got, std::vector<uint32_t>(expected->begin() + 10, expected->end()))
      << "NEXT resumes at start_position and follows the sampler's order";
}

TEST_F(SessionIntegrationTest, PinsAreCountedByTheSidecarAndReleased) {
  auto session = Open(ds_.name, /*lookahead=*/0);
  ASSERT_NE(session, nullptr);
  std::vector<SampleView> held;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < 25; ++i) {
    auto v = session->Get(i);
    ASSERT_OK(v);
    held.push_back(*v);
    bytes += v->size;
  }
  EXPECT_EQ(session->pinned_count(), 25u);
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 25; }));
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pinned_bytes", {},
                                    [&](double v) { return v == static_cast<double>(bytes); }));
  for (const SampleView& v : held) session->Release(v);
  ASSERT_OK(session->Flush());
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 0; }));
  EXPECT_OK(
      sidecar_->WaitForMetric("granary_sidecar_pinned_bytes", {}, [](double v) { return v == 0; }));
  // Held again, then the session closes: the sidecar drops them.
  for (uint32_t i = 0; i < 5; ++i) ASSERT_OK(session->Get(i));
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 5; }));
  session.reset();
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 0; }));
  EXPECT_OK(
      sidecar_->WaitForMetric("granary_sidecar_sessions", {}, [](double v) { return v == 0; }));
}

TEST_F(SessionIntegrationTest, LookaheadHintsSaveRoundTrips) {
  auto planner = Open(ds_.name);
  auto reader = Open(ds_.name, /*lookahead=*/8);
  ASSERT_NE(planner, nullptr);
  ASSERT_NE(reader, nullptr);
  SamplerSpec spec;
  spec.sample_count = ds_.sample_count();
  spec.shuffle = false;
  auto plan = SamplerSetPlan(spec);
  ASSERT_OK(plan);
  ASSERT_OK(planner->SetPlan(*plan));
  // Once prefetch has put the plan's next samples in the arena, a Get of one
  // brings the following ones as hints.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        auto v = reader->Get(0);
        if (v.ok()) reader->Release(*v);
        return reader->hint_count() > 0;
      },
      seconds(20)))
      << "no hints arrived";
  for (uint32_t id = 1; id <= 8; ++id) {
    auto v = reader->Get(id);
    ASSERT_OK(v);
    EXPECT_EQ(v->bytes(), ds_.contents[id]);
    reader->Release(*v);
  }
}

TEST_F(SessionIntegrationTest, TwoDatasetsNeverMix) {
  TestDataset other = CreateDataset("other", 90);
  auto a = Open(ds_.name);
  auto b = Open(other.name);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->info().manifest_id, b->info().manifest_id);
  for (uint32_t i = 0; i < other.sample_count(); ++i) {
    auto x = a->Get(i);
    auto y = b->Get(i);
    ASSERT_OK(x);
    ASSERT_OK(y);
    ASSERT_EQ(x->bytes(), ds_.contents[i]);
    ASSERT_EQ(y->bytes(), other.contents[i]);
    a->Release(*x);
    b->Release(*y);
  }
}

TEST_F(SessionIntegrationTest, UnknownDatasetAndDeadSidecar) {
  SessionOptions o;
  o.socket_path = sidecar_->socket_path();
  auto unknown = Session::Open("no-such-dataset", o);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no-such-dataset"), std::string::npos)
      << unknown.status().ToString();

  auto session = Open(ds_.name);
  ASSERT_NE(session, nullptr);
  auto held = session->Get(1);
  ASSERT_OK(held);
  ASSERT_OK(sidecar_->Kill());
  auto v = session->Get(2);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
  EXPECT_NE(v.status().message().find(sidecar_->socket_path()), std::string::npos)
      << v.status().message();
  // The view's memory stays mapped (its pin is gone, its bytes are still there).
  EXPECT_EQ(held->bytes(), ds_.contents[1]);
  auto again = Session::Open(ds_.name, o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace granary::client

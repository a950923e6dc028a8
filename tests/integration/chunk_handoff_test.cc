// Chunk handoff end to end: a real cache node with `local_socket` (Redis,
// staged dataset), asked directly and by a real sidecar with
// `local_node_socket`, read through libgranary-client.

#include "granary/core/chunk_handoff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "granary/client/session.h"
#include "granary/core/chunk_file.h"
#include "granary/core/unix_socket.h"
#include "testing/cachenode_fixture.h"
#include "testing/child_process.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::CacheCluster;
using ::granary::testing::CacheNodeOptions;
using ::granary::testing::ChildProcess;
using ::granary::testing::DatasetOptions;
using ::granary::testing::SidecarOptions;
using ::granary::testing::SidecarProcess;
using ::granary::testing::TestDataset;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class ChunkHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    socket_ = cluster_->dir().path() + "/node.sock";
    CacheNodeOptions node;
    node.extra_yaml = "local_socket: " + socket_ + "\n";
    ASSERT_OK(cluster_->StartNodes(1, node));
    DatasetOptions d;
    d.files = 400;
    d.min_size = 300;
    d.max_size = 9000;
    d.chunk_size = 64 * 1024;
    auto ds = cluster_->CreateDataset(d);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    ds_ = std::move(*ds);
    ASSERT_OK(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady));
  }

  handoff::OpenChunkRequest Request(ChunkId chunk) const {
    return {ds_.name, ds_.manifest_id, chunk};
  }

  std::unique_ptr<CacheCluster> cluster_;
  std::string socket_;
  TestDataset ds_;
};

TEST_F(ChunkHandoffTest, EveryStagedChunkIsHandedOverAndReadsTheSourceBytes) {
  handoff::ChunkHandoffClient client(socket_, 5s);
  size_t samples = 0;
  for (ChunkId c = 0; c < ds_.manifest->chunk_count(); ++c) {
    auto fd = client.OpenChunk(Request(c));
    ASSERT_OK(fd);
    // Read-only: the descriptor cannot write.
    EXPECT_LT(::pwrite(fd->get(), "x", 1, 0), 0);
    auto segments = ds_.manifest->Segments(c);
    ASSERT_OK(segments);
    auto reader = ChunkReader::FromFd(std::move(*fd), "handed",
                                      ChunkKey{ds_.name, ds_.manifest_id, c}, *segments);
    ASSERT_OK(reader);
    for (uint32_t i = 0; i < reader->segment_count(); ++i) {
      const ChunkSegment& seg = reader->segments()[i];
      auto bytes = reader->Read(i);
      ASSERT_OK(bytes);
      EXPECT_EQ(*bytes, ds_.contents[seg.sample].substr(seg.sample_offset, seg.length));
      ++samples;
    }
  }
  EXPECT_EQ(samples, ds_.sample_count());
}

TEST_F(ChunkHandoffTest, RefusesWhatItDoesNotServeWithTheReason) {
  handoff::ChunkHandoffClient client(socket_, 5s);
  auto unknown = client.OpenChunk({"no-such-dataset", ds_.manifest_id, 0});
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("does not stage that dataset"));

  auto stale = client.OpenChunk({ds_.name, ContentId{1, 2}, 0});
  EXPECT_EQ(stale.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(stale.status().message(), HasSubstr("reopen the dataset"));

  auto past = client.OpenChunk(Request(static_cast<ChunkId>(ds_.manifest->chunk_count())));
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  // The connection served all of that, and serves on.
  EXPECT_OK(client.OpenChunk(Request(0)));
}

TEST_F(ChunkHandoffTest, APeerThatIsNotTheOwnerGetsNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  // The dataset belongs to this process's uid (root); uid 65534 asks. It may
  // reach the socket (mode 0666 in a directory it may search): only the
  // node's check stands in its way.
  ASSERT_EQ(::chmod(cluster_->dir().path().c_str(), 0711), 0);
  const std::string path = socket_;
  const handoff::OpenChunkRequest request = Request(0);
  auto child = ChildProcess::Start([path, request](int) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 10;
    handoff::ChunkHandoffClient client(path, 5s);
    auto got = client.OpenChunk(request);
    if (got.ok()) return 11;
    if (got.status().code() != StatusCode::kPermissionDenied) return 12;
    if (got.status().message().find("uid 65534 may not read it") == std::string::npos) return 13;
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(30s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "10: setuid failed, 11: handed over, 12: other code, 13: other message";
}

TEST_F(ChunkHandoffTest, HostileBytesGetAnErrorAndTheNodeServesOthers) {
  const std::vector<std::string> hostile = {
      "garbage that is not a frame",
      std::string(handoff::kMagic, 4) + std::string("\x01\x00\x01\x00\xff\xff\xff\xff", 8),
      std::string(handoff::kMagic, 4) + std::string("\x07\x00\x01\x00\x00\x00\x00\x00", 8),
      std::string(handoff::kMagic, 4) + std::string("\x01\x00\x02\x00\x00\x00\x00\x00", 8),
      std::string(5, '\0'),  // a partial header, then the peer hangs up
  };
  for (const std::string& bytes : hostile) {
    auto fd = ConnectUnix(socket_, 5s);
    ASSERT_OK(fd);
    ASSERT_OK(SendWithFds(fd->get(), bytes));
    if (bytes.size() < handoff::kHeaderSize) continue;  // closed by us
    // An error reply (no descriptor), then the node hangs up.
    std::string in;
    std::vector<ScopedFd> fds;
    char buf[2048];
    for (int i = 0; i < 100; ++i) {
      auto got = ReceiveWithFds(fd->get(), std::span<char>(buf, sizeof(buf)), &fds);
      if (!got.ok() || *got == 0) break;
      in.append(buf, *got);
    }
    EXPECT_TRUE(fds.empty());
    ASSERT_GE(in.size(), handoff::kHeaderSize)
        << "no error reply to " << ::testing::PrintToString(bytes);
    Status carried;
    ASSERT_OK(handoff::DecodeReply(std::string_view(in).substr(handoff::kHeaderSize), &carried));
    EXPECT_FALSE(carried.ok());
  }

  // A well-framed request with a bad body: an error, and the connection stays.
  {
    auto frame = handoff::EncodeOpenChunk(Request(0));
    ASSERT_OK(frame);
    std::string bad = *frame;
    bad[handoff::kHeaderSize + 1] = 'A';  // an upper-case dataset name
    auto fd = ConnectUnix(socket_, 5s);
    ASSERT_OK(fd);
    ASSERT_OK(SendWithFds(fd->get(), bad + *frame));
    std::string in;
    std::vector<ScopedFd> fds;
    char buf[4096];
    for (int i = 0; i < 100 && fds.empty(); ++i) {
      auto got = ReceiveWithFds(fd->get(), std::span<char>(buf, sizeof(buf)), &fds);
      if (!got.ok() || *got == 0) break;
      in.append(buf, *got);
    }
    EXPECT_EQ(fds.size(), 1u) << "the second, good request is answered on the same connection";
  }

  handoff::ChunkHandoffClient client(socket_, 5s);
  EXPECT_OK(client.OpenChunk(Request(1)));
  EXPECT_TRUE(cluster_->node(0).Running());
}

TEST_F(ChunkHandoffTest, ASidecarReadsStagedSamplesFromTheChunkFilesAndSurvivesTheNode) {
  SidecarOptions o;
  o.store_url = cluster_->store_url();
  o.local_node_id = cluster_->node(0).id();
  o.window_bytes = "1MiB";
  o.arena_bytes = "32MiB";
  o.window_samples = 64;
  o.extra_yaml = "local_node_socket: " + socket_ + "\n";
  SidecarProcess sidecar(o, cluster_->dir().path() + "/sidecar");
  ASSERT_OK(sidecar.StartAndWaitReady());

  client::SessionOptions options;
  options.socket_path = sidecar.socket_path();
  auto session = client::Session::Open(ds_.name, options);
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (uint32_t id = 0; id < ds_.sample_count(); ++id) {
    auto bytes = (*session)->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]) << "sample " << id;
  }
  auto pieces = sidecar.WaitForMetric("granary_sidecar_local_file_pieces_total", {},
                                      [](double v) { return v > 0; });
  EXPECT_TRUE(pieces.ok()) << sidecar.Get("/metrics")->body;
  EXPECT_GT(*sidecar.MetricValue("granary_sidecar_local_file_opens_total"), 0);

  // The node dies: what the sidecar has open stays readable, the rest falls
  // through to the source; every byte is still right.
  ASSERT_TRUE(cluster_->node(0).Kill().ok());
  auto again = client::Session::Open(ds_.name, options);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (auto id = static_cast<uint32_t>(ds_.sample_count()); id-- > 0;) {
    auto bytes = (*again)->Read(id);
    ASSERT_TRUE(bytes.ok()) << id << ": " << bytes.status().ToString();
    ASSERT_EQ(*bytes, ds_.contents[id]) << "sample " << id;
  }
}

}  // namespace
}  // namespace granary

// Chunk handoff end to end: a real cache node with `local_socket` (Redis,
// staged dataset), asked directly and by a real sidecar with
// `local_node_socket`, read through libgranary-client; and asked by other
// local users (forked children that became them), who get only the chunks
// whose every file they may read at the source.

#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "granary/client/session.h"
#include "granary/core/chunk_file.h"
#include "granary/peer/peer_auth.h"
#include "granary/protocol/chunk_handoff.h"
#include "granary/protocol/unix_socket.h"
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

TEST_F(ChunkHandoffTest, APeerThatIsNotTheOwnerAndCannotReadTheSourceGetsNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  // The dataset belongs to this process's uid (root); uid 65534 asks. It may
  // reach the socket (mode 0666 in a directory it may search) but not the
  // source (its root is 0700): only the node's check stands in its way.
  ASSERT_EQ(::chmod(cluster_->dir().path().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(ds_.root.c_str(), 0700), 0);
  const std::string path = socket_;
  const handoff::OpenChunkRequest request = Request(0);
  auto child = ChildProcess::Start([path, request](int) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 10;
    handoff::ChunkHandoffClient client(path, 5s);
    auto got = client.OpenChunk(request);
    if (got.ok()) return 11;
    if (got.status().code() != StatusCode::kPermissionDenied) return 12;
    if (got.status().message().find("uid 65534 ('nobody') gid 65534") == std::string::npos ||
        got.status().message().find("may not read the source root") == std::string::npos) {
      return 13;
    }
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(30s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "10: setuid failed, 11: handed over, 12: other code, 13: other message";
}

// ---- other local users: what they may read at the source --------------------

// A node that requires the cluster key on its TCP port, with a handoff socket;
// a dataset owned by root whose source has one file only root may read
// (kSecret) and the others world-readable. Local users other than root read
// through the socket what they could read at the source, and nothing else.
class ChunkHandoffRightsTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kNobody = 65534;
  static constexpr char kSecret[] = "d000/f000003.bin";

  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to own the dataset and become other users";
    auto cluster = CacheCluster::Create();
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    // Others may search the test's directory (the socket and the source are
    // in it), not list it.
    ASSERT_EQ(::chmod(cluster_->dir().path().c_str(), 0711), 0);
    socket_ = cluster_->dir().path() + "/node.sock";
    auto hex = GenerateClusterKeyHex();
    ASSERT_OK(hex);
    cluster_->dir().WriteFile("cluster.key", *hex + "\n");
    const std::string key = cluster_->dir().Join("cluster.key");
    ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
    CacheNodeOptions node;
    node.extra_yaml = "local_socket: " + socket_ + "\ncluster_key_file: " + key + "\n";
    ASSERT_OK(cluster_->StartNodes(1, node));
    DatasetOptions d;
    d.name = "mixed";
    d.files = 60;
    d.min_size = 300;
    d.max_size = 3000;
    d.files_per_directory = 20;
    d.chunk_size = 8 * 1024;  // several files per chunk, many chunks
    d.owner = DatasetOwner{0, 0};
    d.before_snapshot = [](const std::string& root) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
        ::chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644);
      }
      ::chmod(root.c_str(), 0755);
      ASSERT_EQ(::chmod((root + "/" + kSecret).c_str(), 0600), 0);
    };
    auto ds = cluster_->CreateDataset(d);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    ds_ = std::move(*ds);
    ASSERT_OK(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady));

    auto secret = ds_.manifest->Find(kSecret);
    ASSERT_OK(secret);
    for (ChunkId c = 0; c < ds_.manifest->chunk_count(); ++c) {
      auto segments = ds_.manifest->Segments(c);
      ASSERT_OK(segments);
      bool holds_secret = false;
      for (const ChunkSegment& seg : *segments) holds_secret |= seg.sample == *secret;
      if (holds_secret) {
        secret_chunk_ = c;
        secret_chunk_files_ = segments->size();
      } else {
        public_chunks_.push_back(c);
      }
    }
    ASSERT_GT(secret_chunk_files_, 1u) << "the secret file should share its chunk";
    ASSERT_FALSE(public_chunks_.empty());
  }

  // Runs `body` with the handoff client of a child process running as
  // `uid` (gid = uid, no supplementary groups); its exit code.
  int AsUser(uint32_t uid, std::function<int(handoff::ChunkHandoffClient&)> body) {
    const std::string path = socket_;
    auto child = ChildProcess::Start([uid, path, body](int) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) return 100;
      handoff::ChunkHandoffClient client(path, 10s);
      return body(client);
    });
    EXPECT_OK(child);
    if (!child.ok()) return -1;
    auto code = (*child)->Wait(60s);
    EXPECT_OK(code);
    return code.ok() ? *code : -1;
  }

  handoff::OpenChunkRequest Request(ChunkId chunk) const {
    return {ds_.name, ds_.manifest_id, chunk};
  }

  std::unique_ptr<CacheCluster> cluster_;
  std::string socket_;
  TestDataset ds_;
  ChunkId secret_chunk_ = 0;
  size_t secret_chunk_files_ = 0;
  std::vector<ChunkId> public_chunks_;
};

TEST_F(ChunkHandoffRightsTest, AnotherUserGetsTheChunksWhoseEveryFileItMayReadAtTheSource) {
  // What uid 65534 is owed: every public chunk, each byte the source's.
  std::vector<std::pair<ChunkId, std::vector<std::pair<ChunkSegment, std::string>>>> expected;
  for (ChunkId c : public_chunks_) {
    auto segments = ds_.manifest->Segments(c);
    ASSERT_OK(segments);
    std::vector<std::pair<ChunkSegment, std::string>> bytes;
    for (const ChunkSegment& seg : *segments) {
      bytes.emplace_back(seg, ds_.contents[seg.sample].substr(seg.sample_offset, seg.length));
    }
    expected.emplace_back(c, std::move(bytes));
  }
  const std::string name = ds_.name;
  const ContentId manifest = ds_.manifest_id;
  const int code = AsUser(kNobody, [&](handoff::ChunkHandoffClient& client) {
    for (const auto& [chunk, segments] : expected) {
      auto fd = client.OpenChunk({name, manifest, chunk});
      if (!fd.ok()) {
        std::fprintf(stderr, "chunk %u: %s\n", chunk, fd.status().ToString().c_str());
        return 10;
      }
      if (::pwrite(fd->get(), "x", 1, 0) >= 0) return 11;  // read-only
      std::vector<ChunkSegment> segs;
      for (const auto& [seg, bytes] : segments) segs.push_back(seg);
      auto reader =
          ChunkReader::FromFd(std::move(*fd), "handed", ChunkKey{name, manifest, chunk}, segs);
      if (!reader.ok()) return 12;
      for (uint32_t i = 0; i < segs.size(); ++i) {
        auto got = reader->Read(i);
        if (!got.ok() || *got != segments[i].second) return 13;
      }
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "10: refused, 11: writable, 12: bad chunk file, 13: wrong bytes, "
                        "100: setuid failed";
  // The TCP port serves no one without the key: the socket is the way in.
  testing::DatasetReader reader(&cluster_->store(), ds_);
  std::vector<testing::DatasetReader::Outcome> got = reader.Read({0});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status.code(), StatusCode::kPermissionDenied) << got[0].status.ToString();
}

TEST_F(ChunkHandoffRightsTest, AChunkHoldingAFileItMayNotReadIsRefusedWholeNamingTheFile) {
  const handoff::OpenChunkRequest secret = Request(secret_chunk_);
  const handoff::OpenChunkRequest open = Request(public_chunks_.front());
  const std::string file = std::string("'") + kSecret + "'";
  const std::string files = "the chunk holds " + std::to_string(secret_chunk_files_) + " files";
  const int code = AsUser(kNobody, [&](handoff::ChunkHandoffClient& client) {
    // Twice: the second answer is the kept one, and says the same.
    for (int round = 0; round < 2; ++round) {
      auto got = client.OpenChunk(secret);
      if (got.ok()) return 10;
      if (got.status().code() != StatusCode::kPermissionDenied) return 11;
      const std::string& m = got.status().message();
      if (m.find("uid 65534") == std::string::npos ||
          m.find("may not read " + file) == std::string::npos) {
        std::fprintf(stderr, "refused with: %s\n", m.c_str());
        return 12;
      }
      if (m.find(files) == std::string::npos ||
          m.find("read that file through a sidecar") == std::string::npos) {
        return 13;
      }
    }
    // The connection serves on.
    return client.OpenChunk(open).ok() ? 0 : 14;
  });
  EXPECT_EQ(code, 0) << "10: handed over, 11: other code, 12: file not named, 13: no advice, "
                        "14: next request refused, 100: setuid failed";
  // Root, the dataset's owner here, gets it.
  handoff::ChunkHandoffClient root(socket_, 10s);
  EXPECT_OK(root.OpenChunk(secret));
}

TEST_F(ChunkHandoffRightsTest, BadAsksAreRefusedWithTheReason) {
  // A uid the user database does not know: its groups cannot be checked.
  uint32_t unknown = 0;
  for (uint32_t uid = 4'242'000; uid < 4'243'000; ++uid) {
    if (::getpwuid(uid) == nullptr) {
      unknown = uid;
      break;
    }
  }
  ASSERT_NE(unknown, 0u);
  const handoff::OpenChunkRequest open = Request(public_chunks_.front());
  int code = AsUser(unknown, [&](handoff::ChunkHandoffClient& client) {
    auto got = client.OpenChunk(open);
    if (got.ok()) return 10;
    if (got.status().code() != StatusCode::kPermissionDenied) return 11;
    if (got.status().message().find("no entry in this host's user database") == std::string::npos) {
      return 12;
    }
    return 0;
  });
  EXPECT_EQ(code, 0) << "10: handed over, 11: other code, 12: other message, 100: setuid failed";

  // A dataset the node does not serve, a stale manifest, a chunk past the end.
  const std::string name = ds_.name;
  const ContentId manifest = ds_.manifest_id;
  const ChunkId past = static_cast<ChunkId>(ds_.manifest->chunk_count());
  code = AsUser(kNobody, [&](handoff::ChunkHandoffClient& client) {
    auto unknown_ds = client.OpenChunk({"no-such-dataset", manifest, 0});
    if (unknown_ds.status().code() != StatusCode::kNotFound ||
        unknown_ds.status().message().find("does not stage that dataset") == std::string::npos) {
      return 10;
    }
    auto stale = client.OpenChunk({name, ContentId{1, 2}, 0});
    if (stale.status().code() != StatusCode::kNotFound) return 11;
    auto beyond = client.OpenChunk({name, manifest, past});
    if (beyond.status().code() != StatusCode::kOutOfRange) return 12;
    return 0;
  });
  EXPECT_EQ(code, 0) << "10: unknown dataset, 11: stale manifest, 12: chunk past the end";
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
  // The sidecar's own reads are what is tested here, not the session's.
  options.direct_reads = false;
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

#include "granary/protocol/chunk_handoff.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/protocol/unix_socket.h"
#include "testing/test_util.h"

namespace granary::handoff {
namespace {

using ::granary::testing::TempDir;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

const ContentId kManifest{0x1111222233334444ull, 0x5555666677778888ull};

OpenChunkRequest Request(std::string dataset = "imagenet", ChunkId chunk = 7) {
  return OpenChunkRequest{std::move(dataset), kManifest, chunk};
}

std::string Header(uint16_t version, uint16_t type, uint32_t body) {
  std::string out(kMagic, sizeof(kMagic));
  ByteWriter w(&out);
  w.Put(version);
  w.Put(type);
  w.Put(body);
  return out;
}

TEST(ChunkHandoffCodecTest, RequestAndReplyRoundTrip) {
  auto frame = EncodeOpenChunk(Request());
  ASSERT_OK(frame);
  auto header = DecodeHeader(std::string_view(*frame).substr(0, kHeaderSize));
  ASSERT_OK(header);
  EXPECT_EQ(header->type, MessageType::kOpenChunk);
  ASSERT_EQ(header->body_size, frame->size() - kHeaderSize);
  auto request = DecodeOpenChunk(std::string_view(*frame).substr(kHeaderSize));
  ASSERT_OK(request);
  EXPECT_EQ(request->dataset, "imagenet");
  EXPECT_EQ(request->manifest_id, kManifest);
  EXPECT_EQ(request->chunk, 7u);

  for (const Status& s : {Status::Ok(), Status::NotFound("chunk 7 is not on disk"),
                          Status::PermissionDenied("uid 1000 may not")}) {
    const std::string reply = EncodeReply(s);
    auto h = DecodeHeader(std::string_view(reply).substr(0, kHeaderSize));
    ASSERT_OK(h);
    EXPECT_EQ(h->type, MessageType::kOpenChunkReply);
    Status carried = Status::Internal("unset");
    ASSERT_OK(DecodeReply(std::string_view(reply).substr(kHeaderSize), &carried));
    EXPECT_EQ(carried.code(), s.code());
    EXPECT_EQ(carried.message(), s.message());
  }
  // A long message is cut, never refused.
  const std::string reply = EncodeReply(Status::Internal(std::string(5000, 'm')));
  Status carried;
  ASSERT_OK(DecodeReply(std::string_view(reply).substr(kHeaderSize), &carried));
  EXPECT_EQ(carried.message().size(), kMaxMessageLength);
}

TEST(ChunkHandoffCodecTest, TheWorkedExampleOfTheDocs) {
  // docs/protocol.md, "Chunk handoff".
  auto frame = EncodeOpenChunk(Request());
  ASSERT_OK(frame);
  const std::string expected(
      "GRHO\x01\x00\x01\x00\x1d\x00\x00\x00"
      "\x08imagenet"
      "\x88\x88\x77\x77\x66\x66\x55\x55\x44\x44\x33\x33\x22\x22\x11\x11"
      "\x07\x00\x00\x00",
      41);
  EXPECT_EQ(*frame, expected);
}

TEST(ChunkHandoffCodecTest, BadInputIsRefusedWithTheReason) {
  EXPECT_EQ(EncodeOpenChunk(Request("Not_A_Label")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeOpenChunk(Request("")).status().code(), StatusCode::kInvalidArgument);

  EXPECT_THAT(DecodeHeader("GRHO").status().message(), HasSubstr("12 were expected"));
  std::string bad_magic = Header(kVersion, 1, 10);
  bad_magic[0] = 'X';
  EXPECT_THAT(DecodeHeader(bad_magic).status().message(), HasSubstr("bad magic"));
  EXPECT_EQ(DecodeHeader(Header(2, 1, 10)).status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(DecodeHeader(Header(kVersion, 9, 10)).status().message(),
              HasSubstr("unknown message type 9"));
  EXPECT_THAT(DecodeHeader(Header(kVersion, 1, 0xffffffffu)).status().message(),
              HasSubstr("over the limit"));

  auto frame = EncodeOpenChunk(Request());
  ASSERT_OK(frame);
  const std::string body = frame->substr(kHeaderSize);
  EXPECT_THAT(DecodeOpenChunk(body.substr(0, body.size() - 1)).status().message(),
              HasSubstr("too short"));
  EXPECT_THAT(DecodeOpenChunk(body + "x").status().message(), HasSubstr("after the last field"));
  EXPECT_EQ(DecodeOpenChunk("").status().code(), StatusCode::kInvalidArgument);
  std::string dotted = body;
  dotted[1] = '.';  // "." inside the name
  EXPECT_THAT(DecodeOpenChunk(dotted).status().message(), HasSubstr("DNS-1123"));

  Status carried;
  EXPECT_FALSE(DecodeReply("", &carried).ok());
  std::string reply = EncodeReply(Status::NotFound("x")).substr(kHeaderSize);
  StoreLe(reply.data(), uint32_t{999});
  EXPECT_THAT(DecodeReply(reply, &carried).message(), HasSubstr("out of range"));
  EXPECT_FALSE(DecodeReply(reply.substr(0, 5), &carried).ok());
}

// A scripted peer on a real socket: for each connection, `script` gets the
// accepted descriptor (blocking) and does what the test needs.
class ScriptedNode {
 public:
  ScriptedNode(const std::string& path, std::function<void(int)> script) {
    auto listener = ListenUnix(path);
    EXPECT_OK(listener);
    listener_ = std::move(*listener);
    thread_ = std::thread([this, script] {
      // At most 8 connections, and 30 s of waiting for them.
      int accepted = 0;
      for (int round = 0; round < 300 && accepted < 8 && !stop_; ++round) {
        pollfd p{listener_.get(), POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        ++accepted;
        auto fd = AcceptUnix(listener_.get());
        if (!fd.ok()) continue;
        const int flags = ::fcntl(fd->get(), F_GETFL);
        ::fcntl(fd->get(), F_SETFL, flags & ~O_NONBLOCK);
        script(fd->get());
      }
    });
  }
  ~ScriptedNode() {
    stop_ = true;
    thread_.join();
  }

 private:
  ScopedFd listener_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Reads one request frame (blocking); false at end of stream.
bool ReadRequest(int fd) {
  char buf[kHeaderSize + kMaxBodySize];
  size_t have = 0;
  size_t want = kHeaderSize;
  while (have < want) {
    const ssize_t n = ::read(fd, buf + have, want - have);
    if (n <= 0) return false;
    have += static_cast<size_t>(n);
    if (have == kHeaderSize) want += LoadLe<uint32_t>(buf + 8);
  }
  return true;
}

TEST(ChunkHandoffClientTest, ReceivesTheDescriptorAndTheNodesErrors) {
  TempDir dir;
  const std::string file = dir.Join("chunk");
  testing::WriteAll(file, "chunk bytes");
  const std::string sock = dir.Join("node.sock");
  int n = 0;
  ScriptedNode node(sock, [&](int fd) {
    while (ReadRequest(fd)) {
      if (n++ % 2 == 0) {
        auto f = OpenFile(file, O_RDONLY);
        const int fds[1] = {f->get()};
        ASSERT_OK(SendWithFds(fd, EncodeReply(Status::Ok()), fds));
      } else {
        ASSERT_OK(SendWithFds(fd, EncodeReply(Status::NotFound("chunk 7 is not staged yet"))));
      }
    }
  });
  ChunkHandoffClient client(sock, 2s);
  auto got = client.OpenChunk(Request());
  ASSERT_OK(got);
  char buf[32] = {};
  EXPECT_EQ(::pread(got->get(), buf, sizeof(buf), 0), 11);
  EXPECT_STREQ(buf, "chunk bytes");
  auto refused = client.OpenChunk(Request());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(refused.status().message(), HasSubstr("not staged yet"));
  // The same connection serves on after an error.
  EXPECT_OK(client.OpenChunk(Request()));
  EXPECT_EQ(client.OpenChunk(Request("Bad Name")).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChunkHandoffClientTest, ALyingOrDeadNodeIsATransportErrorAndTheClientReconnects) {
  TempDir dir;
  const std::string sock = dir.Join("node.sock");
  std::atomic<int> connections{0};
  ScriptedNode node(sock, [&](int fd) {
    const int c = connections++;
    if (!ReadRequest(fd)) return;
    if (c == 0) {
      // OK without a descriptor.
      (void)SendWithFds(fd, EncodeReply(Status::Ok()));
    } else if (c == 1) {
      // Half a reply, then hang up.
      (void)SendWithFds(fd, EncodeReply(Status::Ok()).substr(0, 5));
    } else if (c == 2) {
      (void)SendWithFds(fd, "this is not a reply at all");
    } else {
      // Never answers: the client's deadline.
      std::this_thread::sleep_for(600ms);
    }
  });
  ChunkHandoffClient client(sock, 300ms);
  auto a = client.OpenChunk(Request());
  EXPECT_EQ(a.status().code(), StatusCode::kIoError);
  EXPECT_THAT(a.status().message(), HasSubstr("0 descriptors"));
  EXPECT_EQ(client.OpenChunk(Request()).status().code(), StatusCode::kUnavailable);
  auto c = client.OpenChunk(Request());
  EXPECT_EQ(c.status().code(), StatusCode::kIoError) << c.status().ToString();
  EXPECT_THAT(c.status().message(), HasSubstr("bad magic"));
  EXPECT_EQ(client.OpenChunk(Request()).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(connections.load(), 4);

  ChunkHandoffClient nobody(dir.Join("missing.sock"), 300ms);
  EXPECT_EQ(nobody.OpenChunk(Request()).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace granary::handoff

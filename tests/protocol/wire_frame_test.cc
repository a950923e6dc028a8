// The frame layer shared by every protocol (protocol/include/granary/protocol/wire_frame.h),
// on a format of its own with every optional field, and on one with none: header
// layouts, stream splitting, limits through the check callback, bad input.

#include "granary/protocol/wire_frame.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "granary/core/byte_order.h"
#include "testing/test_util.h"

namespace granary::wire {
namespace {

using ::testing::HasSubstr;

std::string Describe(const WireHeader& h) {
  return DescribeFrame(h.type == 1 ? "PING" : "", h.type, /*hex_types=*/true,
                       /*has_request_id=*/true, h.request_id);
}

const FrameFormat kFull = {
    .magic = {'T', 'E', 'S', 'T'},
    .has_flags = true,
    .has_payload_length = true,
    .has_request_id = true,
    .frame_noun = "test frame",
    .bad_magic_advice = "not a test peer",
    .connection_noun = "test connection",
    .describe = &Describe,
};

const FrameFormat kBare = {
    .magic = {'B', 'A', 'R', 'E'},
    .frame_noun = "bare frame",
    .bad_magic_advice = "not a bare peer",
    .connection_noun = "bare connection",
    .describe = &Describe,
};

constexpr uint32_t kMaxBody = 64;
constexpr uint64_t kMaxPayload = 100;

// The protocol's side: versions 1..2, known types 1 and 2, bodies up to 64
// bytes, payloads up to 100.
Status Check(const WireHeader& h) {
  if (h.version < 1 || h.version > 2)
    return Status::VersionMismatch("version " + std::to_string(h.version));
  if (h.type != 1 && h.type != 2)
    return Status::InvalidArgument("unknown type " + std::to_string(h.type));
  if (h.body_length > kMaxBody)
    return Status::OutOfRange("body of " + std::to_string(h.body_length));
  if (h.payload_length > kMaxPayload) {
    return Status::OutOfRange("payload of " + std::to_string(h.payload_length));
  }
  return Status::Ok();
}

std::string Frame(const FrameFormat& format, uint16_t type, std::string_view body,
                  uint64_t request_id = 7, uint64_t payload_length = 0) {
  if (!format.has_request_id) request_id = 0;
  return EncodeFrame(format, WireHeader{1, type, 0, 0, payload_length, request_id}, body);
}

TEST(WireFrameTest, HeaderSizesAndOffsetsOfEveryProtocol) {
  EXPECT_EQ(kFull.header_size(), 32u);  // the cache protocol's shape
  EXPECT_EQ(kFull.body_length_offset(), 12u);
  EXPECT_EQ(kFull.payload_length_offset(), 16u);
  EXPECT_EQ(kFull.request_id_offset(), 24u);
  FrameFormat sidecar = kFull;
  sidecar.has_payload_length = false;
  EXPECT_EQ(sidecar.header_size(), 24u);
  EXPECT_EQ(sidecar.request_id_offset(), 16u);
  EXPECT_EQ(kBare.header_size(), 12u);  // the chunk handoff's shape
  EXPECT_EQ(kBare.body_length_offset(), 8u);
}

TEST(WireFrameTest, EncodeThenParseEveryField) {
  WireHeader h{2, 1, 0x01020304, 0, 0x1122334455667788ull, 0x99aabbccddeeff00ull};
  std::string bytes = EncodeFrame(kFull, h, "body");
  ASSERT_EQ(bytes.size(), 32u + 4);
  EXPECT_EQ(bytes.substr(0, 4), "TEST");
  EXPECT_EQ(LoadLe<uint16_t>(bytes.data() + 4), 2);
  EXPECT_EQ(LoadLe<uint16_t>(bytes.data() + 6), 1);
  EXPECT_EQ(LoadLe<uint32_t>(bytes.data() + 8), 0x01020304u);
  EXPECT_EQ(LoadLe<uint32_t>(bytes.data() + 12), 4u);  // set from the body
  EXPECT_EQ(LoadLe<uint64_t>(bytes.data() + 16), 0x1122334455667788ull);
  EXPECT_EQ(LoadLe<uint64_t>(bytes.data() + 24), 0x99aabbccddeeff00ull);
  auto parsed = ParseHeader(kFull, std::string_view(bytes).substr(0, 32));
  ASSERT_OK(parsed);
  h.body_length = 4;
  EXPECT_EQ(*parsed, h);

  std::string bare = EncodeFrame(kBare, WireHeader{1, 2, 0, 0, 0, 0}, "xyz");
  EXPECT_EQ(bare, std::string("BARE\x01\x00\x02\x00\x03\x00\x00\x00xyz", 15));
  auto bare_header = ParseHeader(kBare, std::string_view(bare).substr(0, 12));
  ASSERT_OK(bare_header);
  EXPECT_EQ(*bare_header, (WireHeader{1, 2, 0, 3, 0, 0}));
}

TEST(WireFrameTest, ParseHeaderRejectsWrongSizeAndMagic) {
  auto short_header = ParseHeader(kBare, "BARE");
  EXPECT_EQ(short_header.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(short_header.status().message(), HasSubstr("4 bytes where 12 were expected"));
  std::string bad = Frame(kBare, 1, "");
  bad[0] = 'X';
  auto magic = ParseHeader(kBare, bad);
  EXPECT_EQ(magic.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(
      magic.status().message(),
      HasSubstr("read bare frame header: bad magic 'XARE' (expected 'BARE'); not a bare peer"));
}

TEST(WireFrameTest, ReaderSplitsAStreamCutAnywhere) {
  const std::string stream = Frame(kFull, 1, "one", 1) + Frame(kFull, 2, "", 2) +
                             Frame(kFull, 1, std::string(kMaxBody, 'b'), 3);
  for (size_t piece : {size_t{1}, size_t{5}, size_t{31}, size_t{32}, stream.size()}) {
    SCOPED_TRACE(piece);
    FrameReader reader(kFull);
    std::vector<WireFrame> frames;
    std::string_view rest = stream;
    while (!rest.empty()) {
      auto used = reader.Feed(rest.substr(0, piece), Check);
      ASSERT_OK(used);
      rest.remove_prefix(*used);
      if (reader.has_frame()) {
        EXPECT_EQ(reader.wanted(), 0u);
        ASSERT_OK(reader.Feed(rest, Check));  // a frame waits: nothing consumed
        EXPECT_EQ(*reader.Feed(rest, Check), 0u);
        frames.push_back(reader.TakeFrame());
      }
    }
    EXPECT_OK(reader.Finish());
    ASSERT_EQ(frames.size(), 3u);
    EXPECT_EQ(frames[0].body, "one");
    EXPECT_EQ(frames[0].header.request_id, 1u);
    EXPECT_EQ(frames[1].body, "");
    EXPECT_EQ(frames[1].header.type, 2);
    EXPECT_EQ(frames[2].body.size(), kMaxBody);
  }
}

TEST(WireFrameTest, PayloadsBufferedOrDetached) {
  const std::string frame = Frame(kFull, 2, "hd", 4, /*payload_length=*/5) + "PAYLD";
  FrameReader buffered(kFull);
  ASSERT_OK(buffered.Feed(frame, Check));
  ASSERT_TRUE(buffered.has_frame());
  EXPECT_EQ(buffered.TakeFrame().payload, "PAYLD");

  FrameReader detached(kFull, FrameReader::Payload::kDetached);
  auto used = detached.Feed(frame, Check);
  ASSERT_OK(used);
  EXPECT_EQ(*used, 32u + 2);  // the frame is ready after its body
  WireFrame f = detached.TakeFrame();
  EXPECT_EQ(f.payload, "");
  EXPECT_EQ(detached.payload_remaining(), 5u);
  EXPECT_EQ(*detached.Feed("PAYLD", Check), 0u);  // the caller takes the payload
  EXPECT_THAT(detached.Finish().message(),
              HasSubstr("5 payload bytes of the last frame of type 0x0002 (request id 4) missing"));
  EXPECT_EQ(detached.ConsumePayload(3), 3u);
  EXPECT_EQ(detached.ConsumePayload(9), 2u);
  EXPECT_OK(detached.Finish());
}

TEST(WireFrameTest, TruncatedStreamsSayWhereTheyWereCut) {
  const std::string frame = Frame(kFull, 1, "abcdef");
  FrameReader header(kFull);
  ASSERT_OK(header.Feed(std::string_view(frame).substr(0, 10), Check));
  EXPECT_EQ(header.wanted(), 22u);
  Status cut = header.Finish();
  EXPECT_EQ(cut.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(cut.message(),
              HasSubstr("test connection closed mid-frame: got 10 of 32 header bytes"));

  FrameReader body(kFull);
  ASSERT_OK(body.Feed(std::string_view(frame).substr(0, 34), Check));
  EXPECT_EQ(body.wanted(), 4u);
  EXPECT_THAT(body.Finish().message(),
              HasSubstr("got 2 of 6 body bytes of a PING frame (request id 7)"));

  FrameReader payload(kFull);
  ASSERT_OK(payload.Feed(Frame(kFull, 2, "", 9, 8) + "abc", Check));
  EXPECT_THAT(payload.Finish().message(),
              HasSubstr("got 3 of 8 payload bytes of a frame of type 0x0002 (request id 9)"));

  FrameReader bare(kBare);
  ASSERT_OK(bare.Feed("BARE\x01", Check));
  EXPECT_THAT(bare.Finish().message(), HasSubstr("bare connection closed mid-frame: got 5 of 12"));
}

TEST(WireFrameTest, BadHeadersFailTheReaderForGood) {
  struct Case {
    const char* name;
    std::string bytes;
    StatusCode code;
    const char* what;
  };
  std::string bad_magic = Frame(kFull, 1, "");
  bad_magic.replace(0, 4, "GET ");
  std::string oversized = Frame(kFull, 1, "");
  StoreLe(oversized.data() + 12, uint32_t{0xffffffff});  // a body of 4 GiB announced
  std::string huge_payload = Frame(kFull, 2, "", 1, ~uint64_t{0});
  std::vector<Case> cases = {
      {"magic", bad_magic, StatusCode::kInvalidArgument, "bad magic 'GET '"},
      {"unknown type", Frame(kFull, 9, ""), StatusCode::kInvalidArgument, "unknown type 9"},
      {"version", EncodeFrame(kFull, WireHeader{3, 1, 0, 0, 0, 1}, ""),
       StatusCode::kVersionMismatch, "version 3"},
      {"oversized body", oversized, StatusCode::kOutOfRange, "body of 4294967295"},
      {"oversized payload", huge_payload, StatusCode::kOutOfRange, "payload of"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FrameReader reader(kFull);
    auto r = reader.Feed(c.bytes, Check);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code);
    EXPECT_THAT(r.status().message(), HasSubstr(c.what));
    EXPECT_FALSE(reader.has_frame());
    EXPECT_LT(reader.buffered_bytes(), 128u);  // nothing of the body was buffered
    EXPECT_EQ(reader.status(), r.status());
    EXPECT_EQ(reader.Feed(Frame(kFull, 1, ""), Check).status(), r.status());  // sticky
    EXPECT_EQ(reader.Finish(), r.status());
  }
}

TEST(WireFrameTest, BuffersGrowOnlyAsBytesArrive) {
  FrameReader reader(kFull);
  std::string header = Frame(kFull, 1, "");
  StoreLe(header.data() + 12, kMaxBody);  // announces 64 bytes
  ASSERT_OK(reader.Feed(header, Check));
  const size_t empty = reader.buffered_bytes();  // two empty strings' inline capacity
  EXPECT_LT(empty, kMaxBody);
  ASSERT_OK(reader.Feed("ab", Check));
  EXPECT_EQ(reader.buffered_bytes(), empty);  // 2 bytes fit the inline capacity
  EXPECT_EQ(reader.wanted(), kMaxBody - 2);
}

TEST(WireFrameTest, FailIsSticky) {
  FrameReader reader(kBare);
  Status bad = reader.Fail(Status::InvalidArgument("limits"));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reader.Feed(Frame(kBare, 1, ""), Check).status(), bad);
  EXPECT_EQ(reader.Finish(), bad);
}

TEST(WireFrameTest, DescribeFrameAndHelpers) {
  EXPECT_EQ(DescribeFrame("READ", 4, true, true, 7), "READ frame (request id 7)");
  EXPECT_EQ(DescribeFrame("", 0x1234, true, true, 7), "frame of type 0x1234 (request id 7)");
  EXPECT_EQ(DescribeFrame("", 4242, false, true, 1), "frame of type 4242 (request id 1)");
  EXPECT_EQ(DescribeFrame("OPEN_CHUNK", 1, false, false, 0), "OPEN_CHUNK frame");
  EXPECT_EQ(Hex16(0x80ff), "0x80ff");
  EXPECT_EQ(VersionRange(1, 2), "1..2");
  EXPECT_EQ(Cut("abcdef", 3), "abc");
  EXPECT_EQ(Cut("ab", 3), "ab");
}

}  // namespace
}  // namespace granary::wire

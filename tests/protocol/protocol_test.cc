#include "granary/protocol/protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/file.h"
#include "granary/protocol/protocol_format.h"
#include "testing/test_util.h"

namespace granary {

// Readable failures for EXPECT_EQ on frames (found by ADL, so not in the
// anonymous namespace).
void PrintTo(const Frame& f, std::ostream* os) {
  *os << "{" << MessageTypeName(f.header.type) << " v" << f.header.version << " id "
      << f.header.request_id << ", body " << f.body.size() << "/" << f.header.body_length
      << " bytes, payload " << f.payload.size() << "/" << f.header.payload_length << " bytes}";
}

namespace {

namespace pf = protocol_format;

const ContentId kManifest{0x0123456789abcdefull, 0xfedcba9876543210ull};

// --- helpers ---------------------------------------------------------------

std::string Request(uint64_t id, const RequestMessage& m, const EncodeOptions& o = {}) {
  auto bytes = EncodeRequest(id, m, o);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

std::string Response(uint64_t id, const ResponseMessage& m, std::vector<PayloadPiece> payload = {},
                     const EncodeOptions& o = {}) {
  auto frame = EncodeResponse(id, m, std::move(payload), o);
  EXPECT_TRUE(frame.ok()) << frame.status().ToString();
  if (!frame.ok()) return {};
  auto flat = Flatten(*frame);
  EXPECT_TRUE(flat.ok()) << flat.status().ToString();
  return flat.ok() ? *flat : std::string();
}

// A frame built by hand: any header values, any body.
std::string RawFrame(uint16_t type, uint64_t id, std::string_view body, uint64_t payload_length = 0,
                     uint16_t version = 1, uint32_t flags = 0) {
  std::string out(pf::kFrameHeaderSize, '\0');
  std::memcpy(out.data(), pf::kMagic, 4);
  StoreLe(out.data() + pf::kVersionOffset, version);
  StoreLe(out.data() + pf::kTypeOffset, type);
  StoreLe(out.data() + pf::kFlagsOffset, flags);
  StoreLe(out.data() + pf::kBodyLengthOffset, static_cast<uint32_t>(body.size()));
  StoreLe(out.data() + pf::kPayloadLengthOffset, payload_length);
  StoreLe(out.data() + pf::kRequestIdOffset, id);
  out.append(body);
  return out;
}

std::string BodyOf(const std::string& frame) { return frame.substr(pf::kFrameHeaderSize); }

// Overwrites a little-endian value at `offset` of the body of `frame`.
template <typename T>
std::string WithBodyValue(std::string frame, size_t offset, T v) {
  StoreLe(frame.data() + pf::kFrameHeaderSize + offset, v);
  return frame;
}

Status RequestStatus(const std::string& bytes, const ProtocolLimits& limits = {}) {
  auto frame = DecodeFrame(bytes, FrameDirection::kRequests, limits);
  if (!frame.ok()) return frame.status();
  return DecodeRequest(*frame, limits).status();
}

Status ResponseStatus(const std::string& bytes, const ProtocolLimits& limits = {}) {
  auto frame = DecodeFrame(bytes, FrameDirection::kResponses, limits);
  if (!frame.ok()) return frame.status();
  return DecodeResponse(*frame, limits).status();
}

RequestMessage DecodedRequest(const std::string& bytes, uint64_t* id = nullptr) {
  auto frame = DecodeFrame(bytes, FrameDirection::kRequests);
  EXPECT_TRUE(frame.ok()) << frame.status().ToString();
  if (!frame.ok()) return PingRequest{};
  if (id != nullptr) *id = frame->header.request_id;
  auto m = DecodeRequest(*frame);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? *m : RequestMessage(PingRequest{});
}

#define EXPECT_CODE(expr, code_, substring)                                      \
  do {                                                                           \
    ::granary::Status s_ = (expr);                                               \
    EXPECT_EQ(s_.code(), (code_)) << s_.ToString();                              \
    EXPECT_NE(s_.message().find(substring), std::string::npos) << s_.ToString(); \
  } while (0)

ReadRequest SampleRead() {
  ReadRequest r;
  r.dataset = "imagenet-train";
  r.manifest_id = kManifest;
  r.items = {{ReadKind::kSample, 7, 0, 110 * 1024},
             {ReadKind::kSample, 4000000000u, 5ull << 32, 4096},
             {ReadKind::kChunkRange, 3, 1 << 20, 16 << 20},
             {ReadKind::kChunkRange, 0, 0, 1}};
  return r;
}

// --- limits ----------------------------------------------------------------

TEST(ProtocolLimitsTest, DefaultsAreValidAndConsistent) {
  ProtocolLimits d;
  EXPECT_OK(d.Validate());
  EXPECT_EQ(d.max_body_bytes, 1u << 20);
  EXPECT_EQ(d.max_items, 4096u);
  EXPECT_EQ(d.max_read_bytes, 64ull << 20);
  EXPECT_EQ(d.max_message_bytes, 32 + (1ull << 20) + (64ull << 20));
  ProtocolLimits caps{pf::kMaxBodyBytesCap, pf::kMaxItemsCap, pf::kMaxReadBytesCap,
                      pf::kMaxMessageBytesCap};
  EXPECT_OK(caps.Validate());
}

TEST(ProtocolLimitsTest, ValidateNamesTheBadField) {
  auto with = [](auto change) {
    ProtocolLimits l;
    change(l);
    return l.Validate();
  };
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_items = 0; }), StatusCode::kInvalidArgument,
              "max_items");
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_items = pf::kMaxItemsCap + 1; }),
              StatusCode::kInvalidArgument, "max_items");
  // 4096 items need more than 64 KiB of body.
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_body_bytes = 64 << 10; }),
              StatusCode::kInvalidArgument, "max_body_bytes");
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_body_bytes = pf::kMaxBodyBytesCap + 1; }),
              StatusCode::kInvalidArgument, "max_body_bytes");
  EXPECT_CODE(with([](ProtocolLimits& l) {
                l.max_items = 1;
                l.max_body_bytes = pf::kMinBodyBytes - 1;
              }),
              StatusCode::kInvalidArgument, "max_body_bytes");
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_read_bytes = 0; }), StatusCode::kInvalidArgument,
              "max_read_bytes");
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_read_bytes = pf::kMaxReadBytesCap + 1; }),
              StatusCode::kInvalidArgument, "max_read_bytes");
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_message_bytes = 32 + (1u << 20) - 1; }),
              StatusCode::kInvalidArgument, "max_message_bytes");
  EXPECT_CODE(with([](ProtocolLimits& l) { l.max_message_bytes = pf::kMaxMessageBytesCap + 1; }),
              StatusCode::kInvalidArgument, "max_message_bytes");
  // Fewer items make a small body valid.
  EXPECT_OK(with([](ProtocolLimits& l) {
    l.max_items = 16;
    l.max_body_bytes = pf::kMinBodyBytes;
    l.max_message_bytes = 32 + pf::kMinBodyBytes;
  }));
}

TEST(ProtocolLimitsTest, CommonLimitsTakesTheMinimumAndStaysValid) {
  ProtocolLimits a{4u << 20, 100, 1 << 20, 64ull << 20};
  ProtocolLimits b{pf::kMinBodyBytes, 50, 8 << 20, 32 + pf::kMinBodyBytes};
  ASSERT_OK(a.Validate());
  ASSERT_OK(b.Validate());
  ProtocolLimits c = CommonLimits(a, b);
  EXPECT_EQ(c, (ProtocolLimits{pf::kMinBodyBytes, 50, 1 << 20, 32 + pf::kMinBodyBytes}));
  EXPECT_OK(c.Validate());
}

TEST(ProtocolLimitsTest, InvalidLimitsFailTheDecoderAndEncoders) {
  ProtocolLimits bad;
  bad.max_items = 0;
  FrameDecoder decoder(FrameDirection::kRequests, bad);
  EXPECT_EQ(decoder.Feed(Request(1, PingRequest{})).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeRequest(1, PingRequest{}, {.limits = bad}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeResponse(1, PongReply{}, {}, {.limits = bad}).status().code(),
            StatusCode::kInvalidArgument);
}

// --- status codes and versions ----------------------------------------------

TEST(ProtocolTest, WireStatusCodesAreTheDocumentedNumbers) {
  const std::map<StatusCode, uint16_t> documented = {
      {StatusCode::kOk, 0},
      {StatusCode::kInvalidArgument, 1},
      {StatusCode::kNotFound, 2},
      {StatusCode::kAlreadyExists, 3},
      {StatusCode::kFailedPrecondition, 4},
      {StatusCode::kOutOfRange, 5},
      {StatusCode::kCorruption, 6},
      {StatusCode::kVersionMismatch, 7},
      {StatusCode::kIoError, 8},
      {StatusCode::kPermissionDenied, 9},
      {StatusCode::kResourceExhausted, 10},
      {StatusCode::kUnavailable, 11},
      {StatusCode::kDeadlineExceeded, 12},
      {StatusCode::kInternal, 13},
  };
  for (const auto& [code, wire] : documented) {
    EXPECT_EQ(ToWireStatus(code), wire) << StatusCodeName(code);
    EXPECT_EQ(FromWireStatus(wire), code) << wire;
  }
  EXPECT_EQ(FromWireStatus(14), std::nullopt);
  EXPECT_EQ(FromWireStatus(0xffff), std::nullopt);
}

TEST(ProtocolTest, NegotiateVersionPicksTheHighestCommon) {
  HelloRequest hello{1, 5, "sidecar"};
  EXPECT_EQ(*NegotiateVersion(hello, 1, 3), 3);
  EXPECT_EQ(*NegotiateVersion(hello, 4, 9), 5);
  EXPECT_EQ(*NegotiateVersion(HelloRequest{2, 2, "x"}, 1, 3), 2);
  EXPECT_EQ(*NegotiateVersion(HelloRequest{1, 1, "x"}), 1);
  EXPECT_CODE(NegotiateVersion(HelloRequest{4, 6, "old-client"}, 1, 3).status(),
              StatusCode::kVersionMismatch, "speaks versions 4..6, this server 1..3");
  EXPECT_CODE(NegotiateVersion(HelloRequest{3, 2, "x"}).status(), StatusCode::kInvalidArgument,
              "empty");
  EXPECT_CODE(NegotiateVersion(HelloRequest{0, 2, "x"}).status(), StatusCode::kInvalidArgument,
              "starts at 0");
}

// --- byte layout -------------------------------------------------------------

// The layout docs/protocol.md gives, checked byte for byte.
TEST(ProtocolTest, PingFrameIsTheDocumentedBytes) {
  std::string ping = Request(0x0102030405060708ull, PingRequest{}, {.version = 1, .limits = {}});
  const std::string expected(
      "GRNW"
      "\x01\x00"                           // version 1
      "\x02\x00"                           // type PING
      "\x00\x00\x00\x00"                   // flags
      "\x00\x00\x00\x00"                   // body_length
      "\x00\x00\x00\x00\x00\x00\x00\x00"   // payload_length
      "\x08\x07\x06\x05\x04\x03\x02\x01",  // request_id
      32);
  EXPECT_EQ(ping, expected);
}

TEST(ProtocolTest, ReadFrameFieldsAreAtTheDocumentedOffsets) {
  ReadRequest r = SampleRead();
  std::string f = Request(9, r);
  ASSERT_EQ(f.size(), 32u + 88 + 24 * 4);
  const char* b = f.data() + 32;
  EXPECT_EQ(LoadLe<uint16_t>(f.data() + 6), 0x0004);
  EXPECT_EQ(LoadLe<uint32_t>(f.data() + 12), 88u + 24 * 4);
  EXPECT_EQ(std::string(b, 15), std::string("imagenet-train\0", 15));
  EXPECT_EQ(std::string(b + 14, 50), std::string(50, '\0'));
  EXPECT_EQ(LoadLe<uint64_t>(b + 64), kManifest.low);
  EXPECT_EQ(LoadLe<uint64_t>(b + 72), kManifest.high);
  EXPECT_EQ(LoadLe<uint32_t>(b + 80), 4u);
  EXPECT_EQ(LoadLe<uint32_t>(b + 84), 0u);
  const char* item1 = b + 88 + 24;
  EXPECT_EQ(LoadLe<uint16_t>(item1 + 0), 1);
  EXPECT_EQ(LoadLe<uint16_t>(item1 + 2), 0);
  EXPECT_EQ(LoadLe<uint32_t>(item1 + 4), 4000000000u);
  EXPECT_EQ(LoadLe<uint64_t>(item1 + 8), 5ull << 32);
  EXPECT_EQ(LoadLe<uint32_t>(item1 + 16), 4096u);
  EXPECT_EQ(LoadLe<uint32_t>(item1 + 20), 0u);
  EXPECT_EQ(LoadLe<uint16_t>(b + 88 + 48), 2);  // item 2: chunk range
}

TEST(ProtocolTest, ReadReplyKeepsPayloadAfterAllHeaders) {
  ReadReply reply;
  reply.items = {{Status::Ok(), 3, 0xabcdull},
                 {Status::NotFound("sample 9 is not staged"), 0, std::nullopt},
                 {Status::Ok(), 2, std::nullopt}};
  std::string f = Response(5, reply, {std::string_view("abc"), std::string_view("de")});
  const std::string msg = "sample 9 is not staged";
  ASSERT_EQ(f.size(), 32 + 8 + 3 * 24 + msg.size() + 5);
  EXPECT_EQ(LoadLe<uint16_t>(f.data() + 6), 0x8004);
  EXPECT_EQ(LoadLe<uint32_t>(f.data() + 12), 8 + 3 * 24 + msg.size());
  EXPECT_EQ(LoadLe<uint64_t>(f.data() + 16), 5u);
  const char* items = f.data() + 32 + 8;
  EXPECT_EQ(LoadLe<uint16_t>(items + 2), pf::kReplyItemHasChecksum);
  EXPECT_EQ(LoadLe<uint32_t>(items + 8), 3u);
  EXPECT_EQ(LoadLe<uint64_t>(items + 16), 0xabcdu);
  EXPECT_EQ(LoadLe<uint16_t>(items + 24), 2);  // kNotFound
  EXPECT_EQ(LoadLe<uint16_t>(items + 24 + 4), msg.size());
  EXPECT_EQ(f.substr(32 + 8 + 72, msg.size()), msg);
  EXPECT_EQ(f.substr(f.size() - 5), "abcde");
}

// --- round trips -------------------------------------------------------------

TEST(ProtocolTest, EveryRequestRoundTrips) {
  ReadRequest max_read;
  max_read.dataset = std::string(63, 'a');
  max_read.manifest_id = kManifest;
  for (uint32_t i = 0; i < pf::kDefaultMaxItems; ++i) {
    max_read.items.push_back({i % 2 ? ReadKind::kSample : ReadKind::kChunkRange, i, i, 16384});
  }
  ASSERT_EQ(max_read.RequestedBytes(), 64ull << 20);
  const std::vector<RequestMessage> requests = {
      HelloRequest{1, 1, "sidecar/job-42@gpu-3"},
      HelloRequest{1, 65535, std::string(255, '~')},
      PingRequest{},
      StatRequest{},
      StatRequest{"imagenet", ContentId{}},
      StatRequest{"imagenet", kManifest},
      SampleRead(),
      max_read,
  };
  uint64_t id = 1;
  for (const RequestMessage& m : requests) {
    SCOPED_TRACE(id);
    std::string bytes = Request(id, m);
    uint64_t got_id = 0;
    EXPECT_EQ(DecodedRequest(bytes, &got_id), m);
    EXPECT_EQ(got_id, id);
    id = id * 1000 + 7;  // large ids too
  }
}

TEST(ProtocolTest, EveryResponseRoundTrips) {
  HelloReply hello{1, "cachenode-gpu-3", ProtocolLimits{}};
  HelloReply tight{1, "n", ProtocolLimits{pf::kMinBodyBytes, 10, 1000, 40000}};
  StatReply stat{NodeState::kServing,
                 {{"capacity_bytes", 1ull << 40}, {"staged_bytes", 12345}, {"uptime_seconds", 0}}};
  std::vector<StatEntry> many;
  for (uint32_t i = 0; i < pf::kMaxStatEntries; ++i) {
    many.push_back({"k" + std::string(58, 'x') + std::to_string(i % 10) + std::to_string(i / 10),
                    ~uint64_t{i}});
  }
  StatReply full_stat{NodeState::kDraining, many};
  ReadReply read;
  read.items = {{Status::Ok(), 5, 42},
                {Status::OutOfRange("offset 10 + length 5 past sample 3 of 12 bytes"), 0, {}},
                {Status::Ok(), 1, std::nullopt},
                {Status::Corruption(std::string(pf::kMaxItemMessageLength, 'c')), 0, {}},
                {Status(StatusCode::kDeadlineExceeded, ""), 0, {}}};
  const std::string payload =
      "hello"
      "!";
  struct Case {
    ResponseMessage message;
    std::vector<PayloadPiece> payload;
  };
  const std::vector<Case> cases = {
      {hello, {}},
      {tight, {}},
      {PongReply{}, {}},
      {StatReply{NodeState::kStarting, {}}, {}},
      {stat, {}},
      {full_stat, {}},
      {ReadReply{}, {}},
      {read, {std::string_view(payload).substr(0, 2), std::string_view(payload).substr(2)}},
      {ErrorReply{Status::NotFound("dataset 'x' is not served here"), false}, {}},
      {ErrorReply{Status::VersionMismatch(std::string(pf::kMaxErrorMessageLength, 'v')), true}, {}},
  };
  uint64_t id = 77;
  for (const Case& c : cases) {
    SCOPED_TRACE(id);
    std::string bytes = Response(id, c.message, c.payload);
    auto frame = DecodeFrame(bytes, FrameDirection::kResponses);
    ASSERT_OK(frame);
    EXPECT_EQ(frame->header.request_id, id);
    auto decoded = DecodeResponse(*frame);
    ASSERT_OK(decoded);
    EXPECT_EQ(*decoded, c.message);
    if (const auto* r = std::get_if<ReadReply>(&*decoded); r != nullptr && !r->items.empty()) {
      EXPECT_EQ(frame->payload, payload);
      auto pieces = SplitReadPayload(*r, frame->payload);
      ASSERT_OK(pieces);
      EXPECT_EQ(*pieces, (std::vector<std::string_view>{"hello", "", "!", "", ""}));
    }
    ++id;
  }
}

TEST(ProtocolTest, HandshakeFramesAlwaysCarryTheHandshakeVersion) {
  std::string hello = Request(1, HelloRequest{1, 1, "c"}, {.version = 1, .limits = {}});
  EXPECT_EQ(LoadLe<uint16_t>(hello.data() + pf::kVersionOffset), pf::kHandshakeVersion);
  std::string reply = Response(1, HelloReply{1, "s", {}});
  EXPECT_EQ(LoadLe<uint16_t>(reply.data() + pf::kVersionOffset), pf::kHandshakeVersion);
  EXPECT_EQ(EncodeRequest(1, PingRequest{}, {.version = 3, .limits = {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeRequest(1, PingRequest{}, {.version = 0, .limits = {}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ProtocolTest, LongMessagesAreCutToTheWireLimit) {
  ReadReply reply{{{Status::IoError(std::string(1000, 'e')), 0, {}}}};
  std::string bytes = Response(1, reply);
  auto frame = DecodeFrame(bytes, FrameDirection::kResponses);
  ASSERT_OK(frame);
  auto decoded = DecodeResponse(*frame);
  ASSERT_OK(decoded);
  const Status& s = std::get<ReadReply>(*decoded).items[0].status;
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), std::string(pf::kMaxItemMessageLength, 'e'));

  std::string error = EncodeError(3, Status::Internal(std::string(10000, 'i')), true);
  auto ef = DecodeFrame(error, FrameDirection::kResponses);
  ASSERT_OK(ef);
  auto ed = DecodeResponse(*ef);
  ASSERT_OK(ed);
  EXPECT_EQ(std::get<ErrorReply>(*ed).status.message().size(), pf::kMaxErrorMessageLength);
  EXPECT_TRUE(std::get<ErrorReply>(*ed).closing);
}

TEST(ProtocolTest, EncodeErrorNeverFails) {
  // An OK status is a bug on the sender's side: sent as kInternal.
  auto f = DecodeFrame(EncodeError(4, Status::Ok(), false, 99), FrameDirection::kResponses);
  ASSERT_OK(f);
  EXPECT_EQ(f->header.version, pf::kHandshakeVersion);
  auto d = DecodeResponse(*f);
  ASSERT_OK(d);
  EXPECT_EQ(std::get<ErrorReply>(*d).status.code(), StatusCode::kInternal);
  EXPECT_EQ(std::get<ErrorReply>(*d).closing, false);
  // Same bytes as the generic encoder.
  ErrorReply e{Status::NotFound("no such dataset"), true};
  EXPECT_EQ(EncodeError(8, e.status, true), Response(8, e, {}, {.version = 1, .limits = {}}));
  EXPECT_EQ(EncodeError(8, e.status, true, 2), Response(8, e));
}

TEST(ProtocolTest, UnknownWireStatusDecodesAsInternalWithTheNumber) {
  std::string error = EncodeError(3, Status::NotFound("gone"), false);
  error = WithBodyValue(error, pf::kErrorStatusOffset, uint16_t{99});
  auto f = DecodeFrame(error, FrameDirection::kResponses);
  ASSERT_OK(f);
  auto d = DecodeResponse(*f);
  ASSERT_OK(d);
  const Status& s = std::get<ErrorReply>(*d).status;
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "peer sent status code 99, unknown to this build: gone");

  std::string reply = Response(1, ReadReply{{{Status::Unavailable(""), 0, {}}}});
  reply =
      WithBodyValue(reply, pf::kReadReplyFixedSize + pf::kReplyItemStatusOffset, uint16_t{0xffff});
  auto rf = DecodeFrame(reply, FrameDirection::kResponses);
  ASSERT_OK(rf);
  auto rd = DecodeResponse(*rf);
  ASSERT_OK(rd);
  EXPECT_EQ(std::get<ReadReply>(*rd).items[0].status,
            Status::Internal("peer sent status code 65535, unknown to this build"));
}

TEST(ProtocolTest, FilePiecesAreReadByFlatten) {
  testing::TempDir dir;
  dir.WriteFile("chunk", "0123456789abcdef");
  auto fd = OpenFile(dir.Join("chunk"), O_RDONLY);
  ASSERT_OK(fd);
  ReadReply reply{{{Status::Ok(), 4, {}}, {Status::Ok(), 6, {}}}};
  // Item 0 from the file, item 1 from the file and from memory.
  auto frame = EncodeResponse(
      1, reply, {FileRange{fd->get(), 10, 4}, FileRange{fd->get(), 0, 3}, std::string_view("XYZ")});
  ASSERT_OK(frame);
  EXPECT_EQ(frame->payload_length(), 10u);
  EXPECT_EQ(frame->payload.size(), 3u);  // pieces are kept, not copied
  auto flat = Flatten(*frame);
  ASSERT_OK(flat);
  EXPECT_EQ(flat->substr(flat->size() - 10), "abcd012XYZ");
  EXPECT_EQ(flat->substr(0, frame->header.size()), frame->header);

  // A range past the end of the file: a clear error, not garbage.
  auto past = EncodeResponse(1, ReadReply{{{Status::Ok(), 4, {}}}}, {FileRange{fd->get(), 14, 4}});
  ASSERT_OK(past);
  EXPECT_FALSE(Flatten(*past).ok());
}

// --- stream decoding -------------------------------------------------------

struct Stream {
  std::string bytes;
  std::vector<uint64_t> ids;
};

Stream RequestStream(int rounds = 20) {
  Stream s;
  uint64_t id = 1;
  auto add = [&](const RequestMessage& m) {
    s.bytes += Request(id, m);
    s.ids.push_back(id++);
  };
  add(HelloRequest{1, 1, "client"});
  for (int i = 0; i < rounds; ++i) {
    add(PingRequest{});
    add(StatRequest{"ds", kManifest});
    ReadRequest r = SampleRead();
    r.items.resize(static_cast<size_t>(1 + i % 4));
    add(r);
  }
  return s;
}

Stream ResponseStream(std::string* payload_store, int rounds = 15) {
  Stream s;
  payload_store->clear();
  for (int i = 0; i < 200; ++i) payload_store->push_back(static_cast<char>('a' + i % 26));
  uint64_t id = 1;
  auto add = [&](const ResponseMessage& m, std::vector<PayloadPiece> payload = {}) {
    s.bytes += Response(id, m, std::move(payload));
    s.ids.push_back(id++);
  };
  std::string_view p(*payload_store);
  add(HelloReply{1, "server", {}});
  for (int i = 0; i < rounds; ++i) {
    add(PongReply{});
    add(ReadReply{{{Status::Ok(), 100, 1}, {Status::NotFound("x"), 0, {}}}}, {p.substr(0, 100)});
    add(ErrorReply{Status::OutOfRange("sample 12345 past the end"), false});
    add(ReadReply{{{Status::Ok(), 1, {}}}}, {p.substr(static_cast<size_t>(i), 1)});
    add(StatReply{NodeState::kServing, {{"a", 1}}});
  }
  return s;
}

// Feeds `bytes` in pieces of the given sizes (the last piece takes the rest)
// and returns the frames, checking the memory bound after every call.
std::vector<Frame> FeedInPieces(FrameDecoder& decoder, std::string_view bytes,
                                const std::vector<size_t>& sizes) {
  std::vector<Frame> frames;
  size_t piece = 0;
  // Bounded: a round per piece, and the pieces cover the bytes.
  const size_t max_rounds = sizes.size() + 1;
  for (size_t rounds = 0; !bytes.empty() && rounds < max_rounds; ++rounds) {
    size_t n = piece < sizes.size() ? std::min(sizes[piece], bytes.size()) : bytes.size();
    std::string_view chunk = bytes.substr(0, n);
    while (!chunk.empty()) {
      auto used = decoder.Feed(chunk);
      EXPECT_TRUE(used.ok()) << used.status().ToString();
      if (!used.ok()) return frames;
      chunk.remove_prefix(*used);
      bytes.remove_prefix(*used);
      if (decoder.has_frame()) {
        frames.push_back(decoder.TakeFrame());
      } else {
        EXPECT_TRUE(chunk.empty()) << "the decoder stopped early without a frame";
        break;
      }
    }
    ++piece;
  }
  EXPECT_OK(decoder.Finish());
  return frames;
}

std::vector<size_t> RandomSizes(uint32_t seed, size_t total, size_t max_piece) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> dist(0, max_piece);  // 0: an empty read
  std::vector<size_t> sizes;
  for (size_t sum = 0; sum < total;) {
    sizes.push_back(dist(rng));
    sum += sizes.back();
  }
  return sizes;
}

TEST(FrameDecoderTest, SameFramesWhateverTheSplits) {
  std::string payload_store;
  for (FrameDirection dir : {FrameDirection::kRequests, FrameDirection::kResponses}) {
    Stream s = dir == FrameDirection::kRequests ? RequestStream() : ResponseStream(&payload_store);
    FrameDecoder whole_decoder(dir);
    std::vector<Frame> whole = FeedInPieces(whole_decoder, s.bytes, {});
    ASSERT_EQ(whole.size(), s.ids.size());
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_EQ(whole[i].header.request_id, s.ids[i]);
      if (dir == FrameDirection::kRequests) {
        EXPECT_OK(DecodeRequest(whole[i]));
      } else {
        EXPECT_OK(DecodeResponse(whole[i]));
      }
    }
    {
      FrameDecoder d(dir);
      EXPECT_EQ(FeedInPieces(d, s.bytes, std::vector<size_t>(s.bytes.size(), 1)), whole);
    }
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      SCOPED_TRACE(seed);
      FrameDecoder d(dir);
      EXPECT_EQ(FeedInPieces(d, s.bytes, RandomSizes(seed, s.bytes.size(), seed * 7)), whole);
    }
  }
}

TEST(FrameDecoderTest, HoldsOneFrameAtATime) {
  std::string two = Request(1, PingRequest{}) + Request(2, PingRequest{});
  FrameDecoder d(FrameDirection::kRequests);
  auto used = d.Feed(two);
  ASSERT_OK(used);
  EXPECT_EQ(*used, 32u);
  ASSERT_TRUE(d.has_frame());
  // Nothing more is consumed until the frame is taken.
  EXPECT_EQ(*d.Feed(std::string_view(two).substr(32)), 0u);
  EXPECT_EQ(d.TakeFrame().header.request_id, 1u);
  EXPECT_EQ(*d.Feed(std::string_view(two).substr(32)), 32u);
  EXPECT_EQ(d.TakeFrame().header.request_id, 2u);
  EXPECT_FALSE(d.has_frame());
  EXPECT_OK(d.Finish());
}

TEST(FrameDecoderTest, DetachedPayloadIsLeftToTheCaller) {
  std::string payload_store;
  Stream s = ResponseStream(&payload_store);
  FrameDecoder buffered(FrameDirection::kResponses);
  std::vector<Frame> expected = FeedInPieces(buffered, s.bytes, {});

  for (uint32_t seed = 0; seed < 5; ++seed) {
    SCOPED_TRACE(seed);
    FrameDecoder d(FrameDirection::kResponses, {}, PayloadMode::kDetached);
    std::vector<Frame> frames;
    std::string_view rest = s.bytes;
    std::vector<size_t> sizes = RandomSizes(seed + 100, rest.size(), 40);
    size_t piece = 0;
    for (size_t rounds = 0; !rest.empty() && rounds < 100000; ++rounds) {
      std::string_view chunk = rest.substr(0, piece < sizes.size() ? sizes[piece++] : rest.size());
      if (d.payload_remaining() > 0) {
        // The caller places payload bytes itself (here: appends them to the frame).
        uint64_t n = d.ConsumePayload(chunk.size());
        frames.back().payload.append(chunk.substr(0, n));
        rest.remove_prefix(n);
        continue;
      }
      auto used = d.Feed(chunk);
      ASSERT_OK(used);
      rest.remove_prefix(*used);
      if (d.has_frame()) {
        Frame f = d.TakeFrame();
        EXPECT_TRUE(f.payload.empty());
        EXPECT_EQ(d.payload_remaining(), f.header.payload_length);
        if (f.header.payload_length > 0) {
          // Feeding while a payload is outstanding consumes nothing.
          EXPECT_EQ(*d.Feed(rest), 0u);
          // The reply decodes from the header and body alone.
          EXPECT_OK(DecodeResponse(f));
        }
        frames.push_back(std::move(f));
      }
    }
    EXPECT_OK(d.Finish());
    EXPECT_EQ(frames, expected);
  }
}

TEST(FrameDecoderTest, FinishNamesWhereTheStreamWasCut) {
  std::string stream = RequestStream().bytes;
  // Every prefix: no crash; cut inside a frame is an error, between frames OK.
  size_t boundary_count = 0;
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    FrameDecoder d(FrameDirection::kRequests);
    std::string_view rest(stream.data(), cut);
    for (int guard = 0; guard < 1000 && !rest.empty(); ++guard) {
      auto used = d.Feed(rest);
      ASSERT_OK(used);
      rest.remove_prefix(*used);
      if (d.has_frame()) d.TakeFrame();
    }
    Status s = d.Finish();
    if (s.ok()) {
      ++boundary_count;
    } else {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("connection closed mid-frame"), std::string::npos);
    }
  }
  EXPECT_EQ(boundary_count, RequestStream().ids.size() + 1);

  FrameDecoder d(FrameDirection::kRequests);
  std::string read = Request(1, SampleRead());
  ASSERT_OK(d.Feed(std::string_view(read).substr(0, 10)));
  EXPECT_CODE(d.Finish(), StatusCode::kInvalidArgument, "got 10 of 32 header bytes");
  ASSERT_OK(d.Feed(std::string_view(read).substr(10, 40)));
  EXPECT_CODE(d.Finish(), StatusCode::kInvalidArgument, "got 18 of 184 body bytes of a READ");

  std::string reply =
      Response(1, ReadReply{{{Status::Ok(), 8, {}}}}, {std::string_view("12345678")});
  FrameDecoder c(FrameDirection::kResponses);
  ASSERT_OK(c.Feed(std::string_view(reply).substr(0, reply.size() - 3)));
  EXPECT_CODE(c.Finish(), StatusCode::kInvalidArgument, "got 5 of 8 payload bytes");
  FrameDecoder detached(FrameDirection::kResponses, {}, PayloadMode::kDetached);
  ASSERT_OK(detached.Feed(reply));
  detached.TakeFrame();
  EXPECT_EQ(detached.ConsumePayload(5), 5u);
  EXPECT_CODE(detached.Finish(), StatusCode::kInvalidArgument, "3 payload bytes");
  EXPECT_EQ(detached.ConsumePayload(100), 3u);
  EXPECT_OK(detached.Finish());
}

TEST(FrameDecoderTest, BuffersGrowOnlyWithArrivingBytes) {
  // A header announcing a 1 MiB body costs nothing until the body comes.
  std::string body(1 << 20, 'x');
  std::string frame = RawFrame(pf::kTypeRead, 1, body);
  FrameDecoder d(FrameDirection::kRequests);
  ASSERT_OK(d.Feed(std::string_view(frame).substr(0, 32 + 10)));
  EXPECT_LT(d.buffered_bytes(), 1024u);
  // Arbitrary splits: never more held than the frame's own length.
  std::string_view rest = std::string_view(frame).substr(42);
  std::mt19937 rng(7);
  for (int guard = 0; guard < 100000 && !rest.empty(); ++guard) {
    size_t n = std::min<size_t>(rest.size(), rng() % 50000);
    auto used = d.Feed(rest.substr(0, n));
    ASSERT_OK(used);
    rest.remove_prefix(*used);
    EXPECT_LE(d.buffered_bytes(), body.size() + 64);
  }
  ASSERT_TRUE(d.has_frame());
  EXPECT_EQ(d.TakeFrame().body.size(), body.size());

  // The same for a payload.
  ProtocolLimits limits;
  std::string reply = RawFrame(pf::kTypeReadReply, 1, "", 50 << 20);
  FrameDecoder c(FrameDirection::kResponses, limits);
  ASSERT_OK(c.Feed(reply));
  ASSERT_OK(c.Feed(std::string(100, 'p')));
  EXPECT_LT(c.buffered_bytes(), 4096u);
}

// --- framing errors (the decoder fails; the connection is closed) -----------

Status FeedAll(FrameDirection dir, const std::string& bytes, const ProtocolLimits& limits = {}) {
  FrameDecoder d(dir, limits);
  std::string_view rest = bytes;
  for (int guard = 0; guard < 10000 && !rest.empty(); ++guard) {
    auto used = d.Feed(rest);
    if (!used.ok()) {
      // Sticky: it stays failed.
      EXPECT_EQ(d.Feed(Request(1, PingRequest{})).status(), used.status());
      EXPECT_EQ(d.Finish(), used.status());
      return used.status();
    }
    rest.remove_prefix(*used);
    if (d.has_frame()) d.TakeFrame();
  }
  return d.Finish();
}

TEST(FrameDecoderTest, BadMagic) {
  std::string f = Request(1, PingRequest{});
  f[0] = 'X';
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, f), StatusCode::kInvalidArgument,
              "bad magic 'XRNW'");
  EXPECT_CODE(FeedAll(FrameDirection::kRequests,
                      "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(10, ' ')),
              StatusCode::kInvalidArgument, "bad magic 'GET '");
}

TEST(FrameDecoderTest, UnknownVersion) {
  for (uint16_t v : {uint16_t{0}, uint16_t{3}, uint16_t{0xffff}}) {
    EXPECT_CODE(FeedAll(FrameDirection::kRequests, RawFrame(pf::kTypePing, 1, "", 0, v)),
                StatusCode::kVersionMismatch, "protocol version " + std::to_string(v));
  }
}

TEST(FrameDecoderTest, ExpectVersionAcceptsOnlyTheAgreedVersion) {
  FrameDecoder d(FrameDirection::kRequests);
  d.ExpectVersion(3);  // as if a newer build had agreed on version 3
  // HELLO as the handshake version is still fine...
  ASSERT_OK(d.Feed(Request(1, HelloRequest{1, 3, "c"})));
  ASSERT_TRUE(d.has_frame());
  d.TakeFrame();
  // ...a version-3 frame passes the frame layer (this build cannot decode its body)...
  ASSERT_OK(d.Feed(RawFrame(pf::kTypePing, 2, "", 0, 3)));
  Frame v3 = d.TakeFrame();
  EXPECT_EQ(DecodeRequest(v3).status().code(), StatusCode::kVersionMismatch);
  // ...and a version-2 PING no longer does.
  EXPECT_CODE(d.Feed(Request(3, PingRequest{})).status(), StatusCode::kVersionMismatch,
              "agreed on version 3");
}

TEST(FrameDecoderTest, ReservedHeaderFlags) {
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, RawFrame(pf::kTypePing, 1, "", 0, 1, 4)),
              StatusCode::kInvalidArgument, "flags");
}

TEST(FrameDecoderTest, HugeLengthFieldsFailBeforeBuffering) {
  // Only the header is sent: the decoder must fail on it alone.
  auto header_only = [](uint16_t type, uint32_t body, uint64_t payload) {
    std::string f = RawFrame(type, 1, "", payload);
    StoreLe(f.data() + pf::kBodyLengthOffset, body);
    return f;
  };
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, header_only(pf::kTypeRead, 0xffffffffu, 0)),
              StatusCode::kOutOfRange, "body of 4294967295 bytes exceeds the limit of 1048576");
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, header_only(pf::kTypeRead, (1 << 20) + 1, 0)),
              StatusCode::kOutOfRange, "exceeds the limit");
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, header_only(pf::kTypeRead, 0, 1)),
              StatusCode::kInvalidArgument, "requests carry no payload");
  EXPECT_CODE(FeedAll(FrameDirection::kResponses, header_only(pf::kTypePong, 0, 10)),
              StatusCode::kInvalidArgument, "only READ_REPLY frames carry a payload");
  EXPECT_CODE(FeedAll(FrameDirection::kResponses, header_only(pf::kTypeReadReply, 8, ~0ull)),
              StatusCode::kOutOfRange, "payload of 18446744073709551615 bytes exceeds");
  EXPECT_CODE(
      FeedAll(FrameDirection::kResponses, header_only(pf::kTypeReadReply, 8, (64 << 20) + 1)),
      StatusCode::kOutOfRange, "payload of 67108865 bytes exceeds the limit of 67108864");
  // A tightened message limit binds on body + payload together.
  ProtocolLimits tight;
  tight.max_message_bytes = 2 << 20;
  EXPECT_CODE(
      FeedAll(FrameDirection::kResponses, header_only(pf::kTypeReadReply, 1 << 20, 1 << 20), tight),
      StatusCode::kOutOfRange, "frame of 2097184 bytes exceeds the limit of 2097152");
}

TEST(FrameDecoderTest, TrailingGarbage) {
  std::string f = Request(1, PingRequest{}) + "junk";
  EXPECT_CODE(DecodeFrame(f, FrameDirection::kRequests).status(), StatusCode::kInvalidArgument,
              "4 bytes of trailing garbage after a PING");
  // In a stream, garbage after a frame is a cut (if short) or a bad header.
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, f), StatusCode::kInvalidArgument,
              "got 4 of 32 header bytes");
  EXPECT_CODE(FeedAll(FrameDirection::kRequests, f + std::string(40, 'j')),
              StatusCode::kInvalidArgument, "bad magic 'junk'");
  EXPECT_CODE(DecodeFrame("", FrameDirection::kRequests).status(), StatusCode::kInvalidArgument,
              "no bytes");
}

// --- message errors (an ERROR reply; the connection stays) ------------------

TEST(ProtocolMessageTest, UnknownAndMisdirectedTypes) {
  EXPECT_CODE(RequestStatus(RawFrame(0x0009, 1, "")), StatusCode::kInvalidArgument,
              "unknown request type 0x0009");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypePong, 1, "")), StatusCode::kInvalidArgument,
              "accepts requests only");
  EXPECT_CODE(ResponseStatus(RawFrame(0x8009, 1, "")), StatusCode::kInvalidArgument,
              "unknown response type 0x8009");
  EXPECT_CODE(ResponseStatus(RawFrame(pf::kTypePing, 1, "")), StatusCode::kInvalidArgument,
              "accepts responses only");
  // The stream stays usable: the next frame decodes.
  FrameDecoder d(FrameDirection::kRequests);
  std::string two = RawFrame(0x0077, 5, "abc") + Request(6, PingRequest{});
  std::vector<Frame> frames = FeedInPieces(d, two, {});
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_FALSE(DecodeRequest(frames[0]).ok());
  EXPECT_EQ(frames[0].header.request_id, 5u);  // what the ERROR reply echoes
  EXPECT_OK(DecodeRequest(frames[1]));
}

TEST(ProtocolMessageTest, RequestIdZeroIsReserved) {
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypePing, 0, "")), StatusCode::kInvalidArgument,
              "request id 0");
  EXPECT_CODE(EncodeRequest(0, PingRequest{}).status(), StatusCode::kInvalidArgument,
              "request id 0");
}

TEST(ProtocolMessageTest, BodiesOfTheWrongSize) {
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypePing, 1, "x")), StatusCode::kInvalidArgument,
              "body is 1 bytes, expected 0");
  EXPECT_CODE(ResponseStatus(RawFrame(pf::kTypePong, 1, "xy")), StatusCode::kInvalidArgument,
              "expected 0");
  std::string stat = BodyOf(Request(1, StatRequest{"ds", kManifest}));
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeStat, 1, stat + "x")), StatusCode::kInvalidArgument,
              "expected 84");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeStat, 1, stat.substr(1))),
              StatusCode::kInvalidArgument, "expected 84");
  for (uint16_t type : {pf::kTypeHello, pf::kTypeRead}) {
    EXPECT_CODE(RequestStatus(RawFrame(type, 1, "short")), StatusCode::kInvalidArgument,
                "shorter than");
  }
  for (uint16_t type :
       {pf::kTypeHelloReply, pf::kTypeStatReply, pf::kTypeReadReply, pf::kTypeError}) {
    EXPECT_CODE(ResponseStatus(RawFrame(type, 1, "x")), StatusCode::kInvalidArgument,
                "shorter than");
  }
}

TEST(ProtocolMessageTest, HelloErrors) {
  std::string hello = Request(1, HelloRequest{1, 1, "peer"});
  EXPECT_CODE(RequestStatus(hello + "x"), StatusCode::kInvalidArgument, "trailing garbage");
  std::string body = BodyOf(hello);
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeHello, 1, body + "x")), StatusCode::kInvalidArgument,
              "body is 17 bytes, expected 16");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloNameLengthOffset, uint16_t{0xffff})),
              StatusCode::kInvalidArgument, "expected 65547");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloFlagsOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "flags");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloReservedOffset, uint16_t{1})),
              StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloMinVersionOffset, uint16_t{0})),
              StatusCode::kInvalidArgument, "starts at 0");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloMinVersionOffset, uint16_t{3})),
              StatusCode::kInvalidArgument, "3..1 is empty");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloFixedSize + 1, uint8_t{' '})),
              StatusCode::kInvalidArgument, "graphic ASCII");
  EXPECT_CODE(RequestStatus(WithBodyValue(hello, pf::kHelloFixedSize, uint8_t{0x80})),
              StatusCode::kInvalidArgument, "peer name '\\x80eer'");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeHello, 1, body.substr(0, pf::kHelloFixedSize))),
              StatusCode::kInvalidArgument, "body is 12 bytes, expected 16");  // no name
  std::string empty_name = BodyOf(hello).substr(0, pf::kHelloFixedSize);
  StoreLe(empty_name.data() + pf::kHelloNameLengthOffset, uint16_t{0});
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeHello, 1, empty_name)), StatusCode::kInvalidArgument,
              "must be 1..255 bytes");
  // HELLO is always sent as the handshake version.
  std::string v3 = RawFrame(pf::kTypeHello, 1, body, 0, 3);
  FrameDecoder d(FrameDirection::kRequests);
  d.ExpectVersion(3);
  ASSERT_OK(d.Feed(v3));
  EXPECT_CODE(DecodeRequest(d.TakeFrame()).status(), StatusCode::kVersionMismatch,
              "protocol version 3 is not spoken");
  std::string v2 = RawFrame(pf::kTypeHello, 1, body, 0, 2);
  EXPECT_CODE(RequestStatus(v2), StatusCode::kVersionMismatch, "handshake frames are always");
  // The encoder refuses what the decoder would refuse.
  EXPECT_FALSE(EncodeRequest(1, HelloRequest{1, 1, ""}).ok());
  EXPECT_FALSE(EncodeRequest(1, HelloRequest{1, 1, std::string(256, 'a')}).ok());
  EXPECT_FALSE(EncodeRequest(1, HelloRequest{1, 1, "a b"}).ok());
  EXPECT_FALSE(EncodeRequest(1, HelloRequest{2, 1, "a"}).ok());
}

TEST(ProtocolMessageTest, HelloReplyErrors) {
  std::string reply = Response(1, HelloReply{1, "server", {}});
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kHelloReplyVersionOffset, uint16_t{3})),
              StatusCode::kVersionMismatch, "chose version 3");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kHelloReplyMaxItemsOffset, uint32_t{0})),
              StatusCode::kInvalidArgument, "max_items");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kHelloReplyMaxReadOffset, ~uint64_t{0})),
              StatusCode::kInvalidArgument, "max_read_bytes");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kHelloReplyFlagsOffset, uint32_t{2})),
              StatusCode::kInvalidArgument, "flags");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kHelloReplyNameReservedOffset, uint16_t{2})),
              StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kHelloReplyNameLengthOffset, uint16_t{7})),
              StatusCode::kInvalidArgument, "expected 43");
  EXPECT_FALSE(EncodeResponse(1, HelloReply{3, "s", {}}).ok());
  EXPECT_FALSE(EncodeResponse(1, HelloReply{1, "s", ProtocolLimits{1, 1, 1, 1}}).ok());
}

// --- authentication (version 2) ----------------------------------------------

AuthNonce NonceOf(uint8_t v) {
  AuthNonce n{};
  n.fill(v);
  return n;
}

TEST(ProtocolAuthTest, AuthMessagesRoundTrip) {
  AuthProof proof{};
  proof.fill(0xab);
  const std::vector<RequestMessage> requests = {
      AuthRequest{AuthMethod::kClusterKey, NonceOf(1),
                  std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8)},
      AuthRequest{AuthMethod::kKubernetesToken, NonceOf(2), "eyJhbGciOi.payload.sig"},
      AuthRequest{AuthMethod::kKubernetesToken, NonceOf(3), std::string(pf::kMaxTokenLength, 'a')},
      AuthProofRequest{proof},
  };
  for (const RequestMessage& m : requests) {
    std::string bytes = Request(9, m);
    EXPECT_EQ(LoadLe<uint16_t>(bytes.data() + pf::kVersionOffset), 2);
    EXPECT_EQ(DecodedRequest(bytes), m);
  }
  const std::vector<ResponseMessage> responses = {
      AuthReply{false, NonceOf(4), proof, ""},
      AuthReply{true, {}, {}, "namespace/team-a"},
      AuthProofReply{"cluster"},
      HelloReply{2, "node", {}, true},
      HelloReply{2, "node", {}, false},
  };
  for (const ResponseMessage& m : responses) {
    auto frame = DecodeFrame(Response(5, m), FrameDirection::kResponses);
    ASSERT_OK(frame);
    auto decoded = DecodeResponse(*frame);
    ASSERT_OK(decoded);
    EXPECT_EQ(*decoded, m);
  }
}

TEST(ProtocolAuthTest, AuthFramesAreRefusedInVersionOne) {
  const EncodeOptions v1{1, {}};
  EXPECT_CODE(EncodeRequest(1, AuthProofRequest{}, v1).status(), StatusCode::kInvalidArgument,
              "needs protocol version 2");
  EXPECT_CODE(EncodeResponse(1, AuthProofReply{"cluster"}, {}, v1).status(),
              StatusCode::kInvalidArgument, "needs protocol version 2");
  // Authentication cannot be asked for in a version-1 HELLO_REPLY.
  EXPECT_CODE(EncodeResponse(1, HelloReply{1, "s", {}, true}).status(),
              StatusCode::kInvalidArgument, "version 1");
  std::string proof = Request(1, AuthProofRequest{});
  StoreLe(proof.data() + pf::kVersionOffset, uint16_t{1});
  EXPECT_CODE(RequestStatus(proof), StatusCode::kInvalidArgument, "need protocol version 2");
  // A version-1 HELLO_REPLY with the flag set: a reserved bit.
  std::string hello = Response(1, HelloReply{1, "s", {}});
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(hello, pf::kHelloReplyFlagsOffset, pf::kHelloReplyAuthRequired)),
      StatusCode::kInvalidArgument, "flags");
  std::string hello2 = Response(1, HelloReply{2, "s", {}, true});
  EXPECT_CODE(ResponseStatus(WithBodyValue(hello2, pf::kHelloReplyFlagsOffset, uint32_t{3})),
              StatusCode::kInvalidArgument, "flags");
}

TEST(ProtocolAuthTest, BadAuthRequestsNameTheField) {
  const std::string key_id(8, 'k');
  std::string auth = Request(1, AuthRequest{AuthMethod::kClusterKey, NonceOf(1), key_id});
  EXPECT_CODE(RequestStatus(WithBodyValue(auth, pf::kAuthMethodOffset, uint16_t{7})),
              StatusCode::kInvalidArgument, "unknown authentication method 7");
  EXPECT_CODE(RequestStatus(WithBodyValue(auth, pf::kAuthFlagsOffset, uint16_t{1})),
              StatusCode::kInvalidArgument, "flags");
  EXPECT_CODE(RequestStatus(WithBodyValue(auth, pf::kAuthCredentialLengthOffset, uint32_t{9})),
              StatusCode::kInvalidArgument, "expected 49");
  EXPECT_CODE(RequestStatus(WithBodyValue(auth, pf::kAuthCredentialLengthOffset, ~uint32_t{0})),
              StatusCode::kOutOfRange, "at most");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeAuth, 1, "short", 0, 2)),
              StatusCode::kInvalidArgument, "shorter than AUTH's fixed 40");
  // A cluster key is named by 8 bytes; a token is graphic ASCII of bounded length.
  EXPECT_CODE(EncodeRequest(1, AuthRequest{AuthMethod::kClusterKey, {}, "1234567"}).status(),
              StatusCode::kInvalidArgument, "8-byte id");
  EXPECT_CODE(EncodeRequest(1, AuthRequest{AuthMethod::kKubernetesToken, {}, ""}).status(),
              StatusCode::kInvalidArgument, "tokens are 1..");
  EXPECT_CODE(EncodeRequest(1, AuthRequest{AuthMethod::kKubernetesToken, {}, "a b"}).status(),
              StatusCode::kInvalidArgument, "graphic ASCII");
  EXPECT_CODE(EncodeRequest(1, AuthRequest{AuthMethod::kKubernetesToken,
                                           {},
                                           std::string(pf::kMaxTokenLength + 1, 'a')})
                  .status(),
              StatusCode::kInvalidArgument, "tokens are 1..");
  std::string token = Request(1, AuthRequest{AuthMethod::kKubernetesToken, {}, "tok.en"});
  token[pf::kFrameHeaderSize + pf::kAuthFixedSize + 3] = '\n';
  EXPECT_CODE(RequestStatus(token), StatusCode::kInvalidArgument, "graphic ASCII");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeAuthProof, 1, std::string(31, 'p'), 0, 2)),
              StatusCode::kInvalidArgument, "expected 32");
}

TEST(ProtocolAuthTest, BadAuthRepliesAreRefused) {
  std::string challenge = Response(1, AuthReply{false, NonceOf(1), {}, ""});
  EXPECT_CODE(ResponseStatus(WithBodyValue(challenge, pf::kAuthReplyGrantedOffset, uint16_t{2})),
              StatusCode::kInvalidArgument, "not 0 or 1");
  EXPECT_CODE(ResponseStatus(WithBodyValue(challenge, pf::kAuthReplyReservedOffset, uint16_t{2})),
              StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(challenge, pf::kAuthReplyScopeLengthOffset, uint32_t{1000})),
      StatusCode::kOutOfRange, "at most 128");
  std::string with_scope = challenge + "x";
  StoreLe(with_scope.data() + pf::kBodyLengthOffset, uint32_t{pf::kAuthReplyFixedSize + 1});
  StoreLe(with_scope.data() + pf::kFrameHeaderSize + pf::kAuthReplyScopeLengthOffset, uint32_t{1});
  EXPECT_CODE(ResponseStatus(with_scope), StatusCode::kInvalidArgument, "no scope");
  EXPECT_FALSE(EncodeResponse(1, AuthReply{true, {}, {}, ""}).ok());
  EXPECT_FALSE(EncodeResponse(1, AuthReply{false, {}, {}, "cluster"}).ok());
  EXPECT_FALSE(EncodeResponse(1, AuthProofReply{std::string(129, 'a')}).ok());
  EXPECT_FALSE(EncodeResponse(1, AuthProofReply{"a b"}).ok());
  std::string granted = Response(1, AuthProofReply{"cluster"});
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(granted, pf::kAuthProofReplyReservedOffset, uint32_t{1})),
      StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(granted, pf::kAuthProofReplyScopeLengthOffset, uint32_t{0})),
      StatusCode::kInvalidArgument, "expected 8");
}

TEST(ProtocolMessageTest, DatasetNamesMustBeDnsLabels) {
  std::string read = Request(1, SampleRead());
  auto with_name = [&](std::string_view field) {
    std::string f = read;
    std::string padded(field);
    padded.resize(64, '\0');
    std::memcpy(f.data() + 32, padded.data(), 64);
    return f;
  };
  for (const char* bad : {"Imagenet", "image_net", "-a", "a-", "a.b", "a b"}) {
    SCOPED_TRACE(bad);
    EXPECT_CODE(RequestStatus(with_name(bad)), StatusCode::kInvalidArgument,
                "is not a DNS-1123 label");
  }
  EXPECT_CODE(RequestStatus(with_name("")), StatusCode::kInvalidArgument, "dataset name ''");
  EXPECT_CODE(RequestStatus(with_name(std::string(64, 'a'))), StatusCode::kInvalidArgument,
              "no NUL terminator");
  EXPECT_CODE(RequestStatus(with_name(std::string("ab\0c", 4))), StatusCode::kInvalidArgument,
              "bytes after its NUL");
  EXPECT_OK(RequestStatus(with_name(std::string(63, 'z'))));
  // The same rules for STAT, where empty means the whole node.
  std::string stat = Request(1, StatRequest{"ds", kManifest});
  std::string bad_stat = stat;
  bad_stat[32] = 'D';
  EXPECT_CODE(RequestStatus(bad_stat), StatusCode::kInvalidArgument, "'Ds'");
  EXPECT_OK(RequestStatus(Request(1, StatRequest{})));
  std::string manifest_only = Request(1, StatRequest{});
  StoreLe(manifest_only.data() + 32 + pf::kStatManifestIdOffset, uint64_t{5});
  EXPECT_CODE(RequestStatus(manifest_only), StatusCode::kInvalidArgument, "zero manifest id");
  EXPECT_CODE(RequestStatus(WithBodyValue(stat, pf::kStatFlagsOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "flags");
  // Encoders refuse the same.
  ReadRequest r = SampleRead();
  r.dataset = "Bad";
  EXPECT_CODE(EncodeRequest(1, r).status(), StatusCode::kInvalidArgument, "DNS-1123");
  EXPECT_FALSE(EncodeRequest(1, StatRequest{"no_underscores", {}}).ok());
  EXPECT_FALSE(EncodeRequest(1, StatRequest{"", kManifest}).ok());
}

TEST(ProtocolMessageTest, ReadItemCountsMustAgreeWithLengths) {
  std::string read = Request(1, SampleRead());  // 4 items
  std::string body = BodyOf(read);
  EXPECT_CODE(RequestStatus(WithBodyValue(read, pf::kReadItemCountOffset, uint32_t{3})),
              StatusCode::kInvalidArgument, "body is 184 bytes, expected 160");
  EXPECT_CODE(RequestStatus(WithBodyValue(read, pf::kReadItemCountOffset, uint32_t{5})),
              StatusCode::kInvalidArgument, "expected 208");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeRead, 1, body.substr(0, body.size() - 1))),
              StatusCode::kInvalidArgument, "expected 184");
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeRead, 1, body + std::string(24, '\0'))),
              StatusCode::kInvalidArgument, "expected 184");
  // Zero items.
  EXPECT_CODE(RequestStatus(RawFrame(pf::kTypeRead, 1,
                                     WithBodyValue(read, pf::kReadItemCountOffset, uint32_t{0})
                                         .substr(32, pf::kReadFixedSize))),
              StatusCode::kInvalidArgument, "no items");
  ReadRequest none = SampleRead();
  none.items.clear();
  EXPECT_CODE(EncodeRequest(1, none).status(), StatusCode::kInvalidArgument, "no items");
}

TEST(ProtocolMessageTest, TooManyItemsIsRefusedFromTheCountAlone) {
  // The count says 2^32-1 with a tiny body: out of range, nothing allocated.
  std::string read = Request(1, SampleRead());
  EXPECT_CODE(RequestStatus(WithBodyValue(read, pf::kReadItemCountOffset, ~uint32_t{0})),
              StatusCode::kOutOfRange, "4294967295 items exceed the limit of 4096");
  // A well-formed READ of max_items + 1 items.
  ReadRequest big = SampleRead();
  big.items.assign(pf::kDefaultMaxItems + 1, ReadItem{ReadKind::kSample, 1, 0, 1});
  EXPECT_CODE(EncodeRequest(1, big).status(), StatusCode::kOutOfRange, "4097 items");
  ProtocolLimits wide;
  wide.max_items = 8192;
  wide.max_body_bytes = 2 << 20;
  wide.max_message_bytes = 80 << 20;
  auto bytes = EncodeRequest(1, big, {.limits = wide});
  ASSERT_OK(bytes);
  EXPECT_OK(RequestStatus(*bytes, wide));
  EXPECT_CODE(RequestStatus(*bytes), StatusCode::kOutOfRange, "4097 items exceed");
  // A tightened limit on the receiving side.
  ProtocolLimits few;
  few.max_items = 2;
  EXPECT_CODE(RequestStatus(Request(1, SampleRead()), few), StatusCode::kOutOfRange,
              "4 items exceed the limit of 2");
}

TEST(ProtocolMessageTest, ReadItemErrors) {
  std::string read = Request(1, SampleRead());
  const size_t item0 = pf::kReadFixedSize;
  const size_t item2 = pf::kReadFixedSize + 2 * pf::kReadItemSize;  // a chunk range
  EXPECT_CODE(RequestStatus(WithBodyValue(read, item0 + pf::kReadItemLengthOffset, uint32_t{0})),
              StatusCode::kInvalidArgument, "item 0 is a zero-length read of id 7");
  EXPECT_CODE(RequestStatus(WithBodyValue(read, item0 + pf::kReadItemKindOffset, uint16_t{3})),
              StatusCode::kInvalidArgument, "unknown kind 3");
  EXPECT_CODE(RequestStatus(WithBodyValue(read, item0 + pf::kReadItemKindOffset, uint16_t{0})),
              StatusCode::kInvalidArgument, "unknown kind 0");
  EXPECT_CODE(RequestStatus(WithBodyValue(read, item0 + pf::kReadItemFlagsOffset, uint16_t{1})),
              StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(RequestStatus(WithBodyValue(read, item0 + pf::kReadItemReservedOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(
      RequestStatus(WithBodyValue(read, item0 + pf::kReadItemOffsetOffset, ~uint64_t{0} - 5)),
      StatusCode::kOutOfRange, "overflows 64 bits");
  // The largest sample offset that does not overflow is fine.
  EXPECT_OK(RequestStatus(
      WithBodyValue(read, item0 + pf::kReadItemOffsetOffset, ~uint64_t{0} - 110 * 1024)));
  // Chunk ranges end within 1 GiB.
  EXPECT_CODE(
      RequestStatus(WithBodyValue(read, item2 + pf::kReadItemOffsetOffset, uint64_t{1} << 30)),
      StatusCode::kOutOfRange, "ends past the largest chunk payload");
  EXPECT_OK(RequestStatus(
      WithBodyValue(read, item2 + pf::kReadItemOffsetOffset, (uint64_t{1} << 30) - (16 << 20))));
  EXPECT_CODE(RequestStatus(WithBodyValue(read, pf::kReadFlagsOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "flags");
  std::string zero_manifest = read;
  std::memset(zero_manifest.data() + 32 + pf::kReadManifestIdOffset, 0, 16);
  EXPECT_CODE(RequestStatus(zero_manifest), StatusCode::kInvalidArgument, "zero manifest id");
  // Encoders refuse the same.
  ReadRequest r = SampleRead();
  r.items[1].length = 0;
  EXPECT_CODE(EncodeRequest(1, r).status(), StatusCode::kInvalidArgument, "zero-length");
  r = SampleRead();
  r.items[0].offset = ~uint64_t{0};
  EXPECT_CODE(EncodeRequest(1, r).status(), StatusCode::kOutOfRange, "overflows");
  r = SampleRead();
  r.manifest_id = ContentId{};
  EXPECT_FALSE(EncodeRequest(1, r).ok());
  r = SampleRead();
  r.items[0].kind = static_cast<ReadKind>(9);
  EXPECT_FALSE(EncodeRequest(1, r).ok());
}

TEST(ProtocolMessageTest, RequestedBytesOverTheLimit) {
  ReadRequest r;
  r.dataset = "ds";
  r.manifest_id = kManifest;
  // 16 items of 4 MiB = 64 MiB: the limit exactly.
  r.items.assign(16, ReadItem{ReadKind::kSample, 1, 0, 4u << 20});
  std::string at_limit = Request(1, r);
  EXPECT_OK(RequestStatus(at_limit));
  std::string over = WithBodyValue(at_limit, pf::kReadFixedSize + pf::kReadItemLengthOffset,
                                   uint32_t{(4u << 20) + 1});
  EXPECT_CODE(RequestStatus(over), StatusCode::kOutOfRange,
              "asks for 67108865 bytes, more than the limit of 67108864");
  // u32 lengths cannot overflow the sum: 4096 x 4 GiB is still reported, not wrapped.
  ReadRequest huge;
  huge.dataset = "ds";
  huge.manifest_id = kManifest;
  huge.items.assign(4096, ReadItem{ReadKind::kSample, 1, 0, ~uint32_t{0}});
  EXPECT_CODE(EncodeRequest(1, huge).status(), StatusCode::kOutOfRange,
              std::to_string(4096ull * 0xffffffffull) + " bytes");
  // A receiver with a smaller read limit.
  ProtocolLimits small;
  small.max_read_bytes = 1 << 20;
  EXPECT_CODE(RequestStatus(at_limit, small), StatusCode::kOutOfRange, "limit of 1048576");
  // A tightened message limit bounds the reply, and so the READ.
  ProtocolLimits tight;
  tight.max_message_bytes = 32 + (1u << 20) + (8u << 20);
  EXPECT_CODE(RequestStatus(at_limit, tight), StatusCode::kOutOfRange,
              "could get a reply of " +
                  std::to_string(32 + pf::MaxReadReplyBodySize(16) + (64ull << 20)) + " bytes");
  EXPECT_EQ(EncodeRequest(1, r, {.limits = tight}).status().code(), StatusCode::kOutOfRange);
}

TEST(ProtocolMessageTest, StatReplyErrors) {
  StatReply stat{NodeState::kServing, {{"a", 1}, {"b", 2}}};
  std::string reply = Response(1, stat);
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyStateOffset, uint16_t{9})),
              StatusCode::kInvalidArgument, "unknown node state 9");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyReservedOffset, uint16_t{1})),
              StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyEntryCountOffset, uint32_t{3})),
              StatusCode::kInvalidArgument, "3 entries need at least 27 bytes");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyEntryCountOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "10 bytes follow the last of 1 entries");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyEntryCountOffset, ~uint32_t{0})),
              StatusCode::kOutOfRange, "4294967295 entries exceed the limit of 256");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyFixedSize, uint8_t{200})),
              StatusCode::kInvalidArgument, "runs past the end");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyFixedSize + 1, uint8_t{'b'})),
              StatusCode::kInvalidArgument, "'b' appears twice");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyFixedSize + 1, uint8_t{'B'})),
              StatusCode::kInvalidArgument, "STAT key 'B'");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kStatReplyFixedSize, uint8_t{0})),
              StatusCode::kInvalidArgument, "");
  EXPECT_FALSE(EncodeResponse(1, StatReply{NodeState::kServing, {{"x", 1}, {"x", 2}}}).ok());
  EXPECT_FALSE(EncodeResponse(1, StatReply{NodeState::kServing, {{"", 1}}}).ok());
  EXPECT_FALSE(EncodeResponse(1, StatReply{NodeState::kServing, {{std::string(64, 'k'), 1}}}).ok());
  EXPECT_FALSE(EncodeResponse(1, StatReply{static_cast<NodeState>(0), {}}).ok());
  EXPECT_FALSE(EncodeResponse(1, StatReply{NodeState::kServing,
                                           std::vector<StatEntry>(257, StatEntry{"k", 1})})
                   .ok());
}

TEST(ProtocolMessageTest, ReadReplyErrors) {
  ReadReply r{{{Status::Ok(), 3, 9}, {Status::NotFound("nope"), 0, {}}}};
  std::string reply = Response(1, r, {std::string_view("abc")});
  const size_t item0 = pf::kReadReplyFixedSize;
  const size_t item1 = item0 + pf::kReplyItemSize;
  EXPECT_OK(ResponseStatus(reply));
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(reply, item0 + pf::kReplyItemMessageLengthOffset, uint16_t{1})),
      StatusCode::kInvalidArgument, "item 0 is OK but carries a message");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, item1 + pf::kReplyItemLengthOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "item 1 failed (NotFound) but has payload bytes");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, item0 + pf::kReplyItemLengthOffset, uint32_t{2})),
              StatusCode::kInvalidArgument, "lengths add up to 2 bytes, the payload is 3");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, item0 + pf::kReplyItemFlagsOffset, uint16_t{0})),
              StatusCode::kInvalidArgument, "checksum without its flag");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, item0 + pf::kReplyItemFlagsOffset, uint16_t{3})),
              StatusCode::kInvalidArgument, "unknown flags 0x0003");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, item1 + pf::kReplyItemFlagsOffset, uint16_t{1})),
              StatusCode::kInvalidArgument, "has payload bytes or a checksum");
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(reply, item1 + pf::kReplyItemReserved1Offset, uint16_t{1})),
      StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(reply, item1 + pf::kReplyItemReserved2Offset, uint32_t{1})),
      StatusCode::kInvalidArgument, "reserved");
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(reply, item1 + pf::kReplyItemMessageLengthOffset, uint16_t{5})),
      StatusCode::kInvalidArgument, "messages add up to 5 bytes, the body has 4");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, item1 + pf::kReplyItemMessageLengthOffset,
                                           uint16_t{pf::kMaxItemMessageLength + 1})),
              StatusCode::kOutOfRange, "message of 193 bytes");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kReadReplyItemCountOffset, uint32_t{3})),
              StatusCode::kInvalidArgument, "3 items need 80 body bytes");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kReadReplyItemCountOffset, ~uint32_t{0})),
              StatusCode::kOutOfRange, "4294967295 items exceed");
  EXPECT_CODE(ResponseStatus(WithBodyValue(reply, pf::kReadReplyFlagsOffset, uint32_t{1})),
              StatusCode::kInvalidArgument, "flags");
  // Encoders: pieces must match the items, and only READ_REPLY has a payload.
  EXPECT_CODE(EncodeResponse(1, r, {std::string_view("ab")}).status(), StatusCode::kInvalidArgument,
              "do not add up to the items' 3 bytes");
  EXPECT_CODE(EncodeResponse(1, r, {std::string_view("abcd")}).status(),
              StatusCode::kInvalidArgument, "do not add up");
  EXPECT_CODE(EncodeResponse(1, r, {std::string_view("abc"), FileRange{-1, 0, 0}}).status(),
              StatusCode::kInvalidArgument, "without a file");
  EXPECT_CODE(EncodeResponse(1, r, {FileRange{3, 0, ~uint64_t{0}}, FileRange{3, 0, 4}}).status(),
              StatusCode::kInvalidArgument, "do not add up");
  EXPECT_CODE(EncodeResponse(1, PongReply{}, {std::string_view("x")}).status(),
              StatusCode::kInvalidArgument, "only READ_REPLY");
  ReadReply failed_with_bytes{{{Status::NotFound("x"), 3, {}}}};
  EXPECT_FALSE(EncodeResponse(1, failed_with_bytes, {std::string_view("abc")}).ok());
  EXPECT_FALSE(EncodeResponse(1, ErrorReply{Status::Ok(), false}).ok());
}

TEST(ProtocolMessageTest, ErrorReplyErrors) {
  std::string error = EncodeError(1, Status::NotFound("gone"), false);
  EXPECT_CODE(ResponseStatus(WithBodyValue(error, pf::kErrorStatusOffset, uint16_t{0})),
              StatusCode::kInvalidArgument, "must not carry status OK");
  EXPECT_CODE(ResponseStatus(WithBodyValue(error, pf::kErrorFlagsOffset, uint16_t{2})),
              StatusCode::kInvalidArgument, "unknown flags 0x0002");
  EXPECT_CODE(ResponseStatus(WithBodyValue(error, pf::kErrorMessageLengthOffset, uint32_t{5})),
              StatusCode::kInvalidArgument, "expected 13");
  EXPECT_CODE(
      ResponseStatus(WithBodyValue(error, pf::kErrorMessageLengthOffset, uint32_t{1} << 31)),
      StatusCode::kOutOfRange, "message of 2147483648 bytes");
}

TEST(ProtocolMessageTest, FramesOfTheWrongShape) {
  // Frames built by hand, not by a FrameDecoder.
  Frame f;
  f.header.type = pf::kTypePing;
  f.header.request_id = 1;
  f.header.body_length = 3;
  EXPECT_CODE(DecodeRequest(f).status(), StatusCode::kInvalidArgument, "holds 0");
  f.header.body_length = 0;
  f.header.version = 9;
  EXPECT_CODE(DecodeRequest(f).status(), StatusCode::kVersionMismatch, "version 9");
  f.header.version = 1;
  f.header.payload_length = 4;
  EXPECT_CODE(DecodeRequest(f).status(), StatusCode::kInvalidArgument, "carry no payload");
  f.header.type = pf::kTypePong;
  EXPECT_CODE(DecodeResponse(f).status(), StatusCode::kInvalidArgument,
              "only READ_REPLY frames carry a payload");
  f.header.type = pf::kTypeReadReply;
  f.payload = "xy";
  EXPECT_CODE(DecodeResponse(f).status(), StatusCode::kInvalidArgument, "holds 2");
}

TEST(ProtocolTest, CheckReadReplyMatchesItemsToTheRequest) {
  ReadRequest request = SampleRead();
  ReadReply reply;
  for (const ReadItem& item : request.items) reply.items.push_back({Status::Ok(), item.length, {}});
  EXPECT_OK(CheckReadReply(request, reply));
  reply.items[1] = {Status::NotFound("not staged"), 0, {}};
  EXPECT_OK(CheckReadReply(request, reply));
  reply.items[2].length -= 1;
  EXPECT_CODE(CheckReadReply(request, reply), StatusCode::kInvalidArgument,
              "item 2 has 16777215 bytes, 16777216 were asked for");
  reply.items.pop_back();
  EXPECT_CODE(CheckReadReply(request, reply), StatusCode::kInvalidArgument,
              "3 items answer a READ of 4");
  EXPECT_CODE(SplitReadPayload(ReadReply{{{Status::Ok(), 4, {}}}}, "abc").status(),
              StatusCode::kInvalidArgument, "add up to 4 bytes, the payload is 3");
}

TEST(ProtocolTest, MessageTypeNames) {
  EXPECT_EQ(MessageTypeName(pf::kTypeHello), "HELLO");
  EXPECT_EQ(MessageTypeName(pf::kTypeReadReply), "READ_REPLY");
  EXPECT_EQ(MessageTypeName(pf::kTypeError), "ERROR");
  EXPECT_EQ(MessageTypeName(0x1234), "unknown");
}

// --- seed corpus for tests/fuzz/protocol_fuzz.cc ------------------------------

// The fuzzer reads its first byte as a mode (see protocol_fuzz.cc): bit 0
// responses, bit 1 tight limits, bit 2 detached payloads; the rest is the
// stream. This test checks each seed's outcome; with GRANARY_PROTOCOL_CORPUS_OUT
// set it also writes them there, which is how tests/fuzz/corpus/protocol/ is
// regenerated:
//   GRANARY_PROTOCOL_CORPUS_OUT=$PWD/tests/fuzz/corpus/protocol
//   build/debug/tests/protocol_test --gtest_filter='*SeedCorpus*'
TEST(ProtocolTest, SeedCorpus) {
  struct Seed {
    char mode;
    std::string stream;
    bool stream_ok;  // every frame passes the frame layer and the stream ends cleanly
  };
  std::string payload_store;
  std::map<std::string, Seed> seeds;
  // Short streams: libFuzzer runs ten times faster on seeds under 1 KB.
  seeds["requests"] = {0, RequestStream(2).bytes, true};
  seeds["responses"] = {1, ResponseStream(&payload_store, 1).bytes, true};
  seeds["responses-detached"] = {5 | (3 << 3), ResponseStream(&payload_store, 1).bytes, true};
  seeds["hello"] = {0, Request(1, HelloRequest{1, 1, "sidecar/job@gpu"}), true};
  seeds["hello-reply"] = {1, Response(1, HelloReply{1, "node", {}}), true};
  seeds["auth-cluster-key"] = {
      0,
      Request(1, HelloRequest{1, 2, "sidecar"}) +
          Request(2, AuthRequest{AuthMethod::kClusterKey, {}, std::string(8, 'i')}) +
          Request(3, AuthProofRequest{}),
      true};
  seeds["auth-token"] = {
      0, Request(1, AuthRequest{AuthMethod::kKubernetesToken, {}, "eyJh.eyJz.c2ln"}), true};
  seeds["auth-replies"] = {1,
                           Response(1, HelloReply{2, "node", {}, true}) +
                               Response(2, AuthReply{false, {}, {}, ""}) +
                               Response(3, AuthProofReply{"namespace/team-a"}),
                           true};
  seeds["stat-reply"] = {1, Response(2, StatReply{NodeState::kServing, {{"staged_bytes", 5}}}),
                         true};
  seeds["error"] = {1, EncodeError(3, Status::NotFound("no dataset 'x'"), true), true};
  seeds["read-tight"] = {2, Request(4, SampleRead()), true};
  seeds["bad-magic"] = {0, "XRNW" + Request(1, PingRequest{}).substr(4), false};
  seeds["huge-body"] = {0, RawFrame(pf::kTypeRead, 1, "").replace(12, 4, "\xff\xff\xff\xff"),
                        false};
  seeds["truncated"] = {0, Request(1, SampleRead()).substr(0, 100), false};
  seeds["unknown-type"] = {0, RawFrame(0x0042, 1, "abc"), true};
  seeds["count-mismatch"] = {
      0, WithBodyValue(Request(1, SampleRead()), pf::kReadItemCountOffset, uint32_t{9}), true};

  const char* out = std::getenv("GRANARY_PROTOCOL_CORPUS_OUT");
  for (const auto& [name, seed] : seeds) {
    SCOPED_TRACE(name);
    FrameDirection dir = (seed.mode & 1) ? FrameDirection::kResponses : FrameDirection::kRequests;
    FrameDecoder d(dir);
    std::string_view rest = seed.stream;
    Status s;
    for (int guard = 0; guard < 1000 && !rest.empty() && s.ok(); ++guard) {
      auto used = d.Feed(rest);
      if (!used.ok()) {
        s = used.status();
        break;
      }
      rest.remove_prefix(*used);
      if (d.has_frame()) {
        d.TakeFrame();
        if (d.payload_remaining() > 0) rest.remove_prefix(d.ConsumePayload(rest.size()));
      }
    }
    if (s.ok()) s = d.Finish();
    EXPECT_EQ(s.ok(), seed.stream_ok) << s.ToString();
    if (out != nullptr) {
      std::filesystem::create_directories(out);
      std::ofstream file(std::string(out) + "/" + name, std::ios::binary);
      file.put(seed.mode);
      file.write(seed.stream.data(), static_cast<std::streamsize>(seed.stream.size()));
    }
  }
}

}  // namespace
}  // namespace granary

#include "granary/protocol/sidecar_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/plan.h"
#include "granary/protocol/protocol.h"
#include "testing/test_util.h"

// The largest single allocation made while g_track_allocations is set: how the
// tests prove that a count over the limits fails before anything is reserved.
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

void* operator new(size_t size) {
  if (g_track_allocations.load(std::memory_order_relaxed)) {
    size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
    while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size)) {
    }
  }
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
// g++ 12 at -O2 inlines the replaced new into callers and then warns that
// free() is called on what `new` returned: these replacements pair them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace granary::sidecar_protocol {

// Readable failures for EXPECT_EQ on frames (found by ADL).
void PrintTo(const Frame& f, std::ostream* os) {
  *os << "{" << MessageTypeName(f.header.type) << " v" << f.header.version << " id "
      << f.header.request_id << ", body " << f.body.size() << "/" << f.header.body_length
      << " bytes}";
}

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const ContentId kManifest{0x0123456789abcdefull, 0xfedcba9876543210ull};
constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint32_t kU32Max = std::numeric_limits<uint32_t>::max();

// --- helpers -------------------------------------------------------------------

std::string Req(uint64_t id, const Request& m, const Limits& limits = {}) {
  auto bytes = EncodeRequest(id, m, limits);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

std::string Rep(uint64_t id, const Reply& m, const Limits& limits = {}) {
  auto bytes = EncodeReply(id, m, limits);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

Result<Request> DecodeReqBytes(std::string_view bytes, const Limits& limits = {}) {
  GRANARY_ASSIGN_OR_RETURN(Frame f, DecodeFrame(bytes, limits));
  return DecodeRequest(f, limits);
}

Result<Reply> DecodeRepBytes(std::string_view bytes, const Limits& limits = {}) {
  GRANARY_ASSIGN_OR_RETURN(Frame f, DecodeFrame(bytes, limits));
  return DecodeReply(f, limits);
}

// RawFrame's default version: the lowest that has the type (MinVersionOf).
constexpr uint16_t kTypesVersion = 0xffff;

// A frame built by hand: any header values, any body.
std::string RawFrame(uint16_t type, uint64_t id, std::string_view body,
                     uint16_t version = kTypesVersion, uint32_t flags = 0,
                     const char* magic = "GRSC") {
  if (version == kTypesVersion) version = MinVersionOf(type);
  std::string out(kFrameHeaderSize, '\0');
  std::memcpy(out.data(), magic, 4);
  StoreLe(out.data() + 4, version);
  StoreLe(out.data() + 6, type);
  StoreLe(out.data() + 8, flags);
  StoreLe(out.data() + 12, static_cast<uint32_t>(body.size()));
  StoreLe(out.data() + 16, id);
  out.append(body);
  return out;
}

uint16_t T(MessageType t) { return static_cast<uint16_t>(t); }

// A body written field by field, independently of the encoder: these tests pin
// the layout in docs/protocol.md.
class Body {
 public:
  Body& U8(uint8_t v) { return Put(v); }
  Body& U16(uint16_t v) { return Put(v); }
  Body& U32(uint32_t v) { return Put(v); }
  Body& U64(uint64_t v) { return Put(v); }
  Body& I64(int64_t v) { return Put(v); }
  Body& Str(std::string_view s) {
    Put(static_cast<uint16_t>(s.size()));
    bytes_.append(s);
    return *this;
  }
  Body& Raw(std::string_view s) {
    bytes_.append(s);
    return *this;
  }
  operator std::string() const { return bytes_; }  // NOLINT(google-explicit-constructor)
  const std::string& str() const { return bytes_; }

 private:
  template <typename V>
  Body& Put(V v) {
    ByteWriter(&bytes_).Put(v);
    return *this;
  }
  std::string bytes_;
};

std::string ManifestBytes() {
  auto b = kManifest.ToBytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Valid messages of every type, with edge values.
std::vector<Request> EveryRequest() {
  SetPlan plan_max;
  plan_max.plan_id = std::string(128, 'p');
  plan_max.seed = kU64Max;
  plan_max.epoch = kMaxPlanEpoch;
  plan_max.world_size = kU32Max;
  plan_max.rank = kU32Max - 1;
  plan_max.batch_size = kU32Max;
  plan_max.drop_last = true;
  plan_max.mode = 2;
  plan_max.window_chunks = kU32Max;
  plan_max.start_position = kU64Max;
  SetPlan plan_min;
  plan_min.plan_id = "j";
  plan_min.window_chunks = 1;
  Get get_full;
  get_full.release = {1, kU64Max};
  get_full.ids = {0, kU32Max, 7};
  get_full.lookahead = kDefaultMaxItems - 3;
  Get get_max;
  get_max.ids.assign(kDefaultMaxItems, 5);
  get_max.release.assign(kDefaultMaxItems, 9);
  Release release_max;
  release_max.tokens.assign(kDefaultMaxItems, kU64Max);
  Lookup lookup{{"a", std::string(kMaxPathLength, 'x'), std::string("bin\0\xff/..", 8)}};
  return {
      Hello{1, 1, "python/1234"},
      Hello{1, 65535, std::string(kMaxNameLength, '~')},
      Open{"a"},
      Open{std::string(63, 'd')},
      plan_max,
      plan_min,
      get_full,
      get_max,
      Get{{}, {3}, 0},
      Next{{}, 1},
      Next{{4, 5}, kDefaultMaxItems},
      Release{},
      release_max,
      Stat{0, 1},
      Stat{kU32Max, 1},
      Stat{kU32Max - kDefaultMaxItems + 1, kDefaultMaxItems},
      lookup,
      Ping{},
      Directories{0, 1},
      Directories{kU32Max, 1},
      Directories{kU32Max - kDefaultMaxItems + 1, kDefaultMaxItems},
      ChunkFiles{{0}},
      ChunkFiles{{kU32Max, 0, 7, 7}},
  };
}

std::vector<Reply> EveryReply() {
  Samples samples;
  samples.end_of_epoch = true;
  samples.items.push_back({kU32Max, Status::Ok(), kU64Max, kU64Max - 5, 5, kU64Max, false});
  samples.items.push_back({0, Status::Ok(), 1, 0, 0, 0, true});  // an empty sample
  samples.items.push_back({3, Status::Unavailable("owner down"), 0, 0, 0, 0, false});
  samples.items.push_back(
      {4, Status::NotFound(std::string(kMaxMessageLength, 'm')), 0, 0, 0, 0, false});
  StatReply stat;
  stat.first_id = kU32Max - 1;
  stat.entries = {{"a/b.jpg", kU64Max, std::numeric_limits<int64_t>::min()},
                  {std::string(kMaxPathLength, 'q'), 0, -1}};
  LookupReply lookup;
  lookup.items = {{Status::Ok(), kU32Max}, {Status::InvalidArgument("absolute path"), 0}};
  return {
      HelloReply{1, "sidecar/gpu-3", Limits{}},
      HelloReply{1, std::string(kMaxNameLength, '!'), Limits{kMaxBodyBytesCap, kMaxItemsCap}},
      HelloReply{1, "s", Limits{4096, 1}},
      OpenReply{kManifest, kU64Max, 0, 17, 1},
      Ok{},
      samples,
      Samples{},
      stat,
      StatReply{7, {}},
      lookup,
      Pong{},
      Error{Status::FailedPrecondition("NEXT needs SET_PLAN first"), false},
      Error{Status::ResourceExhausted(""), true},
      DirectoriesReply{0, 0, {}},
      DirectoriesReply{kU32Max, kU32Max, {}},
      DirectoriesReply{
          1, 4, {{"a", 0755}, {"a/empty", 0}, {std::string(kMaxPathLength, 'd'), 07777}}},
      ChunkFilesReply{},
      ChunkFilesReply{{{kU32Max, Status::Ok(), {{1, 64, 5, kU64Max}, {2, kU64Max - 1, 1, 0}}, {3}},
                       {0, Status::NotFound("not on the local node"), {}, {0, 1}},
                       {7, Status::Ok(), {}, {}}}},
  };
}

// --- round trips ----------------------------------------------------------------

TEST(SidecarProtocolTest, EveryRequestRoundTrips) {
  uint64_t id = kU64Max;
  for (const Request& m : EveryRequest()) {
    SCOPED_TRACE(std::to_string(m.index()));
    std::string bytes = Req(id, m);
    auto frame = DecodeFrame(bytes);
    ASSERT_OK(frame);
    EXPECT_EQ(frame->header.request_id, id);
    EXPECT_EQ(frame->header.version,
              std::holds_alternative<Hello>(m) ? kHandshakeVersion : kMaxVersion);
    EXPECT_EQ(frame->header.body_length, bytes.size() - kFrameHeaderSize);
    auto back = DecodeRequest(*frame);
    ASSERT_OK(back);
    EXPECT_TRUE(*back == m);
    id = id / 2 + 1;
  }
}

TEST(SidecarProtocolTest, EveryReplyRoundTrips) {
  uint64_t id = 1;
  for (const Reply& m : EveryReply()) {
    SCOPED_TRACE(std::to_string(m.index()));
    std::string bytes = Rep(id, m);
    auto frame = DecodeFrame(bytes);
    ASSERT_OK(frame);
    EXPECT_EQ(frame->header.request_id, id);
    auto back = DecodeReply(*frame);
    ASSERT_OK(back);
    EXPECT_TRUE(*back == m);
    id = id * 3 + 1;
  }
}

TEST(SidecarProtocolTest, ErrorBlamingNoRequestRoundTrips) {
  std::string bytes = sidecar_protocol::EncodeError(0, Status::InvalidArgument("bad magic"), true);
  auto back = DecodeRepBytes(bytes);
  ASSERT_OK(back);
  ASSERT_TRUE(std::holds_alternative<Error>(*back));
  EXPECT_EQ(std::get<Error>(*back).status, Status::InvalidArgument("bad magic"));
  EXPECT_TRUE(std::get<Error>(*back).closing);
  auto via_reply = EncodeReply(0, Error{Status::InvalidArgument("bad magic"), true});
  ASSERT_OK(via_reply);
  EXPECT_EQ(*via_reply, bytes);
}

// --- the byte layout (docs/protocol.md, "Sidecar protocol") ---------------------

TEST(SidecarProtocolTest, FrameHeaderBytes) {
  std::string bytes = Req(0x0102030405060708ull, Ping{});
  std::string expected("GRSC\x03\x00\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00", 16);
  expected += std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8);
  EXPECT_EQ(bytes, expected);
}

TEST(SidecarProtocolTest, RequestBodiesByteByByte) {
  auto body = [](const std::string& frame) { return frame.substr(kFrameHeaderSize); };
  EXPECT_EQ(body(Req(1, Hello{1, 2, "py"})), Body().U16(1).U16(2).Str("py").str());
  EXPECT_EQ(body(Req(1, Open{"imagenet"})), Body().Str("imagenet").str());
  SetPlan plan;
  plan.plan_id = "job-1";
  plan.seed = 11;
  plan.epoch = 3;
  plan.world_size = 4;
  plan.rank = 2;
  plan.batch_size = 32;
  plan.drop_last = true;
  plan.mode = 1;
  plan.window_chunks = 9;
  plan.start_position = 100;
  EXPECT_EQ(
      body(Req(1, plan)),
      Body().U64(11).U64(3).U64(100).U32(4).U32(2).U32(32).U32(9).U8(1).U8(1).Str("job-1").str());
  EXPECT_EQ(body(Req(1, Get{{7, 8}, {1, 2, 3}, 5})),
            Body().U32(5).U32(2).U64(7).U64(8).U32(3).U32(1).U32(2).U32(3).str());
  EXPECT_EQ(body(Req(1, Next{{7}, 16})), Body().U32(16).U32(1).U64(7).str());
  EXPECT_EQ(body(Req(1, Release{{9, 10}})), Body().U32(2).U64(9).U64(10).str());
  EXPECT_EQ(body(Req(1, Stat{5, 6})), Body().U32(5).U32(6).str());
  EXPECT_EQ(body(Req(1, Lookup{{"a/b", "c"}})), Body().U32(2).Str("a/b").Str("c").str());
  EXPECT_EQ(body(Req(1, Ping{})), "");
  EXPECT_EQ(body(Req(1, Directories{5, 6})), Body().U32(5).U32(6).str());
  EXPECT_EQ(body(Req(1, ChunkFiles{{4, 9}})), Body().U32(2).U32(4).U32(9).str());
}

TEST(SidecarProtocolTest, ReplyBodiesByteByByte) {
  auto body = [](const std::string& frame) { return frame.substr(kFrameHeaderSize); };
  EXPECT_EQ(body(Rep(1, HelloReply{1, "sc", Limits{8192, 64}})),
            Body().U16(1).U32(8192).U32(64).Str("sc").str());
  EXPECT_EQ(body(Rep(1, OpenReply{kManifest, 10, 20, 3, 4096})),
            Body().Raw(ManifestBytes()).U64(10).U64(20).U64(3).U64(4096).str());
  EXPECT_EQ(body(Rep(1, Ok{})), "");
  Samples s;
  s.end_of_epoch = true;
  s.items = {{7, Status::Ok(), 99, 4096, 10, 0xabc, true},
             {8, Status::NotFound("gone"), 0, 0, 0, 0, false}};
  EXPECT_EQ(body(Rep(1, s)), Body()
                                 .U32(2)
                                 .U8(1)
                                 .U32(7)
                                 .U8(1)
                                 .U64(99)
                                 .U64(4096)
                                 .U64(10)
                                 .U64(0xabc)
                                 .U16(0)
                                 .Str("")
                                 .U32(8)
                                 .U8(0)
                                 .U64(0)
                                 .U64(0)
                                 .U64(0)
                                 .U64(0)
                                 .U16(ToWireStatus(StatusCode::kNotFound))
                                 .Str("gone")
                                 .str());
  EXPECT_EQ(body(Rep(1, StatReply{4, {{"x", 5, -6}}})),
            Body().U32(4).U32(1).U64(5).I64(-6).Str("x").str());
  EXPECT_EQ(body(Rep(1, LookupReply{{{Status::Ok(), 3}, {Status::NotFound("no"), 0}}})),
            Body()
                .U32(2)
                .U32(3)
                .U16(0)
                .Str("")
                .U32(0)
                .U16(ToWireStatus(StatusCode::kNotFound))
                .Str("no")
                .str());
  EXPECT_EQ(body(Rep(1, Pong{})), "");
  EXPECT_EQ(body(Rep(1, Error{Status::Unavailable("down"), true})),
            Body().U16(ToWireStatus(StatusCode::kUnavailable)).U16(1).Str("down").str());
  EXPECT_EQ(body(Rep(1, DirectoriesReply{1, 3, {{"a", 0755}, {"a/b", 0}}})),
            Body().U32(1).U32(3).U32(2).U16(0755).Str("a").U16(0).Str("a/b").str());
  EXPECT_EQ(body(Rep(1, ChunkFilesReply{{{5, Status::Ok(), {{9, 64, 3, 0xabc}}, {10}},
                                         {6, Status::NotFound("no"), {}, {}}}})),
            Body()
                .U32(2)
                .U32(5)
                .U16(0)
                .Str("")
                .U32(1)
                .U32(9)
                .U64(64)
                .U64(3)
                .U64(0xabc)
                .U32(1)
                .U32(10)
                .U32(6)
                .U16(ToWireStatus(StatusCode::kNotFound))
                .Str("no")
                .U32(0)
                .U32(0)
                .str());
  // The same numbers as the cache node protocol.
  EXPECT_EQ(ToWireStatus(StatusCode::kUnavailable), 11);
}

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (char ch : bytes) {
    auto c = static_cast<unsigned char>(ch);
    out += kDigits[c >> 4];
    out += kDigits[c & 0xf];
  }
  return out;
}

// The worked examples of docs/protocol.md, "Sidecar protocol": keep both in
// step. They are version 1 frames (a connection that agreed on version 1).
TEST(SidecarProtocolTest, DocExamples) {
  auto Req = [](uint64_t id, const Request& m) { return *EncodeRequest(id, m, {}, 1); };
  auto Rep = [](uint64_t id, const Reply& m) { return *EncodeReply(id, m, {}, 1); };
  EXPECT_EQ(Hex(Req(7, Get{{42}, {3, 5}, 2})),
            "4752534301000400000000001c000000070000000000000002000000010000002a0000000000000002"
            "0000000300000005000000");
  Samples samples{{{3, Status::Ok(), 0x10, 4096, 100, 0x0123456789abcdefull, false},
                   {5, Status::Unavailable("source down"), 0, 0, 0, 0, false}},
                  false};
  EXPECT_EQ(Hex(Rep(7, samples)),
            "475253430100680000000000620000000700000000000000020000000003000000001000000000000000"
            "00100000000000006400000000000000efcdab8967452301000000000500000000000000000000000000"
            "00000000000000000000000000000000000000000000000b000b00736f7572636520646f776e");
  const ContentId manifest{0x1111111111111111ull, 0x2222222222222222ull};
  EXPECT_EQ(Hex(Rep(2, OpenReply{manifest, 60000, 9000000, 3, uint64_t{1} << 30})),
            "4752534301006600000000003000000002000000000000002222222222222222111111111111111160ea"
            "000000000000405489000000000003000000000000000000004000000000");
  EXPECT_EQ(Hex(sidecar_protocol::EncodeError(0, Status::InvalidArgument("bad magic"), true, 1)),
            "4752534301006c00000000000f0000000000000000000000010001000900626164206d61676963");
}

// --- limits, names, versions ---------------------------------------------------------

TEST(SidecarProtocolTest, LimitsValidate) {
  EXPECT_OK(Limits{}.Validate());
  EXPECT_OK(((Limits{4096, 1}).Validate()));
  EXPECT_OK((Limits{kMaxBodyBytesCap, kMaxItemsCap}.Validate()));
  EXPECT_THAT((Limits{4095, 1}).Validate().message(), HasSubstr("max_body_bytes"));
  EXPECT_THAT((Limits{kMaxBodyBytesCap + 1, 1}).Validate().message(), HasSubstr("max_body_bytes"));
  EXPECT_THAT((Limits{4096, 0}).Validate().message(), HasSubstr("max_items"));
  EXPECT_THAT((Limits{4096, kMaxItemsCap + 1}).Validate().message(), HasSubstr("max_items"));
  EXPECT_EQ((Limits{4096, 1}).Validate().code(), StatusCode::kOk);
  EXPECT_EQ((CommonLimits(Limits{8192, 10}, Limits{4096, 20})), (Limits{4096, 10}));
}

TEST(SidecarProtocolTest, MessageTypeNames) {
  EXPECT_EQ(MessageTypeName(T(MessageType::kHello)), "HELLO");
  EXPECT_EQ(MessageTypeName(T(MessageType::kSetPlan)), "SET_PLAN");
  EXPECT_EQ(MessageTypeName(T(MessageType::kPing)), "PING");
  EXPECT_EQ(MessageTypeName(T(MessageType::kHelloReply)), "HELLO_REPLY");
  EXPECT_EQ(MessageTypeName(T(MessageType::kLookupReply)), "LOOKUP_REPLY");
  EXPECT_EQ(MessageTypeName(T(MessageType::kError)), "ERROR");
  EXPECT_EQ(MessageTypeName(10), "DIRECTORIES");
  EXPECT_EQ(MessageTypeName(109), "DIRECTORIES_REPLY");
  EXPECT_EQ(MessageTypeName(0), "unknown");
  EXPECT_EQ(MessageTypeName(11), "CHUNK_FILES");
  EXPECT_EQ(MessageTypeName(12), "unknown");
  EXPECT_EQ(MessageTypeName(100), "unknown");
  EXPECT_EQ(MessageTypeName(110), "CHUNK_FILES_REPLY");
  EXPECT_EQ(MessageTypeName(111), "unknown");
}

TEST(SidecarProtocolTest, NegotiateVersion) {
  EXPECT_EQ(kMaxVersion, 3);
  EXPECT_EQ(*NegotiateVersion(Hello{1, 1, "c"}), 1);  // a client from before DIRECTORIES
  EXPECT_EQ(*NegotiateVersion(Hello{1, 2, "c"}), 2);
  EXPECT_EQ(*NegotiateVersion(Hello{2, 2, "c"}), 2);
  EXPECT_EQ(*NegotiateVersion(Hello{1, 9, "c"}), kMaxVersion);
  EXPECT_EQ(*NegotiateVersion(Hello{1, 3, "c"}), 3);
  auto newer = NegotiateVersion(Hello{4, 5, "c"});
  EXPECT_EQ(newer.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(newer.status().message(), AllOf(HasSubstr("4..5"), HasSubstr("1..3")));
  EXPECT_EQ(NegotiateVersion(Hello{0, 1, "c"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NegotiateVersion(Hello{2, 1, "c"}).status().code(), StatusCode::kInvalidArgument);
}

TEST(SidecarProtocolTest, HandshakeFramesAlwaysCarryTheHandshakeVersion) {
  // Encoded at version 2 by default, HELLO still goes out as version 1.
  auto f = DecodeFrame(Req(1, Hello{1, 2, "c"}));
  ASSERT_OK(f);
  EXPECT_EQ(f->header.version, kHandshakeVersion);
  auto bad = EncodeRequest(1, Ping{}, {}, 7);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("PING"), HasSubstr("version 7")));
  EXPECT_EQ(EncodeReply(1, Pong{}, {}, 0).status().code(), StatusCode::kInvalidArgument);
}

// DIRECTORIES came with version 2: refused at version 1 on both sides, with
// an error naming the type, both versions and what to do.
TEST(SidecarProtocolTest, DirectoriesNeedVersion2) {
  EXPECT_EQ(MinVersionOf(T(MessageType::kDirectories)), 2);
  EXPECT_EQ(MinVersionOf(T(MessageType::kDirectoriesReply)), 2);
  EXPECT_EQ(MinVersionOf(T(MessageType::kStat)), 1);
  EXPECT_EQ(MinVersionOf(4242), 1);
  auto req = EncodeRequest(1, Directories{0, 10}, {}, 1);
  EXPECT_EQ(req.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(req.status().message(), AllOf(HasSubstr("DIRECTORIES"), HasSubstr("version 2"),
                                            HasSubstr("version 1"), HasSubstr("upgrade")));
  auto rep = EncodeReply(1, DirectoriesReply{0, 0, {}}, {}, 1);
  EXPECT_EQ(rep.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(rep.status().message(), HasSubstr("DIRECTORIES_REPLY"));

  auto old_req =
      DecodeReqBytes(RawFrame(T(MessageType::kDirectories), 1, Body().U32(0).U32(1).str(), 1));
  EXPECT_EQ(old_req.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(old_req.status().message(),
              AllOf(HasSubstr("decode DIRECTORIES frame"), HasSubstr("version 2")));
  auto old_rep = DecodeRepBytes(
      RawFrame(T(MessageType::kDirectoriesReply), 1, Body().U32(0).U32(0).U32(0).str(), 1));
  EXPECT_EQ(old_rep.status().code(), StatusCode::kVersionMismatch);

  // Version 1 messages are the same in version 2, and still encode as version 1.
  auto ping1 = DecodeFrame(*EncodeRequest(3, Ping{}, {}, 1));
  ASSERT_OK(ping1);
  EXPECT_EQ(ping1->header.version, 1);
  ASSERT_OK(DecodeRequest(*ping1));
  auto dirs2 = DecodeFrame(*EncodeRequest(4, Directories{3, 4}, {}, 2));
  ASSERT_OK(dirs2);
  EXPECT_EQ(dirs2->header.version, 2);
  auto back = DecodeRequest(*dirs2);
  ASSERT_OK(back);
  EXPECT_EQ(std::get<Directories>(*back), (Directories{3, 4}));
}

// CHUNK_FILES came with version 3: refused at version 2 on both sides.
TEST(SidecarProtocolTest, ChunkFilesNeedVersion3) {
  EXPECT_EQ(MinVersionOf(T(MessageType::kChunkFiles)), 3);
  EXPECT_EQ(MinVersionOf(T(MessageType::kChunkFilesReply)), 3);
  auto req = EncodeRequest(1, ChunkFiles{{1}}, {}, 2);
  EXPECT_EQ(req.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(req.status().message(), AllOf(HasSubstr("CHUNK_FILES"), HasSubstr("version 3")));
  EXPECT_EQ(EncodeReply(1, ChunkFilesReply{}, {}, 2).status().code(), StatusCode::kVersionMismatch);
  auto old_req =
      DecodeReqBytes(RawFrame(T(MessageType::kChunkFiles), 1, Body().U32(1).U32(0).str(), 2));
  EXPECT_EQ(old_req.status().code(), StatusCode::kVersionMismatch);
  auto three = DecodeFrame(Req(4, ChunkFiles{{3}}));
  ASSERT_OK(three);
  EXPECT_EQ(three->header.version, 3);
}

// Random bodies under the DIRECTORIES types (and truncations of valid ones)
// decode or fail cleanly, naming the type; never a crash or an over-read.
TEST(SidecarProtocolTest, GarbageDirectoriesBodiesFailCleanly) {
  std::mt19937 rng(20261122);
  size_t decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body(rng() % 48, '\0');
    for (char& c : body) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 3);
    const bool request = i % 2 == 0;
    const uint16_t type = T(request ? MessageType::kDirectories : MessageType::kDirectoriesReply);
    Status s = request ? DecodeReqBytes(RawFrame(type, 5, body)).status()
                       : DecodeRepBytes(RawFrame(type, 5, body)).status();
    if (s.ok()) {
      ++decoded;
      continue;
    }
    ASSERT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange)
        << s.ToString();
    ASSERT_THAT(s.message(), HasSubstr(std::string(MessageTypeName(type))));
  }
  EXPECT_GT(decoded, 0u) << "some random bodies are valid: the test reaches the checks";
}

// --- EncodeError ---------------------------------------------------------------------

TEST(SidecarProtocolTest, EncodeErrorCutsLongMessagesAndNeverSendsOk) {
  auto long_error = DecodeRepBytes(
      sidecar_protocol::EncodeError(5, Status::Internal(std::string(5000, 'x')), false));
  ASSERT_OK(long_error);
  const Error& e = std::get<Error>(*long_error);
  EXPECT_EQ(e.status.code(), StatusCode::kInternal);
  EXPECT_EQ(e.status.message(), std::string(kMaxMessageLength, 'x'));
  EXPECT_FALSE(e.closing);

  auto from_ok = DecodeRepBytes(sidecar_protocol::EncodeError(6, Status::Ok(), true));
  ASSERT_OK(from_ok);
  EXPECT_EQ(std::get<Error>(*from_ok).status.code(), StatusCode::kInternal);
  EXPECT_THAT(std::get<Error>(*from_ok).status.message(), HasSubstr("request 6"));

  auto f =
      DecodeFrame(sidecar_protocol::EncodeError(7, Status::NotFound("x"), false, /*version=*/99));
  ASSERT_OK(f);
  EXPECT_EQ(f->header.version, kHandshakeVersion);
}

TEST(SidecarProtocolTest, ItemMessagesAreCutToFitTheBody) {
  Limits limits;  // 4 MiB, 4096 items
  Samples s;
  for (uint32_t i = 0; i < limits.max_items; ++i) {
    s.items.push_back({i, Status::Unavailable(std::string(3000, 'u')), 0, 0, 0, 0, false});
  }
  auto bytes = EncodeReply(1, s, limits);
  ASSERT_OK(bytes);
  EXPECT_LE(bytes->size(), kFrameHeaderSize + limits.max_body_bytes);
  auto back = DecodeRepBytes(*bytes, limits);
  ASSERT_OK(back);
  const Samples& got = std::get<Samples>(*back);
  ASSERT_EQ(got.items.size(), s.items.size());
  size_t cut = got.items[0].status.message().size();
  EXPECT_GT(cut, 900u);  // (4 MiB - 4096 * 41) / 4096 = 983
  EXPECT_LT(cut, kMaxMessageLength);
  EXPECT_EQ(got.items[4095].status, Status::Unavailable(std::string(cut, 'u')));

  // A LOOKUP_REPLY too; with short messages nothing is cut.
  LookupReply l;
  for (uint32_t i = 0; i < limits.max_items; ++i) {
    l.items.push_back({Status::NotFound(std::string(i % 2 == 0 ? 2000 : 10, 'n')), 0});
  }
  auto lbytes = EncodeReply(1, l, limits);
  ASSERT_OK(lbytes);
  auto lback = DecodeRepBytes(*lbytes, limits);
  ASSERT_OK(lback);
  EXPECT_EQ(std::get<LookupReply>(*lback).items[1].status.message(), std::string(10, 'n'));
  EXPECT_EQ(std::get<LookupReply>(*lback).items[0].status.message().size(), kMaxMessageLength);
}

TEST(SidecarProtocolTest, OversizedBodiesAreRefusedByTheEncoder) {
  Lookup l;
  l.paths.assign(1100, std::string(kMaxPathLength, 'p'));  // 4.5 MB of paths
  auto r = EncodeRequest(1, l);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("LOOKUP"), HasSubstr("max_body_bytes")));
  StatReply s;
  s.entries.assign(2000, StatEntry{std::string(kMaxPathLength, 'p'), 1, 1});
  auto r2 = EncodeReply(1, s);
  EXPECT_EQ(r2.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(r2.status().message(), HasSubstr("STAT_REPLY"));
}

// --- bad messages: the encoder refuses, the decoder rejects ----------------------------

struct BadRequest {
  std::string name;
  Request message;
  StatusCode code;
  std::string field;
};

std::vector<BadRequest> BadRequests() {
  SetPlan good;
  good.plan_id = "plan";
  good.world_size = 2;
  auto plan = [&](auto edit) {
    SetPlan p = good;
    edit(p);
    return p;
  };
  Get too_many;
  too_many.ids.assign(kDefaultMaxItems + 1, 1);
  Get too_many_releases{std::vector<uint64_t>(kDefaultMaxItems + 1, 1), {1}, 0};
  Lookup too_many_paths;
  too_many_paths.paths.assign(kDefaultMaxItems + 1, "p");
  return {
      {"empty name", Hello{1, 1, ""}, StatusCode::kInvalidArgument, "client_name"},
      {"long name", Hello{1, 1, std::string(256, 'a')}, StatusCode::kInvalidArgument,
       "client_name"},
      {"space in name", Hello{1, 1, "a b"}, StatusCode::kInvalidArgument, "client_name"},
      {"control in name", Hello{1, 1, "a\x01"}, StatusCode::kInvalidArgument, "client_name"},
      {"version 0", Hello{0, 1, "c"}, StatusCode::kInvalidArgument, "min_version"},
      {"empty range", Hello{3, 2, "c"}, StatusCode::kInvalidArgument, "max_version"},
      {"dataset", Open{"Bad_Name"}, StatusCode::kInvalidArgument, "dataset"},
      {"empty dataset", Open{""}, StatusCode::kInvalidArgument, "dataset"},
      {"plan id", plan([](SetPlan& p) { p.plan_id = "-x"; }), StatusCode::kInvalidArgument,
       "plan_id"},
      {"plan id slash", plan([](SetPlan& p) { p.plan_id = "a/b"; }), StatusCode::kInvalidArgument,
       "plan_id"},
      {"empty plan id", plan([](SetPlan& p) { p.plan_id = ""; }), StatusCode::kInvalidArgument,
       "plan_id"},
      {"long plan id", plan([](SetPlan& p) { p.plan_id = std::string(129, 'a'); }),
       StatusCode::kInvalidArgument, "plan_id"},
      {"mode", plan([](SetPlan& p) { p.mode = 3; }), StatusCode::kInvalidArgument, "mode"},
      {"world size", plan([](SetPlan& p) { p.world_size = 0; }), StatusCode::kInvalidArgument,
       "world_size"},
      {"rank", plan([](SetPlan& p) { p.rank = 2; }), StatusCode::kInvalidArgument, "rank"},
      {"batch", plan([](SetPlan& p) { p.batch_size = 0; }), StatusCode::kInvalidArgument,
       "batch_size"},
      {"window", plan([](SetPlan& p) { p.window_chunks = 0; }), StatusCode::kInvalidArgument,
       "window_chunks"},
      {"epoch", plan([](SetPlan& p) { p.epoch = kMaxPlanEpoch + 1; }), StatusCode::kOutOfRange,
       "epoch"},
      {"no ids", Get{{}, {}, 0}, StatusCode::kInvalidArgument, "ids"},
      {"too many ids", too_many, StatusCode::kOutOfRange, "ids"},
      {"too many releases", too_many_releases, StatusCode::kOutOfRange, "release"},
      {"token 0", Get{{5, 0}, {1}, 0}, StatusCode::kInvalidArgument, "release[1]"},
      {"lookahead", Get{{}, {1, 2}, kDefaultMaxItems - 1}, StatusCode::kOutOfRange, "lookahead"},
      {"lookahead u32", Get{{}, {1}, kU32Max}, StatusCode::kOutOfRange, "lookahead"},
      {"max samples 0", Next{{}, 0}, StatusCode::kInvalidArgument, "max_samples"},
      {"max samples", Next{{}, kDefaultMaxItems + 1}, StatusCode::kOutOfRange, "max_samples"},
      {"next token 0", Next{{0}, 1}, StatusCode::kInvalidArgument, "release[0]"},
      {"release token 0", Release{{1, 2, 0}}, StatusCode::kInvalidArgument, "tokens[2]"},
      {"stat count 0", Stat{0, 0}, StatusCode::kInvalidArgument, "count"},
      {"stat count", Stat{0, kDefaultMaxItems + 1}, StatusCode::kOutOfRange, "count"},
      {"stat overflow", Stat{kU32Max, 2}, StatusCode::kOutOfRange, "first_id"},
      {"no paths", Lookup{}, StatusCode::kInvalidArgument, "paths"},
      {"empty path", Lookup{{"a", ""}}, StatusCode::kInvalidArgument, "paths[1]"},
      {"long path", Lookup{{std::string(kMaxPathLength + 1, 'p')}}, StatusCode::kInvalidArgument,
       "paths[0]"},
      {"too many paths", too_many_paths, StatusCode::kOutOfRange, "paths"},
      {"directories count 0", Directories{0, 0}, StatusCode::kInvalidArgument, "count"},
      {"directories count over", Directories{0, kDefaultMaxItems + 1}, StatusCode::kOutOfRange,
       "count"},
      {"directories overflow", Directories{kU32Max, 2}, StatusCode::kOutOfRange, "first/count"},
      {"chunk files no ids", ChunkFiles{}, StatusCode::kInvalidArgument, "ids"},
      {"chunk files too many", ChunkFiles{std::vector<uint32_t>(kDefaultMaxItems + 1, 1)},
       StatusCode::kOutOfRange, "ids"},
  };
}

// The encoder refuses each; the same body built by hand (encoding with the
// checks bypassed is not possible, so the test writes it) is rejected by the
// decoder with the same code, naming the type and the field.
std::string BodyBypassingChecks(const Request& m) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        Body b;
        if constexpr (std::is_same_v<V, Hello>) {
          b.U16(v.min_version).U16(v.max_version).Str(v.client_name);
        } else if constexpr (std::is_same_v<V, Open>) {
          b.Str(v.dataset);
        } else if constexpr (std::is_same_v<V, SetPlan>) {
          b.U64(v.seed).U64(v.epoch).U64(v.start_position).U32(v.world_size).U32(v.rank);
          b.U32(v.batch_size).U32(v.window_chunks).U8(v.mode).U8(v.drop_last ? 1 : 0);
          b.Str(v.plan_id);
        } else if constexpr (std::is_same_v<V, Get>) {
          b.U32(v.lookahead).U32(static_cast<uint32_t>(v.release.size()));
          for (uint64_t t : v.release) b.U64(t);
          b.U32(static_cast<uint32_t>(v.ids.size()));
          for (uint32_t id : v.ids) b.U32(id);
        } else if constexpr (std::is_same_v<V, Next>) {
          b.U32(v.max_samples).U32(static_cast<uint32_t>(v.release.size()));
          for (uint64_t t : v.release) b.U64(t);
        } else if constexpr (std::is_same_v<V, Release>) {
          b.U32(static_cast<uint32_t>(v.tokens.size()));
          for (uint64_t t : v.tokens) b.U64(t);
        } else if constexpr (std::is_same_v<V, Stat>) {
          b.U32(v.first_id).U32(v.count);
        } else if constexpr (std::is_same_v<V, Directories>) {
          b.U32(v.first).U32(v.count);
        } else if constexpr (std::is_same_v<V, ChunkFiles>) {
          b.U32(static_cast<uint32_t>(v.ids.size()));
          for (uint32_t id : v.ids) b.U32(id);
        } else if constexpr (std::is_same_v<V, Lookup>) {
          b.U32(static_cast<uint32_t>(v.paths.size()));
          for (const std::string& p : v.paths) b.Str(p);
        }
        return b;
      },
      m);
}

uint16_t RequestType(const Request& m) {
  static constexpr MessageType kTypes[] = {
      MessageType::kHello, MessageType::kOpen,        MessageType::kSetPlan,   MessageType::kGet,
      MessageType::kNext,  MessageType::kRelease,     MessageType::kStat,      MessageType::kLookup,
      MessageType::kPing,  MessageType::kDirectories, MessageType::kChunkFiles};
  static_assert(std::size(kTypes) == std::variant_size_v<Request>);
  return T(kTypes[m.index()]);
}

TEST(SidecarProtocolTest, BadRequestsAreRefusedAndRejected) {
  for (const BadRequest& c : BadRequests()) {
    SCOPED_TRACE(c.name);
    const std::string type(MessageTypeName(RequestType(c.message)));
    auto encoded = EncodeRequest(9, c.message);
    ASSERT_FALSE(encoded.ok());
    EXPECT_EQ(encoded.status().code(), c.code) << encoded.status().ToString();
    EXPECT_THAT(encoded.status().message(), AllOf(HasSubstr(type), HasSubstr(c.field)));

    std::string body = BodyBypassingChecks(c.message);
    if (body.size() > kDefaultMaxBodyBytes) continue;
    auto decoded = DecodeReqBytes(RawFrame(RequestType(c.message), 9, body));
    ASSERT_FALSE(decoded.ok());
    // Strings over their wire maximum are kOutOfRange on decode.
    if (c.name != "long name" && c.name != "long plan id" && c.name != "long path") {
      EXPECT_EQ(decoded.status().code(), c.code) << decoded.status().ToString();
    }
    EXPECT_THAT(decoded.status().message(),
                AllOf(HasSubstr("decode " + type), HasSubstr("request id 9")));
    std::string field = c.field.substr(0, c.field.find('['));
    EXPECT_THAT(decoded.status().message(), HasSubstr(field));
  }
}

struct BadReply {
  std::string name;
  uint16_t type;
  std::string body;
  StatusCode code;
  std::string field;
};

Body OkSampleItem(uint32_t id) {
  Body b;
  b.U32(id).U8(0).U64(1).U64(0).U64(1).U64(0).U16(0).Str("");
  return b;
}

std::vector<BadReply> BadReplies() {
  const uint16_t kNotFound = ToWireStatus(StatusCode::kNotFound);
  auto samples = [](const Body& items, uint32_t n = 1) {
    return Body().U32(n).U8(0).Raw(items.str()).str();
  };
  return {
      {"hello reply version", T(MessageType::kHelloReply),
       Body().U16(kMaxVersion + 1).U32(kDefaultMaxBodyBytes).U32(4).Str("s"),
       StatusCode::kVersionMismatch, "version"},
      {"hello reply limits", T(MessageType::kHelloReply), Body().U16(1).U32(100).U32(4).Str("s"),
       StatusCode::kInvalidArgument, "max_body_bytes"},
      {"hello reply items", T(MessageType::kHelloReply),
       Body().U16(1).U32(kDefaultMaxBodyBytes).U32(0).Str("s"), StatusCode::kInvalidArgument,
       "max_items"},
      {"hello reply name", T(MessageType::kHelloReply),
       Body().U16(1).U32(kDefaultMaxBodyBytes).U32(4).Str(""), StatusCode::kInvalidArgument,
       "sidecar_name"},
      {"open reply zero manifest", T(MessageType::kOpenReply),
       Body().Raw(std::string(16, '\0')).U64(1).U64(1).U64(1).U64(1), StatusCode::kInvalidArgument,
       "manifest_id"},
      {"open reply arena", T(MessageType::kOpenReply),
       Body().Raw(ManifestBytes()).U64(1).U64(1).U64(1).U64(0), StatusCode::kInvalidArgument,
       "arena_bytes"},
      {"ok with body", T(MessageType::kOk), Body().U8(0), StatusCode::kInvalidArgument, "trailing"},
      {"pong with body", T(MessageType::kPong), Body().U32(0), StatusCode::kInvalidArgument,
       "trailing"},
      {"end of epoch 2", T(MessageType::kSamples), Body().U32(0).U8(2),
       StatusCode::kInvalidArgument, "end_of_epoch"},
      {"sample token 0", T(MessageType::kSamples),
       samples(Body().U32(1).U8(0).U64(0).U64(0).U64(1).U64(0).U16(0).Str("")),
       StatusCode::kInvalidArgument, "items[0]"},
      {"sample overflow", T(MessageType::kSamples),
       samples(Body().U32(1).U8(0).U64(1).U64(kU64Max).U64(1).U64(0).U16(0).Str("")),
       StatusCode::kOutOfRange, "items[0]"},
      {"failed sample with range", T(MessageType::kSamples),
       samples(Body().U32(1).U8(0).U64(0).U64(0).U64(1).U64(0).U16(kNotFound).Str("x")),
       StatusCode::kInvalidArgument, "items[0]"},
      {"failed sample with token", T(MessageType::kSamples),
       samples(Body().U32(1).U8(0).U64(3).U64(0).U64(0).U64(0).U16(kNotFound).Str("x")),
       StatusCode::kInvalidArgument, "items[0]"},
      {"failed hint", T(MessageType::kSamples),
       samples(Body().U32(1).U8(1).U64(0).U64(0).U64(0).U64(0).U16(kNotFound).Str("x")),
       StatusCode::kInvalidArgument, "hint"},
      {"sample flags", T(MessageType::kSamples),
       samples(Body().U32(1).U8(2).U64(1).U64(0).U64(0).U64(0).U16(0).Str("")),
       StatusCode::kInvalidArgument, "items.flags"},
      {"OK with message", T(MessageType::kSamples),
       samples(Body().U32(1).U8(0).U64(1).U64(0).U64(0).U64(0).U16(0).Str("hm")),
       StatusCode::kInvalidArgument, "items.status"},
      {"long item message", T(MessageType::kSamples),
       samples(Body().U32(1).U8(0).U64(0).U64(0).U64(0).U64(0).U16(kNotFound).Str(
           std::string(kMaxMessageLength + 1, 'm'))),
       StatusCode::kOutOfRange, "items.status"},
      {"samples count vs body", T(MessageType::kSamples), samples(OkSampleItem(1), 2),
       StatusCode::kInvalidArgument, "items"},
      {"stat reply empty path", T(MessageType::kStatReply),
       Body().U32(0).U32(2).U64(1).I64(1).Str("").U64(1).I64(1).Str("ab"),
       StatusCode::kInvalidArgument, "entries[0]"},
      {"stat reply long path", T(MessageType::kStatReply),
       Body().U32(0).U32(1).U64(1).I64(1).Str(std::string(kMaxPathLength + 1, 'p')),
       StatusCode::kOutOfRange, "entries.path"},
      {"stat reply overflow", T(MessageType::kStatReply),
       Body().U32(kU32Max).U32(2).U64(1).I64(1).Str("a").U64(1).I64(1).Str("b"),
       StatusCode::kOutOfRange, "first_id"},
      {"lookup failed with id", T(MessageType::kLookupReply),
       Body().U32(1).U32(5).U16(kNotFound).Str("no"), StatusCode::kInvalidArgument, "items[0]"},
      {"error OK", T(MessageType::kError), Body().U16(0).U16(0).Str(""),
       StatusCode::kInvalidArgument, "status"},
      {"error flags", T(MessageType::kError), Body().U16(kNotFound).U16(2).Str("x"),
       StatusCode::kInvalidArgument, "flags"},
      {"error long message", T(MessageType::kError),
       Body().U16(kNotFound).U16(0).Str(std::string(kMaxMessageLength + 1, 'e')),
       StatusCode::kOutOfRange, "message"},
      {"error truncated", T(MessageType::kError), Body().U16(kNotFound).U16(0).U16(5).Raw("ab"),
       StatusCode::kInvalidArgument, "message"},
      {"directories past total", T(MessageType::kDirectoriesReply),
       Body().U32(1).U32(1).U32(1).U16(0).Str("a"), StatusCode::kOutOfRange, "first/total/entries"},
      {"directories first past total", T(MessageType::kDirectoriesReply),
       Body().U32(5).U32(4).U32(0), StatusCode::kOutOfRange, "first/total/entries"},
      {"directories empty path", T(MessageType::kDirectoriesReply),
       Body().U32(0).U32(2).U32(2).U16(0).Str("").U16(0).Str("abc"), StatusCode::kInvalidArgument,
       "entries[0]"},
      {"directories long path", T(MessageType::kDirectoriesReply),
       Body().U32(0).U32(1).U32(1).U16(0).Str(std::string(kMaxPathLength + 1, 'p')),
       StatusCode::kOutOfRange, "entries.path"},
      {"directories mode", T(MessageType::kDirectoriesReply),
       Body().U32(0).U32(1).U32(1).U16(010000).Str("a"), StatusCode::kInvalidArgument,
       "entries[0]"},
      {"directories count vs body", T(MessageType::kDirectoriesReply),
       Body().U32(0).U32(9).U32(3).U16(0).Str("a"), StatusCode::kInvalidArgument, "entries"},
      {"directories truncated path", T(MessageType::kDirectoriesReply),
       Body().U32(0).U32(9).U32(1).U16(0).U16(7).Raw("ab"), StatusCode::kInvalidArgument,
       "entries.path"},
  };
}

TEST(SidecarProtocolTest, BadRepliesAreRejected) {
  for (const BadReply& c : BadReplies()) {
    SCOPED_TRACE(c.name);
    auto decoded = DecodeRepBytes(RawFrame(c.type, 4, c.body));
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), c.code) << decoded.status().ToString();
    EXPECT_THAT(
        decoded.status().message(),
        AllOf(HasSubstr("decode " + std::string(MessageTypeName(c.type))), HasSubstr(c.field)));
  }
}

TEST(SidecarProtocolTest, BadRepliesAreRefusedByTheEncoder) {
  struct Case {
    std::string name;
    Reply reply;
    StatusCode code;
    std::string field;
  };
  Samples too_many;
  too_many.items.assign(kDefaultMaxItems + 1, SampleItem{1, Status::Ok(), 1, 0, 0, 0, false});
  std::vector<Case> cases = {
      {"version", HelloReply{kMaxVersion + 1, "s", {}}, StatusCode::kVersionMismatch, "version"},
      {"limits", HelloReply{1, "s", Limits{1, 1}}, StatusCode::kInvalidArgument, "max_body_bytes"},
      {"name", HelloReply{1, "s s", {}}, StatusCode::kInvalidArgument, "sidecar_name"},
      {"manifest", OpenReply{ContentId{}, 1, 1, 1, 1}, StatusCode::kInvalidArgument, "manifest_id"},
      {"arena", OpenReply{kManifest, 1, 1, 1, 0}, StatusCode::kInvalidArgument, "arena_bytes"},
      {"too many", too_many, StatusCode::kOutOfRange, "items"},
      {"token 0", Samples{{{1, Status::Ok(), 0, 0, 0, 0, false}}, false},
       StatusCode::kInvalidArgument, "items[0]"},
      {"failed range", Samples{{{1, Status::NotFound("x"), 0, 8, 0, 0, false}}, false},
       StatusCode::kInvalidArgument, "items[0]"},
      {"failed hint", Samples{{{1, Status::NotFound("x"), 0, 0, 0, 0, true}}, false},
       StatusCode::kInvalidArgument, "items[0]"},
      {"overflow", Samples{{{1, Status::Ok(), 1, kU64Max, 1, 0, false}}, false},
       StatusCode::kOutOfRange, "items[0]"},
      {"stat path", StatReply{0, {{"", 1, 1}}}, StatusCode::kInvalidArgument, "entries[0]"},
      {"stat overflow", StatReply{kU32Max, {{"a", 1, 1}, {"b", 1, 1}}}, StatusCode::kOutOfRange,
       "first_id"},
      {"lookup id", LookupReply{{{Status::NotFound("x"), 3}}}, StatusCode::kInvalidArgument,
       "items[0]"},
      {"error ok", Error{Status::Ok(), false}, StatusCode::kInvalidArgument, "status"},
      {"directories past total", DirectoriesReply{2, 2, {{"a", 0}}}, StatusCode::kOutOfRange,
       "first/total/entries"},
      {"directories path", DirectoriesReply{0, 1, {{"", 0}}}, StatusCode::kInvalidArgument,
       "entries[0]"},
      {"directories mode", DirectoriesReply{0, 1, {{"a", 010000}}}, StatusCode::kInvalidArgument,
       "entries[0]"},
      {"chunk failed with samples",
       ChunkFilesReply{{{1, Status::NotFound("x"), {{1, 0, 1, 0}}, {}}}},
       StatusCode::kInvalidArgument, "chunks[0]"},
      {"chunk sample overflow", ChunkFilesReply{{{1, Status::Ok(), {{1, kU64Max, 1, 0}}, {}}}},
       StatusCode::kOutOfRange, "samples[0]"},
      {"too many chunk files",
       ChunkFilesReply{std::vector<ChunkFile>(kMaxChunkFilesPerReply + 1, ChunkFile{})},
       StatusCode::kOutOfRange, "chunks"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = EncodeReply(3, c.reply);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_THAT(r.status().message(), AllOf(HasSubstr("encode"), HasSubstr(c.field)));
  }
  auto zero_id = EncodeReply(0, Ok{});
  EXPECT_EQ(zero_id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero_id.status().message(), HasSubstr("request id 0"));
}

TEST(SidecarProtocolTest, RequestIdAndTypeRules) {
  auto zero = EncodeRequest(0, Ping{});
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), AllOf(HasSubstr("PING"), HasSubstr("request id 0")));

  auto zero_in = DecodeReqBytes(RawFrame(T(MessageType::kPing), 0, ""));
  EXPECT_EQ(zero_in.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero_in.status().message(), AllOf(HasSubstr("PING"), HasSubstr("request_id")));

  auto unknown = DecodeReqBytes(RawFrame(42, 1, ""));
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown request type 42"));
  auto unknown_reply = DecodeRepBytes(RawFrame(4242, 1, ""));
  EXPECT_EQ(unknown_reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown_reply.status().message(), HasSubstr("unknown reply type 4242"));

  auto reply_as_request = DecodeReqBytes(Rep(1, Pong{}));
  EXPECT_EQ(reply_as_request.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(reply_as_request.status().message(), AllOf(HasSubstr("PONG"), HasSubstr("reply")));
  auto request_as_reply = DecodeRepBytes(Req(1, Ping{}));
  EXPECT_EQ(request_as_reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(request_as_reply.status().message(), AllOf(HasSubstr("PING"), HasSubstr("request")));

  auto pong_zero = DecodeRepBytes(RawFrame(T(MessageType::kPong), 0, ""));
  EXPECT_EQ(pong_zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(pong_zero.status().message(), HasSubstr("request_id"));

  // A Frame not from a FrameDecoder: its body disagrees with its header.
  Frame lying;
  lying.header = FrameHeader{1, T(MessageType::kPing), 3, 1};
  EXPECT_THAT(DecodeRequest(lying).status().message(), HasSubstr("announces 3 body bytes"));
  Frame old;
  old.header = FrameHeader{kMaxVersion + 1, T(MessageType::kPing), 0, 1};
  EXPECT_EQ(DecodeRequest(old).status().code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(DecodeReply(old).status().code(), StatusCode::kVersionMismatch);
}

TEST(SidecarProtocolTest, UnknownStatusCodesBecomeInternalNamingTheNumber) {
  auto e =
      DecodeRepBytes(RawFrame(T(MessageType::kError), 2, Body().U16(77).U16(1).Str("hm").str()));
  ASSERT_OK(e);
  EXPECT_EQ(std::get<Error>(*e).status.code(), StatusCode::kInternal);
  EXPECT_THAT(std::get<Error>(*e).status.message(), AllOf(HasSubstr("77"), HasSubstr("hm")));

  auto s = DecodeRepBytes(RawFrame(
      T(MessageType::kSamples), 2,
      Body().U32(1).U8(0).U32(5).U8(0).U64(0).U64(0).U64(0).U64(0).U16(500).Str("").str()));
  ASSERT_OK(s);
  EXPECT_EQ(std::get<Samples>(*s).items[0].status.code(), StatusCode::kInternal);
  EXPECT_THAT(std::get<Samples>(*s).items[0].status.message(), HasSubstr("500"));
}

TEST(SidecarProtocolTest, DropLastMustBeABoolean) {
  std::string body = Req(1, SetPlan{"p", 0, 0, 1, 0, 1, false, 0, 1, 0}).substr(kFrameHeaderSize);
  body[41] = 2;  // drop_last
  auto r = DecodeReqBytes(RawFrame(T(MessageType::kSetPlan), 1, body));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("SET_PLAN"), HasSubstr("drop_last")));
}

// Every proper prefix of every valid body, with the header announcing just that
// prefix: the decoder rejects it, naming the type. (The stream-level cut, a
// header announcing more than arrives, is FrameDecoder's: below.)
TEST(SidecarProtocolTest, EveryTruncatedBodyIsRejected) {
  size_t checked = 0;
  for (const Request& m : EveryRequest()) {
    std::string frame = Req(3, m);
    std::string body = frame.substr(kFrameHeaderSize);
    if (body.size() > 20000) body.resize(20000);  // the big ones: their heads suffice
    uint16_t type = LoadLe<uint16_t>(frame.data() + 6);
    for (size_t cut = 0; cut < body.size(); ++cut) {
      auto r = DecodeReqBytes(RawFrame(type, 3, std::string_view(body).substr(0, cut)));
      ASSERT_FALSE(r.ok()) << MessageTypeName(type) << " cut at " << cut;
      ASSERT_THAT(r.status().message(), HasSubstr(std::string(MessageTypeName(type))));
      ++checked;
    }
  }
  for (const Reply& m : EveryReply()) {
    std::string frame = Rep(3, m);
    std::string body = frame.substr(kFrameHeaderSize);
    uint16_t type = LoadLe<uint16_t>(frame.data() + 6);
    for (size_t cut = 0; cut < body.size(); ++cut) {
      auto r = DecodeRepBytes(RawFrame(type, 3, std::string_view(body).substr(0, cut)));
      ASSERT_FALSE(r.ok()) << MessageTypeName(type) << " cut at " << cut;
      ASSERT_THAT(r.status().message(), HasSubstr(std::string(MessageTypeName(type))));
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000u);
}

TEST(SidecarProtocolTest, EveryTruncatedStreamIsACutFrame) {
  for (const Request& m : EveryRequest()) {
    std::string frame = Req(3, m);
    if (frame.size() > 5000) frame.resize(5000);
    for (size_t cut = 1; cut < frame.size(); ++cut) {
      FrameDecoder d;
      auto used = d.Feed(std::string_view(frame).substr(0, cut));
      ASSERT_OK(used);
      EXPECT_EQ(*used, cut);
      ASSERT_FALSE(d.has_frame());
      Status s = d.Finish();
      ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
      ASSERT_THAT(s.message(), HasSubstr("closed mid-frame"));
      if (cut < kFrameHeaderSize) {
        ASSERT_THAT(s.message(), HasSubstr(std::to_string(cut) + " of 24 header bytes"));
      } else {
        ASSERT_THAT(s.message(), HasSubstr("body bytes of a"));
      }
      ASSERT_FALSE(DecodeFrame(std::string_view(frame).substr(0, cut)).ok());
    }
  }
}

TEST(SidecarProtocolTest, TrailingBytesAreRejected) {
  for (const Request& m : EveryRequest()) {
    std::string frame = Req(3, m);
    uint16_t type = LoadLe<uint16_t>(frame.data() + 6);
    auto r = DecodeReqBytes(RawFrame(type, 3, frame.substr(kFrameHeaderSize) + "x"));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("trailing"));
  }
  for (const Reply& m : EveryReply()) {
    std::string frame = Rep(3, m);
    uint16_t type = LoadLe<uint16_t>(frame.data() + 6);
    auto r =
        DecodeRepBytes(RawFrame(type, 3, frame.substr(kFrameHeaderSize) + std::string(4, '\0')));
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("trailing"));
  }
  auto two = DecodeFrame(Req(1, Ping{}) + Req(2, Ping{}));
  EXPECT_THAT(two.status().message(), HasSubstr("24 trailing bytes"));
}

// A count over the limit, or over what the body could hold, fails before the
// decoder reserves memory for it.
TEST(SidecarProtocolTest, OverLimitCountsFailBeforeAllocating) {
  // The tracker sees allocations made inside the library (a self-check).
  std::string valid = Req(1, Get{{}, std::vector<uint32_t>(kDefaultMaxItems, 1), 0});
  auto valid_frame = DecodeFrame(valid);
  ASSERT_OK(valid_frame);
  g_largest_allocation = 0;
  g_track_allocations = true;
  ASSERT_OK(DecodeRequest(*valid_frame));
  g_track_allocations = false;
  ASSERT_GE(g_largest_allocation.load(), kDefaultMaxItems * sizeof(uint32_t));

  const Limits wide{kMaxBodyBytesCap, kMaxItemsCap};
  struct Case {
    std::string name;
    bool request;
    uint16_t type;
    std::string body;
    StatusCode code;
    std::string field;
  };
  std::vector<Case> cases = {
      {"ids", true, T(MessageType::kGet), Body().U32(0).U32(0).U32(kMaxItemsCap),
       StatusCode::kInvalidArgument, "ids"},
      {"ids u32", true, T(MessageType::kGet), Body().U32(0).U32(0).U32(kU32Max),
       StatusCode::kOutOfRange, "ids"},
      {"release", true, T(MessageType::kGet), Body().U32(0).U32(kMaxItemsCap),
       StatusCode::kInvalidArgument, "release"},
      {"next release", true, T(MessageType::kNext), Body().U32(1).U32(kMaxItemsCap),
       StatusCode::kInvalidArgument, "release"},
      {"tokens", true, T(MessageType::kRelease), Body().U32(kMaxItemsCap),
       StatusCode::kInvalidArgument, "tokens"},
      {"paths", true, T(MessageType::kLookup), Body().U32(kMaxItemsCap),
       StatusCode::kInvalidArgument, "paths"},
      {"samples", false, T(MessageType::kSamples), Body().U32(kMaxItemsCap).U8(0),
       StatusCode::kInvalidArgument, "items"},
      {"stat entries", false, T(MessageType::kStatReply), Body().U32(0).U32(kMaxItemsCap),
       StatusCode::kInvalidArgument, "entries"},
      {"lookup items", false, T(MessageType::kLookupReply), Body().U32(kMaxItemsCap + 1),
       StatusCode::kOutOfRange, "items"},
      {"directory entries", false, T(MessageType::kDirectoriesReply),
       Body().U32(0).U32(kU32Max).U32(kMaxItemsCap), StatusCode::kInvalidArgument, "entries"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string bytes = RawFrame(c.type, 1, c.body);
    auto frame = DecodeFrame(bytes, wide);
    ASSERT_OK(frame);
    g_largest_allocation = 0;
    g_track_allocations = true;
    Status s =
        c.request ? DecodeRequest(*frame, wide).status() : DecodeReply(*frame, wide).status();
    g_track_allocations = false;
    EXPECT_EQ(s.code(), c.code) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.field));
    EXPECT_LT(g_largest_allocation.load(), 4096u) << "a count was trusted before it was checked";
  }
  // The default limits: 4097 ids is over max_items whatever the body holds.
  Body over;
  over.U32(0).U32(0).U32(kDefaultMaxItems + 1);
  for (uint32_t i = 0; i <= kDefaultMaxItems; ++i) over.U32(i);
  auto r = DecodeReqBytes(RawFrame(T(MessageType::kGet), 1, over.str()));
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("GET"), HasSubstr("ids"), HasSubstr("4097")));
  // Tighter limits are honoured by both sides.
  Limits tight{4096, 2};
  EXPECT_EQ(EncodeRequest(1, Get{{}, {1, 2, 3}, 0}, tight).status().code(),
            StatusCode::kOutOfRange);
  auto three = DecodeReqBytes(Req(1, Get{{}, {1, 2, 3}, 0}), tight);
  EXPECT_EQ(three.status().code(), StatusCode::kOutOfRange);
}

// --- FrameDecoder ----------------------------------------------------------------------

std::string StreamOfEverything(std::vector<Frame>* frames) {
  std::string stream;
  uint64_t id = 1;
  for (const Request& m : EveryRequest()) {
    std::string f = Req(id++, m);
    frames->push_back(*DecodeFrame(f));
    stream += f;
  }
  for (const Reply& m : EveryReply()) {
    std::string f = Rep(id++, m);
    frames->push_back(*DecodeFrame(f));
    stream += f;
  }
  return stream;
}

std::vector<Frame> FeedInPieces(std::string_view stream, const std::vector<size_t>& pieces,
                                size_t* max_buffered) {
  FrameDecoder d;
  std::vector<Frame> out;
  size_t p = 0;
  // Each round consumes a byte or takes a frame: bounded by twice the bytes.
  const size_t max_rounds = 2 * stream.size() + 2;
  for (size_t rounds = 0; !stream.empty() && rounds < max_rounds; ++rounds) {
    size_t n = std::min(stream.size(), pieces[p++ % pieces.size()]);
    auto used = d.Feed(stream.substr(0, n));
    EXPECT_OK(used);
    if (!used.ok()) break;
    *max_buffered = std::max(*max_buffered, d.buffered_bytes());
    stream.remove_prefix(*used);
    if (d.has_frame()) {
      auto again = d.Feed(stream);  // a frame waits: nothing more is consumed
      EXPECT_TRUE(again.ok() && *again == 0);
      out.push_back(d.TakeFrame());
    } else {
      EXPECT_EQ(*used, n);
    }
  }
  EXPECT_TRUE(stream.empty());
  EXPECT_OK(d.Finish());
  return out;
}

TEST(SidecarProtocolTest, FrameDecoderByteByByteAndInRandomSplits) {
  std::vector<Frame> expected;
  std::string stream = StreamOfEverything(&expected);
  size_t max_buffered = 0;
  EXPECT_EQ(FeedInPieces(stream, {stream.size()}, &max_buffered), expected);
  EXPECT_EQ(FeedInPieces(stream, {1}, &max_buffered), expected);
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    std::vector<size_t> pieces;
    for (int i = 0; i < 50; ++i) pieces.push_back(1 + rng() % (round < 10 ? 40 : 70000));
    SCOPED_TRACE(round);
    EXPECT_EQ(FeedInPieces(stream, pieces, &max_buffered), expected);
  }
  EXPECT_LE(max_buffered, kFrameHeaderSize + kDefaultMaxBodyBytes);
}

TEST(SidecarProtocolTest, FrameDecoderGrowsOnlyAsBytesArrive) {
  FrameDecoder d;
  std::string header = RawFrame(T(MessageType::kLookup), 1, "");
  StoreLe(header.data() + 12, kDefaultMaxBodyBytes);  // announces 4 MiB
  ASSERT_OK(d.Feed(header));
  ASSERT_OK(d.Feed(std::string(100, 'x')));
  EXPECT_LT(d.buffered_bytes(), 1024u);
  Status s = d.Finish();
  EXPECT_THAT(s.message(), HasSubstr("got 100 of 4194304 body bytes of a LOOKUP frame"));
}

TEST(SidecarProtocolTest, FrameDecoderFramingErrorsAreSticky) {
  struct Case {
    std::string name;
    std::string bytes;
    StatusCode code;
    std::string what;
  };
  std::string ping = Req(1, Ping{});
  std::string big = RawFrame(T(MessageType::kGet), 1, "");
  StoreLe(big.data() + 12, kDefaultMaxBodyBytes + 1);
  std::vector<Case> cases = {
      {"magic", RawFrame(9, 1, "", 1, 0, "GRNW"), StatusCode::kInvalidArgument, "magic"},
      {"version 0", RawFrame(9, 1, "", 0), StatusCode::kVersionMismatch, "version: 0"},
      {"version 4", RawFrame(9, 1, "", 4), StatusCode::kVersionMismatch, "version: 4"},
      {"flags", RawFrame(9, 1, "", 1, 0x80), StatusCode::kInvalidArgument, "flags: 128"},
      {"body", big, StatusCode::kOutOfRange, "body_length: 4194305"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FrameDecoder d;
    ASSERT_OK(d.Feed(ping));
    ASSERT_TRUE(d.has_frame());
    d.TakeFrame();
    auto r = d.Feed(c.bytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code);
    EXPECT_THAT(r.status().message(), HasSubstr(c.what));
    EXPECT_EQ(d.status(), r.status());
    EXPECT_EQ(d.Feed(ping).status(), r.status());  // sticky
    EXPECT_EQ(d.Finish(), r.status());
    EXPECT_FALSE(d.has_frame());
  }
  // Tighter limits: a body the default would accept is over the limit.
  FrameDecoder tight(Limits{4096, 8});
  std::string body5k = RawFrame(T(MessageType::kLookup), 1, std::string(5000, 'x'));
  EXPECT_EQ(tight.Feed(body5k).status().code(), StatusCode::kOutOfRange);
}

TEST(SidecarProtocolTest, FrameDecoderWithInvalidLimitsFailsOnFirstUse) {
  FrameDecoder d(Limits{0, 0});
  auto r = d.Feed(Req(1, Ping{}));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_body_bytes"));
}

TEST(SidecarProtocolTest, FinishBetweenFramesIsClean) {
  FrameDecoder d;
  EXPECT_OK(d.Finish());
  std::string two = Req(1, Ping{}) + Req(2, Stat{1, 2});
  auto used = d.Feed(two);
  ASSERT_OK(used);
  EXPECT_EQ(*used, kFrameHeaderSize);
  EXPECT_OK(d.Finish());  // a whole frame waits
  d.TakeFrame();
  ASSERT_OK(d.Feed(std::string_view(two).substr(*used, 30)));
  EXPECT_THAT(d.Finish().message(), HasSubstr("got 6 of 8 body bytes of a STAT frame"));
}

TEST(SidecarProtocolTest, DecodeFrameNeedsBytes) {
  EXPECT_THAT(DecodeFrame("").status().message(), HasSubstr("no bytes"));
}

// sidecar_protocol_format.h's smallest element sizes (what a decoder checks a
// count against before it reserves anything) and fixed sizes agree with what
// the message descriptions encode: a field added to a description without its
// size here fails this test.
TEST(SidecarProtocolTest, FormatSizesMatchTheEncodedBodies) {
  namespace sf = sidecar_protocol_format;
  auto body = [](const std::string& frame) { return frame.size() - kFrameHeaderSize; };
  const SampleItem ok_item{1, Status::Ok(), 1, 0, 1, 0, false};
  EXPECT_EQ(body(Rep(1, Samples{})), sf::kSamplesFixedSize);
  EXPECT_EQ(body(Rep(1, Samples{{ok_item}, false})) - body(Rep(1, Samples{})),
            sf::kSampleItemMinSize);
  EXPECT_EQ(body(Rep(1, LookupReply{})), sf::kLookupReplyFixedSize);
  EXPECT_EQ(body(Rep(1, LookupReply{{{Status::Ok(), 1}}})) - body(Rep(1, LookupReply{})),
            sf::kLookupItemMinSize);
  EXPECT_EQ(body(Rep(1, StatReply{0, {{"a", 1, 1}}})) - body(Rep(1, StatReply{})),
            sf::kStatEntryMinSize);
  EXPECT_EQ(body(Rep(1, DirectoriesReply{0, 1, {{"a", 0755}}})) -
                body(Rep(1, DirectoriesReply{0, 1, {}})),
            sf::kDirectoryItemMinSize);
  EXPECT_EQ(body(Req(1, Lookup{{"a", "b"}})) - body(Req(1, Lookup{{"a"}})), sf::kPathMinSize);
  EXPECT_EQ(body(Req(1, Release{{7}})) - body(Req(1, Release{})), sf::kTokenSize);
  EXPECT_EQ(body(Req(1, Get{{}, {1, 2}, 0})) - body(Req(1, Get{{}, {1}, 0})), sf::kIdSize);
  EXPECT_EQ(body(Rep(1, OpenReply{kManifest, 1, 1, 1, 1})), 48u);  // the doc's OPEN_REPLY
  EXPECT_EQ(body(Req(1, SetPlan{"p", 0, 0, 1, 0, 1, false, 0, 1, 0})), 44u + 1);  // 44 + n
}

// The fuzzer's seed corpus: short valid and broken streams. With
// GRANARY_SIDECAR_PROTOCOL_CORPUS_OUT set it also writes them there, which is
// how tests/fuzz/corpus/sidecar_protocol/ is regenerated:
//   GRANARY_SIDECAR_PROTOCOL_CORPUS_OUT=$PWD/tests/fuzz/corpus/sidecar_protocol
//   build/debug/tests/sidecar_protocol_test --gtest_filter='*SeedCorpus*'
// Byte 0 of a seed is the fuzzer's mode (tests/fuzz/sidecar_protocol_fuzz.cc).
TEST(SidecarProtocolTest, SeedCorpus) {
  struct Seed {
    char mode;
    std::string stream;
    bool stream_ok;  // every frame passes the frame layer and the stream ends cleanly
  };
  std::map<std::string, Seed> seeds;
  std::string requests;
  uint64_t id = 1;
  for (const Request& m : EveryRequest()) {
    std::string f = Req(id++, m);
    if (f.size() < 300) requests += f;
  }
  std::string replies;
  for (const Reply& m : EveryReply()) {
    std::string f = Rep(id++, m);
    if (f.size() < 300) replies += f;
  }
  SetPlan plan;
  plan.plan_id = "job-7";
  plan.world_size = 2;
  plan.rank = 1;
  seeds["requests"] = {0, requests, true};
  seeds["replies"] = {8, replies, true};
  seeds["hello"] = {0, Req(1, Hello{1, 1, "python/1"}), true};
  seeds["set-plan"] = {0, Req(2, plan), true};
  seeds["get"] = {1, Req(3, Get{{7, 8}, {1, 2, 3}, 2}), true};
  seeds["lookup"] = {0, Req(4, Lookup{{"a/b.jpg", "../x"}}), true};
  seeds["directories"] = {0, Req(6, Directories{0, 100}), true};
  seeds["directories-reply"] = {
      8, Rep(6, DirectoriesReply{0, 3, {{"a", 0755}, {"a/b", 0700}, {"empty", 0555}}}), true};
  seeds["samples"] = {1,
                      Rep(5, Samples{{{1, Status::Ok(), 9, 0, 5, 7, false},
                                      {2, Status::NotFound("gone"), 0, 0, 0, 0, false}},
                                     true}),
                      true};
  seeds["error"] = {0, sidecar_protocol::EncodeError(0, Status::InvalidArgument("bad magic"), true),
                    true};
  seeds["bad-magic"] = {0, "GRNW" + Req(1, Ping{}).substr(4), false};
  std::string huge = RawFrame(T(MessageType::kGet), 1, "");
  StoreLe(huge.data() + 12, uint32_t{0xffffffff});
  seeds["huge-body"] = {0, huge, false};
  seeds["truncated"] = {0, Req(1, Get{{}, {1, 2}, 0}).substr(0, 30), false};
  seeds["unknown-type"] = {0, RawFrame(77, 1, "abc"), true};
  seeds["count-mismatch"] = {0, RawFrame(T(MessageType::kRelease), 1, Body().U32(9).U64(1).str()),
                             true};

  const char* out = std::getenv("GRANARY_SIDECAR_PROTOCOL_CORPUS_OUT");
  for (const auto& [name, seed] : seeds) {
    SCOPED_TRACE(name);
    FrameDecoder d;
    std::string_view rest = seed.stream;
    Status s;
    for (int guard = 0; guard < 1000 && !rest.empty() && s.ok(); ++guard) {
      auto used = d.Feed(rest);
      if (!used.ok()) {
        s = used.status();
        break;
      }
      rest.remove_prefix(*used);
      if (d.has_frame()) d.TakeFrame();
    }
    if (s.ok()) s = d.Finish();
    EXPECT_EQ(s.ok(), seed.stream_ok) << s.ToString();
    EXPECT_LT(seed.stream.size(), 4096u);
    if (out != nullptr) {
      std::filesystem::create_directories(out);
      std::ofstream file(std::string(out) + "/" + name, std::ios::binary);
      file.put(seed.mode);
      file.write(seed.stream.data(), static_cast<std::streamsize>(seed.stream.size()));
    }
  }
}

}  // namespace
}  // namespace granary::sidecar_protocol

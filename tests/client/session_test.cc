// libgranary-client's Session against a scripted sidecar (fake_sidecar.h):
// the protocol conversation, pins and releases, lookahead hints, paging, and
// every way a sidecar can lie or break (wrong ids, ranges outside the arena,
// garbage, silence, a closed connection, a missing or short arena
// descriptor). Plus the parts that need no sidecar: options and path checks.
// The real sidecar is in session_integration_test.cc.

#include "granary/client/session.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <set>
#include <variant>

#include "client/fake_sidecar.h"
#include "granary/core/hash.h"
#include "granary/core/names.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary::client {
namespace {

namespace sp = sidecar_protocol;
using testing::FakeSidecar;
using Action = FakeSidecar::Action;

// ---- no sidecar needed ------------------------------------------------------------

TEST(SamplePathTest, AcceptsRelativePaths) {
  for (const char* p : {"a", "a/b.jpg", "train/n01/x.JPEG", "a/.hidden", "a/..b", "...", "a b/c"}) {
    EXPECT_TRUE(ValidateSamplePath(p).ok()) << p << ": " << ValidateSamplePath(p).message();
  }
  EXPECT_OK(ValidateSamplePath(std::string(sp::kMaxPathLength, 'x')));
}

TEST(SamplePathTest, RejectsPathsThatCouldLeaveTheRoot) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "empty"},
      {"/etc/passwd", "absolute"},
      {"../x", "'..'"},
      {"a/../b", "'..'"},
      {"a/..", "'..'"},
      {"..", "'..'"},
      {"./a", "'.'"},
      {"a/./b", "'.'"},
      {".", "'.'"},
      {"a//b", "empty component"},
      {"a/", "empty component"},
      {std::string("a\0b", 3), "NUL"},
      {std::string(sp::kMaxPathLength + 1, 'x'), "longer"},
  };
  for (const auto& [path, why] : cases) {
    Status s = ValidateSamplePath(path);
    ASSERT_FALSE(s.ok()) << Quoted(path);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
    if (path.size() < 40) {
      EXPECT_NE(s.message().find(Quoted(path)), std::string::npos) << s.message();
    }
  }
}

TEST(SessionOptionsTest, Validate) {
  SessionOptions o;
  EXPECT_OK(o.Validate());
  o.client_name = "python/123";
  EXPECT_OK(o.Validate());
  o.client_name = "has space";
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o.client_name = std::string(sp::kMaxNameLength + 1, 'x');
  EXPECT_NE(o.Validate().message().find("client_name"), std::string::npos);
  o = SessionOptions{};
  o.connect_timeout = std::chrono::milliseconds(0);
  EXPECT_NE(o.Validate().message().find("connect_timeout"), std::string::npos);
  o = SessionOptions{};
  o.call_timeout = std::chrono::milliseconds(-1);
  EXPECT_NE(o.Validate().message().find("call_timeout"), std::string::npos);
  o = SessionOptions{};
  o.lookahead = kMaxLookahead + 1;
  EXPECT_NE(o.Validate().message().find("lookahead"), std::string::npos);
  EXPECT_EQ(DefaultClientName(), "client/" + std::to_string(::getpid()));
}

TEST(SessionOptionsTest, SocketPathFromOptionsThenEnvironmentThenDefault) {
  const char* saved = std::getenv("GRANARY_SOCKET");
  const std::string restore = saved != nullptr ? saved : "";
  ::unsetenv("GRANARY_SOCKET");
  EXPECT_EQ(ResolveSocketPath(""), kDefaultSocketPath);
  ::setenv("GRANARY_SOCKET", "/tmp/from-env.sock", 1);
  EXPECT_EQ(ResolveSocketPath(""), "/tmp/from-env.sock");
  EXPECT_EQ(ResolveSocketPath("/x.sock"), "/x.sock");
  ::setenv("GRANARY_SOCKET", "", 1);
  EXPECT_EQ(ResolveSocketPath(""), kDefaultSocketPath);
  if (saved != nullptr) {
    ::setenv("GRANARY_SOCKET", restore.c_str(), 1);
  } else {
    ::unsetenv("GRANARY_SOCKET");
  }
}

TEST(SessionOpenTest, NothingListeningIsUnavailableNamingThePath) {
  testing::TempDir dir;
  SessionOptions o;
  o.socket_path = dir.Join("none.sock");
  auto s = Session::Open("ds", o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
  EXPECT_NE(s.status().message().find(o.socket_path), std::string::npos) << s.status().message();
}

TEST(SessionOpenTest, BadDatasetNameIsRejectedBeforeConnecting) {
  SessionOptions o;
  o.socket_path = "/nonexistent/x.sock";
  for (const char* name : {"", "Upper", "a/b", "-x", "../etc"}) {
    auto s = Session::Open(name, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << name;
  }
}

// ---- against the fake sidecar ---------------------------------------------------------

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override { Init({}); }

  void Init(std::vector<size_t> sizes, uint64_t arena = 1 << 20) {
    if (sizes.empty()) {
      for (size_t i = 0; i < 40; ++i) sizes.push_back(100 + 37 * i);
    }
    fake_.reset();
    started_ = false;
    path_ = dir_.Join("sidecar-" + std::to_string(++n_) + ".sock");
    fake_ = std::make_unique<FakeSidecar>(path_, std::move(sizes), arena);
  }

  // Without lookahead unless asked: a hint would answer the next Get.
  static SessionOptions NoHints() {
    SessionOptions o;
    o.lookahead = 0;
    return o;
  }

  std::unique_ptr<Session> Open(SessionOptions o = NoHints()) {
    if (!started_) {
      Status s = fake_->Start();
      EXPECT_OK(s);
      started_ = true;
    }
    o.socket_path = path_;
    if (o.call_timeout == SessionOptions{}.call_timeout) o.call_timeout = std::chrono::seconds(10);
    auto s = Session::Open("ds", o);
    EXPECT_OK(s);
    return s.ok() ? std::move(*s) : nullptr;
  }

  Result<std::unique_ptr<Session>> TryOpen(SessionOptions o = NoHints()) {
    if (!started_) {
      Status s = fake_->Start();
      EXPECT_OK(s);
      started_ = true;
    }
    o.socket_path = path_;
    return Session::Open("ds", o);
  }

  template <typename T>
  std::vector<T> RequestsOf() const {
    std::vector<T> out;
    for (const sp::Request& r : fake_->requests()) {
      if (const T* t = std::get_if<T>(&r)) out.push_back(*t);
    }
    return out;
  }

  testing::TempDir dir_;
  std::string path_;
  std::unique_ptr<FakeSidecar> fake_;
  bool started_ = false;
  int n_ = 0;
};

TEST_F(SessionTest, OpenMapsTheArenaAndGetReadsInPlace) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->info().name, "ds");
  EXPECT_EQ(session->info().sample_count, 40u);
  EXPECT_EQ(session->info().manifest_id, (ContentId{1, 2}));
  EXPECT_EQ(session->sidecar_name(), "fake-sidecar");
  EXPECT_EQ(session->arena_bytes(), uint64_t{1} << 20);
  EXPECT_EQ(session->socket_path(), path_);
  EXPECT_TRUE(session->InOpeningProcess());
  auto open = RequestsOf<sp::Open>();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_EQ(open[0].dataset, "ds");

  auto view = session->Get(7);
  ASSERT_OK(view);
  EXPECT_EQ(view->id, 7u);
  EXPECT_EQ(view->bytes(), fake_->BytesOf(7));
  EXPECT_EQ(view->checksum, Checksum64(fake_->BytesOf(7)));
  EXPECT_NE(view->token, 0u);
  auto read = session->Read(8);
  ASSERT_OK(read);
  EXPECT_EQ(*read, fake_->BytesOf(8));
  // The client sealed the arena against shrinking (no SIGBUS later).
  EXPECT_NE(::fcntl(fake_->memfd(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
}

TEST_F(SessionTest, ReleasesArePiggyBackedAndFlushed) {
  SessionOptions o = NoHints();
  o.lookahead = 0;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  auto a = session->Get(1);
  auto b = session->Get(2);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(fake_->pins(), 2u);
  EXPECT_EQ(session->pinned_count(), 2u);
  session->Release(*a);
  session->Release(*a);                                    // twice: ignored
  session->Release(SampleView{3, nullptr, 0, 0, 999999});  // never handed out: ignored
  EXPECT_EQ(session->pinned_count(), 1u);
  EXPECT_TRUE(fake_->released().empty()) << "a release costs no round trip";
  ASSERT_OK(session->Get(3));
  auto gets = RequestsOf<sp::Get>();
  ASSERT_EQ(gets.size(), 3u);
  EXPECT_EQ(gets[2].release, std::vector<uint64_t>{a->token});
  session->Release(*b);
  ASSERT_OK(session->Flush());
  auto releases = RequestsOf<sp::Release>();
  ASSERT_EQ(releases.size(), 1u);
  EXPECT_EQ(releases[0].tokens, std::vector<uint64_t>{b->token});
  EXPECT_EQ(fake_->pins(), 1u);  // sample 3 is still pinned
  ASSERT_OK(session->Flush());   // nothing queued: no request
  EXPECT_EQ(RequestsOf<sp::Release>().size(), 1u);
}

TEST_F(SessionTest, LookaheadHintsServeLaterGetsWithoutARoundTrip) {
  SessionOptions o = NoHints();
  o.lookahead = 4;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  ASSERT_OK(session->Get(10));
  auto gets = RequestsOf<sp::Get>();
  ASSERT_EQ(gets.size(), 1u);
  EXPECT_EQ(gets[0].lookahead, 4u);
  EXPECT_EQ(session->hint_count(), 4u);  // 11..14
  const size_t before = fake_->request_count();
  for (uint32_t id = 11; id <= 14; ++id) {
    auto v = session->Get(id);
    ASSERT_OK(v);
    EXPECT_EQ(v->bytes(), fake_->BytesOf(id));
    session->Release(*v);
  }
  EXPECT_EQ(fake_->request_count(), before) << "hints need no round trip";
  EXPECT_EQ(session->hint_count(), 0u);

  // Unused hints are released once the table holds more than 2 × lookahead,
  // oldest first.
  ASSERT_OK(session->Get(20));  // hints 21..24
  ASSERT_OK(session->Get(30));  // hints 31..34: 8 in the table
  EXPECT_EQ(session->hint_count(), 8u);
  ASSERT_OK(session->Get(0));  // hints 1..4: 12 → trimmed to 8, dropping 21..24
  EXPECT_EQ(session->hint_count(), 8u);
  ASSERT_OK(session->Flush());
  // Released: 11..14 by the caller, 21..24 trimmed. Pinned: 10, 20, 30, 0 and
  // the 8 hints left (31..34, 1..4).
  EXPECT_EQ(fake_->released().size(), 8u);
  EXPECT_EQ(fake_->pins(), 4u + 8u);
  EXPECT_EQ(session->pinned_count(), 4u + 8u);
  for (uint32_t id : {31u, 32u, 33u, 34u, 1u, 2u, 3u, 4u}) {
    const size_t before_hit = fake_->request_count();
    ASSERT_OK(session->Get(id));
    EXPECT_EQ(fake_->request_count(), before_hit) << id << " should still be a hint";
  }
  session.reset();
  EXPECT_TRUE(testing::WaitFor([&] { return fake_->pins() == 0; }))
      << "closing drops every pin, hints included";
}

TEST_F(SessionTest, TryGetHintedTakesOnlyHintsAndNeverCallsTheSidecar) {
  SessionOptions o = NoHints();
  o.lookahead = 4;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  const size_t before = fake_->request_count();
  EXPECT_FALSE(session->TryGetHinted(10).has_value()) << "nothing hinted yet";
  EXPECT_FALSE(session->TryGetHinted(1000).has_value()) << "past the end: Get says why";
  EXPECT_EQ(fake_->request_count(), before) << "TryGetHinted sent a request";
  ASSERT_OK(session->Get(10));  // hints 11..14
  const size_t after_get = fake_->request_count();
  auto hinted = session->TryGetHinted(12);
  ASSERT_TRUE(hinted.has_value());
  EXPECT_EQ(hinted->id, 12u);
  EXPECT_EQ(hinted->bytes(), fake_->BytesOf(12));
  EXPECT_EQ(session->hint_count(), 3u) << "taken off the table, as Get would";
  EXPECT_FALSE(session->TryGetHinted(12).has_value()) << "a hint is handed out once";
  EXPECT_FALSE(session->TryGetHinted(20).has_value());
  EXPECT_EQ(fake_->request_count(), after_get);
  EXPECT_EQ(session->pinned_count(), 1u + 4u) << "10, and 12 with the three hints left";
  session->Release(*hinted);
  ASSERT_OK(session->Flush());
  EXPECT_EQ(fake_->released().size(), 1u);
}

// Large samples: fewer hints asked, and the table kept within 1/32 of the
// arena, so sessions pinning consumed hints cannot fill it.
TEST_F(SessionTest, HintsAreBoundedInBytes) {
  Init(std::vector<size_t>(40, 16 * 1024), 1 << 20);  // 16 KiB samples, 1 MiB arena
  SessionOptions o;
  o.lookahead = 64;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->lookahead(), 1u) << "1 MiB / 32 / 2 holds one 16 KiB sample";
  ASSERT_OK(session->Get(0));
  auto gets = RequestsOf<sp::Get>();
  ASSERT_EQ(gets.size(), 1u);
  EXPECT_EQ(gets[0].lookahead, 1u);
  for (uint32_t id = 10; id < 20; ++id) ASSERT_OK(session->Get(id));
  EXPECT_LE(session->hint_count() * 16 * 1024, (1u << 20) / kHintArenaShare);
  EXPECT_GE(session->hint_count(), 1u);
  // Small samples: the option stands.
  Init({});
  auto small = Open(o);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->lookahead(), 19u) << "mean 821 bytes: 1 MiB / 32 / 2 / 821";
  small.reset();  // the fake serves one connection at a time
  o.lookahead = 5;
  EXPECT_EQ(Open(o)->lookahead(), 5u);
  o.lookahead = 0;
  EXPECT_EQ(Open(o)->lookahead(), 0u);
}

TEST_F(SessionTest, GetManyMixesHitsMissesAndBadIds) {
  SessionOptions o = NoHints();
  o.lookahead = 2;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  ASSERT_OK(session->Get(5));  // hints 6, 7
  std::vector<uint32_t> ids = {6, 9, 40, 7, 1000, 9};
  auto got = session->GetMany(ids);
  ASSERT_EQ(got.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 40) {
      ASSERT_FALSE(got[i].ok());
      EXPECT_EQ(got[i].status().code(), StatusCode::kOutOfRange);
      EXPECT_NE(got[i].status().message().find("40 samples"), std::string::npos);
      continue;
    }
    ASSERT_OK(got[i]);
    EXPECT_EQ(got[i]->bytes(), fake_->BytesOf(ids[i]));
  }
  auto gets = RequestsOf<sp::Get>();
  ASSERT_EQ(gets.size(), 2u);
  EXPECT_EQ(gets[1].ids, (std::vector<uint32_t>{9, 9})) << "hits are not asked again";
  EXPECT_TRUE(session->GetMany({}).empty());
}

TEST_F(SessionTest, ManyIdsAreSplitWithinTheLimits) {
  std::vector<size_t> sizes(9000, 8);
  Init(sizes);
  SessionOptions o = NoHints();
  o.lookahead = 0;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  std::vector<uint32_t> ids(9000);
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  auto got = session->GetMany(ids);
  for (uint32_t i = 0; i < ids.size(); ++i) {
    ASSERT_OK(got[i]);
    ASSERT_EQ(got[i]->bytes(), fake_->BytesOf(i));
    session->Release(*got[i]);
  }
  auto gets = RequestsOf<sp::Get>();
  EXPECT_EQ(gets.size(), 3u);  // 4096 ids per GET at the default limits
  // 9000 releases go out in as many requests as the limits need.
  ASSERT_OK(session->Flush());
  EXPECT_EQ(fake_->pins(), 0u);
  EXPECT_EQ(RequestsOf<sp::Release>().size(), 3u);
}

TEST_F(SessionTest, PerSampleErrorsAreThatSamplesResult) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  fake_->set_override([](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
    const auto* get = std::get_if<sp::Get>(&r);
    if (get == nullptr) return std::nullopt;
    sp::Samples samples;
    for (uint32_t sample : get->ids) {
      sp::SampleItem item;
      item.id = sample;
      item.status = Status::FailedPrecondition("source file changed since the snapshot");
      samples.items.push_back(item);
    }
    return std::vector<Action>{FakeSidecar::ReplyAction(id, samples)};
  });
  auto v = session->Get(3);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("sample 3"), std::string::npos) << v.status().message();
  fake_->set_override(nullptr);
  EXPECT_TRUE(session->Get(3).ok()) << "the session is still usable";
}

TEST_F(SessionTest, RangesOutsideTheArenaAreNeverRead) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  const uint64_t arena = fake_->arena_bytes();
  const std::pair<uint64_t, uint64_t> lies[] = {
      {arena, 1}, {arena - 10, 11}, {0, arena + 1}, {uint64_t{1} << 40, 5}, {5, uint64_t{1} << 62}};
  uint64_t token = 5000;
  for (const auto& [offset, length] : lies) {
    fake_->set_override(
        [&, offset = offset, length = length](
            uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
          const auto* get = std::get_if<sp::Get>(&r);
          if (get == nullptr) return std::nullopt;
          sp::Samples samples;
          sp::SampleItem item;
          item.id = get->ids.at(0);
          item.token = ++token;
          item.offset = offset;
          item.length = length;
          samples.items.push_back(item);
          return std::vector<Action>{FakeSidecar::ReplyAction(id, samples)};
        });
    auto v = session->Get(1);
    ASSERT_FALSE(v.ok()) << offset << "+" << length;
    EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
    EXPECT_NE(v.status().message().find("arena"), std::string::npos);
  }
  fake_->set_override(nullptr);
  ASSERT_OK(session->Flush());
  // The lying items' pins were given back (piggy-backed, then flushed).
  std::set<uint64_t> released;
  for (const sp::Get& get : RequestsOf<sp::Get>())
    released.insert(get.release.begin(), get.release.end());
  for (const sp::Release& r : RequestsOf<sp::Release>())
    released.insert(r.tokens.begin(), r.tokens.end());
  EXPECT_EQ(released, (std::set<uint64_t>{5001, 5002, 5003, 5004, 5005}));
  EXPECT_OK(session->Get(2));
}

// The 8 little-endian bytes of `v` in `frame` replaced by those of `by`.
void ReplaceU64(std::string* frame, uint64_t v, uint64_t by) {
  std::string from(8, '\0'), to(8, '\0');
  for (int i = 0; i < 8; ++i) {
    from[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
    to[static_cast<size_t>(i)] = static_cast<char>(by >> (8 * i));
  }
  const size_t at = frame->find(from);
  ASSERT_NE(at, std::string::npos);
  frame->replace(at, 8, to);
}

// A range whose end overflows 64 bits cannot even be encoded: it is written
// over a valid frame. The decoder refuses it; the session breaks, reads nothing.
TEST_F(SessionTest, OverflowingRangesAreMalformed) {
  const std::pair<uint64_t, uint64_t> lies[] = {{~uint64_t{0} - 5, 10}, {5, ~uint64_t{0}}};
  for (const auto& [offset, length] : lies) {
    auto session = Open();
    ASSERT_NE(session, nullptr);
    fake_->set_override(
        [&, offset = offset, length = length](
            uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
          const auto* get = std::get_if<sp::Get>(&r);
          if (get == nullptr) return std::nullopt;
          sp::Samples samples;
          sp::SampleItem item;
          item.id = get->ids.at(0);
          item.token = 9;
          item.offset = 0x1122334455667788;
          item.length = 0x0102030405060708;
          samples.items.push_back(item);
          Action a = FakeSidecar::ReplyAction(id, samples);
          ReplaceU64(&a.bytes, item.offset, offset);
          ReplaceU64(&a.bytes, item.length, length);
          return std::vector<Action>{a};
        });
    auto v = session->Get(1);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
    EXPECT_NE(v.status().message().find("overflows"), std::string::npos) << v.status().message();
    fake_->set_override(nullptr);
  }
}

// Direct reads from a "chunk file" the fake hands over (its arena memfd, so
// the samples' bytes are in it at their offsets): a sample said to lie past
// the end of the file is never touched (a mapping read there would be SIGBUS)
// and comes through the arena (an extent that overflows 64 bits does not pass
// the protocol's decoder); bytes that
// fail their checksum are never returned and the arena's are; a view of the
// map stays readable after the session is gone.
TEST_F(SessionTest, DirectReadsStayInsideTheChunkFileAndFallBackOnBadBytes) {
  const uint64_t arena = fake_->arena_bytes();
  std::vector<sp::DirectSample> described = {
      {0, fake_->OffsetOf(0), fake_->BytesOf(0).size(), Checksum64(fake_->BytesOf(0))},
      {1, arena - 8, fake_->BytesOf(1).size(), Checksum64(fake_->BytesOf(1))},
      {2, fake_->OffsetOf(2), fake_->BytesOf(2).size(), Checksum64(fake_->BytesOf(2)) ^ 1},
      {4, fake_->OffsetOf(4), fake_->BytesOf(4).size(), Checksum64(fake_->BytesOf(4))},
  };
  fake_->set_override(
      [described](uint64_t rid, const sp::Request& r) -> std::optional<std::vector<Action>> {
        if (!std::holds_alternative<sp::ChunkFiles>(r)) return std::nullopt;
        sp::ChunkFile c;
        c.chunk = 0;
        c.samples = described;
        Action a = FakeSidecar::ReplyAction(rid, sp::ChunkFilesReply{{c}});
        a.with_fd = true;
        return std::vector<Action>{a};
      });
  auto session = Open();
  ASSERT_NE(session, nullptr);

  auto zero = session->Read(0);
  ASSERT_OK(zero);
  EXPECT_EQ(*zero, fake_->BytesOf(0));
  DirectReadCounters c = session->direct_counters();
  EXPECT_EQ(c.chunk_files, 1u);
  EXPECT_EQ(c.samples, 1u);
  EXPECT_EQ(c.fallbacks, 1u) << "sample 1 lies past the end of the file";
  EXPECT_TRUE(RequestsOf<sp::Get>().empty()) << "sample 0 was read from the file";

  auto mapped = session->MapDirect(4);
  ASSERT_OK(mapped);
  EXPECT_EQ(mapped->bytes(), fake_->BytesOf(4));
  EXPECT_EQ(session->MapDirect(1).status().code(), StatusCode::kNotFound);

  auto one = session->Read(1);
  ASSERT_OK(one);
  EXPECT_EQ(*one, fake_->BytesOf(1));
  EXPECT_EQ(RequestsOf<sp::Get>().size(), 1u) << "1 through the arena";

  // Unverified, then checked: the mismatch is kCorruption, counted, and the
  // file let go; Read returns the arena's bytes.
  auto unchecked = session->MapDirectUnverified(2);
  ASSERT_OK(unchecked);
  Status checked = session->VerifyMapped(*unchecked);
  EXPECT_EQ(checked.code(), StatusCode::kCorruption) << checked.ToString();
  EXPECT_EQ(session->direct_counters().corrupt, 1u);
  auto two = session->Read(2);
  ASSERT_OK(two);
  EXPECT_EQ(*two, fake_->BytesOf(2));
  EXPECT_EQ(session->MapDirect(0).status().code(), StatusCode::kNotFound)
      << "the file is let go after a mismatch";
  c = session->direct_counters();
  EXPECT_EQ(c.samples, 2u) << "0 and 4; never the bad bytes";
  EXPECT_EQ(c.corrupt, 1u);

  // The view holds the map: readable after the session (and its table) went.
  session.reset();
  EXPECT_EQ(mapped->bytes(), fake_->BytesOf(4));
}

TEST_F(SessionTest, ChecksumsAreVerifiedWhenAsked) {
  SessionOptions o = NoHints();
  o.verify_checksums = true;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  EXPECT_OK(session->Get(4));
  fake_->set_override([&](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
    const auto* get = std::get_if<sp::Get>(&r);
    if (get == nullptr) return std::nullopt;
    sp::Samples samples;
    sp::SampleItem item;
    item.id = get->ids.at(0);
    item.token = 77;
    item.offset = fake_->OffsetOf(item.id);
    item.length = fake_->BytesOf(item.id).size();
    item.checksum = 12345;
    samples.items.push_back(item);
    return std::vector<Action>{FakeSidecar::ReplyAction(id, samples)};
  });
  auto v = session->Get(5);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption);
  EXPECT_NE(v.status().message().find("checksum"), std::string::npos);
}

// Replies that break the protocol: the call fails kUnavailable naming the
// socket, the session stays broken, nothing crashes.
TEST_F(SessionTest, MalformedRepliesBreakTheSessionCleanly) {
  struct Case {
    std::string name;
    std::function<std::vector<Action>(uint64_t id, const sp::Get& get)> reply;
  };
  const std::vector<Case> cases = {
      {"garbage",
       [](uint64_t, const sp::Get&) {
         return std::vector<Action>{
             {"not a frame at all, "
              "just words......"}};
       }},
      {"wrong ids",
       [](uint64_t id, const sp::Get& get) {
         sp::Samples s;
         sp::SampleItem item;
         item.id = get.ids[0] + 1;
         item.status = Status::NotFound("x");
         s.items.push_back(item);
         return std::vector<Action>{FakeSidecar::ReplyAction(id, s)};
       }},
      {"too few answers",
       [](uint64_t id, const sp::Get&) {
         return std::vector<Action>{FakeSidecar::ReplyAction(id, sp::Samples{})};
       }},
      {"another request's id",
       [](uint64_t id, const sp::Get&) {
         return std::vector<Action>{FakeSidecar::ReplyAction(id + 7, sp::Samples{})};
       }},
      {"wrong reply type",
       [](uint64_t id, const sp::Get&) {
         return std::vector<Action>{FakeSidecar::ReplyAction(id, sp::Pong{})};
       }},
      {"closed mid-reply",
       [](uint64_t id, const sp::Get&) {
         Action a = FakeSidecar::ReplyAction(id, sp::Samples{});
         a.bytes.resize(10);
         a.close = true;
         return std::vector<Action>{a};
       }},
      {"closed",
       [](uint64_t, const sp::Get&) {
         return std::vector<Action>{{"", false, true}};
       }},
      {"huge body length",
       [](uint64_t id, const sp::Get&) {
         Action a = FakeSidecar::ReplyAction(id, sp::Samples{});
         a.bytes[12] = a.bytes[13] = a.bytes[14] = a.bytes[15] = '\xff';
         return std::vector<Action>{a};
       }},
      {"unsolicited closing error",
       [](uint64_t, const sp::Get&) {
         return std::vector<Action>{
             {sp::EncodeError(0, Status::Unavailable("sidecar shutting down"), true)}};
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto session = Open();
    ASSERT_NE(session, nullptr);
    ASSERT_OK(session->Get(1));
    fake_->set_override(
        [&](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
          const auto* get = std::get_if<sp::Get>(&r);
          if (get == nullptr) return std::nullopt;
          return c.reply(id, *get);
        });
    auto v = session->Get(2);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
    EXPECT_NE(v.status().message().find(path_), std::string::npos) << v.status().message();
    EXPECT_EQ(session->pinned_count(), 0u);
    fake_->set_override(nullptr);
    // Broken for good: later calls say so without talking to the sidecar.
    auto again = session->Get(3);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(again.status().message().find("open a new session"), std::string::npos);
    EXPECT_EQ(session->Ping().code(), StatusCode::kUnavailable);
    EXPECT_FALSE(session->Stat(0).ok());
    session.reset();
    // The fake serves the next connection.
  }
}

TEST_F(SessionTest, ErrorRepliesAreTheCallsStatus) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  bool closing = false;
  fake_->set_override([&](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Ping>(r)) return std::nullopt;
    return std::vector<Action>{
        {sp::EncodeError(id, Status::ResourceExhausted("too many sessions"), closing)}};
  });
  Status s = session->Ping();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("too many sessions"), std::string::npos);
  fake_->set_override(nullptr);
  EXPECT_TRUE(session->Ping().ok()) << "a non-closing ERROR leaves the session usable";
  closing = true;
  fake_->set_override([&](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Ping>(r)) return std::nullopt;
    return std::vector<Action>{
        {sp::EncodeError(id, Status::ResourceExhausted("going away"), true), false, true}};
  });
  EXPECT_EQ(session->Ping().code(), StatusCode::kResourceExhausted);
  fake_->set_override(nullptr);
  EXPECT_EQ(session->Ping().code(), StatusCode::kUnavailable);
}

TEST_F(SessionTest, SilenceTimesOut) {
  SessionOptions o = NoHints();
  o.call_timeout = std::chrono::milliseconds(200);
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  fake_->set_override([](uint64_t, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Get>(r)) return std::nullopt;
    return std::vector<Action>{{"", false, false, true}};
  });
  auto v = session->Get(1);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded) << v.status().ToString();
  EXPECT_EQ(session->Ping().code(), StatusCode::kUnavailable)
      << "a late reply must not be taken for the next call's";
}

TEST_F(SessionTest, BadOpenRepliesFailTheOpen) {
  struct Case {
    std::string name;
    std::function<std::vector<Action>(uint64_t id, const sp::OpenReply& good)> reply;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {"no descriptor",
       [](uint64_t id, const sp::OpenReply& good) {
         return std::vector<Action>{FakeSidecar::ReplyAction(id, good)};
       },
       StatusCode::kUnavailable},
      {"absurd arena",
       [](uint64_t id, sp::OpenReply good) {
         good.arena_bytes = uint64_t{1} << 50;
         Action a = FakeSidecar::ReplyAction(id, good);
         a.with_fd = true;
         return std::vector<Action>{a};
       },
       StatusCode::kUnavailable},
      {"arena larger than the descriptor",
       [](uint64_t id, sp::OpenReply good) {
         good.arena_bytes *= 2;
         Action a = FakeSidecar::ReplyAction(id, good);
         a.with_fd = true;
         return std::vector<Action>{a};
       },
       StatusCode::kUnavailable},
      {"unknown dataset",
       [](uint64_t id, const sp::OpenReply&) {
         return std::vector<Action>{
             {sp::EncodeError(id, Status::NotFound("no dataset 'ds'"), false)}};
       },
       StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fake_->set_override(
        [&](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
          if (!std::holds_alternative<sp::Open>(r)) return std::nullopt;
          sp::OpenReply good;
          good.manifest_id = ContentId{1, 2};
          good.sample_count = 40;
          good.arena_bytes = fake_->arena_bytes();
          return c.reply(id, good);
        });
    auto s = TryOpen();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), c.code) << s.status().ToString();
  }
}

TEST_F(SessionTest, BadHelloRepliesFailTheOpen) {
  struct Case {
    std::string name;
    std::function<std::vector<Action>(uint64_t id)> reply;
    StatusCode code;
  };
  const std::vector<Case> cases = {
      {"error",
       [](uint64_t id) {
         return std::vector<Action>{
             {sp::EncodeError(id, Status::PermissionDenied("uid 1000 may not connect"), true)}};
       },
       StatusCode::kPermissionDenied},
      {"garbage", [](uint64_t) { return std::vector<Action>{{std::string(24, 'G')}}; },
       StatusCode::kUnavailable},
      {"open reply instead",
       [](uint64_t id) {
         sp::OpenReply open;
         open.manifest_id = ContentId{1, 2};
         open.arena_bytes = 4096;
         return std::vector<Action>{FakeSidecar::ReplyAction(id, open)};
       },
       StatusCode::kUnavailable},
      {"closed",
       [](uint64_t) {
         return std::vector<Action>{{"", false, true}};
       },
       StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fake_->set_override(
        [&](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
          if (!std::holds_alternative<sp::Hello>(r)) return std::nullopt;
          return c.reply(id);
        });
    auto s = TryOpen();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), c.code) << s.status().ToString();
  }
  fake_->set_override(nullptr);
  EXPECT_OK(TryOpen());
}

TEST_F(SessionTest, SetPlanAndNext) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  sp::SetPlan plan;
  plan.plan_id = "py-0-1";
  plan.start_position = 35;
  ASSERT_OK(session->SetPlan(plan));
  bool end = true;
  auto batch = session->Next(3, &end);
  ASSERT_OK(batch);
  EXPECT_FALSE(end);
  ASSERT_EQ(batch->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_OK((*batch)[i]);
    EXPECT_EQ((*batch)[i]->id, 35 + i);
    EXPECT_EQ((*batch)[i]->bytes(), fake_->BytesOf(static_cast<uint32_t>(35 + i)));
    session->Release(*(*batch)[i]);
  }
  batch = session->Next(10, &end);
  ASSERT_OK(batch);
  EXPECT_TRUE(end);
  EXPECT_EQ(batch->size(), 2u);
  auto nexts = RequestsOf<sp::Next>();
  ASSERT_EQ(nexts.size(), 2u);
  EXPECT_EQ(nexts[1].release.size(), 3u);
  EXPECT_EQ(session->Next(0, &end).status().code(), StatusCode::kInvalidArgument);
  auto sets = RequestsOf<sp::SetPlan>();
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0], plan);

  // A NEXT reply with more samples than asked breaks the session.
  fake_->set_override([](uint64_t id, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Next>(r)) return std::nullopt;
    sp::Samples s;
    for (uint32_t i = 0; i < 3; ++i) {
      sp::SampleItem item;
      item.id = i;
      item.status = Status::NotFound("x");
      s.items.push_back(item);
    }
    return std::vector<Action>{FakeSidecar::ReplyAction(id, s)};
  });
  EXPECT_EQ(session->Next(1, &end).status().code(), StatusCode::kUnavailable);
}

TEST_F(SessionTest, StatListAndLookup) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  fake_->set_stat_page(3);
  auto one = session->Stat(12);
  ASSERT_OK(one);
  EXPECT_EQ(one->path, "d/12.bin");
  EXPECT_EQ(one->size, fake_->BytesOf(12).size());
  auto list = session->List(5, 10);
  ASSERT_OK(list);
  ASSERT_EQ(list->size(), 10u);
  for (uint32_t i = 0; i < 10; ++i)
    EXPECT_EQ((*list)[i].path, "d/" + std::to_string(5 + i) + ".bin");
  EXPECT_EQ(RequestsOf<sp::Stat>().size(), 1u + 4u) << "pages of 3";
  EXPECT_EQ(session->List(35, 6).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(session->Stat(40).status().code(), StatusCode::kOutOfRange);
  auto none = session->List(40, 0);
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty());

  auto id = session->Lookup("d/17.bin");
  ASSERT_OK(id);
  EXPECT_EQ(*id, 17u);
  auto missing = session->Lookup("d/99.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  const size_t lookups = RequestsOf<sp::Lookup>().size();
  for (const char* bad : {"../x", "/etc/passwd", "a/../b", "", "./d/1.bin"}) {
    auto r = session->Lookup(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(Quoted(bad)), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(RequestsOf<sp::Lookup>().size(), lookups) << "unsafe paths are never sent";
  std::vector<std::string> paths = {"d/1.bin", "/abs", "d/2.bin", "nope"};
  auto many = session->LookupMany(paths);
  ASSERT_EQ(many.size(), 4u);
  EXPECT_EQ(*many[0], 1u);
  EXPECT_EQ(many[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*many[2], 2u);
  EXPECT_EQ(many[3].status().code(), StatusCode::kNotFound);
  EXPECT_EQ(RequestsOf<sp::Lookup>().size(), lookups + 1);

  // A STAT_REPLY for other ids, or empty, breaks the session.
  fake_->set_override([](uint64_t rid, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Stat>(r)) return std::nullopt;
    return std::vector<Action>{FakeSidecar::ReplyAction(rid, sp::StatReply{0, {}})};
  });
  EXPECT_EQ(session->List(3, 2).status().code(), StatusCode::kUnavailable);
}

TEST_F(SessionTest, DirectoriesArePagedInTheManifestsOrder) {
  const std::vector<sp::DirectoryItem> dirs = {
      {"a", 0755}, {"a/b", 0700}, {"a/b/c", 0555}, {"empty", 02775}, {"z", 0}};
  fake_->set_directories(dirs);
  fake_->set_stat_page(2);
  auto session = Open();
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->protocol_version(), sp::kMaxVersion);
  auto got = session->Directories();
  ASSERT_OK(got);
  EXPECT_EQ(*got, dirs);
  const auto asked = RequestsOf<sp::Directories>();
  ASSERT_EQ(asked.size(), 3u) << "pages of 2";
  EXPECT_EQ(asked[0].first, 0u);
  EXPECT_EQ(asked[1].first, 2u);
  EXPECT_EQ(asked[2].first, 4u);

  fake_->set_directories({});
  auto none = session->Directories();
  ASSERT_OK(none);
  EXPECT_TRUE(none->empty()) << "a dataset whose files are all at the root";
}

// A sidecar that speaks only version 1 has no DIRECTORIES: nothing is sent,
// the error says what to upgrade, and the session stays usable.
TEST_F(SessionTest, DirectoriesFromAnOlderSidecarNameTheUpgrade) {
  fake_->set_override([](uint64_t rid, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Hello>(r)) return std::nullopt;
    return std::vector<Action>{
        FakeSidecar::ReplyAction(rid, sp::HelloReply{1, "old-sidecar", sp::Limits{}})};
  });
  auto session = Open();
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->protocol_version(), 1);
  auto got = session->Directories();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(
      got.status().message(),
      ::testing::AllOf(::testing::HasSubstr("upgrade granary-sidecar"),
                       ::testing::HasSubstr("version 1"), ::testing::HasSubstr("needs version 2"),
                       ::testing::HasSubstr("old-sidecar")));
  EXPECT_TRUE(RequestsOf<sp::Directories>().empty());
  EXPECT_OK(session->Ping());
}

TEST_F(SessionTest, DirectoriesOutOfOrderOrUnsafeBreakTheSession) {
  const std::vector<std::pair<std::string, std::vector<sp::DirectoryItem>>> cases = {
      {"unsorted", {{"b", 0555}, {"a", 0555}}},
      {"twice", {{"a", 0555}, {"a", 0555}}},
      {"dot-dot", {{"a", 0555}, {"a/../../etc", 0555}}},
      {"absolute", {{"/etc", 0555}}},
  };
  for (const auto& [name, dirs] : cases) {
    SCOPED_TRACE(name);
    fake_->set_directories(dirs);
    auto session = Open();
    ASSERT_NE(session, nullptr);
    auto got = session->Directories();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
    EXPECT_THAT(got.status().message(), ::testing::HasSubstr("connection is closed"));
    EXPECT_EQ(session->Ping().code(), StatusCode::kUnavailable);
  }
  // A page that does not continue where the last stopped.
  fake_->set_directories({{"a", 0555}, {"b", 0555}});
  fake_->set_override([](uint64_t rid, const sp::Request& r) -> std::optional<std::vector<Action>> {
    if (!std::holds_alternative<sp::Directories>(r)) return std::nullopt;
    return std::vector<Action>{FakeSidecar::ReplyAction(rid, sp::DirectoriesReply{0, 3, {}})};
  });
  auto session = Open();
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->Directories().status().code(), StatusCode::kUnavailable);
}

TEST_F(SessionTest, AForkedChildNeverUsesTheParentsConnection) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  auto view = session->Get(3);
  ASSERT_OK(view);
  const size_t requests = fake_->request_count();
  Session* raw = session.get();
  auto child = testing::ChildProcess::Start([raw, view = *view](int) {
    if (raw->InOpeningProcess()) return 10;
    auto v = raw->Get(4);
    if (v.ok() || v.status().code() != StatusCode::kFailedPrecondition) return 11;
    if (v.status().message().find("fork") == std::string::npos) return 12;
    if (raw->Ping().code() != StatusCode::kFailedPrecondition) return 13;
    raw->Release(view);  // a no-op
    // The mapping is inherited: the bytes are still readable here.
    if (view.bytes().size() != view.size) return 14;
    delete raw;  // unmaps and closes the child's copy only
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(std::chrono::seconds(20));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0);
  EXPECT_EQ(fake_->request_count(), requests) << "the child sent nothing";
  EXPECT_EQ(fake_->pins(), 1u);
  EXPECT_TRUE(session->Ping().ok()) << "the parent's session is intact";
  auto again = session->Get(4);
  ASSERT_OK(again);
  EXPECT_EQ(again->bytes(), fake_->BytesOf(4));
}

TEST_F(SessionTest, AForkedChildTakesNoneOfTheParentsHints) {
  SessionOptions o = NoHints();
  o.lookahead = 4;
  auto session = Open(o);
  ASSERT_NE(session, nullptr);
  ASSERT_OK(session->Get(10));  // hints 11..14, pinned for the parent
  ASSERT_EQ(session->hint_count(), 4u);
  Session* raw = session.get();
  auto child = testing::ChildProcess::Start([raw](int) {
    if (raw->InOpeningProcess()) return 10;
    for (uint32_t id = 11; id <= 14; ++id) {
      if (raw->TryGetHinted(id).has_value()) return 11;  // the parent's pin
    }
    return 0;
  });
  ASSERT_OK(child);
  auto code = (*child)->Wait(std::chrono::seconds(20));
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(session->InOpeningProcess());
  EXPECT_TRUE(session->TryGetHinted(11).has_value()) << "the parent still has its hints";
}

TEST_F(SessionTest, ConcurrentCallersAreSerialised) {
  auto session = Open();
  ASSERT_NE(session, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < 50; ++i) {
        const uint32_t id = (i * 7 + static_cast<uint32_t>(t)) % 40;
        auto v = session->Get(id);
        if (!v.ok() || v->bytes() != fake_->BytesOf(id)) ++bad;
        if (v.ok()) session->Release(*v);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_OK(session->Flush());
  session.reset();
  EXPECT_TRUE(testing::WaitFor([&] { return fake_->pins() == 0; }));
}

}  // namespace
}  // namespace granary::client

// granary-sidecar end to end at the protocol level: a real sidecar, real cache
// nodes and a real Redis (CacheCluster, SidecarProcess). A raw client here
// speaks sidecar_protocol.h byte by byte, so hostile input can be sent too.
// The Python/PyTorch path is tests/integration/python_client_test.cc.

#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "granary/core/manifest.h"
#include "granary/core/metadata_store.h"
#include "granary/protocol/sidecar_protocol.h"
#include "granary/protocol/unix_socket.h"
#include "testing/cachenode_fixture.h"
#include "testing/child_process.h"
#include "testing/sidecar_fixture.h"
#include "testing/test_util.h"

namespace granary::testing {
namespace {

namespace sp = sidecar_protocol;
using namespace std::chrono_literals;

// A bare client: frames out, frames in, the arena mapped read-only.
class RawClient {
 public:
  static Result<RawClient> Connect(const std::string& socket) {
    RawClient c;
    GRANARY_ASSIGN_OR_RETURN(c.fd_, ConnectUnix(socket, 5s));
    timeval tv{20, 0};
    ::setsockopt(c.fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return c;
  }
  RawClient() = default;
  RawClient(RawClient&& o) noexcept
      : fd_(std::move(o.fd_)),
        arena_(o.arena_),
        arena_size_(o.arena_size_),
        next_id_(o.next_id_),
        version_(o.version_),
        hello_done_(o.hello_done_) {
    o.arena_ = nullptr;
  }
  ~RawClient() {
    if (arena_ != nullptr) ::munmap(arena_, arena_size_);
  }

  Status SendRaw(std::string_view bytes) {
    while (!bytes.empty()) {
      GRANARY_ASSIGN_OR_RETURN(size_t n, SendWithFds(fd_.get(), bytes));
      bytes.remove_prefix(n);
    }
    return Status::Ok();
  }

  // The next reply frame, decoded; `fds` gets any descriptor that came with it.
  Result<sp::Reply> Receive(std::vector<ScopedFd>* fds = nullptr) {
    while (!decoder_.has_frame()) {
      char buf[65536];
      std::vector<ScopedFd> got;
      GRANARY_ASSIGN_OR_RETURN(size_t n,
                               ReceiveWithFds(fd_.get(), std::span<char>(buf, sizeof(buf)), &got));
      if (n == 0) return Status::Unavailable("the sidecar closed the connection");
      for (auto& f : got) {
        if (fds != nullptr) fds->push_back(std::move(f));
      }
      std::string_view data(buf, n);
      while (!data.empty()) {
        GRANARY_ASSIGN_OR_RETURN(size_t used, decoder_.Feed(data));
        data.remove_prefix(used);
        if (decoder_.has_frame() && !data.empty()) pending_.append(data);  // not expected
        if (decoder_.has_frame()) break;
      }
    }
    return sp::DecodeReply(decoder_.TakeFrame());
  }

  // Frames go out in the version HELLO agreed on (before it, this build's newest).
  Result<sp::Reply> Call(const sp::Request& request, std::vector<ScopedFd>* fds = nullptr) {
    GRANARY_ASSIGN_OR_RETURN(std::string bytes,
                             sp::EncodeRequest(next_id_++, request, {}, version_));
    GRANARY_RETURN_IF_ERROR(SendRaw(bytes));
    return Receive(fds);
  }

  // HELLO offering versions 1..max_version.
  Result<sp::HelloReply> Hello(uint16_t max_version = sp::kMaxVersion) {
    GRANARY_ASSIGN_OR_RETURN(sp::Reply hello, Call(sp::Hello{1, max_version, "raw-test"}));
    if (auto* e = std::get_if<sp::Error>(&hello)) return e->status;
    if (!std::holds_alternative<sp::HelloReply>(hello)) return Status::Internal("no HELLO_REPLY");
    hello_done_ = true;
    version_ = std::get<sp::HelloReply>(hello).version;
    return std::get<sp::HelloReply>(hello);
  }

  // HELLO (unless done) + OPEN; maps the arena.
  Result<sp::OpenReply> Open(const std::string& dataset) {
    if (!hello_done_) GRANARY_RETURN_IF_ERROR(Hello().status());
    std::vector<ScopedFd> fds;
    GRANARY_ASSIGN_OR_RETURN(sp::Reply open, Call(sp::Open{dataset}, &fds));
    if (auto* e = std::get_if<sp::Error>(&open)) return e->status;
    auto reply = std::get<sp::OpenReply>(open);
    if (fds.size() != 1)
      return Status::Internal("OPEN_REPLY came with " + std::to_string(fds.size()) + " fds");
    void* map = ::mmap(nullptr, reply.arena_bytes, PROT_READ, MAP_SHARED, fds[0].get(), 0);
    if (map == MAP_FAILED) return Status::FromErrno(errno, "mmap the arena");
    arena_ = static_cast<char*>(map);
    arena_size_ = reply.arena_bytes;
    return reply;
  }

  Result<sp::Samples> Get(std::vector<uint32_t> ids, std::vector<uint64_t> release = {}) {
    GRANARY_ASSIGN_OR_RETURN(sp::Reply r, Call(sp::Get{std::move(release), std::move(ids), 0}));
    if (auto* e = std::get_if<sp::Error>(&r)) return e->status;
    return std::get<sp::Samples>(r);
  }

  std::string_view Bytes(const sp::SampleItem& item) const {
    return std::string_view(arena_ + item.offset, item.length);
  }
  int fd() const { return fd_.get(); }

 private:
  ScopedFd fd_;
  sp::FrameDecoder decoder_;
  std::string pending_;
  char* arena_ = nullptr;
  uint64_t arena_size_ = 0;
  uint64_t next_id_ = 1;
  uint16_t version_ = sp::kMaxVersion;
  bool hello_done_ = false;
};

class SidecarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = CacheCluster::Create();
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
    ASSERT_OK(cluster_->StartNodes(2));
    DatasetOptions d;
    d.files = 300;
    d.min_size = 500;
    d.max_size = 5000;
    auto ds = cluster_->CreateDataset(d);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    ds_ = std::move(*ds);
    ASSERT_TRUE(cluster_->WaitForPhase(ds_.name, DatasetPhase::kReady).ok());
    SidecarOptions o;
    o.store_url = cluster_->store_url();
    o.local_node_id = cluster_->node(0).id();
    o.window_bytes = "1MiB";
    o.arena_bytes = "32MiB";
    o.window_samples = 64;
    sidecar_ = std::make_unique<SidecarProcess>(o, cluster_->dir().path() + "/sidecar");
    ASSERT_OK(sidecar_->StartAndWaitReady());
  }

  RawClient Client() {
    auto c = RawClient::Connect(sidecar_->socket_path());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(*c);
  }

  // Reads every sample through `c` (open on ds_) and checks its bytes.
  void ExpectWholeDataset(RawClient& c) {
    std::vector<uint64_t> release;
    for (uint32_t first = 0; first < ds_.sample_count(); first += 32) {
      std::vector<uint32_t> ids;
      for (uint32_t id = first; id < std::min<size_t>(first + 32, ds_.sample_count()); ++id)
        ids.push_back(id);
      auto got = c.Get(ids, release);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(got->items.size(), ids.size());
      release.clear();
      for (const auto& item : got->items) {
        ASSERT_TRUE(item.status.ok()) << item.id << ": " << item.status.ToString();
        ASSERT_EQ(c.Bytes(item), ds_.contents[item.id]) << "sample " << item.id;
        release.push_back(item.token);
      }
    }
    ASSERT_TRUE(c.Get({0}, release).ok());
  }

  std::unique_ptr<CacheCluster> cluster_;
  TestDataset ds_;
  std::unique_ptr<SidecarProcess> sidecar_;
};

// What the Kubernetes webhook relies on: the store URL from a mounted file
// and the node from --local-node, checked with --check; bad values exit 2.
TEST(SidecarCommandLineTest, StoreFileAndLocalNodeFromTheCommandLine) {
  TempDir dir;
  dir.WriteFile("store/url", "redis://127.0.0.1:6379\n");
  dir.WriteFile("sidecar.yaml", "socket: " + dir.Join("s.sock") +
                                    "\nmetadata_store_file: " + dir.Join("store/url") + "\n");
  const auto run = [&](std::vector<std::string> args) -> std::pair<ExitStatus, std::string> {
    DaemonProcessOptions o;
    o.binary = SidecarBinary();
    o.args = std::move(args);
    o.log_path = dir.Join("sidecar.log");
    o.name = "granary-sidecar";
    Result<std::unique_ptr<DaemonProcess>> p = DaemonProcess::Start(std::move(o));
    EXPECT_OK(p);
    if (!p.ok()) return {};
    Result<ExitStatus> exit = (*p)->Wait(30s);
    EXPECT_OK(exit);
    return {exit.ok() ? *exit : ExitStatus{}, (*p)->ReadLog()};
  };
  const std::string config = dir.Join("sidecar.yaml");
  auto [good, good_log] = run({"--config", config, "--check", "--local-node", "gpu-7"});
  EXPECT_TRUE(good.ExitedWith(0)) << good.ToString() << good_log;
  EXPECT_THAT(good_log, ::testing::HasSubstr("local node gpu-7"));
  EXPECT_THAT(good_log, ::testing::Not(::testing::HasSubstr("redis://")))
      << "--check does not print the store URL (it may hold a password)";

  auto [bad_node, bad_node_log] = run({"--config", config, "--check", "--local-node", "-x"});
  EXPECT_TRUE(bad_node.ExitedWith(2)) << bad_node.ToString();
  EXPECT_THAT(bad_node_log, ::testing::HasSubstr("--local-node"));

  dir.WriteFile("store/url", "mysql://x\n");
  auto [bad_url, bad_url_log] = run({"--config", config, "--check"});
  EXPECT_TRUE(bad_url.ExitedWith(2)) << bad_url.ToString();
  EXPECT_THAT(bad_url_log, ::testing::HasSubstr("does not hold a store URL"));
}

TEST_F(SidecarTest, ServesEveryByteStatsLooksUpAndWalksThePlan) {
  RawClient c = Client();
  auto open = c.Open(ds_.name);
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  EXPECT_EQ(open->sample_count, ds_.sample_count());
  EXPECT_EQ(open->manifest_id, ds_.manifest_id);
  ExpectWholeDataset(c);

  // STAT and LOOKUP come from the manifest.
  auto stat = c.Call(sp::Stat{5, 3});
  ASSERT_TRUE(stat.ok());
  auto& entries = std::get<sp::StatReply>(*stat).entries;
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].path, ds_.manifest->PathOf(5));
  EXPECT_EQ(entries[1].size, ds_.contents[6].size());
  auto lookup = c.Call(sp::Lookup{
      {ds_.manifest->PathOf(7), "../etc/passwd", "/etc/passwd", "a/../b", "no/such/file"}});
  ASSERT_TRUE(lookup.ok());
  auto& items = std::get<sp::LookupReply>(*lookup).items;
  ASSERT_EQ(items.size(), 5u);
  EXPECT_TRUE(items[0].status.ok());
  EXPECT_EQ(items[0].id, 7u);
  EXPECT_EQ(items[1].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(items[2].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(items[3].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(items[4].status.code(), StatusCode::kNotFound);
  auto past = c.Call(sp::Stat{100000, 1});
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE(std::holds_alternative<sp::Error>(*past));

  // SET_PLAN, then NEXT walks exactly the rank's plan.
  sp::SetPlan plan;
  plan.plan_id = "t";
  plan.seed = 11;
  plan.world_size = 2;
  plan.rank = 1;
  ASSERT_TRUE(std::holds_alternative<sp::Ok>(*c.Call(plan)));
  PlanSpec spec;
  spec.seed = 11;
  spec.world_size = 2;
  spec.rank = 1;
  auto expected = Plan::Create(*ds_.manifest, spec);
  ASSERT_TRUE(expected.ok());
  std::vector<uint32_t> walked;
  std::vector<uint64_t> release;
  for (int guard = 0; guard < 100; ++guard) {
    auto r = c.Call(sp::Next{release, 16});
    ASSERT_TRUE(r.ok());
    auto& s = std::get<sp::Samples>(*r);
    release.clear();
    for (const auto& item : s.items) {
      ASSERT_TRUE(item.status.ok());
      ASSERT_EQ(c.Bytes(item), ds_.contents[item.id]);
      walked.push_back(item.id);
      release.push_back(item.token);
    }
    if (s.end_of_epoch) break;
  }
  EXPECT_EQ(walked, std::vector<uint32_t>(expected->samples().begin(), expected->samples().end()));
  // The plan reached the store, for the cache nodes' staging order (written
  // after SET_PLAN's answer, off the request path).
  EXPECT_TRUE(WaitFor([&] {
    auto plans = cluster_->store().ListPlans(ds_.name);
    return plans.ok() && plans->size() == 1u;
  })) << "the plan never reached the store";
  EXPECT_GT(*sidecar_->MetricValue("granary_sidecar_served_samples_total", {{"from", "prefetch"}}),
            0)
      << "samples already in the arena are kept for the plan's window";
}

// DIRECTORIES lists what the snapshot walked: nested directories, one that
// holds no file at all, one holding only an empty directory, with their modes;
// paged, the root not listed, sorted as the manifest holds them.
TEST_F(SidecarTest, ListsEveryDirectoryIncludingEmptyOnes) {
  namespace fs = std::filesystem;
  const std::string root = cluster_->dir().Join("src-tree");
  const std::vector<std::pair<std::string, fs::perms>> dirs = {
      {"a", fs::perms(0755)},           {"a/b", fs::perms(0750)},   {"a/b/c", fs::perms(0700)},
      {"a-z", fs::perms(0755)},         {"empty", fs::perms(0705)}, {"only-dirs", fs::perms(0755)},
      {"only-dirs/x", fs::perms(0755)}, {"z", fs::perms(0755)},
  };
  for (const auto& [rel, perms] : dirs) fs::create_directories(root + "/" + rel);
  WriteAll(root + "/top.txt", "at the root");
  WriteAll(root + "/a/1.bin", "one");
  WriteAll(root + "/a/b/c/2.bin", "two");
  WriteAll(root + "/a-z/3.bin", "three");
  WriteAll(root + "/z/4.bin", "four");
  for (const auto& [rel, perms] : dirs) fs::permissions(root + "/" + rel, perms);
  auto manifest = cluster_->RegisterTree("tree", root);
  ASSERT_OK(manifest);
  ASSERT_EQ((*manifest)->sample_count(), 5u);

  RawClient c = Client();
  auto hello = c.Hello();
  ASSERT_OK(hello);
  EXPECT_EQ(hello->version, sp::kMaxVersion);
  // Before OPEN: an error, the connection kept.
  auto early = c.Call(sp::Directories{0, 10});
  ASSERT_OK(early);
  ASSERT_TRUE(std::holds_alternative<sp::Error>(*early));
  EXPECT_EQ(std::get<sp::Error>(*early).status.code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::get<sp::Error>(*early).closing);
  ASSERT_OK(c.Open("tree"));

  // Byte-wise path order: "a-z" sorts between "a" and "a/b" ('-' < '/').
  std::vector<sp::DirectoryItem> expected;
  for (const char* rel : {"a", "a-z", "a/b", "a/b/c", "empty", "only-dirs", "only-dirs/x", "z"}) {
    const auto mode =
        static_cast<uint16_t>(fs::status(root + "/" + rel).permissions() & fs::perms::mask);
    expected.push_back({rel, mode});
  }
  std::vector<sp::DirectoryItem> got;
  for (uint32_t first = 0; first < expected.size(); first += 3) {
    auto page = c.Call(sp::Directories{first, 3});
    ASSERT_OK(page);
    ASSERT_TRUE(std::holds_alternative<sp::DirectoriesReply>(*page))
        << std::get<sp::Error>(*page).status.ToString();
    const auto& reply = std::get<sp::DirectoriesReply>(*page);
    EXPECT_EQ(reply.first, first);
    EXPECT_EQ(reply.total, expected.size());
    EXPECT_EQ(reply.entries.size(), std::min<size_t>(3, expected.size() - first));
    got.insert(got.end(), reply.entries.begin(), reply.entries.end());
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got[4].mode, 0705) << "the empty directory's own mode";

  // At the end: an empty page; past it: kOutOfRange naming the count.
  auto end = c.Call(sp::Directories{static_cast<uint32_t>(expected.size()), 5});
  ASSERT_OK(end);
  ASSERT_TRUE(std::holds_alternative<sp::DirectoriesReply>(*end));
  EXPECT_TRUE(std::get<sp::DirectoriesReply>(*end).entries.empty());
  auto past = c.Call(sp::Directories{9, 1});
  ASSERT_OK(past);
  ASSERT_TRUE(std::holds_alternative<sp::Error>(*past));
  EXPECT_EQ(std::get<sp::Error>(*past).status.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(std::get<sp::Error>(*past).status.message(), ::testing::HasSubstr("8 directories"));
  EXPECT_OK(c.Call(sp::Ping{}).status());

  // A connection that agreed on version 1 gets no DIRECTORIES: the version 2
  // frame is refused with an error naming both versions; the connection stays.
  RawClient old = Client();
  auto old_hello = old.Hello(1);
  ASSERT_OK(old_hello);
  EXPECT_EQ(old_hello->version, 1);
  ASSERT_OK(old.Open("tree"));
  auto v2_frame = sp::EncodeRequest(98, sp::Directories{0, 10}, {}, 2);
  ASSERT_OK(v2_frame);
  ASSERT_OK(old.SendRaw(*v2_frame));
  auto refused = old.Receive();
  ASSERT_OK(refused);
  ASSERT_TRUE(std::holds_alternative<sp::Error>(*refused));
  EXPECT_EQ(std::get<sp::Error>(*refused).status.code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(
      std::get<sp::Error>(*refused).status.message(),
      ::testing::AllOf(::testing::HasSubstr("version 2"), ::testing::HasSubstr("version 1")));
  EXPECT_FALSE(std::get<sp::Error>(*refused).closing);
  auto pong = old.Call(sp::Ping{});  // a version 1 frame
  ASSERT_OK(pong);
  EXPECT_TRUE(std::holds_alternative<sp::Pong>(*pong));
}

// A manifest of format version 1 (tests/core/manifest_test.cc,
// Version1ManifestsStillRead: "cls/a.jpg", "cls/b.jpg", "top") recorded no
// directory table of its own: DIRECTORIES lists what its files imply, 0555.
TEST_F(SidecarTest, ListsTheDirectoriesAVersion1ManifestImplies) {
  const std::string bytes = testing::Version1ManifestBytes();
  auto manifest = Manifest::Decode(bytes);
  ASSERT_OK(manifest);
  ASSERT_EQ(manifest->Encode(), bytes);  // stored as it was: version 1
  ASSERT_OK(cluster_->RegisterManifest("old", *manifest));

  RawClient c = Client();
  ASSERT_OK(c.Open("old"));
  auto reply = c.Call(sp::Directories{0, 100});
  ASSERT_OK(reply);
  ASSERT_TRUE(std::holds_alternative<sp::DirectoriesReply>(*reply))
      << std::get<sp::Error>(*reply).status.ToString();
  const auto& dirs = std::get<sp::DirectoriesReply>(*reply);
  EXPECT_EQ(dirs.total, 1u);
  EXPECT_EQ(dirs.entries, (std::vector<sp::DirectoryItem>{{"cls", kDefaultDirectoryMode}}));
}

TEST_F(SidecarTest, ErrorsForBadRequestsKeepTheConnection) {
  RawClient c = Client();
  // Before HELLO: an error, and the connection closes.
  auto early = c.Call(sp::Open{ds_.name});
  ASSERT_TRUE(early.ok());
  ASSERT_TRUE(std::holds_alternative<sp::Error>(*early));
  EXPECT_TRUE(std::get<sp::Error>(*early).closing);

  RawClient d = Client();
  auto missing = d.Open("no-such-dataset");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("granary dataset create"), std::string::npos);
  auto get = d.Get({1});
  EXPECT_EQ(get.status().code(), StatusCode::kFailedPrecondition) << "GET before OPEN";
  ASSERT_TRUE(d.Open(ds_.name).ok()) << "the connection survived the errors";
  auto bad = d.Get({1, 99999});
  ASSERT_TRUE(bad.ok());
  EXPECT_TRUE(bad->items[0].status.ok());
  EXPECT_EQ(bad->items[1].status.code(), StatusCode::kOutOfRange);
  auto twice = d.Call(sp::Open{ds_.name});
  ASSERT_TRUE(twice.ok());
  EXPECT_TRUE(std::holds_alternative<sp::Error>(*twice));
  auto next = d.Call(sp::Next{{}, 4});
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(std::holds_alternative<sp::Error>(*next)) << "NEXT before SET_PLAN";
  sp::SetPlan plan;
  plan.plan_id = "bad";
  plan.start_position = 1u << 30;
  auto far = d.Call(plan);
  ASSERT_TRUE(far.ok());
  EXPECT_TRUE(std::holds_alternative<sp::Error>(*far)) << "start_position past the plan";
}

TEST_F(SidecarTest, HostileBytesNeverTakeItDown) {
  RawClient reader = Client();
  ASSERT_TRUE(reader.Open(ds_.name).ok());
  std::mt19937 rng(42);
  for (int round = 0; round < 20; ++round) {
    RawClient evil = Client();
    std::string junk(static_cast<size_t>(rng() % 2000) + 1, '\0');
    for (char& ch : junk) ch = static_cast<char>(rng());
    if (round % 4 == 1) junk.replace(0, 4, "GRSC");  // a magic, then garbage
    ASSERT_OK(evil.SendRaw(junk));
  }
  {
    // A header announcing a huge body, then nothing.
    RawClient evil = Client();
    std::string frame = *sp::EncodeRequest(1, sp::Hello{1, 1, "x"});
    frame[12] = '\xff';
    frame[13] = '\xff';
    frame[14] = '\xff';
    frame[15] = '\x7f';
    ASSERT_OK(evil.SendRaw(frame));
    auto r = evil.Receive();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(std::holds_alternative<sp::Error>(*r));
    EXPECT_TRUE(std::get<sp::Error>(*r).closing);
  }
  {
    // Half a frame, then the client goes away.
    RawClient evil = Client();
    std::string frame = *sp::EncodeRequest(1, sp::Hello{1, 1, "x"});
    ASSERT_OK(evil.SendRaw(std::string_view(frame).substr(0, 10)));
  }
  ExpectWholeDataset(reader);
  EXPECT_TRUE(sidecar_->Running());
  EXPECT_GT(*sidecar_->MetricValue("granary_sidecar_request_errors_total", {{"class", "framing"}}),
            0);
}

TEST_F(SidecarTest, AKilledClientsPinsAreReclaimed) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = RawClient::Connect(sidecar_->socket_path());
    if (!c.ok() || !c->Open(ds_.name).ok()) ::_exit(2);
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 50; ++i) ids.push_back(i);
    if (!c->Get(ids).ok()) ::_exit(3);
    ::pause();  // killed while holding 50 pins
    ::_exit(0);
  }
  auto held = sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v >= 50; });
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_GT(*sidecar_->MetricValue("granary_sidecar_pinned_bytes"), 0);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(
      sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 0; }).ok());
  EXPECT_TRUE(
      sidecar_->WaitForMetric("granary_sidecar_pinned_bytes", {}, [](double v) { return v == 0; })
          .ok());
}

TEST_F(SidecarTest, ACacheNodeKilledMidReadCostsNoWrongByte) {
  RawClient c = Client();
  ASSERT_TRUE(c.Open(ds_.name).ok());
  auto first = c.Get({0, 1, 2, 3});
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(cluster_->node(1).Kill().ok());
  ExpectWholeDataset(c);
  auto fetched = sidecar_->WaitForMetric(
      "granary_sidecar_fetched_samples_total", {},
      [&](double v) { return v >= static_cast<double>(ds_.sample_count()); });
  EXPECT_TRUE(fetched.ok()) << fetched.status().ToString() << "\n"
                            << sidecar_->Get("/metrics")->body;
}

// A dataset's node list (DatasetSpec::nodes) is followed while it is open:
// placed on no node it is read from the source, and once placed on the
// pool's nodes (a Slurm job's prologs add them) from the nodes.
TEST_F(SidecarTest, ADatasetsNodeListIsFollowedWhileItIsOpen) {
  DatasetOptions d;
  d.name = "moving";
  d.files = 80;
  d.min_size = 700;
  d.max_size = 900;
  d.nodes = std::vector<std::string>{};
  auto moving = cluster_->CreateDataset(d);
  ASSERT_OK(moving);
  RawClient c = Client();
  ASSERT_TRUE(c.Open(moving->name).ok());
  auto from = [&](const std::string& where) {
    auto v = sidecar_->MetricValue("granary_sidecar_fetched_samples_total", {{"from", where}});
    return v.ok() ? *v : 0.0;
  };
  const double source_before = from("source");
  for (uint32_t id = 0; id < 20; ++id) {
    auto got = c.Get({id});
    ASSERT_TRUE(got.ok() && got->items[0].status.ok());
    EXPECT_EQ(c.Bytes(got->items[0]), moving->contents[id]);
  }
  // (The metrics are refreshed every 250 ms.)
  EXPECT_TRUE(WaitFor([&] { return from("source") - source_before >= 20.0; }, 10s))
      << "placed on no node: read from the source\n"
      << sidecar_->Get("/metrics")->body;

  auto record = cluster_->store().GetDataset(moving->name);
  ASSERT_OK(record);
  record->spec.nodes.reset();
  ASSERT_OK(cluster_->store().UpdateDataset(*record));
  ASSERT_OK(cluster_->WaitForPhase(moving->name, DatasetPhase::kReady));
  const double nodes_before = from("local_node") + from("peer");
  // Within a refresh interval the sidecar asks the nodes.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (uint32_t id = 20; id < 80; ++id) {
          auto got = c.Get({id});
          if (!got.ok() || !got->items[0].status.ok() ||
              c.Bytes(got->items[0]) != moving->contents[id]) {
            return false;
          }
          if (from("local_node") + from("peer") > nodes_before) return true;
        }
        return false;
      },
      20s))
      << sidecar_->Get("/metrics")->body;
}

TEST_F(SidecarTest, TwoDatasetsNeverShareBytes) {
  DatasetOptions d;
  d.name = "other";
  d.files = 40;
  d.min_size = 700;
  d.max_size = 900;
  auto other = cluster_->CreateDataset(d);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  RawClient a = Client();
  RawClient b = Client();
  ASSERT_TRUE(a.Open(ds_.name).ok());
  ASSERT_TRUE(b.Open(other->name).ok());
  for (uint32_t id = 0; id < 40; ++id) {
    auto x = a.Get({id});
    auto y = b.Get({id});
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_TRUE(x->items[0].status.ok() && y->items[0].status.ok());
    EXPECT_EQ(a.Bytes(x->items[0]), ds_.contents[id]);
    EXPECT_EQ(b.Bytes(y->items[0]), other->contents[id]);
  }
}

// ---- idle and greedy clients ----

// Whether the sidecar admitted `c` (HELLO answered) or refused it at accept
// (an ERROR ResourceExhausted, then end of stream); any other outcome is an
// error.
Result<bool> Admitted(RawClient& c) {
  Result<sp::HelloReply> hello = c.Hello();
  if (hello.ok()) return true;
  if (hello.status().code() == StatusCode::kResourceExhausted) return false;
  // The HELLO may not have gone out (the sidecar had closed already); the
  // refusal is still there to read.
  Result<sp::Reply> r = c.Receive();
  if (r.ok()) {
    if (auto* e = std::get_if<sp::Error>(&*r);
        e != nullptr && e->status.code() == StatusCode::kResourceExhausted) {
      return false;
    }
  }
  return hello.status();
}

// Before: 256 connections (max_clients) of one user refused every other
// client of the sidecar, root's too.
TEST_F(SidecarTest, OneUidAtItsCapLocksOutNeitherRootNorAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become other users";
  // The socket is 0660, group root: the children keep gid 0 and drop their
  // uid, as training processes in the socket's group would be.
  ASSERT_EQ(::chmod(cluster_->dir().path().c_str(), 0711), 0);
  ASSERT_EQ(::chmod((cluster_->dir().path() + "/sidecar").c_str(), 0711), 0);
  const std::string socket = sidecar_->socket_path();
  auto greedy = ChildProcess::Start([socket](int control) {
    if (::setgroups(0, nullptr) != 0 || ::setuid(65534) != 0) return 10;
    std::vector<RawClient> held;
    int admitted = 0;
    for (int i = 0; i < 256; ++i) {
      Result<RawClient> c = RawClient::Connect(socket);
      if (!c.ok()) return 11;
      Result<bool> in = Admitted(*c);
      if (!in.ok()) return 12;
      admitted += *in ? 1 : 0;
      held.push_back(std::move(*c));
    }
    if (::write(control, "r", 1) != 1) return 13;
    pollfd p{control, POLLIN, 0};
    (void)::poll(&p, 1, 120000);  // hold them until the parent is done
    return admitted == 64 ? 0 : 14;
  });
  ASSERT_OK(greedy);
  ASSERT_OK((*greedy)->AwaitReady(60s));

  // Root gets in and reads.
  RawClient root = Client();
  Result<bool> in = Admitted(root);
  ASSERT_OK(in);
  ASSERT_TRUE(*in) << "root is locked out by uid 65534's connections";
  ASSERT_OK(root.Open(ds_.name));
  Result<sp::Samples> got = root.Get({0});
  ASSERT_OK(got);
  ASSERT_EQ(got->items.size(), 1u);
  EXPECT_EQ(root.Bytes(got->items[0]), ds_.contents[0]);

  // So does another user.
  auto other = ChildProcess::Start([socket](int) {
    if (::setgroups(0, nullptr) != 0 || ::setuid(65533) != 0) return 10;
    Result<RawClient> c = RawClient::Connect(socket);
    if (!c.ok()) return 11;
    Result<bool> admitted = Admitted(*c);
    if (!admitted.ok()) return 12;
    return *admitted ? 0 : 13;
  });
  ASSERT_OK(other);
  Result<int> code = (*other)->Wait(60s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "uid 65533: 10 set-up, 11 connect, 12 error, 13 refused";

  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_rejected_clients_total",
                                    {{"reason", "per_uid"}}, [](double v) { return v == 192; }));
  (*greedy)->RequestStop();
  Result<int> greedy_code = (*greedy)->Wait(60s);
  ASSERT_OK(greedy_code);
  EXPECT_EQ(*greedy_code, 0) << "uid 65534: 10 set-up, 11 connect, 12 error, 14 not 64 admitted";
}

// Before: idle connections were kept forever, so max_clients of them (of the
// same user) refused every new client for good.
TEST_F(SidecarTest, IdleClientsAreClosedTheirPinsDroppedAndTheirPlacesFreed) {
  ASSERT_OK(sidecar_->Terminate());
  sidecar_->mutable_options().extra_yaml = "idle_timeout: 1s\nmax_clients: 4\n";
  ASSERT_OK(sidecar_->StartAndWaitReady());

  RawClient pinned = Client();
  ASSERT_OK(pinned.Open(ds_.name));
  Result<sp::Samples> got = pinned.Get({0, 1, 2});
  ASSERT_OK(got);
  ASSERT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v >= 3; }));
  RawClient busy = Client();
  ASSERT_OK(busy.Hello());
  std::vector<RawClient> idle;
  for (int i = 0; i < 2; ++i) idle.push_back(Client());
  // All four places are taken.
  {
    RawClient fifth = Client();
    Result<bool> in = Admitted(fifth);
    ASSERT_OK(in);
    EXPECT_FALSE(*in);
  }

  // A client that keeps asking is never idle; the others are closed after
  // about a second, the pinned one told why.
  for (int i = 0; i < 10; ++i) {
    Result<sp::Reply> pong = busy.Call(sp::Ping{});
    ASSERT_OK(pong);
    ASSERT_TRUE(std::holds_alternative<sp::Pong>(*pong));
    std::this_thread::sleep_for(300ms);
  }
  Result<sp::Reply> told = pinned.Receive();
  ASSERT_OK(told);
  auto* error = std::get_if<sp::Error>(&*told);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(error->status.message(), ::testing::HasSubstr("idle_timeout"));
  EXPECT_TRUE(error->closing);
  EXPECT_EQ(pinned.Receive().status().code(), StatusCode::kUnavailable) << "then end of stream";
  for (RawClient& c : idle) {
    Result<sp::Reply> r = c.Receive();
    ASSERT_OK(r);
    ASSERT_TRUE(std::holds_alternative<sp::Error>(*r));
    EXPECT_EQ(c.Receive().status().code(), StatusCode::kUnavailable);
  }
  // Its pins went with it, and the places are free again.
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_pins", {}, [](double v) { return v == 0; }));
  EXPECT_OK(sidecar_->WaitForMetric("granary_sidecar_idle_closes_total", {},
                                    [](double v) { return v == 3; }));
  RawClient again = Client();
  Result<bool> in = Admitted(again);
  ASSERT_OK(in);
  EXPECT_TRUE(*in);
}

}  // namespace
}  // namespace granary::testing

// FabricServer (granary/cachenode/fabric_server.h) in process, over the libfabric
// tcp provider on loopback, answering from a ReadService of real files: what
// the daemon's suite (tests/integration/fabric_server_integration_test.cc) cannot reach.
// File ranges larger than the connection's buffer written into the window
// slice by slice next to memory pieces; the reply budget making a READ wait
// for another's reply; the handshake and idle timeouts; Stop letting a
// request in progress finish and closing idle connections.

#include "granary/cachenode/fabric_server.h"

#include <fcntl.h>
#include <gmock/gmock.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/file.h"
#include "granary/fabric/endpoint.h"
#include "granary/protocol/protocol_format.h"
#include "testing/test_util.h"

namespace granary {
namespace {

namespace pf = protocol_format;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const ContentId kManifest{0x1234, 0x5678};
constexpr char kDataset[] = "imagenet";

// One file of random bytes. A sample item is answered with a file range of
// it (id = offset / 1 MiB), a chunk range with memory read from it. Read can
// be gated: calls wait (counted in `entered`) until the gate opens.
class FileService : public ReadService {
 public:
  explicit FileService(const TempDir& dir, size_t bytes = 3 * (1u << 20) + 12345) {
    std::mt19937_64 rng(7);
    bytes_.resize(bytes);
    for (char& c : bytes_) c = static_cast<char>(rng());
    dir.WriteFile("data", bytes_);
    auto fd = OpenFile(dir.Join("data"), O_RDONLY);
    EXPECT_OK(fd);
    fd_ = std::make_shared<ScopedFd>(std::move(*fd));
  }

  Result<ReadAnswer> Read(const ReadRequest& request) override {
    {
      std::unique_lock lock(mu_);
      ++entered_;
      ++in_call_;
      max_in_call_ = std::max(max_in_call_, in_call_);
      cv_.notify_all();
      cv_.wait(lock, [&] { return !gated_; });
      --in_call_;
    }
    ReadAnswer answer;
    answer.Hold(fd_);
    for (const ReadItem& item : request.items) {
      if (item.offset + item.length > bytes_.size()) {
        answer.AddError(Status::OutOfRange("past the file's end"));
      } else if (item.kind == ReadKind::kSample) {
        answer.AddFileRange(fd_->get(), item.offset, item.length);
      } else {
        answer.AddBytes(bytes_.substr(item.offset, item.length));
      }
    }
    return answer;
  }
  Result<StatReply> Stat(const StatRequest&) override {
    return StatReply{NodeState::kServing, {{"samples", 1}}};
  }

  std::string_view bytes(uint64_t offset, uint64_t length) const {
    return std::string_view(bytes_).substr(offset, length);
  }
  void Gate(bool closed) {
    std::lock_guard lock(mu_);
    gated_ = closed;
    cv_.notify_all();
  }
  bool WaitEntered(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return entered_ >= n; });
  }
  int entered() {
    std::lock_guard lock(mu_);
    return entered_;
  }
  int max_in_call() {
    std::lock_guard lock(mu_);
    return max_in_call_;
  }

 private:
  std::string bytes_;
  std::shared_ptr<ScopedFd> fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool gated_ = false;   // guarded by mu_
  int entered_ = 0;      // guarded by mu_
  int in_call_ = 0;      // guarded by mu_
  int max_in_call_ = 0;  // guarded by mu_
};

FabricServerOptions Options() {
  FabricServerOptions o;
  o.listen = "127.0.0.1:0";
  o.provider = "tcp";
  o.server.node_name = "fabric-node";
  o.server.drain_timeout = 5s;
  return o;
}

// A reader's connection, message by message.
class Reader {
 public:
  explicit Reader(uint16_t port) {
    fabric::EndpointOptions options;
    options.max_message_bytes =
        fabric::kWindowBytes + pf::kFrameHeaderSize + ProtocolLimits{}.max_body_bytes;
    auto endpoint =
        fabric::Endpoint::Connect(NetAddress{"127.0.0.1", port}, options, Clock::now() + 5s);
    EXPECT_OK(endpoint);
    if (endpoint.ok()) endpoint_ = std::move(*endpoint);
  }
  bool ok() const { return endpoint_ != nullptr; }
  fabric::Endpoint& endpoint() { return *endpoint_; }

  Status Send(const RequestMessage& request, const fabric::RemoteWindow& window = {},
              uint16_t version = pf::kMaxVersion) {
    GRANARY_ASSIGN_OR_RETURN(std::string frame,
                             EncodeRequest(++id_, request, EncodeOptions{version, {}}));
    return endpoint_->Send(fabric::EncodeRequestMessage(window, frame), Clock::now() + 5s);
  }
  Result<ResponseMessage> Receive(std::chrono::milliseconds timeout = 10s) {
    std::string message;
    GRANARY_RETURN_IF_ERROR(endpoint_->Receive(message, Clock::now() + timeout));
    FrameDecoder decoder(FrameDirection::kResponses, ProtocolLimits{}, PayloadMode::kDetached);
    GRANARY_ASSIGN_OR_RETURN(size_t used, decoder.Feed(message));
    if (!decoder.has_frame() || used != message.size()) {
      return Status::InvalidArgument("not one frame");
    }
    return DecodeResponse(decoder.TakeFrame());
  }
  Result<ResponseMessage> Call(const RequestMessage& request,
                               const fabric::RemoteWindow& window = {},
                               uint16_t version = pf::kMaxVersion) {
    GRANARY_RETURN_IF_ERROR(Send(request, window, version));
    return Receive();
  }
  Status Hello() {
    GRANARY_ASSIGN_OR_RETURN(
        ResponseMessage reply,
        Call(HelloRequest{pf::kMinVersion, pf::kMaxVersion, "reader"}, {}, pf::kHandshakeVersion));
    return std::holds_alternative<HelloReply>(reply) ? Status::Ok()
                                                     : Status::Internal("no HELLO_REPLY");
  }

 private:
  std::unique_ptr<fabric::Endpoint> endpoint_;
  uint64_t id_ = 0;
};

ReadRequest Read(std::vector<ReadItem> items) {
  return ReadRequest{kDataset, kManifest, std::move(items)};
}

struct Fixture {
  explicit Fixture(FabricServerOptions options = Options()) {
    service = std::make_shared<FileService>(dir);
    auto started = FabricServer::Start(service, options);
    EXPECT_OK(started);
    if (started.ok()) server = std::move(*started);
  }
  TempDir dir;
  std::shared_ptr<FileService> service;
  std::unique_ptr<FabricServer> server;
};

TEST(FabricServerUnitTest, FileRangesLargerThanTheBufferAndMemoryLandInTheWindow) {
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  Reader reader(f.server->port());
  ASSERT_TRUE(reader.ok());
  ASSERT_OK(reader.Hello());
  // A file range of 2.5 slices, memory, another file range, over the whole READ.
  const uint64_t big = 2 * FabricServer::kFileSliceBytes + FabricServer::kFileSliceBytes / 2;
  ReadRequest read = Read({{ReadKind::kSample, 0, 100, static_cast<uint32_t>(big)},
                           {ReadKind::kChunkRange, 0, 7, 5000},
                           {ReadKind::kSample, 0, 3, 1}});
  auto window = reader.endpoint().Window(read.RequestedBytes());
  ASSERT_OK(window);
  auto reply = reader.Call(read, *window);
  ASSERT_OK(reply);
  ASSERT_TRUE(std::holds_alternative<ReadReply>(*reply));
  ASSERT_OK(CheckReadReply(read, std::get<ReadReply>(*reply)));
  std::string_view got = reader.endpoint().WindowBytes(read.RequestedBytes());
  EXPECT_TRUE(got.substr(0, big) == f.service->bytes(100, big));
  EXPECT_TRUE(got.substr(big, 5000) == f.service->bytes(7, 5000));
  EXPECT_TRUE(got.substr(big + 5000, 1) == f.service->bytes(3, 1));
  // The node's own STAT carries the service's entries and the front end's.
  auto stat = reader.Call(StatRequest{});
  ASSERT_OK(stat);
  ASSERT_TRUE(std::holds_alternative<StatReply>(*stat));
  std::map<std::string, uint64_t> entries;
  for (const StatEntry& e : std::get<StatReply>(*stat).entries) entries[e.key] = e.value;
  EXPECT_EQ(entries["samples"], 1u);
  EXPECT_EQ(entries["fabric_connections_open"], 1u);
  EXPECT_EQ(entries["fabric_rma_bytes_total"], read.RequestedBytes());
  // Counted once the send completed on the node's side, which may be just
  // after the reply arrived here.
  EXPECT_TRUE(WaitFor([&] { return f.server->Counters().requests_total == 3; }, 5s));
  FabricCounters c = f.server->Counters();
  EXPECT_EQ(c.rma_bytes_total, read.RequestedBytes());
  EXPECT_EQ(c.errors_total, 0u);
}

TEST(FabricServerUnitTest, AReadWaitsForTheReplyBudgetUntilAnotherReplyIsSent) {
  FabricServerOptions options = Options();
  options.server.reply_buffer_bytes = 1000;  // one of the READs below at a time
  Fixture f(options);
  ASSERT_NE(f.server, nullptr);
  Reader a(f.server->port());
  Reader b(f.server->port());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_OK(a.Hello());
  ASSERT_OK(b.Hello());
  ReadRequest read = Read({{ReadKind::kChunkRange, 0, 0, 600}});
  auto wa = a.endpoint().Window(600);
  auto wb = b.endpoint().Window(600);
  ASSERT_OK(wa);
  ASSERT_OK(wb);
  f.service->Gate(true);
  ASSERT_OK(a.Send(read, *wa));
  ASSERT_TRUE(f.service->WaitEntered(1));
  ASSERT_OK(b.Send(read, *wb));
  // B waits for the budget, not in the service.
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().reply_budget_waits_total == 1; }, 10s));
  EXPECT_EQ(f.service->entered(), 1);
  f.service->Gate(false);
  for (Reader* r : {&a, &b}) {
    auto reply = r->Receive();
    ASSERT_OK(reply);
    ASSERT_TRUE(std::holds_alternative<ReadReply>(*reply));
    EXPECT_TRUE(r->endpoint().WindowBytes(600) == f.service->bytes(0, 600));
  }
  EXPECT_EQ(f.service->max_in_call(), 1);
  EXPECT_EQ(f.service->entered(), 2);
}

TEST(FabricServerUnitTest, SilentAndIdleConnectionsAreClosed) {
  FabricServerOptions options = Options();
  options.server.handshake_timeout = 300ms;
  options.server.idle_timeout = 300ms;
  Fixture f(options);
  ASSERT_NE(f.server, nullptr);
  Reader silent(f.server->port());
  Reader idle(f.server->port());
  ASSERT_TRUE(silent.ok() && idle.ok());
  ASSERT_OK(idle.Hello());
  const auto start = Clock::now();
  for (Reader* r : {&silent, &idle}) {
    auto reply = r->Receive(5s);
    EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable) << reply.status().ToString();
  }
  EXPECT_LT(Clock::now() - start, 4s);
  EXPECT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 0; }, 5s));
  EXPECT_EQ(f.server->Counters().errors_total, 2u);  // two timeouts
}

TEST(FabricServerUnitTest, StopFinishesTheRequestInProgressAndClosesIdleConnections) {
  Fixture f;
  ASSERT_NE(f.server, nullptr);
  Reader busy(f.server->port());
  Reader idle(f.server->port());
  ASSERT_TRUE(busy.ok() && idle.ok());
  ASSERT_OK(busy.Hello());
  ASSERT_OK(idle.Hello());
  ReadRequest read = Read({{ReadKind::kSample, 0, 0, 4096}});
  auto window = busy.endpoint().Window(4096);
  ASSERT_OK(window);
  f.service->Gate(true);
  ASSERT_OK(busy.Send(read, *window));
  ASSERT_TRUE(f.service->WaitEntered(1));
  std::thread stopper([&] { f.server->Stop(); });
  // The idle connection is closed at once, while the READ is still held.
  auto closed = idle.Receive(5s);
  EXPECT_EQ(closed.status().code(), StatusCode::kUnavailable) << closed.status().ToString();
  std::this_thread::sleep_for(100ms);
  f.service->Gate(false);
  auto reply = busy.Receive();
  ASSERT_OK(reply);
  ASSERT_TRUE(std::holds_alternative<ReadReply>(*reply));
  EXPECT_TRUE(busy.endpoint().WindowBytes(4096) == f.service->bytes(0, 4096));
  stopper.join();
  EXPECT_EQ(f.server->Counters().connections_open, 0u);
  // Nothing more is served.
  EXPECT_FALSE(busy.Call(PingRequest{}).ok());
}

TEST(FabricServerUnitTest, StartRefusesBadOptionsSayingWhich) {
  auto service = std::make_shared<FileService>(TempDir());
  FabricServerOptions options = Options();
  options.listen = "no-port";
  auto bad = FabricServer::Start(service, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("fabric listen address"));
  options = Options();
  options.provider = "nosuchprovider";
  bad = FabricServer::Start(service, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("nosuchprovider"));
  options = Options();
  options.server.max_connections = 0;
  bad = FabricServer::Start(service, options);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("max_connections"));
  EXPECT_FALSE(FabricServer::Start(nullptr, Options()).ok());
}

}  // namespace
}  // namespace granary

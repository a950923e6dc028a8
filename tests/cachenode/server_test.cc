// The cache node's TCP server on loopback, answering from a ReadService
// backed by real files in a TempDir (samples go out as file ranges with
// sendfile, chunk ranges as memory read with pread): batched reads byte for
// byte, per-item errors, pipelining, concurrent clients, hostile clients next
// to a well-behaved one, back-pressure against a reader that does not read,
// timeouts, a client vanishing mid-reply, Stop with connections open, and a
// PeerClient reconnecting across a restart.

#include "granary/cachenode/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/file.h"
#include "granary/core/hash.h"
#include "granary/core/names.h"
#include "granary/peer/peer_client.h"
#include "granary/peer/tls.h"
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

const ContentId kManifest{0x0123456789abcdefull, 0xfedcba9876543210ull};
constexpr char kDataset[] = "imagenet";

// A number in [0, n).
uint32_t Below(std::mt19937& rng, uint32_t n) { return static_cast<uint32_t>(rng() % n); }

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// Samples and chunks as files in a TempDir. A sample read is answered with a
// file range of the sample's file (sendfile); a chunk range with memory read
// from the chunk's file (pread): both kinds of payload piece.
class FileReadService : public ReadService {
 public:
  FileReadService(const TempDir& dir, std::vector<size_t> sample_sizes,
                  std::vector<size_t> chunk_sizes, uint64_t seed = 1) {
    std::mt19937_64 rng(seed);
    auto files = std::make_shared<std::vector<ScopedFd>>();
    for (size_t i = 0; i < sample_sizes.size(); ++i) {
      samples_.push_back(RandomBytes(rng, sample_sizes[i]));
      dir.WriteFile("samples/" + std::to_string(i), samples_.back());
      auto fd = OpenFile(dir.Join("samples/" + std::to_string(i)), O_RDONLY);
      EXPECT_OK(fd);
      files->push_back(std::move(*fd));
    }
    for (size_t i = 0; i < chunk_sizes.size(); ++i) {
      chunks_.push_back(RandomBytes(rng, chunk_sizes[i]));
      dir.WriteFile("chunks/" + std::to_string(i), chunks_.back());
      auto fd = OpenFile(dir.Join("chunks/" + std::to_string(i)), O_RDONLY);
      EXPECT_OK(fd);
      chunk_fds_.push_back(std::move(*fd));
    }
    sample_fds_ = std::move(files);
  }

  Result<ReadAnswer> Read(const ReadRequest& request) override {
    ++calls_;
    {
      std::unique_lock lock(mu_);
      ++entered_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return !gated_; });
    }
    if (request.dataset != kDataset || request.manifest_id != kManifest) {
      return Status::NotFound("dataset " + Quoted(request.dataset) + " at manifest " +
                              request.manifest_id.ToHex() + " is not served by this node");
    }
    ReadAnswer answer;
    if (wrong_item_count_) return answer;  // no items at all: a bug the server must catch
    answer.Hold(sample_fds_);
    for (const ReadItem& item : request.items) {
      const bool sample = item.kind == ReadKind::kSample;
      const auto& table = sample ? samples_ : chunks_;
      if (item.id >= table.size()) {
        answer.AddError(sample ? Status::OutOfRange("sample " + std::to_string(item.id) +
                                                    " is past the manifest's end")
                               : Status::NotFound("chunk " + std::to_string(item.id) +
                                                  " is not held by this node"));
        continue;
      }
      const std::string& bytes = table[item.id];
      if (item.offset + item.length > bytes.size()) {
        answer.AddError(Status::OutOfRange("range past the end"));
        continue;
      }
      const uint64_t sum = Checksum64(std::string_view(bytes).substr(item.offset, item.length));
      if (sample) {
        answer.AddFileRange((*sample_fds_)[item.id].get(), item.offset, item.length, sum);
      } else {
        std::string copy(item.length, '\0');
        EXPECT_OK(PreadFull(chunk_fds_[item.id].get(), copy.data(), copy.size(), item.offset,
                            "chunk file"));
        answer.AddBytes(std::move(copy), sum);
      }
    }
    return answer;
  }

  Result<StatReply> Stat(const StatRequest& request) override {
    if (request.dataset.empty()) {
      return StatReply{NodeState::kServing, {{"samples", samples_.size()}, {"uptime_seconds", 7}}};
    }
    if (request.dataset != kDataset) {
      return Status::NotFound("dataset " + Quoted(request.dataset) + " is not served here");
    }
    return StatReply{NodeState::kServing, {{"staged_samples", samples_.size()}}};
  }

  const std::string& sample(size_t i) const { return samples_[i]; }
  const std::string& chunk(size_t i) const { return chunks_[i]; }
  size_t sample_count() const { return samples_.size(); }

  // Read blocks until Open() while gated.
  void Gate() {
    std::lock_guard lock(mu_);
    gated_ = true;
  }
  void Open() {
    std::lock_guard lock(mu_);
    gated_ = false;
    cv_.notify_all();
  }
  bool WaitEntered(int n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return entered_ >= n; });
  }
  void set_wrong_item_count(bool on) { wrong_item_count_ = on; }
  int calls() const { return calls_.load(); }

 private:
  std::vector<std::string> samples_;
  std::vector<std::string> chunks_;
  std::shared_ptr<std::vector<ScopedFd>> sample_fds_;
  std::vector<ScopedFd> chunk_fds_;
  std::atomic<int> calls_{0};
  std::atomic<bool> wrong_item_count_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool gated_ = false;  // guarded by mu_
  int entered_ = 0;     // guarded by mu_
};

// A client on a raw socket: sends any bytes, reads frames with a deadline.
class RawClient {
 public:
  // `source`: the loopback address to connect from (127.0.0.1 by default).
  explicit RawClient(uint16_t port, int receive_buffer = 0, const char* source = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (receive_buffer > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      EXPECT_EQ(::inet_pton(AF_INET, source, &from.sin_addr), 1);
      EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  ~RawClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void Send(std::string_view bytes) {
    size_t sent = 0;
    for (int round = 0; sent < bytes.size() && round < 100000; ++round) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  void Hello(uint64_t id = 1) {
    Send(Encode(id, HelloRequest{1, 1, "raw-client"}, 1));
    auto reply = Next();
    ASSERT_OK(reply);
    ASSERT_EQ(reply->header.type, pf::kTypeHelloReply);
  }

  // The next frame from the server; kUnavailable at EOF, kDeadlineExceeded.
  Result<Frame> Next(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = Clock::now() + timeout;
    for (int round = 0; round < 1000000; ++round) {
      if (!buffer_.empty()) {
        GRANARY_ASSIGN_OR_RETURN(size_t used, decoder_.Feed(buffer_));
        buffer_.erase(0, used);
      }
      if (decoder_.has_frame()) return decoder_.TakeFrame();
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Status::DeadlineExceeded("raw client: no frame in time");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[1 << 16];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return Status::Unavailable("raw client: connection closed");
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return Status::DeadlineExceeded("raw client: too many rounds");
  }

  // The next frame, decoded as a response.
  Result<ResponseMessage> NextMessage(uint64_t* request_id = nullptr) {
    GRANARY_ASSIGN_OR_RETURN(Frame frame, Next());
    if (request_id != nullptr) *request_id = frame.header.request_id;
    return DecodeResponse(frame);
  }

  // Reads until EOF or reset within `timeout`: true if the server closed.
  bool WaitClosed(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = Clock::now() + timeout;
    for (int round = 0; round < 1000000 && Clock::now() < deadline; ++round) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char chunk[1 << 16];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return true;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return false;
  }

  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }
  void Close() {
    ::close(fd_);
    fd_ = -1;
  }

  static std::string Encode(uint64_t id, const RequestMessage& m, uint16_t version = 1) {
    auto bytes = EncodeRequest(id, m, EncodeOptions{version, {}});
    EXPECT_OK(bytes);
    return bytes.ok() ? *bytes : std::string();
  }

 private:
  int fd_ = -1;
  FrameDecoder decoder_{FrameDirection::kResponses};
  std::string buffer_;
};

// A frame header built by hand: any version, type, lengths.
std::string RawHeader(uint16_t type, uint64_t id, uint32_t body_length, uint16_t version = 1,
                      uint64_t payload_length = 0) {
  std::string out(pf::kFrameHeaderSize, '\0');
  std::memcpy(out.data(), pf::kMagic, 4);
  StoreLe(out.data() + pf::kVersionOffset, version);
  StoreLe(out.data() + pf::kTypeOffset, type);
  StoreLe(out.data() + pf::kBodyLengthOffset, body_length);
  StoreLe(out.data() + pf::kPayloadLengthOffset, payload_length);
  StoreLe(out.data() + pf::kRequestIdOffset, id);
  return out;
}

ReadRequest ReadOf(std::vector<ReadItem> items, std::string dataset = kDataset) {
  return ReadRequest{std::move(dataset), kManifest, std::move(items)};
}

ServerOptions TestOptions() {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.node_name = "node-test";
  o.io_threads = 2;
  o.service_threads = 3;
  o.drain_timeout = 5s;
  return o;
}

PeerClientOptions ClientOptions() {
  PeerClientOptions o;
  o.client_name = "server-test";
  o.connect_timeout = 5s;
  o.call_timeout = 10s;
  return o;
}

std::string Address(const Server& server) { return "127.0.0.1:" + std::to_string(server.port()); }

struct Fixture {
  explicit Fixture(size_t samples = 64, size_t chunks = 8, ServerOptions options = TestOptions(),
                   size_t max_sample = 20000, size_t chunk_size = 256 << 10) {
    std::mt19937_64 rng(99);
    std::vector<size_t> sample_sizes;
    for (size_t i = 0; i < samples; ++i) sample_sizes.push_back(1 + rng() % max_sample);
    std::vector<size_t> chunk_sizes(chunks, chunk_size);
    service = std::make_shared<FileReadService>(dir, sample_sizes, chunk_sizes);
    auto started = Server::Start(service, options);
    EXPECT_OK(started);
    if (started.ok()) server = std::move(*started);
  }
  PeerClient Client() {
    auto client = PeerClient::Connect(Address(*server), ClientOptions());
    EXPECT_OK(client);
    return std::move(*client);
  }
  // Checks every item of a reply against the files.
  void ExpectExact(const ReadRequest& request, const PeerReadResult& result) {
    ASSERT_EQ(result.size(), request.items.size());
    for (size_t i = 0; i < request.items.size(); ++i) {
      const ReadItem& item = request.items[i];
      ASSERT_OK(result.status(i));
      const std::string& all =
          item.kind == ReadKind::kSample ? service->sample(item.id) : service->chunk(item.id);
      ASSERT_EQ(result.bytes(i), std::string_view(all).substr(item.offset, item.length))
          << "item " << i;
      ASSERT_TRUE(result.reply().items[i].checksum.has_value());
    }
  }

  TempDir dir;
  std::shared_ptr<FileReadService> service;
  std::unique_ptr<Server> server;
};

// --- start-up ---------------------------------------------------------------

TEST(ServerTest, StartRejectsBadOptions) {
  TempDir dir;
  auto service =
      std::make_shared<FileReadService>(dir, std::vector<size_t>{10}, std::vector<size_t>{});
  auto expect_invalid = [&](ServerOptions o, std::string_view what) {
    auto s = Server::Start(service, o);
    ASSERT_FALSE(s.ok()) << what;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
    EXPECT_THAT(s.status().message(), HasSubstr(what));
  };
  ServerOptions o = TestOptions();
  o.io_threads = 0;
  expect_invalid(o, "io_threads");
  o = TestOptions();
  o.service_threads = 0;
  expect_invalid(o, "service_threads");
  o = TestOptions();
  o.max_in_flight = 0;
  expect_invalid(o, "max_in_flight");
  o = TestOptions();
  o.max_connections = 0;
  expect_invalid(o, "max_connections");
  o = TestOptions();
  o.frame_timeout = 0ms;
  expect_invalid(o, "frame_timeout");
  o = TestOptions();
  o.node_name = "has space";
  expect_invalid(o, "node_name");
  o = TestOptions();
  o.reply_buffer_bytes = 0;
  expect_invalid(o, "reply_buffer_bytes must be at least 1");
  o = TestOptions();
  o.reply_buffer_bytes = 1 << 20;
  o.connection_reply_buffer_bytes = (1 << 20) + 1;
  expect_invalid(o, "connection_reply_buffer_bytes (1048577) must be at most reply_buffer_bytes");
  o = TestOptions();
  o.reply_stall_timeout = 0ms;
  expect_invalid(o, "reply_stall_timeout");
  o = TestOptions();
  o.limits.max_body_bytes = 10;
  expect_invalid(o, "limits");
  o = TestOptions();
  o.listen = "127.0.0.1";
  expect_invalid(o, "listen");
  o = TestOptions();
  o.listen = "[::1:80";
  expect_invalid(o, "listen");

  auto no_service = Server::Start(nullptr, TestOptions());
  EXPECT_EQ(no_service.status().code(), StatusCode::kInvalidArgument);

  o = TestOptions();
  o.listen = "no-such-host.invalid:0";
  auto unresolvable = Server::Start(service, o);
  EXPECT_EQ(unresolvable.status().code(), StatusCode::kUnavailable);

  o = TestOptions();
  o.listen = "192.0.2.1:0";  // TEST-NET-1: not an address of this host
  auto foreign = Server::Start(service, o);
  EXPECT_EQ(foreign.status().code(), StatusCode::kUnavailable);
}

TEST(ServerTest, PortInUseIsUnavailable) {
  Fixture f;
  ServerOptions o = TestOptions();
  o.listen = Address(*f.server);
  auto second = Server::Start(f.service, o);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("in use"));
}

// --- the conversation --------------------------------------------------------

TEST(ServerTest, HelloPingAndStat) {
  Fixture f;
  PeerClient client = f.Client();
  EXPECT_EQ(client.server_name(), "node-test");
  EXPECT_EQ(client.version(), 2);
  EXPECT_EQ(client.scope(), "");  // no authentication asked
  EXPECT_EQ(client.limits(), ProtocolLimits{});
  EXPECT_OK(client.Ping());

  auto node = client.Stat();
  ASSERT_OK(node);
  EXPECT_EQ(node->state, NodeState::kServing);
  auto value = [&](const StatReply& r, std::string_view key) -> std::optional<uint64_t> {
    for (const auto& e : r.entries) {
      if (e.key == key) return e.value;
    }
    return std::nullopt;
  };
  EXPECT_EQ(value(*node, "samples"), 64u);
  EXPECT_EQ(value(*node, "uptime_seconds"), 7u);
  EXPECT_EQ(value(*node, "server_connections_open"), 1u);
  EXPECT_GE(value(*node, "server_requests_total").value_or(0), 2u);  // HELLO, PING

  auto dataset = client.Stat(StatRequest{kDataset, {}});
  ASSERT_OK(dataset);
  EXPECT_EQ(dataset->entries, (std::vector<StatEntry>{{"staged_samples", 64}}));

  auto unknown = client.Stat(StatRequest{"cifar", {}});
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'cifar'"));
  EXPECT_OK(client.Ping());  // the same connection goes on
  EXPECT_EQ(client.reconnects(), 0u);

  auto connections = f.server->Connections();
  ASSERT_EQ(connections.size(), 1u);
  EXPECT_EQ(connections[0].peer_name, "server-test");
  EXPECT_THAT(connections[0].peer_address, HasSubstr("127.0.0.1:"));
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().requests_total == 6; }));
  ServerCounters c = f.server->Counters();
  EXPECT_EQ(c.hello_requests_total, 1u);
  EXPECT_EQ(c.ping_requests_total, 2u);
  EXPECT_EQ(c.stat_requests_total, 3u);  // answered: two STAT_REPLYs and an ERROR
  EXPECT_EQ(c.service_errors_total, 1u);
  EXPECT_EQ(c.connections_open, 1u);
}

TEST(ServerTest, BatchedReadOfManySamplesIsByteExactAndUsesSendfile) {
  Fixture f(/*samples=*/500);
  PeerClient client = f.Client();
  std::vector<ReadItem> items;
  uint64_t total = 0;
  for (uint32_t id = 0; id < 500; ++id) {
    auto size = static_cast<uint32_t>(f.service->sample(id).size());
    items.push_back({ReadKind::kSample, id, 0, size});
    total += size;
  }
  // And pieces of samples: a tail, a middle, a single byte.
  const auto s7 = static_cast<uint32_t>(f.service->sample(7).size());
  items.push_back({ReadKind::kSample, 7, s7 / 2, s7 - s7 / 2});
  items.push_back({ReadKind::kSample, 8, 0, 1});
  total += (s7 - s7 / 2) + 1;
  const ServerCounters before = f.server->Counters();
  ReadRequest request = ReadOf(items);
  auto result = client.Read(request);
  ASSERT_OK(result);
  f.ExpectExact(request, *result);
  EXPECT_EQ(result->payload().size(), total);

  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().read_requests_total == 1; }));
  const ServerCounters after = f.server->Counters();
  EXPECT_EQ(after.sendfile_bytes_total - before.sendfile_bytes_total, total);
  EXPECT_EQ(after.payload_bytes_total - before.payload_bytes_total, total);
  EXPECT_EQ(after.read_items_total, 502u);
  EXPECT_EQ(after.read_item_errors_total, 0u);
}

TEST(ServerTest, ChunkRangesAreServedFromMemoryPieces) {
  Fixture f;
  PeerClient client = f.Client();
  ReadRequest request = ReadOf({{ReadKind::kChunkRange, 0, 0, 256 << 10},
                                {ReadKind::kChunkRange, 3, 1000, 5000},
                                {ReadKind::kChunkRange, 7, (256 << 10) - 1, 1},
                                {ReadKind::kSample, 5, 0, 1}});
  const ServerCounters before = f.server->Counters();
  auto result = client.Read(request);
  ASSERT_OK(result);
  f.ExpectExact(request, *result);
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().read_requests_total == 1; }));
  const ServerCounters after = f.server->Counters();
  EXPECT_EQ(after.sendfile_bytes_total - before.sendfile_bytes_total, 1u);  // the sample only
  EXPECT_EQ(after.payload_bytes_total - before.payload_bytes_total, (256u << 10) + 5000 + 1 + 1);
}

TEST(ServerTest, PerItemErrorsAreMixedWithGoodItems) {
  Fixture f;
  PeerClient client = f.Client();
  const auto s3 = static_cast<uint32_t>(f.service->sample(3).size());
  auto result = client.Read(ReadOf({{ReadKind::kSample, 3, 0, s3},
                                    {ReadKind::kSample, 64, 0, 10},  // past the manifest
                                    {ReadKind::kSample, 4, 0, 1},
                                    {ReadKind::kSample, 5, 0, 1u << 20},  // past the sample
                                    {ReadKind::kChunkRange, 99, 0, 10},   // not held here
                                    {ReadKind::kChunkRange, 1, 10, 10}}));
  ASSERT_OK(result);
  ASSERT_EQ(result->size(), 6u);
  EXPECT_EQ(result->bytes(0), f.service->sample(3));
  EXPECT_EQ(result->status(1).code(), StatusCode::kOutOfRange);
  EXPECT_THAT(result->status(1).message(), HasSubstr("sample 64"));
  EXPECT_EQ(result->bytes(2), f.service->sample(4).substr(0, 1));
  EXPECT_EQ(result->status(3).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(result->status(4).code(), StatusCode::kNotFound);
  EXPECT_EQ(result->bytes(5), f.service->chunk(1).substr(10, 10));
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().read_requests_total == 1; }));
  EXPECT_EQ(f.server->Counters().read_item_errors_total, 3u);
}

TEST(ServerTest, UnknownDatasetIsAnErrorAndTheConnectionKeepsServing) {
  Fixture f;
  PeerClient client = f.Client();
  auto wrong = client.Read(ReadOf({{ReadKind::kSample, 0, 0, 1}}, "cifar"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(wrong.status().message(), HasSubstr("'cifar'"));
  ReadRequest good = ReadOf({{ReadKind::kSample, 0, 0, 1}});
  auto result = client.Read(good);
  ASSERT_OK(result);
  f.ExpectExact(good, *result);
  EXPECT_EQ(client.reconnects(), 0u);
}

TEST(ServerTest, AnAnswerThatDoesNotMatchItsRequestIsAnInternalError) {
  Fixture f;
  PeerClient client = f.Client();
  f.service->set_wrong_item_count(true);
  auto bad = client.Read(ReadOf({{ReadKind::kSample, 0, 0, 1}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
  EXPECT_THAT(bad.status().message(), HasSubstr("bug in the cache node"));
  f.service->set_wrong_item_count(false);
  EXPECT_OK(client.Read(ReadOf({{ReadKind::kSample, 0, 0, 1}})));
  EXPECT_EQ(f.server->Counters().internal_errors_total, 1u);
  EXPECT_EQ(client.reconnects(), 0u);
}

TEST(ServerTest, PipelinedRequestsAreAnsweredInOrder) {
  ServerOptions o = TestOptions();
  o.max_in_flight = 4;  // fewer than the pipeline: reading pauses and resumes
  Fixture f(64, 8, o);
  RawClient raw(f.server->port());
  std::string batch = RawClient::Encode(1, HelloRequest{1, 1, "pipeliner"});
  std::vector<uint16_t> types;
  for (uint64_t id = 2; id < 62; ++id) {
    switch (id % 4) {
      case 0:
        batch += RawClient::Encode(id, PingRequest{});
        types.push_back(pf::kTypePong);
        break;
      case 1:
        batch += RawClient::Encode(id, StatRequest{});
        types.push_back(pf::kTypeStatReply);
        break;
      default:
        batch += RawClient::Encode(
            id, ReadOf({{ReadKind::kSample, static_cast<uint32_t>(id % 64), 0, 1},
                        {ReadKind::kChunkRange, static_cast<uint32_t>(id % 8), id, 100}}));
        types.push_back(pf::kTypeReadReply);
        break;
    }
  }
  raw.Send(batch);  // all at once, before reading anything
  auto hello = raw.Next();
  ASSERT_OK(hello);
  EXPECT_EQ(hello->header.type, pf::kTypeHelloReply);
  for (uint64_t id = 2; id < 62; ++id) {
    auto frame = raw.Next();
    ASSERT_OK(frame);
    EXPECT_EQ(frame->header.request_id, id);
    EXPECT_EQ(frame->header.type, types[id - 2]) << "request " << id;
    if (frame->header.type != pf::kTypeReadReply) continue;
    auto reply = DecodeResponse(*frame);
    ASSERT_OK(reply);
    auto pieces = SplitReadPayload(std::get<ReadReply>(*reply), frame->payload);
    ASSERT_OK(pieces);
    EXPECT_EQ((*pieces)[0], f.service->sample(id % 64).substr(0, 1));
    EXPECT_EQ((*pieces)[1], f.service->chunk(id % 8).substr(id, 100));
  }
}

TEST(ServerTest, ConcurrentClientsAllGetTheirOwnBytes) {
  Fixture f(200, 16);
  constexpr int kClients = 8;
  constexpr int kReads = 25;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = PeerClient::Connect(Address(*f.server), ClientOptions());
      ASSERT_OK(client);
      std::mt19937 rng(static_cast<uint32_t>(c));
      for (int r = 0; r < kReads; ++r) {
        std::vector<ReadItem> items;
        for (int i = 0; i < 20; ++i) {
          uint32_t id = Below(rng, 200);
          if (i % 5 == 0) {
            items.push_back(
                {ReadKind::kChunkRange, id % 16, Below(rng, 1000), 1 + Below(rng, 5000)});
          } else {
            items.push_back(
                {ReadKind::kSample, id, 0, static_cast<uint32_t>(f.service->sample(id).size())});
          }
        }
        ReadRequest request = ReadOf(items);
        auto result = client->Read(request);
        ASSERT_OK(result);
        f.ExpectExact(request, *result);
        ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kClients * kReads);
  ASSERT_TRUE(
      WaitFor([&] { return f.server->Counters().read_requests_total == kClients * kReads; }));
}

// --- bad clients --------------------------------------------------------------

// Expects an ERROR (closing) with `code` for `request_id`, then the close.
void ExpectClosingError(RawClient& raw, StatusCode code, uint64_t request_id,
                        std::string_view text = "") {
  uint64_t id = 999;
  auto message = raw.NextMessage(&id);
  ASSERT_OK(message);
  auto* error = std::get_if<ErrorReply>(&*message);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->status.code(), code) << error->status.ToString();
  EXPECT_TRUE(error->closing);
  EXPECT_EQ(id, request_id);
  if (!text.empty()) {
    EXPECT_THAT(error->status.message(), HasSubstr(text));
  }
  EXPECT_TRUE(raw.WaitClosed());
}

TEST(ServerTest, HostileClientsDoNotDisturbAWellBehavedOne) {
  ServerOptions o = TestOptions();
  o.frame_timeout = 300ms;
  o.handshake_timeout = 300ms;
  Fixture f(100, 8, o);

  // The well-behaved client reads and checks until the hostile ones are done.
  std::atomic<bool> done{false};
  std::atomic<int> good_reads{0};
  std::thread good([&] {
    auto client = PeerClient::Connect(Address(*f.server), ClientOptions());
    ASSERT_OK(client);
    std::mt19937 rng(5);
    for (int r = 0; r < 100000 && (!done || r < 3); ++r) {
      std::vector<ReadItem> items;
      for (int i = 0; i < 10; ++i) {
        uint32_t id = Below(rng, 100);
        items.push_back(
            {ReadKind::kSample, id, 0, static_cast<uint32_t>(f.service->sample(id).size())});
      }
      items.push_back({ReadKind::kChunkRange, Below(rng, 8), 0, 4096});
      ReadRequest request = ReadOf(items);
      auto result = client->Read(request);
      ASSERT_OK(result);
      f.ExpectExact(request, *result);
      ++good_reads;
    }
    EXPECT_EQ(client->reconnects(), 0u);
  });

  {  // Random bytes: a framing error, ERROR (request id 0, closing), closed.
    RawClient raw(f.server->port());
    std::mt19937_64 rng(3);
    raw.Send(RandomBytes(rng, 4096));
    ExpectClosingError(raw, StatusCode::kInvalidArgument, 0, "magic");
  }
  {  // Random bytes after a good HELLO.
    RawClient raw(f.server->port());
    raw.Hello();
    std::mt19937_64 rng(4);
    raw.Send(RandomBytes(rng, 100));
    ExpectClosingError(raw, StatusCode::kInvalidArgument, 0);
  }
  {  // A huge body length: refused from the header, before any buffering.
    RawClient raw(f.server->port());
    raw.Hello();
    raw.Send(RawHeader(pf::kTypeRead, 2, 0xFFFFFFFFu));
    ExpectClosingError(raw, StatusCode::kOutOfRange, 0, "exceeds the limit");
  }
  {  // A payload on a request.
    RawClient raw(f.server->port());
    raw.Hello();
    raw.Send(RawHeader(pf::kTypeRead, 2, 0, 1, uint64_t{1} << 40));
    ExpectClosingError(raw, StatusCode::kInvalidArgument, 0, "payload");
  }
  {  // A frame version this build does not speak.
    RawClient raw(f.server->port());
    raw.Send(RawHeader(pf::kTypeHello, 1, 0, /*version=*/9));
    ExpectClosingError(raw, StatusCode::kVersionMismatch, 0);
  }
  {  // HELLO offering only versions this build does not speak.
    RawClient raw(f.server->port());
    raw.Send(RawClient::Encode(1, HelloRequest{1, 1, "future"})
                 .replace(pf::kFrameHeaderSize, 4, std::string("\x07\x00\x09\x00", 4)));
    ExpectClosingError(raw, StatusCode::kVersionMismatch, 1);
  }
  {  // A request before HELLO.
    RawClient raw(f.server->port());
    raw.Send(RawClient::Encode(5, PingRequest{}));
    ExpectClosingError(raw, StatusCode::kFailedPrecondition, 5, "before HELLO");
  }
  {  // A second HELLO.
    RawClient raw(f.server->port());
    raw.Hello();
    raw.Send(RawClient::Encode(2, HelloRequest{1, 1, "again"}));
    ExpectClosingError(raw, StatusCode::kFailedPrecondition, 2, "second HELLO");
  }
  {  // A malformed message in a whole frame: ERROR for it, and the connection goes on.
    RawClient raw(f.server->port());
    raw.Hello();
    std::string read = RawClient::Encode(2, ReadOf({{ReadKind::kSample, 0, 0, 1}}));
    read[pf::kFrameHeaderSize] = 'X';  // the dataset name is no DNS label now
    raw.Send(read + RawClient::Encode(3, PingRequest{}));
    uint64_t id = 0;
    auto error = raw.NextMessage(&id);
    ASSERT_OK(error);
    ASSERT_TRUE(std::holds_alternative<ErrorReply>(*error));
    EXPECT_EQ(std::get<ErrorReply>(*error).status.code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(std::get<ErrorReply>(*error).closing);
    EXPECT_EQ(id, 2u);
    auto pong = raw.NextMessage(&id);
    ASSERT_OK(pong);
    EXPECT_TRUE(std::holds_alternative<PongReply>(*pong));
    EXPECT_EQ(id, 3u);
  }
  {  // Truncated: half a frame, then the client shuts its side.
    RawClient raw(f.server->port());
    raw.Hello();
    std::string read = RawClient::Encode(2, ReadOf({{ReadKind::kSample, 0, 0, 1}}));
    raw.Send(std::string_view(read).substr(0, read.size() / 2));
    raw.ShutdownWrite();
    EXPECT_TRUE(raw.WaitClosed());
    ASSERT_TRUE(WaitFor([&] { return f.server->Counters().truncated_frames_total == 1; }));
  }
  {  // Slowloris: a header, then nothing. Closed after frame_timeout.
    RawClient raw(f.server->port());
    raw.Hello();
    const auto start = Clock::now();
    raw.Send(RawHeader(pf::kTypeRead, 2, 1000));
    ExpectClosingError(raw, StatusCode::kDeadlineExceeded, 0, "frame_timeout");
    EXPECT_GE(Clock::now() - start, 300ms);
  }
  {  // Slowloris that never says HELLO: a few header bytes only.
    RawClient raw(f.server->port());
    raw.Send(std::string(pf::kMagic, 4));
    ExpectClosingError(raw, StatusCode::kDeadlineExceeded, 0);
  }
  {  // Connects and says nothing.
    RawClient raw(f.server->port());
    ExpectClosingError(raw, StatusCode::kDeadlineExceeded, 0, "HELLO");
  }
  done = true;
  good.join();
  EXPECT_GE(good_reads.load(), 3);

  const ServerCounters c = f.server->Counters();
  EXPECT_EQ(c.framing_errors_total, 5u);
  EXPECT_EQ(c.message_errors_total, 1u);
  EXPECT_EQ(c.policy_errors_total, 3u);
  EXPECT_EQ(c.truncated_frames_total, 1u);
  EXPECT_EQ(c.timeouts_total, 3u);
  // Every hostile connection is gone; the good client's too, now.
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 0; }));
  EXPECT_EQ(f.server->Counters().buffered_bytes, 0u);
  // And the server still serves.
  PeerClient client = f.Client();
  EXPECT_OK(client.Ping());
}

TEST(ServerTest, AReaderThatDoesNotReadMeetsBackPressureNotGrowth) {
  ServerOptions o = TestOptions();
  o.max_in_flight = 4;
  o.write_timeout = 60s;  // the test decides when the reader reads
  constexpr uint32_t kChunk = 1 << 20;
  Fixture f(8, 4, o, 100, kChunk);
  // A small receive buffer: the kernel absorbs little of the replies.
  RawClient raw(f.server->port(), /*receive_buffer=*/16 << 10);
  raw.Hello();
  constexpr uint64_t kRequests = 64;
  std::string batch;
  for (uint64_t id = 2; id < 2 + kRequests; ++id) {
    batch += RawClient::Encode(
        id, ReadOf({{ReadKind::kChunkRange, static_cast<uint32_t>(id % 4), 0, kChunk}}));
  }
  raw.Send(batch);  // 7 KiB of requests asking for 64 MiB of replies

  // The server answers until the socket is full, then stops reading: K
  // requests in flight, the writer blocked, the reader paused.
  ConnectionInfo info;
  ASSERT_TRUE(WaitFor([&] {
    auto connections = f.server->Connections();
    if (connections.size() != 1) return false;
    info = connections[0];
    // Requests are answered one after the other: wait until all K replies
    // are ready (the front one partly sent).
    return info.in_flight == 4 && info.write_blocked && !info.reading &&
           info.buffered_bytes >= 3 * kChunk;
  })) << "in flight "
      << info.in_flight << ", write blocked " << info.write_blocked << ", reading " << info.reading
      << ", buffered " << info.buffered_bytes;
  // Bounded: at most K replies' memory (a chunk each, plus headers) and one
  // receive chunk, however much the client asked for.
  const uint64_t bound = 4 * (kChunk + 4096) + o.receive_chunk_bytes;
  EXPECT_LE(info.buffered_bytes, bound);
  ServerCounters c = f.server->Counters();
  EXPECT_LE(c.max_connection_buffered_bytes, bound);
  EXPECT_LT(c.read_requests_total + info.in_flight, kRequests);  // the rest is unread
  EXPECT_LE(f.service->calls(), static_cast<int>(c.read_requests_total) + 4);

  // Now read: every reply arrives, in order, exact; the bound held throughout.
  for (uint64_t id = 2; id < 2 + kRequests; ++id) {
    auto frame = raw.Next();
    ASSERT_OK(frame);
    ASSERT_EQ(frame->header.request_id, id);
    ASSERT_EQ(frame->payload, f.service->chunk(id % 4));
  }
  EXPECT_LE(f.server->Counters().max_connection_buffered_bytes, bound);
}

// --- the reply budget --------------------------------------------------------

TEST(ServerTest, TheReplyBudgetBoundsTheRepliesOfAllConnectionsTogether) {
  ServerOptions o = TestOptions();
  constexpr uint32_t kChunk = 1 << 20;
  o.reply_buffer_bytes = 4 * kChunk;
  o.connection_reply_buffer_bytes = 2 * kChunk;
  o.write_timeout = 60s;
  o.reply_stall_timeout = 60s;  // nobody is closed: this test looks at the bound
  Fixture f(8, 4, o, 100, kChunk);
  // Eight clients that never read, each asking for 8 MiB of memory replies.
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int c = 0; c < 8; ++c) {
    flood.push_back(std::make_unique<RawClient>(f.server->port(), 16 << 10));
    flood.back()->Hello();
    std::string batch;
    for (uint64_t id = 2; id < 10; ++id) {
      batch += RawClient::Encode(
          id, ReadOf({{ReadKind::kChunkRange, static_cast<uint32_t>(id % 4), 0, kChunk}}));
    }
    flood.back()->Send(batch);
  }
  ServerCounters c;
  ASSERT_TRUE(WaitFor([&] {
    c = f.server->Counters();
    return c.reply_budget_waits_total > 0 && c.reply_budget_used_bytes >= 3 * kChunk;
  })) << "used "
      << c.reply_budget_used_bytes << ", waits " << c.reply_budget_waits_total;
  // Hold it a moment: nothing grows past the budget (plus reply headers).
  for (int i = 0; i < 20; ++i) {
    c = f.server->Counters();
    EXPECT_LE(c.reply_budget_used_bytes, 4 * kChunk + 8 * 4096);
    EXPECT_LE(c.buffered_bytes, 4 * kChunk + 8 * 4096 + 8 * o.receive_chunk_bytes);
    for (const ConnectionInfo& info : f.server->Connections()) {
      EXPECT_LE(info.reply_budget_bytes, 2 * kChunk + 4096) << "connection " << info.id;
    }
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(c.reply_budget_bytes, 4 * kChunk);
  // Not every READ asked for was read into memory: some wait (what the
  // kernel's socket buffers took let a few more go).
  EXPECT_LT(f.service->calls(), 8 * 8);
}

TEST(ServerTest, ClientsThatHoldTheReplyBudgetAndReadNothingAreClosedForOthers) {
  ServerOptions o = TestOptions();
  constexpr uint32_t kChunk = 1 << 20;
  o.reply_buffer_bytes = 2 * kChunk;
  o.write_timeout = 60s;
  o.reply_stall_timeout = 300ms;
  Fixture f(8, 4, o, 100, kChunk);
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int c = 0; c < 6; ++c) {
    flood.push_back(std::make_unique<RawClient>(f.server->port(), 16 << 10));
    flood.back()->Hello();
    std::string batch;
    for (uint64_t id = 2; id < 6; ++id) {
      batch += RawClient::Encode(id, ReadOf({{ReadKind::kChunkRange, 0, 0, kChunk}}));
    }
    flood.back()->Send(batch);
  }
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().reply_budget_waits_total > 0; }));
  // A well-behaved client: its READ waits for the budget, which the stalled
  // holders give up after reply_stall_timeout.
  PeerClient client = f.Client();
  const auto start = Clock::now();
  const ReadRequest request = ReadOf({{ReadKind::kChunkRange, 1, 0, kChunk}});
  auto got = client.Read(request);
  ASSERT_OK(got);
  f.ExpectExact(request, *got);
  EXPECT_LT(Clock::now() - start, 8s);
  const ServerCounters c = f.server->Counters();
  EXPECT_GT(c.reply_stall_closes_total, 0u);
  EXPECT_GE(c.timeouts_total, c.reply_stall_closes_total);
}

TEST(ServerTest, SendfileRepliesHoldNoReplyBudget) {
  ServerOptions o = TestOptions();
  o.write_timeout = 60s;
  // The reply must be larger than what the kernel can queue on the server's
  // socket (the send buffer autotunes up to net.ipv4.tcp_wmem's maximum, 4 MiB
  // by default) plus the client's 16 KiB receive buffer, or it is all handed
  // over at once and never waits for the client.
  Fixture f(8, 1, o, 32 << 20, 1024);
  uint32_t big = 0;
  for (uint32_t i = 0; i < 8; ++i) {
    if (f.service->sample(i).size() > f.service->sample(big).size()) big = i;
  }
  const auto size = static_cast<uint32_t>(f.service->sample(big).size());
  ASSERT_GT(size, 8u << 20);
  RawClient raw(f.server->port(), 16 << 10);
  raw.Hello();
  raw.Send(RawClient::Encode(2, ReadOf({{ReadKind::kSample, big, 0, size}})));
  ConnectionInfo info;
  ASSERT_TRUE(WaitFor([&] {
    auto connections = f.server->Connections();
    if (connections.size() != 1) return false;
    info = connections[0];
    return info.in_flight == 1 && info.write_blocked;
  }));
  // Only the header is reserved: the payload goes from the file by sendfile.
  EXPECT_LE(info.reply_budget_bytes, 4096u);
  EXPECT_LE(f.server->Counters().reply_budget_used_bytes, 4096u);
  auto frame = raw.Next();
  ASSERT_OK(frame);
  EXPECT_EQ(frame->payload, f.service->sample(big));
  EXPECT_GT(f.server->Counters().sendfile_bytes_total, 0u);
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().reply_budget_used_bytes == 0; }));
}

TEST(ServerTest, AClientThatVanishesMidReplyCostsNothing) {
  Fixture f(8, 4, TestOptions(), 100, 4 << 20);
  {
    RawClient raw(f.server->port(), /*receive_buffer=*/16 << 10);
    raw.Hello();
    std::vector<ReadItem> items;
    for (uint32_t i = 0; i < 8; ++i) items.push_back({ReadKind::kChunkRange, i % 4, 0, 4 << 20});
    raw.Send(RawClient::Encode(2, ReadOf(items)));
    // Wait until the reply is on its way and stuck on the full socket.
    ASSERT_TRUE(WaitFor([&] {
      auto cs = f.server->Connections();
      return cs.size() == 1 && cs[0].write_blocked;
    }));
    raw.Close();  // unread bytes: the kernel resets the connection
  }
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 0; }));
  ServerCounters c = f.server->Counters();
  EXPECT_EQ(c.send_errors_total, 1u);
  EXPECT_EQ(c.buffered_bytes, 0u);
  EXPECT_EQ(c.read_requests_total, 0u);  // never answered in full
  PeerClient client = f.Client();
  ReadRequest request = ReadOf({{ReadKind::kChunkRange, 1, 0, 4 << 20}});
  auto result = client.Read(request);
  ASSERT_OK(result);
  f.ExpectExact(request, *result);
}

TEST(ServerTest, IdleConnectionsAreClosedAndTheClientReconnects) {
  ServerOptions o = TestOptions();
  o.idle_timeout = 200ms;
  Fixture f(8, 1, o);
  PeerClient client = f.Client();
  EXPECT_OK(client.Ping());
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 0; }));
  EXPECT_EQ(f.server->Counters().timeouts_total, 1u);
  // The client notices the close before its next request and reconnects.
  EXPECT_OK(client.Ping());
  EXPECT_EQ(client.reconnects(), 1u);
}

TEST(ServerTest, TooManyConnectionsAreRefusedWithAnError) {
  ServerOptions o = TestOptions();
  o.max_connections = 2;
  Fixture f(8, 1, o);
  PeerClient a = f.Client();
  PeerClient b = f.Client();
  RawClient third(f.server->port());
  ExpectClosingError(third, StatusCode::kResourceExhausted, 0, "max");
  EXPECT_EQ(f.server->Counters().connections_rejected_total, 1u);
  EXPECT_OK(a.Ping());
  EXPECT_OK(b.Ping());
  a.Close();
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 1; }));
  PeerClient c = f.Client();
  EXPECT_OK(c.Ping());
}

// --- stopping and restarting --------------------------------------------------

TEST(ServerTest, StopLetsInFlightRepliesFinishAndClosesTheRest) {
  Fixture f;
  RawClient busy(f.server->port());
  busy.Hello();
  RawClient idle(f.server->port());
  idle.Hello();
  f.service->Gate();
  busy.Send(RawClient::Encode(2, ReadOf({{ReadKind::kSample, 1, 0, 1}})));
  ASSERT_TRUE(f.service->WaitEntered(1));

  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    f.server->Stop();
    stopped = true;
  });
  EXPECT_TRUE(idle.WaitClosed());  // nothing in flight: closed at once
  EXPECT_FALSE(stopped.load());    // the busy one is still being answered
  f.service->Open();
  auto reply = busy.NextMessage();
  ASSERT_OK(reply);
  ASSERT_TRUE(std::holds_alternative<ReadReply>(*reply));
  EXPECT_TRUE(busy.WaitClosed());
  stopper.join();
  EXPECT_TRUE(stopped.load());
  EXPECT_EQ(f.server->Counters().connections_open, 0u);
  f.server->Stop();  // idempotent
}

TEST(ServerTest, StopClosesConnectionsWhoseRepliesMissTheDrainDeadline) {
  ServerOptions o = TestOptions();
  o.drain_timeout = 200ms;
  Fixture f(8, 1, o);
  RawClient busy(f.server->port());
  busy.Hello();
  f.service->Gate();
  busy.Send(RawClient::Encode(2, ReadOf({{ReadKind::kSample, 1, 0, 1}})));
  ASSERT_TRUE(f.service->WaitEntered(1));
  std::thread stopper([&] { f.server->Stop(); });
  // Closed at the drain deadline, without its reply.
  EXPECT_TRUE(busy.WaitClosed());
  // Stop still waits for the service call in progress, which returns now.
  f.service->Open();
  stopper.join();
  EXPECT_EQ(f.server->Counters().connections_open, 0u);
  EXPECT_EQ(f.server->Counters().read_requests_total, 0u);
}

TEST(ServerTest, ClientReconnectsAfterTheServerRestarts) {
  Fixture f;
  PeerClient client = f.Client();
  ReadRequest request = ReadOf({{ReadKind::kSample, 2, 0, 10}});
  ASSERT_OK(client.Read(request));
  const uint16_t port = f.server->port();
  f.server->Stop();
  // The server is gone: a clean error, no crash.
  auto down = client.Read(request);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable) << down.status().ToString();
  // Back on the same port: the next call reconnects.
  ServerOptions o = TestOptions();
  o.listen = "127.0.0.1:" + std::to_string(port);
  auto restarted = Server::Start(f.service, o);
  ASSERT_OK(restarted);
  auto result = client.Read(request);
  ASSERT_OK(result);
  f.ExpectExact(request, *result);
  EXPECT_EQ(client.reconnects(), 1u);
}

TEST(ServerTest, ClientTimesOutOnASlowServiceAndReconnects) {
  Fixture f;
  PeerClientOptions o = ClientOptions();
  o.call_timeout = 200ms;
  auto client = PeerClient::Connect(Address(*f.server), o);
  ASSERT_OK(client);
  ReadRequest request = ReadOf({{ReadKind::kSample, 3, 0, 5}});
  f.service->Gate();
  const auto start = Clock::now();
  auto slow = client->Read(request);
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_FALSE(client->connected());
  f.service->Open();
  auto result = client->Read(request);
  ASSERT_OK(result);
  f.ExpectExact(request, *result);
  EXPECT_EQ(client->reconnects(), 1u);
  // The abandoned connection's late reply finds it closed: nothing stays behind.
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 1; }));
}

TEST(ServerTest, LatencyIsRecordedForEveryAnsweredRequest) {
  Fixture f;
  PeerClient client = f.Client();
  for (int i = 0; i < 10; ++i) EXPECT_OK(client.Ping());
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().requests_total == 11; }));
  ServerCounters c = f.server->Counters();
  EXPECT_EQ(c.latency_count, 11u);
  uint64_t in_buckets = 0;
  for (uint64_t n : c.latency_buckets) in_buckets += n;
  EXPECT_EQ(in_buckets, 11u);
  EXPECT_GT(c.latency_sum_seconds, 0.0);
}

// --- authentication (protocol version 2) ----------------------------------------

constexpr char kKeyA[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";  // 32 bytes each
constexpr char kKeyB[] = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

std::shared_ptr<const ClusterKeys> Keys(std::vector<std::string> keys) {
  auto loaded = ClusterKeys::FromKeys(std::move(keys));
  EXPECT_OK(loaded);
  return std::make_shared<const ClusterKeys>(std::move(*loaded));
}

// Grants "team-a" to the token "token-a" and "team-b" to "token-b"; refuses
// the rest as the API server would. The real verifier (TokenReview) is tested
// against a real API server in tests/integration/kubernetes.
class ScriptedTokens : public TokenVerifier {
 public:
  Result<PeerIdentity> Verify(std::string_view token) override {
    ++calls;
    if (token == "token-a" || token == "token-b") {
      const std::string ns = token == "token-a" ? "team-a" : "team-b";
      return PeerIdentity{PeerIdentity::Kind::kNamespace, ns,
                          "system:serviceaccount:" + ns + ":trainer"};
    }
    return Status::PermissionDenied("the token is not valid for audience granary");
  }
  std::atomic<int> calls{0};
};

ServerOptions AuthOptions(std::shared_ptr<TokenVerifier> tokens = nullptr) {
  ServerOptions o = TestOptions();
  auto auth = std::make_shared<ServerAuth>();
  auth->cluster_keys = Keys({kKeyA, kKeyB});  // A current, B accepted too
  auth->tokens = std::move(tokens);
  // kDataset belongs to namespace team-a.
  auth->authorize = [](const PeerIdentity& who, const std::string& dataset) {
    return who.namespace_ == "team-a" && dataset == kDataset
               ? Status::Ok()
               : Status::PermissionDenied("not this namespace's");
  };
  o.auth = std::move(auth);
  return o;
}

PeerClientOptions KeyClient(const char* key) {
  PeerClientOptions o = ClientOptions();
  o.credentials.cluster_key = Keys({key});
  return o;
}

std::vector<ReadItem> FirstSamples() {
  return {{ReadKind::kSample, 0, 0, 1}, {ReadKind::kSample, 1, 0, 1}};
}

TEST(ServerAuthTest, TheClusterKeyIsProvedAndEveryDatasetReadable) {
  Fixture f(8, 1, AuthOptions());
  for (const char* key : {kKeyA, kKeyB}) {  // either key of a rotation
    auto client = PeerClient::Connect(Address(*f.server), KeyClient(key));
    ASSERT_OK(client);
    EXPECT_EQ(client->version(), 2);
    EXPECT_EQ(client->scope(), "cluster");
    ReadRequest read = ReadOf(FirstSamples());
    auto result = client->Read(read);
    ASSERT_OK(result);
    f.ExpectExact(read, *result);
  }
  ServerCounters c = f.server->Counters();
  EXPECT_EQ(c.auth_granted_total, 2u);
  EXPECT_EQ(c.auth_refused_total, 0u);
}

TEST(ServerAuthTest, NoCredentialAWrongKeyAndAnOldClientAreRefusedBeforeAnyByte) {
  Fixture f(8, 1, AuthOptions());
  // No credential: refused, and told what to configure.
  auto none = PeerClient::Connect(Address(*f.server), ClientOptions());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(none.status().message(), HasSubstr("requires authentication"));
  EXPECT_THAT(none.status().message(), HasSubstr("cluster_key_file"));
  // Another cluster's key: refused by id, the key never sent.
  auto wrong =
      PeerClient::Connect(Address(*f.server), KeyClient("cccccccccccccccccccccccccccccccc"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong.status().message(), HasSubstr("is not one of this node's"));
  // A client of version 1 cannot authenticate: refused at HELLO, saying why.
  {
    RawClient old(f.server->port());
    old.Send(RawClient::Encode(1, HelloRequest{1, 1, "old-sidecar"}));
    ExpectClosingError(old, StatusCode::kVersionMismatch, 1, "requires authentication");
  }
  // A version-2 client that skips AUTH: no READ, no dataset STAT, not even the node's STAT.
  for (const RequestMessage& request :
       {RequestMessage(ReadOf(FirstSamples())), RequestMessage(StatRequest{kDataset, {}}),
        RequestMessage(StatRequest{})}) {
    RawClient raw(f.server->port());
    raw.Send(RawClient::Encode(1, HelloRequest{1, 2, "skipper"}, 2));
    auto hello = raw.NextMessage();
    ASSERT_OK(hello);
    ASSERT_TRUE(std::holds_alternative<HelloReply>(*hello));
    EXPECT_TRUE(std::get<HelloReply>(*hello).auth_required);
    raw.Send(RawClient::Encode(2, PingRequest{}, 2));  // PING is allowed
    auto pong = raw.NextMessage();
    ASSERT_OK(pong);
    EXPECT_TRUE(std::holds_alternative<PongReply>(*pong));
    raw.Send(RawClient::Encode(3, request, 2));
    ExpectClosingError(raw, StatusCode::kPermissionDenied, 3, "before authentication");
  }
  EXPECT_EQ(f.service->calls(), 0);
  EXPECT_EQ(f.server->Counters().auth_granted_total, 0u);
  EXPECT_GE(f.server->Counters().auth_refused_total, 5u);
}

// The client's side of a cluster-key handshake on a raw socket: the challenge.
AuthReply Challenge(RawClient& raw, const AuthNonce& client_nonce, const char* key) {
  raw.Send(RawClient::Encode(1, HelloRequest{1, 2, "replayer"}, 2));
  auto hello = raw.NextMessage();
  EXPECT_OK(hello);
  const KeyId id = ClusterKeyId(key);
  raw.Send(RawClient::Encode(
      2,
      AuthRequest{AuthMethod::kClusterKey, client_nonce,
                  std::string(reinterpret_cast<const char*>(id.data()), id.size())},
      2));
  auto reply = raw.NextMessage();
  EXPECT_OK(reply);
  if (!reply.ok() || !std::holds_alternative<AuthReply>(*reply)) return {};
  return std::get<AuthReply>(*reply);
}

TEST(ServerAuthTest, AProofIsGoodForItsOwnConnectionOnly) {
  Fixture f(8, 1, AuthOptions());
  const AuthNonce nonce = RandomNonce();
  AuthProof recorded{};
  {
    RawClient first(f.server->port());
    AuthReply challenge = Challenge(first, nonce, kKeyA);
    EXPECT_FALSE(challenge.granted);
    // The server proves it holds the key.
    EXPECT_TRUE(ProofsEqual(challenge.server_proof,
                            ClusterKeyProof(kKeyA, ProofRole::kServer, nonce,
                                            challenge.server_nonce, "node-test", "replayer")));
    recorded = ClusterKeyProof(kKeyA, ProofRole::kClient, nonce, challenge.server_nonce,
                               "node-test", "replayer");
    first.Send(RawClient::Encode(3, AuthProofRequest{recorded}, 2));
    auto granted = first.NextMessage();
    ASSERT_OK(granted);
    ASSERT_TRUE(std::holds_alternative<AuthProofReply>(*granted));
    EXPECT_EQ(std::get<AuthProofReply>(*granted).scope, "cluster");
  }
  // The same client nonce and the recorded proof on a new connection: the
  // server's nonce is new, so the proof is refused.
  RawClient second(f.server->port());
  AuthReply challenge = Challenge(second, nonce, kKeyA);
  second.Send(RawClient::Encode(3, AuthProofRequest{recorded}, 2));
  ExpectClosingError(second, StatusCode::kPermissionDenied, 3, "does not match");
  // The server's own proof sent back as the client's: refused too.
  RawClient third(f.server->port());
  AuthReply mirrored = Challenge(third, nonce, kKeyA);
  third.Send(RawClient::Encode(3, AuthProofRequest{mirrored.server_proof}, 2));
  ExpectClosingError(third, StatusCode::kPermissionDenied, 3, "does not match");
  EXPECT_EQ(f.server->Counters().auth_granted_total, 1u);
}

TEST(ServerAuthTest, HandshakeMisstepsCloseTheConnection) {
  Fixture f(8, 1, AuthOptions());
  {  // AUTH_PROOF without a challenge
    RawClient raw(f.server->port());
    raw.Send(RawClient::Encode(1, HelloRequest{1, 2, "x"}, 2));
    ASSERT_OK(raw.NextMessage());
    raw.Send(RawClient::Encode(2, AuthProofRequest{}, 2));
    ExpectClosingError(raw, StatusCode::kFailedPrecondition, 2, "without a challenge");
  }
  {  // a second AUTH after a challenge
    RawClient raw(f.server->port());
    Challenge(raw, RandomNonce(), kKeyA);
    const KeyId id = ClusterKeyId(kKeyA);
    raw.Send(RawClient::Encode(
        3,
        AuthRequest{AuthMethod::kClusterKey,
                    {},
                    std::string(reinterpret_cast<const char*>(id.data()), id.size())},
        2));
    ExpectClosingError(raw, StatusCode::kFailedPrecondition, 3, "a second AUTH");
  }
  {  // a token to a node that takes none
    RawClient raw(f.server->port());
    raw.Send(RawClient::Encode(1, HelloRequest{1, 2, "x"}, 2));
    ASSERT_OK(raw.NextMessage());
    raw.Send(RawClient::Encode(2, AuthRequest{AuthMethod::kKubernetesToken, {}, "token-a"}, 2));
    ExpectClosingError(raw, StatusCode::kPermissionDenied, 2, "accepts no Kubernetes tokens");
  }
  // AUTH to a node that requires none.
  Fixture open;
  RawClient raw(open.server->port());
  raw.Send(RawClient::Encode(1, HelloRequest{1, 2, "x"}, 2));
  ASSERT_OK(raw.NextMessage());
  raw.Send(RawClient::Encode(2, AuthRequest{AuthMethod::kKubernetesToken, {}, "token-a"}, 2));
  ExpectClosingError(raw, StatusCode::kFailedPrecondition, 2, "requires no authentication");
}

TEST(ServerAuthTest, AConnectionThatNeverAuthenticatesIsClosed) {
  ServerOptions o = AuthOptions();
  o.handshake_timeout = 300ms;
  Fixture f(8, 1, o);
  RawClient raw(f.server->port());
  raw.Send(RawClient::Encode(1, HelloRequest{1, 2, "lingerer"}, 2));
  ASSERT_OK(raw.NextMessage());
  ExpectClosingError(raw, StatusCode::kDeadlineExceeded, 0, "not authenticated within");
}

TEST(ServerAuthTest, ATokenReadsOnlyItsNamespacesDatasets) {
  auto tokens = std::make_shared<ScriptedTokens>();
  Fixture f(8, 1, AuthOptions(tokens));
  TempDir dir;
  auto client_with = [&](const std::string& token) {
    dir.WriteFile("token", token + "\n");  // as the kubelet writes it, line end or not
    PeerClientOptions o = ClientOptions();
    o.credentials.token_file = dir.Join("token");
    return PeerClient::Connect(Address(*f.server), o);
  };
  auto a = client_with("token-a");
  ASSERT_OK(a);
  EXPECT_EQ(a->scope(), "namespace/team-a");
  ReadRequest read = ReadOf(FirstSamples());
  auto bytes = a->Read(read);
  ASSERT_OK(bytes);
  f.ExpectExact(read, *bytes);
  EXPECT_OK(a->Stat());  // the node's own STAT
  // Another namespace's token: the same dataset is refused, by the same words
  // as a dataset that does not exist; the connection goes on.
  auto b = client_with("token-b");
  ASSERT_OK(b);
  const int calls = f.service->calls();
  auto refused = b->Read(read);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("not readable as namespace/team-b"));
  auto unknown = b->Read(ReadOf(FirstSamples(), "no-such"));
  EXPECT_EQ(unknown.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(b->Stat(StatRequest{kDataset, {}}).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(f.service->calls(), calls);  // nothing reached the read service
  EXPECT_OK(b->Ping());
  EXPECT_EQ(b->reconnects(), 0u);
  // A token the verifier refuses.
  auto forged = client_with("forged");
  ASSERT_FALSE(forged.ok());
  EXPECT_EQ(forged.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(forged.status().message(), HasSubstr("audience granary"));
  // A token file that is not there.
  PeerClientOptions o = ClientOptions();
  o.credentials.token_file = dir.Join("none");
  auto missing = PeerClient::Connect(Address(*f.server), o);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("token file"));
  EXPECT_EQ(tokens->calls, 3);
}

// --- places per address ------------------------------------------------------------

TEST(ServerPlacesTest, OneAddressCannotTakeEveryPlace) {
  ServerOptions o = TestOptions();
  o.max_connections = 8;
  o.max_connections_per_address = 3;
  Fixture f(8, 1, o);
  // Three from 127.0.0.1 hold their places (they PING; they are not idle)...
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawClient>(f.server->port()));
    held.back()->Hello();
  }
  // ...a fourth from the same address is refused, naming the address...
  RawClient fourth(f.server->port());
  ExpectClosingError(fourth, StatusCode::kResourceExhausted, 0, "from 127.0.0.1");
  // ...and another host still gets in.
  RawClient other(f.server->port(), 0, "127.0.0.2");
  other.Hello();
  other.Send(RawClient::Encode(2, PingRequest{}));
  auto pong = other.NextMessage();
  ASSERT_OK(pong);
  EXPECT_TRUE(std::holds_alternative<PongReply>(*pong));
  // A closed connection gives its place back.
  held.pop_back();
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 3; }));
  RawClient again(f.server->port());
  again.Hello();
  EXPECT_EQ(f.server->Counters().connections_rejected_total, 1u);
}

TEST(ServerPlacesTest, ConnectionsThatDoNotAuthenticateHoldFewPlaces) {
  ServerOptions o = AuthOptions();
  o.max_connections = 64;
  o.max_unauthenticated_per_address = 2;
  Fixture f(8, 1, o);
  // Two lingerers that never authenticate...
  RawClient a(f.server->port()), b(f.server->port());
  for (RawClient* raw : {&a, &b}) {
    raw->Send(RawClient::Encode(1, HelloRequest{1, 2, "lingerer"}, 2));
    ASSERT_OK(raw->NextMessage());
  }
  // ...a third from that address is refused before its HELLO.
  RawClient c(f.server->port());
  ExpectClosingError(c, StatusCode::kResourceExhausted, 0, "have not authenticated");
  // Even a client with the key, from that address, until a lingerer leaves;
  // once authenticated, a connection no longer counts against the address.
  auto refused = PeerClient::Connect(Address(*f.server), KeyClient(kKeyA));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  a.Close();
  ASSERT_TRUE(WaitFor([&] { return f.server->Counters().connections_open == 1; }));
  auto keyed = PeerClient::Connect(Address(*f.server), KeyClient(kKeyA));
  ASSERT_OK(keyed);
  auto keyed2 = PeerClient::Connect(Address(*f.server), KeyClient(kKeyA));
  ASSERT_OK(keyed2);  // the first one's place counts as authenticated now
  EXPECT_OK(keyed->Ping());
  EXPECT_OK(keyed2->Ping());
}

// --- TLS ------------------------------------------------------------------------

struct TlsFiles {
  std::string cert, key;
};

TlsFiles SelfSigned(const TempDir& dir, const std::string& name,
                    const std::vector<std::string>& hosts) {
  TlsFiles f{dir.Join(name + ".crt"), dir.Join(name + ".key")};
  EXPECT_OK(MakeSelfSignedCertificate(f.cert, f.key, hosts));
  return f;
}

ServerOptions TlsOptions(const TlsFiles& files, ServerOptions o = TestOptions()) {
  auto tls = TlsContext::ForServer(files.cert, files.key);
  EXPECT_OK(tls);
  if (tls.ok()) o.tls = *tls;
  return o;
}

PeerClientOptions TlsClient(const std::string& ca, PeerClientOptions o = ClientOptions()) {
  auto tls = TlsContext::ForClient(ca);
  EXPECT_OK(tls);
  if (tls.ok()) o.tls = *tls;
  return o;
}

TEST(ServerTlsTest, RepliesFromFilesAndMemoryArriveWholeOverAVerifiedTlsConnection) {
  TempDir certs;
  const TlsFiles files = SelfSigned(certs, "node", {"127.0.0.1", "node-test"});
  Fixture f(64, 8, TlsOptions(files), 200000, 1 << 20);
  auto client = PeerClient::Connect(Address(*f.server), TlsClient(files.cert));
  ASSERT_OK(client);
  // Every sample (file ranges: read for TLS, not sendfile) and every chunk
  // range (memory), in batches large enough to take many TLS records.
  std::vector<ReadItem> items;
  for (uint32_t i = 0; i < 64; ++i) {
    items.push_back({ReadKind::kSample, i, 0, static_cast<uint32_t>(f.service->sample(i).size())});
  }
  for (uint32_t i = 0; i < 8; ++i) items.push_back({ReadKind::kChunkRange, i, 1000, 500000});
  ReadRequest read = ReadOf(items);
  auto result = client->Read(read);
  ASSERT_OK(result);
  f.ExpectExact(read, *result);
  EXPECT_OK(client->Ping());
  EXPECT_EQ(f.server->Counters().sendfile_bytes_total, 0u);  // no sendfile through TLS
}

TEST(ServerTlsTest, TheClusterKeyIsProvedInsideTheTlsChannel) {
  TempDir certs;
  const TlsFiles files = SelfSigned(certs, "node", {"127.0.0.1"});
  Fixture f(8, 1, TlsOptions(files, AuthOptions()));
  // Unverified TLS (no CA): the proofs are bound to this channel.
  PeerClientOptions o = TlsClient("", KeyClient(kKeyA));
  auto client = PeerClient::Connect(Address(*f.server), o);
  ASSERT_OK(client);
  EXPECT_EQ(client->scope(), "cluster");
  ReadRequest read = ReadOf(FirstSamples());
  auto result = client->Read(read);
  ASSERT_OK(result);
  f.ExpectExact(read, *result);
  // The proof made without the channel binding is refused: a relay between
  // two TLS sessions could not pass a client's proof on.
  const AuthNonce a = RandomNonce(), b = RandomNonce();
  EXPECT_FALSE(ProofsEqual(ClusterKeyProof(kKeyA, ProofRole::kClient, a, b, "n", "c"),
                           ClusterKeyProof(kKeyA, ProofRole::kClient, a, b, "n", "c", "binding")));
}

TEST(ServerTlsTest, MismatchedEndsAndUnverifiableCertificatesAreRefusedSayingWhy) {
  TempDir certs;
  const TlsFiles node = SelfSigned(certs, "node", {"127.0.0.1"});
  const TlsFiles other = SelfSigned(certs, "other", {"127.0.0.1"});
  const TlsFiles elsewhere = SelfSigned(certs, "elsewhere", {"10.1.2.3", "gpu-9"});
  {
    Fixture tls(8, 1, TlsOptions(node));
    // A plain client to a TLS node: no answer it could take for the protocol.
    auto plain = PeerClient::Connect(Address(*tls.server), ClientOptions());
    ASSERT_FALSE(plain.ok());
    // A CA the node's certificate does not chain to.
    auto untrusted = PeerClient::Connect(Address(*tls.server), TlsClient(other.cert));
    ASSERT_FALSE(untrusted.ok());
    EXPECT_EQ(untrusted.status().code(), StatusCode::kPermissionDenied);
    EXPECT_THAT(untrusted.status().message(), HasSubstr("does not verify"));
    // The serving process still answers a good client.
    auto good = PeerClient::Connect(Address(*tls.server), TlsClient(node.cert));
    ASSERT_OK(good);
    EXPECT_OK(good->Ping());
  }
  {
    // A certificate for other names than the one the node is reached by.
    Fixture tls(8, 1, TlsOptions(elsewhere));
    auto misnamed = PeerClient::Connect(Address(*tls.server), TlsClient(elsewhere.cert));
    ASSERT_FALSE(misnamed.ok());
    EXPECT_EQ(misnamed.status().code(), StatusCode::kPermissionDenied);
  }
  {
    // A TLS client to a plain node.
    Fixture plain;
    auto tls = PeerClient::Connect(Address(*plain.server), TlsClient(node.cert));
    ASSERT_FALSE(tls.ok());
    EXPECT_THAT(tls.status().message(), HasSubstr("does the node serve TLS"));
  }
  // Bad files: named, with what to give.
  EXPECT_THAT(TlsContext::ForServer(certs.Join("none.crt"), node.key).status().message(),
              HasSubstr("none.crt"));
  EXPECT_THAT(TlsContext::ForServer(node.cert, other.key).status().message(),
              HasSubstr("does not match"));
  EXPECT_THAT(TlsContext::ForClient(certs.Join("none.crt")).status().message(),
              HasSubstr("CA file"));
}

}  // namespace
}  // namespace granary

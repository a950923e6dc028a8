// PeerClient against a scripted TCP server on 127.0.0.1: a real socket peer
// that speaks the codec and can also misbehave in ways a correct cache node
// never does (stall, cut a reply, answer garbage or the wrong request), which
// is what the client must survive. The happy path against the real cache node
// server is in tests/cachenode/server_test.cc.

#include "granary/peer/peer_client.h"

#include <gmock/gmock.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/byte_order.h"
#include "granary/core/hash.h"
#include "granary/protocol/protocol_format.h"
#include "testing/test_util.h"

namespace granary {
namespace {

namespace pf = protocol_format;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const ContentId kManifest{0x1111111111111111ull, 0x2222222222222222ull};

// One accepted connection, seen from the scripted server.
class ScriptConn {
 public:
  explicit ScriptConn(int fd) : fd_(fd), decoder_(FrameDirection::kRequests) {}

  // The next request frame, or an error when the client closed or `timeout` passed.
  Result<Frame> Next(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    for (int round = 0; round < 100000; ++round) {
      if (!buffer_.empty()) {
        GRANARY_ASSIGN_OR_RETURN(size_t used, decoder_.Feed(buffer_));
        buffer_.erase(0, used);
      }
      if (decoder_.has_frame()) return decoder_.TakeFrame();
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Status::DeadlineExceeded("script: no request in time");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[65536];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return Status::Unavailable("script: the client closed the connection");
      buffer_.append(chunk, static_cast<size_t>(n));
    }
    return Status::DeadlineExceeded("script: too many rounds");
  }

  void Send(std::string_view bytes) {
    size_t sent = 0;
    for (int round = 0; sent < bytes.size() && round < 100000; ++round) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // the client is gone: the test's assertions say whether that is right
      sent += static_cast<size_t>(n);
    }
  }

  void Reply(uint64_t id, const ResponseMessage& m, std::vector<PayloadPiece> payload = {},
             const EncodeOptions& options = {}) {
    auto frame = EncodeResponse(id, m, std::move(payload), options);
    ASSERT_OK(frame);
    auto flat = Flatten(*frame);
    ASSERT_OK(flat);
    Send(*flat);
  }

  // Answers the HELLO that opens the connection; returns its request.
  HelloRequest AnswerHello(const ProtocolLimits& limits = {}) {
    auto frame = Next();
    EXPECT_OK(frame);
    if (!frame.ok()) return {};
    auto message = DecodeRequest(*frame);
    EXPECT_OK(message);
    if (!message.ok()) return {};
    auto hello = std::get<HelloRequest>(*message);
    Reply(frame->header.request_id, HelloReply{pf::kMaxVersion, "scripted-node", limits});
    return hello;
  }

  // Reads until the client closes (or `timeout`): true if it did.
  bool WaitClosed(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    for (int round = 0; round < 100000 && Clock::now() < deadline; ++round) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char chunk[4096];
      if (::recv(fd_, chunk, sizeof(chunk), 0) <= 0) return true;
    }
    return false;
  }

  int fd() const { return fd_; }

 private:
  int fd_;
  FrameDecoder decoder_;
  std::string buffer_;
};

// Listens on 127.0.0.1 (a free port) and runs script(conn, index) for each
// accepted connection in turn, on its own thread, closing the connection
// when the script returns.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::function<void(ScriptConn&, int)> script)
      : script_(std::move(script)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_.load(); }
  int finished() const { return finished_.load(); }  // connections closed by the server

 private:
  void Run() {
    // Bounded: the destructor sets stop_, and each poll waits 20 ms at most.
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ScriptConn conn(fd);
      int index = accepted_++;
      script_(conn, index);
      ::close(fd);
      ++finished_;
    }
  }

  std::function<void(ScriptConn&, int)> script_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> finished_{0};
  std::thread thread_;
};

PeerClientOptions FastOptions() {
  PeerClientOptions o;
  o.client_name = "test-client";
  o.connect_timeout = 2s;
  o.call_timeout = 2s;
  return o;
}

ReadRequest ReadOf(std::vector<ReadItem> items) {
  return ReadRequest{"mnist", kManifest, std::move(items)};
}

// Answers every READ, PING and STAT on the connection correctly for a store
// whose sample `id` is `id + 1` bytes of the letter 'a' + id % 26.
void ServeWell(ScriptConn& conn) {
  for (int i = 0; i < 1000; ++i) {
    auto frame = conn.Next();
    if (!frame.ok()) return;
    auto message = DecodeRequest(*frame);
    if (!message.ok()) return;
    const uint64_t id = frame->header.request_id;
    if (std::holds_alternative<PingRequest>(*message)) {
      conn.Reply(id, PongReply{});
    } else if (std::holds_alternative<StatRequest>(*message)) {
      conn.Reply(id, StatReply{NodeState::kServing, {{"samples", 42}}});
    } else if (auto* read = std::get_if<ReadRequest>(&*message)) {
      ReadReply reply;
      std::vector<std::string> bytes;
      for (const ReadItem& item : read->items) {
        std::string sample(item.id + 1, static_cast<char>('a' + item.id % 26));
        if (item.offset + item.length > sample.size()) {
          reply.items.push_back({Status::OutOfRange("past the sample"), 0, std::nullopt});
          continue;
        }
        bytes.push_back(sample.substr(item.offset, item.length));
        reply.items.push_back({Status::Ok(), item.length, Checksum64(bytes.back())});
      }
      std::vector<PayloadPiece> pieces(bytes.begin(), bytes.end());
      conn.Reply(id, reply, pieces);
    } else {
      return;
    }
  }
}

// --- options ---------------------------------------------------------------
// (Addresses: tests/core/net_address_test.cc.)

TEST(PeerClientOptionsTest, RejectsBadOptions) {
  PeerClientOptions o = FastOptions();
  EXPECT_OK(o.Validate());
  o.client_name = "has space";
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
  o = FastOptions();
  o.client_name = "";
  EXPECT_FALSE(o.Validate().ok());
  o = FastOptions();
  o.connect_timeout = 0ms;
  EXPECT_THAT(o.Validate().message(), HasSubstr("connect_timeout"));
  o = FastOptions();
  o.call_timeout = -1ms;
  EXPECT_THAT(o.Validate().message(), HasSubstr("call_timeout"));
  o = FastOptions();
  o.limits.max_items = 0;
  EXPECT_FALSE(o.Validate().ok());
  // Connect checks them too, before touching the network.
  o.client_name = "x y";
  auto client = PeerClient::Connect("127.0.0.1:1", o);
  EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
  auto port0 = PeerClient::Connect("127.0.0.1:0", FastOptions());
  EXPECT_EQ(port0.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(port0.status().message(), HasSubstr("port 0"));
}

// --- connecting -----------------------------------------------------------

TEST(PeerClientTest, ConnectToAClosedPortIsUnavailable) {
  const uint16_t port = testing::FreeTcpPort();
  auto client = PeerClient::Connect("127.0.0.1:" + std::to_string(port), FastOptions());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("127.0.0.1:" + std::to_string(port)));
}

TEST(PeerClientTest, ConnectToAnUnresolvableNameIsUnavailable) {
  auto client = PeerClient::Connect("no-such-host.invalid:7070", FastOptions());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
}

TEST(PeerClientTest, HelloUnansweredTimesOutWithinTheConnectTimeout) {
  ScriptedServer server([](ScriptConn& conn, int) { conn.WaitClosed(); });
  PeerClientOptions o = FastOptions();
  o.connect_timeout = 200ms;
  const auto start = Clock::now();
  auto client = PeerClient::Connect(server.address(), o);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 3s);
}

TEST(PeerClientTest, HandshakeAdoptsTheCommonLimits) {
  ProtocolLimits server_limits;
  server_limits.max_items = 100;
  server_limits.max_read_bytes = 1 << 20;
  server_limits.max_message_bytes = pf::kFrameHeaderSize + server_limits.max_body_bytes + (1 << 20);
  ASSERT_OK(server_limits.Validate());
  HelloRequest seen;
  ScriptedServer server([&](ScriptConn& conn, int) {
    seen = conn.AnswerHello(server_limits);
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  EXPECT_TRUE(client->connected());
  EXPECT_EQ(client->version(), pf::kMaxVersion);
  EXPECT_EQ(client->server_name(), "scripted-node");
  EXPECT_EQ(client->limits(), CommonLimits(ProtocolLimits{}, server_limits));
  EXPECT_EQ(client->reconnects(), 0u);
  EXPECT_OK(client->Ping());
  client->Close();
  ASSERT_TRUE(testing::WaitFor([&] { return server.accepted() == 1; }));
  EXPECT_EQ(seen.peer_name, "test-client");
  EXPECT_EQ(seen.min_version, pf::kMinVersion);
  EXPECT_EQ(seen.max_version, pf::kMaxVersion);
}

TEST(PeerClientTest, NoCommonVersionIsVersionMismatch) {
  ScriptedServer server([](ScriptConn& conn, int) {
    auto frame = conn.Next();
    if (!frame.ok()) return;
    conn.Send(EncodeError(frame->header.request_id,
                          Status::VersionMismatch("server speaks 7..9, client 1..1"), true));
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kVersionMismatch);
  EXPECT_THAT(client.status().message(), HasSubstr("7..9"));
}

TEST(PeerClientTest, HelloAnsweredWithSomethingElseIsRejected) {
  ScriptedServer server([](ScriptConn& conn, int) {
    auto frame = conn.Next();
    if (!frame.ok()) return;
    conn.Reply(frame->header.request_id, PongReply{});
    conn.WaitClosed();
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(client.status().message(), HasSubstr("PONG"));
}

// --- calls ------------------------------------------------------------------

TEST(PeerClientTest, ReadReturnsBytesPerItemStatusAndChecksChecksums) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    auto frame = conn.Next();
    if (!frame.ok()) return;
    ReadReply reply;
    std::string good = "hello world";
    std::string tampered = "tampered!";
    reply.items.push_back({Status::Ok(), static_cast<uint32_t>(good.size()), Checksum64(good)});
    reply.items.push_back({Status::NotFound("chunk 3 is not here"), 0, std::nullopt});
    reply.items.push_back(
        {Status::Ok(), static_cast<uint32_t>(tampered.size()), Checksum64("original!")});
    reply.items.push_back({Status::Ok(), 4, std::nullopt});  // no checksum: taken as is
    conn.Reply(frame->header.request_id, reply,
               {std::string_view(good), std::string_view(tampered), std::string_view("abcd")});
    conn.WaitClosed();
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  auto result = client->Read(ReadOf({{ReadKind::kSample, 1, 0, 11},
                                     {ReadKind::kChunkRange, 3, 0, 10},
                                     {ReadKind::kSample, 2, 0, 9},
                                     {ReadKind::kSample, 4, 0, 4}}));
  ASSERT_OK(result);
  ASSERT_EQ(result->size(), 4u);
  EXPECT_OK(result->status(0));
  EXPECT_EQ(result->bytes(0), "hello world");
  EXPECT_EQ(result->status(1).code(), StatusCode::kNotFound);
  EXPECT_EQ(result->bytes(1), "");
  EXPECT_EQ(result->status(2).code(), StatusCode::kCorruption);
  EXPECT_THAT(result->status(2).message(), HasSubstr("checksum"));
  EXPECT_EQ(result->bytes(2), "");
  EXPECT_OK(result->status(3));
  EXPECT_EQ(result->bytes(3), "abcd");
  EXPECT_TRUE(client->connected());
}

TEST(PeerClientTest, ReadAgainstAWellBehavedServer) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  std::vector<ReadItem> items;
  for (uint32_t id = 0; id < 200; ++id) items.push_back({ReadKind::kSample, id, 0, id + 1});
  items.push_back({ReadKind::kSample, 5, 3, 100});  // past the end
  auto result = client->Read(ReadOf(items));
  ASSERT_OK(result);
  for (uint32_t id = 0; id < 200; ++id) {
    ASSERT_OK(result->status(id));
    EXPECT_EQ(result->bytes(id), std::string(id + 1, static_cast<char>('a' + id % 26)));
  }
  EXPECT_EQ(result->status(200).code(), StatusCode::kOutOfRange);
  auto stat = client->Stat();
  ASSERT_OK(stat);
  EXPECT_EQ(stat->entries, (std::vector<StatEntry>{{"samples", 42}}));
}

TEST(PeerClientTest, CallTimeoutClosesTheConnectionAndTheNextCallReconnects) {
  ScriptedServer server([](ScriptConn& conn, int index) {
    conn.AnswerHello();
    if (index == 0) {
      (void)conn.Next();  // take the request and never answer it
      conn.WaitClosed();
      return;
    }
    ServeWell(conn);
  });
  PeerClientOptions o = FastOptions();
  o.call_timeout = 200ms;
  auto client = PeerClient::Connect(server.address(), o);
  ASSERT_OK(client);
  const auto start = Clock::now();
  Status timed_out = client->Ping();
  EXPECT_EQ(timed_out.code(), StatusCode::kDeadlineExceeded) << timed_out.ToString();
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_FALSE(client->connected());
  EXPECT_OK(client->Ping());
  EXPECT_EQ(client->reconnects(), 1u);
  EXPECT_EQ(server.accepted(), 2);
}

TEST(PeerClientTest, ServerClosingMidReplyIsUnavailableAndTheNextCallReconnects) {
  ScriptedServer server([](ScriptConn& conn, int index) {
    conn.AnswerHello();
    if (index == 0) {
      auto frame = conn.Next();
      if (!frame.ok()) return;
      std::string bytes(1000, 'x');
      ReadReply reply{{{Status::Ok(), 1000, std::nullopt}}};
      auto out = EncodeResponse(frame->header.request_id, reply, {std::string_view(bytes)});
      ASSERT_OK(out);
      auto flat = Flatten(*out);
      ASSERT_OK(flat);
      conn.Send(std::string_view(*flat).substr(0, flat->size() - 500));  // half the payload
      return;                                                            // and close
    }
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  auto cut = client->Read(ReadOf({{ReadKind::kSample, 999, 0, 1000}}));
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(cut.status().message(), HasSubstr("500 of 1000 payload bytes"));
  EXPECT_FALSE(client->connected());
  auto again = client->Read(ReadOf({{ReadKind::kSample, 9, 0, 10}}));
  ASSERT_OK(again);
  EXPECT_EQ(again->bytes(0), std::string(10, 'j'));
  EXPECT_EQ(client->reconnects(), 1u);
}

TEST(PeerClientTest, ServerClosingMidHeaderIsUnavailable) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    auto frame = conn.Next();
    if (!frame.ok()) return;
    auto out = EncodeResponse(frame->header.request_id, PongReply{});
    ASSERT_OK(out);
    conn.Send(std::string_view(out->header).substr(0, 12));
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  Status s = client->Ping();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("12 of 32 header bytes"));
}

TEST(PeerClientTest, GarbageFromTheServerFailsTheCallAndClosesTheConnection) {
  ScriptedServer server([](ScriptConn& conn, int index) {
    conn.AnswerHello();
    if (index == 0) {
      (void)conn.Next();
      std::mt19937 rng(7);
      std::string garbage(4096, '\0');
      for (char& c : garbage) c = static_cast<char>(rng());
      conn.Send(garbage);
      conn.WaitClosed();
      return;
    }
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  Status s = client->Ping();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("not the protocol"));
  EXPECT_FALSE(client->connected());
  EXPECT_OK(client->Ping());
}

TEST(PeerClientTest, ReplyForAnotherRequestIsRejected) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    auto frame = conn.Next();
    if (!frame.ok()) return;
    conn.Reply(frame->header.request_id + 1, PongReply{});
    conn.WaitClosed();
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  Status s = client->Ping();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("while request"));
  EXPECT_FALSE(client->connected());
}

TEST(PeerClientTest, WrongReplyTypeOrShapeIsRejected) {
  ScriptedServer server([](ScriptConn& conn, int index) {
    conn.AnswerHello();
    auto frame = conn.Next();
    if (!frame.ok()) return;
    const uint64_t id = frame->header.request_id;
    if (index == 0) {
      conn.Reply(id, StatReply{});  // a STAT_REPLY for a PING
    } else {
      // A READ_REPLY with the wrong number of items.
      conn.Reply(id, ReadReply{{{Status::Ok(), 1, std::nullopt}, {Status::Ok(), 1, std::nullopt}}},
                 {std::string_view("ab")});
    }
    conn.WaitClosed();
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  Status ping = client->Ping();
  EXPECT_EQ(ping.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(ping.message(), HasSubstr("STAT_REPLY"));
  auto read = client->Read(ReadOf({{ReadKind::kSample, 0, 0, 1}}));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("does not match"));
  EXPECT_FALSE(client->connected());
}

TEST(PeerClientTest, ErrorForOneRequestKeepsTheConnection) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    auto frame = conn.Next();
    if (!frame.ok()) return;
    conn.Send(EncodeError(frame->header.request_id,
                          Status::NotFound("dataset 'mnist' is not served here"), false));
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  auto read = client->Read(ReadOf({{ReadKind::kSample, 0, 0, 1}}));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr("not served here"));
  EXPECT_TRUE(client->connected());
  EXPECT_OK(client->Ping());
  EXPECT_EQ(client->reconnects(), 0u);
  EXPECT_EQ(server.accepted(), 1);
}

TEST(PeerClientTest, ConnectionLevelErrorCarriesTheServersStatus) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    (void)conn.Next();
    conn.Send(EncodeError(0, Status::ResourceExhausted("too many connections"), true));
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  Status s = client->Ping();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("too many connections"));
  EXPECT_FALSE(client->connected());
}

TEST(PeerClientTest, ConnectionClosedWhileIdleIsReplacedBeforeTheNextCall) {
  ScriptedServer server([](ScriptConn& conn, int index) {
    conn.AnswerHello();
    if (index == 0) {
      // An idle timeout: an unsolicited closing ERROR, then the close.
      conn.Send(EncodeError(0, Status::DeadlineExceeded("idle for 300 ms"), true));
      return;
    }
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  // The script has sent its ERROR and closed the connection (on loopback both
  // are in the client's receive queue once close returns).
  ASSERT_TRUE(testing::WaitFor([&] { return server.finished() == 1; }));
  // The next call notices and reconnects instead of failing.
  EXPECT_OK(client->Ping());
  EXPECT_EQ(client->reconnects(), 1u);
}

TEST(PeerClientTest, RequestsTheLimitsRejectAreNotSent) {
  ProtocolLimits server_limits;
  server_limits.max_items = 4;
  ASSERT_OK(server_limits.Validate());
  ScriptedServer server([&](ScriptConn& conn, int) {
    conn.AnswerHello(server_limits);
    ServeWell(conn);  // fails the test's PING if a bad READ reached it first
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  auto empty = client->Read(ReadOf({}));
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  auto zero = client->Read(ReadOf({{ReadKind::kSample, 0, 0, 0}}));
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  auto bad_name =
      client->Read(ReadRequest{"Not A Label", kManifest, {{ReadKind::kSample, 0, 0, 1}}});
  EXPECT_EQ(bad_name.status().code(), StatusCode::kInvalidArgument);
  std::vector<ReadItem> five(5, ReadItem{ReadKind::kSample, 0, 0, 1});
  auto too_many = client->Read(ReadOf(five));
  EXPECT_EQ(too_many.status().code(), StatusCode::kOutOfRange);
  EXPECT_THAT(too_many.status().message(), HasSubstr("limits of cache node"));
  EXPECT_TRUE(client->connected());
  EXPECT_OK(client->Ping());
  EXPECT_EQ(client->reconnects(), 0u);
}

TEST(PeerClientTest, PayloadOverTheClientsLimitIsRefusedBeforeItIsBuffered) {
  // The server advertises generous limits but the client's own are small:
  // a reply announcing more than the client accepts is a framing error.
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    auto frame = conn.Next();
    if (!frame.ok()) return;
    std::string header(pf::kFrameHeaderSize, '\0');
    std::memcpy(header.data(), pf::kMagic, 4);
    StoreLe(header.data() + pf::kVersionOffset, pf::kMaxVersion);  // the one agreed
    StoreLe(header.data() + pf::kTypeOffset, pf::kTypeReadReply);
    StoreLe(header.data() + pf::kBodyLengthOffset, uint32_t{32});
    StoreLe(header.data() + pf::kPayloadLengthOffset, uint64_t{1} << 29);
    StoreLe(header.data() + pf::kRequestIdOffset, frame->header.request_id);
    conn.Send(header);
    conn.WaitClosed();
  });
  PeerClientOptions o = FastOptions();
  o.limits.max_read_bytes = 1 << 20;
  o.limits.max_message_bytes = pf::kFrameHeaderSize + o.limits.max_body_bytes + (1 << 20);
  auto client = PeerClient::Connect(server.address(), o);
  ASSERT_OK(client);
  auto read = client->Read(ReadOf({{ReadKind::kSample, 0, 0, 1}}));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(client->connected());
}

TEST(PeerClientTest, MovedClientKeepsItsConnection) {
  ScriptedServer server([](ScriptConn& conn, int) {
    conn.AnswerHello();
    ServeWell(conn);
  });
  auto client = PeerClient::Connect(server.address(), FastOptions());
  ASSERT_OK(client);
  PeerClient moved = std::move(*client);
  EXPECT_TRUE(moved.connected());
  EXPECT_OK(moved.Ping());
  EXPECT_EQ(server.accepted(), 1);
}

}  // namespace
}  // namespace granary

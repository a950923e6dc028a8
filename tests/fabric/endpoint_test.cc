// The libfabric endpoints and listener (fabric/), over the tcp provider on
// 127.0.0.1: messages both ways, RMA into a registered window, registrations
// cached, and the failures a reader and a node meet (no listener, a peer gone,
// a deadline, a write past the window, a message too long, a provider absent).

#include "granary/fabric/endpoint.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <future>
#include <string>

namespace granary::fabric {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

Deadline In(std::chrono::milliseconds d) { return Clock::now() + d; }

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<Endpoint> client;
  std::unique_ptr<Endpoint> server;
};

Pair Connect(size_t max_message = 4096) {
  Pair p;
  EndpointOptions options;
  options.max_message_bytes = max_message;
  auto listener = Listener::Listen(NetAddress{"127.0.0.1", 0}, options);
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  if (!listener.ok()) return p;
  p.listener = std::move(*listener);
  EXPECT_NE(p.listener->port(), 0);
  auto accepted = std::async(std::launch::async, [&] { return p.listener->Accept(In(5s)); });
  auto client = Endpoint::Connect(NetAddress{"127.0.0.1", p.listener->port()}, options, In(5s));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  auto server = accepted.get();
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (client.ok()) p.client = std::move(*client);
  if (server.ok()) p.server = std::move(*server);
  return p;
}

bool LibfabricLoaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("libfabric.so") != std::string::npos) return true;
  }
  return false;
}

void OurHandler(int) {}

// First in this file, so that it runs before anything here loads libfabric:
// linking granary::fabric loads nothing (libfabric's PSM providers would take
// over SIGTERM, SIGINT, SIGSEGV, ... at load: a daemon's SIGTERM before its
// signals are blocked became exit(1)); the first use loads it and puts back
// the handlers the process had.
TEST(FabricEndpointTest, LibfabricIsLoadedOnlyWhenUsedAndLeavesTheSignalHandlersAlone) {
  EXPECT_FALSE(LibfabricLoaded()) << "libfabric was loaded before any use";
  struct sigaction ours {};
  ours.sa_handler = OurHandler;
  struct sigaction saved[2]{};
  ASSERT_EQ(::sigaction(SIGTERM, &ours, &saved[0]), 0);
  ASSERT_EQ(::sigaction(SIGSEGV, &ours, &saved[1]), 0);
  EXPECT_TRUE(ProbeProvider("tcp").ok());
  EXPECT_TRUE(LibfabricLoaded());
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGTERM, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &OurHandler) << "SIGTERM's handler was replaced";
  ASSERT_EQ(::sigaction(SIGSEGV, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &OurHandler) << "SIGSEGV's handler was replaced";
  ::sigaction(SIGTERM, &saved[0], nullptr);
  ::sigaction(SIGSEGV, &saved[1], nullptr);
}

TEST(FabricEndpointTest, MessagesGoBothWaysInOrder) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  for (int i = 0; i < 20; ++i) {
    const std::string request = "request " + std::to_string(i);
    ASSERT_TRUE(p.client->Send(request, In(5s)).ok());
    std::string got;
    ASSERT_TRUE(p.server->Receive(got, In(5s)).ok());
    EXPECT_EQ(got, request);
    ASSERT_TRUE(p.server->Send("reply " + std::to_string(i), In(5s)).ok());
    ASSERT_TRUE(p.client->Receive(got, In(5s)).ok());
    EXPECT_EQ(got, "reply " + std::to_string(i));
  }
  EXPECT_EQ(p.client->provider(), "tcp");
  EXPECT_NE(p.server->peer().find("127.0.0.1:"), std::string::npos) << p.server->peer();
}

TEST(FabricEndpointTest, RmaWritesLandInTheWindowBeforeTheNextMessage) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  auto window = p.client->Window(100'000);
  ASSERT_TRUE(window.ok()) << window.status().ToString();
  EXPECT_GE(window->length, 100'000u);
  const uint64_t registrations = p.client->registrations();
  std::string bytes(100'000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  // The node learns the window from the request message.
  std::string frame;
  ASSERT_TRUE(p.client->Send(EncodeRequestMessage(*window, "READ"), In(5s)).ok());
  std::string got;
  ASSERT_TRUE(p.server->Receive(got, In(5s)).ok());
  std::string_view rest;
  auto seen = DecodeRequestMessage(got, &rest);
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(*seen, *window);
  EXPECT_EQ(rest, "READ");
  ASSERT_TRUE(p.server->Write(*seen, 0, std::string_view(bytes).substr(0, 60'000), In(5s)).ok());
  ASSERT_TRUE(p.server->Write(*seen, 60'000, std::string_view(bytes).substr(60'000), In(5s)).ok());
  ASSERT_TRUE(p.server->Send("done", In(5s)).ok());
  ASSERT_TRUE(p.client->Receive(got, In(5s)).ok());
  EXPECT_EQ(got, "done");
  EXPECT_EQ(p.client->WindowBytes(bytes.size()), bytes);
  // The same or a smaller window again: no new registration.
  ASSERT_TRUE(p.client->Window(50'000).ok());
  ASSERT_TRUE(p.client->Window(100'000).ok());
  EXPECT_EQ(p.client->registrations(), registrations);
  // A larger one registers once more.
  ASSERT_TRUE(p.client->Window(1'000'000).ok());
  EXPECT_EQ(p.client->registrations(), registrations + 1);
}

TEST(FabricEndpointTest, AWritePastTheWindowIsRefusedBeforeAnythingMoves) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  auto window = p.client->Window(4096);
  ASSERT_TRUE(window.ok());
  std::string big(window->length + 1, 'x');
  Status s = p.server->Write(*window, 0, big, In(5s));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  EXPECT_NE(s.message().find("do not fit the reader's window"), std::string::npos);
  s = p.server->Write(*window, window->length, "y", In(5s));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  // Nothing broke: messages still flow.
  EXPECT_TRUE(p.server->Send("still here", In(5s)).ok());
  std::string got;
  EXPECT_TRUE(p.client->Receive(got, In(5s)).ok());
}

TEST(FabricEndpointTest, AMessageOverTheLimitIsRefused) {
  Pair p = Connect(1024);
  ASSERT_TRUE(p.client && p.server);
  Status s = p.client->Send(std::string(1025, 'a'), In(5s));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("1024-byte limit"), std::string::npos) << s.ToString();
}

TEST(FabricEndpointTest, AReceiveWithNothingComingMeetsItsDeadline) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  std::string got;
  const auto start = Clock::now();
  Status s = p.client->Receive(got, In(300ms));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_TRUE(p.client->broken());
}

TEST(FabricEndpointTest, APeerThatClosesFailsTheWaitingReceive) {
  Pair p = Connect();
  ASSERT_TRUE(p.client && p.server);
  p.server.reset();  // shuts the connection down
  std::string got;
  Status s = p.client->Receive(got, In(10s));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
}

TEST(FabricEndpointTest, ConnectingWhereNothingListensSaysSo) {
  // A port just freed: nothing listens there.
  uint16_t port = 0;
  {
    auto listener = Listener::Listen(NetAddress{"127.0.0.1", 0}, {});
    ASSERT_TRUE(listener.ok());
    port = (*listener)->port();
  }
  auto client = Endpoint::Connect(NetAddress{"127.0.0.1", port}, {}, In(5s));
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(client.status().code() == StatusCode::kUnavailable ||
              client.status().code() == StatusCode::kDeadlineExceeded)
      << client.status().ToString();
  EXPECT_NE(client.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << client.status().ToString();
}

TEST(FabricEndpointTest, AnAbsentProviderIsNamedWithWhatToDo) {
  Status s = ProbeProvider("no-such-provider");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("'no-such-provider'"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("fi_info"), std::string::npos) << s.ToString();
  EXPECT_TRUE(ProbeProvider("tcp").ok()) << ProbeProvider("tcp").ToString();
  EndpointOptions options;
  options.provider = "no-such-provider";
  auto listener = Listener::Listen(NetAddress{"127.0.0.1", 0}, options);
  EXPECT_EQ(listener.status().code(), StatusCode::kUnavailable);
  options.provider = "";
  listener = Listener::Listen(NetAddress{"127.0.0.1", 0}, options);
  EXPECT_EQ(listener.status().code(), StatusCode::kInvalidArgument);
}

TEST(FabricEndpointTest, AShortRequestMessageIsNotTakenForAWindow) {
  std::string_view frame;
  auto w = DecodeRequestMessage("tiny", &frame);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("shorter than its 24-byte window"), std::string::npos);
  RemoteWindow window{0x1122334455667788, 42, 4096};
  const std::string message = EncodeRequestMessage(window, "abc");  // `frame` views into it
  auto round = DecodeRequestMessage(message, &frame);
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(*round, window);
  EXPECT_EQ(frame, "abc");
}

TEST(FabricEndpointTest, AcceptReturnsAtItsDeadlineAndAfterClose) {
  auto listener = Listener::Listen(NetAddress{"127.0.0.1", 0}, {});
  ASSERT_TRUE(listener.ok());
  auto none = (*listener)->Accept(In(200ms));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded);
  (*listener)->Close();
  auto closed = (*listener)->Accept(In(5s));
  EXPECT_EQ(closed.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace granary::fabric

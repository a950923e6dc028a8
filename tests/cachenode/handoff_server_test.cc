// HandoffServer against idle and greedy peers: the
// in-process server with a resolver that hands out /dev/null, real Unix
// sockets, and peers of other uids in forked children.

#include "granary/cachenode/handoff_server.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "granary/protocol/chunk_handoff.h"
#include "granary/protocol/unix_socket.h"
#include "testing/child_process.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using ::granary::testing::ChildProcess;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

const handoff::OpenChunkRequest kRequest{"ds", ContentId{1, 2}, 0};

Result<ScopedFd> DevNull(const PeerCredentials&, const handoff::OpenChunkRequest& request) {
  if (request.dataset == "slow") std::this_thread::sleep_for(1500ms);
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open /dev/null");
  return ScopedFd(fd);
}

// Whether `fd` reaches end of stream (the server closed it) within `within`.
bool ClosedWithin(int fd, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  char buf[256];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
  return false;
}

// Becomes `uid`, waits (bounded) for `path` to accept, and returns 0 or a
// code saying what failed.
int BecomeAndAwait(uint32_t uid, const std::string& path) {
  if (::setgid(uid) != 0 || ::setuid(uid) != 0) return 10;
  for (int i = 0; i < 1000; ++i) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) return 0;
    std::this_thread::sleep_for(10ms);
  }
  return 11;
}

// Greedy peers: 64 connections held by uid 65534 (max_connections)
// made root's OPEN_CHUNK fail with ResourceExhausted.
TEST(HandoffServerLimits, AUidAtItsCapDoesNotLockOutRootOrAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become other users";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string path = dir.Join("node.sock");
  const std::string go = dir.Join("go");

  // Children first: fork() before the server's threads run.
  auto greedy = ChildProcess::Start([path](int control) {
    if (int failed = BecomeAndAwait(65534, path); failed != 0) return failed;
    std::vector<ScopedFd> held;
    for (int i = 0; i < 64; ++i) {
      Result<ScopedFd> fd = ConnectUnix(path, 5s);
      if (!fd.ok()) return 12;
      held.push_back(std::move(*fd));
    }
    if (::write(control, "r", 1) != 1) return 13;
    pollfd p{control, POLLIN, 0};
    (void)::poll(&p, 1, 60000);  // until the parent is done
    return 0;
  });
  ASSERT_OK(greedy);
  auto other = ChildProcess::Start([path, go](int) {
    if (int failed = BecomeAndAwait(65533, path); failed != 0) return failed;
    for (int i = 0; i < 3000; ++i) {
      struct stat st {};
      if (::stat(go.c_str(), &st) == 0) break;
      std::this_thread::sleep_for(10ms);
    }
    handoff::ChunkHandoffClient client(path, 5s);
    return client.OpenChunk(kRequest).ok() ? 0 : 14;
  });
  ASSERT_OK(other);

  HandoffServerOptions options;
  options.path = path;
  auto server = HandoffServer::Start(options, DevNull);
  ASSERT_OK(server);
  ASSERT_OK((*greedy)->AwaitReady(30s));
  // Every one of the 64 is accepted or refused before root asks.
  ASSERT_TRUE(WaitFor(
      [&] {
        const HandoffServerCounters c = (*server)->counters();
        return c.open_connections + c.rejected_connections == 64;
      },
      10s));

  handoff::ChunkHandoffClient root(path, 5s);
  Result<ScopedFd> got = root.OpenChunk(kRequest);
  EXPECT_TRUE(got.ok()) << "root is locked out by uid 65534's connections: "
                        << got.status().ToString();

  const HandoffServerCounters c = (*server)->counters();
  EXPECT_EQ(c.open_connections, 16u + 1u) << "uid 65534 holds its cap of 64 / 4, root one";
  EXPECT_EQ(c.rejected_uid, 48u);

  // Another unprivileged user gets in too.
  testing::WriteAll(go, "");
  Result<int> code = (*other)->Wait(30s);
  ASSERT_OK(code);
  EXPECT_EQ(*code, 0) << "uid 65533 was refused (10/11: set-up, 14: OPEN_CHUNK failed)";

  (*greedy)->RequestStop();
  Result<int> greedy_code = (*greedy)->Wait(30s);
  ASSERT_OK(greedy_code);
  EXPECT_EQ(*greedy_code, 0);
}

TEST(HandoffServerLimits, TheRefusedPeerIsToldWhy) {
  TempDir dir;
  HandoffServerOptions options;
  options.path = dir.Join("node.sock");
  options.max_connections = 2;
  auto server = HandoffServer::Start(options, DevNull);
  ASSERT_OK(server);
  std::vector<ScopedFd> held;
  for (int i = 0; i < 2; ++i) {
    Result<ScopedFd> fd = ConnectUnix(options.path, 5s);
    ASSERT_OK(fd);
    held.push_back(std::move(*fd));
  }
  ASSERT_TRUE(WaitFor([&] { return (*server)->counters().open_connections == 2; }, 10s));
  // The refusal comes unasked, then end of stream (a request sent meanwhile
  // may meet a closed socket, so none is sent).
  Result<ScopedFd> third = ConnectUnix(options.path, 5s);
  ASSERT_OK(third);
  std::string got;
  char buf[2048];
  for (int i = 0; i < 100; ++i) {
    pollfd p{third->get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(third->get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ASSERT_GE(got.size(), handoff::kHeaderSize);
  EXPECT_EQ(got.substr(0, 4), std::string(handoff::kMagic, 4));
  EXPECT_THAT(got, HasSubstr("serves at most 2 connections at once"));
  EXPECT_EQ((*server)->counters().rejected_full, 1u);
}

TEST(HandoffServerIdle, AnIdleConnectionIsClosedAndABusyOneIsNot) {
  TempDir dir;
  HandoffServerOptions options;
  options.path = dir.Join("node.sock");
  options.idle_timeout = 500ms;
  auto server = HandoffServer::Start(options, DevNull);
  ASSERT_OK(server);

  // Silent, and a request that starts and never ends: both closed.
  Result<ScopedFd> silent = ConnectUnix(options.path, 5s);
  ASSERT_OK(silent);
  Result<ScopedFd> partial = ConnectUnix(options.path, 5s);
  ASSERT_OK(partial);
  ASSERT_EQ(::send(partial->get(), handoff::kMagic, 4, MSG_NOSIGNAL), 4);
  EXPECT_TRUE(ClosedWithin(silent->get(), 5s));
  EXPECT_TRUE(ClosedWithin(partial->get(), 5s));
  EXPECT_EQ((*server)->counters().idle_closes, 2u);
  EXPECT_EQ((*server)->counters().protocol_errors, 0u);
  EXPECT_TRUE(WaitFor([&] { return (*server)->counters().open_connections == 0; }, 5s));

  // A request resolved for three times idle_timeout is not idle; the
  // connection serves on after it.
  handoff::ChunkHandoffClient client(options.path, 5s);
  EXPECT_OK(client.OpenChunk({"slow", ContentId{1, 2}, 0}));
  EXPECT_OK(client.OpenChunk(kRequest));
  EXPECT_EQ((*server)->counters().idle_closes, 2u);
}

TEST(HandoffServerIdle, BadLimitsAreRefused) {
  TempDir dir;
  HandoffServerOptions options;
  options.path = dir.Join("node.sock");
  options.idle_timeout = 0ms;
  auto bad = HandoffServer::Start(options, DevNull);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("idle_timeout"));
  options.idle_timeout = 1s;
  options.max_connections = 4;
  options.reserved = 4;
  bad = HandoffServer::Start(options, DevNull);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("reserved (4) must be below max_connections (4)"));
}

}  // namespace
}  // namespace granary

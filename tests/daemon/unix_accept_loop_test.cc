// UnixAcceptLoop (daemon/include/granary/daemon/unix_accept_loop.h) on a real
// Unix socket: connections are prepared, named and served on threads of their
// own, numbered from 1; one over the limit is refused through the callback
// (the peer reads why, then end of stream) and never served; after Stop
// nothing more is accepted while the admitted connections stay open.

#include "granary/daemon/unix_accept_loop.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

#include "granary/protocol/unix_socket.h"
#include "testing/test_util.h"

namespace granary {
namespace {

using namespace std::chrono_literals;
using ::granary::testing::TempDir;
using ::granary::testing::WaitFor;

// Echoes bytes until the peer closes or the connection is shut down.
void Echo(int fd) {
  char buf[64];
  for (int i = 0; i < 1000; ++i) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    if (::write(fd, buf, static_cast<size_t>(n)) != n) return;
  }
}

// One byte through `fd` and back.
bool RoundTrip(int fd, char c) {
  char got = 0;
  return ::write(fd, &c, 1) == 1 && ::read(fd, &got, 1) == 1 && got == c;
}

struct Recorded {
  std::mutex mu;
  std::vector<uint64_t> served_ids;
  std::vector<Admission> refusals;
  std::atomic<int> prepared{0};
};

UnixAcceptLoopOptions Options(Recorded* r, size_t max_open) {
  UnixAcceptLoopOptions o;
  o.socket_name = "the test socket";
  o.limits = ConnectionLimits{max_open, max_open, 0};
  o.prepare = [r](int fd) {
    // AcceptUnix gives a non-blocking socket; Echo reads blocking, as the sidecar does.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    ++r->prepared;
  };
  o.refused = [r](int fd, uint32_t uid, Admission why) {
    EXPECT_EQ(uid, ::geteuid());
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->refusals.push_back(why);
    }
    (void)SendWithFds(fd, "full");
  };
  o.serve = [r](uint64_t id, int fd) {
    {
      std::lock_guard<std::mutex> lock(r->mu);
      r->served_ids.push_back(id);
    }
    Echo(fd);
  };
  return o;
}

TEST(UnixAcceptLoopTest, ServesUpToTheLimitAndRefusesTheRestThroughTheCallback) {
  TempDir dir;
  const std::string path = dir.Join("s.sock");
  Result<ScopedFd> listen = ListenUnix(path);
  ASSERT_OK(listen);
  ConnectionThreads connections;
  Recorded r;
  Result<std::unique_ptr<UnixAcceptLoop>> loop =
      UnixAcceptLoop::Start(listen->get(), &connections, Options(&r, 2));
  ASSERT_OK(loop);

  Result<ScopedFd> a = ConnectUnix(path, 5s);
  Result<ScopedFd> b = ConnectUnix(path, 5s);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_TRUE(RoundTrip(a->get(), 'a'));
  EXPECT_TRUE(RoundTrip(b->get(), 'b'));
  EXPECT_EQ(connections.open(), 2u);

  // A third is over max_open: told why, then closed, never served.
  Result<ScopedFd> c = ConnectUnix(path, 5s);
  ASSERT_OK(c);
  char why[8] = {};
  EXPECT_EQ(::read(c->get(), why, sizeof(why)), 4);
  EXPECT_EQ(std::string(why, 4), "full");
  EXPECT_EQ(::read(c->get(), why, sizeof(why)), 0) << "then end of stream";
  {
    std::lock_guard<std::mutex> lock(r.mu);
    EXPECT_EQ(r.refusals, std::vector<Admission>{Admission::kFull});
    // Each connection's thread records its id when it starts: in any order.
    std::vector<uint64_t> served = r.served_ids;
    std::sort(served.begin(), served.end());
    EXPECT_EQ(served, (std::vector<uint64_t>{1, 2}));
  }
  EXPECT_EQ(r.prepared.load(), 3);

  // A place freed is taken again (the loop reaps finished connections).
  a->Reset();
  ASSERT_TRUE(WaitFor([&] { return connections.open() == 1; }, 10s));
  Result<ScopedFd> d = ConnectUnix(path, 5s);
  ASSERT_OK(d);
  EXPECT_TRUE(RoundTrip(d->get(), 'd'));

  // Stopped: the admitted connections stay open; nothing new is served.
  (*loop)->Stop();
  EXPECT_TRUE(RoundTrip(b->get(), 'b'));
  Result<ScopedFd> late = ConnectUnix(path, 5s);  // the backlog still takes it
  ASSERT_OK(late);
  EXPECT_EQ(r.prepared.load(), 4) << "the accept thread is joined: nothing takes it";
  connections.StopAll();
  EXPECT_EQ(connections.open(), 0u);
}

TEST(UnixAcceptLoopTest, StartNeedsServe) {
  ConnectionThreads connections;
  UnixAcceptLoopOptions o;
  Result<std::unique_ptr<UnixAcceptLoop>> loop = UnixAcceptLoop::Start(3, &connections, o);
  EXPECT_EQ(loop.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace granary

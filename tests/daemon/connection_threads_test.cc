#include "granary/daemon/connection_threads.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "testing/test_util.h"

namespace granary {
namespace {

using namespace std::chrono_literals;

// A connected pair: [0] is served, [1] is the test's end.
std::pair<ScopedFd, ScopedFd> Pair() {
  int sv[2] = {-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {ScopedFd(sv[0]), ScopedFd(sv[1])};
}

// Echoes bytes until the peer closes or the connection is shut down.
void Echo(int fd) {
  char buf[64];
  for (int i = 0; i < 1000; ++i) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    if (::write(fd, buf, static_cast<size_t>(n)) != n) return;
  }
}

TEST(ConnectionThreadsTest, ServesEachConnectionOnItsOwnThreadUpToTheLimit) {
  ConnectionThreads threads;
  auto [a, a_peer] = Pair();
  auto [b, b_peer] = Pair();
  auto [c, c_peer] = Pair();
  ASSERT_TRUE(threads.Start(a, 2, Echo));
  ASSERT_TRUE(threads.Start(b, 2, Echo));
  EXPECT_FALSE(a.valid()) << "the descriptor belongs to the threads now";
  EXPECT_FALSE(threads.Start(c, 2, Echo)) << "a third connection is over the limit";
  EXPECT_TRUE(c.valid()) << "a refused descriptor stays with the caller";
  EXPECT_EQ(threads.open(), 2u);

  char got = 0;
  ASSERT_EQ(::write(a_peer.get(), "x", 1), 1);
  ASSERT_EQ(::read(a_peer.get(), &got, 1), 1);
  EXPECT_EQ(got, 'x');

  // The peer hangs up: its serve returns, the connection is closed, and the
  // thread is reaped; the freed place takes a new connection.
  a_peer.Reset();
  ASSERT_TRUE(testing::WaitFor([&] { return threads.open() == 1; }, 10s));
  threads.ReapFinished();
  EXPECT_TRUE(threads.Start(c, 2, Echo));

  // StopAll ends serves blocked in read, and closes their descriptors: the
  // peers see end of stream.
  threads.StopAll();
  EXPECT_EQ(threads.open(), 0u);
  EXPECT_EQ(::read(b_peer.get(), &got, 1), 0);
  EXPECT_EQ(::read(c_peer.get(), &got, 1), 0);
  threads.StopAll();  // idempotent
}

TEST(ConnectionThreadsTest, DefaultLimitsGiveAQuarterPerUidAndReserveAnEighth) {
  const ConnectionLimits handoff = ConnectionLimits::DefaultFor(64);
  EXPECT_EQ(handoff.per_uid, 16u);
  EXPECT_EQ(handoff.reserved, 8u);
  const ConnectionLimits sidecar = ConnectionLimits::DefaultFor(256);
  EXPECT_EQ(sidecar.per_uid, 64u);
  EXPECT_EQ(sidecar.reserved, 32u);
  const ConnectionLimits one = ConnectionLimits::DefaultFor(1);
  EXPECT_EQ(one.per_uid, 1u);
  EXPECT_EQ(one.reserved, 0u);
}

TEST(ConnectionThreadsTest, OneUidCannotTakeThePlacesOfOthersOrOfRoot) {
  ConnectionThreads threads;
  ConnectionLimits limits;
  limits.max_open = 8;
  limits.per_uid = 3;
  limits.reserved = 2;
  std::vector<ScopedFd> peers;
  const auto start = [&](uint32_t uid, bool privileged) {
    auto [served, peer] = Pair();
    peers.push_back(std::move(peer));
    const Admission a = threads.Start(served, uid, privileged, limits, Echo);
    EXPECT_EQ(a == Admission::kAdmitted, !served.valid());
    return a;
  };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(start(65534, false), Admission::kAdmitted);
  EXPECT_EQ(start(65534, false), Admission::kUidFull);
  EXPECT_EQ(threads.open_of(65534), 3u);
  // Another user still gets in, up to the reserve.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(start(1000, false), Admission::kAdmitted);
  EXPECT_EQ(start(1001, false), Admission::kReservedOnly);
  // Root takes the reserved places; then everything is full.
  EXPECT_EQ(start(0, true), Admission::kAdmitted);
  EXPECT_EQ(start(0, true), Admission::kAdmitted);
  EXPECT_EQ(start(0, true), Admission::kFull);
  // A closed connection gives its uid a place back.
  peers[0].Reset();
  ASSERT_TRUE(testing::WaitFor([&] { return threads.open_of(65534) == 2; }, 10s));
  EXPECT_EQ(start(65534, false), Admission::kAdmitted);
  threads.StopAll();
}

}  // namespace
}  // namespace granary

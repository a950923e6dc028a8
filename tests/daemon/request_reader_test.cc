// The observability endpoint's RequestReader (daemon/src/request_reader.h),
// driven in process over socket pairs: what counts as a whole request, that a
// request sent in pieces reaches a worker whole, that a full pool makes it
// wait instead of dropping it, that a silent client gets 408, and that the
// oldest connection goes when too many are being read.

#include "request_reader.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "granary/core/file.h"

namespace granary::observability {
namespace {

using namespace std::chrono_literals;

TEST(RequestCompleteTest, AHeadEndsAtAnEmptyLine) {
  EXPECT_FALSE(RequestComplete(""));
  EXPECT_FALSE(RequestComplete("GET /metrics HTTP/1.1\r\nHost: x\r\n"));
  EXPECT_TRUE(RequestComplete("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
}

TEST(RequestCompleteTest, ABodyOfContentLengthMustFollow) {
  const std::string head = "POST / HTTP/1.1\r\nHost: x\r\ncontent-LENGTH: 5\r\n\r\n";
  EXPECT_FALSE(RequestComplete(head));
  EXPECT_FALSE(RequestComplete(head + "abc"));
  EXPECT_TRUE(RequestComplete(head + "abcde"));
}

TEST(RequestCompleteTest, WhatCppHttplibRefusesCountsAsComplete) {
  // Handed over as it is, so that cpp-httplib answers it (400, 413, 414).
  EXPECT_TRUE(RequestComplete("POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n"));
  EXPECT_TRUE(RequestComplete("POST / HTTP/1.1\r\nContent-Length: " +
                              std::to_string(kMaxRequestPayloadBytes + 1) + "\r\n\r\n"));
  EXPECT_TRUE(RequestComplete(std::string(kMaxRequestReadBytes, 'a')));
  EXPECT_FALSE(RequestComplete(std::string(kMaxRequestReadBytes - 1, 'a')));
}

// A connected pair: [0] goes to the reader, [1] is the test's client end.
std::pair<int, ScopedFd> Pair() {
  int sv[2] = {-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {sv[0], ScopedFd(sv[1])};
}

// What the client end reads until end of stream (or 10 s).
std::string ReadToEnd(int fd) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Records what the reader hands over; refuses the first `refuse` offers (a
// full pool) and takes the rest, closing their sockets.
class Workers {
 public:
  explicit Workers(int refuse = 0) : refuse_(refuse) {}

  RequestReader::Dispatch Dispatch() {
    return [this](int sock, std::string& request) {
      std::lock_guard<std::mutex> lock(mu_);
      ++offers_;
      if (refuse_ > 0) {
        --refuse_;
        return false;
      }
      ::close(sock);
      taken_.push_back(request);
      cv_.notify_all();
      return true;
    };
  }

  // Waits up to 10 s for `n` requests taken.
  std::vector<std::string> WaitTaken(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 10s, [&] { return taken_.size() >= n; });
    return taken_;
  }

  int offers() {
    std::lock_guard<std::mutex> lock(mu_);
    return offers_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int refuse_;
  int offers_ = 0;
  std::vector<std::string> taken_;
};

TEST(RequestReaderTest, ARequestSentInPiecesReachesAWorkerWhole) {
  Workers workers;
  auto reader = RequestReader::Start({}, workers.Dispatch());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto [sock, client] = Pair();
  (*reader)->Add(sock);
  const std::string first = "GET /metrics HTTP/1.1\r\nHo";
  const std::string rest = "st: x\r\n\r\n";
  ASSERT_EQ(::write(client.get(), first.data(), first.size()), ssize_t(first.size()));
  std::this_thread::sleep_for(50ms);  // let the reader see the first piece alone
  EXPECT_TRUE(workers.WaitTaken(0).empty());
  ASSERT_EQ(::write(client.get(), rest.data(), rest.size()), ssize_t(rest.size()));
  const std::vector<std::string> taken = workers.WaitTaken(1);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0], first + rest);
}

TEST(RequestReaderTest, AFullPoolMakesTheRequestWaitNotDrop) {
  Workers workers(/*refuse=*/2);
  auto reader = RequestReader::Start({}, workers.Dispatch());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto [sock, client] = Pair();
  (*reader)->Add(sock);
  const std::string request = "GET /healthz HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::write(client.get(), request.data(), request.size()), ssize_t(request.size()));
  const std::vector<std::string> taken = workers.WaitTaken(1);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0], request);
  EXPECT_EQ(workers.offers(), 3);
}

TEST(RequestReaderTest, AClientThatSendsNothingIsAnswered408AndClosed) {
  Workers workers;
  RequestReader::Limits limits;
  limits.first_byte = 100ms;
  auto reader = RequestReader::Start(limits, workers.Dispatch());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto [sock, client] = Pair();
  (*reader)->Add(sock);
  const std::string answer = ReadToEnd(client.get());
  EXPECT_EQ(answer.rfind("HTTP/1.1 408 ", 0), 0u) << answer;
  EXPECT_EQ(workers.offers(), 0);
}

TEST(RequestReaderTest, TheOldestConnectionGoesWhenTooManyAreRead) {
  Workers workers;
  RequestReader::Limits limits;
  limits.max_reading = 1;
  auto reader = RequestReader::Start(limits, workers.Dispatch());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto [old_sock, old_client] = Pair();
  (*reader)->Add(old_sock);
  auto [new_sock, new_client] = Pair();
  (*reader)->Add(new_sock);
  // The old one is closed without an answer; the new one is still served.
  EXPECT_EQ(ReadToEnd(old_client.get()), "");
  const std::string request = "GET /readyz HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::write(new_client.get(), request.data(), request.size()), ssize_t(request.size()));
  const std::vector<std::string> taken = workers.WaitTaken(1);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0], request);
}

TEST(RequestReaderTest, StopClosesWhatIsStillBeingRead) {
  Workers workers;
  auto reader = RequestReader::Start({}, workers.Dispatch());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto [sock, client] = Pair();
  (*reader)->Add(sock);
  (*reader)->Stop();
  EXPECT_EQ(ReadToEnd(client.get()), "");
  EXPECT_EQ(workers.offers(), 0);
}

}  // namespace
}  // namespace granary::observability

#include "request_reader.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/thread_name.h"

namespace granary::observability {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::shared_ptr<spdlog::logger> Logger() { return GetLogger("observability"); }

}  // namespace

bool RequestComplete(std::string_view request) {
  if (request.size() >= kMaxRequestReadBytes) return true;
  const size_t end = request.find("\r\n\r\n");
  if (end == std::string_view::npos) return false;
  const size_t body = end + 4;
  std::string lower(request.substr(0, end));
  std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  });
  const size_t at = lower.find("\r\ncontent-length:");
  if (at == std::string_view::npos) return true;
  size_t length = 0;
  for (size_t i = at + 17; i < lower.size() && lower[i] != '\r'; ++i) {
    if (lower[i] == ' ' || lower[i] == '\t') continue;
    if (lower[i] < '0' || lower[i] > '9') return true;  // cpp-httplib refuses it
    length = length * 10 + static_cast<size_t>(lower[i] - '0');
    if (length > kMaxRequestPayloadBytes) return true;  // refused as too large
  }
  return request.size() >= body + length;
}

Result<std::unique_ptr<RequestReader>> RequestReader::Start(Limits limits, Dispatch dispatch) {
  std::unique_ptr<RequestReader> r(new RequestReader(limits, std::move(dispatch)));
  r->wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (r->wake_ < 0) {
    return Status::FromErrno(errno, "create the HTTP request reader's eventfd");
  }
  try {
    r->thread_ = std::thread([p = r.get()] {
      NameThisThread("http-reader");
      p->Run();
    });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted(std::string("start the HTTP request reader thread: ") +
                                     e.what() + "; raise the process's thread limit");
  }
  return r;
}

RequestReader::~RequestReader() {
  Stop();
  if (wake_ >= 0) ::close(wake_);
}

void RequestReader::Add(int sock) {
  (void)::fcntl(sock, F_SETFD, FD_CLOEXEC);
  (void)::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      incoming_.push_back(sock);
      Wake();
      return;
    }
  }
  Close(sock);
}

void RequestReader::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  Wake();
  if (thread_.joinable()) thread_.join();
}

void RequestReader::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof(one));
}

void RequestReader::Close(int sock) {
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

void RequestReader::Run() {
  std::vector<pollfd> fds;
  std::vector<size_t> which;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      const steady_clock::time_point now = steady_clock::now();
      for (int sock : incoming_) {
        if (conns_.size() >= limits_.max_reading) {
          // The oldest connection still sending (or waiting for the pool) goes.
          auto oldest = std::min_element(
              conns_.begin(), conns_.end(),
              [](const Conn& a, const Conn& b) { return a.accepted < b.accepted; });
          Close(oldest->sock);
          conns_.erase(oldest);
        }
        conns_.push_back(Conn{sock, now, now + limits_.first_byte, {}, false});
      }
      incoming_.clear();
    }
    // Complete requests waiting for a place in the pool's queue.
    for (size_t i = 0; i < conns_.size();) {
      if (conns_[i].complete && dispatch_(conns_[i].sock, conns_[i].request)) {
        conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    const steady_clock::time_point now = steady_clock::now();
    for (size_t i = 0; i < conns_.size();) {
      if (!conns_[i].complete && now >= conns_[i].deadline) {
        static constexpr char kTimeout[] =
            "HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; "
            "charset=utf-8\r\nContent-Length: 39\r\nConnection: close\r\n\r\n"
            "the request did not arrive in time; resend\n";
        (void)!::send(conns_[i].sock, kTimeout, sizeof(kTimeout) - 1, MSG_NOSIGNAL);
        Close(conns_[i].sock);
        conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    fds.assign(1, pollfd{wake_, POLLIN, 0});
    which.clear();
    milliseconds wait{200};
    for (size_t i = 0; i < conns_.size(); ++i) {
      if (conns_[i].complete) continue;  // retried each round (at most 200 ms away)
      fds.push_back(pollfd{conns_[i].sock, POLLIN, 0});
      which.push_back(i);
      wait = std::min(wait, std::chrono::duration_cast<milliseconds>(conns_[i].deadline - now) +
                                milliseconds(1));
    }
    const int n =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (n < 0 && errno != EINTR) {
      Logger()->error("observability endpoint: poll failed: {}", ErrnoText(errno));
      std::this_thread::sleep_for(milliseconds(10));
      continue;
    }
    if (n <= 0) continue;
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      (void)!::read(wake_, &count, sizeof(count));
    }
    std::vector<size_t> gone;
    for (size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Conn& c = conns_[which[k - 1]];
      const Read read = Receive(c);
      if (read == Read::kClosed) Close(c.sock);
      if (read != Read::kMore) gone.push_back(which[k - 1]);
    }
    for (auto it = gone.rbegin(); it != gone.rend(); ++it) {
      conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(*it));
    }
  }
  for (Conn& c : conns_) Close(c.sock);
  conns_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (int sock : incoming_) Close(sock);
  incoming_.clear();
}

RequestReader::Read RequestReader::Receive(Conn& c) {
  char buf[4096];
  while (c.request.size() < kMaxRequestReadBytes) {
    const ssize_t n =
        ::recv(c.sock, buf, std::min(sizeof(buf), kMaxRequestReadBytes - c.request.size()), 0);
    if (n > 0) {
      if (c.request.empty()) c.deadline = c.accepted + limits_.whole_request;
      c.request.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // End of stream: what came is all there is. A whole request is still
    // answered (a client may shut down its side after sending).
    if (n == 0 && !c.request.empty() && RequestComplete(c.request)) break;
    return Read::kClosed;
  }
  if (!RequestComplete(c.request)) return Read::kMore;
  c.complete = true;
  return dispatch_(c.sock, c.request) ? Read::kHandedOver : Read::kMore;
}

}  // namespace granary::observability

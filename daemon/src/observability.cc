#include "granary/daemon/observability.h"

// cpp-httplib is included here only: it is large, and Debian builds it as a
// library whose -D flags (from pkg-config) must match; no other translation
// unit needs to see it.
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"

namespace granary {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr char kTextPlain[] = "text/plain; charset=utf-8";
// The content type Prometheus expects for the text exposition format.
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kEndpoints[] = "/metrics, /healthz or /readyz";
// Requests to this server are bodiless GETs; anything larger is refused.
constexpr size_t kMaxRequestPayloadBytes = 4096;
// The RequestReader reads at most this much of a request (cpp-httplib refuses
// request lines over 8 KiB with 414 and header lines over 8 KiB with 400).
constexpr size_t kMaxRequestReadBytes = 32 * 1024;

constexpr int kMaxWorkerThreads = 64;
constexpr size_t kMaxQueuedConnectionsLimit = 65536;
constexpr std::chrono::seconds kMaxTimeout{3600};

std::shared_ptr<spdlog::logger> Logger() { return GetLogger("observability"); }

bool IsAsciiLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsAsciiDigit(char c) { return c >= '0' && c <= '9'; }

// What to write instead, when an address cannot be bound.
constexpr char kListenExample[] =
    "write host:port, e.g. 127.0.0.1:9464 (this host only), 0.0.0.0:9464 (all interfaces) or "
    "[::1]:9464; port 0 picks a free port";

// The addresses `host` stands for, IPv4 first, as numeric strings. Literals
// never touch the resolver.
Result<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    std::string why = rc == EAI_SYSTEM ? ErrnoText(errno) : ::gai_strerror(rc);
    return Status::Unavailable("cannot resolve host " + Quoted(host) + " (" + why +
                               "); use an address of this host, e.g. 127.0.0.1");
  }
  std::vector<std::string> v4;
  std::vector<std::string> v6;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    std::array<char, NI_MAXHOST> text{};
    if (::getnameinfo(ai->ai_addr, ai->ai_addrlen, text.data(), text.size(), nullptr, 0,
                      NI_NUMERICHOST) != 0) {
      continue;
    }
    std::vector<std::string>& into = ai->ai_family == AF_INET ? v4 : v6;
    if (std::find(into.begin(), into.end(), text.data()) == into.end()) {
      into.emplace_back(text.data());
    }
  }
  ::freeaddrinfo(found);
  v4.insert(v4.end(), v6.begin(), v6.end());
  if (v4.empty()) {
    return Status::Unavailable("host " + Quoted(host) +
                               " has no IPv4 or IPv6 address; use an address of this host");
  }
  return v4;
}

// Why binding `host`:`port` fails, found by trying it again with a socket of
// our own (cpp-httplib reports only that it failed). `what` prefixes the
// message.
Status ExplainBindFailure(const std::string& what, const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found) != 0 || found == nullptr) {
    return Status::Unavailable(what + ": cannot bind " + Quoted(host) + "; " + kListenExample);
  }
  int err = 0;
  {
    const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
    } else {
      const int yes = 1;
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      if (::bind(fd, found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd, 1) != 0) {
        err = errno;
      }
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  const std::string where = port == 0 ? "a free port" : "port " + port_text;
  switch (err) {
    case EADDRINUSE:
      return Status::Unavailable(what + ": " + where +
                                 " is in use by another process; stop it, or choose another "
                                 "port (0 picks a free one)");
    case EADDRNOTAVAIL:
      return Status::Unavailable(what + ": address " + Quoted(host) +
                                 " is not on this host; use one of its addresses, 127.0.0.1 for "
                                 "this host only or 0.0.0.0 for all interfaces");
    case EACCES:
      return Status::PermissionDenied(what + ": binding " + where +
                                      " needs privilege (ports below 1024 need root or "
                                      "CAP_NET_BIND_SERVICE); choose a port above 1023");
    case 0:
      return Status::Unavailable(what + ": binding failed, but the address is free now; retry");
    default:
      return Status::Unavailable(what + ": bind: " + ErrnoText(err) + "; " + kListenExample);
  }
}

// ---- workers ----

// A fixed set of threads answering complete requests (RequestReader below),
// with a bounded queue: when it is full, TryEnqueue says so and the request
// waits with the reader instead of growing a queue here. cpp-httplib's own
// ThreadPool has no bound.
class WorkerPool {
 public:
  static Result<std::unique_ptr<WorkerPool>> Start(int threads, size_t max_queued) {
    std::unique_ptr<WorkerPool> pool(new WorkerPool(max_queued));
    try {
      for (int i = 0; i < threads; ++i) pool->threads_.emplace_back([p = pool.get()] { p->Run(); });
    } catch (const std::system_error& e) {
      pool->Shutdown();
      return Status::ResourceExhausted("start " + std::to_string(threads) +
                                       " worker threads: " + e.what() +
                                       "; lower worker_threads or raise the process's limits");
    }
    return pool;
  }

  ~WorkerPool() { Shutdown(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `fn` for a worker unless the queue is full or shutting down.
  bool TryEnqueue(std::function<void()>& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(fn));
    not_empty_.notify_one();
    return true;
  }

  // Lets the workers finish what is queued, then joins them. Idempotent.
  void Shutdown() {
    std::lock_guard<std::mutex> join_lock(join_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutting_down_ = true;
    }
    not_empty_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  explicit WorkerPool(size_t max_queued) : max_queued_(max_queued) {}

  void Run() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        not_empty_.wait(lock, [&] { return !queue_.empty() || shutting_down_; });
        if (queue_.empty()) return;  // shutting down, nothing left
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  const size_t max_queued_;
  std::mutex mu_;
  std::condition_variable not_empty_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool shutting_down_ = false;               // guarded by mu_
  std::mutex join_mu_;                       // serializes Shutdown
  std::vector<std::thread> threads_;         // written by Start, then under join_mu_
};

// What cpp-httplib owns (it deletes its task queue when its accept loop ends).
// Its only task is "serve this accepted socket", which GatedServer turns into
// handing the socket to the RequestReader: quick, so it runs right on the
// accept thread. The pool belongs to the server and outlives it.
class InlineTaskQueue : public httplib::TaskQueue {
 public:
  explicit InlineTaskQueue(WorkerPool* pool) : pool_(pool) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { pool_->Shutdown(); }

 private:
  WorkerPool* pool_;
};

// One request, already read whole by the RequestReader, for cpp-httplib's
// process_request: reads come from the buffer only (end of stream after it, so
// parsing never waits on the client), writes go to the socket until a
// deadline for the whole reply.
class BufferedRequestStream : public httplib::Stream {
 public:
  BufferedRequestStream(int sock, std::string request, steady_clock::time_point write_deadline)
      : sock_(sock), request_(std::move(request)), write_deadline_(write_deadline) {}

  bool is_readable() const override { return pos_ < request_.size(); }
  bool is_writable() const override { return WaitWritable(); }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - pos_);
    std::memcpy(ptr, request_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(sock_, ptr + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && WaitWritable()) continue;
      return -1;  // the client went away, or did not take its reply in time
    }
    return static_cast<ssize_t>(sent);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Name(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Name(::getsockname, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  bool WaitWritable() const {
    while (true) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(write_deadline_ - steady_clock::now()).count();
      if (left <= 0) return false;
      pollfd p{sock_, POLLOUT, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r > 0) return (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
      if (r < 0 && errno != EINTR) return false;
    }
  }

  void Name(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (get(sock_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv,
                      sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(serv);
    }
  }

  const int sock_;
  const std::string request_;
  size_t pos_ = 0;
  const steady_clock::time_point write_deadline_;
};

// Reads requests before any worker sees them, for every accepted connection
// at once, on one thread with poll: a client that connects and sends half a
// request (or nothing) costs a descriptor and a buffer here, never a worker.
// A connection gets idle_timeout to send its first byte and io_timeout for
// the whole request; then it is answered 408 and closed. When
// max_reading connections are being read, the oldest is closed to make room,
// so a flood of half-sent requests cannot keep a new one (a kubelet's
// /healthz) out. A complete request goes to the worker pool (`dispatch`); if
// the pool's queue is full it waits here, still not holding a worker.
class RequestReader {
 public:
  using Dispatch = std::function<bool(int sock, std::string& request)>;

  struct Limits {
    milliseconds first_byte{2000};
    milliseconds whole_request{5000};
    size_t max_reading = 1024;
  };

  static Result<std::unique_ptr<RequestReader>> Start(Limits limits, Dispatch dispatch) {
    std::unique_ptr<RequestReader> r(new RequestReader(limits, std::move(dispatch)));
    r->wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->wake_ < 0) {
      return Status::FromErrno(errno, "create the HTTP request reader's eventfd");
    }
    try {
      r->thread_ = std::thread([p = r.get()] { p->Run(); });
    } catch (const std::system_error& e) {
      return Status::ResourceExhausted(std::string("start the HTTP request reader thread: ") +
                                       e.what() + "; raise the process's thread limit");
    }
    return r;
  }

  ~RequestReader() {
    Stop();
    if (wake_ >= 0) ::close(wake_);
  }
  RequestReader(const RequestReader&) = delete;
  RequestReader& operator=(const RequestReader&) = delete;

  // Takes an accepted socket (from cpp-httplib's accept thread).
  void Add(int sock) {
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

  // Closes every connection not yet handed to a worker; joins the thread.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    Wake();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Conn {
    int sock = -1;
    steady_clock::time_point accepted;
    steady_clock::time_point deadline;  // first byte, then whole request
    std::string request;
    bool complete = false;  // waiting for a free place in the pool's queue
  };

  RequestReader(Limits limits, Dispatch dispatch)
      : limits_(limits), dispatch_(std::move(dispatch)) {}

  void Wake() {
    const uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof(one));
  }

  static void Close(int sock) {
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  }

  // A request head ends at an empty line; a body announced by Content-Length
  // (at most kMaxRequestPayloadBytes) must follow. Anything larger than
  // kMaxRequestReadBytes goes to cpp-httplib as it is, to be refused there.
  static bool Complete(const std::string& request) {
    if (request.size() >= kMaxRequestReadBytes) return true;
    const size_t end = request.find("\r\n\r\n");
    if (end == std::string::npos) return false;
    const size_t body = end + 4;
    std::string lower = request.substr(0, end);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
      return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    });
    const size_t at = lower.find("\r\ncontent-length:");
    if (at == std::string::npos) return true;
    size_t length = 0;
    for (size_t i = at + 17; i < lower.size() && lower[i] != '\r'; ++i) {
      if (lower[i] == ' ' || lower[i] == '\t') continue;
      if (lower[i] < '0' || lower[i] > '9') return true;  // cpp-httplib refuses it
      length = length * 10 + static_cast<size_t>(lower[i] - '0');
      if (length > kMaxRequestPayloadBytes) return true;  // refused as too large
    }
    return request.size() >= body + length;
  }

  void Run() {
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

  enum class Read {
    kMore,        // keep reading (or waiting for the pool's queue)
    kHandedOver,  // a worker has it
    kClosed       // the client went away or failed: close it
  };

  // Reads what has arrived.
  Read Receive(Conn& c) {
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
      if (n == 0 && !c.request.empty() && Complete(c.request)) break;
      return Read::kClosed;
    }
    if (!Complete(c.request)) return Read::kMore;
    c.complete = true;
    return dispatch_(c.sock, c.request) ? Read::kHandedOver : Read::kMore;
  }

  const Limits limits_;
  const Dispatch dispatch_;
  int wake_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::vector<int> incoming_;  // guarded by mu_: accepted, not yet read
  bool stopping_ = false;      // guarded by mu_
  std::vector<Conn> conns_;    // the reader thread's own
};

// cpp-httplib's server, except that an accepted socket is not served on the
// spot: it goes to the RequestReader, and only a complete request reaches a
// worker (process_request over a BufferedRequestStream).
class GatedServer : public httplib::Server {
 public:
  void set_reader(RequestReader* reader) { reader_ = reader; }

  // On a worker: answers one complete request, then closes the connection.
  void Serve(int sock, std::string request, milliseconds write_timeout) {
    BufferedRequestStream stream(sock, std::move(request), steady_clock::now() + write_timeout);
    bool closed = false;
    (void)process_request(stream, /*close_connection=*/true, closed, nullptr);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    reader_->Add(sock);
    return true;
  }

  RequestReader* reader_ = nullptr;
};

Status CheckOptions(const ObservabilityOptions& o) {
  if (o.worker_threads < 1 || o.worker_threads > kMaxWorkerThreads) {
    return Status::InvalidArgument("worker_threads " + std::to_string(o.worker_threads) +
                                   " is outside 1.." + std::to_string(kMaxWorkerThreads));
  }
  if (o.max_queued_connections < 1 || o.max_queued_connections > kMaxQueuedConnectionsLimit) {
    return Status::InvalidArgument("max_queued_connections " +
                                   std::to_string(o.max_queued_connections) + " is outside 1.." +
                                   std::to_string(kMaxQueuedConnectionsLimit));
  }
  if (o.max_reading_connections < 1 || o.max_reading_connections > kMaxQueuedConnectionsLimit) {
    return Status::InvalidArgument("max_reading_connections " +
                                   std::to_string(o.max_reading_connections) + " is outside 1.." +
                                   std::to_string(kMaxQueuedConnectionsLimit));
  }
  for (const auto& [name, value] :
       {std::pair{"io_timeout", o.io_timeout}, std::pair{"idle_timeout", o.idle_timeout}}) {
    if (value.count() < 1 || value > kMaxTimeout) {
      return Status::InvalidArgument(std::string(name) + " " + std::to_string(value.count()) +
                                     " s is outside 1.." + std::to_string(kMaxTimeout.count()) +
                                     " s");
    }
  }
  return Status::Ok();
}

std::string_view HttpErrorText(int status) {
  switch (status) {
    case 400:
      return "malformed HTTP request\n";
    case 413:
      return "request too large\n";
    case 414:
      return "request URI too long\n";
    case 500:
      return "internal error\n";
    default:
      return "HTTP error\n";
  }
}

}  // namespace

// ---- ObservabilityServer ----

class ObservabilityServer::Impl {
 public:
  Impl(std::shared_ptr<prometheus::Registry> registry, ReadinessCheck readiness,
       std::unique_ptr<WorkerPool> pool)
      : registry_(std::move(registry)), readiness_(std::move(readiness)), pool_(std::move(pool)) {}

  Status StartReader(const ObservabilityOptions& options) {
    RequestReader::Limits limits;
    limits.first_byte = options.idle_timeout;
    limits.whole_request = options.io_timeout;
    limits.max_reading = options.max_reading_connections;
    const milliseconds write_timeout = options.io_timeout;
    GRANARY_ASSIGN_OR_RETURN(
        reader_,
        RequestReader::Start(limits, [this, write_timeout](int sock, std::string& request) {
          std::function<void()> serve = [this, sock, request, write_timeout] {
            server_.Serve(sock, request, write_timeout);
          };
          return pool_->TryEnqueue(serve);
        }));
    server_.set_reader(reader_.get());
    return Status::Ok();
  }

  ~Impl() { Stop(); }

  void Configure(const ObservabilityOptions& options) {
    WorkerPool* pool = pool_.get();
    server_.new_task_queue = [pool] { return new InlineTaskQueue(pool); };
    // cpp-httplib's default sets SO_REUSEPORT, which would let a second server
    // bind a port already in use. SO_REUSEADDR only allows a restart while old
    // connections linger in TIME_WAIT. CLOEXEC: programs the daemon runs must
    // not inherit the listening socket.
    server_.set_socket_options([this](int fd) {
      const int yes = 1;
      (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
      listen_fd_ = fd;
    });
    server_.set_tcp_nodelay(true);
    server_.set_read_timeout(static_cast<time_t>(options.io_timeout.count()), 0);
    server_.set_write_timeout(static_cast<time_t>(options.io_timeout.count()), 0);
    // One request per connection. A scrape every few seconds gains nothing
    // from keep-alive, and cpp-httplib 0.11 would otherwise keep a connection
    // open after a request it could not parse (reading the leftovers as the
    // next request) and drops pipelined requests.
    server_.set_keep_alive_max_count(1);
    server_.set_keep_alive_timeout(static_cast<time_t>(options.idle_timeout.count()));
    server_.set_payload_max_length(kMaxRequestPayloadBytes);
    // Every request goes through Handle, before cpp-httplib's own routing, so
    // that methods and paths are answered one way (405/404 with a body).
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      HandleSafely(req, res);
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors cpp-httplib answers itself (a request it cannot parse) get a body.
    server_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.body.empty()) res.set_content(std::string(HttpErrorText(res.status)), kTextPlain);
    });
  }

  Status Bind(const NetAddress& requested, const std::string& what) {
    Result<std::vector<std::string>> hosts = ResolveHost(requested.host);
    if (!hosts.ok()) return hosts.status().WithContext(what);
    // A name is bound at its first address (IPv4 first: "localhost" is then
    // 127.0.0.1, where clients look); a literal is its own only address.
    const std::string& host = hosts->front();
    int port = -1;
    if (requested.port == 0) {
      port = server_.bind_to_any_port(host);
    } else if (server_.bind_to_port(host, requested.port)) {
      port = requested.port;
    }
    if (port <= 0 || port > 65535) return ExplainBindFailure(what, host, requested.port);
    address_ = NetAddress{host, static_cast<uint16_t>(port)};
    return Status::Ok();
  }

  // Runs the accept loop on its own thread and returns once it is running, so
  // that Stop() always reaches it.
  Status Listen(const std::string& what) {
    try {
      listener_ = std::thread([this] {
        server_.listen_after_bind();
        std::lock_guard<std::mutex> lock(listener_mu_);
        listener_done_ = true;
        listener_cv_.notify_all();
      });
    } catch (const std::system_error& e) {
      // cpp-httplib closes its listening socket only in stop(), which needs
      // the accept loop; close it here.
      if (listen_fd_ >= 0) ::close(listen_fd_);
      return Status::ResourceExhausted(what + ": start the listener thread: " + e.what() +
                                       "; raise the process's thread limit");
    }
    // The loop marks itself running as its first step; until then stop()
    // would do nothing and the join would hang. A fresh thread that has not
    // run for this long means the host is not scheduling us at all.
    std::unique_lock<std::mutex> lock(listener_mu_);
    const auto deadline = steady_clock::now() + std::chrono::seconds(30);
    while (!server_.is_running() && !listener_done_) {
      if (steady_clock::now() >= deadline) {
        Logger()->critical("{}: the listener thread did not start within 30 s; aborting", what);
        std::abort();
      }
      listener_cv_.wait_for(lock, milliseconds(1));
    }
    if (listener_done_) {
      lock.unlock();
      listener_.join();
      return Status::Internal(what + ": the HTTP accept loop ended as soon as it started");
    }
    return Status::Ok();
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!listener_.joinable()) return;
    // Listen() saw the loop running, so stop() closes the listening socket
    // and ends it. Called once: cpp-httplib asserts on a second call while the
    // loop winds down.
    server_.stop();
    listener_.join();
    // No more accepts: close what is still being read, then let the workers
    // finish the requests they hold.
    if (reader_ != nullptr) reader_->Stop();
    pool_->Shutdown();
    Logger()->info("stopped serving /metrics, /healthz, /readyz on {}", address_.ToString());
  }

  const NetAddress& address() const { return address_; }

 private:
  void HandleSafely(const httplib::Request& req, httplib::Response& res) {
    try {
      Handle(req, res);
    } catch (const std::exception& e) {
      // prometheus-cpp or a readiness check threw (e.g. out of memory): this
      // request fails, the server keeps serving.
      Logger()->warn("observability endpoint: {} {} failed: {}", Quoted(req.method),
                     Quoted(req.path), e.what());
      res.status = 500;
      res.set_content("internal error serving " + Quoted(req.path) + ": " + e.what() + "\n",
                      kTextPlain);
    }
  }

  void Handle(const httplib::Request& req, httplib::Response& res) {
    if (req.method != "GET" && req.method != "HEAD") {
      res.status = 405;
      res.set_header("Allow", "GET, HEAD");
      res.set_content("method " + Quoted(req.method) + " is not allowed on " + Quoted(req.path) +
                          "; use GET or HEAD\n",
                      kTextPlain);
      return;
    }
    if (req.path == "/metrics") {
      prometheus::TextSerializer serializer;
      res.status = 200;
      res.set_content(serializer.Serialize(registry_->Collect()), kMetricsContentType);
    } else if (req.path == "/healthz") {
      res.status = 200;
      res.set_content("ok", kTextPlain);
    } else if (req.path == "/readyz") {
      const Status ready = readiness_ ? readiness_() : Status::Ok();
      if (ready.ok()) {
        res.status = 200;
        res.set_content("ok", kTextPlain);
      } else {
        res.status = 503;
        res.set_content(
            ready.message().empty() ? std::string(StatusCodeName(ready.code())) : ready.message(),
            kTextPlain);
      }
    } else {
      res.status = 404;
      res.set_content("no endpoint " + Quoted(req.path) + "; use " + kEndpoints + "\n", kTextPlain);
    }
  }

  const std::shared_ptr<prometheus::Registry> registry_;
  const ReadinessCheck readiness_;
  const std::unique_ptr<WorkerPool> pool_;  // outlives server_'s use of it
  std::unique_ptr<RequestReader> reader_;   // set before listening; outlives server_'s use
  GatedServer server_;
  NetAddress address_;
  int listen_fd_ = -1;  // the socket cpp-httplib bound; it owns it

  std::thread listener_;  // runs server_.listen_after_bind()
  std::mutex listener_mu_;
  std::condition_variable listener_cv_;
  bool listener_done_ = false;  // guarded by listener_mu_
  std::mutex stop_mu_;          // serializes Stop
};

Result<std::unique_ptr<ObservabilityServer>> ObservabilityServer::Start(
    std::string_view listen, std::shared_ptr<prometheus::Registry> registry,
    ReadinessCheck readiness, const ObservabilityOptions& options) {
  const std::string what = "serve /metrics, /healthz, /readyz on " + Quoted(listen);
  if (registry == nullptr) {
    return Status::InvalidArgument(what + ": no metrics registry was given (a bug in the caller)");
  }
  GRANARY_RETURN_IF_ERROR(CheckOptions(options).WithContext(what + ": options"));
  Result<NetAddress> requested = ParseNetAddress(listen, "listen address");
  if (!requested.ok()) return requested.status().WithContext(what);
  Result<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::Start(options.worker_threads, options.max_queued_connections);
  if (!pool.ok()) return pool.status().WithContext(what);

  auto impl = std::make_unique<Impl>(std::move(registry), std::move(readiness), std::move(*pool));
  impl->Configure(options);
  GRANARY_RETURN_IF_ERROR(impl->StartReader(options).WithContext(what));
  GRANARY_RETURN_IF_ERROR(impl->Bind(*requested, what));
  GRANARY_RETURN_IF_ERROR(impl->Listen(what));
  Logger()->info("serving /metrics, /healthz, /readyz on {}", impl->address().ToString());
  return std::unique_ptr<ObservabilityServer>(new ObservabilityServer(std::move(impl)));
}

ObservabilityServer::ObservabilityServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ObservabilityServer::~ObservabilityServer() { Stop(); }

const NetAddress& ObservabilityServer::address() const { return impl_->address(); }

void ObservabilityServer::Stop() { impl_->Stop(); }

// ---- naming rules ----

namespace {

// Words that are not base units, and the base unit to use instead.
struct NonBaseUnit {
  std::string_view word;
  std::string_view use;
};
constexpr NonBaseUnit kNonBaseUnits[] = {
    {"ms", "seconds"},         {"msec", "seconds"},
    {"millis", "seconds"},     {"milliseconds", "seconds"},
    {"us", "seconds"},         {"usec", "seconds"},
    {"micros", "seconds"},     {"microseconds", "seconds"},
    {"ns", "seconds"},         {"nsec", "seconds"},
    {"nanos", "seconds"},      {"nanoseconds", "seconds"},
    {"sec", "seconds"},        {"secs", "seconds"},
    {"minutes", "seconds"},    {"mins", "seconds"},
    {"hours", "seconds"},      {"days", "seconds"},
    {"kb", "bytes"},           {"kib", "bytes"},
    {"kilobytes", "bytes"},    {"mb", "bytes"},
    {"mib", "bytes"},          {"megabytes", "bytes"},
    {"gb", "bytes"},           {"gib", "bytes"},
    {"gigabytes", "bytes"},    {"tb", "bytes"},
    {"tib", "bytes"},          {"percent", "ratio (0 to 1)"},
    {"pct", "ratio (0 to 1)"},
};

// Label names that would give one time series per sample, file, chunk, pod or
// request (DESIGN.md: never sample ids, paths or pod names).
constexpr std::string_view kHighCardinalityLabels[] = {
    "sample",   "sample_id", "samples",  "path",   "file",       "file_name", "filename", "pod",
    "pod_name", "chunk",     "chunk_id", "offset", "request_id", "trace_id",  "uid",
};

// The words the exposition appends to histogram series.
constexpr std::string_view kReservedSuffixes[] = {"count", "sum", "bucket"};

bool IsSnakeCase(std::string_view s) {
  return !s.empty() && IsAsciiLower(s.front()) && std::all_of(s.begin(), s.end(), [](char c) {
    return IsAsciiLower(c) || IsAsciiDigit(c) || c == '_';
  });
}

std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> words;
  size_t start = 0;
  while (true) {
    const size_t end = s.find('_', start);
    words.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return words;
    start = end + 1;
  }
}

std::string_view KindName(MetricKind kind) {
  switch (kind) {
    case MetricKind::kCounter:
      return "counter";
    case MetricKind::kGauge:
      return "gauge";
    case MetricKind::kHistogram:
      return "histogram";
  }
  return "metric";
}

}  // namespace

Status CheckMetricName(std::string_view name, std::string_view component, MetricKind kind) {
  if (component.empty() || !IsAsciiLower(component.front()) ||
      !std::all_of(component.begin(), component.end(),
                   [](char c) { return IsAsciiLower(c) || IsAsciiDigit(c); })) {
    return Status::InvalidArgument("metric component " + Quoted(component) +
                                   " is not [a-z][a-z0-9]* (e.g. 'cachenode', 'sidecar')");
  }
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(std::string(KindName(kind)) + " name " + Quoted(name) + " " +
                                   why +
                                   " (rule: granary_<component>_<what>_<unit>, see "
                                   "docs/observability.md)");
  };
  const std::string prefix = "granary_" + std::string(component) + "_";
  if (name.substr(0, prefix.size()) != prefix) {
    return bad("does not start with '" + prefix + "'");
  }
  if (!IsSnakeCase(name)) return bad("is not lowercase snake_case ([a-z0-9_])");
  const std::string_view rest = name.substr(prefix.size());
  if (rest.empty()) return bad("names nothing after '" + prefix + "'");
  if (!IsAsciiLower(rest.front()))
    return bad("has a part after the prefix that starts with '_' or a digit");
  if (rest.find("__") != std::string_view::npos || rest.back() == '_') {
    return bad("has an empty word ('__' or a trailing '_')");
  }
  std::vector<std::string_view> words = Words(rest);
  for (std::string_view w : words) {
    for (const NonBaseUnit& u : kNonBaseUnits) {
      if (w == u.word) {
        return bad("uses '" + std::string(w) + "', not a base unit; use _" + std::string(u.use) +
                   " and convert the value");
      }
    }
  }
  const bool ends_total = words.back() == "total";
  if (kind == MetricKind::kCounter) {
    if (!ends_total) return bad("does not end in _total, as every counter must");
    words.pop_back();
    if (words.empty()) return bad("has nothing before _total");
  } else if (ends_total) {
    return bad("ends in _total, which only counters may");
  }
  for (std::string_view reserved : kReservedSuffixes) {
    if (words.back() == reserved) {
      return bad("ends in _" + std::string(reserved) +
                 ", a suffix the exposition generates for histograms; name what is measured");
    }
  }
  return Status::Ok();
}

Status CheckLabelNames(const std::vector<std::string>& label_names) {
  if (label_names.size() > kMaxMetricLabels) {
    return Status::InvalidArgument(
        std::to_string(label_names.size()) + " labels on one metric; at most " +
        std::to_string(kMaxMetricLabels) + " (each label multiplies the time series)");
  }
  std::set<std::string_view> seen;
  for (const std::string& l : label_names) {
    if (!IsSnakeCase(l)) {
      return Status::InvalidArgument("label name " + Quoted(l) +
                                     " is not snake_case starting with a letter ([a-z][a-z0-9_]*)");
    }
    if (l == "le" || l == "quantile") {
      return Status::InvalidArgument("label name " + Quoted(l) +
                                     " is reserved by the exposition format; choose another");
    }
    for (std::string_view high : kHighCardinalityLabels) {
      if (l == high) {
        return Status::InvalidArgument(
            "label " + Quoted(l) +
            " would make one time series per value (sample ids, paths, chunk ids and pod names "
            "are unbounded); count them in an unlabelled metric or by dataset instead");
      }
    }
    if (!seen.insert(l).second) {
      return Status::InvalidArgument("label name " + Quoted(l) + " is given twice");
    }
  }
  return Status::Ok();
}

// ---- MetricFamily, MetricRegistrar ----

template <typename T>
Result<T*> MetricFamily<T>::WithLabels(const std::vector<std::string>& label_values) const {
  if (family_ == nullptr) {
    return Status::FailedPrecondition(
        "a metric family was used before it was declared; declare it with MetricRegistrar");
  }
  const std::string what = "metric " + Quoted(family_->GetName());
  if (label_values.size() != label_names_.size()) {
    return Status::InvalidArgument(what + ": " + std::to_string(label_values.size()) +
                                   " label values for " + std::to_string(label_names_.size()) +
                                   " labels; give one value per label, in declaration order");
  }
  prometheus::Labels labels;
  for (size_t i = 0; i < label_values.size(); ++i) {
    const std::string& v = label_values[i];
    if (v.empty() || v.size() > kMaxLabelValueBytes) {
      return Status::InvalidArgument(what + ": value " + Quoted(v) + " of label " +
                                     Quoted(label_names_[i]) + " must be 1.." +
                                     std::to_string(kMaxLabelValueBytes) + " bytes");
    }
    labels.emplace(label_names_[i], v);
  }
  try {
    if constexpr (std::is_same_v<T, prometheus::Histogram>) {
      return &family_->Add(labels, buckets_);
    } else {
      return &family_->Add(labels);
    }
  } catch (const std::exception& e) {
    return Status::InvalidArgument(what + ": add the metric for these labels: " + e.what());
  }
}

template class MetricFamily<prometheus::Counter>;
template class MetricFamily<prometheus::Gauge>;
template class MetricFamily<prometheus::Histogram>;

namespace {

template <typename T>
MetricKind KindOf() {
  if constexpr (std::is_same_v<T, prometheus::Counter>) {
    return MetricKind::kCounter;
  } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
    return MetricKind::kGauge;
  } else {
    return MetricKind::kHistogram;
  }
}

// Checks the name, help and labels, then registers the family. prometheus-cpp
// throws on a name it rejects or one held by another type: caught here.
template <typename T>
Result<prometheus::Family<T>*> Declare(prometheus::Registry& registry, std::string_view component,
                                       std::string_view name, std::string_view help,
                                       const std::vector<std::string>& label_names) {
  GRANARY_RETURN_IF_ERROR(CheckMetricName(name, component, KindOf<T>()));
  const std::string what = "declare " + std::string(KindName(KindOf<T>())) + " " + Quoted(name);
  if (help.empty()) {
    return Status::InvalidArgument(what + ": no help text; say what it counts or measures");
  }
  GRANARY_RETURN_IF_ERROR(CheckLabelNames(label_names).WithContext(what));
  try {
    const std::string n(name);
    const std::string h(help);
    if constexpr (std::is_same_v<T, prometheus::Counter>) {
      return &prometheus::BuildCounter().Name(n).Help(h).Register(registry);
    } else if constexpr (std::is_same_v<T, prometheus::Gauge>) {
      return &prometheus::BuildGauge().Name(n).Help(h).Register(registry);
    } else {
      return &prometheus::BuildHistogram().Name(n).Help(h).Register(registry);
    }
  } catch (const std::exception& e) {
    return Status::AlreadyExists(what + ": " + e.what() +
                                 "; a name has one type in a registry: rename one of them");
  }
}

template <typename T>
Result<T*> Single(Result<prometheus::Family<T>*> family,
                  const prometheus::Histogram::BucketBoundaries& buckets = {}) {
  if (!family.ok()) return family.status();
  try {
    if constexpr (std::is_same_v<T, prometheus::Histogram>) {
      return &(*family)->Add({}, buckets);
    } else {
      return &(*family)->Add({});
    }
  } catch (const std::exception& e) {
    return Status::Internal("metric " + Quoted((*family)->GetName()) + ": " + e.what());
  }
}

Status CheckHistogramBuckets(std::string_view name,
                             const prometheus::Histogram::BucketBoundaries& buckets) {
  return CheckBuckets(buckets).WithContext("declare histogram " + Quoted(name));
}

}  // namespace

Result<prometheus::Counter*> MetricRegistrar::AddCounter(std::string_view name,
                                                         std::string_view help) {
  return Single(Declare<prometheus::Counter>(registry_, component_, name, help, {}));
}

Result<prometheus::Gauge*> MetricRegistrar::AddGauge(std::string_view name, std::string_view help) {
  return Single(Declare<prometheus::Gauge>(registry_, component_, name, help, {}));
}

Result<prometheus::Histogram*> MetricRegistrar::AddHistogram(
    std::string_view name, std::string_view help, prometheus::Histogram::BucketBoundaries buckets) {
  GRANARY_RETURN_IF_ERROR(CheckHistogramBuckets(name, buckets));
  return Single(Declare<prometheus::Histogram>(registry_, component_, name, help, {}), buckets);
}

Result<MetricFamily<prometheus::Counter>> MetricRegistrar::AddCounterFamily(
    std::string_view name, std::string_view help, std::vector<std::string> label_names) {
  GRANARY_ASSIGN_OR_RETURN(
      prometheus::Family<prometheus::Counter> * family,
      Declare<prometheus::Counter>(registry_, component_, name, help, label_names));
  return MetricFamily<prometheus::Counter>(family, std::move(label_names), {});
}

Result<MetricFamily<prometheus::Gauge>> MetricRegistrar::AddGaugeFamily(
    std::string_view name, std::string_view help, std::vector<std::string> label_names) {
  GRANARY_ASSIGN_OR_RETURN(
      prometheus::Family<prometheus::Gauge> * family,
      Declare<prometheus::Gauge>(registry_, component_, name, help, label_names));
  return MetricFamily<prometheus::Gauge>(family, std::move(label_names), {});
}

Result<MetricFamily<prometheus::Histogram>> MetricRegistrar::AddHistogramFamily(
    std::string_view name, std::string_view help, std::vector<std::string> label_names,
    prometheus::Histogram::BucketBoundaries buckets) {
  GRANARY_RETURN_IF_ERROR(CheckHistogramBuckets(name, buckets));
  GRANARY_ASSIGN_OR_RETURN(
      prometheus::Family<prometheus::Histogram> * family,
      Declare<prometheus::Histogram>(registry_, component_, name, help, label_names));
  return MetricFamily<prometheus::Histogram>(family, std::move(label_names), std::move(buckets));
}

// ---- buckets ----

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,  10.0};
}

Result<prometheus::Histogram::BucketBoundaries> ExponentialBuckets(double start, double factor,
                                                                   size_t count) {
  const std::string what = "exponential buckets (start " + std::to_string(start) + ", factor " +
                           std::to_string(factor) + ", count " + std::to_string(count) + ")";
  if (!(std::isfinite(start) && start > 0)) {
    return Status::InvalidArgument(what + ": start must be a finite number above 0");
  }
  if (!(std::isfinite(factor) && factor > 1)) {
    return Status::InvalidArgument(what + ": factor must be a finite number above 1");
  }
  if (count < 1 || count > 64) return Status::InvalidArgument(what + ": count must be 1..64");
  prometheus::Histogram::BucketBoundaries b;
  b.reserve(count);
  double bound = start;
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(bound)) {
      return Status::InvalidArgument(what + ": bound " + std::to_string(i) +
                                     " overflows; use fewer buckets or a smaller factor");
    }
    b.push_back(bound);
    bound *= factor;
  }
  return b;
}

Status CheckBuckets(const prometheus::Histogram::BucketBoundaries& buckets) {
  if (buckets.empty()) {
    return Status::InvalidArgument(
        "no bucket bounds; use LatencyBucketsSeconds() or "
        "ExponentialBuckets()");
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i])) {
      return Status::InvalidArgument("bucket bound " + std::to_string(i) +
                                     " is not finite (+Inf is added by the exposition)");
    }
    if (i > 0 && !(buckets[i] > buckets[i - 1])) {
      return Status::InvalidArgument("bucket bounds are not strictly increasing at " +
                                     std::to_string(i) + " (" + std::to_string(buckets[i - 1]) +
                                     " then " + std::to_string(buckets[i]) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace granary

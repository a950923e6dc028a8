#include "granary/daemon/observability.h"

#include "granary/core/thread_name.h"

// ObservabilityServer: cpp-httplib's server, gated by the RequestReader
// (request_reader.h) and answered by the WorkerPool (worker_pool.h); bind
// errors explained by listen_address.h. Declaring metrics is in
// metric_registrar.cc.
//
// cpp-httplib is included here only: it is large, and Debian builds it as a
// library whose -D flags (from pkg-config) must match; no other translation
// unit needs to see it.
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "listen_address.h"
#include "request_reader.h"
#include "worker_pool.h"

namespace granary {
namespace {

using observability::ExplainBindFailure;
using observability::kMaxRequestPayloadBytes;
using observability::RequestReader;
using observability::ResolveHost;
using observability::WorkerPool;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr char kTextPlain[] = "text/plain; charset=utf-8";
// The content type Prometheus expects for the text exposition format.
constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kEndpoints[] = "/metrics, /healthz or /readyz";

constexpr int kMaxWorkerThreads = 64;
constexpr size_t kMaxQueuedConnectionsLimit = 65536;
constexpr std::chrono::seconds kMaxTimeout{3600};

std::shared_ptr<spdlog::logger> Logger() { return GetLogger("observability"); }

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
        NameThisThread("http-listen");
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

}  // namespace granary

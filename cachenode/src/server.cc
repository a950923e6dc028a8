// The cache node server (server.h): its options, the listener and the loops
// (ServerCore: accept, place each connection on a loop, the timeout sweeps,
// the service pool, drain and stop, counters) and the public facade. One
// client connection is connection.h; the reply budget is reply_budget.h.

#include "granary/cachenode/server.h"

#include <pthread.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <exception>
#include <future>
#include <limits>
#include <utility>

#include "connection.h"
#include "granary/core/file.h"
#include "granary/core/names.h"
#include "granary/core/net_address.h"
#include "granary/core/thread_name.h"
#include "granary/protocol/protocol_format.h"

namespace granary {
namespace server_internal {
namespace {

// How often each loop checks its connections' timeouts, at most.
constexpr auto kMaxSweepPeriod = std::chrono::milliseconds(100);

constexpr int kListenBacklog = 1024;

}  // namespace
}  // namespace server_internal

Status ServerOptions::Validate() const {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("cache node server options: " + what);
  };
  if (io_threads == 0 || io_threads > 1024) return bad("io_threads must be 1..1024");
  if (service_threads == 0 || service_threads > 1024) return bad("service_threads must be 1..1024");
  if (max_connections == 0) return bad("max_connections must be at least 1");
  if (max_connections_per_address > max_connections) {
    return bad("max_connections_per_address (" + std::to_string(max_connections_per_address) +
               ") must be at most max_connections (" + std::to_string(max_connections) +
               "), or 0 for its default");
  }
  if (max_unauthenticated_per_address == 0) {
    return bad("max_unauthenticated_per_address must be at least 1");
  }
  if (max_in_flight == 0 || max_in_flight > 1024) return bad("max_in_flight must be 1..1024");
  if (receive_chunk_bytes == 0) return bad("receive_chunk_bytes must be at least 1");
  if (write_quantum_bytes == 0) return bad("write_quantum_bytes must be at least 1");
  if (reply_buffer_bytes == 0) return bad("reply_buffer_bytes must be at least 1");
  if (connection_reply_buffer_bytes > reply_buffer_bytes) {
    return bad("connection_reply_buffer_bytes (" + std::to_string(connection_reply_buffer_bytes) +
               ") must be at most reply_buffer_bytes (" + std::to_string(reply_buffer_bytes) +
               "), or 0 for a quarter of it");
  }
  const std::pair<const char*, std::chrono::milliseconds> timeouts[] = {
      {"handshake_timeout", handshake_timeout},
      {"frame_timeout", frame_timeout},
      {"idle_timeout", idle_timeout},
      {"write_timeout", write_timeout},
      {"reply_stall_timeout", reply_stall_timeout},
      {"drain_timeout", drain_timeout}};
  for (const auto& [name, value] : timeouts) {
    if (value.count() <= 0) return bad(std::string(name) + " must be positive");
  }
  if (Status s = limits.Validate(); !s.ok()) return s.WithContext("cache node server options");
  auto hello = EncodeResponse(1, HelloReply{protocol_format::kMaxVersion, node_name, limits});
  if (!hello.ok()) return hello.status().WithContext("cache node server options: node_name");
  return Status::Ok();
}

namespace server_internal {

ServerCore::ServerCore(std::shared_ptr<ReadService> service, ServerOptions options)
    : options_(std::move(options)),
      budget_(options_.reply_buffer_bytes),
      service_(std::move(service)),
      log_(GetLogger("cachenode")),
      sweep_period_(std::min<std::chrono::milliseconds>(
          {kMaxSweepPeriod,
           std::max<std::chrono::milliseconds>(
               std::chrono::milliseconds(1),
               std::min({options_.handshake_timeout, options_.frame_timeout, options_.idle_timeout,
                         options_.write_timeout, options_.reply_stall_timeout}) /
                   4)})) {}

Status ServerCore::Start(const NetAddress& listen) {
  const std::string where = "cache node server: listen on " + listen.ToString();
  try {
    workers_.reserve(options_.io_threads);
    for (uint32_t i = 0; i < options_.io_threads; ++i) {
      workers_.push_back(std::make_unique<Worker>());
    }
    Worker& first = *workers_.front();
    ErrorCode ec;
    tcp::resolver resolver(first.io);
    auto endpoints = resolver.resolve(listen.host, std::to_string(listen.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return Status::Unavailable(where + ": cannot resolve " + Quoted(listen.host) + ": " +
                                 (ec ? ec.message() : std::string("no address")) +
                                 "; give an address of this host");
    }
    tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_ = std::make_unique<tcp::acceptor>(first.io);
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(kListenBacklog, ec);
    if (ec) {
      if (ec == asio::error::address_in_use) {
        return Status::Unavailable(where +
                                   ": the address is in use; stop what listens there or "
                                   "pick another port");
      }
      if (ec == asio::error::access_denied) {
        return Status::PermissionDenied(where + ": " + ec.message() +
                                        "; ports below 1024 need privileges, pick a higher one");
      }
      if (ec == boost::system::errc::address_not_available) {
        return Status::Unavailable(where +
                                   ": not an address of this host; use one of its "
                                   "addresses, or 0.0.0.0 for all");
      }
      return Status::Unavailable(where + ": " + ec.message());
    }
    port_ = acceptor_->local_endpoint(ec).port();
    accept_retry_timer_ = std::make_unique<asio::steady_timer>(first.io);

    // Threads start with SIGPIPE blocked (see server.h), the pool's too.
    sigset_t block;
    sigset_t old;
    sigemptyset(&block);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    struct RestoreMask {
      sigset_t* mask;
      ~RestoreMask() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
    } restore{&old};
    {
      // The pool's threads take the name of the thread that makes them.
      ScopedThreadName name("tcp-service");
      pool_ = std::make_unique<asio::thread_pool>(options_.service_threads);
    }
    for (auto& worker : workers_) {
      Worker* w = worker.get();
      ArmSweep(*w);
      w->thread = std::thread([w] {
        NameThisThread("tcp-io");
        w->io.run();
        std::lock_guard lock(w->done_mu);
        w->done = true;
        w->done_cv.notify_all();
      });
    }
    asio::post(first.io, [this] { Accept(); });
  } catch (const std::exception& e) {
    return Status::ResourceExhausted(where + ": cannot start its threads: " + e.what() +
                                     "; lower io_threads/service_threads or raise the limits");
  }
  log_->info("cache node server {} listening on {}:{} ({} loops, {} service threads)",
             Quoted(options_.node_name), listen.host, port_, options_.io_threads,
             options_.service_threads);
  return Status::Ok();
}

void ServerCore::Accept() {
  if (!acceptor_->is_open()) return;
  Worker& target = *workers_[next_worker_];
  next_worker_ = (next_worker_ + 1) % workers_.size();
  acceptor_->async_accept(target.io, [this, &target](const ErrorCode& ec, Socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;
    if (ec) {
      // Out of file descriptors or memory, most likely: retry shortly rather
      // than spin on the same error.
      WarnAboutClient("accepting a connection failed: " + ec.message() +
                      "; retrying in 100 ms (raise the file descriptor limit if it persists)");
      accept_retry_timer_->expires_after(std::chrono::milliseconds(100));
      accept_retry_timer_->async_wait([this](const ErrorCode& e) {
        if (!e) Accept();
      });
      return;
    }
    OnAccepted(target, std::move(socket));
    Accept();
  });
}

void ServerCore::Reject(Socket& socket, const std::string& why) {
  Add(counters_.connections_rejected);
  WarnAboutClient("refused a connection: " + why);
  std::string error =
      EncodeError(0,
                  Status::ResourceExhausted("cache node " + options_.node_name + " has " + why +
                                            "; retry later or read from another replica"),
                  true);
  // Best effort, never waiting: a fresh socket's buffer takes these few bytes.
  (void)::send(socket.native_handle(), error.data(), error.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ErrorCode ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

void ServerCore::OnAccepted(Worker& target, Socket socket) {
  if (draining()) {
    ErrorCode ec;
    socket.close(ec);
    return;
  }
  if (Load(counters_.connections_open) >= options_.max_connections) {
    Reject(socket, std::to_string(options_.max_connections) +
                       " connections open, its maximum (max_connections)");
    return;
  }
  auto gauge = std::make_shared<ConnectionGauge>();
  gauge->id = ++next_connection_id_;
  ErrorCode ec;
  tcp::endpoint remote = socket.remote_endpoint(ec);
  gauge->peer_ip = ec ? std::string("unknown") : remote.address().to_string();
  gauge->peer_address = ec ? std::string("unknown peer")
                           : NetAddress{remote.address().to_string(), remote.port()}.ToString();
  {
    // One address may not take every place (1,024 idle connections from one
    // host locked the port), nor, before it has authenticated, more than a few.
    std::lock_guard lock(address_mu_);
    AddressCount& count = per_address_[gauge->peer_ip];
    std::string why;
    if (count.open >= options_.MaxConnectionsPerAddress()) {
      why = std::to_string(count.open) + " connections open from " + gauge->peer_ip +
            ", the most one address may hold (max_connections_per_address)";
    } else if (options_.auth != nullptr &&
               count.unauthenticated >= options_.max_unauthenticated_per_address) {
      why = std::to_string(count.unauthenticated) + " connections from " + gauge->peer_ip +
            " that have not authenticated (max_unauthenticated_per_address)";
    }
    if (!why.empty()) {
      if (count.open == 0) per_address_.erase(gauge->peer_ip);
      Reject(socket, why);
      return;
    }
    ++count.open;
    if (options_.auth != nullptr) {
      ++count.unauthenticated;
      gauge->unauthenticated.store(true, std::memory_order_relaxed);
    }
  }
  Add(counters_.connections_accepted);
  Add(counters_.connections_open);
  {
    std::lock_guard lock(registry_mu_);
    registry_.emplace(gauge->id, gauge);
  }
  asio::post(target.io, [this, &target, gauge, s = std::move(socket)]() mutable {
    auto connection = std::make_shared<Connection>(*this, target, std::move(s), gauge->id, gauge);
    target.connections.emplace(gauge->id, connection);
    if (draining()) {
      connection->Close();
      return;
    }
    connection->Start();
  });
}

void ServerCore::OnConnectionClosed(uint64_t id) {
  Add(counters_.connections_closed);
  counters_.connections_open.fetch_sub(1, std::memory_order_relaxed);
  std::shared_ptr<ConnectionGauge> gauge;
  {
    std::lock_guard lock(registry_mu_);
    auto it = registry_.find(id);
    if (it != registry_.end()) gauge = it->second;
    registry_.erase(id);
    registry_cv_.notify_all();
  }
  if (gauge == nullptr) return;
  std::lock_guard lock(address_mu_);
  auto it = per_address_.find(gauge->peer_ip);
  if (it == per_address_.end()) return;
  if (gauge->unauthenticated.exchange(false) && it->second.unauthenticated > 0) {
    --it->second.unauthenticated;
  }
  if (--it->second.open == 0) per_address_.erase(it);
}

void ServerCore::OnAuthenticated(ConnectionGauge& gauge) {
  if (!gauge.unauthenticated.exchange(false)) return;
  std::lock_guard lock(address_mu_);
  auto it = per_address_.find(gauge.peer_ip);
  if (it != per_address_.end() && it->second.unauthenticated > 0) --it->second.unauthenticated;
}

void ServerCore::NoteBuffered(uint64_t old_bytes, uint64_t new_bytes) {
  if (new_bytes >= old_bytes) {
    Add(counters_.buffered_bytes, new_bytes - old_bytes);
  } else {
    counters_.buffered_bytes.fetch_sub(old_bytes - new_bytes, std::memory_order_relaxed);
  }
  uint64_t seen = Load(counters_.max_connection_buffered);
  while (new_bytes > seen && !counters_.max_connection_buffered.compare_exchange_weak(
                                 seen, new_bytes, std::memory_order_relaxed)) {
  }
}

void ServerCore::RecordLatency(SteadyClock::duration latency) {
  const double seconds = std::chrono::duration<double>(latency).count();
  size_t bucket = 0;
  while (bucket < kServerLatencyBucketsSeconds.size() &&
         seconds > kServerLatencyBucketsSeconds[bucket]) {
    ++bucket;
  }
  Add(counters_.latency_buckets[bucket]);
  Add(counters_.latency_count);
  Add(counters_.latency_sum_ns,
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(latency).count()));
}

void ServerCore::WarnAboutClient(const std::string& message) { warnings_.Warn(message); }

void ServerCore::ArmSweep(Worker& worker) {
  worker.sweep.expires_after(sweep_period_);
  worker.sweep.async_wait([this, &worker](const ErrorCode& ec) {
    if (ec) return;
    const auto now = SteadyClock::now();
    // A connection may close (and leave the map) while it is swept.
    std::vector<std::shared_ptr<Connection>> connections;
    connections.reserve(worker.connections.size());
    for (auto& [id, c] : worker.connections) connections.push_back(c);
    for (auto& c : connections) c->Sweep(now);
    ArmSweep(worker);
  });
}

void ServerCore::RunOn(Worker& worker, std::function<void()> fn) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  asio::post(worker.io, [&fn, &done] {
    fn();
    done.set_value();
  });
  finished.wait();
}

void ServerCore::Stop() {
  if (stopped_) return;
  stopped_ = true;
  draining_.store(true, std::memory_order_release);
  // Only loops whose thread runs can run anything (Start may have failed
  // half-way).
  std::vector<Worker*> running;
  for (auto& w : workers_) {
    if (w->thread.joinable()) running.push_back(w.get());
  }
  auto for_each_connection = [this, &running](void (Connection::*step)()) {
    for (Worker* w : running) {
      RunOn(*w, [w, step] {
        // A connection may close (and leave the map) during its step.
        std::vector<std::shared_ptr<Connection>> connections;
        for (auto& [id, c] : w->connections) connections.push_back(c);
        for (auto& c : connections) ((*c).*step)();
      });
    }
  };
  if (!running.empty() && running.front() == workers_.front().get()) {
    // 1. No new connections.
    RunOn(*running.front(), [this] {
      ErrorCode ec;
      if (acceptor_) acceptor_->close(ec);
      if (accept_retry_timer_) accept_retry_timer_->cancel();
    });
  }
  // 2. No new requests; the requests already decoded are answered.
  for_each_connection(&Connection::BeginDrain);
  {
    std::unique_lock lock(registry_mu_);
    if (!registry_cv_.wait_for(lock, options_.drain_timeout,
                               [this] { return registry_.empty(); })) {
      log_->warn(
          "cache node server: {} connections still had replies in flight after the drain "
          "timeout of {} ms; closing them",
          registry_.size(), options_.drain_timeout.count());
    }
  }
  // 3. Close what is left.
  for_each_connection(&Connection::Close);
  // 4. Service calls in progress return; their answers find closed connections.
  if (pool_) pool_->join();
  // 5. The loops run out of work and return.
  for (Worker* w : running) {
    asio::post(w->io, [w] {
      w->sweep.cancel();
      w->guard.reset();
    });
  }
  for (Worker* w : running) {
    {
      std::unique_lock lock(w->done_mu);
      if (!w->done_cv.wait_for(lock, std::chrono::seconds(5), [w] { return w->done; })) {
        log_->error(
            "cache node server: an event loop still had work 5 s after its connections "
            "closed; stopping it (a bug)");
        w->io.stop();
      }
    }
    w->thread.join();
  }
  if (!running.empty()) log_->info("cache node server {} stopped", Quoted(options_.node_name));
}

ServerCounters ServerCore::Counters() const {
  const AtomicCounters& c = counters_;
  ServerCounters out;
  out.connections_accepted_total = Load(c.connections_accepted);
  out.connections_rejected_total = Load(c.connections_rejected);
  out.connections_closed_total = Load(c.connections_closed);
  out.connections_open = Load(c.connections_open);
  out.requests_total = Load(c.requests);
  out.hello_requests_total = Load(c.hello);
  out.ping_requests_total = Load(c.ping);
  out.stat_requests_total = Load(c.stat);
  out.read_requests_total = Load(c.read);
  out.read_items_total = Load(c.read_items);
  out.read_item_errors_total = Load(c.read_item_errors);
  out.sent_bytes_total = Load(c.sent_bytes);
  out.payload_bytes_total = Load(c.payload_bytes);
  out.sendfile_bytes_total = Load(c.sendfile_bytes);
  out.received_bytes_total = Load(c.received_bytes);
  out.framing_errors_total = Load(c.framing_errors);
  out.truncated_frames_total = Load(c.truncated_frames);
  out.message_errors_total = Load(c.message_errors);
  out.policy_errors_total = Load(c.policy_errors);
  out.service_errors_total = Load(c.service_errors);
  out.internal_errors_total = Load(c.internal_errors);
  out.timeouts_total = Load(c.timeouts);
  out.send_errors_total = Load(c.send_errors);
  out.buffered_bytes = Load(c.buffered_bytes);
  out.max_connection_buffered_bytes = Load(c.max_connection_buffered);
  out.reply_budget_bytes = budget_.limit();
  out.reply_budget_used_bytes = budget_.used();
  out.reply_budget_waits_total = Load(c.reply_budget_waits);
  out.connection_reply_waits_total = Load(c.connection_reply_waits);
  out.reply_stall_closes_total = Load(c.reply_stall_closes);
  out.auth_granted_total = Load(c.auth_granted);
  out.auth_refused_total = Load(c.auth_refused);
  for (size_t i = 0; i < out.latency_buckets.size(); ++i) {
    out.latency_buckets[i] = Load(c.latency_buckets[i]);
  }
  out.latency_count = Load(c.latency_count);
  out.latency_sum_seconds = static_cast<double>(Load(c.latency_sum_ns)) / 1e9;
  return out;
}

std::vector<ConnectionInfo> ServerCore::Connections() const {
  std::vector<ConnectionInfo> out;
  std::lock_guard lock(registry_mu_);
  out.reserve(registry_.size());
  for (const auto& [id, g] : registry_) {
    ConnectionInfo info;
    info.id = id;
    info.peer_address = g->peer_address;
    {
      std::lock_guard name_lock(g->mu);
      info.peer_name = g->peer_name;
    }
    info.buffered_bytes = g->buffered.load(std::memory_order_relaxed);
    info.reply_budget_bytes = g->reserved.load(std::memory_order_relaxed);
    info.in_flight = g->in_flight.load(std::memory_order_relaxed);
    info.reading = g->reading.load(std::memory_order_relaxed);
    info.write_blocked = g->write_blocked.load(std::memory_order_relaxed);
    info.requests_total = g->requests.load(std::memory_order_relaxed);
    info.sent_bytes_total = g->sent.load(std::memory_order_relaxed);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace server_internal

class Server::Impl : public server_internal::ServerCore {
 public:
  using ServerCore::ServerCore;
};

// ---------------------------------------------------------------------------

Result<std::unique_ptr<Server>> Server::Start(std::shared_ptr<ReadService> service,
                                              const ServerOptions& options) {
  if (service == nullptr) {
    return Status::InvalidArgument(
        "cache node server: no read service given; pass the one that "
        "answers READ and STAT");
  }
  GRANARY_RETURN_IF_ERROR(options.Validate());
  Result<NetAddress> listen = ParseNetAddress(options.listen, "listen address");
  if (!listen.ok()) return listen.status().WithContext("cache node server options");
  auto impl = std::make_unique<Impl>(std::move(service), options);
  GRANARY_RETURN_IF_ERROR(impl->Start(*listen));
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }
uint16_t Server::port() const { return impl_->port(); }
void Server::Stop() { impl_->Stop(); }
ServerCounters Server::Counters() const { return impl_->Counters(); }
std::vector<ConnectionInfo> Server::Connections() const { return impl_->Connections(); }

}  // namespace granary
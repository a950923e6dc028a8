// The cache node's fabric front end (fabric_server.h): the listener's accept
// thread, a thread per connection, and what a connection does with each
// message: the frame through its PeerSession, the service call, the READ's
// payload into the reader's window by RMA, the reply frame as a message.

#include "granary/cachenode/fabric_server.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/net_address.h"
#include "granary/core/thread_name.h"
#include "granary/fabric/endpoint.h"
#include "granary/protocol/protocol_format.h"
#include "peer_session.h"
#include "reply_budget.h"
#include "service_calls.h"

namespace granary {

namespace pf = protocol_format;
using server_internal::Add;
using server_internal::BudgetReservation;
using server_internal::ClientWarnings;
using server_internal::ErrorFrame;
using server_internal::Load;
using server_internal::PeerSession;
using server_internal::ReplyBudget;
using server_internal::ServiceCallContext;
using server_internal::ServiceResult;
using server_internal::SessionStep;
using SteadyClock = std::chrono::steady_clock;

namespace {

// How long Accept waits before it looks at stop_ again.
constexpr auto kAcceptSlice = std::chrono::milliseconds(200);
// A refused connection's ERROR: best effort, never long.
constexpr auto kRejectSendTime = std::chrono::milliseconds(200);

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

class FabricServer::Impl {
 public:
  Impl(std::shared_ptr<ReadService> service, FabricServerOptions options)
      : options_(std::move(options)),
        service_(std::move(service)),
        log_(GetLogger("cachenode")),
        budget_(options_.server.reply_buffer_bytes) {
    context_.service = service_.get();
    context_.options = &options_.server;
    context_.log = log_.get();
    context_.service_errors = &errors_;
    context_.internal_errors = &errors_;
    context_.auth_refused = &errors_;
    context_.auth_granted = &auth_granted_;
    context_.warn = [this](const std::string& message) { warnings_.Warn(message); };
    context_.finish_stat = [this](const StatRequest& stat, StatReply* reply) {
      if (stat.dataset.empty()) AppendEntries(reply);
      if (stop_.load()) reply->state = NodeState::kDraining;
    };
  }
  ~Impl() { Stop(); }

  Status Start(const NetAddress& address) {
    fabric::EndpointOptions endpoint;
    endpoint.provider = options_.provider;
    endpoint.max_message_bytes = fabric::MessageBytesFor(options_.server.limits.max_body_bytes);
    Result<std::unique_ptr<fabric::Listener>> listener =
        fabric::Listener::Listen(address, endpoint);
    if (!listener.ok()) return listener.status();
    listener_ = std::move(*listener);
    try {
      accept_thread_ = std::thread([this] {
        NameThisThread("fabric-accept");
        AcceptLoop();
      });
    } catch (const std::exception& e) {
      return Status::ResourceExhausted(
          "cache node fabric server: cannot start its accept thread: " + std::string(e.what()));
    }
    log_->info("cache node fabric server {} listening on {}:{} (provider {})",
               Quoted(options_.server.node_name), address.host, listener_->port(),
               options_.provider);
    return Status::Ok();
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    stop_.store(true);
    if (listener_ != nullptr) listener_->Close();
    if (accept_thread_.joinable()) accept_thread_.join();
    std::unique_lock lock(mu_);
    // Connections waiting for a request close now; those answering one finish it.
    for (auto& [id, c] : connections_) {
      if (!c->busy) c->endpoint->Close();
    }
    if (!done_cv_.wait_for(lock, options_.server.drain_timeout,
                           [this] { return connections_.empty(); })) {
      log_->warn(
          "cache node fabric server: {} connections still answered a request after the drain "
          "timeout of {} ms; closing them",
          connections_.size(), options_.server.drain_timeout.count());
      for (auto& [id, c] : connections_) c->endpoint->Close();
    }
    // Each thread returns within its endpoint's wait slice once closed, or
    // when its service call returns.
    std::map<uint64_t, std::thread> threads = std::move(threads_);
    lock.unlock();
    for (auto& [id, t] : threads) t.join();
    if (listener_ != nullptr) {
      log_->info("cache node fabric server {} stopped", Quoted(options_.server.node_name));
    }
  }

  uint16_t port() const { return listener_ != nullptr ? listener_->port() : 0; }

  FabricCounters Counters() const {
    FabricCounters out;
    out.connections_accepted_total = Load(accepted_);
    out.connections_rejected_total = Load(rejected_);
    out.connections_open = Load(open_);
    out.requests_total = Load(requests_);
    out.rma_bytes_total = Load(rma_bytes_);
    out.errors_total = Load(errors_);
    out.auth_granted_total = Load(auth_granted_);
    out.reply_budget_waits_total = Load(budget_waits_);
    return out;
  }

 private:
  struct Connection {
    uint64_t id = 0;
    std::shared_ptr<fabric::Endpoint> endpoint;
    bool busy = false;  // guarded by Impl::mu_: answering a request
  };

  void AcceptLoop() {
    while (!stop_.load()) {
      Result<std::unique_ptr<fabric::Endpoint>> accepted =
          listener_->Accept(SteadyClock::now() + kAcceptSlice);
      ReapFinished();
      if (!accepted.ok()) {
        if (accepted.status().code() == StatusCode::kDeadlineExceeded) continue;
        if (stop_.load()) return;
        warnings_.Warn("cache node fabric server: accepting a connection failed: " +
                       accepted.status().ToString() + "; retrying in 100 ms");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      auto connection = std::make_shared<Connection>();
      connection->endpoint = std::move(*accepted);
      std::string refused;
      {
        std::lock_guard lock(mu_);
        if (connections_.size() >= options_.server.max_connections) {
          refused = std::to_string(connections_.size()) +
                    " fabric connections open, its maximum (max_connections)";
        } else {
          connection->id = ++next_id_;
          try {
            threads_.emplace(connection->id, std::thread([this, connection] {
                               NameThisThread("fabric-conn");
                               Serve(*connection);
                             }));
            connections_.emplace(connection->id, connection);
            Add(accepted_);
            Add(open_);
          } catch (const std::exception& e) {
            refused = std::string("no thread for one more connection (") + e.what() + ")";
          }
        }
      }
      // Outside mu_: the ERROR may take up to kRejectSendTime.
      if (!refused.empty()) Reject(*connection->endpoint, refused);
    }
  }

  // ERROR kResourceExhausted (closing) saying `why`, best effort, and close.
  void Reject(fabric::Endpoint& endpoint, const std::string& why) {
    Add(rejected_);
    warnings_.Warn("cache node fabric server: refused a connection from " + endpoint.peer() + ": " +
                   why);
    (void)endpoint.Send(
        EncodeError(0,
                    Status::ResourceExhausted("cache node " + options_.server.node_name + " has " +
                                              why + "; retry later or read from another replica"),
                    true),
        SteadyClock::now() + kRejectSendTime);
    endpoint.Close();
  }

  void ReapFinished() {
    std::vector<std::thread> done;
    {
      std::lock_guard lock(mu_);
      for (uint64_t id : finished_) {
        auto it = threads_.find(id);
        if (it == threads_.end()) continue;
        done.push_back(std::move(it->second));
        threads_.erase(it);
      }
      finished_.clear();
    }
    for (auto& t : done) t.join();
  }

  // ---- one connection, on its own thread ----

  void Serve(Connection& connection) {
    fabric::Endpoint& endpoint = *connection.endpoint;
    ConnectionState state(options_.server, endpoint);
    const SteadyClock::time_point accepted_at = SteadyClock::now();
    std::string message;
    while (!state.closed) {
      const bool handshaking = !state.session.hello_done() || !state.session.authenticated();
      const SteadyClock::time_point deadline =
          handshaking ? accepted_at + options_.server.handshake_timeout
                      : SteadyClock::now() + options_.server.idle_timeout;
      Status got = endpoint.Receive(message, deadline);
      if (!got.ok()) {
        OnReceiveFailed(state, got, handshaking);
        break;
      }
      {
        std::lock_guard lock(mu_);
        if (stop_.load()) break;  // Stop came first: no new request starts
        connection.busy = true;
      }
      OnMessage(state, message);
      std::lock_guard lock(mu_);
      connection.busy = false;
      if (stop_.load()) break;
    }
    endpoint.Close();
    std::lock_guard lock(mu_);
    connections_.erase(connection.id);
    finished_.push_back(connection.id);
    open_.fetch_sub(1);
    done_cv_.notify_all();
  }

  struct ConnectionState {
    ConnectionState(const ServerOptions& options, fabric::Endpoint& e)
        : session(options), decoder(FrameDirection::kRequests, options.limits), endpoint(e) {}
    PeerSession session;
    FrameDecoder decoder;
    fabric::Endpoint& endpoint;
    std::string file_buffer;  // file ranges on their way to the window; kept across READs
    bool closed = false;
  };

  std::string Describe(const ConnectionState& state) const {
    const std::string& name = state.session.peer_name();
    return "fabric connection from " + state.endpoint.peer() +
           (name.empty() ? std::string() : " (" + Quoted(name) + ")");
  }

  void OnReceiveFailed(ConnectionState& state, const Status& got, bool handshaking) {
    if (got.code() == StatusCode::kUnavailable) {
      // The reader disconnected, or Stop closed the endpoint.
      log_->debug("{}: {}", Describe(state), got.ToString());
      return;
    }
    Add(errors_);
    if (got.code() == StatusCode::kDeadlineExceeded) {
      // The endpoint is broken at its deadline: no ERROR can follow.
      if (!handshaking) {
        // A reader that keeps an idle connection is not misbehaving (as on TCP).
        log_->debug("{}: idle for {} (idle_timeout); closed it", Describe(state),
                    Millis(options_.server.idle_timeout));
        return;
      }
      warnings_.Warn(Describe(state) + ": " +
                     (state.session.hello_done() ? "not authenticated" : "no HELLO") + " within " +
                     Millis(options_.server.handshake_timeout) +
                     " of connecting (handshake_timeout); closed it");
      return;
    }
    warnings_.Warn(Describe(state) + ": receiving a request failed: " + got.ToString() +
                   "; closed it");
  }

  // One message: the window and one frame. Sets state.closed when the
  // connection ends after it.
  void OnMessage(ConnectionState& state, const std::string& message) {
    std::string_view frame_bytes;
    Result<fabric::RemoteWindow> window = fabric::DecodeRequestMessage(message, &frame_bytes);
    if (!window.ok()) {
      FramingError(state, window.status());
      return;
    }
    Result<size_t> used = state.decoder.Feed(frame_bytes);
    if (!used.ok()) {
      FramingError(state, used.status());
      return;
    }
    if (!state.decoder.has_frame()) {
      FramingError(state, Status::InvalidArgument(
                              "a fabric message of " + std::to_string(message.size()) +
                              " bytes holds no whole frame (" + state.decoder.Finish().message() +
                              "): send one whole frame per message"));
      return;
    }
    if (*used != frame_bytes.size()) {
      FramingError(state,
                   Status::InvalidArgument("a fabric message holds " +
                                           std::to_string(frame_bytes.size() - *used) +
                                           " bytes after its frame of " + std::to_string(*used) +
                                           ": send exactly one frame per message"));
      return;
    }
    Frame frame = state.decoder.TakeFrame();
    const uint64_t id = frame.header.request_id;
    SessionStep step = state.session.OnFrame(frame);
    NoteStep(state, id, step);
    if (step.hello_agreed) state.decoder.ExpectVersion(state.session.version());
    if (!step.service.has_value()) {
      SendReply(state, id, step.reply.header, step.closing);
      return;
    }
    const uint16_t version = state.session.version();
    const auto* read = std::get_if<ReadRequest>(&*step.service);
    if (read != nullptr && read->RequestedBytes() > window->length) {
      Add(errors_);
      SendReply(state, id,
                EncodeError(id,
                            Status::OutOfRange("READ request " + std::to_string(id) + " asks for " +
                                               std::to_string(read->RequestedBytes()) +
                                               " bytes but its window holds " +
                                               std::to_string(window->length) +
                                               ": register a window at least as large as the READ"),
                            false, version),
                false);
      return;
    }
    // A READ's reply bytes from the reply budget first, as on TCP (they may
    // be memory until written).
    BudgetReservation reservation;
    if (read != nullptr) {
      Result<BudgetReservation> reserved = Reserve(read->RequestedBytes());
      if (!reserved.ok()) {
        SendReply(state, id, EncodeError(id, reserved.status(), true, version), true);
        return;
      }
      reservation = std::move(*reserved);
    }
    ServiceResult result = RunServiceCall(context_, *step.service, id, version);
    // File ranges hold no memory: give that back now.
    reservation.Resize(result.answer.has_value() ? result.answer->memory_bytes() : 0);
    if (result.granted.has_value()) {
      state.session.Grant(std::move(*result.granted));
      log_->debug("{}: authenticated as {} ({})", Describe(state), state.session.identity().subject,
                  state.session.identity().Scope());
    }
    if (result.answer.has_value()) {
      Status written = WritePayload(state, *window, result.frame);
      if (!written.ok()) {
        // A failed or late RMA leaves the endpoint broken: close it.
        Add(errors_);
        warnings_.Warn(
            Describe(state) + ": writing the payload of READ request " + std::to_string(id) +
            " into the reader's window failed: " + written.ToString() + "; closed the connection");
        state.closed = true;
        return;
      }
    }
    SendReply(state, id, result.frame.header, result.close_after);
  }

  // `bytes` of the reply budget, waiting until they fit (bytes are released
  // when other connections' replies are written). kUnavailable once Stop began.
  Result<BudgetReservation> Reserve(uint64_t bytes) {
    struct Wake {
      std::mutex mu;
      std::condition_variable cv;
      bool woken = false;  // guarded by mu
    };
    auto wake = std::make_shared<Wake>();
    bool counted = false;
    for (;;) {
      {
        std::lock_guard lock(wake->mu);
        wake->woken = false;
      }
      if (budget_.ReserveOrWait(bytes, [wake] {
            std::lock_guard lock(wake->mu);
            wake->woken = true;
            wake->cv.notify_all();
          })) {
        return BudgetReservation(&budget_, bytes);
      }
      if (!counted) {
        counted = true;
        Add(budget_waits_);
      }
      std::unique_lock lock(wake->mu);
      // Sliced, so that Stop is seen.
      wake->cv.wait_for(lock, kAcceptSlice, [&] { return wake->woken; });
      if (stop_.load()) {
        return Status::Unavailable("the cache node is stopping; read from another replica");
      }
    }
  }

  // The payload pieces, in order, at their offsets in the window.
  Status WritePayload(ConnectionState& state, const fabric::RemoteWindow& window,
                      const OutgoingFrame& frame) {
    const uint64_t total = frame.payload_length();
    if (total > window.length) {
      return Status::OutOfRange("a payload of " + std::to_string(total) +
                                " bytes does not fit the window of " +
                                std::to_string(window.length));
    }
    const SteadyClock::time_point deadline = SteadyClock::now() + options_.server.write_timeout;
    uint64_t offset = 0;
    for (const PayloadPiece& piece : frame.payload) {
      if (const auto* memory = std::get_if<std::string_view>(&piece)) {
        GRANARY_RETURN_IF_ERROR(state.endpoint.Write(window, offset, *memory, deadline));
        Add(rma_bytes_, memory->size());
        offset += memory->size();
        continue;
      }
      const FileRange& range = std::get<FileRange>(piece);
      for (uint64_t done = 0; done < range.length;) {
        const size_t n = static_cast<size_t>(std::min(range.length - done, kFileSliceBytes));
        if (state.file_buffer.size() < n) state.file_buffer.resize(n);
        GRANARY_RETURN_IF_ERROR(
            PreadFull(range.fd, state.file_buffer.data(), n, range.offset + done, "a chunk file"));
        GRANARY_RETURN_IF_ERROR(state.endpoint.Write(
            window, offset, std::string_view(state.file_buffer.data(), n), deadline));
        Add(rma_bytes_, n);
        done += n;
        offset += n;
      }
    }
    return Status::Ok();
  }

  void SendReply(ConnectionState& state, uint64_t id, std::string_view frame, bool closing) {
    Status sent = state.endpoint.Send(frame, SteadyClock::now() + options_.server.write_timeout);
    if (!sent.ok()) {
      Add(errors_);
      log_->debug("{}: sending the reply to request {} failed: {}", Describe(state), id,
                  sent.ToString());
      state.closed = true;
      return;
    }
    Add(requests_);
    if (closing) state.closed = true;
  }

  // The message cannot be trusted: ERROR (request id 0, closing), then close.
  void FramingError(ConnectionState& state, const Status& status) {
    Add(errors_);
    warnings_.Warn(Describe(state) + ": " + status.ToString() + "; answered ERROR and closed it");
    SendReply(state, 0, EncodeError(0, status, true, state.session.error_version()), true);
  }

  void NoteStep(ConnectionState& state, uint64_t id, const SessionStep& step) {
    if (step.policy_error || step.message_error || step.auth_refused) Add(errors_);
    if (step.auth_granted) Add(auth_granted_);
    if (step.granted) {
      log_->debug("{}: authenticated as {} ({})", Describe(state), state.session.identity().subject,
                  state.session.identity().Scope());
    }
    if (step.refusal.ok()) return;
    if (step.warn) {
      warnings_.Warn(Describe(state) + ": request " + std::to_string(id) + ": " +
                     step.refusal.ToString() + "; answered ERROR and closed it");
    } else {
      log_->debug("{}: request {}: {}", Describe(state), id, step.refusal.ToString());
    }
  }

  // The node's own STAT: what this front end adds.
  void AppendEntries(StatReply* reply) const {
    const std::pair<const char*, uint64_t> entries[] = {
        {"fabric_connections_open", Load(open_)},
        {"fabric_requests_total", Load(requests_)},
        {"fabric_rma_bytes_total", Load(rma_bytes_)},
        {"fabric_errors_total", Load(errors_)},
    };
    for (const auto& [key, value] : entries) {
      if (reply->entries.size() >= pf::kMaxStatEntries) break;
      bool taken = std::any_of(reply->entries.begin(), reply->entries.end(),
                               [key = key](const StatEntry& e) { return e.key == key; });
      if (!taken) reply->entries.push_back(StatEntry{key, value});
    }
  }

  const FabricServerOptions options_;
  const std::shared_ptr<ReadService> service_;
  const std::shared_ptr<spdlog::logger> log_;
  ClientWarnings warnings_{*log_};
  ReplyBudget budget_;  // READ replies of every fabric connection (reply_buffer_bytes)
  ServiceCallContext context_;
  std::unique_ptr<fabric::Listener> listener_;
  std::thread accept_thread_;
  std::atomic<bool> stop_{false};
  bool stopped_ = false;  // owner thread

  std::mutex mu_;
  std::condition_variable done_cv_;                              // a connection ended
  std::map<uint64_t, std::shared_ptr<Connection>> connections_;  // guarded by mu_: open
  std::map<uint64_t, std::thread> threads_;                      // guarded by mu_
  std::vector<uint64_t> finished_;                               // guarded by mu_: threads to join
  uint64_t next_id_ = 0;                                         // guarded by mu_

  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> open_{0};
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> rma_bytes_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> auth_granted_{0};
  std::atomic<uint64_t> budget_waits_{0};
};

Result<std::unique_ptr<FabricServer>> FabricServer::Start(std::shared_ptr<ReadService> service,
                                                          const FabricServerOptions& options) {
  if (service == nullptr) {
    return Status::InvalidArgument("cache node fabric server: no read service given");
  }
  GRANARY_RETURN_IF_ERROR(options.server.Validate());
  if (options.server.tls != nullptr) {
    return Status::InvalidArgument(
        "cache node fabric server: TLS was asked for, which the fabric does not carry; serve TLS "
        "on `listen` and leave the fabric off");
  }
  Result<NetAddress> listen = ParseNetAddress(options.listen, "fabric listen address");
  if (!listen.ok()) return listen.status().WithContext("cache node fabric server options");
  auto impl = std::make_unique<Impl>(std::move(service), options);
  GRANARY_RETURN_IF_ERROR(impl->Start(*listen));
  return std::unique_ptr<FabricServer>(new FabricServer(std::move(impl)));
}

FabricServer::FabricServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FabricServer::~FabricServer() { Stop(); }
uint16_t FabricServer::port() const { return impl_->port(); }
void FabricServer::Stop() { impl_->Stop(); }
FabricCounters FabricServer::Counters() const { return impl_->Counters(); }

}  // namespace granary

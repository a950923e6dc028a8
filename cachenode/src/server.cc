#include "granary/cachenode/server.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>

#include "granary/core/file.h"
#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/net_address.h"
#include "granary/core/protocol_format.h"
#include "granary/core/tls.h"

namespace granary {
namespace {

namespace asio = boost::asio;
namespace pf = protocol_format;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
using Socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
using ErrorCode = boost::system::error_code;

// iovecs per sendmsg(2): a header and memory pieces.
constexpr size_t kMaxIov = 64;
// sendfile(2) moves at most this many bytes per call (Linux: 0x7ffff000).
constexpr uint64_t kMaxSendfileBytes = 0x7ffff000;
// What one TLS write takes of a piece (OpenSSL cuts it into 16 KiB records).
constexpr uint64_t kTlsWriteBytes = 256u << 10;
// After a closing ERROR, the connection reads and discards what the client
// still sends, for at most this long and this many bytes, before it closes: a
// close with unread bytes makes the kernel send a reset, which can destroy the
// ERROR before the client reads it.
constexpr auto kLingerTime = std::chrono::milliseconds(1000);
constexpr uint64_t kMaxLingerBytes = 1u << 20;
// How often each loop checks its connections' timeouts, at most.
constexpr auto kMaxSweepPeriod = std::chrono::milliseconds(100);
// Warnings about bad clients: at most one per this interval per server (the
// rest at debug), so a flood of hostile connections cannot flood the log.
constexpr auto kWarnInterval = std::chrono::seconds(1);
// Bounds the write loop of one turn (with write_quantum_bytes).
constexpr int kMaxWriteRounds = 4096;
constexpr int kListenBacklog = 1024;

void Add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.fetch_add(n, std::memory_order_relaxed);
}
uint64_t Load(const std::atomic<uint64_t>& counter) {
  return counter.load(std::memory_order_relaxed);
}

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

// What one piece of an outgoing frame is: piece 0 is the header (fixed header
// and body), piece k > 0 is payload piece k - 1.
struct PieceRef {
  std::string_view memory;
  const FileRange* file = nullptr;
  uint64_t size() const { return file != nullptr ? file->length : memory.size(); }
};

PieceRef PieceAt(const OutgoingFrame& frame, size_t piece) {
  if (piece == 0) return PieceRef{frame.header, nullptr};
  const PayloadPiece& p = frame.payload[piece - 1];
  if (const auto* f = std::get_if<FileRange>(&p)) return PieceRef{{}, f};
  return PieceRef{std::get<std::string_view>(p), nullptr};
}

OutgoingFrame ErrorFrame(uint64_t request_id, const Status& status, bool closing,
                         uint16_t version) {
  return OutgoingFrame{EncodeError(request_id, status, closing, version), {}};
}

// The bytes a READ asks for: an upper bound of the memory its reply holds.
uint64_t RequestedBytes(const ReadRequest& request) {
  uint64_t total = 0;
  for (const ReadItem& item : request.items) total += item.length;
  return total;
}

// The server-wide reply budget (server.h, "Bounded reply memory"). Any thread.
class ReplyBudget {
 public:
  explicit ReplyBudget(uint64_t limit) : limit_(limit) {}

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_gauge_.load(std::memory_order_relaxed); }
  // Some READ waits for bytes (it may be retrying just now: a moment's false
  // is possible, the next look sees it again).
  bool has_waiters() const { return waiter_count_.load(std::memory_order_relaxed) > 0; }

  // Reserves `bytes` and returns true if they fit (or nothing is reserved);
  // otherwise remembers `wake`, calls it (once, on the releasing thread) the
  // next time bytes are released, and returns false.
  bool ReserveOrWait(uint64_t bytes, std::function<void()> wake) {
    std::lock_guard lock(mu_);
    if (used_ == 0 || (bytes <= limit_ && used_ <= limit_ - bytes)) {
      used_ += bytes;
      used_gauge_.store(used_, std::memory_order_relaxed);
      return true;
    }
    waiters_.push_back(std::move(wake));
    waiter_count_.store(waiters_.size(), std::memory_order_relaxed);
    return false;
  }

  // Unconditionally: a reply's header, found larger than reserved only once
  // it is encoded (a few bytes per item).
  void Grow(uint64_t bytes) {
    std::lock_guard lock(mu_);
    used_ += bytes;
    used_gauge_.store(used_, std::memory_order_relaxed);
  }

  // Every waiter is woken: each tries again, and those that fit go ahead
  // (first fit; the others wait for the next release).
  void Release(uint64_t bytes) {
    std::vector<std::function<void()>> wake;
    {
      std::lock_guard lock(mu_);
      used_ -= std::min(used_, bytes);
      used_gauge_.store(used_, std::memory_order_relaxed);
      wake.swap(waiters_);
      waiter_count_.store(0, std::memory_order_relaxed);
    }
    for (auto& w : wake) w();
  }

 private:
  const uint64_t limit_;
  std::mutex mu_;
  uint64_t used_ = 0;                           // guarded by mu_
  std::vector<std::function<void()>> waiters_;  // guarded by mu_
  std::atomic<uint64_t> used_gauge_{0};         // used_, for readers without mu_
  std::atomic<size_t> waiter_count_{0};         // waiters_.size(), likewise
};

// Bytes reserved from a ReplyBudget, released when destroyed.
class BudgetReservation {
 public:
  BudgetReservation() = default;
  BudgetReservation(ReplyBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  BudgetReservation(BudgetReservation&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  BudgetReservation& operator=(BudgetReservation&& other) noexcept {
    if (this != &other) {
      Reset();
      budget_ = std::exchange(other.budget_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  BudgetReservation(const BudgetReservation&) = delete;
  BudgetReservation& operator=(const BudgetReservation&) = delete;
  ~BudgetReservation() { Reset(); }

  bool held() const { return budget_ != nullptr; }
  uint64_t bytes() const { return bytes_; }

  // Shrinks to, or grows to, `bytes`.
  void Resize(uint64_t bytes) {
    if (budget_ == nullptr) return;
    if (bytes < bytes_) {
      budget_->Release(bytes_ - bytes);
    } else if (bytes > bytes_) {
      budget_->Grow(bytes - bytes_);
    }
    bytes_ = bytes;
  }

  void Reset() {
    if (budget_ != nullptr) budget_->Release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }

 private:
  ReplyBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace

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
  auto hello = EncodeResponse(1, HelloReply{pf::kMaxVersion, node_name, limits});
  if (!hello.ok()) return hello.status().WithContext("cache node server options: node_name");
  return Status::Ok();
}

// ---------------------------------------------------------------------------

namespace {

class Connection;

// What the registry knows of a connection; written by its loop thread, read
// by Connections() on any thread.
struct ConnectionGauge {
  uint64_t id = 0;
  std::string peer_address;
  std::string peer_ip;  // the key of the per-address counts
  // Counted among its address's unauthenticated connections (until granted).
  std::atomic<bool> unauthenticated{false};
  std::mutex mu;
  std::string peer_name;  // guarded by mu
  std::atomic<uint64_t> buffered{0};
  std::atomic<uint64_t> reserved{0};
  std::atomic<uint32_t> in_flight{0};
  std::atomic<bool> reading{false};
  std::atomic<bool> write_blocked{false};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> sent{0};
};

// One event loop and the connections it owns.
struct Worker {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{io.get_executor()};
  asio::steady_timer sweep{io};
  // Loop thread only.
  std::unordered_map<uint64_t, std::shared_ptr<Connection>> connections;
  std::thread thread;
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;  // guarded by done_mu: run() returned
};

struct AtomicCounters {
  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_rejected{0};
  std::atomic<uint64_t> connections_closed{0};
  std::atomic<uint64_t> connections_open{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> hello{0};
  std::atomic<uint64_t> ping{0};
  std::atomic<uint64_t> stat{0};
  std::atomic<uint64_t> read{0};
  std::atomic<uint64_t> read_items{0};
  std::atomic<uint64_t> read_item_errors{0};
  std::atomic<uint64_t> sent_bytes{0};
  std::atomic<uint64_t> payload_bytes{0};
  std::atomic<uint64_t> sendfile_bytes{0};
  std::atomic<uint64_t> received_bytes{0};
  std::atomic<uint64_t> framing_errors{0};
  std::atomic<uint64_t> truncated_frames{0};
  std::atomic<uint64_t> message_errors{0};
  std::atomic<uint64_t> policy_errors{0};
  std::atomic<uint64_t> service_errors{0};
  std::atomic<uint64_t> internal_errors{0};
  std::atomic<uint64_t> timeouts{0};
  std::atomic<uint64_t> send_errors{0};
  std::atomic<uint64_t> buffered_bytes{0};
  std::atomic<uint64_t> max_connection_buffered{0};
  std::atomic<uint64_t> reply_budget_waits{0};
  std::atomic<uint64_t> connection_reply_waits{0};
  std::atomic<uint64_t> reply_stall_closes{0};
  std::atomic<uint64_t> auth_granted{0};
  std::atomic<uint64_t> auth_refused{0};
  std::array<std::atomic<uint64_t>, kServerLatencyBucketsSeconds.size() + 1> latency_buckets{};
  std::atomic<uint64_t> latency_count{0};
  std::atomic<uint64_t> latency_sum_ns{0};
};

// A reply computed on the service pool, ready for the loop.
// What a connection asks of the service pool: a READ or STAT for the
// ReadService, or a Kubernetes token for the TokenVerifier (both may block).
using ServiceRequest = std::variant<ReadRequest, StatRequest, AuthRequest>;

struct ServiceResult {
  OutgoingFrame frame;
  std::optional<ReadAnswer> answer;  // owns what the frame's payload points into
  uint64_t items = 0;
  uint64_t item_errors = 0;
  std::optional<PeerIdentity> granted;  // a token accepted
  bool close_after = false;             // a token refused: the frame is a closing ERROR
};

// Everything the server shares between its loops: the listener, the loops,
// the service pool, the counters and the connection registry. Server::Impl is
// this class (kept out of the header's private scope so connections can use it).
class ServerCore {
 public:
  ServerCore(std::shared_ptr<ReadService> service, ServerOptions options)
      : options_(std::move(options)),
        budget_(options_.reply_buffer_bytes),
        service_(std::move(service)),
        log_(GetLogger("cachenode")),
        sweep_period_(std::min<std::chrono::milliseconds>(
            {kMaxSweepPeriod, std::max<std::chrono::milliseconds>(
                                  std::chrono::milliseconds(1),
                                  std::min({options_.handshake_timeout, options_.frame_timeout,
                                            options_.idle_timeout, options_.write_timeout,
                                            options_.reply_stall_timeout}) /
                                      4)})) {}
  ~ServerCore() { Stop(); }
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  Status Start(const NetAddress& listen);
  void Stop();
  uint16_t port() const { return port_; }
  ServerCounters Counters() const;
  std::vector<ConnectionInfo> Connections() const;

  // Used by connections.
  const ServerOptions& options() const { return options_; }
  AtomicCounters& counters() { return counters_; }
  ReplyBudget& budget() { return budget_; }
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  asio::thread_pool& pool() { return *pool_; }
  // Runs a READ or STAT on the calling pool thread and encodes its reply.
  // A Kubernetes token through options().auth->tokens: AUTH_REPLY granted, or
  // a closing ERROR.
  ServiceResult CheckToken(const AuthRequest& auth, uint64_t request_id, uint16_t version);
  ServiceResult RunService(const ServiceRequest& request, uint64_t request_id, uint16_t version);
  void OnConnectionClosed(uint64_t id);
  // A connection of `gauge` was granted an identity: it no longer counts
  // among its address's unauthenticated connections.
  void OnAuthenticated(ConnectionGauge& gauge);
  void NoteBuffered(uint64_t old_bytes, uint64_t new_bytes);
  void RecordLatency(SteadyClock::duration latency);
  // A warning about a client, rate-limited (see kWarnInterval).
  void WarnAboutClient(const std::string& message);
  spdlog::logger& log() { return *log_; }

 private:
  void Accept();
  void OnAccepted(Worker& target, Socket socket);
  // Answers ERROR kResourceExhausted (closing) saying `why`, and closes.
  void Reject(Socket& socket, const std::string& why);
  void ArmSweep(Worker& worker);
  // Runs `fn` on the worker's loop and waits for it.
  void RunOn(Worker& worker, std::function<void()> fn);
  void AppendServerEntries(StatReply* reply) const;

  const ServerOptions options_;
  // Before the loops and the pool (declared later, destroyed earlier): the
  // replies they hold release into it.
  ReplyBudget budget_;
  const std::shared_ptr<ReadService> service_;
  const std::shared_ptr<spdlog::logger> log_;
  const std::chrono::milliseconds sweep_period_;

  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<tcp::acceptor> acceptor_;                 // used on workers_[0]'s loop
  std::unique_ptr<asio::steady_timer> accept_retry_timer_;  // workers_[0]'s loop
  size_t next_worker_ = 0;                                  // workers_[0]'s loop
  uint64_t next_connection_id_ = 0;                         // workers_[0]'s loop
  std::unique_ptr<asio::thread_pool> pool_;
  uint16_t port_ = 0;
  std::atomic<bool> draining_{false};
  bool stopped_ = false;  // owner thread

  AtomicCounters counters_;

  mutable std::mutex registry_mu_;
  std::condition_variable registry_cv_;  // signalled when a connection closes
  std::map<uint64_t, std::shared_ptr<ConnectionGauge>> registry_;  // guarded by registry_mu_
  struct AddressCount {
    uint32_t open = 0;
    uint32_t unauthenticated = 0;
  };
  std::mutex address_mu_;
  std::unordered_map<std::string, AddressCount> per_address_;  // guarded by address_mu_

  std::mutex warn_mu_;
  SteadyClock::time_point last_warn_{};  // guarded by warn_mu_
  uint64_t suppressed_warnings_ = 0;     // guarded by warn_mu_
};

// One client connection, owned by one loop for its whole life: every method
// runs on that loop's thread, except the pool task in StartService, which
// touches only its own copy of the request and `gone_`.
//
// Progress is made in one place, Pump(), which every event handler calls
// (bytes read, socket writable, service answer, a timeout). The steps it runs
// (start the service, write, read) never call each other, so a burst of
// pipelined requests cannot recurse; a step that enables another sets
// pump_again_ through Pump() and the loop in Pump runs it.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore& server, Worker& worker, Socket socket, uint64_t id,
             std::shared_ptr<ConnectionGauge> gauge)
      : server_(server),
        worker_(worker),
        socket_(std::move(socket)),
        id_(id),
        gauge_(std::move(gauge)),
        decoder_(FrameDirection::kRequests, server.options().limits),
        receive_capacity_(static_cast<size_t>(std::min<uint64_t>(
            server.options().receive_chunk_bytes, server.options().limits.max_message_bytes))),
        receive_(std::make_unique<char[]>(receive_capacity_)) {}

  void Start() {
    const auto now = SteadyClock::now();
    accepted_at_ = now;
    last_activity_ = now;
    last_write_progress_ = now;
    ErrorCode ec;
    socket_.set_option(tcp::no_delay(true), ec);
    socket_.native_non_blocking(true, ec);
    if (ec) {
      server_.WarnAboutClient("connection from " + gauge_->peer_address +
                              ": cannot make its socket non-blocking: " + ec.message());
      Close();
      return;
    }
    if (server_.options().tls != nullptr) {
      Result<std::unique_ptr<TlsStream>> tls =
          TlsStream::Accept(server_.options().tls, socket_.native_handle());
      if (!tls.ok()) {
        server_.WarnAboutClient("connection from " + gauge_->peer_address + ": " +
                                tls.status().message());
        Close();
        return;
      }
      tls_ = std::move(*tls);
      Handshake();
      return;
    }
    Pump();
  }

  // Timeouts; called by the loop's sweep timer.
  void Sweep(SteadyClock::time_point now) {
    const ServerOptions& o = server_.options();
    if (phase_ == Phase::kClosed) return;
    if (phase_ == Phase::kLingering) {
      if (now >= linger_deadline_) Close();
      return;
    }
    if (write_waiting_ && now - last_write_progress_ >= o.reply_stall_timeout &&
        server_.budget().has_waiters() && ReservedBytes() > 0) {
      // It holds reply bytes others wait for, and its client reads nothing:
      // sooner than write_timeout, or a few such clients would hold the
      // whole budget (and every other reader) for write_timeout.
      Add(server_.counters().timeouts);
      Add(server_.counters().reply_stall_closes);
      server_.WarnAboutClient("connection " + Describe() + ": held " +
                              std::to_string(ReservedBytes()) +
                              " bytes of the reply budget that other requests wait for, and the "
                              "client took no reply bytes for " +
                              Millis(o.reply_stall_timeout) + " (reply_stall_timeout); closed it");
      Close();
      return;
    }
    if (write_waiting_ && now - last_write_progress_ >= o.write_timeout) {
      Add(server_.counters().timeouts);
      server_.WarnAboutClient("connection " + Describe() + ": the client took no reply bytes for " +
                              Millis(o.write_timeout) + " (write_timeout); closed it");
      Close();
      return;
    }
    if (input_stopped_) return;
    if ((!hello_done_ || !authenticated_) && queue_.empty() &&
        now - accepted_at_ >= o.handshake_timeout) {
      Add(server_.counters().timeouts);
      StopInput(Status::DeadlineExceeded(
                    std::string(hello_done_ ? "not authenticated" : "no HELLO") + " within " +
                    Millis(o.handshake_timeout) +
                    " of connecting (handshake_timeout); open every connection with HELLO" +
                    (hello_done_ ? " and AUTH" : "")),
                hello_done_ ? "not authenticated in time" : "no HELLO in time");
      return;
    }
    if (frame_started_.has_value()) {
      if (!reading_) {
        // Back-pressure stopped reading: the client is not to blame for the
        // frame not progressing. Its clock restarts when reading does.
        frame_started_ = now;
      } else if (now - *frame_started_ >= o.frame_timeout) {
        Add(server_.counters().timeouts);
        StopInput(Status::DeadlineExceeded(
                      "a frame stayed incomplete for " + Millis(o.frame_timeout) + " (got " +
                      std::to_string(bytes_since_frame_) +
                      " bytes of it; frame_timeout); send whole frames without pausing"),
                  "frame incomplete in time");
        return;
      }
    }
    if (hello_done_ && queue_.empty() && !frame_started_.has_value() &&
        now - last_activity_ >= o.idle_timeout) {
      Add(server_.counters().timeouts);
      StopInput(Status::DeadlineExceeded("idle for " + Millis(o.idle_timeout) +
                                         " (idle_timeout); reconnect to send more requests"),
                "");
    }
  }

  // Stop(): read no more requests; close once the ones already decoded are
  // answered.
  void BeginDrain() {
    if (phase_ == Phase::kClosed) return;
    if (phase_ == Phase::kLingering || queue_.empty()) {
      Close();
      return;
    }
    input_stopped_ = true;
    receive_begin_ = receive_end_ = 0;
    close_when_answered_ = true;
    UpdateGauge();
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    gone_.store(true, std::memory_order_release);
    ErrorCode ec;
    if (tls_ != nullptr && tls_ready_) tls_->Shutdown();
    socket_.close(ec);  // cancels the outstanding read and wait
    queue_.clear();     // releases the answers (open chunk readers, buffers)
    decoder_ = FrameDecoder(FrameDirection::kRequests, server_.options().limits);
    receive_begin_ = receive_end_ = 0;
    UpdateGauge();
    auto self = shared_from_this();  // keep alive while erasing ourselves
    worker_.connections.erase(id_);
    server_.OnConnectionClosed(id_);
  }

 private:
  enum class Phase {
    kOpen,       // reading (unless input_stopped_) and answering
    kLingering,  // last reply sent, write side shut: discarding input until EOF
    kClosed,
  };

  // A request decoded and not yet fully answered, in arrival order.
  struct Work {
    // First, so that it is released after the memory below is freed.
    BudgetReservation reservation;       // of a READ, from its start until its reply is gone
    bool waited_for_budget = false;      // counted in reply_budget_waits
    bool waited_for_connection = false;  // counted in connection_reply_waits
    uint64_t seq = 0;
    uint64_t request_id = 0;
    uint16_t type = 0;  // request type, for the counters; 0: not a request (a closing ERROR)
    SteadyClock::time_point decoded_at;
    std::optional<ServiceRequest> service_request;  // until started
    uint64_t request_bytes = 0;                     // memory the request holds until started
    bool running = false;                           // with the service pool
    bool ready = false;                             // frame holds the reply
    OutgoingFrame frame;
    std::optional<ReadAnswer> answer;  // what the frame's payload points into
    uint64_t reply_memory = 0;         // header + memory payload of the reply
    bool close_after = false;          // the reply is a closing ERROR
    uint64_t items = 0;
    uint64_t item_errors = 0;
  };

  // Bounds one Pump; a connection with more to do continues on a later turn.
  static constexpr int kMaxPumpRounds = 256;

  std::string Describe() const {
    return std::to_string(id_) + " from " + gauge_->peer_address +
           (peer_name_.empty() ? std::string() : " (" + Quoted(peer_name_) + ")");
  }

  void Pump() {
    if (phase_ == Phase::kClosed) return;
    if (pumping_) {
      pump_again_ = true;
      return;
    }
    pumping_ = true;
    int round = 0;
    do {
      pump_again_ = false;
      StartService();
      Write();
      ReadInput();
    } while (pump_again_ && phase_ != Phase::kClosed && ++round < kMaxPumpRounds);
    pumping_ = false;
    if (pump_again_ && phase_ != Phase::kClosed) PostPump();
    UpdateGauge();
  }

  void PostPump() {
    auto self = shared_from_this();
    asio::post(worker_.io, [self] { self->Pump(); });
  }

  // ---- input ----

  // Back-pressure: at max_in_flight, or holding its share of the reply budget
  // (its client is not reading its replies), the connection neither decodes
  // nor reads its socket.
  bool AcceptsRequests() const {
    return phase_ == Phase::kOpen && !input_stopped_ &&
           queue_.size() < server_.options().max_in_flight &&
           ReservedBytes() < server_.options().ConnectionReplyBufferBytes();
  }

  // Bytes this connection's requests hold of the reply budget.
  uint64_t ReservedBytes() const {
    uint64_t total = 0;
    for (const auto& work : queue_) total += work->reservation.bytes();
    return total;
  }

  // Decodes what was received while requests are accepted, then reads more if
  // everything was consumed; while lingering, reads to discard.
  void ReadInput() {
    if (phase_ == Phase::kClosed || reading_) return;
    if (phase_ == Phase::kOpen) {
      if (input_stopped_) return;
      ProcessInput();
      if (!AcceptsRequests() || receive_begin_ < receive_end_) return;
    }
    reading_ = true;
    gauge_->reading.store(phase_ == Phase::kOpen, std::memory_order_relaxed);
    auto self = shared_from_this();
    if (tls_ != nullptr && phase_ == Phase::kOpen) {
      ReadTls();
      return;
    }
    socket_.async_read_some(asio::buffer(receive_.get(), receive_capacity_),
                            [self](const ErrorCode& ec, size_t n) { self->OnRead(ec, n); });
  }

  // Decrypted bytes may wait inside OpenSSL without the socket being
  // readable: read first, wait for the socket only when OpenSSL asks to.
  void ReadTls() {
    auto self = shared_from_this();
    TlsWant want = TlsWant::kNothing;
    Result<size_t> n = tls_->Read(receive_.get(), receive_capacity_, &want);
    if (!n.ok()) {
      server_.log().debug("connection {}: {}", Describe(), n.status().ToString());
      asio::post(worker_.io, [self] { self->OnRead(asio::error::connection_reset, 0); });
      return;
    }
    if (*n > 0 || want == TlsWant::kNothing) {
      // Posted, not called: a client with much buffered input must not
      // recurse through Pump.
      const size_t got = *n;
      asio::post(worker_.io, [self, got] {
        self->OnRead(got > 0 ? ErrorCode() : ErrorCode(asio::error::eof), got);
      });
      return;
    }
    socket_.async_wait(want == TlsWant::kRead ? Socket::wait_read : Socket::wait_write,
                       [self](const ErrorCode& ec) {
                         if (ec) {
                           self->OnRead(ec, 0);
                           return;
                         }
                         if (self->phase_ != Phase::kOpen) {
                           self->OnRead(asio::error::operation_aborted, 0);
                           return;
                         }
                         self->ReadTls();
                       });
  }

  // The TLS handshake, before anything else (handshake_timeout bounds it).
  void Handshake() {
    if (phase_ != Phase::kOpen) return;
    Result<TlsWant> want = tls_->Handshake();
    if (!want.ok()) {
      Add(server_.counters().policy_errors);
      server_.WarnAboutClient("connection " + Describe() + ": " + want.status().message() +
                              "; closed it");
      Close();
      return;
    }
    if (*want == TlsWant::kNothing) {
      tls_ready_ = true;
      Pump();
      return;
    }
    auto self = shared_from_this();
    socket_.async_wait(*want == TlsWant::kRead ? Socket::wait_read : Socket::wait_write,
                       [self](const ErrorCode& ec) {
                         if (ec) {
                           if (ec != asio::error::operation_aborted) self->Close();
                           return;
                         }
                         self->Handshake();
                       });
  }

  void OnRead(const ErrorCode& ec, size_t n) {
    reading_ = false;
    gauge_->reading.store(false, std::memory_order_relaxed);
    if (phase_ == Phase::kClosed) return;
    if (phase_ == Phase::kLingering) {
      linger_bytes_ += n;
      if (ec || n == 0 || linger_bytes_ > kMaxLingerBytes) {
        Close();
      } else {
        Pump();
      }
      return;
    }
    if (ec == asio::error::eof || (!ec && n == 0)) {
      OnEndOfInput();
      return;
    }
    if (ec) {
      if (ec != asio::error::operation_aborted) Close();  // reset by the peer, or worse
      return;
    }
    Add(server_.counters().received_bytes, n);
    last_activity_ = SteadyClock::now();
    if (!input_stopped_) {
      receive_begin_ = 0;
      receive_end_ = n;
    }  // else a closing ERROR is on its way, or the server drains: discard
    Pump();
  }

  void OnEndOfInput() {
    // The client shut its side: answer what it asked (it may still read), then close.
    Status cut = decoder_.Finish();
    if (!cut.ok() && !input_stopped_) {
      Add(server_.counters().truncated_frames);
      server_.log().debug("connection {}: {}", Describe(), cut.message());
    }
    StopReading();
    close_when_answered_ = true;
    if (queue_.empty()) {
      Close();
      return;
    }
    Pump();
  }

  // Feeds received bytes to the decoder while the connection accepts requests.
  void ProcessInput() {
    // Each round consumes bytes or takes a frame: the receive buffer bounds it.
    while (receive_begin_ < receive_end_ && AcceptsRequests()) {
      std::string_view data(receive_.get() + receive_begin_, receive_end_ - receive_begin_);
      Result<size_t> used = decoder_.Feed(data);
      if (!used.ok()) {
        OnFramingError(used.status());
        return;
      }
      receive_begin_ += *used;
      if (decoder_.has_frame()) {
        frame_started_.reset();
        bytes_since_frame_ = 0;
        OnFrame(decoder_.TakeFrame());
        continue;
      }
      if (*used > 0) {
        bytes_since_frame_ += *used;
        if (!frame_started_.has_value()) frame_started_ = SteadyClock::now();
      }
    }
    if (receive_begin_ == receive_end_) receive_begin_ = receive_end_ = 0;
  }

  void OnFramingError(const Status& status) {
    Add(server_.counters().framing_errors);
    server_.WarnAboutClient("connection " + Describe() + ": " + status.ToString() +
                            "; answered ERROR and closed it");
    // The stream cannot be trusted: drop what was not started (a half-sent
    // reply must be finished, or the ERROR would land inside it).
    std::deque<std::unique_ptr<Work>> keep;
    if (!queue_.empty() && (send_piece_ != 0 || send_offset_ != 0)) {
      keep.push_back(std::move(queue_.front()));
    }
    queue_.swap(keep);
    StopInputNow(status);
  }

  // Stops reading; queues ERROR (request id 0, closing) after the replies in flight.
  void StopInput(const Status& status, std::string_view why) {
    if (!why.empty()) {
      server_.WarnAboutClient("connection " + Describe() + ": " + std::string(why) +
                              "; answered ERROR and closed it");
    }
    StopInputNow(status);
  }

  // Reads no more requests and drops what was received and not decoded.
  void StopReading() {
    input_stopped_ = true;
    receive_begin_ = receive_end_ = 0;
    frame_started_.reset();
  }

  void StopInputNow(const Status& status) {
    StopReading();
    QueueReady(0, 0, ErrorFrame(0, status, true, hello_done_ ? version_ : pf::kHandshakeVersion),
               /*close_after=*/true);
  }

  void OnFrame(Frame frame) {
    const uint64_t id = frame.header.request_id;
    const uint16_t type = frame.header.type;
    const ProtocolLimits& limits = server_.options().limits;
    if (!hello_done_) {
      if (type != pf::kTypeHello) {
        Add(server_.counters().policy_errors);
        PolicyError(id, type,
                    Status::FailedPrecondition(std::string(MessageTypeName(type)) +
                                               " before HELLO: open every connection with HELLO"));
        return;
      }
      Result<RequestMessage> message = DecodeRequest(frame, limits);
      if (!message.ok()) {
        Add(server_.counters().message_errors);
        PolicyError(id, type, message.status());
        return;
      }
      const auto& hello = std::get<HelloRequest>(*message);
      Result<uint16_t> version = NegotiateVersion(hello);
      if (!version.ok()) {
        Add(server_.counters().policy_errors);
        PolicyError(id, type, version.status());
        return;
      }
      const bool auth_required = server_.options().auth != nullptr;
      if (auth_required && *version < pf::kAuthVersion) {
        Add(server_.counters().policy_errors);
        Add(server_.counters().auth_refused);
        PolicyError(id, type,
                    Status::VersionMismatch(
                        "this cache node requires authentication, which needs protocol version " +
                        std::to_string(pf::kAuthVersion) + "; the client speaks " +
                        std::to_string(hello.min_version) + ".." +
                        std::to_string(hello.max_version) + ": upgrade it"));
        return;
      }
      hello_done_ = true;
      authenticated_ = !auth_required;
      version_ = *version;
      decoder_.ExpectVersion(version_);
      peer_name_ = hello.peer_name;
      {
        std::lock_guard lock(gauge_->mu);
        gauge_->peer_name = hello.peer_name;
      }
      // ServerOptions::Validate encoded this reply at start: it does not fail.
      Result<OutgoingFrame> reply = EncodeResponse(
          id, HelloReply{version_, server_.options().node_name, limits, auth_required}, {},
          EncodeOptions{version_, limits});
      QueueReady(id, type,
                 reply.ok() ? std::move(*reply)
                            : ErrorFrame(id, reply.status(), true, pf::kHandshakeVersion),
                 !reply.ok());
      return;
    }
    Result<RequestMessage> message = DecodeRequest(frame, limits);
    if (!message.ok()) {
      // The frame was read whole: the stream is in step. Answer and go on.
      Add(server_.counters().message_errors);
      server_.log().debug("connection {}: request {}: {}", Describe(), id,
                          message.status().ToString());
      QueueReady(id, type, ErrorFrame(id, message.status(), false, version_), false);
      return;
    }
    if (std::holds_alternative<HelloRequest>(*message)) {
      Add(server_.counters().policy_errors);
      PolicyError(id, type,
                  Status::FailedPrecondition("a second HELLO on one connection (version " +
                                             std::to_string(version_) +
                                             " was agreed): send HELLO only first"));
      return;
    }
    if (auto* auth = std::get_if<AuthRequest>(&*message)) {
      OnAuth(id, type, std::move(*auth));
      return;
    }
    if (const auto* proof = std::get_if<AuthProofRequest>(&*message)) {
      OnAuthProof(id, type, *proof);
      return;
    }
    if (std::holds_alternative<PingRequest>(*message)) {
      Result<OutgoingFrame> pong =
          EncodeResponse(id, PongReply{}, {}, EncodeOptions{version_, limits});
      QueueReady(id, type,
                 pong.ok() ? std::move(*pong) : ErrorFrame(id, pong.status(), false, version_),
                 false);
      return;
    }
    if (!authenticated_) {
      Add(server_.counters().policy_errors);
      Add(server_.counters().auth_refused);
      PolicyError(id, type,
                  Status::PermissionDenied(std::string(MessageTypeName(type)) +
                                           " before authentication: this cache node requires "
                                           "AUTH first (docs/protocol.md, \"Authentication\")"));
      return;
    }
    if (Status allowed = Authorize(*message); !allowed.ok()) {
      Add(server_.counters().policy_errors);
      QueueReady(id, type, ErrorFrame(id, allowed, false, version_), false);
      return;
    }
    auto work = NewWork(id, type);
    work->request_bytes = frame.body.size();
    if (auto* read = std::get_if<ReadRequest>(&*message)) {
      work->service_request.emplace(std::move(*read));
    } else {
      work->service_request.emplace(std::move(std::get<StatRequest>(*message)));
    }
    queue_.push_back(std::move(work));
    Pump();
  }

  // ---- authentication (protocol version 2) ----

  // AUTH: a cluster key gets its challenge here; a token goes to the service
  // pool (the verifier may ask the API server).
  void OnAuth(uint64_t id, uint16_t type, AuthRequest auth) {
    const ServerAuth* config = server_.options().auth.get();
    if (config == nullptr || authenticated_ || auth_state_ != AuthState::kNone) {
      Add(server_.counters().policy_errors);
      PolicyError(id, type,
                  Status::FailedPrecondition(
                      config == nullptr
                          ? "AUTH to a cache node that requires no authentication (its "
                            "HELLO_REPLY did not ask for it): send AUTH only when asked"
                          : "a second AUTH on one connection: authenticate once, after HELLO"));
      return;
    }
    if (auth.method == AuthMethod::kKubernetesToken) {
      if (config->tokens == nullptr) {
        AuthRefused(id, type,
                    Status::PermissionDenied(
                        "this cache node accepts no Kubernetes tokens (auth.kubernetes is not "
                        "configured): authenticate with the cluster key"));
        return;
      }
      auth_state_ = AuthState::kVerifying;
      auto work = NewWork(id, type);
      work->request_bytes = auth.credential.size();
      work->service_request.emplace(std::move(auth));
      queue_.push_back(std::move(work));
      Pump();
      return;
    }
    KeyId key_id{};
    std::memcpy(key_id.data(), auth.credential.data(), key_id.size());
    const std::string* key =
        config->cluster_keys != nullptr ? config->cluster_keys->Find(key_id) : nullptr;
    if (key == nullptr) {
      AuthRefused(
          id, type,
          Status::PermissionDenied(
              config->cluster_keys == nullptr
                  ? std::string("this cache node accepts no cluster key (auth.cluster_key_file "
                                "is not configured)")
                  : "the client's cluster key " + KeyIdHex(key_id) +
                        " is not one of this node's (" +
                        KeyIdHex(config->cluster_keys->current_id()) +
                        (config->cluster_keys->size() > 1 ? " and one more" : "") +
                        "): give both sides the same cluster_key_file; while rotating, "
                        "put the new key on every node before any client uses it"));
      return;
    }
    auth_key_ = key;
    auth_key_id_ = key_id;
    client_nonce_ = auth.client_nonce;
    server_nonce_ = RandomNonce();
    const std::string& server_name = server_.options().node_name;
    if (tls_ != nullptr) {
      Result<std::array<uint8_t, 32>> binding = tls_->ChannelBinding();
      if (!binding.ok()) {
        AuthRefused(id, type, binding.status());
        return;
      }
      binding_.assign(reinterpret_cast<const char*>(binding->data()), binding->size());
    }
    AuthReply challenge{false, server_nonce_,
                        ClusterKeyProof(*key, ProofRole::kServer, client_nonce_, server_nonce_,
                                        server_name, peer_name_, binding_),
                        ""};
    auth_state_ = AuthState::kChallenged;
    Result<OutgoingFrame> reply =
        EncodeResponse(id, challenge, {}, EncodeOptions{version_, server_.options().limits});
    QueueReady(id, type,
               reply.ok() ? std::move(*reply) : ErrorFrame(id, reply.status(), true, version_),
               !reply.ok());
  }

  void OnAuthProof(uint64_t id, uint16_t type, const AuthProofRequest& proof) {
    if (auth_state_ != AuthState::kChallenged) {
      Add(server_.counters().policy_errors);
      PolicyError(id, type,
                  Status::FailedPrecondition(
                      "AUTH_PROOF without a challenge: send AUTH with the cluster key's id "
                      "first, then the proof of the AUTH_REPLY's nonce"));
      return;
    }
    const AuthProof expected =
        ClusterKeyProof(*auth_key_, ProofRole::kClient, client_nonce_, server_nonce_,
                        server_.options().node_name, peer_name_, binding_);
    if (!ProofsEqual(expected, proof.proof)) {
      AuthRefused(id, type,
                  Status::PermissionDenied(
                      "the proof does not match cluster key " + KeyIdHex(auth_key_id_) +
                      " for this connection's challenge (a proof is good for one connection "
                      "only; the client may hold another key with the same id)"));
      return;
    }
    PeerIdentity identity;
    identity.kind = PeerIdentity::Kind::kCluster;
    identity.subject = "cluster key " + KeyIdHex(auth_key_id_);
    Grant(std::move(identity));
    Add(server_.counters().auth_granted);
    Result<OutgoingFrame> reply = EncodeResponse(id, AuthProofReply{identity_.Scope()}, {},
                                                 EncodeOptions{version_, server_.options().limits});
    QueueReady(id, type,
               reply.ok() ? std::move(*reply) : ErrorFrame(id, reply.status(), true, version_),
               !reply.ok());
  }

  void Grant(PeerIdentity identity) {
    server_.OnAuthenticated(*gauge_);
    identity_ = std::move(identity);
    authenticated_ = true;
    auth_state_ = AuthState::kDone;
    auth_key_ = nullptr;
    server_.log().debug("connection {}: authenticated as {} ({})", Describe(), identity_.subject,
                        identity_.Scope());
  }

  void AuthRefused(uint64_t id, uint16_t type, const Status& status) {
    Add(server_.counters().auth_refused);
    PolicyError(id, type, Status(status.code(), "authentication refused: " + status.message()));
  }

  // Whether this connection's identity may touch the request's dataset. A
  // refusal names no more than the request did: the same answer whether the
  // dataset exists in another namespace or not at all.
  Status Authorize(const RequestMessage& message) const {
    if (!authenticated_ || server_.options().auth == nullptr ||
        identity_.kind == PeerIdentity::Kind::kCluster) {
      return Status::Ok();
    }
    std::string dataset;
    if (const auto* read = std::get_if<ReadRequest>(&message)) dataset = read->dataset;
    if (const auto* stat = std::get_if<StatRequest>(&message)) dataset = stat->dataset;
    if (dataset.empty()) return Status::Ok();  // the node's own STAT
    const auto& authorize = server_.options().auth->authorize;
    Status allowed = authorize ? authorize(identity_, dataset)
                               : Status::PermissionDenied("no dataset is readable with a token");
    if (allowed.ok()) return allowed;
    return Status::PermissionDenied("dataset " + Quoted(dataset) + " is not readable as " +
                                    identity_.Scope() + " (" + identity_.subject +
                                    "): a token reads only its own namespace's datasets");
  }

  // HELLO-related failures leave the connection without a version: ERROR
  // (closing) for the request, read nothing more, close once it is sent.
  void PolicyError(uint64_t id, uint16_t type, const Status& status) {
    server_.WarnAboutClient("connection " + Describe() + ": request " + std::to_string(id) + ": " +
                            status.ToString() + "; answered ERROR and closed it");
    StopReading();
    QueueReady(id, type,
               ErrorFrame(id, status, true, hello_done_ ? version_ : pf::kHandshakeVersion), true);
  }

  std::unique_ptr<Work> NewWork(uint64_t request_id, uint16_t type) {
    auto work = std::make_unique<Work>();
    work->seq = ++next_seq_;
    work->request_id = request_id;
    work->type = type;
    work->decoded_at = SteadyClock::now();
    return work;
  }

  void QueueReady(uint64_t request_id, uint16_t type, OutgoingFrame frame, bool close_after) {
    auto work = NewWork(request_id, type);
    work->ready = true;
    work->reply_memory = frame.header.size();
    work->frame = std::move(frame);
    work->close_after = close_after;
    queue_.push_back(std::move(work));
    Pump();
  }

  // ---- the service pool ----

  // Starts the first request that needs the service, unless one is running:
  // one call per connection at a time, in arrival order.
  void StartService() {
    if (phase_ != Phase::kOpen) return;
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const auto& w) {
      return w->running || w->service_request.has_value();
    });
    if (it == queue_.end() || (*it)->running) return;
    Work& work = **it;
    if (!Reserve(work)) return;
    work.running = true;
    auto request = std::make_shared<const ServiceRequest>(std::move(*work.service_request));
    work.service_request.reset();
    work.request_bytes = 0;
    auto self = shared_from_this();
    const uint64_t seq = work.seq;
    const uint64_t request_id = work.request_id;
    const uint16_t version = version_;
    asio::post(server_.pool(), [self, seq, request_id, version, request] {
      // A connection that is gone needs no answer: do not spend a disk read on it.
      if (self->gone_.load(std::memory_order_acquire)) return;
      auto result =
          std::make_shared<ServiceResult>(self->server_.RunService(*request, request_id, version));
      asio::post(self->worker_.io, [self, seq, result] { self->OnServiceDone(seq, *result); });
    });
  }

  // A READ's reply bytes from the reply budget, before it starts: true when
  // reserved. Else it waits, for its own replies to be read (FinishFront pumps
  // again) or for the budget (ReplyBudget wakes it).
  bool Reserve(Work& work) {
    if (work.reservation.held()) return true;
    const auto* read = std::get_if<ReadRequest>(&*work.service_request);
    if (read == nullptr) return true;  // STAT: a small reply, not reserved
    if (budget_wait_registered_) return false;
    const uint64_t need = RequestedBytes(*read);
    const uint64_t held = ReservedBytes();
    if (held > 0 && held + need > server_.options().ConnectionReplyBufferBytes()) {
      if (!work.waited_for_connection) {
        work.waited_for_connection = true;
        Add(server_.counters().connection_reply_waits);
      }
      return false;
    }
    std::weak_ptr<Connection> weak = weak_from_this();
    asio::io_context& io = worker_.io;
    const bool reserved = server_.budget().ReserveOrWait(need, [weak, &io] {
      asio::post(io, [weak] {
        if (auto self = weak.lock()) {
          self->budget_wait_registered_ = false;
          self->Pump();
        }
      });
    });
    if (!reserved) {
      budget_wait_registered_ = true;
      if (!work.waited_for_budget) {
        work.waited_for_budget = true;
        Add(server_.counters().reply_budget_waits);
      }
      return false;
    }
    work.reservation = BudgetReservation(&server_.budget(), need);
    return true;
  }

  void OnServiceDone(uint64_t seq, ServiceResult& result) {
    if (phase_ == Phase::kClosed) return;  // the answer is released with `result`
    auto it =
        std::find_if(queue_.begin(), queue_.end(), [seq](const auto& w) { return w->seq == seq; });
    if (it == queue_.end()) return;  // dropped after a framing error
    Work& work = **it;
    work.running = false;
    work.ready = true;
    if (result.granted.has_value()) Grant(std::move(*result.granted));
    if (result.close_after) {
      work.close_after = true;
      StopReading();
    }
    work.frame = std::move(result.frame);
    work.answer = std::move(result.answer);
    work.items = result.items;
    work.item_errors = result.item_errors;
    work.reply_memory =
        work.frame.header.size() + (work.answer.has_value() ? work.answer->memory_bytes() : 0);
    // File ranges (sendfile) and an ERROR instead of the bytes hold no memory:
    // give the rest back now.
    work.reservation.Resize(work.reply_memory);
    Pump();
  }

  // ---- output ----

  // Sends ready replies from the front of the queue until the socket is full,
  // nothing is ready, or this turn's quantum is spent.
  void Write() {
    if (phase_ != Phase::kOpen || write_waiting_) return;
    const int fd = socket_.native_handle();
    uint64_t budget = server_.options().write_quantum_bytes;
    for (int round = 0; round < kMaxWriteRounds; ++round) {
      if (queue_.empty() || !queue_.front()->ready) return;
      Work& work = *queue_.front();
      const size_t pieces = 1 + work.frame.payload.size();
      if (send_piece_ >= pieces) {
        FinishFront();
        if (phase_ != Phase::kOpen) return;
        continue;
      }
      if (budget == 0) {
        PostPump();  // let the loop's other connections run first
        return;
      }
      PieceRef piece = PieceAt(work.frame, send_piece_);
      ssize_t n = 0;
      bool by_sendfile = false;
      if (tls_ != nullptr) {
        Result<uint64_t> written = WriteTls(work, piece, budget);
        if (!written.ok()) {
          SendFailed(work, written.status().message());
          return;
        }
        if (*written == 0) {
          WaitWritable();
          return;
        }
        budget -= std::min<uint64_t>(budget, *written);
        Advance(work, *written, false);
        continue;
      }
      if (piece.file == nullptr) {
        iovec iov[kMaxIov];
        size_t count = 0;
        uint64_t total = 0;
        for (size_t p = send_piece_; p < pieces && count < kMaxIov && total < budget; ++p) {
          PieceRef ref = PieceAt(work.frame, p);
          if (ref.file != nullptr) break;
          std::string_view bytes = ref.memory.substr(p == send_piece_ ? send_offset_ : 0);
          bytes = bytes.substr(
              0, static_cast<size_t>(std::min<uint64_t>(bytes.size(), budget - total)));
          if (bytes.empty()) continue;
          iov[count].iov_base = const_cast<char*>(bytes.data());
          iov[count].iov_len = bytes.size();
          ++count;
          total += bytes.size();
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = count;
        n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      } else {
        const FileRange& range = *piece.file;
        uint64_t want = std::min({range.length - send_offset_, budget, kMaxSendfileBytes});
        auto offset = static_cast<off_t>(range.offset + send_offset_);
        n = ::sendfile(fd, range.fd, &offset, static_cast<size_t>(want));
        by_sendfile = true;
        if (n == 0) {
          SendFailed(work, "sendfile of " + std::to_string(range.length) + " bytes from offset " +
                               std::to_string(range.offset) +
                               " reached the end of the file early: the file is shorter than "
                               "the read service said");
          return;
        }
      }
      if (n < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) {
          WaitWritable();
          return;
        }
        if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
          // The client went away mid-reply: nothing to fix, nothing to warn about.
          Add(server_.counters().send_errors);
          server_.log().debug("connection {}: client gone mid-reply: {}", Describe(),
                              ErrnoText(err));
          Close();
          return;
        }
        SendFailed(work, std::string(by_sendfile ? "sendfile" : "sendmsg") + ": " + ErrnoText(err));
        return;
      }
      budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
      Advance(work, static_cast<uint64_t>(n), by_sendfile);
    }
    PostPump();
  }

  // One TLS record's worth of the current piece: memory as it is, a file
  // range read into tls_scratch_ first (no sendfile through TLS). 0: the
  // socket is full (WaitWritable); a retry sends the same bytes, as OpenSSL
  // requires.
  Result<uint64_t> WriteTls(const Work& work, const PieceRef& piece, uint64_t budget) {
    const uint64_t left = piece.size() - send_offset_;
    const size_t length = static_cast<size_t>(std::min({left, budget, kTlsWriteBytes}));
    const char* data = nullptr;
    if (piece.file == nullptr) {
      data = piece.memory.data() + send_offset_;
    } else {
      const FileRange& range = *piece.file;
      const uint64_t offset = range.offset + send_offset_;
      if (tls_scratch_offset_ != offset || tls_scratch_fd_ != range.fd ||
          tls_scratch_.size() != length) {
        tls_scratch_.resize(length);
        Status read = PreadFull(range.fd, tls_scratch_.data(), length, offset, "a chunk file");
        if (!read.ok()) {
          tls_scratch_fd_ = -1;
          return Status(read.code(), "reading the reply of request " +
                                         std::to_string(work.request_id) + ": " + read.message());
        }
        tls_scratch_offset_ = offset;
        tls_scratch_fd_ = range.fd;
      }
      data = tls_scratch_.data();
    }
    TlsWant want = TlsWant::kNothing;
    Result<size_t> n = tls_->Write(data, length, &want);
    if (!n.ok()) return n.status();
    if (*n > 0 && piece.file != nullptr) tls_scratch_fd_ = -1;  // the next bytes differ
    return uint64_t{*n};
  }

  void SendFailed(const Work& work, const std::string& what) {
    Add(server_.counters().send_errors);
    server_.log().warn(
        "connection {}: sending the reply to request {} failed: {}; closed the connection "
        "mid-reply (the client sees it cut and retries)",
        Describe(), work.request_id, what);
    Close();
  }

  void Advance(const Work& work, uint64_t n, bool by_sendfile) {
    AtomicCounters& c = server_.counters();
    Add(c.sent_bytes, n);
    gauge_->sent.fetch_add(n, std::memory_order_relaxed);
    if (by_sendfile) Add(c.sendfile_bytes, n);
    last_write_progress_ = SteadyClock::now();
    last_activity_ = last_write_progress_;
    const size_t pieces = 1 + work.frame.payload.size();
    while (send_piece_ < pieces) {
      PieceRef piece = PieceAt(work.frame, send_piece_);
      uint64_t step = std::min(n, piece.size() - send_offset_);
      send_offset_ += step;
      n -= step;
      if (send_piece_ > 0) Add(c.payload_bytes, step);
      if (piece.file == nullptr) front_memory_sent_ += step;
      if (send_offset_ < piece.size()) break;
      ++send_piece_;
      send_offset_ = 0;
    }
  }

  // The front reply is sent: count it and pop it.
  void FinishFront() {
    std::unique_ptr<Work> work = std::move(queue_.front());
    queue_.pop_front();
    send_piece_ = 0;
    send_offset_ = 0;
    front_memory_sent_ = 0;
    AtomicCounters& c = server_.counters();
    if (work->type != 0) {
      Add(c.requests);
      gauge_->requests.fetch_add(1, std::memory_order_relaxed);
      switch (work->type) {
        case pf::kTypeHello:
          Add(c.hello);
          break;
        case pf::kTypePing:
          Add(c.ping);
          break;
        case pf::kTypeStat:
          Add(c.stat);
          break;
        case pf::kTypeRead:
          Add(c.read);
          Add(c.read_items, work->items);
          Add(c.read_item_errors, work->item_errors);
          break;
        default:
          break;
      }
      server_.RecordLatency(SteadyClock::now() - work->decoded_at);
    }
    if (work->close_after) {
      StartLinger();
      return;
    }
    if (close_when_answered_ && queue_.empty()) {
      Close();
      return;
    }
    Pump();  // below the in-flight bound again: read, start the next request
  }

  void WaitWritable() {
    write_waiting_ = true;
    gauge_->write_blocked.store(true, std::memory_order_relaxed);
    auto self = shared_from_this();
    socket_.async_wait(Socket::wait_write, [self](const ErrorCode& ec) {
      self->write_waiting_ = false;
      self->gauge_->write_blocked.store(false, std::memory_order_relaxed);
      if (self->phase_ != Phase::kOpen) return;
      if (ec) {
        if (ec != asio::error::operation_aborted) self->Close();
        return;
      }
      self->Pump();
    });
  }

  // The last reply (a closing ERROR) is out: shut our side, then read and
  // discard until the client closes too (or kLingerTime), so that the kernel
  // does not reset the connection over unread bytes before the client has
  // read the ERROR.
  void StartLinger() {
    phase_ = Phase::kLingering;
    linger_deadline_ = SteadyClock::now() + kLingerTime;
    queue_.clear();
    ErrorCode ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      Close();
      return;
    }
    Pump();  // arms the discarding read
  }

  void UpdateGauge() {
    uint64_t bytes = 0;
    if (phase_ != Phase::kClosed) {
      bytes = (receive_end_ - receive_begin_) + decoder_.buffered_bytes();
      for (const auto& work : queue_) bytes += work->request_bytes + work->reply_memory;
      bytes -= std::min(bytes, front_memory_sent_);
    }
    server_.NoteBuffered(buffered_, bytes);
    buffered_ = bytes;
    gauge_->buffered.store(bytes, std::memory_order_relaxed);
    gauge_->reserved.store(phase_ != Phase::kClosed ? ReservedBytes() : 0,
                           std::memory_order_relaxed);
    gauge_->in_flight.store(static_cast<uint32_t>(queue_.size()), std::memory_order_relaxed);
  }

  ServerCore& server_;
  Worker& worker_;
  Socket socket_;
  const uint64_t id_;
  const std::shared_ptr<ConnectionGauge> gauge_;
  std::atomic<bool> gone_{false};  // read by pool tasks

  Phase phase_ = Phase::kOpen;
  bool pumping_ = false;
  bool pump_again_ = false;
  bool input_stopped_ = false;        // no more requests will be read
  bool close_when_answered_ = false;  // close once the queue is empty
  bool hello_done_ = false;
  // TLS (ServerOptions::tls): the stream over socket_, and a file range read
  // for it (sendfile cannot go through TLS).
  std::unique_ptr<TlsStream> tls_;
  bool tls_ready_ = false;
  std::string tls_scratch_;
  uint64_t tls_scratch_offset_ = 0;
  int tls_scratch_fd_ = -1;
  // Authentication: required when the server has ServerOptions::auth.
  enum class AuthState { kNone, kChallenged, kVerifying, kDone };
  bool authenticated_ = false;
  AuthState auth_state_ = AuthState::kNone;
  PeerIdentity identity_;
  const std::string* auth_key_ = nullptr;  // the key the challenge used (in ServerAuth)
  KeyId auth_key_id_{};
  AuthNonce client_nonce_{};
  AuthNonce server_nonce_{};
  std::string binding_;  // the TLS session's channel binding, in the proofs
  uint16_t version_ = pf::kHandshakeVersion;
  std::string peer_name_;

  FrameDecoder decoder_;
  const size_t receive_capacity_;
  // Outlives the connection's socket operations: freed with the connection.
  std::unique_ptr<char[]> receive_;
  size_t receive_begin_ = 0;  // unconsumed bytes: [begin, end)
  size_t receive_end_ = 0;
  bool reading_ = false;  // an async read is outstanding
  std::optional<SteadyClock::time_point> frame_started_;
  uint64_t bytes_since_frame_ = 0;

  std::deque<std::unique_ptr<Work>> queue_;  // at most max_in_flight + 1 (a closing ERROR)
  uint64_t next_seq_ = 0;
  size_t send_piece_ = 0;  // of the front reply: 0 header, k payload piece k - 1
  uint64_t send_offset_ = 0;
  uint64_t front_memory_sent_ = 0;
  bool write_waiting_ = false;
  bool budget_wait_registered_ = false;  // ReplyBudget will wake this connection

  SteadyClock::time_point accepted_at_;
  SteadyClock::time_point last_activity_;
  SteadyClock::time_point last_write_progress_;
  SteadyClock::time_point linger_deadline_;
  uint64_t linger_bytes_ = 0;
  uint64_t buffered_ = 0;  // last value given to NoteBuffered
};

// ---------------------------------------------------------------------------

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
    pool_ = std::make_unique<asio::thread_pool>(options_.service_threads);
    for (auto& worker : workers_) {
      Worker* w = worker.get();
      ArmSweep(*w);
      w->thread = std::thread([w] {
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

void ServerCore::WarnAboutClient(const std::string& message) {
  const auto now = SteadyClock::now();
  uint64_t suppressed = 0;
  {
    std::lock_guard lock(warn_mu_);
    if (now - last_warn_ < kWarnInterval) {
      ++suppressed_warnings_;
      log_->debug("{}", message);
      return;
    }
    last_warn_ = now;
    suppressed = std::exchange(suppressed_warnings_, 0);
  }
  if (suppressed > 0) {
    log_->warn("{} ({} similar warnings in the last second were logged at debug)", message,
               suppressed);
  } else {
    log_->warn("{}", message);
  }
}

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

ServiceResult ServerCore::RunService(const ServiceRequest& request, uint64_t request_id,
                                     uint16_t version) {
  const EncodeOptions encode{version, options_.limits};
  ServiceResult out;
  auto error = [&](const Status& status) {
    out.frame = ErrorFrame(request_id, status, false, version);
  };
  if (const auto* auth = std::get_if<AuthRequest>(&request)) {
    return CheckToken(*auth, request_id, version);
  }
  if (const auto* read = std::get_if<ReadRequest>(&request)) {
    Result<ReadAnswer> answer = service_->Read(*read);
    if (!answer.ok()) {
      Add(counters_.service_errors);
      error(answer.status());
      return out;
    }
    Status check = CheckReadReply(*read, answer->reply());
    Result<OutgoingFrame> frame =
        check.ok() ? EncodeResponse(request_id, answer->reply(), answer->payload(), encode)
                   : Result<OutgoingFrame>(check);
    if (!frame.ok()) {
      Add(counters_.internal_errors);
      Status internal = Status::Internal("the read service's answer to READ request " +
                                         std::to_string(request_id) +
                                         " does not match it: " + frame.status().message() +
                                         "; this is a bug in the cache node, please report it");
      log_->error("{}", internal.message());
      error(internal);
      return out;
    }
    out.items = read->items.size();
    for (const ReadReplyItem& item : answer->reply().items) {
      if (!item.status.ok()) ++out.item_errors;
    }
    // Start reading the file ranges into the page cache here, on a thread that
    // may block, so that sendfile on the event loop finds the pages there.
    for (const PayloadPiece& piece : answer->payload()) {
      if (const auto* f = std::get_if<FileRange>(&piece)) {
        (void)::posix_fadvise(f->fd, static_cast<off_t>(f->offset), static_cast<off_t>(f->length),
                              POSIX_FADV_WILLNEED);
      }
    }
    out.frame = std::move(*frame);
    out.answer.emplace(std::move(*answer));
    return out;
  }
  const auto& stat = std::get<StatRequest>(request);
  Result<StatReply> reply = service_->Stat(stat);
  if (!reply.ok()) {
    Add(counters_.service_errors);
    error(reply.status());
    return out;
  }
  if (stat.dataset.empty()) AppendServerEntries(&*reply);
  if (draining()) reply->state = NodeState::kDraining;
  Result<OutgoingFrame> frame = EncodeResponse(request_id, *reply, {}, encode);
  if (!frame.ok()) {
    Add(counters_.internal_errors);
    Status internal =
        Status::Internal("the read service's answer to STAT request " + std::to_string(request_id) +
                         " cannot be sent: " + frame.status().message() +
                         "; this is a bug in the cache node, please report it");
    log_->error("{}", internal.message());
    error(internal);
    return out;
  }
  out.frame = std::move(*frame);
  return out;
}

ServiceResult ServerCore::CheckToken(const AuthRequest& auth, uint64_t request_id,
                                     uint16_t version) {
  ServiceResult out;
  // OnFrame sends a token here only when a verifier is configured.
  Result<PeerIdentity> identity = options_.auth->tokens->Verify(auth.credential);
  if (!identity.ok()) {
    Add(counters_.auth_refused);
    WarnAboutClient("a Kubernetes token was refused: " + identity.status().ToString());
    out.frame = ErrorFrame(
        request_id,
        Status(identity.status().code(), "authentication refused: " + identity.status().message()),
        true, version);
    out.close_after = true;
    return out;
  }
  Result<OutgoingFrame> frame =
      EncodeResponse(request_id, AuthReply{true, {}, {}, identity->Scope()}, {},
                     EncodeOptions{version, options_.limits});
  if (!frame.ok()) {
    Add(counters_.auth_refused);
    out.frame = ErrorFrame(request_id, frame.status(), true, version);
    out.close_after = true;
    return out;
  }
  Add(counters_.auth_granted);
  out.frame = std::move(*frame);
  out.granted = std::move(*identity);
  return out;
}

void ServerCore::AppendServerEntries(StatReply* reply) const {
  const AtomicCounters& c = counters_;
  const uint64_t errors = Load(c.framing_errors) + Load(c.truncated_frames) +
                          Load(c.message_errors) + Load(c.policy_errors) + Load(c.service_errors) +
                          Load(c.internal_errors) + Load(c.timeouts) + Load(c.send_errors);
  const std::pair<const char*, uint64_t> entries[] = {
      {"server_connections_open", Load(c.connections_open)},
      {"server_connections_accepted_total", Load(c.connections_accepted)},
      {"server_requests_total", Load(c.requests)},
      {"server_read_items_total", Load(c.read_items)},
      {"server_payload_bytes_total", Load(c.payload_bytes)},
      {"server_sent_bytes_total", Load(c.sent_bytes)},
      {"server_errors_total", errors},
      {"server_buffered_bytes", Load(c.buffered_bytes)},
      {"server_reply_budget_used_bytes", budget_.used()},
      {"server_reply_budget_waits_total", Load(c.reply_budget_waits)},
  };
  for (const auto& [key, value] : entries) {
    if (reply->entries.size() >= pf::kMaxStatEntries) break;
    bool taken = std::any_of(reply->entries.begin(), reply->entries.end(),
                             [key = key](const StatEntry& e) { return e.key == key; });
    if (!taken) reply->entries.push_back(StatEntry{key, value});
  }
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

}  // namespace

class Server::Impl : public ServerCore {
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

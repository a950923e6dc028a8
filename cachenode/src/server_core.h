#pragma once

// What the cache node server's parts share (private to cachenode/src, so
// Asio stays out of public headers): the loops (Worker), the counters, the
// connection registry's gauges, and ServerCore, which owns the listener,
// the loops and the service pool. server.cc implements ServerCore;
// connection.h is one client connection.

#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "granary/cachenode/server.h"
#include "granary/core/log.h"
#include "granary/core/net_address.h"
#include "granary/protocol/protocol.h"
#include "reply_budget.h"
#include "service_calls.h"

namespace granary::server_internal {

namespace asio = boost::asio;
namespace pf = protocol_format;
using tcp = asio::ip::tcp;
using SteadyClock = std::chrono::steady_clock;
using Socket = asio::basic_stream_socket<tcp, asio::io_context::executor_type>;
using ErrorCode = boost::system::error_code;

// After a closing ERROR, the connection reads and discards what the client
// still sends, for at most this long and this many bytes, before it closes: a
// close with unread bytes makes the kernel send a reset, which can destroy the
// ERROR before the client reads it.
constexpr auto kLingerTime = std::chrono::milliseconds(1000);
constexpr uint64_t kMaxLingerBytes = 1u << 20;

inline std::string Millis(std::chrono::milliseconds ms) {
  return std::to_string(ms.count()) + " ms";
}

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

// ServiceRequest (peer_session.h) and ServiceResult (service_calls.h) are
// what a connection hands its service pool and gets back.

// Everything the server shares between its loops: the listener, the loops,
// the service pool, the counters and the connection registry. Server::Impl is
// this class (kept out of the public header so that connections can use it).
class ServerCore {
 public:
  ServerCore(std::shared_ptr<ReadService> service, ServerOptions options);
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
  // a closing ERROR (RunServiceCall, service_calls.h).
  ServiceResult RunService(const ServiceRequest& request, uint64_t request_id, uint16_t version);
  void OnConnectionClosed(uint64_t id);
  // A connection of `gauge` was granted an identity: it no longer counts
  // among its address's unauthenticated connections.
  void OnAuthenticated(ConnectionGauge& gauge);
  void NoteBuffered(uint64_t old_bytes, uint64_t new_bytes);
  void RecordLatency(SteadyClock::duration latency);
  // A warning about a client, rate-limited (ClientWarnings).
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

  ClientWarnings warnings_{*log_};  // after log_
};

}  // namespace granary::server_internal

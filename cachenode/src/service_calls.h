#pragma once

// The service calls every front end of the cache node runs for a connection
// (the TCP server's pool, server_core.h; the fabric server's connection
// threads, fabric_server.h): a READ or STAT through the ReadService, encoded
// for the connection's protocol version, and a Kubernetes token through the
// TokenVerifier. Either may block (disk, source, API server). No Asio here.
//
// Thread safety: RunServiceCall may run on many threads at once; what it is
// given (the service, the counters, the hooks) must allow that.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "granary/cachenode/read_service.h"
#include "granary/cachenode/server.h"
#include "granary/core/log.h"
#include "granary/peer/peer_auth.h"
#include "granary/protocol/protocol.h"
#include "peer_session.h"

namespace granary::server_internal {

inline void Add(std::atomic<uint64_t>& counter, uint64_t n = 1) {
  counter.fetch_add(n, std::memory_order_relaxed);
}
inline uint64_t Load(const std::atomic<uint64_t>& counter) {
  return counter.load(std::memory_order_relaxed);
}

inline OutgoingFrame ErrorFrame(uint64_t request_id, const Status& status, bool closing,
                                uint16_t version) {
  return OutgoingFrame{EncodeError(request_id, status, closing, version), {}};
}

// Warnings about clients, at most one per second at warn (the rest at debug),
// so that a flood of hostile connections cannot flood the log. One per front
// end; any thread.
class ClientWarnings {
 public:
  explicit ClientWarnings(spdlog::logger& log) : log_(log) {}
  void Warn(const std::string& message);

 private:
  static constexpr auto kInterval = std::chrono::seconds(1);
  spdlog::logger& log_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_{};  // guarded by mu_
  uint64_t suppressed_ = 0;                       // guarded by mu_
};

// A reply computed by a service call, ready for the connection.
struct ServiceResult {
  OutgoingFrame frame;
  std::optional<ReadAnswer> answer;  // owns what the frame's payload points into
  uint64_t items = 0;
  uint64_t item_errors = 0;
  std::optional<PeerIdentity> granted;  // a token accepted
  bool close_after = false;             // a token refused: the frame is a closing ERROR
};

// What a front end gives its service calls.
struct ServiceCallContext {
  ReadService* service = nullptr;
  const ServerOptions* options = nullptr;  // limits; auth->tokens for a token
  spdlog::logger* log = nullptr;
  // Where to count: whole READs or STATs the service failed, answers not
  // matching their request (a bug), tokens refused and granted.
  std::atomic<uint64_t>* service_errors = nullptr;
  std::atomic<uint64_t>* internal_errors = nullptr;
  std::atomic<uint64_t>* auth_refused = nullptr;
  std::atomic<uint64_t>* auth_granted = nullptr;
  // A warning about a client (rate-limited by the front end).
  std::function<void(const std::string&)> warn;
  // Called on every STAT reply before it is encoded: the front end adds its
  // own entries to the node's STAT and its state (draining). May be null.
  std::function<void(const StatRequest&, StatReply*)> finish_stat;
};

ServiceResult RunServiceCall(const ServiceCallContext& context, const ServiceRequest& request,
                             uint64_t request_id, uint16_t version);

}  // namespace granary::server_internal

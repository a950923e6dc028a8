#pragma once

// FabricServer: the cache node's second front end, the peer protocol over
// libfabric endpoints (granary/fabric/endpoint.h; docs/transport.md,
// "libfabric"), over the same ReadService and ServerOptions (limits, node
// name, authentication, max_connections, timeouts) as the TCP server.
//
//  - An accept thread, and one thread per connection: a connection is one
//    request at a time (the reader sends one and waits), so a thread that
//    blocks in the read service holds up only its own reader. At
//    max_connections open, a new connection gets ERROR kResourceExhausted
//    (closing), is closed and counted.
//  - Each message is the reader's RemoteWindow and exactly one frame
//    (EncodeRequestMessage); the frame goes to the connection's PeerSession
//    (peer_session.h), the same rules as TCP's. Anything else (not a window
//    and a frame, a framing error, a cut frame, bytes after the frame) is a
//    closing ERROR. READ and STAT (and a Kubernetes token) run the service
//    calls the TCP server runs (service_calls.h) on the connection's thread.
//  - A READ's payload goes into the reader's window by RMA (Endpoint::Write),
//    piece by piece at its offset: memory as it is, file ranges read into a
//    per-connection buffer (kept across requests, at most kFileSliceBytes)
//    first; then the reply frame (header and body) is sent as one message.
//    Before its service call a READ reserves the bytes it asks for from the
//    fabric's reply budget (reply_buffer_bytes, apart from TCP's: ReplyBudget,
//    reply_budget.h), waiting until they fit, as on TCP; the reservation
//    shrinks to the answer's memory and is released once the reply is sent.
//    A READ that asks for more than its window holds gets ERROR
//    kOutOfRange naming both sizes; the connection goes on.
//  - No TLS: the fabric carries the authentication handshake, not encryption
//    (the daemon refuses tls_cert_file with fabric_listen).
//  - Timeouts: HELLO (and AUTH, when required) within handshake_timeout of
//    the accept; a connection that sends nothing for idle_timeout is closed;
//    a send or RMA write that takes longer than write_timeout breaks it.
//  - Stop(): no new connections; connections waiting for a request are
//    closed at once, those answering one finish it (up to drain_timeout);
//    every thread is joined.
//
// Counters (FabricCounters) are plain atomics; the daemon exports them as
// granary_cachenode_fabric_* (cache_node_metrics.h).
//
// Who calls it: the cache-node daemon (cache_node.cc) when `fabric_listen` is
// set; bench/cachenode_bench (--transport). Thread safety: Start, Stop and the destructor from the
// owning thread; port() and Counters() from any thread.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "granary/cachenode/read_service.h"
#include "granary/cachenode/server.h"
#include "granary/core/status.h"

namespace granary {

struct FabricServerOptions {
  // "host:port" (port 0: a free one, see FabricServer::port()).
  std::string listen = "127.0.0.1:0";
  // The libfabric provider: "tcp" (tests, any Ethernet), "verbs" (InfiniBand, RoCE).
  std::string provider = "tcp";
  // node_name, limits, auth, max_connections and the timeouts; listen, tls
  // and the event-loop options are the TCP server's and are not used.
  ServerOptions server;
};

// Totals since Start, and the connections open now.
struct FabricCounters {
  uint64_t connections_accepted_total = 0;
  uint64_t connections_rejected_total = 0;  // over max_connections
  uint64_t connections_open = 0;
  // Messages answered (a reply or an ERROR sent).
  uint64_t requests_total = 0;
  // Payload bytes written into readers' windows by RMA.
  uint64_t rma_bytes_total = 0;
  // Bad input (framing, message, policy), refused authentication, failed
  // service calls, timeouts, and sends or writes that failed.
  uint64_t errors_total = 0;
  uint64_t auth_granted_total = 0;
  // READs that waited for the fabric's reply budget before they started.
  uint64_t reply_budget_waits_total = 0;
};

class FabricServer {
 public:
  // The largest file range read into a connection's buffer at once.
  static constexpr uint64_t kFileSliceBytes = 1u << 20;

  // Listens on options.listen with options.provider. Errors: kInvalidArgument
  // (bad options or address), kUnavailable (the provider or the address is
  // not usable here), kResourceExhausted (no thread).
  static Result<std::unique_ptr<FabricServer>> Start(std::shared_ptr<ReadService> service,
                                                     const FabricServerOptions& options);
  ~FabricServer();  // Stop()
  FabricServer(const FabricServer&) = delete;
  FabricServer& operator=(const FabricServer&) = delete;

  uint16_t port() const;
  void Stop();
  FabricCounters Counters() const;

  class Impl;

 private:
  explicit FabricServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary

#pragma once

// Server: the cache node's TCP serving layer. It accepts connections from
// sidecars and peer cache nodes, speaks the wire protocol (protocol.h,
// docs/protocol.md), and asks a ReadService (read_service.h) for the answers;
// it does not know what chunks or samples are. docs/cachenode.md ("Serving")
// describes the design; in short:
//
//  - io_threads event loops, each one io_context on its own thread. One
//    acceptor (on the first loop) hands each accepted connection to the next
//    loop, round-robin; the connection lives on that loop until it closes.
//  - A connection must open with HELLO. Its requests are answered in the order
//    they arrived (pipelining is allowed); PING and HELLO on the loop, READ and
//    STAT on a bounded service pool (service_threads), one at a time per
//    connection, because the ReadService may block on disk.
//  - Authentication (ServerOptions::auth; docs/protocol.md, "Authentication"):
//    after HELLO the connection proves the cluster key (challenge-response on
//    the loop) or a Kubernetes token (checked on the service pool); before
//    that only PING is answered. A token's connection reads only the datasets
//    ServerAuth::authorize allows. Places: one address holds at most
//    max_connections_per_address, and at most max_unauthenticated_per_address
//    of them before they authenticate.
//  - Bounded memory per connection: one receive chunk plus the FrameDecoder's
//    partial frame (at most max_body_bytes: requests carry no payload), and at
//    most max_in_flight requests decoded and not yet fully answered. At that
//    bound the connection stops reading its socket (TCP back-pressure) and
//    resumes when a reply has been written. Replies go out with sendmsg(2) for
//    memory and sendfile(2) for file ranges; file payloads never pass through
//    user space.
//  - Bounded reply memory per server (the reply budget): before a READ goes to
//    the ReadService, the bytes it asks for are reserved from
//    reply_buffer_bytes, shared by every connection; after the answer the
//    reservation shrinks to what the reply holds in memory (its header and
//    memory payload: file ranges need none) and it is released when the reply
//    has been written or dropped. A READ that does not fit waits (it is not
//    failed) and starts when bytes are released; waiting READs that fit go
//    first (a small one is not held up behind a large one). A READ asking more
//    than the whole budget starts when nothing else is reserved. One
//    connection may hold at most connection_reply_buffer_bytes of it (or one
//    reply of any size when it holds nothing): past that it neither starts
//    requests nor reads its socket until its client reads replies, so a client
//    that stops reading holds at most one share, and write_timeout closes it.
//    Clients enough to fill the budget with replies they never read would
//    hold every other reader up to write_timeout: while a READ waits for the
//    budget, a connection holding some of it whose client has taken no reply
//    byte for reply_stall_timeout is closed.
//  - Framing errors: a best-effort ERROR (closing) and the connection closes.
//    Message errors and the ReadService's whole-request failures: an ERROR for
//    that request, and the connection keeps serving. Per-item failures: in the
//    READ_REPLY.
//  - Timeouts: HELLO within handshake_timeout of the accept; a frame, once
//    started, complete within frame_timeout (slowloris); a connection with
//    nothing in flight closed after idle_timeout; a reply that makes no progress
//    for write_timeout (a reader that stopped reading) closes the connection,
//    or for reply_stall_timeout while it holds reply-budget bytes that other
//    requests wait for.
//  - Stop(): closes the listener, stops reading new requests, lets in-flight
//    replies finish until drain_timeout, then closes what is left and joins
//    every thread.
//
// Counters (ServerCounters) are plain atomics read with Counters(); the daemon
// exports them as Prometheus metrics. This header includes no Asio.
//
// SIGPIPE: sendfile(2) cannot be told not to raise it when the peer is gone.
// The server's loop threads block SIGPIPE (set before they start), so a
// client that disconnects mid-reply costs an EPIPE, never the process; the
// process-wide disposition is left alone.
//
// Who calls it: the cache-node daemon (one Server for its listen address),
// tests/cachenode/server_test.cc.
//
// Thread safety: Start, Stop and the destructor are called by the owning
// thread; Stop is idempotent. port(), Counters() and Connections() may be
// called from any thread at any time.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "granary/cachenode/read_service.h"
#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/tls.h"
#include "granary/protocol/protocol.h"

namespace granary {

// Authentication on the port (protocol version 2; docs/protocol.md,
// "Authentication"). With it, a connection must authenticate after HELLO
// before STAT or READ; a client speaking only version 1 is refused at HELLO.
struct ServerAuth {
  // Cluster keys a client may prove (both during a rotation). Null: none.
  std::shared_ptr<const ClusterKeys> cluster_keys;
  // Checks Kubernetes tokens (on the service pool: it may block). Null: none.
  std::shared_ptr<TokenVerifier> tokens;
  // Whether a namespace identity may read `dataset` (cluster identities read
  // everything). Called on the event loops for every READ and dataset STAT of
  // such a connection: fast and thread-safe. Null: they read nothing.
  std::function<Status(const PeerIdentity& identity, const std::string& dataset)> authorize;
};

struct ServerOptions {
  // "host:port" or "[ipv6]:port" (ParseNetAddress in net_address.h). Port 0
  // picks a free port: read it with Server::port().
  std::string listen = "127.0.0.1:0";
  // Sent in HELLO_REPLY: 1..255 bytes of graphic ASCII, e.g. the node id.
  std::string node_name = "granary-cachenode";
  // Event loops (threads); connections are spread over them round-robin.
  uint32_t io_threads = 2;
  // Threads calling the ReadService. Each connection has at most one call in
  // progress, so the pool's queue holds at most max_connections tasks.
  uint32_t service_threads = 4;
  // Connections open at once; one more is answered ERROR kResourceExhausted
  // (closing) and closed.
  uint32_t max_connections = 1024;
  // Connections one remote address may hold; 0: a quarter of max_connections,
  // but at least min(max_connections, 64). One more is refused like one over
  // max_connections, so one host cannot take every place.
  uint32_t max_connections_per_address = 0;
  // With `auth`: connections one address may hold that have not yet
  // authenticated (each lasts at most handshake_timeout).
  uint32_t max_unauthenticated_per_address = 16;
  // Requests per connection decoded and not yet fully answered (K). At K the
  // connection stops reading its socket until a reply has been written.
  uint32_t max_in_flight = 8;
  // What the server accepts, advertised in HELLO_REPLY. Must be valid.
  ProtocolLimits limits;
  // Null: the port is open, any client reads any dataset (the daemon warns).
  std::shared_ptr<const ServerAuth> auth;
  // Set: every connection is TLS from its first byte (TlsContext::ForServer);
  // replies are read from chunk files into memory for it (no sendfile).
  std::shared_ptr<const TlsContext> tls;
  // Bytes read from a socket at once (the connection's receive buffer).
  uint32_t receive_chunk_bytes = 64u << 10;
  // Bytes one connection writes before it lets the other connections of its
  // loop run (fairness when a fast reader asks for a lot).
  uint64_t write_quantum_bytes = 4u << 20;
  // The reply budget (above): bytes of READ replies all connections together
  // may hold in memory. At least 1.
  uint64_t reply_buffer_bytes = 256ull << 20;
  // What one connection may hold of the budget before it stops starting
  // requests and reading its socket; 0 means a quarter of reply_buffer_bytes.
  // At most reply_buffer_bytes.
  uint64_t connection_reply_buffer_bytes = 0;

  std::chrono::milliseconds handshake_timeout{10'000};
  std::chrono::milliseconds frame_timeout{10'000};
  std::chrono::milliseconds idle_timeout{300'000};
  std::chrono::milliseconds write_timeout{30'000};
  // While a READ waits for the reply budget: how long a connection holding
  // some of it may take no reply bytes before it is closed (above).
  std::chrono::milliseconds reply_stall_timeout{5'000};
  std::chrono::milliseconds drain_timeout{5'000};

  // Nonzero counts and timeouts, valid limits, a node name the protocol
  // accepts. kInvalidArgument naming the field.
  Status Validate() const;

  // max_connections_per_address, or its default when 0.
  uint32_t MaxConnectionsPerAddress() const {
    return max_connections_per_address != 0
               ? max_connections_per_address
               : std::max(std::min(max_connections, 64u), max_connections / 4);
  }

  // connection_reply_buffer_bytes, or its default when 0.
  uint64_t ConnectionReplyBufferBytes() const {
    return connection_reply_buffer_bytes != 0 ? connection_reply_buffer_bytes
                                              : std::max<uint64_t>(1, reply_buffer_bytes / 4);
  }
};

// Upper bounds (seconds) of the request latency histogram's buckets; one more
// bucket counts everything slower. Latency: from the request's frame being
// decoded to the last byte of its reply handed to the kernel.
inline constexpr std::array<double, 14> kServerLatencyBucketsSeconds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};

// A snapshot of the server's counters (totals since Start) and gauges.
struct ServerCounters {
  // Connections.
  uint64_t connections_accepted_total = 0;
  uint64_t connections_rejected_total = 0;  // over max_connections
  uint64_t connections_closed_total = 0;
  uint64_t connections_open = 0;  // gauge

  // Requests answered (a reply or an ERROR written in full), by type.
  uint64_t requests_total = 0;
  uint64_t hello_requests_total = 0;
  uint64_t ping_requests_total = 0;
  uint64_t stat_requests_total = 0;
  uint64_t read_requests_total = 0;
  // Items of the READs answered with a READ_REPLY, and those of them that
  // failed (per-item status). A READ answered with an ERROR counts no items.
  uint64_t read_items_total = 0;
  uint64_t read_item_errors_total = 0;

  // Bytes handed to the kernel: everything, the READ payloads among them, and
  // the part of the payloads sent with sendfile(2).
  uint64_t sent_bytes_total = 0;
  uint64_t payload_bytes_total = 0;
  uint64_t sendfile_bytes_total = 0;
  uint64_t received_bytes_total = 0;

  // Errors by class (docs/protocol.md, "Bad input").
  uint64_t framing_errors_total = 0;    // undecodable stream: ERROR closing, closed
  uint64_t truncated_frames_total = 0;  // the peer closed mid-frame
  uint64_t message_errors_total = 0;    // undecodable request: ERROR, kept serving
  uint64_t policy_errors_total = 0;     // request before HELLO, second HELLO, no common version
  uint64_t service_errors_total = 0;    // ReadService failed a whole READ or STAT
  uint64_t internal_errors_total = 0;   // ReadService answer not matching its request
  uint64_t timeouts_total = 0;          // handshake, frame, idle or write timeout
  uint64_t send_errors_total = 0;       // the peer went away (or a file failed) mid-reply

  // Bytes the connections hold in user space now (receive buffers, partial
  // frames, decoded requests, replies' headers and memory payloads), and the
  // most any one connection has held at once since Start.
  uint64_t buffered_bytes = 0;
  uint64_t max_connection_buffered_bytes = 0;

  // The reply budget: its size (reply_buffer_bytes), the bytes reserved from
  // it now, and the READs that had to wait before they started: for the
  // budget (every connection's replies together), or for their own
  // connection's share (its client not reading its replies). Each READ counts
  // at most once in each.
  uint64_t reply_budget_bytes = 0;
  uint64_t reply_budget_used_bytes = 0;
  uint64_t reply_budget_waits_total = 0;
  uint64_t connection_reply_waits_total = 0;
  // Connections closed by reply_stall_timeout (also in timeouts_total).
  uint64_t reply_stall_closes_total = 0;

  // Authentication: connections granted an identity, and refusals (no or a
  // wrong credential, a request before AUTH, a version-1 client).
  uint64_t auth_granted_total = 0;
  uint64_t auth_refused_total = 0;

  // Request latency: counts per bucket of kServerLatencyBucketsSeconds (not
  // cumulative; the last one is +Inf), their sum, and their number.
  std::array<uint64_t, kServerLatencyBucketsSeconds.size() + 1> latency_buckets{};
  uint64_t latency_count = 0;
  double latency_sum_seconds = 0;
};

// One open connection, for diagnostics and tests.
struct ConnectionInfo {
  uint64_t id = 0;           // 1, 2, ... in accept order
  std::string peer_address;  // "127.0.0.1:53412"
  std::string peer_name;     // from HELLO; empty before it
  uint64_t buffered_bytes = 0;
  uint64_t reply_budget_bytes = 0;  // reserved from the reply budget by its requests
  uint32_t in_flight = 0;           // requests decoded and not fully answered
  bool reading = false;             // false while back-pressure (or a drain) stops reading
  bool write_blocked = false;       // waiting for the socket to take more bytes
  uint64_t requests_total = 0;      // answered on this connection
  uint64_t sent_bytes_total = 0;
};

class Server {
 public:
  // Binds options.listen and serves until Stop(). `service` must not be null
  // and is shared with the server until Stop returns. Errors: kInvalidArgument
  // (bad options or address), kUnavailable (address in use or not on this host,
  // a name that does not resolve), kPermissionDenied (a privileged port),
  // kResourceExhausted (no threads). The port is listening when this returns.
  static Result<std::unique_ptr<Server>> Start(std::shared_ptr<ReadService> service,
                                               const ServerOptions& options = {});

  ~Server();  // Stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound port (the chosen one when options.listen asked for port 0).
  uint16_t port() const;

  // Closes the listener; stops reading new requests; lets requests already
  // decoded be answered until options.drain_timeout; closes every connection;
  // waits for ReadService calls in progress to return (it cannot interrupt
  // them); joins every thread. Idempotent. Not from a loop or service thread
  // (it waits for them).
  void Stop();

  ServerCounters Counters() const;
  std::vector<ConnectionInfo> Connections() const;

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary

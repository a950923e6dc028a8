#pragma once

// The seam between a reader of cache nodes and the wire it reads them over.
// A PeerTransport connects to a node by the address in its record; the
// PeerConnection it returns carries the peer protocol's requests (protocol.h,
// docs/protocol.md): batched READ, STAT, PING, after HELLO and, where the node
// requires it, AUTH (peer_auth.h), which are the transport's to run.
//
// Implementations: TCP (PeerClient, peer_client.h, with TLS when the options
// carry a TlsContext: TLS is a property of TCP, not a transport), returned by
// TcpPeerTransport(); tests/testing/scripted_peer_transport.h, which wraps
// another to produce faults a real wire cannot be made to (a timeout in the
// middle of a batch, bytes corrupted on the way). docs/architecture.md, "Where
// to add things", says what a new transport must do.
//
// The contract every implementation keeps, and what the fetcher relies on:
//  - Read returns an outcome per item in request order, each OK item's bytes
//    checked against its checksum when verify_checksums (PeerReadResult::
//    Assemble), never bytes it did not check;
//  - a failure of the whole call is a non-OK Result; after one that broke the
//    connection, connected() is false and the next call reconnects;
//  - limits() are the limits agreed at HELLO: callers size batches with them.
//
// Thread safety: a PeerConnection is used by one thread at a time; a
// PeerTransport may be used by any number of threads at once.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/tls.h"
#include "granary/protocol/protocol.h"

namespace granary {

struct PeerClientOptions {
  // Sent in HELLO: 1..255 bytes of graphic ASCII, e.g. "sidecar/job-42@gpu-3".
  std::string client_name = "granary-client";
  // TCP connect plus the HELLO exchange.
  std::chrono::milliseconds connect_timeout{5'000};
  // One call's whole round trip: the request sent and the reply received.
  std::chrono::milliseconds call_timeout{30'000};
  // What this client accepts from the server; combined with the server's.
  ProtocolLimits limits;
  // Check each OK item's checksum (when the server sent one) against its bytes.
  bool verify_checksums = true;
  // Presented when a node requires authentication (protocol version 2,
  // peer_auth.h): the cluster key first, else the token. None: such a node is
  // refused with kPermissionDenied saying what to configure.
  ClientCredentials credentials;
  // Set: speak TLS to the node (its TlsContext::ForClient); the node must
  // serve TLS (the cache node's tls_cert_file). Null: plain TCP.
  std::shared_ptr<const TlsContext> tls;

  // Positive timeouts, valid limits, a name the protocol accepts.
  Status Validate() const;
};

// The answer to one READ: an outcome per item, in request order, and the OK
// items' bytes.
class PeerReadResult {
 public:
  const ReadReply& reply() const { return reply_; }
  size_t size() const { return reply_.items.size(); }
  const Status& status(size_t item) const { return reply_.items.at(item).status; }
  // The item's bytes: a view into payload(), empty for a failed item.
  std::string_view bytes(size_t item) const;
  // The items' bytes, concatenated in item order, as received (an item that
  // failed its checksum here keeps its bytes in the payload; bytes() hides them).
  const std::string& payload() const { return payload_; }

  // What every transport does with a READ_REPLY and its payload (the items'
  // bytes in item order): find each item's bytes and, with `verify`, check
  // each OK item's checksum, turning a mismatch into a kCorruption item that
  // names `from` (so bytes that went bad on the way are never used). The
  // reply must already match its request (CheckReadReply).
  static PeerReadResult Assemble(ReadReply reply, std::string payload, bool verify,
                                 std::string_view from);

 private:
  ReadReply reply_;
  std::string payload_;
  std::vector<uint64_t> offsets_;  // where each item's bytes start in payload_
};

// One connection to one cache node.
class PeerConnection {
 public:
  virtual ~PeerConnection() = default;

  // One READ round trip. Per-item failures are in the result; a non-OK Result
  // means the whole request failed (the server's ERROR, or the connection).
  virtual Result<PeerReadResult> Read(const ReadRequest& request) = 0;
  // STAT of the node (default) or of one dataset.
  virtual Result<StatReply> Stat(const StatRequest& request = {}) = 0;
  // PING → PONG.
  virtual Status Ping() = 0;
  // Closes the connection now; the next call reconnects.
  virtual void Close() = 0;
  // Whether the connection is open (false after a call that broke it).
  virtual bool connected() const = 0;
  // The limits agreed with the node.
  virtual const ProtocolLimits& limits() const = 0;
};

// How to reach cache nodes.
class PeerTransport {
 public:
  virtual ~PeerTransport() = default;
  // "tcp", ...: for logs, metrics and messages.
  virtual std::string_view name() const = 0;
  // Connects to the node at `address` (its record's "host:port") and does
  // HELLO (and AUTH), within options.connect_timeout.
  virtual Result<std::unique_ptr<PeerConnection>> Connect(std::string_view address,
                                                          const PeerClientOptions& options) = 0;
};

// TCP, with TLS when the options carry a TlsContext: PeerClient.
std::shared_ptr<PeerTransport> TcpPeerTransport();

}  // namespace granary

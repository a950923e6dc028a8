#pragma once

// PeerClient: a blocking client of a cache node's TCP protocol (protocol.h,
// docs/protocol.md) over plain POSIX sockets. One connection, one request at a
// time: send a request, wait for its reply, return it. No event loop, no
// threads of its own.
//
// Who calls it: the sidecar (a client per cache node it reads from), cache
// nodes reading from their peers, the CLI and tests. A caller that wants
// requests in flight on several nodes at once uses one client per node (and
// per thread).
//
// Behaviour:
//  - Connect opens a TCP connection with connect_timeout and does the HELLO
//    handshake within the same deadline: it offers every version this build
//    speaks, checks the server's choice and its advertised limits, and from
//    then on encodes requests and decodes replies with CommonLimits(own,
//    server's). A READ that those limits reject fails before anything is sent.
//  - Every call (Read, Ping, Stat) has call_timeout for the whole round trip.
//    On a timeout the connection is closed (a late reply must not be taken for
//    the next request's) and the call fails with kDeadlineExceeded.
//  - A connection that breaks (the server closed or reset it, sent bytes that
//    are not the protocol, answered another request) fails the call with a
//    Status and is closed; the client never crashes and never returns bytes it
//    did not check. The next call reconnects (one attempt, connect_timeout).
//    A connection the server closed while the client was idle (its idle
//    timeout, a restart) is noticed before the next request is sent and
//    replaced then, so that call does not fail for it.
//  - An ERROR from the server for a request is that call's Status; the
//    connection stays open unless the ERROR says it is closing.
//  - READ replies are checked against the request (CheckReadReply); with
//    verify_checksums, an OK item whose checksum does not match its bytes
//    becomes a kCorruption item. Payload bytes are received straight into the
//    result (PayloadMode::kDetached): one copy, from the kernel.
//
// Status codes: kUnavailable (cannot connect, connection closed or reset),
// kDeadlineExceeded (a timeout), kInvalidArgument / kOutOfRange (a request the
// limits reject; a server that does not follow the protocol), kVersionMismatch
// (no common version), and whatever the server's ERROR says.
//
// Thread safety: a PeerClient is used by one thread at a time (calls are not
// synchronised; use one client per thread). Different clients are independent.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/net_address.h"
#include "granary/core/status.h"
#include "granary/peer/peer_auth.h"
#include "granary/peer/peer_transport.h"
#include "granary/peer/tls.h"
#include "granary/protocol/protocol.h"

namespace granary {

class PeerClient final : public PeerConnection {
 public:
  // Connects to `address` ("host:port", ParseNetAddress in net_address.h) and does HELLO.
  static Result<PeerClient> Connect(std::string_view address,
                                    const PeerClientOptions& options = {});

  PeerClient(PeerClient&&) noexcept;
  PeerClient& operator=(PeerClient&&) noexcept;
  PeerClient(const PeerClient&) = delete;
  PeerClient& operator=(const PeerClient&) = delete;
  ~PeerClient() override;

  // One READ round trip. Per-item failures are in the result; a non-OK Result
  // means the whole request failed (the server's ERROR, or the connection).
  Result<PeerReadResult> Read(const ReadRequest& request) override;
  // PING → PONG.
  Status Ping() override;
  // STAT of the node (default) or of one dataset.
  Result<StatReply> Stat(const StatRequest& request = {}) override;

  // Closes the connection now; the next call reconnects.
  void Close() override;

  bool connected() const override { return fd_.valid(); }
  const NetAddress& address() const { return address_; }
  // Of the current connection (from its HELLO_REPLY); kept after it closes.
  uint16_t version() const { return version_; }
  const std::string& server_name() const { return server_name_; }
  // What the node granted this connection ("cluster", "namespace/<name>"), or
  // empty when it required no authentication.
  const std::string& scope() const { return scope_; }
  // CommonLimits(own, server's): size batches with these.
  const ProtocolLimits& limits() const override { return limits_; }
  // Connections opened after the first.
  uint64_t reconnects() const { return reconnects_; }

 private:
  PeerClient(NetAddress address, PeerClientOptions options);

  using Clock = std::chrono::steady_clock;

  // Opens a connection and does HELLO, unless one is open and still usable.
  Status EnsureConnected();
  Status Open(Clock::time_point deadline);
  // Sends `request` and receives its reply; closes the connection on any
  // failure but the server's non-closing ERROR for it.
  // `payload` receives a READ_REPLY's payload (null: none is expected).
  Result<ResponseMessage> Call(const RequestMessage& request, std::string* payload);
  Result<ResponseMessage> Exchange(uint64_t request_id, const std::string& bytes,
                                   std::string* payload, Clock::time_point deadline,
                                   std::string_view doing);
  Status SendAll(std::string_view bytes, Clock::time_point deadline, std::string_view doing);
  // Reads more bytes into in_; 0 means the server closed the connection.
  Result<size_t> Receive(Clock::time_point deadline, std::string_view doing);
  // Fills dst[got, size) from the socket.
  Status ReceiveInto(char* dst, size_t got, size_t size, Clock::time_point deadline,
                     std::string_view doing);
  Status Fail(Status status);
  // The TLS handshake over a fresh connection.
  Status StartTls(Clock::time_point deadline);
  // Waits until a blocked TLS operation may go on; false at the deadline.
  Result<bool> WaitTls(TlsWant want, Clock::time_point deadline);
  Status SendAllTls(std::string_view bytes, Clock::time_point deadline, std::string_view doing);
  // Up to `size` decrypted bytes; 0: the server closed the connection.
  Result<size_t> ReadTls(char* dst, size_t size, Clock::time_point deadline,
                         std::string_view doing);

  NetAddress address_;
  PeerClientOptions options_;
  ScopedFd fd_;
  std::unique_ptr<TlsStream> tls_;  // over fd_ when options_.tls
  FrameDecoder decoder_{FrameDirection::kResponses};
  std::string in_;       // bytes received and not yet fed to decoder_
  size_t in_begin_ = 0;  // first unfed byte of in_
  uint16_t version_ = 0;
  std::string server_name_;
  std::string scope_;
  ProtocolLimits limits_;
  uint64_t next_request_id_ = 1;
  uint64_t connections_ = 0;
  uint64_t reconnects_ = 0;
};

}  // namespace granary

#pragma once

// Connected libfabric endpoints (FI_EP_MSG) for the peer protocol, and the
// listener a cache node accepts them on (docs/transport.md, "libfabric").
// No libfabric header here: the daemons and the fetcher include this one.
//
// What moves how:
//  - a request or a reply frame (header and body, never a payload) is one
//    message (fi_send into a receive the peer posted), at most
//    max_message_bytes;
//  - a READ's payload is written by the node straight into the reader's
//    landing window with RMA (fi_write), before the node sends the reply
//    frame; the endpoint asks for send-after-write ordering (FI_ORDER_SAW),
//    so a reply never arrives before its bytes.
// The reader's window is registered once per connection and kept (registered
// again only when a READ needs more than it holds); on providers that need
// local buffers registered too (FI_MR_LOCAL: verbs), the node's send side
// stages through a buffer of its own, also registered once.
//
// Every call takes a deadline; a call past it fails with kDeadlineExceeded and
// leaves the endpoint broken (a late completion must not be taken for a later
// operation's): close it. A peer that disconnects fails calls with
// kUnavailable. Messages name the provider, the peer and what to check.
//
// Thread safety: an Endpoint is used by one thread at a time; a Listener's
// Accept by one thread; Close may be called from any thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "granary/core/net_address.h"
#include "granary/core/status.h"
#include "granary/protocol/protocol_format.h"

namespace granary::fabric {

using Deadline = std::chrono::steady_clock::time_point;

// The providers this build names in messages and docs; any provider libfabric
// offers with FI_EP_MSG, FI_MSG and FI_RMA works.
inline constexpr std::string_view kDefaultProvider = "tcp";

// Whether `provider` (e.g. "tcp", "verbs") offers connected endpoints with
// messages and RMA on this host: OK, or kUnavailable naming what is missing
// (no such provider, no device) and what to do. Cheap enough to call at start.
Status ProbeProvider(const std::string& provider);

// Where a READ's payload may be written: a region the reader registered for
// remote writes. Sent ahead of a READ request (docs/transport.md).
struct RemoteWindow {
  uint64_t address = 0;  // the RMA address of byte 0 (a virtual address or 0)
  uint64_t key = 0;      // the registration's remote key
  uint64_t length = 0;   // bytes

  friend bool operator==(const RemoteWindow&, const RemoteWindow&) = default;
};

// A reader's request message: its window (all zero unless the frame is a
// READ) and then the frame. Replies are frames alone.
inline constexpr size_t kWindowBytes = 24;
std::string EncodeRequestMessage(const RemoteWindow& window, std::string_view frame);
// kInvalidArgument when the message is shorter than a window.
Result<RemoteWindow> DecodeRequestMessage(std::string_view message, std::string_view* frame);

// The largest message of a connection whose frames' bodies are at most
// `max_body_bytes` (ProtocolLimits::max_body_bytes): a window and a frame
// header and body. Both ends size their receive buffers with it.
inline size_t MessageBytesFor(uint32_t max_body_bytes) {
  return kWindowBytes + protocol_format::kFrameHeaderSize + size_t{max_body_bytes};
}

struct EndpointOptions {
  std::string provider = std::string(kDefaultProvider);
  // The largest message either side sends (a frame's header and body).
  size_t max_message_bytes = 1 << 20;
};

class Endpoint {
 public:
  // Connects to a listener at `address` within the deadline.
  static Result<std::unique_ptr<Endpoint>> Connect(const NetAddress& address,
                                                   const EndpointOptions& options,
                                                   Deadline deadline);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // One message, at most max_message_bytes.
  Status Send(std::string_view message, Deadline deadline);
  // The next message into `out` (replacing its contents). kUnavailable when
  // the peer disconnected.
  Status Receive(std::string& out, Deadline deadline);

  // The landing window, at least `bytes` long: registered on first use and
  // kept; registered again (larger) only when `bytes` exceeds it.
  Result<RemoteWindow> Window(uint64_t bytes);
  // The window's bytes, as the peer wrote them (valid until the next Window).
  std::string_view WindowBytes(uint64_t length) const;

  // Writes `bytes` into the peer's `window` at `offset` (RMA) and waits for
  // the write to complete locally. kOutOfRange when it does not fit.
  Status Write(const RemoteWindow& window, uint64_t offset, std::string_view bytes,
               Deadline deadline);

  // Disconnects now; later calls fail with kUnavailable. Any thread.
  void Close();
  bool broken() const;
  // "host:port" of the other side, for messages.
  const std::string& peer() const;
  const std::string& provider() const;
  // Registrations made (the window's and the staging buffer's): a test reads
  // that they are cached, not made per request.
  uint64_t registrations() const;

  struct Impl;

 private:
  explicit Endpoint(std::unique_ptr<Impl> impl);
  friend class Listener;
  std::unique_ptr<Impl> impl_;
};

class Listener {
 public:
  // Listens on `address` (port 0: any free port; see port()).
  static Result<std::unique_ptr<Listener>> Listen(const NetAddress& address,
                                                  const EndpointOptions& options);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The next connection, accepted; kDeadlineExceeded when none came by the
  // deadline (call again), kUnavailable after Close.
  Result<std::unique_ptr<Endpoint>> Accept(Deadline deadline);
  // Stops listening; a blocked Accept returns soon after. Any thread.
  void Close();
  uint16_t port() const;

  struct Impl;

 private:
  explicit Listener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary::fabric

#pragma once

// HandoffServer: the cache node's local Unix socket (`local_socket`) that
// hands read-only chunk file descriptors to a sidecar on the same host
// (chunk_handoff.h; docs/protocol.md, "Chunk handoff"; docs/cachenode.md,
// "Same-host sidecars").
//
// It owns the socket and its threads and knows nothing of datasets: each
// OPEN_CHUNK is answered by the resolver the cache node passes in, with the
// peer's credentials (SO_PEERCRED, taken once at accept), so the policy (who
// may read which dataset, which chunks are on disk) lives with the node's
// state. A malformed frame gets an error reply and the connection closed; a
// well-framed request that fails (unknown dataset, not on disk, refused) gets
// its error and the connection stays. The server never crashes on input and
// never blocks other connections on one slow peer (a thread per connection,
// at most max_connections).
//
// Idle and greedy peers (docs/cachenode.md, "Same-host sidecars"): a
// connection is idle from accept, and from the end of each reply, until a
// whole request has arrived; idle for idle_timeout, it is closed (a request
// being resolved or answered is never idle, but a reply the peer does not take
// within idle_timeout closes it too). Places are given by uid
// (ConnectionLimits): an unprivileged uid holds at most max_per_uid
// connections, and the last `reserved` places are kept for privileged peers:
// uid 0, the node's own uid, and any uid `privileged` says yes to (the cache
// node: the owners of the datasets it stages).
//
// Who calls it: CacheNode (start, stop); tests.
//
// Thread safety: Start/Stop from one thread; the resolver is called from
// connection threads concurrently and must be thread-safe; counters() from
// any thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "granary/config/cachenode_config.h"  // kDefaultHandoffMaxConnections
#include "granary/core/file.h"
#include "granary/core/status.h"
#include "granary/protocol/chunk_handoff.h"
#include "granary/protocol/unix_socket.h"

namespace granary {

struct HandoffServerOptions {
  std::string path;      // the socket file; its directory must exist
  uint32_t mode = 0666;  // who may connect; requests are authorized per peer uid anyway
  uint32_t max_connections = kDefaultHandoffMaxConnections;
  // 0: max_connections / 4. Connections one unprivileged uid may hold.
  uint32_t max_per_uid = 0;
  // Places only privileged peers may take: max_connections / 8 (at least 1).
  // An explicit value here is used as is.
  std::optional<uint32_t> reserved;
  // A connection with no request or reply in progress for this long is closed.
  std::chrono::milliseconds idle_timeout{60000};
  // Uids besides 0 and the node's own that are privileged (may be null).
  // Called at accept, on the accept thread: it must be quick.
  std::function<bool(uint32_t uid)> privileged;
};

struct HandoffServerCounters {
  uint64_t handed = 0;                // descriptors sent
  uint64_t refused = 0;               // requests answered with an error by the resolver
  uint64_t protocol_errors = 0;       // malformed frames (connection closed)
  uint64_t rejected_connections = 0;  // refused at accept, for any reason below
  uint64_t rejected_full = 0;         // max_connections reached
  uint64_t rejected_uid = 0;          // the peer's uid at max_per_uid, or only reserved places left
  uint64_t idle_closes = 0;           // connections closed after idle_timeout
  uint64_t open_connections = 0;      // now
};

class HandoffServer {
 public:
  using Resolver = std::function<Result<ScopedFd>(const PeerCredentials& peer,
                                                  const handoff::OpenChunkRequest& request)>;

  // Listens on options.path (a stale socket file from a crash is replaced; a
  // live one or any other file is kAlreadyExists).
  static Result<std::unique_ptr<HandoffServer>> Start(HandoffServerOptions options,
                                                      Resolver resolver);
  ~HandoffServer();  // Stop()
  HandoffServer(const HandoffServer&) = delete;
  HandoffServer& operator=(const HandoffServer&) = delete;

  // Stops accepting, closes every connection, joins the threads, removes the
  // socket file. Idempotent.
  void Stop();

  const std::string& path() const;
  HandoffServerCounters counters() const;

 private:
  struct Impl;
  explicit HandoffServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace granary

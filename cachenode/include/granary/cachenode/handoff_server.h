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
#include <string>

#include "granary/core/chunk_handoff.h"
#include "granary/core/file.h"
#include "granary/core/status.h"
#include "granary/core/unix_socket.h"

namespace granary {

struct HandoffServerOptions {
  std::string path;      // the socket file; its directory must exist
  uint32_t mode = 0666;  // who may connect; requests are authorized per peer uid anyway
  uint32_t max_connections = 64;
};

struct HandoffServerCounters {
  uint64_t handed = 0;           // descriptors sent
  uint64_t refused = 0;          // requests answered with an error by the resolver
  uint64_t protocol_errors = 0;  // malformed frames (connection closed)
  uint64_t rejected_connections = 0;
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

#pragma once

// ConnectionThreads: one thread per accepted connection, for the daemons'
// Unix-socket servers that serve with blocking I/O (the sidecar's client
// socket, the cache node's chunk handoff socket). It owns the connections'
// descriptors and threads: Start runs serve(fd) on a new thread unless the
// limit is reached; when serve returns, the connection is shut down and closed
// and its thread is joined by the next ReapFinished (from the accept loop) or
// by StopAll. StopAll shuts every open connection down (so a serve blocked in
// recv returns) and joins every thread.
//
// Who calls it: sidecar/src/sidecar.cc, cachenode/src/handoff_server.cc.
//
// Thread safety: Start, ReapFinished and StopAll from the accept loop's thread
// (StopAll after that loop has ended); open() from any thread. serve runs on
// the connection's own thread and must return once its descriptor is shut
// down.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "granary/core/file.h"

namespace granary {

class ConnectionThreads {
 public:
  ConnectionThreads() = default;
  ~ConnectionThreads() { StopAll(); }
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  // Serves `fd` with serve(fd.get()) on a thread of its own and returns true;
  // false (fd left with the caller) when `max_open` connections are open.
  bool Start(ScopedFd& fd, size_t max_open, std::function<void(int fd)> serve);

  // Joins the threads whose connections have ended.
  void ReapFinished();

  // Shuts every open connection down (their serve calls return soon).
  void ShutdownAll();
  // Joins every thread (after ShutdownAll, or once the connections end).
  void JoinAll();
  // Both. Idempotent.
  void StopAll() {
    ShutdownAll();
    JoinAll();
  }

  size_t open() const;

 private:
  void Finished(uint64_t id);

  mutable std::mutex mu_;
  std::map<uint64_t, int> fds_;              // guarded by mu_: open connections
  std::map<uint64_t, std::thread> threads_;  // guarded by mu_
  std::vector<uint64_t> finished_;           // guarded by mu_: threads to join
  uint64_t next_ = 1;                        // guarded by mu_
};

}  // namespace granary

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
// Admission by uid (ConnectionLimits, for sockets whose peers are local users
// known by SO_PEERCRED): one unprivileged uid holds at most `per_uid`
// connections, and all unprivileged uids together at most `max_open -
// reserved`, so the last `reserved` places are only for privileged peers
// (root, the daemon's own uid, and whoever the caller also trusts). One user
// can then never lock out root, the daemon's uid, or another user.
//
// Who calls it: UnixAcceptLoop (unix_accept_loop.h), for sidecar/src/sidecar.cc
// and cachenode/src/handoff_server.cc.
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

// The places of one socket. DefaultFor(max) is the rule the daemons use:
// per_uid = max/4 and reserved = max/8 (each at least 1 when max allows it).
struct ConnectionLimits {
  size_t max_open = 0;  // connections at once, all peers
  size_t per_uid = 0;   // connections at once of one unprivileged uid
  size_t reserved = 0;  // places only privileged peers may take

  static ConnectionLimits DefaultFor(size_t max_open);
};

// Why Start refused a connection.
enum class Admission {
  kAdmitted,
  kFull,         // max_open reached
  kUidFull,      // this unprivileged uid holds per_uid connections
  kReservedOnly  // only the reserved places are left, and the peer is not privileged
};

class ConnectionThreads {
 public:
  ConnectionThreads() = default;
  ~ConnectionThreads() { StopAll(); }
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  // Serves `fd` with serve(fd.get()) on a thread of its own and returns true;
  // false (fd left with the caller) when `max_open` connections are open.
  bool Start(ScopedFd& fd, size_t max_open, std::function<void(int fd)> serve);

  // The same under `limits` for a peer of `uid`; kAdmitted (fd taken) or why
  // not (fd left with the caller). `privileged` peers pass the per-uid and
  // reserve checks; only max_open bounds them.
  Admission Start(ScopedFd& fd, uint32_t uid, bool privileged, const ConnectionLimits& limits,
                  std::function<void(int fd)> serve);

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
  // Open connections of `uid`.
  size_t open_of(uint32_t uid) const;

 private:
  struct Open {
    int fd = -1;
    uint32_t uid = 0;
    bool privileged = true;
  };
  void Launch(ScopedFd& fd, Open open, std::function<void(int fd)> serve);  // mu_ held
  void Finished(uint64_t id);

  mutable std::mutex mu_;
  std::map<uint64_t, Open> fds_;             // guarded by mu_: open connections
  std::map<uint32_t, size_t> per_uid_;       // guarded by mu_: open unprivileged, by uid
  size_t unprivileged_ = 0;                  // guarded by mu_
  std::map<uint64_t, std::thread> threads_;  // guarded by mu_
  std::vector<uint64_t> finished_;           // guarded by mu_: threads to join
  uint64_t next_ = 1;                        // guarded by mu_
};

}  // namespace granary

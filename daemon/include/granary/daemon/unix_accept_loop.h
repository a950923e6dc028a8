#pragma once

// UnixAcceptLoop: the accept loop of the daemons' Unix-socket servers (the
// sidecar's client socket, the cache node's chunk handoff socket). Its thread
// polls the listening socket and a wake-up eventfd, accepts each connection,
// names its peer (SO_PEERCRED) and admits it into a ConnectionThreads under
// ConnectionLimits, where it is served on a thread of its own. What a server
// does differently is in the options: socket options set before admission,
// who else is privileged, how a refused peer is told why, what serving is.
//
// Who calls it: sidecar/src/sidecar.cc, cachenode/src/handoff_server.cc.
//
// Thread safety: Start and Stop from the owning thread. The callbacks run on
// the accept thread (prepare, unnamed, refused) or on the connection's thread
// (serve). The listening socket and the ConnectionThreads belong to the
// caller and must outlive the loop; Stop leaves the admitted connections open
// (the caller shuts them down, in the order its other threads need).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "granary/core/file.h"
#include "granary/core/log.h"
#include "granary/core/status.h"
#include "granary/daemon/connection_threads.h"

namespace granary {

struct UnixAcceptLoopOptions {
  // Names the socket in logs: "the sidecar socket '/run/granary/sidecar.sock'".
  std::string socket_name = "the socket";
  // The accept thread's name (thread_name.h; at most 15 bytes).
  std::string thread_name = "accept";
  std::shared_ptr<spdlog::logger> log;  // default: GetLogger("daemon")
  ConnectionLimits limits;
  // Peers besides root and this process's uid that pass the per-uid and
  // reserve checks (only max_open bounds them). Empty: none.
  std::function<bool(uint32_t uid)> privileged;
  // Before the peer is named and admitted: socket options. Empty: none.
  std::function<void(int fd)> prepare;
  // SO_PEERCRED failed; the connection is then closed without a word.
  std::function<void(const Status& why)> unnamed;
  // Admission refused `uid` (why: not kAdmitted): tell the peer on `fd`,
  // without blocking; it is closed after.
  std::function<void(int fd, uint32_t uid, Admission why)> refused;
  // Serves an admitted connection on its own thread; `id` numbers the
  // connections from 1, for logs. Must return once `fd` is shut down.
  std::function<void(uint64_t id, int fd)> serve;
};

class UnixAcceptLoop {
 public:
  // Starts the accept thread on `listen_fd` (a listening Unix socket).
  // kInvalidArgument without a serve callback; the eventfd's errno.
  static Result<std::unique_ptr<UnixAcceptLoop>> Start(int listen_fd,
                                                       ConnectionThreads* connections,
                                                       UnixAcceptLoopOptions options);
  ~UnixAcceptLoop();  // Stop()
  UnixAcceptLoop(const UnixAcceptLoop&) = delete;
  UnixAcceptLoop& operator=(const UnixAcceptLoop&) = delete;

  // Wakes the accept thread and joins it: nothing is accepted after. The
  // admitted connections stay open. Idempotent.
  void Stop();

 private:
  UnixAcceptLoop(int listen_fd, ConnectionThreads* connections, UnixAcceptLoopOptions options,
                 ScopedFd wake_fd);
  void Run();
  void Admit(ScopedFd fd);

  const int listen_fd_;
  ConnectionThreads* const connections_;
  const UnixAcceptLoopOptions options_;
  const ScopedFd wake_fd_;
  std::atomic<bool> stopping_{false};
  uint64_t next_id_ = 1;  // accept thread only
  std::thread thread_;
};

}  // namespace granary

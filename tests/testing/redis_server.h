#pragma once

// RedisServer: a real redis-server for tests, on a free 127.0.0.1 port, with its
// own temporary directory. It runs with `appendonly yes` and `appendfsync
// always`, so every write Redis acknowledged survives Stop()/Kill() and Start()
// on the same port and directory. The destructor kills the server and removes
// the directory. Every wait is bounded.
//
// The binary is $GRANARY_REDIS_SERVER, else /usr/bin/redis-server, else
// redis-server on $PATH.
//
// Start() and Restart() wait until the server answers PING and its INFO reports
// our child's process id, so a server another test process started on the
// same port is never mistaken for ours.
//
// Call Start() and Restart() from a thread that outlives the server (the
// test's main thread): the server is started with PR_SET_PDEATHSIG, so it is
// killed when that thread exits, and a crashed test leaves no server behind.
//
// Thread safety: one test thread owns it; port() and url() may be read from any
// thread while it lives.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "granary/core/status.h"
#include "testing/test_util.h"

namespace granary::testing {

class RedisServer {
 public:
  // Starts a server; `extra_args` are appended to its command line (e.g.
  // {"--requirepass", "secret"}).
  static Result<std::unique_ptr<RedisServer>> Start(std::vector<std::string> extra_args = {});
  // The redis-server binary the fixture runs (see above).
  static std::string Binary();
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  uint16_t port() const { return port_; }
  // redis://127.0.0.1:<port>/<db>, plus `query` (e.g. "?prefix=t1") if given.
  std::string url(int db = 0, const std::string& query = "") const;
  const std::string& dir() const { return dir_.path(); }
  bool running() const { return pid_ > 0; }

  // SIGTERM and wait for exit (Redis flushes and exits cleanly).
  Status Stop();
  // SIGKILL and wait: a crash. Acknowledged writes are on disk anyway.
  Status Kill();
  // Stops it if it is running (SIGTERM), then starts it again on the same port
  // and directory and waits until it answers. After Kill(), a crash restart.
  // Retries a few times if the port is taken meanwhile, then fails saying so.
  Status Restart();

 private:
  explicit RedisServer(std::vector<std::string> extra_args);
  Status Launch();
  Status WaitReady();
  Status Signal(int sig);
  std::string ReadLog() const;

  TempDir dir_;
  std::vector<std::string> extra_args_;
  std::string password_;  // --requirepass in extra_args_, for INFO
  uint16_t port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace granary::testing

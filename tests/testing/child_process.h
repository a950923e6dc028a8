#pragma once

// ChildProcess: a function run in a forked child, for tests that need a second
// process on the same files (a SQLite store shared by two processes). The
// child is always reaped: the destructor kills (SIGKILL) and waits for a child
// still running, so a failed assertion never leaves one behind.
//
// The child runs body(control_fd) and _exits with its return value, without
// running static destructors or GoogleTest's teardown. control_fd is the
// child's end of a socket pair with the parent: it becomes readable (a byte,
// or end of file) once the parent calls RequestStop() or dies, so a child that
// loops should poll it and return; and a byte the child sends on it ends the
// parent's AwaitReady(). The child is also killed (PR_SET_PDEATHSIG) when the
// thread that started it exits.
//
// fork() copies only the calling thread: start children while the test runs
// no other threads, and before it opens the SQLite files the child will use
// (SQLite connections must not cross a fork).
//
// Thread safety: one test thread owns it.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>

#include "granary/core/status.h"

namespace granary::testing {

class ChildProcess {
 public:
  static Result<std::unique_ptr<ChildProcess>> Start(std::function<int(int control_fd)> body);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Waits up to `timeout` for the child to send a byte on control_fd: OK, or
  // kUnavailable if it exited (or closed its end) first, kDeadlineExceeded.
  Status AwaitReady(std::chrono::milliseconds timeout);

  // Makes control_fd readable in the child. Idempotent.
  void RequestStop();

  // Waits up to `timeout` for the child to exit and reaps it: its exit code;
  // kInternal if a signal ended it; kDeadlineExceeded (after killing it) if it
  // did not exit in time; kFailedPrecondition if it was already reaped.
  Result<int> Wait(std::chrono::milliseconds timeout);

 private:
  ChildProcess(pid_t pid, int control_fd) : pid_(pid), control_fd_(control_fd) {}

  pid_t pid_;       // -1 once reaped
  int control_fd_;  // the parent's end of the socket pair; -1 once closed
};

}  // namespace granary::testing

#pragma once

// DaemonProcess: a test's handle on a real daemon binary (granary-cachenode,
// or any program) started with fork + exec, for integration suites that run
// real processes.
//
// The program's stdout and stderr go to a log file (appended to, so a node
// restarted on the same log keeps its whole history). When the test has failed
// by the time the handle is destroyed, the log's tail is printed to the test's
// stderr, so a failing run shows what the daemon said. The child is always
// gone when the handle is: the destructor kills (SIGKILL) and reaps a child
// still running, and fails the test if what this process logged holds a
// sanitizer report. It is also killed (PR_SET_PDEATHSIG) if the thread that
// started it dies, so a crashed test leaves nothing behind: start daemons
// from the test's main thread.
//
// The child gets no descriptor of the test but stdin (/dev/null), stdout and
// stderr (the log), whatever the test had open and whether or not it was
// CLOEXEC. Between fork and exec it calls only async-signal-safe functions, so
// starting a daemon while the test runs other threads (readers) is safe.
//
// Thread safety: one test thread owns it (Start, Terminate, Kill, Wait, the
// destructor). pid(), name() and log_path() may be read from any thread;
// ReadLog() too (it reads the file).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granary/core/status.h"

namespace granary::testing {

// The environment of a child process: the test's, with `overrides`
// ("KEY=value") replacing entries of the same key or added.
std::vector<std::string> ChildEnvironment(const std::vector<std::string>& overrides);

struct DaemonProcessOptions {
  std::string binary;             // absolute path, or a name looked up in $PATH
  std::vector<std::string> args;  // argv[1..]
  std::string log_path;           // stdout + stderr, created or appended to
  // "KEY=value" entries added to (or replacing in) the test's environment.
  std::vector<std::string> env;
  // For messages and the printed log ("node-1"); default: the binary's base name.
  std::string name;
  // When the handle is destroyed, fail the test if the log holds a sanitizer
  // report (AddressSanitizer, LeakSanitizer, UBSan's "runtime error:"), so a
  // report from a daemon the test then kills is not lost with its log.
  bool fail_on_sanitizer_report = true;
};

// How a reaped process ended.
struct ExitStatus {
  bool exited = false;  // by exit(): `code` is its status
  int code = -1;
  int signal = 0;  // else the signal that ended it

  bool ExitedWith(int c) const { return exited && code == c; }
  // "exit code 1" / "killed by signal 9 (Killed)".
  std::string ToString() const;
};

class DaemonProcess {
 public:
  // Forks and execs the binary. kNotFound/kPermissionDenied/kIoError if exec
  // failed (the child reports its errno before exiting), so a wrong path is an
  // error here rather than an exit code 127 later.
  static Result<std::unique_ptr<DaemonProcess>> Start(DaemonProcessOptions options);

  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return options_.name; }
  const std::string& log_path() const { return options_.log_path; }

  // Whether the child still runs (reaps it, without blocking, if it exited).
  bool Running();
  // How it ended, once reaped (Running() false, or after Wait/Terminate/Kill).
  const std::optional<ExitStatus>& exit_status() const { return exit_status_; }

  // Sends `sig` (e.g. SIGSTOP, SIGCONT, SIGHUP) if it still runs.
  Status Signal(int sig);

  // Waits up to `timeout` for it to exit and reaps it. kDeadlineExceeded if
  // it is still running then (it is left running).
  Result<ExitStatus> Wait(std::chrono::milliseconds timeout);

  // SIGTERM, then waits up to `timeout`. If it has not exited by then it is
  // killed (SIGKILL), reaped, and the result is kDeadlineExceeded saying so.
  // On an already reaped process: its exit status.
  Result<ExitStatus> Terminate(std::chrono::milliseconds timeout);

  // SIGKILL and reap (a crash). Its exit status (signal 9 unless it had exited).
  Result<ExitStatus> Kill();

  // The whole log (empty if it cannot be read), and its last `max_bytes`.
  std::string ReadLog() const;
  std::string LogTail(size_t max_bytes = 16 * 1024) const;

  // Prints the log's tail to stderr now if the current test has failed; the
  // destructor does the same. Printed at most once per handle.
  void PrintLogIfTestFailed();

  // The first line of a sanitizer report this process logged, or empty.
  std::string SanitizerReport() const;

 private:
  explicit DaemonProcess(DaemonProcessOptions options) : options_(std::move(options)) {}
  void Reaped(int wstatus);

  DaemonProcessOptions options_;
  pid_t pid_ = -1;  // -1 once reaped
  std::optional<ExitStatus> exit_status_;
  uint64_t log_start_ = 0;  // the log's size when this process started
  bool log_printed_ = false;
};

}  // namespace granary::testing

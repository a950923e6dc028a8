#include "testing/daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <thread>

#include "granary/core/file.h"

extern char** environ;

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Closes every descriptor from `first` up, in the child (async-signal-safe).
void CloseFrom(int first) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0u, 0u) == 0) return;
#endif
  for (int fd = first; fd < 65536; ++fd) ::close(fd);
}

// Writes the child's errno to the error pipe and exits (after a failed exec).
[[noreturn]] void ChildFail(int err_fd, int err) {
  const ssize_t ignored = ::write(err_fd, &err, sizeof(err));
  (void)ignored;
  ::_exit(127);
}

}  // namespace

std::vector<std::string> ChildEnvironment(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  for (const std::string& o : overrides) {
    const std::string key = o.substr(0, o.find('=') + 1);
    bool replaced = false;
    for (std::string& e : env) {
      if (e.compare(0, key.size(), key) == 0) {
        e = o;
        replaced = true;
      }
    }
    if (!replaced) env.push_back(o);
  }
  return env;
}

std::string ExitStatus::ToString() const {
  if (exited) return "exit code " + std::to_string(code);
  return "killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
}

Result<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(DaemonProcessOptions options) {
  if (options.binary.empty()) return Status::InvalidArgument("start a daemon: no binary given");
  if (options.log_path.empty()) {
    return Status::InvalidArgument("start " + options.binary + ": no log path given");
  }
  if (options.name.empty()) {
    const size_t slash = options.binary.rfind('/');
    options.name = slash == std::string::npos ? options.binary : options.binary.substr(slash + 1);
  }
  std::unique_ptr<DaemonProcess> process(new DaemonProcess(std::move(options)));
  const DaemonProcessOptions& o = process->options_;
  const std::string doing = "start " + o.name + " (" + o.binary + ")";

  // Everything the child needs is prepared here: after fork it may only call
  // async-signal-safe functions (the test may run other threads).
  std::vector<std::string> args;
  args.push_back(o.binary);
  args.insert(args.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = ChildEnvironment(o.env);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  GRANARY_ASSIGN_OR_RETURN(ScopedFd log,
                           OpenFile(o.log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  GRANARY_ASSIGN_OR_RETURN(process->log_start_, FileSize(log.get(), o.log_path));
  GRANARY_ASSIGN_OR_RETURN(ScopedFd null_fd, OpenFile("/dev/null", O_RDONLY | O_CLOEXEC));
  int err_pipe[2];
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) return Status::FromErrno(errno, doing + ": pipe");
  ScopedFd err_read(err_pipe[0]);
  ScopedFd err_write(err_pipe[1]);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, doing + ": fork");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the test died before prctl
    // Signals the test blocked or ignored must not reach the daemon so.
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGCHLD}) ::signal(sig, SIG_DFL);
    int err_fd = err_write.get();
    if (::dup2(null_fd.get(), 0) < 0 || ::dup2(log.get(), 1) < 0 || ::dup2(log.get(), 2) < 0) {
      ChildFail(err_fd, errno);
    }
    if (err_fd != 3) {
      if (::dup2(err_fd, 3) < 0) ChildFail(err_fd, errno);
      err_fd = 3;
      ::fcntl(err_fd, F_SETFD, FD_CLOEXEC);
    }
    CloseFrom(4);
    ::execvpe(argv[0], argv.data(), envp.data());
    ChildFail(err_fd, errno);
  }
  process->pid_ = pid;
  err_write.Reset();
  // The pipe closes without a byte when exec succeeded (CLOEXEC).
  int child_errno = 0;
  ssize_t got = 0;
  do {
    got = ::read(err_read.get(), &child_errno, sizeof(child_errno));
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof(child_errno))) {
    (void)process->Wait(milliseconds(5000));
    const Status failed = Status::FromErrno(child_errno, doing + ": exec");
    if (child_errno == ENOENT) return Status::NotFound(failed.message());
    if (child_errno == EACCES) return Status::PermissionDenied(failed.message());
    return failed;
  }
  return process;
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) (void)Kill();
  if (options_.fail_on_sanitizer_report) {
    const std::string report = SanitizerReport();
    if (!report.empty()) ADD_FAILURE() << name() << " logged a sanitizer report: " << report;
  }
  PrintLogIfTestFailed();
}

std::string DaemonProcess::SanitizerReport() const {
  const std::string whole = ReadLog();
  const std::string log = whole.substr(std::min<size_t>(whole.size(), log_start_));
  for (const char* marker : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                             "runtime error:", "WARNING: ThreadSanitizer"}) {
    const size_t at = log.find(marker);
    if (at == std::string::npos) continue;
    const size_t start = log.rfind('\n', at);
    const size_t begin = start == std::string::npos ? 0 : start + 1;
    return log.substr(begin, log.find('\n', at) - begin);
  }
  return {};
}

void DaemonProcess::Reaped(int wstatus) {
  ExitStatus s;
  if (WIFEXITED(wstatus)) {
    s.exited = true;
    s.code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    s.signal = WTERMSIG(wstatus);
  }
  exit_status_ = s;
  pid_ = -1;
}

bool DaemonProcess::Running() {
  if (pid_ <= 0) return false;
  int wstatus = 0;
  pid_t r = 0;
  do {
    r = ::waitpid(pid_, &wstatus, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    Reaped(wstatus);
    return false;
  }
  if (r < 0) {  // not our child any more (cannot happen unless someone reaped it)
    exit_status_ = ExitStatus{};
    pid_ = -1;
    return false;
  }
  return true;
}

Status DaemonProcess::Signal(int sig) {
  if (!Running()) {
    return Status::FailedPrecondition("signal " + name() + ": it is not running (" +
                                      (exit_status_ ? exit_status_->ToString() : "?") + ")");
  }
  if (::kill(pid_, sig) != 0) return Status::FromErrno(errno, "signal " + name());
  return Status::Ok();
}

Result<ExitStatus> DaemonProcess::Wait(milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  while (Running()) {
    if (steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded(name() + " (pid " + std::to_string(pid_) +
                                      ") did not exit within " + std::to_string(timeout.count()) +
                                      " ms");
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  if (!exit_status_) return Status::Internal("wait for " + name() + ": no exit status");
  return *exit_status_;
}

Result<ExitStatus> DaemonProcess::Terminate(milliseconds timeout) {
  if (Running()) ::kill(pid_, SIGTERM);
  auto status = Wait(timeout);
  if (status.ok()) return status;
  const pid_t was = pid_;
  (void)Kill();
  return Status::DeadlineExceeded(name() + " (pid " + std::to_string(was) +
                                  ") did not exit within " + std::to_string(timeout.count()) +
                                  " ms of SIGTERM; killed it with SIGKILL");
}

Result<ExitStatus> DaemonProcess::Kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int wstatus = 0;
    pid_t r = 0;
    do {
      r = ::waitpid(pid_, &wstatus, 0);
    } while (r < 0 && errno == EINTR);
    if (r == pid_) {
      Reaped(wstatus);
    } else {
      exit_status_ = ExitStatus{};
      pid_ = -1;
    }
  }
  if (!exit_status_) return Status::Internal("kill " + name() + ": no exit status");
  return *exit_status_;
}

std::string DaemonProcess::ReadLog() const {
  auto data = ReadFileToString(options_.log_path);
  return data.ok() ? *data : std::string();
}

std::string DaemonProcess::LogTail(size_t max_bytes) const {
  std::string log = ReadLog();
  if (log.size() <= max_bytes) return log;
  size_t start = log.size() - max_bytes;
  const size_t nl = log.find('\n', start);
  if (nl != std::string::npos && nl + 1 < log.size()) start = nl + 1;
  return "[... " + std::to_string(start) + " bytes before ...]\n" + log.substr(start);
}

void DaemonProcess::PrintLogIfTestFailed() {
  if (log_printed_ || !::testing::Test::HasFailure()) return;
  log_printed_ = true;
  std::cerr << "---- log of " << name() << " (" << options_.log_path << ") ----\n"
            << LogTail() << "---- end of the log of " << name() << " ----" << std::endl;
}

}  // namespace granary::testing

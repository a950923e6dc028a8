#include "testing/child_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

namespace granary::testing {

Result<std::unique_ptr<ChildProcess>> ChildProcess::Start(std::function<int(int control_fd)> body) {
  int fds[2];
  // A socket pair rather than a pipe: writing to a child that already exited
  // must be an error (MSG_NOSIGNAL), not SIGPIPE for the test. CLOEXEC:
  // programs other tests exec (redis-server) must not hold the parent's end
  // open. Children forked later without exec do inherit it, which is why
  // RequestStop sends a byte instead of relying on end of file alone.
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Status::FromErrno(errno, "socketpair for a child process");
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::FromErrno(err, "fork a child process");
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::close(fds[1]);
    int code = 126;
    try {
      code = body(fds[0]);
    } catch (...) {
      code = 126;
    }
    ::_exit(code);
  }
  ::close(fds[0]);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, fds[1]));
}

ChildProcess::~ChildProcess() {
  RequestStop();
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

Status ChildProcess::AwaitReady(std::chrono::milliseconds timeout) {
  const std::string who = "child process " + std::to_string(pid_);
  if (control_fd_ < 0) return Status::FailedPrecondition("await " + who + ": it was told to stop");
  pollfd pfd{control_fd_, POLLIN, 0};
  int n = 0;
  do {
    n = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "await " + who);
  if (n == 0) {
    return Status::DeadlineExceeded(who + " did not say it was ready within " +
                                    std::to_string(timeout.count()) + " ms");
  }
  char byte = 0;
  if (::recv(control_fd_, &byte, 1, 0) != 1) {
    return Status::Unavailable(who + " exited before it said it was ready");
  }
  return Status::Ok();
}

void ChildProcess::RequestStop() {
  if (control_fd_ < 0) return;
  const char byte = 'x';
  (void)::send(control_fd_, &byte, 1, MSG_NOSIGNAL);
  ::close(control_fd_);
  control_fd_ = -1;
}

Result<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return Status::FailedPrecondition("wait for a child process: already reaped");
  const std::string who = "child process " + std::to_string(pid_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int wstatus = 0;
  while (true) {
    const pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_) break;
    if (r < 0 && errno != EINTR) {
      pid_ = -1;
      return Status::FromErrno(errno, "wait for " + who);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
      return Status::DeadlineExceeded(who + " did not exit within " +
                                      std::to_string(timeout.count()) + " ms; killed it");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  return Status::Internal(who + " was ended by signal " + std::to_string(WTERMSIG(wstatus)));
}

}  // namespace granary::testing

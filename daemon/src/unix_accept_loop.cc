// UnixAcceptLoop (unix_accept_loop.h).

#include "granary/daemon/unix_accept_loop.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "granary/core/thread_name.h"
#include "granary/protocol/unix_socket.h"

namespace granary {
namespace {

// How often the loop reaps finished connections when nothing arrives.
constexpr int kPollMs = 1000;

}  // namespace

Result<std::unique_ptr<UnixAcceptLoop>> UnixAcceptLoop::Start(int listen_fd,
                                                              ConnectionThreads* connections,
                                                              UnixAcceptLoopOptions options) {
  if (!options.serve || connections == nullptr || listen_fd < 0) {
    return Status::InvalidArgument("UnixAcceptLoop for " + options.socket_name +
                                   " needs a listening socket, a ConnectionThreads and a serve "
                                   "callback (a bug in the caller)");
  }
  ScopedFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return Status::FromErrno(errno, "create the wake-up eventfd of " + options.socket_name);
  }
  if (options.log == nullptr) options.log = GetLogger("daemon");
  std::unique_ptr<UnixAcceptLoop> loop(
      new UnixAcceptLoop(listen_fd, connections, std::move(options), std::move(wake)));
  UnixAcceptLoop* raw = loop.get();
  loop->thread_ = std::thread([raw] {
    NameThisThread(raw->options_.thread_name);
    raw->Run();
  });
  return loop;
}

UnixAcceptLoop::UnixAcceptLoop(int listen_fd, ConnectionThreads* connections,
                               UnixAcceptLoopOptions options, ScopedFd wake_fd)
    : listen_fd_(listen_fd),
      connections_(connections),
      options_(std::move(options)),
      wake_fd_(std::move(wake_fd)) {}

UnixAcceptLoop::~UnixAcceptLoop() { Stop(); }

void UnixAcceptLoop::Stop() {
  stopping_ = true;
  const uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void UnixAcceptLoop::Run() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, kPollMs);
    connections_->ReapFinished();
    if (n < 0 && errno != EINTR) {
      options_.log->error("poll on {} failed: {}", options_.socket_name, ErrnoText(errno));
      return;
    }
    if (stopping_) return;
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    Result<ScopedFd> accepted = AcceptUnix(listen_fd_);
    if (!accepted.ok()) continue;
    Admit(std::move(*accepted));
  }
}

void UnixAcceptLoop::Admit(ScopedFd fd) {
  if (options_.prepare) options_.prepare(fd.get());
  Result<PeerCredentials> peer = PeerCredentialsOf(fd.get());
  if (!peer.ok()) {
    if (options_.unnamed) options_.unnamed(peer.status());
    return;
  }
  const uint32_t uid = peer->uid;
  const bool privileged =
      uid == 0 || uid == ::geteuid() || (options_.privileged && options_.privileged(uid));
  const uint64_t id = next_id_++;
  const Admission admitted =
      connections_->Start(fd, uid, privileged, options_.limits,
                          [serve = options_.serve, id](int conn) { serve(id, conn); });
  if (admitted != Admission::kAdmitted && options_.refused) {
    options_.refused(fd.get(), uid, admitted);
  }
}

}  // namespace granary

#include "granary/protocol/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "granary/core/names.h"

namespace granary {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(kMaxUnixSocketPath + 1 == sizeof(sockaddr_un::sun_path));

Status CheckPath(const std::string& path, std::string_view what) {
  if (path.empty()) {
    return Status::InvalidArgument(std::string(what) +
                                   ": the Unix socket path is empty; set it in the config or "
                                   "GRANARY_SOCKET");
  }
  if (path.size() > kMaxUnixSocketPath) {
    return Status::InvalidArgument(std::string(what) + " " + Quoted(path) +
                                   ": a Unix socket path holds at most " +
                                   std::to_string(kMaxUnixSocketPath) + " bytes, this one has " +
                                   std::to_string(path.size()) + "; use a shorter directory");
  }
  if (path.find('\0') != std::string::npos) {
    return Status::InvalidArgument(std::string(what) + " " + Quoted(path) +
                                   ": the path holds a NUL byte");
  }
  return Status::Ok();
}

sockaddr_un AddressOf(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());  // CheckPath: it fits, NUL after
  return addr;
}

// `const sockaddr*` of a sockaddr_un: the one cast the socket API needs.
const sockaddr* Generic(const sockaddr_un* addr) { return reinterpret_cast<const sockaddr*>(addr); }

// Whole milliseconds until `deadline`, rounded up (0 once it has passed).
std::chrono::milliseconds TimeLeft(Clock::time_point deadline) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return std::chrono::milliseconds(0);
  return std::chrono::ceil<std::chrono::milliseconds>(left);
}

Result<ScopedFd> NewSocket(std::string_view what, bool non_blocking) {
  int type = SOCK_STREAM | SOCK_CLOEXEC | (non_blocking ? SOCK_NONBLOCK : 0);
  int fd = ::socket(AF_UNIX, type, 0);
  if (fd < 0) return Status::FromErrno(errno, std::string(what) + ": socket(AF_UNIX)");
  return ScopedFd(fd);
}

// connect() that retries EINTR; returns 0 or errno.
int ConnectOnce(int fd, const sockaddr_un& addr) {
  while (true) {
    if (::connect(fd, Generic(&addr), sizeof(addr)) == 0) return 0;
    if (errno != EINTR) return errno;
  }
}

// Whether something accepts connections on the socket file at `path`: a
// non-blocking connect succeeds, or fails only because its backlog is full.
// ECONNREFUSED means the file is stale (its listener is gone).
Result<bool> SomethingListens(const std::string& path) {
  GRANARY_ASSIGN_OR_RETURN(ScopedFd probe, NewSocket("probe " + Quoted(path), true));
  sockaddr_un addr = AddressOf(path);
  int err = ConnectOnce(probe.get(), addr);
  if (err == 0 || err == EAGAIN || err == EINPROGRESS) return true;
  if (err == ECONNREFUSED) return false;
  return Status::FromErrno(err, "probe whether something listens on " + Quoted(path));
}

Status BindListening(int fd, const std::string& path, const UnixListenOptions& options) {
  sockaddr_un addr = AddressOf(path);
  for (int attempt = 0;; ++attempt) {
    if (::bind(fd, Generic(&addr), sizeof(addr)) == 0) return Status::Ok();
    int err = errno;
    if (err == ENOENT) {
      return Status::NotFound("listen on " + Quoted(path) +
                              ": its directory does not exist; create it first");
    }
    if (err != EADDRINUSE) return Status::FromErrno(err, "listen on " + Quoted(path) + ": bind");
    // Something is at the path. Only a socket nobody listens on is removed,
    // and only once: a second EADDRINUSE means another process won a race.
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT && attempt == 0) continue;  // removed meanwhile
      return Status::FromErrno(errno, "listen on " + Quoted(path) + ": lstat");
    }
    if (!S_ISSOCK(st.st_mode)) {
      return Status::AlreadyExists("listen on " + Quoted(path) +
                                   ": a file that is not a socket is there; it is never "
                                   "removed: move it away or choose another socket path");
    }
    if (attempt > 0) {
      return Status::AlreadyExists("listen on " + Quoted(path) +
                                   ": another process bound the path while the stale socket "
                                   "was being replaced; is a second sidecar starting?");
    }
    GRANARY_ASSIGN_OR_RETURN(bool live, SomethingListens(path));
    if (live) {
      return Status::AlreadyExists("listen on " + Quoted(path) +
                                   ": another process is listening on this socket (a sidecar "
                                   "already running?); stop it or choose another path");
    }
    if (!options.replace_stale) {
      return Status::AlreadyExists("listen on " + Quoted(path) +
                                   ": a stale socket file is there (nothing listens) and "
                                   "replace_stale is off; remove it");
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::FromErrno(errno, "listen on " + Quoted(path) + ": remove the stale socket");
    }
  }
}

}  // namespace

Result<ScopedFd> ListenUnix(const std::string& path, const UnixListenOptions& options) {
  GRANARY_RETURN_IF_ERROR(CheckPath(path, "listen on"));
  if (options.backlog <= 0) {
    return Status::InvalidArgument("listen on " + Quoted(path) + ": backlog " +
                                   std::to_string(options.backlog) + " must be at least 1");
  }
  if ((options.mode & ~uint32_t{07777}) != 0) {
    return Status::InvalidArgument("listen on " + Quoted(path) + ": mode " +
                                   std::to_string(options.mode) + " has bits beyond 07777");
  }
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, NewSocket("listen on " + Quoted(path), true));
  GRANARY_RETURN_IF_ERROR(BindListening(fd.get(), path, options));
  // Until this chmod the file has the umask's mode; the directory's own mode
  // is what keeps others out of that instant (docs/sidecar.md).
  if (::chmod(path.c_str(), static_cast<mode_t>(options.mode)) != 0) {
    Status s = Status::FromErrno(errno, "listen on " + Quoted(path) + ": chmod");
    ::unlink(path.c_str());
    return s;
  }
  if (::listen(fd.get(), options.backlog) != 0) {
    Status s = Status::FromErrno(errno, "listen on " + Quoted(path) + ": listen");
    ::unlink(path.c_str());
    return s;
  }
  return fd;
}

Result<ScopedFd> AcceptUnix(int listen_fd) {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) return ScopedFd(fd);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED) {
      return Status::Unavailable("accept on Unix socket: no connection pending; wait and retry");
    }
    if (err == EMFILE || err == ENFILE) {
      return Status::ResourceExhausted("accept on Unix socket: out of file descriptors (" +
                                       ErrnoText(err) + "); raise the limit (ulimit -n)");
    }
    return Status::FromErrno(err, "accept on Unix socket");
  }
}

Result<ScopedFd> ConnectUnix(const std::string& path, std::chrono::milliseconds timeout) {
  GRANARY_RETURN_IF_ERROR(CheckPath(path, "connect to"));
  const std::string what = "connect to " + Quoted(path);
  const Clock::time_point deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
  GRANARY_ASSIGN_OR_RETURN(ScopedFd fd, NewSocket(what, true));
  sockaddr_un addr = AddressOf(path);
  // A Unix socket connects at once or fails at once; the one wait is a full
  // backlog (EAGAIN), which poll cannot wait on: retry with a short backoff.
  std::chrono::milliseconds backoff(1);
  int err = 0;
  while (true) {
    err = ConnectOnce(fd.get(), addr);
    if (err != EAGAIN) break;
    std::chrono::milliseconds left = TimeLeft(deadline);
    if (left.count() <= 0) {
      return Status::DeadlineExceeded(what + ": its backlog stayed full for " +
                                      std::to_string(timeout.count()) +
                                      " ms; the sidecar is overloaded or stuck");
    }
    ::poll(nullptr, 0, static_cast<int>(std::min(backoff, left).count()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
  if (err == EINPROGRESS) {
    // Not what Linux does for AF_UNIX, but handled as for any socket.
    while (true) {
      std::chrono::milliseconds left = TimeLeft(deadline);
      if (left.count() <= 0) {
        return Status::DeadlineExceeded(what + ": not connected within " +
                                        std::to_string(timeout.count()) + " ms");
      }
      pollfd p{fd.get(), POLLOUT, 0};
      int n =
          ::poll(&p, 1, static_cast<int>(std::min(left, std::chrono::milliseconds(60000)).count()));
      if (n < 0 && errno != EINTR) return Status::FromErrno(errno, what + ": poll");
      if (n > 0) break;
    }
    socklen_t len = sizeof(err);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
      return Status::FromErrno(errno, what + ": getsockopt(SO_ERROR)");
    }
  }
  switch (err) {
    case 0:
      break;
    case ENOENT:
      return Status::Unavailable(what +
                                 ": no socket file there; is granary-sidecar running, "
                                 "and is this its socket path (GRANARY_SOCKET)?");
    case ECONNREFUSED:
      return Status::Unavailable(what +
                                 ": nothing listens on it (a stale socket file, or not "
                                 "a socket); is granary-sidecar running?");
    case EACCES:
    case EPERM:
      return Status::PermissionDenied(what + ": " + ErrnoText(err) +
                                      "; the socket's mode or group must allow this user");
    default:
      return Status::Unavailable(what + ": " + ErrnoText(err));
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return Status::FromErrno(errno, what + ": make the socket blocking");
  }
  return fd;
}

Result<size_t> SendWithFds(int fd, std::string_view bytes, std::span<const int> fds) {
  if (fds.size() > kMaxPassedFds) {
    return Status::InvalidArgument("send on Unix socket: " + std::to_string(fds.size()) +
                                   " descriptors, at most " + std::to_string(kMaxPassedFds) +
                                   " go with one message");
  }
  if (bytes.empty()) {
    if (!fds.empty()) {
      return Status::InvalidArgument(
          "send on Unix socket: descriptors travel with a byte; there are no bytes to send");
    }
    return size_t{0};
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxPassedFds * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  while (true) {
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      return Status::Unavailable(
          "send on Unix socket: the send buffer is full; wait for "
          "POLLOUT and retry");
    }
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
      return Status::IoError("send on Unix socket: the peer closed the connection (" +
                             ErrnoText(err) + ")");
    }
    if (err == EBADF && !fds.empty()) {
      return Status::InvalidArgument(
          "send on Unix socket: a descriptor to pass is not open, or "
          "the socket is not (" +
          ErrnoText(err) + ")");
    }
    return Status::FromErrno(err, "send on Unix socket");
  }
}

Result<size_t> ReceiveWithFds(int fd, std::span<char> buffer, std::vector<ScopedFd>* fds) {
  if (buffer.empty()) {
    return Status::InvalidArgument("receive on Unix socket: the buffer is empty");
  }
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxPassedFds * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = 0;
  while (true) {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      return Status::Unavailable(
          "receive on Unix socket: nothing to read yet; wait for POLLIN "
          "and retry");
    }
    if (err == ECONNRESET) {
      return Status::IoError("receive on Unix socket: the peer reset the connection");
    }
    return Status::FromErrno(err, "receive on Unix socket");
  }
  // Take ownership of whatever arrived first, so that every failure below
  // closes it.
  std::vector<ScopedFd> arrived;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int passed = -1;
      std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      arrived.emplace_back(passed);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return Status::InvalidArgument(
        "receive on Unix socket: the peer passed more than " + std::to_string(kMaxPassedFds) +
        " descriptors with one message (the control message was truncated); the " +
        std::to_string(arrived.size()) + " that arrived are closed");
  }
  if (!arrived.empty()) {
    if (fds == nullptr) {
      return Status::InvalidArgument("receive on Unix socket: the peer passed " +
                                     std::to_string(arrived.size()) +
                                     " descriptors where none were expected; they are closed");
    }
    for (ScopedFd& f : arrived) fds->push_back(std::move(f));
  }
  return static_cast<size_t>(n);
}

Result<PeerCredentials> PeerCredentialsOf(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return Status::FromErrno(errno, "read the peer credentials of a Unix socket (SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

}  // namespace granary

#pragma once

// Unix-domain stream sockets for the sidecar's local protocol
// (sidecar_protocol.h): listening on a path with a given mode, connecting
// with a deadline, sending and receiving bytes together with file descriptors
// (SCM_RIGHTS), and the peer's credentials (SO_PEERCRED). Thin Status-returning
// wrappers: EINTR is retried here; EAGAIN on a non-blocking socket is
// kUnavailable, and in AcceptUnix, SendWithFds and ReceiveWithFds nothing else
// is, so an event loop treats kUnavailable as "would block": wait and retry.
// A connection the peer broke is kIoError.
//
// Callers: granary-sidecar (listen, accept, send replies with the arena fd),
// libgranary-client (connect, receive the fd), tests.
//
// Thread safety: free functions; the usual POSIX rules for concurrent use of
// one descriptor apply.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "granary/core/file.h"
#include "granary/core/status.h"

namespace granary {

// sockaddr_un holds at most this many bytes of path (without the NUL).
inline constexpr size_t kMaxUnixSocketPath = 107;
// At most this many descriptors are accepted in one message; more are closed
// and the receive fails.
inline constexpr size_t kMaxPassedFds = 4;

struct UnixListenOptions {
  uint32_t mode = 0660;  // chmod of the socket file after bind
  int backlog = 128;
  // A socket file already at the path: if nothing accepts connections on it
  // (a stale file from a crash), it is removed and replaced; if something does,
  // listening fails kAlreadyExists. Any other kind of file there is never
  // removed (kAlreadyExists).
  bool replace_stale = true;
};

// A listening, close-on-exec, non-blocking socket bound at `path`. The
// directory must exist (kNotFound). kInvalidArgument for a path that is empty
// or too long, a backlog < 1 or a mode beyond 07777. Between bind and chmod the
// file has the umask's mode: keep the directory closed to those the mode
// excludes.
Result<ScopedFd> ListenUnix(const std::string& path, const UnixListenOptions& options = {});

// accept4 (close-on-exec, non-blocking). kUnavailable when nothing is pending
// (or the pending connection was aborted), kResourceExhausted when out of fds.
Result<ScopedFd> AcceptUnix(int listen_fd);

// A connected, close-on-exec, blocking socket; kUnavailable naming the path
// (and saying whether nothing listens, or the file is missing) on failure,
// kPermissionDenied when the socket's mode refuses this user,
// kDeadlineExceeded when the listener's backlog stays full for `timeout` (a
// Unix socket connects at once otherwise).
Result<ScopedFd> ConnectUnix(const std::string& path, std::chrono::milliseconds timeout);

// sendmsg with MSG_NOSIGNAL: sends a prefix of `bytes` (returns its length,
// possibly short on a non-blocking socket) and, with the first byte, `fds`
// (only when the first byte is sent by this call: pass them with the call
// that sends a message's first byte, never again). kUnavailable on EAGAIN
// (nothing sent), kIoError for a broken connection (no SIGPIPE), kInvalidArgument
// for more than kMaxPassedFds descriptors or descriptors with no bytes.
Result<size_t> SendWithFds(int fd, std::string_view bytes, std::span<const int> fds = {});

// recvmsg into `buffer` with MSG_CMSG_CLOEXEC; descriptors that arrive are
// appended to `fds` (owned). Returns bytes received; 0 means end of stream.
// A truncated control message (more descriptors than kMaxPassedFds) closes what
// arrived and fails kInvalidArgument; so do descriptors when `fds` is null.
// kUnavailable on EAGAIN, kIoError when the peer reset the connection.
Result<size_t> ReceiveWithFds(int fd, std::span<char> buffer, std::vector<ScopedFd>* fds);

struct PeerCredentials {
  pid_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};
Result<PeerCredentials> PeerCredentialsOf(int fd);

}  // namespace granary

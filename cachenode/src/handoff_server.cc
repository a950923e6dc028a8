// HandoffServer (handoff_server.h): the daemons' accept loop (UnixAcceptLoop)
// plus one blocking thread per connection; each request is read whole, resolved, and answered with
// the descriptor attached to the reply's first byte.

#include "granary/cachenode/handoff_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/core/thread_name.h"
#include "granary/daemon/connection_threads.h"
#include "granary/daemon/unix_accept_loop.h"

namespace granary {
namespace {

constexpr int kPollMs = 500;
using Clock = std::chrono::steady_clock;

}  // namespace

struct HandoffServer::Impl {
  HandoffServerOptions options;
  Resolver resolver;
  ScopedFd listen_fd;
  std::shared_ptr<spdlog::logger> log = GetLogger("cachenode");
  std::atomic<bool> stopping{false};
  bool stopped = false;

  ConnectionThreads connections;
  std::unique_ptr<UnixAcceptLoop> accept_loop;  // over listen_fd, into connections

  std::atomic<uint64_t> handed{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> rejected_full{0};
  std::atomic<uint64_t> rejected_uid{0};
  std::atomic<uint64_t> idle_closes{0};
  ConnectionLimits limits;

  // How the accept loop admits, refuses and serves this socket's peers.
  UnixAcceptLoopOptions AcceptOptions();
  void Serve(uint64_t id, int fd);
  // Reads exactly n bytes by `deadline`; false at end of stream, on error,
  // when stopping, or at the deadline (*timed_out).
  bool ReadExact(int fd, char* out, size_t n, Clock::time_point deadline, bool* clean_eof,
                 bool* timed_out);
  bool SendReply(int fd, const Status& status, int passed_fd);
};

namespace {

// Milliseconds to wait in one poll: at most kPollMs (to notice Stop), at
// most what is left before `deadline`.
int PollMs(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, kPollMs));
}

}  // namespace

bool HandoffServer::Impl::ReadExact(int fd, char* out, size_t n, Clock::time_point deadline,
                                    bool* clean_eof, bool* timed_out) {
  size_t have = 0;
  *clean_eof = false;
  *timed_out = false;
  for (int round = 0; have < n && round < kMaxPollRounds; ++round) {
    if (stopping) return false;
    if (Clock::now() >= deadline) {
      *timed_out = true;
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, PollMs(deadline));
    if (r < 0 && errno != EINTR) return false;
    if (r <= 0) continue;
    std::vector<ScopedFd> fds;  // peers pass none; any that arrive are closed
    Result<size_t> got = ReceiveWithFds(fd, std::span<char>(out + have, n - have), &fds);
    if (!got.ok()) {
      if (got.status().code() == StatusCode::kUnavailable) continue;
      return false;
    }
    if (*got == 0) {
      *clean_eof = have == 0;
      return false;
    }
    have += *got;
  }
  return have == n;
}

bool HandoffServer::Impl::SendReply(int fd, const Status& status, int passed_fd) {
  const std::string frame = handoff::EncodeReply(status);
  std::string_view rest = frame;
  bool first = true;
  // A peer that does not take its reply within idle_timeout is closed.
  const Clock::time_point deadline = Clock::now() + options.idle_timeout;
  for (int round = 0; !rest.empty() && round < kMaxPollRounds; ++round) {
    if (Clock::now() >= deadline) return false;
    const int one[1] = {passed_fd};
    std::span<const int> fds;
    if (first && passed_fd >= 0) fds = std::span<const int>(one, 1);
    Result<size_t> sent = SendWithFds(fd, rest, fds);
    if (!sent.ok()) {
      if (sent.status().code() != StatusCode::kUnavailable) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, PollMs(deadline)) < 0 && errno != EINTR) return false;
      if (stopping) return false;
      continue;
    }
    if (*sent > 0) first = false;
    rest.remove_prefix(*sent);
  }
  return rest.empty();
}

void HandoffServer::Impl::Serve(uint64_t id, int fd) {
  Result<PeerCredentials> peer = PeerCredentialsOf(fd);
  char header[handoff::kHeaderSize];
  std::string body;
  while (peer.ok() && !stopping) {
    bool eof = false;
    bool timed_out = false;
    // Idle from here until the whole request is in: bytes of a request that
    // never completes do not keep the place.
    const Clock::time_point idle_deadline = Clock::now() + options.idle_timeout;
    const auto closed_idle = [&] {
      idle_closes.fetch_add(1, std::memory_order_relaxed);
      log->debug("handoff connection {} (uid {}): idle for {} ms (idle_timeout); closed", id,
                 peer->uid, options.idle_timeout.count());
    };
    if (!ReadExact(fd, header, sizeof(header), idle_deadline, &eof, &timed_out)) {
      if (timed_out) {
        // No reply: the peer is not waiting for one, and a reply it did not
        // ask for would answer its next request. It sees end of stream.
        closed_idle();
      } else if (!eof && !stopping) {
        protocol_errors.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    Result<handoff::Header> h = handoff::DecodeHeader(std::string_view(header, sizeof(header)));
    if (h.ok() && h->type != handoff::MessageType::kOpenChunk) {
      h = Status::InvalidArgument("chunk handoff: a peer sent OPEN_CHUNK_REPLY; send OPEN_CHUNK");
    }
    if (!h.ok()) {
      // The stream is out of step: say why, then close.
      protocol_errors.fetch_add(1, std::memory_order_relaxed);
      log->debug("handoff connection {}: {}", id, h.status().ToString());
      (void)SendReply(fd, h.status(), -1);
      break;
    }
    body.assign(h->body_size, '\0');
    if (h->body_size > 0 &&
        !ReadExact(fd, body.data(), body.size(), idle_deadline, &eof, &timed_out)) {
      if (timed_out) {
        closed_idle();
      } else if (!stopping) {
        protocol_errors.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    Result<handoff::OpenChunkRequest> request = handoff::DecodeOpenChunk(body);
    if (!request.ok()) {
      // Well framed: the stream is in step; answer and keep the connection.
      protocol_errors.fetch_add(1, std::memory_order_relaxed);
      if (!SendReply(fd, request.status(), -1)) break;
      continue;
    }
    Result<ScopedFd> chunk = resolver(*peer, *request);
    if (!chunk.ok()) {
      refused.fetch_add(1, std::memory_order_relaxed);
      if (!SendReply(fd, chunk.status(), -1)) break;
      continue;
    }
    if (!SendReply(fd, Status::Ok(), chunk->get())) break;
    handed.fetch_add(1, std::memory_order_relaxed);
  }
  // ConnectionThreads shuts the connection down and closes it.
}

UnixAcceptLoopOptions HandoffServer::Impl::AcceptOptions() {
  UnixAcceptLoopOptions o;
  o.socket_name = "the handoff socket " + Quoted(options.path);
  o.thread_name = "handoff-accept";
  o.log = log;
  o.limits = limits;
  o.privileged = options.privileged;
  o.unnamed = [this](const Status& why) {
    // Serve says nothing to a peer it cannot name; neither does this.
    rejected.fetch_add(1, std::memory_order_relaxed);
    log->warn("handoff socket {}: SO_PEERCRED of a new connection failed: {}", Quoted(options.path),
              why.ToString());
  };
  o.refused = [this](int fd, uint32_t uid, Admission admitted) {
    rejected.fetch_add(1, std::memory_order_relaxed);
    std::string why;
    if (admitted == Admission::kFull) {
      rejected_full.fetch_add(1, std::memory_order_relaxed);
      why = "the cache node's handoff socket serves at most " + std::to_string(limits.max_open) +
            " connections at once; close idle ones";
    } else {
      rejected_uid.fetch_add(1, std::memory_order_relaxed);
      why = admitted == Admission::kUidFull
                ? "uid " + std::to_string(uid) + " already holds " +
                      std::to_string(limits.per_uid) +
                      " connections to the cache node's handoff socket (its per-uid limit); "
                      "reuse or close them"
                : "the cache node's handoff socket keeps its last " +
                      std::to_string(limits.reserved) +
                      " places for root, the node's user and dataset owners; uid " +
                      std::to_string(uid) + " must wait for other users to close connections";
    }
    (void)SendWithFds(fd, handoff::EncodeReply(Status::ResourceExhausted(why)));
  };
  o.serve = [this](uint64_t id, int fd) {
    NameThisThread("handoff-conn");
    Serve(id, fd);
  };
  return o;
}

Result<std::unique_ptr<HandoffServer>> HandoffServer::Start(HandoffServerOptions options,
                                                            Resolver resolver) {
  if (!resolver) return Status::InvalidArgument("HandoffServer needs a resolver");
  if (options.max_connections == 0) {
    return Status::InvalidArgument("HandoffServer: max_connections must be at least 1");
  }
  if (options.idle_timeout.count() <= 0) {
    return Status::InvalidArgument("HandoffServer: idle_timeout must be positive");
  }
  ConnectionLimits limits = ConnectionLimits::DefaultFor(options.max_connections);
  if (options.max_per_uid != 0) limits.per_uid = options.max_per_uid;
  if (options.reserved.has_value()) limits.reserved = *options.reserved;
  if (limits.reserved >= limits.max_open) {
    return Status::InvalidArgument("HandoffServer: reserved (" + std::to_string(limits.reserved) +
                                   ") must be below max_connections (" +
                                   std::to_string(limits.max_open) + ")");
  }
  auto impl = std::make_unique<Impl>();
  impl->limits = limits;
  impl->options = std::move(options);
  impl->resolver = std::move(resolver);
  UnixListenOptions listen;
  listen.mode = impl->options.mode;
  Result<ScopedFd> fd = ListenUnix(impl->options.path, listen);
  if (!fd.ok()) {
    return Status(fd.status().code(),
                  "listening on the handoff socket (`local_socket`): " + fd.status().message());
  }
  impl->listen_fd = std::move(*fd);
  GRANARY_ASSIGN_OR_RETURN(
      impl->accept_loop,
      UnixAcceptLoop::Start(impl->listen_fd.get(), &impl->connections, impl->AcceptOptions()));
  return std::unique_ptr<HandoffServer>(new HandoffServer(std::move(impl)));
}

HandoffServer::HandoffServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HandoffServer::~HandoffServer() { Stop(); }

void HandoffServer::Stop() {
  Impl& i = *impl_;
  if (i.stopped) return;
  i.stopped = true;
  i.stopping = true;
  if (i.accept_loop != nullptr) i.accept_loop->Stop();
  i.connections.StopAll();
  i.listen_fd.Reset();
  ::unlink(i.options.path.c_str());
}

const std::string& HandoffServer::path() const { return impl_->options.path; }

HandoffServerCounters HandoffServer::counters() const {
  HandoffServerCounters c;
  c.handed = impl_->handed.load();
  c.refused = impl_->refused.load();
  c.protocol_errors = impl_->protocol_errors.load();
  c.rejected_connections = impl_->rejected.load();
  c.rejected_full = impl_->rejected_full.load();
  c.rejected_uid = impl_->rejected_uid.load();
  c.idle_closes = impl_->idle_closes.load();
  c.open_connections = impl_->connections.open();
  return c;
}

}  // namespace granary

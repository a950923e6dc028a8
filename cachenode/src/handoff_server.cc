// HandoffServer (handoff_server.h): accept loop plus one blocking thread per
// connection; each request is read whole, resolved, and answered with the
// descriptor attached to the reply's first byte.

#include "granary/cachenode/handoff_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "granary/core/log.h"
#include "granary/core/names.h"
#include "granary/daemon/connection_threads.h"

namespace granary {
namespace {

constexpr int kPollMs = 500;

}  // namespace

struct HandoffServer::Impl {
  HandoffServerOptions options;
  Resolver resolver;
  ScopedFd listen_fd;
  ScopedFd wake_fd;
  std::shared_ptr<spdlog::logger> log = GetLogger("cachenode");
  std::atomic<bool> stopping{false};
  bool stopped = false;
  std::thread accept_thread;

  ConnectionThreads connections;
  std::atomic<uint64_t> next_conn{1};  // connection ids, for logs

  std::atomic<uint64_t> handed{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> rejected{0};

  void AcceptLoop();
  void Serve(uint64_t id, int fd);
  // Reads exactly n bytes; false at end of stream, on error, or when stopping.
  bool ReadExact(int fd, char* out, size_t n, bool* clean_eof);
  bool SendReply(int fd, const Status& status, int passed_fd);
};

bool HandoffServer::Impl::ReadExact(int fd, char* out, size_t n, bool* clean_eof) {
  size_t have = 0;
  *clean_eof = false;
  for (int round = 0; have < n && round < kMaxPollRounds; ++round) {
    if (stopping) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, kPollMs);
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
  for (int round = 0; !rest.empty() && round < kMaxPollRounds; ++round) {
    const int one[1] = {passed_fd};
    std::span<const int> fds;
    if (first && passed_fd >= 0) fds = std::span<const int>(one, 1);
    Result<size_t> sent = SendWithFds(fd, rest, fds);
    if (!sent.ok()) {
      if (sent.status().code() != StatusCode::kUnavailable) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, kPollMs) < 0 && errno != EINTR) return false;
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
    if (!ReadExact(fd, header, sizeof(header), &eof)) {
      if (!eof && !stopping) protocol_errors.fetch_add(1, std::memory_order_relaxed);
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
    if (h->body_size > 0 && !ReadExact(fd, body.data(), body.size(), &eof)) {
      protocol_errors.fetch_add(1, std::memory_order_relaxed);
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

void HandoffServer::Impl::AcceptLoop() {
  while (!stopping) {
    pollfd fds[2] = {{listen_fd.get(), POLLIN, 0}, {wake_fd.get(), POLLIN, 0}};
    const int n = ::poll(fds, 2, 1000);
    connections.ReapFinished();
    if (n < 0 && errno != EINTR) {
      log->error("poll on the handoff socket {} failed: {}", Quoted(options.path),
                 ErrnoText(errno));
      return;
    }
    if (stopping) return;
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    Result<ScopedFd> accepted = AcceptUnix(listen_fd.get());
    if (!accepted.ok()) continue;
    ScopedFd fd = std::move(*accepted);
    const uint64_t id = next_conn++;
    if (!connections.Start(fd, options.max_connections,
                           [this, id](int conn) { Serve(id, conn); })) {
      rejected.fetch_add(1, std::memory_order_relaxed);
      (void)SendWithFds(fd.get(), handoff::EncodeReply(Status::ResourceExhausted(
                                      "the cache node's handoff socket serves at most " +
                                      std::to_string(options.max_connections) +
                                      " connections at once; close idle ones")));
    }
  }
}

Result<std::unique_ptr<HandoffServer>> HandoffServer::Start(HandoffServerOptions options,
                                                            Resolver resolver) {
  if (!resolver) return Status::InvalidArgument("HandoffServer needs a resolver");
  if (options.max_connections == 0) {
    return Status::InvalidArgument("HandoffServer: max_connections must be at least 1");
  }
  auto impl = std::make_unique<Impl>();
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
  impl->wake_fd = ScopedFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake_fd.valid()) {
    return Status::FromErrno(errno, "create the handoff server's wake-up eventfd");
  }
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<HandoffServer>(new HandoffServer(std::move(impl)));
}

HandoffServer::HandoffServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HandoffServer::~HandoffServer() { Stop(); }

void HandoffServer::Stop() {
  Impl& i = *impl_;
  if (i.stopped) return;
  i.stopped = true;
  i.stopping = true;
  const uint64_t one = 1;
  (void)!::write(i.wake_fd.get(), &one, sizeof(one));
  if (i.accept_thread.joinable()) i.accept_thread.join();
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
  return c;
}

}  // namespace granary

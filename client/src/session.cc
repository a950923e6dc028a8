#include "granary/client/session.h"

// Session's opening (options, socket path, HELLO, the arena mapping) and its
// connection (sending, receiving frames with descriptors, one call and its
// reply, breaking on a protocol error). Samples are in session_samples.cc,
// metadata calls in session_metadata.cc.

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <utility>
#include <variant>

#include "granary/core/names.h"
#include "granary/protocol/unix_socket.h"

namespace granary::client {
namespace {

namespace sp = sidecar_protocol;
using Clock = std::chrono::steady_clock;

// Bytes asked of recvmsg(2) at once. Replies are small (no payloads).
constexpr size_t kReceiveChunk = 64u << 10;

std::string MillisText(std::chrono::milliseconds ms) { return fmt::format("{} ms", ms.count()); }

// This process's id, kept up to date across fork() by an atfork handler:
// sessions ask "am I in the process that opened me?" on every sample, and
// getpid() is a system call each time (glibc stopped caching it).
std::atomic<pid_t> g_pid{0};

void ResetPidAfterFork() { g_pid.store(::getpid(), std::memory_order_relaxed); }

pid_t CurrentPid() {
  static const bool registered = [] {
    g_pid.store(::getpid(), std::memory_order_relaxed);
    return ::pthread_atfork(nullptr, nullptr, &ResetPidAfterFork) == 0;
  }();
  // Without the handler (it could not be registered), ask every time.
  if (!registered) return ::getpid();
  return g_pid.load(std::memory_order_relaxed);
}

}  // namespace

// ---- options and paths ----------------------------------------------------------

Status SessionOptions::Validate() const {
  if (connect_timeout.count() <= 0) {
    return Status::InvalidArgument("session options: connect_timeout must be positive");
  }
  if (call_timeout.count() <= 0) {
    return Status::InvalidArgument("session options: call_timeout must be positive");
  }
  if (lookahead > kMaxLookahead) {
    return Status::InvalidArgument(fmt::format(
        "session options: lookahead {} is more than the {} allowed; ask for fewer hints", lookahead,
        kMaxLookahead));
  }
  if (!client_name.empty()) {
    auto hello = sp::EncodeRequest(1, sp::Hello{sp::kMinVersion, sp::kMaxVersion, client_name});
    if (!hello.ok()) {
      return Status::InvalidArgument("session options: client_name " + Quoted(client_name) +
                                     " is not accepted by the protocol (1.." +
                                     std::to_string(sp::kMaxNameLength) +
                                     " graphic ASCII characters): " + hello.status().message());
    }
  }
  return Status::Ok();
}

std::string ResolveSocketPath(std::string_view configured) {
  if (!configured.empty()) return std::string(configured);
  const std::string env_name(kSocketEnvVar);
  const char* env = std::getenv(env_name.c_str());
  if (env != nullptr && env[0] != '\0') return env;
  return std::string(kDefaultSocketPath);
}

std::string DefaultClientName() { return "client/" + std::to_string(::getpid()); }

// ---- opening ------------------------------------------------------------------

Session::Session(std::string socket_path, SessionOptions options)
    : socket_path_(std::move(socket_path)), options_(std::move(options)), pid_(CurrentPid()) {}

Result<std::unique_ptr<Session>> Session::Open(std::string_view dataset,
                                               const SessionOptions& options) {
  SessionOptions resolved = options;
  if (resolved.client_name.empty()) resolved.client_name = DefaultClientName();
  GRANARY_RETURN_IF_ERROR(resolved.Validate());
  if (!IsDnsLabel(dataset)) {
    return Status::InvalidArgument(
        "open a session on dataset " + Quoted(dataset) +
        ": not a dataset name (1..63 of a-z, 0-9 and '-', starting and ending with a letter or "
        "digit); use the name the dataset was created with");
  }
  std::string path = ResolveSocketPath(resolved.socket_path);
  const std::string doing =
      "open a session on dataset " + Quoted(dataset) + " with the sidecar at " + path;
  const Clock::time_point deadline = Clock::now() + resolved.connect_timeout;
  Result<ScopedFd> fd = ConnectUnix(path, resolved.connect_timeout);
  if (!fd.ok()) {
    return fd.status().WithContext(doing);
  }
  std::unique_ptr<Session> session(new Session(std::move(path), std::move(resolved)));
  session->direct_on_.store(session->options_.direct_reads, std::memory_order_relaxed);
  session->dataset_ = std::string(dataset);
  session->fd_ = std::move(*fd);
  std::lock_guard<std::mutex> lock(session->mu_);
  session->timeout_ = session->options_.connect_timeout;
  GRANARY_RETURN_IF_ERROR(session->Handshake(dataset, deadline));
  session->timeout_ = session->options_.call_timeout;
  return session;
}

Status Session::Handshake(std::string_view dataset, Clock::time_point deadline) {
  const std::string doing_hello = "HELLO to the sidecar at " + socket_path_;
  GRANARY_ASSIGN_OR_RETURN(sp::Reply hello_reply,
                           Call(sp::Hello{sp::kMinVersion, sp::kMaxVersion, options_.client_name},
                                sp::MessageType::kHelloReply, deadline, doing_hello));
  const auto& hello = std::get<sp::HelloReply>(hello_reply);
  if (hello.version < sp::kMinVersion || hello.version > sp::kMaxVersion) {
    return Break(Status::VersionMismatch(
        fmt::format("{}: the sidecar chose protocol version {}, this client speaks {}..{}; use a "
                    "client and sidecar from the same release",
                    doing_hello, hello.version, sp::kMinVersion, sp::kMaxVersion)));
  }
  if (Status s = hello.limits.Validate(); !s.ok()) {
    return Break(Status::Unavailable(doing_hello + ": the sidecar advertised bad limits (" +
                                     s.message() + "); the connection is closed"));
  }
  limits_ = sp::CommonLimits(sp::Limits{}, hello.limits);
  version_ = hello.version;
  sidecar_name_ = hello.sidecar_name;

  const std::string doing_open =
      "OPEN dataset " + Quoted(dataset) + " at the sidecar at " + socket_path_;
  std::vector<ScopedFd> fds;
  GRANARY_ASSIGN_OR_RETURN(sp::Reply open_reply,
                           Call(sp::Open{std::string(dataset)}, sp::MessageType::kOpenReply,
                                deadline, doing_open, &fds));
  const auto& open = std::get<sp::OpenReply>(open_reply);
  if (fds.size() != 1) {
    return Break(Status::Unavailable(
        fmt::format("{}: the reply came with {} file descriptors, not the one arena descriptor the "
                    "protocol passes; the connection is closed",
                    doing_open, fds.size())));
  }
  if (open.arena_bytes == 0 || open.arena_bytes > (uint64_t{1} << 46)) {
    return Break(Status::Unavailable(
        fmt::format("{}: the sidecar announced an arena of {} bytes; the connection is closed",
                    doing_open, open.arena_bytes)));
  }
  const int arena_fd = fds[0].get();
  struct stat st {};
  if (::fstat(arena_fd, &st) != 0) {
    return Break(Status::FromErrno(errno, doing_open + ": fstat of the arena descriptor"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < open.arena_bytes) {
    return Break(Status::Unavailable(fmt::format(
        "{}: the arena descriptor holds {} bytes, less than the {} announced; the connection is "
        "closed",
        doing_open, static_cast<int64_t>(st.st_size), open.arena_bytes)));
  }
  // Reading a mapped page past the end of a shrunk file is SIGBUS: seal the
  // arena against shrinking when we may (a memfd passed read-write without
  // F_SEAL_SEAL). Best effort: a descriptor that refuses keeps its size as
  // long as the sidecar keeps it, which is the sidecar's contract.
  const int seals = ::fcntl(arena_fd, F_GET_SEALS);
  if (seals >= 0 && (seals & F_SEAL_SHRINK) == 0) {
    (void)::fcntl(arena_fd, F_ADD_SEALS, F_SEAL_SHRINK);
  }
  const size_t size = static_cast<size_t>(open.arena_bytes);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, arena_fd, 0);
  if (map == MAP_FAILED) {
    return Break(Status::FromErrno(
        errno, fmt::format("{}: mapping the {}-byte arena read-only", doing_open, size)));
  }
  map_ = static_cast<const char*>(map);
  map_size_ = size;
  info_.name = std::string(dataset);
  info_.manifest_id = open.manifest_id;
  info_.sample_count = open.sample_count;
  info_.total_bytes = open.total_bytes;
  info_.chunk_count = open.chunk_count;
  // Hint pins keep samples that other readers may have consumed from being
  // evicted: a session's hints are kept within 1/kHintArenaShare of the arena,
  // and it asks for no more than half of that (at the dataset's mean size).
  hint_bytes_limit_ = map_size_ / kHintArenaShare;
  const uint64_t mean =
      std::max<uint64_t>(1, info_.sample_count == 0 ? 1 : info_.total_bytes / info_.sample_count);
  lookahead_ = options_.lookahead == 0 ? 0
                                       : static_cast<uint32_t>(std::clamp<uint64_t>(
                                             hint_bytes_limit_ / 2 / mean, 1, options_.lookahead));
  return Status::Ok();
}

Session::~Session() {
  if (map_ != nullptr) {
    ::munmap(const_cast<char*>(map_), map_size_);
  }
  // Closing the socket (fd_'s destructor) drops every pin this session held.
  // In a forked child it only closes the child's copy of the descriptor.
}

bool Session::InOpeningProcess() const { return CurrentPid() == pid_; }

// ---- the connection -------------------------------------------------------------

Status Session::CheckUsable() const {
  if (!InOpeningProcess()) {
    return Status::FailedPrecondition(fmt::format(
        "session on dataset {} was opened by process {} and cannot be used in process {} (a "
        "fork); open a new session in this process",
        Quoted(dataset_), pid_, ::getpid()));
  }
  if (!broken_.ok()) return Broken("use the session on dataset " + Quoted(dataset_));
  return Status::Ok();
}

Status Session::Broken(std::string_view doing) const {
  return Status::Unavailable(std::string(doing) + ": the connection to the sidecar at " +
                             socket_path_ + " was closed after an earlier error (" +
                             broken_.message() + "); open a new session");
}

Status Session::Break(Status status) {
  fd_.Reset();
  in_.clear();
  in_begin_ = 0;
  broken_ = status.ok() ? Status::Internal("closed") : status;
  // The sidecar drops every pin of a closed connection.
  hint_order_.clear();
  hints_.clear();
  hint_bytes_ = 0;
  std::lock_guard<std::mutex> lock(release_mu_);
  pending_release_.clear();
  outstanding_.clear();
  return status;
}

Status Session::SendAll(std::string_view bytes, Clock::time_point deadline,
                        std::string_view doing) {
  size_t sent = 0;
  for (int round = 0; round < kMaxPollRounds && sent < bytes.size(); ++round) {
    ssize_t n =
        ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Result<bool> ready = WaitFdReady(fd_.get(), POLLOUT, deadline, "the sidecar connection");
      if (!ready.ok())
        return Break(Status::Unavailable(std::string(doing) + ": " + ready.status().message()));
      if (!*ready) {
        return Break(Status::DeadlineExceeded(std::string(doing) + ": the sidecar at " +
                                              socket_path_ + " took no request within " +
                                              MillisText(timeout_) + "; the connection is closed"));
      }
      continue;
    }
    const int err = n < 0 ? errno : EPIPE;
    return Break(Status::Unavailable(std::string(doing) + ": sending to the sidecar at " +
                                     socket_path_ + " failed: " + ErrnoText(err) +
                                     "; is granary-sidecar still running?"));
  }
  if (sent < bytes.size()) {
    return Break(Status::DeadlineExceeded(std::string(doing) + ": sending did not finish"));
  }
  return Status::Ok();
}

Result<sp::Frame> Session::ReceiveFrame(Clock::time_point deadline, std::string_view doing,
                                        std::vector<ScopedFd>* fds) {
  sp::FrameDecoder decoder(limits_);
  std::string buffer;
  for (int round = 0; round < kMaxPollRounds; ++round) {
    if (in_begin_ < in_.size()) {
      Result<size_t> used = decoder.Feed(std::string_view(in_).substr(in_begin_));
      if (!used.ok()) {
        return Break(Status::Unavailable(std::string(doing) + ": the sidecar at " + socket_path_ +
                                         " sent bytes that are not the protocol (" +
                                         used.status().message() + "); the connection is closed"));
      }
      in_begin_ += *used;
      if (in_begin_ >= in_.size()) {
        in_.clear();
        in_begin_ = 0;
      }
      if (decoder.has_frame()) return decoder.TakeFrame();
    }
    Result<bool> ready = WaitFdReady(fd_.get(), POLLIN, deadline, "the sidecar connection");
    if (!ready.ok()) {
      return Break(Status::Unavailable(std::string(doing) + ": " + ready.status().message()));
    }
    if (!*ready) {
      return Break(Status::DeadlineExceeded(std::string(doing) + ": no reply from the sidecar at " +
                                            socket_path_ + " within " + MillisText(timeout_) +
                                            "; the connection is closed"));
    }
    buffer.resize(kReceiveChunk);
    std::vector<ScopedFd> arrived;
    Result<size_t> n =
        ReceiveWithFds(fd_.get(), std::span<char>(buffer.data(), buffer.size()), &arrived);
    if (fds != nullptr) {
      for (ScopedFd& fd : arrived) fds->push_back(std::move(fd));
    }
    // Descriptors nobody asked for are closed here (ScopedFd).
    if (!n.ok()) {
      return Break(Status::Unavailable(std::string(doing) + ": receiving from the sidecar at " +
                                       socket_path_ + " failed: " + n.status().message()));
    }
    if (*n == 0) {
      return Break(Status::Unavailable(
          std::string(doing) + ": the sidecar at " + socket_path_ + " closed the connection" +
          (decoder.buffered_bytes() > 0 ? " in the middle of a reply" : "") +
          "; is granary-sidecar still running?"));
    }
    in_.append(buffer.data(), *n);
  }
  return Break(Status::DeadlineExceeded(std::string(doing) + ": the reply never completed"));
}

Result<sp::Reply> Session::Call(const sp::Request& request, sp::MessageType expected,
                                Clock::time_point deadline, std::string_view doing,
                                std::vector<ScopedFd>* fds) {
  const uint64_t id = next_request_id_++;
  Result<std::string> bytes = sp::EncodeRequest(id, request, limits_, version_);
  if (!bytes.ok()) {
    // Nothing was sent: the connection is fine; the request was not.
    return bytes.status().WithContext(doing);
  }
  GRANARY_RETURN_IF_ERROR(SendAll(*bytes, deadline, doing));
  GRANARY_ASSIGN_OR_RETURN(sp::Frame frame, ReceiveFrame(deadline, doing, fds));
  const uint16_t type = frame.header.type;
  const bool is_error = type == static_cast<uint16_t>(sp::MessageType::kError);
  if (frame.header.request_id != id && !(is_error && frame.header.request_id == 0)) {
    return Break(Status::Unavailable(fmt::format(
        "{}: the sidecar at {} answered request {} with a {} for request {}; the connection is "
        "closed",
        doing, socket_path_, id, sp::MessageTypeName(type), frame.header.request_id)));
  }
  if (!is_error && type != static_cast<uint16_t>(expected)) {
    return Break(Status::Unavailable(
        fmt::format("{}: the sidecar at {} answered with {} where {} was due; the connection is "
                    "closed",
                    doing, socket_path_, sp::MessageTypeName(type),
                    sp::MessageTypeName(static_cast<uint16_t>(expected)))));
  }
  Result<sp::Reply> reply = sp::DecodeReply(frame, limits_);
  if (!reply.ok()) {
    return Break(Status::Unavailable(std::string(doing) + ": the sidecar at " + socket_path_ +
                                     " sent a malformed " + std::string(sp::MessageTypeName(type)) +
                                     " (" + reply.status().message() +
                                     "); the connection is closed"));
  }
  if (const auto* error = std::get_if<sp::Error>(&*reply)) {
    Status status = error->status.ok() ? Status::Internal("the sidecar sent ERROR with status OK")
                                       : error->status;
    status = status.WithContext(doing);
    if (error->closing || frame.header.request_id == 0) {
      (void)Break(Status::Unavailable(status.message()));
    }
    return status;
  }
  return reply;
}

}  // namespace granary::client

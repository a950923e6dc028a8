#include "granary/client/session.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <utility>
#include <variant>

#include "granary/core/names.h"
#include "granary/core/unix_socket.h"

namespace granary::client {
namespace {

namespace sp = sidecar_protocol;
using Clock = std::chrono::steady_clock;

// Bytes asked of recvmsg(2) at once. Replies are small (no payloads).
constexpr size_t kReceiveChunk = 64u << 10;
// Fixed part of a GET/LOOKUP body, generously: counts, lookahead.
constexpr uint32_t kBodyOverhead = 64;

std::string MillisText(std::chrono::milliseconds ms) { return fmt::format("{} ms", ms.count()); }

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
    : socket_path_(std::move(socket_path)), options_(std::move(options)), pid_(::getpid()) {}

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

bool Session::InOpeningProcess() const { return ::getpid() == pid_; }

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

// ---- pins ------------------------------------------------------------------------

std::vector<uint64_t> Session::TakeReleases(size_t max) {
  std::lock_guard<std::mutex> lock(release_mu_);
  const size_t n = std::min(max, pending_release_.size());
  std::vector<uint64_t> taken(pending_release_.end() - static_cast<std::ptrdiff_t>(n),
                              pending_release_.end());
  pending_release_.resize(pending_release_.size() - n);
  return taken;
}

Status Session::SendQueuedReleases(Clock::time_point deadline) {
  const size_t per_request = std::max<size_t>(
      1, std::min<size_t>(limits_.max_items, (limits_.max_body_bytes - kBodyOverhead) / 8));
  size_t pending;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    pending = pending_release_.size();
  }
  const size_t rounds = (pending + per_request - 1) / per_request;
  for (size_t round = 0; round < rounds; ++round) {
    std::vector<uint64_t> tokens = TakeReleases(per_request);
    if (tokens.empty()) break;
    GRANARY_RETURN_IF_ERROR(Call(sp::Release{std::move(tokens)}, sp::MessageType::kOk, deadline,
                                 "RELEASE to the sidecar at " + socket_path_)
                                .status());
  }
  return Status::Ok();
}

void Session::Release(const SampleView& view) {
  if (view.token == 0 || !InOpeningProcess()) return;
  std::lock_guard<std::mutex> lock(release_mu_);
  auto it = outstanding_.find(view.token);
  if (it == outstanding_.end()) return;
  if (--it->second == 0) outstanding_.erase(it);
  pending_release_.push_back(view.token);
}

Status Session::Flush() {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  return SendQueuedReleases(Clock::now() + options_.call_timeout);
}

size_t Session::pinned_count() const {
  std::lock_guard<std::mutex> lock(release_mu_);
  size_t n = 0;
  for (const auto& [token, count] : outstanding_) n += count;
  return n;
}

size_t Session::hint_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hints_.size();
}

Result<SampleView> Session::Adopt(const sp::SampleItem& item) {
  const std::string what = fmt::format("sample {} of dataset {}", item.id, Quoted(dataset_));
  if (!item.status.ok()) return item.status.WithContext(what);
  if (item.token == 0) {
    return Status::Corruption(what +
                              ": the sidecar sent it without a pin token; report this "
                              "sidecar bug");
  }
  const auto drop = [&](Status status) {
    std::lock_guard<std::mutex> lock(release_mu_);
    pending_release_.push_back(item.token);
    return status;
  };
  if (item.offset > map_size_ || item.length > map_size_ - item.offset) {
    return drop(Status::Corruption(fmt::format(
        "{}: the sidecar placed it at bytes [{}, +{}) of an arena of {} bytes; not read (report "
        "this sidecar bug)",
        what, item.offset, item.length, map_size_)));
  }
  SampleView view;
  view.id = item.id;
  view.data = map_ + item.offset;
  view.size = item.length;
  view.checksum = item.checksum;
  view.token = item.token;
  if (options_.verify_checksums) {
    const uint64_t actual = Checksum64(view.data, static_cast<size_t>(view.size));
    if (actual != item.checksum) {
      return drop(Status::Corruption(
          fmt::format("{}: its {} bytes in the arena have checksum {:016x}, the sidecar said "
                      "{:016x}",
                      what, view.size, actual, item.checksum)));
    }
  }
  std::lock_guard<std::mutex> lock(release_mu_);
  ++outstanding_[item.token];
  return view;
}

void Session::AddHint(const SampleView& view) {
  auto it = hints_.find(view.id);
  if (it != hints_.end()) {
    const auto old = it->second;
    TakeHint(old);
    Release(*old);
    hint_order_.erase(old);
  }
  hint_order_.push_back(view);
  hints_[view.id] = std::prev(hint_order_.end());
  hint_bytes_ += view.size;
}

void Session::TrimHints() {
  const size_t keep = size_t{2} * lookahead_;
  while ((hints_.size() > keep || hint_bytes_ > hint_bytes_limit_) && !hint_order_.empty()) {
    TakeHint(hint_order_.begin());
    Release(hint_order_.front());
    hint_order_.pop_front();
  }
}

void Session::TakeHint(std::list<SampleView>::iterator it) {
  hints_.erase(it->id);
  hint_bytes_ -= std::min(hint_bytes_, it->size);
}

// ---- samples ---------------------------------------------------------------------

Result<SampleView> Session::Get(uint32_t id) {
  std::vector<Result<SampleView>> got = GetMany(std::span<const uint32_t>(&id, 1));
  return std::move(got.front());
}

std::vector<Result<SampleView>> Session::GetMany(std::span<const uint32_t> ids) {
  std::vector<Result<SampleView>> out;
  out.reserve(ids.size());
  std::lock_guard<std::mutex> lock(mu_);
  const Status usable = CheckUsable();
  std::vector<uint32_t> misses;
  std::vector<size_t> slots;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= info_.sample_count) {
      out.emplace_back(Status::OutOfRange(
          fmt::format("get sample {} of dataset {}: the dataset has {} samples (ids 0..{})", id,
                      Quoted(dataset_), info_.sample_count,
                      info_.sample_count == 0 ? 0 : info_.sample_count - 1)));
      continue;
    }
    if (!usable.ok()) {
      out.emplace_back(usable);
      continue;
    }
    auto hit = hints_.find(id);
    if (hit != hints_.end()) {
      const auto view = hit->second;
      out.emplace_back(*view);
      TakeHint(view);
      hint_order_.erase(view);
      continue;
    }
    out.emplace_back(Status::Internal("not fetched"));
    misses.push_back(id);
    slots.push_back(i);
  }
  if (!misses.empty()) FetchMisses(misses, slots, &out);
  return out;
}

void Session::FetchMisses(std::span<const uint32_t> ids, std::span<const size_t> slots,
                          std::vector<Result<SampleView>>* out) {
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  const uint32_t lookahead = std::min(lookahead_, limits_.max_items / 2);
  const size_t body_room = limits_.max_body_bytes - kBodyOverhead;
  // Half the body for releases, half for ids; ids + hints within max_items.
  const size_t max_releases =
      std::max<size_t>(1, std::min<size_t>(limits_.max_items, body_room / 2 / 8));
  const size_t max_ids =
      std::max<size_t>(1, std::min<size_t>({limits_.max_items - lookahead, body_room / 2 / 4,
                                            limits_.max_body_bytes / 64}));
  const std::string doing =
      "GET from dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  for (size_t begin = 0; begin < ids.size(); begin += max_ids) {
    const size_t end = std::min(ids.size(), begin + max_ids);
    if (Status usable = CheckUsable(); !usable.ok()) {
      for (size_t i = begin; i < end; ++i) (*out)[slots[i]] = usable;
      continue;
    }
    sp::Get get;
    get.release = TakeReleases(max_releases);
    get.ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                   ids.begin() + static_cast<std::ptrdiff_t>(end));
    get.lookahead = end == ids.size() ? lookahead : 0;
    Result<sp::Reply> reply = Call(get, sp::MessageType::kSamples, deadline, doing);
    if (!reply.ok()) {
      for (size_t i = begin; i < end; ++i) (*out)[slots[i]] = reply.status();
      continue;
    }
    const auto& samples = std::get<sp::Samples>(*reply);
    // The answers (items that are not hints) must be the ids asked, in order.
    size_t answered = 0;
    bool matches = true;
    for (const sp::SampleItem& item : samples.items) {
      if (item.hint) {
        if (item.id >= info_.sample_count) matches = false;
        continue;
      }
      if (answered >= get.ids.size() || item.id != get.ids[answered]) matches = false;
      ++answered;
    }
    if (!matches || answered != get.ids.size()) {
      Status broken = Break(Status::Unavailable(fmt::format(
          "{}: the SAMPLES reply does not answer the {} ids asked, in order (it has {} answers); "
          "the connection is closed",
          doing, get.ids.size(), answered)));
      for (size_t i = begin; i < end; ++i) (*out)[slots[i]] = broken;
      continue;
    }
    answered = 0;
    for (const sp::SampleItem& item : samples.items) {
      if (item.hint) {
        if (!item.status.ok()) continue;
        Result<SampleView> view = Adopt(item);
        if (view.ok()) AddHint(*view);
        continue;
      }
      (*out)[slots[begin + answered]] = Adopt(item);
      ++answered;
    }
    TrimHints();
  }
}

Result<std::string> Session::Read(uint32_t id) {
  GRANARY_ASSIGN_OR_RETURN(SampleView view, Get(id));
  std::string bytes(view.bytes());
  Release(view);
  return bytes;
}

Status Session::SetPlan(const sp::SetPlan& plan) {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  return Call(plan, sp::MessageType::kOk, Clock::now() + options_.call_timeout,
              "SET_PLAN " + Quoted(plan.plan_id) + " on dataset " + Quoted(dataset_) +
                  " at the sidecar at " + socket_path_)
      .status();
}

Result<std::vector<Result<SampleView>>> Session::Next(uint32_t max, bool* end_of_epoch) {
  if (end_of_epoch != nullptr) *end_of_epoch = false;
  if (max == 0) {
    return Status::InvalidArgument("NEXT: max samples is 0; ask for at least 1");
  }
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  const size_t body_room = limits_.max_body_bytes - kBodyOverhead;
  sp::Next next;
  next.release =
      TakeReleases(std::max<size_t>(1, std::min<size_t>(limits_.max_items, body_room / 8)));
  next.max_samples = std::min(max, limits_.max_items);
  const std::string doing =
      "NEXT on dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  GRANARY_ASSIGN_OR_RETURN(sp::Reply reply, Call(next, sp::MessageType::kSamples,
                                                 Clock::now() + options_.call_timeout, doing));
  const auto& samples = std::get<sp::Samples>(reply);
  size_t answers = 0;
  for (const sp::SampleItem& item : samples.items) {
    if (item.id >= info_.sample_count) {
      answers = next.max_samples + size_t{1};
      break;
    }
    if (!item.hint) ++answers;
  }
  if (answers > next.max_samples) {
    return Break(Status::Unavailable(fmt::format(
        "{}: the SAMPLES reply has more than the {} samples asked, or ids past the end; the "
        "connection is closed",
        doing, next.max_samples)));
  }
  std::vector<Result<SampleView>> out;
  out.reserve(answers);
  for (const sp::SampleItem& item : samples.items) {
    if (item.hint) {
      if (!item.status.ok()) continue;
      Result<SampleView> view = Adopt(item);
      if (view.ok()) AddHint(*view);
      continue;
    }
    out.push_back(Adopt(item));
  }
  TrimHints();
  if (end_of_epoch != nullptr) *end_of_epoch = samples.end_of_epoch;
  return out;
}

// ---- metadata ----------------------------------------------------------------------

Result<sp::StatEntry> Session::Stat(uint32_t id) {
  GRANARY_ASSIGN_OR_RETURN(std::vector<sp::StatEntry> entries, List(id, 1));
  return std::move(entries.front());
}

Result<std::vector<sp::StatEntry>> Session::List(uint32_t first, uint32_t count) {
  const std::string doing =
      fmt::format("STAT samples [{}, {}) of dataset {} at the sidecar at {}", first,
                  uint64_t{first} + count, Quoted(dataset_), socket_path_);
  if (uint64_t{first} + count > info_.sample_count) {
    return Status::OutOfRange(
        fmt::format("{}: the dataset has {} samples", doing, info_.sample_count));
  }
  std::vector<sp::StatEntry> entries;
  if (count == 0) return entries;
  entries.reserve(count);
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  uint32_t cursor = first;
  // Each round returns at least one entry (else it is an error): bounded by count.
  for (uint32_t round = 0; round < count && entries.size() < count; ++round) {
    const uint32_t want =
        std::min(count - static_cast<uint32_t>(entries.size()), limits_.max_items);
    GRANARY_ASSIGN_OR_RETURN(sp::Reply reply, Call(sp::Stat{cursor, want},
                                                   sp::MessageType::kStatReply, deadline, doing));
    auto& stat = std::get<sp::StatReply>(reply);
    if (stat.first_id != cursor || stat.entries.empty() || stat.entries.size() > want) {
      return Break(Status::Unavailable(fmt::format(
          "{}: the STAT_REPLY for {} entries from id {} has {} entries from id {}; the connection "
          "is closed",
          doing, want, cursor, stat.entries.size(), stat.first_id)));
    }
    cursor += static_cast<uint32_t>(stat.entries.size());
    for (sp::StatEntry& e : stat.entries) entries.push_back(std::move(e));
  }
  return entries;
}

Result<uint32_t> Session::Lookup(std::string_view path) {
  std::string copy(path);
  std::vector<Result<uint32_t>> got = LookupMany(std::span<const std::string>(&copy, 1));
  return std::move(got.front());
}

std::vector<Result<uint32_t>> Session::LookupMany(std::span<const std::string> paths) {
  std::vector<Result<uint32_t>> out;
  out.reserve(paths.size());
  std::vector<size_t> slots;
  for (size_t i = 0; i < paths.size(); ++i) {
    Status valid = ValidateSamplePath(paths[i]);
    if (!valid.ok()) {
      out.emplace_back(valid.WithContext("look up a path in dataset " + Quoted(dataset_)));
      continue;
    }
    out.emplace_back(Status::Internal("not looked up"));
    slots.push_back(i);
  }
  if (slots.empty()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  const std::string doing =
      "LOOKUP in dataset " + Quoted(dataset_) + " at the sidecar at " + socket_path_;
  const size_t body_room = limits_.max_body_bytes - kBodyOverhead;
  size_t begin = 0;
  // Each round takes at least one path: bounded by their number.
  for (size_t round = 0; round < slots.size() && begin < slots.size(); ++round) {
    sp::Lookup lookup;
    size_t bytes = 0;
    size_t end = begin;
    while (end < slots.size() && lookup.paths.size() < limits_.max_items) {
      const std::string& p = paths[slots[end]];
      if (!lookup.paths.empty() && bytes + 2 + p.size() > body_room) break;
      bytes += 2 + p.size();
      lookup.paths.push_back(p);
      ++end;
    }
    Status usable = CheckUsable();
    Result<sp::Reply> reply = usable.ok()
                                  ? Call(lookup, sp::MessageType::kLookupReply, deadline, doing)
                                  : Result<sp::Reply>(usable);
    if (reply.ok() && std::get<sp::LookupReply>(*reply).items.size() != lookup.paths.size()) {
      reply = Break(Status::Unavailable(
          fmt::format("{}: the LOOKUP_REPLY has {} items for {} paths; the connection is closed",
                      doing, std::get<sp::LookupReply>(*reply).items.size(), lookup.paths.size())));
    }
    if (!reply.ok()) {
      for (size_t i = begin; i < end; ++i) out[slots[i]] = reply.status();
      begin = end;
      continue;
    }
    const auto& items = std::get<sp::LookupReply>(*reply).items;
    for (size_t i = begin; i < end; ++i) {
      const sp::LookupItem& item = items[i - begin];
      const std::string what =
          "look up " + Quoted(lookup.paths[i - begin]) + " in dataset " + Quoted(dataset_);
      if (!item.status.ok()) {
        out[slots[i]] = item.status.WithContext(what);
      } else if (item.id >= info_.sample_count) {
        out[slots[i]] =
            Status::Corruption(fmt::format("{}: the sidecar answered id {}, past the {} samples",
                                           what, item.id, info_.sample_count));
      } else {
        out[slots[i]] = item.id;
      }
    }
    begin = end;
  }
  return out;
}

Result<std::vector<sp::DirectoryItem>> Session::Directories() {
  const std::string doing = "list the directories of dataset " + Quoted(dataset_) +
                            " (DIRECTORIES) at the sidecar at " + socket_path_;
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  if (version_ < sp::kDirectoriesVersion) {
    // A sidecar of that version would answer "unknown request type": say why here.
    return Status::VersionMismatch(fmt::format(
        "{}: the sidecar {} speaks sidecar protocol version {}, listing directories needs "
        "version {} (this client speaks {}..{}); upgrade granary-sidecar on this node",
        doing, Quoted(sidecar_name_), version_, sp::kDirectoriesVersion, sp::kMinVersion,
        sp::kMaxVersion));
  }
  const Clock::time_point deadline = Clock::now() + options_.call_timeout;
  std::vector<sp::DirectoryItem> out;
  uint32_t total = 0;
  uint32_t cursor = 0;
  // Every round but the first adds at least one entry (else it is an error),
  // so the rounds are bounded by the total the first reply announced.
  for (bool first = true;; first = false) {
    const uint32_t want = first ? limits_.max_items : std::min(limits_.max_items, total - cursor);
    GRANARY_ASSIGN_OR_RETURN(
        sp::Reply reply,
        Call(sp::Directories{cursor, want}, sp::MessageType::kDirectoriesReply, deadline, doing));
    auto& page = std::get<sp::DirectoriesReply>(reply);
    if (first) total = page.total;
    if (page.first != cursor || page.total != total || (page.entries.empty() && cursor < total)) {
      return Break(Status::Unavailable(fmt::format(
          "{}: the DIRECTORIES_REPLY from index {} of {} directories has {} entries from index "
          "{} of {}; the connection is closed",
          doing, cursor, total, page.entries.size(), page.first, page.total)));
    }
    for (sp::DirectoryItem& e : page.entries) {
      Status safe = ValidateSamplePath(e.path);
      if (!safe.ok() || (!out.empty() && e.path <= out.back().path)) {
        return Break(Status::Unavailable(fmt::format(
            "{}: the sidecar sent directory {} {}; the connection is closed", doing, Quoted(e.path),
            safe.ok() ? "out of order (directories come sorted by path, each once)"
                      : "with an unsafe path (" + safe.message() + ")")));
      }
      out.push_back(std::move(e));
    }
    cursor += static_cast<uint32_t>(page.entries.size());
    if (cursor == total) return out;
  }
}

Status Session::Ping() {
  std::lock_guard<std::mutex> lock(mu_);
  GRANARY_RETURN_IF_ERROR(CheckUsable());
  return Call(sp::Ping{}, sp::MessageType::kPong, Clock::now() + options_.call_timeout,
              "PING the sidecar at " + socket_path_)
      .status();
}

}  // namespace granary::client

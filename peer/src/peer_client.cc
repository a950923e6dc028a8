// PeerClient (peer_client.h). Kept whole at about 620 lines: its one job is one
// blocking connection of the peer protocol: connect and HELLO, AUTH, STARTTLS,
// then framed calls with deadlines. The handshake, the TLS transport and the
// calls all work on the same connection state (socket, TLS session, receive
// buffer, limits) and fail through the same Fail(), which closes it; they read
// best in one place, in the order a connection lives.

#include "granary/peer/peer_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <variant>

#include "granary/core/hash.h"
#include "granary/core/names.h"
#include "granary/peer/peer_handshake.h"

namespace granary {
namespace {

namespace pf = protocol_format;
using Clock = std::chrono::steady_clock;

// Bytes asked of recv(2) at once for frame headers and bodies. Payloads are
// received straight into the result, whatever their size.
constexpr size_t kReceiveChunk = 64u << 10;

}  // namespace

Status PeerClientOptions::Validate() const {
  if (connect_timeout.count() <= 0) {
    return Status::InvalidArgument("peer client options: connect_timeout must be positive");
  }
  if (call_timeout.count() <= 0) {
    return Status::InvalidArgument("peer client options: call_timeout must be positive");
  }
  if (Status s = limits.Validate(); !s.ok()) return s.WithContext("peer client options: limits");
  auto hello = EncodeRequest(1, HelloRequest{pf::kMinVersion, pf::kMaxVersion, client_name});
  if (!hello.ok()) return hello.status().WithContext("peer client options: client_name");
  return Status::Ok();
}

PeerReadResult PeerReadResult::Assemble(ReadReply reply, std::string payload, bool verify,
                                        std::string_view from) {
  PeerReadResult result;
  result.reply_ = std::move(reply);
  result.payload_ = std::move(payload);
  result.offsets_.reserve(result.reply_.items.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < result.reply_.items.size(); ++i) {
    ReadReplyItem& item = result.reply_.items[i];
    result.offsets_.push_back(offset);
    offset += item.length;
    if (!verify || !item.status.ok() || !item.checksum.has_value()) continue;
    uint64_t actual = Checksum64(result.bytes(i));
    if (actual != *item.checksum) {
      item.status = Status::Corruption(
          "item " + std::to_string(i) + " of " + std::string(from) + ": its bytes hash to " +
          std::to_string(actual) + ", the server sent checksum " + std::to_string(*item.checksum) +
          "; the bytes are not used, read it again");
      item.checksum.reset();
      item.length = 0;
    }
  }
  return result;
}

std::string_view PeerReadResult::bytes(size_t item) const {
  const ReadReplyItem& it = reply_.items.at(item);
  if (!it.status.ok()) return {};
  return std::string_view(payload_).substr(offsets_[item], it.length);
}

PeerClient::PeerClient(NetAddress address, PeerClientOptions options)
    : address_(std::move(address)), options_(std::move(options)), limits_(options_.limits) {}

PeerClient::PeerClient(PeerClient&&) noexcept = default;
PeerClient& PeerClient::operator=(PeerClient&&) noexcept = default;
PeerClient::~PeerClient() = default;

Result<PeerClient> PeerClient::Connect(std::string_view address, const PeerClientOptions& options) {
  GRANARY_RETURN_IF_ERROR(options.Validate());
  GRANARY_ASSIGN_OR_RETURN(NetAddress parsed, ParseNetAddress(address, "cache node address"));
  if (parsed.port == 0) {
    return Status::InvalidArgument("cache node address " + Quoted(address) +
                                   " has port 0, which names no server; write the port the cache "
                                   "node listens on");
  }
  PeerClient client(std::move(parsed), options);
  GRANARY_RETURN_IF_ERROR(client.Open(Clock::now() + options.connect_timeout));
  return client;
}

void PeerClient::Close() {
  tls_.reset();
  fd_.Reset();
  in_.clear();
  in_begin_ = 0;
}

Status PeerClient::Fail(Status status) {
  Close();
  return status;
}

Status PeerClient::EnsureConnected() {
  if (fd_.valid()) {
    // Between calls nothing may arrive. Anything readable now is the end of
    // the connection (the server's idle timeout, a restart: EOF or a reset) or
    // an unsolicited ERROR announcing it: replace the connection before
    // sending, instead of failing this call for it.
    bool stale = in_begin_ < in_.size() || (tls_ != nullptr && tls_->pending());
    if (!stale) {
      pollfd p{fd_.get(), POLLIN, 0};
      stale = ::poll(&p, 1, 0) != 0;
    }
    if (!stale) return Status::Ok();
    Close();
  }
  return Open(Clock::now() + options_.connect_timeout);
}

Status PeerClient::Open(Clock::time_point deadline) {
  Close();
  const std::string where = "connect to cache node " + address_.ToString();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address_.port);
  int gai = ::getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) {
    return Status::Unavailable(where + ": cannot resolve " + Quoted(address_.host) + ": " +
                               ::gai_strerror(gai) + "; check the name and the resolver");
  }
  Status last = Status::Unavailable(where + ": the name resolves to no address");
  ScopedFd fd;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    ScopedFd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      last = Status::FromErrno(errno, where + ": socket");
      continue;
    }
    int rc = ::connect(s.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
      last = Status::Unavailable(where + ": " + ErrnoText(errno) +
                                 "; check that the cache node runs and listens there");
      continue;
    }
    if (rc != 0) {
      Result<bool> ready = WaitFdReady(s.get(), POLLOUT, deadline, "a cache node connection");
      if (!ready.ok()) {
        last = ready.status();
        continue;
      }
      if (!*ready) {
        ::freeaddrinfo(found);
        return Status::DeadlineExceeded(where + ": no connection within the connect timeout of " +
                                        std::to_string(options_.connect_timeout.count()) +
                                        " ms; check the network or raise connect_timeout");
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last = Status::Unavailable(where + ": " + ErrnoText(err) +
                                   "; check that the cache node runs and listens there");
        continue;
      }
    }
    fd = std::move(s);
    break;
  }
  ::freeaddrinfo(found);
  if (!fd.valid()) return last;
  int one = 1;
  // Requests are small and each waits for its reply: do not let Nagle hold them.
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  fd_ = std::move(fd);
  if (options_.tls != nullptr) GRANARY_RETURN_IF_ERROR(StartTls(deadline));
  decoder_ = FrameDecoder(FrameDirection::kResponses, options_.limits, PayloadMode::kDetached);
  scope_.clear();
  bool agreed_in_decoder = false;
  // HELLO with this client's limits; then (AUTH) with the agreed version and
  // limits, which the decoder takes on as soon as they are known. Nothing is
  // buffered in the decoder between frames: a fresh one loses nothing.
  auto exchange = [&](const RequestMessage& request, uint16_t version, const ProtocolLimits& limits,
                      std::string_view doing) -> Result<ResponseMessage> {
    if (!std::holds_alternative<HelloRequest>(request) && !agreed_in_decoder) {
      agreed_in_decoder = true;
      version_ = version;
      limits_ = limits;
      decoder_ = FrameDecoder(FrameDirection::kResponses, limits_, PayloadMode::kDetached);
      decoder_.ExpectVersion(version_);
    }
    const uint64_t id = next_request_id_++;
    Result<std::string> encoded = EncodeRequest(id, request, EncodeOptions{version, limits});
    if (!encoded.ok()) return encoded.status().WithContext(std::string(doing));
    return Exchange(id, *encoded, nullptr, deadline, doing);
  };
  ChannelBindingFn binding;
  if (tls_ != nullptr) {
    binding = [this]() -> Result<std::string> {
      GRANARY_ASSIGN_OR_RETURN(auto b, tls_->ChannelBinding());
      return std::string(reinterpret_cast<const char*>(b.data()), b.size());
    };
  }
  Result<PeerHandshake> agreed =
      RunClientHandshake(options_, address_.ToString(), exchange, binding);
  if (!agreed.ok()) return Fail(agreed.status());
  version_ = agreed->version;
  server_name_ = agreed->server_name;
  scope_ = agreed->scope;
  limits_ = agreed->limits;
  decoder_ = FrameDecoder(FrameDirection::kResponses, limits_, PayloadMode::kDetached);
  decoder_.ExpectVersion(version_);
  if (++connections_ > 1) ++reconnects_;
  return Status::Ok();
}

Status PeerClient::StartTls(Clock::time_point deadline) {
  const std::string where = "TLS to cache node " + address_.ToString();
  Result<std::unique_ptr<TlsStream>> stream =
      TlsStream::Connect(options_.tls, fd_.get(), address_.host);
  if (!stream.ok()) return Fail(stream.status().WithContext(where));
  tls_ = std::move(*stream);
  for (int round = 0; round < kMaxPollRounds; ++round) {
    Result<TlsWant> want = tls_->Handshake();
    if (!want.ok()) {
      return Fail(
          Status(want.status().code(), where + ": " + want.status().message() +
                                           " (does the node serve TLS? its tls_cert_file)"));
    }
    if (*want == TlsWant::kNothing) return Status::Ok();
    Result<bool> ready = WaitTls(*want, deadline);
    if (!ready.ok()) return Fail(ready.status());
    if (!*ready) {
      return Fail(
          Status::DeadlineExceeded(where + ": no TLS handshake within the connect timeout"));
    }
  }
  return Fail(Status::DeadlineExceeded(where + ": the TLS handshake did not finish"));
}

Result<bool> PeerClient::WaitTls(TlsWant want, Clock::time_point deadline) {
  return WaitFdReady(fd_.get(), want == TlsWant::kWrite ? POLLOUT : POLLIN, deadline,
                     "a cache node connection");
}

Status PeerClient::SendAllTls(std::string_view bytes, Clock::time_point deadline,
                              std::string_view doing) {
  size_t sent = 0;
  for (int round = 0; sent < bytes.size() && round < kMaxPollRounds; ++round) {
    TlsWant want = TlsWant::kNothing;
    Result<size_t> n = tls_->Write(bytes.data() + sent, bytes.size() - sent, &want);
    if (!n.ok()) {
      return Status::Unavailable(std::string(doing) + ": " + n.status().message() +
                                 "; the connection is closed, the next call reconnects");
    }
    sent += *n;
    if (*n > 0) continue;
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitTls(want, deadline));
    if (!ready) {
      return Status::DeadlineExceeded(std::string(doing) + ": the server took " +
                                      std::to_string(sent) + " of " + std::to_string(bytes.size()) +
                                      " request bytes before the timeout");
    }
  }
  if (sent < bytes.size()) {
    return Status::DeadlineExceeded(std::string(doing) + ": sending did not finish");
  }
  return Status::Ok();
}

Result<size_t> PeerClient::ReadTls(char* dst, size_t size, Clock::time_point deadline,
                                   std::string_view doing) {
  for (int round = 0; round < kMaxPollRounds; ++round) {
    TlsWant want = TlsWant::kNothing;
    Result<size_t> n = tls_->Read(dst, size, &want);
    if (!n.ok()) {
      return Status::Unavailable(std::string(doing) + ": receiving failed: " +
                                 n.status().message() + "; the next call reconnects");
    }
    if (*n > 0 || want == TlsWant::kNothing) return *n;  // 0: the server closed
    GRANARY_ASSIGN_OR_RETURN(bool ready, WaitTls(want, deadline));
    if (!ready) {
      return Status::DeadlineExceeded(std::string(doing) +
                                      ": no complete reply within the timeout; the connection is "
                                      "closed, the next call reconnects");
    }
  }
  return Status::DeadlineExceeded(std::string(doing) + ": receiving did not finish");
}

Status PeerClient::SendAll(std::string_view bytes, Clock::time_point deadline,
                           std::string_view doing) {
  if (tls_ != nullptr) return SendAllTls(bytes, deadline, doing);
  size_t sent = 0;
  for (int round = 0; sent < bytes.size() && round < kMaxPollRounds; ++round) {
    ssize_t n =
        ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      GRANARY_ASSIGN_OR_RETURN(
          bool ready, WaitFdReady(fd_.get(), POLLOUT, deadline, "a cache node connection"));
      if (!ready) {
        return Status::DeadlineExceeded(
            std::string(doing) + ": the server took " + std::to_string(sent) + " of " +
            std::to_string(bytes.size()) + " request bytes before the timeout");
      }
      continue;
    }
    return Status::Unavailable(std::string(doing) +
                               ": sending failed: " + ErrnoText(n < 0 ? errno : EPIPE) +
                               "; the connection is closed, the next call reconnects");
  }
  if (sent < bytes.size()) {
    return Status::DeadlineExceeded(std::string(doing) + ": sending did not finish");
  }
  return Status::Ok();
}

Result<size_t> PeerClient::Receive(Clock::time_point deadline, std::string_view doing) {
  if (in_begin_ == in_.size()) {
    in_.clear();
    in_begin_ = 0;
  }
  if (tls_ != nullptr) {
    const size_t old = in_.size();
    in_.resize(old + kReceiveChunk);
    Result<size_t> n = ReadTls(in_.data() + old, kReceiveChunk, deadline, doing);
    in_.resize(old + (n.ok() ? *n : 0));
    return n;
  }
  for (int round = 0; round < kMaxPollRounds; ++round) {
    const size_t old = in_.size();
    in_.resize(old + kReceiveChunk);
    ssize_t n = ::recv(fd_.get(), in_.data() + old, kReceiveChunk, MSG_DONTWAIT);
    in_.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable(std::string(doing) + ": receiving failed: " + ErrnoText(errno) +
                                 "; the connection is closed, the next call reconnects");
    }
    GRANARY_ASSIGN_OR_RETURN(bool ready,
                             WaitFdReady(fd_.get(), POLLIN, deadline, "a cache node connection"));
    if (!ready) {
      return Status::DeadlineExceeded(std::string(doing) +
                                      ": no complete reply within the timeout; the connection is "
                                      "closed, the next call reconnects");
    }
  }
  return Status::DeadlineExceeded(std::string(doing) + ": receiving did not finish");
}

Status PeerClient::ReceiveInto(char* dst, size_t got, size_t size, Clock::time_point deadline,
                               std::string_view doing) {
  for (int round = 0; tls_ != nullptr && got < size && round < kMaxPollRounds; ++round) {
    GRANARY_ASSIGN_OR_RETURN(size_t n, ReadTls(dst + got, size - got, deadline, doing));
    if (n == 0) {
      return Status::Unavailable(std::string(doing) + ": the server closed the connection after " +
                                 std::to_string(got) + " of " + std::to_string(size) +
                                 " payload bytes; the next call reconnects");
    }
    got += n;
  }
  for (int round = 0; tls_ == nullptr && got < size && round < kMaxPollRounds; ++round) {
    ssize_t n = ::recv(fd_.get(), dst + got, size - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return Status::Unavailable(std::string(doing) + ": the server closed the connection after " +
                                 std::to_string(got) + " of " + std::to_string(size) +
                                 " payload bytes; the next call reconnects");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable(std::string(doing) + ": receiving the payload failed: " +
                                 ErrnoText(errno) + "; the next call reconnects");
    }
    GRANARY_ASSIGN_OR_RETURN(bool ready,
                             WaitFdReady(fd_.get(), POLLIN, deadline, "a cache node connection"));
    if (!ready) {
      return Status::DeadlineExceeded(std::string(doing) + ": got " + std::to_string(got) + " of " +
                                      std::to_string(size) +
                                      " payload bytes within the timeout; the connection is "
                                      "closed, the next call reconnects");
    }
  }
  if (got < size) return Status::DeadlineExceeded(std::string(doing) + ": payload incomplete");
  return Status::Ok();
}

Result<ResponseMessage> PeerClient::Exchange(uint64_t request_id, const std::string& bytes,
                                             std::string* payload, Clock::time_point deadline,
                                             std::string_view doing) {
  if (Status s = SendAll(bytes, deadline, doing); !s.ok()) return Fail(std::move(s));
  // Bounded by the deadline (every Receive waits at most until it) and by the
  // decoder's limits (a frame is at most max_message_bytes).
  for (int round = 0; !decoder_.has_frame(); ++round) {
    if (round >= kMaxPollRounds) {
      return Fail(Status::DeadlineExceeded(std::string(doing) + ": reply never completed"));
    }
    if (in_begin_ < in_.size()) {
      Result<size_t> used = decoder_.Feed(std::string_view(in_).substr(in_begin_));
      if (!used.ok()) {
        return Fail(used.status().WithContext(std::string(doing) +
                                              ": the server's reply is not the protocol"));
      }
      in_begin_ += *used;
      continue;
    }
    Result<size_t> n = Receive(deadline, doing);
    if (!n.ok()) return Fail(n.status());
    if (*n == 0) {
      Status cut = decoder_.Finish();
      return Fail(Status::Unavailable(std::string(doing) + ": the server closed the connection" +
                                      (cut.ok() ? std::string() : " (" + cut.message() + ")") +
                                      "; the next call reconnects"));
    }
  }
  Frame frame = decoder_.TakeFrame();
  const uint64_t payload_length = decoder_.payload_remaining();
  if (payload_length > 0) {
    // The decoder accepted the header: a READ_REPLY within max_read_bytes.
    if (payload == nullptr) {
      return Fail(Status::InvalidArgument(
          std::string(doing) + ": the server answered with a READ_REPLY carrying " +
          std::to_string(payload_length) + " payload bytes; it does not follow the protocol"));
    }
    const auto size = static_cast<size_t>(payload_length);
    payload->resize(size);
    size_t have = std::min(size, in_.size() - in_begin_);
    std::memcpy(payload->data(), in_.data() + in_begin_, have);
    in_begin_ += have;
    decoder_.ConsumePayload(have);
    if (Status s = ReceiveInto(payload->data(), have, size, deadline, doing); !s.ok()) {
      return Fail(std::move(s));
    }
    decoder_.ConsumePayload(size - have);
  }
  bool broken = false;
  Result<ResponseMessage> reply = DecodeReplyTo(frame, request_id, limits_, doing, &broken);
  if (!reply.ok() && broken) return Fail(reply.status());
  return reply;
}

Result<ResponseMessage> PeerClient::Call(const RequestMessage& request, std::string* payload) {
  // A request this client's own limits reject is the caller's mistake whether
  // or not a server is reachable: say so before connecting.
  if (auto own = EncodeRequest(1, request, EncodeOptions{pf::kMaxVersion, options_.limits});
      !own.ok()) {
    return own.status();
  }
  GRANARY_RETURN_IF_ERROR(EnsureConnected());
  const uint64_t id = next_request_id_++;
  Result<std::string> bytes = EncodeRequest(id, request, EncodeOptions{version_, limits_});
  if (!bytes.ok()) {
    return bytes.status().WithContext("the limits of cache node " + address_.ToString() + " (" +
                                      server_name_ + ")");
  }
  static constexpr std::string_view kNames[] = {"HELLO", "PING", "STAT", "READ"};
  const std::string doing = std::string(kNames[request.index()]) + " request " +
                            std::to_string(id) + " to cache node " + address_.ToString();
  return Exchange(id, *bytes, payload, Clock::now() + options_.call_timeout, doing);
}

Result<PeerReadResult> PeerClient::Read(const ReadRequest& request) {
  std::string payload;
  GRANARY_ASSIGN_OR_RETURN(ResponseMessage response, Call(request, &payload));
  auto* reply = std::get_if<ReadReply>(&response);
  const std::string doing = "READ from cache node " + address_.ToString();
  if (reply == nullptr) {
    return Fail(Status::InvalidArgument(doing + ": the server answered with " +
                                        std::string(ResponseName(response)) +
                                        "; it does not follow the protocol"));
  }
  if (Status s = CheckReadReply(request, *reply); !s.ok()) {
    return Fail(s.WithContext(doing + ": the reply does not match the request"));
  }
  return PeerReadResult::Assemble(std::move(*reply), std::move(payload), options_.verify_checksums,
                                  doing);
}

Status PeerClient::Ping() {
  GRANARY_ASSIGN_OR_RETURN(ResponseMessage response, Call(PingRequest{}, nullptr));
  if (!std::holds_alternative<PongReply>(response)) {
    return Fail(Status::InvalidArgument(
        "PING to cache node " + address_.ToString() + ": the server answered with " +
        std::string(ResponseName(response)) + "; it does not follow the protocol"));
  }
  return Status::Ok();
}

Result<StatReply> PeerClient::Stat(const StatRequest& request) {
  GRANARY_ASSIGN_OR_RETURN(ResponseMessage response, Call(request, nullptr));
  auto* reply = std::get_if<StatReply>(&response);
  if (reply == nullptr) {
    return Fail(Status::InvalidArgument(
        "STAT to cache node " + address_.ToString() + ": the server answered with " +
        std::string(ResponseName(response)) + "; it does not follow the protocol"));
  }
  return std::move(*reply);
}

}  // namespace granary
